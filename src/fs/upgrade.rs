//! Format upgrades in place (`raidfs upgrade`), as `tune2fs -O` or
//! `zpool upgrade` do: a filesystem keeps the format it was made with until
//! its owner asks for a newer one, because an upgraded filesystem is refused
//! by older raidfs releases.
//!
//! Formats 2 to 5 encode their journal records the same way; a newer
//! version only allows more (unwritten extents, journal records written
//! with their data). The metadata tree (`metadata_tree`) changes what a
//! checkpoint is: the upgrade replays and checkpoints the journal as the
//! old format does, writes the whole metadata as a tree in space the old
//! checkpoint does not use, with two new one-block slots naming its root,
//! and only then rewrites the two header copies with the new version,
//! features and slots. The copies are written one after the other, each
//! flushed, and the copy with the higher generation wins at the next open,
//! so a crash leaves either format whole: the old header still names the
//! old checkpoint, which nothing before the header's rewrite touched.

use std::sync::Arc;

use super::core::{load, metadata_group};
use super::inode::BLOCK_SIZE;
use super::layout::{implied_features, read_header, write_header, Region, VERSION};
use super::meta_tree::{reserved_regions, MetaTree};
use super::node_space::NodeSpace;
use super::tree::NodeAlloc;
use super::{FileSystem, FsError, FsOptions, FsResult};
use crate::fs::BlockStore;

/// What upgrading a filesystem does (or did).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Upgrade {
    /// The format found.
    pub from: u32,
    /// The format after the upgrade (`from` when it is already current).
    pub to: u32,
    /// What the newer formats bring, one line each.
    pub gains: Vec<String>,
}

impl Upgrade {
    pub fn is_needed(&self) -> bool {
        !self.gains.is_empty()
    }
}

/// The format of the filesystem on `store` and what upgrading it brings.
pub fn plan(store: &dyn BlockStore) -> FsResult<Upgrade> {
    let (header, _) = read_header(store, metadata_group(store)?)?;
    let mut gains = Vec::new();
    if header.version < 3 {
        gains.push(
            "format 3: fallocate reserves space without writing zeros (unwritten extents)".into(),
        );
    }
    if header.version < 4 {
        gains.push(if header.data_checksum.enabled() {
            "format 4: an fsync costs one flush of the members instead of two (journal records written with their data and checked at replay)".into()
        } else {
            "format 4: nothing on this filesystem (one-flush commits need data checksums, which it was made without)".into()
        });
    }
    if header.version < 5 {
        gains.push(
            "format 5: feature words, so later features need no new format (a raidfs that does not know one refuses it, or mounts read-only, by its bit)".into(),
        );
    }
    if !header.metadata_tree() {
        gains.push(
            "metadata tree: a checkpoint writes only what changed, and the metadata grows into further metadata groups instead of stopping at half of one (millions of files, terabytes of checksummed data)".into(),
        );
    }
    Ok(Upgrade {
        from: header.version,
        to: header.version.max(VERSION),
        gains,
    })
}

/// Upgrade the unmounted filesystem on `store` to the current format.
/// Replays its journal and writes a checkpoint first, so the log holds no
/// record at the moment the version changes.
pub fn upgrade(store: Arc<dyn BlockStore>) -> FsResult<Upgrade> {
    let planned = plan(store.as_ref())?;
    if !planned.is_needed() {
        return Ok(planned);
    }
    let fs = FileSystem::open(Arc::clone(&store), FsOptions::default())?;
    fs.unmount()?;
    drop(fs);
    let loaded = load(&store)?;
    let mut journal = loaded.journal;
    if !journal.header.metadata_tree() {
        // The new slots and the tree go where the old layout keeps nothing
        // of value: anywhere but the header copies, the journal and the
        // slot holding the checkpoint just written (the older slot is
        // free; the newest stays whole until the header no longer names it).
        let newest = journal.header.slots[journal.newest_slot];
        let mut kept = reserved_regions(&journal.header, journal.meta_group);
        kept.retain(|r| !journal.header.slots.contains(r));
        kept.push(newest);
        let mut space = NodeSpace::build(Arc::clone(&store), &kept, &[])?;
        let blocks = space.alloc(2)?;
        let [a, b] = blocks[..] else {
            return Err(FsError::NoSpace);
        };
        journal.header.slots = [
            Region {
                addr: a,
                len: BLOCK_SIZE,
            },
            Region {
                addr: b,
                len: BLOCK_SIZE,
            },
        ];
        journal.newest_slot = 1;
        let root = MetaTree::write_fresh(
            Arc::clone(&store),
            &mut journal,
            &loaded.meta,
            &[newest],
            &[],
        )?;
        // Both slots name the root, so neither reads as damaged.
        journal.checkpoint_root(
            store.as_ref(),
            root,
            (loaded.meta.next_ino, loaded.meta.next_gen),
        )?;
    }
    let group = journal.meta_group;
    let mut header = journal.header;
    header.version = planned.to;
    header.features = implied_features(planned.to);
    header.generation += 1;
    write_header(store.as_ref(), group, &header)?;
    Ok(planned)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::core::{format, Inner};
    use crate::fs::layout::OLDEST_VERSION;
    use crate::fs::teststore::MemStore;
    use crate::fs::{Caller, ChecksumKind};
    use std::ffi::OsStr;

    #[test]
    fn an_old_filesystem_is_upgraded_with_its_files_and_its_unreplayed_log() {
        let store = Arc::new(MemStore::new(4, 8 << 20, 64 << 10));
        format(&store, ChecksumKind::Crc32c, OLDEST_VERSION).unwrap();
        let fs = FileSystem::open(store.clone(), FsOptions::default()).unwrap();
        let root = Caller::root();
        let attr = fs
            .create(&root, 1, OsStr::new("kept"), 0o644, 0, libc::O_RDWR)
            .unwrap();
        fs.write(attr.ino, 0, b"written before the upgrade")
            .unwrap();
        fs.fsync(attr.ino, false).unwrap();
        // No unmount: the file lives only in the journal, as after a crash.
        drop(fs);

        let planned = plan(store.as_ref()).unwrap();
        assert_eq!((planned.from, planned.to), (OLDEST_VERSION, VERSION));
        assert_eq!(planned.gains.len(), 4, "{:?}", planned.gains);
        let done = upgrade(store.clone()).unwrap();
        assert_eq!(done, planned);

        let inner = Inner::open(store.clone(), true).unwrap();
        assert!(inner.unwritten_extents && inner.verified_commits);
        drop(inner);
        let fs = FileSystem::open(store.clone(), FsOptions::default()).unwrap();
        let attr = fs.lookup(&root, 1, OsStr::new("kept")).unwrap();
        assert_eq!(
            fs.read(attr.ino, 0, 64).unwrap(),
            b"written before the upgrade"
        );
        fs.unmount().unwrap();

        let again = upgrade(store.clone()).unwrap();
        assert!(!again.is_needed() && again.gains.is_empty());
    }

    #[test]
    fn without_data_checksums_the_upgrade_says_it_gains_no_one_flush_commits() {
        let store = Arc::new(MemStore::new(4, 8 << 20, 64 << 10));
        format(&store, ChecksumKind::None, 3).unwrap();
        let planned = upgrade(store.clone()).unwrap();
        assert_eq!((planned.from, planned.to), (3, VERSION));
        assert!(planned.gains[0].contains("nothing"), "{:?}", planned.gains);
        assert!(!Inner::open(store, true).unwrap().verified_commits);
    }
}
