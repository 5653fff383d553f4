//! Routing predictions on mirrored state. The key correctness test: run a cluster to time T,
//! mirror its state, predict a new request on every candidate, then continue the original
//! with the request routed to each candidate: with known lengths the prediction is exact.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use ditto::catalog;
use ditto::cluster::Cluster;
use ditto::cluster::config::{
    AdmissionPolicy, ClusterConfig, InstanceConfig, InstanceRole, RoutingPolicy, StalenessConfig,
};
use ditto::sim::kv::hash::prompt_block_keys;
use ditto::sim::latency::LatencyKind;
use ditto::sim::{Engine, EngineConfig, RequestSpec, SloClass};
use ditto::twin::Limits;
use ditto::twin::cached::CachedBlocks;
use ditto::twin::predict::predict_routing;
use ditto::twin::question::{
    Background, CandidateRequest, OutputLength, PredictOptions, RoutingQuestion, SloTargets,
    StalePolicy,
};
use ditto::twin::snapshot::{
    InstanceState, MirrorSnapshot, ObservedRequest, TrafficStats, TwinSettings,
};
use ditto::workload::{ArrivalProcess, LengthDist, WorkloadSpec};

fn cluster_config(count: usize) -> ClusterConfig {
    let arch = catalog::model("llama-3.1-8b-instruct").unwrap();
    let gpu = catalog::gpu("H100").unwrap();
    let latency = catalog::latency_model(LatencyKind::Roofline, &arch, &gpu, 1).unwrap();
    let mut engine = EngineConfig::vllm_defaults(26_312, 131_072);
    engine.max_num_seqs = 64;
    engine.kv_sample_interval_us = 0;
    ClusterConfig {
        instances: (0..count)
            .map(|i| InstanceConfig {
                id: format!("vllm-{i}"),
                model: arch.name.clone(),
                model_config_json: None,
                gpu: gpu.name.clone(),
                tp: 1,
                role: InstanceRole::Both,
                engine: engine.clone(),
                latency: latency.clone(),
                cost_per_hour: 1.0,
            })
            .collect(),
        routing: RoutingPolicy::RoundRobin,
        admission: AdmissionPolicy::Always,
        staleness: StalenessConfig::uniform(0),
    }
}

/// The mirror of `cluster` as an observer of each vLLM instance would push it.
fn mirror(cluster: &Cluster, generation: u64) -> MirrorSnapshot {
    let instances = cluster
        .engines()
        .iter()
        .zip(&cluster.config().instances)
        .map(|(engine, config)| Arc::new(observe(engine, &config.id, cluster.now_us())))
        .collect();
    MirrorSnapshot {
        generation,
        config_generation: 1,
        config: Arc::new(cluster.config().clone()),
        settings: Arc::new(TwinSettings::defaults()),
        instances,
        traffic: Arc::new(TrafficStats::default()),
        memo: Default::default(),
    }
}

/// An instance observed at `now` (its engine's clock may lag: nothing happened since its
/// last event).
fn observe(engine: &Engine, id: &str, now: u64) -> InstanceState {
    let observed = engine.observe();
    debug_assert!(observed.now_us <= now);
    let convert = |r: &ditto::sim::engine::RestoredRequest| ObservedRequest {
        request_id: r.spec.id.0.to_string(),
        arrival_us: r.spec.arrival_us,
        prompt_tokens: r.spec.input_tokens,
        computed_tokens: r.computed_tokens,
        cached_tokens: r.cached_tokens,
        output_tokens: r.generated,
        max_tokens: r.spec.max_tokens,
        known_output_tokens: Some(r.spec.output_tokens),
        priority: r.spec.priority,
        slo_class: r.spec.slo_class,
        scheduled_tokens: r.scheduled_tokens,
        block_hashes: prompt_block_keys(&r.spec, 16),
        token_ids: None,
    };
    InstanceState {
        instance_id: id.to_owned(),
        observed_at_us: now,
        running: observed.running.iter().map(convert).collect(),
        waiting: observed.waiting.iter().map(convert).collect(),
        step_end_us: observed.step_end_us,
        cached_blocks: CachedBlocks::from_keys(observed.cached_keys),
        ..InstanceState::default()
    }
}

fn workload(rate: f64, requests: u64) -> Vec<RequestSpec> {
    let mut spec = WorkloadSpec::single_client(
        5,
        requests,
        rate,
        ArrivalProcess::Poisson,
        LengthDist::gaussian(700.0, 400.0, 2, 4000),
        LengthDist::gaussian(200.0, 120.0, 2, 1000),
    );
    spec.prefix = Some(ditto::workload::PrefixSpec {
        groups: 3,
        length: 256,
    });
    spec.generator().unwrap().collect()
}

fn question(now_us: u64, output: OutputLength, replications: u32) -> RoutingQuestion {
    RoutingQuestion {
        request: CandidateRequest {
            prompt_tokens: 2_000,
            token_ids: None,
            block_hashes: Vec::new(),
            output,
            max_tokens: 1_000,
            priority: 1,
            slo_class: SloClass::Standard,
            slo: SloTargets {
                ttft_ms: Some(200.0),
                tpot_ms: Some(30.0),
                e2e_ms: None,
            },
        },
        candidates: Vec::new(),
        options: PredictOptions {
            replications,
            quantiles: vec![0.05, 0.5, 0.95],
            horizon_us: 600_000_000,
            background: Background::None,
            stale_policy: None,
            max_signal_age_us: Some(200_000),
            seed: 77,
        },
        now_us,
    }
}

/// The cluster run to `cut`, with every arrival up to it.
fn cluster_at(cut: u64) -> Cluster {
    let mut cluster = Cluster::new(cluster_config(3), 1).unwrap();
    for spec in workload(45.0, 2_000)
        .into_iter()
        .take_while(|s| s.arrival_us <= cut)
    {
        cluster.run_before(spec.arrival_us);
        cluster.submit(spec).unwrap();
    }
    cluster.run_until(cut);
    cluster
}

#[test]
fn prediction_with_known_lengths_equals_the_continued_simulation() {
    for cut in [8_000_123, 20_000_777] {
        let cluster = cluster_at(cut);
        let busy: usize = cluster
            .engines()
            .iter()
            .map(|e| e.num_running() + e.num_waiting())
            .sum();
        assert!(
            busy > 20,
            "the cut should find a busy cluster ({busy} requests in flight)"
        );
        let snapshot = mirror(&cluster, 9);
        let question = question(cut, OutputLength::Point(300), 1);
        let answer = predict_routing(&snapshot, &question, &Limits::DEFAULT).unwrap();
        assert_eq!(answer.generation, 9);
        assert_eq!(answer.seed, 77);
        assert_eq!(answer.candidates.len(), 3);
        for (index, prediction) in answer.candidates.iter().enumerate() {
            let mut fork = cluster.clone();
            let spec = RequestSpec::synthetic(999_999, cut, 2_000, 300);
            fork.dispatch_to(index, spec).unwrap();
            fork.run(Vec::new(), u64::MAX).unwrap();
            let record = fork.engines()[index]
                .metrics()
                .records
                .iter()
                .find(|r| r.id.0 == 999_999)
                .unwrap()
                .clone();
            let ttft_us = record.ttft_us().unwrap();
            let e2e_us = record.e2e_us().unwrap();
            assert_eq!(
                (prediction.ttft_ms.mean * 1000.0).round() as u64,
                ttft_us,
                "cut {cut}, {}",
                prediction.instance_id
            );
            assert_eq!(
                (prediction.e2e_ms.mean * 1000.0).round() as u64,
                e2e_us,
                "cut {cut}, {}",
                prediction.instance_id
            );
            assert!(prediction.valid);
        }
        // Identical inputs, identical answer.
        assert_eq!(
            predict_routing(&snapshot, &question, &Limits::DEFAULT).unwrap(),
            answer
        );
    }
}

#[test]
fn sampled_lengths_90_percent_intervals_cover_about_90_percent() {
    // Hide the in-flight requests' final lengths and the new request's length: the twin
    // samples them (from the same distribution the workload used), and the real outcome
    // should fall inside the predicted 5-95 % interval about 90 % of the time.
    let mut inside = 0;
    let mut trials = 0;
    // One run, observed at 60 successive cuts.
    let mut running = Cluster::new(cluster_config(3), 1).unwrap();
    let mut arrivals = workload(45.0, 2_000).into_iter().peekable();
    for trial in 0..40u64 {
        let cut = 6_000_000 + trial * 913_117;
        while let Some(spec) = arrivals.next_if(|s| s.arrival_us <= cut) {
            running.run_before(spec.arrival_us);
            running.submit(spec).unwrap();
        }
        running.run_until(cut);
        let cluster = running.clone();
        let mut snapshot = mirror(&cluster, 1);
        let mut settings = TwinSettings::defaults();
        settings.output_tokens = LengthDist::gaussian(200.0, 120.0, 2, 1000);
        snapshot.settings = Arc::new(settings);
        for state in &mut snapshot.instances {
            let state = Arc::make_mut(state);
            for request in state.running.iter_mut().chain(state.waiting.iter_mut()) {
                request.known_output_tokens = None;
            }
        }
        let mut q = question(
            cut,
            OutputLength::Histogram((2..=1000).step_by(7).map(|v| (v, 1.0)).collect()),
            32,
        );
        q.candidates = vec![format!("vllm-{}", trial % 3)];
        let answer = predict_routing(&snapshot, &q, &Limits::DEFAULT).unwrap();
        let prediction = &answer.candidates[0];
        // The truth: the new request's own length is drawn like the question's histogram.
        let mut fork = cluster.clone();
        let own_length = 2 + ((trial * 7919) % 998) as u32;
        fork.dispatch_to(
            (trial % 3) as usize,
            RequestSpec::synthetic(999_999, cut, 2_000, own_length),
        )
        .unwrap();
        fork.run(Vec::new(), u64::MAX).unwrap();
        let record = fork.engines()[(trial % 3) as usize]
            .metrics()
            .records
            .iter()
            .find(|r| r.id.0 == 999_999)
            .unwrap()
            .clone();
        let e2e_ms = record.e2e_us().unwrap() as f64 / 1000.0;
        let (low, high) = (
            prediction.e2e_ms.quantiles[0].value,
            prediction.e2e_ms.quantiles[2].value,
        );
        trials += 1;
        if (low..=high).contains(&e2e_ms) {
            inside += 1;
        }
    }
    let coverage = f64::from(inside) / f64::from(trials);
    eprintln!("90 % interval coverage: {inside}/{trials}");
    assert!(
        (0.75..=0.98).contains(&coverage),
        "coverage {coverage} over {trials} trials"
    );
}

#[test]
fn stale_policies() {
    // Instance states observed 1 s before the question (stale: the limit is 200 ms).
    let old = 9_000_000;
    let now = 10_000_000;
    let stale_cluster = {
        let mut cluster = Cluster::new(cluster_config(3), 1).unwrap();
        for spec in workload(45.0, 2_000)
            .into_iter()
            .take_while(|s| s.arrival_us <= old)
        {
            cluster.run_before(spec.arrival_us);
            cluster.submit(spec).unwrap();
        }
        cluster.run_until(old);
        cluster
    };
    let stale = mirror(&stale_cluster, 1);
    // The truth at `now` if nothing arrived in between: the same cluster run forward.
    let mut fresh_cluster = stale_cluster.clone();
    fresh_cluster.run_until(now);
    let fresh = mirror(&fresh_cluster, 2);
    let ask = |policy| {
        let mut q = question(now, OutputLength::Point(300), 1);
        q.options.stale_policy = Some(policy);
        q
    };
    let truth = predict_routing(
        &fresh,
        &question(now, OutputLength::Point(300), 1),
        &Limits::DEFAULT,
    )
    .unwrap();

    // Roll-forward advances each stale instance by its age inside the simulation: with no
    // arrivals in between, that is exactly the fresh state.
    let rolled = predict_routing(&stale, &ask(StalePolicy::RollForward), &Limits::DEFAULT).unwrap();
    for (a, b) in rolled.candidates.iter().zip(&truth.candidates) {
        assert_eq!(a.e2e_ms, b.e2e_ms, "{}", a.instance_id);
        assert_eq!(a.ttft_ms, b.ttft_ms);
        assert!(a.valid);
        assert_eq!(a.input_age_ms, 1000.0);
    }
    // Use-last takes the old state as current: valid, but a different (older) picture.
    let last = predict_routing(&stale, &ask(StalePolicy::UseLast), &Limits::DEFAULT).unwrap();
    assert!(last.candidates.iter().all(|c| c.valid));
    assert_ne!(
        last.candidates
            .iter()
            .map(|c| c.e2e_ms.mean)
            .collect::<Vec<_>>(),
        truth
            .candidates
            .iter()
            .map(|c| c.e2e_ms.mean)
            .collect::<Vec<_>>()
    );
    // Exclude and treat-saturated: no valid candidate, nothing recommended.
    for policy in [StalePolicy::Exclude, StalePolicy::TreatSaturated] {
        let answer = predict_routing(&stale, &ask(policy), &Limits::DEFAULT).unwrap();
        assert!(
            answer
                .candidates
                .iter()
                .all(|c| !c.valid && !c.invalid_reason.is_empty()),
            "{policy:?}"
        );
        assert_eq!(answer.recommended_instance_id, None);
    }
    // Fresh enough signals are never subject to the policy.
    let mut lenient = ask(StalePolicy::Exclude);
    lenient.options.max_signal_age_us = Some(2_000_000);
    let answer = predict_routing(&stale, &lenient, &Limits::DEFAULT).unwrap();
    assert!(answer.candidates.iter().all(|c| c.valid));
}

#[test]
fn background_arrivals_add_load_and_stay_deterministic() {
    let cut = 8_000_123;
    let cluster = cluster_at(cut);
    let mut snapshot = mirror(&cluster, 1);
    snapshot.traffic = Arc::new(TrafficStats {
        arrivals_per_s: 90.0,
        recent_lengths: (0..64).map(|i| (300 + i * 10, 100 + i * 3)).collect(),
        ..TrafficStats::default()
    });
    let mut quiet_question = question(cut, OutputLength::Point(300), 4);
    quiet_question.options.horizon_us = 20_000_000;
    let quiet = predict_routing(&snapshot, &quiet_question, &Limits::DEFAULT).unwrap();
    let mut busy_question = quiet_question.clone();
    busy_question.options.background = Background::ObservedPoisson;
    let busy = predict_routing(&snapshot, &busy_question, &Limits::DEFAULT).unwrap();
    for (q, b) in quiet.candidates.iter().zip(&busy.candidates) {
        assert!(
            b.e2e_ms.mean >= q.e2e_ms.mean,
            "{}: {} < {}",
            q.instance_id,
            b.e2e_ms.mean,
            q.e2e_ms.mean
        );
    }
    assert!(busy.events > quiet.events);
    assert_eq!(
        predict_routing(&snapshot, &busy_question, &Limits::DEFAULT).unwrap(),
        busy
    );
}

#[test]
fn bounded_work_and_bad_questions() {
    use ditto::twin::TwinError;
    let cut = 8_000_123;
    let cluster = cluster_at(cut);
    let snapshot = mirror(&cluster, 1);
    let mut q = question(cut, OutputLength::Point(300), 1);
    q.candidates = vec!["vllm-9".into()];
    assert!(
        matches!(predict_routing(&snapshot, &q, &Limits::DEFAULT), Err(TwinError::InvalidField { path, .. }) if path == "candidate_instance_ids[0]")
    );
    let mut q = question(cut, OutputLength::Point(300), 1);
    q.now_us = cut - 1;
    assert!(
        matches!(predict_routing(&snapshot, &q, &Limits::DEFAULT), Err(TwinError::InvalidField { path, .. }) if path == "now_us")
    );
    let q = question(cut, OutputLength::Point(300), 1000);
    assert!(matches!(
        predict_routing(&snapshot, &q, &Limits::DEFAULT),
        Err(TwinError::OverLimit(_))
    ));
    // A tiny event budget ends the call with EventBudget (RESOURCE_EXHAUSTED), never a hang.
    let tight = Limits {
        max_events_per_call: 5_000,
        ..Limits::DEFAULT
    };
    let q = question(cut, OutputLength::Point(300), 1);
    assert!(matches!(
        predict_routing(&snapshot, &q, &tight),
        Err(TwinError::EventBudget { .. })
    ));
    // A deadline already past ends it with DeadlineExceeded.
    let late = Limits {
        deadline: Some(std::time::Instant::now()),
        ..Limits::DEFAULT
    };
    assert!(matches!(
        predict_routing(&snapshot, &q, &late),
        Err(TwinError::Deadline { .. })
    ));
}

#[test]
fn baselines_are_shared_across_questions_on_one_snapshot() {
    let cut = 8_000_123;
    let cluster = cluster_at(cut);
    let snapshot = mirror(&cluster, 1);
    let first = question(cut, OutputLength::Point(300), 2);
    let mut second = first.clone();
    second.request.prompt_tokens = 500;
    predict_routing(&snapshot, &first, &Limits::DEFAULT).unwrap();
    assert_eq!(snapshot.memo.len(), 6, "3 candidates x 2 replications");
    let warm = predict_routing(&snapshot, &second, &Limits::DEFAULT).unwrap();
    assert_eq!(
        snapshot.memo.len(),
        6,
        "the second question reuses every baseline"
    );
    // A copied snapshot starts with an empty memo; the answer is the same.
    let fresh = snapshot.clone();
    assert!(fresh.memo.is_empty());
    let cold = predict_routing(&fresh, &second, &Limits::DEFAULT).unwrap();
    assert_eq!(warm, cold);
}

/// One change to a good question.
type Edit = Box<dyn Fn(&mut RoutingQuestion)>;

/// `ValidRouting::new` is the one check of a question: each bad field is named with its wire
/// path, an over-limit value is OverLimit, and a good question keeps its decided defaults.
#[test]
fn every_question_check_names_its_wire_field() {
    use ditto::twin::TwinError;
    use ditto::twin::valid::ValidRouting;
    let cut = 8_000_123;
    let snapshot = mirror(&cluster_at(cut), 1);
    let good = || question(cut, OutputLength::Point(300), 2);
    let edits: Vec<(&str, Edit)> = vec![
        (
            "request.prompt_tokens",
            Box::new(|q| q.request.prompt_tokens = 0),
        ),
        (
            "request.output_tokens",
            Box::new(|q| q.request.output = OutputLength::Point(0)),
        ),
        (
            "request.output_histogram.bins",
            Box::new(|q| q.request.output = OutputLength::Histogram(vec![])),
        ),
        (
            "request.output_histogram.bins[1].tokens",
            Box::new(|q| q.request.output = OutputLength::Histogram(vec![(5, 1.0), (0, 1.0)])),
        ),
        (
            "request.output_histogram.bins[0].weight",
            Box::new(|q| q.request.output = OutputLength::Histogram(vec![(5, f64::NAN)])),
        ),
        (
            "request.output_histogram.bins",
            Box::new(|q| q.request.output = OutputLength::Histogram(vec![(5, 0.0)])),
        ),
        ("request.max_tokens", Box::new(|q| q.request.max_tokens = 0)),
        (
            "request.token_ids",
            Box::new(|q| q.request.token_ids = Some(Arc::from(vec![1u32; 3]))),
        ),
        (
            "request.block_hashes",
            Box::new(|q| q.request.block_hashes = vec![7, 8, 7]),
        ),
        (
            "options.replications",
            Box::new(|q| q.options.replications = 0),
        ),
        ("options.horizon_ms", Box::new(|q| q.options.horizon_us = 0)),
        (
            "options.quantiles[1]",
            Box::new(|q| q.options.quantiles = vec![0.5, 1.0]),
        ),
        (
            "candidate_instance_ids[1]",
            Box::new(|q| q.candidates = vec!["vllm-0".into(), "vllm-0".into()]),
        ),
        (
            "candidate_instance_ids[0]",
            Box::new(|q| q.candidates = vec!["nowhere".into()]),
        ),
        ("now_us", Box::new(move |q| q.now_us = cut - 1)),
        (
            "options.max_signal_age_ms",
            Box::new(|q| q.options.max_signal_age_us = Some(0)),
        ),
    ];
    for (path, edit) in &edits {
        let mut q = good();
        edit(&mut q);
        match ValidRouting::new(q, &snapshot, &Limits::DEFAULT) {
            Err(TwinError::InvalidField { path: got, .. }) => assert_eq!(&got, path),
            other => panic!("{path}: expected InvalidField, got {other:?}"),
        }
    }
    let small = Limits {
        max_candidates: 2,
        max_replications: 1,
        max_horizon_us: 1_000,
        ..Limits::DEFAULT
    };
    let over: Vec<(&str, Edit)> = vec![
        (
            "options.replications",
            Box::new(|q| q.options.horizon_us = 1_000),
        ),
        (
            "options.horizon_ms",
            Box::new(|q| q.options.replications = 1),
        ),
        (
            "candidate_instance_ids (empty: every instance)",
            Box::new(|q| {
                q.options.replications = 1;
                q.options.horizon_us = 1_000;
            }),
        ),
    ];
    for (field, edit) in &over {
        let mut q = good();
        edit(&mut q);
        match ValidRouting::new(q, &snapshot, &small) {
            Err(TwinError::OverLimit(message)) => {
                assert!(message.starts_with(&format!("{field}: ")), "{message}")
            }
            other => panic!("{field}: expected OverLimit, got {other:?}"),
        }
    }
    let mut q = good();
    q.options.max_signal_age_us = None;
    let valid = ValidRouting::new(q, &snapshot, &Limits::DEFAULT).unwrap();
    assert_eq!(valid.candidates(), &[0, 1, 2]);
    assert_eq!(
        valid.max_signal_age_us(),
        snapshot.settings.max_signal_age_us
    );
    assert_eq!(valid.generation(), snapshot.generation);
    // A checked question runs only on the snapshot it was checked against.
    let mut other = snapshot.clone();
    other.generation += 1;
    match ditto::twin::predict::predict_valid(&other, &valid, &Limits::DEFAULT) {
        Err(TwinError::InvalidField { path, .. }) => assert_eq!(path, "snapshot_generation"),
        other => panic!("expected InvalidField, got {other:?}"),
    }
}
