//! `raidfs status`: every mounted array (or one), like /proc/mdstat, from
//! the mount daemons' control sockets; and finding those sockets.

use crate::cli::mount::registry;
use crate::control::{
    ArrayReport, ControlClient, ControlError, Request, SyncReport, REPORT_VERSION,
};
use crate::fuse::mounts;
use serde::Serialize;
use std::path::{Path, PathBuf};

#[derive(clap::Args)]
pub struct StatusArgs {
    /// Print JSON (see docs/status-json.md) instead of text.
    #[arg(long)]
    pub json: bool,
    /// Show only the array mounted here.
    pub mount_point: Option<PathBuf>,
}

/// Where root's daemons keep their sockets; other users look here too.
const SYSTEM_RUN_DIR: &str = "/run/raidfs/mounts";
/// Longest socket path we make (sun_path holds 108 bytes with the NUL).
const MAX_SOCKET_PATH: usize = 100;

/// The control socket of the mount at `mount_point` (absolute, normalised):
/// next to the daemon's state file, or a hashed name when that is too long
/// for a Unix socket address.
pub fn socket_path(mount_point: &Path) -> PathBuf {
    socket_in(&registry::state_path(mount_point))
}

fn socket_in(state: &Path) -> PathBuf {
    use std::os::unix::ffi::OsStrExt;
    let plain = state.with_extension("sock");
    if plain.as_os_str().len() <= MAX_SOCKET_PATH {
        return plain;
    }
    let name = state
        .file_name()
        .map(|n| n.as_bytes().to_vec())
        .unwrap_or_default();
    let dir = state.parent().unwrap_or(Path::new("/"));
    dir.join(format!("long-{:08x}.sock", crc32c::crc32c(&name)))
}

/// Directories that may hold control sockets: this user's run directory,
/// then the system one (a user may query root's mounts).
fn run_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(own) = registry::state_path(Path::new("/x")).parent() {
        dirs.push(own.to_path_buf());
    }
    let system = PathBuf::from(SYSTEM_RUN_DIR);
    if !dirs.contains(&system) {
        dirs.push(system);
    }
    dirs
}

/// Connect to the daemon serving `mount_point`.
pub fn connect(mount_point: &Path) -> Result<ControlClient, String> {
    let shown = mount_point.display();
    let path = mounts::absolute_lexical(mount_point).map_err(|e| format!("{shown}: {e}"))?;
    let state = registry::state_path(&path);
    let candidates: Vec<PathBuf> = run_dirs()
        .iter()
        .filter_map(|dir| Some(socket_in(&dir.join(state.file_name()?))))
        .collect();
    let Some(socket) = candidates.iter().find(|c| c.exists()) else {
        let mounted = mounts::mount_at(&path).ok().flatten();
        return Err(match mounted {
            Some(entry) if crate::fuse::is_raidfs_mount(&entry) => {
                format!(
                    "{shown}: no control socket for this raidfs mount (its daemon may have died)"
                )
            }
            Some(entry) => format!("{shown} is not a raidfs mount (it is {})", entry.fs_type),
            None => format!("{shown} is not mounted"),
        });
    };
    ControlClient::connect(socket).map_err(|e| match e {
        ControlError::Connect { source, .. } if source.kind() == std::io::ErrorKind::PermissionDenied => format!(
            "{shown}: permission denied on the control socket {} (only root or the mount's owner may use it)",
            socket.display()
        ),
        ControlError::Connect { source, .. } if source.kind() == std::io::ErrorKind::ConnectionRefused => {
            format!("{shown}: the daemon is not running (stale control socket {})", socket.display())
        }
        other => format!("{shown}: {other}"),
    })
}

/// Ask `client` for the array's report.
pub fn query(client: &mut ControlClient) -> Result<ArrayReport, String> {
    let response = client
        .request(&Request::Status)
        .map_err(|e| e.to_string())?;
    match (response.ok, response.report) {
        (true, Some(report)) => Ok(report),
        _ => Err(response
            .error
            .unwrap_or_else(|| "the daemon sent no report".into())),
    }
}

/// Reports of every mount whose daemon answers, by mount point.
fn all_reports() -> Vec<ArrayReport> {
    let mut reports: Vec<ArrayReport> = Vec::new();
    for dir in run_dirs() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.extension() != Some(std::ffi::OsStr::new("sock")) {
                continue;
            }
            // Stale sockets (daemons that died) and other users' private
            // ones are skipped: they are not arrays we can show.
            let Ok(mut client) = ControlClient::connect(&path) else {
                continue;
            };
            if let Ok(report) = query(&mut client) {
                if !reports.iter().any(|r| r.mount_point == report.mount_point) {
                    reports.push(report);
                }
            }
        }
    }
    reports.sort_by(|a, b| a.mount_point.cmp(&b.mount_point));
    reports
}

#[derive(Serialize)]
struct StatusDocument<'a> {
    version: u32,
    arrays: &'a [ArrayReport],
}

pub fn run(args: StatusArgs) -> i32 {
    let reports = match &args.mount_point {
        Some(mp) => match connect(mp).and_then(|mut c| query(&mut c)) {
            Ok(report) => vec![report],
            Err(msg) => return super::fail(msg),
        },
        None => all_reports(),
    };
    if args.json {
        let doc = StatusDocument {
            version: REPORT_VERSION,
            arrays: &reports,
        };
        return match serde_json::to_string_pretty(&doc) {
            Ok(text) => {
                println!("{text}");
                0
            }
            Err(e) => super::fail(format!("encoding JSON: {e}")),
        };
    }
    if reports.is_empty() {
        println!("no raidfs arrays are mounted");
    }
    for (i, report) in reports.iter().enumerate() {
        if i > 0 {
            println!();
        }
        print!("{}", mdstat(report));
    }
    0
}

fn short_name(name: &str) -> &str {
    Path::new(name)
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or(name)
}

/// The /proc/mdstat lines of one array.
pub fn mdstat(r: &ArrayReport) -> String {
    let mut members = Vec::new();
    for m in &r.members {
        let flag = match m.state.as_str() {
            "missing" => continue,
            "faulty" => "(F)",
            "rebuilding" => "(R)",
            _ => "",
        };
        members.push(format!("{}[{}]{flag}", short_name(&m.name), m.slot));
    }
    if let Some(rep) = &r.replacing {
        members.push(format!("{}[{}](R)", short_name(&rep.name), rep.slot));
    }
    for (i, s) in r.spares.iter().enumerate() {
        members.push(format!("{}[{}](S)", short_name(s), r.raid_devices + i));
    }
    let read_only = if r.read_only { " (read-only)" } else { "" };
    let mut out = format!(
        "{} : active{read_only} {} {}\n",
        r.mount_point,
        r.level,
        members.join(" ")
    );
    let level_digits = r.level.trim_start_matches("raid");
    let algorithm = if r.level == "raid5" || r.level == "raid6" {
        format!(", algorithm {}", r.layout)
    } else {
        String::new()
    };
    out.push_str(&format!(
        "      {} blocks super raidfs-1 level {level_digits}, {}k chunk{algorithm} [{}/{}] {}\n",
        r.array_size / 1024,
        r.chunk / 1024,
        r.raid_devices,
        r.active_devices,
        r.map
    ));
    if let Some(sync) = &r.sync {
        out.push_str(&progress_line(sync));
        out.push('\n');
    }
    out
}

/// md's progress line: `      [====>................]  recovery = 21.3%
/// (223744/1048576) finish=1.2min speed=412000K/sec`, figures in KiB.
pub fn progress_line(s: &SyncReport) -> String {
    let per_mille = s.per_mille();
    let filled = (per_mille / 50) as usize;
    let bar = format!("[{}>{}]", "=".repeat(filled), ".".repeat(20 - filled));
    format!(
        "      {bar}  {} ={:3}.{}% ({}/{}) finish={}.{}min speed={}K/sec",
        s.action,
        per_mille / 10,
        per_mille % 10,
        s.done / 1024,
        s.total / 1024,
        s.eta_secs / 60,
        (s.eta_secs % 60) / 6,
        s.speed / 1024
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sync(done: u64, total: u64) -> SyncReport {
        SyncReport {
            action: "recovery".into(),
            slot: Some(2),
            done,
            total,
            speed: 412_000 * 1024,
            eta_secs: 72,
            mismatches: 0,
        }
    }

    #[test]
    fn progress_line_matches_mdstat() {
        assert_eq!(
            progress_line(&sync(223_744 * 1024, 1_048_576 * 1024)),
            "      [====>................]  recovery = 21.3% (223744/1048576) finish=1.2min speed=412000K/sec"
        );
        let start = progress_line(&sync(0, 1 << 20));
        assert!(
            start.starts_with("      [>....................]  recovery =  0.0% (0/1024)"),
            "{start}"
        );
        let end = progress_line(&sync(1 << 20, 1 << 20));
        assert!(
            end.starts_with("      [====================>]  recovery =100.0%"),
            "{end}"
        );
    }

    #[test]
    fn long_mount_points_get_short_socket_names() {
        let short = socket_in(Path::new("/run/raidfs/mounts/mnt-data.state"));
        assert_eq!(short, Path::new("/run/raidfs/mounts/mnt-data.sock"));
        let long_state = format!("/run/raidfs/mounts/{}.state", "x".repeat(120));
        let long = socket_in(Path::new(&long_state));
        assert!(long.as_os_str().len() <= MAX_SOCKET_PATH);
        assert!(long
            .to_string_lossy()
            .starts_with("/run/raidfs/mounts/long-"));
        assert_ne!(
            long,
            socket_in(Path::new(&long_state.replace(".state", "y.state")))
        );
    }
}
