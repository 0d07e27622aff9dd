//! `raidfs create` and `raidfs examine` as a user runs them, including bad
//! input: each refused with a clear message, a non-zero exit, nothing modified.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn raidfs(args: &[&str], cwd: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_raidfs"))
        .args(args)
        .current_dir(cwd)
        .output()
        .expect("run raidfs")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Contents (or absence) of every file in `dir`, to prove nothing changed.
fn snapshot(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut all: Vec<(PathBuf, Vec<u8>)> = std::fs::read_dir(dir)
        .expect("read dir")
        .map(|e| {
            let p = e.expect("entry").path();
            let bytes = if p.is_file() {
                std::fs::read(&p).expect("read")
            } else {
                Vec::new()
            };
            (p, bytes)
        })
        .collect();
    all.sort();
    all
}

#[test]
fn create_then_examine_raid5() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir(dir.path().join("m")).expect("mkdir");
    let o = raidfs(
        &[
            "create", "--level", "5", "--size", "256M", "m/a.img", "m/b.img", "m/c.img", "m/d.img",
        ],
        dir.path(),
    );
    assert!(o.status.success(), "{}", stderr(&o));
    for name in ["a", "b", "c", "d"] {
        let meta =
            std::fs::metadata(dir.path().join(format!("m/{name}.img"))).expect("image exists");
        assert_eq!(meta.len(), 256 << 20);
    }
    let o = raidfs(&["examine", "m/a.img"], dir.path());
    assert!(o.status.success(), "{}", stderr(&o));
    let text = String::from_utf8_lossy(&o.stdout);
    for want in [
        "Raid Level : raid5",
        "Raid Devices : 4",
        "Layout : left-symmetric",
        "Chunk Size : 64K",
        "Superblock copies : front 0 good, front 1 good, end 0 good, end 1 good",
        "Device Role : Active device 0",
        "State : clean",
    ] {
        assert!(
            text.contains(want),
            "examine output lacks '{want}':\n{text}"
        );
    }
    let o = raidfs(&["examine", "--json", "m/c.img"], dir.path());
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(v[0]["level"], "raid5");
    assert_eq!(v[0]["role"], "Active device 2");
    assert_eq!(v[0]["checksum"][1], "good");
    assert_eq!(v[0]["version"], 2);
    for copy in ["front_0", "front_1", "end_0", "end_1"] {
        assert_eq!(v[0]["superblock_copies"][copy], "good", "{copy}");
    }
    // The data area stops a whole tail reserve (1 MiB) before the end.
    let data_end = v[0]["data_offset"].as_u64().expect("data_offset")
        + v[0]["data_size"].as_u64().expect("data_size");
    assert!(
        data_end <= (256 << 20) - (1 << 20),
        "data ends at {data_end}"
    );
}

#[test]
fn a_member_with_its_front_zeroed_is_still_recognised() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let o = raidfs(
        &["create", "--level", "1", "--size", "64M", "a.img", "b.img"],
        d,
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let path = d.join("a.img");
    let mut bytes = std::fs::read(&path).expect("read");
    bytes[..1 << 20].fill(0);
    std::fs::write(&path, &bytes).expect("write");
    let o = raidfs(&["examine", "--json", "a.img"], d);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(v[0]["superblock_copies"]["front_0"], "missing");
    assert_eq!(v[0]["superblock_copies"]["front_1"], "missing");
    assert_eq!(v[0]["superblock_copies"]["end_0"], "good");
    assert_eq!(v[0]["checksum"][0], "absent");
    assert_refused(
        d,
        &["create", "--level", "1", "a.img", "n.img", "--size", "64M"],
        "by its end superblock copies",
    );
}

#[test]
fn examine_reports_a_damaged_copy() {
    let dir = tempfile::tempdir().expect("tempdir");
    let o = raidfs(
        &["create", "--level", "1", "--size", "64M", "a.img", "b.img"],
        dir.path(),
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let path = dir.path().join("a.img");
    let mut bytes = std::fs::read(&path).expect("read");
    bytes[100] ^= 0xff; // inside copy 0
    std::fs::write(&path, &bytes).expect("write");
    let o = raidfs(&["examine", "a.img"], dir.path());
    assert!(
        o.status.success(),
        "one good copy is enough: {}",
        stderr(&o)
    );
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("front 0 bad checksum, front 1 good, end 0 good, end 1 good"),
        "{text}"
    );
}

fn assert_refused(dir: &Path, args: &[&str], want: &str) {
    let before = snapshot(dir);
    let o = raidfs(args, dir);
    assert!(!o.status.success(), "{args:?} must fail");
    let err = stderr(&o);
    assert!(
        err.contains(want),
        "{args:?}: message lacks '{want}': {err}"
    );
    assert_eq!(snapshot(dir), before, "{args:?} modified files");
}

#[test]
fn bad_input_is_refused_and_nothing_changes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    assert!(raidfs(
        &["create", "--level", "1", "--size", "64M", "x1.img", "x2.img"],
        d
    )
    .status
    .success());
    assert!(raidfs(
        &["create", "--level", "1", "--size", "64M", "y1.img", "y2.img"],
        d
    )
    .status
    .success());
    std::fs::write(d.join("notes.txt"), b"precious words").expect("write");

    // Members of two different arrays.
    assert_refused(
        d,
        &["create", "--level", "5", "x1.img", "x2.img", "y1.img"],
        "is a member of array",
    );
    // Too few members.
    assert_refused(
        d,
        &[
            "create", "--level", "5", "--size", "64M", "n1.img", "n2.img",
        ],
        "too few members",
    );
    assert_refused(
        d,
        &[
            "create", "--level", "6", "--size", "64M", "n1.img", "n2.img", "n3.img",
        ],
        "too few members",
    );
    // An ordinary file as a member.
    assert_refused(
        d,
        &[
            "create",
            "--level",
            "1",
            "--size",
            "64M",
            "notes.txt",
            "n1.img",
        ],
        "non-empty file",
    );
    // A new image without --size.
    assert_refused(
        d,
        &["create", "--level", "1", "n1.img", "n2.img"],
        "give --size",
    );
    // An unknown level.
    assert_refused(
        d,
        &[
            "create", "--level", "7", "--size", "64M", "n1.img", "n2.img",
        ],
        "unknown RAID level",
    );
    // The same member twice.
    assert_refused(
        d,
        &[
            "create", "--level", "1", "--size", "64M", "n1.img", "n1.img",
        ],
        "named twice",
    );

    // --force overwrites a member of another array.
    let o = raidfs(
        &["create", "--level", "1", "--force", "x1.img", "y2.img"],
        d,
    );
    assert!(o.status.success(), "{}", stderr(&o));
}

#[test]
fn examine_of_a_non_member_fails_clearly() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("plain.img"), vec![0u8; 1 << 20]).expect("write");
    let o = raidfs(&["examine", "plain.img"], dir.path());
    assert!(!o.status.success());
    assert!(stderr(&o).contains("not a raidfs member"), "{}", stderr(&o));
}
