//! `raidfs monitor` over real mounts: a `--program` hook records every
//! event with its arguments while the array appears, a member fails, is
//! removed and replaced (the rebuild's progress marks), data goes bad on
//! one copy and on both, and the daemon is killed; a fake `sendmail` first
//! on PATH captures the mails. Also `detail --test`'s exit statuses and a
//! dead mount in `status`.

mod common;

use std::ffi::OsStr;
use std::fs;
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::cli::{detail_json, raidfs, raidfs_ok, stdout, wait_for_detail};
use common::{fuse_available, DaemonGuard};

const BLOCK: usize = 4096;

/// A two-way mirror of 64 MiB images `m0.img` and `m1.img` in a temporary
/// directory, with a mount point, an event hook and a fake sendmail.
struct Setup {
    dir: tempfile::TempDir,
    mnt: PathBuf,
    uuid: String,
}

impl Setup {
    fn new() -> Setup {
        let dir = tempfile::tempdir().expect("temp dir");
        raidfs_ok(
            &["create", "-l", "1", "-s", "64M", "m0.img", "m1.img"],
            dir.path(),
        );
        let mnt = dir.path().join("mnt");
        fs::create_dir(&mnt).expect("mount point");
        let mnt = mnt.canonicalize().expect("mount point path");
        let examined = raidfs_ok(&["examine", "--json", "m0.img"], dir.path());
        let json: serde_json::Value = serde_json::from_str(&examined).expect("examine JSON");
        let uuid = json[0]["array_uuid"]
            .as_str()
            .unwrap_or_else(|| panic!("no array_uuid in {json}"))
            .to_string();
        let setup = Setup { dir, mnt, uuid };
        setup.script(
            "hook",
            "#!/bin/sh\n{ for a in \"$@\"; do printf '%s|' \"$a\"; done; echo; } >> \"$(dirname \"$0\")/events\"\n",
        );
        fs::create_dir(setup.path("bin")).expect("bin dir");
        // sendmail -t: the message on stdin, one file per mail.
        setup.script(
            "bin/sendmail",
            "#!/bin/sh\n[ \"$1\" = -t ] || exit 3\nd=\"$(dirname \"$0\")/../mail\"\nmkdir -p \"$d\"\nn=$(ls \"$d\" | wc -l)\ncat > \"$d/$(printf %03d \"$n\")\"\n",
        );
        setup
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn script(&self, name: &str, text: &str) {
        let path = self.path(name);
        fs::write(&path, text).expect("write script");
        fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).expect("chmod script");
    }

    fn mount(&self, options: &str) -> DaemonGuard {
        let guard = DaemonGuard::new(&self.mnt);
        let opts = format!("log={},{options}", self.path("daemon.log").display());
        let args = [
            OsStr::new("mount"),
            OsStr::new("-o"),
            OsStr::new(&opts),
            OsStr::new("m0.img"),
            OsStr::new("m1.img"),
            self.mnt.as_os_str(),
        ];
        raidfs_ok(&args, self.dir.path());
        guard
    }

    /// `raidfs VERB MOUNT ARGS...` in the image directory, required to succeed.
    fn ok(&self, verb: &str, args: &[&str]) -> String {
        let mut all: Vec<&OsStr> = vec![OsStr::new(verb), self.mnt.as_os_str()];
        all.extend(args.iter().map(OsStr::new));
        raidfs_ok(&all, self.dir.path())
    }

    /// `raidfs monitor ARGS... MOUNT` with the fake sendmail first on PATH.
    fn monitor(&self, args: &[&str]) -> Monitor {
        let path = format!(
            "{}:{}",
            self.path("bin").display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let child = Command::new(env!("CARGO_BIN_EXE_raidfs"))
            .arg("monitor")
            .args(args)
            .arg(&self.mnt)
            .env("PATH", path)
            .current_dir(self.dir.path())
            .stdout(fs::File::create(self.path("monitor.out")).expect("monitor output"))
            .stderr(fs::File::create(self.path("monitor.err")).expect("monitor errors"))
            .stdin(Stdio::null())
            .spawn()
            .expect("start raidfs monitor");
        Monitor { child }
    }

    /// The events the hook recorded: each one's arguments.
    fn events(&self) -> Vec<Vec<String>> {
        let text = fs::read_to_string(self.path("events")).unwrap_or_default();
        text.lines()
            .map(|l| {
                l.trim_end_matches('|')
                    .split('|')
                    .map(str::to_string)
                    .collect()
            })
            .collect()
    }

    /// Wait until the hook has recorded `count` events; returns them all.
    fn wait_for_events(&self, count: usize, what: &str) -> Vec<Vec<String>> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let events = self.events();
            if events.len() >= count {
                return events;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}; events so far: {events:?}\nmonitor said: {}{}",
                fs::read_to_string(self.path("monitor.out")).unwrap_or_default(),
                fs::read_to_string(self.path("monitor.err")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn mails(&self) -> Vec<String> {
        let mut names: Vec<PathBuf> = fs::read_dir(self.path("mail"))
            .map(|d| d.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        names.sort();
        names
            .iter()
            .map(|p| fs::read_to_string(p).expect("captured mail"))
            .collect()
    }
}

/// A running `raidfs monitor`, killed when dropped.
struct Monitor {
    child: Child,
}

impl Drop for Monitor {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn event(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| s.to_string()).collect()
}

/// A member's name as the daemon reports it.
fn member_name(report: &serde_json::Value, slot: usize) -> String {
    report["members"][slot]["name"]
        .as_str()
        .expect("member name")
        .to_string()
}

#[test]
fn events_follow_a_failure_a_rebuild_and_a_dead_daemon_in_order() {
    if !fuse_available() {
        return;
    }
    let setup = Setup::new();
    let mnt = setup.mnt.display().to_string();
    // The configuration expects a hot spare (SparesMissing) and names the
    // mails' sender; the command line gives the rest.
    let config = setup.path("raidfs.ron");
    fs::write(
        &config,
        format!(
            "(arrays: [(uuid: \"{}\", members: [\"{}/m*.img\"], spares: 1)], monitor: (mail_from: \"raid watch <raid@test>\", delay: 3600))",
            setup.uuid,
            setup.dir.path().display()
        ),
    )
    .expect("write config");
    let hook = setup.path("hook").display().to_string();
    let config_arg = config.display().to_string();
    let _monitor = setup.monitor(&[
        "--delay",
        "0.1",
        "--program",
        &hook,
        "--mail",
        "ops@example.com",
        "--config",
        &config_arg,
    ]);
    // Mounted after the monitor started: a new array.
    let guard = setup.mount("");
    let events = setup.wait_for_events(2, "NewArray and SparesMissing");
    assert_eq!(
        events,
        [event(&["NewArray", &mnt]), event(&["SparesMissing", &mnt])]
    );
    fs::write(setup.mnt.join("data"), vec![0x5a; 1 << 20]).expect("write data");
    setup.ok("sync", &[]);

    let report = detail_json(&setup.mnt);
    let m1 = member_name(&report, 1);
    setup.ok("fail", &["1"]);
    let events = setup.wait_for_events(3, "Fail");
    assert_eq!(events[2], event(&["Fail", &mnt, &m1]));
    setup.ok("remove", &["1"]);
    // Slow enough for the monitor to see the rebuild run (a few seconds
    // for the one or two 8 MiB groups in use).
    setup.ok("speed-limit", &["--max", "2M"]);
    setup.ok("add", &["new1.img"]);
    let new1 = setup.path("new1.img").display().to_string();
    wait_for_detail(
        &setup.mnt,
        "the rebuild to finish",
        Duration::from_secs(120),
        |r| r["sync"].is_null() && r["degraded"] == false,
    );
    let events = setup.wait_for_events(10, "the rebuild's events");
    assert_eq!(
        events[3..],
        [
            event(&["RebuildStarted", &mnt]),
            event(&["Rebuild20", &mnt]),
            event(&["Rebuild40", &mnt]),
            event(&["Rebuild60", &mnt]),
            event(&["Rebuild80", &mnt]),
            event(&["RebuildFinished", &mnt]),
            event(&["SpareActive", &mnt, &new1]),
        ]
    );

    // The daemon dies: the mount is dead, the monitor says so once.
    common::kill_daemon(&setup.mnt, Duration::from_secs(30));
    let events = setup.wait_for_events(11, "DeviceDisappeared");
    assert_eq!(events[10], event(&["DeviceDisappeared", &mnt]));

    // status lists it as inactive with the reason; detail --test says 4.
    let status = raidfs_ok(&["status"], Path::new("/"));
    let line = format!("{mnt} : inactive (the daemon (pid ");
    assert!(
        status.contains(&line) && status.contains("Transport endpoint is not connected"),
        "{status}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&raidfs_ok(&["status", "--json"], Path::new("/"))).expect("JSON");
    let inactive = json["inactive"].as_array().expect("inactive list");
    assert!(
        inactive.iter().any(|d| d["mount_point"] == mnt.as_str()
            && d["reason"]
                .as_str()
                .is_some_and(|r| r.contains("Transport endpoint is not connected"))),
        "{json:#}"
    );
    let one = raidfs_ok(&["status", &mnt], Path::new("/"));
    assert!(one.starts_with(&line), "{one}");
    let tested = raidfs(&["detail", "--test", &mnt], Path::new("/"));
    assert_eq!(tested.status.code(), Some(4), "{}", stdout(&tested));

    drop(guard);

    // Mailed: SparesMissing, Fail, DeviceDisappeared (mdadm mails no
    // progress), each through `sendmail -t` with its headers and detail.
    let mails = setup.mails();
    let subjects: Vec<&str> = mails
        .iter()
        .filter_map(|m| m.lines().find(|l| l.starts_with("Subject: ")))
        .collect();
    assert_eq!(
        subjects,
        [
            format!("Subject: raidfs: SparesMissing on {mnt}"),
            format!("Subject: raidfs: Fail on {mnt}"),
            format!("Subject: raidfs: DeviceDisappeared on {mnt}"),
        ]
    );
    let fail = &mails[1];
    let (head, body) = fail.split_once("\n\n").expect("headers, then the body");
    assert!(
        head.starts_with("From: raid watch <raid@test>\nTo: ops@example.com\nSubject: "),
        "{fail}"
    );
    assert!(
        body.contains(&format!(
            "A Fail event had been detected on the raidfs mount {mnt}."
        )) && body.contains(&format!("It could be related to member {m1}."))
            && body.contains("State : active, degraded")
            && body.contains(&format!("UUID : {}", setup.uuid)),
        "{fail}"
    );
    // Polled all along, the dead mount was announced once, and its
    // detaching raised nothing.
    assert_eq!(setup.events().len(), 11, "{:?}", setup.events());
    println!("--- events ---");
    for e in setup.events() {
        println!("{}", e.join(" "));
    }
    println!("--- mail 2 of {} ---\n{fail}", mails.len());
}

/// The offsets in `image` of the 4 KiB blocks starting with `marker`.
fn find_block(image: &[u8], marker: &[u8]) -> Vec<u64> {
    image
        .chunks(BLOCK)
        .enumerate()
        .filter(|(_, c)| c.starts_with(marker))
        .map(|(i, _)| (i * BLOCK) as u64)
        .collect()
}

fn marked_blocks(name: &str, blocks: usize) -> Vec<u8> {
    let mut out = Vec::new();
    for b in 0..blocks {
        let mut block = vec![b as u8; BLOCK];
        let marker = format!("raidfs-monitor-test {name} b{b:03} ");
        block[..marker.len()].copy_from_slice(marker.as_bytes());
        out.extend(block);
    }
    out
}

fn spoil(image: &Path, at: u64) {
    let file = fs::OpenOptions::new()
        .write(true)
        .open(image)
        .expect("open image");
    file.write_at(b"spoiled by the test", at + 200)
        .expect("pwrite into the image");
    file.sync_all().expect("sync image");
}

#[test]
fn bad_copies_and_lost_blocks_are_raised_with_their_file() {
    if !fuse_available() {
        return;
    }
    let setup = Setup::new();
    let mnt = setup.mnt.display().to_string();
    // Reads go to slot 0 first, so the spoiled copy there is met.
    let _guard = setup.mount("balance=first");
    fs::create_dir(setup.mnt.join("dir")).expect("mkdir");
    let healed = marked_blocks("healed", 8);
    let lost = marked_blocks("lost", 8);
    fs::write(setup.mnt.join("dir/healed"), &healed).expect("write");
    fs::write(setup.mnt.join("lost"), &lost).expect("write");
    setup.ok("sync", &[]);
    let m0 = member_name(&detail_json(&setup.mnt), 0);

    let hook = setup.path("hook").display().to_string();
    let _monitor = setup.monitor(&["--delay", "0.1", "--program", &hook]);
    // Nothing stands out at the start: no event until the first change.
    // Spoil block 3 of `healed` on m0 only, and block 5 of `lost` on both.
    let images = [setup.path("m0.img"), setup.path("m1.img")];
    let content: Vec<Vec<u8>> = images.iter().map(|p| fs::read(p).expect("image")).collect();
    let healed_at = find_block(&content[0], b"raidfs-monitor-test healed b003 ");
    assert_eq!(healed_at.len(), 1, "one copy of the block on m0");
    spoil(&images[0], healed_at[0]);
    for (image, bytes) in images.iter().zip(&content) {
        let at = find_block(bytes, b"raidfs-monitor-test lost b005 ");
        assert_eq!(at.len(), 1, "one copy of the block on {}", image.display());
        spoil(image, at[0]);
    }
    fs::write("/proc/sys/vm/drop_caches", "3").expect("drop caches (needs root)");

    assert_eq!(
        fs::read(setup.mnt.join("dir/healed")).expect("read the healed file"),
        healed
    );
    let events = setup.wait_for_events(1, "ChecksumError");
    assert_eq!(
        events,
        [event(&["ChecksumError", &mnt, &m0, "/dir/healed"])]
    );
    let err = fs::read(setup.mnt.join("lost")).expect_err("no good copy");
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    // No copy passed, so no member is blamed: only the loss is raised (the
    // kernel may retry the read, which fails again and may raise another).
    let events = setup.wait_for_events(2, "UnrecoverableError");
    assert!(
        events[1..]
            .iter()
            .all(|e| *e == event(&["UnrecoverableError", &mnt, "/lost"])),
        "{events:?}"
    );
    let report = detail_json(&setup.mnt);
    assert!(
        report["unrecoverable_errors"].as_u64() >= Some(1),
        "{report:#}"
    );
    assert_eq!(report["corrected_errors"], 1, "{report:#}");
    assert_eq!(report["last_data_error"]["path"], "/lost", "{report:#}");
    assert_eq!(report["last_data_error"]["offset"], 5 * BLOCK, "{report:#}");
    println!("--- events ---");
    for e in setup.events() {
        println!("{}", e.join(" "));
    }
}

#[test]
fn detail_test_exit_statuses_and_a_oneshot_test_message() {
    if !fuse_available() {
        return;
    }
    let setup = Setup::new();
    let mnt = setup.mnt.display().to_string();
    let tested = |what: &str| {
        let out = raidfs(&["detail", "--test", &mnt], Path::new("/"));
        assert!(
            stdout(&out).contains("State : "),
            "{what}: detail --test prints the detail: {}",
            stdout(&out)
        );
        out.status.code()
    };
    let unmounted = raidfs(&["detail", "--test", &mnt], Path::new("/"));
    assert_eq!(unmounted.status.code(), Some(4), "not mounted");
    let _guard = setup.mount("");
    assert_eq!(tested("healthy"), Some(0));

    // --oneshot --test: a TestMessage for the array, then exit.
    let hook = setup.path("hook").display().to_string();
    let mut once = setup.monitor(&["--oneshot", "--test", "--program", &hook]);
    let status = once.child.wait().expect("wait for the one-shot monitor");
    assert!(status.success(), "monitor --oneshot: {status}");
    assert_eq!(setup.events(), [event(&["TestMessage", &mnt])]);

    setup.ok("fail", &["1"]);
    assert_eq!(tested("degraded"), Some(1));
    // A one-shot pass reports the standing condition.
    let mut once = setup.monitor(&["-1", "--program", &hook]);
    assert!(once.child.wait().expect("wait").success());
    assert_eq!(setup.events()[1..], [event(&["DegradedArray", &mnt])]);
    let said = fs::read_to_string(setup.path("monitor.out")).expect("monitor output");
    assert!(
        said.contains(&format!("DegradedArray event detected on {mnt}: ")),
        "{said}"
    );

    // No sendmail anywhere: one warning, and the events still go out.
    let fallbacks = ["/usr/sbin/sendmail", "/usr/lib/sendmail"];
    if fallbacks.iter().all(|p| !Path::new(p).exists()) {
        let out = Command::new(env!("CARGO_BIN_EXE_raidfs"))
            .args([
                "monitor",
                "-1",
                "-t",
                "--mail",
                "ops@example.com",
                "--program",
                &hook,
            ])
            .arg(&setup.mnt)
            .env("PATH", "/usr/bin:/bin")
            .output()
            .expect("run raidfs monitor");
        assert!(out.status.success(), "{out:?}");
        let warned = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            warned.matches("warning: no sendmail on PATH").count(),
            1,
            "{warned}"
        );
        assert_eq!(
            setup.events()[2..],
            [
                event(&["TestMessage", &mnt]),
                event(&["DegradedArray", &mnt])
            ]
        );
    }
}

/// A host filesystem mounted for one test; lazily unmounted on drop.
struct HostMount(PathBuf);

impl Drop for HostMount {
    fn drop(&mut self) {
        common::detach(&self.0);
    }
}

fn must(cmd: &str, args: &[&str]) {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running {cmd}: {e}"));
    assert!(
        out.status.success(),
        "{cmd} {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The host (an ext4 with `errors=remount-ro`) fails: every member write
/// is refused at once, no member is failed, the array is suspended, and
/// `detail --test` says unusable (2).
#[test]
fn detail_test_says_unusable_when_the_host_fails_every_member() {
    if !fuse_available() {
        return;
    }
    let mkfs = Command::new("mkfs.ext4").arg("-V").output();
    if mkfs.is_err() || !Path::new("/sys/fs/ext4").exists() {
        eprintln!("skipping: needs mkfs.ext4 and ext4 in the kernel");
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let image = dir.path().join("host.img").display().to_string();
    let host = dir.path().join("host");
    fs::create_dir(&host).expect("mkdir host");
    let mnt = dir.path().join("mnt");
    fs::create_dir(&mnt).expect("mkdir mnt");
    let shown_host = host.display().to_string();
    must("truncate", &["-s", "300M", &image]);
    must("mkfs.ext4", &["-q", &image]);
    must(
        "mount",
        &["-o", "loop,errors=remount-ro", &image, &shown_host],
    );
    let _host_guard = HostMount(host.clone());
    let members: Vec<String> = (0..3)
        .map(|i| host.join(format!("m{i}.img")).display().to_string())
        .collect();
    let mut create = vec!["create", "-l", "5", "-s", "64M"];
    create.extend(members.iter().map(String::as_str));
    raidfs_ok(&create, dir.path());
    let guard = DaemonGuard::new(&mnt);
    let log = format!("log={}", dir.path().join("daemon.log").display());
    let mut mount = vec!["mount", "-o", &log];
    mount.extend(members.iter().map(String::as_str));
    let shown_mnt = mnt.display().to_string();
    mount.push(&shown_mnt);
    raidfs_ok(&mount, dir.path());
    let tested = || {
        raidfs(&["detail", "--test", &shown_mnt], Path::new("/"))
            .status
            .code()
    };
    assert_eq!(tested(), Some(0));

    let mounts = fs::read_to_string("/proc/mounts").expect("/proc/mounts");
    let device = mounts
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|f| f.len() > 2 && f[1] == shown_host && f[2] == "ext4")
        .and_then(|f| f[0].rsplit('/').next().map(str::to_string))
        .expect("the host's loop device");
    fs::write(
        format!("/sys/fs/ext4/{device}/trigger_fs_error"),
        "raidfs monitor test",
    )
    .expect("trigger an ext4 error");
    // The write meets the read-only host (its errno is the mount's
    // business, see mount_host_faults); the array is then suspended.
    common::write_synced(&mnt.join("after"), &common::pattern(1, 1 << 20))
        .expect_err("the host is read-only");
    let report = detail_json(&mnt);
    assert!(report["suspended"].is_string(), "{report:#}");
    assert_eq!(tested(), Some(2), "{report:#}");
    let _ = raidfs(&["umount", &shown_mnt], dir.path());
    drop(guard);
}
