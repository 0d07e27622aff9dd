//! POSIX permission rules: owner/group/other classes with supplementary
//! groups, or the access ACL when the file has one (`acl`), root's bypass
//! (except that exec needs some x bit), sticky directories.

use super::inode::Inode;
use super::{Caller, FileKind, FsError, FsResult};

pub const R_OK: u32 = 4;
pub const W_OK: u32 = 2;
pub const X_OK: u32 = 1;
pub const S_ISUID: u16 = 0o4000;
pub const S_ISGID: u16 = 0o2000;
pub const S_ISVTX: u16 = 0o1000;

/// The extended attribute holding a file's capabilities.
pub const CAPABILITY_XATTR: &[u8] = b"security.capability";

/// What a change of a file's contents, size or owner takes away, as the
/// kernel's VFS does (the mount leaves it to the filesystem:
/// `FUSE_HANDLE_KILLPRIV_V2`): its capabilities, and with `setid` the
/// set-user-ID bit and, if the file is group-executable, the set-group-ID
/// bit (without group execute that bit marks mandatory locking and stays).
/// True when the mode changed.
pub fn drop_privileges(inode: &mut Inode, setid: bool) -> bool {
    inode.xattrs.remove(CAPABILITY_XATTR);
    let before = inode.perm;
    if setid && inode.kind != FileKind::Dir {
        inode.perm &= !S_ISUID;
        if inode.perm & 0o010 != 0 {
            inode.perm &= !S_ISGID;
        }
    }
    inode.perm != before
}

/// The rest of the kernel's rule (`setattr_should_drop_sgid`) for a change
/// of contents by `caller`, who lacks CAP_FSETID: the set-group-ID bit of a
/// file that is not group-executable goes too when `caller` is not in the
/// file's group. [`drop_privileges`] has already dealt with the rest. True
/// when the mode changed.
pub fn drop_sgid_of_outsider(inode: &mut Inode, caller: &Caller) -> bool {
    if inode.kind == FileKind::Dir || inode.perm & S_ISGID == 0 || in_group(caller, inode.gid) {
        return false;
    }
    inode.perm &= !S_ISGID;
    true
}

pub fn in_group(caller: &Caller, gid: u32) -> bool {
    caller.gid == gid || caller.groups.contains(&gid)
}

pub fn may(caller: &Caller, inode: &Inode, mask: u32) -> bool {
    if caller.uid == 0 {
        return mask & X_OK == 0 || inode.kind == FileKind::Dir || inode.perm & 0o111 != 0;
    }
    if let Some(acl) = super::acl::access_acl(inode) {
        return acl.allows(caller, inode, mask);
    }
    let bits = if caller.uid == inode.uid {
        inode.perm >> 6
    } else if in_group(caller, inode.gid) {
        inode.perm >> 3
    } else {
        inode.perm
    } as u32
        & 7;
    bits & mask == mask
}

pub fn check(caller: &Caller, inode: &Inode, mask: u32) -> FsResult<()> {
    if may(caller, inode, mask) {
        Ok(())
    } else {
        Err(FsError::Access)
    }
}

/// In a sticky directory only the file's owner, the directory's owner or
/// root may remove or rename an entry.
pub fn sticky_allows(caller: &Caller, dir: &Inode, victim: &Inode) -> bool {
    dir.perm & S_ISVTX == 0 || caller.uid == 0 || caller.uid == dir.uid || caller.uid == victim.uid
}

pub fn is_owner_or_root(caller: &Caller, inode: &Inode) -> bool {
    caller.uid == 0 || caller.uid == inode.uid
}
