//! Shared by the ecosystem tests (mount(8), fstab, systemd, install, NFS):
//! an array in a temporary directory, running commands with their output
//! kept for the failure message, and the mount.raidfs helper in /sbin for
//! the duration of a test.

#![allow(dead_code)]

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use raidfs::cli::mount::registry;
use raidfs::fuse::mounts;

pub const RAIDFS: &str = env!("CARGO_BIN_EXE_raidfs");
pub const HELPER_PATH: &str = "/sbin/mount.raidfs";
/// The same helper under the name mount(8) runs for type `fuse.raidfs`.
pub const FUSE_HELPER_PATH: &str = "/sbin/mount.fuse.raidfs";
const HELPER_PATHS: [&str; 2] = [HELPER_PATH, FUSE_HELPER_PATH];

/// Run a command; the output comes back whatever the exit status.
pub fn run(cmd: &mut Command) -> Output {
    let shown = format!("{cmd:?}");
    cmd.output()
        .unwrap_or_else(|e| panic!("cannot run {shown}: {e}"))
}

/// Panic with the command's output unless it succeeded.
pub fn check(cmd: &mut Command) -> Output {
    let shown = format!("{cmd:?}");
    let out = run(cmd);
    assert!(
        out.status.success(),
        "{shown} failed ({})\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

pub fn raidfs() -> Command {
    Command::new(RAIDFS)
}

/// A RAID5 array of three 64 MiB sparse images `m0.img`..`m2.img` in a
/// temporary directory, with a mount point `mnt` next to them.
pub struct Array {
    pub dir: tempfile::TempDir,
    pub uuid: String,
}

impl Array {
    pub fn new() -> Array {
        let dir = tempfile::tempdir().expect("temp dir");
        check(
            raidfs()
                .args([
                    "create", "-l", "5", "-s", "64M", "m0.img", "m1.img", "m2.img",
                ])
                .current_dir(dir.path()),
        );
        fs::create_dir(dir.path().join("mnt")).expect("mount point");
        let out = check(
            raidfs()
                .args(["examine", "--json", "m0.img"])
                .current_dir(dir.path()),
        );
        let json: serde_json::Value =
            serde_json::from_slice(&out.stdout).expect("examine --json output");
        let uuid = json[0]["array_uuid"]
            .as_str()
            .expect("array_uuid in examine output")
            .to_string();
        Array { dir, uuid }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub fn mnt(&self) -> PathBuf {
        self.path("mnt")
    }

    pub fn members(&self) -> Vec<PathBuf> {
        (0..3).map(|i| self.path(&format!("m{i}.img"))).collect()
    }

    pub fn log_option(&self) -> String {
        format!("log={}", self.path("daemon.log").display())
    }

    /// The array state recorded in m0's superblock (`clean`, `active`...).
    pub fn state(&self) -> String {
        let out = check(
            raidfs()
                .args(["examine", "--json", "m0.img"])
                .current_dir(self.dir.path()),
        );
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("examine json");
        json[0]["state"].as_str().unwrap_or_default().to_string()
    }
}

/// Whether a raidfs mount is at `path`, and its per-mount options.
pub fn mount_options(path: &Path) -> Option<String> {
    let entry = mounts::mount_at(path).ok().flatten()?;
    raidfs::fuse::is_raidfs_mount(&entry).then(|| {
        let text = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        text.lines()
            .map(|l| l.split(' ').collect::<Vec<_>>())
            .find(|f| f.len() > 5 && Path::new(f[4]) == path)
            .map(|f| f[5].to_string())
            .unwrap_or_default()
    })
}

/// The daemon serving `mount_point`, for waiting on it after an unmount.
pub fn daemon(mount_point: &Path) -> registry::DaemonRecord {
    registry::read(mount_point)
        .expect("reading the daemon registry")
        .expect("a daemon is recorded for the mount")
}

/// Wait until the daemon has exited and removed its record (a clean close).
pub fn assert_daemon_finished(record: &registry::DaemonRecord, mount_point: &Path) {
    assert!(
        record.wait_for_exit(Duration::from_secs(60)),
        "daemon {} still running",
        record.pid
    );
    let left = registry::read(mount_point).expect("registry");
    assert!(
        left.is_none(),
        "the daemon exited without closing cleanly: {left:?}"
    );
}

/// True (after saying why not) when mount(8) tests can run here.
pub fn mount8_available() -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let ok = root && Path::new("/dev/fuse").exists() && which("mount").is_some();
    if !ok {
        eprintln!("skipping: needs root, /dev/fuse and util-linux mount");
    }
    ok
}

pub fn which(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/sbin:/usr/bin:/sbin:/bin".into());
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/usr/bin", "/sbin", "/bin"].map(PathBuf::from))
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
}

static SERIAL: Mutex<()> = Mutex::new(());

/// Holds /sbin/mount.raidfs and /sbin/mount.fuse.raidfs in place for one
/// test (tests using them run one at a time). An installed helper is left
/// alone: the tests point every helper at the binary under test with
/// RAIDFS_BIN. One the guard put there itself is removed again.
pub struct HelperGuard {
    installed_here: Vec<&'static str>,
    _serial: MutexGuard<'static, ()>,
}

impl HelperGuard {
    pub fn new() -> HelperGuard {
        let serial = SERIAL
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("mount-helpers/mount.raidfs");
        let mut installed_here = Vec::new();
        for path in HELPER_PATHS {
            let helper = Path::new(path);
            if helper.exists() {
                continue;
            }
            let tmp = helper.with_extension("raidfs-test");
            fs::copy(&source, &tmp).unwrap_or_else(|e| panic!("copy the helper to {path}: {e}"));
            fs::rename(&tmp, helper).unwrap_or_else(|e| panic!("install {path}: {e}"));
            installed_here.push(path);
        }
        HelperGuard {
            installed_here,
            _serial: serial,
        }
    }

    /// util-linux mount, running our helper with the binary under test.
    pub fn mount(&self) -> Command {
        let mut cmd = Command::new("mount");
        cmd.env("RAIDFS_BIN", RAIDFS);
        cmd
    }
}

impl Drop for HelperGuard {
    fn drop(&mut self) {
        for path in &self.installed_here {
            let _ = fs::remove_file(path);
        }
    }
}
