//! The write-ahead log and checkpoints.
//!
//! A journal record is `[magic u32 | len u32 | seq u64 | payload crc u32 |
//! header crc u32]` + payload, padded to whole blocks, appended at the log
//! tail. Both crcs are seeded with the filesystem uuid, so records left over
//! from an earlier format never pass. Replay accepts only consecutive
//! sequence numbers after the checkpoint's, stopping at the first record that
//! is missing or fails a check (a torn commit). When the log is full the whole
//! metadata image is written to the older checkpoint slot instead and the log
//! restarts at its beginning.
//!
//! The magic says how the record was ordered against the data it points at:
//! `RFRL` was written after that data was flushed; `RFRV` (format 4) was
//! written alongside it and made durable by the same flush, so its data must
//! be checked against the record's checksums when it is the last record of
//! the log (see [`DataOrder`] and docs/consistency.md).

use super::inode::BLOCK_SIZE;
use super::layout::{round_up, write_header, FsHeader, Region};
use super::store::{group_addr, BlockStore, GroupKind, StoreError};
use super::tree::TreeRoot;
use super::{FsError, FsResult};

const RECORD_MAGIC: u32 = 0x4c52_4652; // "RFRL"
const VERIFIED_RECORD_MAGIC: u32 = 0x5652_4652; // "RFRV"
const CHECKPOINT_MAGIC: u32 = 0x4b43_4652; // "RFCK"
const TREE_CHECKPOINT_MAGIC: u32 = 0x5443_4652; // "RFCT"
const RECORD_HEADER: usize = 24;
const CHECKPOINT_HEADER: usize = 32;

/// Where the log and checkpoints stand.
#[derive(Debug, Clone)]
pub struct Journal {
    pub header: FsHeader,
    pub meta_group: u32,
    /// Sequence number of the last durable record or checkpoint.
    pub seq: u64,
    /// Offset of the next record within the journal region.
    pub tail: u64,
    /// Slot holding the newest checkpoint.
    pub newest_slot: usize,
    /// The log ends with a `VerifiedAtReplay` record: its data must not be
    /// overwritten in place until another record follows it.
    pub ends_verified: bool,
}

fn seeded_crc(uuid: &[u8; 16], parts: &[&[u8]]) -> u32 {
    parts
        .iter()
        .fold(crc32c::crc32c(uuid), |crc, p| crc32c::crc32c_append(crc, p))
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

pub fn record_bytes(payload_len: usize) -> u64 {
    round_up((RECORD_HEADER + payload_len) as u64, BLOCK_SIZE)
}

/// How a record was ordered against the data blocks it points at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DataOrder {
    /// The data was durable before the record was written.
    FlushedBefore,
    /// The data and the record were made durable by one flush: until a later
    /// record exists, the data may be missing or torn, and replay checks it
    /// against the record's checksums.
    VerifiedAtReplay,
}

impl DataOrder {
    fn magic(self) -> u32 {
        match self {
            DataOrder::FlushedBefore => RECORD_MAGIC,
            DataOrder::VerifiedAtReplay => VERIFIED_RECORD_MAGIC,
        }
    }

    fn from_magic(magic: u32) -> Option<DataOrder> {
        match magic {
            RECORD_MAGIC => Some(DataOrder::FlushedBefore),
            VERIFIED_RECORD_MAGIC => Some(DataOrder::VerifiedAtReplay),
            _ => None,
        }
    }
}

/// A record read back from the log.
pub struct StoredRecord {
    pub payload: Vec<u8>,
    /// Bytes it takes in the log.
    pub len: u64,
    pub order: DataOrder,
}

pub(super) fn encode_record(
    uuid: &[u8; 16],
    seq: u64,
    payload: &[u8],
    order: DataOrder,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(record_bytes(payload.len()) as usize);
    out.extend_from_slice(&order.magic().to_le_bytes());
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&seq.to_le_bytes());
    out.extend_from_slice(&seeded_crc(uuid, &[payload]).to_le_bytes());
    let hcrc = seeded_crc(uuid, &[&out[..20]]);
    out.extend_from_slice(&hcrc.to_le_bytes());
    out.extend_from_slice(payload);
    out.resize(record_bytes(payload.len()) as usize, 0);
    out
}

/// (len, payload crc, order) of a record header that is whole and has `seq`.
fn parse_record_header(
    uuid: &[u8; 16],
    b: &[u8],
    seq: u64,
    max_len: u64,
) -> Option<(usize, u32, DataOrder)> {
    if b.len() < RECORD_HEADER || u64_at(b, 8) != seq {
        return None;
    }
    let order = DataOrder::from_magic(u32_at(b, 0))?;
    if seeded_crc(uuid, &[&b[..20]]) != u32_at(b, 20) {
        return None;
    }
    let len = u32_at(b, 4) as usize;
    (record_bytes(len) <= max_len).then_some((len, u32_at(b, 16), order))
}

pub(super) fn encode_checkpoint_header(uuid: &[u8; 16], seq: u64, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(BLOCK_SIZE as usize);
    out.extend_from_slice(&CHECKPOINT_MAGIC.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(&seq.to_le_bytes());
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(&seeded_crc(uuid, &[payload]).to_le_bytes());
    let hcrc = seeded_crc(uuid, &[&out[..28]]);
    out.extend_from_slice(&hcrc.to_le_bytes());
    out.resize(BLOCK_SIZE as usize, 0);
    out
}

/// (seq, len, payload crc) of a whole checkpoint header.
fn parse_checkpoint_header(uuid: &[u8; 16], b: &[u8], slot_len: u64) -> Option<(u64, usize, u32)> {
    if b.len() < CHECKPOINT_HEADER || u32_at(b, 0) != CHECKPOINT_MAGIC {
        return None;
    }
    if seeded_crc(uuid, &[&b[..28]]) != u32_at(b, 28) {
        return None;
    }
    let len = u64_at(b, 16);
    (len.saturating_add(BLOCK_SIZE) <= slot_len).then_some((
        u64_at(b, 8),
        len as usize,
        u32_at(b, 24),
    ))
}

/// The payload of the record with sequence `seq` at the start of `bytes`,
/// judged as [`read_record`] judges one (`room`: bytes left in the log).
pub(super) fn decode_record<'a>(
    uuid: &[u8; 16],
    bytes: &'a [u8],
    seq: u64,
    room: u64,
) -> FsResult<&'a [u8]> {
    let (len, crc, _) = parse_record_header(uuid, bytes, seq, room).ok_or_else(|| {
        FsError::Corrupt(format!(
            "no whole journal record {seq} here (magic, sequence, header checksum or length)"
        ))
    })?;
    let payload = bytes
        .get(RECORD_HEADER..RECORD_HEADER + len)
        .ok_or_else(|| FsError::Corrupt(format!("journal record {seq} is cut short")))?;
    if seeded_crc(uuid, &[payload]) != crc {
        return Err(FsError::Corrupt(format!(
            "journal record {seq} payload fails its checksum"
        )));
    }
    Ok(payload)
}

/// The payload of the checkpoint at the start of `bytes` (a slot of
/// `slot_len` bytes), judged as [`read_slot`] judges one.
pub(super) fn decode_checkpoint<'a>(
    uuid: &[u8; 16],
    bytes: &'a [u8],
    slot_len: u64,
) -> FsResult<&'a [u8]> {
    let (_, len, crc) = parse_checkpoint_header(uuid, bytes, slot_len).ok_or_else(|| {
        FsError::Corrupt("no whole checkpoint header here (magic, checksum or length)".into())
    })?;
    let start = BLOCK_SIZE as usize;
    let payload = bytes
        .get(start..start.saturating_add(len))
        .ok_or_else(|| FsError::Corrupt("checkpoint is cut short".into()))?;
    if seeded_crc(uuid, &[payload]) != crc {
        return Err(FsError::Corrupt(
            "checkpoint payload fails its checksum".into(),
        ));
    }
    Ok(payload)
}

/// A checkpoint of a filesystem whose metadata lives in the tree: one
/// block in a slot naming the tree's root as of sequence number `seq`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TreeCheckpoint {
    pub seq: u64,
    pub root: TreeRoot,
    pub next_ino: u64,
    pub next_gen: u64,
}

/// Bytes of a tree checkpoint block that its crc covers (the crc is the
/// block's last four bytes).
const TREE_CHECKPOINT_CRC_AT: usize = BLOCK_SIZE as usize - 4;

/// A tree checkpoint block: fixed-width little-endian fields, zeros, and a
/// crc seeded with the uuid in the last four bytes (docs/format.md).
pub fn encode_tree_checkpoint(uuid: &[u8; 16], cp: &TreeCheckpoint) -> Vec<u8> {
    let mut out = Vec::with_capacity(BLOCK_SIZE as usize);
    out.extend_from_slice(&TREE_CHECKPOINT_MAGIC.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(&cp.seq.to_le_bytes());
    out.extend_from_slice(&cp.root.addr.to_le_bytes());
    out.extend_from_slice(&cp.root.generation.to_le_bytes());
    out.extend_from_slice(&cp.root.nodes.to_le_bytes());
    out.push(cp.root.level);
    out.extend_from_slice(&[0u8; 7]);
    out.extend_from_slice(&cp.next_ino.to_le_bytes());
    out.extend_from_slice(&cp.next_gen.to_le_bytes());
    out.resize(TREE_CHECKPOINT_CRC_AT, 0);
    let crc = seeded_crc(uuid, &[&out]);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// A tree checkpoint block judged: length, magic, crc, and a root that is
/// either empty or at a nonzero address with a generation no later than
/// the checkpoint's.
pub fn decode_tree_checkpoint(uuid: &[u8; 16], b: &[u8]) -> FsResult<TreeCheckpoint> {
    if b.len() != BLOCK_SIZE as usize {
        return Err(FsError::Corrupt(format!(
            "a tree checkpoint is one {BLOCK_SIZE}-byte block, not {}",
            b.len()
        )));
    }
    if u32_at(b, 0) != TREE_CHECKPOINT_MAGIC {
        return Err(FsError::Corrupt("no tree checkpoint magic".into()));
    }
    if seeded_crc(uuid, &[&b[..TREE_CHECKPOINT_CRC_AT]]) != u32_at(b, TREE_CHECKPOINT_CRC_AT) {
        return Err(FsError::Corrupt(
            "tree checkpoint fails its checksum".into(),
        ));
    }
    let cp = TreeCheckpoint {
        seq: u64_at(b, 8),
        root: TreeRoot {
            addr: u64_at(b, 16),
            generation: u64_at(b, 24),
            nodes: u64_at(b, 32),
            level: b[40],
        },
        next_ino: u64_at(b, 48),
        next_gen: u64_at(b, 56),
    };
    if u32_at(b, 4) != 0 || b[41..48].iter().any(|&x| x != 0) {
        return Err(FsError::Corrupt(
            "tree checkpoint has reserved bytes set (written by a newer raidfs?)".into(),
        ));
    }
    if cp.root.generation > cp.seq || (cp.root.addr == 0) != (cp.root.nodes == 0) {
        return Err(FsError::Corrupt(format!(
            "tree checkpoint {} names an impossible root ({:?})",
            cp.seq, cp.root
        )));
    }
    Ok(cp)
}

/// The tree checkpoint in `slot`, if one passes its checks on some copy.
pub fn read_tree_slot(
    store: &dyn BlockStore,
    uuid: &[u8; 16],
    slot: Region,
) -> FsResult<Option<TreeCheckpoint>> {
    let ok = |b: &[u8]| decode_tree_checkpoint(uuid, b).is_ok();
    match read_verified(store, slot.addr, BLOCK_SIZE as usize, &ok)? {
        Some(block) => decode_tree_checkpoint(uuid, &block).map(Some),
        None => Ok(None),
    }
}

/// Read with a checksum test; `None` when no copy passes it.
fn read_verified(
    store: &dyn BlockStore,
    addr: u64,
    len: usize,
    ok: &dyn Fn(&[u8]) -> bool,
) -> FsResult<Option<Vec<u8>>> {
    let mut buf = vec![0u8; len];
    match store.read(addr, &mut buf, Some(ok)) {
        Ok(()) => Ok(Some(buf)),
        Err(StoreError::Unrecoverable(_)) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// A checkpoint found in a slot.
pub struct SlotContents {
    pub seq: u64,
    pub payload: Vec<u8>,
}

pub fn read_slot(
    store: &dyn BlockStore,
    uuid: &[u8; 16],
    slot: Region,
) -> FsResult<Option<SlotContents>> {
    let header_ok = |b: &[u8]| parse_checkpoint_header(uuid, b, slot.len).is_some();
    let Some(head) = read_verified(store, slot.addr, BLOCK_SIZE as usize, &header_ok)? else {
        return Ok(None);
    };
    let Some((seq, len, crc)) = parse_checkpoint_header(uuid, &head, slot.len) else {
        return Ok(None);
    };
    let payload_ok = |b: &[u8]| seeded_crc(uuid, &[b]) == crc;
    let Some(payload) = read_verified(store, slot.addr + BLOCK_SIZE, len, &payload_ok)? else {
        return Ok(None);
    };
    Ok(Some(SlotContents { seq, payload }))
}

/// Read the next record (sequence `seq`) at `tail`; `None` at the end of the log.
pub fn read_record(
    store: &dyn BlockStore,
    header: &FsHeader,
    tail: u64,
    seq: u64,
) -> FsResult<Option<StoredRecord>> {
    let uuid = &header.uuid;
    let room = header.journal.len.saturating_sub(tail);
    if room < BLOCK_SIZE {
        return Ok(None);
    }
    let addr = header.journal.addr + tail;
    let header_ok = |b: &[u8]| parse_record_header(uuid, b, seq, room).is_some();
    let Some(first) = read_verified(store, addr, BLOCK_SIZE as usize, &header_ok)? else {
        return Ok(None);
    };
    let Some((len, crc, order)) = parse_record_header(uuid, &first, seq, room) else {
        return Ok(None);
    };
    let payload_ok = |b: &[u8]| seeded_crc(uuid, &[b]) == crc;
    let Some(payload) = read_verified(store, addr + RECORD_HEADER as u64, len, &payload_ok)? else {
        return Ok(None);
    };
    Ok(Some(StoredRecord {
        payload,
        len: record_bytes(len),
        order,
    }))
}

impl Journal {
    pub fn fits(&self, payload_len: usize) -> bool {
        self.tail + record_bytes(payload_len) <= self.header.journal.len
    }

    /// Append one record and make it durable with one store flush. With
    /// [`DataOrder::FlushedBefore`] the caller flushed the data first; with
    /// [`DataOrder::VerifiedAtReplay`] this flush makes the data durable too.
    /// Either way the flush completes before the next record is written,
    /// which is what lets replay trust every record but the last.
    pub fn append(
        &mut self,
        store: &dyn BlockStore,
        payload: &[u8],
        order: DataOrder,
    ) -> FsResult<()> {
        let seq = self.seq + 1;
        let rec = encode_record(&self.header.uuid, seq, payload, order);
        store.write(self.header.journal.addr + self.tail, &rec)?;
        store.flush()?;
        self.seq = seq;
        self.tail += rec.len() as u64;
        self.ends_verified = order == DataOrder::VerifiedAtReplay;
        Ok(())
    }

    /// The sequence number the next record or checkpoint takes (tree nodes
    /// written for a checkpoint carry it as their generation).
    pub fn next_seq(&self) -> u64 {
        self.seq + 1
    }

    /// Make a tree checkpoint durable in the older slot, then restart the
    /// log. The tree's nodes must already be durable (flushed): the slot's
    /// write is the moment the new root takes over.
    pub fn checkpoint_root(
        &mut self,
        store: &dyn BlockStore,
        root: TreeRoot,
        (next_ino, next_gen): (u64, u64),
    ) -> FsResult<()> {
        let cp = TreeCheckpoint {
            seq: self.next_seq(),
            root,
            next_ino,
            next_gen,
        };
        let target = 1 - self.newest_slot;
        let slot = self.header.slots[target];
        store.write(slot.addr, &encode_tree_checkpoint(&self.header.uuid, &cp))?;
        store.flush()?;
        self.seq = cp.seq;
        self.newest_slot = target;
        self.tail = 0;
        self.ends_verified = false;
        Ok(())
    }

    /// Write a full image to the older slot (moving the slots to a new
    /// Metadata group if it does not fit), make it durable, restart the log.
    pub fn checkpoint(&mut self, store: &dyn BlockStore, image: &[u8]) -> FsResult<()> {
        let seq = self.seq + 1;
        let needed = BLOCK_SIZE + image.len() as u64;
        let mut target = 1 - self.newest_slot;
        let mut new_header = None;
        if needed > self.header.slots[target].len {
            let group = store
                .allocate_group(GroupKind::Metadata)
                .map_err(|e| match e {
                    StoreError::NoSpace => FsError::NoSpace,
                    other => other.into(),
                })?;
            let half = group.capacity / 2 / BLOCK_SIZE * BLOCK_SIZE;
            if needed > half {
                return Err(FsError::NoSpace);
            }
            let mut h = self.header.clone();
            h.generation += 1;
            h.slots = [
                Region {
                    addr: group_addr(group.index, 0),
                    len: half,
                },
                Region {
                    addr: group_addr(group.index, half),
                    len: half,
                },
            ];
            target = 0;
            new_header = Some(h);
        }
        let slot = new_header.as_ref().unwrap_or(&self.header).slots[target];
        store.write(slot.addr + BLOCK_SIZE, image)?;
        store.write(
            slot.addr,
            &encode_checkpoint_header(&self.header.uuid, seq, image),
        )?;
        store.flush()?;
        if let Some(h) = new_header {
            write_header(store, self.meta_group, &h)?;
            self.header = h;
        }
        self.seq = seq;
        self.newest_slot = target;
        self.tail = 0;
        self.ends_verified = false;
        Ok(())
    }
}
