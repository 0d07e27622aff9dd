//! Per-member I/O workers, so that an operation touching several members
//! drives them all at once instead of one after another.
//!
//! Each slot has a lane: its member, a small pool of threads fed by one
//! channel, and optionally a replacement member that receives a copy of
//! every write (so `replace` can rebuild onto it while the old member stays
//! in service). A batch of jobs is submitted together and the caller waits
//! for every reply; a batch with a single job runs inline on the caller's
//! thread, since a hand-off would only add latency, and so do writes that
//! only copy into a cache (see [`Member::cached_writes`]). Lanes can be attached and
//! detached while the array runs (add, remove, replace).

use super::iostat::{Direction, IoCounters, MemberIo};
use crate::handoff::{self, Receiver, Sender};
use crate::member::Member;
use parking_lot::{Mutex, RwLock};
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

/// One member operation. Buffers are owned so a worker never borrows from
/// the caller's stack.
pub enum Op {
    Read {
        offset: u64,
        len: usize,
    },
    /// A read into a buffer the caller lends (and gets back in the
    /// outcome), so a long-running loop allocates nothing per request.
    ReadInto {
        offset: u64,
        buf: Vec<u8>,
    },
    Write {
        offset: u64,
        data: Arc<[u8]>,
        range: std::ops::Range<usize>,
    },
    /// A write that is durable when it returns (see `Member::write_durable`).
    WriteDurable {
        offset: u64,
        data: Arc<[u8]>,
    },
    Sync,
    /// Give a range back to the member's host (see `Member::discard`).
    Discard {
        offset: u64,
        len: u64,
    },
}

impl Op {
    pub(crate) fn duplicate(&self) -> Option<Op> {
        match self {
            Op::Read { .. } | Op::ReadInto { .. } => None,
            Op::Write {
                offset,
                data,
                range,
            } => Some(Op::Write {
                offset: *offset,
                data: Arc::clone(data),
                range: range.clone(),
            }),
            Op::WriteDurable { offset, data } => Some(Op::WriteDurable {
                offset: *offset,
                data: Arc::clone(data),
            }),
            Op::Sync => Some(Op::Sync),
            Op::Discard { offset, len } => Some(Op::Discard {
                offset: *offset,
                len: *len,
            }),
        }
    }

    /// Whether the op changes the member, so the next flush must sync it.
    fn changes_member(&self) -> bool {
        matches!(self, Op::Write { .. } | Op::Discard { .. })
    }
}

/// What came back from one job.
pub type Outcome = io::Result<Vec<u8>>;

struct Job {
    tag: usize,
    op: Op,
    reply: Sender<(usize, Outcome)>,
}

struct Queue {
    member: Arc<dyn Member>,
    tx: Sender<Job>,
}

#[derive(Default)]
struct Lane {
    main: Option<Queue>,
    replacement: Option<Queue>,
}

pub struct WorkerPool {
    lanes: RwLock<Vec<Lane>>,
    threads_per_member: usize,
    threads: Mutex<Vec<JoinHandle<()>>>,
    /// Set when a write to a replacement failed; the replace is abandoned.
    replacement_failed: Vec<AtomicBool>,
    /// Per slot, so a flush can skip members nothing was written to.
    sync_marks: Vec<SyncMark>,
    /// Where the next inline write batch starts (see [`WorkerPool::write_inline`]).
    inline_rotor: AtomicUsize,
    /// Operations, bytes and time per slot (see [`super::iostat`]).
    io: Arc<[IoCounters]>,
    /// When the counters started.
    io_since: Instant,
}

/// Counts completed writes to one slot (main member and replacement) and
/// remembers how many of them the last finished sync covered.
#[derive(Default)]
struct SyncMark {
    written: AtomicU64,
    synced: AtomicU64,
}

/// What a flush must sync on one slot: `Some(writes)` when writes completed
/// since the last finished sync (the count to record once this one is done).
pub struct SyncTicket(Option<u64>);

impl SyncTicket {
    pub fn needed(&self) -> bool {
        self.0.is_some()
    }
}

impl Op {
    /// The direction and bytes a data read or write moves; None for others.
    fn data_moved(&self) -> Option<(Direction, u64)> {
        match self {
            Op::Read { len, .. } => Some((Direction::Read, *len as u64)),
            Op::ReadInto { buf, .. } => Some((Direction::Read, buf.len() as u64)),
            Op::Write { range, .. } => Some((Direction::Write, range.len() as u64)),
            Op::WriteDurable { data, .. } => Some((Direction::Write, data.len() as u64)),
            Op::Sync | Op::Discard { .. } => None,
        }
    }
}

/// Run `op` on `member`, counting it in `io` (a slot's counters; None for
/// a replacement's copies) when it moves data.
fn perform(member: &dyn Member, op: Op, io: Option<&IoCounters>) -> Outcome {
    let Some((io, (dir, bytes))) = io.zip(op.data_moved()) else {
        return perform_op(member, op);
    };
    let started = Instant::now();
    let outcome = perform_op(member, op);
    io.record(dir, bytes, started.elapsed());
    outcome
}

fn perform_op(member: &dyn Member, op: Op) -> Outcome {
    match op {
        Op::Read { offset, len } => {
            let mut buf = vec![0u8; len];
            member.read_at(&mut buf, offset)?;
            Ok(buf)
        }
        Op::ReadInto { offset, mut buf } => {
            member.read_at(&mut buf, offset)?;
            Ok(buf)
        }
        Op::Write {
            offset,
            data,
            range,
        } => {
            member.write_at(&data[range], offset)?;
            Ok(Vec::new())
        }
        Op::WriteDurable { offset, data } => {
            member.write_durable(&data, offset)?;
            Ok(Vec::new())
        }
        Op::Sync => {
            member.sync()?;
            Ok(Vec::new())
        }
        Op::Discard { offset, len } => {
            member.discard(offset, len)?;
            Ok(Vec::new())
        }
    }
}

fn missing(slot: usize) -> io::Error {
    io::Error::new(
        io::ErrorKind::NotConnected,
        format!("member slot {slot} is not present"),
    )
}

/// Tags at or above this mark the replacement copy of a job.
const REPLACEMENT_TAG: usize = usize::MAX / 2;

impl WorkerPool {
    /// Start `threads_per_member` workers for every present member.
    pub fn new(
        members: &[Option<Arc<dyn Member>>],
        threads_per_member: usize,
    ) -> io::Result<WorkerPool> {
        // Room for every slot an array may have: one added while the array
        // runs (`raidfs grow --add`) gets its lane with `attach`.
        let room = crate::superblock::MAX_MEMBERS.max(members.len());
        let pool = WorkerPool {
            lanes: RwLock::new((0..room).map(|_| Lane::default()).collect()),
            threads_per_member: threads_per_member.max(1),
            threads: Mutex::new(Vec::new()),
            replacement_failed: (0..room).map(|_| AtomicBool::new(false)).collect(),
            inline_rotor: AtomicUsize::new(0),
            io: (0..room).map(|_| IoCounters::default()).collect(),
            io_since: Instant::now(),
            // One write counted from the start: the first flush syncs
            // everything, whatever happened before this pool existed.
            sync_marks: (0..room)
                .map(|_| SyncMark {
                    written: AtomicU64::new(1),
                    synced: AtomicU64::new(0),
                })
                .collect(),
        };
        for (slot, member) in members.iter().enumerate() {
            if let Some(m) = member {
                pool.attach(slot, Arc::clone(m))?;
            }
        }
        Ok(pool)
    }

    fn start_queue(&self, slot: usize, member: Arc<dyn Member>, tag: &str) -> io::Result<Queue> {
        let (tx, rx) = handoff::channel::<Job>();
        let mut threads = self.threads.lock();
        // Only the main member's operations are the slot's.
        let counted = tag == "m";
        for n in 0..self.threads_per_member {
            let rx = rx.clone();
            let member = Arc::clone(&member);
            let io = Arc::clone(&self.io);
            let handle = std::thread::Builder::new()
                .name(format!("raidfs-{tag}{slot}-{n}"))
                .spawn(move || {
                    let io = io.get(slot).filter(|_| counted);
                    for job in rx.iter() {
                        let outcome = perform(member.as_ref(), job.op, io);
                        // The submitter may have given up; nothing to do then.
                        let _ = job.reply.send((job.tag, outcome));
                    }
                })?;
            threads.push(handle);
        }
        Ok(Queue { member, tx })
    }

    /// Serve `slot` with `member` (replacing whatever served it).
    pub fn attach(&self, slot: usize, member: Arc<dyn Member>) -> io::Result<()> {
        let queue = self.start_queue(slot, member, "m")?;
        self.lanes.write()[slot].main = Some(queue);
        // Whatever the new member went through before, the next flush syncs it.
        self.note_written(slot);
        Ok(())
    }

    /// Stop serving `slot`; its workers finish queued jobs and exit.
    pub fn detach(&self, slot: usize) {
        let mut lanes = self.lanes.write();
        lanes[slot].main = None;
        lanes[slot].replacement = None;
    }

    /// Copy every write to `slot` onto `member` too (None ends that).
    pub fn set_replacement(&self, slot: usize, member: Option<Arc<dyn Member>>) -> io::Result<()> {
        let queue = match member {
            Some(m) => Some(self.start_queue(slot, m, "r")?),
            None => None,
        };
        self.replacement_failed[slot].store(false, Ordering::Release);
        self.lanes.write()[slot].replacement = queue;
        self.note_written(slot);
        Ok(())
    }

    /// Whether a write to `slot`'s replacement has failed since it was set.
    pub fn replacement_failed(&self, slot: usize) -> bool {
        self.replacement_failed[slot].load(Ordering::Acquire)
    }

    /// Run one job directly on `slot`'s replacement (the rebuild's writes).
    pub fn run_on_replacement(&self, slot: usize, op: Op) -> Outcome {
        let member = self.lanes.read()[slot]
            .replacement
            .as_ref()
            .map(|q| Arc::clone(&q.member));
        let is_write = op.changes_member();
        let outcome = match member {
            Some(m) => perform(m.as_ref(), op, None),
            None => Err(missing(slot)),
        };
        if is_write && outcome.is_ok() {
            self.note_written(slot);
        }
        outcome
    }

    /// Record that a write to `slot` completed outside the pool (zeroing a
    /// new group), so the next flush syncs it.
    pub fn note_written(&self, slot: usize) {
        if let Some(mark) = self.sync_marks.get(slot) {
            mark.written.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// Whether `slot` has writes that no finished sync covers. Taken before
    /// the sync starts, so writes completing meanwhile stay uncovered.
    pub fn sync_ticket(&self, slot: usize) -> SyncTicket {
        let Some(mark) = self.sync_marks.get(slot) else {
            return SyncTicket(None);
        };
        let written = mark.written.load(Ordering::Acquire);
        // A sync still running elsewhere has not raised `synced` yet, so a
        // concurrent flush syncs too instead of returning before it is done.
        SyncTicket((mark.synced.load(Ordering::Acquire) < written).then_some(written))
    }

    /// The sync taken with `ticket` finished successfully.
    pub fn synced(&self, slot: usize, ticket: SyncTicket) {
        if let (Some(mark), Some(written)) = (self.sync_marks.get(slot), ticket.0) {
            mark.synced.fetch_max(written, Ordering::AcqRel);
        }
    }

    /// Write borrowed slices, all on this thread, when every target only
    /// copies into a cache and has no replacement attached; None (nothing
    /// written) otherwise, and the caller submits owned jobs with [`run`].
    /// Saves copying the caller's data into a shared buffer first. Each
    /// write is a list of slices written one after another from its offset.
    ///
    /// [`run`]: WorkerPool::run
    pub fn write_inline(&self, writes: &[(usize, u64, Vec<&[u8]>)]) -> Option<Vec<Outcome>> {
        let slots: Vec<usize> = writes.iter().map(|w| w.0).collect();
        let members = self.cached_members(&slots)?;
        // A buffered write holds its file's inode lock while it copies, so
        // batches running at once (the kernel's writeback sends several
        // WRITEs together) that all started on the same member would queue
        // behind each other member by member; each starts somewhere else.
        let n = writes.len();
        let first = self.inline_rotor.fetch_add(1, Ordering::Relaxed) % n.max(1);
        let mut results: Vec<Outcome> = (0..n).map(|_| Ok(Vec::new())).collect();
        for i in (first..n).chain(0..first) {
            let (slot, offset, bytes) = &writes[i];
            let started = Instant::now();
            results[i] = members[i]
                .write_vectored_at(bytes, *offset)
                .map(|()| Vec::new());
            if let Some(io) = self.io.get(*slot) {
                let len = bytes.iter().map(|b| b.len() as u64).sum();
                io.record(Direction::Write, len, started.elapsed());
            }
        }
        let tagged: Vec<(usize, usize)> = writes
            .iter()
            .enumerate()
            .map(|(tag, w)| (tag, w.0))
            .collect();
        self.note_outcomes(&tagged, &results);
        Some(results)
    }

    /// The members of `slots` when every one only copies writes into a
    /// cache and has no replacement attached; None otherwise.
    fn cached_members(&self, slots: &[usize]) -> Option<Vec<Arc<dyn Member>>> {
        let lanes = self.lanes.read();
        slots
            .iter()
            .map(|slot| {
                let lane = lanes.get(*slot)?;
                let queue = lane.main.as_ref()?;
                (lane.replacement.is_none() && queue.member.cached_writes())
                    .then(|| Arc::clone(&queue.member))
            })
            .collect()
    }

    /// Whether every member of `slots` only copies writes into a cache and
    /// has no replacement attached (writes to them cost CPU, not waits).
    pub fn writes_cached(&self, slots: &[usize]) -> bool {
        self.cached_members(slots).is_some()
    }

    fn note_outcomes(&self, writes: &[(usize, usize)], results: &[Outcome]) {
        for &(tag, slot) in writes {
            if results.get(tag).is_some_and(|r| r.is_ok()) {
                self.note_written(slot);
            }
        }
    }

    /// Run `jobs` (member slot, op) and return their outcomes in the same
    /// order. A job for a slot with no member fails with `NotConnected`.
    pub fn run(&self, mut jobs: Vec<(usize, Op)>) -> Vec<Outcome> {
        let lanes = self.lanes.read();
        if jobs.len() == 1
            && lanes
                .get(jobs[0].0)
                .is_some_and(|l| l.replacement.is_none())
        {
            let Some((slot, op)) = jobs.pop() else {
                return Vec::new();
            };
            let member = lanes[slot].main.as_ref().map(|q| Arc::clone(&q.member));
            drop(lanes);
            let is_write = op.changes_member();
            let outcome = vec![match member {
                Some(m) => perform(m.as_ref(), op, self.io.get(slot)),
                None => Err(missing(slot)),
            }];
            if is_write {
                self.note_outcomes(&[(0, slot)], &outcome);
            }
            return outcome;
        }
        drop(lanes);
        // Writes into a cache, cached reads, and the last job run on this
        // thread once the others are queued: the caller would only sleep
        // meanwhile, and each hand-off costs two wake-ups (perf showed them
        // as a fifth of the daemon's time; inline cached writes made a RAID5
        // sequential write 1.4x faster on a loaded 2-CPU machine).
        let (mut batch, inline) = self.queue_jobs(jobs, true);
        for (tag, slot, member, op) in inline {
            batch.results[tag] = Some(perform(member.as_ref(), op, self.io.get(slot)));
        }
        self.wait(batch)
    }

    /// Read `buf.len()` bytes at `offset` of `slot`'s member on this thread,
    /// straight into the caller's buffer. A lone read gains nothing from a
    /// worker (the caller would only sleep meanwhile), and reading in place
    /// saves allocating, zeroing and copying a buffer per request.
    pub fn read_inline(&self, slot: usize, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let member = self
            .lanes
            .read()
            .get(slot)
            .and_then(|lane| lane.main.as_ref())
            .map(|q| Arc::clone(&q.member));
        let Some(m) = member else {
            return Err(missing(slot));
        };
        let started = Instant::now();
        let outcome = m.read_at(buf, offset);
        if let Some(io) = self.io.get(slot) {
            io.record(Direction::Read, buf.len() as u64, started.elapsed());
        }
        outcome
    }

    /// Read `buf.len()` bytes at `offset` of `slot`'s member into `buf` on
    /// this thread if they are cached (see [`Member::read_cached`]); false
    /// when they are not (or the member cannot tell), and `buf` is then
    /// undefined.
    pub fn read_if_cached(&self, slot: usize, offset: u64, buf: &mut [u8]) -> bool {
        let member = self
            .lanes
            .read()
            .get(slot)
            .and_then(|lane| lane.main.as_ref())
            .filter(|q| q.member.cached_writes())
            .map(|q| Arc::clone(&q.member));
        let Some(m) = member else {
            return false;
        };
        let started = Instant::now();
        if !m.read_cached(buf, offset).unwrap_or(false) {
            return false;
        }
        if let Some(io) = self.io.get(slot) {
            io.record(Direction::Read, buf.len() as u64, started.elapsed());
        }
        true
    }

    /// How long the operation counters have been counting.
    pub fn io_elapsed(&self) -> std::time::Duration {
        self.io_since.elapsed()
    }

    /// Every slot's operation counters since the pool started.
    pub fn io_stats(&self) -> Vec<MemberIo> {
        self.io
            .iter()
            .enumerate()
            .map(|(slot, c)| c.snapshot(slot))
            .collect()
    }

    /// Queue `jobs` on the workers and return at once; [`WorkerPool::wait`]
    /// collects their outcomes. Lets a caller overlap its own work (or
    /// other jobs) with these.
    pub fn submit(&self, jobs: Vec<(usize, Op)>) -> Batch {
        self.queue_jobs(jobs, false).0
    }

    /// Queue `jobs`; with `inline_ok`, cached reads are done here and
    /// cached writes and the last job (those with no replacement copy) are
    /// handed back for the caller to run.
    #[allow(clippy::type_complexity)]
    fn queue_jobs(
        &self,
        jobs: Vec<(usize, Op)>,
        inline_ok: bool,
    ) -> (Batch, Vec<(usize, usize, Arc<dyn Member>, Op)>) {
        let lanes = self.lanes.read();
        let mut batch = Batch {
            results: (0..jobs.len()).map(|_| None).collect(),
            replies: None,
            pending: 0,
            replacement_slots: Vec::new(),
            writes: jobs
                .iter()
                .enumerate()
                .filter(|(_, (_, op))| op.changes_member())
                .map(|(tag, (slot, _))| (tag, *slot))
                .collect(),
        };
        let mut inline = Vec::new();
        let Some(last) = jobs.len().checked_sub(1) else {
            return (batch, inline);
        };
        let (reply_tx, reply_rx) = handoff::channel();
        for (tag, (slot, mut op)) in jobs.into_iter().enumerate() {
            let Some(lane) = lanes.get(slot) else {
                batch.results[tag] = Some(Err(missing(slot)));
                continue;
            };
            if inline_ok {
                // Reads of cached bytes are done here too; only those that
                // would wait for the device go to the member's workers.
                // Members that cache writes are the ones that can say a read
                // is cached; on a miss the buffer travels on to the worker.
                if let (Op::Read { offset, len }, Some(q)) = (&op, &lane.main) {
                    if tag != last && q.member.cached_writes() {
                        let (offset, mut buf) = (*offset, vec![0u8; *len]);
                        let started = Instant::now();
                        if q.member.read_cached(&mut buf, offset).unwrap_or(false) {
                            if let Some(io) = self.io.get(slot) {
                                io.record(Direction::Read, buf.len() as u64, started.elapsed());
                            }
                            batch.results[tag] = Some(Ok(buf));
                            continue;
                        }
                        op = Op::ReadInto { offset, buf };
                    }
                }
                if lane.replacement.is_none() {
                    if let Some(q) = &lane.main {
                        let cached_write =
                            matches!(op, Op::Write { .. }) && q.member.cached_writes();
                        if tag == last || cached_write {
                            inline.push((tag, slot, Arc::clone(&q.member), op));
                            continue;
                        }
                    }
                }
            }
            if let (Some(r), Some(copy)) = (&lane.replacement, op.duplicate()) {
                let rtag = REPLACEMENT_TAG + batch.replacement_slots.len();
                if r.tx
                    .send(Job {
                        tag: rtag,
                        op: copy,
                        reply: reply_tx.clone(),
                    })
                    .is_ok()
                {
                    batch.replacement_slots.push(slot);
                    batch.pending += 1;
                }
            }
            match &lane.main {
                Some(q) => match q.tx.send(Job {
                    tag,
                    op,
                    reply: reply_tx.clone(),
                }) {
                    Ok(()) => batch.pending += 1,
                    Err(_) => batch.results[tag] = Some(Err(missing(slot))),
                },
                None => batch.results[tag] = Some(Err(missing(slot))),
            }
        }
        batch.replies = Some(reply_rx);
        (batch, inline)
    }

    /// Wait for every job of `batch`; outcomes in submission order.
    pub fn wait(&self, mut batch: Batch) -> Vec<Outcome> {
        if let Some(replies) = batch.replies.take() {
            for _ in 0..batch.pending {
                match replies.recv() {
                    Some((tag, outcome)) if tag >= REPLACEMENT_TAG => {
                        if let Err(e) = outcome {
                            let slot = batch.replacement_slots[tag - REPLACEMENT_TAG];
                            if !self.replacement_failed[slot].swap(true, Ordering::AcqRel) {
                                log::error!(
                                    "raidfs: write to the replacement of slot {slot} failed: {e}"
                                );
                            }
                        }
                    }
                    Some((tag, outcome)) => batch.results[tag] = Some(outcome),
                    None => break,
                }
            }
        }
        let results: Vec<Outcome> = batch
            .results
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(io::Error::other("member worker stopped"))))
            .collect();
        self.note_outcomes(&batch.writes, &results);
        results
    }
}

/// Jobs queued by [`WorkerPool::submit`], not yet collected.
pub struct Batch {
    results: Vec<Option<Outcome>>,
    replies: Option<Receiver<(usize, Outcome)>>,
    /// Replies still to come (replacement copies included).
    pending: usize,
    /// Slot of each replacement copy, by its tag's offset.
    replacement_slots: Vec<usize>,
    /// (tag, slot) of every write, counted for flushes once it succeeds.
    writes: Vec<(usize, usize)>,
}

impl Drop for WorkerPool {
    fn drop(&mut self) {
        self.lanes.write().clear();
        for t in self.threads.lock().drain(..) {
            let _ = t.join();
        }
    }
}
