//! What reads of file data met since the mount: blocks that failed their
//! checksum and were served from a good copy (corrected), blocks no copy
//! could serve (unrecoverable, read as EIO), and the file and offset of the
//! last one of either, so a monitor can say which file was hit (as ZFS's
//! `zpool status -v` names damaged files).

use parking_lot::Mutex;

/// One data block that failed its checksum on a read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DataError {
    pub ino: u64,
    /// Byte offset of the block in the file.
    pub offset: u64,
    /// No copy passed: the read failed with EIO.
    pub unrecoverable: bool,
}

/// The counters and the last error, as one snapshot.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DataErrors {
    pub corrected: u64,
    pub unrecoverable: u64,
    pub last: Option<DataError>,
}

/// The owner of [`DataErrors`]: every data read that fails a checksum
/// records here, in one step, so a snapshot's counters and last error agree.
#[derive(Debug, Default)]
pub struct DataErrorLog {
    state: Mutex<DataErrors>,
}

impl DataErrorLog {
    pub fn record(&self, error: DataError) {
        let mut st = self.state.lock();
        if error.unrecoverable {
            st.unrecoverable += 1;
        } else {
            st.corrected += 1;
        }
        st.last = Some(error);
    }

    pub fn snapshot(&self) -> DataErrors {
        *self.state.lock()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_follow_the_kind_and_the_last_error_is_kept() {
        let log = DataErrorLog::default();
        assert_eq!(log.snapshot(), DataErrors::default());
        let healed = DataError {
            ino: 5,
            offset: 8192,
            unrecoverable: false,
        };
        log.record(healed);
        let lost = DataError {
            ino: 7,
            offset: 0,
            unrecoverable: true,
        };
        log.record(lost);
        let snap = log.snapshot();
        assert_eq!((snap.corrected, snap.unrecoverable), (1, 1));
        assert_eq!(snap.last, Some(lost));
    }
}
