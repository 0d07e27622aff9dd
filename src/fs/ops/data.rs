//! File data: read, write, truncate, fallocate. Block allocation and the
//! extent map change under the metadata lock; the data I/O itself runs
//! outside it (only a lock on the blocks written is held), so reads and
//! writes of different files, and writes of disjoint parts of one file,
//! proceed in parallel.
//!
//! Invariant kept by every path: bytes of allocated blocks past the end of
//! file are zero, so extending a file never exposes old data.
//!
//! With data checksums on, every block written gets its checksum in the same
//! batch as the extent that maps it, and overwrites are copy-on-write: the
//! new bytes go to fresh blocks and the old extent is freed with the commit,
//! so a crash leaves either the old blocks with their old checksums or the
//! new ones with theirs, never new bytes under an old checksum. Only when no
//! free space is left does an overwrite go in place (see docs/consistency.md).
//! Reads check every block (see [`super::checked`]).

use super::super::atime::{needs_update, AtimeMode};
use super::super::core::Inner;
use super::super::extent::{Extent, Segment};
use super::super::inode::{Inode, Time, BLOCK_SIZE};
use super::super::layout::round_up;
use super::super::perm;
use super::super::state::State;
use super::super::{FallocateMode, FileKind, FsError, FsResult};
use super::checked::BlockRead;

/// Largest file size (keeps offsets far from overflow).
pub const MAX_FILE_SIZE: u64 = 1 << 50;
const ZERO_CHUNK: u64 = 1 << 20;
/// Unallocated groups a data allocation leaves for metadata while the
/// allocated groups still have fragments free.
const METADATA_RESERVE_GROUPS: u64 = 2;

fn round_down(v: u64) -> u64 {
    v / BLOCK_SIZE * BLOCK_SIZE
}

/// What the file had where a piece of a write goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Before {
    /// Nothing: reads as zeros.
    Hole,
    /// Blocks fallocate reserved at this address: read as zeros, hold no
    /// data a crash could need.
    Reserved(u64),
    /// Data at this address.
    Data(u64),
}

impl Before {
    /// What `seg` has `done` bytes into it.
    fn of(seg: &Segment, done: u64) -> Before {
        match seg.addr {
            None => Before::Hole,
            Some(a) if seg.unwritten => Before::Reserved(a + done),
            Some(a) => Before::Data(a + done),
        }
    }
}

/// One block-aligned piece of a write: where it goes, whether the blocks
/// were allocated for this call, and what the file had there.
#[derive(Clone, Copy, Debug)]
struct Piece {
    file_off: u64,
    len: u64,
    addr: u64,
    fresh: bool,
    before: Before,
}

impl Piece {
    /// Blocks the file already has, written where they lie: data (only
    /// when no free block was left) or blocks fallocate reserved.
    fn in_place(file_off: u64, len: u64, before: Before) -> Option<Piece> {
        let addr = match before {
            Before::Hole => return None,
            Before::Reserved(a) | Before::Data(a) => a,
        };
        Some(Piece {
            file_off,
            len,
            addr,
            fresh: false,
            before,
        })
    }

    /// Overwrites committed data where it lies (no free block was left).
    fn overwrites_in_place(&self) -> bool {
        !self.fresh && matches!(self.before, Before::Data(_))
    }

    /// Where the file's current bytes for this piece are, to merge into
    /// partly written edge blocks (none for a hole or a reservation).
    fn old_bytes(&self) -> Option<u64> {
        match self.before {
            Before::Data(a) => Some(a),
            Before::Hole | Before::Reserved(_) => None,
        }
    }

    /// Fills reserved blocks in place: they turn written when installed.
    fn fills_reservation(&self) -> bool {
        !self.fresh && matches!(self.before, Before::Reserved(_))
    }

    /// Fresh blocks taking the place of mapped ones (data or a
    /// reservation): the old mapping goes, its blocks freed with the commit.
    fn replaces_mapping(&self) -> bool {
        self.fresh && self.before != Before::Hole
    }
}

pub(in crate::fs) fn regular_file(inode: &Inode) -> FsResult<()> {
    match inode.kind {
        FileKind::File => Ok(()),
        FileKind::Dir => Err(FsError::IsDir),
        _ => Err(FsError::Invalid("not a regular file")),
    }
}

/// Which parts of a range a plan covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cover {
    /// Everything: holes are allocated, mapped blocks rewritten.
    Write,
    /// Only holes (fallocate).
    HolesOnly,
    /// Only mapped blocks (zeroing).
    MappedOnly,
}

impl Inner {
    /// Read up to `size` bytes at `offset`, and say whether this access
    /// moves the file's atime under `atime` (decided under the lock the
    /// read takes anyway, so a read that moves nothing costs no more).
    pub fn read_data(
        &self,
        ino: u64,
        offset: u64,
        size: usize,
        atime: Option<(AtimeMode, Time)>,
    ) -> FsResult<(Vec<u8>, bool)> {
        let (reads, end, due) = {
            let st = self.state.read();
            let inode = st.inode(ino)?;
            regular_file(&inode)?;
            let due = atime.is_some_and(|(mode, now)| needs_update(mode, &inode, now));
            if offset >= inode.size || size == 0 {
                return Ok((Vec::new(), due));
            }
            let end = offset.saturating_add(size as u64).min(inode.size);
            let reads: Vec<BlockRead> = inode
                .extents
                .segments(offset, end)
                .into_iter()
                .filter_map(|seg| {
                    // Unwritten blocks read as zeros, like a hole.
                    let addr = seg.addr.filter(|_| !seg.unwritten)?;
                    Some(BlockRead::plan(
                        &st.meta.csums,
                        self.csum.enabled(),
                        seg.file_off,
                        seg.len,
                        addr,
                    ))
                })
                .collect::<FsResult<_>>()?;
            (reads, end, due)
        };
        let mut out = vec![0u8; (end - offset) as usize];
        for r in reads {
            let at = (r.file_off - offset) as usize;
            let dest = &mut out[at..at + r.len as usize];
            if r.lead == 0 && r.block_len == r.len {
                self.read_checked(ino, r.block_addr, dest, &r.expected, false)?;
            } else {
                let mut buf = vec![0u8; r.block_len as usize];
                self.read_checked(ino, r.block_addr, &mut buf, &r.expected, false)?;
                dest.copy_from_slice(&buf[r.lead as usize..(r.lead + r.len) as usize]);
            }
        }
        Ok((out, due))
    }

    /// Map `[start, end)` (block aligned) as `cover` says. Holes get fresh
    /// blocks; with checksums on, mapped blocks get fresh blocks too
    /// (copy-on-write) while space lasts, else they are rewritten in place.
    /// On NoSpace for a hole everything allocated here is given back.
    ///
    /// Blocks freed since the last commit are not reusable until that
    /// commit is durable (a crash must never leave a committed file pointing
    /// at reused blocks); rather than fail while such blocks wait, the plan
    /// commits them (and waits for free stripes out for a discard) and
    /// tries once more, so space freed by `rm` is usable at once.
    fn plan_blocks(&self, ino: u64, start: u64, end: u64, cover: Cover) -> FsResult<Vec<Piece>> {
        match self.plan_blocks_once(ino, start, end, cover) {
            Err(FsError::NoSpace) if self.pending_free_bytes() > 0 => {
                self.commit(false)?;
                self.wait_discards();
                self.plan_blocks_once(ino, start, end, cover)
            }
            other => other,
        }
    }

    fn plan_blocks_once(
        &self,
        ino: u64,
        start: u64,
        end: u64,
        cover: Cover,
    ) -> FsResult<Vec<Piece>> {
        let mut st = self.state.write();
        let inode = st.inode(ino)?;
        regular_file(&inode)?;
        let segments = inode.extents.segments(start, end);
        let mut hint = inode.extents.continuation_hint(start);
        let cow = self.csum.enabled();
        // Mapped blocks move to fresh ones (copy-on-write) or are written
        // where they lie; holes get fresh blocks. Blocks fallocate reserved
        // move too when written: in place, each first write of a random
        // writer would be a partial stripe (read-modify-write on parity
        // levels) wherever the reservation lies, where fresh blocks are
        // packed into whole stripes. With no free space left they are
        // written in place, so the reservation still keeps its promise.
        let wants_fresh = |seg: &Segment| match seg.addr {
            Some(_) if seg.unwritten => cow && cover == Cover::Write,
            Some(_) => cow && cover != Cover::HolesOnly,
            None => cover != Cover::MappedOnly,
        };
        let mut plan = Vec::new();
        let mut i = 0;
        while i < segments.len() {
            let seg = &segments[i];
            if wants_fresh(seg) {
                // The run of segments that all want fresh blocks is
                // allocated as one: a rewrite of a fragmented file then
                // gets space as whole as a first write, not pieces as small
                // as the old extents.
                let run = segments[i..].iter().take_while(|s| wants_fresh(s)).count();
                hint = self.plan_fresh(&mut st, &segments[i..i + run], hint, &mut plan)?;
                i += run;
                continue;
            }
            // Not wanting fresh blocks: mapped blocks are written in place
            // if this cover writes them; a hole is one this cover leaves.
            if let Some(old) = seg.addr {
                hint = Some(old + seg.len);
            }
            let writes = if seg.unwritten {
                cover == Cover::Write
            } else {
                cover != Cover::HolesOnly
            };
            if writes {
                plan.extend(Piece::in_place(seg.file_off, seg.len, Before::of(seg, 0)));
            }
            i += 1;
        }
        Ok(plan)
    }

    /// Plan fresh blocks for `run` (consecutive segments that all want
    /// them), allocating for the whole run at once and splitting what comes
    /// back at the segments' edges. A mapped segment that finds no space is
    /// written in place; a hole that finds none fails the plan (what it
    /// allocated is given back). Returns the hint for what follows.
    fn plan_fresh(
        &self,
        st: &mut State,
        run: &[Segment],
        mut hint: Option<u64>,
        plan: &mut Vec<Piece>,
    ) -> FsResult<Option<u64>> {
        let mut left: u64 = run.iter().map(|s| s.len).sum();
        let (mut seg_at, mut seg_done) = (0, 0);
        while left > 0 {
            let seg = &run[seg_at];
            match self.allocate(st, left, hint) {
                Some(ext) => {
                    let mut ext_done = 0;
                    while ext_done < ext.len {
                        let seg = &run[seg_at];
                        let len = (seg.len - seg_done).min(ext.len - ext_done);
                        plan.push(Piece {
                            file_off: seg.file_off + seg_done,
                            len,
                            addr: ext.addr + ext_done,
                            fresh: true,
                            before: Before::of(seg, seg_done),
                        });
                        ext_done += len;
                        seg_done += len;
                        if seg_done == seg.len {
                            seg_at += 1;
                            seg_done = 0;
                        }
                    }
                    left -= ext.len;
                    hint = Some(ext.addr + ext.len);
                }
                None => {
                    let len = seg.len - seg_done;
                    let before = Before::of(seg, seg_done);
                    let Some(piece) = Piece::in_place(seg.file_off + seg_done, len, before) else {
                        for p in plan.iter().filter(|p| p.fresh) {
                            st.alloc.free(Extent::new(p.addr, p.len));
                        }
                        return Err(FsError::NoSpace);
                    };
                    plan.push(piece);
                    hint = Some(piece.addr + len);
                    left -= len;
                    seg_at += 1;
                    seg_done = 0;
                }
            }
        }
        Ok(hint)
    }

    /// Fresh blocks for up to `len` bytes: placed where they keep the file
    /// contiguous or fill stripes whole, in a fresh group if the allocated
    /// ones have only fragments left, and in the fragments when the groups
    /// left are the metadata's reserve (the metadata grows into fresh
    /// groups; it must not find none while data sits in fragments). The
    /// reserve itself goes to data only when nothing else is free, and
    /// with the metadata tree only while the metadata can spare the group.
    fn allocate(&self, st: &mut State, len: u64, hint: Option<u64>) -> Option<Extent> {
        loop {
            if let Some(ext) = st.alloc.allocate_placed(len, hint) {
                return Some(ext);
            }
            let (free_groups, _) = self.store.free_groups();
            if free_groups <= METADATA_RESERVE_GROUPS || !self.grow(st) {
                break;
            }
        }
        loop {
            if let Some(ext) = st.alloc.allocate(len, hint) {
                return Some(ext);
            }
            if !self.metadata_spares_a_group(st) || !self.grow(st) {
                return None;
            }
        }
    }

    fn give_back(&self, plan: &[Piece]) {
        let mut st = self.state.write();
        for p in plan.iter().filter(|p| p.fresh) {
            st.alloc.free(Extent::new(p.addr, p.len));
        }
    }

    /// Map the fresh pieces in the inode (freeing the blocks they replace),
    /// record every piece's checksums, and let `update` adjust the inode.
    fn install(
        &self,
        ino: u64,
        plan: &[Piece],
        crcs: Vec<Vec<u32>>,
        update: impl FnOnce(&mut Inode),
    ) -> FsResult<()> {
        let mut st = self.state.write();
        if st.inode(ino).is_err() {
            drop(st);
            self.give_back(plan);
            return Err(FsError::Stale);
        }
        // Before anything changes: the checksum chunks the new blocks
        // share with others are read, so recording the sums cannot fail.
        for (p, c) in plan.iter().zip(&crcs) {
            st.meta.csums.ready(p.addr, c.len() as u64)?;
        }
        let mut freed = Vec::new();
        let inode = st.inode_mut(ino)?;
        for p in plan {
            if p.fills_reservation() {
                inode.extents.mark_written(p.file_off, p.file_off + p.len);
            }
            if !p.fresh {
                continue;
            }
            if p.replaces_mapping() {
                freed.extend(inode.extents.remove_range(p.file_off, p.file_off + p.len));
            }
            inode.extents.insert(p.file_off, p.addr, p.len);
        }
        update(inode);
        st.batch.freed.extend(freed);
        for (p, c) in plan.iter().zip(crcs) {
            st.set_csums(p.addr, c)?;
        }
        Ok(())
    }

    /// Write `data` (at file `offset`) into the planned pieces, merging the
    /// old bytes of partly covered edge blocks; returns each piece's block
    /// checksums (empty with checksums off). The caller holds the lock on these blocks.
    ///
    /// Pieces that the write covers whole and that lie end to end both in
    /// the file and in the array go out as one store write: a rewrite of a
    /// file whose old extents are fragmented gets pieces as small as those
    /// extents, contiguous in fresh space, and written one by one they would
    /// reach a parity array as partial stripes (read-modify-write) where
    /// together they cover whole ones.
    fn write_pieces(
        &self,
        ino: u64,
        plan: &[Piece],
        offset: u64,
        data: &[u8],
    ) -> FsResult<Vec<Vec<u32>>> {
        if plan.iter().any(Piece::overwrites_in_place) {
            self.before_overwrite_in_place()?;
        }
        let end = offset + data.len() as u64;
        let mut crcs = Vec::with_capacity(plan.len());
        let sums = |bytes: &[u8]| {
            if self.csum.enabled() {
                self.csum.blocks(bytes)
            } else {
                Vec::new()
            }
        };
        let covered = |p: &Piece| p.file_off >= offset && p.file_off + p.len <= end;
        let mut i = 0;
        while i < plan.len() {
            let p = &plan[i];
            if covered(p) {
                let mut run_end = i + 1;
                while run_end < plan.len() {
                    let (prev, next) = (&plan[run_end - 1], &plan[run_end]);
                    let end_to_end = prev.file_off + prev.len == next.file_off
                        && prev.addr + prev.len == next.addr;
                    if !(end_to_end && covered(next)) {
                        break;
                    }
                    run_end += 1;
                }
                let last = &plan[run_end - 1];
                let at = (p.file_off - offset) as usize;
                let run_len = (last.file_off + last.len - p.file_off) as usize;
                self.store.write(p.addr, &data[at..at + run_len])?;
                for q in &plan[i..run_end] {
                    let at = (q.file_off - offset) as usize;
                    crcs.push(sums(&data[at..at + q.len as usize]));
                }
                i = run_end;
                continue;
            }
            let p_end = p.file_off + p.len;
            let mut buf = vec![0u8; p.len as usize];
            if let Some(src) = p.old_bytes() {
                let block = BLOCK_SIZE as usize;
                if p.file_off < offset {
                    self.read_old_block(ino, src, &mut buf[..block])?;
                }
                if p_end > end {
                    let last = (p.len - BLOCK_SIZE) as usize;
                    self.read_old_block(ino, src + last as u64, &mut buf[last..])?;
                }
            }
            let from = offset.max(p.file_off);
            let to = end.min(p_end);
            buf[(from - p.file_off) as usize..(to - p.file_off) as usize]
                .copy_from_slice(&data[(from - offset) as usize..(to - offset) as usize]);
            self.store.write(p.addr, &buf)?;
            crcs.push(sums(&buf));
            i += 1;
        }
        Ok(crcs)
    }

    /// Read one mapped block of the file, checked (the caller holds its lock).
    fn read_old_block(&self, ino: u64, addr: u64, buf: &mut [u8]) -> FsResult<()> {
        let want = self.state.read().meta.csums.get(addr)?;
        self.read_checked(ino, addr, buf, &[want], true)
    }

    /// Write `data` at `offset`; the file loses its capabilities and, with
    /// `drop_setid`, its set-ID bits (see [`perm::drop_privileges`]).
    /// Returns the bytes written and whether the mode changed.
    pub fn write_data(
        &self,
        drop_setid: bool,
        ino: u64,
        offset: u64,
        data: &[u8],
    ) -> FsResult<(usize, bool)> {
        self.write_data_then(drop_setid, ino, offset, data, &|| {})
    }

    /// As [`Inner::write_data`], calling `placed` once the written range is
    /// locked and its blocks allocated: what a later write must not
    /// overtake (see `fs::deferred`). A write that fails before that never
    /// calls it.
    pub fn write_data_then(
        &self,
        drop_setid: bool,
        ino: u64,
        offset: u64,
        data: &[u8],
        placed: &dyn Fn(),
    ) -> FsResult<(usize, bool)> {
        if self.is_read_only() {
            return Err(FsError::ReadOnly);
        }
        let end = offset
            .checked_add(data.len() as u64)
            .filter(|e| *e <= MAX_FILE_SIZE)
            .ok_or(FsError::TooBig)?;
        if data.is_empty() {
            self.state
                .read()
                .inode(ino)
                .and_then(|i| regular_file(&i))?;
            return Ok((0, false));
        }
        let (first, last) = (round_down(offset), round_up(end, BLOCK_SIZE));
        let _blocks = self.range_lock(ino, first, last);
        let plan = self.plan_blocks(ino, first, last, Cover::Write)?;
        placed();
        let crcs = match self.write_pieces(ino, &plan, offset, data) {
            Ok(c) => c,
            Err(e) => {
                self.give_back(&plan);
                return Err(e);
            }
        };
        let mut mode_changed = false;
        self.install(ino, &plan, crcs, |inode| {
            inode.size = inode.size.max(end);
            let now = Time::now();
            inode.mtime = now;
            inode.ctime = now;
            mode_changed = perm::drop_privileges(inode, drop_setid);
        })?;
        self.commit_if_large()?;
        Ok((data.len(), mode_changed))
    }

    fn commit_if_large(&self) -> FsResult<()> {
        let big = self.state.read().batch.size_hint() > super::super::core::BATCH_LIMIT;
        if big {
            self.commit(false)?;
        }
        Ok(())
    }

    fn write_zeros(&self, addr: u64, len: u64) -> FsResult<()> {
        let chunk = vec![0u8; len.min(ZERO_CHUNK) as usize];
        let mut done = 0;
        while done < len {
            let n = (len - done).min(ZERO_CHUNK);
            self.store.write(addr + done, &chunk[..n as usize])?;
            done += n;
        }
        Ok(())
    }

    /// Zero the mapped parts of `[start, end)` of the file (the caller
    /// holds the file lock); copy-on-write like any other overwrite.
    fn zero_range(&self, ino: u64, start: u64, end: u64) -> FsResult<()> {
        if start >= end {
            return Ok(());
        }
        let plan = self.plan_blocks(
            ino,
            round_down(start),
            round_up(end, BLOCK_SIZE),
            Cover::MappedOnly,
        )?;
        if plan.is_empty() {
            return Ok(());
        }
        let zeros = vec![0u8; (end - start) as usize];
        let crcs = match self.write_pieces(ino, &plan, start, &zeros) {
            Ok(c) => c,
            Err(e) => {
                self.give_back(&plan);
                return Err(e);
            }
        };
        self.install(ino, &plan, crcs, |_| {})
    }

    /// Set the size; the caller holds the file lock and checked permissions.
    pub fn truncate_locked(&self, ino: u64, new_size: u64) -> FsResult<()> {
        if new_size > MAX_FILE_SIZE {
            return Err(FsError::TooBig);
        }
        if self.is_read_only() {
            return Err(FsError::ReadOnly);
        }
        let old_size = {
            let st = self.state.read();
            let inode = st.inode(ino)?;
            regular_file(&inode)?;
            inode.size
        };
        if new_size < old_size {
            self.zero_range(ino, new_size, round_up(new_size, BLOCK_SIZE))?;
        }
        self.mutate(|st| {
            let inode = st.inode_mut(ino)?;
            let freed = if new_size < inode.size {
                inode
                    .extents
                    .remove_range(round_up(new_size, BLOCK_SIZE), u64::MAX)
            } else {
                Vec::new()
            };
            inode.size = new_size;
            let now = Time::now();
            inode.mtime = now;
            inode.ctime = now;
            st.batch.freed.extend(freed);
            Ok(())
        })
    }

    pub fn fallocate_data(
        &self,
        ino: u64,
        offset: u64,
        len: u64,
        mode: FallocateMode,
    ) -> FsResult<()> {
        if self.is_read_only() {
            return Err(FsError::ReadOnly);
        }
        if len == 0 {
            return Err(FsError::Invalid("fallocate of zero length"));
        }
        let end = offset
            .checked_add(len)
            .filter(|e| *e <= MAX_FILE_SIZE)
            .ok_or(FsError::TooBig)?;
        let _file = self.file_lock(ino);
        if mode.punch_hole {
            if !mode.keep_size {
                return Err(FsError::Unsupported("PUNCH_HOLE without KEEP_SIZE"));
            }
            self.state
                .read()
                .inode(ino)
                .and_then(|i| regular_file(&i))?;
            let inner_start = round_up(offset, BLOCK_SIZE);
            let inner_end = round_down(end);
            if inner_start >= inner_end {
                self.zero_range(ino, offset, end)?;
            } else {
                self.zero_range(ino, offset, inner_start)?;
                self.zero_range(ino, inner_end, end)?;
            }
            return self.mutate(|st| {
                let inode = st.inode_mut(ino)?;
                let freed = if inner_start < inner_end {
                    inode.extents.remove_range(inner_start, inner_end)
                } else {
                    Vec::new()
                };
                let now = Time::now();
                inode.mtime = now;
                inode.ctime = now;
                st.batch.freed.extend(freed);
                Ok(())
            });
        }
        let plan = self.plan_blocks(
            ino,
            round_down(offset),
            round_up(end, BLOCK_SIZE),
            Cover::HolesOnly,
        )?;
        let resize = |inode: &mut Inode| {
            let now = Time::now();
            if !mode.keep_size && end > inode.size {
                inode.size = end;
                inode.mtime = now;
            }
            inode.ctime = now;
        };
        if self.unwritten_extents {
            return self.reserve(ino, &plan, resize);
        }
        let zero_crc = self.csum.block(&[0u8; BLOCK_SIZE as usize]);
        let mut crcs = Vec::with_capacity(plan.len());
        for p in &plan {
            if let Err(e) = self.write_zeros(p.addr, p.len) {
                self.give_back(&plan);
                return Err(e);
            }
            let blocks = if self.csum.enabled() {
                p.len / BLOCK_SIZE
            } else {
                0
            };
            crcs.push(vec![zero_crc; blocks as usize]);
        }
        self.install(ino, &plan, crcs, resize)
    }

    /// Map the holes `plan` allocated as unwritten extents: the blocks are
    /// the file's, and read as zeros until written (no zeros are written
    /// and no checksums recorded).
    fn reserve(&self, ino: u64, plan: &[Piece], update: impl FnOnce(&mut Inode)) -> FsResult<()> {
        let mut st = self.state.write();
        if st.inode(ino).is_err() {
            drop(st);
            self.give_back(plan);
            return Err(FsError::Stale);
        }
        let inode = st.inode_mut(ino)?;
        for p in plan.iter().filter(|p| p.fresh) {
            inode.extents.insert_as(
                p.file_off,
                Extent {
                    unwritten: true,
                    ..Extent::new(p.addr, p.len)
                },
            );
        }
        update(inode);
        Ok(())
    }
}
