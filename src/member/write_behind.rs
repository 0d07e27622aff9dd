//! Write-behind for image files: the ranges a large buffered write put in
//! the page cache are handed to a thread of the member's own, which starts
//! their writeback (`sync_file_range(SYNC_FILE_RANGE_WRITE)`) while the
//! writer goes on.
//!
//! Starting writeback early spreads the disk work over a long write, so
//! the `fsync` at its end finds little left to do. Doing it on the writing
//! thread had a cost: `sync_file_range` waits whenever the disk's queue is
//! full, up to a quarter of a second under a sequential write here, and
//! that stalled the member worker and with it every full-stripe write
//! queued behind it (docs/performance.md, "How a request is served").
//! The thread takes that wait instead, and merges the ranges that piled
//! up meanwhile into one call each. Members on one device take turns
//! (one start at a time per device): five image files kicked at once on
//! this project's test machine wrote slower than the same kicks in turn,
//! which also gather larger ranges.
//!
//! Durability does not depend on any of this: only a sync makes data
//! durable, and it covers every completed write whether its writeback was
//! started or not.

use crate::handoff::{self, Receiver, Sender};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::fs::File;
use std::ops::Range;
use std::os::unix::io::AsRawFd;
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;

/// One lock per device, taken while a member on it starts writeback.
type Turn = Arc<Mutex<()>>;

/// The turn of `device`, shared by every member on it in this process.
fn turn_of(device: u64) -> Turn {
    static TURNS: OnceLock<Mutex<HashMap<u64, Turn>>> = OnceLock::new();
    let mut turns = TURNS.get_or_init(Default::default).lock();
    Arc::clone(turns.entry(device).or_default())
}

/// Starts writeback of written ranges of one file, on a thread started at
/// the first range and stopped (and waited for) when this is dropped, so
/// the file is closed, and its lock released, by the time the member is
/// gone.
pub(super) struct WriteBehind {
    file: Arc<File>,
    turn: Turn,
    kicker: OnceLock<Option<Kicker>>,
}

struct Kicker {
    ranges: Option<Sender<Range<u64>>>,
    thread: Option<JoinHandle<()>>,
}

impl WriteBehind {
    /// Write-behind for `file`, which lives on `device` (the `st_dev` of an
    /// image file's filesystem, or a block device's own number).
    pub(super) fn new(file: Arc<File>, device: u64) -> WriteBehind {
        WriteBehind {
            file,
            turn: turn_of(device),
            kicker: OnceLock::new(),
        }
    }

    /// Have the writeback of `[offset, offset + len)` started soon. Best
    /// effort: without the thread it is started here.
    pub(super) fn start(&self, offset: u64, len: u64) {
        let range = offset..offset.saturating_add(len);
        let kicker = self
            .kicker
            .get_or_init(|| Kicker::spawn(&self.file, &self.turn));
        let unsent = match kicker.as_ref().and_then(|k| k.ranges.as_ref()) {
            Some(tx) => tx.send(range).err(),
            None => Some(range),
        };
        if let Some(range) = unsent {
            start_writeback(&self.file, range);
        }
    }
}

impl Kicker {
    fn spawn(file: &Arc<File>, turn: &Turn) -> Option<Kicker> {
        let (tx, rx) = handoff::channel();
        let (file, turn) = (Arc::clone(file), Arc::clone(turn));
        let spawned = std::thread::Builder::new()
            .name("raidfs-kick".into())
            .spawn(move || kick_loop(&file, &turn, &rx));
        match spawned {
            Ok(thread) => Some(Kicker {
                ranges: Some(tx),
                thread: Some(thread),
            }),
            Err(e) => {
                log::warn!("raidfs: no write-behind thread ({e}); writeback starts inline");
                None
            }
        }
    }
}

impl Drop for Kicker {
    fn drop(&mut self) {
        // Hanging up ends the loop once the ranges already sent are started.
        self.ranges.take();
        if let Some(thread) = self.thread.take() {
            if thread.join().is_err() {
                log::error!("raidfs: the write-behind thread panicked");
            }
        }
    }
}

fn kick_loop(file: &File, turn: &Mutex<()>, ranges: &Receiver<Range<u64>>) {
    while let Some(first) = ranges.recv() {
        // Ranges that arrive while this waits for its turn join this batch.
        let _turn = turn.lock();
        let mut pending = vec![first];
        pending.extend(ranges.try_iter());
        for range in merged(pending) {
            start_writeback(file, range);
        }
    }
}

/// `ranges` sorted, with overlapping and touching ones joined.
fn merged(mut ranges: Vec<Range<u64>>) -> Vec<Range<u64>> {
    ranges.sort_by_key(|r| r.start);
    let mut out: Vec<Range<u64>> = Vec::with_capacity(ranges.len());
    for range in ranges {
        match out.last_mut() {
            Some(last) if range.start <= last.end => last.end = last.end.max(range.end),
            _ => out.push(range),
        }
    }
    out
}

/// Start writing `range` of `file` back to the disk, without waiting for
/// it. A failure would show up at the next sync anyway.
fn start_writeback(file: &File, range: Range<u64>) {
    let (Ok(at), Ok(len)) = (
        libc::off64_t::try_from(range.start),
        libc::off64_t::try_from(range.end - range.start),
    ) else {
        return;
    };
    // SAFETY: plain syscall on an open descriptor; no memory is passed.
    unsafe {
        libc::sync_file_range(file.as_raw_fd(), at, len, libc::SYNC_FILE_RANGE_WRITE);
    }
}

#[cfg(test)]
mod tests {
    use super::merged;

    #[test]
    fn touching_and_overlapping_ranges_merge_and_gaps_stay() {
        assert_eq!(
            merged(vec![8..12, 0..4, 4..6, 5..7, 20..30, 12..13]),
            vec![0..7, 8..13, 20..30]
        );
        assert!(merged(Vec::new()).is_empty());
    }
}
