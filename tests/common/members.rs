//! Fault-injecting in-memory members for the array-level tests, the
//! `(member, name)` pairs `create` and `assemble` take, and the array a power
//! cut leaves of them.

use raidfs::array::{assemble, AssembleOptions};
use raidfs::member::faulty::FaultyMember;
use raidfs::member::Member;
use std::sync::Arc;

/// `n` in-memory members of `size` bytes, named `{prefix}{i}`.
pub fn faulty(n: usize, size: u64, prefix: &str) -> Vec<FaultyMember> {
    (0..n)
        .map(|i| FaultyMember::memory(size, &format!("{prefix}{i}")).expect("memory member"))
        .collect()
}

/// Each member (sharing its faults) with the name `m{i}`.
pub fn handles(ms: &[FaultyMember]) -> Vec<(Arc<dyn Member>, String)> {
    ms.iter()
        .enumerate()
        .map(|(i, m)| (Arc::new(m.clone()) as Arc<dyn Member>, format!("m{i}")))
        .collect()
}

/// Each member (sharing its faults) under its own name.
pub fn named(ms: &[FaultyMember]) -> Vec<(Arc<dyn Member>, String)> {
    ms.iter()
        .map(|m| (Arc::new(m.clone()) as Arc<dyn Member>, m.name()))
        .collect()
}

/// What a power cut now leaves of every member but those at `lost`: each
/// one's synced data (`crash_image`), under its own name.
pub fn crash_images(ms: &[FaultyMember], lost: &[usize]) -> Vec<(Arc<dyn Member>, String)> {
    ms.iter()
        .enumerate()
        .filter(|(i, _)| !lost.contains(i))
        .map(|(_, m)| {
            let image = m.crash_image().expect("crash image");
            let name = image.name();
            (Arc::new(image) as Arc<dyn Member>, name)
        })
        .collect()
}

/// What a power cut at this instant leaves of every member, taken at one
/// instant (their writes held meanwhile): each one's synced data plus a
/// random part of its later writes, chosen by `seed` (`crash_image_random`).
pub fn power_cut(ms: &[FaultyMember], seed: u64) -> Vec<(Arc<dyn Member>, String)> {
    ms.iter().for_each(FaultyMember::hold_writes);
    let images = ms
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let image = m.crash_image_random(seed * 31 + i as u64).expect("image");
            let name = image.name();
            (Arc::new(image) as Arc<dyn Member>, name)
        })
        .collect();
    ms.iter().for_each(FaultyMember::release_writes);
    images
}

/// Assemble [`crash_images`] of every member but those at `lost` (which
/// must be the slots the array then misses) and read `len` bytes at `base`.
pub fn read_after_crash(ms: &[FaultyMember], lost: &[usize], base: u64, len: usize) -> Vec<u8> {
    let degraded = assemble(crash_images(ms, lost), AssembleOptions::default())
        .expect("assemble")
        .array;
    assert_eq!(degraded.failed_slots(), lost);
    let mut back = vec![0u8; len];
    degraded.read(base, &mut back).expect("degraded read");
    back
}
