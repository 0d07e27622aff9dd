//! Resync after an unclean shutdown: make every allocated stripe's parity (or
//! every mirror copy) agree again, so a later degraded read cannot rebuild
//! from stale parity. Only allocated groups are touched.

use super::{Array, ArrayResult};
use crate::geometry::Level;
use crate::superblock::GroupProfile;

/// Bytes handled per step; large sequential member I/O.
const STEP: u64 = 4 << 20;

impl Array {
    /// Rewrite redundancy of every allocated group from its data. Data is
    /// read through the normal path, then written back through it, which
    /// recomputes parity and refreshes every copy.
    pub fn resync(&self) -> ArrayResult<()> {
        let groups = self.groups();
        log::info!("resync of {} allocated groups after an unclean shutdown", groups.len());
        let mut buf = Vec::new();
        for (group, profile) in groups {
            let capacity = self.group_capacity(profile);
            let geometry = if profile == GroupProfile::Metadata { self.meta_geometry } else { self.data_geometry };
            if geometry.level == Level::Raid0 {
                continue;
            }
            let step = STEP - STEP % geometry.stripe_bytes().max(1);
            let mut offset = 0;
            while offset < capacity {
                let len = step.min(capacity - offset) as usize;
                buf.resize(len, 0);
                let addr = ((group as u64) << super::GROUP_SHIFT) | offset;
                self.read(addr, &mut buf)?;
                self.write(addr, &buf)?;
                offset += len as u64;
            }
        }
        self.flush()
    }
}
