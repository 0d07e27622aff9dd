//! rename(2) with RENAME_NOREPLACE, RENAME_EXCHANGE and RENAME_WHITEOUT.
//! Each rename, whiteout included, is one change of the state under its
//! lock, so it lands in one journal record: a crash leaves the old names or
//! the new ones, never the file moved without its whiteout.

use super::super::inode::Time;
use super::super::perm::{self, W_OK};
use super::super::state::{check_name, State, MAX_LINKS};
use super::super::{Caller, FsError, FsResult, RenameFlags};
use super::namespace::{self, writable_dir};

fn check_rename_name(name: &[u8]) -> FsResult<()> {
    if name == b"." || name == b".." {
        return Err(FsError::Invalid("cannot rename \".\" or \"..\""));
    }
    check_name(name)
}

pub fn rename(
    st: &mut State,
    caller: &Caller,
    parent: u64,
    name: &[u8],
    new_parent: u64,
    new_name: &[u8],
    flags: RenameFlags,
) -> FsResult<()> {
    if flags.noreplace && flags.exchange {
        return Err(FsError::Invalid("RENAME_NOREPLACE with RENAME_EXCHANGE"));
    }
    if flags.whiteout && flags.exchange {
        return Err(FsError::Invalid("RENAME_WHITEOUT with RENAME_EXCHANGE"));
    }
    check_rename_name(name)?;
    check_rename_name(new_name)?;
    let src_dir = writable_dir(st, caller, parent)?;
    let dst_dir = writable_dir(st, caller, new_parent)?;
    let src_ino = st.dir_get(parent, name)?.ok_or(FsError::NotFound)?.ino;
    let src = st.inode(src_ino)?;
    if !perm::sticky_allows(caller, &src_dir, &src) {
        return Err(FsError::Perm);
    }
    let dst_ino = st.dir_get(new_parent, new_name)?.map(|s| s.ino);
    let dst = dst_ino.map(|i| st.inode(i)).transpose()?;
    if let Some(d) = &dst {
        if !perm::sticky_allows(caller, &dst_dir, d) {
            return Err(FsError::Perm);
        }
    }
    let moves_across = parent != new_parent;
    // A directory changing parent rewrites its "..", which needs write access to it.
    let check_moved_dir = |ino: u64| -> FsResult<()> {
        let i = st.inode(ino)?;
        if i.is_dir() && moves_across {
            perm::check(caller, &i, W_OK)?;
        }
        Ok(())
    };
    if flags.exchange {
        let dst_ino = dst_ino.ok_or(FsError::NotFound)?;
        if dst_ino == src_ino {
            return Ok(());
        }
        let src_is_dir = st.inode(src_ino)?.is_dir();
        let dst_is_dir = st.inode(dst_ino)?.is_dir();
        if (src_is_dir && st.is_ancestor(src_ino, new_parent)?)
            || (dst_is_dir && st.is_ancestor(dst_ino, parent)?)
        {
            return Err(FsError::Invalid("cannot move a directory into itself"));
        }
        check_moved_dir(src_ino)?;
        check_moved_dir(dst_ino)?;
        st.dir_insert(parent, name, dst_ino)?;
        st.dir_insert(new_parent, new_name, src_ino)?;
        if moves_across && src_is_dir != dst_is_dir {
            let (gains, loses) = if src_is_dir {
                (new_parent, parent)
            } else {
                (parent, new_parent)
            };
            st.inode_mut(gains)?.nlink += 1;
            let l = st.inode_mut(loses)?;
            l.nlink = l.nlink.saturating_sub(1);
        }
        if src_is_dir {
            st.inode_mut(src_ino)?.parent = new_parent;
        }
        if dst_is_dir {
            st.inode_mut(dst_ino)?.parent = parent;
        }
        st.touch_c(src_ino);
        st.touch_c(dst_ino);
        st.touch_mc(parent);
        st.touch_mc(new_parent);
        return Ok(());
    }
    let src_is_dir = src.is_dir();
    // As Linux: moving a directory under itself is refused before the target is looked at.
    if src_is_dir && st.is_ancestor(src_ino, new_parent)? {
        return Err(FsError::Invalid("cannot move a directory into itself"));
    }
    if let Some(d) = &dst {
        if flags.noreplace {
            return Err(FsError::Exists);
        }
        if d.ino == src_ino {
            return Ok(());
        }
        if src_is_dir {
            if !d.is_dir() {
                return Err(FsError::NotDir);
            }
            if !st.dir_is_empty(d.ino)? {
                return Err(FsError::NotEmpty);
            }
        } else if d.is_dir() {
            return Err(FsError::IsDir);
        }
    }
    if src_is_dir {
        check_moved_dir(src_ino)?;
        if moves_across && dst.is_none() && dst_dir.nlink >= MAX_LINKS {
            return Err(FsError::TooManyLinks);
        }
    }
    if let Some(d) = dst_ino {
        st.dir_remove(new_parent, new_name);
        if src_is_dir {
            let p = st.inode_mut(new_parent)?;
            p.nlink = p.nlink.saturating_sub(1);
        }
        st.drop_link(d)?;
    }
    st.dir_remove(parent, name);
    st.dir_insert(new_parent, new_name, src_ino)?;
    if flags.whiteout {
        namespace::whiteout(st, caller, parent, name)?;
    }
    if src_is_dir && moves_across {
        st.inode_mut(src_ino)?.parent = new_parent;
        let p = st.inode_mut(parent)?;
        p.nlink = p.nlink.saturating_sub(1);
        st.inode_mut(new_parent)?.nlink += 1;
    }
    st.inode_mut(src_ino)?.ctime = Time::now();
    st.touch_mc(parent);
    st.touch_mc(new_parent);
    Ok(())
}
