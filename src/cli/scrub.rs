//! `raidfs check`, `raidfs repair` (scrub a mounted array; `check --stop`
//! stops any background work, and a stopped check or repair resumes from
//! its checkpoint when next started) and `raidfs speed-limit`. With
//! `--wait` they follow the scrub, attaching to one already running; with
//! `--max-time` they pause it when the time is up, as mdcheck's run-time
//! limit does, so a timer can scrub a large array in slices.

use crate::cli::manage::{
    followed_run, result_of, run_request, send, send_with, wait_for_background_until,
    wait_until_run_ends, Pause, Say,
};
use crate::cli::status::{connect, query};
use crate::control::Request;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

#[derive(clap::Args)]
pub struct CheckArgs {
    /// Wait for the check to finish, showing its progress; attaches to a
    /// check that is already running.
    #[arg(long)]
    pub wait: bool,
    /// Stop (pause) the running background work (check, repair, recovery
    /// or replace); a check or repair resumes from there when next started.
    #[arg(long, conflicts_with_all = ["wait", "restart", "max_time", "continue_only"])]
    pub stop: bool,
    /// Start from the beginning instead of resuming a paused check.
    #[arg(long, conflicts_with = "continue_only")]
    pub restart: bool,
    /// Only resume a paused check (mdcheck's --continue): do nothing when
    /// none is paused.
    #[arg(long = "continue")]
    pub continue_only: bool,
    /// With --wait: pause the check after this long (e.g. 6h, 90m, 3600s;
    /// a plain number is seconds), to be resumed by the next run; a SIGTERM
    /// pauses it too.
    #[arg(long, requires = "wait", value_parser = parse_duration)]
    pub max_time: Option<Duration>,
    /// Print the array report (as `detail --json`) once the check started
    /// or, with --wait, ended: `sync` or `last_sync` holds it.
    #[arg(long, conflicts_with = "stop")]
    pub json: bool,
    /// The mount point.
    pub mount_point: PathBuf,
}

#[derive(clap::Args)]
pub struct RepairArgs {
    /// Wait for the repair to finish, showing its progress; attaches to a
    /// repair that is already running.
    #[arg(long)]
    pub wait: bool,
    /// Start from the beginning instead of resuming a paused repair.
    #[arg(long, conflicts_with = "continue_only")]
    pub restart: bool,
    /// Only resume a paused repair: do nothing when none is paused.
    #[arg(long = "continue")]
    pub continue_only: bool,
    /// With --wait: pause the repair after this long (as for check).
    #[arg(long, requires = "wait", value_parser = parse_duration)]
    pub max_time: Option<Duration>,
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

/// A duration: a number with `s`, `m`, `h` or `d` (plain: seconds),
/// or several, as in `1h30m`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    if t.is_empty() {
        return Err("an empty duration (examples: 6h, 90m, 3600)".into());
    }
    let mut secs: u64 = 0;
    let mut rest = t;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        if digits == 0 {
            return Err(format!("'{s}' is not a duration (examples: 6h, 90m, 3600)"));
        }
        let n: u64 = rest[..digits]
            .parse()
            .map_err(|_| format!("'{s}' is too large"))?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let unit = match &rest[..unit_len] {
            "" | "s" | "sec" => 1,
            "m" | "min" => 60,
            "h" => 3600,
            "d" => 86400,
            other => return Err(format!("'{s}': unknown unit '{other}' (use s, m, h or d)")),
        };
        rest = &rest[unit_len..];
        secs = n
            .checked_mul(unit)
            .and_then(|v| secs.checked_add(v))
            .ok_or_else(|| format!("'{s}' is too large"))?;
    }
    if secs == 0 {
        return Err(format!("'{s}': the time limit must be more than zero"));
    }
    Ok(Duration::from_secs(secs))
}

pub fn run_check(args: CheckArgs) -> i32 {
    if args.stop {
        return run_request(&args.mount_point, Request::Stop, false, &[]);
    }
    if args.json {
        return scrub_json(&args.mount_point, false, args.wait, args.restart);
    }
    run_scrub(
        &args.mount_point,
        false,
        Start {
            restart: args.restart,
            continue_only: args.continue_only,
            wait: args.wait,
            max_time: args.max_time,
        },
    )
}

pub fn run_repair(args: RepairArgs) -> i32 {
    if args.json {
        return scrub_json(&args.mount_point, true, args.wait, args.restart);
    }
    run_scrub(
        &args.mount_point,
        true,
        Start {
            restart: args.restart,
            continue_only: args.continue_only,
            wait: args.wait,
            max_time: args.max_time,
        },
    )
}

/// How `check` or `repair` was asked to start.
struct Start {
    restart: bool,
    continue_only: bool,
    wait: bool,
    max_time: Option<Duration>,
}

/// Start (or resume) a check or repair; with `wait`, follow it, attaching
/// to one of the same kind that is already running.
fn run_scrub(mount_point: &Path, repair: bool, start: Start) -> i32 {
    let action = if repair { "repair" } else { "check" };
    let pause = start
        .max_time
        .map(|limit| Pause::new(Instant::now() + limit));
    let outcome = connect(mount_point).and_then(|mut client| {
        let report = query(&mut client)?;
        let running = report.sync.as_ref().filter(|s| {
            s.action == action && (start.wait || start.continue_only) && !start.restart
        });
        let paused = report
            .paused_scrub
            .as_ref()
            .is_some_and(|p| p.action == action);
        let report = match running {
            Some(s) => {
                println!(
                    "raidfs: {action} is already running ({:.1}%){}",
                    s.per_mille() as f64 / 10.0,
                    if start.wait { "; following it" } else { "" }
                );
                report
            }
            None if start.continue_only && !paused => {
                println!("raidfs: no paused {action} to continue");
                return Ok(());
            }
            None => send(
                &mut client,
                &Request::Check {
                    repair,
                    restart: start.restart,
                },
            )?,
        };
        if start.wait {
            wait_for_background_until(&mut client, &report, &[action], pause.as_ref())
        } else {
            Ok(())
        }
    });
    match outcome {
        Ok(()) => 0,
        Err(msg) => super::fail(msg),
    }
}

/// `check --json` / `repair --json`: start the scrub, wait for it with
/// `wait`, and print the array report. Exit 1 when a waited-for scrub
/// stopped or failed, as without --json.
fn scrub_json(mount_point: &Path, repair: bool, wait: bool, restart: bool) -> i32 {
    let outcome = connect(mount_point).and_then(|mut client| {
        let report = send_with(
            &mut client,
            &Request::Check { repair, restart },
            Say::Stderr,
        )?;
        if !wait {
            return Ok((report, true));
        }
        let action = if repair { "repair" } else { "check" };
        let Some(run) = followed_run(&report, &[action]) else {
            return Ok((report, true));
        };
        // Until this scrub ends, not work started after it.
        let report = wait_until_run_ends(&mut client, &report, run, |_| {})?;
        let completed = result_of(&report, run).is_some_and(|l| l.completed);
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
    use super::{parse_duration, parse_rate};
    use std::time::Duration;

    #[test]
    fn durations_take_units_and_combine() {
        assert_eq!(parse_duration("90"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("6h"), Ok(Duration::from_secs(6 * 3600)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("2d"), Ok(Duration::from_secs(2 * 86400)));
        assert!(parse_duration("").is_err());
        assert!(parse_duration("0").is_err());
        assert!(parse_duration("h").is_err());
        assert!(parse_duration("5w").is_err());
        assert!(parse_duration("99999999999999999999d").is_err());
    }

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
