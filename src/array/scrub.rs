//! Scrub: read every stripe of allocated groups and compare its redundancy
//! (parity recomputed from the data, or every mirror copy against the first),
//! counting mismatched bytes as md's mismatch_cnt does; repair rewrites the
//! parity or the other copies, unless the filesystem's content judge shows
//! that the data or the first copy is what is wrong (see `judge`). The
//! comparisons are the personalities' (`Array::scrub_rows`); this module
//! holds what they share.

use super::worker::Op;
use super::{Array, ArrayError, ArrayResult};

impl Array {
    /// Write the repairs a scrub decided on; a member that refuses fails.
    pub(super) fn run_repairs(&self, writes: Vec<(usize, Op)>) -> ArrayResult<()> {
        if writes.is_empty() {
            return Ok(());
        }
        let slots: Vec<usize> = writes.iter().map(|(s, _)| *s).collect();
        let mut host = None;
        for (slot, outcome) in slots.into_iter().zip(self.pool.run(writes)) {
            if let Err(e) = outcome {
                host = host.or(self.write_failed(slot, &e, "write during repair", None));
            }
        }
        if let Some(e) = host {
            return Err(e);
        }
        self.ensure_writable()
            .map_err(|e| ArrayError::Failed(e.to_string()))
    }
}

/// Bytes in which `a` and `b` differ.
pub(super) fn diff_bytes(a: &[u8], b: &[u8]) -> u64 {
    a.iter().zip(b).filter(|(x, y)| x != y).count() as u64
}
