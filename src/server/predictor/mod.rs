//! llm-d's latency predictor HTTP API, answered by the twin: the prediction server's
//! `POST /predict`, `/predict/bulk`, `/predict/bulk/strict`, `GET /status`, `POST /reload`,
//! `GET /` and the training server's `POST /add_training_data_bulk`, `GET /data/status`,
//! `POST /flush`, `GET /models/list`, `/model/{name}/info`, `/model/download/info`, on the
//! HTTP port beside `/metrics` (`/healthz` and `/readyz` answer the peer's JSON, see
//! `compat`), so the router's `PREDICTION_SERVER_URL` and `TRAINING_SERVER_URL` can both
//! point at ditto.
//!
//! Each entry is a candidate pod described by aggregates. It is matched to a mirrored pod
//! when exactly one fresh mirrored instance reports the same waiting and running counts and
//! a KV usage within [`MATCH_KV_TOLERANCE`] (see [`matching`]); its mirrored per-request
//! state is simulated then. Otherwise the pod's state is built from the aggregates on the
//! first instance of the synced config (`twin::aggregate`). Either way the state is forked
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
pub mod loadgen;
pub mod matching;
pub mod schema;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};

use crate::cluster::config::ClusterConfig;
use crate::sim::latency::online::CalibrationState;
use crate::twin::aggregate::{
    AggregateOptions, AggregatePrediction, Objective, PodAggregates, PodType, predict_aggregates,
    single_instance_config,
};
use crate::twin::limits::CancelFlag;
use crate::twin::snapshot::{MirrorSnapshot, TwinSettings};
use crate::twin::{Limits, TwinError};

use super::service::Shared;
use calibration::Calibrator;

/// Largest KV usage difference between an entry and a mirrored pod it is matched to.
pub const MATCH_KV_TOLERANCE: f64 = 0.02;

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

/// The pool template entries without a mirrored match are simulated on.
#[derive(Debug)]
struct Template {
    config_generation: u64,
    config: Arc<ClusterConfig>,
    settings: Arc<TwinSettings>,
}

/// The predictor's state, shared by its handlers.
#[derive(Debug)]
pub struct Predictor {
    shared: Arc<Shared>,
    options: PredictorOptions,
    calibrator: Calibrator,
    started_at_us: u64,
    template: Mutex<Option<Arc<Template>>>,
}

/// Where one entry's prediction came from.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Source {
    /// The mirrored state of this instance index.
    Mirrored(usize),
    /// A state built from the aggregates.
    Aggregates,
}

impl Predictor {
    /// The predictor over `shared`, registering its metrics.
    pub fn new(
        shared: Arc<Shared>,
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
            template: Mutex::new(None),
        })
    }

    /// The options in force.
    pub fn options(&self) -> &PredictorOptions {
        &self.options
    }

    /// The calibration.
    pub fn calibrator(&self) -> &Calibrator {
        &self.calibrator
    }

    fn template(&self, snapshot: &MirrorSnapshot) -> Result<Arc<Template>, TwinError> {
        let mut slot = self
            .template
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(template) = slot.as_ref()
            && template.config_generation == snapshot.config_generation
        {
            return Ok(Arc::clone(template));
        }
        let config = single_instance_config(&snapshot.config, 0).ok_or_else(|| {
            TwinError::invalid("config.instances", "the synced config has no instance")
        })?;
        let template = Arc::new(Template {
            config_generation: snapshot.config_generation,
            config: Arc::new(config),
            settings: Arc::clone(&snapshot.settings),
        });
        *slot = Some(Arc::clone(&template));
        Ok(template)
    }

    /// Simulates every entry (in parallel) on `snapshot`, uncalibrated, with `objective`.
    pub fn simulate_entries(
        &self,
        snapshot: &MirrorSnapshot,
        entries: &[PodAggregates],
        objective: Objective,
        now_us: u64,
        cancel: CancelFlag,
    ) -> Vec<Result<(AggregatePrediction, Source), TwinError>> {
        let template = match self.template(snapshot) {
            Ok(template) => template,
            Err(err) => return entries.iter().map(|_| Err(err.clone())).collect(),
        };
        // A call's forks are bounded: big bulk calls get fewer replications per entry (at
        // least 2, for a spread).
        let per_entry = (self.options.forks_per_call / entries.len().max(1)) as u32;
        let options = AggregateOptions {
            replications: per_entry
                .clamp(2, self.options.replications.max(2))
                .min(self.options.replications),
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
        // Identical entries (idle pods often are) are simulated once: answers are
        // deterministic in the entry.
        let mut first_of: HashMap<[u64; 11], usize> = HashMap::with_capacity(entries.len());
        let mut distinct: Vec<PodAggregates> = Vec::with_capacity(entries.len());
        let slots: Vec<usize> = entries
            .iter()
            .map(|entry| {
                *first_of.entry(entry_key(entry)).or_insert_with(|| {
                    distinct.push(*entry);
                    distinct.len() - 1
                })
            })
            .collect();
        let results = crate::twin::parallel::map(&distinct, |aggregates| {
            match matching::mirrored_match(snapshot, aggregates, now_us) {
                Some(index) => matching::predict_mirrored(
                    snapshot, index, aggregates, &options, &limits, now_us,
                )
                .map(|p| (p, Source::Mirrored(index))),
                None => predict_aggregates(
                    &template.config,
                    &template.settings,
                    aggregates,
                    &options,
                    &limits,
                )
                .map(|p| (p, Source::Aggregates)),
            }
        });
        slots
            .into_iter()
            .map(|slot| results[slot].clone())
            .collect()
    }
}

/// Every field of an entry, exactly (floats by their bits).
fn entry_key(entry: &PodAggregates) -> [u64; 11] {
    let pod_type = match entry.pod_type {
        PodType::Monolithic => 0,
        PodType::Prefill => 1,
        PodType::Decode => 2,
    };
    [
        entry.kv_cache_percentage.to_bits(),
        u64::from(entry.input_token_length),
        u64::from(entry.num_request_waiting),
        u64::from(entry.num_request_running),
        u64::from(entry.num_tokens_generated),
        entry.prefix_cache_score.to_bits(),
        pod_type,
        entry.prefill_tokens_in_flight,
        entry.decode_tokens_in_flight,
        entry.encoder_input_size,
        entry.encoder_matched_size,
    ]
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
