//! Stores that wrap [`MemStore`]s to test the filesystem's failure handling:
//!
//! - [`MirrorStore`] keeps two copies like the array's mirrored Metadata
//!   groups and honours `verify` by falling back to the other copy, so a test
//!   can corrupt one copy (or both).
//! - [`HookedStore`] calls a hook before each write, to record or hold it.

use super::MemStore;
use crate::fs::store::{BlockStore, GroupInfo, GroupKind, StoreError, Verify};

/// Two full copies; reads that `verify` rejects fall back to the other copy
/// and repair the bad one, as the array does for Metadata groups.
pub struct MirrorStore {
    copies: [MemStore; 2],
}

impl MirrorStore {
    pub fn new(total_groups: u32, group_capacity: u64, stripe_bytes: u64) -> MirrorStore {
        MirrorStore {
            copies: [
                MemStore::new(total_groups, group_capacity, stripe_bytes),
                MemStore::new(total_groups, group_capacity, stripe_bytes),
            ],
        }
    }

    /// Flip every byte of `[addr, addr+len)` in one copy.
    pub fn corrupt(&self, copy: usize, addr: u64, len: usize) -> Result<(), StoreError> {
        let mut buf = vec![0u8; len];
        self.copies[copy].read(addr, &mut buf, None)?;
        for b in &mut buf {
            *b = !*b;
        }
        self.copies[copy].write(addr, &buf)
    }
}

impl BlockStore for MirrorStore {
    fn read(
        &self,
        addr: u64,
        buf: &mut [u8],
        verify: Option<Verify<'_>>,
    ) -> Result<(), StoreError> {
        self.copies[0].read(addr, buf, None)?;
        let Some(ok) = verify else { return Ok(()) };
        if ok(buf) {
            return Ok(());
        }
        self.copies[1].read(addr, buf, None)?;
        if ok(buf) {
            self.copies[0].write(addr, buf)?;
            return Ok(());
        }
        Err(StoreError::Unrecoverable(addr))
    }

    fn write(&self, addr: u64, data: &[u8]) -> Result<(), StoreError> {
        self.copies[0].write(addr, data)?;
        self.copies[1].write(addr, data)
    }

    fn flush(&self) -> Result<(), StoreError> {
        Ok(())
    }

    fn groups(&self) -> Vec<GroupInfo> {
        self.copies[0].groups()
    }

    fn allocate_group(&self, kind: GroupKind) -> Result<GroupInfo, StoreError> {
        let info = self.copies[0].allocate_group(kind)?;
        self.copies[1].allocate_group(kind)?;
        Ok(info)
    }

    fn free_groups(&self) -> (u64, u64) {
        self.copies[0].free_groups()
    }
}

/// Called with the address and bytes of each write before it is done; an
/// error fails that write instead.
type WriteHook = Box<dyn Fn(u64, &[u8]) -> Result<(), StoreError> + Send + Sync>;

/// A [`MemStore`] that calls a hook before every write: to record the
/// writes, to hold them until a test lets them go, or to fail them.
pub struct HookedStore {
    inner: MemStore,
    before_write: WriteHook,
}

impl HookedStore {
    pub fn new(inner: MemStore, before_write: impl Fn(u64, &[u8]) + Send + Sync + 'static) -> Self {
        HookedStore::fallible(inner, move |addr, data| {
            before_write(addr, data);
            Ok(())
        })
    }

    /// As [`HookedStore::new`], with a hook that may fail the write.
    pub fn fallible(
        inner: MemStore,
        before_write: impl Fn(u64, &[u8]) -> Result<(), StoreError> + Send + Sync + 'static,
    ) -> Self {
        HookedStore {
            inner,
            before_write: Box::new(before_write),
        }
    }
}

impl BlockStore for HookedStore {
    fn read(
        &self,
        addr: u64,
        buf: &mut [u8],
        verify: Option<Verify<'_>>,
    ) -> Result<(), StoreError> {
        self.inner.read(addr, buf, verify)
    }

    fn write(&self, addr: u64, data: &[u8]) -> Result<(), StoreError> {
        (self.before_write)(addr, data)?;
        self.inner.write(addr, data)
    }

    fn flush(&self) -> Result<(), StoreError> {
        self.inner.flush()
    }

    fn groups(&self) -> Vec<GroupInfo> {
        self.inner.groups()
    }

    fn allocate_group(&self, kind: GroupKind) -> Result<GroupInfo, StoreError> {
        self.inner.allocate_group(kind)
    }

    fn free_groups(&self) -> (u64, u64) {
        self.inner.free_groups()
    }
}
