//! Regression tests for problems found in review (each names what it guards).
#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use ditto::bench::{whatif_question, whatif_snapshot};
use ditto::cluster::spec;
use ditto::sim::engine::{RestoreState, RestoredRequest};
use ditto::sim::{Engine, PromptContent, RequestSpec, SchedulingPolicy};
use ditto::twin::forecast::forecast_capacity;
use ditto::twin::predict::{Forking, predict_routing, predict_routing_with};
use ditto::twin::question::{
    Background, ForecastQuestion, ForecastStart, SloTargets, StalePolicy, VariantCandidates,
};
use ditto::twin::sampling::{conditioned_length, stream};
use ditto::twin::snapshot::{
    InstanceState, MirrorSnapshot, ObservedRequest, TrafficStats, TwinSettings,
};
use ditto::twin::{Limits, TwinError};
use ditto::workload::{LengthDist, Stage};

fn snapshot_with(instances: Vec<InstanceState>, priority_policy: bool) -> MirrorSnapshot {
    let mut config = spec::default_cluster();
    if priority_policy {
        for instance in &mut config.instances {
            instance.engine.scheduling_policy = SchedulingPolicy::Priority;
        }
    }
    MirrorSnapshot {
        generation: 1,
        config_generation: 1,
        instances: config
            .instances
            .iter()
            .zip(instances)
            .map(|(c, mut s)| {
                s.instance_id = c.id.clone();
                Arc::new(s)
            })
            .collect(),
        config: Arc::new(config),
        settings: Arc::new(TwinSettings::defaults()),
        traffic: Arc::new(TrafficStats::default()),
        memo: Default::default(),
    }
}

fn waiting(id: usize, prompt: u32, output: u32, at: u64) -> ObservedRequest {
    ObservedRequest {
        request_id: format!("w{id}"),
        arrival_us: at,
        prompt_tokens: prompt,
        computed_tokens: 0,
        cached_tokens: 0,
        output_tokens: 0,
        max_tokens: 4096,
        known_output_tokens: Some(output),
        priority: 1,
        slo_class: ditto::sim::SloClass::Standard,
        scheduled_tokens: 0,
        block_hashes: Vec::new(),
        token_ids: None,
    }
}

fn idle(observed_at_us: u64) -> InstanceState {
    InstanceState {
        observed_at_us,
        ..InstanceState::default()
    }
}

#[test]
fn roll_forward_is_bounded_by_the_event_budget() {
    // An instance observed long ago with a lot of queued work: rolling it forward to `now`
    // alone needs far more events than the budget allows (it used to run unbounded).
    let busy = InstanceState {
        observed_at_us: 1_000_000,
        waiting: (0..2000).map(|i| waiting(i, 500, 1000, 900_000)).collect(),
        ..InstanceState::default()
    };
    let snapshot = snapshot_with(
        vec![
            busy,
            idle(999_000_000),
            idle(999_000_000),
            idle(999_000_000),
        ],
        false,
    );
    let mut question = whatif_question(1);
    question.now_us = 1_000_000_000;
    question.candidates = vec!["vllm-0".into()];
    question.options.stale_policy = Some(StalePolicy::RollForward);
    let limits = Limits {
        max_events_per_call: 5_000,
        ..Limits::DEFAULT
    };
    assert!(matches!(
        predict_routing(&snapshot, &question, &limits),
        Err(TwinError::EventBudget { .. })
    ));
    // With room, the same question is answered.
    assert!(predict_routing(&snapshot, &question, &Limits::DEFAULT).is_ok());
}

#[test]
fn duplicate_block_keys_are_refused_not_a_panic() {
    let mut spec = RequestSpec::synthetic(1, 0, 64, 4);
    spec.content = PromptContent::BlockKeys(vec![7, 7].into());
    let state = RestoreState {
        now_us: 10,
        running: vec![RestoredRequest {
            spec,
            computed_tokens: 40,
            generated: 0,
            cached_tokens: 0,
            scheduled_tokens: 0,
            client_lag_us: 0,
        }],
        cached_keys: vec![7],
        ..RestoreState::default()
    };
    let config = spec::default_cluster().instances[0].clone();
    match Engine::restore(config.engine, config.latency, state) {
        Err(err) => assert!(err.to_string().contains("appears twice"), "{err}"),
        Ok(_) => panic!("duplicate keys were accepted"),
    }

    let snapshot = whatif_snapshot(true);
    let mut question = whatif_question(1);
    question.request.block_hashes = vec![1, 2, 1];
    assert!(matches!(
        predict_routing(&snapshot, &question, &Limits::DEFAULT),
        Err(TwinError::InvalidField { path, .. }) if path == "request.block_hashes"
    ));
}

#[test]
fn forecast_rerouting_under_priority_scheduling_loses_nothing() {
    // Equal priority, arrival and prompt on every instance: rerouted requests used to share
    // engine ids and collide in the priority queue (panic in debug, a lost request in release).
    let busy = |_: usize| InstanceState {
        observed_at_us: 1_000_000,
        waiting: (0..3).map(|i| waiting(i, 300, 20, 900_000)).collect(),
        ..InstanceState::default()
    };
    let snapshot = snapshot_with((0..4).map(busy).collect(), true);
    let question = ForecastQuestion {
        start: ForecastStart::Snapshot,
        stages: vec![Stage {
            rate: 1.0,
            duration_s: 2.0,
        }],
        input_tokens: LengthDist::constant(300),
        output_tokens: LengthDist::constant(20),
        variants: vec![VariantCandidates {
            template_instance_id: "vllm-0".into(),
            replica_counts: vec![1],
        }],
        max_cost_per_hour: 0.0,
        slo: SloTargets::default(),
        target_attainment: 0.5,
        replications: 1,
        quantiles: vec![0.5],
        seed: 1,
        now_us: 1_000_000,
    };
    let answer = forecast_capacity(&snapshot, &question, &Limits::DEFAULT).unwrap();
    assert_eq!(answer.candidates.len(), 1);
}

#[test]
fn ttft_is_known_even_if_the_request_outlives_the_horizon() {
    let snapshot = whatif_snapshot(true);
    let mut question = whatif_question(1);
    question.request.prompt_tokens = 1000;
    question.request.output = ditto::twin::question::OutputLength::Point(3000);
    question.request.max_tokens = 3000;
    question.options.horizon_us = 5_000_000;
    question.request.slo = SloTargets {
        ttft_ms: Some(4_000.0),
        tpot_ms: None,
        e2e_ms: None,
    };
    let answer = predict_routing(&snapshot, &question, &Limits::DEFAULT).unwrap();
    for candidate in &answer.candidates {
        assert!(
            candidate.ttft_ms.mean < 4_000.0,
            "{}: {}",
            candidate.instance_id,
            candidate.ttft_ms.mean
        );
        assert_eq!(candidate.ttft_slo_probability, 1.0);
        assert_eq!(
            candidate.e2e_ms.mean, 5_000.0,
            "E2E is censored at the horizon"
        );
    }
}

#[test]
fn a_request_no_instance_can_hold_is_invalid_everywhere() {
    let snapshot = whatif_snapshot(true);
    let mut question = whatif_question(1);
    question.request.prompt_tokens = 500_000;
    let answer = predict_routing(&snapshot, &question, &Limits::DEFAULT).unwrap();
    assert!(
        answer
            .candidates
            .iter()
            .all(|c| !c.valid && c.invalid_reason.contains("cannot serve"))
    );
    assert_eq!(answer.recommended_instance_id, None);
}

#[test]
fn requests_past_the_distribution_are_not_assumed_to_end_at_once() {
    let draw = LengthDist::gaussian(256.0, 128.0, 1, 4096)
        .compile("x")
        .unwrap();
    let mut rng = stream(3, 0, "t");
    let samples: Vec<u32> = (0..400)
        .map(|_| conditioned_length(&draw, 900, 100_000, &mut rng))
        .collect();
    assert!(samples.iter().all(|&s| s > 900));
    let at_once = samples.iter().filter(|&&s| s == 901).count();
    assert!(
        at_once < 40,
        "{at_once} of 400 predicted to end on the next token"
    );
}

#[test]
fn forecast_variants_configured_alike_are_refused() {
    // Two templates configured identically would both claim the same instances' requests.
    let snapshot = snapshot_with((0..4).map(|_| idle(1_000_000)).collect(), false);
    let variant = |id: &str| VariantCandidates {
        template_instance_id: id.into(),
        replica_counts: vec![1],
    };
    let question = ForecastQuestion {
        start: ForecastStart::Snapshot,
        stages: vec![Stage {
            rate: 1.0,
            duration_s: 2.0,
        }],
        input_tokens: LengthDist::constant(300),
        output_tokens: LengthDist::constant(20),
        variants: vec![variant("vllm-0"), variant("vllm-1")],
        max_cost_per_hour: 0.0,
        slo: SloTargets::default(),
        target_attainment: 0.5,
        replications: 1,
        quantiles: vec![0.5],
        seed: 1,
        now_us: 1_000_000,
    };
    assert!(matches!(
        forecast_capacity(&snapshot, &question, &Limits::DEFAULT),
        Err(TwinError::InvalidField { path, .. }) if path == "variants[1].template_instance_id"
    ));
}

/// The per-snapshot memo (restored engines, baseline forks) never changes an answer: a
/// question asked again on a warm snapshot, or a new question on it, gets exactly the answer
/// a fresh copy of the snapshot gives, for fresh signals and for stale ones taken as they are
/// (use-last), with sampled lengths.
#[test]
fn memoised_forks_answer_exactly_as_fresh_ones() {
    let snapshot = whatif_snapshot(false);
    let fresh = whatif_question(3);
    let mut stale = whatif_question(3);
    stale.now_us += 500_000;
    stale.options.stale_policy = Some(StalePolicy::UseLast);
    let mut other = whatif_question(2);
    other.request.prompt_tokens = 300;
    // A gateway asks at a new "now" each time (here later, then earlier again).
    let mut later = whatif_question(3);
    later.now_us += 40_000;
    let mut between = whatif_question(3);
    between.now_us += 15_000;
    // Short horizons cut the baseline mid-run: a question reads exactly its own window of a
    // recording made for another (and a longer horizon then records further).
    let mut short = whatif_question(3);
    short.options.horizon_us = 2_000_000;
    let mut short_later = short.clone();
    short_later.now_us += 40_000;
    for question in [
        &short,
        &short_later,
        &fresh,
        &stale,
        &other,
        &fresh,
        &later,
        &between,
    ] {
        let warm = shortcuts_equal_plain(&snapshot, question, "shortcuts changed an answer");
        let cold = predict_routing(&snapshot.clone(), question, &Limits::DEFAULT).unwrap();
        assert_eq!(warm, cold);
    }
    // Baselines: 4 candidates x 3 replications shared by every fresh question whatever its
    // "now", plus those of the use-last question, which start at its own "now".
    assert_eq!(snapshot.memo.len(), 4 * 3 + 4 * 3, "baselines are shared");
}

/// Answers `question` with the shortcuts and plainly (on a fresh copy of `snapshot`, so no
/// memo is shared), asserts the two are equal, and returns the shortcut answer.
fn shortcuts_equal_plain(
    snapshot: &MirrorSnapshot,
    question: &ditto::twin::question::RoutingQuestion,
    case: &str,
) -> ditto::twin::question::RoutingAnswer {
    let shortcut = predict_routing(snapshot, question, &Limits::DEFAULT).unwrap();
    let plain = predict_routing_with(
        &snapshot.clone(),
        question,
        &Limits::DEFAULT,
        Forking::Plain,
    )
    .unwrap();
    assert_eq!(shortcut, plain, "{case}");
    shortcut
}

/// Late entry (forks started where the question's request is first reached, from remembered
/// checkpoints) answers exactly as submitting the request at "now" and simulating from the
/// observation, under priority scheduling too (a request of higher priority is reached
/// earlier than one of lower), with prefix hits on the request's prompt.
#[test]
fn late_entry_answers_exactly_as_submitting_at_now() {
    let mut snapshot = whatif_snapshot(false);
    let mut config = (*snapshot.config).clone();
    for instance in &mut config.instances[2..] {
        instance.engine.scheduling_policy = SchedulingPolicy::Priority;
    }
    snapshot.config = Arc::new(config);
    // The question's prompt shares a prefix with a request waiting on instance 1.
    let mut instances: Vec<InstanceState> =
        snapshot.instances.iter().map(|s| (**s).clone()).collect();
    let shared: Vec<u64> = (0..40).map(|i| 0xfeed_0000 + i).collect();
    instances[1].waiting[5].block_hashes = shared.clone();
    instances[1].waiting[5].prompt_tokens = 40 * 16;
    snapshot.instances = instances.into_iter().map(Arc::new).collect();
    let mut hit_tokens = 0.0;
    for (priority, offset, hashes) in [
        (1, 0, false),
        (0, 20_000, false),
        (2, 35_000, true),
        (1, 60_000, true),
        (0, 0, true),
    ] {
        let mut question = whatif_question(2);
        question.request.priority = priority;
        question.now_us += offset;
        if hashes {
            question.request.prompt_tokens = 50 * 16;
            question.request.block_hashes = shared.iter().copied().chain(0..10).collect();
        }
        let late = shortcuts_equal_plain(
            &snapshot,
            &question,
            &format!("priority {priority}, +{offset} µs, hashes {hashes}"),
        );
        hit_tokens += late.candidates[1].prefix_hit_tokens;
    }
    assert!(hit_tokens > 0.0, "the shared prefix was never hit");
    assert!(
        snapshot.memo.checkpoints() >= 4,
        "late entry never started from a checkpoint: {}",
        snapshot.memo.checkpoints()
    );
}

/// With no finished requests observed, background arrivals take the question's prompt
/// length, so a background baseline depends on it: a question differing only in its prompt
/// must not read another's baseline (found in review).
#[test]
fn background_baselines_are_not_shared_across_prompt_lengths() {
    let mut snapshot = whatif_snapshot(false);
    snapshot.traffic = Arc::new(TrafficStats {
        arrivals_per_s: 40.0,
        recent_lengths: Vec::new(),
        ..TrafficStats::default()
    });
    let mut first = whatif_question(2);
    first.options.background = Background::ObservedPoisson;
    first.options.horizon_us = 5_000_000;
    let mut second = first.clone();
    second.request.prompt_tokens = 200;
    predict_routing(&snapshot, &first, &Limits::DEFAULT).unwrap();
    let warm = predict_routing(&snapshot, &second, &Limits::DEFAULT).unwrap();
    let cold = predict_routing(&snapshot.clone(), &second, &Limits::DEFAULT).unwrap();
    assert_eq!(warm, cold);
}

/// A baseline that starts at `now` (use-last here) recorded for a long horizon and read for
/// a shorter one counts only the events within the shorter one (found in review).
#[test]
fn a_baseline_read_for_a_shorter_horizon_counts_its_events_only() {
    let snapshot = whatif_snapshot(false);
    let mut long = whatif_question(1);
    long.now_us += 500_000;
    long.options.stale_policy = Some(StalePolicy::UseLast);
    long.options.horizon_us = 3_000_000;
    let mut short = long.clone();
    short.options.horizon_us = 1_000_000;
    predict_routing(&snapshot, &long, &Limits::DEFAULT).unwrap();
    let warm = predict_routing(&snapshot, &short, &Limits::DEFAULT).unwrap();
    let cold = predict_routing(&snapshot.clone(), &short, &Limits::DEFAULT).unwrap();
    assert_eq!(warm, cold);
}

/// With a latency model whose step price counts the waiting queue (the calibrated model's
/// `waiting_us`), a request that waits unreached changes the steps it waits through, so the
/// twin must not enter it late: the answer equals the plain path's (found in review: late
/// entry was used whatever the model).
#[test]
fn late_entry_is_not_used_when_the_queue_changes_step_prices() {
    use ditto::sim::latency::calibrated::idx;
    use ditto::sim::latency::{CalibratedModel, LatencyModel};
    let mut snapshot = whatif_snapshot(false);
    let mut config = (*snapshot.config).clone();
    let mut coefficients = ditto::catalog::calibrated_coefficients().unwrap();
    coefficients.values[idx::WAITING_US] = 40.0;
    coefficients.values[idx::WAITING_CAP] = 1000.0;
    for instance in &mut config.instances {
        let arch = ditto::catalog::model(&instance.model).unwrap();
        let gpu = ditto::catalog::gpu(&instance.gpu).unwrap();
        let model = CalibratedModel::new(&arch, &gpu, instance.tp, &coefficients).unwrap();
        instance.latency = LatencyModel::Calibrated(model);
        assert!(instance.latency.prices_waiting());
    }
    snapshot.config = Arc::new(config);
    for offset in [0, 20_000, 60_000] {
        let mut question = whatif_question(2);
        question.now_us += offset;
        shortcuts_equal_plain(&snapshot, &question, &format!("+{offset} µs"));
    }
}
