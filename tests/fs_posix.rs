//! POSIX behaviour of the filesystem, driven directly (no FUSE).

mod common;

use std::ffi::OsStr;
use std::sync::Arc;

use common::fs::{fresh, n, names};
use parking_lot::Mutex;
use raidfs::fs::teststore::{HookedStore, MemStore};
use raidfs::fs::*;

const MIB: u64 = 1 << 20;

fn root() -> Caller {
    Caller::root()
}

fn user(uid: u32, gid: u32, groups: &[u32]) -> Caller {
    Caller {
        uid,
        gid,
        groups: groups.to_vec(),
    }
}

fn reopen(store: &Arc<MemStore>, fs: FileSystem) -> FileSystem {
    fs.unmount().unwrap();
    FileSystem::open(store.clone(), FsOptions::default()).unwrap()
}

fn mkfile(fs: &FileSystem, parent: u64, name: &str) -> u64 {
    fs.mknod(&root(), parent, n(name), 0o100644, 0, 0)
        .unwrap()
        .ino
}

#[test]
fn write_read_and_persist_across_unmount() {
    let (store, fs) = fresh(4);
    let f = fs
        .create(&root(), ROOT_INO, n("a"), 0o644, 0o022, 0)
        .unwrap();
    assert_eq!(f.perm, 0o644);
    let data: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
    assert_eq!(fs.write(f.ino, 123, &data).unwrap(), data.len());
    let gen = fs.getattr(f.ino).unwrap().generation;
    let fs = reopen(&store, fs);
    let a = fs.lookup(&root(), ROOT_INO, n("a")).unwrap();
    assert_eq!((a.ino, a.generation, a.size), (f.ino, gen, 100_123));
    let back = fs.read(f.ino, 0, 200_000).unwrap();
    assert_eq!(back.len(), 100_123);
    assert!(back[..123].iter().all(|b| *b == 0));
    assert_eq!(&back[123..], &data[..]);
}

#[test]
fn sparse_files_truncate_and_partial_blocks() {
    let (_s, fs) = fresh(4);
    let f = mkfile(&fs, ROOT_INO, "s");
    fs.write(f, 10 * 4096 + 5, b"hello").unwrap();
    let a = fs.getattr(f).unwrap();
    assert_eq!(a.size, 10 * 4096 + 10);
    assert_eq!(a.blocks, 8, "only one block allocated");
    assert!(fs.read(f, 0, 40960).unwrap().iter().all(|b| *b == 0));
    // Truncate into the middle of the written block, then extend: the tail reads zeros.
    fs.setattr(
        &root(),
        f,
        &SetAttr {
            size: Some(10 * 4096 + 7),
            ..Default::default()
        },
    )
    .unwrap();
    fs.setattr(
        &root(),
        f,
        &SetAttr {
            size: Some(12 * 4096),
            ..Default::default()
        },
    )
    .unwrap();
    let tail = fs.read(f, 10 * 4096, 4096).unwrap();
    assert_eq!(&tail[5..7], b"he");
    assert!(tail[7..].iter().all(|b| *b == 0));
    fs.setattr(
        &root(),
        f,
        &SetAttr {
            size: Some(0),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(fs.getattr(f).unwrap().blocks, 0);
    // Overwrite inside an existing block keeps its other bytes.
    fs.write(f, 0, &[7u8; 4096]).unwrap();
    fs.write(f, 100, b"xyz").unwrap();
    let b = fs.read(f, 0, 4096).unwrap();
    assert_eq!(&b[99..104], &[7, b'x', b'y', b'z', 7]);
}

#[test]
fn fallocate_modes() {
    let (_s, fs) = fresh(4);
    let f = mkfile(&fs, ROOT_INO, "f");
    fs.fallocate(f, 0, 3 * 4096, FallocateMode::default())
        .unwrap();
    let a = fs.getattr(f).unwrap();
    assert_eq!((a.size, a.blocks), (3 * 4096, 24));
    fs.fallocate(
        f,
        3 * 4096,
        4096,
        FallocateMode {
            keep_size: true,
            punch_hole: false,
        },
    )
    .unwrap();
    let a = fs.getattr(f).unwrap();
    assert_eq!((a.size, a.blocks), (3 * 4096, 32));
    fs.write(f, 0, &[1u8; 3 * 4096]).unwrap();
    fs.fallocate(
        f,
        100,
        2 * 4096,
        FallocateMode {
            keep_size: true,
            punch_hole: true,
        },
    )
    .unwrap();
    let d = fs.read(f, 0, 3 * 4096).unwrap();
    assert!(d[..100].iter().all(|b| *b == 1));
    assert!(d[100..100 + 2 * 4096].iter().all(|b| *b == 0));
    assert!(d[100 + 2 * 4096..].iter().all(|b| *b == 1));
    assert_eq!(
        fs.getattr(f).unwrap().blocks,
        24,
        "one whole block punched out"
    );
    assert!(matches!(
        fs.fallocate(
            f,
            0,
            4096,
            FallocateMode {
                keep_size: false,
                punch_hole: true
            }
        ),
        Err(FsError::Unsupported(_))
    ));
}

/// fallocate reserves blocks without writing them (unwritten extents):
/// they read as zeros even where a deleted file left its bytes, and a
/// write into them goes to fresh blocks like any overwrite (copy-on-write,
/// packed into whole stripes), the reserved ones given back.
#[test]
fn fallocate_reserves_blocks_that_read_as_zeros_until_written() {
    let written = Arc::new(Mutex::new(0usize));
    let count = Arc::clone(&written);
    let store = Arc::new(HookedStore::new(
        MemStore::new(4, 8 * MIB, 64 * 1024),
        move |_, data| *count.lock() += data.len(),
    ));
    FileSystem::format(store.clone()).unwrap();
    let fs = FileSystem::open(store.clone(), FsOptions::default()).unwrap();
    let old = mkfile(&fs, ROOT_INO, "old");
    fs.write(old, 0, &vec![0xAB; MIB as usize]).unwrap();
    fs.sync_all().unwrap();
    let old_blocks: Vec<(u64, u64)> = fs
        .extents(old)
        .unwrap()
        .iter()
        .map(|&(_, addr, len)| (addr, addr + len))
        .collect();
    fs.unlink(&root(), ROOT_INO, n("old")).unwrap();
    fs.sync_all().unwrap();

    let f = mkfile(&fs, ROOT_INO, "f");
    let free_before = fs.statfs().unwrap().bfree;
    *written.lock() = 0;
    fs.fallocate(f, 0, MIB, FallocateMode::default()).unwrap();
    assert_eq!(*written.lock(), 0, "fallocate wrote to the store");
    let a = fs.getattr(f).unwrap();
    assert_eq!((a.size, a.blocks), (MIB, MIB / 512));
    assert_eq!(free_before - fs.statfs().unwrap().bfree, MIB / 4096);
    let reserved = fs.extents(f).unwrap();
    assert!(
        reserved
            .iter()
            .any(|&(_, addr, len)| old_blocks.iter().any(|&(s, e)| addr < e && s < addr + len)),
        "the reservation should reuse the deleted file's blocks: {reserved:?} {old_blocks:?}"
    );
    assert!(fs.read(f, 0, MIB as usize).unwrap().iter().all(|b| *b == 0));

    // A write across a block boundary goes to fresh blocks, zeros around it.
    let free_reserved = fs.statfs().unwrap().bfree;
    fs.write(f, 5000, b"written").unwrap();
    let mut expected = vec![0u8; MIB as usize];
    expected[5000..5007].copy_from_slice(b"written");
    assert!(fs.read(f, 0, MIB as usize).unwrap() == expected);
    let inside =
        |addr: u64, r: &[(u64, u64, u64)]| r.iter().any(|&(_, a, l)| (a..a + l).contains(&addr));
    let now = fs.extents(f).unwrap();
    let moved: Vec<_> = now
        .iter()
        .filter(|&&(off, _, _)| off < 8192 && off + 4096 > 4096)
        .collect();
    assert!(
        !moved.is_empty() && moved.iter().all(|&&(_, a, _)| !inside(a, &reserved)),
        "the written blocks moved out of the reservation: {now:?} {reserved:?}"
    );
    fs.sync_all().unwrap();
    assert_eq!(
        fs.statfs().unwrap().bfree,
        free_reserved,
        "the reserved blocks written elsewhere are given back"
    );

    fs.unmount().unwrap();
    let fs = FileSystem::open(store, FsOptions::default()).unwrap();
    assert!(
        fs.read(f, 0, MIB as usize).unwrap() == expected,
        "after replay"
    );
    assert_eq!(fs.getattr(f).unwrap().blocks, MIB / 512);
    // Overwriting everything leaves ordinary data: copy-on-write from here.
    fs.write(f, 0, &vec![7u8; MIB as usize]).unwrap();
    assert!(fs.read(f, 0, MIB as usize).unwrap().iter().all(|b| *b == 7));
}

/// The reservation's promise: with nothing else free, a write into blocks
/// fallocate reserved still succeeds, in place, and reads back after
/// replay.
#[test]
fn a_full_filesystem_writes_into_its_reservation_in_place() {
    let store = Arc::new(MemStore::new(4, 8 * MIB, 64 * 1024));
    FileSystem::format(store.clone()).unwrap();
    let fs = FileSystem::open(store.clone(), FsOptions::default()).unwrap();
    let f = mkfile(&fs, ROOT_INO, "f");
    fs.fallocate(f, 0, MIB, FallocateMode::default()).unwrap();
    let reserved = fs.extents(f).unwrap();
    // Everything else filled.
    let fill = mkfile(&fs, ROOT_INO, "fill");
    let mut at = 0;
    loop {
        match fs.write(fill, at, &[1u8; 4096]) {
            Ok(_) => at += 4096,
            Err(FsError::NoSpace) => break,
            Err(e) => panic!("fill: {e:?}"),
        }
    }
    fs.sync_all().unwrap();
    let data: Vec<u8> = (0..MIB).map(|i| (i % 251) as u8).collect();
    fs.write(f, 0, &data)
        .expect("a write into the reservation needs no space");
    assert_eq!(
        fs.extents(f)
            .unwrap()
            .iter()
            .map(|&(_, a, l)| (a, l))
            .collect::<Vec<_>>(),
        reserved.iter().map(|&(_, a, l)| (a, l)).collect::<Vec<_>>(),
        "written in place"
    );
    fs.sync_all().unwrap();
    fs.unmount().unwrap();
    let fs = FileSystem::open(store, FsOptions::default()).unwrap();
    assert!(fs.read(f, 0, MIB as usize).unwrap() == data, "after replay");
}

#[test]
fn rename_rules() {
    let (_s, fs) = fresh(4);
    let c = root();
    let d1 = fs.mkdir(&c, ROOT_INO, n("d1"), 0o755, 0).unwrap().ino;
    let d2 = fs.mkdir(&c, d1, n("d2"), 0o755, 0).unwrap().ino;
    let f = mkfile(&fs, ROOT_INO, "f");
    let g = mkfile(&fs, ROOT_INO, "g");
    let none = RenameFlags::default();
    assert!(matches!(
        fs.rename(&c, ROOT_INO, n("d1"), d2, n("x"), none),
        Err(FsError::Invalid(_))
    ));
    assert!(matches!(
        fs.rename(&c, ROOT_INO, n("d1"), d1, n("x"), none),
        Err(FsError::Invalid(_))
    ));
    assert!(matches!(
        fs.rename(&c, ROOT_INO, n("f"), ROOT_INO, n("d1"), none),
        Err(FsError::IsDir)
    ));
    assert!(matches!(
        fs.rename(&c, d1, n("d2"), ROOT_INO, n("f"), none),
        Err(FsError::NotDir)
    ));
    fs.mkdir(&c, ROOT_INO, n("full"), 0o755, 0).unwrap();
    let full = fs.lookup(&c, ROOT_INO, n("full")).unwrap().ino;
    mkfile(&fs, full, "x");
    assert!(matches!(
        fs.rename(&c, d1, n("d2"), ROOT_INO, n("full"), none),
        Err(FsError::NotEmpty)
    ));
    let noreplace = RenameFlags {
        noreplace: true,
        exchange: false,
        ..RenameFlags::default()
    };
    assert!(matches!(
        fs.rename(&c, ROOT_INO, n("f"), ROOT_INO, n("g"), noreplace),
        Err(FsError::Exists)
    ));
    // Over an existing file: g's inode is gone.
    fs.rename(&c, ROOT_INO, n("f"), ROOT_INO, n("g"), none)
        .unwrap();
    assert_eq!(fs.lookup(&c, ROOT_INO, n("g")).unwrap().ino, f);
    assert!(matches!(fs.getattr(g), Err(FsError::Stale)));
    // A directory moves across parents: link counts and "..".
    fs.mkdir(&c, ROOT_INO, n("empty"), 0o755, 0).unwrap();
    fs.rename(&c, d1, n("d2"), ROOT_INO, n("empty"), none)
        .unwrap();
    assert_eq!(fs.lookup(&c, d2, n("..")).unwrap().ino, ROOT_INO);
    assert_eq!(fs.getattr(d1).unwrap().nlink, 2);
    assert_eq!(fs.getattr(ROOT_INO).unwrap().nlink, 2 + 3);
    // Exchange a file and a directory.
    let ex = RenameFlags {
        noreplace: false,
        exchange: true,
        ..RenameFlags::default()
    };
    fs.rename(&c, ROOT_INO, n("g"), ROOT_INO, n("empty"), ex)
        .unwrap();
    assert_eq!(fs.lookup(&c, ROOT_INO, n("g")).unwrap().ino, d2);
    assert_eq!(fs.lookup(&c, ROOT_INO, n("empty")).unwrap().ino, f);
    fs.rename(&c, ROOT_INO, n("g"), d1, n("moved"), ex)
        .unwrap_err();
    fs.rename(&c, ROOT_INO, n("empty"), d1, n("moved"), none)
        .unwrap();
    fs.rename(&c, ROOT_INO, n("g"), d1, n("moved"), ex).unwrap();
    assert_eq!(fs.lookup(&c, d1, n("moved")).unwrap().ino, d2);
    assert_eq!(fs.lookup(&c, d2, n("..")).unwrap().ino, d1);
    assert_eq!(fs.getattr(d1).unwrap().nlink, 3);
}

#[test]
fn unlinked_open_file_lives_until_release_and_crash_frees_it() {
    let (store, fs) = fresh(4);
    let f = fs
        .create(&root(), ROOT_INO, n("tmp"), 0o644, 0, 0)
        .unwrap()
        .ino;
    fs.write(f, 0, &[9u8; 10_000]).unwrap();
    let free_before = fs.statfs().unwrap().bfree;
    fs.unlink(&root(), ROOT_INO, n("tmp")).unwrap();
    assert_eq!(fs.read(f, 0, 10).unwrap(), vec![9u8; 10]);
    assert_eq!(fs.getattr(f).unwrap().nlink, 0);
    fs.sync_all().unwrap();
    // "Crash": open the store again without unmounting or releasing.
    let again = FileSystem::open(store.clone(), FsOptions::default()).unwrap();
    assert!(matches!(again.getattr(f), Err(FsError::Stale)));
    assert!(again.statfs().unwrap().bfree > free_before);
    drop(again);
    fs.release(f).unwrap();
}

#[test]
fn release_frees_unlinked_file() {
    let (_s, fs) = fresh(4);
    let f = fs
        .create(&root(), ROOT_INO, n("tmp"), 0o644, 0, 0)
        .unwrap()
        .ino;
    fs.write(f, 0, &[1u8; 40960]).unwrap();
    fs.unlink(&root(), ROOT_INO, n("tmp")).unwrap();
    let before = fs.statfs().unwrap().bfree;
    fs.release(f).unwrap();
    fs.sync_all().unwrap();
    assert_eq!(fs.statfs().unwrap().bfree, before + 10);
    assert!(matches!(fs.getattr(f), Err(FsError::Stale)));
}

#[test]
fn statfs_counts_unallocated_groups_and_enospc_changes_nothing() {
    let (_s, fs) = fresh(3);
    let s = fs.statfs().unwrap();
    assert_eq!(s.blocks, 2 * 8 * MIB / 4096, "two unallocated groups");
    assert_eq!(s.bfree, s.blocks);
    let f = mkfile(&fs, ROOT_INO, "big");
    fs.write(f, 0, &vec![5u8; (10 * MIB) as usize]).unwrap();
    assert_eq!(fs.statfs().unwrap().bfree, s.blocks - 10 * MIB / 4096);
    let g = mkfile(&fs, ROOT_INO, "g");
    let before = fs.statfs().unwrap();
    assert!(matches!(
        fs.write(g, 0, &vec![1u8; (7 * MIB) as usize]),
        Err(FsError::NoSpace)
    ));
    assert_eq!(fs.statfs().unwrap(), before);
    assert_eq!(fs.getattr(g).unwrap().size, 0);
    fs.write(g, 0, &vec![1u8; (5 * MIB) as usize]).unwrap();
    assert_eq!(fs.read(f, 10 * MIB - 3, 10).unwrap(), vec![5u8; 3]);
}

#[test]
fn large_writes_are_stripe_aligned_and_contiguous() {
    let stripe = 192 * 1024;
    let writes = Arc::new(Mutex::new(Vec::<(u64, usize)>::new()));
    let record = Arc::clone(&writes);
    let store = Arc::new(HookedStore::new(
        MemStore::new(4, 16 * MIB, stripe),
        move |addr, data| record.lock().push((addr, data.len())),
    ));
    FileSystem::format(store.clone()).unwrap();
    let fs = FileSystem::open(store.clone(), FsOptions::default()).unwrap();
    let small = mkfile(&fs, ROOT_INO, "small");
    fs.write(small, 0, b"x").unwrap();
    let big = mkfile(&fs, ROOT_INO, "big");
    writes.lock().clear();
    fs.write(big, 0, &vec![3u8; stripe as usize * 4]).unwrap();
    let first = writes.lock().clone();
    assert_eq!(first.len(), 1);
    assert_eq!(
        (first[0].0 & ((1 << raidfs::fs::store::GROUP_SHIFT) - 1)) % stripe,
        0,
        "extent starts on a stripe boundary"
    );
    // Appending continues the same extent.
    writes.lock().clear();
    fs.write(big, stripe * 4, &vec![4u8; stripe as usize])
        .unwrap();
    assert_eq!(writes.lock()[0].0, first[0].0 + 4 * stripe);
}

#[test]
fn permissions() {
    let (_s, fs) = fresh(4);
    let alice = user(1000, 1000, &[]);
    let bob = user(1001, 1001, &[50]);
    let carol = user(1002, 1002, &[]);
    let home = fs
        .mkdir(&root(), ROOT_INO, n("home"), 0o755, 0)
        .unwrap()
        .ino;
    fs.setattr(
        &root(),
        home,
        &SetAttr {
            uid: Some(1000),
            gid: Some(50),
            ..Default::default()
        },
    )
    .unwrap();
    assert!(matches!(
        fs.mknod(&bob, home, n("x"), 0o100644, 0, 0),
        Err(FsError::Access)
    ));
    fs.setattr(
        &alice,
        home,
        &SetAttr {
            mode: Some(0o775),
            ..Default::default()
        },
    )
    .unwrap();
    // bob is in group 50 through a supplementary group.
    let bf = fs.mknod(&bob, home, n("bobs"), 0o100640, 0, 0).unwrap();
    assert_eq!((bf.uid, bf.gid), (1001, 1001));
    assert!(matches!(
        fs.open_inode(&carol, bf.ino, libc::O_RDONLY),
        Err(FsError::Access)
    ));
    assert!(matches!(
        fs.mknod(&carol, home, n("c"), 0o100644, 0, 0),
        Err(FsError::Access)
    ));
    // chmod by non-owner, chown by non-root.
    assert!(matches!(
        fs.setattr(
            &alice,
            bf.ino,
            &SetAttr {
                mode: Some(0o777),
                ..Default::default()
            }
        ),
        Err(FsError::Perm)
    ));
    assert!(matches!(
        fs.setattr(
            &bob,
            bf.ino,
            &SetAttr {
                uid: Some(1000),
                ..Default::default()
            }
        ),
        Err(FsError::Perm)
    ));
    fs.setattr(
        &bob,
        bf.ino,
        &SetAttr {
            gid: Some(50),
            ..Default::default()
        },
    )
    .unwrap();
    assert!(matches!(
        fs.setattr(
            &bob,
            bf.ino,
            &SetAttr {
                gid: Some(7),
                ..Default::default()
            }
        ),
        Err(FsError::Perm)
    ));
    // Non-root chmod with setgid for a group they are not in drops the bit.
    fs.setattr(
        &root(),
        bf.ino,
        &SetAttr {
            gid: Some(7),
            ..Default::default()
        },
    )
    .unwrap();
    let a = fs
        .setattr(
            &bob,
            bf.ino,
            &SetAttr {
                mode: Some(0o2755),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(a.perm, 0o755);
    // Write by non-root clears set-id bits.
    let a = fs
        .setattr(
            &root(),
            bf.ino,
            &SetAttr {
                mode: Some(0o6755),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(a.perm, 0o6755);
    fs.write_as(&bob, bf.ino, 0, b"hi").unwrap();
    assert_eq!(fs.getattr(bf.ino).unwrap().perm, 0o755);
    // Root bypasses rw but exec needs some x bit.
    let plain = mkfile(&fs, ROOT_INO, "plain");
    fs.setattr(
        &root(),
        plain,
        &SetAttr {
            mode: Some(0o000),
            ..Default::default()
        },
    )
    .unwrap();
    fs.access(&root(), plain, 6).unwrap();
    assert!(matches!(fs.access(&root(), plain, 1), Err(FsError::Access)));
    fs.setattr(
        &root(),
        plain,
        &SetAttr {
            mode: Some(0o010),
            ..Default::default()
        },
    )
    .unwrap();
    fs.access(&root(), plain, 1).unwrap();
    // Sticky directory: carol cannot remove bob's file even with write access.
    let tmp = fs
        .mkdir(&root(), ROOT_INO, n("tmp"), 0o1777, 0)
        .unwrap()
        .ino;
    fs.mknod(&bob, tmp, n("b"), 0o100644, 0, 0).unwrap();
    assert!(matches!(fs.unlink(&carol, tmp, n("b")), Err(FsError::Perm)));
    assert!(matches!(
        fs.rename(&carol, tmp, n("b"), tmp, n("c"), RenameFlags::default()),
        Err(FsError::Perm)
    ));
    fs.unlink(&bob, tmp, n("b")).unwrap();
    // Setgid directory: gid inherited, subdirectories inherit setgid.
    let sg = fs.mkdir(&root(), ROOT_INO, n("sg"), 0o2777, 0).unwrap().ino;
    fs.setattr(
        &root(),
        sg,
        &SetAttr {
            gid: Some(77),
            ..Default::default()
        },
    )
    .unwrap();
    fs.setattr(
        &root(),
        sg,
        &SetAttr {
            mode: Some(0o2777),
            ..Default::default()
        },
    )
    .unwrap();
    let child = fs.mknod(&carol, sg, n("f"), 0o100644, 0, 0).unwrap();
    assert_eq!(child.gid, 77);
    let sub = fs.mkdir(&carol, sg, n("d"), 0o755, 0).unwrap();
    assert_eq!((sub.gid, sub.perm & 0o2000), (77, 0o2000));
    // Times: only the owner may set explicit times.
    let t = std::time::UNIX_EPOCH + std::time::Duration::new(1000, 5);
    assert!(matches!(
        fs.setattr(
            &bob,
            child.ino,
            &SetAttr {
                mtime: Some(TimeSet::At(t)),
                ..Default::default()
            }
        ),
        Err(FsError::Perm)
    ));
    let a = fs
        .setattr(
            &carol,
            child.ino,
            &SetAttr {
                mtime: Some(TimeSet::At(t)),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(a.mtime, t);
}

#[test]
fn xattrs() {
    let (store, fs) = fresh(4);
    let f = mkfile(&fs, ROOT_INO, "x");
    let c = root();
    fs.setxattr(&c, f, n("user.a"), b"1", 0).unwrap();
    assert!(matches!(
        fs.setxattr(&c, f, n("user.a"), b"2", XATTR_CREATE),
        Err(FsError::Exists)
    ));
    assert!(matches!(
        fs.setxattr(&c, f, n("user.b"), b"2", XATTR_REPLACE),
        Err(FsError::NoAttr)
    ));
    fs.setxattr(&c, f, n("user.a"), b"3", XATTR_REPLACE)
        .unwrap();
    fs.setxattr(&c, f, n("trusted.t"), b"t", 0).unwrap();
    fs.setxattr(&c, f, n("security.selinux"), b"ctx", 0)
        .unwrap();
    // An ACL with a named user (stored; one the mode says as much as is not).
    let acl: Vec<u8> = [2u32.to_le_bytes().to_vec()]
        .into_iter()
        .chain(
            [
                (1u16, 6u16, u32::MAX),
                (2, 4, 7),
                (4, 4, u32::MAX),
                (0x10, 4, u32::MAX),
                (0x20, 0, u32::MAX),
            ]
            .iter()
            .map(|(t, p, id)| {
                [
                    t.to_le_bytes().to_vec(),
                    p.to_le_bytes().to_vec(),
                    id.to_le_bytes().to_vec(),
                ]
                .concat()
            }),
        )
        .flatten()
        .collect();
    fs.setxattr(&c, f, n("system.posix_acl_access"), &acl, 0)
        .unwrap();
    assert!(matches!(
        fs.setxattr(&c, f, n("system.posix_acl_access"), &[2, 0, 0, 0], 0),
        Err(FsError::Invalid(_))
    ));
    assert!(matches!(
        fs.setxattr(&c, f, n("os2.x"), b"", 0),
        Err(FsError::Unsupported(_))
    ));
    let fs = reopen(&store, fs);
    assert_eq!(fs.getxattr(&c, f, n("user.a")).unwrap(), b"3");
    assert_eq!(
        fs.listxattr(&c, f).unwrap(),
        b"security.selinux\0system.posix_acl_access\0trusted.t\0user.a\0".to_vec()
    );
    let bob = user(5, 5, &[]);
    assert_eq!(
        fs.listxattr(&bob, f).unwrap(),
        b"security.selinux\0system.posix_acl_access\0user.a\0".to_vec()
    );
    assert!(matches!(
        fs.setxattr(&bob, f, n("user.a"), b"x", 0),
        Err(FsError::Access)
    ));
    assert!(matches!(
        fs.setxattr(&bob, f, n("trusted.a"), b"x", 0),
        Err(FsError::Perm)
    ));
    fs.removexattr(&c, f, n("user.a")).unwrap();
    assert!(matches!(
        fs.getxattr(&c, f, n("user.a")),
        Err(FsError::NoAttr)
    ));
}

#[test]
fn special_files_links_and_names() {
    let (store, fs) = fresh(4);
    let c = root();
    for (name, mode, kind) in [
        ("fifo", 0o010644, FileKind::Fifo),
        ("sock", 0o140644, FileKind::Socket),
        ("chr", 0o020644, FileKind::CharDev),
        ("blk", 0o060644, FileKind::BlockDev),
    ] {
        let a = fs
            .mknod(&c, ROOT_INO, n(name), mode, 0o022, 0x0801)
            .unwrap();
        assert_eq!((a.kind, a.rdev, a.perm), (kind, 0x0801, 0o644));
    }
    let s = fs.symlink(&c, ROOT_INO, n("ln"), b"/some/where").unwrap();
    let f = mkfile(&fs, ROOT_INO, "f");
    fs.link(&c, f, ROOT_INO, n("f2")).unwrap();
    assert!(matches!(
        fs.link(&c, ROOT_INO, ROOT_INO, n("r")),
        Err(FsError::Perm)
    ));
    assert!(matches!(
        fs.mknod(&c, ROOT_INO, n("f"), 0o100644, 0, 0),
        Err(FsError::Exists)
    ));
    assert!(matches!(
        fs.mknod(&c, ROOT_INO, n(&"n".repeat(256)), 0o100644, 0, 0),
        Err(FsError::NameTooLong)
    ));
    assert!(matches!(
        fs.rmdir(&c, ROOT_INO, n("f")),
        Err(FsError::NotDir)
    ));
    assert!(matches!(
        fs.unlink(&c, ROOT_INO, n("nope")),
        Err(FsError::NotFound)
    ));
    let fs = reopen(&store, fs);
    assert_eq!(fs.readlink(s.ino).unwrap(), b"/some/where");
    assert_eq!(fs.getattr(f).unwrap().nlink, 2);
    assert_eq!(
        names(&fs, ROOT_INO),
        ["blk", "chr", "f", "f2", "fifo", "ln", "sock"]
    );
    let lookup_dot = fs.lookup(&c, ROOT_INO, n("..")).unwrap();
    assert_eq!(lookup_dot.ino, ROOT_INO);
    assert_eq!(fs.lookup_parent(ROOT_INO).unwrap().ino, ROOT_INO);
}

#[test]
fn readdir_while_unlinking_visits_every_entry_once() {
    let (store, fs) = fresh(4);
    let c = root();
    let d = fs.mkdir(&c, ROOT_INO, n("big"), 0o755, 0).unwrap().ino;
    let count = 5000;
    for i in 0..count {
        fs.mknod(&c, d, n(&format!("file-{i:05}")), 0o100644, 0, 0)
            .unwrap();
    }
    let mut seen = std::collections::BTreeSet::new();
    let mut cookie = 0;
    loop {
        let batch = fs.readdir(d, cookie, 97).unwrap();
        if batch.is_empty() {
            break;
        }
        for e in &batch {
            cookie = e.cookie;
            if e.name == b"." || e.name == b".." {
                continue;
            }
            assert!(seen.insert(e.name.clone()), "entry listed twice");
            fs.unlink(&c, d, OsStr::from_bytes_ext(&e.name)).unwrap();
        }
        // Entries created while listing are allowed to show up or not, but
        // nothing that existed throughout may be skipped.
        fs.mknod(
            &c,
            ROOT_INO,
            n(&format!("elsewhere-{cookie}")),
            0o100644,
            0,
            0,
        )
        .unwrap();
    }
    assert_eq!(seen.len(), count);
    assert_eq!(names(&fs, d), Vec::<String>::new());
    let fs = reopen(&store, fs);
    fs.rmdir(&c, ROOT_INO, n("big")).unwrap();
}

#[test]
fn readdir_while_renaming_ends_and_lists_each_entry_once() {
    use std::collections::{BTreeMap, BTreeSet};
    let (store, fs) = fresh(4);
    let c = root();
    let none = RenameFlags::default();
    let d = fs.mkdir(&c, ROOT_INO, n("busy"), 0o755, 0).unwrap().ino;
    let kept = 1000;
    for i in 0..kept {
        mkfile(&fs, d, &format!("keep-{i:04}"));
    }
    // Unlinked during the listing before the reader reaches them (or not).
    let doomed = 200;
    for i in 0..doomed {
        mkfile(&fs, d, &format!("doomed-{i:03}"));
    }
    // Original name → the name it has now; renamed after each batch.
    let mut current: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
    let mut seen_names = BTreeSet::new();
    let mut seen_inos = BTreeSet::new();
    let mut renames = 0u64;
    let mut created = 0u64;
    let mut unlinked = 0;
    let mut gone = BTreeSet::new();
    let end = fs.readdir_end(d).unwrap();
    let mut cookie = 0;
    let mut batches = 0;
    loop {
        batches += 1;
        assert!(batches <= 1000, "the listing does not end");
        let batch = fs.readdir_until(d, cookie, end, 13).unwrap();
        if batch.is_empty() {
            break;
        }
        for e in &batch {
            assert!(e.cookie > cookie, "cookies go up within a listing");
            cookie = e.cookie;
            if e.name == b"." || e.name == b".." {
                continue;
            }
            assert!(seen_names.insert(e.name.clone()), "a name listed twice");
            assert!(seen_inos.insert(e.ino), "an inode listed twice");
            current.insert(e.name.clone(), e.name.clone());
        }
        // Every entry seen so far moves, half of them there and back again
        // (as generic/736 does), half to a new name.
        for now in current.values_mut() {
            renames += 1;
            let old = OsStr::from_bytes_ext(now).to_owned();
            if renames.is_multiple_of(2) {
                fs.rename(&c, d, &old, d, n("TEMPFILE"), none).unwrap();
                fs.rename(&c, d, n("TEMPFILE"), d, &old, none).unwrap();
            } else {
                let new = format!("renamed-{renames}").into_bytes();
                fs.rename(&c, d, &old, d, OsStr::from_bytes_ext(&new), none)
                    .unwrap();
                *now = new;
            }
        }
        created += 1;
        mkfile(&fs, d, &format!("created-{created}"));
        if unlinked < doomed {
            let name = format!("doomed-{:03}", doomed - 1 - unlinked);
            if !current.contains_key(name.as_bytes()) {
                fs.unlink(&c, d, n(&name)).unwrap();
                gone.insert(name);
            }
            unlinked += 1;
        }
    }
    for i in 0..kept {
        assert!(
            seen_names.contains(format!("keep-{i:04}").as_bytes()),
            "keep-{i:04} was not listed"
        );
    }
    for name in &seen_names {
        assert!(
            name.starts_with(b"keep-") || name.starts_with(b"doomed-"),
            "{} was inserted after the listing began",
            String::from_utf8_lossy(name)
        );
    }
    assert!(seen_names.len() <= kept + doomed);
    assert!(
        !gone.is_empty(),
        "some entries were unlinked before being reached"
    );
    // Resuming at or past the end (a seekdir to another listing's cookie)
    // lists nothing more.
    assert_eq!(fs.readdir_until(d, end, end, usize::MAX).unwrap(), []);
    assert_eq!(fs.readdir_until(d, end + 5, end, usize::MAX).unwrap(), []);

    // A listing begun now sees the directory as it is now, each entry once.
    let mut expected: Vec<String> = current
        .values()
        .map(|v| String::from_utf8(v.clone()).unwrap())
        .chain((1..=created).map(|i| format!("created-{i}")))
        .chain(
            (0..doomed)
                .map(|i| format!("doomed-{i:03}"))
                .filter(|name| !current.contains_key(name.as_bytes()) && !gone.contains(name)),
        )
        .collect();
    expected.sort();
    let end = fs.readdir_end(d).unwrap();
    let mut listed: Vec<String> = fs
        .readdir_until(d, 0, end, usize::MAX)
        .unwrap()
        .into_iter()
        .map(|e| String::from_utf8(e.name).unwrap())
        .filter(|n| n != "." && n != "..")
        .collect();
    listed.sort();
    assert!(
        listed == expected,
        "{} listed, {} expected",
        listed.len(),
        expected.len()
    );

    // Cookies are kept on disk: a listing resumed after a remount (as an NFS
    // client resumes one) continues where it left off.
    let all = fs.readdir(d, 0, usize::MAX).unwrap();
    let middle = all[all.len() / 2].cookie;
    let rest_before = fs.readdir(d, middle, usize::MAX).unwrap();
    let fs = reopen(&store, fs);
    assert_eq!(fs.readdir(d, middle, usize::MAX).unwrap(), rest_before);
    assert_eq!(fs.readdir(d, 0, usize::MAX).unwrap(), all);
}

trait FromBytes {
    fn from_bytes_ext(b: &[u8]) -> &OsStr;
}

impl FromBytes for OsStr {
    fn from_bytes_ext(b: &[u8]) -> &OsStr {
        use std::os::unix::ffi::OsStrExt;
        OsStr::from_bytes(b)
    }
}

#[test]
fn concurrent_writers_and_readers_of_different_files() {
    let (_s, fs) = fresh(6);
    let fs = Arc::new(fs);
    let inos: Vec<u64> = (0..4)
        .map(|i| mkfile(&fs, ROOT_INO, &format!("t{i}")))
        .collect();
    let threads: Vec<_> = inos
        .iter()
        .enumerate()
        .map(|(i, &ino)| {
            let fs = fs.clone();
            std::thread::spawn(move || {
                for round in 0..50u64 {
                    let chunk = vec![(i as u8) ^ (round as u8); 12_345];
                    fs.write(ino, round * 12_345, &chunk).unwrap();
                    assert_eq!(fs.read(ino, round * 12_345, 12_345).unwrap(), chunk);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    for (i, &ino) in inos.iter().enumerate() {
        let data = fs.read(ino, 0, 50 * 12_345).unwrap();
        for round in 0..50usize {
            assert!(data[round * 12_345..(round + 1) * 12_345]
                .iter()
                .all(|b| *b == (i as u8) ^ (round as u8)));
        }
    }
}

/// Reads move the access time as the mount's atime mode says: relatime
/// (after a change, or a day), strictatime (always), noatime (never);
/// listings follow it unless nodiratime. The time persists.
#[test]
fn reads_update_atime_by_the_mount_mode() {
    use raidfs::fs::atime::AtimeMode;
    let open = |store: &Arc<MemStore>, atime: AtimeMode, diratime: bool| {
        let opts = FsOptions {
            atime,
            diratime,
            ..FsOptions::default()
        };
        FileSystem::open(store.clone(), opts).unwrap()
    };
    let atime = |fs: &FileSystem, ino: u64| fs.getattr(ino).unwrap().atime;
    let store = Arc::new(MemStore::new(4, 8 * MIB, 64 * 1024));
    FileSystem::format(store.clone()).unwrap();

    let fs = open(&store, AtimeMode::Relative, true);
    let f = mkfile(&fs, ROOT_INO, "f");
    fs.write(f, 0, b"data").unwrap();
    let created = atime(&fs, f);
    fs.read(f, 0, 4).unwrap();
    let first = atime(&fs, f);
    assert!(
        first > created,
        "relatime: the first read after a write moves it"
    );
    fs.read(f, 0, 4).unwrap();
    assert_eq!(atime(&fs, f), first, "relatime: a second read does not");
    fs.write(f, 0, b"more").unwrap();
    fs.read(f, 0, 4).unwrap();
    assert!(
        atime(&fs, f) > first,
        "relatime: a read after a change does"
    );
    let dir_before = atime(&fs, ROOT_INO);
    fs.readdir_end(ROOT_INO).unwrap();
    assert!(
        atime(&fs, ROOT_INO) > dir_before,
        "a listing moves the directory's"
    );
    let kept = atime(&fs, f);
    fs.unmount().unwrap();

    let fs = open(&store, AtimeMode::Strict, false);
    assert_eq!(atime(&fs, f), kept, "the access time persists");
    fs.read(f, 0, 4).unwrap();
    let a = atime(&fs, f);
    fs.read(f, 0, 4).unwrap();
    assert!(atime(&fs, f) > a, "strictatime: every read moves it");
    fs.write(f, 0, b"x").unwrap();
    let dir_before = atime(&fs, ROOT_INO);
    fs.readdir_end(ROOT_INO).unwrap();
    assert_eq!(atime(&fs, ROOT_INO), dir_before, "nodiratime");
    fs.unmount().unwrap();

    let fs = open(&store, AtimeMode::Never, true);
    let before = atime(&fs, f);
    fs.read(f, 0, 4).unwrap();
    assert_eq!(atime(&fs, f), before, "noatime: reads never move it");
    fs.unmount().unwrap();
}
