//! setattr's rules: who may chmod, chown, truncate and set times, and the
//! set-id bits that those changes clear.

use super::super::inode::Time;
use super::super::perm::{self, in_group, S_ISGID, W_OK};
use super::super::state::State;
use super::super::{Caller, FileKind, FsError, FsResult, SetAttr, TimeSet};

/// Check every requested change before any is made.
pub fn validate(st: &State, caller: &Caller, ino: u64, set: &SetAttr) -> FsResult<()> {
    let inode = st.inode(ino)?;
    let root = caller.uid == 0;
    if set.mode.is_some() && !perm::is_owner_or_root(caller, &inode) {
        return Err(FsError::Perm);
    }
    if let Some(uid) = set.uid {
        if !root && uid != inode.uid {
            return Err(FsError::Perm);
        }
    }
    if set.uid.is_some() || set.gid.is_some() {
        if !root && caller.uid != inode.uid {
            return Err(FsError::Perm);
        }
        if let Some(gid) = set.gid {
            if !root && gid != inode.gid && !in_group(caller, gid) {
                return Err(FsError::Perm);
            }
        }
    }
    if set.size.is_some() {
        match inode.kind {
            FileKind::File if set.through_writable_fd => {}
            FileKind::File => perm::check(caller, &inode, W_OK)?,
            FileKind::Dir => return Err(FsError::IsDir),
            _ => return Err(FsError::Invalid("truncate of a special file")),
        }
    }
    for t in [set.atime, set.mtime].into_iter().flatten() {
        match t {
            TimeSet::At(_) if !perm::is_owner_or_root(caller, &inode) => return Err(FsError::Perm),
            TimeSet::Now
                if !perm::is_owner_or_root(caller, &inode) && !perm::may(caller, &inode, W_OK) =>
            {
                return Err(FsError::Access)
            }
            _ => {}
        }
    }
    Ok(())
}

/// Apply everything but the size (which the data path does).
pub fn apply(st: &mut State, caller: &Caller, ino: u64, set: &SetAttr) -> FsResult<()> {
    let now = Time::now();
    let inode = st.inode_mut(ino)?;
    if let Some(uid) = set.uid {
        inode.uid = uid;
    }
    if let Some(gid) = set.gid {
        inode.gid = gid;
    }
    // A new owner takes the set-ID bits whoever changes it; a truncate by
    // anyone but root takes them too; both take the capabilities.
    let new_owner = set.uid.is_some() || set.gid.is_some();
    if new_owner || set.size.is_some() {
        perm::drop_privileges(inode, new_owner || caller.uid != 0);
    }
    if let Some(mode) = set.mode {
        let mut perm = (mode & 0o7777) as u16;
        if caller.uid != 0 && !in_group(caller, inode.gid) {
            perm &= !S_ISGID;
        }
        inode.perm = perm;
        crate::fs::acl::after_chmod(inode);
    }
    let pick = |t: TimeSet| match t {
        TimeSet::Now => now,
        TimeSet::At(at) => Time::from_system(at),
    };
    if let Some(t) = set.atime {
        inode.atime = pick(t);
    }
    if let Some(t) = set.mtime {
        inode.mtime = pick(t);
    }
    inode.ctime = now;
    Ok(())
}
