//! Exporting a raidfs mount over NFS with real NFS software: NFS-Ganesha
//! (FSAL VFS, which exports a local mount through kernel file handles, so
//! it exercises raidfs's FUSE export support) serves the mount point on
//! 127.0.0.1, and libnfs's nfs-cp / nfs-cat / nfs-ls are the client, over
//! NFSv3. Files written through NFS are read back through NFS and through
//! the FUSE mount; after Ganesha restarts (and the kernel's caches are
//! dropped) they are read again through handles it has to resolve anew.
//!
//! Needs Debian's nfs-ganesha, nfs-ganesha-vfs, libnfs-utils and rpcbind;
//! without them the test says so loudly and does nothing. With them it
//! must work: a Ganesha that cannot start fails the test.

mod common;
mod ecosystem_support;

use std::fs;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::DaemonGuard;
use ecosystem_support::*;
use rand::{RngCore, SeedableRng};

const FSAL_VFS: &str = "/usr/lib/x86_64-linux-gnu/ganesha/libfsalvfs.so";

/// What is missing for the NFS test, if anything.
fn missing_software() -> Vec<String> {
    let mut missing: Vec<String> = ["ganesha.nfsd", "rpcbind", "nfs-cp", "nfs-cat", "nfs-ls"]
        .iter()
        .filter(|p| which(p).is_none())
        .map(|p| p.to_string())
        .collect();
    let vfs_found = Path::new(FSAL_VFS).exists()
        || which("ganesha.nfsd").is_some()
            && [
                "/usr/lib/ganesha/libfsalvfs.so",
                "/usr/lib64/ganesha/libfsalvfs.so",
            ]
            .iter()
            .any(|p| Path::new(p).exists());
    if !vfs_found {
        missing.push("FSAL VFS (nfs-ganesha-vfs)".into());
    }
    missing
}

/// A process this test started; stopped with SIGTERM (SIGKILL if it does
/// not exit within `grace`) when dropped.
struct Proc {
    name: &'static str,
    child: Option<Child>,
    grace: Duration,
}

impl Proc {
    fn spawn(name: &'static str, cmd: &mut Command, log: &Path) -> Proc {
        let out = fs::File::create(log).expect("process log");
        let err = out.try_clone().expect("process log");
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {name}: {e}"));
        Proc {
            name,
            child: Some(child),
            grace: Duration::from_secs(20),
        }
    }

    fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        // SAFETY: kill on the pid of our own child, not yet reaped.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + self.grace;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        eprintln!("{} did not exit on SIGTERM; killing it", self.name);
        let _ = child.kill();
        let _ = child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.stop();
    }
}

fn port_open(port: u16) -> bool {
    TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_millis(200)).is_ok()
}

/// Ports nothing listens on now (the kernel picks them).
fn free_ports(n: usize) -> Vec<u16> {
    let listeners: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0").expect("bind a free port"))
        .collect();
    listeners
        .iter()
        .map(|l| l.local_addr().expect("local addr").port())
        .collect()
}

fn tail(path: &Path) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

struct Ganesha {
    conf: PathBuf,
    log: PathBuf,
    work: PathBuf,
    export: PathBuf,
    proc: Option<Proc>,
}

impl Ganesha {
    fn new(work: &Path, export: &Path) -> Ganesha {
        let ports = free_ports(4);
        let recovery = work.join("recovery");
        fs::create_dir_all(&recovery).expect("recovery dir");
        let conf = work.join("ganesha.conf");
        fs::write(
            &conf,
            format!(
                "NFS_CORE_PARAM {{\n  Bind_addr = 127.0.0.1;\n  Protocols = 3;\n  \
                 NFS_Port = {};\n  MNT_Port = {};\n  NLM_Port = {};\n  Rquota_Port = {};\n  \
                 Enable_NLM = false;\n  Enable_RQUOTA = false;\n}}\n\
                 NFSV4 {{ RecoveryRoot = {}; Graceless = true; }}\n\
                 EXPORT {{\n  Export_Id = 1;\n  Path = {};\n  Pseudo = /raidfs;\n  \
                 Access_Type = RW;\n  Squash = No_Root_Squash;\n  SecType = sys;\n  \
                 Protocols = 3;\n  Transports = TCP;\n  FSAL {{ Name = VFS; }}\n}}\n\
                 LOG {{ Default_Log_Level = EVENT; }}\n",
                ports[0],
                ports[1],
                ports[2],
                ports[3],
                recovery.display(),
                export.display()
            ),
        )
        .expect("write ganesha.conf");
        Ganesha {
            conf,
            log: work.join("ganesha.log"),
            work: work.to_path_buf(),
            export: export.to_path_buf(),
            proc: None,
        }
    }

    fn start(&mut self) {
        let mut cmd = Command::new("ganesha.nfsd");
        cmd.arg("-F")
            .arg("-f")
            .arg(&self.conf)
            .arg("-L")
            .arg(&self.log)
            .arg("-p")
            .arg(self.work.join("ganesha.pid"));
        let mut proc = Proc::spawn("ganesha.nfsd", &mut cmd, &self.work.join("ganesha.out"));
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = proc.exited() {
                panic!(
                    "\n**** NFS-Ganesha could not start ({status}) ****\n{}\n",
                    tail(&self.log)
                );
            }
            let probe = Command::new("nfs-ls").arg(url(&self.export)).output();
            if matches!(&probe, Ok(out) if out.status.success()) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "NFS-Ganesha did not serve the export within 60 s:\n{}",
                tail(&self.log)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        self.proc = Some(proc);
    }

    fn stop(&mut self) {
        if let Some(mut proc) = self.proc.take() {
            proc.stop();
        }
    }
}

impl Drop for Ganesha {
    fn drop(&mut self) {
        self.stop();
    }
}

fn url(path: &Path) -> String {
    format!("nfs://127.0.0.1{}?version=3", path.display())
}

fn nfs_cat(path: &Path) -> Vec<u8> {
    check(Command::new("nfs-cat").arg(url(path))).stdout
}

#[test]
fn nfs_ganesha_round_trip_over_a_raidfs_mount() {
    if !mount8_available() {
        return;
    }
    let missing = missing_software();
    if !missing.is_empty() {
        eprintln!(
            "\n**************** SKIPPED: NFS export test ****************\n\
             missing: {}\n\
             install: apt-get install nfs-ganesha nfs-ganesha-vfs libnfs-utils rpcbind\n\
             **********************************************************\n",
            missing.join(", ")
        );
        return;
    }
    let array = Array::new();
    let mnt = array.mnt();
    let _daemon_guard = DaemonGuard::new(&mnt);
    let mut args: Vec<String> = vec!["mount".into(), "-o".into(), array.log_option()];
    args.extend(array.members().iter().map(|m| m.display().to_string()));
    args.push(mnt.display().to_string());
    check(raidfs().args(&args));

    let work = tempfile::tempdir().unwrap();
    // NFSv3 finds mountd and nfsd through the portmapper.
    let _rpcbind = if port_open(111) {
        None
    } else {
        let mut cmd = Command::new("rpcbind");
        cmd.args(["-f", "-d"]);
        let mut proc = Proc::spawn("rpcbind", &mut cmd, &work.path().join("rpcbind.log"));
        let deadline = Instant::now() + Duration::from_secs(10);
        while !port_open(111) {
            assert!(
                proc.exited().is_none(),
                "rpcbind exited:\n{}",
                tail(&work.path().join("rpcbind.log"))
            );
            assert!(
                Instant::now() < deadline,
                "rpcbind did not listen on port 111"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Some(proc)
    };
    let mut ganesha = Ganesha::new(work.path(), &mnt);
    ganesha.start();

    // Write through NFS, sizes around the edges of pages and RPC sizes.
    let mut rng = rand::rngs::StdRng::seed_from_u64(9);
    let local = work.path().join("local");
    fs::create_dir(&local).unwrap();
    fs::create_dir(mnt.join("sub")).unwrap();
    let files: Vec<(String, usize)> = [
        ("empty", 0),
        ("small.txt", 13),
        ("page.bin", 4096),
        ("odd.bin", 100_003),
        ("big.bin", 3 << 20),
        ("sub/deep.bin", 200_000),
    ]
    .iter()
    .map(|(n, s)| (n.to_string(), *s))
    .collect();
    let mut contents = Vec::new();
    for (name, size) in &files {
        let mut data = vec![0u8; *size];
        rng.fill_bytes(&mut data);
        let source = local.join(name.replace('/', "_"));
        fs::write(&source, &data).unwrap();
        check(
            Command::new("nfs-cp")
                .arg(&source)
                .arg(url(&mnt.join(name))),
        );
        contents.push((mnt.join(name), data));
    }
    // And one written through FUSE, to be read through NFS.
    let fuse_written = b"written through the FUSE mount\n".repeat(1000);
    fs::write(mnt.join("from-fuse.txt"), &fuse_written).unwrap();
    contents.push((mnt.join("from-fuse.txt"), fuse_written));

    for (path, data) in &contents {
        assert!(
            nfs_cat(path) == *data,
            "NFS read of {} differs",
            path.display()
        );
        assert!(
            fs::read(path).unwrap() == *data,
            "FUSE read of {} differs",
            path.display()
        );
    }
    let listing =
        String::from_utf8_lossy(&check(Command::new("nfs-ls").arg(url(&mnt))).stdout).into_owned();
    for name in [
        "empty",
        "small.txt",
        "page.bin",
        "odd.bin",
        "big.bin",
        "sub",
        "from-fuse.txt",
    ] {
        assert!(
            listing.lines().any(|l| l.ends_with(&format!(" {name}"))),
            "{name} missing from nfs-ls:\n{listing}"
        );
    }

    // Restart Ganesha with the kernel's dentry and inode caches dropped: the
    // file handles it hands out and resolves must still lead to the files.
    ganesha.stop();
    let _ = fs::write("/proc/sys/vm/drop_caches", "3");
    ganesha.start();
    for (path, data) in &contents {
        assert!(
            nfs_cat(path) == *data,
            "NFS read of {} after the restart differs",
            path.display()
        );
    }
    ganesha.stop();

    let record = daemon(&mnt);
    check(raidfs().arg("umount").arg(&mnt));
    assert_daemon_finished(&record, &mnt);
    assert_eq!(array.state(), "clean");
}
