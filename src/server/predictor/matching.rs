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
        state.cached_blocks.extend(synthetic.cached_blocks);
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
