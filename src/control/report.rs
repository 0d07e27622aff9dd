//! The array report a mount daemon returns: everything `raidfs status` and
//! `raidfs detail` show, as a stable, versioned JSON document (see
//! docs/status-json.md). Built from the engine's snapshots, but owned here
//! so engine changes do not change the documented format.

use crate::array::{Array, MemberIo, MemberState, SyncProgress};
use crate::fs::FileSystem;
use serde::{Deserialize, Serialize};
use std::path::Path;

/// Bumped only when a field changes meaning or disappears; new fields may
/// be added within a version.
pub const REPORT_VERSION: u32 = 1;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ArrayReport {
    pub version: u32,
    pub mount_point: String,
    pub daemon_pid: u32,
    pub owner_uid: u32,
    pub read_only: bool,
    pub uuid: String,
    pub name: String,
    /// md's name: raid0, raid1, raid5, raid6, raid10.
    pub level: String,
    pub layout: String,
    /// Chunk size in bytes.
    pub chunk: u64,
    /// Member slots (md's "Raid Devices").
    pub raid_devices: usize,
    /// Slots serving every read ("active").
    pub active_devices: usize,
    /// Slots that are faulty or missing.
    pub failed_devices: usize,
    /// "clean" or "active", then ", degraded", then the background work
    /// (", recovering", ", replacing", ", resyncing", ", checking", ", repairing").
    pub state: String,
    pub degraded: bool,
    pub events: u64,
    /// Creation and last superblock update, seconds since the epoch.
    pub created: u64,
    pub updated: u64,
    /// Logical bytes if every group held data.
    pub array_size: u64,
    /// Bytes of each member the array uses, and where they start.
    pub member_size: u64,
    pub data_offset: u64,
    pub groups_allocated: usize,
    pub groups_total: usize,
    /// `[UU_U]`: one character per slot, `U` when active.
    pub map: String,
    pub members: Vec<MemberReport>,
    pub spares: Vec<String>,
    /// The new member a running `replace` copies onto.
    pub replacing: Option<ReplacementReport>,
    /// The running background work.
    pub sync: Option<SyncReport>,
    /// How the last background work of this mount ended.
    pub last_sync: Option<LastSyncReport>,
    pub speed_limit: SpeedLimitReport,
    /// The read balancer's policy (sticky, round-robin, first, legacy).
    #[serde(default)]
    pub read_policy: String,
    /// Why the array is suspended (the host failed every member at once;
    /// writes are refused or held), or null.
    #[serde(default)]
    pub suspended: Option<String>,
    /// Member writes the host refused for lack of space since the mount.
    #[serde(default)]
    pub host_no_space_errors: u64,
    /// The filesystem's size and free space in bytes, as statfs(2) gives
    /// them (0 when the daemon could not tell).
    #[serde(default)]
    pub fs_size: u64,
    #[serde(default)]
    pub fs_free: u64,
    /// Seconds the members' `io` counters cover (since the mount).
    #[serde(default)]
    pub io_seconds: f64,
    /// File ranges whose data no copy or parity could correct, until the
    /// file is rewritten, truncated or deleted there, or `raidfs repair`
    /// finds them readable (`zpool status -v`'s permanent errors).
    #[serde(default)]
    pub damaged: Vec<DamagedReport>,
    /// File data blocks that failed their checksum on a read and were
    /// served from a good copy, since the mount.
    #[serde(default)]
    pub corrected_errors: u64,
    /// File data blocks no copy could serve (the read failed with EIO).
    #[serde(default)]
    pub unrecoverable_errors: u64,
    /// The last of either, with its file.
    #[serde(default)]
    pub last_data_error: Option<DataErrorReport>,
    /// A check or repair that was paused and resumes from its checkpoint
    /// when next started, or null.
    #[serde(default)]
    pub paused_scrub: Option<PausedScrubReport>,
    /// The reshape under way (`raidfs grow`), running or stopped, or null.
    #[serde(default)]
    pub reshape: Option<ReshapeReport>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReshapeReport {
    /// md's names of the old and the new level.
    pub from_level: String,
    pub to_level: String,
    /// Allocated groups still in the old geometry, of all allocated groups.
    pub groups_pending: usize,
    pub groups_total: usize,
}

/// A file range that read back wrong on every copy.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DamagedReport {
    pub ino: u64,
    /// The file's path from the mount point (the first name found for a
    /// file with several links), or null when it has none any more.
    pub path: Option<String>,
    /// Byte offset in the file and length of the damaged range.
    pub offset: u64,
    pub length: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DataErrorReport {
    pub ino: u64,
    /// A path of the file inside the mount (`/dir/file`), or null when no
    /// directory holds it any more.
    pub path: Option<String>,
    /// Byte offset of the block in the file.
    pub offset: u64,
    pub unrecoverable: bool,
}

/// A paused check or repair (recorded in the superblocks).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PausedScrubReport {
    /// "check" or "repair".
    pub action: String,
    /// Member bytes of allocated groups done before it paused, and in all.
    pub done: u64,
    pub total: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MemberReport {
    pub slot: usize,
    pub name: String,
    pub uuid: String,
    /// `active`, `faulty`, `rebuilding` or `missing` in JSON.
    pub state: MemberState,
    pub read_errors: u64,
    pub write_errors: u64,
    pub checksum_errors: u64,
    /// Every read sent to this member since the mount (any level, file
    /// reads, reconstruction, scrub and rebuild alike), and their bytes.
    #[serde(default)]
    pub reads: u64,
    #[serde(default)]
    pub read_bytes: u64,
    /// Read balancer figures for this member (mirror reads only).
    /// Reads that did not continue where the member's head was.
    #[serde(default)]
    pub seeks: u64,
    #[serde(default)]
    pub pending: u32,
    #[serde(default)]
    pub latency_us: f64,
    #[serde(default)]
    pub rotational: bool,
    #[serde(default)]
    pub write_mostly: bool,
    /// A stall fails it fast (`-o failfast=`).
    #[serde(default)]
    pub failfast: bool,
    /// Where each sequential read stream the balancer keeps on this member
    /// stands (member offsets, lowest first).
    #[serde(default)]
    pub streams: Vec<u64>,
    /// Every data read and write of the slot since the mount: operations,
    /// bytes and nanoseconds spent, per direction.
    #[serde(default)]
    pub io: IoReport,
}

/// A slot's data operations since the mount (see docs/status-json.md).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IoReport {
    pub read_ops: u64,
    pub read_bytes: u64,
    pub read_nanos: u64,
    pub write_ops: u64,
    pub write_bytes: u64,
    pub write_nanos: u64,
}

impl From<&MemberIo> for IoReport {
    fn from(m: &MemberIo) -> IoReport {
        IoReport {
            read_ops: m.read_ops,
            read_bytes: m.read_bytes,
            read_nanos: m.read_nanos,
            write_ops: m.write_ops,
            write_bytes: m.write_bytes,
            write_nanos: m.write_nanos,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReplacementReport {
    pub slot: usize,
    pub name: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SyncReport {
    /// This mount's number of the run; 0 when an older daemon reports.
    #[serde(default)]
    pub run: u64,
    /// "resync", "recovery", "replace", "check", "repair" or "reshape".
    pub action: String,
    pub slot: Option<usize>,
    /// Member bytes done and to do (allocated groups only).
    pub done: u64,
    pub total: u64,
    /// Bytes per second so far.
    pub speed: u64,
    pub eta_secs: u64,
    /// Check/repair: bytes found inconsistent so far.
    pub mismatches: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LastSyncReport {
    /// The run's number, as in [`SyncReport::run`].
    #[serde(default)]
    pub run: u64,
    pub action: String,
    pub completed: bool,
    pub mismatches: u64,
    pub message: String,
    /// Member bytes done and to do when it ended (a resync's total is the
    /// bytes of its dirty regions).
    #[serde(default)]
    pub done: u64,
    #[serde(default)]
    pub total: u64,
}

/// md's speed_limit_min / speed_limit_max in bytes per second; 0 = none.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpeedLimitReport {
    pub min: u64,
    pub max: u64,
}

impl SyncReport {
    fn from_progress(p: &SyncProgress) -> SyncReport {
        SyncReport {
            run: p.run,
            action: p.action.to_string(),
            slot: p.slot,
            done: p.done,
            total: p.total,
            speed: p.speed,
            eta_secs: p.eta_secs,
            mismatches: p.mismatches,
        }
    }

    /// Tenths of a percent done, as md computes it.
    pub fn per_mille(&self) -> u64 {
        if self.total == 0 {
            return 0;
        }
        ((self.done.min(self.total) as u128 * 1000) / self.total as u128) as u64
    }
}

/// Who serves the mount, for the report.
pub(crate) struct Origin<'a> {
    pub mount_point: &'a Path,
    pub owner_uid: u32,
    pub read_only: bool,
    pub replacing: Option<(usize, String)>,
    /// The mounted filesystem, for its free space.
    pub fs: Option<&'a FileSystem>,
}

impl ArrayReport {
    pub(crate) fn collect(array: &Array, origin: &Origin<'_>) -> ArrayReport {
        let status = array.status();
        let data_errors = origin.fs.map(FileSystem::data_errors).unwrap_or_default();
        let sb = array.superblock();
        // Before `last_sync_result` below: the engine records a result
        // before it clears the running entry, so a report without running
        // work always holds that work's result.
        let sync = array.sync_progress().map(|p| SyncReport::from_progress(&p));
        let replacing = match (&sync, &origin.replacing) {
            (Some(s), Some((slot, name))) if s.action == "replace" && s.slot == Some(*slot) => {
                Some(ReplacementReport {
                    slot: *slot,
                    name: name.clone(),
                })
            }
            _ => None,
        };
        let stats = array.member_stats();
        let io = array.member_io();
        let member_reads = array.member_reads();
        let members: Vec<MemberReport> = status
            .members
            .iter()
            .map(|m| {
                let st = stats.iter().find(|s| s.slot == m.slot);
                MemberReport {
                    slot: m.slot,
                    name: m.name.clone(),
                    uuid: m.uuid.clone(),
                    state: m.state,
                    read_errors: m.read_errors,
                    write_errors: m.write_errors,
                    checksum_errors: m.checksum_errors,
                    reads: member_reads.get(m.slot).map_or(0, |r| r.0),
                    read_bytes: member_reads.get(m.slot).map_or(0, |r| r.1),
                    seeks: st.map_or(0, |s| s.seeks),
                    pending: st.map_or(0, |s| s.pending),
                    latency_us: st.map_or(0.0, |s| s.latency_us),
                    rotational: st.is_some_and(|s| s.rotational),
                    write_mostly: st.is_some_and(|s| s.write_mostly),
                    failfast: array.member_failfast(m.slot),
                    streams: st.map_or_else(Vec::new, |s| s.stream_ends.clone()),
                    io: io
                        .iter()
                        .find(|i| i.slot == m.slot)
                        .map(IoReport::from)
                        .unwrap_or_default(),
                }
            })
            .collect();
        let active_devices = members
            .iter()
            .filter(|m| m.state == MemberState::Active)
            .count();
        let failed_devices = members.iter().filter(|m| m.state.is_out()).count();
        let mut state = String::from(if status.state == "clean" {
            "clean"
        } else {
            "active"
        });
        if status.degraded {
            state.push_str(", degraded");
        }
        if array.suspension().is_some() {
            state.push_str(", suspended");
        }
        if let Some(s) = &sync {
            state.push_str(match s.action.as_str() {
                "recovery" => ", recovering",
                "replace" => ", replacing",
                "check" => ", checking",
                "repair" => ", repairing",
                "resync" => ", resyncing",
                "reshape" => ", reshaping",
                _ => ", busy",
            });
        }
        let (min, max) = array.speed_limits();
        let space = origin.fs.and_then(|fs| fs.statfs().ok());
        ArrayReport {
            version: REPORT_VERSION,
            mount_point: origin.mount_point.display().to_string(),
            daemon_pid: std::process::id(),
            owner_uid: origin.owner_uid,
            read_only: origin.read_only,
            uuid: status.uuid,
            name: status.name,
            level: status.level,
            layout: status.layout,
            chunk: status.chunk,
            raid_devices: members.len(),
            active_devices,
            failed_devices,
            state,
            degraded: status.degraded,
            events: status.events,
            created: sb.ctime,
            updated: sb.utime,
            array_size: array.data_capacity(),
            member_size: sb.data_size,
            data_offset: sb.data_offset,
            groups_allocated: status.groups_allocated,
            groups_total: status.groups_total,
            map: status.map,
            members,
            spares: array.spares(),
            replacing,
            sync,
            last_sync: array.last_sync_result().map(|r| LastSyncReport {
                run: r.run,
                action: r.action.to_string(),
                completed: r.completed,
                mismatches: r.mismatches,
                message: r.message,
                done: r.done,
                total: r.total,
            }),
            speed_limit: SpeedLimitReport { min, max },
            read_policy: array.read_policy().to_string(),
            suspended: array.suspension().map(|s| s.why),
            host_no_space_errors: array.host_no_space_errors(),
            fs_size: space.as_ref().map_or(0, |s| s.blocks * u64::from(s.frsize)),
            fs_free: space.map_or(0, |s| s.bavail * u64::from(s.frsize)),
            io_seconds: array.io_elapsed().as_secs_f64(),
            damaged: origin.fs.map_or_else(Vec::new, damaged_of),
            corrected_errors: data_errors.corrected,
            unrecoverable_errors: data_errors.unrecoverable,
            last_data_error: data_errors.last.map(|e| DataErrorReport {
                ino: e.ino,
                path: origin.fs.and_then(|fs| fs.path_of(e.ino)),
                offset: e.offset,
                unrecoverable: e.unrecoverable,
            }),
            paused_scrub: array.paused_scrub().map(|p| PausedScrubReport {
                action: p.action.to_string(),
                done: p.done,
                total: p.total,
            }),
            reshape: array.reshape_status().map(|r| ReshapeReport {
                from_level: r.from.to_string(),
                to_level: r.to.to_string(),
                groups_pending: r.pending,
                groups_total: r.groups,
            }),
        }
    }
}

/// The damaged ranges `fs` records, with the paths of their files.
fn damaged_of(fs: &FileSystem) -> Vec<DamagedReport> {
    fs.damaged_ranges()
        .into_iter()
        .map(|d| DamagedReport {
            ino: d.ino,
            path: fs.path_of(d.ino),
            offset: d.offset,
            length: d.length,
        })
        .collect()
}
