//! How wrong is state rebuilt from gauges (`live::rebuild`, docs/live.md)? A cluster ditto
//! simulated is cut at several times; each instance is mirrored twice through the store:
//! exactly (its waiting/running requests as a gateway would push them, final lengths hidden)
//! and rebuilt from what its vLLM pod would publish (the two count gauges, KV usage, token
//! histograms of the requests it finished). The same routing question is answered on both;
//! the test reports the TTFT error of the rebuilt-state predictions against the exact-state
//! ones and asserts the bound stated in docs/live.md.
#![allow(clippy::unwrap_used)]

use ditto::catalog;
use ditto::cluster::Cluster;
use ditto::cluster::config::{
    AdmissionPolicy, ClusterConfig, InstanceConfig, InstanceRole, RoutingPolicy, StalenessConfig,
};
use ditto::live::rebuild::rebuild;
use ditto::live::text::{Histogram, PodMetrics};
use ditto::sim::latency::LatencyKind;
use ditto::sim::{Engine, EngineConfig, RequestSpec, SloClass};
use ditto::twin::Limits;
use ditto::twin::predict::predict_routing;
use ditto::twin::question::{
    Background, CandidateRequest, OutputLength, PredictOptions, RoutingQuestion, SloTargets,
};
use ditto::twin::snapshot::{Gauges, ObservedRequest, TwinSettings};
use ditto::twin::store::{InstanceUpdate, MirrorStore, RequestLists, StoreLimits};
use ditto::workload::{ArrivalProcess, LengthDist, WorkloadSpec};

/// The stated bound (docs/live.md): mean relative TTFT error of rebuilt-state predictions.
const MEAN_TTFT_ERROR_BOUND: f64 = 0.35;

/// vLLM's token-count histogram buckets (1-2-5 series).
const BUCKETS: [f64; 13] = [
    1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0, 10000.0,
];

fn cluster_config(count: usize) -> ClusterConfig {
    let arch = catalog::model("llama-3.1-8b-instruct").unwrap();
    let gpu = catalog::gpu("H100").unwrap();
    let latency = catalog::latency_model(LatencyKind::Roofline, &arch, &gpu, 1).unwrap();
    let mut engine = EngineConfig::vllm_defaults(4_000, 16_384);
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

fn workload(rate: f64) -> Vec<RequestSpec> {
    WorkloadSpec::single_client(
        11,
        12_000,
        rate,
        ArrivalProcess::Poisson,
        LengthDist::gaussian(700.0, 400.0, 2, 4000),
        LengthDist::gaussian(200.0, 120.0, 2, 1000),
    )
    .generator()
    .unwrap()
    .collect()
}

/// What a gateway would push: every request, final lengths hidden.
fn exact_lists(engine: &Engine) -> RequestLists {
    let observed = engine.observe();
    let convert = |r: &ditto::sim::engine::RestoredRequest| ObservedRequest {
        request_id: r.spec.id.0.to_string(),
        arrival_us: r.spec.arrival_us,
        prompt_tokens: r.spec.input_tokens,
        computed_tokens: r.computed_tokens,
        cached_tokens: r.cached_tokens,
        output_tokens: r.generated,
        max_tokens: r.spec.max_tokens,
        known_output_tokens: None,
        priority: r.spec.priority,
        slo_class: r.spec.slo_class,
        scheduled_tokens: r.scheduled_tokens,
        block_hashes: Vec::new(),
        token_ids: None,
    };
    RequestLists {
        waiting: observed.waiting.iter().map(convert).collect(),
        running: observed.running.iter().map(convert).collect(),
        step_end_us: observed.step_end_us,
    }
}

fn histogram(values: impl Iterator<Item = u32>) -> Histogram {
    let values: Vec<u32> = values.collect();
    let mut buckets: Vec<(f64, f64)> = BUCKETS
        .iter()
        .map(|&le| {
            (
                le,
                values.iter().filter(|&&v| f64::from(v) <= le).count() as f64,
            )
        })
        .collect();
    buckets.push((f64::INFINITY, values.len() as f64));
    Histogram {
        buckets,
        sum: Some(values.iter().map(|&v| f64::from(v)).sum()),
    }
}

/// What the instance's vLLM pod would publish on /metrics.
fn published(engine: &Engine) -> PodMetrics {
    let records = &engine.metrics().records;
    PodMetrics {
        waiting: engine.num_waiting() as u32,
        running: engine.num_running() as u32,
        kv_usage: engine.kv().usage(),
        prompt_tokens: Some(histogram(records.iter().map(|r| r.input_tokens))),
        generation_tokens: Some(histogram(records.iter().map(|r| r.output_tokens))),
        ..PodMetrics::default()
    }
}

fn question(now_us: u64) -> RoutingQuestion {
    RoutingQuestion {
        request: CandidateRequest {
            prompt_tokens: 1_500,
            token_ids: None,
            block_hashes: Vec::new(),
            output: OutputLength::Point(200),
            max_tokens: 1_000,
            priority: 1,
            slo_class: SloClass::Standard,
            slo: SloTargets {
                ttft_ms: Some(500.0),
                tpot_ms: None,
                e2e_ms: None,
            },
        },
        candidates: Vec::new(),
        options: PredictOptions {
            replications: 8,
            quantiles: vec![0.5],
            horizon_us: 600_000_000,
            background: Background::None,
            stale_policy: None,
            max_signal_age_us: Some(200_000),
            seed: 5,
        },
        now_us,
    }
}

fn store_of(cluster: &Cluster, lists: impl Fn(usize, &Engine) -> RequestLists) -> MirrorStore {
    let store = MirrorStore::new(StoreLimits::DEFAULT);
    let mut settings = TwinSettings::defaults();
    settings.output_tokens = LengthDist::gaussian(200.0, 120.0, 2, 1000);
    store
        .sync_config(cluster.config().clone(), settings, Vec::new())
        .unwrap();
    for (index, engine) in cluster.engines().iter().enumerate() {
        store
            .apply_state(InstanceUpdate {
                instance_id: format!("vllm-{index}"),
                observed_at_us: cluster.now_us(),
                requests: Some(lists(index, engine)),
                gauges: Some(Gauges {
                    running: engine.num_running() as u32,
                    waiting: engine.num_waiting() as u32,
                    kv_usage: engine.kv().usage(),
                    transfers: None,
                }),
                events: Vec::new(),
                counts_arrivals: true,
            })
            .unwrap();
    }
    store
}

#[test]
fn rebuilt_state_predicts_ttft_within_the_stated_bound() {
    // Moderate load (short queues) and overload (long queues, full KV cache).
    for rate in [70.0, 140.0] {
        let mean = mean_ttft_error(rate);
        assert!(
            mean <= MEAN_TTFT_ERROR_BOUND,
            "{rate} req/s: mean TTFT error {mean:.3} exceeds the stated bound \
             {MEAN_TTFT_ERROR_BOUND}"
        );
    }
}

/// Mean relative TTFT error of rebuilt-state predictions at `rate` requests per second.
fn mean_ttft_error(rate: f64) -> f64 {
    let config = cluster_config(3);
    let mut cluster = Cluster::new(config.clone(), 1).unwrap();
    let mut arrivals = workload(rate).into_iter().peekable();
    let mut errors = Vec::new();
    for cut in (0..8u64).map(|i| 20_000_000 + i * 7_345_679) {
        while let Some(spec) = arrivals.next_if(|s| s.arrival_us <= cut) {
            cluster.run_before(spec.arrival_us);
            cluster.submit(spec).unwrap();
        }
        cluster.run_until(cut);
        let exact = store_of(&cluster, |_, engine| exact_lists(engine));
        let rebuilt = store_of(&cluster, |index, engine| {
            rebuild(
                &format!("vllm-{index}"),
                &published(engine),
                &config.instances[index].engine,
                cut,
            )
        });
        let q = question(cut);
        let on = |store: &MirrorStore| {
            predict_routing(&store.latest().unwrap().snapshot, &q, &Limits::DEFAULT).unwrap()
        };
        let (truth, guess) = (on(&exact), on(&rebuilt));
        for (t, g) in truth.candidates.iter().zip(&guess.candidates) {
            let error = (g.ttft_ms.mean - t.ttft_ms.mean).abs() / t.ttft_ms.mean;
            println!(
                "cut {:>6.1} s {}: waiting {:>3} running {:>3}  TTFT exact {:>8.1} ms rebuilt {:>8.1} ms  error {:>5.1} %",
                cut as f64 / 1e6,
                t.instance_id,
                exact
                    .latest()
                    .unwrap()
                    .snapshot
                    .instances
                    .iter()
                    .find(|s| s.instance_id == t.instance_id)
                    .unwrap()
                    .waiting
                    .len(),
                exact
                    .latest()
                    .unwrap()
                    .snapshot
                    .instances
                    .iter()
                    .find(|s| s.instance_id == t.instance_id)
                    .unwrap()
                    .running
                    .len(),
                t.ttft_ms.mean,
                g.ttft_ms.mean,
                error * 100.0
            );
            errors.push(error);
        }
    }
    let mean = errors.iter().sum::<f64>() / errors.len() as f64;
    let worst = errors.iter().copied().fold(0.0, f64::max);
    println!(
        "{rate} req/s: rebuilt vs exact TTFT: mean error {:.1} %, worst {:.1} % over {} \
         predictions",
        mean * 100.0,
        worst * 100.0,
        errors.len()
    );
    mean
}
