//! Verified reads and the member error accounting.
//!
//! A verified read is checked by the caller's test (the filesystem's block
//! checksums). When it fails, the personality looks for a version that
//! passes (every mirror copy is read; on parity levels each member in turn
//! is treated as the suspect and its chunks rebuilt from the others). That
//! version is returned, the bad
//! copy is rewritten in place from it, and the member that held it gets a
//! checksum error. A member whose read and checksum errors together pass
//! [`MAX_CORRECTED_ERRORS`] is failed (md's `max_corr_read_errors`), unless
//! the array cannot lose it.

use super::io::{split, Choice};
use super::worker::Op;
use super::{Array, ArrayError, ArrayResult};
use std::sync::atomic::Ordering;

/// Read and checksum errors a member may accumulate before it is failed.
pub const MAX_CORRECTED_ERRORS: u64 = 20;

/// A member that held a copy failing verification.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BadCopy {
    pub slot: usize,
    pub member: String,
}

impl Array {
    /// Read and check with `verify`; when it fails, try every other copy (or
    /// every member as the suspect for parity levels), return the first
    /// version that passes and rewrite the bad copy from it (unless the
    /// array was assembled read-only). `Unrecoverable` when no version passes.
    pub fn read_verified(
        &self,
        addr: u64,
        buf: &mut [u8],
        verify: &dyn Fn(&[u8]) -> bool,
    ) -> ArrayResult<()> {
        self.verify_range(addr, buf, verify, false, !self.read_only)
            .map(|_| ())
    }

    /// Scrub `[addr, addr + buf.len())`: as [`Array::read_verified`], but on
    /// mirrors every copy is checked even when the first passes, and with
    /// `repair` false nothing is rewritten. Returns the members that held a
    /// bad copy (each is counted in its `checksum_errors`).
    pub fn scrub_verified(
        &self,
        addr: u64,
        buf: &mut [u8],
        verify: &dyn Fn(&[u8]) -> bool,
        repair: bool,
    ) -> ArrayResult<Vec<BadCopy>> {
        // An array assembled read-only never writes (fsck without --repair).
        self.verify_range(addr, buf, verify, true, repair && !self.read_only)
    }

    fn verify_range(
        &self,
        addr: u64,
        buf: &mut [u8],
        verify: &dyn Fn(&[u8]) -> bool,
        every_copy: bool,
        repair: bool,
    ) -> ArrayResult<Vec<BadCopy>> {
        // The place stays as resolved while it is read and repaired (see
        // `Array::read`).
        let _reading = self.reshape_gate.read();
        let (region, offset) = self.region(addr, buf.len())?;
        self.read_region(&region, offset, buf, Choice::Any)?;
        let passed = verify(buf);
        if passed && !(every_copy && region.personality.has_copies()) {
            return Ok(Vec::new());
        }
        let pieces = split(&region, offset, buf.len());
        let bad = self.find_good_version(&region, offset, &pieces, buf, verify, repair)?;
        let Some(slots) = bad else {
            // Not an error by itself: the journal finds the end of its log
            // this way on every mount. Callers for which it is one say so
            // (the FUSE adapter logs the failed request, scrub reports it).
            log::debug!(
                "raidfs: no copy of {} bytes at logical {addr:#x} passes its checksum",
                buf.len()
            );
            return Err(ArrayError::Unrecoverable(addr));
        };
        for &slot in &slots {
            self.note_checksum_error(slot, addr, buf.len(), repair);
        }
        Ok(slots
            .into_iter()
            .map(|slot| BadCopy {
                slot,
                member: self.slots[slot].name(),
            })
            .collect())
    }

    pub(super) fn write_repairs(&self, writes: Vec<(usize, Op)>) {
        let slots: Vec<usize> = writes.iter().map(|(s, _)| *s).collect();
        for (slot, outcome) in slots.into_iter().zip(self.pool.run(writes)) {
            if let Err(e) = outcome {
                self.write_failed(slot, &e, "rewriting a bad copy", None);
            }
        }
    }

    /// Count a bad copy against `slot`, and fail the member once its
    /// corrected errors pass the limit (if the array can do without it).
    fn note_checksum_error(&self, slot: usize, addr: u64, len: usize, repaired: bool) {
        let errors = &self.slots[slot].errors;
        let checksum = errors.checksum.fetch_add(1, Ordering::Relaxed) + 1;
        let total = checksum + errors.read.load(Ordering::Relaxed);
        log::warn!(
            "raidfs: {} held a bad copy of {len} bytes at logical {addr:#x}{} ({checksum} checksum errors)",
            self.slots[slot].name(),
            if repaired { ", rewritten" } else { "" }
        );
        if total <= MAX_CORRECTED_ERRORS || self.is_failed(slot) {
            return;
        }
        if self.survives_losing(slot) {
            self.record_failure(
                slot,
                &format!("{total} read and checksum errors (limit {MAX_CORRECTED_ERRORS})"),
            );
        } else {
            log::error!(
                "raidfs: {} has {total} read and checksum errors but the array cannot lose it",
                self.slots[slot].name()
            );
        }
    }

    /// A member read failed: count it, then let [`Array::member_error`]
    /// decide whether the member or the host is at fault. The error the
    /// request must report when it is the host's.
    pub(crate) fn read_failed(
        &self,
        slot: usize,
        e: &std::io::Error,
        what: &str,
    ) -> Option<ArrayError> {
        self.slots[slot].errors.read.fetch_add(1, Ordering::Relaxed);
        self.member_error(slot, e, what, None)
    }

    /// A member write (or sync) failed: as [`Array::read_failed`]; `span`
    /// is the member byte range the write touched (kept for a resync when
    /// the host is out of space).
    pub(crate) fn write_failed(
        &self,
        slot: usize,
        e: &std::io::Error,
        what: &str,
        span: Option<(u64, u64)>,
    ) -> Option<ArrayError> {
        // A full host is not the member's error: it has its own count
        // (`host_no_space_errors`), and a monitor alerting on member write
        // errors must not page for it.
        if super::host::classify(e) != super::host::Fault::NoSpace {
            self.slots[slot]
                .errors
                .write
                .fetch_add(1, Ordering::Relaxed);
        }
        self.member_error(slot, e, what, span)
    }
}
