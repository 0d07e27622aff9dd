//! The filesystem's decoders of untrusted bytes as one public surface, for
//! the fuzz tests (`tests/fuzz_decoders.rs`) and tools: the header block,
//! a journal record, a checkpoint, a tree checkpoint, a tree node and a
//! tree's entries, each judged exactly as mounting judges it, plus [`samples`], valid encodings to start mutating from. Every
//! function returns an error saying what is wrong instead of panicking,
//! whatever the bytes.

use super::csum::ChecksumKind;
use super::dir::Dir;
use super::extent::Extent;
use super::inode::{Inode, Time, BLOCK_SIZE};
use super::journal::{self, DataOrder};
use super::layout::{self, decode, encode, FsHeader};
use super::meta::{CommitRecord, DirOp, Meta, MetaImage};
use super::meta_tree::{entries_of, Loader};
use super::tree;
use super::{FileKind, FsError, FsResult, ROOT_INO};
use crate::features::Features;

/// What a decoded structure held, so a fuzz test can check a valid sample
/// round-trips.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decoded {
    pub inodes: usize,
    pub dir_entries: usize,
}

/// A header block (4 KiB, a frame around the bincode header) as
/// `read_header` judges each copy.
pub fn header_block(block: &[u8]) -> FsResult<u32> {
    FsHeader::decode_block(block).map(|h| h.version)
}

/// The header copy in `block` with its feature words replaced (a version 5
/// header), re-framed: what a newer raidfs with more features would have
/// written. For tests of how this release meets such a filesystem.
pub fn with_header_features(block: &[u8], features: Features) -> FsResult<Vec<u8>> {
    let mut header = FsHeader::decode_block_any_features(block)?;
    if header.version < layout::FEATURE_WORDS_VERSION {
        return Err(FsError::Corrupt(format!(
            "a format {} header has no feature words",
            header.version
        )));
    }
    header.features = features;
    header.encode_block()
}

/// The feature words of the header copy in `block`.
pub fn header_features(block: &[u8]) -> FsResult<Features> {
    Ok(FsHeader::decode_block_any_features(block)?.features)
}

/// A journal record with sequence number `seq` at the start of `bytes`
/// (header, payload, padding), as replay judges it, then replayed onto
/// an empty metadata image.
pub fn record(uuid: &[u8; 16], bytes: &[u8], seq: u64) -> FsResult<Decoded> {
    let payload = journal::decode_record(uuid, bytes, seq, bytes.len() as u64)?;
    record_payload(payload)
}

/// A journal record's payload: decoded and replayed onto an empty image.
pub fn record_payload(payload: &[u8]) -> FsResult<Decoded> {
    let rec: CommitRecord = decode(payload, "journal record")?;
    let mut meta = Meta::default();
    meta.apply(rec)?;
    Ok(summary(&meta))
}

/// A checkpoint slot's bytes (header block, then payload), as loading
/// judges it, then turned into the in-memory metadata.
pub fn checkpoint(uuid: &[u8; 16], bytes: &[u8]) -> FsResult<Decoded> {
    let payload = journal::decode_checkpoint(uuid, bytes, bytes.len() as u64)?;
    checkpoint_payload(payload)
}

/// A checkpoint's payload: decoded into the in-memory metadata.
pub fn checkpoint_payload(payload: &[u8]) -> FsResult<Decoded> {
    let image: MetaImage = decode(payload, "checkpoint")?;
    Ok(summary(&Meta::from_image(image)))
}

/// A tree checkpoint block (one slot's first block), as loading judges it;
/// its sequence number.
pub fn tree_checkpoint(uuid: &[u8; 16], block: &[u8]) -> FsResult<u64> {
    journal::decode_tree_checkpoint(uuid, block).map(|cp| cp.seq)
}

/// A tree node read from `addr`, as every read of one judges it.
pub fn tree_node(uuid: &[u8; 16], block: &[u8], addr: u64) -> FsResult<tree::NodeSummary> {
    tree::decode_node(uuid, block, addr)
}

/// A tree's entries in key order, taken as mounting takes them.
pub fn tree_entries(entries: &[(Vec<u8>, Vec<u8>)]) -> FsResult<Decoded> {
    let mut loader = Loader::new(ROOT_INO + 1, 2);
    for (k, v) in entries {
        loader.take(k, v)?;
    }
    Ok(summary(&loader.finish()?))
}

fn summary(meta: &Meta) -> Decoded {
    Decoded {
        inodes: meta.inodes.len(),
        dir_entries: meta.dirs.values().map(Dir::len).sum(),
    }
}

/// Valid encodings of each structure, as a small filesystem writes them.
pub struct Samples {
    pub uuid: [u8; 16],
    /// A version-current header copy (4 KiB).
    pub header_block: Vec<u8>,
    /// One journal record with sequence number [`Samples::record_seq`].
    pub record: Vec<u8>,
    pub record_seq: u64,
    /// Its payload alone.
    pub record_payload: Vec<u8>,
    /// A checkpoint slot's bytes (header block and payload).
    pub checkpoint: Vec<u8>,
    /// Its payload alone.
    pub checkpoint_payload: Vec<u8>,
    /// A tree checkpoint block (sequence number 9).
    pub tree_checkpoint: Vec<u8>,
    /// Tree nodes with the addresses they were written at.
    pub tree_nodes: Vec<(u64, Vec<u8>)>,
    /// The checkpoint's metadata as tree entries, in key order.
    pub tree_entries: Vec<(Vec<u8>, Vec<u8>)>,
}

/// An inode with fixed times, so the samples' bytes are the same in every
/// run (a fuzz case is replayed from its seed alone).
fn fixed_inode(ino: u64, kind: FileKind, perm: u16, owner: u32) -> Inode {
    let mut inode = Inode::new(ino, 1, kind, perm, owner, owner);
    let t = Time {
        secs: 1_700_000_000 + ino as i64,
        nanos: 123_456_789,
    };
    (inode.atime, inode.mtime, inode.ctime, inode.crtime) = (t, t, t, t);
    inode
}

fn sample_inode(ino: u64, kind: FileKind) -> Inode {
    let mut inode = fixed_inode(ino, kind, 0o644, 1000);
    inode.size = 3 * BLOCK_SIZE;
    inode.xattrs.insert(b"user.k".to_vec(), b"v".to_vec());
    inode
        .extents
        .insert(0, (1 << 40) + 8 * BLOCK_SIZE, 2 * BLOCK_SIZE);
    inode.extents.insert_as(
        2 * BLOCK_SIZE,
        Extent {
            unwritten: true,
            ..Extent::new((1 << 40) + 16 * BLOCK_SIZE, BLOCK_SIZE)
        },
    );
    inode
}

/// Build the samples: the same bytes in every run.
pub fn samples() -> FsResult<Samples> {
    let uuid = *b"raidfs-fuzz-uuid";
    let mut header = layout::plan(0, 64 << 20, uuid, ChecksumKind::Crc32c)?;
    header.generation = 7;
    let header_block = header.encode_block()?;

    let mut root = fixed_inode(ROOT_INO, FileKind::Dir, 0o755, 0);
    root.nlink = 3;
    root.parent = ROOT_INO;
    let mut sub = fixed_inode(ROOT_INO + 1, FileKind::Dir, 0o700, 0);
    sub.parent = ROOT_INO;
    let mut link = fixed_inode(ROOT_INO + 3, FileKind::Symlink, 0o777, 0);
    link.target = b"file".to_vec();
    let file = sample_inode(ROOT_INO + 2, FileKind::File);
    let mut csum_sets = vec![((1 << 40) + 8 * BLOCK_SIZE, vec![0x1234_5678, 0x9abc_def0])];
    csum_sets.push(((1 << 40) + 64 * BLOCK_SIZE, vec![1; 70]));
    let rec = CommitRecord {
        next_ino: ROOT_INO + 4,
        next_gen: 3,
        puts: vec![root, sub, file, link],
        dir_ops: vec![
            DirOp::Insert {
                dir: ROOT_INO,
                name: b"sub".to_vec(),
                ino: ROOT_INO + 1,
                cookie: 3,
            },
            DirOp::Insert {
                dir: ROOT_INO,
                name: b"file".to_vec(),
                ino: ROOT_INO + 2,
                cookie: 4,
            },
            DirOp::Insert {
                dir: ROOT_INO + 1,
                name: b"link".to_vec(),
                ino: ROOT_INO + 3,
                cookie: 3,
            },
            DirOp::Remove {
                dir: ROOT_INO,
                name: b"gone".to_vec(),
            },
        ],
        deleted: vec![ROOT_INO + 9],
        csum_sets,
        csum_drops: vec![Extent::new((1 << 40) + 64 * BLOCK_SIZE, 4 * BLOCK_SIZE)],
    };
    let record_payload = encode(&rec)?;
    let record_seq = 5;
    let record = journal::encode_record(
        &uuid,
        record_seq,
        &record_payload,
        DataOrder::VerifiedAtReplay,
    );

    let mut meta = Meta::default();
    meta.apply(decode(&record_payload, "sample record")?)?;
    let checkpoint_payload = encode(&meta.image()?)?;
    let mut checkpoint = journal::encode_checkpoint_header(&uuid, 9, &checkpoint_payload);
    checkpoint.extend_from_slice(&checkpoint_payload);
    let tree_nodes = tree::sample_node_blocks(&uuid);
    let (root_addr, root_block) = tree_nodes
        .last()
        .ok_or_else(|| FsError::Corrupt("no sample tree node".into()))?;
    let root = tree::decode_node(&uuid, root_block, *root_addr)?;
    let tree_checkpoint = journal::encode_tree_checkpoint(
        &uuid,
        &journal::TreeCheckpoint {
            seq: 9,
            root: tree::TreeRoot {
                addr: *root_addr,
                generation: root.generation,
                level: root.level,
                nodes: tree_nodes.len() as u64,
            },
            next_ino: meta.next_ino,
            next_gen: meta.next_gen,
        },
    );
    let tree_entries = entries_of(&meta)?;
    Ok(Samples {
        uuid,
        header_block,
        record,
        record_seq,
        record_payload,
        checkpoint,
        checkpoint_payload,
        tree_checkpoint,
        tree_nodes,
        tree_entries,
    })
}
