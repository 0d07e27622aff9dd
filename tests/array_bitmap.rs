//! The write-intent bitmap: after an unclean shutdown only dirty regions are
//! resynced; a clean shutdown leaves nothing dirty; a member that was out for
//! a while is re-added and catches up on only what changed.

mod common;

use common::members::named;
use raidfs::array::{
    assemble, create, AddOutcome, Array, AssembleOptions, CreateSpec, SyncAction, GROUP_SHIFT,
};
use raidfs::geometry::{Layout, Level};
use raidfs::member::faulty::FaultyMember;
use raidfs::member::Member;
use raidfs::superblock::GroupProfile;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::sync::Arc;

const MEMBER_SIZE: u64 = 96 << 20;

fn faulty(n: usize) -> Vec<FaultyMember> {
    common::members::faulty(n, MEMBER_SIZE, "b")
}

fn spec(level: Level) -> CreateSpec {
    CreateSpec {
        level,
        layout: Layout::LeftSymmetric,
        chunk: 64 << 10,
        copies: 2,
        name: "bm".into(),
        ppl: false,
    }
}

fn random(seed: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    StdRng::seed_from_u64(seed).fill(&mut v[..]);
    v
}

/// Allocate every data group there is room for (before marking dirty, so
/// their allocation does not count), then write a little at one place.
fn groups(array: &Array, n: usize) -> Vec<u64> {
    (0..n)
        .map(|_| (array.allocate_group(GroupProfile::Data).expect("group") as u64) << GROUP_SHIFT)
        .collect()
}

#[test]
fn unclean_shutdown_resyncs_only_dirty_regions() {
    let ms = faulty(4);
    let array = Arc::new(create(named(&ms), &spec(Level::Raid5)).expect("create"));
    let bases = groups(&array, 6);
    for (i, b) in bases.iter().enumerate() {
        array.write(*b, &random(i as u64, 4 << 20)).expect("fill");
    }
    array.mark_clean().expect("clean");
    assert_eq!(
        array.dirty_regions().0,
        0,
        "a clean shutdown leaves nothing dirty"
    );
    // A session that writes to one place, then "crashes" (no mark_clean).
    array.mark_dirty().expect("dirty");
    array
        .write(bases[3] + 123_456, &random(99, 200_000))
        .expect("write");
    let (dirty_regions, dirty_bytes) = array.dirty_regions();
    assert!(dirty_regions >= 1);
    drop(array);
    // Corrupt parity in a clean region behind the array's back: a full
    // resync would "fix" it, a bitmap resync must leave it alone (and a
    // later check finds it), which proves only dirty regions were walked.
    let array = Arc::new(
        assemble(named(&ms), AssembleOptions::default())
            .expect("assemble")
            .array,
    );
    assert_eq!(
        array.dirty_regions(),
        (dirty_regions, dirty_bytes),
        "bits survive the crash"
    );
    let sb = array.superblock();
    let clean_group = (bases[0] >> GROUP_SHIFT) as u64;
    ms[1]
        .write_at(
            &[0x77; 64],
            sb.data_offset + clean_group * sb.group_size + 4096,
        )
        .expect("scribble");
    array.start_background();
    let progress = array.sync_progress().expect("a resync runs");
    assert_eq!(progress.action, SyncAction::Resync);
    array.wait_background();
    let result = array.last_sync_result().expect("result");
    assert!(
        result.completed && result.action == SyncAction::Resync,
        "{result:?}"
    );
    array.start_check(false).expect("check");
    array.wait_background();
    let check = array.last_sync_result().expect("check result");
    assert!(
        check.mismatches > 0,
        "the clean region was not touched by the resync"
    );
    // And the written data reads back.
    let mut buf = vec![0u8; 200_000];
    array.read(bases[3] + 123_456, &mut buf).expect("read");
    assert!(buf == random(99, 200_000));
}

#[test]
fn a_returning_member_is_re_added_from_the_bitmap() {
    let ms = faulty(3);
    let array = Arc::new(create(named(&ms), &spec(Level::Raid1)).expect("create"));
    array.start_background();
    let bases = groups(&array, 4);
    for (i, b) in bases.iter().enumerate() {
        array.write(*b, &random(i as u64, 8 << 20)).expect("fill");
    }
    array.mark_clean().expect("clean");
    array.start_background();
    array.mark_dirty().expect("dirty");
    // Member 2 drops out; a small part of the data changes meanwhile.
    ms[2].pull();
    let new = random(1234, 300_000);
    array
        .write(bases[2] + 5_000_000, &new)
        .expect("degraded write");
    assert_eq!(array.failed_slots(), vec![2]);
    array.remove("b2").expect("remove");
    // It comes back.
    ms[2].heal();
    ms[2].reset_counts();
    // Bits stay set while the array is degraded: the re-add's size.
    let (_, dirty_bytes) = array.dirty_regions();
    assert!(
        dirty_bytes > 0 && dirty_bytes < 4 * (8 << 20),
        "{dirty_bytes}"
    );
    let outcome = array
        .add(Arc::new(ms[2].clone()), "b2".into())
        .expect("re-add");
    assert_eq!(outcome, AddOutcome::ReAdded { slot: 2 });
    array.wait_background();
    let result = array.last_sync_result().expect("result");
    assert!(result.completed, "{}", result.message);
    assert_eq!(result.total, dirty_bytes, "{}", result.message);
    assert_eq!(result.done, dirty_bytes, "{}", result.message);
    assert!(!array.is_degraded());
    let written = ms[2].counts().bytes_written;
    assert!(
        written < 16 << 20,
        "re-add copied {written} bytes, not the whole member"
    );
    // Only member 2 left: everything, old and new, is there.
    ms[0].pull();
    ms[1].pull();
    let mut expected = random(2, 8 << 20);
    expected[5_000_000..5_300_000].copy_from_slice(&new);
    let mut buf = vec![0u8; 8 << 20];
    array.read(bases[2], &mut buf).expect("read");
    assert!(buf == expected);
    array.read(bases[0], &mut buf).expect("read");
    assert!(buf == random(0, 8 << 20));
}
