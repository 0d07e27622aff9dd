//! Reshape: changing a running array's geometry group by group, without a
//! backup file and without a critical section (md's `--grow`).
//!
//! md reshapes a whole array in place, stripe by stripe, and needs a backup
//! of the stripes it overwrites. raidfs moves one allocation group at a
//! time through a free slice instead: the group's data is copied, in its old
//! geometry, to the staging slice and checked; one superblock commit makes
//! that copy the one in force; then the group's own slice is rewritten in
//! the new geometry from it and checked, and a second commit switches the
//! group home and to the new geometry. A crash at any point leaves one
//! complete copy in force (the superblock says which), so the next start
//! redoes at most the copy that was under way. Redundancy never drops: each
//! copy is written with the redundancy of its geometry before it counts.
//!
//! While a group moves, writes to it wait (reads go on from the copy in
//! force); writes to every other group go on, and new groups get the new
//! geometry at once. A slice a commit takes out of force is overwritten
//! only once the reads that may have resolved it before have ended. The
//! data is read through the checked read path, so a block whose checksum
//! the filesystem knows is copied only once it passes, and every copy is
//! read back and compared before it is switched in.

use super::io::{Caching, Choice};
use super::pace::Pacer;
use super::personality::Personality;
use super::shape::{Shape, Shapes};
use super::{Array, ArrayError, ArrayResult, Region, GROUP_SHIFT};
use crate::geometry::{Geometry, Level};
use crate::superblock::{
    GeometrySpec, GroupProfile, Reshape, FEATURE_RESHAPE, FEATURE_WORDS_VERSION,
};
use parking_lot::{Condvar, Mutex, RwLock, RwLockReadGuard};
use std::sync::atomic::{AtomicU64, Ordering};

/// Logical bytes copied per step.
const STEP_BYTES: u64 = 4 << 20;
/// No group is frozen.
const NONE: u64 = u64::MAX;
/// Every group is frozen (the array's size is changing).
const ALL: u64 = u64::MAX - 1;

/// A reshape under way, as `raidfs detail` shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ReshapeStatus {
    pub from: Level,
    pub to: Level,
    /// Allocated groups still in the old geometry, and all allocated groups.
    pub pending: usize,
    pub groups: usize,
}

/// Holds writes away from the group a reshape is moving, and lets it wait
/// for the reads under way. A write costs a shared lock and an atomic load;
/// only writes to the frozen group wait. A read costs a shared lock.
pub(crate) struct Gate {
    /// Writers hold it shared for the length of their write, so a freeze
    /// can wait for the writes already under way.
    passage: RwLock<()>,
    /// Readers hold it shared from resolving their range's place until
    /// their last member access (a verified read's repairs included), so a
    /// reshape can wait for those that may still use a place it is about
    /// to overwrite ([`Gate::drain_reads`]).
    reading: RwLock<()>,
    /// The frozen group, or [`NONE`].
    frozen: AtomicU64,
    /// Waiters for the thaw sleep on `thawed` under this lock, which the
    /// thaw also takes, so none misses it.
    sleepers: Mutex<()>,
    thawed: Condvar,
}

impl Default for Gate {
    fn default() -> Gate {
        Gate {
            passage: RwLock::new(()),
            reading: RwLock::new(()),
            frozen: AtomicU64::new(NONE),
            sleepers: Mutex::new(()),
            thawed: Condvar::new(),
        }
    }
}

impl Gate {
    /// Let a write to `group` through, waiting while that group is frozen.
    pub(crate) fn enter(&self, group: u32) -> RwLockReadGuard<'_, ()> {
        let group = u64::from(group);
        let holds = |frozen: u64| frozen == group || frozen == ALL;
        loop {
            let pass = self.passage.read();
            if !holds(self.frozen.load(Ordering::Acquire)) {
                return pass;
            }
            drop(pass);
            let mut sleeping = self.sleepers.lock();
            while holds(self.frozen.load(Ordering::Acquire)) {
                self.thawed.wait(&mut sleeping);
            }
        }
    }

    /// Let a read resolve where its range lies and read it there: the
    /// place it resolves is not overwritten until the guard is dropped.
    pub(crate) fn read(&self) -> RwLockReadGuard<'_, ()> {
        self.reading.read()
    }

    /// Wait for every read under way. Those that started before a commit
    /// moved a group may have resolved its old place and still be reading
    /// it; those that start after resolve the new one. (New reads wait
    /// meanwhile: the lock is fair, so a stream of reads cannot starve it.)
    fn drain_reads(&self) {
        drop(self.reading.write());
    }

    /// Stop new writes to every group and wait for those under way; they
    /// go on when the returned guard is dropped.
    pub(crate) fn freeze_all(&self) -> Frozen<'_> {
        self.frozen.store(ALL, Ordering::Release);
        drop(self.passage.write());
        Frozen(self)
    }

    /// Stop new writes to `group` and wait for those under way anywhere.
    fn freeze(&self, group: u32) {
        self.frozen.store(u64::from(group), Ordering::Release);
        drop(self.passage.write());
    }

    fn thaw(&self) {
        let _sleepers = self.sleepers.lock();
        self.frozen.store(NONE, Ordering::Release);
        self.thawed.notify_all();
    }
}

/// Thaws the gate however a group's move ends.
pub(crate) struct Frozen<'a>(&'a Gate);

impl Drop for Frozen<'_> {
    fn drop(&mut self) {
        self.0.thaw();
    }
}

impl Array {
    /// Begin changing the array's geometry to `to`, with `added` members in
    /// new slots after the present ones: one superblock commit records the
    /// new slots, the target and, for every allocated group whose geometry
    /// changes, that it still has the old one. Background work then moves
    /// the groups ([`Array::start_reshape`] starts it). The new members hold
    /// nothing of the groups in the old geometry, which never reach them.
    pub(crate) fn begin_reshape(
        &self,
        to: Geometry,
        added: Vec<(std::sync::Arc<dyn crate::member::Member>, String)>,
    ) -> ArrayResult<Begun> {
        self.ready_for_change("a reshape")?;
        let present = self.slots.len();
        if to.members != present + added.len() {
            return Err(ArrayError::Refused(format!(
                "the target geometry has {} members, the array {present} and {} added",
                to.members,
                added.len()
            )));
        }
        if !added.is_empty() && self.ppl.is_some() {
            return Err(ArrayError::Refused(
                "an array with a partial parity log cannot take members yet (its log is laid out for its members); recreate without --consistency-policy ppl".into(),
            ));
        }
        let need = self.sb.lock().min_member_len();
        for (m, name) in &added {
            if m.len() < need {
                return Err(ArrayError::Refused(format!(
                    "{name} holds {} bytes; a member of this array needs {need}",
                    m.len()
                )));
            }
        }
        let target = Shape::new(to)?;
        let mut sb = self.sb.lock();
        let mut shapes = self.shapes.write();
        if sb.reshape.is_some() {
            return Err(ArrayError::Refused("a reshape is already under way".into()));
        }
        if sb.version < FEATURE_WORDS_VERSION {
            return Err(ArrayError::Refused(format!(
                "the members carry superblock version {}; run `raidfs upgrade` first",
                sb.version
            )));
        }
        let from = shapes.current;
        if from.data == target.data {
            return Err(ArrayError::Refused(format!(
                "the array already is {}",
                describe(&from.data)
            )));
        }
        let old_cap = from.data.capacity(sb.group_size);
        let new_cap = target.data.capacity(sb.group_size);
        if new_cap < old_cap {
            return Err(ArrayError::Refused(format!(
                "{} holds {} MiB per group, less than the {} MiB of {}: add a member first",
                describe(&target.data),
                new_cap >> 20,
                old_cap >> 20,
                describe(&from.data)
            )));
        }
        if mirrors_only_gain_copies(&from, &target) {
            return self.begin_mirror_growth(sb, shapes, target, added);
        }
        let pending: Vec<bool> = sb
            .groups
            .iter()
            .map(|&p| match (from.of(p), target.of(p)) {
                (Some(old), Some(new)) => old.0 != new.0,
                _ => false,
            })
            .collect();
        let staging = sb
            .groups
            .iter()
            .rposition(|&p| p == GroupProfile::Unallocated)
            .ok_or_else(|| {
                ArrayError::Refused(format!(
                    "a reshape moves each group through a free one and none is left ({} groups, all allocated): free space first",
                    sb.groups.len()
                ))
            })? as u32;
        sb.reshape = Some(Reshape {
            from: GeometrySpec {
                level: from.data.level,
                layout: from.data.layout,
                chunk: from.data.chunk,
                members: from.data.members as u32,
                copies: from.data.copies as u32,
            },
            pending,
            staging,
            staged: None,
        });
        self.attach_added(present, &added)?;
        let new_slots = self.append_slots(&mut sb, added, u64::MAX)?;
        sb.features.incompat |= FEATURE_RESHAPE;
        sb.level = to.level;
        sb.layout = to.layout;
        sb.chunk = to.chunk;
        sb.copies = to.copies as u32;
        sb.events += 1;
        *shapes = Shapes {
            current: target,
            from: Some(from),
        };
        drop(shapes);
        drop(sb);
        for &slot in &new_slots {
            self.detect_rotational(slot);
        }
        log::info!(
            "reshape from {} to {} begins",
            describe(&from.data),
            describe(&to)
        );
        self.write_superblocks()?;
        if !new_slots.is_empty() {
            self.write_bitmap();
        }
        Ok(Begun::Reshape)
    }

    /// RAID1 onto more members, where every group keeps its placement on
    /// the members it has (data and metadata both mirrored on every
    /// member): md's way, the new members are rebuilt as copies, one after
    /// another, instead of every group being moved. One commit records the
    /// new slots as rebuilding and the new copy count.
    fn begin_mirror_growth(
        &self,
        mut sb: parking_lot::MutexGuard<'_, crate::superblock::Superblock>,
        mut shapes: parking_lot::RwLockWriteGuard<'_, Shapes>,
        target: Shape,
        added: Vec<(std::sync::Arc<dyn crate::member::Member>, String)>,
    ) -> ArrayResult<Begun> {
        self.attach_added(self.slots.len(), &added)?;
        let data_offset = sb.data_offset;
        let new_slots = self.append_slots(&mut sb, added, data_offset)?;
        sb.copies = target.data.copies as u32;
        sb.events += 1;
        let from = shapes.current;
        shapes.current = target;
        drop(shapes);
        drop(sb);
        for &slot in &new_slots {
            self.detect_rotational(slot);
        }
        log::info!(
            "{} grows to {}: the new members are rebuilt as copies",
            describe(&from.data),
            describe(&target.data)
        );
        self.write_superblocks()?;
        self.write_bitmap();
        match new_slots.first() {
            Some(&slot) => Ok(Begun::Recovery(slot)),
            None => Err(ArrayError::Refused("no member to add".into())),
        }
    }

    /// Start the member workers of `added`, to be slots `present..`.
    fn attach_added(
        &self,
        present: usize,
        added: &[(std::sync::Arc<dyn crate::member::Member>, String)],
    ) -> ArrayResult<()> {
        for (i, (m, name)) in added.iter().enumerate() {
            self.pool
                .attach(present + i, std::sync::Arc::clone(m))
                .map_err(|e| {
                    ArrayError::Refused(format!("cannot start workers for {name}: {e}"))
                })?;
        }
        Ok(())
    }

    /// The reshape under way, for status reports.
    pub fn reshape_status(&self) -> Option<ReshapeStatus> {
        let (pending, groups) = self.reshape_counts()?;
        let shapes = self.shapes.read();
        Some(ReshapeStatus {
            from: shapes.from?.data.level,
            to: shapes.current.data.level,
            pending,
            groups,
        })
    }

    /// Member bytes of the groups a reshape has moved (its progress).
    pub(super) fn reshape_done_bytes(&self) -> u64 {
        let group_size = self.sb.lock().group_size;
        self.reshape_counts()
            .map_or(0, |(pending, all)| (all - pending) as u64 * group_size)
    }

    /// Groups still to move, and all allocated groups.
    pub fn reshape_counts(&self) -> Option<(usize, usize)> {
        let sb = self.sb.lock();
        let r = sb.reshape.as_ref()?;
        let allocated = sb
            .groups
            .iter()
            .filter(|&&p| p != GroupProfile::Unallocated)
            .count();
        Some((r.pending_count(), allocated))
    }

    /// Body of the reshape's background run: move every pending group.
    /// Ok(true): finished; Ok(false): stopped (it resumes at the next start).
    pub(super) fn run_reshape(&self, done: &AtomicU64, pacer: &mut Pacer) -> ArrayResult<bool> {
        loop {
            if self.sync.stop.load(Ordering::Acquire) {
                return Ok(false);
            }
            let next = {
                let sb = self.sb.lock();
                let Some(r) = sb.reshape.as_ref() else {
                    return Ok(true);
                };
                // The staged group first: its copy at the staging slice is in force.
                r.staged
                    .or_else(|| r.pending.iter().position(|&p| p).map(|g| g as u32))
            };
            let Some(group) = next else {
                self.finish_reshape()?;
                return Ok(true);
            };
            if self.is_degraded() {
                return Err(ArrayError::Refused(
                    "the array became degraded; the reshape waits for the rebuild".into(),
                ));
            }
            self.move_group(group, pacer)?;
            let group_size = self.sb.lock().group_size;
            done.fetch_add(group_size, Ordering::Relaxed);
        }
    }

    /// Move `group` to the new geometry: to the staging slice in its old
    /// geometry (unless it is there already), then home in the new one.
    fn move_group(&self, group: u32, pacer: &mut Pacer) -> ArrayResult<()> {
        let _frozen = {
            self.reshape_gate.freeze(group);
            Frozen(&self.reshape_gate)
        };
        // Writes the stripe cache and write-back still hold reach the
        // members before the copy reads them.
        self.write_out_cached((group, 0)..=(group, u64::MAX))?;
        self.wait_unqueued(group, 0, u64::MAX)?;
        let (staged, staging, from, current, group_size, data_offset, profile) = {
            let sb = self.sb.lock();
            let shapes = self.shapes.read();
            let r = sb
                .reshape
                .as_ref()
                .ok_or_else(|| ArrayError::Refused("no reshape under way".into()))?;
            let from = shapes
                .from
                .ok_or_else(|| ArrayError::Refused("no old geometry recorded".into()))?;
            (
                r.staged == Some(group),
                r.staging,
                from,
                shapes.current,
                sb.group_size,
                sb.data_offset,
                sb.groups.get(group as usize).copied(),
            )
        };
        let profile = profile.unwrap_or(GroupProfile::Unallocated);
        let (Some((old, old_p)), Some((new, new_p))) = (from.of(profile), current.of(profile))
        else {
            return Err(ArrayError::Refused(format!(
                "group {group} is not allocated"
            )));
        };
        let region = |slice: u32, geometry: Geometry, personality| Region {
            group,
            geometry,
            personality,
            base: data_offset + u64::from(slice) * group_size,
        };
        let home_old = region(group, old, old_p);
        let staged_old = region(staging, old, old_p);
        let home_new = region(group, new, new_p);
        let length = old.capacity(group_size);
        if !staged {
            self.zero_group(staging)?;
            self.copy_group(group, &home_old, &staged_old, length, pacer)?;
            self.flush()?;
            self.reshape_transition(|r| r.staged = Some(group))?;
        }
        // From here the staged copy is in force: the group's own slice is free.
        self.zero_group(group)?;
        self.copy_group(group, &staged_old, &home_new, length, pacer)?;
        self.flush()?;
        self.reshape_transition(|r| {
            r.staged = None;
            if let Some(p) = r.pending.get_mut(group as usize) {
                *p = false;
            }
        })?;
        log::info!("reshape: group {group} is now {}", describe(&new));
        Ok(())
    }

    /// Copy logical `[0, length)` of `group` from `from` to `to`, step by
    /// step, reading through the checked path and reading each step back.
    /// `to`'s stripes are written whole: its last step runs to a stripe end
    /// with zeros (never past `to`'s capacity, which is a whole number of
    /// its stripes and no smaller than `from`'s).
    fn copy_group(
        &self,
        group: u32,
        from: &Region,
        to: &Region,
        length: u64,
        pacer: &mut Pacer,
    ) -> ArrayResult<()> {
        let stripe = to.geometry.stripe_bytes().max(1);
        let step = (STEP_BYTES / stripe).max(1) * stripe;
        let end = length.div_ceil(stripe) * stripe;
        let group_size = self.sb.lock().group_size;
        if end > to.geometry.capacity(group_size) {
            return Err(ArrayError::Refused(format!(
                "group {group}: {end} bytes do not fit the new geometry's {}",
                to.geometry.capacity(group_size)
            )));
        }
        let judge = self.content_judge();
        let mut data = vec![0u8; step as usize];
        let mut back = vec![0u8; step as usize];
        let mut at = 0u64;
        while at < end {
            let n = step.min(end - at) as usize;
            let real = (length.saturating_sub(at) as usize).min(n);
            let buf = &mut data[..n];
            buf[real..].fill(0);
            if real > 0 {
                let addr = (u64::from(group) << GROUP_SHIFT) | at;
                self.prepare_judge(addr, real as u64);
                let verify = |bytes: &[u8]| match &judge {
                    Some(j) => {
                        let bs = j.block_size().max(1);
                        bytes
                            .chunks(bs)
                            .enumerate()
                            .all(|(i, b)| j.judge(addr + (i * bs) as u64, b) != Some(false))
                    }
                    None => true,
                };
                self.read_checked_in(from, at, &mut buf[..real], &verify)?;
            }
            self.write_region_with(to, at, buf, Caching::Bypass)?;
            let check = &mut back[..n];
            self.read_region(to, at, check, Choice::Any)?;
            if check != &*buf {
                return Err(ArrayError::Refused(format!(
                    "group {group}: the new copy at logical offset {at} reads back different; the reshape stops"
                )));
            }
            at += n as u64;
            self.pace(pacer, n as u64);
        }
        Ok(())
    }

    /// A checked read of region-relative `[offset, offset + buf.len())` of
    /// `region`: a version that passes `verify` (another copy, a
    /// reconstruction), or an error naming the logical address.
    fn read_checked_in(
        &self,
        region: &Region,
        offset: u64,
        buf: &mut [u8],
        verify: &dyn Fn(&[u8]) -> bool,
    ) -> ArrayResult<()> {
        self.read_region(region, offset, buf, Choice::Any)?;
        if verify(buf) {
            return Ok(());
        }
        let pieces = super::io::split(region, offset, buf.len());
        let addr = (u64::from(region.group) << GROUP_SHIFT) | offset;
        match self.find_good_version(region, offset, &pieces, buf, verify, !self.read_only)? {
            Some(_) => Ok(()),
            None => Err(ArrayError::Unrecoverable(addr)),
        }
    }

    /// Change the reshape record and count the event, then write it. The
    /// change moves a group (to the staging slice, or home in the new
    /// geometry) and the slice it leaves is overwritten next (the group's
    /// own zeroed for the new geometry, the staging slice for the next
    /// group): a read that resolved the old place before the change may
    /// still be reading it, so those reads end first.
    fn reshape_transition(&self, change: impl FnOnce(&mut Reshape)) -> ArrayResult<()> {
        self.try_record_event(|sb| {
            let r = sb
                .reshape
                .as_mut()
                .ok_or_else(|| ArrayError::Refused("no reshape under way".into()))?;
            change(r);
            Ok::<(), ArrayError>(())
        })?;
        self.reshape_gate.drain_reads();
        self.write_superblocks()
    }

    /// Every group moved: the old geometry and the record go.
    fn finish_reshape(&self) -> ArrayResult<()> {
        {
            let mut sb = self.sb.lock();
            let mut shapes = self.shapes.write();
            sb.reshape = None;
            sb.features.incompat &= !FEATURE_RESHAPE;
            sb.events += 1;
            shapes.from = None;
        }
        self.write_superblocks()?;
        log::info!("reshape to {} is complete", describe(&self.data_geometry()));
        Ok(())
    }
}

/// What [`Array::begin_reshape`] set going.
pub(crate) enum Begun {
    /// Groups to move to the new geometry.
    Reshape,
    /// Added mirrors to rebuild, starting with this slot.
    Recovery(usize),
}

/// Whether going from `from` to `to` only adds members that every group
/// mirrors in full, each group keeping its place on the members it has:
/// RAID1 data and metadata on every member before and after.
fn mirrors_only_gain_copies(from: &Shape, to: &Shape) -> bool {
    let every = |g: &Geometry, p: Personality| p.mirrors_on_every_member() && g.copies == g.members;
    every(&from.data, from.data_personality)
        && every(&to.data, to.data_personality)
        && every(&from.meta, from.meta_personality)
        && every(&to.meta, to.meta_personality)
        && from.data.chunk == to.data.chunk
        && to.data.members > from.data.members
}

/// "RAID5 on 4 members (chunk 64 KiB)", for messages.
fn describe(g: &Geometry) -> String {
    format!(
        "{} on {} members (chunk {} KiB)",
        g.level,
        g.members,
        g.chunk >> 10
    )
}
