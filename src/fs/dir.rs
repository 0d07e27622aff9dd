//! Directory contents: name → (inode, cookie) plus cookie → name, so lookup
//! and insert are O(log n) and readdir can resume after any cookie even while
//! entries come and go. Cookies come from a per-directory counter that never
//! goes back; 1 and 2 are "." and "..".
//!
//! A directory is *complete* (every entry here: a new directory, or a
//! filesystem held whole in memory) or, over a metadata tree, an *overlay*
//! of what changed since the last checkpoint applied its entries: names
//! inserted (with their new cookies) and names removed; every other name is
//! as the tree holds it ([`super::meta::Meta::dir_get`] asks it).

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

pub const DOT_COOKIE: u64 = 1;
pub const DOTDOT_COOKIE: u64 = 2;
pub const FIRST_COOKIE: u64 = 3;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Slot {
    pub ino: u64,
    pub cookie: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dir {
    entries: BTreeMap<Vec<u8>, Slot>,
    by_cookie: BTreeMap<u64, Vec<u8>>,
    next_cookie: u64,
    /// Every entry is in `entries`; otherwise they are an overlay on the tree.
    complete: bool,
    /// Overlay only: names removed since the tree's entries were written.
    removed: BTreeSet<Vec<u8>>,
}

impl Default for Dir {
    fn default() -> Self {
        Dir {
            entries: BTreeMap::new(),
            by_cookie: BTreeMap::new(),
            next_cookie: FIRST_COOKIE,
            complete: true,
            removed: BTreeSet::new(),
        }
    }
}

/// What a directory knows of a name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lookup {
    Found(Slot),
    Absent,
    /// Not changed since the tree's entries: ask the tree.
    AskTree,
}

/// The serialized form (the cookie index is rebuilt on load).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct DirImage {
    pub next_cookie: u64,
    pub entries: Vec<(Vec<u8>, Slot)>,
}

impl Dir {
    /// An overlay on the entries a tree holds, with nothing changed yet.
    pub fn over_tree(next_cookie: u64) -> Dir {
        Dir {
            complete: false,
            next_cookie: next_cookie.max(FIRST_COOKIE),
            ..Dir::default()
        }
    }

    pub fn is_complete(&self) -> bool {
        self.complete
    }

    /// The name's entry (a complete directory), or None.
    pub fn get(&self, name: &[u8]) -> Option<Slot> {
        match self.lookup(name) {
            Lookup::Found(slot) => Some(slot),
            Lookup::Absent | Lookup::AskTree => None,
        }
    }

    pub fn lookup(&self, name: &[u8]) -> Lookup {
        if let Some(slot) = self.entries.get(name) {
            return Lookup::Found(*slot);
        }
        if self.complete || self.removed.contains(name) {
            Lookup::Absent
        } else {
            Lookup::AskTree
        }
    }

    /// Whether the overlay hides a name the tree holds (removed, or
    /// inserted afresh with another cookie).
    pub fn hides(&self, name: &[u8]) -> bool {
        self.removed.contains(name) || self.entries.contains_key(name)
    }

    /// Entries held here: all of a complete directory's, an overlay's inserts.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Removals an overlay holds.
    pub fn removed_len(&self) -> usize {
        self.removed.len()
    }

    /// Once a checkpoint has written every change to the tree: an empty
    /// overlay from now on.
    pub fn settle(&mut self) {
        self.entries.clear();
        self.by_cookie.clear();
        self.removed.clear();
        self.complete = false;
    }

    /// Insert (or replace) `name` with a fresh cookie; returns the cookie.
    pub fn insert(&mut self, name: &[u8], ino: u64) -> u64 {
        let cookie = self.next_cookie;
        self.insert_with_cookie(name, ino, cookie);
        cookie
    }

    /// Insert with a given cookie (journal replay); keeps the counter ahead of it.
    pub fn insert_with_cookie(&mut self, name: &[u8], ino: u64, cookie: u64) {
        if let Some(old) = self.entries.insert(name.to_vec(), Slot { ino, cookie }) {
            self.by_cookie.remove(&old.cookie);
        }
        self.removed.remove(name);
        self.by_cookie.insert(cookie, name.to_vec());
        self.next_cookie = self.next_cookie.max(cookie.saturating_add(1));
    }

    /// Remove `name`; its entry if this directory held it. An overlay
    /// records the removal whether or not it held the entry (the caller
    /// knows from the tree that the name exists).
    pub fn remove(&mut self, name: &[u8]) -> Option<Slot> {
        if !self.complete {
            self.removed.insert(name.to_vec());
        }
        let slot = self.entries.remove(name)?;
        self.by_cookie.remove(&slot.cookie);
        Some(slot)
    }

    /// The cookie the next insertion gets: every entry inserted from now on,
    /// including one renamed (which is removed and inserted afresh), has a
    /// cookie at or above it.
    pub fn next_cookie(&self) -> u64 {
        self.next_cookie
    }

    /// Entries with a cookie greater than `after` and below `end`, in cookie
    /// order.
    pub fn between(&self, after: u64, end: u64) -> impl Iterator<Item = (u64, &[u8], u64)> + '_ {
        let start = after.saturating_add(1).max(FIRST_COOKIE);
        // An empty range when a caller resumes at or past its end (range()
        // would panic on start > end).
        self.by_cookie
            .range(start..end.max(start))
            .filter_map(move |(cookie, name)| {
                self.entries
                    .get(name)
                    .map(|slot| (*cookie, name.as_slice(), slot.ino))
            })
    }

    pub fn iter(&self) -> impl Iterator<Item = (&[u8], Slot)> + '_ {
        self.entries.iter().map(|(n, s)| (n.as_slice(), *s))
    }

    pub fn image(&self) -> DirImage {
        DirImage {
            next_cookie: self.next_cookie,
            entries: self.entries.iter().map(|(n, s)| (n.clone(), *s)).collect(),
        }
    }

    pub fn from_image(img: DirImage) -> Dir {
        let mut dir = Dir::default();
        for (name, slot) in img.entries {
            dir.insert_with_cookie(&name, slot.ino, slot.cookie);
        }
        dir.next_cookie = dir.next_cookie.max(img.next_cookie);
        dir
    }
}
