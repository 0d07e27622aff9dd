//! Members on other hosts: an export of an NBD server (nbdkit, qemu-nbd,
//! nbd-server) as a [`Member`].
//!
//! [`NbdMember`] owns one connection at a time ([`conn`]), reached by
//! [`connect`] and negotiated by [`handshake`] from a URI ([`uri`]). It
//! turns the member interface into NBD requests honouring the export's
//! block-size constraints: transfers are split at the maximum payload and
//! sent together, several requests in flight ([`transfer`]), and unaligned
//! edges go through a read-modify-write when the server states a minimum
//! block size. `sync` is `NBD_CMD_FLUSH`,
//! `write_durable` a write with FUA, `zero_range` and `discard`
//! `NBD_CMD_WRITE_ZEROES` (which lets the server punch holes while
//! promising zeros, which `NBD_CMD_TRIM` does not); each only where the
//! server advertises it.
//!
//! When the server closes or resets the connection (a restart, a network
//! drop), the member reconnects with backoff and repeats the operation,
//! but only if nothing the server acknowledged can have been lost with it:
//! every acknowledged write has been flushed since (or the server has no
//! flush, so it never promised more). A timeout or a protocol error is not
//! retried, and once reconnecting fails the member stays failed.
//!
//! There is no lock: NBD has none, so what keeps two arrays off one export
//! is the array uuid in the superblock and its event counts
//! (docs/remote.md).

mod conn;
mod connect;
mod handshake;
pub mod proto;
mod transfer;
pub mod uri;

use super::file::with_path;
use super::Member;
use conn::{Conn, Failure};
use connect::establish;
pub use handshake::Export;
use parking_lot::{Mutex, RwLock};
use proto::*;
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use transfer::{aligned, ranged, read_aligned, widen, write_aligned, Failed, Outcome};
pub use uri::{is_uri, Endpoint, NbdUri};

/// How long connecting and the handshake may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a request may wait for its reply before the connection is
/// given up (and the member fails).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// The request timeout of a member that fails fast (`-o failfast=`).
pub const FAILFAST_TIMEOUT: Duration = Duration::from_secs(5);
/// The waits before each reconnection attempt after a lost connection
/// (3.1 s in all, plus each attempt's connect; all of it within the
/// request timeout).
pub const RECONNECT_BACKOFF: [Duration; 5] = [
    Duration::from_millis(100),
    Duration::from_millis(200),
    Duration::from_millis(400),
    Duration::from_millis(800),
    Duration::from_millis(1600),
];

/// Stripes of the lock that serialises read-modify-write of partial blocks.
const RMW_LOCK_STRIPES: usize = 64;

/// How to open an NBD member.
#[derive(Clone, Debug)]
pub struct NbdOptions {
    /// Only read: a read-only export is then fine.
    pub read_only: bool,
    pub connect_timeout: Duration,
    pub request_timeout: Duration,
}

impl Default for NbdOptions {
    fn default() -> NbdOptions {
        NbdOptions {
            read_only: false,
            connect_timeout: CONNECT_TIMEOUT,
            request_timeout: REQUEST_TIMEOUT,
        }
    }
}
/// An NBD export as a member.
pub struct NbdMember {
    uri: NbdUri,
    options: NbdOptions,
    /// The current connection; replaced by a reconnection.
    conn: RwLock<Arc<Conn>>,
    /// Held while reconnecting, so one caller does it for all.
    recovering: Mutex<()>,
    /// Set when reconnecting was refused or failed: why. The member then
    /// stays failed.
    given_up: Mutex<Option<String>>,
    /// Writes (and zeroes, trims) the server acknowledged, counted after
    /// their reply...
    acked_writes: AtomicU64,
    /// ...and how many of them a successful flush covered.
    flushed_writes: AtomicU64,
    reconnects: AtomicU64,
    /// Fail fast: the short request timeout, and no reconnection.
    failfast: AtomicBool,
    rmw_locks: Vec<Mutex<()>>,
}

impl NbdMember {
    /// Connect to the export a URI names.
    pub fn connect(text: &str, options: &NbdOptions) -> io::Result<NbdMember> {
        let uri =
            NbdUri::parse(text).map_err(|why| io::Error::new(io::ErrorKind::InvalidInput, why))?;
        NbdMember::open(uri, options)
    }

    pub fn open(uri: NbdUri, options: &NbdOptions) -> io::Result<NbdMember> {
        let conn = establish(&uri, options)?;
        let member = NbdMember {
            uri,
            options: options.clone(),
            conn: RwLock::new(Arc::new(conn)),
            recovering: Mutex::new(()),
            given_up: Mutex::new(None),
            acked_writes: AtomicU64::new(0),
            flushed_writes: AtomicU64::new(0),
            reconnects: AtomicU64::new(0),
            failfast: AtomicBool::new(false),
            rmw_locks: (0..RMW_LOCK_STRIPES).map(|_| Mutex::new(())).collect(),
        };
        log::info!("{}: {}", member.uri, member.describe());
        if !member.export().has(FLAG_SEND_FLUSH) && !options.read_only {
            log::warn!(
                "{}: the server does not take NBD_CMD_FLUSH, so a sync cannot make writes durable there; they are as durable as the server makes them",
                member.uri
            );
        }
        Ok(member)
    }

    /// What was negotiated (on the current connection).
    pub fn export(&self) -> Export {
        self.conn().export().clone()
    }

    /// The negotiated features in words, for the log.
    pub fn describe(&self) -> String {
        let e = self.export();
        let yes = |flag| if e.has(flag) { "yes" } else { "no" };
        format!(
            "{} bytes via {}, structured replies {}, block sizes {}/{}/{} (min/preferred/max payload), flush {}, fua {}, trim {}, write zeroes {}, read-only {}",
            e.size,
            if e.go { "NBD_OPT_GO" } else { "NBD_OPT_EXPORT_NAME" },
            if e.structured { "yes" } else { "no" },
            e.min_block,
            e.pref_block,
            e.max_payload,
            yes(FLAG_SEND_FLUSH),
            yes(FLAG_SEND_FUA),
            yes(FLAG_SEND_TRIM),
            yes(FLAG_SEND_WRITE_ZEROES),
            yes(FLAG_READ_ONLY),
        )
    }

    /// Why the member is unusable, if it is (its connection broke and was
    /// not re-established).
    pub fn broken(&self) -> Option<String> {
        self.given_up
            .lock()
            .clone()
            .or_else(|| self.conn().broken())
    }

    /// How many times the connection was re-established.
    pub fn reconnects(&self) -> u64 {
        self.reconnects.load(Ordering::Acquire)
    }

    /// `NBD_CMD_TRIM`: the server may forget `[offset, offset + len)`
    /// (what it then reads as is unspecified). Unsupported when not
    /// advertised. Aligned inward to the minimum block size.
    pub fn trim(&self, offset: u64, len: u64) -> io::Result<()> {
        if !self.export().has(FLAG_SEND_TRIM) {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!("{}: the server does not take NBD_CMD_TRIM", self.uri),
            ));
        }
        self.check_writable()?;
        self.check_range(offset, len, "trim")?;
        self.run(|conn| {
            let min = u64::from(conn.export().min_block);
            let start = offset.div_ceil(min) * min;
            let end = (offset + len) / min * min;
            if start >= end {
                return Ok(());
            }
            ranged(conn, CMD_TRIM, 0, start, end - start, "trim")
        })?;
        self.acked_writes.fetch_add(1, Ordering::AcqRel);
        Ok(())
    }

    fn conn(&self) -> Arc<Conn> {
        Arc::clone(&self.conn.read())
    }

    fn error(&self, failed: Failed) -> io::Error {
        with_path(
            Path::new(&self.uri.text),
            &format!("{}: {}", failed.what, failed.failure.message),
            io::Error::from_raw_os_error(failed.failure.errno),
        )
    }

    /// Run an operation on the current connection; when the connection
    /// was lost, reconnect if that is safe and run it once more.
    fn run<T>(&self, mut op: impl FnMut(&Conn) -> Outcome<T>) -> io::Result<T> {
        let conn = self.conn();
        match op(&conn) {
            Ok(done) => Ok(done),
            Err(failed) if failed.failure.lost => match self.recover(&conn, &failed.failure) {
                Ok(new) => op(&new).map_err(|f| self.error(f)),
                Err(why) => Err(self.error(Failed {
                    what: failed.what,
                    failure: Failure {
                        message: why,
                        ..failed.failure
                    },
                })),
            },
            Err(failed) => Err(self.error(failed)),
        }
    }

    /// Whether the server acknowledged writes that no flush has covered.
    fn unflushed(&self) -> bool {
        self.acked_writes.load(Ordering::Acquire) > self.flushed_writes.load(Ordering::Acquire)
    }

    /// Replace the lost connection `old` (unless another caller already
    /// did): the new one, or why there is none.
    fn recover(&self, old: &Arc<Conn>, failure: &Failure) -> Result<Arc<Conn>, String> {
        let _one = self.recovering.lock();
        let current = self.conn();
        if !Arc::ptr_eq(&current, old) {
            return Ok(current);
        }
        if let Some(why) = self.given_up.lock().clone() {
            return Err(why);
        }
        let give_up = |why: String| {
            log::error!("{}: {why}", self.uri);
            *self.given_up.lock() = Some(why.clone());
            Err(why)
        };
        if self.failfast.load(Ordering::Acquire) {
            return give_up(format!("{}; not reconnecting (failfast)", failure.message));
        }
        if self.unflushed() {
            return give_up(format!(
                "{}; not reconnecting: writes the server acknowledged since the last flush may have been lost with it",
                failure.message
            ));
        }
        // The attempts together take no longer than one request may wait.
        let deadline = Instant::now() + self.options.request_timeout;
        let mut last = String::from("no time left to try");
        let mut attempts = 0;
        for (attempt, delay) in RECONNECT_BACKOFF.iter().enumerate() {
            if Instant::now() + *delay >= deadline {
                break;
            }
            std::thread::sleep(*delay);
            attempts += 1;
            let options = NbdOptions {
                connect_timeout: self
                    .options
                    .connect_timeout
                    .min(deadline.saturating_duration_since(Instant::now())),
                ..self.options.clone()
            };
            match establish(&self.uri, &options).and_then(|c| self.same_export(c)) {
                Ok(conn) => {
                    let conn = Arc::new(conn);
                    *self.conn.write() = Arc::clone(&conn);
                    self.reconnects.fetch_add(1, Ordering::AcqRel);
                    log::warn!(
                        "{}: reconnected (attempt {}) after: {}",
                        self.uri,
                        attempt + 1,
                        failure.message
                    );
                    return Ok(conn);
                }
                Err(e) => last = e.to_string(),
            }
        }
        give_up(format!(
            "{}; reconnecting failed {attempts} times, last: {last}",
            failure.message
        ))
    }

    /// A new connection must reach the same export: same size.
    fn same_export(&self, conn: Conn) -> io::Result<Conn> {
        let (was, now) = (self.conn().export().size, conn.export().size);
        if was != now {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("the export is now {now} bytes, was {was}"),
            ));
        }
        Ok(conn)
    }

    fn check_range(&self, offset: u64, len: u64, what: &str) -> io::Result<()> {
        let size = self.len();
        if offset.checked_add(len).is_none_or(|end| end > size) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{}: {what} of {len} bytes at {offset} is past the end of the export ({size} bytes)",
                    self.uri
                ),
            ));
        }
        Ok(())
    }

    fn check_writable(&self) -> io::Result<()> {
        if self.options.read_only {
            return Err(with_path(
                Path::new(&self.uri.text),
                "write",
                io::Error::from_raw_os_error(libc::EROFS),
            ));
        }
        Ok(())
    }

    /// A write (possibly FUA) with a read-modify-write of unaligned edges.
    fn write_with(&self, buf: &[u8], offset: u64, flags: u16) -> io::Result<()> {
        self.check_writable()?;
        self.check_range(offset, buf.len() as u64, "write")?;
        if buf.is_empty() {
            return Ok(());
        }
        self.run(|conn| {
            if aligned(conn, offset, buf.len() as u64) {
                write_aligned(conn, &[buf], offset, flags)
            } else {
                self.write_unaligned(conn, buf, offset, flags)
            }
        })?;
        if flags & CMD_FLAG_FUA == 0 {
            self.acked_writes.fetch_add(1, Ordering::AcqRel);
        }
        Ok(())
    }

    /// Write with a read-modify-write of the partial blocks at the edges.
    fn write_unaligned(&self, conn: &Conn, buf: &[u8], offset: u64, flags: u16) -> Outcome<()> {
        let min = u64::from(conn.export().min_block);
        let (start, end) = widen(conn, offset, buf.len() as u64);
        let first = (start / min) as usize % RMW_LOCK_STRIPES;
        let last = ((end - 1) / min) as usize % RMW_LOCK_STRIPES;
        let (a, b) = (first.min(last), first.max(last));
        let _first = self.rmw_locks[a].lock();
        let _last = (a != b).then(|| self.rmw_locks[b].lock());
        let mut whole = vec![0u8; (end - start) as usize];
        let head = (offset - start) as usize;
        if head != 0 {
            read_aligned(conn, &mut whole[..min as usize], start)?;
        }
        let tail_at = end - min;
        if !(offset + buf.len() as u64).is_multiple_of(min) && (head == 0 || tail_at != start) {
            let tail = (tail_at - start) as usize;
            read_aligned(conn, &mut whole[tail..], tail_at)?;
        }
        whole[head..head + buf.len()].copy_from_slice(buf);
        write_aligned(conn, &[&whole], start, flags)
    }

    /// Zeros over a range: `NBD_CMD_WRITE_ZEROES` on the aligned middle
    /// (without NO_HOLE, so the server may deallocate), written zeros on
    /// unaligned edges.
    fn write_zeroes(&self, conn: &Conn, offset: u64, len: u64) -> Outcome<()> {
        let min = u64::from(conn.export().min_block);
        let start = offset.div_ceil(min) * min;
        let end = (offset + len) / min * min;
        let zeros = |conn: &Conn, at: u64, n: u64| {
            let buf = vec![0u8; n as usize];
            if aligned(conn, at, n) {
                write_aligned(conn, &[&buf], at, 0)
            } else {
                self.write_unaligned(conn, &buf, at, 0)
            }
        };
        if start >= end {
            return zeros(conn, offset, len);
        }
        if start > offset {
            zeros(conn, offset, start - offset)?;
        }
        ranged(
            conn,
            CMD_WRITE_ZEROES,
            0,
            start,
            end - start,
            "write zeroes",
        )?;
        if offset + len > end {
            zeros(conn, end, offset + len - end)?;
        }
        Ok(())
    }
}

impl Member for NbdMember {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.check_range(offset, buf.len() as u64, "read")?;
        if buf.is_empty() {
            return Ok(());
        }
        let len = buf.len() as u64;
        self.run(|conn| {
            if aligned(conn, offset, len) {
                return read_aligned(conn, buf, offset);
            }
            let (start, end) = widen(conn, offset, len);
            let mut whole = vec![0u8; (end - start) as usize];
            read_aligned(conn, &mut whole, start)?;
            let head = (offset - start) as usize;
            buf.copy_from_slice(&whole[head..head + buf.len()]);
            Ok(())
        })
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.write_with(buf, offset, 0)
    }

    fn write_vectored_at(&self, bufs: &[&[u8]], offset: u64) -> io::Result<()> {
        let total: u64 = bufs.iter().map(|b| b.len() as u64).sum();
        self.check_writable()?;
        self.check_range(offset, total, "write")?;
        let min = u64::from(self.export().min_block);
        if !(bufs.iter().all(|b| (b.len() as u64).is_multiple_of(min))
            && offset.is_multiple_of(min))
        {
            let mut at = offset;
            for buf in bufs {
                self.write_at(buf, at)?;
                at += buf.len() as u64;
            }
            return Ok(());
        }
        self.run(|conn| write_aligned(conn, bufs, offset, 0))?;
        self.acked_writes.fetch_add(1, Ordering::AcqRel);
        Ok(())
    }

    fn sync(&self) -> io::Result<()> {
        if self.options.read_only || !self.export().has(FLAG_SEND_FLUSH) {
            // Told at open: the server offers nothing to flush with.
            return Ok(());
        }
        // Writes counted by now were acknowledged before the flush is sent.
        let covered = self.acked_writes.load(Ordering::Acquire);
        self.run(|conn| {
            conn.call(CMD_FLUSH, 0, 0, 0, None)
                .map(|_| ())
                .map_err(|failure| Failed {
                    what: "flush".into(),
                    failure,
                })
        })?;
        self.flushed_writes.fetch_max(covered, Ordering::AcqRel);
        Ok(())
    }

    fn write_durable(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        if self.export().has(FLAG_SEND_FUA) {
            self.write_with(buf, offset, CMD_FLAG_FUA)
        } else {
            self.write_at(buf, offset)?;
            self.sync()
        }
    }

    fn len(&self) -> u64 {
        self.conn().export().size
    }

    fn name(&self) -> String {
        self.uri.text.clone()
    }

    fn zero_range(&self, offset: u64, len: u64) -> io::Result<()> {
        self.check_writable()?;
        self.check_range(offset, len, "zero")?;
        if len == 0 {
            return Ok(());
        }
        if self.export().has(FLAG_SEND_WRITE_ZEROES) {
            self.run(|conn| self.write_zeroes(conn, offset, len))?;
            self.acked_writes.fetch_add(1, Ordering::AcqRel);
            return Ok(());
        }
        super::write_zeros(self, offset, len)
    }

    fn can_discard(&self) -> bool {
        !self.options.read_only && self.export().has(FLAG_SEND_WRITE_ZEROES)
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        if !self.can_discard() {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!(
                    "{} cannot give space back (no NBD_CMD_WRITE_ZEROES)",
                    self.uri
                ),
            ));
        }
        self.check_range(offset, len, "discard")?;
        self.run(|conn| self.write_zeroes(conn, offset, len))?;
        self.acked_writes.fetch_add(1, Ordering::AcqRel);
        Ok(())
    }

    fn rotational(&self) -> Option<bool> {
        Some(self.export().has(FLAG_ROTATIONAL))
    }

    fn failfast(&self) -> bool {
        self.failfast.load(Ordering::Acquire)
    }

    fn set_failfast(&self, on: bool) -> bool {
        self.failfast.store(on, Ordering::Release);
        let timeout = if on {
            FAILFAST_TIMEOUT.min(self.options.request_timeout)
        } else {
            self.options.request_timeout
        };
        self.conn().set_timeout(timeout);
        true
    }
}
