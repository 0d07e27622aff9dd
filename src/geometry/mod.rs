//! RAID geometry: where each logical byte of a region lives on the members.
//!
//! A [`Geometry`] describes one striped region that spans every member at the
//! same member offsets (the array engine adds the region's base offset). It
//! maps forward ([`Geometry::map`]: logical offset → members and offsets) and
//! back ([`Geometry::reverse`]: member offset → what is stored there), and the
//! two are inverse of each other for every level, layout, member count and
//! chunk size (checked by property tests, as md checks
//! `raid5_compute_sector` against `compute_blocknr`).

use serde::{Deserialize, Serialize};

/// RAID level.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Level {
    Raid0,
    Raid1,
    Raid5,
    Raid6,
    Raid10,
}

/// Parity placement for RAID5/6, as md names them. RAID0/1/10 use `LeftSymmetric`
/// as a placeholder that has no effect.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Layout {
    LeftAsymmetric,
    RightAsymmetric,
    LeftSymmetric,
    RightSymmetric,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum GeometryError {
    #[error("{level:?} needs at least {min} members, got {got}")]
    TooFewMembers { level: Level, min: usize, got: usize },
    #[error("chunk size {0} must be a power of two between 4 KiB and 64 MiB")]
    BadChunk(u64),
    #[error("{0} copies is not possible with {1} members")]
    BadCopies(usize, usize),
    #[error("too many members: {0} (at most 255)")]
    TooManyMembers(usize),
}

/// One place a piece of logical data is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Target {
    pub member: usize,
    /// Offset within the region on that member.
    pub offset: u64,
}

/// Forward mapping of one logical offset.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mapping {
    /// Stripe (parity levels, RAID0) or logical chunk number (RAID1/10).
    pub stripe: u64,
    /// Index of the chunk among the stripe's data chunks (0 for RAID1/10).
    pub data_index: usize,
    /// Offset within the chunk.
    pub offset_in_chunk: u64,
    /// Where the byte is stored: one target for RAID0/5/6, every copy for RAID1/10.
    pub targets: Vec<Target>,
}

/// Members of one parity stripe (RAID0/5/6). The stripe's chunks all sit at
/// member offset `stripe * chunk`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StripeMembers {
    /// Member holding each data chunk, in data-index order.
    pub data: Vec<usize>,
    pub p: Option<usize>,
    pub q: Option<usize>,
}

/// What a member offset holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Logical data at this logical offset (for RAID1/10, copy number `copy`).
    Data { logical: u64, copy: usize },
    /// P parity of `stripe`, at `offset_in_chunk`.
    P { stripe: u64, offset_in_chunk: u64 },
    /// Q syndrome of `stripe`, at `offset_in_chunk`.
    Q { stripe: u64, offset_in_chunk: u64 },
    /// Space that holds nothing (the tail of an uneven RAID10 region).
    Unused,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Geometry {
    pub level: Level,
    pub members: usize,
    /// Chunk size in bytes (power of two).
    pub chunk: u64,
    /// Copies for RAID1 (= members) and RAID10 (near copies, 2 by default); 1 otherwise.
    pub copies: usize,
    pub layout: Layout,
}

impl Geometry {
    /// Validate and build. Minimum members: RAID0 1, RAID1 1, RAID5 2, RAID6 3,
    /// RAID10 `copies`. RAID1 forces `copies = members`.
    pub fn new(
        level: Level,
        members: usize,
        chunk: u64,
        copies: usize,
        layout: Layout,
    ) -> Result<Geometry, GeometryError> {
        let _ = (level, members, chunk, copies, layout);
        unimplemented!()
    }
    /// Data chunks per stripe (RAID0 n, RAID5 n-1, RAID6 n-2, RAID1/10 1).
    pub fn data_chunks(&self) -> usize {
        unimplemented!()
    }
    /// Member failures the level survives in the worst case.
    pub fn tolerance(&self) -> usize {
        unimplemented!()
    }
    /// Logical bytes of one full stripe (chunk × data chunks; the chunk for RAID1/10).
    pub fn stripe_bytes(&self) -> u64 {
        unimplemented!()
    }
    /// Logical capacity when each member contributes `region_bytes` (whole chunks only).
    pub fn capacity(&self, region_bytes: u64) -> u64 {
        let _ = region_bytes;
        unimplemented!()
    }
    /// Forward map of one logical offset.
    pub fn map(&self, logical: u64) -> Mapping {
        let _ = logical;
        unimplemented!()
    }
    /// Members of a parity/RAID0 stripe. Panics never; for RAID1/10 returns the
    /// copies of logical chunk `stripe` as `data` with no parity.
    pub fn stripe_members(&self, stripe: u64) -> StripeMembers {
        let _ = stripe;
        unimplemented!()
    }
    /// Inverse map: what `member` holds at region offset `offset`.
    pub fn reverse(&self, member: usize, offset: u64) -> Role {
        let _ = (member, offset);
        unimplemented!()
    }
}
