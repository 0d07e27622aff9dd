//! `mount -o remount,...` of a live raidfs mount. raidfs mounts have type
//! `fuse.raidfs`, so mount(8) hands a remount to `mount.fuse.raidfs`
//! rather than making the system call itself; the helper comes here.
//!
//! `ro` and `rw` change both halves: the kernel's superblock flag (which
//! makes the kernel refuse writes, and which it refuses to set while a
//! file is open for writing) and the daemon's filesystem, told over the
//! control socket to commit and stop taking changes, or to take them
//! again. The per-mount flags (`nosuid`, `noexec`, ...) change with the
//! same system call. What the daemon fixed at mount time (threads, caches,
//! the atime mode raidfs applies itself) does not change; options naming
//! those are accepted, as mount(8) passes the fstab line's options along,
//! and left as they are.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use super::options::{self, VfsFlags};
use crate::control::Request;
use crate::fuse::{is_raidfs_mount, mounts};

/// The per-mount atime flags: raidfs applies the atime mode it was
/// mounted with itself, so a remount cannot change them.
const ATIME_FLAGS: u64 =
    libc::MS_NOATIME | libc::MS_RELATIME | libc::MS_STRICTATIME | libc::MS_NODIRATIME;

/// Whether mount(8) asks for a remount.
pub fn is_remount(lists: &[String]) -> bool {
    lists
        .iter()
        .flat_map(|l| l.split(','))
        .any(|o| o.trim() == "remount")
}

/// What a remount asks for.
#[derive(Debug, PartialEq, Eq)]
pub struct RemountRequest {
    /// `ro` or `rw`, the last one given; `None` keeps the current mode.
    pub read_only: Option<bool>,
    pub vfs: VfsFlags,
}

/// Options of the kernel's FUSE connection, which mount(8) copies from the
/// mount table into a remount's option list; they are the connection's and
/// cannot change.
const FUSE_CONNECTION_OPTIONS: [&str; 5] =
    ["user_id", "group_id", "rootmode", "max_read", "blksize"];

fn is_connection_option(option: &str) -> bool {
    option
        .split_once('=')
        .is_some_and(|(key, _)| FUSE_CONNECTION_OPTIONS.contains(&key))
}

pub fn parse(lists: &[String]) -> Result<RemountRequest, String> {
    let rest: Vec<String> = lists
        .iter()
        .flat_map(|l| l.split(','))
        .map(str::trim)
        .filter(|o| !o.is_empty() && *o != "remount" && !is_connection_option(o))
        .map(str::to_string)
        .collect();
    let read_only = rest.iter().rev().find_map(|o| match o.as_str() {
        "ro" => Some(true),
        "rw" => Some(false),
        _ => None,
    });
    let parsed = options::parse(&[rest.join(",")])?;
    Ok(RemountRequest {
        read_only,
        vfs: parsed.vfs,
    })
}

/// The mount flags a remount of a mount that has `current` should pass.
pub fn wanted_flags(request: &RemountRequest, current: u64) -> Result<u64, String> {
    let read_only = request.read_only.unwrap_or(current & libc::MS_RDONLY != 0);
    let mut wanted = request.vfs.applied_to(current) & !libc::MS_RDONLY;
    if read_only {
        wanted |= libc::MS_RDONLY;
    }
    if (wanted ^ current) & ATIME_FLAGS != 0 {
        return Err(
            "raidfs applies the atime mode (noatime, relatime, strictatime, nodiratime) it was mounted with; unmount and mount again to change it".into(),
        );
    }
    Ok(wanted)
}

pub fn run(dir: &Path, lists: &[String], fake: bool, verbose: bool) -> Result<(), String> {
    let shown = dir.display();
    let path = mounts::absolute_lexical(dir).map_err(|e| format!("{shown}: {e}"))?;
    let entry = mounts::mount_at(&path)
        .map_err(|e| format!("reading /proc/self/mountinfo: {e}"))?
        .ok_or_else(|| format!("remount: {shown} is not mounted"))?;
    if !is_raidfs_mount(&entry) {
        return Err(format!(
            "remount: {shown} is not a raidfs mount (it is {})",
            entry.fs_type
        ));
    }
    let request = parse(lists)?;
    let current = options::current_mount_flags(&path)?;
    let wanted = wanted_flags(&request, current)?;
    let was_ro = current & libc::MS_RDONLY != 0;
    let want_ro = wanted & libc::MS_RDONLY != 0;
    if verbose || fake {
        eprintln!(
            "mount.raidfs: remount {shown} {} (mount flags {current:#x} -> {wanted:#x})",
            if want_ro { "read-only" } else { "read-write" }
        );
    }
    if fake {
        return Ok(());
    }
    match (was_ro, want_ro) {
        (false, true) => {
            // The kernel first: it refuses while a file is open for
            // writing, and once it has flushed the page cache the daemon
            // commits everything that reached it.
            kernel_remount(&path, wanted)?;
            if let Err(msg) = tell_daemon(&path, true) {
                if let Err(undo) = kernel_remount(&path, wanted & !libc::MS_RDONLY) {
                    eprintln!("mount.raidfs: {shown} stays read-only in the kernel: {undo}");
                }
                return Err(msg);
            }
        }
        (true, false) => {
            tell_daemon(&path, false)?;
            if let Err(msg) = kernel_remount(&path, wanted) {
                if let Err(undo) = tell_daemon(&path, true) {
                    eprintln!("mount.raidfs: {shown}: {undo}");
                }
                return Err(msg);
            }
        }
        _ if wanted != current => kernel_remount(&path, wanted)?,
        _ => {}
    }
    Ok(())
}

/// `mount(2)` with `MS_REMOUNT`: the superblock's read-only flag and this
/// mount's flags, together, as mount(8) does for a kernel filesystem.
fn kernel_remount(path: &Path, flags: u64) -> Result<(), String> {
    let shown = path.display();
    let c_path =
        CString::new(path.as_os_str().as_bytes()).map_err(|_| format!("{shown}: NUL in path"))?;
    // SAFETY: c_path is NUL-terminated; a remount reads no source, type or data.
    let rc = unsafe {
        libc::mount(
            std::ptr::null(),
            c_path.as_ptr(),
            std::ptr::null(),
            libc::MS_REMOUNT | flags,
            std::ptr::null(),
        )
    };
    if rc == 0 {
        return Ok(());
    }
    let err = std::io::Error::last_os_error();
    Err(match err.raw_os_error() {
        Some(libc::EBUSY) if flags & libc::MS_RDONLY != 0 => {
            format!("remount: {shown} is busy: a file is open for writing there")
        }
        Some(libc::EPERM) => {
            format!("remount: {shown}: only root may remount (the kernel said: {err})")
        }
        _ => format!("remount of {shown}: {err}"),
    })
}

fn tell_daemon(path: &Path, read_only: bool) -> Result<(), String> {
    let mut client = crate::cli::status::connect(path)?;
    let response = client
        .request(&Request::Remount { read_only })
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if response.ok {
        Ok(())
    } else {
        Err(format!(
            "remount: the daemon of {} refused: {}",
            path.display(),
            response.error.unwrap_or_else(|| "no reason given".into())
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(s: &str) -> Vec<String> {
        vec![s.to_string()]
    }

    const FUSE_DEFAULT: u64 = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_RELATIME;

    #[test]
    fn remount_is_spotted_among_the_options() {
        assert!(is_remount(&list("rw,remount,ro")));
        assert!(is_remount(&["defaults".into(), "remount".into()]));
        assert!(!is_remount(&list("ro,noexec")));
    }

    #[test]
    fn the_last_of_ro_and_rw_wins_and_flags_are_kept() {
        let ro = parse(&list("remount,rw,ro")).unwrap();
        assert_eq!(ro.read_only, Some(true));
        assert_eq!(
            wanted_flags(&ro, FUSE_DEFAULT).unwrap(),
            FUSE_DEFAULT | libc::MS_RDONLY
        );
        let rw = parse(&list("remount,rw")).unwrap();
        assert_eq!(
            wanted_flags(&rw, FUSE_DEFAULT | libc::MS_RDONLY).unwrap(),
            FUSE_DEFAULT
        );
        let keep = parse(&list("remount,noexec")).unwrap();
        assert_eq!(keep.read_only, None);
        assert_eq!(
            wanted_flags(&keep, FUSE_DEFAULT | libc::MS_RDONLY).unwrap(),
            FUSE_DEFAULT | libc::MS_RDONLY | libc::MS_NOEXEC
        );
    }

    #[test]
    fn fstab_options_pass_but_the_atime_mode_cannot_change() {
        let fstab = parse(&list("remount,ro,defaults,threads=8,x-systemd.foo=1")).unwrap();
        assert_eq!(fstab.read_only, Some(true));
        // What mount(8) copies from the mount table.
        let table = parse(&list(
            "rw,nosuid,nodev,relatime,user_id=0,group_id=0,remount,ro",
        ))
        .unwrap();
        assert_eq!(table.read_only, Some(true));
        assert!(parse(&list("remount,user_id")).is_err());
        let noatime = parse(&list("remount,noatime")).unwrap();
        let err = wanted_flags(&noatime, FUSE_DEFAULT).unwrap_err();
        assert!(err.contains("atime"), "{err}");
        let same = parse(&list("remount,relatime")).unwrap();
        assert_eq!(wanted_flags(&same, FUSE_DEFAULT).unwrap(), FUSE_DEFAULT);
        assert!(parse(&list("remount,bogus")).is_err());
    }
}
