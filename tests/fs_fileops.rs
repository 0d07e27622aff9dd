//! O_TMPFILE, RENAME_WHITEOUT, SEEK_DATA/SEEK_HOLE and copy_file_range on
//! the filesystem layer, driven directly (no FUSE): what each leaves
//! behind, its refusals, and what a crash leaves of it.

mod common;

use std::sync::Arc;

use common::fs::{n, names};
use proptest::prelude::*;
use raidfs::fs::teststore::{CrashStore, MemStore};
use raidfs::fs::*;

const MIB: u64 = 1 << 20;
const B: u64 = BLOCK_SIZE;

fn root() -> Caller {
    Caller::root()
}

fn user(uid: u32) -> Caller {
    Caller {
        uid,
        gid: uid,
        groups: Vec::new(),
    }
}

fn fresh() -> (Arc<MemStore>, FileSystem) {
    common::fs::fresh(8)
}

fn mkfile(fs: &FileSystem, parent: u64, name: &str, mode: u32) -> u64 {
    fs.mknod(&root(), parent, n(name), 0o100000 | mode, 0, 0)
        .unwrap()
        .ino
}

/// Free blocks once every change so far is committed (freed blocks are
/// reusable only then).
fn free_blocks(fs: &FileSystem) -> u64 {
    fs.sync_all().unwrap();
    fs.statfs().unwrap().bfree
}

#[test]
fn a_tmpfile_has_no_name_and_is_freed_by_its_last_release() {
    let (_store, fs) = fresh();
    let free = free_blocks(&fs);
    let inodes = fs.statfs().unwrap().ffree;
    let t = fs.tmpfile(&root(), ROOT_INO, 0o100644, 0, true).unwrap();
    assert_eq!((t.kind, t.nlink, t.perm), (FileKind::File, 0, 0o644));
    fs.write(t.ino, 0, &vec![7u8; MIB as usize]).unwrap();
    assert_eq!(fs.read(t.ino, MIB - 3, 10).unwrap(), vec![7u8; 3]);
    assert!(names(&fs, ROOT_INO).is_empty(), "it is in no directory");
    assert_eq!(free_blocks(&fs), free - MIB / B);
    fs.release(t.ino).unwrap();
    assert!(matches!(fs.getattr(t.ino), Err(FsError::Stale)));
    assert_eq!(free_blocks(&fs), free, "its blocks come back");
    assert_eq!(fs.statfs().unwrap().ffree, inodes);
}

#[test]
fn a_tmpfile_follows_the_rules_of_create() {
    let (_store, fs) = fresh();
    let dir = fs.mkdir(&root(), ROOT_INO, n("d"), 0o2755, 0).unwrap();
    fs.setattr(
        &root(),
        dir.ino,
        &SetAttr {
            gid: Some(50),
            ..SetAttr::default()
        },
    )
    .unwrap();
    // Writing the directory is needed, as for create.
    assert!(matches!(
        fs.tmpfile(&user(1000), dir.ino, 0o100600, 0, true),
        Err(FsError::Access)
    ));
    // The umask applies; the set-group-ID directory gives its group.
    let t = fs.tmpfile(&root(), dir.ino, 0o100666, 0o022, true).unwrap();
    assert_eq!((t.perm, t.gid), (0o644, 50));
    // A default ACL takes the umask's place.
    let default = [
        2u8, 0, 0, 0, // version
        1, 0, 7, 0, 0xff, 0xff, 0xff, 0xff, // user::rwx
        4, 0, 5, 0, 0xff, 0xff, 0xff, 0xff, // group::r-x
        32, 0, 1, 0, 0xff, 0xff, 0xff, 0xff, // other::--x
    ];
    fs.setxattr(&root(), dir.ino, n("system.posix_acl_default"), &default, 0)
        .unwrap();
    let t = fs.tmpfile(&root(), dir.ino, 0o100777, 0o077, true).unwrap();
    assert_eq!(t.perm, 0o751);
    assert!(matches!(
        fs.tmpfile(&root(), dir.ino, 0o040755, 0, true),
        Err(FsError::Invalid(_))
    ));
}

#[test]
fn linkat_names_a_linkable_tmpfile_once() {
    let (store, fs) = fresh();
    let t = fs.tmpfile(&root(), ROOT_INO, 0o100644, 0, true).unwrap();
    fs.write(t.ino, 0, b"kept").unwrap();
    let linked = fs.link(&root(), t.ino, ROOT_INO, n("named")).unwrap();
    assert_eq!(linked.nlink, 1);
    fs.release(t.ino).unwrap();
    assert_eq!(fs.getattr(t.ino).unwrap().nlink, 1, "a name keeps it");

    // O_EXCL: never linkable. An unlinked open file: not either.
    let excl = fs.tmpfile(&root(), ROOT_INO, 0o100644, 0, false).unwrap();
    assert!(matches!(
        fs.link(&root(), excl.ino, ROOT_INO, n("no")),
        Err(FsError::NotFound)
    ));
    let gone = fs
        .create(&root(), ROOT_INO, n("gone"), 0o644, 0, 0)
        .unwrap();
    fs.unlink(&root(), ROOT_INO, n("gone")).unwrap();
    assert!(matches!(
        fs.link(&root(), gone.ino, ROOT_INO, n("back")),
        Err(FsError::NotFound)
    ));
    // Named once, removed again: gone for good.
    let again = fs.tmpfile(&root(), ROOT_INO, 0o100644, 0, true).unwrap();
    fs.link(&root(), again.ino, ROOT_INO, n("once")).unwrap();
    fs.unlink(&root(), ROOT_INO, n("once")).unwrap();
    assert!(matches!(
        fs.link(&root(), again.ino, ROOT_INO, n("twice")),
        Err(FsError::NotFound)
    ));

    fs.unmount().unwrap();
    let fs = FileSystem::open(store, FsOptions::default()).unwrap();
    assert_eq!(names(&fs, ROOT_INO), vec!["named"]);
    let named = fs.lookup(&root(), ROOT_INO, n("named")).unwrap();
    assert_eq!(fs.read(named.ino, 0, 10).unwrap(), b"kept");
    for ino in [excl.ino, gone.ino, again.ino] {
        assert!(matches!(fs.getattr(ino), Err(FsError::Stale)), "{ino}");
    }
}

#[test]
fn a_tmpfile_open_at_a_crash_is_freed_by_the_next_mount() {
    let store = Arc::new(CrashStore::new(8, 8 * MIB, 64 * 1024).expect("crash store"));
    FileSystem::format(store.clone()).unwrap();
    let fs = FileSystem::open(store.clone(), FsOptions::default()).unwrap();
    let free = free_blocks(&fs);
    let t = fs.tmpfile(&root(), ROOT_INO, 0o100644, 0, true).unwrap();
    fs.write(t.ino, 0, &vec![1u8; 2 * MIB as usize]).unwrap();
    fs.fsync(t.ino, false).unwrap();
    assert_eq!(fs.statfs().unwrap().bfree, free - 2 * MIB / B);
    let crashed = Arc::new(store.crash(0).expect("crash image"));
    drop(fs);

    let report = fsck(crashed.clone(), false).unwrap();
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    assert!(
        report.notes.iter().any(|n| n.contains("orphan")),
        "{:?}",
        report.notes
    );
    let fs = FileSystem::open(crashed.clone(), FsOptions::default()).unwrap();
    assert!(matches!(fs.getattr(t.ino), Err(FsError::Stale)));
    assert_eq!(free_blocks(&fs), free, "no space leaks");
    fs.unmount().unwrap();
    let report = fsck(crashed, false).unwrap();
    assert!(report.problems.is_empty() && report.notes.iter().all(|n| !n.contains("orphan")));
}

#[test]
fn rename_whiteout_leaves_a_whiteout_at_the_old_name() {
    let (_store, fs) = fresh();
    let whiteout = RenameFlags {
        whiteout: true,
        ..RenameFlags::default()
    };
    let f = mkfile(&fs, ROOT_INO, "f", 0o644);
    let d = fs.mkdir(&root(), ROOT_INO, n("d"), 0o755, 0).unwrap().ino;
    fs.rename(&user(0), ROOT_INO, n("f"), d, n("g"), whiteout)
        .unwrap();
    assert_eq!(fs.lookup(&root(), d, n("g")).unwrap().ino, f);
    let wh = fs.lookup(&root(), ROOT_INO, n("f")).unwrap();
    assert_eq!(
        (wh.kind, wh.rdev, wh.perm, wh.nlink),
        (FileKind::CharDev, 0, 0, 1)
    );
    // A directory moved with a whiteout: the link counts of a move.
    let sub = fs.mkdir(&root(), d, n("sub"), 0o755, 0).unwrap().ino;
    fs.rename(&root(), d, n("sub"), ROOT_INO, n("sub"), whiteout)
        .unwrap();
    assert_eq!(fs.lookup_parent(sub).unwrap().ino, ROOT_INO);
    assert_eq!(fs.getattr(d).unwrap().nlink, 2);
    assert_eq!(fs.getattr(ROOT_INO).unwrap().nlink, 4);
    assert_eq!(
        fs.lookup(&root(), d, n("sub")).unwrap().kind,
        FileKind::CharDev
    );
    assert_eq!(names(&fs, d), vec!["g", "sub"]);
    // Over an existing name, the target goes as in any rename.
    let h = mkfile(&fs, d, "h", 0o644);
    fs.rename(&root(), d, n("g"), d, n("h"), whiteout).unwrap();
    assert!(matches!(fs.getattr(h), Err(FsError::Stale)));
    assert_eq!(fs.lookup(&root(), d, n("h")).unwrap().ino, f);
    assert_eq!(
        fs.lookup(&root(), d, n("g")).unwrap().kind,
        FileKind::CharDev
    );
}

#[test]
fn rename_whiteout_refusals_change_nothing() {
    let (_store, fs) = fresh();
    let a = mkfile(&fs, ROOT_INO, "a", 0o644);
    let b = mkfile(&fs, ROOT_INO, "b", 0o644);
    let before = names(&fs, ROOT_INO);
    let with = |noreplace, exchange| RenameFlags {
        noreplace,
        exchange,
        whiteout: true,
    };
    assert!(matches!(
        fs.rename(
            &root(),
            ROOT_INO,
            n("a"),
            ROOT_INO,
            n("b"),
            with(false, true)
        ),
        Err(FsError::Invalid(_))
    ));
    assert!(matches!(
        fs.rename(
            &root(),
            ROOT_INO,
            n("a"),
            ROOT_INO,
            n("b"),
            with(true, false)
        ),
        Err(FsError::Exists)
    ));
    assert!(matches!(
        fs.rename(
            &user(1000),
            ROOT_INO,
            n("a"),
            ROOT_INO,
            n("c"),
            with(false, false)
        ),
        Err(FsError::Access)
    ));
    assert_eq!(names(&fs, ROOT_INO), before);
    assert_eq!(fs.lookup(&root(), ROOT_INO, n("a")).unwrap().ino, a);
    assert_eq!(fs.lookup(&root(), ROOT_INO, n("b")).unwrap().ino, b);
    // NOREPLACE with a free target is allowed alongside.
    fs.rename(
        &root(),
        ROOT_INO,
        n("a"),
        ROOT_INO,
        n("c"),
        with(true, false),
    )
    .unwrap();
    assert_eq!(names(&fs, ROOT_INO), vec!["a", "b", "c"]);
}

#[test]
fn a_crash_keeps_a_whiteout_rename_whole() {
    for seed in 0..8 {
        let store = Arc::new(CrashStore::new(8, 8 * MIB, 64 * 1024).expect("crash store"));
        FileSystem::format(store.clone()).unwrap();
        let fs = FileSystem::open(
            store.clone(),
            FsOptions {
                commit_interval_secs: 3600,
                ..FsOptions::default()
            },
        )
        .unwrap();
        let f = mkfile(&fs, ROOT_INO, "f", 0o644);
        fs.sync_all().unwrap();
        let whiteout = RenameFlags {
            whiteout: true,
            ..RenameFlags::default()
        };
        fs.rename(&root(), ROOT_INO, n("f"), ROOT_INO, n("g"), whiteout)
            .unwrap();
        // Half the runs commit the rename; a crash keeps all of it or none.
        let committed = seed % 2 == 0;
        if committed {
            fs.fsync(ROOT_INO, false).unwrap();
        }
        let crashed = Arc::new(store.crash(seed).expect("crash image"));
        drop(fs);
        let fs = FileSystem::open(crashed, FsOptions::default()).unwrap();
        let f_kind = fs.lookup(&root(), ROOT_INO, n("f")).unwrap();
        match fs.lookup(&root(), ROOT_INO, n("g")) {
            Ok(g) => {
                assert_eq!(g.ino, f, "seed {seed}");
                assert_eq!(f_kind.kind, FileKind::CharDev, "seed {seed}");
            }
            Err(FsError::NotFound) => {
                assert!(!committed, "seed {seed}: a committed rename is kept");
                assert_eq!(f_kind.ino, f, "seed {seed}");
            }
            Err(e) => panic!("seed {seed}: {e}"),
        }
    }
}

/// Blocks 0 and 3 written (the second only partly), holes between and
/// after, the size in the middle of block 6.
fn sparse(fs: &FileSystem) -> u64 {
    let f = mkfile(fs, ROOT_INO, "sparse", 0o644);
    fs.write(f, 0, &[1u8; B as usize]).unwrap();
    fs.write(f, 3 * B + 100, &[3u8; 200]).unwrap();
    fs.setattr(
        &root(),
        f,
        &SetAttr {
            size: Some(6 * B + 10),
            ..SetAttr::default()
        },
    )
    .unwrap();
    f
}

#[test]
fn seek_data_and_seek_hole_follow_the_extent_map() {
    let (_store, fs) = fresh();
    let f = sparse(&fs);
    let size = 6 * B + 10;
    assert_eq!(fs.seek(f, 0, Seek::Data).unwrap(), 0);
    assert_eq!(fs.seek(f, 0, Seek::Hole).unwrap(), B);
    assert_eq!(fs.seek(f, B, Seek::Data).unwrap(), 3 * B);
    assert_eq!(fs.seek(f, 3 * B + 5, Seek::Hole).unwrap(), 4 * B);
    assert_eq!(fs.seek(f, 5 * B, Seek::Hole).unwrap(), 5 * B);
    assert!(matches!(
        fs.seek(f, 4 * B, Seek::Data),
        Err(FsError::PastEnd)
    ));
    assert!(matches!(
        fs.seek(f, size, Seek::Hole),
        Err(FsError::PastEnd)
    ));
    // Reserved blocks read as zeros and count as a hole.
    fs.fallocate(f, 4 * B, 2 * B, FallocateMode::default())
        .unwrap();
    assert_eq!(fs.seek(f, 4 * B, Seek::Hole).unwrap(), 4 * B);
    assert!(matches!(
        fs.seek(f, 4 * B, Seek::Data),
        Err(FsError::PastEnd)
    ));
    let d = fs.mkdir(&root(), ROOT_INO, n("dir"), 0o755, 0).unwrap();
    assert!(matches!(fs.seek(d.ino, 0, Seek::Data), Err(FsError::IsDir)));
}

#[test]
fn copy_file_range_copies_data_and_keeps_holes() {
    let (_store, fs) = fresh();
    let src = sparse(&fs);
    let dst = mkfile(&fs, ROOT_INO, "dst", 0o644);
    // Data where the source has its first hole is punched out.
    fs.write(dst, B, &[9u8; 2 * B as usize]).unwrap();
    let size = 6 * B + 10;
    let (copied, _) = fs
        .copy_file_range(&root(), src, 0, dst, 0, 100 * B)
        .unwrap();
    assert_eq!(copied, size, "clipped at the source's end");
    let want = fs.read(src, 0, size as usize).unwrap();
    assert_eq!(fs.read(dst, 0, size as usize + 1).unwrap(), want);
    assert_eq!(fs.getattr(dst).unwrap().size, size);
    let mapped = |ino| {
        fs.extents(ino)
            .unwrap()
            .iter()
            .map(|(off, _, len)| (*off, *len))
            .collect::<Vec<_>>()
    };
    assert_eq!(mapped(dst), mapped(src), "holes stay holes");
    // Nothing to copy at or past the end; a destination past the end
    // grows the file.
    assert_eq!(
        fs.copy_file_range(&root(), src, size, dst, 0, 10).unwrap(),
        (0, false)
    );
    let (copied, _) = fs
        .copy_file_range(&root(), src, 3 * B + 100, dst, 50 * B, 200)
        .unwrap();
    assert_eq!(copied, 200);
    assert_eq!(fs.getattr(dst).unwrap().size, 50 * B + 200);
    assert_eq!(fs.read(dst, 50 * B, 300).unwrap(), vec![3u8; 200]);
    assert_eq!(fs.read(dst, 20 * B, 10).unwrap(), vec![0u8; 10]);
}

#[test]
fn copy_file_range_refusals_and_what_a_write_changes() {
    let (_store, fs) = fresh();
    let f = mkfile(&fs, ROOT_INO, "f", 0o644);
    fs.write(f, 0, &[5u8; 4 * B as usize]).unwrap();
    // Within one file: overlapping ranges are refused, disjoint ones copy.
    assert!(matches!(
        fs.copy_file_range(&root(), f, 0, f, B, 2 * B),
        Err(FsError::Invalid(_))
    ));
    assert_eq!(
        fs.copy_file_range(&root(), f, 0, f, 4 * B, 2 * B)
            .unwrap()
            .0,
        2 * B
    );
    assert_eq!(fs.getattr(f).unwrap().size, 6 * B);
    let d = fs.mkdir(&root(), ROOT_INO, n("d"), 0o755, 0).unwrap().ino;
    assert!(matches!(
        fs.copy_file_range(&root(), f, 0, d, 0, 1),
        Err(FsError::IsDir)
    ));
    assert!(matches!(
        fs.copy_file_range(&root(), f, 0, f, 1 << 50, 1),
        Err(FsError::TooBig)
    ));

    // A copy by anyone but root clears set-ID bits, as a write does, and
    // moves the destination's times.
    let dst = mkfile(&fs, ROOT_INO, "suid", 0o6755);
    let before = fs.getattr(dst).unwrap();
    let (copied, changed) = fs.copy_file_range(&user(1000), f, 0, dst, 0, B).unwrap();
    assert_eq!((copied, changed), (B, true));
    let after = fs.getattr(dst).unwrap();
    assert_eq!(after.perm, 0o755);
    assert!(after.mtime > before.mtime && after.ctime > before.ctime);
    let kept = mkfile(&fs, ROOT_INO, "kept", 0o6755);
    assert_eq!(
        fs.copy_file_range(&root(), f, 0, kept, 0, B).unwrap(),
        (B, false)
    );
    assert_eq!(fs.getattr(kept).unwrap().perm, 0o6755);
    // Set-group-ID without group execute stays for a member of the file's
    // group, and goes for anyone else, as with a write.
    let locked = mkfile(&fs, ROOT_INO, "locked", 0o2666);
    let member = Caller {
        uid: 1000,
        gid: 0,
        groups: Vec::new(),
    };
    assert_eq!(
        fs.copy_file_range(&member, f, 0, locked, 0, B).unwrap(),
        (B, false)
    );
    assert_eq!(fs.getattr(locked).unwrap().perm, 0o2666);
    assert_eq!(
        fs.copy_file_range(&user(1000), f, 0, locked, 0, B).unwrap(),
        (B, true)
    );
    assert_eq!(fs.getattr(locked).unwrap().perm, 0o666);
}

/// One write of a test file: (offset in blocks, byte offset into the
/// block, length, byte value).
fn writes() -> impl Strategy<Value = Vec<(u64, u64, u64, u8)>> {
    prop::collection::vec((0u64..12, 0..B, 1..2 * B, 1u8..255), 0..5)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// The destination reads as a byte model of the copy says, whatever
    /// the two files held; the source does not change.
    #[test]
    fn copy_file_range_agrees_with_a_model(
        src_writes in writes(),
        dst_writes in writes(),
        src_off in 0u64..(14 * B),
        dst_off in 0u64..(14 * B),
        len in 0u64..(10 * B),
    ) {
        let (_store, fs) = fresh();
        let mut files = Vec::new();
        for (name, ops) in [("src", &src_writes), ("dst", &dst_writes)] {
            let ino = mkfile(&fs, ROOT_INO, name, 0o644);
            let mut model = Vec::new();
            for &(block, at, n, byte) in ops {
                let off = block * B + at;
                fs.write(ino, off, &vec![byte; n as usize]).unwrap();
                let end = (off + n) as usize;
                if model.len() < end {
                    model.resize(end, 0);
                }
                model[off as usize..end].fill(byte);
            }
            files.push((ino, model));
        }
        let (dst, mut dst_model) = files.pop().unwrap();
        let (src, src_model) = files.pop().unwrap();
        let count = len.min((src_model.len() as u64).saturating_sub(src_off));
        let (copied, _) = fs.copy_file_range(&root(), src, src_off, dst, dst_off, len).unwrap();
        prop_assert_eq!(copied, count);
        if count > 0 {
            let end = (dst_off + count) as usize;
            if dst_model.len() < end {
                dst_model.resize(end, 0);
            }
            dst_model[dst_off as usize..end]
                .copy_from_slice(&src_model[src_off as usize..(src_off + count) as usize]);
        }
        let got = fs.read(dst, 0, dst_model.len() + B as usize).unwrap();
        prop_assert_eq!(got.len(), dst_model.len());
        prop_assert!(got == dst_model, "destination differs from the model");
        prop_assert!(fs.read(src, 0, src_model.len() + 1).unwrap() == src_model);
    }
}
