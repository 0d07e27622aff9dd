//! `raidfs monitor`: watch every raidfs mount on the machine (or the ones
//! named), as `mdadm --monitor` and ZFS's ZED do, and raise an event for
//! each change that matters: a member failing, a rebuild's progress, bad
//! copies and unrecoverable data, a daemon that died. Each pass asks every
//! daemon for its report (see [`crate::cli::status::survey`]) and
//! [`events::Tracker`] compares it with the last pass; [`notify`] delivers.
//!
//! Settings come from the command line, then the `monitor:` section of
//! `/etc/raidfs.ron`, then md's defaults (a pass every 60 s).

pub mod events;
pub mod notify;

use std::path::PathBuf;
use std::time::Duration;

use super::config::{self, Config};
use super::detail::detail_text;
use super::status::{self, InactiveMount, Survey};
use crate::control::ArrayReport;
use crate::fuse::mounts;
use events::{Event, Expectations, Tracker};
use notify::{Delivery, Notifier};

#[derive(clap::Args)]
pub struct MonitorArgs {
    /// Run CMD for each event, as `CMD EVENT MOUNTPOINT [MEMBER]`.
    #[arg(short, long, value_name = "CMD")]
    pub program: Option<String>,
    /// Mail events to ADDR through the local sendmail.
    #[arg(short, long, value_name = "ADDR")]
    pub mail: Option<String>,
    /// The mails' sender (default `raidfs monitoring <root>`).
    #[arg(long, value_name = "ADDR")]
    pub mail_from: Option<String>,
    /// Log events to syslog (facility daemon).
    #[arg(short = 'y', long)]
    pub syslog: bool,
    /// Seconds between passes (default 60; fractions allowed).
    #[arg(short, long, value_name = "SECS")]
    pub delay: Option<f64>,
    /// Check once, raise what is found, and exit.
    #[arg(short = '1', long)]
    pub oneshot: bool,
    /// Raise a TestMessage for every array at start.
    #[arg(short, long)]
    pub test: bool,
    /// The configuration file (default $RAIDFS_CONFIG or /etc/raidfs.ron).
    #[arg(long, value_name = "PATH")]
    pub config: Option<PathBuf>,
    /// Watch only these mount points (default: every raidfs mount).
    pub mount_points: Vec<PathBuf>,
}

/// The settings of a run, the command line over the configuration file.
struct Settings {
    delivery: Delivery,
    delay: Duration,
    config: Config,
    /// Mount points to watch, absolute; empty for every one.
    only: Vec<String>,
}

fn settings(args: &MonitorArgs) -> Result<Settings, String> {
    let config = match &args.config {
        Some(path) => config::load(path)?,
        None => {
            let path = config::config_path();
            if path.exists() {
                config::load(&path)?
            } else {
                Config::default()
            }
        }
    };
    let section = &config.monitor;
    let given = |cli: &Option<String>, file: &str| {
        cli.clone()
            .or_else(|| (!file.is_empty()).then(|| file.to_string()))
    };
    let delivery = Delivery {
        program: given(&args.program, &section.program),
        mail: given(&args.mail, &section.mail),
        mail_from: given(&args.mail_from, &section.mail_from),
        syslog: args.syslog || section.syslog,
    };
    let secs = args.delay.unwrap_or(section.delay);
    if !(secs.is_finite() && secs > 0.0 && secs <= 86_400.0) {
        return Err(format!(
            "--delay {secs}: give seconds between 0 and 86400 (md polls every {})",
            config::DEFAULT_MONITOR_DELAY
        ));
    }
    let mut only = Vec::new();
    for mp in &args.mount_points {
        let path = mounts::absolute_lexical(mp).map_err(|e| format!("{}: {e}", mp.display()))?;
        only.push(path.display().to_string());
    }
    Ok(Settings {
        delivery,
        delay: Duration::from_secs_f64(secs),
        config,
        only,
    })
}

impl Expectations for Config {
    fn spares(&self, uuid: &str) -> usize {
        uuid::Uuid::parse_str(uuid)
            .ok()
            .and_then(|u| self.find(u))
            .map_or(0, |entry| entry.spares)
    }
}

/// This pass's reports and dead mounts: of every raidfs mount, or of the
/// watched mount points only (asking just their daemons). A watched mount
/// point that is not mounted (yet, or any more) has nothing to say.
fn look(only: &[String]) -> Survey {
    if only.is_empty() {
        return status::survey();
    }
    let mut all = Survey {
        reports: Vec::new(),
        inactive: Vec::new(),
        unanswered: Vec::new(),
    };
    for mount_point in only {
        let path = std::path::Path::new(mount_point);
        match status::survey_one(path) {
            Ok(one) => {
                all.reports.extend(one.reports);
                all.inactive.extend(one.inactive);
            }
            Err(_) if status::is_raidfs_mount_point(path) => {
                all.unanswered.push(mount_point.clone())
            }
            Err(_) => {}
        }
    }
    all
}

/// What a mail says about the array of `event`.
fn detail_of(event: &Event, reports: &[ArrayReport], inactive: &[InactiveMount]) -> String {
    if let Some(r) = reports.iter().find(|r| r.mount_point == event.mount_point) {
        return detail_text(r);
    }
    inactive
        .iter()
        .find(|d| d.mount_point == event.mount_point)
        .map(status::inactive_line)
        .unwrap_or_default()
}

pub fn run(args: MonitorArgs) -> i32 {
    let settings = match settings(&args) {
        Ok(s) => s,
        Err(msg) => return super::fail(msg),
    };
    let mut notifier = Notifier::new(settings.delivery.clone());
    let mut tracker = Tracker::default();
    let mut first = true;
    loop {
        let Survey {
            reports,
            inactive,
            unanswered,
        } = look(&settings.only);
        let mut events = Vec::new();
        if first && args.test {
            events.extend(Tracker::test_messages(&reports));
        }
        events.extend(tracker.pass(&reports, &inactive, &unanswered, &settings.config));
        for event in &events {
            notifier.send(event, &detail_of(event, &reports, &inactive));
        }
        if args.oneshot {
            return 0;
        }
        first = false;
        std::thread::sleep(settings.delay);
    }
}
