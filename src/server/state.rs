//! The server's state shared by the gRPC service and the HTTP endpoints (the predictor API,
//! KEDA's scaler, the probes): the mirror store, the metrics, the health reporter, the work
//! bounds and the simulation pool every prediction runs on.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;

use super::error::CallError;
use super::proto::twin_server::SERVICE_NAME;
use super::slots::SimulationPool;
use crate::telemetry::Metrics;
use crate::twin::TwinError;
use crate::twin::limits::{CancelFlag, Limits};
use crate::twin::store::MirrorStore;

/// How the service bounds its work.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceLimits {
    /// Per-call simulation limits (the deadline is set per call).
    pub twin: Limits,
    /// Longest a prediction or forecast may take when the client sets no shorter
    /// grpc-timeout (also per question on a prediction stream).
    pub max_call: Duration,
    /// Simulations running at once (others wait, within their deadline).
    pub max_concurrent_simulations: usize,
    /// Calls waiting for a simulation slot at once; one more is RESOURCE_EXHAUSTED at once
    /// (a bounded queue, not one that grows with the load).
    pub max_queued_simulations: usize,
    /// Questions of one prediction stream being answered at once.
    pub stream_in_flight: usize,
}

/// State shared by the gRPC service and the HTTP endpoints.
#[derive(Debug)]
pub struct ServerState {
    /// The mirror.
    pub store: Arc<MirrorStore>,
    /// The metrics.
    pub metrics: Arc<Metrics>,
    /// The gRPC health statuses.
    pub health: HealthReporter,
    /// Work bounds.
    pub limits: ServiceLimits,
    pool: SimulationPool,
    shutting_down: AtomicBool,
}

impl ServerState {
    /// The server's state over `store`.
    pub fn new(
        store: Arc<MirrorStore>,
        metrics: Arc<Metrics>,
        health: HealthReporter,
        limits: ServiceLimits,
    ) -> Self {
        let pool = SimulationPool::new(
            limits.max_concurrent_simulations,
            limits.max_queued_simulations,
            metrics.simulations_running.clone(),
            metrics.simulations_waiting.clone(),
        );
        Self {
            store,
            metrics,
            health,
            pool,
            limits,
            shutting_down: AtomicBool::new(false),
        }
    }

    /// Ready: a config is synced and the server is not shutting down.
    pub fn is_ready(&self) -> bool {
        !self.shutting_down.load(Ordering::SeqCst) && self.store.latest().is_some()
    }

    /// Reports SERVING (overall and for `ditto.v1.Twin`) if ready.
    pub async fn report_serving(&self) {
        if self.is_ready() {
            self.set_health(ServingStatus::Serving).await;
        }
    }

    /// Reports NOT_SERVING from now on (shutdown has begun).
    pub async fn begin_shutdown(&self) {
        self.shutting_down.store(true, Ordering::SeqCst);
        self.set_health(ServingStatus::NotServing).await;
    }

    /// Sets both health entries.
    pub async fn set_health(&self, status: ServingStatus) {
        self.health.set_service_status("", status).await;
        self.health.set_service_status(SERVICE_NAME, status).await;
    }
}

impl ServerState {
    /// Runs `work` on the simulation pool (see `server::slots`) within `deadline`, counting
    /// event-budget exhaustions.
    pub(crate) async fn simulate<T, F>(&self, deadline: Instant, work: F) -> Result<T, CallError>
    where
        T: Send + 'static,
        F: FnOnce(CancelFlag) -> Result<T, TwinError> + Send + 'static,
    {
        let result = self.pool.run(deadline, work).await;
        if result.as_ref().is_err_and(CallError::is_event_budget) {
            self.metrics.event_budget_exhaustions.inc();
        }
        result
    }
}
