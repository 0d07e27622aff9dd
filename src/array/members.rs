//! Member changes on a running array: add (a rebuild into a failed or
//! missing slot, a re-add from the bitmap, or a hot spare), remove,
//! replace (the old member serves until the new one is complete), spare
//! takeover, and stale members coming back after assembly. The slot state
//! they change is `slot`'s; the recovery or copy they start runs on the
//! background runner (`background`); this module decides when, and what
//! a finished one changes.

use super::background::SyncAction;
use super::{Array, ArrayError, ArrayResult, SlotDev};
use crate::member::Member;
use crate::superblock::{Superblock, SPARE_SLOT};
use serde::Serialize;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use uuid::Uuid;

/// What `add` did with the new member.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub enum AddOutcome {
    /// It took over a failed or missing slot and is being rebuilt.
    Rebuilding { slot: usize },
    /// It was this slot's member before: only regions written since are rebuilt.
    ReAdded { slot: usize },
    /// The array is complete: it waits as a hot spare.
    Spare,
}

impl Array {
    /// A stale member given at assembly, to come back once the array runs.
    pub(crate) fn queue_returning(&self, member: Arc<dyn Member>, name: String) {
        self.sync.returning.lock().push((member, name));
    }

    pub(crate) fn has_returning(&self) -> bool {
        !self.sync.returning.lock().is_empty()
    }

    /// A spare found at assembly stays a spare.
    pub(crate) fn adopt_spare(&self, member: Arc<dyn Member>, name: String, uuid: Uuid) {
        self.spares.add(SlotDev {
            member: Some(member),
            name,
            uuid,
        });
    }

    /// Bring back the next stale member (re-add from the bitmap, or a full
    /// rebuild into its own slot). True when one started.
    pub(super) fn start_returning(&self) -> bool {
        loop {
            let Some((member, name)) = self.sync.returning.lock().pop() else {
                return false;
            };
            match self.add(member, name.clone()) {
                Ok(AddOutcome::ReAdded { slot }) | Ok(AddOutcome::Rebuilding { slot }) => {
                    log::info!("{name} is coming back into slot {slot}");
                    return true;
                }
                Ok(AddOutcome::Spare) => log::info!("{name} waits as a hot spare"),
                Err(e) => log::error!("{name} could not be taken back: {e}"),
            }
        }
    }

    /// Names of the hot spares.
    pub fn spares(&self) -> Vec<String> {
        self.spares.names()
    }

    /// Find a slot by its member's name (path) or by number.
    pub fn slot_of(&self, who: &str) -> Option<usize> {
        if let Ok(n) = who.parse::<usize>() {
            if n < self.slots.len() {
                return Some(n);
            }
        }
        let wanted = std::fs::canonicalize(who).ok();
        (0..self.slots.len()).find(|&i| {
            let name = self.slots[i].name();
            name == who
                || wanted
                    .as_ref()
                    .is_some_and(|w| std::fs::canonicalize(&name).ok().as_ref() == Some(w))
        })
    }

    fn check_new_member(&self, member: &dyn Member) -> ArrayResult<()> {
        let sb = self.sb.lock();
        // From version 2 the end superblock copies must fit after the data.
        let need = sb.min_member_len();
        if member.len() < need {
            return Err(ArrayError::Refused(format!(
                "{} is too small: {} bytes, the array needs {need} per member",
                member.name(),
                member.len()
            )));
        }
        Ok(())
    }

    /// Add a member: it rebuilds into a failed or missing slot, or becomes a
    /// hot spare when the array is complete.
    pub fn add(&self, member: Arc<dyn Member>, name: String) -> ArrayResult<AddOutcome> {
        self.check_new_member(member.as_ref())?;
        if let Some((slot, uuid)) = self.re_add_slot(member.as_ref()) {
            if !self.busy() {
                log::info!("{name} was slot {slot}: re-added; only regions written since it left are rebuilt");
                self.install(slot, member, name, uuid)?;
                self.sync
                    .recovery_bitmap_only
                    .store(true, Ordering::Release);
                self.spawn(SyncAction::Recovery, Some(slot))?;
                return Ok(AddOutcome::ReAdded { slot });
            }
        }
        // A former member goes back into its own slot when that is empty.
        let own = Superblock::read_from(member.as_ref())
            .ok()
            .filter(|(sb, _)| sb.array_uuid == self.uuid())
            .map(|(sb, _)| sb.slot as usize)
            .filter(|&s| s < self.slots.len() && self.is_failed(s));
        let slot = own.or_else(|| (0..self.slots.len()).find(|&i| self.is_failed(i)));
        match slot {
            Some(slot) if !self.busy() => {
                self.sync
                    .recovery_bitmap_only
                    .store(false, Ordering::Release);
                self.install(slot, member, name, Uuid::new_v4())?;
                self.spawn(SyncAction::Recovery, Some(slot))?;
                Ok(AddOutcome::Rebuilding { slot })
            }
            _ => {
                let uuid = self.write_spare_superblock(member.as_ref(), &name)?;
                log::info!("{name} added as a hot spare");
                self.spares.add(SlotDev {
                    member: Some(member),
                    name,
                    uuid,
                });
                Ok(AddOutcome::Spare)
            }
        }
    }

    /// Claim `member` for this array as a spare (a new member UUID, no
    /// slot yet), so no other array or tool takes it meanwhile.
    fn write_spare_superblock(&self, member: &dyn Member, name: &str) -> ArrayResult<Uuid> {
        let uuid = Uuid::new_v4();
        let mut sb = self.superblock();
        sb.member_uuid = uuid;
        sb.slot = SPARE_SLOT;
        sb.write_to(member).map_err(|source| ArrayError::MemberIo {
            path: name.to_string(),
            source,
        })?;
        Ok(uuid)
    }

    /// A former member of this array whose slot is empty, and that left after
    /// the bitmap was last cleared, can catch up from the bitmap alone
    /// (md's --re-add). Returns its slot and member UUID.
    fn re_add_slot(&self, member: &dyn Member) -> Option<(usize, Uuid)> {
        let (sb, _) = Superblock::read_from(member).ok()?;
        let ours = self.sb.lock().array_uuid;
        let slot = sb.slot as usize;
        let fits = sb.array_uuid == ours && slot < self.slots.len() && self.is_failed(slot);
        (fits && sb.events >= self.bitmap.events_cleared()).then_some((slot, sb.member_uuid))
    }

    /// Put `member` (as member `uuid`) into `slot` with nothing valid yet,
    /// and record it.
    fn install(
        &self,
        slot: usize,
        member: Arc<dyn Member>,
        name: String,
        uuid: Uuid,
    ) -> ArrayResult<()> {
        self.apply_failfast(member.as_ref(), &name);
        let data_offset = self.sb.lock().data_offset;
        let dev = SlotDev {
            member: Some(Arc::clone(&member)),
            name: name.clone(),
            uuid,
        };
        self.install_slot(slot, dev, data_offset, || {
            self.pool
                .attach(slot, member)
                .map_err(|e| ArrayError::Refused(format!("cannot start workers for {name}: {e}")))
        })?;
        self.release_held(slot);
        log::info!("{name} takes slot {slot}; recovery starts");
        self.write_superblocks()
    }

    /// A member failed: a hot spare, if there is one, takes its place.
    pub(crate) fn take_spare(&self, slot: usize) {
        let Some(dev) = self.spares.take() else {
            return;
        };
        let Some(member) = dev.member else { return };
        if self.busy() {
            self.spares.add(SlotDev {
                member: Some(member),
                name: dev.name,
                uuid: dev.uuid,
            });
            return;
        }
        log::warn!("hot spare {} replaces failed slot {slot}", dev.name);
        let result = self
            .install(slot, member, dev.name, Uuid::new_v4())
            .and_then(|()| self.spawn(SyncAction::Recovery, Some(slot)));
        if let Err(e) = result {
            log::error!("spare takeover of slot {slot} failed: {e}");
        }
    }

    /// Remove a failed member (or a spare, by name) from the array.
    pub fn remove(&self, who: &str) -> ArrayResult<()> {
        if self.spares.remove(who) {
            log::info!("spare {who} removed");
            return Ok(());
        }
        let slot = self
            .slot_of(who)
            .ok_or_else(|| ArrayError::Refused(format!("{who} is not a member of this array")))?;
        if !self.is_failed(slot) {
            return Err(ArrayError::Refused(format!(
                "{} is active; mark it failed first (raidfs fail)",
                self.slots[slot].name()
            )));
        }
        self.pool.detach(slot);
        let name = self.remove_slot_member(slot);
        log::info!("{name} removed from slot {slot}");
        self.write_superblocks()
    }

    /// Replace `slot`'s member with `member`: the old one serves reads until
    /// the new one holds everything, then leaves the array.
    pub fn replace(&self, slot: usize, member: Arc<dyn Member>, name: String) -> ArrayResult<()> {
        self.check_new_member(member.as_ref())?;
        if slot >= self.slots.len() || self.is_failed(slot) {
            return Err(ArrayError::Refused(format!(
                "slot {slot} is not active; use add to rebuild it"
            )));
        }
        if self.busy() {
            return Err(ArrayError::Refused(
                "other background work is running; wait for it or stop it".into(),
            ));
        }
        let uuid = self.write_spare_superblock(member.as_ref(), &name)?;
        self.pool
            .set_replacement(slot, Some(Arc::clone(&member)))
            .map_err(|e| ArrayError::Refused(format!("cannot start workers for {name}: {e}")))?;
        *self.sync.pending_replacement.lock() = Some(SlotDev {
            member: Some(member),
            name,
            uuid,
        });
        self.spawn(SyncAction::Replace, Some(slot))
    }

    pub(super) fn recovery_done(&self, slot: usize) {
        self.complete_recovery(slot);
        self.broken.store(false, Ordering::Release);
        self.check_tolerance();
        if let Err(e) = self.write_superblocks() {
            log::error!("recording the end of recovery: {e}");
        }
        log::info!(
            "recovery of slot {slot} ({}) is complete",
            self.slots[slot].name()
        );
    }

    pub(super) fn replacement_done(&self, slot: usize) {
        let Some(dev) = self.sync.pending_replacement.lock().take() else {
            return;
        };
        let Some(member) = dev.member.clone() else {
            return;
        };
        if self.pool.replacement_failed(slot) {
            log::error!(
                "replacement of slot {slot} abandoned: writes to {} failed",
                dev.name
            );
            let _ = self.pool.set_replacement(slot, None);
            return;
        }
        let old = self.slots[slot].name();
        // Writes keep reaching the new member through the replacement lane
        // until it becomes the slot's main lane, so nothing is missed.
        if let Err(e) = self.pool.attach(slot, Arc::clone(&member)) {
            log::error!("replacement of slot {slot} failed: {e}");
            return;
        }
        self.swap_slot_device(slot, dev);
        let _ = self.pool.set_replacement(slot, None);
        if let Err(e) = self.write_superblocks() {
            log::error!("recording the replacement: {e}");
        }
        log::info!("slot {slot}: {old} replaced by {}", self.slots[slot].name());
    }
}
