//! Capacity forecasts: more replicas never hurt attainment here, the recommendation is the
//! cheapest count meeting the target, searches agree with explicit lists, and bad questions
//! name their field.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use ditto::cluster::spec;
use ditto::twin::forecast::forecast_capacity;
use ditto::twin::question::{ForecastQuestion, ForecastStart, SloTargets, VariantCandidates};
use ditto::twin::snapshot::{InstanceState, MirrorSnapshot, TrafficStats, TwinSettings};
use ditto::twin::{Limits, TwinError};
use ditto::workload::{LengthDist, Stage};

fn snapshot() -> MirrorSnapshot {
    let config = spec::default_cluster();
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
        generation: 3,
        config_generation: 1,
        config: Arc::new(config),
        settings: Arc::new(TwinSettings::defaults()),
        instances,
        traffic: Arc::new(TrafficStats::default()),
        memo: Default::default(),
    }
}

fn question(counts: Vec<u32>) -> ForecastQuestion {
    ForecastQuestion {
        start: ForecastStart::Empty,
        stages: vec![
            Stage {
                rate: 25.0,
                duration_s: 20.0,
            },
            Stage {
                rate: 60.0,
                duration_s: 10.0,
            },
        ],
        input_tokens: LengthDist::gaussian(1024.0, 400.0, 16, 4000),
        output_tokens: LengthDist::gaussian(256.0, 100.0, 8, 1000),
        variants: vec![VariantCandidates {
            template_instance_id: "vllm-0".into(),
            replica_counts: counts,
        }],
        max_cost_per_hour: 0.0,
        slo: SloTargets {
            ttft_ms: Some(300.0),
            tpot_ms: Some(25.0),
            e2e_ms: None,
        },
        target_attainment: 0.95,
        replications: 2,
        quantiles: vec![0.5, 0.9, 0.99],
        seed: 4,
        now_us: 1_000_000,
    }
}

#[test]
fn more_replicas_more_attainment_and_cheapest_sufficient_is_desired() {
    let snapshot = snapshot();
    let answer =
        forecast_capacity(&snapshot, &question(vec![1, 2, 4, 6]), &Limits::DEFAULT).unwrap();
    assert_eq!(answer.generation, 3);
    assert_eq!(answer.seed, 4);
    let attainment: Vec<f64> = answer.candidates.iter().map(|c| c.slo_attainment).collect();
    eprintln!("attainment by replicas [1, 2, 4, 6]: {attainment:?}");
    assert!(
        attainment.windows(2).all(|w| w[1] >= w[0] - 1e-9),
        "{attainment:?}"
    );
    assert!(
        attainment[0] < 0.95,
        "one H100 cannot take 60 req/s: {attainment:?}"
    );
    assert!(attainment[3] >= 0.95, "six should: {attainment:?}");
    let costs: Vec<f64> = answer.candidates.iter().map(|c| c.cost_per_hour).collect();
    assert_eq!(costs, vec![4.0, 8.0, 16.0, 24.0]);
    let first_ok = answer
        .candidates
        .iter()
        .find(|c| c.slo_attainment >= 0.95)
        .unwrap();
    assert_eq!(answer.desired_replicas, first_ok.replicas);
    for candidate in &answer.candidates {
        let (low, high) = candidate.slo_attainment_ci;
        assert!(low <= candidate.slo_attainment && candidate.slo_attainment <= high);
        assert_eq!(candidate.ttft_ms.quantiles.len(), 3);
        assert!(candidate.e2e_ms.mean > candidate.ttft_ms.mean);
        assert!(candidate.throughput_rps > 0.0);
    }
    // Same question, same answer.
    assert_eq!(
        forecast_capacity(&snapshot, &question(vec![1, 2, 4, 6]), &Limits::DEFAULT).unwrap(),
        answer
    );
}

#[test]
fn search_finds_the_same_desired_count() {
    let snapshot = snapshot();
    let explicit =
        forecast_capacity(&snapshot, &question((1..=6).collect()), &Limits::DEFAULT).unwrap();
    let searched = forecast_capacity(&snapshot, &question(Vec::new()), &Limits::DEFAULT).unwrap();
    assert_eq!(searched.desired_replicas, explicit.desired_replicas);
    let wanted = searched.desired_replicas[0].1 as usize;
    assert_eq!(
        searched.candidates.len(),
        wanted,
        "the search stops at the first sufficient count"
    );
    // A cost bound below the needed count: nothing is recommended.
    let mut bounded = question(Vec::new());
    bounded.max_cost_per_hour = 4.0 * (wanted as f64 - 1.0);
    let answer = forecast_capacity(&snapshot, &bounded, &Limits::DEFAULT).unwrap();
    assert!(answer.desired_replicas.is_empty());
    assert_eq!(answer.candidates.len(), wanted - 1);
}

#[test]
fn bad_forecast_questions_name_the_field() {
    let snapshot = snapshot();
    let mut cases: Vec<(ForecastQuestion, &str)> = Vec::new();
    let mut q = question(vec![1]);
    q.variants[0].template_instance_id = "nope".into();
    cases.push((q, "variants[0].template_instance_id"));
    let mut q = question(vec![0]);
    q.variants[0].replica_counts = vec![0];
    cases.push((q, "variants[0].replica_counts[0]"));
    let mut q = question(vec![1]);
    q.stages = vec![Stage {
        rate: -1.0,
        duration_s: 10.0,
    }];
    cases.push((q, "stages[0].rate"));
    let mut q = question(vec![1]);
    q.target_attainment = 1.5;
    cases.push((q, "target_attainment"));
    let mut q = question(vec![1]);
    q.quantiles = vec![1.5];
    cases.push((q, "quantiles[0]"));
    for (q, field) in cases {
        match forecast_capacity(&snapshot, &q, &Limits::DEFAULT) {
            Err(TwinError::InvalidField { path: got, .. }) => assert_eq!(got, field),
            other => panic!("{field}: {other:?}"),
        }
    }
    let mut q = question(vec![1]);
    q.replications = 1_000;
    assert!(matches!(
        forecast_capacity(&snapshot, &q, &Limits::DEFAULT),
        Err(TwinError::OverLimit(_))
    ));
    let mut q = question(vec![1]);
    q.stages = vec![Stage {
        rate: 10.0,
        duration_s: 1e7,
    }];
    assert!(matches!(
        forecast_capacity(&snapshot, &q, &Limits::DEFAULT),
        Err(TwinError::OverLimit(_))
    ));
}
