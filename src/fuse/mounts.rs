//! The kernel's view of mounts: reading `/proc/self/mountinfo` to tell
//! whether (and by what) a directory is mounted, and unmounting.

use std::ffi::{CString, OsString};
use std::io;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::process::Command;

/// One line of `/proc/self/mountinfo`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MountEntry {
    pub mount_point: PathBuf,
    /// `major:minor` of the mounted filesystem; identifies one FUSE connection.
    pub device: String,
    /// e.g. `fuse.raidfs`, `ext4`.
    pub fs_type: String,
    pub source: String,
}

/// The topmost mount at `path` (exactly), if any. `path` must be absolute
/// and normalised the way the kernel prints it (see [`absolute_lexical`]).
pub fn mount_at(path: &Path) -> io::Result<Option<MountEntry>> {
    let table = std::fs::read_to_string("/proc/self/mountinfo")?;
    Ok(parse_mountinfo(&table)
        .into_iter()
        .rfind(|entry| entry.mount_point == path))
}

/// Every mount in `/proc/self/mountinfo`, in table order.
pub fn all_mounts() -> io::Result<Vec<MountEntry>> {
    let table = std::fs::read_to_string("/proc/self/mountinfo")?;
    Ok(parse_mountinfo(&table))
}

fn parse_mountinfo(table: &str) -> Vec<MountEntry> {
    table.lines().filter_map(parse_mountinfo_line).collect()
}

fn parse_mountinfo_line(line: &str) -> Option<MountEntry> {
    let (before, after) = line.split_once(" - ")?;
    let fields: Vec<&str> = before.split(' ').collect();
    let device = fields.get(2)?.to_string();
    let mount_point = PathBuf::from(OsString::from_vec(unescape_octal(fields.get(4)?)));
    let mut rest = after.split(' ');
    let fs_type = rest.next()?.to_string();
    let source = String::from_utf8_lossy(&unescape_octal(rest.next()?)).into_owned();
    Some(MountEntry {
        mount_point,
        device,
        fs_type,
        source,
    })
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape_octal(field: &str) -> Vec<u8> {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 3 < bytes.len()
            && bytes[i + 1..i + 4]
                .iter()
                .all(|b| (b'0'..=b'7').contains(b))
        {
            let value = (bytes[i + 1] - b'0') as u32 * 64
                + (bytes[i + 2] - b'0') as u32 * 8
                + (bytes[i + 3] - b'0') as u32;
            out.push(value as u8);
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    out
}

/// `path` made absolute and normalised without touching it (so it works on a
/// dead FUSE mount, where stat fails with ENOTCONN): symlinks in the parent
/// are resolved when the parent can be canonicalised.
pub fn absolute_lexical(path: &Path) -> io::Result<PathBuf> {
    let absolute = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir()?.join(path)
    };
    let mut normal = PathBuf::from("/");
    for part in absolute.components() {
        match part {
            std::path::Component::ParentDir => {
                normal.pop();
            }
            std::path::Component::Normal(name) => normal.push(name),
            std::path::Component::RootDir
            | std::path::Component::CurDir
            | std::path::Component::Prefix(_) => {}
        }
    }
    if let (Some(parent), Some(name)) = (normal.parent(), normal.file_name()) {
        if let Ok(parent) = parent.canonicalize() {
            return Ok(parent.join(name));
        }
    }
    Ok(normal)
}

/// Unmount `path`: `umount2(path, 0)`, or with `lazy` detach it
/// (MNT_DETACH: gone from the namespace now, finished when the last open
/// file closes). Falls back to `fusermount3 -u` when not permitted (not root).
/// How long a busy mount point may stay busy before an unmount gives up.
const BUSY_GRACE: std::time::Duration = std::time::Duration::from_secs(3);

/// [`unmount`], retrying while the mount is busy for up to [`BUSY_GRACE`]:
/// an open file that is about to close (a process forked with a descriptor
/// on the mount, between its fork and exec; a scanner passing through)
/// should not fail the unmount. mdadm retries `--stop` for the same reason
/// (udev and blkid opening the device).
pub fn unmount_with_grace(path: &Path, lazy: bool) -> io::Result<()> {
    let deadline = std::time::Instant::now() + BUSY_GRACE;
    loop {
        match unmount(path, lazy) {
            Err(e)
                if e.raw_os_error() == Some(libc::EBUSY)
                    && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            other => return other,
        }
    }
}

pub fn unmount(path: &Path, lazy: bool) -> io::Result<()> {
    let c_path = CString::new(path.as_os_str().as_bytes()).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            "mount point contains a NUL byte",
        )
    })?;
    let flags = if lazy { libc::MNT_DETACH } else { 0 };
    // SAFETY: c_path is a valid NUL-terminated string for the call's duration.
    if unsafe { libc::umount2(c_path.as_ptr(), flags) } == 0 {
        return Ok(());
    }
    let err = io::Error::last_os_error();
    if err.raw_os_error() != Some(libc::EPERM) {
        return Err(err);
    }
    let mut cmd = Command::new("fusermount3");
    cmd.arg("-u");
    if lazy {
        cmd.arg("-z");
    }
    let output = cmd.arg(path).output().map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("umount2 was not permitted and fusermount3 could not run: {e}"),
        )
    })?;
    if output.status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "fusermount3 -u failed: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_lines_are_parsed_and_unescaped() {
        let table = "22 1 0:21 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n\
                     40 22 0:45 / /mnt/my\\040disk rw,nosuid,nodev - fuse.raidfs raidfs rw,user_id=0\n";
        let entries = parse_mountinfo(table);
        assert_eq!(entries.len(), 2);
        assert_eq!(entries[1].mount_point, PathBuf::from("/mnt/my disk"));
        assert_eq!(entries[1].device, "0:45");
        assert_eq!(entries[1].fs_type, "fuse.raidfs");
        assert_eq!(entries[1].source, "raidfs");
        assert_eq!(entries[0].fs_type, "ext4");
    }

    #[test]
    fn lexical_absolute_paths_drop_dots() {
        let p = absolute_lexical(Path::new("/nonexistent-raidfs/a/./b/../c")).unwrap();
        assert_eq!(p, PathBuf::from("/nonexistent-raidfs/a/c"));
    }

    #[test]
    fn root_is_a_mount_point() {
        let root = mount_at(Path::new("/")).unwrap();
        assert!(root.is_some());
    }
}
