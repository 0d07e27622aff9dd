//! Arrays of a user who is not root: the user creates, mounts (through
//! fusermount3), writes, lists and unmounts their own array, its files
//! living in their own directories; root's `raidfs status` lists it with
//! its owner; and a user with nowhere to keep the mount's files is told so.

mod common;

use std::ffi::OsStr;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use common::cli::{check, raidfs_ok, stderr, stdout};
use common::{detach, fuse_available};
use raidfs::cli::mount::{places, registry};
use raidfs::fuse::mounts;

/// The user the tests run as (cloudsdk here; any uid with an entry in the
/// user database serves, as setpriv --init-groups looks it up).
const UID: u32 = 1000;

/// Where the user's run: a 0755 directory (root's temporary directories
/// are 0700, which the user could not enter) holding their home, their
/// runtime directory and the array's images and mount point, all theirs.
struct UserDirs {
    _base: tempfile::TempDir,
    home: PathBuf,
    runtime: PathBuf,
    work: PathBuf,
}

impl UserDirs {
    fn new() -> UserDirs {
        let base = tempfile::tempdir().expect("temp dir");
        fs::set_permissions(base.path(), fs::Permissions::from_mode(0o755)).expect("chmod base");
        let made = |name: &str, mode: u32| {
            let dir = base.path().join(name);
            fs::create_dir(&dir).expect("user directory");
            std::os::unix::fs::chown(&dir, Some(UID), Some(UID)).expect("chown to the user");
            fs::set_permissions(&dir, fs::Permissions::from_mode(mode)).expect("chmod");
            dir.canonicalize().expect("canonical path")
        };
        let home = made("home", 0o700);
        let runtime = made("run", 0o700);
        let work = made("work", 0o755);
        UserDirs {
            home,
            runtime,
            work,
            _base: base,
        }
    }

    fn mnt(&self) -> PathBuf {
        self.work.join("mnt")
    }
}

/// How the user's environment is set up for one command.
#[derive(Clone, Copy)]
enum Session {
    /// A login session: HOME and XDG_RUNTIME_DIR.
    Login,
    /// No runtime directory (a cron job, `su` without a login): HOME only.
    HomeOnly,
    /// Neither: nowhere of the user's own to write.
    Bare,
}

/// Run `program ARGS` as the user in `cwd`, with only the environment
/// `session` gives (setpriv changes ids, not the environment).
fn as_user(dirs: &UserDirs, session: Session, program: &OsStr, args: &[&OsStr]) -> Output {
    let mut command = Command::new("setpriv");
    command
        .args([
            &format!("--reuid={UID}"),
            &format!("--regid={UID}"),
            "--init-groups",
        ])
        .arg(program)
        .args(args)
        .current_dir(&dirs.work)
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin");
    match session {
        Session::Login => {
            command
                .env("HOME", &dirs.home)
                .env("XDG_RUNTIME_DIR", &dirs.runtime);
        }
        Session::HomeOnly => {
            command.env("HOME", &dirs.home);
        }
        Session::Bare => {}
    }
    command.output().expect("run setpriv")
}

fn raidfs_as(dirs: &UserDirs, session: Session, args: &[&str]) -> Output {
    let args: Vec<&OsStr> = args.iter().map(OsStr::new).collect();
    as_user(
        dirs,
        session,
        OsStr::new(env!("CARGO_BIN_EXE_raidfs")),
        &args,
    )
}

/// Require success; returns stdout.
fn succeeded(what: &str, out: Output) -> String {
    stdout(&check(out, what))
}

/// True when the user can run the tests at all: FUSE as root, and an
/// entry for the user (setpriv --init-groups needs one).
fn user_available() -> bool {
    if !fuse_available() {
        return false;
    }
    // SAFETY: getpwuid returns a pointer into static storage or null.
    let known = !unsafe { libc::getpwuid(UID) }.is_null();
    if !known {
        eprintln!("skipping: no user with uid {UID}");
    }
    known
}

/// Whether the user may open /dev/fuse, as a user's mount must (fuser and
/// fusermount3 both open it with the user's rights).
fn user_can_open_fuse(dirs: &UserDirs) -> bool {
    let test = |flag: &str| {
        as_user(
            dirs,
            Session::Login,
            OsStr::new("test"),
            &[OsStr::new(flag), OsStr::new("/dev/fuse")],
        )
        .status
        .success()
    };
    test("-r") && test("-w")
}

/// A user's mount daemon: Drop detaches the mount and waits for the daemon
/// (found in the user's run directory), whatever state the test left.
struct UserDaemonGuard {
    mount_point: PathBuf,
    run_dirs: Vec<PathBuf>,
}

impl Drop for UserDaemonGuard {
    fn drop(&mut self) {
        detach(&self.mount_point);
        for dir in &self.run_dirs {
            if let Ok(Some(record)) = registry::read_in(dir, &self.mount_point) {
                if record.is_alive() && !record.wait_for_exit(Duration::from_secs(30)) {
                    // SAFETY: kill with the pid the daemon recorded for itself.
                    unsafe { libc::kill(record.pid as i32, libc::SIGKILL) };
                }
            }
        }
    }
}

fn mounted(mount_point: &Path) -> Option<mounts::MountEntry> {
    mounts::mount_at(mount_point).expect("read mountinfo")
}

/// `raidfs status --json` (as root) on the array at `mount_point`.
fn root_status_of(mount_point: &Path) -> serde_json::Value {
    let text = raidfs_ok(&["status", "--json"], Path::new("/"));
    let doc: serde_json::Value = serde_json::from_str(&text).expect("status --json is JSON");
    let arrays = doc["arrays"].as_array().expect("arrays").clone();
    arrays
        .into_iter()
        .find(|a| a["mount_point"] == mount_point.to_string_lossy().as_ref())
        .unwrap_or_else(|| {
            panic!(
                "root's status does not list {}: {text}",
                mount_point.display()
            )
        })
}

#[test]
fn a_user_creates_mounts_writes_and_unmounts_their_own_array() {
    if !user_available() {
        return;
    }
    let dirs = UserDirs::new();
    let mnt = dirs.mnt();
    succeeded(
        "create as the user",
        raidfs_as(
            &dirs,
            Session::Login,
            &["create", "-l", "1", "-s", "64M", "a.img", "b.img"],
        ),
    );
    for image in ["a.img", "b.img"] {
        let meta = fs::metadata(dirs.work.join(image)).expect("image made");
        assert_eq!((meta.uid(), meta.gid()), (UID, UID), "{image}");
    }
    succeeded(
        "mkdir as the user",
        as_user(
            &dirs,
            Session::Login,
            OsStr::new("mkdir"),
            &[mnt.as_os_str()],
        ),
    );
    let login_run = dirs.runtime.join("raidfs/mounts");
    let home_run = dirs.home.join(".local/state/raidfs/mounts");
    let _guard = UserDaemonGuard {
        mount_point: mnt.clone(),
        run_dirs: vec![login_run.clone(), home_run.clone()],
    };
    let mount = raidfs_as(&dirs, Session::Login, &["mount", "a.img", "b.img", "mnt"]);
    if !user_can_open_fuse(&dirs) {
        // /dev/fuse is opened with the user's rights: the mount
        // must say why it cannot work rather than fail inside the daemon.
        assert!(!mount.status.success(), "mounted without /dev/fuse access");
        assert!(
            stderr(&mount).contains(&format!("cannot be opened by uid {UID}")),
            "{}",
            stderr(&mount)
        );
        eprintln!("skipping the rest: uid {UID} cannot open /dev/fuse here");
        return;
    }
    let said = succeeded("mount as the user", mount);
    let entry = mounted(&mnt).expect("mounted");
    // A user's mount carries the same identity as root's: type
    // fuse.raidfs, the array (unnamed here) as uuid=UUID.
    assert_eq!(entry.fs_type, "fuse.raidfs");
    assert!(entry.source.starts_with("uuid="), "{}", entry.source);
    let uuid = uuid::Uuid::parse_str(entry.source.trim_start_matches("uuid=")).expect("uuid");
    let log = dirs
        .home
        .join(".local/state/raidfs/log")
        .join(places::log_name("", uuid));
    assert!(
        said.contains(&format!("(log: {})", log.display())),
        "the log is not in the user's state directory: {said}"
    );

    // The user owns the root directory and can write to it.
    let owner = succeeded(
        "stat as the user",
        as_user(
            &dirs,
            Session::Login,
            OsStr::new("stat"),
            &[OsStr::new("-c"), OsStr::new("%u:%g %a"), mnt.as_os_str()],
        ),
    );
    assert_eq!(owner.trim(), format!("{UID}:{UID} 755"));
    let data: Vec<u8> = (0..300_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
    let source = dirs.work.join("source");
    fs::write(&source, &data).expect("write the source file");
    let target = mnt.join("d/f");
    succeeded(
        "mkdir in the mount",
        as_user(
            &dirs,
            Session::Login,
            OsStr::new("mkdir"),
            &[mnt.join("d").as_os_str()],
        ),
    );
    succeeded(
        "cp into the mount",
        as_user(
            &dirs,
            Session::Login,
            OsStr::new("cp"),
            &[source.as_os_str(), target.as_os_str()],
        ),
    );
    let read = as_user(
        &dirs,
        Session::Login,
        OsStr::new("cat"),
        &[target.as_os_str()],
    );
    assert!(read.status.success(), "{}", stderr(&read));
    assert!(
        read.stdout == data,
        "read back {} bytes, different",
        read.stdout.len()
    );

    // The daemon's state lives in the user's runtime directory.
    let record = registry::read_in(&login_run, &mnt)
        .expect("read the state file")
        .expect("a state file in $XDG_RUNTIME_DIR/raidfs/mounts");
    assert!(record.is_alive());
    assert_eq!(record.log.as_deref(), Some(log.as_path()));

    // The user's status and root's both list it, with its owner.
    let header = format!("{} : active raid1 a.img[0] b.img[1]\n", mnt.display());
    let owner_line = "      owner uid 1000";
    let theirs = succeeded(
        "status as the user",
        raidfs_as(&dirs, Session::Login, &["status"]),
    );
    assert!(
        theirs.contains(&header) && theirs.contains(owner_line),
        "{theirs}"
    );
    let roots = raidfs_ok(&["status"], Path::new("/"));
    assert!(
        roots.contains(&header) && roots.contains(owner_line),
        "{roots}"
    );
    let one = raidfs_ok(&["status", &mnt.to_string_lossy()], Path::new("/"));
    assert!(one.contains(&header), "{one}");
    let report = root_status_of(&mnt);
    assert_eq!(report["owner_uid"], UID);
    assert_eq!(report["daemon_pid"], record.pid);

    succeeded(
        "umount as the user",
        raidfs_as(&dirs, Session::Login, &["umount", "mnt"]),
    );
    assert!(mounted(&mnt).is_none(), "still mounted after umount");
    assert!(!record.is_alive(), "the daemon outlived its umount");
    assert_eq!(
        registry::read_in(&login_run, &mnt).expect("read the run dir"),
        None
    );

    // Without a runtime directory the user's state directory serves, and
    // root still finds the mount; the data written before is all there.
    succeeded(
        "remount without XDG_RUNTIME_DIR",
        raidfs_as(
            &dirs,
            Session::HomeOnly,
            &["mount", "a.img", "b.img", "mnt"],
        ),
    );
    let record = registry::read_in(&home_run, &mnt)
        .expect("read the state file")
        .expect("a state file in ~/.local/state/raidfs/mounts");
    assert!(record.is_alive());
    assert_eq!(root_status_of(&mnt)["owner_uid"], UID);
    let read = as_user(
        &dirs,
        Session::HomeOnly,
        OsStr::new("cat"),
        &[target.as_os_str()],
    );
    assert!(
        read.stdout == data,
        "after the remount {} bytes, different",
        read.stdout.len()
    );
    succeeded(
        "umount without XDG_RUNTIME_DIR",
        raidfs_as(&dirs, Session::HomeOnly, &["umount", "mnt"]),
    );
    assert!(mounted(&mnt).is_none());
    assert!(!record.is_alive());

    // Root may unmount a user's mount, and waits for the user's daemon
    // (found through its socket) to close the array.
    succeeded(
        "mount again",
        raidfs_as(&dirs, Session::Login, &["mount", "a.img", "b.img", "mnt"]),
    );
    let record = registry::read_in(&login_run, &mnt)
        .expect("read the state file")
        .expect("a state file in $XDG_RUNTIME_DIR/raidfs/mounts");
    raidfs_ok(&["umount", &mnt.to_string_lossy()], Path::new("/"));
    assert!(mounted(&mnt).is_none());
    assert!(
        !record.is_alive(),
        "root's umount returned before the daemon exited"
    );
    assert_eq!(
        registry::read_in(&login_run, &mnt).expect("read the run dir"),
        None,
        "the daemon did not close the array cleanly"
    );
}

#[test]
fn a_user_with_nowhere_to_keep_the_mounts_files_is_told_before_mounting() {
    if !user_available() {
        return;
    }
    let dirs = UserDirs::new();
    succeeded(
        "create as the user",
        raidfs_as(
            &dirs,
            Session::Bare,
            &["create", "-l", "1", "-s", "64M", "a.img", "b.img"],
        ),
    );
    succeeded(
        "mkdir as the user",
        as_user(
            &dirs,
            Session::Bare,
            OsStr::new("mkdir"),
            &[dirs.mnt().as_os_str()],
        ),
    );
    let _guard = UserDaemonGuard {
        mount_point: dirs.mnt(),
        run_dirs: Vec::new(),
    };
    let out = raidfs_as(&dirs, Session::Bare, &["mount", "a.img", "b.img", "mnt"]);
    assert!(
        !out.status.success(),
        "mounted with nowhere to keep its files"
    );
    let said = stderr(&out);
    assert!(
        said.contains("no directory for the mount's state file and control socket")
            && said.contains("XDG_RUNTIME_DIR, XDG_STATE_HOME and HOME are all unset"),
        "{said}"
    );
    assert!(mounted(&dirs.mnt()).is_none());
}

#[test]
fn create_gives_the_root_directory_to_the_owner_asked_for() {
    if !user_available() {
        return;
    }
    let dirs = UserDirs::new();
    // A user may not give their array away.
    let out = raidfs_as(
        &dirs,
        Session::Login,
        &[
            "create", "-l", "1", "-s", "64M", "--owner", "0:0", "a.img", "b.img",
        ],
    );
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("only root may give the array to another user"),
        "{}",
        stderr(&out)
    );
    assert!(
        !dirs.work.join("a.img").exists(),
        "a refused create wrote images"
    );

    // Root may, and the default is root's own ids.
    for (owner, want) in [(Some("1000:1001"), "1000:1001"), (None, "0:0")] {
        let work = tempfile::tempdir().expect("temp dir");
        let mut args = vec!["create", "-l", "1", "-s", "64M"];
        if let Some(owner) = owner {
            args.extend(["--owner", owner]);
        }
        args.extend(["a.img", "b.img"]);
        raidfs_ok(&args, work.path());
        let mnt = work.path().join("mnt");
        fs::create_dir(&mnt).expect("mount point");
        let mnt = mnt.canonicalize().expect("canonical");
        let _guard = common::DaemonGuard::new(&mnt);
        raidfs_ok(&["mount", "a.img", "b.img", "mnt"], work.path());
        let meta = fs::metadata(&mnt).expect("stat the mounted root");
        assert_eq!(format!("{}:{}", meta.uid(), meta.gid()), want);
        raidfs_ok(&["umount", "mnt"], work.path());
    }
}
