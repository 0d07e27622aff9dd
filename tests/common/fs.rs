//! The filesystem layer driven directly (no FUSE) on an in-memory store.

use std::ffi::OsStr;
use std::sync::Arc;

use raidfs::fs::teststore::MemStore;
use raidfs::fs::{FileSystem, FsOptions};

/// A name as the filesystem takes it.
pub fn n(s: &str) -> &OsStr {
    OsStr::new(s)
}

/// A filesystem freshly formatted and opened on a [`MemStore`] of `groups`
/// groups of 8 MiB (stripes of 64 KiB), and the store.
pub fn fresh(groups: u32) -> (Arc<MemStore>, FileSystem) {
    let store = Arc::new(MemStore::new(groups, 8 << 20, 64 << 10));
    FileSystem::format(store.clone()).expect("format");
    let fs = FileSystem::open(store.clone(), FsOptions::default()).expect("open");
    (store, fs)
}

/// The names in directory `dir`, sorted, without `.` and `..`.
pub fn names(fs: &FileSystem, dir: u64) -> Vec<String> {
    let mut v: Vec<String> = fs
        .readdir(dir, 0, usize::MAX)
        .expect("readdir")
        .into_iter()
        .map(|e| String::from_utf8(e.name).expect("a UTF-8 name"))
        .filter(|n| n != "." && n != "..")
        .collect();
    v.sort();
    v
}
