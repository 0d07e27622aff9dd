//! The copy loop of recovery and replace, pipelined: while this thread
//! reconstructs one step, the survivors' reads of the next steps and the
//! write of the previous one are under way on the member workers, and a
//! helper thread checkpoints progress, so the disks never wait on the CPU,
//! on each other or on a checkpoint's flush.
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

use super::background::SyncAction;
use super::pace::{Pacer, CHECKPOINT_EVERY};
use super::personality::RebuildFrom;
use super::worker::{Batch, Op};
use super::{Array, ArrayError, ArrayResult, Region};
use parking_lot::MutexGuard;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Read buffers in flight at once, all members together: steps are as large
/// as this allows (larger requests keep the disks streaming), within
/// `MIN_STEP..=MAX_STEP` member bytes.
const READ_BUFFER_BUDGET: u64 = 96 << 20;
const MIN_STEP: u64 = 1 << 20;
const MAX_STEP: u64 = 8 << 20;
/// Steps whose survivor reads are queued while another is reconstructed.
const READ_DEPTH: usize = 2;
/// Steps whose write is under way while the next is reconstructed.
const WRITE_DEPTH: usize = 1;

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
    Copies,
}

/// A step whose reads are queued.
struct Reading {
    step: Step,
    source: Source,
    /// Lock-table slots this step holds.
    locks: Vec<usize>,
}

/// A step whose rebuilt rows are being written.
struct Writing {
    step: Step,
    /// The queued write (None: nothing to wait for, already written).
    write: Option<Batch>,
    /// The rows being written, reused once the write is done.
    out: Option<Arc<[u8]>>,
    locks: Vec<usize>,
    /// Passed over (a resync or re-add visits only dirty regions): not
    /// counted as progress.
    skipped: bool,
}

/// Lock-table slots the pipeline holds, with how many in-flight steps need
/// each (neighbouring steps can hash to the same slot).
#[derive(Default)]
struct HeldLocks<'a> {
    held: HashMap<usize, (MutexGuard<'a, ()>, usize)>,
}

impl<'a> HeldLocks<'a> {
    /// Take `slots` for one more step: wait for them when nothing is held,
    /// otherwise only try. False (and nothing taken) when one is busy; the
    /// host's error when a write it refused holds one
    /// ([`Array::lock_slot`]).
    fn take(&mut self, array: &'a Array, slots: &[usize]) -> ArrayResult<bool> {
        let may_wait = self.held.is_empty();
        let mut taken = Vec::new();
        for &s in slots {
            if self.held.contains_key(&s) {
                continue;
            }
            let guard = if may_wait {
                Some(array.lock_slot(s)?)
            } else {
                array.locks.try_lock_slot(s)
            };
            match guard {
                Some(g) => taken.push((s, g)),
                None => return Ok(false),
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
        Ok(true)
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
    /// Member bytes done, as progress shows them.
    done: &'a AtomicU64,
    action: SyncAction,
    slot: usize,
    to_replacement: bool,
    locks: HeldLocks<'a>,
    buffers: Buffers,
    reading: VecDeque<Reading>,
    writing: VecDeque<Writing>,
    /// A helper thread checkpoints progress (else this thread does it).
    background_checkpoints: bool,
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
        std::thread::scope(|scope| {
            // The checkpointer's flush (of everything written so far) runs
            // beside the pipeline instead of stalling it. It stops when
            // `quit` is dropped, at the end of this scope's body.
            let (quit, quit_rx) = crossbeam_channel::bounded::<()>(0);
            let checkpointer = std::thread::Builder::new()
                .name(format!("raidfs-{action}-ckpt"))
                .spawn_scoped(scope, move || {
                    while quit_rx.recv_timeout(CHECKPOINT_EVERY)
                        == Err(crossbeam_channel::RecvTimeoutError::Timeout)
                    {
                        let _ = self.write_superblocks();
                    }
                });
            if let Err(e) = &checkpointer {
                log::warn!("{action}: checkpoints on the rebuild thread ({e})");
            }
            let mut rebuild = Rebuild {
                array: self,
                done,
                action,
                slot,
                to_replacement: action == SyncAction::Replace,
                locks: HeldLocks::default(),
                buffers: Buffers::default(),
                reading: VecDeque::with_capacity(READ_DEPTH + 1),
                writing: VecDeque::with_capacity(WRITE_DEPTH + 1),
                background_checkpoints: checkpointer.is_ok(),
            };
            let outcome = rebuild.run(pacer);
            drop(quit);
            outcome
        })
    }

    /// Every step of the walk, in member-offset order, from the checkpoint
    /// of a resumed recovery.
    fn rebuild_steps(&self, action: SyncAction, slot: usize) -> impl Iterator<Item = Step> + '_ {
        let group_size = self.sb.lock().group_size;
        let resume_at = (action == SyncAction::Recovery).then(|| self.slots[slot].valid_below());
        let sources = (self.slots.len() as u64).saturating_sub(1).max(1);
        let fits = READ_BUFFER_BUDGET / ((READ_DEPTH as u64 + 1) * sources);
        let step_bytes = (1u64 << fits.max(1).ilog2()).clamp(MIN_STEP, MAX_STEP);
        // Groups whose geometry does not reach the slot (an old geometry
        // of fewer members during a reshape) hold nothing of it.
        let regions = self
            .regions_by_offset()
            .into_iter()
            .filter(move |r| slot < r.geometry.members);
        regions.flat_map(move |region| {
            let geometry = region.geometry;
            let rows = group_size / geometry.chunk;
            let step_rows = (step_bytes / geometry.chunk).max(1);
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
}

impl Rebuild<'_> {
    fn run(&mut self, pacer: &mut Pacer) -> ArrayResult<bool> {
        let array = self.array;
        let stopped = || {
            let stop = array.sync.stop.load(Ordering::Acquire);
            if stop {
                // Unwritten steps are dropped; `valid_below` is short of them.
                let _ = array.write_superblocks();
            }
            stop
        };
        for step in array.rebuild_steps(self.action, self.slot) {
            if stopped() {
                return Ok(false);
            }
            self.start(step, pacer)?;
        }
        loop {
            if stopped() {
                return Ok(false);
            }
            if !self.move_along()? {
                return Ok(true);
            }
        }
    }

    /// Queue `step`'s reads under its locks, moving older steps along first
    /// when the pipeline is full or their locks are in the way.
    fn start(&mut self, step: Step, pacer: &mut Pacer) -> ArrayResult<()> {
        let array = self.array;
        // Pauses (pacing, checkpoints) happen with nothing in flight, so no
        // foreground request waits on this step's stripes meanwhile.
        if let Some(until) = array.pace_due(pacer) {
            self.drain()?;
            array.nap_until(until);
            if array.sync.stop.load(Ordering::Acquire) {
                return Ok(());
            }
        }
        if !self.background_checkpoints && array.checkpoint_due(pacer) {
            self.drain()?;
            array.checkpoint(pacer);
        }
        if array.skip_step(self.action, (step.at(), step.at() + step.len() as u64)) {
            self.reading.push_back(Reading {
                step,
                source: Source::Skipped,
                locks: Vec::new(),
            });
        } else {
            let keys = step.region.personality.lock_keys(
                &step.region.geometry,
                self.slot,
                step.row,
                step.n,
            );
            let locks = array.locks.slots_of(step.region.group, keys);
            // With nothing in flight `take` waits, so this ends.
            while self.reading.len() >= READ_DEPTH || !self.locks.take(array, &locks)? {
                self.move_along()?;
            }
            pacer.add(step.len() as u64);
            let source = self.read(&step)?;
            self.reading.push_back(Reading {
                step,
                source,
                locks,
            });
        }
        while self.reading.len() > READ_DEPTH {
            self.reconstruct_next()?;
        }
        Ok(())
    }

    /// Advance the oldest step in flight by one stage; false when none is.
    fn move_along(&mut self) -> ArrayResult<bool> {
        if !self.reading.is_empty() {
            self.reconstruct_next()?;
        } else if !self.writing.is_empty() {
            self.retire_next()?;
        } else {
            return Ok(false);
        }
        Ok(true)
    }

    /// Finish every step in flight.
    fn drain(&mut self) -> ArrayResult<()> {
        while self.move_along()? {}
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
        match region.personality.rebuild_from()? {
            RebuildFrom::Survivors => {
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
            RebuildFrom::Copies => Ok(Source::Copies),
        }
    }

    /// Collect the oldest reading step's reads, rebuild its rows and queue
    /// their write, keeping at most `WRITE_DEPTH` writes under way.
    fn reconstruct_next(&mut self) -> ArrayResult<()> {
        let Some(Reading {
            step,
            source,
            locks,
        }) = self.reading.pop_front()
        else {
            return Ok(());
        };
        let skipped = matches!(source, Source::Skipped);
        let written = match source {
            Source::Skipped => Ok((None, None)),
            source => self
                .rebuild_rows(&step, source)
                .and_then(|out| self.write(&step, out)),
        };
        match written {
            Ok((write, out)) => self.writing.push_back(Writing {
                step,
                write,
                out,
                locks,
                skipped,
            }),
            Err(e) => {
                self.locks.release(&locks);
                return Err(e);
            }
        }
        while self.writing.len() > WRITE_DEPTH {
            self.retire_next()?;
        }
        Ok(())
    }

    /// Wait for the oldest write, release its locks and advance the slot's
    /// valid mark and the progress counter.
    fn retire_next(&mut self) -> ArrayResult<()> {
        let Some(Writing {
            step,
            write,
            out,
            locks,
            skipped,
        }) = self.writing.pop_front()
        else {
            return Ok(());
        };
        let outcome = match write {
            Some(batch) => self
                .array
                .pool
                .wait(batch)
                .pop()
                .unwrap_or_else(|| Err(std::io::Error::other("no result from member worker")))
                .map(drop),
            None => Ok(()),
        };
        self.locks.release(&locks);
        if let Some(out) = out {
            self.buffers.outputs.push(out);
        }
        outcome.map_err(|e| self.write_failed(e))?;
        if self.action == SyncAction::Recovery {
            self.array.advance_recovery(self.slot, step.valid_after);
        }
        if !skipped {
            self.done.fetch_add(step.len() as u64, Ordering::Relaxed);
        }
        Ok(())
    }

    /// The rows `step` must put on the slot, from its reads.
    fn rebuild_rows(&mut self, step: &Step, source: Source) -> ArrayResult<Arc<[u8]>> {
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
                    if let Some(host) = array.read_failed(self.slot, &e, "read during replace") {
                        return Err(host);
                    }
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
                let mut host = None;
                for (&m, outcome) in slots.iter().zip(outcomes) {
                    match outcome {
                        Ok(buf) => data[m] = Some(buf),
                        Err(e) => {
                            failed.get_or_insert(m);
                            host = host.or(array.read_failed(m, &e, "read during recovery"));
                        }
                    }
                }
                if let Some(e) = host {
                    return Err(e);
                }
                if let Some(m) = failed {
                    return Err(ArrayError::Failed(format!(
                        "slot {m} failed during recovery"
                    )));
                }
                let rebuilt = array.rebuild_parity_rows(
                    &step.region,
                    self.slot,
                    step.row,
                    step.n,
                    &mut data,
                    content,
                    &mut self.buffers.scratch,
                );
                self.buffers.reads.extend(data.into_iter().flatten());
                rebuilt?;
            }
            Source::Copies => {
                array.rebuild_mirror_rows(&step.region, self.slot, step.row, step.n, content)?
            }
        }
        Ok(out)
    }

    /// Start writing `out` (the step's rows) onto the slot; a replace's
    /// write to the new member is done at once. Returns the write to wait
    /// for, and the buffer to reuse once it is done.
    #[allow(clippy::type_complexity)]
    fn write(
        &self,
        step: &Step,
        out: Arc<[u8]>,
    ) -> ArrayResult<(Option<Batch>, Option<Arc<[u8]>>)> {
        let array = self.array;
        let op = Op::Write {
            offset: step.at(),
            data: Arc::clone(&out),
            range: 0..step.len(),
        };
        if self.to_replacement {
            array
                .pool
                .run_on_replacement(self.slot, op)
                .map_err(|e| self.write_failed(e))?;
            return Ok((None, Some(out)));
        }
        Ok((Some(array.pool.submit(vec![(self.slot, op)])), Some(out)))
    }

    /// A write of rebuilt rows failed: a recovering member is failed, a
    /// replace is abandoned.
    fn write_failed(&self, e: std::io::Error) -> ArrayError {
        if self.to_replacement {
            return ArrayError::Refused(format!("writing to the replacement failed: {e}"));
        }
        if let Some(host) = self
            .array
            .write_failed(self.slot, &e, "write during recovery", None)
        {
            return host;
        }
        ArrayError::Failed(format!("slot {} failed during recovery", self.slot))
    }
}
