//! Write-back of full-stripe writes: the member writes of a run of whole
//! stripes are queued on the member workers and the caller returns at once,
//! so the next request's data can arrive (and its parity be computed) while
//! the members copy this one. What keeps that safe:
//!
//! * the stripes stay locked until their writes are done (the reaper
//!   releases the locks), so every writer, rebuild or scrub that locks them
//!   waits as it would for a synchronous write;
//! * reads of those stripes, which take no locks, wait in
//!   [`WriteBack::wait_for`];
//! * a flush waits until nothing is in flight before it syncs
//!   ([`WriteBack::wait_idle`]), so `fsync` covers every write it follows;
//! * a member write that fails fails the member (as a synchronous write
//!   would); if that leaves the array broken, the next flush reports it.
//!
//! The reaper is a thread started with the array's background work; an
//! array used without it writes synchronously.

use super::stripe_lock::HeldStripes;
use super::worker::Batch;
use super::Array;
use crossbeam_channel::Sender;
use parking_lot::{Condvar, Mutex};
use std::sync::Weak;

/// Writes in flight at most; a writer beyond it waits for the oldest.
const MAX_IN_FLIGHT: usize = 4;

/// A queued full-stripe write, until the reaper has collected it.
pub(crate) struct InFlight {
    id: u64,
    batch: Batch,
    /// The member slot of each job of `batch`, in order.
    slots: Vec<usize>,
    held: HeldStripes,
}

#[derive(Clone, Copy)]
struct Entry {
    id: u64,
    group: u32,
    first: u64,
    last: u64,
}

#[derive(Default)]
struct State {
    entries: Vec<Entry>,
    next_id: u64,
}

#[derive(Default)]
pub(crate) struct WriteBack {
    state: Mutex<State>,
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
        let (tx, rx) = crossbeam_channel::unbounded::<InFlight>();
        let spawned = std::thread::Builder::new()
            .name("raidfs-writeback".into())
            .spawn(move || {
                while let Ok(write) = rx.recv() {
                    match array.upgrade() {
                        Some(array) => array.reap(write),
                        None => return,
                    }
                }
            });
        match spawned {
            Ok(_) => *reaper = Some(tx),
            Err(e) => {
                log::warn!("no write-back thread ({e}): full-stripe writes wait for their members")
            }
        }
    }

    /// Register stripes `first..=last` of `group` as in flight, waiting
    /// while too many writes are. Returns the write's id.
    fn register(&self, group: u32, first: u64, last: u64) -> u64 {
        let mut st = self.state.lock();
        while st.entries.len() >= MAX_IN_FLIGHT {
            self.changed.wait(&mut st);
        }
        let id = st.next_id;
        st.next_id += 1;
        st.entries.push(Entry {
            id,
            group,
            first,
            last,
        });
        id
    }

    fn done(&self, id: u64) {
        let mut st = self.state.lock();
        st.entries.retain(|e| e.id != id);
        drop(st);
        self.changed.notify_all();
    }

    /// Wait until no write to stripes `first..=last` of `group` is in flight.
    pub fn wait_for(&self, group: u32, first: u64, last: u64) {
        let mut st = self.state.lock();
        while st
            .entries
            .iter()
            .any(|e| e.group == group && e.first <= last && first <= e.last)
        {
            self.changed.wait(&mut st);
        }
    }

    /// Wait until nothing is in flight.
    pub fn wait_idle(&self) {
        let mut st = self.state.lock();
        while !st.entries.is_empty() {
            self.changed.wait(&mut st);
        }
    }
}

impl Array {
    /// Queue a full-stripe write's member jobs and return; the stripes
    /// `first..=last` of `group` stay locked (`held`) until it is done.
    /// Without a reaper the write is collected here before returning.
    pub(super) fn write_back(
        &self,
        group: u32,
        (first, last): (u64, u64),
        jobs: Vec<(usize, super::worker::Op)>,
        held: HeldStripes,
    ) {
        let id = self.write_back.register(group, first, last);
        let slots = jobs.iter().map(|(slot, _)| *slot).collect();
        let write = InFlight {
            id,
            batch: self.pool.submit(jobs),
            slots,
            held,
        };
        let reaper = self.write_back.reaper.lock().clone();
        let unsent = match reaper {
            Some(reaper) => reaper.send(write).err().map(|e| e.into_inner()),
            None => Some(write),
        };
        if let Some(write) = unsent {
            self.reap(write);
        }
    }

    /// Collect a queued write: fail the members whose write failed, then
    /// release its stripes.
    fn reap(&self, write: InFlight) {
        let InFlight {
            id,
            batch,
            slots,
            held,
        } = write;
        for (slot, outcome) in slots.into_iter().zip(self.pool.wait(batch)) {
            if let Err(e) = outcome {
                self.write_failed(slot, &format!("write failed: {e}"));
            }
        }
        held.release(&self.locks);
        self.write_back.done(id);
    }
}
