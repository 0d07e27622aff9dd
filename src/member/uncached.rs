//! Large writes of a buffered image file or block device that go around the
//! host's page cache, through a second descriptor of the same file opened
//! `O_DIRECT`.
//!
//! A member is opened buffered so that small writes gather in the host's
//! page cache and reads get its readahead. But a large write copied into
//! the page cache costs CPU the size of the write, once per copy of it: on
//! this project's test machine a RAID1 x2 `O_DIRECT` stream spent two
//! thirds of both CPUs in the kernel's `copy_folio_from_iter_atomic`,
//! writing into the two images' page caches, and ran at a sixth of the
//! disk's direct-write speed (docs/performance.md, "Against the kernel's
//! RAID"). md never copies: it hands the request's pages to every disk.
//! Writing large, aligned requests with `O_DIRECT` does the same here: the
//! device reads the caller's buffer, every member at once on its own
//! worker.
//!
//! What stays as it was: the kernel keeps the two descriptors coherent
//! (a direct write first writes back and then drops the cached pages of its
//! range), and only a sync makes anything durable, so `Member::sync` (an
//! `fdatasync` of the file, whichever descriptor wrote) covers these writes
//! as it covers buffered ones. Where direct I/O is not available (the open
//! fails, or the first write is refused with `EINVAL`) every write stays
//! buffered.

use std::fs::File;
use std::io::{self, IoSlice};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::io::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};

/// Alignment of buffers, offsets and lengths that direct writes need here.
/// 4096 is a multiple of every logical block size in common use.
pub const ALIGN: usize = 4096;

/// Writes from this size on go around the page cache: a full-stripe or
/// large mirror write (1 MiB FUSE requests, their member parts at least a
/// chunk). Smaller ones gather in the page cache, where random updates of
/// the same blocks are cheap.
pub const MIN_LEN: usize = 256 << 10;

/// Vectors per `pwritev` (Linux's `IOV_MAX`).
pub const MAX_IOVECS: usize = 1024;

/// The `O_DIRECT` descriptor of a member opened buffered.
pub struct Uncached {
    file: File,
    /// The host refused a direct write once: every write stays buffered.
    refused: AtomicBool,
}

impl Uncached {
    /// A second, `O_DIRECT` descriptor of the file behind `fd`, reopened
    /// through `/proc/self/fd` so it is the very file `fd` has open (not
    /// whatever the path names now). None where that cannot be had (no
    /// /proc, a filesystem without direct I/O): every write stays buffered.
    pub fn reopen(fd: RawFd) -> Option<Uncached> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_DIRECT | libc::O_CLOEXEC)
            .open(format!("/proc/self/fd/{fd}"))
            .inspect_err(|e| log::debug!("no direct descriptor for member fd {fd}: {e}"))
            .ok()?;
        Some(Uncached {
            file,
            refused: AtomicBool::new(false),
        })
    }

    /// Write `bufs` one after another from `offset` around the page cache,
    /// if they qualify: at least [`MIN_LEN`] in all, every buffer's address
    /// and length and the offset aligned. None when they do not, or when
    /// the host refuses direct I/O here (then nothing needs undoing: the
    /// caller's buffered write of the same bytes replaces whatever part
    /// landed).
    pub fn write(&self, bufs: &[&[u8]], offset: u64, total: usize) -> Option<io::Result<()>> {
        if total < MIN_LEN
            || !offset.is_multiple_of(ALIGN as u64)
            || self.refused.load(Ordering::Relaxed)
            || !bufs.iter().all(|b| {
                (b.as_ptr() as usize).is_multiple_of(ALIGN) && b.len().is_multiple_of(ALIGN)
            })
        {
            return None;
        }
        match pwritev_all(self.file.as_raw_fd(), bufs, offset) {
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                self.refused.store(true, Ordering::Relaxed);
                log::info!("direct writes refused by the host ({e}): member writes stay buffered");
                None
            }
            result => Some(result),
        }
    }
}

/// `pwritev` on `fd` until every byte of `bufs` is written from `offset`.
pub fn pwritev_all(fd: RawFd, bufs: &[&[u8]], mut offset: u64) -> io::Result<()> {
    let mut slices: Vec<IoSlice<'_>> = bufs
        .iter()
        .filter(|b| !b.is_empty())
        .map(|b| IoSlice::new(b))
        .collect();
    let mut rest = slices.as_mut_slice();
    while !rest.is_empty() {
        let count = rest.len().min(MAX_IOVECS) as libc::c_int;
        let at = libc::off_t::try_from(offset)
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        // SAFETY: IoSlice is ABI-compatible with iovec on Unix; the slices
        // borrow live buffers for the length of the call; the fd is open.
        let n = unsafe { libc::pwritev(fd, rest.as_ptr().cast::<libc::iovec>(), count, at) };
        match n {
            0 => {
                return Err(io::Error::new(
                    io::ErrorKind::WriteZero,
                    "device accepted no bytes",
                ))
            }
            n if n < 0 => {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
            n => {
                offset += n as u64;
                IoSlice::advance_slices(&mut rest, n as usize);
            }
        }
    }
    Ok(())
}
