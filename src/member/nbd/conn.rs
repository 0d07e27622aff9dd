//! One transmission-phase connection with many requests in flight.
//!
//! Callers send their request under a short lock on the socket's write
//! half and then wait on their own completion slot. One reader thread
//! owns the read half: it matches every reply (simple, or structured
//! chunks: data, holes, errors) to its request by cookie and completes it.
//! A request with no reply within the timeout, a lost connection or a
//! protocol violation breaks the connection: every request in flight and
//! every later one fails with the reason, and nothing is retried (the
//! array decides what a failed member means).

use super::handshake::Export;
use super::proto::*;
use parking_lot::{Condvar, Mutex};
use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Largest non-data chunk payload accepted (error messages and the like).
const MAX_CHUNK: u32 = 1 << 20;

/// A connected socket, TCP or Unix.
pub enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Stream {
    pub fn try_clone(&self) -> io::Result<Stream> {
        Ok(match self {
            Stream::Tcp(s) => Stream::Tcp(s.try_clone()?),
            Stream::Unix(s) => Stream::Unix(s.try_clone()?),
        })
    }

    pub fn shutdown(&self) {
        let _ = match self {
            Stream::Tcp(s) => s.shutdown(Shutdown::Both),
            Stream::Unix(s) => s.shutdown(Shutdown::Both),
        };
    }

    pub fn set_timeouts(&self, read: Option<Duration>, write: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => {
                s.set_read_timeout(read)?;
                s.set_write_timeout(write)
            }
            Stream::Unix(s) => {
                s.set_read_timeout(read)?;
                s.set_write_timeout(write)
            }
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(buf),
            Stream::Unix(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write(buf),
            Stream::Unix(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Why a request failed: an errno for the caller's error and words.
#[derive(Clone, Debug)]
pub struct Failure {
    pub errno: i32,
    pub message: String,
    /// The connection broke because the server closed or reset it (a
    /// restart, a network drop), so a new connection may serve: not a
    /// server's error reply, a timeout or a protocol violation.
    pub lost: bool,
}

impl Failure {
    fn new(errno: i32, message: impl Into<String>) -> Failure {
        Failure {
            errno,
            message: message.into(),
            lost: false,
        }
    }

    fn lost(errno: i32, message: impl Into<String>, lost: bool) -> Failure {
        Failure {
            lost,
            ..Failure::new(errno, message)
        }
    }
}

/// Where a request's outcome is handed to its caller.
struct Slot {
    outcome: Mutex<Option<Result<Vec<u8>, Failure>>>,
    ready: Condvar,
}

impl Slot {
    fn complete(&self, outcome: Result<Vec<u8>, Failure>) {
        let mut slot = self.outcome.lock();
        if slot.is_none() {
            *slot = Some(outcome);
        }
        self.ready.notify_all();
    }
}

/// A request in flight, as the reader thread sees it.
struct Pending {
    command: u16,
    offset: u64,
    len: u32,
    /// What a read has received so far (holes stay zero).
    data: Vec<u8>,
    /// The first error chunk.
    error: Option<Failure>,
    slot: Arc<Slot>,
}

#[derive(Default)]
struct State {
    pending: HashMap<u64, Pending>,
    /// Set once the connection is unusable: errno, why, and whether it
    /// was lost (see [`Failure::lost`]).
    broken: Option<(i32, String, bool)>,
}

struct Shared {
    state: Mutex<State>,
    /// A handle on the socket for shutting it down from any thread.
    control: Stream,
}

impl Shared {
    /// Break the connection (the first reason sticks): fail everything in
    /// flight and wake the reader by shutting the socket down.
    fn break_with(&self, errno: i32, reason: String, lost: bool) {
        let (pending, (errno, reason, lost)) = {
            let mut state = self.state.lock();
            let first = state.broken.get_or_insert((errno, reason, lost)).clone();
            (std::mem::take(&mut state.pending), first)
        };
        self.control.shutdown();
        for (_, p) in pending {
            p.slot
                .complete(Err(Failure::lost(errno, reason.clone(), lost)));
        }
    }
}

/// A request sent and not yet waited for.
pub struct Ticket {
    slot: Arc<Slot>,
}

/// A connection in the transmission phase.
pub struct Conn {
    export: Export,
    writer: Mutex<Stream>,
    shared: Arc<Shared>,
    reader: Mutex<Option<JoinHandle<()>>>,
    /// The request timeout, milliseconds (changed by [`Conn::set_timeout`]).
    timeout_ms: AtomicU64,
    next_cookie: AtomicU64,
}

impl Conn {
    /// Start transmission on a negotiated stream: requests that get no
    /// reply within `timeout` fail and break the connection.
    pub fn start(stream: Stream, export: Export, timeout: Duration) -> io::Result<Conn> {
        // The reader blocks until a reply or the shutdown; a send that
        // cannot progress (the server stopped reading) gives up in time.
        stream.set_timeouts(None, Some(timeout))?;
        let read_half = stream.try_clone()?;
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            control: stream.try_clone()?,
        });
        let for_reader = Arc::clone(&shared);
        let structured = export.structured;
        let reader = std::thread::Builder::new()
            .name("nbd-reader".into())
            .spawn(move || reader(read_half, &for_reader, structured))?;
        Ok(Conn {
            export,
            writer: Mutex::new(stream),
            shared,
            reader: Mutex::new(Some(reader)),
            timeout_ms: AtomicU64::new(timeout.as_millis().max(1) as u64),
            next_cookie: AtomicU64::new(1),
        })
    }

    pub fn export(&self) -> &Export {
        &self.export
    }

    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms.load(Ordering::Acquire))
    }

    /// Change the request timeout (for requests waited for from now).
    pub fn set_timeout(&self, timeout: Duration) {
        self.timeout_ms
            .store(timeout.as_millis().max(1) as u64, Ordering::Release);
        let _ = self.writer.lock().set_timeouts(None, Some(timeout));
    }

    /// Why the connection is unusable, if it is.
    pub fn broken(&self) -> Option<String> {
        let state = self.shared.state.lock();
        state.broken.as_ref().map(|(_, why, _)| why.clone())
    }

    /// Send one request; wait for it with [`Conn::wait`].
    pub fn submit(
        &self,
        command: u16,
        flags: u16,
        offset: u64,
        len: u32,
        payload: Option<&[u8]>,
    ) -> Result<Ticket, Failure> {
        let cookie = self.next_cookie.fetch_add(1, Ordering::Relaxed);
        let slot = Arc::new(Slot {
            outcome: Mutex::new(None),
            ready: Condvar::new(),
        });
        {
            let mut state = self.shared.state.lock();
            if let Some((errno, why, lost)) = &state.broken {
                return Err(Failure::lost(*errno, why.clone(), *lost));
            }
            let data = if command == CMD_READ {
                vec![0u8; len as usize]
            } else {
                Vec::new()
            };
            state.pending.insert(
                cookie,
                Pending {
                    command,
                    offset,
                    len,
                    data,
                    error: None,
                    slot: Arc::clone(&slot),
                },
            );
        }
        let mut header = [0u8; 28];
        header[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
        header[4..6].copy_from_slice(&flags.to_be_bytes());
        header[6..8].copy_from_slice(&command.to_be_bytes());
        header[8..16].copy_from_slice(&cookie.to_be_bytes());
        header[16..24].copy_from_slice(&offset.to_be_bytes());
        header[24..28].copy_from_slice(&len.to_be_bytes());
        let sent = {
            let mut writer = self.writer.lock();
            match payload {
                // One segment for small writes: one packet with TCP_NODELAY.
                Some(data) if data.len() <= 64 << 10 => {
                    let mut msg = Vec::with_capacity(28 + data.len());
                    msg.extend_from_slice(&header);
                    msg.extend_from_slice(data);
                    writer.write_all(&msg)
                }
                Some(data) => writer
                    .write_all(&header)
                    .and_then(|()| writer.write_all(data)),
                None => writer.write_all(&header),
            }
        };
        if let Err(e) = sent {
            let errno = e.raw_os_error().unwrap_or(libc::EIO);
            let (why, lost) = match e.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => (
                    format!(
                        "the server took no data for {} s (request timeout)",
                        self.timeout().as_secs_f64()
                    ),
                    false,
                ),
                _ => (format!("sending a request: {e}"), true),
            };
            self.shared.break_with(errno, why, lost);
        }
        Ok(Ticket { slot })
    }

    /// Wait for a request's outcome: a read's data, or nothing.
    pub fn wait(&self, ticket: Ticket) -> Result<Vec<u8>, Failure> {
        let timeout = self.timeout();
        let deadline = Instant::now() + timeout;
        let mut outcome = ticket.slot.outcome.lock();
        loop {
            if let Some(done) = outcome.take() {
                return done;
            }
            if ticket
                .slot
                .ready
                .wait_until(&mut outcome, deadline)
                .timed_out()
            {
                if let Some(done) = outcome.take() {
                    return done;
                }
                drop(outcome);
                let why = format!(
                    "no reply within {} s (request timeout); connection closed",
                    timeout.as_secs_f64()
                );
                self.shared.break_with(libc::ETIMEDOUT, why, false);
                let mut outcome = ticket.slot.outcome.lock();
                return outcome
                    .take()
                    .unwrap_or_else(|| Err(Failure::new(libc::ETIMEDOUT, "no reply")));
            }
        }
    }

    /// One request, waited for.
    pub fn call(
        &self,
        command: u16,
        flags: u16,
        offset: u64,
        len: u32,
        payload: Option<&[u8]>,
    ) -> Result<Vec<u8>, Failure> {
        let ticket = self.submit(command, flags, offset, len, payload)?;
        self.wait(ticket)
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        if self.broken().is_none() {
            // A soft disconnect: NBD_CMD_DISC has no reply.
            let mut header = [0u8; 28];
            header[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
            header[6..8].copy_from_slice(&CMD_DISC.to_be_bytes());
            let mut writer = self.writer.lock();
            let _ = writer.set_timeouts(None, Some(Duration::from_secs(1)));
            let _ = writer.write_all(&header);
        }
        self.shared
            .break_with(libc::ESHUTDOWN, "the member was closed".into(), false);
        if let Some(reader) = self.reader.lock().take() {
            let _ = reader.join();
        }
    }
}

fn protocol(why: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, why.into())
}

/// The reader thread: complete requests until the connection ends.
fn reader(mut stream: Stream, shared: &Shared, structured: bool) {
    let (reason, lost) = loop {
        if let Err(e) = read_reply(&mut stream, shared, structured) {
            break match e.kind() {
                io::ErrorKind::UnexpectedEof => {
                    ("the server closed the connection".to_string(), true)
                }
                io::ErrorKind::InvalidData => {
                    (format!("protocol error from the server: {e}"), false)
                }
                _ => (format!("connection lost: {e}"), true),
            };
        }
    };
    shared.break_with(libc::EIO, reason, lost);
}

fn read_array<const N: usize>(s: &mut impl Read) -> io::Result<[u8; N]> {
    let mut b = [0u8; N];
    s.read_exact(&mut b)?;
    Ok(b)
}

/// Read one reply (or chunk) and act on it.
fn read_reply(s: &mut Stream, shared: &Shared, structured: bool) -> io::Result<()> {
    let magic = u32::from_be_bytes(read_array(s)?);
    match magic {
        SIMPLE_REPLY_MAGIC => simple_reply(s, shared),
        STRUCTURED_REPLY_MAGIC if structured => chunk(s, shared),
        _ => Err(protocol(format!("bad reply magic {magic:#x}"))),
    }
}

fn simple_reply(s: &mut Stream, shared: &Shared) -> io::Result<()> {
    let error = u32::from_be_bytes(read_array(s)?);
    let cookie = u64::from_be_bytes(read_array(s)?);
    let Some(mut p) = shared.state.lock().pending.remove(&cookie) else {
        return Err(protocol(format!("reply to unknown request {cookie}")));
    };
    if error != 0 {
        p.slot.complete(Err(Failure::new(
            errno(error),
            format!("the server answered error {error}"),
        )));
        return Ok(());
    }
    if p.command == CMD_READ {
        // The data follows; it is read outside the lock (only this thread
        // touches a request's buffer).
        if let Err(e) = s.read_exact(&mut p.data) {
            p.slot
                .complete(Err(Failure::new(libc::EIO, format!("reading data: {e}"))));
            return Err(e);
        }
    }
    p.slot.complete(Ok(std::mem::take(&mut p.data)));
    Ok(())
}

fn chunk(s: &mut Stream, shared: &Shared) -> io::Result<()> {
    let flags = u16::from_be_bytes(read_array(s)?);
    let kind = u16::from_be_bytes(read_array(s)?);
    let cookie = u64::from_be_bytes(read_array(s)?);
    let length = u32::from_be_bytes(read_array(s)?);
    let (command, offset, len) = {
        let state = shared.state.lock();
        let Some(p) = state.pending.get(&cookie) else {
            return Err(protocol(format!(
                "reply chunk for unknown request {cookie}"
            )));
        };
        (p.command, p.offset, p.len)
    };
    let end = offset + u64::from(len);
    match kind {
        REPLY_TYPE_NONE => {
            if length != 0 {
                return Err(protocol("NBD_REPLY_TYPE_NONE with a payload"));
            }
        }
        REPLY_TYPE_OFFSET_DATA => {
            if command != CMD_READ || length < 8 {
                return Err(protocol("unexpected data chunk"));
            }
            let at = u64::from_be_bytes(read_array(s)?);
            let n = u64::from(length - 8);
            if at < offset || at + n > end {
                return Err(protocol(format!(
                    "data chunk {at}+{n} outside the request {offset}+{len}"
                )));
            }
            // Take the buffer, fill it unlocked, give it back.
            let mut data = match shared.state.lock().pending.get_mut(&cookie) {
                Some(p) => std::mem::take(&mut p.data),
                None => return Err(protocol("request vanished")),
            };
            let start = (at - offset) as usize;
            s.read_exact(&mut data[start..start + n as usize])?;
            if let Some(p) = shared.state.lock().pending.get_mut(&cookie) {
                p.data = data;
            }
        }
        REPLY_TYPE_OFFSET_HOLE => {
            if command != CMD_READ || length != 12 {
                return Err(protocol("unexpected hole chunk"));
            }
            let at = u64::from_be_bytes(read_array(s)?);
            let n = u64::from(u32::from_be_bytes(read_array(s)?));
            if at < offset || at + n > end || n == 0 {
                return Err(protocol(format!(
                    "hole chunk {at}+{n} outside the request {offset}+{len}"
                )));
            }
            // The buffer started zeroed: a hole reads as zeros already.
        }
        k if k & REPLY_TYPE_ERROR_BIT != 0 => {
            if !(6..=MAX_CHUNK).contains(&length) {
                return Err(protocol("error chunk of a bad length"));
            }
            let mut payload = vec![0u8; length as usize];
            s.read_exact(&mut payload)?;
            let error = u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]]);
            let said_len = u16::from_be_bytes([payload[4], payload[5]]) as usize;
            let said = payload
                .get(6..6 + said_len)
                .map(String::from_utf8_lossy)
                .unwrap_or_default();
            let mut message = format!("the server answered error {error}");
            if k == REPLY_TYPE_ERROR_OFFSET {
                if let Some(at) = payload.get(6 + said_len..14 + said_len) {
                    let at = u64::from_be_bytes(at.try_into().unwrap_or_default());
                    message.push_str(&format!(" at offset {at}"));
                }
            }
            if !said.trim().is_empty() {
                message.push_str(&format!(": {}", said.trim()));
            }
            if let Some(p) = shared.state.lock().pending.get_mut(&cookie) {
                if p.error.is_none() {
                    p.error = Some(Failure::new(errno(error), message));
                }
            }
        }
        k => return Err(protocol(format!("unknown reply chunk type {k}"))),
    }
    if flags & REPLY_FLAG_DONE != 0 {
        if let Some(mut p) = shared.state.lock().pending.remove(&cookie) {
            match p.error.take() {
                Some(failure) => p.slot.complete(Err(failure)),
                None => p.slot.complete(Ok(std::mem::take(&mut p.data))),
            }
        }
    }
    Ok(())
}
