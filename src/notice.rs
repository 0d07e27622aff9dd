//! Messages for the person who ran the command: things they must know while
//! it runs (a wait, a member left out), printed as `raidfs: MESSAGE` on
//! stderr. A background mount daemon has no terminal (its stderr is its log
//! file), so it installs a sink that relays these lines to the `raidfs
//! mount` process waiting in the foreground, which prints them.

use std::sync::Mutex;

/// Where messages go instead of stderr.
pub type Sink = Box<dyn FnMut(&str) + Send>;

static SINK: Mutex<Option<Sink>> = Mutex::new(None);

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
