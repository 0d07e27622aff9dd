//! FUSE over io_uring (raidfs patch, see RAIDFS-PATCH.md).
//!
//! With `FUSE_OVER_IO_URING` negotiated at INIT (Linux 6.14 on, with the
//! `fuse` module's `enable_uring` parameter set), the kernel hands each
//! request to a ring entry of the queue of the CPU that issued it, instead
//! of queueing it for `read(2)` on `/dev/fuse`. Here every CPU queue gets
//! its share of the session's threads, pinned to that CPU, each with an io_uring of
//! its own and one entry registered with the kernel: a request is served on
//! the CPU its caller runs on, by whichever of the queue's threads is idle,
//! and its reply is committed together with the fetch of the next request
//! (`FUSE_IO_URING_CMD_COMMIT_AND_FETCH`), one `io_uring_enter` per request.
//!
//! The kernel still sends FORGET and INTERRUPT through `/dev/fuse`, so the
//! session's reading threads stay. A ring thread ends when the kernel
//! cancels its entry (the connection is gone) or when [`Rings::stop`] is
//! called.
//!
//! Layout of the kernel ABI used here (`include/uapi/linux/fuse.h`, 7.42):
//! the header buffer is `struct fuse_uring_req_header` (`in_out[128]`: the
//! `fuse_in_header`, or our `fuse_out_header`; `op_in[128]`: the request's
//! first argument; `ring_ent_in_out`: flags, commit id, payload size); the
//! payload buffer holds the remaining arguments, and our reply's body; the
//! 80-byte command of the SQE is `struct fuse_uring_cmd_req` (flags,
//! commit id, queue id).

use std::io;
use std::io::IoSlice;
use std::os::fd::RawFd;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;

use io_uring::{cqueue, opcode, squeue, types, IoUring};
use log::{debug, error, warn};

const IN_OUT: usize = 128;
const OP_IN: usize = 128;
const HEADER: usize = IN_OUT + OP_IN + 32;
/// `ring_ent_in_out.payload_sz`.
const PAYLOAD_SZ_AT: usize = IN_OUT + OP_IN + 16;
const IN_HEADER: usize = 40;
const OUT_HEADER: usize = 16;
const CMD_REGISTER: u32 = 1;
const CMD_COMMIT_AND_FETCH: u32 = 2;
/// The SQE's `len` field: the iovec count of a REGISTER.
const SQE_LEN_AT: usize = 24;
/// `user_data` of the stop poll.
const STOP: u64 = u64::MAX;
/// `user_data` of the poll that wakes a ring for replies sent elsewhere.
const WAKE: u64 = u64::MAX - 1;

const _: () = assert!(std::mem::size_of::<squeue::Entry128>() == 128);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut w = [0u8; 4];
    w.copy_from_slice(&b[at..at + 4]);
    u32::from_ne_bytes(w)
}

/// One registered entry's buffers. The kernel keeps pointers to them from
/// REGISTER on, so they never move (boxes) and live as long as the ring.
struct Buffers {
    header: Box<[u8; HEADER]>,
    payload: Box<[u8]>,
    iov: Box<[libc::iovec; 2]>,
}

// The iovecs point into the same entry's boxes and nothing else.
unsafe impl Send for Buffers {}

/// One thread's ring and its entry.
pub(crate) struct Ring {
    fd: RawFd,
    qid: u16,
    uring: Mutex<IoUring<squeue::Entry128, cqueue::Entry>>,
    buffers: Mutex<Buffers>,
    /// The thread that waits on `uring`. A reply sent from any other
    /// thread cannot take `uring` while that thread waits in it (for the
    /// very commit the reply makes), so it leaves its commit in `handed`
    /// and writes `wake`, an eventfd the ring polls.
    owner: std::thread::ThreadId,
    handed: Mutex<Vec<squeue::Entry128>>,
    wake: RawFd,
}

impl Drop for Ring {
    fn drop(&mut self) {
        // SAFETY: the ring's own eventfd, closed once. The io_uring, dropped
        // after this, holds its own reference to it for the pending poll.
        unsafe { libc::close(self.wake) };
    }
}

impl std::fmt::Debug for Ring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Ring(queue {})", self.qid)
    }
}

/// Where a request read from a ring is answered.
#[derive(Debug, Clone)]
pub(crate) struct RingReply(Arc<Ring>);

fn cmd_req(commit_id: u64, qid: u16) -> [u8; 80] {
    let mut c = [0u8; 80];
    c[8..16].copy_from_slice(&commit_id.to_ne_bytes());
    c[16..18].copy_from_slice(&qid.to_ne_bytes());
    c
}

impl RingReply {
    /// Put the reply (`fuse_out_header`, then the body) into the entry and
    /// commit it, fetching the next request into the same entry.
    pub(crate) fn send(&self, data: &[IoSlice<'_>]) -> io::Result<()> {
        let ring = &self.0;
        let Some((head, body)) = data.split_first() else {
            return Err(io::Error::other("empty FUSE reply"));
        };
        if head.len() != OUT_HEADER {
            return Err(io::Error::other("FUSE reply without its header"));
        }
        let mut unique = [0u8; 8];
        unique.copy_from_slice(&head[8..16]);
        let unique = u64::from_ne_bytes(unique);
        {
            let mut b = lock(&ring.buffers);
            b.header[..OUT_HEADER].copy_from_slice(head);
            let mut n = 0usize;
            for s in body {
                let end = n + s.len();
                let Some(dst) = b.payload.get_mut(n..end) else {
                    return Err(io::Error::other("FUSE reply larger than the ring's buffer"));
                };
                dst.copy_from_slice(s);
                n = end;
            }
            let n = u32::try_from(n).map_err(|_| io::Error::other("FUSE reply too large"))?;
            b.header[PAYLOAD_SZ_AT..PAYLOAD_SZ_AT + 4].copy_from_slice(&n.to_ne_bytes());
        }
        let sqe = opcode::UringCmd80::new(types::Fd(ring.fd), CMD_COMMIT_AND_FETCH)
            .cmd(cmd_req(unique, ring.qid))
            .build();
        if std::thread::current().id() != ring.owner {
            lock(&ring.handed).push(sqe);
            let one: u64 = 1;
            // SAFETY: writes 8 bytes from a local to the ring's eventfd.
            if unsafe { libc::write(ring.wake, (&one as *const u64).cast(), 8) } != 8 {
                return Err(io::Error::last_os_error());
            }
            return Ok(());
        }
        let mut uring = lock(&ring.uring);
        // SAFETY: the SQE refers to no memory of ours (the entry's buffers
        // were registered, and outlive the ring).
        unsafe { uring.submission().push(&sqe) }
            .map_err(|_| io::Error::other("io_uring submission queue full"))?;
        uring.submit()?;
        Ok(())
    }
}

/// The CPU queues' threads of one session.
#[derive(Debug)]
pub(crate) struct Rings {
    threads: Vec<JoinHandle<()>>,
    /// Written to end the threads (each polls it).
    stop: RawFd,
}

/// CPUs the kernel may run a caller on: it has one queue per possible CPU
/// and is ready only when every queue has an entry.
fn possible_cpus() -> io::Result<usize> {
    let s = std::fs::read_to_string("/sys/devices/system/cpu/possible")?;
    let last = s
        .trim()
        .rsplit([',', '-'])
        .next()
        .and_then(|n| n.parse::<usize>().ok())
        .ok_or_else(|| io::Error::other(format!("unreadable possible CPUs {s:?}")))?;
    Ok(last + 1)
}

impl Rings {
    /// Start `threads` threads, divided among the CPU queues (at least one
    /// each), each serving its entry's requests with `serve(reply,
    /// request_bytes)`. Entries are registered before this returns, so the
    /// kernel switches to the rings as soon as the last one is in.
    pub(crate) fn start<F>(
        fd: RawFd,
        threads: usize,
        payload: usize,
        serve: F,
    ) -> io::Result<Rings>
    where
        F: Fn(RingReply, &[u8]) + Send + Sync + 'static,
    {
        // SAFETY: plain syscall; the descriptor is owned by `Rings`.
        let stop = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if stop < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut rings = Rings {
            threads: Vec::new(),
            stop,
        };
        let serve = Arc::new(serve);
        let queues = possible_cpus()?;
        let threads_per_queue = threads.div_ceil(queues).max(1);
        for qid in 0..queues {
            for n in 0..threads_per_queue {
                let serve = Arc::clone(&serve);
                let (ready_tx, ready_rx) = std::sync::mpsc::channel();
                let thread = std::thread::Builder::new()
                    .name(format!("fuser-ring{qid}-{n}"))
                    .spawn(move || ring_thread(fd, qid, payload, stop, serve.as_ref(), ready_tx))?;
                rings.threads.push(thread);
                match ready_rx.recv() {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => {
                        rings.stop();
                        return Err(e);
                    }
                    Err(_) => {
                        rings.stop();
                        return Err(io::Error::other("io_uring thread ended at start"));
                    }
                }
            }
        }
        debug!("FUSE over io_uring: {queues} queues, {threads_per_queue} threads each");
        Ok(rings)
    }

    /// End the threads and wait for them.
    pub(crate) fn stop(&mut self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a local to our eventfd.
        unsafe { libc::write(self.stop, (&one as *const u64).cast(), 8) };
        for t in self.threads.drain(..) {
            if t.join().is_err() {
                error!("a FUSE io_uring thread panicked");
            }
        }
    }
}

impl Drop for Rings {
    fn drop(&mut self) {
        self.stop();
        // SAFETY: our descriptor, closed once.
        unsafe { libc::close(self.stop) };
    }
}

fn pin_to(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is an empty set; the call reads it only.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            debug!("io_uring thread of queue {cpu} not pinned: {}", io::Error::last_os_error());
        }
    }
}

/// Set up one ring with one entry, register it, then serve until stopped.
fn ring_thread(
    fd: RawFd,
    qid: usize,
    payload: usize,
    stop: RawFd,
    serve: &(dyn Fn(RingReply, &[u8]) + Send + Sync),
    ready: std::sync::mpsc::Sender<io::Result<()>>,
) {
    pin_to(qid);
    let (ring, mut early) = match register(fd, qid, payload, stop) {
        Ok(registered) => {
            let _ = ready.send(Ok(()));
            registered
        }
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let mut request = Vec::with_capacity(payload + IN_HEADER + OP_IN);
    loop {
        let completions: Vec<(u64, i32)> = if !early.is_empty() {
            std::mem::take(&mut early)
        } else {
            let mut uring = lock(&ring.uring);
            match uring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                Err(e) => {
                    error!("FUSE io_uring queue {qid}: {e}");
                    return;
                }
            }
            uring
                .completion()
                .map(|c| (c.user_data(), c.result()))
                .collect()
        };
        for (user_data, result) in completions {
            if user_data == STOP {
                return;
            }
            if user_data == WAKE {
                if let Err(e) = take_handed(&ring) {
                    error!("FUSE io_uring queue {qid}: {e}");
                    return;
                }
                continue;
            }
            if result < 0 {
                let e = io::Error::from_raw_os_error(-result);
                // ENOTCONN and ECANCELED: the connection ended.
                if !matches!(-result, libc::ENOTCONN | libc::ECANCELED) {
                    warn!("FUSE io_uring queue {qid}: entry ended: {e}");
                }
                return;
            }
            {
                let b = lock(&ring.buffers);
                let len = u32_at(&b.header[..], 0) as usize;
                let payload_len = u32_at(&b.header[..], PAYLOAD_SZ_AT) as usize;
                let op_len = len.saturating_sub(IN_HEADER + payload_len);
                if op_len > OP_IN || payload_len > b.payload.len() {
                    error!("FUSE io_uring queue {qid}: malformed request (length {len})");
                    return;
                }
                request.clear();
                request.extend_from_slice(&b.header[..IN_HEADER]);
                request.extend_from_slice(&b.header[IN_OUT..IN_OUT + op_len]);
                request.extend_from_slice(&b.payload[..payload_len]);
            }
            serve(RingReply(Arc::clone(&ring)), &request);
        }
    }
}

#[allow(clippy::type_complexity)]
fn register(
    fd: RawFd,
    qid: usize,
    payload: usize,
    stop: RawFd,
) -> io::Result<(Arc<Ring>, Vec<(u64, i32)>)> {
    let qid16 = u16::try_from(qid).map_err(|_| io::Error::other("too many CPUs"))?;
    let uring = IoUring::<squeue::Entry128, cqueue::Entry>::builder().build(8)?;
    let mut header = Box::new([0u8; HEADER]);
    let mut payload = vec![0u8; payload].into_boxed_slice();
    let iov = Box::new([
        libc::iovec {
            iov_base: header.as_mut_ptr().cast(),
            iov_len: HEADER,
        },
        libc::iovec {
            iov_base: payload.as_mut_ptr().cast(),
            iov_len: payload.len(),
        },
    ]);
    // SAFETY: plain syscall; the descriptor is owned by the `Ring`.
    let wake = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if wake < 0 {
        return Err(io::Error::last_os_error());
    }
    let ring = Arc::new(Ring {
        fd,
        qid: qid16,
        uring: Mutex::new(uring),
        buffers: Mutex::new(Buffers {
            header,
            payload,
            iov,
        }),
        owner: std::thread::current().id(),
        handed: Mutex::new(Vec::new()),
        wake,
    });
    let iov_addr = lock(&ring.buffers).iov.as_ptr() as u64;
    let register = opcode::UringCmd80::new(types::Fd(fd), CMD_REGISTER)
        .cmd(cmd_req(0, qid16))
        .addr(Some(iov_addr))
        .build();
    let register = with_len(register, 2);
    let stop_poll = opcode::PollAdd::new(types::Fd(stop), libc::POLLIN as u32)
        .build()
        .user_data(STOP)
        .into();
    {
        let mut uring = lock(&ring.uring);
        // SAFETY: the iovecs and the buffers they point to live in `ring`,
        // which every reply and this thread keep alive as long as the
        // io_uring; the eventfd outlives the threads (`Rings`).
        unsafe {
            let mut sq = uring.submission();
            sq.push(&register)
                .and_then(|()| sq.push(&stop_poll))
                .and_then(|()| sq.push(&wake_poll(wake)))
        }
        .map_err(|_| io::Error::other("io_uring submission queue full"))?;
        uring.submit()?;
        // A REGISTER the kernel refuses completes at once with its error;
        // one it took may already have fetched a request.
        let early: Vec<(u64, i32)> = uring
            .completion()
            .map(|c| (c.user_data(), c.result()))
            .collect();
        if let Some(&(_, result)) = early.iter().find(|(u, r)| *u != STOP && *r < 0) {
            let e = io::Error::from_raw_os_error(-result);
            return Err(io::Error::new(
                e.kind(),
                format!("FUSE io_uring register of queue {qid}: {e}"),
            ));
        }
        drop(uring);
        Ok((ring, early))
    }
}

fn wake_poll(wake: RawFd) -> squeue::Entry128 {
    opcode::PollAdd::new(types::Fd(wake), libc::POLLIN as u32)
        .build()
        .user_data(WAKE)
        .into()
}

/// The ring thread, woken by a reply sent from another thread: reset the
/// eventfd, poll it again, and submit the commits left in `handed`.
fn take_handed(ring: &Ring) -> io::Result<()> {
    let mut count = [0u8; 8];
    // SAFETY: reads 8 bytes into a local from the ring's (non-blocking) eventfd.
    unsafe { libc::read(ring.wake, count.as_mut_ptr().cast(), 8) };
    let handed = std::mem::take(&mut *lock(&ring.handed));
    let mut uring = lock(&ring.uring);
    // SAFETY: the commits refer to no memory of ours (see `RingReply::send`).
    unsafe {
        let mut sq = uring.submission();
        for sqe in handed.iter().chain(std::iter::once(&wake_poll(ring.wake))) {
            sq.push(sqe)
                .map_err(|_| io::Error::other("io_uring submission queue full"))?;
        }
    }
    uring.submit()?;
    Ok(())
}

/// `sqe` with its `len` field set: io-uring's `UringCmd80` has no setter
/// for it, and a REGISTER passes its iovec count there.
fn with_len(sqe: squeue::Entry128, len: u32) -> squeue::Entry128 {
    // SAFETY: `Entry128` is `repr(C)` over the kernel's 128-byte SQE (size
    // checked above); `len` is a u32 at byte 24 of `struct io_uring_sqe`.
    let mut raw: [u8; 128] = unsafe { std::mem::transmute(sqe) };
    raw[SQE_LEN_AT..SQE_LEN_AT + 4].copy_from_slice(&len.to_ne_bytes());
    unsafe { std::mem::transmute(raw) }
}
