//! Member slots and their state, with one owner: which device is in each
//! slot, whether it serves I/O, how far a rebuilding slot is valid, and the
//! hot spares waiting for a slot.
//!
//! Every transition is one method here that changes the runtime state, the
//! array superblock's slot table and the event count together (fail,
//! remove, install for recovery or re-add, recovery done, replacement). The
//! superblock's per-member `recovery_offset` is not kept apart: every
//! superblock write takes it from the slot's `valid_below`, so rebuild
//! progress ([`Array::advance_recovery`]) is recorded at the next
//! checkpoint without an event of its own, as md records `recovery_offset`.
//! Writing the superblocks after a transition is the caller's (it may have
//! more to record first, or be a path that must not write).
//!
//! The runtime state is two atomics read on every I/O, so the hot path
//! takes no lock; they change only here. Outside the engine the state is
//! a [`MemberState`], rendered only at the edges (JSON, text).

use super::Array;
use crate::member::Member;
use crate::superblock::{SlotState, Superblock};
use parking_lot::{Mutex, RwLock, RwLockReadGuard};
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use uuid::Uuid;

/// What a slot is doing, as reports show it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MemberState {
    /// Serves every read.
    Active,
    /// Has a member that failed (or was failed on request).
    Faulty,
    /// Has a member being rebuilt: valid only below its recovery position.
    Rebuilding,
    /// Has no member (missing at assembly, or removed).
    Missing,
}

impl MemberState {
    /// The name reports use: `active`, `faulty`, `rebuilding`, `missing`.
    pub fn as_str(self) -> &'static str {
        match self {
            MemberState::Active => "active",
            MemberState::Faulty => "faulty",
            MemberState::Rebuilding => "rebuilding",
            MemberState::Missing => "missing",
        }
    }

    /// Faulty or missing: no member in service.
    pub fn is_out(self) -> bool {
        matches!(self, MemberState::Faulty | MemberState::Missing)
    }
}

impl std::fmt::Display for MemberState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}

impl PartialEq<str> for MemberState {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for MemberState {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

/// The device currently in a slot (or a spare's, or a replacement's).
pub(crate) struct SlotDev {
    pub member: Option<Arc<dyn Member>>,
    pub name: String,
    pub uuid: Uuid,
}

/// Error counts of one slot, as `raidfs detail` shows them.
#[derive(Default)]
pub(crate) struct ErrorCounters {
    pub read: AtomicU64,
    pub write: AtomicU64,
    pub checksum: AtomicU64,
}

/// One member slot of an assembled array.
pub(crate) struct Slot {
    dev: RwLock<SlotDev>,
    /// Set once the member has failed, was removed, or was missing at assembly.
    failed: AtomicBool,
    /// Member offsets below this hold valid data: u64::MAX when in sync,
    /// the recovery position while the slot is being rebuilt.
    valid_below: AtomicU64,
    pub errors: ErrorCounters,
}

impl Slot {
    /// A slot as assembly or creation finds it: in service with `member`,
    /// valid below `valid_below` (u64::MAX: whole), or failed without one.
    pub fn new(
        member: Option<Arc<dyn Member>>,
        name: String,
        uuid: Uuid,
        valid_below: u64,
    ) -> Slot {
        let failed = member.is_none();
        Slot {
            dev: RwLock::new(SlotDev { member, name, uuid }),
            failed: AtomicBool::new(failed),
            valid_below: AtomicU64::new(valid_below),
            errors: ErrorCounters::default(),
        }
    }

    pub fn name(&self) -> String {
        self.dev.read().name.clone()
    }

    pub fn member(&self) -> Option<Arc<dyn Member>> {
        self.dev.read().member.clone()
    }

    /// The device in the slot (superblock writes read its identity).
    pub fn dev(&self) -> RwLockReadGuard<'_, SlotDev> {
        self.dev.read()
    }

    /// Not serving I/O: failed, removed or missing.
    pub fn is_failed(&self) -> bool {
        self.failed.load(Ordering::Acquire)
    }

    /// Member offsets below this hold valid data (u64::MAX when whole).
    pub fn valid_below(&self) -> u64 {
        self.valid_below.load(Ordering::Acquire)
    }

    /// Serving every read: in service and valid everywhere.
    pub fn is_whole(&self) -> bool {
        !self.is_failed() && self.valid_below() == u64::MAX
    }

    /// Serving I/O but not yet valid everywhere (being rebuilt).
    pub fn is_rebuilding(&self) -> bool {
        !self.is_failed() && self.valid_below() != u64::MAX
    }

    pub fn state(&self) -> MemberState {
        if self.dev.read().member.is_none() {
            MemberState::Missing
        } else if self.is_failed() {
            MemberState::Faulty
        } else if self.valid_below() != u64::MAX {
            MemberState::Rebuilding
        } else {
            MemberState::Active
        }
    }
}

/// The array's slots. Room for the most slots an array may have is made
/// at assembly, so a slot added while the array runs (`raidfs grow --add`)
/// never moves the others: the hot path indexes them without a lock, and
/// sees only the first [`SlotTable::len`].
pub(crate) struct SlotTable {
    slots: Box<[Slot]>,
    count: std::sync::atomic::AtomicUsize,
}

impl SlotTable {
    pub fn new(slots: Vec<Slot>) -> SlotTable {
        let count = slots.len();
        let mut all = slots;
        all.extend(
            (count..crate::superblock::MAX_MEMBERS)
                .map(|_| Slot::new(None, String::new(), Uuid::nil(), u64::MAX)),
        );
        SlotTable {
            slots: all.into_boxed_slice(),
            count: std::sync::atomic::AtomicUsize::new(count),
        }
    }

    pub fn len(&self) -> usize {
        self.count.load(Ordering::Acquire)
    }

    /// Slot `slot`, when it is one of the array's.
    pub fn get(&self, slot: usize) -> Option<&Slot> {
        self.slots[..self.len()].get(slot)
    }

    pub fn iter(&self) -> impl Iterator<Item = &Slot> {
        self.slots[..self.len()].iter()
    }

    /// Put `dev` in service in a new slot at the end; its number. The
    /// caller records it in the superblock in the same transition.
    pub(super) fn append(&self, dev: SlotDev, valid_below: u64) -> Option<usize> {
        let slot = self.len();
        let next = self.slots.get(slot)?;
        *next.dev.write() = dev;
        next.valid_below.store(valid_below, Ordering::Release);
        next.failed.store(false, Ordering::Release);
        self.count.store(slot + 1, Ordering::Release);
        Some(slot)
    }
}

impl std::ops::Index<usize> for SlotTable {
    type Output = Slot;

    fn index(&self, slot: usize) -> &Slot {
        &self.slots[slot]
    }
}

/// Hot spares: members claimed for this array, waiting for a slot.
#[derive(Default)]
pub(crate) struct Spares {
    waiting: Mutex<Vec<SlotDev>>,
}

impl Spares {
    pub fn add(&self, dev: SlotDev) {
        self.waiting.lock().push(dev);
    }

    /// The most recently added spare, taken out of the list.
    pub fn take(&self) -> Option<SlotDev> {
        self.waiting.lock().pop()
    }

    /// Forget the spare named `name`; false when there is none.
    pub fn remove(&self, name: &str) -> bool {
        let mut waiting = self.waiting.lock();
        match waiting.iter().position(|d| d.name == name) {
            Some(i) => {
                waiting.remove(i);
                true
            }
            None => false,
        }
    }

    pub fn names(&self) -> Vec<String> {
        self.waiting.lock().iter().map(|d| d.name.clone()).collect()
    }

    /// The waiting spares' names and devices.
    pub fn members(&self) -> Vec<(String, Arc<dyn Member>)> {
        self.waiting
            .lock()
            .iter()
            .filter_map(|d| Some((d.name.clone(), Arc::clone(d.member.as_ref()?))))
            .collect()
    }
}

impl Array {
    /// Put `added` members in service in new slots after the present ones
    /// (`raidfs grow --add`), valid below `valid_below` (u64::MAX: whole,
    /// for groups a reshape will write; else rebuilding from there),
    /// recorded in `sb`'s slot table as active or rebuilding; the caller
    /// holds the superblock, changes the geometry fields and counts the
    /// event in the same transition. The slots' numbers.
    pub(super) fn append_slots(
        &self,
        sb: &mut Superblock,
        added: Vec<(Arc<dyn Member>, String)>,
        valid_below: u64,
    ) -> super::ArrayResult<Vec<usize>> {
        let mut slots = Vec::with_capacity(added.len());
        for (member, name) in added {
            let dev = SlotDev {
                member: Some(member),
                name,
                uuid: Uuid::new_v4(),
            };
            let slot = self.slots.append(dev, valid_below).ok_or_else(|| {
                super::ArrayError::Refused(format!(
                    "an array has at most {} members",
                    crate::superblock::MAX_MEMBERS
                ))
            })?;
            sb.slots.push(if valid_below == u64::MAX {
                SlotState::Active
            } else {
                SlotState::Rebuilding
            });
            slots.push(slot);
        }
        sb.members = self.slots.len() as u32;
        Ok(slots)
    }

    /// Change the array superblock and count the change as an event: every
    /// change other members must be able to tell is newer goes through here.
    pub(crate) fn record_event(&self, change: impl FnOnce(&mut Superblock)) {
        let recorded: Result<(), std::convert::Infallible> = self.try_record_event(|sb| {
            change(sb);
            Ok(())
        });
        let Ok(()) = recorded;
    }

    /// [`Array::record_event`] for a change that may not apply: nothing is
    /// changed or counted when `change` returns an error.
    pub(crate) fn try_record_event<T, E>(
        &self,
        change: impl FnOnce(&mut Superblock) -> Result<T, E>,
    ) -> Result<T, E> {
        let mut sb = self.sb.lock();
        let done = change(&mut sb)?;
        sb.events += 1;
        Ok(done)
    }

    /// Take `slot` out of service as faulty. False when it already was.
    pub(crate) fn fail_slot(&self, slot: usize) -> bool {
        if self.slots[slot].failed.swap(true, Ordering::AcqRel) {
            return false;
        }
        self.record_event(|sb| sb.slots[slot] = SlotState::Faulty);
        true
    }

    /// Take `slot` out of service on an array assembled read-only: nothing
    /// is recorded, since nothing may be written.
    pub(crate) fn leave_out_slot(&self, slot: usize) {
        self.slots[slot].failed.store(true, Ordering::Release);
    }

    /// Forget a failed slot's member: the slot becomes missing. Returns the
    /// name the member had.
    pub(crate) fn remove_slot_member(&self, slot: usize) -> String {
        let name = {
            let mut dev = self.slots[slot].dev.write();
            let old = std::mem::replace(&mut dev.name, format!("removed (slot {slot})"));
            dev.member = None;
            old
        };
        self.record_event(|sb| sb.slots[slot] = SlotState::Missing);
        name
    }

    /// Put `dev` into failed slot `slot`, valid below `valid_below` (the
    /// data offset: nothing yet), and record it as rebuilding. `attach`
    /// starts the member's workers first; if it fails nothing changes.
    pub(crate) fn install_slot<E>(
        &self,
        slot: usize,
        dev: SlotDev,
        valid_below: u64,
        attach: impl FnOnce() -> Result<(), E>,
    ) -> Result<(), E> {
        let s = &self.slots[slot];
        s.valid_below.store(valid_below, Ordering::Release);
        *s.dev.write() = dev;
        attach()?;
        s.failed.store(false, Ordering::Release);
        self.record_event(|sb| sb.slots[slot] = SlotState::Rebuilding);
        Ok(())
    }

    /// Rebuild progress: member offsets of `slot` below `valid_below` now
    /// hold valid data (recorded at the next superblock write).
    pub(crate) fn advance_recovery(&self, slot: usize, valid_below: u64) {
        self.slots[slot]
            .valid_below
            .store(valid_below, Ordering::Release);
    }

    /// `slot` is rebuilt: whole again, and recorded active.
    pub(crate) fn complete_recovery(&self, slot: usize) {
        self.advance_recovery(slot, u64::MAX);
        self.record_event(|sb| sb.slots[slot] = SlotState::Active);
    }

    /// A replacement finished: `dev` takes over `slot`, which stays active.
    pub(crate) fn swap_slot_device(&self, slot: usize, dev: SlotDev) {
        *self.slots[slot].dev.write() = dev;
        self.record_event(|_| {});
    }

    /// The state of `slot`.
    pub fn member_state(&self, slot: usize) -> Option<MemberState> {
        self.slots.get(slot).map(Slot::state)
    }

    /// Whether the array keeps all its data if `slot` is also lost, on top
    /// of every slot that cannot serve reads now: the engine's one rule,
    /// asked before a member is failed on request.
    pub fn survives_losing(&self, slot: usize) -> bool {
        let mut without = self.unreadable_slots();
        if !without.contains(&slot) {
            without.push(slot);
        }
        self.survives_without(&without)
    }
}

#[cfg(test)]
mod tests {
    use super::MemberState;

    #[test]
    fn member_states_render_as_reports_name_them() {
        let all = [
            (MemberState::Active, "active"),
            (MemberState::Faulty, "faulty"),
            (MemberState::Rebuilding, "rebuilding"),
            (MemberState::Missing, "missing"),
        ];
        for (state, name) in all {
            assert_eq!(state.to_string(), name);
            assert_eq!(state, name);
            let json = serde_json::to_string(&state).expect("serialise");
            assert_eq!(json, format!("\"{name}\""));
            let back: MemberState = serde_json::from_str(&json).expect("deserialise");
            assert_eq!(back, state);
        }
        // Text tables pad the state like the string they used to hold.
        assert_eq!(format!("[{:<12}]", MemberState::Faulty), "[faulty      ]");
    }
}
