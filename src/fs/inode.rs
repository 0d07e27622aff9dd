//! The persisted inode: identity (number + generation), attributes, xattrs,
//! symlink target and the file's extent map. Directory entries live in
//! [`super::dir::Dir`] so an inode image stays small even for huge directories.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use super::extent::ExtentMap;
use super::{Attr, FileKind};

pub const BLOCK_SIZE: u64 = 4096;

/// A timestamp with nanoseconds that, unlike `SystemTime`, also serializes
/// instants before the epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Time {
    pub secs: i64,
    pub nanos: u32,
}

impl Time {
    pub fn now() -> Time {
        Time::from_system(SystemTime::now())
    }

    pub fn from_system(t: SystemTime) -> Time {
        match t.duration_since(UNIX_EPOCH) {
            Ok(d) => Time {
                secs: d.as_secs() as i64,
                nanos: d.subsec_nanos(),
            },
            Err(before) => {
                let d = before.duration();
                if d.subsec_nanos() == 0 {
                    Time {
                        secs: -(d.as_secs() as i64),
                        nanos: 0,
                    }
                } else {
                    Time {
                        secs: -(d.as_secs() as i64) - 1,
                        nanos: 1_000_000_000 - d.subsec_nanos(),
                    }
                }
            }
        }
    }

    pub fn to_system(self) -> SystemTime {
        if self.secs >= 0 {
            UNIX_EPOCH + Duration::new(self.secs as u64, self.nanos)
        } else {
            UNIX_EPOCH - Duration::from_secs((-self.secs) as u64)
                + Duration::from_nanos(self.nanos as u64)
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Inode {
    pub ino: u64,
    pub generation: u64,
    #[serde(with = "super::codes::file_kind")]
    pub kind: FileKind,
    /// mode & 0o7777
    pub perm: u16,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub nlink: u32,
    pub rdev: u32,
    pub atime: Time,
    pub mtime: Time,
    pub ctime: Time,
    pub crtime: Time,
    /// For directories: the parent directory (".."); the root is its own parent.
    pub parent: u64,
    /// For symlinks: the target.
    pub target: Vec<u8>,
    pub xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
    pub extents: ExtentMap,
}

impl Inode {
    pub fn new(ino: u64, generation: u64, kind: FileKind, perm: u16, uid: u32, gid: u32) -> Inode {
        let now = Time::now();
        Inode {
            ino,
            generation,
            kind,
            perm: perm & 0o7777,
            uid,
            gid,
            size: 0,
            nlink: 1,
            rdev: 0,
            atime: now,
            mtime: now,
            ctime: now,
            crtime: now,
            parent: 0,
            target: Vec::new(),
            xattrs: BTreeMap::new(),
            extents: ExtentMap::default(),
        }
    }

    pub fn is_dir(&self) -> bool {
        self.kind == FileKind::Dir
    }

    pub fn attr(&self) -> Attr {
        Attr {
            ino: self.ino,
            generation: self.generation,
            size: self.size,
            blocks: self.extents.allocated_bytes() / 512,
            atime: self.atime.to_system(),
            mtime: self.mtime.to_system(),
            ctime: self.ctime.to_system(),
            crtime: self.crtime.to_system(),
            kind: self.kind,
            perm: self.perm,
            nlink: self.nlink,
            uid: self.uid,
            gid: self.gid,
            rdev: self.rdev,
            blksize: BLOCK_SIZE as u32,
        }
    }
}
