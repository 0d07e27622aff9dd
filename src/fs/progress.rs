//! Progress of the long offline passes (fsck's load and checks), for a
//! display the command line draws. The filesystem only says which step it
//! is in and how far it got; how that is shown (a bar on a terminal,
//! nothing in a pipe or under `--json`) is the caller's.

/// Told of each step as it starts and of the work done in it.
pub trait Progress: Sync {
    /// A step starts: what it does, and how many units it has (None: not
    /// known ahead, as the entries of a tree).
    fn step(&self, name: &'static str, total: Option<u64>);
    /// `n` more units of the current step are done.
    fn advance(&self, n: u64);
}

/// No display (a mount, a test, output that is not a terminal).
pub struct Silent;

impl Progress for Silent {
    fn step(&self, _name: &'static str, _total: Option<u64>) {}
    fn advance(&self, _n: u64) {}
}
