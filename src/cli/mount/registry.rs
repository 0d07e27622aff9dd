//! Which daemon serves which mount point: one small state file per mount
//! in the run directory (`/run/raidfs/mounts/` for root; see [`places`]
//! for users), so that `raidfs umount` can wait for the daemon to finish
//! closing the array, and `raidfs mount` can tell a live mount from one
//! left behind by a daemon that died.

use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::places::{self, Env};

/// A running (or dead) mount daemon, as recorded in its state file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DaemonRecord {
    pub pid: u32,
    /// Start time of the process (clock ticks since boot): guards against
    /// mistaking a recycled pid for the daemon.
    pub start_time: u64,
    pub mount_point: PathBuf,
    pub log: Option<PathBuf>,
    /// The `auto_unmount` watcher process, if any.
    pub watcher: Option<u32>,
    /// Set by a daemon that failed to close the filesystem cleanly.
    pub error: Option<String>,
    /// The members it assembled (absolute paths, or NBD URIs as given).
    pub members: Vec<PathBuf>,
}

/// The state file of the mount at `mount_point` (absolute, normalised) in
/// the run directory now in use (see [`places`]).
pub fn state_path(mount_point: &Path) -> PathBuf {
    state_path_in(&Env::current().run_dir(), mount_point)
}

fn state_path_in(dir: &Path, mount_point: &Path) -> PathBuf {
    dir.join(format!("{}.state", places::mount_file_stem(mount_point)))
}

pub fn write(record: &DaemonRecord) -> io::Result<()> {
    let dir = Env::current().ensure_run_dir().map_err(io::Error::other)?;
    let path = state_path_in(&dir, &record.mount_point);
    let mut text = format!(
        "pid={}\nstart_time={}\nmount_point={}\n",
        record.pid,
        record.start_time,
        record.mount_point.display()
    );
    if let Some(log) = &record.log {
        text.push_str(&format!("log={}\n", log.display()));
    }
    if let Some(watcher) = record.watcher {
        text.push_str(&format!("watcher={watcher}\n"));
    }
    if let Some(error) = &record.error {
        text.push_str(&format!("error={}\n", error.replace('\n', " ")));
    }
    for member in &record.members {
        text.push_str(&format!("member={}\n", member.display()));
    }
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text)
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", tmp.display())))?;
    std::fs::rename(&tmp, &path)
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))
}

/// The record of the mount at `mount_point`, from whichever of this user's
/// run directories holds it (the environment of the `mount` that made it
/// may have differed).
pub fn read(mount_point: &Path) -> io::Result<Option<DaemonRecord>> {
    for dir in Env::current().run_dirs() {
        if let Some(record) = read_in(&dir, mount_point)? {
            return Ok(Some(record));
        }
    }
    Ok(None)
}

/// The record of the mount at `mount_point` in run directory `dir`.
pub fn read_in(dir: &Path, mount_point: &Path) -> io::Result<Option<DaemonRecord>> {
    let path = state_path_in(dir, mount_point);
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io::Error::new(e.kind(), format!("{}: {e}", path.display()))),
    };
    Ok(parse(&text, mount_point))
}

fn parse(text: &str, mount_point: &Path) -> Option<DaemonRecord> {
    let mut record = DaemonRecord {
        pid: 0,
        start_time: 0,
        mount_point: mount_point.to_path_buf(),
        log: None,
        watcher: None,
        error: None,
        members: Vec::new(),
    };
    for line in text.lines() {
        match line.split_once('=') {
            Some(("pid", v)) => record.pid = v.parse().ok()?,
            Some(("start_time", v)) => record.start_time = v.parse().ok()?,
            Some(("log", v)) => record.log = Some(PathBuf::from(v)),
            Some(("error", v)) => record.error = Some(v.to_string()),
            Some(("watcher", v)) => record.watcher = v.parse().ok(),
            Some(("member", v)) => record.members.push(PathBuf::from(v)),
            _ => {}
        }
    }
    (record.pid != 0).then_some(record)
}

/// The live daemon that has `member` (absolute) assembled and whose mount
/// is still up, if any: such a member will not be released by waiting.
pub fn serving(member: &Path) -> Option<DaemonRecord> {
    Env::current()
        .run_dirs()
        .iter()
        .filter_map(|dir| std::fs::read_dir(dir).ok())
        .flatten()
        .filter_map(|entry| {
            let path = entry.ok()?.path();
            if path.extension()? != "state" {
                return None;
            }
            let text = std::fs::read_to_string(&path).ok()?;
            let mount_point = text
                .lines()
                .find_map(|l| l.strip_prefix("mount_point="))
                .map(PathBuf::from)?;
            parse(&text, &mount_point)
        })
        .find(|record| {
            record.members.iter().any(|m| m == member)
                && record.is_alive()
                && matches!(
                    crate::fuse::mounts::mount_at(&record.mount_point),
                    Ok(Some(entry)) if crate::fuse::is_raidfs_mount(&entry)
                )
        })
}

pub fn remove(mount_point: &Path) {
    for dir in Env::current().run_dirs() {
        let _ = std::fs::remove_file(state_path_in(&dir, mount_point));
    }
}

/// Start time of process `pid` (field 22 of /proc/PID/stat), if it exists
/// and is running: a zombie (exited, not yet reaped, which is what a killed
/// daemon stays as under a PID 1 that does not reap) counts as gone.
pub fn process_start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    running_start_time(&stat)
}

fn running_start_time(stat: &str) -> Option<u64> {
    let (state, start) = parse_stat(stat)?;
    (state != "Z" && state != "X").then_some(start)
}

/// State letter and start time of process `pid`, zombies included.
fn process_state(pid: u32) -> Option<(String, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(&stat)
}

fn parse_stat(stat: &str) -> Option<(String, u64)> {
    // The command name (field 2) may contain spaces and parentheses.
    let mut fields = stat[stat.rfind(')')? + 1..].split_whitespace();
    let state = fields.next()?.to_string();
    // Field 22 overall; `state` was field 3.
    let start = fields.nth(18)?.parse().ok()?;
    Some((state, start))
}

impl DaemonRecord {
    /// A record for this process.
    pub fn for_self(mount_point: &Path, log: Option<PathBuf>) -> DaemonRecord {
        let pid = std::process::id();
        DaemonRecord {
            pid,
            start_time: process_start_time(pid).unwrap_or(0),
            mount_point: mount_point.to_path_buf(),
            log,
            watcher: None,
            error: None,
            members: Vec::new(),
        }
    }

    pub fn is_alive(&self) -> bool {
        match process_start_time(self.pid) {
            Some(start) => start == self.start_time,
            None => false,
        }
    }

    /// Wait until every thread of the daemon has exited; false on timeout.
    ///
    /// The thread-group leader turns zombie as soon as it dies, while other
    /// threads (a worker in the middle of member I/O) may still be exiting
    /// and holding the member files, and with them their locks. A pidfd
    /// becomes readable only once the whole thread group is gone, which is
    /// the moment another process can assemble the members.
    pub fn wait_for_exit(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
        let pidfd =
            unsafe { libc::syscall(libc::SYS_pidfd_open, self.pid as libc::pid_t, 0) } as i32;
        if pidfd < 0 {
            // Gone already (ESRCH), or a kernel without pidfds: fall back to
            // the process table, which cannot see threads still exiting.
            while self.is_alive() {
                if Instant::now() >= deadline {
                    return false;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            return true;
        }
        // The pid is ours to wait on only if it is still the daemon (checked
        // after the pidfd pins it, so it cannot be reused in between).
        let same_process =
            process_state(self.pid).is_some_and(|(_, start)| start == self.start_time);
        let mut exited = !same_process;
        while !exited {
            let left = deadline.saturating_duration_since(Instant::now());
            let mut pfd = libc::pollfd {
                fd: pidfd,
                events: libc::POLLIN,
                revents: 0,
            };
            let ms = left.as_millis().min(i32::MAX as u128) as i32;
            // SAFETY: pfd is a valid pollfd for the duration of the call.
            let n = unsafe { libc::poll(&mut pfd, 1, ms) };
            if n > 0 {
                exited = true;
            } else if n == 0 || io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
                break;
            }
        }
        // SAFETY: pidfd is an fd we own.
        unsafe { libc::close(pidfd) };
        exited
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_through_text() {
        let rec = DaemonRecord {
            pid: 42,
            start_time: 777,
            mount_point: PathBuf::from("/mnt/x"),
            log: Some(PathBuf::from("/var/log/raidfs/x.log")),
            watcher: Some(43),
            error: Some("boom".into()),
            members: vec![PathBuf::from("/m/a.img"), PathBuf::from("/m/b.img")],
        };
        let text = "pid=42\nstart_time=777\nmount_point=/mnt/x\nlog=/var/log/raidfs/x.log\nwatcher=43\nerror=boom\nmember=/m/a.img\nmember=/m/b.img\n";
        assert_eq!(parse(text, Path::new("/mnt/x")), Some(rec));
        assert_eq!(parse("garbage\n", Path::new("/mnt/x")), None);
    }

    #[test]
    fn zombies_are_not_alive() {
        let running = "12 (raid fs) S 1 12 12 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 4242 0 0";
        assert_eq!(running_start_time(running), Some(4242));
        let zombie = running.replace(") S ", ") Z ");
        assert_eq!(running_start_time(&zombie), None);
        assert_eq!(parse_stat(&zombie), Some(("Z".to_string(), 4242)));
    }

    #[test]
    fn this_process_is_alive_and_a_recycled_pid_is_not() {
        let me = DaemonRecord::for_self(Path::new("/mnt/x"), None);
        assert!(me.is_alive());
        let impostor = DaemonRecord {
            start_time: me.start_time + 1,
            ..me.clone()
        };
        assert!(!impostor.is_alive());
    }
}
