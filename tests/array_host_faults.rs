//! Faults that are the host's, not a member's, at the array level with
//! fault-injecting members: a full host filesystem (ENOSPC on one member and
//! on every member mid-stripe, answered full-stripe writes included), EIO on
//! every member at once, members that disagree about who failed (forced
//! assembly), a member coming back after a degraded run, spares across
//! reassembly. Every test checks the bytes afterwards.

mod common;

use common::members::handles;
use raidfs::array::{
    assemble, create, AddOutcome, Array, ArrayError, AssembleOptions, CreateSpec, SyncAction,
    GROUP_SHIFT,
};
use raidfs::geometry::{Layout, Level};
use raidfs::member::faulty::{FaultyMember, Ops};
use raidfs::member::Member;
use raidfs::superblock::{GroupProfile, SlotState, Superblock};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::io::ErrorKind;
use std::sync::Arc;
use std::time::{Duration, Instant};

const MEMBER_SIZE: u64 = 48 << 20;

fn faulty(n: usize, prefix: &str) -> Vec<FaultyMember> {
    common::members::faulty(n, MEMBER_SIZE, prefix)
}

fn spec(level: Level) -> CreateSpec {
    CreateSpec {
        level,
        layout: Layout::LeftSymmetric,
        chunk: 16 << 10,
        copies: 2,
        name: "host".into(),
        ppl: false,
    }
}

fn new_array(level: Level, ms: &[FaultyMember]) -> Arc<Array> {
    let array = Arc::new(create(handles(ms), &spec(level)).expect("create"));
    array.start_background();
    array
}

fn reassemble(ms: &[FaultyMember], force: bool) -> Result<Arc<Array>, ArrayError> {
    reassemble_noting(ms, force).map(|(array, _)| array)
}

/// [`reassemble`], with the notes the assembly reported.
fn reassemble_noting(
    ms: &[FaultyMember],
    force: bool,
) -> Result<(Arc<Array>, Vec<String>), ArrayError> {
    let opts = AssembleOptions {
        force,
        ..AssembleOptions::default()
    };
    let assembly = assemble(handles(ms), opts)?;
    let array = Arc::new(assembly.array);
    array.start_background();
    Ok((array, assembly.notes))
}

/// One data group with 3 MiB of seeded random bytes at its start.
fn fill(array: &Array, seed: u64) -> (u64, Vec<u8>) {
    let mut rng = StdRng::seed_from_u64(seed);
    let g = array.allocate_group(GroupProfile::Data).expect("group");
    let addr = (g as u64) << GROUP_SHIFT;
    let data: Vec<u8> = (0..(3 << 20)).map(|_| rng.gen()).collect();
    array.write(addr, &data).expect("write");
    array.flush().expect("flush");
    (addr, data)
}

fn verify(array: &Array, (addr, data): &(u64, Vec<u8>)) {
    let mut buf = vec![0u8; data.len()];
    array.read(*addr, &mut buf).expect("read");
    let first = buf.iter().zip(data).position(|(a, b)| a != b);
    assert!(
        first.is_none(),
        "contents differ at byte {first:?} of {addr:#x}"
    );
}

/// Every member's superblock records every slot active.
fn all_recorded_active(ms: &[FaultyMember]) {
    for m in ms {
        let (sb, _) = Superblock::read_from(m).expect("superblock");
        assert!(
            sb.slots.iter().all(|s| *s == SlotState::Active),
            "{} records {:?}",
            m.name(),
            sb.slots
        );
    }
}

/// Poll until the array runs no background work and `done` holds.
fn settle(array: &Array, done: impl Fn(&Array) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        array.wait_background();
        if array.sync_progress().is_none() && done(array) {
            return;
        }
        assert!(Instant::now() < deadline, "background work did not settle");
        std::thread::yield_now();
    }
}

/// A parity check over every allocated group finds nothing to repair.
fn check_clean(array: &Array) {
    settle(array, |_| true);
    array.start_check(false).expect("check");
    settle(array, |a| a.last_sync_result().is_some());
    let result = array.last_sync_result().expect("check result");
    assert!(result.completed, "{}", result.message);
    assert_eq!(result.mismatches, 0, "{}", result.message);
}

fn full(m: &FaultyMember) {
    m.set_fault_kind(ErrorKind::StorageFull);
    m.fail_after(0, Ops::WRITES);
}

#[test]
fn enospc_on_one_member_fails_the_write_with_enospc_and_no_member() {
    let ms = faulty(3, "nospace1-");
    let array = new_array(Level::Raid5, &ms);
    let kept = fill(&array, 1);
    full(&ms[1]);
    let mut rng = StdRng::seed_from_u64(2);
    let new: Vec<u8> = (0..(1 << 20)).map(|_| rng.gen()).collect();
    let err = array
        .write(kept.0 + (4 << 20), &new)
        .expect_err("the host is full");
    assert!(matches!(err, ArrayError::HostNoSpace(_)), "{err}");
    assert!(array.failed_slots().is_empty(), "no member is failed");
    assert!(!array.is_degraded());
    all_recorded_active(&ms);
    verify(&array, &kept);
    // Space again: the same write works without a remount, and the
    // stripes the refused write touched are made consistent.
    ms[1].heal();
    array
        .write(kept.0 + (4 << 20), &new)
        .expect("write after space returns");
    array.flush().expect("flush");
    verify(&array, &kept);
    verify(&array, &(kept.0 + (4 << 20), new));
    check_clean(&array);
}

#[test]
fn stripes_a_full_host_left_suspect_are_resynced_once_space_returns_without_another_write() {
    let ms = faulty(3, "nospace-retry-");
    let array = new_array(Level::Raid5, &ms);
    let kept = fill(&array, 5);
    array.flush().expect("flush");
    full(&ms[1]);
    let mut rng = StdRng::seed_from_u64(6);
    let new: Vec<u8> = (0..(1 << 20)).map(|_| rng.gen()).collect();
    let err = array
        .write(kept.0 + (4 << 20), &new)
        .expect_err("the host is full");
    assert!(matches!(err, ArrayError::HostNoSpace(_)), "{err}");
    // The host's fault, not the member's: counted apart.
    assert!(array.host_no_space_errors() >= 1);
    for m in array.status().members {
        assert_eq!(m.write_errors, 0, "slot {} counted the full host", m.slot);
    }
    // Space returns and nothing else is written or flushed: the watcher
    // still resyncs the stripes the refused write may have torn.
    ms[1].heal();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let resynced = array
            .last_sync_result()
            .is_some_and(|r| r.action == SyncAction::Resync && r.completed);
        if resynced && array.sync_progress().is_none() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no resync within a minute: {:?}",
            array.last_sync_result()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    verify(&array, &kept);
    check_clean(&array);
}

#[test]
fn a_cached_write_a_full_host_refused_never_lands_over_a_newer_write() {
    let ms = faulty(3, "nospace-order-");
    let array = new_array(Level::Raid5, &ms);
    let kept = fill(&array, 7);
    // One block of a stripe: gathered in the stripe cache and answered.
    let at = kept.0 + (1 << 20) + 4096;
    let older = vec![0xaa; 4096];
    array.write(at, &older).expect("cached write");
    ms.iter().for_each(full);
    array.flush().expect_err("the host is full");
    // Space is back, but the host still counts as short of it: the next
    // write of the block goes to the members at once, past the cache that
    // still holds the refused older bytes.
    ms.iter().for_each(FaultyMember::heal);
    let newer = vec![0x55; 4096];
    array.write(at, &newer).expect("write while short of space");
    array.flush().expect("flush");
    let mut buf = vec![0u8; 4096];
    array.read(at, &mut buf).expect("read");
    assert!(
        buf == newer,
        "the older cached write landed over the newer one"
    );
    let mut around = kept.clone();
    around.1[(1 << 20) + 4096..(1 << 20) + 8192].copy_from_slice(&newer);
    verify(&array, &around);
    check_clean(&array);
}

#[test]
fn a_read_behind_a_refused_write_out_of_its_stripe_gets_the_hosts_error_not_old_bytes() {
    let ms = faulty(3, "nospace-behind-");
    let array = new_array(Level::Raid5, &ms);
    let kept = fill(&array, 9);
    let at = kept.0 + (1 << 20) + 4096;
    array.write(at, &[0x5a; 4096]).expect("cached write");
    ms.iter().for_each(full);
    ms.iter().for_each(FaultyMember::hold_writes);
    // A flush takes the entry and writes it out; its member writes wait.
    let a = Arc::clone(&array);
    let flush = std::thread::spawn(move || a.flush());
    let deadline = Instant::now() + Duration::from_secs(60);
    while ms.iter().map(FaultyMember::held_writers).sum::<usize>() == 0 {
        assert!(
            Instant::now() < deadline,
            "the flush never reached the members"
        );
        std::thread::yield_now();
    }
    // A read of the stripe waits for that write-out, which the host then
    // refuses: the entry is kept, and the read must not go past it to the
    // members (which hold the older bytes).
    let a = Arc::clone(&array);
    let read = std::thread::spawn(move || {
        let mut buf = vec![0u8; 4096];
        a.read(at, &mut buf).map(|()| buf)
    });
    ms.iter().for_each(FaultyMember::release_writes);
    assert!(
        flush.join().expect("flush thread").is_err(),
        "the host is full"
    );
    let outcome = read.join().expect("read thread");
    match &outcome {
        Ok(buf) => assert!(
            buf == &[0x5a; 4096],
            "the read returned bytes older than its write"
        ),
        Err(e) => assert!(matches!(e, ArrayError::HostNoSpace(_)), "{e}"),
    }
    ms.iter().for_each(FaultyMember::heal);
    array.flush().expect("flush once space returns");
    let mut buf = vec![0u8; 4096];
    array.read(at, &mut buf).expect("read");
    assert!(
        buf == [0x5a; 4096],
        "the cached write was lost: read {:#x}.., the racing read {:?}",
        buf[0],
        outcome.as_ref().map(|b| b[0])
    );
    check_clean(&array);
}

#[test]
fn enospc_on_every_member_mid_stripe_leaves_the_array_whole() {
    let ms = faulty(3, "nospace-all-");
    let array = new_array(Level::Raid5, &ms);
    let kept = fill(&array, 3);
    // Each member runs out after a different number of writes: the host
    // fills while a large write is halfway through its stripes.
    for (i, m) in ms.iter().enumerate() {
        m.set_fault_kind(ErrorKind::StorageFull);
        m.fail_after(3 + 2 * i as u64, Ops::WRITES);
    }
    let mut rng = StdRng::seed_from_u64(4);
    let at = kept.0 + (3 << 20);
    let new: Vec<u8> = (0..(4 << 20)).map(|_| rng.gen()).collect();
    let mut refused = 0;
    for piece in 0..16 {
        let span = piece * (256 << 10)..(piece + 1) * (256 << 10);
        match array.write(at + span.start as u64, &new[span]) {
            Ok(()) => {}
            Err(ArrayError::HostNoSpace(_)) => refused += 1,
            Err(e) => panic!("expected ENOSPC, got {e}"),
        }
    }
    assert!(refused > 0, "the host ran out of space mid-write");
    assert!(array.failed_slots().is_empty());
    all_recorded_active(&ms);
    verify(&array, &kept);
    ms.iter().for_each(FaultyMember::heal);
    array.write(at, &new).expect("rewrite after space returns");
    array.flush().expect("flush");
    verify(&array, &(at, new.clone()));
    check_clean(&array);
    array.mark_clean().expect("clean");
    drop(array);
    let again = reassemble(&ms, false).expect("reassemble");
    assert!(!again.is_degraded());
    verify(&again, &kept);
    verify(&again, &(at, new));
}

#[test]
fn an_answered_full_stripe_write_the_host_refuses_lands_once_space_returns() {
    answered_write_refused_by_the_host_lands_once_space_returns(Level::Raid5, "nospace-wb-");
}

#[test]
fn an_answered_mirror_write_the_host_refuses_lands_once_space_returns() {
    answered_write_refused_by_the_host_lands_once_space_returns(Level::Raid1, "nospace-wb1-");
}

fn answered_write_refused_by_the_host_lands_once_space_returns(level: Level, prefix: &str) {
    let ms = faulty(3, prefix);
    // Cached member writes: full stripes and large mirror writes are
    // answered before they land.
    ms.iter().for_each(|m| m.set_cached_writes(true));
    let array = new_array(level, &ms);
    let kept = fill(&array, 5);
    let at = kept.0 + (3 << 20);
    let mut rng = StdRng::seed_from_u64(6);
    let new: Vec<u8> = (0..(1 << 20)).map(|_| rng.gen()).collect();
    full(&ms[2]);
    // Either refused at once or answered and then refused by the host:
    // then the flush must not report it durable.
    match array.write(at, &new) {
        Ok(()) => {
            let err = array.flush().expect_err("the data is not on the members");
            assert!(matches!(err, ArrayError::HostNoSpace(_)), "{err}");
        }
        Err(e) => assert!(matches!(e, ArrayError::HostNoSpace(_)), "{e}"),
    }
    assert!(array.failed_slots().is_empty());
    ms[2].heal();
    array.write(at, &new).expect("write");
    array.flush().expect("flush once space returns");
    verify(&array, &(at, new));
    verify(&array, &kept);
    check_clean(&array);
}

/// Run `f` on its own thread and wait for it a minute at most, so that a
/// hang fails the test instead of stalling the run.
fn within_a_minute<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(60))
        .unwrap_or_else(|_| panic!("{what} did not end within a minute"))
}

#[test]
fn a_parked_full_stripe_write_fails_its_readers_and_writers_with_the_hosts_error() {
    parked_write_fails_the_requests_that_need_it(Level::Raid5, "parked5-", false);
}

#[test]
fn a_parked_mirror_write_fails_its_readers_and_writers_with_the_hosts_error() {
    parked_write_fails_the_requests_that_need_it(Level::Raid1, "parked1-", false);
}

#[test]
fn a_write_parked_by_a_suspension_fails_its_readers_and_writers_with_the_hosts_error() {
    parked_write_fails_the_requests_that_need_it(Level::Raid5, "parked-eio-", true);
}

/// An answered write the host then refuses is parked with its stripes
/// locked until it lands. A read of those stripes (the members still hold
/// the old bytes) and a write that needs their locks must not wait for the
/// host, which may come back only after an unmount: they do the parked
/// write again themselves and, while the host still refuses, fail with its
/// error. Once the host takes writes again, the next read lands the parked
/// write and returns the new bytes.
fn parked_write_fails_the_requests_that_need_it(level: Level, prefix: &str, suspend: bool) {
    let ms = faulty(3, prefix);
    ms.iter().for_each(|m| m.set_cached_writes(true));
    let array = new_array(level, &ms);
    let kept = fill(&array, 11);
    let at = kept.0 + (3 << 20);
    let mut rng = StdRng::seed_from_u64(12);
    let new: Vec<u8> = (0..(1 << 20)).map(|_| rng.gen()).collect();
    if suspend {
        ms.iter().for_each(|m| m.fail_after(0, Ops::WRITES));
    } else {
        full(&ms[2]);
    }
    let is_hosts = move |e: &ArrayError| match suspend {
        true => matches!(e, ArrayError::HostFault { .. }),
        false => matches!(e, ArrayError::HostNoSpace(_)),
    };
    // Held until answered: otherwise a member worker that fails the write
    // before the writer looks can suspend the array first, and the writer
    // then gets the host's error itself (a loaded machine does that).
    ms.iter().for_each(FaultyMember::hold_writes);
    array
        .write(at, &new)
        .expect("a large write is answered before it reaches the members");
    ms.iter().for_each(FaultyMember::release_writes);

    let (a, len) = (Arc::clone(&array), new.len());
    let read = within_a_minute("a read of a parked write", move || {
        let mut buf = vec![0u8; len];
        a.read(at, &mut buf)
    });
    let err = read.expect_err("the members do not hold the parked write");
    assert!(is_hosts(&err), "{err}");

    let a = Arc::clone(&array);
    let write = within_a_minute("a write into a parked write's stripes", move || {
        a.write(at + 4096, &[5u8; 4096])
    });
    let err = write.expect_err("the stripe's lock is the parked write's");
    assert!(is_hosts(&err), "{err}");
    let a = Arc::clone(&array);
    let flush = within_a_minute("a flush", move || a.flush());
    assert!(is_hosts(&flush.expect_err("not durable")));
    assert!(array.failed_slots().is_empty(), "no member is failed");
    verify(&array, &kept);

    ms.iter().for_each(FaultyMember::heal);
    if suspend {
        assert!(array.try_resume(), "every member answers again");
    }
    let a = Arc::clone(&array);
    let written = (at, new);
    let check = written.clone();
    within_a_minute("a read once the host takes writes", move || {
        verify(&a, &check)
    });
    array.flush().expect("flush");
    verify(&array, &written);
    verify(&array, &kept);
    check_clean(&array);
}

#[test]
fn eio_on_every_member_at_once_suspends_and_records_nothing() {
    let ms = faulty(3, "eio-all-");
    let array = new_array(Level::Raid5, &ms);
    let kept = fill(&array, 7);
    let events = array.superblock().events;
    ms.iter().for_each(|m| m.fail_after(0, Ops::WRITES));
    let err = array
        .write(kept.0 + (3 << 20), &[7u8; 64 << 10])
        .expect_err("the host fails everything");
    assert!(matches!(err, ArrayError::HostFault { .. }), "{err}");
    assert!(array.suspension().is_some(), "the array is suspended");
    assert!(array.failed_slots().is_empty(), "no member is failed");
    all_recorded_active(&ms);
    for m in &ms {
        let (sb, _) = Superblock::read_from(m).expect("superblock");
        assert_eq!(sb.events, events, "{}: no superblock was written", m.name());
    }
    // Reads still work while writes are refused.
    verify(&array, &kept);
    assert!(!array.try_resume(), "still failing");
    ms.iter().for_each(FaultyMember::heal);
    assert!(array.try_resume(), "every member answers again");
    let at = kept.0 + (3 << 20);
    array
        .write(at, &[9u8; 64 << 10])
        .expect("write after resume");
    array.flush().expect("flush");
    verify(&array, &(at, vec![9u8; 64 << 10]));
    check_clean(&array);
    array.mark_clean().expect("clean");
    drop(array);
    let again = reassemble(&ms, false).expect("a remount assembles cleanly");
    assert!(!again.is_degraded());
    verify(&again, &kept);
}

#[test]
fn eio_on_one_member_still_fails_that_member() {
    let ms = faulty(3, "eio-one-");
    let array = new_array(Level::Raid5, &ms);
    let kept = fill(&array, 8);
    ms[1].fail_after(0, Ops::WRITES);
    array
        .write(kept.0 + (3 << 20), &[1u8; 64 << 10])
        .expect("degraded write");
    assert_eq!(array.failed_slots(), vec![1]);
    assert!(array.suspension().is_none());
    for m in [&ms[0], &ms[2]] {
        let (sb, _) = Superblock::read_from(m).expect("superblock");
        assert_eq!(sb.slots[1], SlotState::Faulty);
    }
    verify(&array, &kept);
}

#[test]
fn forced_assembly_starts_members_that_disagree_about_who_failed() {
    let ms = faulty(3, "forced-");
    let array = new_array(Level::Raid5, &ms);
    let kept = fill(&array, 9);
    // A cascade: slot 0 is recorded faulty by 1 and 2, then slot 1 by 2.
    array.fail(0).expect("fail 0");
    array.fail(1).expect("fail 1");
    drop(array);
    let events: Vec<u64> = ms
        .iter()
        .map(|m| Superblock::read_from(m).expect("sb").0.events)
        .collect();
    assert!(events[0] < events[1] && events[1] < events[2], "{events:?}");
    let err = reassemble(&ms, false).err().expect("members disagree");
    assert!(err.to_string().contains("-o force"), "{err}");
    let (forced, notes) = reassemble_noting(&ms, true).expect("forced assembly");
    assert!(!forced.is_degraded(), "every member is taken back");
    let notes = notes.join("\n");
    assert!(notes.contains("forced: m1"), "{notes}");
    assert!(notes.contains("forced: m0"), "{notes}");
    verify(&forced, &kept);
    check_clean(&forced);
    // Their superblocks are brought up to date: a plain mount works now.
    forced.mark_clean().expect("clean");
    drop(forced);
    let plain = reassemble(&ms, false).expect("plain assembly after force");
    assert!(!plain.is_degraded());
    verify(&plain, &kept);
    drop(plain);
    // No set of one member can serve a RAID5, even forced.
    let err = reassemble(&ms[2..], true).err().expect("one member");
    assert!(err.to_string().contains("even forced"), "{err}");
}

#[test]
fn a_member_left_out_of_a_degraded_run_is_re_added_from_the_bitmap() {
    let ms = faulty(3, "returning-");
    let array = new_array(Level::Raid5, &ms);
    let mut kept = fill(&array, 10);
    // A second data group nobody writes while the member is away.
    let quiet = fill(&array, 11);
    array.mark_clean().expect("clean");
    drop(array);
    let (degraded, notes) = reassemble_noting(&ms[..2], false).expect("degraded start");
    assert!(degraded.is_degraded());
    let notes = notes.join("\n");
    assert!(notes.contains("started degraded with 2 of 3"), "{notes}");
    degraded.mark_dirty().expect("dirty");
    let mut rng = StdRng::seed_from_u64(12);
    let patch: Vec<u8> = (0..(256 << 10)).map(|_| rng.gen()).collect();
    degraded
        .write(kept.0 + (1 << 20), &patch)
        .expect("degraded write");
    kept.1[1 << 20..(1 << 20) + patch.len()].copy_from_slice(&patch);
    let (_, dirty_bytes) = degraded.dirty_regions();
    degraded.mark_clean().expect("clean");
    drop(degraded);
    let (whole, notes) = reassemble_noting(&ms, false).expect("all three again");
    let notes = notes.join("\n");
    assert!(notes.contains("m2 (slot 2) is stale"), "{notes}");
    assert!(notes.contains("re-added"), "{notes}");
    settle(&whole, |a| !a.is_degraded());
    let result = whole.last_sync_result().expect("recovery result");
    assert!(result.completed, "{}", result.message);
    assert_eq!(
        result.total, dirty_bytes,
        "the re-add covers exactly the bitmap"
    );
    verify(&whole, &kept);
    verify(&whole, &quiet);
    check_clean(&whole);
    // The returned member alone with one other serves every byte.
    whole.mark_clean().expect("clean");
    drop(whole);
    let two = reassemble(&[ms[0].clone(), ms[2].clone()], false).expect("without m1");
    verify(&two, &kept);
    verify(&two, &quiet);
}

#[test]
fn spares_stay_spares_across_reassembly() {
    let ms = faulty(3, "spare-");
    let array = new_array(Level::Raid1, &ms[..2]);
    let kept = fill(&array, 13);
    let outcome = array
        .add(Arc::new(ms[2].clone()), "m2".into())
        .expect("add spare");
    assert_eq!(outcome, AddOutcome::Spare);
    array.mark_clean().expect("clean");
    drop(array);
    let (again, notes) = reassemble_noting(&ms, false).expect("reassemble with the spare");
    assert_eq!(again.spares(), vec!["m2".to_string()]);
    assert!(notes.join("\n").contains("m2 is a hot spare"));
    // The spare takes over when a member fails.
    again.fail(0).expect("fail 0");
    settle(&again, |a| !a.is_degraded());
    assert!(again.spares().is_empty());
    verify(&again, &kept);
}

/// The watcher of a running array probes the members while it is
/// suspended and resumes it by itself once they all answer.
#[test]
fn a_suspended_array_resumes_by_itself_when_the_host_recovers() {
    let ms = faulty(3, "watch-");
    let array = new_array(Level::Raid5, &ms);
    let kept = fill(&array, 17);
    ms.iter().for_each(|m| m.fail_after(0, Ops::WRITES));
    let err = array
        .write(kept.0 + (3 << 20), &[7u8; 64 << 10])
        .expect_err("the host fails everything");
    assert!(matches!(err, ArrayError::HostFault { .. }), "{err}");
    assert!(array.suspension().is_some(), "the array is suspended");
    ms.iter().for_each(FaultyMember::heal);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while array.suspension().is_some() {
        assert!(
            std::time::Instant::now() < deadline,
            "still suspended 10 s after the host recovered"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let at = kept.0 + (3 << 20);
    array
        .write(at, &[9u8; 64 << 10])
        .expect("write after resume");
    array.flush().expect("flush");
    verify(&array, &(at, vec![9u8; 64 << 10]));
    verify(&array, &kept);
    array.mark_clean().expect("clean");
}
