//! The damaged-data log: file blocks whose data no copy or parity could
//! correct (a checked read found every version failing its checksum, or
//! the array's check, repair or resync asked the content judge about every
//! version and none passed), as
//! `zpool status -v` lists a pool's permanent errors. `raidfs status -v`
//! and `raidfs detail` show them with their paths.
//!
//! An entry names the file (inode and generation), the file offset and
//! length, the block's address and the checksum it must match. It stands
//! only while all of that is still true, which is checked whenever the
//! log is read: deleting the file (its last name; or a new file taking its inode number),
//! truncating it below the range, or rewriting the block (a new address or
//! a new checksum) drops the entry without a hook in those paths. A block
//! rewritten with the very same bytes keeps its entry until
//! [`FileSystem::recheck_damaged`] (run by `raidfs repair`) reads it back.
//!
//! The log is kept on the host, not in the array: the mount daemon points
//! it at a file in its state directory named by the array's UUID
//! ([`FileSystem::keep_damaged_log`]), rewritten (to a temporary name, then
//! renamed) whenever an entry comes or goes; a later mount on the same host
//! loads it, and entries whose file changed meanwhile are dropped as above.
//!
//! [`FileSystem::recheck_damaged`]: super::FileSystem::recheck_damaged
//! [`FileSystem::keep_damaged_log`]: super::FileSystem::keep_damaged_log

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

use super::inode::{Inode, BLOCK_SIZE};
use super::meta::Meta;

/// Entries kept at most: a dying disk must not grow the log without bound.
const MAX_ENTRIES: usize = 4096;

/// The damaged-data entry for `inode`'s block at `addr`, which must match `csum`.
pub fn damaged_range_of(inode: &Inode, addr: u64, csum: u32) -> Option<DamagedRange> {
    let (file_off, e) = inode
        .extents
        .iter()
        .find(|(_, e)| addr >= e.addr && addr < e.addr + e.len)?;
    let offset = file_off + (addr - e.addr);
    Some(DamagedRange {
        ino: inode.ino,
        generation: inode.generation,
        offset,
        length: BLOCK_SIZE.min(inode.size.saturating_sub(offset)),
        addr,
        csum,
    })
}

/// One damaged block of a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DamagedRange {
    pub ino: u64,
    pub generation: u64,
    /// Byte offset in the file and length (a block, or less at its end).
    pub offset: u64,
    pub length: u64,
    /// The block's logical address and the checksum it must match.
    pub addr: u64,
    pub csum: u32,
}

impl DamagedRange {
    /// Whether the file still holds this block at this offset, unchanged.
    fn stands(&self, meta: &Meta) -> bool {
        let inode = match meta.inode(self.ino) {
            Ok(Some(inode)) => inode,
            Ok(None) => return false,
            // Unreadable now: kept, not judged.
            Err(_) => return true,
        };
        let mapped = inode.extents.iter().any(|(file_off, e)| {
            self.offset >= file_off
                && self.offset < file_off + e.len
                && e.addr + (self.offset - file_off) == self.addr
        });
        inode.generation == self.generation
            && inode.nlink > 0
            && self.offset < inode.size
            && mapped
            // Unreadable now: kept.
            && meta
                .csums
                .get(self.addr)
                .map_or(true, |c| c == Some(self.csum))
    }
}

#[derive(Serialize, Deserialize)]
struct Stored {
    version: u32,
    entries: Vec<DamagedRange>,
}

#[derive(Default)]
pub struct DamagedLog {
    entries: Mutex<Vec<DamagedRange>>,
    /// Blocks with no good copy whose file was not resident when they
    /// were found (address, checksum): looked up when the log is next read.
    deferred: Mutex<Vec<(u64, u32)>>,
    /// Where the log is kept (None: in memory only).
    file: Mutex<Option<PathBuf>>,
}

impl DamagedLog {
    /// Record `range`; false when it was already recorded.
    pub fn record(&self, range: DamagedRange) -> bool {
        let mut entries = self.entries.lock();
        if entries.contains(&range) {
            return false;
        }
        if entries.len() >= MAX_ENTRIES {
            log::warn!(
                "damaged-data log full ({MAX_ENTRIES} entries); inode {} at {} not recorded",
                range.ino,
                range.offset
            );
            return false;
        }
        entries.push(range);
        entries.sort_by_key(|r| (r.ino, r.offset));
        self.save(&entries);
        true
    }

    /// A block with no good copy, to be matched to its file later.
    pub fn defer(&self, addr: u64, csum: u32) {
        let mut deferred = self.deferred.lock();
        if deferred.len() < MAX_ENTRIES && !deferred.contains(&(addr, csum)) {
            deferred.push((addr, csum));
        }
    }

    /// Find the files of deferred blocks (a walk of every inode, which is
    /// rare: only blocks a scrub or resync found with no good version).
    fn resolve_deferred(&self, meta: &Meta) {
        let mut want = std::mem::take(&mut *self.deferred.lock());
        if want.is_empty() {
            return;
        }
        let walked = meta.for_each_ino(1024, &mut |inos| {
            for &ino in inos {
                let Some(inode) = meta.inode(ino)? else {
                    continue;
                };
                want.retain(|&(addr, csum)| match damaged_range_of(&inode, addr, csum) {
                    Some(range) => {
                        self.record(range);
                        false
                    }
                    None => true,
                });
            }
            Ok(!want.is_empty())
        });
        if let Err(e) = walked {
            log::warn!("damaged-data log: finding the files of blocks with no good copy: {e}");
            self.deferred.lock().extend(want);
        }
    }

    /// The entries that still stand in `meta`; those that do not are dropped.
    pub fn current(&self, meta: &Meta) -> Vec<DamagedRange> {
        self.resolve_deferred(meta);
        let mut entries = self.entries.lock();
        let before = entries.len();
        entries.retain(|r| r.stands(meta));
        if entries.len() != before {
            self.save(&entries);
        }
        entries.clone()
    }

    /// Drop `range` (it read back correctly).
    pub fn clear(&self, range: &DamagedRange) {
        let mut entries = self.entries.lock();
        let before = entries.len();
        entries.retain(|r| r != range);
        if entries.len() != before {
            self.save(&entries);
        }
    }

    /// Keep the log in `path` from now on, first taking the entries an
    /// earlier mount left there.
    pub fn keep_in(&self, path: &Path) -> Result<(), String> {
        let shown = path.display();
        let loaded: Vec<DamagedRange> = match std::fs::read(path) {
            Ok(bytes) => {
                let stored: Stored = serde_json::from_slice(&bytes)
                    .map_err(|e| format!("damaged-data log {shown}: unreadable: {e}"))?;
                stored.entries
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(format!("damaged-data log {shown}: {e}")),
        };
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)
                .map_err(|e| format!("damaged-data log: creating {}: {e}", dir.display()))?;
        }
        *self.file.lock() = Some(path.to_path_buf());
        let mut entries = self.entries.lock();
        for r in loaded {
            if !entries.contains(&r) && entries.len() < MAX_ENTRIES {
                entries.push(r);
            }
        }
        entries.sort_by_key(|r| (r.ino, r.offset));
        Ok(())
    }

    fn save(&self, entries: &[DamagedRange]) {
        let Some(path) = self.file.lock().clone() else {
            return;
        };
        let stored = Stored {
            version: 1,
            entries: entries.to_vec(),
        };
        let written = serde_json::to_vec_pretty(&stored)
            .map_err(std::io::Error::other)
            .and_then(|bytes| {
                let tmp = path.with_extension("tmp");
                std::fs::write(&tmp, bytes)?;
                std::fs::rename(&tmp, &path)
            });
        if let Err(e) = written {
            log::warn!(
                "cannot keep the damaged-data log in {}: {e}",
                path.display()
            );
        }
    }
}

impl super::FileSystem {
    /// File blocks no copy or parity could correct, that still stand
    /// (see the module header), by inode and offset.
    pub fn damaged_ranges(&self) -> Vec<DamagedRange> {
        let inner = &self.inner;
        let st = inner.state.read();
        inner.damaged.current(&st.meta)
    }

    /// Keep the damaged-data log in `path` (see the module header).
    pub fn keep_damaged_log(&self, path: &Path) -> Result<(), String> {
        self.inner.damaged.keep_in(path)
    }

    /// Read every damaged block again, through the checked path that tries
    /// every copy; entries that read back correctly are dropped. Returns
    /// how many still stand.
    pub fn recheck_damaged(&self) -> usize {
        let inner = &self.inner;
        let kind = inner.csum;
        let mut left = 0;
        for range in self.damaged_ranges() {
            let _file = inner.file_lock(range.ino);
            let mut buf = vec![0u8; super::BLOCK_SIZE as usize];
            let want = range.csum;
            let good = inner
                .store
                .read(
                    range.addr,
                    &mut buf,
                    Some(&|b: &[u8]| kind.block(b) == want),
                )
                .is_ok();
            if good {
                log::info!(
                    "inode {} at offset {}: reads back correctly now; off the damaged-data log",
                    range.ino,
                    range.offset
                );
                inner.damaged.clear(&range);
            } else {
                left += 1;
            }
        }
        left
    }
}
