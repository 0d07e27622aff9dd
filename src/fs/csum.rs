//! Data block checksums: the algorithm (recorded in the fs header) and the
//! checksum map, keyed by logical block address, that holds one checksum
//! per 4 KiB data block.
//!
//! The map is part of the metadata: journal records carry the checksums a
//! batch set and the extents it freed (whose checksums go with them), and
//! a checkpoint image carries the whole map
//! (the formats before the metadata tree; over the tree a checkpoint puts
//! the chunks that changed). It is stored in chunks of 64 blocks so a
//! large file costs about 4 bytes per block, and the chunks are hashed by
//! address: every checked read looks its blocks up, and a cold 4 KiB read
//! paid a cache miss per level of an ordered tree (a fifth of the daemon's
//! own time per read). Checkpoints still write the chunks in address order.
//!
//! This map holds every chunk (fsck, upgrade, the formats before the
//! metadata tree); a mount over the tree holds only the chunks it uses
//! ([`super::csum_store`]).

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize, Serializer};

use super::inode::BLOCK_SIZE;

/// How data blocks are checksummed. Persisted in the filesystem header
/// through its fixed number in `codes` (not by variant order).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ChecksumKind {
    /// No data checksums (metadata is always checksummed).
    None,
    /// crc32c of each 4 KiB block.
    #[default]
    Crc32c,
}

impl ChecksumKind {
    pub fn enabled(self) -> bool {
        self != ChecksumKind::None
    }

    /// Checksum of one block.
    pub fn block(self, data: &[u8]) -> u32 {
        match self {
            ChecksumKind::None => 0,
            ChecksumKind::Crc32c => crc32c::crc32c(data),
        }
    }

    /// Checksums of every block of `data` (a whole number of blocks).
    pub fn blocks(self, data: &[u8]) -> Vec<u32> {
        data.chunks(BLOCK_SIZE as usize)
            .map(|b| self.block(b))
            .collect()
    }

    /// Indices of the blocks of `data` that do not match `expected` (a block
    /// with no expected checksum always matches).
    pub fn mismatches(self, data: &[u8], expected: &[Option<u32>]) -> Vec<usize> {
        if !self.enabled() {
            return Vec::new();
        }
        data.chunks(BLOCK_SIZE as usize)
            .zip(expected)
            .enumerate()
            .filter(|(_, (b, want))| want.is_some_and(|w| self.block(b) != w))
            .map(|(i, _)| i)
            .collect()
    }
}

pub(super) const CHUNK_BLOCKS: u64 = 64;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "StoredChunk")]
pub(super) struct CsumChunk {
    /// Bit i: block i of the chunk has a checksum.
    present: u64,
    /// Always [`CHUNK_BLOCKS`] entries (checked when decoded).
    crcs: Vec<u32>,
}

/// A chunk as decoded, before its length is checked.
#[derive(Deserialize)]
struct StoredChunk {
    present: u64,
    crcs: Vec<u32>,
}

impl TryFrom<StoredChunk> for CsumChunk {
    type Error = String;

    fn try_from(c: StoredChunk) -> Result<CsumChunk, String> {
        if c.crcs.len() as u64 != CHUNK_BLOCKS {
            return Err(format!(
                "a checksum chunk holds {} checksums, not {CHUNK_BLOCKS}",
                c.crcs.len()
            ));
        }
        Ok(CsumChunk {
            present: c.present,
            crcs: c.crcs,
        })
    }
}

/// Logical block address → checksum.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CsumMap {
    #[serde(serialize_with = "in_address_order")]
    chunks: HashMap<u64, CsumChunk>,
}

/// The chunks as an ordered map: the same encoding a hash map has, with
/// bytes that do not depend on the hash order.
fn in_address_order<S: Serializer>(
    chunks: &HashMap<u64, CsumChunk>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    let ordered: BTreeMap<&u64, &CsumChunk> = chunks.iter().collect();
    ordered.serialize(serializer)
}

impl CsumChunk {
    pub(super) fn empty() -> CsumChunk {
        CsumChunk {
            present: 0,
            crcs: vec![0; CHUNK_BLOCKS as usize],
        }
    }

    pub(super) fn get(&self, bit: usize) -> Option<u32> {
        (self.present & (1 << bit) != 0).then(|| self.crcs[bit])
    }

    pub(super) fn set(&mut self, bit: usize, crc: u32) {
        self.present |= 1 << bit;
        self.crcs[bit] = crc;
    }

    /// Zeroed with its bit, so a chunk equals itself read back from the
    /// tree (which keeps only present checksums).
    pub(super) fn clear(&mut self, bit: usize) {
        self.present &= !(1 << bit);
        self.crcs[bit] = 0;
    }

    pub(super) fn is_empty(&self) -> bool {
        self.present == 0
    }

    /// The chunk as the metadata tree stores it: the `present` mask (u64),
    /// then the checksum of each present block in block order (u32 each),
    /// little-endian.
    pub(super) fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(8 + 4 * self.present.count_ones() as usize);
        out.extend_from_slice(&self.present.to_le_bytes());
        for bit in 0..CHUNK_BLOCKS as usize {
            if self.present & (1 << bit) != 0 {
                out.extend_from_slice(&self.crcs[bit].to_le_bytes());
            }
        }
        out
    }

    /// Take back what [`CsumChunk::to_bytes`] wrote; an error says what
    /// does not add up.
    pub(super) fn from_bytes(b: &[u8]) -> Result<CsumChunk, String> {
        let present = u64::from_le_bytes(
            b.get(..8)
                .and_then(|w| w.try_into().ok())
                .ok_or("a checksum chunk is shorter than its mask")?,
        );
        if present == 0 || b.len() != 8 + 4 * present.count_ones() as usize {
            return Err(format!(
                "a checksum chunk of {} bytes does not match its mask {present:#x}",
                b.len()
            ));
        }
        let mut crcs = vec![0u32; CHUNK_BLOCKS as usize];
        let mut at = 8;
        for (bit, crc) in crcs.iter_mut().enumerate() {
            if present & (1 << bit) != 0 {
                *crc = u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
                at += 4;
            }
        }
        Ok(CsumChunk { present, crcs })
    }
}

/// The chunk key of the block at `addr` and the block's index in it.
pub(super) fn locate(addr: u64) -> (u64, usize) {
    let block = addr / BLOCK_SIZE;
    (block / CHUNK_BLOCKS, (block % CHUNK_BLOCKS) as usize)
}

impl CsumMap {
    /// Set the checksums of consecutive blocks starting at `addr`.
    pub fn set(&mut self, addr: u64, crcs: &[u32]) {
        for (i, crc) in crcs.iter().enumerate() {
            // A run past the end of the address space (only a damaged
            // record has one) stops there.
            let Some(block_addr) = addr.checked_add(i as u64 * BLOCK_SIZE) else {
                break;
            };
            let (key, bit) = locate(block_addr);
            let chunk = self.chunks.entry(key).or_insert_with(|| CsumChunk {
                present: 0,
                crcs: vec![0; CHUNK_BLOCKS as usize],
            });
            chunk.present |= 1 << bit;
            chunk.crcs[bit] = *crc;
        }
    }

    pub fn get(&self, addr: u64) -> Option<u32> {
        let (key, bit) = locate(addr);
        let chunk = self.chunks.get(&key)?;
        (chunk.present & (1 << bit) != 0).then(|| chunk.crcs[bit])
    }

    /// Checksums of `n` consecutive blocks from `addr`.
    pub fn get_run(&self, addr: u64, n: usize) -> Vec<Option<u32>> {
        (0..n as u64)
            .map(|i| self.get(addr + i * BLOCK_SIZE))
            .collect()
    }

    /// Forget the checksums of `[addr, addr + len)`. Costs the smaller of
    /// the range's blocks and the map's chunks, so a huge extent (or a
    /// damaged one) does not walk every block of it.
    pub fn remove(&mut self, addr: u64, len: u64) {
        let blocks = len / BLOCK_SIZE;
        if blocks > self.chunks.len() as u64 * CHUNK_BLOCKS {
            let first = addr / BLOCK_SIZE;
            let end = first.saturating_add(blocks);
            self.chunks.retain(|&key, chunk| {
                for bit in 0..CHUNK_BLOCKS {
                    let block = key * CHUNK_BLOCKS + bit;
                    if (first..end).contains(&block) {
                        chunk.present &= !(1 << bit);
                        chunk.crcs[bit as usize] = 0;
                    }
                }
                chunk.present != 0
            });
            return;
        }
        for i in 0..blocks {
            let Some(block_addr) = addr.checked_add(i * BLOCK_SIZE) else {
                break;
            };
            let (key, bit) = locate(block_addr);
            if let Some(chunk) = self.chunks.get_mut(&key) {
                // Zeroed with its bit, so a map equals itself read back
                // from the tree (which keeps only present checksums).
                chunk.present &= !(1 << bit);
                chunk.crcs[bit] = 0;
                if chunk.present == 0 {
                    self.chunks.remove(&key);
                }
            }
        }
    }

    /// The chunk keys (block address / 4096 / 64) that `[addr, addr + len)`
    /// touches, first and last.
    pub fn chunk_span(addr: u64, len: u64) -> Option<(u64, u64)> {
        if len == 0 {
            return None;
        }
        let first = locate(addr).0;
        let last = locate(addr.saturating_add(len - 1)).0;
        Some((first, last))
    }

    /// The keys of the chunks held in `[first, last]`, ascending; costs the
    /// smaller of the span and the map.
    pub fn chunk_keys_in(&self, first: u64, last: u64) -> Vec<u64> {
        let span = last.saturating_sub(first).saturating_add(1);
        let mut keys: Vec<u64> = if span <= self.chunks.len() as u64 {
            (first..=last)
                .filter(|k| self.chunks.contains_key(k))
                .collect()
        } else {
            self.chunks
                .keys()
                .copied()
                .filter(|k| (first..=last).contains(k))
                .collect()
        };
        keys.sort_unstable();
        keys
    }

    /// One chunk as the metadata tree stores it: the `present` mask (u64),
    /// then the checksum of each present block in block order (u32 each),
    /// little-endian.
    pub(super) fn chunk(&self, key: u64) -> Option<&CsumChunk> {
        self.chunks.get(&key)
    }

    pub fn chunk_bytes(&self, key: u64) -> Option<Vec<u8>> {
        Some(self.chunks.get(&key)?.to_bytes())
    }

    /// Take back a chunk [`CsumMap::chunk_bytes`] wrote; an error says what
    /// does not add up.
    pub fn restore_chunk(&mut self, key: u64, b: &[u8]) -> Result<(), String> {
        self.chunks.insert(key, CsumChunk::from_bytes(b)?);
        Ok(())
    }

    /// Chunks held (64 blocks each).
    pub fn chunk_count(&self) -> usize {
        self.chunks.len()
    }

    /// Blocks with a checksum.
    pub fn len(&self) -> u64 {
        self.chunks
            .values()
            .map(|c| c.present.count_ones() as u64)
            .sum()
    }

    pub fn is_empty(&self) -> bool {
        self.chunks.is_empty()
    }

    /// Addresses of every block with a checksum, ascending.
    pub fn addrs(&self) -> Vec<u64> {
        let mut keys: Vec<u64> = self.chunks.keys().copied().collect();
        keys.sort_unstable();
        let mut out = Vec::new();
        for key in keys {
            let chunk = &self.chunks[&key];
            for bit in 0..CHUNK_BLOCKS {
                if chunk.present & (1 << bit) != 0 {
                    out.push((key * CHUNK_BLOCKS + bit) * BLOCK_SIZE);
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_get_remove_across_chunks() {
        let mut m = CsumMap::default();
        let base = (3u64 << 40) + 60 * BLOCK_SIZE;
        m.set(base, &[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(m.len(), 8);
        assert_eq!(m.get(base + 5 * BLOCK_SIZE), Some(6));
        assert_eq!(m.get(base + 8 * BLOCK_SIZE), None);
        assert_eq!(
            m.get_run(base - BLOCK_SIZE, 3),
            vec![None, Some(1), Some(2)]
        );
        m.remove(base + 2 * BLOCK_SIZE, 4 * BLOCK_SIZE);
        assert_eq!(m.len(), 4);
        assert_eq!(m.get(base + 2 * BLOCK_SIZE), None);
        assert_eq!(m.get(base + 6 * BLOCK_SIZE), Some(7));
        m.remove(base, 8 * BLOCK_SIZE);
        assert!(m.is_empty());
    }

    #[test]
    fn checkpoint_bytes_keep_the_address_order_and_the_old_encoding() {
        let mut forward = CsumMap::default();
        let mut backward = CsumMap::default();
        let addrs: Vec<u64> = (0..40u64).map(|i| i * 97 * BLOCK_SIZE).collect();
        for (i, &a) in addrs.iter().enumerate() {
            forward.set(a, &[i as u32]);
        }
        for (i, &a) in addrs.iter().enumerate().rev() {
            backward.set(a, &[i as u32]);
        }
        let bytes = crate::fs::layout::encode(&forward).unwrap();
        assert_eq!(bytes, crate::fs::layout::encode(&backward).unwrap());
        // Checkpoints written while the chunks lived in an ordered tree
        // decode, and encode to the same bytes.
        let as_tree: BTreeMap<u64, CsumChunk> = forward.chunks.clone().into_iter().collect();
        #[derive(Serialize)]
        struct TreeMap {
            chunks: BTreeMap<u64, CsumChunk>,
        }
        let old = crate::fs::layout::encode(&TreeMap { chunks: as_tree }).unwrap();
        assert_eq!(old, bytes);
        let decoded: CsumMap = crate::fs::layout::decode(&old, "map").unwrap();
        assert_eq!(decoded, forward);
        assert_eq!(decoded.addrs(), addrs);
    }

    #[test]
    fn mismatches_name_the_bad_blocks() {
        let kind = ChecksumKind::Crc32c;
        let mut data = vec![7u8; 3 * BLOCK_SIZE as usize];
        let expected: Vec<Option<u32>> = kind.blocks(&data).into_iter().map(Some).collect();
        assert!(kind.mismatches(&data, &expected).is_empty());
        data[BLOCK_SIZE as usize + 9] ^= 1;
        assert_eq!(kind.mismatches(&data, &expected), vec![1]);
        assert_eq!(
            kind.mismatches(&data, &[None, None, None]),
            Vec::<usize>::new()
        );
        assert!(ChecksumKind::None.mismatches(&data, &expected).is_empty());
    }
}
