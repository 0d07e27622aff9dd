//! Members the host will not let raidfs write: an immutable image
//! (`chattr +i`, EPERM on open for writing even for root) and a read-only
//! one (mode 0444, EACCES for anyone but root). Reading them must still
//! work (`mount -o ro`, `fsck`), and a read-write mount starts degraded
//! without them, saying why.

mod common;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::cli::{detail_json, raidfs, stderr, stdout};
use common::{fuse_available, DaemonGuard};

/// Sets the immutable attribute on a file and always clears it again, so
/// the temporary directory can be removed whatever the test did.
struct Immutable(PathBuf);

impl Immutable {
    /// None (with the reason printed) where the filesystem has no such attribute.
    fn set(path: &Path) -> Option<Immutable> {
        let out = Command::new("chattr").arg("+i").arg(path).output();
        match out {
            Ok(o) if o.status.success() => Some(Immutable(path.to_path_buf())),
            Ok(o) => {
                eprintln!("skipping: chattr +i failed here: {}", stderr(&o));
                None
            }
            Err(e) => {
                eprintln!("skipping: cannot run chattr: {e}");
                None
            }
        }
    }
}

impl Drop for Immutable {
    fn drop(&mut self) {
        let _ = Command::new("chattr").arg("-i").arg(&self.0).output();
    }
}

/// A RAID1 array of two images holding `kept.txt`, unmounted.
fn array_with_a_file() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let out = raidfs(&["create", "-l", "1", "-s", "64M", "a.img", "b.img"], d);
    assert!(out.status.success(), "create: {}", stderr(&out));
    let mnt = d.join("mnt");
    fs::create_dir(&mnt).expect("mount point");
    let mnt = mnt.canonicalize().expect("canonical");
    let _guard = DaemonGuard::new(&mnt);
    let out = mount(d, &[]);
    assert!(out.status.success(), "mount: {}", stderr(&out));
    fs::write(mnt.join("kept.txt"), b"written before").expect("write");
    let out = raidfs(&["umount", "mnt"], d);
    assert!(out.status.success(), "umount: {}", stderr(&out));
    (dir, mnt)
}

fn mount(dir: &Path, options: &[&str]) -> Output {
    let log = format!("log={}", dir.join("daemon.log").display());
    let mut args = vec!["mount", "-o", &log];
    args.extend_from_slice(options);
    args.extend_from_slice(&["a.img", "b.img", "mnt"]);
    raidfs(&args, dir)
}

#[test]
fn an_immutable_member_is_read_and_left_out_of_a_read_write_mount() {
    if !fuse_available() {
        return;
    }
    let (dir, mnt) = array_with_a_file();
    let d = dir.path();
    let Some(_b) = Immutable::set(&d.join("b.img")) else {
        return;
    };
    let _guard = DaemonGuard::new(&mnt);

    let out = mount(d, &["-o", "ro"]);
    assert!(out.status.success(), "mount -o ro: {}", stderr(&out));
    assert_eq!(
        fs::read(mnt.join("kept.txt")).ok().as_deref(),
        Some(&b"written before"[..])
    );
    assert!(!detail_json(&mnt)["degraded"].as_bool().unwrap_or(true));
    let out = raidfs(&["umount", "mnt"], d);
    assert!(out.status.success(), "umount: {}", stderr(&out));

    let out = raidfs(&["fsck", "a.img", "b.img"], d);
    assert!(
        out.status.success(),
        "fsck: {}{}",
        stdout(&out),
        stderr(&out)
    );
    assert!(stdout(&out).contains("clean"), "{}", stdout(&out));

    let out = mount(d, &[]);
    assert!(out.status.success(), "read-write mount: {}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("b.img cannot be opened read-write (Operation not permitted); left out, the array starts degraded"),
        "{err}"
    );
    let report = detail_json(&mnt);
    assert_eq!(report["degraded"], true, "{report:#}");
    assert_eq!(report["members"][1]["state"], "missing", "{report:#}");
    assert_eq!(
        fs::read(mnt.join("kept.txt")).ok().as_deref(),
        Some(&b"written before"[..])
    );
    fs::write(mnt.join("new.txt"), b"degraded write").expect("write degraded");
    let out = raidfs(&["umount", "mnt"], d);
    assert!(out.status.success(), "umount: {}", stderr(&out));

    // Both immutable: nothing can start read-write, and the error says which and why.
    let Some(_a) = Immutable::set(&d.join("a.img")) else {
        return;
    };
    let out = mount(d, &[]);
    assert!(
        !out.status.success(),
        "mounted read-write with no writable member"
    );
    let err = stderr(&out);
    assert!(
        err.contains("a.img (Operation not permitted)")
            && err.contains("b.img (Operation not permitted)"),
        "{err}"
    );
    let out = mount(d, &["-o", "ro"]);
    assert!(out.status.success(), "mount -o ro: {}", stderr(&out));
    assert_eq!(
        fs::read(mnt.join("new.txt")).ok().as_deref(),
        Some(&b"degraded write"[..])
    );
    let out = raidfs(&["umount", "mnt"], d);
    assert!(out.status.success(), "umount: {}", stderr(&out));
}

/// Too few writable members for the level: the error names the ones left out.
#[test]
fn too_few_writable_members_are_named() {
    if !fuse_available() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let out = raidfs(&["create", "-l", "0", "-s", "64M", "a.img", "b.img"], d);
    assert!(out.status.success(), "create: {}", stderr(&out));
    fs::create_dir(d.join("mnt")).expect("mount point");
    let _guard = DaemonGuard::new(&d.join("mnt").canonicalize().expect("canonical"));
    let Some(_b) = Immutable::set(&d.join("b.img")) else {
        return;
    };
    let out = mount(d, &[]);
    assert!(!out.status.success(), "RAID0 started without a member");
    let err = stderr(&out);
    assert!(err.contains("too few members to start"), "{err}");
    assert!(
        err.contains("left out because they cannot be opened read-write")
            && err.contains("b.img (Operation not permitted)"),
        "{err}"
    );
}

/// Mode 0444 stops only users other than root, so fsck and examine run as
/// nobody: they open the members read-only and succeed.
#[test]
fn read_only_files_can_be_checked_by_a_user_who_cannot_write_them() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let out = raidfs(&["create", "-l", "1", "-s", "64M", "a.img", "b.img"], d);
    assert!(out.status.success(), "create: {}", stderr(&out));
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipping: running the check as another user needs root");
        return;
    }
    fs::set_permissions(d, fs::Permissions::from_mode(0o755)).expect("chmod dir");
    for m in ["a.img", "b.img"] {
        fs::set_permissions(d.join(m), fs::Permissions::from_mode(0o444)).expect("chmod 444");
    }
    let as_nobody = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_raidfs"))
            .args(args)
            .current_dir(d)
            .uid(65534)
            .gid(65534)
            .output()
            .expect("run raidfs as nobody")
    };
    let out = as_nobody(&["examine", "a.img"]);
    assert!(out.status.success(), "examine as nobody: {}", stderr(&out));
    let out = as_nobody(&["fsck", "a.img", "b.img"]);
    assert!(
        out.status.success(),
        "fsck as nobody: {}{}",
        stdout(&out),
        stderr(&out)
    );
    assert!(stdout(&out).contains("clean"), "{}", stdout(&out));
    // Repairing needs to write, and says which member it cannot.
    let out = as_nobody(&["fsck", "--repair", "a.img", "b.img"]);
    assert!(
        !out.status.success(),
        "fsck --repair wrote through mode 0444"
    );
    assert!(
        stderr(&out).contains("a.img") && stderr(&out).contains("Permission denied"),
        "{}",
        stderr(&out)
    );
}
