//! Unmount then mount at once, the way people and scripts do it: plain
//! `umount`, `fusermount3 -u` and `raidfs umount` return while the old
//! daemon may still be closing the array and holding the members' locks;
//! the next `raidfs mount` must wait for it rather than fail.

mod common;

use std::fs;
use std::io::{BufRead, BufReader};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::cli::{raidfs, stderr};
use common::{fuse_available, DaemonGuard};
use raidfs::cli::mount::registry;
use raidfs::fuse::mounts;

/// The tests unmount with umount(2), which fails with EBUSY while any
/// process holds a descriptor on the mount; a sibling test forking a child
/// could hold one for a moment, so they take turns.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// A RAID1 array of two 64 MiB sparse images and a mount point.
struct Array {
    dir: tempfile::TempDir,
    mnt: PathBuf,
}

impl Array {
    fn new() -> Array {
        let dir = tempfile::tempdir().expect("tempdir");
        let out = raidfs(
            &["create", "-l", "1", "-s", "64M", "a.img", "b.img"],
            dir.path(),
        );
        assert!(out.status.success(), "create: {}", stderr(&out));
        let mnt = dir.path().join("mnt");
        fs::create_dir(&mnt).expect("mount point");
        let mnt = mnt.canonicalize().expect("canonical mount point");
        Array { dir, mnt }
    }

    fn mount(&self) -> Output {
        let log = format!("log={}", self.dir.path().join("daemon.log").display());
        raidfs(
            &["mount", "-o", &log, "a.img", "b.img", "mnt"],
            self.dir.path(),
        )
    }

    fn daemon(&self) -> registry::DaemonRecord {
        registry::read(&self.mnt)
            .expect("read the daemon's record")
            .expect("a mounted daemon is recorded")
    }
}

fn run(program: &str, args: &[&Path]) -> Output {
    Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("run {program}: {e}"))
}

fn content(i: usize) -> Vec<u8> {
    format!("cycle {i}: ")
        .into_bytes()
        .into_iter()
        .chain((0..5000u32).map(|b| (b as usize * 31 + i) as u8))
        .collect()
}

/// What went wrong in one cycle, if anything.
fn cycle(array: &Array, i: usize, unmount: &dyn Fn(&Path) -> Output) -> Option<String> {
    let file = array.mnt.join(format!("f{i}"));
    if let Err(e) = fs::write(&file, content(i)) {
        return Some(format!("cycle {i}: writing {}: {e}", file.display()));
    }
    let old = array.daemon();
    let out = unmount(&array.mnt);
    if !out.status.success() {
        return Some(format!("cycle {i}: unmount: {}", stderr(&out)));
    }
    let out = array.mount();
    if !out.status.success() {
        let why = format!("cycle {i}: mount right after the unmount: {}", stderr(&out));
        // Let the old daemon finish so the next cycle starts mounted.
        old.wait_for_exit(Duration::from_secs(30));
        let again = array.mount();
        assert!(
            again.status.success(),
            "{why}; and later: {}",
            stderr(&again)
        );
        return Some(why);
    }
    match fs::read(&file) {
        Ok(got) if got == content(i) => None,
        Ok(got) => Some(format!(
            "cycle {i}: f{i} reads back {} other bytes",
            got.len()
        )),
        Err(e) => Some(format!("cycle {i}: reading f{i} after remount: {e}")),
    }
}

#[test]
fn fifty_plain_umounts_each_followed_at_once_by_a_mount() {
    if !fuse_available() {
        return;
    }
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let array = Array::new();
    let _guard = DaemonGuard::new(&array.mnt);
    let out = array.mount();
    assert!(out.status.success(), "first mount: {}", stderr(&out));
    let cycles = 50;
    let start = Instant::now();
    let failures: Vec<String> = (0..cycles)
        .filter_map(|i| cycle(&array, i, &|mnt| run("umount", &[mnt])))
        .collect();
    let took = start.elapsed();
    eprintln!(
        "{cycles} umount/mount cycles took {:.1} s, {} failed",
        took.as_secs_f64(),
        failures.len()
    );
    assert!(
        failures.is_empty(),
        "{} of {cycles} cycles failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
    // Every file written in every cycle is still there.
    for i in 0..cycles {
        assert_eq!(
            fs::read(array.mnt.join(format!("f{i}"))).ok(),
            Some(content(i))
        );
    }
    let out = raidfs(&["umount", "mnt"], array.dir.path());
    assert!(out.status.success(), "{}", stderr(&out));
}

#[test]
fn fusermount_and_raidfs_umount_are_followed_at_once_by_a_mount() {
    if !fuse_available() {
        return;
    }
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let array = Array::new();
    let _guard = DaemonGuard::new(&array.mnt);
    let out = array.mount();
    assert!(out.status.success(), "first mount: {}", stderr(&out));
    let have_fusermount = Command::new("fusermount3")
        .arg("-V")
        .output()
        .is_ok_and(|o| o.status.success());
    let mut failures = Vec::new();
    if have_fusermount {
        for i in 0..3 {
            let fusermount = |mnt: &Path| {
                Command::new("fusermount3")
                    .arg("-u")
                    .arg(mnt)
                    .output()
                    .expect("run fusermount3")
            };
            failures.extend(cycle(&array, i, &fusermount));
        }
    } else {
        eprintln!("fusermount3 is not installed; only `raidfs umount` is tried");
    }
    for i in 3..6 {
        let raidfs_umount = |mnt: &Path| raidfs(&[Path::new("umount"), mnt], Path::new("/"));
        failures.extend(cycle(&array, i, &raidfs_umount));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    let out = raidfs(&["umount", "mnt"], array.dir.path());
    assert!(out.status.success(), "{}", stderr(&out));
}

/// A member whose lock another process holds: mount says once that it is
/// waiting and goes on as soon as the lock is released; fsck gives up after
/// its shorter wait with the clear error; a member that a live mount serves
/// is refused at once.
#[test]
fn a_held_member_lock_is_waited_for_then_reported() {
    if !fuse_available() {
        return;
    }
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let array = Array::new();
    let _guard = DaemonGuard::new(&array.mnt);
    let holder = fs::File::open(array.dir.path().join("b.img")).expect("open b.img");
    // SAFETY: flock on a descriptor this test owns.
    let rc = unsafe { libc::flock(holder.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    assert_eq!(rc, 0, "lock b.img");

    let start = Instant::now();
    let out = raidfs(&["fsck", "a.img", "b.img"], array.dir.path());
    let waited = start.elapsed();
    assert!(!out.status.success(), "fsck ran on a locked member");
    let err = stderr(&out);
    assert!(
        err.contains("waiting for the previous raidfs process to release"),
        "{err}"
    );
    assert!(
        err.contains("b.img is in use by another raidfs process (waited 10 s"),
        "{err}"
    );
    assert!(
        waited >= Duration::from_secs(10),
        "gave up after {waited:?}"
    );

    let log = format!("log={}", array.dir.path().join("daemon.log").display());
    let mut child = Command::new(env!("CARGO_BIN_EXE_raidfs"))
        .args(["mount", "-o", &log, "a.img", "b.img", "mnt"])
        .current_dir(array.dir.path())
        .stderr(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("start raidfs mount");
    let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
    let first = lines.next().and_then(|l| l.ok()).unwrap_or_default();
    assert!(
        first.contains("raidfs: waiting for the previous raidfs process to release")
            && first.contains("b.img"),
        "{first}"
    );
    assert!(mounts::mount_at(&array.mnt).expect("mountinfo").is_none());
    drop(holder);
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    let status = child.wait().expect("wait for raidfs mount");
    assert!(
        status.success(),
        "mount after the lock was released: {rest:?}"
    );
    assert!(rest.is_empty(), "one notice only: {rest:?}");
    fs::write(array.mnt.join("x"), b"x").expect("write through the mount");

    // The members are served by a live mount: no waiting.
    let second = array.dir.path().join("second");
    fs::create_dir(&second).expect("second mount point");
    let _second_guard = DaemonGuard::new(&second);
    let start = Instant::now();
    let out = raidfs(&["mount", "a.img", "b.img", "second"], array.dir.path());
    assert!(
        !out.status.success(),
        "the served members were mounted twice"
    );
    assert!(
        stderr(&out).contains("in use by another raidfs process"),
        "{}",
        stderr(&out)
    );
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
    let out = raidfs(&["umount", "mnt"], array.dir.path());
    assert!(out.status.success(), "{}", stderr(&out));
}
