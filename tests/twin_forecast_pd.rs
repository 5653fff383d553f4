//! Capacity forecasts of a P/D pool (docs/disaggregation.md): searching the prefill and the
//! decode variant together names a split that meets the target, grown one role at a time on
//! that role's objective, and the split follows the workload (prompt-heavy traffic wants
//! prefill pods, output-heavy traffic decode pods); candidates run disaggregated.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use ditto::cluster::spec;
use ditto::twin::forecast::forecast_capacity;
use ditto::twin::question::{
    ForecastAnswer, ForecastQuestion, ForecastStart, SloTargets, VariantCandidates,
};
use ditto::twin::snapshot::{InstanceState, MirrorSnapshot, TrafficStats, TwinSettings};
use ditto::twin::{Limits, TwinError};
use ditto::workload::{LengthDist, Stage};

/// Two pools of one blackbox-priced model, one per role: a step costs 5 ms + 20 µs a
/// prefill token + 100 µs a decode token.
const POOL: &str = "pools:
  - name: prefill
    role: prefill
    replicas: 2
    latency_model: blackbox
    coefficients: {alpha: [0, 0, 0], beta: [5000, 20, 100]}
    engine: {num_gpu_blocks: 20000}
    cost_per_hour: 1.0
  - name: decode
    role: decode
    replicas: 1
    latency_model: blackbox
    coefficients: {alpha: [0, 0, 0], beta: [5000, 20, 100]}
    engine: {num_gpu_blocks: 20000}
    cost_per_hour: 4.0
";

fn snapshot() -> MirrorSnapshot {
    let config = spec::parse_cluster_file(POOL, None).unwrap().config;
    let instances = config
        .instances
        .iter()
        .map(|i| {
            Arc::new(InstanceState {
                instance_id: i.id.clone(),
                observed_at_us: 1_000_000,
                ..InstanceState::default()
            })
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

fn ids(snapshot: &MirrorSnapshot) -> (String, String) {
    let instances = &snapshot.config.instances;
    (instances[0].id.clone(), instances[2].id.clone())
}

fn question(
    snapshot: &MirrorSnapshot,
    input: LengthDist,
    output: LengthDist,
    counts: [Vec<u32>; 2],
) -> ForecastQuestion {
    let (prefill, decode) = ids(snapshot);
    let [prefill_counts, decode_counts] = counts;
    ForecastQuestion {
        start: ForecastStart::Empty,
        stages: vec![Stage {
            rate: 40.0,
            duration_s: 5.0,
        }],
        input_tokens: input,
        output_tokens: output,
        variants: vec![
            VariantCandidates {
                template_instance_id: prefill,
                replica_counts: prefill_counts,
            },
            VariantCandidates {
                template_instance_id: decode,
                replica_counts: decode_counts,
            },
        ],
        max_cost_per_hour: 0.0,
        slo: SloTargets {
            ttft_ms: Some(250.0),
            tpot_ms: Some(15.0),
            e2e_ms: None,
        },
        target_attainment: 0.9,
        replications: 1,
        quantiles: vec![0.5, 0.9],
        seed: 11,
        now_us: 1_000_000,
    }
}

fn split(answer: &ForecastAnswer, snapshot: &MirrorSnapshot) -> (u32, u32) {
    let (prefill, decode) = ids(snapshot);
    let count = |id: &str| {
        answer
            .desired_replicas
            .iter()
            .find(|(template, _)| template == id)
            .unwrap()
            .1
    };
    (count(&prefill), count(&decode))
}

fn searched(snapshot: &MirrorSnapshot, input: LengthDist, output: LengthDist) -> ForecastAnswer {
    let asked = question(snapshot, input, output, [Vec::new(), Vec::new()]);
    let answer = forecast_capacity(snapshot, &asked, &Limits::DEFAULT).unwrap();
    let trail: Vec<(Vec<(String, u32)>, f64)> = answer
        .candidates
        .iter()
        .map(|c| (c.replicas.clone(), c.slo_attainment))
        .collect();
    eprintln!("split search: {trail:?}");
    // From one of each, each step adds one replica to one or both roles, until the first
    // split meeting the target; the trim's candidates follow.
    let first = &answer.candidates[0].replicas;
    assert_eq!((first[0].1, first[1].1), (1, 1));
    let met = answer
        .candidates
        .iter()
        .position(|c| c.slo_attainment >= 0.9)
        .unwrap();
    let (search, trim) = answer.candidates.split_at(met + 1);
    for pair in search.windows(2) {
        for role in 0..2 {
            let grew = pair[1].replicas[role].1 - pair[0].replicas[role].1;
            assert!(grew <= 1, "{trail:?}");
        }
        assert!(pair[1].cost_per_hour > pair[0].cost_per_hour);
    }
    // The trim runs fewer pods than the met split; the desired split is the trimmed one:
    // met, with no more pods of either role than the search's.
    let last = &search[met];
    let fewer = |c: &[(String, u32)]| (0..2).all(|role| c[role].1 <= last.replicas[role].1);
    assert!(
        trim.iter()
            .all(|c| fewer(&c.replicas) && c.replicas != last.replicas),
        "{trail:?}"
    );
    let desired = answer
        .candidates
        .iter()
        .find(|c| c.replicas == answer.desired_replicas)
        .unwrap();
    assert!(desired.slo_attainment >= 0.9, "{trail:?}");
    assert!(fewer(&answer.desired_replicas), "{trail:?}");
    answer
}

#[test]
fn the_split_follows_the_workload() {
    let snapshot = snapshot();
    // Long prompts, short outputs: 40 prefills a second of 2,000 tokens (45 ms each) need
    // two prefill pods at least; one decode pod keeps up with 20 tokens each.
    let prompt_heavy = searched(
        &snapshot,
        LengthDist::gaussian(2000.0, 0.0, 2000, 2000),
        LengthDist::gaussian(20.0, 0.0, 20, 20),
    );
    let (p1, d1) = split(&prompt_heavy, &snapshot);
    assert!(p1 >= 2 && d1 == 1, "prompt-heavy split {p1}:{d1}");
    // Short prompts, long outputs: one prefill pod suffices, decode needs several.
    let output_heavy = searched(
        &snapshot,
        LengthDist::gaussian(100.0, 0.0, 100, 100),
        LengthDist::gaussian(400.0, 0.0, 400, 400),
    );
    let (p2, d2) = split(&output_heavy, &snapshot);
    assert!(p2 == 1 && d2 >= 2, "output-heavy split {p2}:{d2}");
    // Same question, same answer.
    let again = searched(
        &snapshot,
        LengthDist::gaussian(100.0, 0.0, 100, 100),
        LengthDist::gaussian(400.0, 0.0, 400, 400),
    );
    assert_eq!(again, output_heavy);
}

#[test]
fn explicit_splits_run_disaggregated() {
    let snapshot = snapshot();
    // Prefill pods only serve prompts: more of them shorten TTFT under prompt-heavy load,
    // which a monolithic simulation of the same pods would not isolate.
    let asked = question(
        &snapshot,
        LengthDist::gaussian(2000.0, 0.0, 2000, 2000),
        LengthDist::gaussian(20.0, 0.0, 20, 20),
        [vec![1, 3], vec![1]],
    );
    let answer = forecast_capacity(&snapshot, &asked, &Limits::DEFAULT).unwrap();
    assert_eq!(answer.candidates.len(), 2);
    let ttft: Vec<f64> = answer.candidates.iter().map(|c| c.ttft_ms.mean).collect();
    assert!(ttft[1] < ttft[0], "{ttft:?}");
    // A disaggregated request's TTFT holds a prefill step (5 ms + 40 ms) and the NIXL
    // setup (3 ms) at least.
    assert!(ttft[1] > 48.0, "{ttft:?}");
}

#[test]
fn two_searched_variants_must_be_a_prefill_and_a_decode() {
    let mut snapshot = snapshot();
    let mut config = (*snapshot.config).clone();
    config.instances[2].role = ditto::cluster::config::InstanceRole::Prefill;
    config.instances[2].tp = 2;
    snapshot.config = Arc::new(config);
    let asked = question(
        &snapshot,
        LengthDist::gaussian(100.0, 0.0, 100, 100),
        LengthDist::gaussian(10.0, 0.0, 10, 10),
        [Vec::new(), Vec::new()],
    );
    let err = forecast_capacity(&snapshot, &asked, &Limits::DEFAULT).unwrap_err();
    assert!(
        matches!(&err, TwinError::InvalidField { path, .. } if path == "variants"),
        "{err:?}"
    );
}
