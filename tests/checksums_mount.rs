//! Checksums through a real FUSE mount: bytes flipped with pwrite in member
//! image files while `raidfs mount` serves them are caught on the next read
//! (after dropping the page cache), the file reads back correctly, the daemon
//! logs the member that held the bad copy, and an offline scrub afterwards
//! repairs what reads did not meet, after which a second scrub is clean.
//! `raidfs repair` on a live mount keeps the version of a block that passes
//! its checksum, even when md's rule (first copy, parity from data) would
//! keep the bad one.

mod common;

use std::collections::BTreeSet;
use std::fs;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Arc;

use common::cli::{check, raidfs};
use common::{fuse_available, DaemonGuard};
use raidfs::array::{assemble_paths, AssembleOptions, OpenPolicy};
use raidfs::fs::{ArrayStore, FileSystem, FsOptions};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const BLOCK: usize = 4096;
const FILES: usize = 3;
const BLOCKS_PER_FILE: usize = 40;

/// Each block starts with a marker naming it, so it can be found in the images.
fn marker(file: usize, block: usize) -> Vec<u8> {
    format!("raidfs-checksum-test f{file} b{block:04} ").into_bytes()
}

fn contents(rng: &mut StdRng, file: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(BLOCKS_PER_FILE * BLOCK);
    for b in 0..BLOCKS_PER_FILE {
        let mut block = vec![0u8; BLOCK];
        rng.fill(&mut block[..]);
        let m = marker(file, b);
        block[..m.len()].copy_from_slice(&m);
        out.extend(block);
    }
    out
}

fn drop_caches() {
    // Without this the kernel would answer from its cache of the FUSE file.
    fs::write("/proc/sys/vm/drop_caches", "3").expect("drop caches (needs root)");
}

/// (member index, offset) of every copy of block `block` of file `file`.
fn find_copies(images: &[Vec<u8>], file: usize, block: usize) -> Vec<(usize, u64)> {
    let m = marker(file, block);
    let mut found = Vec::new();
    for (i, image) in images.iter().enumerate() {
        for (n, chunk) in image.chunks(BLOCK).enumerate() {
            if chunk.starts_with(&m) {
                found.push((i, (n * BLOCK) as u64));
            }
        }
    }
    found
}

/// An array of `members` 64 MiB images in a temporary directory, created
/// and mounted on `mnt` there, its daemon logging to `daemon.log`.
struct Mounted {
    dir: tempfile::TempDir,
    names: Vec<String>,
    mnt: PathBuf,
    _guard: DaemonGuard,
}

impl Mounted {
    fn new(level: &str, members: usize) -> Mounted {
        let dir = tempfile::tempdir().expect("tempdir");
        let names: Vec<String> = (0..members).map(|i| format!("m{i}.img")).collect();
        let mut args = vec!["create", "--level", level, "--size", "64M"];
        args.extend(names.iter().map(|s| s.as_str()));
        check(raidfs(&args, dir.path()), "create");
        let mnt = dir.path().join("mnt");
        fs::create_dir(&mnt).expect("mkdir mnt");
        let mnt = mnt.canonicalize().expect("mount point");
        let guard = DaemonGuard::new(&mnt);
        let array = Mounted {
            dir,
            names,
            mnt,
            _guard: guard,
        };
        array.mount();
        array
    }

    fn mount(&self) {
        let log_opt = format!("log={}", self.dir.path().join("daemon.log").display());
        let mut args = vec!["mount", "-o", log_opt.as_str()];
        args.extend(self.names.iter().map(|s| s.as_str()));
        args.push("mnt");
        check(raidfs(&args, self.dir.path()), "mount");
    }

    /// `raidfs ARGS...` in the image directory; its stdout, after checking it succeeded.
    fn run(&self, args: &[&str]) -> String {
        let out = raidfs(args, self.dir.path());
        let said = String::from_utf8_lossy(&out.stdout).into_owned();
        check(out, &args.join(" "));
        said
    }

    fn image_paths(&self) -> Vec<PathBuf> {
        self.names.iter().map(|n| self.dir.path().join(n)).collect()
    }
}

fn run_level(level: &str, members: usize, seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let array = Mounted::new(level, members);
    let Mounted {
        dir, names, mnt, ..
    } = &array;
    let log_path = dir.path().join("daemon.log");

    let files: Vec<Vec<u8>> = (0..FILES).map(|f| contents(&mut rng, f)).collect();
    for (f, data) in files.iter().enumerate() {
        let path = mnt.join(format!("f{f}"));
        fs::write(&path, data).expect("write through the mount");
        fs::File::open(&path)
            .and_then(|h| h.sync_all())
            .expect("fsync");
    }

    // Flip bytes in one copy of some blocks of every file, behind raidfs's back.
    let paths = array.image_paths();
    let images: Vec<Vec<u8>> = paths.iter().map(|p| fs::read(p).expect("image")).collect();
    let mut flipped_members = BTreeSet::new();
    for f in 0..FILES {
        for _ in 0..2 {
            let block = rng.gen_range(0..BLOCKS_PER_FILE);
            let copies = find_copies(&images, f, block);
            assert!(!copies.is_empty(), "f{f} block {block} is on some member");
            let (member, at) = copies[rng.gen_range(0..copies.len())];
            let image = fs::OpenOptions::new()
                .write(true)
                .open(&paths[member])
                .expect("open image");
            let garbage: Vec<u8> = (0..16).map(|_| rng.gen()).collect();
            image
                .write_at(&garbage, at + 100)
                .expect("pwrite into the image");
            image.sync_all().expect("sync image");
            flipped_members.insert(names[member].clone());
        }
    }
    drop_caches();
    for (f, data) in files.iter().enumerate() {
        let got = fs::read(mnt.join(format!("f{f}"))).expect("read through the mount");
        assert!(&got == data, "{level}: f{f} reads back wrong");
    }
    check(raidfs(&["umount", "mnt"], dir.path()), "umount");

    let log = fs::read_to_string(&log_path).unwrap_or_default();
    let mut blamed = BTreeSet::new();
    for line in log.lines().filter(|l| l.contains("held a bad copy")) {
        let name = names
            .iter()
            .find(|n| line.contains(n.as_str()))
            .unwrap_or_else(|| panic!("{level}: log line names no member: {line}"));
        blamed.insert(name.clone());
    }
    assert!(
        !blamed.is_empty(),
        "{level}: no bad copy was met by a read:\n{log}"
    );

    // Offline: scrub with repair finds what reads did not meet, then nothing.
    let array = assemble_paths(&paths, AssembleOptions::default(), OpenPolicy::default())
        .expect("assemble")
        .array;
    let array = Arc::new(array);
    let store = Arc::new(ArrayStore::new(Arc::clone(&array)));
    let fs = FileSystem::open(store, FsOptions::default()).expect("open offline");
    let first = fs.scrub(true).expect("scrub");
    assert!(first.lost.is_empty(), "{level}: {first:?}");
    for b in &first.bad_copies {
        let name = names
            .iter()
            .find(|n| b.member.ends_with(n.as_str()))
            .expect("scrub names a member");
        blamed.insert(name.clone());
    }
    let second = fs.scrub(false).expect("scrub");
    assert!(second.is_clean(), "{level}: {second:?}");
    assert_eq!(
        blamed, flipped_members,
        "{level}: the right members are named"
    );
    for (f, data) in files.iter().enumerate() {
        let ino = fs
            .lookup(
                &raidfs::fs::Caller::root(),
                raidfs::fs::ROOT_INO,
                std::ffi::OsStr::new(&format!("f{f}")),
            )
            .expect("lookup")
            .ino;
        assert!(&fs.read(ino, 0, data.len()).expect("read") == data);
    }
    fs.unmount().expect("unmount offline");
}

#[test]
fn flipped_bytes_under_a_live_mount_are_healed_and_named() {
    if !fuse_available() {
        return;
    }
    run_level("5", 3, 1);
    run_level("1", 2, 2);
}

/// `raidfs repair` on a live mount, after a block's first mirror copy (the
/// one md's repair copies from) or a RAID5 data block went bad on disk: the
/// daemon's filesystem tells the array which version passes its checksum,
/// so the good bytes are kept and the bad ones rewritten, never the
/// reverse. Without the filesystem's say the file would be lost.
fn repair_level(level: &str, members: usize, seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let array = Mounted::new(level, members);
    let data = contents(&mut rng, 0);
    fs::write(array.mnt.join("f0"), &data).expect("write through the mount");
    array.run(&["umount", "mnt"]);

    let paths = array.image_paths();
    let images: Vec<Vec<u8>> = paths.iter().map(|p| fs::read(p).expect("image")).collect();
    let block = 7;
    let copies = find_copies(&images, 0, block);
    // The copy on the lowest member: a mirror's first copy, or the data block.
    let (member, at) = copies[0];
    let image = fs::OpenOptions::new()
        .write(true)
        .open(&paths[member])
        .expect("open image");
    image
        .write_at(&[0xA5; 64], at + 200)
        .expect("pwrite into the image");
    image.sync_all().expect("sync image");

    array.mount();
    let said = array.run(&["repair", "--wait", "mnt"]);
    assert!(said.contains("repair finished"), "{level}: {said}");
    assert!(
        !said.contains("(0 bytes mismatched)"),
        "{level}: the bad block was found: {said}"
    );
    let said = array.run(&["check", "--wait", "mnt"]);
    assert!(said.contains("(0 bytes mismatched)"), "{level}: {said}");
    array.run(&["umount", "mnt"]);

    // Every copy of the block now holds the good bytes.
    let good = &data[block * BLOCK..(block + 1) * BLOCK];
    for &(m, at) in &copies {
        let mut got = vec![0u8; BLOCK];
        fs::File::open(&paths[m])
            .and_then(|f| f.read_exact_at(&mut got, at))
            .expect("read image");
        assert!(
            got == good,
            "{level}: copy on {} after repair",
            array.names[m]
        );
    }
    array.mount();
    drop_caches();
    assert!(
        fs::read(array.mnt.join("f0")).expect("read") == data,
        "{level}"
    );
    array.run(&["umount", "mnt"]);
}

#[test]
fn repair_on_a_live_mount_keeps_what_passes_the_checksum() {
    if !fuse_available() {
        return;
    }
    repair_level("1", 2, 3);
    repair_level("5", 3, 4);
}
