//! The level families as md's personalities (`struct md_personality`):
//! [`Personality::Raid0`] (striping), [`Personality::Mirror`] (RAID1 and
//! RAID10 copies) and [`Personality::Parity`] (RAID5 P, RAID6 P+Q).
//!
//! A personality is chosen once per geometry ([`Personality::of`], the only
//! place in the engine that tells the levels apart) and travels with every
//! [`Region`]. Each family's module owns what differs between them: how a
//! range is read and written, how a lost block is reconstructed, how a
//! verified read finds a good version, what scrub compares, where a rebuild
//! gets a slot's content from, which stripe locks a rebuild step takes and
//! which sets of lost members the family survives. The rest of the engine
//! (bitmap, member workers, background work, assembly) asks the personality and
//! never matches on the level. The parity family also owns the stripe cache,
//! full-stripe writes, their write-back and the partial parity log.
//!
//! Dispatch is a `match` on this small `Copy` enum, held in the region, so
//! the hot path pays no allocation, indirection or lock for it.

mod mirror;
pub(crate) mod parity;
mod raid0;

use super::io::{Choice, Piece};
use super::{Array, ArrayError, ArrayResult, Region};
use crate::geometry::{Geometry, Level};

/// How a mirror places its copies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Copies {
    /// RAID1: every member holds every chunk.
    Every,
    /// RAID10: `copies` adjacent members hold each chunk (md's near layout).
    Near,
}

/// Which syndromes a parity stripe carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Syndromes {
    /// RAID5: P, the XOR of the data.
    P,
    /// RAID6: P and the Reed-Solomon Q.
    Pq,
}

/// A level family: what the engine does differently for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Personality {
    Raid0,
    Mirror(Copies),
    Parity(Syndromes),
}

/// What a discard does: member runs `(slot, member offset, bytes)` to give
/// back, and the member span `[start, end)` the bitmap marks around it.
pub(crate) type DiscardPlan = (Vec<(usize, u64, u64)>, (u64, u64));

/// Where a rebuild finds the content of a slot's rows.
pub(crate) enum RebuildFrom {
    /// Parity: the same rows of every other readable member.
    Survivors,
    /// Mirrors: another copy of each chunk, read through the engine.
    Copies,
}

impl Personality {
    /// The personality of `level`: the engine's one choice by level.
    pub(crate) fn of(level: Level) -> Personality {
        match level {
            Level::Raid0 => Personality::Raid0,
            Level::Raid1 => Personality::Mirror(Copies::Every),
            Level::Raid10 => Personality::Mirror(Copies::Near),
            Level::Raid5 => Personality::Parity(Syndromes::P),
            Level::Raid6 => Personality::Parity(Syndromes::Pq),
        }
    }

    /// The personality of a geometry's level.
    pub(crate) fn of_geometry(g: &Geometry) -> Personality {
        Personality::of(g.level)
    }

    /// Fewest members `create` accepts (what gives the level its meaning;
    /// md needs --force below these too). `copies`: RAID10's near copies.
    pub(crate) fn min_members(self, copies: usize) -> usize {
        match self {
            Personality::Raid0 | Personality::Mirror(Copies::Every) => 2,
            Personality::Mirror(Copies::Near) => copies.max(2),
            Personality::Parity(Syndromes::P) => 3,
            Personality::Parity(Syndromes::Pq) => 4,
        }
    }

    /// Whether this family can keep a partial parity log (md's PPL is for
    /// RAID5 only: one parity block, rebuilt from the log by XOR).
    pub(crate) fn keeps_partial_parity_log(self) -> bool {
        self == Personality::Parity(Syndromes::P)
    }

    /// Whether a crash during a write can leave redundancy that would
    /// rebuild wrong data once a member is also lost (the write hole).
    pub(crate) fn has_write_hole(self) -> bool {
        matches!(self, Personality::Parity(_))
    }

    /// Whether every member holds a whole copy (RAID1), so a member added
    /// to the geometry is a copy to rebuild, not a change of placement.
    pub(crate) fn mirrors_on_every_member(self) -> bool {
        self == Personality::Mirror(Copies::Every)
    }

    /// Whether reads choose between copies (and a scrub checks each).
    pub(crate) fn has_copies(self) -> bool {
        matches!(self, Personality::Mirror(_))
    }

    /// Whether every stripe of `g` still has its data with `failed` slots
    /// gone (assembly asks before an array exists, the running array after
    /// failures, the control socket before it fails a member).
    pub(crate) fn survives(self, g: &Geometry, failed: &[usize]) -> bool {
        match self {
            Personality::Raid0 | Personality::Parity(_) => failed.len() <= g.tolerance(),
            Personality::Mirror(_) => mirror::survives(g, failed),
        }
    }

    /// The stripe-lock keys a rebuild of member rows `[row, row + n)` of
    /// `slot` holds: the stripes on striped levels, the logical chunks
    /// those rows hold a copy of on mirrors (their writers lock by chunk).
    pub(crate) fn lock_keys(self, g: &Geometry, slot: usize, row: u64, n: u64) -> Vec<u64> {
        match self {
            Personality::Mirror(_) => mirror::lock_keys(g, slot, row, n),
            Personality::Raid0 | Personality::Parity(_) => (row..row + n).collect(),
        }
    }

    /// Where a rebuild of a slot gets its content.
    pub(crate) fn rebuild_from(self) -> ArrayResult<RebuildFrom> {
        match self {
            Personality::Parity(_) => Ok(RebuildFrom::Survivors),
            Personality::Mirror(_) => Ok(RebuildFrom::Copies),
            Personality::Raid0 => Err(ArrayError::Refused(
                "RAID0 has no redundancy to rebuild from".into(),
            )),
        }
    }

    /// Logical bytes a discard works in: whole stripes where parity covers
    /// the stripe, any byte otherwise.
    pub(crate) fn discard_unit(self, g: &Geometry) -> u64 {
        match self {
            Personality::Parity(_) => g.stripe_bytes(),
            Personality::Raid0 | Personality::Mirror(_) => 1,
        }
    }
}

impl Array {
    /// Read region-relative `[offset, offset + buf.len())` of `region`.
    pub(crate) fn read_region(
        &self,
        region: &Region,
        offset: u64,
        buf: &mut [u8],
        choice: Choice,
    ) -> ArrayResult<()> {
        match region.personality {
            Personality::Raid0 => self.read_raid0(region, offset, buf),
            Personality::Mirror(_) => self.read_mirror(region, offset, buf, choice),
            Personality::Parity(_) => self.read_parity(region, offset, buf),
        }
    }

    /// Write `data` at region-relative `offset` (the bitmap is already
    /// marked); `caching`: whether partial parity stripes may wait in the
    /// cache (and older cached bytes of the stripes must be ordered first).
    pub(super) fn write_unmarked(
        &self,
        region: &Region,
        offset: u64,
        data: &[u8],
        caching: super::io::Caching,
    ) -> ArrayResult<()> {
        match region.personality {
            Personality::Raid0 | Personality::Mirror(_) => {
                self.write_every_target(region, offset, data)
            }
            Personality::Parity(_) => self.write_parity(region, offset, data, caching),
        }
    }

    /// After a read of `pieces` failed verification: find a version that
    /// passes (another copy, or a reconstruction without a suspect), put it
    /// in `buf` and return the members that held a bad one (rewritten when
    /// `repair`). `None` when no version passes.
    pub(super) fn find_good_version(
        &self,
        region: &Region,
        offset: u64,
        pieces: &[Piece],
        buf: &mut [u8],
        verify: &dyn Fn(&[u8]) -> bool,
        repair: bool,
    ) -> ArrayResult<Option<Vec<usize>>> {
        match region.personality {
            Personality::Raid0 => Ok(None),
            Personality::Mirror(_) => {
                self.verify_mirror(region, offset, pieces, buf, verify, repair)
            }
            Personality::Parity(_) => self.verify_parity(region, pieces, buf, verify, repair),
        }
    }

    /// Scrub member rows `[row, row + n)` of `region`; returns mismatched bytes.
    pub(crate) fn scrub_rows(
        &self,
        region: &Region,
        row: u64,
        n: u64,
        repair: bool,
    ) -> ArrayResult<u64> {
        match region.personality {
            Personality::Raid0 => Ok(0),
            Personality::Mirror(_) => self.scrub_mirror_rows(region, row, n, repair),
            Personality::Parity(_) => {
                let mut bad = 0;
                for stripe in row..row + n {
                    bad += self.scrub_stripe(region, stripe, repair)?;
                }
                Ok(bad)
            }
        }
    }

    /// Member runs `(slot, member offset, bytes)` a discard of region-relative
    /// `[offset, offset + len)` (in the personality's discard units) gives
    /// back, and the member span to mark in the bitmap around it.
    pub(super) fn discard_plan(
        &self,
        region: &Region,
        offset: u64,
        len: u64,
        pieces: &[Piece],
        (first, last): (u64, u64),
    ) -> DiscardPlan {
        match region.personality {
            Personality::Parity(_) => parity::discard_plan(region, first, last),
            Personality::Raid0 | Personality::Mirror(_) => {
                super::discard::every_target_plan(region, offset, len, pieces)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Copies, Personality, Syndromes};
    use crate::geometry::{Geometry, Layout, Level};

    fn geometry(level: Level, members: usize, copies: usize) -> Geometry {
        Geometry::new(level, members, 64 << 10, copies, Layout::LeftSymmetric).expect("geometry")
    }

    #[test]
    fn each_level_gets_its_family() {
        assert_eq!(Personality::of(Level::Raid0), Personality::Raid0);
        assert_eq!(
            Personality::of(Level::Raid1),
            Personality::Mirror(Copies::Every)
        );
        assert_eq!(
            Personality::of(Level::Raid10),
            Personality::Mirror(Copies::Near)
        );
        assert_eq!(
            Personality::of(Level::Raid5),
            Personality::Parity(Syndromes::P)
        );
        assert_eq!(
            Personality::of(Level::Raid6),
            Personality::Parity(Syndromes::Pq)
        );
    }

    #[test]
    fn survival_follows_the_family() {
        let survives = |level, members, copies, failed: &[usize]| {
            let g = geometry(level, members, copies);
            Personality::of(level).survives(&g, failed)
        };
        assert!(!survives(Level::Raid0, 3, 1, &[1]));
        assert!(survives(Level::Raid5, 4, 1, &[3]));
        assert!(!survives(Level::Raid5, 4, 1, &[0, 3]));
        assert!(survives(Level::Raid6, 4, 1, &[0, 3]));
        assert!(!survives(Level::Raid6, 4, 1, &[0, 1, 3]));
        assert!(survives(Level::Raid1, 3, 3, &[0, 2]));
        // RAID10 near copies on 4 members: {0, 1} and {2, 3} hold the same chunks.
        assert!(survives(Level::Raid10, 4, 2, &[0, 2]));
        assert!(survives(Level::Raid10, 4, 2, &[1, 3]));
        assert!(!survives(Level::Raid10, 4, 2, &[2, 3]));
    }
}
