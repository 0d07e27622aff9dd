//! Messages for the person who ran the command: things they must know while
//! it runs (a wait, a member left out), printed as `raidfs: MESSAGE` on
//! stderr. A background mount daemon has no terminal (its stderr is its log
//! file), so it installs a sink that relays these lines to the `raidfs
//! mount` process waiting in the foreground, which prints them.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// Where messages go instead of stderr.
pub type Sink = Box<dyn FnMut(&str) + Send>;

static SINK: Mutex<Option<Sink>> = Mutex::new(None);
static QUIET: AtomicBool = AtomicBool::new(false);

/// Tell the user `msg` (one line, without the `raidfs: ` prefix).
pub fn tell(msg: &str) {
    let mut sink = SINK.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    match sink.as_mut() {
        Some(sink) => sink(msg),
        None => eprintln!("raidfs: {msg}"),
    }
}

/// Send later messages to `sink` (`None`: back to stderr).
pub fn set_sink(sink: Option<Sink>) {
    *SINK.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = sink;
}

/// Tell the user about a wait under way, unless they asked for quiet (a
/// mount helper run by mount(8), whose output scripts compare); then it
/// goes to the log only.
pub fn progress(msg: &str) {
    if QUIET.load(Ordering::Acquire) {
        log::info!("{msg}");
    } else {
        tell(msg);
    }
}

/// Whether [`progress`] messages are kept from the terminal (set before a
/// mount daemon forks, so the daemon keeps it).
pub fn set_quiet(quiet: bool) {
    QUIET.store(quiet, Ordering::Release);
}
