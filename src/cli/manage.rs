//! `raidfs fail`, `remove`, `add` and `replace` on a mounted array, sent to
//! its daemon; `--wait` follows the background work they start with a
//! progress bar. Also the request/wait helpers `check` and `repair` share.

use crate::cli::status::{connect, query};
use crate::control::{ArrayReport, ControlClient, LastSyncReport, Request, SyncReport};
use crate::fuse::mounts;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

#[derive(clap::Args)]
pub struct FailArgs {
    /// The mount point.
    pub mount_point: PathBuf,
    /// The member: its path (as given to mount) or its slot number.
    pub member: String,
}

#[derive(clap::Args)]
pub struct RemoveArgs {
    /// The mount point.
    pub mount_point: PathBuf,
    /// A faulty member or a spare: its path or slot number.
    pub member: String,
}

#[derive(clap::Args)]
pub struct AddArgs {
    /// Wait for the rebuild to finish, showing its progress.
    #[arg(long)]
    pub wait: bool,
    /// Size of the image if it does not exist yet (default: what the array
    /// needs per member), e.g. 64M.
    #[arg(long, value_parser = crate::cli::create::parse_size)]
    pub size: Option<u64>,
    /// Overwrite an image that belongs to another array.
    #[arg(short, long)]
    pub force: bool,
    /// The mount point.
    pub mount_point: PathBuf,
    /// The image file, block device or NBD URI to add (an image is created
    /// sparse if missing).
    pub image: PathBuf,
}

#[derive(clap::Args)]
pub struct ReplaceArgs {
    /// Wait for the copy to finish, showing its progress.
    #[arg(long)]
    pub wait: bool,
    /// Size of the new image if it does not exist yet, e.g. 64M.
    #[arg(long, value_parser = crate::cli::create::parse_size)]
    pub size: Option<u64>,
    /// Overwrite an image that belongs to another array.
    #[arg(short, long)]
    pub force: bool,
    /// The mount point.
    pub mount_point: PathBuf,
    /// The member to replace: its path or slot number.
    pub old: String,
    /// The new image file, block device or NBD URI (an image is created
    /// sparse if missing).
    pub new: PathBuf,
}

/// A member named on the command line, as the daemon (whose working
/// directory is /) must see it: slot numbers and unknown names pass
/// unchanged, existing paths become absolute.
fn member_arg(who: &str) -> String {
    if who.parse::<usize>().is_ok() {
        return who.to_string();
    }
    match Path::new(who).canonicalize() {
        Ok(p) => p.display().to_string(),
        Err(_) => who.to_string(),
    }
}

/// An image to add, as an absolute path (it may not exist yet), or an NBD
/// URI as given.
pub(crate) fn image_arg(image: &Path) -> Result<String, String> {
    let shown = image.display();
    if crate::member::open::is_uri(image) {
        return Ok(shown.to_string());
    }
    let path = match image.canonicalize() {
        Ok(p) => p,
        Err(_) => mounts::absolute_lexical(image).map_err(|e| format!("{shown}: {e}"))?,
    };
    Ok(path.display().to_string())
}

/// Send `request`; print its message and return the report, or the refusal.
pub(crate) fn send(client: &mut ControlClient, request: &Request) -> Result<ArrayReport, String> {
    send_with(client, request, Say::Stdout)
}

/// Where a request's message goes: stdout, or stderr when stdout carries JSON.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Say {
    Stdout,
    Stderr,
}

pub(crate) fn send_with(
    client: &mut ControlClient,
    request: &Request,
    say: Say,
) -> Result<ArrayReport, String> {
    let response = client.request(request).map_err(|e| e.to_string())?;
    if !response.ok {
        return Err(response
            .error
            .unwrap_or_else(|| "refused without a reason".into()));
    }
    if let Some(message) = &response.message {
        match say {
            Say::Stdout => println!("raidfs: {message}"),
            Say::Stderr => eprintln!("raidfs: {message}"),
        }
    }
    response
        .report
        .ok_or_else(|| "the daemon sent no report".into())
}

/// Connect, send, and with `wait` follow the background work of one of
/// `actions` that the request started. Returns the exit code.
pub(crate) fn run_request(
    mount_point: &Path,
    request: Request,
    wait: bool,
    actions: &[&str],
) -> i32 {
    let outcome = connect(mount_point).and_then(|mut client| {
        let report = send(&mut client, &request)?;
        if wait {
            wait_for_background(&mut client, &report, actions)
        } else {
            Ok(())
        }
    });
    match outcome {
        Ok(()) => 0,
        Err(msg) => super::fail(msg),
    }
}

/// Show a progress bar until the running background work ends, then its
/// result: Ok when it completed, Err when it stopped or failed.
pub(crate) fn wait_for_background(
    client: &mut ControlClient,
    first: &ArrayReport,
    actions: &[&str],
) -> Result<(), String> {
    wait_for_background_until(client, first, actions, None)
}

/// Set by SIGTERM while a [`Pause`] is armed.
static TERMINATED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_sigterm(_: libc::c_int) {
    TERMINATED.store(true, Ordering::SeqCst);
}

/// When a waiting client pauses the work it follows: at a deadline, or on
/// SIGTERM (systemd stopping a scheduled check).
pub(crate) struct Pause {
    deadline: Instant,
}

impl Pause {
    /// Arm the pause: from now on SIGTERM asks for it instead of ending
    /// the client (which would leave the work running unattended).
    pub(crate) fn new(deadline: Instant) -> Pause {
        // SAFETY: the handler only stores to an atomic, which is
        // async-signal-safe.
        unsafe {
            libc::signal(libc::SIGTERM, on_sigterm as *const () as libc::sighandler_t);
        }
        Pause { deadline }
    }

    /// Why the work should pause now, if it should.
    fn due(&self) -> Option<&'static str> {
        if TERMINATED.load(Ordering::SeqCst) {
            Some("on SIGTERM")
        } else if Instant::now() >= self.deadline {
            Some("at its time limit")
        } else {
            None
        }
    }
}

/// Plain progress lines for a log (no terminal): one at every tenth of
/// the work, and at least every few minutes.
struct Lines {
    last_tenth: Option<u64>,
    last_at: Instant,
}

const LINE_EVERY: Duration = Duration::from_secs(300);

impl Lines {
    fn show(&mut self, sync: &SyncReport) {
        let tenth = sync.per_mille() / 100;
        if self.last_tenth == Some(tenth) && self.last_at.elapsed() < LINE_EVERY {
            return;
        }
        self.last_tenth = Some(tenth);
        self.last_at = Instant::now();
        println!(
            "raidfs: {} {:.1}% ({} of {} MiB, {:.1} MiB/s, eta {} s)",
            sync.action,
            sync.per_mille() as f64 / 10.0,
            sync.done >> 20,
            sync.total >> 20,
            sync.speed as f64 / (1 << 20) as f64,
            sync.eta_secs
        );
    }
}

/// [`wait_for_background`], pausing the work at `pause` (then Ok, with the
/// daemon's message saying where it will resume).
pub(crate) fn wait_for_background_until(
    client: &mut ControlClient,
    first: &ArrayReport,
    actions: &[&str],
    pause: Option<&Pause>,
) -> Result<(), String> {
    let Some(run) = followed_run(first, actions) else {
        println!("raidfs: no background work to wait for");
        return Ok(());
    };
    let terminal = std::io::stderr().is_terminal();
    // The bar starts from where the work is, so its first frame shows the
    // real position and its speed counts only what is done from here on
    // (not the work done before `--wait` started, in the first interval).
    let bar = match (&first.sync, terminal) {
        (Some(sync), true) => indicatif::ProgressBar::new(sync.total)
            .with_position(sync.done)
            .with_message(sync.action.clone()),
        _ => indicatif::ProgressBar::hidden(),
    };
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{msg:>9} [{bar:30}] {percent:>3}% {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    bar.reset_eta();
    let mut lines = Lines {
        last_tenth: None,
        last_at: Instant::now(),
    };
    let mut report = first.clone();
    while let Some(sync) = report.sync.as_ref().filter(|s| s.run == run) {
        if let Some(why) = pause.and_then(Pause::due) {
            if actions.contains(&sync.action.as_str()) {
                bar.finish_and_clear();
                let response = client.request(&Request::Stop).map_err(|e| e.to_string())?;
                return match (response.ok, response.message) {
                    (true, Some(message)) => {
                        println!("raidfs: paused {why}: {message}");
                        Ok(())
                    }
                    (true, None) => Ok(()),
                    // It ended by itself meanwhile: report how.
                    (false, _) => finish(query(client)?, run, true),
                };
            }
        }
        bar.set_message(sync.action.clone());
        bar.set_length(sync.total);
        bar.set_position(sync.done);
        if !terminal {
            lines.show(sync);
        }
        std::thread::sleep(Duration::from_millis(250));
        report = query(client)?;
    }
    bar.finish_and_clear();
    finish(report, run, pause.is_some())
}

/// The run a client that asked for one of `actions` follows: the one
/// running, or the one that already ended. Work started after it (the
/// resync that follows a recovery) is not waited for.
pub(crate) fn followed_run(first: &ArrayReport, actions: &[&str]) -> Option<u64> {
    let running = first
        .sync
        .as_ref()
        .filter(|s| actions.contains(&s.action.as_str()))
        .map(|s| s.run);
    running.or_else(|| {
        first
            .last_sync
            .as_ref()
            .filter(|l| actions.contains(&l.action.as_str()))
            .map(|l| l.run)
    })
}

/// Poll the daemon until run `run` no longer runs, calling `progress`
/// with each report of it; the last report, which holds its result (the
/// engine records it before it clears the running entry).
pub(crate) fn wait_until_run_ends(
    client: &mut ControlClient,
    first: &ArrayReport,
    run: u64,
    mut progress: impl FnMut(&crate::control::SyncReport),
) -> Result<ArrayReport, String> {
    let mut report = first.clone();
    while let Some(sync) = report.sync.as_ref().filter(|s| s.run == run) {
        progress(sync);
        std::thread::sleep(Duration::from_millis(250));
        report = query(client)?;
    }
    Ok(report)
}

/// The result of run `run` in `report`, taken after it ended: None when
/// later work ended too and its result replaced this one.
pub(crate) fn result_of(report: &ArrayReport, run: u64) -> Option<&LastSyncReport> {
    report.last_sync.as_ref().filter(|l| l.run == run)
}

/// The result of the work a waiting client followed, from the report that
/// shows it no longer running. The engine records the result before it
/// clears the running entry, so that report holds this run's result. A
/// client that pauses the work itself (`paused_ok`) takes a pause by
/// someone else (another scheduled run, `check --stop`) as its own.
fn finish(report: ArrayReport, run: u64, paused_ok: bool) -> Result<(), String> {
    if paused_ok && report.paused_scrub.is_some() {
        if let Some(last) = result_of(&report, run).filter(|l| !l.completed) {
            println!("raidfs: {}", last.message);
            return Ok(());
        }
    }
    match result_of(&report, run).cloned() {
        Some(last) if last.completed => {
            let extra = match last.action.as_str() {
                "check" | "repair" => format!(" ({} bytes mismatched)", last.mismatches),
                _ => String::new(),
            };
            println!(
                "raidfs: {}{extra}; array {} {}",
                last.message, report.state, report.map
            );
            Ok(())
        }
        Some(last) => Err(last.message),
        None => Err(format!(
            "the background work ended, and the work after it ended too before its result was read; the daemon's log has both ({})",
            report
                .last_sync
                .map(|l| l.message)
                .unwrap_or_else(|| "no result".into())
        )),
    }
}

pub fn run_fail(args: FailArgs) -> i32 {
    run_request(
        &args.mount_point,
        Request::Fail {
            member: member_arg(&args.member),
        },
        false,
        &[],
    )
}

pub fn run_remove(args: RemoveArgs) -> i32 {
    run_request(
        &args.mount_point,
        Request::Remove {
            member: member_arg(&args.member),
        },
        false,
        &[],
    )
}

pub fn run_add(args: AddArgs) -> i32 {
    let path = match image_arg(&args.image) {
        Ok(p) => p,
        Err(msg) => return super::fail(msg),
    };
    let request = Request::Add {
        path,
        size: args.size,
        force: args.force,
    };
    run_request(&args.mount_point, request, args.wait, &["recovery"])
}

pub fn run_replace(args: ReplaceArgs) -> i32 {
    let new = match image_arg(&args.new) {
        Ok(p) => p,
        Err(msg) => return super::fail(msg),
    };
    let request = Request::Replace {
        old: member_arg(&args.old),
        new,
        size: args.size,
        force: args.force,
    };
    run_request(&args.mount_point, request, args.wait, &["replace"])
}
