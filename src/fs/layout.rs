//! On-disk layout of the Metadata group: the filesystem header (two copies),
//! the two checkpoint slots and the journal area, plus the checksummed frame
//! shared by every metadata structure.
//!
//! Group 0 (Metadata, mirrored by the array):
//! `[header copy 0 | header copy 1 | journal ... | slot A | slot B]`.
//! A checkpoint that outgrows its slots moves both slots to a fresh Metadata
//! group and the header is rewritten to say so.
//!
//! From format 5 the header carries compat, ro-compat and incompat feature
//! words ([`crate::features`]); what formats 3 and 4 added are incompat bits
//! there, and older headers are read as having exactly the bits their
//! version implies. The header codec here is the one place that maps between
//! the two.

use serde::{Deserialize, Serialize};

use super::csum::ChecksumKind;
use super::inode::BLOCK_SIZE;
use super::store::{group_addr, BlockStore, StoreError};
use super::{FsError, FsResult};
use crate::features::{Features, Known};

pub const HEADER_MAGIC: u64 = 0x3130_5346_4449_4152; // "RAIDFS01"
/// 2: data block checksums (the header names the algorithm).
/// 3: unwritten extents (fallocate reserves blocks without writing them);
/// a version 2 filesystem is still read and written, without them.
/// 4: journal records written alongside their data (one flush per commit),
/// checked against their checksums at replay; older versions commit with
/// two flushes.
/// 5: the three feature words after the other fields; 3's and 4's additions
/// become incompat bits. From here on a new feature is a bit, not a version.
pub const VERSION: u32 = 5;
/// The first version with feature words.
pub const FEATURE_WORDS_VERSION: u32 = 5;
/// Incompat: unwritten extents (bit 63 of a stored extent address marks one;
/// a reader without it would take the bit for part of the address).
pub const INCOMPAT_UNWRITTEN_EXTENTS: u64 = 1 << 0;
/// Incompat: `RFRV` journal records (written alongside their data, checked
/// at replay); a reader without it would end the log before one and lose
/// the last fsync.
pub const INCOMPAT_VERIFIED_RECORDS: u64 = 1 << 1;
/// Incompat: the metadata lives in a copy-on-write B+tree of checksummed
/// nodes in the Metadata groups, and a checkpoint slot holds only the
/// tree's root ([`super::tree`], [`super::meta_tree`]); a reader without
/// it would take the slot for a whole metadata image.
pub const INCOMPAT_METADATA_TREE: u64 = 1 << 2;
/// The filesystem header's feature bits with their names.
pub const FS_FEATURES: Known = Known {
    what: "filesystem header",
    compat: &[],
    ro_compat: &[],
    incompat: &[
        (INCOMPAT_UNWRITTEN_EXTENTS, "unwritten_extents"),
        (INCOMPAT_VERIFIED_RECORDS, "verified_records"),
        (INCOMPAT_METADATA_TREE, "metadata_tree"),
    ],
};

/// The features a header of `version` has: for versions before 5 those its
/// version implies, from 5 on every incompat feature this release writes.
pub fn implied_features(version: u32) -> Features {
    let mut incompat = 0;
    if version >= 3 {
        incompat |= INCOMPAT_UNWRITTEN_EXTENTS;
    }
    if version >= 4 {
        incompat |= INCOMPAT_VERIFIED_RECORDS;
    }
    if version >= FEATURE_WORDS_VERSION {
        incompat |= INCOMPAT_METADATA_TREE;
    }
    Features {
        incompat,
        ..Features::default()
    }
}
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

#[derive(Clone, Debug, PartialEq, Eq)]
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
    /// Stored from version 5; before, [`implied_features`] of the version.
    pub features: Features,
}

/// The fields every version stores, bincode in this order, framed at the
/// start of the header block.
#[derive(Serialize, Deserialize)]
struct StoredHeader {
    magic: u64,
    version: u32,
    uuid: [u8; 16],
    generation: u64,
    slots: [Region; 2],
    journal: Region,
    #[serde(with = "super::codes::checksum_kind")]
    data_checksum: ChecksumKind,
}

/// Bytes of a header copy.
pub const HEADER_BLOCK: usize = BLOCK_SIZE as usize;
/// Where the feature words sit in a version 5 header block: its last 32
/// bytes, outside the frame, so a release that knows only format 4 still
/// decodes the frame and refuses the filesystem by its version (naming
/// it) instead of calling the header damaged.
pub const FEATURES_AT: usize = HEADER_BLOCK - 32;
/// Magic of the feature words, "RFFW".
pub const FEATURES_MAGIC: u32 = 0x5746_4652;

impl FsHeader {
    fn stored(&self) -> StoredHeader {
        StoredHeader {
            magic: self.magic,
            version: self.version,
            uuid: self.uuid,
            generation: self.generation,
            slots: self.slots,
            journal: self.journal,
            data_checksum: self.data_checksum,
        }
    }

    fn from_stored(h: StoredHeader, features: Features) -> FsHeader {
        FsHeader {
            magic: h.magic,
            version: h.version,
            uuid: h.uuid,
            generation: h.generation,
            slots: h.slots,
            journal: h.journal,
            data_checksum: h.data_checksum,
            features,
        }
    }

    /// Whether the format has unwritten extents.
    pub fn unwritten_extents(&self) -> bool {
        self.features.incompat & INCOMPAT_UNWRITTEN_EXTENTS != 0
    }

    /// Whether the format has `RFRV` records.
    pub fn verified_records(&self) -> bool {
        self.features.incompat & INCOMPAT_VERIFIED_RECORDS != 0
    }

    /// Whether the metadata lives in the tree (the slots hold its root).
    pub fn metadata_tree(&self) -> bool {
        self.features.incompat & INCOMPAT_METADATA_TREE != 0
    }

    /// One header copy as stored: the frame of the fields, zeros, and (from
    /// version 5) the feature words in the last 32 bytes. A version before 5
    /// can hold only the features its version implies.
    pub fn encode_block(&self) -> FsResult<Vec<u8>> {
        let mut block = frame(&encode(&self.stored())?, false);
        if block.len() > FEATURES_AT {
            return Err(FsError::Corrupt(format!(
                "header frame of {} bytes does not fit its block",
                block.len()
            )));
        }
        block.resize(HEADER_BLOCK, 0);
        if self.version >= FEATURE_WORDS_VERSION {
            let tail = &mut block[FEATURES_AT..];
            tail[0..4].copy_from_slice(&FEATURES_MAGIC.to_le_bytes());
            tail[4..12].copy_from_slice(&self.features.compat.to_le_bytes());
            tail[12..20].copy_from_slice(&self.features.ro_compat.to_le_bytes());
            tail[20..28].copy_from_slice(&self.features.incompat.to_le_bytes());
            let crc = crc32c::crc32c(&tail[..28]);
            tail[28..32].copy_from_slice(&crc.to_le_bytes());
        } else if self.features != implied_features(self.version) {
            return Err(FsError::Corrupt(format!(
                "a format {} header cannot hold the features {}",
                self.version,
                FS_FEATURES.describe(&self.features)
            )));
        }
        Ok(block)
    }

    /// Decode one header copy of any version this release reads. Refuses
    /// a damaged copy, another magic, an unsupported version and unknown
    /// incompat features, each naming what it found.
    pub fn decode_block(block: &[u8]) -> FsResult<FsHeader> {
        judge(block)?
    }

    /// Decode a header copy whatever its features (for tools that show or
    /// set them); still refuses a damaged copy or another version.
    pub fn decode_block_any_features(block: &[u8]) -> FsResult<FsHeader> {
        match judge(block)? {
            Err(FsError::Feature(_)) => {
                let stored = unframe(block)
                    .ok_or_else(|| FsError::Corrupt("header frame fails its checksum".into()))?;
                Ok(FsHeader::from_stored(
                    decode(stored, "header")?,
                    stored_features(block)?,
                ))
            }
            other => other,
        }
    }
}

/// The feature words at the end of a version 5 header block.
fn stored_features(block: &[u8]) -> FsResult<Features> {
    let tail = block
        .get(FEATURES_AT..HEADER_BLOCK)
        .ok_or_else(|| FsError::Corrupt(format!("header block is {} bytes", block.len())))?;
    let word = |at: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&tail[at..at + 8]);
        u64::from_le_bytes(w)
    };
    if tail[0..4] != FEATURES_MAGIC.to_le_bytes() {
        return Err(FsError::Corrupt("header has no feature words".into()));
    }
    if crc32c::crc32c(&tail[..28]).to_le_bytes() != tail[28..32] {
        return Err(FsError::Corrupt(
            "header feature words fail their checksum".into(),
        ));
    }
    Ok(Features {
        compat: word(4),
        ro_compat: word(12),
        incompat: word(20),
    })
}

/// A header copy judged: the outer error when it is not a whole raidfs
/// header (a failing checksum, garbage that happens to pass one), the inner
/// one when it is one this release refuses (a newer version, an unknown
/// incompat feature), which must be reported as such and not taken for
/// damage.
fn judge(block: &[u8]) -> FsResult<FsResult<FsHeader>> {
    use bincode::Options;
    let payload =
        unframe(block).ok_or_else(|| FsError::Corrupt("header frame fails its checksum".into()))?;
    let (magic, version): (u64, u32) = codec()
        .allow_trailing_bytes()
        .deserialize(payload)
        .map_err(|e| FsError::Corrupt(format!("header does not decode: {e}")))?;
    if magic != HEADER_MAGIC {
        return Err(FsError::Corrupt(format!(
            "header magic {magic:#x} is not raidfs's"
        )));
    }
    if !(OLDEST_VERSION..=VERSION).contains(&version) {
        return Ok(Err(FsError::Corrupt(format!(
            "unsupported filesystem version {version} (this raidfs opens {OLDEST_VERSION} to {VERSION}; a newer raidfs wrote it)"
        ))));
    }
    let stored: StoredHeader = decode(payload, "header")?;
    let features = if version >= FEATURE_WORDS_VERSION {
        stored_features(block)?
    } else {
        implied_features(version)
    };
    let header = FsHeader::from_stored(stored, features);
    Ok(FS_FEATURES
        .refuse_open(&header.features)
        .map(|()| header)
        .map_err(FsError::Feature))
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

/// Whether a header copy is whole: its frame checks and it is a raidfs
/// header (of any version and features: those are judged after).
fn header_ok(buf: &[u8]) -> bool {
    judge(buf).is_ok()
}

/// Compute the layout for a fresh filesystem of the newest format in
/// Metadata group `group`.
pub fn plan(
    group: u32,
    capacity: u64,
    uuid: [u8; 16],
    data_checksum: ChecksumKind,
) -> FsResult<FsHeader> {
    plan_with(
        group,
        capacity,
        uuid,
        data_checksum,
        VERSION,
        implied_features(VERSION),
    )
}

/// [`plan`] for format `version` with `features`. With the
/// metadata tree, each slot is one block (a tree root) and the rest of the
/// group after the journal holds tree nodes; without it the two slots
/// share that rest, each taking a whole metadata image.
pub fn plan_with(
    group: u32,
    capacity: u64,
    uuid: [u8; 16],
    data_checksum: ChecksumKind,
    version: u32,
    features: Features,
) -> FsResult<FsHeader> {
    let cap = capacity / BLOCK_SIZE * BLOCK_SIZE;
    if cap < 64 * BLOCK_SIZE {
        return Err(FsError::NoSpace);
    }
    let journal_len = (cap / 8).clamp(16 * BLOCK_SIZE, 64 << 20) / BLOCK_SIZE * BLOCK_SIZE;
    let journal_start = 2 * BLOCK_SIZE;
    let slot_len = if features.incompat & INCOMPAT_METADATA_TREE != 0 {
        BLOCK_SIZE
    } else {
        (cap - journal_start - journal_len) / 2 / BLOCK_SIZE * BLOCK_SIZE
    };
    let slot_a = journal_start + journal_len;
    Ok(FsHeader {
        magic: HEADER_MAGIC,
        version,
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
        features,
    })
}

/// Write both header copies (each flushed before the next, so one of them is
/// always whole).
pub fn write_header(store: &dyn BlockStore, meta_group: u32, header: &FsHeader) -> FsResult<()> {
    let block = header.encode_block()?;
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
                let h = FsHeader::decode_block(&buf)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn varint(v: u64) -> Vec<u8> {
        match v {
            0..=250 => vec![v as u8],
            251..=0xffff => [vec![251], (v as u16).to_le_bytes().to_vec()].concat(),
            0x1_0000..=0xffff_ffff => [vec![252], (v as u32).to_le_bytes().to_vec()].concat(),
            _ => [vec![253], v.to_le_bytes().to_vec()].concat(),
        }
    }

    fn sample(version: u32) -> FsHeader {
        let mut h = plan(3, 256 << 20, *b"0123456789abcdef", ChecksumKind::Crc32c).unwrap();
        h.version = version;
        h.features = implied_features(version);
        h.generation = 300;
        h
    }

    fn table(doc: &str, heading: &str) -> Vec<Vec<String>> {
        let start = doc.find(heading).unwrap();
        doc[start..]
            .lines()
            .skip_while(|l| !l.starts_with('|'))
            .take_while(|l| l.starts_with('|'))
            .skip(2)
            .map(|l| {
                l.trim_matches('|')
                    .split('|')
                    .map(|c| c.trim().to_string())
                    .collect()
            })
            .collect()
    }

    /// docs/format.md's header tables, row by row, against the bytes.
    #[test]
    fn format_md_header_tables_match_the_encoded_bytes() {
        let doc = include_str!("../../docs/format.md");
        let fields = table(doc, "### Filesystem header bytes");
        let words = table(doc, "Feature words (version 5 on;");
        for version in [4, VERSION] {
            let mut h = sample(version);
            if version >= FEATURE_WORDS_VERSION {
                h.features.compat = 1 << 20;
                h.features.ro_compat = 0x0102_0304_0506_0708;
            }
            let mut payload = Vec::new();
            for row in &fields {
                let bytes = match row[1].trim_matches('`') {
                    "magic" => varint(h.magic),
                    "version" => varint(h.version as u64),
                    "uuid" => h.uuid.to_vec(),
                    "generation" => varint(h.generation),
                    "slots" => h
                        .slots
                        .iter()
                        .flat_map(|r| [varint(r.addr), varint(r.len)].concat())
                        .collect(),
                    "journal" => [varint(h.journal.addr), varint(h.journal.len)].concat(),
                    "data_checksum" => vec![1],
                    other => panic!("unknown header field {other}"),
                };
                payload.extend(bytes);
            }
            let block = h.encode_block().unwrap();
            assert_eq!(block.len(), 4096);
            assert_eq!(unframe(&block), Some(&payload[..]), "version {version}");
            let mut at = FEATURES_AT;
            for row in &words {
                let (offset, size): (usize, usize) =
                    (row[0].parse().unwrap(), row[1].parse().unwrap());
                assert_eq!(offset, at, "{row:?}");
                let bytes = &block[offset..offset + size];
                if version < FEATURE_WORDS_VERSION {
                    assert!(bytes.iter().all(|&b| b == 0), "v{version} {row:?}");
                } else {
                    let want: Vec<u8> = match row[2].trim_matches('`') {
                        "magic" => b"RFFW".to_vec(),
                        "compat" => h.features.compat.to_le_bytes().to_vec(),
                        "ro_compat" => h.features.ro_compat.to_le_bytes().to_vec(),
                        "incompat" => h.features.incompat.to_le_bytes().to_vec(),
                        "crc" => crc32c::crc32c(&block[FEATURES_AT..4092])
                            .to_le_bytes()
                            .to_vec(),
                        other => panic!("unknown feature field {other}"),
                    };
                    assert_eq!(bytes, &want[..], "{row:?}");
                }
                at = offset + size;
            }
            assert_eq!(at, 4096);
            assert_eq!(FsHeader::decode_block(&block).unwrap(), h);
        }
        assert_eq!(FEATURES_MAGIC.to_le_bytes(), *b"RFFW");
        assert_eq!(varint(HEADER_MAGIC).len(), 9);
        // The feature table names every known bit, and nothing else.
        let named: Vec<Vec<String>> = table(doc, "### Filesystem feature words")
            .into_iter()
            .filter(|r| r[3] != "—")
            .collect();
        let known: Vec<(String, u64, &str)> = [
            ("compat", FS_FEATURES.compat),
            ("ro_compat", FS_FEATURES.ro_compat),
            ("incompat", FS_FEATURES.incompat),
        ]
        .iter()
        .flat_map(|(w, bits)| bits.iter().map(move |(b, n)| (format!("`{w}`"), *b, *n)))
        .collect();
        assert_eq!(named.len(), known.len(), "{named:?}");
        for (word, bit, name) in known {
            assert!(
                named.iter().any(|r| r[0] == word
                    && r[1] == bit.trailing_zeros().to_string()
                    && r[2] == format!("`{bit:#x}`")
                    && r[3] == format!("`{name}`")),
                "no row for {word} {name}"
            );
        }
    }

    #[test]
    fn older_headers_read_with_the_features_their_version_implies() {
        for version in OLDEST_VERSION..FEATURE_WORDS_VERSION {
            let h = sample(version);
            let back = FsHeader::decode_block(&h.encode_block().unwrap()).unwrap();
            assert_eq!(back.features, implied_features(version), "v{version}");
            assert_eq!(back.unwritten_extents(), version >= 3);
            assert_eq!(back.verified_records(), version >= 4);
            let mut odd = h.clone();
            odd.features.compat = 1;
            assert!(
                odd.encode_block().is_err(),
                "v{version} has no feature words"
            );
        }
    }

    #[test]
    fn unknown_incompat_bits_refuse_the_header_naming_them() {
        let mut h = sample(VERSION);
        h.features.incompat |= 1 << 12;
        let block = h.encode_block().unwrap();
        let err = FsHeader::decode_block(&block).unwrap_err().to_string();
        assert!(
            err.contains("filesystem header has unknown incompatible feature bit 12 (0x1000)"),
            "{err}"
        );
        // Still a whole header: the copy is not taken for a damaged one.
        assert!(header_ok(&block));
        assert_eq!(
            FsHeader::decode_block_any_features(&block)
                .unwrap()
                .features,
            h.features
        );
        // Damaged feature words make a damaged copy.
        let mut torn = block.clone();
        torn[FEATURES_AT + 5] ^= 1;
        assert!(!header_ok(&torn));
        let mut h = sample(VERSION);
        h.features.ro_compat |= 1 << 4;
        h.features.compat |= 1 << 7;
        assert_eq!(
            FsHeader::decode_block(&h.encode_block().unwrap()).unwrap(),
            h,
            "kept"
        );
        let mut newer = sample(VERSION);
        newer.version = VERSION + 1;
        let err = FsHeader::decode_block(&newer.encode_block().unwrap())
            .unwrap_err()
            .to_string();
        assert!(err.contains("unsupported filesystem version 6"), "{err}");
    }
}
