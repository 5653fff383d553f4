//! The simulation pool's admission: a fixed number of slots (simulations running at once on
//! rayon's pool) and a bounded wait for one (beyond it, RESOURCE_EXHAUSTED at once, not a
//! queue that grows with the load), both shown in gauges.
//!
//! A call's simulation gets the call's cancellation flag, raised as soon as the call ends
//! for any reason (answered, past its deadline, or dropped because the client went away),
//! so a simulation nobody waits for stops at its next budget check and frees its slot. A
//! slot is released only when its simulation really stops.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use super::error::CallError;
use crate::twin::TwinError;
use crate::twin::limits::CancelFlag;
use prometheus::IntGauge;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Slots for simulations and the bounded wait for one.
#[derive(Debug)]
pub struct SimulationPool {
    slots: Arc<Semaphore>,
    size: usize,
    max_waiting: usize,
    waiting: AtomicUsize,
    running_gauge: IntGauge,
    waiting_gauge: IntGauge,
}

impl SimulationPool {
    /// `size` slots (at least 1), at most `max_waiting` calls waiting for one; the gauges
    /// count running simulations and waiting calls.
    pub fn new(
        size: usize,
        max_waiting: usize,
        running_gauge: IntGauge,
        waiting_gauge: IntGauge,
    ) -> Self {
        Self {
            slots: Arc::new(Semaphore::new(size.max(1))),
            size: size.max(1),
            max_waiting,
            waiting: AtomicUsize::new(0),
            running_gauge,
            waiting_gauge,
        }
    }

    /// Runs `work` on rayon's pool in a slot, within `deadline`. A panic is INTERNAL; a full
    /// queue is `Busy`.
    pub async fn run<T, F>(&self, deadline: Instant, work: F) -> Result<T, CallError>
    where
        T: Send + 'static,
        F: FnOnce(CancelFlag) -> Result<T, TwinError> + Send + 'static,
    {
        let deadline = tokio::time::Instant::from_std(deadline);
        let permit = self.slot(deadline).await?;
        let running = RunningGauge::start(&self.running_gauge);
        let cancel = CancelFlag::new();
        let _cancel_on_drop = CancelOnDrop(cancel.clone());
        let (done, task) = tokio::sync::oneshot::channel();
        // On the simulation pool itself (rayon's), so the forks a question fans out start on
        // this thread without another hand-off.
        rayon::spawn(move || {
            // The permit is released only when the simulation really stops.
            let _permit = permit;
            let _running = running;
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| work(cancel)));
            let _ = done.send(result);
        });
        match tokio::time::timeout_at(deadline, task).await {
            Err(_) => Err(CallError::Deadline("while simulating".to_owned())),
            Ok(Err(_) | Ok(Err(_))) => Err(CallError::Internal("the simulation task failed")),
            Ok(Ok(Ok(result))) => result.map_err(CallError::Twin),
        }
    }

    /// A slot: at once if one is free, else after waiting within `deadline` if fewer than
    /// `max_waiting` calls wait already, else RESOURCE_EXHAUSTED.
    async fn slot(
        &self,
        deadline: tokio::time::Instant,
    ) -> Result<OwnedSemaphorePermit, CallError> {
        if let Ok(permit) = Arc::clone(&self.slots).try_acquire_owned() {
            return Ok(permit);
        }
        // Counted until this future ends or is dropped (a call cut while it waits).
        let _waiting = WaitingGuard::enter(&self.waiting, &self.waiting_gauge);
        if self.waiting.load(Ordering::SeqCst) > self.max_waiting {
            return Err(CallError::Busy {
                slots: self.size,
                waiting: self.max_waiting,
            });
        }
        tokio::time::timeout_at(deadline, Arc::clone(&self.slots).acquire_owned())
            .await
            .map_err(|_| CallError::Deadline("while waiting for a simulation slot".to_owned()))?
            .map_err(|_| CallError::Internal("the simulation pool is closed"))
    }
}

/// Counts one running simulation in a gauge until dropped.
struct RunningGauge(prometheus::IntGauge);

impl RunningGauge {
    fn start(gauge: &prometheus::IntGauge) -> Self {
        gauge.inc();
        Self(gauge.clone())
    }
}

impl Drop for RunningGauge {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// Counts one call waiting for a simulation slot (in the queue bound and the gauge) until
/// dropped, so a call cut while it waits leaves neither count behind.
struct WaitingGuard<'a> {
    waiting: &'a AtomicUsize,
    gauge: &'a prometheus::IntGauge,
}

impl<'a> WaitingGuard<'a> {
    fn enter(waiting: &'a AtomicUsize, gauge: &'a prometheus::IntGauge) -> Self {
        waiting.fetch_add(1, Ordering::SeqCst);
        gauge.inc();
        Self { waiting, gauge }
    }
}

impl Drop for WaitingGuard<'_> {
    fn drop(&mut self) {
        self.waiting.fetch_sub(1, Ordering::SeqCst);
        self.gauge.dec();
    }
}

/// Raises a call's cancellation flag when the call's future ends or is dropped.
struct CancelOnDrop(CancelFlag);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.cancel();
    }
}
