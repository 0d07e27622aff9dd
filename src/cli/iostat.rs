//! `raidfs iostat [-v] [MOUNT] [INTERVAL [COUNT]]`, in the manner of
//! `zpool iostat`: per array (and with `-v` per member) operations and
//! bandwidth per second and the mean latency of each direction.
//!
//! The first report covers the time since each mount (averages over it);
//! with an INTERVAL, each later report covers the last interval, computed
//! from the difference of the members' cumulative counters (so nothing is
//! missed between samples). An array's row sums its members, as a pool's
//! row sums its disks: a mirror's write counts once per copy. `-v` also
//! shows where each sequential read stream the balancer keeps on a member
//! stands.

use crate::cli::status::{all_reports, connect, query};
use crate::control::{ArrayReport, IoReport};
use std::fmt::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

#[derive(clap::Args)]
pub struct IostatArgs {
    /// Also show each member, and the read streams it serves.
    #[arg(short, long)]
    pub verbose: bool,
    /// `[MOUNT] [INTERVAL [COUNT]]`: the array mounted at MOUNT (every
    /// mounted array if left out); a report every INTERVAL seconds, COUNT
    /// of them (for ever if left out).
    #[arg(value_name = "MOUNT|INTERVAL|COUNT", num_args = 0..=3)]
    pub args: Vec<String>,
}

/// What the positional words say.
#[derive(Debug, PartialEq)]
struct Plan {
    mount_point: Option<PathBuf>,
    interval: Option<Duration>,
    count: Option<u64>,
}

fn plan(words: &[String]) -> Result<Plan, String> {
    let mut words = words.iter().peekable();
    // A mount point is the first word unless it is a number.
    let mount_point = match words.peek() {
        Some(w) if w.parse::<f64>().is_err() => words.next().map(PathBuf::from),
        _ => None,
    };
    let interval = match words.next() {
        None => None,
        Some(w) => match w.parse::<f64>() {
            Ok(secs) if secs.is_finite() && secs > 0.0 && secs <= 86_400.0 => {
                Some(Duration::from_secs_f64(secs))
            }
            _ => return Err(format!("interval {w:?}: expected seconds, more than 0")),
        },
    };
    let count = match words.next() {
        None => None,
        Some(w) => match w.parse::<u64>() {
            Ok(n) if n > 0 => Some(n),
            _ => {
                return Err(format!(
                    "count {w:?}: expected a number of reports, 1 or more"
                ))
            }
        },
    };
    if let Some(extra) = words.next() {
        return Err(format!(
            "unexpected {extra:?}: the arguments are [MOUNT] [INTERVAL [COUNT]]"
        ));
    }
    Ok(Plan {
        mount_point,
        interval,
        count,
    })
}

pub fn run(args: IostatArgs) -> i32 {
    let plan = match plan(&args.args) {
        Ok(p) => p,
        Err(msg) => return super::fail(msg),
    };
    let fetch = || -> Result<Vec<ArrayReport>, String> {
        match &plan.mount_point {
            Some(mp) => connect(mp).and_then(|mut c| query(&mut c)).map(|r| vec![r]),
            None => Ok(all_reports()),
        }
    };
    let count = match plan.interval {
        None => 1,
        Some(_) => plan.count.unwrap_or(u64::MAX),
    };
    let mut before: Vec<ArrayReport> = Vec::new();
    let mut next = Instant::now();
    for n in 0..count {
        let now = match fetch() {
            Ok(reports) => reports,
            Err(msg) => return super::fail(msg),
        };
        if n > 0 {
            println!();
        }
        print!("{}", table(&now, &before, args.verbose));
        before = now;
        if n + 1 < count {
            if let Some(interval) = plan.interval {
                next += interval;
                std::thread::sleep(next.saturating_duration_since(Instant::now()));
            }
        }
    }
    0
}

/// Rates over a span: the difference of two counter samples.
#[derive(Clone, Copy, Default)]
struct Span {
    io: IoReport,
    secs: f64,
}

fn diff(now: &IoReport, then: Option<&IoReport>) -> IoReport {
    let then = then.copied().unwrap_or_default();
    IoReport {
        read_ops: now.read_ops.saturating_sub(then.read_ops),
        read_bytes: now.read_bytes.saturating_sub(then.read_bytes),
        read_nanos: now.read_nanos.saturating_sub(then.read_nanos),
        write_ops: now.write_ops.saturating_sub(then.write_ops),
        write_bytes: now.write_bytes.saturating_sub(then.write_bytes),
        write_nanos: now.write_nanos.saturating_sub(then.write_nanos),
    }
}

fn sum(a: IoReport, b: IoReport) -> IoReport {
    IoReport {
        read_ops: a.read_ops + b.read_ops,
        read_bytes: a.read_bytes + b.read_bytes,
        read_nanos: a.read_nanos + b.read_nanos,
        write_ops: a.write_ops + b.write_ops,
        write_bytes: a.write_bytes + b.write_bytes,
        write_nanos: a.write_nanos + b.write_nanos,
    }
}

const NAME_WIDTH: usize = 28;

/// The report of `now` against `before` (the previous sample; arrays not
/// in it are shown since their mount).
fn table(now: &[ArrayReport], before: &[ArrayReport], verbose: bool) -> String {
    let mut out = String::new();
    let rule = format!(
        "{}  {}",
        "-".repeat(NAME_WIDTH),
        ["-----"; 6].map(|d| format!("{d:>6}")).join(" ")
    );
    let _ = writeln!(
        out,
        "{:NAME_WIDTH$}  {:>13} {:>13} {:>13}",
        "", "operations", "bandwidth", "latency"
    );
    let _ = writeln!(
        out,
        "{:NAME_WIDTH$}  {:>6} {:>6} {:>6} {:>6} {:>6} {:>6}{}",
        "array / member",
        "read",
        "write",
        "read",
        "write",
        "read",
        "write",
        if verbose { "  read streams at" } else { "" }
    );
    let _ = writeln!(out, "{rule}");
    if now.is_empty() {
        let _ = writeln!(out, "no raidfs arrays are mounted");
    }
    for r in now {
        let prev = before
            .iter()
            .find(|b| b.mount_point == r.mount_point && b.uuid == r.uuid);
        let secs = match prev {
            Some(p) => r.io_seconds - p.io_seconds,
            None => r.io_seconds,
        };
        let members: Vec<Span> = r
            .members
            .iter()
            .map(|m| {
                let then = prev
                    .and_then(|p| p.members.iter().find(|o| o.slot == m.slot))
                    .map(|o| &o.io);
                Span {
                    io: diff(&m.io, then),
                    secs,
                }
            })
            .collect();
        let total = Span {
            io: members
                .iter()
                .fold(IoReport::default(), |a, s| sum(a, s.io)),
            secs,
        };
        let name = format!("{} ({})", r.mount_point, r.level);
        let _ = writeln!(out, "{}", row(&name, &total, ""));
        if verbose {
            for (m, span) in r.members.iter().zip(&members) {
                let streams: Vec<String> = m.streams.iter().map(|&at| size(at as f64)).collect();
                let label = format!("  {} [{}]", short(&m.name), m.slot);
                let _ = writeln!(out, "{}", row(&label, span, &streams.join(" ")));
            }
        }
    }
    let _ = writeln!(out, "{rule}");
    out
}

fn short(name: &str) -> &str {
    std::path::Path::new(name)
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or(name)
}

fn row(name: &str, s: &Span, streams: &str) -> String {
    let per_sec = |v: u64| {
        if s.secs > 0.0 {
            v as f64 / s.secs
        } else {
            0.0
        }
    };
    let mean = |nanos: u64, ops: u64| {
        if ops == 0 {
            "-".to_string()
        } else {
            latency(nanos as f64 / ops as f64)
        }
    };
    let mut name = name.to_string();
    if name.len() > NAME_WIDTH {
        name = format!("...{}", &name[name.len() - (NAME_WIDTH - 3)..]);
    }
    let line = format!(
        "{name:NAME_WIDTH$}  {:>6} {:>6} {:>6} {:>6} {:>6} {:>6}",
        count(per_sec(s.io.read_ops)),
        count(per_sec(s.io.write_ops)),
        size(per_sec(s.io.read_bytes)),
        size(per_sec(s.io.write_bytes)),
        mean(s.io.read_nanos, s.io.read_ops),
        mean(s.io.write_nanos, s.io.write_ops),
    );
    if streams.is_empty() {
        line
    } else {
        format!("{line}  {streams}")
    }
}

/// zpool's numbers: at most four figures and a suffix (K, M, G, T).
fn scaled(v: f64, base: f64) -> String {
    let units = ["", "K", "M", "G", "T", "P"];
    let mut v = v;
    let mut i = 0;
    while v >= base * 0.9995 && i + 1 < units.len() {
        v /= base;
        i += 1;
    }
    if i == 0 {
        format!("{}", v.round() as u64)
    } else if v < 10.0 {
        format!("{v:.2}{}", units[i])
    } else if v < 100.0 {
        format!("{v:.1}{}", units[i])
    } else {
        format!("{v:.0}{}", units[i])
    }
}

fn count(v: f64) -> String {
    scaled(v, 1000.0)
}

fn size(v: f64) -> String {
    scaled(v, 1024.0)
}

/// A latency in nanoseconds as ns, us, ms or s.
fn latency(nanos: f64) -> String {
    if nanos < 1e3 {
        format!("{}ns", nanos.round() as u64)
    } else if nanos < 1e6 {
        format!("{}us", (nanos / 1e3).round() as u64)
    } else if nanos < 1e9 {
        format!("{}ms", (nanos / 1e6).round() as u64)
    } else {
        format!("{:.1}s", nanos / 1e9)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(w: &[&str]) -> Vec<String> {
        w.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn positional_words_are_mount_interval_count() {
        assert_eq!(
            plan(&words(&["/mnt", "2", "5"])),
            Ok(Plan {
                mount_point: Some("/mnt".into()),
                interval: Some(Duration::from_secs(2)),
                count: Some(5),
            })
        );
        assert_eq!(
            plan(&words(&["0.5"])),
            Ok(Plan {
                mount_point: None,
                interval: Some(Duration::from_millis(500)),
                count: None,
            })
        );
        assert!(plan(&words(&["/mnt", "0"])).is_err());
        assert!(plan(&words(&["/mnt", "1", "0"])).is_err());
        assert!(plan(&words(&["/mnt", "1", "2", "3"])).is_err());
        assert!(plan(&words(&["/mnt", "soon"])).is_err());
    }

    #[test]
    fn numbers_are_scaled_like_zpool() {
        assert_eq!(count(0.0), "0");
        assert_eq!(count(999.0), "999");
        assert_eq!(count(1500.0), "1.50K");
        assert_eq!(size(4096.0), "4.00K");
        assert_eq!(size(150.0 * 1024.0 * 1024.0), "150M");
        assert_eq!(latency(850.0), "850ns");
        assert_eq!(latency(2_400_000.0), "2ms");
    }
}
