//! Array reports as Prometheus metrics, in the text exposition format
//! (version 0.0.4): what `raidfs metrics` prints for node_exporter's
//! textfile collector and what `-o metrics=ADDR` serves over HTTP. The
//! names, types and labels are documented in docs/metrics.md.
//!
//! Each family is written once, with its `# HELP` and `# TYPE` lines, and
//! then one sample per array or member, so several arrays never split a
//! family. Counters end in `_total`; label values and help texts are
//! escaped as the format requires.

use super::report::{ArrayReport, MemberReport};
use std::fmt::Write;

/// The content type of the text format, for HTTP.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Member states, each a series of `raidfs_member_state` (1 for the one it is in).
const MEMBER_STATES: [&str; 4] = ["active", "faulty", "rebuilding", "missing"];
/// Background work, each a series of `raidfs_array_sync_action` (md's
/// sync_action): every action a report's `sync` can name, so the running
/// one always has its series at 1.
const SYNC_ACTIONS: [&str; 7] = [
    "idle", "resync", "recovery", "replace", "reshape", "check", "repair",
];

#[derive(Clone, Copy)]
enum Kind {
    Counter,
    Gauge,
}

/// The text of `reports`' metrics, every family once.
pub fn render(reports: &[ArrayReport]) -> String {
    let mut out = Out::default();

    out.family(
        "raidfs_array_info",
        Kind::Gauge,
        "Always 1; the array's level, layout and mount point as labels.",
        |out| {
            for r in reports {
                let mut labels = array_labels(r);
                labels.push(("level", r.level.clone()));
                labels.push(("layout", r.layout.clone()));
                labels.push(("read_policy", r.read_policy.clone()));
                out.sample(&labels, 1.0);
            }
        },
    );
    array_gauge(
        &mut out,
        reports,
        "raidfs_array_degraded",
        "1 when some member slot is not active.",
        |r| flag(r.degraded),
    );
    array_gauge(
        &mut out,
        reports,
        "raidfs_array_suspended",
        "1 while the host fails every member and writes are refused or held.",
        |r| flag(r.suspended.is_some()),
    );
    array_gauge(
        &mut out,
        reports,
        "raidfs_array_read_only",
        "1 when mounted read-only.",
        |r| flag(r.read_only),
    );
    array_gauge(
        &mut out,
        reports,
        "raidfs_array_raid_devices",
        "Member slots of the array.",
        |r| r.raid_devices as f64,
    );
    array_gauge(
        &mut out,
        reports,
        "raidfs_array_active_devices",
        "Member slots in sync.",
        |r| r.active_devices as f64,
    );
    array_gauge(
        &mut out,
        reports,
        "raidfs_array_failed_devices",
        "Member slots faulty or missing.",
        |r| r.failed_devices as f64,
    );
    array_gauge(
        &mut out,
        reports,
        "raidfs_array_spare_devices",
        "Hot spares waiting for a slot.",
        |r| r.spares.len() as f64,
    );
    out.family(
        "raidfs_array_sync_action",
        Kind::Gauge,
        "1 for the background work running now (idle when none), 0 for the others.",
        |out| {
            for r in reports {
                let running = r.sync.as_ref().map_or("idle", |s| s.action.as_str());
                for action in SYNC_ACTIONS {
                    let mut labels = array_labels(r);
                    labels.push(("action", action.to_string()));
                    out.sample(&labels, flag(running == action));
                }
            }
        },
    );
    out.family(
        "raidfs_array_sync_progress_ratio",
        Kind::Gauge,
        "Fraction of the running background work done, 0 to 1 (only while it runs).",
        |out| {
            for r in reports {
                if let Some(s) = &r.sync {
                    let mut labels = array_labels(r);
                    labels.push(("action", s.action.clone()));
                    let ratio = if s.total == 0 {
                        0.0
                    } else {
                        s.done.min(s.total) as f64 / s.total as f64
                    };
                    out.sample(&labels, ratio);
                }
            }
        },
    );
    out.family(
        "raidfs_array_sync_speed_bytes",
        Kind::Gauge,
        "Bytes per second of the running background work (only while it runs).",
        |out| {
            for r in reports {
                if let Some(s) = &r.sync {
                    let mut labels = array_labels(r);
                    labels.push(("action", s.action.clone()));
                    out.sample(&labels, s.speed as f64);
                }
            }
        },
    );
    array_counter(
        &mut out,
        reports,
        "raidfs_array_mismatches_total",
        "Bytes the running or last check/repair found inconsistent (md's mismatch_cnt; starts again at each check).",
        |r| match (&r.sync, &r.last_sync) {
            (Some(s), _) => s.mismatches,
            (None, Some(l)) => l.mismatches,
            (None, None) => 0,
        },
    );
    array_gauge(
        &mut out,
        reports,
        "raidfs_array_size_bytes",
        "Logical bytes of the array if every group held data.",
        |r| r.array_size as f64,
    );
    array_gauge(
        &mut out,
        reports,
        "raidfs_array_fs_size_bytes",
        "Size of the filesystem, as statfs reports it.",
        |r| r.fs_size as f64,
    );
    array_gauge(
        &mut out,
        reports,
        "raidfs_array_free_bytes",
        "Free space of the filesystem available to users, as statfs reports it.",
        |r| r.fs_free as f64,
    );
    array_counter(
        &mut out,
        reports,
        "raidfs_array_host_no_space_errors_total",
        "Member writes the host refused for lack of space since the mount.",
        |r| r.host_no_space_errors,
    );
    array_gauge(
        &mut out,
        reports,
        "raidfs_array_damaged_ranges",
        "File ranges whose data no copy or parity could correct (see raidfs status -v).",
        |r| r.damaged.len() as f64,
    );

    out.family(
        "raidfs_member_state",
        Kind::Gauge,
        "1 for the state the member slot is in, 0 for the others.",
        |out| {
            for (r, m) in members(reports) {
                for state in MEMBER_STATES {
                    let mut labels = member_labels(r, m);
                    labels.push(("state", state.to_string()));
                    out.sample(&labels, flag(m.state.as_str() == state));
                }
            }
        },
    );
    member_counter(
        &mut out,
        reports,
        "raidfs_member_read_errors_total",
        "Read errors of the member slot since the mount.",
        |m| m.read_errors as f64,
    );
    member_counter(
        &mut out,
        reports,
        "raidfs_member_write_errors_total",
        "Write errors of the member slot since the mount.",
        |m| m.write_errors as f64,
    );
    member_counter(
        &mut out,
        reports,
        "raidfs_member_checksum_errors_total",
        "Blocks of the member slot that failed their checksum since the mount.",
        |m| m.checksum_errors as f64,
    );
    member_counter(
        &mut out,
        reports,
        "raidfs_member_read_ops_total",
        "Data reads of the member slot since the mount.",
        |m| m.io.read_ops as f64,
    );
    member_counter(
        &mut out,
        reports,
        "raidfs_member_write_ops_total",
        "Data writes of the member slot since the mount.",
        |m| m.io.write_ops as f64,
    );
    member_counter(
        &mut out,
        reports,
        "raidfs_member_read_bytes_total",
        "Bytes read from the member slot since the mount.",
        |m| m.io.read_bytes as f64,
    );
    member_counter(
        &mut out,
        reports,
        "raidfs_member_write_bytes_total",
        "Bytes written to the member slot since the mount.",
        |m| m.io.write_bytes as f64,
    );
    member_counter(
        &mut out,
        reports,
        "raidfs_member_read_seconds_total",
        "Seconds spent in the member slot's reads (divide by raidfs_member_read_ops_total for the mean latency).",
        |m| m.io.read_nanos as f64 / 1e9,
    );
    member_counter(
        &mut out,
        reports,
        "raidfs_member_write_seconds_total",
        "Seconds spent in the member slot's writes (divide by raidfs_member_write_ops_total for the mean latency).",
        |m| m.io.write_nanos as f64 / 1e9,
    );
    member_counter(
        &mut out,
        reports,
        "raidfs_member_balanced_reads_total",
        "Mirror reads the read balancer sent to the member slot.",
        |m| m.reads as f64,
    );
    member_counter(
        &mut out,
        reports,
        "raidfs_member_seeks_total",
        "Mirror reads that did not continue where the member's previous read ended.",
        |m| m.seeks as f64,
    );
    member_gauge(
        &mut out,
        reports,
        "raidfs_member_read_latency_seconds",
        "Moving average of the member's mirror read latency.",
        |m| m.latency_us / 1e6,
    );
    member_gauge(
        &mut out,
        reports,
        "raidfs_member_read_streams",
        "Sequential read streams the balancer keeps on the member now.",
        |m| m.streams.len() as f64,
    );
    member_gauge(
        &mut out,
        reports,
        "raidfs_member_pending_reads",
        "Mirror reads in flight on the member now.",
        |m| f64::from(m.pending),
    );
    out.text
}

fn flag(b: bool) -> f64 {
    if b {
        1.0
    } else {
        0.0
    }
}

fn array_labels(r: &ArrayReport) -> Vec<(&'static str, String)> {
    vec![
        ("array", r.name.clone()),
        ("uuid", r.uuid.clone()),
        ("mount", r.mount_point.clone()),
    ]
}

fn member_labels(r: &ArrayReport, m: &MemberReport) -> Vec<(&'static str, String)> {
    let mut labels = array_labels(r);
    labels.push(("member", m.name.clone()));
    labels.push(("slot", m.slot.to_string()));
    labels
}

fn members(reports: &[ArrayReport]) -> impl Iterator<Item = (&ArrayReport, &MemberReport)> {
    reports
        .iter()
        .flat_map(|r| r.members.iter().map(move |m| (r, m)))
}

fn array_gauge(
    out: &mut Out,
    reports: &[ArrayReport],
    name: &str,
    help: &str,
    value: impl Fn(&ArrayReport) -> f64,
) {
    out.family(name, Kind::Gauge, help, |out| {
        for r in reports {
            out.sample(&array_labels(r), value(r));
        }
    });
}

fn array_counter(
    out: &mut Out,
    reports: &[ArrayReport],
    name: &str,
    help: &str,
    value: impl Fn(&ArrayReport) -> u64,
) {
    out.family(name, Kind::Counter, help, |out| {
        for r in reports {
            out.sample(&array_labels(r), value(r) as f64);
        }
    });
}

fn member_counter(
    out: &mut Out,
    reports: &[ArrayReport],
    name: &str,
    help: &str,
    value: impl Fn(&MemberReport) -> f64,
) {
    member_family(out, reports, name, Kind::Counter, help, value);
}

fn member_gauge(
    out: &mut Out,
    reports: &[ArrayReport],
    name: &str,
    help: &str,
    value: impl Fn(&MemberReport) -> f64,
) {
    member_family(out, reports, name, Kind::Gauge, help, value);
}

fn member_family(
    out: &mut Out,
    reports: &[ArrayReport],
    name: &str,
    kind: Kind,
    help: &str,
    value: impl Fn(&MemberReport) -> f64,
) {
    out.family(name, kind, help, |out| {
        for (r, m) in members(reports) {
            out.sample(&member_labels(r, m), value(m));
        }
    });
}

#[derive(Default)]
struct Out {
    text: String,
    /// The family being written.
    name: String,
}

impl Out {
    fn family(&mut self, name: &str, kind: Kind, help: &str, samples: impl FnOnce(&mut Out)) {
        // In the 0.0.4 text format HELP and TYPE name the samples exactly,
        // `_total` included (OpenMetrics would drop it from the family).
        let kind = match kind {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
        };
        let _ = writeln!(self.text, "# HELP {name} {}", escape_help(help));
        let _ = writeln!(self.text, "# TYPE {name} {kind}");
        self.name = name.to_string();
        samples(self);
    }

    fn sample(&mut self, labels: &[(&str, String)], value: f64) {
        self.text.push_str(&self.name);
        if !labels.is_empty() {
            self.text.push('{');
            for (i, (key, val)) in labels.iter().enumerate() {
                if i > 0 {
                    self.text.push(',');
                }
                let _ = write!(self.text, "{key}=\"{}\"", escape_label(val));
            }
            self.text.push('}');
        }
        let _ = writeln!(self.text, " {}", number(value));
    }
}

/// A sample value as the format spells it (Go's float formatting accepts
/// Rust's shortest round-trip form; the special values have fixed names).
fn number(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.into()
    } else {
        format!("{v}")
    }
}

/// Label values escape backslash, double quote and line feed.
fn escape_label(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// Help texts escape backslash and line feed.
fn escape_help(s: &str) -> String {
    s.replace('\\', "\\\\").replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_and_help_are_escaped() {
        assert_eq!(escape_label(r#"a\b"c"#), r#"a\\b\"c"#);
        assert_eq!(escape_label("x\ny"), "x\\ny");
        assert_eq!(escape_help("a\\b\nc \"q\""), "a\\\\b\\nc \"q\"");
    }

    #[test]
    fn numbers_use_the_formats_spelling() {
        assert_eq!(number(3.0), "3");
        assert_eq!(number(0.25), "0.25");
        assert_eq!(number(1e21), "1000000000000000000000");
        assert_eq!(number(f64::NAN), "NaN");
        assert_eq!(number(f64::INFINITY), "+Inf");
    }

    #[test]
    fn every_background_action_has_a_sync_action_series() {
        use crate::array::SyncAction;
        // A match without a wildcard: a new action fails to compile here.
        let all = |a: SyncAction| match a {
            SyncAction::Resync
            | SyncAction::Recovery
            | SyncAction::Replace
            | SyncAction::Check
            | SyncAction::Repair
            | SyncAction::Reshape => a.to_string(),
        };
        for action in [
            SyncAction::Resync,
            SyncAction::Recovery,
            SyncAction::Replace,
            SyncAction::Check,
            SyncAction::Repair,
            SyncAction::Reshape,
        ] {
            let name = all(action);
            assert!(SYNC_ACTIONS.contains(&name.as_str()), "{name}");
        }
    }

    #[test]
    fn a_counter_family_has_help_type_and_total_samples() {
        let mut out = Out::default();
        out.family("x_ops_total", Kind::Counter, "Ops.", |o| {
            o.sample(&[("m", "/a \"b\"".into())], 2.0);
            o.sample(&[], 5.0);
        });
        assert_eq!(
            out.text,
            "# HELP x_ops_total Ops.\n# TYPE x_ops_total counter\nx_ops_total{m=\"/a \\\"b\\\"\"} 2\nx_ops_total 5\n"
        );
    }
}
