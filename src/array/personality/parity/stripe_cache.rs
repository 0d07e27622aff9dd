//! The stripe cache: partial-stripe writes to RAID5/6 gathered in memory
//! until their stripe is whole, so that a sequential writer whose requests
//! are smaller than a stripe (`dd bs=4k`, `cp`'s 128 KiB) gets full-stripe
//! writes, parity computed from the new data alone, instead of a
//! read-modify-write (two reads, two writes and a partial-parity log entry)
//! for every request. md's raid5 does the same with its stripe cache.
//!
//! A cached write is a write not yet issued to the members. The members
//! stay consistent meanwhile (their data and parity agree), so a rebuild, a
//! parity check or a member failure needs nothing from the cache. What must
//! see it:
//!
//! * a read of its stripe writes it out first (`Array::read_parity`);
//! * a flush writes every entry out before it syncs, so `fsync` (and every
//!   journal commit, which flushes first) covers it;
//! * a full-stripe write of its stripe supersedes it.
//!
//! Order: an entry being written out stays in the map as
//! [`Slot::WritingOut`]; writes and reads of its stripe wait until it is
//! done, so an older cached write can never land after a newer one.
//!
//! Bound: [`LIMIT_BYTES`]; past it the oldest entry is written out as it
//! is (a partial write, read-modify-write).

use crate::array::io::{split, Caching, Piece};
use crate::array::personality::Personality;
use crate::array::{Array, ArrayError, ArrayResult, Region, GROUP_SHIFT};
use parking_lot::{Condvar, Mutex};
use std::collections::{BTreeMap, VecDeque};
use std::ops::{Range, RangeBounds, RangeInclusive};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// Granularity of the cache: only writes aligned to it are gathered
/// (the filesystem writes whole 4 KiB blocks).
pub(crate) const BLOCK: usize = 4096;
/// Cached bytes at most (whole stripe buffers counted).
pub(crate) const LIMIT_BYTES: usize = 32 << 20;
/// Stripes larger than this are never cached (one entry would be most of
/// the budget).
pub(crate) const MAX_STRIPE_BYTES: usize = 8 << 20;

/// (group, stripe number within the group).
pub(crate) type Key = (u32, u64);

/// One stripe's gathered data.
pub(crate) struct Entry {
    /// Logical array address of the stripe's first data byte.
    pub addr: u64,
    /// The stripe's data, in logical order; only filled blocks are meaningful.
    pub data: Vec<u8>,
    filled: Vec<bool>,
    filled_count: usize,
}

impl Entry {
    fn new(addr: u64, stripe_bytes: usize) -> Entry {
        Entry {
            addr,
            data: vec![0u8; stripe_bytes],
            filled: vec![false; stripe_bytes / BLOCK],
            filled_count: 0,
        }
    }

    fn is_whole(&self) -> bool {
        self.filled_count == self.filled.len()
    }

    /// Byte ranges of consecutive filled blocks.
    pub fn filled_runs(&self) -> Vec<Range<usize>> {
        let mut runs = Vec::new();
        let mut start = None;
        for (i, &f) in self.filled.iter().enumerate() {
            match (f, start) {
                (true, None) => start = Some(i),
                (false, Some(s)) => {
                    runs.push(s * BLOCK..i * BLOCK);
                    start = None;
                }
                _ => {}
            }
        }
        if let Some(s) = start {
            runs.push(s * BLOCK..self.filled.len() * BLOCK);
        }
        runs
    }
}

enum Slot {
    Filling(Entry),
    WritingOut,
}

#[derive(Default)]
struct State {
    slots: BTreeMap<Key, Slot>,
    /// Filling entries, oldest first (keys no longer filling are skipped).
    order: VecDeque<Key>,
    bytes: usize,
}

impl State {
    fn writing_out_keys(&self, keys: impl RangeBounds<Key>) -> Vec<Key> {
        self.slots
            .range(keys)
            .filter(|(_, s)| matches!(s, Slot::WritingOut))
            .map(|(k, _)| *k)
            .collect()
    }

    fn writing_out(&self, keys: impl RangeBounds<Key>) -> bool {
        self.slots
            .range(keys)
            .any(|(_, s)| matches!(s, Slot::WritingOut))
    }

    /// Mark `key` as being written out and hand back its entry.
    fn take(&mut self, key: Key) -> Option<Entry> {
        match self.slots.remove(&key)? {
            Slot::Filling(entry) => {
                self.slots.insert(key, Slot::WritingOut);
                self.bytes -= entry.data.len();
                Some(entry)
            }
            writing_out => {
                self.slots.insert(key, writing_out);
                None
            }
        }
    }
}

/// What [`StripeCache::absorb`] did with a write.
pub(crate) enum Absorbed {
    /// Kept; the members get it later.
    Held,
    /// It completed its stripe: the caller writes the entry out as a
    /// full stripe, then calls [`StripeCache::done`].
    Whole(Entry),
}

#[derive(Default)]
pub(crate) struct StripeCache {
    state: Mutex<State>,
    settled: Condvar,
    /// Slots in the map, so reads of an empty cache skip the lock.
    slots: AtomicUsize,
    enabled: AtomicBool,
}

impl StripeCache {
    /// Start gathering partial-stripe writes. Off until then, so an array
    /// driven without its background threads (tests, tools) writes through.
    pub fn enable(&self) {
        self.enabled.store(true, Ordering::Release);
    }

    pub fn is_enabled(&self) -> bool {
        self.enabled.load(Ordering::Acquire)
    }

    pub fn is_empty(&self) -> bool {
        self.slots.load(Ordering::Acquire) == 0
    }

    fn publish(&self, st: &State) {
        self.slots.store(st.slots.len(), Ordering::Release);
    }

    /// Copy `bytes` into the stripe `key` (whose data starts at logical
    /// `stripe_addr` and is `stripe_bytes` long) at byte `at` of it. Both
    /// `at` and the length are multiples of [`BLOCK`].
    pub fn absorb(
        &self,
        key: Key,
        stripe_addr: u64,
        stripe_bytes: usize,
        at: usize,
        bytes: &[u8],
    ) -> Absorbed {
        let mut st = self.state.lock();
        while matches!(st.slots.get(&key), Some(Slot::WritingOut)) {
            self.settled.wait(&mut st);
        }
        let st = &mut *st;
        if st.order.len() > 2 * st.slots.len() + 64 {
            // Keys of entries long written out; keep the queue near the map's size.
            let slots = &st.slots;
            st.order
                .retain(|k| matches!(slots.get(k), Some(Slot::Filling(_))));
        }
        let slot = st.slots.entry(key).or_insert_with(|| {
            st.order.push_back(key);
            st.bytes += stripe_bytes;
            Slot::Filling(Entry::new(stripe_addr, stripe_bytes))
        });
        let Slot::Filling(entry) = slot else {
            unreachable!("waited above until the stripe was no longer written out");
        };
        entry.data[at..at + bytes.len()].copy_from_slice(bytes);
        for block in at / BLOCK..(at + bytes.len()) / BLOCK {
            if !entry.filled[block] {
                entry.filled[block] = true;
                entry.filled_count += 1;
            }
        }
        let absorbed = if entry.is_whole() {
            match st.take(key) {
                Some(entry) => Absorbed::Whole(entry),
                None => Absorbed::Held,
            }
        } else {
            Absorbed::Held
        };
        self.publish(st);
        absorbed
    }

    /// A full-stripe write of `stripes` is about to be issued: wait for
    /// their entries being written out, and drop the ones still filling
    /// (the new write covers every byte of them).
    pub fn supersede(&self, group: u32, stripes: RangeInclusive<u64>) {
        if self.is_empty() {
            return;
        }
        let keys = (group, *stripes.start())..=(group, *stripes.end());
        let mut st = self.settled(keys.clone());
        let dropped: Vec<Key> = st.slots.range(keys).map(|(k, _)| *k).collect();
        for key in dropped {
            if let Some(Slot::Filling(entry)) = st.slots.remove(&key) {
                st.bytes -= entry.data.len();
            }
        }
        self.publish(&st);
    }

    /// Take the filling entries of `keys` for writing out (each then
    /// needs [`StripeCache::done`]).
    pub fn take(&self, keys: impl RangeBounds<Key>) -> Vec<(Key, Entry)> {
        let mut st = self.state.lock();
        let filling: Vec<Key> = st
            .slots
            .range(keys)
            .filter(|(_, s)| matches!(s, Slot::Filling(_)))
            .map(|(k, _)| *k)
            .collect();
        let taken = filling
            .into_iter()
            .filter_map(|k| st.take(k).map(|e| (k, e)))
            .collect();
        self.publish(&st);
        taken
    }

    /// The oldest filling entry when the cache holds more than its limit.
    pub fn take_over_limit(&self) -> Option<(Key, Entry)> {
        let mut st = self.state.lock();
        while st.bytes > LIMIT_BYTES {
            let Some(key) = st.order.pop_front() else {
                break;
            };
            if !matches!(st.slots.get(&key), Some(Slot::Filling(_))) {
                continue;
            }
            let taken = st.take(key).map(|e| (key, e));
            self.publish(&st);
            return taken;
        }
        None
    }

    /// The write-out of `key`'s entry was refused by the host: keep it, as
    /// filling, for a later flush (the writes it holds were answered).
    pub fn restore(&self, key: Key, entry: Entry) {
        let mut st = self.state.lock();
        if matches!(st.slots.get(&key), Some(Slot::WritingOut)) {
            st.bytes += entry.data.len();
            st.order.push_back(key);
            st.slots.insert(key, Slot::Filling(entry));
        }
        self.publish(&st);
        self.settled.notify_all();
    }

    /// The entry of `key` has been written out (or failed to be).
    pub fn done(&self, key: Key) {
        let mut st = self.state.lock();
        if matches!(st.slots.get(&key), Some(Slot::WritingOut)) {
            st.slots.remove(&key);
        }
        // `order` may still name the key; it is skipped when reached.
        if st.slots.is_empty() {
            st.order.clear();
        }
        self.publish(&st);
        self.settled.notify_all();
    }

    /// The state, locked once no entry of `keys` is being written out.
    fn settled(&self, keys: impl RangeBounds<Key> + Clone) -> parking_lot::MutexGuard<'_, State> {
        let mut st = self.state.lock();
        while st.writing_out(keys.clone()) {
            self.settled.wait(&mut st);
        }
        st
    }
}

impl Array {
    /// Gather `pieces` (one partial stripe of a write of `data` at region
    /// offset `offset`) in the stripe cache when it can hold them; false
    /// when the caller must write them now.
    pub(in crate::array) fn cache_partial_stripe(
        &self,
        region: &Region,
        offset: u64,
        pieces: &[Piece],
        data: &[u8],
    ) -> ArrayResult<bool> {
        let geometry = region.geometry;
        let stripe_bytes = geometry.stripe_bytes() as usize;
        let (Some(first), Some(last)) = (pieces.first(), pieces.last()) else {
            return Ok(false);
        };
        let begin = offset + first.buf_off as u64;
        let len = last.buf_off + last.len - first.buf_off;
        let cacheable = self.stripe_cache.is_enabled()
            && matches!(region.personality, Personality::Parity(_))
            && stripe_bytes <= MAX_STRIPE_BYTES
            && stripe_bytes.is_multiple_of(BLOCK)
            && begin.is_multiple_of(BLOCK as u64)
            && len.is_multiple_of(BLOCK);
        if !cacheable {
            return Ok(false);
        }
        let stripe = first.map.stripe;
        let stripe_offset = stripe * stripe_bytes as u64;
        let key = (region.group, stripe);
        let stripe_addr = (u64::from(region.group) << GROUP_SHIFT) | stripe_offset;
        let at = (begin - stripe_offset) as usize;
        let bytes = &data[first.buf_off..first.buf_off + len];
        match self
            .stripe_cache
            .absorb(key, stripe_addr, stripe_bytes, at, bytes)
        {
            Absorbed::Held => {}
            Absorbed::Whole(entry) => {
                let done = Done::new(&self.stripe_cache, key);
                let whole = split(region, stripe_offset, stripe_bytes);
                match self.write_full_stripes(region, &[&whole], &entry.data) {
                    Ok(()) => {}
                    Err(e @ (ArrayError::HostNoSpace(_) | ArrayError::HostFault { .. })) => {
                        done.restore(entry);
                        return Err(e);
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        while let Some((key, entry)) = self.stripe_cache.take_over_limit() {
            self.write_out(key, entry)?;
        }
        Ok(true)
    }

    /// Write out the cached entries of `keys` (`..` for all of them, a
    /// flush) and wait for those another thread is writing out, so that the
    /// members hold every completed write to those stripes.
    pub(in crate::array) fn write_out_cached(
        &self,
        keys: impl RangeBounds<Key> + Clone,
    ) -> ArrayResult<()> {
        loop {
            if self.stripe_cache.is_empty() {
                return Ok(());
            }
            let others = self
                .stripe_cache
                .state
                .lock()
                .writing_out_keys(keys.clone());
            let mut result = Ok(());
            for (key, entry) in self.stripe_cache.take(keys.clone()) {
                result = result.and(self.write_out(key, entry));
            }
            let st = self.stripe_cache.settled(keys.clone());
            // A write-out another thread was doing may have been refused by
            // the host and its entry kept: the members still lack those
            // bytes, so this caller writes it out itself (or gets the
            // host's error) rather than read or write past it. (Only those:
            // entries gathered since are newer than what the caller follows.)
            let kept = others
                .iter()
                .any(|k| matches!(st.slots.get(k), Some(Slot::Filling(_))));
            if result.is_err() || !kept {
                return result;
            }
        }
    }

    /// Write an entry's filled blocks to the members as ordinary partial
    /// writes (read-modify-write or reconstruct-write, bitmap and partial
    /// parity log as for any write).
    fn write_out(&self, key: Key, entry: Entry) -> ArrayResult<()> {
        let done = Done::new(&self.stripe_cache, key);
        let mut result = Ok(());
        for run in entry.filled_runs() {
            let addr = entry.addr + run.start as u64;
            let (region, offset) = self.region(addr, run.len())?;
            result = self.write_region_with(&region, offset, &entry.data[run], Caching::Bypass);
            if result.is_err() {
                break;
            }
        }
        if let Err(e @ (ArrayError::HostNoSpace(_) | ArrayError::HostFault { .. })) = result {
            // Answered writes are not dropped because the host is full:
            // kept for the next flush, which reports the error meanwhile.
            done.restore(entry);
            return Err(e);
        }
        result
    }
}

/// Ends a write-out, however it ends: done, or its entry kept.
struct Done<'a> {
    cache: &'a StripeCache,
    key: Key,
    kept: bool,
}

impl<'a> Done<'a> {
    fn new(cache: &'a StripeCache, key: Key) -> Done<'a> {
        Done {
            cache,
            key,
            kept: false,
        }
    }

    /// The host refused the write-out: keep the entry, as filling. This
    /// ends the write-out; a `done` after it would end whichever write-out
    /// another thread has started of the kept entry meanwhile, and that
    /// one's entry would then be lost when it is kept in turn.
    fn restore(mut self, entry: Entry) {
        self.kept = true;
        self.cache.restore(self.key, entry);
    }
}

impl Drop for Done<'_> {
    fn drop(&mut self) {
        if !self.kept {
            self.cache.done(self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STRIPE: usize = 4 * BLOCK;

    #[test]
    fn a_stripe_filled_in_any_order_comes_back_whole_once() {
        let cache = StripeCache::default();
        let key = (0, 7);
        for (n, block) in [2usize, 0, 3].into_iter().enumerate() {
            let bytes = vec![block as u8 + 1; BLOCK];
            assert!(matches!(
                cache.absorb(key, 1 << 20, STRIPE, block * BLOCK, &bytes),
                Absorbed::Held
            ));
            assert_eq!(cache.slots.load(Ordering::Relaxed), 1, "after {n} writes");
        }
        let Absorbed::Whole(entry) = cache.absorb(key, 1 << 20, STRIPE, BLOCK, &[2; BLOCK]) else {
            panic!("the fourth block completes the stripe");
        };
        assert_eq!(entry.addr, 1 << 20);
        for block in 0..4 {
            assert!(entry.data[block * BLOCK..(block + 1) * BLOCK]
                .iter()
                .all(|&b| b == block as u8 + 1));
        }
        assert!(!cache.is_empty(), "being written out until done");
        cache.done(key);
        assert!(cache.is_empty());
    }

    #[test]
    fn runs_cover_exactly_the_filled_blocks() {
        let cache = StripeCache::default();
        let key = (1, 0);
        cache.absorb(key, 0, 8 * BLOCK, 0, &[1; 2 * BLOCK]);
        cache.absorb(key, 0, 8 * BLOCK, 5 * BLOCK, &[1; BLOCK]);
        cache.absorb(key, 0, 8 * BLOCK, 7 * BLOCK, &[1; BLOCK]);
        let taken = cache.take((1, 0)..=(1, 0));
        assert_eq!(taken.len(), 1);
        assert_eq!(
            taken[0].1.filled_runs(),
            vec![0..2 * BLOCK, 5 * BLOCK..6 * BLOCK, 7 * BLOCK..8 * BLOCK]
        );
        cache.done(key);
        assert!(cache.take(..).is_empty());
    }

    #[test]
    fn a_full_stripe_write_drops_what_it_covers_and_nothing_else() {
        let cache = StripeCache::default();
        cache.absorb((0, 1), 0, STRIPE, 0, &[1; BLOCK]);
        cache.absorb((0, 2), 0, STRIPE, 0, &[1; BLOCK]);
        cache.absorb((1, 1), 0, STRIPE, 0, &[1; BLOCK]);
        cache.supersede(0, 1..=1);
        let left: Vec<Key> = cache.take(..).into_iter().map(|(k, _)| k).collect();
        assert_eq!(left, vec![(0, 2), (1, 1)]);
    }

    #[test]
    fn the_age_queue_stays_near_the_number_of_entries() {
        let cache = StripeCache::default();
        // One entry stays partial all along, so the map is never empty.
        cache.absorb((0, 0), 0, STRIPE, 0, &[1; BLOCK]);
        for s in 1..1000u64 {
            cache.absorb((0, s), 0, STRIPE, 0, &[1; STRIPE - BLOCK]);
            let Absorbed::Whole(_) = cache.absorb((0, s), 0, STRIPE, STRIPE - BLOCK, &[1; BLOCK])
            else {
                panic!("stripe {s} is whole");
            };
            cache.done((0, s));
        }
        assert!(cache.state.lock().order.len() <= 2 + 64);
    }

    #[test]
    fn the_oldest_entry_goes_out_first_once_over_the_limit() {
        let cache = StripeCache::default();
        let stripe = MAX_STRIPE_BYTES;
        let entries = LIMIT_BYTES / stripe + 1;
        for s in 0..entries as u64 {
            cache.absorb((0, s), 0, stripe, 0, &[1; BLOCK]);
        }
        let (key, _) = cache.take_over_limit().expect("one entry over the limit");
        assert_eq!(key, (0, 0));
        cache.done(key);
        assert!(cache.take_over_limit().is_none());
    }
}
