//! The metadata as held in memory (authoritative while mounted), its full
//! image for checkpoints, and the logical journal records that move it
//! forward: each record carries the images of the inodes a batch touched and
//! the directory entry changes, in order. Replaying a record is idempotent.
//!
//! Over a metadata tree the inodes are not all held: [`Meta::inodes`] holds
//! those changed since the last checkpoint applied them, and [`Lazy`] the
//! tombstones of those deleted since, a budgeted cache of clean copies and
//! the tree they are read from ([`super::inode_cache`]). Every inode is
//! reached through [`Meta::inode`] and [`Meta::inode_mut`], which read a
//! missing one from the tree.

use std::collections::{HashMap, HashSet};
use std::ops::Deref;
use std::sync::Arc;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use super::csum::CsumMap;
use super::csum_store::SharedCsums;
use super::dir::{Dir, DirImage, Lookup, Slot, FIRST_COOKIE};
use super::extent::Extent;
use super::inode::Inode;
use super::inode_cache::{CleanInodes, MetaSource};
use super::{FileKind, FsResult};

#[derive(Debug, Default)]
pub struct Meta {
    /// Every inode; over a metadata tree, those changed since the last
    /// checkpoint applied them (never evicted).
    pub inodes: HashMap<u64, Inode>,
    pub dirs: HashMap<u64, Dir>,
    pub next_ino: u64,
    pub next_gen: u64,
    /// Checksums of the data blocks files point at.
    pub csums: SharedCsums,
    /// Over a metadata tree: what the inodes not held in `inodes` are.
    pub lazy: Option<Lazy>,
}

/// The inodes of a tree-backed filesystem that [`Meta::inodes`] does not hold.
pub struct Lazy {
    source: Arc<dyn MetaSource>,
    clean: Mutex<CleanInodes>,
    /// Deleted since the last checkpoint applied the changes: the tree
    /// still holds them until then.
    gone: HashSet<u64>,
    /// Inodes that exist (statfs).
    count: u64,
}

impl std::fmt::Debug for Lazy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lazy")
            .field("clean", &*self.clean.lock())
            .field("gone", &self.gone.len())
            .field("count", &self.count)
            .finish()
    }
}

impl Lazy {
    /// `count`: the inodes the tree holds.
    pub fn new(source: Arc<dyn MetaSource>, budget: u64, count: u64) -> Lazy {
        Lazy {
            source,
            clean: Mutex::new(CleanInodes::new(budget)),
            gone: HashSet::new(),
            count,
        }
    }

    /// Clean inodes resident, and their bytes.
    pub fn resident(&self) -> (usize, u64) {
        let c = self.clean.lock();
        (c.resident(), c.bytes())
    }
}

/// A directory entry as [`Meta::dir_list`] lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub cookie: u64,
    pub name: Vec<u8>,
    pub ino: u64,
    /// The child's kind, when the listing knew it.
    pub kind: Option<FileKind>,
}

/// Where [`Meta::locate`] finds an inode.
enum Located<'a> {
    Held(&'a Inode),
    Clean(Arc<Inode>),
    /// Deleted, or never there.
    Absent,
    /// Only the tree can say.
    InTree(&'a Lazy),
}

/// An inode as [`Meta::inode`] finds it: held, or a clean shared copy.
pub enum InodeRef<'a> {
    Held(&'a Inode),
    Shared(Arc<Inode>),
}

impl Deref for InodeRef<'_> {
    type Target = Inode;

    fn deref(&self) -> &Inode {
        match self {
            InodeRef::Held(i) => i,
            InodeRef::Shared(i) => i,
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum DirOp {
    Insert {
        dir: u64,
        name: Vec<u8>,
        ino: u64,
        cookie: u64,
    },
    Remove {
        dir: u64,
        name: Vec<u8>,
    },
}

#[derive(Debug, Default, Serialize, Deserialize)]
pub struct CommitRecord {
    pub next_ino: u64,
    pub next_gen: u64,
    pub puts: Vec<Inode>,
    pub dir_ops: Vec<DirOp>,
    pub deleted: Vec<u64>,
    /// Checksums of data blocks written in the batch: (first block, one per block).
    pub csum_sets: Vec<(u64, Vec<u32>)>,
    /// Extents freed in the batch; their checksums are dropped.
    pub csum_drops: Vec<Extent>,
}

/// Borrowing form of [`MetaImage`] so a checkpoint is encoded without
/// cloning every inode.
#[derive(Serialize)]
pub struct MetaImageRef<'a> {
    pub next_ino: u64,
    pub next_gen: u64,
    pub inodes: Vec<&'a Inode>,
    pub dirs: Vec<(u64, DirImage)>,
    #[serde(serialize_with = "held_map")]
    pub csums: parking_lot::MappedRwLockReadGuard<'a, CsumMap>,
}

fn held_map<S: serde::Serializer>(
    map: &parking_lot::MappedRwLockReadGuard<'_, CsumMap>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    CsumMap::serialize(map, serializer)
}

#[derive(Deserialize)]
pub struct MetaImage {
    pub next_ino: u64,
    pub next_gen: u64,
    pub inodes: Vec<Inode>,
    pub dirs: Vec<(u64, DirImage)>,
    pub csums: CsumMap,
}

impl Meta {
    /// Where the inode is, without reading the tree.
    fn locate(&self, ino: u64) -> Located<'_> {
        if let Some(i) = self.inodes.get(&ino) {
            return Located::Held(i);
        }
        let Some(lazy) = &self.lazy else {
            return Located::Absent;
        };
        if lazy.gone.contains(&ino) {
            return Located::Absent;
        }
        match lazy.clean.lock().get(ino) {
            Some(i) => Located::Clean(i),
            None => Located::InTree(lazy),
        }
    }

    /// The inode, read from the tree when it is not resident.
    pub fn inode(&self, ino: u64) -> FsResult<Option<InodeRef<'_>>> {
        Ok(match self.locate(ino) {
            Located::Held(i) => Some(InodeRef::Held(i)),
            Located::Clean(i) => Some(InodeRef::Shared(i)),
            Located::Absent => None,
            Located::InTree(lazy) => lazy.source.load(ino)?.map(|inode| {
                let inode = Arc::new(inode);
                lazy.clean.lock().insert(Arc::clone(&inode));
                InodeRef::Shared(inode)
            }),
        })
    }

    /// Whether the inode exists.
    pub fn has_inode(&self, ino: u64) -> FsResult<bool> {
        Ok(self.kind_of(ino)?.is_some())
    }

    /// The inode's kind, without reading its extents and xattrs (readdir).
    pub fn kind_of(&self, ino: u64) -> FsResult<Option<FileKind>> {
        match self.locate(ino) {
            Located::Held(i) => Ok(Some(i.kind)),
            Located::Clean(i) => Ok(Some(i.kind)),
            Located::Absent => Ok(None),
            Located::InTree(lazy) => lazy.source.kind(ino),
        }
    }

    /// The inode, to change: held from now until the next checkpoint
    /// applies it.
    pub fn inode_mut(&mut self, ino: u64) -> FsResult<Option<&mut Inode>> {
        if !self.inodes.contains_key(&ino) {
            let Some(lazy) = &mut self.lazy else {
                return Ok(None);
            };
            if lazy.gone.contains(&ino) {
                return Ok(None);
            }
            let inode = match lazy.clean.get_mut().take(ino) {
                Some(shared) => Arc::try_unwrap(shared).unwrap_or_else(|s| (*s).clone()),
                None => match lazy.source.load(ino)? {
                    Some(i) => i,
                    None => return Ok(None),
                },
            };
            self.inodes.insert(ino, inode);
        }
        Ok(self.inodes.get_mut(&ino))
    }

    /// A new inode (its number never used before).
    pub fn insert_new(&mut self, inode: Inode) {
        if let Some(lazy) = &mut self.lazy {
            lazy.count += 1;
            lazy.gone.remove(&inode.ino);
        }
        self.inodes.insert(inode.ino, inode);
    }

    /// An inode's image as a journal record carries it (replay): new, or
    /// replacing the one of its number.
    pub fn put_inode(&mut self, inode: Inode) -> FsResult<()> {
        if let Some(lazy) = &mut self.lazy {
            if !self.inodes.contains_key(&inode.ino) {
                let ino = inode.ino;
                let exists = !lazy.gone.contains(&ino)
                    && (lazy.clean.get_mut().take(ino).is_some()
                        || lazy.source.kind(ino)?.is_some());
                if !exists {
                    lazy.count += 1;
                }
                lazy.gone.remove(&ino);
            }
        }
        self.inodes.insert(inode.ino, inode);
        Ok(())
    }

    /// Delete the inode; it is returned (read from the tree if need be) so
    /// its extents can be freed.
    pub fn remove_inode(&mut self, ino: u64) -> FsResult<Option<Inode>> {
        if self.inode_mut(ino)?.is_none() {
            return Ok(None);
        }
        let inode = self.inodes.remove(&ino);
        if let Some(lazy) = &mut self.lazy {
            lazy.gone.insert(ino);
            lazy.count = lazy.count.saturating_sub(1);
        }
        Ok(inode)
    }

    /// What is held in memory, for the log at each checkpoint.
    pub fn held_summary(&self) -> String {
        let (overlay, removed) = self
            .dirs
            .values()
            .fold((0, 0), |(o, r), d| (o + d.len(), r + d.removed_len()));
        let (clean, clean_bytes, gone) = match &self.lazy {
            Some(l) => {
                let (n, b) = l.resident();
                (n, b, l.gone.len())
            }
            None => (0, 0, 0),
        };
        format!(
            "{} inodes held, {gone} deleted, {clean} clean ({} KiB), {} directories with {overlay} entries and {removed} removals held, checksum chunks {} changed and {} clean",
            self.inodes.len(),
            clean_bytes >> 10,
            self.dirs.len(),
            self.csums.held().0,
            self.csums.held().1
        )
    }

    /// How many inodes exist.
    pub fn inode_count(&self) -> u64 {
        match &self.lazy {
            Some(lazy) => lazy.count,
            None => self.inodes.len() as u64,
        }
    }

    /// The entry of `name` in directory `dir` (None: no such name, or no
    /// such directory).
    pub fn dir_get(&self, dir: u64, name: &[u8]) -> FsResult<Option<Slot>> {
        let Some(d) = self.dirs.get(&dir) else {
            return Ok(None);
        };
        match d.lookup(name) {
            Lookup::Found(slot) => Ok(Some(slot)),
            Lookup::Absent => Ok(None),
            Lookup::AskTree => match &self.lazy {
                Some(lazy) => lazy.source.dirent(dir, name),
                None => Ok(None),
            },
        }
    }

    /// Whether directory `dir` has no entry.
    pub fn dir_is_empty(&self, dir: u64) -> FsResult<bool> {
        let Some(d) = self.dirs.get(&dir) else {
            return Ok(true);
        };
        if !d.is_empty() {
            return Ok(false);
        }
        let (false, Some(lazy)) = (d.is_complete(), &self.lazy) else {
            return Ok(true);
        };
        const BATCH: usize = 256;
        let mut after: Option<Vec<u8>> = None;
        loop {
            let names = lazy.source.names(dir, after.as_deref(), BATCH)?;
            if names.iter().any(|n| !d.hides(n)) {
                return Ok(false);
            }
            if names.len() < BATCH {
                return Ok(true);
            }
            after = names.last().cloned();
        }
    }

    /// Up to `max` entries of `dir` with cookies above `after` and below
    /// `end`, in cookie order, with the child's kind where the tree lists it.
    pub fn dir_list(&self, dir: u64, after: u64, end: u64, max: usize) -> FsResult<Vec<Entry>> {
        let Some(d) = self.dirs.get(&dir) else {
            return Ok(Vec::new());
        };
        let mut out: Vec<Entry> = d
            .between(after, end)
            .take(max)
            .map(|(cookie, name, ino)| Entry {
                cookie,
                name: name.to_vec(),
                ino,
                kind: None,
            })
            .collect();
        let (false, Some(lazy)) = (d.is_complete(), &self.lazy) else {
            return Ok(out);
        };
        let mut from = after.saturating_add(1).max(FIRST_COOKIE);
        let mut taken = 0;
        while taken < max && from < end {
            let batch = lazy.source.listed(dir, from, end, max)?;
            let Some(last) = batch.last().map(|l| l.cookie) else {
                break;
            };
            let full = batch.len() >= max;
            for l in batch.into_iter().filter(|l| !d.hides(&l.name)) {
                out.push(Entry {
                    cookie: l.cookie,
                    name: l.name,
                    ino: l.ino,
                    kind: Some(l.kind),
                });
                taken += 1;
            }
            if !full {
                break;
            }
            from = last.saturating_add(1);
        }
        out.sort_by_key(|e| e.cookie);
        out.truncate(max);
        Ok(out)
    }

    /// A directory and name that hold `ino` (the first found), for reports:
    /// over a metadata tree this walks every directory entry.
    pub fn name_of(&self, ino: u64) -> FsResult<Option<(u64, Vec<u8>)>> {
        for (&dir, d) in &self.dirs {
            if let Some((name, _)) = d.iter().find(|(_, slot)| slot.ino == ino) {
                return Ok(Some((dir, name.to_vec())));
            }
        }
        let Some(lazy) = &self.lazy else {
            return Ok(None);
        };
        for (dir, name) in lazy.source.names_of(ino, 64)? {
            if self.dirs.get(&dir).is_some_and(|d| !d.hides(&name)) {
                return Ok(Some((dir, name)));
            }
        }
        Ok(None)
    }

    /// A resident inode (held or a clean copy) that `pred` accepts,
    /// without reading the tree: for callers that must not wait for I/O.
    pub fn find_resident(&self, pred: &dyn Fn(&Inode) -> bool) -> Option<Arc<Inode>> {
        if let Some(i) = self.inodes.values().find(|i| pred(i)) {
            return Some(Arc::new(i.clone()));
        }
        let lazy = self.lazy.as_ref()?;
        let clean = lazy.clean.lock();
        clean.find(pred)
    }

    /// Whether an inode changed since the last checkpoint (held or deleted)
    /// rather than as the tree holds it.
    pub fn is_changed(&self, ino: u64) -> bool {
        self.inodes.contains_key(&ino) || self.lazy.as_ref().is_some_and(|l| l.gone.contains(&ino))
    }

    /// Once a checkpoint has applied every change to the tree: the held
    /// inodes become clean copies (evictable), the tombstones go.
    pub fn settle(&mut self) {
        self.csums.settle();
        let Some(lazy) = &mut self.lazy else {
            return;
        };
        let clean = lazy.clean.get_mut();
        for (_, inode) in self.inodes.drain() {
            clean.insert(Arc::new(inode));
        }
        lazy.gone.clear();
        for d in self.dirs.values_mut() {
            d.settle();
        }
    }

    /// Up to `max` inode numbers from `start` on, in order: the tree's
    /// and the held ones, without the deleted. Empty once none is left.
    pub fn inos_from(&self, mut start: u64, max: usize) -> FsResult<Vec<u64>> {
        let max = max.max(1);
        let mut held: Vec<u64> = self
            .inodes
            .keys()
            .copied()
            .filter(|&i| i >= start)
            .collect();
        held.sort_unstable();
        let Some(lazy) = &self.lazy else {
            held.truncate(max);
            return Ok(held);
        };
        loop {
            let from_tree = lazy.source.inos_from(start, max)?;
            // Past `end` the tree was not asked; held numbers beyond it
            // wait for the next call.
            let end = match from_tree.last() {
                Some(&last) if from_tree.len() >= max => last,
                _ => u64::MAX,
            };
            let mut out: Vec<u64> = from_tree
                .into_iter()
                .filter(|i| !lazy.gone.contains(i) && !self.inodes.contains_key(i))
                .collect();
            out.extend(held.iter().copied().filter(|&i| i >= start && i <= end));
            out.sort_unstable();
            out.truncate(max);
            if !out.is_empty() || end == u64::MAX {
                return Ok(out);
            }
            start = end + 1;
        }
    }

    /// Every inode number, in order, `batch` at a time (`f` returns false
    /// to stop).
    pub fn for_each_ino(
        &self,
        batch: usize,
        f: &mut dyn FnMut(&[u64]) -> FsResult<bool>,
    ) -> FsResult<()> {
        let mut start = 0;
        loop {
            let inos = self.inos_from(start, batch)?;
            let Some(&last) = inos.last() else {
                return Ok(());
            };
            if !f(&inos)? {
                return Ok(());
            }
            match last.checked_add(1) {
                Some(next) => start = next,
                None => return Ok(()),
            }
        }
    }

    /// The whole image (formats without a metadata tree, fsck, samples):
    /// an error over a tree mount, which does not hold it all.
    pub fn image(&self) -> FsResult<MetaImageRef<'_>> {
        let mut inodes: Vec<&Inode> = self.inodes.values().collect();
        inodes.sort_by_key(|i| i.ino);
        let mut dirs: Vec<(u64, DirImage)> =
            self.dirs.iter().map(|(&ino, d)| (ino, d.image())).collect();
        dirs.sort_by_key(|d| d.0);
        Ok(MetaImageRef {
            next_ino: self.next_ino,
            next_gen: self.next_gen,
            inodes,
            dirs,
            csums: self.csums.whole()?,
        })
    }

    pub fn from_image(img: MetaImage) -> Meta {
        let mut meta = Meta {
            next_ino: img.next_ino,
            next_gen: img.next_gen,
            csums: SharedCsums::new(img.csums),
            ..Default::default()
        };
        for inode in img.inodes {
            meta.inodes.insert(inode.ino, inode);
        }
        for (ino, d) in img.dirs {
            meta.dirs.insert(ino, Dir::from_image(d));
        }
        meta
    }

    /// Replay one record: inode images first (so directories created in the
    /// batch exist), then entry changes in order, then deletions; checksums
    /// set, then those of freed extents dropped (a block freed in a batch is
    /// never reused before that batch is durable, so no set follows a drop).
    pub fn apply(&mut self, rec: CommitRecord) -> FsResult<()> {
        self.next_ino = self.next_ino.max(rec.next_ino);
        self.next_gen = self.next_gen.max(rec.next_gen);
        for inode in rec.puts {
            if inode.is_dir() {
                self.dirs.entry(inode.ino).or_default();
            }
            self.put_inode(inode)?;
        }
        for op in rec.dir_ops {
            match op {
                DirOp::Insert {
                    dir,
                    name,
                    ino,
                    cookie,
                } => {
                    if let Some(d) = self.dirs.get_mut(&dir) {
                        d.insert_with_cookie(&name, ino, cookie);
                    }
                }
                DirOp::Remove { dir, name } => {
                    if let Some(d) = self.dirs.get_mut(&dir) {
                        d.remove(&name);
                    }
                }
            }
        }
        for ino in rec.deleted {
            self.remove_inode(ino)?;
            self.dirs.remove(&ino);
        }
        for (addr, crcs) in rec.csum_sets {
            self.csums.set(addr, &crcs)?;
        }
        for ext in rec.csum_drops {
            self.csums.remove(ext.addr, ext.len)?;
        }
        Ok(())
    }
}
