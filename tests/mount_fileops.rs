//! SEEK_DATA/SEEK_HOLE, copy_file_range, O_TMPFILE and renameat2's
//! RENAME_WHITEOUT/EXCHANGE/NOREPLACE through real FUSE mounts, overlayfs
//! with its upper layer on raidfs, and an O_TMPFILE file left open when the
//! daemon is killed (the next mount frees it).

mod common;

use std::ffi::{CString, OsStr};
use std::fs::{self, File, OpenOptions};
use std::io::{Error, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::io::{AsRawFd, FromRawFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::cli::Mirror;
use common::{detach, fuse_available, kill_daemon, mount_mem, shared_mount, DaemonGuard};
use raidfs::fuse::MountConfig;

const MIB: usize = 1 << 20;
const NOBODY: u32 = 65534;

fn cstr(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).expect("path without NUL")
}

/// The errno of a failed call, or its result.
fn check(rc: i64) -> Result<i64, i32> {
    if rc < 0 {
        Err(Error::last_os_error().raw_os_error().unwrap_or(0))
    } else {
        Ok(rc)
    }
}

fn lseek(file: &File, offset: i64, whence: i32) -> Result<i64, i32> {
    // SAFETY: lseek on a descriptor this test owns.
    check(unsafe { libc::lseek(file.as_raw_fd(), offset, whence) })
}

fn copy_range(from: &File, off_in: i64, to: &File, off_out: i64, len: usize) -> Result<i64, i32> {
    let (mut i, mut o) = (off_in, off_out);
    // SAFETY: valid descriptors and offsets that live across the call.
    check(
        unsafe { libc::copy_file_range(from.as_raw_fd(), &mut i, to.as_raw_fd(), &mut o, len, 0) }
            as i64,
    )
}

fn renameat2(from: &Path, to: &Path, flags: u32) -> Result<(), i32> {
    let (f, t) = (cstr(from), cstr(to));
    // SAFETY: valid NUL-terminated paths.
    check(unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            f.as_ptr(),
            libc::AT_FDCWD,
            t.as_ptr(),
            flags,
        )
    } as i64)
    .map(|_| ())
}

/// open(2) of `dir` with O_TMPFILE (and `extra` flags).
fn tmpfile(dir: &Path, extra: i32, mode: u32) -> Result<File, i32> {
    let d = cstr(dir);
    // SAFETY: a valid path; the descriptor returned is owned by the File.
    let fd = check(
        unsafe { libc::open(d.as_ptr(), libc::O_TMPFILE | libc::O_RDWR | extra, mode) } as i64,
    )?;
    // SAFETY: fd was just opened and nothing else owns it.
    Ok(unsafe { File::from_raw_fd(fd as i32) })
}

/// linkat(2) of an open file to `to`, as an O_TMPFILE file is given a name.
fn link_open_file(file: &File, to: &Path) -> Result<(), i32> {
    let from = CString::new(format!("/proc/self/fd/{}", file.as_raw_fd())).expect("path");
    let t = cstr(to);
    // SAFETY: valid NUL-terminated paths.
    check(unsafe {
        libc::linkat(
            libc::AT_FDCWD,
            from.as_ptr(),
            libc::AT_FDCWD,
            t.as_ptr(),
            libc::AT_SYMLINK_FOLLOW,
        )
    } as i64)
    .map(|_| ())
}

fn free_blocks(path: &Path) -> u64 {
    let p = cstr(path);
    // SAFETY: statvfs fills the zeroed struct it is given.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::statvfs(p.as_ptr(), &mut st) }, 0, "statvfs");
    st.f_bfree
}

/// Wait for `done` (an outcome the daemon reaches after a request the
/// kernel sends without waiting, such as RELEASE).
fn wait_until(what: &str, done: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::yield_now();
    }
}

/// A file with data at [0, 4 KiB) and [1 MiB, 1 MiB + 10), 3 MiB long.
fn sparse_file(path: &Path) -> File {
    let mut f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
        .expect("create");
    f.write_all(&[1u8; 4096]).expect("write");
    std::os::unix::fs::FileExt::write_all_at(&f, &[2u8; 10], MIB as u64).expect("write");
    f.set_len(3 * MIB as u64).expect("set_len");
    f
}

#[test]
fn seek_data_and_seek_hole_find_the_extents() {
    if !fuse_available() {
        return;
    }
    let mnt = mount_mem(&MountConfig::default());
    let f = sparse_file(&mnt.join("sparse"));
    let m = MIB as i64;
    assert_eq!(lseek(&f, 0, libc::SEEK_DATA), Ok(0));
    assert_eq!(lseek(&f, 0, libc::SEEK_HOLE), Ok(4096));
    assert_eq!(lseek(&f, 4096, libc::SEEK_DATA), Ok(m));
    assert_eq!(lseek(&f, m + 5, libc::SEEK_DATA), Ok(m + 5));
    assert_eq!(lseek(&f, m + 5, libc::SEEK_HOLE), Ok(m + 4096));
    assert_eq!(lseek(&f, 2 * m, libc::SEEK_DATA), Err(libc::ENXIO));
    assert_eq!(lseek(&f, 2 * m, libc::SEEK_HOLE), Ok(2 * m));
    assert_eq!(lseek(&f, 3 * m, libc::SEEK_HOLE), Err(libc::ENXIO));
    // The kernel keeps answering the other whence values itself.
    assert_eq!(lseek(&f, -10, libc::SEEK_END), Ok(3 * m - 10));
    assert_eq!(lseek(&f, 7, libc::SEEK_SET), Ok(7));
}

#[test]
fn copy_file_range_copies_inside_the_array_and_keeps_holes() {
    if !fuse_available() {
        return;
    }
    let mnt = mount_mem(&MountConfig::default());
    let src = sparse_file(&mnt.join("src"));
    let dst = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(mnt.join("dst"))
        .expect("create dst");
    assert_eq!(copy_range(&src, 0, &dst, 0, 8 * MIB), Ok(3 * MIB as i64));
    assert_eq!(
        fs::read(mnt.join("dst")).expect("read dst"),
        fs::read(mnt.join("src")).expect("read src")
    );
    // Only the source's data blocks were written: a copy through the
    // page cache (the kernel's fallback) would have filled the holes.
    let (s, d) = (src.metadata().expect("stat"), dst.metadata().expect("stat"));
    assert_eq!(d.len(), 3 * MIB as u64);
    assert_eq!(d.blocks(), s.blocks());
    assert!(d.blocks() * 512 < MIB as u64, "{} blocks", d.blocks());
    // At the end there is nothing to copy; ranges of one file must not overlap.
    assert_eq!(copy_range(&src, 3 * MIB as i64, &dst, 0, 10), Ok(0));
    assert_eq!(copy_range(&src, 0, &src, 4096, 8192), Err(libc::EINVAL));
    assert_eq!(
        copy_range(&src, 0, &src, 3 * MIB as i64, 4096),
        Ok(4096),
        "disjoint ranges of one file copy"
    );
    let append = OpenOptions::new()
        .append(true)
        .open(mnt.join("dst"))
        .expect("open O_APPEND");
    assert_eq!(copy_range(&src, 0, &append, 0, 10), Err(libc::EBADF));
}

#[test]
fn copy_file_range_stops_at_the_callers_file_size_limit() {
    if !fuse_available() {
        return;
    }
    let mnt = mount_mem(&MountConfig::default());
    fs::write(mnt.join("src"), vec![4u8; 65536]).expect("write src");
    // RLIMIT_FSIZE of 16 KiB (ulimit -f counts KiB), SIGXFSZ ignored so
    // the copy past it fails with EFBIG instead of killing xfs_io, which
    // loops on short copies.
    let script = format!(
        "trap '' XFSZ; ulimit -f 16; exec xfs_io -f -c 'copy_range -s 0 -d 0 -l 65536 {}' {}",
        mnt.join("src").display(),
        mnt.join("dst").display()
    );
    if std::process::Command::new("xfs_io")
        .arg("-V")
        .output()
        .is_err()
    {
        eprintln!("skipping: xfs_io is not installed");
        return;
    }
    let out = std::process::Command::new("bash")
        .arg("-c")
        .arg(&script)
        .output()
        .expect("run bash");
    let said =
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("File too large"), "{said}");
    assert_eq!(fs::metadata(mnt.join("dst")).expect("stat").len(), 16384);
    assert_eq!(fs::read(mnt.join("dst")).expect("read"), vec![4u8; 16384]);
}

#[test]
fn copy_file_range_by_another_user_clears_set_id_bits() {
    if !fuse_available() {
        return;
    }
    let mnt = shared_mount();
    fs::write(mnt.join("src"), vec![3u8; 8192]).expect("write src");
    fs::write(mnt.join("prog"), b"").expect("create prog");
    fs::set_permissions(mnt.join("prog"), fs::Permissions::from_mode(0o6777)).expect("chmod");
    let (src, prog) = (mnt.join("src"), mnt.join("prog"));
    // fsuid is per thread: this thread alone acts as nobody, without
    // CAP_FSETID (dropped with a nonzero fsuid).
    let copied = std::thread::spawn(move || {
        // SAFETY: setfsuid/setfsgid change only this thread's credentials.
        unsafe {
            libc::setfsgid(NOBODY);
            libc::setfsuid(NOBODY);
        }
        let from = File::open(&src).expect("open src as nobody");
        let to = OpenOptions::new()
            .write(true)
            .open(&prog)
            .expect("open prog as nobody");
        copy_range(&from, 0, &to, 0, 8192)
    })
    .join()
    .expect("copying thread");
    assert_eq!(copied, Ok(8192));
    let meta = fs::metadata(mnt.join("prog")).expect("stat prog");
    assert_eq!(meta.mode() & 0o7777, 0o777, "set-ID bits cleared");
    assert_eq!(meta.len(), 8192);
    assert_eq!(fs::read(mnt.join("prog")).expect("read"), vec![3u8; 8192]);
}

#[test]
fn o_tmpfile_makes_an_unnamed_file_that_linkat_can_name() {
    if !fuse_available() {
        return;
    }
    let mnt = mount_mem(&MountConfig::default());
    let dir = mnt.join("d");
    fs::create_dir(&dir).expect("mkdir");
    let baseline = {
        mnt.fs().sync_all().expect("sync");
        mnt.fs().statfs().expect("statfs").bfree
    };

    let mut named = tmpfile(&dir, 0, 0o666).expect("O_TMPFILE");
    let meta = named.metadata().expect("fstat");
    assert!(meta.is_file());
    assert_eq!(meta.nlink(), 0);
    // Read, not set: other tests of this binary create files meanwhile.
    let status = fs::read_to_string("/proc/self/status").expect("status");
    let umask = status
        .lines()
        .find_map(|l| l.strip_prefix("Umask:"))
        .and_then(|v| u32::from_str_radix(v.trim(), 8).ok())
        .expect("Umask line");
    assert_eq!(meta.mode() & 0o777, 0o666 & !umask);
    named.write_all(b"made without a name").expect("write");
    assert_eq!(fs::read_dir(&dir).expect("readdir").count(), 0);
    link_open_file(&named, &dir.join("named")).expect("linkat");
    assert_eq!(named.metadata().expect("fstat").nlink(), 1);
    drop(named);
    assert_eq!(
        fs::read(dir.join("named")).expect("read"),
        b"made without a name"
    );

    // O_EXCL: it can never be named.
    let excl = tmpfile(&dir, libc::O_EXCL, 0o600).expect("O_TMPFILE|O_EXCL");
    assert_eq!(link_open_file(&excl, &dir.join("never")), Err(libc::ENOENT));
    drop(excl);

    // Closed without a name: its blocks come back.
    let mut scratch = tmpfile(&dir, 0, 0o600).expect("O_TMPFILE");
    scratch.write_all(&vec![9u8; 4 * MIB]).expect("write");
    scratch.sync_all().expect("fsync");
    let used = mnt.fs().statfs().expect("statfs").bfree;
    assert!(used < baseline - 1000, "{used} of {baseline}");
    drop(scratch);
    let fs = mnt.fs().clone();
    let named_blocks = 1;
    wait_until("the tmpfile's release", || {
        fs.sync_all().is_ok()
            && fs.statfs().map(|s| s.bfree).unwrap_or(0) == baseline - named_blocks
    });

    // Writing and searching the directory are needed, as for create.
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o555)).expect("chmod");
    let denied = std::thread::spawn({
        let dir = dir.clone();
        move || {
            // SAFETY: changes only this thread's credentials.
            unsafe {
                libc::setfsgid(NOBODY);
                libc::setfsuid(NOBODY);
            }
            tmpfile(&dir, 0, 0o600).map(|_| ())
        }
    })
    .join()
    .expect("thread");
    assert_eq!(denied, Err(libc::EACCES));
}

#[test]
fn renameat2_whiteout_exchange_and_noreplace() {
    if !fuse_available() {
        return;
    }
    let mnt = mount_mem(&MountConfig::default());
    let (a, b, c) = (mnt.join("a"), mnt.join("b"), mnt.join("c"));
    fs::write(&a, b"a").expect("write a");
    fs::write(&b, b"b").expect("write b");
    assert_eq!(renameat2(&a, &b, libc::RENAME_NOREPLACE), Err(libc::EEXIST));
    renameat2(&a, &b, libc::RENAME_EXCHANGE).expect("exchange");
    assert_eq!(fs::read(&a).expect("read a"), b"b");
    assert_eq!(fs::read(&b).expect("read b"), b"a");
    assert_eq!(
        renameat2(&a, &b, libc::RENAME_WHITEOUT | libc::RENAME_EXCHANGE),
        Err(libc::EINVAL)
    );
    renameat2(&a, &c, libc::RENAME_WHITEOUT | libc::RENAME_NOREPLACE).expect("whiteout");
    assert_eq!(fs::read(&c).expect("read c"), b"b");
    let wh = fs::symlink_metadata(&a).expect("the whiteout");
    assert!(wh.file_type().is_char_device());
    assert_eq!((wh.rdev(), wh.mode() & 0o7777), (0, 0));
    let listed = fs::read_dir(mnt.path())
        .expect("readdir")
        .map(|e| e.expect("entry"))
        .find(|e| e.file_name() == "a")
        .expect("a listed");
    assert!(listed.file_type().expect("d_type").is_char_device());
}

/// An overlay mount, detached on drop whatever the test did.
struct Overlay {
    merged: PathBuf,
}

impl Drop for Overlay {
    fn drop(&mut self) {
        detach(&self.merged);
    }
}

fn mount_overlay(lower: &Path, upper: &Path, work: &Path, merged: &Path) -> Overlay {
    let options = format!(
        "lowerdir={},upperdir={},workdir={}",
        lower.display(),
        upper.display(),
        work.display()
    );
    let (src, target, kind) = (
        cstr(Path::new("overlay")),
        cstr(merged),
        cstr(Path::new("overlay")),
    );
    let data = CString::new(options).expect("options");
    // SAFETY: valid NUL-terminated strings for mount(2).
    let rc = unsafe {
        libc::mount(
            src.as_ptr(),
            target.as_ptr(),
            kind.as_ptr(),
            0,
            data.as_ptr().cast(),
        )
    };
    assert_eq!(rc, 0, "mount overlay: {}", Error::last_os_error());
    Overlay {
        merged: merged.to_path_buf(),
    }
}

/// A line written into the kernel log, so the lines logged after it can be
/// told apart; None when the log cannot be written or read here.
fn kernel_log_mark(tag: &str) -> Option<String> {
    let mark = format!("raidfs mount_fileops {tag} {}", std::process::id());
    fs::OpenOptions::new()
        .write(true)
        .open("/dev/kmsg")
        // One record per line: without its newline a record stays open
        // for a continuation, and the next mark would join it.
        .and_then(|mut k| k.write_all(format!("{mark}\n").as_bytes()))
        .ok()?;
    Some(mark)
}

fn kernel_log_between(start: &str, end: &str) -> Option<String> {
    let out = std::process::Command::new("dmesg").output().ok()?;
    let log = String::from_utf8_lossy(&out.stdout);
    let from = log.find(start)?;
    let to = log[from..].find(end)? + from;
    Some(log[from..to].to_string())
}

fn xattr(path: &Path, name: &str) -> Option<Vec<u8>> {
    let (p, n) = (cstr(path), CString::new(name).expect("name"));
    let mut buf = vec![0u8; 256];
    // SAFETY: the buffer is valid for its length.
    let rc = unsafe { libc::lgetxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    (rc >= 0).then(|| {
        buf.truncate(rc as usize);
        buf
    })
}

#[test]
fn overlayfs_takes_a_raidfs_upper_layer() {
    if !fuse_available() {
        return;
    }
    let mnt = mount_mem(&MountConfig::default());
    let lower = tempfile::tempdir().expect("lower dir");
    let merged = tempfile::tempdir().expect("merged dir");
    fs::write(lower.path().join("gone"), b"lower").expect("write");
    fs::write(lower.path().join("moved"), b"moved").expect("write");
    fs::write(lower.path().join("kept"), b"kept").expect("write");
    fs::create_dir(lower.path().join("dir")).expect("mkdir");
    fs::write(lower.path().join("dir/inner"), b"inner").expect("write");
    let (upper, work) = (mnt.join("upper"), mnt.join("work"));
    fs::create_dir(&upper).expect("mkdir upper");
    fs::create_dir(&work).expect("mkdir work");

    let begin = kernel_log_mark("overlay begin");
    let overlay = mount_overlay(lower.path(), &upper, &work, merged.path());
    let end = kernel_log_mark("overlay end");
    if let (Some(begin), Some(end)) = (begin, end) {
        if let Some(log) = kernel_log_between(&begin, &end) {
            for refusal in ["does not support", "RENAME_WHITEOUT", "tmpfile", "d_type"] {
                assert!(!log.contains(refusal), "overlayfs said: {log}");
            }
        }
    }

    let m = overlay.merged.clone();
    fs::write(m.join("new"), b"new").expect("write new");
    fs::rename(m.join("moved"), m.join("renamed")).expect("rename");
    fs::remove_file(m.join("gone")).expect("unlink");
    fs::remove_dir_all(m.join("dir")).expect("rmdir");
    fs::create_dir(m.join("dir")).expect("mkdir again");
    // overlayfs serves O_TMPFILE only when its upper layer does.
    let mut t = tmpfile(&m, 0, 0o600).expect("O_TMPFILE on the overlay");
    t.write_all(b"tmp").expect("write tmpfile");
    link_open_file(&t, &m.join("from-tmp")).expect("linkat on the overlay");
    drop(t);

    let mut seen: Vec<String> = fs::read_dir(&m)
        .expect("readdir merged")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    seen.sort();
    assert_eq!(seen, ["dir", "from-tmp", "kept", "new", "renamed"]);
    assert_eq!(fs::read(m.join("renamed")).expect("read"), b"moved");
    assert_eq!(fs::read(m.join("from-tmp")).expect("read"), b"tmp");
    assert_eq!(fs::read_dir(m.join("dir")).expect("readdir").count(), 0);

    // In the upper layer: whiteouts (character devices 0:0, found by
    // d_type) for the names deleted from the lower one, and the new
    // directory marked opaque with a trusted.* attribute.
    for name in ["gone", "moved"] {
        let entry = fs::read_dir(&upper)
            .expect("readdir upper")
            .map(|e| e.expect("entry"))
            .find(|e| e.file_name() == OsStr::new(name))
            .unwrap_or_else(|| panic!("no whiteout for {name}"));
        assert!(
            entry.file_type().expect("d_type").is_char_device(),
            "{name}"
        );
        assert_eq!(entry.metadata().expect("stat").rdev(), 0, "{name}");
    }
    assert_eq!(
        xattr(&upper.join("dir"), "trusted.overlay.opaque").as_deref(),
        Some(&b"y"[..])
    );
    assert_eq!(fs::read(upper.join("new")).expect("read upper"), b"new");
    assert_eq!(
        fs::read(lower.path().join("gone")).expect("lower"),
        b"lower"
    );
    drop(overlay);
}

/// A [`Mirror`] of member images and a `raidfs mount` of it (through the
/// binary).
struct Daemon {
    mirror: Mirror,
    _guard: DaemonGuard,
}

impl Daemon {
    fn start() -> Daemon {
        let mirror = Mirror::create();
        let daemon = Daemon {
            _guard: DaemonGuard::new(&mirror.mnt),
            mirror,
        };
        daemon.mount();
        daemon
    }

    fn mount(&self) {
        common::cli::check(self.mirror.mount_with(""), "raidfs mount");
    }

    fn umount(&self) {
        self.mirror.umount();
    }

    /// The daemon log's warnings and errors.
    fn complaints(&self) -> Vec<String> {
        self.mirror
            .log()
            .lines()
            .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
            .map(str::to_string)
            .collect()
    }
}

#[test]
fn overlayfs_copy_ups_leave_the_daemon_log_clean() {
    if !fuse_available() {
        return;
    }
    let daemon = Daemon::start();
    let root = &daemon.mirror.mnt;
    for d in ["lower/etc", "upper", "work", "merged"] {
        fs::create_dir_all(root.join(d)).expect("mkdir");
    }
    fs::write(root.join("lower/etc/access.conf"), b"salts").expect("write");
    fs::write(root.join("lower/etc/other"), b"other").expect("write");
    let merged = root.join("merged");
    let overlay = mount_overlay(
        &root.join("lower"),
        &root.join("upper"),
        &root.join("work"),
        &merged,
    );
    // What generic/631 does in a loop: copy-ups (which ask the upper
    // layer for inode flags by ioctl), renames over whiteouts, new files.
    for _ in 0..3 {
        let (conf, bak) = (
            merged.join("etc/access.conf"),
            merged.join("etc/access.conf.bak"),
        );
        fs::rename(&conf, &bak).expect("mv");
        fs::write(&conf, b"").expect("touch");
    }
    fs::OpenOptions::new()
        .append(true)
        .open(merged.join("etc/other"))
        .and_then(|mut f| f.write_all(b" more"))
        .expect("append (copy-up)");
    assert_eq!(
        fs::read(merged.join("etc/other")).expect("read"),
        b"other more"
    );
    drop(overlay);
    daemon.umount();
    assert_eq!(daemon.complaints(), Vec::<String>::new());
}

#[test]
fn a_tmpfile_open_when_the_daemon_is_killed_leaks_no_space() {
    if !fuse_available() {
        return;
    }
    let daemon = Daemon::start();
    let mnt = daemon.mirror.mnt.clone();
    let baseline = free_blocks(&mnt);
    let mut t = tmpfile(&mnt, 0, 0o600).expect("O_TMPFILE");
    t.write_all(&vec![5u8; 8 * MIB]).expect("write");
    t.sync_all()
        .expect("fsync: the orphan and its blocks are committed");
    let used = free_blocks(&mnt);
    assert!(used + 2000 <= baseline, "{used} of {baseline}");

    kill_daemon(&mnt, Duration::from_secs(30));
    detach(&mnt);
    drop(t);
    daemon.mount();
    assert_eq!(free_blocks(&mnt), baseline, "the orphan was freed");
    daemon.umount();
}
