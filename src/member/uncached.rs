//! Large writes and cold reads of a buffered image file or block device
//! that go around the host's page cache, through a second descriptor of
//! the same file opened `O_DIRECT`.
//!
//! A member is opened buffered so that small writes gather in the host's
//! page cache and reads get its readahead. But a large write copied into
//! the page cache costs CPU the size of the write, once per copy of it,
//! and more where fresh memory is dear: on this project's test machine, a
//! virtual machine whose balloon gives free memory back to its host (so
//! that the first touch of a fresh page faults in the hypervisor), a
//! RAID1 x2 `O_DIRECT` stream spent two thirds of both CPUs in the
//! kernel's `copy_folio_from_iter_atomic`, writing into the two images'
//! page caches, and ran at a sixth of the disk's direct-write speed
//! (docs/performance.md, "Against the kernel's RAID"). md never copies: it
//! hands the request's pages to every disk.
//! Writing large, aligned requests with `O_DIRECT` does the same here: the
//! device reads the caller's buffer, every member at once on its own
//! worker.
//!
//! Large reads of ranges the host has nothing of in its cache (asked with
//! `cachestat(2)`, which, unlike a `RWF_NOWAIT` read, starts no readahead)
//! go around it too: a cold stream is read once, into a buffer that is
//! used again and again, instead of into fresh page-cache pages and then
//! copied; and a RAID5/6 member's parity chunks between its data chunks
//! are no longer read ahead with them. Ranges the host has cached, in
//! part or whole (written, or read before), are read through the cache.
//!
//! Not every large write gains, though. The parts of a RAID5/6 full-stripe
//! write (a chunk run per member, 256 KiB of a 1 MiB request) write faster
//! through the page cache: the host allocates the image's blocks at
//! writeback in large extents (write-behind starts it at once), while each
//! direct write into blocks the image has not allocated waits for the host
//! filesystem to allocate them. Only writes of 1 MiB or more ([`MIN_LEN`]),
//! a mirror's copies of large requests, go around the cache, where not
//! copying them twice into the host's memory is what counts.
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
use std::sync::OnceLock;

/// Alignment of buffers, offsets and lengths that direct writes need here.
/// 4096 is a multiple of every logical block size in common use.
pub const ALIGN: usize = 4096;

/// Writes from this size on go around the page cache: a mirror's copy of
/// a 1 MiB request (FUSE's largest), which would otherwise be copied into
/// the host's page cache once per copy. Smaller ones gather in the page
/// cache, where random updates of the same blocks are cheap, and so do the
/// member parts of RAID5/6 full stripes (256 KiB of a 1 MiB request on
/// 4+1 or 4+2 with 64 KiB chunks): through the cache they wrote 1.20-1.33x
/// faster in O_DIRECT streams than around it, and no slower in other
/// sequential streams (`scripts/ab-fio`, docs/performance.md, "Member
/// writes: which go around the host's page cache").
pub const MIN_LEN: usize = 1 << 20;

/// Reads from this size on, of ranges with nothing cached, go around the
/// page cache: a chunk, the most a RAID5/6 member holds contiguously in
/// some stripes of a stream (the next chunk may be parity).
pub const READ_MIN_LEN: usize = 64 << 10;

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

/// Bounce buffers kept per thread up to this size (larger reads get one of
/// their own): a buffer used again stays in memory that is already mapped.
const BOUNCE_KEEP: usize = 8 << 20;

thread_local! {
    static BOUNCE: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

impl Uncached {
    /// Whether a read of `len` bytes at `offset` may go around the cache
    /// (large and aligned), if nothing of it is cached.
    pub fn takes_read(&self, len: usize, offset: u64) -> bool {
        len >= READ_MIN_LEN
            && len.is_multiple_of(ALIGN)
            && offset.is_multiple_of(ALIGN as u64)
            && !self.refused.load(Ordering::Relaxed)
    }

    /// Read `buf.len()` bytes at `offset` around the page cache (through a
    /// bounce buffer when `buf` is not aligned). None when the host refuses
    /// direct I/O here: the caller reads the ordinary way.
    pub fn read(&self, buf: &mut [u8], offset: u64) -> Option<io::Result<()>> {
        let fd = self.file.as_raw_fd();
        let result = if (buf.as_ptr() as usize).is_multiple_of(ALIGN) {
            pread_exact(fd, buf, offset)
        } else {
            BOUNCE.with(|cell| {
                let mut kept = cell.borrow_mut();
                let mut own = Vec::new();
                let bounce = if buf.len() + ALIGN <= BOUNCE_KEEP {
                    &mut *kept
                } else {
                    &mut own
                };
                if bounce.len() < buf.len() + ALIGN {
                    bounce.resize(buf.len() + ALIGN, 0);
                }
                let at = bounce.as_ptr().align_offset(ALIGN);
                let aligned = &mut bounce[at..at + buf.len()];
                pread_exact(fd, aligned, offset).map(|()| buf.copy_from_slice(aligned))
            })
        };
        match result {
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                self.refused.store(true, Ordering::Relaxed);
                log::info!("direct reads refused by the host ({e}): member reads stay buffered");
                None
            }
            result => Some(result),
        }
    }
}

/// `cachestat(2)`'s number: one for every architecture since Linux 6.5
/// (the libc crate names it only for some).
const SYS_CACHESTAT: libc::c_long = 451;

#[repr(C)]
struct CachestatRange {
    off: u64,
    len: u64,
}

#[repr(C)]
#[derive(Default)]
struct Cachestat {
    nr_cache: u64,
    nr_dirty: u64,
    nr_writeback: u64,
    nr_evicted: u64,
    nr_recently_evicted: u64,
}

/// How much of a range the page cache holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cached {
    None,
    Part,
    All,
}

/// How much of `[offset, offset + len)` of the file behind `fd` is in the
/// page cache, without reading anything or starting readahead; None where
/// the kernel cannot say (before Linux 6.5).
pub fn cached_pages(fd: RawFd, offset: u64, len: usize) -> Option<Cached> {
    static PAGE: OnceLock<u64> = OnceLock::new();
    // SAFETY: sysconf only reads its argument.
    let page = *PAGE.get_or_init(|| unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as u64);
    let range = CachestatRange {
        off: offset,
        len: len as u64,
    };
    let mut stat = Cachestat::default();
    // SAFETY: cachestat reads `range` and fills `stat`, both live for the
    // call and laid out as the kernel's structs; flags must be 0.
    let rc = unsafe {
        libc::syscall(
            SYS_CACHESTAT,
            fd,
            &range as *const CachestatRange,
            &mut stat as *mut Cachestat,
            0u32,
        )
    };
    if rc != 0 {
        return None;
    }
    Some(match stat.nr_cache {
        0 => Cached::None,
        n if n >= (len as u64).div_ceil(page) => Cached::All,
        _ => Cached::Part,
    })
}

/// pread on `fd` until `buf` is full; EOF before that is an error.
pub fn pread_exact(fd: RawFd, mut buf: &mut [u8], mut offset: u64) -> io::Result<()> {
    while !buf.is_empty() {
        let at = libc::off_t::try_from(offset)
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        // SAFETY: buf is writable for its length for the call; the fd is open.
        let n = unsafe { libc::pread(fd, buf.as_mut_ptr().cast(), buf.len(), at) };
        match n {
            0 => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "end of file reached early",
                ))
            }
            n if n < 0 => {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
            n => {
                buf = &mut buf[n as usize..];
                offset += n as u64;
            }
        }
    }
    Ok(())
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
