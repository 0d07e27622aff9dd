//! What the filesystem needs from storage: a five-method backend trait over
//! the array's logical space. The array implements it ([`super::ArrayStore`]);
//! tests use the in-memory stores of `teststore` (the `testing` feature).
//!
//! Logical addresses are `(group << GROUP_SHIFT) | offset_in_group`.

/// Bits of a logical address that hold the offset within a group.
pub const GROUP_SHIFT: u32 = 40;

pub fn group_addr(group: u32, offset: u64) -> u64 {
    ((group as u64) << GROUP_SHIFT) | offset
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GroupKind {
    /// Mirrored; holds the filesystem's own metadata and journal.
    Metadata,
    /// File data, at the array's RAID level.
    Data,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GroupInfo {
    pub index: u32,
    pub kind: GroupKind,
    /// Logical bytes the group holds.
    pub capacity: u64,
    /// Logical bytes of one full stripe; extents aligned to it avoid
    /// read-modify-write on parity levels.
    pub stripe_bytes: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("I/O error: {0}")]
    Io(String),
    #[error("address {0:#x} is outside any allocated group")]
    OutOfRange(u64),
    #[error("no unallocated group left")]
    NoSpace,
    #[error("no copy of the block at {0:#x} passes its checksum")]
    Unrecoverable(u64),
    #[error("array is read-only: {0}")]
    ReadOnly(String),
    /// The host refused the write (out of space, or every member failing
    /// at once); the array is intact and the write can be done again later.
    #[error("{0}")]
    HostNoSpace(String),
    #[error("{why}")]
    HostFault { read_only: bool, why: String },
}

impl StoreError {
    /// Whether the store may take the same write later (the host's fault,
    /// not the data's or the array's): the filesystem keeps what it could
    /// not write instead of giving up.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            StoreError::HostNoSpace(_) | StoreError::HostFault { .. }
        )
    }
}

/// A checksum test a read result must pass (see [`BlockStore::read`]).
pub type Verify<'a> = &'a dyn Fn(&[u8]) -> bool;

/// Storage for the filesystem.
pub trait BlockStore: Send + Sync {
    /// Read `buf.len()` bytes at logical `addr`. When `verify` is given, a
    /// result it rejects is retried from every other copy or reconstruction
    /// (and the bad copy rewritten); if none passes, `Unrecoverable`.
    fn read(&self, addr: u64, buf: &mut [u8], verify: Option<Verify<'_>>)
        -> Result<(), StoreError>;
    /// Scrub `[addr, addr + buf.len())`: like `read` with `verify`, but every
    /// copy is checked (not only the one a read would use), and with `repair`
    /// false nothing is rewritten. Returns the names of the members that held
    /// a copy failing `verify`. Stores without redundancy check the one copy.
    fn scrub_read(
        &self,
        addr: u64,
        buf: &mut [u8],
        verify: Verify<'_>,
        repair: bool,
    ) -> Result<Vec<String>, StoreError> {
        let _ = repair;
        self.read(addr, buf, Some(verify)).map(|()| Vec::new())
    }
    /// Write `data` at logical `addr` on every copy / with parity.
    fn write(&self, addr: u64, data: &[u8]) -> Result<(), StoreError>;
    /// Durability barrier: every completed write is on stable storage on every member.
    fn flush(&self) -> Result<(), StoreError>;
    /// The allocated groups.
    fn groups(&self) -> Vec<GroupInfo>;
    /// Allocate a new group of `kind`.
    fn allocate_group(&self, kind: GroupKind) -> Result<GroupInfo, StoreError>;
    /// Unallocated groups left, and the data capacity one more data group would add.
    fn free_groups(&self) -> (u64, u64);
    /// Give logical `[addr, addr + len)`, which the filesystem has freed
    /// durably, back to the storage underneath (see `Array::discard`).
    /// Returns the bytes given back; 0 when the store cannot now, which
    /// costs nothing but host space. What a discarded range reads as
    /// afterwards is unspecified: the filesystem never reads a block it has
    /// not written since allocating it.
    fn discard(&self, addr: u64, len: u64) -> Result<u64, StoreError> {
        let _ = (addr, len);
        Ok(0)
    }
    /// Let the store's own repairs (resync, scrub) ask the filesystem which
    /// version of a block is right. Stores that repair nothing ignore it.
    fn set_content_judge(&self, judge: std::sync::Weak<dyn crate::array::ContentJudge>) {
        let _ = judge;
    }
}
