//! The space tree nodes take in the Metadata groups: which 4 KiB blocks
//! are free, taken when a checkpoint writes nodes and given back once a
//! durable checkpoint no longer reaches them.
//!
//! It is rebuilt at mount from the groups, less the regions the header
//! names (its copies, the journal, the checkpoint slots) and the nodes the
//! newest checkpoint's tree reaches, so it needs no structure of its own on
//! disk. When it runs short it takes a further Metadata group from the
//! store; when the store has none left, a checkpoint gets `NoSpace`.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::inode::BLOCK_SIZE;
use super::layout::Region;
use super::store::{group_addr, BlockStore, GroupKind, StoreError};
use super::tree::NodeAlloc;
use super::{FsError, FsResult};

pub struct NodeSpace {
    store: Arc<dyn BlockStore>,
    /// Free runs: first address → blocks.
    free: BTreeMap<u64, u64>,
    reserved: Vec<Region>,
    free_blocks: u64,
}

/// `[start, end)` runs of whole blocks less `cut` (sorted, merged).
fn subtract(runs: Vec<(u64, u64)>, mut cut: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    cut.sort_unstable();
    let mut out = Vec::new();
    for (mut start, end) in runs {
        for &(cs, ce) in &cut {
            if ce <= start || cs >= end {
                continue;
            }
            if cs > start {
                out.push((start, cs));
            }
            start = start.max(ce);
        }
        if start < end {
            out.push((start, end));
        }
    }
    out
}

impl NodeSpace {
    /// The free node space of `store`'s Metadata groups, less `reserved`
    /// and the blocks of `used` (one node each). A used node outside the
    /// Metadata groups, in a reserved region or named twice is damage.
    pub fn build(
        store: Arc<dyn BlockStore>,
        reserved: &[Region],
        used: &[u64],
    ) -> FsResult<NodeSpace> {
        let mut space = NodeSpace {
            store,
            free: BTreeMap::new(),
            reserved: reserved.to_vec(),
            free_blocks: 0,
        };
        let groups: Vec<(u64, u64)> = space
            .store
            .groups()
            .into_iter()
            .filter(|g| g.kind == GroupKind::Metadata)
            .map(|g| {
                let start = group_addr(g.index, 0);
                (start, start + g.capacity / BLOCK_SIZE * BLOCK_SIZE)
            })
            .collect();
        let mut sorted = used.to_vec();
        sorted.sort_unstable();
        if let Some(w) = sorted.windows(2).find(|w| w[0] == w[1]) {
            return Err(FsError::Corrupt(format!(
                "tree node at {:#x} is reached twice",
                w[0]
            )));
        }
        let free = subtract(groups, space.reserved_runs());
        for &addr in &sorted {
            let inside = free
                .iter()
                .any(|&(s, e)| addr >= s && addr + BLOCK_SIZE <= e && (addr - s) % BLOCK_SIZE == 0);
            if !inside {
                return Err(FsError::Corrupt(format!(
                    "tree node at {addr:#x} lies outside the free space of the Metadata groups"
                )));
            }
        }
        let nodes: Vec<(u64, u64)> = sorted.iter().map(|&a| (a, a + BLOCK_SIZE)).collect();
        for (s, e) in subtract(free, nodes) {
            space.insert_run(s, (e - s) / BLOCK_SIZE);
        }
        Ok(space)
    }

    fn reserved_runs(&self) -> Vec<(u64, u64)> {
        self.reserved
            .iter()
            .map(|r| {
                let start = r.addr / BLOCK_SIZE * BLOCK_SIZE;
                (start, (r.addr + r.len).div_ceil(BLOCK_SIZE) * BLOCK_SIZE)
            })
            .collect()
    }

    /// Free blocks in the Metadata groups allocated so far.
    pub fn free_blocks(&self) -> u64 {
        self.free_blocks
    }

    /// Add a free run, merging it with its neighbours.
    fn insert_run(&mut self, mut start: u64, mut blocks: u64) {
        if blocks == 0 {
            return;
        }
        self.free_blocks += blocks;
        if let Some((&ps, &pb)) = self.free.range(..start).next_back() {
            if ps + pb * BLOCK_SIZE == start {
                self.free.remove(&ps);
                start = ps;
                blocks += pb;
            }
        }
        let end = start + blocks * BLOCK_SIZE;
        if let Some(nb) = self.free.remove(&end) {
            blocks += nb;
        }
        self.free.insert(start, blocks);
    }

    /// Give nodes back (their checkpoint is superseded by a durable one).
    pub fn free(&mut self, addrs: &[u64]) {
        let mut sorted = addrs.to_vec();
        sorted.sort_unstable();
        let mut i = 0;
        while i < sorted.len() {
            let start = sorted[i];
            let mut n = 1;
            while i + (n as usize) < sorted.len()
                && sorted[i + n as usize] == start + n * BLOCK_SIZE
            {
                n += 1;
            }
            self.insert_run(start, n);
            i += n as usize;
        }
    }

    /// Take a further Metadata group from the store.
    fn grow(&mut self) -> FsResult<()> {
        let info = self
            .store
            .allocate_group(GroupKind::Metadata)
            .map_err(|e| match e {
                StoreError::NoSpace => FsError::NoSpace,
                other => other.into(),
            })?;
        let start = group_addr(info.index, 0);
        let end = start + info.capacity / BLOCK_SIZE * BLOCK_SIZE;
        for (s, e) in subtract(vec![(start, end)], self.reserved_runs()) {
            self.insert_run(s, (e - s) / BLOCK_SIZE);
        }
        log::info!(
            "metadata group {} taken for tree nodes ({} MiB)",
            info.index,
            info.capacity >> 20
        );
        Ok(())
    }
}

impl NodeAlloc for NodeSpace {
    /// Lowest addresses first, so a checkpoint's nodes lie in long runs.
    fn alloc(&mut self, n: usize) -> FsResult<Vec<u64>> {
        while self.free_blocks < n as u64 {
            self.grow()?;
        }
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            let Some((&start, &blocks)) = self.free.iter().next() else {
                break;
            };
            let take = blocks.min((n - out.len()) as u64);
            self.free.remove(&start);
            if take < blocks {
                self.free.insert(start + take * BLOCK_SIZE, blocks - take);
            }
            self.free_blocks -= take;
            out.extend((0..take).map(|i| start + i * BLOCK_SIZE));
        }
        Ok(out)
    }

    fn release(&mut self, addrs: &[u64]) {
        self.free(addrs);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::teststore::MemStore;

    #[test]
    fn nodes_come_from_free_space_and_the_store_grows_it() {
        let store = Arc::new(MemStore::new(4, 64 * BLOCK_SIZE, 64 << 10));
        let g = store.allocate_group(GroupKind::Metadata).unwrap();
        let base = group_addr(g.index, 0);
        let reserved = [Region {
            addr: base,
            len: 8 * BLOCK_SIZE,
        }];
        let used = [base + 8 * BLOCK_SIZE, base + 10 * BLOCK_SIZE];
        let mut space = NodeSpace::build(store.clone(), &reserved, &used).unwrap();
        assert_eq!(space.free_blocks(), 64 - 8 - 2);
        let got = space.alloc(3).unwrap();
        assert_eq!(
            got,
            vec![
                base + 9 * BLOCK_SIZE,
                base + 11 * BLOCK_SIZE,
                base + 12 * BLOCK_SIZE
            ]
        );
        // More than the group holds: a second Metadata group is taken.
        let more = space.alloc(60).unwrap();
        assert_eq!(more.len(), 60);
        assert!(more.iter().any(|a| a >> 40 != u64::from(g.index)));
        space.free(&got);
        assert_eq!(space.free_blocks(), 64 + 64 - 8 - 2 - 60);
        // Used twice, or inside a reserved region: damage, named.
        let err = NodeSpace::build(store.clone(), &reserved, &[used[0], used[0]])
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("reached twice"), "{err}");
        let err = NodeSpace::build(store.clone(), &reserved, &[base])
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("outside the free space"), "{err}");
    }

    #[test]
    fn without_a_group_left_the_caller_gets_no_space() {
        let store = Arc::new(MemStore::new(1, 16 * BLOCK_SIZE, 64 << 10));
        store.allocate_group(GroupKind::Metadata).unwrap();
        let mut space = NodeSpace::build(store, &[], &[]).unwrap();
        assert_eq!(space.alloc(16).unwrap().len(), 16);
        assert!(matches!(space.alloc(1), Err(FsError::NoSpace)));
    }
}
