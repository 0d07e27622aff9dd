//! Crash consistency: random operations with fsyncs on a store that loses
//! power at a random write; the image a power cut could leave must pass fsck,
//! open, hold every file exactly as its last fsync left it (for files not
//! touched since), and read every file back whole (no record kept whose data
//! the crash lost).

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use common::fs::n;
use raidfs::fs::teststore::{CrashStore, HookedStore, MemStore};
use raidfs::fs::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const MIB: u64 = 1 << 20;

struct Run {
    fs: FileSystem,
    dirs: Vec<u64>,
    /// (dir index, name) → current contents
    files: BTreeMap<(usize, String), Vec<u8>>,
    /// Files whose contents were covered by an fsync and not touched since.
    stable: BTreeMap<(usize, String), Vec<u8>>,
}

impl Run {
    fn ino(&self, key: &(usize, String)) -> Option<u64> {
        self.fs
            .lookup(&Caller::root(), self.dirs[key.0], n(&key.1))
            .ok()
            .map(|a| a.ino)
    }

    /// One random operation; Err when the store has lost power.
    fn step(&mut self, rng: &mut StdRng) -> FsResult<()> {
        let c = Caller::root();
        let dir = rng.gen_range(0..self.dirs.len());
        let key = (dir, format!("f{}", rng.gen_range(0..6)));
        match rng.gen_range(0..11) {
            0..=3 => {
                self.stable.remove(&key);
                let ino = match self.ino(&key) {
                    Some(i) => i,
                    None => {
                        self.fs
                            .mknod(&c, self.dirs[dir], n(&key.1), 0o100644, 0, 0)?
                            .ino
                    }
                };
                self.files.entry(key.clone()).or_default();
                let off = rng.gen_range(0..40_000u64);
                let len = rng.gen_range(1..20_000usize);
                let byte = rng.gen::<u8>();
                self.fs.write(ino, off, &vec![byte; len])?;
                let data = self.files.get_mut(&key).expect("tracked");
                if data.len() < off as usize + len {
                    data.resize(off as usize + len, 0);
                }
                data[off as usize..off as usize + len].fill(byte);
            }
            4 => {
                if let Some(ino) = self.ino(&key) {
                    self.stable.remove(&key);
                    let size = rng.gen_range(0..50_000u64);
                    self.fs.setattr(
                        &c,
                        ino,
                        &SetAttr {
                            size: Some(size),
                            ..Default::default()
                        },
                    )?;
                    self.files
                        .get_mut(&key)
                        .expect("tracked")
                        .resize(size as usize, 0);
                }
            }
            5 => {
                if self.ino(&key).is_some() {
                    self.stable.remove(&key);
                    self.fs.unlink(&c, self.dirs[dir], n(&key.1))?;
                    self.files.remove(&key);
                }
            }
            6 => {
                let to = (
                    rng.gen_range(0..self.dirs.len()),
                    format!("f{}", rng.gen_range(0..6)),
                );
                if self.ino(&key).is_some() && key != to {
                    self.stable.remove(&key);
                    self.stable.remove(&to);
                    self.fs.rename(
                        &c,
                        self.dirs[key.0],
                        n(&key.1),
                        self.dirs[to.0],
                        n(&to.1),
                        RenameFlags::default(),
                    )?;
                    let data = self.files.remove(&key).expect("tracked");
                    self.files.insert(to, data);
                }
            }
            7 => {
                // Reserve (unwritten extents), growing the file or not.
                if let Some(ino) = self.ino(&key) {
                    self.stable.remove(&key);
                    let off = rng.gen_range(0..40_000u64);
                    let len = rng.gen_range(1..60_000u64);
                    let keep_size = rng.gen_bool(0.5);
                    let mode = FallocateMode {
                        keep_size,
                        punch_hole: false,
                    };
                    self.fs.fallocate(ino, off, len, mode)?;
                    let data = self.files.get_mut(&key).expect("tracked");
                    if !keep_size && data.len() < (off + len) as usize {
                        data.resize((off + len) as usize, 0);
                    }
                }
            }
            _ => {
                if let Some(ino) = self.ino(&key) {
                    self.fs.fsync(ino, false)?;
                    self.stable = self.files.clone();
                }
            }
        }
        Ok(())
    }
}

/// A fresh filesystem on `store` that commits only when asked.
fn format_and_open(store: &Arc<CrashStore>) -> FileSystem {
    FileSystem::format(store.clone()).unwrap();
    FileSystem::open(
        store.clone(),
        FsOptions {
            read_only: false,
            commit_interval_secs: 3600,
            ..FsOptions::default()
        },
    )
    .unwrap()
}

fn crash_case(seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let store = Arc::new(CrashStore::new(6, 2 * MIB, 64 * 1024).expect("crash store"));
    let fs = format_and_open(&store);
    let sub = fs
        .mkdir(&Caller::root(), ROOT_INO, n("sub"), 0o755, 0)
        .unwrap()
        .ino;
    fs.sync_all().unwrap();
    let mut run = Run {
        fs,
        dirs: vec![ROOT_INO, sub],
        files: BTreeMap::new(),
        stable: BTreeMap::new(),
    };
    store.set_write_budget(Some(rng.gen_range(0..300)));
    for _ in 0..200 {
        if run.step(&mut rng).is_err() {
            break;
        }
    }
    let crashed = Arc::new(store.crash(seed).expect("crash image"));
    drop(run.fs);
    let report = fsck(crashed.clone(), false)
        .unwrap_or_else(|e| panic!("seed {seed}: fsck cannot load: {e}"));
    assert!(report.is_clean(), "seed {seed}: {:?}", report.problems);
    let fs = FileSystem::open(crashed.clone(), FsOptions::default())
        .unwrap_or_else(|e| panic!("seed {seed}: open: {e}"));
    for (key, data) in &run.stable {
        let name = format!("{}/{}", key.0, key.1);
        let attr = fs
            .lookup(&Caller::root(), run.dirs[key.0], n(&key.1))
            .unwrap_or_else(|e| panic!("seed {seed}: {name}: {e}"));
        assert_eq!(attr.size, data.len() as u64, "seed {seed}: size of {name}");
        let back = fs.read(attr.ino, 0, data.len() + 1).unwrap();
        assert!(back == *data, "seed {seed}: contents of {name}");
    }
    // Whatever replay kept, it never points at data the crash lost: every
    // file reads whole, without a checksum failure.
    for key in run.files.keys() {
        if let Ok(attr) = fs.lookup(&Caller::root(), run.dirs[key.0], n(&key.1)) {
            if let Err(e) = fs.read(attr.ino, 0, attr.size as usize) {
                panic!("seed {seed}: {}/{} does not read back: {e}", key.0, key.1);
            }
        }
    }
    fs.unmount().unwrap();
    let report = fsck(crashed, false).unwrap();
    assert!(
        report.is_clean(),
        "seed {seed} after remount: {:?}",
        report.problems
    );
}

#[test]
fn random_crash_points_recover_consistently() {
    for seed in 0..150 {
        crash_case(seed);
    }
}

/// A filesystem of a few thousand files in several directories, each with
/// a little data and an xattr, every change fsync'd: its metadata tree has
/// more than one level. The same files every time.
fn populated(store: &Arc<CrashStore>) -> (FileSystem, Vec<(u64, String, Vec<u8>)>) {
    let fs = format_and_open(store);
    let c = Caller::root();
    let mut files = Vec::new();
    for d in 0..4 {
        let dir = fs
            .mkdir(&c, ROOT_INO, n(&format!("d{d}")), 0o755, 0)
            .unwrap()
            .ino;
        for i in 0..600 {
            let name = format!("file-{i:04}");
            let ino = fs.mknod(&c, dir, n(&name), 0o100644, 0, 0).unwrap().ino;
            let data = if i % 10 == 0 {
                vec![(d * 7 + i) as u8; 4096]
            } else {
                Vec::new()
            };
            if !data.is_empty() {
                fs.write(ino, 0, &data).unwrap();
            }
            if i % 50 == 0 {
                fs.setxattr(&c, ino, n("user.tag"), name.as_bytes(), 0)
                    .unwrap();
            }
            files.push((dir, name, data));
        }
    }
    fs.sync_all().unwrap();
    (fs, files)
}

#[test]
fn power_cut_at_every_write_of_a_tree_checkpoint_keeps_every_fsync() {
    // How many writes the checkpoint makes, on a store that keeps power.
    let store = Arc::new(CrashStore::new(16, 4 * MIB, 64 * 1024).expect("crash store"));
    let (fs, _) = populated(&store);
    let before = store.writes();
    fs.unmount().unwrap();
    let writes = store.writes() - before;
    assert!(writes >= 2, "the checkpoint wrote {writes} times");
    eprintln!("the checkpoint makes {writes} writes; power is cut before each");
    drop(fs);
    // Power lost before each of them in turn (and before the flush after
    // the last), each crash image keeping its own subset of the unflushed
    // writes, each torn at its own sectors (the nodes go out in runs of up
    // to 1 MiB, so a torn run leaves some nodes whole and some not); then a
    // run where the checkpoint completes.
    for cut in 0..=writes {
        for seed in 0..16u64 {
            let store = Arc::new(CrashStore::new(16, 4 * MIB, 64 * 1024).expect("crash store"));
            let (fs, files) = populated(&store);
            let whole = cut == writes && seed == 0;
            if !whole {
                store.set_write_budget(Some(cut));
            }
            let unmounted = fs.unmount();
            assert_eq!(unmounted.is_ok(), whole, "cut {cut} of {writes}");
            let crashed = Arc::new(store.crash(seed * 1000 + cut).expect("crash image"));
            drop(fs);
            let report = fsck(crashed.clone(), false)
                .unwrap_or_else(|e| panic!("cut {cut} seed {seed}: fsck cannot load: {e}"));
            assert!(
                report.is_clean(),
                "cut {cut} seed {seed}: {:?}",
                report.problems
            );
            let fs = FileSystem::open(crashed.clone(), FsOptions::default())
                .unwrap_or_else(|e| panic!("cut {cut} seed {seed}: open: {e}"));
            let c = Caller::root();
            for (dir, name, data) in &files {
                let attr = fs
                    .lookup(&c, *dir, n(name))
                    .unwrap_or_else(|e| panic!("cut {cut} seed {seed}: {name}: {e}"));
                assert_eq!(attr.size, data.len() as u64, "cut {cut}: {name}");
                if !data.is_empty() {
                    assert!(
                        fs.read(attr.ino, 0, data.len()).unwrap() == *data,
                        "cut {cut} seed {seed}: contents of {name}"
                    );
                }
            }
            // The next checkpoint, from whichever root survived, is whole too.
            fs.unmount().unwrap();
            drop(fs);
            let report = fsck(crashed, false).unwrap();
            assert!(
                report.is_clean(),
                "cut {cut} seed {seed}, remounted: {:?}",
                report.problems
            );
        }
    }
}

#[test]
fn crash_during_checkpoints_recovers() {
    // A tiny journal (the metadata group is small) forces frequent checkpoints.
    for seed in 1000..1040 {
        let mut rng = StdRng::seed_from_u64(seed);
        let store = Arc::new(CrashStore::new(8, 512 * 1024, 4096).expect("crash store"));
        let fs = format_and_open(&store);
        let c = Caller::root();
        let mut synced = Vec::new();
        store.set_write_budget(Some(rng.gen_range(20..400)));
        for i in 0..300 {
            let name = format!("n{i}");
            if fs.mknod(&c, ROOT_INO, n(&name), 0o100644, 0, 0).is_err() || fs.sync_all().is_err() {
                break;
            }
            synced.push(name);
        }
        let crashed = Arc::new(store.crash(seed).expect("crash image"));
        drop(fs);
        let report = fsck(crashed.clone(), false).unwrap();
        assert!(report.is_clean(), "seed {seed}: {:?}", report.problems);
        let fs = FileSystem::open(crashed, FsOptions::default()).unwrap();
        for name in &synced {
            fs.lookup(&c, ROOT_INO, n(name))
                .unwrap_or_else(|e| panic!("seed {seed}: {name}: {e}"));
        }
    }
}

#[test]
fn an_overwrite_in_place_never_costs_the_last_fsync() {
    // The last fsync's record went out with its data and replay checks
    // that data; a full filesystem then overwrites some of it in place,
    // and the overwrite reaches the disk before any further commit. Replay
    // must still keep that fsync (before: the check failed and the record,
    // with every file it carried, was left out).
    let store = Arc::new(CrashStore::new(4, 2 * MIB, 64 * 1024).expect("crash store"));
    let fs = format_and_open(&store);
    let c = Caller::root();
    // f and the filler that takes every free block after it, in one batch
    // and so in one record.
    let f = fs.mknod(&c, ROOT_INO, n("f"), 0o100644, 0, 0).unwrap().ino;
    fs.write(f, 0, &[1u8; 16384]).unwrap();
    let filler = fs
        .mknod(&c, ROOT_INO, n("filler"), 0o100644, 0, 0)
        .unwrap()
        .ino;
    let mut size = 0u64;
    while fs.write(filler, size, &[2u8; 4096]).is_ok() {
        size += 4096;
    }
    assert!(size > 0);
    fs.fsync(filler, false).unwrap();
    let before = fs.extents(f).unwrap();
    // No block is free: this overwrite goes in place, and the store then
    // writes it back (as the page cache would) before any commit.
    fs.write(f, 0, &[4u8; 16384]).unwrap();
    assert_eq!(fs.extents(f).unwrap(), before, "overwritten in place");
    store.flush().unwrap();
    let crashed = Arc::new(store.crash(0).expect("crash image"));
    drop(fs);

    let fs = FileSystem::open(crashed, FsOptions::default()).unwrap();
    let attr = fs
        .lookup(&c, ROOT_INO, n("filler"))
        .expect("the fsync'd filler");
    assert_eq!(attr.size, size);
    assert!(fs.read(attr.ino, 0, size as usize).unwrap() == vec![2u8; size as usize]);
    assert_eq!(fs.lookup(&c, ROOT_INO, n("f")).expect("f").size, 16384);
}

#[test]
fn after_a_failed_commit_fsync_and_unmount_keep_failing() {
    // A commit that fails for good leaves the changes it carried only in
    // memory. A later fsync of a file among them found the filesystem
    // read-only, flushed the store (which worked again) and returned OK
    // for a file that was never written to the journal.
    // Writes fail while `failing` is set, with an error that is not the
    // host's (not retryable): the filesystem cannot keep the changes for a
    // later commit and turns read-only.
    let failing = Arc::new(AtomicBool::new(false));
    let store = Arc::new({
        let failing = failing.clone();
        HookedStore::fallible(MemStore::new(8, 8 * MIB, 64 * 1024), move |addr, _| {
            if failing.load(Ordering::Acquire) {
                return Err(StoreError::Io(format!(
                    "injected write failure at {addr:#x}"
                )));
            }
            Ok(())
        })
    });
    FileSystem::format(store.clone()).unwrap();
    let fs = FileSystem::open(
        store.clone(),
        FsOptions {
            commit_interval_secs: 3600,
            ..FsOptions::default()
        },
    )
    .unwrap();
    let c = Caller::root();
    let kept = fs
        .mknod(&c, ROOT_INO, n("kept"), 0o100644, 0, 0)
        .unwrap()
        .ino;
    fs.write(kept, 0, &[1u8; 8192]).unwrap();
    fs.fsync(kept, false).unwrap();
    let lost = fs
        .mknod(&c, ROOT_INO, n("lost"), 0o100644, 0, 0)
        .unwrap()
        .ino;
    fs.write(lost, 0, &[2u8; 8192]).unwrap();
    failing.store(true, Ordering::Release);
    assert!(fs.fsync(lost, false).is_err(), "the commit failed");
    failing.store(false, Ordering::Release);
    assert!(fs.is_read_only());
    let again = fs.fsync(lost, false);
    assert!(
        matches!(again, Err(FsError::Store(StoreError::Io(_)))),
        "{again:?}"
    );
    assert!(fs.sync_all().is_err(), "sync(2) after the failed commit");
    assert!(fs.unmount().is_err(), "unmount after the failed commit");
    drop(fs);

    let fs = FileSystem::open(store, FsOptions::default()).unwrap();
    assert_eq!(fs.lookup(&c, ROOT_INO, n("kept")).unwrap().size, 8192);
    assert!(matches!(
        fs.lookup(&c, ROOT_INO, n("lost")),
        Err(FsError::NotFound)
    ));
}
