//! Translations between the filesystem layer's types and FUSE's: errors to
//! errnos, attributes, file kinds, times, and the caller of a request.

use std::time::Duration;

use fuser::{Errno, FileAttr, FileType, INodeNo, Request, TimeOrNow};

use crate::fs::{Attr, Caller, FileKind, FsError, StoreError, TimeSet};

/// The errno the kernel reports for `err`. One exhaustive match (no wildcard)
/// so that a new error variant cannot be added without choosing its errno.
pub fn errno_of(err: &FsError) -> Errno {
    let code = match err {
        FsError::NotFound => libc::ENOENT,
        FsError::Exists => libc::EEXIST,
        FsError::NotDir => libc::ENOTDIR,
        FsError::IsDir => libc::EISDIR,
        FsError::NotEmpty => libc::ENOTEMPTY,
        FsError::Access => libc::EACCES,
        FsError::Perm => libc::EPERM,
        FsError::Invalid(_) => libc::EINVAL,
        FsError::NameTooLong => libc::ENAMETOOLONG,
        FsError::NoSpace => libc::ENOSPC,
        FsError::NoAttr => libc::ENODATA,
        FsError::Range => libc::ERANGE,
        FsError::TooManyLinks => libc::EMLINK,
        FsError::ReadOnly => libc::EROFS,
        FsError::TooBig => libc::EFBIG,
        FsError::Unsupported(_) => libc::EOPNOTSUPP,
        FsError::Stale => libc::ESTALE,
        FsError::PastEnd => libc::ENXIO,
        // ext4 and XFS report detected corruption as EUCLEAN ("structure needs cleaning").
        FsError::Corrupt(_) => libc::EUCLEAN,
        // Only opening a filesystem reports it (never an operation): one
        // with a feature this raidfs does not implement.
        FsError::Feature(_) => libc::EOPNOTSUPP,
        FsError::Store(store) => match store {
            StoreError::Io(_) => libc::EIO,
            StoreError::OutOfRange(_) => libc::EIO,
            StoreError::NoSpace => libc::ENOSPC,
            StoreError::Unrecoverable(_) => libc::EIO,
            StoreError::ReadOnly(_) => libc::EROFS,
            StoreError::HostNoSpace(_) => libc::ENOSPC,
            StoreError::HostFault {
                read_only: true, ..
            } => libc::EROFS,
            StoreError::HostFault {
                read_only: false, ..
            } => libc::EIO,
        },
    };
    Errno::from_i32(code)
}

/// Whether an error means something is wrong with the array or the
/// metadata (worth an error-level log line) rather than with the request.
pub fn is_serious(err: &FsError) -> bool {
    matches!(err, FsError::Corrupt(_) | FsError::Store(_))
}

pub fn file_type(kind: FileKind) -> FileType {
    match kind {
        FileKind::File => FileType::RegularFile,
        FileKind::Dir => FileType::Directory,
        FileKind::Symlink => FileType::Symlink,
        FileKind::Fifo => FileType::NamedPipe,
        FileKind::Socket => FileType::Socket,
        FileKind::CharDev => FileType::CharDevice,
        FileKind::BlockDev => FileType::BlockDevice,
    }
}

pub fn file_attr(attr: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(attr.ino),
        size: attr.size,
        blocks: attr.blocks,
        atime: attr.atime,
        mtime: attr.mtime,
        ctime: attr.ctime,
        crtime: attr.crtime,
        kind: file_type(attr.kind),
        perm: attr.perm,
        nlink: attr.nlink,
        uid: attr.uid,
        gid: attr.gid,
        rdev: attr.rdev,
        blksize: attr.blksize,
        flags: 0,
    }
}

pub fn time_set(time: TimeOrNow) -> TimeSet {
    match time {
        TimeOrNow::SpecificTime(at) => TimeSet::At(at),
        TimeOrNow::Now => TimeSet::Now,
    }
}

/// Attribute and entry cache lifetimes handed to the kernel.
#[derive(Clone, Copy, Debug)]
pub struct Ttls {
    pub attr: Duration,
    pub entry: Duration,
}

/// The caller of `req`. Supplementary groups come from `/proc/PID/status`
/// because FUSE sends only the fsuid/fsgid; they are skipped for root (who
/// passes every check anyway) and when `want_groups` is false.
pub fn caller_of(req: &Request, want_groups: bool) -> Caller {
    let uid = req.uid();
    let gid = req.gid();
    let groups = if want_groups && uid != 0 && req.pid() != 0 {
        supplementary_groups(req.pid())
    } else {
        Vec::new()
    };
    Caller { uid, gid, groups }
}

/// Supplementary groups of process `pid`; empty when it has already exited.
pub fn supplementary_groups(pid: u32) -> Vec<u32> {
    match std::fs::read_to_string(format!("/proc/{pid}/status")) {
        Ok(status) => parse_groups_line(&status),
        Err(_) => Vec::new(),
    }
}

fn parse_groups_line(status: &str) -> Vec<u32> {
    status
        .lines()
        .find_map(|line| line.strip_prefix("Groups:"))
        .map(|rest| {
            rest.split_whitespace()
                .filter_map(|g| g.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// What an open file handle remembers: the open(2) flags that change how
/// its requests are served. Stored in the FUSE file handle itself, so no
/// table is needed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HandleFlags(pub i32);

impl HandleFlags {
    pub fn from_handle(fh: u64) -> HandleFlags {
        HandleFlags(fh as u32 as i32)
    }
    pub fn handle(self) -> u64 {
        self.0 as u32 as u64
    }
    /// Opened for reading (O_RDONLY or O_RDWR).
    pub fn readable(self) -> bool {
        self.0 & libc::O_ACCMODE != libc::O_WRONLY
    }
    /// Opened for writing (O_WRONLY or O_RDWR).
    pub fn writable(self) -> bool {
        matches!(self.0 & libc::O_ACCMODE, libc::O_WRONLY | libc::O_RDWR)
    }
    pub fn direct(self) -> bool {
        self.0 & libc::O_DIRECT != 0
    }
    /// O_DSYNC or O_SYNC: every write must be durable before it returns.
    pub fn sync_writes(self) -> bool {
        self.0 & libc::O_DSYNC != 0
    }
    /// O_SYNC (which includes the O_DSYNC bit) also wants metadata durable.
    pub fn sync_metadata(self) -> bool {
        self.0 & libc::O_SYNC == libc::O_SYNC
    }
}

/// Whether a WRITE request must be made durable before it is answered, and
/// if so whether `datasync` suffices: `Some(datasync)` or `None`.
///
/// `handle` is what the file was opened with; `request` the flags the kernel
/// sent with this write (the open flags plus O_DSYNC/O_SYNC for an
/// RWF_DSYNC/RWF_SYNC write). Only writes through a direct-I/O handle
/// (FOPEN_DIRECT_IO, our O_DIRECT opens) are synced here: the kernel sends
/// the page-cache writes of synchronous files through `generic_write_sync`,
/// which follows them with an FSYNC request of its own, so syncing them here
/// too made every O_DSYNC write pay for two full syncs. Writes from the
/// kernel's writeback cache never carry a caller's sync flag.
pub fn write_sync(handle: HandleFlags, request: i32, from_cache: bool) -> Option<bool> {
    let wanted = HandleFlags(handle.0 | request);
    if from_cache || !handle.direct() || !wanted.sync_writes() {
        return None;
    }
    Some(!wanted.sync_metadata())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_line_is_parsed() {
        let status =
            "Name:\tbash\nUid:\t1000\t1000\t1000\t1000\nGroups:\t4 24 27 1000 \nNgid:\t0\n";
        assert_eq!(parse_groups_line(status), vec![4, 24, 27, 1000]);
        assert_eq!(parse_groups_line("Groups:\n"), Vec::<u32>::new());
        assert_eq!(parse_groups_line("Name:\tx\n"), Vec::<u32>::new());
    }

    #[test]
    fn handle_flags_round_trip_and_classify() {
        let flags = HandleFlags(libc::O_RDWR | libc::O_DIRECT | libc::O_DSYNC);
        let back = HandleFlags::from_handle(flags.handle());
        assert_eq!(back, flags);
        assert!(back.direct());
        assert!(back.sync_writes());
        assert!(!back.sync_metadata());
        let sync = HandleFlags(libc::O_WRONLY | libc::O_SYNC);
        assert!(sync.sync_writes() && sync.sync_metadata() && !sync.direct());
        assert!(!HandleFlags(libc::O_RDONLY).sync_writes());
        let access = |f| (HandleFlags(f).readable(), HandleFlags(f).writable());
        assert_eq!(access(libc::O_RDONLY), (true, false));
        assert_eq!(access(libc::O_WRONLY | libc::O_APPEND), (false, true));
        assert_eq!(access(libc::O_RDWR), (true, true));
    }

    #[test]
    fn only_direct_handles_are_synced_in_the_write() {
        let direct_dsync = HandleFlags(libc::O_WRONLY | libc::O_DIRECT | libc::O_DSYNC);
        assert_eq!(write_sync(direct_dsync, 0, false), Some(true));
        let direct_sync = HandleFlags(libc::O_WRONLY | libc::O_DIRECT | libc::O_SYNC);
        assert_eq!(write_sync(direct_sync, 0, false), Some(false));
        // RWF_DSYNC on a plain O_DIRECT handle arrives in the request's flags.
        let direct = HandleFlags(libc::O_WRONLY | libc::O_DIRECT);
        assert_eq!(write_sync(direct, libc::O_DSYNC, false), Some(true));
        assert_eq!(write_sync(direct, 0, false), None);
        // Page-cache handles: the kernel sends FSYNC after the write itself.
        let cached_dsync = HandleFlags(libc::O_WRONLY | libc::O_DSYNC);
        assert_eq!(write_sync(cached_dsync, libc::O_DSYNC, false), None);
        assert_eq!(write_sync(direct_dsync, 0, true), None);
    }

    #[test]
    fn errors_map_to_their_errnos() {
        assert_eq!(errno_of(&FsError::NotFound).code(), libc::ENOENT);
        assert_eq!(errno_of(&FsError::NoAttr).code(), libc::ENODATA);
        assert_eq!(errno_of(&FsError::Stale).code(), libc::ESTALE);
        assert_eq!(errno_of(&FsError::PastEnd).code(), libc::ENXIO);
        assert_eq!(
            errno_of(&FsError::Store(StoreError::NoSpace)).code(),
            libc::ENOSPC
        );
        assert_eq!(
            errno_of(&FsError::Store(StoreError::Io("x".into()))).code(),
            libc::EIO
        );
        assert!(is_serious(&FsError::Corrupt("bad".into())));
        assert!(!is_serious(&FsError::Exists));
    }
}
