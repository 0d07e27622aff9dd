//! Data and metadata checksums over a real array engine: bytes flipped in
//! member images behind raidfs's back are detected, the right data is
//! returned, the bad copy is healed and counted against its member, and a
//! scrub finds and repairs what reads did not touch.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsStr;
use std::sync::Arc;

use raidfs::array::{assemble, create, Array, AssembleOptions, CreateSpec, GROUP_SHIFT};
use raidfs::fs::{
    ArrayStore, Caller, FileSystem, FormatOptions, FsError, FsOptions, ROOT_INO,
};
use raidfs::geometry::{Layout, Level};
use raidfs::member::faulty::FaultyMember;
use raidfs::member::Member;
use raidfs::superblock::GroupProfile;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const MEMBER_SIZE: u64 = 64 << 20;
const BLOCK: u64 = 4096;

struct Rig {
    members: Vec<FaultyMember>,
    array: Arc<Array>,
    fs: FileSystem,
}

fn as_members(ms: &[FaultyMember]) -> Vec<(Arc<dyn Member>, String)> {
    ms.iter()
        .enumerate()
        .map(|(i, m)| (Arc::new(m.clone()) as Arc<dyn Member>, format!("mem{i}")))
        .collect()
}

fn open_fs(array: &Arc<Array>) -> FileSystem {
    let store = Arc::new(ArrayStore::new(Arc::clone(array)));
    FileSystem::open(store, FsOptions::default()).expect("open filesystem")
}

fn build_with(level: Level, n: usize, chunk: u64, copies: usize, format: FormatOptions) -> Rig {
    let members: Vec<FaultyMember> = (0..n)
        .map(|i| FaultyMember::memory(MEMBER_SIZE, &format!("mem{i}")).expect("memory member"))
        .collect();
    let spec = CreateSpec {
        level,
        layout: Layout::LeftSymmetric,
        chunk,
        copies,
        name: "csum".into(),
    };
    let array = Arc::new(create(as_members(&members), &spec).expect("create array"));
    let store = Arc::new(ArrayStore::new(Arc::clone(&array)));
    FileSystem::format_with(store, &format).expect("format");
    let fs = open_fs(&array);
    Rig { members, array, fs }
}

fn build(level: Level, n: usize, chunk: u64, copies: usize) -> Rig {
    build_with(level, n, chunk, copies, FormatOptions::default())
}

impl Rig {
    /// Unmount and drop the array, as a power-off between sessions.
    fn stop(self) -> Vec<FaultyMember> {
        self.fs.unmount().expect("unmount");
        drop(self.fs);
        drop(self.array);
        self.members
    }

    fn start(members: Vec<FaultyMember>) -> Rig {
        let array =
            Arc::new(assemble(as_members(&members), AssembleOptions::default()).expect("assemble"));
        array.start_background();
        let fs = open_fs(&array);
        Rig { members, array, fs }
    }

    fn write_file(&self, name: &str, data: &[u8]) -> u64 {
        let ino = self
            .fs
            .mknod(&Caller::root(), ROOT_INO, OsStr::new(name), 0o100644, 0, 0)
            .expect("create file")
            .ino;
        // Several writes, so files get several extents and partial blocks.
        for (i, piece) in data.chunks(300_000).enumerate() {
            self.fs
                .write(ino, (i * 300_000) as u64, piece)
                .expect("write file");
        }
        ino
    }

    fn ino(&self, name: &str) -> u64 {
        self.fs
            .lookup(&Caller::root(), ROOT_INO, OsStr::new(name))
            .expect("lookup")
            .ino
    }

    fn read_all(&self, ino: u64) -> Result<Vec<u8>, FsError> {
        let size = self.fs.getattr(ino)?.size;
        let mut out = Vec::new();
        let mut off = 0;
        while off < size {
            let chunk = self.fs.read(ino, off, 128 << 10)?;
            off += chunk.len() as u64;
            out.extend(chunk);
        }
        Ok(out)
    }

    /// Logical address of the block holding file offset `off`.
    fn block_addr(&self, ino: u64, off: u64) -> u64 {
        let extents = self.fs.extents(ino).expect("extents");
        let (start, addr, _) = extents
            .into_iter()
            .find(|&(start, _, len)| off >= start && off < start + len)
            .expect("offset is mapped");
        addr + (off - start) / BLOCK * BLOCK
    }

    /// (slot, member offset) of every copy of logical `addr` (for parity
    /// levels: the data chunk only).
    fn copies(&self, addr: u64) -> Vec<(usize, u64)> {
        let sb = self.array.superblock();
        let group = addr >> GROUP_SHIFT;
        let offset = addr & ((1 << GROUP_SHIFT) - 1);
        let profile = self
            .array
            .groups()
            .into_iter()
            .find(|(g, _)| *g as u64 == group)
            .map(|(_, p)| p)
            .expect("allocated group");
        let geometry = match profile {
            GroupProfile::Metadata => self.array.metadata_geometry(),
            _ => self.array.data_geometry(),
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
        let sb = self.array.superblock();
        self.array
            .groups()
            .into_iter()
            .map(|(g, _)| (sb.data_offset + g as u64 * sb.group_size, sb.group_size))
            .collect()
    }

    fn checksum_errors(&self) -> Vec<u64> {
        self.array
            .status()
            .members
            .iter()
            .map(|m| m.checksum_errors)
            .collect()
    }

    /// The array's own check (parity / mirror consistency): mismatched bytes.
    fn array_check(&self, repair: bool) -> u64 {
        self.array.start_check(repair).expect("start check");
        self.array.wait_background();
        let result = self.array.last_sync_result().expect("check result");
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
    let targets = [(0usize, 0u64), (1, 10 * BLOCK), (1, 30 * BLOCK), (1, 200 * BLOCK)];
    let mut expected = vec![0u64; 4];
    let mut damaged = Vec::new();
    for &(f, off) in &targets {
        let ino = rig.ino(&files[f].0);
        let (slot, at) = rig.copies(rig.block_addr(ino, off))[0];
        expected[slot] += 1;
        damaged.push((slot, at, files[f].1[off as usize..(off + BLOCK) as usize].to_vec()));
    }
    let header_copy = rig.copies(0)[0];
    expected[header_copy.0] += 1;
    let parity_of = {
        let ino = rig.ino("f2");
        let addr = rig.block_addr(ino, 2 * BLOCK);
        let g = rig.array.data_geometry();
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
    let status = rig.array.status();
    assert!(status.members.iter().all(|m| m.state == "active" && m.read_errors == 0));
    for (slot, at, good) in &damaged {
        assert_eq!(&raw(&rig.members[*slot], *at, BLOCK as usize), good, "healed in place");
    }
    // Reads healed the data; the parity block is the array check's business.
    let scrub = rig.fs.scrub(true).expect("scrub");
    assert!(scrub.is_clean(), "{scrub:?}");
    assert!(scrub.data_bytes >= files.iter().map(|f| f.1.len() as u64).sum::<u64>());
    assert!(rig.array_check(true) > 0, "the flipped parity is found");
    assert_eq!(rig.array_check(false), 0);
    let again = rig.fs.scrub(false).expect("scrub");
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
        flip(&members[slot], at + rng.gen_range(0..BLOCK - 8), rng.gen_range(1..8));
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
        let scrub = rig.fs.scrub(true).expect("scrub");
        assert!(scrub.lost.is_empty(), "{level:?}: {scrub:?}");
        rig.array_check(true);
        let again = rig.fs.scrub(false).expect("scrub");
        assert!(again.is_clean(), "{level:?}: {again:?}");
        assert_eq!(rig.array_check(false), 0, "{level:?}");
        for (slot, errors) in rig.checksum_errors().into_iter().enumerate() {
            if errors > 0 {
                assert!(flipped.contains_key(&slot), "{level:?}: slot {slot} blamed wrongly");
            }
        }
        for (name, data) in &files {
            assert!(&rig.read_all(rig.ino(name)).expect("read") == data, "{level:?}");
        }
    }
}

#[test]
fn probe_array_check_on_clean_raid5() {
    let mut rng = StdRng::seed_from_u64(9);
    let rig = build(Level::Raid5, 4, 16 << 10, 1);
    let data = random_bytes(&mut rng, 100_000);
    let ino = rig.write_file("f", &data);
    rig.fs.sync_all().unwrap();
    let rig = Rig::start(rig.stop());
    assert!(rig.fs.scrub(false).unwrap().is_clean());
    let m = rig.array_check(false);
    eprintln!("check mismatches {m}");
    let ino2 = rig.ino("f");
    let _ = ino;
    assert_eq!(rig.read_all(ino2).unwrap(), data);
    let m = rig.array_check(true);
    eprintln!("repair mismatches {m}");
    let s = rig.fs.scrub(false).unwrap();
    assert!(s.is_clean(), "{s:?}");
}

#[test]
fn probe_raw_array_check() {
    let mut rng = StdRng::seed_from_u64(9);
    let members: Vec<FaultyMember> = (0..4)
        .map(|i| FaultyMember::memory(MEMBER_SIZE, &format!("mem{i}")).expect("memory member"))
        .collect();
    let spec = CreateSpec { level: Level::Raid5, layout: Layout::LeftSymmetric, chunk: 16 << 10, copies: 1, name: "x".into() };
    let array = Arc::new(create(as_members(&members), &spec).expect("create array"));
    array.start_background();
    let g0 = array.allocate_group(GroupProfile::Metadata).unwrap();
    let g = array.allocate_group(GroupProfile::Data).unwrap();
    eprintln!("groups {g0} {g}");
    let data = random_bytes(&mut rng, 100 * 1024);
    array.write((g as u64) << GROUP_SHIFT, &data).unwrap();
    let sb = array.superblock();
    let geo = array.data_geometry();
    for stripe in 0..3u64 {
        let sm = geo.stripe_members(stripe);
        let base = sb.data_offset + g as u64 * sb.group_size + stripe * (16 << 10);
        let chunks: Vec<Vec<u8>> = (0..4).map(|m| raw(&members[m], base, 16 << 10)).collect();
        let mut x = vec![0u8; 16 << 10];
        for c in &chunks { for (a, b) in x.iter_mut().zip(c) { *a ^= b; } }
        eprintln!("stripe {stripe}: {:?} xor-zero={}", sm, x.iter().all(|b| *b == 0));
        for (i, &m) in sm.data.iter().enumerate() {
            let off = stripe as usize * 48 * 1024 + i * 16 * 1024;
            if off < data.len() {
                let end = (off + 16 * 1024).min(data.len());
                eprintln!("  data {i} on {m}: matches={}", chunks[m][..end - off] == data[off..end]);
            }
        }
    }
    array.start_check(false).unwrap();
    array.wait_background();
    eprintln!("{:?}", array.last_sync_result());
}
