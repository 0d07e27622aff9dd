//! Image files and block devices as members.
//!
//! A [`FileMember`] owns one open file descriptor. Opening refuses symlinks
//! (`O_NOFOLLOW`), never leaks the descriptor into children (`O_CLOEXEC`), and
//! takes an exclusive `flock` so that two raidfs processes (or two opens in one
//! process) can never drive the same member at once. With `direct` the file is
//! opened `O_DIRECT`; requests that are not 4096-aligned in buffer address,
//! offset or length go through aligned bounce buffers, with a read-modify-write
//! for partial blocks.

use super::uncached::{cached_pages, pread_exact, pwritev_all, Cached, Uncached};
use super::write_behind::WriteBehind;
use super::Member;
use parking_lot::Mutex;
use std::fs::File;
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Alignment of buffers, offsets and lengths for `O_DIRECT` transfers. 4096 is
/// a multiple of every logical block size in common use.
pub const DIRECT_ALIGN: usize = 4096;

/// Stripes of the lock that serialises read-modify-write of partial blocks.
const RMW_LOCK_STRIPES: usize = 64;

/// How to open a member.
#[derive(Clone, Debug)]
pub struct OpenOptions {
    /// Bypass the page cache (`O_DIRECT`).
    pub direct: bool,
    /// Create a new sparse image file of this size; fails if the path exists.
    pub create_size: Option<u64>,
    /// Open read-only (writes fail with the OS's error).
    pub read_only: bool,
    /// Take the exclusive lock. Only inspection tools that must work on an
    /// assembled member (examine) turn this off.
    pub lock: bool,
    /// How long to wait for another process to release the lock. A daemon
    /// that was just unmounted still holds it while it closes the array, so
    /// a mount right after an unmount waits; zero fails at once.
    pub lock_wait: Duration,
}

impl Default for OpenOptions {
    fn default() -> OpenOptions {
        OpenOptions {
            direct: false,
            create_size: None,
            read_only: false,
            lock: true,
            lock_wait: Duration::ZERO,
        }
    }
}

/// An image file or block device.
pub struct FileMember {
    path: PathBuf,
    file: Arc<File>,
    /// Starts the writeback of large buffered writes (write-behind).
    write_behind: WriteBehind,
    /// Where large aligned writes of a buffered member go (around the
    /// page cache); None for a direct or read-only member.
    uncached: Option<Uncached>,
    /// The size as last looked at: at open, and again at
    /// [`Member::refresh_len`] when the array grows onto a larger member.
    len: AtomicU64,
    direct: bool,
    /// A regular file (an image), not a block device.
    is_file: bool,
    /// An image whose every block is allocated (preallocated, or written
    /// in full): zeroing a range gives the blocks back to it afterwards,
    /// so it keeps its reservation on the host.
    keep_allocated: AtomicBool,
    /// Hole punching was refused here once (a host filesystem or device
    /// without it): discards are not tried again.
    no_discard: AtomicBool,
    rmw_locks: Vec<Mutex<()>>,
}

impl FileMember {
    /// Open (or with `create_size`, create) a member.
    pub fn open(path: impl AsRef<Path>, options: OpenOptions) -> io::Result<FileMember> {
        let path = path.as_ref();
        let mut flags = libc::O_NOFOLLOW | libc::O_CLOEXEC;
        if options.direct {
            flags |= libc::O_DIRECT;
        }
        let mut open = std::fs::OpenOptions::new();
        open.read(true)
            .write(!options.read_only)
            .custom_flags(flags)
            .mode(0o644);
        if options.create_size.is_some() {
            open.create_new(true).write(true);
        }
        let file = open.open(path).map_err(|e| open_error(path, &options, e))?;
        let created = options.create_size.is_some();
        let member = FileMember::from_open_file(path, file, &options).inspect_err(|_| {
            if created {
                // We made it with O_EXCL, so removing it cannot hit anyone else's file.
                let _ = std::fs::remove_file(path);
            }
        })?;
        Ok(member)
    }

    /// Create a new sparse image file of `size` bytes (fails if `path` exists).
    pub fn create(path: impl AsRef<Path>, size: u64) -> io::Result<FileMember> {
        FileMember::open(
            path,
            OpenOptions {
                create_size: Some(size),
                ..OpenOptions::default()
            },
        )
    }

    /// The path this member was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether transfers bypass the page cache.
    pub fn is_direct(&self) -> bool {
        self.direct
    }

    /// Reserve host blocks for the whole of an image file (`fallocate`
    /// mode 0: holes become allocated, unwritten space; data is unchanged),
    /// so the array can never meet ENOSPC from the host later. Block
    /// devices have their space already; nothing is done for them.
    pub fn preallocate(&self) -> io::Result<()> {
        if !self.is_file {
            return Ok(());
        }
        libc::off_t::try_from(self.len())
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        loop {
            let Err(e) = self.fallocate(0, 0, self.len()) else {
                self.keep_allocated.store(true, Ordering::Release);
                return Ok(());
            };
            match e.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EOPNOTSUPP) => {
                    return Err(with_path(
                        &self.path,
                        "reserve space (the host filesystem cannot preallocate)",
                        e,
                    ))
                }
                _ => {
                    let what = format!("reserve {} MiB", self.len() >> 20);
                    return Err(with_path(&self.path, &what, e));
                }
            }
        }
    }

    fn from_open_file(path: &Path, file: File, options: &OpenOptions) -> io::Result<FileMember> {
        if options.lock {
            lock_exclusive(path, &file, options.lock_wait)?;
        }
        let metadata = file.metadata().map_err(|e| with_path(path, "stat", e))?;
        let file_type = metadata.file_type();
        let len = if let Some(size) = options.create_size {
            file.set_len(size)
                .map_err(|e| with_path(path, "set size of new image", e))?;
            size
        } else {
            device_len(path, &file, &metadata)?
        };
        check_direct_len(path, len, options.direct)?;
        let file = Arc::new(file);
        let device = if file_type.is_block_device() {
            metadata.rdev()
        } else {
            metadata.dev()
        };
        let uncached = (!options.direct && !options.read_only)
            .then(|| Uncached::reopen(file.as_raw_fd()))
            .flatten();
        Ok(FileMember {
            path: path.to_path_buf(),
            write_behind: WriteBehind::new(Arc::clone(&file), device),
            uncached,
            file,
            len: AtomicU64::new(len),
            direct: options.direct,
            is_file: file_type.is_file(),
            keep_allocated: AtomicBool::new(
                file_type.is_file() && metadata.blocks().saturating_mul(512) >= len,
            ),
            no_discard: AtomicBool::new(false),
            rmw_locks: (0..RMW_LOCK_STRIPES).map(|_| Mutex::new(())).collect(),
        })
    }

    /// `fallocate(2)` with `mode` over `[offset, offset + len)`.
    fn fallocate(&self, mode: libc::c_int, offset: u64, len: u64) -> io::Result<()> {
        // SAFETY: fallocate only reads its integer arguments; the fd is ours and open.
        let rc = unsafe {
            libc::fallocate(
                self.file.as_raw_fd(),
                mode,
                offset as libc::off_t,
                len as libc::off_t,
            )
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    fn check_bounds(&self, len: usize, offset: u64, what: &str) -> io::Result<()> {
        match offset.checked_add(len as u64) {
            Some(end) if end <= self.len() => Ok(()),
            _ => Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "{}: {what} of {len} bytes at offset {offset} is beyond the end ({} bytes)",
                    self.path.display(),
                    self.len()
                ),
            )),
        }
    }

    fn context(&self, what: &str, len: usize, offset: u64, e: io::Error) -> io::Error {
        io::Error::new(
            e.kind(),
            format!(
                "{}: {what} of {len} bytes at offset {offset}: {e}",
                self.path.display()
            ),
        )
    }

    /// pread until `buf` is full; EOF before that is an error.
    fn pread_exact(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        pread_exact(self.file.as_raw_fd(), buf, offset)
    }

    /// pwrite until all of `buf` is written.
    fn pwrite_all(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        pwritev_all(self.file.as_raw_fd(), &[buf], offset)
    }

    fn direct_read(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        if is_aligned(buf.as_ptr(), buf.len(), offset) {
            return self.pread_exact(buf, offset);
        }
        let (start, end) = aligned_span(offset, buf.len());
        let mut bounce = AlignedBuf::new((end - start) as usize);
        self.pread_exact(bounce.as_mut_slice(), start)?;
        let skip = (offset - start) as usize;
        buf.copy_from_slice(&bounce.as_slice()[skip..skip + buf.len()]);
        Ok(())
    }

    fn direct_write(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        if is_aligned(buf.as_ptr(), buf.len(), offset) {
            return self.pwrite_all(buf, offset);
        }
        let (start, end) = aligned_span(offset, buf.len());
        let len = (end - start) as usize;
        let mut bounce = AlignedBuf::new(len);
        let skip = (offset - start) as usize;
        let head_partial = skip != 0;
        let tail_partial = !(skip + buf.len()).is_multiple_of(DIRECT_ALIGN);
        // Two partial-block writers that share a block must not interleave
        // their read-modify-write, or one would undo the other.
        let first_block = start / DIRECT_ALIGN as u64;
        let last_block = end / DIRECT_ALIGN as u64 - 1;
        let _guards = self.lock_blocks(first_block, last_block, head_partial, tail_partial);
        if head_partial {
            self.pread_exact(&mut bounce.as_mut_slice()[..DIRECT_ALIGN], start)?;
        }
        if tail_partial && (last_block != first_block || !head_partial) {
            let tail = len - DIRECT_ALIGN;
            self.pread_exact(
                &mut bounce.as_mut_slice()[tail..],
                end - DIRECT_ALIGN as u64,
            )?;
        }
        bounce.as_mut_slice()[skip..skip + buf.len()].copy_from_slice(buf);
        self.pwrite_all(bounce.as_slice(), start)
    }

    /// Write `bufs` (`total` bytes) from `offset` on a buffered member:
    /// large aligned writes around the page cache where the host allows,
    /// the rest into it with their writeback started early when large.
    fn buffered_write(&self, bufs: &[&[u8]], offset: u64, total: usize) -> io::Result<()> {
        if let Some(done) = self
            .uncached
            .as_ref()
            .and_then(|u| u.write(bufs, offset, total))
        {
            return done;
        }
        pwritev_all(self.file.as_raw_fd(), bufs, offset)?;
        if total >= WRITE_BEHIND_MIN {
            self.write_behind.start(offset, total as u64);
        }
        Ok(())
    }

    /// Read into `buf` from `offset` on a buffered member: a large aligned
    /// range the host has nothing of cached around the cache, the rest
    /// through it (with the host's readahead).
    fn buffered_read(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        if let Some(u) = self
            .uncached
            .as_ref()
            .filter(|u| u.takes_read(buf.len(), offset))
        {
            if cached_pages(self.file.as_raw_fd(), offset, buf.len()) == Some(Cached::None) {
                if let Some(done) = u.read(buf, offset) {
                    return done;
                }
            }
        }
        self.pread_exact(buf, offset)
    }

    fn lock_blocks(
        &self,
        first: u64,
        last: u64,
        head_partial: bool,
        tail_partial: bool,
    ) -> Vec<parking_lot::MutexGuard<'_, ()>> {
        let mut stripes = Vec::with_capacity(2);
        if head_partial {
            stripes.push((first % RMW_LOCK_STRIPES as u64) as usize);
        }
        if tail_partial {
            stripes.push((last % RMW_LOCK_STRIPES as u64) as usize);
        }
        // A fixed order keeps two writers from each holding the other's stripe.
        stripes.sort_unstable();
        stripes.dedup();
        stripes.iter().map(|&s| self.rmw_locks[s].lock()).collect()
    }
}

impl AsRawFd for FileMember {
    fn as_raw_fd(&self) -> std::os::unix::io::RawFd {
        self.file.as_raw_fd()
    }
}

/// Buffered writes at least this large start their writeback at once;
/// smaller ones (random 4 KiB updates) are left to gather in the page cache.
const WRITE_BEHIND_MIN: usize = 128 << 10;

impl Member for FileMember {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.check_bounds(buf.len(), offset, "read")?;
        if buf.is_empty() {
            return Ok(());
        }
        let result = if self.direct {
            self.direct_read(buf, offset)
        } else {
            self.buffered_read(buf, offset)
        };
        result.map_err(|e| self.context("read", buf.len(), offset, e))
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.check_bounds(buf.len(), offset, "write")?;
        if buf.is_empty() {
            return Ok(());
        }
        let result = if self.direct {
            self.direct_write(buf, offset)
        } else {
            self.buffered_write(&[buf], offset, buf.len())
        };
        result.map_err(|e| self.context("write", buf.len(), offset, e))
    }

    fn write_vectored_at(&self, bufs: &[&[u8]], offset: u64) -> io::Result<()> {
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        if self.direct {
            // Direct I/O wants every buffer aligned.
            let mut at = offset;
            for buf in bufs {
                self.write_at(buf, at)?;
                at += buf.len() as u64;
            }
            return Ok(());
        }
        self.check_bounds(total, offset, "write")?;
        self.buffered_write(bufs, offset, total)
            .map_err(|e| self.context("write", total, offset, e))
    }

    fn sync(&self) -> io::Result<()> {
        loop {
            match self.file.sync_data() {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                result => return result.map_err(|e| with_path(&self.path, "fdatasync", e)),
            }
        }
    }

    fn len(&self) -> u64 {
        self.len.load(Ordering::Acquire)
    }

    fn refresh_len(&self) -> io::Result<u64> {
        let metadata = self
            .file
            .metadata()
            .map_err(|e| with_path(&self.path, "stat", e))?;
        let len = device_len(&self.path, &self.file, &metadata)?;
        check_direct_len(&self.path, len, self.direct)?;
        self.len.store(len, Ordering::Release);
        Ok(len)
    }

    fn name(&self) -> String {
        self.path.display().to_string()
    }

    fn cached_writes(&self) -> bool {
        !self.direct
    }

    fn host_free_bytes(&self) -> Option<u64> {
        if !self.is_file {
            return None;
        }
        let mut st = std::mem::MaybeUninit::<libc::statvfs>::uninit();
        // SAFETY: fstatvfs fills the struct through the pointer on success.
        let rc = unsafe { libc::fstatvfs(self.file.as_raw_fd(), st.as_mut_ptr()) };
        if rc != 0 {
            return None;
        }
        // SAFETY: rc == 0, so the kernel initialised it.
        Some(available_bytes(&unsafe { st.assume_init() }))
    }

    fn write_durable(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        if self.direct {
            self.write_at(buf, offset)?;
            return self.sync();
        }
        self.check_bounds(buf.len(), offset, "write")?;
        let mut done = 0;
        while done < buf.len() {
            let rest = &buf[done..];
            let iov = libc::iovec {
                iov_base: rest.as_ptr() as *mut libc::c_void,
                iov_len: rest.len(),
            };
            let at = libc::off_t::try_from(offset + done as u64)
                .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
            // SAFETY: iov describes `rest`, which lives for the call; the
            // kernel only reads from it.
            let n = unsafe { libc::pwritev2(self.file.as_raw_fd(), &iov, 1, at, libc::RWF_DSYNC) };
            match usize::try_from(n) {
                Ok(0) => return Err(io::Error::from(io::ErrorKind::WriteZero)),
                Ok(n) => done += n,
                Err(_) => {
                    let e = io::Error::last_os_error();
                    match e.raw_os_error() {
                        Some(libc::EINTR) => {}
                        // No RWF_DSYNC here: write, then sync the whole file.
                        Some(libc::EOPNOTSUPP) | Some(libc::EINVAL) => {
                            self.write_at(rest, offset + done as u64)?;
                            return self.sync();
                        }
                        _ => {
                            return Err(self.context(
                                "durable write",
                                rest.len(),
                                offset + done as u64,
                                e,
                            ))
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// `preadv2(RWF_NOWAIT)`: fails with EAGAIN, or reads short, rather than
    /// wait for the disk.
    fn read_cached(&self, buf: &mut [u8], offset: u64) -> io::Result<bool> {
        if self.direct || buf.is_empty() {
            return Ok(false);
        }
        self.check_bounds(buf.len(), offset, "read")?;
        if self
            .uncached
            .as_ref()
            .is_some_and(|u| u.takes_read(buf.len(), offset))
        {
            // A miss of `RWF_NOWAIT` starts the host's readahead, which a
            // read around the cache would then duplicate: ask first.
            match cached_pages(self.file.as_raw_fd(), offset, buf.len()) {
                Some(Cached::All) => {
                    self.pread_exact(buf, offset)?;
                    return Ok(true);
                }
                Some(_) => return Ok(false),
                None => {}
            }
        }
        let iov = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        let Ok(at) = libc::off_t::try_from(offset) else {
            return Ok(false);
        };
        // SAFETY: iov describes `buf`, which lives and is writable for the call.
        let n = unsafe { libc::preadv2(self.file.as_raw_fd(), &iov, 1, at, libc::RWF_NOWAIT) };
        // EAGAIN (not cached), EOPNOTSUPP (no RWF_NOWAIT here), a short read:
        // the caller reads the ordinary way.
        Ok(usize::try_from(n).is_ok_and(|n| n == buf.len()))
    }

    /// A preallocated image keeps its reservation (the user asked for it),
    /// so only sparse images and devices give space back.
    fn can_discard(&self) -> bool {
        !self.keep_allocated.load(Ordering::Acquire) && !self.no_discard.load(Ordering::Acquire)
    }

    /// `fallocate(PUNCH_HOLE | KEEP_SIZE)`: on an image file the host
    /// filesystem frees the blocks; on a block device the kernel issues a
    /// write-zeroes that may unmap (never a plain discard, whose contents
    /// afterwards are not promised, and never a fallback to writing zeros).
    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        self.check_bounds(
            usize::try_from(len).unwrap_or(usize::MAX),
            offset,
            "discard",
        )?;
        if !self.can_discard() {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!("{}: does not give space back", self.path.display()),
            ));
        }
        let Err(e) = self.fallocate(
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            offset,
            len,
        ) else {
            return Ok(());
        };
        match e.raw_os_error() {
            Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS) | Some(libc::EINVAL) => {
                self.no_discard.store(true, Ordering::Release);
                log::info!(
                    "{}: the host cannot punch holes here ({e}); freed space stays allocated",
                    self.path.display()
                );
                Err(io::Error::new(io::ErrorKind::Unsupported, e))
            }
            _ => Err(self.context("discard", len as usize, offset, e)),
        }
    }

    fn zero_range(&self, offset: u64, len: u64) -> io::Result<()> {
        self.check_bounds(len as usize, offset, "zero")?;
        // A preallocated image (`create --preallocate`) must keep its
        // reservation, so the punched range gets its blocks back (as zeros).
        let reserved = self.keep_allocated.load(Ordering::Acquire);
        let punch = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
        if self.fallocate(punch, offset, len).is_ok() {
            if reserved {
                if let Err(e) = self.fallocate(libc::FALLOC_FL_KEEP_SIZE, offset, len) {
                    log::warn!(
                        "{}: could not reserve {len} bytes at {offset} again after zeroing them: {e}",
                        self.path.display()
                    );
                }
            }
            return Ok(());
        }
        // Block devices and filesystems without hole punching: write zeros.
        let zeros = vec![0u8; (1usize << 20).min(len as usize)];
        let mut done = 0u64;
        while done < len {
            let n = (zeros.len() as u64).min(len - done) as usize;
            self.write_at(&zeros[..n], offset + done)?;
            done += n as u64;
        }
        Ok(())
    }
}

/// A heap buffer whose start is aligned to [`DIRECT_ALIGN`] (over-allocate and
/// skip to the first aligned byte: no unsafe allocation needed).
struct AlignedBuf {
    storage: Vec<u8>,
    start: usize,
    len: usize,
}

impl AlignedBuf {
    fn new(len: usize) -> AlignedBuf {
        let storage = vec![0u8; len + DIRECT_ALIGN];
        let start = storage.as_ptr().align_offset(DIRECT_ALIGN);
        AlignedBuf {
            storage,
            start,
            len,
        }
    }

    fn as_slice(&self) -> &[u8] {
        &self.storage[self.start..self.start + self.len]
    }

    fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.storage[self.start..self.start + self.len]
    }
}

fn is_aligned(ptr: *const u8, len: usize, offset: u64) -> bool {
    let align = DIRECT_ALIGN as u64;
    (ptr as usize).is_multiple_of(DIRECT_ALIGN)
        && len.is_multiple_of(DIRECT_ALIGN)
        && offset.is_multiple_of(align)
}

/// Bytes an unprivileged writer may still use on a filesystem, from its
/// `statvfs`: available blocks times the fragment size.
pub fn available_bytes(st: &libc::statvfs) -> u64 {
    #[allow(clippy::unnecessary_cast)] // the field types differ by architecture
    (st.f_bavail as u64).saturating_mul(st.f_frsize as u64)
}

/// The smallest aligned byte range `[start, end)` covering `len` bytes at `offset`.
fn aligned_span(offset: u64, len: usize) -> (u64, u64) {
    let align = DIRECT_ALIGN as u64;
    let start = offset / align * align;
    let end = (offset + len as u64).div_ceil(align) * align;
    (start, end)
}

pub(crate) fn with_path(path: &Path, what: &str, e: io::Error) -> io::Error {
    let message = format!("{}: {what}: {e}", path.display());
    io::Error::new(e.kind(), WithPath { message, source: e })
}

/// An error with the path and operation in its message that keeps the OS
/// error underneath, so callers can still tell EPERM from EACCES.
#[derive(Debug)]
struct WithPath {
    message: String,
    source: io::Error,
}

impl std::fmt::Display for WithPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for WithPath {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

/// The OS error number behind `e`, also when a message was wrapped around it.
pub fn os_error_code(e: &io::Error) -> Option<i32> {
    e.raw_os_error().or_else(|| {
        let inner = e.get_ref()?.downcast_ref::<WithPath>()?;
        os_error_code(&inner.source)
    })
}

fn open_error(path: &Path, options: &OpenOptions, e: io::Error) -> io::Error {
    let shown = path.display();
    match e.raw_os_error() {
        Some(libc::ELOOP) => io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{shown}: is a symbolic link; refusing to follow it (give the real path)"),
        ),
        Some(libc::EINVAL) if options.direct => io::Error::new(
            io::ErrorKind::Unsupported,
            format!("{shown}: direct I/O (O_DIRECT) is not supported here: {e}"),
        ),
        _ => with_path(path, "open", e),
    }
}

/// A wait longer than this is announced on the terminal, once.
const LOCK_WAIT_NOTICE: Duration = Duration::from_secs(1);
/// How often a waiting open retries the lock.
const LOCK_RETRY: Duration = Duration::from_millis(20);

/// Take the exclusive `flock`, retrying until `wait` has passed. Polling
/// `LOCK_NB` rather than a blocking `flock` keeps the wait bounded without
/// a signal to interrupt it.
fn lock_exclusive(path: &Path, file: &File, wait: Duration) -> io::Result<()> {
    let start = Instant::now();
    let mut told = false;
    loop {
        // SAFETY: flock on a descriptor we own; no memory is involved.
        let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if rc == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EWOULDBLOCK) => {
                let waited = start.elapsed();
                if waited >= wait {
                    let after = if wait.is_zero() {
                        String::new()
                    } else {
                        format!(" (waited {} s for it to be released)", wait.as_secs())
                    };
                    return Err(io::Error::new(
                        io::ErrorKind::WouldBlock,
                        format!(
                            "member {} is in use by another raidfs process{after}",
                            path.display()
                        ),
                    ));
                }
                if !told && waited >= LOCK_WAIT_NOTICE {
                    told = true;
                    crate::notice::progress(&format!(
                        "waiting for the previous raidfs process to release {}...",
                        path.display()
                    ));
                }
                std::thread::sleep(LOCK_RETRY.min(wait - waited));
            }
            _ => return Err(with_path(path, "lock", e)),
        }
    }
}

/// `BLKGETSIZE64` = `_IOR(0x12, 114, u64)`; the direction bits differ by architecture.
#[cfg(any(
    target_arch = "mips",
    target_arch = "mips64",
    target_arch = "powerpc",
    target_arch = "powerpc64",
    target_arch = "sparc64"
))]
const BLKGETSIZE64: u64 = 0x4008_1272;
#[cfg(not(any(
    target_arch = "mips",
    target_arch = "mips64",
    target_arch = "powerpc",
    target_arch = "powerpc64",
    target_arch = "sparc64"
)))]
const BLKGETSIZE64: u64 = 0x8008_1272;

/// The size of an open image file or block device.
fn device_len(path: &Path, file: &File, metadata: &std::fs::Metadata) -> io::Result<u64> {
    let file_type = metadata.file_type();
    if file_type.is_file() {
        Ok(metadata.len())
    } else if file_type.is_block_device() {
        block_device_size(path, file)
    } else {
        Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{}: not a regular file or block device", path.display()),
        ))
    }
}

/// Direct I/O moves whole 4 KiB blocks, so a member opened with it must be
/// a whole number of them long.
fn check_direct_len(path: &Path, len: u64, direct: bool) -> io::Result<()> {
    if direct && !len.is_multiple_of(DIRECT_ALIGN as u64) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{}: size {len} is not a multiple of {DIRECT_ALIGN}, which direct I/O needs",
                path.display()
            ),
        ));
    }
    Ok(())
}

fn block_device_size(path: &Path, file: &File) -> io::Result<u64> {
    let mut size: u64 = 0;
    // SAFETY: BLKGETSIZE64 writes one u64 through the pointer, which points at `size`.
    let rc = unsafe { libc::ioctl(file.as_raw_fd(), BLKGETSIZE64 as _, &mut size as *mut u64) };
    if rc != 0 {
        return Err(with_path(
            path,
            "get block device size (BLKGETSIZE64)",
            io::Error::last_os_error(),
        ));
    }
    Ok(size)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_span_covers_the_request() {
        assert_eq!(aligned_span(0, 4096), (0, 4096));
        assert_eq!(aligned_span(1, 1), (0, 4096));
        assert_eq!(aligned_span(4095, 2), (0, 8192));
        assert_eq!(aligned_span(8192, 0), (8192, 8192));
    }

    #[test]
    fn aligned_buf_is_aligned() {
        for len in [1, 4096, 10000] {
            let mut b = AlignedBuf::new(len);
            assert_eq!(b.as_mut_slice().as_ptr() as usize % DIRECT_ALIGN, 0);
            assert_eq!(b.as_slice().len(), len);
        }
    }
}
