//! The write-intent bitmap: one bit per region of the members' data area,
//! set (durably, on every member) before any write to the region and cleared
//! lazily once the region has been quiet and flushed. After an unclean
//! shutdown only regions whose bit is set need a resync; a member that was
//! briefly out can be re-added and rebuilt from the set bits alone, because
//! bits are never cleared while the array is degraded.
//!
//! On-member layout (identical on every member), at [`BITMAP_OFFSET`]:
//! a 4 KiB header (magic, region size, bit count, events of the last
//! clearing, crc32c) followed by the bits, least significant bit first.

use crate::member::Member;
use parking_lot::Mutex;
use std::io;
use std::sync::Arc;

pub const BITMAP_OFFSET: u64 = 64 << 10;
const HEADER_SIZE: usize = 4096;
const BLOCK: usize = 4096;
const MAGIC: &[u8; 8] = b"RAIDBMP1";
/// Regions set ahead of a sequential writer (see [`Bitmap::begin_write`]).
const SEQUENTIAL_LOOKAHEAD: usize = 8;
/// Regions per member at most; the bits fit well before the data offset.
const MAX_REGIONS: u64 = 1024;

/// Region size: a power of two of at least 4 MiB and about 1/1024 of the
/// data area. Each region that turns dirty costs a synced bitmap write, so
/// regions are large (md's internal bitmaps use 64 MiB chunks on big arrays).
pub fn region_size(data_size: u64) -> u64 {
    let mut size = 4u64 << 20;
    while data_size.div_ceil(size) > MAX_REGIONS {
        size *= 2;
    }
    size
}

struct State {
    bits: Vec<u64>,
    /// Writes in flight per bit.
    pending: Vec<u16>,
    /// Bits written since the last cleaning pass.
    recent: Vec<u64>,
    events_cleared: u64,
}

pub struct Bitmap {
    /// Member offset where bit 0's region starts.
    data_offset: u64,
    region: u64,
    nbits: usize,
    state: Mutex<State>,
    /// Serialises bitmap block writes so an older block never lands last.
    writing: Mutex<()>,
}

fn test(words: &[u64], bit: usize) -> bool {
    words[bit / 64] & (1 << (bit % 64)) != 0
}

fn set(words: &mut [u64], bit: usize) {
    words[bit / 64] |= 1 << (bit % 64);
}

impl Bitmap {
    pub fn new(data_offset: u64, data_size: u64) -> Bitmap {
        let region = region_size(data_size);
        let nbits = data_size.div_ceil(region) as usize;
        let words = nbits.div_ceil(64);
        Bitmap {
            data_offset,
            region,
            nbits,
            state: Mutex::new(State {
                bits: vec![0; words],
                pending: vec![0; nbits],
                recent: vec![0; words],
                events_cleared: 0,
            }),
            writing: Mutex::new(()),
        }
    }

    fn bit_range(&self, start: u64, end: u64) -> std::ops::Range<usize> {
        let first = (start.saturating_sub(self.data_offset) / self.region) as usize;
        let last =
            (end.saturating_sub(self.data_offset).div_ceil(self.region) as usize).min(self.nbits);
        first.min(last)..last
    }

    fn bytes_len(&self) -> usize {
        self.nbits.div_ceil(8)
    }

    fn area_len(&self) -> usize {
        HEADER_SIZE + self.bytes_len().div_ceil(BLOCK) * BLOCK
    }

    fn encode_header(&self, events_cleared: u64) -> Vec<u8> {
        let mut h = vec![0u8; HEADER_SIZE];
        h[0..8].copy_from_slice(MAGIC);
        h[8..16].copy_from_slice(&self.region.to_le_bytes());
        h[16..24].copy_from_slice(&(self.nbits as u64).to_le_bytes());
        h[24..32].copy_from_slice(&events_cleared.to_le_bytes());
        let crc = crc32c::crc32c(&h[..HEADER_SIZE - 4]);
        h[HEADER_SIZE - 4..].copy_from_slice(&crc.to_le_bytes());
        h
    }

    fn bit_bytes(words: &[u64], nbytes: usize) -> Vec<u8> {
        let mut out: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        out.truncate(nbytes);
        out
    }

    /// Load the bits from every member (their union: a bit set anywhere
    /// counts). A member with no valid bitmap contributes nothing.
    pub fn load(&self, members: &[Arc<dyn Member>]) {
        let mut st = self.state.lock();
        for m in members {
            let mut area = vec![0u8; self.area_len()];
            if m.read_at(&mut area, BITMAP_OFFSET).is_err() {
                continue;
            }
            let h = &area[..HEADER_SIZE];
            let crc = u32::from_le_bytes([
                h[HEADER_SIZE - 4],
                h[HEADER_SIZE - 3],
                h[HEADER_SIZE - 2],
                h[HEADER_SIZE - 1],
            ]);
            if &h[0..8] != MAGIC || crc32c::crc32c(&h[..HEADER_SIZE - 4]) != crc {
                continue;
            }
            let region = u64::from_le_bytes(h[8..16].try_into().unwrap_or_default());
            let nbits = u64::from_le_bytes(h[16..24].try_into().unwrap_or_default());
            if region != self.region || nbits != self.nbits as u64 {
                log::warn!("{}: bitmap geometry differs; ignored", m.name());
                continue;
            }
            let cleared = u64::from_le_bytes(h[24..32].try_into().unwrap_or_default());
            st.events_cleared = st.events_cleared.max(cleared);
            let bytes = &area[HEADER_SIZE..HEADER_SIZE + self.bytes_len()];
            for (i, chunk) in bytes.chunks(8).enumerate() {
                let mut w = [0u8; 8];
                w[..chunk.len()].copy_from_slice(chunk);
                st.bits[i] |= u64::from_le_bytes(w);
            }
        }
    }

    /// Write the whole bitmap (header and bits) to `members`, synced.
    pub fn write_all(&self, members: &[Arc<dyn Member>]) -> Vec<(usize, io::Error)> {
        let _w = self.writing.lock();
        let (header, bits) = {
            let st = self.state.lock();
            (
                self.encode_header(st.events_cleared),
                Self::bit_bytes(&st.bits, self.bytes_len()),
            )
        };
        let mut area = header;
        area.extend_from_slice(&bits);
        area.resize(self.area_len(), 0);
        members
            .iter()
            .enumerate()
            .filter_map(|(i, m)| {
                m.write_at(&area, BITMAP_OFFSET)
                    .and_then(|()| m.sync())
                    .err()
                    .map(|e| (i, e))
            })
            .collect()
    }

    /// Before a write to member offsets `[start, end)`: count it in flight
    /// and return the bitmap blocks that must be written (and synced) first
    /// because a bit went from clear to set. Write them with [`Bitmap::blocks`]
    /// under [`Bitmap::write_guard`], so a newer block is never overwritten by
    /// an older snapshot.
    pub fn begin_write(&self, start: u64, end: u64) -> Option<Vec<usize>> {
        let range = self.bit_range(start, end);
        let mut st = self.state.lock();
        let mut newly = false;
        for b in range.clone() {
            st.pending[b] = st.pending[b].saturating_add(1);
            set(&mut st.recent, b);
            if !test(&st.bits, b) {
                set(&mut st.bits, b);
                newly = true;
            }
        }
        if !newly {
            return None;
        }
        // A writer moving on from the region just before is sequential: set
        // the next few regions in the same synced write, so a long copy pays
        // one bitmap sync per SEQUENTIAL_LOOKAHEAD regions instead of one
        // per region (each sync waits for every member's disk). After a
        // crash that costs at most that many extra regions of resync.
        let mut end = range.end;
        if range.start > 0 && test(&st.bits, range.start - 1) {
            end = (range.end + SEQUENTIAL_LOOKAHEAD).min(self.nbits);
            for b in range.end..end {
                set(&mut st.recent, b);
                set(&mut st.bits, b);
            }
        }
        let first_block = range.start / 8 / BLOCK;
        let last_block = (end.saturating_sub(1)) / 8 / BLOCK;
        Some((first_block..=last_block).collect())
    }

    /// Current contents of bitmap blocks `indices`, with their member offsets.
    pub fn blocks(&self, indices: &[usize]) -> Vec<(u64, Vec<u8>)> {
        let bytes = Self::bit_bytes(&self.state.lock().bits, self.bytes_len());
        indices
            .iter()
            .map(|&blk| {
                let mut block = vec![0u8; BLOCK];
                let from = (blk * BLOCK).min(bytes.len());
                let to = (from + BLOCK).min(bytes.len());
                block[..to - from].copy_from_slice(&bytes[from..to]);
                (BITMAP_OFFSET + (HEADER_SIZE + blk * BLOCK) as u64, block)
            })
            .collect()
    }

    /// The write to `[start, end)` is done.
    pub fn end_write(&self, start: u64, end: u64) {
        let range = self.bit_range(start, end);
        let mut st = self.state.lock();
        for b in range {
            st.pending[b] = st.pending[b].saturating_sub(1);
            set(&mut st.recent, b);
        }
    }

    /// Serialise bitmap block writes (held while writing blocks).
    pub fn write_guard(&self) -> parking_lot::MutexGuard<'_, ()> {
        self.writing.lock()
    }

    /// A cleaning pass, after the caller flushed every member: clear bits
    /// that saw no write since the last pass. Returns how many were cleared.
    pub fn clean(&self, events: u64) -> usize {
        let mut st = self.state.lock();
        let mut cleared = 0;
        for b in 0..self.nbits {
            if test(&st.bits, b) && !test(&st.recent, b) && st.pending[b] == 0 {
                st.bits[b / 64] &= !(1 << (b % 64));
                cleared += 1;
            }
        }
        if cleared > 0 {
            st.events_cleared = events;
        }
        st.recent.iter_mut().for_each(|w| *w = 0);
        cleared
    }

    /// Forget that anything was written recently (degraded arrays keep all bits).
    pub fn reset_recent(&self) {
        self.state.lock().recent.iter_mut().for_each(|w| *w = 0);
    }

    pub fn events_cleared(&self) -> u64 {
        self.state.lock().events_cleared
    }

    /// Whether any bit covering member offsets `[start, end)` is set.
    pub fn any_dirty(&self, start: u64, end: u64) -> bool {
        let st = self.state.lock();
        self.bit_range(start, end).any(|b| test(&st.bits, b))
    }

    /// Number of set bits and the bytes they cover.
    pub fn dirty(&self) -> (usize, u64) {
        let st = self.state.lock();
        let n = (0..self.nbits).filter(|&b| test(&st.bits, b)).count();
        (n, n as u64 * self.region)
    }
}
