//! Carrying out control requests on the array: member changes, background
//! work and limits, and a sync of its filesystem, with the refusals a user
//! should see before the engine is asked (read-only mount, a failure the
//! array would not survive, an image that belongs to another array).

use super::protocol::Request;
use crate::array::{percent, AddOutcome, Array, MemberState, SizeTarget, SyncAction};
use crate::fs::FileSystem;
use crate::geometry::{Geometry, Level};
use crate::member::file::{FileMember, OpenOptions};
use crate::member::Member;
use crate::superblock::Superblock;
use std::path::Path;
use std::sync::Arc;

/// What a request did, for the response's message.
pub(crate) struct Done {
    pub message: Option<String>,
    /// Set by a replace: (slot, new member's name), shown while it runs.
    pub replacing: Option<(usize, String)>,
}

impl Done {
    fn says(message: String) -> Result<Done, String> {
        Ok(Done {
            message: Some(message),
            replacing: None,
        })
    }
}

/// Carry out `request` on `array` and its filesystem `fs` (`mount_read_only`:
/// mounted read-only).
pub(crate) fn execute(
    array: &Array,
    fs: &FileSystem,
    mount_read_only: bool,
    request: &Request,
) -> Result<Done, String> {
    match request {
        Request::Status => Ok(Done {
            message: None,
            replacing: None,
        }),
        Request::Fail { member } => fail(array, member),
        Request::Remove { member } => {
            let shown = member_name(array, member);
            array.remove(member).map_err(|e| e.to_string())?;
            Done::says(format!("removed {shown}"))
        }
        Request::Add { path, size, force } => add(array, path, *size, *force),
        Request::Replace {
            old,
            new,
            size,
            force,
        } => replace(array, old, new, *size, *force),
        Request::Check { repair, restart } => {
            let started = array
                .start_scrub(*repair, *restart)
                .map_err(|e| e.to_string())?;
            let action = started.action;
            let mut said = match started.resumed_at {
                Some(at) => format!(
                    "{action} resumed at {at:.1}% from its checkpoint (`raidfs {action} --restart` starts over)"
                ),
                None => format!("{action} started"),
            };
            // A repair also reads the damaged-data log's blocks again:
            // those that read back correctly (a copy came back) leave it.
            if *repair && !fs.damaged_ranges().is_empty() {
                let left = fs.recheck_damaged();
                said.push_str(&format!("; {left} damaged file range(s) still unreadable"));
            }
            Done::says(said)
        }
        Request::Grow {
            member_size: Some(target),
            ..
        } => grow_size(array, *target),
        Request::Grow {
            level,
            add,
            size,
            force,
            member_size: None,
        } => grow(array, *level, add, *size, *force),
        Request::Stop => {
            let running = array
                .sync_progress()
                .ok_or_else(|| "no background work is running".to_string())?;
            array.stop_sync();
            let resumes = match running.action {
                SyncAction::Recovery => {
                    "; it resumes from its checkpoint when the array is next mounted".to_string()
                }
                SyncAction::Reshape => {
                    "; `raidfs grow MOUNT` goes on with it, and so does the next mount".into()
                }
                SyncAction::Replace => "; the old member stays in its slot".into(),
                SyncAction::Resync => "; it resumes when the array is next mounted".into(),
                SyncAction::Check | SyncAction::Repair => match array.paused_scrub() {
                    Some(p) => format!(
                        " at {:.1}%; `raidfs {}` resumes it from there, `--restart` starts over",
                        percent(p.done, p.total),
                        p.action
                    ),
                    None => String::new(),
                },
            };
            Done::says(format!("{} stopped{resumes}", running.action))
        }
        Request::SpeedLimit { min, max } => {
            array.set_speed_limits(*min, *max);
            let (min, max) = array.speed_limits();
            Done::says(format!("speed limits: min {}, max {}", kib(min), kib(max)))
        }
        Request::Sync => sync(fs, mount_read_only),
        Request::Remount { read_only } => remount(fs, *read_only),
    }
}

/// `raidfs grow`: start a level change and/or a restripe onto added
/// members, or go on with one that stopped.
fn grow(
    array: &Array,
    level: Option<Level>,
    add: &[String],
    size: Option<u64>,
    force: bool,
) -> Result<Done, String> {
    if level.is_none() && add.is_empty() {
        // `grow --wait` attaches to a reshape that runs already.
        if array
            .sync_progress()
            .is_some_and(|p| p.action == SyncAction::Reshape)
        {
            return Done::says("the reshape is running".into());
        }
        array.resume_reshape().map_err(|e| e.to_string())?;
        return Done::says("reshape resumed".into());
    }
    let now = array.data_geometry();
    let level = level.unwrap_or(now.level);
    let members = now.members + add.len();
    // RAID10 keeps its copies (two when it is new); the geometry sets the
    // copies every other level implies.
    let copies = now.copies.max(2).min(members);
    let to = Geometry::new(level, members, now.chunk, copies, now.layout)
        .map_err(|e| format!("cannot reshape to {level} on {members} members: {e}"))?;
    let mut added = Vec::with_capacity(add.len());
    for path in add {
        added.push((open_new_member(array, path, size, force)?, path.clone()));
    }
    array
        .start_reshape_adding(to, added)
        .map_err(|e| e.to_string())?;
    if array
        .sync_progress()
        .is_some_and(|p| p.action == SyncAction::Recovery)
    {
        // Mirrors that only gain copies rebuild the new members instead.
        return Done::says(format!(
            "{} grows to {members} copies: recovery of the new members started",
            now.level
        ));
    }
    Done::says(format!(
        "reshape from {} on {} members to {level} on {members} started",
        now.level, now.members
    ))
}

/// `raidfs grow --size`: members made larger give their space to the array.
fn grow_size(array: &Array, target: SizeTarget) -> Result<Done, String> {
    let r = array.grow_size(target).map_err(|e| e.to_string())?;
    if !r.changed() {
        return Done::says(format!(
            "the data area is unchanged at {} MiB per member ({} groups): {} has no room for another group",
            r.from >> 20,
            r.groups_from,
            r.smallest
        ));
    }
    Done::says(format!(
        "the data area grew from {} MiB to {} MiB per member ({} groups to {}); the new space is free at once",
        r.from >> 20,
        r.to >> 20,
        r.groups_from,
        r.groups_to
    ))
}

/// `raidfs sync`: commit the journal and flush every member, returning once
/// both are done, so what was written before is on the members' media.
fn sync(fs: &FileSystem, mount_read_only: bool) -> Result<Done, String> {
    if !mount_read_only && fs.is_read_only() {
        // A commit that failed for good made the filesystem refuse changes;
        // what was written since the commit before it is not on the members.
        return Err(
            "the filesystem stopped accepting changes after a journal commit failed \
             (see the daemon's log); writes since the last good commit are not durable"
                .into(),
        );
    }
    let started = std::time::Instant::now();
    fs.sync_all()
        .map_err(|e| format!("commit and flush failed: {e}"))?;
    Done::says(format!(
        "journal committed and every member flushed ({} ms)",
        started.elapsed().as_millis()
    ))
}

/// The daemon's half of `mount -o remount,ro|rw` (the helper switches the
/// kernel's superblock flag). Going read-only commits the journal and
/// flushes the members, so what was written before is durable; the array
/// stays assembled (a rebuild or resync carries on, as md's does under a
/// read-only ext4) and is marked clean at unmount.
fn remount(fs: &FileSystem, read_only: bool) -> Result<Done, String> {
    fs.set_read_only(read_only).map_err(|e| {
        if read_only {
            format!("committing before going read-only: {e}")
        } else {
            format!("going read-write: {e}")
        }
    })?;
    Done::says(if read_only {
        "read-only: the journal is committed and the members flushed".into()
    } else {
        "read-write".into()
    })
}

fn kib(bytes_per_sec: u64) -> String {
    if bytes_per_sec == 0 {
        "none".into()
    } else {
        format!("{}K/sec", bytes_per_sec / 1024)
    }
}

fn member_name(array: &Array, who: &str) -> String {
    match array.slot_of(who) {
        Some(slot) => array
            .status()
            .members
            .get(slot)
            .map(|m| m.name.clone())
            .unwrap_or_else(|| who.to_string()),
        None => who.to_string(),
    }
}

fn find_slot(array: &Array, who: &str) -> Result<usize, String> {
    array.slot_of(who).ok_or_else(|| {
        let names: Vec<String> = array
            .status()
            .members
            .into_iter()
            .map(|m| format!("{} ({})", m.slot, m.name))
            .collect();
        format!(
            "{who} is not a member of this array (members: {})",
            names.join(", ")
        )
    })
}

/// md refuses to fail a member when the array could not go on without it;
/// so does this (otherwise one typo stops every write), by the engine's own
/// rule: RAID10 may lose members of different mirror sets.
fn fail(array: &Array, who: &str) -> Result<Done, String> {
    let slot = find_slot(array, who)?;
    let status = array.status();
    let member = &status.members[slot];
    if member.state.is_out() {
        return Done::says(format!(
            "{} (slot {slot}) is already {}",
            member.name, member.state
        ));
    }
    if !array.survives_losing(slot) {
        let unavailable = status
            .members
            .iter()
            .filter(|m| m.state != MemberState::Active)
            .count();
        let after = unavailable + usize::from(member.state == MemberState::Active);
        // The worst case the level survives, as the refusal explains it.
        let tolerance = array
            .data_geometry()
            .tolerance()
            .min(array.metadata_geometry().tolerance());
        if after > tolerance {
            return Err(format!(
                "refusing to fail {} (slot {slot}): {} would then miss {after} member(s) and it survives at most {tolerance}",
                member.name, status.level
            ));
        }
        return Err(format!(
            "refusing to fail {} (slot {slot}): {} would then miss {after} member(s), and some of its data would have no copy left",
            member.name, status.level
        ));
    }
    array.fail(slot).map_err(|e| e.to_string())?;
    Done::says(format!("set {} (slot {slot}) faulty", member.name))
}

/// Open an image to add: an existing file or device, an NBD export (a
/// URI), or a new sparse image (`size`, or just what the array needs per
/// member).
fn open_new_member(
    array: &Array,
    path: &str,
    size: Option<u64>,
    force: bool,
) -> Result<Arc<dyn Member>, String> {
    let p = Path::new(path);
    let uri = crate::member::open::is_uri(p);
    if !uri && !p.is_absolute() {
        return Err(format!("{path}: the daemon needs an absolute path"));
    }
    if let Some(slot) = array.slot_of(path) {
        let status = array.status();
        if let Some(m) = status.members.get(slot) {
            return Err(format!(
                "{path} is still slot {slot} of this array ({}); remove it first (raidfs remove)",
                m.state
            ));
        }
    }
    let sb = array.superblock();
    let need = sb.min_member_len();
    let member = if uri || p.exists() {
        crate::member::open::open(p, &OpenOptions::default()).map_err(|e| e.to_string())?
    } else {
        let size = size.unwrap_or(need);
        if size < need {
            return Err(format!(
                "--size {size} is too small: the array needs {need} bytes per member"
            ));
        }
        Arc::new(FileMember::create(p, size).map_err(|e| e.to_string())?)
    };
    if let Ok((found, _)) = Superblock::read_from(member.as_ref()) {
        if found.array_uuid != sb.array_uuid && !force {
            return Err(format!(
                "{path} holds a member of another array ({}); use --force to overwrite it",
                found.array_uuid
            ));
        }
    }
    Ok(member)
}

fn add(array: &Array, path: &str, size: Option<u64>, force: bool) -> Result<Done, String> {
    let member = open_new_member(array, path, size, force)?;
    match array
        .add(member, path.to_string())
        .map_err(|e| e.to_string())?
    {
        AddOutcome::Rebuilding { slot } => {
            Done::says(format!("added {path}; recovery of slot {slot} started"))
        }
        AddOutcome::ReAdded { slot } => Done::says(format!(
            "re-added {path} to slot {slot}; recovery of the regions written since it left started"
        )),
        AddOutcome::Spare => Done::says(format!("added {path} as a hot spare")),
    }
}

fn replace(
    array: &Array,
    old: &str,
    new: &str,
    size: Option<u64>,
    force: bool,
) -> Result<Done, String> {
    let slot = find_slot(array, old)?;
    let old_name = member_name(array, old);
    let member = open_new_member(array, new, size, force)?;
    array
        .replace(slot, member, new.to_string())
        .map_err(|e| e.to_string())?;
    Ok(Done {
        message: Some(format!("replacing {old_name} (slot {slot}) with {new}")),
        replacing: Some((slot, new.to_string())),
    })
}
