//! The simulator's reference model: what the filesystem must hold, by name
//! and by inode (hard links share a node), and the snapshot that the last
//! fsync or sync made durable. Operations change the model only after the
//! filesystem answered them; an operation that failed leaves its names and
//! nodes uncertain until they are read back from the filesystem.

use std::collections::{BTreeMap, BTreeSet};

/// Directories, by index: made at the start of every run, never removed.
pub const DIRS: [&str; 4] = ["", "a", "b", "a/c"];
/// Names a file may have in a directory (`f0` …).
pub const NAMES: u8 = 8;

pub type Name = (u8, String);
pub type NodeId = usize;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Node {
    pub data: Vec<u8>,
    pub xattrs: BTreeMap<String, Vec<u8>>,
}

#[derive(Clone, Debug, Default)]
pub struct Model {
    pub names: BTreeMap<Name, NodeId>,
    pub nodes: BTreeMap<NodeId, Node>,
    next: NodeId,
}

impl Model {
    pub fn new_node(&mut self) -> NodeId {
        self.next += 1;
        self.nodes.insert(self.next, Node::default());
        self.next
    }

    /// The `pick`th name, in order (`None` when there is none).
    pub fn pick(&self, pick: u32) -> Option<Name> {
        if self.names.is_empty() {
            return None;
        }
        self.names
            .keys()
            .nth(pick as usize % self.names.len())
            .cloned()
    }

    pub fn node_of(&self, name: &Name) -> Option<NodeId> {
        self.names.get(name).copied()
    }

    /// Remove `name`; its node goes once no name holds it.
    pub fn unlink(&mut self, name: &Name) {
        if let Some(id) = self.names.remove(name) {
            if !self.names.values().any(|&n| n == id) {
                self.nodes.remove(&id);
            }
        }
    }

    pub fn write(&mut self, id: NodeId, off: u64, bytes: &[u8]) {
        let data = &mut self.nodes.get_mut(&id).expect("node").data;
        let end = off as usize + bytes.len();
        if data.len() < end {
            data.resize(end, 0);
        }
        data[off as usize..end].copy_from_slice(bytes);
    }

    pub fn resize(&mut self, id: NodeId, size: u64) {
        self.nodes
            .get_mut(&id)
            .expect("node")
            .data
            .resize(size as usize, 0);
    }

    pub fn zero(&mut self, id: NodeId, off: u64, len: u64) {
        let data = &mut self.nodes.get_mut(&id).expect("node").data;
        let end = ((off + len) as usize).min(data.len());
        if (off as usize) < end {
            data[off as usize..end].fill(0);
        }
    }

    pub fn total_bytes(&self) -> usize {
        self.nodes.values().map(|n| n.data.len()).sum()
    }
}

/// What the simulator knows of the filesystem: the model as answered, the
/// snapshot the last fsync or sync covered, every name that existed since
/// that snapshot (a power cut may leave any of them), and what a failed
/// operation left uncertain.
#[derive(Clone, Debug, Default)]
pub struct Knowledge {
    pub now: Model,
    /// `None` while an fsync returned with something still uncertain: what
    /// it covered is not known exactly.
    pub durable: Option<Model>,
    pub seen_since_durable: BTreeSet<Name>,
    pub uncertain_names: BTreeSet<Name>,
    pub uncertain_nodes: BTreeSet<NodeId>,
}

impl Knowledge {
    /// Everything answered so far is durable (an fsync or sync returned).
    pub fn synced(&mut self) {
        if self.uncertain_names.is_empty() && self.uncertain_nodes.is_empty() {
            self.durable = Some(self.now.clone());
            self.seen_since_durable = self.now.names.keys().cloned().collect();
        } else {
            self.durable = None;
        }
    }

    pub fn is_certain(&self) -> bool {
        self.uncertain_names.is_empty() && self.uncertain_nodes.is_empty()
    }

    pub fn saw(&mut self, name: &Name) {
        self.seen_since_durable.insert(name.clone());
    }

    /// Whether `name` may exist after a power cut.
    pub fn may_exist(&self, name: &Name) -> bool {
        self.durable
            .as_ref()
            .is_some_and(|d| d.names.contains_key(name))
            || self.seen_since_durable.contains(name)
            || self.uncertain_names.contains(name)
    }
}
