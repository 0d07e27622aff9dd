//! Reads and writes of logical ranges: mirror and parity paths, degraded
//! reads by reconstruction, read-modify-write versus reconstruct-write, and
//! member failure on I/O errors.

use super::bitmap::Intent;
use super::worker::Op;
use super::{full_stripe, Array, ArrayError, ArrayResult, Region};
use crate::geometry::{Level, Mapping, Target};
use std::sync::atomic::Ordering;
use std::sync::Arc;

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

pub(super) fn is_mirror(level: Level) -> bool {
    matches!(level, Level::Raid1 | Level::Raid10)
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
/// one member that are also consecutive in the caller's buffer, so one
/// member read fills them in place.
struct Run {
    slot: usize,
    member_offset: u64,
    len: usize,
    /// (offset in the run, offset in the caller's buffer, length)
    parts: Vec<(usize, usize, usize)>,
}

impl Run {
    /// The bytes of the caller's buffer the run covers (`coalesce` only
    /// merges parts contiguous there).
    fn span(&self) -> std::ops::Range<usize> {
        let at = self.parts.first().map_or(0, |p| p.1);
        at..at + self.len
    }
}

/// Merge consecutive pieces that land contiguously on the same member.
fn coalesce(items: impl Iterator<Item = (usize, u64, usize, usize)>) -> Vec<Run> {
    let mut runs: Vec<Run> = Vec::new();
    for (slot, member_offset, buf_off, len) in items {
        if let Some(last) = runs.iter_mut().rev().find(|r| r.slot == slot) {
            let (_, last_buf, last_len) = last.parts[last.parts.len() - 1];
            if last.member_offset + last.len as u64 == member_offset
                && last_buf + last_len == buf_off
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
        let (region, offset) = self.region(addr, buf.len())?;
        self.read_region(&region, offset, buf, Choice::Any)
    }

    /// Write `data` at logical `addr` to every copy, or with parity.
    pub fn write(&self, addr: u64, data: &[u8]) -> ArrayResult<()> {
        self.sync.foreground.fetch_add(1, Ordering::Relaxed);
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
    fn sync_members(&self, ppl_header: Option<&[u8]>) -> Option<ArrayError> {
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

    /// Log the partial parity of a partial-stripe write on the stripe's
    /// parity member, durably, before the write starts. Returns whether an
    /// entry is now in flight (to be closed with `Ppl::done`).
    fn log_partial_parity(
        &self,
        region: &Region,
        stripe: u64,
        lo: usize,
        modified: &[usize],
        pp: &[u8],
        parity_slot: usize,
    ) -> ArrayResult<bool> {
        let Some(ppl) = &self.ppl else {
            return Ok(false);
        };
        if self.is_failed(parity_slot) || !ppl.fits(pp.len()) {
            return Ok(false);
        }
        let (offset, entry) = loop {
            match ppl.reserve(parity_slot, region.group, stripe, lo as u64, modified, pp) {
                Some(reserved) => break reserved,
                // A flush makes the logged writes durable and their entries obsolete.
                None => self.flush()?,
            }
        };
        let len = entry.len();
        let jobs = vec![(
            parity_slot,
            Op::Write {
                offset,
                data: Arc::from(entry),
                range: 0..len,
            },
        )];
        let written = self
            .pool
            .run(jobs)
            .pop()
            .unwrap_or_else(|| Err(std::io::Error::other("no result")));
        let synced = written.and_then(|_| {
            self.pool
                .run(vec![(parity_slot, Op::Sync)])
                .pop()
                .unwrap_or_else(|| Err(std::io::Error::other("no result")))
        });
        if let Err(e) = synced {
            if let Some(host) = self.write_failed(parity_slot, &e, "partial parity log write", None)
            {
                ppl.done();
                return Err(host);
            }
        }
        Ok(true)
    }

    /// Read every run into its part of `buf`, members in parallel. A lone
    /// run (every 4 KiB random read) is read in place on this thread.
    fn read_runs_into(&self, runs: &[Run], buf: &mut [u8]) -> Vec<std::io::Result<()>> {
        if let [run] = runs {
            return vec![self
                .pool
                .read_inline(run.slot, run.member_offset, &mut buf[run.span()])];
        }
        let jobs = runs
            .iter()
            .map(|r| {
                (
                    r.slot,
                    Op::Read {
                        offset: r.member_offset,
                        len: r.len,
                    },
                )
            })
            .collect();
        runs.iter()
            .zip(self.pool.run(jobs))
            .map(|(run, outcome)| {
                let bytes = outcome?;
                buf[run.span()].copy_from_slice(&bytes[..run.len]);
                Ok(())
            })
            .collect()
    }

    pub(crate) fn read_region(
        &self,
        region: &Region,
        offset: u64,
        buf: &mut [u8],
        choice: Choice,
    ) -> ArrayResult<()> {
        if is_mirror(region.geometry.level) {
            self.read_mirror(region, offset, buf, choice)
        } else {
            self.read_striped(region, offset, buf, choice)
        }
    }

    fn read_mirror(
        &self,
        region: &Region,
        offset: u64,
        buf: &mut [u8],
        choice: Choice,
    ) -> ArrayResult<()> {
        let pieces = split(region, offset, buf.len());
        // Each round either succeeds or fails at least one more member, so
        // this ends after at most `members` rounds.
        for _ in 0..=self.slots.len() {
            let mut plan = Vec::with_capacity(pieces.len());
            let mut follow: Option<(usize, u64)> = None;
            for p in &pieces {
                let target = match choice {
                    Choice::Copy(n) => p
                        .map
                        .targets
                        .get(n)
                        .filter(|t| self.readable(t.member, region, t.offset)),
                    _ => {
                        let rest = (buf.len() - p.buf_off) as u64;
                        let readable = |t: &Target| self.readable(t.member, region, t.offset);
                        self.balance.choose_following(
                            &p.map.targets,
                            region.base,
                            rest,
                            follow,
                            readable,
                        )
                    }
                };
                let Some(t) = target else {
                    return Err(ArrayError::Failed(format!(
                        "no working copy of logical {:#x} in group {}",
                        offset + p.buf_off as u64,
                        region.group
                    )));
                };
                plan.push((t.member, region.base + t.offset, p.buf_off, p.len));
                follow = Some((t.member, region.base + t.offset + p.len as u64));
            }
            let runs = coalesce(plan.into_iter());
            runs.iter()
                .for_each(|r| self.balance.issue(r.slot, r.member_offset, r.len as u64));
            let started = std::time::Instant::now();
            let outcomes = self.read_runs_into(&runs, buf);
            let elapsed = started.elapsed();
            runs.iter()
                .for_each(|r| self.balance.complete(r.slot, elapsed));
            let mut retry = false;
            for (run, outcome) in runs.iter().zip(outcomes) {
                if let Err(e) = outcome {
                    if let Some(host) = self.read_failed(run.slot, &e, "read") {
                        return Err(host);
                    }
                    retry = true;
                }
            }
            if !retry {
                return Ok(());
            }
        }
        Err(ArrayError::Failed("mirror read kept failing".into()))
    }

    fn read_striped(
        &self,
        region: &Region,
        offset: u64,
        buf: &mut [u8],
        choice: Choice,
    ) -> ArrayResult<()> {
        let pieces = split(region, offset, buf.len());
        if let (Some(first), Some(last)) = (pieces.first(), pieces.last()) {
            self.write_out_cached(
                (region.group, first.map.stripe)..=(region.group, last.map.stripe),
            )?;
            self.write_back
                .wait_for(region.group, first.map.stripe, last.map.stripe);
        }
        // Only mirrors have a choice; a parity suspect is tried under the
        // stripe locks by `verify`.
        let _ = choice;
        let suspect = None;
        let mut direct = Vec::new();
        let mut degraded = Vec::new();
        for (i, p) in pieces.iter().enumerate() {
            let t = p.map.targets[0];
            if !self.readable(t.member, region, t.offset) || Some(t.member) == suspect {
                degraded.push(i);
            } else {
                direct.push(i);
            }
        }
        let runs = coalesce(direct.iter().map(|&i| {
            let p = &pieces[i];
            (
                p.map.targets[0].member,
                region.base + p.map.targets[0].offset,
                p.buf_off,
                p.len,
            )
        }));
        let outcomes = self.read_runs_into(&runs, buf);
        for (run, outcome) in runs.iter().zip(outcomes) {
            if let Err(e) = outcome {
                if let Some(host) = self.read_failed(run.slot, &e, "read") {
                    return Err(host);
                }
                for &(_, buf_off, _) in &run.parts {
                    degraded.extend(pieces.iter().position(|p| p.buf_off == buf_off));
                }
            }
        }
        for i in degraded {
            let p = &pieces[i];
            let lo = p.map.offset_in_chunk as usize;
            let blocks = self.reconstruct(region, p.map.stripe, lo, p.len, suspect)?;
            buf[p.buf_off..p.buf_off + p.len].copy_from_slice(&blocks[p.map.data_index]);
        }
        Ok(())
    }

    /// Read every block (data, then P, then Q) of `stripe` over
    /// `[lo, lo + len)` within the chunk, rebuilding those on failed members
    /// (and on `suspect`) from the others.
    fn reconstruct(
        &self,
        region: &Region,
        stripe: u64,
        lo: usize,
        len: usize,
        suspect: Option<usize>,
    ) -> ArrayResult<Vec<Vec<u8>>> {
        let _guard = self.locks.lock_all(region.group, [stripe]);
        self.reconstruct_locked(region, stripe, lo, len, suspect)
    }

    pub(crate) fn stripe_slots(&self, region: &Region, stripe: u64) -> Vec<usize> {
        let sm = region.geometry.stripe_members(stripe);
        sm.data.iter().copied().chain(sm.p).chain(sm.q).collect()
    }

    pub(crate) fn reconstruct_locked(
        &self,
        region: &Region,
        stripe: u64,
        lo: usize,
        len: usize,
        suspect: Option<usize>,
    ) -> ArrayResult<Vec<Vec<u8>>> {
        let geometry = region.geometry;
        let members = self.stripe_slots(region, stripe);
        let within = stripe * geometry.chunk + lo as u64;
        let at = region.base + within;
        for _ in 0..=self.slots.len() {
            let missing: Vec<usize> = (0..members.len())
                .filter(|&i| {
                    !self.readable(members[i], region, within + len as u64 - 1)
                        || Some(members[i]) == suspect
                })
                .collect();
            if missing.len() > geometry.tolerance() {
                return Err(ArrayError::Failed(format!(
                    "stripe {stripe} of group {} has {} unreadable members",
                    region.group,
                    missing.len()
                )));
            }
            let present: Vec<usize> = (0..members.len())
                .filter(|i| !missing.contains(i))
                .collect();
            let outcomes = self.pool.run(
                present
                    .iter()
                    .map(|&i| (members[i], Op::Read { offset: at, len }))
                    .collect(),
            );
            let mut blocks: Vec<Vec<u8>> = vec![Vec::new(); members.len()];
            let mut retry = false;
            for (&i, outcome) in present.iter().zip(outcomes) {
                match outcome {
                    Ok(bytes) => blocks[i] = bytes,
                    Err(e) => {
                        if let Some(host) = self.read_failed(members[i], &e, "read") {
                            return Err(host);
                        }
                        retry = true;
                    }
                }
            }
            if retry {
                continue;
            }
            for &i in &missing {
                blocks[i] = vec![0u8; len];
            }
            self.recover(geometry.level, &mut blocks, &missing);
            return Ok(blocks);
        }
        Err(ArrayError::Failed(format!("stripe {stripe} kept failing")))
    }

    /// Rebuild `missing` blocks (indices into data.., P, Q) in place.
    pub(crate) fn recover(&self, level: Level, blocks: &mut [Vec<u8>], missing: &[usize]) {
        if missing.is_empty() {
            return;
        }
        match level {
            Level::Raid5 => {
                let m = missing[0];
                let (others, target) = split_out(blocks, m);
                self.parity.xor_gen(&others, target);
            }
            Level::Raid6 => {
                let mut refs: Vec<&mut [u8]> =
                    blocks.iter_mut().map(|b| b.as_mut_slice()).collect();
                self.parity.raid6_recover(&mut refs, missing);
            }
            Level::Raid0 | Level::Raid1 | Level::Raid10 => {}
        }
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
        let may_cache = caching == Caching::Allowed && !self.write_through();
        self.host_gate()?;
        self.ensure_writable()?;
        if data.is_empty() {
            return Ok(());
        }
        loop {
            match self.write_marked(region, offset, data, may_cache) {
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
        may_cache: bool,
    ) -> ArrayResult<()> {
        let (start, end) = member_span(region, offset, data.len());
        self.with_intent(start, end, || {
            self.write_unmarked(region, offset, data, may_cache)
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

    fn write_unmarked(
        &self,
        region: &Region,
        offset: u64,
        data: &[u8],
        may_cache: bool,
    ) -> ArrayResult<()> {
        match region.geometry.level {
            Level::Raid1 | Level::Raid10 | Level::Raid0 => self.write_plain(region, offset, data),
            Level::Raid5 | Level::Raid6 => {
                let pieces = split(region, offset, data.len());
                let mut stripes: Vec<&[Piece]> = Vec::new();
                let mut start = 0;
                while start < pieces.len() {
                    let stripe = pieces[start].map.stripe;
                    let end = pieces[start..]
                        .iter()
                        .position(|p| p.map.stripe != stripe)
                        .map_or(pieces.len(), |n| start + n);
                    stripes.push(&pieces[start..end]);
                    start = end;
                }
                // Runs of whole stripes (all of a large request but its ends)
                // go out together; partial ones are gathered in the stripe
                // cache, or written one by one.
                let whole = |s: &[Piece]| full_stripe::covers_stripe(region, s);
                let mut i = 0;
                while i < stripes.len() {
                    let run = stripes[i..].iter().take_while(|s| whole(s)).count();
                    if run > 0 {
                        let run_stripes = &stripes[i..i + run];
                        if may_cache {
                            let first = run_stripes[0][0].map.stripe;
                            self.stripe_cache
                                .supersede(region.group, first..=first + run as u64 - 1);
                        }
                        self.write_full_stripes(region, run_stripes, data)?;
                        i += run;
                    } else {
                        let cached = may_cache
                            && self.cache_partial_stripe(region, offset, stripes[i], data)?;
                        if !cached {
                            if may_cache {
                                // Older bytes of this stripe still gathered
                                // must not land after these.
                                let key = (region.group, stripes[i][0].map.stripe);
                                self.write_out_cached(key..=key)?;
                            }
                            self.write_stripe(region, stripes[i], data)?;
                        }
                        i += 1;
                    }
                }
                Ok(())
            }
        }
    }

    /// Mirrors and RAID0: every piece to every working target.
    fn write_plain(&self, region: &Region, offset: u64, data: &[u8]) -> ArrayResult<()> {
        let pieces = split(region, offset, data.len());
        let _guard = self
            .locks
            .lock_all(region.group, pieces.iter().map(|p| p.map.stripe));
        let mut plan = Vec::new();
        for p in &pieces {
            for t in p.map.targets.iter().filter(|t| !self.is_failed(t.member)) {
                plan.push((t.member, region.base + t.offset, p.buf_off, p.len));
            }
        }
        let runs = coalesce(plan.into_iter());
        let borrowed: Vec<(usize, u64, Vec<&[u8]>)> = runs
            .iter()
            .map(|r| (r.slot, r.member_offset, vec![&data[r.span()]]))
            .collect();
        let outcomes = match self.pool.write_inline(&borrowed) {
            Some(outcomes) => outcomes,
            None => {
                let shared: Arc<[u8]> = Arc::from(data);
                let jobs = runs
                    .iter()
                    .map(|r| {
                        let data = Arc::clone(&shared);
                        let range = r.span();
                        (
                            r.slot,
                            Op::Write {
                                offset: r.member_offset,
                                data,
                                range,
                            },
                        )
                    })
                    .collect();
                self.pool.run(jobs)
            }
        };
        let mut host = None;
        for (run, outcome) in runs.iter().zip(outcomes) {
            if let Err(e) = outcome {
                let span = (run.member_offset, run.member_offset + run.len as u64);
                host = host.or(self.write_failed(run.slot, &e, "write", Some(span)));
            }
        }
        if let Some(e) = host {
            return Err(e);
        }
        // Every piece must have reached at least one working copy.
        for p in &pieces {
            if p.map.targets.iter().all(|t| self.is_failed(t.member)) {
                return Err(ArrayError::Failed(format!(
                    "no working copy for group {} offset {:#x}",
                    region.group,
                    offset + p.buf_off as u64
                )));
            }
        }
        self.ensure_writable()
    }

    /// One parity stripe: full-stripe write, read-modify-write or
    /// reconstruct-write, whichever reads least; degraded stripes always
    /// reconstruct.
    fn write_stripe(&self, region: &Region, pieces: &[Piece], data: &[u8]) -> ArrayResult<()> {
        let geometry = region.geometry;
        let stripe = pieces[0].map.stripe;
        let k = geometry.data_chunks();
        let lo = pieces
            .iter()
            .map(|p| p.map.offset_in_chunk as usize)
            .min()
            .unwrap_or(0);
        let hi = pieces
            .iter()
            .map(|p| p.map.offset_in_chunk as usize + p.len)
            .max()
            .unwrap_or(0);
        let width = hi - lo;
        let members = self.stripe_slots(region, stripe);
        let nparity = members.len() - k;
        let at = region.base + stripe * geometry.chunk + lo as u64;

        // new[i]: the piece written to data chunk i, if any.
        let mut new: Vec<Option<&Piece>> = vec![None; k];
        for p in pieces {
            new[p.map.data_index] = Some(p);
        }
        let covers = |p: &Piece| p.map.offset_in_chunk as usize == lo && p.len == width;
        let overlay = |block: &mut [u8], p: &Piece| {
            let from = p.map.offset_in_chunk as usize - lo;
            block[from..from + p.len].copy_from_slice(&data[p.buf_off..p.buf_off + p.len]);
        };

        let _guard = self.locks.lock_all(region.group, [stripe]);
        self.ensure_writable()?;
        let touched = new.iter().filter(|n| n.is_some()).count();
        let full = new.iter().filter(|n| n.is_some_and(covers)).count();
        let last = stripe * geometry.chunk + hi as u64 - 1;
        let degraded = members.iter().any(|&m| !self.readable(m, region, last));

        let mut blocks: Vec<Vec<u8>>;
        let mut partial_parity: Option<Vec<u8>> = None;
        // A stripe a host fault may have left half written has parity that
        // cannot be trusted to update: it is recomputed from the data.
        let suspect = self.bitmap.is_suspect(at, at + width as u64);
        if !degraded && !suspect && touched + nparity < k - full {
            // Read-modify-write: old data of touched chunks and old parity.
            let wanted: Vec<usize> = (0..k)
                .filter(|&i| new[i].is_some())
                .chain(k..members.len())
                .collect();
            let outcomes = self.pool.run(
                wanted
                    .iter()
                    .map(|&i| {
                        (
                            members[i],
                            Op::Read {
                                offset: at,
                                len: width,
                            },
                        )
                    })
                    .collect(),
            );
            blocks = vec![Vec::new(); members.len()];
            let mut failed = false;
            for (&i, outcome) in wanted.iter().zip(outcomes) {
                match outcome {
                    Ok(b) => blocks[i] = b,
                    Err(e) => {
                        if let Some(host) = self.read_failed(members[i], &e, "read") {
                            return Err(host);
                        }
                        failed = true;
                    }
                }
            }
            if failed {
                drop(_guard);
                return self.write_stripe(region, pieces, data);
            }
            if self.ppl.is_some() && full < k {
                // Partial parity: old P without the chunks being modified.
                let mut pp = blocks[k].clone();
                for i in (0..k).filter(|&i| new[i].is_some()) {
                    self.parity.xor_into(&mut pp, &blocks[i]);
                }
                partial_parity = Some(pp);
            }
            let (data_blocks, parity_blocks) = blocks.split_at_mut(k);
            for i in 0..k {
                let Some(p) = new[i] else { continue };
                let mut updated = data_blocks[i].clone();
                overlay(&mut updated, p);
                let mut delta = data_blocks[i].clone();
                self.parity.xor_into(&mut delta, &updated);
                match parity_blocks {
                    [pp] => self.parity.xor_into(pp, &delta),
                    [pp, qq] => self.parity.pq_update(i, &delta, pp, qq),
                    _ => {}
                }
                data_blocks[i] = updated;
            }
        } else {
            // Reconstruct-write: the whole stripe window, rebuilt where needed.
            let must_read = (0..k).any(|i| !new[i].is_some_and(covers));
            blocks = if must_read {
                self.reconstruct_locked(region, stripe, lo, width, None)?
            } else {
                vec![vec![0u8; width]; members.len()]
            };
            if self.ppl.is_some() && full < k {
                // Partial parity: the chunks not being modified, as they are.
                let mut pp = vec![0u8; width];
                for i in (0..k).filter(|&i| new[i].is_none()) {
                    self.parity.xor_into(&mut pp, &blocks[i]);
                }
                partial_parity = Some(pp);
            }
            for i in 0..k {
                if let Some(p) = new[i] {
                    overlay(&mut blocks[i], p);
                }
            }
            let (data_blocks, parity_blocks) = blocks.split_at_mut(k);
            let refs: Vec<&[u8]> = data_blocks.iter().map(|b| b.as_slice()).collect();
            match parity_blocks {
                [pp] => self.parity.xor_gen(&refs, pp),
                [pp, qq] => self.parity.pq_gen(&refs, pp, qq),
                _ => {}
            }
        }

        let logged = match (&partial_parity, geometry.level) {
            (Some(pp), Level::Raid5) => {
                let modified: Vec<usize> = (0..k).filter(|&i| new[i].is_some()).collect();
                self.log_partial_parity(region, stripe, lo, &modified, pp, members[k])?
            }
            _ => false,
        };
        let result = self.write_stripe_blocks(&members, k, &new, blocks, at);
        if logged {
            if let Some(ppl) = &self.ppl {
                ppl.done();
            }
        }
        result
    }

    fn write_stripe_blocks(
        &self,
        members: &[usize],
        k: usize,
        new: &[Option<&Piece>],
        mut blocks: Vec<Vec<u8>>,
        at: u64,
    ) -> ArrayResult<()> {
        let len = blocks.iter().map(|b| b.len()).max().unwrap_or(0) as u64;
        // Write touched data chunks and the parity, on working members.
        let targets: Vec<usize> = (0..members.len())
            .filter(|&i| (i >= k || new[i].is_some()) && !self.is_failed(members[i]))
            .collect();
        let jobs = targets
            .iter()
            .map(|&i| {
                let bytes: Arc<[u8]> = Arc::from(std::mem::take(&mut blocks[i]));
                let len = bytes.len();
                (
                    members[i],
                    Op::Write {
                        offset: at,
                        data: bytes,
                        range: 0..len,
                    },
                )
            })
            .collect();
        let mut host = None;
        for (&i, outcome) in targets.iter().zip(self.pool.run(jobs)) {
            if let Err(e) = outcome {
                let span = Some((at, at + len));
                host = host.or(self.write_failed(members[i], &e, "write", span));
            }
        }
        if let Some(e) = host {
            return Err(e);
        }
        self.ensure_writable()
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

/// Split `blocks` into the others (shared) and block `m` (mutable).
fn split_out(blocks: &mut [Vec<u8>], m: usize) -> (Vec<&[u8]>, &mut [u8]) {
    let (before, rest) = blocks.split_at_mut(m);
    let (target, after) = rest.split_at_mut(1);
    let others = before
        .iter()
        .chain(after.iter())
        .map(|b| b.as_slice())
        .collect();
    (others, target[0].as_mut_slice())
}
