//! Set-ID bits after a change of contents, by the kernel's rule
//! (`setattr_should_drop_suidgid`), which the FUSE kernel leaves to the
//! filesystem: someone without CAP_FSETID who writes or fallocates takes
//! set-user-ID always, and set-group-ID when the file is group-executable
//! or they are not in its group; root takes nothing (fstests generic/683,
//! 684 and 673).

mod common;

use std::ffi::OsStr;

use raidfs::fs::*;

fn fresh() -> FileSystem {
    common::fs::fresh(3).1
}

fn user(uid: u32, gid: u32) -> Caller {
    Caller {
        uid,
        gid,
        groups: vec![gid],
    }
}

/// A file of mode `mode` owned by root:`gid`, with 192 KiB of data.
fn file(fs: &FileSystem, name: &str, mode: u32, gid: u32) -> u64 {
    let ino = fs
        .mknod(&Caller::root(), ROOT_INO, OsStr::new(name), 0o100644, 0, 0)
        .expect("mknod")
        .ino;
    fs.write(ino, 0, &vec![0x58u8; 192 << 10]).expect("write");
    fs.setattr(
        &Caller::root(),
        ino,
        &SetAttr {
            mode: Some(mode),
            gid: Some(gid),
            ..SetAttr::default()
        },
    )
    .expect("chmod");
    ino
}

fn mode(fs: &FileSystem, ino: u64) -> u32 {
    u32::from(fs.getattr(ino).expect("getattr").perm) & 0o7777
}

#[test]
fn fallocate_and_write_take_set_id_bits_as_the_kernel_would() {
    let fs = fresh();
    let outsider = user(65534, 65534);
    let member = user(1000, 1000);
    let alloc = FallocateMode::default();
    // (mode, file's group, who, expected mode after)
    let cases = [
        (0o6666, 0, &outsider, 0o0666),
        (0o6676, 0, &outsider, 0o0676),
        (0o6766, 0, &outsider, 0o0766),
        // In the file's group, set-group-ID without group execute stays.
        (0o6666, 1000, &member, 0o2666),
        (0o6676, 1000, &member, 0o0676),
    ];
    for (i, &(before, gid, who, after)) in cases.iter().enumerate() {
        let f = file(&fs, &format!("falloc{i}"), before, gid);
        let changed = fs
            .fallocate_as(who, f, 64 << 10, 64 << 10, alloc)
            .expect("fallocate");
        assert_eq!(
            mode(&fs, f),
            after,
            "fallocate of {before:o} by {}",
            who.uid
        );
        assert_eq!(changed, before != after);

        let w = file(&fs, &format!("write{i}"), before, gid);
        let (_, changed) = fs.write_clearing_setid(who, w, 0, b"new").expect("write");
        assert_eq!(mode(&fs, w), after, "write of {before:o} by {}", who.uid);
        assert_eq!(changed, before != after);
    }
    // Root keeps them.
    let f = file(&fs, "root", 0o6777, 0);
    assert!(!fs
        .fallocate_as(&Caller::root(), f, 0, 4096, alloc)
        .expect("fallocate"));
    assert_eq!(mode(&fs, f), 0o6777);
}
