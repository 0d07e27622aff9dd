//! The metadata as held in memory (authoritative while mounted), its full
//! image for checkpoints, and the logical journal records that move it
//! forward: each record carries the images of the inodes a batch touched and
//! the directory entry changes, in order. Replaying a record is idempotent.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use super::csum::CsumMap;
use super::dir::{Dir, DirImage};
use super::extent::Extent;
use super::inode::Inode;

#[derive(Debug, Default)]
pub struct Meta {
    pub inodes: HashMap<u64, Inode>,
    pub dirs: HashMap<u64, Dir>,
    pub next_ino: u64,
    pub next_gen: u64,
    /// Checksums of the data blocks files point at.
    pub csums: CsumMap,
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
    pub csums: &'a CsumMap,
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
    pub fn image(&self) -> MetaImageRef<'_> {
        let mut inodes: Vec<&Inode> = self.inodes.values().collect();
        inodes.sort_by_key(|i| i.ino);
        let mut dirs: Vec<(u64, DirImage)> =
            self.dirs.iter().map(|(&ino, d)| (ino, d.image())).collect();
        dirs.sort_by_key(|d| d.0);
        MetaImageRef {
            next_ino: self.next_ino,
            next_gen: self.next_gen,
            inodes,
            dirs,
            csums: &self.csums,
        }
    }

    pub fn from_image(img: MetaImage) -> Meta {
        let mut meta = Meta {
            next_ino: img.next_ino,
            next_gen: img.next_gen,
            csums: img.csums,
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
    pub fn apply(&mut self, rec: CommitRecord) {
        self.next_ino = self.next_ino.max(rec.next_ino);
        self.next_gen = self.next_gen.max(rec.next_gen);
        for inode in rec.puts {
            if inode.is_dir() {
                self.dirs.entry(inode.ino).or_default();
            }
            self.inodes.insert(inode.ino, inode);
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
            self.inodes.remove(&ino);
            self.dirs.remove(&ino);
        }
        for (addr, crcs) in rec.csum_sets {
            self.csums.set(addr, &crcs);
        }
        for ext in rec.csum_drops {
            self.csums.remove(ext.addr, ext.len);
        }
    }
}
