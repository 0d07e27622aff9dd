//! Member lifecycle on a running array: fail, add (rebuild), hot spares,
//! replace, rebuild resume from a checkpoint, and scrub.

mod common;

use common::members::handles;
use raidfs::array::{
    assemble, create, AddOutcome, Array, AssembleOptions, CreateSpec, MemberState, GROUP_SHIFT,
};
use raidfs::geometry::{Layout, Level};
use raidfs::member::faulty::FaultyMember;
use raidfs::member::Member;
use raidfs::superblock::GroupProfile;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::sync::Arc;

const MEMBER_SIZE: u64 = 48 << 20;

fn faulty(n: usize, prefix: &str) -> Vec<FaultyMember> {
    common::members::faulty(n, MEMBER_SIZE, prefix)
}

fn new_array(level: Level, ms: &[FaultyMember]) -> Arc<Array> {
    let spec = CreateSpec {
        level,
        layout: Layout::LeftSymmetric,
        chunk: 16 << 10,
        copies: 2,
        name: "life".into(),
        ppl: false,
    };
    let array = Arc::new(create(handles(ms), &spec).expect("create"));
    array.start_background();
    array
}

/// Two data groups filled with seeded random bytes; returns (base addresses, contents).
fn fill(array: &Array, seed: u64) -> Vec<(u64, Vec<u8>)> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..2)
        .map(|_| {
            let g = array.allocate_group(GroupProfile::Data).expect("group");
            let addr = (g as u64) << GROUP_SHIFT;
            let data: Vec<u8> = (0..(3 << 20)).map(|_| rng.gen()).collect();
            array.write(addr, &data).expect("write");
            (addr, data)
        })
        .collect()
}

fn verify(array: &Array, contents: &[(u64, Vec<u8>)]) {
    for (addr, data) in contents {
        let mut buf = vec![0u8; data.len()];
        array.read(*addr, &mut buf).expect("read");
        assert!(&buf == data, "contents differ at {addr:#x}");
    }
}

/// Overwrite part of each region while degraded, keeping the model current.
fn scribble(array: &Array, contents: &mut [(u64, Vec<u8>)], seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    for (addr, data) in contents.iter_mut() {
        for _ in 0..20 {
            let off = rng.gen_range(0..data.len() - 70_000);
            let len = rng.gen_range(1..70_000);
            let new: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
            array.write(*addr + off as u64, &new).expect("write");
            data[off..off + len].copy_from_slice(&new);
        }
    }
}

#[test]
fn raid5_fail_add_rebuild_then_fail_another() {
    let ms = faulty(4, "r5-");
    let array = new_array(Level::Raid5, &ms);
    let mut contents = fill(&array, 1);
    ms[1].pull();
    scribble(&array, &mut contents, 2);
    assert_eq!(array.failed_slots(), vec![1]);
    let fresh = FaultyMember::memory(MEMBER_SIZE, "new").expect("member");
    let outcome = array
        .add(Arc::new(fresh.clone()), "new".into())
        .expect("add");
    assert_eq!(outcome, AddOutcome::Rebuilding { slot: 1 });
    scribble(&array, &mut contents, 3); // foreground writes during the rebuild
    array.wait_background();
    let result = array.last_sync_result().expect("result");
    assert!(result.completed, "{}", result.message);
    assert!(!array.is_degraded());
    verify(&array, &contents);
    // Now lose a different member: the rebuilt one must carry its share.
    ms[3].pull();
    verify(&array, &contents);
    assert_eq!(array.failed_slots(), vec![3]);
}

#[test]
fn raid6_two_members_rebuilt_one_after_another() {
    let ms = faulty(5, "r6-");
    let array = new_array(Level::Raid6, &ms);
    let mut contents = fill(&array, 4);
    ms[0].pull();
    ms[3].pull();
    scribble(&array, &mut contents, 5);
    assert_eq!(array.failed_slots(), vec![0, 3]);
    for name in ["n0", "n3"] {
        let m = FaultyMember::memory(MEMBER_SIZE, name).expect("member");
        array.add(Arc::new(m), name.into()).expect("add");
        array.wait_background();
    }
    assert!(!array.is_degraded());
    verify(&array, &contents);
    ms[1].pull();
    ms[2].pull();
    verify(&array, &contents);
}

#[test]
fn hot_spare_takes_over_a_failed_member() {
    let ms = faulty(3, "sp-");
    let array = new_array(Level::Raid1, &ms);
    let contents = fill(&array, 6);
    let spare = FaultyMember::memory(MEMBER_SIZE, "spare").expect("member");
    assert_eq!(
        array.add(Arc::new(spare), "spare".into()).expect("add"),
        AddOutcome::Spare
    );
    assert_eq!(array.spares(), vec!["spare".to_string()]);
    ms[2].pull();
    let (addr, data) = &contents[0];
    array
        .write(*addr, &data[..4096])
        .expect("write notices the failure");
    array.wait_background();
    assert!(array.spares().is_empty());
    assert!(!array.is_degraded(), "{:?}", array.status());
    ms[0].pull();
    ms[1].pull();
    verify(&array, &contents); // served by the former spare alone
}

#[test]
fn replace_keeps_the_old_member_until_done() {
    let ms = faulty(4, "rp-");
    let array = new_array(Level::Raid5, &ms);
    let mut contents = fill(&array, 7);
    let new = FaultyMember::memory(MEMBER_SIZE, "replacement").expect("member");
    array
        .replace(2, Arc::new(new.clone()), "replacement".into())
        .expect("replace");
    scribble(&array, &mut contents, 8);
    array.wait_background();
    assert!(array.last_sync_result().expect("result").completed);
    assert_eq!(array.status().members[2].name, "replacement");
    // The old member is out: pulling it changes nothing; pulling another works.
    ms[2].pull();
    verify(&array, &contents);
    ms[0].pull();
    verify(&array, &contents);
}

#[test]
fn interrupted_rebuild_resumes_from_its_checkpoint() {
    let ms = faulty(3, "rs-");
    let array = new_array(Level::Raid5, &ms);
    let contents = fill(&array, 9);
    ms[2].pull();
    verify(&array, &contents);
    // Slow enough that the stop lands long before the end.
    array.set_speed_limits(Some(0), Some(2 << 20));
    let fresh = FaultyMember::memory(MEMBER_SIZE, "fresh").expect("member");
    array
        .add(Arc::new(fresh.clone()), "fresh".into())
        .expect("add");
    // Wait (on the progress counter, not the clock) for the first step.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while array.sync_progress().is_some_and(|p| p.done == 0) {
        assert!(
            std::time::Instant::now() < deadline,
            "recovery made no progress"
        );
        std::thread::yield_now();
    }
    array.stop_background();
    let result = array.last_sync_result().expect("result");
    assert!(!result.completed, "stopped early: {}", result.message);
    assert!(array.is_degraded());
    drop(array);
    // Reassemble with the partially rebuilt member: it resumes and finishes.
    let mut members = handles(&ms[..2]);
    members.push((Arc::new(fresh.clone()) as Arc<dyn Member>, "fresh".into()));
    let array = Arc::new(
        assemble(members, AssembleOptions::default())
            .expect("assemble")
            .array,
    );
    assert!(array.is_degraded(), "the rebuild is not finished yet");
    array.start_background();
    let progress = array.sync_progress().expect("recovery resumed");
    assert!(
        progress.done > 0,
        "resumed past the checkpoint, not from zero"
    );
    array.set_speed_limits(Some(0), Some(0));
    array.wait_background();
    assert!(array.last_sync_result().expect("result").completed);
    assert!(!array.is_degraded());
    ms[0].pull();
    verify(&array, &contents);
}

#[test]
fn scrub_counts_and_repairs_parity_mismatches() {
    let ms = faulty(4, "sc-");
    let array = new_array(Level::Raid5, &ms);
    let contents = fill(&array, 10);
    // Flip bytes behind the array's back in the first data group, on one member.
    let sb = array.superblock();
    let first_data = contents[0].0 >> GROUP_SHIFT;
    let at = sb.data_offset + first_data * sb.group_size + 3 * sb.chunk + 100;
    ms[2].write_at(&[0xAA; 37], at).expect("corrupt");
    array.start_check(false).expect("check");
    array.wait_background();
    let check = array.last_sync_result().expect("result");
    assert!(check.mismatches > 0 && check.mismatches <= 37, "{check:?}");
    array.start_check(true).expect("repair");
    array.wait_background();
    array.start_check(false).expect("check again");
    array.wait_background();
    assert_eq!(array.last_sync_result().expect("result").mismatches, 0);
}

/// Whether the array may lose a member is the engine's one rule, and the
/// slot state a report shows follows every transition: RAID10 keeps its
/// data with one member of each mirror set gone, never with both of one.
#[test]
fn raid10_may_lose_one_member_of_each_mirror_set() {
    let ms = faulty(4, "r10");
    let array = new_array(Level::Raid10, &ms);
    let contents = fill(&array, 10);
    let state = |slot| array.member_state(slot).expect("slot");
    assert!(array.survives_losing(0));
    array.fail(0).expect("fail");
    assert_eq!(state(0), MemberState::Faulty);
    assert_eq!(array.status().members[0].state, "faulty");
    // Slots 0 and 1 hold the same chunks; 2 and 3 the others.
    assert!(!array.survives_losing(1));
    assert!(array.survives_losing(2));
    assert!(array.survives_losing(3));
    array.fail(2).expect("fail");
    verify(&array, &contents);
    assert!(!array.survives_losing(1));
    assert!(!array.survives_losing(3));
    let events = array.superblock().events;
    array.remove("0").expect("remove");
    assert_eq!(state(0), MemberState::Missing);
    assert_eq!(array.superblock().events, events + 1);
    let json = serde_json::to_value(array.status()).expect("json");
    assert_eq!(json["members"][0]["state"], "missing");
    assert_eq!(json["members"][2]["state"], "faulty");
    assert_eq!(json["map"], "[_U_U]");
    array.stop_background();
}

/// Background work holds no strong reference to its array: the array goes
/// when its last user lets go, with its threads running; after
/// `stop_background` the worker is gone and background work is refused.
#[test]
fn background_threads_neither_keep_the_array_nor_outlive_stop() {
    let ms = faulty(3, "own");
    let array = new_array(Level::Raid5, &ms);
    fill(&array, 31);
    array.start_check(false).expect("check");
    array.wait_background();
    array.stop_background();
    let err = array.start_check(false).expect_err("no worker after stop");
    assert!(err.to_string().contains("start_background"), "{err}");
    array.start_background();
    array.start_check(false).expect("a check after a restart");
    array.wait_background();
    assert!(array.last_sync_result().is_some_and(|r| r.completed));

    let weak = Arc::downgrade(&array);
    drop(array);
    // A background thread may hold the array for the moment of one pass.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while weak.upgrade().is_some() {
        assert!(
            std::time::Instant::now() < deadline,
            "the array is still alive 10 s after its last user let go"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}
