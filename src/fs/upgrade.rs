//! Format upgrades in place (`raidfs upgrade`), as `tune2fs -O` or
//! `zpool upgrade` do: a filesystem keeps the format it was made with until
//! its owner asks for a newer one, because an upgraded filesystem is refused
//! by older raidfs releases.
//!
//! Every format this code opens encodes its metadata the same way; a newer
//! version only allows more (unwritten extents, journal records written
//! with their data). So an upgrade replays and checkpoints the journal, then
//! rewrites the two header copies with the new version. The copies are
//! written one after the other, each flushed, and the copy with the higher
//! generation wins at the next open, so a crash leaves either format whole.

use std::sync::Arc;

use super::core::metadata_group;
use super::layout::{implied_features, read_header, write_header, VERSION};
use super::{FileSystem, FsOptions, FsResult};
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
        self.from < self.to
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
    let group = metadata_group(store.as_ref())?;
    let (mut header, _) = read_header(store.as_ref(), group)?;
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
        format(store.as_ref(), ChecksumKind::Crc32c, OLDEST_VERSION).unwrap();
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
        assert_eq!(planned.gains.len(), 3, "{:?}", planned.gains);
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
        format(store.as_ref(), ChecksumKind::None, 3).unwrap();
        let planned = upgrade(store.clone()).unwrap();
        assert_eq!((planned.from, planned.to), (3, VERSION));
        assert!(planned.gains[0].contains("nothing"), "{:?}", planned.gains);
        assert!(!Inner::open(store, true).unwrap().verified_commits);
    }
}
