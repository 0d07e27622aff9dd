//! Members on other hosts: an export of an NBD server (nbdkit, qemu-nbd,
//! nbd-server) as a [`Member`].
//!
//! [`NbdMember`] owns one connection ([`conn`]) negotiated by
//! [`handshake`] from a URI ([`uri`]). It turns the member interface into
//! NBD requests honouring the export's block-size constraints: transfers
//! are split at the maximum payload and sent together (several requests in
//! flight), and unaligned edges go through a read-modify-write when the
//! server states a minimum block size. `sync` is `NBD_CMD_FLUSH`,
//! `write_durable` a write with FUA, `zero_range` and `discard`
//! `NBD_CMD_WRITE_ZEROES` (which lets the server punch holes while
//! promising zeros, which `NBD_CMD_TRIM` does not); each only where the
//! server advertises it. There is no lock: NBD has none, so what keeps two
//! arrays off one export is the array uuid in the superblock and its event
//! counts (docs/remote.md).

mod conn;
mod handshake;
pub mod proto;
pub mod uri;

use super::file::with_path;
use super::Member;
use conn::{Conn, Failure, Stream, Ticket};
pub use handshake::Export;
use parking_lot::Mutex;
use proto::*;
use std::io;
use std::net::{TcpStream, ToSocketAddrs};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;
pub use uri::{is_uri, Endpoint, NbdUri};

/// How long connecting and the handshake may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a request may wait for its reply before the connection is
/// given up (and the member fails).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Requests one call keeps in flight at once (a large transfer split at
/// the server's maximum payload).
const WINDOW: usize = 16;
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
    conn: Conn,
    read_only: bool,
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
        let text = uri.text.clone();
        let label = Path::new(&text);
        let context = |what: &str, e: io::Error| with_path(label, what, e);
        let mut stream =
            connect(&uri.endpoint, options.connect_timeout).map_err(|e| context("connect", e))?;
        stream
            .set_timeouts(Some(options.connect_timeout), Some(options.connect_timeout))
            .map_err(|e| context("connect", e))?;
        let export = handshake::negotiate(&mut stream, &uri.export).map_err(|e| {
            let e = match e.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "no handshake within {} s (connect timeout)",
                        options.connect_timeout.as_secs_f64()
                    ),
                ),
                _ => e,
            };
            context("NBD handshake", e)
        })?;
        let conn = Conn::start(stream, export, options.request_timeout)
            .map_err(|e| context("start", e))?;
        let member = NbdMember {
            uri,
            conn,
            read_only: options.read_only,
            rmw_locks: (0..RMW_LOCK_STRIPES).map(|_| Mutex::new(())).collect(),
        };
        let export = member.conn.export();
        if !options.read_only && export.has(FLAG_READ_ONLY) {
            return Err(with_path(
                label,
                "the server exports it read-only, and a member of a writable array must take writes (serve it writable, or mount -o ro)",
                io::Error::from_raw_os_error(libc::EROFS),
            ));
        }
        log::info!("{}: {}", member.uri, member.describe());
        if !export.has(FLAG_SEND_FLUSH) && !options.read_only {
            log::warn!(
                "{}: the server does not take NBD_CMD_FLUSH, so a sync cannot make writes durable there; they are as durable as the server makes them",
                member.uri
            );
        }
        Ok(member)
    }

    /// What was negotiated.
    pub fn export(&self) -> &Export {
        self.conn.export()
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

    /// Why the connection is unusable, if it is.
    pub fn broken(&self) -> Option<String> {
        self.conn.broken()
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
        self.check_range(offset, len, "trim")?;
        let min = u64::from(self.export().min_block);
        let start = offset.div_ceil(min) * min;
        let end = (offset + len) / min * min;
        if start >= end {
            return Ok(());
        }
        self.ranged(CMD_TRIM, 0, start, end - start, "trim")
    }

    fn error(&self, what: &str, failure: Failure) -> io::Error {
        with_path(
            Path::new(&self.uri.text),
            &format!("{what}: {}", failure.message),
            io::Error::from_raw_os_error(failure.errno),
        )
    }

    fn check_range(&self, offset: u64, len: u64, what: &str) -> io::Result<()> {
        if offset
            .checked_add(len)
            .is_none_or(|end| end > self.export().size)
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{}: {what} of {len} bytes at {offset} is past the end of the export ({} bytes)",
                    self.uri,
                    self.export().size
                ),
            ));
        }
        Ok(())
    }

    fn check_writable(&self) -> io::Result<()> {
        if self.read_only {
            return Err(with_path(
                Path::new(&self.uri.text),
                "write",
                io::Error::from_raw_os_error(libc::EROFS),
            ));
        }
        Ok(())
    }

    /// Wait for a window of tickets; the first failure wins, but every
    /// ticket is waited for so nothing of this call is still in flight.
    fn wait_all(
        &self,
        tickets: Vec<(Ticket, u64)>,
        what: &str,
        out: Option<(&mut [u8], u64)>,
    ) -> io::Result<()> {
        let mut first = None;
        let mut out = out;
        for (ticket, at) in tickets {
            match self.conn.wait(ticket) {
                Ok(data) => {
                    if let Some((buf, base)) = out.as_mut() {
                        let start = (at - *base) as usize;
                        buf[start..start + data.len()].copy_from_slice(&data);
                    }
                }
                Err(f) => {
                    if first.is_none() {
                        first = Some(self.error(&format!("{what} at {at}"), f));
                    }
                }
            }
        }
        first.map_or(Ok(()), Err)
    }

    fn submit(
        &self,
        command: u16,
        flags: u16,
        at: u64,
        len: u32,
        payload: Option<&[u8]>,
        what: &str,
    ) -> io::Result<Ticket> {
        self.conn
            .submit(command, flags, at, len, payload)
            .map_err(|f| self.error(&format!("{what} at {at}"), f))
    }

    /// Read an aligned range, split at the maximum payload.
    fn read_aligned(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let max = self.export().max_payload as usize;
        let mut done = 0;
        while done < buf.len() {
            let mut tickets = Vec::with_capacity(WINDOW);
            let window_start = done;
            while done < buf.len() && tickets.len() < WINDOW {
                let n = max.min(buf.len() - done);
                let at = offset + done as u64;
                tickets.push((self.submit(CMD_READ, 0, at, n as u32, None, "read")?, at));
                done += n;
            }
            let window = &mut buf[window_start..done];
            self.wait_all(
                tickets,
                "read",
                Some((window, offset + window_start as u64)),
            )?;
        }
        Ok(())
    }

    /// Write aligned buffers one after another from `offset`, split at the
    /// maximum payload, up to a window of requests in flight.
    fn write_aligned(&self, bufs: &[&[u8]], offset: u64, flags: u16) -> io::Result<()> {
        let max = self.export().max_payload as usize;
        let mut tickets = Vec::with_capacity(WINDOW);
        let mut at = offset;
        for buf in bufs {
            for piece in buf.chunks(max) {
                if tickets.len() == WINDOW {
                    self.wait_all(std::mem::take(&mut tickets), "write", None)?;
                }
                tickets.push((
                    self.submit(
                        CMD_WRITE,
                        flags,
                        at,
                        piece.len() as u32,
                        Some(piece),
                        "write",
                    )?,
                    at,
                ));
                at += piece.len() as u64;
            }
        }
        self.wait_all(tickets, "write", None)
    }

    /// A payload-free command over a range (trim, write zeroes), split at
    /// the maximum payload like the rest.
    fn ranged(
        &self,
        command: u16,
        flags: u16,
        offset: u64,
        len: u64,
        what: &str,
    ) -> io::Result<()> {
        let max = u64::from(self.export().max_payload);
        let mut tickets = Vec::with_capacity(WINDOW);
        let mut at = offset;
        while at < offset + len {
            let n = max.min(offset + len - at);
            if tickets.len() == WINDOW {
                self.wait_all(std::mem::take(&mut tickets), what, None)?;
            }
            tickets.push((self.submit(command, flags, at, n as u32, None, what)?, at));
            at += n;
        }
        self.wait_all(tickets, what, None)
    }

    fn aligned(&self, offset: u64, len: u64) -> bool {
        let min = u64::from(self.export().min_block);
        offset.is_multiple_of(min) && len.is_multiple_of(min)
    }

    /// The minimum-block-aligned range around `[offset, offset + len)`.
    fn widen(&self, offset: u64, len: u64) -> (u64, u64) {
        let min = u64::from(self.export().min_block);
        let start = offset / min * min;
        let end = (offset + len).div_ceil(min) * min;
        (start, end.min(self.export().size.div_ceil(min) * min))
    }

    /// Write with a read-modify-write of the partial blocks at the edges.
    fn write_unaligned(&self, buf: &[u8], offset: u64, flags: u16) -> io::Result<()> {
        let min = u64::from(self.export().min_block);
        let (start, end) = self.widen(offset, buf.len() as u64);
        let first = (start / min) as usize % RMW_LOCK_STRIPES;
        let last = ((end - 1) / min) as usize % RMW_LOCK_STRIPES;
        let (a, b) = (first.min(last), first.max(last));
        let _first = self.rmw_locks[a].lock();
        let _last = (a != b).then(|| self.rmw_locks[b].lock());
        let mut whole = vec![0u8; (end - start) as usize];
        let head = (offset - start) as usize;
        if head != 0 {
            self.read_aligned(&mut whole[..min as usize], start)?;
        }
        let tail_at = end - min;
        if !(offset + buf.len() as u64).is_multiple_of(min) && (head == 0 || tail_at != start) {
            let tail = (tail_at - start) as usize;
            self.read_aligned(&mut whole[tail..], tail_at)?;
        }
        whole[head..head + buf.len()].copy_from_slice(buf);
        self.write_aligned(&[&whole], start, flags)
    }

    fn write_with(&self, buf: &[u8], offset: u64, flags: u16) -> io::Result<()> {
        self.check_writable()?;
        self.check_range(offset, buf.len() as u64, "write")?;
        if buf.is_empty() {
            return Ok(());
        }
        if self.aligned(offset, buf.len() as u64) {
            self.write_aligned(&[buf], offset, flags)
        } else {
            self.write_unaligned(buf, offset, flags)
        }
    }

    /// Zeros over a range: `NBD_CMD_WRITE_ZEROES` on the aligned middle
    /// (without NO_HOLE, so the server may deallocate), written zeros on
    /// unaligned edges.
    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        let min = u64::from(self.export().min_block);
        let start = offset.div_ceil(min) * min;
        let end = (offset + len) / min * min;
        if start >= end {
            return self.write_at(&vec![0u8; len as usize], offset);
        }
        if start > offset {
            self.write_at(&vec![0u8; (start - offset) as usize], offset)?;
        }
        self.ranged(CMD_WRITE_ZEROES, 0, start, end - start, "write zeroes")?;
        if offset + len > end {
            self.write_at(&vec![0u8; (offset + len - end) as usize], end)?;
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
        if self.aligned(offset, buf.len() as u64) {
            return self.read_aligned(buf, offset);
        }
        let (start, end) = self.widen(offset, buf.len() as u64);
        let mut whole = vec![0u8; (end - start) as usize];
        self.read_aligned(&mut whole, start)?;
        let head = (offset - start) as usize;
        buf.copy_from_slice(&whole[head..head + buf.len()]);
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.write_with(buf, offset, 0)
    }

    fn write_vectored_at(&self, bufs: &[&[u8]], offset: u64) -> io::Result<()> {
        let total: u64 = bufs.iter().map(|b| b.len() as u64).sum();
        self.check_writable()?;
        self.check_range(offset, total, "write")?;
        let min = u64::from(self.export().min_block);
        if bufs.iter().all(|b| (b.len() as u64).is_multiple_of(min)) && offset.is_multiple_of(min) {
            return self.write_aligned(bufs, offset, 0);
        }
        let mut at = offset;
        for buf in bufs {
            self.write_at(buf, at)?;
            at += buf.len() as u64;
        }
        Ok(())
    }

    fn sync(&self) -> io::Result<()> {
        if self.read_only || !self.export().has(FLAG_SEND_FLUSH) {
            // Told at open: the server offers nothing to flush with.
            return Ok(());
        }
        self.conn
            .call(CMD_FLUSH, 0, 0, 0, None)
            .map(|_| ())
            .map_err(|f| self.error("flush", f))
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
        self.export().size
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
            return self.write_zeroes(offset, len);
        }
        const STEP: u64 = 1 << 20;
        let zeros = vec![0u8; STEP.min(len) as usize];
        let mut done = 0;
        while done < len {
            let n = STEP.min(len - done) as usize;
            self.write_at(&zeros[..n], offset + done)?;
            done += n as u64;
        }
        Ok(())
    }

    fn can_discard(&self) -> bool {
        !self.read_only && self.export().has(FLAG_SEND_WRITE_ZEROES)
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
        self.write_zeroes(offset, len)
    }

    fn rotational(&self) -> Option<bool> {
        Some(self.export().has(FLAG_ROTATIONAL))
    }
}

/// Connect to the server (TCP with the timeout and no Nagle delay).
fn connect(endpoint: &Endpoint, timeout: Duration) -> io::Result<Stream> {
    match endpoint {
        Endpoint::Unix(path) => Ok(Stream::Unix(UnixStream::connect(path)?)),
        Endpoint::Tcp { host, port } => {
            let mut last = None;
            for addr in (host.as_str(), *port).to_socket_addrs()? {
                match TcpStream::connect_timeout(&addr, timeout) {
                    Ok(s) => {
                        s.set_nodelay(true)?;
                        return Ok(Stream::Tcp(s));
                    }
                    Err(e) => last = Some(e),
                }
            }
            Err(last.unwrap_or_else(|| {
                io::Error::new(io::ErrorKind::NotFound, format!("{host}: no address"))
            }))
        }
    }
}
