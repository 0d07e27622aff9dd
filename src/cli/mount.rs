//! `raidfs mount` and `raidfs umount`.
//!
//! `mount` checks everything it can in the invoking process (options, member
//! paths, the mount point, /dev/fuse, where its state and log go, see
//! [`places`]), then forks the daemon ([`daemon`]) and waits for it to
//! report. `umount` unmounts and waits for the daemon to close the array,
//! found through [`registry`].

mod daemon;
pub mod identity;
pub mod logging;
pub mod options;
pub mod places;
pub mod registry;
pub mod remount;
pub mod second;

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::array::LeftOut;
use crate::fuse::{is_raidfs_mount, mounts};
use daemon::{LogDest, MountPlan};

/// How long a new mount waits for a dead daemon's last threads to exit.
const STALE_DAEMON_EXIT: Duration = Duration::from_secs(30);

/// How long a mount waits for the daemon of a just-unmounted mount to close
/// the array and release the members (its final commit and clean mark).
pub(crate) const MEMBER_LOCK_WAIT: Duration = Duration::from_secs(30);

/// The same wait for the offline commands run right after an unmount
/// (`fsck`, `upgrade`); shorter, as nobody is waiting on a mount.
pub(crate) const OFFLINE_LOCK_WAIT: Duration = Duration::from_secs(10);

#[derive(clap::Args)]
pub struct MountArgs {
    /// Stay in the foreground and log to stderr.
    #[arg(short, long)]
    pub foreground: bool,
    /// Mount options, comma-separated (the list: --help).
    #[arg(short = 'o', value_name = "OPTIONS", long_help = options::long_help())]
    pub options: Vec<String>,
    /// Member image files, block devices or NBD URIs, then the mount point.
    #[arg(required = true, num_args = 2.., value_name = "MEMBER... MOUNTPOINT")]
    pub paths: Vec<PathBuf>,
    /// The mount's source, set by the mount(8) helper when its SPEC names
    /// the array; otherwise the array's own name or UUID.
    #[arg(skip)]
    pub source: Option<String>,
    /// Say nothing on success: mount(8) helpers are silent unless `-v`
    /// (scripts such as fstests compare what a mount prints).
    #[arg(skip)]
    pub quiet: bool,
}

#[derive(clap::Args)]
pub struct UmountArgs {
    /// Detach a busy mount now; the daemon closes the array when the last
    /// open file is closed.
    #[arg(short, long)]
    pub lazy: bool,
    /// Seconds to wait for the daemon to close the array.
    #[arg(long, default_value_t = 120)]
    pub timeout: u64,
    /// The mount point.
    pub mount_point: PathBuf,
}

pub fn run(args: MountArgs) -> i32 {
    crate::notice::set_quiet(args.quiet);
    match prepare(&args) {
        Ok(plan) if args.foreground => daemon::run_foreground(&plan),
        Ok(plan) => daemon::run_background(&plan),
        Err(msg) => super::fail(msg),
    }
}

fn prepare(args: &MountArgs) -> Result<MountPlan, String> {
    let mut options = options::parse(&args.options)?;
    let Some((mount_point, members)) = args.paths.split_last() else {
        return Err("give the member paths and then the mount point".into());
    };
    if members.is_empty() {
        return Err("no members given (usage: raidfs mount [OPTIONS] MEMBER... MOUNTPOINT)".into());
    }
    // By the names given, before they are made absolute (which resolves
    // symlinks and would name both as one).
    crate::member::open::refuse_repeated(members)?;
    // Absolute, because the daemon changes directory to /; URIs as given.
    let members = members
        .iter()
        .map(|m| {
            if crate::member::open::is_uri(m) {
                return Ok(m.clone());
            }
            m.canonicalize()
                .map_err(|e| format!("member {}: {e}", m.display()))
        })
        .collect::<Result<Vec<_>, _>>()?;
    // As the members are: the daemon finds them by these names.
    options.write_mostly = options
        .write_mostly
        .iter()
        .map(|m| write_mostly_name(m))
        .collect::<Result<_, _>>()?;
    let mount_point = check_mount_point(mount_point)?;
    check_members_free(&members)?;
    check_fuse_device()?;
    let env = places::Env::current();
    // Here rather than in the daemon, whose registry write can only be
    // logged: a user with nowhere to put the socket hears it now.
    env.ensure_run_dir()?;
    let log = match &options.log {
        Some(path) if path.as_os_str() == "syslog" => LogDest::Syslog,
        Some(path) => LogDest::File(
            mounts::absolute_lexical(path).map_err(|e| format!("log={}: {e}", path.display()))?,
        ),
        // systemd's journal collects syslog, and the unit's status shows it.
        None if logging::under_systemd() => LogDest::Syslog,
        None => LogDest::File(env.log_path(&log_name(&members, &mount_point))?),
    };
    Ok(MountPlan {
        members,
        mount_point,
        options,
        log,
        source: args.source.clone(),
        quiet: args.quiet,
    })
}

/// A `write_mostly=` member as the daemon (in `/`) must name it: a slot
/// number or URI as given, a path made absolute.
fn write_mostly_name(member: &str) -> Result<String, String> {
    let path = Path::new(member);
    if member.parse::<usize>().is_ok() || crate::member::open::is_uri(path) {
        return Ok(member.to_string());
    }
    path.canonicalize()
        .map(|p| p.display().to_string())
        .map_err(|e| format!("write_mostly={member}: {e}"))
}

/// The default log's file name: the array's (see [`places::log_name`]),
/// read from the first member with a readable superblock; when none has
/// one the mount fails anyway, and its log is named by the mount point.
fn log_name(members: &[PathBuf], mount_point: &Path) -> String {
    for member in members {
        let Ok(opened) = crate::member::open::peek(member) else {
            continue;
        };
        if let Ok((sb, _)) = crate::superblock::Superblock::read_from(opened.as_ref()) {
            return places::log_name(&sb.name, sb.array_uuid);
        }
    }
    format!("{}.log", places::mount_file_stem(mount_point))
}

/// Tell the user about members an assembly left out because they cannot
/// be opened read-write.
/// What assembly decided that the user should read (a degraded start,
/// stale members coming back, spares kept).
pub(crate) fn tell_notes(notes: &[String]) {
    for note in notes {
        crate::notice::tell(note);
    }
}

pub(crate) fn tell_left_out(left_out: &LeftOut) {
    for (name, why) in left_out {
        let problem = if crate::member::open::is_uri(Path::new(name)) {
            "cannot be reached"
        } else {
            "cannot be opened read-write"
        };
        crate::notice::tell(&format!(
            "{name} {problem} ({why}); left out, the array starts degraded"
        ));
    }
}

/// A member that a live mount still serves will not be released by
/// waiting for it, so that is refused at once. Paths that do not resolve
/// are left for the open to report. An NBD URI is compared as written:
/// this catches a second mount of the same export from this host only
/// (NBD has no lock to catch one from another host).
pub(crate) fn check_members_free(members: &[PathBuf]) -> Result<(), String> {
    for member in members {
        let absolute = if crate::member::open::is_uri(member) {
            member.clone()
        } else {
            let Ok(absolute) = member.canonicalize() else {
                continue;
            };
            absolute
        };
        if let Some(daemon) = registry::serving(&absolute) {
            return Err(format!(
                "member {} is in use by another raidfs process: the daemon (pid {}) serving {}",
                member.display(),
                daemon.pid,
                daemon.mount_point.display()
            ));
        }
    }
    Ok(())
}

/// The mount point must be an existing directory with nothing mounted on
/// it. A raidfs mount whose daemon has died (every access fails with
/// "transport endpoint is not connected") is cleared away first.
fn check_mount_point(path: &Path) -> Result<PathBuf, String> {
    let shown = path.display();
    let absolute =
        mounts::absolute_lexical(path).map_err(|e| format!("mount point {shown}: {e}"))?;
    let existing =
        mounts::mount_at(&absolute).map_err(|e| format!("reading /proc/self/mountinfo: {e}"))?;
    if let Some(entry) = existing {
        let record = registry::read(&absolute).ok().flatten();
        let daemon = record.clone().filter(|r| r.is_alive());
        match daemon {
            None if is_raidfs_mount(&entry) => {
                eprintln!("raidfs: {shown}: clearing a stale raidfs mount whose daemon has exited");
                // A killed daemon's threads may still be exiting, holding the
                // member locks that the new assembly is about to take.
                if let Some(dead) = record {
                    if !dead.wait_for_exit(STALE_DAEMON_EXIT) {
                        return Err(format!(
                            "the old daemon (pid {}) of {shown} has not finished exiting",
                            dead.pid
                        ));
                    }
                }
                mounts::unmount(&absolute, true)
                    .map_err(|e| format!("clearing the stale mount on {shown}: {e}"))?;
                registry::remove(&absolute);
            }
            Some(d) => {
                return Err(format!(
                    "mount point {shown} is busy: raidfs (pid {}) is mounted there",
                    d.pid
                ))
            }
            None => {
                return Err(format!(
                    "mount point {shown} is busy: {} is mounted there",
                    entry.fs_type
                ))
            }
        }
    }
    let meta = std::fs::metadata(&absolute).map_err(|e| format!("mount point {shown}: {e}"))?;
    if !meta.is_dir() {
        return Err(format!("mount point {shown} is not a directory"));
    }
    absolute
        .canonicalize()
        .map_err(|e| format!("mount point {shown}: {e}"))
}

fn check_fuse_device() -> Result<(), String> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let meta = match std::fs::metadata("/dev/fuse") {
        Ok(meta) if meta.file_type().is_char_device() => meta,
        Ok(_) => return Err("/dev/fuse is not a character device".into()),
        Err(e) => {
            return Err(format!(
                "/dev/fuse: {e} (is the fuse module loaded? try `modprobe fuse`)"
            ))
        }
    };
    // A user's mount opens the device with the user's own rights (fuser
    // does, and so does fusermount3, which it falls back to for mount(2)),
    // so a device only root may open fails every user's mount: say so
    // before forking rather than in the daemon's log.
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    // SAFETY: the path is a NUL-terminated literal; access only reads it.
    let usable = unsafe { libc::access(c"/dev/fuse".as_ptr(), libc::R_OK | libc::W_OK) } == 0;
    if euid != 0 && !usable {
        return Err(format!(
            "/dev/fuse (mode {:04o}, uid {}, gid {}) cannot be opened by uid {euid}, so only root can mount FUSE here; most distributions make it 0666 (as root: chmod 0666 /dev/fuse)",
            meta.mode() & 0o7777,
            meta.uid(),
            meta.gid()
        ));
    }
    Ok(())
}

pub fn run_umount(args: UmountArgs) -> i32 {
    match umount(&args) {
        Ok(()) => 0,
        Err(msg) => super::fail(msg),
    }
}

fn umount(args: &UmountArgs) -> Result<(), String> {
    let shown = args.mount_point.display();
    let path = mounts::absolute_lexical(&args.mount_point).map_err(|e| format!("{shown}: {e}"))?;
    let entry = mounts::mount_at(&path)
        .map_err(|e| format!("reading /proc/self/mountinfo: {e}"))?
        .ok_or_else(|| format!("{shown} is not mounted"))?;
    if !is_raidfs_mount(&entry) {
        return Err(format!(
            "{shown} is not a raidfs mount (it is {})",
            entry.fs_type
        ));
    }
    let daemon = registry::read(&path)
        .ok()
        .flatten()
        .filter(|r| r.is_alive())
        .or_else(|| daemon_by_socket(&path));
    mounts::unmount_with_grace(&path, args.lazy).map_err(|e| match e.raw_os_error() {
        Some(libc::EBUSY) => {
            format!("{shown} is busy (files are open on it); close them or use --lazy")
        }
        _ => format!("unmounting {shown}: {e}"),
    })?;
    let Some(daemon) = daemon else {
        eprintln!("raidfs: {shown} unmounted; no running raidfs daemon was recorded for it");
        return Ok(());
    };
    if !daemon.wait_for_exit(Duration::from_secs(args.timeout)) {
        return Err(format!(
            "{shown} is unmounted but its daemon (pid {}) is still closing the array after {} s",
            daemon.pid, args.timeout
        ));
    }
    let log = daemon
        .log
        .as_ref()
        .map(|l| format!("; see {}", l.display()))
        .unwrap_or_default();
    match registry::read(&path) {
        Ok(None) => Ok(()),
        Ok(Some(rec)) => {
            registry::remove(&path);
            match rec.error {
                Some(err) => Err(format!(
                    "the daemon could not close the array cleanly: {err}{log}"
                )),
                None => Err(format!(
                    "the daemon exited without closing the array cleanly{log}"
                )),
            }
        }
        Err(e) => Err(format!("reading the daemon's state: {e}")),
    }
}

/// The daemon of a mount recorded in another user's run directory (root
/// unmounting a user's mount), as its control socket names it, so that
/// umount still waits for it to close the array.
fn daemon_by_socket(mount_point: &Path) -> Option<registry::DaemonRecord> {
    let mut client = super::status::connect(mount_point).ok()?;
    let report = super::status::query(&mut client).ok()?;
    let record = registry::DaemonRecord {
        pid: report.daemon_pid,
        start_time: registry::process_start_time(report.daemon_pid)?,
        ..registry::DaemonRecord::for_self(mount_point, None)
    };
    Some(record)
}

/// The pid of the daemon serving `mount_point`, if one is running.
pub fn daemon_pid(mount_point: &Path) -> Option<u32> {
    let path = mounts::absolute_lexical(mount_point).ok()?;
    registry::read(&path)
        .ok()
        .flatten()
        .filter(|r| r.is_alive())
        .map(|r| r.pid)
}
