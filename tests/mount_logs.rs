//! The mount daemon's log: one per array, named by the array whatever the
//! mount point is called; a clean mount and unmount log no warning or error;
//! a storm of requests raidfs refuses does not grow the log; the parity
//! benchmark table only at debug level.

mod ecosystem_support;

use std::fs;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Command;

use ecosystem_support::*;

/// Unmounts (lazily if it must) and removes the default log when dropped,
/// so a failing test leaves neither behind.
struct Mounted {
    mnt: PathBuf,
    log: Option<PathBuf>,
}

impl Mounted {
    /// `raidfs mount` of `array` with `options`, outside systemd (where
    /// the log would go to the journal); the log's path as the mount said it.
    fn new(array: &Array, options: &[&str]) -> Mounted {
        let mut cmd = raidfs();
        cmd.arg("mount")
            .env_remove("INVOCATION_ID")
            .env_remove("JOURNAL_STREAM")
            .env_remove("RUST_LOG");
        for o in options {
            cmd.args(["-o", o]);
        }
        let out = check(cmd.args(array.members()).arg(array.mnt()));
        let said = String::from_utf8_lossy(&out.stdout).to_string();
        let log = said
            .split("(log: ")
            .nth(1)
            .and_then(|rest| rest.split(')').next())
            .map(PathBuf::from);
        Mounted {
            mnt: array.mnt(),
            log,
        }
    }

    fn log_path(&self) -> &Path {
        self.log.as_deref().expect("`raidfs mount` names its log")
    }

    fn umount(&self) {
        let record = daemon(&self.mnt);
        check(raidfs().arg("umount").arg(&self.mnt));
        assert_daemon_finished(&record, &self.mnt);
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if mount_options(&self.mnt).is_some() {
            let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
        }
    }
}

/// Removes the files it holds when dropped.
struct RemoveOnDrop(Vec<PathBuf>);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        for path in &self.0 {
            let _ = fs::remove_file(path);
        }
    }
}

fn warnings_and_errors(log: &str) -> Vec<&str> {
    log.lines()
        .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
        .collect()
}

#[test]
fn two_arrays_on_two_mount_points_called_mnt_get_two_logs() {
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipping: the default log directory is root's");
        return;
    }
    let arrays = [Array::new(), Array::new()];
    let mut cleanup = RemoveOnDrop(Vec::new());
    let mut logs = Vec::new();
    for array in &arrays {
        assert_eq!(array.mnt().file_name().unwrap(), "mnt");
        let mounted = Mounted::new(array, &[]);
        let log = mounted.log_path().to_path_buf();
        cleanup.0.push(log.clone());
        assert_eq!(
            log.file_name().unwrap().to_string_lossy(),
            format!("{}.log", array.uuid),
            "an unnamed array's log is named by its UUID"
        );
        mounted.umount();
        logs.push(log);
    }
    assert_ne!(logs[0], logs[1]);
    for (array, log) in arrays.iter().zip(&logs) {
        let text = fs::read_to_string(log).unwrap_or_else(|e| panic!("{}: {e}", log.display()));
        assert!(
            text.contains(&format!("serving {}", array.mnt().display())),
            "{text}"
        );
        assert!(
            !text.contains(&arrays[0].uuid) || !text.contains(&arrays[1].uuid),
            "one log holds both arrays:\n{text}"
        );
        // One line for the chosen kernels; the benchmark table is debug.
        assert!(text.contains("parity kernels: xor "), "{text}");
        assert!(!text.contains(" gen() "), "{text}");
        assert_eq!(warnings_and_errors(&text), Vec::<&str>::new(), "{text}");
        assert!(text.contains("array closed cleanly"), "{text}");
    }
}

#[test]
fn a_clean_unmount_logs_no_warning_at_any_log_level() {
    for level in ["info", "debug"] {
        let array = Array::new();
        let log = array.path("daemon.log");
        let mnt = array.mnt();
        let _guard = Mounted {
            mnt: mnt.clone(),
            log: None,
        };
        check(
            raidfs()
                .arg("mount")
                .env("RUST_LOG", level)
                .args(["-o", &array.log_option()])
                .args(array.members())
                .arg(&mnt),
        );
        let record = daemon(&mnt);
        check(raidfs().arg("umount").arg(&mnt));
        assert_daemon_finished(&record, &mnt);
        let text = fs::read_to_string(&log).unwrap();
        assert!(text.contains("array closed cleanly"), "{text}");
        assert_eq!(
            warnings_and_errors(&text),
            Vec::<&str>::new(),
            "RUST_LOG={level}:\n{text}"
        );
        if level == "debug" {
            // The benchmark table is there for whoever asks.
            assert!(text.contains(" gen() "), "{text}");
        }
    }
}

#[test]
fn a_named_array_logs_under_its_name() {
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipping: the default log directory is root's");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    check(
        raidfs()
            .args(["create", "-l", "1", "-s", "64M", "--name", "logtest"])
            .args(["a.img", "b.img"])
            .current_dir(dir.path()),
    );
    fs::create_dir(dir.path().join("data")).unwrap();
    let out = check(
        raidfs()
            .arg("mount")
            .env_remove("INVOCATION_ID")
            .env_remove("JOURNAL_STREAM")
            .args(["a.img", "b.img", "data"])
            .current_dir(dir.path()),
    );
    let mnt = dir.path().join("data");
    let guard = Mounted {
        mnt: mnt.clone(),
        log: None,
    };
    let said = String::from_utf8_lossy(&out.stdout).to_string();
    let examined = check(
        raidfs()
            .args(["examine", "--json", "a.img"])
            .current_dir(dir.path()),
    );
    let json: serde_json::Value = serde_json::from_slice(&examined.stdout).unwrap();
    let uuid = json[0]["array_uuid"].as_str().unwrap().to_string();
    let log = PathBuf::from(format!("/var/log/raidfs/logtest-{}.log", &uuid[..8]));
    let _cleanup = RemoveOnDrop(vec![log.clone()]);
    assert!(
        said.contains(&format!("(log: {})", log.display())),
        "{said}"
    );
    guard.umount();
    assert!(log.is_file());
}

#[test]
fn an_ioctl_storm_does_not_grow_the_log() {
    let array = Array::new();
    let log_option = array.log_option();
    let mounted = Mounted::new(&array, &[&log_option]);
    let file = array.mnt().join("f");
    fs::write(&file, b"x").unwrap();
    let opened = fs::File::open(&file).unwrap();
    let quiet = fs::read_to_string(mounted.log_path())
        .unwrap()
        .lines()
        .count();
    // FS_IOC_GETFLAGS, as lsattr and overlayfs ask: refused (ENOTTY) every time.
    let mut flags: libc::c_long = 0;
    for _ in 0..2000 {
        // SAFETY: a valid open fd and a pointer to a long, as FS_IOC_GETFLAGS wants.
        let rc = unsafe {
            libc::ioctl(
                opened.as_raw_fd(),
                0x8008_6601, // FS_IOC_GETFLAGS
                &mut flags as *mut libc::c_long,
            )
        };
        assert_eq!(rc, -1);
    }
    drop(opened);
    mounted.umount();
    let text = fs::read_to_string(mounted.log_path()).unwrap();
    let grown = text.lines().count() - quiet;
    // The unmount's few lines, and at most one burst of anything repeated.
    assert!(grown <= 15, "{grown} lines after 2000 ioctls:\n{text}");
    assert_eq!(warnings_and_errors(&text), Vec::<&str>::new(), "{text}");
}

/// Removes the socket it bound at /dev/log when dropped.
struct DevLog(std::os::unix::net::UnixDatagram);

impl Drop for DevLog {
    fn drop(&mut self) {
        let _ = fs::remove_file("/dev/log");
    }
}

#[test]
fn log_syslog_sends_the_daemons_records_to_syslog() {
    if Path::new("/dev/log").exists() || unsafe { libc::geteuid() } != 0 {
        eprintln!("skipping: a syslog daemon owns /dev/log here (or not root)");
        return;
    }
    // Stand in for the syslog daemon (journald's /dev/log socket).
    let socket = match std::os::unix::net::UnixDatagram::bind("/dev/log") {
        Ok(socket) => DevLog(socket),
        Err(e) => {
            eprintln!("skipping: cannot bind /dev/log: {e}");
            return;
        }
    };
    socket
        .0
        .set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    // Read as the records come (a datagram socket's queue is short, and a
    // full one would hold the daemon's writes), until the daemon's last.
    let reader = socket.0.try_clone().unwrap();
    let collect = std::thread::spawn(move || {
        let mut seen: Vec<String> = Vec::new();
        let mut buf = vec![0u8; 8192];
        while !seen.iter().any(|m| m.contains("array closed cleanly")) {
            match reader.recv(&mut buf) {
                Ok(n) => seen.push(String::from_utf8_lossy(&buf[..n]).to_string()),
                Err(_) => break,
            }
        }
        seen
    });
    let array = Array::new();
    let mounted = Mounted::new(&array, &["log=syslog"]);
    assert_eq!(
        mounted.log.as_deref(),
        Some(Path::new("syslog, `journalctl -t raidfs`"))
    );
    let record = daemon(&array.mnt());
    assert_eq!(record.log, None, "no log file when logging to syslog");
    mounted.umount();
    let seen = collect.join().unwrap();
    assert!(
        seen.iter().any(|m| m.contains("array closed cleanly")),
        "{seen:#?}"
    );
    // <PRI>: facility daemon (3), so 24 + severity; ident raidfs[pid].
    let serving = seen
        .iter()
        .find(|m| m.contains(&format!("serving {}", array.mnt().display())))
        .unwrap_or_else(|| panic!("no 'serving' record: {seen:#?}"));
    assert!(
        serving.starts_with("<30>"),
        "info in facility daemon: {serving}"
    );
    assert!(serving.contains("raidfs["), "{serving}");
}
