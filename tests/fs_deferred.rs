//! Writes answered before they are done (`FileSystem::accept_write`),
//! driven directly: whatever runs after the answer must see the write,
//! overlapping writes keep their order, and a failure after the answer is
//! reported by fsync and close.

use std::ffi::OsStr;
use std::sync::mpsc;
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};
use raidfs::fs::teststore::{CrashStore, HookedStore, MemStore};
use raidfs::fs::*;

const MIB: u64 = 1 << 20;
/// Enough groups that the free space covers the margin kept for deferred writes.
const ROOMY_GROUPS: u32 = 32;

/// Holds every write while closed.
#[derive(Default)]
struct Gate {
    closed: Mutex<bool>,
    opened: Condvar,
}

impl Gate {
    fn close(&self) {
        *self.closed.lock() = true;
    }

    fn open(&self) {
        *self.closed.lock() = false;
        self.opened.notify_all();
    }

    fn pass(&self) {
        let mut closed = self.closed.lock();
        while *closed {
            self.opened.wait(&mut closed);
        }
    }
}

fn deferring() -> FsOptions {
    FsOptions {
        deferred_writes: 2,
        ..FsOptions::default()
    }
}

fn mkfile(fs: &FileSystem, name: &str) -> u64 {
    fs.mknod(&Caller::root(), ROOT_INO, OsStr::new(name), 0o100644, 0, 0)
        .unwrap()
        .ino
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}

#[test]
fn operations_after_the_answer_wait_for_the_write() {
    let (gate, _, fs) = behind_gate(deferring());
    let ino = mkfile(&fs, "f");
    let data = pattern(MIB as usize, 7);

    gate.close();
    let accepted = fs.accept_write(ino, 0, data.len(), false).unwrap();
    let writer = {
        let (fs, data) = (Arc::clone(&fs), data.clone());
        thread::spawn(move || fs.complete_write(accepted, &data))
    };
    // Each of these runs while the write is held at the store; each must
    // wait for it and then see it.
    let (tx, rx) = mpsc::channel();
    let mut readers = Vec::new();
    for op in 0..3 {
        let (fs, tx) = (Arc::clone(&fs), tx.clone());
        readers.push(thread::spawn(move || {
            let seen = match op {
                0 => fs.read(ino, 0, MIB as usize).unwrap(),
                1 => fs.getattr(ino).unwrap().size.to_le_bytes().to_vec(),
                _ => {
                    fs.fsync(ino, false).unwrap();
                    fs.read(ino, MIB - 8, 8).unwrap()
                }
            };
            tx.send((op, seen)).unwrap();
        }));
    }
    // A reader that did not wait would answer now, with the write still
    // held (what it saw is then checked below and fails).
    let early = rx.recv_timeout(Duration::from_millis(200));
    gate.open();
    let mut results: Vec<(i32, Vec<u8>)> = early.into_iter().collect();
    while results.len() < 3 {
        results.push(rx.recv().unwrap());
    }
    for (op, seen) in results {
        match op {
            0 => assert!(seen == data, "read saw the file before the write"),
            1 => assert_eq!(seen, MIB.to_le_bytes().to_vec(), "getattr's size"),
            _ => assert_eq!(seen, data[data.len() - 8..].to_vec(), "after fsync"),
        }
    }
    writer.join().unwrap();
    for r in readers {
        r.join().unwrap();
    }
}

#[test]
fn overlapping_writes_land_in_the_order_they_were_answered() {
    let store = Arc::new(MemStore::new(ROOMY_GROUPS, 8 * MIB, 64 * 1024));
    FileSystem::format(store.clone()).unwrap();
    let fs = Arc::new(FileSystem::open(store.clone(), deferring()).unwrap());
    let ino = mkfile(&fs, "f");
    let first = pattern(256 * 1024, 1);
    let second = pattern(128 * 1024, 2);
    let a = fs.accept_write(ino, 0, first.len(), false).unwrap();
    let b = fs
        .accept_write(ino, 64 * 1024, second.len(), false)
        .unwrap();
    // The later write is started first; it must still land last.
    let late = {
        let (fs, second) = (Arc::clone(&fs), second.clone());
        thread::spawn(move || fs.complete_write(b, &second))
    };
    let early = {
        let (fs, first) = (Arc::clone(&fs), first.clone());
        thread::spawn(move || fs.complete_write(a, &first))
    };
    late.join().unwrap();
    early.join().unwrap();
    let mut expected = first.clone();
    expected[64 * 1024..192 * 1024].copy_from_slice(&second);
    assert!(fs.read(ino, 0, first.len()).unwrap() == expected);
    fs.fsync(ino, false).unwrap();
    fs.unmount().unwrap();
    let fs = FileSystem::open(store, FsOptions::default()).unwrap();
    assert!(fs.read(ino, 0, first.len()).unwrap() == expected);
}

#[test]
fn a_write_failing_after_its_answer_is_reported_by_fsync_and_by_close() {
    let store = Arc::new(CrashStore::new(ROOMY_GROUPS, 8 * MIB, 64 * 1024).expect("crash store"));
    FileSystem::format(store.clone()).unwrap();
    let fs = FileSystem::open(store.clone(), deferring()).unwrap();
    let (a, b) = (mkfile(&fs, "a"), mkfile(&fs, "b"));
    fs.sync_all().unwrap();

    store.set_write_budget(Some(0));
    for ino in [a, b] {
        let accepted = fs.accept_write(ino, 0, 4096, false).unwrap();
        fs.complete_write(accepted, &[1u8; 4096]);
    }
    assert_lost_writes_reported_once(&fs, a, b);
}

/// `a` and `b` each lost a write after its answer: fsync of `a` and close
/// of `b` report it, once each, as a failed page-cache writeback is.
fn assert_lost_writes_reported_once(fs: &FileSystem, a: u64, b: u64) {
    assert!(
        fs.fsync(a, false).is_err(),
        "fsync must report the lost write"
    );
    assert!(fs.flush(b).is_err(), "close must report the lost write");
    assert!(fs.flush(a).is_ok());
    assert!(fs.flush(b).is_ok());
}

#[test]
fn writes_that_could_fail_or_change_the_mode_are_not_deferred() {
    // Too small for the free-space margin: every write is done before its answer.
    let small = Arc::new(MemStore::new(4, 8 * MIB, 64 * 1024));
    FileSystem::format(small.clone()).unwrap();
    let fs = FileSystem::open(small, deferring()).unwrap();
    let ino = mkfile(&fs, "f");
    assert!(fs.accept_write(ino, 0, 4096, false).is_none());

    let store = Arc::new(MemStore::new(ROOMY_GROUPS, 8 * MIB, 64 * 1024));
    FileSystem::format(store.clone()).unwrap();
    let fs = FileSystem::open(store.clone(), deferring()).unwrap();
    let ino = mkfile(&fs, "f");
    let dir = fs
        .mkdir(&Caller::root(), ROOT_INO, OsStr::new("d"), 0o755, 0)
        .unwrap()
        .ino;
    assert!(fs.accept_write(dir, 0, 4096, false).is_none());
    assert!(fs.accept_write(ino, 1 << 50, 4096, false).is_none());
    assert!(fs.accept_write(ino, 0, 0, false).is_none());
    let setuid = SetAttr {
        mode: Some(0o4755),
        ..SetAttr::default()
    };
    fs.setattr(&Caller::root(), ino, &setuid).unwrap();
    assert!(fs.accept_write(ino, 0, 4096, true).is_none());
    let accepted = fs.accept_write(ino, 0, 4096, false).unwrap();
    fs.complete_write(accepted, &[9u8; 4096]);
    assert_eq!(fs.getattr(ino).unwrap().size, 4096);

    // Deferral off: nothing is accepted.
    fs.unmount().unwrap();
    let fs = FileSystem::open(store, FsOptions::default()).unwrap();
    assert!(fs.accept_write(ino, 0, 4096, false).is_none());
}

/// A filesystem opened with `opts` over a store whose writes wait at the
/// returned gate while it is closed (the store is returned to open the
/// filesystem again).
fn behind_gate(opts: FsOptions) -> (Arc<Gate>, Arc<HookedStore>, Arc<FileSystem>) {
    let gate = Arc::new(Gate::default());
    let hold = Arc::clone(&gate);
    let store = Arc::new(HookedStore::new(
        MemStore::new(ROOMY_GROUPS, 8 * MIB, 64 * 1024),
        move |_, _| hold.pass(),
    ));
    FileSystem::format(store.clone()).unwrap();
    let fs = Arc::new(FileSystem::open(store.clone(), opts).unwrap());
    (gate, store, fs)
}

/// Open `gate` and return what a reader sends on `rx`. A reader that did
/// not wait for the writes held at the gate answers before it opens, with
/// what it saw then (which the caller's check of it fails).
fn answer_once_opened<T>(gate: &Gate, rx: &mpsc::Receiver<T>) -> T {
    let early = rx.recv_timeout(Duration::from_millis(200));
    gate.open();
    early.or_else(|_| rx.recv()).unwrap()
}

fn queueing(depth: usize) -> FsOptions {
    FsOptions {
        deferred_writes: 2,
        queued_writes: depth,
        queue_spin: raidfs::cli::mount::options::QUEUE_SPIN,
        ..FsOptions::default()
    }
}

/// A small deterministic generator (xorshift64*), so a failure repeats.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
    }
}

/// Start a streak of writes on `ino` (the first write of one is done by
/// its caller: `FileSystem::queue_write` declines it) with a write of
/// nothing; true when the queue declined it.
fn start_streak(fs: &FileSystem, ino: u64) -> bool {
    let declined = !fs.queue_write(ino, 0, &[7u8; 1], false);
    if declined {
        fs.write(ino, 0, &[7u8; 1]).unwrap();
    }
    declined
}

fn apply(model: &mut Vec<u8>, offset: u64, data: &[u8]) {
    let end = offset as usize + data.len();
    if model.len() < end {
        model.resize(end, 0);
    }
    model[offset as usize..end].copy_from_slice(data);
}

#[test]
fn queued_writes_are_seen_by_what_follows_and_land_in_order_with_every_other_write() {
    const DEPTH: usize = 8;
    let (gate, store, fs) = behind_gate(queueing(DEPTH));
    let ino = mkfile(&fs, "f");
    let mut model = Vec::new();
    assert!(
        start_streak(&fs, ino),
        "a streak's first write is not queued"
    );
    apply(&mut model, 0, &[7u8; 1]);

    // One write held at the store by the queue's thread, DEPTH waiting
    // behind it, each overlapping the one before.
    gate.close();
    for i in 0..=DEPTH as u64 {
        let data = pattern(4096, i as u8);
        assert!(
            fs.queue_write(ino, i * 2048, &data, false),
            "write {i} queued"
        );
        apply(&mut model, i * 2048, &data);
    }
    let (tx, rx) = mpsc::channel();
    let reader = {
        let (fs, len) = (Arc::clone(&fs), model.len());
        thread::spawn(move || tx.send(fs.read(ino, 0, len).unwrap()).unwrap())
    };
    let seen = answer_once_opened(&gate, &rx);
    assert!(
        seen == model,
        "a read saw the file before its queued writes"
    );
    reader.join().unwrap();

    // Queued writes of every size under 16 KiB, mixed with writes the
    // caller does itself and large ones done by the answering thread, all
    // over the same 256 KiB: the file must end as if each was done when it
    // was answered.
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut declined = 0;
    for i in 0..600u32 {
        let offset = rng.below(256 * 1024);
        match i % 10 {
            0 => {
                let data = pattern(16 * 1024 + rng.below(48 * 1024) as usize, i as u8);
                let accepted = fs.accept_write(ino, offset, data.len(), false).unwrap();
                fs.complete_write(accepted, &data);
                apply(&mut model, offset, &data);
            }
            1 => {
                let data = pattern(1 + rng.below(8192) as usize, i as u8);
                assert_eq!(fs.write(ino, offset, &data).unwrap(), data.len());
                apply(&mut model, offset, &data);
            }
            _ => {
                let data = pattern(1 + rng.below(16 * 1024 - 1) as usize, i as u8);
                if !fs.queue_write(ino, offset, &data, false) {
                    declined += 1;
                    fs.write(ino, offset, &data).unwrap();
                }
                apply(&mut model, offset, &data);
            }
        }
    }
    // The read above ended the streak: only the first small write after it
    // was declined, and done by its caller.
    assert_eq!(declined, 1);
    assert_eq!(fs.getattr(ino).unwrap().size, model.len() as u64);
    assert!(fs.read(ino, 0, model.len()).unwrap() == model);
    // Anything but a write ends the streak: its next write is done first.
    fs.getattr(ino).unwrap();
    assert!(start_streak(&fs, ino));
    apply(&mut model, 0, &[7u8; 1]);
    // Unmount does what is still queued: the reopened file is the same.
    for i in 0..DEPTH as u64 {
        let data = pattern(4096, 200 + i as u8);
        assert!(fs.queue_write(ino, i * 4096, &data, false));
        apply(&mut model, i * 4096, &data);
    }
    fs.unmount().unwrap();
    drop(fs);
    let fs = FileSystem::open(store, FsOptions::default()).unwrap();
    assert!(fs.read(ino, 0, model.len()).unwrap() == model);
}

#[test]
fn a_queued_write_failing_is_reported_by_fsync_and_by_close() {
    let store = Arc::new(CrashStore::new(ROOMY_GROUPS, 8 * MIB, 64 * 1024).expect("crash store"));
    FileSystem::format(store.clone()).unwrap();
    let fs = FileSystem::open(store.clone(), queueing(4)).unwrap();
    let (a, b) = (mkfile(&fs, "a"), mkfile(&fs, "b"));
    for ino in [a, b] {
        start_streak(&fs, ino);
    }
    fs.sync_all().unwrap();

    store.set_write_budget(Some(0));
    for ino in [a, b] {
        assert!(fs.queue_write(ino, 0, &[1u8; 4096], false));
    }
    assert_lost_writes_reported_once(&fs, a, b);
}

#[test]
fn without_a_queue_or_room_the_caller_does_the_write() {
    // Each case starts a streak first, so that only the case itself can
    // make the queue decline.
    // No queue: off by queued_writes=0, by deferred_writes=0, read-only.
    let store = Arc::new(MemStore::new(ROOMY_GROUPS, 8 * MIB, 64 * 1024));
    FileSystem::format(store.clone()).unwrap();
    let fs = FileSystem::open(store.clone(), queueing(0)).unwrap();
    let ino = mkfile(&fs, "f");
    start_streak(&fs, ino);
    assert!(!fs.queue_write(ino, 0, &[1u8; 4096], false));
    fs.unmount().unwrap();
    let off = FsOptions {
        queued_writes: 8,
        ..FsOptions::default()
    };
    let fs = FileSystem::open(store.clone(), off).unwrap();
    start_streak(&fs, ino);
    assert!(!fs.queue_write(ino, 0, &[1u8; 4096], false));
    fs.unmount().unwrap();
    let read_only = FsOptions {
        read_only: true,
        ..queueing(8)
    };
    let fs = FileSystem::open(store, read_only).unwrap();
    assert!(!fs.queue_write(ino, 0, &[1u8; 4096], false));
    assert!(!fs.queue_write(ino, 0, &[1u8; 4096], false));

    // Too little free space for the margin: the write is done by the
    // caller, which hears ENOSPC itself.
    let small = Arc::new(MemStore::new(4, 8 * MIB, 64 * 1024));
    FileSystem::format(small.clone()).unwrap();
    let fs = FileSystem::open(small, queueing(8)).unwrap();
    let ino = mkfile(&fs, "f");
    start_streak(&fs, ino);
    assert!(!fs.queue_write(ino, 0, &[1u8; 4096], false));
    // Nor a write that must clear set-ID bits, or to a directory.
    let store = Arc::new(MemStore::new(ROOMY_GROUPS, 8 * MIB, 64 * 1024));
    FileSystem::format(store.clone()).unwrap();
    let fs = FileSystem::open(store, queueing(8)).unwrap();
    let ino = mkfile(&fs, "f");
    let setuid = SetAttr {
        mode: Some(0o4755),
        ..SetAttr::default()
    };
    fs.setattr(&Caller::root(), ino, &setuid).unwrap();
    start_streak(&fs, ino);
    assert!(!fs.queue_write(ino, 0, &[1u8; 4096], true));
    // The same write without set-ID bits to clear is queued.
    assert!(fs.queue_write(ino, 0, &[1u8; 4096], false));
    let dir = fs
        .mkdir(&Caller::root(), ROOT_INO, OsStr::new("d"), 0o755, 0)
        .unwrap()
        .ino;
    assert!(!fs.queue_write(dir, 0, &[1u8; 4096], false));
    assert!(!fs.queue_write(dir, 0, &[1u8; 4096], false));
}

#[test]
fn a_read_of_other_bytes_goes_ahead_of_queued_writes_and_one_they_change_waits() {
    const K: u64 = 1024;
    let (gate, _, fs) = behind_gate(queueing(8));
    let ino = mkfile(&fs, "f");
    let mut model = pattern(64 * K as usize, 1);
    assert_eq!(fs.write(ino, 0, &model).unwrap(), model.len());
    start_streak(&fs, ino);
    apply(&mut model, 0, &[7u8; 1]);
    let before = model.clone();

    // Two writes held at the store by the queue's thread: one inside the
    // file, one growing it from 64 KiB to 84 KiB.
    gate.close();
    let (inside, past) = (pattern(4 * K as usize, 2), pattern(4 * K as usize, 3));
    assert!(fs.queue_write(ino, 16 * K, &inside, false));
    assert!(fs.queue_write(ino, 80 * K, &past, false));
    apply(&mut model, 16 * K, &inside);
    apply(&mut model, 80 * K, &past);

    // Bytes neither changes are read at once, as they are (a read that
    // waited would never return here: the writes cannot finish).
    assert!(fs.read(ino, 0, 16 * K as usize).unwrap() == before[..16 * K as usize]);
    assert!(fs.read(ino, 20 * K, 44 * K as usize).unwrap() == before[20 * K as usize..]);
    // Such reads leave the writes a streak: the next one is queued too.
    let more = pattern(100, 4);
    assert!(fs.queue_write(ino, 40 * K, &more, false));
    apply(&mut model, 40 * K, &more);

    // A read of bytes a held write changes, and one reaching past the old
    // end, return only once the writes are done, and see them.
    let (tx, rx) = mpsc::channel();
    let reader = {
        let fs = Arc::clone(&fs);
        thread::spawn(move || {
            let overlapping = fs.read(ino, 18 * K, 4 * K as usize).unwrap();
            let past_end = fs.read(ino, 60 * K, 64 * K as usize).unwrap();
            tx.send((overlapping, past_end)).unwrap();
        })
    };
    let (overlapping, past_end) = answer_once_opened(&gate, &rx);
    reader.join().unwrap();
    assert!(overlapping == model[18 * K as usize..22 * K as usize]);
    assert_eq!(
        past_end.len(),
        24 * K as usize,
        "the read saw the grown file"
    );
    assert!(past_end == model[60 * K as usize..]);
    // The read that waited ended the streak: the next write is the
    // caller's own.
    assert!(start_streak(&fs, ino), "a wait ended the streak");
    apply(&mut model, 0, &[7u8; 1]);
    assert!(fs.read(ino, 0, model.len()).unwrap() == model);
}
