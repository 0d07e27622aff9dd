//! Inodes read from the metadata tree and not changed since: a cache with a
//! byte budget, so the daemon's memory follows the cache size and not the
//! number of files.
//!
//! A mounted filesystem with a metadata tree keeps three kinds of inode:
//! those changed since the last checkpoint applied them to the tree (held
//! whole in [`super::meta::Meta::inodes`], authoritative, never evicted),
//! those deleted since then (tombstones, so a stale tree copy is not read
//! back), and clean copies of what the tree holds (here). A clean copy is
//! equal to the tree's value: the tree changes only when a checkpoint
//! applies the changed inodes, and those are moved here as they are
//! applied. Eviction is CLOCK (a second chance for an entry read since the
//! hand last passed it), by bytes.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use super::dir::Slot;
use super::inode::Inode;
use super::{FileKind, FsResult};

/// A directory entry as the tree lists it by cookie.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listed {
    pub cookie: u64,
    pub name: Vec<u8>,
    pub ino: u64,
    pub kind: FileKind,
}

/// Where metadata that is not resident is read from (the metadata tree).
pub trait MetaSource: Send + Sync {
    /// The inode as the tree holds it, or None when it holds none.
    fn load(&self, ino: u64) -> FsResult<Option<Inode>>;
    /// Only the inode's kind (one key, without its extents and xattrs).
    fn kind(&self, ino: u64) -> FsResult<Option<FileKind>>;
    /// Up to `max` inode numbers the tree holds, from `start` on, in order.
    fn inos_from(&self, start: u64, max: usize) -> FsResult<Vec<u64>>;
    /// The entry of `name` in directory `dir`.
    fn dirent(&self, dir: u64, name: &[u8]) -> FsResult<Option<Slot>>;
    /// Up to `max` entries of `dir` with cookies in `[from, end)`, in
    /// cookie order.
    fn listed(&self, dir: u64, from: u64, end: u64, max: usize) -> FsResult<Vec<Listed>>;
    /// Up to `max` names of `dir` after `after` (from the first when
    /// None), in name order.
    fn names(&self, dir: u64, after: Option<&[u8]>, max: usize) -> FsResult<Vec<Vec<u8>>>;
    /// Every entry naming `ino` (directory, name), up to `max`: a walk of
    /// every directory entry, for reports.
    fn names_of(&self, ino: u64, max: usize) -> FsResult<Vec<(u64, Vec<u8>)>>;
    /// The checksum chunk `key` as the tree stores it.
    fn csum_chunk(&self, key: u64) -> FsResult<Option<Vec<u8>>>;
}

/// The default budget (`-o metadata_cache`).
pub const DEFAULT_CACHE_BYTES: u64 = 64 << 20;

/// What one resident inode costs, roughly: the struct, its map slot and
/// Arc, and what its extents, xattrs and target hold on the heap.
pub fn weight(inode: &Inode) -> u64 {
    let xattrs: usize = inode
        .xattrs
        .iter()
        .map(|(k, v)| k.len() + v.len() + 64)
        .sum();
    (std::mem::size_of::<Inode>() + 64 + inode.target.len() + xattrs) as u64
        + inode.extents.count() as u64 * 48
}

struct Entry {
    inode: Arc<Inode>,
    weight: u64,
    referenced: bool,
}

/// Clean inodes under a byte budget.
pub struct CleanInodes {
    map: HashMap<u64, Entry>,
    /// The CLOCK's order: every resident entry once (entries removed by
    /// other paths are skipped when the hand meets them).
    hand: VecDeque<u64>,
    bytes: u64,
    budget: u64,
}

impl std::fmt::Debug for CleanInodes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CleanInodes")
            .field("resident", &self.map.len())
            .field("bytes", &self.bytes)
            .field("budget", &self.budget)
            .finish()
    }
}

impl CleanInodes {
    pub fn new(budget: u64) -> CleanInodes {
        CleanInodes {
            map: HashMap::new(),
            hand: VecDeque::new(),
            bytes: 0,
            budget,
        }
    }

    pub fn get(&mut self, ino: u64) -> Option<Arc<Inode>> {
        let e = self.map.get_mut(&ino)?;
        e.referenced = true;
        Some(Arc::clone(&e.inode))
    }

    /// Keep a clean copy (replacing any older one), then evict down to the
    /// budget. A budget of zero keeps nothing.
    pub fn insert(&mut self, inode: Arc<Inode>) {
        let ino = inode.ino;
        let weight = weight(&inode);
        let old = self.map.insert(
            ino,
            Entry {
                inode,
                weight,
                referenced: false,
            },
        );
        match old {
            Some(old) => self.bytes -= old.weight,
            None => self.hand.push_back(ino),
        }
        self.bytes += weight;
        self.evict();
    }

    /// Drop the copy of `ino` (it is about to change, or is gone).
    pub fn take(&mut self, ino: u64) -> Option<Arc<Inode>> {
        let e = self.map.remove(&ino)?;
        self.bytes -= e.weight;
        Some(e.inode)
    }

    fn evict(&mut self) {
        while self.bytes > self.budget {
            let Some(ino) = self.hand.pop_front() else {
                break;
            };
            let Some(e) = self.map.get_mut(&ino) else {
                continue;
            };
            if e.referenced {
                e.referenced = false;
                self.hand.push_back(ino);
                continue;
            }
            if let Some(e) = self.map.remove(&ino) {
                self.bytes -= e.weight;
            }
        }
        // Entries taken by other paths leave their numbers behind; keep
        // the hand from growing past the map it walks.
        if self.hand.len() > 2 * self.map.len() + 1024 {
            let map = &self.map;
            self.hand.retain(|ino| map.contains_key(ino));
        }
    }

    /// A resident inode that `pred` accepts (not counted as a use).
    pub fn find(&self, pred: &dyn Fn(&Inode) -> bool) -> Option<Arc<Inode>> {
        self.map
            .values()
            .find(|e| pred(&e.inode))
            .map(|e| Arc::clone(&e.inode))
    }

    pub fn resident(&self) -> usize {
        self.map.len()
    }

    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inode(ino: u64) -> Arc<Inode> {
        Arc::new(Inode::new(ino, 1, FileKind::File, 0o644, 0, 0))
    }

    #[test]
    fn the_cache_stays_within_its_budget_and_keeps_what_is_read() {
        let one = weight(&inode(1));
        let mut c = CleanInodes::new(10 * one);
        for ino in 0..10 {
            c.insert(inode(ino));
        }
        assert_eq!(c.resident(), 10);
        // Inode 0 is read; the next insert evicts inode 1, not 0.
        assert!(c.get(0).is_some());
        c.insert(inode(10));
        assert!(c.bytes() <= 10 * one);
        assert!(
            c.get(0).is_some(),
            "a referenced inode gets a second chance"
        );
        assert!(
            c.get(1).is_none(),
            "the oldest unreferenced inode went first"
        );
        for ino in 11..10_000 {
            c.insert(inode(ino));
            assert!(c.bytes() <= 10 * one);
        }
        assert!(c.hand.len() <= 2 * c.resident() + 1024);
    }

    #[test]
    fn a_zero_budget_keeps_nothing() {
        let mut c = CleanInodes::new(0);
        c.insert(inode(5));
        assert_eq!(c.resident(), 0);
        assert!(c.get(5).is_none());
    }

    #[test]
    fn taking_an_inode_returns_its_bytes() {
        let mut c = CleanInodes::new(u64::MAX);
        c.insert(inode(5));
        c.insert(inode(6));
        let before = c.bytes();
        assert_eq!(c.take(5).map(|i| i.ino), Some(5));
        assert_eq!(c.bytes(), before - weight(&inode(5)));
        assert!(c.take(5).is_none());
    }
}
