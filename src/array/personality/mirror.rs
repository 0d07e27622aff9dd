//! The mirror personality (RAID1, RAID10 near copies): reads go to one
//! copy chosen by the read balancer, writes to every working copy; a
//! verified read that fails tries every copy; scrub compares the copies of
//! each chunk; a rebuilt slot's rows are read from another copy; the array
//! survives as long as every chunk keeps one copy.

use super::super::io::{coalesce, split, Choice, Merge, Piece};
use super::super::judge::choose_copies;
use super::super::scrub::diff_bytes;
use super::super::worker::Op;
use super::super::{Array, ArrayError, ArrayResult, Region, GROUP_SHIFT};
use crate::geometry::{Geometry, Role, Target};
use std::collections::BTreeSet;
use std::sync::Arc;

/// Reads from this size on are split across non-rotational copies (see
/// `Balancer::splits_large_reads`): each copy gets at least 128 KiB.
const SPLIT_MIN: usize = 256 << 10;

/// Whether each logical chunk keeps a copy with `failed` slots gone. The
/// copy pattern repeats every `members` chunks.
pub(super) fn survives(g: &Geometry, failed: &[usize]) -> bool {
    (0..g.members as u64).all(|k| {
        g.map(k * g.chunk)
            .targets
            .iter()
            .any(|t| !failed.contains(&t.member))
    })
}

/// The logical chunks member rows `[row, row + n)` of `slot` hold a copy of
/// (writers of a mirror lock by logical chunk).
pub(super) fn lock_keys(g: &Geometry, slot: usize, row: u64, n: u64) -> Vec<u64> {
    (row..row + n)
        .filter_map(|r| match g.reverse(slot, r * g.chunk) {
            Role::Data { logical, .. } => Some(logical / g.chunk),
            _ => None,
        })
        .collect()
}

impl Array {
    pub(super) fn read_mirror(
        &self,
        region: &Region,
        offset: u64,
        buf: &mut [u8],
        choice: Choice,
    ) -> ArrayResult<()> {
        let pieces = split(region, offset, buf.len());
        self.wait_written(region, &pieces)?;
        // A large read on solid-state copies is split into one part per
        // copy, read in parallel: piece i goes to copy i * copies / pieces.
        let split_across = choice == Choice::Any
            && buf.len() >= SPLIT_MIN
            && pieces.len() > 1
            && pieces
                .first()
                .is_some_and(|p| self.balance.splits_large_reads(&p.map.targets));
        // Each round either succeeds or fails at least one more member, so
        // this ends after at most `members` rounds.
        for _ in 0..=self.slots.len() {
            let mut plan = Vec::with_capacity(pieces.len());
            let mut follow: Option<(usize, u64)> = None;
            for (i, p) in pieces.iter().enumerate() {
                let part = i * p.map.targets.len() / pieces.len();
                let preferred = split_across
                    .then(|| p.map.targets.get(part))
                    .flatten()
                    .filter(|t| self.readable(t.member, region, t.offset));
                let target = match choice {
                    _ if preferred.is_some() => preferred,
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
            let runs = coalesce(plan.into_iter(), Merge::InPlace);
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

    /// Read every copy; `None` when none passes. Otherwise `buf` holds the
    /// first that passes, and the members whose copy differs from it are
    /// returned (and rewritten when `repair`).
    pub(super) fn verify_mirror(
        &self,
        region: &Region,
        offset: u64,
        pieces: &[Piece],
        buf: &mut [u8],
        verify: &dyn Fn(&[u8]) -> bool,
        repair: bool,
    ) -> ArrayResult<Option<Vec<usize>>> {
        let versions: Vec<Option<Vec<u8>>> = (0..region.geometry.copies)
            .map(|n| {
                let mut copy = vec![0u8; buf.len()];
                self.read_region(region, offset, &mut copy, Choice::Copy(n))
                    .is_ok()
                    .then_some(copy)
            })
            .collect();
        let Some(good) = versions.iter().flatten().find(|v| verify(v)) else {
            return Ok(None);
        };
        buf.copy_from_slice(good);
        let mut bad = BTreeSet::new();
        let mut writes = Vec::new();
        let shared: Arc<[u8]> = Arc::from(&*buf);
        for (n, version) in versions.iter().enumerate() {
            let Some(bytes) = version else { continue };
            for p in pieces {
                let range = p.buf_off..p.buf_off + p.len;
                let Some(t) = p.map.targets.get(n) else {
                    continue;
                };
                if bytes[range.clone()] != buf[range.clone()] {
                    bad.insert(t.member);
                    writes.push((
                        t.member,
                        Op::Write {
                            offset: region.base + t.offset,
                            data: Arc::clone(&shared),
                            range,
                        },
                    ));
                }
            }
        }
        if repair {
            let _guard = self.lock_stripes(region.group, pieces.iter().map(|p| p.map.stripe))?;
            self.write_repairs(writes);
        }
        Ok(Some(bad.into_iter().collect()))
    }

    /// Scrub the logical chunks whose first copy lies in member rows
    /// `[row, row + n)`; returns mismatched bytes.
    pub(super) fn scrub_mirror_rows(
        &self,
        region: &Region,
        row: u64,
        n: u64,
        repair: bool,
    ) -> ArrayResult<u64> {
        let g = region.geometry;
        let (members, copies) = (g.members as u64, g.copies as u64);
        // Each logical chunk is handled in the step holding its first copy.
        let first = (row * members).div_ceil(copies);
        // The last row may hold the first copies of a chunk whose
        // other copies would fall outside the group: not a chunk.
        let chunks = g.capacity(self.sb.lock().group_size) / g.chunk;
        let end = ((row + n) * members).div_ceil(copies).min(chunks);
        let mut bad = 0;
        for k in first..end {
            bad += self.scrub_mirror_chunk(region, k, repair)?;
        }
        Ok(bad)
    }

    fn scrub_mirror_chunk(&self, region: &Region, k: u64, repair: bool) -> ArrayResult<u64> {
        let g = region.geometry;
        let chunk = g.chunk as usize;
        let map = g.map(k * g.chunk);
        self.prepare_judge(
            ((region.group as u64) << GROUP_SHIFT) + k * g.chunk,
            g.chunk,
        );
        let _guard = self.lock_stripes(region.group, [k])?;
        let targets: Vec<_> = map
            .targets
            .iter()
            .filter(|t| self.readable(t.member, region, t.offset + g.chunk - 1))
            .collect();
        if targets.len() < 2 {
            return Ok(0);
        }
        let outcomes = self.pool.run(
            targets
                .iter()
                .map(|t| {
                    (
                        t.member,
                        Op::Read {
                            offset: region.base + t.offset,
                            len: chunk,
                        },
                    )
                })
                .collect(),
        );
        let mut copies = Vec::new();
        for (t, outcome) in targets.iter().zip(outcomes) {
            match outcome {
                Ok(b) => copies.push((t, b)),
                Err(e) => {
                    if let Some(host) = self.read_failed(t.member, &e, "read during scrub") {
                        return Err(host);
                    }
                    return Ok(0);
                }
            }
        }
        let views: Vec<&[u8]> = copies.iter().map(|(_, b)| b.as_slice()).collect();
        let Some(reference) = self.reference_copy(region, k * g.chunk, &views) else {
            return Ok(0);
        };
        let shared: Arc<[u8]> = Arc::from(reference);
        let mut bad = 0;
        let mut writes = Vec::new();
        for (t, bytes) in &copies {
            let differing = diff_bytes(bytes, &shared);
            if differing > 0 {
                bad += differing;
                log::warn!(
                    "scrub: group {} chunk {k}: copy on {} disagrees in {differing} bytes",
                    region.group,
                    self.slots[t.member].name()
                );
                if repair {
                    writes.push((
                        t.member,
                        Op::Write {
                            offset: region.base + t.offset,
                            data: Arc::clone(&shared),
                            range: 0..chunk,
                        },
                    ));
                }
            }
        }
        self.run_repairs(writes)?;
        Ok(bad)
    }

    /// What every copy of a mirrored chunk at group offset `logical` should
    /// hold: the first copy (as md), except for blocks the content judge
    /// rejects there and passes on another copy. None without copies.
    fn reference_copy(&self, region: &Region, logical: u64, copies: &[&[u8]]) -> Option<Vec<u8>> {
        let first = copies.first()?;
        let mut reference = first.to_vec();
        if copies.iter().all(|c| c == first) {
            return Some(reference);
        }
        let Some(judge) = self.content_judge() else {
            return Some(reference);
        };
        let block = judge.block_size();
        let at = ((region.group as u64) << GROUP_SHIFT) + logical;
        for (b, &pick) in choose_copies(judge.as_ref(), at, copies).iter().enumerate() {
            if pick != 0 {
                let range = b * block..((b + 1) * block).min(reference.len());
                reference[range.clone()].copy_from_slice(&copies[pick][range]);
                log::warn!(
                    "scrub: logical block {:#x}: the first copy fails the filesystem's checksum and another passes; that one is kept",
                    at + (b * block) as u64
                );
            }
        }
        Some(reference)
    }

    /// A rebuild's content for member rows `[row, row + n)` of `slot`: each
    /// row is a copy of a logical chunk, read from another copy through the
    /// engine (rows past the region's last whole chunk are zeros).
    pub(crate) fn rebuild_mirror_rows(
        &self,
        region: &Region,
        slot: usize,
        row: u64,
        n: u64,
        out: &mut [u8],
    ) -> ArrayResult<()> {
        let geometry = region.geometry;
        let chunk = geometry.chunk as usize;
        let capacity = geometry.capacity(self.sb.lock().group_size);
        for i in 0..n {
            let rows = &mut out[i as usize * chunk..(i as usize + 1) * chunk];
            match geometry.reverse(slot, (row + i) * geometry.chunk) {
                Role::Data { logical, .. } if logical < capacity => {
                    self.read_region(region, logical, rows, Choice::Any)?;
                }
                _ => rows.fill(0),
            }
        }
        Ok(())
    }
}
