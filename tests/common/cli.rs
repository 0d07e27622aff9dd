//! Driving the `raidfs` binary from tests: run a command, require success
//! (printing its output when it fails), read `detail --json`, and a writer
//! thread that keeps writing checkable files through a mount.

use std::ffi::OsStr;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rand::{RngCore, SeedableRng};

/// Run `raidfs ARGS` in `cwd`.
pub fn raidfs<S: AsRef<OsStr>>(args: &[S], cwd: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_raidfs"))
        .args(args)
        .current_dir(cwd)
        .output()
        .expect("run raidfs")
}

pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Require that `out`, the output of `what`, is a success (showing what
/// it printed when not); returns it.
pub fn check(out: Output, what: &str) -> Output {
    assert!(
        out.status.success(),
        "{what} failed ({})\nstdout: {}\nstderr: {}",
        out.status,
        stdout(&out),
        stderr(&out)
    );
    out
}

/// Run `raidfs ARGS` and require success; returns stdout.
pub fn raidfs_ok<S: AsRef<OsStr>>(args: &[S], cwd: &Path) -> String {
    let shown: Vec<String> = args
        .iter()
        .map(|a| a.as_ref().to_string_lossy().into_owned())
        .collect();
    let out = check(raidfs(args, cwd), &format!("raidfs {}", shown.join(" ")));
    stdout(&out)
}

/// A two-way mirror of 64 MiB image files `m0` and `m1` in a temporary
/// directory, with a mount point `mnt` there; its daemons log to
/// `daemon.log` beside the images.
pub struct Mirror {
    pub dir: tempfile::TempDir,
    pub mnt: PathBuf,
}

impl Mirror {
    pub fn create() -> Mirror {
        let dir = tempfile::tempdir().expect("temp dir");
        raidfs_ok(&["create", "-l", "1", "-s", "64M", "m0", "m1"], dir.path());
        let mnt = dir.path().join("mnt");
        fs::create_dir(&mnt).expect("mount point");
        let mnt = mnt.canonicalize().expect("mount point path");
        Mirror { dir, mnt }
    }

    /// `raidfs mount -o log=daemon.log[,OPTIONS] m0 m1 mnt`.
    pub fn mount_with(&self, options: &str) -> Output {
        let mut all = format!("log={}", self.dir.path().join("daemon.log").display());
        if !options.is_empty() {
            all = format!("{all},{options}");
        }
        let args = [
            OsStr::new("mount"),
            OsStr::new("-o"),
            OsStr::new(&all),
            OsStr::new("m0"),
            OsStr::new("m1"),
            self.mnt.as_os_str(),
        ];
        raidfs(&args, self.dir.path())
    }

    pub fn umount(&self) {
        raidfs_ok(
            &[OsStr::new("umount"), self.mnt.as_os_str()],
            self.dir.path(),
        );
    }

    /// What the daemons logged.
    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.path().join("daemon.log")).expect("daemon log")
    }
}

/// `raidfs detail --json MOUNT_POINT`.
pub fn detail_json(mount_point: &Path) -> serde_json::Value {
    let text = raidfs_ok(
        &[
            OsStr::new("detail"),
            OsStr::new("--json"),
            mount_point.as_os_str(),
        ],
        Path::new("/"),
    );
    serde_json::from_str(&text).expect("detail --json is JSON")
}

/// Poll `detail --json` until `done` holds (a condition on the daemon's
/// state, so the test waits for an outcome, not a guessed time).
pub fn wait_for_detail(
    mount_point: &Path,
    what: &str,
    timeout: Duration,
    done: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = Instant::now() + timeout;
    loop {
        let report = detail_json(mount_point);
        if done(&report) {
            return report;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}; last report: {report:#}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The bytes of writer file `index`: its length and content follow from the index.
pub fn file_contents(index: usize) -> Vec<u8> {
    let len = 16 * 1024 + (index * 7919) % (64 * 1024);
    let mut bytes = vec![0u8; len];
    rand::rngs::StdRng::seed_from_u64(index as u64 ^ 0x5eed).fill_bytes(&mut bytes);
    bytes
}

/// A thread writing `w<N>` files (fsynced) into a directory until stopped.
pub struct Writer {
    stop: Arc<AtomicBool>,
    written: Arc<AtomicUsize>,
    handle: Option<JoinHandle<std::io::Result<usize>>>,
    dir: PathBuf,
}

impl Writer {
    pub fn start(dir: &Path) -> Writer {
        fs::create_dir_all(dir).expect("writer directory");
        let stop = Arc::new(AtomicBool::new(false));
        let written = Arc::new(AtomicUsize::new(0));
        let (s, w, d) = (stop.clone(), written.clone(), dir.to_path_buf());
        let handle = std::thread::spawn(move || {
            let mut i = 0;
            while !s.load(Ordering::Acquire) {
                let mut f = fs::File::create(d.join(format!("w{i}")))?;
                f.write_all(&file_contents(i))?;
                f.sync_all()?;
                i += 1;
                w.store(i, Ordering::Release);
            }
            Ok(i)
        });
        Writer {
            stop,
            written,
            handle: Some(handle),
            dir: dir.to_path_buf(),
        }
    }

    /// Wait until `more` further files are written and synced.
    pub fn wait_for_more(&self, more: usize) {
        let target = self.written.load(Ordering::Acquire) + more;
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.written.load(Ordering::Acquire) < target {
            let finished = self.handle.as_ref().is_none_or(|h| h.is_finished());
            assert!(
                !finished,
                "the writer stopped early (see its error at finish)"
            );
            assert!(
                Instant::now() < deadline,
                "the writer made no progress for 20 s"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// How many files are written and synced so far (files `0..n`): each
    /// of them had its fsync return before this call.
    pub fn synced(&self) -> usize {
        self.written.load(Ordering::Acquire)
    }

    /// Stop and return how many files were written; panics on a write error.
    pub fn finish(mut self) -> usize {
        self.stop.store(true, Ordering::Release);
        let handle = self.handle.take().expect("writer running");
        handle
            .join()
            .expect("writer thread")
            .expect("writing through the mount")
    }

    /// Stop after the mount went away under the writer (its daemon was
    /// killed): how many files were written and synced before that. The
    /// one in progress, if any, is not counted.
    pub fn finish_after_crash(mut self) -> usize {
        self.stop.store(true, Ordering::Release);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
        self.written.load(Ordering::Acquire)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// Check every byte of writer files `0..count` in `dir`.
pub fn verify_files(dir: &Path, count: usize) {
    assert!(count > 0, "no files were written");
    for i in 0..count {
        let path = dir.join(format!("w{i}"));
        let got = fs::read(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
        assert!(
            got == file_contents(i),
            "{} differs from what was written ({} bytes read)",
            path.display(),
            got.len()
        );
    }
}
