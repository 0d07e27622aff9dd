//! What the layer above knows of the data. The array alone cannot tell
//! which of two disagreeing mirror copies is right, nor whether a parity
//! mismatch means bad parity or a bad data block: md takes the first copy
//! and recomputes parity, which after a crash can spread a copy the disk
//! lost or corrupted over the good one. A filesystem that checksums its
//! blocks can tell, so it registers a [`ContentJudge`], and resync, check
//! and repair ask it before choosing what to write (as btrfs and ZFS repair
//! from the copy that passes its checksum).

use std::sync::{Arc, Weak};

use super::Array;

pub trait ContentJudge: Send + Sync {
    /// The size of the blocks judged (bytes; logical addresses of blocks
    /// are multiples of it).
    fn block_size(&self) -> usize;

    /// Whether `data` (one block) is what the block at logical `addr` must
    /// hold; None when nothing is known of that block (no checksum).
    ///
    /// Called with a stripe lock held, so it must not wait for anything
    /// that may wait for a stripe lock.
    fn judge(&self, addr: u64, data: &[u8]) -> Option<bool>;

    /// Every version of the block at logical `addr` (each copy, or the
    /// block and its rebuild from parity) was judged wrong: the data is
    /// lost there, and the layer above may record it. Same locking rule
    /// as [`ContentJudge::judge`].
    fn no_good_version(&self, _addr: u64) {}

    /// The array is about to judge blocks of `[addr, addr + len)` under a
    /// stripe lock; called before, with none held, so the layer above can
    /// read what it needs (a judge must not wait for I/O).
    fn prepare(&self, _addr: u64, _len: u64) {}
}

impl Array {
    /// Let scrub and resync ask `judge` which version of a block is right.
    /// Held weakly: the filesystem owns it and may go away first.
    pub fn set_content_judge(&self, judge: Weak<dyn ContentJudge>) {
        *self.judge.write() = Some(judge);
    }

    pub(super) fn content_judge(&self) -> Option<Arc<dyn ContentJudge>> {
        self.judge.read().as_ref().and_then(Weak::upgrade)
    }

    /// Tell the judge which blocks it may be asked about next (with no
    /// stripe lock held).
    pub(super) fn prepare_judge(&self, addr: u64, len: u64) {
        if let Some(judge) = self.content_judge() {
            judge.prepare(addr, len);
        }
    }
}

/// Per block of a chunk whose copies disagree: which copy to keep. The
/// first copy, unless the judge rejects it and passes another (md keeps
/// the first copy; the judge only overrules it when it knows better).
pub(super) fn choose_copies(
    judge: &dyn ContentJudge,
    logical: u64,
    copies: &[&[u8]],
) -> Vec<usize> {
    let block = judge.block_size();
    let len = copies.first().map_or(0, |c| c.len());
    (0..len.div_ceil(block))
        .map(|b| {
            let range = b * block..((b + 1) * block).min(len);
            let first = &copies[0][range.clone()];
            if copies.iter().all(|c| c[range.clone()] == *first) {
                return 0;
            }
            let addr = logical + (b * block) as u64;
            if judge.judge(addr, first) != Some(false) {
                return 0;
            }
            let passing = (1..copies.len())
                .find(|&i| judge.judge(addr, &copies[i][range.clone()]) == Some(true));
            if passing.is_none() {
                judge.no_good_version(addr);
            }
            passing.unwrap_or(0)
        })
        .collect()
}
