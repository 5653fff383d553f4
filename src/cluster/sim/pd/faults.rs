//! Failures on the P/D path (docs/disaggregation.md, "Failures and retries"): a prefill
//! request that fails with a retryable error and the routing sidecar's retries, and KV pulls
//! that fail in transport.
//!
//! llm-d's routing sidecar (llm-d-router `pkg/sidecar/proxy/connector_nixlv2.go`, options in
//! `options.go`) sends the prefill to the one prefill pod the EPP named; on 502, 503 or 504
//! it waits `--prefill-retry-backoff` (200 ms) and sends it again to the same pod, up to
//! `--prefill-max-retries` times (0 by default); after the last failure the error goes to the
//! client (the fallback to a local prefill on the decode pod was removed, llm-d-router
//! PR 1206). A failed attempt never reaches the prefill pod's engine here (a reset
//! connection, a full accept queue), so it holds no blocks there.
//!
//! Each draw comes from its own named stream of the run's seed (`pd-prefill-failure`,
//! `pd-transfer-failure`); with both rates 0 nothing is drawn and nothing changes.

use super::super::{Cluster, Half};
use super::{PdEvent, PdRequest, Stage};
use crate::sim::RequestId;
use crate::sim::metrics::{Outcome, RequestRecord};
use crate::sim::rng::{RngStreams, SimRng};
use rand_core::Rng;

/// The failure draws and what they caused.
#[derive(Clone, Debug)]
pub(super) struct FaultState {
    prefill_rng: SimRng,
    transfer_rng: SimRng,
    /// Prefill attempts that failed.
    pub(super) attempt_failures: u64,
    /// Retries sent.
    pub(super) retries: u64,
    /// Requests waiting for their retry (counted as queued).
    pub(super) retries_pending: u64,
    /// Requests whose last attempt failed, as their clients saw them, with their decode pod.
    pub(super) errors: Vec<(usize, RequestRecord)>,
}

impl FaultState {
    /// The streams of `seed`, nothing drawn yet.
    pub(super) fn new(seed: u64) -> Self {
        let streams = RngStreams::new(seed);
        Self {
            prefill_rng: streams.stream("pd-prefill-failure"),
            transfer_rng: streams.stream("pd-transfer-failure"),
            attempt_failures: 0,
            retries: 0,
            retries_pending: 0,
            errors: Vec::new(),
        }
    }

    /// True if the next prefill attempt fails (no draw at rate 0).
    fn prefill_fails(&mut self, rate: f64) -> bool {
        rate > 0.0 && unit(&mut self.prefill_rng) < rate
    }

    /// True if a pull starting now fails in transport (no draw at rate 0).
    pub(super) fn transfer_fails(&mut self, rate: f64) -> bool {
        rate > 0.0 && unit(&mut self.transfer_rng) < rate
    }
}

/// A uniform draw in [0, 1) from the top 53 bits.
fn unit(rng: &mut SimRng) -> f64 {
    (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64
}

impl Cluster {
    /// The sidecar sends request `id`'s prefill to its prefill pod now: the prefill half
    /// reaches the pod's engine, or the attempt fails and the sidecar waits to retry, or,
    /// retries spent, the request ends with the error.
    pub(super) fn send_prefill(&mut self, id: RequestId) {
        let now = self.now_us;
        let Some(pd) = self.pd.as_mut() else {
            return;
        };
        let faults = pd.config.faults;
        let Some(request) = pd.requests.get_mut(&id) else {
            debug_assert!(false, "a prefill for a request the cluster did not split");
            return;
        };
        if pd.faults.prefill_fails(faults.prefill_failure_rate) {
            pd.faults.attempt_failures += 1;
            request.failed_attempts += 1;
            if request.failed_attempts <= faults.prefill_max_retries {
                request.stage = Stage::RetryWait;
                pd.faults.retries_pending += 1;
                let at = now.saturating_add(faults.prefill_retry_backoff_us);
                pd.push(at, PdEvent::PrefillRetry(id));
            } else {
                request.stage = Stage::PrefillError;
                let record = error_record(request, now);
                let decode = request.decode;
                pd.faults.errors.push((decode, record));
            }
            return;
        }
        request.stage = Stage::Prefill;
        let mut half = PdRequest::prefill_half(&request.spec);
        half.arrival_us = now;
        let prefill = request.prefill;
        self.dispatch_as(prefill, half, Half::Prefill);
    }

    /// A retry's backoff ended: the sidecar sends the prefill again, to the same pod.
    pub(super) fn retry_prefill(&mut self, id: RequestId) {
        let Some(pd) = self.pd.as_mut() else {
            return;
        };
        pd.faults.retries_pending -= 1;
        pd.faults.retries += 1;
        self.send_prefill(id);
    }
}

/// What the client of a request whose prefill failed for good saw: an error at the time of
/// the last attempt, no token (counted dropped).
fn error_record(request: &PdRequest, now_us: u64) -> RequestRecord {
    RequestRecord {
        id: request.spec.id,
        slo_class: request.spec.slo_class,
        outcome: Outcome::Dropped,
        arrival_us: request.arrival_us,
        enqueue_us: None,
        schedule_us: None,
        first_token_us: None,
        end_us: now_us,
        input_tokens: request.spec.input_tokens,
        output_tokens: 0,
        cached_tokens: 0,
        used_blocks_at_schedule: 0,
        preemptions: 0,
        token_gap_sum_us: 0,
        token_gaps_us: Vec::new(),
    }
}
