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
    .expect("assemble degraded");
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
