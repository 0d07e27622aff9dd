//! A run's schedule: the whole stream of filesystem operations and faults,
//! drawn from the seed before anything runs. Every action names its target
//! by a number resolved against the state it meets (the `pick`th file, the
//! `pick`th slot), and one whose condition does not hold then is skipped,
//! so any subset of a schedule is itself a schedule: that is what lets a
//! failing run be shrunk by dropping actions.

use super::model::{DIRS, NAMES};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

#[derive(Clone, Debug)]
pub enum FsOp {
    Create {
        dir: u8,
        name: u8,
    },
    Write {
        pick: u32,
        off: u64,
        len: u32,
        seed: u32,
    },
    Burst {
        pick: u32,
        count: u16,
        seed: u32,
    },
    Truncate {
        pick: u32,
        size: u64,
    },
    Fallocate {
        pick: u32,
        off: u64,
        len: u64,
        keep_size: bool,
    },
    Punch {
        pick: u32,
        off: u64,
        len: u64,
    },
    Rename {
        pick: u32,
        dir: u8,
        name: u8,
    },
    Link {
        pick: u32,
        dir: u8,
        name: u8,
    },
    Unlink {
        pick: u32,
    },
    SetXattr {
        pick: u32,
        key: u8,
        len: u16,
        seed: u32,
    },
    RemoveXattr {
        pick: u32,
        key: u8,
    },
    Fsync {
        pick: u32,
    },
    Sync,
    Verify {
        pick: u32,
    },
}

#[derive(Clone, Debug)]
pub enum Fault {
    /// `raidfs fail` and `remove` of the `pick`th slot.
    Fail {
        pick: u8,
    },
    /// The member goes away: its I/O fails until it comes back.
    Pull {
        pick: u8,
    },
    /// A member taken out comes back: the same disk (bitmap re-add) or a new one.
    Return {
        fresh: bool,
    },
    Replace {
        pick: u8,
    },
    AddSpare,
    /// One more member; a RAID5 may become a RAID6 with it.
    Grow {
        to_raid6: bool,
    },
    /// Bytes flipped in the data area of the `pick`th slot's member.
    Rot {
        pick: u8,
        at: u64,
        len: u16,
    },
    /// The host refuses writes with ENOSPC for `lasts` actions.
    HostFull {
        all: bool,
        pick: u8,
        lasts: u8,
    },
    /// The host fails every member's writes for `lasts` actions.
    HostEio {
        lasts: u8,
    },
    PowerCut {
        seed: u64,
    },
    Scrub {
        repair: bool,
    },
    Remount,
    /// Wait for the background work to end.
    Settle,
}

#[derive(Clone, Debug)]
pub enum Action {
    Op(FsOp),
    Fault(Fault),
}

/// The `steps` actions of `seed`, numbered.
pub fn schedule(seed: u64, steps: usize) -> Vec<(usize, Action)> {
    let mut r = StdRng::seed_from_u64(seed);
    (0..steps).map(|i| (i, action(&mut r))).collect()
}

fn action(r: &mut StdRng) -> Action {
    let pick = r.gen::<u32>();
    let dir = r.gen_range(0..DIRS.len() as u8);
    let name = r.gen_range(0..NAMES);
    if r.gen_bool(0.12) {
        return Action::Fault(fault(r));
    }
    Action::Op(match r.gen_range(0..100) {
        0..=11 => FsOp::Create { dir, name },
        12..=31 => {
            // Small, unaligned, or whole stripes and more.
            let len = match r.gen_range(0..4) {
                0 => r.gen_range(1..4096),
                1 => 4096 * r.gen_range(1..8),
                2 => r.gen_range(1..200_000),
                _ => 256 << 10,
            };
            let off = match r.gen_range(0..3) {
                0 => 4096 * r.gen_range(0..160),
                _ => r.gen_range(0..700_000),
            };
            FsOp::Write {
                pick,
                off,
                len,
                seed: r.gen(),
            }
        }
        32..=37 => FsOp::Burst {
            pick,
            count: r.gen_range(8..300),
            seed: r.gen(),
        },
        38..=42 => FsOp::Truncate {
            pick,
            size: r.gen_range(0..800_000),
        },
        43..=46 => FsOp::Fallocate {
            pick,
            off: r.gen_range(0..700_000),
            len: r.gen_range(1..300_000),
            keep_size: r.gen(),
        },
        47..=50 => FsOp::Punch {
            pick,
            off: r.gen_range(0..700_000),
            len: r.gen_range(1..200_000),
        },
        51..=55 => FsOp::Rename { pick, dir, name },
        56..=58 => FsOp::Link { pick, dir, name },
        59..=63 => FsOp::Unlink { pick },
        64..=68 => FsOp::SetXattr {
            pick,
            key: r.gen_range(0..4),
            len: r.gen_range(0..600),
            seed: r.gen(),
        },
        69..=70 => FsOp::RemoveXattr {
            pick,
            key: r.gen_range(0..4),
        },
        71..=80 => FsOp::Fsync { pick },
        81..=84 => FsOp::Sync,
        _ => FsOp::Verify { pick },
    })
}

fn fault(r: &mut StdRng) -> Fault {
    let pick = r.gen::<u8>();
    match r.gen_range(0..100) {
        0..=9 => Fault::Fail { pick },
        10..=17 => Fault::Pull { pick },
        18..=35 => Fault::Return {
            fresh: r.gen_bool(0.3),
        },
        36..=40 => Fault::Replace { pick },
        41..=43 => Fault::AddSpare,
        44..=47 => Fault::Grow { to_raid6: r.gen() },
        48..=57 => Fault::Rot {
            pick,
            at: r.gen(),
            len: r.gen_range(1..5000),
        },
        58..=63 => Fault::HostFull {
            all: r.gen(),
            pick,
            lasts: r.gen_range(1..12),
        },
        64..=67 => Fault::HostEio {
            lasts: r.gen_range(1..12),
        },
        68..=79 => Fault::PowerCut { seed: r.gen() },
        80..=87 => Fault::Scrub { repair: r.gen() },
        88..=93 => Fault::Remount,
        _ => Fault::Settle,
    }
}
