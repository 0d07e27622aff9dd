//! Busy polling of `/dev/fuse` (a raidfs patch, see RAIDFS-PATCH.md).
//!
//! Without it every thread sleeps in `read(2)` on `/dev/fuse`, and each
//! request the kernel queues wakes one of them: on a machine whose other
//! CPU is idle that wake is an inter-processor interrupt, which a virtual
//! machine pays for with exits on both sides. A caller that issues one
//! request after another (a `pwrite` loop, a `create, write, close` loop)
//! pays it on every request.
//!
//! With it, while callers issue quick requests one after another, one
//! thread at a time holds the *reading role*: it polls the device without
//! sleeping for a short while (the caller's next request usually comes
//! within microseconds of the last answer), and only then sleeps in
//! `read(2)`. The other threads wait in user space, so no thread sleeps in
//! the kernel's queue to be woken while the poller is there. Polling yields
//! the CPU between tries, so a caller woken on the poller's CPU runs at
//! once.
//!
//! Polling pays only for such a stream. After a slow request (a read, a
//! large write whose member writes go on in the background), and while
//! one is being served, the threads read *freely*: each sleeps in
//! `read(2)` as without busy polling. The caller's next request then comes
//! after work of its own, a poller would take CPU from the I/O in flight
//! (4 KiB random reads lost a third to one), slow requests come in bursts
//! (the kernel's write-back sends many 1 MiB WRITEs at once) that a role
//! passed from thread to thread would read one wake-up at a time, and a
//! hand-over to a thread waiting in user space is a wake-up more per
//! request than the kernel's own.
//!
//! A request the filesystem says is quick is served by the thread that
//! read it, without handing the role on (which would be a wake-up of its
//! own); that thread takes the role back when it has answered. A slow
//! request (reading a disk, an fsync) ends the polling and sends the
//! waiting threads to read freely, so other requests are read meanwhile as
//! before. A quick request
//! that is not quick after all (it waits for a lock or for the host) is
//! caught by a watchdog: when nobody has read the device for a tick, it
//! hands the role to a waiting thread.
//!
//! Whether polling pays for a stream of quick requests depends on where
//! the kernel wakes the caller with each answer. When the caller shares
//! the poller's CPU, the answer wakes it there and polling saves the
//! request's wake-up. When another CPU is idle, the caller is woken there
//! and each answer is an interrupt to that CPU, where sleeping threads
//! would have served the caller on its own CPU without one (RAID1's 4 KiB
//! writes lost 7 % to polling on a two-CPU virtual machine, where RAID5's,
//! whose member threads keep the other CPU busy, gained a sixth). So the
//! filesystem may judge ([`PollChoice`]): it is told how far apart the
//! stream's requests come and says whether to go on polling.

use std::os::fd::AsFd;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::Condvar;
use std::sync::Mutex;
use std::sync::MutexGuard;
use std::time::Duration;
use std::time::Instant;

use nix::errno::Errno;

use crate::channel::Channel;

/// How the session's threads read `/dev/fuse` when busy polling is on.
#[derive(Clone, Debug)]
pub struct BusyPoll {
    /// How long the reading thread polls for the next request before it
    /// sleeps in `read(2)`.
    pub spin: Duration,
    /// Whether a request, by its opcode and its length in bytes (header
    /// included), is answered quickly enough to be served by the thread
    /// that read it, without handing the reading role on first.
    pub quick: fn(opcode: u32, len: u32) -> bool,
    /// Judges from the stream's pace whether polling pays (`None`: a
    /// stream of quick requests is always polled).
    pub choice: Option<Arc<dyn PollChoice>>,
}

/// Chooses between polling and sleeping for a stream of quick requests by
/// what each gives (see the module's header).
pub trait PollChoice: Send + Sync + std::fmt::Debug {
    /// A quick request was read `interval` after the quick request before
    /// it, with nothing slow served between them, while the stream was
    /// read as `polled` says. Returns whether to poll from now on.
    fn quick_interval(&self, interval: Duration, polled: bool) -> bool;
}

impl PartialEq for BusyPoll {
    fn eq(&self, other: &Self) -> bool {
        let same_choice = match (&self.choice, &other.choice) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            (None, None) => true,
            _ => false,
        };
        self.spin == other.spin && std::ptr::fn_addr_eq(self.quick, other.quick) && same_choice
    }
}

impl Eq for BusyPoll {}

/// Longest time no thread reads the device while one serves a quick
/// request and others wait for the role.
const TICK: Duration = Duration::from_millis(1);
/// Ticks without a quick request after which the watchdog sleeps until
/// the next one, so that an idle filesystem costs no wake-ups.
const IDLE_TICKS: u32 = 100;
/// Longest interval between two quick requests that still counts as one
/// stream for [`PollChoice`]: a caller that pauses longer finds every
/// thread asleep either way.
const STREAM_GAP: Duration = Duration::from_millis(1);

#[derive(Default)]
struct State {
    /// A thread holds the reading role.
    reading: bool,
    /// Since when no thread reads because the last reader serves a quick
    /// request itself.
    unread_since: Option<Instant>,
    /// Threads waiting for the role.
    waiting: usize,
    /// Quick requests served so far (the watchdog's sign of activity).
    quick_served: u64,
    /// The watchdog sleeps without a timeout.
    watchdog_asleep: bool,
    /// The session is ending: no thread takes the role again.
    stopping: bool,
    /// Slow requests being served (the role is not polled meanwhile).
    slow: usize,
    /// The last request read was quick (polling pays only then; see the
    /// module's header).
    after_quick: bool,
    /// When the last quick request was read, if nothing slow came since.
    last_quick: Option<Instant>,
    /// A stream of quick requests is not polled: the [`PollChoice`] found
    /// sleeping threads serve it faster.
    asleep_by_choice: bool,
}

impl State {
    /// Whether the reading is by role and polled: after a quick request,
    /// with no slow one being served, unless the choice is to sleep.
    fn polling(&self) -> bool {
        self.after_quick && self.slow == 0 && !self.asleep_by_choice
    }
}

/// How a thread reads its next request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Turn {
    /// As the role's holder: poll, then sleep in `read(2)`.
    Holder,
    /// Asleep in `read(2)` at once, as every thread is without busy polling.
    Free,
}

/// The reading role and its watchdog, shared by a session's threads.
pub(crate) struct Readers {
    poll: BusyPoll,
    state: Mutex<State>,
    waiting: Condvar,
    watchdog: Condvar,
}

impl Readers {
    pub(crate) fn new(poll: BusyPoll) -> Readers {
        Readers {
            poll,
            state: Mutex::new(State::default()),
            waiting: Condvar::new(),
            watchdog: Condvar::new(),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A thread that panicked holding the lock left the state whole
        // (every change is a single assignment), so it is still good.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How this thread reads its next request: as the role's holder
    /// (while callers issue quick requests), or freely; `None` once the
    /// session is ending. `served_slow`: the caller has just answered a
    /// slow request.
    pub(crate) fn take_role(&self, served_slow: bool) -> Option<Turn> {
        let mut st = self.state();
        if served_slow {
            st.slow = st.slow.saturating_sub(1);
        }
        loop {
            if st.stopping {
                return None;
            }
            if !st.polling() {
                return Some(Turn::Free);
            }
            if !st.reading {
                st.reading = true;
                st.unread_since = None;
                return Some(Turn::Holder);
            }
            st.waiting += 1;
            st = self.waiting.wait(st).unwrap_or_else(|e| e.into_inner());
            st.waiting -= 1;
        }
    }

    /// Account for `request`, read in `turn`; the holder gives the role up.
    /// Returns whether the request is quick (a holder serves it without a
    /// hand-over and takes the role back when it has answered).
    pub(crate) fn release_role(&self, turn: Turn, request: &[u8]) -> bool {
        // `fuse_in_header` starts with the request's length and opcode.
        let word = |at: usize| {
            let bytes = request.get(at..at + 4)?;
            Some(u32::from_ne_bytes(bytes.try_into().ok()?))
        };
        let quick = match (word(4), word(0)) {
            (Some(opcode), Some(len)) => (self.poll.quick)(opcode, len),
            _ => false,
        };
        let now = Instant::now();
        let mut st = self.state();
        self.judge(&mut st, quick, now);
        st.after_quick = quick;
        if !quick {
            st.slow += 1;
            // The polling is over: threads waiting for the role read freely.
            if st.waiting > 0 {
                self.waiting.notify_all();
            }
        }
        if turn == Turn::Holder {
            st.reading = false;
            if quick {
                st.unread_since = Some(now);
                st.quick_served += 1;
                if st.watchdog_asleep {
                    st.watchdog_asleep = false;
                    self.watchdog.notify_one();
                }
            }
        }
        quick
    }

    /// Tell the [`PollChoice`] how far apart a stream's quick requests
    /// come, and follow its answer.
    fn judge(&self, st: &mut State, quick: bool, now: Instant) {
        let Some(choice) = &self.poll.choice else {
            return;
        };
        if !quick || st.slow > 0 {
            st.last_quick = None;
            return;
        }
        // Reset by every slow request, so the one before was quick.
        let Some(at) = st.last_quick.replace(now) else {
            return;
        };
        let interval = now.saturating_duration_since(at);
        if interval > STREAM_GAP {
            return;
        }
        let polled = !st.asleep_by_choice;
        let poll = choice.quick_interval(interval, polled);
        st.asleep_by_choice = !poll;
        if polled && !poll && st.waiting > 0 {
            // Threads waiting for the role read freely from now on.
            self.waiting.notify_all();
        }
    }

    /// The session ends: waiting threads and the watchdog return.
    pub(crate) fn stop(&self) {
        let mut st = self.state();
        st.stopping = true;
        self.waiting.notify_all();
        self.watchdog.notify_all();
    }

    /// Read one request in `turn`: the holder polls for `spin` first; then
    /// the thread sleeps in `read(2)`. `nonblocking` is whether this
    /// thread's descriptor is in O_NONBLOCK mode now (each thread has a
    /// descriptor of its own).
    pub(crate) fn read(
        &self,
        ch: &Channel,
        nonblocking: &mut bool,
        turn: Turn,
        buf: &mut [u8],
    ) -> nix::Result<usize> {
        if turn == Turn::Free {
            return read_asleep(ch, nonblocking, buf);
        }
        let start = Instant::now();
        if !*nonblocking {
            set_nonblocking(ch, true)?;
            *nonblocking = true;
        }
        loop {
            match nix::unistd::read(ch, buf) {
                Ok(size) => return Ok(size),
                // Yield rather than spin: the caller whose answer this
                // thread just sent may have been woken on this CPU, and its
                // next request is what the poll waits for.
                Err(Errno::EAGAIN) if start.elapsed() < self.poll.spin => std::thread::yield_now(),
                Err(Errno::EAGAIN) => break,
                Err(Errno::ENOENT | Errno::EINTR) => continue,
                Err(err) => return Err(err),
            }
        }
        read_asleep(ch, nonblocking, buf)
    }

    /// The watchdog thread: hands the role to a waiting thread when
    /// nobody has read the device for a tick.
    pub(crate) fn watch(&self) {
        let mut st = self.state();
        let mut seen = st.quick_served;
        let mut quiet = 0;
        loop {
            if st.stopping {
                return;
            }
            if st.watchdog_asleep {
                st = self.watchdog.wait(st).unwrap_or_else(|e| e.into_inner());
                quiet = 0;
                continue;
            }
            st = self
                .watchdog
                .wait_timeout(st, TICK)
                .unwrap_or_else(|e| e.into_inner())
                .0;
            let stalled = st.unread_since.is_some_and(|since| since.elapsed() >= TICK);
            if stalled && !st.reading && st.waiting > 0 {
                st.unread_since = None;
                self.waiting.notify_one();
            }
            if st.quick_served == seen {
                quiet += 1;
                if quiet >= IDLE_TICKS && st.unread_since.is_none() {
                    st.watchdog_asleep = true;
                }
            } else {
                seen = st.quick_served;
                quiet = 0;
            }
        }
    }
}

/// Sleep in `read(2)` for the next request, the descriptor blocking again.
fn read_asleep(ch: &Channel, nonblocking: &mut bool, buf: &mut [u8]) -> nix::Result<usize> {
    if *nonblocking {
        set_nonblocking(ch, false)?;
        *nonblocking = false;
    }
    ch.receive_retrying(buf)
}

fn set_nonblocking(ch: &Channel, on: bool) -> nix::Result<()> {
    let fd = ch.as_fd().as_raw_fd();
    // SAFETY: F_GETFL and F_SETFL on a descriptor the channel owns.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(Errno::last());
    }
    let flags = if on {
        flags | libc::O_NONBLOCK
    } else {
        flags & !libc::O_NONBLOCK
    };
    // SAFETY: as above.
    if unsafe { libc::fcntl(fd, libc::F_SETFL, flags) } < 0 {
        return Err(Errno::last());
    }
    Ok(())
}
