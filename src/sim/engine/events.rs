//! The engine's pending events. At most one step end is pending at a time (vLLM runs one
//! step at a time), and almost every event is one, so it is kept beside the heap of the
//! others (arrivals, enqueues, timeouts): scheduling and taking the next step costs a
//! comparison with the heap's top instead of a heap push and pop. The order is the heap's:
//! (time, kind, sequence), the sequence unique per engine.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::EventKind;

/// A pending event.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Event {
    pub(super) time_us: u64,
    pub(super) kind: EventKind,
    pub(super) seq: u64,
    pub(super) slot: u32,
    pub(super) serial: u64,
}

/// Pending events, taken in (time, kind, sequence) order.
#[derive(Clone, Debug, Default)]
pub(super) struct EventQueue {
    /// The pending step end, if any.
    step: Option<Event>,
    /// Every other pending event.
    others: BinaryHeap<Reverse<Event>>,
}

impl EventQueue {
    /// Adds an event. At most one step end may be pending.
    #[inline]
    pub(super) fn push(&mut self, event: Event) {
        if event.kind == EventKind::Step {
            // The engine's `step_pending` flag guards this; a second step would be lost.
            assert!(self.step.is_none(), "two steps pending");
            self.step = Some(event);
        } else {
            self.others.push(Reverse(event));
        }
    }

    /// Removes and returns the first pending event.
    #[inline]
    pub(super) fn pop(&mut self) -> Option<Event> {
        match (self.step, self.others.peek()) {
            (Some(step), Some(Reverse(other))) if *other < step => {
                self.others.pop().map(|Reverse(event)| event)
            }
            (Some(step), _) => {
                self.step = None;
                Some(step)
            }
            (None, _) => self.others.pop().map(|Reverse(event)| event),
        }
    }

    /// The first pending event.
    #[inline]
    pub(super) fn peek(&self) -> Option<&Event> {
        let other = self.others.peek().map(|Reverse(event)| event);
        match (&self.step, other) {
            (Some(step), Some(other)) => Some(step.min(other)),
            (step, other) => step.as_ref().or(other),
        }
    }

    /// Pending events.
    pub(super) fn len(&self) -> usize {
        self.others.len() + usize::from(self.step.is_some())
    }

    /// True if nothing is pending.
    pub(super) fn is_empty(&self) -> bool {
        self.step.is_none() && self.others.is_empty()
    }

    /// When the pending step ends, if one is pending.
    pub(super) fn step_end_us(&self) -> Option<u64> {
        self.step.map(|step| step.time_us)
    }

    /// Bytes of room held for events (memory accounting).
    pub(super) fn memory_bytes(&self) -> usize {
        self.others.capacity() * std::mem::size_of::<Reverse<Event>>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(time_us: u64, kind: EventKind, seq: u64) -> Event {
        Event {
            time_us,
            kind,
            seq,
            slot: 0,
            serial: 0,
        }
    }

    /// The queue gives events in exactly the order one heap of them all gives.
    #[test]
    fn the_order_is_one_heaps() {
        let kinds = [EventKind::Arrival, EventKind::Enqueue, EventKind::Timeout];
        let mut queue = EventQueue::default();
        let mut heap = BinaryHeap::new();
        let mut seq = 0;
        let mut step_pending = false;
        let mut state = 12345u64;
        let mut popped = 0;
        for round in 0..20_000u64 {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let roll = state >> 33;
            if roll.is_multiple_of(3) && !queue.is_empty() {
                let expected = heap.pop().map(|Reverse(event)| event);
                assert_eq!(queue.peek().copied(), expected);
                let got = queue.pop();
                assert_eq!(got, expected);
                if got.is_some_and(|event| event.kind == EventKind::Step) {
                    step_pending = false;
                }
                popped += 1;
            } else {
                // Times collide often, so the kind and sequence tie-breaks are exercised.
                let time_us = round / 4 + (roll >> 8) % 8;
                let kind = if !step_pending && roll.is_multiple_of(5) {
                    step_pending = true;
                    EventKind::Step
                } else {
                    kinds[(roll >> 4) as usize % kinds.len()]
                };
                let event = event(time_us, kind, seq);
                seq += 1;
                queue.push(event);
                heap.push(Reverse(event));
            }
            assert_eq!(queue.len(), heap.len());
            assert_eq!(queue.is_empty(), heap.is_empty());
        }
        assert!(popped > 5_000, "the test popped too little: {popped}");
        while let Some(Reverse(expected)) = heap.pop() {
            assert_eq!(queue.pop(), Some(expected));
        }
        assert_eq!(queue.pop(), None);
    }
}
