//! Space through real mounts over real sparse image files: deleting a file
//! gives its blocks back to the host (the images' allocated size shrinks),
//! a write of the size just freed by `rm` succeeds at once, and `df -i`
//! shows figures that follow the files made.

mod common;

use common::cli::{raidfs_ok, stderr};
use common::{fuse_available, pattern, write_synced, DaemonGuard};
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Bytes the host has allocated to `images`.
fn allocated(images: &[PathBuf]) -> u64 {
    images
        .iter()
        .map(|p| fs::metadata(p).expect("image metadata").blocks() * 512)
        .sum()
}

struct Array {
    _guard: DaemonGuard,
    dir: tempfile::TempDir,
    images: Vec<PathBuf>,
}

impl Array {
    fn mnt(&self) -> PathBuf {
        self.dir.path().join("mnt")
    }

    fn umount(self) {
        raidfs_ok(
            &["umount", &self.mnt().display().to_string()],
            self.dir.path(),
        );
    }
}

fn mounted(level: &str, members: usize, size: &str) -> Array {
    let dir = tempfile::tempdir().expect("tempdir");
    fs::create_dir(dir.path().join("mnt")).expect("mkdir mnt");
    let images: Vec<PathBuf> = (0..members)
        .map(|i| dir.path().join(format!("m{i}.img")))
        .collect();
    let mut create: Vec<String> = ["create", "--level", level, "--size", size]
        .map(String::from)
        .to_vec();
    create.extend(images.iter().map(|p| p.display().to_string()));
    raidfs_ok(&create, dir.path());
    let mnt = dir.path().join("mnt");
    let log = format!("log={}", dir.path().join("daemon.log").display());
    let mut mount = vec!["mount".to_string(), "-o".into(), log];
    mount.extend(images.iter().map(|p| p.display().to_string()));
    mount.push(mnt.display().to_string());
    raidfs_ok(&mount, dir.path());
    Array {
        _guard: DaemonGuard::new(&mnt),
        dir,
        images,
    }
}

fn statvfs(path: &Path) -> libc::statvfs {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).expect("path");
    // SAFETY: zeroed is a valid statvfs; the pointers live across the call.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::statvfs(c.as_ptr(), &mut st) };
    assert_eq!(rc, 0, "statvfs {}", path.display());
    st
}

#[test]
fn deleting_a_large_file_shrinks_the_sparse_images() {
    if !fuse_available() {
        return;
    }
    // (level, members, bytes the members hold per byte of data)
    for (level, members, per_byte) in [("5", 3, 1.5f64), ("1", 2, 2.0), ("6", 4, 2.0)] {
        let array = mounted(level, members, "256M");
        let mnt = array.mnt();
        let keep = pattern(1, 4 << 20);
        write_synced(&mnt.join("keep"), &keep).expect("write keep");
        let big = 64usize << 20;
        write_synced(&mnt.join("big"), &pattern(2, big)).expect("write big");
        let full = allocated(&array.images);
        fs::remove_file(mnt.join("big")).expect("rm big");
        raidfs_ok(&["sync", &mnt.display().to_string()], array.dir.path());
        let after = allocated(&array.images);
        let given_back = full.saturating_sub(after);
        let expected = (big as f64 * per_byte) as u64;
        assert!(
            given_back >= expected * 9 / 10,
            "RAID{level}: images went from {full} to {after} bytes after deleting {big} bytes"
        );
        assert_eq!(fs::read(mnt.join("keep")).expect("read keep"), keep);
        // The space given back is used again and reads back right.
        let again = pattern(3, 32 << 20);
        write_synced(&mnt.join("again"), &again).expect("write again");
        assert_eq!(fs::read(mnt.join("again")).expect("read again"), again);
        array.umount();
    }
}

#[test]
fn rm_then_an_immediate_write_of_the_freed_size_succeeds() {
    if !fuse_available() {
        return;
    }
    let array = mounted("5", 3, "96M");
    let mnt = array.mnt();
    let st = statvfs(&mnt);
    let avail = st.f_bavail * st.f_frsize;
    // Most of the free space, in whole MiB, so the second write needs the
    // blocks the first one frees.
    let size = ((avail * 8 / 10) >> 20 << 20) as usize;
    assert!(size >= 64 << 20, "array of {avail} bytes free");
    let first = pattern(4, size);
    write_synced(&mnt.join("first"), &first).expect("write first");
    fs::remove_file(mnt.join("first")).expect("rm first");
    let second = pattern(5, size);
    let written = write_synced(&mnt.join("second"), &second);
    assert!(
        written.is_ok(),
        "writing {size} bytes right after deleting as many: {written:?}; log: {}",
        fs::read_to_string(array.dir.path().join("daemon.log")).unwrap_or_default()
    );
    assert_eq!(fs::read(mnt.join("second")).expect("read second"), second);
    array.umount();
}

#[test]
fn df_i_shows_inode_figures_that_follow_the_files() {
    if !fuse_available() {
        return;
    }
    let array = mounted("1", 2, "64M");
    let mnt = array.mnt();
    let before = statvfs(&mnt);
    assert!(
        before.f_files < u32::MAX as u64 && before.f_files > before.f_ffree,
        "files {} free {}",
        before.f_files,
        before.f_ffree
    );
    for i in 0..20 {
        fs::write(mnt.join(format!("f{i}")), b"x").expect("create");
    }
    let after = statvfs(&mnt);
    assert_eq!(
        (after.f_files - after.f_ffree) - (before.f_files - before.f_ffree),
        20,
        "used inodes go up by the files made"
    );
    let out = std::process::Command::new("df")
        .arg("-i")
        .arg(&mnt)
        .output()
        .expect("df -i");
    assert!(out.status.success(), "df -i: {}", stderr(&out));
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("4294967295"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    array.umount();
}
