//! Scrubs people can schedule, on live mounts through the `raidfs` binary:
//! a check paused with `check --stop` resumes from its checkpoint (also
//! after an unmount and after the daemon is killed), `--wait` attaches to
//! a running check and `--max-time` pauses it, `--continue` resumes only a
//! paused one, and a check asked for while a rebuild runs is refused with
//! a message naming the rebuild.

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::cli::{raidfs_ok, stderr, stdout, wait_for_detail};
use common::fuse_available;
use common::mounted::Mounted;

const MIB: u64 = 1 << 20;
const MEMBERS: [&str; 4] = ["m0", "m1", "m2", "m3"];

/// A RAID5 of four 2 GiB sparse images (large groups, so a check at a few
/// MiB/s takes long enough to be paused mid-way), mounted, with 48 MiB of
/// files written.
fn scrubbed_array() -> Mounted {
    let m = Mounted::new("5", "2G", &MEMBERS);
    for i in 0..3u8 {
        let data = common::pattern(i, 16 << 20);
        common::write_synced(&m.mnt.join(format!("f{i}")), &data).expect("write a file");
    }
    m
}

/// Wait until no background work runs (a resync after a kill, say).
fn settle(m: &Mounted, what: &str) -> serde_json::Value {
    wait_for_detail(&m.mnt, what, Duration::from_secs(120), |r| {
        r["sync"].is_null()
    })
}

fn u64_at(v: &serde_json::Value, path: &[&str]) -> u64 {
    let mut at = v;
    for key in path {
        at = &at[*key];
    }
    at.as_u64()
        .unwrap_or_else(|| panic!("no number at {path:?} in {v:#}"))
}

#[test]
fn check_paused_resumes_from_its_checkpoint_across_remount_and_kill() {
    if !fuse_available() {
        return;
    }
    let array = scrubbed_array();
    array.ok("speed-limit", &["--max", "4M"]);
    let said = array.ok("check", &[]);
    assert!(said.contains("check started"), "{said}");
    let running = wait_for_detail(&array.mnt, "check progress", Duration::from_secs(30), |r| {
        r["sync"]["action"] == "check" && r["sync"]["done"].as_u64() >= Some(12 * MIB)
    });
    let total = u64_at(&running, &["sync", "total"]);
    assert!(total > 40 * MIB, "{running:#}");

    // Paused: the position is kept and shown.
    let said = array.ok("check", &["--stop"]);
    assert!(
        said.contains("check stopped at") && said.contains("`raidfs check` resumes it"),
        "{said}"
    );
    let paused = array.detail();
    assert!(paused["sync"].is_null(), "{paused:#}");
    assert_eq!(paused["last_sync"]["completed"], false, "{paused:#}");
    assert_eq!(paused["paused_scrub"]["action"], "check", "{paused:#}");
    let at = u64_at(&paused, &["paused_scrub", "done"]);
    assert!(at >= 12 * MIB && at < total, "paused at {at} of {total}");
    assert_eq!(u64_at(&paused, &["paused_scrub", "total"]), total);

    // Across an unmount: in the superblocks, and not resumed by the mount.
    array.umount();
    let examined = raidfs_ok(&["examine", "m0"], array.dir.path());
    assert!(
        examined.contains("Scrub Checkpoint : check paused at member offset"),
        "{examined}"
    );
    array.mount();
    let mounted = array.detail();
    assert!(mounted["sync"].is_null(), "{mounted:#}");
    assert_eq!(u64_at(&mounted, &["paused_scrub", "done"]), at);

    // Resumed: its progress starts at the checkpoint. (A clean unmount
    // forgets the speed limits.)
    array.ok("speed-limit", &["--max", "4M"]);
    let said = array.ok("check", &[]);
    assert!(said.contains("check resumed at"), "{said}");
    let resumed = array.detail();
    assert_eq!(resumed["sync"]["action"], "check", "{resumed:#}");
    assert!(u64_at(&resumed, &["sync", "done"]) >= at, "{resumed:#}");
    assert!(resumed["paused_scrub"].is_null(), "{resumed:#}");

    // Killed past a checkpoint (every 2 s; 20 MiB take 5 s here): the next
    // mount knows how far the resumed check got.
    wait_for_detail(
        &array.mnt,
        "resumed progress",
        Duration::from_secs(30),
        |r| r["sync"]["done"].as_u64() >= Some(at + 20 * MIB),
    );
    common::kill_daemon(&array.mnt, Duration::from_secs(30));
    array.mount();
    let settled = settle(&array, "the resync after the kill");
    assert_eq!(settled["paused_scrub"]["action"], "check", "{settled:#}");
    let at_kill = u64_at(&settled, &["paused_scrub", "done"]);
    assert!(
        at_kill > at && at_kill < total,
        "{at_kill} after {at} of {total}"
    );

    // The rest, to the end: the totals are the whole array's.
    array.ok("speed-limit", &["--max", "0"]);
    let said = array.ok("check", &["--wait"]);
    assert!(
        said.contains("check resumed at") && said.contains("check finished (0 bytes mismatched)"),
        "{said}"
    );
    let done = array.detail();
    assert_eq!(done["last_sync"]["action"], "check", "{done:#}");
    assert_eq!(done["last_sync"]["completed"], true, "{done:#}");
    assert_eq!(u64_at(&done, &["last_sync", "done"]), total);
    assert_eq!(u64_at(&done, &["last_sync", "total"]), total);
    assert!(done["paused_scrub"].is_null(), "{done:#}");
    array.umount();
    let examined = raidfs_ok(&["examine", "m0"], array.dir.path());
    assert!(!examined.contains("Scrub Checkpoint"), "{examined}");
}

#[test]
fn wait_attaches_max_time_pauses_and_a_rebuild_is_named() {
    if !fuse_available() {
        return;
    }
    let array = scrubbed_array();
    array.ok("speed-limit", &["--max", "4M"]);
    array.ok("check", &[]);

    // A second client follows the running check, and pauses it at its limit.
    let said = array.ok("check", &["--wait", "--max-time", "3s"]);
    assert!(
        said.contains("check is already running (") && said.contains("following it"),
        "{said}"
    );
    assert!(
        said.contains("paused at its time limit: check stopped at"),
        "{said}"
    );
    let paused = array.detail();
    assert!(paused["sync"].is_null(), "{paused:#}");
    assert_eq!(paused["paused_scrub"]["action"], "check", "{paused:#}");
    let at = u64_at(&paused, &["paused_scrub", "done"]);
    assert!(at > 0, "{paused:#}");

    // SIGTERM (systemd stopping the unit) pauses a limited wait too.
    let mut child = Command::new(env!("CARGO_BIN_EXE_raidfs"))
        .args(["check", "--wait", "--max-time", "1h"])
        .arg(&array.mnt)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start check --wait");
    wait_for_detail(
        &array.mnt,
        "the resumed check",
        Duration::from_secs(30),
        |r| r["sync"]["action"] == "check",
    );
    // SAFETY: a signal to the child this test started.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    let status = child.wait().expect("check --wait ends");
    let mut out = String::new();
    std::io::Read::read_to_string(child.stdout.as_mut().expect("stdout"), &mut out)
        .expect("read stdout");
    assert!(status.success(), "{status:?}: {out}");
    assert!(out.contains("check resumed at"), "{out}");
    assert!(out.contains("paused on SIGTERM: check stopped at"), "{out}");
    let paused = array.detail();
    assert!(paused["sync"].is_null(), "{paused:#}");
    assert!(
        u64_at(&paused, &["paused_scrub", "done"]) >= at,
        "{paused:#}"
    );

    // A rebuild runs: a check is refused, naming it and how far it is.
    array.ok("fail", &["m1"]);
    array.ok("add", &["new1"]);
    let out = array.run("check", &[]);
    assert!(!out.status.success(), "{}", stdout(&out));
    let why = stderr(&out);
    assert!(
        why.contains("recovery is running (") && why.contains("%)"),
        "{why}"
    );
    array.ok("speed-limit", &["--max", "0"]);
    let rebuilt = settle(&array, "the end of recovery");
    assert_eq!(rebuilt["map"], "[UUUU]", "{rebuilt:#}");

    // --continue resumes the paused check (kept through the rebuild), and
    // does nothing once none is paused.
    let said = array.ok("check", &["--continue", "--wait"]);
    assert!(
        said.contains("check resumed at") && said.contains("check finished"),
        "{said}"
    );
    let said = array.ok("check", &["--continue"]);
    assert!(said.contains("no paused check to continue"), "{said}");
    assert!(array.detail()["sync"].is_null());

    // A paused repair resumes as a check does; --restart starts over.
    array.ok("speed-limit", &["--max", "4M"]);
    array.ok("repair", &[]);
    wait_for_detail(
        &array.mnt,
        "repair progress",
        Duration::from_secs(30),
        |r| r["sync"]["done"].as_u64() >= Some(12 * MIB),
    );
    let said = array.ok("check", &["--stop"]);
    assert!(said.contains("repair stopped at"), "{said}");
    let at = u64_at(&array.detail(), &["paused_scrub", "done"]);
    assert!(at >= 12 * MIB, "repair paused at {at}");
    let said = array.ok("repair", &[]);
    assert!(said.contains("repair resumed at"), "{said}");
    let resumed = array.detail();
    assert!(u64_at(&resumed, &["sync", "done"]) >= at, "{resumed:#}");
    array.ok("check", &["--stop"]);
    let said = array.ok("repair", &["--restart"]);
    assert_eq!(said.trim(), "raidfs: repair started", "{said}");
    // From the start: at 4 MiB/s it cannot be back at the checkpoint yet.
    assert!(u64_at(&array.detail(), &["sync", "done"]) < at);
    array.ok("check", &["--stop"]);
    array.umount();
}
