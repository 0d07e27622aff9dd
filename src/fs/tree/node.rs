//! The on-disk form of one metadata tree node: its 4096-byte encoding, the
//! cheap check a read's `verify` closure applies (so the array can fall back
//! to another mirror copy), and the full structural decoder that everything
//! read from disk goes through before the tree trusts it. Nothing here panics
//! on bad bytes: every field is bounds-checked and a bad block becomes an
//! error saying what is wrong.
//!
//! # Node layout (4096 bytes, integers little-endian)
//!
//! | offset | size | field                                                         |
//! |-------:|-----:|---------------------------------------------------------------|
//! |      0 |    4 | magic `0x4e544652` (the bytes `"RFTN"`)                        |
//! |      4 |    1 | level: 0 = leaf, 1..=16 = internal (children are level - 1)   |
//! |      5 |    1 | flags: must be 0                                              |
//! |      6 |    2 | count: entries, ≥ 1                                           |
//! |      8 |    8 | addr: the node's own logical address                          |
//! |     16 |    8 | generation: the checkpoint (write-out) the node was written in|
//! |     24 |    4 | crc: crc32c seeded with the filesystem uuid (crc32c of the 16 uuid bytes, continued) over all 4096 bytes with this field taken as zero |
//! |     28 |    2 | used: bytes from offset 0 to the end of the last entry (32..=4096) |
//! |     30 |    2 | pad: must be 0                                                |
//! |     32 |  ... | `count` entries, packed, no padding                           |
//! |   used |  ... | zero to the end of the block                                  |
//!
//! Leaf entry (level 0): `key_len u16 | val_len u16 | key | value`, with
//! `key_len <= MAX_KEY` and `key_len + val_len <= MAX_ENTRY`.
//!
//! Internal entry (level ≥ 1): `key_len u16 | key | child_addr u64 |
//! child_generation u64`. Entry 0's key is always empty and stands for minus
//! infinity (the empty key is the least key anyway); entry i's key is a lower
//! bound of child i's subtree: every key under child i lies in
//! `[key_i, key_{i+1})` (the last child's upper bound is the parent's). A
//! separator need not be a stored key (leaf splits store the shortest prefix
//! that separates the two leaves). `child_addr` is non-zero and a multiple of
//! 4096; `child_generation` is at most the node's own generation, and is the
//! generation the child must carry: a read rejects an older node left at that
//! address by a lost write.
//!
//! In both kinds keys are strictly ascending in bytewise (memcmp) order.
//!
//! A block is accepted only if the crc matches, the magic is right, `addr`
//! is the address it was read from, `generation` and `level` are what the
//! parent (or the tree root record) expects, and the structure checks pass.

use crate::fs::{FsError, FsResult};

/// Bytes of one node.
pub const NODE_SIZE: usize = 4096;
/// Bytes of the node header.
pub const HEADER: usize = 32;
/// `"RFTN"` read as a little-endian u32.
pub const MAGIC: u32 = 0x4e54_4652;
/// Longest key.
pub const MAX_KEY: usize = 320;
/// Most key + value bytes of one leaf entry: with the 4-byte entry header a
/// leaf holds at least 3 entries, and (keys being at most `MAX_KEY`) an
/// internal node at least 10.
pub const MAX_ENTRY: usize = 1100;
/// Highest level a node may have.
pub const MAX_LEVEL: u8 = 16;
/// Bytes a leaf entry takes besides its key and value.
pub const LEAF_ENTRY_OVERHEAD: usize = 4;
/// Bytes an internal entry takes besides its key.
pub const INTERNAL_ENTRY_OVERHEAD: usize = 18;

const OFF_LEVEL: usize = 4;
const OFF_FLAGS: usize = 5;
const OFF_COUNT: usize = 6;
const OFF_ADDR: usize = 8;
const OFF_GEN: usize = 16;
const OFF_CRC: usize = 24;
const OFF_USED: usize = 28;
const OFF_PAD: usize = 30;

/// What [`decode_node`] reports of a valid node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeSummary {
    pub level: u8,
    pub count: u16,
    pub generation: u64,
}

/// A node's entries as decoded: a leaf's values or an internal node's
/// `(child addr, child generation)` pairs, parallel to the keys.
pub(crate) enum Body {
    Leaf(Vec<Vec<u8>>),
    Internal(Vec<(u64, u64)>),
}

pub(crate) struct Parsed {
    pub summary: NodeSummary,
    pub keys: Vec<Vec<u8>>,
    pub body: Body,
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// The crc a block should carry (its crc field taken as zero).
fn block_crc(uuid: &[u8; 16], block: &[u8]) -> u32 {
    let head = &block[..OFF_CRC.min(block.len())];
    let tail = block.get(OFF_CRC + 4..).unwrap_or(&[]);
    let crc = crc32c::crc32c_append(crc32c::crc32c(uuid), head);
    let crc = crc32c::crc32c_append(crc, &[0; 4]);
    crc32c::crc32c_append(crc, tail)
}

/// Stamp `block`'s crc field. Public so a fuzzer can re-seal mutated blocks
/// and reach the structure checks behind the crc.
pub fn reseal(uuid: &[u8; 16], block: &mut [u8]) {
    if block.len() >= OFF_CRC + 4 {
        let crc = block_crc(uuid, block);
        block[OFF_CRC..OFF_CRC + 4].copy_from_slice(&crc.to_le_bytes());
    }
}

/// Why `block` is not the node expected at `addr` with `generation` and
/// `level`, or `None` when it is (header and crc only; the read's verify
/// test, so a rejected copy is retried from another mirror).
pub(crate) fn header_fault(
    uuid: &[u8; 16],
    block: &[u8],
    addr: u64,
    generation: u64,
    level: u8,
) -> Option<String> {
    if block.len() != NODE_SIZE {
        return Some(format!("block is {} bytes, not {NODE_SIZE}", block.len()));
    }
    let magic = u32_at(block, 0).unwrap_or(0);
    if magic != MAGIC {
        return Some(format!("bad magic {magic:#010x}"));
    }
    let own = u64_at(block, OFF_ADDR).unwrap_or(0);
    if own != addr {
        return Some(format!("node says it belongs at {own:#x}"));
    }
    let crc = u32_at(block, OFF_CRC).unwrap_or(0);
    if crc != block_crc(uuid, block) {
        return Some("checksum mismatch".to_string());
    }
    let g = u64_at(block, OFF_GEN).unwrap_or(0);
    if g != generation {
        return Some(format!(
            "generation {g}, expected {generation} (a stale node left by a lost write)"
        ));
    }
    if block[OFF_LEVEL] != level {
        return Some(format!("level {}, expected {level}", block[OFF_LEVEL]));
    }
    None
}

/// Decode and check one node read from `addr`, crc included.
pub fn decode_node(uuid: &[u8; 16], block: &[u8], addr: u64) -> FsResult<NodeSummary> {
    let fault = |why: String| FsError::Corrupt(format!("tree node at {addr:#x}: {why}"));
    if block.len() != NODE_SIZE {
        return Err(fault(format!(
            "block is {} bytes, not {NODE_SIZE}",
            block.len()
        )));
    }
    if u32_at(block, 0) != Some(MAGIC) {
        return Err(fault("bad magic".to_string()));
    }
    if u32_at(block, OFF_CRC) != Some(block_crc(uuid, block)) {
        return Err(fault("checksum mismatch".to_string()));
    }
    parse(block, addr).map(|p| p.summary).map_err(fault)
}

/// Every check but the crc (which the read's verify closure has done).
pub(crate) fn parse(block: &[u8], addr: u64) -> Result<Parsed, String> {
    if block.len() != NODE_SIZE {
        return Err(format!("block is {} bytes, not {NODE_SIZE}", block.len()));
    }
    let short = || "header cut short".to_string();
    if u32_at(block, 0).ok_or_else(short)? != MAGIC {
        return Err("bad magic".to_string());
    }
    let level = block[OFF_LEVEL];
    if level > MAX_LEVEL {
        return Err(format!("level {level} is above {MAX_LEVEL}"));
    }
    if block[OFF_FLAGS] != 0 {
        return Err(format!("unknown flags {:#x}", block[OFF_FLAGS]));
    }
    let count = u16_at(block, OFF_COUNT).ok_or_else(short)?;
    let own = u64_at(block, OFF_ADDR).ok_or_else(short)?;
    if own != addr {
        return Err(format!("node says it belongs at {own:#x}"));
    }
    let generation = u64_at(block, OFF_GEN).ok_or_else(short)?;
    let used = usize::from(u16_at(block, OFF_USED).ok_or_else(short)?);
    if !(HEADER..=NODE_SIZE).contains(&used) {
        return Err(format!("used length {used} outside {HEADER}..={NODE_SIZE}"));
    }
    if u16_at(block, OFF_PAD).ok_or_else(short)? != 0 {
        return Err("header padding is not zero".to_string());
    }
    if count == 0 {
        return Err("node has no entries".to_string());
    }
    let body_bytes = &block[..used];
    let n = usize::from(count);
    let mut keys: Vec<Vec<u8>> = Vec::with_capacity(n);
    let mut vals = Vec::new();
    let mut children = Vec::new();
    let mut at = HEADER;
    let cut = |i: usize| format!("entry {i} runs past the used length {used}");
    for i in 0..n {
        let key_len = usize::from(u16_at(body_bytes, at).ok_or_else(|| cut(i))?);
        if key_len > MAX_KEY {
            return Err(format!(
                "entry {i}: key of {key_len} bytes (most {MAX_KEY})"
            ));
        }
        let key;
        if level == 0 {
            let val_len = usize::from(u16_at(body_bytes, at + 2).ok_or_else(|| cut(i))?);
            if key_len + val_len > MAX_ENTRY {
                return Err(format!(
                    "entry {i}: {} key and value bytes (most {MAX_ENTRY})",
                    key_len + val_len
                ));
            }
            let k0 = at + LEAF_ENTRY_OVERHEAD;
            key = body_bytes.get(k0..k0 + key_len).ok_or_else(|| cut(i))?;
            let v0 = k0 + key_len;
            let val = body_bytes.get(v0..v0 + val_len).ok_or_else(|| cut(i))?;
            vals.push(val.to_vec());
            at = v0 + val_len;
        } else {
            let k0 = at + 2;
            key = body_bytes.get(k0..k0 + key_len).ok_or_else(|| cut(i))?;
            let c0 = k0 + key_len;
            let child = u64_at(body_bytes, c0).ok_or_else(|| cut(i))?;
            let child_gen = u64_at(body_bytes, c0 + 8).ok_or_else(|| cut(i))?;
            if child == 0 || child % NODE_SIZE as u64 != 0 {
                return Err(format!(
                    "entry {i}: child address {child:#x} is not a node address"
                ));
            }
            if child_gen > generation {
                return Err(format!(
                    "entry {i}: child generation {child_gen} is newer than the node's {generation}"
                ));
            }
            if i == 0 && key_len != 0 {
                return Err("first separator is not empty".to_string());
            }
            children.push((child, child_gen));
            at = c0 + 16;
        }
        if let Some(prev) = keys.last() {
            if prev.as_slice() >= key {
                return Err(format!("keys not strictly ascending at entry {i}"));
            }
        }
        keys.push(key.to_vec());
    }
    if at != used {
        return Err(format!("entries end at {at}, header says {used}"));
    }
    if block[used..].iter().any(|&b| b != 0) {
        return Err("bytes after the entries are not zero".to_string());
    }
    let body = if level == 0 {
        Body::Leaf(vals)
    } else {
        Body::Internal(children)
    };
    Ok(Parsed {
        summary: NodeSummary {
            level,
            count,
            generation,
        },
        keys,
        body,
    })
}

/// What to encode after the header: a leaf's values or an internal node's
/// child references, parallel to the keys.
pub(crate) enum Entries<'a> {
    Leaf(&'a [Vec<u8>]),
    Internal(&'a [(u64, u64)]),
}

/// Encode a node into `out` (exactly `NODE_SIZE` bytes, which this fills
/// completely). Fails, writing nothing useful, if the entries do not fit or
/// break the limits: the tree never asks for that, so it means a bug, and
/// the write-out stops before anything bad reaches the disk.
pub(crate) fn encode(
    uuid: &[u8; 16],
    addr: u64,
    generation: u64,
    level: u8,
    keys: &[Vec<u8>],
    entries: Entries<'_>,
    out: &mut [u8],
) -> FsResult<()> {
    let bug = |what: &str| FsError::Corrupt(format!("tree node for {addr:#x}: {what}"));
    if out.len() != NODE_SIZE {
        return Err(bug("output is not one node"));
    }
    let count = u16::try_from(keys.len()).map_err(|_| bug("too many entries"))?;
    if count == 0 || level > MAX_LEVEL || (level == 0) != matches!(entries, Entries::Leaf(_)) {
        return Err(bug("empty node, or level and entry kind disagree"));
    }
    out.fill(0);
    let mut at = HEADER;
    let mut put = |at: &mut usize, bytes: &[u8]| -> FsResult<()> {
        let dst = out
            .get_mut(*at..*at + bytes.len())
            .ok_or_else(|| bug("entries overflow the node"))?;
        dst.copy_from_slice(bytes);
        *at += bytes.len();
        Ok(())
    };
    match entries {
        Entries::Leaf(vals) => {
            if vals.len() != keys.len() {
                return Err(bug("keys and values differ in number"));
            }
            for (k, v) in keys.iter().zip(vals) {
                if k.len() > MAX_KEY || k.len() + v.len() > MAX_ENTRY {
                    return Err(bug("entry over the limits"));
                }
                put(&mut at, &(k.len() as u16).to_le_bytes())?;
                put(&mut at, &(v.len() as u16).to_le_bytes())?;
                put(&mut at, k)?;
                put(&mut at, v)?;
            }
        }
        Entries::Internal(children) => {
            if children.len() != keys.len() {
                return Err(bug("keys and children differ in number"));
            }
            for (k, (child, child_gen)) in keys.iter().zip(children) {
                if k.len() > MAX_KEY {
                    return Err(bug("separator over the limit"));
                }
                put(&mut at, &(k.len() as u16).to_le_bytes())?;
                put(&mut at, k)?;
                put(&mut at, &child.to_le_bytes())?;
                put(&mut at, &child_gen.to_le_bytes())?;
            }
        }
    }
    out[0..4].copy_from_slice(&MAGIC.to_le_bytes());
    out[OFF_LEVEL] = level;
    out[OFF_COUNT..OFF_COUNT + 2].copy_from_slice(&count.to_le_bytes());
    out[OFF_ADDR..OFF_ADDR + 8].copy_from_slice(&addr.to_le_bytes());
    out[OFF_GEN..OFF_GEN + 8].copy_from_slice(&generation.to_le_bytes());
    out[OFF_USED..OFF_USED + 2].copy_from_slice(&(at as u16).to_le_bytes());
    reseal(uuid, out);
    Ok(())
}

/// A valid leaf and a valid internal node (fixed bytes for a given uuid),
/// with the addresses they decode at: seeds for fuzzing [`decode_node`].
pub fn sample_node_blocks(uuid: &[u8; 16]) -> Vec<(u64, Vec<u8>)> {
    let leaf_addr = crate::fs::store::group_addr(0, 8 * NODE_SIZE as u64);
    let internal_addr = crate::fs::store::group_addr(0, 9 * NODE_SIZE as u64);
    let keys: Vec<Vec<u8>> = vec![b"alpha".to_vec(), b"beta".to_vec(), b"gamma".to_vec()];
    let vals: Vec<Vec<u8>> = vec![b"1".to_vec(), Vec::new(), vec![7u8; 40]];
    let seps: Vec<Vec<u8>> = vec![Vec::new(), b"m".to_vec()];
    let children = [(3 * NODE_SIZE as u64, 5), (4 * NODE_SIZE as u64, 6)];
    let mut leaf = vec![0u8; NODE_SIZE];
    let mut internal = vec![0u8; NODE_SIZE];
    let ok = encode(
        uuid,
        leaf_addr,
        7,
        0,
        &keys,
        Entries::Leaf(&vals),
        &mut leaf,
    )
    .is_ok()
        && encode(
            uuid,
            internal_addr,
            7,
            1,
            &seps,
            Entries::Internal(&children),
            &mut internal,
        )
        .is_ok();
    debug_assert!(ok, "sample nodes encode");
    vec![(leaf_addr, leaf), (internal_addr, internal)]
}
