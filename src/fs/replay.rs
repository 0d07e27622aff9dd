//! Replaying the journal after the newest checkpoint, and checking the data
//! of a record that was made durable together with its data.
//!
//! A `VerifiedAtReplay` record and the data blocks it points at were written
//! before one flush. Every commit's flush completes before the next record is
//! written, so a record that has a successor had its data on stable storage;
//! only the last record of the log can point at data a crash lost or tore.
//! Its checksum sets say what each newly written block must hold: when a
//! block matches on no copy (nor by reconstruction), the commit never
//! completed, no fsync returned on it, and replay ends before it, leaving
//! the filesystem as the previous record left it.

use std::collections::BTreeMap;

use super::csum::ChecksumKind;
use super::inode::BLOCK_SIZE;
use super::journal::{read_record, DataOrder, Journal};
use super::layout::decode;
use super::meta::{CommitRecord, Meta};
use super::store::{BlockStore, StoreError};
use super::FsResult;

/// Blocks read at once while checking a record's data.
const CHECK_RUN_BLOCKS: usize = 256;

/// What [`replay`] applied.
pub struct Replayed {
    pub records: u64,
    /// The sequence number of a last record dropped because its data did
    /// not all reach the store.
    pub dropped: Option<u64>,
}

/// Apply every record after the checkpoint `journal` stands at, moving its
/// sequence number and tail past them; `seen` is shown each record applied
/// (the metadata tree notes the keys it changed).
pub fn replay(
    store: &dyn BlockStore,
    journal: &mut Journal,
    meta: &mut Meta,
    seen: &mut dyn FnMut(&CommitRecord),
) -> FsResult<Replayed> {
    let mut records: Vec<(CommitRecord, u64, DataOrder)> = Vec::new();
    let (mut tail, mut seq) = (journal.tail, journal.seq);
    while let Some(stored) = read_record(store, &journal.header, tail, seq + 1)? {
        tail += stored.len;
        seq += 1;
        let rec: CommitRecord = decode(&stored.payload, "journal record")?;
        records.push((rec, stored.len, stored.order));
    }
    let mut dropped = None;
    if let Some((rec, _, DataOrder::VerifiedAtReplay)) = records.last() {
        if !data_on_store(store, journal.header.data_checksum, rec)? {
            dropped = Some(seq);
            records.pop();
        }
    }
    let count = records.len() as u64;
    for (rec, len, order) in records {
        seen(&rec);
        meta.apply(rec)?;
        journal.seq += 1;
        journal.tail += len;
        journal.ends_verified = order == DataOrder::VerifiedAtReplay;
    }
    Ok(Replayed {
        records: count,
        dropped,
    })
}

/// What the mount log and fsck say about a record [`replay`] left out.
pub fn left_out_note(seq: u64) -> String {
    format!(
        "journal record {seq} left out: the data it points at did not reach the disk \
         before the last crash (no fsync had returned on it)"
    )
}

/// Does every block `rec` set a checksum for (and did not free again) hold
/// data matching it on some copy?
fn data_on_store(store: &dyn BlockStore, kind: ChecksumKind, rec: &CommitRecord) -> FsResult<bool> {
    if !kind.enabled() {
        // Nothing to check against; such records are never written this way.
        return Ok(true);
    }
    // Later sets of a block supersede earlier ones (a block rewritten in
    // place within the batch); blocks freed again hold nothing anyone reads.
    let mut want: BTreeMap<u64, u32> = BTreeMap::new();
    for (addr, crcs) in &rec.csum_sets {
        for (i, crc) in crcs.iter().enumerate() {
            want.insert(addr + i as u64 * BLOCK_SIZE, *crc);
        }
    }
    for ext in &rec.csum_drops {
        let freed: Vec<u64> = want
            .range(ext.addr..ext.addr + ext.len)
            .map(|(a, _)| *a)
            .collect();
        for addr in freed {
            want.remove(&addr);
        }
    }
    let mut runs: Vec<(u64, Vec<u32>)> = Vec::new();
    for (addr, crc) in want {
        match runs.last_mut() {
            Some((start, crcs))
                if *start + crcs.len() as u64 * BLOCK_SIZE == addr
                    && crcs.len() < CHECK_RUN_BLOCKS =>
            {
                crcs.push(crc)
            }
            _ => runs.push((addr, vec![crc])),
        }
    }
    for (start, crcs) in runs {
        if !run_on_store(store, kind, start, &crcs)? {
            return Ok(false);
        }
    }
    Ok(true)
}

/// One run of consecutive blocks; a run no single copy holds whole is
/// checked block by block, since each block may be whole on another copy.
fn run_on_store(
    store: &dyn BlockStore,
    kind: ChecksumKind,
    start: u64,
    crcs: &[u32],
) -> FsResult<bool> {
    let block = BLOCK_SIZE as usize;
    let mut buf = vec![0u8; crcs.len() * block];
    let whole = |b: &[u8]| b.chunks(block).zip(crcs).all(|(d, c)| kind.block(d) == *c);
    // Every copy, not the one a read would pick: a copy the crash tore or
    // the disk lost is healed now, before anything (a resync, a read of the
    // other copy) can take it for the truth.
    match store.scrub_read(start, &mut buf, &whole, true) {
        Ok(_) => return Ok(true),
        // A single block has no other way to be whole.
        Err(StoreError::Unrecoverable(_)) if crcs.len() == 1 => return Ok(false),
        Err(StoreError::Unrecoverable(_)) => {}
        Err(e) => return Err(e.into()),
    }
    for (i, crc) in crcs.iter().enumerate() {
        let one = &mut buf[i * block..(i + 1) * block];
        let matches = |b: &[u8]| kind.block(b) == *crc;
        match store.scrub_read(start + (i * block) as u64, one, &matches, true) {
            Ok(_) => {}
            Err(StoreError::Unrecoverable(_)) => return Ok(false),
            Err(e) => return Err(e.into()),
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::super::core::{
        format, format_images, load, metadata_group, Inner, VERIFIED_COMMIT_MAX,
    };
    use super::super::extent::Extent;
    use super::super::layout::{read_header, write_header, FsHeader};
    use super::super::store::{group_addr, GroupKind};
    use super::super::teststore::{MemStore, MirrorStore};
    use super::*;

    const KIND: ChecksumKind = ChecksumKind::Crc32c;

    /// A data block's address, with `byte` written into all of it, and its checksum.
    fn data_block(store: &dyn BlockStore, index: u64, byte: u8) -> (u64, u32) {
        let group = store
            .groups()
            .into_iter()
            .find(|g| g.kind == GroupKind::Data)
            .map(|g| g.index);
        let group = match group {
            Some(g) => g,
            None => store.allocate_group(GroupKind::Data).unwrap().index,
        };
        let addr = group_addr(group, index * BLOCK_SIZE);
        let data = vec![byte; BLOCK_SIZE as usize];
        store.write(addr, &data).unwrap();
        (addr, KIND.block(&data))
    }

    /// Commit a batch that sets the checksums of `blocks` (and frees `freed`).
    fn commit_blocks(inner: &Inner, blocks: &[(u64, u32)], freed: &[Extent]) {
        inner
            .mutate(|st| {
                for (addr, crc) in blocks {
                    st.set_csums(*addr, vec![*crc]).unwrap();
                }
                st.batch.freed.extend_from_slice(freed);
                Ok(())
            })
            .unwrap();
        assert!(inner.commit(false).unwrap());
    }

    fn corrupt(store: &dyn BlockStore, addr: u64) {
        store.write(addr, &[0xEE; BLOCK_SIZE as usize]).unwrap();
    }

    #[test]
    fn a_last_record_whose_data_was_lost_is_left_out() {
        let store = Arc::new(MemStore::new(4, 8 << 20, 64 << 10));
        format(&store, KIND, crate::fs::FORMAT_VERSION).unwrap();
        let inner = Inner::open(store.clone(), false).unwrap();
        assert!(inner.verified_commits);
        let first = data_block(store.as_ref(), 0, 1);
        commit_blocks(&inner, &[first], &[]);
        let second = data_block(store.as_ref(), 1, 2);
        commit_blocks(&inner, &[second], &[]);
        drop(inner);

        let whole = load(&(store.clone() as Arc<dyn BlockStore>)).unwrap();
        assert_eq!(whole.meta.csums.get(second.0).unwrap(), Some(second.1));
        let replayed = whole.replayed;

        corrupt(store.as_ref(), second.0);
        let torn = load(&(store.clone() as Arc<dyn BlockStore>)).unwrap();
        assert_eq!(torn.replayed, replayed - 1, "the last record is left out");
        assert_eq!(torn.meta.csums.get(second.0).unwrap(), None);
        assert_eq!(
            torn.meta.csums.get(first.0).unwrap(),
            Some(first.1),
            "earlier ones stay"
        );
        assert_eq!(torn.journal.seq, whole.journal.seq - 1);
        assert!(
            torn.notes.iter().any(|n| n.contains("left out")),
            "{:?}",
            torn.notes
        );

        // The next commit takes the dropped record's place in the log.
        let inner = Inner::open(store.clone(), false).unwrap();
        let third = data_block(store.as_ref(), 2, 3);
        commit_blocks(&inner, &[third], &[]);
        drop(inner);
        let after = load(&(store.clone() as Arc<dyn BlockStore>)).unwrap();
        assert_eq!(after.journal.seq, whole.journal.seq);
        assert_eq!(after.meta.csums.get(third.0).unwrap(), Some(third.1));
        assert_eq!(after.meta.csums.get(second.0).unwrap(), None);
    }

    #[test]
    fn only_the_last_record_is_checked_and_freed_blocks_are_not() {
        let store = Arc::new(MemStore::new(4, 8 << 20, 64 << 10));
        format(&store, KIND, crate::fs::FORMAT_VERSION).unwrap();
        let inner = Inner::open(store.clone(), false).unwrap();
        let early = data_block(store.as_ref(), 0, 1);
        commit_blocks(&inner, &[early], &[]);
        // Written and freed again within one batch: nothing reads it.
        let gone = data_block(store.as_ref(), 1, 2);
        let kept = data_block(store.as_ref(), 2, 3);
        let freed = Extent::new(gone.0, BLOCK_SIZE);
        commit_blocks(&inner, &[gone, kept], &[freed]);
        drop(inner);
        let replayed = load(&(store.clone() as Arc<dyn BlockStore>))
            .unwrap()
            .replayed;

        // A record with a successor had its data flushed before the
        // successor was written: it is not read back.
        corrupt(store.as_ref(), early.0);
        corrupt(store.as_ref(), gone.0);
        let loaded = load(&(store.clone() as Arc<dyn BlockStore>)).unwrap();
        assert_eq!(loaded.replayed, replayed);
        assert_eq!(loaded.meta.csums.get(kept.0).unwrap(), Some(kept.1));
    }

    #[test]
    fn data_whole_on_another_copy_keeps_the_record_and_heals() {
        let store = Arc::new(MirrorStore::new(4, 8 << 20, 64 << 10));
        format(&store, KIND, crate::fs::FORMAT_VERSION).unwrap();
        let inner = Inner::open(store.clone(), false).unwrap();
        let blocks: Vec<(u64, u32)> = (0..4)
            .map(|i| data_block(store.as_ref(), i, i as u8))
            .collect();
        commit_blocks(&inner, &blocks, &[]);
        drop(inner);
        let replayed = load(&(store.clone() as Arc<dyn BlockStore>))
            .unwrap()
            .replayed;

        // Block 1 torn on copy 0 and block 2 on copy 1: no copy holds the
        // run whole, each block is whole on one of them.
        store.corrupt(0, blocks[1].0, BLOCK_SIZE as usize).unwrap();
        store.corrupt(1, blocks[2].0, BLOCK_SIZE as usize).unwrap();
        let loaded = load(&(store.clone() as Arc<dyn BlockStore>)).unwrap();
        assert_eq!(loaded.replayed, replayed);
        let mut buf = vec![0u8; BLOCK_SIZE as usize];
        store.read(blocks[1].0, &mut buf, None).unwrap();
        assert_eq!(
            KIND.block(&buf),
            blocks[1].1,
            "copy 0 rewritten from copy 1"
        );

        store.corrupt(1, blocks[1].0, BLOCK_SIZE as usize).unwrap();
        store.corrupt(0, blocks[1].0, BLOCK_SIZE as usize).unwrap();
        assert_eq!(
            load(&(store.clone() as Arc<dyn BlockStore>))
                .unwrap()
                .replayed,
            replayed - 1,
            "no copy left"
        );
    }

    /// The magic of the record `commit` writes next.
    fn next_record_magic(store: &dyn BlockStore, inner: &Inner, commit: impl FnOnce()) -> u32 {
        let addr = {
            let journal = inner.journal.lock();
            journal.header.journal.addr + journal.tail
        };
        commit();
        let mut magic = [0u8; 4];
        store.read(addr, &mut magic, None).unwrap();
        u32::from_le_bytes(magic)
    }

    const FLUSHED_BEFORE: u32 = 0x4c52_4652; // "RFRL"
    const VERIFIED: u32 = 0x5652_4652; // "RFRV"

    #[test]
    fn large_batches_and_older_formats_flush_their_data_first() {
        let store = Arc::new(MemStore::new(4, 64 << 20, 64 << 10));
        // Image checkpoints, so the header can be turned into format 3's.
        format_images(&store, KIND).unwrap();
        let inner = Inner::open(store.clone(), false).unwrap();
        let small = [data_block(store.as_ref(), 0, 1)];
        let magic = next_record_magic(store.as_ref(), &inner, || {
            commit_blocks(&inner, &small, &[])
        });
        assert_eq!(magic, VERIFIED);
        let blocks = VERIFIED_COMMIT_MAX / BLOCK_SIZE + 1;
        let big: Vec<(u64, u32)> = (1..=blocks)
            .map(|i| data_block(store.as_ref(), i, 7))
            .collect();
        let magic = next_record_magic(store.as_ref(), &inner, || commit_blocks(&inner, &big, &[]));
        assert_eq!(magic, FLUSHED_BEFORE, "a batch over the limit");
        drop(inner);

        // Version 3 readers know only RFRL: its filesystems keep two flushes.
        let group = metadata_group(store.as_ref()).unwrap();
        let (header, _) = read_header(store.as_ref(), group).unwrap();
        write_header(
            store.as_ref(),
            group,
            &FsHeader {
                version: 3,
                features: crate::fs::layout::implied_features(3),
                ..header
            },
        )
        .unwrap();
        let inner = Inner::open(store.clone(), false).unwrap();
        assert!(!inner.verified_commits);
        let magic = next_record_magic(store.as_ref(), &inner, || {
            commit_blocks(&inner, &small, &[])
        });
        assert_eq!(magic, FLUSHED_BEFORE, "version 3");

        // Without data checksums there is nothing to check at replay.
        let store = Arc::new(MemStore::new(4, 8 << 20, 64 << 10));
        format(&store, ChecksumKind::None, crate::fs::FORMAT_VERSION).unwrap();
        assert!(!Inner::open(store, false).unwrap().verified_commits);
    }
}
