//! An array of image files in a temporary directory, created and mounted
//! through the `raidfs` binary on `mnt` there, with its daemon logging to
//! `daemon.log` beside the images; the mount tests' common fixture. The
//! guard takes the mount down however the test ends.

use std::cell::RefCell;
use std::ffi::OsStr;
use std::path::PathBuf;
use std::process::Output;
use std::time::Duration;

use super::cli::{detail_json, raidfs, raidfs_ok, stderr, stdout};
use super::DaemonGuard;

pub struct Mounted {
    pub dir: tempfile::TempDir,
    pub mnt: PathBuf,
    /// The members `mount` assembles (`mount_members` changes them).
    members: RefCell<Vec<String>>,
    _guard: DaemonGuard,
}

impl Mounted {
    /// `raidfs create -l LEVEL -s SIZE MEMBERS...`, then mount them.
    pub fn new(level: &str, size: &str, members: &[&str]) -> Mounted {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut args = vec!["create", "-l", level, "-s", size];
        args.extend(members);
        raidfs_ok(&args, dir.path());
        let mnt = dir.path().join("mnt");
        std::fs::create_dir(&mnt).expect("mount point");
        let mnt = mnt.canonicalize().expect("mount point path");
        let guard = DaemonGuard::new(&mnt);
        let m = Mounted {
            dir,
            mnt,
            members: RefCell::new(members.iter().map(|s| s.to_string()).collect()),
            _guard: guard,
        };
        m.mount();
        m
    }

    /// Mount the members as they are now.
    pub fn mount(&self) {
        let log = format!("log={}", self.path("daemon.log").display());
        let members = self.members.borrow().clone();
        let mut args: Vec<&OsStr> = vec![OsStr::new("mount"), OsStr::new("-o"), OsStr::new(&log)];
        args.extend(members.iter().map(OsStr::new));
        args.push(self.mnt.as_os_str());
        raidfs_ok(&args, self.dir.path());
    }

    /// Mount these members (and from now on these).
    pub fn mount_members(&self, members: &[&str]) {
        *self.members.borrow_mut() = members.iter().map(|s| s.to_string()).collect();
        self.mount();
    }

    /// The members `mount` assembles.
    pub fn members(&self) -> Vec<String> {
        self.members.borrow().clone()
    }

    /// A member joined the array (`raidfs grow --add`, say).
    pub fn add_member(&self, name: &str) {
        self.members.borrow_mut().push(name.to_string());
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub fn umount(&self) {
        raidfs_ok(
            &[OsStr::new("umount"), self.mnt.as_os_str()],
            self.dir.path(),
        );
    }

    /// `raidfs VERB MOUNT_POINT ARGS...` from the image directory.
    pub fn run(&self, verb: &str, args: &[&str]) -> Output {
        let mut all: Vec<&OsStr> = vec![OsStr::new(verb), self.mnt.as_os_str()];
        all.extend(args.iter().map(OsStr::new));
        raidfs(&all, self.dir.path())
    }

    /// [`Mounted::run`], which must succeed; its stdout.
    pub fn ok(&self, verb: &str, args: &[&str]) -> String {
        let out = self.run(verb, args);
        assert!(
            out.status.success(),
            "raidfs {verb} {args:?} failed\nstdout: {}\nstderr: {}",
            stdout(&out),
            stderr(&out)
        );
        stdout(&out)
    }

    pub fn detail(&self) -> serde_json::Value {
        detail_json(&self.mnt)
    }

    /// SIGKILL the daemon and wait until all of it is gone (its members
    /// are free to assemble again); its pid.
    pub fn kill_daemon(&self) -> i32 {
        super::kill_daemon(&self.mnt, Duration::from_secs(30)).pid as i32
    }
}
