//! llm-d's latency predictor HTTP API, answered by the twin: the prediction server's
//! `POST /predict`, `/predict/bulk`, `/predict/bulk/strict`, `GET /status`, `POST /reload`,
//! `GET /` and the training server's `POST /add_training_data_bulk`, `GET /data/status`,
//! `POST /flush`, `GET /models/list`, `/model/{name}/info`, `/model/download/info`, on the
//! HTTP port beside `/metrics` (`/healthz` and `/readyz` answer the peer's JSON, see
//! `compat`), so the router's `PREDICTION_SERVER_URL` and `TRAINING_SERVER_URL` can both
//! point at ditto.
//!
//! Each entry is a candidate pod described by aggregates. It is matched to a mirrored pod
//! when exactly one fresh mirrored instance of its role reports the same waiting and running
//! counts and a KV usage within [`MATCH_KV_TOLERANCE`] (`twin::matching`); its mirrored
//! per-request state is simulated then. Otherwise the pod's state is built from the
//! aggregates on the first instance of its role in the synced config (`twin::aggregate`).
//! `pod_type` is the pod's role label as the EPP sends it: a prefill pod predicts TTFT (its
//! TPOT neutral, 0), a decode pod the rest (its TTFT the decode side's: the prompt's KV
//! pulled whole, only the last token computed).
//!
//! The path of a call: `handlers` decodes and validates (`schema`, or `grpc` for
//! `AddTrainingSamples`), [`Predictor::simulate`] runs `twin::matching` on the simulation
//! pool, the calibration maps the answer, `handlers` encodes. Either way the state is forked
//! and simulated with the new request; the answer is the mean or the configured quantile
//! over replications, their spread the uncertainty and bounds, all passed through the
//! online calibration learnt from `/add_training_data_bulk` (`calibration`). A bulk call's
//! entries are simulated in parallel on the simulation pool.

pub mod bounded_json;
pub mod calibration;
pub mod calibration_file;
pub mod compat;
pub mod grpc;
pub mod handlers;
pub mod schema;
pub mod training;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};

use crate::sim::latency::online::CalibrationState;
use crate::twin::aggregate::{AggregateOptions, AggregatePrediction, Objective, PodAggregates};
use crate::twin::limits::CancelFlag;
use crate::twin::matching::{PoolTemplates, predict_entries, replications_per_entry};
use crate::twin::snapshot::MirrorSnapshot;
use crate::twin::{Limits, TwinError};

use super::error::CallError;
use super::state::ServerState;
use calibration::{Absorbed, Calibrator};
use schema::TrainingEntry;

pub use crate::twin::matching::{MATCH_KV_TOLERANCE, Source};

/// How the predictor answers.
#[derive(Clone, Debug, PartialEq)]
pub struct PredictorOptions {
    /// Mean or quantile (the peer's `LATENCY_OBJECTIVE_TYPE`, `LATENCY_QUANTILE_ALPHA`).
    pub objective: Objective,
    /// The quantile reported in answers (`LATENCY_QUANTILE_ALPHA`, also in mean mode).
    pub quantile: f64,
    /// Simulations per entry (at most).
    pub replications: u32,
    /// Simulations per call: a bulk call of n entries simulates each
    /// `clamp(forks_per_call / n, 2, replications)` times.
    pub forks_per_call: usize,
    /// Expected output length of the new request, tokens.
    pub output_tokens: u32,
    /// Most entries in one bulk call (more: 413).
    pub max_bulk_entries: usize,
    /// Where the calibration is persisted (and was read from at start).
    pub calibration_file: Option<PathBuf>,
    /// The calibration read at start.
    pub initial_calibration: Option<CalibrationState>,
    /// Seed of every simulation (same inputs, same answer).
    pub seed: u64,
    /// Bounds of request bodies (the server's `--http-max-body-bytes` and
    /// `--http-body-read-timeout-ms`).
    pub body: crate::server::http_conn::BodyLimits,
}

impl Default for PredictorOptions {
    /// The peer's code defaults: quantile 0.9; 8 replications (at most 256 forks per call);
    /// 256-token outputs; 10 000 entries per bulk call (the peer's `max_length`).
    fn default() -> Self {
        Self {
            objective: Objective::Quantile(0.9),
            quantile: 0.9,
            replications: 8,
            forks_per_call: 256,
            output_tokens: 256,
            max_bulk_entries: 10_000,
            calibration_file: None,
            initial_calibration: None,
            seed: 0x01a7_e2c7,
            body: crate::server::http_conn::BodyLimits::DEFAULT,
        }
    }
}

/// Each entry's prediction (uncalibrated) and where its state came from, in entry order.
pub type Simulated = Vec<Result<(AggregatePrediction, Source), TwinError>>;

/// The latency predictor: its options, its online calibration (which gRPC answers and
/// `AddTrainingSamples` reach through it too) and the pool templates of the synced config.
#[derive(Debug)]
pub struct Predictor {
    shared: Arc<ServerState>,
    options: PredictorOptions,
    calibrator: Calibrator,
    started_at_us: u64,
    templates: Mutex<Option<Arc<PoolTemplates>>>,
}

impl Predictor {
    /// The predictor over `shared`, registering its metrics.
    pub fn new(
        shared: Arc<ServerState>,
        mut options: PredictorOptions,
    ) -> Result<Self, prometheus::Error> {
        let calibrator = Calibrator::new(
            options.initial_calibration.take(),
            options.calibration_file.clone(),
            options.quantile,
            &shared.metrics,
        )?;
        compat::register_peer_metrics(
            &shared.metrics,
            handlers::objective_type(options.objective),
            options.quantile,
        )?;
        Ok(Self {
            shared,
            options,
            calibrator,
            started_at_us: super::deadline::wall_now_us(),
            templates: Mutex::new(None),
        })
    }

    /// The options in force.
    pub fn options(&self) -> &PredictorOptions {
        &self.options
    }

    /// The online calibration.
    pub fn calibrator(&self) -> &Calibrator {
        &self.calibrator
    }

    /// The server's shared state (the mirror, metrics, limits).
    pub fn shared(&self) -> &ServerState {
        &self.shared
    }

    /// When the predictor started (wall clock, µs): the peer's `last_model_load`.
    pub fn started_at_us(&self) -> u64 {
        self.started_at_us
    }

    fn templates(&self, snapshot: &MirrorSnapshot) -> Result<Arc<PoolTemplates>, TwinError> {
        let mut slot = self
            .templates
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let templates = PoolTemplates::current(slot.as_ref(), snapshot)?;
        *slot = Some(Arc::clone(&templates));
        Ok(templates)
    }

    /// Simulates every entry (in parallel) on `snapshot`, uncalibrated, with `objective`,
    /// within the call's replication budget (`twin::matching`).
    fn simulate_on(
        &self,
        snapshot: &MirrorSnapshot,
        entries: &[PodAggregates],
        objective: Objective,
        now_us: u64,
        cancel: CancelFlag,
    ) -> Simulated {
        let templates = match self.templates(snapshot) {
            Ok(templates) => templates,
            Err(err) => return entries.iter().map(|_| Err(err.clone())).collect(),
        };
        let options = AggregateOptions {
            replications: replications_per_entry(
                self.options.forks_per_call,
                entries.len(),
                self.options.replications,
            ),
            seed: self.options.seed,
            horizon_us: self.shared.limits.twin.max_horizon_us,
            output_tokens: self.options.output_tokens,
            objective,
        };
        let limits = Limits {
            deadline: Some(std::time::Instant::now() + self.shared.limits.max_call),
            cancel: Some(cancel),
            ..self.shared.limits.twin.clone()
        };
        predict_entries(snapshot, &templates, entries, &options, &limits, now_us)
    }

    /// Simulates `entries` on the latest snapshot on the simulation pool; the snapshot is
    /// returned for naming mirrored sources. UNAVAILABLE ("Models not ready") before a
    /// config is synced.
    pub async fn simulate(
        self: &Arc<Self>,
        entries: Vec<PodAggregates>,
        objective: Objective,
    ) -> Result<(Arc<MirrorSnapshot>, Simulated), CallError> {
        let Some(stored) = self.shared.store.latest() else {
            return Err(CallError::Unavailable("Models not ready".to_owned()));
        };
        let snapshot = Arc::clone(&stored.snapshot);
        let deadline = std::time::Instant::now() + self.shared.limits.max_call;
        let worker = Arc::clone(self);
        let view = Arc::clone(&snapshot);
        let now_us = super::deadline::wall_now_us();
        let results = self
            .shared
            .simulate(deadline, move |cancel| {
                Ok(worker.simulate_on(&view, &entries, objective, now_us, cancel))
            })
            .await?;
        let events: u64 = results
            .iter()
            .filter_map(|r| r.as_ref().ok())
            .map(|(p, _)| p.events)
            .sum();
        self.shared.metrics.simulation_events.inc_by(events);
        Ok((snapshot, results))
    }

    /// Simulates training entries (means) and absorbs their measured latencies
    /// (`training::samples`). Returns what was absorbed; entries the pool cannot simulate
    /// count as rejected.
    pub async fn train(self: &Arc<Self>, entries: &[TrainingEntry]) -> Result<Absorbed, CallError> {
        let e2e = training::ttft_measures_e2e(entries, self.calibrator.ttft_is_e2e());
        let aggregates = entries.iter().map(|e| e.aggregates).collect();
        let (_, results) = self.simulate(aggregates, Objective::Mean).await?;
        let (samples, unsimulated) =
            training::samples(entries, results, e2e, self.options.output_tokens);
        self.calibrator.count_malformed(unsimulated);
        let mut absorbed = self.calibrator.absorb(&samples, e2e);
        absorbed.rejected += unsimulated;
        Ok(absorbed)
    }
}

/// The predictor's calls that are also counted as RPCs (`ditto_rpc_requests_total` with
/// `rpc="http:<route>"`, by `server::observe`): predictions and training.
pub const RPC_ROUTES: [&str; 4] = [
    "/predict",
    "/predict/bulk",
    "/predict/bulk/strict",
    "/add_training_data_bulk",
];

/// `GET /healthz` with the peer's JSON body (a probe: never behind the bearer token).
pub fn healthz() -> axum::response::Response {
    compat::healthz()
}

/// `GET /readyz` with the peer's JSON body (a probe: never behind the bearer token).
pub fn readyz(predictor: &Predictor) -> axum::response::Response {
    compat::readyz(predictor)
}

/// The predictor's routes, their bodies read within the options' [`BodyLimits`]
/// (`server::http_conn::limit_body`: 413 over the size, 408 past the read timeout).
///
/// [`BodyLimits`]: crate::server::http_conn::BodyLimits
pub fn router(predictor: Arc<Predictor>) -> Router {
    let body_limits = predictor.options.body;
    Router::new()
        .route("/", get(compat::root))
        .route("/predict", post(handlers::predict))
        .route("/predict/bulk", post(handlers::predict_bulk))
        .route("/predict/bulk/strict", post(handlers::predict_bulk_strict))
        .route("/status", get(compat::status))
        .route("/reload", post(compat::reload))
        .route(
            "/add_training_data_bulk",
            post(handlers::add_training_data_bulk),
        )
        .route("/data/status", get(compat::data_status))
        .route("/flush", post(compat::flush))
        .route("/models/list", get(compat::models_list))
        .route("/model/download/info", get(compat::download_info))
        .route("/model/{name}/info", get(compat::model_info))
        .route("/model/{name}/download", get(compat::not_downloadable))
        .route("/model/{name}/xgb/json", get(compat::not_downloadable))
        .layer(axum::middleware::from_fn_with_state(
            (body_limits, body_limits.in_flight_budget()),
            crate::server::http_conn::limit_body,
        ))
        .layer(DefaultBodyLimit::disable())
        .with_state(predictor)
}
