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
    /// The mount point.
    pub mount_point: PathBuf,
}

pub fn run(args: DetailArgs) -> i32 {
    let report = match connect(&args.mount_point).and_then(|mut c| query(&mut c)) {
        Ok(report) => report,
        Err(msg) => return super::fail(msg),
    };
    if args.json {
        return match serde_json::to_string_pretty(&report) {
            Ok(text) => {
                println!("{text}");
                0
            }
            Err(e) => super::fail(format!("encoding JSON: {e}")),
        };
    }
    print!("{}", detail_text(&report));
    0
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
            _ => "Check Status",
        };
        let mut status = format!("{}% complete", s.per_mille() / 10);
        if s.action == "check" || s.action == "repair" {
            let _ = write!(status, ", {} bytes mismatched so far", s.mismatches);
        }
        line(label, status);
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
            if m.write_mostly { " (W)" } else { "" }
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
    out
}
