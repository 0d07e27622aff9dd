//! The data checksums as a mounted filesystem holds them.
//!
//! Over a metadata tree the map is not held whole: it costs about 1 MiB per
//! GiB of data, so a mount of a large array would read and keep gigabytes.
//! [`SharedCsums`] holds instead
//! - the chunks changed since the last checkpoint, each whole (read from the
//!   tree before its first change), never evicted;
//! - the chunk ranges removed whole since then, which the tree still holds
//!   until the checkpoint deletes them;
//! - a budgeted cache of clean chunks (CLOCK, as the inode cache), and
//!   absent ones, read from the tree when used;
//! - the chunks read for the content judge ([`SharedCsums::prepare`]).
//!
//! The map sits behind its own lock, not the state lock: the array's scrub
//! and resync ask the judge which copy of a block is right while they hold
//! a stripe lock, and the state lock may be held by an operation whose
//! metadata read waits for that same stripe. So the judge reads with this
//! lock alone and never reads the tree ([`SharedCsums::judged`]); the array
//! asks for the chunks beforehand, with no stripe lock held. This lock is
//! only ever held for in-memory work; reads of the tree happen between its
//! holds. It is taken after the state lock, never before.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::{
    MappedRwLockReadGuard, MappedRwLockWriteGuard, RwLock, RwLockReadGuard, RwLockWriteGuard,
};

use super::csum::{locate, CsumChunk, CsumMap, CHUNK_BLOCKS};
use super::inode::BLOCK_SIZE;
use super::inode_cache::MetaSource;
use super::{FsError, FsResult};

/// What one cached chunk costs, roughly: its 64 checksums, mask, map slot
/// and ring entry.
const CHUNK_COST: u64 = 360;

/// Chunks kept for the judge: a scrub or resync step's worth many times
/// over (a step of 4 MiB spans 16 chunks).
const JUDGING_CHUNKS: usize = 4096;

/// Chunks read for one [`SharedCsums::prepare`] at most.
const PREPARE_MAX_CHUNKS: u64 = 1024;

/// The mounted filesystem's checksum map; see the module header.
pub struct SharedCsums {
    map: Arc<RwLock<Csums>>,
    /// Where chunks not held are read (None: the map is whole).
    source: Option<Arc<dyn MetaSource>>,
}

impl std::fmt::Debug for SharedCsums {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedCsums")
            .field("held", &self.held())
            .finish()
    }
}

impl Default for SharedCsums {
    fn default() -> SharedCsums {
        SharedCsums::new(CsumMap::default())
    }
}

#[derive(Debug)]
enum Csums {
    Whole(CsumMap),
    Partial(Partial),
}

#[derive(Debug)]
struct Partial {
    /// Changed since the last checkpoint, whole; an emptied one is kept
    /// (with no block present) until then.
    dirty: HashMap<u64, CsumChunk>,
    /// Chunk ranges `first → last` removed whole since the last
    /// checkpoint and not changed again (those are in `dirty`); disjoint.
    gone: BTreeMap<u64, u64>,
    clean: Clock,
    /// Read for the content judge, oldest first.
    judging: HashMap<u64, Option<CsumChunk>>,
    judging_order: VecDeque<u64>,
    /// Counts checkpoints: a chunk read from the tree before one is not
    /// kept after it (the tree may have changed under the read).
    epoch: u64,
}

/// What is known of a chunk without reading the tree.
enum Known {
    Chunk(Option<CsumChunk>),
    Unknown,
}

impl Partial {
    fn known(&self, key: u64, for_judge: bool) -> Known {
        if let Some(c) = self.dirty.get(&key) {
            return Known::Chunk((!c.is_empty()).then(|| c.clone()));
        }
        if self.is_gone(key) {
            return Known::Chunk(None);
        }
        if let Some(c) = self.clean.get(key) {
            return Known::Chunk(c.clone());
        }
        if for_judge {
            if let Some(c) = self.judging.get(&key) {
                return Known::Chunk(c.clone());
            }
        }
        Known::Unknown
    }

    fn is_gone(&self, key: u64) -> bool {
        self.gone
            .range(..=key)
            .next_back()
            .is_some_and(|(_, &last)| key <= last)
    }

    /// Record `[first, last]` as removed whole, merged with the ranges it
    /// overlaps or touches.
    fn add_gone(&mut self, mut first: u64, mut last: u64) {
        let touching: Vec<(u64, u64)> = self
            .gone
            .range(..=last.saturating_add(1))
            .rev()
            .take_while(|(_, &l)| l.saturating_add(1) >= first)
            .map(|(&f, &l)| (f, l))
            .collect();
        for (f, l) in touching {
            self.gone.remove(&f);
            first = first.min(f);
            last = last.max(l);
        }
        self.gone.insert(first, last);
    }

    /// The chunk is about to change or go: what the cache and the judge
    /// hold of it is no longer true.
    fn forget(&mut self, key: u64) {
        self.clean.remove(key);
        if self.judging.remove(&key).is_some() {
            self.judging_order.retain(|&k| k != key);
        }
    }

    fn forget_range(&mut self, first: u64, last: u64) {
        let span = last - first + 1;
        let resident = (self.dirty.len() + self.clean.len() + self.judging.len()) as u64;
        if span <= resident {
            for key in first..=last {
                self.dirty.remove(&key);
                self.forget(key);
            }
        } else {
            let inside = |k: &u64| (first..=last).contains(k);
            self.dirty.retain(|k, _| !inside(k));
            self.clean.retain(|k| !inside(&k));
            self.judging.retain(|k, _| !inside(k));
            self.judging_order.retain(|k| !inside(k));
        }
    }
}

impl SharedCsums {
    /// Every chunk held (fsck, upgrade, the formats without a tree).
    pub fn new(map: CsumMap) -> SharedCsums {
        SharedCsums {
            map: Arc::new(RwLock::new(Csums::Whole(map))),
            source: None,
        }
    }

    /// Chunks read from `source` when used, `budget` bytes of clean ones
    /// kept.
    pub fn partial(source: Arc<dyn MetaSource>, budget: u64) -> SharedCsums {
        SharedCsums {
            map: Arc::new(RwLock::new(Csums::Partial(Partial {
                dirty: HashMap::new(),
                gone: BTreeMap::new(),
                clean: Clock::new((budget / CHUNK_COST) as usize),
                judging: HashMap::new(),
                judging_order: VecDeque::new(),
                epoch: 0,
            }))),
            source: Some(source),
        }
    }

    /// A second handle on the same map, for a reader that must not take
    /// the state lock (the content judge).
    pub fn share(&self) -> SharedCsums {
        SharedCsums {
            map: Arc::clone(&self.map),
            source: self.source.clone(),
        }
    }

    /// The whole map, where it is held whole (fsck, upgrade, checkpoints
    /// of the formats without a tree); an error over a tree mount.
    pub fn whole(&self) -> FsResult<MappedRwLockReadGuard<'_, CsumMap>> {
        RwLockReadGuard::try_map(self.map.read(), |c| match c {
            Csums::Whole(m) => Some(m),
            Csums::Partial(_) => None,
        })
        .map_err(|_| not_whole())
    }

    pub fn whole_mut(&self) -> FsResult<MappedRwLockWriteGuard<'_, CsumMap>> {
        RwLockWriteGuard::try_map(self.map.write(), |c| match c {
            Csums::Whole(m) => Some(m),
            Csums::Partial(_) => None,
        })
        .map_err(|_| not_whole())
    }

    /// The chunk `key`, read from the tree when it is not held.
    fn chunk(&self, key: u64) -> FsResult<Option<CsumChunk>> {
        let epoch = {
            let map = self.map.read();
            match &*map {
                Csums::Whole(m) => return Ok(m.chunk(key).cloned()),
                Csums::Partial(p) => match p.known(key, false) {
                    Known::Chunk(c) => return Ok(c),
                    Known::Unknown => p.epoch,
                },
            }
        };
        let chunk = self.read_chunk(key)?;
        if let Csums::Partial(p) = &mut *self.map.write() {
            if p.epoch == epoch && matches!(p.known(key, false), Known::Unknown) {
                p.clean.insert(key, chunk.clone());
            }
        }
        Ok(chunk)
    }

    fn read_chunk(&self, key: u64) -> FsResult<Option<CsumChunk>> {
        let Some(source) = &self.source else {
            return Ok(None);
        };
        source
            .csum_chunk(key)?
            .map(|b| {
                CsumChunk::from_bytes(&b).map_err(|e| {
                    FsError::Corrupt(format!("checksum chunk {key} in the metadata tree: {e}"))
                })
            })
            .transpose()
    }

    /// The checksum of the block at `addr`, if it has one.
    pub fn get(&self, addr: u64) -> FsResult<Option<u32>> {
        let (key, bit) = locate(addr);
        Ok(self.chunk(key)?.and_then(|c| c.get(bit)))
    }

    /// Checksums of `n` consecutive blocks from `addr`.
    pub fn get_run(&self, addr: u64, n: usize) -> FsResult<Vec<Option<u32>>> {
        let mut out = Vec::with_capacity(n);
        let mut current: Option<(u64, Option<CsumChunk>)> = None;
        for i in 0..n as u64 {
            let (key, bit) = locate(addr + i * BLOCK_SIZE);
            if current.as_ref().is_none_or(|(k, _)| *k != key) {
                current = Some((key, self.chunk(key)?));
            }
            out.push(current.as_ref().and_then(|(_, c)| c.as_ref()?.get(bit)));
        }
        Ok(out)
    }

    /// The chunk `key` as it will be changed: held in `dirty` (read first
    /// when it is not known, unless every block of it is about to be set:
    /// `whole`). Called with the state lock held for writing, so nothing
    /// else changes the map meanwhile.
    fn make_dirty(&self, key: u64, whole: bool) -> FsResult<()> {
        let known = match &*self.map.read() {
            Csums::Whole(_) => return Ok(()),
            Csums::Partial(p) if p.dirty.contains_key(&key) => return Ok(()),
            Csums::Partial(_) if whole => Some(None),
            Csums::Partial(p) => match p.known(key, false) {
                Known::Chunk(c) => Some(c),
                Known::Unknown => None,
            },
        };
        let chunk = match known {
            Some(c) => c,
            None => self.read_chunk(key)?,
        };
        if let Csums::Partial(p) = &mut *self.map.write() {
            p.forget(key);
            p.dirty.insert(key, chunk.unwrap_or_else(CsumChunk::empty));
        }
        Ok(())
    }

    /// Make ready to set the checksums of the `blocks` blocks from `addr`:
    /// every chunk they share with other blocks is read now, so that the
    /// [`SharedCsums::set`] that follows a change cannot fail.
    pub fn ready(&self, addr: u64, blocks: u64) -> FsResult<()> {
        if self.source.is_none() || blocks == 0 {
            return Ok(());
        }
        let first = addr / BLOCK_SIZE;
        let end = first.saturating_add(blocks);
        for key in [first / CHUNK_BLOCKS, (end - 1) / CHUNK_BLOCKS] {
            let covered = first <= key * CHUNK_BLOCKS && (key + 1) * CHUNK_BLOCKS <= end;
            self.make_dirty(key, covered)?;
        }
        Ok(())
    }

    /// Set the checksums of consecutive blocks starting at `addr`.
    pub fn set(&self, addr: u64, crcs: &[u32]) -> FsResult<()> {
        let mut i = 0;
        while i < crcs.len() {
            // A run past the end of the address space (only a damaged
            // record has one) stops there.
            let Some(block_addr) = addr.checked_add(i as u64 * BLOCK_SIZE) else {
                break;
            };
            let (key, bit) = locate(block_addr);
            let n = (CHUNK_BLOCKS as usize - bit).min(crcs.len() - i);
            self.make_dirty(key, n == CHUNK_BLOCKS as usize)?;
            match &mut *self.map.write() {
                Csums::Whole(m) => m.set(block_addr, &crcs[i..i + n]),
                Csums::Partial(p) => {
                    let chunk = p.dirty.entry(key).or_insert_with(CsumChunk::empty);
                    for (j, &crc) in crcs[i..i + n].iter().enumerate() {
                        chunk.set(bit + j, crc);
                    }
                }
            }
            i += n;
        }
        Ok(())
    }

    /// Forget the checksums of `[addr, addr + len)`. Chunks only partly in
    /// the range are read and changed; those wholly in it are recorded as
    /// removed, costing the smaller of their number and what is held.
    pub fn remove(&self, addr: u64, len: u64) -> FsResult<()> {
        if let Csums::Whole(m) = &mut *self.map.write() {
            m.remove(addr, len);
            return Ok(());
        }
        let first_block = addr / BLOCK_SIZE;
        let Some(end_block) = first_block.checked_add(len / BLOCK_SIZE) else {
            return Ok(());
        };
        if end_block == first_block {
            return Ok(());
        }
        let (first_key, last_key) = (first_block / CHUNK_BLOCKS, (end_block - 1) / CHUNK_BLOCKS);
        let whole_from = first_block.div_ceil(CHUNK_BLOCKS);
        let whole_end = end_block / CHUNK_BLOCKS; // exclusive
        for key in [first_key, last_key] {
            if (whole_from..whole_end).contains(&key) {
                continue;
            }
            self.make_dirty(key, false)?;
            if let Csums::Partial(p) = &mut *self.map.write() {
                if let Some(chunk) = p.dirty.get_mut(&key) {
                    let lo = (key * CHUNK_BLOCKS).max(first_block);
                    let hi = ((key + 1) * CHUNK_BLOCKS).min(end_block);
                    for block in lo..hi {
                        chunk.clear((block % CHUNK_BLOCKS) as usize);
                    }
                }
            }
        }
        if whole_from < whole_end {
            if let Csums::Partial(p) = &mut *self.map.write() {
                p.forget_range(whole_from, whole_end - 1);
                p.add_gone(whole_from, whole_end - 1);
            }
        }
        Ok(())
    }

    /// The checksum of the block at `addr` as far as it is known without
    /// reading the tree: for the content judge, under a stripe lock. A
    /// chunk neither held nor prepared answers None (nothing known), and
    /// the judge then lets md's choice stand.
    pub fn judged(&self, addr: u64) -> Option<u32> {
        let (key, bit) = locate(addr);
        match &*self.map.read() {
            Csums::Whole(m) => m.get(addr),
            Csums::Partial(p) => match p.known(key, true) {
                Known::Chunk(c) => c?.get(bit),
                Known::Unknown => {
                    log::debug!("checksum chunk {key} not read before the judge asked");
                    None
                }
            },
        }
    }

    /// The array is about to judge blocks of `[addr, addr + len)`: read
    /// their chunks now, with no stripe lock held, so that
    /// [`SharedCsums::judged`] knows them. A chunk that cannot be read is
    /// left unknown (the judge then lets md's choice stand).
    pub fn prepare(&self, addr: u64, len: u64) {
        let Some((first, last)) = CsumMap::chunk_span(addr, len) else {
            return;
        };
        let last = last.min(first.saturating_add(PREPARE_MAX_CHUNKS - 1));
        for key in first..=last {
            let epoch = match &*self.map.read() {
                Csums::Whole(_) => return,
                Csums::Partial(p) => match p.known(key, true) {
                    Known::Chunk(_) => continue,
                    Known::Unknown => p.epoch,
                },
            };
            let chunk = match self.read_chunk(key) {
                Ok(c) => c,
                Err(e) => {
                    log::warn!("checksum chunk {key} for a scrub or resync: {e}");
                    continue;
                }
            };
            if let Csums::Partial(p) = &mut *self.map.write() {
                if p.epoch == epoch && matches!(p.known(key, true), Known::Unknown) {
                    p.judging.insert(key, chunk);
                    p.judging_order.push_back(key);
                    while p.judging_order.len() > JUDGING_CHUNKS {
                        if let Some(old) = p.judging_order.pop_front() {
                            p.judging.remove(&old);
                        }
                    }
                }
            }
        }
    }

    /// The chunks a checkpoint puts for the touched chunk ranges `spans`
    /// (sorted, disjoint) after deleting them from the tree, as the tree
    /// stores them, ascending.
    pub fn chunks_for(&self, spans: &[(u64, u64)]) -> Vec<(u64, Vec<u8>)> {
        let within = |key: u64| {
            let i = spans.partition_point(|&(first, _)| first <= key);
            i > 0 && key <= spans[i - 1].1
        };
        match &*self.map.read() {
            Csums::Whole(m) => spans
                .iter()
                .flat_map(|&(first, last)| m.chunk_keys_in(first, last))
                .filter_map(|key| Some((key, m.chunk_bytes(key)?)))
                .collect(),
            Csums::Partial(p) => {
                let mut out: Vec<(u64, Vec<u8>)> = p
                    .dirty
                    .iter()
                    .filter(|(&key, c)| !c.is_empty() && within(key))
                    .map(|(&key, c)| (key, c.to_bytes()))
                    .collect();
                out.sort_unstable_by_key(|(key, _)| *key);
                out
            }
        }
    }

    /// A checkpoint put every change into the tree: changed chunks become
    /// clean (evictable), ranges removed are gone from the tree too.
    pub fn settle(&self) {
        if let Csums::Partial(p) = &mut *self.map.write() {
            p.epoch += 1;
            p.gone.clear();
            p.judging.clear();
            p.judging_order.clear();
            for (key, chunk) in std::mem::take(&mut p.dirty) {
                p.clean.insert(key, (!chunk.is_empty()).then_some(chunk));
            }
        }
    }

    /// Chunks held: (changed since the last checkpoint, clean).
    pub fn held(&self) -> (usize, usize) {
        match &*self.map.read() {
            Csums::Whole(m) => (m.chunk_count(), 0),
            Csums::Partial(p) => (p.dirty.len(), p.clean.len()),
        }
    }
}

fn not_whole() -> FsError {
    FsError::Corrupt(
        "the whole checksum map was asked of a mount that reads it from the tree".into(),
    )
}

/// Clean chunks (and chunks known absent) with a CLOCK hand: a hit sets
/// the entry's bit without the map's write lock; eviction passes over set
/// bits once, clearing them.
#[derive(Debug)]
struct Clock {
    capacity: usize,
    map: HashMap<u64, (Option<CsumChunk>, AtomicBool)>,
    ring: VecDeque<u64>,
}

impl Clock {
    fn new(capacity: usize) -> Clock {
        Clock {
            capacity,
            map: HashMap::new(),
            ring: VecDeque::new(),
        }
    }

    fn len(&self) -> usize {
        self.map.len()
    }

    fn get(&self, key: u64) -> Option<&Option<CsumChunk>> {
        let (chunk, used) = self.map.get(&key)?;
        used.store(true, Ordering::Relaxed);
        Some(chunk)
    }

    fn insert(&mut self, key: u64, chunk: Option<CsumChunk>) {
        if self.capacity == 0 {
            return;
        }
        if self
            .map
            .insert(key, (chunk, AtomicBool::new(false)))
            .is_none()
        {
            self.ring.push_back(key);
        }
        while self.map.len() > self.capacity {
            let Some(k) = self.ring.pop_front() else {
                break;
            };
            match self.map.get(&k) {
                Some((_, used)) if used.swap(false, Ordering::Relaxed) => self.ring.push_back(k),
                Some(_) => {
                    self.map.remove(&k);
                }
                // Removed meanwhile: its ring slot goes with it.
                None => {}
            }
        }
    }

    fn remove(&mut self, key: u64) {
        // The ring keeps the key until the hand passes it.
        self.map.remove(&key);
        if self.ring.len() > 2 * self.capacity.max(1) {
            let map = &self.map;
            self.ring.retain(|k| map.contains_key(k));
        }
    }

    fn retain(&mut self, keep: impl Fn(u64) -> bool) {
        self.map.retain(|&k, _| keep(k));
        let map = &self.map;
        self.ring.retain(|k| map.contains_key(k));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::dir::Slot;
    use crate::fs::inode::Inode;
    use crate::fs::inode_cache::Listed;
    use crate::fs::FileKind;
    use rand::{Rng, SeedableRng};

    /// A tree that holds checksum chunks only.
    #[derive(Default)]
    struct Chunks(parking_lot::Mutex<BTreeMap<u64, Vec<u8>>>);

    impl MetaSource for Chunks {
        fn load(&self, _: u64) -> FsResult<Option<Inode>> {
            Ok(None)
        }
        fn kind(&self, _: u64) -> FsResult<Option<FileKind>> {
            Ok(None)
        }
        fn inos_from(&self, _: u64, _: usize) -> FsResult<Vec<u64>> {
            Ok(Vec::new())
        }
        fn dirent(&self, _: u64, _: &[u8]) -> FsResult<Option<Slot>> {
            Ok(None)
        }
        fn listed(&self, _: u64, _: u64, _: u64, _: usize) -> FsResult<Vec<Listed>> {
            Ok(Vec::new())
        }
        fn names(&self, _: u64, _: Option<&[u8]>, _: usize) -> FsResult<Vec<Vec<u8>>> {
            Ok(Vec::new())
        }
        fn names_of(&self, _: u64, _: usize) -> FsResult<Vec<(u64, Vec<u8>)>> {
            Ok(Vec::new())
        }
        fn csum_chunk(&self, key: u64) -> FsResult<Option<Vec<u8>>> {
            Ok(self.0.lock().get(&key).cloned())
        }
    }

    /// A checkpoint as the metadata tree takes one: each touched span
    /// deleted, then the chunks memory holds of the spans put.
    fn checkpoint(csums: &SharedCsums, tree: &Chunks, touched: &mut Vec<(u64, u64)>) {
        touched.sort_unstable();
        let mut spans: Vec<(u64, u64)> = Vec::new();
        for &(first, last) in touched.iter() {
            match spans.last_mut() {
                Some((_, end)) if first <= end.saturating_add(1) => *end = (*end).max(last),
                _ => spans.push((first, last)),
            }
        }
        touched.clear();
        let chunks = csums.chunks_for(&spans);
        let mut t = tree.0.lock();
        for (first, last) in spans {
            let doomed: Vec<u64> = t.range(first..=last).map(|(&k, _)| k).collect();
            for k in doomed {
                t.remove(&k);
            }
        }
        t.extend(chunks);
        drop(t);
        csums.settle();
    }

    /// Random sets, removals (from one block to thousands of chunks) and
    /// checkpoints over a small address space, with caches of no chunk, a
    /// few and many: every block reads as a whole map says, the judge
    /// never says something else (only, unprepared, nothing), and the
    /// tree after a checkpoint holds exactly the whole map's chunks.
    #[test]
    fn a_partly_held_map_reads_as_the_whole_map_and_so_does_its_tree() {
        for seed in 0..24u64 {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let budget = [0, 4 * CHUNK_COST, 1 << 20][seed as usize % 3];
            let tree = Arc::new(Chunks::default());
            let csums = SharedCsums::partial(Arc::clone(&tree) as _, budget);
            let judge = csums.share();
            let mut model = CsumMap::default();
            let mut touched = Vec::new();
            let blocks = 64 * 300u64;
            for step in 0..400 {
                let at = rng.gen_range(0..blocks);
                let n = match rng.gen_range(0..4) {
                    0 => 1,
                    1 => rng.gen_range(1..200),
                    _ => rng.gen_range(1..(blocks - at).max(2)),
                }
                .min(blocks - at);
                let addr = at * BLOCK_SIZE;
                match rng.gen_range(0..10) {
                    0..=4 => {
                        let crcs: Vec<u32> = (0..n).map(|_| rng.gen()).collect();
                        csums.ready(addr, n).unwrap();
                        csums.set(addr, &crcs).unwrap();
                        model.set(addr, &crcs);
                        // As the record carrying the change notes it.
                        touched.extend(CsumMap::chunk_span(addr, n * BLOCK_SIZE));
                    }
                    5..=7 => {
                        csums.remove(addr, n * BLOCK_SIZE).unwrap();
                        model.remove(addr, n * BLOCK_SIZE);
                        touched.extend(CsumMap::chunk_span(addr, n * BLOCK_SIZE));
                    }
                    _ => {
                        judge.prepare(addr, n * BLOCK_SIZE);
                        for b in at..(at + n).min(at + 64) {
                            let a = b * BLOCK_SIZE;
                            let judged = judge.judged(a);
                            assert!(
                                judged.is_none() || judged == model.get(a),
                                "seed {seed} step {step}: the judge says {judged:?} of block {b}"
                            );
                        }
                    }
                }
                if rng.gen_range(0..8) == 0 {
                    checkpoint(&csums, &tree, &mut touched);
                    let whole: BTreeMap<u64, Vec<u8>> = model
                        .chunk_keys_in(0, u64::MAX)
                        .into_iter()
                        .filter_map(|k| Some((k, model.chunk_bytes(k)?)))
                        .collect();
                    let held = tree.0.lock().clone();
                    let differ: Vec<u64> = held
                        .keys()
                        .chain(whole.keys())
                        .copied()
                        .filter(|k| held.get(k) != whole.get(k))
                        .take(8)
                        .collect();
                    assert!(
                        differ.is_empty(),
                        "seed {seed} step {step}: the tree after a checkpoint differs at chunks {differ:?}"
                    );
                }
                let probe = rng.gen_range(0..blocks - 64);
                let got = csums.get_run(probe * BLOCK_SIZE, 64).unwrap();
                let want = model.get_run(probe * BLOCK_SIZE, 64);
                assert_eq!(got, want, "seed {seed} step {step}: blocks from {probe}");
            }
            for b in 0..blocks {
                assert_eq!(
                    csums.get(b * BLOCK_SIZE).unwrap(),
                    model.get(b * BLOCK_SIZE),
                    "seed {seed}: block {b} at the end"
                );
            }
            let (_, clean) = csums.held();
            assert!(
                clean as u64 <= budget / CHUNK_COST,
                "seed {seed}: {clean} clean chunks kept over a budget of {budget} bytes"
            );
        }
    }

    /// A prepared chunk is known to the judge even with no cache at all;
    /// one not prepared is not read (the judge never reads the tree).
    #[test]
    fn the_judge_knows_what_was_prepared_and_reads_nothing() {
        let tree = Arc::new(Chunks::default());
        let mut chunk = CsumChunk::empty();
        chunk.set(3, 0xfeed);
        tree.0.lock().insert(7, chunk.to_bytes());
        let csums = SharedCsums::partial(Arc::clone(&tree) as _, 0);
        let addr = (7 * CHUNK_BLOCKS + 3) * BLOCK_SIZE;
        assert_eq!(csums.judged(addr), None, "not prepared: unknown");
        csums.prepare(addr, BLOCK_SIZE);
        assert_eq!(csums.judged(addr), Some(0xfeed));
        assert_eq!(csums.get(addr).unwrap(), Some(0xfeed));
        // A change after the prepare is what the judge sees.
        csums.set(addr, &[0xbeef]).unwrap();
        assert_eq!(csums.judged(addr), Some(0xbeef));
    }
}
