//! Pacing of background work between md's speed limits (the minimum while
//! files are being read and written, the maximum otherwise) and its
//! periodic checkpoints into the superblocks.

use super::Array;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// How often progress is checkpointed into the superblocks.
pub(super) const CHECKPOINT_EVERY: Duration = Duration::from_secs(2);

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
    pub(super) fn new(foreground: u64) -> Pacer {
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

    /// Record progress (a rebuild's `valid_below`, a scrub's position) in
    /// the superblocks.
    pub(super) fn checkpoint(&self, p: &mut Pacer) {
        p.last_checkpoint = Instant::now();
        let _ = self.write_superblocks();
    }
}
