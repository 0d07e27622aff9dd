//! [`CrashStore`]: a store that can lose power, for crash-consistency tests.
//!
//! The groups lie one after another on a single [`FaultyMember`] over
//! memory, and a flush is that member's sync. The member keeps every write
//! since its last sync, so [`CrashStore::crash`] is the member's crash image
//! (everything flushed, plus a seeded random subset of the later writes, each
//! possibly torn at 512-byte sectors): one implementation of "what a power
//! cut leaves" serves members and stores alike. What this store adds is the
//! groups and a write budget, after which every write and flush fails: power
//! lost in the middle of an operation.

use std::io;

use parking_lot::Mutex;

use super::{locate, verified, Shape};
use crate::fs::store::{BlockStore, GroupInfo, GroupKind, StoreError, Verify};
use crate::member::faulty::FaultyMember;
use crate::member::memory::MemoryMember;
use crate::member::Member;

pub struct CrashStore {
    shape: Shape,
    /// The groups' bytes: group `g` at offset `g * group_capacity`.
    device: FaultyMember,
    state: Mutex<CrashState>,
}

struct CrashState {
    infos: Vec<GroupInfo>,
    /// Writes accepted so far.
    writes: u64,
    /// The count of accepted writes at which power is lost.
    power_lost_at: Option<u64>,
}

impl CrashStore {
    pub fn new(
        total_groups: u32,
        group_capacity: u64,
        stripe_bytes: u64,
    ) -> io::Result<CrashStore> {
        let size = u64::from(total_groups)
            .checked_mul(group_capacity)
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{total_groups} groups of {group_capacity} bytes overflow a member"),
                )
            })?;
        let device = FaultyMember::new(MemoryMember::new(size)?.with_name("crash store"));
        let shape = Shape {
            total_groups,
            group_capacity,
            stripe_bytes,
        };
        Ok(CrashStore::on(device, shape, Vec::new()))
    }

    fn on(device: FaultyMember, shape: Shape, infos: Vec<GroupInfo>) -> CrashStore {
        CrashStore {
            shape,
            device,
            state: Mutex::new(CrashState {
                infos,
                writes: 0,
                power_lost_at: None,
            }),
        }
    }

    /// After `budget` more writes, every write and flush fails (power lost).
    pub fn set_write_budget(&self, budget: Option<u64>) {
        let mut st = self.state.lock();
        st.power_lost_at = budget.map(|b| st.writes + b);
    }

    /// Writes accepted so far.
    pub fn writes(&self) -> u64 {
        self.state.lock().writes
    }

    /// The store as a power cut now could leave it; the same `seed` gives
    /// the same store.
    pub fn crash(&self, seed: u64) -> io::Result<CrashStore> {
        // Held so that no write lands between the image and the groups.
        let st = self.state.lock();
        let image = self.device.crash_image_random(seed)?;
        Ok(CrashStore::on(
            FaultyMember::new(image),
            self.shape,
            st.infos.clone(),
        ))
    }

    /// The store as a power cut now would leave it without a write cache:
    /// exactly what the last flush made durable.
    pub fn crash_flushed(&self) -> io::Result<CrashStore> {
        let st = self.state.lock();
        let image = self.device.crash_image()?;
        Ok(CrashStore::on(
            FaultyMember::new(image),
            self.shape,
            st.infos.clone(),
        ))
    }

    fn power_lost(st: &CrashState) -> bool {
        st.power_lost_at.is_some_and(|at| st.writes >= at)
    }

    /// Where `len` bytes at logical `addr` lie on the device, if inside one
    /// allocated group.
    fn place(&self, st: &CrashState, addr: u64, len: usize) -> Result<u64, StoreError> {
        let (g, off) = locate(addr);
        let end = (off as u64).checked_add(len as u64);
        let capacity = self.shape.group_capacity;
        if g >= st.infos.len() || end.is_none_or(|end| end > capacity) {
            return Err(StoreError::OutOfRange(addr));
        }
        Ok(g as u64 * capacity + off as u64)
    }
}

fn io_error(e: io::Error) -> StoreError {
    StoreError::Io(e.to_string())
}

impl BlockStore for CrashStore {
    fn read(
        &self,
        addr: u64,
        buf: &mut [u8],
        verify: Option<Verify<'_>>,
    ) -> Result<(), StoreError> {
        let at = self.place(&self.state.lock(), addr, buf.len())?;
        self.device.read_at(buf, at).map_err(io_error)?;
        verified(addr, buf, verify)
    }

    fn write(&self, addr: u64, data: &[u8]) -> Result<(), StoreError> {
        let mut st = self.state.lock();
        if Self::power_lost(&st) {
            return Err(StoreError::Io("simulated power loss".into()));
        }
        let at = self.place(&st, addr, data.len())?;
        self.device.write_at(data, at).map_err(io_error)?;
        st.writes += 1;
        Ok(())
    }

    fn flush(&self) -> Result<(), StoreError> {
        let st = self.state.lock();
        if Self::power_lost(&st) {
            return Err(StoreError::Io("simulated power loss".into()));
        }
        self.device.sync().map_err(io_error)
    }

    fn groups(&self) -> Vec<GroupInfo> {
        self.state.lock().infos.clone()
    }

    fn allocate_group(&self, kind: GroupKind) -> Result<GroupInfo, StoreError> {
        let mut st = self.state.lock();
        let info = self.shape.next_group(st.infos.len(), kind)?;
        st.infos.push(info);
        Ok(info)
    }

    fn free_groups(&self) -> (u64, u64) {
        self.shape.free_groups(self.state.lock().infos.len())
    }
}
