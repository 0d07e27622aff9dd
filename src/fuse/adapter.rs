//! The `fuser::Filesystem` implementation: each FUSE request becomes one or
//! two [`FileSystem`] calls, and each reply is built from their results.
//! Holds no filesystem state of its own beyond the mount's settings and,
//! for each open directory, where its listing ends; open file handles carry
//! their open(2) flags in the FUSE file handle.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::SystemTime;

use fuser::{
    AccessFlags, BsdFileFlags, CopyFileRangeFlags, Errno, FileHandle, Filesystem, FopenFlags,
    Generation, INodeNo, InitFlags, IoctlFlags, KernelConfig, LockOwner, Notifier, OpenFlags,
    RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty,
    ReplyEntry, ReplyIoctl, ReplyLseek, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request,
    TimeOrNow, WriteFlags,
};
use log::{debug, error, info, warn};
use parking_lot::Mutex;

use super::convert::{
    caller_of, errno_of, file_attr, file_type, is_serious, time_set, write_sync, HandleFlags, Ttls,
};
use crate::fs::{self, Attr, FallocateMode, FileSystem, FsError, FsResult, SetAttr};

/// Largest write request the kernel may send (and readahead it may issue).
pub const MAX_REQUEST_BYTES: u32 = 1 << 20;

/// The smallest write answered before it is done by the thread that
/// answered it. Answering early lets the writer copy its next request while
/// the daemon writes this one; done on the answering thread, each write
/// waits for the turn of the one before it, which pays only when there is
/// a large copy to overlap: `scripts/ab-dd --b-opts deferred_writes=0`
/// (RAID5, three rounds) put writes done before their answer ahead at 4 KiB
/// (173 against 131 MB/s), level at 16 KiB (307 against 300) and behind
/// from 64 KiB on (412 against 495, and 993 against 1,315 at 1 MiB)
/// (docs/performance.md, "Small writes done before their answer"). Smaller
/// writes go to the write queue instead ([`FileSystem::queue_write`]),
/// whose one thread never waits for a turn.
const SMALLEST_ANSWERED_FIRST: usize = 16 << 10;

/// Whether a write of `len` bytes is worth answering before it is done on
/// the answering thread (when the filesystem accepts it so:
/// [`FileSystem::accept_write`]); smaller ones are queued.
fn answered_first(len: usize) -> bool {
    len >= SMALLEST_ANSWERED_FIRST
}

/// FUSE opcodes (the kernel's `enum fuse_opcode`) of the requests that
/// [`quick_request`] lets the thread that read them serve.
mod opcode {
    pub const LOOKUP: u32 = 1;
    pub const FORGET: u32 = 2;
    pub const GETATTR: u32 = 3;
    pub const SETATTR: u32 = 4;
    pub const READLINK: u32 = 5;
    pub const SYMLINK: u32 = 6;
    pub const MKNOD: u32 = 8;
    pub const MKDIR: u32 = 9;
    pub const UNLINK: u32 = 10;
    pub const RMDIR: u32 = 11;
    pub const RENAME: u32 = 12;
    pub const LINK: u32 = 13;
    pub const OPEN: u32 = 14;
    pub const WRITE: u32 = 16;
    pub const STATFS: u32 = 17;
    pub const RELEASE: u32 = 18;
    pub const SETXATTR: u32 = 21;
    pub const GETXATTR: u32 = 22;
    pub const LISTXATTR: u32 = 23;
    pub const REMOVEXATTR: u32 = 24;
    pub const FLUSH: u32 = 25;
    pub const OPENDIR: u32 = 27;
    pub const RELEASEDIR: u32 = 29;
    pub const ACCESS: u32 = 34;
    pub const CREATE: u32 = 35;
    pub const IOCTL: u32 = 39;
    pub const BATCH_FORGET: u32 = 42;
    pub const RENAME2: u32 = 45;
    pub const TMPFILE: u32 = 51;
}

/// A WRITE request's bytes before its data: `fuse_in_header` and
/// `fuse_write_in`, 40 bytes each.
const WRITE_REQUEST_HEADERS: u32 = 80;

/// Whether a request (its opcode and length, header included) is served in
/// memory without waiting for a disk, so that under busy polling the
/// thread that read it serves it without handing the reading on first
/// (`fuser::BusyPoll`). Those are the namespace and attribute requests,
/// and writes done before their answer ([`answered_first`]): they touch
/// the stripe cache, not the members. Reads, fsyncs, writes answered first
/// and everything else end the polling: every idle thread then reads the
/// device as without busy polling, so the next request is read while they
/// wait. A quick request that waits after all (a lock, a full journal)
/// holds the reading up for a millisecond or two: the session's watchdog
/// then hands it on.
pub fn quick_request(op: u32, len: u32) -> bool {
    use opcode::*;
    match op {
        WRITE => !answered_first(len.saturating_sub(WRITE_REQUEST_HEADERS) as usize),
        LOOKUP | FORGET | BATCH_FORGET | GETATTR | SETATTR | READLINK | SYMLINK | MKNOD | MKDIR
        | UNLINK | RMDIR | RENAME | RENAME2 | LINK | OPEN | CREATE | TMPFILE | STATFS | RELEASE
        | FLUSH | OPENDIR | RELEASEDIR | ACCESS | SETXATTR | GETXATTR | LISTXATTR | REMOVEXATTR
        | IOCTL => true,
        _ => false,
    }
}

/// What a new handle remembers. A handle served without the page cache
/// counts as O_DIRECT, so its writes are synced as an O_DIRECT file's
/// would be (the kernel sends no FSYNC after direct writes of O_DSYNC
/// files). That is every open with `direct_io`, and a write-only open
/// unless `kernel_cache` has the kernel keep pages (or `writeback_cache`,
/// below): such a handle reads nothing, and the next open drops the
/// file's pages anyway, so copying its writes into them buys nothing. Served direct,
/// its writes also skip the kernel's `security.capability` lookup before
/// a file's first cached write: one round trip less per file written.
///
/// With `writeback_cache` no handle that can write is served direct, not
/// even an O_DIRECT one: the kernel then keeps a file's times and size
/// itself and never takes them from the daemon again, and a write
/// through a direct handle (`FOPEN_DIRECT_IO`) does not move its mtime,
/// so `stat` would show the time of the last cached write for good. An
/// O_DIRECT open still goes around the page cache, through the kernel's
/// own direct I/O, which updates the times (and sends FSYNC after
/// O_DSYNC writes, as for cached ones).
pub(super) fn served_as(settings: &AdapterSettings, flags: i32) -> HandleFlags {
    let asked = HandleFlags(flags);
    if settings.writeback_cache && asked.writable() {
        return HandleFlags(flags & !libc::O_DIRECT);
    }
    let write_only = !asked.readable();
    if settings.direct_io || (write_only && !settings.kernel_cache) {
        HandleFlags(flags | libc::O_DIRECT)
    } else {
        asked
    }
}

/// How the kernel is to serve a new handle. A close sends FLUSH only
/// for handles that can write: FLUSH reports a write of the file that
/// failed after it was answered, which is the writer's to hear (a
/// reader's close would take the report from it), and it costs every
/// close a round trip the caller waits for.
pub(super) fn fopen_flags(settings: &AdapterSettings, handle: HandleFlags) -> FopenFlags {
    let caching = if handle.direct() {
        FopenFlags::FOPEN_DIRECT_IO | FopenFlags::FOPEN_PARALLEL_DIRECT_WRITES
    } else if settings.kernel_cache {
        FopenFlags::FOPEN_KEEP_CACHE
    } else {
        FopenFlags::empty()
    };
    if handle.writable() {
        caching
    } else {
        caching | FopenFlags::FOPEN_NOFLUSH
    }
}

/// The capabilities and limits both filesystems served here ask the kernel
/// for in FUSE_INIT (`RaidFuse`, and `floor::Floor`, which must be served
/// alike to measure the same path).
pub(super) fn negotiate(settings: &AdapterSettings, config: &mut KernelConfig) {
    if let Err(nearest) = config.set_max_write(MAX_REQUEST_BYTES) {
        let _ = config.set_max_write(nearest);
    }
    if let Err(nearest) = config.set_max_readahead(MAX_REQUEST_BYTES) {
        let _ = config.set_max_readahead(nearest);
    }
    let _ = config.set_max_background(64);
    let mut wanted = InitFlags::FUSE_EXPORT_SUPPORT
        | InitFlags::FUSE_DO_READDIRPLUS
        | InitFlags::FUSE_READDIRPLUS_AUTO
        | InitFlags::FUSE_PARALLEL_DIROPS
        | InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP
        // The filesystem clears set-ID bits and capabilities on write,
        // truncate and chown itself, so the kernel need not ask for
        // `security.capability` (one more round trip) before every write.
        | InitFlags::FUSE_HANDLE_KILLPRIV_V2
        // The mode of a new entry arrives without the umask applied:
        // the filesystem applies it, or the parent's default ACL in
        // its place (POSIX.1e), which a pre-masked mode would defeat.
        | InitFlags::FUSE_DONT_MASK;
    if settings.default_permissions {
        // The kernel checks permissions itself then: with the ACLs too.
        wanted |= InitFlags::FUSE_POSIX_ACL;
    }
    if settings.writeback_cache {
        wanted |= InitFlags::FUSE_WRITEBACK_CACHE;
    }
    if settings.io_uring {
        wanted |= InitFlags::FUSE_OVER_IO_URING;
    }
    let supported = config.capabilities();
    let missing = wanted & !supported;
    if missing.contains(InitFlags::FUSE_EXPORT_SUPPORT) {
        warn!("kernel lacks FUSE_EXPORT_SUPPORT: file handles (NFS export) will not survive cache eviction");
    }
    if missing.contains(InitFlags::FUSE_WRITEBACK_CACHE) {
        warn!("kernel lacks FUSE_WRITEBACK_CACHE: writeback_cache ignored");
    }
    if missing.contains(InitFlags::FUSE_OVER_IO_URING) {
        warn!(
            "the kernel does not offer FUSE over io_uring (Linux 6.14 on, with \
             /sys/module/fuse/parameters/enable_uring set to Y): requests go through /dev/fuse"
        );
    } else if wanted.contains(InitFlags::FUSE_OVER_IO_URING) {
        info!("requests are served over FUSE io_uring");
    }
    if config.add_capabilities(wanted & supported).is_err() {
        warn!("kernel refused some FUSE capabilities: {wanted:?}");
    }
    info!(
        "FUSE session initialised (kernel ABI {:?})",
        config.kernel_abi()
    );
}

/// Directory entries fetched from the filesystem per batch while filling
/// one readdir reply (whose byte size only the reply buffer knows).
const READDIR_BATCH: usize = 128;

/// Settings of the adapter fixed at mount time.
#[derive(Clone, Debug)]
pub struct AdapterSettings {
    pub ttls: Ttls,
    /// FOPEN_KEEP_CACHE on opens: page cache survives close/open.
    pub kernel_cache: bool,
    pub writeback_cache: bool,
    /// Every open is served as an O_DIRECT one (`-o direct_io`).
    pub direct_io: bool,
    /// Ask for FUSE over io_uring (`-o io_uring`).
    pub io_uring: bool,
    /// The kernel checks permissions itself (`default_permissions`), so
    /// supplementary groups need not be read for every request.
    pub default_permissions: bool,
}

/// The outcome of `FileSystem::unmount` once the session has ended.
pub type UnmountOutcome = Arc<Mutex<Option<FsResult<()>>>>;

pub struct RaidFuse {
    fs: Arc<FileSystem>,
    settings: AdapterSettings,
    unmounted: UnmountOutcome,
    /// Tells the kernel about changes it did not ask for (set once the
    /// session exists).
    notifier: Arc<OnceLock<Notifier>>,
    /// Directory handle → the `readdir_end` its listing stops at, so a
    /// listing ends even when each entry it returns is renamed (and so gets
    /// a new, higher cookie) before the next batch is asked for.
    dir_ends: Mutex<HashMap<u64, u64>>,
    next_dir_fh: AtomicU64,
}

impl RaidFuse {
    pub fn new(
        fs: Arc<FileSystem>,
        settings: AdapterSettings,
        unmounted: UnmountOutcome,
        notifier: Arc<OnceLock<Notifier>>,
    ) -> RaidFuse {
        RaidFuse {
            fs,
            settings,
            unmounted,
            notifier,
            dir_ends: Mutex::new(HashMap::new()),
            next_dir_fh: AtomicU64::new(1),
        }
    }

    /// Where the listing through handle `fh` ends, fixed by its first read.
    /// A read from offset 0 (the first, or one after rewinddir) starts a new
    /// listing, which sees the directory as it is now.
    fn dir_end(&self, ino: u64, fh: u64, offset: u64) -> FsResult<u64> {
        if offset != 0 {
            if let Some(&end) = self.dir_ends.lock().get(&fh) {
                return Ok(end);
            }
        }
        let end = self.fs.readdir_end(ino)?;
        self.dir_ends.lock().insert(fh, end);
        Ok(end)
    }

    fn caller(&self, req: &Request) -> fs::Caller {
        caller_of(req, !self.settings.default_permissions)
    }

    fn entry(&self, attr: &Attr, reply: ReplyEntry) {
        reply.entry(
            &self.settings.ttls.entry,
            &file_attr(attr),
            Generation(attr.generation),
        );
    }

    /// See [`served_as`].
    fn handle_flags(&self, flags: i32) -> HandleFlags {
        served_as(&self.settings, flags)
    }

    /// The kernel caches a file's mode: after a change it did not ask for
    /// (a write clearing set-ID bits) have it ask again.
    fn mode_changed(&self, ino: INodeNo) {
        if let Some(notifier) = self.notifier.get() {
            let _ = notifier.inval_inode(ino, -1, 0);
        }
    }

    /// Answer a create or tmpfile with the new file, open as `flags` says.
    fn created(&self, attr: &Attr, flags: i32, reply: ReplyCreate) {
        let handle = self.handle_flags(flags);
        reply.created(
            &self.settings.ttls.entry,
            &file_attr(attr),
            Generation(attr.generation),
            FileHandle(handle.handle()),
            self.open_flags(handle),
        );
    }

    /// See [`fopen_flags`].
    fn open_flags(&self, handle: HandleFlags) -> FopenFlags {
        fopen_flags(&self.settings, handle)
    }

    /// An access ACL set or removed moves the mode's bits (the group bits
    /// are its mask, and set-group-ID may go), but the kernel refreshes
    /// only ctime after a setxattr: have it ask for the attributes again,
    /// or `stat` right after `setfacl` shows the old mode for the attribute
    /// timeout (fstests generic/375).
    fn after_acl_change(&self, ino: INodeNo, name: &OsStr) {
        if name.as_encoded_bytes() == crate::fs::acl::ACCESS {
            self.mode_changed(ino);
        }
    }

    /// Fill a readdir(plus) reply from the filesystem's cookies; `add`
    /// returns true when the reply buffer is full.
    fn fill_dir(
        &self,
        ino: u64,
        fh: u64,
        offset: u64,
        mut add: impl FnMut(&fs::DirEntry) -> bool,
    ) -> FsResult<()> {
        let end = self.dir_end(ino, fh, offset)?;
        let mut cookie = offset;
        loop {
            let batch = self.fs.readdir_until(ino, cookie, end, READDIR_BATCH)?;
            let Some(last) = batch.last() else {
                return Ok(());
            };
            let next_cookie = last.cookie;
            let exhausted = batch.len() < READDIR_BATCH;
            for entry in &batch {
                if add(entry) {
                    return Ok(());
                }
            }
            if exhausted {
                return Ok(());
            }
            cookie = next_cookie;
        }
    }
}

/// Log a failed request; corruption and storage failures loudly.
fn log_failure(op: &str, err: &FsError) {
    if is_serious(err) {
        error!("{op}: {err}");
    } else {
        debug!("{op}: {err}");
    }
}

macro_rules! try_reply {
    ($op:expr, $reply:expr, $result:expr) => {
        match $result {
            Ok(value) => value,
            Err(err) => {
                log_failure($op, &err);
                $reply.error(errno_of(&err));
                return;
            }
        }
    };
}

fn xattr_reply(value: Vec<u8>, size: u32, reply: ReplyXattr) {
    if size == 0 {
        match u32::try_from(value.len()) {
            Ok(len) => reply.size(len),
            Err(_) => reply.error(Errno::E2BIG),
        }
    } else if value.len() > size as usize {
        reply.error(Errno::ERANGE);
    } else {
        reply.data(&value);
    }
}

impl Filesystem for RaidFuse {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        negotiate(&self.settings, config);
        Ok(())
    }

    fn destroy(&mut self) {
        let outcome = self.fs.unmount();
        match &outcome {
            Ok(()) => info!("filesystem unmounted cleanly"),
            Err(err) => error!("unmounting the filesystem failed: {err}"),
        }
        *self.unmounted.lock() = Some(outcome);
    }

    /// Path walks never send "." or ".." (the VFS resolves them); they come
    /// from NFS export: "." asks for an inode by number (of any kind), so it
    /// is answered from the inode itself; ".." asks for a directory's parent.
    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let result = if name.as_bytes() == b"." {
            self.fs.getattr(parent.0)
        } else {
            self.fs.lookup(&self.caller(req), parent.0, name)
        };
        let attr = try_reply!("lookup", reply, result);
        self.entry(&attr, reply);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let attr = try_reply!("getattr", reply, self.fs.getattr(ino.0));
        reply.attr(&self.settings.ttls.attr, &file_attr(&attr));
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let set = SetAttr {
            mode,
            uid,
            gid,
            size,
            atime: atime.map(time_set),
            mtime: mtime.map(time_set),
            through_writable_fd: fh.is_some_and(|fh| {
                HandleFlags::from_handle(fh.0).0 & libc::O_ACCMODE != libc::O_RDONLY
            }),
        };
        let attr = try_reply!(
            "setattr",
            reply,
            self.fs.setattr(&self.caller(req), ino.0, &set)
        );
        reply.attr(&self.settings.ttls.attr, &file_attr(&attr));
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        let target = try_reply!("readlink", reply, self.fs.readlink(ino.0));
        reply.data(&target);
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let attr = try_reply!(
            "mknod",
            reply,
            self.fs
                .mknod(&self.caller(req), parent.0, name, mode, umask, rdev)
        );
        self.entry(&attr, reply);
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let attr = try_reply!(
            "mkdir",
            reply,
            self.fs
                .mkdir(&self.caller(req), parent.0, name, mode, umask)
        );
        self.entry(&attr, reply);
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        try_reply!(
            "unlink",
            reply,
            self.fs.unlink(&self.caller(req), parent.0, name)
        );
        reply.ok();
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        try_reply!(
            "rmdir",
            reply,
            self.fs.rmdir(&self.caller(req), parent.0, name)
        );
        reply.ok();
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let target = target.as_os_str().as_bytes();
        let attr = try_reply!(
            "symlink",
            reply,
            self.fs
                .symlink(&self.caller(req), parent.0, link_name, target)
        );
        self.entry(&attr, reply);
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let known = RenameFlags::RENAME_NOREPLACE
            | RenameFlags::RENAME_EXCHANGE
            | RenameFlags::RENAME_WHITEOUT;
        if !known.contains(flags) {
            reply.error(Errno::EINVAL);
            return;
        }
        let flags = fs::RenameFlags {
            noreplace: flags.contains(RenameFlags::RENAME_NOREPLACE),
            exchange: flags.contains(RenameFlags::RENAME_EXCHANGE),
            whiteout: flags.contains(RenameFlags::RENAME_WHITEOUT),
        };
        let caller = self.caller(req);
        try_reply!(
            "rename",
            reply,
            self.fs
                .rename(&caller, parent.0, name, newparent.0, newname, flags)
        );
        reply.ok();
    }

    fn link(
        &self,
        req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let attr = try_reply!(
            "link",
            reply,
            self.fs.link(&self.caller(req), ino.0, newparent.0, newname)
        );
        self.entry(&attr, reply);
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        try_reply!(
            "open",
            reply,
            self.fs.open_inode(&self.caller(req), ino.0, flags.0)
        );
        let handle = self.handle_flags(flags.0);
        reply.opened(FileHandle(handle.handle()), self.open_flags(handle));
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let data = try_reply!("read", reply, self.fs.read(ino.0, offset, size as usize));
        reply.data(&data);
    }

    fn write(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        // With FUSE_HANDLE_KILLPRIV_V2 the kernel says when the writer lacks
        // CAP_FSETID, and leaves clearing the set-ID bits to us.
        let kill_setid = write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID);
        let from_cache = write_flags.contains(WriteFlags::FUSE_WRITE_CACHE);
        let sync = write_sync(HandleFlags::from_handle(fh.0), flags.0, from_cache);
        // The length is checked first: an accepted write must be done.
        if let (None, Ok(n)) = (sync, u32::try_from(data.len())) {
            if answered_first(data.len()) {
                // Answer first, then write: the writer copies its next
                // request while this one is written (see `fs::deferred`).
                if let Some(accepted) = self.fs.accept_write(ino.0, offset, data.len(), kill_setid)
                {
                    reply.written(n);
                    self.fs.complete_write(accepted, data);
                    return;
                }
            } else if self.fs.queue_write(ino.0, offset, data, kill_setid) {
                // Queued for the writer thread (see `fs::write_queue`).
                reply.written(n);
                return;
            }
        }
        let written = if kill_setid {
            self.fs
                .write_clearing_setid(&self.caller(req), ino.0, offset, data)
                .map(|(written, mode_changed)| {
                    // A write invalidates only the cached size and times.
                    if mode_changed {
                        self.mode_changed(ino);
                    }
                    written
                })
        } else {
            self.fs.write(ino.0, offset, data)
        };
        let written = try_reply!("write", reply, written);
        if let Some(datasync) = sync {
            try_reply!("write (O_SYNC)", reply, self.fs.fsync(ino.0, datasync));
        }
        match u32::try_from(written) {
            Ok(n) => reply.written(n),
            Err(_) => reply.error(Errno::EIO),
        }
    }

    /// close(2) is not a durability point (fsync is); it reports a write
    /// that failed after it was answered. Only handles that can write send
    /// it (`open_flags`).
    fn flush(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        try_reply!("flush", reply, self.fs.flush(ino.0));
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        try_reply!("release", reply, self.fs.release(ino.0));
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        try_reply!("fsync", reply, self.fs.fsync(ino.0, datasync));
        reply.ok();
    }

    fn opendir(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        try_reply!(
            "opendir",
            reply,
            self.fs.open_inode(&self.caller(req), ino.0, flags.0)
        );
        let fh = self.next_dir_fh.fetch_add(1, Ordering::Relaxed);
        reply.opened(FileHandle(fh), FopenFlags::empty());
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let filled = self.fill_dir(ino.0, fh.0, offset, |entry| {
            reply.add(
                INodeNo(entry.ino),
                entry.cookie,
                file_type(entry.kind),
                OsStr::from_bytes(&entry.name),
            )
        });
        try_reply!("readdir", reply, filled);
        reply.ok();
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let ttl = self.settings.ttls.entry;
        let filled = self.fill_dir(ino.0, fh.0, offset, |entry| {
            // An entry removed since the listing was read is skipped; its
            // cookie still orders the ones after it.
            match self.fs.getattr(entry.ino) {
                Ok(attr) => reply.add(
                    INodeNo(entry.ino),
                    entry.cookie,
                    OsStr::from_bytes(&entry.name),
                    &ttl,
                    &file_attr(&attr),
                    Generation(attr.generation),
                ),
                Err(err) => {
                    log_failure("readdirplus getattr", &err);
                    false
                }
            }
        });
        try_reply!("readdirplus", reply, filled);
        reply.ok();
    }

    fn releasedir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.dir_ends.lock().remove(&fh.0);
        try_reply!("releasedir", reply, self.fs.release(ino.0));
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        try_reply!("fsyncdir", reply, self.fs.fsync(ino.0, datasync));
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let s = try_reply!("statfs", reply, self.fs.statfs());
        reply.statfs(
            s.blocks, s.bfree, s.bavail, s.files, s.ffree, s.bsize, s.namelen, s.frsize,
        );
    }

    fn setxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        try_reply!(
            "setxattr",
            reply,
            self.fs
                .setxattr(&self.caller(req), ino.0, name, value, flags)
        );
        self.after_acl_change(ino, name);
        reply.ok();
    }

    fn getxattr(&self, req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let value = try_reply!(
            "getxattr",
            reply,
            self.fs.getxattr(&self.caller(req), ino.0, name)
        );
        xattr_reply(value, size, reply);
    }

    fn listxattr(&self, req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let names = try_reply!(
            "listxattr",
            reply,
            self.fs.listxattr(&self.caller(req), ino.0)
        );
        xattr_reply(names, size, reply);
    }

    fn removexattr(&self, req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        try_reply!(
            "removexattr",
            reply,
            self.fs.removexattr(&self.caller(req), ino.0, name)
        );
        self.after_acl_change(ino, name);
        reply.ok();
    }

    fn access(&self, req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        try_reply!(
            "access",
            reply,
            self.fs.access(&self.caller(req), ino.0, mask.bits() as u32)
        );
        reply.ok();
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let caller = self.caller(req);
        let attr = try_reply!(
            "create",
            reply,
            self.fs.create(&caller, parent.0, name, mode, umask, flags)
        );
        self.created(&attr, flags, reply);
    }

    /// open(2) with O_TMPFILE (the patched fuser in vendor/fuser): O_EXCL
    /// means the file may never be given a name.
    fn tmpfile(
        &self,
        req: &Request,
        parent: INodeNo,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let caller = self.caller(req);
        let linkable = flags & libc::O_EXCL == 0;
        let attr = try_reply!(
            "tmpfile",
            reply,
            self.fs.tmpfile(&caller, parent.0, mode, umask, linkable)
        );
        self.created(&attr, flags, reply);
    }

    /// No ioctl is served: ENOTTY, what a file without inode flags answers.
    /// overlayfs asks FS_IOC_GETFLAGS of every file it copies up and takes
    /// ENOTTY as "none"; answered here, not by fuser's default, which logs a
    /// warning per request.
    fn ioctl(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: IoctlFlags,
        cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: ReplyIoctl,
    ) {
        debug!("ioctl {cmd:#x}: not supported");
        reply.error(Errno::ENOTTY);
    }

    /// SEEK_DATA and SEEK_HOLE; the kernel answers the other whence values
    /// itself and never sends them.
    fn lseek(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        let whence = match whence {
            libc::SEEK_DATA => fs::Seek::Data,
            libc::SEEK_HOLE => fs::Seek::Hole,
            _ => {
                reply.error(Errno::EINVAL);
                return;
            }
        };
        let result = u64::try_from(offset)
            .map_err(|_| FsError::PastEnd)
            .and_then(|offset| self.fs.seek(ino.0, offset, whence));
        let found = try_reply!("lseek", reply, result);
        match i64::try_from(found) {
            Ok(found) => reply.offset(found),
            Err(_) => reply.error(Errno::EOVERFLOW),
        }
    }

    /// The kernel has checked the descriptors, the ranges and the size
    /// limits (RLIMIT_FSIZE among them) before it asks; the handles are
    /// checked again here, as the filesystem layer checks the ranges.
    fn copy_file_range(
        &self,
        req: &Request,
        ino_in: INodeNo,
        fh_in: FileHandle,
        offset_in: u64,
        ino_out: INodeNo,
        fh_out: FileHandle,
        offset_out: u64,
        len: u64,
        flags: CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        if !flags.is_empty() {
            reply.error(Errno::EINVAL);
            return;
        }
        let (from, to) = (
            HandleFlags::from_handle(fh_in.0),
            HandleFlags::from_handle(fh_out.0),
        );
        if !from.readable() || !to.writable() || to.0 & libc::O_APPEND != 0 {
            reply.error(Errno::EBADF);
            return;
        }
        let caller = self.caller(req);
        let (copied, mode_changed) = try_reply!(
            "copy_file_range",
            reply,
            self.fs
                .copy_file_range(&caller, ino_in.0, offset_in, ino_out.0, offset_out, len)
        );
        if mode_changed {
            self.mode_changed(ino_out);
        }
        if to.sync_writes() {
            try_reply!(
                "copy_file_range (O_SYNC)",
                reply,
                self.fs.fsync(ino_out.0, !to.sync_metadata())
            );
        }
        match u32::try_from(copied) {
            Ok(n) => reply.written(n),
            Err(_) => reply.error(Errno::EIO),
        }
    }

    fn fallocate(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let known = libc::FALLOC_FL_KEEP_SIZE | libc::FALLOC_FL_PUNCH_HOLE;
        if mode & !known != 0 {
            reply.error(Errno::EOPNOTSUPP);
            return;
        }
        let mode = FallocateMode {
            keep_size: mode & libc::FALLOC_FL_KEEP_SIZE != 0,
            punch_hole: mode & libc::FALLOC_FL_PUNCH_HOLE != 0,
        };
        let changed = try_reply!(
            "fallocate",
            reply,
            self.fs
                .fallocate_as(&self.caller(req), ino.0, offset, length, mode)
        );
        if changed {
            // As after a write: the kernel's cached mode is out of date.
            if let Some(notifier) = self.notifier.get() {
                let _ = notifier.inval_inode(ino, -1, 0);
            }
        }
        reply.ok();
    }
}
