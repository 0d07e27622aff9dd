//! Member lifecycle on live mounts, through the `raidfs` binary over real
//! image files: fail/add/replace while a writer keeps writing, a daemon
//! killed mid-rebuild that resumes from its checkpoint, a daemon killed
//! mid-write whose next mount resyncs only the dirty regions, the
//! status/detail views, and refusal of changes from other users.

mod common;

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use common::cli::{raidfs_ok, stderr, stdout, verify_files, wait_for_detail, Writer};
use common::fuse_available;
use common::mounted::Mounted;

/// An array of four images (m0..m3) in a temporary directory, mounted.
fn four(level: &str, size: &str) -> Mounted {
    Mounted::new(level, size, &["m0", "m1", "m2", "m3"])
}

fn member_names(report: &serde_json::Value) -> Vec<String> {
    let members = report["members"].as_array().expect("members");
    members
        .iter()
        .map(|m| {
            let name = m["name"].as_str().unwrap_or_default();
            Path::new(name)
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default()
        })
        .collect()
}

fn states(report: &serde_json::Value) -> Vec<String> {
    let members = report["members"].as_array().expect("members");
    members
        .iter()
        .map(|m| m["state"].as_str().unwrap_or_default().to_string())
        .collect()
}

/// The last background work completed, and was `action`.
fn assert_last_sync(report: &serde_json::Value, action: &str) {
    let last = &report["last_sync"];
    assert_eq!(last["action"], action, "{report:#}");
    assert_eq!(last["completed"], true, "{report:#}");
    assert!(report["sync"].is_null(), "{report:#}");
}

#[test]
fn raid5_fail_add_then_fail_another_while_writing() {
    if !fuse_available() {
        return;
    }
    let array = four("5", "64M");
    let writer = Writer::start(&array.mnt.join("data"));
    writer.wait_for_more(5);

    let said = array.ok("fail", &["m1"]);
    assert!(
        said.contains("set") && said.contains("m1 (slot 1) faulty"),
        "{said}"
    );
    let report = array.detail();
    assert_eq!(report["map"], "[U_UU]");
    assert_eq!(states(&report), ["active", "faulty", "active", "active"]);
    assert_eq!(report["degraded"], true);
    writer.wait_for_more(5);

    let said = array.ok("add", &["--wait", "new1"]);
    assert!(said.contains("recovery of slot 1 started"), "{said}");
    assert!(said.contains("recovery finished"), "{said}");
    let report = array.detail();
    assert_eq!(report["map"], "[UUUU]");
    assert_eq!(member_names(&report), ["m0", "new1", "m2", "m3"]);
    assert_last_sync(&report, "recovery");
    writer.wait_for_more(5);

    array.ok("fail", &["m2"]);
    assert_eq!(array.detail()["map"], "[UU_U]");
    writer.wait_for_more(5);
    let dir = writer.dir().to_path_buf();
    let count = writer.finish();
    // Slot 2 is gone: every read of its chunks reconstructs through new1.
    verify_files(&dir, count);
    array.umount();
}

#[test]
fn raid6_two_members_failed_and_rebuilt_while_writing() {
    if !fuse_available() {
        return;
    }
    let array = four("6", "64M");
    let writer = Writer::start(&array.mnt.join("data"));
    writer.wait_for_more(5);
    array.ok("fail", &["m1"]);
    array.ok("fail", &["m2"]);
    assert_eq!(array.detail()["map"], "[U__U]");
    // A third failure would stop the array: refused.
    let out = array.run("fail", &["m3"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("refusing to fail"),
        "{}",
        stderr(&out)
    );
    writer.wait_for_more(5);

    let said = array.ok("add", &["--wait", "new1"]);
    assert!(said.contains("recovery of slot 1 started"), "{said}");
    writer.wait_for_more(3);
    let said = array.ok("add", &["--wait", "new2"]);
    assert!(said.contains("recovery of slot 2 started"), "{said}");
    let report = array.detail();
    assert_eq!(report["map"], "[UUUU]");
    assert_eq!(member_names(&report), ["m0", "new1", "new2", "m3"]);
    writer.wait_for_more(5);

    // Lose the two original members that were never rebuilt: everything
    // must now come from the two rebuilt ones.
    array.ok("fail", &["m0"]);
    array.ok("fail", &["3"]);
    assert_eq!(array.detail()["map"], "[_UU_]");
    writer.wait_for_more(3);
    let dir = writer.dir().to_path_buf();
    let count = writer.finish();
    verify_files(&dir, count);
    array.umount();
}

#[test]
fn raid5_replace_while_writing_then_fail_another() {
    if !fuse_available() {
        return;
    }
    let array = four("5", "64M");
    let writer = Writer::start(&array.mnt.join("data"));
    writer.wait_for_more(5);
    let said = array.ok("replace", &["--wait", "m2", "new2"]);
    assert!(said.contains("replacing"), "{said}");
    assert!(said.contains("replace finished"), "{said}");
    let report = array.detail();
    assert_eq!(member_names(&report), ["m0", "m1", "new2", "m3"]);
    assert_eq!(report["map"], "[UUUU]");
    assert_last_sync(&report, "replace");
    writer.wait_for_more(5);

    array.ok("fail", &["m0"]);
    writer.wait_for_more(5);
    let dir = writer.dir().to_path_buf();
    let count = writer.finish();
    verify_files(&dir, count);
    array.umount();
}

/// A RAID5 on large sparse members (2 GiB: large groups, hundreds of
/// bitmap regions) with a writer of small files running, 40 files in; and
/// the writer's directory.
fn large_raid5_being_written() -> (Mounted, Writer, PathBuf) {
    let array = four("5", "2G");
    let writer = Writer::start(&array.mnt.join("data"));
    writer.wait_for_more(40);
    let dir = writer.dir().to_path_buf();
    (array, writer, dir)
}

fn daemon_pid(report: &serde_json::Value) -> i32 {
    report["daemon_pid"].as_i64().expect("daemon_pid") as i32
}

#[test]
fn rebuild_resumes_from_its_checkpoint_after_the_daemon_is_killed() {
    if !fuse_available() {
        return;
    }
    // Large groups, so the rebuild takes seconds.
    let (array, writer, dir) = large_raid5_being_written();
    let count = writer.finish();

    array.ok("fail", &["m1"]);
    let said = array.ok("speed-limit", &["--max", "4M"]);
    assert!(said.contains("max 4096K/sec"), "{said}");
    array.ok("add", &["new1"]);

    // Past the first checkpoint (every 2 s; at most ~5 MiB/s here).
    let killed_at = wait_for_detail(
        &array.mnt,
        "recovery progress",
        Duration::from_secs(20),
        |r| r["sync"]["done"].as_u64().is_some_and(|d| d >= 16 << 20),
    );
    let total = killed_at["sync"]["total"].as_u64().expect("total");
    assert!(
        killed_at["sync"]["done"].as_u64() < Some(total),
        "finished before the kill: {killed_at:#}"
    );
    let text = array.ok("status", &[]);
    let progress = text
        .lines()
        .find(|l| l.starts_with("      ["))
        .expect("a progress line");
    assert!(
        progress.contains("]  recovery =")
            && progress.contains("finish=")
            && progress.ends_with("K/sec"),
        "{text}"
    );
    assert!(
        text.contains("new1[1](R)") && text.contains("[4/3] [U_UU]"),
        "{text}"
    );

    assert_eq!(array.kill_daemon(), daemon_pid(&killed_at));
    array.mount_members(&["m0", "new1", "m2", "m3"]);

    // The limits survive the crash, so the resumed rebuild is still slow
    // enough to be seen starting from its checkpoint, not from zero.
    let resumed = array.detail();
    assert_eq!(resumed["sync"]["action"], "recovery", "{resumed:#}");
    assert_eq!(resumed["sync"]["slot"], 1);
    let done = resumed["sync"]["done"].as_u64().expect("done");
    assert!(done > 0 && done <= total, "resumed at {done} of {total}");
    assert_eq!(resumed["speed_limit"]["max"], 4 << 20);
    let log = std::fs::read_to_string(array.path("daemon.log")).expect("daemon log");
    assert!(log.contains("resuming recovery of slot 1"), "{log}");

    array.ok("speed-limit", &["--max", "0", "--min", "0"]);
    let finished = wait_for_detail(
        &array.mnt,
        "the end of recovery",
        Duration::from_secs(20),
        |r| r["sync"].is_null(),
    );
    // The daemon was killed with the array dirty: the resync of its dirty
    // regions follows the recovery, once no member is missing.
    let last = finished["last_sync"]["action"].as_str().unwrap_or_default();
    assert!(last == "recovery" || last == "resync", "{finished:#}");
    assert_eq!(finished["last_sync"]["completed"], true, "{finished:#}");
    let log = std::fs::read_to_string(array.path("daemon.log")).expect("daemon log");
    assert!(
        log.contains("recovery of slot 1 (") && log.contains("is complete"),
        "{log}"
    );
    assert_eq!(finished["map"], "[UUUU]");
    verify_files(&dir, count);
    // Prove the rebuilt member right: read with another member gone.
    array.ok("fail", &["m3"]);
    verify_files(&dir, count);
    array.umount();
}

/// `(regions, dirty MiB, allocated MiB)` from the daemon's line
/// `resync of N dirty regions (X MiB of Y MiB allocated)`.
fn resync_plan(log: &str) -> Option<(u64, u64, u64)> {
    let line = log.lines().find(|l| l.contains("resync of "))?;
    let words: Vec<&str> = line[line.find("resync of ")?..]
        .split([' ', '('])
        .filter(|w| !w.is_empty())
        .collect();
    // resync of N dirty regions X MiB of Y MiB allocated)
    match words.as_slice() {
        ["resync", "of", n, "dirty", "regions", x, "MiB", "of", y, "MiB", ..] => {
            Some((n.parse().ok()?, x.parse().ok()?, y.parse().ok()?))
        }
        _ => None,
    }
}

#[test]
fn kill_during_writes_resyncs_only_the_dirty_regions() {
    if !fuse_available() {
        return;
    }
    // Hundreds of bitmap regions, of which the writer dirties a few.
    let (array, writer, dir) = large_raid5_being_written();
    // Killed while the writer keeps writing: the array is left dirty.
    array.kill_daemon();
    let count = writer.finish_after_crash();

    array.mount_members(&["m0", "m1", "m2", "m3"]);
    let finished = wait_for_detail(
        &array.mnt,
        "the end of the resync",
        Duration::from_secs(20),
        |r| r["last_sync"]["action"] == "resync",
    );
    assert_last_sync(&finished, "resync");
    assert_eq!(finished["map"], "[UUUU]");

    // The log names the dirty regions: a small part of what is allocated.
    let log = std::fs::read_to_string(array.path("daemon.log")).expect("daemon log");
    let (regions, dirty_mib, allocated_mib) =
        resync_plan(&log).unwrap_or_else(|| panic!("no resync plan in the log:\n{log}"));
    assert!(regions > 0, "{log}");
    assert!(
        dirty_mib > 0 && dirty_mib * 2 <= allocated_mib,
        "resynced {dirty_mib} MiB of {allocated_mib} MiB allocated\n{log}"
    );
    let summary =
        format!("resync finished: {regions} dirty regions, {dirty_mib} of {dirty_mib} MiB");
    assert!(log.contains(&summary), "{summary:?} not in\n{log}");

    // detail shows the same size: the resync covered exactly the dirty regions.
    let last = &finished["last_sync"];
    assert_eq!(last["message"], summary.as_str(), "{finished:#}");
    assert_eq!(
        last["total"].as_u64(),
        Some(dirty_mib << 20),
        "{finished:#}"
    );
    assert_eq!(last["done"], last["total"], "{finished:#}");
    let text = array.ok("detail", &[]);
    assert!(text.contains(&summary), "{text}");

    verify_files(&dir, count);
    array.umount();
}

/// `raidfs ARGS` as user nobody.
fn as_nobody(args: &[&OsStr]) -> Output {
    Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            env!("CARGO_BIN_EXE_raidfs"),
        ])
        .args(args)
        .current_dir("/")
        .output()
        .expect("run setpriv")
}

#[test]
fn status_and_detail_views_and_other_users_are_refused() {
    if !fuse_available() {
        return;
    }
    let array = four("5", "64M");
    std::fs::write(array.mnt.join("f"), vec![7u8; 300_000]).expect("write a file");
    let mnt = array.mnt.display().to_string();

    let all = raidfs_ok(&["status"], Path::new("/"));
    assert!(
        all.contains(&format!("{mnt} : active raid5 m0[0] m1[1] m2[2] m3[3]\n")),
        "{all}"
    );
    assert!(
        all.contains(
            "blocks super raidfs-1 level 5, 64k chunk, algorithm left-symmetric [4/4] [UUUU]"
        ),
        "{all}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&array.ok("status", &["--json"])).expect("JSON");
    assert_eq!(json["version"], 1);
    let one = &json["arrays"][0];
    assert_eq!(one["mount_point"], mnt.as_str());
    assert_eq!(one["level"], "raid5");
    assert_eq!(one["chunk"], 64 * 1024);
    assert_eq!(one["raid_devices"], 4);
    assert_eq!(member_names(one), ["m0", "m1", "m2", "m3"]);

    let said = array.ok("check", &["--wait"]);
    assert!(
        said.contains("check finished") && said.contains(" bytes mismatched)"),
        "{said}"
    );
    let mismatches = array.detail()["last_sync"]["mismatches"]
        .as_u64()
        .expect("mismatches");
    assert!(
        said.contains(&format!("({mismatches} bytes mismatched)")),
        "{said}"
    );
    array.ok("speed-limit", &["--min", "20M", "--max", "100M"]);
    array.ok("fail", &["m3"]);

    let text = array.ok("status", &[]);
    assert!(
        text.contains("m3[3](F)") && text.contains("[4/3] [UUU_]"),
        "{text}"
    );
    let detail = array.ok("detail", &[]);
    for want in [
        "        Raid Level : raid5",
        "      Raid Devices : 4",
        "             State : active, degraded",
        "    Active Devices : 3",
        "    Failed Devices : 1",
        "            Layout : left-symmetric",
        "        Chunk Size : 64K",
        " Sync Speed Limits : min 20480K/sec, max 102400K/sec",
    ] {
        assert!(detail.contains(want), "missing {want:?} in\n{detail}");
    }
    let m3 = array.path("m3").canonicalize().expect("m3");
    assert!(
        detail.lines().any(
            |l| l.trim_start().starts_with("3   faulty") && l.ends_with(&*m3.to_string_lossy())
        ),
        "{detail}"
    );
    let report = array.detail();
    assert_eq!(report["version"], 1);
    assert_eq!(report["failed_devices"], 1);
    assert_eq!(report["active_devices"], 3);
    assert_eq!(report["state"], "active, degraded");
    assert_eq!(report["speed_limit"]["min"], 20 << 20);
    assert_eq!(report["last_sync"]["action"], "check");
    let last_sync = format!("         Last Sync : check finished ({mismatches} bytes mismatched)");
    assert!(
        detail.contains(&last_sync),
        "missing {last_sync:?} in\n{detail}"
    );
    assert_eq!(report["uuid"].as_str().map(str::len), Some(36));

    // The socket is owner-only: another user cannot even ask.
    let fail_m1: [&OsStr; 3] = [OsStr::new("fail"), array.mnt.as_os_str(), OsStr::new("m0")];
    let out = as_nobody(&fail_m1);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("permission denied"),
        "{}",
        stderr(&out)
    );
    // Opened up, others may look but still not change anything.
    let socket = raidfs::cli::status::socket_path(&array.mnt);
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o666))
            .expect("chmod socket");
    }
    let out = as_nobody(&[OsStr::new("status"), array.mnt.as_os_str()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("[4/3] [UUU_]"), "{}", stdout(&out));
    let out = as_nobody(&fail_m1);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("only root or the mount's owner (uid 0)"),
        "{}",
        stderr(&out)
    );
    assert_eq!(array.detail()["map"], "[UUU_]");

    array.umount();
    assert!(!socket.exists(), "the socket outlived the mount");
}

#[test]
fn remove_and_re_add_with_the_refusals_on_the_way() {
    if !fuse_available() {
        return;
    }
    let array = four("5", "64M");
    let writer = Writer::start(&array.mnt.join("data"));
    writer.wait_for_more(5);
    array.ok("fail", &["m1"]);

    let refused = |verb: &str, args: &[&str], why: &str| {
        let out = array.run(verb, args);
        assert!(
            !out.status.success(),
            "raidfs {verb} {args:?} was not refused"
        );
        assert!(
            stderr(&out).contains(why),
            "raidfs {verb} {args:?}: {}",
            stderr(&out)
        );
    };
    refused(
        "add",
        &["m1"],
        "is still slot 1 of this array (faulty); remove it first",
    );
    refused("remove", &["m0"], "is active; mark it failed first");
    refused("check", &["--stop"], "no background work is running");
    refused(
        "fail",
        &["nonesuch"],
        "nonesuch is not a member of this array",
    );
    raidfs_ok(
        &["create", "-l", "1", "-s", "64M", "other0", "other1"],
        array.dir.path(),
    );
    refused("add", &["other0"], "holds a member of another array");

    array.ok("remove", &["m1"]);
    let report = array.detail();
    assert_eq!(states(&report), ["active", "missing", "active", "active"]);
    let text = array.ok("status", &[]);
    assert!(
        text.contains(" : active raid5 m0[0] m2[2] m3[3]\n"),
        "{text}"
    );
    writer.wait_for_more(5);

    let said = array.ok("add", &["--wait", "m1"]);
    assert!(
        said.contains("re-added") && said.contains("recovery finished"),
        "{said}"
    );
    assert_eq!(member_names(&array.detail()), ["m0", "m1", "m2", "m3"]);
    writer.wait_for_more(5);
    array.ok("fail", &["m2"]);
    let dir = writer.dir().to_path_buf();
    let count = writer.finish();
    verify_files(&dir, count);
    array.umount();
}
