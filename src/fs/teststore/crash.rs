//! [`CrashStore`] keeps the writes since the last flush pending; `crash`
//! yields the store as a power cut could leave it: everything flushed plus
//! a random subset of the pending writes, each possibly torn at 512-byte
//! sector granularity. A write budget makes writes start failing at a
//! chosen point, i.e. power is lost in the middle of an operation.

use parking_lot::Mutex;

use super::locate;
use crate::fs::store::{BlockStore, GroupInfo, GroupKind, StoreError, Verify};

const SECTOR: usize = 512;

/// A small deterministic generator (tests need reproducible crashes, and
/// `rand` is only a dev-dependency).
pub struct SplitMix(u64);

impl SplitMix {
    pub fn new(seed: u64) -> SplitMix {
        SplitMix(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next_u64() % n
        }
    }
}

struct CrashState {
    infos: Vec<GroupInfo>,
    current: Vec<Vec<u8>>,
    durable: Vec<Vec<u8>>,
    pending: Vec<(u64, Vec<u8>)>,
    write_budget: Option<u64>,
    writes: u64,
}

pub struct CrashStore {
    total_groups: u32,
    group_capacity: u64,
    stripe_bytes: u64,
    state: Mutex<CrashState>,
}

fn copy_into(groups: &mut [Vec<u8>], addr: u64, data: &[u8]) -> Result<(), StoreError> {
    let (g, off) = locate(addr);
    let bytes = groups.get_mut(g).ok_or(StoreError::OutOfRange(addr))?;
    let dst = bytes
        .get_mut(off..off + data.len())
        .ok_or(StoreError::OutOfRange(addr))?;
    dst.copy_from_slice(data);
    Ok(())
}

impl CrashStore {
    pub fn new(total_groups: u32, group_capacity: u64, stripe_bytes: u64) -> CrashStore {
        CrashStore {
            total_groups,
            group_capacity,
            stripe_bytes,
            state: Mutex::new(CrashState {
                infos: Vec::new(),
                current: Vec::new(),
                durable: Vec::new(),
                pending: Vec::new(),
                write_budget: None,
                writes: 0,
            }),
        }
    }

    /// After `budget` more writes, every write and flush fails (power lost).
    pub fn set_write_budget(&self, budget: Option<u64>) {
        let mut st = self.state.lock();
        st.write_budget = budget.map(|b| st.writes + b);
    }

    /// Writes accepted so far.
    pub fn writes(&self) -> u64 {
        self.state.lock().writes
    }

    /// The store as a power cut now could leave it.
    pub fn crash(&self, seed: u64) -> CrashStore {
        let st = self.state.lock();
        let mut rng = SplitMix::new(seed);
        let mut image = st.durable.clone();
        for (addr, data) in &st.pending {
            match rng.below(3) {
                0 => {}
                1 => {
                    let _ = copy_into(&mut image, *addr, data);
                }
                _ => {
                    for (i, sector) in data.chunks(SECTOR).enumerate() {
                        if rng.below(2) == 0 {
                            let _ = copy_into(&mut image, *addr + (i * SECTOR) as u64, sector);
                        }
                    }
                }
            }
        }
        CrashStore {
            total_groups: self.total_groups,
            group_capacity: self.group_capacity,
            stripe_bytes: self.stripe_bytes,
            state: Mutex::new(CrashState {
                infos: st.infos.clone(),
                current: image.clone(),
                durable: image,
                pending: Vec::new(),
                write_budget: None,
                writes: 0,
            }),
        }
    }

    fn power_lost(st: &CrashState) -> bool {
        st.write_budget.is_some_and(|b| st.writes >= b)
    }
}

impl BlockStore for CrashStore {
    fn read(
        &self,
        addr: u64,
        buf: &mut [u8],
        verify: Option<Verify<'_>>,
    ) -> Result<(), StoreError> {
        let st = self.state.lock();
        let (g, off) = locate(addr);
        let src = st
            .current
            .get(g)
            .and_then(|b| b.get(off..off + buf.len()))
            .ok_or(StoreError::OutOfRange(addr))?;
        buf.copy_from_slice(src);
        match verify {
            Some(ok) if !ok(buf) => Err(StoreError::Unrecoverable(addr)),
            _ => Ok(()),
        }
    }

    fn write(&self, addr: u64, data: &[u8]) -> Result<(), StoreError> {
        let mut st = self.state.lock();
        if Self::power_lost(&st) {
            return Err(StoreError::Io("simulated power loss".into()));
        }
        copy_into(&mut st.current, addr, data)?;
        st.pending.push((addr, data.to_vec()));
        st.writes += 1;
        Ok(())
    }

    fn flush(&self) -> Result<(), StoreError> {
        let mut st = self.state.lock();
        if Self::power_lost(&st) {
            return Err(StoreError::Io("simulated power loss".into()));
        }
        let pending = std::mem::take(&mut st.pending);
        for (addr, data) in pending {
            copy_into(&mut st.durable, addr, &data)?;
        }
        Ok(())
    }

    fn groups(&self) -> Vec<GroupInfo> {
        self.state.lock().infos.clone()
    }

    fn allocate_group(&self, kind: GroupKind) -> Result<GroupInfo, StoreError> {
        let mut st = self.state.lock();
        if st.infos.len() as u32 >= self.total_groups {
            return Err(StoreError::NoSpace);
        }
        let info = GroupInfo {
            index: st.infos.len() as u32,
            kind,
            capacity: self.group_capacity,
            stripe_bytes: self.stripe_bytes,
        };
        st.infos.push(info);
        st.current.push(vec![0u8; self.group_capacity as usize]);
        st.durable.push(vec![0u8; self.group_capacity as usize]);
        Ok(info)
    }

    fn free_groups(&self) -> (u64, u64) {
        let st = self.state.lock();
        (
            (self.total_groups as u64).saturating_sub(st.infos.len() as u64),
            self.group_capacity,
        )
    }
}
