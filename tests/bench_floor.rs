//! `raidfs bench fuse-floor`: the benchmark floor mounts, keeps a namespace
//! and file sizes, stores no data, and ends cleanly when unmounted.

mod common;

use std::fs::{self, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use common::{detach, fuse_available};
use raidfs::fuse::mounts;

/// The floor's process and mount point: dropping it detaches the mount and
/// reaps the process, whatever state the test left them in.
struct Floor {
    child: Option<Child>,
    dir: tempfile::TempDir,
}

impl Floor {
    fn start(options: &[&str]) -> Floor {
        let dir = tempfile::tempdir().unwrap();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_raidfs"));
        cmd.args(["bench", "fuse-floor"]).arg(dir.path());
        for o in options {
            cmd.args(["-o", o]);
        }
        let child = cmd.stderr(Stdio::piped()).spawn().unwrap();
        let floor = Floor {
            child: Some(child),
            dir,
        };
        // Mounting is the process's first act; a broken one exits instead.
        let deadline = Instant::now() + Duration::from_secs(20);
        while !floor.mounted() {
            assert!(Instant::now() < deadline, "the floor never mounted");
            std::thread::yield_now();
        }
        floor
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn mounted(&self) -> bool {
        matches!(mounts::mount_at(self.dir.path()), Ok(Some(_)))
    }

    fn unmount(mut self) -> ExitStatus {
        let status = Command::new("umount").arg(self.path()).status().unwrap();
        assert!(status.success(), "umount failed");
        let mut child = self.child.take().unwrap();
        child.wait().unwrap()
    }
}

impl Drop for Floor {
    fn drop(&mut self) {
        if self.mounted() {
            detach(self.dir.path());
        }
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

#[test]
fn the_floor_keeps_names_and_sizes_but_no_data_and_ends_at_umount() {
    if !fuse_available() {
        return;
    }
    for options in [&[][..], &["direct_io"][..]] {
        let floor = Floor::start(options);
        let dir: PathBuf = floor.path().join("d");
        fs::create_dir(&dir).unwrap();
        let file = dir.join("f");
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&file)
            .unwrap();
        f.write_all_at(&[0xa5; 4096], 1 << 20).unwrap();
        f.sync_all().unwrap();
        drop(f);
        assert_eq!(fs::metadata(&file).unwrap().len(), (1 << 20) + 4096);
        // A new open drops the kernel's pages: the bytes come from the floor.
        let back = fs::read(&file).unwrap();
        assert_eq!(back.len(), (1 << 20) + 4096);
        assert!(
            back.iter().all(|&b| b == 0),
            "the floor stores no data ({options:?})"
        );
        let names: Vec<_> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["f"]);
        assert_eq!(
            fs::remove_dir(&dir).unwrap_err().raw_os_error(),
            Some(libc::ENOTEMPTY)
        );
        fs::remove_file(&file).unwrap();
        fs::remove_dir(&dir).unwrap();
        assert_eq!(fs::read_dir(floor.path()).unwrap().count(), 0);
        let status = floor.unmount();
        assert!(
            status.success(),
            "the floor exits 0 once unmounted: {status}"
        );
    }
}

#[test]
fn the_floor_refuses_a_bad_option_with_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_raidfs"))
        .args(["bench", "fuse-floor", "-o", "threads=0"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("threads=0"), "stderr: {err}");
}
