//! The FUSE adapter: the only module that imports `fuser`.
//!
//! [`mount`] puts a [`FileSystem`] on a directory and serves it from a pool
//! of threads until the returned [`MountHandle`] is unmounted (or dropped),
//! or until someone else unmounts the directory; [`serve`] does the same
//! and blocks. Either way the session ends with `FileSystem::unmount`.

mod adapter;
mod convert;
mod floor;
pub mod mounts;
mod poll_choice;

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use fuser::{BackgroundSession, BusyPoll, Config, MountOption, Session, SessionACL};
use log::{info, warn};
use parking_lot::Mutex;

pub use adapter::MAX_REQUEST_BYTES;
pub use convert::{errno_of, supplementary_groups};

use crate::fs::{FileSystem, FsError};
use adapter::{AdapterSettings, RaidFuse, UnmountOutcome};
use convert::Ttls;

/// How to mount. `Default` gives a private, read-write mount with 1 s caches.
#[derive(Clone, Debug)]
pub struct MountConfig {
    pub read_only: bool,
    /// Let users other than the mounting one in (`allow_other`).
    pub allow_other: bool,
    /// Let the kernel check permissions from the mode bits.
    pub default_permissions: bool,
    pub attr_timeout: Duration,
    pub entry_timeout: Duration,
    /// Keep the page cache of a file across opens.
    pub kernel_cache: bool,
    /// Let the kernel cache writes and send them in large batches.
    pub writeback_cache: bool,
    /// Serve every open as if it were O_DIRECT (no page cache for file
    /// data, as libfuse's `direct_io` and mergerfs's `cache.files=off`).
    pub direct_io: bool,
    /// Ask the kernel for FUSE over io_uring (Linux 6.14 on, with the
    /// `fuse` module's `enable_uring` set): requests are served on the CPU
    /// that issued them, by threads pinned there, without `/dev/fuse`
    /// reads and writes. Without the kernel's offer, `/dev/fuse` serves.
    pub io_uring: bool,
    /// Threads serving requests.
    pub threads: usize,
    /// How long the thread reading `/dev/fuse` polls for the next request
    /// before it sleeps there (zero: every thread sleeps in `read(2)`). A
    /// caller issuing one request after another then finds a thread awake
    /// instead of waking one (`adapter::quick_request` says which requests
    /// that thread serves itself).
    pub busy_poll: Duration,
    /// Poll every stream of quick requests, instead of measuring whether
    /// polling or sleeping serves it faster (`poll_choice`).
    pub busy_poll_always: bool,
    /// Kernel readahead for the mount, in bytes (0: leave the kernel's
    /// default). FUSE caps a new mount's readahead at 128 KiB whatever the
    /// filesystem asks for in INIT; the mount raises it through the
    /// backing device's `read_ahead_kb`.
    pub read_ahead: u32,
    /// The mount's source in the mount table (the FUSE `fsname`): what
    /// names this array, so that mount(8), findmnt and fstests can tell
    /// one raidfs mount from another.
    pub source: String,
}

impl Default for MountConfig {
    fn default() -> Self {
        let cores = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1);
        MountConfig {
            read_only: false,
            allow_other: false,
            default_permissions: false,
            attr_timeout: Duration::from_secs(1),
            entry_timeout: Duration::from_secs(1),
            kernel_cache: false,
            writeback_cache: false,
            direct_io: false,
            io_uring: false,
            threads: cores.clamp(4, 16),
            busy_poll: DEFAULT_BUSY_POLL,
            busy_poll_always: false,
            read_ahead: DEFAULT_READ_AHEAD,
            source: LEGACY_SOURCE.to_string(),
        }
    }
}

/// The FUSE subtype: the kernel shows raidfs mounts as type `fuse.raidfs`,
/// which is what mount(8) runs `mount.fuse.raidfs` for (remount) and what
/// `findmnt -t` and fstests select them by.
pub const SUBTYPE: &str = "raidfs";

/// The type raidfs mounts have in the mount table.
pub const FS_TYPE: &str = "fuse.raidfs";

/// The source every raidfs mount showed before mounts carried the array's
/// identity (type plain `fuse`): a mount made by an older daemon that is
/// still running after an upgrade is recognised by it.
pub const LEGACY_SOURCE: &str = "raidfs";

/// Whether a mount table entry is a raidfs mount: type [`FS_TYPE`] whatever
/// its source, or an older daemon's `fuse` mount with [`LEGACY_SOURCE`].
pub fn is_raidfs_mount(entry: &mounts::MountEntry) -> bool {
    entry.fs_type == FS_TYPE || (entry.fs_type == "fuse" && entry.source == LEGACY_SOURCE)
}

#[derive(Debug, thiserror::Error)]
pub enum MountError {
    #[error("mount point {path}: {reason}")]
    MountPoint { path: PathBuf, reason: String },
    #[error("mounting {path}: {source}")]
    Mount { path: PathBuf, source: io::Error },
    #[error("unmounting {path}: {source}")]
    Unmount { path: PathBuf, source: io::Error },
    #[error("FUSE session on {path} failed: {source}")]
    Session { path: PathBuf, source: io::Error },
    #[error("closing the filesystem: {0}")]
    Close(#[source] FsError),
    #[error("the FUSE session on {0} ended without closing the filesystem")]
    NotClosed(PathBuf),
}

/// A live mount. Dropping it unmounts (lazily if busy) and waits for the
/// session to end.
pub struct MountHandle {
    session: Option<BackgroundSession>,
    mount_point: PathBuf,
    /// `major:minor` of our FUSE connection, so that we never unmount a
    /// filesystem someone else mounted on the same directory later.
    device: Option<String>,
    unmounted: UnmountOutcome,
}

impl MountHandle {
    pub fn mount_point(&self) -> &Path {
        &self.mount_point
    }

    /// Whether our filesystem is still the one mounted at the mount point.
    pub fn is_mounted(&self) -> bool {
        self.unmounter().is_mounted()
    }

    /// A handle another thread (a signal handler) can use to end the mount.
    pub fn unmounter(&self) -> Unmounter {
        Unmounter {
            mount_point: self.mount_point.clone(),
            device: self.device.clone(),
        }
    }

    /// Unmount and wait until the filesystem is closed. If the mount is busy
    /// it is detached (gone from the namespace now) and closed when the last
    /// open file is released, which this waits for.
    pub fn unmount(mut self) -> Result<(), MountError> {
        self.unmount_now()?;
        self.wait_inner()
    }

    /// Wait until the mount ends (someone unmounts it), then return how
    /// closing the filesystem went.
    pub fn wait(mut self) -> Result<(), MountError> {
        self.wait_inner()
    }

    fn unmount_now(&mut self) -> Result<(), MountError> {
        self.unmounter().unmount()
    }

    fn wait_inner(&mut self) -> Result<(), MountError> {
        let Some(session) = self.session.take() else {
            return Ok(());
        };
        let joined = session.join();
        let closed = self.unmounted.lock().take();
        match joined {
            // At the end of a lazily detached mount the kernel may abort the
            // connection under one of the session's cloned channels
            // (ECONNABORTED rather than ENODEV); the filesystem was still
            // closed, and that outcome is what counts.
            Err(e) if e.raw_os_error() == Some(libc::ECONNABORTED) && closed.is_some() => {
                log::debug!("FUSE session ended with the connection aborted: {e}");
            }
            Err(source) => {
                return Err(MountError::Session {
                    path: self.mount_point.clone(),
                    source,
                })
            }
            Ok(()) => {}
        }
        match closed {
            Some(Ok(())) => Ok(()),
            Some(Err(err)) => Err(MountError::Close(err)),
            None => Err(MountError::NotClosed(self.mount_point.clone())),
        }
    }
}

impl Drop for MountHandle {
    fn drop(&mut self) {
        if self.session.is_none() {
            return;
        }
        if let Err(err) = self.unmount_now() {
            warn!("{err}");
        }
        if let Err(err) = self.wait_inner() {
            warn!("{err}");
        }
    }
}

/// Ends one mount from any thread; never touches a filesystem that someone
/// else mounted on the same directory since.
#[derive(Clone, Debug)]
pub struct Unmounter {
    mount_point: PathBuf,
    device: Option<String>,
}

impl Unmounter {
    pub fn is_mounted(&self) -> bool {
        match (&self.device, mounts::mount_at(&self.mount_point)) {
            (Some(device), Ok(Some(entry))) => &entry.device == device,
            _ => false,
        }
    }

    /// Unmount; if busy, detach (the session then ends when the last open
    /// file is closed). Nothing to do if it is no longer mounted.
    pub fn unmount(&self) -> Result<(), MountError> {
        if !self.is_mounted() {
            return Ok(());
        }
        let path = self.mount_point.clone();
        match mounts::unmount(&path, false) {
            Ok(()) => Ok(()),
            Err(err) if err.raw_os_error() == Some(libc::EBUSY) => {
                warn!(
                    "{} is busy; detaching it, it closes when its last file does",
                    path.display()
                );
                mounts::unmount(&path, true).map_err(|source| MountError::Unmount { path, source })
            }
            Err(source) => Err(MountError::Unmount { path, source }),
        }
    }
}

/// Mount `fs` on `mount_point` and serve it from background threads.
pub fn mount(
    fs: Arc<FileSystem>,
    mount_point: &Path,
    config: &MountConfig,
) -> Result<MountHandle, MountError> {
    let unmounted: UnmountOutcome = Arc::new(Mutex::new(None));
    let notifier = Arc::new(std::sync::OnceLock::new());
    let adapter = RaidFuse::new(
        fs,
        adapter_settings(config),
        unmounted.clone(),
        Arc::clone(&notifier),
    );
    start(adapter, mount_point, config, unmounted, |session| {
        let _ = notifier.set(session.notifier());
    })
}

/// Mount the FUSE floor (`floor`: a namespace without data, for
/// benchmarks) on `mount_point`, served as [`mount`] serves an array.
/// `owner` owns its root directory.
pub fn mount_floor(
    mount_point: &Path,
    config: &MountConfig,
    owner: (u32, u32),
) -> Result<MountHandle, MountError> {
    let unmounted: UnmountOutcome = Arc::new(Mutex::new(None));
    let floor = floor::Floor::new(adapter_settings(config), unmounted.clone(), owner);
    start(floor, mount_point, config, unmounted, |_| {})
}

fn adapter_settings(config: &MountConfig) -> AdapterSettings {
    AdapterSettings {
        ttls: Ttls {
            attr: config.attr_timeout,
            entry: config.entry_timeout,
        },
        kernel_cache: config.kernel_cache,
        writeback_cache: config.writeback_cache,
        direct_io: config.direct_io,
        io_uring: config.io_uring,
        default_permissions: config.default_permissions,
    }
}

/// Mount `fs` with the session `config` describes and serve it from a
/// pool of threads; `ready` sees the session before it serves.
fn start<F: fuser::Filesystem + Send + Sync + 'static>(
    fs: F,
    mount_point: &Path,
    config: &MountConfig,
    unmounted: UnmountOutcome,
    ready: impl FnOnce(&Session<F>),
) -> Result<MountHandle, MountError> {
    let mount_point = check_mount_point(mount_point)?;
    let session = Session::new(fs, &mount_point, &fuser_config(config)).map_err(|source| {
        MountError::Mount {
            path: mount_point.clone(),
            source,
        }
    })?;
    ready(&session);
    // Read before any request is served: mountinfo does not call into us.
    let device = match mounts::mount_at(&mount_point) {
        Ok(Some(entry)) => Some(entry.device),
        Ok(None) | Err(_) => None,
    };
    if let (Some(device), true) = (&device, config.read_ahead > 0) {
        set_read_ahead(device, config.read_ahead);
    }
    let session = session.spawn().map_err(|source| MountError::Session {
        path: mount_point.clone(),
        source,
    })?;
    info!(
        "mounted on {} ({} threads)",
        mount_point.display(),
        config.threads
    );
    Ok(MountHandle {
        session: Some(session),
        mount_point,
        device,
        unmounted,
    })
}

/// Mount and block until the filesystem is unmounted and closed.
pub fn serve(
    fs: Arc<FileSystem>,
    mount_point: &Path,
    config: &MountConfig,
) -> Result<(), MountError> {
    mount(fs, mount_point, config)?.wait()
}

/// How long the reading thread polls `/dev/fuse` by default: a caller's
/// next request comes within a few microseconds of the last answer when it
/// issues them one after another (fio, a `create, write, close` loop), and
/// the kernel's own socket busy polling suggests 50 µs too
/// (`net.core.busy_poll`). On RAID5 it took the metadata job of
/// vs-kernel.sh from 8,455 to 14,460 operations/s and 4 KiB random writes
/// from 24,325 to 25,078 IOPS, in the same rounds (docs/performance.md,
/// "Busy polling").
pub const DEFAULT_BUSY_POLL: Duration = Duration::from_micros(50);

/// The mount's readahead unless `-o read_ahead_kb` says otherwise: four
/// 1 MiB READs of a sequential stream in flight, served by different FUSE
/// threads, so the members have several reads queued (cold large reads go
/// around the host's page cache and its readahead, `member::uncached`).
/// Against 1 MiB, three rounds of `scripts/vs-kernel-ab -j seq-read-cold`
/// gave 1.10-1.46x on RAID1 x2, RAID1 x3, RAID5 and RAID6
/// (docs/performance.md, "Against the kernel's RAID").
pub const DEFAULT_READ_AHEAD: u32 = 4 * MAX_REQUEST_BYTES;

/// Where the readahead of the FUSE connection `device` (`major:minor`) is set.
fn read_ahead_path(device: &str) -> PathBuf {
    Path::new("/sys/class/bdi")
        .join(device)
        .join("read_ahead_kb")
}

/// Raise the mount's readahead to `bytes` (the kernel sends READs of up to
/// `max_readahead`, 1 MiB, only once this is raised to 1 MiB or more: 8x
/// fewer requests for a sequential reader). Failing (not root, no sysfs) only costs speed.
fn set_read_ahead(device: &str, bytes: u32) {
    let path = read_ahead_path(device);
    let kib = (bytes / 1024).max(4);
    match std::fs::write(&path, format!("{kib}\n")) {
        Ok(()) => info!("readahead {kib} KiB ({})", path.display()),
        // Only root may write there: a user's mount keeps the default,
        // which is expected, not a warning.
        Err(err) if err.kind() == io::ErrorKind::PermissionDenied => info!(
            "readahead stays at the kernel's default ({} is root's)",
            path.display()
        ),
        Err(err) => warn!(
            "cannot set readahead to {kib} KiB through {}: {err}",
            path.display()
        ),
    }
}

fn check_mount_point(path: &Path) -> Result<PathBuf, MountError> {
    let bad = |reason: String| MountError::MountPoint {
        path: path.to_path_buf(),
        reason,
    };
    let canonical = path.canonicalize().map_err(|e| bad(e.to_string()))?;
    if !canonical.is_dir() {
        return Err(bad("not a directory".to_string()));
    }
    Ok(canonical)
}

fn fuser_config(config: &MountConfig) -> Config {
    let mut options = vec![
        MountOption::FSName(config.source.clone()),
        // fuser hands `Subtype` only to fusermount3, and mounting directly
        // (as root) it calls mount(2) with type `fuse` and no subtype: the
        // mount would show as plain `fuse`. The kernel takes `subtype=` as a
        // mount option itself, and fusermount3 understands it too.
        MountOption::CUSTOM(format!("subtype={SUBTYPE}")),
        if config.read_only {
            MountOption::RO
        } else {
            MountOption::RW
        },
    ];
    if config.default_permissions {
        options.push(MountOption::DefaultPermissions);
    }
    let mut fuser_config = Config::default();
    fuser_config.mount_options = options;
    fuser_config.acl = if config.allow_other {
        SessionACL::All
    } else {
        SessionACL::Owner
    };
    fuser_config.n_threads = Some(config.threads.max(1));
    fuser_config.clone_fd = true;
    // Over io_uring (when the kernel offers it) the session leaves it off:
    // requests come on the rings, not from `read(2)`.
    fuser_config.busy_poll = (!config.busy_poll.is_zero()).then_some(BusyPoll {
        spin: config.busy_poll,
        quick: adapter::quick_request,
        choice: (!config.busy_poll_always).then(|| {
            Arc::new(poll_choice::MeasuredPolling::default()) as Arc<dyn fuser::PollChoice>
        }),
    });
    fuser_config
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_requests_served_in_memory_are_served_by_the_thread_that_read_them() {
        const HEADERS: u32 = 80;
        let write = |data: u32| adapter::quick_request(16, HEADERS + data);
        assert!(write(4096) && write(16 * 1024 - 1));
        assert!(!write(16 * 1024) && !write(1 << 20));
        // LOOKUP, GETATTR, CREATE, UNLINK, FLUSH, RELEASE
        for op in [1, 3, 35, 10, 25, 18] {
            assert!(adapter::quick_request(op, 64), "opcode {op}");
        }
        // READ, FSYNC, READDIR, FALLOCATE, SETLKW, COPY_FILE_RANGE, SYNCFS, an unknown one
        for op in [15, 20, 28, 43, 33, 47, 50, 9999] {
            assert!(!adapter::quick_request(op, 64), "opcode {op}");
        }
        let config = fuser_config(&MountConfig::default());
        assert_eq!(config.busy_poll.map(|p| p.spin), Some(DEFAULT_BUSY_POLL));
        let off = MountConfig {
            busy_poll: Duration::ZERO,
            ..MountConfig::default()
        };
        assert!(fuser_config(&off).busy_poll.is_none());
    }

    #[test]
    fn raidfs_mounts_are_told_by_their_type_whatever_their_source() {
        let entry = |fs_type: &str, source: &str| mounts::MountEntry {
            mount_point: PathBuf::from("/mnt"),
            device: "0:50".into(),
            fs_type: fs_type.into(),
            source: source.into(),
        };
        assert!(is_raidfs_mount(&entry("fuse.raidfs", "home")));
        assert!(is_raidfs_mount(&entry(
            "fuse.raidfs",
            "uuid=9cf61be9-5058-4d46-b508-521058ab4f25"
        )));
        assert!(is_raidfs_mount(&entry("fuse", LEGACY_SOURCE)));
        assert!(!is_raidfs_mount(&entry("fuse", "home")));
        assert!(!is_raidfs_mount(&entry("fuse.sshfs", "raidfs")));
        assert!(!is_raidfs_mount(&entry("ext4", "/dev/sda1")));
    }

    #[test]
    fn the_kernel_is_given_the_subtype_and_the_source() {
        let config = MountConfig {
            source: "home".into(),
            ..MountConfig::default()
        };
        let options = fuser_config(&config).mount_options;
        assert!(options.contains(&MountOption::FSName("home".into())));
        assert!(options.contains(&MountOption::CUSTOM("subtype=raidfs".into())));
    }

    #[test]
    fn readahead_is_set_on_the_connections_bdi() {
        assert_eq!(
            read_ahead_path("0:39"),
            PathBuf::from("/sys/class/bdi/0:39/read_ahead_kb")
        );
        assert_eq!(MountConfig::default().read_ahead, 4 * MAX_REQUEST_BYTES);
    }
}
