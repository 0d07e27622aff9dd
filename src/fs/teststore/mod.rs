//! Block stores for testing the filesystem without an array underneath.
//!
//! Built only for tests and with the `testing` feature: the product reaches
//! storage through the array ([`super::ArrayStore`]) alone.
//!
//! - [`MemStore`]: groups held in memory; what most filesystem tests run on.
//! - [`CrashStore`]: a store that can lose power. Its groups live on one
//!   fault-injecting member ([`crate::member::faulty::FaultyMember`]), which
//!   keeps the writes since the last flush and builds the image a power cut
//!   could leave, so a crash image has one implementation for members and
//!   stores alike.
//! - [`MirrorStore`]: two copies, for tests that corrupt one (or both).
//! - [`HookedStore`]: a [`MemStore`] that calls a hook before each write (which may fail it).

mod crash;
mod mem;
mod wrappers;

pub use crash::CrashStore;
pub use mem::{MemStore, DISCARD_POISON};
pub use wrappers::{HookedStore, MirrorStore};

use super::store::{GroupInfo, GroupKind, StoreError, Verify, GROUP_SHIFT};

/// Group index and offset in the group of logical address `addr`.
fn locate(addr: u64) -> (usize, usize) {
    (
        (addr >> GROUP_SHIFT) as usize,
        (addr & ((1u64 << GROUP_SHIFT) - 1)) as usize,
    )
}

/// The groups a test store can hand out: how many, and the capacity and
/// stripe of each (all alike).
#[derive(Clone, Copy)]
struct Shape {
    total_groups: u32,
    group_capacity: u64,
    stripe_bytes: u64,
}

impl Shape {
    /// The group that follows `allocated` ones, or `NoSpace`.
    fn next_group(&self, allocated: usize, kind: GroupKind) -> Result<GroupInfo, StoreError> {
        let index = u32::try_from(allocated)
            .ok()
            .filter(|&i| i < self.total_groups)
            .ok_or(StoreError::NoSpace)?;
        Ok(GroupInfo {
            index,
            kind,
            capacity: self.group_capacity,
            stripe_bytes: self.stripe_bytes,
        })
    }

    /// [`super::BlockStore::free_groups`] with `allocated` groups taken.
    fn free_groups(&self, allocated: usize) -> (u64, u64) {
        (
            u64::from(self.total_groups).saturating_sub(allocated as u64),
            self.group_capacity,
        )
    }
}

/// A read's outcome once `verify` (if any) has judged the bytes in `buf`;
/// a test store has no other copy to try.
fn verified(addr: u64, buf: &[u8], verify: Option<Verify<'_>>) -> Result<(), StoreError> {
    match verify {
        Some(ok) if !ok(buf) => Err(StoreError::Unrecoverable(addr)),
        _ => Ok(()),
    }
}
