//! Scrub: read every stripe of allocated groups and compare its redundancy
//! (parity recomputed from the data, or every mirror copy against the first),
//! counting mismatched bytes as md's mismatch_cnt does; repair rewrites the
//! parity or the other copies, unless the filesystem's content judge shows
//! that the data or the first copy is what is wrong (see `judge`). The
//! comparisons are the personalities' (`Array::scrub_rows`); this module
//! holds what they share, the walk over allocated groups that check,
//! repair and resync make, and the scrub checkpoint.
//!
//! A check or repair records how far it got in the superblocks
//! ([`ScrubCheckpoint`], written with every progress checkpoint), so one
//! that is paused (`raidfs check --stop`), interrupted by an unmount or
//! killed with its daemon resumes there when it is next started, as
//! mdcheck's `--continue` does; a finished one clears it.

use super::background::{percent, SyncAction};
use super::pace::Pacer;
use super::worker::Op;
use super::{Array, ArrayError, ArrayResult};
use crate::superblock::ScrubCheckpoint;
use serde::Serialize;
use std::sync::atomic::{AtomicU64, Ordering};

/// Member bytes handled per step of scrub and resync (rebuilds have their
/// own, see `rebuild.rs`).
const STEP_BYTES: u64 = 4 << 20;

/// How a check or repair was started.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct ScrubStarted {
    pub action: SyncAction,
    /// Percent already done when it resumed from its checkpoint (None:
    /// started from the beginning).
    pub resumed_at: Option<f64>,
}

/// A check or repair that was paused and has not finished, with how far
/// it got.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PausedScrub {
    pub action: SyncAction,
    /// Member bytes of allocated groups done and in all.
    pub done: u64,
    pub total: u64,
}

impl Array {
    /// Start a scrub (`repair` rewrites redundancy that disagrees),
    /// resuming a paused one of the same kind from its checkpoint.
    pub fn start_check(&self, repair: bool) -> ArrayResult<()> {
        self.start_scrub(repair, false).map(|_| ())
    }

    /// Start a check or a repair. A paused one of the same kind resumes
    /// from its checkpoint unless `restart`; a paused one of the other
    /// kind is forgotten (a repair does not skip what a check only read).
    pub fn start_scrub(&self, repair: bool, restart: bool) -> ArrayResult<ScrubStarted> {
        let action = if repair {
            SyncAction::Repair
        } else {
            SyncAction::Check
        };
        if self.busy() {
            if let Some(p) = self.sync_progress() {
                return Err(ArrayError::Refused(if p.action == action {
                    format!(
                        "{action} is already running ({:.1}%); `raidfs {action} --wait` follows it",
                        p.percent()
                    )
                } else {
                    format!(
                        "{} is running ({:.1}%); a {action} can start once it ends (or after `raidfs check --stop`)",
                        p.action,
                        p.percent()
                    )
                }));
            }
        }
        let from = {
            let mut sb = self.sb.lock();
            match sb.scrub {
                Some(c) if c.repair == repair && !restart => c.offset,
                _ => {
                    sb.scrub = None;
                    0
                }
            }
        };
        self.spawn_from(action, None, from)?;
        let resumed_at = (from > 0)
            .then(|| percent(self.member_bytes_below(from), self.allocated_member_bytes()));
        Ok(ScrubStarted { action, resumed_at })
    }

    /// The paused check or repair, if one waits to be resumed (and is not
    /// running now).
    pub fn paused_scrub(&self) -> Option<PausedScrub> {
        let c = self.sb.lock().scrub?;
        let action = if c.repair {
            SyncAction::Repair
        } else {
            SyncAction::Check
        };
        if self.busy() && self.sync_progress().is_some_and(|p| p.action == action) {
            return None;
        }
        Some(PausedScrub {
            action,
            done: self.member_bytes_below(c.offset),
            total: self.allocated_member_bytes(),
        })
    }

    /// A check or repair ran to its end: nothing is left to resume.
    pub(super) fn scrub_done(&self) {
        self.sb.lock().scrub = None;
        if let Err(e) = self.write_superblocks() {
            log::error!("recording the end of the scrub: {e}");
        }
    }

    /// The walk of check, repair and resync over every allocated group in
    /// member-offset order, from member offset `from` (a resumed scrub's
    /// checkpoint; what lies below it is already in `done`). Ok(true):
    /// finished; Ok(false): stopped.
    pub(super) fn run_scrub(
        &self,
        action: SyncAction,
        from: u64,
        done: &AtomicU64,
        mismatches: &AtomicU64,
        pacer: &mut Pacer,
    ) -> ArrayResult<bool> {
        let group_size = self.sb.lock().group_size;
        for region in self.regions_by_offset() {
            let geometry = region.geometry;
            let rows = group_size / geometry.chunk;
            let step_rows = (STEP_BYTES / geometry.chunk).max(1);
            let mut row = 0;
            while row < rows {
                if self.sync.stop.load(Ordering::Acquire) {
                    let _ = self.write_superblocks();
                    return Ok(false);
                }
                let n = step_rows.min(rows - row);
                let span = (
                    region.base + row * geometry.chunk,
                    region.base + (row + n) * geometry.chunk,
                );
                let bytes = n * geometry.chunk;
                if span.1 <= from {
                    row += n;
                    continue;
                }
                if self.skip_step(action, span) {
                    row += n;
                    // A resync's size is its dirty regions alone.
                    if action != SyncAction::Resync {
                        done.fetch_add(bytes, Ordering::Relaxed);
                    }
                    continue;
                }
                let bad = self.scrub_rows(&region, row, n, action != SyncAction::Check)?;
                mismatches.fetch_add(bad, Ordering::Relaxed);
                row += n;
                done.fetch_add(bytes, Ordering::Relaxed);
                if action.is_scrub() {
                    // Written with the next checkpoint of the superblocks.
                    self.sb.lock().scrub = Some(ScrubCheckpoint {
                        repair: action == SyncAction::Repair,
                        offset: span.1,
                    });
                }
                self.pace(pacer, bytes);
            }
        }
        Ok(true)
    }

    /// Resync and re-add only touch regions the write-intent bitmap marks.
    pub(super) fn skip_step(&self, action: SyncAction, (start, end): (u64, u64)) -> bool {
        self.bitmap_only(action) && !self.bitmap.any_dirty(start, end)
    }

    /// Whether `action` visits only the regions the bitmap marks dirty.
    pub(super) fn bitmap_only(&self, action: SyncAction) -> bool {
        match action {
            SyncAction::Resync => true,
            SyncAction::Recovery => self.sync.recovery_bitmap_only.load(Ordering::Acquire),
            _ => false,
        }
    }

    /// Write the repairs a scrub decided on; a member that refuses fails.
    pub(super) fn run_repairs(&self, writes: Vec<(usize, Op)>) -> ArrayResult<()> {
        if writes.is_empty() {
            return Ok(());
        }
        let slots: Vec<usize> = writes.iter().map(|(s, _)| *s).collect();
        let mut host = None;
        for (slot, outcome) in slots.into_iter().zip(self.pool.run(writes)) {
            if let Err(e) = outcome {
                host = host.or(self.write_failed(slot, &e, "write during repair", None));
            }
        }
        if let Some(e) = host {
            return Err(e);
        }
        self.ensure_writable()
            .map_err(|e| ArrayError::Failed(e.to_string()))
    }
}

/// Bytes in which `a` and `b` differ.
pub(super) fn diff_bytes(a: &[u8], b: &[u8]) -> u64 {
    a.iter().zip(b).filter(|(x, y)| x != y).count() as u64
}
