//! Free-space allocator for Data groups: a free-extent map per group, built at
//! open from every file's extents (so it is never persisted and cannot drift).
//! Prefers continuing a file contiguously, then stripe-aligned runs for large
//! requests, so big sequential writes become full-stripe writes. Small
//! requests with nowhere to continue are packed one after another from a
//! cursor in a free run that holds an aligned stripe, rather than into the
//! first holes: random overwrites (which copy-on-write moves to fresh
//! blocks) then fill stripes in order, and the array's stripe cache writes
//! them whole. The runs that hold an aligned stripe are indexed, so finding
//! one costs the same however many one-block holes copy-on-write has left.
//!
//! Those holes are where a large request must not go: each piece of it
//! there would be a partial stripe, a read-modify-write on parity levels
//! and a short read later. So a large request continues a file only up to a
//! stripe boundary, takes the whole stripes of the roomiest run when no run
//! holds it, and otherwise is refused by [`Allocator::allocate_placed`] (as
//! is a small one once no run holds an aligned stripe), so that the
//! filesystem takes a fresh group first; [`Allocator::allocate`] takes the
//! fragments, for when no group is left.

use std::collections::{BTreeMap, BTreeSet};

use super::extent::Extent;
use super::inode::BLOCK_SIZE;
use super::store::{group_addr, GroupInfo, GROUP_SHIFT};

#[derive(Debug)]
struct GroupFree {
    info: GroupInfo,
    /// offset in group → length
    free: BTreeMap<u64, u64>,
    /// Starts of the free runs that hold a whole aligned stripe.
    roomy: BTreeSet<u64>,
    free_bytes: u64,
    usable: u64,
}

impl GroupFree {
    /// The unit small requests are packed into: the stripe, when the group
    /// has one that is a whole number of blocks.
    fn stripe(&self) -> u64 {
        let stripe = self.info.stripe_bytes;
        if stripe >= BLOCK_SIZE && stripe.is_multiple_of(BLOCK_SIZE) {
            stripe
        } else {
            BLOCK_SIZE
        }
    }

    fn insert_run(&mut self, start: u64, len: u64) {
        let stripe = self.stripe();
        if round_up(start, stripe) + stripe <= start + len {
            self.roomy.insert(start);
        }
        self.free.insert(start, len);
    }

    fn remove_run(&mut self, start: u64) -> Option<u64> {
        self.roomy.remove(&start);
        self.free.remove(&start)
    }

    /// Take `[off, off + len)` out of the run `[fstart, fstart + flen)`.
    fn carve(&mut self, fstart: u64, flen: u64, off: u64, len: u64) {
        self.remove_run(fstart);
        if fstart < off {
            self.insert_run(fstart, off - fstart);
        }
        if off + len < fstart + flen {
            self.insert_run(off + len, fstart + flen - off - len);
        }
        self.free_bytes -= len;
    }
}

#[derive(Debug, Default)]
pub struct Allocator {
    groups: BTreeMap<u32, GroupFree>,
    /// Where the last small allocation without a usable hint ended.
    cursor: Option<u64>,
}

fn split(addr: u64) -> (u32, u64) {
    (
        (addr >> GROUP_SHIFT) as u32,
        addr & ((1u64 << GROUP_SHIFT) - 1),
    )
}

fn round_up(v: u64, a: u64) -> u64 {
    v.div_ceil(a) * a
}

impl Allocator {
    pub fn add_group(&mut self, info: GroupInfo) {
        let usable = info.capacity / BLOCK_SIZE * BLOCK_SIZE;
        let mut group = GroupFree {
            info,
            free: BTreeMap::new(),
            roomy: BTreeSet::new(),
            free_bytes: usable,
            usable,
        };
        if usable > 0 {
            group.insert_run(0, usable);
        }
        self.groups.insert(group.info.index, group);
    }

    /// Take in a group that grew (a reshape moved it to a geometry that
    /// holds more): the space past its old end is free, and its stripe may
    /// have changed. False when the group is unknown or did not grow.
    pub fn widen(&mut self, info: GroupInfo) -> bool {
        let Some(group) = self.groups.get_mut(&info.index) else {
            return false;
        };
        let usable = info.capacity / BLOCK_SIZE * BLOCK_SIZE;
        if usable <= group.usable {
            return false;
        }
        let old = group.usable;
        group.usable = usable;
        group.info = info;
        // The runs that hold an aligned stripe depend on the stripe.
        let runs: Vec<(u64, u64)> = group.free.iter().map(|(&s, &l)| (s, l)).collect();
        group.roomy.clear();
        for (start, len) in runs {
            group.insert_run(start, len);
        }
        self.free(Extent::new(group_addr(info.index, old), usable - old));
        true
    }

    /// Bytes group `index` holds, as the allocator knows it.
    pub fn usable(&self, index: u32) -> Option<u64> {
        self.groups.get(&index).map(|g| g.usable)
    }

    pub fn free_bytes(&self) -> u64 {
        self.groups.values().map(|g| g.free_bytes).sum()
    }

    pub fn total_bytes(&self) -> u64 {
        self.groups.values().map(|g| g.usable).sum()
    }

    /// Mark `ext` used while building from extents; `Err` says why it cannot be
    /// (outside a Data group, or overlapping something already used).
    pub fn mark_used(&mut self, ext: Extent) -> Result<(), String> {
        let (g, off) = split(ext.addr);
        let group = self
            .groups
            .get_mut(&g)
            .ok_or_else(|| format!("extent {:#x}+{} is not in a Data group", ext.addr, ext.len))?;
        let end = off + ext.len;
        let (&fstart, &flen) = group
            .free
            .range(..=off)
            .next_back()
            .ok_or_else(|| format!("extent {:#x}+{} overlaps used space", ext.addr, ext.len))?;
        if fstart + flen < end
            || ext.len == 0
            || off % BLOCK_SIZE != 0
            || !ext.len.is_multiple_of(BLOCK_SIZE)
        {
            return Err(format!(
                "extent {:#x}+{} overlaps used space or is misaligned",
                ext.addr, ext.len
            ));
        }
        group.carve(fstart, flen, off, ext.len);
        Ok(())
    }

    /// Allocate up to `len` bytes (a block multiple) as one contiguous run,
    /// placed if possible (see [`Allocator::allocate_placed`]), else the
    /// first run that holds everything, then the largest free run. `None`
    /// when every group is full.
    pub fn allocate(&mut self, len: u64, hint: Option<u64>) -> Option<Extent> {
        if let Some(ext) = self.allocate_placed(len, hint) {
            return Some(ext);
        }
        let mut best: Option<(u32, u64, u64)> = None;
        for (&gi, group) in &self.groups {
            for (&start, &flen) in &group.free {
                if len <= flen {
                    return self.take_at(group_addr(gi, start), len);
                }
                if best.is_none_or(|(_, _, blen)| flen > blen) {
                    best = Some((gi, start, flen));
                }
            }
        }
        let (gi, start, flen) = best?;
        self.take_at(group_addr(gi, start), len.min(flen))
    }

    /// Allocate up to `len` bytes where they keep the file contiguous or
    /// fill stripes whole: the `hint` address first; a request smaller than
    /// a stripe then continues at the cursor, or starts a free run that
    /// holds an aligned stripe; a larger one takes a stripe-aligned place
    /// that holds it, or the aligned whole stripes of the roomiest run.
    /// `None` when only the fragments between used blocks are left: the
    /// caller had better take a fresh group than write into them, where
    /// every write, small or large, would be a partial stripe
    /// (read-modify-write on parity levels).
    pub fn allocate_placed(&mut self, len: u64, hint: Option<u64>) -> Option<Extent> {
        let small_at = |groups: &BTreeMap<u32, GroupFree>, at: u64| {
            groups
                .get(&split(at).0)
                .is_some_and(|g| len < g.info.stripe_bytes)
        };
        if let Some(h) = hint {
            if let Some(ext) = self.take_continuing(h, len) {
                // A small writer continuing its file is where the next
                // small request goes on: a cursor left behind would send
                // the writer's next block to another stripe, and each
                // stripe it passed through would stay partial.
                if small_at(&self.groups, ext.addr) {
                    self.cursor = Some(ext.addr + ext.len);
                }
                return Some(ext);
            }
        }
        if let Some(c) = self.cursor.filter(|&c| small_at(&self.groups, c)) {
            if let Some(ext) = self.take_continuing(c, len) {
                self.cursor = Some(ext.addr + ext.len);
                return Some(ext);
            }
        }
        let roomy = self.groups.iter().find_map(|(&gi, group)| {
            let stripe = group.stripe();
            let room = len.max(stripe);
            group.roomy.iter().find_map(|&start| {
                let flen = group.free.get(&start).copied().unwrap_or(0);
                let aligned = round_up(start, stripe);
                (aligned + room <= start + flen).then_some((gi, aligned, len < room))
            })
        });
        if let Some((gi, aligned, small)) = roomy {
            let ext = self.take_at(group_addr(gi, aligned), len)?;
            if small {
                self.cursor = Some(ext.addr + ext.len);
            }
            return Some(ext);
        }
        // Large: the most whole aligned stripes any run holds.
        let mut roomiest: Option<(u32, u64, u64)> = None;
        for (&gi, group) in &self.groups {
            let stripe = group.stripe();
            if len < stripe {
                continue;
            }
            for &start in &group.roomy {
                let flen = group.free.get(&start).copied().unwrap_or(0);
                let aligned = round_up(start, stripe);
                let room = (start + flen).saturating_sub(aligned) / stripe * stripe;
                if room > 0 && roomiest.is_none_or(|(_, _, r)| room > r) {
                    roomiest = Some((gi, aligned, room));
                }
            }
        }
        let (gi, aligned, room) = roomiest?;
        self.take_at(group_addr(gi, aligned), len.min(room))
    }

    /// Continue a file at `addr`. A small request (under a stripe) does
    /// only at the cursor or at a stripe's start, and only if the free run
    /// there reaches the end of the stripe. A large one takes all of `len`
    /// if the run holds it, else only up to the run's last stripe boundary,
    /// and nothing if there is none past `addr`: the tail of a run that
    /// ends inside a stripe beside live data would make that stripe a
    /// partial one, and the rest of the request would start misaligned
    /// wherever it went.
    fn take_continuing(&mut self, addr: u64, len: u64) -> Option<Extent> {
        let (g, off) = split(addr);
        let group = self.groups.get(&g)?;
        let stripe = group.stripe();
        let (&fstart, &flen) = group.free.range(..=off).next_back()?;
        let run_end = fstart + flen;
        if run_end <= off {
            return None;
        }
        if len < stripe {
            // Only at the cursor (a small writer going on where it left
            // off) or at the start of a stripe that is free to its end: the
            // free block after wherever a random writer's previous block
            // now lies is a hole beside live data, and every small write
            // put there would be a partial stripe. They go to the cursor.
            let stripe_end = ((off / stripe + 1) * stripe).min(group.usable);
            let placed = Some(addr) == self.cursor || off.is_multiple_of(stripe);
            return if placed && run_end >= stripe_end {
                self.take_at(addr, len)
            } else {
                None
            };
        }
        if off + len <= run_end || run_end == group.usable {
            return self.take_at(addr, len);
        }
        let cut = run_end / stripe * stripe;
        if cut <= off {
            return None;
        }
        self.take_at(addr, cut - off)
    }

    /// Take `[addr, addr+len)` or as much of it as is free from `addr` on.
    fn take_at(&mut self, addr: u64, len: u64) -> Option<Extent> {
        let (g, off) = split(addr);
        let group = self.groups.get_mut(&g)?;
        let (&fstart, &flen) = group.free.range(..=off).next_back()?;
        if fstart + flen <= off {
            return None;
        }
        let take = len.min(fstart + flen - off);
        group.carve(fstart, flen, off, take);
        Some(Extent::new(addr, take))
    }

    pub fn free(&mut self, ext: Extent) {
        let (g, mut off) = split(ext.addr);
        let Some(group) = self.groups.get_mut(&g) else {
            return;
        };
        let mut len = ext.len;
        group.free_bytes += len;
        if let Some((&ps, &pl)) = group.free.range(..off).next_back() {
            if ps + pl == off {
                group.remove_run(ps);
                off = ps;
                len += pl;
            }
        }
        if let Some(nl) = group.remove_run(off + len) {
            len += nl;
        }
        group.insert_run(off, len);
    }

    /// Take out the whole stripes (the group's stripe, see
    /// [`GroupFree::stripe`]) of free space that `ext`, just freed, lies in
    /// or touches, so they can be discarded with nothing allocated in them
    /// meanwhile; the caller gives them back with [`Allocator::free`]. A
    /// stripe is taken only when all of it is free, so parity levels can
    /// discard it whole; each becomes free for good with the last of its
    /// blocks, so big free runs are not taken again for every small free
    /// beside them.
    pub fn take_discardable(&mut self, ext: Extent) -> Vec<Extent> {
        let (g, off) = split(ext.addr);
        let Some(group) = self.groups.get_mut(&g) else {
            return Vec::new();
        };
        let unit = group.stripe();
        let lo = off / unit * unit;
        let hi = round_up(off + ext.len, unit).min(group.usable / unit * unit);
        let mut runs: Vec<(u64, u64)> = group
            .free
            .range(..=lo)
            .next_back()
            .map(|(&s, &l)| (s, l))
            .into_iter()
            .collect();
        runs.extend(group.free.range(lo + 1..hi).map(|(&s, &l)| (s, l)));
        let mut taken = Vec::new();
        for (start, len) in runs {
            let a = round_up(start.max(lo), unit);
            let b = ((start + len).min(hi)) / unit * unit;
            if a < b {
                group.carve(start, len, a, b - a);
                taken.push(Extent::new(group_addr(g, a), b - a));
            }
        }
        taken
    }

    /// (group, free runs) for fsck's accounting check.
    pub fn free_runs(&self) -> Vec<(u32, u64, u64)> {
        self.groups
            .iter()
            .flat_map(|(&g, gf)| gf.free.iter().map(move |(&s, &l)| (g, s, l)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::store::GroupKind;

    #[test]
    fn aligned_allocation_and_merge_on_free() {
        let mut a = Allocator::default();
        a.add_group(GroupInfo {
            index: 1,
            kind: GroupKind::Data,
            capacity: 1 << 20,
            stripe_bytes: 65536,
        });
        let small = a.allocate(4096, None).unwrap();
        assert_eq!(small.addr, group_addr(1, 0));
        let big = a.allocate(131072, None).unwrap();
        assert_eq!(big.addr % 65536, 0);
        assert_eq!(big.len, 131072);
        a.free(small);
        a.free(big);
        assert_eq!(a.free_bytes(), 1 << 20);
        assert_eq!(a.free_runs().len(), 1);
    }

    /// The index of roomy runs and the byte count agree with the free map
    /// after any sequence of allocations and frees.
    #[test]
    fn the_roomy_index_follows_every_allocation_and_free() {
        use rand::{Rng, SeedableRng};
        let stripe = 3 * 16384;
        let mut a = Allocator::default();
        for index in 0..2 {
            a.add_group(GroupInfo {
                index,
                kind: GroupKind::Data,
                capacity: 4 << 20,
                stripe_bytes: stripe,
            });
        }
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        let mut held: Vec<Extent> = Vec::new();
        for step in 0..3000 {
            if held.is_empty() || rng.gen_ratio(3, 5) {
                let len = BLOCK_SIZE * rng.gen_range(1..40);
                let hint = held.last().filter(|_| rng.gen()).map(|e| e.addr + e.len);
                if let Some(ext) = a.allocate(len, hint) {
                    held.push(ext);
                }
            } else {
                let ext = held.swap_remove(rng.gen_range(0..held.len()));
                a.free(ext);
            }
            let mut free = 0;
            for group in a.groups.values() {
                let roomy: BTreeSet<u64> = group
                    .free
                    .iter()
                    .filter(|(&s, &l)| round_up(s, stripe) + stripe <= s + l)
                    .map(|(&s, _)| s)
                    .collect();
                assert_eq!(group.roomy, roomy, "step {step}");
                free += group.free.values().sum::<u64>();
            }
            let used: u64 = held.iter().map(|e| e.len).sum();
            assert_eq!(free, a.free_bytes(), "step {step}");
            assert_eq!(free + used, 8 << 20, "step {step}");
        }
    }

    /// An allocator over one 1 MiB Data group (index 0) of `stripe` stripes.
    fn one_group(stripe: u64) -> Allocator {
        let mut a = Allocator::default();
        a.add_group(GroupInfo {
            index: 0,
            kind: GroupKind::Data,
            capacity: 1 << 20,
            stripe_bytes: stripe,
        });
        a
    }

    #[test]
    fn small_allocations_pack_at_the_cursor_instead_of_filling_holes() {
        let stripe = 65536;
        let mut a = one_group(stripe);
        let file = a.allocate(4 * stripe, None).unwrap();
        // Copy-on-write frees scattered single blocks of the file.
        for i in [1u64, 5, 9, 40] {
            a.free(Extent::new(file.addr + i * BLOCK_SIZE, BLOCK_SIZE));
        }
        let first = a
            .allocate(BLOCK_SIZE, Some(file.addr + BLOCK_SIZE * 3))
            .unwrap();
        assert_eq!(first.addr % stripe, 0, "a new stripe, not a hole");
        assert!(first.addr >= file.addr + file.len);
        for i in 1..20 {
            let next = a.allocate(BLOCK_SIZE, None).unwrap();
            assert_eq!(next.addr, first.addr + i * BLOCK_SIZE, "allocation {i}");
        }
        // With no stripe-sized run left, the holes are used.
        let rest = a.allocate(1 << 20, None).unwrap();
        assert!(rest.len < 1 << 20);
        while a.allocate(1 << 20, None).is_some_and(|e| e.len >= stripe) {}
        let hole = a.allocate(BLOCK_SIZE, None).expect("a hole is left");
        assert!(hole.addr < file.addr + file.len, "{hole:?}");
    }

    /// A small sequential writer (`dd bs=4k`, `cp`'s 128 KiB requests on a
    /// 256 KiB stripe), each request hinted at the end of the last, fills
    /// stripe after stripe, with another writer's small requests packing
    /// behind it rather than splitting its stripes.
    #[test]
    fn small_requests_continuing_a_file_fill_stripes_in_order() {
        let stripe = 65536;
        for len in [BLOCK_SIZE, 4 * BLOCK_SIZE] {
            let mut a = one_group(stripe);
            let mut end = None;
            let mut first = None;
            for i in 0..3 * stripe / len {
                let ext = a.allocate_placed(len, end).expect("room");
                let start = *first.get_or_insert(ext.addr);
                assert_eq!(start % stripe, 0, "a stripe start");
                assert_eq!(ext.addr, start + i * len, "request {i} of {len} bytes");
                end = Some(ext.addr + ext.len);
            }
            // Another writer's small request, unhinted, goes on behind.
            let other = a.allocate_placed(len, None).expect("room");
            assert_eq!(Some(other.addr), end);
        }
    }

    /// Large requests keep to whole stripes: a continuation stops at the
    /// last stripe boundary of a run that cannot hold it (and does not start
    /// in a run that ends inside its stripe), the aligned stripes of the
    /// roomiest run are taken when no run holds everything, and with only
    /// fragments left the placed allocation says so, so the caller takes a
    /// fresh group before scattering the request over them.
    #[test]
    fn large_requests_keep_to_whole_stripes_and_leave_fragments_for_last() {
        let stripe = 65536;
        let mut a = one_group(stripe);
        let at = |off: u64| group_addr(0, off);
        // Used: the file's [0, 0x8000), one block at 0xc000, one at 0x80000.
        let mark = |a: &mut Allocator, off: u64| a.mark_used(Extent::new(at(off), BLOCK_SIZE));
        a.mark_used(Extent::new(at(0), 0x8000)).expect("mark");
        mark(&mut a, 0xc000).expect("mark");
        mark(&mut a, 0x80000).expect("mark");
        // From 0xd000 the run ends at 0x80000, a boundary: taken up to it.
        let cont = a
            .take_continuing(at(0xd000), 8 * stripe)
            .expect("continued");
        assert_eq!((cont.addr, cont.len), (at(0xd000), 0x80000 - 0xd000));
        // The run at the file's end ends inside the same stripe: no
        // continuation, for a large request or a small one.
        assert_eq!(a.take_continuing(at(0x8000), 3 * stripe), None);
        assert_eq!(a.take_continuing(at(0x8000), BLOCK_SIZE), None);
        let small = a
            .allocate_placed(BLOCK_SIZE, Some(at(0x8000)))
            .expect("small");
        assert_eq!(
            small.addr % stripe,
            0,
            "a small one starts a stripe instead"
        );
        // No run holds 8 stripes aligned: the roomiest gives its whole stripes.
        let roomiest = a.allocate_placed(8 * stripe, None).expect("roomiest");
        assert_eq!(roomiest.addr % stripe, 0);
        assert_eq!(roomiest.len % stripe, 0);
        // Take every whole stripe; fragments are then left to `allocate` alone.
        while a.allocate_placed(stripe, None).is_some() {}
        assert!(a.free_bytes() > 0, "fragments are left");
        assert_eq!(a.allocate_placed(2 * stripe, None), None);
        let scrap = a.allocate(2 * stripe, None).expect("a fragment");
        assert!(scrap.len < 2 * stripe);
    }
}
