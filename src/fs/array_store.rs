//! The array engine as the filesystem's [`BlockStore`].

use super::store::{BlockStore, GroupInfo, GroupKind, StoreError, GROUP_SHIFT};
use super::{FileSystem, FormatOptions, FsResult};
use crate::array::{Array, ArrayError};
use crate::superblock::GroupProfile;
use std::sync::Arc;

const _: () = assert!(GROUP_SHIFT == crate::array::GROUP_SHIFT);

/// Wraps an assembled array.
pub struct ArrayStore {
    array: Arc<Array>,
}

impl ArrayStore {
    pub fn new(array: Arc<Array>) -> ArrayStore {
        ArrayStore { array }
    }

    pub fn array(&self) -> &Arc<Array> {
        &self.array
    }

    /// What the filesystem needs of allocated group `index`, in the
    /// geometry it has now (a reshape may have moved it to another).
    fn info(&self, index: u32, profile: GroupProfile) -> Option<GroupInfo> {
        let kind = match profile {
            GroupProfile::Metadata => GroupKind::Metadata,
            GroupProfile::Data => GroupKind::Data,
            GroupProfile::Unallocated => return None,
        };
        let geometry = self.array.group_geometry(index)?;
        Some(GroupInfo {
            index,
            kind,
            capacity: self.array.allocated_group_capacity(index),
            stripe_bytes: geometry.stripe_bytes(),
        })
    }
}

fn store_error(e: ArrayError) -> StoreError {
    match e {
        ArrayError::OutOfRange(addr) => StoreError::OutOfRange(addr),
        ArrayError::NoSpace => StoreError::NoSpace,
        ArrayError::Unrecoverable(addr) => StoreError::Unrecoverable(addr),
        ArrayError::Failed(why) => StoreError::ReadOnly(format!("array has failed: {why}")),
        ArrayError::HostNoSpace(why) => StoreError::HostNoSpace(why),
        ArrayError::HostFault { read_only, why } => StoreError::HostFault { read_only, why },
        other => StoreError::Io(other.to_string()),
    }
}

impl BlockStore for ArrayStore {
    fn set_content_judge(&self, judge: std::sync::Weak<dyn crate::array::ContentJudge>) {
        self.array.set_content_judge(judge);
    }

    fn read(
        &self,
        addr: u64,
        buf: &mut [u8],
        verify: Option<&dyn Fn(&[u8]) -> bool>,
    ) -> Result<(), StoreError> {
        match verify {
            Some(v) => self.array.read_verified(addr, buf, v),
            None => self.array.read(addr, buf),
        }
        .map_err(store_error)
    }

    fn scrub_read(
        &self,
        addr: u64,
        buf: &mut [u8],
        verify: &dyn Fn(&[u8]) -> bool,
        repair: bool,
    ) -> Result<Vec<String>, StoreError> {
        self.array
            .scrub_verified(addr, buf, verify, repair)
            .map(|bad| bad.into_iter().map(|b| b.member).collect())
            .map_err(store_error)
    }

    fn write(&self, addr: u64, data: &[u8]) -> Result<(), StoreError> {
        self.array.write(addr, data).map_err(store_error)
    }

    fn flush(&self) -> Result<(), StoreError> {
        self.array.flush().map_err(store_error)
    }

    fn discard(&self, addr: u64, len: u64) -> Result<u64, StoreError> {
        self.array.discard(addr, len).map_err(store_error)
    }

    fn groups(&self) -> Vec<GroupInfo> {
        self.array
            .groups()
            .into_iter()
            .filter_map(|(i, p)| self.info(i, p))
            .collect()
    }

    fn allocate_group(&self, kind: GroupKind) -> Result<GroupInfo, StoreError> {
        let profile = match kind {
            GroupKind::Metadata => GroupProfile::Metadata,
            GroupKind::Data => GroupProfile::Data,
        };
        let index = self.array.allocate_group(profile).map_err(store_error)?;
        self.info(index, profile).ok_or(StoreError::NoSpace)
    }

    fn free_groups(&self) -> (u64, u64) {
        (
            self.array.free_group_count() as u64,
            self.array.group_capacity(GroupProfile::Data),
        )
    }
}

/// Write an empty filesystem onto a freshly created array.
pub fn format_array(array: Arc<Array>, opts: &FormatOptions) -> FsResult<()> {
    FileSystem::format_with(Arc::new(ArrayStore::new(array)), opts)
}
