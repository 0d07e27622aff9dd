//! Members on hosts that come back. A running array's rejoin thread looks,
//! with backoff, for the servers of its failed NBD members (slots that
//! failed on I/O and still carry their URI) and of NBD members left out at
//! assembly because their server could not be reached, and adds each one
//! back as `raidfs add` would once it answers: re-added from the bitmap
//! when that covers its absence, rebuilt in full otherwise.
//!
//! A member that fails again soon after coming back (a server whose disk
//! errors, say) waits twice as long before each next return, so a sick
//! member cannot keep the array resyncing.
//!
//! Not touched: image files and block devices (a disk that failed stays
//! failed, as in md), slots failed by request (`raidfs fail`) or removed
//! (`raidfs remove`), and an export whose superblock is no longer this
//! array's member for that slot. The thread holds a `Weak` to its array
//! and stops with [`Array::stop_background`].

use super::{AddOutcome, Array};
use crate::member::nbd::{NbdMember, NbdOptions};
use crate::member::open as member_open;
use crate::member::Member;
use crate::superblock::Superblock;
use crossbeam_channel::{RecvTimeoutError, Sender};
use parking_lot::Mutex;
use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The first wait after a member is found missing, doubled after every
/// round that found a server still away...
const FIRST_WAIT: Duration = Duration::from_secs(1);
/// ...up to this.
const LONGEST_WAIT: Duration = Duration::from_secs(30);
/// How long a look for a server may take (the thread is joined at unmount).
const PROBE_CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// The longest a member that keeps failing after its returns waits...
const LONGEST_REJOIN_WAIT: Duration = Duration::from_secs(600);
/// ...and how long it must have stayed before its count starts over.
const REJOINS_FORGOTTEN_AFTER: Duration = Duration::from_secs(3600);

#[derive(Default)]
pub(crate) struct Rejoin {
    thread: Mutex<Option<(Sender<()>, JoinHandle<()>)>>,
    /// Slots failed by request: never re-added behind the user's back.
    held: Mutex<BTreeSet<usize>>,
    /// URIs of members left out at assembly, to look for.
    awaited: Mutex<Vec<String>>,
    /// Per URI: how many times it came back, and when last.
    returns: Mutex<HashMap<String, (u32, Instant)>>,
    /// Members to fail fast (`-o failfast=`), by name: whichever member
    /// of that name is in a slot, now or after it returns.
    failfast: Mutex<Vec<String>>,
}

impl Array {
    /// Look for the server of `uri`, a member left out at assembly, and
    /// add it back when it answers (once background work runs).
    pub fn await_member(&self, uri: &str) {
        let mut awaited = self.rejoin.awaited.lock();
        if !awaited.iter().any(|u| u == uri) {
            awaited.push(uri.to_string());
        }
    }

    /// Make the member called `name` fail fast, now and whenever a member
    /// of that name comes into a slot. False when a present member of
    /// that name has no such mode (an image file); true otherwise.
    pub fn set_failfast(&self, name: &str) -> bool {
        {
            let mut names = self.rejoin.failfast.lock();
            if !names.iter().any(|n| n == name) {
                names.push(name.to_string());
            }
        }
        (0..self.slots.len())
            .filter(|&slot| self.slots[slot].name() == name)
            .filter_map(|slot| self.slots[slot].member())
            .all(|member| member.set_failfast(true))
    }

    /// A member just came into a slot: fail fast if its name asks for it.
    pub(crate) fn apply_failfast(&self, member: &dyn crate::member::Member, name: &str) {
        if self.rejoin.failfast.lock().iter().any(|n| n == name) {
            member.set_failfast(true);
        }
    }

    /// Whether the member in `slot` fails fast.
    pub fn member_failfast(&self, slot: usize) -> bool {
        self.slots
            .get(slot)
            .and_then(|s| s.member())
            .is_some_and(|m| m.failfast())
    }

    /// `slot` was failed by request: leave it failed.
    pub(crate) fn hold_failed(&self, slot: usize) {
        self.rejoin.held.lock().insert(slot);
    }

    /// `slot` has a new member: it may be re-added again if it fails.
    pub(crate) fn release_held(&self, slot: usize) {
        self.rejoin.held.lock().remove(&slot);
    }

    pub(super) fn start_rejoin(&self, weak: Weak<Array>) {
        let mut thread = self.rejoin.thread.lock();
        if thread.is_some() {
            return;
        }
        let (tx, rx) = crossbeam_channel::bounded::<()>(1);
        let spawned = std::thread::Builder::new()
            .name("raidfs-rejoin".into())
            .spawn(move || {
                let mut wait = FIRST_WAIT;
                loop {
                    match rx.recv_timeout(wait) {
                        Err(RecvTimeoutError::Timeout) => {}
                        // A hang-up (or any message) stops the thread.
                        _ => return,
                    }
                    let Some(array) = weak.upgrade() else { return };
                    wait = match array.rejoin_round() {
                        // Nobody missing, or someone came back: look again soon.
                        Round::Idle | Round::Rejoined => FIRST_WAIT,
                        Round::StillAway => (wait * 2).min(LONGEST_WAIT),
                    };
                }
            });
        match spawned {
            Ok(handle) => *thread = Some((tx, handle)),
            Err(e) => log::error!("cannot start the rejoin thread: {e}"),
        }
    }

    pub(super) fn stop_rejoin(&self) {
        let thread = self.rejoin.thread.lock().take();
        if let Some((tx, handle)) = thread {
            drop(tx);
            if handle.thread().id() != std::thread::current().id() {
                let _ = handle.join();
            }
        }
    }

    /// The URIs to look for now: failed slots' (not held) and the awaited.
    fn rejoin_candidates(&self) -> Vec<String> {
        let held = self.rejoin.held.lock().clone();
        let mut uris: Vec<String> = (0..self.slots.len())
            .filter(|&slot| self.is_failed(slot) && !held.contains(&slot))
            .map(|slot| self.slots[slot].name())
            .filter(|name| member_open::is_uri(Path::new(name)))
            .collect();
        for uri in self.rejoin.awaited.lock().iter() {
            if !uris.contains(uri) {
                uris.push(uri.clone());
            }
        }
        uris
    }

    fn rejoin_round(&self) -> Round {
        let candidates = self.rejoin_candidates();
        if candidates.is_empty() {
            return Round::Idle;
        }
        if self.busy() {
            // One recovery at a time: try again after it.
            return Round::StillAway;
        }
        for uri in candidates {
            if !self.may_return(&uri) {
                continue;
            }
            let options = NbdOptions {
                connect_timeout: PROBE_CONNECT_TIMEOUT,
                ..NbdOptions::default()
            };
            let member: Arc<dyn Member> = match NbdMember::connect(&uri, &options) {
                Ok(member) => Arc::new(member),
                Err(e) => {
                    log::debug!("{uri} still away: {e}");
                    continue;
                }
            };
            let ours = Superblock::read_from(member.as_ref())
                .ok()
                .filter(|(sb, _)| sb.array_uuid == self.uuid())
                .map(|(sb, _)| sb.slot as usize)
                .filter(|&slot| slot < self.slots.len() && self.is_failed(slot));
            let Some(slot) = ours else {
                log::warn!(
                    "{uri} answers again but does not hold this array's member for a failed slot; left alone"
                );
                self.rejoin.awaited.lock().retain(|u| u != &uri);
                self.hold_unmatched(&uri);
                continue;
            };
            if self.rejoin.held.lock().contains(&slot) {
                continue;
            }
            match self.add(member, uri.clone()) {
                Ok(outcome) => {
                    self.rejoin.awaited.lock().retain(|u| u != &uri);
                    self.note_return(&uri);
                    match outcome {
                        AddOutcome::ReAdded { slot } => log::warn!(
                            "{uri} answers again: re-added to slot {slot}; the regions written since it left are rebuilt"
                        ),
                        AddOutcome::Rebuilding { slot } => log::warn!(
                            "{uri} answers again: it takes slot {slot} back and is rebuilt in full"
                        ),
                        AddOutcome::Spare => log::warn!("{uri} answers again: kept as a hot spare"),
                    }
                    return Round::Rejoined;
                }
                Err(e) => log::warn!("{uri} answers again but could not be added back: {e}"),
            }
        }
        Round::StillAway
    }

    /// Whether `uri` may come back now: each return in the last hour
    /// doubles the wait after the previous one.
    fn may_return(&self, uri: &str) -> bool {
        let mut returns = self.rejoin.returns.lock();
        let Some(&(times, last)) = returns.get(uri) else {
            return true;
        };
        if last.elapsed() >= REJOINS_FORGOTTEN_AFTER {
            returns.remove(uri);
            return true;
        }
        let wait = FIRST_WAIT
            .saturating_mul(1 << times.min(16))
            .min(LONGEST_REJOIN_WAIT);
        last.elapsed() >= wait
    }

    fn note_return(&self, uri: &str) {
        let mut returns = self.rejoin.returns.lock();
        let entry = returns
            .entry(uri.to_string())
            .or_insert((0, Instant::now()));
        *entry = (entry.0 + 1, Instant::now());
    }

    /// A failed slot whose URI now serves something else is not tried again.
    fn hold_unmatched(&self, uri: &str) {
        for slot in 0..self.slots.len() {
            if self.is_failed(slot) && self.slots[slot].name() == uri {
                self.hold_failed(slot);
            }
        }
    }
}

/// What a round found.
enum Round {
    Idle,
    Rejoined,
    StillAway,
}
