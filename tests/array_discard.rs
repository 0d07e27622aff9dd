//! Discarding freed space (`Array::discard`) on in-memory members: what is
//! given back reads as zeros, everything else keeps its bytes, parity and
//! copies agree afterwards (a check finds nothing), and the data survives
//! the loss of as many members as the level tolerates. Members that cannot
//! discard leave everything as it was.

mod common;

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use common::members::{faulty, handles, read_after_crash};
use raidfs::array::{create, Array, CreateSpec, GROUP_SHIFT};
use raidfs::geometry::{Layout, Level};
use raidfs::member::faulty::FaultyMember;
use raidfs::member::Member;
use raidfs::superblock::GroupProfile;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const MEMBER_SIZE: u64 = 48 << 20;
const SPAN: usize = 4 << 20;

fn spec(level: Level, chunk: u64, copies: usize, layout: Layout) -> CreateSpec {
    CreateSpec {
        level,
        layout,
        chunk,
        copies,
        name: "discard".into(),
        ppl: false,
    }
}

fn configs() -> Vec<(Level, usize, u64, usize, Layout)> {
    vec![
        (Level::Raid0, 3, 16 << 10, 1, Layout::LeftSymmetric),
        (Level::Raid1, 2, 64 << 10, 2, Layout::LeftSymmetric),
        (Level::Raid1, 3, 64 << 10, 3, Layout::LeftSymmetric),
        (Level::Raid5, 3, 16 << 10, 1, Layout::LeftSymmetric),
        (Level::Raid5, 4, 64 << 10, 1, Layout::LeftSymmetric),
        (Level::Raid5, 5, 8 << 10, 1, Layout::RightAsymmetric),
        (Level::Raid6, 4, 16 << 10, 1, Layout::LeftSymmetric),
        (Level::Raid6, 6, 32 << 10, 1, Layout::LeftSymmetric),
        (Level::Raid10, 4, 16 << 10, 2, Layout::LeftSymmetric),
        (Level::Raid10, 3, 16 << 10, 2, Layout::LeftSymmetric),
    ]
}

/// A running array over `members`, a data group allocated; its first address.
fn running(members: Vec<(Arc<dyn Member>, String)>, spec: &CreateSpec) -> (Arc<Array>, u64) {
    let array = Arc::new(create(members, spec).expect("create"));
    array.start_background();
    let group = array
        .allocate_group(GroupProfile::Data)
        .expect("data group");
    (array, (group as u64) << GROUP_SHIFT)
}

fn fill(array: &Array, base: u64, seed: u64) -> Vec<u8> {
    let mut rng = StdRng::seed_from_u64(seed);
    let data: Vec<u8> = (0..SPAN).map(|_| rng.gen()).collect();
    array.write(base, &data).expect("write");
    data
}

fn check_is_clean(array: &Array, what: &str) {
    array.start_check(false).expect("check");
    array.wait_background();
    let check = array.last_sync_result().expect("check result");
    assert!(check.completed, "{what}: {check:?}");
    assert_eq!(check.mismatches, 0, "{what}: copies or parity disagree");
}

#[test]
fn discarded_ranges_read_as_zeros_and_every_level_stays_consistent() {
    for (i, &(level, members, chunk, copies, layout)) in configs().iter().enumerate() {
        let what = format!("{level:?} over {members} members, chunk {chunk}");
        let ms = faulty(members, MEMBER_SIZE, "disc");
        let (array, base) = running(handles(&ms), &spec(level, chunk, copies, layout));
        let mut reference = fill(&array, base, i as u64);
        let stripe = array.data_geometry().stripe_bytes();
        // Unaligned at both ends: parity levels give back only the whole
        // stripes inside, the others every byte.
        let (off, len) = (stripe as usize * 3 + 4096, stripe as usize * 9 + 12288);
        let given = array
            .discard(base + off as u64, len as u64)
            .expect("discard");
        let (lo, hi) = if matches!(level, Level::Raid5 | Level::Raid6) {
            let s = stripe as usize;
            (off.div_ceil(s) * s, (off + len) / s * s)
        } else {
            (off, off + len)
        };
        assert_eq!(given, (hi - lo) as u64, "{what}: bytes given back");
        reference[lo..hi].fill(0);
        let mut back = vec![0u8; SPAN];
        array.read(base, &mut back).expect("read");
        assert!(back == reference, "{what}: bytes after the discard");
        check_is_clean(&array, &what);

        // Later writes into and around the discarded stripes keep parity right.
        let patch: Vec<u8> = (0..3 * stripe as usize).map(|b| (b % 251) as u8).collect();
        let at = lo + stripe as usize / 2;
        array.write(base + at as u64, &patch).expect("write after");
        reference[at..at + patch.len()].copy_from_slice(&patch);
        array.flush().expect("flush");
        check_is_clean(&array, &what);

        let tolerance = array.data_geometry().tolerance();
        drop(array);
        for first in 0..members {
            let mut pulled: Vec<usize> = (first..first + tolerance).map(|m| m % members).collect();
            pulled.sort_unstable();
            pulled.dedup();
            let back = read_after_crash(&ms, &pulled, base, SPAN);
            assert!(back == reference, "{what}: wrong data without {pulled:?}");
        }
    }
}

/// A member that delegates everything but discards: `can` says whether it
/// claims to discard; when it claims to, each discard is refused as
/// unsupported while `refuse` is set.
struct Discards {
    inner: Arc<dyn Member>,
    can: bool,
    refuse: AtomicBool,
}

impl Member for Discards {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.inner.write_at(buf, offset)
    }
    fn sync(&self) -> io::Result<()> {
        self.inner.sync()
    }
    fn len(&self) -> u64 {
        self.inner.len()
    }
    fn name(&self) -> String {
        self.inner.name()
    }
    fn can_discard(&self) -> bool {
        self.can
    }
    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        if !self.can || self.refuse.load(Ordering::Acquire) {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "no discard here",
            ));
        }
        self.inner.discard(offset, len)
    }
}

fn with_odd_member(ms: &[FaultyMember], can: bool) -> Vec<(Arc<dyn Member>, String)> {
    let mut members = handles(ms);
    let (inner, name) = members.pop().expect("a member");
    members.push((
        Arc::new(Discards {
            inner,
            can,
            refuse: AtomicBool::new(can),
        }) as Arc<dyn Member>,
        name,
    ));
    members
}

#[test]
fn nothing_is_discarded_when_a_member_cannot() {
    for level in [Level::Raid1, Level::Raid5, Level::Raid6] {
        let ms = faulty(4, MEMBER_SIZE, "disc");
        let copies = if level == Level::Raid1 { 4 } else { 1 };
        let spec = spec(level, 16 << 10, copies, Layout::LeftSymmetric);
        let (array, base) = running(with_odd_member(&ms, false), &spec);
        let reference = fill(&array, base, 7);
        let given = array.discard(base, SPAN as u64).expect("discard");
        assert_eq!(given, 0, "{level:?}: a member cannot discard");
        let mut back = vec![0u8; SPAN];
        array.read(base, &mut back).expect("read");
        assert!(back == reference, "{level:?}: data changed");
    }
}

#[test]
fn a_member_refusing_part_way_leaves_a_resync_that_makes_parity_agree() {
    for level in [Level::Raid5, Level::Raid6] {
        let what = format!("{level:?}");
        let ms = faulty(5, MEMBER_SIZE, "disc");
        let spec = spec(level, 16 << 10, 1, Layout::LeftSymmetric);
        let (array, base) = running(with_odd_member(&ms, true), &spec);
        let mut reference = fill(&array, base, 11);
        let given = array.discard(base, SPAN as u64).expect("discard");
        let g = array.data_geometry();
        let whole = SPAN as u64 / g.stripe_bytes() * g.stripe_bytes();
        assert_eq!(given, whole, "{what}: whole stripes");
        // The refusing member kept its bytes; the others read zeros, which
        // a resync of the suspect range turns into consistent stripes.
        array.flush().expect("flush starts the resync");
        array.wait_background();
        check_is_clean(&array, &what);
        let mut back = vec![0u8; SPAN];
        array.read(base, &mut back).expect("read");
        let last = ms.len() - 1;
        // Every data chunk of the whole stripes reads zeros but those the
        // refusing member holds.
        for (at, byte) in back.iter().enumerate() {
            let map = g.map(at as u64);
            let expect = if map.targets[0].member == last || at as u64 >= whole {
                reference[at]
            } else {
                0
            };
            assert_eq!(*byte, expect, "{what}: byte {at}");
        }
        reference.copy_from_slice(&back);
        array.flush().expect("flush");
        let tolerance = g.tolerance();
        drop(array);
        for first in 0..ms.len() - 1 {
            let pulled: Vec<usize> = (first..first + tolerance).collect();
            let back = read_after_crash(&ms, &pulled, base, SPAN);
            assert!(back == reference, "{what}: wrong data without {pulled:?}");
        }
    }
}
