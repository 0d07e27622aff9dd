//! `copy_file_range(2)` inside the array: the data is read and written by
//! the daemon, never passing through the caller. Extents are not shared
//! between files (no reference counts), so the bytes are copied, through
//! the ordinary checked read and write paths (checksums, copy-on-write,
//! set-ID clearing). Holes of the source stay holes: a hole is not read
//! and written as zeros, the destination's blocks there are punched out.

use super::super::core::Inner;
use super::super::inode::{Time, BLOCK_SIZE};
use super::super::perm;
use super::super::{FallocateMode, FsError, FsResult};
use super::data::{regular_file, MAX_FILE_SIZE};

/// Bytes read and written per step (bounds the buffer a copy holds).
const COPY_CHUNK: u64 = 1 << 20;

/// The most one call copies: the FUSE reply carries the count as 32 bits,
/// and a caller loops on a short copy as on a short write.
pub const MAX_COPY: u64 = u32::MAX as u64 / BLOCK_SIZE * BLOCK_SIZE;

/// What a copy does once its range is known.
#[derive(Clone, Copy, Debug)]
struct CopyPlan {
    src: u64,
    src_off: u64,
    dst: u64,
    dst_off: u64,
    count: u64,
}

impl Inner {
    /// Check a copy of `len` bytes as copy_file_range does and clip it: to
    /// the source's end (nothing to copy at or past it), to [`MAX_COPY`],
    /// and to the largest file size (EFBIG if the destination offset is
    /// already there); overlapping ranges of one file are EINVAL.
    fn plan_copy(
        &self,
        src: u64,
        src_off: u64,
        dst: u64,
        dst_off: u64,
        len: u64,
    ) -> FsResult<CopyPlan> {
        if self.is_read_only() {
            return Err(FsError::ReadOnly);
        }
        let st = self.state.read();
        let from = st.inode(src)?;
        regular_file(&from)?;
        regular_file(&*st.inode(dst)?)?;
        if dst_off >= MAX_FILE_SIZE {
            return Err(FsError::TooBig);
        }
        let count = len
            .min(from.size.saturating_sub(src_off))
            .min(MAX_COPY)
            .min(MAX_FILE_SIZE - dst_off);
        if src == dst && count > 0 && src_off < dst_off + count && dst_off < src_off + count {
            return Err(FsError::Invalid(
                "copy onto an overlapping range of the same file",
            ));
        }
        Ok(CopyPlan {
            src,
            src_off,
            dst,
            dst_off,
            count,
        })
    }

    /// Copy up to `len` bytes of `src` at `src_off` to `dst` at `dst_off`
    /// (checked and clipped by [`Inner::plan_copy`]); with `drop_setid`
    /// the destination loses its set-ID bits as on a write. Returns the
    /// bytes copied (short of the clipped count only if the source shrank
    /// meanwhile) and whether the destination's mode changed.
    pub fn copy_range(
        &self,
        src: u64,
        src_off: u64,
        dst: u64,
        dst_off: u64,
        len: u64,
        drop_setid: bool,
    ) -> FsResult<(u64, bool)> {
        let CopyPlan {
            src,
            src_off,
            dst,
            dst_off,
            count,
        } = self.plan_copy(src, src_off, dst, dst_off, len)?;
        if count == 0 {
            return Ok((0, false));
        }
        let segments = self
            .state
            .read()
            .inode(src)?
            .extents
            .segments(src_off, src_off + count);
        let mut mode_changed = false;
        let mut copied = 0;
        'segments: for seg in segments {
            let to = dst_off + (seg.file_off - src_off);
            if seg.addr.is_none() || seg.unwritten {
                self.punch_copied_hole(dst, to, to + seg.len)?;
                copied += seg.len;
                continue;
            }
            let mut done = 0;
            while done < seg.len {
                let n = (seg.len - done).min(COPY_CHUNK);
                let (data, _) = self.read_data(src, seg.file_off + done, n as usize, None)?;
                if !data.is_empty() {
                    let (_, changed) = self.write_data(drop_setid, dst, to + done, &data)?;
                    mode_changed |= changed;
                }
                copied += data.len() as u64;
                if (data.len() as u64) < n {
                    break 'segments;
                }
                done += n;
            }
        }
        let end = dst_off + copied;
        self.mutate(|st| {
            let inode = st.inode_mut(dst)?;
            inode.size = inode.size.max(end);
            let now = Time::now();
            inode.mtime = now;
            inode.ctime = now;
            mode_changed |= perm::drop_privileges(inode, drop_setid);
            Ok(())
        })?;
        Ok((copied, mode_changed))
    }

    /// Make `[start, end)` of `dst` read as zeros where a source hole lands:
    /// past its end it already does, and so does a range with no written
    /// block; otherwise the range is punched (its whole blocks freed).
    fn punch_copied_hole(&self, dst: u64, start: u64, end: u64) -> FsResult<()> {
        let end = {
            let st = self.state.read();
            let inode = st.inode(dst)?;
            let end = end.min(inode.size);
            let written = start < end
                && inode
                    .extents
                    .segments(start, end)
                    .iter()
                    .any(|s| s.addr.is_some() && !s.unwritten);
            if !written {
                return Ok(());
            }
            end
        };
        self.fallocate_data(
            dst,
            start,
            end - start,
            FallocateMode {
                keep_size: true,
                punch_hole: true,
            },
        )
    }
}
