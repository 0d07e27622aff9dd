//! Room for metadata: how many node blocks the metadata tree has free, and
//! a bound on what the next checkpoint may write. Every metadata change is
//! admitted against it before it runs, so a change that would leave the
//! checkpoint no room gets ENOSPC before it is answered, instead of an
//! answered change that no checkpoint can make durable.
//!
//! A checkpoint writes each changed node anew before the nodes it replaces
//! are free (copy-on-write), so even a change that frees metadata (unlink,
//! rmdir, removexattr) needs room to be made durable: [`RESERVE_NODES`] are
//! kept for those, as btrfs keeps its global reserve.

use std::sync::atomic::{AtomicU64, Ordering};

/// Node blocks only changes that free metadata may use.
pub const RESERVE_NODES: u64 = 256;

/// Keys one operation changes, at most for all but huge files (an inode,
/// its parent, an entry, its cookie, the parent's next cookie, and a
/// margin).
const OP_KEYS: u64 = 8;

/// Published by the commit path (under the journal lock) and read by every
/// change, so admission never waits for a checkpoint being written.
#[derive(Debug)]
pub struct MetaRoom {
    /// Bound on the blocks the next checkpoint writes for the keys noted so far.
    need: AtomicU64,
    /// Free node blocks in the Metadata groups taken so far.
    free: AtomicU64,
    /// Blocks one more changed key may cost: a leaf-to-root path.
    per_key: AtomicU64,
    /// Node blocks a further Metadata group brings.
    group_blocks: u64,
}

impl MetaRoom {
    pub fn new(group_blocks: u64) -> MetaRoom {
        MetaRoom {
            need: AtomicU64::new(0),
            free: AtomicU64::new(0),
            per_key: AtomicU64::new(2),
            group_blocks,
        }
    }

    /// Take the tree's figures after a commit noted or wrote changes.
    pub fn update(&self, need: u64, free: u64, height: u8) {
        self.need.store(need, Ordering::Release);
        self.free.store(free, Ordering::Release);
        self.per_key.store(u64::from(height) + 2, Ordering::Release);
    }

    /// Blocks needed to make durable the changes so far, `pending_keys`
    /// not yet noted (the batch), and one more operation.
    fn needed(&self, pending_keys: u64) -> u64 {
        let per_key = self.per_key.load(Ordering::Acquire);
        self.need
            .load(Ordering::Acquire)
            .saturating_add((pending_keys.saturating_add(OP_KEYS)).saturating_mul(per_key))
    }

    /// Whether one more change fits: `unallocated` is the count of groups
    /// the store could still hand out (asked only when the free node
    /// blocks alone do not settle it). A change that frees metadata may use
    /// the reserve.
    pub fn admits(
        &self,
        pending_keys: u64,
        unallocated: impl FnOnce() -> u64,
        releasing: bool,
    ) -> bool {
        let want =
            self.needed(pending_keys)
                .saturating_add(if releasing { 0 } else { RESERVE_NODES });
        let free = self.free.load(Ordering::Acquire);
        free >= want || free.saturating_add(unallocated().saturating_mul(self.group_blocks)) >= want
    }

    /// Whether data may take one more of the last groups: only while the
    /// metadata could do without it, with room to spare (twice what it
    /// needs now), since data cannot give a group back.
    pub fn spares_a_group(&self, pending_keys: u64, unallocated: u64) -> bool {
        let want = self
            .needed(pending_keys)
            .saturating_add(RESERVE_NODES)
            .saturating_mul(2);
        let free = self.free.load(Ordering::Acquire);
        free.saturating_add(
            unallocated
                .saturating_sub(1)
                .saturating_mul(self.group_blocks),
        ) >= want
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changes_are_admitted_while_the_checkpoint_has_room() {
        let room = MetaRoom::new(1000);
        room.update(100, 500, 1);
        assert!(room.admits(10, || 0, false));
        // Free blocks alone do not hold it: the unallocated groups count.
        room.update(400, 500, 1);
        assert!(!room.admits(10, || 0, false));
        assert!(room.admits(10, || 1, false));
        // Within the reserve only a change that frees metadata is admitted.
        room.update(346, 500, 1);
        assert!(!room.admits(10, || 0, false));
        assert!(room.admits(10, || 0, true));
        // Data takes one of the last groups only with room to spare.
        room.update(100, 1000, 1);
        assert!(room.spares_a_group(0, 1));
        room.update(300, 1000, 1);
        assert!(!room.spares_a_group(0, 1));
        assert!(room.spares_a_group(0, 2));
    }
}
