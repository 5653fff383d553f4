//! What a [`Cluster`] needs to scale: a routable mask over its instances (a warming,
//! draining or stopped replica receives nothing), routing over the routable ones only, and
//! a stopped replica's slot reused by a fresh engine (a new pod: empty cache, and nothing
//! of the old pod's left in the router's approximate prefix index), its counts kept so the
//! cluster's conservation still covers every request it served.

use super::{Cluster, Dispatch};
use crate::cluster::config::{PrefixMode, Signal};
use crate::cluster::router::RoutingContext;
use crate::cluster::signals::{self, CapturedSignals, SignalView};
use crate::sim::Engine;
use crate::sim::metrics::Counts;
use crate::sim::metrics::RequestRecord;
use crate::sim::request::RequestSpec;

/// The autoscaled cluster's slot state.
#[derive(Clone, Debug, Default)]
pub struct Slots {
    routable: Vec<bool>,
    retired: Counts,
    candidates: Vec<usize>,
    in_flight: Vec<u64>,
    sent: Vec<u64>,
    fraction: Vec<f64>,
}

impl Slots {
    /// The requests of replaced engines (they all left: completed, dropped or timed out).
    pub fn retired_counts(&self) -> &Counts {
        &self.retired
    }
}

impl Cluster {
    /// Turns on autoscaling: only instances marked in `routable` receive requests from now
    /// on (one flag per instance).
    pub fn enable_scaling(&mut self, routable: Vec<bool>) {
        debug_assert_eq!(routable.len(), self.engines.len(), "one flag per instance");
        self.scale = Some(Box::new(Slots {
            routable,
            ..Slots::default()
        }));
    }

    /// Whether instance `index` may receive requests (always, without autoscaling).
    pub fn is_routable(&self, index: usize) -> bool {
        self.scale
            .as_ref()
            .is_none_or(|s| s.routable.get(index).copied().unwrap_or(false))
    }

    /// Lets instance `index` receive requests, or stops sending it any (its requests run on).
    pub fn set_routable(&mut self, index: usize, on: bool) {
        if let Some(flag) = self.scale.as_mut().and_then(|s| s.routable.get_mut(index)) {
            *flag = on;
        }
    }

    /// Whether instance `index` holds no request (nothing queued, running or in flight).
    pub fn is_drained(&self, index: usize) -> bool {
        let counts = self.engines[index].counts();
        counts.queued + counts.running == 0 && self.in_flight[index] == 0
    }

    /// Puts a fresh engine (a new pod) in drained instance `index`'s place at the current
    /// time; the old engine's counts stay in the cluster's. Returns false (and changes
    /// nothing) when the instance still holds requests.
    pub fn replace_engine(&mut self, index: usize, mut engine: Engine) -> bool {
        if !self.is_drained(index) || self.scale.is_none() {
            return false;
        }
        let now = self.now_us;
        engine.run_until(now);
        let old = std::mem::replace(&mut self.engines[index], engine);
        if let Some(scale) = self.scale.as_mut() {
            scale.retired.add(&old.counts());
        }
        self.records_seen[index] = 0;
        self.in_flight[index] = 0;
        self.sent_since_refresh[index] = 0;
        // The router's approximate index forgets the old pod's keys.
        self.router.forget(index);
        let precise = self.router.prefix_mode() == Some(PrefixMode::Precise);
        self.captured[index] = CapturedSignals::default();
        for signal in signals::SIGNALS {
            if signal != Signal::PrefixCache || precise {
                self.captured[index].refresh(signal, &self.engines[index], now);
            }
        }
        true
    }

    /// Hands instance `index`'s finished requests since the last call to `visit` and drops
    /// them (`Engine::drain_records`), after the cluster has counted them out of flight: an
    /// autoscaled run folds each record into its outcome once, so the engines keep none.
    pub fn drain_records(&mut self, index: usize, visit: impl FnMut(&RequestRecord)) {
        self.collect_finished(index);
        self.engines[index].drain_records(visit);
        self.records_seen[index] = 0;
    }

    /// Admission, routing over the routable instances only, and dispatch of one arrival.
    pub(in crate::cluster) fn arrive_scaled(&mut self, spec: RequestSpec) -> Dispatch {
        let Some(mut slots) = self.scale.take() else {
            return Dispatch::Rejected;
        };
        let now = self.now_us;
        slots.candidates.clear();
        slots
            .candidates
            .extend((0..self.engines.len()).filter(|&i| slots.routable[i]));
        self.scratch_views.clear();
        for &index in &slots.candidates {
            let view: SignalView = signals::current_view(
                &self.captured[index],
                &self.engines[index],
                &self.config.staleness,
            );
            self.scratch_views.push(view);
        }
        if slots.candidates.is_empty() || !self.admission.admit(&spec, now, &self.scratch_views) {
            self.scale = Some(slots);
            self.reject(spec);
            return Dispatch::Rejected;
        }
        let mode = self.router.prefix_mode();
        let mut keys_by_size: Vec<(u32, crate::sim::kv::hash::PromptKeys)> = Vec::new();
        slots.fraction.clear();
        slots.in_flight.clear();
        slots.sent.clear();
        for &index in &slots.candidates {
            let fraction = self.prefix_fraction(index, &spec, mode, &mut keys_by_size);
            slots.fraction.push(fraction);
            slots.in_flight.push(self.in_flight[index]);
            slots.sent.push(self.sent_since_refresh[index]);
        }
        let context = RoutingContext {
            views: &self.scratch_views,
            in_flight: &slots.in_flight,
            sent_since_refresh: &slots.sent,
            prefix_fraction: &slots.fraction,
        };
        let index = slots.candidates[self.router.pick(&context)];
        let chosen_size = self.config.instances[index].engine.block_size;
        if let Some((_, keys)) = keys_by_size.iter().find(|(size, _)| *size == chosen_size) {
            self.router.record_dispatch_prompt(index, keys);
        }
        self.scale = Some(slots);
        self.dispatch_as(index, spec, crate::cluster::sim::Half::Whole);
        Dispatch::Routed(index)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::config::{
        AdmissionPolicy, ClusterConfig, InstanceConfig, InstanceRole, RoutingPolicy,
        StalenessConfig,
    };
    use crate::sim::EngineConfig;
    use crate::sim::kv::hash::prompt_block_keys;
    use crate::sim::latency::{BlackboxCoefficients, LatencyModel};

    fn config() -> ClusterConfig {
        let mut engine = EngineConfig::vllm_defaults(4_000, 100_000);
        engine.kv_sample_interval_us = 0;
        let instance = InstanceConfig {
            id: "pool-0".into(),
            model: "test".into(),
            model_config_json: None,
            gpu: "test".into(),
            tp: 1,
            role: InstanceRole::Both,
            engine,
            latency: LatencyModel::Blackbox(BlackboxCoefficients {
                alpha: [0.0, 0.0, 0.0],
                beta: [2_000.0, 10.0, 500.0],
            }),
            cost_per_hour: 2.0,
        };
        ClusterConfig {
            instances: vec![instance.clone(), instance],
            routing: RoutingPolicy::llm_d_default(),
            admission: AdmissionPolicy::Always,
            staleness: StalenessConfig::uniform(50_000),
        }
    }

    /// A replaced pod's slot starts with nothing in the router's approximate prefix index:
    /// the keys sent to the old pod are forgotten (llm-d's EPP drops a deleted pod), so the
    /// prefix scorer gives the new pod no credit for a cache it does not have.
    #[test]
    fn a_replaced_pod_leaves_nothing_in_the_approximate_index() {
        let config = config();
        let template = config.instances[0].clone();
        let mut cluster = Cluster::new(config, 7).unwrap();
        cluster.enable_scaling(vec![true, false]);
        let spec = RequestSpec::synthetic(1, 1_000, 256, 4).with_prefix(9, 256);
        let keys = prompt_block_keys(&spec, template.engine.block_size);
        assert_eq!(keys.len(), 16);
        cluster.submit(spec).unwrap();
        cluster.run_until(10_000_000);
        assert_eq!(cluster.router.approximate_match(0, &keys), keys.len());
        cluster.set_routable(0, false);
        assert!(cluster.is_drained(0));
        let engine = Engine::new(template.engine.clone(), template.latency.clone()).unwrap();
        assert!(cluster.replace_engine(0, engine));
        assert_eq!(cluster.router.approximate_match(0, &keys), 0);
        // The new pod is indexed afresh from its own dispatches.
        cluster.set_routable(0, true);
        let again = RequestSpec::synthetic(2, 11_000_000, 256, 4).with_prefix(9, 256);
        cluster.submit(again).unwrap();
        cluster.run_until(20_000_000);
        assert_eq!(cluster.router.approximate_match(0, &keys), keys.len());
    }
}
