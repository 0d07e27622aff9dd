//! The POSIX filesystem on the array's logical space.
//!
//! No FUSE types here: the FUSE adapter (`crate::fuse`) translates requests
//! into calls on [`FileSystem`], which can therefore be tested directly.
//! Storage is reached only through [`BlockStore`], implemented by the array
//! engine and by [`store::MemStore`] for tests.

pub mod array_store;
pub mod store;

use std::ffi::OsStr;
use std::sync::Arc;
use std::time::SystemTime;

pub use array_store::{format_array, ArrayStore};
pub use store::{BlockStore, GroupInfo, GroupKind, StoreError};

/// Errors of the filesystem layer. The FUSE adapter maps each to an errno in
/// one exhaustive match; [`FsError::errno`] is that mapping.
#[derive(Debug, thiserror::Error)]
pub enum FsError {
    #[error("no such file or directory")]
    NotFound,
    #[error("file exists")]
    Exists,
    #[error("not a directory")]
    NotDir,
    #[error("is a directory")]
    IsDir,
    #[error("directory not empty")]
    NotEmpty,
    #[error("permission denied")]
    Access,
    #[error("operation not permitted")]
    Perm,
    #[error("invalid argument: {0}")]
    Invalid(&'static str),
    #[error("name too long")]
    NameTooLong,
    #[error("no space left on device")]
    NoSpace,
    #[error("no such attribute")]
    NoAttr,
    #[error("attribute value too large for the buffer")]
    Range,
    #[error("too many links")]
    TooManyLinks,
    #[error("read-only filesystem")]
    ReadOnly,
    #[error("file too large")]
    TooBig,
    #[error("operation not supported: {0}")]
    Unsupported(&'static str),
    #[error("stale file handle")]
    Stale,
    #[error("metadata corrupt: {0}")]
    Corrupt(String),
    #[error("storage error: {0}")]
    Store(#[from] StoreError),
}

pub type FsResult<T> = Result<T, FsError>;

/// Inode number of the root directory (as FUSE expects).
pub const ROOT_INO: u64 = 1;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileKind {
    File,
    Dir,
    Symlink,
    Fifo,
    Socket,
    CharDev,
    BlockDev,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attr {
    pub ino: u64,
    /// Bumped each time an inode number is reused; part of NFS handles.
    pub generation: u64,
    pub size: u64,
    /// 512-byte blocks allocated.
    pub blocks: u64,
    pub atime: SystemTime,
    pub mtime: SystemTime,
    pub ctime: SystemTime,
    pub crtime: SystemTime,
    pub kind: FileKind,
    /// Permission bits (mode & 0o7777).
    pub perm: u16,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u32,
    pub blksize: u32,
}

/// The caller of an operation, for permission checks and ownership.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caller {
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups (may be empty).
    pub groups: Vec<u32>,
}

impl Caller {
    pub fn root() -> Caller {
        Caller { uid: 0, gid: 0, groups: Vec::new() }
    }
}

/// Which attributes `setattr` changes.
#[derive(Clone, Debug, Default)]
pub struct SetAttr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<TimeSet>,
    pub mtime: Option<TimeSet>,
}

#[derive(Clone, Copy, Debug)]
pub enum TimeSet {
    Now,
    At(SystemTime),
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RenameFlags {
    pub noreplace: bool,
    pub exchange: bool,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FallocateMode {
    pub keep_size: bool,
    pub punch_hole: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEntry {
    pub ino: u64,
    /// Cookie to pass to the next `readdir` to continue after this entry.
    pub cookie: u64,
    pub kind: FileKind,
    pub name: Vec<u8>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StatFs {
    pub blocks: u64,
    pub bfree: u64,
    pub bavail: u64,
    pub files: u64,
    pub ffree: u64,
    pub bsize: u32,
    pub namelen: u32,
    pub frsize: u32,
}

#[derive(Clone, Debug)]
pub struct FsOptions {
    pub read_only: bool,
    /// Maximum seconds between journal commits.
    pub commit_interval_secs: u64,
}

impl Default for FsOptions {
    fn default() -> Self {
        FsOptions { read_only: false, commit_interval_secs: 5 }
    }
}

/// A mounted filesystem. All methods take `&self` and are safe to call from
/// many threads.
pub struct FileSystem {
    _store: Arc<dyn BlockStore>,
}

impl FileSystem {
    /// Write an empty filesystem onto a fresh store.
    pub fn format(store: Arc<dyn BlockStore>) -> FsResult<()> {
        let _ = store;
        unimplemented!()
    }
    /// Open (replaying the journal) a formatted store.
    pub fn open(store: Arc<dyn BlockStore>, opts: FsOptions) -> FsResult<FileSystem> {
        let _ = (store, opts);
        unimplemented!()
    }
    /// Commit, flush and mark clean; the filesystem must not be used afterwards.
    pub fn unmount(&self) -> FsResult<()> {
        unimplemented!()
    }
    /// Commit the journal and flush the store (sync(2)).
    pub fn sync_all(&self) -> FsResult<()> {
        unimplemented!()
    }
    /// Look up `name` in `parent`; "." and ".." are answered too (NFS needs them).
    pub fn lookup(&self, caller: &Caller, parent: u64, name: &OsStr) -> FsResult<Attr> {
        let _ = (caller, parent, name);
        unimplemented!()
    }
    pub fn getattr(&self, ino: u64) -> FsResult<Attr> {
        let _ = ino;
        unimplemented!()
    }
    pub fn setattr(&self, caller: &Caller, ino: u64, set: &SetAttr) -> FsResult<Attr> {
        let _ = (caller, ino, set);
        unimplemented!()
    }
    /// Create a regular file, device node, FIFO or socket (`mode` carries the
    /// type bits); `umask` is applied here.
    pub fn mknod(&self, caller: &Caller, parent: u64, name: &OsStr, mode: u32, umask: u32, rdev: u32) -> FsResult<Attr> {
        let _ = (caller, parent, name, mode, umask, rdev);
        unimplemented!()
    }
    pub fn mkdir(&self, caller: &Caller, parent: u64, name: &OsStr, mode: u32, umask: u32) -> FsResult<Attr> {
        let _ = (caller, parent, name, mode, umask);
        unimplemented!()
    }
    pub fn symlink(&self, caller: &Caller, parent: u64, name: &OsStr, target: &[u8]) -> FsResult<Attr> {
        let _ = (caller, parent, name, target);
        unimplemented!()
    }
    pub fn readlink(&self, ino: u64) -> FsResult<Vec<u8>> {
        let _ = ino;
        unimplemented!()
    }
    pub fn link(&self, caller: &Caller, ino: u64, new_parent: u64, new_name: &OsStr) -> FsResult<Attr> {
        let _ = (caller, ino, new_parent, new_name);
        unimplemented!()
    }
    pub fn unlink(&self, caller: &Caller, parent: u64, name: &OsStr) -> FsResult<()> {
        let _ = (caller, parent, name);
        unimplemented!()
    }
    pub fn rmdir(&self, caller: &Caller, parent: u64, name: &OsStr) -> FsResult<()> {
        let _ = (caller, parent, name);
        unimplemented!()
    }
    pub fn rename(&self, caller: &Caller, parent: u64, name: &OsStr, new_parent: u64, new_name: &OsStr, flags: RenameFlags) -> FsResult<()> {
        let _ = (caller, parent, name, new_parent, new_name, flags);
        unimplemented!()
    }
    /// Check `access(2)` permission (`mask` of R_OK/W_OK/X_OK bits, 0 = exists).
    pub fn access(&self, caller: &Caller, ino: u64, mask: u32) -> FsResult<()> {
        let _ = (caller, ino, mask);
        unimplemented!()
    }
    /// Open an existing inode (`flags` as open(2)); counts the open so an
    /// unlinked file keeps its data until the last `release`.
    pub fn open_inode(&self, caller: &Caller, ino: u64, flags: i32) -> FsResult<()> {
        let _ = (caller, ino, flags);
        unimplemented!()
    }
    /// Create and open a regular file.
    pub fn create(&self, caller: &Caller, parent: u64, name: &OsStr, mode: u32, umask: u32, flags: i32) -> FsResult<Attr> {
        let _ = (caller, parent, name, mode, umask, flags);
        unimplemented!()
    }
    pub fn release(&self, ino: u64) -> FsResult<()> {
        let _ = ino;
        unimplemented!()
    }
    /// Read up to `size` bytes; holes read as zeros; short only at end of file.
    pub fn read(&self, ino: u64, offset: u64, size: usize) -> FsResult<Vec<u8>> {
        let _ = (ino, offset, size);
        unimplemented!()
    }
    /// Write all of `data` at `offset`; returns bytes written.
    pub fn write(&self, ino: u64, offset: u64, data: &[u8]) -> FsResult<usize> {
        let _ = (ino, offset, data);
        unimplemented!()
    }
    /// Make the inode's data (and, unless `datasync`, its metadata) durable on
    /// every member that holds it before returning.
    pub fn fsync(&self, ino: u64, datasync: bool) -> FsResult<()> {
        let _ = (ino, datasync);
        unimplemented!()
    }
    pub fn fallocate(&self, ino: u64, offset: u64, len: u64, mode: FallocateMode) -> FsResult<()> {
        let _ = (ino, offset, len, mode);
        unimplemented!()
    }
    /// Entries after `cookie` (0 = from the start, "." and ".." first), at most
    /// `max` of them. Cookies stay valid while entries are added and removed.
    pub fn readdir(&self, ino: u64, cookie: u64, max: usize) -> FsResult<Vec<DirEntry>> {
        let _ = (ino, cookie, max);
        unimplemented!()
    }
    pub fn setxattr(&self, caller: &Caller, ino: u64, name: &OsStr, value: &[u8], flags: i32) -> FsResult<()> {
        let _ = (caller, ino, name, value, flags);
        unimplemented!()
    }
    pub fn getxattr(&self, caller: &Caller, ino: u64, name: &OsStr) -> FsResult<Vec<u8>> {
        let _ = (caller, ino, name);
        unimplemented!()
    }
    /// Names, each NUL-terminated, concatenated (listxattr(2) format).
    pub fn listxattr(&self, caller: &Caller, ino: u64) -> FsResult<Vec<u8>> {
        let _ = (caller, ino);
        unimplemented!()
    }
    pub fn removexattr(&self, caller: &Caller, ino: u64, name: &OsStr) -> FsResult<()> {
        let _ = (caller, ino, name);
        unimplemented!()
    }
    pub fn statfs(&self) -> FsResult<StatFs> {
        unimplemented!()
    }
}
