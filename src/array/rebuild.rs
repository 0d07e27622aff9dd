//! The copy loop of recovery and replace, pipelined: the reads of the next
//! steps are under way on the member workers while this thread reconstructs
//! and writes the current one, so the disks never wait on the CPU, on the
//! rebuilt member's write, or on each other.
//!
//! A step holds the stripe locks of its rows from the moment its reads are
//! queued until its rows are written, so a foreground write to those stripes
//! lands either wholly before the step (which then reads it) or wholly after
//! (and then reaches the rebuilding slot itself). Steps finish in order, and
//! the slot's `valid_below` only moves past written steps. While it holds
//! some steps' locks the loop only *tries* further locks; it waits for one
//! only once it holds none, so it can never deadlock with a foreground
//! writer that holds one stripe and waits for another.
//!
//! Reconstruction works on the read buffers in place (parity kernels over
//! slices of whole rows), and buffers are reused from step to step.

use super::lifecycle::{Pacer, SyncAction};
use super::worker::{Batch, Op};
use super::{Array, ArrayError, ArrayResult, Region};
use crate::geometry::{Geometry, Level, Role};
use crate::superblock::GroupProfile;
use parking_lot::MutexGuard;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Member bytes handled per step of a rebuild.
const STEP_BYTES: u64 = 8 << 20;
/// Steps in flight at once, the one being written included: two keep a read
/// queued behind the one the disk is serving while the third is written.
const PIPELINE_DEPTH: usize = 3;

/// Rows `[row, row + n)` of one group.
#[derive(Clone, Copy)]
struct Step {
    region: Region,
    row: u64,
    n: u64,
    /// The slot's `valid_below` once this step is written (the group's end
    /// for its last step).
    valid_after: u64,
}

impl Step {
    fn chunk(&self) -> usize {
        self.region.geometry.chunk as usize
    }

    fn len(&self) -> usize {
        self.n as usize * self.chunk()
    }

    /// Member offset of the step's first byte.
    fn at(&self) -> u64 {
        self.region.base + self.row * self.region.geometry.chunk
    }

    /// Region-relative offset of the step's last byte.
    fn last_byte(&self) -> u64 {
        (self.row + self.n) * self.region.geometry.chunk - 1
    }
}

/// Where a step's content comes from.
enum Source {
    /// The write-intent bitmap says the slot already holds it.
    Skipped,
    /// Parity levels: reads of every readable other member, by slot.
    Survivors { slots: Vec<usize>, batch: Batch },
    /// Replace: a read of the old member, still good here.
    OldMember(Batch),
    /// Mirrors: read through the engine when the step is written.
    Mirror,
}

struct InFlight {
    step: Step,
    source: Source,
    /// Lock-table slots this step holds.
    locks: Vec<usize>,
}

/// Lock-table slots the pipeline holds, with how many in-flight steps need
/// each (neighbouring steps can hash to the same slot).
#[derive(Default)]
struct HeldLocks<'a> {
    held: HashMap<usize, (MutexGuard<'a, ()>, usize)>,
}

impl<'a> HeldLocks<'a> {
    /// Take `slots` for one more step: wait for them when nothing is held,
    /// otherwise only try. False (and nothing taken) when one is busy.
    fn take(&mut self, array: &'a Array, slots: &[usize]) -> bool {
        let may_wait = self.held.is_empty();
        let mut taken = Vec::new();
        for &s in slots {
            if self.held.contains_key(&s) {
                continue;
            }
            let guard = if may_wait {
                Some(array.locks.lock_slot(s))
            } else {
                array.locks.try_lock_slot(s)
            };
            match guard {
                Some(g) => taken.push((s, g)),
                None => return false,
            }
        }
        for &s in slots {
            if let Some((_, count)) = self.held.get_mut(&s) {
                *count += 1;
            }
        }
        for (s, g) in taken {
            self.held.insert(s, (g, 1));
        }
        true
    }

    fn release(&mut self, slots: &[usize]) {
        for s in slots {
            if let Some((_, count)) = self.held.get_mut(s) {
                *count -= 1;
                if *count == 0 {
                    self.held.remove(s);
                }
            }
        }
    }
}

/// Buffers reused from step to step.
#[derive(Default)]
struct Buffers {
    reads: Vec<Vec<u8>>,
    /// Rebuilt content, shared with the write job (unique again once it is done).
    outputs: Vec<Arc<[u8]>>,
    /// Stands in for a second missing member in RAID6 recovery.
    scratch: Vec<u8>,
}

impl Buffers {
    fn read_buffer(&mut self, len: usize) -> Vec<u8> {
        let mut buf = self.reads.pop().unwrap_or_default();
        buf.resize(len, 0);
        buf
    }

    fn output(&mut self, len: usize) -> Arc<[u8]> {
        match self.outputs.pop() {
            Some(out) if out.len() >= len => out,
            _ => Arc::from(vec![0u8; len]),
        }
    }
}

/// What the pipeline does with the steps it is given.
struct Rebuild<'a> {
    array: &'a Array,
    action: SyncAction,
    slot: usize,
    to_replacement: bool,
    locks: HeldLocks<'a>,
    buffers: Buffers,
    queue: VecDeque<InFlight>,
}

impl Array {
    /// Recovery or replace of `slot` over every allocated group (from the
    /// checkpoint for a resumed recovery). Ok(true): finished; Ok(false): stopped.
    pub(super) fn run_rebuild(
        &self,
        action: SyncAction,
        slot: usize,
        done: &AtomicU64,
        pacer: &mut Pacer,
    ) -> ArrayResult<bool> {
        let mut rebuild = Rebuild {
            array: self,
            action,
            slot,
            to_replacement: action == SyncAction::Replace,
            locks: HeldLocks::default(),
            buffers: Buffers::default(),
            queue: VecDeque::with_capacity(PIPELINE_DEPTH),
        };
        let stopped = || {
            let stop = self.sync.stop.load(Ordering::Acquire);
            if stop {
                // In-flight steps are dropped unwritten; `valid_below` is
                // already short of them.
                let _ = self.write_superblocks();
            }
            stop
        };
        for step in self.rebuild_steps(action, slot) {
            if stopped() {
                return Ok(false);
            }
            rebuild.start(step, done, pacer)?;
        }
        while let Some(oldest) = rebuild.queue.pop_front() {
            if stopped() {
                return Ok(false);
            }
            rebuild.finish(oldest, done)?;
        }
        Ok(true)
    }

    /// Every step of the walk, in member-offset order, from the checkpoint
    /// of a resumed recovery.
    fn rebuild_steps(&self, action: SyncAction, slot: usize) -> impl Iterator<Item = Step> + '_ {
        let (group_size, data_offset) = {
            let sb = self.sb.lock();
            (sb.group_size, sb.data_offset)
        };
        let resume_at = (action == SyncAction::Recovery)
            .then(|| self.slots[slot].valid_below.load(Ordering::Acquire));
        self.groups().into_iter().flat_map(move |(group, profile)| {
            let geometry = if profile == GroupProfile::Metadata {
                self.meta_geometry
            } else {
                self.data_geometry
            };
            let region = Region {
                group,
                geometry,
                base: data_offset + group as u64 * group_size,
            };
            let rows = group_size / geometry.chunk;
            let step_rows = (STEP_BYTES / geometry.chunk).max(1);
            let first = match resume_at {
                Some(v) if v >= region.base + group_size => rows,
                Some(v) => v.saturating_sub(region.base) / geometry.chunk,
                None => 0,
            };
            (first..rows).step_by(step_rows as usize).map(move |row| {
                let n = step_rows.min(rows - row);
                let valid_after = if row + n == rows {
                    region.base + group_size
                } else {
                    region.base + (row + n) * geometry.chunk
                };
                Step {
                    region,
                    row,
                    n,
                    valid_after,
                }
            })
        })
    }

    /// Stripes (parity levels) or logical chunks (mirrors) held by member
    /// rows `[row, row + n)` of `slot`.
    fn lock_keys(geometry: &Geometry, slot: usize, row: u64, n: u64) -> Vec<u64> {
        match geometry.level {
            Level::Raid1 | Level::Raid10 => (row..row + n)
                .filter_map(|r| match geometry.reverse(slot, r * geometry.chunk) {
                    Role::Data { logical, .. } => Some(logical / geometry.chunk),
                    _ => None,
                })
                .collect(),
            _ => (row..row + n).collect(),
        }
    }
}

impl Rebuild<'_> {
    /// Queue `step`'s reads under its locks, finishing older steps first
    /// when the pipeline is full or their locks are in the way.
    fn start(&mut self, step: Step, done: &AtomicU64, pacer: &mut Pacer) -> ArrayResult<()> {
        let array = self.array;
        // Pauses (pacing, checkpoints) happen with nothing in flight, so no
        // foreground request waits on this step's stripes meanwhile.
        if let Some(until) = array.pace_due(pacer) {
            self.drain(done)?;
            array.nap_until(until);
            if array.sync.stop.load(Ordering::Acquire) {
                return Ok(());
            }
        }
        if array.checkpoint_due(pacer) {
            self.drain(done)?;
            array.checkpoint(pacer);
        }
        if array.skip_step(self.action, (step.at(), step.at() + step.len() as u64)) {
            self.queue.push_back(InFlight {
                step,
                source: Source::Skipped,
                locks: Vec::new(),
            });
        } else {
            let keys = Array::lock_keys(&step.region.geometry, self.slot, step.row, step.n);
            let locks = array.locks.slots_of(step.region.group, keys);
            // With nothing in flight `take` waits, so this ends.
            while self.queue.len() >= PIPELINE_DEPTH || !self.locks.take(array, &locks) {
                if let Some(oldest) = self.queue.pop_front() {
                    self.finish(oldest, done)?;
                }
            }
            pacer.add(step.len() as u64);
            let source = self.read(&step)?;
            self.queue.push_back(InFlight {
                step,
                source,
                locks,
            });
        }
        while self.queue.len() > PIPELINE_DEPTH {
            if let Some(oldest) = self.queue.pop_front() {
                self.finish(oldest, done)?;
            }
        }
        Ok(())
    }

    /// Finish every step in flight.
    fn drain(&mut self, done: &AtomicU64) -> ArrayResult<()> {
        while let Some(oldest) = self.queue.pop_front() {
            self.finish(oldest, done)?;
        }
        Ok(())
    }

    /// Queue the reads `step` is rebuilt from.
    fn read(&mut self, step: &Step) -> ArrayResult<Source> {
        let array = self.array;
        let region = &step.region;
        if self.to_replacement && array.readable(self.slot, region, step.last_byte()) {
            let buf = self.buffers.read_buffer(step.len());
            let op = Op::ReadInto {
                offset: step.at(),
                buf,
            };
            return Ok(Source::OldMember(array.pool.submit(vec![(self.slot, op)])));
        }
        match region.geometry.level {
            Level::Raid5 | Level::Raid6 => {
                let slots: Vec<usize> = (0..array.slots.len())
                    .filter(|&m| m != self.slot && array.readable(m, region, step.last_byte()))
                    .collect();
                let jobs = slots
                    .iter()
                    .map(|&m| {
                        let buf = self.buffers.read_buffer(step.len());
                        (
                            m,
                            Op::ReadInto {
                                offset: step.at(),
                                buf,
                            },
                        )
                    })
                    .collect();
                let batch = array.pool.submit(jobs);
                Ok(Source::Survivors { slots, batch })
            }
            Level::Raid1 | Level::Raid10 => Ok(Source::Mirror),
            Level::Raid0 => Err(ArrayError::Refused(
                "RAID0 has no redundancy to rebuild from".into(),
            )),
        }
    }

    /// Collect `flight`'s reads, rebuild its rows, write them, release its
    /// locks and advance the slot's valid mark.
    fn finish(&mut self, flight: InFlight, done: &AtomicU64) -> ArrayResult<()> {
        let InFlight {
            step,
            source,
            locks,
        } = flight;
        let bytes = step.len() as u64;
        let result = match source {
            Source::Skipped => Ok(()),
            source => self.rebuild_step(&step, source),
        };
        self.locks.release(&locks);
        result?;
        if self.action == SyncAction::Recovery {
            self.array.slots[self.slot]
                .valid_below
                .store(step.valid_after, Ordering::Release);
        }
        done.fetch_add(bytes, Ordering::Relaxed);
        Ok(())
    }

    fn rebuild_step(&mut self, step: &Step, source: Source) -> ArrayResult<()> {
        let array = self.array;
        let len = step.len();
        let mut out = self.buffers.output(len);
        if Arc::get_mut(&mut out).is_none() {
            out = Arc::from(vec![0u8; len]);
        }
        let content = Arc::get_mut(&mut out)
            .ok_or_else(|| ArrayError::Refused("rebuild output buffer is shared".into()))?;
        let content = &mut content[..len];
        match source {
            Source::Skipped => {}
            Source::OldMember(batch) => match array.pool.wait(batch).pop() {
                Some(Ok(buf)) => {
                    content.copy_from_slice(&buf);
                    self.buffers.reads.push(buf);
                }
                Some(Err(e)) => {
                    array.fail_member(self.slot, &format!("read failed during replace: {e}"));
                    return Err(ArrayError::Failed(format!(
                        "slot {} failed during replace",
                        self.slot
                    )));
                }
                None => return Err(ArrayError::Failed("no result from member worker".into())),
            },
            Source::Survivors { slots, batch } => {
                let mut data: Vec<Option<Vec<u8>>> = vec![None; array.slots.len()];
                let outcomes = array.pool.wait(batch);
                let mut failed = None;
                for (&m, outcome) in slots.iter().zip(outcomes) {
                    match outcome {
                        Ok(buf) => data[m] = Some(buf),
                        Err(e) => {
                            failed.get_or_insert(m);
                            array.fail_member(m, &format!("read failed during recovery: {e}"));
                        }
                    }
                }
                if let Some(m) = failed {
                    return Err(ArrayError::Failed(format!(
                        "slot {m} failed during recovery"
                    )));
                }
                let rebuilt = self.reconstruct(step, &mut data, content);
                self.buffers.reads.extend(data.into_iter().flatten());
                rebuilt?;
            }
            Source::Mirror => self.mirror_rows(step, content)?,
        }
        self.write(step, &out, len)?;
        self.buffers.outputs.push(out);
        Ok(())
    }

    /// Parity levels: rebuild the slot's chunk of every row straight from
    /// the survivors' buffers (`data`, by slot) into `out`.
    fn reconstruct(
        &mut self,
        step: &Step,
        data: &mut [Option<Vec<u8>>],
        out: &mut [u8],
    ) -> ArrayResult<()> {
        let array = self.array;
        let geometry = step.region.geometry;
        let chunk = step.chunk();
        if self.buffers.scratch.len() < chunk {
            self.buffers.scratch.resize(chunk, 0);
        }
        for i in 0..step.n as usize {
            let rows = i * chunk..(i + 1) * chunk;
            let stripe = step.row + i as u64;
            let members = array.stripe_slots(&step.region, stripe);
            let target_out = &mut out[rows.clone()];
            let Some(target) = members.iter().position(|&m| m == self.slot) else {
                target_out.fill(0);
                continue;
            };
            let missing: Vec<usize> = (0..members.len())
                .filter(|&p| data[members[p]].is_none())
                .collect();
            if missing.len() > geometry.tolerance() {
                return Err(ArrayError::Failed(format!(
                    "stripe {stripe} cannot be rebuilt: too many members missing"
                )));
            }
            match geometry.level {
                Level::Raid5 => {
                    let others: Vec<&[u8]> = members
                        .iter()
                        .filter(|&&m| m != self.slot)
                        .filter_map(|&m| data[m].as_deref().map(|b| &b[rows.clone()]))
                        .collect();
                    array.parity.xor_gen(&others, target_out);
                }
                Level::Raid6 => {
                    let mut by_slot: Vec<Option<&mut [u8]>> = data
                        .iter_mut()
                        .map(|b| b.as_deref_mut().map(|b| &mut b[rows.clone()]))
                        .collect();
                    let mut target_out = Some(target_out);
                    let mut scratch = Some(&mut self.buffers.scratch[..chunk]);
                    let mut blocks: Vec<&mut [u8]> = Vec::with_capacity(members.len());
                    for (p, &m) in members.iter().enumerate() {
                        let block = if p == target {
                            target_out.take()
                        } else if let Some(b) = by_slot[m].take() {
                            Some(b)
                        } else {
                            scratch.take()
                        };
                        blocks.push(block.ok_or_else(|| {
                            ArrayError::Failed(format!(
                                "stripe {stripe} cannot be rebuilt: too many members missing"
                            ))
                        })?);
                    }
                    array.parity.raid6_recover(&mut blocks, &missing);
                }
                Level::Raid0 | Level::Raid1 | Level::Raid10 => {}
            }
        }
        Ok(())
    }

    /// Mirrors: each row of the slot is a copy of a logical chunk; read it
    /// from another copy through the engine.
    fn mirror_rows(&self, step: &Step, out: &mut [u8]) -> ArrayResult<()> {
        let array = self.array;
        let geometry = step.region.geometry;
        let chunk = step.chunk();
        let capacity = geometry.capacity(array.sb.lock().group_size);
        for i in 0..step.n {
            let rows = &mut out[i as usize * chunk..(i as usize + 1) * chunk];
            match geometry.reverse(self.slot, (step.row + i) * geometry.chunk) {
                Role::Data { logical, .. } if logical < capacity => {
                    array.read_region(&step.region, logical, rows, super::io::Choice::Any)?;
                }
                _ => rows.fill(0),
            }
        }
        Ok(())
    }

    /// Write the rebuilt rows onto the slot (or its replacement).
    fn write(&self, step: &Step, out: &Arc<[u8]>, len: usize) -> ArrayResult<()> {
        let array = self.array;
        let op = Op::Write {
            offset: step.at(),
            data: Arc::clone(out),
            range: 0..len,
        };
        let outcome = if self.to_replacement {
            array.pool.run_on_replacement(self.slot, op)
        } else {
            array
                .pool
                .run(vec![(self.slot, op)])
                .pop()
                .unwrap_or_else(|| Err(std::io::Error::other("no result")))
        };
        match outcome {
            Ok(_) => Ok(()),
            Err(e) if self.to_replacement => Err(ArrayError::Refused(format!(
                "writing to the replacement failed: {e}"
            ))),
            Err(e) => {
                array.fail_member(self.slot, &format!("write failed during recovery: {e}"));
                Err(ArrayError::Failed(format!(
                    "slot {} failed during recovery",
                    self.slot
                )))
            }
        }
    }
}
