//! The filesystem's metadata as keys of the metadata tree ([`super::tree`]),
//! and the checkpoint that writes what changed since the previous one.
//!
//! Every key starts with a kind byte, then big-endian numbers, so one kind's
//! keys sort together and, within it, by inode (then file offset, name or
//! cookie). docs/format.md lists each key and value byte by byte.
//!
//! While mounted the metadata is also held whole in memory ([`Meta`]);
//! the tree is what a checkpoint makes durable. [`Touched`] collects the
//! keys every journal record since the last checkpoint changed, so a
//! checkpoint rewrites those and nothing else: its cost follows what
//! changed, not the size of the filesystem.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use super::csum::CsumMap;
use super::dir::{Dir, DirImage, Lookup, Slot};
use super::extent::{Extent, ExtentMap};
use super::inode::{Inode, Time};
use super::inode_cache::{Listed, MetaSource};
use super::journal::{Journal, TreeCheckpoint};
use super::layout::{decode, encode, FsHeader, Region};
use super::meta::{CommitRecord, DirOp, Meta};
use super::node_space::NodeSpace;
use super::progress::Progress;
use super::store::BlockStore;
use super::tree::{self, Tree, TreeRoot};
use super::{FileKind, FsError, FsResult};

/// The kind byte that starts each key.
pub mod kind {
    /// `[1][ino]` → the inode's attributes ([`super::StoredInode`]).
    pub const INODE: u8 = 1;
    /// `[2][ino][name][0][piece u16]` → a piece of an extended attribute's value.
    pub const XATTR: u8 = 2;
    /// `[3][ino][file offset]` → one extent (16 bytes).
    pub const EXTENT: u8 = 3;
    /// `[4][ino][piece u16]` → a piece of a symlink's target.
    pub const TARGET: u8 = 4;
    /// `[5][dir][name]` → the entry's inode and cookie (u64 each, LE).
    pub const DIRENT: u8 = 5;
    /// `[6][dir][cookie]` → the entry's inode (u64 LE), its kind (one
    /// byte) and its name: readdir by cookie reads nothing else.
    pub const COOKIE: u8 = 6;
    /// `[7][dir]` → the directory's next cookie (u64 LE).
    pub const DIRINFO: u8 = 7;
    /// `[8][chunk]` → the checksums of 64 data blocks (`CsumMap::chunk_bytes`).
    pub const CSUM: u8 = 8;
}

/// Bytes of a value piece: a piece and its longest key stay within a tree
/// entry (an xattr key is at most 1 + 8 + 255 + 1 + 2 bytes).
pub const PIECE: usize = 768;

/// Entries a checkpoint's tree cache keeps (4 KiB nodes).
const CACHE_NODES: usize = 4096;

/// An inode's attributes as stored (its xattrs, target and extents have
/// keys of their own).
#[derive(Serialize, Deserialize)]
pub struct StoredInode {
    pub generation: u64,
    #[serde(with = "super::codes::file_kind")]
    pub kind: FileKind,
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
    pub parent: u64,
    /// Which other kinds of keys the inode has ([`parts`]): a load reads
    /// only those.
    pub parts: u8,
}

/// Bits of [`StoredInode::parts`].
pub mod parts {
    pub const XATTRS: u8 = 1;
    pub const TARGET: u8 = 2;
    pub const EXTENTS: u8 = 4;
}

fn parts_of(inode: &Inode) -> u8 {
    let mut p = 0;
    if !inode.xattrs.is_empty() {
        p |= parts::XATTRS;
    }
    if !inode.target.is_empty() {
        p |= parts::TARGET;
    }
    if !inode.extents.is_empty() {
        p |= parts::EXTENTS;
    }
    p
}

fn key(kind: u8, id: u64) -> Vec<u8> {
    let mut k = Vec::with_capacity(17);
    k.push(kind);
    k.extend_from_slice(&id.to_be_bytes());
    k
}

fn key2(kind: u8, id: u64, tail: &[u8]) -> Vec<u8> {
    let mut k = key(kind, id);
    k.extend_from_slice(tail);
    k
}

/// Every key of `kind` for `id`: `[start, end)`.
fn id_range(kind: u8, id: u64) -> (Vec<u8>, Vec<u8>) {
    match id.checked_add(1) {
        Some(next) => (key(kind, id), key(kind, next)),
        None => (key(kind, id), vec![kind + 1]),
    }
}

fn u64_le(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

fn id_of(k: &[u8]) -> FsResult<u64> {
    k.get(1..9)
        .and_then(|b| b.try_into().ok())
        .map(u64::from_be_bytes)
        .ok_or_else(|| FsError::Corrupt(format!("metadata key {k:02x?} is too short")))
}

/// The keys changed since the last checkpoint, collected from the journal
/// records (written, refused or replayed) that changed them.
#[derive(Debug, Default)]
pub struct Touched {
    inodes: BTreeSet<u64>,
    dirents: BTreeSet<(u64, Vec<u8>)>,
    /// Checksum chunk keys, first and last of each span.
    csum_spans: Vec<(u64, u64)>,
}

impl Touched {
    pub fn note(&mut self, rec: &CommitRecord) {
        self.inodes.extend(rec.puts.iter().map(|i| i.ino));
        self.inodes.extend(rec.deleted.iter().copied());
        for op in &rec.dir_ops {
            let (DirOp::Insert { dir, name, .. } | DirOp::Remove { dir, name }) = op;
            self.dirents.insert((*dir, name.clone()));
        }
        let sets = rec
            .csum_sets
            .iter()
            .map(|(addr, crcs)| (*addr, crcs.len() as u64 * super::inode::BLOCK_SIZE));
        let drops = rec.csum_drops.iter().map(|e| (e.addr, e.len));
        for (addr, len) in sets.chain(drops) {
            if let Some(span) = CsumMap::chunk_span(addr, len) {
                self.csum_spans.push(span);
            }
        }
    }

    /// Keys a checkpoint rewrites for what was noted, roughly: an inode's
    /// attributes and one more key of it, an entry and its cookie, each
    /// checksum chunk spanned.
    fn keys(&self) -> u64 {
        let chunks: u64 = self
            .csum_spans
            .iter()
            .map(|(first, last)| last.saturating_sub(*first).saturating_add(1).min(1 << 32))
            .fold(0, u64::saturating_add);
        (self.inodes.len() as u64 + self.dirents.len() as u64)
            .saturating_mul(2)
            .saturating_add(chunks)
    }

    /// The spans merged where they meet or overlap, ascending.
    fn merged_spans(&mut self) -> Vec<(u64, u64)> {
        let mut spans = std::mem::take(&mut self.csum_spans);
        spans.sort_unstable();
        let mut out: Vec<(u64, u64)> = Vec::new();
        for (first, last) in spans {
            match out.last_mut() {
                Some((_, end)) if first <= end.saturating_add(1) => *end = (*end).max(last),
                _ => out.push((first, last)),
            }
        }
        out
    }
}

/// Where entries are put: the tree, or a list (the fuzz samples).
trait Sink {
    fn put(&mut self, key: &[u8], value: &[u8]) -> FsResult<()>;
}

struct TreeSink<'a> {
    tree: &'a mut Tree,
    store: &'a dyn BlockStore,
}

impl Sink for TreeSink<'_> {
    fn put(&mut self, key: &[u8], value: &[u8]) -> FsResult<()> {
        self.tree.put(self.store, key, value)
    }
}

impl Sink for Vec<(Vec<u8>, Vec<u8>)> {
    fn put(&mut self, key: &[u8], value: &[u8]) -> FsResult<()> {
        self.push((key.to_vec(), value.to_vec()));
        Ok(())
    }
}

fn put_pieces(t: &mut dyn Sink, prefix: &[u8], value: &[u8], always: bool) -> FsResult<()> {
    if value.is_empty() && !always {
        return Ok(());
    }
    let mut pieces: Vec<&[u8]> = value.chunks(PIECE).collect();
    if pieces.is_empty() {
        pieces.push(&[]);
    }
    if pieces.len() > u16::MAX as usize {
        return Err(FsError::TooBig);
    }
    for (i, piece) in pieces.into_iter().enumerate() {
        let mut k = prefix.to_vec();
        k.extend_from_slice(&(i as u16).to_be_bytes());
        t.put(&k, piece)?;
    }
    Ok(())
}

/// Write every key of `inode` (after its old keys were deleted).
fn put_inode(t: &mut dyn Sink, inode: &Inode) -> FsResult<()> {
    let stored = StoredInode {
        generation: inode.generation,
        kind: inode.kind,
        perm: inode.perm,
        uid: inode.uid,
        gid: inode.gid,
        size: inode.size,
        nlink: inode.nlink,
        rdev: inode.rdev,
        atime: inode.atime,
        mtime: inode.mtime,
        ctime: inode.ctime,
        crtime: inode.crtime,
        parent: inode.parent,
        parts: parts_of(inode),
    };
    t.put(&key(kind::INODE, inode.ino), &encode(&stored)?)?;
    for (name, value) in &inode.xattrs {
        let mut prefix = key2(kind::XATTR, inode.ino, name);
        prefix.push(0);
        put_pieces(t, &prefix, value, true)?;
    }
    put_pieces(t, &key(kind::TARGET, inode.ino), &inode.target, false)?;
    for (off, ext) in inode.extents.iter() {
        t.put(
            &key2(kind::EXTENT, inode.ino, &off.to_be_bytes()),
            &ExtentMap::stored_bytes(ext),
        )?;
    }
    Ok(())
}

fn delete_ids(t: &mut Tree, store: &dyn BlockStore, kinds: &[u8], id: u64) -> FsResult<()> {
    for &k in kinds {
        let (start, end) = id_range(k, id);
        t.delete_range(store, &start, &end)?;
    }
    Ok(())
}

fn slot_bytes(slot: Slot) -> [u8; 16] {
    let mut v = [0u8; 16];
    v[..8].copy_from_slice(&slot.ino.to_le_bytes());
    v[8..].copy_from_slice(&slot.cookie.to_le_bytes());
    v
}

fn slot_of(b: &[u8]) -> Option<Slot> {
    (b.len() == 16).then_some(Slot {
        ino: u64_le(b, 0)?,
        cookie: u64_le(b, 8)?,
    })
}

fn put_dirent(
    t: &mut dyn Sink,
    dir: u64,
    name: &[u8],
    slot: Slot,
    child: FileKind,
) -> FsResult<()> {
    t.put(&key2(kind::DIRENT, dir, name), &slot_bytes(slot))?;
    let mut listed = Vec::with_capacity(9 + name.len());
    listed.extend_from_slice(&slot.ino.to_le_bytes());
    listed.push(super::codes::file_kind::to_code(child));
    listed.extend_from_slice(name);
    t.put(
        &key2(kind::COOKIE, dir, &slot.cookie.to_be_bytes()),
        &listed,
    )
}

/// A COOKIE value: the entry's inode, kind and name.
fn listed_of(v: &[u8]) -> Option<(u64, FileKind, &[u8])> {
    let ino = u64_le(v, 0)?;
    let kind = super::codes::file_kind::from_code(*v.get(8)?)?;
    let name = v.get(9..).filter(|n| !n.is_empty())?;
    Some((ino, kind, name))
}

/// The kind of inode `ino` as the tree holds it now.
fn kind_in_tree(t: &mut Tree, store: &dyn BlockStore, ino: u64) -> FsResult<FileKind> {
    match t.get(store, &key(kind::INODE, ino))? {
        Some(v) => Ok(decode::<StoredInode>(&v, "inode")?.kind),
        None => Err(FsError::Corrupt(format!(
            "a directory entry names inode {ino}, which the metadata tree does not hold"
        ))),
    }
}

fn put_dirinfo(t: &mut dyn Sink, dir: u64, d: &Dir) -> FsResult<()> {
    t.put(&key(kind::DIRINFO, dir), &d.next_cookie().to_le_bytes())
}

/// Bring the tree's keys for everything `touched` names to what `meta`
/// holds now.
pub fn store_touched(
    t: &mut Tree,
    store: &dyn BlockStore,
    meta: &Meta,
    touched: &mut Touched,
) -> FsResult<()> {
    for ino in std::mem::take(&mut touched.inodes) {
        // Only the kinds of keys the tree's version has are deleted (its
        // `parts`): most inodes have none besides their attributes, which
        // the put replaces, and each range deleted costs a descent.
        let old = match t.get(store, &key(kind::INODE, ino))? {
            Some(v) => Some(decode::<StoredInode>(&v, "inode")?),
            None => None,
        };
        let now = meta.inodes.get(&ino);
        if let Some(old) = old {
            let mut kinds: Vec<u8> = [
                (parts::XATTRS, kind::XATTR),
                (parts::EXTENTS, kind::EXTENT),
                (parts::TARGET, kind::TARGET),
            ]
            .iter()
            .filter(|(bit, _)| old.parts & bit != 0)
            .map(|&(_, k)| k)
            .collect();
            if now.is_none() {
                kinds.push(kind::INODE);
                if old.kind == FileKind::Dir {
                    kinds.extend([kind::DIRENT, kind::COOKIE, kind::DIRINFO]);
                }
            }
            delete_ids(t, store, &kinds, ino)?;
        }
        if let Some(inode) = now {
            put_inode(&mut TreeSink { tree: t, store }, inode)?;
        }
    }
    let mut dirs = BTreeSet::new();
    for (dir, name) in std::mem::take(&mut touched.dirents) {
        let k = key2(kind::DIRENT, dir, &name);
        let old = t.get(store, &k)?.as_deref().and_then(slot_of);
        let now = match meta.dirs.get(&dir).map(|d| d.lookup(&name)) {
            Some(Lookup::Found(slot)) => Some(slot),
            Some(Lookup::Absent) | None => None,
            // Not changed since the tree's entries were written.
            Some(Lookup::AskTree) => continue,
        };
        if old == now {
            continue;
        }
        if let Some(old) = old {
            t.delete(store, &key2(kind::COOKIE, dir, &old.cookie.to_be_bytes()))?;
        }
        match now {
            Some(slot) => {
                // The inodes went in first: the tree holds the child now.
                let child = match meta.inodes.get(&slot.ino) {
                    Some(i) => i.kind,
                    None => kind_in_tree(t, store, slot.ino)?,
                };
                put_dirent(&mut TreeSink { tree: t, store }, dir, &name, slot, child)?
            }
            None => {
                t.delete(store, &k)?;
            }
        }
        dirs.insert(dir);
    }
    for dir in dirs {
        if let Some(d) = meta.dirs.get(&dir) {
            put_dirinfo(&mut TreeSink { tree: t, store }, dir, d)?;
        }
    }
    // Each touched span is deleted, then what memory holds of it put back
    // (every chunk touched is held whole until this checkpoint). Taken
    // out first: the map's lock is never held over tree I/O.
    let spans = touched.merged_spans();
    let chunks = meta.csums.chunks_for(&spans);
    for &(first, last) in &spans {
        let end = match last.checked_add(1) {
            Some(next) => key(kind::CSUM, next),
            None => vec![kind::CSUM + 1],
        };
        t.delete_range(store, &key(kind::CSUM, first), &end)?;
    }
    for (chunk, bytes) in chunks {
        t.put(store, &key(kind::CSUM, chunk), &bytes)?;
    }
    Ok(())
}

/// Every key of `meta`, into an empty tree.
pub fn store_all(t: &mut Tree, store: &dyn BlockStore, meta: &Meta) -> FsResult<()> {
    put_all(&mut TreeSink { tree: t, store }, meta)
}

/// Every entry of `meta`, in key order, as the tree would hold them.
pub fn entries_of(meta: &Meta) -> FsResult<Vec<(Vec<u8>, Vec<u8>)>> {
    let mut out = Vec::new();
    put_all(&mut out, meta)?;
    out.sort();
    Ok(out)
}

fn put_all(t: &mut dyn Sink, meta: &Meta) -> FsResult<()> {
    let mut inos: Vec<u64> = meta.inodes.keys().copied().collect();
    inos.sort_unstable();
    for ino in &inos {
        put_inode(t, &meta.inodes[ino])?;
    }
    for ino in &inos {
        let Some(d) = meta.dirs.get(ino) else {
            continue;
        };
        for (name, slot) in d.iter() {
            let child = meta.inodes.get(&slot.ino).map(|i| i.kind).ok_or_else(|| {
                FsError::Corrupt(format!(
                    "directory {ino} names inode {}, which does not exist",
                    slot.ino
                ))
            })?;
            put_dirent(t, *ino, name, slot, child)?;
        }
        put_dirinfo(t, *ino, d)?;
    }
    let chunks: Vec<(u64, Vec<u8>)> = {
        let csums = meta.csums.whole()?;
        csums
            .chunk_keys_in(0, u64::MAX)
            .into_iter()
            .filter_map(|chunk| Some((chunk, csums.chunk_bytes(chunk)?)))
            .collect()
    };
    for (chunk, bytes) in chunks {
        t.put(&key(kind::CSUM, chunk), &bytes)?;
    }
    Ok(())
}

/// Pieces of one value being put back together: piece number → bytes.
type Pieces = BTreeMap<u16, Vec<u8>>;

fn join(pieces: Pieces, what: &str) -> FsResult<Vec<u8>> {
    let mut out = Vec::new();
    for (expect, (i, piece)) in pieces.into_iter().enumerate() {
        if usize::from(i) != expect {
            return Err(FsError::Corrupt(format!("{what} lacks piece {expect}")));
        }
        out.extend_from_slice(&piece);
    }
    Ok(out)
}

fn piece_of(k: &[u8]) -> FsResult<u16> {
    let at = k
        .len()
        .checked_sub(2)
        .ok_or_else(|| FsError::Corrupt(format!("metadata key {k:02x?} has no piece number")))?;
    Ok(u16::from_be_bytes([k[at], k[at + 1]]))
}

/// The metadata being put back together from the tree's entries, in key
/// order ([`Loader::take`] each, then [`Loader::finish`]).
pub struct Loader {
    meta: Meta,
    /// For a mount: inodes are counted, not kept (they are read when used).
    lazy: Option<MountFacts>,
    xattrs: BTreeMap<(u64, Vec<u8>), Pieces>,
    targets: BTreeMap<u64, Pieces>,
    entries: BTreeMap<u64, Vec<(Vec<u8>, Slot)>>,
    /// Each inode's [`StoredInode::parts`], checked against its keys.
    parts: BTreeMap<u64, u8>,
    /// (directory, cookie) → what its readdir entry says.
    listed: BTreeMap<(u64, u64), (u64, FileKind, Vec<u8>)>,
    next_cookies: BTreeMap<u64, u64>,
    cookies: u64,
}

fn bad(k: &[u8], what: &str) -> FsError {
    FsError::Corrupt(format!("metadata key {k:02x?}: {what}"))
}

impl Loader {
    pub fn new(next_ino: u64, next_gen: u64) -> Loader {
        Loader {
            meta: Meta {
                next_ino,
                next_gen,
                ..Default::default()
            },
            lazy: None,
            xattrs: BTreeMap::new(),
            targets: BTreeMap::new(),
            entries: BTreeMap::new(),
            listed: BTreeMap::new(),
            parts: BTreeMap::new(),
            next_cookies: BTreeMap::new(),
            cookies: 0,
        }
    }

    /// A loader for a mount: directories are built, inodes only counted
    /// ([`MountFacts`]), checksum chunks left in the tree.
    pub fn for_mount(next_ino: u64, next_gen: u64) -> Loader {
        Loader {
            lazy: Some(MountFacts::default()),
            ..Loader::new(next_ino, next_gen)
        }
    }

    /// One entry of the tree, judged by its kind.
    pub fn take(&mut self, k: &[u8], v: &[u8]) -> FsResult<()> {
        let id = id_of(k)?;
        let tail = &k[9..];
        match k[0] {
            kind::INODE => {
                if !tail.is_empty() {
                    return Err(bad(k, "not an inode key"));
                }
                let s: StoredInode = decode(v, "inode")?;
                if let Some(facts) = &mut self.lazy {
                    facts.count += 1;
                    if s.kind == FileKind::Dir {
                        facts.dirs.insert(id);
                    }
                    if s.nlink == 0 {
                        facts.orphans.push(id);
                    }
                    return Ok(());
                }
                let mut inode = Inode::new(id, s.generation, s.kind, s.perm, s.uid, s.gid);
                inode.size = s.size;
                inode.nlink = s.nlink;
                inode.rdev = s.rdev;
                (inode.atime, inode.mtime, inode.ctime, inode.crtime) =
                    (s.atime, s.mtime, s.ctime, s.crtime);
                inode.parent = s.parent;
                self.meta.inodes.insert(id, inode);
                self.parts.insert(id, s.parts);
            }
            kind::XATTR | kind::TARGET | kind::EXTENT if self.lazy.is_some() => {}
            kind::XATTR => {
                let name_end = tail
                    .len()
                    .checked_sub(3)
                    .filter(|&e| tail[e] == 0)
                    .ok_or_else(|| bad(k, "not an xattr key"))?;
                self.xattrs
                    .entry((id, tail[..name_end].to_vec()))
                    .or_default()
                    .insert(piece_of(k)?, v.to_vec());
            }
            kind::TARGET => {
                if tail.len() != 2 {
                    return Err(bad(k, "not a symlink target key"));
                }
                self.targets
                    .entry(id)
                    .or_default()
                    .insert(piece_of(k)?, v.to_vec());
            }
            kind::EXTENT => {
                let off = tail
                    .try_into()
                    .map(u64::from_be_bytes)
                    .map_err(|_| bad(k, "not an extent key"))?;
                let ext = ExtentMap::from_stored_bytes(v).ok_or_else(|| bad(k, "not an extent"))?;
                self.meta
                    .inodes
                    .get_mut(&id)
                    .ok_or_else(|| bad(k, "an extent of no inode"))?
                    .extents
                    .restore(off, ext);
            }
            kind::DIRENT | kind::COOKIE if self.lazy.is_some() => {}
            kind::DIRENT => {
                let slot = slot_of(v).ok_or_else(|| bad(k, "not a directory entry"))?;
                self.entries
                    .entry(id)
                    .or_default()
                    .push((tail.to_vec(), slot));
            }
            kind::COOKIE => {
                let cookie = tail
                    .try_into()
                    .map(u64::from_be_bytes)
                    .map_err(|_| bad(k, "not a cookie key"))?;
                let (ino, child, name) =
                    listed_of(v).ok_or_else(|| bad(k, "not a readdir entry"))?;
                self.listed
                    .insert((id, cookie), (ino, child, name.to_vec()));
                self.cookies += 1;
            }
            kind::DIRINFO => {
                let next = u64_le(v, 0)
                    .filter(|_| v.len() == 8 && tail.is_empty())
                    .ok_or_else(|| bad(k, "not a directory's next cookie"))?;
                self.next_cookies.insert(id, next);
            }
            kind::CSUM => {
                if !tail.is_empty() {
                    return Err(bad(k, "not a checksum chunk key"));
                }
                if self.lazy.is_some() {
                    // A mount reads each chunk when it is used.
                    return Ok(());
                }
                self.meta
                    .csums
                    .whole_mut()?
                    .restore_chunk(id, v)
                    .map_err(|e| bad(k, &e))?
            }
            _ => return Err(bad(k, "unknown key kind")),
        }
        Ok(())
    }

    /// The metadata, once every entry was taken: pieces joined and checked,
    /// directories built.
    pub fn finish(self) -> FsResult<Meta> {
        self.finish_with_facts().map(|(meta, _)| meta)
    }

    /// [`Loader::finish`], with what a mount's loader counted.
    pub fn finish_with_facts(self) -> FsResult<(Meta, MountFacts)> {
        let Loader {
            mut meta,
            lazy,
            xattrs,
            targets,
            mut entries,
            listed,
            parts,
            next_cookies,
            cookies,
        } = self;
        for ((ino, name), pieces) in xattrs {
            let value = join(pieces, "an extended attribute")?;
            meta.inodes
                .get_mut(&ino)
                .ok_or_else(|| {
                    FsError::Corrupt(format!("extended attribute of missing inode {ino}"))
                })?
                .xattrs
                .insert(name, value);
        }
        for (ino, pieces) in targets {
            let target = join(pieces, "a symlink target")?;
            meta.inodes
                .get_mut(&ino)
                .ok_or_else(|| FsError::Corrupt(format!("symlink target of missing inode {ino}")))?
                .target = target;
        }
        for (ino, stored) in parts {
            let has = meta.inodes.get(&ino).map_or(stored, parts_of);
            if has != stored {
                return Err(FsError::Corrupt(format!(
                    "inode {ino} says it has key kinds {stored:#b} but has {has:#b}"
                )));
            }
        }
        let mut named = 0u64;
        let dir_inos: Vec<u64> = match &lazy {
            Some(facts) => facts.dirs.iter().copied().collect(),
            None => meta
                .inodes
                .values()
                .filter(|i| i.is_dir())
                .map(|i| i.ino)
                .collect(),
        };
        for ino in dir_inos {
            let next_cookie = next_cookies.get(&ino).copied().unwrap_or(0);
            if lazy.is_some() {
                meta.dirs.insert(ino, Dir::over_tree(next_cookie));
                continue;
            }
            let entries = entries.remove(&ino).unwrap_or_default();
            named += entries.len() as u64;
            for (name, slot) in &entries {
                let says = listed.get(&(ino, slot.cookie));
                let child = meta.inodes.get(&slot.ino).map(|i| i.kind);
                if says.is_none_or(|(i, k, n)| {
                    *i != slot.ino || n != name || child.is_some_and(|c| c != *k)
                }) {
                    return Err(FsError::Corrupt(format!(
                        "directory {ino}: the readdir entry of cookie {} does not match the entry {}",
                        slot.cookie,
                        String::from_utf8_lossy(name)
                    )));
                }
            }
            meta.dirs.insert(
                ino,
                Dir::from_image(DirImage {
                    next_cookie,
                    entries,
                }),
            );
        }
        if let Some((dir, _)) = entries.into_iter().next() {
            return Err(FsError::Corrupt(format!(
                "directory entries kept for {dir}, which is not a directory"
            )));
        }
        if named != cookies {
            return Err(FsError::Corrupt(format!(
                "{named} directory entries but {cookies} readdir cookies"
            )));
        }
        Ok((meta, lazy.unwrap_or_default()))
    }
}

/// What a mount's scan of the tree counted instead of keeping inodes.
#[derive(Debug, Default)]
pub struct MountFacts {
    /// Inodes the tree holds.
    pub count: u64,
    pub dirs: BTreeSet<u64>,
    /// Inodes with no name (freed at mount once replay has run).
    pub orphans: Vec<u64>,
}

/// The tree as the source of the inodes a mount does not hold.
pub struct TreeSource {
    pub tree: Arc<Mutex<MetaTree>>,
    pub store: Arc<dyn BlockStore>,
}

impl MetaSource for TreeSource {
    fn load(&self, ino: u64) -> FsResult<Option<Inode>> {
        self.tree.lock().load_inode(self.store.as_ref(), ino)
    }

    fn kind(&self, ino: u64) -> FsResult<Option<FileKind>> {
        self.tree.lock().inode_kind(self.store.as_ref(), ino)
    }

    fn inos_from(&self, start: u64, max: usize) -> FsResult<Vec<u64>> {
        self.tree.lock().inos_from(self.store.as_ref(), start, max)
    }

    fn dirent(&self, dir: u64, name: &[u8]) -> FsResult<Option<Slot>> {
        self.tree.lock().dirent(self.store.as_ref(), dir, name)
    }

    fn listed(&self, dir: u64, from: u64, end: u64, max: usize) -> FsResult<Vec<Listed>> {
        self.tree
            .lock()
            .listed(self.store.as_ref(), dir, from, end, max)
    }

    fn names(&self, dir: u64, after: Option<&[u8]>, max: usize) -> FsResult<Vec<Vec<u8>>> {
        self.tree.lock().names(self.store.as_ref(), dir, after, max)
    }

    fn names_of(&self, ino: u64, max: usize) -> FsResult<Vec<(u64, Vec<u8>)>> {
        self.tree.lock().names_of(self.store.as_ref(), ino, max)
    }

    fn csum_chunk(&self, key: u64) -> FsResult<Option<Vec<u8>>> {
        self.tree.lock().csum_chunk(self.store.as_ref(), key)
    }
}

/// The tree side of a mounted filesystem: the tree, the space its nodes
/// take, and what changed since the last checkpoint.
pub struct MetaTree {
    tree: Tree,
    space: NodeSpace,
    touched: Touched,
    /// Nodes that roots since the last durable checkpoint no longer reach:
    /// free once the next checkpoint is durable (the durable one reaches
    /// them until then).
    unreleased: Vec<u64>,
    counters: (u64, u64),
    /// Nodes the last checkpoint wrote.
    last_written: u64,
}

/// The regions of the Metadata groups that are not tree nodes.
pub fn reserved_regions(header: &FsHeader, meta_group: u32) -> Vec<Region> {
    let mut out = vec![Region {
        addr: super::store::group_addr(meta_group, 0),
        len: 2 * super::inode::BLOCK_SIZE,
    }];
    out.push(header.journal);
    out.extend(header.slots);
    out
}

impl MetaTree {
    /// Open the tree a checkpoint names, marking every node it reaches as
    /// used (which also checks each node), and read the metadata: all of
    /// it (`full`: fsck, upgrade), or for a mount the directories and
    /// checksums with the inodes only counted.
    pub fn open(
        store: Arc<dyn BlockStore>,
        header: &FsHeader,
        meta_group: u32,
        cp: &TreeCheckpoint,
        full: bool,
        progress: &dyn Progress,
    ) -> FsResult<(MetaTree, Meta, MountFacts)> {
        let mut loader = if full {
            Loader::new(cp.next_ino, cp.next_gen)
        } else {
            Loader::for_mount(cp.next_ino, cp.next_gen)
        };
        // One pass: every node for the node space, every entry for the
        // loader, each node read once.
        let mut nodes = Vec::with_capacity(cp.root.nodes as usize);
        progress.step("reading the metadata tree", Some(cp.root.nodes));
        tree::walk_entries(
            store.as_ref(),
            &header.uuid,
            cp.root,
            &mut |addr, _| {
                nodes.push(addr);
                progress.advance(1);
                Ok(())
            },
            &mut |k, v| {
                loader.take(k, v)?;
                Ok(true)
            },
        )?;
        let space = NodeSpace::build(
            Arc::clone(&store),
            &reserved_regions(header, meta_group),
            &nodes,
        )?;
        let t = Tree::new(header.uuid, cp.root, CACHE_NODES);
        let (meta, facts) = loader.finish_with_facts()?;
        Ok((
            MetaTree {
                tree: t,
                space,
                touched: Touched::default(),
                unreleased: Vec::new(),
                counters: (cp.next_ino, cp.next_gen),
                last_written: 0,
            },
            meta,
            facts,
        ))
    }

    /// One inode as the tree holds it, whole (attributes, xattrs, target
    /// and extents), or None.
    pub fn load_inode(&mut self, store: &dyn BlockStore, ino: u64) -> FsResult<Option<Inode>> {
        let Some(attrs) = self.tree.get(store, &key(kind::INODE, ino))? else {
            return Ok(None);
        };
        let has = decode::<StoredInode>(&attrs, "inode")?.parts;
        let mut loader = Loader::new(0, 0);
        loader.take(&key(kind::INODE, ino), &attrs)?;
        let kinds = [
            (parts::XATTRS, kind::XATTR),
            (parts::EXTENTS, kind::EXTENT),
            (parts::TARGET, kind::TARGET),
        ];
        for k in kinds
            .iter()
            .filter(|(bit, _)| has & bit != 0)
            .map(|(_, k)| *k)
        {
            let (start, end) = id_range(k, ino);
            self.tree.scan(store, &start, &end, &mut |k, v| {
                loader.take(k, v)?;
                Ok(true)
            })?;
        }
        let mut meta = loader.finish()?;
        Ok(meta.inodes.remove(&ino))
    }

    /// The checksum chunk `chunk` as the tree stores it.
    pub fn csum_chunk(&mut self, store: &dyn BlockStore, chunk: u64) -> FsResult<Option<Vec<u8>>> {
        self.tree.get(store, &key(kind::CSUM, chunk))
    }

    /// One inode's kind, from its attributes alone.
    pub fn inode_kind(&mut self, store: &dyn BlockStore, ino: u64) -> FsResult<Option<FileKind>> {
        match self.tree.get(store, &key(kind::INODE, ino))? {
            Some(v) => Ok(Some(decode::<StoredInode>(&v, "inode")?.kind)),
            None => Ok(None),
        }
    }

    /// Up to `max` inode numbers from `start` on, in order.
    pub fn inos_from(
        &mut self,
        store: &dyn BlockStore,
        start: u64,
        max: usize,
    ) -> FsResult<Vec<u64>> {
        let mut out = Vec::new();
        self.tree.scan(
            store,
            &key(kind::INODE, start),
            &[kind::INODE + 1],
            &mut |k, _| {
                out.push(id_of(k)?);
                Ok(out.len() < max)
            },
        )?;
        Ok(out)
    }

    /// The entry of `name` in directory `dir`.
    pub fn dirent(
        &mut self,
        store: &dyn BlockStore,
        dir: u64,
        name: &[u8],
    ) -> FsResult<Option<Slot>> {
        let k = key2(kind::DIRENT, dir, name);
        match self.tree.get(store, &k)? {
            Some(v) => slot_of(&v)
                .map(Some)
                .ok_or_else(|| bad(&k, "not a directory entry")),
            None => Ok(None),
        }
    }

    /// Up to `max` entries of `dir` with cookies in `[from, end)`.
    pub fn listed(
        &mut self,
        store: &dyn BlockStore,
        dir: u64,
        from: u64,
        end: u64,
        max: usize,
    ) -> FsResult<Vec<Listed>> {
        let mut out = Vec::new();
        if from >= end {
            return Ok(out);
        }
        let start = key2(kind::COOKIE, dir, &from.to_be_bytes());
        let stop = key2(kind::COOKIE, dir, &end.to_be_bytes());
        self.tree.scan(store, &start, &stop, &mut |k, v| {
            let cookie = k
                .get(9..)
                .and_then(|t| t.try_into().ok())
                .map(u64::from_be_bytes)
                .ok_or_else(|| bad(k, "not a cookie key"))?;
            let (ino, child, name) = listed_of(v).ok_or_else(|| bad(k, "not a readdir entry"))?;
            out.push(Listed {
                cookie,
                name: name.to_vec(),
                ino,
                kind: child,
            });
            Ok(out.len() < max)
        })?;
        Ok(out)
    }

    /// Up to `max` names of `dir` after `after`, in name order.
    pub fn names(
        &mut self,
        store: &dyn BlockStore,
        dir: u64,
        after: Option<&[u8]>,
        max: usize,
    ) -> FsResult<Vec<Vec<u8>>> {
        let (first, end) = id_range(kind::DIRENT, dir);
        let start = match after {
            // The smallest key after `after`'s.
            Some(name) => {
                let mut k = key2(kind::DIRENT, dir, name);
                k.push(0);
                k
            }
            None => first,
        };
        let mut out = Vec::new();
        self.tree.scan(store, &start, &end, &mut |k, _| {
            out.push(k[9..].to_vec());
            Ok(out.len() < max)
        })?;
        Ok(out)
    }

    /// Up to `max` (directory, name) pairs naming `ino`: a walk of every
    /// directory entry.
    pub fn names_of(
        &mut self,
        store: &dyn BlockStore,
        ino: u64,
        max: usize,
    ) -> FsResult<Vec<(u64, Vec<u8>)>> {
        let mut out = Vec::new();
        self.tree
            .scan(store, &[kind::DIRENT], &[kind::DIRENT + 1], &mut |k, v| {
                if slot_of(v).is_some_and(|s| s.ino == ino) {
                    out.push((id_of(k)?, k[9..].to_vec()));
                }
                Ok(out.len() < max)
            })?;
        Ok(out)
    }

    /// Every extent the tree holds, with its inode and file offset.
    pub fn for_each_extent(
        &mut self,
        store: &dyn BlockStore,
        f: &mut dyn FnMut(u64, u64, Extent),
    ) -> FsResult<()> {
        self.tree
            .scan(store, &[kind::EXTENT], &[kind::EXTENT + 1], &mut |k, v| {
                let off = k
                    .get(9..)
                    .and_then(|t| t.try_into().ok())
                    .map(u64::from_be_bytes)
                    .ok_or_else(|| bad(k, "not an extent key"))?;
                let ext = ExtentMap::from_stored_bytes(v).ok_or_else(|| bad(k, "not an extent"))?;
                f(id_of(k)?, off, ext);
                Ok(true)
            })
    }

    /// Write all of `meta` as a new tree in space no current structure
    /// uses (`keep`: regions to leave alone besides the header's, such as
    /// an older layout's live checkpoint), and make it the newest
    /// checkpoint of `journal`. For format, upgrade and fsck's repair.
    pub fn write_fresh(
        store: Arc<dyn BlockStore>,
        journal: &mut Journal,
        meta: &Meta,
        keep: &[Region],
        keep_nodes: &[u64],
    ) -> FsResult<TreeRoot> {
        let mut reserved = reserved_regions(&journal.header, journal.meta_group);
        reserved.extend_from_slice(keep);
        let mut space = NodeSpace::build(Arc::clone(&store), &reserved, keep_nodes)?;
        let mut t = Tree::new(journal.header.uuid, TreeRoot::default(), CACHE_NODES);
        store_all(&mut t, store.as_ref(), meta)?;
        let out = t.write_out(store.as_ref(), &mut space, journal.next_seq())?;
        store.flush()?;
        journal.checkpoint_root(store.as_ref(), out.root, (meta.next_ino, meta.next_gen))?;
        Ok(out.root)
    }

    /// Note a record's keys for the next checkpoint.
    pub fn note(&mut self, rec: &CommitRecord) {
        self.touched.note(rec);
    }

    /// Bring the tree (in memory) up to `meta` for every key changed since
    /// the last checkpoint. Runs under the metadata lock.
    pub fn apply(&mut self, store: &dyn BlockStore, meta: &Meta) -> FsResult<()> {
        store_touched(&mut self.tree, store, meta, &mut self.touched)?;
        self.counters = (meta.next_ino, meta.next_gen);
        Ok(())
    }

    /// Write the changed nodes, make them durable, then the root: the
    /// checkpoint. Nodes the new root no longer reaches become free once
    /// it is durable. On an error nothing is lost: the tree keeps its
    /// changes and the next checkpoint writes them.
    pub fn checkpoint(&mut self, store: &dyn BlockStore, journal: &mut Journal) -> FsResult<()> {
        self.last_written = 0;
        if self.tree.is_dirty() {
            let out = self
                .tree
                .write_out(store, &mut self.space, journal.next_seq())?;
            self.unreleased.extend(out.freed);
            self.last_written = out.written;
        }
        store.flush()?;
        journal.checkpoint_root(store, self.tree.root(), self.counters)?;
        self.space.free(&std::mem::take(&mut self.unreleased));
        Ok(())
    }

    /// The root the newest checkpoint (or the last write-out) names.
    pub fn root(&self) -> TreeRoot {
        self.tree.root()
    }

    /// A bound on the node blocks the next checkpoint writes: a path to
    /// the root for each key noted (but never more than every node once),
    /// new nodes for the bytes those keys may add, and nodes changed by an
    /// earlier try that could not be written.
    pub fn checkpoint_bound(&self) -> u64 {
        let root = self.tree.root();
        let per_key = u64::from(root.level) + 2;
        let keys = self.touched.keys();
        let paths = keys.saturating_mul(per_key).min(root.nodes);
        let added = keys.saturating_mul(96) / super::inode::BLOCK_SIZE * 2;
        paths
            .saturating_add(added)
            .saturating_add(2 * per_key)
            .saturating_add(self.tree.dirty_nodes() as u64)
    }

    /// Publish the room figures for admission.
    pub fn publish(&self, room: &super::meta_room::MetaRoom) {
        room.update(
            self.checkpoint_bound(),
            self.space.free_blocks(),
            self.tree.root().level,
        );
    }

    /// Nodes the last checkpoint wrote.
    #[cfg(test)]
    pub fn last_written(&self) -> u64 {
        self.last_written
    }

    /// Decoded tree nodes cached.
    pub fn cached_nodes(&self) -> usize {
        self.tree.cached_nodes()
    }

    /// Free node blocks in the Metadata groups taken so far.
    pub fn free_node_blocks(&self) -> u64 {
        self.space.free_blocks()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::teststore::MemStore;
    use crate::fs::{Caller, FileSystem, FormatOptions, FsOptions, ROOT_INO};
    use std::ffi::OsStr;

    fn store(groups: u32, group_bytes: u64) -> Arc<MemStore> {
        Arc::new(MemStore::new(groups, group_bytes, 64 << 10))
    }

    fn open(store: &Arc<MemStore>) -> FileSystem {
        FileSystem::open(Arc::clone(store) as _, FsOptions::default()).unwrap()
    }

    /// What a filesystem holds, to compare across a remount.
    fn snapshot(fs: &FileSystem) -> Snapshot {
        snapshot_of(&fs.inner.state.read().meta)
    }

    /// What the store holds, read whole into memory as fsck reads it.
    fn snapshot_whole(store: &Arc<MemStore>) -> Snapshot {
        let loaded = crate::fs::core::load(&(Arc::clone(store) as _)).unwrap();
        assert!(loaded.meta.lazy.is_none());
        snapshot_of(&loaded.meta)
    }

    fn snapshot_of(meta: &Meta) -> Snapshot {
        let mut inodes: Vec<Inode> = Vec::new();
        meta.for_each_ino(100, &mut |inos| {
            for &ino in inos {
                inodes.extend(meta.inode(ino)?.map(|i| (*i).clone()));
            }
            Ok(true)
        })
        .unwrap();
        let mut dirs: Vec<(u64, Dir)> = meta
            .dirs
            .iter()
            .map(|(&ino, d)| {
                let mut listed = Dir::default();
                for e in meta.dir_list(ino, 0, u64::MAX, usize::MAX).unwrap() {
                    listed.insert_with_cookie(&e.name, e.ino, e.cookie);
                }
                let whole = Dir::from_image(DirImage {
                    next_cookie: d.next_cookie(),
                    entries: listed.iter().map(|(n, s)| (n.to_vec(), s)).collect(),
                });
                (ino, whole)
            })
            .collect();
        dirs.sort_by_key(|d| d.0);
        // The checksums of every mapped block, read as a mount reads them
        // (a mount does not hold the map whole).
        let mut csums = CsumMap::default();
        for inode in &inodes {
            for (_, e) in inode.extents.iter() {
                for b in 0..e.len / crate::fs::BLOCK_SIZE {
                    let addr = e.addr + b * crate::fs::BLOCK_SIZE;
                    if let Some(crc) = meta.csums.get(addr).unwrap() {
                        csums.set(addr, &[crc]);
                    }
                }
            }
        }
        (inodes, dirs, csums, meta.next_ino, meta.next_gen)
    }

    type Snapshot = (Vec<Inode>, Vec<(u64, Dir)>, CsumMap, u64, u64);

    /// The first difference, shortly (the structures are too large to print).
    fn same(a: &Snapshot, b: &Snapshot, when: &str) {
        let short = |s: String| s.chars().take(400).collect::<String>();
        assert_eq!(a.0.len(), b.0.len(), "{when}: inode count");
        for (x, y) in a.0.iter().zip(&b.0) {
            if x != y {
                let (mut x, mut y) = (x.clone(), y.clone());
                let xattrs = x.xattrs == y.xattrs;
                let extents = x.extents == y.extents;
                let target = x.target == y.target;
                x.xattrs.clear();
                y.xattrs.clear();
                x.target.clear();
                y.target.clear();
                let (ex, ey) = (format!("{:?}", x.extents), format!("{:?}", y.extents));
                x.extents = Default::default();
                y.extents = Default::default();
                panic!(
                    "{when}: inode {} differs (xattrs same {xattrs}, extents same {extents}, target same {target}):\n{}\n{}\nextents {} / {}",
                    x.ino,
                    short(format!("{x:?}")),
                    short(format!("{y:?}")),
                    short(ex),
                    short(ey)
                );
            }
        }
        assert_eq!(a.1.len(), b.1.len(), "{when}: directory count");
        for (x, y) in a.1.iter().zip(&b.1) {
            assert!(
                x == y,
                "{when}: directory {} differs: {} / {}",
                x.0,
                short(format!("{:?}", x.1)),
                short(format!("{:?}", y.1))
            );
        }
        assert!(
            a.2 == b.2,
            "{when}: checksums differ ({} / {} blocks)",
            a.2.len(),
            b.2.len()
        );
        assert_eq!((a.3, a.4), (b.3, b.4), "{when}: counters");
    }

    /// Create an empty file and let go of its handle.
    fn touch(fs: &FileSystem, dir: u64, n: &str) -> FsResult<u64> {
        let f = fs.create(&Caller::root(), dir, name(n), 0o644, 0, 0)?;
        fs.release(f.ino)?;
        Ok(f.ino)
    }

    fn name(s: &str) -> &OsStr {
        OsStr::new(s)
    }

    /// Every kind of key: files with data, a long symlink target, a large
    /// and an empty xattr, links, renames, removals.
    fn populate(fs: &FileSystem) {
        let root = Caller::root();
        let sub = fs.mkdir(&root, ROOT_INO, name("sub"), 0o755, 0).unwrap();
        for i in 0..300 {
            let dir = if i % 3 == 0 { ROOT_INO } else { sub.ino };
            let f = fs
                .create(
                    &root,
                    dir,
                    name(&format!("file-{i}")),
                    0o644,
                    0,
                    libc::O_RDWR,
                )
                .unwrap();
            let data = vec![(i % 251) as u8; 4096 * (1 + i % 5)];
            fs.write(f.ino, (i as u64 % 7) * 8192, &data).unwrap();
            fs.release(f.ino).unwrap();
        }
        let target = vec![b'x'; 3000];
        fs.symlink(&root, sub.ino, name("long-link"), &target)
            .unwrap();
        let f = fs.lookup(&root, ROOT_INO, name("file-0")).unwrap();
        fs.setxattr(&root, f.ino, name("user.big"), &vec![7u8; 5000], 0)
            .unwrap();
        fs.setxattr(&root, f.ino, name("user.empty"), b"", 0)
            .unwrap();
        fs.link(&root, f.ino, sub.ino, name("hard")).unwrap();
        fs.rename(
            &root,
            ROOT_INO,
            name("file-3"),
            sub.ino,
            name("moved"),
            Default::default(),
        )
        .unwrap();
        for i in (1..300).step_by(4) {
            let dir = if i % 3 == 0 { ROOT_INO } else { sub.ino };
            fs.unlink(&root, dir, name(&format!("file-{i}"))).unwrap();
        }
        let gone = fs.mkdir(&root, sub.ino, name("gone"), 0o755, 0).unwrap();
        fs.rmdir(&root, sub.ino, name("gone")).unwrap();
        assert!(fs.getattr(gone.ino).is_err());
    }

    #[test]
    fn a_filesystem_reads_back_from_its_tree_as_it_was() {
        let store = store(16, 8 << 20);
        FileSystem::format(Arc::clone(&store) as _).unwrap();
        let fs = open(&store);
        assert!(fs.inner.tree.is_some(), "a new filesystem has the tree");
        populate(&fs);
        fs.sync_all().unwrap();
        let before = snapshot(&fs);
        fs.unmount().unwrap();
        drop(fs);
        let fs = open(&store);
        same(&snapshot(&fs), &before, "after a checkpoint");
        // Changes on top, some only in the journal at a crash.
        let root = Caller::root();
        fs.unlink(&root, ROOT_INO, name("file-0")).unwrap();
        fs.inner.commit(true).unwrap();
        let f = fs
            .create(&root, ROOT_INO, name("late"), 0o644, 0, libc::O_RDWR)
            .unwrap();
        fs.write(f.ino, 0, b"late data").unwrap();
        fs.fsync(f.ino, false).unwrap();
        fs.release(f.ino).unwrap();
        let before = snapshot(&fs);
        drop(fs);
        let fs = open(&store);
        same(&snapshot(&fs), &before, "after replay onto the tree");
        fs.unmount().unwrap();
        drop(fs);
        let fs = open(&store);
        same(
            &snapshot(&fs),
            &before,
            "after the replayed records' checkpoint",
        );
        let report = crate::fs::fsck::fsck(Arc::clone(&store) as _, false).unwrap();
        fs.unmount().unwrap();
        assert!(report.is_clean(), "{:?}", report.problems);
    }

    /// Clean inodes resident and their bytes.
    fn resident(fs: &FileSystem) -> (usize, usize, u64) {
        let st = fs.inner.state.read();
        let (clean, bytes) = st.meta.lazy.as_ref().expect("a lazy mount").resident();
        (st.meta.inodes.len(), clean, bytes)
    }

    /// A mount holds no checksum chunk until a read or write needs one,
    /// keeps at most its share of the budget of clean ones, and reads,
    /// overwrites and deletions through chunks read back from the tree
    /// leave every file as written and the store clean for fsck.
    #[test]
    fn checksums_are_read_from_the_tree_when_used_and_kept_to_their_budget() {
        use rand::{Rng, SeedableRng};
        let store = store(16, 8 << 20);
        FileSystem::format(Arc::clone(&store) as _).unwrap();
        let budget = 64 * 1024;
        let opts = || FsOptions {
            metadata_cache: budget,
            ..FsOptions::default()
        };
        let root = Caller::root();
        let mut rng = rand::rngs::StdRng::seed_from_u64(45);
        let mut files: Vec<(u64, String, Vec<u8>)> = Vec::new();
        let fs = FileSystem::open(Arc::clone(&store) as _, opts()).unwrap();
        for i in 0..400 {
            let f = fs
                .create(
                    &root,
                    ROOT_INO,
                    name(&format!("d{i}")),
                    0o644,
                    0,
                    libc::O_RDWR,
                )
                .unwrap();
            let data: Vec<u8> = (0..rng.gen_range(1..24) * 4096)
                .map(|_| rng.gen())
                .collect();
            fs.write(f.ino, 0, &data).unwrap();
            fs.release(f.ino).unwrap();
            files.push((f.ino, format!("d{i}"), data));
        }
        fs.unmount().unwrap();
        drop(fs);
        // The clean chunks a mount may keep: a quarter of the budget.
        let most_clean = (budget / 4 / 360) as usize;
        for round in 0..3 {
            let fs = FileSystem::open(Arc::clone(&store) as _, opts()).unwrap();
            assert_eq!(
                fs.inner.state.read().meta.csums.held(),
                (0, 0),
                "round {round}: a mount reads no checksum chunk"
            );
            for (ino, _, data) in &files {
                let got = fs.read(*ino, 0, data.len()).unwrap();
                assert!(got == *data, "round {round}: inode {ino} reads back");
                // And every block is still checked: its checksum came back.
                let st = fs.inner.state.read();
                let inode = st.inode(*ino).unwrap();
                for (off, e) in inode.extents.iter() {
                    for b in 0..e.len / 4096 {
                        let at = (off + b * 4096) as usize;
                        let want = crc32c::crc32c(&data[at..at + 4096]);
                        assert_eq!(
                            st.meta.csums.get(e.addr + b * 4096).unwrap(),
                            Some(want),
                            "round {round}: inode {ino} block at {at}"
                        );
                    }
                }
                drop(inode);
                drop(st);
                let (_, clean) = fs.inner.state.read().meta.csums.held();
                assert!(
                    clean <= most_clean,
                    "round {round}: {clean} clean chunks kept"
                );
            }
            // Overwrite parts of some files and delete others, so chunks
            // not held are changed and dropped.
            for (i, (ino, _, data)) in files.iter_mut().enumerate() {
                if i % 3 == round {
                    let at = rng.gen_range(0..data.len() / 4096) * 4096;
                    let patch: Vec<u8> = (0..4096).map(|_| rng.gen()).collect();
                    fs.write(*ino, at as u64, &patch).unwrap();
                    data[at..at + 4096].copy_from_slice(&patch);
                }
            }
            let gone: Vec<usize> = (0..files.len()).filter(|i| i % 17 == round).collect();
            for &i in gone.iter().rev() {
                let (_, file, _) = files.remove(i);
                fs.unlink(&root, ROOT_INO, name(&file)).unwrap();
            }
            fs.unmount().unwrap();
            drop(fs);
            let report = crate::fs::fsck(Arc::clone(&store) as _, false).unwrap();
            assert!(report.is_clean(), "round {round}: {:?}", report.problems);
        }
    }

    #[test]
    fn inodes_not_resident_are_read_from_the_tree_and_memory_keeps_to_the_cache_budget() {
        let store = store(16, 8 << 20);
        FileSystem::format(Arc::clone(&store) as _).unwrap();
        let budget = 64 * 1024;
        let opts = || FsOptions {
            metadata_cache: budget,
            ..FsOptions::default()
        };
        let fs = FileSystem::open(Arc::clone(&store) as _, opts()).unwrap();
        populate(&fs);
        let files = 3000;
        for i in 0..files {
            touch(&fs, ROOT_INO, &format!("f{i:05}")).unwrap();
        }
        fs.inner.commit(true).unwrap();
        let (held, clean, bytes) = resident(&fs);
        assert_eq!(held, 0, "a checkpoint leaves no inode held");
        assert!(bytes <= budget, "{bytes} bytes of clean inodes");
        assert!(clean < files / 4, "{clean} clean inodes resident");
        {
            let st = fs.inner.state.read();
            let root = &st.meta.dirs[&ROOT_INO];
            assert!(
                !root.is_complete() && root.is_empty(),
                "entries left to the tree"
            );
        }
        // Every inode and entry read back, through the cache and the tree,
        // as fsck reads the store whole into memory.
        let lazily = snapshot(&fs);
        assert!(resident(&fs).2 <= budget);
        same(&snapshot_whole(&store), &lazily, "lazily against whole");
        // Changes to inodes that were evicted: attributes, data, names,
        // xattrs, deletion; then a checkpoint evicts them again.
        let root = Caller::root();
        let mut deleted = Vec::new();
        for i in (0..files).step_by(7) {
            let n = format!("f{i:05}");
            let f = fs.lookup(&root, ROOT_INO, name(&n)).unwrap();
            match i % 4 {
                0 => {
                    fs.unlink(&root, ROOT_INO, name(&n)).unwrap();
                    deleted.push(f.ino);
                }
                1 => {
                    fs.setxattr(&root, f.ino, name("user.k"), n.as_bytes(), 0)
                        .unwrap();
                }
                2 => {
                    fs.open_inode(&root, f.ino, libc::O_RDWR).unwrap();
                    fs.write(f.ino, 4096, n.as_bytes()).unwrap();
                    fs.release(f.ino).unwrap();
                }
                _ => {
                    fs.rename(
                        &root,
                        ROOT_INO,
                        name(&n),
                        ROOT_INO,
                        name(&format!("r{i:05}")),
                        Default::default(),
                    )
                    .unwrap();
                }
            }
        }
        // A deleted inode is not read back from the tree, which holds it
        // until the next checkpoint.
        for &ino in &deleted {
            assert!(fs.getattr(ino).is_err(), "deleted inode {ino} read back");
        }
        fs.inner.commit(true).unwrap();
        same(
            &snapshot_whole(&store),
            &snapshot(&fs),
            "after the changes, lazily against whole",
        );
        assert!(resident(&fs).2 <= budget);
        for &ino in &deleted {
            assert!(fs.getattr(ino).is_err(), "deleted inode {ino} read back");
        }
        let before = snapshot(&fs);
        let statfs = fs.statfs().unwrap();
        fs.unmount().unwrap();
        drop(fs);
        let fs = FileSystem::open(Arc::clone(&store) as _, opts()).unwrap();
        same(&snapshot(&fs), &before, "after a remount");
        assert_eq!(
            fs.statfs().unwrap().files - fs.statfs().unwrap().ffree,
            statfs.files - statfs.ffree,
            "inodes in use"
        );
        assert_eq!(
            fs.statfs().unwrap().files - fs.statfs().unwrap().ffree,
            before.0.len() as u64,
            "inodes in use, counted"
        );
        fs.unmount().unwrap();
        let report = crate::fs::fsck::fsck(Arc::clone(&store) as _, false).unwrap();
        assert!(report.is_clean(), "{:?}", report.problems);
    }

    #[test]
    fn changes_held_for_the_next_checkpoint_stay_within_their_share_of_the_cache() {
        let store = store(16, 8 << 20);
        FileSystem::format(Arc::clone(&store) as _).unwrap();
        let opts = FsOptions {
            metadata_cache: 0,
            ..FsOptions::default()
        };
        let fs = FileSystem::open(Arc::clone(&store) as _, opts).unwrap();
        let mut most = 0;
        for i in 0..20_000 {
            touch(&fs, ROOT_INO, &format!("f{i:05}")).unwrap();
            most = most.max(resident(&fs).0);
        }
        // 8,192 held at most (the floor for a cache of 0), then a
        // checkpoint: without one, all 20,000 would be.
        assert!(most > 4_000 && most <= 8_193, "{most} inodes held at most");
        fs.unmount().unwrap();
        drop(fs);
        let fs = open(&store);
        assert_eq!(fs.readdir(ROOT_INO, 0, usize::MAX).unwrap().len(), 20_002);
        fs.unmount().unwrap();
    }

    #[test]
    fn a_checkpoint_writes_what_changed_not_the_whole_tree() {
        let store = store(16, 8 << 20);
        FileSystem::format(Arc::clone(&store) as _).unwrap();
        let fs = open(&store);
        for i in 0..20_000 {
            touch(&fs, ROOT_INO, &format!("f{i:06}")).unwrap();
        }
        fs.inner.commit(true).unwrap();
        let tree = fs.inner.tree.as_ref().unwrap();
        let (all, height) = {
            let t = tree.lock();
            (t.root().nodes, t.root().level)
        };
        assert!(all > 200, "{all} nodes");
        touch(&fs, ROOT_INO, "one-more").unwrap();
        fs.inner.commit(true).unwrap();
        let written = tree.lock().last_written();
        // The new inode's leaf and the entry's and cookie's leaves, with
        // their paths to the root (which they share near the top).
        let bound = 3 * (u64::from(height) + 1);
        assert!(
            written >= 1 && written <= bound,
            "{written} of {all} nodes written (height {height})"
        );
        fs.unmount().unwrap();
    }

    #[test]
    fn the_metadata_grows_past_one_metadata_group_where_images_stopped() {
        let files = 12_000;
        let fill = |opts: &FormatOptions| -> Result<(), FsError> {
            let store = store(64, 1 << 20);
            FileSystem::format_with(Arc::clone(&store) as _, opts).unwrap();
            let fs = open(&store);
            let root = Caller::root();
            for i in 0..files {
                touch(&fs, ROOT_INO, &format!("file-{i:06}"))?;
            }
            fs.unmount()?;
            drop(fs);
            let fs = open(&store);
            for i in (0..files).step_by(97) {
                fs.lookup(&root, ROOT_INO, name(&format!("file-{i:06}")))?;
            }
            assert_eq!(fs.readdir(ROOT_INO, 0, usize::MAX)?.len(), files + 2);
            let groups = store
                .groups()
                .iter()
                .filter(|g| g.kind == crate::fs::GroupKind::Metadata)
                .count();
            assert!(groups > 1, "{groups} metadata groups");
            fs.unmount()
        };
        let images = FormatOptions {
            image_checkpoints: true,
            ..Default::default()
        };
        assert!(fill(&images).is_err(), "an image outgrows half a group");
        fill(&FormatOptions::default()).unwrap();
    }

    #[test]
    fn when_metadata_space_runs_out_the_caller_gets_enospc_and_nothing_answered_is_lost() {
        let store = store(6, 1 << 20);
        FileSystem::format(Arc::clone(&store) as _).unwrap();
        let fs = open(&store);
        let root = Caller::root();
        let mut made: Vec<String> = Vec::new();
        let err = loop {
            let n = format!("file-{:06}", made.len());
            match touch(&fs, ROOT_INO, &n) {
                Ok(_) => made.push(n),
                Err(e) => break e,
            }
            assert!(made.len() < 1_000_000, "the metadata never filled");
        };
        assert!(matches!(err, FsError::NoSpace), "{err}");
        assert!(made.len() > 1000, "only {} files", made.len());
        assert!(
            !fs.inner.is_read_only(),
            "a full metadata space is not a failure"
        );
        // Everything answered is made durable.
        fs.sync_all().unwrap();
        fs.unmount().unwrap();
        drop(fs);
        let fs = open(&store);
        let listed = |fs: &FileSystem| -> Vec<String> {
            let mut names: Vec<String> = fs
                .readdir(ROOT_INO, 0, usize::MAX)
                .unwrap()
                .into_iter()
                .map(|e| String::from_utf8(e.name).unwrap())
                .filter(|n| n != "." && n != "..")
                .collect();
            names.sort();
            names
        };
        assert_eq!(listed(&fs), made, "after the remount");
        // Deleting files makes room again.
        let (gone, kept) = made.split_at(made.len() / 2);
        for n in gone {
            fs.unlink(&root, ROOT_INO, name(n)).unwrap();
        }
        let mut more = Vec::new();
        for i in 0..200 {
            let n = format!("again-{i:03}");
            touch(&fs, ROOT_INO, &n).unwrap();
            more.push(n);
        }
        fs.unmount().unwrap();
        drop(fs);
        let fs = open(&store);
        let mut want: Vec<String> = kept.iter().cloned().chain(more).collect();
        want.sort();
        assert_eq!(listed(&fs), want, "after deleting and creating again");
        fs.unmount().unwrap();
        let report = crate::fs::fsck::fsck(Arc::clone(&store) as _, false).unwrap();
        assert!(report.is_clean(), "{:?}", report.problems);
    }
}
