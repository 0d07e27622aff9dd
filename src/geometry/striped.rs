//! Chunk placement inside one stripe for the striped levels (RAID0, RAID5,
//! RAID6): md's `raid5_compute_sector` (data index → member) and its inverse
//! `raid5_compute_blocknr` (member → data index), for md's four rotating
//! layouts.
//!
//! Every layout reduces to two facts per stripe: which members hold P and Q,
//! and how the data chunks fill the remaining members. md's asymmetric
//! layouts fill them in ascending member order ("data restart"); its symmetric
//! layouts start just after the last parity member and wrap around ("data
//! continuation"). md's RAID6 special case for the asymmetric layouts (Q wraps
//! to member 0 when P is on the last member, giving `Q D D D P`) is exactly
//! "ascending order over the members P and Q leave free".

use super::{Layout, Level};

/// How a stripe's data chunks are laid over the members not holding parity.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum DataFill {
    /// Data index i sits on the i-th free member in ascending order.
    Ascending,
    /// Data index i sits on member `(first + i) mod members`.
    Rotating { first: usize },
}

/// Where every chunk of one stripe lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct StripePlacement {
    members: usize,
    pub(super) p: Option<usize>,
    pub(super) q: Option<usize>,
    fill: DataFill,
}

/// What one member holds in a stripe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ChunkRole {
    Data(usize),
    P,
    Q,
}

impl StripePlacement {
    /// Placement of `stripe` for a striped level. `members` is at least the
    /// level's minimum (validated by `Geometry::new`).
    pub(super) fn of(level: Level, layout: Layout, members: usize, stripe: u64) -> StripePlacement {
        if level == Level::Raid0 {
            return StripePlacement {
                members,
                p: None,
                q: None,
                fill: DataFill::Ascending,
            };
        }
        // `stripe % members` is below 256, so the narrowing is lossless.
        let rotation = (stripe % members as u64) as usize;
        let p = match layout {
            Layout::LeftAsymmetric | Layout::LeftSymmetric => members - 1 - rotation,
            Layout::RightAsymmetric | Layout::RightSymmetric => rotation,
        };
        let q = (level == Level::Raid6).then_some((p + 1) % members);
        let parity_chunks = if q.is_some() { 2 } else { 1 };
        let fill = match layout {
            Layout::LeftAsymmetric | Layout::RightAsymmetric => DataFill::Ascending,
            Layout::LeftSymmetric | Layout::RightSymmetric => DataFill::Rotating {
                first: (p + parity_chunks) % members,
            },
        };
        StripePlacement {
            members,
            p: Some(p),
            q,
            fill,
        }
    }

    /// Member holding data chunk `index` (below the stripe's data chunk count).
    #[inline]
    pub(super) fn data_member(&self, index: usize) -> usize {
        match self.fill {
            DataFill::Rotating { first } => (first + index) % self.members,
            DataFill::Ascending => {
                // Skip the parity members in ascending order: each one at or
                // below the running position pushes the chunk one member on.
                let (low, high) = self.parity_sorted();
                let mut member = index;
                if low.is_some_and(|low| member >= low) {
                    member += 1;
                }
                if high.is_some_and(|high| member >= high) {
                    member += 1;
                }
                member
            }
        }
    }

    /// What `member` (below the member count) holds in this stripe.
    #[inline]
    pub(super) fn role_of(&self, member: usize) -> ChunkRole {
        if self.p == Some(member) {
            return ChunkRole::P;
        }
        if self.q == Some(member) {
            return ChunkRole::Q;
        }
        match self.fill {
            DataFill::Rotating { first } => {
                ChunkRole::Data((member + self.members - first) % self.members)
            }
            DataFill::Ascending => {
                let (low, high) = self.parity_sorted();
                let below = [low, high]
                    .into_iter()
                    .flatten()
                    .filter(|&parity| parity < member)
                    .count();
                ChunkRole::Data(member - below)
            }
        }
    }

    /// The parity members, lowest first.
    fn parity_sorted(&self) -> (Option<usize>, Option<usize>) {
        match (self.p, self.q) {
            (Some(p), Some(q)) => (Some(p.min(q)), Some(p.max(q))),
            (p, q) => (p.or(q), None),
        }
    }
}
