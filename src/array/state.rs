//! Array state kept in the superblocks: writing them, clean/dirty, the
//! group table; member failure; and the status report. Slot states and the
//! event count change through `slot`.

use super::{Array, ArrayError, ArrayResult, MemberState};
use crate::superblock::{ArrayState, GroupProfile, Superblock};
use serde::Serialize;
use std::sync::atomic::Ordering;
use std::time::{SystemTime, UNIX_EPOCH};

/// One member as the array sees it now.
#[derive(Clone, Debug, Serialize)]
pub struct MemberStatus {
    pub slot: usize,
    pub name: String,
    pub uuid: String,
    pub state: MemberState,
    pub read_errors: u64,
    pub write_errors: u64,
    pub checksum_errors: u64,
}

/// A snapshot of the array, for logs, `examine` and `status`.
#[derive(Clone, Debug, Serialize)]
pub struct ArrayStatus {
    pub uuid: String,
    pub name: String,
    pub level: String,
    pub layout: String,
    pub chunk: u64,
    pub members: Vec<MemberStatus>,
    pub events: u64,
    pub state: String,
    pub degraded: bool,
    pub groups_allocated: usize,
    pub groups_total: usize,
    /// `[UU_U]`, as /proc/mdstat shows it.
    pub map: String,
}

pub(crate) fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

impl Array {
    /// Write the current superblock to every working member (copy 0, sync,
    /// copy 1, sync). A member that cannot take it goes through
    /// [`Array::member_error`]: failed, or the array suspended when every
    /// member refuses (the host's fault). Nothing is written while the
    /// array is suspended, so a host fault never reaches the superblocks.
    pub(crate) fn write_superblocks(&self) -> ArrayResult<()> {
        if let Some(e) = self.host.suspended_error() {
            return Err(e);
        }
        for (slot, e) in self.write_superblocks_once() {
            self.member_error(slot, &e, "superblock write", None);
        }
        Ok(())
    }

    /// One round of superblock writes; the members that failed it.
    fn write_superblocks_once(&self) -> Vec<(usize, std::io::Error)> {
        let _serial = self.sb_write.lock();
        let template = {
            let mut sb = self.sb.lock();
            sb.utime = now_secs();
            sb.clone()
        };
        let mut failures = Vec::new();
        std::thread::scope(|scope| {
            let handles: Vec<_> = (0..self.slots.len())
                .filter(|&i| !self.is_failed(i))
                .filter_map(|i| {
                    let dev = self.slots[i].dev();
                    let member = dev.member.clone()?;
                    let mut sb: Superblock = template.clone();
                    sb.member_uuid = dev.uuid;
                    sb.slot = i as u32;
                    // Rebuild progress is recorded here, from the slot.
                    sb.recovery_offset = self.slots[i].valid_below();
                    Some((i, scope.spawn(move || sb.write_to(member.as_ref()))))
                })
                .collect();
            for (i, h) in handles {
                match h.join() {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => failures.push((i, e)),
                    Err(_) => {
                        failures.push((i, std::io::Error::other("superblock writer panicked")))
                    }
                }
            }
        });
        failures
    }

    /// Write every working member's superblock again (heals a damaged copy).
    pub fn rewrite_superblocks(&self) -> ArrayResult<()> {
        self.record_event(|_| {});
        self.write_superblocks()
    }

    /// Take a member out of service: it is marked faulty in the other
    /// members' superblocks (with a new event count, so a later assembly
    /// knows it is stale) and the array goes on degraded. After an I/O
    /// error this is reached only through [`Array::member_error`], which
    /// first rules out the host.
    pub(crate) fn record_failure(&self, slot: usize, why: &str) {
        if !self.fail_slot(slot) {
            return;
        }
        log::error!(
            "raidfs: member {} (slot {slot}) failed: {why}",
            self.slots[slot].name()
        );
        self.check_tolerance();
        if self.broken.load(Ordering::Acquire) {
            log::error!("raidfs: too many members lost; the array no longer accepts writes");
        } else {
            log::warn!(
                "raidfs: array continues degraded without {}",
                self.slots[slot].name()
            );
        }
        // Failures while recording this one are decided in turn.
        let _ = self.write_superblocks();
        self.take_spare(slot);
    }

    /// Fail a member on request (`raidfs fail`, tests).
    pub fn fail(&self, slot: usize) -> ArrayResult<()> {
        if slot >= self.slots.len() {
            return Err(ArrayError::Refused(format!("no member slot {slot}")));
        }
        self.hold_failed(slot);
        self.record_failure(slot, "failed by request");
        Ok(())
    }

    fn set_state(&self, state: ArrayState) -> ArrayResult<()> {
        let unchanged = self
            .try_record_event(|sb| {
                if sb.state == state {
                    return Err(());
                }
                sb.state = state;
                Ok(())
            })
            .is_err();
        if unchanged {
            return Ok(());
        }
        self.write_superblocks()?;
        if state == ArrayState::Dirty {
            self.ensure_writable()
        } else {
            Ok(())
        }
    }

    /// Before the first write: writes may now be in flight.
    pub fn mark_dirty(&self) -> ArrayResult<()> {
        self.set_state(ArrayState::Dirty)
    }

    /// After the last write and a flush: every stripe is consistent.
    pub fn mark_clean(&self) -> ArrayResult<()> {
        if let Some(e) = self.host.suspended_error() {
            // The host refuses writes: the array stays dirty, which the next
            // assembly resyncs by the bitmap.
            self.stop_background();
            return Err(e);
        }
        self.stop_background();
        self.flush()?;
        if self.needs_resync.load(std::sync::atomic::Ordering::Acquire) {
            // An unclean shutdown's dirty regions were never resynced (the
            // array was degraded, or the resync was stopped): stay dirty so
            // the next assembly resyncs them.
            log::warn!("raidfs: regions an unclean shutdown left dirty are not resynced yet; the array stays dirty");
            return Ok(());
        }
        if self.bitmap.has_suspect() {
            // Some stripe a host fault interrupted was never resynced: stay
            // dirty so the next assembly resyncs the regions the bitmap marks.
            log::warn!("raidfs: regions a host fault interrupted are not resynced yet; the array stays dirty");
            return Ok(());
        }
        // Everything is durable and consistent: no region needs a resync.
        if !self.is_degraded() {
            self.bitmap.reset_recent();
            self.clean_bitmap();
        }
        self.set_state(ArrayState::Clean)
    }

    pub fn is_dirty(&self) -> bool {
        self.sb.lock().state == ArrayState::Dirty
    }

    /// Allocated groups as (index, profile).
    pub fn groups(&self) -> Vec<(u32, GroupProfile)> {
        let sb = self.sb.lock();
        sb.groups
            .iter()
            .enumerate()
            .filter(|(_, p)| **p != GroupProfile::Unallocated)
            .map(|(i, p)| (i as u32, *p))
            .collect()
    }

    /// Groups not yet allocated (a reshape's staging slice is not free).
    pub fn free_group_count(&self) -> usize {
        let sb = self.sb.lock();
        let staging = sb.reshape.as_ref().map(|r| r.staging as usize);
        sb.groups
            .iter()
            .enumerate()
            .filter(|&(i, p)| *p == GroupProfile::Unallocated && Some(i) != staging)
            .count()
    }

    /// Allocate the lowest unallocated group with `profile`, durably.
    pub fn allocate_group(&self, profile: GroupProfile) -> ArrayResult<u32> {
        self.ensure_writable()?;
        let index = self.try_record_event(|sb| {
            // A reshape moves groups through its staging slice.
            let staging = sb.reshape.as_ref().map(|r| r.staging as usize);
            let i = sb
                .groups
                .iter()
                .enumerate()
                .position(|(i, p)| *p == GroupProfile::Unallocated && Some(i) != staging)
                .ok_or(ArrayError::NoSpace)?;
            sb.groups[i] = profile;
            Ok::<u32, ArrayError>(i as u32)
        })?;
        self.zero_group(index)?;
        self.write_superblocks()?;
        self.ensure_writable()?;
        Ok(index)
    }

    /// Logical bytes available for file data if every group held data.
    pub fn data_capacity(&self) -> u64 {
        self.group_capacity(GroupProfile::Data) * self.sb.lock().groups.len() as u64
    }

    /// Make a newly allocated group read as zeros on every member, so its
    /// parity is consistent from the start whatever the members held before.
    pub(super) fn zero_group(&self, group: u32) -> ArrayResult<()> {
        let (base, size) = {
            let sb = self.sb.lock();
            (sb.data_offset + group as u64 * sb.group_size, sb.group_size)
        };
        for slot in 0..self.slots.len() {
            if self.is_failed(slot) {
                continue;
            }
            if let Some(m) = self.slots[slot].member() {
                match m.zero_range(base, size) {
                    Ok(()) => self.pool.note_written(slot),
                    Err(e) => {
                        if let Some(host) = self.member_error(
                            slot,
                            &e,
                            "zeroing a new group",
                            Some((base, base + size)),
                        ) {
                            return Err(host);
                        }
                    }
                }
            }
        }
        self.ensure_writable()
    }

    /// A copy of the array-wide superblock fields.
    pub fn superblock(&self) -> Superblock {
        self.sb.lock().clone()
    }

    pub fn status(&self) -> ArrayStatus {
        let sb = self.sb.lock().clone();
        let members: Vec<MemberStatus> = self
            .slots
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let (name, uuid) = {
                    let dev = s.dev();
                    (dev.name.clone(), dev.uuid.to_string())
                };
                MemberStatus {
                    slot: i,
                    name,
                    uuid,
                    state: s.state(),
                    read_errors: s.errors.read.load(Ordering::Relaxed),
                    write_errors: s.errors.write.load(Ordering::Relaxed),
                    checksum_errors: s.errors.checksum.load(Ordering::Relaxed),
                }
            })
            .collect();
        let map: String = members
            .iter()
            .map(|m| {
                if m.state == MemberState::Active {
                    'U'
                } else {
                    '_'
                }
            })
            .collect();
        ArrayStatus {
            uuid: sb.array_uuid.to_string(),
            name: sb.name.clone(),
            level: self.level().to_string(),
            layout: self.level().layout_shown(sb.layout, sb.copies),
            chunk: sb.chunk,
            degraded: members.iter().any(|m| m.state != MemberState::Active),
            members,
            events: sb.events,
            state: match sb.state {
                ArrayState::Clean => "clean".into(),
                ArrayState::Dirty => "active (dirty)".into(),
            },
            groups_allocated: sb
                .groups
                .iter()
                .filter(|p| **p != GroupProfile::Unallocated)
                .count(),
            groups_total: sb.groups.len(),
            map: format!("[{map}]"),
        }
    }
}
