//! Shared by the mount tests: a guard that owns a FUSE mount and always
//! takes it down (lazily, so a failing test cannot leave a busy mount
//! behind), and helpers to mount a filesystem over an in-memory store.

#![allow(dead_code)]

pub mod cli;
pub mod fs;
pub mod members;
pub mod mounted;
pub mod nbd;

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use raidfs::cli::mount::registry::{self, DaemonRecord};
use raidfs::fs::store::BlockStore;
use raidfs::fs::teststore::MemStore;
use raidfs::fs::{FileSystem, FsOptions};
use raidfs::fuse::{self, MountConfig, MountHandle};

/// True when this machine can run FUSE mounts (root and /dev/fuse); the
/// mount tests print why and pass vacuously otherwise.
pub fn fuse_available() -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let dev = Path::new("/dev/fuse").exists();
    if !(root && dev) {
        eprintln!("skipping: FUSE mount tests need root and /dev/fuse");
    }
    root && dev
}

/// Detach `path` (MNT_DETACH); errors are ignored because it may already be gone.
pub fn detach(path: &Path) {
    if let Ok(c_path) = CString::new(path.as_os_str().as_bytes()) {
        // SAFETY: c_path is a valid NUL-terminated path.
        unsafe { libc::umount2(c_path.as_ptr(), libc::MNT_DETACH) };
    }
}

/// An in-process mount on a temporary directory.
pub struct MountGuard {
    handle: Option<MountHandle>,
    fs: Arc<FileSystem>,
    dir: tempfile::TempDir,
}

impl MountGuard {
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn join(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub fn fs(&self) -> &Arc<FileSystem> {
        &self.fs
    }

    /// Unmount normally and return how closing the filesystem went.
    pub fn unmount(mut self) -> Result<(), fuse::MountError> {
        match self.handle.take() {
            Some(handle) => handle.unmount(),
            None => Ok(()),
        }
    }
}

impl Drop for MountGuard {
    fn drop(&mut self) {
        if let Some(handle) = self.handle.take() {
            detach(handle.mount_point());
            if let Err(e) = handle.wait() {
                eprintln!("mount guard: {e}");
            }
        }
    }
}

/// A freshly formatted MemStore of 16 groups of 64 MiB.
pub fn mem_store() -> Arc<MemStore> {
    let store = Arc::new(MemStore::new(16, 64 << 20, 64 << 10));
    FileSystem::format(store.clone()).expect("format MemStore");
    store
}

/// Open the filesystem on `store` and mount it on a new temporary directory,
/// answering writes before they are done (large ones on the answering
/// thread, small ones through the write queue) as `raidfs mount` does by
/// default.
pub fn mount_store(store: Arc<dyn BlockStore>, config: &MountConfig) -> MountGuard {
    let opts = FsOptions {
        deferred_writes: 2,
        queued_writes: raidfs::cli::mount::options::DEFAULT_QUEUED_WRITES,
        queue_spin: raidfs::cli::mount::options::QUEUE_SPIN,
        ..FsOptions::default()
    };
    let fs = Arc::new(FileSystem::open(store, opts).expect("open MemStore filesystem"));
    let dir = tempfile::tempdir().expect("temp dir");
    let handle = fuse::mount(fs.clone(), dir.path(), config).expect("mount");
    MountGuard {
        handle: Some(handle),
        fs,
        dir,
    }
}

pub fn mount_mem(config: &MountConfig) -> MountGuard {
    mount_store(mem_store(), config)
}

/// A `raidfs mount` daemon's mount point. Drop detaches the mount and waits
/// for the daemon to exit, whatever state the test left it in.
pub struct DaemonGuard {
    pub mount_point: PathBuf,
}

impl DaemonGuard {
    pub fn new(mount_point: &Path) -> DaemonGuard {
        DaemonGuard {
            mount_point: mount_point.to_path_buf(),
        }
    }
}

impl Drop for DaemonGuard {
    fn drop(&mut self) {
        let pid = raidfs::cli::mount::daemon_pid(&self.mount_point);
        detach(&self.mount_point);
        // A daemon that was killed leaves its record behind.
        let leftover = raidfs::cli::mount::registry::read(&self.mount_point)
            .ok()
            .flatten();
        if pid.is_none() && leftover.is_some() {
            let path = raidfs::cli::mount::registry::state_path(&self.mount_point);
            let _ = std::fs::remove_file(path);
        }
        if let Some(pid) = pid {
            let record = raidfs::cli::mount::registry::read(&self.mount_point)
                .ok()
                .flatten();
            let exited = record
                .map(|r| r.wait_for_exit(std::time::Duration::from_secs(30)))
                .unwrap_or(true);
            if !exited {
                // SAFETY: kill with a pid we recorded; the daemon is ours.
                unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            }
        }
    }
}

/// SIGKILL the `raidfs mount` daemon serving `mount_point` and require that
/// it is gone within `within`; returns its record (pid, watcher).
pub fn kill_daemon(mount_point: &Path, within: Duration) -> DaemonRecord {
    let record = registry::read(mount_point)
        .expect("registry")
        .expect("daemon record");
    // SAFETY: kill with the pid of a daemon the test started.
    assert_eq!(unsafe { libc::kill(record.pid as i32, libc::SIGKILL) }, 0);
    assert!(
        record.wait_for_exit(within),
        "daemon {} still running {within:?} after SIGKILL",
        record.pid
    );
    record
}

/// setxattr(2): set extended attribute `name` of `path` to `value`.
pub fn set_xattr(path: &Path, name: &str, value: &[u8]) -> std::io::Result<()> {
    let p = CString::new(path.as_os_str().as_bytes()).expect("path without NUL");
    let n = CString::new(name).expect("name without NUL");
    // SAFETY: valid NUL-terminated strings and a buffer of the length given.
    let rc = unsafe {
        libc::setxattr(
            p.as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// getxattr(2): the value (up to 4 KiB) of extended attribute `name` of `path`.
pub fn get_xattr(path: &Path, name: &str) -> std::io::Result<Vec<u8>> {
    let p = CString::new(path.as_os_str().as_bytes()).expect("path without NUL");
    let n = CString::new(name).expect("name without NUL");
    let mut buf = vec![0u8; 4096];
    // SAFETY: valid NUL-terminated strings and a buffer valid for its length.
    let rc = unsafe { libc::getxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    buf.truncate(rc as usize);
    Ok(buf)
}

/// `len` bytes that differ with `seed` and along the buffer, so a block
/// read from the wrong place or the wrong file shows.
pub fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[1] ^ seed)
        .collect()
}

/// Write `data` to a new file at `path` and fsync it.
pub fn write_synced(path: &Path, data: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let mut f = std::fs::File::create(path)?;
    f.write_all(data)?;
    f.sync_all()
}

/// A MemStore mount other users reach: allow_other, and the mount's parent
/// and root searchable by all (tests that run commands as another user).
pub fn shared_mount() -> MountGuard {
    use std::os::unix::fs::PermissionsExt;
    let mnt = mount_mem(&MountConfig {
        allow_other: true,
        ..MountConfig::default()
    });
    let parent = mnt.path().parent().expect("mount point has a parent");
    std::fs::set_permissions(parent, std::fs::Permissions::from_mode(0o755)).expect("chmod parent");
    std::fs::set_permissions(mnt.path(), std::fs::Permissions::from_mode(0o755))
        .expect("chmod root");
    mnt
}

/// A heap buffer aligned for O_DIRECT.
pub struct Aligned {
    ptr: *mut u8,
    layout: std::alloc::Layout,
}

impl Aligned {
    pub fn new(len: usize) -> Aligned {
        let layout = std::alloc::Layout::from_size_align(len, 4096).unwrap();
        // SAFETY: layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        assert!(!ptr.is_null());
        Aligned { ptr, layout }
    }
    pub fn as_mut(&mut self) -> &mut [u8] {
        // SAFETY: ptr is valid for layout.size() bytes and uniquely borrowed.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.layout.size()) }
    }
}

impl Drop for Aligned {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with the same layout.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) };
    }
}
