//! The whole vertical slice for every redundant level: a tree of files
//! (small and large, hard links, symlinks, xattrs, holes) written through a
//! real FUSE mount over real image files, unmounted, remounted and verified
//! byte for byte; degraded mounts with member images deleted; a crash test
//! that kills the daemon at random moments while writers fsync; and replay
//! of a last fsync whose data the member images lost.

mod common;

use common::cli::{check, raidfs};
use common::{fuse_available, get_xattr, set_xattr, DaemonGuard};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::fs;
use std::io::{Seek, SeekFrom, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

struct Array {
    dir: tempfile::TempDir,
    members: Vec<String>,
}

impl Array {
    fn create(level: &str, n: usize, size: &str) -> Array {
        let dir = tempfile::tempdir().expect("tempdir");
        let members: Vec<String> = (0..n).map(|i| format!("m{i}.img")).collect();
        let mut args = vec!["create", "--level", level, "--size", size];
        args.extend(members.iter().map(|s| s.as_str()));
        check(raidfs(&args, dir.path()), "create");
        fs::create_dir(dir.path().join("mnt")).expect("mkdir mnt");
        Array { dir, members }
    }

    fn mnt(&self) -> PathBuf {
        self.dir.path().join("mnt")
    }

    /// The member image files, in slot order.
    fn images(&self) -> Vec<PathBuf> {
        self.members
            .iter()
            .map(|m| self.dir.path().join(m))
            .collect()
    }

    fn log(&self) -> String {
        fs::read_to_string(self.dir.path().join("daemon.log")).unwrap_or_default()
    }

    fn mount_with(&self, members: &[String]) -> Output {
        let log = format!("log={}", self.dir.path().join("daemon.log").display());
        let mut args = vec!["mount", "-o", log.as_str()];
        args.extend(members.iter().map(|s| s.as_str()));
        args.push("mnt");
        raidfs(&args, self.dir.path())
    }

    fn mount(&self) {
        check(self.mount_with(&self.members), "mount");
    }

    fn umount(&self) {
        check(raidfs(&["umount", "mnt"], self.dir.path()), "umount");
    }

    fn fsck(&self, members: &[String]) -> Output {
        let mut args = vec!["fsck"];
        args.extend(members.iter().map(|s| s.as_str()));
        raidfs(&args, self.dir.path())
    }
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut v = vec![0u8; len];
    rng.fill(&mut v[..]);
    v
}

fn setxattr(path: &Path, name: &str, value: &[u8]) {
    set_xattr(path, name, value).unwrap_or_else(|e| panic!("setxattr {name}: {e}"));
}

fn getxattr(path: &Path, name: &str) -> Vec<u8> {
    get_xattr(path, name).unwrap_or_else(|e| panic!("getxattr {name}: {e}"))
}

/// Write the test tree; `big` is the size of the one large file.
fn write_tree(root: &Path, big: usize) {
    fs::create_dir_all(root.join("a/b/c")).expect("mkdir");
    for i in 0..50u64 {
        fs::write(
            root.join(format!("a/small-{i}")),
            pattern(i, (i as usize * 977) % 9000),
        )
        .expect("small");
    }
    // The large file in 8 MiB pieces from one seeded stream of pieces.
    let mut f = fs::File::create(root.join("a/b/big.bin")).expect("big");
    let piece = 8 << 20;
    let mut written = 0;
    let mut n = 0;
    while written < big {
        let len = piece.min(big - written);
        f.write_all(&pattern(1000 + n, len)).expect("write big");
        written += len;
        n += 1;
    }
    f.sync_all().expect("fsync big");
    // A sparse file: data, a 20 MiB hole, data.
    let mut s = fs::File::create(root.join("a/sparse")).expect("sparse");
    s.write_all(&pattern(7, 5000)).expect("head");
    s.seek(SeekFrom::Start(20 << 20)).expect("seek");
    s.write_all(&pattern(8, 3000)).expect("tail");
    fs::hard_link(root.join("a/small-3"), root.join("a/b/c/hardlink")).expect("link");
    std::os::unix::fs::symlink("../small-4", root.join("a/b/symlink")).expect("symlink");
    setxattr(&root.join("a/small-5"), "user.colour", b"blue");
    setxattr(&root.join("a/b"), "user.dir", b"yes");
}

fn verify_tree(root: &Path, big: usize) {
    for i in 0..50u64 {
        let got = fs::read(root.join(format!("a/small-{i}"))).expect("read small");
        assert!(
            got == pattern(i, (i as usize * 977) % 9000),
            "small-{i} differs"
        );
    }
    let mut f = fs::File::open(root.join("a/b/big.bin")).expect("open big");
    assert_eq!(f.metadata().expect("meta").len(), big as u64);
    let piece = 8 << 20;
    let mut buf = vec![0u8; piece];
    let mut read = 0;
    let mut n = 0;
    while read < big {
        let len = piece.min(big - read);
        std::io::Read::read_exact(&mut f, &mut buf[..len]).expect("read big");
        assert!(
            buf[..len] == pattern(1000 + n, len)[..],
            "big.bin differs in piece {n}"
        );
        read += len;
        n += 1;
    }
    let sparse = fs::read(root.join("a/sparse")).expect("read sparse");
    assert_eq!(sparse.len(), (20 << 20) + 3000);
    assert!(sparse[..5000] == pattern(7, 5000)[..]);
    assert!(
        sparse[5000..20 << 20].iter().all(|&b| b == 0),
        "hole reads as zeros"
    );
    assert!(sparse[20 << 20..] == pattern(8, 3000)[..]);
    let meta = fs::metadata(root.join("a/sparse")).expect("meta");
    assert!(
        meta.blocks() * 512 < 1 << 20,
        "the hole takes no space: {} blocks",
        meta.blocks()
    );
    let link = fs::metadata(root.join("a/b/c/hardlink")).expect("link meta");
    assert_eq!(link.nlink(), 2);
    assert_eq!(
        link.ino(),
        fs::metadata(root.join("a/small-3")).expect("meta").ino()
    );
    assert_eq!(
        fs::read_link(root.join("a/b/symlink")).expect("readlink"),
        PathBuf::from("../small-4")
    );
    assert_eq!(
        fs::read(root.join("a/b/symlink")).expect("via symlink"),
        pattern(4, 4 * 977)
    );
    assert_eq!(getxattr(&root.join("a/small-5"), "user.colour"), b"blue");
    assert_eq!(getxattr(&root.join("a/b"), "user.dir"), b"yes");
}

fn tree_round_trip(level: &str, n: usize, size: &str, big: usize) {
    if !fuse_available() {
        return;
    }
    let array = Array::create(level, n, size);
    let _guard = DaemonGuard::new(&array.mnt());
    array.mount();
    write_tree(&array.mnt(), big);
    verify_tree(&array.mnt(), big);
    array.umount();
    let fsck = check(array.fsck(&array.members), "fsck");
    assert!(String::from_utf8_lossy(&fsck.stdout).contains("clean"));
    array.mount();
    verify_tree(&array.mnt(), big);
    array.umount();
}

#[test]
fn raid1_tree_survives_remount() {
    tree_round_trip("1", 2, "160M", 64 << 20);
}

#[test]
fn raid5_tree_with_a_1gib_file_survives_remount() {
    tree_round_trip("5", 4, "512M", 1 << 30);
}

#[test]
fn raid6_tree_survives_remount() {
    tree_round_trip("6", 5, "160M", 96 << 20);
}

#[test]
fn raid10_tree_survives_remount() {
    tree_round_trip("10", 4, "160M", 80 << 20);
}

fn degraded(level: &str, n: usize, lose: &[usize]) {
    if !fuse_available() {
        return;
    }
    let array = Array::create(level, n, "128M");
    let _guard = DaemonGuard::new(&array.mnt());
    array.mount();
    write_tree(&array.mnt(), 40 << 20);
    array.umount();
    for &i in lose {
        fs::remove_file(array.dir.path().join(&array.members[i])).expect("delete member");
    }
    let left: Vec<String> = array
        .members
        .iter()
        .enumerate()
        .filter(|(i, _)| !lose.contains(i))
        .map(|(_, m)| m.clone())
        .collect();
    let out = check(array.mount_with(&left), "degraded mount");
    // The terminal says so, md's way ("started with 3 drives (out of 4)").
    let said = String::from_utf8_lossy(&out.stderr);
    let started = format!("started degraded with {} of {n} members", n - lose.len());
    assert!(said.contains(&started), "{said}");
    for &i in lose {
        assert!(said.contains(&format!("slot {i}")), "{said}");
    }
    verify_tree(&array.mnt(), 40 << 20);
    // Writes go on while degraded.
    fs::write(array.mnt().join("written-degraded"), pattern(99, 300_000)).expect("degraded write");
    let log = array.log();
    for &i in lose {
        assert!(
            log.contains(&format!("slot {i}")),
            "the mount log names missing slot {i}:\n{log}"
        );
    }
    assert!(log.contains("degraded"), "{log}");
    array.umount();
    let out = check(raidfs(&["examine", &left[0]], array.dir.path()), "examine");
    let text = String::from_utf8_lossy(&out.stdout);
    let state_line = text
        .lines()
        .find(|l| l.contains("Array State"))
        .expect("state line")
        .to_string();
    assert_eq!(
        state_line.matches('.').count() - 1,
        lose.len(),
        "examine marks the missing slots: {state_line}"
    );
    check(array.mount_with(&left), "second degraded mount");
    assert_eq!(
        fs::read(array.mnt().join("written-degraded")).expect("read"),
        pattern(99, 300_000)
    );
    verify_tree(&array.mnt(), 40 << 20);
    array.umount();
}

#[test]
fn raid5_mounts_degraded_without_one_member() {
    degraded("5", 4, &[2]);
}

#[test]
fn raid6_mounts_degraded_without_two_members() {
    degraded("6", 5, &[0, 3]);
}

#[test]
fn mount_is_refused_with_too_few_members() {
    if !fuse_available() {
        return;
    }
    let array = Array::create("5", 3, "64M");
    let _guard = DaemonGuard::new(&array.mnt());
    let out = array.mount_with(&array.members[..1]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("too few"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn killed_daemon_leaves_fsynced_data_and_a_clean_fsck() {
    if !fuse_available() {
        return;
    }
    let array = Array::create("5", 3, "128M");
    let _guard = DaemonGuard::new(&array.mnt());
    let mut rng = StdRng::seed_from_u64(2024);
    // (file name, seed, len) of every write whose fsync returned.
    let mut durable: Vec<(String, u64, usize)> = Vec::new();
    for round in 0..6u64 {
        check(array.mount_with(&array.members), "mount");
        for (name, seed, len) in &durable {
            let got = fs::read(array.mnt().join(name))
                .unwrap_or_else(|e| panic!("round {round}: {name}: {e}"));
            assert!(
                got == pattern(*seed, *len),
                "round {round}: fsync'd {name} differs"
            );
        }
        let mnt = array.mnt();
        let writer = std::thread::spawn(move || {
            let mut done = Vec::new();
            for i in 0..1000u64 {
                let name = format!("r{round}-f{i}");
                let seed = round * 10_000 + i;
                let len = (seed as usize * 7919) % 400_000 + 1;
                let result = fs::File::create(mnt.join(&name)).and_then(|mut f| {
                    f.write_all(&pattern(seed, len))?;
                    f.sync_all()
                });
                match result {
                    Ok(()) => done.push((name, seed, len)),
                    Err(_) => break, // the daemon is gone
                }
            }
            done
        });
        // A random crash point: the writer is mid-stream when this fires.
        std::thread::sleep(Duration::from_millis(rng.gen_range(50..400)));
        kill_daemon(&array);
        // Detached only once the writer is done: a path under a detached
        // mount point would lead its next create into the empty directory.
        durable.extend(writer.join().expect("writer"));
        common::detach(&array.mnt());
        let out = array.fsck(&array.members);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && text.contains("clean"),
            "round {round}: fsck after kill -9 ({}):\n{text}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert!(
        durable.len() > 6,
        "writers made progress: {}",
        durable.len()
    );
    check(array.mount_with(&array.members), "final mount");
    for (name, seed, len) in &durable {
        assert!(
            fs::read(array.mnt().join(name)).expect("read") == pattern(*seed, *len),
            "{name} differs"
        );
    }
    array.umount();
}

/// Byte offset of the first 4 KiB-aligned block of `image` equal to `block`.
fn find_block(image: &Path, block: &[u8]) -> Option<u64> {
    let bytes = fs::read(image).expect("read image");
    bytes
        .chunks(block.len())
        .position(|b| b == block)
        .map(|i| (i * block.len()) as u64)
}

fn overwrite(image: &Path, at: u64, bytes: &[u8]) {
    let mut f = fs::OpenOptions::new()
        .write(true)
        .open(image)
        .expect("open image");
    f.seek(SeekFrom::Start(at)).expect("seek");
    f.write_all(bytes).expect("write image");
    f.sync_all().expect("sync image");
}

/// Write `data` into the existing file `name` and fsync it, then kill the
/// daemon: that fsync's journal record is the last one in the log.
fn write_fsync_and_kill(array: &Array, name: &str, data: &[u8]) {
    let path = array.mnt().join(name);
    fs::File::create(&path)
        .and_then(|f| f.sync_all())
        .expect("create and fsync");
    let mut f = fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .expect("open");
    f.write_all(data).expect("write");
    f.sync_all().expect("fsync");
    drop(f);
    kill_daemon(array);
    common::detach(&array.mnt());
}

/// `kill -9` the array's daemon and wait for it to exit.
fn kill_daemon(array: &Array) {
    common::kill_daemon(&array.mnt(), Duration::from_secs(20));
}

#[test]
fn replay_checks_the_last_fsync_against_its_checksums() {
    if !fuse_available() {
        return;
    }
    // The last record goes out with its data under one flush, so replay
    // reads that data back: here the "disk" loses it after a kill -9.
    let array = Array::create("1", 2, "128M");
    let _guard = DaemonGuard::new(&array.mnt());
    let images = array.images();
    let (a, b, c) = (
        pattern(1, 64 << 10),
        pattern(2, 64 << 10),
        pattern(3, 64 << 10),
    );
    let block = |data: &[u8]| data[..4096].to_vec();

    array.mount();
    fs::write(array.mnt().join("a"), &a).expect("write a");
    write_fsync_and_kill(&array, "b", &b);
    // One copy of b's first block lost: replay takes the other and heals.
    let at = find_block(&images[0], &block(&b)).expect("b on member 0");
    assert_eq!(find_block(&images[1], &block(&b)), Some(at), "mirrored");
    overwrite(&images[0], at, &[0xEE; 4096]);
    array.mount();
    let read = fs::read(array.mnt().join("b"));
    assert!(
        read.as_ref().ok() == Some(&b),
        "{:?} {}",
        read.err(),
        array.log()
    );
    assert!(!array.log().contains("left out"), "{}", array.log());
    array.umount();
    assert_eq!(
        find_block(&images[0], &block(&b)),
        Some(at),
        "healed at replay: {}",
        array.log()
    );

    // Both copies lost: no fsync could have returned on that data, and the
    // record is left out: c is back to its previous (empty, fsync'd) state.
    array.mount();
    write_fsync_and_kill(&array, "c", &c);
    let at = find_block(&images[0], &block(&c)).expect("c on member 0");
    for image in &images {
        overwrite(image, at, &[0xEE; 4096]);
    }
    let out = array.fsck(&array.members);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.contains("left out"), "{text}");
    array.mount();
    assert!(array.log().contains("left out"), "{}", array.log());
    assert_eq!(fs::metadata(array.mnt().join("c")).expect("c").len(), 0);
    assert!(fs::read(array.mnt().join("a")).expect("read a") == a);
    assert!(fs::read(array.mnt().join("b")).expect("read b") == b);
    array.umount();
    check(array.fsck(&array.members), "fsck after the remount");
}

/// The last sync `raidfs detail --json` reports, once `action` has finished:
/// polled, as an operator watching `detail` would, for at most a minute.
fn wait_for_finished_sync(array: &Array, action: &str) -> serde_json::Value {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let out = raidfs(&["detail", "--json", "mnt"], array.dir.path());
        if out.status.success() {
            let report: serde_json::Value =
                serde_json::from_slice(&out.stdout).expect("detail --json");
            let last = &report["last_sync"];
            if report["sync"].is_null() && last["action"] == action {
                return last.clone();
            }
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no finished {action} within a minute: {}",
            array.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn resync_after_a_crash_keeps_the_copy_that_passes_the_checksum() {
    if !fuse_available() {
        return;
    }
    // After kill -9 the regions written last are resynced. md copies the
    // first mirror copy over the others; here the first copy of an older
    // fsync'd file (not the last journal record, which replay checks) went
    // bad meanwhile, and only the checksum can tell.
    let array = Array::create("1", 2, "128M");
    let _guard = DaemonGuard::new(&array.mnt());
    let images = array.images();
    let (a, b) = (pattern(11, 64 << 10), pattern(12, 64 << 10));
    let first_block = a[..4096].to_vec();
    array.mount();
    fs::write(array.mnt().join("a"), &a).expect("write a");
    fs::File::open(array.mnt().join("a"))
        .and_then(|f| f.sync_all())
        .expect("fsync a");
    write_fsync_and_kill(&array, "b", &b);
    let at = find_block(&images[0], &first_block).expect("a on member 0");
    assert_eq!(find_block(&images[1], &first_block), Some(at), "mirrored");
    overwrite(&images[0], at, &[0x3C; 4096]);

    array.mount();
    assert!(array.log().contains("resync of"), "{}", array.log());
    let last = wait_for_finished_sync(&array, "resync");
    assert_eq!(last["completed"], true, "{last:#}");
    assert!(
        array.log().contains("fails the filesystem's checksum"),
        "{}",
        array.log()
    );
    array.umount();
    for image in &images {
        assert_eq!(
            find_block(image, &first_block),
            Some(at),
            "{}: {}",
            image.display(),
            array.log()
        );
    }
    array.mount();
    assert!(fs::read(array.mnt().join("a")).expect("read a") == a);
    assert!(fs::read(array.mnt().join("b")).expect("read b") == b);
    array.umount();
}
