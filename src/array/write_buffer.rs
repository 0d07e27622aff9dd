//! Owned buffers for member writes handed to workers: filled part by part
//! and never zeroed first (zeroing 1.25 MiB per 1 MiB request was a tenth
//! of the daemon's time in a sequential RAID5 write), and aligned so that
//! an image file can write them around its page cache (`O_DIRECT` wants
//! the buffer's address aligned; see `member::uncached`).

use crate::member::file::DIRECT_ALIGN;
use std::mem::MaybeUninit;
use std::ops::Range;
use std::sync::Arc;

/// A buffer of a fixed length, filled in order by [`WriteBuffer::append`].
pub(super) struct WriteBuffer {
    bytes: Arc<[MaybeUninit<u8>]>,
    /// Where the aligned payload starts in `bytes`.
    start: usize,
    len: usize,
    filled: usize,
}

impl WriteBuffer {
    pub(super) fn new(len: usize) -> WriteBuffer {
        let bytes: Arc<[MaybeUninit<u8>]> = Arc::new_uninit_slice(len + DIRECT_ALIGN - 1);
        let start = bytes
            .as_ptr()
            .align_offset(DIRECT_ALIGN)
            .min(DIRECT_ALIGN - 1);
        WriteBuffer {
            bytes,
            start,
            len,
            filled: 0,
        }
    }

    /// Copy `part` in after what is there (nothing beyond the length); the
    /// copy, now initialised.
    pub(super) fn append(&mut self, part: &[u8]) -> &mut [u8] {
        let part = &part[..part.len().min(self.len - self.filled)];
        let at = self.start + self.filled;
        self.filled += part.len();
        match Arc::get_mut(&mut self.bytes) {
            Some(bytes) => bytes[at..at + part.len()].write_copy_of_slice(part),
            // Not shared before `finish`: unreachable, and harmless (the
            // buffer then stays unfinished).
            None => &mut [],
        }
    }

    /// The bytes and the range of them that holds the payload, once every
    /// payload byte was written; None otherwise.
    pub(super) fn finish(mut self) -> Option<(Arc<[u8]>, Range<usize>)> {
        if self.filled != self.len {
            return None;
        }
        let (start, end) = (self.start, self.start + self.len);
        let bytes = Arc::get_mut(&mut self.bytes)?;
        // The alignment padding around the payload is never written to a
        // member, but every byte must be initialised to be read as u8.
        bytes[..start].fill(MaybeUninit::new(0));
        bytes[end..].fill(MaybeUninit::new(0));
        // SAFETY: the payload [start, end) was initialised by `append`
        // (filled == len) and the rest just now.
        Some((unsafe { self.bytes.assume_init() }, start..end))
    }

    /// A filled buffer holding a copy of `data`.
    pub(super) fn copy_of(data: &[u8]) -> (Arc<[u8]>, Range<usize>) {
        let mut buffer = WriteBuffer::new(data.len());
        buffer.append(data);
        match buffer.finish() {
            Some(done) => done,
            None => (Arc::from(data), 0..data.len()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payload_is_aligned_and_holds_the_parts_in_order() {
        for len in [0usize, 1, 4095, 4096, 65536 + 17] {
            let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
            let mut b = WriteBuffer::new(len);
            let (head, tail) = data.split_at(len / 3);
            b.append(head);
            b.append(tail);
            let (bytes, range) = b.finish().expect("filled");
            assert_eq!(&bytes[range.clone()], &data[..]);
            if len > 0 {
                assert_eq!(bytes[range].as_ptr() as usize % DIRECT_ALIGN, 0);
            }
        }
    }

    #[test]
    fn an_unfilled_buffer_does_not_finish() {
        let mut b = WriteBuffer::new(10);
        b.append(&[1, 2, 3]);
        assert!(b.finish().is_none());
        let mut over = WriteBuffer::new(2);
        assert_eq!(over.append(&[1, 2, 3]).len(), 2);
        let (bytes, range) = over.finish().expect("filled");
        assert_eq!(&bytes[range], &[1, 2][..]);
    }
}
