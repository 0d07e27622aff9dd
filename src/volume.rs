//! A volume: an assembled array with its filesystem open on it, started and
//! stopped in the one order that keeps both consistent.
//!
//! Start-up, read-write: mark the array dirty (before the first write can
//! be in flight), open the filesystem (its journal replay checks and heals
//! the last commit's data), then start the array's background work. The
//! background work comes last because a resync of dirty regions asks the
//! filesystem's checksums which copy to keep (`array::judge`), and those
//! must be settled by the replay first. A read-only volume writes nothing:
//! no state change, no background work.
//!
//! Shut-down: the filesystem's final commit and flush, then the array
//! marked clean (which stops the background work and flushes). This type is
//! the one place a mount marks its array clean; the daemon and the tests go
//! through it so that they cannot disagree on the order.

use std::sync::Arc;

use log::warn;

use crate::array::{Array, ArrayError};
use crate::fs::{ArrayStore, FileSystem, FsError, FsOptions};

/// Why a volume could not be opened or closed. The messages are the ones
/// the mount daemon reports.
#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    #[error("cannot mark the array in use: {0}")]
    MarkDirty(#[source] ArrayError),
    #[error("cannot open the filesystem: {0}")]
    Open(#[source] FsError),
    #[error("closing the filesystem: {0}")]
    Close(#[source] FsError),
    #[error("cannot mark the array clean: {0}")]
    MarkClean(#[source] ArrayError),
}

/// An open volume. End it with [`Volume::close`]; [`Volume::abandon`] leaves
/// the array as it is (dirty if read-write), as a crash would. Dropped
/// without either, it closes as well as it can and logs what failed.
pub struct Volume {
    array: Arc<Array>,
    fs: Arc<FileSystem>,
    read_only: bool,
    /// Set once closed or abandoned, so Drop does nothing more.
    ended: bool,
}

impl Volume {
    /// Open the filesystem on `array` with `opts`; read-write unless
    /// `opts.read_only`. If the filesystem does not open, the array stays
    /// dirty: the replay may have written part of its work, and a dirty
    /// array is resynced by its next assembly.
    pub fn open(array: Arc<Array>, opts: FsOptions) -> Result<Volume, VolumeError> {
        let read_only = opts.read_only;
        if !read_only {
            array.mark_dirty().map_err(VolumeError::MarkDirty)?;
        }
        let store = Arc::new(ArrayStore::new(Arc::clone(&array)));
        let fs = FileSystem::open(store, opts).map_err(VolumeError::Open)?;
        if !read_only {
            array.start_background();
        }
        Ok(Volume {
            array,
            fs: Arc::new(fs),
            read_only,
            ended: false,
        })
    }

    pub fn array(&self) -> &Arc<Array> {
        &self.array
    }

    pub fn fs(&self) -> &Arc<FileSystem> {
        &self.fs
    }

    pub fn read_only(&self) -> bool {
        self.read_only
    }

    /// The filesystem's final commit and flush (nothing more if a FUSE
    /// session already unmounted it), then, read-write, the array marked
    /// clean. If the commit fails the array stays dirty.
    pub fn close(mut self) -> Result<(), VolumeError> {
        self.ended = true;
        self.finish()
    }

    /// End without closing: no commit, the array left dirty (read-write)
    /// so that its next assembly resyncs it. For a session that failed to
    /// close the filesystem, and for tests standing in for a crash.
    pub fn abandon(mut self) {
        self.ended = true;
    }

    fn finish(&self) -> Result<(), VolumeError> {
        self.fs.unmount().map_err(VolumeError::Close)?;
        if self.read_only {
            return Ok(());
        }
        self.array.mark_clean().map_err(VolumeError::MarkClean)
    }
}

impl Drop for Volume {
    fn drop(&mut self) {
        if self.ended {
            return;
        }
        self.ended = true;
        warn!("a volume was dropped without being closed; closing it now");
        if let Err(e) = self.finish() {
            warn!("{e}");
        }
    }
}
