//! `raidfs detail`: one mounted array in full, like `mdadm --detail`.

use crate::array::MemberState;
use crate::cli::examine::utc;
use crate::cli::status::{connect, query};
use crate::control::ArrayReport;
use std::fmt::Write;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct DetailArgs {
    /// Print JSON (see docs/status-json.md) instead of text.
    #[arg(long)]
    pub json: bool,
    /// Exit status tells the array's health, as `mdadm --detail --test`:
    /// 0 healthy, 1 degraded, 2 unusable, 4 the mount cannot be read.
    #[arg(short = 't', long)]
    pub test: bool,
    /// The mount point.
    pub mount_point: PathBuf,
}

/// `--test` exit statuses, mdadm's meanings.
pub const TEST_HEALTHY: i32 = 0;
pub const TEST_DEGRADED: i32 = 1;
pub const TEST_UNUSABLE: i32 = 2;
pub const TEST_UNREADABLE: i32 = 4;

pub fn run(args: DetailArgs) -> i32 {
    let report = match connect(&args.mount_point).and_then(|mut c| query(&mut c)) {
        Ok(report) => report,
        Err(msg) => {
            let code = super::fail(msg);
            return if args.test { TEST_UNREADABLE } else { code };
        }
    };
    let done = if args.test { test_code(&report) } else { 0 };
    if args.json {
        return match serde_json::to_string_pretty(&report) {
            Ok(text) => {
                println!("{text}");
                done
            }
            Err(e) => super::fail(format!("encoding JSON: {e}")),
        };
    }
    print!("{}", detail_text(&report));
    done
}

/// Members a level survives losing at worst, from what the report says:
/// RAID10's real limit depends on which members go (the engine refuses to
/// fail the last copy, and suspends instead), so only the count is
/// bounded here.
fn tolerance(r: &ArrayReport) -> usize {
    match r.level.as_str() {
        "raid0" => 0,
        "raid5" => 1,
        "raid6" => 2,
        _ => r.raid_devices.saturating_sub(1),
    }
}

/// `detail --test`'s status for a report: unusable when the array is
/// suspended (the host fails its members; writes are refused or held) or
/// misses more members than its level survives; degraded when any slot is
/// not active; else healthy.
pub fn test_code(r: &ArrayReport) -> i32 {
    if r.suspended.is_some() || r.failed_devices > tolerance(r) {
        TEST_UNUSABLE
    } else if r.degraded || r.failed_devices > 0 {
        TEST_DEGRADED
    } else {
        TEST_HEALTHY
    }
}

/// `N (X.XX MiB Y.YY MB)` for a size in bytes, as mdadm shows sizes (N in KiB).
fn size(bytes: u64) -> String {
    format!(
        "{} ({:.2} MiB {:.2} MB)",
        bytes / 1024,
        bytes as f64 / (1 << 20) as f64,
        bytes as f64 / 1e6
    )
}

fn limit(bytes_per_sec: u64) -> String {
    match bytes_per_sec {
        0 => "none".into(),
        b => format!("{}K/sec", b / 1024),
    }
}

pub fn detail_text(r: &ArrayReport) -> String {
    let present = r
        .members
        .iter()
        .filter(|m| m.state != MemberState::Missing)
        .count();
    let mut out = String::new();
    let mut line = |label: &str, value: String| {
        let _ = writeln!(out, "{label:>18} : {value}");
    };
    line("Version", format!("raidfs 1 (report {})", r.version));
    line("Creation Time", utc(r.created));
    line("Raid Level", r.level.clone());
    line("Array Size", size(r.array_size));
    line("Used Dev Size", size(r.member_size));
    line("Raid Devices", r.raid_devices.to_string());
    line("Total Devices", (present + r.spares.len()).to_string());
    line("Update Time", utc(r.updated));
    line("State", r.state.clone());
    line("Active Devices", r.active_devices.to_string());
    line(
        "Working Devices",
        (r.raid_devices - r.failed_devices + r.spares.len()).to_string(),
    );
    line("Failed Devices", r.failed_devices.to_string());
    line("Spare Devices", r.spares.len().to_string());
    if !r.layout.is_empty() {
        line("Layout", r.layout.clone());
    }
    line("Chunk Size", format!("{}K", r.chunk / 1024));
    if let Some(s) = &r.sync {
        let label = match s.action.as_str() {
            "recovery" => "Rebuild Status",
            "replace" => "Replace Status",
            "resync" => "Resync Status",
            "reshape" => "Reshape Status",
            _ => "Check Status",
        };
        let mut status = format!("{}% complete", s.per_mille() / 10);
        if s.action == "check" || s.action == "repair" {
            let _ = write!(status, ", {} bytes mismatched so far", s.mismatches);
        }
        line(label, status);
    }
    if let Some(g) = &r.reshape {
        line(
            "Reshape",
            format!(
                "{} -> {}, {} of {} groups to move{}",
                g.from_level,
                g.to_level,
                g.groups_pending,
                g.groups_total,
                if r.sync.as_ref().is_some_and(|s| s.action == "reshape") {
                    ""
                } else {
                    " (stopped: `raidfs grow MOUNT` goes on)"
                }
            ),
        );
    }
    line("Name", r.name.clone());
    line("UUID", r.uuid.clone());
    line("Events", r.events.to_string());
    line(
        "Mount Point",
        format!(
            "{} (daemon pid {}, owner uid {})",
            r.mount_point, r.daemon_pid, r.owner_uid
        ),
    );
    line(
        "Groups",
        format!("{} of {} allocated", r.groups_allocated, r.groups_total),
    );
    line(
        "Sync Speed Limits",
        format!(
            "min {}, max {}",
            limit(r.speed_limit.min),
            limit(r.speed_limit.max)
        ),
    );
    if let Some(last) = &r.last_sync {
        let mut text = last.message.clone();
        if last.action == "check" || last.action == "repair" {
            let _ = write!(text, " ({} bytes mismatched)", last.mismatches);
        }
        line("Last Sync", text);
    }
    if let Some(p) = &r.paused_scrub {
        line(
            "Paused Scrub",
            format!(
                "{} at {:.1}%; `raidfs {}` resumes it",
                p.action,
                crate::array::percent(p.done, p.total),
                p.action
            ),
        );
    }
    line("Read Policy", r.read_policy.clone());
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "    Number   State          Read  Write  Checksum     Reads    Read MiB   Seeks  Pending   Device"
    );
    for m in &r.members {
        let _ = writeln!(
            out,
            "    {:>6}   {:<12} {:>6} {:>6} {:>9} {:>9} {:>11} {:>7} {:>8}   {}{}",
            m.slot,
            m.state,
            m.read_errors,
            m.write_errors,
            m.checksum_errors,
            m.reads,
            m.read_bytes >> 20,
            m.seeks,
            m.pending,
            m.name,
            match (m.write_mostly, m.failfast) {
                (true, true) => " (W, failfast)",
                (true, false) => " (W)",
                (false, true) => " (failfast)",
                (false, false) => "",
            }
        );
    }
    if let Some(rep) = &r.replacing {
        let _ = writeln!(
            out,
            "    {:>6}   {:<12} {:>6} {:>6} {:>9}   {}",
            rep.slot, "replacement", "-", "-", "-", rep.name
        );
    }
    for s in &r.spares {
        let _ = writeln!(
            out,
            "    {:>6}   {:<12} {:>6} {:>6} {:>9}   {s}",
            "-", "spare", "-", "-", "-"
        );
    }
    if !r.damaged.is_empty() {
        let _ = writeln!(out);
        out.push_str(&crate::cli::status::damaged_text(r));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::monitor::events::tests::report;
    use MemberState::{Active, Faulty, Missing};

    #[test]
    fn test_codes_follow_mdadm() {
        assert_eq!(test_code(&report(&[Active, Active])), TEST_HEALTHY);
        assert_eq!(test_code(&report(&[Active, Faulty])), TEST_DEGRADED);
        assert_eq!(test_code(&report(&[Missing, Faulty])), TEST_UNUSABLE);
        let mut raid5 = report(&[Active, Faulty, Missing]);
        raid5.level = "raid5".into();
        assert_eq!(test_code(&raid5), TEST_UNUSABLE);
        let mut raid0 = report(&[Active, Faulty]);
        raid0.level = "raid0".into();
        assert_eq!(test_code(&raid0), TEST_UNUSABLE);
        let mut suspended = report(&[Active, Active]);
        suspended.suspended = Some("the host failed every member".into());
        assert_eq!(test_code(&suspended), TEST_UNUSABLE);
    }
}
