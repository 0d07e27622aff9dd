//! Fault-injecting in-memory members for the array-level tests, and the
//! `(member, name)` pairs `create` and `assemble` take.

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
