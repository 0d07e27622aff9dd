//! The seeded simulator: the filesystem over the array engine over
//! fault-injecting in-memory members, driven by a schedule that one seed
//! decides (filesystem operations interleaved with member failures, pulls
//! and returns, replaces, spares, grows and level changes, bit rot, host
//! ENOSPC and EIO, power cuts with torn writes, scrubs and remounts), and
//! checked against a reference model after every power cut, remount and
//! repair (`sim/world.rs` says what is checked).
//!
//! The seed decides every operation and fault and its order; the engine's
//! own threads (member workers, write-back, background work) still run as
//! they would, so the interleaving of their work is the machine's. A seed
//! that failed once replays its schedule exactly and, if the bug does not
//! need a rare interleaving, fails again.
//!
//! Every action must end within a bound (`RAIDFS_SIM_BOUND` seconds, 120
//! by default): a watchdog prints the seed, the run's last actions and
//! every thread's stack (gdb, when there is one) and fails the run.
//! A failing run is shrunk by dropping actions while it still fails, and
//! printed with the command that replays the short form.
//!
//! Environment:
//! * `RAIDFS_SIM_SEED=S` runs seed S alone (and `RAIDFS_SIM_KEEP=3,9,12-20`
//!   only those of its actions);
//! * `RAIDFS_SIM_SEEDS=N` runs seeds `RAIDFS_SIM_FIRST` (0) … +N; the
//!   everyday run's number is [`EVERYDAY_SEEDS`];
//! * `RAIDFS_SIM_STEPS=K` actions per seed (default [`STEPS`]).

#[path = "sim/model.rs"]
mod model;
#[path = "sim/schedule.rs"]
mod schedule;
#[path = "sim/world.rs"]
mod world;

use schedule::{schedule, Action};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};
use world::{Failure, Tally, World};

/// Seeds of the everyday run (`cargo test`), about three minutes here.
const EVERYDAY_SEEDS: u64 = 48;
/// Actions per seed.
const STEPS: usize = 150;

/// Runs that found bugs, shrunk (seed, the `RAIDFS_SIM_KEEP` list of its
/// actions, what the bug was); `regressions_stay_fixed` runs them all.
const REGRESSIONS: &[(u64, &str, &str)] = &[
    (
        6,
        "84-85,90-91",
        "RAID5 with a partial parity log: a create, a write and a burst of small \
         writes hung for ever: a stripe-cache write-out whose log entry could not \
         be reserved called a full flush, which waited for every write-out to \
         settle, its own included (the fio randrw --fsync deadlock)",
    ),
    (
        13,
        "47-48,54-55",
        "RAID10: a member failed, a write, a power cut, the member re-added: the \
         crash's dirty regions were never resynced (a dirty degraded assembly did \
         not ask for the resync after the rebuild), so the surviving pair kept the \
         torn write's disagreement and a check found 44,448 mismatched bytes",
    ),
    (
        18,
        "85,92-93,101",
        "RAID6: a member pulled, a write that fails on it, a clean remount: the \
         failed write's stripes were marked suspect although the member left the \
         array and the survivors held the whole write, so the array stayed dirty \
         at unmount and the next assembly refused it as dirty and degraded",
    ),
];

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

fn bound() -> Duration {
    Duration::from_secs(env_u64("RAIDFS_SIM_BOUND").unwrap_or(120))
}

/// How a run ended.
enum Outcome {
    Passed(Tally),
    Failed { why: String, trace: Vec<String> },
}

/// Run `actions` of `seed` on a thread of their own, watched: an action
/// that does not end within `limit` fails the run (its thread is left
/// behind, stuck).
fn run(seed: u64, actions: Vec<(usize, Action)>, limit: Duration, stacks: bool) -> Outcome {
    let trace = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let heartbeat = Arc::new(AtomicUsize::new(0));
    let (tx, rx) = mpsc::channel();
    {
        let (trace, heartbeat) = (Arc::clone(&trace), Arc::clone(&heartbeat));
        std::thread::Builder::new()
            .name(format!("sim-{seed}"))
            .spawn(move || {
                let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    let mut w = World::new(seed, trace, heartbeat)?;
                    match w.run(&actions) {
                        Ok(()) => Ok(w.tally.clone()),
                        Err(e) => {
                            w.abandon();
                            Err(e)
                        }
                    }
                }));
                let _ = tx.send(match result {
                    Ok(r) => r,
                    Err(panic) => Err(Failure(format!(
                        "panicked: {}",
                        panic
                            .downcast_ref::<String>()
                            .cloned()
                            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                            .unwrap_or_default()
                    ))),
                });
            })
            .expect("spawn the run's thread");
    }
    let mut last = (0, Instant::now());
    loop {
        match rx.recv_timeout(Duration::from_millis(200)) {
            Ok(Ok(tally)) => return Outcome::Passed(tally),
            Ok(Err(Failure(why))) => {
                return Outcome::Failed {
                    why,
                    trace: trace.lock().clone(),
                }
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                return Outcome::Failed {
                    why: "the run's thread vanished".into(),
                    trace: trace.lock().clone(),
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                let beat = heartbeat.load(Ordering::Acquire);
                if beat != last.0 {
                    last = (beat, Instant::now());
                } else if last.1.elapsed() > limit {
                    if stacks {
                        print_stacks();
                    }
                    return Outcome::Failed {
                        why: format!("an action did not end within {limit:?} (hang)"),
                        trace: trace.lock().clone(),
                    };
                }
            }
        }
    }
}

/// Every thread's stack, through gdb (the frames of raidfs and the
/// threads' names), or the threads' names and kernel wait channels.
fn print_stacks() {
    let pid = std::process::id().to_string();
    // Into a file, not a pipe: gdb stops every thread of this process, the
    // one that would read the pipe too, and a full pipe would then hold gdb
    // (and the whole run) for ever. Bounded in time for the same reason.
    static CALLS: AtomicUsize = AtomicUsize::new(0);
    let path = std::env::temp_dir().join(format!(
        "raidfs-sim-stacks-{pid}-{}.txt",
        CALLS.fetch_add(1, Ordering::Relaxed)
    ));
    let gdb = std::fs::File::create(&path).and_then(|file| {
        std::process::Command::new("timeout")
            .args(["-k", "10", "120", "gdb", "-p", &pid, "-batch"])
            .args(["-ex", "thread apply all bt 40"])
            .stdout(file)
            .stderr(std::process::Stdio::null())
            .status()
    });
    let text = std::fs::read(&path).unwrap_or_default();
    let _ = std::fs::remove_file(&path);
    match gdb {
        Ok(status) if status.success() => {
            let text = String::from_utf8_lossy(&text);
            let mut shown = String::new();
            for line in text.lines() {
                if line.starts_with("Thread ") || line.contains("raidfs::") {
                    shown.push_str(line);
                    shown.push('\n');
                }
            }
            eprintln!("sim: every thread's stack (raidfs frames):\n{shown}");
        }
        _ => {
            if let Ok(tasks) = std::fs::read_dir("/proc/self/task") {
                for t in tasks.flatten() {
                    let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
                    let wchan = std::fs::read_to_string(t.path().join("wchan")).unwrap_or_default();
                    eprintln!("  {} {}", comm.trim(), wchan.trim());
                }
            }
        }
    }
}

/// Drop actions while the run still fails (any failure of the same kind:
/// a hang stays a hang), up to `budget` tries.
fn shrink(
    seed: u64,
    mut actions: Vec<(usize, Action)>,
    hang: bool,
    budget: usize,
) -> Vec<(usize, Action)> {
    let limit = if hang {
        Duration::from_secs(20)
    } else {
        bound()
    };
    let mut tries = 0;
    let mut chunk = actions.len() / 2;
    while chunk >= 1 && tries < budget {
        let mut start = 0;
        while start < actions.len() && tries < budget {
            let mut fewer = actions.clone();
            let end = (start + chunk).min(fewer.len());
            fewer.drain(start..end);
            tries += 1;
            match run(seed, fewer.clone(), limit, false) {
                Outcome::Failed { why, .. } if why.contains("(hang)") == hang => actions = fewer,
                _ => start += chunk,
            }
        }
        chunk /= 2;
    }
    actions
}

fn keep_list(actions: &[(usize, Action)]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < actions.len() {
        let a = actions[i].0;
        let mut j = i;
        while j + 1 < actions.len() && actions[j + 1].0 == actions[j].0 + 1 {
            j += 1;
        }
        let b = actions[j].0;
        out.push(if a == b {
            a.to_string()
        } else {
            format!("{a}-{b}")
        });
        i = j + 1;
    }
    out.join(",")
}

fn parse_keep(list: &str) -> Vec<usize> {
    let mut keep = Vec::new();
    for part in list.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                if let (Ok(a), Ok(b)) = (a.parse::<usize>(), b.parse::<usize>()) {
                    keep.extend(a..=b);
                }
            }
            None => keep.extend(part.parse::<usize>().ok()),
        }
    }
    keep
}

/// The actions of `seed` (only those of `RAIDFS_SIM_KEEP` when set).
fn actions_of(seed: u64) -> Vec<(usize, Action)> {
    let steps = env_u64("RAIDFS_SIM_STEPS").map_or(STEPS, |s| s as usize);
    let mut actions = schedule(seed, steps);
    if let Ok(list) = std::env::var("RAIDFS_SIM_KEEP") {
        let keep = parse_keep(&list);
        actions.retain(|(i, _)| keep.contains(i));
    }
    actions
}

#[test]
fn regressions_stay_fixed() {
    for (seed, keep, what) in REGRESSIONS {
        let keep = parse_keep(keep);
        let mut actions = schedule(*seed, STEPS);
        actions.retain(|(i, _)| keep.contains(i));
        if let Outcome::Failed { why, trace } = run(*seed, actions, bound(), true) {
            panic!(
                "regression seed {seed} ({what}) fails again: {why}\n{}",
                trace.join("\n")
            );
        }
    }
}

/// Run one seed; on failure shrink it and return the report.
fn check_seed(seed: u64, shrink_budget: usize) -> Result<Tally, String> {
    let actions = actions_of(seed);
    let failed = match run(seed, actions.clone(), bound(), true) {
        Outcome::Passed(t) => return Ok(t),
        Outcome::Failed { why, trace } => (why, trace),
    };
    let (why, trace) = failed;
    let hang = why.contains("(hang)");
    let mut report = format!(
        "sim: seed {seed} FAILED: {why}\n  config: {:?}\n  replay: RAIDFS_SIM_SEED={seed} cargo test --test sim -- --nocapture one_seed\n  its last actions:\n",
        world::Config::for_seed(seed)
    );
    for line in trace.iter().rev().take(30).rev() {
        report.push_str(&format!("    {line}\n"));
    }
    if shrink_budget > 0 {
        let short = shrink(seed, actions.clone(), hang, shrink_budget);
        if short.len() < actions.len() {
            let keep = keep_list(&short);
            report.push_str(&format!(
                "  shrunk to {} of {} actions: RAIDFS_SIM_SEED={seed} RAIDFS_SIM_KEEP={keep} cargo test --test sim -- --nocapture one_seed\n",
                short.len(),
                actions.len()
            ));
            for (i, a) in &short {
                report.push_str(&format!("    #{i} {a:?}\n"));
            }
        }
    }
    Err(report)
}

/// Totals of the runs, printed as one line.
#[derive(Default)]
struct Totals {
    seeds: u64,
    ops: u64,
    checks: u64,
    faults: BTreeMap<&'static str, u64>,
}

impl Totals {
    fn add(&mut self, t: &Tally) {
        self.seeds += 1;
        self.ops += t.ops;
        self.checks += t.checks;
        for (k, v) in &t.faults {
            *self.faults.entry(k).or_default() += v;
        }
    }

    fn line(&self, elapsed: Duration) -> String {
        let faults: u64 = self.faults.values().sum();
        let secs = elapsed.as_secs_f64().max(1e-9);
        let kinds: Vec<String> = self
            .faults
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        format!(
            "sim: {} seeds, {} operations ({:.0}/s), {} faults ({:.1}/s; {}), {} model checks, {:.0} s",
            self.seeds,
            self.ops,
            self.ops as f64 / secs,
            faults,
            faults as f64 / secs,
            kinds.join(" "),
            self.checks,
            secs
        )
    }
}

/// Seeds `seeds` on two threads (this machine's cores); every failure's report.
fn run_seeds(seeds: Vec<u64>, shrink_budget: usize) -> (Totals, Vec<String>) {
    let queue = Arc::new(parking_lot::Mutex::new(seeds));
    let totals = Arc::new(parking_lot::Mutex::new(Totals::default()));
    let failures = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let done = Arc::new(AtomicU64::new(0));
    let workers: Vec<_> = (0..2)
        .map(|_| {
            let (queue, totals, failures, done) = (
                Arc::clone(&queue),
                Arc::clone(&totals),
                Arc::clone(&failures),
                Arc::clone(&done),
            );
            std::thread::spawn(move || loop {
                let Some(seed) = queue.lock().pop() else {
                    break;
                };
                match check_seed(seed, shrink_budget) {
                    Ok(t) => totals.lock().add(&t),
                    Err(report) => {
                        eprintln!("{report}");
                        failures.lock().push(report);
                    }
                }
                done.fetch_add(1, Ordering::Relaxed);
            })
        })
        .collect();
    for w in workers {
        let _ = w.join();
    }
    let totals = std::mem::take(&mut *totals.lock());
    let failures = std::mem::take(&mut *failures.lock());
    (totals, failures)
}

#[test]
fn seeded_runs_keep_every_answered_byte() {
    if std::env::var("RAIDFS_SIM_SEED").is_ok() {
        return; // `one_seed` runs it.
    }
    let first = env_u64("RAIDFS_SIM_FIRST").unwrap_or(0);
    let count = env_u64("RAIDFS_SIM_SEEDS").unwrap_or(EVERYDAY_SEEDS);
    let seeds: Vec<u64> = (first..first + count).rev().collect();
    let started = Instant::now();
    let (totals, failures) = run_seeds(seeds, 40);
    println!("{}", totals.line(started.elapsed()));
    eprintln!("{}", totals.line(started.elapsed()));
    assert!(
        failures.is_empty(),
        "{} of the seeds failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn one_seed() {
    let Some(seed) = env_u64("RAIDFS_SIM_SEED") else {
        return;
    };
    // RUST_LOG=info shows the engine's log of the replay.
    let _ = env_logger::builder().is_test(true).try_init();
    let started = Instant::now();
    match check_seed(seed, env_u64("RAIDFS_SIM_SHRINK").unwrap_or(60) as usize) {
        Ok(t) => {
            let mut totals = Totals::default();
            totals.add(&t);
            println!("{}", totals.line(started.elapsed()));
        }
        Err(report) => panic!("{report}"),
    }
}

#[test]
fn keep_lists_round_trip() {
    let actions: Vec<(usize, Action)> = [1usize, 2, 3, 7, 9, 10]
        .iter()
        .map(|&i| (i, Action::Fault(schedule::Fault::Settle)))
        .collect();
    let list = keep_list(&actions);
    assert_eq!(list, "1-3,7,9-10");
    assert_eq!(parse_keep(&list), vec![1, 2, 3, 7, 9, 10]);
}

#[test]
fn a_schedule_is_the_same_for_the_same_seed() {
    let a = format!("{:?}", schedule(77, 200));
    let b = format!("{:?}", schedule(77, 200));
    assert_eq!(a, b);
    assert_ne!(a, format!("{:?}", schedule(78, 200)));
}
