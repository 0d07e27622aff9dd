//! The RAID5 write hole: a crash in the middle of a partial-stripe write,
//! followed by the loss of a member, must not corrupt data that was not
//! being written. With the partial parity log it does not; without it, the
//! same crash images show the hole (so the test can tell the difference).

mod common;

use common::members::{faulty, named};
use raidfs::array::{assemble, create, AssembleOptions, CreateSpec, GROUP_SHIFT};
use raidfs::geometry::{Layout, Level};
use raidfs::member::Member;
use raidfs::superblock::GroupProfile;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::sync::Arc;

const CHUNK: u64 = 16 << 10;

fn random(seed: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    StdRng::seed_from_u64(seed).fill(&mut v[..]);
    v
}

/// Crash during partial writes to stripe 3 (`writes`: offset within the
/// stripe and length), lose the member of data chunk `lost_chunk` (never
/// written), and report whether that chunk still reads back as it was.
fn survives(ppl: bool, writes: &[(u64, usize)], lost_chunk: usize, seed: u64) -> bool {
    let ms = faulty(4, 24 << 20, "w");
    let handles = named(&ms);
    let spec = CreateSpec {
        level: Level::Raid5,
        layout: Layout::LeftSymmetric,
        chunk: CHUNK,
        copies: 1,
        name: "wh".into(),
        ppl,
    };
    let array = create(handles, &spec).expect("create");
    let base = (array.allocate_group(GroupProfile::Data).expect("group") as u64) << GROUP_SHIFT;
    let original = random(seed, 1 << 20);
    array.write(base, &original).expect("fill");
    array.flush().expect("flush");
    array.mark_dirty().expect("dirty");
    let stripe_bytes = 3 * CHUNK;
    for (n, &(at, len)) in writes.iter().enumerate() {
        array
            .write(
                base + 3 * stripe_bytes + at,
                &random(seed + 100 + n as u64, len),
            )
            .expect("partial write");
    }
    let lost = array.data_geometry().stripe_members(3).data[lost_chunk];
    drop(array);
    // Power cut: synced data plus a random part of the rest, maybe torn.
    let survivors: Vec<(Arc<dyn Member>, String)> = ms
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != lost)
        .map(|(i, m)| {
            // Each disk's cache loses its own random part of the writes.
            let image = m.crash_image_random(seed * 31 + i as u64).expect("image");
            (Arc::new(image) as Arc<dyn Member>, format!("w{i}"))
        })
        .collect();
    let array = assemble(
        survivors,
        AssembleOptions {
            force: !ppl,
            ..Default::default()
        },
    )
    .expect("assemble degraded")
    .array;
    let untouched = (3 * stripe_bytes + lost_chunk as u64 * CHUNK) as usize;
    let mut buf = vec![0u8; CHUNK as usize];
    array.read(base + untouched as u64, &mut buf).expect("read");
    buf == original[untouched..untouched + CHUNK as usize]
}

#[test]
fn partial_parity_log_closes_the_write_hole() {
    let rmw = [(1000, 6000)];
    let two_writes = [(1000, 6000), (2 * CHUNK + 1000, 6000)];
    let rcw = [(2 * CHUNK - 3000, 6000)];
    for seed in 0..10 {
        assert!(
            survives(true, &rmw, 1, seed),
            "read-modify-write, seed {seed}: untouched data corrupted"
        );
        assert!(
            survives(true, &two_writes, 1, seed),
            "two writes to one stripe, seed {seed}: untouched data corrupted"
        );
        assert!(
            survives(true, &rcw, 0, seed),
            "reconstruct-write, seed {seed}: untouched data corrupted"
        );
    }
}

#[test]
fn without_the_log_the_same_crashes_expose_the_hole() {
    let corrupted = (0..10)
        .filter(|&seed| !survives(false, &[(1000, 6000)], 1, seed))
        .count();
    assert!(
        corrupted > 0,
        "no crash image showed the write hole; the test would not notice a broken log"
    );
}

#[test]
fn dirty_degraded_raid5_without_the_log_needs_force() {
    let ms = faulty(3, 24 << 20, "d");
    let handles = named(&ms);
    let spec = CreateSpec {
        level: Level::Raid5,
        layout: Layout::LeftSymmetric,
        chunk: CHUNK,
        copies: 1,
        name: "d".into(),
        ppl: false,
    };
    let array = create(handles.clone(), &spec).expect("create");
    array.mark_dirty().expect("dirty");
    drop(array);
    let err = assemble(handles[..2].to_vec(), AssembleOptions::default())
        .err()
        .expect("refused");
    assert!(err.to_string().contains("--force"), "{err}");
}

/// A log entry is checksummed, not trusted: entries whose window is not
/// inside one chunk of a stripe of their group (a stripe far past the
/// group, a window running past its chunk) are ignored at recovery, and
/// the array's data reads back as it was.
#[test]
fn log_entries_outside_their_group_are_ignored() {
    use raidfs::array::ppl::{decode_ring, Ppl, PPL_OFFSET};
    use raidfs::superblock::DEFAULT_DATA_OFFSET;
    let ms = faulty(4, 24 << 20, "o");
    let handles = named(&ms);
    let spec = CreateSpec {
        level: Level::Raid5,
        layout: Layout::LeftSymmetric,
        chunk: CHUNK,
        copies: 1,
        name: "o".into(),
        ppl: true,
    };
    let array = create(handles.clone(), &spec).expect("create");
    let group = array.allocate_group(GroupProfile::Data).expect("group");
    let base = (group as u64) << GROUP_SHIFT;
    let original = random(5, 1 << 20);
    array.write(base, &original).expect("fill");
    array.flush().expect("flush");
    array.mark_dirty().expect("dirty");
    let geometry = array.data_geometry();
    drop(array);

    // Stripe 3's data chunk 1 is lost; both entries name other members.
    let lost = geometry.stripe_members(3).data[1];
    let far = 1u64 << 50;
    let epoch_of = |slot: usize| {
        let mut ring = vec![0u8; 1024];
        ms[slot].read_at(&mut ring, PPL_OFFSET).expect("ring");
        decode_ring(&ring).expect("ring header").0
    };
    let entries = [
        (far, 0u64, 512usize),
        (3, CHUNK - 100, 512), // runs 412 bytes past its chunk
    ];
    let log = Ppl::new(4, DEFAULT_DATA_OFFSET);
    for (stripe, lo, len) in entries {
        let members = geometry.stripe_members(stripe);
        let parity = members.p.expect("raid5 parity");
        assert!(parity != lost && members.data[0] != lost, "stripe {stripe}");
        log.resume(epoch_of(parity) - 1);
        let (offset, entry) = log
            .reserve(parity, group, stripe, lo, &[0], &vec![0xEE; len])
            .expect("room in the ring");
        ms[parity].write_at(&entry, offset).expect("write entry");
    }
    let survivors: Vec<(Arc<dyn Member>, String)> = handles
        .into_iter()
        .enumerate()
        .filter(|(i, _)| *i != lost)
        .map(|(_, h)| h)
        .collect();
    let array = assemble(survivors, AssembleOptions::default())
        .expect("assemble degraded")
        .array;
    let mut back = vec![0u8; original.len()];
    array.read(base, &mut back).expect("read");
    assert!(back == original, "a bogus log entry changed the data");
}

/// Run `f` on its own thread; panic if it has not returned within `limit`
/// (the thread is left behind: a deadlocked test ends with its process).
fn within<T: Send + 'static>(
    limit: std::time::Duration,
    what: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(limit) {
        Ok(v) => v,
        Err(_) => panic!("{what} did not finish within {limit:?}: deadlocked"),
    }
}

/// A RAID5 with the partial parity log and its background work started
/// (so partial-stripe writes gather in the stripe cache).
fn ppl_array_with_cache() -> (Arc<raidfs::array::Array>, u64) {
    let ms = faulty(4, 24 << 20, "c");
    let spec = CreateSpec {
        level: Level::Raid5,
        layout: Layout::LeftSymmetric,
        chunk: CHUNK,
        copies: 1,
        name: "pc".into(),
        ppl: true,
    };
    let array = Arc::new(create(named(&ms), &spec).expect("create"));
    let base = (array.allocate_group(GroupProfile::Data).expect("group") as u64) << GROUP_SHIFT;
    array.mark_dirty().expect("dirty");
    array.start_background();
    (array, base)
}

/// A cached stripe is written out under its stripe lock, marked as being
/// written out. When its log entry cannot be reserved (the stripe was
/// logged already in this epoch, or the ring is full) the log must make
/// room without a full flush, which would wait for that very write-out.
#[test]
fn cached_write_outs_that_fill_the_log_or_log_a_stripe_twice_complete() {
    let stripe_bytes = 3 * CHUNK;
    // Two runs in one cached stripe: the second run's entry finds the
    // stripe logged by the first.
    let (array, base) = ppl_array_with_cache();
    let a = Arc::clone(&array);
    within(
        std::time::Duration::from_secs(60),
        "a flush of one stripe with two runs",
        move || {
            a.write(base, &random(1, 4096)).expect("write");
            a.write(base + 8192, &random(2, 4096)).expect("write");
            a.flush().expect("flush");
        },
    );
    let mut back = vec![0u8; 12288];
    array.read(base, &mut back).expect("read");
    assert_eq!(&back[..4096], &random(1, 4096)[..]);
    assert_eq!(&back[8192..], &random(2, 4096)[..]);
    array.mark_clean().expect("clean");

    // More cached stripes than the ring has room for (about 200 entries).
    let (array, base) = ppl_array_with_cache();
    let a = Arc::clone(&array);
    let stripes = 300u64;
    within(
        std::time::Duration::from_secs(60),
        "a flush of more stripes than the log holds",
        move || {
            for s in 0..stripes {
                a.write(base + s * stripe_bytes, &random(100 + s, 4096))
                    .expect("write");
            }
            a.flush().expect("flush");
        },
    );
    for s in 0..stripes {
        let mut back = vec![0u8; 4096];
        array
            .read(base + s * stripe_bytes, &mut back)
            .expect("read");
        assert!(back == random(100 + s, 4096), "stripe {s}");
    }
    array.mark_clean().expect("clean");
}
