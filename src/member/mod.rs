//! Member devices: the storage a RAID array is built from.
//!
//! Everything above this layer sees a member only through [`Member`]: positional
//! reads and writes, a durability barrier, and a length. Implementations:
//! [`file::FileMember`] (image files and block devices),
//! [`nbd::NbdMember`] (an export of an NBD server on another host) and
//! [`simulated::SimulatedDisk`] (a spinning disk's timing, for `raidfs bench
//! balance`). [`open`] opens a member by the name the user gave: a path or
//! an NBD URI. The test doubles, `memory::MemoryMember` and
//! `faulty::FaultyMember` (fault and crash injection), are built only for
//! tests and with the `testing` feature, so the product does not carry them.

#[cfg(any(test, feature = "testing"))]
pub mod faulty;
pub mod file;
#[cfg(any(test, feature = "testing"))]
pub mod memory;
pub mod nbd;
pub mod open;
pub mod simulated;
mod uncached;
mod write_behind;

use std::io;

/// A member device. All offsets are byte offsets from the start of the device.
///
/// Implementations must be safe to call from many threads at once; a read or
/// write either transfers the whole buffer or returns an error.
pub trait Member: Send + Sync {
    /// Read exactly `buf.len()` bytes at `offset`.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    /// Write all of `buf` at `offset`.
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// Write `bufs` one after another from `offset`. Image files do it in
    /// one `pwritev`, which spares a caller gathering parts of its buffer
    /// that are not contiguous (a member's chunks of a full-stripe write)
    /// into a copy first.
    fn write_vectored_at(&self, bufs: &[&[u8]], offset: u64) -> io::Result<()> {
        let mut at = offset;
        for buf in bufs {
            self.write_at(buf, at)?;
            at += buf.len() as u64;
        }
        Ok(())
    }
    /// Make every completed write durable (fdatasync for files and devices).
    fn sync(&self) -> io::Result<()>;
    /// Size of the device in bytes.
    fn len(&self) -> u64;
    /// Look at the device's size again (an image file extended with
    /// `truncate`, a block device or volume made larger) and use it from
    /// now on; returns the new length. Devices whose size cannot change
    /// return [`Member::len`].
    fn refresh_len(&self) -> io::Result<u64> {
        Ok(self.len())
    }
    /// Whether the device has no bytes at all.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Human-readable name for messages (usually the path).
    fn name(&self) -> String;
    /// Make `[offset, offset + len)` read as zeros. The default writes zeros;
    /// image files punch a hole instead, so sparse images stay sparse.
    fn zero_range(&self, offset: u64, len: u64) -> io::Result<()> {
        write_zeros(self, offset, len)
    }
    /// Whether [`Member::discard`] can give space back here: a sparse image
    /// on a filesystem that punches holes, a block device that deallocates
    /// with guaranteed zeros. Asked before a discard that only helps if
    /// every member of a stripe takes it.
    fn can_discard(&self) -> bool {
        false
    }
    /// Give `[offset, offset + len)` back to whatever holds the member (the
    /// host filesystem, the device), after which the range reads as zeros.
    /// `ErrorKind::Unsupported` when it cannot, with nothing changed; never
    /// falls back to writing zeros (free space is not worth the I/O).
    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        let _ = (offset, len);
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!("{} cannot give space back", self.name()),
        ))
    }
    /// Bytes free for this member to grow into on the filesystem that
    /// holds it (a sparse image file), or None when it cannot run out
    /// (block devices, memory). Lets the array stop answering writes
    /// before they land when the host is nearly full.
    fn host_free_bytes(&self) -> Option<u64> {
        None
    }
    /// Whether the device has a moving head (seeks cost time), when known.
    /// `None` leaves it to the array to detect from the path or assume.
    fn rotational(&self) -> Option<bool> {
        None
    }
    /// Write `buf` at `offset` and make that range durable before
    /// returning, without waiting for the member's other unsynced writes
    /// (image files: `pwritev2(RWF_DSYNC)`). Used for small metadata that
    /// must be on disk before other writes start (the write-intent bitmap).
    fn write_durable(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.write_at(buf, offset)?;
        self.sync()
    }
    /// Whether the member fails fast: a request that stalls fails it after
    /// a short timeout, with no reconnection, rather than holding the
    /// array (NBD members named by `-o failfast=`).
    fn failfast(&self) -> bool {
        false
    }
    /// Make the member fail fast (or not); false when it has no such mode
    /// (image files and block devices, whose errors come from the kernel).
    fn set_failfast(&self, on: bool) -> bool {
        let _ = on;
        false
    }
    /// Whether a write only copies into a cache (the page cache of a file
    /// opened without O_DIRECT, or memory) and so costs CPU rather than
    /// waiting on a device. Such writes are cheaper done by the thread that
    /// has the data than handed to a member worker, which costs two wake-ups
    /// and, on a busy machine, a wait for a CPU.
    fn cached_writes(&self) -> bool {
        false
    }
    /// Read `buf.len()` bytes at `offset` only if that needs no device I/O
    /// (the bytes are cached): true when read, false when it would have had
    /// to wait (nothing is then promised about `buf`). Lets a caller read
    /// cached data itself and hand only real device reads to workers.
    /// Asked only of members whose [`Member::cached_writes`] is true.
    fn read_cached(&self, buf: &mut [u8], offset: u64) -> io::Result<bool> {
        let _ = (buf, offset);
        Ok(false)
    }
}

/// Write zeros over `[offset, offset + len)` of `member`, a MiB at a time:
/// zeroing on a device that offers nothing better.
pub fn write_zeros<M: Member + ?Sized>(member: &M, offset: u64, len: u64) -> io::Result<()> {
    const STEP: u64 = 1 << 20;
    let zeros = vec![0u8; STEP.min(len) as usize];
    let mut done = 0;
    while done < len {
        let n = STEP.min(len - done) as usize;
        member.write_at(&zeros[..n], offset + done)?;
        done += n as u64;
    }
    Ok(())
}
