//! A second mount of an array that is already mounted: a bind mount of the
//! first one, as the kernel gives a block device's filesystem mounted on a
//! second directory (one superblock, two mounts). The array is assembled
//! once and its daemon serves both; it closes the array when the last of
//! them is unmounted.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use super::options::{self, MountOptions};
use super::registry;
use crate::fuse::mounts;

/// The mount point of the live mount that serves any of `members`.
pub fn existing_mount(members: &[PathBuf]) -> Option<PathBuf> {
    members
        .iter()
        .filter_map(|m| {
            if crate::member::open::is_uri(m) {
                Some(m.clone())
            } else {
                m.canonicalize().ok()
            }
        })
        .find_map(|m| registry::serving(&m))
        .map(|daemon| daemon.mount_point)
}

/// Bind `existing` onto `dir`, then give the new mount the per-mount flags
/// the options ask for (`ro` there makes only this mount read-only).
pub fn bind(existing: &Path, dir: &Path, opts: &MountOptions) -> Result<(), String> {
    let shown = dir.display();
    let target = mounts::absolute_lexical(dir).map_err(|e| format!("{shown}: {e}"))?;
    if let Some(entry) =
        mounts::mount_at(&target).map_err(|e| format!("reading /proc/self/mountinfo: {e}"))?
    {
        return Err(format!(
            "mount point {shown} is busy: {} is mounted there",
            entry.fs_type
        ));
    }
    let c = |p: &Path| {
        CString::new(p.as_os_str().as_bytes()).map_err(|_| format!("{}: NUL in path", p.display()))
    };
    let (c_source, c_target) = (c(existing)?, c(&target)?);
    // SAFETY: both paths are NUL-terminated; a bind mount reads no type or data.
    let rc = unsafe {
        libc::mount(
            c_source.as_ptr(),
            c_target.as_ptr(),
            std::ptr::null(),
            libc::MS_BIND,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        return Err(format!(
            "binding the mount of this array at {} onto {shown}: {}",
            existing.display(),
            std::io::Error::last_os_error()
        ));
    }
    let mut flags = opts.vfs;
    if opts.fuse.read_only {
        flags.set |= libc::MS_RDONLY;
    }
    if let Err(msg) = options::apply_vfs_flags(&target, flags) {
        // A mount asked to be read-only or noexec must not stay up without it.
        if let Err(e) = mounts::unmount(&target, true) {
            eprintln!("mount.raidfs: {shown}: {e}");
        }
        return Err(msg);
    }
    Ok(())
}
