//! `raidfs grow` on live mounts over real image files and loop devices:
//! the array changes level or takes members while a writer keeps writing
//! fsync'd files, shows the reshape the way mdstat does, gives the space it
//! gained to the filesystem, and a daemon killed at any point of a reshape
//! leaves an array whose next mount resumes it, with every fsync'd byte and
//! a clean fsck; members made larger (images extended, loop devices
//! resized) give their space at once.

mod common;

use std::path::Path;
use std::time::Duration;

use common::cli::{
    detail_json, raidfs, raidfs_ok, stderr, stdout, verify_files, wait_for_detail, Writer,
};
use common::fuse_available;
use common::mounted::Mounted;
use rand::{Rng, SeedableRng};

const MEMBERS: [&str; 3] = ["m0", "m1", "m2"];

/// Three 96 MiB images in a temporary directory, mounted on `mnt`.
fn three(level: &str) -> Mounted {
    Mounted::new(level, "96M", &MEMBERS)
}

/// `raidfs fsck` of the unmounted members succeeds.
fn fsck_clean(m: &Mounted, when: &str) {
    let members = m.members();
    let mut args = vec!["fsck"];
    args.extend(members.iter().map(String::as_str));
    let out = raidfs(&args, m.dir.path());
    assert!(
        out.status.success(),
        "{when}: fsck failed\nstdout: {}\nstderr: {}",
        stdout(&out),
        stderr(&out)
    );
}

/// A file of `mib` MiB of seeded bytes, so several data groups are in use.
fn fill(m: &Mounted, mib: usize) -> Vec<u8> {
    let mut bytes = vec![0u8; mib << 20];
    rand::rngs::StdRng::seed_from_u64(mib as u64).fill(&mut bytes[..]);
    std::fs::write(m.mnt.join("big"), &bytes).expect("write big");
    bytes
}

/// The level member m0's superblock records.
fn level_of_member(m: &Mounted) -> String {
    let out = raidfs_ok(&["examine", "--json", "m0"], m.dir.path());
    let json: serde_json::Value = serde_json::from_str(&out).expect("examine --json");
    json[0]["level"].as_str().unwrap_or_default().to_string()
}

fn blocks(path: &Path) -> u64 {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).expect("path");
    // SAFETY: statvfs fills the zeroed struct it is given.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut st) }, 0, "statvfs");
    st.f_blocks as u64 * st.f_frsize as u64
}

fn reshaped(r: &serde_json::Value, level: &str) -> bool {
    r["level"] == level && r["sync"].is_null() && r["reshape"].is_null()
}

#[test]
fn raid1_becomes_raid5_while_files_are_written() {
    if !fuse_available() {
        return;
    }
    let m = three("1");
    let big = fill(&m, 20);
    let writer = Writer::start(&m.mnt.join("w"));
    writer.wait_for_more(10);
    let size_before = blocks(&m.mnt);
    // Slow enough that the reshape outlasts the checks below until
    // `grow --wait` attaches. Both limits: the writer keeps the array busy,
    // and while it is busy md's minimum (50 MiB/s by default) is the rate in
    // force, as in md, where the minimum overrides a lower maximum.
    m.ok("speed-limit", &["--min", "1M", "--max", "1M"]);
    let said = m.ok("grow", &["--level", "5"]);
    assert!(
        said.contains("reshape from raid1 on 3 members to raid5 on 3 started"),
        "{said}"
    );
    let running = wait_for_detail(&m.mnt, "the reshape", Duration::from_secs(60), |r| {
        r["sync"]["action"] == "reshape"
    });
    assert_eq!(running["level"], "raid5");
    assert_eq!(running["reshape"]["from_level"], "raid1");
    assert!(running["state"]
        .as_str()
        .unwrap_or_default()
        .contains("reshaping"));
    let status = raidfs_ok(&["status"], m.dir.path());
    assert!(status.contains("reshape ="), "{status}");
    let detail = m.ok("detail", &[]);
    assert!(detail.contains("Reshape : raid1 -> raid5"), "{detail}");
    // Writes go on while groups move.
    writer.wait_for_more(10);
    // `grow --wait` attaches to the running reshape and returns at its end.
    // The limit is lifted only once it has attached (its first progress
    // line): unlimited, a reshape this small can end before a client that
    // starts later asks for it, which then finds no reshape to wait for.
    let mut waiter = std::process::Command::new(env!("CARGO_BIN_EXE_raidfs"))
        .args([std::ffi::OsStr::new("grow"), m.mnt.as_os_str()])
        .arg("--wait")
        .current_dir(m.dir.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start raidfs grow --wait");
    let mut progress = std::io::BufReader::new(waiter.stdout.take().expect("piped stdout"));
    let mut first = String::new();
    std::io::BufRead::read_line(&mut progress, &mut first).expect("read grow --wait");
    if !first.contains("reshape") {
        let out = waiter.wait_with_output().expect("wait for grow --wait");
        panic!(
            "grow --wait said {first:?} ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    m.ok("speed-limit", &["--min", "0", "--max", "0"]);
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut progress, &mut rest).expect("read grow --wait");
    let waited = waiter
        .wait_with_output()
        .expect("wait for raidfs grow --wait");
    assert!(
        waited.status.success(),
        "raidfs grow --wait failed\nstdout: {first}{rest}\nstderr: {}",
        String::from_utf8_lossy(&waited.stderr)
    );
    let done = detail_json(&m.mnt);
    assert!(reshaped(&done, "raid5"), "{done:#}");
    let files = writer.finish();
    verify_files(&m.mnt.join("w"), files);
    assert!(std::fs::read(m.mnt.join("big")).expect("read big") == big);
    // RAID5 on three members holds twice what RAID1 on three did.
    let size_after = blocks(&m.mnt);
    assert!(
        size_after > size_before * 3 / 2,
        "size {size_before} -> {size_after}"
    );
    m.umount();
    fsck_clean(&m, "after the reshape");
    assert_eq!(level_of_member(&m), "raid5");
    m.mount();
    verify_files(&m.mnt.join("w"), files);
    m.umount();
}

#[test]
fn a_stopped_reshape_goes_on_with_grow_and_a_degraded_array_refuses() {
    if !fuse_available() {
        return;
    }
    let m = three("1");
    let big = fill(&m, 24);
    m.ok("speed-limit", &["--max", "4M"]);
    m.ok("grow", &["--level", "5"]);
    wait_for_detail(&m.mnt, "the reshape", Duration::from_secs(60), |r| {
        r["sync"]["action"] == "reshape"
    });
    let stopped = m.ok("grow", &["--stop"]);
    assert!(stopped.contains("reshape stopped"), "{stopped}");
    let paused = detail_json(&m.mnt);
    assert!(paused["sync"].is_null());
    assert!(paused["reshape"]["groups_pending"].as_u64().unwrap_or(0) > 0);
    let detail = m.ok("detail", &[]);
    assert!(
        detail.contains("(stopped: `raidfs grow MOUNT` goes on)"),
        "{detail}"
    );
    // Still readable and writable while stopped half way.
    std::fs::write(m.mnt.join("while-stopped"), b"x").expect("write while stopped");
    m.ok("speed-limit", &["--max", "0"]);
    m.ok("grow", &["--wait"]);
    assert!(reshaped(&detail_json(&m.mnt), "raid5"));
    assert!(std::fs::read(m.mnt.join("big")).expect("read") == big);

    // A degraded array refuses, naming why.
    m.ok("fail", &["m2"]);
    let out = m.run("grow", &["--level", "1"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("degraded"), "{}", stderr(&out));
    m.umount();
}

#[test]
fn a_daemon_killed_anywhere_in_a_reshape_resumes_at_the_next_mount() {
    if !fuse_available() {
        return;
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(2026);
    let mut mid_reshape = 0;
    const POINTS: usize = 20;
    for point in 0..POINTS {
        let m = three("1");
        let big = fill(&m, 16);
        let writer = Writer::start(&m.mnt.join("w"));
        writer.wait_for_more(5);
        m.ok("speed-limit", &["--max", "32M"]);
        m.ok("grow", &["--level", "5"]);
        // A random number of status round trips into the reshape.
        for _ in 0..rng.gen_range(0..40) {
            detail_json(&m.mnt);
        }
        let record = common::kill_daemon(&m.mnt, Duration::from_secs(30));
        let synced = writer.finish_after_crash();
        common::detach(&m.mnt);
        drop(record);
        let examined = raidfs_ok(&["examine", "--json", "m0"], m.dir.path());
        let sb: serde_json::Value = serde_json::from_str(&examined).expect("examine --json");
        if !sb[0]["reshape"].is_null() {
            mid_reshape += 1;
        }
        m.mount();
        let back = wait_for_detail(
            &m.mnt,
            "the resumed reshape",
            Duration::from_secs(120),
            |r| reshaped(r, "raid5"),
        );
        assert_eq!(back["level"], "raid5", "point {point}");
        verify_files(&m.mnt.join("w"), synced);
        assert!(
            std::fs::read(m.mnt.join("big")).expect("read big") == big,
            "point {point}: big differs"
        );
        m.umount();
        fsck_clean(&m, &format!("point {point}"));
    }
    eprintln!("{mid_reshape} of {POINTS} kills fell mid-reshape");
    assert!(
        mid_reshape >= POINTS / 2,
        "only {mid_reshape} of {POINTS} kills fell mid-reshape"
    );
}

#[test]
fn raid5_restripes_onto_an_added_member_while_files_are_written() {
    if !fuse_available() {
        return;
    }
    let m = three("5");
    let big = fill(&m, 24);
    let writer = Writer::start(&m.mnt.join("w"));
    writer.wait_for_more(10);
    let size_before = blocks(&m.mnt);
    let said = m.ok("grow", &["--add", "m3", "--wait"]);
    assert!(said.contains("to raid5 on 4 started"), "{said}");
    m.add_member("m3");
    let done = detail_json(&m.mnt);
    assert!(reshaped(&done, "raid5"), "{done:#}");
    assert_eq!(done["raid_devices"], 4);
    assert_eq!(done["map"], "[UUUU]");
    writer.wait_for_more(5);
    let files = writer.finish();
    verify_files(&m.mnt.join("w"), files);
    assert!(std::fs::read(m.mnt.join("big")).expect("read big") == big);
    // RAID5 on four holds three members' worth per group, on three two.
    let size_after = blocks(&m.mnt);
    assert!(
        size_after > size_before * 5 / 4,
        "size {size_before} -> {size_after}"
    );
    // A member of another array is refused without --force.
    let other = tempfile::tempdir().expect("temp dir");
    raidfs_ok(
        &["create", "-l", "1", "-s", "96M", "o0", "o1"],
        other.path(),
    );
    let foreign = other.path().join("o0");
    let out = m.run("grow", &["--add", foreign.to_str().expect("path")]);
    assert!(!out.status.success(), "a foreign member was taken");
    m.umount();
    fsck_clean(&m, "after the restripe");
    m.mount();
    verify_files(&m.mnt.join("w"), files);
    m.umount();
}

#[test]
fn a_mirror_takes_a_third_copy_by_rebuilding_it() {
    if !fuse_available() {
        return;
    }
    let m = Mounted::new("1", "96M", &["m0", "m1"]);
    let big = fill(&m, 16);
    let said = m.ok("grow", &["--add", "m2", "--wait"]);
    assert!(said.contains("raid1 grows to 3 copies"), "{said}");
    m.add_member("m2");
    let done = detail_json(&m.mnt);
    assert_eq!(done["raid_devices"], 3, "{done:#}");
    assert_eq!(done["map"], "[UUU]");
    assert!(done["reshape"].is_null());
    assert_eq!(done["last_sync"]["action"], "recovery");
    assert!(std::fs::read(m.mnt.join("big")).expect("read big") == big);
    m.umount();
    fsck_clean(&m, "after the third mirror");
}

#[test]
fn members_made_larger_give_their_space_while_files_are_written() {
    if !fuse_available() {
        return;
    }
    let m = three("5");
    let big = fill(&m, 20);
    let writer = Writer::start(&m.mnt.join("w"));
    writer.wait_for_more(10);
    // Nothing to gain yet: said so, and not an error.
    let said = m.ok("grow", &["--size", "max"]);
    assert!(said.contains("unchanged"), "{said}");
    let size_before = blocks(&m.mnt);
    let member_size = |m: &Mounted| -> u64 {
        let out = raidfs_ok(&["examine", "--json", "m0"], m.dir.path());
        let json: serde_json::Value = serde_json::from_str(&out).expect("examine --json");
        json[0]["member_size"].as_u64().expect("member_size")
    };
    let data_before = member_size(&m);
    // The host makes every image larger (as `truncate -s 288M` would).
    for name in MEMBERS {
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(m.path(name))
            .expect("open image");
        f.set_len(288 << 20).expect("enlarge image");
    }
    let out = m.run("grow", &["--size", "max", "--add", "m3"]);
    assert!(!out.status.success(), "--size max with --add was taken");
    assert!(stderr(&out).contains("without --add"), "{}", stderr(&out));
    let said = m.ok("grow", &["--size", "max"]);
    assert!(said.contains("grew from"), "{said}");
    // RAID5 on three: two members' worth of every new group, at once.
    let size_after = blocks(&m.mnt);
    eprintln!("filesystem size {size_before} -> {size_after} bytes: {said}");
    assert!(
        size_after > size_before * 5 / 2,
        "size {size_before} -> {size_after}"
    );
    // More than the array held before fits now.
    let large: Vec<u8> = (0..size_before as usize + (16 << 20))
        .map(|i| (i % 251) as u8)
        .collect();
    std::fs::write(m.mnt.join("large"), &large).expect("write past the old size");
    writer.wait_for_more(5);
    let files = writer.finish();
    verify_files(&m.mnt.join("w"), files);
    m.umount();
    assert!(
        member_size(&m) > data_before * 5 / 2,
        "examine shows the new size"
    );
    fsck_clean(&m, "after growing onto larger members");
    m.mount();
    verify_files(&m.mnt.join("w"), files);
    assert!(std::fs::read(m.mnt.join("big")).expect("read big") == big);
    assert!(std::fs::read(m.mnt.join("large")).expect("read large") == large);
    m.umount();
}

/// Loop devices over sparse images in a directory of their own, detached
/// however the test ends (after the mount declared later is gone).
struct Loops {
    _dir: tempfile::TempDir,
    images: Vec<std::path::PathBuf>,
    devices: Vec<String>,
}

impl Loops {
    /// `n` loop devices of `size` bytes, or None where the machine has no
    /// loop devices to give (`losetup` missing, no loop module).
    fn new(n: usize, size: u64) -> Option<Loops> {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut loops = Loops {
            images: Vec::new(),
            devices: Vec::new(),
            _dir: dir,
        };
        for i in 0..n {
            let image = loops._dir.path().join(format!("l{i}.img"));
            std::fs::File::create(&image)
                .and_then(|f| f.set_len(size))
                .expect("backing image");
            let out = std::process::Command::new("losetup")
                .args(["--find", "--show"])
                .arg(&image)
                .output();
            match out {
                Ok(out) if out.status.success() => {
                    loops.images.push(image);
                    loops
                        .devices
                        .push(String::from_utf8_lossy(&out.stdout).trim().to_string());
                }
                other => {
                    eprintln!("skipping: no loop device ({other:?})");
                    return None;
                }
            }
        }
        Some(loops)
    }

    /// Make every backing image `size` bytes and tell the kernel
    /// (`losetup -c`), as growing a volume under a block device would.
    fn enlarge(&self, size: u64) {
        for (image, dev) in self.images.iter().zip(&self.devices) {
            std::fs::OpenOptions::new()
                .write(true)
                .open(image)
                .and_then(|f| f.set_len(size))
                .expect("enlarge backing image");
            let status = std::process::Command::new("losetup")
                .args(["-c", dev])
                .status()
                .expect("losetup -c");
            assert!(status.success(), "losetup -c {dev}");
        }
    }
}

impl Drop for Loops {
    fn drop(&mut self) {
        for dev in &self.devices {
            let _ = std::process::Command::new("losetup")
                .args(["-d", dev])
                .status();
        }
    }
}

#[test]
fn block_devices_made_larger_give_their_space() {
    if !fuse_available() {
        return;
    }
    let Some(loops) = Loops::new(2, 64 << 20) else {
        return;
    };
    let devices: Vec<&str> = loops.devices.iter().map(String::as_str).collect();
    let m = Mounted::new("1", "64M", &devices);
    let before: Vec<u8> = (0..(24 << 20)).map(|i| (i % 253) as u8).collect();
    std::fs::write(m.mnt.join("before"), &before).expect("write");
    let size_before = blocks(&m.mnt);
    loops.enlarge(192 << 20);
    let said = m.ok("grow", &["--size", "max"]);
    assert!(said.contains("grew from"), "{said}");
    let size_after = blocks(&m.mnt);
    assert!(
        size_after > size_before * 5 / 2,
        "size {size_before} -> {size_after}"
    );
    let after: Vec<u8> = (0..size_before as usize).map(|i| (i % 241) as u8).collect();
    std::fs::write(m.mnt.join("after"), &after).expect("write past the old size");
    m.umount();
    fsck_clean(&m, "after growing onto larger block devices");
    m.mount();
    assert!(std::fs::read(m.mnt.join("before")).expect("read") == before);
    assert!(std::fs::read(m.mnt.join("after")).expect("read") == after);
    m.umount();
}
