//! The what-if family: a mirrored 4-instance cluster (the default cluster, each instance
//! with 128 running requests, mixed prefill and decode, and 64 waiting) asked where a
//! 2,000-token prompt with 256 output tokens should go, and the P/D snapshot beside it. The
//! fixtures here are shared with the criterion bench `twin_predict` and tests; `cases.rs`
//! times the questions in-process (the loopback askings are `loadgen/`'s).

use std::sync::Arc;

use crate::cluster::spec;
use crate::sim::SloClass;
use crate::twin::question::{
    Background, CandidateRequest, OutputLength, PredictOptions, RoutingQuestion, SloTargets,
};
use crate::twin::snapshot::{
    InstanceState, MirrorSnapshot, ObservedRequest, TrafficStats, TwinSettings,
};

mod cases;

pub(super) use cases::{memory_case, pd_case, whatif_cases};

/// The observation time of the what-if snapshot (µs).
pub const WHATIF_NOW_US: u64 = 10_000_000;

/// A deterministic pseudo-random sequence for building fixtures (no RNG stream needed).
fn scramble(index: u64, salt: u64) -> u64 {
    let mut x = index.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ salt;
    x ^= x >> 31;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^ (x >> 29)
}

/// One mirrored instance with `running` running requests (every eighth mid-prefill, the rest
/// decoding) and `waiting` waiting ones; final lengths known if `known_lengths`.
pub fn whatif_instance(
    id: &str,
    running: u32,
    waiting: u32,
    known_lengths: bool,
    salt: u64,
) -> InstanceState {
    let request = |index: u64, is_running: bool| -> ObservedRequest {
        let prompt = 200 + (scramble(index, salt) % 1800) as u32;
        let output_total = 16 + (scramble(index, salt ^ 7) % 480) as u32;
        let prefilling = is_running && index.is_multiple_of(8);
        let generated = if !is_running || prefilling {
            0
        } else {
            1 + (scramble(index, salt ^ 13) % u64::from(output_total - 1)) as u32
        };
        let computed = match (is_running, prefilling) {
            (false, _) => 0,
            (true, true) => prompt / 2,
            (true, false) => prompt + generated - 1,
        };
        ObservedRequest {
            request_id: format!("{id}/r{index}"),
            arrival_us: WHATIF_NOW_US - 1 - index * 1000,
            prompt_tokens: prompt,
            computed_tokens: computed,
            cached_tokens: 0,
            output_tokens: generated,
            max_tokens: 4096,
            known_output_tokens: known_lengths.then_some(output_total.max(generated + 1)),
            priority: 1,
            slo_class: SloClass::Standard,
            scheduled_tokens: 0,
            block_hashes: Vec::new(),
            token_ids: None,
        }
    };
    InstanceState {
        instance_id: id.to_owned(),
        observed_at_us: WHATIF_NOW_US,
        running: (0..u64::from(running)).map(|i| request(i, true)).collect(),
        waiting: (0..u64::from(waiting))
            .map(|i| request(u64::from(running) + i, false))
            .collect(),
        ..InstanceState::default()
    }
}

/// The what-if snapshot: the default cluster, each instance with 128 running and 64 waiting.
pub fn whatif_snapshot(known_lengths: bool) -> MirrorSnapshot {
    let config = spec::default_cluster();
    let instances = config
        .instances
        .iter()
        .enumerate()
        .map(|(index, instance)| {
            Arc::new(whatif_instance(
                &instance.id,
                128,
                64,
                known_lengths,
                index as u64,
            ))
        })
        .collect();
    MirrorSnapshot {
        generation: 1,
        config_generation: 1,
        config: Arc::new(config),
        settings: Arc::new(TwinSettings::defaults()),
        instances,
        traffic: Arc::new(TrafficStats::default()),
        memo: Default::default(),
    }
}

/// "Now" of the `call`-th of repeated what-if questions on one snapshot: a new millisecond
/// each time, up to 100 ms after the observation, as a gateway asks between state pushes
/// (within the default signal age, so instances roll forward).
pub fn whatif_now_us(call: u32) -> u64 {
    WHATIF_NOW_US + u64::from(call % 100) * 1_000
}

/// The what-if question: 2,000 prompt tokens, 256 output tokens, every instance a candidate.
pub fn whatif_question(replications: u32) -> RoutingQuestion {
    RoutingQuestion {
        request: CandidateRequest {
            prompt_tokens: 2_000,
            token_ids: None,
            block_hashes: Vec::new(),
            output: OutputLength::Point(256),
            max_tokens: 256,
            priority: 1,
            slo_class: SloClass::Standard,
            slo: SloTargets {
                ttft_ms: Some(500.0),
                tpot_ms: Some(50.0),
                e2e_ms: None,
            },
        },
        candidates: Vec::new(),
        options: PredictOptions {
            replications,
            quantiles: vec![0.5, 0.9, 0.99],
            horizon_us: 60_000_000,
            background: Background::None,
            stale_policy: None,
            max_signal_age_us: Some(200_000),
            seed: 42,
        },
        now_us: WHATIF_NOW_US,
    }
}

/// The P/D what-if snapshot: `prefill` pods with role prefill and `decode` pods with role
/// decode (the default cluster's instance as their template), llm-d's P/D defaults (decider
/// 16 uncached tokens, NIXL over 400 Gb/s RDMA). Prefill pods hold 4 running and 4 waiting
/// requests, decode pods 64 running and 16 waiting: the shape of llm-d's P/D guide (8
/// prefill, 2 decode).
pub fn pd_snapshot(prefill: usize, decode: usize) -> MirrorSnapshot {
    use crate::cluster::config::InstanceRole;
    let mut config = spec::default_cluster();
    let template = config.instances[0].clone();
    config.instances = (0..prefill + decode)
        .map(|index| {
            let mut instance = template.clone();
            let (role, name, n) = if index < prefill {
                (InstanceRole::Prefill, "prefill", index)
            } else {
                (InstanceRole::Decode, "decode", index - prefill)
            };
            instance.role = role;
            instance.id = format!("{name}-{n}");
            instance
        })
        .collect();
    let instances = config
        .instances
        .iter()
        .enumerate()
        .map(|(index, instance)| {
            let (running, waiting) = if instance.role == InstanceRole::Prefill {
                (4, 4)
            } else {
                (64, 16)
            };
            Arc::new(whatif_instance(
                &instance.id,
                running,
                waiting,
                true,
                index as u64,
            ))
        })
        .collect();
    let settings = TwinSettings {
        disaggregation: crate::twin::snapshot::PdSettings::resolve(&spec::DisaggSpec::default())
            .ok(),
        ..TwinSettings::defaults()
    };
    MirrorSnapshot {
        generation: 1,
        config_generation: 1,
        config: Arc::new(config),
        settings: Arc::new(settings),
        instances,
        traffic: Arc::new(TrafficStats::default()),
        memo: Default::default(),
    }
}
