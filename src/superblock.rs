//! The superblock: every member's record of which array it belongs to, where
//! it sits in it, and the array's state as this member last knew it.
//!
//! Two copies live at the start of each member ([`SB_OFFSETS`]); they are
//! written one after the other with a sync between, so a torn write destroys at
//! most one. Each copy is 4 KiB of fixed-width little-endian fields ending in a
//! crc32c; `docs/format.md` documents it byte by byte.

use crate::geometry::{Layout, Level};
use crate::member::Member;
use uuid::Uuid;

pub const MAGIC: [u8; 8] = *b"RAIDFS\x00\x01";
pub const FORMAT_VERSION: u32 = 1;
pub const SUPERBLOCK_SIZE: usize = 4096;
/// Byte offsets of the two superblock copies on every member.
pub const SB_OFFSETS: [u64; 2] = [0, 4096];
/// Where member data starts by default (room for future bitmap/PPL areas).
pub const DEFAULT_DATA_OFFSET: u64 = 1 << 20;
/// Most member slots an array can have.
pub const MAX_MEMBERS: usize = 255;
/// Most allocation groups an array can have (one byte each in the table).
pub const MAX_GROUPS: usize = 2048;
/// `slot` value of a hot spare.
pub const SPARE_SLOT: u32 = u32::MAX;

/// Clean means every stripe's parity/copies agree; dirty means writes may have
/// been in flight (set while mounted read-write).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArrayState {
    Clean,
    Dirty,
}

/// A slot's state as recorded in this member's superblock (md's dev_roles).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotState {
    Active,
    Faulty,
    /// Being rebuilt; `recovery_offset` on that member says how far.
    Rebuilding,
    Missing,
}

/// What an allocation group holds. The table index is the group number.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GroupProfile {
    Unallocated,
    /// Filesystem metadata: mirrored on min(3, members) members.
    Metadata,
    /// File data at the array's level.
    Data,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Superblock {
    pub version: u32,
    pub array_uuid: Uuid,
    pub member_uuid: Uuid,
    /// Array name (at most 32 bytes of UTF-8).
    pub name: String,
    /// This member's slot (role) in the array, or SPARE_SLOT.
    pub slot: u32,
    pub level: Level,
    pub layout: Layout,
    /// Chunk size in bytes.
    pub chunk: u64,
    /// Number of slots (members when complete).
    pub members: u32,
    /// Copies for RAID1/10.
    pub copies: u32,
    /// Where the data area starts on the member.
    pub data_offset: u64,
    /// Usable bytes of the data area on each member.
    pub data_size: u64,
    /// Bytes of each member's data area that one allocation group occupies.
    pub group_size: u64,
    /// Bumped on every state change; the highest wins at assembly.
    pub events: u64,
    pub state: ArrayState,
    /// How far this member has been rebuilt (u64::MAX: in sync).
    pub recovery_offset: u64,
    pub features: u64,
    /// Creation and last update time, seconds since the epoch.
    pub ctime: u64,
    pub utime: u64,
    /// State of each slot, `members` entries.
    pub slots: Vec<SlotState>,
    /// Profile of each allocation group, `data_size / group_size` entries.
    pub groups: Vec<GroupProfile>,
}

/// Why a superblock could not be read.
#[derive(Debug, thiserror::Error)]
pub enum SuperblockError {
    #[error("{0}: I/O error reading superblock: {1}")]
    Io(String, std::io::Error),
    #[error("{0}: not a raidfs member (no superblock magic)")]
    NotMember(String),
    #[error("{member}: both superblock copies fail their checksum")]
    Corrupt { member: String },
    #[error("{member}: unsupported format version {version}")]
    Version { member: String, version: u32 },
    #[error("{member}: invalid superblock field: {what}")]
    Invalid { member: String, what: String },
}

/// Result of reading both copies.
#[derive(Clone, Debug)]
pub struct ReadVerdict {
    /// Checksum verdict of copy 0 and copy 1: Some(true) good, Some(false) bad
    /// checksum, None no magic at all.
    pub copies: [Option<bool>; 2],
}

impl Superblock {
    /// Encode into one 4 KiB copy (crc32c over all bytes before the crc field).
    pub fn encode(&self) -> [u8; SUPERBLOCK_SIZE] {
        unimplemented!()
    }
    /// Decode one copy; verifies magic, version, crc and field sanity.
    pub fn decode(buf: &[u8], member: &str) -> Result<Superblock, SuperblockError> {
        let _ = (buf, member);
        unimplemented!()
    }
    /// Read both copies and return the valid one with the higher event count.
    pub fn read_from(member: &dyn Member) -> Result<(Superblock, ReadVerdict), SuperblockError> {
        let _ = member;
        unimplemented!()
    }
    /// Write copy 0, sync, write copy 1, sync.
    pub fn write_to(&self, member: &dyn Member) -> std::io::Result<()> {
        let _ = member;
        unimplemented!()
    }
    /// Number of allocation groups.
    pub fn group_count(&self) -> usize {
        self.groups.len()
    }
}
