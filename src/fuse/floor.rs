//! The FUSE floor (`raidfs bench fuse-floor`): a filesystem that keeps a
//! namespace and file sizes in memory and stores no data (writes are
//! answered and dropped, reads return zeros), served through the same
//! session as `raidfs mount`: the same threads, busy polling, FUSE_INIT
//! capabilities, readahead and page-cache policy per handle.
//!
//! It exists to measure: a benchmark run on it gives the most any daemon
//! can reach through this kernel's FUSE on this machine with raidfs's
//! session, so a job's figure on raidfs splits into what the FUSE path
//! costs (the floor against mergerfs or the host directory) and what the
//! array and its filesystem cost (raidfs against the floor). Nothing in it
//! is for keeping data; `raidfs bench` says so when it starts.

use std::collections::{BTreeMap, HashMap};
use std::ffi::{OsStr, OsString};
use std::time::SystemTime;

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, Generation, INodeNo, KernelConfig,
    LockOwner, OpenFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus,
    ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow,
    WriteFlags,
};
use parking_lot::Mutex;

use super::adapter::{fopen_flags, negotiate, served_as, AdapterSettings, UnmountOutcome};

const ROOT: u64 = 1;
/// What `statfs` reports: 1 TiB of 4 KiB blocks, all free.
const BLOCK: u32 = 4096;
const BLOCKS: u64 = 1 << 28;

struct Node {
    dir: bool,
    perm: u16,
    size: u64,
    nlink: u32,
    uid: u32,
    gid: u32,
    mtime: SystemTime,
    /// A directory's entries.
    entries: BTreeMap<OsString, u64>,
}

struct Nodes {
    nodes: HashMap<u64, Node>,
    next: u64,
}

impl Nodes {
    fn attr(&self, ino: u64) -> Result<FileAttr, Errno> {
        let n = self.nodes.get(&ino).ok_or(Errno::ENOENT)?;
        Ok(FileAttr {
            ino: INodeNo(ino),
            size: n.size,
            blocks: n.size.div_ceil(512),
            atime: n.mtime,
            mtime: n.mtime,
            ctime: n.mtime,
            crtime: n.mtime,
            kind: if n.dir {
                FileType::Directory
            } else {
                FileType::RegularFile
            },
            perm: n.perm,
            nlink: n.nlink,
            uid: n.uid,
            gid: n.gid,
            rdev: 0,
            blksize: BLOCK,
            flags: 0,
        })
    }

    fn dir(&mut self, ino: u64) -> Result<&mut Node, Errno> {
        match self.nodes.get_mut(&ino) {
            Some(n) if n.dir => Ok(n),
            Some(_) => Err(Errno::ENOTDIR),
            None => Err(Errno::ENOENT),
        }
    }

    /// A new entry `name` in `parent`, owned by `owner` (uid, gid).
    fn add(
        &mut self,
        owner: (u32, u32),
        parent: u64,
        name: &OsStr,
        dir: bool,
        mode: u32,
    ) -> Result<u64, Errno> {
        let ino = self.next;
        let entries = &mut self.dir(parent)?.entries;
        if entries.contains_key(name) {
            return Err(Errno::EEXIST);
        }
        entries.insert(name.to_os_string(), ino);
        self.next += 1;
        self.nodes.insert(
            ino,
            Node {
                dir,
                perm: (mode & 0o7777) as u16,
                size: 0,
                nlink: if dir { 2 } else { 1 },
                uid: owner.0,
                gid: owner.1,
                mtime: SystemTime::now(),
                entries: BTreeMap::new(),
            },
        );
        Ok(ino)
    }

    /// Remove `name` from `parent`: a directory only when `dir` and empty.
    fn remove(&mut self, parent: u64, name: &OsStr, dir: bool) -> Result<(), Errno> {
        let ino = *self.dir(parent)?.entries.get(name).ok_or(Errno::ENOENT)?;
        match self.nodes.get(&ino) {
            Some(n) if n.dir != dir => Err(if dir { Errno::ENOTDIR } else { Errno::EISDIR }),
            Some(n) if !n.entries.is_empty() => Err(Errno::ENOTEMPTY),
            _ => {
                self.dir(parent)?.entries.remove(name);
                self.nodes.remove(&ino);
                Ok(())
            }
        }
    }
}

/// The floor's filesystem.
pub(super) struct Floor {
    settings: AdapterSettings,
    nodes: Mutex<Nodes>,
    unmounted: UnmountOutcome,
}

impl Floor {
    pub(super) fn new(
        settings: AdapterSettings,
        unmounted: UnmountOutcome,
        owner: (u32, u32),
    ) -> Floor {
        let mut nodes = HashMap::new();
        nodes.insert(
            ROOT,
            Node {
                dir: true,
                perm: 0o755,
                size: 0,
                nlink: 2,
                uid: owner.0,
                gid: owner.1,
                mtime: SystemTime::now(),
                entries: BTreeMap::new(),
            },
        );
        Floor {
            settings,
            nodes: Mutex::new(Nodes {
                nodes,
                next: ROOT + 1,
            }),
            unmounted,
        }
    }

    fn attr(&self, attr: Result<FileAttr, Errno>, reply: ReplyAttr) {
        match attr {
            Ok(attr) => reply.attr(&self.settings.ttls.attr, &attr),
            Err(e) => reply.error(e),
        }
    }

    /// The entries of directory `ino` after cookie `offset`: cookie, inode,
    /// attributes and name ("." and ".." are cookies 1 and 2).
    fn listing(&self, ino: u64, offset: u64) -> Result<Vec<(u64, u64, FileAttr, OsString)>, Errno> {
        let mut nodes = self.nodes.lock();
        let entries = nodes.dir(ino)?.entries.clone();
        let dir = nodes.attr(ino)?;
        let dots = [
            (ino, dir, OsString::from(".")),
            (ino, dir, OsString::from("..")),
        ];
        let children = entries
            .into_iter()
            .filter_map(|(name, child)| Some((child, nodes.attr(child).ok()?, name)));
        Ok(dots
            .into_iter()
            .chain(children)
            .enumerate()
            .skip(usize::try_from(offset).unwrap_or(usize::MAX))
            .map(|(i, (child, attr, name))| (i as u64 + 1, child, attr, name))
            .collect())
    }

    fn entry(&self, ino: Result<u64, Errno>, reply: ReplyEntry) {
        match ino.and_then(|ino| self.nodes.lock().attr(ino)) {
            Ok(attr) => reply.entry(&self.settings.ttls.entry, &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }
}

impl Filesystem for Floor {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        negotiate(&self.settings, config);
        Ok(())
    }

    fn destroy(&mut self) {
        *self.unmounted.lock() = Some(Ok(()));
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let ino = {
            let mut nodes = self.nodes.lock();
            nodes
                .dir(parent.0)
                .and_then(|d| d.entries.get(name).copied().ok_or(Errno::ENOENT))
        };
        self.entry(ino, reply);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let attr = self.nodes.lock().attr(ino.0);
        self.attr(attr, reply);
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let mut nodes = self.nodes.lock();
        let Some(node) = nodes.nodes.get_mut(&ino.0) else {
            return reply.error(Errno::ENOENT);
        };
        if let Some(mode) = mode {
            node.perm = (mode & 0o7777) as u16;
        }
        if let Some(size) = size {
            node.size = size;
        }
        node.mtime = SystemTime::now();
        self.attr(nodes.attr(ino.0), reply);
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
        let ino =
            self.nodes
                .lock()
                .add((req.uid(), req.gid()), parent.0, name, true, mode & !umask);
        self.entry(ino, reply);
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let removed = self.nodes.lock().remove(parent.0, name, false);
        done(removed, reply);
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let removed = self.nodes.lock().remove(parent.0, name, true);
        done(removed, reply);
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
        let created = {
            let mut nodes = self.nodes.lock();
            let ino = nodes.add((req.uid(), req.gid()), parent.0, name, false, mode & !umask);
            ino.and_then(|ino| nodes.attr(ino))
        };
        match created {
            Ok(attr) => {
                let handle = served_as(&self.settings, flags);
                reply.created(
                    &self.settings.ttls.entry,
                    &attr,
                    Generation(0),
                    FileHandle(handle.handle()),
                    fopen_flags(&self.settings, handle),
                );
            }
            Err(e) => reply.error(e),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        {
            let mut nodes = self.nodes.lock();
            let Some(node) = nodes.nodes.get_mut(&ino.0) else {
                return reply.error(Errno::ENOENT);
            };
            if flags.0 & libc::O_TRUNC != 0 {
                node.size = 0;
            }
        }
        let handle = served_as(&self.settings, flags.0);
        reply.opened(
            FileHandle(handle.handle()),
            fopen_flags(&self.settings, handle),
        );
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
        let Some(len) = self.nodes.lock().nodes.get(&ino.0).map(|n| n.size) else {
            return reply.error(Errno::ENOENT);
        };
        let n = len.saturating_sub(offset).min(u64::from(size));
        // Within `size`, a u32.
        reply.data(&vec![0u8; n as usize]);
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let Ok(n) = u32::try_from(data.len()) else {
            return reply.error(Errno::EINVAL);
        };
        let mut nodes = self.nodes.lock();
        let Some(node) = nodes.nodes.get_mut(&ino.0) else {
            return reply.error(Errno::ENOENT);
        };
        node.size = node.size.max(offset.saturating_add(u64::from(n)));
        reply.written(n);
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let listing = match self.listing(ino.0, offset) {
            Ok(listing) => listing,
            Err(e) => return reply.error(e),
        };
        for (cookie, child, attr, name) in listing {
            if reply.add(INodeNo(child), cookie, attr.kind, &name) {
                break;
            }
        }
        reply.ok();
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let listing = match self.listing(ino.0, offset) {
            Ok(listing) => listing,
            Err(e) => return reply.error(e),
        };
        let ttl = self.settings.ttls.entry;
        for (cookie, child, attr, name) in listing {
            if reply.add(INodeNo(child), cookie, &name, &ttl, &attr, Generation(0)) {
                break;
            }
        }
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let files = self.nodes.lock().nodes.len() as u64;
        reply.statfs(
            BLOCKS,
            BLOCKS,
            BLOCKS,
            files,
            u64::MAX - files,
            BLOCK,
            255,
            BLOCK,
        );
    }

    /// The floor has no extended attributes; the kernel asks for
    /// `security.capability` before a file's first cached write, as it
    /// does of raidfs.
    fn getxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _size: u32,
        reply: ReplyXattr,
    ) {
        reply.error(Errno::ENODATA);
    }
}

fn done(result: Result<(), Errno>, reply: ReplyEmpty) {
    match result {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(e),
    }
}
