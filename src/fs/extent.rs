//! A file's extent map: file offset → (logical address, length), all in
//! whole blocks. Holes are simply absent and read as zeros; so do
//! *unwritten* extents, blocks that fallocate reserved and nothing has
//! written yet (as in ext4 and XFS): they hold space without holding data,
//! and the first write into them goes in place and turns them written.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Marks an unwritten extent in its stored address (format version 3).
/// Logical addresses are `group << 40 | offset` with far fewer than 2^23
/// groups, so the top bit is never part of one, and a version 2 extent
/// (always written) reads back unchanged.
const UNWRITTEN_BIT: u64 = 1 << 63;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "StoredExtent", into = "StoredExtent")]
pub struct Extent {
    pub addr: u64,
    pub len: u64,
    /// Reserved, never written: reads as zeros, has no checksums.
    pub unwritten: bool,
}

/// An extent as stored: the flag folded into the address.
#[derive(Serialize, Deserialize)]
struct StoredExtent {
    addr: u64,
    len: u64,
}

impl From<StoredExtent> for Extent {
    fn from(stored: StoredExtent) -> Extent {
        Extent {
            addr: stored.addr & !UNWRITTEN_BIT,
            len: stored.len,
            unwritten: stored.addr & UNWRITTEN_BIT != 0,
        }
    }
}

impl From<Extent> for StoredExtent {
    fn from(ext: Extent) -> StoredExtent {
        StoredExtent {
            addr: ext.addr | if ext.unwritten { UNWRITTEN_BIT } else { 0 },
            len: ext.len,
        }
    }
}

impl Extent {
    /// A written extent (or a run of blocks to allocate or free).
    pub fn new(addr: u64, len: u64) -> Extent {
        Extent {
            addr,
            len,
            unwritten: false,
        }
    }
}

/// A piece of a file range: either mapped to `addr` or a hole.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    pub file_off: u64,
    pub len: u64,
    pub addr: Option<u64>,
    /// Mapped to unwritten blocks (reads as zeros like a hole).
    pub unwritten: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExtentMap {
    map: BTreeMap<u64, Extent>,
}

impl ExtentMap {
    /// Put back an extent exactly as stored (loading from the metadata
    /// tree): no merging with its neighbours, so the map reads back as it
    /// was written.
    pub fn restore(&mut self, file_off: u64, ext: Extent) {
        self.map.insert(file_off, ext);
    }

    /// An extent as stored in the metadata tree: the address with the
    /// unwritten flag in bit 63, then the length, little-endian u64s.
    pub fn stored_bytes(ext: Extent) -> [u8; 16] {
        let stored = StoredExtent::from(ext);
        let mut out = [0u8; 16];
        out[..8].copy_from_slice(&stored.addr.to_le_bytes());
        out[8..].copy_from_slice(&stored.len.to_le_bytes());
        out
    }

    /// The extent [`ExtentMap::stored_bytes`] wrote; `None` unless 16 bytes.
    pub fn from_stored_bytes(b: &[u8]) -> Option<Extent> {
        let addr = u64::from_le_bytes(b.get(..8)?.try_into().ok()?);
        let len = u64::from_le_bytes(b.get(8..16)?.try_into().ok()?);
        (b.len() == 16).then(|| Extent::from(StoredExtent { addr, len }))
    }

    pub fn iter(&self) -> impl Iterator<Item = (u64, Extent)> + '_ {
        self.map.iter().map(|(k, v)| (*k, *v))
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// How many extents the map holds.
    pub fn count(&self) -> usize {
        self.map.len()
    }

    pub fn allocated_bytes(&self) -> u64 {
        self.map.values().map(|e| e.len).sum()
    }

    /// Where a walk of the extents touching `[start, ..)` begins: the extent
    /// starting at or before `start` (it may cover it), else `start`.
    fn first_key_touching(&self, start: u64) -> u64 {
        self.map
            .range(..=start)
            .next_back()
            .map_or(start, |(k, _)| *k)
    }

    /// Split `[start, end)` into mapped and hole segments, in order.
    pub fn segments(&self, start: u64, end: u64) -> Vec<Segment> {
        let mut out = Vec::new();
        let mut pos = start;
        for (&off, ext) in self.map.range(self.first_key_touching(start)..end) {
            let ext_end = off + ext.len;
            if ext_end <= pos {
                continue;
            }
            if off > pos {
                out.push(Segment {
                    file_off: pos,
                    len: off - pos,
                    addr: None,
                    unwritten: false,
                });
                pos = off;
            }
            let seg_end = ext_end.min(end);
            out.push(Segment {
                file_off: pos,
                len: seg_end - pos,
                addr: Some(ext.addr + (pos - off)),
                unwritten: ext.unwritten,
            });
            pos = seg_end;
            if pos >= end {
                break;
            }
        }
        if pos < end {
            out.push(Segment {
                file_off: pos,
                len: end - pos,
                addr: None,
                unwritten: false,
            });
        }
        out
    }

    /// The address of the block just after the mapping that ends at `file_off`,
    /// so a following allocation can continue it contiguously.
    pub fn continuation_hint(&self, file_off: u64) -> Option<u64> {
        let (&off, ext) = self.map.range(..file_off).next_back()?;
        (off + ext.len == file_off).then_some(ext.addr + ext.len)
    }

    /// Map `[file_off, file_off+len)` (which must be a hole) to `addr`,
    /// merging with neighbours that continue on both sides in the same state.
    pub fn insert(&mut self, file_off: u64, addr: u64, len: u64) {
        self.insert_as(file_off, Extent::new(addr, len));
    }

    /// As [`ExtentMap::insert`], keeping `ext.unwritten`.
    pub fn insert_as(&mut self, file_off: u64, ext: Extent) {
        let (addr, len, unwritten) = (ext.addr, ext.len, ext.unwritten);
        let mut start = file_off;
        let mut ext = ext;
        if let Some((&prev_off, prev)) = self.map.range(..file_off).next_back() {
            if prev_off + prev.len == file_off
                && prev.addr + prev.len == addr
                && prev.unwritten == unwritten
            {
                start = prev_off;
                ext.addr = prev.addr;
                ext.len += prev.len;
                self.map.remove(&prev_off);
            }
        }
        if let Some(next) = self.map.get(&(file_off + len)).copied() {
            if addr + len == next.addr && next.unwritten == unwritten {
                self.map.remove(&(file_off + len));
                ext.len += next.len;
            }
        }
        self.map.insert(start, ext);
    }

    /// Unmap `[start, end)`; returns the freed (addr, len) pieces.
    pub fn remove_range(&mut self, start: u64, end: u64) -> Vec<Extent> {
        let mut freed = Vec::new();
        if start >= end {
            return freed;
        }
        let keys: Vec<u64> = self
            .map
            .range(self.first_key_touching(start)..end)
            .map(|(k, _)| *k)
            .collect();
        for off in keys {
            let Some(ext) = self.map.get(&off).copied() else {
                continue;
            };
            let ext_end = off + ext.len;
            if ext_end <= start {
                continue;
            }
            self.map.remove(&off);
            let cut_start = start.max(off);
            let cut_end = end.min(ext_end);
            if off < cut_start {
                self.map.insert(
                    off,
                    Extent {
                        len: cut_start - off,
                        ..ext
                    },
                );
            }
            if cut_end < ext_end {
                self.map.insert(
                    cut_end,
                    Extent {
                        addr: ext.addr + (cut_end - off),
                        len: ext_end - cut_end,
                        ..ext
                    },
                );
            }
            freed.push(Extent::new(
                ext.addr + (cut_start - off),
                cut_end - cut_start,
            ));
        }
        freed
    }

    /// Turn the unwritten extents within `[start, end)` written (their
    /// blocks now hold the file's data), merging where they now continue
    /// written neighbours.
    pub fn mark_written(&mut self, start: u64, end: u64) {
        let unwritten: Vec<u64> = self
            .map
            .range(self.first_key_touching(start)..end)
            .filter(|(off, e)| e.unwritten && **off + e.len > start)
            .map(|(off, _)| *off)
            .collect();
        for off in unwritten {
            let Some(ext) = self.map.remove(&off) else {
                continue;
            };
            let ext_end = off + ext.len;
            let (cut_start, cut_end) = (start.max(off), end.min(ext_end));
            let at = |from: u64, to: u64, unwritten: bool| Extent {
                addr: ext.addr + (from - off),
                len: to - from,
                unwritten,
            };
            if off < cut_start {
                self.insert_as(off, at(off, cut_start, true));
            }
            self.insert_as(cut_start, at(cut_start, cut_end, false));
            if cut_end < ext_end {
                self.insert_as(cut_end, at(cut_end, ext_end, true));
            }
        }
    }

    pub fn take_all(&mut self) -> Vec<Extent> {
        std::mem::take(&mut self.map).into_values().collect()
    }

    /// Drop one extent by its file offset (fsck repair).
    pub fn drop_at(&mut self, file_off: u64) -> Option<Extent> {
        self.map.remove(&file_off)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insert_merges_and_segments_split() {
        let mut m = ExtentMap::default();
        m.insert(0, 4096, 4096);
        m.insert(4096, 8192, 4096);
        assert_eq!(m.iter().count(), 1);
        m.insert(16384, 100_000 * 4096, 4096);
        let segs = m.segments(0, 20480);
        assert_eq!(
            segs,
            vec![
                Segment {
                    file_off: 0,
                    len: 8192,
                    addr: Some(4096),
                    unwritten: false,
                },
                Segment {
                    file_off: 8192,
                    len: 8192,
                    addr: None,
                    unwritten: false,
                },
                Segment {
                    file_off: 16384,
                    len: 4096,
                    addr: Some(100_000 * 4096),
                    unwritten: false,
                },
            ]
        );
        let freed = m.remove_range(4096, 20480);
        assert_eq!(
            freed,
            vec![Extent::new(8192, 4096), Extent::new(100_000 * 4096, 4096)]
        );
        assert_eq!(m.allocated_bytes(), 4096);
    }

    #[test]
    fn unwritten_extents_turn_written_piece_by_piece_and_merge_back() {
        let mut m = ExtentMap::default();
        let base = 1 << 20;
        m.insert_as(
            0,
            Extent {
                addr: base,
                len: 8 * 4096,
                unwritten: true,
            },
        );
        // A written neighbour continuing the same blocks stays apart.
        m.insert(8 * 4096, base + 8 * 4096, 4096);
        assert_eq!(m.iter().count(), 2);
        m.mark_written(2 * 4096, 4 * 4096);
        let state: Vec<(u64, u64, bool)> =
            m.iter().map(|(off, e)| (off, e.len, e.unwritten)).collect();
        assert_eq!(
            state,
            vec![
                (0, 2 * 4096, true),
                (2 * 4096, 2 * 4096, false),
                (4 * 4096, 4 * 4096, true),
                (8 * 4096, 4096, false),
            ]
        );
        let segs = m.segments(4096, 3 * 4096);
        assert!(segs[0].unwritten && !segs[1].unwritten);
        // Writing the rest leaves one written extent, as if never reserved.
        m.mark_written(0, 2 * 4096);
        m.mark_written(4 * 4096, 8 * 4096);
        let all: Vec<(u64, Extent)> = m.iter().collect();
        assert_eq!(all, vec![(0, Extent::new(base, 9 * 4096))]);
        assert_eq!(m.allocated_bytes(), 9 * 4096);
    }

    #[test]
    fn the_unwritten_flag_is_stored_in_the_address_and_version_2_extents_read_back() {
        let unwritten = Extent {
            addr: 5 << 40 | 4096,
            len: 8192,
            unwritten: true,
        };
        let bytes = bincode::serialize(&unwritten).unwrap();
        assert_eq!(bincode::deserialize::<Extent>(&bytes).unwrap(), unwritten);
        // Version 2 stored plain (addr, len) pairs: the same bytes as a written extent.
        let plain = Extent::new(5 << 40 | 4096, 8192);
        let old_layout = bincode::serialize(&(plain.addr, plain.len)).unwrap();
        assert_eq!(bincode::serialize(&plain).unwrap(), old_layout);
        assert_eq!(bincode::deserialize::<Extent>(&old_layout).unwrap(), plain);
    }
}
