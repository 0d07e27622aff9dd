//! How the adapter serves an open file, end to end through a mount: which
//! handles bypass the kernel's page cache (write-only opens, unless a cache
//! option keeps pages), which closes report a failed write (only those of
//! handles that can write), and that a synchronous write through either
//! kind of handle is durable when it returns.

mod common;

use std::fs::{self, File, OpenOptions};
use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::sync::Arc;

use common::{fuse_available, mount_store, pattern, Aligned};
use raidfs::fs::teststore::{CrashStore, MemStore};
use raidfs::fs::{FileSystem, FsOptions};
use raidfs::fuse::MountConfig;

const MIB: u64 = 1 << 20;
const PAGE: usize = 4096;

/// A shared read-only mapping of a whole file, unmapped on drop.
struct Mapping {
    addr: *mut libc::c_void,
    len: usize,
}

impl Mapping {
    fn of(file: &File, len: usize) -> Mapping {
        // SAFETY: a fresh read-only shared mapping of an open file.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        assert_ne!(
            addr,
            libc::MAP_FAILED,
            "mmap: {}",
            std::io::Error::last_os_error()
        );
        Mapping { addr, len }
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: the mapping is `len` readable bytes until drop.
        unsafe { std::slice::from_raw_parts(self.addr as *const u8, self.len) }
    }

    /// Which pages of the file the kernel's page cache holds now.
    fn resident(&self) -> Vec<bool> {
        let mut vec = vec![0u8; self.len.div_ceil(PAGE)];
        // SAFETY: `vec` has one byte per page of the mapping.
        let rc = unsafe { libc::mincore(self.addr, self.len, vec.as_mut_ptr()) };
        assert_eq!(rc, 0, "mincore: {}", std::io::Error::last_os_error());
        vec.iter().map(|b| b & 1 == 1).collect()
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly what was mapped.
        unsafe { libc::munmap(self.addr, self.len) };
    }
}

/// A write through a write-only handle goes around the page cache (the
/// kernel drops the pages it covers instead of copying the write into
/// them) unless `kernel_cache` keeps pages; either way an open reader and
/// a mapping of the file see it at once.
#[test]
fn write_only_opens_bypass_the_page_cache_and_readers_see_their_writes() {
    if !fuse_available() {
        return;
    }
    for (kernel_cache, bypasses) in [(false, true), (true, false)] {
        let config = MountConfig {
            kernel_cache,
            ..MountConfig::default()
        };
        let store: Arc<MemStore> = common::mem_store();
        let mnt = mount_store(store, &config);
        let path = mnt.join("f");
        let len = 16 * PAGE;
        let old = pattern(1, len);
        fs::write(&path, &old).unwrap();

        let mut reader = File::open(&path).unwrap();
        let mut seen = Vec::new();
        reader.read_to_end(&mut seen).unwrap();
        assert!(seen == old);
        let map = Mapping::of(&reader, len);
        assert!(map.bytes() == &old[..]);
        assert!(
            map.resident().iter().all(|r| *r),
            "the reader's pages are cached (kernel_cache {kernel_cache})"
        );

        let new = pattern(2, 2 * PAGE);
        let writer = OpenOptions::new().write(true).open(&path).unwrap();
        writer.write_all_at(&new, 0).unwrap();
        // Opening drops the file's pages unless `kernel_cache` keeps them;
        // a cached write then fills the pages it covers, a direct one not.
        let resident = map.resident();
        assert_eq!(
            resident[..2],
            [!bypasses, !bypasses],
            "pages the write covered, cached (kernel_cache {kernel_cache})"
        );

        let mut expected = old.clone();
        expected[..new.len()].copy_from_slice(&new);
        let mut back = vec![0u8; len];
        reader.read_exact_at(&mut back, 0).unwrap();
        assert!(back == expected, "an open reader sees the write");
        assert!(map.bytes() == &expected[..], "a mapping sees the write");
        drop(writer);
        assert!(fs::read(&path).unwrap() == expected);
    }
}

/// A write answered before it was done and then lost is reported by the
/// close of the handle that wrote it, not taken by a reader's close first
/// (readers' handles send no FLUSH), and only once.
#[test]
fn a_lost_write_is_reported_by_the_writers_close_not_a_readers() {
    if !fuse_available() {
        return;
    }
    let store = Arc::new(CrashStore::new(32, 8 * MIB, 64 * 1024).expect("crash store"));
    FileSystem::format(store.clone()).unwrap();
    let mnt = mount_store(store.clone(), &MountConfig::default());
    let path = mnt.join("f");
    fs::write(&path, pattern(1, PAGE)).unwrap();
    File::open(mnt.path()).unwrap().sync_all().unwrap();

    for writable in [
        OpenOptions::new().write(true).clone(),
        OpenOptions::new().read(true).write(true).clone(),
    ] {
        let writer = writable.open(&path).unwrap();
        store.set_write_budget(Some(0));
        // Answered before it is done (deferred: large enough to be worth
        // it), so the write itself succeeds.
        writer.write_all_at(&pattern(2, 16 * PAGE), 0).unwrap();
        let reader = File::open(&path).unwrap();
        assert_eq!(close(reader), 0, "a reader's close reports nothing");
        assert_eq!(
            close(writer),
            libc::EIO,
            "the writer's close reports the lost write ({writable:?})"
        );
        store.set_write_budget(None);
        let again = writable.open(&path).unwrap();
        assert_eq!(close(again), 0, "reported once");
    }
}

/// close(2) of `file`, returning its errno (0 for success).
fn close(file: File) -> i32 {
    let fd = std::os::fd::IntoRawFd::into_raw_fd(file);
    // SAFETY: `fd` is owned and closed exactly once here.
    if unsafe { libc::close(fd) } == 0 {
        0
    } else {
        std::io::Error::last_os_error().raw_os_error().unwrap_or(-1)
    }
}

/// O_DSYNC writes are durable when they return through a write-only handle
/// (served as direct I/O: the daemon syncs it, the kernel sends no FSYNC)
/// and a read-write one (the kernel's FSYNC after the cached write): a
/// power cut right after, with nothing else synced, keeps both.
#[test]
fn dsync_writes_through_any_handle_survive_a_power_cut_right_after() {
    if !fuse_available() {
        return;
    }
    for writeback_cache in [false, true] {
        let config = MountConfig {
            writeback_cache,
            ..MountConfig::default()
        };
        dsync_writes_survive_a_power_cut(&config);
    }
}

fn dsync_writes_survive_a_power_cut(config: &MountConfig) {
    let store = Arc::new(CrashStore::new(32, 8 * MIB, 64 * 1024).expect("crash store"));
    FileSystem::format(store.clone()).unwrap();
    let mnt = mount_store(store.clone(), config);
    let mut inodes = Vec::new();
    for (i, name) in ["write-only", "read-write"].into_iter().enumerate() {
        let path = mnt.join(name);
        common::write_synced(&path, &pattern(10 + i as u8, 64 * 1024)).unwrap();
        inodes.push(fs::metadata(&path).unwrap().ino());
    }
    File::open(mnt.path()).unwrap().sync_all().unwrap();

    // A sync makes the whole store durable, so each write gets a power cut
    // of its own, before the other one syncs.
    for (i, read) in [false, true].into_iter().enumerate() {
        let written = pattern(1 + i as u8, 24 * 1024 + 17);
        let file = OpenOptions::new()
            .read(read)
            .write(true)
            .custom_flags(libc::O_DSYNC)
            .open(mnt.join(["write-only", "read-write"][i]))
            .unwrap();
        file.write_all_at(&written, 5000).unwrap();
        let crashed = Arc::new(store.crash_flushed().unwrap());
        let after = FileSystem::open(crashed, FsOptions::default()).unwrap();
        let mut expected = pattern(10 + i as u8, 64 * 1024);
        expected[5000..5000 + written.len()].copy_from_slice(&written);
        assert!(
            after.read(inodes[i], 0, expected.len()).unwrap() == expected,
            "an O_DSYNC write through a {} handle lost by a power cut after it returned \
             (writeback_cache {})",
            ["write-only", "read-write"][i],
            config.writeback_cache
        );
    }
}

/// With `writeback_cache` the kernel keeps a file's times itself and takes
/// them from the daemon no more, so a write it does not see as its own
/// would leave `stat` showing an old mtime for good. Every kind of handle
/// moves the mtime: write-only, read-write, O_DIRECT, O_DIRECT|O_DSYNC (and
/// the O_DSYNC write is durable, as the power-cut test shows for the rest).
#[test]
fn every_write_moves_the_mtime_with_and_without_writeback_cache() {
    if !fuse_available() {
        return;
    }
    let long_ago = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000);
    for writeback_cache in [false, true] {
        let config = MountConfig {
            writeback_cache,
            ..MountConfig::default()
        };
        let mnt = mount_store(common::mem_store(), &config);
        let path = mnt.join("f");
        fs::write(&path, pattern(1, 16 * PAGE)).unwrap();
        let kinds: [(&str, bool, i32); 4] = [
            ("write-only", false, 0),
            ("read-write", true, 0),
            ("O_DIRECT", true, libc::O_DIRECT),
            ("O_DIRECT|O_DSYNC", false, libc::O_DIRECT | libc::O_DSYNC),
        ];
        let mut buf = Aligned::new(2 * PAGE);
        for (i, (kind, read, flags)) in kinds.into_iter().enumerate() {
            File::options()
                .write(true)
                .open(&path)
                .unwrap()
                .set_modified(long_ago)
                .unwrap();
            assert_eq!(fs::metadata(&path).unwrap().modified().unwrap(), long_ago);
            let file = OpenOptions::new()
                .read(read)
                .write(true)
                .custom_flags(flags)
                .open(&path)
                .unwrap();
            buf.as_mut()
                .copy_from_slice(&pattern(10 + i as u8, 2 * PAGE));
            file.write_all_at(buf.as_mut(), (2 * i * PAGE) as u64)
                .unwrap();
            let seen = file.metadata().unwrap().modified().unwrap();
            drop(file);
            let after_close = fs::metadata(&path).unwrap().modified().unwrap();
            assert!(
                seen > long_ago && after_close > long_ago,
                "a write through a {kind} handle left the mtime where it was \
                 (writeback_cache {writeback_cache})"
            );
            let mut back = vec![0u8; 2 * PAGE];
            File::open(&path)
                .unwrap()
                .read_exact_at(&mut back, (2 * i * PAGE) as u64)
                .unwrap();
            assert!(
                back == pattern(10 + i as u8, 2 * PAGE),
                "{kind} write read back"
            );
        }
    }
}
