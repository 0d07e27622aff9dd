//! `raidfs bench balance`: the linux-raid thread's experiment on simulated
//! disks. One and two concurrent sequential readers of distant regions, on
//! two-way and three-way RAID1 mirrors of 2003-era IDE disks, under every read
//! policy; reports MiB/s per reader (in simulated time) and seeks per member.
//!
//! The thread measured a single `dd` at 27.5 MiB/s and two concurrent ones at
//! 9.9 MiB/s each on a three-way mirror; `legacy` reproduces that collapse and
//! `sticky` should keep each reader at single-stream speed.

use crate::array::{create, Array, CreateSpec, MemberStats, ReadPolicy, GROUP_SHIFT};
use crate::geometry::Level;
use crate::member::simulated::{Clock, DiskModel, SimulatedDisk};
use crate::member::Member;
use crate::superblock::GroupProfile;
use serde::Serialize;
use std::sync::{Arc, Barrier};
use std::time::Instant;

#[derive(clap::Args, Clone, Debug)]
pub struct BalanceArgs {
    /// Print the results as JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Only this policy (sticky, round-robin, first, legacy).
    #[arg(long, value_name = "NAME")]
    pub policy: Option<ReadPolicy>,
    /// Simulated MiB each reader reads.
    #[arg(long, default_value_t = 24)]
    pub mib: u64,
    /// Size of each read in KiB (a reader's read-ahead window).
    #[arg(long, default_value_t = 128)]
    pub request_kib: usize,
    /// Wall-clock seconds per simulated second (0.5: twice as fast as the disks).
    #[arg(long, default_value_t = 0.5)]
    pub scale: f64,
    /// Exit with status 1 unless two streams on the three-way mirror each reach
    /// 0.95 of single-stream speed under sticky.
    #[arg(long)]
    pub check: bool,
}

/// Size of each simulated disk (sparse: only superblocks take memory).
const DISK_SIZE: u64 = 40 << 30;
const CHUNK: u64 = 64 << 10;
/// The goal: each of two streams at this fraction of single-stream speed.
const GOAL: f64 = 0.95;

#[derive(Serialize)]
struct Case {
    mirrors: usize,
    streams: usize,
    policy: ReadPolicy,
    /// Per reader, MiB/s of simulated time.
    mib_per_s: Vec<f64>,
    /// Seeks each simulated disk made.
    disk_seeks: Vec<u64>,
    members: Vec<MemberStats>,
}

#[derive(Serialize)]
struct Report {
    disk: String,
    request_kib: usize,
    mib_per_reader: u64,
    scale: f64,
    cases: Vec<Case>,
    /// Two-stream over one-stream speed on the three-way mirror, per policy.
    three_way_ratio: Vec<(ReadPolicy, f64)>,
}

struct Rig {
    disks: Vec<Arc<SimulatedDisk>>,
    array: Arc<Array>,
    /// Logical start of each reader's region: far apart on the members.
    starts: [u64; 2],
}

fn build(mirrors: usize, scale: f64) -> Result<Rig, String> {
    let disks: Vec<Arc<SimulatedDisk>> = (0..mirrors)
        .map(|i| {
            Arc::new(SimulatedDisk::new(
                format!("sim{i}"),
                DISK_SIZE,
                DiskModel::default(),
                Clock::Real { scale },
            ))
        })
        .collect();
    disks.iter().for_each(|d| d.set_timing(false));
    let members = disks
        .iter()
        .map(|d| (Arc::clone(d) as Arc<dyn Member>, d.name()))
        .collect();
    let spec = CreateSpec {
        chunk: CHUNK,
        name: "balance".into(),
        ..CreateSpec::new(Level::Raid1)
    };
    let array =
        create(members, &spec).map_err(|e| format!("cannot create the simulated array: {e}"))?;
    let groups = array.superblock().groups.len();
    let far = groups / 2;
    let mut allocated = Vec::new();
    while allocated.len() <= far {
        allocated.push(
            array
                .allocate_group(GroupProfile::Data)
                .map_err(|e| format!("cannot allocate: {e}"))?,
        );
    }
    let starts = [
        (allocated[0] as u64) << GROUP_SHIFT,
        (allocated[far] as u64) << GROUP_SHIFT,
    ];
    Ok(Rig {
        disks,
        array: Arc::new(array),
        starts,
    })
}

fn run_case(
    rig: &Rig,
    streams: usize,
    policy: ReadPolicy,
    args: &BalanceArgs,
) -> Result<Case, String> {
    rig.array.set_read_policy(policy);
    rig.array.reset_member_stats();
    for d in &rig.disks {
        d.reset(0);
        d.set_timing(true);
    }
    let request = args.request_kib.max(4) << 10;
    let total = args.mib << 20;
    let barrier = Arc::new(Barrier::new(streams));
    let handles: Vec<_> = (0..streams)
        .map(|s| {
            let array = Arc::clone(&rig.array);
            let barrier = Arc::clone(&barrier);
            let start = rig.starts[s];
            std::thread::spawn(move || -> Result<f64, String> {
                let mut buf = vec![0u8; request];
                barrier.wait();
                let began = Instant::now();
                let mut done = 0u64;
                while done < total {
                    array
                        .read(start + done, &mut buf)
                        .map_err(|e| format!("read failed: {e}"))?;
                    done += request as u64;
                }
                Ok(began.elapsed().as_secs_f64())
            })
        })
        .collect();
    let mut mib_per_s = Vec::with_capacity(streams);
    for h in handles {
        let wall = h
            .join()
            .map_err(|_| "reader thread panicked".to_string())??;
        let simulated = wall / args.scale.max(1e-6);
        mib_per_s.push(args.mib as f64 / simulated.max(1e-9));
    }
    rig.disks.iter().for_each(|d| d.set_timing(false));
    Ok(Case {
        mirrors: rig.disks.len(),
        streams,
        policy,
        mib_per_s,
        disk_seeks: rig.disks.iter().map(|d| d.counters().seeks).collect(),
        members: rig.array.member_stats(),
    })
}

fn measure(args: &BalanceArgs) -> Result<Report, String> {
    if !(args.scale > 0.0 && args.scale.is_finite()) {
        return Err(format!(
            "--scale must be a positive number, not {}",
            args.scale
        ));
    }
    let policies: Vec<ReadPolicy> = match args.policy {
        Some(p) => vec![p],
        None => ReadPolicy::ALL.to_vec(),
    };
    let mut cases = Vec::new();
    for mirrors in [2, 3] {
        let rig = build(mirrors, args.scale)?;
        for &policy in &policies {
            for streams in [1, 2] {
                cases.push(run_case(&rig, streams, policy, args)?);
            }
        }
    }
    let mean = |c: &Case| c.mib_per_s.iter().sum::<f64>() / c.mib_per_s.len().max(1) as f64;
    let worst = |c: &Case| c.mib_per_s.iter().copied().fold(f64::INFINITY, f64::min);
    let three_way_ratio = policies
        .iter()
        .filter_map(|&p| {
            let find = |n| {
                cases
                    .iter()
                    .find(|c| c.mirrors == 3 && c.streams == n && c.policy == p)
            };
            Some((p, worst(find(2)?) / mean(find(1)?)))
        })
        .collect();
    let model = DiskModel::default();
    Ok(Report {
        disk: format!(
            "{:.1} ms average seek, {} rpm, {} MiB/s",
            model.average_seek.as_secs_f64() * 1000.0,
            model.rpm,
            model.transfer_rate >> 20
        ),
        request_kib: args.request_kib,
        mib_per_reader: args.mib,
        scale: args.scale,
        cases,
        three_way_ratio,
    })
}

fn print_table(r: &Report) {
    println!(
        "simulated disks: {}; {} KiB reads, {} MiB per reader, time scale {}",
        r.disk, r.request_kib, r.mib_per_reader, r.scale
    );
    println!(
        "{:<8} {:>7}  {:<12} {:>18}  {:<16} reads per disk",
        "mirror", "readers", "policy", "MiB/s per reader", "seeks per disk"
    );
    for c in &r.cases {
        let rates: Vec<String> = c.mib_per_s.iter().map(|v| format!("{v:.1}")).collect();
        let seeks: Vec<String> = c.disk_seeks.iter().map(|v| v.to_string()).collect();
        let reads: Vec<String> = c.members.iter().map(|m| m.reads.to_string()).collect();
        println!(
            "{:<8} {:>7}  {:<12} {:>18}  {:<16} {}",
            format!("{}-way", c.mirrors),
            c.streams,
            c.policy.name(),
            rates.join(" / "),
            seeks.join(" "),
            reads.join(" ")
        );
    }
    for (p, ratio) in &r.three_way_ratio {
        println!(
            "3-way mirror, 2 readers, {:<11}: slowest reader at {ratio:.2} of single-reader speed",
            p.name()
        );
    }
}

/// Run the benchmark; returns the exit code.
pub fn run(args: BalanceArgs) -> i32 {
    let report = match measure(&args) {
        Ok(r) => r,
        Err(e) => return super::fail(e),
    };
    if args.json {
        match serde_json::to_string_pretty(&report) {
            Ok(s) => println!("{s}"),
            Err(e) => return super::fail(format!("cannot encode the results: {e}")),
        }
    } else {
        print_table(&report);
    }
    if args.check {
        let sticky = report
            .three_way_ratio
            .iter()
            .find(|(p, _)| *p == ReadPolicy::Sticky);
        match sticky {
            Some((_, ratio)) if *ratio >= GOAL => {}
            Some((_, ratio)) => {
                return super::fail(format!(
                    "sticky: {ratio:.2} of single-stream speed, goal {GOAL}"
                ))
            }
            None => return super::fail("--check needs the sticky policy in the run"),
        }
    }
    0
}
