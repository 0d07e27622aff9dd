//! Cumulative I/O counters per member slot: operations, bytes and the time
//! spent in them, for each direction, as `raidfs iostat` and the metrics
//! show them (iostat's r/s, rkB/s and r_await come from differences of
//! these, as /proc/diskstats' fields do).
//!
//! The worker pool counts every data read and write it performs on a
//! slot's member (inline or on a worker; a replacement's copies are not
//! the slot's and are not counted). Superblock, bitmap and PPL updates go
//! to members directly and are not counted. The counters are relaxed
//! atomics: a reader may see an operation's count before its bytes, which
//! rates over an interval do not notice.

use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Which way an operation moved data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    Read,
    Write,
}

#[derive(Default)]
struct Way {
    ops: AtomicU64,
    bytes: AtomicU64,
    nanos: AtomicU64,
}

/// One slot's counters (whatever member serves the slot).
#[derive(Default)]
pub(crate) struct IoCounters {
    read: Way,
    write: Way,
}

impl IoCounters {
    pub fn record(&self, dir: Direction, bytes: u64, elapsed: Duration) {
        let way = match dir {
            Direction::Read => &self.read,
            Direction::Write => &self.write,
        };
        way.ops.fetch_add(1, Ordering::Relaxed);
        way.bytes.fetch_add(bytes, Ordering::Relaxed);
        way.nanos.fetch_add(
            u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }

    pub fn snapshot(&self, slot: usize) -> MemberIo {
        MemberIo {
            slot,
            read_ops: self.read.ops.load(Ordering::Relaxed),
            read_bytes: self.read.bytes.load(Ordering::Relaxed),
            read_nanos: self.read.nanos.load(Ordering::Relaxed),
            write_ops: self.write.ops.load(Ordering::Relaxed),
            write_bytes: self.write.bytes.load(Ordering::Relaxed),
            write_nanos: self.write.nanos.load(Ordering::Relaxed),
        }
    }
}

/// A slot's counters at one moment, since the array was assembled.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberIo {
    pub slot: usize,
    pub read_ops: u64,
    pub read_bytes: u64,
    /// Time spent in completed reads, nanoseconds (summed over reads that
    /// ran at once, as /proc/diskstats' "time spent reading").
    pub read_nanos: u64,
    pub write_ops: u64,
    pub write_bytes: u64,
    pub write_nanos: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_direction_counts_apart() {
        let c = IoCounters::default();
        c.record(Direction::Read, 4096, Duration::from_micros(10));
        c.record(Direction::Read, 8192, Duration::from_micros(30));
        c.record(Direction::Write, 512, Duration::from_nanos(7));
        assert_eq!(
            c.snapshot(3),
            MemberIo {
                slot: 3,
                read_ops: 2,
                read_bytes: 12288,
                read_nanos: 40_000,
                write_ops: 1,
                write_bytes: 512,
                write_nanos: 7,
            }
        );
    }
}
