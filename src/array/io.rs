//! Reads and writes of logical ranges, the part every personality shares:
//! resolving an address to its region and splitting it into chunk pieces,
//! coalescing member runs, the write-intent bitmap marked around a write,
//! the plain write to every target, flushes and member syncs. What differs
//! by level is in `personality`.

use super::bitmap::Intent;
use super::worker::Op;
use super::write_buffer::WriteBuffer;
use super::{Array, ArrayError, ArrayResult, Region};
use crate::geometry::Mapping;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Mirror and RAID0 writes from this size on are queued on the members'
/// workers and answered at once (`write_back`): each copy is written by its
/// own thread, in parallel, while the next request arrives. Smaller ones
/// are written inline, where a hand-off would cost more than the copy.
const WRITE_BACK_MIN: usize = 256 << 10;

/// The part of a request that falls in one chunk.
pub(super) struct Piece {
    /// Offset within the caller's buffer.
    pub buf_off: usize,
    pub len: usize,
    pub map: Mapping,
}

/// Whether a write's partial stripes may wait in the stripe cache.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Caching {
    Allowed,
    /// The cache's own write-outs.
    Bypass,
}

/// How to read when the plain read was not good enough.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Choice {
    /// Normal read.
    Any,
    /// Mirrors: read copy number `n` of every piece.
    Copy(usize),
}

pub(super) fn split(region: &Region, offset: u64, len: usize) -> Vec<Piece> {
    let chunk = region.geometry.chunk;
    let mut pieces = Vec::new();
    let mut done = 0usize;
    while done < len {
        let logical = offset + done as u64;
        let in_chunk = logical % chunk;
        let n = ((chunk - in_chunk) as usize).min(len - done);
        pieces.push(Piece {
            buf_off: done,
            len: n,
            map: region.geometry.map(logical),
        });
        done += n;
    }
    pieces
}

/// A member read or write covering one or more pieces: consecutive bytes of
/// one member. Merged [`Merge::InPlace`], they are consecutive in the
/// caller's buffer too, so one member read or write uses them in place.
pub(super) struct Run {
    pub slot: usize,
    pub member_offset: u64,
    pub len: usize,
    /// (offset in the run, offset in the caller's buffer, length)
    pub parts: Vec<(usize, usize, usize)>,
}

impl Run {
    /// The bytes of the caller's buffer the run covers: a run merged
    /// [`Merge::InPlace`] (see [`Run::in_place`]).
    pub(super) fn span(&self) -> std::ops::Range<usize> {
        debug_assert!(self.in_place(), "span of a scattered run");
        let at = self.parts.first().map_or(0, |p| p.1);
        at..at + self.len
    }

    /// Whether the run's parts lie one after another in the caller's buffer.
    pub(super) fn in_place(&self) -> bool {
        self.parts.windows(2).all(|w| w[0].1 + w[0].2 == w[1].1)
    }

    /// Copy the run's bytes, read into `from`, to their places in `buf`.
    fn scatter(&self, from: &[u8], buf: &mut [u8]) {
        for &(at, buf_off, len) in &self.parts {
            buf[buf_off..buf_off + len].copy_from_slice(&from[at..at + len]);
        }
    }
}

/// Which neighbouring pieces on one member `coalesce` merges.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Merge {
    /// Only pieces that are neighbours in the caller's buffer too: the run
    /// is one slice of it (a write's data, a mirror read).
    InPlace,
    /// Every piece that continues its member's run, wherever it lies in the
    /// buffer. A striped read finds a member's chunks a stripe apart in the
    /// caller's buffer: one member read of 256 KiB instead of four of
    /// 64 KiB, its bytes then copied to their places (the disk here reads a
    /// cold stream of 64 KiB requests at about two thirds of the rate of
    /// 256 KiB ones, docs/performance.md).
    Scatter,
}

/// Merge consecutive pieces that land contiguously on the same member.
pub(super) fn coalesce(
    items: impl Iterator<Item = (usize, u64, usize, usize)>,
    merge: Merge,
) -> Vec<Run> {
    let mut runs: Vec<Run> = Vec::new();
    for (slot, member_offset, buf_off, len) in items {
        if let Some(last) = runs.iter_mut().rev().find(|r| r.slot == slot) {
            let (_, last_buf, last_len) = last.parts[last.parts.len() - 1];
            if last.member_offset + last.len as u64 == member_offset
                && (merge == Merge::Scatter || last_buf + last_len == buf_off)
            {
                last.parts.push((last.len, buf_off, len));
                last.len += len;
                continue;
            }
        }
        runs.push(Run {
            slot,
            member_offset,
            len,
            parts: vec![(0, buf_off, len)],
        });
    }
    runs
}

impl Array {
    /// Read `buf.len()` bytes at logical `addr`.
    pub fn read(&self, addr: u64, buf: &mut [u8]) -> ArrayResult<()> {
        self.sync.foreground.fetch_add(1, Ordering::Relaxed);
        // Resolved and read under the gate: a reshape that moves the group
        // meanwhile overwrites the old place only after this read ends.
        let _reading = self.reshape_gate.read();
        let (region, offset) = self.region(addr, buf.len())?;
        self.read_region(&region, offset, buf, Choice::Any)
    }

    /// Write `data` at logical `addr` to every copy, or with parity.
    pub fn write(&self, addr: u64, data: &[u8]) -> ArrayResult<()> {
        self.sync.foreground.fetch_add(1, Ordering::Relaxed);
        // Resolved inside the gate: a reshape may move the group meanwhile.
        let _pass = self.reshape_gate.enter((addr >> super::GROUP_SHIFT) as u32);
        let (region, offset) = self.region(addr, data.len())?;
        self.write_region(&region, offset, data)
    }

    /// Make every completed write durable on every working member.
    pub fn flush(&self) -> ArrayResult<()> {
        // Writes gathered in the stripe cache, and full-stripe writes still
        // under way, are completed writes to the callers that made them.
        self.host_gate()?;
        let cached = self.write_out_cached(..);
        self.write_back.wait_idle();
        let parked = self.retry_parked();
        let host = match &self.ppl {
            // A new log epoch starts with the sync that makes logged writes durable.
            Some(ppl) => ppl.flush_with(|header| self.sync_members(Some(header))),
            None => self.sync_members(None),
        };
        cached?;
        parked?;
        if let Some(e) = host {
            return Err(e);
        }
        self.ensure_writable()?;
        self.resync_suspect();
        Ok(())
    }

    /// Sync every working member (after writing the partial parity log's
    /// new header). The error to report when the host refused.
    pub(in crate::array) fn sync_members(&self, ppl_header: Option<&[u8]>) -> Option<ArrayError> {
        let mut host = None;
        let slots: Vec<usize> = (0..self.slots.len())
            .filter(|&s| !self.is_failed(s))
            .collect();
        if let Some(header) = ppl_header {
            let data: Arc<[u8]> = Arc::from(header);
            let jobs = slots
                .iter()
                .map(|&s| {
                    (
                        s,
                        Op::Write {
                            offset: super::ppl::PPL_OFFSET,
                            data: Arc::clone(&data),
                            range: 0..data.len(),
                        },
                    )
                })
                .collect();
            for (slot, outcome) in slots.iter().zip(self.pool.run(jobs)) {
                if let Err(e) = outcome {
                    host = host.or(self.write_failed(*slot, &e, "log header write", None));
                }
            }
        }
        let slots: Vec<usize> = slots.into_iter().filter(|&s| !self.is_failed(s)).collect();
        for (slot, outcome) in self.sync_written(&slots) {
            if let Err(e) = outcome {
                host = host.or(self.write_failed(slot, &e, "sync", None));
            }
        }
        host
    }

    /// Sync those of `slots` that were written since their last sync, in
    /// parallel; the outcome of each sync run. Members with nothing new are
    /// skipped: an fsync whose journal record lands on two members would
    /// otherwise flush every member, and a member's fdatasync with nothing
    /// dirty may still flush the disk's cache.
    fn sync_written(&self, slots: &[usize]) -> Vec<(usize, std::io::Result<()>)> {
        let (slots, tickets): (Vec<usize>, Vec<_>) = slots
            .iter()
            .map(|&s| (s, self.pool.sync_ticket(s)))
            .filter(|(_, ticket)| ticket.needed())
            .unzip();
        let outcomes = self
            .pool
            .run(slots.iter().map(|&s| (s, Op::Sync)).collect());
        slots
            .into_iter()
            .zip(outcomes)
            .zip(tickets)
            .map(|((slot, outcome), ticket)| {
                if outcome.is_ok() {
                    self.pool.synced(slot, ticket);
                }
                (slot, outcome.map(|_| ()))
            })
            .collect()
    }

    /// Read each piece from its chunk's member where that member can serve
    /// it, neighbours coalesced into one request per member. Returns the
    /// pieces left unread (member out of service, or its read failed and
    /// the error failed no member), for the personality to recover; a
    /// fault that is the host's ends the read with its error.
    pub(super) fn read_pieces_direct(
        &self,
        region: &Region,
        pieces: &[Piece],
        buf: &mut [u8],
    ) -> ArrayResult<Vec<usize>> {
        let mut unread = Vec::new();
        let mut direct = Vec::new();
        for (i, p) in pieces.iter().enumerate() {
            let t = p.map.targets[0];
            if self.readable(t.member, region, t.offset) {
                direct.push(i);
            } else {
                unread.push(i);
            }
        }
        let runs = coalesce(
            direct.iter().map(|&i| {
                let p = &pieces[i];
                (
                    p.map.targets[0].member,
                    region.base + p.map.targets[0].offset,
                    p.buf_off,
                    p.len,
                )
            }),
            Merge::Scatter,
        );
        let outcomes = self.read_runs_into(&runs, buf);
        for (run, outcome) in runs.iter().zip(outcomes) {
            if let Err(e) = outcome {
                if let Some(host) = self.read_failed(run.slot, &e, "read") {
                    return Err(host);
                }
                for &(_, buf_off, _) in &run.parts {
                    unread.extend(pieces.iter().position(|p| p.buf_off == buf_off));
                }
            }
        }
        Ok(unread)
    }

    /// Read every run into its parts of `buf`, members in parallel. A lone
    /// run (every 4 KiB random read) is read on this thread, and so are
    /// the runs whose bytes the host has cached (a sequential stream's,
    /// read ahead by the host): a worker would read them into a buffer of
    /// its own, to be copied here again. Only the runs that wait for a
    /// device go to the workers.
    pub(super) fn read_runs_into(&self, runs: &[Run], buf: &mut [u8]) -> Vec<std::io::Result<()>> {
        if let [run] = runs {
            return vec![self.read_run_inline(run, buf)];
        }
        let mut outcomes: Vec<std::io::Result<()>> = Vec::with_capacity(runs.len());
        let mut uncached = Vec::new();
        for (i, run) in runs.iter().enumerate() {
            // A scattered run is cached when every part is; a part that is
            // not sends the whole run to a worker.
            let cached = run.parts.iter().all(|&(at, buf_off, len)| {
                self.pool.read_if_cached(
                    run.slot,
                    run.member_offset + at as u64,
                    &mut buf[buf_off..buf_off + len],
                )
            });
            if !cached {
                uncached.push(i);
            }
            outcomes.push(Ok(()));
        }
        let jobs = uncached
            .iter()
            .map(|&i| {
                let r = &runs[i];
                (
                    r.slot,
                    Op::Read {
                        offset: r.member_offset,
                        len: r.len,
                    },
                )
            })
            .collect();
        for (&i, outcome) in uncached.iter().zip(self.pool.run(jobs)) {
            let run = &runs[i];
            outcomes[i] = outcome.map(|bytes| run.scatter(&bytes, buf));
        }
        outcomes
    }

    /// Read one run on this thread: in place, or into a buffer of its own
    /// when its parts are apart in `buf`.
    fn read_run_inline(&self, run: &Run, buf: &mut [u8]) -> std::io::Result<()> {
        if run.in_place() {
            return self
                .pool
                .read_inline(run.slot, run.member_offset, &mut buf[run.span()]);
        }
        let mut own = vec![0u8; run.len];
        self.pool
            .read_inline(run.slot, run.member_offset, &mut own)?;
        run.scatter(&own, buf);
        Ok(())
    }

    pub(crate) fn write_region(
        &self,
        region: &Region,
        offset: u64,
        data: &[u8],
    ) -> ArrayResult<()> {
        self.write_region_with(region, offset, data, Caching::Allowed)
    }

    /// Write with the bitmap marked around it; `caching` says whether
    /// partial stripes may wait in the stripe cache (not for its own
    /// write-outs).
    pub(super) fn write_region_with(
        &self,
        region: &Region,
        offset: u64,
        data: &[u8],
        caching: Caching,
    ) -> ArrayResult<()> {
        self.host_gate()?;
        self.ensure_writable()?;
        if data.is_empty() {
            return Ok(());
        }
        loop {
            match self.write_marked(region, offset, data, caching) {
                // Under on_host_error=wait a write the host refused waits
                // for it to recover and is done again (same bytes, same place).
                Err(ArrayError::HostFault { .. })
                    if self.host.policy() == super::host::OnHostError::Wait
                        && !self.sync.stop.load(Ordering::Acquire) =>
                {
                    self.host_gate()?;
                }
                result => return result,
            }
        }
    }

    /// `write_region_with` once: bitmap marked around the write.
    fn write_marked(
        &self,
        region: &Region,
        offset: u64,
        data: &[u8],
        caching: Caching,
    ) -> ArrayResult<()> {
        let (start, end) = member_span(region, offset, data.len());
        self.with_intent(start, end, || {
            self.write_unmarked(region, offset, data, caching)
        })
    }

    /// Run `change` (a write, a discard) with the member offsets
    /// `[start, end)` marked in the write-intent bitmap, durably first where
    /// the region was clean, so a crash during it leaves a resync to do.
    pub(super) fn with_intent<T>(
        &self,
        start: u64,
        end: u64,
        change: impl FnOnce() -> ArrayResult<T>,
    ) -> ArrayResult<T> {
        match self.bitmap.begin_write(start, end) {
            Intent::Ready => {}
            Intent::MarkFirst => {
                if let Err(e) = self.mark_dirty_regions(Some((start, end))) {
                    self.bitmap.end_write(start, end);
                    return Err(e);
                }
            }
            Intent::Premark => self.request_premark(),
        }
        let result = change();
        self.bitmap.end_write(start, end);
        result
    }

    /// Make the set bitmap bits durable on every working member: before a
    /// write to member offsets `span` (nothing to do if another writer has
    /// made them durable meanwhile), or with `None` all of them (the
    /// background write of bits set ahead of a sequential writer).
    pub(crate) fn mark_dirty_regions(&self, span: Option<(u64, u64)>) -> ArrayResult<()> {
        let _serial = self.bitmap.write_guard();
        if span.is_some_and(|(start, end)| self.bitmap.is_durable(start, end)) {
            return Ok(());
        }
        let Some((offset, block, snapshot)) = self.bitmap.snapshot() else {
            return Ok(());
        };
        let slots: Vec<usize> = (0..self.slots.len())
            .filter(|&s| !self.is_failed(s))
            .collect();
        // Durable writes of just this block: a sync of the whole member
        // would also wait for all of its data written so far.
        let data: Arc<[u8]> = Arc::from(block);
        let jobs = slots
            .iter()
            .map(|&slot| {
                (
                    slot,
                    Op::WriteDurable {
                        offset,
                        data: Arc::clone(&data),
                    },
                )
            })
            .collect();
        let mut host = None;
        for (slot, outcome) in slots.iter().zip(self.pool.run(jobs)) {
            if let Err(e) = outcome {
                host = host.or(self.member_error(*slot, &e, "bitmap write", None));
            }
        }
        if let Some(e) = host {
            // Not durable everywhere: the next writer of the region marks again.
            return Err(e);
        }
        // The members still working hold the snapshot; failed ones are out.
        self.bitmap.written(snapshot);
        self.ensure_writable()
    }

    /// Every piece to every working target, under the stripe locks: the
    /// write of the personalities without parity (RAID0, mirrors). A large
    /// write is copied once and queued on every target's worker at once
    /// (`write_back`); a small one is written from the caller's buffer.
    pub(super) fn write_every_target(
        &self,
        region: &Region,
        offset: u64,
        data: &[u8],
    ) -> ArrayResult<()> {
        let pieces = split(region, offset, data.len());
        let guard = self.lock_stripes(region.group, pieces.iter().map(|p| p.map.stripe))?;
        // Every piece must reach at least one working copy.
        self.every_piece_has_a_copy(region, offset, &pieces)?;
        let mut plan = Vec::new();
        for p in &pieces {
            for t in p.map.targets.iter().filter(|t| !self.is_failed(t.member)) {
                plan.push((t.member, region.base + t.offset, p.buf_off, p.len));
            }
        }
        let runs = coalesce(plan.into_iter(), Merge::InPlace);
        let owned_jobs = || -> Vec<(usize, Op)> {
            // One copy for every target, aligned so that image files can
            // write it around their page cache.
            let (shared, payload) = WriteBuffer::copy_of(data);
            runs.iter()
                .map(|r| {
                    let span = r.span();
                    let op = Op::Write {
                        offset: r.member_offset,
                        data: Arc::clone(&shared),
                        range: payload.start + span.start..payload.start + span.end,
                    };
                    (r.slot, op)
                })
                .collect()
        };
        let slots: Vec<usize> = runs.iter().map(|r| r.slot).collect();
        if data.len() >= WRITE_BACK_MIN && runs.len() > 1 && self.may_write_back(&slots) {
            // Returns before the members have the data; see `write_back`.
            let first = pieces.iter().map(|p| p.map.stripe).min().unwrap_or(0);
            let last = pieces.iter().map(|p| p.map.stripe).max().unwrap_or(0);
            let held = super::stripe_lock::StripeLocks::hold(guard);
            self.write_back(region.group, (first, last), owned_jobs(), held);
            return self.ensure_writable();
        }
        let borrowed: Vec<(usize, u64, Vec<&[u8]>)> = runs
            .iter()
            .map(|r| (r.slot, r.member_offset, vec![&data[r.span()]]))
            .collect();
        let outcomes = match self.pool.write_inline(&borrowed) {
            Some(outcomes) => outcomes,
            None => self.pool.run(owned_jobs()),
        };
        let mut host = None;
        for (run, outcome) in runs.iter().zip(outcomes) {
            if let Err(e) = outcome {
                let span = (run.member_offset, run.member_offset + run.len as u64);
                host = host.or(self.write_failed(run.slot, &e, "write", Some(span)));
            }
        }
        drop(guard);
        if let Some(e) = host {
            return Err(e);
        }
        // A member whose write failed is failed now: some piece may have
        // lost its last copy.
        self.every_piece_has_a_copy(region, offset, &pieces)?;
        self.ensure_writable()
    }

    /// An error naming the first of `pieces` (of a write at region offset
    /// `offset`) with no working copy left.
    fn every_piece_has_a_copy(
        &self,
        region: &Region,
        offset: u64,
        pieces: &[Piece],
    ) -> ArrayResult<()> {
        match pieces
            .iter()
            .find(|p| p.map.targets.iter().all(|t| self.is_failed(t.member)))
        {
            Some(p) => Err(ArrayError::Failed(format!(
                "no working copy for group {} offset {:#x}",
                region.group,
                offset + p.buf_off as u64
            ))),
            None => Ok(()),
        }
    }

    /// Wait until no queued write (`write_back`) covers the stripes of
    /// `pieces`: reads take no stripe locks. The host's error while a write
    /// it refused covers them ([`Array::wait_unqueued`]).
    pub(super) fn wait_written(&self, region: &Region, pieces: &[Piece]) -> ArrayResult<()> {
        let first = pieces.iter().map(|p| p.map.stripe).min();
        let last = pieces.iter().map(|p| p.map.stripe).max();
        match (first, last) {
            (Some(first), Some(last)) => self.wait_unqueued(region.group, first, last),
            _ => Ok(()),
        }
    }
}

/// Member offsets (absolute) that a write of `len` bytes at region offset
/// `offset` touches on some member, whole chunks, parity included.
pub(super) fn member_span(region: &Region, offset: u64, len: usize) -> (u64, u64) {
    let g = &region.geometry;
    let first = g.map(offset);
    let last = g.map(offset + len as u64 - 1);
    let lo = first.targets.iter().map(|t| t.offset).min().unwrap_or(0) / g.chunk * g.chunk;
    let hi = (last.targets.iter().map(|t| t.offset).max().unwrap_or(0) / g.chunk + 1) * g.chunk;
    (region.base + lo, region.base + hi)
}
