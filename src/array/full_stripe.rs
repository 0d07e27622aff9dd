//! Full-stripe writes on RAID5/6: the fast path for large sequential I/O.
//!
//! When a request covers whole stripes, no old data is needed: parity is
//! computed straight from the caller's buffer, the data is copied once into
//! one contiguous buffer per member (a run of consecutive stripes lands
//! contiguously on every member), and every member gets a single write in
//! one batch. The general path (`write_stripe`) would zero a block per
//! chunk, copy the data in, copy it again into a shared buffer, and wait
//! for the slowest member once per stripe.

use super::io::Piece;
use super::worker::Op;
use super::{Array, ArrayResult, Region};
use std::sync::Arc;

/// Whether `pieces` (all of one stripe) cover every data chunk whole.
pub(super) fn covers_stripe(region: &Region, pieces: &[Piece]) -> bool {
    let chunk = region.geometry.chunk as usize;
    pieces.len() == region.geometry.data_chunks()
        && pieces
            .iter()
            .all(|p| p.map.offset_in_chunk == 0 && p.len == chunk)
}

impl Array {
    /// Write `stripes` (consecutive stripe numbers, each fully covered by
    /// its pieces of `data`) with their parity, one write per member.
    pub(super) fn write_full_stripes(
        &self,
        region: &Region,
        stripes: &[&[Piece]],
        data: &[u8],
    ) -> ArrayResult<()> {
        let geometry = region.geometry;
        let k = geometry.data_chunks();
        let chunk = geometry.chunk as usize;
        let first = stripes[0][0].map.stripe;
        let _guard = self
            .locks
            .lock_all(region.group, stripes.iter().map(|s| s[0].map.stripe));
        self.ensure_writable()?;

        let span = stripes.len() * chunk;
        let mut buffers: Vec<Option<Arc<[u8]>>> = vec![None; self.slots.len()];
        for (j, pieces) in stripes.iter().enumerate() {
            let members = self.stripe_slots(region, first + j as u64);
            let mut sources: Vec<&[u8]> = vec![&[]; k];
            for p in pieces.iter() {
                sources[p.map.data_index] = &data[p.buf_off..p.buf_off + chunk];
            }
            let at = j * chunk..(j + 1) * chunk;
            for (i, source) in sources.iter().enumerate() {
                let buffer = buffers[members[i]].get_or_insert_with(|| zeroed(span));
                unique(buffer)[at.clone()].copy_from_slice(source);
            }
            // Parity goes straight into its members' buffers; taking them
            // out lets two of them be borrowed mutably at once.
            let mut parity: Vec<Arc<[u8]>> = members[k..]
                .iter()
                .map(|&m| buffers[m].take().unwrap_or_else(|| zeroed(span)))
                .collect();
            match parity.as_mut_slice() {
                [p] => self.parity.xor_gen(&sources, &mut unique(p)[at.clone()]),
                [p, q] => {
                    let (p, q) = (&mut unique(p)[at.clone()], &mut unique(q)[at.clone()]);
                    self.parity.pq_gen(&sources, p, q);
                }
                _ => {}
            }
            for (&m, buffer) in members[k..].iter().zip(parity) {
                buffers[m] = Some(buffer);
            }
        }

        let offset = region.base + first * geometry.chunk;
        let (slots, jobs): (Vec<usize>, Vec<(usize, Op)>) = buffers
            .into_iter()
            .enumerate()
            .filter(|(slot, _)| !self.is_failed(*slot))
            .filter_map(|(slot, buffer)| {
                let data = buffer?;
                let op = Op::Write {
                    offset,
                    range: 0..data.len(),
                    data,
                };
                Some((slot, (slot, op)))
            })
            .unzip();
        for (slot, outcome) in slots.into_iter().zip(self.pool.run(jobs)) {
            if let Err(e) = outcome {
                self.write_failed(slot, &format!("write failed: {e}"));
            }
        }
        self.ensure_writable()
    }
}

/// A zero-filled shared buffer, allocated in place: building the
/// `Arc<[u8]>` from a `Vec` would copy it once more.
fn zeroed(len: usize) -> Arc<[u8]> {
    // SAFETY: every bit pattern, all zeros included, is a valid u8.
    unsafe { Arc::<[u8]>::new_zeroed_slice(len).assume_init() }
}

/// The bytes of a buffer this module built and has not handed out yet.
fn unique(buffer: &mut Arc<[u8]>) -> &mut [u8] {
    Arc::get_mut(buffer).expect("stripe buffers are shared only once submitted")
}
