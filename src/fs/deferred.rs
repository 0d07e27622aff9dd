//! Writes answered before they are done.
//!
//! A buffered writer through FUSE copies a request into the kernel's page
//! cache, then waits for the daemon's reply before it copies the next one;
//! the daemon's work on a request and the writer's copy of the next one
//! alternate on the CPUs. Answering a write once it is checked, and doing it
//! after the reply, lets the two overlap (what the page cache gives a local
//! filesystem). The bookkeeping here keeps that invisible:
//!
//! * the writes of one inode start in the order they were accepted (one
//!   queue of tickets per inode): each takes its turn, locks its byte range
//!   and allocates its blocks, then passes the turn on, so a later write
//!   over the same bytes waits for the range and wins, blocks are allocated
//!   in file order, and writes of disjoint ranges then proceed in parallel;
//! * every other operation on the inode (getattr, lookup, link, setattr,
//!   fsync, flush, release, fallocate, xattrs) first waits for the inode's
//!   queue to drain ([`Deferred::settle`]), and sync(2) and unmount wait for
//!   all; a read waits only for the writes that change what it returns,
//!   those overlapping its range or growing the file into it
//!   ([`Deferred::settle_read`]);
//! * a write that fails after its reply is reported by the next fsync or
//!   close (flush) of the inode, as the kernel reports a failed page-cache
//!   writeback, and logged when it happens;
//! * at most `limit` writes done by the threads that answered them are
//!   outstanding, so FUSE threads stay free for other requests (writes
//!   handed to the write queue, `fs::write_queue`, are bounded by its depth
//!   instead), and none is accepted unless the free space covers all
//!   outstanding ones with room to spare (ENOSPC is then reported by the
//!   write itself, done in the foreground).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::{Condvar, Mutex};

use super::FsError;

/// Free space kept beyond the bytes of outstanding writes before another
/// one is accepted: copy-on-write allocates before it frees, and the
/// journal needs room too.
pub const SPACE_MARGIN: u64 = 64 << 20;

/// The outstanding writes of one inode.
#[derive(Default)]
struct Queue {
    /// Tickets handed out; ticket `n` starts once `turn == n`.
    issued: u64,
    turn: u64,
    /// The first failure of a write since the last report.
    failure: Option<FsError>,
    /// The byte ranges of the writes not finished, by ticket.
    unfinished: Vec<(u64, std::ops::Range<u64>)>,
}

impl Queue {
    fn idle(&self) -> bool {
        self.unfinished.is_empty()
    }

    /// Whether a write not finished could change what a read of `range`
    /// returns from a file `size` bytes long: it overlaps the range, or the
    /// range reaches past `size` and the write ends past it (the file grows
    /// into the range).
    fn seen_by(&self, range: &std::ops::Range<u64>, size: u64) -> bool {
        self.unfinished.iter().any(|(_, w)| {
            (w.start < range.end && range.start < w.end) || (range.end > size && w.end > size)
        })
    }
}

#[derive(Default)]
struct State {
    queues: HashMap<u64, Queue>,
    /// Bytes of accepted writes not yet finished.
    bytes: u64,
    /// Inodes whose latest request was a write ([`Deferred::continue_streak`]).
    streaks: HashSet<u64>,
}

/// Inodes remembered in a streak of writes at most; past it the memory is
/// cleared (a streak then starts again, which costs one write done first).
const MAX_STREAKS: usize = 1 << 16;

pub struct Deferred {
    limit: usize,
    /// Writes accepted and not finished: the fast path of [`Deferred::settle`].
    outstanding: AtomicUsize,
    /// Those of them done by the thread that answered them, held to `limit`.
    in_threads: AtomicUsize,
    /// Entries of `State::streaks`: the fast path of [`Deferred::settle`].
    streaking: AtomicUsize,
    state: Mutex<State>,
    changed: Condvar,
}

/// The right (and duty) to run one accepted write. Dropping it unused
/// counts the write as failed, so the writes queued behind it still run.
pub struct Ticket {
    deferred: Arc<Deferred>,
    ino: u64,
    seq: u64,
    /// Counted in `in_threads` (not handed to the write queue).
    in_thread: bool,
    turn_passed: std::cell::Cell<bool>,
    done: bool,
}

impl Deferred {
    /// `limit` 0 turns deferral off: every write is done before its reply.
    pub fn new(limit: usize) -> Arc<Deferred> {
        Arc::new(Deferred {
            limit,
            outstanding: AtomicUsize::new(0),
            in_threads: AtomicUsize::new(0),
            streaking: AtomicUsize::new(0),
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
        })
    }

    /// Accept a write of `range` of `ino` that the answering thread does
    /// itself, or None when it must be done in the foreground: deferral
    /// off, `limit` such writes outstanding, or `has_room` says the free
    /// space is short of the bytes needed (the outstanding ones, these, and
    /// [`SPACE_MARGIN`]).
    pub fn try_accept(
        self: &Arc<Self>,
        ino: u64,
        range: std::ops::Range<u64>,
        has_room: impl FnOnce(u64) -> bool,
    ) -> Option<Ticket> {
        if self.in_threads.load(Ordering::SeqCst) >= self.limit {
            return None;
        }
        self.accept(ino, range, true, has_room)
    }

    /// Accept a write of `range` of `ino` for the write queue, which bounds
    /// their number itself: None when deferral is off or the free space is
    /// short, as for [`Deferred::try_accept`].
    pub fn try_accept_queued(
        self: &Arc<Self>,
        ino: u64,
        range: std::ops::Range<u64>,
        has_room: impl FnOnce(u64) -> bool,
    ) -> Option<Ticket> {
        if self.limit == 0 {
            return None;
        }
        self.accept(ino, range, false, has_room)
    }

    fn accept(
        self: &Arc<Self>,
        ino: u64,
        range: std::ops::Range<u64>,
        in_thread: bool,
        has_room: impl FnOnce(u64) -> bool,
    ) -> Option<Ticket> {
        let bytes = range.end.saturating_sub(range.start);
        let mut st = self.state.lock();
        let needed = st.bytes.saturating_add(bytes).saturating_add(SPACE_MARGIN);
        if (in_thread && self.in_threads.load(Ordering::SeqCst) >= self.limit) || !has_room(needed)
        {
            return None;
        }
        st.bytes += bytes;
        let queue = st.queues.entry(ino).or_default();
        let seq = queue.issued;
        queue.issued += 1;
        queue.unfinished.push((seq, range));
        self.outstanding.fetch_add(1, Ordering::SeqCst);
        if in_thread {
            self.in_threads.fetch_add(1, Ordering::SeqCst);
        }
        Some(Ticket {
            deferred: Arc::clone(self),
            ino,
            seq,
            in_thread,
            turn_passed: std::cell::Cell::new(false),
            done: false,
        })
    }

    /// Record that a write of `ino` arrived, and say whether the inode's
    /// previous request was a write too (one that [`Deferred::settle`] did
    /// not follow). Queueing a write is worth its hand-off only inside such
    /// a streak: a file created, written once and closed would pay a wake-up
    /// of the queue's thread and a wait for it at close, instead of one
    /// write done at once.
    pub fn continue_streak(&self, ino: u64) -> bool {
        let mut st = self.state.lock();
        if st.streaks.contains(&ino) {
            return true;
        }
        if st.streaks.len() >= MAX_STREAKS {
            st.streaks.clear();
        }
        st.streaks.insert(ino);
        self.streaking.store(st.streaks.len(), Ordering::SeqCst);
        false
    }

    /// Wait until every accepted write of `ino` has finished, for a request
    /// other than a write: it ends the inode's streak of writes.
    pub fn settle(&self, ino: u64) {
        self.settle_ending_streak(ino, true);
    }

    /// Wait, for a read of `range` of `ino`, a file `size()` bytes long
    /// without the writes not yet finished, until none of those it could
    /// see is left: one overlapping the range, or one growing the file into
    /// it. The others go on beside the read, as another caller's writes of
    /// other bytes would: what the read returns is what it would return
    /// after them. A caller that writes a file here and reads it there (a
    /// database, `fio --rw=randrw`) thus never waits for the write queue's
    /// thread to reach its writes, and only a read that did wait ends the
    /// inode's streak of writes (one that reads back what it just wrote
    /// gains nothing from writes answered before they are done). `size` is
    /// asked for only while the inode has writes not finished, and without
    /// this lock held.
    pub fn settle_read(&self, ino: u64, range: std::ops::Range<u64>, size: impl FnOnce() -> u64) {
        if !self.is_pending(ino) {
            return;
        }
        let size = size();
        let mut st = self.state.lock();
        if !st.queues.get(&ino).is_some_and(|q| q.seen_by(&range, size)) {
            return;
        }
        if st.streaks.remove(&ino) {
            self.streaking.store(st.streaks.len(), Ordering::SeqCst);
        }
        while st.queues.get(&ino).is_some_and(|q| q.seen_by(&range, size)) {
            self.changed.wait(&mut st);
        }
    }

    /// Wait until every accepted write of `ino` has finished, for a write
    /// done before its answer (which continues the inode's streak).
    pub fn settle_for_write(&self, ino: u64) {
        self.settle_ending_streak(ino, false);
    }

    fn settle_ending_streak(&self, ino: u64, end_streak: bool) {
        let streaks = end_streak && self.streaking.load(Ordering::SeqCst) != 0;
        if self.outstanding.load(Ordering::SeqCst) == 0 && !streaks {
            return;
        }
        let mut st = self.state.lock();
        if streaks && st.streaks.remove(&ino) {
            self.streaking.store(st.streaks.len(), Ordering::SeqCst);
        }
        while st.queues.get(&ino).is_some_and(|q| !q.idle()) {
            self.changed.wait(&mut st);
        }
    }

    /// Wait until every accepted write has finished.
    pub fn settle_all(&self) {
        if self.outstanding.load(Ordering::SeqCst) == 0 {
            return;
        }
        let mut st = self.state.lock();
        while self.outstanding.load(Ordering::SeqCst) > 0 {
            self.changed.wait(&mut st);
        }
    }

    /// Wait for `ino`'s writes, then report (once) the failure of any of
    /// them not yet reported.
    pub fn settle_and_report(&self, ino: u64) -> Result<(), FsError> {
        self.settle(ino);
        let mut st = self.state.lock();
        let Some(queue) = st.queues.get_mut(&ino) else {
            return Ok(());
        };
        let failure = queue.failure.take();
        if queue.idle() {
            st.queues.remove(&ino);
        }
        failure.map_or(Ok(()), Err)
    }

    /// Whether `ino` has writes accepted and not finished.
    pub fn is_pending(&self, ino: u64) -> bool {
        self.outstanding.load(Ordering::SeqCst) != 0
            && self
                .state
                .lock()
                .queues
                .get(&ino)
                .is_some_and(|q| !q.idle())
    }

    fn wait_turn(&self, ino: u64, seq: u64) {
        let mut st = self.state.lock();
        while st.queues.get(&ino).is_some_and(|q| q.turn < seq) {
            self.changed.wait(&mut st);
        }
    }

    fn pass_turn(&self, ino: u64) {
        let mut st = self.state.lock();
        if let Some(queue) = st.queues.get_mut(&ino) {
            queue.turn += 1;
        }
        self.changed.notify_all();
    }

    fn finish(&self, ino: u64, seq: u64, in_thread: bool, failure: Option<FsError>) {
        let mut st = self.state.lock();
        let mut freed = 0;
        if let Some(queue) = st.queues.get_mut(&ino) {
            // The write's bytes leave the outstanding count with its range.
            if let Some(i) = queue.unfinished.iter().position(|(s, _)| *s == seq) {
                let (_, range) = queue.unfinished.swap_remove(i);
                freed = range.end.saturating_sub(range.start);
            }
            if queue.failure.is_none() {
                queue.failure = failure;
            }
            if queue.idle() && queue.failure.is_none() {
                st.queues.remove(&ino);
            }
        }
        st.bytes = st.bytes.saturating_sub(freed);
        if in_thread {
            self.in_threads.fetch_sub(1, Ordering::SeqCst);
        }
        self.outstanding.fetch_sub(1, Ordering::SeqCst);
        self.changed.notify_all();
    }
}

impl Ticket {
    pub fn ino(&self) -> u64 {
        self.ino
    }

    fn pass_turn(&self) {
        if !self.turn_passed.replace(true) {
            self.deferred.pass_turn(self.ino);
        }
    }

    /// Wait for the writes accepted before this one on the same inode to
    /// pass their turn, run `write`, and record its failure for the next
    /// fsync or close. `write` gets the call that passes the turn on, to
    /// make once what must happen in order is done (it is passed at the end
    /// otherwise).
    pub fn run<T>(mut self, write: impl FnOnce(&dyn Fn()) -> Result<T, FsError>) -> Option<T> {
        self.deferred.wait_turn(self.ino, self.seq);
        let result = write(&|| self.pass_turn());
        self.pass_turn();
        self.done = true;
        match result {
            Ok(value) => {
                self.deferred
                    .finish(self.ino, self.seq, self.in_thread, None);
                Some(value)
            }
            Err(err) => {
                log::error!(
                    "a write to inode {} failed after it was answered (reported at the next fsync or close): {err}",
                    self.ino
                );
                self.deferred
                    .finish(self.ino, self.seq, self.in_thread, Some(err));
                None
            }
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if !self.done {
            self.pass_turn();
            self.deferred.finish(
                self.ino,
                self.seq,
                self.in_thread,
                Some(FsError::Invalid("an accepted write was abandoned")),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::thread;

    fn plenty(_needed: u64) -> bool {
        true
    }

    fn free(bytes: u64) -> impl FnOnce(u64) -> bool {
        move |needed| needed <= bytes
    }

    #[test]
    fn writes_of_one_inode_run_in_the_order_they_were_accepted() {
        let deferred = Deferred::new(8);
        let tickets: Vec<Ticket> = (0..4)
            .map(|_| deferred.try_accept(7, 0..10, plenty).unwrap())
            .collect();
        let order = Arc::new(Mutex::new(Vec::new()));
        // Start them newest first: each must still wait for its elders.
        let handles: Vec<_> = tickets
            .into_iter()
            .enumerate()
            .rev()
            .map(|(i, ticket)| {
                let order = Arc::clone(&order);
                thread::spawn(move || {
                    ticket.run(|pass_turn| {
                        order.lock().push(i);
                        pass_turn();
                        Ok::<_, FsError>(())
                    })
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        assert_eq!(*order.lock(), vec![0, 1, 2, 3]);
        deferred.settle(7);
        assert!(!deferred.is_pending(7));
    }

    #[test]
    fn a_write_that_passed_its_turn_lets_the_next_start_before_it_ends() {
        let deferred = Deferred::new(8);
        let first = deferred.try_accept(5, 0..10, plenty).unwrap();
        let second = deferred.try_accept(5, 0..10, plenty).unwrap();
        let (started_tx, started_rx) = mpsc::channel::<()>();
        let slow = thread::spawn(move || {
            first.run(|pass_turn| {
                pass_turn();
                // Ends only once the second write has started.
                started_rx.recv().unwrap();
                Ok::<_, FsError>(())
            })
        });
        second.run(|_| {
            started_tx.send(()).unwrap();
            Ok::<_, FsError>(())
        });
        slow.join().unwrap();
        deferred.settle(5);
        assert!(!deferred.is_pending(5));
    }

    #[test]
    fn settle_waits_for_the_inodes_writes_only() {
        let deferred = Deferred::new(8);
        let ticket = deferred.try_accept(1, 0..10, plenty).unwrap();
        let (release_tx, release_rx) = mpsc::channel::<()>();
        let writer = thread::spawn(move || {
            ticket.run(|_| {
                release_rx.recv().unwrap();
                Ok::<_, FsError>(())
            })
        });
        // Another inode is not held up.
        deferred.settle(2);
        assert!(deferred.is_pending(1));
        let (settled_tx, settled_rx) = mpsc::channel();
        let d = Arc::clone(&deferred);
        let waiter = thread::spawn(move || {
            d.settle(1);
            settled_tx.send(()).unwrap();
        });
        assert!(settled_rx.try_recv().is_err());
        release_tx.send(()).unwrap();
        settled_rx.recv().unwrap();
        assert!(!deferred.is_pending(1));
        writer.join().unwrap();
        waiter.join().unwrap();
    }

    #[test]
    fn a_read_sees_writes_that_overlap_it_or_grow_the_file_into_it() {
        let queue = Queue {
            unfinished: vec![(0, 100..110), (1, 300..310)],
            ..Queue::default()
        };
        // The file is 200 bytes long without the writes.
        assert!(queue.seen_by(&(105..106), 200));
        assert!(queue.seen_by(&(0..101), 200));
        assert!(!queue.seen_by(&(0..100), 200));
        assert!(!queue.seen_by(&(110..200), 200));
        // Past the end the read sees how far the second write grows the file.
        assert!(queue.seen_by(&(150..250), 200));
        assert!(!queue.seen_by(&(150..250), 400));
        assert!(!Queue::default().seen_by(&(0..u64::MAX), 0));
    }

    #[test]
    fn a_read_waits_only_for_the_writes_it_could_see_and_only_a_wait_ends_the_streak() {
        let deferred = Deferred::new(8);
        assert!(!deferred.continue_streak(1));
        let low = deferred.try_accept(1, 0..10, plenty).unwrap();
        let high = deferred.try_accept(1, 100..110, plenty).unwrap();
        // Bytes neither write touches, in a file 50 bytes long without
        // them: the read goes ahead of both (it would wait forever here
        // otherwise), and the writes go on being a streak.
        deferred.settle_read(1, 20..40, || 50);
        assert!(deferred.continue_streak(1));
        // A read of bytes the first write changes ends the streak and
        // returns after that write has finished. The write finishes only
        // once the read has found it (the streak is over then).
        let written = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let reader = {
            let (d, written) = (Arc::clone(&deferred), Arc::clone(&written));
            thread::spawn(move || {
                d.settle_read(1, 5..15, || 50);
                written.load(Ordering::SeqCst)
            })
        };
        low.run(|_| {
            while deferred.state.lock().streaks.contains(&1) {
                thread::yield_now();
            }
            written.store(true, Ordering::SeqCst);
            Ok::<_, FsError>(())
        });
        assert!(
            reader.join().unwrap(),
            "the read returned before the write it overlaps finished"
        );
        // It waited, so the streak is over; the second write is still out.
        assert!(!deferred.continue_streak(1));
        assert!(deferred.is_pending(1));
        high.run(|_| Ok::<_, FsError>(()));
        assert!(!deferred.is_pending(1));
    }

    #[test]
    fn a_failure_is_reported_once_and_later_writes_still_run() {
        let deferred = Deferred::new(8);
        let failing = deferred.try_accept(3, 0..10, plenty).unwrap();
        let next = deferred.try_accept(3, 0..10, plenty).unwrap();
        assert!(failing.run(|_| Err::<(), _>(FsError::NoSpace)).is_none());
        assert_eq!(next.run(|_| Ok::<_, FsError>(5)), Some(5));
        assert!(matches!(
            deferred.settle_and_report(3),
            Err(FsError::NoSpace)
        ));
        assert!(deferred.settle_and_report(3).is_ok());
    }

    #[test]
    fn an_abandoned_ticket_counts_as_failed_and_unblocks_the_queue() {
        let deferred = Deferred::new(8);
        let abandoned = deferred.try_accept(4, 0..10, plenty).unwrap();
        let next = deferred.try_accept(4, 0..10, plenty).unwrap();
        drop(abandoned);
        assert_eq!(next.run(|_| Ok::<_, FsError>(1)), Some(1));
        assert!(deferred.settle_and_report(4).is_err());
        deferred.settle_all();
    }

    #[test]
    fn acceptance_stops_at_the_limit_and_without_free_space() {
        let deferred = Deferred::new(2);
        let a = deferred.try_accept(1, 0..10, plenty).unwrap();
        let b = deferred.try_accept(2, 0..10, plenty).unwrap();
        assert!(deferred.try_accept(3, 0..10, plenty).is_none());
        a.run(|_| Ok::<_, FsError>(()));
        // 10 bytes of b are still outstanding.
        assert!(deferred
            .try_accept(3, 0..10, free(SPACE_MARGIN + 19))
            .is_none());
        let c = deferred
            .try_accept(3, 0..10, free(SPACE_MARGIN + 20))
            .unwrap();
        b.run(|_| Ok::<_, FsError>(()));
        c.run(|_| Ok::<_, FsError>(()));
        deferred.settle_all();
        assert!(Deferred::new(0).try_accept(1, 0..1, plenty).is_none());
    }

    #[test]
    fn a_streak_is_writes_with_nothing_else_between() {
        let deferred = Deferred::new(2);
        assert!(!deferred.continue_streak(1), "the first write starts it");
        assert!(deferred.continue_streak(1));
        assert!(!deferred.continue_streak(2), "each inode has its own");
        deferred.settle_for_write(1);
        assert!(deferred.continue_streak(1), "a write continues it");
        deferred.settle(1);
        assert!(!deferred.continue_streak(1), "anything else ends it");
        assert!(deferred.continue_streak(2));
    }

    #[test]
    fn queued_writes_do_not_count_against_the_limit_but_obey_off_and_free_space() {
        let deferred = Deferred::new(1);
        let queued: Vec<Ticket> = (0..5)
            .map(|_| deferred.try_accept_queued(1, 0..10, plenty).unwrap())
            .collect();
        // The queued ones leave the one write done by its thread its room...
        let threaded = deferred.try_accept(1, 0..10, plenty).unwrap();
        assert!(deferred.try_accept(2, 0..10, plenty).is_none());
        // ...but their bytes count against the free space.
        assert!(deferred
            .try_accept_queued(2, 0..10, free(SPACE_MARGIN + 69))
            .is_none());
        for ticket in queued {
            ticket.run(|_| Ok::<_, FsError>(()));
        }
        threaded.run(|_| Ok::<_, FsError>(()));
        assert!(deferred.try_accept(2, 0..10, plenty).is_some());
        deferred.settle_all();
        assert!(Deferred::new(0)
            .try_accept_queued(1, 0..1, plenty)
            .is_none());
    }
}
