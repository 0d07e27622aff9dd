//! The mutable state behind the metadata lock: the metadata itself, the
//! allocator, open counts and the batch of changes not yet journaled, with the
//! small helpers every operation uses to change metadata *and* record it.

use std::collections::{BTreeSet, HashMap, HashSet};

use super::alloc::Allocator;
use super::dir::{Dir, Slot};
use super::extent::Extent;
use super::inode::{Inode, Time};
use super::meta::{CommitRecord, DirOp, InodeRef, Meta};
use super::{FileKind, FsError, FsResult};

/// Changes since the last commit.
#[derive(Debug, Default)]
pub struct Batch {
    /// Inodes whose image must be logged (or whose deletion, if gone).
    pub dirty: BTreeSet<u64>,
    pub dir_ops: Vec<DirOp>,
    /// Extents freed in this batch: reusable only once the batch is durable,
    /// so a crash can never leave a committed file pointing at reused blocks.
    pub freed: Vec<Extent>,
    /// Data block checksums set in this batch (first block, one per block).
    pub csum_sets: Vec<(u64, Vec<u32>)>,
}

impl Batch {
    pub fn is_empty(&self) -> bool {
        self.dirty.is_empty()
            && self.dir_ops.is_empty()
            && self.freed.is_empty()
            && self.csum_sets.is_empty()
    }

    pub fn size_hint(&self) -> usize {
        self.dirty.len() + self.dir_ops.len()
    }
}

#[derive(Debug, Default)]
pub struct State {
    pub meta: Meta,
    pub alloc: Allocator,
    pub batch: Batch,
    pub open_counts: HashMap<u64, u32>,
    /// O_TMPFILE files that may still be given a first name (`link`);
    /// memory only, since an orphan does not outlive a crash.
    pub linkable: HashSet<u64>,
}

pub const MAX_NAME: usize = 255;
pub const MAX_LINKS: u32 = 65000;

pub fn check_name(name: &[u8]) -> FsResult<()> {
    if name.is_empty() || name.contains(&b'/') || name.contains(&0) {
        return Err(FsError::Invalid("bad file name"));
    }
    if name.len() > MAX_NAME {
        return Err(FsError::NameTooLong);
    }
    Ok(())
}

impl State {
    pub fn inode(&self, ino: u64) -> FsResult<InodeRef<'_>> {
        self.meta.inode(ino)?.ok_or(FsError::Stale)
    }

    pub fn inode_mut(&mut self, ino: u64) -> FsResult<&mut Inode> {
        let inode = self.meta.inode_mut(ino)?.ok_or(FsError::Stale)?;
        self.batch.dirty.insert(ino);
        Ok(inode)
    }

    pub fn dir(&self, ino: u64) -> FsResult<&Dir> {
        match self.meta.dirs.get(&ino) {
            Some(d) => Ok(d),
            None if self.meta.has_inode(ino)? => Err(FsError::NotDir),
            None => Err(FsError::Stale),
        }
    }

    pub fn new_inode(&mut self, kind: FileKind, perm: u16, uid: u32, gid: u32) -> u64 {
        let ino = self.meta.next_ino;
        self.meta.next_ino += 1;
        let generation = self.meta.next_gen;
        self.meta.next_gen += 1;
        let inode = Inode::new(ino, generation, kind, perm, uid, gid);
        if kind == FileKind::Dir {
            self.meta.dirs.insert(ino, Dir::default());
        }
        self.meta.insert_new(inode);
        self.batch.dirty.insert(ino);
        ino
    }

    pub fn dir_insert(&mut self, dir: u64, name: &[u8], ino: u64) -> FsResult<()> {
        let d = self.meta.dirs.get_mut(&dir).ok_or(FsError::NotDir)?;
        let cookie = d.insert(name, ino);
        self.batch.dir_ops.push(DirOp::Insert {
            dir,
            name: name.to_vec(),
            ino,
            cookie,
        });
        Ok(())
    }

    /// Remove the entry `name` of `dir`, which the caller has found
    /// ([`State::dir_get`]): no second lookup.
    pub fn dir_remove(&mut self, dir: u64, name: &[u8]) {
        if let Some(d) = self.meta.dirs.get_mut(&dir) {
            d.remove(name);
            self.batch.dir_ops.push(DirOp::Remove {
                dir,
                name: name.to_vec(),
            });
        }
    }

    /// The entry of `name` in directory `dir`.
    pub fn dir_get(&self, dir: u64, name: &[u8]) -> FsResult<Option<Slot>> {
        self.dir(dir)?;
        self.meta.dir_get(dir, name)
    }

    /// Whether directory `dir` has no entry.
    pub fn dir_is_empty(&self, dir: u64) -> FsResult<bool> {
        self.dir(dir)?;
        self.meta.dir_is_empty(dir)
    }

    pub fn touch_mc(&mut self, ino: u64) {
        let now = Time::now();
        if let Ok(i) = self.inode_mut(ino) {
            i.mtime = now;
            i.ctime = now;
        }
    }

    pub fn touch_c(&mut self, ino: u64) {
        let now = Time::now();
        if let Ok(i) = self.inode_mut(ino) {
            i.ctime = now;
        }
    }

    pub fn is_open(&self, ino: u64) -> bool {
        self.open_counts.get(&ino).is_some_and(|c| *c > 0)
    }

    /// Drop one name of `ino` (for a directory: its only name); frees the
    /// inode when no name and no open handle is left.
    pub fn drop_link(&mut self, ino: u64) -> FsResult<()> {
        let inode = self.inode_mut(ino)?;
        if inode.kind == FileKind::Dir {
            inode.nlink = 0;
        } else {
            inode.nlink = inode.nlink.saturating_sub(1);
        }
        inode.ctime = Time::now();
        if inode.nlink == 0 && !self.is_open(ino) {
            self.free_inode(ino)?;
        }
        Ok(())
    }

    /// Delete the inode and free its extents (once this batch is durable).
    /// An error (the inode could not be read) changes nothing.
    pub fn free_inode(&mut self, ino: u64) -> FsResult<()> {
        if let Some(mut inode) = self.meta.remove_inode(ino)? {
            self.batch.freed.extend(inode.extents.take_all());
        }
        self.meta.dirs.remove(&ino);
        self.open_counts.remove(&ino);
        self.linkable.remove(&ino);
        self.batch.dirty.insert(ino);
        Ok(())
    }

    /// Record the checksums of blocks just written from `addr`.
    pub fn set_csums(&mut self, addr: u64, crcs: Vec<u32>) -> FsResult<()> {
        if crcs.is_empty() {
            return Ok(());
        }
        self.meta.csums.set(addr, &crcs)?;
        self.batch.csum_sets.push((addr, crcs));
        Ok(())
    }

    /// Take the batch as a journal record (inode images as they are now).
    /// The checksums of the extents it freed are dropped here, in the same
    /// step as the record (and any checkpoint image taken with it).
    pub fn take_record(&mut self) -> FsResult<(CommitRecord, Vec<Extent>)> {
        // First, while the batch is still here: removing may read chunks
        // from the tree, and doing it again after an error is harmless.
        for ext in &self.batch.freed {
            self.meta.csums.remove(ext.addr, ext.len)?;
        }
        let batch = std::mem::take(&mut self.batch);
        let mut rec = CommitRecord {
            next_ino: self.meta.next_ino,
            next_gen: self.meta.next_gen,
            dir_ops: batch.dir_ops,
            csum_sets: batch.csum_sets,
            csum_drops: batch.freed.clone(),
            ..Default::default()
        };
        for ino in batch.dirty {
            match self.meta.inodes.get(&ino) {
                Some(inode) => rec.puts.push(inode.clone()),
                None => rec.deleted.push(ino),
            }
        }
        Ok((rec, batch.freed))
    }

    /// Is `ancestor` on the ".." chain from `dir` up to the root?
    pub fn is_ancestor(&self, ancestor: u64, mut dir: u64) -> FsResult<bool> {
        for _ in 0..100_000 {
            if dir == ancestor {
                return Ok(true);
            }
            match self.meta.inode(dir)? {
                Some(i) if i.parent != dir => dir = i.parent,
                _ => return Ok(false),
            }
        }
        Ok(false)
    }
}
