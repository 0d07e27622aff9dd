//! Scrub: read every stripe of allocated groups and compare its redundancy
//! (parity recomputed from the data, or every mirror copy against the first),
//! counting mismatched bytes as md's mismatch_cnt does; repair rewrites the
//! parity or the other copies, unless the filesystem's content judge shows
//! that the data or the first copy is what is wrong (see `judge`).

use super::judge::{choose_copies, ContentJudge};
use super::worker::Op;
use super::{Array, ArrayError, ArrayResult, Region};
use crate::geometry::Level;
use std::sync::Arc;

impl Array {
    /// Scrub member rows `[row, row + n)` of `region`; returns mismatched bytes.
    pub(crate) fn scrub_rows(
        &self,
        region: &Region,
        row: u64,
        n: u64,
        repair: bool,
    ) -> ArrayResult<u64> {
        match region.geometry.level {
            Level::Raid0 => Ok(0),
            Level::Raid5 | Level::Raid6 => {
                let mut bad = 0;
                for stripe in row..row + n {
                    bad += self.scrub_stripe(region, stripe, repair)?;
                }
                Ok(bad)
            }
            Level::Raid1 | Level::Raid10 => {
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
        }
    }

    fn scrub_stripe(&self, region: &Region, stripe: u64, repair: bool) -> ArrayResult<u64> {
        let g = region.geometry;
        let chunk = g.chunk as usize;
        let _guard = self.locks.lock_all(region.group, [stripe]);
        let members = self.stripe_slots(region, stripe);
        if members
            .iter()
            .any(|&m| !self.readable(m, region, (stripe + 1) * g.chunk - 1))
        {
            return Ok(0); // Degraded: nothing to compare against.
        }
        let at = region.base + stripe * g.chunk;
        let outcomes = self.pool.run(
            members
                .iter()
                .map(|&m| {
                    (
                        m,
                        Op::Read {
                            offset: at,
                            len: chunk,
                        },
                    )
                })
                .collect(),
        );
        let mut blocks = Vec::with_capacity(members.len());
        for (&m, outcome) in members.iter().zip(outcomes) {
            match outcome {
                Ok(b) => blocks.push(b),
                Err(e) => {
                    if let Some(host) = self.read_failed(m, &e, "read during scrub") {
                        return Err(host);
                    }
                    return Ok(0);
                }
            }
        }
        let k = g.data_chunks();
        let mut parity = self.parity_of(&blocks[..k], members.len() - k, chunk);
        let mut bad = 0;
        let mut writes = Vec::new();
        let mismatch = parity.iter().zip(&blocks[k..]).any(|(p, b)| p != b);
        let judge = self.content_judge().filter(|_| mismatch);
        if let Some(judge) = judge {
            let logical = ((region.group as u64) << super::GROUP_SHIFT) + stripe * g.stripe_bytes();
            let rebuilt = data_from_parity(judge.as_ref(), logical, chunk, &mut blocks, k);
            if !rebuilt.is_empty() {
                parity = self.parity_of(&blocks[..k], members.len() - k, chunk);
            }
            for (i, differing) in rebuilt {
                bad += differing;
                log::warn!(
                    "scrub: group {} stripe {stripe}: data on {} fails the filesystem's checksum in {differing} bytes; rebuilt from parity",
                    region.group,
                    self.slots[members[i]].name()
                );
                if repair {
                    writes.push((
                        members[i],
                        Op::Write {
                            offset: at,
                            data: Arc::from(blocks[i].as_slice()),
                            range: 0..chunk,
                        },
                    ));
                }
            }
        }
        for (i, fresh) in parity.into_iter().enumerate() {
            let differing = diff_bytes(&blocks[k + i], &fresh);
            if differing > 0 {
                bad += differing;
                log::warn!(
                    "scrub: group {} stripe {stripe}: parity on {} disagrees in {differing} bytes",
                    region.group,
                    self.slots[members[k + i]].name()
                );
                if repair {
                    writes.push((
                        members[k + i],
                        Op::Write {
                            offset: at,
                            data: Arc::from(fresh),
                            range: 0..chunk,
                        },
                    ));
                }
            }
        }
        self.run_repairs(writes)?;
        Ok(bad)
    }

    fn scrub_mirror_chunk(&self, region: &Region, k: u64, repair: bool) -> ArrayResult<u64> {
        let g = region.geometry;
        let chunk = g.chunk as usize;
        let map = g.map(k * g.chunk);
        let _guard = self.locks.lock_all(region.group, [k]);
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

    /// P (and Q) of `data`, `count` chunks of `chunk` bytes.
    fn parity_of(&self, data: &[Vec<u8>], count: usize, chunk: usize) -> Vec<Vec<u8>> {
        let data: Vec<&[u8]> = data.iter().map(|b| b.as_slice()).collect();
        let mut parity = vec![vec![0u8; chunk]; count];
        match parity.as_mut_slice() {
            [p] => self.parity.xor_gen(&data, p),
            [p, q] => self.parity.pq_gen(&data, p, q),
            _ => {}
        }
        parity
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
        let at = ((region.group as u64) << super::GROUP_SHIFT) + logical;
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

    fn run_repairs(&self, writes: Vec<(usize, Op)>) -> ArrayResult<()> {
        if writes.is_empty() {
            return Ok(());
        }
        let slots: Vec<usize> = writes.iter().map(|(s, _)| *s).collect();
        let mut host = None;
        for (slot, outcome) in slots.into_iter().zip(self.pool.run(writes)) {
            if let Err(e) = outcome {
                host = host.or(self.write_failed(slot, &e, "write during repair", None));
            }
        }
        if let Some(e) = host {
            return Err(e);
        }
        self.ensure_writable()
            .map_err(|e| ArrayError::Failed(e.to_string()))
    }
}

fn diff_bytes(a: &[u8], b: &[u8]) -> u64 {
    a.iter().zip(b).filter(|(x, y)| x != y).count() as u64
}

/// Data blocks of a stripe (`blocks`: `k` data chunks, then P) that the
/// judge rejects while the same block rebuilt from P and the other data
/// passes: each such block is replaced in `blocks`. Returns, per data chunk
/// changed, its index and how many of its bytes changed. `logical` is the
/// logical address of the stripe's first data byte.
fn data_from_parity(
    judge: &dyn ContentJudge,
    logical: u64,
    chunk: usize,
    blocks: &mut [Vec<u8>],
    k: usize,
) -> Vec<(usize, u64)> {
    let block = judge.block_size();
    let mut changed = Vec::new();
    for i in 0..k {
        let mut differing = 0;
        for start in (0..chunk).step_by(block) {
            let range = start..(start + block).min(chunk);
            let addr = logical + (i * chunk + start) as u64;
            if judge.judge(addr, &blocks[i][range.clone()]) != Some(false) {
                continue;
            }
            let mut rebuilt = blocks[k][range.clone()].to_vec();
            for other in blocks[..k]
                .iter()
                .enumerate()
                .filter(|(j, _)| *j != i)
                .map(|(_, o)| o)
            {
                rebuilt
                    .iter_mut()
                    .zip(&other[range.clone()])
                    .for_each(|(r, o)| *r ^= o);
            }
            if judge.judge(addr, &rebuilt) == Some(true) {
                differing += diff_bytes(&blocks[i][range.clone()], &rebuilt);
                blocks[i][range].copy_from_slice(&rebuilt);
            }
        }
        if differing > 0 {
            changed.push((i, differing));
        }
    }
    changed
}
