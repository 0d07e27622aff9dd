//! Assembly, by md's rules: one array UUID, the highest event count wins and
//! older members are stale, a dirty and degraded parity array needs force,
//! and too few members is a clear error.

use super::{data_geometry, Array, ArrayError, ArrayResult, ReadPolicy, Slot};
use crate::geometry::Level;
use crate::member::file::{FileMember, OpenOptions};
use crate::member::Member;
use crate::parity::Parity;
use crate::superblock::{ArrayState, SlotState, Superblock, SPARE_SLOT};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use uuid::Uuid;

#[derive(Clone, Copy, Default)]
pub struct AssembleOptions {
    /// Start a dirty and degraded parity array anyway.
    pub force: bool,
    /// Write nothing (no superblock updates, no resync).
    pub read_only: bool,
    /// Parity kernels to use (default: the process-wide selection).
    pub parity: Option<&'static Parity>,
    /// How mirror reads pick a copy (`-o balance=NAME`; default sticky).
    pub read_policy: ReadPolicy,
    /// Treat every member as rotational (`Some(true)`) or solid-state
    /// (`Some(false)`) instead of detecting it (image files).
    pub rotational: Option<bool>,
}

/// Open a member path (image file or block device), creating a sparse image
/// of `create_size` bytes when given.
pub fn open_member(path: &Path, create_size: Option<u64>) -> ArrayResult<Arc<dyn Member>> {
    let member = match create_size {
        Some(size) => FileMember::create(path, size),
        None => FileMember::open(path, OpenOptions::default()),
    }
    .map_err(|source| ArrayError::MemberIo {
        path: path.display().to_string(),
        source,
    })?;
    Ok(Arc::new(member))
}

/// How [`assemble_paths`] opens its members (read-only when the assembly is).
#[derive(Clone, Copy, Debug, Default)]
pub struct OpenPolicy {
    /// Wait this long for another process (a daemon still closing the array
    /// after an unmount) to release a member's lock.
    pub lock_wait: Duration,
    /// In a read-write assembly, leave out a member that cannot be opened
    /// read-write (EACCES, EPERM, EROFS), telling the user why, instead of
    /// failing: the array then starts degraded without it.
    pub leave_out_unwritable: bool,
}

/// Members left out because they cannot be opened read-write: name and why.
pub type LeftOut = Vec<(String, String)>;

/// Opened members and their names, as [`assemble`] takes them.
pub type Opened = Vec<(Arc<dyn Member>, String)>;

/// Open every path; a path that cannot be opened is an error naming it,
/// unless `policy` leaves out unwritable members (returned in [`LeftOut`]).
pub fn open_members(
    paths: &[PathBuf],
    read_only: bool,
    policy: OpenPolicy,
) -> ArrayResult<(Opened, LeftOut)> {
    let options = OpenOptions {
        read_only,
        lock_wait: policy.lock_wait,
        ..OpenOptions::default()
    };
    let mut members = Vec::with_capacity(paths.len());
    let mut left_out = Vec::new();
    for path in paths {
        let name = path.display().to_string();
        match FileMember::open(path, options.clone()) {
            Ok(member) => members.push((Arc::new(member) as Arc<dyn Member>, name)),
            Err(e) if policy.leave_out_unwritable && !read_only && cannot_write(&e) => {
                left_out.push((name, os_reason(&e)));
            }
            Err(source) => return Err(ArrayError::MemberIo { path: name, source }),
        }
    }
    Ok((members, left_out))
}

/// Whether an open failed only because the member may not be written.
fn cannot_write(e: &std::io::Error) -> bool {
    matches!(
        crate::member::file::os_error_code(e),
        Some(libc::EACCES | libc::EPERM | libc::EROFS)
    )
}

/// The system's words for an error ("Operation not permitted").
fn os_reason(e: &std::io::Error) -> String {
    match crate::member::file::os_error_code(e) {
        Some(code) => {
            let text = std::io::Error::from_raw_os_error(code).to_string();
            match text.rfind(" (os error") {
                Some(cut) => text[..cut].to_string(),
                None => text,
            }
        }
        None => e.to_string(),
    }
}

/// Assemble from paths, opening them as `policy` says.
pub fn assemble_paths(
    paths: &[PathBuf],
    opts: AssembleOptions,
    policy: OpenPolicy,
) -> ArrayResult<Array> {
    let (members, left_out) = open_members(paths, opts.read_only, policy)?;
    let named = || {
        left_out
            .iter()
            .map(|(name, why)| format!("{name} ({why})"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    if members.is_empty() && !left_out.is_empty() {
        return Err(ArrayError::Refused(format!(
            "no member can be opened read-write: {}; mount read-only (-o ro) to read the array",
            named()
        )));
    }
    match assemble(members, opts) {
        Ok(array) => {
            for (name, why) in &left_out {
                crate::notice::tell(&format!(
                    "{name} cannot be opened read-write ({why}); left out, the array starts degraded"
                ));
            }
            Ok(array)
        }
        Err(e) if !left_out.is_empty() => Err(ArrayError::Refused(format!(
            "{e}; left out because they cannot be opened read-write: {}",
            named()
        ))),
        Err(e) => Err(e),
    }
}

/// Assemble an array from opened members.
pub fn assemble(
    members: Vec<(Arc<dyn Member>, String)>,
    opts: AssembleOptions,
) -> ArrayResult<Array> {
    if members.is_empty() {
        return Err(ArrayError::Refused("no members given".into()));
    }
    let mut found = Vec::with_capacity(members.len());
    for (member, name) in members {
        let (sb, _verdict) = Superblock::read_from(member.as_ref())?;
        found.push((member, name, sb));
    }

    let mut by_array: BTreeMap<Uuid, Vec<&str>> = BTreeMap::new();
    for (_, name, sb) in &found {
        by_array.entry(sb.array_uuid).or_default().push(name);
    }
    if by_array.len() > 1 {
        let parts: Vec<String> = by_array
            .iter()
            .map(|(uuid, names)| format!("{} belong to {uuid}", names.join(", ")))
            .collect();
        return Err(ArrayError::MixedArrays(parts.join("; ")));
    }

    let (spares, found): (Vec<_>, Vec<_>) = found
        .into_iter()
        .partition(|(_, _, sb)| sb.slot == SPARE_SLOT);
    for (_, name, _) in &spares {
        log::info!("{name} is a spare; not used at assembly");
    }
    let newest = found
        .iter()
        .map(|(_, _, sb)| sb.events)
        .max()
        .ok_or_else(|| {
            ArrayError::Refused("only spares were given; no active member to assemble from".into())
        })?;
    // Like mdadm's event margin: a member one event behind whose slot the
    // newest superblock still records as active missed only the last
    // superblock update (a crash or kill while the superblocks were being
    // written one member after another), not any data, and is taken in.
    // Members that failed are recorded as faulty by the others, so the
    // margin never brings one back.
    let mut reference = found
        .iter()
        .find(|(_, _, sb)| sb.events == newest)
        .map(|(_, _, sb)| sb.clone())
        .ok_or_else(|| ArrayError::Refused("no member holds the newest superblock".into()))?;
    let one_behind = |sb: &Superblock| {
        sb.events + 1 == newest && reference.slots.get(sb.slot as usize) == Some(&SlotState::Active)
    };
    let (current, stale): (Vec<_>, Vec<_>) = found
        .into_iter()
        .partition(|(_, _, sb)| sb.events == newest || one_behind(sb));
    let lagging: Vec<&str> = current
        .iter()
        .filter(|(_, _, sb)| sb.events != newest)
        .map(|(_, name, _)| name.as_str())
        .collect();
    if !lagging.is_empty() {
        log::warn!(
            "{} one event behind (an interrupted superblock update); taken in",
            lagging.join(", ")
        );
    }
    let lagged = !lagging.is_empty();
    for (_, name, sb) in &stale {
        log::warn!(
            "{name} is stale (events {} < {newest}) and is left out; add it back to rebuild it",
            sb.events
        );
        eprintln!(
            "raidfs: {name} is stale (events {} < {newest}) and is left out",
            sb.events
        );
    }

    let total = reference.members as usize;
    let mut slots: Vec<Option<Slot>> = (0..total).map(|_| None).collect();
    for (member, name, sb) in current {
        let slot = sb.slot as usize;
        if slot >= total {
            return Err(ArrayError::Refused(format!(
                "{name}: slot {slot} is outside the array's {total} slots"
            )));
        }
        if reference.slots[slot] == SlotState::Faulty {
            log::warn!("{name} is recorded as faulty; left out");
            continue;
        }
        if let Some(other) = &slots[slot] {
            return Err(ArrayError::Refused(format!(
                "{name} and {} both claim slot {slot}",
                other.name()
            )));
        }
        let s = Slot::new(Some(member), name, sb.member_uuid);
        if reference.slots[slot] == SlotState::Rebuilding {
            // Resume from the checkpointed position; only what lies below it is valid.
            s.valid_below
                .store(sb.recovery_offset, std::sync::atomic::Ordering::Release);
        }
        slots[slot] = Some(s);
    }

    // A lagging member's superblock is brought up to date below.
    let mut changed = lagged;
    let slots: Vec<Slot> = slots
        .into_iter()
        .enumerate()
        .map(|(i, s)| {
            s.unwrap_or_else(|| {
                if reference.slots[i] == SlotState::Active {
                    reference.slots[i] = SlotState::Missing;
                    changed = true;
                }
                Slot::new(None, format!("missing (slot {i})"), Uuid::nil())
            })
        })
        .collect();

    let geometry = data_geometry(&reference)?;
    let present = slots.iter().filter(|s| s.member().is_some()).count();
    let need = total - geometry.tolerance().min(total);
    let degraded = present < total;
    let ppl = reference.features & super::FEATURE_PPL != 0 && reference.level == Level::Raid5;
    // With a partial parity log the write hole is closed at assembly below.
    if degraded
        && reference.state == ArrayState::Dirty
        && matches!(reference.level, Level::Raid5 | Level::Raid6)
        && !opts.force
        && !ppl
    {
        return Err(ArrayError::DirtyDegraded);
    }
    for s in slots.iter().filter(|s| s.member().is_none()) {
        log::warn!("array {} is degraded: {}", reference.array_uuid, s.name());
    }
    if changed && !opts.read_only {
        reference.events += 1;
    }
    let parity = opts.parity.unwrap_or_else(Parity::global);
    let mut array = Array::from_parts(slots, reference, parity)?;
    array.read_only = opts.read_only;
    array.set_read_policy(opts.read_policy);
    if let Some(rotational) = opts.rotational {
        (0..array.member_count()).for_each(|slot| array.set_rotational(slot, rotational));
    }
    if array.broken.load(std::sync::atomic::Ordering::Acquire) {
        return Err(ArrayError::TooFewMembers {
            have: present,
            total,
            need,
            level: geometry.level.to_string(),
        });
    }
    if changed && !opts.read_only {
        array.write_superblocks()?;
    }
    let members: Vec<Arc<dyn Member>> = array
        .present_members()
        .into_iter()
        .map(|(_, m)| m)
        .collect();
    array.bitmap.load(&members);
    let repair = array.is_dirty() && degraded && !opts.read_only;
    let repaired = array.ppl_recover(repair)?;
    if repair && array.ppl.is_some() {
        log::warn!("partial parity log: parity of {repaired} interrupted stripes recomputed before running degraded");
    }
    if array.is_dirty() {
        let (regions, bytes) = array.bitmap.dirty();
        if degraded {
            log::warn!("array was not shut down cleanly and is degraded: {regions} regions may have inconsistent redundancy");
        } else {
            log::info!("array was not shut down cleanly: {regions} dirty regions ({} MiB) will be resynced", bytes >> 20);
            array
                .needs_resync
                .store(true, std::sync::atomic::Ordering::Release);
        }
    }
    Ok(array)
}
