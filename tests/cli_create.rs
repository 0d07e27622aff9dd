//! `raidfs create` and `raidfs examine` as a user runs them, including bad
//! input: each refused with a clear message, a non-zero exit, nothing modified.

mod common;

use common::cli::{raidfs, stderr};
use std::path::{Path, PathBuf};
use std::process::Command;

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
    assert_eq!(v[0]["version"], raidfs::superblock::FORMAT_VERSION);
    for copy in ["front_0", "front_1", "end_0", "end_1"] {
        assert_eq!(v[0]["superblock_copies"][copy], "good", "{copy}");
    }
    // The data area stops a whole tail reserve (1 MiB) before the end.
    let data_end = v[0]["data_offset"].as_u64().expect("data_offset")
        + v[0]["member_size"].as_u64().expect("member_size");
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

/// Files in `dir` (names), to show what a failed create left behind.
fn names(dir: &Path) -> Vec<String> {
    let mut all: Vec<String> = std::fs::read_dir(dir)
        .expect("read dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    all.sort();
    all
}

fn assert_ok(dir: &Path, args: &[&str]) -> String {
    let o = raidfs(args, dir);
    assert!(o.status.success(), "{args:?}: {}", stderr(&o));
    stderr(&o)
}

/// Each way a create can fail leaves the directory as it was, and the
/// corrected command then succeeds without --force.
#[test]
fn a_failed_create_leaves_nothing_the_corrected_rerun_trips_over() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();

    // A member in a directory that does not exist: the first image, which
    // could be made, is not.
    assert_refused(
        d,
        &["create", "-l", "1", "-s", "64M", "a.img", "missing/b.img"],
        "cannot create missing/b.img: directory missing",
    );
    assert!(names(d).is_empty(), "{:?}", names(d));
    assert_ok(d, &["create", "-l", "1", "-s", "64M", "a.img", "b.img"]);

    // Members too small for an array: nothing made, and the rerun with a
    // proper size is not handed the small files.
    let small = d.join("small");
    std::fs::create_dir(&small).expect("mkdir");
    assert_refused(
        &small,
        &["create", "-l", "5", "-s", "4M", "a.img", "b.img", "c.img"],
        "members are too small",
    );
    assert!(names(&small).is_empty(), "{:?}", names(&small));
    assert_ok(
        &small,
        &["create", "-l", "5", "-s", "64M", "a.img", "b.img", "c.img"],
    );

    // An existing empty image that is too small, with new ones: it stays
    // exactly as it was and the new ones are not made.
    let mixed = d.join("mixed");
    std::fs::create_dir(&mixed).expect("mkdir");
    std::fs::File::create(mixed.join("old.img"))
        .and_then(|f| f.set_len(2 << 20))
        .expect("small image");
    assert_refused(
        &mixed,
        &["create", "-l", "1", "-s", "64M", "old.img", "new.img"],
        "members are too small",
    );
    assert_eq!(names(&mixed), ["old.img"]);
    std::fs::File::options()
        .write(true)
        .open(mixed.join("old.img"))
        .and_then(|f| f.set_len(64 << 20))
        .expect("grow the image");
    assert_ok(
        &mixed,
        &["create", "-l", "1", "-s", "64M", "old.img", "new.img"],
    );

    // A member of another array, without --force: the new image beside it
    // is not made, and the other array is untouched.
    let other = d.join("other");
    std::fs::create_dir(&other).expect("mkdir");
    assert_ok(
        &other,
        &["create", "-l", "1", "-s", "64M", "x1.img", "x2.img"],
    );
    assert_refused(
        &other,
        &["create", "-l", "1", "-s", "64M", "n1.img", "x1.img"],
        "is a member of array",
    );
    assert_eq!(names(&other), ["x1.img", "x2.img"]);
    assert_ok(
        &other,
        &["create", "-l", "1", "-s", "64M", "n1.img", "n2.img"],
    );
    let o = raidfs(&["examine", "x1.img", "x2.img"], &other);
    assert!(o.status.success(), "{}", stderr(&o));

    // Bad level, bad size, bad layout: refused before anything is made.
    let bad = d.join("bad");
    std::fs::create_dir(&bad).expect("mkdir");
    for (args, want) in [
        (vec!["-l", "7", "-s", "64M"], "unknown RAID level"),
        (vec!["-l", "1", "-s", "64Q"], "unknown unit"),
        (
            vec!["-l", "5", "-s", "64M", "--layout", "sideways"],
            "sideways",
        ),
        (
            vec!["-l", "1", "-s", "64M", "--consistency-policy", "ppl"],
            "RAID5 only",
        ),
    ] {
        let mut all = vec!["create"];
        all.extend(args);
        all.extend(["a.img", "b.img", "c.img"]);
        assert_refused(&bad, &all, want);
        assert!(names(&bad).is_empty(), "{all:?} left {:?}", names(&bad));
    }
    assert_ok(
        &bad,
        &["create", "-l", "5", "-s", "64M", "a.img", "b.img", "c.img"],
    );
}

/// A tmpfs of `size` mounted on a new directory, unmounted (lazily, so a
/// failing test cannot leave it busy) when dropped.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    /// None, with the reason printed, where tmpfs cannot be mounted (not root).
    fn mount(size: &str) -> Option<Tmpfs> {
        let dir = tempfile::tempdir().expect("tempdir");
        let o = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .output()
            .expect("run mount");
        if !o.status.success() {
            eprintln!("skipping: cannot mount a tmpfs: {}", stderr(&o));
            return None;
        }
        Some(Tmpfs { dir })
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn resize(&self, size: &str) {
        let o = Command::new("mount")
            .args(["-o", &format!("remount,size={size}")])
            .arg(self.path())
            .output()
            .expect("run mount");
        assert!(o.status.success(), "remount: {}", stderr(&o));
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(self.path()).output();
    }
}

fn allocated(path: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).expect("stat").blocks() * 512
}

/// Sparse images bigger than their host filesystem: create warns, once for
/// that filesystem; `--preallocate` refuses and makes nothing; where they
/// fit, `--preallocate` gives fully allocated images that stay so.
#[test]
fn create_warns_of_a_small_host_and_preallocate_reserves_the_space() {
    let Some(fs) = Tmpfs::mount("64m") else {
        return;
    };
    let d = fs.path();
    let err = assert_ok(d, &["create", "-l", "1", "-s", "128M", "a.img", "b.img"]);
    let warnings: Vec<&str> = err.lines().filter(|l| l.contains("warning")).collect();
    assert_eq!(warnings.len(), 1, "{err}");
    let prefix = format!("raidfs: warning: {} has ", d.display());
    assert!(
        warnings[0].starts_with(&prefix)
            && warnings[0].ends_with(" MiB free but the 2 sparse images can grow to 256 MiB; when it fills, writes fail with ENOSPC (use --preallocate to reserve the space now)"),
        "{}",
        warnings[0]
    );

    let before = names(d);
    let o = raidfs(
        &[
            "create",
            "--preallocate",
            "-l",
            "1",
            "-s",
            "48M",
            "c.img",
            "d.img",
        ],
        d,
    );
    assert!(!o.status.success(), "preallocated more than the host has");
    assert!(
        stderr(&o).contains("--preallocate needs 96 MiB on"),
        "{}",
        stderr(&o)
    );
    assert_eq!(names(d), before, "a refused --preallocate left files");

    // Where they fit: every byte reserved, also after the array zeroed its groups.
    let Some(roomy) = Tmpfs::mount("160m") else {
        return;
    };
    let r = roomy.path();
    let err = assert_ok(
        r,
        &[
            "create",
            "--preallocate",
            "-l",
            "1",
            "-s",
            "64M",
            "c.img",
            "d.img",
        ],
    );
    assert!(!err.contains("warning"), "{err}");
    for m in ["c.img", "d.img"] {
        assert_eq!(
            allocated(&r.join(m)),
            64 << 20,
            "{m} is not fully allocated"
        );
    }
    let _ = fs;
}

/// The host fills up while create writes: it fails, the images it made
/// are gone, the empty image given to it is empty again, and the rerun on a
/// larger host succeeds without --force.
#[test]
fn a_create_that_meets_a_full_host_takes_back_what_it_wrote() {
    let Some(fs) = Tmpfs::mount("16k") else {
        return;
    };
    let d = fs.path();
    std::fs::File::create(d.join("blank.img"))
        .and_then(|f| f.set_len(64 << 20))
        .expect("blank image");
    let o = raidfs(
        &["create", "-l", "1", "-s", "64M", "blank.img", "new.img"],
        d,
    );
    assert!(!o.status.success(), "create succeeded on a full host");
    assert!(
        stderr(&o).contains("No space left on device"),
        "{}",
        stderr(&o)
    );
    assert_eq!(names(d), ["blank.img"]);
    assert_eq!(
        allocated(&d.join("blank.img")),
        0,
        "blank.img was not blanked again"
    );

    fs.resize("64m");
    assert_ok(
        d,
        &["create", "-l", "1", "-s", "64M", "blank.img", "new.img"],
    );
}

/// Images spread over two small host filesystems: one warning for each,
/// naming it; none for a member on a host with room.
#[test]
fn create_warns_once_per_host_filesystem() {
    let (Some(one), Some(two), Some(roomy)) = (
        Tmpfs::mount("32m"),
        Tmpfs::mount("32m"),
        Tmpfs::mount("256m"),
    ) else {
        return;
    };
    let members = [
        one.path().join("a.img"),
        one.path().join("b.img"),
        two.path().join("c.img"),
        roomy.path().join("d.img"),
    ];
    let mut args = vec!["create", "-l", "5", "-s", "64M"];
    let shown: Vec<String> = members.iter().map(|m| m.display().to_string()).collect();
    args.extend(shown.iter().map(String::as_str));
    let err = assert_ok(roomy.path(), &args);
    let warnings: Vec<&str> = err.lines().filter(|l| l.contains("warning")).collect();
    assert_eq!(warnings.len(), 2, "{err}");
    for (fs, images) in [
        (&one, "2 sparse images can grow to 128 MiB"),
        (&two, "but the sparse image can grow to 64 MiB"),
    ] {
        let prefix = format!("raidfs: warning: {} has ", fs.path().display());
        assert!(
            warnings
                .iter()
                .any(|w| w.starts_with(&prefix) && w.contains(images)),
            "no warning for {}: {err}",
            fs.path().display()
        );
    }
    assert!(!err.contains(&roomy.path().display().to_string()), "{err}");
}

/// `examine` names the feature bits it knows in text and JSON, and shows
/// the ones it does not as numbers.
#[test]
fn examine_names_feature_words_and_shows_unknown_bits() {
    use raidfs::member::file::{FileMember, OpenOptions};
    use raidfs::superblock::Superblock;
    let dir = tempfile::tempdir().expect("tempdir");
    let o = raidfs(
        &["create", "--level", "1", "--size", "64M", "a.img", "b.img"],
        dir.path(),
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let o = raidfs(&["examine", "a.img"], dir.path());
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("       Features : compat: -; ro_compat: -; incompat: -\n"),
        "{text}"
    );
    // A later raidfs's compat bit: kept, shown by number.
    let member = FileMember::open(dir.path().join("a.img"), OpenOptions::default()).expect("open");
    let (mut sb, _) = Superblock::read_from(&member).expect("superblock");
    sb.features.compat |= 1 << 40;
    sb.write_to(&member).expect("write superblock");
    drop(member);
    let o = raidfs(&["examine", "a.img"], dir.path());
    assert!(o.status.success(), "{}", stderr(&o));
    let text = String::from_utf8_lossy(&o.stdout);
    let want = "compat: unknown bit 40 (0x10000000000); ro_compat: -; incompat: -";
    assert!(text.contains(&format!("Features : {want}\n")), "{text}");
    let o = raidfs(&["examine", "--json", "a.img"], dir.path());
    let json: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
    assert_eq!(json[0]["feature_names"], want, "{json:#}");
    assert_eq!(json[0]["compat_features"], 1u64 << 40);
    assert!(json[0]["scrub_checkpoint"].is_null(), "{json:#}");
}
