//! Matching a predictor entry to a mirrored pod. The router's entries carry no pod id, only
//! aggregates, so an entry is taken to describe mirrored instance `i` when `i` is the only
//! instance whose request state is fresh (observed within the mirror's signal age limit of
//! `now`) and whose mirrored waiting and running counts equal the entry's and whose pushed
//! KV usage gauge is within [`super::MATCH_KV_TOLERANCE`] of it. No match or several: the
//! state is built from the aggregates instead.

use std::sync::Arc;

use crate::twin::TwinError;
use crate::twin::aggregate::{
    AggregateOptions, AggregatePrediction, PodAggregates, instance_from_aggregates,
    predict_on_mirrored, single_instance_config,
};
use crate::twin::limits::Limits;
use crate::twin::snapshot::{MirrorSnapshot, TrafficStats};

/// The one fresh mirrored instance `aggregates` describes, if exactly one does.
pub fn mirrored_match(
    snapshot: &MirrorSnapshot,
    aggregates: &PodAggregates,
    now_us: u64,
) -> Option<usize> {
    let max_age = snapshot.settings.max_signal_age_us;
    let mut found = None;
    for (index, state) in snapshot.instances.iter().enumerate() {
        let fresh = state.observed_at_us > 0
            && state.observed_at_us <= now_us.saturating_add(max_age)
            && now_us.saturating_sub(state.observed_at_us) <= max_age;
        let kv_matches = state.gauges.is_some_and(|g| {
            (g.kv_usage - aggregates.kv_cache_percentage).abs() <= super::MATCH_KV_TOLERANCE
        });
        if fresh
            && kv_matches
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::spec::default_cluster;
    use crate::twin::aggregate::PodType;
    use crate::twin::snapshot::{Gauges, InstanceState, ObservedRequest, TwinSettings};

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
}
