//! Reshape (`raidfs grow --level`) on the array engine: every byte survives
//! the move while writers run, the new geometry serves with a clean check,
//! what cannot be done is refused with its reason, and a power cut at any
//! point of a reshape leaves an array that assembles, resumes and still
//! holds every byte flushed before it.

use raidfs::member::Member;
mod common;

use common::members::handles;
use parking_lot::{Condvar, Mutex};
use raidfs::array::{
    assemble, create, Array, AssembleOptions, CreateSpec, SyncAction, GROUP_SHIFT,
};
use raidfs::geometry::{Geometry, Layout, Level};
use raidfs::member::faulty::FaultyMember;
use raidfs::superblock::{GroupProfile, Superblock};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant};

const MEMBER_SIZE: u64 = 48 << 20;
const CHUNK: u64 = 16 << 10;

fn new_array(level: Level, ms: &[FaultyMember]) -> Arc<Array> {
    new_array_of(level, handles(ms))
}

fn new_array_of(level: Level, members: Vec<(Arc<dyn Member>, String)>) -> Arc<Array> {
    let spec = CreateSpec {
        level,
        layout: Layout::LeftSymmetric,
        chunk: CHUNK,
        copies: 2,
        name: "grow".into(),
        ppl: false,
    };
    let array = Arc::new(create(members, &spec).expect("create"));
    array.start_background();
    array
}

/// The model: each data group's full contents (its capacity at the start).
struct Model {
    groups: Vec<(u64, Vec<u8>)>,
}

impl Model {
    /// Fill `n` new data groups (and one metadata group) with seeded bytes.
    fn fill(array: &Array, n: usize, seed: u64) -> Model {
        let mut rng = StdRng::seed_from_u64(seed);
        // Group 0 holds metadata, as on every formatted array.
        let meta = array
            .allocate_group(GroupProfile::Metadata)
            .expect("metadata group");
        let meta_addr = u64::from(meta) << GROUP_SHIFT;
        let meta_data: Vec<u8> = (0..(1 << 20)).map(|_| rng.gen()).collect();
        array.write(meta_addr, &meta_data).expect("write metadata");
        let capacity = array.group_capacity(GroupProfile::Data) as usize;
        let mut groups: Vec<(u64, Vec<u8>)> = (0..n)
            .map(|_| {
                let g = array.allocate_group(GroupProfile::Data).expect("group");
                let addr = u64::from(g) << GROUP_SHIFT;
                let data: Vec<u8> = (0..capacity).map(|_| rng.gen()).collect();
                array.write(addr, &data).expect("write");
                (addr, data)
            })
            .collect();
        groups.push((meta_addr, meta_data));
        array.flush().expect("flush");
        Model { groups }
    }

    fn verify(&self, array: &Array, when: &str) {
        for (addr, data) in &self.groups {
            let mut buf = vec![0u8; data.len()];
            array.read(*addr, &mut buf).expect("read");
            if let Some(at) = buf.iter().zip(data).position(|(a, b)| a != b) {
                panic!("{when}: group at {addr:#x} differs from byte {at}");
            }
        }
    }
}

fn target(array: &Array, level: Level) -> Geometry {
    let now = array.data_geometry();
    let copies = if level == Level::Raid1 {
        now.members
    } else {
        1
    };
    Geometry::new(level, now.members, now.chunk, copies, Layout::LeftSymmetric)
        .expect("target geometry")
}

/// Wait until no background work runs and no reshape is left.
fn wait_reshaped(array: &Array) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        array.wait_background();
        if array.sync_progress().is_none() && array.reshape_counts().is_none() {
            return;
        }
        if let Some(last) = array.last_sync_result() {
            assert!(
                last.completed || last.action != SyncAction::Reshape,
                "reshape did not complete: {}",
                last.message
            );
        }
        assert!(Instant::now() < deadline, "reshape did not finish in time");
        std::thread::yield_now();
    }
}

fn superblock_of(m: &FaultyMember) -> Superblock {
    Superblock::read_from(m).expect("superblock").0
}

fn scrub_clean(array: &Array) {
    array.start_check(false).expect("check");
    array.wait_background();
    let last = array.last_sync_result().expect("check result");
    assert!(last.completed, "check: {}", last.message);
    assert_eq!(
        last.mismatches, 0,
        "check after the reshape: {}",
        last.message
    );
}

fn reshape_and_verify(from: Level, members: usize, to: Level) {
    let ms = common::members::faulty(members, MEMBER_SIZE, &format!("r{from}-"));
    let array = new_array(from, &ms);
    let model = Model::fill(&array, 2, 7);
    let old_capacity = array.group_capacity(GroupProfile::Data);
    array
        .start_reshape(target(&array, to))
        .expect("start reshape");
    wait_reshaped(&array);
    assert_eq!(array.level(), to);
    model.verify(&array, "after the reshape");
    // Data groups have the new level; the metadata group keeps its mirror.
    for (addr, _) in &model.groups[..2] {
        let group = (addr >> GROUP_SHIFT) as u32;
        assert_eq!(array.group_geometry(group).expect("allocated").level, to);
        assert!(array.allocated_group_capacity(group) >= old_capacity);
    }
    scrub_clean(&array);
    let sb = superblock_of(&ms[0]);
    assert_eq!(sb.level, to);
    assert!(sb.reshape.is_none(), "the record is gone");
    drop(array);
    let again = assemble(handles(&ms), AssembleOptions::default())
        .expect("assemble")
        .array;
    model.verify(&again, "after reassembly");
}

#[test]
fn raid1_of_three_becomes_raid5_and_every_group_holds_twice_as_much() {
    reshape_and_verify(Level::Raid1, 3, Level::Raid5);
    let ms = common::members::faulty(3, MEMBER_SIZE, "cap-");
    let array = new_array(Level::Raid1, &ms);
    let model = Model::fill(&array, 1, 3);
    let group = (model.groups[0].0 >> GROUP_SHIFT) as u32;
    let before = array.allocated_group_capacity(group);
    array
        .start_reshape(target(&array, Level::Raid5))
        .expect("start");
    wait_reshaped(&array);
    assert_eq!(array.allocated_group_capacity(group), 2 * before);
    // The space the group gained takes writes and reads them back.
    let tail = vec![0x5au8; 1 << 20];
    let addr = (u64::from(group) << GROUP_SHIFT) + before;
    array.write(addr, &tail).expect("write past the old end");
    let mut back = vec![0u8; tail.len()];
    array.read(addr, &mut back).expect("read");
    assert!(back == tail);
    model.verify(&array, "after writing the gained space");
}

/// `from` on `members` members, `add` more added, reshaped to `to`.
fn add_and_verify(from: Level, members: usize, add: usize, to: Level) {
    let total = members + add;
    let ms = common::members::faulty(total, MEMBER_SIZE, &format!("add{from}{to}-"));
    let array = new_array(from, &ms[..members]);
    let model = Model::fill(&array, 2, 13);
    let old_capacity = array.group_capacity(GroupProfile::Data);
    let copies = if to == Level::Raid1 { total } else { 1 };
    let target =
        Geometry::new(to, total, CHUNK, copies, Layout::LeftSymmetric).expect("target geometry");
    let added = handles(&ms)[members..].to_vec();
    array
        .start_reshape_adding(target, added)
        .expect("start reshape onto the added members");
    assert_eq!(array.member_count(), total);
    wait_reshaped(&array);
    assert_eq!(array.data_geometry(), target);
    model.verify(&array, "after the reshape");
    for (addr, _) in &model.groups[..2] {
        let group = (addr >> GROUP_SHIFT) as u32;
        assert_eq!(array.group_geometry(group), Some(target));
        assert!(array.allocated_group_capacity(group) >= old_capacity);
    }
    // The added members hold their share: a member lost now is survived.
    scrub_clean(&array);
    let sb = superblock_of(&ms[total - 1]);
    assert_eq!((sb.members as usize, sb.slot as usize), (total, total - 1));
    assert!(sb.reshape.is_none());
    drop(array);
    let again = assemble(handles(&ms), AssembleOptions::default())
        .expect("assemble every member")
        .array;
    model.verify(&again, "after reassembly");
    again.mark_clean().expect("mark clean");
    drop(again);
    // Without one of the old members, the new geometry still serves.
    if to != Level::Raid0 {
        let without_first: Vec<_> = handles(&ms).into_iter().skip(1).collect();
        let degraded = assemble(without_first, AssembleOptions::default())
            .expect("assemble without slot 0")
            .array;
        model.verify(&degraded, "degraded, without slot 0");
    }
}

#[test]
fn raid5_restripes_onto_an_added_member() {
    add_and_verify(Level::Raid5, 3, 1, Level::Raid5);
}

#[test]
fn raid5_becomes_raid6_with_an_added_member() {
    add_and_verify(Level::Raid5, 3, 1, Level::Raid6);
}

#[test]
fn raid1_keeps_one_more_copy_on_an_added_member() {
    add_and_verify(Level::Raid1, 2, 1, Level::Raid1);
}

#[test]
fn a_third_mirror_is_rebuilt_as_a_copy_not_restriped() {
    let ms = common::members::faulty(3, MEMBER_SIZE, "mirror3-");
    let array = new_array(Level::Raid1, &ms[..2]);
    let model = Model::fill(&array, 2, 17);
    let written = |m: &FaultyMember| m.counts().bytes_written;
    let before = written(&ms[0]);
    let target = Geometry::new(Level::Raid1, 3, CHUNK, 3, Layout::LeftSymmetric).expect("RAID1 x3");
    array
        .start_reshape_adding(target, handles(&ms)[2..].to_vec())
        .expect("add a mirror");
    assert!(
        array.reshape_counts().is_none(),
        "no group moves: the new member is rebuilt"
    );
    let running = array.sync_progress().expect("a recovery runs");
    assert_eq!(
        (running.action, running.slot),
        (SyncAction::Recovery, Some(2))
    );
    wait_reshaped(&array);
    assert!(!array.is_degraded());
    // The old members were only read (superblocks and bitmap aside).
    assert!(
        written(&ms[0]) - before < 1 << 20,
        "{} bytes written to an old member",
        written(&ms[0]) - before
    );
    assert!(written(&ms[2]) >= 2 * array.group_capacity(GroupProfile::Data));
    model.verify(&array, "after the new mirror was rebuilt");
    scrub_clean(&array);
    drop(array);
    // The new mirror alone holds every byte.
    let alone: Vec<_> = handles(&ms).into_iter().skip(2).collect();
    let only_new = assemble(alone, AssembleOptions::default())
        .expect("assemble the new mirror alone")
        .array;
    model.verify(&only_new, "from the new mirror alone");
}

#[test]
fn raid0_restripes_onto_two_added_members() {
    add_and_verify(Level::Raid0, 2, 2, Level::Raid0);
}

#[test]
fn raid6_becomes_raid5_on_the_same_members() {
    reshape_and_verify(Level::Raid6, 4, Level::Raid5);
}

#[test]
fn raid5_to_raid1_on_the_same_members_is_refused_as_groups_would_shrink() {
    // RAID5 on 3 holds 2 units per group, RAID1 on 3 one.
    let ms = common::members::faulty(3, MEMBER_SIZE, "down-");
    let array = new_array(Level::Raid5, &ms);
    let _model = Model::fill(&array, 1, 5);
    let err = array
        .start_reshape(target(&array, Level::Raid1))
        .expect_err("shrinking groups is refused");
    assert!(err.to_string().contains("add a member first"), "{err}");
    assert!(superblock_of(&ms[0]).reshape.is_none());
}

/// `from` on `members` members reshaped to `to` with `add` more, while a
/// writer changes (and reads back) the lower half of every group and a
/// reader checks the upper half, both until the reshape ends; then every
/// byte and a clean check.
fn live(from: Level, members: usize, add: usize, to: Level) {
    let total = members + add;
    let ms = common::members::faulty(total, MEMBER_SIZE, &format!("live{from}{to}{add}-"));
    let array = new_array(from, &ms[..members]);
    let mut model = Model::fill(&array, 3, 11);
    // Slow the reshape so the writer and reader overlap every group's move.
    array.set_speed_limits(Some(8 << 20), Some(8 << 20));
    let copies = match to {
        Level::Raid1 => total,
        Level::Raid10 => 2,
        _ => 1,
    };
    let target =
        Geometry::new(to, total, CHUNK, copies, Layout::LeftSymmetric).expect("target geometry");
    array
        .start_reshape_adding(target, handles(&ms)[members..].to_vec())
        .expect("start");
    let fixed: Vec<(u64, Vec<u8>)> = model
        .groups
        .iter()
        .map(|(addr, data)| {
            let half = data.len() / 2;
            (addr + half as u64, data[half..].to_vec())
        })
        .collect();
    let reader = {
        let array = Arc::clone(&array);
        std::thread::spawn(move || {
            let mut rng = StdRng::seed_from_u64(7);
            let mut reads = 0u64;
            while array.sync_progress().is_some() || array.reshape_counts().is_some() {
                let (addr, data) = &fixed[rng.gen_range(0..fixed.len())];
                let at = rng.gen_range(0..data.len() - 65536) & !4095;
                let mut back = vec![0u8; 65536];
                array
                    .read(addr + at as u64, &mut back)
                    .expect("read during reshape");
                assert!(back == data[at..at + 65536], "reader at {addr:#x}+{at}");
                reads += 1;
            }
            reads
        })
    };
    let mut rng = StdRng::seed_from_u64(99);
    let mut writes = 0;
    while array.sync_progress().is_some() || array.reshape_counts().is_some() {
        let (addr, data) = &mut model.groups[rng.gen_range(0..4)];
        let at = rng.gen_range(0..data.len() / 2 - 8192) & !511;
        let len = rng.gen_range(1..16) * 512;
        let bytes: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
        array
            .write(*addr + at as u64, &bytes)
            .expect("write during reshape");
        data[at..at + len].copy_from_slice(&bytes);
        let mut back = vec![0u8; len];
        array
            .read(*addr + at as u64, &mut back)
            .expect("read during reshape");
        assert!(back == bytes, "read during reshape at {at}");
        writes += 1;
    }
    let reads = reader.join().expect("reader");
    wait_reshaped(&array);
    assert_eq!(array.data_geometry(), target);
    assert!(
        writes > 10 && reads > 10,
        "the writer and reader overlapped the reshape ({writes} writes, {reads} reads)"
    );
    model.verify(&array, "after writes during the reshape");
    scrub_clean(&array);
}

#[test]
fn live_raid1_to_raid5() {
    live(Level::Raid1, 3, 0, Level::Raid5);
}

#[test]
fn live_raid6_to_raid5() {
    live(Level::Raid6, 4, 0, Level::Raid5);
}

#[test]
fn live_raid5_add_one() {
    live(Level::Raid5, 3, 1, Level::Raid5);
}

#[test]
fn live_raid5_to_raid6_adding_one() {
    live(Level::Raid5, 3, 1, Level::Raid6);
}

#[test]
fn live_raid1_add_a_copy() {
    live(Level::Raid1, 2, 1, Level::Raid1);
}

#[test]
fn live_raid0_add_two() {
    live(Level::Raid0, 2, 2, Level::Raid0);
}

#[test]
fn live_raid10_add_two() {
    live(Level::Raid10, 4, 2, Level::Raid10);
}

/// The thread whose member reads [`Park`] holds.
const HELD_READER: &str = "held-reader";

/// Holds one read between resolving where its range lies and reading it
/// (a reader the scheduler left waiting), and tells when the bytes it is
/// about to read are overwritten meanwhile.
#[derive(Default)]
struct Park {
    state: Mutex<Parked>,
    changed: Condvar,
}

#[derive(Default)]
struct Parked {
    /// The next member read on [`HELD_READER`] waits until released.
    holding: bool,
    /// The member and member bytes of the read waiting.
    at: Option<(String, Range<u64>)>,
    /// A write landed on those bytes while it waited.
    overwritten: bool,
}

impl Park {
    fn hold(&self) {
        *self.state.lock() = Parked {
            holding: true,
            ..Parked::default()
        };
    }

    fn wait_parked(&self) {
        let mut st = self.state.lock();
        while st.at.is_none() {
            let timed_out = self
                .changed
                .wait_for(&mut st, Duration::from_secs(30))
                .timed_out();
            assert!(!timed_out, "the read never reached a member");
        }
    }

    /// Whether the held read's bytes are overwritten within `limit`.
    fn wait_overwritten(&self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        let mut st = self.state.lock();
        while !st.overwritten && !self.changed.wait_until(&mut st, deadline).timed_out() {}
        st.overwritten
    }

    fn release(&self) {
        self.state.lock().holding = false;
        self.changed.notify_all();
    }

    fn reading(&self, member: String, range: Range<u64>) {
        if std::thread::current().name() != Some(HELD_READER) {
            return;
        }
        let mut st = self.state.lock();
        if !st.holding {
            return;
        }
        st.at = Some((member, range));
        self.changed.notify_all();
        while st.holding {
            self.changed.wait(&mut st);
        }
    }

    fn written(&self, member: String, range: Range<u64>) {
        let mut st = self.state.lock();
        if let Some((m, r)) = &st.at {
            if *m == member && r.start < range.end && range.start < r.end {
                st.overwritten = true;
                self.changed.notify_all();
            }
        }
    }
}

/// A member whose reads and writes go through a [`Park`].
struct Parking {
    inner: FaultyMember,
    park: Arc<Park>,
}

impl Member for Parking {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        self.park
            .reading(self.name(), offset..offset + buf.len() as u64);
        self.inner.read_at(buf, offset)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        self.inner.write_at(buf, offset)?;
        self.park
            .written(self.name(), offset..offset + buf.len() as u64);
        Ok(())
    }

    fn write_durable(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        self.inner.write_durable(buf, offset)?;
        self.park
            .written(self.name(), offset..offset + buf.len() as u64);
        Ok(())
    }

    fn sync(&self) -> std::io::Result<()> {
        self.inner.sync()
    }

    fn len(&self) -> u64 {
        self.inner.len()
    }

    fn name(&self) -> String {
        self.inner.name()
    }
}

/// Read `len` bytes at `addr` on [`HELD_READER`].
fn held_read(array: &Arc<Array>, addr: u64, len: usize) -> std::thread::JoinHandle<Vec<u8>> {
    let array = Arc::clone(array);
    std::thread::Builder::new()
        .name(HELD_READER.into())
        .spawn(move || {
            let mut buf = vec![0u8; len];
            array.read(addr, &mut buf).expect("held read");
            buf
        })
        .expect("spawn the reader")
}

/// A read that resolved where a group lies just before a commit moved it,
/// and reads only after, still gets the group's bytes: the reshape
/// overwrites the place the group left (its own slice, zeroed for the new
/// geometry; the staging slice, for the next group) only once such reads
/// have ended. Each read is held at its member until the bytes it reads
/// are overwritten, or for half a second.
#[test]
fn a_read_held_across_a_commit_that_moves_its_group_reads_the_group() {
    let park = Arc::new(Park::default());
    let ms = common::members::faulty(2, MEMBER_SIZE, "held-");
    let parking = ms
        .iter()
        .map(|m| {
            let member = Parking {
                inner: m.clone(),
                park: Arc::clone(&park),
            };
            (Arc::new(member) as Arc<dyn Member>, m.name())
        })
        .collect();
    let array = new_array_of(Level::Raid1, parking);
    let model = Model::fill(&array, 2, 31);
    let (addr, data) = &model.groups[0];
    let group = (addr >> GROUP_SHIFT) as u32;
    // One chunk of one member, away from the group's start (where the new
    // geometry would put the same bytes on the first member).
    let at = data.len() / 2 + CHUNK as usize;
    let len = 4096;
    let expected = &data[at..at + len];
    let staged = || {
        array
            .superblock()
            .reshape
            .is_some_and(|r| r.staged == Some(group))
    };

    // Resolved at home in the old geometry; the group is then staged and
    // its own slice rewritten in the new one.
    park.hold();
    let reader = held_read(&array, addr + at as u64, len);
    park.wait_parked();
    array
        .start_reshape(target(&array, Level::Raid0))
        .expect("start");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !staged() {
        assert!(Instant::now() < deadline, "the group was never staged");
        std::thread::yield_now();
    }
    if !park.wait_overwritten(Duration::from_millis(500)) {
        // The reshape waits for the read: keep it from going on (to the
        // group's move home) until the next read has resolved the staging slice.
        ms.iter().for_each(FaultyMember::hold_writes);
    }
    park.release();
    let back = reader.join().expect("reader");
    assert!(
        back == expected,
        "a read resolved before the group was staged"
    );

    // Resolved at the staging slice; the group then goes home and the
    // next group is staged there.
    assert!(staged(), "the group is still staged");
    park.hold();
    let reader = held_read(&array, addr + at as u64, len);
    park.wait_parked();
    ms.iter().for_each(FaultyMember::release_writes);
    park.wait_overwritten(Duration::from_millis(500));
    park.release();
    let back = reader.join().expect("reader");
    assert!(
        back == expected,
        "a read resolved while the group was staged"
    );

    wait_reshaped(&array);
    model.verify(&array, "after the reshape");
    scrub_clean(&array);
}

#[test]
fn what_cannot_be_reshaped_is_refused_with_the_reason() {
    let ms = common::members::faulty(4, MEMBER_SIZE, "no-");
    let array = new_array(Level::Raid5, &ms);
    let _model = Model::fill(&array, 1, 1);
    let same = array
        .start_reshape(target(&array, Level::Raid5))
        .expect_err("same geometry");
    assert!(same.to_string().contains("already is"), "{same}");
    let smaller = array
        .start_reshape(target(&array, Level::Raid6))
        .expect_err("RAID6 on the same 4 members holds less");
    assert!(
        smaller.to_string().contains("add a member first"),
        "{smaller}"
    );
    ms[2].pull();
    array.fail(2).expect("fail a member");
    let degraded = array
        .start_reshape(target(&array, Level::Raid0))
        .expect_err("degraded");
    assert!(degraded.to_string().contains("degraded"), "{degraded}");

    // Every group allocated: nowhere to move them through.
    let full = common::members::faulty(3, MEMBER_SIZE, "full-");
    let array = new_array(Level::Raid1, &full);
    while array.allocate_group(GroupProfile::Data).is_ok() {}
    let none = array
        .start_reshape(target(&array, Level::Raid5))
        .expect_err("no free group");
    assert!(none.to_string().contains("free space first"), "{none}");
}

/// The target of `from` on `members` with `add` more, and the members.
fn cut_setup(
    from: Level,
    members: usize,
    add: usize,
    to: Level,
    prefix: &str,
) -> (Vec<FaultyMember>, Arc<Array>, Model, Geometry) {
    let total = members + add;
    let ms = common::members::faulty(total, MEMBER_SIZE, prefix);
    let array = new_array(from, &ms[..members]);
    let model = Model::fill(&array, 2, 21);
    let copies = if to == Level::Raid1 { total } else { 1 };
    let target =
        Geometry::new(to, total, CHUNK, copies, Layout::LeftSymmetric).expect("target geometry");
    (ms, array, model, target)
}

/// Power cuts at `seeds` random points of a reshape of `from` on `members`
/// (with `add` more) to `to`: the crash images of every member, taken at
/// one instant, assemble, resume and finish with every flushed byte and a
/// clean check. Returns (cuts mid-reshape, cuts with a group staged).
fn power_cuts(from: Level, members: usize, add: usize, to: Level, seeds: u64) -> (u64, u64) {
    // Member writes the whole reshape takes, measured once.
    let total = {
        let (ms, array, _model, target) = cut_setup(from, members, add, to, "count-");
        array
            .start_reshape_adding(target, handles(&ms)[members..].to_vec())
            .expect("start");
        let before: u64 = ms.iter().map(|m| m.counts().writes).sum();
        wait_reshaped(&array);
        ms.iter().map(|m| m.counts().writes).sum::<u64>() - before
    };
    assert!(total > 20, "a reshape takes {total} member writes");
    let (mut mid_reshape, mut staged) = (0, 0);
    for seed in 0..seeds {
        let (ms, array, model, target) =
            cut_setup(from, members, add, to, &format!("cut{from}{add}-{seed}-"));
        let cut_at = StdRng::seed_from_u64(seed).gen_range(1..total);
        array
            .start_reshape_adding(target, handles(&ms)[members..].to_vec())
            .expect("start");
        let before: u64 = ms.iter().map(|m| m.counts().writes).sum();
        // Wait for the cut point, then freeze every member at once.
        let deadline = Instant::now() + Duration::from_secs(60);
        while ms.iter().map(|m| m.counts().writes).sum::<u64>() - before < cut_at
            && array.reshape_counts().is_some()
        {
            assert!(
                Instant::now() < deadline,
                "seed {seed}: cut point not reached"
            );
            std::thread::yield_now();
        }
        let images = common::members::power_cut(&ms, seed);
        array.stop_background();
        drop(array);
        let cut = Superblock::read_from(images[0].0.as_ref())
            .expect("superblock")
            .0;
        if let Some(r) = &cut.reshape {
            mid_reshape += 1;
            staged += u64::from(r.staged.is_some());
        }
        let back = Arc::new(
            assemble(images, AssembleOptions::default())
                .unwrap_or_else(|e| panic!("seed {seed}: assemble after the cut: {e}"))
                .array,
        );
        back.start_background();
        wait_reshaped(&back);
        assert_eq!(back.data_geometry(), target, "seed {seed}");
        model.verify(
            &back,
            &format!("seed {seed} (cut after {cut_at} of {total} writes)"),
        );
        scrub_clean(&back);
    }
    (mid_reshape, staged)
}

#[test]
fn a_power_cut_anywhere_in_a_reshape_loses_nothing() {
    let (mid_reshape, staged) = power_cuts(Level::Raid1, 3, 0, Level::Raid5, 24);
    // The cuts fell inside the reshape, in both of a group's copies.
    eprintln!("{mid_reshape} of 24 cuts mid-reshape, {staged} with a group staged");
    assert!(
        mid_reshape >= 12,
        "only {mid_reshape} of 24 cuts fell mid-reshape"
    );
    assert!(
        staged >= 3,
        "only {staged} cuts fell while a group was staged"
    );
}

#[test]
fn a_power_cut_anywhere_in_a_restripe_onto_an_added_member_loses_nothing() {
    let (mid_reshape, staged) = power_cuts(Level::Raid5, 3, 1, Level::Raid5, 12);
    eprintln!("{mid_reshape} of 12 cuts mid-reshape, {staged} with a group staged");
    assert!(
        mid_reshape >= 6,
        "only {mid_reshape} of 12 cuts fell mid-reshape"
    );
    assert!(
        staged >= 2,
        "only {staged} cuts fell while a group was staged"
    );
}

#[test]
fn a_member_failing_mid_reshape_stops_it_until_the_array_is_whole_again() {
    let ms = common::members::faulty(3, MEMBER_SIZE, "failmid-");
    let array = new_array(Level::Raid1, &ms);
    let model = Model::fill(&array, 3, 41);
    array.set_speed_limits(Some(16 << 20), Some(16 << 20));
    array
        .start_reshape(target(&array, Level::Raid5))
        .expect("start");
    let (pending_at_start, _) = array.reshape_counts().expect("under way");
    let deadline = Instant::now() + Duration::from_secs(60);
    while array
        .reshape_counts()
        .is_some_and(|(p, _)| p == pending_at_start)
    {
        assert!(Instant::now() < deadline, "no group moved");
        std::thread::yield_now();
    }
    // A member dies with groups left to move.
    ms[1].pull();
    array.wait_background();
    let last = array.last_sync_result().expect("the reshape ended");
    assert_eq!(last.action, SyncAction::Reshape);
    assert!(!last.completed, "{}", last.message);
    assert!(array.is_degraded());
    let (pending, _) = array.reshape_counts().expect("still under way");
    assert!(pending > 0);
    model.verify(&array, "degraded, mid-reshape");
    let refused = array.resume_reshape();
    assert!(
        refused.is_err_and(|e| e.to_string().contains("degraded")),
        "a degraded array does not go on"
    );

    // A new member rebuilds; the reshape then goes on by itself.
    array.set_speed_limits(Some(0), Some(0));
    array.remove("m1").expect("remove the dead member");
    let fresh = FaultyMember::memory(MEMBER_SIZE, "fresh").expect("member");
    array
        .add(Arc::new(fresh) as Arc<dyn Member>, "fresh".into())
        .expect("add");
    wait_reshaped(&array);
    assert_eq!(array.level(), Level::Raid5);
    assert!(!array.is_degraded());
    model.verify(&array, "after the rebuild and the rest of the reshape");
    scrub_clean(&array);
}
