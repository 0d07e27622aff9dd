//! The mounted filesystem's engine: loading (checkpoint + replay), the
//! commit path (data and record made durable in order, see `commit`), the
//! periodic commit thread, and the lock helpers operations run under.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::{Condvar, Mutex, RwLock};

use super::alloc::Allocator;
use super::csum::ChecksumKind;
use super::csum_store::SharedCsums;
use super::data_errors::DataErrorLog;
use super::extent::Extent;
use super::inode::{Inode, BLOCK_SIZE};
use super::inode_cache::MetaSource;
use super::journal::{read_slot, read_tree_slot, DataOrder, Journal};
use super::layout::{
    decode, encode, older_format_note, plan_with, read_header, write_header, FS_FEATURES, VERSION,
};
use super::meta::Lazy;
use super::meta::{Meta, MetaImage};
use super::meta_room::MetaRoom;
use super::meta_tree::{MetaTree, TreeSource};
use super::progress::{Progress, Silent};
use super::range_lock::{RangeGuard, RangeLocks};
use super::replay::{left_out_note, replay};
use super::state::State;
use super::store::{BlockStore, GroupInfo, GroupKind, StoreError};
use super::{FileKind, FsError, FsResult, ROOT_INO};

/// A batch this large is committed right away instead of waiting for the timer.
pub(super) const BATCH_LIMIT: usize = 8192;

/// The most new data a record written alongside it may point at: replay
/// after a crash reads all of it back, so larger batches flush their data
/// first (where one more flush costs little next to the data's own writing).
pub(super) const VERIFIED_COMMIT_MAX: u64 = 16 << 20;

/// How a commit makes its batch durable.
#[derive(Clone, Copy)]
enum CommitStep {
    Record(DataOrder),
    Checkpoint,
}

pub struct Inner {
    pub store: Arc<dyn BlockStore>,
    pub state: RwLock<State>,
    pub journal: Mutex<Journal>,
    /// The metadata tree a checkpoint writes into (format with
    /// `metadata_tree`; None: checkpoints are whole images). Locked after
    /// `journal` and `state`.
    pub tree: Option<Arc<Mutex<MetaTree>>>,
    /// Inodes held (changed since the last checkpoint) past which a
    /// checkpoint is taken, so what is held stays within the metadata
    /// cache's budget too ([`held_limit`]).
    held_limit: usize,
    /// Room left for metadata, which every change is admitted against
    /// (with the tree only).
    room: Option<MetaRoom>,
    pub read_only: AtomicBool,
    /// How data blocks are checksummed (from the fs header).
    pub csum: ChecksumKind,
    /// The format has unwritten extents (version 3 on): fallocate reserves
    /// blocks instead of writing zeros into them.
    pub unwritten_extents: bool,
    /// Small commits write their record alongside the data and make both
    /// durable with one flush (version 4 on, with data checksums): replay
    /// checks the last record's data against its checksums.
    pub verified_commits: bool,
    /// Set (until unmount) once a write overwrote data in place because no
    /// free block was left: from then on every record follows flushed data,
    /// since replay cannot check blocks that may have been overwritten.
    in_place_overwrites: AtomicBool,
    /// Extents freed by changes whose commit the host refused (out of
    /// space, or the array suspended): freed once a later commit lands.
    /// While set, the next commit is a checkpoint, whose image covers
    /// the changes the refused record held.
    refused: Mutex<Option<Vec<Extent>>>,
    /// Why a commit failed for good (not the host's refusal): the changes
    /// it carried, and every change since, exist only in memory.
    failed_commit: Mutex<Option<String>>,
    /// Freed space on its way back to the host.
    discards: Discards,
    file_locks: RangeLocks,
    /// File blocks no copy could correct (see [`super::damaged`]).
    pub damaged: super::damaged::DamagedLog,
    /// Data blocks that failed their checksum on a read since the mount.
    pub data_errors: DataErrorLog,
    /// The state's checksum map, reached without the state lock by the
    /// array's content judge (see [`super::csum::SharedCsums`]).
    pub(in crate::fs) judged_csums: SharedCsums,
}

/// What [`load`] found on the store.
pub struct Loaded {
    pub meta: Meta,
    pub journal: Journal,
    /// The metadata tree (format with `metadata_tree`), noting the records
    /// replayed onto `meta` for the next checkpoint.
    pub tree: Option<Arc<Mutex<MetaTree>>>,
    /// Inodes with no name when the tree was written (a mount's load).
    pub orphans: Vec<u64>,
    pub replayed: u64,
    /// A last record left out because its data did not reach the store.
    pub dropped_record: Option<u64>,
    /// Non-fatal findings (a bad header copy, an invalid checkpoint slot).
    pub notes: Vec<String>,
}

/// Node blocks one more Metadata group would bring (the size of those the
/// store holds).
fn metadata_group_blocks(store: &dyn BlockStore) -> u64 {
    store
        .groups()
        .iter()
        .filter(|g| g.kind == GroupKind::Metadata)
        .map(|g| g.capacity / BLOCK_SIZE)
        .max()
        .unwrap_or(0)
}

pub fn metadata_group(store: &dyn BlockStore) -> FsResult<u32> {
    store
        .groups()
        .iter()
        .filter(|g| g.kind == GroupKind::Metadata)
        .map(|g| g.index)
        .min()
        .ok_or_else(|| FsError::Corrupt("the store has no Metadata group (not formatted?)".into()))
}

/// A root-owned filesystem, as the tests of this module's neighbours make.
#[cfg(test)]
pub fn format<S: BlockStore + 'static>(
    store: &Arc<S>,
    data_checksum: ChecksumKind,
    version: u32,
) -> FsResult<()> {
    format_with_features(
        Arc::clone(store) as _,
        data_checksum,
        version,
        super::layout::implied_features(version),
        (0, 0),
    )
}

/// A root-owned filesystem whose checkpoints are whole images (the layout
/// before `metadata_tree`), for tests that turn its header into an older
/// format's.
#[cfg(test)]
pub fn format_images<S: BlockStore + 'static>(
    store: &Arc<S>,
    data_checksum: ChecksumKind,
) -> FsResult<()> {
    let mut features = super::layout::implied_features(VERSION);
    features.incompat &= !super::layout::INCOMPAT_METADATA_TREE;
    format_with_features(
        Arc::clone(store) as _,
        data_checksum,
        VERSION,
        features,
        (0, 0),
    )
}

/// Write an empty filesystem of `version` with `features`, whose root
/// directory belongs to `(uid, gid)`.
pub fn format_with_features(
    store: Arc<dyn BlockStore>,
    data_checksum: ChecksumKind,
    version: u32,
    features: crate::features::Features,
    (root_uid, root_gid): (u32, u32),
) -> FsResult<()> {
    let existing = store
        .groups()
        .into_iter()
        .filter(|g| g.kind == GroupKind::Metadata)
        .min_by_key(|g| g.index);
    let group = match existing {
        Some(g) => g,
        None => store.allocate_group(GroupKind::Metadata)?,
    };
    let header = plan_with(
        group.index,
        group.capacity,
        *uuid::Uuid::new_v4().as_bytes(),
        data_checksum,
        version,
        features,
    )?;
    let mut meta = Meta {
        next_ino: ROOT_INO + 1,
        next_gen: 2,
        ..Default::default()
    };
    let mut root = Inode::new(ROOT_INO, 1, FileKind::Dir, 0o755, root_uid, root_gid);
    root.nlink = 2;
    root.parent = ROOT_INO;
    meta.inodes.insert(ROOT_INO, root);
    meta.dirs.insert(ROOT_INO, Default::default());
    let mut journal = Journal {
        header: header.clone(),
        meta_group: group.index,
        seq: 0,
        tail: 0,
        newest_slot: 1,
        ends_verified: false,
    };
    if header.metadata_tree() {
        MetaTree::write_fresh(Arc::clone(&store), &mut journal, &meta, &[], &[])?;
    } else {
        journal.checkpoint(store.as_ref(), &encode(&meta.image()?)?)?;
    }
    write_header(store.as_ref(), group.index, &journal.header)?;
    Ok(())
}

/// The slot holding the newest valid checkpoint, and that checkpoint
/// (`read` gives a slot's checkpoint with its sequence number, or None);
/// a slot that holds none is noted.
fn newest_checkpoint<T>(
    header: &super::layout::FsHeader,
    notes: &mut Vec<String>,
    read: impl Fn(super::layout::Region) -> FsResult<Option<(u64, T)>>,
) -> FsResult<(usize, T)> {
    let mut best: Option<(usize, u64, T)> = None;
    for (i, slot) in header.slots.iter().enumerate() {
        match read(*slot)? {
            Some((seq, cp)) => {
                if best.as_ref().is_none_or(|(_, b, _)| seq > *b) {
                    best = Some((i, seq, cp));
                }
            }
            None => notes.push(format!("checkpoint slot {i} holds no valid checkpoint")),
        }
    }
    best.map(|(i, _, cp)| (i, cp))
        .ok_or_else(|| FsError::Corrupt("no checkpoint slot passes its checksum".into()))
}

/// Read header, newest valid checkpoint and the journal after it, with
/// every inode in memory (fsck, upgrade).
pub fn load(store: &Arc<dyn BlockStore>) -> FsResult<Loaded> {
    load_with(store, None, &Silent)
}

/// [`load`], telling `progress` how far it got.
pub fn load_showing(store: &Arc<dyn BlockStore>, progress: &dyn Progress) -> FsResult<Loaded> {
    load_with(store, None, progress)
}

/// [`load`] for a mount: over a metadata tree, inodes are read from it
/// when used and at most `cache_bytes` of clean ones are kept.
pub fn load_for_mount(store: &Arc<dyn BlockStore>, cache_bytes: u64) -> FsResult<Loaded> {
    load_with(store, Some(cache_bytes), &Silent)
}

fn load_with(
    store: &Arc<dyn BlockStore>,
    cache_bytes: Option<u64>,
    progress: &dyn Progress,
) -> FsResult<Loaded> {
    let meta_group = metadata_group(store.as_ref())?;
    let (header, mut notes) = read_header(store.as_ref(), meta_group)?;
    if header.version < VERSION {
        notes.push(older_format_note(header.version));
    }
    let mut orphans = Vec::new();
    let (newest_slot, seq, mut meta, tree) = if header.metadata_tree() {
        let (slot, cp) = newest_checkpoint(&header, &mut notes, |slot| {
            Ok(read_tree_slot(store.as_ref(), &header.uuid, slot)?.map(|cp| (cp.seq, cp)))
        })?;
        let (tree, mut meta, facts) = MetaTree::open(
            Arc::clone(store),
            &header,
            meta_group,
            &cp,
            cache_bytes.is_none(),
            progress,
        )?;
        let tree = Arc::new(Mutex::new(tree));
        if let Some(budget) = cache_bytes {
            let source = TreeSource {
                tree: Arc::clone(&tree),
                store: Arc::clone(store),
            };
            // A quarter of the budget for unchanged inodes, a quarter for
            // unchanged checksum chunks, half for changes waiting for a
            // checkpoint (`held_limit`).
            let source: Arc<dyn MetaSource> = Arc::new(source);
            meta.lazy = Some(Lazy::new(Arc::clone(&source), budget / 4, facts.count));
            meta.csums = SharedCsums::partial(source, budget / 4);
            orphans = facts.orphans;
        }
        (slot, cp.seq, meta, Some(tree))
    } else {
        let (slot, cp) = newest_checkpoint(&header, &mut notes, |slot| {
            Ok(read_slot(store.as_ref(), &header.uuid, slot)?.map(|c| (c.seq, c)))
        })?;
        let image: MetaImage = decode(&cp.payload, "checkpoint")?;
        (slot, cp.seq, Meta::from_image(image), None)
    };
    let mut journal = Journal {
        header,
        meta_group,
        seq,
        tail: 0,
        newest_slot,
        ends_verified: false,
    };
    let replayed = replay(store.as_ref(), &mut journal, &mut meta, &mut |rec| {
        if let Some(t) = &tree {
            t.lock().note(rec);
        }
    })?;
    notes.extend(replayed.dropped.map(left_out_note));
    if !meta.inode(ROOT_INO)?.is_some_and(|r| r.is_dir()) {
        return Err(FsError::Corrupt("root directory missing".into()));
    }
    Ok(Loaded {
        meta,
        journal,
        tree,
        orphans,
        replayed: replayed.records,
        dropped_record: replayed.dropped,
        notes,
    })
}

/// Hand the memory a checkpoint let go of (the held inodes, the record,
/// the overlays: many small blocks freed by other threads than those that
/// took them) back to the host. Without this, glibc keeps it in each
/// thread's arena and the daemon's memory follows the number of changes
/// it has seen, not its cache (docs/design.md, "Memory").
fn give_back_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free memory back to the host; it
    // takes the allocator's own locks and touches nothing we hold.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// What one held change costs in memory, roughly: the inode, its copy in
/// the journal record and the record's bytes, the directory entry in the
/// overlay and the batch, and the keys noted for the checkpoint.
const HELD_CHANGE_BYTES: u64 = 1024;

/// Held inodes never force a checkpoint below this many (a tiny cache
/// must not checkpoint at every change).
const MIN_HELD: usize = 8192;

/// The held inodes past which a checkpoint is taken: half the metadata
/// cache's budget, at [`HELD_CHANGE_BYTES`] each.
fn held_limit(cache_bytes: u64) -> usize {
    usize::try_from(cache_bytes / 2 / HELD_CHANGE_BYTES)
        .unwrap_or(usize::MAX)
        .max(MIN_HELD)
}

/// The allocator implied by the Data groups and the extents of every
/// inode `meta` holds.
pub fn build_allocator(groups: &[GroupInfo], meta: &Meta) -> (Allocator, Vec<String>) {
    let mut alloc = data_groups(groups);
    let mut problems = Vec::new();
    mark_held(&mut alloc, meta, &mut problems);
    (alloc, problems)
}

/// An allocator over the Data groups, all free.
fn data_groups(groups: &[GroupInfo]) -> Allocator {
    let mut alloc = Allocator::default();
    for g in groups.iter().filter(|g| g.kind == GroupKind::Data) {
        alloc.add_group(*g);
    }
    alloc
}

fn mark_held(alloc: &mut Allocator, meta: &Meta, problems: &mut Vec<String>) {
    let mut inos: Vec<&u64> = meta.inodes.keys().collect();
    inos.sort();
    for ino in inos {
        for (off, ext) in meta.inodes[ino].extents.iter() {
            if let Err(e) = alloc.mark_used(ext) {
                problems.push(format!("inode {ino} offset {off}: {e}"));
            }
        }
    }
}

/// [`build_allocator`] for a mount: over a metadata tree, the extents of
/// the inodes it holds that have not changed since are marked too (read
/// from the tree, not kept).
fn mount_allocator(
    groups: &[GroupInfo],
    meta: &Meta,
    tree: Option<&Mutex<MetaTree>>,
    store: &dyn BlockStore,
) -> FsResult<(Allocator, Vec<String>)> {
    let (Some(tree), Some(_)) = (tree, &meta.lazy) else {
        return Ok(build_allocator(groups, meta));
    };
    let mut alloc = data_groups(groups);
    let mut problems = Vec::new();
    tree.lock().for_each_extent(store, &mut |ino, off, ext| {
        if meta.is_changed(ino) {
            return;
        }
        if let Err(e) = alloc.mark_used(ext) {
            problems.push(format!("inode {ino} offset {off}: {e}"));
        }
    })?;
    mark_held(&mut alloc, meta, &mut problems);
    Ok((alloc, problems))
}

impl Inner {
    #[cfg(test)]
    pub fn open(store: Arc<dyn BlockStore>, read_only: bool) -> FsResult<Arc<Inner>> {
        Inner::open_with(store, read_only, super::inode_cache::DEFAULT_CACHE_BYTES)
    }

    /// Open with at most `cache_bytes` of clean inodes kept in memory
    /// (over a metadata tree; an older layout holds every inode).
    pub fn open_with(
        store: Arc<dyn BlockStore>,
        read_only: bool,
        cache_bytes: u64,
    ) -> FsResult<Arc<Inner>> {
        let loaded = load_for_mount(&store, cache_bytes)?;
        if !read_only {
            FS_FEATURES
                .refuse_write(&loaded.journal.header.features)
                .map_err(FsError::Feature)?;
        }
        let (alloc, problems) = mount_allocator(
            &store.groups(),
            &loaded.meta,
            loaded.tree.as_deref(),
            store.as_ref(),
        )?;
        if !problems.is_empty() {
            return Err(FsError::Corrupt(format!(
                "extent map inconsistent (run fsck): {}",
                problems.join("; ")
            )));
        }
        if let Some(tree) = &loaded.tree {
            let tree = tree.lock();
            let root = tree.root();
            log::info!(
                "metadata tree: {} nodes, {} levels, {} free node blocks in the metadata groups",
                root.nodes,
                u32::from(root.level) + u32::from(root.nodes > 0),
                tree.free_node_blocks()
            );
        }
        if let Some(seq) = loaded.dropped_record {
            log::warn!("{}", left_out_note(seq));
        }
        let csum = loaded.journal.header.data_checksum;
        let version = loaded.journal.header.version;
        if version < VERSION {
            log::info!("{}", older_format_note(version));
        }
        let unwritten_extents = loaded.journal.header.unwritten_extents();
        let verified_commits = loaded.journal.header.verified_records() && csum.enabled();
        let judged_csums = loaded.meta.csums.share();
        let state = State {
            meta: loaded.meta,
            alloc,
            ..Default::default()
        };
        let room = loaded.tree.as_ref().map(|t| {
            let room = MetaRoom::new(metadata_group_blocks(store.as_ref()));
            t.lock().publish(&room);
            room
        });
        let orphans = loaded.orphans;
        let inner = Arc::new(Inner {
            store,
            state: RwLock::new(state),
            journal: Mutex::new(loaded.journal),
            room,
            tree: loaded.tree,
            held_limit: held_limit(cache_bytes),
            read_only: AtomicBool::new(read_only),
            csum,
            unwritten_extents,
            verified_commits,
            in_place_overwrites: AtomicBool::new(false),
            refused: Mutex::new(None),
            failed_commit: Mutex::new(None),
            discards: Discards::default(),
            file_locks: RangeLocks::default(),
            damaged: Default::default(),
            data_errors: DataErrorLog::default(),
            judged_csums,
        });
        if csum.enabled() {
            let judge: Weak<dyn crate::array::ContentJudge> = Arc::downgrade(&inner) as _;
            inner.store.set_content_judge(judge);
        }
        if !read_only {
            inner.free_orphans(orphans)?;
        }
        Ok(inner)
    }

    /// Data capacity of the store's groups not yet allocated (the free
    /// space beyond what the allocator holds).
    pub fn unallocated_bytes(&self) -> u64 {
        let (free_groups, group_capacity) = self.store.free_groups();
        free_groups.saturating_mul(group_capacity)
    }

    /// Bytes freed by changes not yet durable: free once the next commit
    /// lands (counted as free by statfs, and committed on demand by an
    /// allocation that would otherwise fail).
    pub fn pending_free_bytes(&self) -> u64 {
        let st = self.state.read();
        let batch: u64 = st.batch.freed.iter().map(|e| e.len).sum();
        let refused: u64 = self.refused.lock().iter().flatten().map(|e| e.len).sum();
        batch + refused + *self.discards.busy.lock()
    }

    /// Inodes left with no name (unlinked while open before a crash or
    /// unmount) are freed now: those held, and `candidates` (the tree's,
    /// judged again as replay may have changed them).
    fn free_orphans(&self, candidates: Vec<u64>) -> FsResult<()> {
        {
            let mut st = self.state.write();
            let mut orphans: Vec<u64> = st
                .meta
                .inodes
                .values()
                .filter(|i| i.nlink == 0)
                .map(|i| i.ino)
                .collect();
            for ino in candidates {
                if st.meta.inode(ino)?.is_some_and(|i| i.nlink == 0) {
                    orphans.push(ino);
                }
            }
            orphans.sort_unstable();
            orphans.dedup();
            for ino in orphans {
                st.free_inode(ino)?;
            }
        }
        self.commit(false).map(|_| ())
    }

    pub fn is_read_only(&self) -> bool {
        self.read_only.load(Ordering::Acquire)
    }

    /// An error once a commit has failed for good: what it carried never
    /// reached the store, so no later sync may report the filesystem's
    /// changes durable (a flush of the store would succeed and say so).
    pub fn check_commits(&self) -> FsResult<()> {
        match self.failed_commit.lock().as_ref() {
            None => Ok(()),
            Some(why) => Err(FsError::Store(StoreError::Io(format!(
                "a journal commit failed ({why}); changes since the last durable commit are not on the store"
            )))),
        }
    }

    /// Hold the whole file (truncate, fallocate, heal, scrub).
    pub fn file_lock(&self, ino: u64) -> RangeGuard<'_> {
        self.file_locks.lock_file(ino)
    }

    /// Hold the block-aligned byte range `[start, end)` of the file (a write).
    pub fn range_lock(&self, ino: u64, start: u64, end: u64) -> RangeGuard<'_> {
        self.file_locks.lock(ino, start, end)
    }

    /// Run a metadata change under the lock; it must check everything before
    /// changing anything, so an error leaves the state as it was.
    pub fn mutate<T>(&self, f: impl FnOnce(&mut State) -> FsResult<T>) -> FsResult<T> {
        self.mutate_with(false, f)
    }

    /// [`Inner::mutate`] for a change that frees metadata (unlink, rmdir,
    /// removexattr): it may use the node blocks kept for such changes, so
    /// a filesystem whose metadata is full can still be cleaned up.
    pub fn mutate_releasing<T>(&self, f: impl FnOnce(&mut State) -> FsResult<T>) -> FsResult<T> {
        self.mutate_with(true, f)
    }

    fn mutate_with<T>(
        &self,
        releasing: bool,
        f: impl FnOnce(&mut State) -> FsResult<T>,
    ) -> FsResult<T> {
        if self.is_read_only() {
            return Err(FsError::ReadOnly);
        }
        self.admit_metadata(releasing)?;
        let (res, big, held_full) = {
            let mut st = self.state.write();
            let res = f(&mut st);
            // A changed checksum chunk costs about a third of a changed inode.
            let held = st.meta.inodes.len() + st.meta.csums.held().0 / 3;
            let held_full = st.meta.lazy.is_some() && held > self.held_limit;
            (res, st.batch.size_hint() > BATCH_LIMIT, held_full)
        };
        if held_full {
            // The change itself is done; a checkpoint that fails keeps
            // what it carried for the next one (or marks the failure).
            if let Err(e) = self.commit(true) {
                log::warn!("checkpoint to bound the metadata held in memory: {e}");
            }
        } else if big {
            self.commit(false)?;
        }
        res
    }

    /// ENOSPC, before anything changes, when the next checkpoint might not
    /// find room for this change. A checkpoint first frees the nodes the
    /// durable tree no longer needs and settles what is pending, so only
    /// metadata that is really full refuses.
    fn admit_metadata(&self, releasing: bool) -> FsResult<()> {
        let Some(room) = &self.room else {
            return Ok(());
        };
        let pending = || self.state.read().batch.size_hint() as u64;
        let unallocated = || self.store.free_groups().0;
        if room.admits(pending(), unallocated, releasing) {
            return Ok(());
        }
        match self.commit(true) {
            Ok(_) | Err(FsError::NoSpace) => {}
            Err(e) => return Err(e),
        }
        if room.admits(pending(), unallocated, releasing) {
            Ok(())
        } else {
            log::warn!("metadata space is full: a change is refused with ENOSPC");
            Err(FsError::NoSpace)
        }
    }

    /// Whether data may take one of the groups kept back for metadata.
    pub fn metadata_spares_a_group(&self, st: &State) -> bool {
        match &self.room {
            Some(room) => {
                room.spares_a_group(st.batch.size_hint() as u64, self.store.free_groups().0)
            }
            None => true,
        }
    }

    /// Make every change so far durable. With `force_checkpoint` (unmount)
    /// the full image is written even when the log has room. Returns whether
    /// a record was written, which ends with a store flush: a caller that
    /// needs one can then skip its own.
    ///
    /// A checkpoint, and a record pointing at more than
    /// [`VERIFIED_COMMIT_MAX`] of new data (or any record of an older format),
    /// first flushes the data, then writes and flushes the record. A smaller
    /// record of a format-4 filesystem is written alongside its data and one
    /// flush makes both durable; replay checks its data if it is the last.
    pub fn commit(&self, force_checkpoint: bool) -> FsResult<bool> {
        self.commit_batch(force_checkpoint, false)
    }

    /// Before a write overwrites committed data in place: make sure the log
    /// does not end with a record replay would check, since that check
    /// would then fail and leave out a record whose fsync returned. Every
    /// later commit follows flushed data (`in_place_overwrites`), so one
    /// record after it is enough.
    pub fn before_overwrite_in_place(&self) -> FsResult<()> {
        if !self.verified_commits {
            return Ok(());
        }
        self.in_place_overwrites.store(true, Ordering::Release);
        if !self.journal.lock().ends_verified {
            return Ok(());
        }
        self.commit_batch(false, true).map(|_| ())
    }

    /// `commit`; with `even_empty` a record is written for an empty batch too.
    fn commit_batch(&self, force_checkpoint: bool, even_empty: bool) -> FsResult<bool> {
        let mut journal = self.journal.lock();
        let (payload, step, freed) = {
            let mut st = self.state.write();
            let refused = self.refused.lock().is_some();
            if st.batch.is_empty() && !force_checkpoint && !even_empty && !refused {
                return Ok(false);
            }
            let (rec, freed) = st.take_record()?;
            // Every record's keys go to the next checkpoint, whether the
            // record itself is written, refused or replaced by that
            // checkpoint.
            if let Some(tree) = &self.tree {
                let mut tree = tree.lock();
                tree.note(&rec);
                if let Some(room) = &self.room {
                    tree.publish(room);
                }
            }
            let new_blocks: usize = rec.csum_sets.iter().map(|(_, crcs)| crcs.len()).sum();
            let bytes = encode(&rec)?;
            if force_checkpoint || refused || !journal.fits(bytes.len()) {
                match &self.tree {
                    Some(tree) => {
                        // The changes since the last checkpoint go into
                        // the tree while the metadata cannot move; its
                        // nodes are written after the lock is let go.
                        let held = st.meta.held_summary();
                        let started = std::time::Instant::now();
                        if let Err(e) = tree.lock().apply(self.store.as_ref(), &st.meta) {
                            // The tree no longer follows the metadata in
                            // memory: nothing after this may be called durable.
                            return Err(self.commit_failed(e));
                        }
                        // The tree holds every change now: the changed
                        // inodes become clean copies, evictable.
                        st.meta.settle();
                        log::debug!(
                            "checkpoint: {held}; applied in {:.1} ms with the metadata locked; {} tree nodes cached",
                            started.elapsed().as_secs_f64() * 1e3,
                            tree.lock().cached_nodes()
                        );
                        (Vec::new(), CommitStep::Checkpoint, freed)
                    }
                    None => (encode(&st.meta.image()?)?, CommitStep::Checkpoint, freed),
                }
            } else if self.verified_commits && new_blocks as u64 * BLOCK_SIZE <= VERIFIED_COMMIT_MAX
            {
                (
                    bytes,
                    CommitStep::Record(DataOrder::VerifiedAtReplay),
                    freed,
                )
            } else {
                (bytes, CommitStep::Record(DataOrder::FlushedBefore), freed)
            }
        };
        let store = self.store.as_ref();
        let started = std::time::Instant::now();
        let flush_first = !matches!(step, CommitStep::Record(DataOrder::VerifiedAtReplay));
        let data_durable = if flush_first {
            store.flush().map_err(FsError::from)
        } else {
            Ok(())
        };
        let result = data_durable.and_then(|()| match step {
            CommitStep::Record(order) => journal.append(store, &payload, order),
            CommitStep::Checkpoint => match &self.tree {
                Some(tree) => {
                    let mut tree = tree.lock();
                    let done = tree.checkpoint(store, &mut journal);
                    if let Some(room) = &self.room {
                        tree.publish(room);
                    }
                    done
                }
                None => journal.checkpoint(store, &payload),
            },
        });
        match result {
            Ok(()) => {
                let earlier = self.refused.lock().take().unwrap_or_default();
                self.release_freed(freed.into_iter().chain(earlier).collect());
                if matches!(step, CommitStep::Checkpoint) && self.tree.is_some() {
                    log::debug!(
                        "checkpoint: data flushed and tree nodes written in {:.1} ms",
                        started.elapsed().as_secs_f64() * 1e3
                    );
                    give_back_freed_memory();
                }
                Ok(true)
            }
            Err(e) if retryable(&e) => {
                // The host refused, not the array, or the metadata tree
                // found no room (admission keeps that from happening, and
                // a deletion can make room): the changes stay in memory
                // and the next commit writes them in a checkpoint.
                log::warn!("journal commit refused, kept for the next commit: {e}");
                self.refused
                    .lock()
                    .get_or_insert_with(Vec::new)
                    .extend(freed);
                Err(e)
            }
            Err(e) => Err(self.commit_failed(e)),
        }
    }

    /// A commit failed for good: the in-memory state is now ahead of what
    /// can be made durable, so further changes are refused rather than
    /// diverge.
    fn commit_failed(&self, e: FsError) -> FsError {
        log::error!("journal commit failed, filesystem is now read-only: {e}");
        self.failed_commit
            .lock()
            .get_or_insert_with(|| e.to_string());
        self.read_only.store(true, Ordering::Release);
        e
    }

    /// Extents whose freeing is now durable become allocatable; they are
    /// remembered for [`Inner::discard_freed`], which gives the whole
    /// stripes around them back to the host later, off the path of the
    /// fsync or write that committed.
    fn release_freed(&self, freed: Vec<Extent>) {
        if freed.is_empty() {
            return;
        }
        {
            let mut st = self.state.write();
            freed.iter().for_each(|&ext| st.alloc.free(ext));
        }
        self.discards.candidates.lock().extend(freed);
    }

    /// Give the whole stripes of free space around the extents freed since
    /// the last call back to the store's host (a sparse image shrinks when
    /// files are deleted). Runs on the commit thread, and at `raidfs sync`
    /// and unmount. A stripe reallocated meanwhile is simply not taken. The
    /// stripes being discarded are out of the allocator meanwhile, so
    /// nothing is written there before the discard; an allocation that
    /// finds no room waits for them ([`Inner::wait_discards`]). A discard
    /// the store cannot do costs only host space, so its error is logged,
    /// never returned.
    pub fn discard_freed(&self) {
        let _one_at_a_time = self.discards.running.lock();
        let candidates = std::mem::take(&mut *self.discards.candidates.lock());
        if candidates.is_empty() || self.is_read_only() {
            return;
        }
        let holes: Vec<Extent> = {
            let mut st = self.state.write();
            let holes: Vec<Extent> = candidates
                .iter()
                .flat_map(|&ext| st.alloc.take_discardable(ext))
                .collect();
            *self.discards.busy.lock() += holes.iter().map(|h| h.len).sum::<u64>();
            holes
        };
        for hole in &holes {
            if let Err(e) = self.store.discard(hole.addr, hole.len) {
                log::warn!(
                    "freed space at {:#x} (+{}) stays allocated on the host: {e}",
                    hole.addr,
                    hole.len
                );
            }
        }
        {
            let mut st = self.state.write();
            holes.iter().for_each(|&hole| st.alloc.free(hole));
        }
        *self.discards.busy.lock() = 0;
        self.discards.done.notify_all();
    }

    /// Wait until no free space is out of the allocator for a discard.
    pub fn wait_discards(&self) {
        let mut busy = self.discards.busy.lock();
        while *busy > 0 {
            self.discards.done.wait(&mut busy);
        }
    }

    /// Data groups the store now holds more of than the allocator knows
    /// (a reshape moved them to a wider geometry).
    fn grown_groups(&self, st: &State) -> Vec<GroupInfo> {
        self.store
            .groups()
            .into_iter()
            .filter(|g| g.kind == GroupKind::Data)
            .filter(|g| {
                st.alloc
                    .usable(g.index)
                    .is_some_and(|u| u < g.capacity / BLOCK_SIZE * BLOCK_SIZE)
            })
            .collect()
    }

    /// Take the space that reshaped groups gained into the allocator.
    pub fn absorb_grown_groups(&self) {
        if self.grown_groups(&self.state.read()).is_empty() {
            return;
        }
        let mut st = self.state.write();
        for info in self.grown_groups(&st) {
            st.alloc.widen(info);
        }
    }

    /// Allocate a fresh Data group into the allocator; false when none is
    /// left. Space that reshaped groups gained counts first.
    pub fn grow(&self, st: &mut State) -> bool {
        let grown = self.grown_groups(st);
        if !grown.is_empty() {
            for info in grown {
                st.alloc.widen(info);
            }
            return true;
        }
        match self.store.allocate_group(GroupKind::Data) {
            Ok(info) => {
                st.alloc.add_group(info);
                true
            }
            Err(e) => {
                log::debug!("no further data group: {e}");
                false
            }
        }
    }
}

/// A commit error after which the changes can be kept and written later:
/// the host's refusal, or no room for the metadata tree's nodes.
fn retryable(e: &FsError) -> bool {
    match e {
        FsError::Store(s) => s.is_retryable(),
        FsError::NoSpace => true,
        _ => false,
    }
}

/// Freed extents waiting to be discarded, and the bytes out of the
/// allocator while a discard runs.
#[derive(Default)]
struct Discards {
    candidates: Mutex<Vec<Extent>>,
    busy: Mutex<u64>,
    done: Condvar,
    running: Mutex<()>,
}

/// Commits every `interval` until the filesystem is dropped or unmounted.
pub fn spawn_committer(
    inner: Weak<Inner>,
    interval: Duration,
    stop: crossbeam_channel::Receiver<()>,
) {
    let spawned = std::thread::Builder::new()
        .name("raidfs-commit".into())
        .spawn(move || loop {
            match stop.recv_timeout(interval) {
                Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
                    let Some(inner) = inner.upgrade() else { return };
                    if inner.is_read_only() {
                        continue;
                    }
                    if let Err(e) = inner.commit(false) {
                        log::error!("periodic commit failed: {e}");
                    }
                    inner.discard_freed();
                }
                _ => return,
            }
        });
    if let Err(e) = spawned {
        log::error!(
            "cannot start the commit thread ({e}); commits happen only on fsync and unmount"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::super::layout::{
        implied_features, read_header, write_header, FsHeader, OLDEST_VERSION, VERSION,
    };
    use super::super::teststore::MemStore;
    use super::*;

    fn with_version(store: &MemStore, header: &FsHeader, version: u32) {
        let group = metadata_group(store).unwrap();
        let header = FsHeader {
            version,
            features: implied_features(version),
            ..header.clone()
        };
        write_header(store, group, &header).unwrap();
    }

    #[test]
    fn version_2_opens_without_unwritten_extents_and_others_are_refused() {
        let store = Arc::new(MemStore::new(4, 8 << 20, 64 << 10));
        format_images(&store, ChecksumKind::Crc32c).unwrap();
        assert!(Inner::open(store.clone(), true).unwrap().unwritten_extents);
        let (header, _) =
            read_header(store.as_ref(), metadata_group(store.as_ref()).unwrap()).unwrap();
        with_version(&store, &header, OLDEST_VERSION);
        let inner = Inner::open(store.clone(), true).unwrap();
        assert!(
            !inner.unwritten_extents,
            "version 2 has no unwritten extents"
        );
        for unknown in [OLDEST_VERSION - 1, VERSION + 1] {
            with_version(&store, &header, unknown);
            assert!(
                matches!(Inner::open(store.clone(), true), Err(FsError::Corrupt(m)) if m.contains("version")),
                "version {unknown}"
            );
        }
    }

    #[test]
    fn the_root_directory_belongs_to_the_owner_given_at_format() {
        for owner in [(0, 0), (1000, 1001)] {
            let store = Arc::new(MemStore::new(4, 8 << 20, 64 << 10));
            let opts = crate::fs::FormatOptions {
                root_owner: owner,
                ..Default::default()
            };
            crate::fs::FileSystem::format_with(store.clone(), &opts).unwrap();
            let fs = crate::fs::FileSystem::open(store, crate::fs::FsOptions::default()).unwrap();
            let root = fs.getattr(ROOT_INO).unwrap();
            assert_eq!((root.uid, root.gid), owner);
            assert_eq!(root.perm, 0o755);
            fs.unmount().unwrap();
        }
    }
}
