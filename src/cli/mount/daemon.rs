//! The mount daemon: assembles the array, opens the filesystem, mounts it and
//! serves until unmounted, then closes everything so the array is clean.
//! By default it forks into the background and reports "mounted" (or why
//! not) to the waiting parent through a pipe, which until then also
//! carries the daemon's notices for the terminal (see [`crate::notice`]).

use std::ffi::CString;
use std::io::{BufRead, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use log::{debug, error, info, warn};

use super::logging::{self, Sink};
use super::options::MountOptions;
use super::registry::{self, DaemonRecord};
use crate::array::{assemble_paths, AssembleOptions, OpenPolicy};
use crate::fs::{FileSystem, FsOptions};
use crate::fuse::{self, Unmounter};
use crate::parity::Parity;
use crate::volume::Volume;

/// What to mount where, settled before forking.
pub struct MountPlan {
    pub members: Vec<PathBuf>,
    pub mount_point: PathBuf,
    pub options: MountOptions,
    pub log: LogDest,
    /// The source the mount shows; by default the array's identity.
    pub source: Option<String>,
    /// No "mounted on" line on success (notices are still relayed).
    pub quiet: bool,
}

/// Where the daemon logs (see [`super::logging`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LogDest {
    File(PathBuf),
    /// syslog, so systemd's journal when started by systemd.
    Syslog,
}

impl LogDest {
    fn file(&self) -> Option<&Path> {
        match self {
            LogDest::File(path) => Some(path),
            LogDest::Syslog => None,
        }
    }
}

impl std::fmt::Display for LogDest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LogDest::File(path) => write!(f, "{}", path.display()),
            LogDest::Syslog => write!(f, "syslog, `journalctl -t raidfs`"),
        }
    }
}

/// How the daemon tells the invoking process that the mount is up.
/// `Ok` carries what assembly decided (a degraded start, members re-added),
/// for the terminal.
type Report<'a> = &'a mut dyn FnMut(Result<Vec<String>, String>);

/// `raidfs mount -f`: serve in this process, logging to stderr.
pub fn run_foreground(plan: &MountPlan) -> i32 {
    logging::init(match plan.log {
        LogDest::Syslog if plan.options.log.is_some() => Sink::Syslog,
        _ => Sink::Stderr,
    });
    let mut report = |outcome: Result<Vec<String>, String>| match outcome {
        Ok(notes) => {
            for note in notes {
                eprintln!("raidfs: {note}");
            }
            info!("mounted on {}", plan.mount_point.display())
        }
        Err(msg) => eprintln!("raidfs: error: {msg}"),
    };
    let code = serve(plan, &mut report);
    // Counts of repeated messages still held back.
    log::logger().flush();
    code
}

/// `raidfs mount`: fork a daemon and wait until it reports.
pub fn run_background(plan: &MountPlan) -> i32 {
    let (read_end, write_end) = match pipe() {
        Ok(ends) => ends,
        Err(e) => return crate::cli::fail(format!("cannot create a pipe: {e}")),
    };
    // SAFETY: this process has not started any thread yet (nothing before
    // this point spawns one), so the child is a consistent copy.
    match unsafe { libc::fork() } {
        -1 => crate::cli::fail(format!("fork failed: {}", std::io::Error::last_os_error())),
        0 => {
            drop(read_end);
            let code = daemon_child(plan, write_end);
            std::process::exit(code)
        }
        _child => {
            drop(write_end);
            wait_for_report(read_end, plan)
        }
    }
}

/// Relay the daemon's notices (`NOTE ...`) to the terminal until it reports
/// `OK` or `ERR ...`.
fn wait_for_report(read_end: OwnedFd, plan: &MountPlan) -> i32 {
    let pipe = std::io::BufReader::new(std::fs::File::from(read_end));
    for line in pipe.lines() {
        let line = match line {
            Ok(line) => line,
            Err(e) => return crate::cli::fail(format!("reading from the mount daemon: {e}")),
        };
        if let Some(note) = line.strip_prefix("NOTE ") {
            eprintln!("raidfs: {note}");
            continue;
        }
        if line == "OK" {
            if plan.quiet {
                return 0;
            }
            println!(
                "raidfs: mounted on {} (log: {})",
                plan.mount_point.display(),
                plan.log
            );
            return 0;
        }
        return crate::cli::fail(line.strip_prefix("ERR ").unwrap_or(&line));
    }
    crate::cli::fail(format!(
        "the mount daemon exited before mounting; see {}",
        plan.log
    ))
}

fn daemon_child(plan: &MountPlan, write_end: OwnedFd) -> i32 {
    // The daemon lives as long as the mount, so a descriptor it inherited
    // from whoever ran `raidfs mount` (a shell's `exec 3>/mnt/other/f`, a
    // script's lock file) would stay open that long: a file on another
    // mount would keep that mount busy, a lock would stay held. Forked
    // without an exec, the daemon must drop them itself (close-on-exec
    // never fires); it keeps only its report pipe and stdio.
    close_inherited_fds(write_end.as_raw_fd());
    // Shared by the report and the notice sink: notices reach the waiting
    // `raidfs mount` until the report closes the pipe, then only the log.
    let pipe = Arc::new(Mutex::new(Some(std::fs::File::from(write_end))));
    let notes = Arc::clone(&pipe);
    crate::notice::set_sink(Some(Box::new(move |msg: &str| {
        warn!("{msg}");
        let mut pipe = notes.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(p) = pipe.as_mut() {
            // The parent may be gone (killed); the daemon carries on regardless.
            let _ = p.write_all(format!("NOTE {}\n", msg.replace('\n', " ")).as_bytes());
        }
    })));
    let mut report = |outcome: Result<Vec<String>, String>| {
        let taken = pipe.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(mut p) = taken {
            let line = match outcome {
                Ok(notes) => notes
                    .iter()
                    .map(|n| format!("NOTE {}\n", n.replace('\n', " ")))
                    .chain(["OK\n".to_string()])
                    .collect(),
                Err(msg) => format!("ERR {}\n", msg.replace('\n', " ")),
            };
            let _ = p.write_all(line.as_bytes());
        }
    };
    // SAFETY: setsid has no preconditions; it fails only if we already lead a group.
    unsafe { libc::setsid() };
    if let Err(msg) = redirect_stdio(plan.log.file()) {
        report(Err(msg));
        return 1;
    }
    logging::init(match plan.log {
        LogDest::File(_) => Sink::Stderr,
        LogDest::Syslog => Sink::Syslog,
    });
    info!(
        "raidfs {} daemon (pid {}) starting",
        env!("CARGO_PKG_VERSION"),
        std::process::id()
    );
    let _ = std::env::set_current_dir("/");
    let code = serve(plan, &mut report);
    // Counts of repeated messages still held back.
    log::logger().flush();
    code
}

/// Assemble, open, mount, report, serve; then close cleanly.
fn serve(plan: &MountPlan, report: Report<'_>) -> i32 {
    // Forked first: no thread may exist yet. Held open until we exit.
    let (_watcher_pipe, watcher) = if plan.options.auto_unmount {
        match start_unmount_watcher(&plan.mount_point) {
            Ok((pipe, pid)) => (Some(pipe), Some(pid)),
            Err(e) => {
                report(Err(format!("auto_unmount: cannot start the watcher: {e}")));
                return 1;
            }
        }
    } else {
        (None, None)
    };
    let stop = Arc::new(StopSignal::default());
    if let Err(e) = start_signal_thread(stop.clone()) {
        report(Err(format!("cannot set up signal handling: {e}")));
        return 1;
    }
    let read_only = plan.options.fuse.read_only;
    // Bound before anything is assembled, so an address that cannot be
    // served fails the mount instead of leaving it up without metrics.
    let metrics_listener = match plan.options.metrics {
        None => None,
        Some(address) => match crate::control::metrics_http::bind(address) {
            Ok(listener) => Some(listener),
            Err(e) => {
                report(Err(e));
                return 1;
            }
        },
    };

    let parity = match &plan.options.parity {
        None => None,
        Some(name) => match Parity::select(Some(name)) {
            Ok(p) => Some(&*Box::leak(Box::new(p))),
            Err(e) => {
                report(Err(format!("parity={name}: {e}")));
                return 1;
            }
        },
    };
    let assemble_opts = AssembleOptions {
        force: plan.options.force,
        read_only,
        parity,
        read_policy: plan.options.balance.unwrap_or_default(),
        rotational: plan.options.rotational,
        on_host_error: plan.options.on_host_error,
    };
    let policy = OpenPolicy {
        lock_wait: super::MEMBER_LOCK_WAIT,
        leave_out_unwritable: !read_only,
    };
    let (array, notes) = match assemble_paths(&plan.members, assemble_opts, policy) {
        Ok(assembly) => {
            super::tell_left_out(&assembly.left_out);
            // Members on hosts that are down come back when they answer.
            for (name, _) in &assembly.left_out {
                if crate::member::open::is_uri(std::path::Path::new(name)) {
                    assembly.array.await_member(name);
                }
            }
            for note in &assembly.notes {
                warn!("{note}");
            }
            let array = assembly.array;
            // Before the filesystem opens, so even its first reads avoid them.
            for member in &plan.options.write_mostly {
                match array.slot_of(member) {
                    Some(slot) => {
                        array.set_write_mostly(slot, true);
                        info!("slot {slot} ({member}) is write-mostly: read only when no other copy can serve");
                    }
                    None => warn!("write_mostly={member}: not a member of this array; ignored"),
                }
            }
            for member in &plan.options.failfast {
                if !crate::member::open::is_uri(std::path::Path::new(member)) {
                    warn!("failfast={member}: only NBD members (URIs) fail fast; ignored");
                } else if array.set_failfast(member) {
                    info!("{member} fails fast: a request stalled for 5 s fails it, with no reconnection");
                } else {
                    warn!("failfast={member}: only NBD members fail fast; ignored");
                }
            }
            (Arc::new(array), assembly.notes)
        }
        Err(e) => {
            report(Err(format!("cannot assemble the array: {e}")));
            return 1;
        }
    };
    // The benchmark table is for whoever asks (RUST_LOG=debug, `raidfs
    // bench`); every mount logs which kernels it uses.
    for line in array.parity().report() {
        debug!("{line}");
    }
    info!("{}", array.parity().summary());
    let status = array.status();
    info!(
        "array {} ({}, {} members {}, events {}, {})",
        status.uuid,
        status.level,
        status.members.len(),
        status.map,
        status.events,
        status.state
    );
    for m in status
        .members
        .iter()
        .filter(|m| m.state != crate::array::MemberState::Active)
    {
        warn!(
            "array is degraded: slot {} ({}) is {}",
            m.slot, m.name, m.state
        );
    }
    if !read_only {
        // A daemon that died mid-rebuild left its speed limits behind: the
        // resumed rebuild keeps to them (loaded before the volume starts it).
        let socket = crate::cli::status::socket_path(&plan.mount_point);
        crate::control::load_saved_limits(&array, &crate::control::saved_limits_path(&socket));
    }
    let fs_opts = FsOptions {
        read_only,
        deferred_writes: plan
            .options
            .deferred_writes
            .unwrap_or(plan.options.fuse.threads / 2),
        queued_writes: plan
            .options
            .queued_writes
            .unwrap_or(super::options::DEFAULT_QUEUED_WRITES),
        queue_spin: if plan.options.fuse.busy_poll.is_zero() {
            std::time::Duration::ZERO
        } else {
            super::options::QUEUE_SPIN
        },
        commit_interval_secs: plan
            .options
            .commit_secs
            .unwrap_or(FsOptions::default().commit_interval_secs),
        atime: plan.options.vfs.atime_mode(),
        diratime: !plan.options.vfs.has(libc::MS_NODIRATIME),
        metadata_cache: plan
            .options
            .metadata_cache
            .unwrap_or(crate::fs::DEFAULT_METADATA_CACHE),
    };
    if !read_only {
        info!(
            "the journal is committed every {} s (commit=); fsync, O_SYNC and `raidfs sync` commit at once",
            fs_opts.commit_interval_secs
        );
        match (fs_opts.deferred_writes, fs_opts.queued_writes) {
            (0, _) => info!("every write is answered once it is done (deferred_writes=0)"),
            (n, 0) => info!(
                "writes of 16 KiB or more answered before they are done: up to {n} at a time (deferred_writes); smaller ones are done first (queued_writes=0); fsync waits for them"
            ),
            (n, q) => info!(
                "writes of 16 KiB or more answered before they are done: up to {n} at a time (deferred_writes); smaller ones queued for the writer thread, up to {q} waiting (queued_writes); fsync waits for them"
            ),
        }
    }
    // Marks the array dirty, opens the filesystem, then starts the
    // background work, in that order (see crate::volume).
    let volume = match Volume::open(array.clone(), fs_opts) {
        Ok(volume) => volume,
        Err(e) => {
            report(Err(e.to_string()));
            return 1;
        }
    };
    let fuse_config = fuse::MountConfig {
        source: plan.source.clone().unwrap_or_else(|| {
            super::identity::Identity::of_array(&status.name, array.uuid()).source()
        }),
        ..plan.options.fuse.clone()
    };
    info!("the mount's source is {}", fuse_config.source);
    let handle = match fuse::mount(volume.fs().clone(), &plan.mount_point, &fuse_config) {
        Ok(handle) => handle,
        Err(e) => {
            // A failed session that got as far as serving closed the
            // filesystem when dropped; closing the volume then only marks
            // the array clean.
            if let Err(e) = volume.close() {
                warn!("{e}");
            }
            report(Err(e.to_string()));
            return 1;
        }
    };
    if let Err(msg) = super::options::apply_vfs_flags(&plan.mount_point, plan.options.vfs) {
        // A mount asked to be noexec or nosuid must not stay up without it.
        if let Err(e) = handle.unmount() {
            warn!("{e}");
        }
        if let Err(e) = volume.close() {
            warn!("{e}");
        }
        report(Err(msg));
        return 1;
    }
    let record = DaemonRecord {
        watcher,
        members: plan.members.clone(),
        ..DaemonRecord::for_self(&plan.mount_point, plan.log.file().map(Path::to_path_buf))
    };
    if let Err(e) = registry::write(&record) {
        warn!("cannot record the daemon's state ({e}); `raidfs umount` will not wait for it");
    }
    keep_damaged_log(volume.fs(), &status.uuid, read_only);
    let control = start_control(plan, volume.array(), volume.fs(), read_only);
    let metrics = metrics_listener.and_then(|listener| {
        let context = mount_context(plan, read_only);
        match crate::control::metrics_http::MetricsServer::start(
            listener,
            volume.array().clone(),
            volume.fs().clone(),
            context,
        ) {
            Ok(server) => Some(server),
            Err(e) => {
                warn!("cannot start the metrics endpoint: {e}");
                None
            }
        }
    });
    stop.arm(handle.unmounter());
    report(Ok(notes));
    info!(
        "serving {} from {} members",
        plan.mount_point.display(),
        plan.members.len()
    );

    let outcome = handle.wait();
    drop(metrics);
    if let Some(server) = control {
        server.stop();
    }
    let closed = match outcome {
        // The session has closed the filesystem; the volume marks the array clean.
        Ok(()) => volume.close().map_err(|e| e.to_string()),
        Err(e) => {
            // The filesystem did not close cleanly: the array stays dirty
            // so that its next assembly resyncs it.
            volume.abandon();
            Err(e.to_string())
        }
    };
    match closed {
        Ok(()) => {
            registry::remove(&plan.mount_point);
            info!(
                "unmounted {}; array closed cleanly",
                plan.mount_point.display()
            );
            0
        }
        Err(msg) => {
            error!("closing {}: {msg}", plan.mount_point.display());
            let failed = DaemonRecord {
                error: Some(msg),
                ..record
            };
            if registry::write(&failed).is_err() {
                registry::remove(&plan.mount_point);
            }
            1
        }
    }
}

/// The control socket (`raidfs status`, `fail`, `add`, ...). The mount
/// works without it, so a failure is only logged.
fn start_control(
    plan: &MountPlan,
    array: &Arc<crate::array::Array>,
    fs: &Arc<FileSystem>,
    read_only: bool,
) -> Option<crate::control::ControlServer> {
    let socket = crate::cli::status::socket_path(&plan.mount_point);
    let context = mount_context(plan, read_only);
    match crate::control::ControlServer::start(&socket, array.clone(), fs.clone(), context) {
        Ok(server) => Some(server),
        Err(e) => {
            warn!("no control socket ({e}); `raidfs status` and member changes will not reach this mount");
            None
        }
    }
}

fn mount_context(plan: &MountPlan, read_only: bool) -> crate::control::MountContext {
    let socket = crate::cli::status::socket_path(&plan.mount_point);
    crate::control::MountContext {
        mount_point: plan.mount_point.clone(),
        // SAFETY: getuid has no preconditions and cannot fail.
        owner_uid: unsafe { libc::getuid() },
        read_only,
        saved_limits: Some(crate::control::saved_limits_path(&socket)),
    }
}

/// Keep the filesystem's damaged-data log in this user's state directory,
/// by array UUID, so a later mount lists what an earlier one found. A
/// read-only mount reads it but keeps what it finds in memory only.
fn keep_damaged_log(fs: &Arc<FileSystem>, uuid: &str, read_only: bool) {
    let Some(path) = super::places::Env::current().damaged_log(uuid) else {
        warn!("no state directory: damaged data found by this mount is not kept after it");
        return;
    };
    if read_only && !path.exists() {
        return;
    }
    if let Err(e) = fs.keep_damaged_log(&path) {
        warn!("{e}; damaged data found by this mount is not kept after it");
    }
}

/// SIGTERM/SIGINT/SIGHUP unmount the filesystem (the session then ends and
/// the array is closed by the main thread). A signal that arrives before
/// the mount is up is remembered and acted on as soon as it is.
#[derive(Default)]
struct StopSignal {
    unmounter: OnceLock<Unmounter>,
    requested: AtomicBool,
}

impl StopSignal {
    fn arm(&self, unmounter: Unmounter) {
        let unmounter = self.unmounter.get_or_init(|| unmounter);
        if self.requested.load(Ordering::SeqCst) {
            stop_now(unmounter);
        }
    }

    fn fire(&self) {
        self.requested.store(true, Ordering::SeqCst);
        if let Some(unmounter) = self.unmounter.get() {
            stop_now(unmounter);
        }
    }
}

fn stop_now(unmounter: &Unmounter) {
    if let Err(e) = unmounter.unmount() {
        error!("{e}");
    }
}

fn start_signal_thread(stop: Arc<StopSignal>) -> std::io::Result<()> {
    // SAFETY: the sigset is initialised by sigemptyset before use; blocking
    // here, before any other thread starts, makes every later thread
    // inherit the mask so only sigwait sees these signals.
    let set = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for sig in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
            libc::sigaddset(&mut set, sig);
        }
        let rc = libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        if rc != 0 {
            return Err(std::io::Error::from_raw_os_error(rc));
        }
        set
    };
    std::thread::Builder::new()
        .name("raidfs-signals".into())
        .spawn(move || loop {
            let mut sig: libc::c_int = 0;
            // SAFETY: set is a valid, initialised sigset and sig a valid out pointer.
            if unsafe { libc::sigwait(&set, &mut sig) } == 0 {
                info!("signal {sig}: unmounting");
                stop.fire();
            }
        })?;
    Ok(())
}

/// `auto_unmount`: a small child process that waits for this daemon to die
/// (its end of a pipe reaches EOF) and, if the daemon did not finish
/// cleanly (its state record is still there) and a raidfs mount is still
/// on the mount point, detaches it so the directory does not stay dead.
/// Returns the write end, which this process must keep open, and the pid.
fn start_unmount_watcher(mount_point: &Path) -> std::io::Result<(OwnedFd, u32)> {
    let (read_end, write_end) = pipe()?;
    // SAFETY: called before this process starts any thread.
    match unsafe { libc::fork() } {
        -1 => Err(std::io::Error::last_os_error()),
        0 => {
            drop(write_end);
            // SAFETY: keep only stdio and our pipe (moved to fd 3): the
            // daemon's other descriptors (the report pipe) must not stay open here.
            unsafe {
                if read_end.as_raw_fd() != 3 {
                    libc::dup2(read_end.as_raw_fd(), 3);
                }
                libc::syscall(libc::SYS_close_range, 4u32, u32::MAX, 0u32);
                libc::setsid();
            }
            std::mem::forget(read_end);
            // SAFETY: fd 3 is the pipe's read end, owned here alone.
            let mut pipe = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(3) });
            let mut sink = Vec::new();
            let _ = pipe.read_to_end(&mut sink);
            let crashed = matches!(registry::read(mount_point), Ok(Some(_)));
            let still_mounted = matches!(fuse::mounts::mount_at(mount_point), Ok(Some(e)) if fuse::is_raidfs_mount(&e));
            if crashed {
                registry::remove(mount_point);
            }
            if crashed && still_mounted {
                let _ = fuse::mounts::unmount(mount_point, true);
                eprintln!(
                    "raidfs: the daemon died; detached {}",
                    mount_point.display()
                );
            }
            std::process::exit(0)
        }
        watcher => {
            drop(read_end);
            Ok((write_end, watcher as u32))
        }
    }
}

/// Point stdin at /dev/null and stdout/stderr at the log file. Logging to
/// syslog, stdout and stderr stay where systemd put them (the journal, so
/// a panic is seen there too) or, outside systemd, go to /dev/null, as the
/// terminal that started the daemon goes away.
fn redirect_stdio(log: Option<&Path>) -> Result<(), String> {
    let devnull = open_fd(Path::new("/dev/null"), libc::O_RDWR)?;
    let out = match log {
        Some(log) => Some(open_fd(
            log,
            libc::O_WRONLY | libc::O_CREAT | libc::O_APPEND,
        )?),
        None if std::env::var_os("JOURNAL_STREAM").is_some() => None,
        None => Some(open_fd(Path::new("/dev/null"), libc::O_WRONLY)?),
    };
    // SAFETY: the fds are open; dup2 onto 0..2 replaces the std streams.
    unsafe {
        libc::dup2(devnull.as_raw_fd(), 0);
        if let Some(out) = &out {
            libc::dup2(out.as_raw_fd(), 1);
            libc::dup2(out.as_raw_fd(), 2);
        }
    }
    Ok(())
}

fn open_fd(path: &Path, flags: i32) -> Result<OwnedFd, String> {
    let c_path = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| format!("{}: NUL in path", path.display()))?;
    // SAFETY: c_path is NUL-terminated; the mode argument is read only with O_CREAT.
    let fd = unsafe { libc::open(c_path.as_ptr(), flags | libc::O_CLOEXEC, 0o640) };
    if fd < 0 {
        return Err(format!(
            "{}: {}",
            path.display(),
            std::io::Error::last_os_error()
        ));
    }
    // SAFETY: fd was just opened and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Close every descriptor above stdio except `keep`. Runs in the forked
/// daemon before any thread exists, so no descriptor is opened meanwhile.
fn close_inherited_fds(keep: i32) {
    let Ok(entries) = std::fs::read_dir("/proc/self/fd") else {
        // Without /proc the daemon keeps what it inherited, as before.
        return;
    };
    let fds: Vec<i32> = entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    // The directory's own descriptor is among them and closed by now; a
    // second close of it fails harmlessly with EBADF.
    for fd in fds.into_iter().filter(|&fd| fd > 2 && fd != keep) {
        // SAFETY: closing a descriptor number this process owns; nothing in
        // this single-threaded process holds it as an OwnedFd (the report
        // pipe, the only one, is `keep`).
        unsafe { libc::close(fd) };
    }
}

fn pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: fds has room for the two descriptors pipe2 writes.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: both fds were just created and are owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}
