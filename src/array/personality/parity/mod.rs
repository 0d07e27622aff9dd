//! The parity personality (RAID5: P; RAID6: P and Q): reads go to the
//! chunk's member and are rebuilt from the rest of the stripe when it
//! cannot serve; writes of whole stripes compute parity from the new data
//! alone (`full_stripe`, queued by the engine's `write_back`), partial ones gather in
//! the `stripe_cache` or pick read-modify-write or reconstruct-write, with
//! RAID5's partial parity log (`ppl`) closing the write hole; a verified
//! read that fails tries each member as the suspect; scrub recomputes the
//! parity; a rebuilt slot's rows are computed from the survivors' rows;
//! the array survives as many lost members as it has syndromes.

pub(crate) mod full_stripe;
pub mod ppl;
pub(crate) mod stripe_cache;

use super::super::io::{split, Caching, Piece};
use super::super::judge::ContentJudge;
use super::super::scrub::diff_bytes;
use super::super::worker::Op;
use super::super::{Array, ArrayError, ArrayResult, Region, GROUP_SHIFT};
use super::{DiscardPlan, Personality, Syndromes};
use std::collections::BTreeSet;
use std::sync::Arc;

impl Array {
    /// Read the data chunks' members directly; a piece whose member cannot
    /// serve is rebuilt from the rest of its stripe. Gathered and
    /// written-back writes of those stripes land first.
    pub(super) fn read_parity(
        &self,
        region: &Region,
        offset: u64,
        buf: &mut [u8],
    ) -> ArrayResult<()> {
        let pieces = split(region, offset, buf.len());
        if let (Some(first), Some(last)) = (pieces.first(), pieces.last()) {
            self.write_out_cached(
                (region.group, first.map.stripe)..=(region.group, last.map.stripe),
            )?;
        }
        self.wait_written(region, &pieces)?;
        let degraded = self.read_pieces_direct(region, &pieces, buf)?;
        // A parity suspect is tried under the stripe locks by `verify_parity`.
        let suspect = None;
        for i in degraded {
            let p = &pieces[i];
            let lo = p.map.offset_in_chunk as usize;
            let blocks = self.reconstruct(region, p.map.stripe, lo, p.len, suspect)?;
            buf[p.buf_off..p.buf_off + p.len].copy_from_slice(&blocks[p.map.data_index]);
        }
        Ok(())
    }

    /// Read `len` bytes at member offset `at` from the stripe's members
    /// `wanted` (indexes into `members`), in parallel. The blocks are
    /// indexed like `members`, empty where not wanted; `None` when a read
    /// failed without being the host's fault (the member may now be failed:
    /// the caller looks again), the host's fault as its error.
    fn read_blocks(
        &self,
        members: &[usize],
        wanted: &[usize],
        at: u64,
        len: usize,
        what: &str,
    ) -> ArrayResult<Option<Vec<Vec<u8>>>> {
        let outcomes = self.pool.run(
            wanted
                .iter()
                .map(|&i| (members[i], Op::Read { offset: at, len }))
                .collect(),
        );
        let mut blocks = vec![Vec::new(); members.len()];
        let mut failed = false;
        for (&i, outcome) in wanted.iter().zip(outcomes) {
            match outcome {
                Ok(bytes) => blocks[i] = bytes,
                Err(e) => {
                    if let Some(host) = self.read_failed(members[i], &e, what) {
                        return Err(host);
                    }
                    failed = true;
                }
            }
        }
        Ok((!failed).then_some(blocks))
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
        let _guard = self.lock_stripes(region.group, [stripe])?;
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
            let Some(mut blocks) = self.read_blocks(&members, &present, at, len, "read")? else {
                continue;
            };
            for &i in &missing {
                blocks[i] = vec![0u8; len];
            }
            self.recover(region.personality, &mut blocks, &missing);
            return Ok(blocks);
        }
        Err(ArrayError::Failed(format!("stripe {stripe} kept failing")))
    }

    /// Rebuild `missing` blocks (indices into data.., P, Q) in place.
    fn recover(&self, personality: Personality, blocks: &mut [Vec<u8>], missing: &[usize]) {
        if missing.is_empty() {
            return;
        }
        match personality {
            Personality::Parity(Syndromes::P) => {
                let m = missing[0];
                let (others, target) = split_out(blocks, m);
                self.parity.xor_gen(&others, target);
            }
            Personality::Parity(Syndromes::Pq) => {
                let mut refs: Vec<&mut [u8]> =
                    blocks.iter_mut().map(|b| b.as_mut_slice()).collect();
                self.parity.raid6_recover(&mut refs, missing);
            }
            Personality::Raid0 | Personality::Mirror(_) => {}
        }
    }

    /// Write whole stripes together, gather partial ones in the stripe
    /// cache (when `caching` allows and the host has space), or write them
    /// one by one.
    pub(super) fn write_parity(
        &self,
        region: &Region,
        offset: u64,
        data: &[u8],
        caching: Caching,
    ) -> ArrayResult<()> {
        // Every write but the cache's own write-outs orders itself after
        // the older bytes the cache holds for its stripes, also while it
        // may not be cached itself (the host short of space): entries a
        // full host refused stay cached, and one written out later must
        // not land over these bytes.
        let ordered = caching == Caching::Allowed;
        let may_cache = ordered && !self.write_through();
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
                if ordered {
                    let first = run_stripes[0][0].map.stripe;
                    self.stripe_cache
                        .supersede(region.group, first..=first + run as u64 - 1);
                }
                self.write_full_stripes(region, run_stripes, data)?;
                i += run;
            } else {
                let cached =
                    may_cache && self.cache_partial_stripe(region, offset, stripes[i], data)?;
                if !cached {
                    if ordered {
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
                // Not a full flush: this runs under the stripe's lock, often
                // inside a stripe-cache write-out, and a flush waits for
                // every write-out (this one too) to settle.
                None => self.roll_partial_parity_log(ppl)?,
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

        let _guard = self.lock_stripes(region.group, [stripe])?;
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
            let Some(read) = self.read_blocks(&members, &wanted, at, width, "read")? else {
                drop(_guard);
                return self.write_stripe(region, pieces, data);
            };
            blocks = read;
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

        let logged = match &partial_parity {
            Some(pp) if region.personality.keeps_partial_parity_log() => {
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

    /// Try each member holding part of the range as the suspect; `None` when
    /// no reconstruction passes. The suspect's chunks are rewritten from the
    /// reconstruction under the stripe locks, so parity stays consistent.
    pub(super) fn verify_parity(
        &self,
        region: &Region,
        pieces: &[Piece],
        buf: &mut [u8],
        verify: &dyn Fn(&[u8]) -> bool,
        repair: bool,
    ) -> ArrayResult<Option<Vec<usize>>> {
        let holders: BTreeSet<usize> = pieces.iter().map(|p| p.map.targets[0].member).collect();
        for suspect in holders {
            if self.is_failed(suspect) {
                continue;
            }
            let _guard = self.lock_stripes(region.group, pieces.iter().map(|p| p.map.stripe))?;
            let mut trial = vec![0u8; buf.len()];
            let rebuilt = pieces.iter().try_for_each(|p| {
                let lo = p.map.offset_in_chunk as usize;
                let blocks =
                    self.reconstruct_locked(region, p.map.stripe, lo, p.len, Some(suspect))?;
                trial[p.buf_off..p.buf_off + p.len].copy_from_slice(&blocks[p.map.data_index]);
                Ok::<(), ArrayError>(())
            });
            if rebuilt.is_err() || !verify(&trial) {
                continue;
            }
            buf.copy_from_slice(&trial);
            if repair {
                let shared: Arc<[u8]> = Arc::from(trial);
                let writes = pieces
                    .iter()
                    .filter(|p| p.map.targets[0].member == suspect)
                    .map(|p| {
                        let at = region.base + p.map.targets[0].offset;
                        (
                            suspect,
                            Op::Write {
                                offset: at,
                                data: Arc::clone(&shared),
                                range: p.buf_off..p.buf_off + p.len,
                            },
                        )
                    })
                    .collect();
                self.write_repairs(writes);
            }
            return Ok(Some(vec![suspect]));
        }
        Ok(None)
    }

    pub(super) fn scrub_stripe(
        &self,
        region: &Region,
        stripe: u64,
        repair: bool,
    ) -> ArrayResult<u64> {
        let g = region.geometry;
        let chunk = g.chunk as usize;
        // Answered bytes still gathered for this stripe land first: the
        // members agree with themselves without them, but the filesystem's
        // checksums judge by them, and a scrub that judged the older bytes
        // would "rebuild" them from parity, or find no good version at all.
        // While the host refuses their write-out, so does the scrub.
        let key = (region.group, stripe);
        self.write_out_cached(key..=key)?;
        self.prepare_judge(
            ((region.group as u64) << GROUP_SHIFT) + stripe * g.stripe_bytes(),
            g.stripe_bytes(),
        );
        let _guard = self.lock_stripes(region.group, [stripe])?;
        let members = self.stripe_slots(region, stripe);
        if members
            .iter()
            .any(|&m| !self.readable(m, region, (stripe + 1) * g.chunk - 1))
        {
            return Ok(0); // Degraded: nothing to compare against.
        }
        let at = region.base + stripe * g.chunk;
        let every: Vec<usize> = (0..members.len()).collect();
        let Some(mut blocks) =
            self.read_blocks(&members, &every, at, chunk, "read during scrub")?
        else {
            return Ok(0);
        };
        let k = g.data_chunks();
        let mut parity = self.parity_of(&blocks[..k], members.len() - k, chunk);
        let mut bad = 0;
        let mut writes = Vec::new();
        let mismatch = parity.iter().zip(&blocks[k..]).any(|(p, b)| p != b);
        let judge = self.content_judge().filter(|_| mismatch);
        if let Some(judge) = judge {
            let logical = ((region.group as u64) << GROUP_SHIFT) + stripe * g.stripe_bytes();
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

    /// A rebuild's content for member rows `[row, row + n)` of `slot`,
    /// computed straight from the survivors' buffers of those rows (`data`,
    /// by slot) into `out`; `scratch` stands in for a second missing member.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn rebuild_parity_rows(
        &self,
        region: &Region,
        slot: usize,
        row: u64,
        n: u64,
        data: &mut [Option<Vec<u8>>],
        out: &mut [u8],
        scratch: &mut Vec<u8>,
    ) -> ArrayResult<()> {
        let array = self;
        let geometry = region.geometry;
        let chunk = geometry.chunk as usize;
        if scratch.len() < chunk {
            scratch.resize(chunk, 0);
        }
        for i in 0..n as usize {
            let rows = i * chunk..(i + 1) * chunk;
            let stripe = row + i as u64;
            let members = array.stripe_slots(region, stripe);
            let target_out = &mut out[rows.clone()];
            let Some(target) = members.iter().position(|&m| m == slot) else {
                target_out.fill(0);
                continue;
            };
            let missing: Vec<usize> = (0..members.len())
                .filter(|&p| data[members[p]].is_none())
                .collect();
            if missing.len() > geometry.tolerance() {
                return Err(ArrayError::Failed(format!(
                    "stripe {stripe} cannot be rebuilt: too many members missing"
                )));
            }
            match region.personality {
                Personality::Parity(Syndromes::P) => {
                    let others: Vec<&[u8]> = members
                        .iter()
                        .filter(|&&m| m != slot)
                        .filter_map(|&m| data[m].as_deref().map(|b| &b[rows.clone()]))
                        .collect();
                    array.parity.xor_gen(&others, target_out);
                }
                Personality::Parity(Syndromes::Pq) => {
                    let mut by_slot: Vec<Option<&mut [u8]>> = data
                        .iter_mut()
                        .map(|b| b.as_deref_mut().map(|b| &mut b[rows.clone()]))
                        .collect();
                    let mut target_out = Some(target_out);
                    let mut scratch = Some(&mut scratch[..chunk]);
                    let mut blocks: Vec<&mut [u8]> = Vec::with_capacity(members.len());
                    for (p, &m) in members.iter().enumerate() {
                        let block = if p == target {
                            target_out.take()
                        } else if let Some(b) = by_slot[m].take() {
                            Some(b)
                        } else {
                            scratch.take()
                        };
                        blocks.push(block.ok_or_else(|| {
                            ArrayError::Failed(format!(
                                "stripe {stripe} cannot be rebuilt: too many members missing"
                            ))
                        })?);
                    }
                    array.parity.raid6_recover(&mut blocks, &missing);
                }
                Personality::Raid0 | Personality::Mirror(_) => {}
            }
        }
        Ok(())
    }
}

/// A discard of stripes `first..=last`: every member, data and parity
/// alike, from the first stripe's row to the last's (stripe `s` sits at
/// member offset `s * chunk` on every member), and that span for the bitmap.
pub(super) fn discard_plan(region: &Region, first: u64, last: u64) -> DiscardPlan {
    let g = &region.geometry;
    let start = region.base + first * g.chunk;
    let len = (last - first + 1) * g.chunk;
    let runs = (0..g.members).map(|m| (m, start, len)).collect();
    (runs, (start, start + len))
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
            match judge.judge(addr, &rebuilt) {
                Some(true) => {
                    differing += diff_bytes(&blocks[i][range.clone()], &rebuilt);
                    blocks[i][range].copy_from_slice(&rebuilt);
                }
                Some(false) => judge.no_good_version(addr),
                None => {}
            }
        }
        if differing > 0 {
            changed.push((i, differing));
        }
    }
    changed
}
