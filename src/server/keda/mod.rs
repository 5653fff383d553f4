//! KEDA's external scaler (`externalscaler.ExternalScaler`) on the gRPC port: a ScaledObject
//! trigger of `type: external` (or `external-push`) pointed at ditto gets, for the pool its
//! metadata names, the replicas ditto's capacity forecast needs over a horizon at least as
//! long as a pod's warm-up, under the load forecast from what the mirror observed
//! (`load`, `workload::load_forecast`). docs/autoscaling.md has the metadata and the HPA math.
//!
//! - GetMetricSpec: one metric, `ditto-desired-replicas-<pool>` with target 1 (KEDA's
//!   default AverageValue: the HPA's desired count is the value itself), or with
//!   `metric: arrivalRate` the peak forecast rate with target `arrivalRatePerReplica`; with
//!   `role` the name ends in `-<role>`.
//! - GetMetrics: the value now, from the forecast cache (`cache`); with `role: prefill` or
//!   `decode` on a P/D pool, that role's count of the pair's split forecast (`roles`), the
//!   two roles sharing one forecast per refresh.
//! - IsActive: load observed, load forecast within the horizon, or requests in flight.
//! - StreamIsActive: IsActive's answer at once, then each change, checked at every load
//!   sample; at most [`MAX_STREAMS`] open; a stream ends when its client goes or the
//!   server drains.
//!
//! Reads only: the auth gate in front treats every method as a read (`--auth-reads`).

pub mod cache;
pub mod load;
pub mod metadata;
pub mod roles;

use std::sync::Arc;
use std::time::Instant;

use prometheus::{IntCounterVec, IntGauge, Opts};
use tokio::sync::{Semaphore, watch};
use tonic::{Request, Response, Status};

use self::cache::{Computed, ForecastCache, Inputs};
use self::load::{LoadTracker, PoolLoad};
use self::metadata::{MetricKind, ScalerQuery};
use self::roles::Target;
use super::deadline::wall_now_us;
use super::error::CallError;
use super::service::ServerState;
use crate::twin::TwinError;
use crate::twin::desired::{DesiredSettings, desired, question_for};
use crate::twin::forecast::forecast_capacity;
use crate::workload::Stage;

/// Messages and the service of KEDA's `externalscaler` package, generated at build time
/// from `proto/externalscaler/externalscaler.proto`.
#[allow(missing_docs, clippy::all, clippy::unwrap_used)]
pub mod proto {
    include!(concat!(env!("OUT_DIR"), "/externalscaler.rs"));
}

use proto::external_scaler_server::ExternalScaler;
use proto::{
    GetMetricSpecResponse, GetMetricsRequest, GetMetricsResponse, IsActiveResponse, MetricSpec,
    MetricValue, ScaledObjectRef,
};

/// Most StreamIsActive streams open at once (beyond: RESOURCE_EXHAUSTED).
pub const MAX_STREAMS: usize = 64;
/// A forecast rate below this (requests per second) counts as no load.
pub const ACTIVE_RATE: f64 = 0.01;
/// Stages the horizon is cut into for the capacity question.
const STAGES: usize = 4;

/// The scaler's state: the load sampler, the forecast cache, the stream bound.
#[derive(Debug)]
pub struct KedaScaler {
    shared: Arc<ServerState>,
    load: Arc<LoadTracker>,
    cache: ForecastCache,
    streams: Arc<Semaphore>,
    draining: watch::Receiver<bool>,
    forecasts: IntCounterVec,
    streams_open: IntGauge,
}

/// The service handle tonic serves (cheap to clone).
#[derive(Clone, Debug)]
pub struct KedaService(Arc<KedaScaler>);

impl KedaService {
    /// The scaler over `shared`, reading loads from `load`; streams end when `draining`.
    pub fn new(
        shared: Arc<ServerState>,
        load: Arc<LoadTracker>,
        draining: watch::Receiver<bool>,
    ) -> Result<Self, prometheus::Error> {
        let forecasts = IntCounterVec::new(
            Opts::new(
                "ditto_keda_forecasts_total",
                "KEDA scaler forecasts by outcome: computed, cached (an answer reused), error.",
            ),
            &["outcome"],
        )?;
        shared.metrics.register(Box::new(forecasts.clone()))?;
        let streams_open = IntGauge::new(
            "ditto_keda_streams_open",
            "StreamIsActive streams open now (at most 64).",
        )?;
        shared.metrics.register(Box::new(streams_open.clone()))?;
        Ok(Self(Arc::new(KedaScaler {
            shared,
            load,
            cache: ForecastCache::default(),
            streams: Arc::new(Semaphore::new(MAX_STREAMS)),
            draining,
            forecasts,
            streams_open,
        })))
    }
}

fn status(err: impl Into<CallError>) -> Status {
    Status::from(err.into())
}

impl KedaScaler {
    fn query(&self, reference: Option<&ScaledObjectRef>) -> Result<ScalerQuery, Status> {
        let reference = reference.ok_or_else(|| {
            status(TwinError::invalid(
                "scaledObjectRef",
                "required: the ScaledObject asked about",
            ))
        })?;
        metadata::parse(
            &reference.scaler_metadata,
            self.shared.limits.twin.max_replications,
        )
        .map_err(status)
    }

    /// The pool's load as last sampled: NOT_FOUND naming `scalerMetadata.pool` when the
    /// mirror has no such pool, UNAVAILABLE before the first sample.
    fn pool(&self, query: &ScalerQuery) -> Result<PoolLoad, Status> {
        if self.shared.store.latest().is_none() {
            return Err(status(TwinError::NotSynced));
        }
        let mut found = self.load.find(&query.pool, query.namespace.as_deref());
        if found.is_empty() && self.load.samples() == 0 {
            return Err(status(CallError::Unavailable(
                "the load sampler has not sampled the mirror yet; retry".to_owned(),
            )));
        }
        match found.len() {
            1 => Ok(found.remove(0)),
            0 => Err(Status::not_found(format!(
                "scalerMetadata.pool: no pool {:?}{} in the mirror (pools: {})",
                query.pool,
                query
                    .namespace
                    .as_deref()
                    .map_or_else(String::new, |ns| format!(" in namespace {ns:?}")),
                self.load.pool_names().join(", ")
            ))),
            _ => Err(status(TwinError::invalid(
                "scalerMetadata.namespace",
                format!("pool {:?} is in several namespaces: name one", query.pool),
            ))),
        }
    }

    fn active(query: &ScalerQuery, load: &PoolLoad) -> bool {
        load.in_flight > 0
            || load.forecaster.last_observed() > 0.0
            || load.forecaster.peak_within(query.horizon_s) >= ACTIVE_RATE
    }

    /// The pool's load and what the trigger scales on it (a role checked against the pool).
    fn resolve(&self, query: &ScalerQuery) -> Result<(PoolLoad, Target), Status> {
        let load = self.pool(query)?;
        let target = roles::target(query, &load).map_err(status)?;
        Ok((load, target))
    }

    fn is_active(&self, reference: Option<&ScaledObjectRef>) -> Result<bool, Status> {
        let query = self.query(reference)?;
        let (load, _) = self.resolve(&query)?;
        Ok(Self::active(&query, &load))
    }

    /// The stages of the capacity question: the rate observed now for the first piece (the
    /// forecast's start may lag a step change), the forecast's after.
    fn stages(query: &ScalerQuery, load: &PoolLoad) -> Vec<Stage> {
        let mut stages: Vec<Stage> = load
            .forecaster
            .stages(query.horizon_s, STAGES)
            .into_iter()
            .map(|(rate, duration_s)| Stage { rate, duration_s })
            .collect();
        if let Some(first) = stages.first_mut() {
            first.rate = first.rate.max(load.forecaster.last_observed());
        }
        stages
    }

    /// The forecast for `query` on `target` (cached; see `cache`).
    async fn computed(
        &self,
        query: &ScalerQuery,
        load: PoolLoad,
        target: &Target,
    ) -> Result<Computed, Status> {
        if !Self::active(query, &load) {
            return Ok(Computed {
                desired: 0,
                attainment: 1.0,
                split: None,
            });
        }
        let stored = self
            .shared
            .store
            .latest()
            .ok_or_else(|| status(TwinError::NotSynced))?;
        let stages = Self::stages(query, &load);
        let inputs = Inputs {
            sample: self.load.samples(),
            config_generation: stored.snapshot.config_generation,
            stages: stages.clone(),
            lengths: cache::mean_lengths(target.observed_lengths(&stored.snapshot, &load.variant)),
        };
        let (entry, _) = self.cache.entry(&target.forecast_key(query), inputs);
        let mut ran = false;
        let result = entry
            .cell
            .get_or_init(|| {
                ran = true;
                self.forecast(query, load, target.clone(), stages)
            })
            .await
            .clone();
        let outcome = match (&result, ran) {
            (Err(_), _) => "error",
            (Ok(_), true) => "computed",
            (Ok(_), false) => "cached",
        };
        self.forecasts.with_label_values(&[outcome]).inc();
        result
    }

    /// Runs one capacity forecast on the simulation pool, bounded by the server's event
    /// budget and its longest call.
    async fn forecast(
        &self,
        query: &ScalerQuery,
        load: PoolLoad,
        target: Target,
        stages: Vec<Stage>,
    ) -> Result<Computed, Status> {
        let stored = self
            .shared
            .store
            .latest()
            .ok_or_else(|| status(TwinError::NotSynced))?;
        let settings = DesiredSettings {
            horizon_s: query.horizon_s,
            replications: query.replications,
            slo: query.slo,
            target_attainment: query.target_attainment,
            namespace: String::new(),
            seed: 0,
        };
        let limits = self.shared.limits.twin.clone();
        let deadline = Instant::now() + self.shared.limits.max_call;
        let variant = load.variant;
        let in_flight = load.in_flight;
        self.shared
            .simulate(deadline, move |cancel| {
                let snapshot = &stored.snapshot;
                let limits = crate::twin::limits::Limits {
                    deadline: Some(deadline),
                    cancel: Some(cancel),
                    ..limits
                };
                if let Target::Split { pair, .. } = &target {
                    let pair = (&pair.0, &pair.1);
                    let now_us = wall_now_us();
                    return roles::split_forecast(
                        snapshot, pair, &settings, stages, now_us, &limits, in_flight,
                    );
                }
                let asked = question_for(snapshot, &variant, &settings, stages, wall_now_us());
                let answer = asked
                    .map(|asked| forecast_capacity(snapshot, &asked, &limits))
                    .transpose()?;
                let chosen = desired(&variant, answer.as_ref());
                // No arrivals to simulate but requests in flight: one replica finishes them.
                let count = if answer.is_none() && in_flight == 0 {
                    0
                } else {
                    chosen.desired
                };
                Ok(Computed {
                    desired: count,
                    attainment: chosen.attainment,
                    split: None,
                })
            })
            .await
            .map_err(status)
    }

    async fn metric_value(&self, query: &ScalerQuery) -> Result<f64, Status> {
        let (load, target) = self.resolve(query)?;
        match query.metric {
            MetricKind::DesiredReplicas => {
                let computed = self.computed(query, load, &target).await?;
                Ok(f64::from(target.replicas(&computed)))
            }
            MetricKind::ArrivalRate { .. } => {
                // A P/D pool's rate is its pair's (every request visits both roles).
                Ok(load
                    .forecaster
                    .peak_within(query.horizon_s)
                    .max(load.forecaster.last_observed()))
            }
        }
    }
}

/// A stream's slot and its count in `ditto_keda_streams_open`, both given back on drop.
struct OpenStream {
    gauge: IntGauge,
    _permit: tokio::sync::OwnedSemaphorePermit,
}

impl OpenStream {
    fn new(gauge: &IntGauge, permit: tokio::sync::OwnedSemaphorePermit) -> Self {
        gauge.inc();
        Self {
            gauge: gauge.clone(),
            _permit: permit,
        }
    }
}

impl Drop for OpenStream {
    fn drop(&mut self) {
        self.gauge.dec();
    }
}

type ActiveStream = tokio_stream::wrappers::ReceiverStream<Result<IsActiveResponse, Status>>;

#[tonic::async_trait]
impl ExternalScaler for KedaService {
    async fn is_active(
        &self,
        request: Request<ScaledObjectRef>,
    ) -> Result<Response<IsActiveResponse>, Status> {
        let result = self.0.is_active(Some(request.get_ref()))?;
        Ok(Response::new(IsActiveResponse { result }))
    }

    type StreamIsActiveStream = ActiveStream;

    async fn stream_is_active(
        &self,
        request: Request<ScaledObjectRef>,
    ) -> Result<Response<Self::StreamIsActiveStream>, Status> {
        let reference = request.into_inner();
        // Bad metadata fails the call itself, not its first message.
        let first = self.0.is_active(Some(&reference))?;
        let permit = Arc::clone(&self.0.streams)
            .try_acquire_owned()
            .map_err(|_| {
                Status::resource_exhausted(format!(
                    "{MAX_STREAMS} StreamIsActive streams are open already"
                ))
            })?;
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let scaler = Arc::clone(&self.0);
        let mut samples = scaler.load.subscribe();
        let mut draining = scaler.draining.clone();
        tokio::spawn(async move {
            let _open = OpenStream::new(&scaler.streams_open, permit);
            let mut last = first;
            if tx
                .send(Ok(IsActiveResponse { result: first }))
                .await
                .is_err()
            {
                return;
            }
            loop {
                tokio::select! {
                    _ = tx.closed() => break,
                    _ = draining.wait_for(|draining| *draining) => break,
                    changed = samples.changed() => if changed.is_err() { break },
                }
                let now = match scaler.is_active(Some(&reference)) {
                    Ok(active) => active,
                    Err(err) => {
                        let _ = tx.send(Err(err)).await;
                        break;
                    }
                };
                if now != last {
                    last = now;
                    if tx.send(Ok(IsActiveResponse { result: now })).await.is_err() {
                        break;
                    }
                }
            }
        });
        Ok(Response::new(tokio_stream::wrappers::ReceiverStream::new(
            rx,
        )))
    }

    async fn get_metric_spec(
        &self,
        request: Request<ScaledObjectRef>,
    ) -> Result<Response<GetMetricSpecResponse>, Status> {
        let query = self.0.query(Some(request.get_ref()))?;
        // A role is checked against the pool once the mirror has sampled it; before, the
        // spec (which does not depend on the pool) is answered as without one.
        if query.role.is_some()
            && let Ok(load) = self.0.pool(&query)
        {
            roles::target(&query, &load).map_err(status)?;
        }
        let target = query.target();
        Ok(Response::new(GetMetricSpecResponse {
            metric_specs: vec![MetricSpec {
                metric_name: query.metric_name(),
                target_size: target.ceil() as i64,
                target_size_float: target,
            }],
        }))
    }

    async fn get_metrics(
        &self,
        request: Request<GetMetricsRequest>,
    ) -> Result<Response<GetMetricsResponse>, Status> {
        let request = request.into_inner();
        let query = self.0.query(request.scaled_object_ref.as_ref())?;
        let value = self.0.metric_value(&query).await?;
        // KEDA asks by the name it was given (possibly prefixed): answer under that name.
        let metric_name = if request.metric_name.is_empty() {
            query.metric_name()
        } else {
            request.metric_name
        };
        Ok(Response::new(GetMetricsResponse {
            metric_values: vec![MetricValue {
                metric_name,
                metric_value: value.ceil() as i64,
                metric_value_float: value,
            }],
        }))
    }
}
