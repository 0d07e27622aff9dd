//! The on-disk numbers of the enums the filesystem persists that are also
//! API types ([`FileKind`], [`ChecksumKind`]). bincode would store an enum
//! as its variant's position, so reordering or inserting a variant would
//! silently change the format; here each value has a fixed number, written
//! as a bincode varint u32 (one byte below 251: the same bytes the derived
//! encoding wrote, so every released format reads unchanged). Used through
//! `#[serde(with = "...")]` on the persisted fields; the API types carry no
//! serde derives, so nothing else can persist them by position.

use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serializer};

use super::csum::ChecksumKind;
use super::FileKind;

/// Every file kind with its number.
pub const FILE_KIND_CODES: [(FileKind, u32); 7] = [
    (FileKind::File, 0),
    (FileKind::Dir, 1),
    (FileKind::Symlink, 2),
    (FileKind::Fifo, 3),
    (FileKind::Socket, 4),
    (FileKind::CharDev, 5),
    (FileKind::BlockDev, 6),
];

/// Every checksum algorithm with its number.
pub const CHECKSUM_KIND_CODES: [(ChecksumKind, u32); 2] =
    [(ChecksumKind::None, 0), (ChecksumKind::Crc32c, 1)];

fn code_of<T: PartialEq + Copy>(table: &[(T, u32)], value: T) -> u32 {
    table
        .iter()
        .find(|(v, _)| *v == value)
        .map(|&(_, c)| c)
        // Unreachable while the tables list every variant, which the
        // tests below check for each.
        .unwrap_or(u32::MAX)
}

fn value_of<'de, T: Copy, D: Deserializer<'de>>(
    table: &[(T, u32)],
    what: &str,
    d: D,
) -> Result<T, D::Error> {
    let code = u32::deserialize(d)?;
    table
        .iter()
        .find(|(_, c)| *c == code)
        .map(|&(v, _)| v)
        .ok_or_else(|| D::Error::custom(format!("unknown {what} code {code}")))
}

/// `#[serde(with = "file_kind")]`.
pub mod file_kind {
    use super::*;

    pub fn serialize<S: Serializer>(kind: &FileKind, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u32(code_of(&FILE_KIND_CODES, *kind))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<FileKind, D::Error> {
        value_of(&FILE_KIND_CODES, "file kind", d)
    }

    /// The kind's number as one byte (a metadata tree's readdir entry).
    pub fn to_code(kind: FileKind) -> u8 {
        code_of(&FILE_KIND_CODES, kind) as u8
    }

    /// The kind numbered `code`, if any.
    pub fn from_code(code: u8) -> Option<FileKind> {
        FILE_KIND_CODES
            .iter()
            .find(|(_, c)| *c == u32::from(code))
            .map(|&(k, _)| k)
    }
}

/// `#[serde(with = "checksum_kind")]`.
pub mod checksum_kind {
    use super::*;

    pub fn serialize<S: Serializer>(kind: &ChecksumKind, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u32(code_of(&CHECKSUM_KIND_CODES, *kind))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<ChecksumKind, D::Error> {
        value_of(&CHECKSUM_KIND_CODES, "checksum kind", d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::layout::{decode, encode};
    use serde::Serialize;

    #[derive(Serialize, serde::Deserialize, Debug, PartialEq)]
    struct Kind(#[serde(with = "file_kind")] FileKind);

    #[derive(Serialize, serde::Deserialize, Debug, PartialEq)]
    struct Csum(#[serde(with = "checksum_kind")] ChecksumKind);

    /// Each variant's bytes are pinned; a new variant must be added to the
    /// table (the match is exhaustive) with a new number.
    #[test]
    fn every_file_kind_has_its_pinned_byte() {
        for (kind, byte) in [
            (FileKind::File, 0u8),
            (FileKind::Dir, 1),
            (FileKind::Symlink, 2),
            (FileKind::Fifo, 3),
            (FileKind::Socket, 4),
            (FileKind::CharDev, 5),
            (FileKind::BlockDev, 6),
        ] {
            match kind {
                FileKind::File
                | FileKind::Dir
                | FileKind::Symlink
                | FileKind::Fifo
                | FileKind::Socket
                | FileKind::CharDev
                | FileKind::BlockDev => {}
            }
            assert_eq!(encode(&Kind(kind)).unwrap(), vec![byte], "{kind:?}");
            assert_eq!(decode::<Kind>(&[byte], "kind").unwrap(), Kind(kind));
        }
        let err = decode::<Kind>(&[7], "kind").unwrap_err().to_string();
        assert!(err.contains("unknown file kind code 7"), "{err}");
    }

    #[test]
    fn every_checksum_kind_has_its_pinned_byte() {
        for (kind, byte) in [(ChecksumKind::None, 0u8), (ChecksumKind::Crc32c, 1)] {
            match kind {
                ChecksumKind::None | ChecksumKind::Crc32c => {}
            }
            assert_eq!(encode(&Csum(kind)).unwrap(), vec![byte], "{kind:?}");
            assert_eq!(decode::<Csum>(&[byte], "csum").unwrap(), Csum(kind));
        }
        let err = decode::<Csum>(&[2], "csum").unwrap_err().to_string();
        assert!(err.contains("unknown checksum kind code 2"), "{err}");
    }

    /// The journal's own enum (`DirOp`) is not an API type; its variant
    /// numbers are pinned here all the same.
    #[test]
    fn dir_op_variants_keep_their_numbers() {
        use crate::fs::meta::DirOp;
        let insert = DirOp::Insert {
            dir: 1,
            name: b"a".to_vec(),
            ino: 2,
            cookie: 3,
        };
        assert_eq!(encode(&insert).unwrap(), vec![0, 1, 1, b'a', 2, 3]);
        let remove = DirOp::Remove {
            dir: 1,
            name: b"a".to_vec(),
        };
        assert_eq!(encode(&remove).unwrap(), vec![1, 1, 1, b'a']);
    }
}
