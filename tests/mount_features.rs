//! How this raidfs meets an array written by a newer one with features it
//! does not know, through the real commands (`mount`, `fsck`): an unknown
//! incompat bit (superblock or filesystem header) refuses every mount,
//! naming the bit; an unknown ro-compat bit refuses a read-write mount,
//! naming it and `-o ro`, and lets `-o ro` and `fsck` without `--repair`
//! in; unknown compat bits change nothing and are kept.

mod common;

use std::fs;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Output;

use common::cli::{raidfs, stderr};
use common::{fuse_available, pattern, DaemonGuard};
use raidfs::fs::ondisk;
use raidfs::superblock::{end_offsets, Features, GroupProfile, Superblock, SB_OFFSETS};

const MEMBERS: [&str; 3] = ["m0", "m1", "m2"];

/// A RAID5 array of three 64 MiB images holding one file, unmounted.
struct Setup {
    dir: tempfile::TempDir,
}

impl Setup {
    fn new() -> Setup {
        let dir = tempfile::tempdir().unwrap();
        let mut args = vec!["create", "-l", "5", "-s", "64M"];
        args.extend(MEMBERS);
        assert!(raidfs(&args, dir.path()).status.success(), "create");
        let setup = Setup { dir };
        let mnt = setup.mount_dir();
        let _guard = DaemonGuard::new(&mnt);
        setup.mount_ok(&[]);
        fs::write(mnt.join("kept"), pattern(7, 300_000)).unwrap();
        setup.umount();
        setup
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn mount_dir(&self) -> PathBuf {
        let p = self.path("mnt");
        fs::create_dir_all(&p).unwrap();
        p.canonicalize().unwrap()
    }

    fn mount(&self, options: &[&str]) -> Output {
        let mut opts = vec![format!("log={}", self.path("daemon.log").display())];
        opts.extend(options.iter().map(|o| o.to_string()));
        let opts = opts.join(",");
        let mut args = vec!["mount", "-o", &opts];
        args.extend(MEMBERS);
        args.push("mnt");
        raidfs(&args, self.dir.path())
    }

    fn mount_ok(&self, options: &[&str]) {
        let out = self.mount(options);
        assert!(
            out.status.success(),
            "mount {options:?} failed: {}",
            stderr(&out)
        );
    }

    fn umount(&self) {
        let out = raidfs(&["umount", "mnt"], self.dir.path());
        assert!(out.status.success(), "umount: {}", stderr(&out));
    }

    fn fsck(&self, repair: bool) -> Output {
        let mut args = vec!["fsck"];
        if repair {
            args.push("--repair");
        }
        args.extend(MEMBERS);
        raidfs(&args, self.dir.path())
    }

    /// Every member's superblock copies, changed by `edit` and re-sealed
    /// (as a newer raidfs would have written them).
    fn edit_superblocks(&self, edit: impl Fn(&mut Features)) {
        for name in MEMBERS {
            let file = fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(self.path(name))
                .unwrap();
            let len = file.metadata().unwrap().len();
            let ends = end_offsets(len).expect("room for the end copies");
            for offset in SB_OFFSETS.into_iter().chain(ends) {
                let mut block = vec![0u8; 4096];
                file.read_exact_at(&mut block, offset).unwrap();
                let mut sb = Superblock::decode(&block, name).unwrap();
                edit(&mut sb.features);
                file.write_all_at(&sb.encode(), offset).unwrap();
            }
        }
    }

    fn superblock(&self) -> Superblock {
        let mut block = vec![0u8; 4096];
        let file = fs::File::open(self.path("m0")).unwrap();
        file.read_exact_at(&mut block, 0).unwrap();
        Superblock::decode(&block, "m0").unwrap()
    }

    /// Member offsets of the two filesystem header copies: the first
    /// Metadata group, mirrored on all three members at the same offset.
    fn header_offsets(&self) -> [u64; 2] {
        let sb = self.superblock();
        let group = sb
            .groups
            .iter()
            .position(|g| *g == GroupProfile::Metadata)
            .expect("a metadata group") as u64;
        let base = sb.data_offset + group * sb.group_size;
        [base, base + 4096]
    }

    fn edit_fs_header(&self, edit: impl Fn(&mut Features)) {
        for name in MEMBERS {
            let file = fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(self.path(name))
                .unwrap();
            for offset in self.header_offsets() {
                let mut block = vec![0u8; 4096];
                file.read_exact_at(&mut block, offset).unwrap();
                let mut features = ondisk::header_features(&block).unwrap();
                edit(&mut features);
                let block = ondisk::with_header_features(&block, features).unwrap();
                file.write_all_at(&block, offset).unwrap();
            }
        }
    }

    fn fs_header_features(&self) -> Features {
        let file = fs::File::open(self.path("m1")).unwrap();
        let mut block = vec![0u8; 4096];
        file.read_exact_at(&mut block, self.header_offsets()[0])
            .unwrap();
        ondisk::header_features(&block).unwrap()
    }
}

fn is_mounted(path: &Path) -> bool {
    raidfs::fuse::mounts::mount_at(path).unwrap().is_some()
}

/// The read-only mount reads the file, refuses writes and leaves the
/// members as they were.
fn read_only_mount_reads(setup: &Setup) {
    let mnt = setup.mount_dir();
    setup.mount_ok(&["ro"]);
    assert_eq!(fs::read(mnt.join("kept")).unwrap(), pattern(7, 300_000));
    let err = fs::write(mnt.join("new"), b"x").unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EROFS), "{err}");
    setup.umount();
}

/// Which on-disk header a test gives an unknown feature bit.
#[derive(Clone, Copy)]
enum Header {
    Superblock,
    FsHeader,
}

impl Header {
    /// How raidfs names it in its refusals.
    fn label(self) -> &'static str {
        match self {
            Header::Superblock => "superblock",
            Header::FsHeader => "filesystem header",
        }
    }

    fn edit(self, setup: &Setup, edit: impl Fn(&mut Features)) {
        match self {
            Header::Superblock => setup.edit_superblocks(edit),
            Header::FsHeader => setup.edit_fs_header(edit),
        }
    }

    fn features(self, setup: &Setup) -> Features {
        match self {
            Header::Superblock => setup.superblock().features,
            Header::FsHeader => setup.fs_header_features(),
        }
    }
}

/// An unknown ro-compat `bit` in `header`: a read-write mount is refused
/// naming the bit and `-o ro`, a read-only mount and a checking fsck work,
/// a repairing fsck is refused, and the bit stays on disk.
fn ro_compat_bit_mounts_read_only_only(header: Header, bit: u32) {
    let setup = Setup::new();
    let mnt = setup.mount_dir();
    let _guard = DaemonGuard::new(&mnt);
    let before = header.features(&setup).ro_compat;
    header.edit(&setup, |f| f.ro_compat |= 1 << bit);

    let out = setup.mount(&[]);
    assert!(!out.status.success());
    let why = stderr(&out);
    let named = format!(
        "{} has unknown read-only-compatible feature bit {bit} ({:#x})",
        header.label(),
        1u64 << bit
    );
    assert!(why.contains(&named) && why.contains("-o ro"), "{why}");
    assert!(!is_mounted(&mnt));

    read_only_mount_reads(&setup);
    let out = setup.fsck(false);
    assert_eq!(out.status.code(), Some(0), "fsck: {}", stderr(&out));
    let out = setup.fsck(true);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains(&format!("read-only-compatible feature bit {bit}")),
        "{}",
        stderr(&out)
    );
    assert_eq!(header.features(&setup).ro_compat, before | 1 << bit, "kept");
}

/// An unknown incompat `bit` in `header` refuses read-write and read-only
/// mounts alike, naming the bit. Returns the setup for further checks.
fn incompat_bit_refuses_every_mount(header: Header, bit: u32) -> Setup {
    let setup = Setup::new();
    let mnt = setup.mount_dir();
    header.edit(&setup, |f| f.incompat |= 1 << bit);
    {
        let _guard = DaemonGuard::new(&mnt);
        for options in [&[][..], &["ro"][..]] {
            let out = setup.mount(options);
            assert!(!out.status.success(), "{options:?}");
            let why = stderr(&out);
            let named = format!(
                "{} has unknown incompatible feature bit {bit} ({:#x})",
                header.label(),
                1u64 << bit
            );
            assert!(why.contains(&named), "{options:?}: {why}");
            assert!(!is_mounted(&mnt));
        }
    }
    setup
}

#[test]
fn unknown_superblock_ro_compat_bit_mounts_read_only_only() {
    if fuse_available() {
        ro_compat_bit_mounts_read_only_only(Header::Superblock, 9);
    }
}

#[test]
fn unknown_fs_header_ro_compat_bit_mounts_read_only_only() {
    if fuse_available() {
        ro_compat_bit_mounts_read_only_only(Header::FsHeader, 3);
    }
}

#[test]
fn unknown_superblock_incompat_bit_refuses_every_mount() {
    if !fuse_available() {
        return;
    }
    let setup = incompat_bit_refuses_every_mount(Header::Superblock, 5);
    let out = setup.fsck(false);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("incompatible feature bit 5"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn unknown_fs_header_incompat_bit_refuses_every_mount() {
    if fuse_available() {
        incompat_bit_refuses_every_mount(Header::FsHeader, 17);
    }
}

#[test]
fn unknown_compat_bits_change_nothing_and_are_kept() {
    if !fuse_available() {
        return;
    }
    let setup = Setup::new();
    let mnt = setup.mount_dir();
    let _guard = DaemonGuard::new(&mnt);
    setup.edit_superblocks(|f| f.compat |= 1 << 40);
    setup.edit_fs_header(|f| f.compat |= 1 << 2);
    setup.mount_ok(&[]);
    assert_eq!(fs::read(mnt.join("kept")).unwrap(), pattern(7, 300_000));
    fs::write(mnt.join("more"), pattern(8, 10_000)).unwrap();
    setup.umount();
    // The superblocks were rewritten (dirty, then clean) with the bit kept.
    let sb = setup.superblock();
    assert!(sb.events > 1);
    assert_eq!(sb.features.compat, 1 << 40);
    assert_eq!(setup.fs_header_features().compat, 1 << 2);
    let out = setup.fsck(false);
    assert_eq!(out.status.code(), Some(0), "fsck: {}", stderr(&out));
}
