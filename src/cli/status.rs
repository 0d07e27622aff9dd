//! `raidfs status`: every mounted array (or one), like /proc/mdstat, from
//! the mount daemons' control sockets; and finding those sockets.

use crate::array::MemberState;
use crate::cli::mount::places::{self, Env, SYSTEM_RUN_DIR};
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
    /// Also list files with damaged data (ranges no copy could correct).
    #[arg(short, long)]
    pub verbose: bool,
    /// Show only the array mounted here.
    pub mount_point: Option<PathBuf>,
}

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

/// Directories that may hold control sockets: this user's run
/// directories, then the system one (a user may query root's mounts).
fn run_dirs() -> Vec<PathBuf> {
    let mut dirs = Env::current().run_dirs();
    let system = PathBuf::from(SYSTEM_RUN_DIR);
    if !dirs.contains(&system) {
        dirs.push(system);
    }
    dirs
}

/// Every bound raidfs control socket on the machine, from the kernel's
/// list of Unix sockets: how root finds the mounts of users, whose sockets
/// live in their own directories (see [`places`]). A user finds other
/// users' too, and is refused at their private directories.
fn bound_sockets() -> Vec<PathBuf> {
    match std::fs::read_to_string("/proc/net/unix") {
        Ok(table) => raidfs_sockets_in(&table),
        Err(e) => {
            log::debug!("/proc/net/unix: {e}");
            Vec::new()
        }
    }
}

/// The raidfs control socket paths in a `/proc/net/unix` table: those in a
/// directory ending in [`places::RUN_DIR_TAIL`] with a `.sock` name.
fn raidfs_sockets_in(table: &str) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = Vec::new();
    for line in table.lines().skip(1) {
        // Seven fixed fields, then the path (which may hold spaces).
        let mut rest = line.trim_start();
        for _ in 0..7 {
            rest = match rest.find(' ') {
                Some(i) => rest[i..].trim_start(),
                None => "",
            };
        }
        let path = Path::new(rest);
        let ours = path.is_absolute()
            && path.extension() == Some(std::ffi::OsStr::new("sock"))
            && path
                .parent()
                .is_some_and(|d| d.ends_with(places::RUN_DIR_TAIL));
        if ours && !found.iter().any(|f| f == path) {
            found.push(path.to_path_buf());
        }
    }
    found
}

/// Connect to the daemon serving `mount_point`.
pub fn connect(mount_point: &Path) -> Result<ControlClient, String> {
    let shown = mount_point.display();
    let path = mounts::absolute_lexical(mount_point).map_err(|e| format!("{shown}: {e}"))?;
    let state = registry::state_path(&path);
    let mut candidates: Vec<PathBuf> = run_dirs()
        .iter()
        .filter_map(|dir| Some(socket_in(&dir.join(state.file_name()?))))
        .collect();
    // Another user's mount (root asking about it): its socket has this
    // mount's name in whatever directory that user's daemon bound it.
    candidates.extend(bound_sockets().into_iter().filter(|bound| {
        let dir = bound.parent().unwrap_or(Path::new("/"));
        state
            .file_name()
            .is_some_and(|name| socket_in(&dir.join(name)) == *bound)
    }));
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

/// A raidfs mount whose daemon is gone: the kernel still has the mount,
/// but every access fails (`Transport endpoint is not connected`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct InactiveMount {
    pub mount_point: String,
    pub reason: String,
}

/// Every raidfs mount on the machine: the reports of those whose daemon
/// answers, and those that are dead.
pub struct Survey {
    pub reports: Vec<ArrayReport>,
    pub inactive: Vec<InactiveMount>,
    /// Live raidfs mounts whose daemon did not answer us (another user's
    /// private socket, or a daemon too busy to take the connection).
    pub unanswered: Vec<String>,
}

/// How long a mount point may take to answer `stat` before it is left
/// out of the dead ones (a daemon that is busy or stopped, not gone).
const STAT_PATIENCE: std::time::Duration = std::time::Duration::from_secs(2);

/// Why the raidfs mount at `mount_point` is dead, if it is: `stat` on it
/// fails with ENOTCONN once its daemon has gone. Any other answer (it
/// works, or it is another user's mount we may not look into) is not
/// death; a stat that hangs is not taken as one either.
pub fn dead_mount_reason(mount_point: &Path) -> Option<String> {
    let (tx, rx) = std::sync::mpsc::channel();
    let path = mount_point.to_path_buf();
    // A hung daemon would hold the stat; the thread is left to it.
    std::thread::Builder::new()
        .name("raidfs-stat".into())
        .spawn(move || {
            let _ = tx.send(std::fs::metadata(&path).map(drop));
        })
        .ok()?;
    match rx.recv_timeout(STAT_PATIENCE) {
        Ok(Err(e)) if e.raw_os_error() == Some(libc::ENOTCONN) => {
            let daemon = registry::read(mount_point)
                .ok()
                .flatten()
                .map(|r| format!(" (pid {})", r.pid))
                .unwrap_or_default();
            Some(format!("the daemon{daemon} is gone: {e}"))
        }
        _ => None,
    }
}

/// Whether a raidfs filesystem is mounted at `path` (absolute, normalised).
pub fn is_raidfs_mount_point(path: &Path) -> bool {
    matches!(mounts::mount_at(path), Ok(Some(entry)) if crate::fuse::is_raidfs_mount(&entry))
}

/// The raidfs mounts in the kernel's table, in table order.
pub fn raidfs_mount_points() -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = Vec::new();
    for entry in mounts::all_mounts().unwrap_or_default() {
        if crate::fuse::is_raidfs_mount(&entry) && !found.contains(&entry.mount_point) {
            found.push(entry.mount_point);
        }
    }
    found
}

/// Every report, and every dead raidfs mount (one without an answering
/// daemon whose mount point says ENOTCONN).
pub fn survey() -> Survey {
    let reports = all_reports();
    let mut inactive = Vec::new();
    let mut unanswered = Vec::new();
    for mount_point in raidfs_mount_points() {
        let shown = mount_point.display().to_string();
        if reports.iter().any(|r| r.mount_point == shown) {
            continue;
        }
        match dead_mount_reason(&mount_point) {
            Some(reason) => inactive.push(InactiveMount {
                mount_point: shown,
                reason,
            }),
            None => unanswered.push(shown),
        }
    }
    inactive.sort_by(|a, b| a.mount_point.cmp(&b.mount_point));
    Survey {
        reports,
        inactive,
        unanswered,
    }
}

/// Reports of every mount whose daemon answers, by mount point.
pub fn all_reports() -> Vec<ArrayReport> {
    let mut sockets: Vec<PathBuf> = Vec::new();
    for dir in run_dirs() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.extension() == Some(std::ffi::OsStr::new("sock")) {
                sockets.push(path);
            }
        }
    }
    for bound in bound_sockets() {
        if !sockets.contains(&bound) {
            sockets.push(bound);
        }
    }
    let mut reports: Vec<ArrayReport> = Vec::new();
    for path in sockets {
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
    reports.sort_by(|a, b| a.mount_point.cmp(&b.mount_point));
    reports
}

#[derive(Serialize)]
struct StatusDocument<'a> {
    version: u32,
    arrays: &'a [ArrayReport],
    inactive: &'a [InactiveMount],
}

/// The one mount `status MOUNTPOINT` asks about: its report, or why it is
/// dead, or the error.
pub fn survey_one(mount_point: &Path) -> Result<Survey, String> {
    match connect(mount_point).and_then(|mut c| query(&mut c)) {
        Ok(report) => Ok(Survey {
            reports: vec![report],
            inactive: Vec::new(),
            unanswered: Vec::new(),
        }),
        Err(msg) => {
            let path = mounts::absolute_lexical(mount_point).map_err(|_| msg.clone())?;
            if !is_raidfs_mount_point(&path) {
                return Err(msg);
            }
            match dead_mount_reason(&path) {
                Some(reason) => Ok(Survey {
                    reports: Vec::new(),
                    inactive: vec![InactiveMount {
                        mount_point: path.display().to_string(),
                        reason,
                    }],
                    unanswered: Vec::new(),
                }),
                None => Err(msg),
            }
        }
    }
}

pub fn run(args: StatusArgs) -> i32 {
    let Survey {
        reports, inactive, ..
    } = match &args.mount_point {
        Some(mp) => match survey_one(mp) {
            Ok(survey) => survey,
            Err(msg) => return super::fail(msg),
        },
        None => survey(),
    };
    if args.json {
        let doc = StatusDocument {
            version: REPORT_VERSION,
            arrays: &reports,
            inactive: &inactive,
        };
        return match serde_json::to_string_pretty(&doc) {
            Ok(text) => {
                println!("{text}");
                0
            }
            Err(e) => super::fail(format!("encoding JSON: {e}")),
        };
    }
    if reports.is_empty() && inactive.is_empty() {
        println!("no raidfs arrays are mounted");
    }
    for (i, report) in reports.iter().enumerate() {
        if i > 0 {
            println!();
        }
        print!("{}", mdstat(report));
        if args.verbose {
            print!("{}", damaged_text(report));
        }
    }
    for (i, dead) in inactive.iter().enumerate() {
        if i > 0 || !reports.is_empty() {
            println!();
        }
        print!("{}", inactive_line(dead));
    }
    0
}

/// `zpool status -v`'s error section: the files with damaged data, each
/// range on a line (offsets and lengths in bytes).
pub fn damaged_text(r: &ArrayReport) -> String {
    if r.damaged.is_empty() {
        return "      errors: No known data errors\n".into();
    }
    let mut out =
        String::from("      errors: Permanent errors have been detected in the following files:\n");
    for d in &r.damaged {
        let file = match &d.path {
            Some(p) => format!("{}{}", r.mount_point.trim_end_matches('/'), p),
            None => format!("<inode {}>", d.ino),
        };
        out.push_str(&format!(
            "              {file} (offset {}, {} bytes)\n",
            d.offset, d.length
        ));
    }
    out
}

/// md shows an array that is not running as `inactive`; a dead mount
/// says why.
pub fn inactive_line(dead: &InactiveMount) -> String {
    format!("{} : inactive ({})\n", dead.mount_point, dead.reason)
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
        let flag = match m.state {
            MemberState::Missing => continue,
            MemberState::Faulty => "(F)",
            MemberState::Rebuilding => "(R)",
            MemberState::Active => "",
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
    out.push_str(&owner_line(r.owner_uid, user_name(r.owner_uid).as_deref()));
    out
}

/// `      owner uid 1000 (alice)`: whose mount it is, as root sees every
/// user's.
fn owner_line(uid: u32, name: Option<&str>) -> String {
    match name {
        Some(name) => format!("      owner uid {uid} ({name})\n"),
        None => format!("      owner uid {uid}\n"),
    }
}

/// The login name of `uid`, if the user database has one.
fn user_name(uid: u32) -> Option<String> {
    let mut buf = vec![0 as libc::c_char; 4096];
    // SAFETY: passwd is plain data filled by getpwuid_r.
    let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
    let mut found: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: every pointer is valid for the call, buf for its stated
    // length; the result points into pwd and buf, which outlive its use.
    let rc = unsafe { libc::getpwuid_r(uid, &mut pwd, buf.as_mut_ptr(), buf.len(), &mut found) };
    if rc != 0 || found.is_null() || pwd.pw_name.is_null() {
        return None;
    }
    // SAFETY: pw_name is a NUL-terminated string inside buf.
    let name = unsafe { std::ffi::CStr::from_ptr(pwd.pw_name) };
    Some(name.to_string_lossy().into_owned())
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
            run: 1,
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
    fn bound_raidfs_sockets_are_picked_out_of_the_kernels_list() {
        let table = "Num       RefCount Protocol Flags    Type St Inode Path\n\
            0000000082f90260: 00000003 00000000 00000000 0001 03 160881\n\
            00000000442a23cd: 00000002 00000000 00010000 0001 01  4242 /run/user/1000/raidfs/mounts/home-u-mnt.sock\n\
            00000000442a23ce: 00000002 00000000 00010000 0001 01 99999 /home/u/.local/state/raidfs/mounts/my disk.sock\n\
            00000000442a23cf: 00000002 00000000 00010000 0001 01 99998 /run/systemd/notify\n\
            00000000442a23d0: 00000002 00000000 00010000 0001 01 99997 @/raidfs/mounts/abstract.sock\n\
            00000000442a23d1: 00000003 00000000 00000000 0001 03 99996 /run/user/1000/raidfs/mounts/home-u-mnt.sock\n";
        assert_eq!(
            raidfs_sockets_in(table),
            vec![
                PathBuf::from("/run/user/1000/raidfs/mounts/home-u-mnt.sock"),
                PathBuf::from("/home/u/.local/state/raidfs/mounts/my disk.sock"),
            ]
        );
    }

    #[test]
    fn the_owner_is_shown_by_name_when_known() {
        assert_eq!(
            owner_line(1000, Some("alice")),
            "      owner uid 1000 (alice)\n"
        );
        assert_eq!(owner_line(4242, None), "      owner uid 4242\n");
        assert_eq!(user_name(0).as_deref(), Some("root"));
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
