//! A simulated spinning disk, for read-balancing benchmarks and tests.
//!
//! A [`SimulatedDisk`] has one head. Each request costs a service time: a seek
//! that grows with the distance the head travels (`settle + k * sqrt(fraction
//! of the stroke)`), half a revolution of rotational delay on average, and the
//! transfer at a fixed rate. A request that starts exactly where the previous
//! one ended pays only the transfer. Requests are served one at a time (a mutex
//! around the head), so concurrent readers queue like they would on a disk.
//!
//! Two clocks: [`Clock::Real`] spends the service time by sleeping while the
//! head is held (scaled by a factor, so a benchmark can run faster than the
//! disk it models); [`Clock::Virtual`] only adds it up, so tests are fast and
//! deterministic. Data lives in a sparse map of 64 KiB pages: unwritten bytes
//! read as zeros and cost no memory, so a simulated disk can be tens of GB.

use super::Member;
use parking_lot::{Mutex, RwLock};
use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

const PAGE: u64 = 64 << 10;

/// Mechanical parameters of the modelled disk.
#[derive(Clone, Copy, Debug)]
pub struct DiskModel {
    /// Fixed cost of any seek (head settle).
    pub settle: Duration,
    /// Average seek time over random requests (a third of the stroke on average).
    pub average_seek: Duration,
    /// Spindle speed; the average rotational delay is half a revolution.
    pub rpm: u32,
    /// Media transfer rate in bytes per second.
    pub transfer_rate: u64,
}

impl Default for DiskModel {
    /// A 7200 rpm IDE disk of 2003: ~8.5 ms average seek, ~27 MiB/s.
    fn default() -> DiskModel {
        DiskModel {
            settle: Duration::from_micros(1000),
            average_seek: Duration::from_micros(8500),
            rpm: 7200,
            transfer_rate: 27 << 20,
        }
    }
}

impl DiskModel {
    /// Time to serve `len` bytes at `offset` with the head at `head`, on a
    /// disk of `size` bytes.
    pub fn service_time(&self, head: u64, offset: u64, len: u64, size: u64) -> Duration {
        let transfer = Duration::from_secs_f64(len as f64 / self.transfer_rate.max(1) as f64);
        if offset == head {
            return transfer;
        }
        transfer + self.seek_time(head.abs_diff(offset), size) + self.rotational_delay()
    }

    /// Seek over `distance` bytes: `settle + k * sqrt(distance / size)`. For
    /// uniformly random requests E[sqrt(distance / size)] = 8/15, which fixes
    /// `k` from the average seek time.
    pub fn seek_time(&self, distance: u64, size: u64) -> Duration {
        if distance == 0 {
            return Duration::ZERO;
        }
        let fraction = (distance as f64 / size.max(1) as f64).min(1.0);
        let k = self.average_seek.saturating_sub(self.settle).as_secs_f64() * 15.0 / 8.0;
        self.settle + Duration::from_secs_f64(k * fraction.sqrt())
    }

    /// Half a revolution.
    pub fn rotational_delay(&self) -> Duration {
        Duration::from_secs_f64(30.0 / self.rpm.max(1) as f64)
    }
}

/// How service time is spent.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Clock {
    /// Sleep for `service time * scale` while holding the head.
    Real { scale: f64 },
    /// Only accumulate the service time (deterministic, no sleeping).
    Virtual,
}

/// Counters of one simulated disk.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DiskCounters {
    pub reads: u64,
    pub writes: u64,
    /// Requests that did not start at the head's position.
    pub seeks: u64,
    /// Simulated time the disk spent serving requests (unscaled).
    pub busy: Duration,
}

struct Head {
    position: u64,
    /// Real clock: when the disk finishes the work it has been given.
    free_at: Option<Instant>,
}

/// A sequential request arriving this soon (simulated) after the previous one
/// finished is served as if it had been queued: the drive keeps reading ahead
/// into its cache (20 ms is ~540 KiB at 27 MiB/s, well within a 2 MiB cache),
/// which hides the host's turnaround. It also keeps the sleeps' overshoot and
/// scheduling delays on a busy machine from adding up over a stream.
const QUEUED_WITHIN: Duration = Duration::from_millis(20);

/// A simulated disk member. Share it as `Arc<SimulatedDisk>` to keep a handle
/// for its counters after handing it to an array.
pub struct SimulatedDisk {
    name: String,
    len: u64,
    model: DiskModel,
    clock: Clock,
    rotational: bool,
    /// When off, requests cost nothing and move nothing (array creation).
    timing: AtomicBool,
    /// Held for the whole service of a request.
    head: Mutex<Head>,
    pages: RwLock<HashMap<u64, Box<[u8]>>>,
    reads: AtomicU64,
    writes: AtomicU64,
    seeks: AtomicU64,
    busy_ns: AtomicU64,
}

impl SimulatedDisk {
    pub fn new(name: impl Into<String>, len: u64, model: DiskModel, clock: Clock) -> SimulatedDisk {
        SimulatedDisk {
            name: name.into(),
            len,
            model,
            clock,
            rotational: true,
            timing: AtomicBool::new(true),
            head: Mutex::new(Head {
                position: 0,
                free_at: None,
            }),
            pages: RwLock::new(HashMap::new()),
            reads: AtomicU64::new(0),
            writes: AtomicU64::new(0),
            seeks: AtomicU64::new(0),
            busy_ns: AtomicU64::new(0),
        }
    }

    /// Report the disk as rotational or not (builder style; default rotational).
    pub fn with_rotational(mut self, rotational: bool) -> SimulatedDisk {
        self.rotational = rotational;
        self
    }

    /// Turn the timing model on or off (off: no cost, no head movement, no counts).
    pub fn set_timing(&self, on: bool) {
        self.timing.store(on, Ordering::Release);
    }

    /// Put the head at `position` and zero the counters.
    pub fn reset(&self, position: u64) {
        *self.head.lock() = Head {
            position,
            free_at: None,
        };
        for c in [&self.reads, &self.writes, &self.seeks, &self.busy_ns] {
            c.store(0, Ordering::Relaxed);
        }
    }

    pub fn counters(&self) -> DiskCounters {
        DiskCounters {
            reads: self.reads.load(Ordering::Relaxed),
            writes: self.writes.load(Ordering::Relaxed),
            seeks: self.seeks.load(Ordering::Relaxed),
            busy: Duration::from_nanos(self.busy_ns.load(Ordering::Relaxed)),
        }
    }

    pub fn head(&self) -> u64 {
        self.head.lock().position
    }

    fn check(&self, len: usize, offset: u64) -> io::Result<()> {
        match offset.checked_add(len as u64) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "{}: access of {len} bytes at offset {offset} is beyond the end ({} bytes)",
                    self.name, self.len
                ),
            )),
        }
    }

    /// Move the head for one request and spend its service time.
    fn serve(&self, offset: u64, len: usize) {
        if !self.timing.load(Ordering::Acquire) {
            return;
        }
        let mut head = self.head.lock();
        let sequential = head.position == offset;
        if !sequential {
            self.seeks.fetch_add(1, Ordering::Relaxed);
        }
        let cost = self
            .model
            .service_time(head.position, offset, len as u64, self.len);
        head.position = offset + len as u64;
        self.busy_ns.fetch_add(
            u64::try_from(cost.as_nanos()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
        if let Clock::Real { scale } = self.clock {
            let scale = scale.max(0.0);
            let now = Instant::now();
            let start = match head.free_at {
                Some(free) if sequential && now <= free + QUEUED_WITHIN.mul_f64(scale) => free,
                _ => now,
            };
            let done = start + cost.mul_f64(scale);
            head.free_at = Some(done);
            // The simulator's clock: the head stays held while the "disk" works,
            // which is what queues concurrent requests behind each other.
            std::thread::sleep(done.saturating_duration_since(now));
        }
    }
}

impl Member for SimulatedDisk {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.check(buf.len(), offset)?;
        self.serve(offset, buf.len());
        if self.timing.load(Ordering::Relaxed) {
            self.reads.fetch_add(1, Ordering::Relaxed);
        }
        let pages = self.pages.read();
        let mut done = 0usize;
        while done < buf.len() {
            let at = offset + done as u64;
            let in_page = (at % PAGE) as usize;
            let n = (PAGE as usize - in_page).min(buf.len() - done);
            match pages.get(&(at / PAGE)) {
                Some(page) => buf[done..done + n].copy_from_slice(&page[in_page..in_page + n]),
                None => buf[done..done + n].fill(0),
            }
            done += n;
        }
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.check(buf.len(), offset)?;
        self.serve(offset, buf.len());
        if self.timing.load(Ordering::Relaxed) {
            self.writes.fetch_add(1, Ordering::Relaxed);
        }
        let mut pages = self.pages.write();
        let mut done = 0usize;
        while done < buf.len() {
            let at = offset + done as u64;
            let in_page = (at % PAGE) as usize;
            let n = (PAGE as usize - in_page).min(buf.len() - done);
            let page = pages
                .entry(at / PAGE)
                .or_insert_with(|| vec![0u8; PAGE as usize].into_boxed_slice());
            page[in_page..in_page + n].copy_from_slice(&buf[done..done + n]);
            done += n;
        }
        Ok(())
    }

    fn sync(&self) -> io::Result<()> {
        Ok(())
    }

    fn len(&self) -> u64 {
        self.len
    }

    fn name(&self) -> String {
        self.name.clone()
    }

    fn rotational(&self) -> Option<bool> {
        Some(self.rotational)
    }

    /// Like punching a hole in a sparse image: pages go away, no disk time.
    fn zero_range(&self, offset: u64, len: u64) -> io::Result<()> {
        self.check(usize::try_from(len).unwrap_or(usize::MAX), offset)?;
        let end = offset + len;
        let mut pages = self.pages.write();
        pages.retain(|&index, page| {
            let (lo, hi) = (index * PAGE, (index + 1) * PAGE);
            if hi <= offset || lo >= end {
                return true;
            }
            if offset <= lo && hi <= end {
                return false;
            }
            let from = offset.max(lo) - lo;
            let to = end.min(hi) - lo;
            page[from as usize..to as usize].fill(0);
            true
        });
        Ok(())
    }
}
