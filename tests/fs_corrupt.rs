//! Damaged metadata: one bad copy is survived through the mirror; no good
//! copy at all gives a clear `FsError::Corrupt`, never a panic.

use std::ffi::OsStr;
use std::sync::Arc;

use raidfs::fs::store::group_addr;
use raidfs::fs::teststore::MirrorStore;
use raidfs::fs::*;

const MIB: u64 = 1 << 20;

/// A filesystem with a file, a checkpoint and some journal records.
fn populated() -> Arc<MirrorStore> {
    let store = Arc::new(MirrorStore::new(4, 4 * MIB, 4096));
    FileSystem::format(store.clone()).unwrap();
    let fs = FileSystem::open(store.clone(), FsOptions::default()).unwrap();
    let f = fs
        .mknod(
            &Caller::root(),
            ROOT_INO,
            OsStr::new("kept"),
            0o100644,
            0,
            0,
        )
        .unwrap()
        .ino;
    fs.write(f, 0, b"precious").unwrap();
    fs.unmount().unwrap();
    let fs = FileSystem::open(store.clone(), FsOptions::default()).unwrap();
    fs.mknod(
        &Caller::root(),
        ROOT_INO,
        OsStr::new("journaled"),
        0o100644,
        0,
        0,
    )
    .unwrap();
    fs.sync_all().unwrap();
    drop(fs);
    store
}

fn check_contents(store: Arc<MirrorStore>) {
    let fs = FileSystem::open(store, FsOptions::default()).unwrap();
    let a = fs
        .lookup(&Caller::root(), ROOT_INO, OsStr::new("kept"))
        .unwrap();
    assert_eq!(fs.read(a.ino, 0, 100).unwrap(), b"precious");
    fs.lookup(&Caller::root(), ROOT_INO, OsStr::new("journaled"))
        .unwrap();
}

/// Every metadata block in use: headers, journal start, both checkpoint slots.
fn metadata_ranges() -> Vec<(u64, usize)> {
    // Corrupting the whole metadata group covers header, slots and journal
    // without depending on the layout.
    (0..(4 * MIB / 4096))
        .map(|b| (group_addr(0, b * 4096), 4096))
        .collect()
}

#[test]
fn one_bad_copy_of_all_metadata_still_opens() {
    for copy in 0..2 {
        let store = populated();
        for (addr, len) in metadata_ranges() {
            store.corrupt(copy, addr, len).unwrap();
        }
        check_contents(store.clone());
        assert!(fsck(store, false).unwrap().is_clean());
    }
}

#[test]
fn both_copies_bad_is_a_clear_error() {
    let store = populated();
    for (addr, len) in metadata_ranges() {
        store.corrupt(0, addr, len).unwrap();
        store.corrupt(1, addr, len).unwrap();
    }
    assert!(matches!(
        FileSystem::open(store.clone(), FsOptions::default()),
        Err(FsError::Corrupt(_))
    ));
    assert!(matches!(fsck(store, false), Err(FsError::Corrupt(_))));
}

#[test]
fn both_copies_of_the_header_bad_is_a_clear_error() {
    let store = populated();
    for copy in 0..2 {
        store.corrupt(copy, group_addr(0, 0), 8192).unwrap();
    }
    match FileSystem::open(store, FsOptions::default()) {
        Err(FsError::Corrupt(msg)) => assert!(msg.contains("header"), "{msg}"),
        Err(e) => panic!("wrong error {e}"),
        Ok(_) => panic!("opened without a header"),
    }
}

#[test]
fn one_header_copy_bad_is_reported_and_repaired_by_fsck() {
    let store = populated();
    store.corrupt(0, group_addr(0, 4096), 4096).unwrap();
    store.corrupt(1, group_addr(0, 4096), 4096).unwrap();
    let report = fsck(store.clone(), true).unwrap();
    assert!(!report.is_clean());
    assert!(report.repaired);
    assert!(fsck(store.clone(), false).unwrap().is_clean());
    check_contents(store);
}

#[test]
fn a_bad_journal_record_is_never_trusted() {
    let store = populated();
    // Find the journal: the first record follows the two header blocks.
    for copy in 0..2 {
        store.corrupt(copy, group_addr(0, 8192), 4096).unwrap();
    }
    // The record with "journaled" is rejected; the checkpointed state stays.
    let fs = FileSystem::open(store.clone(), FsOptions::default()).unwrap();
    assert!(fs
        .lookup(&Caller::root(), ROOT_INO, OsStr::new("kept"))
        .is_ok());
    assert!(matches!(
        fs.lookup(&Caller::root(), ROOT_INO, OsStr::new("journaled")),
        Err(FsError::NotFound)
    ));
}
