//! Where a mount keeps its files: the run directory (the daemon's state
//! file, control socket and saved limits), the log, and the damaged-data
//! log of each array (which must outlive a reboot, so not under /run).
//!
//! Root uses the system directories. A user cannot write those, and a
//! shared, world-writable fallback (`/tmp`) would let another user take a
//! predictable name first, so a user's files go under their own XDG base
//! directories: the run directory under `$XDG_RUNTIME_DIR` (the session's
//! own tmpfs), else under the state directory; the log under the state
//! directory (kept, as XDG intends for logs), else under `$XDG_RUNTIME_DIR`.
//! Every choice is a list of candidates, so that the one rule picks the
//! directory for writing and finds it again for reading.

use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

/// Root's run directory; other users look here too.
pub const SYSTEM_RUN_DIR: &str = "/run/raidfs/mounts";
/// Root's log directory, and where its logs go when /var cannot be written.
const SYSTEM_LOG_DIRS: [&str; 2] = ["/var/log/raidfs", "/run/raidfs/log"];
/// Root's persistent state: what must outlive a reboot (the damaged-data logs).
const SYSTEM_STATE_DIR: &str = "/var/lib/raidfs";
/// The last components of every run directory a user gets: how a listing
/// of bound sockets tells raidfs control sockets from others.
pub const RUN_DIR_TAIL: &str = "raidfs/mounts";

/// What the choice depends on: who runs it and their XDG variables.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Env {
    pub uid: u32,
    /// `$RAIDFS_RUN_DIR`: overrides the run directory for everyone.
    pub run_dir: Option<PathBuf>,
    pub runtime_dir: Option<PathBuf>,
    pub state_home: Option<PathBuf>,
    pub home: Option<PathBuf>,
}

impl Env {
    /// This process's view. Relative XDG paths are ignored, as the XDG
    /// base directory specification asks.
    pub fn current() -> Env {
        let absolute = |name: &str| {
            std::env::var_os(name)
                .map(PathBuf::from)
                .filter(|p| p.is_absolute())
        };
        Env {
            // SAFETY: geteuid has no preconditions and cannot fail.
            uid: unsafe { libc::geteuid() },
            run_dir: absolute("RAIDFS_RUN_DIR"),
            runtime_dir: absolute("XDG_RUNTIME_DIR"),
            state_home: absolute("XDG_STATE_HOME"),
            home: absolute("HOME"),
        }
    }

    /// `$XDG_STATE_HOME/raidfs`, by default `~/.local/state/raidfs`.
    fn state_dir(&self) -> Option<PathBuf> {
        let base = match (&self.state_home, &self.home) {
            (Some(state), _) => state.clone(),
            (None, Some(home)) => home.join(".local/state"),
            (None, None) => return None,
        };
        Some(base.join("raidfs"))
    }

    /// Run directories in order of preference.
    pub fn run_dirs(&self) -> Vec<PathBuf> {
        if let Some(dir) = &self.run_dir {
            return vec![dir.clone()];
        }
        if self.uid == 0 {
            return vec![PathBuf::from(SYSTEM_RUN_DIR)];
        }
        let runtime = self.runtime_dir.as_ref().map(|d| d.join(RUN_DIR_TAIL));
        let state = self.state_dir().map(|d| d.join("mounts"));
        runtime.into_iter().chain(state).collect()
    }

    /// Where the damaged-data log of the array `uuid` is kept (see
    /// `crate::fs::damaged`): under /var/lib/raidfs for root, the state
    /// directory for a user; None when a user has neither XDG_STATE_HOME
    /// nor HOME.
    pub fn damaged_log(&self, uuid: &str) -> Option<PathBuf> {
        let dir = if self.uid == 0 {
            PathBuf::from(SYSTEM_STATE_DIR)
        } else {
            self.state_dir()?
        };
        Some(dir.join("damaged").join(format!("{uuid}.json")))
    }

    /// Log directories in order of preference.
    pub fn log_dirs(&self) -> Vec<PathBuf> {
        if self.uid == 0 {
            return SYSTEM_LOG_DIRS.iter().map(PathBuf::from).collect();
        }
        let state = self.state_dir().map(|d| d.join("log"));
        let runtime = self.runtime_dir.as_ref().map(|d| d.join("raidfs/log"));
        state.into_iter().chain(runtime).collect()
    }

    /// Why a directory cannot hold this user's files, if it cannot: it must
    /// be a directory they can write and (unless root) their own, so that
    /// nobody else can replace what they put there.
    fn unusable(&self, dir: &Path) -> Option<String> {
        let meta = match std::fs::metadata(dir) {
            Ok(meta) => meta,
            Err(e) => return Some(e.to_string()),
        };
        if !meta.is_dir() {
            return Some("not a directory".into());
        }
        if self.uid != 0 && meta.uid() != self.uid {
            return Some(format!(
                "owned by uid {}, not by uid {}",
                meta.uid(),
                self.uid
            ));
        }
        writable(dir).err().map(|e| e.to_string())
    }

    /// Create `dir` if need be (private to the user unless root, whose
    /// run directory others may list), then check it.
    fn ensure(&self, dir: &Path) -> Option<String> {
        let mode = if self.uid == 0 { 0o755 } else { 0o700 };
        if let Err(e) = std::fs::DirBuilder::new()
            .recursive(true)
            .mode(mode)
            .create(dir)
        {
            return Some(e.to_string());
        }
        self.unusable(dir)
    }

    /// The run directory now in use: the first candidate that is usable,
    /// else the first one (where [`Env::ensure_run_dir`] would make it).
    /// Nothing is created, so reading never leaves directories behind.
    pub fn run_dir(&self) -> PathBuf {
        let dirs = self.run_dirs();
        dirs.iter()
            .find(|d| self.unusable(d).is_none())
            .or(dirs.first())
            .cloned()
            // Nowhere of the user's own: the system directory, which a
            // mount refuses ahead (ensure_run_dir) and where reads find
            // nothing of theirs.
            .unwrap_or_else(|| PathBuf::from(SYSTEM_RUN_DIR))
    }

    /// The run directory to write in, created if need be; an error names
    /// every candidate and why it failed.
    pub fn ensure_run_dir(&self) -> Result<PathBuf, String> {
        let mut refused = Vec::new();
        for dir in self.run_dirs() {
            match self.ensure(&dir) {
                None => return Ok(dir),
                Some(why) => refused.push(format!("{}: {why}", dir.display())),
            }
        }
        Err(nowhere(
            "the mount's state file and control socket",
            refused,
            "set XDG_RUNTIME_DIR or RAIDFS_RUN_DIR to a directory of yours",
        ))
    }

    /// The log named `name` (see [`log_name`]): in the first log directory
    /// that can be made and where the log can be opened for appending.
    pub fn log_path(&self, name: &str) -> Result<PathBuf, String> {
        let mut refused = Vec::new();
        for dir in self.log_dirs() {
            let path = dir.join(name);
            let opened = match self.ensure(&dir) {
                Some(why) => Err(why),
                None => std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&path)
                    .map(drop)
                    .map_err(|e| e.to_string()),
            };
            match opened {
                Ok(()) => return Ok(path),
                Err(why) => refused.push(format!("{}: {why}", path.display())),
            }
        }
        Err(nowhere(
            "the mount's log",
            refused,
            "give one with -o log=PATH",
        ))
    }
}

fn nowhere(what: &str, refused: Vec<String>, hint: &str) -> String {
    if refused.is_empty() {
        return format!(
            "no directory for {what}: XDG_RUNTIME_DIR, XDG_STATE_HOME and HOME are all unset ({hint})"
        );
    }
    format!("no directory for {what}: {} ({hint})", refused.join("; "))
}

/// Whether this process may create files in `dir`, judged by its
/// effective ids as the files made afterwards will be.
fn writable(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c_path = std::ffi::CString::new(dir.as_os_str().as_bytes()).map_err(|_| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "the path holds a NUL byte",
        )
    })?;
    // SAFETY: c_path is NUL-terminated; faccessat only reads it.
    let rc = unsafe {
        libc::faccessat(
            libc::AT_FDCWD,
            c_path.as_ptr(),
            libc::W_OK | libc::X_OK,
            libc::AT_EACCESS,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// The name of a mount's run-directory files: its whole mount point,
/// systemd-style (`/` becomes `-`, anything unusual `\xNN`), so no two
/// mounts share one.
pub fn mount_file_stem(path: &Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    let bytes = path.as_os_str().as_bytes();
    let trimmed = bytes.strip_prefix(b"/").unwrap_or(bytes);
    let mut out = escaped(trimmed);
    if out.is_empty() {
        out.push('-');
    }
    out
}

/// `bytes` with `/` as `-` and anything but letters, digits, `_` and `.`
/// as `\xNN`.
fn escaped(bytes: &[u8]) -> String {
    let mut out = String::new();
    for &b in bytes {
        match b {
            b'/' => out.push('-'),
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'_' | b'.' => out.push(b as char),
            _ => out.push_str(&format!("\\x{b:02x}")),
        }
    }
    out
}

/// The log file name of an array: its name and the first 8 hex digits of
/// its UUID (`home-9cf61be9.log`), or its whole UUID when it has no name.
/// Named by the array, not the mount point, so an array keeps its log
/// wherever it is mounted and two arrays never share one; the UUID digits
/// keep apart two arrays given the same name.
pub fn log_name(name: &str, uuid: uuid::Uuid) -> String {
    let uuid = uuid.hyphenated().to_string();
    if name.is_empty() {
        format!("{uuid}.log")
    } else {
        format!("{}-{}.log", escaped(name.as_bytes()), &uuid[..8])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(runtime: Option<&str>, state: Option<&str>, home: Option<&str>) -> Env {
        Env {
            uid: 1000,
            run_dir: None,
            runtime_dir: runtime.map(PathBuf::from),
            state_home: state.map(PathBuf::from),
            home: home.map(PathBuf::from),
        }
    }

    fn paths(list: &[&str]) -> Vec<PathBuf> {
        list.iter().map(PathBuf::from).collect()
    }

    #[test]
    fn mount_points_escape_to_flat_names() {
        assert_eq!(mount_file_stem(Path::new("/mnt/data")), "mnt-data");
        assert_eq!(
            mount_file_stem(Path::new("/mnt/my disk")),
            "mnt-my\\x20disk"
        );
        assert_eq!(mount_file_stem(Path::new("/a-b")), "a\\x2db");
        assert_eq!(mount_file_stem(Path::new("/")), "-");
    }

    #[test]
    fn logs_are_named_by_the_array() {
        let uuid = uuid::Uuid::parse_str("9cf61be9-5058-4d46-b508-521058ab4f25").unwrap();
        assert_eq!(log_name("home", uuid), "home-9cf61be9.log");
        assert_eq!(
            log_name("", uuid),
            "9cf61be9-5058-4d46-b508-521058ab4f25.log"
        );
        assert_eq!(log_name("a/b c", uuid), "a-b\\x20c-9cf61be9.log");
    }

    #[test]
    fn root_uses_the_system_directories() {
        let root = Env {
            uid: 0,
            home: Some("/root".into()),
            runtime_dir: Some("/run/user/0".into()),
            ..Env::default()
        };
        assert_eq!(root.run_dirs(), paths(&["/run/raidfs/mounts"]));
        assert_eq!(
            root.log_dirs(),
            paths(&["/var/log/raidfs", "/run/raidfs/log"])
        );
    }

    #[test]
    fn damaged_data_logs_outlive_a_reboot() {
        let root = Env {
            uid: 0,
            ..Env::default()
        };
        assert_eq!(
            root.damaged_log("u-1"),
            Some(PathBuf::from("/var/lib/raidfs/damaged/u-1.json"))
        );
        let env = user(Some("/run/user/1000"), None, Some("/home/u"));
        assert_eq!(
            env.damaged_log("u-1"),
            Some(PathBuf::from(
                "/home/u/.local/state/raidfs/damaged/u-1.json"
            ))
        );
        assert_eq!(
            user(Some("/run/user/1000"), None, None).damaged_log("u-1"),
            None
        );
    }

    #[test]
    fn a_user_prefers_the_runtime_directory_for_sockets_and_state_for_logs() {
        let env = user(Some("/run/user/1000"), None, Some("/home/u"));
        assert_eq!(
            env.run_dirs(),
            paths(&[
                "/run/user/1000/raidfs/mounts",
                "/home/u/.local/state/raidfs/mounts"
            ])
        );
        assert_eq!(
            env.log_dirs(),
            paths(&[
                "/home/u/.local/state/raidfs/log",
                "/run/user/1000/raidfs/log"
            ])
        );
    }

    #[test]
    fn without_a_runtime_directory_the_state_directory_serves() {
        let env = user(None, Some("/data/state"), Some("/home/u"));
        assert_eq!(env.run_dirs(), paths(&["/data/state/raidfs/mounts"]));
        assert_eq!(env.log_dirs(), paths(&["/data/state/raidfs/log"]));
        let bare = user(None, None, None);
        assert!(bare.run_dirs().is_empty());
        let err = bare.ensure_run_dir().unwrap_err();
        assert!(
            err.contains("XDG_RUNTIME_DIR, XDG_STATE_HOME and HOME are all unset"),
            "{err}"
        );
    }

    #[test]
    fn the_override_wins_for_everyone() {
        let env = Env {
            run_dir: Some("/srv/run".into()),
            ..user(Some("/run/user/1000"), None, Some("/home/u"))
        };
        assert_eq!(env.run_dirs(), paths(&["/srv/run"]));
    }

    #[test]
    fn a_directory_someone_else_owns_is_passed_over_with_the_reason() {
        let dir = tempfile::tempdir().unwrap();
        let mine = tempfile::tempdir().unwrap();
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        let stranger = Env {
            uid: me.wrapping_add(1).max(1),
            run_dir: Some(dir.path().to_path_buf()),
            ..Env::default()
        };
        let err = stranger.ensure_run_dir().unwrap_err();
        assert!(err.contains(&format!("owned by uid {me}")), "{err}");
        let owner = Env {
            uid: me,
            run_dir: Some(mine.path().join("raidfs/mounts")),
            ..Env::default()
        };
        assert_eq!(owner.run_dir(), mine.path().join("raidfs/mounts"));
        let made = owner.ensure_run_dir().unwrap();
        assert_eq!(made, mine.path().join("raidfs/mounts"));
        assert!(made.is_dir());
    }
}
