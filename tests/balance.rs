//! Read balancing: the policy's choices on synthetic member state, and whole
//! arrays of virtual-time simulated disks (deterministic: nothing sleeps).

use raidfs::array::balance::Balancer;
use raidfs::array::{
    assemble, create, Array, AssembleOptions, CreateSpec, ReadPolicy, GROUP_SHIFT,
};
use raidfs::geometry::{Level, Target};
use raidfs::member::simulated::{Clock, DiskModel, SimulatedDisk};
use raidfs::member::Member;
use raidfs::superblock::GroupProfile;
use std::sync::Arc;
use std::time::Duration;

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;

/// The copies of one RAID1 piece: every member at the same offset.
fn copies(members: usize, offset: u64) -> Vec<Target> {
    (0..members)
        .map(|member| Target { member, offset })
        .collect()
}

fn none_failed(_: &Target) -> bool {
    true
}

/// Choose a copy for `len` bytes at `offset`, then issue and complete it as the
/// engine does; returns the member used.
fn read(b: &Balancer, members: usize, offset: u64, len: u64) -> usize {
    let targets = copies(members, offset);
    let member = b
        .choose(&targets, 0, len, none_failed)
        .expect("a copy")
        .member;
    b.issue(member, offset, len);
    b.complete(member, Duration::from_millis(5));
    member
}

/// Make `slot` serve an established sequential stream ending at `end`.
fn stream_on(b: &Balancer, slot: usize, end: u64) {
    b.issue(slot, end - 256 * KIB, 128 * KIB);
    b.complete(slot, Duration::from_millis(5));
    b.issue(slot, end - 128 * KIB, 128 * KIB);
    b.complete(slot, Duration::from_millis(5));
}

#[test]
fn continuation_stays_on_its_mirror_even_when_it_is_busy() {
    let b = Balancer::new(3);
    stream_on(&b, 1, 10 * MIB);
    // Busy with a read in flight, while the others are idle.
    b.issue(1, 10 * MIB, 128 * KIB);
    let targets = copies(3, 10 * MIB + 128 * KIB);
    assert_eq!(
        b.choose(&targets, 0, 128 * KIB, none_failed)
            .map(|t| t.member),
        Some(1)
    );
}

#[test]
fn new_stream_goes_to_a_free_idle_mirror() {
    let b = Balancer::new(3);
    stream_on(&b, 0, 10 * MIB);
    // Mirror 0's head is nearest to the new stream, but it serves a stream.
    assert_eq!(read(&b, 3, 20 * MIB, 128 * KIB), 1);
    // Mirror 1 busy: the idle one.
    b.issue(1, 0, 4 * KIB);
    let targets = copies(3, 40 * MIB);
    let chosen = b.choose(&targets, 0, 128 * KIB, none_failed);
    assert_eq!(chosen.map(|t| t.member), Some(2));
}

#[test]
fn a_placed_stream_counts_before_its_read_is_issued() {
    let b = Balancer::new(3);
    // Two streams start together: the second is placed before the first's
    // read reaches the member, and must still take another mirror.
    let first = b
        .choose(&copies(3, 0), 0, 128 * KIB, none_failed)
        .map(|t| t.member);
    let second = b
        .choose(&copies(3, 20 << 30), 0, 128 * KIB, none_failed)
        .map(|t| t.member);
    assert!(
        first.is_some() && second.is_some() && first != second,
        "{first:?} {second:?}"
    );
}

#[test]
fn streams_that_meet_on_one_mirror_part() {
    let b = Balancer::new(3);
    // Both streams established on mirror 0 (as when they raced at the start).
    stream_on(&b, 0, 10 * MIB);
    stream_on(&b, 0, 30 << 30);
    let moved = read(&b, 3, 10 * MIB, 128 * KIB);
    assert_ne!(moved, 0, "one stream leaves the crowded mirror");
    let stayed = read(&b, 3, 30 << 30, 128 * KIB);
    assert_eq!(stayed, 0, "the other keeps it");
    // Both now stay put.
    for i in 1..8u64 {
        assert_eq!(read(&b, 3, 10 * MIB + i * 128 * KIB, 128 * KIB), moved);
        assert_eq!(read(&b, 3, (30 << 30) + i * 128 * KIB, 128 * KIB), 0);
    }
}

#[test]
fn new_stream_goes_to_the_nearest_head_among_equals() {
    let b = Balancer::new(3);
    // Lone reads (not streams) leave heads at 1 GiB, 100 MiB and 10 GiB.
    for (slot, head) in [(0, 1 << 30), (1, 100 * MIB), (2, 10 << 30)] {
        b.issue(slot, head - 4 * KIB, 4 * KIB);
        b.complete(slot, Duration::from_millis(5));
    }
    let pick = |at: u64| {
        b.choose(&copies(3, at), 0, 4 * KIB, none_failed)
            .map(|t| t.member)
    };
    assert_eq!(pick(120 * MIB), Some(1));
    assert_eq!(pick(9 << 30), Some(2));
    assert_eq!(pick(900 * MIB), Some(0));
}

#[test]
fn failed_members_are_never_chosen() {
    let b = Balancer::new(3);
    stream_on(&b, 0, 10 * MIB);
    let targets = copies(3, 10 * MIB);
    let failed0 = |t: &Target| t.member != 0;
    assert_eq!(
        b.choose(&targets, 0, 128 * KIB, failed0).map(|t| t.member),
        Some(1)
    );
    for policy in ReadPolicy::ALL {
        b.set_policy(policy);
        for _ in 0..6 {
            let got = b.choose(&targets, 0, 128 * KIB, failed0).map(|t| t.member);
            assert!(matches!(got, Some(1) | Some(2)), "{policy}: chose {got:?}");
        }
        assert_eq!(
            b.choose(&targets, 0, 128 * KIB, |_: &Target| false),
            None,
            "{policy}: all failed"
        );
    }
}

#[test]
fn write_mostly_members_are_read_only_as_a_last_resort() {
    let b = Balancer::new(2);
    stream_on(&b, 0, 10 * MIB);
    b.set_write_mostly(0, true);
    let targets = copies(2, 10 * MIB);
    for policy in ReadPolicy::ALL {
        b.set_policy(policy);
        for _ in 0..4 {
            assert_eq!(
                b.choose(&targets, 0, 128 * KIB, none_failed)
                    .map(|t| t.member),
                Some(1),
                "{policy}"
            );
        }
        assert_eq!(
            b.choose(&targets, 0, 128 * KIB, |t: &Target| t.member != 1)
                .map(|t| t.member),
            Some(0),
            "{policy}"
        );
    }
}

#[test]
fn solid_state_members_spread_by_pending_reads() {
    let b = Balancer::new(2);
    b.set_rotational(0, false);
    b.set_rotational(1, false);
    stream_on(&b, 0, 10 * MIB);
    let targets = copies(2, 10 * MIB);
    // Equal queues: the stream's member.
    assert_eq!(
        b.choose(&targets, 0, 128 * KIB, none_failed)
            .map(|t| t.member),
        Some(0)
    );
    // Two reads in flight on it: the other member, though it continues there.
    b.issue(0, 50 * MIB, 4 * KIB);
    b.issue(0, 60 * MIB, 4 * KIB);
    assert_eq!(
        b.choose(&targets, 0, 128 * KIB, none_failed)
            .map(|t| t.member),
        Some(1)
    );
    // The same state on rotational members keeps the stream where it is.
    b.set_rotational(0, true);
    b.set_rotational(1, true);
    assert_eq!(
        b.choose(&targets, 0, 128 * KIB, none_failed)
            .map(|t| t.member),
        Some(0)
    );
}

/// Two interleaved sequential streams far apart; returns how often each
/// stream's reads changed member.
fn interleave(policy: ReadPolicy, members: usize) -> [usize; 2] {
    let b = Balancer::new(members);
    b.set_policy(policy);
    let starts = [0, 20 << 30];
    let mut last = [usize::MAX; 2];
    let mut switches = [0; 2];
    for i in 0..64u64 {
        for s in 0..2 {
            let m = read(&b, members, starts[s] + i * 128 * KIB, 128 * KIB);
            if last[s] != usize::MAX && last[s] != m {
                switches[s] += 1;
            }
            last[s] = m;
        }
    }
    switches
}

#[test]
fn sticky_keeps_each_stream_on_one_mirror_and_legacy_bounces_them() {
    assert_eq!(interleave(ReadPolicy::Sticky, 3), [0, 0]);
    assert_eq!(interleave(ReadPolicy::Sticky, 2), [0, 0]);
    let legacy = interleave(ReadPolicy::Legacy, 3);
    assert!(
        legacy.iter().all(|&n| n > 16),
        "legacy should bounce streams, switched {legacy:?}"
    );
}

#[test]
fn round_robin_and_first() {
    let b = Balancer::new(3);
    b.set_policy(ReadPolicy::RoundRobin);
    let used: Vec<usize> = (0..6).map(|i| read(&b, 3, i * 4 * KIB, 4 * KIB)).collect();
    assert_eq!(used, [0, 1, 2, 0, 1, 2]);
    b.set_policy(ReadPolicy::First);
    let used: Vec<usize> = (0..3)
        .map(|i| read(&b, 3, (i + 7) * MIB, 4 * KIB))
        .collect();
    assert_eq!(used, [0, 0, 0]);
}

#[test]
fn stats_count_reads_bytes_seeks_and_pending() {
    let b = Balancer::new(2);
    b.issue(0, 0, 4 * KIB);
    b.issue(0, 4 * KIB, 4 * KIB);
    b.issue(0, MIB, 8 * KIB);
    b.complete(0, Duration::from_micros(800));
    let names = vec!["a".to_string(), "b".to_string()];
    let stats = b.stats(&names);
    assert_eq!(
        (
            stats[0].reads,
            stats[0].bytes,
            stats[0].seeks,
            stats[0].pending
        ),
        (3, 16 * KIB, 1, 2)
    );
    assert_eq!(stats[0].head, MIB + 8 * KIB);
    assert!((stats[0].latency_us - 800.0).abs() < 1.0);
    assert_eq!((stats[1].reads, stats[1].name.as_str()), (0, "b"));
    let json = serde_json::to_string(&stats).expect("stats serialise");
    assert!(json.contains("\"seeks\":1"), "{json}");
}

#[test]
fn policy_names_parse_and_print() {
    for p in ReadPolicy::ALL {
        assert_eq!(p.to_string().parse::<ReadPolicy>(), Ok(p));
    }
    assert_eq!(
        "Round_Robin".parse::<ReadPolicy>(),
        Ok(ReadPolicy::RoundRobin)
    );
    assert_eq!(ReadPolicy::default(), ReadPolicy::Sticky);
    let err = "fastest".parse::<ReadPolicy>().expect_err("unknown name");
    assert!(err.contains("sticky") && err.contains("legacy"), "{err}");
}

#[test]
fn disk_model_costs() {
    let m = DiskModel::default();
    let size = 40 << 30;
    let transfer = m.service_time(0, 0, 128 * KIB, size);
    assert!(
        (transfer.as_secs_f64() - 128.0 / 1024.0 / 27.0).abs() < 1e-6,
        "{transfer:?}"
    );
    let near = m.service_time(0, MIB, 128 * KIB, size);
    let far = m.service_time(0, 30 << 30, 128 * KIB, size);
    assert!(near > transfer + m.rotational_delay() && far > near);
    assert!((m.rotational_delay().as_secs_f64() - 0.0041667).abs() < 1e-4);
    // Average over uniformly random start and end positions: ~8.5 ms.
    let steps = 400u64;
    let mut total = 0.0;
    for i in 0..steps {
        for j in 0..steps {
            total += m
                .seek_time(i.abs_diff(j) * size / steps, size)
                .as_secs_f64();
        }
    }
    let average = total / (steps * steps) as f64;
    assert!((average - 0.0085).abs() < 0.0003, "average seek {average}");
}

fn virtual_disks(n: usize) -> Vec<Arc<SimulatedDisk>> {
    (0..n)
        .map(|i| {
            Arc::new(SimulatedDisk::new(
                format!("sim{i}"),
                4 << 30,
                DiskModel::default(),
                Clock::Virtual,
            ))
        })
        .collect()
}

fn as_members(disks: &[Arc<SimulatedDisk>]) -> Vec<(Arc<dyn Member>, String)> {
    disks
        .iter()
        .map(|d| (Arc::clone(d) as Arc<dyn Member>, d.name()))
        .collect()
}

/// A three-way RAID1 on virtual disks with data in two distant groups.
fn mirror(disks: &[Arc<SimulatedDisk>]) -> (Array, [u64; 2]) {
    let spec = CreateSpec {
        chunk: 64 * KIB,
        name: "t".into(),
        ..CreateSpec::new(Level::Raid1)
    };
    let array = create(as_members(disks), &spec).expect("create");
    let groups: Vec<u32> = (0..20)
        .map(|_| array.allocate_group(GroupProfile::Data).expect("allocate"))
        .collect();
    (
        array,
        [
            (groups[0] as u64) << GROUP_SHIFT,
            (groups[19] as u64) << GROUP_SHIFT,
        ],
    )
}

fn pattern(addr: u64, len: usize) -> Vec<u8> {
    (0..len as u64)
        .map(|i| ((addr + i).wrapping_mul(2654435761) >> 13) as u8)
        .collect()
}

/// Interleave two sequential readers through the array; returns seeks per disk.
fn two_readers(array: &Array, disks: &[Arc<SimulatedDisk>], starts: [u64; 2]) -> Vec<u64> {
    array.reset_member_stats();
    disks.iter().for_each(|d| d.reset(0));
    let request = 128 * KIB as usize;
    let mut buf = vec![0u8; request];
    for i in 0..48u64 {
        for start in starts {
            let addr = start + i * request as u64;
            array.read(addr, &mut buf).expect("read");
            assert!(buf == pattern(addr, request), "wrong data at {addr:#x}");
        }
    }
    disks.iter().map(|d| d.counters().seeks).collect()
}

#[test]
fn arrays_of_simulated_disks_keep_streams_apart() {
    let disks = virtual_disks(3);
    let (array, starts) = mirror(&disks);
    for start in starts {
        array
            .write(start, &pattern(start, 6 * MIB as usize))
            .expect("write");
    }
    assert_eq!(array.read_policy(), ReadPolicy::Sticky);
    let sticky = two_readers(&array, &disks, starts);
    // One seek for each stream to reach its region, then none.
    assert_eq!(
        sticky.iter().sum::<u64>(),
        2,
        "sticky seeks per disk {sticky:?}"
    );
    let stats = array.member_stats();
    assert_eq!(
        stats.iter().filter(|s| s.reads == 48).count(),
        2,
        "{stats:?}"
    );

    array.set_read_policy(ReadPolicy::Legacy);
    let legacy = two_readers(&array, &disks, starts);
    assert!(
        legacy.iter().sum::<u64>() > 40,
        "legacy seeks per disk {legacy:?}"
    );
    let busy_legacy: Duration = disks.iter().map(|d| d.counters().busy).sum();

    array.set_read_policy(ReadPolicy::Sticky);
    two_readers(&array, &disks, starts);
    let busy_sticky: Duration = disks.iter().map(|d| d.counters().busy).sum();
    assert!(
        busy_legacy > busy_sticky * 2,
        "legacy {busy_legacy:?} vs sticky {busy_sticky:?}"
    );
}

#[test]
fn assembly_takes_the_read_policy() {
    let disks = virtual_disks(2);
    let (array, _) = mirror(&disks);
    drop(array);
    let opts = AssembleOptions {
        read_policy: ReadPolicy::Legacy,
        ..Default::default()
    };
    let array = assemble(as_members(&disks), opts).expect("assemble").array;
    assert_eq!(array.read_policy(), ReadPolicy::Legacy);
    assert!(array
        .member_stats()
        .iter()
        .all(|s| s.rotational && s.reads == 0));
    let opts = AssembleOptions {
        rotational: Some(false),
        ..Default::default()
    };
    drop(array);
    let array = assemble(as_members(&disks), opts).expect("assemble").array;
    assert!(array.member_stats().iter().all(|s| !s.rotational));
}

/// A large read on solid-state copies is split, one part per copy; on
/// rotating copies (and for a small read) it stays whole on one copy.
#[test]
fn large_reads_split_across_solid_state_copies_and_stay_whole_on_rotating_ones() {
    for rotational in [false, true] {
        let disks: Vec<Arc<SimulatedDisk>> = (0..2)
            .map(|i| {
                Arc::new(
                    SimulatedDisk::new(
                        format!("disk{i}"),
                        4 << 30,
                        DiskModel::default(),
                        Clock::Virtual,
                    )
                    .with_rotational(rotational),
                )
            })
            .collect();
        let (array, [start, _]) = mirror(&disks);
        assert!(array
            .member_stats()
            .iter()
            .all(|s| s.rotational == rotational));
        let len = MIB as usize;
        array.write(start, &pattern(start, len)).expect("write");
        for (size, split) in [(len, !rotational), (64 * KIB as usize, false)] {
            array.reset_member_stats();
            let mut buf = vec![0u8; size];
            array.read(start, &mut buf).expect("read");
            assert!(buf == pattern(start, size), "wrong data");
            let bytes: Vec<u64> = array.member_stats().iter().map(|s| s.bytes).collect();
            let expected: Vec<u64> = if split {
                vec![size as u64 / 2; 2]
            } else {
                let mut one = bytes.clone();
                one.sort_unstable();
                assert_eq!(one, vec![0, size as u64], "rotational {rotational}");
                bytes.clone()
            };
            assert_eq!(bytes, expected, "rotational {rotational}, {size} bytes");
        }
    }
}
