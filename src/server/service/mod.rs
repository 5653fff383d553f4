//! The `ditto.v1.Twin` gRPC service: an adapter that decodes, validates, hands the work to
//! the store (on the blocking pool) or to a simulation (on rayon's pool), and encodes.
//!
//! Invariants: no lock is held across an `.await` (the store's locks live inside its
//! synchronous methods); every prediction runs on one immutable snapshot on the simulation
//! pool, bounded by a semaphore and by the call's deadline; a panic there is an INTERNAL
//! error, never a crash; every error is a `CallError` mapped to its status by `server::error`;
//! spans, timing and counts are `server::observe`'s. The push streams' side
//! (reading a stream within its deadline, applying each message off the async workers) is
//! in `push.rs`.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

mod push;

use super::convert::config::cluster_from_proto;
use super::convert::forecast::{forecast_answer_to_proto, forecast_from_proto};
use super::convert::question::{routing_answer_to_proto, routing_from_proto};
use super::convert::state::snapshot_to_proto;
use super::deadline::{client_deadline, wall_now_us, work_deadline};
use super::error::{CallError, status_from};
use super::observe::code_name;
use super::predictor::Predictor;
use super::proto;
use super::proto::twin_server::Twin;
use super::spans;
use crate::twin::MirrorSnapshot;
use crate::twin::limits::Limits;
use crate::twin::store::StoredSnapshot;

pub use super::state::{ServerState, ServiceLimits};
use crate::twin::{TwinError, forecast, predict};

/// The service implementation: the shared state, and the latency predictor whose online
/// calibration maps routing answers and which `AddTrainingSamples` trains.
#[derive(Clone, Debug)]
pub struct TwinService {
    shared: Arc<ServerState>,
    predictor: Arc<Predictor>,
}

impl TwinService {
    /// A service over `shared`, calibrated and trained through `predictor`.
    pub fn new(shared: Arc<ServerState>, predictor: Arc<Predictor>) -> Self {
        Self { shared, predictor }
    }
}

impl TwinService {
    /// Answers one routing question within `deadline`.
    async fn answer_routing(
        &self,
        message: proto::PredictRoutingRequest,
        deadline: Instant,
    ) -> Result<proto::PredictRoutingResponse, CallError> {
        let limits = self.shared.limits.twin.clone();
        let decoded = routing_from_proto(&message, &limits)?;
        let request_id = decoded.request_id.clone();
        let replications = u64::from(decoded.options.replications);
        let shape = (decoded.options.replications, decoded.options.horizon_us);
        let (answer, simulate_span) = self
            .answer_on_snapshot(
                deadline,
                decoded.generation,
                |stored| decoded.resolve(stored, &limits, wall_now_us()),
                predict::predict_valid,
                shape,
            )
            .await?;
        let candidates = answer.candidates.len() as u64;
        simulate_span.record("ditto.candidates", spans::as_i64(candidates));
        simulate_span.record("ditto.forks", spans::as_i64(candidates * replications));
        simulate_span.record("ditto.events", spans::as_i64(answer.events));
        self.shared.metrics.simulation_events.inc_by(answer.events);
        self.shared.metrics.predictions.inc();
        self.shared
            .metrics
            .forks
            .with_label_values(&["PredictRouting"])
            .inc_by(answer.candidates.len() as u64 * replications);
        let mut answer = answer;
        self.predictor.calibrator().calibrate_routing(&mut answer);
        Ok(routing_answer_to_proto(&answer, &request_id))
    }

    async fn answer_forecast(
        &self,
        message: proto::ForecastCapacityRequest,
        deadline: Instant,
    ) -> Result<proto::ForecastCapacityResponse, CallError> {
        let limits = self.shared.limits.twin.clone();
        let decoded = forecast_from_proto(&message, &limits)?;
        let replications = u64::from(decoded.question.replications);
        let horizon_s: f64 = decoded
            .question
            .stages
            .iter()
            .map(|stage| stage.duration_s)
            .sum();
        let shape = (decoded.question.replications, (horizon_s * 1e6) as u64);
        let (answer, simulate_span) = self
            .answer_on_snapshot(
                deadline,
                decoded.generation,
                |stored| decoded.resolve(stored, wall_now_us()),
                forecast::forecast_capacity,
                shape,
            )
            .await?;
        let candidates = answer.candidates.len() as u64;
        simulate_span.record("ditto.candidates", spans::as_i64(candidates));
        simulate_span.record("ditto.forks", spans::as_i64(candidates * replications));
        self.shared.metrics.forecasts.inc();
        self.shared
            .metrics
            .forks
            .with_label_values(&["ForecastCapacity"])
            .inc_by(answer.candidates.len() as u64 * replications);
        Ok(forecast_answer_to_proto(&answer))
    }

    /// The common path of a question: pick the snapshot of `generation`, resolve the question
    /// against it, then run `work` on that one immutable snapshot within `deadline`. Returns
    /// the answer and the simulation's span (given `replications` and `horizon_us`), for the
    /// caller to record the answer's counts on.
    async fn answer_on_snapshot<Q, A>(
        &self,
        deadline: Instant,
        generation: u64,
        resolve: impl FnOnce(&StoredSnapshot) -> Result<Q, TwinError>,
        work: fn(&MirrorSnapshot, &Q, &Limits) -> Result<A, TwinError>,
        (replications, horizon_us): (u32, u64),
    ) -> Result<(A, tracing::Span), CallError>
    where
        Q: Send + 'static,
        A: Send + 'static,
    {
        if Instant::now() >= deadline {
            return Err(CallError::Deadline(
                "before the question was read".to_owned(),
            ));
        }
        let snapshot_span = spans::snapshot(generation);
        let stored = snapshot_span.in_scope(|| self.shared.store.snapshot(generation))?;
        snapshot_span.record(
            "ditto.generation",
            spans::as_i64(stored.snapshot.generation),
        );
        drop(snapshot_span);
        let question = spans::resolve().in_scope(|| resolve(&stored))?;
        let twin = self.shared.limits.twin.clone();
        let snapshot = Arc::clone(&stored.snapshot);
        let simulation = self.shared.simulate(deadline, move |cancel| {
            let limits = Limits {
                deadline: Some(deadline),
                cancel: Some(cancel),
                ..twin
            };
            work(&snapshot, &question, &limits)
        });
        let span = spans::simulate(replications, horizon_us);
        let answer = tracing::Instrument::instrument(simulation, span.clone()).await?;
        Ok((answer, span))
    }
}

fn stream_response(
    request_id: String,
    result: Result<proto::PredictRoutingResponse, Status>,
) -> proto::PredictRoutingStreamResponse {
    use proto::predict_routing_stream_response::Result as Outcome;
    let outcome = match result {
        Ok(answer) => Outcome::Answer(answer),
        Err(status) => Outcome::Error(proto::StreamError {
            code: status.code() as i32,
            message: status.message().to_owned(),
        }),
    };
    proto::PredictRoutingStreamResponse {
        request_id,
        result: Some(outcome),
    }
}

/// What the reader of a prediction stream hands its writer, in order.
enum StreamItem {
    /// A question being answered: its request id and its task.
    Question(
        String,
        tokio::task::JoinHandle<Result<proto::PredictRoutingResponse, Status>>,
    ),
    /// The inbound stream failed (e.g. bytes that do not decode): the call ends with it.
    End(Status),
}

/// The response stream of `PredictRoutingStream`.
pub type PredictionStream = Pin<
    Box<
        dyn tokio_stream::Stream<Item = Result<proto::PredictRoutingStreamResponse, Status>> + Send,
    >,
>;

#[tonic::async_trait]
impl Twin for TwinService {
    async fn sync_cluster_config(
        &self,
        request: Request<proto::ClusterConfig>,
    ) -> Result<Response<proto::SyncClusterConfigResponse>, Status> {
        let shared = &self.shared;
        let result = cluster_from_proto(request.get_ref())
            .and_then(|decoded| {
                shared
                    .store
                    .sync_config(decoded.cluster, decoded.settings, decoded.addresses)
            })
            .map_err(|err| status_from(&err));
        if result.is_ok() {
            shared.report_serving().await;
        }
        let result = result.map(|outcome| proto::SyncClusterConfigResponse {
            generation: outcome.generation,
            config_generation: outcome.config_generation,
            changed: outcome.changed,
            reset_instance_ids: outcome.reset_instance_ids,
        });
        result.map(Response::new)
    }

    async fn push_instance_state(
        &self,
        request: Request<Streaming<proto::InstanceStateUpdate>>,
    ) -> Result<Response<proto::PushAck>, Status> {
        let started = Instant::now();
        let deadline = client_deadline(request.metadata(), started);
        let result = self
            .shared
            .push_states(request.into_inner(), deadline)
            .await;
        result.map(Response::new)
    }

    async fn push_kv_events(
        &self,
        request: Request<Streaming<proto::KvEventBatch>>,
    ) -> Result<Response<proto::PushAck>, Status> {
        let started = Instant::now();
        let deadline = client_deadline(request.metadata(), started);
        let result = self.shared.push_kv(request.into_inner(), deadline).await;
        result.map(Response::new)
    }

    async fn get_snapshot(
        &self,
        request: Request<proto::GetSnapshotRequest>,
    ) -> Result<Response<proto::ClusterSnapshot>, Status> {
        let message = request.get_ref();
        let result = (|| {
            let now_us = match message.now_us {
                0 => wall_now_us(),
                now if now > 0 => now as u64,
                now => {
                    return Err(TwinError::invalid(
                        "now_us",
                        format!("{now} must not be negative"),
                    ));
                }
            };
            let stored = self.shared.store.snapshot(message.generation)?;
            Ok(snapshot_to_proto(
                &stored,
                now_us,
                message.include_block_hashes,
            ))
        })()
        .map_err(|err| status_from(&err));
        result.map(Response::new)
    }

    async fn add_training_samples(
        &self,
        request: Request<proto::AddTrainingSamplesRequest>,
    ) -> Result<Response<proto::AddTrainingSamplesResponse>, Status> {
        let result =
            super::predictor::grpc::add_training_samples(&self.predictor, request.get_ref()).await;
        result.map(Response::new)
    }

    async fn predict_routing(
        &self,
        request: Request<proto::PredictRoutingRequest>,
    ) -> Result<Response<proto::PredictRoutingResponse>, Status> {
        let started = Instant::now();
        let client = client_deadline(request.metadata(), started);
        let deadline = work_deadline(client, self.shared.limits.max_call, started);
        let result = self
            .answer_routing(request.into_inner(), deadline)
            .await
            .map_err(Status::from);
        result.map(Response::new)
    }

    type PredictRoutingStreamStream = PredictionStream;

    async fn predict_routing_stream(
        &self,
        request: Request<Streaming<proto::PredictRoutingRequest>>,
    ) -> Result<Response<Self::PredictRoutingStreamStream>, Status> {
        let started = Instant::now();
        let client = client_deadline(request.metadata(), started);
        let mut inbound = request.into_inner();
        let in_flight = self.shared.limits.stream_in_flight.max(1);
        let (out_tx, out_rx) = mpsc::channel(in_flight);
        let (job_tx, mut job_rx) = mpsc::channel(in_flight);
        let service = self.clone();
        // Reader: starts each question as it arrives, at most `in_flight` ahead of the writer.
        // Bytes that do not decode end the stream with their INVALID_ARGUMENT, after the
        // answers to the questions before them.
        tokio::spawn(async move {
            loop {
                let item = match inbound.message().await {
                    Ok(Some(message)) => {
                        let deadline =
                            work_deadline(client, service.shared.limits.max_call, Instant::now());
                        let request_id = message.request_id.clone();
                        let worker = service.clone();
                        let job = tokio::spawn(async move {
                            let result = worker
                                .answer_routing(message, deadline)
                                .await
                                .map_err(Status::from);
                            let code = match &result {
                                Ok(_) => tonic::Code::Ok,
                                Err(status) => status.code(),
                            };
                            worker
                                .shared
                                .metrics
                                .stream_answers
                                .with_label_values(&[&code_name(code)])
                                .inc();
                            result
                        });
                        StreamItem::Question(request_id, job)
                    }
                    Ok(None) => break,
                    Err(status) => StreamItem::End(status),
                };
                let end = matches!(item, StreamItem::End(_));
                if job_tx.send(item).await.is_err() || end {
                    break;
                }
            }
        });
        // Writer: answers in question order.
        tokio::spawn(async move {
            while let Some(item) = job_rx.recv().await {
                let (reply, end) = match item {
                    StreamItem::Question(request_id, job) => {
                        let result = match job.await {
                            Ok(result) => result,
                            Err(_) => Err(CallError::Internal("the prediction task failed").into()),
                        };
                        (Ok(stream_response(request_id, result)), false)
                    }
                    StreamItem::End(status) => (Err(status), true),
                };
                if out_tx.send(reply).await.is_err() || end {
                    break;
                }
            }
        });
        let stream: PredictionStream = Box::pin(ReceiverStream::new(out_rx));
        Ok(Response::new(stream))
    }

    async fn forecast_capacity(
        &self,
        request: Request<proto::ForecastCapacityRequest>,
    ) -> Result<Response<proto::ForecastCapacityResponse>, Status> {
        let started = Instant::now();
        let client = client_deadline(request.metadata(), started);
        let deadline = work_deadline(client, self.shared.limits.max_call, started);
        let result = self
            .answer_forecast(request.into_inner(), deadline)
            .await
            .map_err(Status::from);
        result.map(Response::new)
    }
}
