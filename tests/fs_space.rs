//! Space at the filesystem layer, on an in-memory store: freed space is
//! usable at once, whole stripes freed go back to the store (which fills
//! them with poison, so a live block discarded by mistake shows), and the
//! statfs figures follow.

mod common;

use std::ffi::OsStr;
use std::sync::Arc;

use common::fs::fresh;
use raidfs::fs::store::BlockStore;
use raidfs::fs::*;

const MIB: u64 = 1 << 20;
const STRIPE: u64 = 64 << 10;

fn mkfile(fs: &FileSystem, name: &str) -> u64 {
    fs.mknod(&Caller::root(), ROOT_INO, OsStr::new(name), 0o100644, 0, 0)
        .expect("mknod")
        .ino
}

fn pattern(seed: u8, len: u64) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}

#[test]
fn space_freed_by_unlink_is_usable_at_once() {
    let (_store, fs) = fresh(3);
    let free = fs.statfs().expect("statfs").bfree;
    let f = mkfile(&fs, "big");
    fs.write(f, 0, &pattern(1, 14 * MIB)).expect("fill");
    fs.sync_all().expect("sync");
    fs.unlink(&Caller::root(), ROOT_INO, OsStr::new("big"))
        .expect("unlink");
    assert_eq!(
        fs.statfs().expect("statfs").bfree,
        free,
        "freed blocks count as free before the commit"
    );
    // No commit in between: the write must not fail while the frees wait.
    let g = mkfile(&fs, "again");
    let data = pattern(2, 14 * MIB);
    fs.write(g, 0, &data).expect("write of the freed size");
    assert!(fs.read(g, 0, data.len()).expect("read") == data);
}

#[test]
fn whole_stripes_freed_go_back_to_the_store_and_live_data_stays() {
    let (store, fs) = fresh(4);
    let (a, b) = (mkfile(&fs, "a"), mkfile(&fs, "b"));
    let a_data = pattern(3, 3 * MIB + 4096);
    let b_data = pattern(4, 3 * MIB - 4096);
    fs.write(a, 0, &a_data).expect("write a");
    fs.write(b, 0, &b_data).expect("write b");
    fs.sync_all().expect("sync");
    assert_eq!(store.discarded_bytes(), 0, "nothing freed yet");
    fs.unlink(&Caller::root(), ROOT_INO, OsStr::new("a"))
        .expect("unlink");
    fs.sync_all().expect("sync");
    let discarded = store.discarded_bytes();
    // a's blocks hold 3 MiB + 4 KiB; the stripe it shares with b stays.
    assert!(
        (3 * MIB - STRIPE..=3 * MIB + STRIPE).contains(&discarded),
        "discarded {discarded} bytes of a 3 MiB file"
    );
    assert_eq!(discarded % STRIPE, 0, "whole stripes only");
    assert!(fs.read(b, 0, b_data.len()).expect("read b") == b_data);
    // The discarded space is allocated again and holds new data.
    let c = mkfile(&fs, "c");
    let c_data = pattern(5, 3 * MIB);
    fs.write(c, 0, &c_data).expect("write c");
    fs.sync_all().expect("sync");
    assert!(fs.read(c, 0, c_data.len()).expect("read c") == c_data);
    // Truncating gives the tail's stripes back too.
    let before = store.discarded_bytes();
    fs.setattr(
        &Caller::root(),
        c,
        &SetAttr {
            size: Some(MIB),
            ..SetAttr::default()
        },
    )
    .expect("truncate");
    fs.sync_all().expect("sync");
    assert!(store.discarded_bytes() >= before + 2 * MIB - STRIPE);
    assert!(fs.read(c, 0, MIB as usize).expect("read c") == c_data[..MIB as usize]);
    fs.unmount().expect("unmount");
    let dyn_store: Arc<dyn BlockStore> = store.clone();
    let report = fsck(dyn_store, false).expect("fsck");
    assert!(report.is_clean(), "{report:?}");
    let fs = FileSystem::open(store, FsOptions::default()).expect("reopen");
    assert!(fs.read(b, 0, b_data.len()).expect("read b") == b_data);
}

#[test]
fn statfs_counts_inodes_from_free_space() {
    let (_store, fs) = fresh(3);
    let s = fs.statfs().expect("statfs");
    assert_eq!(s.ffree, s.bfree * 4096 / INODE_COST);
    assert_eq!(s.files - s.ffree, 1, "the root directory");
    for i in 0..10 {
        mkfile(&fs, &format!("f{i}"));
    }
    let t = fs.statfs().expect("statfs");
    assert_eq!(t.files - t.ffree, 11);
    assert!(
        t.files < u32::MAX as u64,
        "a real figure, not a placeholder"
    );
}
