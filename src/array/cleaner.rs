//! The bitmap thread of a running array: every few seconds it flushes and
//! clears the write-intent bits of regions that saw no writes since its
//! last pass (never while degraded); in between it writes the bits set
//! ahead of sequential writers ([`Array::request_premark`]).
//!
//! The thread holds a `Weak` to its array and stops when the array is
//! dropped or at [`Array::stop_background`]. An array without it (tools,
//! tests) writes premarks with the writer.

use super::Array;
use crossbeam_channel::{RecvTimeoutError, Sender};
use parking_lot::Mutex;
use std::sync::Weak;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long a region must stay quiet before its bitmap bit is cleared.
const BITMAP_CLEAN_EVERY: Duration = Duration::from_secs(5);

/// The running thread, if any.
#[derive(Default)]
pub(crate) struct Cleaner {
    thread: Mutex<Option<(Sender<()>, JoinHandle<()>)>>,
}

impl Array {
    pub(super) fn start_cleaner(&self, weak: Weak<Array>) {
        let mut thread = self.cleaner.thread.lock();
        if thread.is_some() {
            return;
        }
        let (tx, rx) = crossbeam_channel::bounded::<()>(1);
        let spawned = std::thread::Builder::new()
            .name("raidfs-bitmap".into())
            .spawn(move || {
                let mut next_clean = Instant::now() + BITMAP_CLEAN_EVERY;
                loop {
                    // A message asks for a premark; a hang-up stops the thread.
                    let premark = match rx.recv_deadline(next_clean) {
                        Ok(()) => true,
                        Err(RecvTimeoutError::Timeout) => false,
                        Err(RecvTimeoutError::Disconnected) => return,
                    };
                    let Some(array) = weak.upgrade() else { return };
                    if premark {
                        if let Err(e) = array.mark_dirty_regions(None) {
                            log::debug!("bitmap premark: {e}");
                        }
                        array.bitmap.premark_done();
                    } else {
                        array.clean_bitmap();
                        next_clean = Instant::now() + BITMAP_CLEAN_EVERY;
                    }
                }
            });
        match spawned {
            Ok(handle) => *thread = Some((tx, handle)),
            Err(e) => log::error!("cannot start the bitmap thread: {e}"),
        }
    }

    /// Have the bitmap thread write the bits set ahead of a sequential
    /// writer ([`super::bitmap::Intent::Premark`]). Without the thread (an
    /// array used without [`Array::start_background`]) the bits wait for the writer
    /// that reaches them, which writes them itself.
    pub(crate) fn request_premark(&self) {
        let queued = self
            .cleaner
            .thread
            .lock()
            .as_ref()
            .is_some_and(|(tx, _)| tx.try_send(()).is_ok());
        if !queued {
            self.bitmap.premark_done();
        }
    }

    /// One cleaning pass (also used at clean shutdown); it also does again
    /// the writes the host refused ([`Array::retry_parked`]).
    pub(crate) fn clean_bitmap(&self) {
        if self.host.suspension().is_some() {
            return;
        }
        if self.is_degraded() {
            if self.write_back.has_parked() {
                let _ = self.flush();
            }
            self.bitmap.reset_recent();
            return;
        }
        if self.flush().is_err() {
            return;
        }
        let events = self.sb.lock().events;
        if self.bitmap.clean(events) > 0 {
            self.write_bitmap();
        }
    }

    pub(super) fn stop_cleaner(&self) {
        let thread = self.cleaner.thread.lock().take();
        if let Some((tx, handle)) = thread {
            drop(tx);
            if handle.thread().id() != std::thread::current().id() {
                let _ = handle.join();
            }
        }
    }
}
