//! Whether a stream of quick requests is read by a polling thread or by
//! threads asleep in `read(2)`, chosen by measuring both (`-o busy_poll`).
//!
//! Neither wins everywhere. Polling saves the wake-up of a thread for each
//! request, but the answer then wakes the caller wherever the kernel put
//! it: on the poller's CPU that costs nothing, on another idle CPU it is an
//! interrupt, which a virtual machine pays with exits on both sides. The
//! kernel puts the caller on the poller's CPU only when the other CPUs are
//! busy (RAID5's member threads keep them so; a RAID1 write, done inline,
//! does not). On a two-CPU virtual machine, 4 KiB random writes gained a
//! sixth from polling on RAID5 and lost 7 % on RAID1; after the machine
//! was restarted, they lost a fifth on RAID5 too (docs/performance.md,
//! "Busy polling"). So, as the parity kernels are chosen by benchmark,
//! the reading is chosen by the pace it gives: the mean interval between
//! the stream's requests, over epochs of [`EPOCH`] requests, read the
//! chosen way and, in short trials, the other way.
//!
//! The pace also follows the workload: a loop of creates, then stats,
//! then unlinks reads at three different paces within a second. So a
//! trial is judged against the chosen way's epochs just before it, not
//! against what either way gave earlier: each trial gives a ratio, the
//! median of its epochs polled over the median of those asleep (a median
//! of [`TRIAL`], so that one slow epoch, a burst of the host's write-back,
//! does not decide). A trial that straddles a change of pace still gives
//! a wrong ratio, so each is clamped to [`CLAMP`] and the choice follows
//! a running ratio ([`WEIGHT`] for the newest trial); it changes when
//! that ratio, and the trial's own, favour the other way by [`MARGIN`].
//! Each trial costs epochs in the slower way, so while the running ratio
//! confirms the choice trials come twice as rarely each time (up to every
//! [`MAX_SETTLED`] epochs); a trial that favours the other way, or a
//! change, brings the next one soon. The first epoch of every stretch is not counted: a switch moves
//! threads, and the kernel's placement of the caller follows only over
//! some milliseconds (just after a stretch asleep the caller still shares
//! the poller's CPU, and polling looks better than it stays).

use std::fmt;
use std::time::Duration;

use log::{debug, info};
use parking_lot::Mutex;

/// Intervals an epoch averages.
const EPOCH: u32 = 256;
/// Epochs counted in a trial (after the one that is not), and the chosen
/// way's epochs it is compared with.
const TRIAL: u32 = 3;
/// The newest trial's weight in the running ratio.
const WEIGHT: f64 = 0.5;
/// The range a trial's ratio is clamped to: a larger one is more likely a
/// change of pace than of the way's cost.
const CLAMP: (f64, f64) = (0.8, 1.25);
/// How much faster the other way must be to replace the choice, and
/// beyond which a trial confirms it.
const MARGIN: f64 = 0.05;
/// Most epochs counted between two trials.
const MAX_SETTLED: u32 = 64;

/// The measuring and the choosing, free of clocks and locks.
#[derive(Debug)]
pub struct Tuner {
    /// The chosen way: polling.
    chosen_poll: bool,
    /// In a trial of the other way.
    trial: bool,
    /// Counted epochs the current stretch lasts.
    length: u32,
    /// Epochs of the current stretch so far, the uncounted first included.
    epochs: u32,
    /// Counted epochs between trials now.
    settled: u32,
    /// Intervals in this epoch so far, and their sum.
    seen: u32,
    sum: Duration,
    /// The chosen way's last [`TRIAL`] counted epochs (mean interval in
    /// seconds), newest last: what the next trial is judged against.
    chosen: Vec<f64>,
    /// The current trial's counted epochs.
    tried: Vec<f64>,
    /// Running ratio of the interval polled to the interval asleep, once
    /// a trial has been judged.
    ratio: Option<f64>,
}

/// A trial's outcome, for the log.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Verdict {
    /// Median interval between requests polled and asleep, in this trial
    /// and the stretch before it.
    pub polling: Duration,
    pub asleep: Duration,
    /// The running ratio polled / asleep.
    pub ratio: f64,
    /// The choice from now on, and whether it changed.
    pub poll: bool,
    pub changed: bool,
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        write!(
            f,
            "quick requests {:.1} µs apart polled, {:.1} µs asleep (running ratio {:.2}): {}",
            us(self.polling),
            us(self.asleep),
            self.ratio,
            if self.poll { "polling" } else { "sleeping" }
        )
    }
}

impl Default for Tuner {
    fn default() -> Self {
        Tuner::new()
    }
}

/// The median of a trial's epochs (there are [`TRIAL`], an odd number).
fn median(epochs: &[f64]) -> f64 {
    let mut sorted = epochs.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted.get(sorted.len() / 2).copied().unwrap_or(0.0)
}

impl Tuner {
    /// Polling first (it is what `busy_poll` asks for), tried against
    /// sleeping after [`TRIAL`] counted epochs.
    pub fn new() -> Tuner {
        Tuner {
            chosen_poll: true,
            trial: false,
            length: TRIAL,
            epochs: 0,
            settled: TRIAL,
            seen: 0,
            sum: Duration::ZERO,
            chosen: Vec::with_capacity(TRIAL as usize),
            tried: Vec::with_capacity(TRIAL as usize),
            ratio: None,
        }
    }

    /// Whether to poll now.
    pub fn polls(&self) -> bool {
        self.chosen_poll != self.trial
    }

    /// Count one interval between a stream's requests, read as `polled`
    /// says. Returns a verdict when a trial has just been judged.
    pub fn observe(&mut self, interval: Duration, polled: bool) -> Option<Verdict> {
        // An interval read the other way belongs to the stretch before.
        if polled != self.polls() {
            return None;
        }
        self.seen += 1;
        self.sum += interval;
        if self.seen < EPOCH {
            return None;
        }
        let epoch = self.sum.as_secs_f64() / f64::from(self.seen);
        self.seen = 0;
        self.sum = Duration::ZERO;
        self.epochs += 1;
        if self.epochs == 1 {
            return None;
        }
        if self.trial {
            self.tried.push(epoch);
        } else {
            if self.chosen.len() == TRIAL as usize {
                self.chosen.remove(0);
            }
            self.chosen.push(epoch);
        }
        if self.epochs <= self.length {
            return None;
        }
        self.epochs = 0;
        if self.trial {
            Some(self.judge())
        } else {
            self.trial = true;
            self.length = TRIAL;
            self.tried.clear();
            None
        }
    }

    /// After a trial: its epochs against the chosen way's before it.
    fn judge(&mut self) -> Verdict {
        let (chosen, tried) = (median(&self.chosen), median(&self.tried));
        let (polling, asleep) = if self.chosen_poll {
            (chosen, tried)
        } else {
            (tried, chosen)
        };
        let trial = if asleep > 0.0 { polling / asleep } else { 1.0 }.clamp(CLAMP.0, CLAMP.1);
        let ratio = match self.ratio {
            None => trial,
            Some(ratio) => ratio + WEIGHT * (trial - ratio),
        };
        self.ratio = Some(ratio);
        // How much faster the other way reads than the chosen one, by a
        // polled / asleep ratio; past the margin either way it favours one.
        let other_gain = |r: f64| if self.chosen_poll { r } else { 1.0 / r };
        let favours_other = |r: f64| other_gain(r) > 1.0 + MARGIN;
        let favours_chosen = |r: f64| other_gain(r) < 1.0 / (1.0 + MARGIN);
        let against = favours_other(ratio) && favours_other(trial);
        // A trial against the choice brings the next one soon; one over
        // a change of pace may fall either way, so a close or contrary
        // trial does not undo a running ratio that confirms the choice.
        self.settled = if favours_other(trial) {
            TRIAL
        } else if favours_chosen(ratio) {
            (self.settled * 2).min(MAX_SETTLED)
        } else {
            self.settled
        };
        if against {
            self.chosen_poll = !self.chosen_poll;
        }
        self.trial = false;
        self.length = self.settled;
        self.chosen.clear();
        Verdict {
            polling: Duration::from_secs_f64(polling),
            asleep: Duration::from_secs_f64(asleep),
            ratio,
            poll: self.chosen_poll,
            changed: against,
        }
    }
}

/// The [`Tuner`] behind fuser's [`fuser::PollChoice`], shared by the
/// session's threads (fuser calls it under its own lock; this one is
/// never contended).
#[derive(Debug, Default)]
pub struct MeasuredPolling {
    tuner: Mutex<Tuner>,
}

impl fuser::PollChoice for MeasuredPolling {
    fn quick_interval(&self, interval: Duration, polled: bool) -> bool {
        let mut tuner = self.tuner.lock();
        if let Some(verdict) = tuner.observe(interval, polled) {
            if verdict.changed {
                info!("busy polling: {verdict}");
            } else {
                debug!("busy polling: {verdict}");
            }
        }
        tuner.polls()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feed `tuner` intervals of `polled` or `asleep` µs, whichever way
    /// it reads, until it has judged `trials` trials; the verdicts.
    fn run(tuner: &mut Tuner, polled: u64, asleep: u64, trials: usize) -> Vec<Verdict> {
        let mut verdicts = Vec::new();
        for _ in 0..10_000_000 {
            let poll = tuner.polls();
            let us = if poll { polled } else { asleep };
            if let Some(v) = tuner.observe(Duration::from_micros(us), poll) {
                verdicts.push(v);
                if verdicts.len() == trials {
                    return verdicts;
                }
            }
        }
        panic!("only {} of {trials} trials judged", verdicts.len());
    }

    /// Every verdict kept polling without a change.
    fn kept_polling(verdicts: &[Verdict]) {
        assert!(
            verdicts.iter().all(|v| v.poll && !v.changed),
            "{verdicts:?}"
        );
    }

    #[test]
    fn sleeping_replaces_polling_when_it_is_faster_and_stays() {
        let mut tuner = Tuner::new();
        let verdicts = run(&mut tuner, 70, 63, 4);
        assert!(verdicts[0].changed && !verdicts[0].poll, "{verdicts:?}");
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        assert!(
            (us(verdicts[0].polling) - 70.0).abs() < 0.01,
            "{verdicts:?}"
        );
        assert!((us(verdicts[0].asleep) - 63.0).abs() < 0.01, "{verdicts:?}");
        assert!(
            verdicts[1..].iter().all(|v| !v.changed && !v.poll),
            "{verdicts:?}"
        );
        assert!(!tuner.polls());
    }

    #[test]
    fn polling_stays_when_it_is_faster_and_trials_grow_rare() {
        let mut tuner = Tuner::new();
        let verdicts = run(&mut tuner, 33, 45, 10);
        kept_polling(&verdicts);
        assert_eq!(tuner.settled, MAX_SETTLED);
        // Two whole cycles: each a trial of 1 + TRIAL epochs asleep
        // against 1 + MAX_SETTLED polled.
        let mut asleep = 0;
        for _ in 0..2 * (MAX_SETTLED + TRIAL + 2) * EPOCH {
            let poll = tuner.polls();
            asleep += u32::from(!poll);
            tuner.observe(Duration::from_micros(if poll { 33 } else { 45 }), poll);
        }
        assert!(
            asleep <= 2 * (TRIAL + 1) * EPOCH,
            "{asleep} intervals asleep"
        );
    }

    #[test]
    fn a_close_call_keeps_the_choice_and_the_pace_of_trials() {
        let mut tuner = Tuner::new();
        let verdicts = run(&mut tuner, 50, 51, 3);
        kept_polling(&verdicts);
        assert_eq!(tuner.settled, TRIAL);
    }

    #[test]
    fn the_choice_follows_the_workload_when_it_changes() {
        let mut tuner = Tuner::new();
        run(&mut tuner, 40, 60, 3);
        assert!(tuner.polls());
        // The running ratio needs a few trials to cross over, which come
        // soon once one disagrees.
        let verdicts = run(&mut tuner, 70, 60, 3);
        assert!(verdicts.iter().any(|v| v.changed), "{verdicts:?}");
        assert!(!tuner.polls());
        let verdicts = run(&mut tuner, 40, 60, 3);
        assert!(verdicts.iter().any(|v| v.changed), "{verdicts:?}");
        assert!(tuner.polls());
    }

    #[test]
    fn a_change_of_pace_is_not_taken_for_the_other_way() {
        // Creates, stats, unlinks: the pace changes every twenty epochs or
        // so, while polling stays a sixth faster in each. A trial judged
        // against a stretch at another pace must not turn polling off.
        let mut tuner = Tuner::new();
        let (mut count, mut asleep) = (0u64, 0u64);
        // And the machine's noise: every 251 intervals the pace moves by
        // up to a fifth either way (a fixed pseudo-random sequence).
        let mut noise = 12345u64;
        let mut verdicts = Vec::new();
        while verdicts.len() < 60 {
            let poll = tuner.polls();
            asleep += u64::from(!poll);
            if count % 251 == 0 {
                noise = noise
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
            }
            let jitter = 80 + (noise >> 33) % 41;
            let pace =
                [10_000u64, 25_000, 6_000][(count / (20 * 256 + 37)) as usize % 3] * jitter / 100;
            let ns = if poll { pace } else { pace * 7 / 6 };
            count += 1;
            if let Some(v) = tuner.observe(Duration::from_nanos(ns), poll) {
                verdicts.push(v);
            }
        }
        assert!(verdicts.iter().all(|v| v.poll), "{verdicts:?}");
        // Nor keep the trials, each in the slower way, coming often.
        assert!(asleep * 10 < count, "{asleep} of {count} intervals asleep");
    }

    #[test]
    fn the_first_epoch_after_a_switch_does_not_decide() {
        // Just after a stretch asleep the caller still shares the poller's
        // CPU (26 µs); once the kernel has moved it to the idle one,
        // polling is slower (46 µs) than sleeping (41 µs).
        let mut tuner = Tuner::new();
        let mut since_switch = 0u32;
        let mut last = tuner.polls();
        let mut verdicts = Vec::new();
        while verdicts.len() < 6 {
            let poll = tuner.polls();
            if poll != last {
                since_switch = 0;
                last = poll;
            }
            since_switch += 1;
            let us = match (poll, since_switch <= EPOCH) {
                (true, true) => 26,
                (true, false) => 46,
                (false, _) => 41,
            };
            if let Some(v) = tuner.observe(Duration::from_micros(us), poll) {
                verdicts.push(v);
            }
        }
        assert!(verdicts[0].changed && !verdicts[0].poll, "{verdicts:?}");
        assert!(
            verdicts[1..].iter().all(|v| !v.changed && !v.poll),
            "{verdicts:?}"
        );
    }

    #[test]
    fn one_slow_epoch_does_not_reverse_the_choice() {
        let mut tuner = Tuner::new();
        run(&mut tuner, 30, 40, 3);
        assert!(tuner.polls());
        // A burst of the host's write-back: the last polled epoch before
        // the next trial is ten times as slow.
        let last = tuner.settled * EPOCH;
        let mut polled = 0;
        let mut verdicts = Vec::new();
        while verdicts.len() < 2 {
            let poll = tuner.polls();
            let us = match poll {
                true if (last..last + EPOCH).contains(&polled) => 300,
                true => 30,
                false => 40,
            };
            polled += u32::from(poll);
            if let Some(v) = tuner.observe(Duration::from_micros(us), poll) {
                verdicts.push(v);
            }
        }
        kept_polling(&verdicts);
    }

    #[test]
    fn intervals_read_the_other_way_are_not_counted() {
        let mut tuner = Tuner::new();
        // Polled intervals arriving during the trial (threads still in
        // the old way) must not count as the trial's.
        for _ in 0..(TRIAL + 1) * EPOCH {
            tuner.observe(Duration::from_micros(50), true);
        }
        assert!(!tuner.polls(), "the trial has begun");
        for _ in 0..10 * EPOCH {
            assert_eq!(tuner.observe(Duration::from_micros(1), true), None);
        }
        assert!(!tuner.polls(), "the trial has counted nothing");
    }
}
