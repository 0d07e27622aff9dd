//! [`MemStore`]: the filesystem's groups held in memory, as plain vectors.
//!
//! It never loses a write and has no redundancy; discarded bytes are
//! poisoned rather than zeroed, so a filesystem that reads what it freed
//! (or frees what it still uses) sees the damage.

use parking_lot::Mutex;

use super::{locate, verified, Shape};
use crate::fs::store::{BlockStore, GroupInfo, GroupKind, StoreError, Verify};

/// An in-memory store with a fixed number of groups, for tests.
pub struct MemStore {
    shape: Shape,
    state: Mutex<MemState>,
}

struct MemState {
    groups: Vec<(GroupInfo, Vec<u8>)>,
    discarded: u64,
}

/// What [`MemStore`] fills discarded bytes with: not zeros, so that a
/// filesystem that reads a block it freed, or discards a block still in
/// use, sees the damage.
pub const DISCARD_POISON: u8 = 0xdb;

impl MemStore {
    pub fn new(total_groups: u32, group_capacity: u64, stripe_bytes: u64) -> MemStore {
        MemStore {
            shape: Shape {
                total_groups,
                group_capacity,
                stripe_bytes,
            },
            state: Mutex::new(MemState {
                groups: Vec::new(),
                discarded: 0,
            }),
        }
    }

    /// Bytes discarded so far.
    pub fn discarded_bytes(&self) -> u64 {
        self.state.lock().discarded
    }
}

impl BlockStore for MemStore {
    fn read(
        &self,
        addr: u64,
        buf: &mut [u8],
        verify: Option<Verify<'_>>,
    ) -> Result<(), StoreError> {
        let (g, off) = locate(addr);
        let st = self.state.lock();
        let (_, bytes) = st.groups.get(g).ok_or(StoreError::OutOfRange(addr))?;
        let src = bytes
            .get(off..off + buf.len())
            .ok_or(StoreError::OutOfRange(addr))?;
        buf.copy_from_slice(src);
        verified(addr, buf, verify)
    }

    fn write(&self, addr: u64, data: &[u8]) -> Result<(), StoreError> {
        let (g, off) = locate(addr);
        let mut st = self.state.lock();
        let (_, bytes) = st.groups.get_mut(g).ok_or(StoreError::OutOfRange(addr))?;
        let dst = bytes
            .get_mut(off..off + data.len())
            .ok_or(StoreError::OutOfRange(addr))?;
        dst.copy_from_slice(data);
        Ok(())
    }

    fn flush(&self) -> Result<(), StoreError> {
        Ok(())
    }

    fn discard(&self, addr: u64, len: u64) -> Result<u64, StoreError> {
        let (g, off) = locate(addr);
        let mut st = self.state.lock();
        let (_, bytes) = st.groups.get_mut(g).ok_or(StoreError::OutOfRange(addr))?;
        let n = usize::try_from(len).map_err(|_| StoreError::OutOfRange(addr))?;
        bytes
            .get_mut(off..off + n)
            .ok_or(StoreError::OutOfRange(addr))?
            .fill(DISCARD_POISON);
        st.discarded += len;
        Ok(len)
    }

    fn groups(&self) -> Vec<GroupInfo> {
        self.state
            .lock()
            .groups
            .iter()
            .map(|(info, _)| *info)
            .collect()
    }

    fn allocate_group(&self, kind: GroupKind) -> Result<GroupInfo, StoreError> {
        let mut st = self.state.lock();
        let info = self.shape.next_group(st.groups.len(), kind)?;
        st.groups
            .push((info, vec![0u8; self.shape.group_capacity as usize]));
        Ok(info)
    }

    fn free_groups(&self) -> (u64, u64) {
        self.shape.free_groups(self.state.lock().groups.len())
    }
}
