//! Room on the host for sparse image files. An image file takes host
//! blocks only as the array writes to it, so a host filesystem smaller than
//! its images fills up later, in the middle of ordinary writes (ENOSPC).
//! `create` measures this up front, per host filesystem, to warn or, with
//! `--preallocate`, to refuse before anything is written.

use std::collections::BTreeMap;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// One image file: where it is (or will be) and how large it is.
pub struct Image {
    pub path: PathBuf,
    pub size: u64,
}

/// A host filesystem that cannot hold its images at full size.
#[derive(Debug)]
pub struct Shortfall {
    /// Where that filesystem is mounted.
    pub mount_point: PathBuf,
    /// Bytes an unprivileged writer may still use there.
    pub free: u64,
    /// The images' full sizes added up.
    pub full: u64,
    /// What they still need beyond the blocks they already have.
    pub need: u64,
    pub images: usize,
}

impl Shortfall {
    /// The warning `create` prints without `--preallocate`.
    pub fn warning(&self) -> String {
        let already = if self.need < self.full {
            format!(" ({} more than they take now)", size(self.need))
        } else {
            String::new()
        };
        format!(
            "{} has {} free but {} can grow to {}{already}; when it fills, writes fail with ENOSPC (use --preallocate to reserve the space now)",
            self.mount_point.display(),
            size(self.free),
            self.what("sparse "),
            size(self.full),
        )
    }

    /// "the sparse image" or "the 3 sparse images".
    fn what(&self, kind: &str) -> String {
        match self.images {
            1 => format!("the {kind}image"),
            n => format!("the {n} {kind}images"),
        }
    }

    /// The refusal of `--preallocate`.
    pub fn refusal(&self) -> String {
        format!(
            "--preallocate needs {} on {} for {} but it has {} free",
            size(self.need),
            self.mount_point.display(),
            self.what(""),
            size(self.free)
        )
    }
}

/// Bytes in MiB (GiB from 10 GiB up), as a person reads them.
fn size(bytes: u64) -> String {
    if bytes >= 10 << 30 {
        format!("{:.1} GiB", bytes as f64 / (1u64 << 30) as f64)
    } else {
        format!("{} MiB", bytes >> 20)
    }
}

/// The host filesystems among `images` that lack room for them at full
/// size. An image that exists counts only the blocks it does not have yet;
/// one that does not is measured at the directory it will be made in.
pub fn shortfalls(images: &[Image]) -> std::io::Result<Vec<Shortfall>> {
    // Keyed by device: every image on one filesystem shares its free space.
    let mut by_fs: BTreeMap<u64, (PathBuf, u64, u64, usize)> = BTreeMap::new();
    for image in images {
        let (dir, dev, have) = match std::fs::metadata(&image.path) {
            Ok(meta) => (
                parent_dir(&image.path),
                meta.dev(),
                meta.blocks().saturating_mul(512),
            ),
            Err(_) => {
                let dir = parent_dir(&image.path);
                let meta = std::fs::metadata(&dir).map_err(|e| {
                    std::io::Error::new(e.kind(), format!("{}: {e}", dir.display()))
                })?;
                (dir, meta.dev(), 0)
            }
        };
        let entry = by_fs.entry(dev).or_insert((dir, 0, 0, 0));
        entry.1 += image.size;
        entry.2 += image.size.saturating_sub(have);
        entry.3 += 1;
    }
    let mut short = Vec::new();
    for (dir, full, need, count) in by_fs.into_values() {
        let free = free_bytes(&dir)?;
        if need > free {
            short.push(Shortfall {
                mount_point: mount_point_of(&dir),
                free,
                full,
                need,
                images: count,
            });
        }
    }
    Ok(short)
}

/// The directory an image is (or will be) in.
fn parent_dir(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// `statvfs`: blocks available to unprivileged users times the fragment size.
fn free_bytes(dir: &Path) -> std::io::Result<u64> {
    let c_path = std::ffi::CString::new(dir.as_os_str().as_bytes()).map_err(|_| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{}: NUL in path", dir.display()),
        )
    })?;
    // SAFETY: statvfs is plain old data; zeroed is a valid value to overwrite.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: c_path is NUL-terminated and st points at a statvfs.
    if unsafe { libc::statvfs(c_path.as_ptr(), &mut st) } != 0 {
        let e = std::io::Error::last_os_error();
        return Err(std::io::Error::new(
            e.kind(),
            format!("{}: statvfs: {e}", dir.display()),
        ));
    }
    Ok(crate::member::file::available_bytes(&st))
}

/// The mount point of the filesystem holding `dir`: the last directory up
/// the tree on the same device. Falls back to `dir` itself.
fn mount_point_of(dir: &Path) -> PathBuf {
    let Ok(mut at) = dir.canonicalize() else {
        return dir.to_path_buf();
    };
    let Ok(dev) = std::fs::metadata(&at).map(|m| m.dev()) else {
        return at;
    };
    while let Some(parent) = at.parent() {
        match std::fs::metadata(parent) {
            Ok(meta) if meta.dev() == dev => at = parent.to_path_buf(),
            _ => break,
        }
    }
    at
}
