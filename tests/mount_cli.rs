//! `raidfs mount` / `raidfs umount` as a user runs them: a daemon per mount,
//! clean close on umount, refusal of a second mount of the same members,
//! and recovery after the daemon is killed.

mod common;

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use common::cli::{raidfs, stderr, wait_for_detail};
use common::{fuse_available, kill_daemon, DaemonGuard};
use raidfs::cli::mount::{daemon_pid, registry};
use raidfs::fuse::mounts;

fn ok(out: &Output) -> bool {
    if !out.status.success() {
        eprintln!(
            "stdout: {}\nstderr: {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    out.status.success()
}

/// A RAID5 array of three 64 MiB sparse images in a temporary directory.
struct Setup {
    dir: tempfile::TempDir,
}

impl Setup {
    fn new() -> Setup {
        Setup::created_with(&[])
    }

    /// As `new`, with more `raidfs create` options.
    fn created_with(options: &[&str]) -> Setup {
        let dir = tempfile::tempdir().unwrap();
        let mut args = vec!["create", "-l", "5", "-s", "64M"];
        args.extend_from_slice(options);
        args.extend_from_slice(&["m0", "m1", "m2"]);
        let out = raidfs(&args, dir.path());
        assert!(ok(&out), "raidfs create failed");
        Setup { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn mount_dir(&self, name: &str) -> PathBuf {
        let p = self.path(name);
        fs::create_dir_all(&p).unwrap();
        p.canonicalize().unwrap()
    }

    /// Mount on `mnt`, made by `mount_dir` (it may now hold a dead mount).
    fn mount(&self, mnt: &str) -> Output {
        raidfs(
            &[
                "mount",
                "-o",
                &format!("log={}", self.path("daemon.log").display()),
                "m0",
                "m1",
                "m2",
                mnt,
            ],
            self.dir.path(),
        )
    }

    fn umount(&self, mnt: &str) -> Output {
        raidfs(&["umount", mnt], self.dir.path())
    }

    fn member_state(&self) -> String {
        let out = raidfs(&["examine", "--json", "m0"], self.dir.path());
        assert!(ok(&out));
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        json[0]["state"].as_str().unwrap_or_default().to_string()
    }
}

fn is_mounted(path: &Path) -> bool {
    mounts::mount_at(path).unwrap().is_some()
}

#[test]
fn mount_write_umount_remount_verify() {
    if !fuse_available() {
        return;
    }
    let setup = Setup::new();
    let mnt = setup.mount_dir("mnt");
    let _guard = DaemonGuard::new(&mnt);
    assert!(ok(&setup.mount("mnt")));
    assert!(is_mounted(&mnt));
    let pid = daemon_pid(&mnt).expect("the daemon is recorded");
    assert_ne!(pid, std::process::id());

    fs::create_dir(mnt.join("docs")).unwrap();
    let big: Vec<u8> = (0..3_000_000u32).map(|i| (i % 253) as u8).collect();
    fs::write(mnt.join("docs/big.bin"), &big).unwrap();
    fs::write(mnt.join("small.txt"), b"raid").unwrap();
    assert!(
        setup.member_state().contains("dirty"),
        "{}",
        setup.member_state()
    );

    assert!(ok(&setup.umount("mnt")));
    // umount returned only after the daemon closed the array.
    assert!(!is_mounted(&mnt));
    assert_eq!(daemon_pid(&mnt), None);
    assert!(registry::read(&mnt).unwrap().is_none());
    assert_eq!(setup.member_state(), "clean");

    assert!(ok(&setup.mount("mnt")));
    assert_eq!(fs::read(mnt.join("docs/big.bin")).unwrap(), big);
    assert_eq!(fs::read(mnt.join("small.txt")).unwrap(), b"raid");
    assert!(ok(&setup.umount("mnt")));
    assert_eq!(setup.member_state(), "clean");
    // Two healthy mounts and unmounts: nothing for an operator to chase.
    let log = fs::read_to_string(setup.path("daemon.log")).unwrap();
    let errors: Vec<&str> = log
        .lines()
        .filter(|l| l.contains(" ERROR ") || l.contains(" WARN "))
        .collect();
    assert!(errors.is_empty(), "{errors:#?}");
}

#[test]
fn second_mount_of_the_same_members_fails_and_leaves_the_first_alone() {
    if !fuse_available() {
        return;
    }
    let setup = Setup::new();
    let first = setup.mount_dir("first");
    let second = setup.mount_dir("second");
    let _g1 = DaemonGuard::new(&first);
    let _g2 = DaemonGuard::new(&second);
    assert!(ok(&setup.mount("first")));
    fs::write(first.join("f"), b"one").unwrap();

    let out = setup.mount("second");
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("in use"),
        "unclear error: {}",
        stderr(&out)
    );
    assert!(!is_mounted(&second));

    // Same mount point again: busy.
    let out = setup.mount("first");
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("busy"),
        "unclear error: {}",
        stderr(&out)
    );

    assert_eq!(fs::read(first.join("f")).unwrap(), b"one");
    fs::write(first.join("g"), b"two").unwrap();
    assert!(ok(&setup.umount("first")));
    assert_eq!(setup.member_state(), "clean");
}

#[test]
fn remount_after_the_daemon_is_killed() {
    if !fuse_available() {
        return;
    }
    let setup = Setup::new();
    let mnt = setup.mount_dir("mnt");
    let _guard = DaemonGuard::new(&mnt);
    assert!(ok(&setup.mount("mnt")));
    let mut f = fs::File::create(mnt.join("durable")).unwrap();
    f.write_all(b"fsynced before the crash").unwrap();
    f.sync_all().unwrap();
    drop(f);

    kill_daemon(&mnt, Duration::from_secs(10));
    // The dead mount fails every access until it is cleared.
    let dead = fs::read(mnt.join("durable")).map_err(|e| e.raw_os_error());
    assert!(
        matches!(dead, Err(Some(libc::ENOTCONN | libc::ECONNABORTED))),
        "{dead:?}"
    );

    let out = setup.mount("mnt");
    assert!(ok(&out), "remount after kill -9 failed");
    assert_eq!(
        fs::read(mnt.join("durable")).unwrap(),
        b"fsynced before the crash"
    );
    // The kill left the array dirty: its dirty regions are resynced, and
    // only then can an unmount record it clean (one stopped earlier stays
    // dirty for the next assembly, tests/volume.rs).
    let idle = wait_for_detail(&mnt, "the resync", Duration::from_secs(60), |r| {
        r["sync"].is_null() && r["last_sync"]["action"] == "resync"
    });
    assert_eq!(idle["last_sync"]["completed"], true, "{idle:#}");
    assert!(ok(&setup.umount("mnt")));
    assert_eq!(setup.member_state(), "clean");
}

/// Unmounts a bind mount when the test ends, however it ends.
struct BindGuard(PathBuf);

impl Drop for BindGuard {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
    }
}

/// One member named twice, or reached by two paths (a symlink, a hard
/// link, a bind mount), is refused at once with both names: it used to
/// wait 30 s for its own lock, then fail.
#[test]
fn a_member_named_twice_or_by_two_paths_is_refused_at_once() {
    if !fuse_available() {
        return;
    }
    let setup = Setup::new();
    setup.mount_dir("mnt");
    std::os::unix::fs::symlink("m0", setup.path("sym")).unwrap();
    fs::hard_link(setup.path("m0"), setup.path("hard")).unwrap();
    fs::write(setup.path("bound"), b"").unwrap();
    let bound = std::process::Command::new("mount")
        .arg("--bind")
        .arg(setup.path("m0"))
        .arg(setup.path("bound"))
        .status()
        .expect("run mount --bind");
    assert!(bound.success(), "mount --bind m0 bound");
    let _bind = BindGuard(setup.path("bound"));
    // Each case: the members given, and the two names the refusal gives
    // (as given, or made absolute by mount).
    let cases = [
        (["m0", "m1", "m0"], "m0", "m0"),
        (["m0", "m1", "sym"], "m0", "sym"),
        (["hard", "m1", "m0"], "hard", "m0"),
        (["m0", "bound", "m1"], "m0", "bound"),
    ];
    let refused = |out: &Output, first: &str, second: &str| {
        let text = stderr(out);
        let said = if first == second {
            text.contains(&format!("{first} is named twice"))
        } else {
            text.contains(&format!("{first} and "))
                && text.contains(&format!("{second} are the same file"))
        };
        !out.status.success() && said
    };
    for (members, first, second) in cases {
        let started = std::time::Instant::now();
        let mut args = vec!["mount"];
        args.extend(members);
        args.push("mnt");
        let out = raidfs(&args, setup.dir.path());
        let took = started.elapsed();
        eprintln!("{members:?}: refused in {:.3} s", took.as_secs_f64());
        assert!(
            refused(&out, first, second),
            "{members:?}: {}",
            stderr(&out)
        );
        // The lock wait it replaces is 30 s; this bound only tells the two apart.
        assert!(took < Duration::from_secs(10), "{members:?} took {took:?}");
        assert!(!is_mounted(&setup.path("mnt").canonicalize().unwrap()));
        let mut args = vec!["fsck"];
        args.extend(members);
        let out = raidfs(&args, setup.dir.path());
        assert!(
            refused(&out, first, second),
            "fsck {members:?}: {}",
            stderr(&out)
        );
    }
    // The members themselves were left as they were.
    assert!(
        ok(&setup.mount("mnt")),
        "the array mounts with each member once"
    );
    assert!(ok(&setup.umount("mnt")));
}

#[test]
fn bad_invocations_are_refused_clearly() {
    if !fuse_available() {
        return;
    }
    let setup = Setup::new();
    setup.mount_dir("mnt");
    let out = raidfs(
        &["mount", "-o", "ro,frobnicate", "m0", "m1", "m2", "mnt"],
        setup.dir.path(),
    );
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("unknown mount option 'frobnicate'"),
        "{}",
        stderr(&out)
    );

    fs::write(setup.path("file"), b"").unwrap();
    let out = raidfs(&["mount", "m0", "m1", "m2", "file"], setup.dir.path());
    assert!(!out.status.success());
    assert!(stderr(&out).contains("not a directory"), "{}", stderr(&out));

    let out = raidfs(&["mount", "m0", "m1", "m2", "absent"], setup.dir.path());
    assert!(!out.status.success());
    assert!(stderr(&out).contains("absent"), "{}", stderr(&out));

    let out = raidfs(&["umount", "mnt"], setup.dir.path());
    assert!(!out.status.success());
    assert!(stderr(&out).contains("not mounted"), "{}", stderr(&out));
}

#[test]
fn sigterm_unmounts_and_closes_cleanly() {
    if !fuse_available() {
        return;
    }
    let setup = Setup::new();
    let mnt = setup.mount_dir("mnt");
    let _guard = DaemonGuard::new(&mnt);
    assert!(ok(&setup.mount("mnt")));
    fs::write(mnt.join("x"), b"x").unwrap();
    let record = registry::read(&mnt).unwrap().expect("daemon record");
    // SAFETY: the pid is the daemon this test started.
    assert_eq!(unsafe { libc::kill(record.pid as i32, libc::SIGTERM) }, 0);
    assert!(record.wait_for_exit(Duration::from_secs(30)));
    assert!(!is_mounted(&mnt));
    assert_eq!(setup.member_state(), "clean");
}

#[test]
fn plain_umount_closes_cleanly() {
    if !fuse_available() {
        return;
    }
    let setup = Setup::new();
    let mnt = setup.mount_dir("mnt");
    let _guard = DaemonGuard::new(&mnt);
    assert!(ok(&setup.mount("mnt")));
    fs::write(mnt.join("x"), b"x").unwrap();
    let record = registry::read(&mnt).unwrap().expect("daemon record");
    // umount(2) as umount(8) does it; a sibling test's child process may
    // briefly hold a copy of a descriptor on this mount, hence the grace.
    mounts::unmount_with_grace(&mnt, false).expect("umount(2)");
    assert!(record.wait_for_exit(Duration::from_secs(30)));
    assert!(
        registry::read(&mnt).unwrap().is_none(),
        "the daemon did not finish cleanly"
    );
    assert_eq!(setup.member_state(), "clean");
}

#[test]
fn auto_unmount_clears_the_mount_of_a_killed_daemon() {
    if !fuse_available() {
        return;
    }
    let setup = Setup::new();
    let mnt = setup.mount_dir("mnt");
    let _guard = DaemonGuard::new(&mnt);
    let out = raidfs(
        &["mount", "-o", "auto_unmount", "m0", "m1", "m2", "mnt"],
        setup.dir.path(),
    );
    assert!(ok(&out));
    let record = kill_daemon(&mnt, Duration::from_secs(10));
    // The watcher detaches the dead mount, then exits.
    let watcher_pid = record.watcher.expect("watcher recorded");
    let watcher = registry::DaemonRecord {
        pid: watcher_pid,
        start_time: registry::process_start_time(watcher_pid).unwrap_or(0),
        ..record.clone()
    };
    assert!(watcher.wait_for_exit(Duration::from_secs(10)));
    assert!(!is_mounted(&mnt), "the dead mount was not cleared");
}

#[test]
fn an_older_format_mounts_and_is_upgraded_in_place() {
    if !fuse_available() {
        return;
    }
    let setup = Setup::created_with(&["--fs-format", "3"]);
    let upgrade = |args: &[&str]| {
        let mut all = vec!["upgrade"];
        all.extend_from_slice(args);
        all.extend_from_slice(&["m0", "m1", "m2"]);
        raidfs(&all, setup.dir.path())
    };
    let stdout = |out: &Output| String::from_utf8_lossy(&out.stdout).into_owned();
    // The command succeeded and printed `text`.
    let says = |out: &Output, text: &str| {
        assert!(ok(out));
        assert!(stdout(out).contains(text), "{}", stdout(out));
    };
    let mnt = setup.mount_dir("mnt");
    let _guard = DaemonGuard::new(&mnt);
    assert!(ok(&setup.mount("mnt")));
    let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    fs::write(mnt.join("kept.bin"), &data).unwrap();
    let log = fs::read_to_string(setup.path("daemon.log")).unwrap();
    assert!(log.contains("filesystem format 3;"), "{log}");

    let refused = upgrade(&[]);
    assert!(!refused.status.success());
    assert!(stderr(&refused).contains("in use"), "{}", stderr(&refused));
    assert!(ok(&setup.umount("mnt")));
    let fsck = raidfs(&["fsck", "m0", "m1", "m2"], setup.dir.path());
    says(&fsck, "note: filesystem format 3;");

    for _ in 0..2 {
        // --check changes nothing: the second one still finds format 3.
        let check = upgrade(&["--check"]);
        says(&check, "filesystem format 3;");
        says(&check, "one flush");
    }
    let newest = raidfs::fs::FORMAT_VERSION;
    says(&upgrade(&[]), &format!("from format 3 to format {newest}"));
    says(&upgrade(&[]), &format!("format {newest} is current"));

    let fsck = raidfs(&["fsck", "m0", "m1", "m2"], setup.dir.path());
    assert!(ok(&fsck), "{}", stdout(&fsck));
    assert!(
        !stdout(&fsck).contains("filesystem format"),
        "{}",
        stdout(&fsck)
    );
    let before = fs::read_to_string(setup.path("daemon.log")).unwrap().len();
    assert!(ok(&setup.mount("mnt")));
    assert_eq!(fs::read(mnt.join("kept.bin")).unwrap(), data);
    assert!(ok(&setup.umount("mnt")));
    let log = fs::read_to_string(setup.path("daemon.log")).unwrap();
    assert!(
        !log[before..].contains("filesystem format"),
        "{}",
        &log[before..]
    );
    assert_eq!(setup.member_state(), "clean");
}

/// A daemon keeps none of the descriptors of the process that ran `raidfs
/// mount`: a file open on another mount at that moment must not keep that
/// mount busy once its owner closes it.
#[test]
fn a_file_open_when_mounting_does_not_pin_another_mount() {
    use std::os::fd::AsRawFd;
    use std::os::unix::process::CommandExt;
    if !fuse_available() {
        return;
    }
    let first = Setup::new();
    let first_mnt = first.mount_dir("mnt");
    let _first_guard = DaemonGuard::new(&first_mnt);
    assert!(ok(&first.mount("mnt")));
    let held = fs::File::create(first_mnt.join("held")).unwrap();
    let fd = held.as_raw_fd();

    let second = Setup::new();
    let second_mnt = second.mount_dir("mnt");
    let _second_guard = DaemonGuard::new(&second_mnt);
    let mut mount = std::process::Command::new(env!("CARGO_BIN_EXE_raidfs"));
    mount
        .args(["mount", "-o"])
        .arg(format!("log={}", second.path("daemon.log").display()))
        .args(["m0", "m1", "m2", "mnt"])
        .current_dir(second.dir.path());
    // SAFETY: fcntl on a descriptor number, in the child between fork and
    // exec; only this child inherits the file, as a shell's would.
    unsafe {
        mount.pre_exec(move || {
            if libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    assert!(ok(&mount.output().unwrap()));
    let daemon = daemon_pid(&second_mnt).expect("the second daemon is recorded");
    let held_path = first_mnt.join("held");
    let pinned: Vec<PathBuf> = fs::read_dir(format!("/proc/{daemon}/fd"))
        .unwrap()
        .filter_map(|e| fs::read_link(e.ok()?.path()).ok())
        .filter(|target| target == &held_path)
        .collect();
    assert!(pinned.is_empty(), "the daemon holds {pinned:?}");

    drop(held);
    // A plain (not lazy) unmount: busy if anything still holds the file.
    assert!(ok(&first.umount("mnt")));
    assert!(!is_mounted(&first_mnt));
    assert!(ok(&second.umount("mnt")));
}
