//! Verified reads and the member error accounting.
//!
//! A verified read is checked by the caller's test (the filesystem's block
//! checksums). When it fails, every mirror copy is read, or on parity levels
//! each member in turn is treated as the suspect and its chunks rebuilt from
//! the others, until a version passes. That version is returned, the bad
//! copy is rewritten in place from it, and the member that held it gets a
//! checksum error. A member whose read and checksum errors together pass
//! [`MAX_CORRECTED_ERRORS`] is failed (md's `max_corr_read_errors`), unless
//! the array cannot lose it.

use super::io::{is_mirror, split, Choice, Piece};
use super::worker::Op;
use super::{Array, ArrayError, ArrayResult, Region};
use crate::geometry::Level;
use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;

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
        let (region, offset) = self.region(addr, buf.len())?;
        self.read_region(&region, offset, buf, Choice::Any)?;
        let passed = verify(buf);
        let mirror = is_mirror(region.geometry.level);
        if passed && !(mirror && every_copy) {
            return Ok(Vec::new());
        }
        let pieces = split(&region, offset, buf.len());
        let bad = match region.geometry.level {
            Level::Raid1 | Level::Raid10 => {
                self.verify_mirror(&region, offset, &pieces, buf, verify, repair)?
            }
            Level::Raid5 | Level::Raid6 => {
                self.verify_parity(&region, &pieces, buf, verify, repair)?
            }
            Level::Raid0 => None,
        };
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

    /// Read every copy; `None` when none passes. Otherwise `buf` holds the
    /// first that passes, and the members whose copy differs from it are
    /// returned (and rewritten when `repair`).
    fn verify_mirror(
        &self,
        region: &Region,
        offset: u64,
        pieces: &[Piece],
        buf: &mut [u8],
        verify: &dyn Fn(&[u8]) -> bool,
        repair: bool,
    ) -> ArrayResult<Option<Vec<usize>>> {
        let versions: Vec<Option<Vec<u8>>> = (0..region.geometry.copies)
            .map(|n| {
                let mut copy = vec![0u8; buf.len()];
                self.read_region(region, offset, &mut copy, Choice::Copy(n))
                    .is_ok()
                    .then_some(copy)
            })
            .collect();
        let Some(good) = versions.iter().flatten().find(|v| verify(v)) else {
            return Ok(None);
        };
        buf.copy_from_slice(good);
        let mut bad = BTreeSet::new();
        let mut writes = Vec::new();
        let shared: Arc<[u8]> = Arc::from(&*buf);
        for (n, version) in versions.iter().enumerate() {
            let Some(bytes) = version else { continue };
            for p in pieces {
                let range = p.buf_off..p.buf_off + p.len;
                let Some(t) = p.map.targets.get(n) else {
                    continue;
                };
                if bytes[range.clone()] != buf[range.clone()] {
                    bad.insert(t.member);
                    writes.push((
                        t.member,
                        Op::Write {
                            offset: region.base + t.offset,
                            data: Arc::clone(&shared),
                            range,
                        },
                    ));
                }
            }
        }
        if repair {
            let _guard = self
                .locks
                .lock_all(region.group, pieces.iter().map(|p| p.map.stripe));
            self.write_repairs(writes);
        }
        Ok(Some(bad.into_iter().collect()))
    }

    /// Try each member holding part of the range as the suspect; `None` when
    /// no reconstruction passes. The suspect's chunks are rewritten from the
    /// reconstruction under the stripe locks, so parity stays consistent.
    fn verify_parity(
        &self,
        region: &Region,
        pieces: &[Piece],
        buf: &mut [u8],
        verify: &dyn Fn(&[u8]) -> bool,
        repair: bool,
    ) -> ArrayResult<Option<Vec<usize>>> {
        let holders: BTreeSet<usize> = pieces.iter().map(|p| p.map.targets[0].member).collect();
        for suspect in holders {
            if self.is_failed(suspect) {
                continue;
            }
            let _guard = self
                .locks
                .lock_all(region.group, pieces.iter().map(|p| p.map.stripe));
            let mut trial = vec![0u8; buf.len()];
            let rebuilt = pieces.iter().try_for_each(|p| {
                let lo = p.map.offset_in_chunk as usize;
                let blocks =
                    self.reconstruct_locked(region, p.map.stripe, lo, p.len, Some(suspect))?;
                trial[p.buf_off..p.buf_off + p.len].copy_from_slice(&blocks[p.map.data_index]);
                Ok::<(), ArrayError>(())
            });
            if rebuilt.is_err() || !verify(&trial) {
                continue;
            }
            buf.copy_from_slice(&trial);
            if repair {
                let shared: Arc<[u8]> = Arc::from(trial);
                let writes = pieces
                    .iter()
                    .filter(|p| p.map.targets[0].member == suspect)
                    .map(|p| {
                        let at = region.base + p.map.targets[0].offset;
                        (
                            suspect,
                            Op::Write {
                                offset: at,
                                data: Arc::clone(&shared),
                                range: p.buf_off..p.buf_off + p.len,
                            },
                        )
                    })
                    .collect();
                self.write_repairs(writes);
            }
            return Ok(Some(vec![suspect]));
        }
        Ok(None)
    }

    fn write_repairs(&self, writes: Vec<(usize, Op)>) {
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
        let mut without = self.unreadable_slots();
        without.push(slot);
        if self.survives_without(&without) {
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
        self.slots[slot]
            .errors
            .write
            .fetch_add(1, Ordering::Relaxed);
        self.member_error(slot, e, what, span)
    }
}
