//! A file's extent map: file offset → (logical address, length), all in
//! whole blocks. Holes are simply absent and read as zeros.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Extent {
    pub addr: u64,
    pub len: u64,
}

/// A piece of a file range: either mapped to `addr` or a hole.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    pub file_off: u64,
    pub len: u64,
    pub addr: Option<u64>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExtentMap {
    map: BTreeMap<u64, Extent>,
}

impl ExtentMap {
    pub fn iter(&self) -> impl Iterator<Item = (u64, Extent)> + '_ {
        self.map.iter().map(|(k, v)| (*k, *v))
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    pub fn allocated_bytes(&self) -> u64 {
        self.map.values().map(|e| e.len).sum()
    }

    /// Split `[start, end)` into mapped and hole segments, in order.
    pub fn segments(&self, start: u64, end: u64) -> Vec<Segment> {
        let mut out = Vec::new();
        let mut pos = start;
        let first = self
            .map
            .range(..=start)
            .next_back()
            .map(|(k, _)| *k)
            .unwrap_or(start);
        for (&off, ext) in self.map.range(first..end) {
            let ext_end = off + ext.len;
            if ext_end <= pos {
                continue;
            }
            if off > pos {
                out.push(Segment {
                    file_off: pos,
                    len: off - pos,
                    addr: None,
                });
                pos = off;
            }
            let seg_end = ext_end.min(end);
            out.push(Segment {
                file_off: pos,
                len: seg_end - pos,
                addr: Some(ext.addr + (pos - off)),
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
    /// merging with neighbours that continue on both sides.
    pub fn insert(&mut self, file_off: u64, addr: u64, len: u64) {
        let mut start = file_off;
        let mut ext = Extent { addr, len };
        if let Some((&prev_off, prev)) = self.map.range(..file_off).next_back() {
            if prev_off + prev.len == file_off && prev.addr + prev.len == addr {
                start = prev_off;
                ext = Extent {
                    addr: prev.addr,
                    len: prev.len + len,
                };
                self.map.remove(&prev_off);
            }
        }
        if let Some(next) = self.map.get(&(file_off + len)).copied() {
            if addr + len == next.addr {
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
        let first = self
            .map
            .range(..=start)
            .next_back()
            .map(|(k, _)| *k)
            .unwrap_or(start);
        let keys: Vec<u64> = self.map.range(first..end).map(|(k, _)| *k).collect();
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
                        addr: ext.addr,
                        len: cut_start - off,
                    },
                );
            }
            if cut_end < ext_end {
                self.map.insert(
                    cut_end,
                    Extent {
                        addr: ext.addr + (cut_end - off),
                        len: ext_end - cut_end,
                    },
                );
            }
            freed.push(Extent {
                addr: ext.addr + (cut_start - off),
                len: cut_end - cut_start,
            });
        }
        freed
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
                    addr: Some(4096)
                },
                Segment {
                    file_off: 8192,
                    len: 8192,
                    addr: None
                },
                Segment {
                    file_off: 16384,
                    len: 4096,
                    addr: Some(100_000 * 4096)
                },
            ]
        );
        let freed = m.remove_range(4096, 20480);
        assert_eq!(
            freed,
            vec![
                Extent {
                    addr: 8192,
                    len: 4096
                },
                Extent {
                    addr: 100_000 * 4096,
                    len: 4096
                }
            ]
        );
        assert_eq!(m.allocated_bytes(), 4096);
    }
}
