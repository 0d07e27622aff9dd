//! Creating, finding, linking and removing names. Each function checks
//! everything before it changes anything, so an error changes nothing.

use super::super::meta::InodeRef;
use super::super::perm::{self, in_group, S_ISGID, W_OK, X_OK};
use super::super::state::{check_name, State, MAX_LINKS};
use super::super::{Attr, Caller, FileKind, FsError, FsResult};

/// What a new inode is.
pub struct NewNode<'a> {
    pub kind: FileKind,
    /// The mode's permission bits as asked for, before the umask.
    pub perm: u16,
    /// Applied unless the parent has a default ACL, which then decides.
    pub umask: u16,
    pub rdev: u32,
    pub target: &'a [u8],
}

/// The parent as a live directory the caller may search.
pub fn searchable_dir<'a>(st: &'a State, caller: &Caller, parent: u64) -> FsResult<InodeRef<'a>> {
    let dir = st.inode(parent)?;
    if !dir.is_dir() {
        return Err(FsError::NotDir);
    }
    perm::check(caller, &dir, X_OK)?;
    Ok(dir)
}

/// The parent as a live directory the caller may add to / remove from.
pub fn writable_dir<'a>(st: &'a State, caller: &Caller, parent: u64) -> FsResult<InodeRef<'a>> {
    let dir = searchable_dir(st, caller, parent)?;
    if dir.nlink == 0 {
        return Err(FsError::NotFound);
    }
    perm::check(caller, &dir, W_OK)?;
    Ok(dir)
}

pub fn lookup(st: &State, caller: &Caller, parent: u64, name: &[u8]) -> FsResult<Attr> {
    let dir = searchable_dir(st, caller, parent)?;
    let ino = match name {
        b"." => parent,
        b".." => dir.parent,
        _ => {
            check_name(name)?;
            st.dir_get(parent, name)?.ok_or(FsError::NotFound)?.ino
        }
    };
    Ok(st.inode(ino)?.attr())
}

pub fn create(
    st: &mut State,
    caller: &Caller,
    parent: u64,
    name: &[u8],
    node: NewNode,
) -> FsResult<Attr> {
    check_name(name)?;
    let dir = writable_dir(st, caller, parent)?;
    if name == b"." || name == b".." || st.dir_get(parent, name)?.is_some() {
        return Err(FsError::Exists);
    }
    if node.kind == FileKind::Dir && dir.nlink >= MAX_LINKS {
        return Err(FsError::TooManyLinks);
    }
    let ino = new_node(st, caller, parent, &node)?;
    if node.kind == FileKind::Dir {
        let inode = st.inode_mut(ino)?;
        inode.nlink = 2;
        inode.parent = parent;
        st.inode_mut(parent)?.nlink += 1;
    }
    st.dir_insert(parent, name, ino)?;
    st.touch_mc(parent);
    Ok(st.inode(ino)?.attr())
}

/// A regular file with no name (O_TMPFILE), open once: as `create` would
/// make it in `parent` (whose write and search permission it needs, and
/// whose default ACL or set-group-ID bit it follows), but with no link.
/// It is an orphan, freed at its last release (or, after a crash, at the
/// next mount) unless `linkable` and given a name by [`link`] first.
pub fn tmpfile(
    st: &mut State,
    caller: &Caller,
    parent: u64,
    perm: u16,
    umask: u16,
    linkable: bool,
) -> FsResult<Attr> {
    writable_dir(st, caller, parent)?;
    let node = NewNode {
        kind: FileKind::File,
        perm,
        umask,
        rdev: 0,
        target: &[],
    };
    let ino = new_node(st, caller, parent, &node)?;
    st.inode_mut(ino)?.nlink = 0;
    *st.open_counts.entry(ino).or_insert(0) += 1;
    if linkable {
        st.linkable.insert(ino);
    }
    Ok(st.inode(ino)?.attr())
}

/// The inode `create` or `tmpfile` makes in `parent` for `node`, with its
/// mode, group and ACLs decided; not yet named. The caller has checked
/// the parent, which is a directory.
fn new_node(st: &mut State, caller: &Caller, parent: u64, node: &NewNode) -> FsResult<u64> {
    let dir = st.inode(parent)?;
    // A default ACL on the parent takes the umask's place
    // (posix_acl_create); symlinks get neither.
    let inherited = crate::fs::acl::default_acl(&dir).filter(|_| node.kind != FileKind::Symlink);
    let (mut perm, access_acl) = match &inherited {
        Some(default) => {
            let (acl, bits) = default.for_new_entry(node.perm);
            (
                (node.perm & !0o777) | bits,
                (!acl.is_equivalent_to_mode()).then(|| acl.encode()),
            )
        }
        None => (node.perm & !node.umask & 0o7777, None),
    };
    let gid = if dir.perm & S_ISGID != 0 {
        if node.kind == FileKind::Dir {
            perm |= S_ISGID;
        }
        dir.gid
    } else {
        caller.gid
    };
    if node.kind != FileKind::Dir
        && perm & S_ISGID != 0
        && caller.uid != 0
        && !in_group(caller, gid)
    {
        perm &= !S_ISGID;
    }
    let ino = st.new_inode(node.kind, perm, caller.uid, gid);
    let inode = st.inode_mut(ino)?;
    inode.rdev = node.rdev;
    if let Some(acl) = access_acl {
        inode.xattrs.insert(crate::fs::acl::ACCESS.to_vec(), acl);
    }
    if let (Some(default), FileKind::Dir) = (&inherited, node.kind) {
        inode
            .xattrs
            .insert(crate::fs::acl::DEFAULT.to_vec(), default.encode());
    }
    if node.kind == FileKind::Symlink {
        inode.target = node.target.to_vec();
        inode.size = node.target.len() as u64;
    }
    Ok(ino)
}

/// Leave a whiteout at `name` in `parent` (RENAME_WHITEOUT, for overlayfs):
/// a character device 0:0 with mode 0, made as `mknod` makes one. The
/// rename that freed the name has checked the caller and the directory.
pub fn whiteout(st: &mut State, caller: &Caller, parent: u64, name: &[u8]) -> FsResult<()> {
    let node = NewNode {
        kind: FileKind::CharDev,
        perm: 0,
        umask: 0,
        rdev: 0,
        target: &[],
    };
    let ino = new_node(st, caller, parent, &node)?;
    st.dir_insert(parent, name, ino)?;
    Ok(())
}

pub fn link(
    st: &mut State,
    caller: &Caller,
    ino: u64,
    new_parent: u64,
    new_name: &[u8],
) -> FsResult<Attr> {
    check_name(new_name)?;
    let target = st.inode(ino)?;
    if target.is_dir() {
        return Err(FsError::Perm);
    }
    // A file with no name left stays gone, but an O_TMPFILE file may get
    // its first name (linkat), once.
    if target.nlink == 0 && !st.linkable.contains(&ino) {
        return Err(FsError::NotFound);
    }
    if target.nlink >= MAX_LINKS {
        return Err(FsError::TooManyLinks);
    }
    writable_dir(st, caller, new_parent)?;
    if new_name == b"." || new_name == b".." || st.dir_get(new_parent, new_name)?.is_some() {
        return Err(FsError::Exists);
    }
    st.dir_insert(new_parent, new_name, ino)?;
    st.linkable.remove(&ino);
    let inode = st.inode_mut(ino)?;
    inode.nlink += 1;
    inode.ctime = super::super::inode::Time::now();
    st.touch_mc(new_parent);
    Ok(st.inode(ino)?.attr())
}

/// The entry `name` in `parent` for removal: (child inode number).
fn removable(st: &State, caller: &Caller, parent: u64, name: &[u8]) -> FsResult<u64> {
    let dir = writable_dir(st, caller, parent)?;
    let slot = st.dir_get(parent, name)?.ok_or(FsError::NotFound)?;
    let child = st.inode(slot.ino)?;
    if !perm::sticky_allows(caller, &dir, &child) {
        return Err(FsError::Perm);
    }
    Ok(slot.ino)
}

pub fn unlink(st: &mut State, caller: &Caller, parent: u64, name: &[u8]) -> FsResult<()> {
    if name == b"." || name == b".." {
        return Err(FsError::IsDir);
    }
    check_name(name)?;
    let child = removable(st, caller, parent, name)?;
    if st.inode(child)?.is_dir() {
        return Err(FsError::IsDir);
    }
    st.dir_remove(parent, name);
    st.touch_mc(parent);
    st.drop_link(child)
}

pub fn rmdir(st: &mut State, caller: &Caller, parent: u64, name: &[u8]) -> FsResult<()> {
    match name {
        b"." => return Err(FsError::Invalid("cannot remove \".\"")),
        b".." => return Err(FsError::NotEmpty),
        _ => check_name(name)?,
    }
    let child = removable(st, caller, parent, name)?;
    if !st.inode(child)?.is_dir() {
        return Err(FsError::NotDir);
    }
    if !st.dir_is_empty(child)? {
        return Err(FsError::NotEmpty);
    }
    st.dir_remove(parent, name);
    let p = st.inode_mut(parent)?;
    p.nlink = p.nlink.saturating_sub(1);
    st.touch_mc(parent);
    st.drop_link(child)
}
