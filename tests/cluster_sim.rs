//! The cluster: routing, admission and stale signals over many instances, checked against
//! hand-built scenarios and a randomized policy matrix.
#![allow(clippy::unwrap_used)]

use ditto::cluster::config::{
    AdmissionPolicy, ClusterConfig, InstanceConfig, InstanceRole, Picker, PrefixMode,
    RoutingPolicy, Scorer, Signal, StalenessConfig, WeightedScorer,
};
use ditto::cluster::disagg::{
    DEFAULT_HOLD_TIMEOUT_US, DisaggConfig, InstanceKv, PdDecider, PdFaults, StageOrder,
    TransferModel,
};
use ditto::cluster::{Cluster, spec};
use ditto::sim::latency::{BlackboxCoefficients, LatencyModel};
use ditto::sim::{Engine, EngineConfig, RequestSpec, SchedulingPolicy, SloClass};
use proptest::prelude::*;

fn model() -> LatencyModel {
    LatencyModel::Blackbox(BlackboxCoefficients {
        alpha: [0.0, 0.0, 0.0],
        beta: [1000.0, 1.0, 10.0],
    })
}

fn instance(index: usize, engine: EngineConfig) -> InstanceConfig {
    InstanceConfig {
        id: format!("i{index}"),
        model: "test".into(),
        model_config_json: None,
        gpu: "test".into(),
        tp: 1,
        role: InstanceRole::Both,
        engine,
        latency: model(),
        cost_per_hour: 1.0,
    }
}

fn engine_config(blocks: u32, max_num_seqs: u32) -> EngineConfig {
    let mut config = EngineConfig::vllm_defaults(blocks, 100_000);
    config.max_num_seqs = max_num_seqs;
    config.kv_sample_interval_us = 0;
    config
}

fn cluster_config(
    count: usize,
    routing: RoutingPolicy,
    staleness: StalenessConfig,
) -> ClusterConfig {
    ClusterConfig {
        instances: (0..count)
            .map(|i| instance(i, engine_config(10_000, 256)))
            .collect(),
        routing,
        admission: AdmissionPolicy::Always,
        staleness,
    }
}

fn queue_only() -> RoutingPolicy {
    RoutingPolicy::Weighted {
        scorers: vec![WeightedScorer {
            scorer: Scorer::QueueDepth,
            weight: 1.0,
        }],
        picker: Picker::MaxScore,
    }
}

fn precise_prefix_profile() -> RoutingPolicy {
    RoutingPolicy::Weighted {
        scorers: vec![
            WeightedScorer {
                scorer: Scorer::QueueDepth,
                weight: 2.0,
            },
            WeightedScorer {
                scorer: Scorer::KvCacheUtilization,
                weight: 2.0,
            },
            WeightedScorer {
                scorer: Scorer::PrefixCache(PrefixMode::Precise),
                weight: 3.0,
            },
        ],
        picker: Picker::MaxScore,
    }
}

#[test]
fn staleness_boundary_is_exact() {
    let mut config = cluster_config(
        1,
        RoutingPolicy::RoundRobin,
        StalenessConfig::uniform(50_000),
    );
    config.instances[0].engine.max_num_seqs = 1;
    let mut cluster = Cluster::new(config, 1).unwrap();
    for id in 0..3 {
        cluster
            .submit(RequestSpec::synthetic(id, 10_000, 100, 5_000))
            .unwrap();
    }
    cluster.run_until(49_999);
    // Live: one running, two waiting. Seen: the capture at t=0 (empty).
    assert_eq!(cluster.engines()[0].counts().queued, 2);
    assert_eq!(
        cluster.signal_views()[0].queue_depth,
        0,
        "read at refresh + interval - 1"
    );
    assert_eq!(cluster.refreshed_at(0, Signal::QueueDepth), 0);
    cluster.run_until(50_000);
    assert_eq!(
        cluster.signal_views()[0].queue_depth,
        2,
        "read at refresh + interval"
    );
    assert_eq!(cluster.signal_views()[0].running, 1);
    assert_eq!(cluster.refreshed_at(0, Signal::QueueDepth), 50_000);
}

#[test]
fn zero_interval_reads_live() {
    let mut config = cluster_config(1, RoutingPolicy::RoundRobin, StalenessConfig::uniform(0));
    config.instances[0].engine.max_num_seqs = 1;
    let mut cluster = Cluster::new(config, 1).unwrap();
    for id in 0..3 {
        cluster
            .submit(RequestSpec::synthetic(id, 10_000, 100, 5_000))
            .unwrap();
    }
    cluster.run_until(10_001);
    assert_eq!(cluster.signal_views()[0].queue_depth, 2);
    assert_eq!(cluster.signal_views()[0].running, 1);
    assert!(cluster.signal_views()[0].kv_usage > 0.0);
}

/// Instances 1..3 hold a queue at t=0, instance 0 is empty; then a burst of simultaneous
/// arrivals comes in.
fn herd_cluster(interval_us: u64) -> Cluster {
    herd_cluster_with(queue_only(), interval_us)
}

/// Four instances of one sequence each, instances 1-3 already holding 5 long requests (1
/// running, 4 waiting), then a burst of 12 at 1 ms routed by `routing`.
fn herd_cluster_with(routing: RoutingPolicy, interval_us: u64) -> Cluster {
    let config = {
        let mut config = cluster_config(4, routing, StalenessConfig::uniform(interval_us));
        for instance in &mut config.instances {
            instance.engine.max_num_seqs = 1;
        }
        config
    };
    let engines: Vec<Engine> = config
        .instances
        .iter()
        .enumerate()
        .map(|(index, instance)| {
            let mut engine =
                Engine::new(instance.engine.clone(), instance.latency.clone()).unwrap();
            if index > 0 {
                for id in 0..5 {
                    engine
                        .submit(RequestSpec::synthetic(
                            1000 * index as u64 + id,
                            0,
                            50,
                            10_000,
                        ))
                        .unwrap();
                }
                engine.run_until(0);
            }
            engine
        })
        .collect();
    let mut cluster = Cluster::from_engines(config, engines, 7);
    for id in 0..12 {
        cluster
            .submit(RequestSpec::synthetic(id, 1_000, 50, 10))
            .unwrap();
    }
    cluster.run_until(1_000);
    cluster
}

#[test]
fn stale_queue_depth_herds_a_burst_onto_one_instance() {
    let cluster = herd_cluster(50_000);
    assert_eq!(
        cluster.routed_counts(),
        &[12, 0, 0, 0],
        "every request sees the same stale best"
    );
}

#[test]
fn vllm_data_parallel_adds_four_a_request_until_the_next_report() {
    // vLLM's balancer on the same burst, the counts 50 ms stale: instance 0 scores 4 per
    // request sent since the report, the others 4 · 4 waiting + 1 running = 17 plus 4 per
    // request: 0, 4, 8, 12, 16 go to instance 0, then 17, 17, 17 to 1-3, then 20 to 0 and
    // 21, 21, 21 to 1-3 (the first minimum wins ties).
    let cluster = herd_cluster_with(RoutingPolicy::VllmDataParallel, 50_000);
    assert_eq!(cluster.routed_counts(), &[6, 2, 2, 2]);
}

#[test]
fn live_queue_depth_spreads_the_burst() {
    let cluster = herd_cluster(0);
    let routed = cluster.routed_counts();
    assert!(routed[0] < 12, "live signals see each dispatch: {routed:?}");
    assert!(routed[1..].iter().sum::<u32>() > 0, "{routed:?}");
}

#[test]
fn precise_prefix_routes_to_the_instance_holding_the_prefix() {
    let config = cluster_config(
        4,
        precise_prefix_profile(),
        StalenessConfig::uniform(50_000),
    );
    // Warm instance 2 with group 7's 1024-token prefix.
    let engines: Vec<Engine> = config
        .instances
        .iter()
        .enumerate()
        .map(|(index, instance)| {
            let mut engine =
                Engine::new(instance.engine.clone(), instance.latency.clone()).unwrap();
            if index == 2 {
                engine
                    .run(
                        [RequestSpec::synthetic(9_999, 0, 1100, 4).with_prefix(7, 1024)],
                        u64::MAX,
                    )
                    .unwrap();
            }
            engine
        })
        .collect();
    let mut cluster = Cluster::from_engines(config, engines, 3);
    let start = cluster.now_us() + 100_000;
    let requests: Vec<RequestSpec> = (0..10)
        .map(|i| RequestSpec::synthetic(i, start + i * 200_000, 1100, 4).with_prefix(7, 1024))
        .collect();
    cluster.run(requests, u64::MAX).unwrap();
    assert_eq!(cluster.routed_counts(), &[0, 0, 10, 0]);
    let hits = cluster.engines()[2].kv().stats().hit_tokens;
    assert!(
        hits >= 10 * 1024,
        "every request hit the shared prefix ({hits} tokens)"
    );
}

#[test]
fn one_shared_prefix_starves_cold_instances_under_the_default_profile() {
    // Documented behaviour (docs/cluster.md): with llm-d's default profile (prefix weight 3 of
    // 7) and every request sharing one long prefix, the instances that received the prefix
    // first keep winning, and cold instances get nothing; without the prefix scorer the
    // load spreads over every instance. BLIS reports the same effect.
    let requests = || -> Vec<RequestSpec> {
        (0..300)
            .map(|i| RequestSpec::synthetic(i, i * 50_000, 712, 200).with_prefix(1, 512))
            .collect()
    };
    let mut with_prefix = Cluster::new(
        cluster_config(
            4,
            RoutingPolicy::llm_d_default(),
            StalenessConfig::uniform(50_000),
        ),
        1,
    )
    .unwrap();
    with_prefix.run(requests(), u64::MAX).unwrap();
    let starved = with_prefix
        .routed_counts()
        .iter()
        .filter(|&&n| n == 0)
        .count();
    assert!(
        starved >= 1,
        "cold instances should starve: {:?}",
        with_prefix.routed_counts()
    );

    let no_prefix = RoutingPolicy::Weighted {
        scorers: vec![
            WeightedScorer {
                scorer: Scorer::QueueDepth,
                weight: 2.0,
            },
            WeightedScorer {
                scorer: Scorer::KvCacheUtilization,
                weight: 2.0,
            },
        ],
        picker: Picker::MaxScore,
    };
    let mut without = Cluster::new(
        cluster_config(4, no_prefix, StalenessConfig::uniform(50_000)),
        1,
    )
    .unwrap();
    without.run(requests(), u64::MAX).unwrap();
    assert!(
        without.routed_counts().iter().all(|&n| n > 0),
        "{:?}",
        without.routed_counts()
    );
}

#[test]
fn saturation_shedding_rejects_only_sheddable_requests_when_saturated() {
    let mut config = cluster_config(2, RoutingPolicy::RoundRobin, StalenessConfig::uniform(0));
    config.admission = AdmissionPolicy::SaturationShedding {
        queue_threshold: 5.0,
        kv_threshold: 0.8,
    };
    for instance in &mut config.instances {
        instance.engine.max_num_seqs = 1;
    }
    let mut cluster = Cluster::new(config, 1).unwrap();
    // 14 long critical requests saturate both queues (6 waiting each >= 5).
    let mut requests: Vec<RequestSpec> = (0..14)
        .map(|i| RequestSpec::synthetic(i, 0, 50, 1000).with_class(SloClass::Critical))
        .collect();
    requests.push(RequestSpec::synthetic(100, 1_000, 50, 10).with_class(SloClass::Sheddable));
    requests.push(RequestSpec::synthetic(101, 1_000, 50, 10).with_class(SloClass::Standard));
    cluster.run(requests, u64::MAX).unwrap();
    let rejected: Vec<u64> = cluster.rejected_records().iter().map(|r| r.id.0).collect();
    assert_eq!(rejected, vec![100]);
    assert!(cluster.counts().is_conserved());
}

#[test]
fn single_instance_cluster_matches_the_bare_engine() {
    let requests: Vec<RequestSpec> = (0..300)
        .map(|i| {
            RequestSpec::synthetic(
                i,
                i * 7_000,
                50 + (i as u32 * 37) % 900,
                1 + (i as u32 * 13) % 300,
            )
            .with_prefix(i % 3, 64)
        })
        .collect();
    let config = cluster_config(
        1,
        RoutingPolicy::llm_d_default(),
        StalenessConfig::uniform(50_000),
    );
    let mut engine = Engine::new(config.instances[0].engine.clone(), model()).unwrap();
    engine.run(requests.clone(), u64::MAX).unwrap();
    let mut cluster = Cluster::new(config, 5).unwrap();
    cluster.run(requests, u64::MAX).unwrap();
    assert_eq!(
        cluster.engines()[0].metrics().records,
        engine.metrics().records
    );
    assert_eq!(cluster.summary().total.ttft, engine.summary().ttft);
}

fn mixed_requests(count: u64) -> Vec<RequestSpec> {
    (0..count)
        .map(|i| {
            RequestSpec::synthetic(
                i,
                i * 4_000,
                50 + (i as u32 * 37) % 700,
                1 + (i as u32 * 13) % 200,
            )
            .with_prefix(i % 5, 128)
            .with_class(SloClass::ALL[(i % 5) as usize])
        })
        .collect()
}

#[test]
fn cluster_runs_are_deterministic_and_forkable() {
    let config = cluster_config(
        3,
        RoutingPolicy::llm_d_default(),
        StalenessConfig::uniform(50_000),
    );
    let requests = mixed_requests(400);
    let mut a = Cluster::new(config.clone(), 11).unwrap();
    let mut b = Cluster::new(config.clone(), 11).unwrap();
    a.run(requests.clone(), u64::MAX).unwrap();
    b.run(requests.clone(), u64::MAX).unwrap();
    assert_eq!(a.summary(), b.summary());
    assert_eq!(a.routed_counts(), b.routed_counts());

    let mut original = Cluster::new(config.clone(), 11).unwrap();
    let (first, rest) = requests.split_at(200);
    for spec in first.iter().cloned() {
        original.run_before(spec.arrival_us);
        original.submit(spec).unwrap();
    }
    let mut fork = original.clone();
    original.run(rest.iter().cloned(), u64::MAX).unwrap();
    fork.run(rest.iter().cloned(), u64::MAX).unwrap();
    assert_eq!(original.summary(), fork.summary());
    assert_eq!(
        original.summary(),
        a.summary(),
        "a fork mid-run changes nothing"
    );
    for (x, y) in original.engines().iter().zip(fork.engines()) {
        assert_eq!(x.metrics().records, y.metrics().records);
    }
    // Another seed may route differently (random tie-breaks), but conserves all the same.
    let mut c = Cluster::new(config, 12).unwrap();
    c.run(requests, u64::MAX).unwrap();
    assert!(c.counts().is_conserved());
}

#[test]
fn default_cluster_file_is_valid() {
    let config = spec::default_cluster();
    assert_eq!(config.instances.len(), 4);
    assert!(
        config
            .instances
            .iter()
            .all(|i| i.model == "llama-3.1-8b-instruct" && i.gpu == "H100")
    );
    assert_eq!(config.instances[0].engine.num_gpu_blocks, 26_312);
    assert_eq!(config.routing, RoutingPolicy::llm_d_default());
    assert_eq!(config.staleness, StalenessConfig::uniform(50_000));
}

#[test]
fn cluster_yaml_errors_name_the_field() {
    let cases = [
        ("pools: []", "pools"),
        ("pools: [{name: a, replicas: 0}]", "pools[0].replicas"),
        ("pools: [{name: a, model: nope}]", "pools[0].model"),
        (
            "pools: [{name: a, engine: {max_num_seqs: 0}}]",
            "pools[0].engine.max_num_seqs",
        ),
        (
            "pools: [{name: a, engine: {scheduling_policy: lifo}}]",
            "pools[0].engine.scheduling_policy",
        ),
        (
            "pools: [{name: a}]\nrouting: {policy: weighted, scorers: [{name: magic, weight: 1}]}",
            "routing.scorers[0].name",
        ),
        (
            "pools: [{name: a}]\nrouting: {policy: fastest}",
            "routing.policy",
        ),
        (
            "pools: [{name: a}]\nadmission: {policy: token-bucket, capacity_tokens: -1}",
            "admission.capacity_tokens",
        ),
        (
            "pools: [{name: a}]\nstaleness: {refresh_interval_ms: -5}",
            "staleness.refresh_interval_ms",
        ),
        ("pools: [{name: a, colour: blue}]", "colour"),
    ];
    for (yaml, field) in cases {
        let err = spec::parse_cluster_yaml(yaml).unwrap_err().to_string();
        assert!(err.contains(field), "{yaml:?}: {err}");
    }
}

// === Randomized policy matrix ===

fn routing_strategy() -> impl Strategy<Value = RoutingPolicy> {
    prop_oneof![
        Just(RoutingPolicy::RoundRobin),
        Just(RoutingPolicy::Random),
        Just(RoutingPolicy::LeastLoaded),
        Just(RoutingPolicy::VllmDataParallel),
        Just(RoutingPolicy::llm_d_default()),
        Just(precise_prefix_profile()),
        Just(RoutingPolicy::Weighted {
            scorers: vec![
                WeightedScorer {
                    scorer: Scorer::LoadAware { threshold: 8 },
                    weight: 1.0
                },
                WeightedScorer {
                    scorer: Scorer::ActiveRequests,
                    weight: 1.0
                },
                WeightedScorer {
                    scorer: Scorer::RunningRequests,
                    weight: 1.0
                },
                WeightedScorer {
                    scorer: Scorer::PrefixCache(PrefixMode::Approximate {
                        blocks_per_instance: 16
                    }),
                    weight: 1.0
                },
            ],
            picker: Picker::WeightedRandom,
        }),
    ]
}

fn admission_strategy() -> impl Strategy<Value = AdmissionPolicy> {
    prop_oneof![
        Just(AdmissionPolicy::Always),
        Just(AdmissionPolicy::TokenBucket {
            capacity_tokens: 800.0,
            refill_tokens_per_s: 20_000.0
        }),
        Just(AdmissionPolicy::SaturationShedding {
            queue_threshold: 2.0,
            kv_threshold: 0.5
        }),
    ]
}

fn staleness_strategy() -> impl Strategy<Value = StalenessConfig> {
    prop_oneof![
        Just(StalenessConfig::uniform(0)),
        Just(StalenessConfig::uniform(50_000)),
        Just(StalenessConfig {
            queue_depth_us: 3_000,
            running_us: 0,
            kv_usage_us: 10_000,
            prefix_cache_us: 7_000
        }),
    ]
}

prop_compose! {
    fn scenario()(
        count in 1usize..5,
        routing in routing_strategy(),
        admission in admission_strategy(),
        staleness in staleness_strategy(),
        blocks in 20u32..200,
        seqs in 1u32..8,
        policy in 0usize..3,
        raw in prop::collection::vec((0u64..4_000, 1u32..250, 0u32..60, 0u64..3, 0usize..5, any::<bool>()), 1..40),
        seed in any::<u64>(),
    ) -> (ClusterConfig, Vec<RequestSpec>, u64) {
        let mut engine = engine_config(blocks, seqs);
        engine.scheduling_policy = [SchedulingPolicy::Fcfs, SchedulingPolicy::Priority, SchedulingPolicy::Sjf][policy];
        let config = ClusterConfig {
            instances: (0..count).map(|i| instance(i, engine.clone())).collect(),
            routing,
            admission,
            staleness,
        };
        let mut arrival = 0;
        let requests = raw
            .into_iter()
            .enumerate()
            .map(|(id, (gap, input, output, group, class, deadline))| {
                arrival += gap;
                let mut spec = RequestSpec::synthetic(id as u64, arrival, input, output)
                    .with_prefix(group, 64)
                    .with_class(SloClass::ALL[class]);
                if deadline {
                    spec.deadline_us = Some(arrival + 30_000);
                }
                spec
            })
            .collect();
        (config, requests, seed)
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, .. ProptestConfig::default() })]

    #[test]
    fn conservation_and_kv_hold_across_the_policy_matrix((config, requests, seed) in scenario()) {
        let total = requests.len() as u64;
        let mut cluster = Cluster::new(config, seed).unwrap();
        let mut pending = requests.into_iter().peekable();
        let mut last = 0;
        let mut events = 0u64;
        loop {
            if let Some(spec) = pending.next_if(|s| cluster.next_event_us().is_none_or(|t| s.arrival_us <= t)) {
                cluster.submit(spec).unwrap();
                continue;
            }
            if cluster.process_next_event().is_none() {
                break;
            }
            events += 1;
            prop_assert!(events < 2_000_000, "livelock");
            prop_assert!(cluster.now_us() >= last, "cluster clock went back");
            last = cluster.now_us();
            if let Err(violation) = cluster.check_invariants() {
                prop_assert!(false, "after event {}: {}", events, violation);
            }
        }
        let counts = cluster.counts();
        prop_assert!(counts.is_conserved());
        prop_assert_eq!(counts.injected, total);
        prop_assert_eq!(counts.queued + counts.running, 0);
        prop_assert!(cluster.in_flight().iter().all(|&n| n == 0), "in-flight counts leak: {:?}", cluster.in_flight());
        for engine in cluster.engines() {
            prop_assert_eq!(engine.kv().used_blocks(), 0);
        }
        let summary = cluster.summary();
        prop_assert_eq!(summary.total.counts, counts);
    }
}

prop_compose! {
    /// The matrix over disaggregated pools: instance 0 decodes, instance 1 prefills, the
    /// rest either; llm-d's decider at a random threshold (0: off), a random prefill
    /// profile, random transfer costs and KV geometry.
    fn pd_scenario()(
        (config, requests, seed) in scenario(),
        extra_roles in prop::collection::vec(any::<bool>(), 3),
        non_cached_tokens in 0u32..64,
        prefill_routing in routing_strategy(),
        bandwidth_gb_s in 0.5f64..50.0,
        descriptor_us in 0.0f64..3.0,
        setup_us in 0u64..2_000,
        bytes_per_token in 1_000.0f64..200_000.0,
        layers in 1u32..80,
    ) -> (ClusterConfig, DisaggConfig, Vec<RequestSpec>, u64) {
        let mut config = config;
        while config.instances.len() < 2 {
            let engine = config.instances[0].engine.clone();
            config.instances.push(instance(config.instances.len(), engine));
        }
        for (index, instance) in config.instances.iter_mut().enumerate() {
            instance.role = match index {
                0 => InstanceRole::Decode,
                1 => InstanceRole::Prefill,
                _ if extra_roles[index - 2] => InstanceRole::Decode,
                _ => InstanceRole::Prefill,
            };
        }
        let kv = InstanceKv { bytes_per_token_per_rank: bytes_per_token, layers, planes: 2, tp: 1, block_size: 16 };
        let disagg = DisaggConfig {
            decider: PdDecider { non_cached_tokens, prompt_tokens: 0 },
            prefill_routing,
            transfer: TransferModel { bandwidth_gb_s, descriptor_us, setup_us },
            kv: vec![kv; config.instances.len()],
            hold_timeout_us: DEFAULT_HOLD_TIMEOUT_US,
            stage_order: StageOrder::DecodeFirst,
            faults: PdFaults::NONE,
        };
        (config, disagg, requests, seed)
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, .. ProptestConfig::default() })]

    #[test]
    fn pd_pools_keep_every_invariant_across_the_policy_matrix((config, disagg, requests, seed) in pd_scenario()) {
        let total = requests.len() as u64;
        let mut cluster = Cluster::new_disaggregated(config, disagg, seed).unwrap();
        let mut events = 0u64;
        for spec in requests {
            cluster.submit(spec).unwrap();
        }
        while cluster.process_next_event().is_some() {
            events += 1;
            prop_assert!(events < 2_000_000, "livelock");
            if let Err(violation) = cluster.check_invariants() {
                prop_assert!(false, "after event {}: {}", events, violation);
            }
        }
        let counts = cluster.counts();
        prop_assert!(counts.is_conserved(), "{:?}", counts);
        prop_assert_eq!(counts.injected, total);
        prop_assert_eq!(counts.queued + counts.running, 0, "requests stuck: {:?}", counts);
        prop_assert!(cluster.in_flight().iter().all(|&n| n == 0), "in-flight counts leak: {:?}", cluster.in_flight());
        for engine in cluster.engines() {
            prop_assert_eq!(engine.kv().used_blocks(), 0);
        }
        let summary = cluster.summary();
        prop_assert_eq!(summary.total.counts, counts);
        let disagg = summary.disaggregation.unwrap();
        prop_assert_eq!(disagg.disaggregated + disagg.decode_only + counts.rejected, total);
    }
}

#[test]
fn precise_prefix_works_across_pools_with_different_block_sizes() {
    // Regression: prompt keys used to be hashed with instance 0's block size for everyone.
    let mut config = cluster_config(2, precise_prefix_profile(), StalenessConfig::uniform(0));
    config.instances[1].engine.block_size = 32;
    let engines: Vec<Engine> = config
        .instances
        .iter()
        .enumerate()
        .map(|(index, instance)| {
            let mut engine =
                Engine::new(instance.engine.clone(), instance.latency.clone()).unwrap();
            if index == 1 {
                engine
                    .run(
                        [RequestSpec::synthetic(9_999, 0, 1100, 4).with_prefix(7, 1024)],
                        u64::MAX,
                    )
                    .unwrap();
            }
            engine
        })
        .collect();
    let mut cluster = Cluster::from_engines(config, engines, 3);
    let start = cluster.now_us() + 100_000;
    let requests: Vec<RequestSpec> = (0..6)
        .map(|i| RequestSpec::synthetic(i, start + i * 300_000, 1100, 4).with_prefix(7, 1024))
        .collect();
    cluster.run(requests, u64::MAX).unwrap();
    assert_eq!(cluster.routed_counts(), &[0, 6]);
}

#[test]
fn a_pool_takes_a_calibrate_files_coefficients() {
    // Goal: a platform team's own fit (the `coefficients:` map of `ditto calibrate --out`)
    // goes into the cluster YAML (the chart's `cluster:` value) and is the pool's model.
    use ditto::sim::latency::calibrated::COEFFICIENT_NAMES;
    let embedded = ditto::catalog::calibrated_coefficients().unwrap();
    let map = |step_us: f64| {
        COEFFICIENT_NAMES
            .iter()
            .zip(embedded.values)
            .map(|(name, value)| {
                let value = if *name == "step_us" { step_us } else { value };
                format!("{name}: {value}")
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    let yaml = |coefficients: &str| {
        format!(
            "pools: [{{name: a, latency_model: calibrated, calibrated_coefficients: {{{coefficients}}}}}]"
        )
    };
    let default = spec::parse_cluster_yaml("pools: [{name: a}]").unwrap();
    let same = spec::parse_cluster_yaml(&yaml(&map(embedded.values[4]))).unwrap();
    let slower = spec::parse_cluster_yaml(&yaml(&map(embedded.values[4] + 5_000.0))).unwrap();
    assert_eq!(same.instances[0].latency, default.instances[0].latency);
    assert_ne!(slower.instances[0].latency, default.instances[0].latency);
    // Errors name the field.
    let missing = map(1.0).replace("queue_us: ", "queue_ux: ");
    let err = spec::parse_cluster_yaml(&yaml(&missing))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("pools[0].calibrated_coefficients.queue_ux"),
        "{err}"
    );
    let physics = yaml(&map(1.0)).replace("latency_model: calibrated", "latency_model: physics");
    let err = spec::parse_cluster_yaml(&physics).unwrap_err().to_string();
    assert!(err.contains("pools[0].calibrated_coefficients"), "{err}");
}

#[test]
fn vllm_data_parallel_with_live_counts_reads_them_alone() {
    // Live signals count each dispatch at once (a request sent waits until the next
    // step), so nothing is added for requests sent: the burst splits as with stale counts
    // plus the tally, [6, 2, 2, 2]. Adding the tally to live counts would count each
    // request twice (8 a request on instance 0: [5, 3, 2, 2]).
    let cluster = herd_cluster_with(RoutingPolicy::VllmDataParallel, 0);
    assert_eq!(cluster.routed_counts(), &[6, 2, 2, 2]);
}
