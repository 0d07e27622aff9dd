//! RAID geometry: where each logical byte of a region lives on the members.
//!
//! A [`Geometry`] describes one striped region that spans every member at the
//! same member offsets (the array engine adds the region's base offset). It
//! maps forward ([`Geometry::map`]: logical offset → members and offsets) and
//! back ([`Geometry::reverse`]: member offset → what is stored there), and the
//! two are inverse of each other for every level, layout, member count and
//! chunk size (checked by property tests, as md checks
//! `raid5_compute_sector` against `compute_blocknr`).
//!
//! The per-level arithmetic lives in `striped` (RAID0/5/6, md's
//! `raid5_compute_sector`) and `mirrored` (RAID1/10 near copies); this file
//! validates a geometry and dispatches on its level. Level and layout names
//! are in `names`. `docs/geometry.md` draws the placement of every level.

mod mirrored;
mod names;
mod striped;

pub use names::NameError;

use serde::{Deserialize, Serialize};
use striped::{ChunkRole, StripePlacement};

/// RAID level.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Level {
    Raid0,
    Raid1,
    Raid5,
    Raid6,
    Raid10,
}

impl Level {
    /// Whether `copies` is the copy count this level records for `members`
    /// members: RAID1 keeps one on every member, RAID10 1 to `members`,
    /// the others exactly one (what [`Geometry::new`] would choose).
    pub fn copies_fit(self, copies: u64, members: u64) -> bool {
        match self {
            Level::Raid0 | Level::Raid5 | Level::Raid6 => copies == 1,
            Level::Raid1 => copies == members,
            Level::Raid10 => (1..=members).contains(&copies),
        }
    }

    /// The layout as md shows it for this level: the parity placement for
    /// RAID5/6, `near=N` for RAID10, and nothing (empty) for RAID0/1, whose
    /// recorded layout is a placeholder.
    pub fn layout_shown(self, layout: Layout, copies: u32) -> String {
        match self {
            Level::Raid5 | Level::Raid6 => layout.to_string(),
            Level::Raid10 => format!("near={copies}"),
            Level::Raid0 | Level::Raid1 => String::new(),
        }
    }
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
    #[error("{level} needs at least {min} members, got {got}")]
    TooFewMembers {
        level: Level,
        min: usize,
        got: usize,
    },
    #[error("chunk size {0} must be a power of two between 4 KiB and 64 MiB")]
    BadChunk(u64),
    #[error("{0} copies is not possible with {1} members (RAID10 needs 1 to members copies)")]
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

/// Build it with [`Geometry::new`] (also from deserialised fields): the
/// mapping methods rely on its validation and normalisation.
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

/// Smallest and largest chunk size.
pub const MIN_CHUNK: u64 = 4 << 10;
pub const MAX_CHUNK: u64 = 64 << 20;
/// Most members a geometry can span.
pub const MAX_MEMBERS: usize = 255;

impl Geometry {
    /// Validate and build. Minimum members: RAID0 1, RAID1 1, RAID5 2, RAID6 3,
    /// RAID10 `copies`. RAID1 forces `copies = members`; RAID0/5/6 force
    /// `copies = 1`; RAID10 takes 1 to `members` copies. The layout only
    /// matters for RAID5/6 and is stored as `LeftSymmetric` for the other
    /// levels, so equal placements compare equal.
    ///
    /// Logical offsets and region sizes are expected below 2^56 bytes (the
    /// arithmetic multiplies them by up to 255).
    pub fn new(
        level: Level,
        members: usize,
        chunk: u64,
        copies: usize,
        layout: Layout,
    ) -> Result<Geometry, GeometryError> {
        if members > MAX_MEMBERS {
            return Err(GeometryError::TooManyMembers(members));
        }
        if !chunk.is_power_of_two() || !(MIN_CHUNK..=MAX_CHUNK).contains(&chunk) {
            return Err(GeometryError::BadChunk(chunk));
        }
        let (min, copies, layout) = match level {
            Level::Raid0 => (1, 1, Layout::LeftSymmetric),
            Level::Raid1 => (1, members, Layout::LeftSymmetric),
            Level::Raid5 => (2, 1, layout),
            Level::Raid6 => (3, 1, layout),
            Level::Raid10 => {
                if copies == 0 || copies > members {
                    return Err(GeometryError::BadCopies(copies, members));
                }
                (copies, copies, Layout::LeftSymmetric)
            }
        };
        if members < min {
            return Err(GeometryError::TooFewMembers {
                level,
                min,
                got: members,
            });
        }
        Ok(Geometry {
            level,
            members,
            chunk,
            copies,
            layout,
        })
    }

    /// Data chunks per stripe (RAID0 n, RAID5 n-1, RAID6 n-2, RAID1/10 1).
    pub fn data_chunks(&self) -> usize {
        match self.level {
            Level::Raid0 => self.members,
            Level::Raid5 => self.members - 1,
            Level::Raid6 => self.members - 2,
            Level::Raid1 | Level::Raid10 => 1,
        }
    }
    /// Member failures the level survives in the worst case.
    pub fn tolerance(&self) -> usize {
        match self.level {
            Level::Raid0 => 0,
            Level::Raid5 => 1,
            Level::Raid6 => 2,
            Level::Raid1 | Level::Raid10 => self.copies - 1,
        }
    }
    /// Logical bytes of one full stripe (chunk × data chunks; the chunk for RAID1/10).
    pub fn stripe_bytes(&self) -> u64 {
        self.chunk * self.data_chunks() as u64
    }
    /// Logical capacity when each member contributes `region_bytes` (whole chunks only).
    pub fn capacity(&self, region_bytes: u64) -> u64 {
        let rows = region_bytes / self.chunk;
        if self.is_mirrored() {
            mirrored::whole_chunks(self.members, self.copies, rows) * self.chunk
        } else {
            rows * self.stripe_bytes()
        }
    }
    /// Forward map of one logical offset.
    pub fn map(&self, logical: u64) -> Mapping {
        let chunk_number = logical / self.chunk;
        let offset_in_chunk = logical % self.chunk;
        if self.is_mirrored() {
            let targets = mirrored::copies_of(self.members, self.copies, chunk_number)
                .map(|slot| Target {
                    member: slot.member,
                    offset: slot.row * self.chunk + offset_in_chunk,
                })
                .collect();
            return Mapping {
                stripe: chunk_number,
                data_index: 0,
                offset_in_chunk,
                targets,
            };
        }
        let data_chunks = self.data_chunks() as u64;
        let stripe = chunk_number / data_chunks;
        // Below the data chunk count (at most 255).
        let data_index = (chunk_number % data_chunks) as usize;
        let placement = StripePlacement::of(self.level, self.layout, self.members, stripe);
        let target = Target {
            member: placement.data_member(data_index),
            offset: stripe * self.chunk + offset_in_chunk,
        };
        Mapping {
            stripe,
            data_index,
            offset_in_chunk,
            targets: vec![target],
        }
    }
    /// Members of a parity/RAID0 stripe. Panics never; for RAID1/10 returns the
    /// copies of logical chunk `stripe` as `data` with no parity.
    pub fn stripe_members(&self, stripe: u64) -> StripeMembers {
        if self.is_mirrored() {
            let data = mirrored::copies_of(self.members, self.copies, stripe)
                .map(|slot| slot.member)
                .collect();
            return StripeMembers {
                data,
                p: None,
                q: None,
            };
        }
        let placement = StripePlacement::of(self.level, self.layout, self.members, stripe);
        let data = (0..self.data_chunks())
            .map(|index| placement.data_member(index))
            .collect();
        StripeMembers {
            data,
            p: placement.p,
            q: placement.q,
        }
    }
    /// Inverse map: what `member` holds at region offset `offset`. Pure
    /// arithmetic, valid for any region size: a member outside the geometry
    /// holds [`Role::Unused`]; use [`Geometry::role_in_region`] to also mark
    /// what lies past the end of a given region.
    pub fn reverse(&self, member: usize, offset: u64) -> Role {
        if member >= self.members {
            return Role::Unused;
        }
        let row = offset / self.chunk;
        let offset_in_chunk = offset % self.chunk;
        if self.is_mirrored() {
            let (chunk_number, copy) = mirrored::chunk_at(self.members, self.copies, member, row);
            return Role::Data {
                logical: chunk_number * self.chunk + offset_in_chunk,
                copy,
            };
        }
        let stripe = row;
        match StripePlacement::of(self.level, self.layout, self.members, stripe).role_of(member) {
            ChunkRole::P => Role::P {
                stripe,
                offset_in_chunk,
            },
            ChunkRole::Q => Role::Q {
                stripe,
                offset_in_chunk,
            },
            ChunkRole::Data(index) => Role::Data {
                logical: stripe * self.stripe_bytes() + index as u64 * self.chunk + offset_in_chunk,
                copy: 0,
            },
        }
    }
    /// What `member` holds at `offset` of a region of `region_bytes` per
    /// member: [`Geometry::reverse`], except that the tail past the last whole
    /// chunk row, and (RAID10) the copies of a chunk that does not fit whole
    /// in the region, are [`Role::Unused`]. Every role other than `Unused`
    /// then belongs to logical space below [`Geometry::capacity`].
    pub fn role_in_region(&self, member: usize, offset: u64, region_bytes: u64) -> Role {
        let rows = region_bytes / self.chunk;
        if offset / self.chunk >= rows {
            return Role::Unused;
        }
        match self.reverse(member, offset) {
            Role::Data { logical, .. } if logical >= self.capacity(region_bytes) => Role::Unused,
            role => role,
        }
    }

    /// Geometry for a filesystem metadata group on `members` members:
    /// mirrored on min(3, members) of them (RAID1 when that is all of them,
    /// RAID10 near copies otherwise).
    pub fn metadata(members: usize, chunk: u64) -> Result<Geometry, GeometryError> {
        if members <= 3 {
            Geometry::new(Level::Raid1, members, chunk, members, Layout::DEFAULT)
        } else {
            Geometry::new(Level::Raid10, members, chunk, 3, Layout::DEFAULT)
        }
    }

    /// RAID1 and RAID10 keep copies; the others stripe with optional parity.
    fn is_mirrored(&self) -> bool {
        matches!(self.level, Level::Raid1 | Level::Raid10)
    }
}
