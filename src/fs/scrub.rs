//! Scrub: read every block the filesystem uses and check it against its
//! checksum on every copy, healing bad copies from good ones (`repair`), and
//! say which member held each bad copy. Metadata (header copies, the newest
//! checkpoint and, with the metadata tree, every node its root reaches, the
//! journal records) is checked the same way through the
//! verify closures its readers already pass.
//!
//! Parity and mirror consistency of stripes whose data is good is the
//! array's own scrub (`Array::start_check`), run after this one.

use std::collections::BTreeMap;

use parking_lot::Mutex;

use super::core::Inner;
use super::inode::BLOCK_SIZE;
use super::journal::{read_record, read_slot, read_tree_slot};
use super::layout::read_header;
use super::store::{BlockStore, GroupInfo, GroupKind, StoreError, Verify};
use super::tree;
use super::{FsError, FsResult};

/// Bytes checked per store request.
const RUN_BYTES: u64 = 1 << 20;

/// A range where some member held a copy failing its checksum.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BadCopyReport {
    pub member: String,
    /// Logical address and length of the range checked.
    pub addr: u64,
    pub len: u64,
    /// The file and offset (None for metadata).
    pub ino: Option<u64>,
    pub file_off: u64,
}

/// A data block with no copy passing its checksum.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LostBlock {
    pub ino: u64,
    pub file_off: u64,
    pub addr: u64,
}

#[derive(Clone, Debug, Default)]
pub struct ScrubReport {
    pub repair: bool,
    /// Data bytes checked, and blocks that had no checksum to check against.
    pub data_bytes: u64,
    pub unchecked_blocks: u64,
    pub metadata_bytes: u64,
    /// Every bad copy found (rewritten from a good one when `repair`).
    pub bad_copies: Vec<BadCopyReport>,
    /// Data blocks that no copy could serve correctly (read as EIO).
    pub lost: Vec<LostBlock>,
    /// Metadata that no copy could serve correctly.
    pub metadata_problems: Vec<String>,
}

impl ScrubReport {
    /// Nothing bad found.
    pub fn is_clean(&self) -> bool {
        self.bad_copies.is_empty() && self.lost.is_empty() && self.metadata_problems.is_empty()
    }

    /// Bad copies found per member.
    pub fn by_member(&self) -> BTreeMap<String, u64> {
        let mut out = BTreeMap::new();
        for b in &self.bad_copies {
            *out.entry(b.member.clone()).or_insert(0) += 1;
        }
        out
    }
}

/// The store as metadata readers see it during a scrub: each verified read
/// becomes a scrub read, and what it finds is noted.
struct ScrubbingStore<'a> {
    inner: &'a dyn BlockStore,
    repair: bool,
    found: Mutex<Vec<(String, u64, u64)>>,
    bytes: Mutex<u64>,
}

impl BlockStore for ScrubbingStore<'_> {
    fn read(
        &self,
        addr: u64,
        buf: &mut [u8],
        verify: Option<Verify<'_>>,
    ) -> Result<(), StoreError> {
        let Some(v) = verify else {
            return self.inner.read(addr, buf, None);
        };
        *self.bytes.lock() += buf.len() as u64;
        let bad = self.inner.scrub_read(addr, buf, v, self.repair)?;
        let mut found = self.found.lock();
        found.extend(bad.into_iter().map(|m| (m, addr, buf.len() as u64)));
        Ok(())
    }
    fn write(&self, addr: u64, data: &[u8]) -> Result<(), StoreError> {
        self.inner.write(addr, data)
    }
    fn flush(&self) -> Result<(), StoreError> {
        self.inner.flush()
    }
    fn groups(&self) -> Vec<GroupInfo> {
        self.inner.groups()
    }
    fn allocate_group(&self, kind: GroupKind) -> Result<GroupInfo, StoreError> {
        self.inner.allocate_group(kind)
    }
    fn free_groups(&self) -> (u64, u64) {
        self.inner.free_groups()
    }
}

impl Inner {
    pub fn scrub(&self, repair: bool) -> FsResult<ScrubReport> {
        let mut report = ScrubReport {
            repair,
            ..Default::default()
        };
        self.scrub_metadata(repair, &mut report)?;
        // A batch of inode numbers at a time, so neither the list nor the
        // inodes read for it grow with the filesystem.
        let mut start = 0u64;
        loop {
            let inos = self.state.read().meta.inos_from(start, 1024)?;
            let Some(&last) = inos.last() else {
                break;
            };
            for ino in inos {
                self.scrub_file(ino, repair, &mut report)?;
            }
            match last.checked_add(1) {
                Some(next) => start = next,
                None => break,
            }
        }
        Ok(report)
    }

    /// Header copies, the newest checkpoint and every journal record after
    /// it, with commits held off so the log does not move meanwhile.
    fn scrub_metadata(&self, repair: bool, report: &mut ScrubReport) -> FsResult<()> {
        let journal = self.journal.lock();
        let store = ScrubbingStore {
            inner: self.store.as_ref(),
            repair,
            found: Mutex::new(Vec::new()),
            bytes: Mutex::new(0),
        };
        let (header, problems) = read_header(&store, journal.meta_group)?;
        report.metadata_problems.extend(problems);
        let slot = header.slots[journal.newest_slot];
        let checkpoint_seq = if header.metadata_tree() {
            match read_tree_slot(&store, &header.uuid, slot)? {
                Some(cp) => {
                    // Every node of the durable tree: commits are held off,
                    // so none of them is freed meanwhile.
                    if let Err(e) = tree::walk(&store, &header.uuid, cp.root, &mut |_, _| Ok(())) {
                        report.metadata_problems.push(e.to_string());
                    }
                    Some(cp.seq)
                }
                None => None,
            }
        } else {
            read_slot(&store, &header.uuid, slot)?.map(|cp| cp.seq)
        };
        match checkpoint_seq {
            Some(cp_seq) => {
                let (mut tail, mut seq) = (0, cp_seq + 1);
                while tail < journal.tail {
                    match read_record(&store, &header, tail, seq)? {
                        Some(rec) => {
                            tail += rec.len;
                            seq += 1;
                        }
                        None => {
                            report
                                .metadata_problems
                                .push(format!("journal record {seq} has no good copy"));
                            break;
                        }
                    }
                }
            }
            None => report.metadata_problems.push(format!(
                "the newest checkpoint (slot {}) has no good copy",
                journal.newest_slot
            )),
        }
        report.metadata_bytes += *store.bytes.lock();
        for (member, addr, len) in store.found.into_inner() {
            report.bad_copies.push(BadCopyReport {
                member,
                addr,
                len,
                ino: None,
                file_off: 0,
            });
        }
        Ok(())
    }

    /// Every extent of `ino`, a run at a time. The file lock keeps its data
    /// from being rewritten, and the metadata read lock held over each run
    /// keeps its blocks from being freed and reused, so a repair can never
    /// write stale bytes over new ones.
    fn scrub_file(&self, ino: u64, repair: bool, report: &mut ScrubReport) -> FsResult<()> {
        let _file = self.file_lock(ino);
        let extents: Vec<(u64, u64, u64)> = match self.state.read().meta.inode(ino)? {
            // Unwritten extents hold no data to check.
            Some(inode) => inode
                .extents
                .iter()
                .filter(|(_, e)| !e.unwritten)
                .map(|(off, e)| (off, e.addr, e.len))
                .collect(),
            None => return Ok(()),
        };
        for (file_off, addr, len) in extents {
            let mut done = 0;
            while done < len {
                let n = (len - done).min(RUN_BYTES);
                let st = self.state.read();
                let expected = st
                    .meta
                    .csums
                    .get_run(addr + done, (n / BLOCK_SIZE) as usize)?;
                self.scrub_run(ino, file_off + done, addr + done, &expected, repair, report)?;
                drop(st);
                done += n;
            }
        }
        Ok(())
    }

    fn scrub_run(
        &self,
        ino: u64,
        file_off: u64,
        addr: u64,
        expected: &[Option<u32>],
        repair: bool,
        report: &mut ScrubReport,
    ) -> FsResult<()> {
        let len = expected.len() as u64 * BLOCK_SIZE;
        report.data_bytes += len;
        report.unchecked_blocks += expected.iter().filter(|e| e.is_none()).count() as u64;
        let kind = self.csum;
        let mut buf = vec![0u8; len as usize];
        let whole = |b: &[u8]| kind.mismatches(b, expected).is_empty();
        let mut note = |member: String, addr: u64, len: u64, file_off: u64| {
            report.bad_copies.push(BadCopyReport {
                member,
                addr,
                len,
                ino: Some(ino),
                file_off,
            })
        };
        match self.store.scrub_read(addr, &mut buf, &whole, repair) {
            Ok(bad) => {
                for m in bad {
                    note(m, addr, len, file_off);
                }
                return Ok(());
            }
            Err(StoreError::Unrecoverable(_)) => {}
            Err(e) => return Err(FsError::from(e)),
        }
        // No single copy is good throughout: block by block, where bad
        // blocks on different members can each be healed from the others.
        let block = BLOCK_SIZE as usize;
        for (i, want) in expected.iter().enumerate() {
            let Some(want) = *want else { continue };
            let at = addr + (i * block) as u64;
            let off = file_off + (i * block) as u64;
            let one = |b: &[u8]| kind.block(b) == want;
            match self
                .store
                .scrub_read(at, &mut buf[i * block..(i + 1) * block], &one, repair)
            {
                Ok(bad) => {
                    for m in bad {
                        note(m, at, BLOCK_SIZE, off);
                    }
                }
                Err(StoreError::Unrecoverable(_)) => {
                    log::error!(
                        "scrub: inode {ino} offset {off}: block at {at:#x} has no good copy"
                    );
                    report.lost.push(LostBlock {
                        ino,
                        file_off: off,
                        addr: at,
                    });
                }
                Err(e) => return Err(FsError::from(e)),
            }
        }
        Ok(())
    }
}
