//! The array engine: assembles members, maps the logical space through
//! allocation groups and their geometry, and performs reads and writes with
//! redundancy, degraded operation and member failure handling.
//!
//! Logical addresses are `(group << GROUP_SHIFT) | offset`. Group `g` occupies
//! `[data_offset + g * group_size, +group_size)` on every member; its profile
//! (recorded in every superblock) picks the geometry: metadata groups are
//! mirrored on up to three members, data groups use the array's level.
//!
//! What differs by level lives in `personality` (RAID0, mirror, parity),
//! chosen once per geometry and carried in every [`Region`]; the rest of the
//! engine is level-blind. Slot state and its transitions are owned by
//! `slot`; `state` writes the superblocks and reports the array.

mod assemble;
mod background;
pub mod balance;
pub mod bitmap;
mod cleaner;
mod create;
mod discard;
pub mod host;
mod host_space;
mod io;
mod iostat;
pub mod judge;
mod members;
mod pace;
mod personality;
mod rebuild;
mod rejoin;
mod reshape;
mod resize;
mod scrub;
mod shape;
mod slot;
mod state;
mod stripe_lock;
mod verify;
mod worker;
mod write_back;
mod write_buffer;

/// The partial parity log, part of the parity personality.
pub use personality::parity::ppl;
use personality::parity::stripe_cache;
use personality::Personality;
pub(crate) use slot::{Slot, SlotDev};

pub use assemble::{
    assemble, assemble_paths, open_member, open_members, AssembleOptions, Assembly, LeftOut,
    OpenPolicy,
};
pub use background::{percent, SyncAction, SyncProgress, SyncResult};
pub use balance::{MemberStats, ReadPolicy};
pub use create::{create, create_paths, CreateSpec, Created, PathOptions};
pub use host::{OnHostError, Suspension};
pub use iostat::MemberIo;
pub use judge::ContentJudge;
pub use members::AddOutcome;
pub use reshape::ReshapeStatus;
pub use resize::{Resized, SizeTarget};
pub use scrub::{PausedScrub, ScrubStarted};
pub use slot::MemberState;
pub use state::{ArrayStatus, MemberStatus};
pub use verify::{BadCopy, MAX_CORRECTED_ERRORS};

use crate::geometry::{Geometry, GeometryError, Level};
use crate::member::Member;
use crate::parity::Parity;
use crate::superblock::{GroupProfile, Superblock, SuperblockError};
use parking_lot::{Mutex, RwLock};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use uuid::Uuid;

/// The partial-parity log's feature bit; the superblock owns the feature
/// bits and the mask of known ones.
pub use crate::superblock::FEATURE_PPL;

/// Stripe-lock table size. A rebuild holds a few steps' worth of stripes
/// (hundreds of slots) while foreground writes hash into the same table, so
/// it is kept large enough that they rarely collide.
const STRIPE_LOCK_SLOTS: usize = 4096;

/// Bits of a logical address that hold the offset within a group.
pub const GROUP_SHIFT: u32 = 40;

#[derive(Debug, thiserror::Error)]
pub enum ArrayError {
    #[error("{0}")]
    Superblock(#[from] SuperblockError),
    #[error("invalid geometry: {0}")]
    Geometry(#[from] GeometryError),
    #[error("{path}: {source}")]
    MemberIo {
        path: String,
        source: std::io::Error,
    },
    #[error("members belong to different arrays: {0}")]
    MixedArrays(String),
    #[error("{0}")]
    Refused(String),
    #[error("too few working members: {have} of {total} present, {level} needs at least {need}")]
    TooFewMembers {
        have: usize,
        total: usize,
        need: usize,
        level: String,
    },
    #[error("array is dirty and degraded: parity may be inconsistent; assemble with --force to start it anyway")]
    DirtyDegraded,
    #[error("address {0:#x} is outside any allocated group")]
    OutOfRange(u64),
    #[error(
        "array has lost too many members ({0}); writes are refused to protect what is on disk"
    )]
    Failed(String),
    #[error("no unallocated group left")]
    NoSpace,
    #[error("no copy or reconstruction of {0:#x} passes verification")]
    Unrecoverable(u64),
    #[error("the host has no space left for a member: {0}")]
    HostNoSpace(String),
    #[error("the array is suspended: {why}")]
    HostFault { read_only: bool, why: String },
}

pub type ArrayResult<T> = Result<T, ArrayError>;

/// An assembled, running array.
pub struct Array {
    pub(crate) slots: slot::SlotTable,
    /// Hot spares waiting for a slot.
    pub(crate) spares: slot::Spares,
    /// The array-wide superblock fields (events, slot states, groups, state).
    /// Per-member fields (member uuid, slot) are filled in when written.
    pub(crate) sb: Mutex<Superblock>,
    /// Serialises superblock writes so an older state never lands after a newer one.
    pub(crate) sb_write: Mutex<()>,
    /// The geometries in force (two during a reshape), with their
    /// personalities; changed only with the superblock's record of them.
    pub(crate) shapes: RwLock<shape::Shapes>,
    /// Holds writes away from the group a reshape is moving.
    pub(crate) reshape_gate: reshape::Gate,
    pub(crate) pool: worker::WorkerPool,
    pub(crate) locks: stripe_lock::StripeLocks,
    pub(crate) parity: &'static Parity,
    /// Set when more members failed than some group's geometry tolerates.
    pub(crate) broken: AtomicBool,
    pub(crate) sync: background::SyncState,
    /// The bitmap thread (which also probes a suspended host).
    pub(crate) cleaner: cleaner::Cleaner,
    /// The thread that adds back NBD members whose server returns.
    pub(crate) rejoin: rejoin::Rejoin,
    pub(crate) bitmap: bitmap::Bitmap,
    /// The array was dirty when assembled: resync the regions the bitmap names.
    pub(crate) needs_resync: AtomicBool,
    /// Which mirror copy each read goes to, and per-member read counters.
    pub(crate) balance: balance::Balancer,
    /// The partial parity log, when the array was created with it (RAID5).
    pub(crate) ppl: Option<ppl::Ppl>,
    /// Full-stripe writes whose member writes are still under way.
    pub(crate) write_back: write_back::WriteBack,
    pub(crate) stripe_cache: stripe_cache::StripeCache,
    /// Assembled read-only (fsck without --repair, `examine`): a bad copy a
    /// checked read finds is reported, never rewritten, since a write to a
    /// member opened read-only would fail the member.
    pub(crate) read_only: bool,
    /// The filesystem's view of which version of a block is right.
    pub(crate) judge: RwLock<Option<std::sync::Weak<dyn judge::ContentJudge>>>,
    /// Out-of-space answers and suspension (faults that are the host's).
    pub(crate) host: host::HostState,
}

/// The data geometry a superblock describes.
pub fn data_geometry(sb: &Superblock) -> Result<Geometry, GeometryError> {
    Geometry::new(
        sb.level,
        sb.members as usize,
        sb.chunk,
        sb.copies as usize,
        sb.layout,
    )
}

/// Where a logical address lands.
#[derive(Clone, Copy)]
pub(crate) struct Region {
    pub group: u32,
    pub geometry: Geometry,
    /// How the group's level reads, writes and recovers.
    pub personality: Personality,
    /// Member offset of the group's region.
    pub base: u64,
}

impl Array {
    pub(crate) fn from_parts(
        slots: Vec<Slot>,
        sb: Superblock,
        parity: &'static Parity,
    ) -> ArrayResult<Array> {
        let shapes = shape::Shapes::of(&sb)?;
        let (sb_data_offset, sb_data_size) = (sb.data_offset, sb.data_size);
        let ppl = (sb.has_ppl() && shapes.current.data_personality.keeps_partial_parity_log())
            .then(|| ppl::Ppl::new(sb.members as usize, sb.data_offset));
        let members: Vec<Option<Arc<dyn Member>>> = slots
            .iter()
            .map(|s| if s.is_failed() { None } else { s.member() })
            .collect();
        let pool = worker::WorkerPool::new(&members, 2)
            .map_err(|e| ArrayError::Refused(format!("cannot start member workers: {e}")))?;
        let array = Array {
            slots: slot::SlotTable::new(slots),
            spares: slot::Spares::default(),
            sb: Mutex::new(sb),
            sb_write: Mutex::new(()),
            shapes: RwLock::new(shapes),
            reshape_gate: reshape::Gate::default(),
            pool,
            locks: stripe_lock::StripeLocks::new(STRIPE_LOCK_SLOTS),
            parity,
            broken: AtomicBool::new(false),
            sync: background::SyncState::default(),
            cleaner: cleaner::Cleaner::default(),
            rejoin: rejoin::Rejoin::default(),
            bitmap: bitmap::Bitmap::new(sb_data_offset, sb_data_size),
            needs_resync: AtomicBool::new(false),
            balance: balance::Balancer::new(crate::superblock::MAX_MEMBERS),
            ppl,
            write_back: write_back::WriteBack::default(),
            stripe_cache: stripe_cache::StripeCache::default(),
            read_only: false,
            judge: RwLock::new(None),
            host: host::HostState::default(),
        };
        (0..array.slots.len()).for_each(|slot| array.detect_rotational(slot));
        array.check_tolerance();
        Ok(array)
    }

    /// Why the array is suspended (the host failed every member), if it is.
    pub fn suspension(&self) -> Option<Suspension> {
        self.host.suspension()
    }

    /// Member writes the host refused for lack of space, so far.
    pub fn host_no_space_errors(&self) -> u64 {
        self.host.no_space_errors()
    }

    pub fn uuid(&self) -> Uuid {
        self.sb.lock().array_uuid
    }

    /// The array's level (the target level during a reshape).
    pub fn level(&self) -> Level {
        self.shapes.read().current.data.level
    }

    /// The geometry of new data groups (the target during a reshape).
    pub fn data_geometry(&self) -> Geometry {
        self.shapes.read().current.data
    }

    /// The geometry of new metadata groups.
    pub fn metadata_geometry(&self) -> Geometry {
        self.shapes.read().current.meta
    }

    /// The geometry group `group` has now (None when unallocated).
    pub fn group_geometry(&self, group: u32) -> Option<Geometry> {
        let sb = self.sb.lock();
        self.shapes.read().place(&sb, group).map(|(_, g, _)| g)
    }

    /// Whether new groups and old ones may have different geometries
    /// (a reshape is under way).
    pub fn is_reshaping(&self) -> bool {
        self.shapes.read().from.is_some()
    }

    pub fn member_count(&self) -> usize {
        self.slots.len()
    }

    /// Slots that are not serving I/O (failed or missing).
    pub fn failed_slots(&self) -> Vec<usize> {
        (0..self.slots.len())
            .filter(|&i| self.is_failed(i))
            .collect()
    }

    /// Whether some slot cannot serve reads everywhere (failed, missing or
    /// still being rebuilt).
    pub fn is_degraded(&self) -> bool {
        !self.unreadable_slots().is_empty()
    }

    pub(crate) fn is_failed(&self, slot: usize) -> bool {
        self.slots[slot].is_failed()
    }

    /// Whether `slot` can serve a read at region-relative `offset` of `region`.
    pub(crate) fn readable(&self, slot: usize, region: &Region, offset: u64) -> bool {
        let s = &self.slots[slot];
        !s.is_failed() && region.base + offset < s.valid_below()
    }

    /// Slots that cannot serve reads everywhere (failed, missing or rebuilding).
    pub(crate) fn unreadable_slots(&self) -> Vec<usize> {
        (0..self.slots.len())
            .filter(|&i| !self.slots[i].is_whole())
            .collect()
    }

    /// Capacity in logical bytes of a new group with `profile`.
    pub fn group_capacity(&self, profile: GroupProfile) -> u64 {
        let group_size = self.sb.lock().group_size;
        self.shapes
            .read()
            .current
            .of(profile)
            .map_or(0, |(g, _)| g.capacity(group_size))
    }

    /// Capacity in logical bytes of allocated group `group` as it is now
    /// (0 when unallocated).
    pub fn allocated_group_capacity(&self, group: u32) -> u64 {
        let sb = self.sb.lock();
        self.shapes
            .read()
            .place(&sb, group)
            .map_or(0, |(_, g, _)| g.capacity(sb.group_size))
    }

    /// Resolve a logical address (and the length that follows it) to its group.
    pub(crate) fn region(&self, addr: u64, len: usize) -> ArrayResult<(Region, u64)> {
        let group = (addr >> GROUP_SHIFT) as u32;
        let offset = addr & ((1u64 << GROUP_SHIFT) - 1);
        let (slice, geometry, personality, group_size, data_offset) = {
            let sb = self.sb.lock();
            let (slice, geometry, personality) = self
                .shapes
                .read()
                .place(&sb, group)
                .ok_or(ArrayError::OutOfRange(addr))?;
            (slice, geometry, personality, sb.group_size, sb.data_offset)
        };
        let capacity = geometry.capacity(group_size);
        if offset
            .checked_add(len as u64)
            .is_none_or(|end| end > capacity)
        {
            return Err(ArrayError::OutOfRange(addr));
        }
        let base = data_offset + slice as u64 * group_size;
        Ok((
            Region {
                group,
                geometry,
                personality,
                base,
            },
            offset,
        ))
    }

    /// The regions of every allocated group as they are in force now, in
    /// member-offset order (background work walks them so; during a reshape
    /// a staged group lies in its staging slice, out of group order).
    pub(crate) fn regions_by_offset(&self) -> Vec<Region> {
        let mut regions: Vec<Region> = self
            .groups()
            .into_iter()
            .filter_map(|(group, _)| self.group_region(group))
            .collect();
        regions.sort_by_key(|r| r.base);
        regions
    }

    /// The region of allocated group `group`.
    pub(crate) fn group_region(&self, group: u32) -> Option<Region> {
        self.region((group as u64) << GROUP_SHIFT, 0)
            .ok()
            .map(|(r, _)| r)
    }

    /// Re-evaluate whether every allocated group can still be served.
    pub(crate) fn check_tolerance(&self) {
        let failed = self.unreadable_slots();
        if !self.survives_without(&failed) {
            self.broken.store(true, Ordering::Release);
        }
    }

    /// Whether every allocated group's geometry (data and metadata) still
    /// has all its data with `failed` slots gone.
    pub(crate) fn survives_without(&self, failed: &[usize]) -> bool {
        self.shapes.read().survive(failed)
    }

    pub(crate) fn ensure_writable(&self) -> ArrayResult<()> {
        if let Some(e) = self.host.suspended_error() {
            return Err(e);
        }
        if self.broken.load(Ordering::Acquire) {
            let names: Vec<String> = self
                .failed_slots()
                .iter()
                .map(|&i| self.slots[i].name())
                .collect();
            return Err(ArrayError::Failed(names.join(", ")));
        }
        Ok(())
    }

    /// Whether the array may change its geometry or size (`what`, for the
    /// refusal): writable, not assembled read-only, every member in sync.
    pub(crate) fn ready_for_change(&self, what: &str) -> ArrayResult<()> {
        self.ensure_writable()?;
        if self.read_only {
            return Err(ArrayError::Refused("the array is read-only".into()));
        }
        if self.is_degraded() {
            let missing: Vec<String> = self
                .unreadable_slots()
                .iter()
                .map(|&s| self.slots[s].name())
                .collect();
            return Err(ArrayError::Refused(format!(
                "the array is degraded ({} not in sync): {what} needs every member; rebuild first",
                missing.join(", ")
            )));
        }
        Ok(())
    }

    /// Working members with their slots.
    pub(crate) fn present_members(&self) -> Vec<(usize, Arc<dyn Member>)> {
        (0..self.slots.len())
            .filter(|&i| !self.is_failed(i))
            .filter_map(|i| self.slots[i].member().map(|m| (i, m)))
            .collect()
    }

    /// Write the whole write-intent bitmap to every working member.
    pub(crate) fn write_bitmap(&self) {
        let present = self.present_members();
        let members: Vec<Arc<dyn Member>> = present.iter().map(|(_, m)| Arc::clone(m)).collect();
        for (i, e) in self.bitmap.write_all(&members) {
            self.member_error(present[i].0, &e, "bitmap write", None);
        }
    }

    /// The read balancing policy in use.
    pub fn read_policy(&self) -> ReadPolicy {
        self.balance.policy()
    }

    /// Change the read balancing policy; takes effect from the next read.
    pub fn set_read_policy(&self, policy: ReadPolicy) {
        self.balance.set_policy(policy);
    }

    /// Mark a member write-mostly: read from it only when no other copy is
    /// available (md's `--write-mostly`; not recorded in the superblock).
    pub fn set_write_mostly(&self, slot: usize, write_mostly: bool) {
        self.balance.set_write_mostly(slot, write_mostly);
    }

    /// Override whether a member is treated as rotational (image files on
    /// devices the kernel does not describe, or a wrong guess).
    pub fn set_rotational(&self, slot: usize, rotational: bool) {
        self.balance.set_rotational(slot, rotational);
    }

    /// Decide whether `slot`'s member is rotational: as the member says, else
    /// from its path's sysfs queue, else assume a head (as md does without
    /// QUEUE_FLAG_NONROT). Call again when a slot gets a new device.
    pub(crate) fn detect_rotational(&self, slot: usize) {
        let (member, name) = (self.slots[slot].member(), self.slots[slot].name());
        let rotational = member.and_then(|m| m.rotational());
        let rotational =
            rotational.or_else(|| balance::detect_rotational(std::path::Path::new(&name)));
        self.balance
            .set_rotational(slot, rotational.unwrap_or(true));
    }

    /// Per-member read counters and balancing state.
    pub fn member_stats(&self) -> Vec<MemberStats> {
        let names: Vec<String> = self.slots.iter().map(|s| s.name()).collect();
        self.balance.stats(&names)
    }

    /// Per-slot data operations, bytes and time since assembly, both
    /// directions (see [`MemberIo`]).
    pub fn member_io(&self) -> Vec<MemberIo> {
        let mut io = self.pool.io_stats();
        io.truncate(self.slots.len());
        io
    }

    /// How long [`Array::member_io`]'s counters have been counting.
    pub fn io_elapsed(&self) -> std::time::Duration {
        self.pool.io_elapsed()
    }

    /// Every read sent to each slot's member since assembly, and its bytes,
    /// by slot: what `detail` counts as a member's reads (the balancer's
    /// [`Array::member_stats`] count only the mirror reads it placed).
    pub fn member_reads(&self) -> Vec<(u64, u64)> {
        let mut reads = vec![(0, 0); self.slots.len()];
        for io in self.member_io() {
            if let Some(r) = reads.get_mut(io.slot) {
                *r = (io.read_ops, io.read_bytes);
            }
        }
        reads
    }

    /// Zero the read counters and forget heads and streams (benchmarks).
    pub fn reset_member_stats(&self) {
        self.balance.reset();
    }

    /// Parity kernels in use.
    pub fn parity(&self) -> &'static Parity {
        self.parity
    }
}

impl Drop for Array {
    fn drop(&mut self) {
        log::debug!("array {} released", self.sb.get_mut().array_uuid);
    }
}
