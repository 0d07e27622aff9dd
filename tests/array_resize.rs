//! Growing onto larger members (`raidfs grow --size max`) on the array
//! engine: at every level the new groups are free at once and hold data,
//! every byte written before stays, the size survives reassembly, what
//! cannot be done is refused with its reason, and a power cut at any member
//! write of the change leaves an array of the old size or the new, with
//! every flushed byte.

mod common;

use raidfs::array::{
    assemble, create, Array, AssembleOptions, CreateSpec, SizeTarget, GROUP_SHIFT,
};
use raidfs::geometry::{Layout, Level};
use raidfs::member::faulty::FaultyMember;
use raidfs::member::memory::MemoryMember;
use raidfs::member::Member;
use raidfs::superblock::{member_end, GroupProfile, Superblock, TAIL_RESERVE};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::sync::Arc;
use std::time::{Duration, Instant};

const SMALL: u64 = 40 << 20;
const LARGE: u64 = 100 << 20;
const CHUNK: u64 = 16 << 10;

/// Members whose length the test can change, as a host's `truncate -s`
/// would: the array sees them through fault-injecting wrappers.
struct Members {
    sizes: Vec<MemoryMember>,
    ms: Vec<FaultyMember>,
}

impl Members {
    fn new(n: usize, size: u64, prefix: &str) -> Members {
        let sizes: Vec<MemoryMember> = (0..n)
            .map(|i| {
                MemoryMember::new(size)
                    .expect("memory member")
                    .with_name(format!("{prefix}{i}"))
            })
            .collect();
        let ms = sizes
            .iter()
            .map(|m| FaultyMember::new(m.shared()))
            .collect();
        Members { sizes, ms }
    }

    fn set_len(&self, which: &[usize], size: u64) {
        for &i in which {
            self.sizes[i].set_len(size).expect("resize");
        }
    }

    fn handles(&self) -> Vec<(Arc<dyn Member>, String)> {
        common::members::named(&self.ms)
    }
}

fn new_array(level: Level, members: &Members) -> Arc<Array> {
    let spec = CreateSpec {
        level,
        layout: Layout::LeftSymmetric,
        chunk: CHUNK,
        copies: 2,
        name: "resize".into(),
        ppl: false,
    };
    let array = Arc::new(create(members.handles(), &spec).expect("create"));
    array.start_background();
    array
}

/// Groups written with seeded bytes (each to its full capacity), and where.
#[derive(Default)]
struct Model {
    groups: Vec<(u64, Vec<u8>)>,
}

impl Model {
    /// Fill `n` newly allocated groups of `profile`.
    fn fill(&mut self, array: &Array, profile: GroupProfile, n: usize, seed: u64) {
        let mut rng = StdRng::seed_from_u64(seed);
        let capacity = array.group_capacity(profile) as usize;
        for _ in 0..n {
            let g = array.allocate_group(profile).expect("allocate a group");
            let addr = u64::from(g) << GROUP_SHIFT;
            let data: Vec<u8> = (0..capacity).map(|_| rng.gen()).collect();
            array.write(addr, &data).expect("write");
            self.groups.push((addr, data));
        }
        array.flush().expect("flush");
    }

    fn verify(&self, array: &Array, when: &str) {
        for (addr, data) in &self.groups {
            let mut buf = vec![0u8; data.len()];
            array
                .read(*addr, &mut buf)
                .unwrap_or_else(|e| panic!("{when}: read {addr:#x}: {e}"));
            if let Some(at) = buf.iter().zip(data).position(|(a, b)| a != b) {
                panic!("{when}: group at {addr:#x} differs from byte {at}");
            }
        }
    }
}

fn scrub_clean(array: &Array, when: &str) {
    array.start_check(false).expect("check");
    array.wait_background();
    let last = array.last_sync_result().expect("check result");
    assert!(last.completed, "{when}: check: {}", last.message);
    assert_eq!(last.mismatches, 0, "{when}: check found mismatches");
}

/// The groups a member of `len` bytes holds with `group_size` groups.
fn groups_for(len: u64, group_size: u64) -> usize {
    ((member_end(len) - (1 << 20) - TAIL_RESERVE) / group_size) as usize
}

fn reassemble(array: Arc<Array>, members: &Members) -> Arc<Array> {
    array.stop_background();
    array.mark_clean().expect("mark clean");
    drop(array);
    let back = Arc::new(
        assemble(members.handles(), AssembleOptions::default())
            .expect("assemble")
            .array,
    );
    back.start_background();
    back
}

#[test]
fn members_made_larger_give_their_space_at_every_level() {
    for (level, n) in [
        (Level::Raid0, 3),
        (Level::Raid1, 2),
        (Level::Raid10, 4),
        (Level::Raid5, 4),
        (Level::Raid6, 5),
    ] {
        let members = Members::new(n, SMALL, &format!("grow{level}-"));
        let array = new_array(level, &members);
        let sb = array.superblock();
        let groups_before = sb.groups.len();
        assert_eq!(groups_before, groups_for(SMALL, sb.group_size), "{level}");
        let mut model = Model::default();
        model.fill(&array, GroupProfile::Metadata, 1, 1);
        model.fill(&array, GroupProfile::Data, groups_before - 1, 2);
        assert_eq!(array.free_group_count(), 0, "{level}: full before");

        members.set_len(&(0..n).collect::<Vec<_>>(), LARGE);
        let grown = array.grow_size(SizeTarget::Max).expect("grow");
        let groups_after = groups_for(LARGE, sb.group_size);
        assert!(grown.changed(), "{level}");
        assert_eq!(
            (grown.groups_from, grown.groups_to),
            (groups_before, groups_after),
            "{level}"
        );
        assert_eq!(grown.to, groups_after as u64 * sb.group_size, "{level}");
        assert_eq!(
            array.free_group_count(),
            groups_after - groups_before,
            "{level}: the new groups are free at once"
        );
        model.verify(&array, &format!("{level} after growing"));
        // The new space takes data like any other.
        model.fill(&array, GroupProfile::Data, groups_after - groups_before, 3);
        model.verify(&array, &format!("{level} with the new groups written"));
        scrub_clean(&array, &format!("{level} grown"));

        // Every copy of every member's superblock says so, the end copies
        // at the new end.
        for m in &members.ms {
            let (on_disk, verdict) = Superblock::read_from(m).expect("superblock");
            assert_eq!(on_disk.data_size, grown.to, "{level}: {}", m.name());
            assert_eq!(on_disk.groups.len(), groups_after);
            assert!(
                !verdict.has_damage(),
                "{level}: {}: {}",
                m.name(),
                verdict.damaged()
            );
        }
        let back = reassemble(array, &members);
        assert_eq!(back.superblock().groups.len(), groups_after, "{level}");
        model.verify(&back, &format!("{level} reassembled"));
        scrub_clean(&back, &format!("{level} reassembled"));
        back.stop_background();
    }
}

#[test]
fn the_smallest_member_decides_and_a_size_can_be_asked_for() {
    let members = Members::new(3, SMALL, "partial-");
    let array = new_array(Level::Raid5, &members);
    let group_size = array.superblock().group_size;
    let before = array.superblock().groups.len();

    // One member not enlarged yet: nothing to gain, nothing changed.
    members.set_len(&[0, 1], LARGE);
    let same = array.grow_size(SizeTarget::Max).expect("grow");
    assert!(!same.changed());
    assert_eq!(array.superblock().groups.len(), before);

    members.set_len(&[2], SMALL + 4 * group_size);
    // A size between: whole groups of it, no more.
    let asked = (before as u64 + 2) * group_size + group_size / 2;
    let grown = array.grow_size(SizeTarget::Bytes(asked)).expect("grow");
    assert_eq!(grown.groups_to, before + 2);
    // Then the rest of what the smallest member offers.
    let rest = array.grow_size(SizeTarget::Max).expect("grow");
    assert_eq!(
        rest.groups_to,
        groups_for(SMALL + 4 * group_size, group_size)
    );

    let err = array
        .grow_size(SizeTarget::Bytes(group_size))
        .expect_err("shrinking");
    assert!(err.to_string().contains("cannot shrink"), "{err}");
    let err = array
        .grow_size(SizeTarget::Bytes(LARGE * 4))
        .expect_err("too large");
    assert!(
        err.to_string().contains("does not fit") && err.to_string().contains("partial-2"),
        "{err}"
    );
    array.stop_background();
}

#[test]
fn what_cannot_grow_is_refused_with_its_reason_and_nothing_changes() {
    // A member that shrank under the array.
    let members = Members::new(2, SMALL, "shrunk-");
    let array = new_array(Level::Raid1, &members);
    let before = array.superblock();
    members.set_len(&[0], LARGE);
    members.set_len(&[1], SMALL - (12 << 20));
    let err = array.grow_size(SizeTarget::Max).expect_err("shrunk member");
    assert!(
        err.to_string().contains("shrunk-1") && err.to_string().contains("truncated"),
        "{err}"
    );
    assert_eq!(array.superblock().events, before.events, "nothing recorded");
    array.stop_background();

    // A degraded array.
    let members = Members::new(3, SMALL, "degraded-");
    let array = new_array(Level::Raid5, &members);
    members.set_len(&[0, 1, 2], LARGE);
    array.fail(1).expect("fail a member");
    let err = array.grow_size(SizeTarget::Max).expect_err("degraded");
    assert!(err.to_string().contains("degraded"), "{err}");
    array.stop_background();

    // A hot spare that would be too small for the grown array.
    let members = Members::new(4, SMALL, "spare-");
    let spec = CreateSpec {
        level: Level::Raid5,
        layout: Layout::LeftSymmetric,
        chunk: CHUNK,
        copies: 1,
        name: "spare".into(),
        ppl: false,
    };
    let handles = members.handles();
    let array = Arc::new(create(handles[..3].to_vec(), &spec).expect("create"));
    array.start_background();
    array
        .add(Arc::clone(&handles[3].0), handles[3].1.clone())
        .expect("add a spare");
    members.set_len(&[0, 1, 2], LARGE);
    let err = array.grow_size(SizeTarget::Max).expect_err("small spare");
    assert!(
        err.to_string().contains("spare-3") && err.to_string().contains("spare"),
        "{err}"
    );
    // Enlarged too, it fits.
    members.set_len(&[3], LARGE);
    assert!(array.grow_size(SizeTarget::Max).expect("grow").changed());
    array.stop_background();
}

#[test]
fn a_power_cut_at_any_write_of_the_change_leaves_the_old_size_or_the_new() {
    // Member writes the change takes, counted once.
    let setup = |prefix: &str| {
        let members = Members::new(4, SMALL, prefix);
        let array = new_array(Level::Raid5, &members);
        let mut model = Model::default();
        model.fill(&array, GroupProfile::Metadata, 1, 5);
        model.fill(&array, GroupProfile::Data, 2, 6);
        members.set_len(&[0, 1, 2, 3], LARGE);
        (members, array, model)
    };
    let writes = |members: &Members| members.ms.iter().map(|m| m.counts().writes).sum::<u64>();
    let total = {
        let (members, array, _) = setup("count-");
        let before = writes(&members);
        array.grow_size(SizeTarget::Max).expect("grow");
        array.stop_background();
        writes(&members) - before
    };
    assert!(total >= 8, "growing takes {total} member writes");
    let (mut old, mut new) = (0, 0);
    for cut_at in 1..=total {
        let (members, array, model) = setup(&format!("cut{cut_at}-"));
        let sb = array.superblock();
        let before = writes(&members);
        let grower = {
            let array = Arc::clone(&array);
            std::thread::spawn(move || array.grow_size(SizeTarget::Max))
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while writes(&members) - before < cut_at && !grower.is_finished() {
            assert!(Instant::now() < deadline, "cut {cut_at}: not reached");
            std::thread::yield_now();
        }
        let images = common::members::power_cut(&members.ms, cut_at);
        grower.join().expect("grower").expect("grow");
        array.stop_background();
        drop(array);

        let back = Arc::new(
            assemble(images, AssembleOptions::default())
                .unwrap_or_else(|e| panic!("cut {cut_at}: assemble: {e}"))
                .array,
        );
        back.start_background();
        // A resync of what the cut left dirty runs first.
        back.wait_background();
        let groups = back.superblock().groups.len();
        if groups == sb.groups.len() {
            old += 1;
        } else {
            assert_eq!(groups, groups_for(LARGE, sb.group_size), "cut {cut_at}");
            new += 1;
        }
        model.verify(&back, &format!("cut at write {cut_at} of {total}"));
        scrub_clean(&back, &format!("cut {cut_at}"));
        // Whichever it is, growing again finishes the job.
        let again = back.grow_size(SizeTarget::Max).expect("grow again");
        assert_eq!(again.groups_to, groups_for(LARGE, sb.group_size));
        model.verify(&back, &format!("cut {cut_at}, grown again"));
        back.stop_background();
    }
    eprintln!("{total} cuts: {old} left the old size, {new} the new");
    assert!(old > 0 && new > 0, "cuts on both sides of the commit");
}
