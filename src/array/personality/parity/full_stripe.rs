//! Full-stripe writes on RAID5/6: the fast path for large sequential I/O.
//!
//! When a request covers whole stripes, no old data is needed: parity is
//! computed straight from the caller's buffer, and every member gets a
//! single vectored write of its chunks (a run of consecutive stripes lands
//! contiguously on every member) straight from that buffer, with no copy
//! (members that need owned buffers, for a worker, get a gathered copy).
//! The general path (`write_stripe`) would zero a block per chunk, copy the
//! data in, copy it again into a shared buffer, and wait for the slowest
//! member once per stripe.

use crate::array::io::Piece;
use crate::array::stripe_lock::StripeLocks;
use crate::array::worker::Op;
use crate::array::write_buffer::WriteBuffer;
use crate::array::{Array, ArrayError, ArrayResult, Region};
use std::sync::Arc;

/// Whether `pieces` (all of one stripe) cover every data chunk whole.
pub(in crate::array) fn covers_stripe(region: &Region, pieces: &[Piece]) -> bool {
    let chunk = region.geometry.chunk as usize;
    pieces.len() == region.geometry.data_chunks()
        && pieces
            .iter()
            .all(|p| p.map.offset_in_chunk == 0 && p.len == chunk)
}

impl Array {
    /// Write `stripes` (consecutive stripe numbers, each fully covered by
    /// its pieces of `data`) with their parity, one write per member.
    pub(in crate::array) fn write_full_stripes(
        &self,
        region: &Region,
        stripes: &[&[Piece]],
        data: &[u8],
    ) -> ArrayResult<()> {
        let geometry = region.geometry;
        let k = geometry.data_chunks();
        let chunk = geometry.chunk as usize;
        let first = stripes[0][0].map.stripe;
        let guard = self.lock_stripes(region.group, stripes.iter().map(|s| s[0].map.stripe))?;
        self.ensure_writable()?;

        // Parity first, into one buffer per parity position covering every
        // stripe (seeded with a copy of the first chunk, which the kernels
        // overwrite: the buffers are never zeroed).
        let span = stripes.len() * chunk;
        let parity_count = geometry.members - k;
        let mut parity: Vec<WriteBuffer> =
            (0..parity_count).map(|_| WriteBuffer::new(span)).collect();
        let mut members_of = Vec::with_capacity(stripes.len());
        for (j, pieces) in stripes.iter().enumerate() {
            let mut sources: Vec<&[u8]> = vec![&[]; k];
            for p in pieces.iter() {
                sources[p.map.data_index] = &data[p.buf_off..p.buf_off + chunk];
            }
            match parity.as_mut_slice() {
                [p] => self.parity.xor_gen(&sources, p.append(sources[0])),
                [p, q] => {
                    let (p, q) = (p.append(sources[0]), q.append(sources[0]));
                    self.parity.pq_gen(&sources, p, q);
                }
                _ => {}
            }
            members_of.push((self.stripe_slots(region, first + j as u64), sources));
        }
        let parity: Vec<(Arc<[u8]>, std::ops::Range<usize>)> = parity
            .into_iter()
            .map(|b| {
                b.finish()
                    .ok_or_else(|| ArrayError::Failed("parity buffer left partly unwritten".into()))
            })
            .collect::<ArrayResult<_>>()?;

        // Each member's chunks, stripe after stripe, land contiguously on it:
        // its data chunks straight from the caller's buffer, its parity
        // chunks from the parity buffers.
        let mut parts: Vec<Vec<&[u8]>> = vec![Vec::new(); self.slots.len()];
        for (j, (members, sources)) in members_of.iter().enumerate() {
            for (i, &slot) in members.iter().enumerate() {
                let part = match sources.get(i) {
                    Some(source) => *source,
                    None => {
                        let (bytes, payload) = &parity[i - k];
                        &bytes[payload.start + j * chunk..payload.start + (j + 1) * chunk]
                    }
                };
                parts[slot].push(part);
            }
        }
        let offset = region.base + first * geometry.chunk;
        let writes: Vec<(usize, u64, Vec<&[u8]>)> = parts
            .into_iter()
            .enumerate()
            .filter(|(slot, parts)| !parts.is_empty() && !self.is_failed(*slot))
            .map(|(slot, parts)| (slot, offset, parts))
            .collect();
        // Workers need owned buffers: each member's parts, gathered.
        let owned_jobs = |writes: &[(usize, u64, Vec<&[u8]>)]| -> Vec<(usize, Op)> {
            writes
                .iter()
                .map(|(slot, offset, parts)| {
                    let mut buffer = WriteBuffer::new(parts.iter().map(|p| p.len()).sum());
                    parts.iter().for_each(|part| {
                        buffer.append(part);
                    });
                    let (data, range) = buffer.finish().unwrap_or_else(|| {
                        let whole: Arc<[u8]> = Arc::from(parts.concat());
                        let range = 0..whole.len();
                        (whole, range)
                    });
                    (
                        *slot,
                        Op::Write {
                            offset: *offset,
                            data,
                            range,
                        },
                    )
                })
                .collect()
        };
        let slots: Vec<usize> = writes.iter().map(|w| w.0).collect();
        if self.may_write_back(&slots) {
            // Returns before the members have the data; see `write_back`.
            let last = first + stripes.len() as u64 - 1;
            let held = StripeLocks::hold(guard);
            self.write_back(region.group, (first, last), owned_jobs(&writes), held);
            return self.ensure_writable();
        }
        let outcomes = match self.pool.write_inline(&writes) {
            Some(outcomes) => outcomes,
            None => self.pool.run(owned_jobs(&writes)),
        };
        let mut host = None;
        for ((slot, outcome), (_, at, parts)) in slots.iter().zip(outcomes).zip(&writes) {
            if let Err(e) = outcome {
                let len: usize = parts.iter().map(|p| p.len()).sum();
                let span = Some((*at, *at + len as u64));
                host = host.or(self.write_failed(*slot, &e, "write", span));
            }
        }
        if let Some(e) = host {
            return Err(e);
        }
        self.ensure_writable()
    }
}
