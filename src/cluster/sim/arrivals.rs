//! A cluster's arrivals: admission, routing (with the prefix each instance holds, as the
//! router's scorer sees it) and dispatch to an instance, a rejection's record, and the
//! in-flight counts lowered as instances finish requests.

use super::{Cluster, Dispatch, Half};
use crate::cluster::config::PrefixMode;
use crate::cluster::router::RoutingContext;
use crate::cluster::signals;
use crate::sim::RequestSpec;
use crate::sim::SimError;
use crate::sim::engine::validate_request;
use crate::sim::kv::hash::PromptKeys;
use crate::sim::metrics::{Outcome, RequestRecord};

impl Cluster {
    /// Sends `spec` straight to instance `index` at the current time, bypassing admission
    /// and routing: a what-if ("had the router picked this instance") on a fork.
    pub fn dispatch_to(&mut self, index: usize, spec: RequestSpec) -> Result<(), SimError> {
        validate_request(&spec, self.now_us)?;
        if index >= self.engines.len() || spec.arrival_us != self.now_us {
            return Err(SimError::InvalidRequest {
                id: spec.id,
                field: "arrival_us",
                reason: format!(
                    "dispatch_to needs an instance index below {} and arrival now ({})",
                    self.engines.len(),
                    self.now_us
                ),
            });
        }
        self.dispatch(index, spec);
        Ok(())
    }

    /// Admission, routing and dispatch of one arrival.
    pub(crate) fn arrive(&mut self, spec: RequestSpec) -> Dispatch {
        if self.scale.is_some() {
            return self.arrive_scaled(spec);
        }
        let now = self.now_us;
        self.scratch_views.clear();
        for index in 0..self.engines.len() {
            let view = signals::current_view(
                &self.captured[index],
                &self.engines[index],
                &self.config.staleness,
            );
            self.scratch_views.push(view);
        }
        if !self.admission.admit(&spec, now, &self.scratch_views) {
            self.reject(spec);
            return Dispatch::Rejected;
        }
        // Prompt block keys per instance block size (pools may differ).
        let mode = self.router.prefix_mode();
        let mut keys_by_size: Vec<(u32, PromptKeys)> = Vec::new();
        self.scratch_fraction.clear();
        for index in 0..self.engines.len() {
            let fraction = self.prefix_fraction(index, &spec, mode, &mut keys_by_size);
            self.scratch_fraction.push(fraction);
        }
        if self.pd.is_some() {
            return self.arrive_disaggregated(spec, &keys_by_size);
        }
        let context = RoutingContext {
            views: &self.scratch_views,
            in_flight: &self.in_flight,
            sent_since_refresh: &self.sent_since_refresh,
            prefix_fraction: &self.scratch_fraction,
        };
        let index = self.router.pick(&context);
        let chosen_size = self.config.instances[index].engine.block_size;
        if let Some((_, keys)) = keys_by_size.iter().find(|(size, _)| *size == chosen_size) {
            self.router.record_dispatch_prompt(index, keys);
        }
        self.dispatch(index, spec);
        Dispatch::Routed(index)
    }

    fn dispatch(&mut self, index: usize, spec: RequestSpec) {
        self.dispatch_as(index, spec, Half::Whole);
    }

    /// Dispatches `spec` to instance `index` as a whole request or one half of a
    /// disaggregated one.
    pub(in crate::cluster) fn dispatch_as(&mut self, index: usize, spec: RequestSpec, half: Half) {
        let now = self.now_us;
        let engine = &mut self.engines[index];
        engine.run_before(now);
        let submitted = match half {
            Half::Whole => engine.submit(spec),
            Half::Prefill => engine.submit_prefill(spec),
            Half::Decode => engine.submit_remote_kv(spec),
        };
        debug_assert!(
            submitted.is_ok(),
            "validated at cluster submit: {submitted:?}"
        );
        // The arrival is the instance's earliest event now: process it at once.
        engine.process_next_event();
        self.in_flight[index] += 1;
        // A live queue depth already counts the request; a stale one does not until the
        // next refresh.
        if self.config.staleness.queue_depth_us > 0 {
            self.sent_since_refresh[index] += 1;
        }
        self.routed_to[index] += 1;
        self.collect_finished(index);
    }

    pub(in crate::cluster) fn reject(&mut self, spec: RequestSpec) {
        let now = self.now_us;
        self.rejected.push(RequestRecord {
            id: spec.id,
            slo_class: spec.slo_class,
            outcome: Outcome::Rejected,
            arrival_us: spec.arrival_us,
            enqueue_us: None,
            schedule_us: None,
            first_token_us: None,
            end_us: now,
            input_tokens: spec.input_tokens,
            output_tokens: 0,
            cached_tokens: 0,
            used_blocks_at_schedule: 0,
            preemptions: 0,
            token_gap_sum_us: 0,
            token_gaps_us: Vec::new(),
        });
    }

    /// Lowers in-flight counts for requests instance `index` has finished since last time
    /// (and, disaggregated, hands finished prefills over and starts pulls).
    pub(in crate::cluster) fn collect_finished(&mut self, index: usize) {
        let total = self.engines[index].metrics().records.len();
        let seen = self.records_seen[index];
        let new = total - seen;
        self.records_seen[index] = total;
        self.in_flight[index] = self.in_flight[index].saturating_sub(new as u64);
        if self.pd.is_some() {
            self.collect_disaggregated(index, seen);
        }
    }

    /// The fraction of `spec`'s prompt blocks instance `index` holds, as the router's prefix
    /// scorer sees it (approximate index or precise captured cache; 0 without a prefix
    /// scorer). `keys_by_size` caches the prompt's block keys per block size across calls.
    pub(in crate::cluster) fn prefix_fraction(
        &self,
        index: usize,
        spec: &RequestSpec,
        mode: Option<PrefixMode>,
        keys_by_size: &mut Vec<(u32, PromptKeys)>,
    ) -> f64 {
        let Some(mode) = mode else {
            return 0.0;
        };
        let block_size = self.config.instances[index].engine.block_size;
        let at = match keys_by_size
            .iter()
            .position(|(size, _)| *size == block_size)
        {
            Some(at) => at,
            None => {
                keys_by_size.push((block_size, PromptKeys::new(spec, block_size)));
                keys_by_size.len() - 1
            }
        };
        let keys = &mut keys_by_size[at].1;
        if keys.is_empty() {
            return 0.0;
        }
        let matched = match mode {
            PrefixMode::Approximate { .. } => self.router.approximate_match_prompt(index, keys),
            PrefixMode::Precise => signals::precise_prefix_match(
                keys.materialize(),
                &self.captured[index],
                &self.engines[index],
                &self.config.staleness,
            ),
        };
        matched as f64 / keys.len() as f64
    }
}
