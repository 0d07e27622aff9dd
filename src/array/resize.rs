//! Growing onto larger members (md's `--grow --size`): members whose image
//! files were extended, or whose block devices or volumes were made larger,
//! give the new space to the array as more allocation groups.
//!
//! Nothing that is in use moves. The data area of every member gains whole
//! groups at its end, recorded as unallocated in one superblock commit;
//! they are zeroed when the filesystem first takes one, like every new
//! group, so no resync is needed. Before that commit the superblocks are
//! written once more, so that their end copies sit at the members' new end
//! (where the next assembly looks for them) while the old data size is
//! still the one in force: a crash at any point leaves a superblock that
//! describes the members, either the old size or the new.
//!
//! The write-intent bitmap covers the whole data area with at most 1024
//! regions, so a larger area may need larger regions: its layout changes
//! with writes held back at the reshape gate and the stripe cache written
//! out, so no write is in flight across the change, and it is written out
//! again (header and bits) after the commit.

use super::{Array, ArrayError, ArrayResult};
use crate::member::Member;
use crate::superblock::{member_end, GroupProfile, MAX_GROUPS, TAIL_RESERVE};
use std::sync::Arc;

/// How large the data area of every member should become.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum SizeTarget {
    /// All the members offer (md's `--size max`).
    Max,
    /// This many bytes of each member, rounded down to whole groups.
    Bytes(u64),
}

/// What a size change did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resized {
    /// Per-member data area before and after, in bytes.
    pub from: u64,
    pub to: u64,
    /// Groups before and after.
    pub groups_from: usize,
    pub groups_to: usize,
    /// The member with the least room, which sets how far `max` goes.
    pub smallest: String,
}

impl Resized {
    pub fn changed(&self) -> bool {
        self.to != self.from
    }
}

impl Array {
    /// Grow every member's data area to `target` (whole groups, at most
    /// [`MAX_GROUPS`]). Refused on a degraded, read-only or busy array, and
    /// during a reshape; returns the sizes unchanged when the members offer
    /// no room for another group.
    pub fn grow_size(&self, target: SizeTarget) -> ArrayResult<Resized> {
        self.ready_for_change("growing")?;
        if let Some(p) = self.sync_progress() {
            return Err(ArrayError::Refused(format!(
                "{} is running ({:.1}%); the size can change once it ends",
                p.action,
                super::percent(p.done, p.total)
            )));
        }
        if self.bitmap.has_suspect() {
            return Err(ArrayError::Refused(
                "regions a host fault left unsure are waiting for a resync; the size can change once it has run".into(),
            ));
        }
        let plan = self.plan_size(target)?;
        if !plan.changed() {
            return Ok(plan);
        }
        // The end copies move to the members' new end first, still
        // describing the old size.
        self.rewrite_superblocks()?;
        self.ensure_writable()?;
        let frozen = self.reshape_gate.freeze_all();
        self.write_out_cached(..)?;
        self.write_back.wait_idle();
        let data_size = plan.to;
        self.bitmap.resize(data_size);
        let groups_to = plan.groups_to;
        let committed = self.try_record_event(|sb| {
            if sb.reshape.is_some() {
                return Err(ArrayError::Refused("a reshape is under way".into()));
            }
            sb.data_size = data_size;
            sb.groups.resize(groups_to, GroupProfile::Unallocated);
            Ok(())
        });
        if let Err(e) = committed {
            self.bitmap.resize(plan.from);
            return Err(e);
        }
        self.write_superblocks()?;
        self.write_bitmap();
        drop(frozen);
        log::info!(
            "members grown: data area {} MiB to {} MiB per member, {} groups to {}",
            plan.from >> 20,
            plan.to >> 20,
            plan.groups_from,
            plan.groups_to
        );
        self.ensure_writable()?;
        Ok(plan)
    }

    /// The sizes `target` gives, after looking at every member's length
    /// again (members and spares alike: a spare must fit the grown array).
    fn plan_size(&self, target: SizeTarget) -> ArrayResult<Resized> {
        let (data_offset, data_size, group_size, groups, tail, min_len) = {
            let sb = self.sb.lock();
            if sb.reshape.is_some() {
                return Err(ArrayError::Refused(
                    "a reshape is under way (`raidfs grow MOUNT` goes on with a paused one): \
                     the size can change once it is done"
                        .into(),
                ));
            }
            let tail = if sb.has_end_copies() { TAIL_RESERVE } else { 0 };
            (
                sb.data_offset,
                sb.data_size,
                sb.group_size,
                sb.groups.len(),
                tail,
                sb.min_member_len(),
            )
        };
        let refresh = |m: &Arc<dyn Member>, name: &str| {
            m.refresh_len().map_err(|source| ArrayError::MemberIo {
                path: name.to_string(),
                source,
            })
        };
        let mut room = u64::MAX;
        let mut smallest = String::new();
        for (slot, member) in self.present_members() {
            let name = self.slots[slot].name();
            let len = refresh(&member, &name)?;
            if member_end(len) < min_len {
                return Err(ArrayError::Refused(format!(
                    "{name} is {len} bytes now, smaller than the {min_len} the array uses on it: \
                     was it truncated? nothing changed"
                )));
            }
            let usable = member_end(len).saturating_sub(data_offset + tail);
            if usable < room {
                room = usable;
                smallest = name;
            }
        }
        let most = (room / group_size).min(MAX_GROUPS as u64) as usize;
        let wanted = match target {
            SizeTarget::Max => most,
            SizeTarget::Bytes(bytes) => {
                let wanted = (bytes / group_size).min(MAX_GROUPS as u64) as usize;
                if wanted < groups {
                    return Err(ArrayError::Refused(format!(
                        "{} MiB per member is less than the {} MiB in use: an array cannot shrink",
                        bytes >> 20,
                        data_size >> 20
                    )));
                }
                if wanted > most {
                    return Err(ArrayError::Refused(format!(
                        "{} MiB per member does not fit: {smallest} has room for {} MiB \
                         (groups of {} MiB, {} MiB kept free at its end)",
                        bytes >> 20,
                        (most as u64 * group_size) >> 20,
                        group_size >> 20,
                        tail >> 20
                    )));
                }
                wanted
            }
        };
        let to_groups = wanted.max(groups);
        let to = to_groups as u64 * group_size;
        if to_groups > groups {
            let need = data_offset + to + tail;
            for (name, member) in self.spares.members() {
                let len = refresh(&member, &name)?;
                if member_end(len) < need {
                    return Err(ArrayError::Refused(format!(
                        "hot spare {name} holds {len} bytes, the grown array needs {need} per member: \
                         enlarge it too, or remove it first"
                    )));
                }
            }
        }
        Ok(Resized {
            from: data_size,
            to: data_size.max(to),
            groups_from: groups,
            groups_to: to_groups,
            smallest,
        })
    }
}
