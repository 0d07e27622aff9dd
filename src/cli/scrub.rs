//! `raidfs check`, `raidfs repair` (scrub a mounted array; `check --stop`
//! stops any background work) and `raidfs speed-limit`.

use crate::cli::manage::{run_request, send_with, wait_until_idle, Say};
use crate::cli::status::connect;
use crate::control::Request;
use std::path::{Path, PathBuf};

#[derive(clap::Args)]
pub struct CheckArgs {
    /// Wait for the scrub to finish, showing its progress.
    #[arg(long)]
    pub wait: bool,
    /// Stop the running background work (check, repair, recovery or replace).
    #[arg(long, conflicts_with = "wait")]
    pub stop: bool,
    /// Print the array report (as `detail --json`) once the check started
    /// or, with --wait, ended: `sync` or `last_sync` holds it.
    #[arg(long, conflicts_with = "stop")]
    pub json: bool,
    /// The mount point.
    pub mount_point: PathBuf,
}

#[derive(clap::Args)]
pub struct RepairArgs {
    /// Wait for the repair to finish, showing its progress.
    #[arg(long)]
    pub wait: bool,
    /// Print the array report (as `detail --json`) once the repair started
    /// or, with --wait, ended: `sync` or `last_sync` holds it.
    #[arg(long)]
    pub json: bool,
    /// The mount point.
    pub mount_point: PathBuf,
}

#[derive(clap::Args)]
pub struct SpeedLimitArgs {
    /// md's speed_limit_min: the rate background work keeps even while
    /// files are being read and written. KiB/s, or with a K, M or G suffix;
    /// 0 for none.
    #[arg(long, value_parser = parse_rate)]
    pub min: Option<u64>,
    /// md's speed_limit_max: the most background work may use. KiB/s, or
    /// with a K, M or G suffix; 0 for none.
    #[arg(long, value_parser = parse_rate)]
    pub max: Option<u64>,
    /// The mount point.
    pub mount_point: PathBuf,
}

/// A rate as md takes it: a plain number is KiB/s; `K`, `M`, `G` (per
/// second) are binary units. Returns bytes per second.
pub fn parse_rate(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let t = t
        .strip_suffix("/s")
        .or_else(|| t.strip_suffix("/sec"))
        .unwrap_or(t);
    let (digits, unit) = t.split_at(t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len()));
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("'{s}' is not a rate (examples: 51200, 50M, 0)"))?;
    let shift = match unit
        .to_ascii_uppercase()
        .trim_end_matches("IB")
        .trim_end_matches('B')
    {
        "" | "K" => 10,
        "M" => 20,
        "G" => 30,
        _ => return Err(format!("'{s}': unknown unit '{unit}' (use K, M or G)")),
    };
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| format!("'{s}' is too large"))
}

pub fn run_check(args: CheckArgs) -> i32 {
    if args.stop {
        return run_request(&args.mount_point, Request::Stop, false, &[]);
    }
    if args.json {
        return scrub_json(&args.mount_point, false, args.wait);
    }
    run_request(
        &args.mount_point,
        Request::Check { repair: false },
        args.wait,
        &["check"],
    )
}

pub fn run_repair(args: RepairArgs) -> i32 {
    if args.json {
        return scrub_json(&args.mount_point, true, args.wait);
    }
    run_request(
        &args.mount_point,
        Request::Check { repair: true },
        args.wait,
        &["repair"],
    )
}

/// `check --json` / `repair --json`: start the scrub, wait for it with
/// `wait`, and print the array report. Exit 1 when a waited-for scrub
/// stopped or failed, as without --json.
fn scrub_json(mount_point: &Path, repair: bool, wait: bool) -> i32 {
    let outcome = connect(mount_point).and_then(|mut client| {
        let report = send_with(&mut client, &Request::Check { repair }, Say::Stderr)?;
        if !wait {
            return Ok((report, true));
        }
        let report = wait_until_idle(&mut client, &report, |_| {})?;
        let completed = report.last_sync.as_ref().is_some_and(|l| l.completed);
        Ok((report, completed))
    });
    match outcome {
        Ok((report, completed)) => match serde_json::to_string_pretty(&report) {
            Ok(text) => {
                println!("{text}");
                i32::from(!completed)
            }
            Err(e) => super::fail(format!("encoding JSON: {e}")),
        },
        Err(msg) => super::fail(msg),
    }
}

pub fn run_speed_limit(args: SpeedLimitArgs) -> i32 {
    // With neither limit given this just prints the current ones.
    run_request(
        &args.mount_point,
        Request::SpeedLimit {
            min: args.min,
            max: args.max,
        },
        false,
        &[],
    )
}

#[cfg(test)]
mod tests {
    use super::parse_rate;

    #[test]
    fn rates_are_kib_per_second_unless_suffixed() {
        assert_eq!(parse_rate("51200"), Ok(51200 << 10));
        assert_eq!(parse_rate("512K"), Ok(512 << 10));
        assert_eq!(parse_rate("2M"), Ok(2 << 20));
        assert_eq!(parse_rate("1G/s"), Ok(1 << 30));
        assert_eq!(parse_rate("0"), Ok(0));
        assert!(parse_rate("fast").is_err());
        assert!(parse_rate("5X").is_err());
    }
}
