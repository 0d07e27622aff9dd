//! Extended attributes: `user.`, `trusted.` and `security.` stored as
//! given, the POSIX ACL names parsed and kept in step with the mode
//! (`fs::acl`), with XATTR_CREATE / XATTR_REPLACE.

use super::super::acl::{self, Acl};
use super::super::inode::Time;
use super::super::perm::{self, R_OK, W_OK};
use super::super::state::State;
use super::super::{Caller, FileKind, FsError, FsResult};

pub const XATTR_CREATE: i32 = 1;
pub const XATTR_REPLACE: i32 = 2;
const MAX_NAME: usize = 255;
const MAX_VALUE: usize = 65536;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Namespace {
    User,
    Trusted,
    Security,
    Acl,
}

fn namespace(name: &[u8]) -> FsResult<Namespace> {
    if name.is_empty() || name.len() > MAX_NAME {
        return Err(FsError::Range);
    }
    let ns = if name.starts_with(b"user.") {
        Namespace::User
    } else if name.starts_with(b"trusted.") {
        Namespace::Trusted
    } else if name.starts_with(b"security.") {
        Namespace::Security
    } else if name == b"system.posix_acl_access" || name == b"system.posix_acl_default" {
        Namespace::Acl
    } else {
        return Err(FsError::Unsupported("xattr namespace"));
    };
    Ok(ns)
}

/// May `caller` read (`write == false`) or change this attribute?
fn allowed(st: &State, caller: &Caller, ino: u64, ns: Namespace, write: bool) -> FsResult<()> {
    let inode = st.inode(ino)?;
    match ns {
        Namespace::User => {
            if !matches!(inode.kind, FileKind::File | FileKind::Dir) {
                return Err(if write {
                    FsError::Perm
                } else {
                    FsError::NoAttr
                });
            }
            perm::check(caller, &inode, if write { W_OK } else { R_OK })
        }
        Namespace::Trusted if caller.uid != 0 => Err(if write {
            FsError::Perm
        } else {
            FsError::NoAttr
        }),
        Namespace::Security if write && caller.uid != 0 => Err(FsError::Perm),
        Namespace::Acl if write && !perm::is_owner_or_root(caller, &inode) => Err(FsError::Perm),
        _ => Ok(()),
    }
}

pub fn set(
    st: &mut State,
    caller: &Caller,
    ino: u64,
    name: &[u8],
    value: &[u8],
    flags: i32,
) -> FsResult<()> {
    let ns = namespace(name)?;
    if value.len() > MAX_VALUE {
        return Err(FsError::TooBig);
    }
    allowed(st, caller, ino, ns, true)?;
    let exists = st.inode(ino)?.xattrs.contains_key(name);
    if flags & XATTR_CREATE != 0 && exists {
        return Err(FsError::Exists);
    }
    if flags & XATTR_REPLACE != 0 && !exists {
        return Err(FsError::NoAttr);
    }
    if ns == Namespace::Acl {
        return set_acl(st, caller, ino, name, value);
    }
    let inode = st.inode_mut(ino)?;
    inode.xattrs.insert(name.to_vec(), value.to_vec());
    inode.ctime = Time::now();
    Ok(())
}

/// An ACL is parsed and kept in step with the mode, as ext4 does: the
/// access ACL sets the mode's rwx bits and is not stored when the mode
/// says as much; a default ACL belongs to directories only.
fn set_acl(st: &mut State, caller: &Caller, ino: u64, name: &[u8], value: &[u8]) -> FsResult<()> {
    let parsed = Acl::parse(value)?;
    let inode = st.inode_mut(ino)?;
    if name == acl::DEFAULT {
        if inode.kind != FileKind::Dir {
            return Err(FsError::Access);
        }
        inode.xattrs.insert(name.to_vec(), parsed.encode());
    } else {
        let mut perm = (inode.perm & !0o777) | parsed.mode_bits();
        // posix_acl_update_mode: setting an ACL takes set-group-ID from
        // whoever is not in the file's group.
        if caller.uid != 0 && !perm::in_group(caller, inode.gid) {
            perm &= !perm::S_ISGID;
        }
        inode.perm = perm;
        if parsed.is_equivalent_to_mode() {
            inode.xattrs.remove(name);
        } else {
            inode.xattrs.insert(name.to_vec(), parsed.encode());
        }
    }
    inode.ctime = Time::now();
    Ok(())
}

pub fn get(st: &State, caller: &Caller, ino: u64, name: &[u8]) -> FsResult<Vec<u8>> {
    let ns = namespace(name)?;
    allowed(st, caller, ino, ns, false)?;
    st.inode(ino)?
        .xattrs
        .get(name)
        .cloned()
        .ok_or(FsError::NoAttr)
}

pub fn list(st: &State, caller: &Caller, ino: u64) -> FsResult<Vec<u8>> {
    let inode = st.inode(ino)?;
    let mut out = Vec::new();
    for name in inode.xattrs.keys() {
        if name.starts_with(b"trusted.") && caller.uid != 0 {
            continue;
        }
        out.extend_from_slice(name);
        out.push(0);
    }
    Ok(out)
}

pub fn remove(st: &mut State, caller: &Caller, ino: u64, name: &[u8]) -> FsResult<()> {
    let ns = namespace(name)?;
    // The kernel removes a file's capabilities on behalf of whoever writes
    // it (file_remove_privs); it checks CAP_SETFCAP itself before passing on
    // a removexattr(2) of them. Anyone who may write the file may do this.
    let capabilities_dropped_by_a_writer =
        name == perm::CAPABILITY_XATTR && perm::may(caller, &*st.inode(ino)?, W_OK);
    if !capabilities_dropped_by_a_writer {
        allowed(st, caller, ino, ns, true)?;
    }
    if !st.inode(ino)?.xattrs.contains_key(name) {
        return Err(FsError::NoAttr);
    }
    let inode = st.inode_mut(ino)?;
    inode.xattrs.remove(name);
    inode.ctime = Time::now();
    Ok(())
}
