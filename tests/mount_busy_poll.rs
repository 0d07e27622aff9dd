//! Busy polling of `/dev/fuse` (`-o busy_poll`), end to end through a
//! mount: one thread reads the device at a time and serves quick requests
//! (small writes, namespace and attribute requests) itself, so a quick
//! request that blocks after all must not hold up every other caller; the
//! session's watchdog hands the reading to another thread. Whether a
//! stream is polled at all is measured while it runs (`busy_poll_mode`),
//! so both ways of reading are tried under a long stream, which must
//! lose nothing either.

mod common;

use std::fs::{self, OpenOptions};
use std::os::unix::fs::FileExt;
use std::sync::mpsc;
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use common::{fuse_available, mount_store, pattern};
use parking_lot::{Condvar, Mutex};
use raidfs::fs::teststore::{HookedStore, MemStore};
use raidfs::fs::FileSystem;
use raidfs::fuse::MountConfig;

const PAGE: usize = 4096;

/// Holds the store write of one recognisable block until opened.
#[derive(Default)]
struct Gate {
    state: Mutex<GateState>,
    changed: Condvar,
}

#[derive(Default)]
struct GateState {
    /// The bytes whose write is held while the gate is shut.
    held: Option<Vec<u8>>,
    /// A write of them is waiting.
    waiting: bool,
}

impl Gate {
    fn before_write(&self, data: &[u8]) {
        let mut st = self.state.lock();
        while st
            .held
            .as_deref()
            .is_some_and(|held| data.starts_with(held))
        {
            st.waiting = true;
            self.changed.notify_all();
            self.changed.wait(&mut st);
        }
    }

    fn shut_for(&self, data: &[u8]) {
        self.state.lock().held = Some(data.to_vec());
    }

    fn wait_for_writer(&self) {
        let mut st = self.state.lock();
        while !st.waiting {
            self.changed.wait(&mut st);
        }
    }

    fn open(&self) {
        let mut st = self.state.lock();
        st.held = None;
        self.changed.notify_all();
    }
}

/// Opens the gate however the test ends, so the held write and the
/// unmount can finish.
struct OpenOnDrop(Arc<Gate>);

impl Drop for OpenOnDrop {
    fn drop(&mut self) {
        self.0.open();
    }
}

#[test]
fn a_small_write_held_by_the_store_does_not_hold_up_other_callers() {
    held_write_does_not_hold_up_others(true, 0);
}

#[test]
fn measured_polling_loses_no_write_of_a_long_stream() {
    // The first trial of sleeping comes after four epochs of 256
    // requests polled and lasts four, so 3,000 writes issued back to back
    // are read both ways (the choice's own tests, in poll_choice.rs,
    // check the trials; this one checks that switching loses nothing).
    held_write_does_not_hold_up_others(false, 3000);
}

/// The held-write scenario after a stream of `stream` 4 KiB writes, with
/// polling always on or measured.
fn held_write_does_not_hold_up_others(always: bool, stream: usize) {
    if !fuse_available() {
        return;
    }
    let gate = Arc::new(Gate::default());
    let hook = gate.clone();
    let store = Arc::new(HookedStore::new(
        MemStore::new(16, 64 << 20, 64 << 10),
        move |_, data| hook.before_write(data),
    ));
    FileSystem::format(store.clone()).unwrap();
    let config = MountConfig {
        threads: 4,
        busy_poll: Duration::from_micros(50),
        busy_poll_always: always,
        ..MountConfig::default()
    };
    let mnt = mount_store(store, &config);
    let _open = OpenOnDrop(gate.clone());

    let streamed = mnt.join("stream");
    let file = OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(&streamed)
        .unwrap();
    for i in 0..stream {
        file.write_all_at(&pattern(i as u8, PAGE), (i * PAGE) as u64)
            .unwrap();
    }
    drop(file);

    let other = mnt.join("other");
    let other_bytes = pattern(2, 8 * PAGE);
    fs::write(&other, &other_bytes).unwrap();
    let held_path = mnt.join("held");
    fs::write(&held_path, pattern(3, PAGE)).unwrap();

    // A 4 KiB write is a quick request: the thread that read it serves it,
    // and it is done before its answer, so the store holds that thread.
    let held_bytes = pattern(4, PAGE);
    gate.shut_for(&held_bytes);
    let writer = {
        let (path, data) = (held_path.clone(), held_bytes.clone());
        thread::spawn(move || {
            let file = OpenOptions::new().write(true).open(&path)?;
            file.write_all_at(&data, 0)
        })
    };
    gate.wait_for_writer();

    // Meanwhile another caller looks a file up, opens, reads and stats it.
    let (done, answers) = mpsc::channel();
    thread::spawn(move || {
        let read = fs::read(&other).and_then(|bytes| Ok((bytes, fs::metadata(&other)?.len())));
        let _ = done.send(read);
    });
    let answered = answers.recv_timeout(Duration::from_secs(20));
    gate.open();
    let (bytes, len) = answered
        .expect("a read of another file waited for a write the store held")
        .unwrap();
    assert_eq!(len, other_bytes.len() as u64);
    assert!(bytes == other_bytes, "the other file read back wrong");

    writer.join().unwrap().unwrap();
    assert!(
        fs::read(&held_path).unwrap() == held_bytes,
        "the held write did not land"
    );
    let bytes = fs::read(&streamed).unwrap();
    assert_eq!(bytes.len(), stream * PAGE);
    for (i, block) in bytes.chunks(PAGE).enumerate() {
        assert!(
            block == pattern(i as u8, PAGE),
            "streamed block {i} read back wrong"
        );
    }
}

#[test]
fn without_busy_polling_every_thread_reads_and_files_read_back() {
    if !fuse_available() {
        return;
    }
    let config = MountConfig {
        busy_poll: Duration::ZERO,
        ..MountConfig::default()
    };
    let mnt = mount_store(common::mem_store(), &config);
    let writers: Vec<_> = (0..4u8)
        .map(|i| {
            let path = mnt.join(&format!("f{i}"));
            thread::spawn(move || {
                for round in 0..20u8 {
                    fs::write(
                        &path,
                        pattern(i.wrapping_mul(31).wrapping_add(round), 3 * PAGE),
                    )?;
                }
                fs::read(&path)
            })
        })
        .collect();
    for (i, writer) in writers.into_iter().enumerate() {
        let bytes = writer.join().unwrap().unwrap();
        assert!(bytes == pattern((i as u8).wrapping_mul(31).wrapping_add(19), 3 * PAGE));
    }
}
