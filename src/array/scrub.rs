//! Scrub: read every stripe of allocated groups and compare its redundancy
//! (parity recomputed from the data, or every mirror copy against the first),
//! counting mismatched bytes as md's mismatch_cnt does; repair rewrites the
//! parity or the other copies.

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
                    self.fail_member(m, &format!("read failed during scrub: {e}"));
                    return Ok(0);
                }
            }
        }
        let k = g.data_chunks();
        let data: Vec<&[u8]> = blocks[..k].iter().map(|b| b.as_slice()).collect();
        let mut parity = vec![vec![0u8; chunk]; members.len() - k];
        match parity.as_mut_slice() {
            [p] => self.parity.xor_gen(&data, p),
            [p, q] => self.parity.pq_gen(&data, p, q),
            _ => {}
        }
        let mut bad = 0;
        let mut writes = Vec::new();
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
                    self.fail_member(t.member, &format!("read failed during scrub: {e}"));
                    return Ok(0);
                }
            }
        }
        let Some(((_, reference), others)) = copies.split_first() else {
            return Ok(0);
        };
        let shared: Arc<[u8]> = Arc::from(reference.as_slice());
        let mut bad = 0;
        let mut writes = Vec::new();
        for (t, bytes) in others {
            let differing = diff_bytes(bytes, reference);
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

    fn run_repairs(&self, writes: Vec<(usize, Op)>) -> ArrayResult<()> {
        if writes.is_empty() {
            return Ok(());
        }
        let slots: Vec<usize> = writes.iter().map(|(s, _)| *s).collect();
        for (slot, outcome) in slots.into_iter().zip(self.pool.run(writes)) {
            if let Err(e) = outcome {
                self.fail_member(slot, &format!("write failed during repair: {e}"));
            }
        }
        self.ensure_writable()
            .map_err(|e| ArrayError::Failed(e.to_string()))
    }
}

fn diff_bytes(a: &[u8], b: &[u8]) -> u64 {
    a.iter().zip(b).filter(|(x, y)| x != y).count() as u64
}
