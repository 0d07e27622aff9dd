//! What the reporting commands print agrees between them: `examine` uses
//! `detail`'s names for the same fields, says when a member is stale, and
//! shows no parity layout for a level without parity.

mod ecosystem_support;

use std::process::Command;

use ecosystem_support::*;

fn examine(array: &Array, members: &[&str]) -> serde_json::Value {
    let out = check(
        raidfs()
            .args(["examine", "--json"])
            .args(members)
            .current_dir(array.dir.path()),
    );
    serde_json::from_slice(&out.stdout).expect("examine --json")
}

/// Unmounts lazily if a test failed with the array mounted.
struct Unmount(std::path::PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        if mount_options(&self.0).is_some() {
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
}

#[test]
fn examine_and_detail_use_the_same_names() {
    let array = Array::new();
    let examined = examine(&array, &["m0.img"]);
    let member = &examined[0];
    for old in ["chunk_bytes", "data_size", "ctime", "utime"] {
        assert!(
            member.get(old).is_none(),
            "{old} is still printed: {member}"
        );
    }
    let _guard = Unmount(array.mnt());
    check(
        raidfs()
            .args(["mount", "-o", &array.log_option()])
            .args(array.members())
            .arg(array.mnt()),
    );
    let out = check(raidfs().args(["detail", "--json"]).arg(array.mnt()));
    let detail: serde_json::Value = serde_json::from_slice(&out.stdout).expect("detail --json");
    let record = daemon(&array.mnt());
    check(raidfs().arg("umount").arg(array.mnt()));
    assert_daemon_finished(&record, &array.mnt());
    for key in [
        "chunk",
        "member_size",
        "data_offset",
        "created",
        "layout",
        "level",
        "raid_devices",
        "array_size",
        "groups_total",
    ] {
        assert!(member.get(key).is_some(), "examine lacks {key}: {member}");
        assert_eq!(member[key], detail[key], "{key}");
    }
}

#[test]
fn examine_says_which_member_is_stale() {
    let array = Array::new();
    let _guard = Unmount(array.mnt());
    check(
        raidfs()
            .args(["mount", "-o", &array.log_option()])
            .args(array.members())
            .arg(array.mnt()),
    );
    check(
        raidfs()
            .arg("fail")
            .arg(array.mnt())
            .arg(array.path("m2.img")),
    );
    let record = daemon(&array.mnt());
    check(raidfs().arg("umount").arg(array.mnt()));
    assert_daemon_finished(&record, &array.mnt());
    let examined = examine(&array, &["m0.img", "m1.img", "m2.img"]);
    let stale: Vec<bool> = (0..3)
        .map(|i| examined[i]["stale"].as_bool().expect("stale"))
        .collect();
    assert_eq!(stale, [false, false, true], "{examined}");
    let out = check(
        raidfs()
            .args(["examine", "m0.img", "m2.img"])
            .current_dir(array.dir.path()),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(text.matches("Stale : yes").count(), 1, "{text}");
    // Alone, a member cannot be judged.
    assert_eq!(examine(&array, &["m2.img"])[0]["stale"], false);
}

#[test]
fn raid1_shows_no_parity_layout() {
    let dir = tempfile::tempdir().unwrap();
    check(
        raidfs()
            .args(["create", "-l", "1", "-s", "64M", "a.img", "b.img"])
            .current_dir(dir.path()),
    );
    let out = check(raidfs().args(["examine", "a.img"]).current_dir(dir.path()));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!text.contains("Layout"), "{text}");
    assert!(!text.contains("symmetric"), "{text}");
    let out = check(
        raidfs()
            .args(["examine", "--json", "a.img"])
            .current_dir(dir.path()),
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json[0]["layout"], "");
}

#[test]
fn fsck_free_space_agrees_with_df_and_check_reports_json() {
    let array = Array::new();
    let _guard = Unmount(array.mnt());
    check(
        raidfs()
            .args(["mount", "-o", &array.log_option()])
            .args(array.members())
            .arg(array.mnt()),
    );
    std::fs::write(array.mnt().join("data"), vec![7u8; 3 << 20]).unwrap();
    check(raidfs().arg("sync").arg(array.mnt()));
    let out = check(
        raidfs()
            .args(["check", "--wait", "--json"])
            .arg(array.mnt()),
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("check --json");
    assert_eq!(report["last_sync"]["action"], "check", "{report}");
    assert_eq!(report["last_sync"]["completed"], true, "{report}");
    assert_eq!(report["last_sync"]["mismatches"], 0, "{report}");
    assert!(report["sync"].is_null(), "{report}");
    let df = statvfs_free(&array.mnt());
    let record = daemon(&array.mnt());
    check(raidfs().arg("umount").arg(array.mnt()));
    assert_daemon_finished(&record, &array.mnt());
    let out = check(
        raidfs()
            .args(["fsck", "--json", "m0.img", "m1.img", "m2.img"])
            .current_dir(array.dir.path()),
    );
    let fsck: serde_json::Value = serde_json::from_slice(&out.stdout).expect("fsck --json");
    assert_eq!(fsck["result"], "clean", "{fsck}");
    assert_eq!(fsck["exit_code"], 0, "{fsck}");
    assert_eq!(fsck["free_bytes"].as_u64(), Some(df), "{fsck}");
    // And the text says the same figure.
    let out = check(
        raidfs()
            .args(["fsck", "m0.img", "m1.img", "m2.img"])
            .current_dir(array.dir.path()),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains(&format!("{df} bytes free")), "{text}");
}

#[test]
fn fsck_shows_its_steps_on_a_terminal_and_nothing_extra_in_a_pipe() {
    let array = Array::new();
    let _guard = Unmount(array.mnt());
    check(
        raidfs()
            .args(["mount", "-o", &array.log_option()])
            .args(array.members())
            .arg(array.mnt()),
    );
    for i in 0..200 {
        std::fs::write(array.mnt().join(format!("f{i}")), b"x").unwrap();
    }
    let record = daemon(&array.mnt());
    check(raidfs().arg("umount").arg(array.mnt()));
    assert_daemon_finished(&record, &array.mnt());
    // util-linux's script(1) gives fsck a terminal; its typescript is
    // what the terminal was sent.
    let typescript = array.path("fsck.typescript");
    let out = check(
        Command::new("script")
            .args(["-q", "-e", "-c"])
            .arg(format!("{RAIDFS} fsck m0.img m1.img m2.img"))
            .arg(&typescript)
            .current_dir(array.dir.path()),
    );
    let shown = String::from_utf8_lossy(&std::fs::read(&typescript).unwrap()).into_owned()
        + &String::from_utf8_lossy(&out.stdout);
    for step in [
        "fsck: reading the metadata tree (",
        "fsck: checking directory entries: ",
        "fsck: checking link counts: ",
        "fsck: checking extents: ",
    ] {
        assert!(shown.contains(step), "{step:?} not shown:\n{shown}");
    }
    assert!(shown.contains("clean"), "{shown}");
    let piped = check(
        raidfs()
            .args(["fsck", "m0.img", "m1.img", "m2.img"])
            .current_dir(array.dir.path()),
    );
    let printed = String::from_utf8_lossy(&piped.stdout).into_owned()
        + &String::from_utf8_lossy(&piped.stderr);
    assert!(
        !printed.contains("fsck: "),
        "steps shown in a pipe: {printed}"
    );
}

/// Free bytes of the filesystem at `path`, as df shows them.
fn statvfs_free(path: &std::path::Path) -> u64 {
    use std::os::unix::ffi::OsStrExt;
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: statvfs is plain data, filled by the call.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: c_path is NUL-terminated and st a valid out pointer.
    let rc = unsafe { libc::statvfs(c_path.as_ptr(), &mut st) };
    assert_eq!(rc, 0, "statvfs {}", path.display());
    st.f_bfree * st.f_frsize
}

#[test]
fn config_scan_and_show_print_json() {
    let array = Array::new();
    let dir = array.dir.path().display().to_string();
    let out = check(raidfs().args(["config", "scan", "--json", &dir]));
    let scanned: serde_json::Value = serde_json::from_slice(&out.stdout).expect("scan --json");
    assert_eq!(
        scanned["arrays"][0]["uuid"],
        array.uuid.as_str(),
        "{scanned}"
    );
    let config = array.path("raidfs.ron");
    let out = check(raidfs().args(["config", "scan", &dir]));
    std::fs::write(&config, &out.stdout).unwrap();
    let out = check(
        raidfs()
            .args(["config", "show", "--json"])
            .env("RAIDFS_CONFIG", &config),
    );
    let shown: serde_json::Value = serde_json::from_slice(&out.stdout).expect("show --json");
    assert_eq!(shown["config"], config.display().to_string());
    let members: Vec<String> = shown["arrays"][0]["members"]
        .as_array()
        .expect("members")
        .iter()
        .map(|m| m.as_str().unwrap_or_default().to_string())
        .collect();
    let expected: Vec<String> = array
        .members()
        .iter()
        .map(|m| m.display().to_string())
        .collect();
    assert_eq!(members, expected, "{shown}");
    assert!(shown["arrays"][0]["error"].is_null(), "{shown}");
}

/// Every key of a JSON document, nested ones included.
fn keys(value: &serde_json::Value, out: &mut Vec<String>) {
    match value {
        serde_json::Value::Object(map) => {
            for (key, inner) in map {
                out.push(key.clone());
                keys(inner, out);
            }
        }
        serde_json::Value::Array(items) => items.iter().for_each(|i| keys(i, out)),
        _ => {}
    }
}

#[test]
fn every_member_read_is_counted_and_every_detail_field_documented() {
    let array = Array::new();
    let _guard = Unmount(array.mnt());
    let mount = || {
        check(
            raidfs()
                .args(["mount", "-o", &array.log_option()])
                .args(array.members())
                .arg(array.mnt()),
        )
    };
    let umount = || {
        let record = daemon(&array.mnt());
        check(raidfs().arg("umount").arg(array.mnt()));
        assert_daemon_finished(&record, &array.mnt());
    };
    mount();
    let data: Vec<u8> = (0..4u32 << 20).map(|i| (i % 251) as u8).collect();
    std::fs::write(array.mnt().join("data"), &data).unwrap();
    umount();
    // A fresh mount: nothing of the file is in any cache.
    mount();
    assert_eq!(std::fs::read(array.mnt().join("data")).unwrap(), data);
    let out = check(raidfs().args(["detail", "--json"]).arg(array.mnt()));
    let detail: serde_json::Value = serde_json::from_slice(&out.stdout).expect("detail --json");
    umount();
    // RAID5: a 4 MiB file's chunks are on every member, and its reads are
    // counted though no mirror balancer placed them.
    let mut total = 0;
    for member in detail["members"].as_array().expect("members") {
        let reads = member["reads"].as_u64().expect("reads");
        let bytes = member["read_bytes"].as_u64().expect("read_bytes");
        assert!(reads > 0 && bytes > 0, "{member}");
        total += bytes;
    }
    assert!(
        total >= data.len() as u64 * 2 / 3,
        "{total} bytes read: {detail}"
    );

    let docs = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/status-json.md"))
        .expect("docs/status-json.md");
    let mut all = Vec::new();
    keys(&detail, &mut all);
    all.sort();
    all.dedup();
    let missing: Vec<&String> = all
        .iter()
        .filter(|key| !docs.contains(&format!("`{key}`")))
        .collect();
    assert!(
        missing.is_empty(),
        "detail fields not in docs/status-json.md: {missing:?}"
    );
}
