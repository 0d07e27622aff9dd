//! The POSIX filesystem on the array's logical space.
//!
//! No FUSE types here: the FUSE adapter (`crate::fuse`) translates requests
//! into calls on [`FileSystem`], which can therefore be tested directly.
//! Storage is reached only through [`BlockStore`], implemented by the array
//! engine and, for tests (the `testing` feature), by the stores in
//! `teststore`.

pub mod acl;
mod alloc;
pub mod array_store;
pub mod atime;
mod codes;
mod core;
pub mod csum;
mod csum_store;
pub mod damaged;
mod data_errors;
mod deferred;
mod dir;
mod extent;
pub mod fsck;
mod inode;
mod inode_cache;
mod journal;
mod layout;
mod meta;
mod meta_room;
mod meta_tree;
mod node_space;
pub mod ondisk;
mod ops;
mod perm;
pub mod progress;
mod range_lock;
mod replay;
mod scrub;
mod state;
pub mod store;
#[cfg(any(test, feature = "testing"))]
pub mod teststore;
pub mod tree;
pub mod upgrade;
mod write_queue;

use std::ffi::OsStr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

pub use array_store::{format_array, ArrayStore};
use parking_lot::Mutex;

use self::core::Inner;
use self::deferred::Deferred;
use self::ops::namespace::{self, NewNode};
use self::perm::{R_OK, W_OK, X_OK};

pub use csum::ChecksumKind;
pub use data_errors::{DataError, DataErrors};
pub use fsck::{fsck, fsck_with, FsckReport};
pub use inode::BLOCK_SIZE;
pub use inode_cache::DEFAULT_CACHE_BYTES as DEFAULT_METADATA_CACHE;
pub use layout::{OLDEST_VERSION as OLDEST_FORMAT, VERSION as FORMAT_VERSION};
pub use ops::copy::MAX_COPY;
pub use ops::seek::Seek;
pub use ops::xattr::{XATTR_CREATE, XATTR_REPLACE};
pub use progress::Progress;
pub use scrub::{BadCopyReport, LostBlock, ScrubReport};
pub use store::{BlockStore, GroupInfo, GroupKind, StoreError};

/// Errors of the filesystem layer. The FUSE adapter maps each to an errno in
/// one exhaustive match (`crate::fuse::errno_of`).
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
    #[error("offset at or past the end of the file")]
    PastEnd,
    #[error("metadata corrupt: {0}")]
    Corrupt(String),
    /// The filesystem uses a feature this raidfs does not know (the
    /// message names its bits and what may still be done).
    #[error("{0}")]
    Feature(String),
    #[error("storage error: {0}")]
    Store(#[from] StoreError),
}

pub type FsResult<T> = Result<T, FsError>;

/// Inode number of the root directory (as FUSE expects).
pub const ROOT_INO: u64 = 1;
/// Metadata space one more inode takes, for statfs's inode counts: its
/// image (about 150 bytes with a few extents) and directory entry in both
/// checkpoint slots and in the journal, rounded up to leave room for
/// xattrs and extent maps that grow.
pub const INODE_COST: u64 = 1024;

/// The kind of a file. Persisted through its fixed numbers in `codes`
/// (not by variant order), so it derives no serde.
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
        Caller {
            uid: 0,
            gid: 0,
            groups: Vec::new(),
        }
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
    /// The change comes through a descriptor opened for writing
    /// (`ftruncate`): its permission was checked at open, as for a write.
    pub through_writable_fd: bool,
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
    /// Leave a whiteout (character device 0:0) at the old name: overlayfs
    /// marks a name deleted from its lower layer with one.
    pub whiteout: bool,
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
    /// Writes that may be answered before they are done by the threads
    /// that answered them (0: none, and no write queue either); see
    /// [`FileSystem::accept_write`].
    pub deferred_writes: usize,
    /// Small writes that may wait in the write queue (0: no queue); see
    /// [`FileSystem::queue_write`].
    pub queued_writes: usize,
    /// How long the write queue's thread stays awake for the next write
    /// once it has caught up (zero: it sleeps at once); see
    /// `fs::write_queue`.
    pub queue_spin: std::time::Duration,
    /// When reads move the access time (the mount's atime mode).
    pub atime: atime::AtimeMode,
    /// Whether listing a directory moves its access time (`nodiratime`: no).
    pub diratime: bool,
    /// Bytes of unchanged inodes kept in memory over a metadata tree
    /// (`-o metadata_cache`); changed ones are held until a checkpoint
    /// writes them, whatever this is.
    pub metadata_cache: u64,
}

impl Default for FsOptions {
    fn default() -> Self {
        FsOptions {
            read_only: false,
            commit_interval_secs: 5,
            deferred_writes: 0,
            queued_writes: 0,
            queue_spin: std::time::Duration::ZERO,
            atime: atime::AtimeMode::Relative,
            diratime: true,
            metadata_cache: inode_cache::DEFAULT_CACHE_BYTES,
        }
    }
}

/// Choices fixed when a filesystem is written.
#[derive(Clone, Debug, Default)]
pub struct FormatOptions {
    /// Data block checksums (crc32c by default; `None` only to measure what
    /// they cost).
    pub data_checksum: ChecksumKind,
    /// The format to write; None: the newest ([`FORMAT_VERSION`]). An older
    /// one ([`OLDEST_FORMAT`] on) stays readable by older releases, and
    /// `raidfs upgrade` moves it on later.
    pub version: Option<u32>,
    /// Owner of the root directory, `(uid, gid)`: the user who creates an
    /// array for themselves must be able to write to it (default 0:0).
    pub root_owner: (u32, u32),
    /// Write format 5 without `metadata_tree`: checkpoints as whole
    /// images, as releases before the tree wrote them (what `raidfs
    /// upgrade` converts). Formats before 5 always are.
    pub image_checkpoints: bool,
}

/// A mounted filesystem. All methods take `&self` and are safe to call from
/// many threads.
pub struct FileSystem {
    inner: Arc<Inner>,
    /// Dropping the sender stops the commit thread.
    stop_committer: Mutex<Option<crossbeam_channel::Sender<()>>>,
    deferred: Arc<Deferred>,
    /// Small writes answered at once and done by the queue's thread (None:
    /// off, or read-only).
    queue: Option<write_queue::WriteQueue<QueuedWrite>>,
    atime: atime::AtimeMode,
    diratime: bool,
    /// Opened read-write: `remount,rw` may take changes again.
    opened_writable: bool,
    /// Read-only because of [`FileSystem::set_read_only`] (not because a
    /// commit failed, which must stay read-only).
    remounted_read_only: std::sync::atomic::AtomicBool,
}

/// Do an accepted write once its turn comes (see `fs::deferred`).
fn complete(inner: &Inner, accepted: AcceptedWrite, data: &[u8]) {
    let AcceptedWrite {
        ticket,
        offset,
        drop_setid,
    } = accepted;
    let ino = ticket.ino();
    ticket.run(|placed| inner.write_data_then(drop_setid, ino, offset, data, placed));
}

/// A write waiting in the write queue, with its own copy of the data.
struct QueuedWrite {
    accepted: AcceptedWrite,
    data: Vec<u8>,
}

/// A write answered before it is done: see [`FileSystem::accept_write`].
pub struct AcceptedWrite {
    ticket: deferred::Ticket,
    offset: u64,
    drop_setid: bool,
}

fn bytes(name: &OsStr) -> &[u8] {
    use std::os::unix::ffi::OsStrExt;
    name.as_bytes()
}

const S_IFMT: u32 = 0o170000;

fn kind_from_mode(mode: u32) -> FsResult<FileKind> {
    match mode & S_IFMT {
        0 | 0o100000 => Ok(FileKind::File),
        0o010000 => Ok(FileKind::Fifo),
        0o140000 => Ok(FileKind::Socket),
        0o020000 => Ok(FileKind::CharDev),
        0o060000 => Ok(FileKind::BlockDev),
        0o040000 => Err(FsError::Invalid("mknod cannot make a directory")),
        _ => Err(FsError::Invalid("unknown file type in mode")),
    }
}

impl FileSystem {
    /// Write an empty filesystem onto a fresh store.
    pub fn format(store: Arc<dyn BlockStore>) -> FsResult<()> {
        Self::format_with(store, &FormatOptions::default())
    }

    /// Write an empty filesystem with explicit format choices.
    pub fn format_with(store: Arc<dyn BlockStore>, opts: &FormatOptions) -> FsResult<()> {
        let version = opts.version.unwrap_or(FORMAT_VERSION);
        if !(OLDEST_FORMAT..=FORMAT_VERSION).contains(&version) {
            return Err(FsError::Invalid("unknown filesystem format"));
        }
        let mut features = layout::implied_features(version);
        if opts.image_checkpoints {
            features.incompat &= !layout::INCOMPAT_METADATA_TREE;
        }
        core::format_with_features(
            store,
            opts.data_checksum,
            version,
            features,
            opts.root_owner,
        )
    }

    /// How this filesystem checksums data blocks.
    pub fn data_checksum(&self) -> ChecksumKind {
        self.inner.csum
    }

    /// Open (replaying the journal) a formatted store.
    pub fn open(store: Arc<dyn BlockStore>, opts: FsOptions) -> FsResult<FileSystem> {
        let inner = Inner::open_with(store, opts.read_only, opts.metadata_cache)?;
        let stop = if opts.read_only {
            None
        } else {
            let (tx, rx) = crossbeam_channel::bounded(1);
            core::spawn_committer(
                Arc::downgrade(&inner),
                Duration::from_secs(opts.commit_interval_secs.max(1)),
                rx,
            );
            Some(tx)
        };
        let deferred = Deferred::new(if opts.read_only {
            0
        } else {
            opts.deferred_writes
        });
        let queue = if opts.read_only || opts.deferred_writes == 0 || opts.queued_writes == 0 {
            None
        } else {
            let inner = Arc::clone(&inner);
            let queue = write_queue::WriteQueue::start(
                opts.queued_writes,
                opts.queue_spin,
                "raidfs-writes",
                move |w: QueuedWrite| complete(&inner, w.accepted, &w.data),
            )
            .map_err(|e| {
                FsError::Store(StoreError::Io(format!(
                    "starting the write queue's thread: {e}"
                )))
            })?;
            Some(queue)
        };
        Ok(FileSystem {
            inner,
            stop_committer: Mutex::new(stop),
            deferred,
            queue,
            atime: opts.atime,
            diratime: opts.diratime,
            opened_writable: !opts.read_only,
            remounted_read_only: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// `mount -o remount,ro|rw`. Going read-only settles the deferred
    /// writes, commits and flushes, then refuses changes as a read-only
    /// open does; going back takes changes again. A filesystem opened
    /// read-only, or made read-only by a failed commit, cannot go back.
    pub fn set_read_only(&self, read_only: bool) -> FsResult<()> {
        use std::sync::atomic::Ordering;
        if read_only {
            if self.inner.is_read_only() {
                return Ok(());
            }
            self.deferred.settle_all();
            self.inner.commit(true)?;
            self.remounted_read_only.store(true, Ordering::Release);
            self.inner.read_only.store(true, Ordering::Release);
            return Ok(());
        }
        if !self.inner.is_read_only() {
            return Ok(());
        }
        if !self.opened_writable || !self.remounted_read_only.load(Ordering::Acquire) {
            return Err(FsError::ReadOnly);
        }
        self.remounted_read_only.store(false, Ordering::Release);
        self.inner.read_only.store(false, Ordering::Release);
        Ok(())
    }

    /// Commit, flush and mark clean; the filesystem must not be used afterwards.
    pub fn unmount(&self) -> FsResult<()> {
        self.deferred.settle_all();
        self.stop_committer.lock().take();
        if self.inner.is_read_only() {
            return self.inner.check_commits();
        }
        let result = self.inner.commit(true).map(|_| ());
        self.inner.discard_freed();
        self.inner
            .read_only
            .store(true, std::sync::atomic::Ordering::Release);
        result
    }

    /// Commit the journal and flush the store (sync(2)).
    pub fn sync_all(&self) -> FsResult<()> {
        self.deferred.settle_all();
        self.sync_store()?;
        self.inner.discard_freed();
        Ok(())
    }

    fn sync_store(&self) -> FsResult<()> {
        self.inner.check_commits()?;
        // A journal record ends with a flush of its own, covering every
        // data write that completed before it.
        if !self.inner.is_read_only() && self.inner.commit(false)? {
            return Ok(());
        }
        self.inner.store.flush()?;
        Ok(())
    }

    /// True once the filesystem refuses changes (opened read-only, unmounted,
    /// or a commit failed).
    pub fn is_read_only(&self) -> bool {
        self.inner.is_read_only()
    }

    /// Check every data block against its checksum on every copy, and the
    /// metadata likewise; with `repair`, rewrite each bad copy from a good
    /// one. Parity/mirror consistency is left to the array's own scrub.
    pub fn scrub(&self, repair: bool) -> FsResult<ScrubReport> {
        self.inner.scrub(repair)
    }

    /// Data blocks that failed their checksum on a read since the mount,
    /// and the last of them.
    pub fn data_errors(&self) -> DataErrors {
        self.inner.data_errors.snapshot()
    }

    /// A path (from the root, `/`-separated) of inode `ino`: the first name
    /// found for it, as a file with several links has several. None when
    /// no directory holds it (deleted while open). Walks every directory,
    /// so it is for reports, not for hot paths.
    pub fn path_of(&self, ino: u64) -> Option<String> {
        use std::os::unix::ffi::OsStrExt;
        let st = self.inner.state.read();
        let mut names: Vec<Vec<u8>> = Vec::new();
        let mut at = ino;
        while at != ROOT_INO {
            // A directory's parent is recorded; a file's is found by name.
            let (parent, name) = st.meta.name_of(at).ok().flatten()?;
            names.push(name);
            if names.len() > 4096 {
                return None;
            }
            at = parent;
        }
        let mut path = Vec::new();
        for name in names.iter().rev() {
            path.push(b'/');
            path.extend_from_slice(name);
        }
        if path.is_empty() {
            path.push(b'/');
        }
        Some(
            std::ffi::OsStr::from_bytes(&path)
                .to_string_lossy()
                .into_owned(),
        )
    }

    /// Where the file's data lives: (file offset, logical address, length)
    /// for each extent, in file order (as FIEMAP reports it).
    pub fn extents(&self, ino: u64) -> FsResult<Vec<(u64, u64, u64)>> {
        self.deferred.settle(ino);
        let st = self.inner.state.read();
        Ok(st
            .inode(ino)?
            .extents
            .iter()
            .map(|(off, e)| (off, e.addr, e.len))
            .collect())
    }

    /// Look up `name` in `parent`; "." and ".." are answered too (NFS needs them).
    pub fn lookup(&self, caller: &Caller, parent: u64, name: &OsStr) -> FsResult<Attr> {
        let attr = namespace::lookup(&self.inner.state.read(), caller, parent, bytes(name))?;
        if self.deferred.is_pending(attr.ino) {
            return self.getattr(attr.ino);
        }
        Ok(attr)
    }

    /// The parent directory of directory `ino` (for NFS "..", and FUSE's
    /// lookup of ".." on a directory handle).
    pub fn lookup_parent(&self, ino: u64) -> FsResult<Attr> {
        let st = self.inner.state.read();
        let inode = st.inode(ino)?;
        if !inode.is_dir() {
            return Err(FsError::NotDir);
        }
        Ok(st.inode(inode.parent)?.attr())
    }

    pub fn getattr(&self, ino: u64) -> FsResult<Attr> {
        self.deferred.settle(ino);
        Ok(self.inner.state.read().inode(ino)?.attr())
    }

    pub fn setattr(&self, caller: &Caller, ino: u64, set: &SetAttr) -> FsResult<Attr> {
        self.deferred.settle(ino);
        let _file = self.inner.file_lock(ino);
        ops::attr::validate(&self.inner.state.read(), caller, ino, set)?;
        if let Some(size) = set.size {
            self.inner.truncate_locked(ino, size)?;
        }
        self.inner.mutate(|st| {
            ops::attr::apply(st, caller, ino, set)?;
            Ok(st.inode(ino)?.attr())
        })
    }

    /// Create a regular file, device node, FIFO or socket (`mode` carries the
    /// type bits); `umask` is applied here, unless the parent's default ACL
    /// decides instead (`namespace::create`).
    pub fn mknod(
        &self,
        caller: &Caller,
        parent: u64,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
    ) -> FsResult<Attr> {
        let kind = kind_from_mode(mode)?;
        let (perm, umask) = ((mode & 0o7777) as u16, (umask & 0o777) as u16);
        self.inner.mutate(|st| {
            namespace::create(
                st,
                caller,
                parent,
                bytes(name),
                NewNode {
                    kind,
                    perm,
                    umask,
                    rdev,
                    target: &[],
                },
            )
        })
    }

    pub fn mkdir(
        &self,
        caller: &Caller,
        parent: u64,
        name: &OsStr,
        mode: u32,
        umask: u32,
    ) -> FsResult<Attr> {
        let (perm, umask) = ((mode & 0o7777) as u16, (umask & 0o777) as u16);
        self.inner.mutate(|st| {
            namespace::create(
                st,
                caller,
                parent,
                bytes(name),
                NewNode {
                    kind: FileKind::Dir,
                    perm,
                    umask,
                    rdev: 0,
                    target: &[],
                },
            )
        })
    }

    pub fn symlink(
        &self,
        caller: &Caller,
        parent: u64,
        name: &OsStr,
        target: &[u8],
    ) -> FsResult<Attr> {
        if target.is_empty() || target.len() > 4095 {
            return Err(FsError::NameTooLong);
        }
        self.inner.mutate(|st| {
            namespace::create(
                st,
                caller,
                parent,
                bytes(name),
                NewNode {
                    kind: FileKind::Symlink,
                    perm: 0o777,
                    umask: 0,
                    rdev: 0,
                    target,
                },
            )
        })
    }

    pub fn readlink(&self, ino: u64) -> FsResult<Vec<u8>> {
        let st = self.inner.state.read();
        let inode = st.inode(ino)?;
        if inode.kind != FileKind::Symlink {
            return Err(FsError::Invalid("not a symlink"));
        }
        Ok(inode.target.clone())
    }

    pub fn link(
        &self,
        caller: &Caller,
        ino: u64,
        new_parent: u64,
        new_name: &OsStr,
    ) -> FsResult<Attr> {
        // The reply carries the size, which the kernel takes as current.
        self.deferred.settle(ino);
        self.inner
            .mutate(|st| namespace::link(st, caller, ino, new_parent, bytes(new_name)))
    }

    pub fn unlink(&self, caller: &Caller, parent: u64, name: &OsStr) -> FsResult<()> {
        self.inner
            .mutate_releasing(|st| namespace::unlink(st, caller, parent, bytes(name)))
    }

    pub fn rmdir(&self, caller: &Caller, parent: u64, name: &OsStr) -> FsResult<()> {
        self.inner
            .mutate_releasing(|st| namespace::rmdir(st, caller, parent, bytes(name)))
    }

    pub fn rename(
        &self,
        caller: &Caller,
        parent: u64,
        name: &OsStr,
        new_parent: u64,
        new_name: &OsStr,
        flags: RenameFlags,
    ) -> FsResult<()> {
        self.inner.mutate(|st| {
            ops::rename::rename(
                st,
                caller,
                parent,
                bytes(name),
                new_parent,
                bytes(new_name),
                flags,
            )
        })
    }

    /// Check `access(2)` permission (`mask` of R_OK/W_OK/X_OK bits, 0 = exists).
    pub fn access(&self, caller: &Caller, ino: u64, mask: u32) -> FsResult<()> {
        let st = self.inner.state.read();
        let inode = st.inode(ino)?;
        if mask & W_OK != 0 && self.inner.is_read_only() {
            return Err(FsError::ReadOnly);
        }
        perm::check(caller, &inode, mask & (R_OK | W_OK | X_OK))
    }

    /// Open an existing inode (`flags` as open(2)); counts the open so an
    /// unlinked file keeps its data until the last `release`.
    pub fn open_inode(&self, caller: &Caller, ino: u64, flags: i32) -> FsResult<()> {
        // execve opens the file with __FMODE_EXEC: it needs search (x)
        // permission, not read, so an execute-only file (0711) runs.
        const FMODE_EXEC: i32 = 0x20;
        let mask = match flags & libc::O_ACCMODE {
            libc::O_RDONLY if flags & FMODE_EXEC != 0 => X_OK,
            libc::O_RDONLY => R_OK,
            libc::O_WRONLY => W_OK,
            _ => R_OK | W_OK,
        };
        let truncate = flags & libc::O_TRUNC != 0 && mask & W_OK != 0;
        {
            let st = self.inner.state.read();
            let inode = st.inode(ino)?;
            if inode.is_dir() && mask & W_OK != 0 {
                return Err(FsError::IsDir);
            }
            if mask & W_OK != 0 && self.inner.is_read_only() {
                return Err(FsError::ReadOnly);
            }
            perm::check(caller, &inode, mask)?;
        }
        if truncate && self.getattr(ino)?.kind == FileKind::File {
            let _file = self.inner.file_lock(ino);
            self.inner.truncate_locked(ino, 0)?;
        }
        let mut st = self.inner.state.write();
        st.inode(ino)?;
        *st.open_counts.entry(ino).or_insert(0) += 1;
        Ok(())
    }

    /// Create and open a regular file.
    pub fn create(
        &self,
        caller: &Caller,
        parent: u64,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
    ) -> FsResult<Attr> {
        let _ = flags;
        let (perm, umask) = ((mode & 0o7777) as u16, (umask & 0o777) as u16);
        self.inner.mutate(|st| {
            let attr = namespace::create(
                st,
                caller,
                parent,
                bytes(name),
                NewNode {
                    kind: FileKind::File,
                    perm,
                    umask,
                    rdev: 0,
                    target: &[],
                },
            )?;
            *st.open_counts.entry(attr.ino).or_insert(0) += 1;
            Ok(attr)
        })
    }

    /// Create and open a regular file with no name (open(2) with
    /// O_TMPFILE) belonging to directory `parent`: mode, umask and default
    /// ACL as [`FileSystem::create`]. Its last [`FileSystem::release`]
    /// frees it unless [`FileSystem::link`] names it first, which only a
    /// `linkable` one (opened without O_EXCL) allows; a crash leaves it an
    /// orphan that the next mount frees.
    pub fn tmpfile(
        &self,
        caller: &Caller,
        parent: u64,
        mode: u32,
        umask: u32,
        linkable: bool,
    ) -> FsResult<Attr> {
        if mode & S_IFMT != 0 && kind_from_mode(mode)? != FileKind::File {
            return Err(FsError::Invalid("O_TMPFILE makes only regular files"));
        }
        let (perm, umask) = ((mode & 0o7777) as u16, (umask & 0o777) as u16);
        self.inner
            .mutate(|st| namespace::tmpfile(st, caller, parent, perm, umask, linkable))
    }

    /// Forget one open of `ino`; the last release of an unlinked file frees it.
    pub fn release(&self, ino: u64) -> FsResult<()> {
        self.deferred.settle(ino);
        let mut st = self.inner.state.write();
        let Some(count) = st.open_counts.get_mut(&ino) else {
            return Ok(());
        };
        *count = count.saturating_sub(1);
        if *count == 0 {
            st.open_counts.remove(&ino);
            let orphan = st.meta.inode(ino)?.is_some_and(|i| i.nlink == 0);
            if orphan && !self.inner.is_read_only() {
                st.free_inode(ino)?;
            }
        }
        Ok(())
    }

    /// Read up to `size` bytes; holes read as zeros; short only at end of file.
    pub fn read(&self, ino: u64, offset: u64, size: usize) -> FsResult<Vec<u8>> {
        let end = offset.saturating_add(size as u64);
        self.deferred.settle_read(ino, offset..end, || {
            // An inode gone or not a file fails the read below.
            self.inner.state.read().inode(ino).map_or(0, |i| i.size)
        });
        let atime = self.atime_mode().map(|m| (m, inode::Time::now()));
        let (data, due) = self.inner.read_data(ino, offset, size, atime)?;
        if let (true, Some((_, now))) = (due, atime) {
            self.set_atime(ino, now);
        }
        Ok(data)
    }

    /// The atime mode accesses follow, or None when they move nothing (a
    /// read-only filesystem, or one that refuses changes, keeps old times).
    fn atime_mode(&self) -> Option<atime::AtimeMode> {
        (self.atime != atime::AtimeMode::Never && !self.inner.is_read_only()).then_some(self.atime)
    }

    /// Move `ino`'s atime to `now`; an access never fails for it.
    fn set_atime(&self, ino: u64, now: inode::Time) {
        let _ = self.inner.mutate(|st| {
            st.inode_mut(ino)?.atime = now;
            Ok(())
        });
    }

    /// Write all of `data` at `offset`; returns bytes written. The file
    /// loses its capabilities (`security.capability`), as with any write.
    pub fn write(&self, ino: u64, offset: u64, data: &[u8]) -> FsResult<usize> {
        self.deferred.settle_for_write(ino);
        Ok(self.inner.write_data(false, ino, offset, data)?.0)
    }

    /// As [`FileSystem::write`], and clear the set-user-ID bit and (for a
    /// group-executable file) the set-group-ID bit: a write by someone
    /// without `CAP_FSETID` (the kernel's `FUSE_WRITE_KILL_SUIDGID`).
    /// Returns the bytes written and whether the mode changed.
    pub fn write_clearing_setid(
        &self,
        caller: &Caller,
        ino: u64,
        offset: u64,
        data: &[u8],
    ) -> FsResult<(usize, bool)> {
        self.deferred.settle_for_write(ino);
        let (written, changed) = self.inner.write_data(true, ino, offset, data)?;
        Ok((written, self.drop_sgid_of_outsider(caller, ino)? || changed))
    }

    /// `fallocate` on behalf of `caller`: like a write, a change by anyone
    /// without CAP_FSETID (anyone but root) first clears the set-ID bits as
    /// the kernel's VFS would (`file_modified`); the FUSE kernel leaves
    /// that to the filesystem and says nothing of it in the request. True
    /// when the mode changed (the kernel must be told).
    pub fn fallocate_as(
        &self,
        caller: &Caller,
        ino: u64,
        offset: u64,
        len: u64,
        mode: FallocateMode,
    ) -> FsResult<bool> {
        self.deferred.settle(ino);
        let changed = if caller.uid != 0 {
            let dropped = self.inner.mutate(|st| {
                let inode = st.inode_mut(ino)?;
                if inode.kind != FileKind::File {
                    return Ok(false);
                }
                Ok(perm::drop_privileges(inode, true) | perm::drop_sgid_of_outsider(inode, caller))
            })?;
            dropped
        } else {
            false
        };
        self.inner.fallocate_data(ino, offset, len, mode)?;
        Ok(changed)
    }

    /// A write by `caller` that lacks CAP_FSETID also takes the set-group-ID
    /// bit of a file outside their groups (see [`perm::drop_sgid_of_outsider`]).
    fn drop_sgid_of_outsider(&self, caller: &Caller, ino: u64) -> FsResult<bool> {
        let outsider = {
            let st = self.inner.state.read();
            let inode = st.inode(ino)?;
            inode.perm & perm::S_ISGID != 0 && !perm::in_group(caller, inode.gid)
        };
        if !outsider {
            return Ok(false);
        }
        self.inner.mutate(|st| {
            let inode = st.inode_mut(ino)?;
            let changed = perm::drop_sgid_of_outsider(inode, caller);
            if changed {
                inode.ctime = inode::Time::now();
            }
            Ok(changed)
        })
    }

    /// As [`FileSystem::write`], on behalf of `caller`: a write by anyone but
    /// root clears the set-ID bits.
    pub fn write_as(&self, caller: &Caller, ino: u64, offset: u64, data: &[u8]) -> FsResult<usize> {
        self.deferred.settle(ino);
        Ok(self.inner.write_data(caller.uid != 0, ino, offset, data)?.0)
    }

    /// Make the inode's data (and, unless `datasync`, its metadata) durable on
    /// every member that holds it before returning.
    pub fn fsync(&self, ino: u64, datasync: bool) -> FsResult<()> {
        let _ = datasync;
        self.deferred.settle_and_report(ino)?;
        self.inner.state.read().inode(ino)?;
        self.sync_store()
    }

    /// close(2) of a handle: not a durability point (fsync is), but it
    /// reports a write of the file that failed after it was answered.
    pub fn flush(&self, ino: u64) -> FsResult<()> {
        self.deferred.settle_and_report(ino)
    }

    /// Accept a write of `len` bytes at `offset` to be answered now and done
    /// by [`FileSystem::complete_write`] right after, so that the writer
    /// prepares its next request while this one is written. None when the
    /// write must be done before it is answered: deferral off or at its
    /// limit, too little free space, anything the write could refuse
    /// (read-only, size limit, not a regular file), or, with `drop_setid`,
    /// set-ID bits to clear (the caller must tell the kernel the new mode).
    /// Other operations on the inode wait for accepted writes, which run in
    /// the order accepted; a failure is reported by the next fsync or flush.
    pub fn accept_write(
        &self,
        ino: u64,
        offset: u64,
        len: usize,
        drop_setid: bool,
    ) -> Option<AcceptedWrite> {
        self.accept(ino, offset, len, drop_setid, false)
    }

    fn accept(
        &self,
        ino: u64,
        offset: u64,
        len: usize,
        drop_setid: bool,
        queued: bool,
    ) -> Option<AcceptedWrite> {
        if len == 0 || self.inner.is_read_only() {
            return None;
        }
        let end = offset
            .checked_add(len as u64)
            .filter(|end| *end <= ops::data::MAX_FILE_SIZE)?;
        let in_groups = {
            let st = self.inner.state.read();
            let inode = st.inode(ino).ok()?;
            let set_id = perm::S_ISUID | perm::S_ISGID;
            if inode.kind != FileKind::File || (drop_setid && inode.perm & set_id != 0) {
                return None;
            }
            st.alloc.free_bytes()
        };
        // The unallocated groups are counted only when the allocated ones
        // fall short (counting them scans the array's group table).
        let has_room = |needed| {
            in_groups >= needed
                || in_groups.saturating_add(self.inner.unallocated_bytes()) >= needed
        };
        let ticket = if queued {
            self.deferred
                .try_accept_queued(ino, offset..end, has_room)?
        } else {
            self.deferred.try_accept(ino, offset..end, has_room)?
        };
        Some(AcceptedWrite {
            ticket,
            offset,
            drop_setid,
        })
    }

    /// Do a write accepted by [`FileSystem::accept_write`]: it starts once
    /// the writes of the inode accepted before it have locked their ranges
    /// and allocated their blocks, and runs beside those of other ranges.
    pub fn complete_write(&self, accepted: AcceptedWrite, data: &[u8]) {
        complete(&self.inner, accepted, data);
    }

    /// Accept a write as [`FileSystem::accept_write`] does and hand it with
    /// a copy of `data` to the write queue's thread (`fs::write_queue`), or
    /// false when the caller must do it before its answer: no queue, the
    /// first write of a streak (the inode's previous request was not a
    /// write, see `Deferred::continue_streak`), or anything for which
    /// `accept_write` declines. Waits while the queue is full. A failure is
    /// reported by the next fsync or flush of the inode.
    pub fn queue_write(&self, ino: u64, offset: u64, data: &[u8], drop_setid: bool) -> bool {
        let Some(queue) = &self.queue else {
            return false;
        };
        if !self.deferred.continue_streak(ino) {
            return false;
        }
        queue.push(|| {
            let accepted = self.accept(ino, offset, data.len(), drop_setid, true)?;
            Some(QueuedWrite {
                accepted,
                data: data.to_vec(),
            })
        })
    }

    /// The first offset at or after `offset` that starts data or lies in a
    /// hole (lseek SEEK_DATA / SEEK_HOLE; the end of file is a hole,
    /// [`FsError::PastEnd`] at or past it, and for SEEK_DATA with no data
    /// after `offset`).
    pub fn seek(&self, ino: u64, offset: u64, whence: Seek) -> FsResult<u64> {
        self.deferred.settle(ino);
        let st = self.inner.state.read();
        let inode = st.inode(ino)?;
        ops::data::regular_file(&inode)?;
        ops::seek::seek(&inode.extents, inode.size, offset, whence)
    }

    /// copy_file_range(2) of up to `len` bytes, inside the array. Clipped
    /// to the end of the source (0 at or past it) and to [`MAX_COPY`]; an
    /// overlapping range of the same file is refused. The destination is
    /// changed as a write by `caller` would change it (times, and for
    /// anyone but root the set-ID bits, as [`FileSystem::write_clearing_setid`]
    /// clears them). Returns the bytes copied and whether the destination's
    /// mode changed.
    pub fn copy_file_range(
        &self,
        caller: &Caller,
        src: u64,
        src_off: u64,
        dst: u64,
        dst_off: u64,
        len: u64,
    ) -> FsResult<(u64, bool)> {
        self.deferred.settle(src);
        self.deferred.settle(dst);
        let unprivileged = caller.uid != 0;
        let (copied, changed) =
            self.inner
                .copy_range(src, src_off, dst, dst_off, len, unprivileged)?;
        let outsider = unprivileged && copied > 0 && self.drop_sgid_of_outsider(caller, dst)?;
        Ok((copied, changed || outsider))
    }

    pub fn fallocate(&self, ino: u64, offset: u64, len: u64, mode: FallocateMode) -> FsResult<()> {
        self.deferred.settle(ino);
        self.inner.fallocate_data(ino, offset, len, mode)
    }

    /// Entries after `cookie` (0 = from the start, "." and ".." first), at most
    /// `max` of them, including any inserted since the listing began. Cookies
    /// stay valid while entries are added and removed; a listing that must
    /// end whatever runs beside it uses [`FileSystem::readdir_until`].
    pub fn readdir(&self, ino: u64, cookie: u64, max: usize) -> FsResult<Vec<DirEntry>> {
        self.readdir_until(ino, cookie, u64::MAX, max)
    }

    /// Where a listing of `ino` begun now ends, for
    /// [`FileSystem::readdir_until`]: entries inserted from now on (new
    /// names, and renamed entries, which get a fresh cookie) have cookies at
    /// or above it.
    pub fn readdir_end(&self, ino: u64) -> FsResult<u64> {
        let now = inode::Time::now();
        let mode = self.atime_mode().filter(|_| self.diratime);
        let (end, due) = {
            let st = self.inner.state.read();
            let end = st.dir(ino)?.next_cookie();
            // A listing begins: the directory is accessed (not under nodiratime).
            let due =
                mode.is_some_and(|m| st.inode(ino).is_ok_and(|i| atime::needs_update(m, &i, now)));
            (end, due)
        };
        if due {
            self.set_atime(ino, now);
        }
        Ok(end)
    }

    /// [`FileSystem::readdir`] without the entries whose cookie is at or
    /// above `end` (from [`FileSystem::readdir_end`] when the listing
    /// began). Each entry that exists throughout the listing is returned
    /// exactly once, and the listing ends even if every entry it returns is
    /// renamed at once: the renamed entries fall past `end` (as POSIX allows
    /// for entries added after opendir or rewinddir).
    pub fn readdir_until(
        &self,
        ino: u64,
        cookie: u64,
        end: u64,
        max: usize,
    ) -> FsResult<Vec<DirEntry>> {
        let st = self.inner.state.read();
        let inode = st.inode(ino)?;
        st.dir(ino)?;
        let mut out = Vec::new();
        if cookie < dir::DOT_COOKIE && out.len() < max {
            out.push(DirEntry {
                ino,
                cookie: dir::DOT_COOKIE,
                kind: FileKind::Dir,
                name: b".".to_vec(),
            });
        }
        if cookie < dir::DOTDOT_COOKIE && out.len() < max {
            out.push(DirEntry {
                ino: inode.parent,
                cookie: dir::DOTDOT_COOKIE,
                kind: FileKind::Dir,
                name: b"..".to_vec(),
            });
        }
        let room = max.saturating_sub(out.len());
        for e in st.meta.dir_list(ino, cookie, end, room)? {
            let kind = match e.kind {
                Some(kind) => kind,
                None => st.meta.kind_of(e.ino)?.unwrap_or(FileKind::File),
            };
            out.push(DirEntry {
                ino: e.ino,
                cookie: e.cookie,
                kind,
                name: e.name,
            });
        }
        Ok(out)
    }

    pub fn setxattr(
        &self,
        caller: &Caller,
        ino: u64,
        name: &OsStr,
        value: &[u8],
        flags: i32,
    ) -> FsResult<()> {
        self.deferred.settle(ino);
        self.inner
            .mutate(|st| ops::xattr::set(st, caller, ino, bytes(name), value, flags))
    }

    pub fn getxattr(&self, caller: &Caller, ino: u64, name: &OsStr) -> FsResult<Vec<u8>> {
        self.deferred.settle(ino);
        ops::xattr::get(&self.inner.state.read(), caller, ino, bytes(name))
    }

    /// Names, each NUL-terminated, concatenated (listxattr(2) format).
    pub fn listxattr(&self, caller: &Caller, ino: u64) -> FsResult<Vec<u8>> {
        self.deferred.settle(ino);
        ops::xattr::list(&self.inner.state.read(), caller, ino)
    }

    pub fn removexattr(&self, caller: &Caller, ino: u64, name: &OsStr) -> FsResult<()> {
        self.deferred.settle(ino);
        self.inner
            .mutate_releasing(|st| ops::xattr::remove(st, caller, ino, bytes(name)))
    }

    /// Space and inode figures for statfs(2). Blocks freed by changes not
    /// yet committed count as free: the next allocation that needs them
    /// commits first ([`core::Inner::pending_free_bytes`]). Inodes are made
    /// as needed, so (as XFS does) the free count is how many more the free
    /// space could hold at [`INODE_COST`] bytes each.
    pub fn statfs(&self) -> FsResult<StatFs> {
        self.inner.absorb_grown_groups();
        let unallocated = self.inner.unallocated_bytes() / BLOCK_SIZE;
        let pending = self.inner.pending_free_bytes() / BLOCK_SIZE;
        let st = self.inner.state.read();
        let blocks = st.alloc.total_bytes() / BLOCK_SIZE + unallocated;
        let bfree = (st.alloc.free_bytes() / BLOCK_SIZE + unallocated + pending).min(blocks);
        let used_inodes = st.meta.inode_count();
        let ffree = (bfree * BLOCK_SIZE / INODE_COST).min(u64::MAX / 2 - used_inodes);
        Ok(StatFs {
            blocks,
            bfree,
            bavail: bfree,
            files: used_inodes + ffree,
            ffree,
            bsize: BLOCK_SIZE as u32,
            namelen: state::MAX_NAME as u32,
            frsize: BLOCK_SIZE as u32,
        })
    }
}
