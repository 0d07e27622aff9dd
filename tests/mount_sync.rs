//! `raidfs sync` and `-o commit=SECS` on real mounts over image files: a
//! sync makes writes that were never fsync'd survive a killed daemon, even
//! with an hour between periodic commits, as `sync FILE` does for FILE,
//! while sync(1) and `sync -f` do not reach the daemon at all; a commit the
//! full host refuses is reported; bad `commit=` values and non-raidfs
//! directories are refused with a clear message.

mod common;

use std::ffi::OsStr;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use common::cli::{raidfs, raidfs_ok, stderr, stdout, Mirror};
use common::{fuse_available, kill_daemon, pattern, DaemonGuard};

/// The mirror the tests mount (`Array::create()`).
type Array = Mirror;

impl Mirror {
    fn mount(&self, options: &str) -> DaemonGuard {
        let out = self.mount_with(options);
        assert!(
            out.status.success(),
            "mount -o {options} failed\nstdout: {}\nstderr: {}",
            stdout(&out),
            stderr(&out)
        );
        DaemonGuard::new(&self.mnt)
    }

    fn sync(&self) -> Output {
        raidfs(&[OsStr::new("sync"), self.mnt.as_os_str()], self.dir.path())
    }

    /// SIGKILL the daemon and wait until it is gone: nothing it held in
    /// memory reaches the members.
    fn kill_daemon(&self) {
        kill_daemon(&self.mnt, Duration::from_secs(30));
    }
}

/// Write `data` to a new file without fsync: it is in the daemon's
/// uncommitted journal batch, nowhere durable.
fn write_unsynced(path: &Path, data: &[u8]) {
    let mut f = std::fs::File::create(path).expect("create");
    f.write_all(data).expect("write");
}

#[test]
fn raidfs_sync_makes_unsynced_writes_survive_a_killed_daemon_and_sync1_does_not() {
    if !fuse_available() {
        return;
    }
    let array = Array::create();
    // An hour between periodic commits: only `raidfs sync` can commit here.
    let guard = array.mount("commit=3600");
    assert!(
        array
            .log()
            .contains("the journal is committed every 3600 s"),
        "{}",
        array.log()
    );

    let kept = pattern(1, 3 << 20);
    write_unsynced(&array.mnt.join("kept"), &kept);
    std::fs::create_dir(array.mnt.join("dir")).expect("mkdir");
    let out = array.sync();
    assert!(out.status.success(), "raidfs sync: {}", stderr(&out));
    assert!(
        stdout(&out).contains("journal committed and every member flushed"),
        "{}",
        stdout(&out)
    );

    // `sync FILE` is fsync(FILE), which commits.
    let by_file = pattern(3, 1 << 20);
    write_unsynced(&array.mnt.join("by_file"), &by_file);
    let sync_file = Command::new("sync")
        .arg(array.mnt.join("by_file"))
        .output()
        .expect("run sync FILE");
    assert!(sync_file.status.success());

    // sync(1) and syncfs(2) stop at the kernel: FUSE sends a /dev/fuse
    // filesystem no syncfs request, so this is lost like any other
    // uncommitted write.
    write_unsynced(&array.mnt.join("lost"), &pattern(2, 1 << 20));
    let sync1 = Command::new("sync").output().expect("run sync");
    assert!(sync1.status.success());
    let syncfs = Command::new("sync")
        .arg("-f")
        .arg(&array.mnt)
        .output()
        .expect("run sync -f");
    assert!(
        syncfs.status.success(),
        "{}",
        String::from_utf8_lossy(&syncfs.stderr)
    );

    array.kill_daemon();
    let out = array.sync();
    assert!(
        !out.status.success(),
        "raidfs sync answered by a dead daemon"
    );
    assert!(
        stderr(&out).contains("the daemon is not running"),
        "{}",
        stderr(&out)
    );
    drop(guard);
    let guard = array.mount("commit=3600");
    assert_eq!(std::fs::read(array.mnt.join("kept")).expect("kept"), kept);
    assert!(array.mnt.join("dir").is_dir());
    assert_eq!(
        std::fs::read(array.mnt.join("by_file")).expect("by_file"),
        by_file
    );
    assert!(
        !array.mnt.join("lost").exists(),
        "a file written after the last commit survived: sync(1) reached the daemon after all"
    );
    array.umount();
    drop(guard);
}

#[test]
fn sync_on_a_read_only_mount_has_nothing_to_commit_and_succeeds() {
    if !fuse_available() {
        return;
    }
    let array = Array::create();
    let guard = array.mount("ro");
    let out = array.sync();
    assert!(out.status.success(), "raidfs sync on ro: {}", stderr(&out));
    array.umount();
    drop(guard);
}

#[test]
fn bad_commit_intervals_are_refused_before_mounting() {
    if !fuse_available() {
        return;
    }
    let array = Array::create();
    for bad in ["commit=0", "commit=abc", "commit=3601"] {
        let out = array.mount_with(bad);
        assert!(!out.status.success(), "mount -o {bad} was accepted");
        let value = bad.trim_start_matches("commit=");
        let expected =
            format!("commit={value}: expected seconds between journal commits, from 1 to 3600");
        assert!(stderr(&out).contains(&expected), "{}", stderr(&out));
        assert!(
            raidfs::cli::mount::daemon_pid(&array.mnt).is_none(),
            "a daemon started for {bad}"
        );
    }
}

#[test]
fn sync_of_a_directory_that_is_not_a_raidfs_mount_fails_clearly() {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = raidfs(&[OsStr::new("sync"), dir.path().as_os_str()], dir.path());
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("raidfs: error:") && err.contains("is not mounted"),
        "{err}"
    );
    let out = raidfs(&["sync", "/proc"], dir.path());
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("/proc is not a raidfs mount (it is proc)"),
        "{err}"
    );
}

#[test]
fn sync_reports_a_commit_the_full_host_refuses() {
    if !fuse_available() {
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let host = dir.path().join("host");
    std::fs::create_dir(&host).expect("mkdir host");
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).expect("mkdir mnt");
    let tmpfs = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=48m", "tmpfs"])
        .arg(&host)
        .output()
        .expect("run mount");
    assert!(
        tmpfs.status.success(),
        "{}",
        String::from_utf8_lossy(&tmpfs.stderr)
    );
    let _host = HostMount(host.clone());
    let members: Vec<String> = ["m0", "m1"]
        .iter()
        .map(|m| host.join(m).display().to_string())
        .collect();
    let mut create = vec!["create", "-l", "1", "-s", "64M"];
    create.extend(members.iter().map(String::as_str));
    raidfs_ok(&create, dir.path());
    let log = format!(
        "log={},commit=3600",
        dir.path().join("daemon.log").display()
    );
    let mut mount = vec!["mount", "-o", &log];
    mount.extend(members.iter().map(String::as_str));
    let mnt_arg = mnt.display().to_string();
    mount.push(&mnt_arg);
    raidfs_ok(&mount, dir.path());
    let guard = DaemonGuard::new(&mnt);

    // Two 64 MiB sparse mirrors cannot grow on 48 MiB: the writes fill the
    // host and the commit that would reference them finds no room.
    let filled = (|| -> std::io::Result<()> {
        let mut f = std::fs::File::create(mnt.join("fill"))?;
        let chunk = pattern(4, 1 << 20);
        for _ in 0..64 {
            f.write_all(&chunk)?;
        }
        Ok(())
    })();
    let err = filled.expect_err("the host filled up");
    assert_eq!(err.raw_os_error(), Some(libc::ENOSPC), "{err}");
    let out = raidfs(&[OsStr::new("sync"), mnt.as_os_str()], dir.path());
    assert!(
        !out.status.success(),
        "raidfs sync succeeded on a full host"
    );
    let err = stderr(&out);
    assert!(
        err.contains("raidfs: error: commit and flush failed:")
            && err.contains("No space left on device"),
        "{err}"
    );
    drop(guard);
}

/// A host filesystem mounted for one test; lazily unmounted on drop.
struct HostMount(PathBuf);

impl Drop for HostMount {
    fn drop(&mut self) {
        common::detach(&self.0);
    }
}
