//! Giving space the filesystem freed back to the members' hosts: holes
//! punched in sparse image files, write-zeroes (which may unmap) on block
//! devices. A sparse image then shrinks when its files are deleted.
//!
//! The array stays consistent because a discarded range reads as zeros on
//! every member afterwards, and zeros are their own parity (P and Q of an
//! all-zero stripe are zero):
//! * parity levels discard whole stripes only, on every member, data and
//!   parity alike (part of a stripe would leave its parity covering bytes
//!   that are no longer there);
//! * mirrors and RAID0 discard any range, on every copy;
//! * nothing is discarded unless every working member can do it, nor while
//!   a rebuild, resync or check runs, nor while the array is suspended:
//!   the space then simply stays allocated on the host;
//! * the range is marked in the write-intent bitmap like a write, so a crash
//!   half way leaves a resync to make the stripes agree, and a member that
//!   refuses part way marks the range suspect for the same resync.

use super::io::{member_span, split, Piece};
use super::personality::DiscardPlan;
use super::worker::Op;
use super::{Array, ArrayResult, Region};

/// Logical bytes discarded under one hold of the stripe locks.
const BATCH: u64 = 64 << 20;

impl Array {
    /// Give logical `[addr, addr + len)`, which the filesystem no longer
    /// uses, back to the hosts of the members holding it. Returns the
    /// logical bytes given back: 0 when it could not be done now (see the
    /// module header), and for parity levels only the whole stripes inside
    /// the range count.
    pub fn discard(&self, addr: u64, len: u64) -> ArrayResult<u64> {
        if self.read_only || len == 0 {
            return Ok(0);
        }
        let span = usize::try_from(len).map_err(|_| super::ArrayError::OutOfRange(addr))?;
        let _pass = self.reshape_gate.enter((addr >> super::GROUP_SHIFT) as u32);
        let (region, offset) = self.region(addr, span)?;
        if !self.may_discard() {
            return Ok(0);
        }
        let unit = region.personality.discard_unit(&region.geometry);
        let lo = offset.div_ceil(unit) * unit;
        let hi = (offset + len) / unit * unit;
        let batch = (BATCH / unit).max(1) * unit;
        let mut at = lo;
        while at < hi {
            let end = (at + batch).min(hi);
            self.discard_span(&region, at, end - at)?;
            at = end;
        }
        Ok(hi.saturating_sub(lo))
    }

    /// Whether a discard may run now: every member that serves is whole,
    /// can discard, and no background work or suspension is under way.
    fn may_discard(&self) -> bool {
        if self.suspension().is_some() || self.sync_progress().is_some() {
            return false;
        }
        let serving: Vec<usize> = (0..self.slots.len())
            .filter(|&s| !self.is_failed(s))
            .collect();
        let whole = serving.iter().all(|&s| self.slots[s].is_whole());
        let members = self.present_members();
        whole
            && serving
                .iter()
                .all(|s| members.iter().any(|(slot, m)| slot == s && m.can_discard()))
    }

    /// Discard region-relative `[offset, offset + len)` (whole stripes for
    /// parity levels) on every working member, under the stripe locks and
    /// the write-intent bitmap.
    fn discard_span(&self, region: &Region, offset: u64, len: u64) -> ArrayResult<()> {
        let pieces = split(region, offset, len as usize);
        let (Some(first), Some(last)) = (pieces.first(), pieces.last()) else {
            return Ok(());
        };
        let (first, last) = (first.map.stripe, last.map.stripe);
        // Writes of these stripes still gathered or under way land first,
        // never after the discard.
        self.write_out_cached((region.group, first)..=(region.group, last))?;
        self.wait_unqueued(region.group, first, last)?;
        let _locks = self.lock_stripes(region.group, first..=last)?;
        let (runs, (start, end)) = self.discard_plan(region, offset, len, &pieces, (first, last));
        let runs: Vec<_> = runs
            .into_iter()
            .filter(|&(slot, _, _)| !self.is_failed(slot))
            .collect();
        self.with_intent(start, end, || {
            let jobs = runs
                .iter()
                .map(|&(slot, offset, len)| (slot, Op::Discard { offset, len }))
                .collect();
            let mut refused = false;
            let mut host = None;
            for (&(slot, at, n), outcome) in runs.iter().zip(self.pool.run(jobs)) {
                match outcome {
                    Ok(_) => {}
                    // Nothing changed on that member: where the others now
                    // read zeros the copies or the parity disagree, which a
                    // resync of the range puts right.
                    Err(e) if e.kind() == std::io::ErrorKind::Unsupported => refused = true,
                    Err(e) => {
                        host = host.or(self.write_failed(slot, &e, "discard", Some((at, at + n))));
                    }
                }
            }
            if refused {
                log::info!(
                    "raidfs: a member refused to discard member bytes {start}..{end} of group {}; resyncing them",
                    region.group
                );
                self.bitmap.mark_suspect(start, end);
            }
            match host {
                Some(e) => Err(e),
                None => self.ensure_writable(),
            }
        })
    }
}

/// The discard of the personalities without parity: every copy of every
/// piece, merged where a member's pieces are contiguous, and the member
/// span a write of the range would mark.
pub(super) fn every_target_plan(
    region: &Region,
    offset: u64,
    len: u64,
    pieces: &[Piece],
) -> DiscardPlan {
    let mut runs: Vec<(usize, u64, u64)> = Vec::new();
    for p in pieces {
        for t in &p.map.targets {
            let at = region.base + t.offset;
            match runs
                .iter_mut()
                .rev()
                .find(|r| r.0 == t.member && r.1 + r.2 == at)
            {
                Some(run) => run.2 += p.len as u64,
                None => runs.push((t.member, at, p.len as u64)),
            }
        }
    }
    (runs, member_span(region, offset, len as usize))
}
