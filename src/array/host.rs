//! Host faults: errors that come from what the host did, not from a member.
//!
//! Image-backed arrays live on the host's filesystems, and the commonest
//! failure there is not a disk dying but the host running out of space
//! (sparse images grow as they are written) or erroring on everything at
//! once (a host filesystem that went read-only, a controller reset). md,
//! ZFS and btrfs users expect none of those to cost the array, so this
//! module decides, for every member I/O error, whose fault it is:
//!
//! * **out of space** (ENOSPC, EDQUOT): the request that needed the space
//!   fails with ENOSPC and no member is failed. The regions the failed
//!   write touched may now hold a half-updated stripe, so they are marked
//!   suspect in the bitmap (kept set, resynced once writes work again).
//!   While the host is short of space, writes that would be answered before
//!   they reach the members (full-stripe write-back, the stripe cache) are
//!   done synchronously so the writer sees the ENOSPC itself.
//! * **everything at once**: before a member is recorded as failed, every
//!   other working member is probed with a small durable write. If the
//!   probes fail too, or the failures together are more than the array can
//!   lose, nothing is recorded in any superblock: the array is *suspended*
//!   (ZFS's `failmode`): writes answer EIO (EROFS if the host said so), or
//!   with `on_host_error=wait` they wait; a watcher probes the members and
//!   resumes the array when they all answer again; a remount after the host
//!   recovers assembles cleanly.
//! * anything else is the member's own error and fails that member, as md
//!   does.

use super::{Array, ArrayError, ArrayResult};
use crate::member::Member;
use crossbeam_channel::{RecvTimeoutError, Sender};
use parking_lot::{Condvar, Mutex};
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::Weak;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Member offset of the 4 KiB probe block (in the reserved gap before the
/// bitmap; its contents are never read back or trusted).
pub const PROBE_OFFSET: u64 = 32 << 10;
const PROBE_SIZE: usize = 4096;
/// How long after an ENOSPC the host counts as short of space.
const NO_SPACE_RECENT: Duration = Duration::from_secs(30);
/// Below this much free space on a member's host filesystem, writes are
/// not answered before they reach the members.
const LOW_SPACE: u64 = 256 << 20;
/// How often the host's free space is looked up again.
const FREE_SPACE_EVERY: Duration = Duration::from_millis(500);
/// How often a suspended array probes its members.
const PROBE_EVERY: Duration = Duration::from_secs(1);
/// How often the watcher retries the resync of suspect regions (a failed
/// one is not retried sooner, [`super::bitmap::Bitmap::resync_due`]).
const SUSPECT_RETRY_EVERY: Duration = Duration::from_secs(5);

/// Whose fault an I/O error is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fault {
    /// The host filesystem is full (or over quota).
    NoSpace,
    /// The host filesystem is read-only.
    ReadOnlyHost,
    /// Anything else: the member's (until the probes say otherwise).
    Member,
}

pub(crate) fn classify(e: &io::Error) -> Fault {
    match e.kind() {
        io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded => Fault::NoSpace,
        io::ErrorKind::ReadOnlyFilesystem => Fault::ReadOnlyHost,
        _ => match e.raw_os_error() {
            Some(libc::ENOSPC) | Some(libc::EDQUOT) => Fault::NoSpace,
            Some(libc::EROFS) => Fault::ReadOnlyHost,
            _ => Fault::Member,
        },
    }
}

/// What a suspended array does with writes (`-o on_host_error=`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OnHostError {
    /// Answer EIO (EROFS when the host is read-only) until it recovers.
    #[default]
    Fail,
    /// Hold writes until the host recovers (ZFS's `failmode=wait`).
    Wait,
}

impl std::str::FromStr for OnHostError {
    type Err = String;
    fn from_str(s: &str) -> Result<OnHostError, String> {
        match s {
            "fail" => Ok(OnHostError::Fail),
            "wait" => Ok(OnHostError::Wait),
            other => Err(format!("on_host_error={other}: expected 'fail' or 'wait'")),
        }
    }
}

/// Why the array is suspended.
#[derive(Clone, Debug)]
pub struct Suspension {
    pub why: String,
    /// The host said read-only (answer EROFS rather than EIO).
    pub read_only: bool,
    pub since: Instant,
}

pub(crate) struct HostState {
    policy: AtomicU8,
    /// ENOSPC answers from members so far.
    no_space_errors: AtomicU64,
    /// Times below are milliseconds since `epoch` (atomics: every write
    /// asks [`Array::write_through`], so no lock on that path).
    epoch: Instant,
    /// When the last ENOSPC came back (0: never).
    last_no_space: AtomicU64,
    /// The least free space of the members' hosts, and when it was looked up.
    free_bytes: AtomicU64,
    free_checked: AtomicU64,
    suspended: Mutex<Option<Suspension>>,
    /// Whether `suspended` is set: every write asks, without the lock.
    is_suspended: AtomicBool,
    resumed: Condvar,
    /// Serialises failure decisions (probes, then records).
    deciding: parking_lot::ReentrantMutex<()>,
    /// The watcher thread of a running array, and its wake-up line.
    watcher: Mutex<Option<(Sender<()>, JoinHandle<()>)>>,
}

impl Default for HostState {
    fn default() -> HostState {
        HostState {
            policy: AtomicU8::new(0),
            no_space_errors: AtomicU64::new(0),
            epoch: Instant::now(),
            last_no_space: AtomicU64::new(0),
            free_bytes: AtomicU64::new(u64::MAX),
            free_checked: AtomicU64::new(0),
            suspended: Mutex::new(None),
            is_suspended: AtomicBool::new(false),
            resumed: Condvar::new(),
            deciding: parking_lot::ReentrantMutex::new(()),
            watcher: Mutex::new(None),
        }
    }
}

impl HostState {
    pub fn set_policy(&self, policy: OnHostError) {
        self.policy.store(
            match policy {
                OnHostError::Fail => 0,
                OnHostError::Wait => 1,
            },
            Ordering::Release,
        );
    }

    pub fn policy(&self) -> OnHostError {
        match self.policy.load(Ordering::Acquire) {
            1 => OnHostError::Wait,
            _ => OnHostError::Fail,
        }
    }

    pub fn suspension(&self) -> Option<Suspension> {
        if !self.is_suspended.load(Ordering::Acquire) {
            return None;
        }
        self.suspended.lock().clone()
    }

    pub fn no_space_errors(&self) -> u64 {
        self.no_space_errors.load(Ordering::Relaxed)
    }

    /// Milliseconds since `epoch`, at least 1 (0 means never).
    fn now_ms(&self) -> u64 {
        (self.epoch.elapsed().as_millis() as u64).max(1)
    }

    /// Whether an ENOSPC came back recently.
    pub fn short_of_space(&self) -> bool {
        let last = self.last_no_space.load(Ordering::Relaxed);
        last != 0 && self.now_ms().saturating_sub(last) < NO_SPACE_RECENT.as_millis() as u64
    }

    fn note_no_space(&self) {
        self.no_space_errors.fetch_add(1, Ordering::Relaxed);
        self.last_no_space.store(self.now_ms(), Ordering::Relaxed);
    }

    /// The error a request gets while the array is suspended.
    pub fn suspended_error(&self) -> Option<ArrayError> {
        if !self.is_suspended.load(Ordering::Acquire) {
            return None;
        }
        self.suspended
            .lock()
            .as_ref()
            .map(|s| ArrayError::HostFault {
                read_only: s.read_only,
                why: s.why.clone(),
            })
    }
}

fn probe_block() -> Vec<u8> {
    let mut block = vec![0u8; PROBE_SIZE];
    block[..8].copy_from_slice(b"RAIDPRB1");
    let now = super::state::now_secs();
    block[8..16].copy_from_slice(&now.to_le_bytes());
    block
}

/// A small durable write where nothing lives: does the member take writes?
fn probe(member: &dyn Member) -> io::Result<()> {
    if member.len() < PROBE_OFFSET + PROBE_SIZE as u64 {
        return Ok(());
    }
    member.write_durable(&probe_block(), PROBE_OFFSET)
}

impl Array {
    /// What the host's suspension or free space means for a write that is
    /// about to start: an error while suspended (or a wait, under
    /// `on_host_error=wait`).
    pub(crate) fn host_gate(&self) -> ArrayResult<()> {
        if !self.host.is_suspended.load(Ordering::Acquire) {
            return Ok(());
        }
        let mut suspended = self.host.suspended.lock();
        while suspended.is_some() {
            if self.host.policy() == OnHostError::Fail || self.sync.stop.load(Ordering::Acquire) {
                let s = suspended.as_ref().map(|s| (s.read_only, s.why.clone()));
                let (read_only, why) = s.unwrap_or_default();
                return Err(ArrayError::HostFault { read_only, why });
            }
            self.host
                .resumed
                .wait_for(&mut suspended, Duration::from_millis(500));
        }
        Ok(())
    }

    /// After the host refused a write again: under `on_host_error=wait`
    /// (and a suspended array not being stopped) wait a while for the host
    /// and say true, to try again; false when the error is the answer.
    pub(crate) fn wait_for_host(&self, e: &ArrayError) -> bool {
        let waits = matches!(e, ArrayError::HostFault { .. })
            && self.host.policy() == OnHostError::Wait
            && !self.sync.stop.load(Ordering::Acquire);
        if waits {
            let mut suspended = self.host.suspended.lock();
            if suspended.is_some() {
                self.host
                    .resumed
                    .wait_for(&mut suspended, Duration::from_millis(500));
            }
        }
        waits
    }

    /// Whether writes should reach the members before they are answered:
    /// the host is short of space (an ENOSPC lately, or little free).
    pub(crate) fn write_through(&self) -> bool {
        let host = &self.host;
        if host.short_of_space() {
            return true;
        }
        let now = host.now_ms();
        let checked = host.free_checked.load(Ordering::Relaxed);
        let due =
            checked == 0 || now.saturating_sub(checked) >= FREE_SPACE_EVERY.as_millis() as u64;
        // One writer looks the space up; the others use the last figure.
        if due
            && host
                .free_checked
                .compare_exchange(checked, now, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        {
            let least = self
                .present_members()
                .iter()
                .filter_map(|(_, m)| m.host_free_bytes())
                .min()
                .unwrap_or(u64::MAX);
            host.free_bytes.store(least, Ordering::Relaxed);
        }
        host.free_bytes.load(Ordering::Relaxed) < LOW_SPACE
    }

    /// A member I/O error: decide whose it is and act. Returns the error
    /// the request must report when it is the host's (out of space,
    /// suspended); None when a member was failed and the array goes on.
    /// `span` is the member byte range a failed write touched.
    pub(crate) fn member_error(
        &self,
        slot: usize,
        e: &io::Error,
        what: &str,
        span: Option<(u64, u64)>,
    ) -> Option<ArrayError> {
        // Stripes the failed write touched may be half written on members
        // that stay in the array: suspect, unless this member leaves it
        // (the survivors then hold the whole write, and a degraded read
        // rebuilds its part from them).
        let suspect = |array: &Self| {
            if let Some((start, end)) = span {
                array.bitmap.mark_suspect(start, end);
            }
        };
        match classify(e) {
            Fault::NoSpace => {
                suspect(self);
                // The watcher retries the resync of what turned suspect.
                self.wake_host_watcher();
                self.host.note_no_space();
                log::warn!(
                    "raidfs: {} has no space left on its host ({what}: {e}); the request fails with ENOSPC, the member stays in the array",
                    self.slots[slot].name()
                );
                Some(ArrayError::HostNoSpace(format!(
                    "{}: {what}: {e}",
                    self.slots[slot].name()
                )))
            }
            fault => {
                self.decide_failure(slot, &format!("{what}: {e}"), fault);
                if !self.is_failed(slot) {
                    suspect(self);
                }
                self.host.suspended_error()
            }
        }
    }

    /// Probe the other members, then record `slot` (and any member whose
    /// probe failed) as failed, or suspend the array when the failures are
    /// the host's: every member, or more than the array can lose.
    fn decide_failure(&self, slot: usize, why: &str, fault: Fault) {
        if self.is_failed(slot) || self.host.suspension().is_some() {
            return;
        }
        if self.read_only {
            // Nothing is recorded on an array assembled read-only.
            self.leave_out_slot(slot);
            log::error!(
                "raidfs: member {} (slot {slot}) left out: {why}",
                self.slots[slot].name()
            );
            return;
        }
        let _deciding = self.host.deciding.lock();
        if self.is_failed(slot) || self.host.suspension().is_some() {
            return;
        }
        let mut failing = vec![(slot, why.to_string())];
        let mut read_only = fault == Fault::ReadOnlyHost;
        let mut host_side = fault == Fault::ReadOnlyHost;
        let present = self.present_members();
        let working = present.len();
        for (other, member) in present {
            if other == slot {
                continue;
            }
            if let Err(e) = probe(member.as_ref()) {
                let f = classify(&e);
                read_only |= f == Fault::ReadOnlyHost;
                host_side |= f != Fault::Member;
                failing.push((
                    other,
                    format!("probe after {} failed: {e}", self.slots[slot].name()),
                ));
            }
        }
        let mut without = self.unreadable_slots();
        without.extend(failing.iter().map(|(s, _)| *s));
        let survives = self.survives_without(&without);
        let everything = failing.len() >= working && working > 1;
        if everything || !survives || (host_side && failing.len() > 1) {
            let names: Vec<String> = failing
                .iter()
                .map(|(s, why)| format!("{} ({why})", self.slots[*s].name()))
                .collect();
            self.suspend(
                format!(
                    "{} of {working} members failed at once: {}",
                    failing.len(),
                    names.join("; ")
                ),
                read_only,
            );
            return;
        }
        for (s, why) in failing {
            self.record_failure(s, &why);
        }
    }

    /// Stop writing until the host answers again; nothing is recorded.
    fn suspend(&self, why: String, read_only: bool) {
        {
            let mut suspended = self.host.suspended.lock();
            if suspended.is_some() {
                return;
            }
            *suspended = Some(Suspension {
                why: why.clone(),
                read_only,
                since: Instant::now(),
            });
            self.host.is_suspended.store(true, Ordering::Release);
        }
        log::error!(
            "raidfs: the host failed every member at once ({why}); no member is marked failed, writes are {} until the host recovers",
            match self.host.policy() {
                OnHostError::Fail => "refused",
                OnHostError::Wait => "held",
            }
        );
        self.wake_host_watcher();
    }

    /// Start the watcher of a running array: idle until the host suspends
    /// the array, then it probes the members every [`PROBE_EVERY`] and
    /// resumes the array when they all answer; while regions are suspect
    /// (a write the host refused for space) it retries their resync every
    /// [`SUSPECT_RETRY_EVERY`]. It is a thread of its own,
    /// holding only a `Weak`, because every other thread may be waiting
    /// for the resume (writes under `on_host_error=wait` do). Without it
    /// (tools, tests) a suspended array is resumed by hand.
    pub(super) fn start_host_watcher(&self, weak: Weak<Array>) {
        let mut watcher = self.host.watcher.lock();
        if watcher.is_some() {
            return;
        }
        let (tx, rx) = crossbeam_channel::bounded::<()>(1);
        let spawned = std::thread::Builder::new()
            .name("raidfs-host".into())
            .spawn(move || loop {
                let (suspended, suspect) = match weak.upgrade() {
                    Some(array) => (
                        array.host.suspension().is_some(),
                        array.bitmap.has_suspect(),
                    ),
                    None => return,
                };
                let woken = if suspended || suspect {
                    let every = if suspended {
                        PROBE_EVERY
                    } else {
                        SUSPECT_RETRY_EVERY
                    };
                    rx.recv_timeout(every)
                        .map_err(|e| e == RecvTimeoutError::Disconnected)
                } else {
                    rx.recv().map_err(|_| true)
                };
                // A hang-up stops the thread.
                if woken == Err(true) {
                    return;
                }
                let Some(array) = weak.upgrade() else { return };
                if woken.is_err() {
                    if array.host.suspension().is_some() {
                        array.try_resume();
                    } else {
                        // Space may have come back with no flush to notice:
                        // the suspect regions are resynced without waiting
                        // for the next write.
                        array.resync_suspect();
                    }
                }
            });
        match spawned {
            Ok(handle) => *watcher = Some((tx, handle)),
            Err(e) => log::error!(
                "cannot start the host watcher ({e}); a suspended array resumes with a remount"
            ),
        }
    }

    /// The host suspended the array: the watcher starts probing.
    fn wake_host_watcher(&self) {
        if let Some((tx, _)) = self.host.watcher.lock().as_ref() {
            // A full line means it is about to look anyway.
            let _ = tx.try_send(());
        }
    }

    pub(super) fn stop_host_watcher(&self) {
        let watcher = self.host.watcher.lock().take();
        if let Some((tx, handle)) = watcher {
            drop(tx);
            if handle.thread().id() != std::thread::current().id() {
                let _ = handle.join();
            }
        }
    }

    /// Probe every member; if all take writes again, resume the array and
    /// resync what was being written when it stopped. True when running.
    pub fn try_resume(&self) -> bool {
        if self.host.suspension().is_none() {
            return true;
        }
        let members = self.present_members();
        if let Some((slot, e)) = members
            .iter()
            .find_map(|(s, m)| probe(m.as_ref()).err().map(|e| (*s, e)))
        {
            log::debug!("host still failing ({}: {e})", self.slots[slot].name());
            return false;
        }
        let was = {
            let mut suspended = self.host.suspended.lock();
            self.host.is_suspended.store(false, Ordering::Release);
            suspended.take()
        };
        self.host.resumed.notify_all();
        if let Some(s) = was {
            log::warn!(
                "raidfs: every member answers again after {:.1} s; the array resumes",
                s.since.elapsed().as_secs_f64()
            );
        }
        // Writes in flight when the host failed may have left stripes half
        // written: every region the bitmap marks is resynced.
        self.bitmap.mark_all_dirty_suspect();
        self.resync_suspect();
        true
    }

    /// Start a resync of the suspect regions when nothing else runs.
    pub(crate) fn resync_suspect(&self) {
        if !self.bitmap.has_suspect() || self.is_degraded() || self.host.suspension().is_some() {
            return;
        }
        if !self.bitmap.resync_due() {
            return;
        }
        if self.sync_progress().is_some() {
            return;
        }
        if let Err(e) = self.spawn_resync() {
            log::debug!("resync of suspect regions not started: {e}");
        }
    }
}
