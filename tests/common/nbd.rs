//! NBD servers for tests: nbdkit (or qemu-nbd) serving on a Unix socket in
//! a temporary directory or on a free 127.0.0.1 port, started by the test
//! and polled until it accepts connections. The guard kills the server
//! however the test ends (and nbdkit exits with the test process too).

use std::net::TcpListener;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// True when nbdkit and qemu-nbd are installed (`.ci/run` installs
/// them); the NBD tests print why and pass vacuously otherwise.
pub fn nbd_available() -> bool {
    let has = |tool: &str| {
        Command::new(tool)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    let ok = has("nbdkit") && has("qemu-nbd");
    if !ok {
        eprintln!("skipping: the NBD tests need nbdkit and qemu-nbd");
    }
    ok
}

/// Where a server listens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Listen {
    Unix,
    Tcp,
}

/// A running NBD server and the URI of its export.
pub struct NbdServer {
    child: Option<Child>,
    pub uri: String,
    /// Holds the socket and the server's stderr.
    pub dir: tempfile::TempDir,
    /// Where it listens (a restart listens there again).
    at: At,
}

/// A port that was free a moment ago (the server binds it next; a clash
/// makes the start fail and retry), and never one handed out before in
/// this process: a test restarts its server on its port, which must not
/// meanwhile go to another test's server.
fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        if !given.contains(&port) {
            given.push(port);
            return port;
        }
    }
}

impl NbdServer {
    /// `nbdkit [--filter=…] PLUGIN ARGS…` (filters and arguments as given).
    pub fn nbdkit(listen: Listen, args: &[&str]) -> NbdServer {
        NbdServer::start(listen, |at| nbdkit_command(at, args))
    }

    /// Kill the server and start nbdkit with `args` where it listened (the
    /// same URI), waiting until it accepts: a server restart.
    pub fn restart_nbdkit(&mut self, args: &[&str]) {
        self.kill();
        if let At::Unix(socket) = &self.at {
            // A killed server leaves its socket file behind.
            let _ = std::fs::remove_file(socket);
        }
        let child = spawn(
            &self.at,
            self.dir.path(),
            &mut nbdkit_command(&self.at, args),
        )
        .unwrap_or_else(|| panic!("the NBD server would not restart: {}", self.log()));
        self.child = Some(child);
    }

    /// nbdkit's file plugin over an image file.
    pub fn file(listen: Listen, image: &Path) -> NbdServer {
        let file = format!("file={}", image.display());
        NbdServer::nbdkit(listen, &["file", &file])
    }

    /// qemu-nbd over a raw image (it answers sparse reads with holes).
    pub fn qemu(image: &Path) -> NbdServer {
        NbdServer::start(Listen::Unix, |at| {
            let mut cmd = Command::new("qemu-nbd");
            let At::Unix(socket) = at else {
                unreachable!("qemu-nbd is started on a Unix socket")
            };
            cmd.args(["--format=raw", "--persistent", "--socket"])
                .arg(socket)
                .arg(image);
            cmd
        })
    }

    fn start(listen: Listen, command: impl Fn(&At) -> Command) -> NbdServer {
        let dir = tempfile::tempdir().expect("temp dir");
        for _attempt in 0..5 {
            let at = match listen {
                Listen::Unix => At::Unix(dir.path().join("nbd.sock")),
                Listen::Tcp => At::Tcp(free_port()),
            };
            // None: it exited first (its port was taken, say): try again.
            if let Some(child) = spawn(&at, dir.path(), &mut command(&at)) {
                let uri = match &at {
                    At::Unix(socket) => format!("nbd+unix:///?socket={}", socket.display()),
                    At::Tcp(port) => format!("nbd://127.0.0.1:{port}/"),
                };
                return NbdServer {
                    child: Some(child),
                    uri,
                    dir,
                    at,
                };
            }
        }
        panic!(
            "the NBD server would not start: {}",
            std::fs::read_to_string(dir.path().join("server.log")).unwrap_or_default()
        );
    }

    pub fn pid(&self) -> i32 {
        self.child.as_ref().expect("server running").id() as i32
    }

    /// SIGKILL the server and reap it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Freeze the server (SIGSTOP), a hung host: returns once every one
    /// of its threads is stopped, so no request is served after this.
    pub fn freeze(&self) {
        // SAFETY: kill with the pid of our own child.
        unsafe { libc::kill(self.pid(), libc::SIGSTOP) };
        let deadline = Instant::now() + Duration::from_secs(10);
        while !all_stopped(self.pid()) {
            assert!(Instant::now() < deadline, "the server did not stop");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Let a frozen server go on (SIGCONT).
    pub fn thaw(&self) {
        // SAFETY: kill with the pid of our own child.
        unsafe { libc::kill(self.pid(), libc::SIGCONT) };
    }

    /// Whether the server process is still there.
    pub fn alive(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| c.try_wait().is_ok_and(|status| status.is_none()))
    }

    /// What the server printed.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }
}

impl Drop for NbdServer {
    fn drop(&mut self) {
        // SIGKILL ends a stopped server too.
        self.kill();
    }
}

/// Whether every thread of `pid` is in the stopped state (`T`).
fn all_stopped(pid: i32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks.filter_map(|t| t.ok()).all(|t| {
        std::fs::read_to_string(t.path().join("stat"))
            .ok()
            .and_then(|stat| {
                let (_, after) = stat.rsplit_once(") ")?;
                after.chars().next()
            })
            .is_some_and(|state| state == 'T')
    })
}

fn nbdkit_command(at: &At, args: &[&str]) -> Command {
    let mut cmd = Command::new("nbdkit");
    cmd.args(["--foreground", "--exit-with-parent"]);
    match at {
        At::Unix(socket) => {
            cmd.arg("--unix").arg(socket);
        }
        At::Tcp(port) => {
            cmd.args(["--ipaddr", "127.0.0.1", "--port", &port.to_string()]);
        }
    }
    cmd.args(args);
    cmd
}

/// Start a server and poll until it accepts connections at `at`; None if
/// it exits first. Its stderr goes to `server.log` in `dir`.
fn spawn(at: &At, dir: &Path, command: &mut Command) -> Option<Child> {
    let stderr = std::fs::File::create(dir.join("server.log")).expect("log");
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .expect("start the NBD server");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let up = match at {
            At::Unix(socket) => UnixStream::connect(socket).is_ok(),
            // Not a connect: another test's server may have taken the port
            // first, and a connect would then reach it while this one exits.
            At::Tcp(port) => listens_on(child.id(), *port),
        };
        if up {
            return Some(child);
        }
        if child.try_wait().expect("server status").is_some() {
            return None;
        }
        assert!(
            Instant::now() < deadline,
            "the NBD server did not start listening: {}",
            std::fs::read_to_string(dir.join("server.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

enum At {
    Unix(PathBuf),
    Tcp(u16),
}

/// Whether process `pid` holds a socket listening on 127.0.0.1:`port`
/// (its descriptors against the kernel's table of TCP sockets).
fn listens_on(pid: u32, port: u16) -> bool {
    let Ok(table) = std::fs::read_to_string(format!("/proc/{pid}/net/tcp")) else {
        return false;
    };
    let local = format!("0100007F:{port:04X}");
    let listening: Vec<String> = table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // local_address, st (0A is LISTEN), inode.
            (fields.len() > 9 && fields[1] == local && fields[3] == "0A")
                .then(|| format!("socket:[{}]", fields[9]))
        })
        .collect();
    if listening.is_empty() {
        return false;
    }
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    fds.filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
        .any(|target| listening.iter().any(|l| target.as_os_str() == l.as_str()))
}

/// A sparse image file of `size` bytes at `path`.
pub fn sparse_image(path: &Path, size: u64) {
    let f = std::fs::File::create(path).expect("create image");
    f.set_len(size).expect("size image");
}
