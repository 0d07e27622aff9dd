//! Data and metadata checksums over a real array engine: bytes flipped in
//! member images behind raidfs's back are detected, the right data is
//! returned, the bad copy is healed and counted against its member, and a
//! scrub finds and repairs what reads did not touch.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsStr;
use std::sync::Arc;

use common::members::{faulty, named};
use raidfs::array::{assemble, create, Array, AssembleOptions, CreateSpec, GROUP_SHIFT};
use raidfs::fs::{
    ArrayStore, Caller, ChecksumKind, FileSystem, FormatOptions, FsError, FsOptions, ROOT_INO,
};
use raidfs::geometry::{Layout, Level};
use raidfs::member::faulty::FaultyMember;
use raidfs::member::Member;
use raidfs::superblock::GroupProfile;
use raidfs::volume::Volume;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const MEMBER_SIZE: u64 = 64 << 20;
const BLOCK: u64 = 4096;

/// Members and the volume on them, opened as a mount opens it (marked
/// dirty, filesystem open, then background work).
struct Rig {
    members: Vec<FaultyMember>,
    volume: Volume,
}

fn open_volume(array: Arc<Array>) -> Volume {
    Volume::open(array, FsOptions::default()).expect("open volume")
}

fn build_with(level: Level, n: usize, chunk: u64, copies: usize, format: FormatOptions) -> Rig {
    let members = faulty(n, MEMBER_SIZE, "mem");
    let spec = CreateSpec {
        level,
        layout: Layout::LeftSymmetric,
        chunk,
        copies,
        name: "csum".into(),
        ppl: false,
    };
    let array = Arc::new(create(named(&members), &spec).expect("create array"));
    let store = Arc::new(ArrayStore::new(Arc::clone(&array)));
    FileSystem::format_with(store, &format).expect("format");
    let volume = open_volume(array);
    Rig { members, volume }
}

fn build(level: Level, n: usize, chunk: u64, copies: usize) -> Rig {
    build_with(level, n, chunk, copies, FormatOptions::default())
}

impl Rig {
    fn fs(&self) -> &FileSystem {
        self.volume.fs()
    }

    fn array(&self) -> &Arc<Array> {
        self.volume.array()
    }

    /// Close the volume and drop the array, as a clean shutdown between sessions.
    fn stop(self) -> Vec<FaultyMember> {
        self.volume.close().expect("close volume");
        self.members
    }

    fn start(members: Vec<FaultyMember>) -> Rig {
        let array = Arc::new(
            assemble(named(&members), AssembleOptions::default())
                .expect("assemble")
                .array,
        );
        let volume = open_volume(array);
        Rig { members, volume }
    }

    fn write_file(&self, name: &str, data: &[u8]) -> u64 {
        let ino = self
            .fs()
            .mknod(&Caller::root(), ROOT_INO, OsStr::new(name), 0o100644, 0, 0)
            .expect("create file")
            .ino;
        // Several writes, so files get several extents and partial blocks.
        for (i, piece) in data.chunks(300_000).enumerate() {
            self.fs()
                .write(ino, (i * 300_000) as u64, piece)
                .expect("write file");
        }
        ino
    }

    fn ino(&self, name: &str) -> u64 {
        self.fs()
            .lookup(&Caller::root(), ROOT_INO, OsStr::new(name))
            .expect("lookup")
            .ino
    }

    fn read_all(&self, ino: u64) -> Result<Vec<u8>, FsError> {
        let size = self.fs().getattr(ino)?.size;
        let mut out = Vec::new();
        let mut off = 0;
        while off < size {
            let chunk = self.fs().read(ino, off, 128 << 10)?;
            off += chunk.len() as u64;
            out.extend(chunk);
        }
        Ok(out)
    }

    /// Logical address of the block holding file offset `off`.
    fn block_addr(&self, ino: u64, off: u64) -> u64 {
        let extents = self.fs().extents(ino).expect("extents");
        let (start, addr, _) = extents
            .into_iter()
            .find(|&(start, _, len)| off >= start && off < start + len)
            .expect("offset is mapped");
        addr + (off - start) / BLOCK * BLOCK
    }

    /// (slot, member offset) of every copy of logical `addr` (for parity
    /// levels: the data chunk only).
    fn copies(&self, addr: u64) -> Vec<(usize, u64)> {
        let sb = self.array().superblock();
        let group = addr >> GROUP_SHIFT;
        let offset = addr & ((1 << GROUP_SHIFT) - 1);
        let profile = self
            .array()
            .groups()
            .into_iter()
            .find(|(g, _)| *g as u64 == group)
            .map(|(_, p)| p)
            .expect("allocated group");
        let geometry = match profile {
            GroupProfile::Metadata => self.array().metadata_geometry(),
            _ => self.array().data_geometry(),
        };
        let base = sb.data_offset + group * sb.group_size;
        geometry
            .map(offset)
            .targets
            .iter()
            .map(|t| (t.member, base + t.offset))
            .collect()
    }

    /// (member offset, length) of every allocated group.
    fn group_regions(&self) -> Vec<(u64, u64)> {
        let sb = self.array().superblock();
        self.array()
            .groups()
            .into_iter()
            .map(|(g, _)| (sb.data_offset + g as u64 * sb.group_size, sb.group_size))
            .collect()
    }

    fn checksum_errors(&self) -> Vec<u64> {
        self.array()
            .status()
            .members
            .iter()
            .map(|m| m.checksum_errors)
            .collect()
    }

    /// The array's own check (parity / mirror consistency): mismatched bytes.
    fn array_check(&self, repair: bool) -> u64 {
        self.array().start_check(repair).expect("start check");
        self.array().wait_background();
        let result = self.array().last_sync_result().expect("check result");
        assert!(result.completed, "{}", result.message);
        result.mismatches
    }
}

fn flip(member: &FaultyMember, at: u64, len: usize) {
    let mut buf = vec![0u8; len];
    member.read_at(&mut buf, at).expect("read member");
    for b in &mut buf {
        *b ^= 0x5a;
    }
    member.write_at(&buf, at).expect("write member");
}

fn raw(member: &FaultyMember, at: u64, len: usize) -> Vec<u8> {
    let mut buf = vec![0u8; len];
    member.read_at(&mut buf, at).expect("read member");
    buf
}

fn random_bytes(rng: &mut StdRng, len: usize) -> Vec<u8> {
    (0..len).map(|_| rng.gen()).collect()
}

#[test]
fn raid5_flipped_data_and_metadata_read_correctly_and_are_counted() {
    let mut rng = StdRng::seed_from_u64(5);
    let rig = build(Level::Raid5, 4, 16 << 10, 1);
    let files: Vec<(String, Vec<u8>)> = [200_000usize, 1_048_699, 50_000]
        .iter()
        .enumerate()
        .map(|(i, &len)| (format!("f{i}"), random_bytes(&mut rng, len)))
        .collect();
    for (name, data) in &files {
        rig.write_file(name, data);
    }
    // Data blocks to damage: (file, offset); and one parity block.
    let targets = [
        (0usize, 0u64),
        (1, 10 * BLOCK),
        (1, 30 * BLOCK),
        (1, 200 * BLOCK),
    ];
    let mut expected = vec![0u64; 4];
    let mut damaged = Vec::new();
    for &(f, off) in &targets {
        let ino = rig.ino(&files[f].0);
        let (slot, at) = rig.copies(rig.block_addr(ino, off))[0];
        expected[slot] += 1;
        damaged.push((
            slot,
            at,
            files[f].1[off as usize..(off + BLOCK) as usize].to_vec(),
        ));
    }
    let header_copy = rig.copies(0)[0];
    expected[header_copy.0] += 1;
    let parity_of = {
        let ino = rig.ino("f2");
        let addr = rig.block_addr(ino, 2 * BLOCK);
        let g = rig.array().data_geometry();
        let map = g.map(addr & ((1 << GROUP_SHIFT) - 1));
        let p = g.stripe_members(map.stripe).p.expect("parity member");
        (p, rig.copies(addr)[0].1)
    };
    let ms = rig.stop();
    for &(slot, at, _) in &damaged {
        flip(&ms[slot], at + 100, 7);
    }
    flip(&ms[header_copy.0], header_copy.1 + 20, 3);
    flip(&ms[parity_of.0], parity_of.1 + 9, 1);

    let rig = Rig::start(ms);
    for (name, data) in &files {
        assert_eq!(&rig.read_all(rig.ino(name)).expect("read"), data, "{name}");
    }
    assert_eq!(rig.checksum_errors(), expected);
    let status = rig.array().status();
    assert!(status
        .members
        .iter()
        .all(|m| m.state == "active" && m.read_errors == 0));
    for (slot, at, good) in &damaged {
        assert_eq!(
            &raw(&rig.members[*slot], *at, BLOCK as usize),
            good,
            "healed in place"
        );
    }
    // Reads healed the data; the parity block is the array check's business.
    let scrub = rig.fs().scrub(true).expect("scrub");
    assert!(scrub.is_clean(), "{scrub:?}");
    assert!(scrub.data_bytes >= files.iter().map(|f| f.1.len() as u64).sum::<u64>());
    assert!(rig.array_check(true) > 0, "the flipped parity is found");
    assert_eq!(rig.array_check(false), 0);
    let again = rig.fs().scrub(false).expect("scrub");
    assert!(again.is_clean(), "{again:?}");
    assert_eq!(rig.checksum_errors(), expected, "nothing counted twice");
}

/// Flip bytes at random in used blocks (data, parity and metadata) of every
/// member, at most one member per member-offset row so redundancy suffices.
fn flip_randomly(
    members: &[FaultyMember],
    regions: &[(u64, u64)],
    rng: &mut StdRng,
    count: usize,
) -> BTreeMap<usize, usize> {
    let mut used = Vec::new();
    for &(base, size) in regions {
        for (slot, m) in members.iter().enumerate() {
            let mut region = vec![0u8; size as usize];
            m.read_at(&mut region, base).expect("read member");
            for (i, block) in region.chunks(BLOCK as usize).enumerate() {
                if block.iter().any(|b| *b != 0) {
                    used.push((slot, base + i as u64 * BLOCK));
                }
            }
        }
    }
    let mut rows = BTreeSet::new();
    let mut flipped = BTreeMap::new();
    while flipped.values().sum::<usize>() < count {
        let (slot, at) = used[rng.gen_range(0..used.len())];
        if !rows.insert(at) {
            continue;
        }
        flip(
            &members[slot],
            at + rng.gen_range(0..BLOCK - 8),
            rng.gen_range(1..8),
        );
        *flipped.entry(slot).or_insert(0) += 1;
    }
    flipped
}

#[test]
fn random_flips_on_every_redundant_level_are_healed_and_scrubbed_clean() {
    let configs = [
        (Level::Raid1, 2, 64 << 10, 2),
        (Level::Raid1, 3, 64 << 10, 3),
        (Level::Raid5, 3, 16 << 10, 1),
        (Level::Raid5, 5, 8 << 10, 1),
        (Level::Raid6, 4, 16 << 10, 1),
        (Level::Raid10, 4, 16 << 10, 2),
    ];
    for (seed, (level, n, chunk, copies)) in configs.into_iter().enumerate() {
        let mut rng = StdRng::seed_from_u64(seed as u64 + 100);
        let rig = build(level, n, chunk, copies);
        let files: Vec<(String, Vec<u8>)> = (0..5)
            .map(|i| {
                let len = rng.gen_range(1..700_000);
                (format!("f{i}"), random_bytes(&mut rng, len))
            })
            .collect();
        for (name, data) in &files {
            rig.write_file(name, data);
        }
        let regions = rig.group_regions();
        let ms = rig.stop();
        let flipped = flip_randomly(&ms, &regions, &mut rng, 3 * n);
        let rig = Rig::start(ms);
        for (name, data) in &files {
            let got = rig.read_all(rig.ino(name)).expect("read");
            assert!(&got == data, "{level:?}: {name} reads back wrong");
        }
        let scrub = rig.fs().scrub(true).expect("scrub");
        assert!(scrub.lost.is_empty(), "{level:?}: {scrub:?}");
        rig.array_check(true);
        let again = rig.fs().scrub(false).expect("scrub");
        assert!(again.is_clean(), "{level:?}: {again:?}");
        assert_eq!(rig.array_check(false), 0, "{level:?}");
        for (slot, errors) in rig.checksum_errors().into_iter().enumerate() {
            if errors > 0 {
                assert!(
                    flipped.contains_key(&slot),
                    "{level:?}: slot {slot} blamed wrongly"
                );
            }
        }
        for (name, data) in &files {
            assert!(
                &rig.read_all(rig.ino(name)).expect("read") == data,
                "{level:?}"
            );
        }
    }
}

/// Metadata groups on four members are mirrored three ways, so a group's
/// last chunk would spill into the next group; the array check must leave it
/// alone (it once "repaired" the next group's data from it).
#[test]
fn array_check_of_a_fresh_array_is_clean_and_repair_keeps_data() {
    let mut rng = StdRng::seed_from_u64(9);
    let rig = build(Level::Raid5, 4, 16 << 10, 1);
    let data = random_bytes(&mut rng, 100_000);
    rig.write_file("f", &data);
    let rig = Rig::start(rig.stop());
    assert_eq!(rig.array_check(false), 0);
    assert_eq!(rig.array_check(true), 0);
    assert_eq!(rig.read_all(rig.ino("f")).expect("read"), data);
    assert!(rig.fs().scrub(false).expect("scrub").is_clean());
}

#[test]
fn two_bad_members_in_one_raid5_stripe_give_eio_there_only() {
    let mut rng = StdRng::seed_from_u64(11);
    let chunk = 16u64 << 10;
    let rig = build(Level::Raid5, 4, chunk, 1);
    let data = random_bytes(&mut rng, 600_000);
    let ino = rig.write_file("f", &data);
    // Block 1 of the first two data chunks of one stripe: same member row,
    // different members, so parity cannot tell which to rebuild.
    let stripe = 3 * chunk;
    let start = (0..data.len() as u64 - stripe)
        .step_by(BLOCK as usize)
        .find(|&off| {
            let addr = rig.block_addr(ino, off);
            (addr & ((1 << GROUP_SHIFT) - 1)).is_multiple_of(stripe)
                && rig.block_addr(ino, off + stripe - BLOCK) == addr + stripe - BLOCK
        })
        .expect("a whole stripe inside the file");
    let bad = [start + BLOCK, start + chunk + BLOCK];
    let a = rig.copies(rig.block_addr(ino, bad[0]))[0];
    let b = rig.copies(rig.block_addr(ino, bad[1]))[0];
    assert_ne!(a.0, b.0);
    assert_eq!(a.1, b.1, "same row");
    let ms = rig.stop();
    flip(&ms[a.0], a.1 + 5, 2);
    flip(&ms[b.0], b.1 + 4000, 3);
    let rig = Rig::start(ms);
    let ino = rig.ino("f");
    for off in (0..data.len() as u64).step_by(BLOCK as usize) {
        let got = rig.fs().read(ino, off, BLOCK as usize);
        if bad.contains(&off) {
            let e = got.expect_err("a block with no good version");
            assert_eq!(raidfs::fuse::errno_of(&e).code(), libc::EIO, "{e}");
        } else {
            let end = (off + BLOCK).min(data.len() as u64) as usize;
            assert_eq!(
                got.expect("good block"),
                &data[off as usize..end],
                "offset {off}"
            );
        }
    }
    // A read spanning a bad block fails as a whole; scrub names both blocks.
    assert!(rig.fs().read(ino, start, 64 << 10).is_err());
    let scrub = rig.fs().scrub(true).expect("scrub");
    let lost: Vec<u64> = scrub.lost.iter().map(|l| l.file_off).collect();
    assert_eq!(lost, bad.to_vec());
    assert!(rig
        .array()
        .status()
        .members
        .iter()
        .all(|m| m.state == "active"));
}

#[test]
fn raid1_copies_that_differ_are_settled_by_the_checksum() {
    let mut rng = StdRng::seed_from_u64(12);
    let rig = build(Level::Raid1, 2, 64 << 10, 2);
    let data = random_bytes(&mut rng, 300_000);
    let ino = rig.write_file("f", &data);
    let copies_a = rig.copies(rig.block_addr(ino, 8 * BLOCK));
    let copies_b = rig.copies(rig.block_addr(ino, 40 * BLOCK));
    let ms = rig.stop();
    // Rewrite one copy of each block behind raidfs's back: block A on the
    // member reads are served from, block B on the other one.
    let other = random_bytes(&mut rng, BLOCK as usize);
    ms[copies_a[0].0]
        .write_at(&other, copies_a[0].1)
        .expect("write");
    ms[copies_b[1].0]
        .write_at(&other, copies_b[1].1)
        .expect("write");
    let good_a = data[8 * BLOCK as usize..9 * BLOCK as usize].to_vec();
    let good_b = data[40 * BLOCK as usize..41 * BLOCK as usize].to_vec();

    let rig = Rig::start(ms);
    assert_eq!(rig.read_all(rig.ino("f")).expect("read"), data);
    // The read met block A's bad copy and rewrote it from the good one.
    let (slot_a, at_a) = copies_a[0];
    assert_eq!(raw(&rig.members[slot_a], at_a, BLOCK as usize), good_a);
    assert_eq!(rig.checksum_errors()[slot_a], 1);
    // Block B's bad copy is not on the read path: scrub finds and repairs it.
    let (slot_b, at_b) = copies_b[1];
    assert_ne!(raw(&rig.members[slot_b], at_b, BLOCK as usize), good_b);
    let scrub = rig.fs().scrub(true).expect("scrub");
    let named: Vec<&str> = scrub.bad_copies.iter().map(|b| b.member.as_str()).collect();
    assert_eq!(named, vec![format!("mem{slot_b}")]);
    assert_eq!(raw(&rig.members[slot_b], at_b, BLOCK as usize), good_b);
    assert!(rig.fs().scrub(false).expect("scrub").is_clean());
    assert_eq!(rig.array_check(false), 0, "copies agree again");
}

#[test]
fn a_member_with_too_many_corrected_errors_is_failed() {
    let mut rng = StdRng::seed_from_u64(13);
    let chunk = 16u64 << 10;
    let rig = build(Level::Raid5, 4, chunk, 1);
    let data = random_bytes(&mut rng, 2 << 20);
    let ino = rig.write_file("f", &data);
    let mut on_victim = Vec::new();
    let mut victim = None;
    for off in (0..data.len() as u64).step_by(BLOCK as usize) {
        let (slot, at) = rig.copies(rig.block_addr(ino, off))[0];
        if *victim.get_or_insert(slot) == slot {
            on_victim.push(at);
        }
    }
    let victim = victim.expect("blocks");
    assert!(on_victim.len() > 30);
    let ms = rig.stop();
    for &at in &on_victim[..30] {
        flip(&ms[victim], at + 1, 1);
    }
    let rig = Rig::start(ms);
    assert_eq!(rig.read_all(rig.ino("f")).expect("read"), data);
    let status = rig.array().status();
    let m = &status.members[victim];
    assert_eq!(m.state, "faulty");
    assert_eq!(m.checksum_errors, raidfs::array::MAX_CORRECTED_ERRORS + 1);
    assert_eq!(
        status
            .members
            .iter()
            .filter(|m| m.state == "active")
            .count(),
        3
    );
}

#[test]
fn read_and_write_errors_are_counted_against_their_member() {
    let mut rng = StdRng::seed_from_u64(14);
    let rig = build(Level::Raid6, 5, 16 << 10, 1);
    let data = random_bytes(&mut rng, 400_000);
    let ino = rig.write_file("f", &data);
    rig.members[1].fail_reads_after(0);
    assert_eq!(rig.read_all(ino).expect("degraded read"), data);
    rig.members[2].fail_writes_after(0);
    let more = random_bytes(&mut rng, 10_000);
    rig.fs()
        .write(ino, 0, &more)
        .expect("write with one more member failing");
    rig.fs().sync_all().expect("sync");
    let status = rig.array().status();
    assert!(
        status.members[1].read_errors >= 1,
        "{:?}",
        status.members[1]
    );
    assert_eq!(status.members[1].write_errors, 0);
    assert!(
        status.members[2].write_errors >= 1,
        "{:?}",
        status.members[2]
    );
    for m in [0, 3, 4] {
        let s = &status.members[m];
        assert_eq!(
            s.read_errors + s.write_errors + s.checksum_errors,
            0,
            "{s:?}"
        );
    }
}

#[test]
fn overwrites_are_copy_on_write_and_in_place_only_when_full() {
    let mut rng = StdRng::seed_from_u64(15);
    let rig = build(Level::Raid1, 2, 64 << 10, 2);
    let data = random_bytes(&mut rng, 64 << 10);
    let ino = rig.write_file("f", &data);
    let before = rig.fs().extents(ino).expect("extents");
    rig.fs().write(ino, 5000, b"new bytes").expect("overwrite");
    let after = rig.fs().extents(ino).expect("extents");
    assert_ne!(before, after, "the overwritten block moved");
    let mut want = data.clone();
    want[5000..5009].copy_from_slice(b"new bytes");
    assert_eq!(rig.read_all(ino).expect("read"), want);
    // Fill the filesystem, then overwrite: it still succeeds, in place.
    let filler = rig
        .fs()
        .mknod(
            &Caller::root(),
            ROOT_INO,
            OsStr::new("filler"),
            0o100644,
            0,
            0,
        )
        .expect("create")
        .ino;
    // The commit returns blocks freed by copy-on-write to the allocator.
    rig.fs().sync_all().expect("sync");
    let chunk = vec![1u8; 1 << 20];
    let mut off = 0;
    while rig.fs().write(filler, off, &chunk).is_ok() {
        off += chunk.len() as u64;
    }
    while rig
        .fs()
        .write(filler, off, &chunk[..BLOCK as usize])
        .is_ok()
    {
        off += BLOCK;
    }
    let placed = rig.fs().extents(ino).expect("extents");
    rig.fs()
        .write(ino, 0, &[9u8; 3 * BLOCK as usize])
        .expect("overwrite when full");
    assert_eq!(rig.fs().extents(ino).expect("extents"), placed, "in place");
    want[..3 * BLOCK as usize].fill(9);
    assert_eq!(rig.read_all(ino).expect("read"), want);
    let rig = Rig::start(rig.stop());
    assert_eq!(rig.read_all(rig.ino("f")).expect("read"), want);
    assert!(rig.fs().scrub(false).expect("scrub").is_clean());
}

#[test]
fn without_checksums_nothing_is_checked_and_overwrites_stay_in_place() {
    let mut rng = StdRng::seed_from_u64(16);
    let off = FormatOptions {
        data_checksum: ChecksumKind::None,
        ..Default::default()
    };
    let rig = build_with(Level::Raid1, 2, 64 << 10, 2, off);
    assert_eq!(rig.fs().data_checksum(), ChecksumKind::None);
    let data = random_bytes(&mut rng, 100_000);
    let ino = rig.write_file("f", &data);
    let before = rig.fs().extents(ino).expect("extents");
    rig.fs().write(ino, 0, &data[..5000]).expect("overwrite");
    assert_eq!(rig.fs().extents(ino).expect("extents"), before);
    let scrub = rig.fs().scrub(false).expect("scrub");
    assert_eq!(scrub.unchecked_blocks, scrub.data_bytes / BLOCK);
    let rig = Rig::start(rig.stop());
    assert_eq!(rig.fs().data_checksum(), ChecksumKind::None);
    assert_eq!(rig.read_all(rig.ino("f")).expect("read"), data);
}

/// Checksums reach the journal: after a commit without unmount (a crash
/// before the next checkpoint), replay restores them, and corruption of
/// data written since the last checkpoint is still caught.
#[test]
fn checksums_are_replayed_from_the_journal() {
    let mut rng = StdRng::seed_from_u64(17);
    let rig = build(Level::Raid5, 3, 16 << 10, 1);
    let data = random_bytes(&mut rng, 200_000);
    let ino = rig.write_file("f", &data);
    rig.fs().sync_all().expect("sync");
    let (slot, at) = rig.copies(rig.block_addr(ino, 7 * BLOCK))[0];
    let Rig { members, volume } = rig;
    volume.abandon();
    flip(&members[slot], at + 33, 4);
    let rig = Rig::start(members);
    assert_eq!(rig.read_all(rig.ino("f")).expect("read"), data);
    assert_eq!(rig.checksum_errors()[slot], 1);
}

#[test]
fn a_read_only_assembly_serves_the_good_copy_and_rewrites_nothing() {
    // fsck without --repair assembles read-only: a bad copy is reported,
    // never rewritten (a write to a member opened read-only would fail it).
    let mut rng = StdRng::seed_from_u64(17);
    let rig = build(Level::Raid1, 2, 64 << 10, 2);
    let data = random_bytes(&mut rng, 64 << 10);
    let ino = rig.write_file("f", &data);
    let addr = rig.block_addr(ino, 0);
    let (slot, at) = rig.copies(addr)[0];
    let ms = rig.stop();
    flip(&ms[slot], at + 100, 7);
    let damaged = raw(&ms[slot], at, BLOCK as usize);

    let array = Arc::new(
        assemble(
            named(&ms),
            AssembleOptions {
                read_only: true,
                ..AssembleOptions::default()
            },
        )
        .expect("assemble read-only")
        .array,
    );
    let volume = Volume::open(
        array,
        FsOptions {
            read_only: true,
            ..FsOptions::default()
        },
    )
    .expect("open read-only");
    let fs = volume.fs();
    let ino = fs
        .lookup(&Caller::root(), ROOT_INO, OsStr::new("f"))
        .expect("lookup")
        .ino;
    assert_eq!(fs.read(ino, 0, data.len()).expect("read"), data);
    assert!(
        raw(&ms[slot], at, BLOCK as usize) == damaged,
        "left as it was"
    );
    let array = volume.array();
    assert!(array.status().members.iter().all(|m| m.state == "active"));
    volume.close().expect("close read-only");
    assert!(
        raw(&ms[slot], at, BLOCK as usize) == damaged,
        "still as it was after closing"
    );
}

/// Run the array's repair after the lowest member's copy of block `block`
/// of a file went bad behind raidfs's back (a mirror's first copy, or a
/// RAID5 data block), before any read met it. Every copy must then hold
/// the good bytes, a check must be clean and the file read back whole.
fn repair_after_a_bad_block(level: Level, n: usize, copies: usize, block: u64, seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let rig = build(level, n, 64 << 10, copies);
    let data = random_bytes(&mut rng, 300_000);
    let ino = rig.write_file("f", &data);
    let places = rig.copies(rig.block_addr(ino, block * BLOCK));
    let ms = rig.stop();
    let (slot, at) = places[0];
    flip(&ms[slot], at, BLOCK as usize);

    let rig = Rig::start(ms);
    assert_eq!(rig.array_check(true), BLOCK, "{level:?}");
    let good = &data[(block * BLOCK) as usize..((block + 1) * BLOCK) as usize];
    for &(slot, at) in &places {
        assert_eq!(
            raw(&rig.members[slot], at, BLOCK as usize),
            good,
            "{level:?} slot {slot}"
        );
    }
    assert_eq!(rig.array_check(false), 0, "{level:?}");
    assert_eq!(rig.read_all(ino).expect("read"), data, "{level:?}");
}

#[test]
fn mirror_repair_keeps_the_copy_that_passes_the_checksum_even_when_it_is_not_the_first() {
    // md's repair copies the first copy over the others: here the bad one.
    repair_after_a_bad_block(Level::Raid1, 2, 2, 8, 21);
}

#[test]
fn parity_repair_rebuilds_a_data_block_that_fails_its_checksum() {
    // md would recompute parity from the bad data, and the block would be
    // lost for good; the checksum says the data is what is wrong.
    repair_after_a_bad_block(Level::Raid5, 3, 1, 20, 22);
}

/// Both copies of a mirror block flipped: the read fails and the block is
/// on the damaged-data log, with its file offset; the log, kept in a file,
/// survives a restart; rewriting the block, truncating below it or
/// deleting the file takes it off.
#[test]
fn blocks_no_copy_can_correct_are_logged_until_the_file_changes() {
    let mut rng = StdRng::seed_from_u64(21);
    let rig = build(Level::Raid1, 2, 64 << 10, 2);
    let data = random_bytes(&mut rng, 64 << 10);
    let names = ["rewritten", "truncated", "deleted"];
    for name in names {
        rig.write_file(name, &data);
    }
    let bad_off = 3 * BLOCK;
    let targets: Vec<u64> = names
        .iter()
        .map(|n| rig.block_addr(rig.ino(n), bad_off))
        .collect();
    let copies: Vec<Vec<(usize, u64)>> = targets.iter().map(|&a| rig.copies(a)).collect();
    let ms = rig.stop();
    for c in copies.iter().flatten() {
        flip(&ms[c.0], c.1 + 17, 4);
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("damaged/array.json");
    let rig = Rig::start(ms);
    rig.fs().keep_damaged_log(&log).expect("keep the log");
    assert!(rig.fs().damaged_ranges().is_empty());
    for name in names {
        let e = rig.read_all(rig.ino(name)).expect_err("no good copy");
        assert_eq!(raidfs::fuse::errno_of(&e).code(), libc::EIO, "{e}");
    }
    let logged: Vec<(u64, u64, u64)> = rig
        .fs()
        .damaged_ranges()
        .iter()
        .map(|d| (d.ino, d.offset, d.length))
        .collect();
    let inos: Vec<u64> = names.iter().map(|n| rig.ino(n)).collect();
    assert_eq!(
        logged,
        inos.iter()
            .map(|&i| (i, bad_off, BLOCK))
            .collect::<Vec<_>>()
    );
    assert_eq!(rig.fs().path_of(inos[0]).as_deref(), Some("/rewritten"));
    assert_eq!(rig.fs().recheck_damaged(), 3, "nothing can bring them back");

    // A restart finds the same entries in the log file.
    let ms = rig.stop();
    let rig = Rig::start(ms);
    assert!(
        rig.fs().damaged_ranges().is_empty(),
        "not yet pointed at the file"
    );
    rig.fs().keep_damaged_log(&log).expect("keep the log");
    assert_eq!(rig.fs().damaged_ranges().len(), 3);

    let fresh = random_bytes(&mut rng, BLOCK as usize);
    rig.fs()
        .write(inos[0], bad_off, &fresh)
        .expect("rewrite the damaged block");
    let set = raidfs::fs::SetAttr {
        size: Some(bad_off),
        ..Default::default()
    };
    rig.fs()
        .setattr(&Caller::root(), inos[1], &set)
        .expect("truncate below the damage");
    rig.fs()
        .unlink(&Caller::root(), ROOT_INO, OsStr::new("deleted"))
        .expect("delete");
    assert_eq!(rig.fs().damaged_ranges(), Vec::new());
    let mut expected = data.clone();
    expected[bad_off as usize..(bad_off + BLOCK) as usize].copy_from_slice(&fresh);
    assert_eq!(
        rig.read_all(inos[0]).expect("rewritten file reads"),
        expected
    );
    let kept = std::fs::read_to_string(&log).expect("log file");
    assert!(kept.contains("\"entries\": []"), "{kept}");
}

/// The array's own check meets a mirror block whose copies disagree and
/// all fail the checksum: the block is on the damaged-data log without
/// any read of the file.
#[test]
fn an_array_check_logs_blocks_with_no_good_copy() {
    let mut rng = StdRng::seed_from_u64(22);
    let rig = build(Level::Raid1, 2, 64 << 10, 2);
    let data = random_bytes(&mut rng, 32 << 10);
    let ino = rig.write_file("f", &data);
    let addr = rig.block_addr(ino, 5 * BLOCK);
    let copies = rig.copies(addr);
    let ms = rig.stop();
    // Different damage on each copy, so they disagree and the judge is asked.
    flip(&ms[copies[0].0], copies[0].1 + 10, 3);
    flip(&ms[copies[1].0], copies[1].1 + 2000, 5);
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("array.json");
    let rig = Rig::start(ms);
    rig.fs().keep_damaged_log(&log).expect("keep the log");
    assert!(rig.fs().damaged_ranges().is_empty());
    assert!(rig.array_check(false) > 0, "the copies disagree");
    let logged: Vec<(u64, u64)> = rig
        .fs()
        .damaged_ranges()
        .iter()
        .map(|d| (d.ino, d.offset))
        .collect();
    assert_eq!(logged, vec![(ino, 5 * BLOCK)]);

    // A good copy comes back (the first member's bytes restored): the
    // recheck a repair runs takes the block off the log.
    let ms = rig.stop();
    flip(&ms[copies[0].0], copies[0].1 + 10, 3);
    let rig = Rig::start(ms);
    rig.fs().keep_damaged_log(&log).expect("keep the log");
    assert_eq!(rig.fs().damaged_ranges().len(), 1);
    assert_eq!(rig.fs().recheck_damaged(), 0);
    assert!(rig.fs().damaged_ranges().is_empty());
    assert_eq!(rig.read_all(ino).expect("the file reads"), data);
}
