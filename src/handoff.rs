//! A queue that hands work between the daemon's threads, whose receivers
//! go to sleep as soon as it is empty.
//!
//! crossbeam's channels (and std's, built on them) spin and then call
//! `sched_yield` up to four times before a waiting receiver sleeps. That
//! pays when the next message is a few hundred nanoseconds away. Here it
//! is tens of microseconds away (a member worker's next job, the last
//! reply of a batch of member writes), and where the array's threads
//! outnumber the CPUs every yield hands the CPU to another of them: under
//! 4 KiB random writes on RAID5 a tenth of the daemon's CPU time went to
//! the member workers' yields (`perf record`, 2 vCPUs; see
//! docs/performance.md).
//!
//! Semantics are those of an unbounded multi-producer, multi-consumer
//! channel: [`Receiver::recv`] returns `None` once every sender is gone and
//! the queue is drained, and [`Sender::send`] gives the item back once
//! every receiver is gone.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};

struct State<T> {
    items: VecDeque<T>,
    senders: usize,
    receivers: usize,
    /// Receivers asleep in `recv`: a send wakes one only if some sleeps.
    sleeping: usize,
}

struct Shared<T> {
    state: Mutex<State<T>>,
    ready: Condvar,
}

impl<T> Shared<T> {
    /// The state; a thread that panicked while holding it left it whole
    /// (every update below is a single step), so poisoning is ignored.
    fn lock(&self) -> MutexGuard<'_, State<T>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The sending side; clone it for more senders.
pub struct Sender<T> {
    shared: Arc<Shared<T>>,
}

/// The receiving side; clone it for more receivers (each item goes to one).
pub struct Receiver<T> {
    shared: Arc<Shared<T>>,
}

/// A new, empty queue.
pub fn channel<T>() -> (Sender<T>, Receiver<T>) {
    let shared = Arc::new(Shared {
        state: Mutex::new(State {
            items: VecDeque::new(),
            senders: 1,
            receivers: 1,
            sleeping: 0,
        }),
        ready: Condvar::new(),
    });
    (
        Sender {
            shared: Arc::clone(&shared),
        },
        Receiver { shared },
    )
}

impl<T> Sender<T> {
    /// Queue `item`; `Err(item)` when no receiver is left to take it.
    pub fn send(&self, item: T) -> Result<(), T> {
        let mut st = self.shared.lock();
        if st.receivers == 0 {
            return Err(item);
        }
        st.items.push_back(item);
        let wake = st.sleeping > 0;
        drop(st);
        if wake {
            self.shared.ready.notify_one();
        }
        Ok(())
    }
}

impl<T> Clone for Sender<T> {
    fn clone(&self) -> Self {
        self.shared.lock().senders += 1;
        Sender {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        let mut st = self.shared.lock();
        st.senders -= 1;
        let last = st.senders == 0;
        drop(st);
        if last {
            // Sleeping receivers learn that nothing more will come.
            self.shared.ready.notify_all();
        }
    }
}

impl<T> Receiver<T> {
    /// The next item, sleeping until one comes; `None` once the queue is
    /// empty and every sender is gone.
    pub fn recv(&self) -> Option<T> {
        let mut st = self.shared.lock();
        loop {
            if let Some(item) = st.items.pop_front() {
                return Some(item);
            }
            if st.senders == 0 {
                return None;
            }
            st.sleeping += 1;
            st = self
                .shared
                .ready
                .wait(st)
                .unwrap_or_else(PoisonError::into_inner);
            st.sleeping -= 1;
        }
    }

    /// Every item until the queue is empty and every sender is gone.
    pub fn iter(&self) -> impl Iterator<Item = T> + '_ {
        std::iter::from_fn(move || self.recv())
    }

    /// The next item if one is queued, without waiting.
    pub fn try_recv(&self) -> Option<T> {
        self.shared.lock().items.pop_front()
    }

    /// The items queued now, without waiting for more.
    pub fn try_iter(&self) -> impl Iterator<Item = T> + '_ {
        std::iter::from_fn(move || self.try_recv())
    }
}

impl<T> Clone for Receiver<T> {
    fn clone(&self) -> Self {
        self.shared.lock().receivers += 1;
        Receiver {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<T> Drop for Receiver<T> {
    fn drop(&mut self) {
        let mut st = self.shared.lock();
        st.receivers -= 1;
        if st.receivers == 0 {
            // Nobody will take them: drop them now, not with the last
            // sender, so what they hold (reply senders) is let go.
            let items = std::mem::take(&mut st.items);
            drop(st);
            drop(items);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Barrier;
    use std::thread;

    #[test]
    fn items_arrive_in_order_and_the_end_is_seen_after_them() {
        let (tx, rx) = channel();
        for i in 0..5 {
            assert!(tx.send(i).is_ok());
        }
        drop(tx);
        assert_eq!(rx.iter().collect::<Vec<_>>(), vec![0, 1, 2, 3, 4]);
        assert_eq!(rx.recv(), None);
    }

    #[test]
    fn try_iter_takes_what_is_queued_and_does_not_wait() {
        let (tx, rx) = channel();
        assert_eq!(rx.try_recv(), None);
        for i in 0..3 {
            assert!(tx.send(i).is_ok());
        }
        assert_eq!(rx.try_iter().collect::<Vec<_>>(), vec![0, 1, 2]);
        // The sender is still there: a blocking receive would wait here.
        assert_eq!(rx.try_recv(), None);
    }

    #[test]
    fn a_send_with_no_receiver_gives_the_item_back() {
        let (tx, rx) = channel();
        drop(rx);
        assert_eq!(tx.send(7), Err(7));
    }

    #[test]
    fn items_left_when_the_last_receiver_goes_are_dropped_then() {
        let (tx, rx) = channel();
        let (reply_tx, reply_rx) = channel::<()>();
        assert!(tx.send(reply_tx).is_ok());
        drop(rx);
        // The queued sender was dropped with the receiver: its receiver
        // sees the end although `tx` lives on.
        assert_eq!(reply_rx.recv(), None);
        drop(tx);
    }

    #[test]
    fn sleeping_receivers_wake_for_items_and_for_the_end() {
        let (tx, rx) = channel::<u64>();
        let start = Arc::new(Barrier::new(5));
        let workers: Vec<_> = (0..4)
            .map(|_| {
                let rx = rx.clone();
                let start = Arc::clone(&start);
                thread::spawn(move || {
                    start.wait();
                    rx.iter().sum::<u64>()
                })
            })
            .collect();
        drop(rx);
        start.wait();
        for i in 1..=10_000u64 {
            assert!(tx.send(i).is_ok());
        }
        drop(tx);
        let total: u64 = workers.into_iter().map(|w| w.join().unwrap()).sum();
        assert_eq!(total, 10_000 * 10_001 / 2);
    }

    #[test]
    fn a_receiver_waiting_on_senders_in_other_threads_gets_every_reply() {
        let (tx, rx) = channel::<usize>();
        let senders: Vec<_> = (0..8)
            .map(|i| {
                let tx = tx.clone();
                thread::spawn(move || assert!(tx.send(i).is_ok()))
            })
            .collect();
        drop(tx);
        let mut got: Vec<usize> = rx.iter().collect();
        got.sort_unstable();
        assert_eq!(got, (0..8).collect::<Vec<_>>());
        for s in senders {
            s.join().unwrap();
        }
    }
}
