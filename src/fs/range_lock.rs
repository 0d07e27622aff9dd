//! Per-file block-range locks. A write holds only the blocks it covers, so
//! writes of disjoint parts of one file run their data I/O in parallel (the
//! kernel's writeback sends several WRITEs of one file at once, and
//! O_DIRECT writers may too); truncate, fallocate, heal and scrub hold the
//! whole file.

use parking_lot::{Condvar, Mutex};

/// A held range: inode and block-aligned byte range `[start, end)`.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Held {
    ino: u64,
    start: u64,
    end: u64,
}

impl Held {
    fn overlaps(&self, other: &Held) -> bool {
        self.ino == other.ino && self.start < other.end && other.start < self.end
    }
}

#[derive(Default)]
pub struct RangeLocks {
    /// Few ranges are held at once (one per request in flight), so a list
    /// scanned on each lock is enough.
    held: Mutex<Vec<Held>>,
    released: Condvar,
}

/// Holds a range until dropped.
pub struct RangeGuard<'a> {
    locks: &'a RangeLocks,
    range: Held,
}

impl RangeLocks {
    /// Wait until no holder overlaps `[start, end)` of `ino`, then hold it.
    pub fn lock(&self, ino: u64, start: u64, end: u64) -> RangeGuard<'_> {
        let range = Held {
            ino,
            start,
            end: end.max(start + 1),
        };
        let mut held = self.held.lock();
        while held.iter().any(|h| h.overlaps(&range)) {
            self.released.wait(&mut held);
        }
        held.push(range);
        RangeGuard { locks: self, range }
    }

    /// Hold the whole file.
    pub fn lock_file(&self, ino: u64) -> RangeGuard<'_> {
        self.lock(ino, 0, u64::MAX)
    }
}

impl Drop for RangeGuard<'_> {
    fn drop(&mut self) {
        let mut held = self.locks.held.lock();
        if let Some(i) = held.iter().position(|h| *h == self.range) {
            held.swap_remove(i);
        }
        drop(held);
        self.locks.released.notify_all();
    }
}

#[cfg(test)]
impl RangeLocks {
    fn try_lock(&self, ino: u64, start: u64, end: u64) -> Option<RangeGuard<'_>> {
        let range = Held { ino, start, end };
        let mut held = self.held.lock();
        if held.iter().any(|h| h.overlaps(&range)) {
            return None;
        }
        held.push(range);
        Some(RangeGuard { locks: self, range })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn only_overlapping_ranges_of_the_same_file_conflict() {
        let locks = RangeLocks::default();
        let a = locks.lock(1, 0, 8192);
        assert!(locks.try_lock(1, 4096, 12288).is_none());
        assert!(locks.try_lock(1, 0, u64::MAX).is_none());
        let b = locks.try_lock(1, 8192, 16384);
        assert!(b.is_some());
        assert!(locks.try_lock(2, 0, u64::MAX).is_some());
        drop(a);
        assert!(locks.try_lock(1, 0, 8192).is_some());
        drop(b);
        assert!(locks.held.lock().is_empty());
    }

    #[test]
    fn a_waiter_gets_the_range_when_the_holder_lets_go() {
        let locks = Arc::new(RangeLocks::default());
        let first = locks.lock(7, 0, 8192);
        let waiter = {
            let locks = Arc::clone(&locks);
            std::thread::spawn(move || {
                let _whole = locks.lock_file(7);
            })
        };
        drop(first);
        waiter.join().unwrap();
        assert!(locks.held.lock().is_empty());
    }
}
