//! The metadata tree: a copy-on-write B+tree mapping byte keys to byte
//! values, stored as checksummed 4 KiB nodes ([`node`]) in the metadata
//! groups of the block store. It is the one structure that holds all the
//! filesystem's metadata, so it owns everything about how those nodes are
//! read, changed and written back.
//!
//! Copy-on-write: a node reachable from the durable root is never written
//! again. Changing a clean (on-disk) node copies it into a dirty in-memory
//! node and remembers its address; [`Tree::write_out`] writes every dirty
//! node to fresh addresses, children before parents, and returns the old
//! addresses (`freed`) for the caller to free once the new root is durable.
//! Until then the previous root still reads back the previous contents.
//!
//! Each internal entry records its child's generation, so a read rejects a
//! node that is not the one its parent was written with (a lost write that
//! left an older node at the address); every clean node is read through the
//! store's `verify` closure, so the array retries (and repairs) a mirror copy
//! that fails it.
//!
//! Shape rules:
//! - A node splits when its encoding would pass 4096 bytes, by bytes not by
//!   count. An insert at the end of a leaf (sequential keys: increasing inode
//!   numbers, a directory filled in order) splits unevenly: the old entries
//!   stay together in a full left node and the new one starts the right
//!   node, so appending leaves full leaves behind, not half-empty ones. The
//!   same holds for an internal node whose new entry is its last.
//! - After deletes, a node under a quarter full is merged with a sibling
//!   when both fit in one node, else the two share their entries evenly. An
//!   emptied node is removed; an internal root with one child gives way to
//!   the child; an empty tree has root address 0.
//! - Leaf splits store the shortest separator (a prefix of the right node's
//!   first key), which keeps internal nodes wide.

mod cache;
pub mod node;

use std::collections::HashSet;
use std::sync::Arc;

use self::cache::NodeCache;
pub use self::node::{
    decode_node, sample_node_blocks, NodeSummary, MAX_ENTRY, MAX_KEY, MAX_LEVEL, NODE_SIZE,
};
use self::node::{Entries, Parsed, HEADER, INTERNAL_ENTRY_OVERHEAD, LEAF_ENTRY_OVERHEAD};
use super::store::{BlockStore, StoreError};
use super::{FsError, FsResult};

/// A node under this many encoded bytes is merged with or refilled from a
/// sibling after a delete.
const UNDERFLOW: usize = NODE_SIZE / 4;
/// Most bytes of one store write in [`Tree::write_out`].
const MAX_RUN: usize = 1 << 20;

/// Where a tree's root is, as the checkpoint records it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct TreeRoot {
    /// The root node's address; 0 = empty tree.
    pub addr: u64,
    /// The root node's generation (for an empty tree, the generation of the
    /// write-out that emptied it).
    pub generation: u64,
    /// The root node's level (0 = the root is a leaf).
    pub level: u8,
    /// Nodes reachable from the root.
    pub nodes: u64,
}

/// Where [`Tree::write_out`] puts new nodes.
pub trait NodeAlloc {
    /// `n` free node addresses (4 KiB each, 4 KiB-aligned, non-zero),
    /// preferably in consecutive runs; `NoSpace` when there are not enough.
    fn alloc(&mut self, n: usize) -> FsResult<Vec<u64>>;
    /// Give back addresses handed out by a write-out that then failed.
    fn release(&mut self, addrs: &[u64]);
}

/// What a successful [`Tree::write_out`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WriteOut {
    /// The new root, to be recorded once the store is flushed.
    pub root: TreeRoot,
    /// Nodes of the previous root no longer reachable from the new one; the
    /// caller frees them once the new root is durable.
    pub freed: Vec<u64>,
    /// Nodes written.
    pub written: u64,
}

/// A node held in memory: on disk and unchanged (`Clean`), or changed since
/// the last write-out (`Dirty`).
#[derive(Clone)]
enum Child {
    Clean { addr: u64, generation: u64 },
    Dirty(Box<Node>),
}

#[derive(Clone)]
enum Body {
    Leaf(Vec<Vec<u8>>),
    Internal(Vec<Child>),
}

/// A decoded node. `keys` are parallel to the values or children; an
/// internal node's `keys[0]` is always empty (minus infinity). `bytes` is
/// the node's encoded size, kept current so splits and merges need no
/// re-encoding.
#[derive(Clone)]
struct Node {
    level: u8,
    keys: Vec<Vec<u8>>,
    body: Body,
    bytes: usize,
}

impl Node {
    fn leaf(key: &[u8], value: &[u8]) -> Node {
        let mut n = Node {
            level: 0,
            keys: vec![key.to_vec()],
            body: Body::Leaf(vec![value.to_vec()]),
            bytes: 0,
        };
        n.recount();
        n
    }

    fn from_parsed(p: Parsed) -> Node {
        let body = match p.body {
            node::Body::Leaf(vals) => Body::Leaf(vals),
            node::Body::Internal(children) => Body::Internal(
                children
                    .into_iter()
                    .map(|(addr, generation)| Child::Clean { addr, generation })
                    .collect(),
            ),
        };
        let mut n = Node {
            level: p.summary.level,
            keys: p.keys,
            body,
            bytes: 0,
        };
        n.recount();
        n
    }

    fn len(&self) -> usize {
        self.keys.len()
    }

    fn entry_bytes(&self, i: usize) -> usize {
        match &self.body {
            Body::Leaf(vals) => LEAF_ENTRY_OVERHEAD + self.keys[i].len() + vals[i].len(),
            Body::Internal(_) => INTERNAL_ENTRY_OVERHEAD + self.keys[i].len(),
        }
    }

    fn recount(&mut self) {
        self.bytes = HEADER + (0..self.len()).map(|i| self.entry_bytes(i)).sum::<usize>();
    }

    /// Where to split an overflowing node: the number of entries the left
    /// part keeps (at least 1, leaving at least 1).
    fn split_point(&self, append: bool) -> usize {
        let n = self.len();
        let m = if append {
            // As many as fit: the left node stays full.
            let mut acc = HEADER;
            let mut m = 0;
            while m < n && acc + self.entry_bytes(m) <= NODE_SIZE {
                acc += self.entry_bytes(m);
                m += 1;
            }
            m
        } else {
            let half = (self.bytes - HEADER) / 2;
            let mut acc = 0;
            let mut m = n;
            for i in 0..n {
                let e = self.entry_bytes(i);
                if acc + e >= half {
                    // Take entry i on the left if that lands closer to half.
                    m = if acc + e - half <= half - acc {
                        i + 1
                    } else {
                        i
                    };
                    break;
                }
                acc += e;
            }
            m
        };
        m.clamp(1, n.saturating_sub(1).max(1))
    }

    /// Split off entries `m..` into a new right sibling; returns the
    /// separator for it (a lower bound of its keys above every key left
    /// here) and the sibling.
    fn split_at(&mut self, m: usize) -> (Vec<u8>, Node) {
        let mut right_keys = self.keys.split_off(m);
        let (sep, body) = match &mut self.body {
            Body::Leaf(vals) => {
                let right_vals = vals.split_off(m);
                let last = self.keys.last().map(Vec::as_slice).unwrap_or(&[]);
                let sep = shortest_separator(last, &right_keys[0]);
                (sep, Body::Leaf(right_vals))
            }
            Body::Internal(children) => {
                let right_children = children.split_off(m);
                (
                    std::mem::take(&mut right_keys[0]),
                    Body::Internal(right_children),
                )
            }
        };
        let mut right = Node {
            level: self.level,
            keys: right_keys,
            body,
            bytes: 0,
        };
        right.recount();
        self.recount();
        (sep, right)
    }

    /// Split until every part fits; returns the parts after this one with
    /// their separators, in key order.
    fn split_overflow(&mut self, append: bool) -> Vec<(Vec<u8>, Node)> {
        let mut rights: Vec<(Vec<u8>, Node)> = Vec::new();
        while self.bytes > NODE_SIZE && self.len() >= 2 {
            let m = self.split_point(append);
            let piece = self.split_at(m);
            rights.insert(0, piece);
        }
        let mut i = 0;
        while i < rights.len() {
            if rights[i].1.bytes > NODE_SIZE && rights[i].1.len() >= 2 {
                let m = rights[i].1.split_point(append);
                let piece = rights[i].1.split_at(m);
                rights.insert(i + 1, piece);
            } else {
                i += 1;
            }
        }
        rights
    }

    /// Append the entries of `right`, the next sibling, whose separator in
    /// the parent is `sep`.
    fn absorb(&mut self, sep: Vec<u8>, right: Node) {
        let Node { mut keys, body, .. } = right;
        match (&mut self.body, body) {
            (Body::Leaf(vals), Body::Leaf(rv)) => vals.extend(rv),
            (Body::Internal(children), Body::Internal(rc)) => {
                if let Some(k0) = keys.first_mut() {
                    *k0 = sep;
                }
                children.extend(rc);
            }
            // Siblings are always of one level; nothing else reaches here.
            _ => return,
        }
        self.keys.extend(keys);
        if self.level > 0 {
            if let Some(k0) = self.keys.first_mut() {
                k0.clear();
            }
        }
        self.recount();
    }

    /// Remove entry `i` of an internal node.
    fn remove_child(&mut self, i: usize) -> Option<Child> {
        let Body::Internal(children) = &mut self.body else {
            return None;
        };
        self.keys.remove(i);
        let child = children.remove(i);
        if let Some(k0) = self.keys.first_mut() {
            k0.clear();
        }
        self.recount();
        Some(child)
    }
}

/// The shortest key `s` with `left < s <= right` (given `left < right`): a
/// prefix of `right` one byte past their common prefix.
fn shortest_separator(left: &[u8], right: &[u8]) -> Vec<u8> {
    let common = left.iter().zip(right).take_while(|(a, b)| a == b).count();
    right[..(common + 1).min(right.len())].to_vec()
}

/// Index of the child of an internal node whose subtree may hold `key`.
fn child_index(keys: &[Vec<u8>], key: &[u8]) -> usize {
    keys.partition_point(|k| k.as_slice() <= key)
        .saturating_sub(1)
}

fn node_fault(addr: u64, why: impl std::fmt::Display) -> FsError {
    FsError::Corrupt(format!("tree node at {addr:#x}: {why}"))
}

/// Read and decode the node at `addr`, which its parent says has
/// `generation` and `level`.
fn read_node(
    store: &dyn BlockStore,
    uuid: &[u8; 16],
    addr: u64,
    generation: u64,
    level: u8,
) -> FsResult<Parsed> {
    let mut buf = vec![0u8; NODE_SIZE];
    // Whether the last copy verify saw passed: then the bytes in `buf` are
    // that copy's and need no second crc.
    let passed = std::cell::Cell::new(false);
    let verify = |b: &[u8]| {
        let ok = node::header_fault(uuid, b, addr, generation, level).is_none();
        passed.set(ok);
        ok
    };
    match store.read(addr, &mut buf, Some(&verify)) {
        Ok(()) => {}
        Err(StoreError::Unrecoverable(_)) => {
            // Say what is wrong with the last copy tried.
            let why = node::header_fault(uuid, &buf, addr, generation, level)
                .unwrap_or_else(|| "no copy passes its checks".to_string());
            return Err(node_fault(addr, format!("no good copy ({why})")));
        }
        Err(e) => return Err(e.into()),
    }
    // A store that did not call verify gets the check here.
    if !passed.get() {
        if let Some(why) = node::header_fault(uuid, &buf, addr, generation, level) {
            return Err(node_fault(addr, why));
        }
    }
    node::parse(&buf, addr).map_err(|why| node_fault(addr, why))
}

/// What an operation reaches the store and the tree's bookkeeping through.
struct Ctx<'a> {
    store: &'a dyn BlockStore,
    uuid: &'a [u8; 16],
    cache: &'a mut NodeCache<Node>,
    /// Clean nodes copied or dropped since the last write-out.
    freed: &'a mut Vec<u64>,
}

impl Ctx<'_> {
    /// The clean node at `addr`, from the cache or the store; `keep` caches
    /// it (a node being dropped is not worth a slot).
    fn load(&mut self, addr: u64, generation: u64, level: u8, keep: bool) -> FsResult<Arc<Node>> {
        if keep {
            if let Some(n) = self.cache.get(addr, generation, level) {
                return Ok(n);
            }
        } else if let Some(n) = self.cache.take(addr, generation, level) {
            return Ok(n);
        }
        let node = Arc::new(Node::from_parsed(read_node(
            self.store, self.uuid, addr, generation, level,
        )?));
        if keep {
            self.cache.insert(addr, generation, level, node.clone());
        }
        Ok(node)
    }
}

/// Make `child` (at `level`) dirty, copying it from disk if it is clean,
/// and return it.
fn make_dirty<'c>(child: &'c mut Child, level: u8, ctx: &mut Ctx<'_>) -> FsResult<&'c mut Node> {
    if let Child::Clean { addr, generation } = *child {
        let node = match ctx.cache.take(addr, generation, level) {
            Some(n) => n,
            None => Arc::new(Node::from_parsed(read_node(
                ctx.store, ctx.uuid, addr, generation, level,
            )?)),
        };
        let node = Arc::try_unwrap(node).unwrap_or_else(|shared| (*shared).clone());
        ctx.freed.push(addr);
        *child = Child::Dirty(Box::new(node));
    }
    match child {
        Child::Dirty(n) => Ok(n),
        Child::Clean { addr, .. } => Err(node_fault(*addr, "could not be made dirty")),
    }
}

fn get_rec(child: &Child, level: u8, ctx: &mut Ctx<'_>, key: &[u8]) -> FsResult<Option<Vec<u8>>> {
    let held;
    let node: &Node = match child {
        Child::Dirty(n) => n,
        Child::Clean { addr, generation } => {
            held = ctx.load(*addr, *generation, level, true)?;
            &held
        }
    };
    match &node.body {
        Body::Leaf(vals) => Ok(node
            .keys
            .binary_search_by(|k| k.as_slice().cmp(key))
            .ok()
            .map(|i| vals[i].clone())),
        Body::Internal(children) => {
            let i = child_index(&node.keys, key);
            let c = children
                .get(i)
                .ok_or_else(|| FsError::Corrupt("tree: internal node without children".into()))?;
            get_rec(c, level.saturating_sub(1), ctx, key)
        }
    }
}

/// A [`Tree::scan`] visitor: given each key and value, returns whether to go on.
pub type ScanFn<'f> = dyn FnMut(&[u8], &[u8]) -> FsResult<bool> + 'f;

/// Visit `[start, end)` under `child`; `Ok(false)` once the scan is over.
fn scan_rec(
    child: &Child,
    level: u8,
    ctx: &mut Ctx<'_>,
    start: &[u8],
    end: &[u8],
    f: &mut ScanFn<'_>,
) -> FsResult<bool> {
    let held;
    let node: &Node = match child {
        Child::Dirty(n) => n,
        Child::Clean { addr, generation } => {
            held = ctx.load(*addr, *generation, level, true)?;
            &held
        }
    };
    match &node.body {
        Body::Leaf(vals) => {
            let from = node.keys.partition_point(|k| k.as_slice() < start);
            for (k, v) in node.keys[from..].iter().zip(&vals[from..]) {
                if k.as_slice() >= end || !f(k, v)? {
                    return Ok(false);
                }
            }
            Ok(true)
        }
        Body::Internal(children) => {
            let first = child_index(&node.keys, start);
            for (j, c) in children.iter().enumerate().skip(first) {
                if j > first && node.keys[j].as_slice() >= end {
                    return Ok(false);
                }
                if !scan_rec(c, level.saturating_sub(1), ctx, start, end, f)? {
                    return Ok(false);
                }
            }
            Ok(true)
        }
    }
}

/// Insert or replace under the dirty `node`; returns whether the entry
/// landed at the end of the node (which then splits unevenly).
fn insert_rec(node: &mut Node, ctx: &mut Ctx<'_>, key: &[u8], value: &[u8]) -> FsResult<bool> {
    let child_level = node.level.saturating_sub(1);
    match &mut node.body {
        Body::Leaf(vals) => match node.keys.binary_search_by(|k| k.as_slice().cmp(key)) {
            Ok(i) => {
                node.bytes = node.bytes - vals[i].len() + value.len();
                vals[i] = value.to_vec();
                Ok(false)
            }
            Err(i) => {
                node.keys.insert(i, key.to_vec());
                vals.insert(i, value.to_vec());
                node.bytes += LEAF_ENTRY_OVERHEAD + key.len() + value.len();
                Ok(i + 1 == node.keys.len())
            }
        },
        Body::Internal(children) => {
            let i = child_index(&node.keys, key);
            let child = make_dirty(&mut children[i], child_level, ctx)?;
            let appended = insert_rec(child, ctx, key, value)?;
            if child.bytes <= NODE_SIZE {
                return Ok(false);
            }
            let pieces = child.split_overflow(appended);
            let added = pieces.len();
            for (j, (sep, right)) in pieces.into_iter().enumerate() {
                node.bytes += INTERNAL_ENTRY_OVERHEAD + sep.len();
                node.keys.insert(i + 1 + j, sep);
                children.insert(i + 1 + j, Child::Dirty(Box::new(right)));
            }
            Ok(appended && i + added + 1 == node.keys.len())
        }
    }
}

/// After child `i` of the dirty internal `node` lost entries: remove it if
/// empty, or merge it with / refill it from a sibling if under a quarter
/// full (when there is a sibling).
fn fix_child(node: &mut Node, i: usize, ctx: &mut Ctx<'_>) -> FsResult<()> {
    let child_level = node.level.saturating_sub(1);
    let Body::Internal(children) = &mut node.body else {
        return Ok(());
    };
    let Some(Child::Dirty(child)) = children.get(i) else {
        return Ok(());
    };
    if child.len() == 0 {
        node.remove_child(i);
        return Ok(());
    }
    if child.bytes >= UNDERFLOW || children.len() < 2 {
        return Ok(());
    }
    let (l, r) = if i > 0 { (i - 1, i) } else { (i, i + 1) };
    make_dirty(&mut children[l], child_level, ctx)?;
    make_dirty(&mut children[r], child_level, ctx)?;
    let sep = node.keys.remove(r);
    let Child::Dirty(right) = children.remove(r) else {
        return Err(FsError::Corrupt("tree: sibling not dirty".into()));
    };
    let Child::Dirty(left) = &mut children[l] else {
        return Err(FsError::Corrupt("tree: sibling not dirty".into()));
    };
    left.absorb(sep, *right);
    if left.bytes > NODE_SIZE {
        let pieces = left.split_overflow(false);
        for (j, (sep, piece)) in pieces.into_iter().enumerate() {
            node.keys.insert(r + j, sep);
            children.insert(r + j, Child::Dirty(Box::new(piece)));
        }
    }
    node.recount();
    Ok(())
}

fn delete_rec(node: &mut Node, ctx: &mut Ctx<'_>, key: &[u8]) -> FsResult<bool> {
    let child_level = node.level.saturating_sub(1);
    match &mut node.body {
        Body::Leaf(vals) => match node.keys.binary_search_by(|k| k.as_slice().cmp(key)) {
            Ok(i) => {
                let k = node.keys.remove(i);
                let v = vals.remove(i);
                node.bytes -= LEAF_ENTRY_OVERHEAD + k.len() + v.len();
                Ok(true)
            }
            Err(_) => Ok(false),
        },
        Body::Internal(children) => {
            let i = child_index(&node.keys, key);
            let child = make_dirty(&mut children[i], child_level, ctx)?;
            let found = delete_rec(child, ctx, key)?;
            if found {
                fix_child(node, i, ctx)?;
            }
            Ok(found)
        }
    }
}

/// Count the entries under `child` and free its clean nodes (the subtree
/// is being dropped whole).
fn drop_subtree(child: &Child, level: u8, ctx: &mut Ctx<'_>) -> FsResult<u64> {
    let held;
    let node: &Node = match child {
        Child::Dirty(n) => n,
        Child::Clean { addr, generation } => {
            held = ctx.load(*addr, *generation, level, false)?;
            ctx.freed.push(*addr);
            &held
        }
    };
    match &node.body {
        Body::Leaf(vals) => Ok(vals.len() as u64),
        Body::Internal(children) => {
            let mut n = 0;
            for c in children {
                n += drop_subtree(c, level.saturating_sub(1), ctx)?;
            }
            Ok(n)
        }
    }
}

/// Delete `[start, end)` under the dirty `node`, whose keys lie in
/// `[lo, hi)` (`hi` None = no bound); returns how many went.
fn range_rec(
    node: &mut Node,
    ctx: &mut Ctx<'_>,
    (start, end): (&[u8], &[u8]),
    lo: &[u8],
    hi: Option<&[u8]>,
) -> FsResult<u64> {
    let child_level = node.level.saturating_sub(1);
    match &mut node.body {
        Body::Leaf(vals) => {
            let a = node.keys.partition_point(|k| k.as_slice() < start);
            let b = node.keys.partition_point(|k| k.as_slice() < end);
            if a >= b {
                return Ok(0);
            }
            node.keys.drain(a..b);
            vals.drain(a..b);
            node.recount();
            Ok((b - a) as u64)
        }
        Body::Internal(children) => {
            let n = children.len();
            let first = child_index(&node.keys, start);
            let last = node
                .keys
                .partition_point(|k| k.as_slice() < end)
                .saturating_sub(1)
                .max(first);
            let bounds = |i: usize| -> (Vec<u8>, Option<Vec<u8>>) {
                let l = if i == 0 { lo } else { &node.keys[i] };
                let h = if i + 1 < n {
                    Some(node.keys[i + 1].as_slice())
                } else {
                    hi
                };
                (l.to_vec(), h.map(<[u8]>::to_vec))
            };
            let covered = |(l, h): &(Vec<u8>, Option<Vec<u8>>)| {
                l.as_slice() >= start && h.as_deref().is_some_and(|h| h <= end)
            };
            let mut count = 0;
            let mut partial = Vec::new();
            let mut whole = Vec::new();
            for i in first..=last {
                let b = bounds(i);
                if covered(&b) {
                    whole.push(i);
                } else {
                    partial.push((i, b));
                }
            }
            for (i, (l, h)) in &partial {
                let child = make_dirty(&mut children[*i], child_level, ctx)?;
                count += range_rec(child, ctx, (start, end), l, h.as_deref())?;
            }
            for &i in whole.iter().rev() {
                if let Some(c) = node.remove_child(i) {
                    count += drop_subtree(&c, child_level, ctx)?;
                }
            }
            // Where the partly emptied children are now, highest first so
            // fixing one leaves the other's index alone.
            let mut fix: Vec<usize> = partial
                .iter()
                .map(|(i, _)| i - whole.iter().filter(|&&w| w < *i).count())
                .collect();
            fix.sort_unstable_by(|a, b| b.cmp(a));
            for i in fix {
                if i < node.len() {
                    fix_child(node, i, ctx)?;
                }
            }
            Ok(count)
        }
    }
}

fn count_dirty(child: &Child) -> usize {
    match child {
        Child::Clean { .. } => 0,
        Child::Dirty(n) => {
            1 + match &n.body {
                Body::Leaf(_) => 0,
                Body::Internal(children) => children.iter().map(count_dirty).sum(),
            }
        }
    }
}

/// Gathers consecutive node blocks into one store write.
struct RunWriter<'a> {
    store: &'a dyn BlockStore,
    start: u64,
    buf: Vec<u8>,
}

impl RunWriter<'_> {
    /// A zeroed block to fill for `addr`, after the ones before it.
    fn block(&mut self, addr: u64) -> FsResult<&mut [u8]> {
        let next = self.start.wrapping_add(self.buf.len() as u64);
        if !self.buf.is_empty() && (addr != next || self.buf.len() >= MAX_RUN) {
            self.finish()?;
        }
        if self.buf.is_empty() {
            self.start = addr;
        }
        let at = self.buf.len();
        self.buf.resize(at + NODE_SIZE, 0);
        Ok(&mut self.buf[at..])
    }

    fn finish(&mut self) -> FsResult<()> {
        if !self.buf.is_empty() {
            self.store.write(self.start, &self.buf)?;
            self.buf.clear();
        }
        Ok(())
    }
}

/// Encode and write the dirty nodes under `child` in post-order, taking
/// addresses from `addrs` in turn; returns the child's `(addr, generation)`.
/// Changes nothing in the tree, so a failed write-out leaves it as it was.
fn encode_rec(
    child: &Child,
    level: u8,
    uuid: &[u8; 16],
    generation: u64,
    addrs: &mut std::slice::Iter<'_, u64>,
    w: &mut RunWriter<'_>,
) -> FsResult<(u64, u64)> {
    let node = match child {
        Child::Clean { addr, generation } => return Ok((*addr, *generation)),
        Child::Dirty(n) => n,
    };
    let refs = match &node.body {
        Body::Leaf(_) => Vec::new(),
        Body::Internal(children) => children
            .iter()
            .map(|c| encode_rec(c, level.saturating_sub(1), uuid, generation, addrs, w))
            .collect::<FsResult<Vec<_>>>()?,
    };
    let &addr = addrs
        .next()
        .ok_or_else(|| FsError::Corrupt("tree: fewer addresses than dirty nodes".into()))?;
    let entries = match &node.body {
        Body::Leaf(vals) => Entries::Leaf(vals),
        Body::Internal(_) => Entries::Internal(&refs),
    };
    node::encode(
        uuid,
        addr,
        generation,
        level,
        &node.keys,
        entries,
        w.block(addr)?,
    )?;
    Ok((addr, generation))
}

/// After the writes succeeded: turn the dirty nodes under `child` clean at
/// the addresses [`encode_rec`] gave them (same order), caching them.
fn commit_rec(
    child: &mut Child,
    level: u8,
    generation: u64,
    addrs: &mut std::slice::Iter<'_, u64>,
    cache: &mut NodeCache<Node>,
) {
    let Child::Dirty(node) = child else { return };
    if let Body::Internal(children) = &mut node.body {
        for c in children {
            commit_rec(c, level.saturating_sub(1), generation, addrs, cache);
        }
    }
    let Some(&addr) = addrs.next() else { return };
    if let Child::Dirty(node) = std::mem::replace(child, Child::Clean { addr, generation }) {
        cache.insert(addr, generation, level, Arc::from(node));
    }
}

/// The metadata tree, with its changes since the last write-out in memory.
pub struct Tree {
    uuid: [u8; 16],
    /// The last root written out (or opened).
    committed: TreeRoot,
    /// The working root; `None` = empty.
    root: Option<Child>,
    level: u8,
    /// Clean nodes of `committed` that the working tree no longer uses.
    freed: Vec<u64>,
    changed: bool,
    /// Highest generation seen; a write-out must use a higher one.
    last_generation: u64,
    cache: NodeCache<Node>,
}

impl Tree {
    /// Open the tree at `root` (no I/O yet), caching up to `cache_nodes`
    /// decoded clean nodes.
    pub fn new(uuid: [u8; 16], root: TreeRoot, cache_nodes: usize) -> Tree {
        Tree {
            uuid,
            committed: root,
            root: Self::root_child(root),
            level: root.level,
            freed: Vec::new(),
            changed: false,
            last_generation: root.generation,
            cache: NodeCache::new(cache_nodes),
        }
    }

    /// The working root, its level, the changed flag and the context a
    /// descent needs, borrowed apart from one another.
    fn parts<'a>(
        &'a mut self,
        store: &'a dyn BlockStore,
    ) -> (&'a mut Option<Child>, &'a mut u8, &'a mut bool, Ctx<'a>) {
        let Tree {
            uuid,
            root,
            level,
            freed,
            cache,
            changed,
            ..
        } = self;
        let ctx = Ctx {
            store,
            uuid,
            cache,
            freed,
        };
        (root, level, changed, ctx)
    }

    fn root_child(root: TreeRoot) -> Option<Child> {
        (root.addr != 0).then_some(Child::Clean {
            addr: root.addr,
            generation: root.generation,
        })
    }

    /// The last written-out (or opened) root.
    pub fn root(&self) -> TreeRoot {
        self.committed
    }

    /// Whether there are changes not yet written out.
    pub fn is_dirty(&self) -> bool {
        self.changed
    }

    /// Nodes changed and not yet written out.
    pub fn dirty_nodes(&self) -> usize {
        if !self.changed {
            return 0;
        }
        self.root.as_ref().map_or(0, count_dirty)
    }

    /// Decoded clean nodes held in the cache.
    pub fn cached_nodes(&self) -> usize {
        self.cache.len()
    }

    pub fn get(&mut self, store: &dyn BlockStore, key: &[u8]) -> FsResult<Option<Vec<u8>>> {
        let (root, level, _, mut ctx) = self.parts(store);
        let Some(root) = root else { return Ok(None) };
        get_rec(root, *level, &mut ctx, key)
    }

    /// Insert `key` or replace its value.
    pub fn put(&mut self, store: &dyn BlockStore, key: &[u8], value: &[u8]) -> FsResult<()> {
        if key.len() > MAX_KEY {
            return Err(FsError::Invalid("tree key longer than MAX_KEY"));
        }
        if key.len() + value.len() > MAX_ENTRY {
            return Err(FsError::Invalid("tree entry larger than MAX_ENTRY"));
        }
        let (root, level, changed, mut ctx) = self.parts(store);
        let Some(top) = root else {
            *root = Some(Child::Dirty(Box::new(Node::leaf(key, value))));
            *level = 0;
            *changed = true;
            return Ok(());
        };
        let node = make_dirty(top, *level, &mut ctx)?;
        *changed = true;
        let appended = insert_rec(node, &mut ctx, key, value)?;
        if node.bytes <= NODE_SIZE {
            return Ok(());
        }
        let pieces = node.split_overflow(appended);
        let Some(old) = root.take() else {
            return Ok(());
        };
        let mut keys = vec![Vec::new()];
        let mut children = vec![old];
        for (sep, piece) in pieces {
            keys.push(sep);
            children.push(Child::Dirty(Box::new(piece)));
        }
        let mut top = Node {
            level: *level + 1,
            keys,
            body: Body::Internal(children),
            bytes: 0,
        };
        top.recount();
        *level += 1;
        *root = Some(Child::Dirty(Box::new(top)));
        Ok(())
    }

    /// Delete `key`; whether it was there.
    pub fn delete(&mut self, store: &dyn BlockStore, key: &[u8]) -> FsResult<bool> {
        // Look first, so deleting a missing key copies no nodes.
        if self.get(store, key)?.is_none() {
            return Ok(false);
        }
        let (root, level, changed, mut ctx) = self.parts(store);
        let Some(top) = root else { return Ok(false) };
        let node = make_dirty(top, *level, &mut ctx)?;
        *changed = true;
        let found = delete_rec(node, &mut ctx, key)?;
        self.shrink_root();
        Ok(found)
    }

    /// Delete every key in `[start, end)`; returns how many.
    pub fn delete_range(
        &mut self,
        store: &dyn BlockStore,
        start: &[u8],
        end: &[u8],
    ) -> FsResult<u64> {
        if start >= end {
            return Ok(0);
        }
        let mut any = false;
        self.scan(store, start, end, &mut |_, _| {
            any = true;
            Ok(false)
        })?;
        if !any {
            return Ok(0);
        }
        let (root, level, changed, mut ctx) = self.parts(store);
        let Some(top) = root else { return Ok(0) };
        let node = make_dirty(top, *level, &mut ctx)?;
        *changed = true;
        let n = range_rec(node, &mut ctx, (start, end), &[], None)?;
        self.shrink_root();
        Ok(n)
    }

    /// Visit the keys in `[start, end)` in order; `f` returns false to stop.
    pub fn scan(
        &mut self,
        store: &dyn BlockStore,
        start: &[u8],
        end: &[u8],
        f: &mut ScanFn<'_>,
    ) -> FsResult<()> {
        let (root, level, _, mut ctx) = self.parts(store);
        let Some(root) = root else { return Ok(()) };
        if start >= end {
            return Ok(());
        }
        scan_rec(root, *level, &mut ctx, start, end, f).map(|_| ())
    }

    /// Drop emptied roots and internal roots with a single child.
    fn shrink_root(&mut self) {
        loop {
            let Some(Child::Dirty(node)) = &mut self.root else {
                return;
            };
            match &mut node.body {
                Body::Leaf(vals) if vals.is_empty() => {
                    self.root = None;
                    self.level = 0;
                    return;
                }
                Body::Internal(children) if children.is_empty() => {
                    self.root = None;
                    self.level = 0;
                    return;
                }
                Body::Internal(children) if children.len() == 1 => {
                    self.root = children.pop();
                    self.level = self.level.saturating_sub(1);
                }
                _ => return,
            }
        }
    }

    /// Write every node changed since the last write-out to addresses from
    /// `alloc`, children before parents, stamped with `generation` (which
    /// must be greater than any earlier one), coalescing consecutive
    /// addresses into store writes of up to 1 MiB. Does not flush. On error
    /// the addresses taken from `alloc` are released and the tree is as it
    /// was (still dirty, still readable), so the call can be retried.
    pub fn write_out(
        &mut self,
        store: &dyn BlockStore,
        alloc: &mut dyn NodeAlloc,
        generation: u64,
    ) -> FsResult<WriteOut> {
        if !self.changed {
            return Ok(WriteOut {
                root: self.committed,
                freed: Vec::new(),
                written: 0,
            });
        }
        // The same generation again is a checkpoint retried after its root
        // could not be written: the nodes of the failed try stay in the
        // tree or wait, unreusable, for a durable root, so no address ever
        // holds two different nodes of one generation.
        if generation < self.last_generation {
            return Err(FsError::Invalid(
                "tree write-out generation must not go back",
            ));
        }
        let n = self.root.as_ref().map_or(0, count_dirty);
        let addrs = if n > 0 { alloc.alloc(n)? } else { Vec::new() };
        if addrs.len() != n || addrs.iter().any(|&a| a == 0 || a % NODE_SIZE as u64 != 0) {
            alloc.release(&addrs);
            return Err(FsError::Invalid(
                "node allocator gave a wrong number of addresses or unaligned ones",
            ));
        }
        let written = (|| {
            let mut w = RunWriter {
                store,
                start: 0,
                buf: Vec::with_capacity(MAX_RUN.min(n * NODE_SIZE)),
            };
            let top = match &self.root {
                Some(root) => Some(encode_rec(
                    root,
                    self.level,
                    &self.uuid,
                    generation,
                    &mut addrs.iter(),
                    &mut w,
                )?),
                None => None,
            };
            w.finish()?;
            Ok::<_, FsError>(top)
        })();
        let top = match written {
            Ok(top) => top,
            Err(e) => {
                alloc.release(&addrs);
                return Err(e);
            }
        };
        let freed = std::mem::take(&mut self.freed);
        for &a in &freed {
            self.cache.remove(a);
        }
        if let Some(root) = &mut self.root {
            commit_rec(
                root,
                self.level,
                generation,
                &mut addrs.iter(),
                &mut self.cache,
            );
        }
        let nodes = (self.committed.nodes + n as u64).saturating_sub(freed.len() as u64);
        self.committed = match top {
            Some((addr, root_gen)) => TreeRoot {
                addr,
                generation: root_gen,
                level: self.level,
                nodes,
            },
            None => TreeRoot {
                addr: 0,
                generation,
                level: 0,
                nodes: 0,
            },
        };
        self.last_generation = generation;
        self.changed = false;
        Ok(WriteOut {
            root: self.committed,
            freed,
            written: n as u64,
        })
    }

    /// Forget the changes since the last write-out: back to [`Tree::root`].
    pub fn discard_changes(&mut self) {
        self.root = Self::root_child(self.committed);
        self.level = self.committed.level;
        self.freed.clear();
        self.changed = false;
    }
}

/// Walk every node reachable from `root`, verifying each (checksum,
/// address, generation, level, key order, keys within the parent's
/// separator bounds, no node reached twice), and call `f(addr, level)` for
/// each: for fsck and for rebuilding the free-node map at mount. Returns the
/// number of nodes. Errors name the node and what is wrong.
pub fn walk(
    store: &dyn BlockStore,
    uuid: &[u8; 16],
    root: TreeRoot,
    f: &mut dyn FnMut(u64, u8) -> FsResult<()>,
) -> FsResult<u64> {
    if root.addr == 0 {
        return Ok(0);
    }
    walk_with(store, uuid, root, f, None)
}

/// [`walk`], also handing every entry to `entry` in key order: one pass
/// reads each node once, where a walk and then a scan would read the
/// leaves twice. `entry`'s answer is ignored: the walk goes on to the end.
pub fn walk_entries(
    store: &dyn BlockStore,
    uuid: &[u8; 16],
    root: TreeRoot,
    f: &mut dyn FnMut(u64, u8) -> FsResult<()>,
    entry: &mut ScanFn<'_>,
) -> FsResult<u64> {
    walk_with(store, uuid, root, f, Some(entry))
}

fn walk_with(
    store: &dyn BlockStore,
    uuid: &[u8; 16],
    root: TreeRoot,
    f: &mut dyn FnMut(u64, u8) -> FsResult<()>,
    entry: Option<&mut ScanFn<'_>>,
) -> FsResult<u64> {
    if root.addr == 0 {
        return Ok(0);
    }
    let mut seen = HashSet::new();
    let mut w = Walk {
        store,
        uuid,
        seen: &mut seen,
        f,
        entry,
    };
    w.visit(root.addr, root.generation, root.level, &[], None)
}

struct Walk<'a, 'f, 'e> {
    store: &'a dyn BlockStore,
    uuid: &'a [u8; 16],
    seen: &'a mut HashSet<u64>,
    f: &'a mut (dyn FnMut(u64, u8) -> FsResult<()> + 'f),
    entry: Option<&'a mut ScanFn<'e>>,
}

impl Walk<'_, '_, '_> {
    fn visit(
        &mut self,
        addr: u64,
        generation: u64,
        level: u8,
        lo: &[u8],
        hi: Option<&[u8]>,
    ) -> FsResult<u64> {
        if !self.seen.insert(addr) {
            return Err(node_fault(addr, "reached twice"));
        }
        let p = read_node(self.store, self.uuid, addr, generation, level)?;
        let skip = usize::from(level > 0); // an internal entry 0 key is minus infinity
        if let (Some(first), Some(last)) = (p.keys.get(skip), p.keys.last()) {
            if first.as_slice() < lo || hi.is_some_and(|h| last.as_slice() >= h) {
                return Err(node_fault(
                    addr,
                    "keys lie outside the bounds its parent gives it",
                ));
            }
        }
        (self.f)(addr, level)?;
        let mut nodes = 1;
        if let (node::Body::Leaf(values), Some(entry)) = (&p.body, self.entry.as_mut()) {
            for (k, v) in p.keys.iter().zip(values) {
                entry(k, v)?;
            }
        }
        if let node::Body::Internal(children) = &p.body {
            let n = children.len();
            for (i, &(child, child_gen)) in children.iter().enumerate() {
                let l = if i == 0 { lo } else { p.keys[i].as_slice() };
                let h = if i + 1 < n {
                    Some(p.keys[i + 1].as_slice())
                } else {
                    hi
                };
                nodes += self.visit(child, child_gen, level - 1, l, h)?;
            }
        }
        Ok(nodes)
    }
}

#[cfg(test)]
mod tests;
