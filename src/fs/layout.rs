//! On-disk layout of the Metadata group: the filesystem header (two copies),
//! the two checkpoint slots and the journal area, plus the checksummed frame
//! shared by every metadata structure.
//!
//! Group 0 (Metadata, mirrored by the array):
//! `[header copy 0 | header copy 1 | journal ... | slot A | slot B]`.
//! A checkpoint that outgrows its slots moves both slots to a fresh Metadata
//! group and the header is rewritten to say so.

use serde::{Deserialize, Serialize};

use super::csum::ChecksumKind;
use super::inode::BLOCK_SIZE;
use super::store::{group_addr, BlockStore, StoreError};
use super::{FsError, FsResult};

pub const HEADER_MAGIC: u64 = 0x3130_5346_4449_4152; // "RAIDFS01"
/// 2: data block checksums (the header names the algorithm).
/// 3: unwritten extents (fallocate reserves blocks without writing them);
/// a version 2 filesystem is still read and written, without them.
/// 4: journal records written alongside their data (one flush per commit),
/// checked against their checksums at replay; older versions commit with
/// two flushes.
pub const VERSION: u32 = 4;
/// The oldest version this code opens.
pub const OLDEST_VERSION: u32 = 2;
const HEADER_COPIES: [u64; 2] = [0, BLOCK_SIZE];

/// What the mount log and fsck say about a filesystem of an older format.
pub fn older_format_note(version: u32) -> String {
    format!(
        "filesystem format {version}; `raidfs upgrade` on the unmounted array moves it to format {VERSION} (`--check` tells what that brings)"
    )
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Region {
    pub addr: u64,
    pub len: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FsHeader {
    pub magic: u64,
    pub version: u32,
    pub uuid: [u8; 16],
    /// Bumped on every rewrite; the valid copy with the highest wins.
    pub generation: u64,
    pub slots: [Region; 2],
    pub journal: Region,
    /// How data blocks are checksummed.
    pub data_checksum: ChecksumKind,
}

pub fn round_up(v: u64, a: u64) -> u64 {
    v.div_ceil(a) * a
}

/// Frame: `[len u32][crc u32][payload]`, crc over len and payload.
pub fn frame(payload: &[u8], block_pad: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(payload.len() + 8);
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    let crc = crc32c::crc32c_append(crc32c::crc32c(&out), payload);
    out.extend_from_slice(&crc.to_le_bytes());
    out.extend_from_slice(payload);
    if block_pad {
        out.resize(round_up(out.len() as u64, BLOCK_SIZE) as usize, 0);
    }
    out
}

/// The payload of a frame, if its checksum holds.
pub fn unframe(buf: &[u8]) -> Option<&[u8]> {
    let len = u32::from_le_bytes(buf.get(0..4)?.try_into().ok()?) as usize;
    let crc = u32::from_le_bytes(buf.get(4..8)?.try_into().ok()?);
    let payload = buf.get(8..8 + len)?;
    (crc32c::crc32c_append(crc32c::crc32c(&buf[0..4]), payload) == crc).then_some(payload)
}

pub fn codec() -> impl bincode::Options {
    use bincode::Options;
    bincode::DefaultOptions::new().with_limit(1 << 34)
}

pub fn encode<T: Serialize>(v: &T) -> FsResult<Vec<u8>> {
    use bincode::Options;
    codec()
        .serialize(v)
        .map_err(|e| FsError::Corrupt(format!("cannot encode metadata: {e}")))
}

pub fn decode<'a, T: Deserialize<'a>>(bytes: &'a [u8], what: &str) -> FsResult<T> {
    use bincode::Options;
    codec().deserialize(bytes).map_err(|e| {
        FsError::Corrupt(format!(
            "{what} passes its checksum but does not decode: {e}"
        ))
    })
}

fn header_ok(buf: &[u8]) -> bool {
    unframe(buf)
        .and_then(|p| decode::<FsHeader>(p, "header").ok())
        .is_some_and(|h| h.magic == HEADER_MAGIC)
}

/// Compute the layout for a fresh filesystem in Metadata group `group`.
pub fn plan(
    group: u32,
    capacity: u64,
    uuid: [u8; 16],
    data_checksum: ChecksumKind,
) -> FsResult<FsHeader> {
    let cap = capacity / BLOCK_SIZE * BLOCK_SIZE;
    if cap < 64 * BLOCK_SIZE {
        return Err(FsError::NoSpace);
    }
    let journal_len = (cap / 8).clamp(16 * BLOCK_SIZE, 64 << 20) / BLOCK_SIZE * BLOCK_SIZE;
    let journal_start = 2 * BLOCK_SIZE;
    let slot_len = (cap - journal_start - journal_len) / 2 / BLOCK_SIZE * BLOCK_SIZE;
    let slot_a = journal_start + journal_len;
    Ok(FsHeader {
        magic: HEADER_MAGIC,
        version: VERSION,
        uuid,
        generation: 1,
        slots: [
            Region {
                addr: group_addr(group, slot_a),
                len: slot_len,
            },
            Region {
                addr: group_addr(group, slot_a + slot_len),
                len: slot_len,
            },
        ],
        journal: Region {
            addr: group_addr(group, journal_start),
            len: journal_len,
        },
        data_checksum,
    })
}

/// Write both header copies (each flushed before the next, so one of them is
/// always whole).
pub fn write_header(store: &dyn BlockStore, meta_group: u32, header: &FsHeader) -> FsResult<()> {
    let block = frame(&encode(header)?, true);
    for off in HEADER_COPIES {
        store.write(group_addr(meta_group, off), &block)?;
        store.flush()?;
    }
    Ok(())
}

/// The newest valid header copy, plus how many copies were bad.
pub fn read_header(store: &dyn BlockStore, meta_group: u32) -> FsResult<(FsHeader, Vec<String>)> {
    let mut best: Option<FsHeader> = None;
    let mut problems = Vec::new();
    for (i, off) in HEADER_COPIES.iter().enumerate() {
        let mut buf = vec![0u8; BLOCK_SIZE as usize];
        match store.read(group_addr(meta_group, *off), &mut buf, Some(&header_ok)) {
            Ok(()) => {
                let Some(payload) = unframe(&buf) else {
                    continue;
                };
                let h: FsHeader = decode(payload, "header")?;
                if !(OLDEST_VERSION..=VERSION).contains(&h.version) {
                    return Err(FsError::Corrupt(format!(
                        "unsupported filesystem version {}",
                        h.version
                    )));
                }
                if best.as_ref().is_none_or(|b| h.generation > b.generation) {
                    best = Some(h);
                }
            }
            Err(StoreError::Unrecoverable(_)) => {
                problems.push(format!("header copy {i} fails its checksum"))
            }
            Err(e) => return Err(e.into()),
        }
    }
    match best {
        Some(h) => Ok((h, problems)),
        None => Err(FsError::Corrupt(
            "no filesystem header copy passes its checksum (not a raidfs filesystem?)".into(),
        )),
    }
}
