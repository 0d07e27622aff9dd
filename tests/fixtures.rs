//! Frozen fixtures: member images written by earlier raidfs releases, one
//! per released combination of superblock version and filesystem format
//! (tests/fixtures/README.md says which release made each, and
//! scripts/make-fixtures how). Today's code must assemble each, read its
//! known files byte for byte, find it clean with fsck, and (on a copy)
//! write to it without moving it to a newer format.

mod common;

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::Arc;
use std::time::Duration;

use common::cli::{raidfs, stderr, stdout};
use raidfs::array::{assemble_paths, AssembleOptions, OpenPolicy};
use raidfs::fs::{ArrayStore, Caller, FileSystem, FsOptions, ROOT_INO};
use raidfs::member::file::{FileMember, OpenOptions};
use raidfs::superblock::Superblock;

struct Fixture {
    name: &'static str,
    superblock_version: u32,
    fs_format: u32,
    members: usize,
    ppl: bool,
}

const FIXTURES: &[Fixture] = &[
    Fixture {
        name: "sb1-fs3-raid5-ppl",
        superblock_version: 1,
        fs_format: 3,
        members: 3,
        ppl: true,
    },
    Fixture {
        name: "sb1-fs4-raid10",
        superblock_version: 1,
        fs_format: 4,
        members: 4,
        ppl: false,
    },
    Fixture {
        name: "sb2-fs3-raid1",
        superblock_version: 2,
        fs_format: 3,
        members: 2,
        ppl: false,
    },
    Fixture {
        name: "sb2-fs4-raid5-ppl",
        superblock_version: 2,
        fs_format: 4,
        members: 3,
        ppl: true,
    },
];

fn pattern() -> Vec<u8> {
    (0..300_000usize)
        .map(|i| ((i * 31 + i / 4096) % 251) as u8)
        .collect()
}

/// The fixture's members unpacked into a fresh directory.
fn unpack(f: &Fixture) -> (tempfile::TempDir, Vec<PathBuf>) {
    let archive = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(format!("{}.tar.gz", f.name));
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new("tar")
        .arg("-xzf")
        .arg(&archive)
        .arg("-C")
        .arg(dir.path())
        .output()
        .expect("run tar");
    assert!(out.status.success(), "{}: {}", f.name, stderr(&out));
    let members: Vec<PathBuf> = (0..f.members)
        .map(|i| dir.path().join(format!("m{i}")))
        .collect();
    (dir, members)
}

fn open(members: &[PathBuf], read_only: bool) -> FileSystem {
    let policy = OpenPolicy {
        lock_wait: Duration::from_secs(5),
        leave_out_unwritable: false,
    };
    let opts = AssembleOptions {
        read_only,
        ..Default::default()
    };
    let raidfs::array::Assembly {
        array, left_out, ..
    } = assemble_paths(members, opts, policy).expect("assembles");
    assert!(left_out.is_empty(), "members left out: {left_out:?}");
    let array = Arc::new(array);
    let fs_opts = FsOptions {
        read_only,
        ..Default::default()
    };
    FileSystem::open(Arc::new(ArrayStore::new(array)), fs_opts).expect("filesystem opens")
}

/// The known files, read through today's filesystem.
fn check_files(name: &str, fs: &FileSystem) {
    let root = Caller::root();
    let at = |parent: u64, n: &str| fs.lookup(&root, parent, OsStr::new(n)).unwrap();
    let hello = at(ROOT_INO, "hello.txt");
    assert_eq!(
        fs.read(hello.ino, 0, 4096).unwrap(),
        b"hello from an earlier raidfs\n",
        "{name}"
    );
    let dir = at(ROOT_INO, "dir");
    let big = at(dir.ino, "pattern.bin");
    assert_eq!(big.size, 300_000, "{name}");
    let mut read = Vec::new();
    while read.len() < 300_000 {
        let chunk = fs.read(big.ino, read.len() as u64, 65536).unwrap();
        assert!(!chunk.is_empty(), "{name}: short read at {}", read.len());
        read.extend(chunk);
    }
    assert!(read == pattern(), "{name}: pattern.bin differs");
    let link = at(dir.ino, "link");
    assert_eq!(fs.readlink(link.ino).unwrap(), b"../hello.txt", "{name}");
    let empty = at(ROOT_INO, "empty");
    assert_eq!((empty.size, empty.perm), (0, 0o600), "{name}");
}

/// The member's superblock, read as `raidfs examine` reads it: without the
/// member's lock, which the array just dropped may hold a moment longer (a
/// member's write-behind thread closes its copy of the descriptor as it
/// ends), and which a zero wait turned into "in use by another raidfs
/// process" once in a loaded full run.
fn superblock(path: &Path) -> Superblock {
    let options = OpenOptions {
        read_only: true,
        lock: false,
        ..Default::default()
    };
    let member = FileMember::open(path, options).unwrap();
    Superblock::read_from(&member).unwrap().0
}

/// `raidfs WORDS... MEMBERS...` in `dir`, which must exit 0.
fn succeeds(f: &Fixture, words: &[&str], members: &[PathBuf], dir: &Path) -> Output {
    let mut args: Vec<&OsStr> = words.iter().map(OsStr::new).collect();
    args.extend(members.iter().map(|m| m.as_os_str()));
    let out = raidfs(&args, dir);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}: {}\n{}\n{}",
        f.name,
        words.join(" "),
        stdout(&out),
        stderr(&out)
    );
    out
}

#[test]
fn every_released_format_assembles_reads_and_checks_clean() {
    for f in FIXTURES {
        let (dir, members) = unpack(f);
        for m in &members {
            let sb = superblock(m);
            assert_eq!(sb.version, f.superblock_version, "{} {m:?}", f.name);
            assert_eq!(sb.has_ppl(), f.ppl, "{}", f.name);
        }
        let fs = open(&members, true);
        check_files(f.name, &fs);
        drop(fs);
        let plan = {
            let policy = OpenPolicy {
                lock_wait: Duration::from_secs(5),
                leave_out_unwritable: false,
            };
            let opts = AssembleOptions {
                read_only: true,
                ..Default::default()
            };
            let raidfs::array::Assembly {
                array, left_out, ..
            } = assemble_paths(&members, opts, policy).unwrap();
            assert!(left_out.is_empty(), "members left out: {left_out:?}");
            let array = Arc::new(array);
            raidfs::fs::upgrade::plan(&ArrayStore::new(array)).unwrap()
        };
        assert_eq!(plan.from, f.fs_format, "{}", f.name);

        succeeds(f, &["fsck"], &members, dir.path());
    }
}

#[test]
fn every_released_format_is_written_in_its_own_format() {
    for f in FIXTURES {
        let (_dir, members) = unpack(f);
        let fs = open(&members, false);
        let root = Caller::root();
        let attr = fs
            .create(&root, ROOT_INO, OsStr::new("today"), 0o644, 0, libc::O_RDWR)
            .unwrap();
        fs.write(attr.ino, 0, b"written by today's raidfs").unwrap();
        fs.fsync(attr.ino, false).unwrap();
        fs.unmount().unwrap();
        drop(fs);
        // Nothing moved to a newer format behind the owner's back.
        for m in &members {
            assert_eq!(superblock(m).version, f.superblock_version, "{}", f.name);
        }
        let fs = open(&members, true);
        check_files(f.name, &fs);
        let today = fs.lookup(&root, ROOT_INO, OsStr::new("today")).unwrap();
        assert_eq!(
            fs.read(today.ino, 0, 100).unwrap(),
            b"written by today's raidfs",
            "{}",
            f.name
        );
    }
}

#[test]
fn every_released_format_upgrades_to_the_metadata_tree_and_reads_back() {
    for f in FIXTURES {
        let (dir, members) = unpack(f);
        let out = succeeds(f, &["upgrade"], &members, dir.path());
        assert!(
            stdout(&out).contains("metadata tree"),
            "{}: {}",
            f.name,
            stdout(&out)
        );
        let fs = open(&members, true);
        check_files(f.name, &fs);
        drop(fs);
        let mut args = vec![OsStr::new("upgrade"), OsStr::new("--check")];
        args.extend(members.iter().map(|m| m.as_os_str()));
        let out = raidfs(&args, dir.path());
        assert!(
            stdout(&out).contains("is current; nothing to do"),
            "{}: {}",
            f.name,
            stdout(&out)
        );
        succeeds(f, &["fsck"], &members, dir.path());
        // Written in the new format, and read back from its tree.
        let fs = open(&members, false);
        let root = Caller::root();
        let attr = fs
            .create(&root, ROOT_INO, OsStr::new("after"), 0o644, 0, libc::O_RDWR)
            .unwrap();
        fs.write(attr.ino, 0, b"written into the tree").unwrap();
        fs.release(attr.ino).unwrap();
        fs.unmount().unwrap();
        drop(fs);
        let fs = open(&members, true);
        check_files(f.name, &fs);
        let after = fs.lookup(&root, ROOT_INO, OsStr::new("after")).unwrap();
        assert_eq!(
            fs.read(after.ino, 0, 100).unwrap(),
            b"written into the tree",
            "{}",
            f.name
        );
    }
}

/// The committed fixtures stay small (the total is checked, not each).
#[test]
fn fixtures_stay_small() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let total: u64 = FIXTURES
        .iter()
        .map(|f| {
            std::fs::metadata(dir.join(format!("{}.tar.gz", f.name)))
                .unwrap()
                .len()
        })
        .sum();
    assert!(total < 1 << 20, "fixtures take {total} bytes");
}
