//! Write-back of large writes: the member writes of a run of whole parity
//! stripes (`full_stripe`), or of a large mirror or RAID0 write
//! (`write_every_target`), are queued on the member workers and the caller
//! returns at once, so the next request's data can arrive (and its parity
//! be computed) while the members copy this one, every member at once.
//! What keeps that safe:
//!
//! * the stripes stay locked until their writes are done (the reaper
//!   releases the locks), so every writer, rebuild or scrub that locks them
//!   waits as it would for a synchronous write;
//! * reads of those stripes, which take no locks, wait in
//!   [`WriteBack::wait_for`];
//! * a flush waits until nothing is in flight before it syncs
//!   ([`WriteBack::wait_idle`]), so `fsync` covers every write it follows;
//! * a member write that fails fails the member (as a synchronous write
//!   would); if that leaves the array broken, the next flush reports it;
//! * a member write the host refuses (out of space, or the array suspended)
//!   is kept, *parked* with its stripes still locked, and done again by
//!   every flush until it lands; the flush reports the host's error
//!   meanwhile, so `fsync` never returns before the data is on the members.
//!   Writes are not handed here at all while the host is short of space
//!   ([`Array::write_through`]), so parking is rare.
//! * nothing waits blindly for a parked write: a read of its stripes, or a
//!   writer that needs one of its stripe locks, does the parked writes
//!   again itself and, while the host still refuses them, gets the host's
//!   error ([`Array::wait_unqueued`], [`Array::lock_stripes`]). Waiting
//!   instead would hold the request's other locks until the host
//!   recovers, and a host gone read-only recovers only after the array is
//!   unmounted: every `fsync` of the file would hang with it.
//!
//! The reaper is a thread started with the array's background work; an
//! array used without it writes synchronously.

use crate::array::stripe_lock::HeldStripes;
use crate::array::stripe_lock::{StripeGuards, StripeLocks};
use crate::array::worker::{Batch, Op};
use crate::array::{Array, ArrayError, ArrayResult};
use crate::handoff::{self, Sender};
use parking_lot::{Condvar, Mutex, MutexGuard};
use std::sync::Weak;
use std::time::Duration;

/// Writes in flight at most; a writer beyond it waits for the oldest.
const MAX_IN_FLIGHT: usize = 4;
/// How long a writer waits for a stripe lock before asking whether a
/// parked write holds it (the lock is usually free long before).
const PARKED_PATIENCE: Duration = Duration::from_millis(100);

/// A queued write, until the reaper has collected it.
pub(crate) struct InFlight {
    id: u64,
    batch: Batch,
    /// The member slot of each job of `batch`, in order.
    slots: Vec<usize>,
    /// The jobs again (sharing their buffers), to redo those the host refused.
    copies: Vec<Option<Op>>,
    held: HeldStripes,
}

/// A write the host refused, waiting for a flush to do it again.
struct Parked {
    id: u64,
    jobs: Vec<(usize, Op)>,
    held: HeldStripes,
}

struct Entry {
    id: u64,
    group: u32,
    first: u64,
    last: u64,
    parked: bool,
}

impl Entry {
    fn covers(&self, group: u32, first: u64, last: u64) -> bool {
        self.group == group && self.first <= last && first <= self.last
    }
}

#[derive(Default)]
struct State {
    entries: Vec<Entry>,
    next_id: u64,
}

impl State {
    fn in_flight(&self) -> usize {
        self.entries.iter().filter(|e| !e.parked).count()
    }
}

/// What covers a span of stripes once the writes in flight there are done.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Covered {
    Clear,
    /// A parked write: the members do not hold its data yet.
    Parked,
}

#[derive(Default)]
pub(crate) struct WriteBack {
    state: Mutex<State>,
    parked: Mutex<Vec<Parked>>,
    /// Held while parked writes are done again, so that a retry that found
    /// the list empty knows no other retry holds it.
    retrying: Mutex<()>,
    changed: Condvar,
    reaper: Mutex<Option<Sender<InFlight>>>,
}

impl WriteBack {
    /// Whether writes can be handed to a reaper.
    pub fn enabled(&self) -> bool {
        self.reaper.lock().is_some()
    }

    /// Start the reaper for `array` (once).
    pub fn start(&self, array: Weak<Array>) {
        let mut reaper = self.reaper.lock();
        if reaper.is_some() {
            return;
        }
        let (tx, rx) = handoff::channel::<InFlight>();
        let spawned = std::thread::Builder::new()
            .name("raidfs-writeback".into())
            .spawn(move || {
                while let Some(write) = rx.recv() {
                    match array.upgrade() {
                        Some(array) => array.reap(write),
                        None => return,
                    }
                }
            });
        match spawned {
            Ok(_) => *reaper = Some(tx),
            Err(e) => {
                log::warn!("no write-back thread ({e}): large writes wait for their members")
            }
        }
    }

    /// Register stripes `first..=last` of `group` as in flight, waiting
    /// while too many writes are. Returns the write's id.
    fn register(&self, group: u32, first: u64, last: u64) -> u64 {
        let mut st = self.state.lock();
        while st.in_flight() >= MAX_IN_FLIGHT {
            self.changed.wait(&mut st);
        }
        let id = st.next_id;
        st.next_id += 1;
        st.entries.push(Entry {
            id,
            group,
            first,
            last,
            parked: false,
        });
        id
    }

    fn set_parked(&self, id: u64, parked: bool) {
        let mut st = self.state.lock();
        for e in st.entries.iter_mut().filter(|e| e.id == id) {
            e.parked = parked;
        }
        drop(st);
        self.changed.notify_all();
    }

    /// Whether some write waits for the host.
    pub fn has_parked(&self) -> bool {
        !self.parked.lock().is_empty()
    }

    fn done(&self, id: u64) {
        let mut st = self.state.lock();
        st.entries.retain(|e| e.id != id);
        drop(st);
        self.changed.notify_all();
    }

    /// Wait until no write to stripes `first..=last` of `group` is in
    /// flight; then whether a parked one covers some of them.
    pub fn wait_for(&self, group: u32, first: u64, last: u64) -> Covered {
        let mut st = self.state.lock();
        loop {
            let mut covering = st.entries.iter().filter(|e| e.covers(group, first, last));
            match covering.clone().any(|e| !e.parked) {
                true => self.changed.wait(&mut st),
                false if covering.next().is_some() => return Covered::Parked,
                false => return Covered::Clear,
            }
        }
    }

    /// Whether a parked write covers some of stripes `first..=last` of `group`.
    fn parked_covers(&self, group: u32, first: u64, last: u64) -> bool {
        let st = self.state.lock();
        st.entries
            .iter()
            .any(|e| e.parked && e.covers(group, first, last))
    }

    /// Whether a parked write holds stripe-lock table slot `slot` of `locks`
    /// (asked only by a writer that waited for it, so worked out then).
    fn parked_holds(&self, locks: &StripeLocks, slot: usize) -> bool {
        let st = self.state.lock();
        st.entries
            .iter()
            .filter(|e| e.parked)
            .any(|e| locks.slots_of(e.group, e.first..=e.last).contains(&slot))
    }

    /// Wait until nothing is in flight (parked writes aside: a flush does
    /// them itself, see [`Array::retry_parked`]).
    pub fn wait_idle(&self) {
        let mut st = self.state.lock();
        while st.in_flight() > 0 {
            self.changed.wait(&mut st);
        }
    }
}

impl Array {
    /// Whether a write to `slots` may be handed to the reaper: it runs,
    /// every member only copies into a cache, and the host has room.
    pub(in crate::array) fn may_write_back(&self, slots: &[usize]) -> bool {
        self.write_back.enabled() && self.pool.writes_cached(slots) && !self.write_through()
    }

    /// Queue a large write's member jobs and return; the stripes
    /// `first..=last` of `group` stay locked (`held`) until it is done.
    /// Without a reaper the write is collected here before returning.
    pub(in crate::array) fn write_back(
        &self,
        group: u32,
        (first, last): (u64, u64),
        jobs: Vec<(usize, crate::array::worker::Op)>,
        held: HeldStripes,
    ) {
        let id = self.write_back.register(group, first, last);
        let slots = jobs.iter().map(|(slot, _)| *slot).collect();
        let copies = jobs.iter().map(|(_, op)| op.duplicate()).collect();
        let write = InFlight {
            id,
            batch: self.pool.submit(jobs),
            slots,
            copies,
            held,
        };
        let reaper = self.write_back.reaper.lock().clone();
        let unsent = match reaper {
            Some(reaper) => reaper.send(write).err(),
            None => Some(write),
        };
        if let Some(write) = unsent {
            self.reap(write);
        }
    }

    /// Collect a queued write: fail the members whose write failed, park
    /// what the host refused, then release its stripes.
    fn reap(&self, write: InFlight) {
        let InFlight {
            id,
            batch,
            slots,
            copies,
            held,
        } = write;
        let outcomes = self.pool.wait(batch);
        let (refused, _) = self.refused(slots.into_iter().zip(copies), outcomes);
        if refused.is_empty() {
            held.release(&self.locks);
            self.write_back.done(id);
            return;
        }
        log::warn!(
            "raidfs: {} member writes of an answered write wait for the host",
            refused.len()
        );
        // In the list before the entry stops counting as in flight: a flush
        // that stops waiting for it must find it there to redo it.
        self.write_back.parked.lock().push(Parked {
            id,
            jobs: refused,
            held,
        });
        self.write_back.set_parked(id, true);
    }

    /// Do the parked writes again (a flush, and the bitmap thread's pass):
    /// the host's error while any is still refused.
    pub(crate) fn retry_parked(&self) -> ArrayResult<()> {
        let _retrying = self.write_back.retrying.lock();
        let parked = std::mem::take(&mut *self.write_back.parked.lock());
        let mut error: Option<ArrayError> = None;
        for Parked { id, jobs, held } in parked {
            // A member failed meanwhile is out of the array: its part is moot.
            let live: Vec<(usize, Op)> = jobs
                .into_iter()
                .filter(|(slot, _)| !self.is_failed(*slot))
                .collect();
            let copies: Vec<(usize, Option<Op>)> =
                live.iter().map(|(s, op)| (*s, op.duplicate())).collect();
            let outcomes = self.pool.run(live);
            let (again, host) = self.refused(copies, outcomes);
            if let Some(e) = host {
                error.get_or_insert(e);
            }
            if again.is_empty() {
                held.release(&self.locks);
                self.write_back.set_parked(id, false);
                self.write_back.done(id);
            } else {
                self.write_back.parked.lock().push(Parked {
                    id,
                    jobs: again,
                    held,
                });
            }
        }
        match error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Wait until no queued write covers stripes `first..=last` of
    /// `group`, for a read (reads take no stripe locks) or for work that
    /// must follow every write there. A parked write there is done again;
    /// while the host still refuses it, the host's error.
    pub(in crate::array) fn wait_unqueued(
        &self,
        group: u32,
        first: u64,
        last: u64,
    ) -> ArrayResult<()> {
        while self.write_back.wait_for(group, first, last) == Covered::Parked {
            if let Err(e) = self.settle_parked() {
                if self.write_back.parked_covers(group, first, last) {
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    /// Lock `stripes` of `group` to write, scrub or repair them. A lock a
    /// parked write holds is not waited for blindly: the parked writes are
    /// done again, and while the host still refuses them the caller gets
    /// the host's error.
    pub(in crate::array) fn lock_stripes(
        &self,
        group: u32,
        stripes: impl IntoIterator<Item = u64>,
    ) -> ArrayResult<StripeGuards<'_>> {
        // Ascending slot order, as every multi-stripe lock takes them.
        let slots = self.locks.slots_of(group, stripes);
        let guards = slots
            .iter()
            .map(|&slot| self.lock_slot(slot))
            .collect::<ArrayResult<_>>()?;
        Ok(StripeGuards::new(slots, guards))
    }

    /// Lock one stripe-lock table slot, as [`Array::lock_stripes`] does.
    pub(in crate::array) fn lock_slot(&self, slot: usize) -> ArrayResult<MutexGuard<'_, ()>> {
        loop {
            match self.locks.lock_slot_or(slot, PARKED_PATIENCE) {
                Some(guard) => return Ok(guard),
                None => self.unless_parked(slot)?,
            }
        }
    }

    /// For a lock waiter that has waited [`PARKED_PATIENCE`] for table slot
    /// `slot`: the host's error if a parked write holds it and still cannot
    /// be done; otherwise wait on.
    fn unless_parked(&self, slot: usize) -> ArrayResult<()> {
        if !self.write_back.parked_holds(&self.locks, slot) {
            return Ok(());
        }
        match self.settle_parked() {
            Err(e) if self.write_back.parked_holds(&self.locks, slot) => Err(e),
            _ => Ok(()),
        }
    }

    /// Do the parked writes again: the host's error while it still refuses
    /// them, after a while of waiting for it under `on_host_error=wait`
    /// (then Ok: the caller looks again).
    fn settle_parked(&self) -> ArrayResult<()> {
        match self.retry_parked() {
            Err(e) if !self.wait_for_host(&e) => Err(e),
            _ => Ok(()),
        }
    }
}

impl Array {
    /// From a write's jobs (slot and a copy of each) and their outcomes:
    /// the jobs the host refused, to be done again, and the host's error.
    /// A member whose own write failed is failed by `write_failed`.
    fn refused(
        &self,
        jobs: impl IntoIterator<Item = (usize, Option<Op>)>,
        outcomes: Vec<crate::array::worker::Outcome>,
    ) -> (Vec<(usize, Op)>, Option<ArrayError>) {
        let mut refused = Vec::new();
        let mut error = None;
        for ((slot, copy), outcome) in jobs.into_iter().zip(outcomes) {
            let Err(e) = outcome else { continue };
            let span = copy.as_ref().and_then(op_span);
            if let Some(host) = self.write_failed(slot, &e, "write", span) {
                error.get_or_insert(host);
                refused.extend(copy.map(|op| (slot, op)));
            }
        }
        (refused, error)
    }
}

/// The member bytes a write job covers.
fn op_span(op: &Op) -> Option<(u64, u64)> {
    match op {
        Op::Write { offset, range, .. } => Some((*offset, *offset + range.len() as u64)),
        Op::WriteDurable { offset, data } => Some((*offset, *offset + data.len() as u64)),
        _ => None,
    }
}
