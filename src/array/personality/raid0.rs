//! The RAID0 personality: striping without redundancy. Reads go straight
//! to the chunk's member, writes to it alone (the engine's plain write);
//! nothing can be reconstructed, verified against another version,
//! scrubbed or rebuilt, and the array survives no lost member.

use super::super::io::split;
use super::super::{Array, ArrayError, ArrayResult, Region};

impl Array {
    pub(super) fn read_raid0(
        &self,
        region: &Region,
        offset: u64,
        buf: &mut [u8],
    ) -> ArrayResult<()> {
        let pieces = split(region, offset, buf.len());
        self.wait_written(region, &pieces)?;
        let lost = self.read_pieces_direct(region, &pieces, buf)?;
        // A piece whose read failed is read once more if its member is
        // still in service (the error did not fail it); there is no other
        // copy to turn to.
        for i in lost {
            let p = &pieces[i];
            let _guard = self.lock_stripes(region.group, [p.map.stripe])?;
            let within = p.map.stripe * region.geometry.chunk + p.map.offset_in_chunk;
            let last = within + p.len as u64 - 1;
            let unreadable = region
                .geometry
                .stripe_members(p.map.stripe)
                .data
                .iter()
                .filter(|&&m| !self.readable(m, region, last))
                .count();
            if unreadable > 0 {
                return Err(ArrayError::Failed(format!(
                    "stripe {} of group {} has {unreadable} unreadable members",
                    p.map.stripe, region.group
                )));
            }
            let t = p.map.targets[0];
            let read = self.pool.read_inline(
                t.member,
                region.base + t.offset,
                &mut buf[p.buf_off..p.buf_off + p.len],
            );
            if let Err(e) = read {
                if let Some(host) = self.read_failed(t.member, &e, "read") {
                    return Err(host);
                }
                return Err(ArrayError::Failed(format!(
                    "stripe {} of group {} has 1 unreadable members",
                    p.map.stripe, region.group
                )));
            }
        }
        Ok(())
    }
}
