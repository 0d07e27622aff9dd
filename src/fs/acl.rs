//! POSIX ACLs, the way ext4 keeps them: the access ACL
//! (`system.posix_acl_access`) decides who may do what, with the mode's
//! owner, group and other bits kept in step with its USER_OBJ, MASK (or
//! GROUP_OBJ) and OTHER entries; the default ACL
//! (`system.posix_acl_default`, directories only) is what new entries
//! inherit, in place of the umask. An ACL that says no more than the mode
//! is not stored (`posix_acl_equiv_mode`), so a file never has two
//! disagreeing descriptions of its permissions.
//!
//! Values use the Linux xattr encoding (`posix_acl_xattr_header`): a u32
//! version (2), then entries of u16 tag, u16 permission bits, u32 id, all
//! little-endian, sorted by tag and then id.

use super::inode::Inode;
use super::perm::in_group;
use super::{Caller, FsError, FsResult};

pub const ACCESS: &[u8] = b"system.posix_acl_access";
pub const DEFAULT: &[u8] = b"system.posix_acl_default";

const VERSION: u32 = 2;
const USER_OBJ: u16 = 0x01;
const USER: u16 = 0x02;
const GROUP_OBJ: u16 = 0x04;
const GROUP: u16 = 0x08;
const MASK: u16 = 0x10;
const OTHER: u16 = 0x20;
/// `ACL_UNDEFINED_ID`: the id field of entries that name no one.
const NO_ID: u32 = u32::MAX;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    pub tag: u16,
    pub perm: u16,
    pub id: u32,
}

/// A parsed, valid ACL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Acl {
    entries: Vec<Entry>,
}

impl Acl {
    /// Parse and validate an xattr value; EINVAL for anything malformed,
    /// as the kernel's `posix_acl_valid` would refuse it.
    pub fn parse(value: &[u8]) -> FsResult<Acl> {
        let invalid = FsError::Invalid("malformed POSIX ACL");
        if value.len() < 4 || !(value.len() - 4).is_multiple_of(8) {
            return Err(invalid);
        }
        let version = u32::from_le_bytes([value[0], value[1], value[2], value[3]]);
        if version != VERSION {
            return Err(FsError::Invalid("unsupported POSIX ACL version"));
        }
        let entries: Vec<Entry> = value[4..]
            .chunks_exact(8)
            .map(|e| Entry {
                tag: u16::from_le_bytes([e[0], e[1]]),
                perm: u16::from_le_bytes([e[2], e[3]]),
                id: u32::from_le_bytes([e[4], e[5], e[6], e[7]]),
            })
            .collect();
        let acl = Acl { entries };
        acl.validate().map_err(|_| invalid)?;
        Ok(acl)
    }

    fn validate(&self) -> Result<(), ()> {
        let count = |tag| self.entries.iter().filter(|e| e.tag == tag).count();
        if count(USER_OBJ) != 1 || count(GROUP_OBJ) != 1 || count(OTHER) != 1 {
            return Err(());
        }
        let named = count(USER) + count(GROUP);
        if count(MASK) > 1 || (named > 0 && count(MASK) != 1) {
            return Err(());
        }
        let mut last: Option<(u16, u32)> = None;
        for e in &self.entries {
            if e.perm & !7 != 0 {
                return Err(());
            }
            let known = matches!(e.tag, USER_OBJ | USER | GROUP_OBJ | GROUP | MASK | OTHER);
            if !known {
                return Err(());
            }
            let key = (
                e.tag,
                if matches!(e.tag, USER | GROUP) {
                    e.id
                } else {
                    0
                },
            );
            // Sorted by tag then id, and no two entries alike.
            if last.is_some_and(|l| l >= key) {
                return Err(());
            }
            last = Some(key);
        }
        Ok(())
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = VERSION.to_le_bytes().to_vec();
        for e in &self.entries {
            out.extend_from_slice(&e.tag.to_le_bytes());
            out.extend_from_slice(&e.perm.to_le_bytes());
            let id = if matches!(e.tag, USER | GROUP) {
                e.id
            } else {
                NO_ID
            };
            out.extend_from_slice(&id.to_le_bytes());
        }
        out
    }

    fn perm_of(&self, tag: u16) -> Option<u16> {
        self.entries.iter().find(|e| e.tag == tag).map(|e| e.perm)
    }

    fn set_perm(&mut self, tag: u16, perm: u16) {
        for e in self.entries.iter_mut().filter(|e| e.tag == tag) {
            e.perm = perm;
        }
    }

    /// Whether the mode alone says as much (only the three base entries).
    pub fn is_equivalent_to_mode(&self) -> bool {
        self.entries
            .iter()
            .all(|e| matches!(e.tag, USER_OBJ | GROUP_OBJ | OTHER))
    }

    /// The rwx bits of the mode this ACL implies: owner from USER_OBJ,
    /// group from MASK (GROUP_OBJ without one), other from OTHER.
    pub fn mode_bits(&self) -> u16 {
        let owner = self.perm_of(USER_OBJ).unwrap_or(0);
        let group = self
            .perm_of(MASK)
            .or_else(|| self.perm_of(GROUP_OBJ))
            .unwrap_or(0);
        let other = self.perm_of(OTHER).unwrap_or(0);
        owner << 6 | group << 3 | other
    }

    /// `chmod` on a file with this access ACL (`posix_acl_chmod`).
    pub fn chmod(&mut self, perm: u16) {
        self.set_perm(USER_OBJ, (perm >> 6) & 7);
        let group_tag = if self.perm_of(MASK).is_some() {
            MASK
        } else {
            GROUP_OBJ
        };
        self.set_perm(group_tag, (perm >> 3) & 7);
        self.set_perm(OTHER, perm & 7);
    }

    /// A new entry's access ACL from its parent's default ACL and the mode
    /// it was created with (`posix_acl_create`): each class keeps only what
    /// the mode grants. Returns the ACL and the mode's rwx bits.
    pub fn for_new_entry(&self, perm: u16) -> (Acl, u16) {
        let mut acl = self.clone();
        let group_tag = if acl.perm_of(MASK).is_some() {
            MASK
        } else {
            GROUP_OBJ
        };
        for e in acl.entries.iter_mut() {
            match e.tag {
                USER_OBJ => e.perm &= (perm >> 6) & 7,
                OTHER => e.perm &= perm & 7,
                t if t == group_tag => e.perm &= (perm >> 3) & 7,
                _ => {}
            }
        }
        let bits = acl.mode_bits();
        (acl, bits)
    }

    /// POSIX.1e's access check for a caller who is not root: the owner's
    /// entry, else a named user's (limited by the mask), else the owning
    /// and named groups (any one granting all of `mask`, limited by the
    /// mask), else other.
    pub fn allows(&self, caller: &Caller, inode: &Inode, mask: u32) -> bool {
        let want = mask as u16;
        let limit = self.perm_of(MASK).unwrap_or(7);
        if caller.uid == inode.uid {
            return self.perm_of(USER_OBJ).unwrap_or(0) & want == want;
        }
        if let Some(e) = self
            .entries
            .iter()
            .find(|e| e.tag == USER && e.id == caller.uid)
        {
            return e.perm & limit & want == want;
        }
        let mut in_some_group = false;
        for e in &self.entries {
            let member = match e.tag {
                GROUP_OBJ => in_group(caller, inode.gid),
                GROUP => in_group(caller, e.id),
                _ => false,
            };
            if member {
                in_some_group = true;
                if e.perm & limit & want == want {
                    return true;
                }
            }
        }
        if in_some_group {
            return false;
        }
        self.perm_of(OTHER).unwrap_or(0) & want == want
    }
}

/// The inode's access ACL, if it has a valid one.
pub fn access_acl(inode: &Inode) -> Option<Acl> {
    inode.xattrs.get(ACCESS).and_then(|v| Acl::parse(v).ok())
}

/// The inode's default ACL, if it has a valid one.
pub fn default_acl(inode: &Inode) -> Option<Acl> {
    inode.xattrs.get(DEFAULT).and_then(|v| Acl::parse(v).ok())
}

/// Keep an access ACL in step after the mode's rwx bits changed (chmod).
pub fn after_chmod(inode: &mut Inode) {
    if let Some(mut acl) = access_acl(inode) {
        acl.chmod(inode.perm);
        inode.xattrs.insert(ACCESS.to_vec(), acl.encode());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acl(entries: &[(u16, u16, u32)]) -> Acl {
        Acl {
            entries: entries
                .iter()
                .map(|&(tag, perm, id)| Entry { tag, perm, id })
                .collect(),
        }
    }

    #[test]
    fn encoding_round_trips_and_bad_values_are_refused() {
        let a = acl(&[
            (USER_OBJ, 6, 0),
            (USER, 4, 1000),
            (GROUP_OBJ, 4, 0),
            (MASK, 6, 0),
            (OTHER, 0, 0),
        ]);
        let parsed = Acl::parse(&a.encode()).unwrap();
        assert_eq!(parsed.encode(), a.encode());
        assert_eq!(parsed.mode_bits(), 0o660);
        // A named entry without a mask, a duplicate, a bad version.
        let no_mask = acl(&[
            (USER_OBJ, 6, 0),
            (USER, 4, 1),
            (GROUP_OBJ, 4, 0),
            (OTHER, 0, 0),
        ]);
        assert!(Acl::parse(&no_mask.encode()).is_err());
        let mut bytes = a.encode();
        bytes[0] = 1;
        assert!(Acl::parse(&bytes).is_err());
        assert!(Acl::parse(&bytes[..7]).is_err());
    }

    #[test]
    fn mode_bits_follow_the_mask_and_chmod_sets_it() {
        let mut a = acl(&[
            (USER_OBJ, 7, 0),
            (USER, 7, 1000),
            (GROUP_OBJ, 5, 0),
            (MASK, 5, 0),
            (OTHER, 0, 0),
        ]);
        assert_eq!(a.mode_bits(), 0o750);
        a.chmod(0o640);
        assert_eq!(a.perm_of(MASK), Some(4));
        assert_eq!(
            a.perm_of(GROUP_OBJ),
            Some(5),
            "chmod leaves GROUP_OBJ to the mask"
        );
        assert_eq!(a.mode_bits(), 0o640);
    }

    #[test]
    fn a_new_entry_keeps_only_what_its_mode_grants() {
        let default = acl(&[
            (USER_OBJ, 7, 0),
            (GROUP, 7, 50),
            (GROUP_OBJ, 7, 0),
            (MASK, 7, 0),
            (OTHER, 5, 0),
        ]);
        let (new, bits) = default.for_new_entry(0o640);
        assert_eq!(bits, 0o640);
        assert_eq!(new.perm_of(MASK), Some(4));
        assert_eq!(new.perm_of(OTHER), Some(0));
    }
}
