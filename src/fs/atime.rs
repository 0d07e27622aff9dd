//! When a read updates a file's access time: the mount's atime mode, as
//! local filesystems apply it (`relatime` by default, `strictatime`,
//! `noatime`, and `nodiratime` for directories). FUSE leaves atime to the
//! filesystem, so without this a read never moved it.

use super::inode::{Inode, Time};

/// The mount's atime mode (`-o noatime|relatime|strictatime`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AtimeMode {
    /// Update when the atime is not later than the mtime or ctime, or is a
    /// day old (Linux's default since 2.6.30).
    #[default]
    Relative,
    /// Update on every access.
    Strict,
    /// Never update on access.
    Never,
}

/// A day, in seconds: relatime's longest wait.
const DAY: i64 = 24 * 60 * 60;

fn not_after(a: Time, b: Time) -> bool {
    (a.secs, a.nanos) <= (b.secs, b.nanos)
}

/// Whether an access at `now` moves the inode's atime under `mode`.
pub fn needs_update(mode: AtimeMode, inode: &Inode, now: Time) -> bool {
    match mode {
        AtimeMode::Never => false,
        AtimeMode::Strict => inode.atime != now,
        AtimeMode::Relative => {
            not_after(inode.atime, inode.mtime)
                || not_after(inode.atime, inode.ctime)
                || now.secs - inode.atime.secs >= DAY
        }
    }
}
