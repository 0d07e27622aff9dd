//! Engine tests on in-memory, fault-injecting members: random reads and
//! writes from several threads checked against a reference buffer while
//! members fail at random points, for every level.

mod common;

use common::members::{crash_images, named, read_after_crash};
use raidfs::array::{assemble, create, Array, AssembleOptions, CreateSpec, GROUP_SHIFT};
use raidfs::geometry::{Layout, Level};
use raidfs::member::faulty::FaultyMember;
use raidfs::member::Member;
use raidfs::superblock::{CopyState, GroupProfile, Superblock, SB_OFFSETS};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

const MEMBER_SIZE: u64 = 64 << 20;

fn faulty_members(n: usize) -> Vec<FaultyMember> {
    common::members::faulty(n, MEMBER_SIZE, "mem")
}

struct Config {
    level: Level,
    members: usize,
    chunk: u64,
    layout: Layout,
    copies: usize,
}

impl Config {
    /// A left-symmetric configuration (the layout only parity levels use).
    fn new(level: Level, members: usize, chunk: u64, copies: usize) -> Config {
        Config {
            level,
            members,
            chunk,
            layout: Layout::LeftSymmetric,
            copies,
        }
    }
}

fn configs() -> Vec<Config> {
    let c = |level, members, chunk, layout, copies| Config {
        level,
        members,
        chunk,
        layout,
        copies,
    };
    vec![
        c(Level::Raid0, 3, 16 << 10, Layout::LeftSymmetric, 1),
        c(Level::Raid1, 2, 64 << 10, Layout::LeftSymmetric, 2),
        c(Level::Raid1, 3, 64 << 10, Layout::LeftSymmetric, 3),
        c(Level::Raid5, 3, 16 << 10, Layout::LeftSymmetric, 1),
        c(Level::Raid5, 4, 64 << 10, Layout::LeftSymmetric, 1),
        c(Level::Raid5, 5, 8 << 10, Layout::RightAsymmetric, 1),
        c(Level::Raid5, 4, 16 << 10, Layout::LeftAsymmetric, 1),
        c(Level::Raid5, 4, 16 << 10, Layout::RightSymmetric, 1),
        c(Level::Raid6, 4, 16 << 10, Layout::LeftSymmetric, 1),
        c(Level::Raid6, 6, 32 << 10, Layout::LeftSymmetric, 1),
        c(Level::Raid10, 4, 16 << 10, Layout::LeftSymmetric, 2),
        c(Level::Raid10, 3, 16 << 10, Layout::LeftSymmetric, 2),
    ]
}

fn make_array(cfg: &Config, ms: &[FaultyMember]) -> Array {
    let spec = CreateSpec {
        level: cfg.level,
        layout: cfg.layout,
        chunk: cfg.chunk,
        copies: cfg.copies,
        name: "t".into(),
        ppl: false,
    };
    create(named(ms), &spec).expect("create")
}

/// Allocate a data group; its first logical address.
fn new_data_group(array: &Array) -> u64 {
    let group = array
        .allocate_group(GroupProfile::Data)
        .expect("data group");
    (group as u64) << GROUP_SHIFT
}

/// An array with its background work running and one data group
/// allocated; the group's first logical address.
fn running_with_data_group(cfg: &Config, ms: &[FaultyMember]) -> (Arc<Array>, u64) {
    let array = Arc::new(make_array(cfg, ms));
    array.start_background();
    let addr = new_data_group(&array);
    (array, addr)
}

/// A running left-symmetric parity array of `members` in-memory members,
/// with a data group; its members and the group's first address.
fn running_parity_array(
    level: Level,
    members: usize,
    chunk: u64,
) -> (Vec<FaultyMember>, Arc<Array>, u64) {
    let cfg = Config::new(level, members, chunk, 1);
    let ms = faulty_members(members);
    let (array, base) = running_with_data_group(&cfg, &ms);
    (ms, array, base)
}

/// Bytes of the data group the test uses (kept small so each config is quick).
const SPAN: usize = 3 << 20;
const THREADS: usize = 3;

fn run_config(cfg: &Config, seed: u64) {
    let ms = faulty_members(cfg.members);
    let array = Arc::new(make_array(cfg, &ms));
    let group = array
        .allocate_group(GroupProfile::Data)
        .expect("allocate data group");
    let base = (group as u64) << GROUP_SHIFT;
    let tolerance = array.data_geometry().tolerance();
    let failures = Arc::new(AtomicUsize::new(0));
    // Threads own disjoint, deliberately unaligned slices, so stripes are shared
    // between threads and stripe locking is exercised.
    let slice = SPAN / THREADS;
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let array = Arc::clone(&array);
            let ms = ms.clone();
            let failures = Arc::clone(&failures);
            std::thread::spawn(move || {
                let mut rng = StdRng::seed_from_u64(seed * 31 + t as u64);
                let start = t * slice;
                let mut reference = vec![0u8; slice];
                let fail_at = rng.gen_range(10..60);
                for op in 0..120 {
                    if op == fail_at {
                        // Fail one member if the level still tolerates it.
                        if failures.fetch_add(1, Ordering::SeqCst) < tolerance {
                            let victim = rng.gen_range(0..ms.len());
                            if !ms[victim].is_pulled() {
                                ms[victim].pull();
                            }
                        } else {
                            failures.fetch_sub(1, Ordering::SeqCst);
                        }
                    }
                    let off = rng.gen_range(0..slice - 1);
                    let len = rng.gen_range(1..=(slice - off).min(300_000));
                    let addr = base + (start + off) as u64;
                    if rng.gen_bool(0.6) {
                        let data: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
                        array
                            .write(addr, &data)
                            .unwrap_or_else(|e| panic!("write {addr:#x}+{len}: {e}"));
                        reference[off..off + len].copy_from_slice(&data);
                    } else {
                        let mut buf = vec![0u8; len];
                        array
                            .read(addr, &mut buf)
                            .unwrap_or_else(|e| panic!("read {addr:#x}+{len}: {e}"));
                        assert!(
                            buf == reference[off..off + len],
                            "thread {t} read mismatch at {off}+{len}"
                        );
                    }
                }
                reference
            })
        })
        .collect();
    let mut expected = Vec::with_capacity(SPAN);
    for h in handles {
        expected.extend(h.join().expect("worker thread panicked"));
    }
    let mut all = vec![0u8; expected.len()];
    array.read(base, &mut all).expect("final read");
    assert!(
        all == expected,
        "{:?} x{}: final contents differ",
        cfg.level,
        cfg.members
    );
    array.flush().expect("flush");

    // Reassemble from the surviving members: same bytes, failed ones named missing.
    let pulled: Vec<usize> = (0..ms.len()).filter(|&i| ms[i].is_pulled()).collect();
    assert!(pulled.len() <= tolerance);
    drop(array);
    let survivors: Vec<(Arc<dyn Member>, String)> = named(&ms)
        .into_iter()
        .enumerate()
        .filter(|(i, _)| !pulled.contains(i))
        .map(|(_, m)| m)
        .collect();
    let array = assemble(survivors, AssembleOptions::default())
        .expect("reassemble degraded")
        .array;
    assert_eq!(array.failed_slots(), pulled);
    let mut again = vec![0u8; expected.len()];
    array.read(base, &mut again).expect("read after reassembly");
    assert!(
        again == expected,
        "{:?} x{}: contents differ after reassembly",
        cfg.level,
        cfg.members
    );
}

#[test]
fn random_io_with_member_failures_every_level() {
    for (i, cfg) in configs().iter().enumerate() {
        run_config(cfg, 1000 + i as u64);
    }
}

#[test]
fn raid6_survives_every_pair_of_failures() {
    let cfg = Config::new(Level::Raid6, 5, 8 << 10, 1);
    let mut rng = StdRng::seed_from_u64(7);
    let data: Vec<u8> = (0..(400 << 10)).map(|_| rng.gen()).collect();
    for a in 0..cfg.members {
        for b in a + 1..cfg.members {
            let ms = faulty_members(cfg.members);
            let array = make_array(&cfg, &ms);
            let addr = new_data_group(&array) + 12345;
            array.write(addr, &data).expect("write");
            ms[a].pull();
            ms[b].pull();
            let mut buf = vec![0u8; data.len()];
            array.read(addr, &mut buf).expect("degraded read");
            assert!(buf == data, "pair ({a},{b}) mismatch");
            // Degraded writes keep working and read back.
            array
                .write(addr + 777, &data[..50_000])
                .expect("degraded write");
            let mut small = vec![0u8; 50_000];
            array.read(addr + 777, &mut small).expect("read back");
            assert!(small == data[..50_000]);
        }
    }
}

#[test]
fn past_tolerance_writes_are_refused_and_data_stays() {
    let cfg = Config::new(Level::Raid5, 4, 16 << 10, 1);
    let ms = faulty_members(4);
    let array = make_array(&cfg, &ms);
    let addr = new_data_group(&array);
    let data = vec![0x5au8; 256 << 10];
    array.write(addr, &data).expect("write");
    ms[1].pull();
    array
        .write(addr, &data)
        .expect("degraded write (member 1 detected as failed)");
    assert_eq!(array.failed_slots(), vec![1]);
    ms[2].pull();
    let err = array
        .write(addr, &[1u8; 4096])
        .expect_err("write past tolerance must fail");
    // A failure the array cannot survive is not recorded: the array stops
    // writing (suspended) and the superblocks keep one failed member.
    assert!(err.to_string().contains("suspended"), "{err}");
    assert_eq!(array.failed_slots(), vec![1]);
    assert!(array.suspension().is_some());
    // Chunks on surviving members still read back unchanged.
    let geometry = array.data_geometry();
    for off in (0..data.len() as u64).step_by(4096) {
        let t = geometry.map(off).targets[0].member;
        if t == 0 || t == 3 {
            let mut b = vec![0u8; 4096];
            array
                .read(addr + off, &mut b)
                .expect("read on a surviving member");
            assert!(b.iter().all(|&x| x == 0x5a));
        }
    }
}

#[test]
fn failed_member_is_stale_at_next_assembly() {
    let cfg = Config::new(Level::Raid1, 3, 64 << 10, 3);
    let ms = faulty_members(3);
    let array = make_array(&cfg, &ms);
    let addr = new_data_group(&array);
    ms[1].fail_writes_after(0);
    array
        .write(addr, &[7u8; 8192])
        .expect("write with one failing copy");
    assert_eq!(array.failed_slots(), vec![1]);
    drop(array);
    ms[1].heal();
    // All three given: the failed one has an older event count and is left out.
    let array = assemble(named(&ms), AssembleOptions::default())
        .expect("assemble")
        .array;
    assert_eq!(array.failed_slots(), vec![1]);
    let mut b = vec![0u8; 8192];
    array.read(addr, &mut b).expect("read");
    assert!(b.iter().all(|&x| x == 7));
}

/// Set member `m`'s superblock event count `behind` below what it is.
fn set_events_behind(m: &FaultyMember, behind: u64) {
    let (mut sb, _) = Superblock::read_from(m).expect("superblock");
    sb.events -= behind;
    sb.write_to(m).expect("write superblock");
}

#[test]
fn a_member_one_event_behind_is_taken_in_and_two_behind_is_stale() {
    // A kill while the superblocks are written one member after another
    // leaves some one event behind: mdadm's event margin takes them in.
    let cfg = Config::new(Level::Raid5, 3, 16 << 10, 1);
    let ms = faulty_members(3);
    let array = make_array(&cfg, &ms);
    let addr = new_data_group(&array);
    array.write(addr, &[9u8; 65536]).expect("write");
    array.flush().expect("flush");
    drop(array);

    set_events_behind(&ms[0], 1);
    let array = assemble(named(&ms), AssembleOptions::default())
        .expect("assemble")
        .array;
    assert!(
        array.failed_slots().is_empty(),
        "{:?}",
        array.failed_slots()
    );
    let mut b = vec![0u8; 65536];
    array.read(addr, &mut b).expect("read");
    assert!(b.iter().all(|&x| x == 9));
    drop(array);
    let events: Vec<u64> = ms
        .iter()
        .map(|m| Superblock::read_from(m).expect("superblock").0.events)
        .collect();
    assert!(
        events.iter().all(|&e| e == events[0]),
        "brought up to date: {events:?}"
    );

    set_events_behind(&ms[0], 2);
    let array = assemble(named(&ms), AssembleOptions::default())
        .expect("assemble")
        .array;
    assert_eq!(array.failed_slots(), vec![0], "two behind: stale");
}

/// What each of a member's four superblock copies holds.
fn copy_states(m: &dyn Member) -> [CopyState; 4] {
    Superblock::read_from(m).expect("superblock").1.copies
}

#[test]
fn a_member_with_its_front_mib_zeroed_assembles_and_is_healed() {
    let cfg = Config::new(Level::Raid5, 3, 16 << 10, 1);
    let ms = faulty_members(3);
    let array = make_array(&cfg, &ms);
    let addr = new_data_group(&array);
    array.write(addr, &[5u8; 65536]).expect("write");
    array.mark_clean().expect("clean");
    let data_offset = array.superblock().data_offset;
    drop(array);
    assert_eq!(copy_states(&ms[1]), [CopyState::Good; 4]);

    // Superblock front copies, bitmap and PPL areas: all gone on member 1.
    ms[1]
        .write_at(&vec![0u8; data_offset as usize], 0)
        .expect("zero the front");
    assert_eq!(
        copy_states(&ms[1]),
        [
            CopyState::Missing,
            CopyState::Missing,
            CopyState::Good,
            CopyState::Good
        ]
    );
    let array = assemble(named(&ms), AssembleOptions::default())
        .expect("assemble")
        .array;
    assert!(!array.is_degraded(), "{:?}", array.failed_slots());
    let mut b = vec![0u8; 65536];
    array.read(addr, &mut b).expect("read");
    assert!(b.iter().all(|&x| x == 5));
    assert_eq!(
        copy_states(&ms[1]),
        [CopyState::Good; 4],
        "assembly rewrote every copy"
    );
    // The bitmap header comes back with the first bits written.
    let mut magic = [0u8; 8];
    ms[1].read_at(&mut magic, 64 << 10).expect("read bitmap");
    assert_eq!(magic, [0; 8], "not yet");
    let other = new_data_group(&array);
    array.write(other, &[6u8; 4096]).expect("write");
    for m in &ms {
        m.read_at(&mut magic, 64 << 10).expect("read bitmap");
        assert_eq!(&magic, b"RAIDBMP1", "{}", m.name());
    }
    array.mark_clean().expect("clean");
    drop(array);
    let events: Vec<u64> = ms
        .iter()
        .map(|m| Superblock::read_from(m).expect("superblock").0.events)
        .collect();
    assert!(events.iter().all(|&e| e == events[0]), "{events:?}");
}

#[test]
fn a_read_only_assembly_leaves_a_damaged_copy_alone() {
    let cfg = Config::new(Level::Raid5, 3, 16 << 10, 1);
    let ms = faulty_members(3);
    drop(make_array(&cfg, &ms));
    let end = ms[2].len() / 4096 * 4096;
    ms[2]
        .write_at(&[0xAA], end - 4096 + 100)
        .expect("damage end copy 1");
    let read_only = AssembleOptions {
        read_only: true,
        ..Default::default()
    };
    let array = assemble(named(&ms), read_only).expect("assemble").array;
    assert!(!array.is_degraded());
    drop(array);
    assert_eq!(copy_states(&ms[2])[3], CopyState::BadChecksum);
    drop(
        assemble(named(&ms), AssembleOptions::default())
            .expect("assemble")
            .array,
    );
    assert_eq!(copy_states(&ms[2]), [CopyState::Good; 4]);
}

#[test]
fn an_array_of_version_1_members_assembles_and_stays_version_1() {
    let cfg = Config::new(Level::Raid5, 3, 16 << 10, 1);
    let ms = faulty_members(3);
    let array = make_array(&cfg, &ms);
    let addr = new_data_group(&array);
    array.write(addr, &[8u8; 65536]).expect("write");
    array.mark_clean().expect("clean");
    drop(array);
    // Rewrite every member as an older release left it: version 1, front
    // copies only, the data area running to the member's end (the part
    // past the last whole group is unused), and array data at the end.
    let tail = vec![0x5Au8; 8192];
    for m in &ms {
        let (mut sb, _) = Superblock::read_from(m).expect("superblock");
        sb.version = 1;
        sb.data_size = m.len() - sb.data_offset;
        let groups = sb.groups.len() as u64;
        assert_eq!(sb.data_size / sb.group_size, groups, "same groups");
        m.write_at(&tail, m.len() - 8192).expect("tail");
        for offset in SB_OFFSETS {
            m.write_at(&sb.encode(), offset).expect("v1 copy");
        }
        assert_eq!(
            copy_states(m),
            [
                CopyState::Good,
                CopyState::Good,
                CopyState::NotPresent,
                CopyState::NotPresent
            ]
        );
    }
    let array = assemble(named(&ms), AssembleOptions::default())
        .expect("assemble v1")
        .array;
    assert!(!array.is_degraded());
    let mut b = vec![0u8; 65536];
    array.read(addr, &mut b).expect("read");
    assert!(b.iter().all(|&x| x == 8));
    array.mark_dirty().expect("dirty");
    array.write(addr, &[9u8; 4096]).expect("write");
    array.mark_clean().expect("clean");
    drop(array);
    for m in &ms {
        let (sb, _) = Superblock::read_from(m).expect("superblock");
        assert_eq!(sb.version, 1, "kept at version 1");
        let mut back = vec![0u8; 8192];
        m.read_at(&mut back, m.len() - 8192).expect("tail");
        assert_eq!(back, tail, "nothing written over the v1 data area's end");
    }
}

#[test]
fn assembly_rules() {
    let cfg = Config::new(Level::Raid5, 3, 16 << 10, 1);
    let a = faulty_members(3);
    let b = faulty_members(3);
    drop(make_array(&cfg, &a));
    drop(make_array(&cfg, &b));
    // Members of two arrays.
    let mixed = vec![
        named(&a).remove(0),
        named(&a).remove(1),
        named(&b).remove(2),
    ];
    let err = assemble(mixed, AssembleOptions::default())
        .err()
        .expect("mixed arrays refused");
    assert!(err.to_string().contains("different arrays"), "{err}");
    // Too few members.
    let one = vec![named(&a).remove(0)];
    let err = assemble(one, AssembleOptions::default())
        .err()
        .expect("too few refused");
    assert!(err.to_string().contains("too few"), "{err}");
    // Dirty and degraded parity array needs force.
    let array = assemble(named(&a), AssembleOptions::default())
        .expect("assemble")
        .array;
    array.mark_dirty().expect("dirty");
    drop(array);
    let two: Vec<_> = named(&a).into_iter().take(2).collect();
    let err = assemble(two.clone(), AssembleOptions::default())
        .err()
        .expect("dirty degraded refused");
    assert!(err.to_string().contains("--force"), "{err}");
    let forced = assemble(
        two,
        AssembleOptions {
            force: true,
            ..Default::default()
        },
    )
    .expect("forced")
    .array;
    assert!(forced.is_degraded());
}

#[test]
fn verified_read_repairs_a_bad_mirror_copy() {
    let cfg = Config::new(Level::Raid1, 2, 64 << 10, 2);
    let ms = faulty_members(2);
    let array = make_array(&cfg, &ms);
    let g = array.allocate_group(GroupProfile::Metadata).expect("group");
    let addr = (g as u64) << GROUP_SHIFT;
    let good = vec![3u8; 4096];
    array.write(addr, &good).expect("write");
    // Corrupt copy 0 behind the array's back.
    let sb = array.superblock();
    let member_off = sb.data_offset + g as u64 * sb.group_size;
    ms[0].write_at(&[9u8; 4096], member_off).expect("corrupt");
    let mut buf = vec![0u8; 4096];
    let verify = |b: &[u8]| b.iter().all(|&x| x == 3);
    array
        .read_verified(addr, &mut buf, &verify)
        .expect("verified read");
    assert!(verify(&buf));
    let mut raw = vec![0u8; 4096];
    ms[0].read_at(&mut raw, member_off).expect("raw read");
    assert!(verify(&raw), "bad copy was rewritten");
}

/// A flush syncs exactly the members written since their last sync, and
/// what it returns for is in every member's crash image.
#[test]
fn flush_syncs_only_members_written_since_their_last_sync() {
    let cfg = Config::new(Level::Raid10, 4, 64 << 10, 2);
    let ms = faulty_members(cfg.members);
    let array = make_array(&cfg, &ms);
    let group = array
        .allocate_group(GroupProfile::Data)
        .expect("data group");
    let base = (group as u64) << GROUP_SHIFT;
    array.flush().expect("first flush");
    let syncs = |ms: &[FaultyMember]| -> Vec<u64> { ms.iter().map(|m| m.counts().syncs).collect() };
    ms.iter().for_each(|m| m.reset_counts());

    array.flush().expect("idle flush");
    assert_eq!(syncs(&ms), vec![0; 4], "nothing written, nothing synced");

    // The first write to a region marks it in the bitmap on every member
    // (written and synced before the data); the flush then has nothing
    // left to sync but the data.
    let data: Vec<u8> = (0..4096u32).map(|i| (i * 7 + 3) as u8).collect();
    array.write(base, &[1u8; 4096]).expect("first write");
    assert_eq!(syncs(&ms), vec![1; 4], "the bitmap block synced everywhere");
    array.flush().expect("flush after first write");
    ms.iter().for_each(|m| m.reset_counts());

    // One chunk on RAID10 x2 lands on two of the four members.
    array.write(base, &data).expect("write");
    assert_eq!(syncs(&ms), vec![0; 4], "region already marked");
    array.flush().expect("flush after write");
    let after = syncs(&ms);
    assert_eq!(after.iter().sum::<u64>(), 2, "two copies synced: {after:?}");
    let written: Vec<usize> = (0..4).filter(|&i| ms[i].counts().writes > 0).collect();
    let synced: Vec<usize> = (0..4).filter(|&i| after[i] > 0).collect();
    assert_eq!(written, synced);

    // What the flush returned for survives a power cut on every member.
    let images = crash_images(&ms, &[]);
    drop(array);
    let array = assemble(images, AssembleOptions::default())
        .expect("assemble crash image")
        .array;
    let mut back = vec![0u8; data.len()];
    array.read(base, &mut back).expect("read back");
    assert!(back == data, "flushed data lost in the crash image");
}

/// Requests spanning many stripes (whole ones in the middle, partial ends)
/// leave consistent parity: a check finds no mismatch, and with any one
/// (RAID5) or two (RAID6) members pulled every byte reads back.
#[test]
fn multi_stripe_writes_leave_consistent_parity() {
    for (level, members, chunk) in [(Level::Raid5, 5, 16 << 10), (Level::Raid6, 6, 8 << 10)] {
        let (ms, array, base) = running_parity_array(level, members, chunk);
        let mut rng = StdRng::seed_from_u64(members as u64);
        let mut reference = vec![0u8; 2 << 20];
        for _ in 0..12 {
            let off = rng.gen_range(0..reference.len() / 2);
            let len = rng.gen_range(1..reference.len() - off);
            let data: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
            array.write(base + off as u64, &data).expect("write");
            reference[off..off + len].copy_from_slice(&data);
        }
        array.start_check(false).expect("check");
        array.wait_background();
        let check = array.last_sync_result().expect("check result");
        assert!(check.completed, "{level:?}: {check:?}");
        assert_eq!(check.mismatches, 0, "{level:?}: parity disagrees");

        let tolerance = array.data_geometry().tolerance();
        array.flush().expect("flush");
        drop(array);
        for first in 0..members {
            let mut pulled: Vec<usize> = (first..first + tolerance).map(|m| m % members).collect();
            pulled.sort_unstable();
            let back = read_after_crash(&ms, &pulled, base, reference.len());
            assert!(
                back == reference,
                "{level:?}: wrong data without {pulled:?}"
            );
        }
    }
}

/// A read across stripes asks each member once for every run of its data
/// chunks that lie one after another on it, although they are a stripe
/// apart in the caller's buffer, and every byte lands in its place.
#[test]
fn a_striped_read_asks_each_member_once_per_run_of_its_chunks() {
    const CHUNK: u64 = 64 << 10;
    let (ms, array, base) = running_parity_array(Level::Raid5, 5, CHUNK);
    let stripe = 4 * CHUNK as usize;
    let data: Vec<u8> = (0..4 * stripe).map(|i| (i * 31 / 7) as u8).collect();
    array.write(base, &data).expect("write");
    array.flush().expect("flush");
    ms.iter().for_each(|m| m.reset_counts());

    let mut back = vec![0u8; data.len()];
    array.read(base, &mut back).expect("read");
    assert!(back == data, "four stripes read back wrong");
    // Left-symmetric parity of stripes 0..3 lies on members 4, 3, 2, 1:
    // member 0 holds data in all four, 4 in the last three, 1 in the first
    // three (one run each); 2 and 3 have their parity chunk between data
    // chunks (two runs each). Chunk by chunk it was sixteen reads.
    let reads: Vec<u64> = ms.iter().map(|m| m.counts().reads).collect();
    assert_eq!(reads, vec![1, 1, 2, 2, 1]);

    // A read starting and ending inside chunks scatters the same way.
    ms.iter().for_each(|m| m.reset_counts());
    let (from, to) = (CHUNK as usize / 2 + 100, 3 * stripe + 5000);
    let mut part = vec![0u8; to - from];
    array
        .read(base + from as u64, &mut part)
        .expect("read part");
    assert!(part[..] == data[from..to], "unaligned span read back wrong");
    let reads: Vec<u64> = ms.iter().map(|m| m.counts().reads).collect();
    assert_eq!(reads.iter().sum::<u64>(), 7, "{reads:?}");
}

/// With members missing, what a member can still serve comes from its runs
/// (on RAID6 4+2 without two members, one member's chunks may be all that
/// is read directly, a stripe apart in the buffer), the rest from parity.
#[test]
fn a_degraded_striped_read_scatters_the_runs_it_has() {
    const CHUNK: u64 = 16 << 10;
    let (ms, array, base) = running_parity_array(Level::Raid6, 4, CHUNK);
    let data: Vec<u8> = (0..8 * 2 * CHUNK as usize)
        .map(|i| (i * 13 / 5) as u8)
        .collect();
    array.write(base, &data).expect("write");
    array.flush().expect("flush");
    drop(array);
    for a in 0..4 {
        for b in a + 1..4 {
            let back = read_after_crash(&ms, &[a, b], base, data.len());
            assert!(back == data, "wrong data without members {a} and {b}");
            // Windows of two stripes, where one member may hold every
            // chunk still readable in place.
            let degraded = assemble(crash_images(&ms, &[a, b]), AssembleOptions::default())
                .expect("assemble")
                .array;
            for first in 0..6 {
                let (from, len) = (first * CHUNK as usize, 4 * CHUNK as usize);
                let mut window = vec![0u8; len];
                degraded
                    .read(base + from as u64, &mut window)
                    .expect("degraded read");
                assert!(
                    window[..] == data[from..from + len],
                    "wrong window at chunk {first} without members {a} and {b}"
                );
            }
        }
    }
}

#[test]
fn write_back_full_stripes_read_back_at_once_and_report_failures_at_flush() {
    write_back_reads_back_at_once_and_reports_failures_at_flush(Config::new(
        Level::Raid5,
        5,
        64 << 10,
        1,
    ));
}

/// Large mirror writes are answered once queued on every copy's worker,
/// as full stripes are.
#[test]
fn write_back_mirror_writes_read_back_at_once_and_report_failures_at_flush() {
    write_back_reads_back_at_once_and_reports_failures_at_flush(Config::new(
        Level::Raid1,
        2,
        64 << 10,
        2,
    ));
    write_back_reads_back_at_once_and_reports_failures_at_flush(Config::new(
        Level::Raid10,
        4,
        64 << 10,
        2,
    ));
}

/// 1 MiB writes on `cfg` (members with cached writes, so they are answered
/// before they land): a read waits for the write it follows, a member whose
/// write fails is failed, and the loss of the array reaches the caller.
fn write_back_reads_back_at_once_and_reports_failures_at_flush(cfg: Config) {
    let ms = faulty_members(cfg.members);
    ms.iter().for_each(|m| m.set_cached_writes(true));
    let (array, base) = running_with_data_group(&cfg, &ms);
    let mib = 1usize << 20;
    let mut rng = StdRng::seed_from_u64(77);
    let mut reference = vec![0u8; 4 * mib];
    let fresh = |rng: &mut StdRng| -> Vec<u8> { (0..mib).map(|_| rng.gen()).collect() };

    // A write returns while a member still holds its data back, and a read
    // of those stripes waits for it instead of returning old bytes.
    ms[1].hold_writes();
    let data = fresh(&mut rng);
    array.write(base, &data).expect("write-back write");
    reference[..mib].copy_from_slice(&data);
    let (tx, rx) = crossbeam_channel::bounded(1);
    let reader = {
        let array = Arc::clone(&array);
        std::thread::spawn(move || {
            let mut back = vec![0u8; mib];
            array.read(base, &mut back).expect("read");
            let _ = tx.send(back);
        })
    };
    assert!(
        rx.recv_timeout(std::time::Duration::from_millis(300))
            .is_err(),
        "a read of stripes in flight returned before their write"
    );
    ms[1].release_writes();
    assert!(rx.recv().expect("read result") == data, "read old bytes");
    reader.join().unwrap();

    // Many writes over the same stripes, each read back at once.
    for round in 0..16 {
        let at = (round % 4) * mib;
        let data = fresh(&mut rng);
        array.write(base + at as u64, &data).expect("write");
        reference[at..at + mib].copy_from_slice(&data);
        let mut back = vec![0u8; mib];
        array.read(base + at as u64, &mut back).expect("read");
        assert!(back == data, "round {round}");
    }

    // A member whose write fails is failed by the reaper; the flush succeeds
    // and the data is all there, degraded.
    ms[1].fail_writes_after(0);
    let data = fresh(&mut rng);
    array
        .write(base, &data)
        .expect("write with a failing member");
    reference[..mib].copy_from_slice(&data);
    array.flush().expect("flush with one member lost");
    assert_eq!(array.failed_slots(), vec![1], "{:?}", cfg.level);
    let mut back = vec![0u8; reference.len()];
    array.read(base, &mut back).expect("degraded read");
    assert!(back == reference, "{:?}", cfg.level);

    // Losing the member that holds the rest of some data breaks the
    // array: the error reaches the caller.
    ms[0].fail_writes_after(0);
    let outcome = array
        .write(base + mib as u64, &fresh(&mut rng))
        .and_then(|()| array.flush());
    assert!(
        outcome.is_err(),
        "writes lost on two members went unreported"
    );
}

/// Aligned writes smaller than a stripe: gathered in the stripe cache, so
/// a sequential run of them reads nothing back from the members; reads see
/// them at once; a flush makes them durable with consistent parity.
#[test]
fn stripe_cache_turns_small_sequential_writes_into_full_stripes() {
    for (level, members, chunk) in [(Level::Raid5, 5, 16 << 10), (Level::Raid6, 6, 8 << 10)] {
        let (ms, array, base) = running_parity_array(level, members, chunk);
        let mut rng = StdRng::seed_from_u64(members as u64 + 11);
        let block = 4096;
        let mut reference: Vec<u8> = (0..(1usize << 20)).map(|_| rng.gen()).collect();
        ms.iter().for_each(|m| m.reset_counts());
        for (i, data) in reference.chunks(block).enumerate() {
            array
                .write(base + (i * block) as u64, data)
                .expect("small write");
        }
        let reads: u64 = ms.iter().map(|m| m.counts().reads).sum();
        assert_eq!(
            reads, 0,
            "{level:?}: small sequential writes read old stripes back"
        );

        // A stripe left partly written, then overwritten in part by an
        // unaligned write, which must land after the gathered bytes; both
        // read back at once.
        let tail = reference.len();
        reference.extend((0..3 * block).map(|_| rng.gen::<u8>()));
        array
            .write(base + tail as u64, &reference[tail..])
            .expect("partial stripe");
        let patch: Vec<u8> = (0..1000).map(|_| rng.gen()).collect();
        let at = tail + block - 500;
        array
            .write(base + at as u64, &patch)
            .expect("unaligned write");
        reference[at..at + patch.len()].copy_from_slice(&patch);
        let mut back = vec![0u8; 3 * block];
        array.read(base + tail as u64, &mut back).expect("read");
        assert!(
            back == reference[tail..],
            "{level:?}: gathered bytes not read back"
        );
        let more: Vec<u8> = (0..block).map(|_| rng.gen()).collect();
        array
            .write(base + (tail + 3 * block) as u64, &more)
            .expect("gathered again");
        reference.extend_from_slice(&more);

        ms.iter().for_each(|m| m.set_crash_tracking(true));
        array.flush().expect("flush");
        let mut back = vec![0u8; reference.len()];
        array.read(base, &mut back).expect("read all");
        assert!(back == reference, "{level:?}: wrong data after flush");
        array.start_check(false).expect("check");
        array.wait_background();
        let check = array.last_sync_result().expect("check result");
        assert_eq!(check.mismatches, 0, "{level:?}: parity disagrees");

        // What the flush made durable, read with each member missing.
        for missing in 0..members {
            let back = read_after_crash(&ms, &[missing], base, reference.len());
            assert!(
                back == reference,
                "{level:?}: wrong durable data without member {missing}"
            );
        }
    }
}

/// Threads writing interleaved 4 KiB blocks of the same stripes, each
/// reading its blocks back, while the cache fills, completes and is
/// written out under them.
#[test]
fn stripe_cache_keeps_concurrent_block_writers_apart() {
    let (_ms, array, base) = running_parity_array(Level::Raid5, 4, 16 << 10);
    let block = 4096u64;
    let blocks = 512u64;
    let writers = 3u64;
    let handles: Vec<_> = (0..writers)
        .map(|t| {
            let array = Arc::clone(&array);
            std::thread::spawn(move || {
                let mut rng = StdRng::seed_from_u64(t + 100);
                let mine: Vec<u64> = (0..blocks).filter(|b| b % writers == t).collect();
                let mut latest = std::collections::HashMap::new();
                for round in 0..4 {
                    for &b in &mine {
                        let data = vec![rng.gen::<u8>(); block as usize];
                        array.write(base + b * block, &data).expect("write");
                        latest.insert(b, data[0]);
                        if rng.gen_ratio(1, 8) {
                            let mut back = vec![0u8; block as usize];
                            array.read(base + b * block, &mut back).expect("read");
                            assert!(
                                back.iter().all(|&x| x == data[0]),
                                "round {round} block {b}"
                            );
                        }
                    }
                }
                latest
            })
        })
        .collect();
    let mut latest = std::collections::HashMap::new();
    for h in handles {
        latest.extend(h.join().expect("writer"));
    }
    array.flush().expect("flush");
    for b in 0..blocks {
        let mut back = vec![0u8; block as usize];
        array.read(base + b * block, &mut back).expect("read");
        assert!(back.iter().all(|&x| x == latest[&b]), "block {b}");
    }
    array.start_check(false).expect("check");
    array.wait_background();
    assert_eq!(array.last_sync_result().expect("check").mismatches, 0);
}
