//! Delivering `raidfs monitor`'s events: a line on stdout, the user's
//! program (mdadm's `--program`: `CMD EVENT MOUNT [MEMBER]`, waited for),
//! a mail through the local sendmail (mdadm's `--mail`), and syslog.

use super::events::{Event, Severity};
use std::ffi::CString;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Where events go.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Delivery {
    pub program: Option<String>,
    pub mail: Option<String>,
    /// The mail's From: (mdadm's MAILFROM).
    pub mail_from: Option<String>,
    pub syslog: bool,
}

/// Sends events as [`Delivery`] says; warns once about a missing sendmail.
pub struct Notifier {
    delivery: Delivery,
    warned_no_sendmail: bool,
    host: String,
}

/// Where sendmail is looked for after `$PATH`.
const SENDMAIL_FALLBACKS: [&str; 2] = ["/usr/sbin/sendmail", "/usr/lib/sendmail"];

impl Notifier {
    pub fn new(delivery: Delivery) -> Notifier {
        if delivery.syslog {
            open_syslog();
        }
        Notifier {
            delivery,
            warned_no_sendmail: false,
            host: host_name(),
        }
    }

    /// Deliver `event`; `detail` is the array's `raidfs detail` text (or
    /// what is known of a dead mount), for the mail's body.
    pub fn send(&mut self, event: &Event, detail: &str) {
        let mut line = format!(
            "{} event detected on {}",
            event.kind.name(),
            event.mount_point
        );
        if let Some(member) = &event.member {
            line.push_str(&format!(", member {member}"));
        }
        if let Some(file) = &event.file {
            line.push_str(&format!(", file {file}"));
        }
        line.push_str(&format!(": {}", event.message));
        // stdout may be gone (a closed pipe): the other deliveries go on.
        let _ = writeln!(
            std::io::stdout(),
            "{}: {line}",
            super::super::examine::utc(now_secs())
        );
        if self.delivery.syslog {
            syslog(event.kind.severity(), &line);
        }
        if let Some(program) = self.delivery.program.clone() {
            run_program(&program, event);
        }
        if let Some(to) = self.delivery.mail.clone() {
            if event.kind.mailed() {
                self.mail(&to, event, detail);
            }
        }
    }

    fn mail(&mut self, to: &str, event: &Event, detail: &str) {
        let Some(sendmail) = find_sendmail() else {
            if !self.warned_no_sendmail {
                eprintln!(
                    "raidfs monitor: warning: no sendmail on PATH nor at {}: events are not mailed to {to}",
                    SENDMAIL_FALLBACKS.join(" or ")
                );
                self.warned_no_sendmail = true;
            }
            return;
        };
        let from = self
            .delivery
            .mail_from
            .clone()
            .unwrap_or_else(|| "raidfs monitoring <root>".into());
        let text = message(&from, to, &self.host, event, detail);
        let child = Command::new(&sendmail)
            .arg("-t")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn();
        let mut child = match child {
            Ok(child) => child,
            Err(e) => {
                eprintln!(
                    "raidfs monitor: warning: running {}: {e}",
                    sendmail.display()
                );
                return;
            }
        };
        if let Some(mut stdin) = child.stdin.take() {
            if let Err(e) = stdin.write_all(text.as_bytes()) {
                eprintln!(
                    "raidfs monitor: warning: writing to {}: {e}",
                    sendmail.display()
                );
            }
        }
        match child.wait() {
            Ok(status) if status.success() => {}
            Ok(status) => eprintln!(
                "raidfs monitor: warning: {} -t {status} (mail to {to} not sent)",
                sendmail.display()
            ),
            Err(e) => eprintln!(
                "raidfs monitor: warning: waiting for {}: {e}",
                sendmail.display()
            ),
        }
    }
}

/// The RFC 822 message for `event` (headers, blank line, body).
pub fn message(from: &str, to: &str, host: &str, event: &Event, detail: &str) -> String {
    let kind = event.kind.name();
    let mut body = format!(
        "This is an automatically generated mail message from raidfs monitor\n\
         running on {host}\n\n\
         A {kind} event had been detected on the raidfs mount {}.\n",
        event.mount_point
    );
    if let Some(member) = &event.member {
        body.push_str(&format!("\nIt could be related to member {member}.\n"));
    }
    if let Some(file) = &event.file {
        body.push_str(&format!("\nThe file concerned is {file}.\n"));
    }
    body.push_str(&format!("\n{}\n", event.message));
    if !detail.is_empty() {
        body.push_str(&format!(
            "\nraidfs detail {}:\n\n{detail}",
            event.mount_point
        ));
        if !detail.ends_with('\n') {
            body.push('\n');
        }
    }
    format!(
        "From: {from}\nTo: {to}\nSubject: raidfs: {kind} on {}\nDate: {}\n\n{body}",
        event.mount_point,
        rfc822_date()
    )
}

/// `sendmail` on `$PATH`, else at the usual places.
fn find_sendmail() -> Option<PathBuf> {
    let on_path = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|dir| dir.join("sendmail"))
            .find(|p| is_executable(p))
    });
    on_path.or_else(|| {
        SENDMAIL_FALLBACKS
            .iter()
            .map(PathBuf::from)
            .find(|p| is_executable(p))
    })
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Run the user's program with the event's arguments, and its details in
/// the environment (ZED's way: `RAIDFS_EVENT`, `RAIDFS_MOUNT`,
/// `RAIDFS_MEMBER`, `RAIDFS_FILE`, `RAIDFS_UUID`, `RAIDFS_MESSAGE`).
fn run_program(program: &str, event: &Event) {
    let mut cmd = Command::new(program);
    cmd.args(event.arguments())
        .env("RAIDFS_EVENT", event.kind.name())
        .env("RAIDFS_MOUNT", &event.mount_point)
        .env("RAIDFS_MESSAGE", &event.message)
        .stdin(Stdio::null());
    for (name, value) in [
        ("RAIDFS_MEMBER", &event.member),
        ("RAIDFS_FILE", &event.file),
        ("RAIDFS_UUID", &event.uuid),
    ] {
        match value {
            Some(v) => cmd.env(name, v),
            None => cmd.env_remove(name),
        };
    }
    match cmd.status() {
        Ok(status) if status.success() => {}
        Ok(status) => eprintln!(
            "raidfs monitor: warning: {program} {} {status}",
            event.arguments().join(" ")
        ),
        Err(e) => eprintln!("raidfs monitor: warning: running {program}: {e}"),
    }
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// RFC 2822 date of now, in UTC.
fn rfc822_date() -> String {
    // SAFETY: time(NULL) has no preconditions; gmtime_r fills tm.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    let now = now_secs() as libc::time_t;
    // SAFETY: both pointers are valid for the call.
    unsafe { libc::gmtime_r(&now, &mut tm) };
    const DAYS: [&str; 7] = ["Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"];
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    format!(
        "{}, {:02} {} {} {:02}:{:02}:{:02} +0000",
        DAYS[tm.tm_wday.rem_euclid(7) as usize],
        tm.tm_mday,
        MONTHS[tm.tm_mon.rem_euclid(12) as usize],
        tm.tm_year + 1900,
        tm.tm_hour,
        tm.tm_min,
        tm.tm_sec
    )
}

fn host_name() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: buf is valid for its length; gethostname NUL-terminates
    // what fits.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "localhost".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// openlog("raidfs", LOG_PID, LOG_DAEMON): the identity must outlive every
/// syslog call, so it is a static string.
fn open_syslog() {
    static IDENT: &[u8] = b"raidfs\0";
    // SAFETY: IDENT is NUL-terminated and static.
    unsafe { libc::openlog(IDENT.as_ptr().cast(), libc::LOG_PID, libc::LOG_DAEMON) };
}

fn syslog(severity: Severity, line: &str) {
    let priority = match severity {
        Severity::Critical => libc::LOG_CRIT,
        Severity::Warning => libc::LOG_WARNING,
        Severity::Info => libc::LOG_INFO,
    };
    let Ok(text) = CString::new(line.replace('\0', " ")) else {
        return;
    };
    static FORMAT: &[u8] = b"%s\0";
    // SAFETY: the format is "%s" with one NUL-terminated string argument.
    unsafe { libc::syslog(priority, FORMAT.as_ptr().cast(), text.as_ptr()) };
}

#[cfg(test)]
mod tests {
    use super::super::events::{Event, Kind};
    use super::*;

    #[test]
    fn the_mail_has_the_headers_and_the_detail() {
        let event = Event {
            kind: Kind::Fail,
            mount_point: "/mnt/a".into(),
            member: Some("/img/m1".into()),
            file: None,
            uuid: Some("u".into()),
            message: "/img/m1 (slot 1) failed".into(),
        };
        let text = message(
            "raidfs monitoring <root>",
            "ops@example.com",
            "box",
            &event,
            "State : clean, degraded\n",
        );
        let (head, body) = text.split_once("\n\n").unwrap();
        assert!(head.starts_with(
            "From: raidfs monitoring <root>\nTo: ops@example.com\nSubject: raidfs: Fail on /mnt/a\nDate: "
        ));
        assert!(body.contains("A Fail event had been detected on the raidfs mount /mnt/a."));
        assert!(body.contains("It could be related to member /img/m1."));
        assert!(body.ends_with("State : clean, degraded\n"), "{body}");
    }
}
