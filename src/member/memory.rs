//! In-memory member device, for tests and crash images.
//!
//! A [`MemoryMember`] is a byte vector behind a lock (resized only by
//! [`MemoryMember::set_len`], as a device made larger would be). It behaves like
//! a device that never loses data: `sync` is a no-op and every completed write
//! is immediately "durable". Accesses past the end fail, as on a real device.

use super::Member;
use parking_lot::RwLock;
use std::io;
use std::sync::Arc;

/// A fixed-size member held in memory.
///
/// Not `Clone` on purpose: [`MemoryMember::duplicate`] makes an independent
/// copy, [`MemoryMember::shared`] another handle on the same bytes; the two are
/// easy to confuse behind a plain `clone()`.
pub struct MemoryMember {
    name: String,
    bytes: Arc<RwLock<Vec<u8>>>,
}

impl MemoryMember {
    /// A zero-filled member of `size` bytes.
    pub fn new(size: u64) -> io::Result<MemoryMember> {
        let size = usize::try_from(size).map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("memory member of {size} bytes does not fit in memory"),
            )
        })?;
        Ok(MemoryMember::from_bytes(vec![0; size]))
    }

    /// A member whose contents are `bytes` (its length is the member's length).
    pub fn from_bytes(bytes: Vec<u8>) -> MemoryMember {
        MemoryMember {
            name: "memory".to_string(),
            bytes: Arc::new(RwLock::new(bytes)),
        }
    }

    /// Give the member a name for messages (builder style).
    pub fn with_name(mut self, name: impl Into<String>) -> MemoryMember {
        self.name = name.into();
        self
    }

    /// Make the member `size` bytes long, as a device made larger (or
    /// smaller) outside the array would be: new bytes read as zeros.
    pub fn set_len(&self, size: u64) -> io::Result<()> {
        let size = usize::try_from(size).map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("memory member of {size} bytes does not fit in memory"),
            )
        })?;
        self.bytes.write().resize(size, 0);
        Ok(())
    }

    /// A copy of the whole contents.
    pub fn snapshot(&self) -> Vec<u8> {
        self.bytes.read().clone()
    }

    /// An independent member with the same name and a copy of the contents.
    pub fn duplicate(&self) -> MemoryMember {
        MemoryMember {
            name: self.name.clone(),
            bytes: Arc::new(RwLock::new(self.snapshot())),
        }
    }

    /// Another handle on the same bytes: writes through either are seen by both.
    pub fn shared(&self) -> MemoryMember {
        MemoryMember {
            name: self.name.clone(),
            bytes: Arc::clone(&self.bytes),
        }
    }

    fn range(&self, len: usize, offset: u64, size: usize) -> io::Result<std::ops::Range<usize>> {
        let start = usize::try_from(offset).ok();
        match start.and_then(|s| s.checked_add(len).map(|e| (s, e))) {
            Some((s, e)) if e <= size => Ok(s..e),
            _ => Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "{}: access of {len} bytes at offset {offset} is beyond the end ({size} bytes)",
                    self.name
                ),
            )),
        }
    }
}

impl Member for MemoryMember {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let bytes = self.bytes.read();
        let range = self.range(buf.len(), offset, bytes.len())?;
        buf.copy_from_slice(&bytes[range]);
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let mut bytes = self.bytes.write();
        let range = self.range(buf.len(), offset, bytes.len())?;
        bytes[range].copy_from_slice(buf);
        Ok(())
    }

    fn sync(&self) -> io::Result<()> {
        Ok(())
    }

    fn len(&self) -> u64 {
        self.bytes.read().len() as u64
    }

    fn name(&self) -> String {
        self.name.clone()
    }

    fn cached_writes(&self) -> bool {
        true
    }

    fn can_discard(&self) -> bool {
        true
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        let mut bytes = self.bytes.write();
        let len = usize::try_from(len)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "discard length too large"))?;
        let range = self.range(len, offset, bytes.len())?;
        bytes[range].fill(0);
        Ok(())
    }

    fn read_cached(&self, buf: &mut [u8], offset: u64) -> io::Result<bool> {
        self.read_at(buf, offset).map(|()| true)
    }
}
