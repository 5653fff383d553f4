//! The scheduler's wait queue, ordered by the scheduling policy.
//!
//! `fcfs` is a deque: arrivals join the back, preempted requests return to the front, as in
//! vLLM. `priority` and `sjf` keep the queue sorted by their key (priority or prompt length,
//! then arrival, then id); a preempted request re-enters at its key's place. Holds slot
//! indices only; knows nothing of KV or time.

use std::collections::{BTreeMap, VecDeque};

use crate::sim::config::SchedulingPolicy;

/// Sort key of an ordered queue: (primary, arrival_us, request id, submission serial). The
/// serial makes keys unique even if a caller reuses a request id.
pub type QueueKey = (i64, u64, u64, u64);

/// Requests waiting to be admitted.
#[derive(Clone, Debug)]
pub enum WaitQueue {
    /// First come, first served.
    Fifo(VecDeque<u32>),
    /// Sorted by key.
    Ordered(BTreeMap<QueueKey, u32>),
}

impl WaitQueue {
    /// An empty queue for `policy`.
    pub fn new(policy: SchedulingPolicy) -> Self {
        match policy {
            SchedulingPolicy::Fcfs => WaitQueue::Fifo(VecDeque::new()),
            SchedulingPolicy::Priority | SchedulingPolicy::Sjf => {
                WaitQueue::Ordered(BTreeMap::new())
            }
        }
    }

    /// Number of waiting requests.
    pub fn len(&self) -> usize {
        match self {
            WaitQueue::Fifo(queue) => queue.len(),
            WaitQueue::Ordered(map) => map.len(),
        }
    }

    /// True if nothing waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Adds a new arrival.
    pub fn push_arrival(&mut self, key: QueueKey, slot: u32) {
        match self {
            WaitQueue::Fifo(queue) => queue.push_back(slot),
            WaitQueue::Ordered(map) => {
                let previous = map.insert(key, slot);
                debug_assert!(previous.is_none(), "duplicate wait-queue key {key:?}");
            }
        }
    }

    /// Returns a preempted request (front of a fifo queue, its key's place otherwise).
    pub fn push_preempted(&mut self, key: QueueKey, slot: u32) {
        match self {
            WaitQueue::Fifo(queue) => queue.push_front(slot),
            WaitQueue::Ordered(map) => {
                let previous = map.insert(key, slot);
                debug_assert!(previous.is_none(), "duplicate wait-queue key {key:?}");
            }
        }
    }

    /// The request that would be admitted next.
    pub fn peek(&self) -> Option<u32> {
        match self {
            WaitQueue::Fifo(queue) => queue.front().copied(),
            WaitQueue::Ordered(map) => map.first_key_value().map(|(_, &slot)| slot),
        }
    }

    /// Removes the request `peek` returned.
    pub fn pop(&mut self) -> Option<u32> {
        match self {
            WaitQueue::Fifo(queue) => queue.pop_front(),
            WaitQueue::Ordered(map) => map.pop_first().map(|(_, slot)| slot),
        }
    }

    /// Removes a specific request (timeouts); `key` is its key. O(n) for fifo.
    pub fn remove(&mut self, key: QueueKey, slot: u32) -> bool {
        match self {
            WaitQueue::Fifo(queue) => match queue.iter().position(|&s| s == slot) {
                Some(index) => {
                    queue.remove(index);
                    true
                }
                None => false,
            },
            WaitQueue::Ordered(map) => map.remove(&key).is_some(),
        }
    }

    /// Slots in admission order.
    pub fn iter(&self) -> Box<dyn Iterator<Item = u32> + '_> {
        match self {
            WaitQueue::Fifo(queue) => Box::new(queue.iter().copied()),
            WaitQueue::Ordered(map) => Box::new(map.values().copied()),
        }
    }
}
