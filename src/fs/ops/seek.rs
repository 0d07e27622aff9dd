//! `lseek(2)` with SEEK_DATA and SEEK_HOLE, answered from the extent map.
//!
//! Data is what written extents map; holes are everything else: unmapped
//! ranges, unwritten extents (reserved by fallocate, reading as zeros, as
//! ext4 and XFS report them when no cached page is dirty), and the end of
//! the file, which is always a hole. An offset at or past the end is ENXIO.
//! Extents are whole blocks, so a hole that ends inside the last block is
//! reported at the file size, never past it.

use super::super::extent::ExtentMap;
use super::super::{FsError, FsResult};

/// Which boundary `lseek` looks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Seek {
    Data,
    Hole,
}

/// The first offset at or after `offset` that starts data (`Seek::Data`)
/// or lies in a hole (`Seek::Hole`), in a file of `size` bytes mapped by
/// `extents`.
pub fn seek(extents: &ExtentMap, size: u64, offset: u64, whence: Seek) -> FsResult<u64> {
    if offset >= size {
        return Err(FsError::PastEnd);
    }
    let is_data = |seg: &super::super::extent::Segment| seg.addr.is_some() && !seg.unwritten;
    let found = extents
        .segments(offset, size)
        .into_iter()
        .find(|seg| is_data(seg) == (whence == Seek::Data))
        .map(|seg| seg.file_off);
    match (whence, found) {
        (_, Some(at)) => Ok(at),
        (Seek::Data, None) => Err(FsError::PastEnd),
        (Seek::Hole, None) => Ok(size),
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::super::super::extent::Extent;
    use super::super::super::inode::BLOCK_SIZE;
    use super::*;

    const B: u64 = BLOCK_SIZE;

    /// Blocks 2..4 written, 6..7 unwritten, the rest unmapped.
    fn sample() -> ExtentMap {
        let mut map = ExtentMap::default();
        map.insert(2 * B, 100 * B, 2 * B);
        map.insert_as(
            6 * B,
            Extent {
                unwritten: true,
                ..Extent::new(200 * B, B)
            },
        );
        map
    }

    #[test]
    fn data_and_holes_of_a_sparse_file() {
        let map = sample();
        let size = 8 * B + 10;
        assert_eq!(seek(&map, size, 0, Seek::Data).unwrap(), 2 * B);
        assert_eq!(seek(&map, size, 0, Seek::Hole).unwrap(), 0);
        assert_eq!(seek(&map, size, 2 * B + 7, Seek::Data).unwrap(), 2 * B + 7);
        assert_eq!(seek(&map, size, 2 * B + 7, Seek::Hole).unwrap(), 4 * B);
        // Unwritten blocks are a hole, and no data follows them.
        assert_eq!(seek(&map, size, 5 * B, Seek::Hole).unwrap(), 5 * B);
        assert!(matches!(
            seek(&map, size, 4 * B, Seek::Data),
            Err(FsError::PastEnd)
        ));
        assert!(matches!(
            seek(&map, size, size, Seek::Hole),
            Err(FsError::PastEnd)
        ));
    }

    #[test]
    fn a_fully_written_file_has_its_hole_at_the_end() {
        let mut map = ExtentMap::default();
        map.insert(0, 10 * B, 2 * B);
        // The size ends inside the last block: the hole is at the size.
        let size = B + 5;
        assert_eq!(seek(&map, size, 3, Seek::Hole).unwrap(), size);
        assert_eq!(seek(&map, size, B + 4, Seek::Data).unwrap(), B + 4);
        assert!(matches!(
            seek(&ExtentMap::default(), 0, 0, Seek::Data),
            Err(FsError::PastEnd)
        ));
    }

    /// A file as a list of blocks: None a hole, Some(true) written,
    /// Some(false) unwritten; and the size's distance into the last block.
    fn layout() -> impl Strategy<Value = (Vec<Option<bool>>, u64)> {
        (
            prop::collection::vec(prop::option::of(any::<bool>()), 1..24),
            0..B,
        )
    }

    proptest! {
        /// Against a byte-by-byte model of which bytes are data.
        #[test]
        fn agrees_with_a_model((blocks, tail) in layout(), probe in 0u64..(26 * B)) {
            let mut map = ExtentMap::default();
            for (i, b) in blocks.iter().enumerate() {
                if let Some(written) = b {
                    let i = i as u64;
                    map.insert_as(i * B, Extent { unwritten: !written, ..Extent::new(1000 * B + i * B, B) });
                }
            }
            let size = (blocks.len() as u64 - 1) * B + tail;
            let data_at = |off: u64| blocks[(off / B) as usize] == Some(true);
            let want_data = (probe..size).find(|o| data_at(*o));
            let want_hole = (probe..size).find(|o| !data_at(*o)).unwrap_or(size);
            match seek(&map, size, probe, Seek::Data) {
                Ok(at) => prop_assert_eq!(Some(at), want_data),
                Err(FsError::PastEnd) => prop_assert!(probe >= size || want_data.is_none()),
                Err(e) => prop_assert!(false, "{e}"),
            }
            match seek(&map, size, probe, Seek::Hole) {
                Ok(at) => { prop_assert!(probe < size); prop_assert_eq!(at, want_hole); }
                Err(FsError::PastEnd) => prop_assert!(probe >= size),
                Err(e) => prop_assert!(false, "{e}"),
            }
        }
    }
}
