//! Stripe locks: writers to one stripe are serialised (parity must be computed
//! from a stable stripe, and mirror copies must not interleave), while writers
//! to different stripes proceed in parallel.
//!
//! A fixed table of mutexes is indexed by a hash of (group, stripe); a
//! collision only costs some parallelism. Multi-stripe operations lock in
//! ascending table order, so two of them can never deadlock. Background
//! work that holds several steps' locks at once takes table slots one by one
//! (`try_lock_slot`) and never waits while it holds any, for the same reason.

use parking_lot::{Mutex, MutexGuard};
use std::time::Duration;

pub struct StripeLocks {
    table: Vec<Mutex<()>>,
}

pub struct StripeGuards<'a> {
    slots: Vec<usize>,
    guards: Vec<MutexGuard<'a, ()>>,
}

/// Stripes locked by one thread and released by another (a write-back's
/// reaper): the table slots, locked until [`HeldStripes::release`]. Dropped
/// without it, they stay locked (a hang, never a race).
#[must_use = "held stripes stay locked until released"]
pub struct HeldStripes {
    slots: Vec<usize>,
}

impl HeldStripes {
    /// Unlock the stripes.
    pub fn release(self, locks: &StripeLocks) {
        for &i in &self.slots {
            // SAFETY: `StripeLocks::hold` locked exactly these slots and
            // forgot their guards; `self` is consumed, so each is unlocked
            // once. parking_lot mutexes may be unlocked by another thread.
            unsafe { locks.table[i].force_unlock() };
        }
    }
}

impl<'a> StripeGuards<'a> {
    /// Guards of `slots` (ascending), each locked by its caller.
    pub fn new(slots: Vec<usize>, guards: Vec<MutexGuard<'a, ()>>) -> StripeGuards<'a> {
        StripeGuards { slots, guards }
    }
}

impl StripeLocks {
    pub fn new(size: usize) -> StripeLocks {
        StripeLocks {
            table: (0..size.max(1)).map(|_| Mutex::new(())).collect(),
        }
    }

    fn index(&self, group: u32, stripe: u64) -> usize {
        // Fibonacci hashing spreads consecutive stripes over the table.
        let key = (stripe ^ ((group as u64) << 44)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        (key >> 32) as usize % self.table.len()
    }

    /// Lock one table slot, waiting for it at most `patience`.
    pub fn lock_slot_or(&self, slot: usize, patience: Duration) -> Option<MutexGuard<'_, ()>> {
        self.table[slot].try_lock_for(patience)
    }

    /// Keep `guards`' stripes locked until the returned value is released,
    /// from whichever thread.
    pub fn hold(guards: StripeGuards<'_>) -> HeldStripes {
        let StripeGuards { slots, guards } = guards;
        guards.into_iter().for_each(std::mem::forget);
        HeldStripes { slots }
    }

    /// Table slots of `stripes` of `group`, ascending, without repeats.
    pub fn slots_of(&self, group: u32, stripes: impl IntoIterator<Item = u64>) -> Vec<usize> {
        let mut idx: Vec<usize> = stripes.into_iter().map(|s| self.index(group, s)).collect();
        idx.sort_unstable();
        idx.dedup();
        idx
    }

    /// Lock one table slot if nobody holds it.
    pub fn try_lock_slot(&self, slot: usize) -> Option<MutexGuard<'_, ()>> {
        self.table[slot].try_lock()
    }
}
