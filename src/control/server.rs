//! The daemon's side of the control socket: an accept thread and one thread
//! per connection (a few at most), each reading request lines and writing
//! response lines. Stopping wakes the accept thread through a pipe, lets
//! connections finish the request in hand, and removes the socket.

use super::ops;
use super::protocol::{Request, Response};
use super::report::{ArrayReport, Origin};
use crate::array::Array;
use crate::fs::FileSystem;
use parking_lot::Mutex;
use std::io::{self, BufRead, BufReader, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Connections served at once; more are told to retry.
const MAX_CONNECTIONS: usize = 16;
/// A connection that sends nothing for this long is closed.
const IDLE_LIMIT: Duration = Duration::from_secs(120);
/// How often a waiting connection looks at the stop flag.
const POLL_EVERY: Duration = Duration::from_millis(200);
/// Longest request line accepted.
const MAX_LINE: usize = 64 << 10;

/// The mount a server controls.
#[derive(Clone, Debug)]
pub struct MountContext {
    pub mount_point: PathBuf,
    /// Who mounted it: besides root, the only uid allowed to change it.
    pub owner_uid: u32,
    pub read_only: bool,
    /// Where speed limits are kept so a daemon restarted after a crash
    /// resumes background work under the same limits (`None`: not kept).
    pub saved_limits: Option<PathBuf>,
}

/// The limits file that goes with a control socket.
pub fn saved_limits_path(socket: &Path) -> PathBuf {
    socket.with_extension("limits")
}

struct Shared {
    array: Arc<Array>,
    /// The mounted filesystem, for `sync`.
    fs: Arc<FileSystem>,
    context: MountContext,
    stop: AtomicBool,
    connections: AtomicUsize,
    /// The running replace's (slot, new member), for the report.
    replacing: Mutex<Option<(usize, String)>>,
}

/// A running control server; stops when dropped.
pub struct ControlServer {
    socket: PathBuf,
    shared: Arc<Shared>,
    wake: Option<OwnedFd>,
    acceptor: Option<JoinHandle<Vec<JoinHandle<()>>>>,
}

impl ControlServer {
    /// Bind `socket` (replacing a stale one), owner-only, and serve `array`
    /// and the filesystem `fs` on it.
    pub fn start(
        socket: &Path,
        array: Arc<Array>,
        fs: Arc<FileSystem>,
        context: MountContext,
    ) -> io::Result<ControlServer> {
        let with_path = |what: &str, e: io::Error| {
            io::Error::new(e.kind(), format!("{what} {}: {e}", socket.display()))
        };
        if let Some(dir) = socket.parent() {
            std::fs::create_dir_all(dir).map_err(|e| with_path("creating the directory of", e))?;
        }
        // A socket left by a daemon that died: nothing listens on it.
        match std::fs::remove_file(socket) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => {
                return Err(with_path("removing stale", e))
            }
            _ => {}
        }
        let listener = UnixListener::bind(socket).map_err(|e| with_path("binding", e))?;
        std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o600))
            .map_err(|e| with_path("setting the mode of", e))?;
        let (wake_read, wake_write) = pipe()?;
        let shared = Arc::new(Shared {
            array,
            fs,
            context,
            stop: AtomicBool::new(false),
            connections: AtomicUsize::new(0),
            replacing: Mutex::new(None),
        });
        let for_thread = Arc::clone(&shared);
        let acceptor = std::thread::Builder::new()
            .name("raidfs-control".into())
            .spawn(move || accept_loop(listener, wake_read, for_thread))?;
        log::info!("control socket {}", socket.display());
        Ok(ControlServer {
            socket: socket.to_path_buf(),
            shared,
            wake: Some(wake_write),
            acceptor: Some(acceptor),
        })
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Stop accepting, wait for connections to finish their request, and
    /// remove the socket (and the saved limits: the mount is over).
    pub fn stop(mut self) {
        self.shutdown();
        if let Some(limits) = &self.shared.context.saved_limits {
            let _ = std::fs::remove_file(limits);
        }
    }

    fn shutdown(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        // Closing the write end wakes the accept thread's poll.
        drop(self.wake.take());
        if let Some(acceptor) = self.acceptor.take() {
            if let Ok(connections) = acceptor.join() {
                for c in connections {
                    let _ = c.join();
                }
            }
            let _ = std::fs::remove_file(&self.socket);
        }
    }
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: fds has room for the two descriptors pipe2 writes.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both fds were just created and are owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Wait until the listener has a connection (true) or the wake pipe closes (false).
fn wait_readable(listener: &UnixListener, wake: &OwnedFd) -> bool {
    loop {
        let mut fds = [
            libc::pollfd {
                fd: listener.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: wake.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: fds is a valid array of two pollfds for the call's duration.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
        if n < 0 {
            if io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return false;
        }
        if fds[1].revents != 0 {
            return false;
        }
        if fds[0].revents != 0 {
            return true;
        }
    }
}

fn accept_loop(listener: UnixListener, wake: OwnedFd, shared: Arc<Shared>) -> Vec<JoinHandle<()>> {
    let mut threads: Vec<JoinHandle<()>> = Vec::new();
    while wait_readable(&listener, &wake) && !shared.stop.load(Ordering::Acquire) {
        let stream = match listener.accept() {
            Ok((stream, _)) => stream,
            Err(e) => {
                log::warn!("control socket: accept failed: {e}");
                continue;
            }
        };
        threads.retain(|t| !t.is_finished());
        if shared.connections.load(Ordering::Acquire) >= MAX_CONNECTIONS {
            let mut s = stream;
            let _ = send(
                &mut s,
                &Response::refused("too many control connections; try again"),
            );
            continue;
        }
        shared.connections.fetch_add(1, Ordering::AcqRel);
        let for_thread = Arc::clone(&shared);
        let spawned = std::thread::Builder::new()
            .name("raidfs-control-conn".into())
            .spawn(move || {
                if let Err(e) = serve_connection(stream, &for_thread) {
                    log::debug!("control connection ended: {e}");
                }
                for_thread.connections.fetch_sub(1, Ordering::AcqRel);
            });
        match spawned {
            Ok(t) => threads.push(t),
            Err(e) => {
                shared.connections.fetch_sub(1, Ordering::AcqRel);
                log::warn!("control socket: cannot start a connection thread: {e}");
            }
        }
    }
    threads
}

/// The uid of the process at the other end of `stream`.
fn peer_uid(stream: &UnixStream) -> io::Result<u32> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: cred and len are valid out pointers of the sizes getsockopt expects.
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(cred.uid)
}

fn send(stream: &mut UnixStream, response: &Response) -> io::Result<()> {
    let mut line = serde_json::to_vec(response).map_err(io::Error::other)?;
    line.push(b'\n');
    stream.write_all(&line)
}

fn serve_connection(stream: UnixStream, shared: &Shared) -> io::Result<()> {
    let uid = peer_uid(&stream)?;
    stream.set_read_timeout(Some(POLL_EVERY))?;
    let mut writer = stream.try_clone()?;
    let mut reader = BufReader::new(stream);
    let mut line = Vec::new();
    let mut last_request = Instant::now();
    loop {
        if shared.stop.load(Ordering::Acquire) {
            return Ok(());
        }
        match reader.read_until(b'\n', &mut line) {
            Ok(0) => return Ok(()),
            Ok(_) if line.ends_with(b"\n") => {
                let response = answer(&line, uid, shared);
                line.clear();
                last_request = Instant::now();
                send(&mut writer, &response)?;
            }
            Ok(_) => return Ok(()), // EOF in the middle of a line
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::Interrupted
                ) =>
            {
                if last_request.elapsed() > IDLE_LIMIT {
                    return Ok(());
                }
            }
            Err(e) => return Err(e),
        }
        if line.len() > MAX_LINE {
            send(&mut writer, &Response::refused("request too long"))?;
            return Ok(());
        }
    }
}

fn answer(line: &[u8], uid: u32, shared: &Shared) -> Response {
    let request: Request = match serde_json::from_slice(line) {
        Ok(r) => r,
        Err(e) => return Response::refused(format!("malformed request: {e}")),
    };
    let context = &shared.context;
    if request.changes_array() {
        if uid != 0 && uid != context.owner_uid {
            log::warn!("control: refused {request:?} from uid {uid}");
            return Response::refused(format!(
                "permission denied: only root or the mount's owner (uid {}) may change this array",
                context.owner_uid
            ));
        }
        if context.read_only {
            return Response::refused(match request {
                Request::Remount { .. } => {
                    "the array was assembled read-only (mounted ro): unmount it and mount it rw to write"
                }
                _ => "the array is mounted read-only",
            });
        }
        log::info!("control: {request:?} from uid {uid}");
    }
    let outcome = ops::execute(&shared.array, &shared.fs, context.read_only, &request);
    let message = match outcome {
        Ok(done) => {
            if let Some(r) = done.replacing {
                *shared.replacing.lock() = Some(r);
            }
            if let Request::SpeedLimit { .. } = request {
                save_limits(&shared.array, context);
            }
            if let Some(m) = &done.message {
                log::info!("control: {m}");
            }
            done.message
        }
        Err(e) => {
            if request.changes_array() || request == Request::Sync {
                log::warn!("control: refused: {e}");
            }
            return Response::refused(e);
        }
    };
    let origin = Origin {
        mount_point: &context.mount_point,
        owner_uid: context.owner_uid,
        read_only: context.read_only,
        replacing: shared.replacing.lock().clone(),
        fs: Some(&shared.fs),
    };
    Response::done(message, ArrayReport::collect(&shared.array, &origin))
}

fn save_limits(array: &Array, context: &MountContext) {
    let Some(path) = &context.saved_limits else {
        return;
    };
    let (min, max) = array.speed_limits();
    if let Err(e) = std::fs::write(path, format!("min={min}\nmax={max}\n")) {
        log::warn!("cannot keep the speed limits in {}: {e}", path.display());
    }
}

/// Apply limits kept by an earlier daemon of this mount (one that died
/// before unmounting), before background work resumes.
pub fn load_saved_limits(array: &Array, path: &Path) {
    let Ok(text) = std::fs::read_to_string(path) else {
        return;
    };
    let field = |name: &str| {
        text.lines().find_map(|l| {
            l.strip_prefix(name)?
                .strip_prefix('=')?
                .trim()
                .parse::<u64>()
                .ok()
        })
    };
    let (min, max) = (field("min"), field("max"));
    if min.is_some() || max.is_some() {
        array.set_speed_limits(min, max);
        let (min, max) = array.speed_limits();
        log::info!("speed limits kept from the last daemon: min {min} B/s, max {max} B/s");
    }
}
