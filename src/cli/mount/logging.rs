//! The mount daemon's logger: env_logger's filter (`RUST_LOG`, by default
//! `info`) and format, written to the log file (the daemon's stderr) or,
//! under systemd or with `-o log=syslog`, to syslog, which journald
//! collects; and in front of both a limit on repeated messages.
//!
//! A daemon that logs every failed request can fill a disk: a program
//! looping on one failing call writes the same line thousands of times a
//! second. So each message *kind* (its level, module and text with the
//! numbers taken out, so `slot 1` and `slot 2` count as one) is written at
//! most [`BURST`] times per [`INTERVAL`]; the rest are counted, and the
//! first one of the kind after the interval, or the daemon's final flush,
//! writes `suppressed N similar messages` first. Debug and trace records,
//! which someone asked for by name, are never held back.

use std::collections::HashMap;
use std::ffi::CString;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use log::{Level, Log, Metadata, Record};

/// Messages of one kind written per interval before the rest are counted.
pub const BURST: u32 = 5;
/// How long a kind's count runs.
pub const INTERVAL: Duration = Duration::from_secs(60);
/// Kinds tracked at once; beyond this, kinds whose interval has ended are
/// forgotten (a storm of distinct messages is not what this guards).
const MAX_KINDS: usize = 1024;

/// The default filter: `info`, but not fuser's complaint that its own
/// unmount found the mount already gone, the normal end of a session here.
const DEFAULT_FILTER: &str = "info,fuser::mnt=error";

/// The filter for `RUST_LOG`: its directives, with fuser's unmount
/// complaint left out unless they name `fuser::mnt` themselves (a
/// `RUST_LOG=debug` to look into something else must not make every
/// clean unmount log a warning).
fn filters(rust_log: Option<&str>) -> String {
    match rust_log.map(str::trim) {
        None | Some("") => DEFAULT_FILTER.to_string(),
        Some(given) if given.contains("fuser::mnt") => given.to_string(),
        Some(given) => format!("{given},fuser::mnt=error"),
    }
}

/// Where the daemon's records go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sink {
    /// The process's stderr (the log file, once the daemon redirected it).
    Stderr,
    /// syslog(3), `daemon` facility, ident `raidfs`.
    Syslog,
}

/// Whether this process was started by systemd (a service or a mount
/// unit), whose journal then wants the daemon's records.
pub fn under_systemd() -> bool {
    std::env::var_os("INVOCATION_ID").is_some() || std::env::var_os("JOURNAL_STREAM").is_some()
}

/// Install the daemon's logger. A second call (tests that run several
/// mounts in one process) keeps the first logger.
pub fn init(sink: Sink) {
    let inner = env_logger::Builder::new()
        .parse_filters(&filters(std::env::var("RUST_LOG").ok().as_deref()))
        .format_timestamp_millis()
        .build();
    if sink == Sink::Syslog {
        // SAFETY: the ident is a static NUL-terminated string, as openlog
        // keeps the pointer.
        unsafe {
            libc::openlog(
                c"raidfs".as_ptr(),
                libc::LOG_PID | libc::LOG_NDELAY,
                libc::LOG_DAEMON,
            )
        };
    }
    let max = inner.filter();
    let logger = Limited {
        inner,
        sink,
        kinds: Mutex::new(Limiter::default()),
    };
    if log::set_boxed_logger(Box::new(logger)).is_ok() {
        log::set_max_level(max);
    }
}

struct Limited {
    inner: env_logger::Logger,
    sink: Sink,
    kinds: Mutex<Limiter>,
}

impl Limited {
    fn write(&self, record: &Record<'_>) {
        match self.sink {
            Sink::Stderr => self.inner.log(record),
            Sink::Syslog => syslog(record.level(), &record.args().to_string()),
        }
    }

    /// Write a `suppressed` line with the level and module of the kind.
    fn write_suppressed(&self, level: Level, target: &str, count: u64, example: &str) {
        let text = format!(
            "suppressed {count} similar message{} in the last {} s, the last: {example}",
            if count == 1 { "" } else { "s" },
            INTERVAL.as_secs()
        );
        self.write(
            &Record::builder()
                .level(level)
                .target(target)
                .args(format_args!("{text}"))
                .build(),
        );
    }
}

impl Log for Limited {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        self.inner.enabled(metadata)
    }

    fn log(&self, record: &Record<'_>) {
        if !self.inner.matches(record) {
            return;
        }
        if record.level() >= Level::Debug {
            self.write(record);
            return;
        }
        let text = record.args().to_string();
        let kind = Kind {
            level: record.level(),
            target: record.target().to_string(),
            shape: shape(&text),
        };
        let verdict =
            self.kinds
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .admit(kind, &text, Instant::now());
        if let Some((count, example)) = verdict.suppressed_before {
            self.write_suppressed(record.level(), record.target(), count, &example);
        }
        if verdict.write {
            self.write(record);
        }
    }

    /// Write the counts of every kind still being held back (the daemon
    /// calls this as it exits).
    fn flush(&self) {
        let pending = self
            .kinds
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain_suppressed();
        for (kind, count, example) in pending {
            self.write_suppressed(kind.level, &kind.target, count, &example);
        }
        self.inner.flush();
    }
}

/// What counts as "the same message".
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Kind {
    level: Level,
    target: String,
    shape: String,
}

/// The message with every run of digits (and hex digits after `0x`)
/// replaced by `#`.
fn shape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c.is_ascii_digit() {
            let hex = c == '0' && chars.peek() == Some(&'x');
            if hex {
                chars.next();
            }
            while chars
                .peek()
                .is_some_and(|n| n.is_ascii_digit() || (hex && n.is_ascii_hexdigit()))
            {
                chars.next();
            }
            out.push('#');
        } else {
            out.push(c);
        }
    }
    out
}

/// The count of one kind in its current interval.
struct Window {
    started: Instant,
    written: u32,
    suppressed: u64,
    last_suppressed: String,
}

#[derive(Default)]
struct Limiter {
    kinds: HashMap<Kind, Window>,
}

#[derive(Debug, PartialEq, Eq)]
struct Verdict {
    /// Write the record.
    write: bool,
    /// Write this count (and the last such message) first.
    suppressed_before: Option<(u64, String)>,
}

impl Limiter {
    /// Count one record of `kind` at `now` and say what to write.
    fn admit(&mut self, kind: Kind, text: &str, now: Instant) -> Verdict {
        if self.kinds.len() >= MAX_KINDS && !self.kinds.contains_key(&kind) {
            self.kinds
                .retain(|_, w| now.duration_since(w.started) < INTERVAL || w.suppressed > 0);
            if self.kinds.len() >= MAX_KINDS {
                // Only distinct messages, each once: nothing to hold back.
                return Verdict {
                    write: true,
                    suppressed_before: None,
                };
            }
        }
        let window = self.kinds.entry(kind).or_insert_with(|| Window {
            started: now,
            written: 0,
            suppressed: 0,
            last_suppressed: String::new(),
        });
        let mut suppressed_before = None;
        if now.duration_since(window.started) >= INTERVAL {
            if window.suppressed > 0 {
                suppressed_before = Some((
                    window.suppressed,
                    std::mem::take(&mut window.last_suppressed),
                ));
            }
            *window = Window {
                started: now,
                written: 0,
                suppressed: 0,
                last_suppressed: String::new(),
            };
        }
        if window.written < BURST {
            window.written += 1;
            return Verdict {
                write: true,
                suppressed_before,
            };
        }
        window.suppressed += 1;
        window.last_suppressed = text.to_string();
        Verdict {
            write: false,
            suppressed_before,
        }
    }

    /// Every kind with records held back, with their counts, which start
    /// again from zero.
    fn drain_suppressed(&mut self) -> Vec<(Kind, u64, String)> {
        let mut out = Vec::new();
        for (kind, window) in self.kinds.iter_mut() {
            if window.suppressed > 0 {
                out.push((
                    kind.clone(),
                    window.suppressed,
                    std::mem::take(&mut window.last_suppressed),
                ));
                window.suppressed = 0;
            }
        }
        out
    }
}

/// One record to syslog at the matching priority.
fn syslog(level: Level, text: &str) {
    let priority = match level {
        Level::Error => libc::LOG_ERR,
        Level::Warn => libc::LOG_WARNING,
        Level::Info => libc::LOG_INFO,
        Level::Debug | Level::Trace => libc::LOG_DEBUG,
    };
    // A NUL cannot reach syslog; it would cut the message short.
    let Ok(text) = CString::new(text.replace('\0', "\\0")) else {
        return;
    };
    // SAFETY: the format is a static "%s" and text a NUL-terminated string.
    unsafe { libc::syslog(priority, c"%s".as_ptr(), text.as_ptr()) };
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind(text: &str) -> Kind {
        Kind {
            level: Level::Warn,
            target: "raidfs::x".into(),
            shape: shape(text),
        }
    }

    #[test]
    fn fusers_unmount_complaint_stays_out_whatever_rust_log_says() {
        assert_eq!(filters(None), DEFAULT_FILTER);
        assert_eq!(filters(Some("debug")), "debug,fuser::mnt=error");
        assert_eq!(filters(Some("fuser::mnt=warn")), "fuser::mnt=warn");
    }

    #[test]
    fn numbers_do_not_make_messages_different() {
        assert_eq!(shape("slot 12 failed at 4096"), "slot # failed at #");
        assert_eq!(shape("ioctl 0x8008660a"), "ioctl #");
        assert_ne!(shape("slot 1 failed"), shape("slot 1 rebuilt"));
    }

    #[test]
    fn a_burst_is_written_then_counted_then_summed_up() {
        let mut limiter = Limiter::default();
        let start = Instant::now();
        let written = (0..100)
            .filter(|i| {
                let text = format!("ioctl {i}: failed");
                limiter.admit(kind(&text), &text, start).write
            })
            .count();
        assert_eq!(written, BURST as usize);
        let later = start + INTERVAL;
        let verdict = limiter.admit(kind("ioctl 1: failed"), "ioctl 1: failed", later);
        assert_eq!(
            verdict,
            Verdict {
                write: true,
                suppressed_before: Some((100 - u64::from(BURST), "ioctl 99: failed".into())),
            }
        );
        // Another kind is not held back by the first.
        assert!(limiter.admit(kind("other"), "other", later).write);
    }

    #[test]
    fn the_final_flush_reports_what_is_held_back() {
        let mut limiter = Limiter::default();
        let now = Instant::now();
        for _ in 0..BURST + 3 {
            limiter.admit(kind("same"), "same", now);
        }
        let pending = limiter.drain_suppressed();
        assert_eq!(pending.len(), 1);
        assert_eq!(pending[0].1, 3);
        assert!(limiter.drain_suppressed().is_empty());
    }
}
