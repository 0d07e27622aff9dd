//! Checked data reads. The common path reads a range once and checks every
//! block against its checksum in one pass; only when a block fails does the
//! slow path read that block again through the store's verified read, which
//! tries the other copies (or reconstructions), rewrites the bad copy and
//! counts it against its member. No version passing → `EIO`, never wrong data.

use super::super::core::Inner;
use super::super::csum_store::SharedCsums;
use super::super::damaged::damaged_range_of;
use super::super::data_errors::DataError;
use super::super::inode::{Inode, BLOCK_SIZE};
use super::super::store::StoreError;
use super::super::FsResult;
use crate::array::ContentJudge;

/// A mapped segment of a read, widened to whole blocks so each can be checked.
pub struct BlockRead {
    pub file_off: u64,
    pub len: u64,
    /// First block's address and the bytes to read from it.
    pub block_addr: u64,
    pub block_len: u64,
    /// Bytes of the first block before the segment starts.
    pub lead: u64,
    /// One entry per block (empty when checksums are off).
    pub expected: Vec<Option<u32>>,
}

impl BlockRead {
    pub fn plan(
        csums: &SharedCsums,
        checked: bool,
        file_off: u64,
        len: u64,
        addr: u64,
    ) -> FsResult<BlockRead> {
        if !checked {
            return Ok(BlockRead {
                file_off,
                len,
                block_addr: addr,
                block_len: len,
                lead: 0,
                expected: Vec::new(),
            });
        }
        // Extents are block aligned in the file and on the store, so the
        // widened range stays inside the same extent.
        let block_addr = addr / BLOCK_SIZE * BLOCK_SIZE;
        let block_end = (addr + len).div_ceil(BLOCK_SIZE) * BLOCK_SIZE;
        let block_len = block_end - block_addr;
        Ok(BlockRead {
            file_off,
            len,
            block_addr,
            block_len,
            lead: addr - block_addr,
            expected: csums.get_run(block_addr, (block_len / BLOCK_SIZE) as usize)?,
        })
    }
}

/// Where in its file `inode` maps the block at `addr`, if it does.
fn file_offset(inode: &Inode, addr: u64) -> Option<u64> {
    inode
        .extents
        .iter()
        .find(|(_, e)| addr >= e.addr && addr < e.addr + e.len)
        .map(|(file_off, e)| file_off + (addr - e.addr))
}

impl Inner {
    /// Read `buf.len()` bytes of file `ino` at `addr`, checking each block
    /// against `expected`. `file_locked`: the caller holds a lock covering these blocks.
    pub fn read_checked(
        &self,
        ino: u64,
        addr: u64,
        buf: &mut [u8],
        expected: &[Option<u32>],
        file_locked: bool,
    ) -> FsResult<()> {
        self.store.read(addr, buf, None)?;
        let bad = self.csum.mismatches(buf, expected);
        if bad.is_empty() {
            return Ok(());
        }
        self.heal(ino, addr, buf, &bad, file_locked)
    }

    /// Re-read the failing blocks through the verified path. Under the file
    /// lock and the metadata lock the blocks cannot be rewritten, freed or
    /// reused meanwhile, so the checksum looked up again here is the one the
    /// block must match (a concurrent in-place write may have changed it).
    fn heal(
        &self,
        ino: u64,
        addr: u64,
        buf: &mut [u8],
        bad: &[usize],
        file_locked: bool,
    ) -> FsResult<()> {
        let _file = if file_locked {
            None
        } else {
            Some(self.file_lock(ino))
        };
        let st = self.state.read();
        let kind = self.csum;
        let block = BLOCK_SIZE as usize;
        let inode = st.meta.inode(ino)?;
        for &i in bad {
            let at = addr + (i * block) as u64;
            let mapped_at = inode.as_deref().and_then(|n| file_offset(n, at));
            let want = match mapped_at {
                Some(_) => st.meta.csums.get(at)?,
                None => None,
            };
            let Some((want, offset)) = want.zip(mapped_at) else {
                // Unmapped by a racing truncate: nothing left to check against.
                continue;
            };
            let dest = &mut buf[i * block..(i + 1) * block];
            match self
                .store
                .read(at, dest, Some(&|b: &[u8]| kind.block(b) == want))
            {
                Ok(()) => {
                    log::warn!(
                        "inode {ino}: data block at {at:#x} failed its checksum; served from a good copy"
                    );
                    self.data_errors.record(DataError {
                        ino,
                        offset,
                        unrecoverable: false,
                    });
                }
                Err(e) => {
                    log::error!("inode {ino}: data block at {at:#x} has no good copy: {e}");
                    if matches!(e, StoreError::Unrecoverable(_)) {
                        self.data_errors.record(DataError {
                            ino,
                            offset,
                            unrecoverable: true,
                        });
                        if let Some(range) =
                            inode.as_deref().and_then(|n| damaged_range_of(n, at, want))
                        {
                            if self.damaged.record(range) {
                                log::error!(
                                    "inode {ino}: bytes {}..{} recorded as damaged (raidfs status -v)",
                                    range.offset,
                                    range.offset + range.length
                                );
                            }
                        }
                    }
                    return Err(e.into());
                }
            }
        }
        Ok(())
    }
}

/// The array's resync and scrub ask which version of a data block is right.
impl ContentJudge for Inner {
    fn block_size(&self) -> usize {
        BLOCK_SIZE as usize
    }

    fn judge(&self, addr: u64, data: &[u8]) -> Option<bool> {
        // Not through the state lock: its holder may be reading metadata
        // through the stripe our caller has locked.
        let want = self.judged_csums.judged(addr)?;
        Some(self.csum.block(data) == want)
    }

    fn prepare(&self, addr: u64, len: u64) {
        self.judged_csums.prepare(addr, len);
    }

    fn no_good_version(&self, addr: u64) {
        let Some(want) = self.judged_csums.judged(addr) else {
            return;
        };
        // Rare (a scrub or resync found every version wrong), so finding
        // the file by a walk of the resident inodes' extents is
        // affordable; not the tree's, whose reads could wait for the
        // stripe our caller has locked. For the same reason the state lock
        // is only tried. Without it, or when the file is not resident, the
        // block is found when the damaged list is next read.
        let Some(st) = self.state.try_read_recursive() else {
            self.damaged.defer(addr, want);
            return;
        };
        let found = st.meta.find_resident(&|n| file_offset(n, addr).is_some());
        let Some(inode) = found else {
            self.damaged.defer(addr, want);
            return;
        };
        let range = damaged_range_of(&inode, addr, want);
        if let Some(range) = range {
            if self.damaged.record(range) {
                log::error!(
                    "inode {}: bytes {}..{} have no good copy (found by a scrub); recorded as damaged",
                    range.ino,
                    range.offset,
                    range.offset + range.length
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::ffi::OsStr;
    use std::sync::Arc;
    use std::time::Duration;

    use crate::array::ContentJudge;
    use crate::fs::teststore::MemStore;
    use crate::fs::{Caller, FileSystem, FsOptions, ROOT_INO};

    /// The judge is asked under a stripe lock, while a metadata operation
    /// may hold the state lock and wait, through a tree read, for that
    /// stripe: it must answer without the state lock.
    #[test]
    fn the_content_judge_answers_while_the_state_lock_is_held() {
        let store = Arc::new(MemStore::new(16, 8 << 20, 64 << 10));
        FileSystem::format(Arc::clone(&store) as _).unwrap();
        let fs = FileSystem::open(Arc::clone(&store) as _, FsOptions::default()).unwrap();
        let root = Caller::root();
        let f = fs
            .create(&root, ROOT_INO, OsStr::new("f"), 0o644, 0, libc::O_RDWR)
            .unwrap();
        let data = vec![0x5au8; 4096];
        fs.write(f.ino, 0, &data).unwrap();
        fs.fsync(f.ino, false).unwrap();
        let addr = {
            let st = fs.inner.state.read();
            let inode = st.inode(f.ino).unwrap();
            let (_, e) = inode.extents.iter().next().expect("the file has an extent");
            e.addr
        };
        let held = fs.inner.state.write();
        let (tx, rx) = crossbeam_channel::bounded(1);
        let inner = Arc::clone(&fs.inner);
        let asked = data.clone();
        std::thread::spawn(move || {
            let mut wrong = asked.clone();
            wrong[0] ^= 1;
            let answers = (inner.judge(addr, &asked), inner.judge(addr, &wrong));
            // Every version wrong: recorded later, not waited for.
            inner.no_good_version(addr);
            let _ = tx.send(answers);
        });
        // A hang is the failure; the bound only turns it into a message.
        let answers = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("the judge waited for the state lock");
        assert_eq!(answers, (Some(true), Some(false)));
        drop(held);
        let damaged = fs.damaged_ranges();
        assert_eq!(
            damaged
                .iter()
                .map(|r| (r.ino, r.offset))
                .collect::<Vec<_>>(),
            vec![(f.ino, 0)],
            "the block with no good version is found once the lock is free"
        );
        fs.release(f.ino).unwrap();
    }
}
