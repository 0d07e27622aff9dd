//! Fault and crash injection around any member, for tests.
//!
//! A [`FaultyMember`] forwards to an inner member and can be told, at any time
//! and from any thread, to fail operations: after N more operations, on given
//! byte ranges, or everything (the member was "pulled"). Clones share one
//! device and one set of controls, so a test keeps a clone while the array
//! owns another and fails the member mid-run.
//!
//! It also models a volatile disk cache: it remembers every write since the
//! last successful sync (with the bytes it replaced), so [`FaultyMember::crash_image`]
//! can rebuild what a power cut would leave on the platter: exactly the synced
//! data, or with [`FaultyMember::crash_image_random`] the synced data plus a
//! seeded random subset of the later writes, each possibly torn at 512-byte
//! sector granularity. The filesystem's `CrashStore` keeps its groups on a
//! `FaultyMember`, so this is the one place that decides what a crash keeps.

use super::memory::MemoryMember;
use super::Member;
use parking_lot::{Condvar, Mutex};
use std::io;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

/// Sector size at which unsynced writes may be torn in a crash image.
pub const SECTOR: u64 = 512;

/// Which kinds of operation a fault applies to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ops {
    pub reads: bool,
    pub writes: bool,
    pub syncs: bool,
}

impl Ops {
    pub const READS: Ops = Ops {
        reads: true,
        writes: false,
        syncs: false,
    };
    pub const WRITES: Ops = Ops {
        reads: false,
        writes: true,
        syncs: false,
    };
    pub const SYNCS: Ops = Ops {
        reads: false,
        writes: false,
        syncs: true,
    };
    pub const READS_AND_WRITES: Ops = Ops {
        reads: true,
        writes: true,
        syncs: false,
    };
    pub const ALL: Ops = Ops {
        reads: true,
        writes: true,
        syncs: true,
    };

    fn has(self, op: Op) -> bool {
        match op {
            Op::Read => self.reads,
            Op::Write => self.writes,
            Op::Sync => self.syncs,
        }
    }
}

/// Operation counts since creation or the last [`FaultyMember::reset_counts`].
/// `reads`, `writes` and `syncs` count attempts, failed ones included.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OpCounts {
    pub reads: u64,
    pub writes: u64,
    pub syncs: u64,
    pub failed_reads: u64,
    pub failed_writes: u64,
    pub failed_syncs: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    Read,
    Write,
    Sync,
}

impl Op {
    fn verb(self) -> &'static str {
        match self {
            Op::Read => "read",
            Op::Write => "write",
            Op::Sync => "sync",
        }
    }
}

#[derive(Default)]
struct Faults {
    pulled: bool,
    /// Operations of the given kinds still allowed before they start failing.
    trip: Option<(u64, Ops)>,
    tripped: Option<Ops>,
    ranges: Vec<(Range<u64>, Ops)>,
    /// The kind injected errors carry (`Other` unless set: a disk's error;
    /// `StorageFull` or `ReadOnlyFilesystem` for the host's).
    kind: Option<io::ErrorKind>,
}

/// A write not yet covered by a successful sync, with what it overwrote.
struct Unsynced {
    offset: u64,
    old: Vec<u8>,
    new: Vec<u8>,
}

#[derive(Default)]
struct Counters {
    reads: AtomicU64,
    writes: AtomicU64,
    syncs: AtomicU64,
    failed_reads: AtomicU64,
    failed_writes: AtomicU64,
    failed_syncs: AtomicU64,
    bytes_read: AtomicU64,
    bytes_written: AtomicU64,
}

struct Shared {
    inner: Box<dyn Member>,
    faults: Mutex<Faults>,
    counters: Counters,
    track_crash: AtomicBool,
    /// What [`Member::cached_writes`] answers (off: writes go to workers).
    cached_writes: AtomicBool,
    /// Writes wait while this is set ([`FaultyMember::hold_writes`]).
    writes_held: Mutex<bool>,
    held_writers: AtomicUsize,
    writes_released: Condvar,
    /// Also serialises tracked writes, so the undo order is the apply order.
    unsynced: Mutex<Vec<Unsynced>>,
}

/// A member with injectable faults and crash images. Clones share everything.
#[derive(Clone)]
pub struct FaultyMember {
    shared: Arc<Shared>,
}

impl FaultyMember {
    /// Wrap `inner`; no faults, crash tracking on.
    pub fn new(inner: impl Member + 'static) -> FaultyMember {
        FaultyMember::from_box(Box::new(inner))
    }

    /// Wrap an already boxed member.
    pub fn from_box(inner: Box<dyn Member>) -> FaultyMember {
        FaultyMember {
            shared: Arc::new(Shared {
                inner,
                faults: Mutex::new(Faults::default()),
                counters: Counters::default(),
                track_crash: AtomicBool::new(true),
                cached_writes: AtomicBool::new(false),
                writes_held: Mutex::new(false),
                held_writers: AtomicUsize::new(0),
                writes_released: Condvar::new(),
                unsynced: Mutex::new(Vec::new()),
            }),
        }
    }

    /// Report writes as cache copies ([`Member::cached_writes`]), as image
    /// files do, so the array writes inline or with write-back; off by
    /// default, which sends every write through the member workers.
    pub fn set_cached_writes(&self, on: bool) {
        self.shared.cached_writes.store(on, Ordering::Release);
    }

    /// Make writes wait (a slow disk, frozen) until [`release_writes`](Self::release_writes).
    pub fn hold_writes(&self) {
        *self.shared.writes_held.lock() = true;
    }

    /// Writes waiting in [`hold_writes`](Self::hold_writes) now.
    pub fn held_writers(&self) -> usize {
        self.shared.held_writers.load(Ordering::SeqCst)
    }

    /// Let held writes go on.
    pub fn release_writes(&self) {
        *self.shared.writes_held.lock() = false;
        self.shared.writes_released.notify_all();
    }

    /// A faulty member over a zeroed in-memory member of `size` bytes.
    pub fn memory(size: u64, name: &str) -> io::Result<FaultyMember> {
        Ok(FaultyMember::new(MemoryMember::new(size)?.with_name(name)))
    }

    /// Fail every operation (the disk was pulled) until [`reinsert`](Self::reinsert) or [`heal`](Self::heal).
    pub fn pull(&self) {
        self.shared.faults.lock().pulled = true;
    }

    /// Undo [`pull`](Self::pull); other faults stay.
    pub fn reinsert(&self) {
        self.shared.faults.lock().pulled = false;
    }

    pub fn is_pulled(&self) -> bool {
        self.shared.faults.lock().pulled
    }

    /// Let `n` more operations of the kinds in `ops` succeed, then fail every
    /// later one of those kinds until [`heal`](Self::heal). Replaces an earlier countdown.
    pub fn fail_after(&self, n: u64, ops: Ops) {
        let mut faults = self.shared.faults.lock();
        faults.tripped = None;
        if n == 0 {
            faults.trip = None;
            faults.tripped = Some(ops);
        } else {
            faults.trip = Some((n, ops));
        }
    }

    pub fn fail_reads_after(&self, n: u64) {
        self.fail_after(n, Ops::READS);
    }

    pub fn fail_writes_after(&self, n: u64) {
        self.fail_after(n, Ops::WRITES);
    }

    /// Make injected faults carry `kind` (`StorageFull` models a full host
    /// filesystem, `ReadOnlyFilesystem` one that went read-only).
    pub fn set_fault_kind(&self, kind: io::ErrorKind) {
        self.shared.faults.lock().kind = Some(kind);
    }

    /// Fail operations of the kinds in `ops` that touch any byte of `range`.
    pub fn fail_range(&self, range: Range<u64>, ops: Ops) {
        self.shared.faults.lock().ranges.push((range, ops));
    }

    /// Forget all range faults.
    pub fn clear_ranges(&self) {
        self.shared.faults.lock().ranges.clear();
    }

    /// Remove every fault: pulled, countdown and ranges.
    pub fn heal(&self) {
        *self.shared.faults.lock() = Faults::default();
    }

    pub fn counts(&self) -> OpCounts {
        let c = &self.shared.counters;
        OpCounts {
            reads: c.reads.load(Ordering::Relaxed),
            writes: c.writes.load(Ordering::Relaxed),
            syncs: c.syncs.load(Ordering::Relaxed),
            failed_reads: c.failed_reads.load(Ordering::Relaxed),
            failed_writes: c.failed_writes.load(Ordering::Relaxed),
            failed_syncs: c.failed_syncs.load(Ordering::Relaxed),
            bytes_read: c.bytes_read.load(Ordering::Relaxed),
            bytes_written: c.bytes_written.load(Ordering::Relaxed),
        }
    }

    pub fn reset_counts(&self) {
        let c = &self.shared.counters;
        for counter in [
            &c.reads,
            &c.writes,
            &c.syncs,
            &c.failed_reads,
            &c.failed_writes,
            &c.failed_syncs,
            &c.bytes_read,
            &c.bytes_written,
        ] {
            counter.store(0, Ordering::Relaxed);
        }
    }

    /// Turn crash tracking on or off. Tracking costs a read of the old bytes
    /// before every write and serialises writes; turning it off also forgets
    /// the writes tracked so far (crash images then show everything written).
    pub fn set_crash_tracking(&self, on: bool) {
        let mut unsynced = self.shared.unsynced.lock();
        self.shared.track_crash.store(on, Ordering::SeqCst);
        if !on {
            unsynced.clear();
        }
    }

    /// Number of writes since the last successful sync.
    pub fn unsynced_writes(&self) -> usize {
        self.shared.unsynced.lock().len()
    }

    /// What a power cut now would leave: exactly the data as of the last
    /// successful sync.
    pub fn crash_image(&self) -> io::Result<MemoryMember> {
        self.build_crash_image(None)
    }

    /// What a power cut now might leave with a write-back cache: the synced
    /// data plus, chosen by `seed`, some of the later writes, each kept whole,
    /// dropped, or torn (a random subset of its 512-byte sectors kept).
    pub fn crash_image_random(&self, seed: u64) -> io::Result<MemoryMember> {
        self.build_crash_image(Some(seed))
    }

    fn build_crash_image(&self, seed: Option<u64>) -> io::Result<MemoryMember> {
        let inner = &self.shared.inner;
        // Holding the journal keeps writers out while we read the platter.
        let unsynced = self.shared.unsynced.lock();
        let len = usize::try_from(inner.len()).map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{}: too large for a crash image", inner.name()),
            )
        })?;
        let mut image = vec![0u8; len];
        const STEP: usize = 1 << 20;
        for (i, piece) in image.chunks_mut(STEP).enumerate() {
            inner.read_at(piece, (i * STEP) as u64)?;
        }
        for write in unsynced.iter().rev() {
            let at = write.offset as usize;
            image[at..at + write.old.len()].copy_from_slice(&write.old);
        }
        if let Some(seed) = seed {
            let mut rng = SplitMix64(seed);
            for write in unsynced.iter() {
                apply_some_sectors(&mut image, write, &mut rng);
            }
        }
        Ok(MemoryMember::from_bytes(image).with_name(inner.name()))
    }

    /// Decide whether this operation fails; counts it either way.
    fn admit(&self, op: Op, range: Option<Range<u64>>) -> io::Result<()> {
        let (failure, kind) = {
            let mut faults = self.shared.faults.lock();
            let kind = faults.kind;
            let failure = if faults.pulled {
                Some("member pulled".to_string())
            } else if faults.tripped.is_some_and(|ops| ops.has(op)) {
                Some("operation countdown expired".to_string())
            } else if let Some(bad) = range.as_ref().and_then(|r| {
                faults
                    .ranges
                    .iter()
                    .find(|(bad, ops)| ops.has(op) && bad.start < r.end && r.start < bad.end)
            }) {
                Some(format!("bad range {:?}", bad.0))
            } else {
                if let Some((left, ops)) = faults.trip {
                    if ops.has(op) {
                        if left <= 1 {
                            faults.trip = None;
                            faults.tripped = Some(ops);
                        } else {
                            faults.trip = Some((left - 1, ops));
                        }
                    }
                }
                None
            };
            (failure, kind)
        };
        let c = &self.shared.counters;
        let (count, failed) = match op {
            Op::Read => (&c.reads, &c.failed_reads),
            Op::Write => (&c.writes, &c.failed_writes),
            Op::Sync => (&c.syncs, &c.failed_syncs),
        };
        count.fetch_add(1, Ordering::Relaxed);
        match failure {
            None => Ok(()),
            Some(why) => {
                failed.fetch_add(1, Ordering::Relaxed);
                let place = range
                    .map(|r| format!(" at offset {}", r.start))
                    .unwrap_or_default();
                Err(io::Error::new(
                    kind.unwrap_or(io::ErrorKind::Other),
                    format!(
                        "{}: injected {} fault{place} ({why})",
                        self.shared.inner.name(),
                        op.verb()
                    ),
                ))
            }
        }
    }
}

impl Member for FaultyMember {
    fn cached_writes(&self) -> bool {
        self.shared.cached_writes.load(Ordering::Acquire)
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.admit(
            Op::Read,
            Some(offset..offset.saturating_add(buf.len() as u64)),
        )?;
        self.shared.inner.read_at(buf, offset)?;
        let c = &self.shared.counters;
        c.bytes_read.fetch_add(buf.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        {
            let mut held = self.shared.writes_held.lock();
            if *held {
                self.shared.held_writers.fetch_add(1, Ordering::SeqCst);
                while *held {
                    self.shared.writes_released.wait(&mut held);
                }
                self.shared.held_writers.fetch_sub(1, Ordering::SeqCst);
            }
        }
        self.admit(
            Op::Write,
            Some(offset..offset.saturating_add(buf.len() as u64)),
        )?;
        let inner = &self.shared.inner;
        if self.shared.track_crash.load(Ordering::SeqCst) {
            let mut unsynced = self.shared.unsynced.lock();
            let mut old = vec![0u8; buf.len()];
            inner.read_at(&mut old, offset)?;
            inner.write_at(buf, offset)?;
            unsynced.push(Unsynced {
                offset,
                old,
                new: buf.to_vec(),
            });
        } else {
            inner.write_at(buf, offset)?;
        }
        let c = &self.shared.counters;
        c.bytes_written
            .fetch_add(buf.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// A write plus a sync of just its range: nothing else becomes durable.
    /// Older unsynced writes under the range are patched so that undoing
    /// them in a crash image brings back these bytes, not older ones.
    fn write_durable(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let range = offset..offset.saturating_add(buf.len() as u64);
        self.admit(Op::Write, Some(range.clone()))?;
        self.admit(Op::Sync, None)?;
        let inner = &self.shared.inner;
        let mut unsynced = self.shared.unsynced.lock();
        inner.write_at(buf, offset)?;
        inner.sync()?;
        for u in unsynced.iter_mut() {
            let (lo, hi) = (
                u.offset.max(range.start),
                (u.offset + u.old.len() as u64).min(range.end),
            );
            if lo < hi {
                let (at_u, at_buf, n) = (
                    (lo - u.offset) as usize,
                    (lo - offset) as usize,
                    (hi - lo) as usize,
                );
                u.old[at_u..at_u + n].copy_from_slice(&buf[at_buf..at_buf + n]);
            }
        }
        drop(unsynced);
        self.shared
            .counters
            .bytes_written
            .fetch_add(buf.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    fn sync(&self) -> io::Result<()> {
        self.admit(Op::Sync, None)?;
        // Only writes completed before the barrier started are guaranteed durable.
        let covered = self.shared.unsynced.lock().len();
        self.shared.inner.sync()?;
        let mut unsynced = self.shared.unsynced.lock();
        // Tracking may have been switched off (and the journal cleared) meanwhile.
        let covered = covered.min(unsynced.len());
        unsynced.drain(..covered);
        Ok(())
    }

    fn can_discard(&self) -> bool {
        self.shared.inner.can_discard()
    }

    /// Zeros written like any other write, so faults, held writes and crash
    /// images treat a discard as the write it is.
    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        if !self.can_discard() {
            return self.shared.inner.discard(offset, len);
        }
        self.zero_range(offset, len)
    }

    fn len(&self) -> u64 {
        self.shared.inner.len()
    }

    fn refresh_len(&self) -> io::Result<u64> {
        self.shared.inner.refresh_len()
    }

    fn name(&self) -> String {
        self.shared.inner.name()
    }
}

/// Persist a random part of one unsynced write into `image`: with equal odds
/// all of it, none of it, or a random subset of its sectors.
fn apply_some_sectors(image: &mut [u8], write: &Unsynced, rng: &mut SplitMix64) {
    let fate = rng.next() % 3;
    if fate == 1 {
        return;
    }
    let torn = fate == 2;
    let end = write.offset + write.new.len() as u64;
    let mut at = write.offset;
    while at < end {
        let sector_end = ((at / SECTOR) + 1) * SECTOR;
        let piece_end = sector_end.min(end);
        if !torn || rng.next().is_multiple_of(2) {
            let from = (at - write.offset) as usize;
            let to = (piece_end - write.offset) as usize;
            image[at as usize..piece_end as usize].copy_from_slice(&write.new[from..to]);
        }
        at = piece_end;
    }
}

/// Small deterministic generator (splitmix64): crash images must be
/// reproducible from a seed, and `rand` is only a dev-dependency.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}
