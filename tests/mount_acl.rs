//! Permissions through a real FUSE mount, checked as another user (nobody):
//! `cp -a` keeps modes (the minimal
//! ACL it sets is a mode, not stored data) and ACLs; an access ACL entry
//! grants and denies another user; chmod moves the mask, and a new access
//! ACL's mode shows in `stat` at once; a directory's
//! default ACL is inherited, in place of the umask; an execute-only
//! program runs; ftruncate works through a descriptor opened for writing.

mod common;

use common::{fuse_available, set_xattr};
use std::ffi::CString;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;

const NOBODY: u32 = 65534;
const USER_OBJ: u16 = 0x01;
const USER: u16 = 0x02;
const GROUP_OBJ: u16 = 0x04;
const MASK: u16 = 0x10;
const OTHER: u16 = 0x20;

/// The xattr encoding of an ACL (version 2, then tag, perm, id entries).
fn acl(entries: &[(u16, u16, u32)]) -> Vec<u8> {
    let mut out = 2u32.to_le_bytes().to_vec();
    for &(tag, perm, id) in entries {
        out.extend_from_slice(&tag.to_le_bytes());
        out.extend_from_slice(&perm.to_le_bytes());
        let id = if tag == USER { id } else { u32::MAX };
        out.extend_from_slice(&id.to_le_bytes());
    }
    out
}

fn cstr(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).expect("path")
}

/// The value of `name` on `path`, if it has one.
fn get_xattr(path: &Path, name: &str) -> Option<Vec<u8>> {
    common::get_xattr(path, name).ok()
}

fn mode(path: &Path) -> u32 {
    fs::symlink_metadata(path).expect("stat").mode() & 0o7777
}

/// Whether user nobody can read `path`.
fn nobody_reads(path: &Path) -> bool {
    Command::new("cat")
        .arg(path)
        .uid(NOBODY)
        .gid(NOBODY)
        .output()
        .expect("run cat as nobody")
        .status
        .success()
}

fn mount() -> common::MountGuard {
    common::shared_mount()
}

#[test]
fn cp_a_keeps_modes_and_acls() {
    if !fuse_available() {
        return;
    }
    let mnt = mount();
    let src = mnt.join("src");
    fs::create_dir(&src).unwrap();
    fs::create_dir(src.join("dir")).unwrap();
    fs::set_permissions(src.join("dir"), fs::Permissions::from_mode(0o750)).unwrap();
    for (name, m) in [("a", 0o640), ("dir/b", 0o600), ("c", 0o755)] {
        fs::write(src.join(name), name.as_bytes()).unwrap();
        fs::set_permissions(src.join(name), fs::Permissions::from_mode(m)).unwrap();
    }
    let with_acl = acl(&[
        (USER_OBJ, 6, 0),
        (USER, 4, NOBODY),
        (GROUP_OBJ, 4, 0),
        (MASK, 4, 0),
        (OTHER, 0, 0),
    ]);
    set_xattr(&src.join("a"), "system.posix_acl_access", &with_acl).expect("set ACL");
    let out = Command::new("cp")
        .args(["-a"])
        .arg(&src)
        .arg(mnt.join("dst"))
        .output()
        .expect("cp -a");
    assert!(
        out.status.success(),
        "cp -a: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    for name in ["", "dir", "a", "dir/b", "c"] {
        let (s, d) = (src.join(name), mnt.join("dst").join(name));
        assert_eq!(mode(&d), mode(&s), "mode of {name:?}");
        assert_eq!(
            get_xattr(&d, "system.posix_acl_access"),
            get_xattr(&s, "system.posix_acl_access"),
            "ACL of {name:?}"
        );
        if s.is_file() {
            assert_eq!(fs::read(&d).unwrap(), fs::read(&s).unwrap());
        }
    }
    assert_eq!(mode(&mnt.join("dst/dir")), 0o750);
    assert_eq!(mode(&mnt.join("dst/a")), 0o640);
    assert!(get_xattr(&mnt.join("dst/a"), "system.posix_acl_access").is_some());
}

#[test]
fn an_acl_entry_grants_and_denies_another_user() {
    if !fuse_available() {
        return;
    }
    let mnt = mount();
    let granted = mnt.join("granted");
    fs::write(&granted, b"yes").unwrap();
    fs::set_permissions(&granted, fs::Permissions::from_mode(0o600)).unwrap();
    assert!(!nobody_reads(&granted), "mode 0600 keeps nobody out");
    set_xattr(
        &granted,
        "system.posix_acl_access",
        &acl(&[
            (USER_OBJ, 6, 0),
            (USER, 4, NOBODY),
            (GROUP_OBJ, 0, 0),
            (MASK, 4, 0),
            (OTHER, 0, 0),
        ]),
    )
    .expect("grant");
    assert_eq!(mode(&granted), 0o640, "the group bits show the mask");
    assert!(nobody_reads(&granted), "u:nobody:r grants");
    // chmod g-r moves the mask: the named entry no longer counts.
    fs::set_permissions(&granted, fs::Permissions::from_mode(0o600)).unwrap();
    assert!(!nobody_reads(&granted), "a mask of --- limits the entry");

    let denied = mnt.join("denied");
    fs::write(&denied, b"no").unwrap();
    fs::set_permissions(&denied, fs::Permissions::from_mode(0o644)).unwrap();
    assert!(nobody_reads(&denied), "mode 0644 lets others read");
    set_xattr(
        &denied,
        "system.posix_acl_access",
        &acl(&[
            (USER_OBJ, 6, 0),
            (USER, 0, NOBODY),
            (GROUP_OBJ, 4, 0),
            (MASK, 4, 0),
            (OTHER, 4, 0),
        ]),
    )
    .expect("deny");
    assert!(!nobody_reads(&denied), "u:nobody:--- denies");
    // A malformed ACL is refused.
    let err = set_xattr(&denied, "system.posix_acl_access", &[2, 0, 0, 0, 1]).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EINVAL));
}

#[test]
fn a_default_acl_is_inherited_in_place_of_the_umask() {
    if !fuse_available() {
        return;
    }
    let mnt = mount();
    let dir = mnt.join("shared");
    fs::create_dir(&dir).unwrap();
    let default = acl(&[
        (USER_OBJ, 7, 0),
        (USER, 6, NOBODY),
        (GROUP_OBJ, 5, 0),
        (MASK, 7, 0),
        (OTHER, 0, 0),
    ]);
    set_xattr(&dir, "system.posix_acl_default", &default).expect("default ACL");
    // SAFETY: umask has no preconditions; the test restores it.
    let old = unsafe { libc::umask(0o077) };
    let file = dir.join("new");
    let made = fs::write(&file, b"inherited");
    let sub = dir.join("sub");
    let made_dir = fs::create_dir(&sub);
    // SAFETY: as above.
    unsafe { libc::umask(old) };
    made.unwrap();
    made_dir.unwrap();
    // Created 0666 & the ACL, not & !umask: the mask (group bits) is rw.
    assert_eq!(mode(&file), 0o660, "umask 077 did not apply");
    assert!(get_xattr(&file, "system.posix_acl_access").is_some());
    assert!(nobody_reads(&file), "the inherited u:nobody:rw grants");
    assert_eq!(mode(&sub), 0o770);
    assert!(
        get_xattr(&sub, "system.posix_acl_default").is_some(),
        "directories inherit the default"
    );
    // A default ACL belongs to directories only.
    let err = set_xattr(&file, "system.posix_acl_default", &default).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EACCES));
}

#[test]
fn an_execute_only_program_runs_for_another_user() {
    if !fuse_available() {
        return;
    }
    let mnt = mount();
    let program = mnt.join("true");
    fs::copy("/bin/true", &program).expect("copy /bin/true");
    fs::set_permissions(&program, fs::Permissions::from_mode(0o711)).unwrap();
    assert!(!nobody_reads(&program), "0711 is not readable by others");
    let status = Command::new(&program)
        .uid(NOBODY)
        .gid(NOBODY)
        .status()
        .expect("run the execute-only program as nobody");
    assert!(status.success(), "{status}");
}

/// ftruncate through a descriptor opened for writing works after the file
/// stopped being writable (permission was checked at open, as for write).
#[test]
fn ftruncate_on_a_descriptor_opened_for_writing() {
    if !fuse_available() {
        return;
    }
    let mnt = mount();
    let dir = mnt.join("open");
    fs::create_dir(&dir).unwrap();
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o1777)).unwrap();
    let path = cstr(&dir.join("f"));
    // SAFETY: the child only makes system calls (setgid, setuid, open,
    // fchmod, ftruncate) and _exit, all async-signal-safe after fork.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork");
    if pid == 0 {
        // SAFETY: as above; every pointer is valid.
        unsafe {
            let code = if libc::setgid(NOBODY) != 0 || libc::setuid(NOBODY) != 0 {
                2
            } else {
                let fd = libc::open(path.as_ptr(), libc::O_RDWR | libc::O_CREAT, 0o644);
                if fd < 0 {
                    3
                } else if libc::fchmod(fd, 0o444) != 0 {
                    4
                } else if libc::ftruncate(fd, 4096) != 0 {
                    5
                } else {
                    0
                }
            };
            libc::_exit(code);
        }
    }
    let mut status = 0;
    // SAFETY: waiting for our own child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(libc::WIFEXITED(status), "child status {status}");
    assert_eq!(
        libc::WEXITSTATUS(status),
        0,
        "2 setuid, 3 open, 4 fchmod, 5 ftruncate"
    );
    assert_eq!(fs::metadata(dir.join("f")).unwrap().len(), 4096);
    assert_eq!(mode(&dir.join("f")), 0o444);
}

/// The mode as `stat -c %A` asks for it: statx for the mode alone, which
/// the kernel answers from its attribute cache while that is valid.
fn mode_as_stat_asks(path: &Path) -> u32 {
    let p = cstr(path);
    // SAFETY: statx is plain data, filled by the call.
    let mut buf: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: p is NUL-terminated and buf a valid out pointer.
    let rc = unsafe { libc::statx(libc::AT_FDCWD, p.as_ptr(), 0, libc::STATX_MODE, &mut buf) };
    assert_eq!(rc, 0, "statx: {}", std::io::Error::last_os_error());
    u32::from(buf.stx_mode) & 0o7777
}

/// Setting an access ACL changes the mode, and `stat` shows it at once
/// rather than after the attribute timeout (fstests generic/375).
#[test]
fn a_new_access_acl_shows_in_the_mode_at_once() {
    if !fuse_available() {
        return;
    }
    let mnt = mount();
    let file = mnt.path().join("f");
    fs::write(&file, b"x").unwrap();
    fs::set_permissions(&file, fs::Permissions::from_mode(0o2755)).unwrap();
    assert_eq!(mode_as_stat_asks(&file), 0o2755);
    let all = acl(&[(USER_OBJ, 7, 0), (GROUP_OBJ, 7, 0), (OTHER, 7, 0)]);
    set_xattr(&file, "system.posix_acl_access", &all).unwrap();
    assert_eq!(mode_as_stat_asks(&file), 0o2777);
}
#[test]
fn setting_an_acl_shows_its_mode_at_once_and_takes_sgid_from_outsiders() {
    if !fuse_available() {
        return;
    }
    let mnt = mount();
    for (gid, expected) in [(NOBODY, 0o2777), (NOBODY - 1, 0o0777)] {
        let file = mnt.join(&format!("sgid-{gid}"));
        fs::write(&file, b"x").expect("create");
        std::os::unix::fs::chown(&file, Some(NOBODY), Some(NOBODY)).expect("chown");
        fs::set_permissions(&file, fs::Permissions::from_mode(0o2755)).expect("chmod");
        assert_eq!(mode(&file), 0o2755);
        // The owner sets an ACL that says rwx for all, as setfacl would,
        // while in the file's group or not; stat right after (within the
        // attribute timeout) must show the mode the ACL made.
        let status = Command::new("setfacl")
            .args(["-m", "u::rwx,g::rwx,o::rwx"])
            .arg(&file)
            .uid(NOBODY)
            .gid(gid)
            .status();
        let Ok(status) = status else {
            eprintln!("skipping: setfacl (Debian's acl) is not installed");
            return;
        };
        assert!(status.success(), "setfacl as the owner");
        assert_eq!(mode(&file), expected, "gid {gid}");
    }
}
