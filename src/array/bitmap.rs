//! The write-intent bitmap: one bit per region of the members' data area,
//! set (durably, on every member) before any write to the region and cleared
//! lazily once the region has been quiet and flushed. After an unclean
//! shutdown only regions whose bit is set need a resync; a member that was
//! briefly out can be re-added and rebuilt from the set bits alone, because
//! bits are never cleared while the array is degraded.
//!
//! On-member layout (identical on every member), at [`BITMAP_OFFSET`]:
//! a 4 KiB header (magic, region size, bit count, events of the last
//! clearing, crc32c) followed by the bits, least significant bit first. A
//! member found without a valid header (its start was overwritten) gets the
//! header again with the next bits write; `docs/format.md` has the bytes.

use crate::member::Member;
use parking_lot::Mutex;
use std::io;
use std::sync::Arc;

pub const BITMAP_OFFSET: u64 = 64 << 10;
const HEADER_SIZE: usize = 4096;
const BLOCK: usize = 4096;
const MAGIC: &[u8; 8] = b"RAIDBMP1";
/// Regions kept set ahead of a sequential writer (see [`Bitmap::begin_write`]).
const SEQUENTIAL_LOOKAHEAD: usize = 16;
/// Regions per member at most; the bits fit well before the data offset.
const MAX_REGIONS: u64 = 1024;
// Every bit lives in the first block after the header, so one block write
// makes any set of bits durable.
const _: () = assert!(MAX_REGIONS as usize <= BLOCK * 8);

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

/// The fields of a bitmap header (`docs/format.md`, "Write-intent bitmap").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub region_size: u64,
    pub bits: u64,
    pub events_cleared: u64,
}

impl Header {
    /// The 4 KiB header block: magic, fields, zeros, crc32c.
    pub fn encode(&self) -> Vec<u8> {
        let mut h = vec![0u8; HEADER_SIZE];
        h[0..8].copy_from_slice(MAGIC);
        h[8..16].copy_from_slice(&self.region_size.to_le_bytes());
        h[16..24].copy_from_slice(&self.bits.to_le_bytes());
        h[24..32].copy_from_slice(&self.events_cleared.to_le_bytes());
        let crc = crc32c::crc32c(&h[..HEADER_SIZE - 4]);
        h[HEADER_SIZE - 4..].copy_from_slice(&crc.to_le_bytes());
        h
    }

    /// Decode a header block; the error says what is wrong with it. The
    /// fields are not judged against an array here (see [`Bitmap::load`]).
    pub fn decode(h: &[u8]) -> Result<Header, String> {
        let h = h
            .get(..HEADER_SIZE)
            .ok_or_else(|| format!("bitmap header is {} bytes, expected {HEADER_SIZE}", h.len()))?;
        if &h[0..8] != MAGIC {
            return Err("no bitmap header magic".into());
        }
        let word = |at: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&h[at..at + 8]);
            u64::from_le_bytes(w)
        };
        let crc = u32::from_le_bytes([
            h[HEADER_SIZE - 4],
            h[HEADER_SIZE - 3],
            h[HEADER_SIZE - 2],
            h[HEADER_SIZE - 1],
        ]);
        if crc32c::crc32c(&h[..HEADER_SIZE - 4]) != crc {
            return Err("bitmap header fails its checksum".into());
        }
        Ok(Header {
            region_size: word(8),
            bits: word(16),
            events_cleared: word(24),
        })
    }
}

/// How the bits map the data area: the region each bit covers and how many
/// there are. Fixed but for [`Bitmap::resize`], so it lives with the bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Layout {
    region: u64,
    nbits: usize,
}

impl Layout {
    fn of(data_size: u64) -> Layout {
        let region = region_size(data_size);
        Layout {
            region,
            nbits: data_size.div_ceil(region) as usize,
        }
    }

    fn bytes_len(&self) -> usize {
        self.nbits.div_ceil(8)
    }

    fn area_len(&self) -> usize {
        HEADER_SIZE + self.bytes_len().div_ceil(BLOCK) * BLOCK
    }
}

struct State {
    layout: Layout,
    /// Bits as they must be on the members before their regions are written.
    bits: Vec<u64>,
    /// Bits as the last completed bitmap write left them on the members.
    durable: Vec<u64>,
    /// A background write of bits set ahead of a sequential writer is queued.
    premark_queued: bool,
    /// Writes in flight per bit.
    pending: Vec<u16>,
    /// Bits written since the last cleaning pass.
    recent: Vec<u64>,
    events_cleared: u64,
    /// Regions a write failed in for the host's sake (out of space, or the
    /// array suspended): some stripe there may be half written, so the bit
    /// stays set until a resync has made the region agree again.
    suspect: Vec<u64>,
    /// Bumped whenever a region turns suspect (a resync clears only what
    /// it saw).
    suspect_gen: u64,
    /// When a resync of suspect regions last failed.
    suspect_resync: Option<std::time::Instant>,
    /// Some member had no valid header at load (its front was overwritten,
    /// or it is new): the next bits write carries the header too, so that
    /// member's bits count again after a crash.
    header_missing: bool,
}

pub struct Bitmap {
    /// Member offset where bit 0's region starts.
    data_offset: u64,
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

/// What a writer must do before writing (see [`Bitmap::begin_write`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Intent {
    /// Every bit covering the write is durable: write now.
    Ready,
    /// Make the bits durable first ([`Bitmap::snapshot`] under
    /// [`Bitmap::write_guard`], then [`Bitmap::written`]).
    MarkFirst,
    /// Write now; bits were set ahead of this sequential writer and should
    /// be made durable in the background before it gets there (a writer
    /// arriving first finds them not durable and marks them itself).
    Premark,
}

impl Bitmap {
    pub fn new(data_offset: u64, data_size: u64) -> Bitmap {
        let layout = Layout::of(data_size);
        let (nbits, words) = (layout.nbits, layout.nbits.div_ceil(64));
        Bitmap {
            data_offset,
            state: Mutex::new(State {
                layout,
                bits: vec![0; words],
                durable: vec![0; words],
                premark_queued: false,
                pending: vec![0; nbits],
                recent: vec![0; words],
                events_cleared: 0,
                suspect: vec![0; words],
                suspect_gen: 0,
                suspect_resync: None,
                header_missing: false,
            }),
            writing: Mutex::new(()),
        }
    }

    /// The bits covering member offsets `[start, end)` in `layout`.
    fn bit_range(&self, layout: &Layout, start: u64, end: u64) -> std::ops::Range<usize> {
        let first = (start.saturating_sub(self.data_offset) / layout.region) as usize;
        let last = (end.saturating_sub(self.data_offset).div_ceil(layout.region) as usize)
            .min(layout.nbits);
        first.min(last)..last
    }

    /// The header block this bitmap writes.
    pub fn encode_header(&self, events_cleared: u64) -> Vec<u8> {
        Self::header(&self.state.lock().layout, events_cleared)
    }

    fn header(layout: &Layout, events_cleared: u64) -> Vec<u8> {
        Header {
            region_size: layout.region,
            bits: layout.nbits as u64,
            events_cleared,
        }
        .encode()
    }

    /// Cover a data area of `data_size` bytes from now on (the array grew
    /// onto larger members). Bits keep their meaning: where the region
    /// doubles, a bit covers its old pair and is set if either was. Called
    /// with writers held back (no write in flight), and followed by
    /// [`Bitmap::write_all`], since the header changes.
    pub fn resize(&self, data_size: u64) {
        let _serial = self.writing.lock();
        let mut st = self.state.lock();
        let (old, new) = (st.layout, Layout::of(data_size));
        if old == new {
            return;
        }
        let per = (new.region / old.region).max(1) as usize;
        let regroup = |words: &[u64]| {
            let mut out = vec![0u64; new.nbits.div_ceil(64)];
            for b in (0..old.nbits).filter(|&b| test(words, b)) {
                set(&mut out, b / per);
            }
            out
        };
        st.bits = regroup(&st.bits);
        st.recent = regroup(&st.recent);
        st.suspect = regroup(&st.suspect);
        // Nothing of the new layout is on the members until `write_all`.
        st.durable = vec![0; new.nbits.div_ceil(64)];
        // The caller holds writers back, so nothing should be in flight;
        // were anything, its count stays (a write over two old bits counts
        // twice, so the bit is kept set too long rather than cleared early).
        let mut pending = vec![0u16; new.nbits];
        for (b, &n) in st.pending.iter().enumerate() {
            pending[b / per] = pending[b / per].saturating_add(n);
        }
        st.pending = pending;
        st.header_missing = true;
        st.layout = new;
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
        let layout = st.layout;
        for m in members {
            let mut area = vec![0u8; layout.area_len()];
            if m.read_at(&mut area, BITMAP_OFFSET).is_err() {
                st.header_missing = true;
                continue;
            }
            let header = match Header::decode(&area[..HEADER_SIZE]) {
                Ok(h) => h,
                Err(why) => {
                    log::warn!(
                        "{}: no valid bitmap header ({why}); written again with the next bits",
                        m.name()
                    );
                    st.header_missing = true;
                    continue;
                }
            };
            if header.region_size != layout.region || header.bits != layout.nbits as u64 {
                log::warn!("{}: bitmap geometry differs; ignored", m.name());
                st.header_missing = true;
                continue;
            }
            st.events_cleared = st.events_cleared.max(header.events_cleared);
            let bytes = &area[HEADER_SIZE..HEADER_SIZE + layout.bytes_len()];
            for (i, chunk) in bytes.chunks(8).enumerate() {
                let mut w = [0u8; 8];
                w[..chunk.len()].copy_from_slice(chunk);
                st.bits[i] |= u64::from_le_bytes(w);
                st.durable[i] |= u64::from_le_bytes(w);
            }
        }
    }

    /// Write the whole bitmap (header and bits) to `members`, synced.
    pub fn write_all(&self, members: &[Arc<dyn Member>]) -> Vec<(usize, io::Error)> {
        let _w = self.writing.lock();
        let (layout, header, snapshot) = {
            let mut st = self.state.lock();
            st.header_missing = false;
            let header = Self::header(&st.layout, st.events_cleared);
            (st.layout, header, st.bits.clone())
        };
        let mut area = header;
        area.extend_from_slice(&Self::bit_bytes(&snapshot, layout.bytes_len()));
        area.resize(layout.area_len(), 0);
        let failures: Vec<(usize, io::Error)> = members
            .iter()
            .enumerate()
            .filter_map(|(i, m)| {
                m.write_at(&area, BITMAP_OFFSET)
                    .and_then(|()| m.sync())
                    .err()
                    .map(|e| (i, e))
            })
            .collect();
        // Members that failed are taken out by the caller; the others hold
        // the snapshot now.
        self.state.lock().durable = snapshot;
        failures
    }

    /// Before a write to member offsets `[start, end)`: count it in flight,
    /// set its bits, and say whether they must be made durable first.
    ///
    /// A writer moving on from the region just before is sequential: the
    /// next [`SEQUENTIAL_LOOKAHEAD`] regions are set too, so a long copy pays
    /// one bitmap write per several regions; and once fewer than half of
    /// them are left ahead, the next ones are set and written in the
    /// background ([`Intent::Premark`]) while the writer goes on, so it does
    /// not wait for the bitmap at all. After a crash that costs at most that
    /// many regions of extra resync.
    pub fn begin_write(&self, start: u64, end: u64) -> Intent {
        let mut st = self.state.lock();
        let nbits = st.layout.nbits;
        let range = self.bit_range(&st.layout, start, end);
        let mut mark_now = false;
        for b in range.clone() {
            st.pending[b] = st.pending[b].saturating_add(1);
            set(&mut st.recent, b);
            set(&mut st.bits, b);
            mark_now |= !test(&st.durable, b);
        }
        let sequential = range.start > 0 && test(&st.bits, range.start - 1);
        if !sequential {
            return if mark_now {
                Intent::MarkFirst
            } else {
                Intent::Ready
            };
        }
        let runway = (range.end..nbits)
            .take_while(|&b| test(&st.bits, b))
            .count();
        let extend = runway < SEQUENTIAL_LOOKAHEAD / 2 && (mark_now || !st.premark_queued);
        if extend {
            for b in range.end + runway..(range.end + SEQUENTIAL_LOOKAHEAD).min(nbits) {
                set(&mut st.recent, b);
                set(&mut st.bits, b);
            }
        }
        if mark_now {
            Intent::MarkFirst
        } else if extend && st.bits != st.durable {
            st.premark_queued = true;
            Intent::Premark
        } else {
            Intent::Ready
        }
    }

    /// Whether every bit covering member offsets `[start, end)` is durable.
    pub fn is_durable(&self, start: u64, end: u64) -> bool {
        let st = self.state.lock();
        self.bit_range(&st.layout, start, end)
            .all(|b| test(&st.durable, b))
    }

    /// The bits block to write now (member offset and contents) and the
    /// bits it holds, or `None` when the members hold every set bit already.
    /// Call under [`Bitmap::write_guard`], then [`Bitmap::written`].
    ///
    /// When some member had no valid header at load, the block is the
    /// header followed by the bits, at [`BITMAP_OFFSET`].
    pub fn snapshot(&self) -> Option<(u64, Vec<u8>, Vec<u64>)> {
        let mut st = self.state.lock();
        if st.bits == st.durable {
            return None;
        }
        let mut block = Self::bit_bytes(&st.bits, st.layout.bytes_len());
        block.resize(BLOCK, 0);
        if std::mem::take(&mut st.header_missing) {
            let mut area = Self::header(&st.layout, st.events_cleared);
            area.extend_from_slice(&block);
            return Some((BITMAP_OFFSET, area, st.bits.clone()));
        }
        Some((BITMAP_OFFSET + HEADER_SIZE as u64, block, st.bits.clone()))
    }

    /// The block of [`Bitmap::snapshot`] is durable on every working member.
    pub fn written(&self, snapshot: Vec<u64>) {
        self.state.lock().durable = snapshot;
    }

    /// The background write asked for by [`Intent::Premark`] is over (or
    /// will not happen).
    pub fn premark_done(&self) {
        self.state.lock().premark_queued = false;
    }

    /// The write to `[start, end)` is done.
    pub fn end_write(&self, start: u64, end: u64) {
        let mut st = self.state.lock();
        let range = self.bit_range(&st.layout, start, end);
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
        for b in 0..st.layout.nbits {
            if test(&st.bits, b)
                && !test(&st.recent, b)
                && !test(&st.suspect, b)
                && st.pending[b] == 0
            {
                st.bits[b / 64] &= !(1 << (b % 64));
                // Soon cleared on the members too: a writer setting it again
                // must write it again.
                st.durable[b / 64] &= !(1 << (b % 64));
                cleared += 1;
            }
        }
        if cleared > 0 {
            st.events_cleared = events;
        }
        st.recent.iter_mut().for_each(|w| *w = 0);
        cleared
    }

    /// A write to member offsets `[start, end)` failed for the host's sake:
    /// keep its regions set until a resync.
    pub fn mark_suspect(&self, start: u64, end: u64) {
        let mut st = self.state.lock();
        let range = self.bit_range(&st.layout, start, end);
        for b in range {
            set(&mut st.suspect, b);
            set(&mut st.bits, b);
        }
        st.suspect_gen += 1;
    }

    /// Every region the bitmap marks turns suspect (the host failed with
    /// writes in flight anywhere).
    pub fn mark_all_dirty_suspect(&self) {
        let mut st = self.state.lock();
        let bits = st.bits.clone();
        for (s, b) in st.suspect.iter_mut().zip(bits) {
            *s |= b;
        }
        st.suspect_gen += 1;
    }

    /// Whether any region covering member offsets `[start, end)` is suspect.
    pub fn is_suspect(&self, start: u64, end: u64) -> bool {
        let st = self.state.lock();
        if st.suspect.iter().all(|&w| w == 0) {
            return false;
        }
        self.bit_range(&st.layout, start, end)
            .any(|b| test(&st.suspect, b))
    }

    pub fn has_suspect(&self) -> bool {
        self.state.lock().suspect.iter().any(|&w| w != 0)
    }

    /// Whether a resync of the suspect regions may start now: not within
    /// 10 s of one that failed, so a host still full is not hammered.
    pub fn resync_due(&self) -> bool {
        let st = self.state.lock();
        st.suspect_resync
            .is_none_or(|t| t.elapsed() >= std::time::Duration::from_secs(10))
    }

    /// A resync of the suspect regions failed (the host still refuses).
    pub fn resync_failed(&self) {
        self.state.lock().suspect_resync = Some(std::time::Instant::now());
    }

    /// The suspect generation now (see [`Bitmap::resynced`]).
    pub fn suspect_generation(&self) -> u64 {
        self.state.lock().suspect_gen
    }

    /// A resync that started at suspect generation `gen` finished: the
    /// regions are consistent again unless one turned suspect meanwhile.
    pub fn resynced(&self, gen: u64) {
        let mut st = self.state.lock();
        if st.suspect_gen == gen {
            st.suspect.iter_mut().for_each(|w| *w = 0);
            st.suspect_resync = None;
        }
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
        self.bit_range(&st.layout, start, end)
            .any(|b| test(&st.bits, b))
    }

    /// Bytes of member offsets `[start, end)` that set bits cover.
    pub fn dirty_bytes_within(&self, start: u64, end: u64) -> u64 {
        let st = self.state.lock();
        let region = st.layout.region;
        self.bit_range(&st.layout, start, end)
            .filter(|&b| test(&st.bits, b))
            .map(|b| {
                let from = self.data_offset + b as u64 * region;
                (from + region).min(end).saturating_sub(from.max(start))
            })
            .sum()
    }

    /// Number of set bits and the bytes they cover.
    pub fn dirty(&self) -> (usize, u64) {
        let st = self.state.lock();
        let n = (0..st.layout.nbits).filter(|&b| test(&st.bits, b)).count();
        (n, n as u64 * st.layout.region)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DATA_OFFSET: u64 = 1 << 20;
    const REGION: u64 = 4 << 20;

    /// A bitmap of 256 regions of 4 MiB.
    fn bitmap() -> Bitmap {
        let b = Bitmap::new(DATA_OFFSET, 256 * REGION);
        assert_eq!(b.state.lock().layout.region, REGION);
        b
    }

    /// Member offsets of a 4 KiB write at the start of region `r`.
    fn span(r: u64) -> (u64, u64) {
        let start = DATA_OFFSET + r * REGION;
        (start, start + 4096)
    }

    fn begin(b: &Bitmap, r: u64) -> Intent {
        let (s, e) = span(r);
        b.begin_write(s, e)
    }

    fn make_durable(b: &Bitmap) {
        let _serial = b.write_guard();
        if let Some((_, _, snapshot)) = b.snapshot() {
            b.written(snapshot);
        }
    }

    #[test]
    fn a_write_waits_until_its_bit_is_durable_even_when_another_writer_set_it() {
        let b = bitmap();
        assert_eq!(begin(&b, 5), Intent::MarkFirst);
        // The first writer has set the bit but not written it yet: a second
        // writer of the region must not go ahead on the in-memory bit.
        assert_eq!(begin(&b, 5), Intent::MarkFirst);
        let (s, e) = span(5);
        assert!(!b.is_durable(s, e));
        let (offset, block, snapshot) = b.snapshot().expect("bits to write");
        assert_eq!(offset, BITMAP_OFFSET + HEADER_SIZE as u64);
        assert_eq!(block.len(), BLOCK);
        assert_eq!(block[0], 1 << 5);
        b.written(snapshot);
        assert!(b.is_durable(s, e));
        assert_eq!(begin(&b, 5), Intent::Ready);
        assert!(b.snapshot().is_none(), "nothing left to write");
    }

    #[test]
    fn a_sequential_writer_is_marked_ahead_and_in_the_background() {
        let b = bitmap();
        assert_eq!(begin(&b, 0), Intent::MarkFirst);
        make_durable(&b);
        // Moving on from region 0: region 1 and the lookahead are set and
        // written in the same mark.
        assert_eq!(begin(&b, 1), Intent::MarkFirst);
        make_durable(&b);
        let last_ahead = 1 + SEQUENTIAL_LOOKAHEAD as u64;
        let (s, e) = (span(2).0, span(last_ahead).1);
        assert!(b.is_durable(s, e), "regions 2..={last_ahead} durable");
        assert!(!b.is_durable(span(last_ahead + 1).0, span(last_ahead + 1).1));
        // While half the lookahead is left the writer just writes.
        let half = SEQUENTIAL_LOOKAHEAD as u64 / 2;
        for r in 2..=last_ahead - half {
            assert_eq!(begin(&b, r), Intent::Ready, "region {r}");
        }
        // Then the next regions are set for a background write...
        let r = last_ahead - half + 1;
        assert_eq!(begin(&b, r), Intent::Premark);
        let beyond = span(last_ahead + 1);
        assert!(!b.is_durable(beyond.0, beyond.1));
        // ...only one at a time, and the writer goes on meanwhile.
        assert_eq!(begin(&b, r + 1), Intent::Ready);
        // A writer that gets there before the background write must mark.
        assert_eq!(begin(&b, last_ahead + 1), Intent::MarkFirst);
        make_durable(&b);
        b.premark_done();
        assert!(b.is_durable(beyond.0, beyond.1));
    }

    #[test]
    fn a_cleaned_bit_must_be_written_again() {
        let b = bitmap();
        assert_eq!(begin(&b, 9), Intent::MarkFirst);
        make_durable(&b);
        let (s, e) = span(9);
        b.end_write(s, e);
        // The first pass forgets the recent write, the second clears.
        assert_eq!(b.clean(1), 0);
        assert_eq!(b.clean(2), 1);
        assert!(!b.is_durable(s, e));
        assert_eq!(begin(&b, 9), Intent::MarkFirst);
    }

    /// docs/format.md's bitmap header table, checked against the header
    /// bytes written here.
    #[test]
    fn format_md_bitmap_header_matches_the_bytes() {
        let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/format.md"))
            .expect("docs/format.md");
        let heading = "Header (4096 bytes at member offset 65536)";
        let start = doc.find(heading).expect("bitmap header table");
        assert_eq!(BITMAP_OFFSET, 65536);
        let bits_at = format!(
            "Bits block (4096 bytes at member offset {})",
            BITMAP_OFFSET + HEADER_SIZE as u64
        );
        assert!(doc.contains(&bits_at), "{bits_at}");
        let b = bitmap();
        let h = b.encode_header(0x0a0b_0c0d);
        let mut at = 0;
        let rows = doc[start..]
            .lines()
            .skip_while(|l| !l.starts_with('|'))
            .take_while(|l| l.starts_with('|'))
            .skip(2);
        for row in rows {
            let cells: Vec<&str> = row.trim_matches('|').split('|').map(str::trim).collect();
            let offset: usize = cells[0].parse().expect("offset");
            let size: usize = cells[1].parse().expect("size");
            assert_eq!(offset, at, "{row}");
            let want: Vec<u8> = match cells[2] {
                "`magic`" => MAGIC.to_vec(),
                "`region_size`" => REGION.to_le_bytes().to_vec(),
                "`bits`" => 256u64.to_le_bytes().to_vec(),
                "`events_cleared`" => 0x0a0b_0c0du64.to_le_bytes().to_vec(),
                "reserved" => vec![0; size],
                "`crc`" => crc32c::crc32c(&h[..HEADER_SIZE - 4]).to_le_bytes().to_vec(),
                other => panic!("unknown bitmap header field {other}"),
            };
            assert_eq!(&h[offset..offset + size], &want[..], "{row}");
            at = offset + size;
        }
        assert_eq!(at, HEADER_SIZE);
        assert_eq!(region_size(1 << 30), 4 << 20);
        assert_eq!(region_size(8 << 30), 8 << 20, "at most 1024 regions");
    }

    #[test]
    fn a_member_without_a_header_gets_it_with_the_next_bits() {
        let members: Vec<Arc<dyn Member>> = (0..2)
            .map(|_| {
                Arc::new(crate::member::memory::MemoryMember::new(DATA_OFFSET).expect("member"))
                    as Arc<dyn Member>
            })
            .collect();
        bitmap().write_all(&members[..1]);
        let b = bitmap();
        b.load(&members);
        assert_eq!(begin(&b, 3), Intent::MarkFirst);
        let (offset, block, snapshot) = b.snapshot().expect("bits to write");
        assert_eq!(offset, BITMAP_OFFSET, "header and bits together");
        assert_eq!(block.len(), HEADER_SIZE + BLOCK);
        assert_eq!(&block[..8], MAGIC);
        assert_eq!(block[HEADER_SIZE], 1 << 3);
        b.written(snapshot);
        assert_eq!(begin(&b, 7), Intent::MarkFirst);
        let (offset, _, _) = b.snapshot().expect("bits to write");
        assert_eq!(
            offset,
            BITMAP_OFFSET + HEADER_SIZE as u64,
            "bits only again"
        );

        let whole = bitmap();
        whole.write_all(&members);
        let b = bitmap();
        b.load(&members);
        assert_eq!(begin(&b, 3), Intent::MarkFirst);
        let (offset, _, _) = b.snapshot().expect("bits to write");
        assert_eq!(
            offset,
            BITMAP_OFFSET + HEADER_SIZE as u64,
            "every header valid"
        );
    }

    #[test]
    fn dirty_bytes_within_counts_only_the_covered_part_of_a_range() {
        let b = bitmap();
        // No two next to each other: a sequential writer is marked ahead.
        for r in [2, 6, 10] {
            begin(&b, r);
            let (s, e) = span(r);
            b.end_write(s, e);
        }
        assert_eq!(b.dirty(), (3, 3 * REGION));
        let region = |r: u64| DATA_OFFSET + r * REGION;
        // Whole regions, part of one, parts of a dirty and a clean one, none.
        assert_eq!(b.dirty_bytes_within(region(0), region(256)), 3 * REGION);
        assert_eq!(
            b.dirty_bytes_within(region(6) + 4096, region(7)),
            REGION - 4096
        );
        assert_eq!(
            b.dirty_bytes_within(region(2) + 100, region(3) + 100),
            REGION - 100
        );
        assert_eq!(b.dirty_bytes_within(region(3), region(6)), 0);
        assert_eq!(b.dirty_bytes_within(0, DATA_OFFSET), 0);
    }

    #[test]
    fn resizing_keeps_every_set_bit_covering_its_region() {
        // 1000 regions of 4 MiB; growing past 1024 of them doubles the region.
        let b = Bitmap::new(DATA_OFFSET, 1000 * REGION);
        // No two next to each other: a sequential writer is marked ahead.
        for r in [0, 5, 9, 999] {
            begin(&b, r);
            let (s, e) = span(r);
            b.end_write(s, e);
        }
        b.mark_suspect(span(7).0, span(7).1);
        make_durable(&b);

        // Room for more regions of the same size: bits stay where they are.
        let same = Bitmap::new(DATA_OFFSET, 1000 * REGION);
        begin(&same, 3);
        same.resize(1020 * REGION);
        assert_eq!(
            same.state.lock().layout,
            Layout {
                region: REGION,
                nbits: 1020
            }
        );
        assert!(same.any_dirty(span(3).0, span(3).1));
        assert!(!same.any_dirty(span(4).0, span(1019).1));

        b.resize(3000 * REGION);
        let layout = b.state.lock().layout;
        assert_eq!(layout.region, 4 * REGION);
        assert_eq!(layout.nbits, 750);
        // Every old dirty region is still covered, and only those.
        for r in [0, 5, 7, 9, 999] {
            let (s, e) = span(r);
            assert!(b.any_dirty(s, e), "region {r}");
        }
        assert!(!b.any_dirty(span(12).0, span(995).1));
        assert!(b.is_suspect(span(7).0, span(7).1));
        assert!(!b.is_suspect(span(0).0, span(3).1));
        // The new region past the old end is clean.
        assert!(!b.any_dirty(span(1000).0, span(2999).1));
        // Nothing of the new layout is durable: the next write carries the
        // header, which names the new layout.
        let (s, e) = span(0);
        assert!(!b.is_durable(s, e));
        let (offset, block, _) = b.snapshot().expect("bits to write");
        assert_eq!(offset, BITMAP_OFFSET);
        let header = Header::decode(&block[..HEADER_SIZE]).expect("header");
        assert_eq!((header.region_size, header.bits), (4 * REGION, 750));
    }
}
