//! Assembly, by md's rules: one array UUID, the highest event count wins and
//! older members are stale, a dirty and degraded parity array needs force,
//! and too few members is a clear error.

use super::personality::Personality;
use super::{data_geometry, Array, ArrayError, ArrayResult, ReadPolicy, Slot};
use crate::member::file::OpenOptions;
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
    /// Forced assembly: start an array whose members disagree about who
    /// failed from the freshest set that can serve, and a dirty degraded
    /// parity array.
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
    /// What writes do while the host fails every member (`on_host_error=`).
    pub on_host_error: super::OnHostError,
}

/// Open a member path (image file or block device) or NBD URI, creating a
/// sparse image of `create_size` bytes when given (never for a URI).
pub fn open_member(path: &Path, create_size: Option<u64>) -> ArrayResult<Arc<dyn Member>> {
    let options = OpenOptions {
        create_size,
        ..OpenOptions::default()
    };
    crate::member::open::open(path, &options).map_err(|source| ArrayError::MemberIo {
        path: path.display().to_string(),
        source,
    })
}

/// How [`assemble_paths`] opens its members (read-only when the assembly is).
#[derive(Clone, Copy, Debug, Default)]
pub struct OpenPolicy {
    /// Wait this long for another process (a daemon still closing the array
    /// after an unmount) to release a member's lock.
    pub lock_wait: Duration,
    /// In a read-write assembly, leave out a member that cannot be opened
    /// read-write (EACCES, EPERM, EROFS), or an NBD member whose server
    /// cannot be reached, telling the user why, instead of failing: the
    /// array then starts degraded without it.
    pub leave_out_unwritable: bool,
}

/// Members left out because they cannot be opened read-write: name and why.
pub type LeftOut = Vec<(String, String)>;

/// What assembly made and decided, for its caller to tell the user.
pub struct Assembly {
    pub array: Array,
    /// What a person starting the array should read: a degraded start,
    /// stale members re-added or rebuilt, forced members, spares kept.
    /// Empty for an ordinary start.
    pub notes: Vec<String>,
    /// Members left out because they cannot be opened read-write
    /// ([`assemble_paths`] only; the array starts degraded without them).
    pub left_out: LeftOut,
}

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
    crate::member::open::refuse_repeated(paths).map_err(ArrayError::Refused)?;
    let mut members = Vec::with_capacity(paths.len());
    let mut left_out = Vec::new();
    for path in paths {
        let name = path.display().to_string();
        match crate::member::open::open(path, &options) {
            Ok(member) => members.push((member, name)),
            Err(e) if policy.leave_out_unwritable && !read_only && cannot_write(&e) => {
                left_out.push((name, os_reason(&e)));
            }
            // A host that is down is a member lost: the array starts
            // degraded without it, as with an unwritable one.
            Err(e)
                if policy.leave_out_unwritable
                    && !read_only
                    && crate::member::open::is_uri(path) =>
            {
                // The error names the URI; the notice does already.
                let text = e.to_string();
                let why = text.strip_prefix(&format!("{name}: ")).unwrap_or(&text);
                left_out.push((name.clone(), why.to_string()));
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

/// Assemble from paths, opening them as `policy` says. The assembly names
/// the members left out because they cannot be opened read-write (the
/// caller tells the user, with the notes).
pub fn assemble_paths(
    paths: &[PathBuf],
    opts: AssembleOptions,
    policy: OpenPolicy,
) -> ArrayResult<Assembly> {
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
        Ok(assembly) => Ok(Assembly {
            left_out,
            ..assembly
        }),
        Err(e) if !left_out.is_empty() => Err(ArrayError::Refused(format!(
            "{e}; left out because they cannot be opened read-write: {}",
            named()
        ))),
        Err(e) => Err(e),
    }
}

/// A member found at assembly, with the superblock it carries.
struct Found {
    member: Arc<dyn Member>,
    name: String,
    sb: Superblock,
}

/// Assemble an array from opened members.
///
/// Members are sorted by md's rules: the newest superblock (highest event
/// count) is the reference; members at its events, or one behind with a
/// slot it still records as active, are current; older ones are stale.
/// Stale members whose slot is empty come back after the mount starts
/// (re-added from the bitmap when it covers their absence, rebuilt in full
/// otherwise), spares stay spares, and with `force` an array whose members
/// disagree about who failed is started from the freshest set that can
/// serve. What assembly decided is in the [`Assembly`]'s notes.
pub fn assemble(
    members: Vec<(Arc<dyn Member>, String)>,
    opts: AssembleOptions,
) -> ArrayResult<Assembly> {
    if members.is_empty() {
        return Err(ArrayError::Refused("no members given".into()));
    }
    let mut found = Vec::with_capacity(members.len());
    // A member with a damaged, missing or stale superblock copy gets all of
    // them written again below (when writable).
    let mut heal = false;
    for (member, name) in members {
        let (sb, verdict) = Superblock::read_from(member.as_ref())?;
        if verdict.needs_rewrite() {
            log::warn!(
                "{name}: superblock copies not good: {}; rewritten unless read-only",
                verdict.damaged()
            );
            heal = true;
        }
        found.push(Found { member, name, sb });
    }

    let mut by_array: BTreeMap<Uuid, Vec<&str>> = BTreeMap::new();
    for f in &found {
        by_array.entry(f.sb.array_uuid).or_default().push(&f.name);
    }
    if by_array.len() > 1 {
        let parts: Vec<String> = by_array
            .iter()
            .map(|(uuid, names)| format!("{} belong to {uuid}", names.join(", ")))
            .collect();
        return Err(ArrayError::MixedArrays(parts.join("; ")));
    }

    let mut notes: Vec<String> = Vec::new();
    let (spares, found): (Vec<Found>, Vec<Found>) =
        found.into_iter().partition(|f| f.sb.slot == SPARE_SLOT);
    let newest = found.iter().map(|f| f.sb.events).max().ok_or_else(|| {
        ArrayError::Refused("only spares were given; no active member to assemble from".into())
    })?;
    let mut reference = found
        .iter()
        .find(|f| f.sb.events == newest)
        .map(|f| f.sb.clone())
        .ok_or_else(|| ArrayError::Refused("no member holds the newest superblock".into()))?;
    // Unknown incompat bits were refused when the superblocks were read;
    // unknown ro-compat ones let a read-only assembly in, and nothing else.
    if !opts.read_only {
        crate::superblock::SUPERBLOCK_FEATURES
            .refuse_write(&reference.features)
            .map_err(ArrayError::Refused)?;
    }
    let total = reference.members as usize;
    if let Some(f) = found.iter().find(|f| f.sb.slot as usize >= total) {
        return Err(ArrayError::Refused(format!(
            "{}: slot {} is outside the array's {total} slots",
            f.name, f.sb.slot
        )));
    }
    // Like mdadm's event margin: a member one event behind whose slot the
    // newest superblock still records as active missed only the last
    // superblock update (a crash or kill while the superblocks were being
    // written one member after another), not any data, and is taken in.
    // Members that failed are recorded as faulty by the others, so the
    // margin never brings one back.
    let one_behind = |sb: &Superblock| {
        sb.events + 1 == newest && reference.slots.get(sb.slot as usize) == Some(&SlotState::Active)
    };
    let (mut current, mut stale): (Vec<Found>, Vec<Found>) = found
        .into_iter()
        .partition(|f| f.sb.events == newest || one_behind(&f.sb));
    let mut changed = heal;
    for f in current.iter().filter(|f| f.sb.events != newest) {
        log::warn!(
            "{} one event behind (an interrupted superblock update); taken in",
            f.name
        );
        changed = true;
    }
    // A current member the reference records as faulty is left out.
    let (faulty, kept): (Vec<Found>, Vec<Found>) = current
        .into_iter()
        .partition(|f| reference.slots[f.sb.slot as usize] == SlotState::Faulty);
    current = kept;
    stale.extend(faulty);
    stale.sort_by_key(|f| std::cmp::Reverse(f.sb.events));

    let geometry = data_geometry(&reference)?;
    // Every shape in force, the old one too while a reshape is under way.
    let shapes = super::shape::Shapes::of(&reference)?;
    let serves = |slots: &[usize]| {
        let missing: Vec<usize> = (0..total).filter(|s| !slots.contains(s)).collect();
        shapes.survive(&missing)
    };
    let slots_of = |set: &[Found]| set.iter().map(|f| f.sb.slot as usize).collect::<Vec<_>>();
    if !serves(&slots_of(&current)) && opts.force {
        // The members disagree about who failed (each recorded the others
        // faulty as they went): start from the freshest set that can serve.
        // Stale members whose absence the bitmap covers are taken in too,
        // so the resync that follows (checksums judging each copy) sees
        // every copy; older ones are rebuilt after the mount starts.
        let cleared = bitmap_events_cleared(&reference, current.iter().chain(stale.iter()));
        let mut taken: Vec<usize> = Vec::new();
        for (i, f) in stale.iter().enumerate() {
            let slot = f.sb.slot as usize;
            if slots_of(&current).contains(&slot)
                || taken.iter().any(|&t| stale[t].sb.slot == f.sb.slot)
            {
                continue;
            }
            let mut with: Vec<usize> = slots_of(&current);
            with.extend(taken.iter().map(|&t| stale[t].sb.slot as usize));
            if f.sb.events >= cleared || !serves(&with) {
                taken.push(i);
            }
        }
        let mut with: Vec<usize> = slots_of(&current);
        with.extend(taken.iter().map(|&t| stale[t].sb.slot as usize));
        if !serves(&with) {
            return Err(refusal(&reference, &current, &stale, true));
        }
        taken.sort_unstable_by(|a, b| b.cmp(a));
        for i in taken {
            let f = stale.remove(i);
            notes.push(format!(
                "forced: {} (slot {}, events {} of {newest}) taken in as active{}",
                f.name,
                f.sb.slot,
                f.sb.events,
                if f.sb.events >= cleared {
                    "; the bitmap covers what it missed"
                } else {
                    "; older than the bitmap: regions it missed may hold stale data"
                }
            ));
            reference.slots[f.sb.slot as usize] = SlotState::Active;
            current.push(f);
        }
        reference.state = ArrayState::Dirty;
        changed = true;
    }
    if !serves(&slots_of(&current)) {
        return Err(refusal(&reference, &current, &stale, false));
    }

    let mut slots: Vec<Option<Slot>> = (0..total).map(|_| None).collect();
    for f in current {
        let slot = f.sb.slot as usize;
        if let Some(other) = &slots[slot] {
            return Err(ArrayError::Refused(format!(
                "{} and {} both claim slot {slot}",
                f.name,
                other.name()
            )));
        }
        // A rebuilding slot resumes from its checkpointed position; only
        // what lies below it is valid.
        let valid_below = if reference.slots[slot] == SlotState::Rebuilding {
            f.sb.recovery_offset
        } else {
            u64::MAX
        };
        slots[slot] = Some(Slot::new(
            Some(f.member),
            f.name,
            f.sb.member_uuid,
            valid_below,
        ));
    }
    // Stale members whose slot nobody holds come back after the start; a
    // stale member whose slot another member holds was replaced.
    let mut returning = Vec::new();
    for f in stale {
        let slot = f.sb.slot as usize;
        if slots[slot].is_some() || returning.iter().any(|r: &Found| r.sb.slot == f.sb.slot) {
            notes.push(format!(
                "{} is stale (events {} < {newest}) and slot {slot} belongs to another member: left out",
                f.name, f.sb.events
            ));
            continue;
        }
        returning.push(f);
    }

    let slots: Vec<Slot> = slots
        .into_iter()
        .enumerate()
        .map(|(i, s)| {
            s.unwrap_or_else(|| {
                if reference.slots[i] == SlotState::Active {
                    reference.slots[i] = SlotState::Missing;
                    changed = true;
                }
                Slot::new(None, format!("missing (slot {i})"), Uuid::nil(), u64::MAX)
            })
        })
        .collect();

    let present = slots.iter().filter(|s| s.member().is_some()).count();
    let degraded = present < total;
    let personality = Personality::of(reference.level);
    let ppl = reference.has_ppl() && personality.keeps_partial_parity_log();
    // With a partial parity log the write hole is closed at assembly below.
    if degraded
        && reference.state == ArrayState::Dirty
        && personality.has_write_hole()
        && !opts.force
        && !ppl
    {
        return Err(ArrayError::DirtyDegraded);
    }
    if changed && !opts.read_only {
        reference.events = newest + 1;
    }
    let parity = opts.parity.unwrap_or_else(Parity::global);
    let mut array = Array::from_parts(slots, reference, parity)?;
    array.read_only = opts.read_only;
    array.host.set_policy(opts.on_host_error);
    array.set_read_policy(opts.read_policy);
    if let Some(rotational) = opts.rotational {
        (0..array.member_count()).for_each(|slot| array.set_rotational(slot, rotational));
    }
    if array.broken.load(std::sync::atomic::Ordering::Acquire) {
        return Err(ArrayError::TooFewMembers {
            have: present,
            total,
            need: total - geometry.tolerance().min(total),
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
    for f in returning {
        let covered = f.sb.events >= array.bitmap.events_cleared();
        if opts.read_only {
            notes.push(format!(
                "{} is stale (events {} < {newest}): left out of this read-only assembly",
                f.name, f.sb.events
            ));
            continue;
        }
        notes.push(format!(
            "{} (slot {}) is stale (events {} < {newest}): {}",
            f.name,
            f.sb.slot,
            f.sb.events,
            if covered {
                "re-added; only the regions the bitmap marks are resynced onto it"
            } else {
                "the bitmap does not cover its absence; it is rebuilt in full"
            }
        ));
        array.queue_returning(f.member, f.name);
    }
    for f in spares {
        if opts.read_only {
            continue;
        }
        notes.push(format!("{} is a hot spare", f.name));
        array.adopt_spare(f.member, f.name, f.sb.member_uuid);
    }
    for s in array.slots.iter().filter(|s| s.member().is_none()) {
        log::warn!("array {} is degraded: {}", array.uuid(), s.name());
    }
    let repair = array.is_dirty() && degraded && !opts.read_only;
    let repaired = array.ppl_recover(repair)?;
    if repair && array.ppl.is_some() {
        log::warn!("partial parity log: parity of {repaired} interrupted stripes recomputed before running degraded");
    }
    if array.is_dirty() {
        let (regions, bytes) = array.bitmap.dirty();
        if degraded && !array.has_returning() {
            log::warn!("array was not shut down cleanly and is degraded: {regions} regions may have inconsistent redundancy; they are resynced once the array is whole again");
        } else {
            log::info!("array was not shut down cleanly: {regions} dirty regions ({} MiB) will be resynced", bytes >> 20);
        }
        // Also when degraded: the copies that survived may disagree where
        // the crash tore a write, and a rebuild restores only the missing
        // member, so the resync follows it (md keeps its resync point too).
        array
            .needs_resync
            .store(true, std::sync::atomic::Ordering::Release);
    }
    if degraded {
        let missing: Vec<String> = array
            .slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.member().is_none())
            .map(|(i, _)| format!("slot {i}"))
            .collect();
        notes.insert(
            0,
            format!(
                "started degraded with {present} of {total} members ({} missing)",
                missing.join(", ")
            ),
        );
    }
    Ok(Assembly {
        array,
        notes,
        left_out: LeftOut::new(),
    })
}

/// The events of the last bitmap clearing, as the members' bitmaps record it.
fn bitmap_events_cleared<'a>(
    reference: &Superblock,
    found: impl Iterator<Item = &'a Found>,
) -> u64 {
    let bitmap = super::bitmap::Bitmap::new(reference.data_offset, reference.data_size);
    let members: Vec<Arc<dyn Member>> = found.map(|f| Arc::clone(&f.member)).collect();
    bitmap.load(&members);
    bitmap.events_cleared()
}

/// Why the array cannot start, member by member.
fn refusal(reference: &Superblock, current: &[Found], stale: &[Found], forced: bool) -> ArrayError {
    let mut lines: Vec<String> = current
        .iter()
        .chain(stale.iter())
        .map(|f| format!("{} slot {} events {}", f.name, f.sb.slot, f.sb.events))
        .collect();
    lines.sort();
    let geometry = data_geometry(reference);
    let need = geometry
        .map(|g| reference.members as usize - g.tolerance().min(reference.members as usize))
        .unwrap_or(reference.members as usize);
    ArrayError::Refused(format!(
        "too few members to start the {} array {}: {} of {} slots up to date, at least {need} needed ({}){}",
        reference.level,
        reference.array_uuid,
        current.len(),
        reference.members,
        lines.join("; "),
        if forced {
            "; no set of the members given can serve, even forced"
        } else if current.len() + stale.len() >= need {
            "; the members disagree about who failed: mount with -o force (fsck --force) to start from the freshest set that can serve"
        } else {
            ""
        }
    ))
}
