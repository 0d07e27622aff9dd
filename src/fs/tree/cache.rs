//! A bounded least-recently-used cache of decoded clean tree nodes, keyed by
//! address. Decoding a node costs a read, a crc and an allocation per entry,
//! and the upper levels are visited by every lookup, so they must stay
//! decoded; a bound keeps a big tree from holding all of itself in memory.
//!
//! A slot also records the generation and level the node was read with: an
//! address is reused once its node is freed, so a lookup that expects a
//! different generation is a miss (and drops the stale slot), never a hit.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

struct Slot<T> {
    generation: u64,
    level: u8,
    node: Arc<T>,
    tick: u64,
}

pub(crate) struct NodeCache<T> {
    capacity: usize,
    slots: HashMap<u64, Slot<T>>,
    /// Last-use tick → address; the first entry is the next to evict.
    order: BTreeMap<u64, u64>,
    tick: u64,
}

impl<T> NodeCache<T> {
    pub(crate) fn new(capacity: usize) -> Self {
        NodeCache {
            capacity,
            slots: HashMap::new(),
            order: BTreeMap::new(),
            tick: 0,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.slots.len()
    }

    /// The node at `addr` if it was cached with this generation and level.
    pub(crate) fn get(&mut self, addr: u64, generation: u64, level: u8) -> Option<Arc<T>> {
        self.tick += 1;
        let tick = self.tick;
        let slot = self.slots.get_mut(&addr)?;
        if slot.generation != generation || slot.level != level {
            self.remove(addr);
            return None;
        }
        self.order.remove(&slot.tick);
        slot.tick = tick;
        self.order.insert(tick, addr);
        Some(slot.node.clone())
    }

    /// Remove and return the node at `addr` if it matches (a node about to
    /// be copied for modification or dropped: holding it would only cost a
    /// copy of its entries).
    pub(crate) fn take(&mut self, addr: u64, generation: u64, level: u8) -> Option<Arc<T>> {
        let slot = self.slots.remove(&addr)?;
        self.order.remove(&slot.tick);
        (slot.generation == generation && slot.level == level).then_some(slot.node)
    }

    pub(crate) fn insert(&mut self, addr: u64, generation: u64, level: u8, node: Arc<T>) {
        if self.capacity == 0 {
            return;
        }
        self.remove(addr);
        self.tick += 1;
        self.order.insert(self.tick, addr);
        self.slots.insert(
            addr,
            Slot {
                generation,
                level,
                node,
                tick: self.tick,
            },
        );
        while self.slots.len() > self.capacity {
            let Some((_, victim)) = self.order.pop_first() else {
                break;
            };
            self.slots.remove(&victim);
        }
    }

    pub(crate) fn remove(&mut self, addr: u64) {
        if let Some(slot) = self.slots.remove(&addr) {
            self.order.remove(&slot.tick);
        }
    }
}
