//! Per-member I/O workers, so that an operation touching several members
//! drives them all at once instead of one after another.
//!
//! Each member has its own small pool of threads fed by one channel. A batch
//! of jobs (at most one or a few per member) is submitted together and the
//! caller waits for every reply; a batch with a single job runs inline on the
//! caller's thread, since a hand-off would only add latency.

use crate::member::Member;
use crossbeam_channel::{bounded, unbounded, Receiver, Sender};
use std::io;
use std::sync::Arc;
use std::thread::JoinHandle;

/// One member operation. Buffers are owned so a worker never borrows from
/// the caller's stack.
pub enum Op {
    Read { offset: u64, len: usize },
    Write { offset: u64, data: Arc<[u8]>, range: std::ops::Range<usize> },
    Sync,
}

/// What came back from one job.
pub type Outcome = io::Result<Vec<u8>>;

struct Job {
    tag: usize,
    op: Op,
    reply: Sender<(usize, Outcome)>,
}

pub struct WorkerPool {
    members: Vec<Option<Arc<dyn Member>>>,
    queues: Vec<Option<Sender<Job>>>,
    threads: Vec<JoinHandle<()>>,
}

fn perform(member: &dyn Member, op: &Op) -> Outcome {
    match op {
        Op::Read { offset, len } => {
            let mut buf = vec![0u8; *len];
            member.read_at(&mut buf, *offset)?;
            Ok(buf)
        }
        Op::Write { offset, data, range } => {
            member.write_at(&data[range.clone()], *offset)?;
            Ok(Vec::new())
        }
        Op::Sync => {
            member.sync()?;
            Ok(Vec::new())
        }
    }
}

impl WorkerPool {
    /// Start `threads_per_member` workers for every present member.
    pub fn new(members: &[Option<Arc<dyn Member>>], threads_per_member: usize) -> io::Result<WorkerPool> {
        let mut queues = Vec::with_capacity(members.len());
        let mut threads = Vec::new();
        for (slot, member) in members.iter().enumerate() {
            let Some(member) = member else {
                queues.push(None);
                continue;
            };
            let (tx, rx): (Sender<Job>, Receiver<Job>) = unbounded();
            for n in 0..threads_per_member.max(1) {
                let rx = rx.clone();
                let member = Arc::clone(member);
                let handle = std::thread::Builder::new()
                    .name(format!("raidfs-m{slot}-{n}"))
                    .spawn(move || {
                        for job in rx.iter() {
                            let outcome = perform(member.as_ref(), &job.op);
                            // The submitter may have given up; nothing to do then.
                            let _ = job.reply.send((job.tag, outcome));
                        }
                    })?;
                threads.push(handle);
            }
            queues.push(Some(tx));
        }
        Ok(WorkerPool { members: members.to_vec(), queues, threads })
    }

    /// Run `jobs` (member slot, op) and return their outcomes in the same
    /// order. A job for a slot with no member fails with `NotConnected`.
    pub fn run(&self, jobs: Vec<(usize, Op)>) -> Vec<Outcome> {
        if jobs.len() == 1 {
            let (slot, op) = &jobs[0];
            return vec![match self.members.get(*slot).and_then(|m| m.as_ref()) {
                Some(m) => perform(m.as_ref(), op),
                None => Err(missing(*slot)),
            }];
        }
        let mut results: Vec<Option<Outcome>> = (0..jobs.len()).map(|_| None).collect();
        let (reply_tx, reply_rx) = bounded(jobs.len());
        let mut pending = 0;
        for (tag, (slot, op)) in jobs.into_iter().enumerate() {
            match self.queues.get(slot).and_then(|q| q.as_ref()) {
                Some(q) => match q.send(Job { tag, op, reply: reply_tx.clone() }) {
                    Ok(()) => pending += 1,
                    Err(_) => results[tag] = Some(Err(missing(slot))),
                },
                None => results[tag] = Some(Err(missing(slot))),
            }
        }
        drop(reply_tx);
        for _ in 0..pending {
            match reply_rx.recv() {
                Ok((tag, outcome)) => results[tag] = Some(outcome),
                Err(_) => break,
            }
        }
        results
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(io::Error::other("member worker stopped"))))
            .collect()
    }
}

fn missing(slot: usize) -> io::Error {
    io::Error::new(io::ErrorKind::NotConnected, format!("member slot {slot} is not present"))
}

impl Drop for WorkerPool {
    fn drop(&mut self) {
        self.queues.clear();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}
