//! Member changes on a running array: add (rebuild or hot spare), remove,
//! replace (the old member serves until the new one is complete), and the
//! background work they start: recovery, replacement and scrub (check /
//! repair), with progress, speed limits and checkpoints. The slot state
//! they change is `slot`'s; this module decides when.
//!
//! Background work walks allocated groups only, in member-offset order, in
//! large steps under the stripe locks, so foreground writes to the same
//! stripes wait for the step and writes elsewhere go on. A rebuilding slot's
//! `valid_below` says how far it is done: reads never use it above that
//! point, writes always go to it.

use super::{Array, ArrayError, ArrayResult, SlotDev};
use crate::member::Member;
use crate::superblock::{Superblock, SPARE_SLOT};
use parking_lot::Mutex;
use serde::Serialize;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use uuid::Uuid;

/// Member bytes handled per step of scrub and resync (rebuilds have their
/// own, see `rebuild.rs`).
const STEP_BYTES: u64 = 4 << 20;
/// How often progress is checkpointed into the superblocks.
pub(super) const CHECKPOINT_EVERY: Duration = Duration::from_secs(2);
/// How long a region must stay quiet before its bitmap bit is cleared.
const BITMAP_CLEAN_EVERY: Duration = Duration::from_secs(5);

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SyncAction {
    /// Making redundancy agree again in the regions the write-intent bitmap
    /// marks dirty, after an unclean shutdown.
    Resync,
    /// Rebuilding a slot from the others.
    Recovery,
    /// Copying a slot onto its replacement.
    Replace,
    /// Reading everything and counting mismatches.
    Check,
    /// Like check, rewriting redundancy where it disagrees.
    Repair,
    /// Moving groups to a new geometry (`raidfs grow`).
    Reshape,
}

impl std::fmt::Display for SyncAction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SyncAction::Resync => "resync",
            SyncAction::Recovery => "recovery",
            SyncAction::Replace => "replace",
            SyncAction::Check => "check",
            SyncAction::Repair => "repair",
            SyncAction::Reshape => "reshape",
        })
    }
}

/// Progress of the running background work, as `raidfs status` shows it.
#[derive(Clone, Debug, Serialize)]
pub struct SyncProgress {
    pub action: SyncAction,
    pub slot: Option<usize>,
    /// Member bytes done and to do (allocated groups only).
    pub done: u64,
    pub total: u64,
    /// Bytes per second over the run so far.
    pub speed: u64,
    pub eta_secs: u64,
    /// Check/repair: bytes found inconsistent.
    pub mismatches: u64,
}

/// Outcome of the last finished background work.
#[derive(Clone, Debug, Serialize)]
pub struct SyncResult {
    pub action: SyncAction,
    pub completed: bool,
    pub mismatches: u64,
    pub message: String,
    /// Member bytes done and to do, as the progress showed them last (a
    /// resync's and a re-add's total is the dirty regions' bytes).
    pub done: u64,
    pub total: u64,
}

/// What `add` did with the new member.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub enum AddOutcome {
    /// It took over a failed or missing slot and is being rebuilt.
    Rebuilding { slot: usize },
    /// It was this slot's member before: only regions written since are rebuilt.
    ReAdded { slot: usize },
    /// The array is complete: it waits as a hot spare.
    Spare,
}

struct Running {
    action: SyncAction,
    slot: Option<usize>,
    started: Instant,
    done: Arc<AtomicU64>,
    /// `done` at the start (a resumed recovery's checkpoint).
    resumed_at: u64,
    total: u64,
    /// A resync's or re-add's dirty regions (its `total` is their bytes).
    dirty_regions: Option<usize>,
    mismatches: Arc<AtomicU64>,
    handle: Option<JoinHandle<()>>,
}

/// Background-work state kept in the array.
pub(crate) struct SyncState {
    running: Mutex<Option<Running>>,
    last: Mutex<Option<SyncResult>>,
    pub(super) stop: AtomicBool,
    /// md's speed_limit_min / speed_limit_max, bytes per second (0 = none).
    pub speed_min: AtomicU64,
    pub speed_max: AtomicU64,
    /// Foreground requests so far; background work slows to the minimum
    /// speed while this moves.
    pub foreground: AtomicU64,
    /// The member a running `replace` copies onto.
    pending_replacement: Mutex<Option<SlotDev>>,
    pub(crate) this: Mutex<Weak<Array>>,
    /// The running recovery is a re-add: only dirty regions are copied.
    recovery_bitmap_only: AtomicBool,
    cleaner: Mutex<Option<(crossbeam_channel::Sender<()>, JoinHandle<()>)>>,
    /// The bitmap's suspect generation when the running resync started.
    resync_suspect_gen: AtomicU64,
    /// Stale members given at assembly, to be re-added one after another
    /// once background work may run.
    returning: Mutex<Vec<(Arc<dyn Member>, String)>>,
}

impl Default for SyncState {
    fn default() -> SyncState {
        SyncState {
            running: Mutex::new(None),
            last: Mutex::new(None),
            stop: AtomicBool::new(false),
            speed_min: AtomicU64::new(50 << 20),
            speed_max: AtomicU64::new(0),
            foreground: AtomicU64::new(0),
            pending_replacement: Mutex::new(None),
            this: Mutex::new(Weak::new()),
            cleaner: Mutex::new(None),
            recovery_bitmap_only: AtomicBool::new(false),
            resync_suspect_gen: AtomicU64::new(0),
            returning: Mutex::new(Vec::new()),
        }
    }
}

/// How long after the last foreground request background work still counts
/// the array as busy. Requests come in bursts, and one that waits for a
/// stripe the background work holds completes nothing meanwhile.
const FOREGROUND_RECENT: Duration = Duration::from_secs(1);

/// Tracks elapsed time and paces background work between the speed limits.
pub(super) struct Pacer {
    started: Instant,
    /// Bytes of work started so far.
    done: u64,
    last_foreground: u64,
    /// When the foreground counter was last seen moving.
    foreground_seen: Option<Instant>,
    last_checkpoint: Instant,
}

impl Pacer {
    fn new(foreground: u64) -> Pacer {
        Pacer {
            started: Instant::now(),
            done: 0,
            last_foreground: foreground,
            foreground_seen: None,
            last_checkpoint: Instant::now(),
        }
    }

    /// Count `bytes` more of work as started.
    pub(super) fn add(&mut self, bytes: u64) {
        self.done += bytes;
    }
}

impl Array {
    /// Let background work and spare takeover reach this array; resume a
    /// rebuild that was checkpointed before the last shutdown.
    pub fn start_background(self: &Arc<Array>) {
        *self.sync.this.lock() = Arc::downgrade(self);
        self.write_back.start(Arc::downgrade(self));
        self.stripe_cache.enable();
        self.start_next_work();
        self.start_cleaner();
    }

    /// Start the background work that is due, in order: a recovery that
    /// was checkpointed, then stale members coming back, then the resync
    /// of an unclean shutdown (once no member is missing).
    fn start_next_work(&self) {
        let resuming = (0..self.slots.len()).find(|&i| self.slots[i].is_rebuilding());
        if let Some(slot) = resuming {
            let at = self.slots[slot].valid_below();
            log::info!("resuming recovery of slot {slot} from member offset {at}");
            if let Err(e) = self.spawn(SyncAction::Recovery, Some(slot)) {
                log::error!("cannot resume recovery: {e}");
            }
        } else if self.start_returning() {
        } else if !self.is_degraded() && self.needs_resync.swap(false, Ordering::AcqRel) {
            let (regions, bytes) = self.bitmap.dirty();
            log::info!(
                "resync of {regions} dirty regions ({} MiB of {} MiB allocated)",
                bytes >> 20,
                self.allocated_member_bytes() >> 20
            );
            if let Err(e) = self.spawn(SyncAction::Resync, None) {
                log::error!("cannot start resync: {e}");
            }
        } else if !self.is_degraded() && self.reshape_counts().is_some() {
            log::info!("resuming the reshape");
            if let Err(e) = self.spawn(SyncAction::Reshape, None) {
                log::error!("cannot resume the reshape: {e}");
            }
        }
    }

    /// Change the array's geometry to `to` while it runs: recorded at once,
    /// then moved group by group in the background.
    pub fn start_reshape(&self, to: crate::geometry::Geometry) -> ArrayResult<()> {
        if self.busy() {
            return Err(ArrayError::Refused(format!(
                "{} is running; a reshape starts once it is done",
                self.sync_progress()
                    .map_or_else(|| "background work".to_string(), |p| p.action.to_string())
            )));
        }
        self.begin_reshape(to)?;
        self.spawn(SyncAction::Reshape, None)
    }

    /// Go on with a reshape that was stopped (`raidfs grow --stop`) or
    /// could not run (a degraded array, now rebuilt).
    pub fn resume_reshape(&self) -> ArrayResult<()> {
        if self.reshape_counts().is_none() {
            return Err(ArrayError::Refused("no reshape is under way".into()));
        }
        if self.busy() {
            return Err(ArrayError::Refused("background work is running".into()));
        }
        self.spawn(SyncAction::Reshape, None)
    }

    /// A stale member given at assembly, to come back once the array runs.
    pub(crate) fn queue_returning(&self, member: Arc<dyn Member>, name: String) {
        self.sync.returning.lock().push((member, name));
    }

    pub(crate) fn has_returning(&self) -> bool {
        !self.sync.returning.lock().is_empty()
    }

    /// A spare found at assembly stays a spare.
    pub(crate) fn adopt_spare(&self, member: Arc<dyn Member>, name: String, uuid: Uuid) {
        self.spares.add(SlotDev {
            member: Some(member),
            name,
            uuid,
        });
    }

    /// Bring back the next stale member (re-add from the bitmap, or a full
    /// rebuild into its own slot). True when one started.
    fn start_returning(&self) -> bool {
        loop {
            let Some((member, name)) = self.sync.returning.lock().pop() else {
                return false;
            };
            match self.add(member, name.clone()) {
                Ok(AddOutcome::ReAdded { slot }) | Ok(AddOutcome::Rebuilding { slot }) => {
                    log::info!("{name} is coming back into slot {slot}");
                    return true;
                }
                Ok(AddOutcome::Spare) => log::info!("{name} waits as a hot spare"),
                Err(e) => log::error!("{name} could not be taken back: {e}"),
            }
        }
    }

    /// The bitmap thread: every few seconds it flushes and clears the bits
    /// of regions that saw no writes since the last pass (never while
    /// degraded); in between it writes the bits set ahead of sequential
    /// writers ([`Array::request_premark`]).
    fn start_cleaner(self: &Arc<Array>) {
        let (tx, rx) = crossbeam_channel::bounded::<()>(1);
        let weak = Arc::downgrade(self);
        let spawned = std::thread::Builder::new()
            .name("raidfs-bitmap".into())
            .spawn(move || {
                let mut next_clean = Instant::now() + BITMAP_CLEAN_EVERY;
                loop {
                    // A message asks for a premark; a hang-up stops the thread.
                    let premark = match rx.recv_deadline(next_clean) {
                        Ok(()) => true,
                        Err(crossbeam_channel::RecvTimeoutError::Timeout) => false,
                        Err(crossbeam_channel::RecvTimeoutError::Disconnected) => return,
                    };
                    let Some(array) = weak.upgrade() else { return };
                    if premark {
                        if let Err(e) = array.mark_dirty_regions(None) {
                            log::debug!("bitmap premark: {e}");
                        }
                        array.bitmap.premark_done();
                    } else {
                        array.clean_bitmap();
                        next_clean = Instant::now() + BITMAP_CLEAN_EVERY;
                    }
                }
            });
        match spawned {
            Ok(handle) => *self.sync.cleaner.lock() = Some((tx, handle)),
            Err(e) => log::error!("cannot start the bitmap cleaner: {e}"),
        }
    }

    /// Have the bitmap thread write the bits set ahead of a sequential
    /// writer ([`super::bitmap::Intent::Premark`]). Without the thread (an
    /// array used without [`Array::start_background`]) the bits wait for the writer
    /// that reaches them, which writes them itself.
    pub(crate) fn request_premark(&self) {
        let queued = self
            .sync
            .cleaner
            .lock()
            .as_ref()
            .is_some_and(|(tx, _)| tx.try_send(()).is_ok());
        if !queued {
            self.bitmap.premark_done();
        }
    }

    /// One cleaning pass (also used at clean shutdown); it also does again
    /// the writes the host refused ([`Array::retry_parked`]).
    pub(crate) fn clean_bitmap(&self) {
        if self.host.suspension().is_some() {
            return;
        }
        if self.is_degraded() {
            if self.write_back.has_parked() {
                let _ = self.flush();
            }
            self.bitmap.reset_recent();
            return;
        }
        if self.flush().is_err() {
            return;
        }
        let events = self.sb.lock().events;
        if self.bitmap.clean(events) > 0 {
            self.write_bitmap();
        }
    }

    fn stop_cleaner(&self) {
        let cleaner = self.sync.cleaner.lock().take();
        if let Some((tx, handle)) = cleaner {
            drop(tx);
            let _ = handle.join();
        }
    }

    /// Stop background work (it checkpoints first) and wait for it.
    pub fn stop_background(&self) {
        self.stop_cleaner();
        self.sync.stop.store(true, Ordering::Release);
        let handle = self
            .sync
            .running
            .lock()
            .as_mut()
            .and_then(|r| r.handle.take());
        if let Some(h) = handle {
            let _ = h.join();
        }
        self.sync.stop.store(false, Ordering::Release);
    }

    /// Wait until the running background work (if any) ends by itself.
    pub fn wait_background(&self) {
        let handle = self
            .sync
            .running
            .lock()
            .as_mut()
            .and_then(|r| r.handle.take());
        if let Some(h) = handle {
            let _ = h.join();
        }
    }

    /// Progress of the running background work, if any.
    pub fn sync_progress(&self) -> Option<SyncProgress> {
        let running = self.sync.running.lock();
        let r = running.as_ref()?;
        // A resync's steps may overhang its regions; progress stops at the total.
        let done = r.done.load(Ordering::Relaxed).min(r.total);
        let secs = r.started.elapsed().as_secs_f64().max(0.001);
        // Work a resumed run had already done before this start is not speed.
        let speed = (done.saturating_sub(r.resumed_at) as f64 / secs) as u64;
        let eta_secs = r.total.saturating_sub(done).checked_div(speed).unwrap_or(0);
        Some(SyncProgress {
            action: r.action,
            slot: r.slot,
            done,
            total: r.total,
            speed,
            eta_secs,
            mismatches: r.mismatches.load(Ordering::Relaxed),
        })
    }

    /// How the last background work ended.
    pub fn last_sync_result(&self) -> Option<SyncResult> {
        self.sync.last.lock().clone()
    }

    /// Set md's speed_limit_min / speed_limit_max (bytes per second; 0 = none).
    pub fn set_speed_limits(&self, min: Option<u64>, max: Option<u64>) {
        if let Some(v) = min {
            self.sync.speed_min.store(v, Ordering::Relaxed);
        }
        if let Some(v) = max {
            self.sync.speed_max.store(v, Ordering::Relaxed);
        }
    }

    pub fn speed_limits(&self) -> (u64, u64) {
        (
            self.sync.speed_min.load(Ordering::Relaxed),
            self.sync.speed_max.load(Ordering::Relaxed),
        )
    }

    /// Regions the write-intent bitmap marks dirty, and the member bytes they cover.
    pub fn dirty_regions(&self) -> (usize, u64) {
        self.bitmap.dirty()
    }

    /// Names of the hot spares.
    pub fn spares(&self) -> Vec<String> {
        self.spares.names()
    }

    /// Find a slot by its member's name (path) or by number.
    pub fn slot_of(&self, who: &str) -> Option<usize> {
        if let Ok(n) = who.parse::<usize>() {
            if n < self.slots.len() {
                return Some(n);
            }
        }
        let wanted = std::fs::canonicalize(who).ok();
        (0..self.slots.len()).find(|&i| {
            let name = self.slots[i].name();
            name == who
                || wanted
                    .as_ref()
                    .is_some_and(|w| std::fs::canonicalize(&name).ok().as_ref() == Some(w))
        })
    }

    fn check_new_member(&self, member: &dyn Member) -> ArrayResult<()> {
        let sb = self.sb.lock();
        // From version 2 the end superblock copies must fit after the data.
        let need = sb.min_member_len();
        if member.len() < need {
            return Err(ArrayError::Refused(format!(
                "{} is too small: {} bytes, the array needs {need} per member",
                member.name(),
                member.len()
            )));
        }
        Ok(())
    }

    /// Add a member: it rebuilds into a failed or missing slot, or becomes a
    /// hot spare when the array is complete.
    pub fn add(&self, member: Arc<dyn Member>, name: String) -> ArrayResult<AddOutcome> {
        self.check_new_member(member.as_ref())?;
        if let Some((slot, uuid)) = self.re_add_slot(member.as_ref()) {
            if !self.busy() {
                log::info!("{name} was slot {slot}: re-added; only regions written since it left are rebuilt");
                self.install(slot, member, name, uuid)?;
                self.sync
                    .recovery_bitmap_only
                    .store(true, Ordering::Release);
                self.spawn(SyncAction::Recovery, Some(slot))?;
                return Ok(AddOutcome::ReAdded { slot });
            }
        }
        // A former member goes back into its own slot when that is empty.
        let own = Superblock::read_from(member.as_ref())
            .ok()
            .filter(|(sb, _)| sb.array_uuid == self.uuid())
            .map(|(sb, _)| sb.slot as usize)
            .filter(|&s| s < self.slots.len() && self.is_failed(s));
        let slot = own.or_else(|| (0..self.slots.len()).find(|&i| self.is_failed(i)));
        match slot {
            Some(slot) if !self.busy() => {
                self.sync
                    .recovery_bitmap_only
                    .store(false, Ordering::Release);
                self.install(slot, member, name, Uuid::new_v4())?;
                self.spawn(SyncAction::Recovery, Some(slot))?;
                Ok(AddOutcome::Rebuilding { slot })
            }
            _ => {
                let uuid = self.write_spare_superblock(member.as_ref(), &name)?;
                log::info!("{name} added as a hot spare");
                self.spares.add(SlotDev {
                    member: Some(member),
                    name,
                    uuid,
                });
                Ok(AddOutcome::Spare)
            }
        }
    }

    /// Claim `member` for this array as a spare (a new member UUID, no
    /// slot yet), so no other array or tool takes it meanwhile.
    fn write_spare_superblock(&self, member: &dyn Member, name: &str) -> ArrayResult<Uuid> {
        let uuid = Uuid::new_v4();
        let mut sb = self.superblock();
        sb.member_uuid = uuid;
        sb.slot = SPARE_SLOT;
        sb.write_to(member).map_err(|source| ArrayError::MemberIo {
            path: name.to_string(),
            source,
        })?;
        Ok(uuid)
    }

    /// A former member of this array whose slot is empty, and that left after
    /// the bitmap was last cleared, can catch up from the bitmap alone
    /// (md's --re-add). Returns its slot and member UUID.
    fn re_add_slot(&self, member: &dyn Member) -> Option<(usize, Uuid)> {
        let (sb, _) = Superblock::read_from(member).ok()?;
        let ours = self.sb.lock().array_uuid;
        let slot = sb.slot as usize;
        let fits = sb.array_uuid == ours && slot < self.slots.len() && self.is_failed(slot);
        (fits && sb.events >= self.bitmap.events_cleared()).then_some((slot, sb.member_uuid))
    }

    /// Put `member` (as member `uuid`) into `slot` with nothing valid yet,
    /// and record it.
    fn install(
        &self,
        slot: usize,
        member: Arc<dyn Member>,
        name: String,
        uuid: Uuid,
    ) -> ArrayResult<()> {
        let data_offset = self.sb.lock().data_offset;
        let dev = SlotDev {
            member: Some(Arc::clone(&member)),
            name: name.clone(),
            uuid,
        };
        self.install_slot(slot, dev, data_offset, || {
            self.pool
                .attach(slot, member)
                .map_err(|e| ArrayError::Refused(format!("cannot start workers for {name}: {e}")))
        })?;
        log::info!("{name} takes slot {slot}; recovery starts");
        self.write_superblocks()
    }

    /// A member failed: a hot spare, if there is one, takes its place.
    pub(crate) fn take_spare(&self, slot: usize) {
        let Some(dev) = self.spares.take() else {
            return;
        };
        let Some(member) = dev.member else { return };
        if self.busy() {
            self.spares.add(SlotDev {
                member: Some(member),
                name: dev.name,
                uuid: dev.uuid,
            });
            return;
        }
        log::warn!("hot spare {} replaces failed slot {slot}", dev.name);
        let result = self
            .install(slot, member, dev.name, Uuid::new_v4())
            .and_then(|()| self.spawn(SyncAction::Recovery, Some(slot)));
        if let Err(e) = result {
            log::error!("spare takeover of slot {slot} failed: {e}");
        }
    }

    /// Remove a failed member (or a spare, by name) from the array.
    pub fn remove(&self, who: &str) -> ArrayResult<()> {
        if self.spares.remove(who) {
            log::info!("spare {who} removed");
            return Ok(());
        }
        let slot = self
            .slot_of(who)
            .ok_or_else(|| ArrayError::Refused(format!("{who} is not a member of this array")))?;
        if !self.is_failed(slot) {
            return Err(ArrayError::Refused(format!(
                "{} is active; mark it failed first (raidfs fail)",
                self.slots[slot].name()
            )));
        }
        self.pool.detach(slot);
        let name = self.remove_slot_member(slot);
        log::info!("{name} removed from slot {slot}");
        self.write_superblocks()
    }

    /// Replace `slot`'s member with `member`: the old one serves reads until
    /// the new one holds everything, then leaves the array.
    pub fn replace(&self, slot: usize, member: Arc<dyn Member>, name: String) -> ArrayResult<()> {
        self.check_new_member(member.as_ref())?;
        if slot >= self.slots.len() || self.is_failed(slot) {
            return Err(ArrayError::Refused(format!(
                "slot {slot} is not active; use add to rebuild it"
            )));
        }
        if self.busy() {
            return Err(ArrayError::Refused(
                "other background work is running; wait for it or stop it".into(),
            ));
        }
        let uuid = self.write_spare_superblock(member.as_ref(), &name)?;
        self.pool
            .set_replacement(slot, Some(Arc::clone(&member)))
            .map_err(|e| ArrayError::Refused(format!("cannot start workers for {name}: {e}")))?;
        *self.sync.pending_replacement.lock() = Some(SlotDev {
            member: Some(member),
            name,
            uuid,
        });
        self.spawn(SyncAction::Replace, Some(slot))
    }

    /// Start a scrub: `repair` rewrites redundancy that disagrees.
    pub fn start_check(&self, repair: bool) -> ArrayResult<()> {
        if self.busy() {
            return Err(ArrayError::Refused(
                "other background work is running".into(),
            ));
        }
        self.spawn(
            if repair {
                SyncAction::Repair
            } else {
                SyncAction::Check
            },
            None,
        )
    }

    /// Member bytes of allocated groups (what background work walks).
    fn allocated_member_bytes(&self) -> u64 {
        let group_size = self.sb.lock().group_size;
        self.groups().len() as u64 * group_size
    }

    /// Member bytes a resumed recovery has already covered.
    fn already_done(&self, action: SyncAction, slot: Option<usize>) -> u64 {
        if action == SyncAction::Reshape {
            let group_size = self.sb.lock().group_size;
            return self
                .reshape_counts()
                .map_or(0, |(pending, all)| (all - pending) as u64 * group_size);
        }
        let (Some(slot), SyncAction::Recovery) = (slot, action) else {
            return 0;
        };
        let valid = self.slots[slot].valid_below();
        let (group_size, data_offset) = {
            let sb = self.sb.lock();
            (sb.group_size, sb.data_offset)
        };
        self.groups()
            .iter()
            .map(|(g, _)| {
                valid
                    .saturating_sub(data_offset + *g as u64 * group_size)
                    .min(group_size)
            })
            .sum()
    }

    /// Resync the regions the bitmap marks (suspect ones among them) on a
    /// running array.
    pub(crate) fn spawn_resync(&self) -> ArrayResult<()> {
        let gen = self.bitmap.suspect_generation();
        self.sync.resync_suspect_gen.store(gen, Ordering::Release);
        log::info!("resync of the regions a host fault may have left inconsistent");
        self.spawn(SyncAction::Resync, None)
    }

    fn spawn(&self, action: SyncAction, slot: Option<usize>) -> ArrayResult<()> {
        let this = self.sync.this.lock().upgrade().ok_or_else(|| {
            ArrayError::Refused(
                "background work needs a running array (start_background was not called)".into(),
            )
        })?;
        let mut running = self.sync.running.lock();
        if let Some(r) = running.as_ref() {
            if r.handle.as_ref().is_some_and(|h| !h.is_finished()) {
                return Err(ArrayError::Refused(format!(
                    "{} is already running",
                    r.action
                )));
            }
        }
        let resumed_at = self.already_done(action, slot);
        // A resync or a re-add only visits dirty regions: that is its size.
        let (dirty_regions, total) = if self.bitmap_only(action) {
            let (regions, bytes) = self.bitmap.dirty();
            (Some(regions), bytes)
        } else {
            (None, self.allocated_member_bytes())
        };
        let done = Arc::new(AtomicU64::new(resumed_at));
        let mismatches = Arc::new(AtomicU64::new(0));
        let (d, m) = (Arc::clone(&done), Arc::clone(&mismatches));
        let handle = std::thread::Builder::new()
            .name(format!("raidfs-{action}"))
            .spawn(move || {
                let outcome = this.run_sync(action, slot, &d, &m);
                this.finish_sync(action, slot, outcome, m.load(Ordering::Relaxed));
            })
            .map_err(|e| ArrayError::Refused(format!("cannot start {action}: {e}")))?;
        *running = Some(Running {
            action,
            slot,
            started: Instant::now(),
            done,
            resumed_at,
            total,
            dirty_regions,
            mismatches,
            handle: Some(handle),
        });
        Ok(())
    }

    fn finish_sync(
        &self,
        action: SyncAction,
        slot: Option<usize>,
        outcome: ArrayResult<bool>,
        mismatches: u64,
    ) {
        let (done, total, dirty_regions) = self
            .sync
            .running
            .lock()
            .as_ref()
            .map(|r| {
                let total = r.total;
                (
                    r.done.load(Ordering::Relaxed).min(total),
                    total,
                    r.dirty_regions,
                )
            })
            .unwrap_or_default();
        let (completed, mut message) = match outcome {
            Ok(true) => (true, format!("{action} finished")),
            Ok(false) => (
                false,
                format!("{action} stopped; it resumes from its checkpoint"),
            ),
            Err(e) => (false, format!("{action} failed: {e}")),
        };
        if let Some(regions) = dirty_regions {
            message.push_str(&format!(
                ": {regions} dirty regions, {} of {} MiB",
                done >> 20,
                total >> 20
            ));
        }
        self.sync
            .recovery_bitmap_only
            .store(false, Ordering::Release);
        if !completed && action == SyncAction::Resync {
            self.bitmap.resync_failed();
        }
        if completed {
            match (action, slot) {
                (SyncAction::Resync, _) => self
                    .bitmap
                    .resynced(self.sync.resync_suspect_gen.load(Ordering::Acquire)),
                (SyncAction::Recovery, Some(s)) => self.recovery_done(s),
                (SyncAction::Replace, Some(s)) => self.replacement_done(s),
                _ => {}
            }
        } else if action == SyncAction::Replace {
            if let Some(s) = slot {
                let _ = self.pool.set_replacement(s, None);
            }
            *self.sync.pending_replacement.lock() = None;
        }
        if matches!(action, SyncAction::Check | SyncAction::Repair) {
            log::info!("{message}: {mismatches} bytes mismatched");
        } else {
            log::info!("{message}");
        }
        // The result first, then the running entry goes: whoever sees no
        // running work (`raidfs check --wait`) then reads this run's result.
        *self.sync.last.lock() = Some(SyncResult {
            action,
            completed,
            mismatches,
            message,
            done,
            total,
        });
        if let Some(r) = self.sync.running.lock().as_mut() {
            r.handle.take();
        }
        // The next work starts before this entry goes, so nobody watching
        // sees the array idle between a recovery and the resync after it.
        if completed && !self.sync.stop.load(Ordering::Acquire) {
            self.start_next_work();
        }
        let mut running = self.sync.running.lock();
        if running.as_ref().is_some_and(|r| r.handle.is_none()) {
            *running = None;
        }
    }

    /// Whether background work is running (its thread not yet finishing).
    fn busy(&self) -> bool {
        self.sync
            .running
            .lock()
            .as_ref()
            .is_some_and(|r| r.handle.is_some())
    }

    fn recovery_done(&self, slot: usize) {
        self.complete_recovery(slot);
        self.broken.store(false, Ordering::Release);
        self.check_tolerance();
        if let Err(e) = self.write_superblocks() {
            log::error!("recording the end of recovery: {e}");
        }
        log::info!(
            "recovery of slot {slot} ({}) is complete",
            self.slots[slot].name()
        );
    }

    fn replacement_done(&self, slot: usize) {
        let Some(dev) = self.sync.pending_replacement.lock().take() else {
            return;
        };
        let Some(member) = dev.member.clone() else {
            return;
        };
        if self.pool.replacement_failed(slot) {
            log::error!(
                "replacement of slot {slot} abandoned: writes to {} failed",
                dev.name
            );
            let _ = self.pool.set_replacement(slot, None);
            return;
        }
        let old = self.slots[slot].name();
        // Writes keep reaching the new member through the replacement lane
        // until it becomes the slot's main lane, so nothing is missed.
        if let Err(e) = self.pool.attach(slot, Arc::clone(&member)) {
            log::error!("replacement of slot {slot} failed: {e}");
            return;
        }
        self.swap_slot_device(slot, dev);
        let _ = self.pool.set_replacement(slot, None);
        if let Err(e) = self.write_superblocks() {
            log::error!("recording the replacement: {e}");
        }
        log::info!("slot {slot}: {old} replaced by {}", self.slots[slot].name());
    }

    /// Body of a background run. Ok(true): finished; Ok(false): stopped.
    fn run_sync(
        &self,
        action: SyncAction,
        slot: Option<usize>,
        done: &AtomicU64,
        mismatches: &AtomicU64,
    ) -> ArrayResult<bool> {
        let mut pacer = Pacer::new(self.sync.foreground.load(Ordering::Relaxed));
        if matches!(action, SyncAction::Recovery | SyncAction::Replace) {
            let slot = slot.ok_or_else(|| ArrayError::Refused("no slot to rebuild".into()))?;
            return self.run_rebuild(action, slot, done, &mut pacer);
        }
        if action == SyncAction::Reshape {
            return self.run_reshape(done, &mut pacer);
        }
        let group_size = self.sb.lock().group_size;
        for (group, _) in self.groups() {
            let Some(region) = self.group_region(group) else {
                continue;
            };
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
                self.pace(&mut pacer, bytes);
            }
        }
        Ok(true)
    }

    /// Resync and re-add only touch regions the write-intent bitmap marks.
    pub(super) fn skip_step(&self, action: SyncAction, (start, end): (u64, u64)) -> bool {
        self.bitmap_only(action) && !self.bitmap.any_dirty(start, end)
    }

    /// Whether `action` visits only the regions the bitmap marks dirty.
    fn bitmap_only(&self, action: SyncAction) -> bool {
        match action {
            SyncAction::Resync => true,
            SyncAction::Recovery => self.sync.recovery_bitmap_only.load(Ordering::Acquire),
            _ => false,
        }
    }

    /// Keep background work between the speed limits (see `pace_due`) and
    /// checkpoint, after `bytes` more were done.
    pub(super) fn pace(&self, p: &mut Pacer, bytes: u64) {
        p.add(bytes);
        if let Some(until) = self.pace_due(p) {
            self.nap_until(until);
        }
        if self.checkpoint_due(p) {
            self.checkpoint(p);
        }
    }

    /// When background work may go on, if it is ahead of the limit in force:
    /// the minimum while foreground I/O is flowing, else the maximum.
    pub(super) fn pace_due(&self, p: &mut Pacer) -> Option<Instant> {
        let foreground = self.sync.foreground.load(Ordering::Relaxed);
        if foreground != p.last_foreground {
            p.last_foreground = foreground;
            p.foreground_seen = Some(Instant::now());
        }
        let busy = p
            .foreground_seen
            .is_some_and(|t| t.elapsed() < FOREGROUND_RECENT);
        let (min, max) = self.speed_limits();
        let limit = if busy && min > 0 {
            min
        } else if max > 0 {
            max
        } else {
            return None;
        };
        let due = p.started + Duration::from_secs_f64(p.done as f64 / limit as f64);
        (due > Instant::now()).then_some(due)
    }

    /// Wait until `until`, or a stop request.
    pub(super) fn nap_until(&self, until: Instant) {
        // Pacing a rate, not synchronising: wait out the surplus in short
        // naps so a stop request is seen quickly.
        while !self.sync.stop.load(Ordering::Acquire) {
            let now = Instant::now();
            if until <= now {
                break;
            }
            std::thread::sleep((until - now).min(Duration::from_millis(100)));
        }
    }

    pub(super) fn checkpoint_due(&self, p: &Pacer) -> bool {
        p.last_checkpoint.elapsed() >= CHECKPOINT_EVERY
    }

    /// Record progress (a rebuild's `valid_below`) in the superblocks.
    pub(super) fn checkpoint(&self, p: &mut Pacer) {
        p.last_checkpoint = Instant::now();
        let _ = self.write_superblocks();
    }
}
