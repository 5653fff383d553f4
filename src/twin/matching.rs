//! llm-d latency predictor entries answered on the mirror: each entry (a candidate pod's
//! aggregates) matched to a mirrored pod or simulated on the pool's template, identical
//! entries simulated once, and a call's forks bounded by its replication budget.
//!
//! The router's entries carry no pod id, only aggregates, so an entry is taken to describe
//! mirrored instance `i` when `i` is the only instance of the entry's role (its `pod_type`;
//! any role when the mirror knows none of that role) whose request state is fresh (observed
//! within the mirror's signal age limit of `now`), whose mirrored waiting and running counts
//! equal the entry's and whose pushed KV usage gauge is within [`MATCH_KV_TOLERANCE`] of it.
//! No match or several: the state is built from the aggregates on the first instance of the
//! entry's role in the synced config (`aggregate::instance_from_aggregates`).

use std::collections::HashMap;
use std::sync::Arc;

use super::TwinError;
use super::aggregate::{
    AggregateOptions, AggregatePrediction, PodAggregates, PodType, instance_from_aggregates,
    predict_aggregates, predict_on_mirrored, single_instance_config,
};
use super::limits::Limits;
use super::snapshot::{MirrorSnapshot, TrafficStats, TwinSettings};
use crate::cluster::config::{ClusterConfig, InstanceRole};

/// Largest KV usage difference between an entry and a mirrored pod it is matched to.
pub const MATCH_KV_TOLERANCE: f64 = 0.02;

/// Where one entry's prediction came from.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Source {
    /// The mirrored state of this instance index.
    Mirrored(usize),
    /// A state built from the aggregates.
    Aggregates,
}

/// The one-instance configs entries without a mirrored match are simulated on, one per pod
/// type, built once per synced config (see [`PoolTemplates::current`]).
#[derive(Debug)]
pub struct PoolTemplates {
    config_generation: u64,
    /// Monolithic, prefill, decode: the first instance of that role, else the first.
    by_type: [Arc<ClusterConfig>; 3],
    settings: Arc<TwinSettings>,
}

impl PoolTemplates {
    /// The templates of `snapshot`'s config.
    pub fn new(snapshot: &MirrorSnapshot) -> Result<Self, TwinError> {
        let template = |pod_type: PodType| {
            let instances = &snapshot.config.instances;
            let index = instances
                .iter()
                .position(|i| i.role == pod_type.role())
                .unwrap_or(0);
            single_instance_config(&snapshot.config, index)
                .map(Arc::new)
                .ok_or_else(|| {
                    TwinError::invalid("config.instances", "the synced config has no instance")
                })
        };
        Ok(Self {
            config_generation: snapshot.config_generation,
            by_type: [
                template(PodType::Monolithic)?,
                template(PodType::Prefill)?,
                template(PodType::Decode)?,
            ],
            settings: Arc::clone(&snapshot.settings),
        })
    }

    /// `cached` when it was built for `snapshot`'s config, else new templates.
    pub fn current(
        cached: Option<&Arc<PoolTemplates>>,
        snapshot: &MirrorSnapshot,
    ) -> Result<Arc<PoolTemplates>, TwinError> {
        match cached {
            Some(templates) if templates.config_generation == snapshot.config_generation => {
                Ok(Arc::clone(templates))
            }
            _ => Self::new(snapshot).map(Arc::new),
        }
    }

    fn of(&self, pod_type: PodType) -> &Arc<ClusterConfig> {
        match pod_type {
            PodType::Monolithic => &self.by_type[0],
            PodType::Prefill => &self.by_type[1],
            PodType::Decode => &self.by_type[2],
        }
    }
}

/// A call's replication budget: each of `entries` entries is simulated
/// `clamp(forks_per_call / entries, 2, replications)` times (at least 2, for a spread; never
/// more than `replications`).
pub fn replications_per_entry(forks_per_call: usize, entries: usize, replications: u32) -> u32 {
    let per_entry = (forks_per_call / entries.max(1)) as u32;
    per_entry.clamp(2, replications.max(2)).min(replications)
}

/// Predicts every entry on `snapshot` (in parallel on the simulation pool, results in entry
/// order): on its mirrored pod when it matches one, else on `templates`. Identical entries
/// (idle pods often are) are simulated once: answers are deterministic in the entry.
pub fn predict_entries(
    snapshot: &MirrorSnapshot,
    templates: &PoolTemplates,
    entries: &[PodAggregates],
    options: &AggregateOptions,
    limits: &Limits,
    now_us: u64,
) -> Vec<Result<(AggregatePrediction, Source), TwinError>> {
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
    let results = super::parallel::map(&distinct, |aggregates| {
        match mirrored_match(snapshot, aggregates, now_us) {
            Some(index) => predict_mirrored(snapshot, index, aggregates, options, limits, now_us)
                .map(|p| (p, Source::Mirrored(index))),
            None => predict_aggregates(
                templates.of(aggregates.pod_type),
                &templates.settings,
                aggregates,
                options,
                limits,
            )
            .map(|p| (p, Source::Aggregates)),
        }
    });
    slots
        .into_iter()
        .map(|slot| results[slot].clone())
        .collect()
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

/// The one fresh mirrored instance of the entry's role that `aggregates` describes, if
/// exactly one does (any role when the mirror has no instance of the entry's).
pub fn mirrored_match(
    snapshot: &MirrorSnapshot,
    aggregates: &PodAggregates,
    now_us: u64,
) -> Option<usize> {
    let max_age = snapshot.settings.max_signal_age_us;
    let role = aggregates.pod_type.role();
    let roles_known = snapshot.config.instances.iter().any(|i| i.role == role);
    let role_of = |index: usize| {
        snapshot
            .config
            .instances
            .get(index)
            .map_or(InstanceRole::Both, |i| i.role)
    };
    let mut found = None;
    for (index, state) in snapshot.instances.iter().enumerate() {
        let fresh = state.observed_at_us > 0
            && state.observed_at_us <= now_us.saturating_add(max_age)
            && now_us.saturating_sub(state.observed_at_us) <= max_age;
        let kv_matches = state.gauges.is_some_and(|g| {
            (g.kv_usage - aggregates.kv_cache_percentage).abs() <= MATCH_KV_TOLERANCE
        });
        if fresh
            && kv_matches
            && (!roles_known || role_of(index) == role)
            && state.waiting.len() == aggregates.num_request_waiting as usize
            && state.running.len() == aggregates.num_request_running as usize
        {
            if found.is_some() {
                return None;
            }
            found = Some(index);
        }
    }
    found
}

/// The new request of `aggregates` predicted on mirrored instance `index`: its mirrored
/// state plus the cached prefix the entry reports (as cached blocks of the new prompt),
/// rolled forward to `now_us`.
pub fn predict_mirrored(
    snapshot: &MirrorSnapshot,
    index: usize,
    aggregates: &PodAggregates,
    options: &AggregateOptions,
    limits: &Limits,
    now_us: u64,
) -> Result<AggregatePrediction, TwinError> {
    let config = single_instance_config(&snapshot.config, index)
        .ok_or_else(|| TwinError::invalid("instance", format!("no instance at {index}")))?;
    let mirrored = &snapshot.instances[index];
    let (synthetic, request) =
        instance_from_aggregates(&config.instances[0], aggregates, options.output_tokens);
    let mut state = (**mirrored).clone();
    // The prefix the entry reports cached: the new prompt's first blocks, most recent.
    let total = config.instances[0].engine.num_gpu_blocks as usize;
    if state.cached_blocks.len() + synthetic.cached_blocks.len() <= total {
        state
            .cached_blocks
            .extend_keys(synthetic.cached_blocks.keys());
    }
    let view = MirrorSnapshot {
        generation: snapshot.generation,
        config_generation: snapshot.config_generation,
        config: Arc::new(config),
        settings: Arc::clone(&snapshot.settings),
        instances: vec![Arc::new(state)],
        traffic: Arc::new(TrafficStats::clone(&snapshot.traffic)),
        memo: Default::default(),
    };
    let now = now_us.max(mirrored.observed_at_us);
    predict_on_mirrored(&view, 0, request, now, options, limits)
        .map(|prediction| aggregates.pod_type.neutralise(prediction))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::spec::default_cluster;
    use crate::twin::snapshot::{Gauges, InstanceState, ObservedRequest};

    const NOW: u64 = 10_000_000;

    fn state(id: &str, running: usize, kv: f64, observed_at_us: u64) -> Arc<InstanceState> {
        let request = ObservedRequest {
            request_id: "r".to_owned(),
            arrival_us: 0,
            prompt_tokens: 100,
            computed_tokens: 100,
            cached_tokens: 0,
            output_tokens: 1,
            max_tokens: 100,
            known_output_tokens: None,
            priority: 0,
            slo_class: crate::sim::SloClass::Standard,
            scheduled_tokens: 0,
            block_hashes: Vec::new(),
            token_ids: None,
        };
        Arc::new(InstanceState {
            instance_id: id.to_owned(),
            observed_at_us,
            running: vec![request; running],
            gauges: Some(Gauges {
                running: running as u32,
                waiting: 0,
                kv_usage: kv,
                transfers: None,
            }),
            ..InstanceState::default()
        })
    }

    fn snapshot(states: Vec<Arc<InstanceState>>) -> MirrorSnapshot {
        MirrorSnapshot {
            generation: 1,
            config_generation: 1,
            config: Arc::new(default_cluster()),
            settings: Arc::new(TwinSettings::defaults()),
            instances: states,
            traffic: Arc::new(TrafficStats::default()),
            memo: Default::default(),
        }
    }

    fn entry(running: u32, kv: f64) -> PodAggregates {
        PodAggregates {
            kv_cache_percentage: kv,
            input_token_length: 100,
            num_request_waiting: 0,
            num_request_running: running,
            num_tokens_generated: 0,
            prefix_cache_score: 0.0,
            pod_type: PodType::Monolithic,
            prefill_tokens_in_flight: 0,
            decode_tokens_in_flight: 0,
            encoder_input_size: 0,
            encoder_matched_size: 0,
        }
    }

    #[test]
    fn only_a_unique_fresh_match_counts() {
        let snap = snapshot(vec![
            state("a", 3, 0.10, NOW),
            state("b", 5, 0.30, NOW),
            state("c", 5, 0.31, NOW),
            state("d", 7, 0.50, NOW - 1_000_000),
        ]);
        assert_eq!(mirrored_match(&snap, &entry(3, 0.11), NOW), Some(0));
        assert_eq!(
            mirrored_match(&snap, &entry(3, 0.20), NOW),
            None,
            "KV too far"
        );
        assert_eq!(
            mirrored_match(&snap, &entry(5, 0.30), NOW),
            None,
            "ambiguous"
        );
        assert_eq!(mirrored_match(&snap, &entry(7, 0.50), NOW), None, "stale");
        assert_eq!(
            mirrored_match(&snap, &entry(4, 0.10), NOW),
            None,
            "counts differ"
        );
    }

    #[test]
    fn entries_match_only_pods_of_their_role_once_roles_are_known() {
        let mut snap = snapshot(vec![state("a", 3, 0.10, NOW), state("b", 3, 0.10, NOW)]);
        let mut decode = entry(3, 0.10);
        decode.pod_type = PodType::Decode;
        assert_eq!(
            mirrored_match(&snap, &decode, NOW),
            None,
            "ambiguous, no roles"
        );
        let mut config = (*snap.config).clone();
        config.instances[1].role = InstanceRole::Decode;
        snap.config = Arc::new(config);
        assert_eq!(mirrored_match(&snap, &decode, NOW), Some(1));
        assert_eq!(mirrored_match(&snap, &entry(3, 0.10), NOW), Some(0));
        let mut prefill = entry(3, 0.10);
        prefill.pod_type = PodType::Prefill;
        assert_eq!(
            mirrored_match(&snap, &prefill, NOW),
            None,
            "no prefill pod mirrored: any role, and two match"
        );
    }
}
