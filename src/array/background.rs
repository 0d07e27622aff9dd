//! The background runner: one long-lived sync worker per running array
//! that carries out recovery, replacement, resync and scrub one job at a
//! time, with their progress, results, and the order in which due work
//! starts. What each kind of work does is elsewhere (`rebuild` for
//! recovery and replace, `scrub` for check, repair and resync); pacing and
//! checkpoints are `pace`'s.
//!
//! The worker holds only a `Weak` to its array (taken in
//! [`Array::start_background`]), so the array is dropped when its last user
//! lets go; a job upgrades it for as long as it runs. Callers start work
//! with [`Array::spawn`], which records the job as running before the
//! worker takes it, so a second start is refused at once; an array that
//! runs no worker (tools, tests that never call `start_background`)
//! refuses background work.

use super::pace::Pacer;
use super::{Array, ArrayError, ArrayResult, SlotDev};
use crate::member::Member;
use parking_lot::{Condvar, Mutex};
use serde::Serialize;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::Instant;

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

impl SyncAction {
    /// Check or repair: the scrubs a person starts, pauses and resumes.
    pub fn is_scrub(self) -> bool {
        matches!(self, SyncAction::Check | SyncAction::Repair)
    }
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
    /// This mount's number of the run (1, 2, ...): a waiter tells its run
    /// from the work that follows it.
    pub run: u64,
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

impl SyncProgress {
    /// Done as a percentage of the total, for messages.
    pub fn percent(&self) -> f64 {
        percent(self.done, self.total)
    }
}

/// `done` of `total` as a percentage (100 for an empty total).
pub fn percent(done: u64, total: u64) -> f64 {
    if total == 0 {
        100.0
    } else {
        done as f64 * 100.0 / total as f64
    }
}

/// Outcome of the last finished background work.
#[derive(Clone, Debug, Serialize)]
pub struct SyncResult {
    /// The run's number, as in [`SyncProgress::run`].
    pub run: u64,
    pub action: SyncAction,
    pub completed: bool,
    pub mismatches: u64,
    pub message: String,
    /// Member bytes done and to do, as the progress showed them last (a
    /// resync's and a re-add's total is the dirty regions' bytes).
    pub done: u64,
    pub total: u64,
}

/// One piece of work for the sync worker.
struct Job {
    action: SyncAction,
    slot: Option<usize>,
    /// Member offset below which the work was done before (a resumed scrub).
    from: u64,
    done: Arc<AtomicU64>,
    mismatches: Arc<AtomicU64>,
}

struct Running {
    /// Sequence number of the run, for waiters.
    id: u64,
    action: SyncAction,
    slot: Option<usize>,
    started: Instant,
    done: Arc<AtomicU64>,
    /// `done` at the start (a resumed recovery's or scrub's checkpoint).
    resumed_at: u64,
    total: u64,
    /// A resync's or re-add's dirty regions (its `total` is their bytes).
    dirty_regions: Option<usize>,
    mismatches: Arc<AtomicU64>,
    /// Queued or running; false once the run is finishing (its result is
    /// recorded, and the next work may start).
    active: bool,
}

/// The sync worker thread and the queue that feeds it.
struct Worker {
    jobs: crossbeam_channel::Sender<Job>,
    handle: JoinHandle<()>,
}

/// Background-work state kept in the array.
pub(crate) struct SyncState {
    running: Mutex<Option<Running>>,
    /// Runs started and runs ended so far (run ids count from 1).
    started_runs: AtomicU64,
    ended_runs: Mutex<u64>,
    ended: Condvar,
    last: Mutex<Option<SyncResult>>,
    worker: Mutex<Option<Worker>>,
    pub(super) stop: AtomicBool,
    /// md's speed_limit_min / speed_limit_max, bytes per second (0 = none).
    pub speed_min: AtomicU64,
    pub speed_max: AtomicU64,
    /// Foreground requests so far; background work slows to the minimum
    /// speed while this moves.
    pub foreground: AtomicU64,
    /// The member a running `replace` copies onto.
    pub(super) pending_replacement: Mutex<Option<SlotDev>>,
    /// The running recovery is a re-add: only dirty regions are copied.
    pub(super) recovery_bitmap_only: AtomicBool,
    /// The bitmap's suspect generation when the running resync started.
    resync_suspect_gen: AtomicU64,
    /// Stale members given at assembly, to be re-added one after another
    /// once background work may run.
    pub(super) returning: Mutex<Vec<(Arc<dyn Member>, String)>>,
}

impl Default for SyncState {
    fn default() -> SyncState {
        SyncState {
            running: Mutex::new(None),
            started_runs: AtomicU64::new(0),
            ended_runs: Mutex::new(0),
            ended: Condvar::new(),
            last: Mutex::new(None),
            worker: Mutex::new(None),
            stop: AtomicBool::new(false),
            speed_min: AtomicU64::new(50 << 20),
            speed_max: AtomicU64::new(0),
            foreground: AtomicU64::new(0),
            pending_replacement: Mutex::new(None),
            recovery_bitmap_only: AtomicBool::new(false),
            resync_suspect_gen: AtomicU64::new(0),
            returning: Mutex::new(Vec::new()),
        }
    }
}

impl Array {
    /// Let background work and spare takeover reach this array: start the
    /// sync worker, the write-back reaper, the host watcher and the bitmap
    /// thread (each holding only a `Weak`), then the work that is due (a
    /// rebuild checkpointed before the last shutdown).
    pub fn start_background(self: &Arc<Array>) {
        self.start_sync_worker(Arc::downgrade(self));
        self.write_back.start(Arc::downgrade(self));
        self.start_host_watcher(Arc::downgrade(self));
        self.stripe_cache.enable();
        self.start_next_work();
        self.start_cleaner(Arc::downgrade(self));
        self.start_rejoin(Arc::downgrade(self));
    }

    fn start_sync_worker(&self, array: Weak<Array>) {
        let mut worker = self.sync.worker.lock();
        if worker.is_some() {
            return;
        }
        let (tx, rx) = crossbeam_channel::unbounded::<Job>();
        let spawned = std::thread::Builder::new()
            .name("raidfs-sync".into())
            .spawn(move || {
                // A hang-up (shutdown, or the array dropped) ends the thread.
                while let Ok(job) = rx.recv() {
                    let Some(array) = array.upgrade() else { return };
                    let outcome = array.run_sync(&job);
                    let mismatches = job.mismatches.load(Ordering::Relaxed);
                    array.finish_sync(job.action, job.slot, outcome, mismatches);
                }
            });
        match spawned {
            Ok(handle) => *worker = Some(Worker { jobs: tx, handle }),
            Err(e) => log::error!("cannot start the sync worker ({e}): background work is refused"),
        }
    }

    /// Start the background work that is due, in order: a recovery that
    /// was checkpointed, then stale members coming back, then the resync
    /// of an unclean shutdown (once no member is missing).
    pub(super) fn start_next_work(&self) {
        let resuming = (0..self.slots.len()).find(|&i| self.slots[i].is_rebuilding());
        if let Some(slot) = resuming {
            let at = self.slots[slot].valid_below();
            log::info!("resuming recovery of slot {slot} from member offset {at}");
            if let Err(e) = self.spawn(SyncAction::Recovery, Some(slot)) {
                log::error!("cannot resume recovery: {e}");
            }
        } else if self.start_returning() {
        } else if !self.is_degraded() && self.needs_resync.swap(false, Ordering::AcqRel) {
            let (regions, _) = self.bitmap.dirty();
            log::info!(
                "resync of {regions} dirty regions ({} MiB of {} MiB allocated)",
                self.dirty_allocated_bytes() >> 20,
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
        self.start_reshape_adding(to, Vec::new())
    }

    /// [`Array::start_reshape`] onto `added` new members as well (`raidfs
    /// grow --add`): the target geometry counts them.
    pub fn start_reshape_adding(
        &self,
        to: crate::geometry::Geometry,
        added: Vec<(Arc<dyn crate::member::Member>, String)>,
    ) -> ArrayResult<()> {
        if let Some(p) = self.sync_progress() {
            return Err(ArrayError::Refused(format!(
                "{} is running ({:.1}%); a reshape can start once it ends",
                p.action,
                percent(p.done, p.total)
            )));
        }
        match self.begin_reshape(to, added)? {
            super::reshape::Begun::Reshape => self.spawn(SyncAction::Reshape, None),
            super::reshape::Begun::Recovery(slot) => self.spawn(SyncAction::Recovery, Some(slot)),
        }
    }

    /// Go on with a reshape that was stopped (`raidfs grow --stop`) or
    /// could not run (a degraded array, since rebuilt).
    pub fn resume_reshape(&self) -> ArrayResult<()> {
        if self.reshape_counts().is_none() {
            return Err(ArrayError::Refused("no reshape is under way".into()));
        }
        if self.is_degraded() {
            return Err(ArrayError::Refused(
                "the array is degraded: the reshape goes on once it is rebuilt".into(),
            ));
        }
        if let Some(p) = self.sync_progress() {
            return Err(ArrayError::Refused(format!(
                "{} is running ({:.1}%); the reshape goes on once it ends",
                p.action,
                percent(p.done, p.total)
            )));
        }
        self.spawn(SyncAction::Reshape, None)
    }

    /// Stop everything started by [`Array::start_background`] except the
    /// write-back reaper (a final flush still needs it): the bitmap thread,
    /// the host watcher, the running work (it checkpoints first) and the
    /// sync worker.
    pub fn stop_background(&self) {
        // From here whatever waits for the host (under on_host_error=wait)
        // gives up, and queued work ends at once.
        self.sync.stop.store(true, Ordering::Release);
        self.stop_rejoin();
        self.stop_cleaner();
        self.stop_host_watcher();
        self.wait_background();
        let worker = self.sync.worker.lock().take();
        if let Some(w) = worker {
            drop(w.jobs);
            // The worker may be the caller (a job that shuts the array
            // down); it then ends by itself after this job.
            if w.handle.thread().id() != std::thread::current().id() {
                let _ = w.handle.join();
            }
        }
        self.sync.stop.store(false, Ordering::Release);
    }

    /// Stop the running background work (it checkpoints first) and wait
    /// for it; the worker stays, ready for the next job.
    pub fn stop_sync(&self) {
        self.sync.stop.store(true, Ordering::Release);
        self.wait_background();
        self.sync.stop.store(false, Ordering::Release);
    }

    /// Wait until the running background work (if any) has ended: its
    /// result is recorded and the work due after it, if any, has started.
    pub fn wait_background(&self) {
        let Some(id) = self.sync.running.lock().as_ref().map(|r| r.id) else {
            return;
        };
        let mut ended = self.sync.ended_runs.lock();
        while *ended < id {
            self.sync.ended.wait(&mut ended);
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
            run: r.id,
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

    /// Member bytes of allocated groups (what background work walks).
    pub(super) fn allocated_member_bytes(&self) -> u64 {
        let group_size = self.sb.lock().group_size;
        self.groups().len() as u64 * group_size
    }

    /// The member span `[start, end)` of every allocated group.
    fn allocated_member_spans(&self) -> Vec<(u64, u64)> {
        let (group_size, data_offset) = {
            let sb = self.sb.lock();
            (sb.group_size, sb.data_offset)
        };
        self.groups()
            .iter()
            .map(|(g, _)| {
                let start = data_offset + *g as u64 * group_size;
                (start, start + group_size)
            })
            .collect()
    }

    /// Member bytes of allocated groups that dirty regions cover: what a
    /// resync visits (a region may reach past its group, or lie in a group
    /// freed since it was marked).
    pub(super) fn dirty_allocated_bytes(&self) -> u64 {
        self.allocated_member_spans()
            .into_iter()
            .map(|(start, end)| self.bitmap.dirty_bytes_within(start, end))
            .sum()
    }

    /// Member bytes of allocated groups below member offset `at` (what a
    /// run resumed from `at` has already covered).
    pub(super) fn member_bytes_below(&self, at: u64) -> u64 {
        self.allocated_member_spans()
            .into_iter()
            .map(|(start, end)| at.clamp(start, end) - start)
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

    /// Start `action` (on `slot`) on the sync worker; a recovery resumes
    /// from its slot's checkpoint.
    pub(super) fn spawn(&self, action: SyncAction, slot: Option<usize>) -> ArrayResult<()> {
        let from = match (action, slot) {
            (SyncAction::Recovery, Some(s)) => self.slots[s].valid_below(),
            _ => 0,
        };
        self.spawn_from(action, slot, from)
    }

    /// Start `action` with everything below member offset `from` done.
    pub(super) fn spawn_from(
        &self,
        action: SyncAction,
        slot: Option<usize>,
        from: u64,
    ) -> ArrayResult<()> {
        let worker = self.sync.worker.lock();
        let Some(worker) = worker.as_ref() else {
            return Err(ArrayError::Refused(
                "background work needs a running array (start_background was not called)".into(),
            ));
        };
        let mut running = self.sync.running.lock();
        if let Some(r) = running.as_ref().filter(|r| r.active) {
            return Err(ArrayError::Refused(format!(
                "{} is already running ({:.1}%)",
                r.action,
                percent(r.done.load(Ordering::Relaxed).min(r.total), r.total)
            )));
        }
        let resumed_at = match action {
            // Groups already moved count as done.
            SyncAction::Reshape => self.reshape_done_bytes(),
            _ => self.member_bytes_below(from),
        };
        // A resync or a re-add only visits dirty regions: that is its size.
        let (dirty_regions, total) = if self.bitmap_only(action) {
            let (regions, _) = self.bitmap.dirty();
            (Some(regions), self.dirty_allocated_bytes())
        } else {
            (None, self.allocated_member_bytes())
        };
        let done = Arc::new(AtomicU64::new(resumed_at));
        let mismatches = Arc::new(AtomicU64::new(0));
        let job = Job {
            action,
            slot,
            from,
            done: Arc::clone(&done),
            mismatches: Arc::clone(&mismatches),
        };
        worker
            .jobs
            .send(job)
            .map_err(|_| ArrayError::Refused(format!("cannot start {action}: no sync worker")))?;
        let id = self.sync.started_runs.fetch_add(1, Ordering::AcqRel) + 1;
        *running = Some(Running {
            id,
            action,
            slot,
            started: Instant::now(),
            done,
            resumed_at,
            total,
            dirty_regions,
            mismatches,
            active: true,
        });
        Ok(())
    }

    /// Body of a background run. Ok(true): finished; Ok(false): stopped.
    fn run_sync(&self, job: &Job) -> ArrayResult<bool> {
        let mut pacer = Pacer::new(self.sync.foreground.load(Ordering::Relaxed));
        match job.action {
            SyncAction::Recovery | SyncAction::Replace => {
                let slot = job
                    .slot
                    .ok_or_else(|| ArrayError::Refused("no slot to rebuild".into()))?;
                self.run_rebuild(job.action, slot, &job.done, &mut pacer)
            }
            SyncAction::Resync | SyncAction::Check | SyncAction::Repair => {
                self.run_scrub(job.action, job.from, &job.done, &job.mismatches, &mut pacer)
            }
            SyncAction::Reshape => self.run_reshape(&job.done, &mut pacer),
        }
    }

    fn finish_sync(
        &self,
        action: SyncAction,
        slot: Option<usize>,
        outcome: ArrayResult<bool>,
        mismatches: u64,
    ) {
        let (id, done, total, dirty_regions) = self
            .sync
            .running
            .lock()
            .as_ref()
            .map(|r| {
                let total = r.total;
                (
                    r.id,
                    r.done.load(Ordering::Relaxed).min(total),
                    total,
                    r.dirty_regions,
                )
            })
            .unwrap_or_default();
        let (completed, mut message) = match outcome {
            Ok(true) => (true, format!("{action} finished")),
            Ok(false) if action.is_scrub() => (
                false,
                format!(
                    "{action} paused at {:.1}%; `raidfs {action}` resumes it from there",
                    percent(done, total)
                ),
            ),
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
            // Stopped or failed: still due, and the array stays dirty until it ran.
            self.needs_resync.store(true, Ordering::Release);
        }
        if completed {
            match (action, slot) {
                (SyncAction::Resync, _) => self
                    .bitmap
                    .resynced(self.sync.resync_suspect_gen.load(Ordering::Acquire)),
                (SyncAction::Recovery, Some(s)) => self.recovery_done(s),
                (SyncAction::Replace, Some(s)) => self.replacement_done(s),
                (SyncAction::Check | SyncAction::Repair, _) => self.scrub_done(),
                _ => {}
            }
        } else if action == SyncAction::Replace {
            if let Some(s) = slot {
                let _ = self.pool.set_replacement(s, None);
            }
            *self.sync.pending_replacement.lock() = None;
        }
        if action.is_scrub() {
            log::info!("{message}: {mismatches} bytes mismatched");
        } else {
            log::info!("{message}");
        }
        // The result first, then the running entry goes: whoever sees no
        // running work (`raidfs check --wait`) then reads this run's result.
        *self.sync.last.lock() = Some(SyncResult {
            run: id,
            action,
            completed,
            mismatches,
            message,
            done,
            total,
        });
        if let Some(r) = self.sync.running.lock().as_mut() {
            r.active = false;
        }
        // The next work starts before this entry goes, so nobody watching
        // sees the array idle between a recovery and the resync after it.
        if completed && !self.sync.stop.load(Ordering::Acquire) {
            self.start_next_work();
        }
        {
            let mut running = self.sync.running.lock();
            if running.as_ref().is_some_and(|r| !r.active) {
                *running = None;
            }
        }
        let mut ended = self.sync.ended_runs.lock();
        *ended = (*ended).max(id);
        self.sync.ended.notify_all();
    }

    /// Whether background work is queued or running (not yet finishing).
    pub(super) fn busy(&self) -> bool {
        self.sync.running.lock().as_ref().is_some_and(|r| r.active)
    }
}
