//! Failures on the P/D path and the `prefill-first` order (docs/disaggregation.md,
//! "Failures and retries", "Stage order"): a failed prefill is retried on the same pod after
//! llm-d's backoff and, retries spent, ends with the error; a pull failed in transport is
//! recomputed on the decode pod while the prefill holds its KV until the hold expires; every
//! invariant holds after every event over random pools with nonzero failure rates.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;

use ditto::cluster::Cluster;
use ditto::cluster::spec::{self, ClusterFileConfig};
use ditto::sim::metrics::Outcome;
use ditto::sim::{RequestId, RequestSpec};
use proptest::prelude::*;

mod common;

/// `prefill` prefill pods, `decode` decode pods, a `disaggregation:` section of `section`.
fn yaml(prefill: u32, decode: u32, section: &str) -> String {
    format!(
        "{}disaggregation:
  prefill_routing: {{policy: round-robin}}
{section}",
        common::pd::pools_yaml(prefill, decode)
    )
}

fn cluster(text: &str, seed: u64) -> Cluster {
    let ClusterFileConfig {
        config,
        disaggregation,
        ..
    } = spec::parse_cluster_file(text, None).unwrap();
    Cluster::new_disaggregated(config, disaggregation.unwrap(), seed).unwrap()
}

/// Runs `cluster` to the end with every invariant checked after every event.
fn run_checked(cluster: &mut Cluster, requests: Vec<RequestSpec>) -> Result<(), String> {
    for spec in requests {
        cluster.submit(spec).map_err(|err| err.to_string())?;
    }
    let mut events = 0u64;
    while cluster.process_next_event().is_some() {
        events += 1;
        if events > 2_000_000 {
            return Err("runaway".to_owned());
        }
        cluster
            .check_invariants()
            .map_err(|err| format!("after event {events} at {} µs: {err}", cluster.now_us()))?;
    }
    Ok(())
}

/// Requests far enough apart (1 s) that none waits for another.
fn sparse(count: u64, input: u32) -> Vec<RequestSpec> {
    (0..count)
        .map(|i| RequestSpec::synthetic(i, i * 1_000_000, input, 3))
        .collect()
}

#[test]
fn a_prefill_failing_every_attempt_ends_with_the_error_after_the_last_retry() {
    let section =
        "  prefill_failure_rate: 1.0\n  prefill_max_retries: 2\n  prefill_retry_backoff_ms: 50\n";
    let mut pd = cluster(&yaml(1, 1, section), 7);
    pd.submit(RequestSpec::synthetic(1, 0, 1_000, 3)).unwrap();
    // During the backoffs the request waits in its decode pod's sidecar: queued, on no
    // engine.
    pd.run_until(30_000);
    let counts = pd.counts();
    assert!(counts.is_conserved(), "{counts:?}");
    assert_eq!((counts.injected, counts.queued), (1, 1));
    pd.check_invariants().unwrap();
    run_checked(&mut pd, Vec::new()).unwrap();
    let summary = pd.summary();
    let disagg = summary.disaggregation.unwrap();
    assert_eq!(
        disagg.prefill_attempt_failures, 3,
        "the first try and 2 retries"
    );
    assert_eq!(disagg.prefill_retries, 2);
    assert_eq!(disagg.prefill_errors, 1);
    assert_eq!(summary.total.counts.dropped, 1);
    assert!(summary.total.counts.is_conserved());
    for engine in pd.engines() {
        assert!(engine.metrics().records.is_empty(), "no engine saw it");
        assert_eq!(engine.kv().used_blocks(), 0);
    }
    let records = pd.client_records();
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].outcome, Outcome::Dropped);
    // The last attempt: after two backoffs of 50 ms.
    assert_eq!(records[0].end_us, 100_000);
    assert_eq!(records[0].first_token_us, None);
}

#[test]
fn retries_go_to_the_same_prefill_pod_and_delay_the_request_by_their_backoffs() {
    let backoff_us = 80_000;
    // A short hold (2 s, every pull takes ms) keeps the run short.
    let hold = "  abort_request_timeout_s: 2\n";
    let faulty_section = format!(
        "{hold}  prefill_failure_rate: 0.5\n  prefill_max_retries: 2\n  prefill_retry_backoff_ms: {}\n",
        backoff_us / 1_000
    );
    let requests = sparse(60, 1_000);
    let mut clean = cluster(&yaml(2, 1, hold), 3);
    let mut faulty = cluster(&yaml(2, 1, &faulty_section), 3);
    clean.run(requests.clone(), u64::MAX).unwrap();
    run_checked(&mut faulty, requests).unwrap();
    let disagg = faulty.summary().disaggregation.unwrap();
    assert!(
        disagg.prefill_retries > 0 && disagg.prefill_errors > 0,
        "{disagg:?}"
    );
    assert_eq!(
        disagg.prefill_attempt_failures,
        disagg.prefill_retries + disagg.prefill_errors
    );
    let first_token = |cluster: &Cluster| -> BTreeMap<RequestId, Option<u64>> {
        cluster
            .client_records()
            .iter()
            .map(|r| (r.id, r.first_token_us))
            .collect()
    };
    let (clean_ttft, faulty_ttft) = (first_token(&clean), first_token(&faulty));
    assert_eq!(faulty_ttft.len(), 60, "every request ends once");
    // Each completed request is its clean twin shifted by whole backoffs (nothing else
    // waits: the requests are 1 s apart), and the shifts add up to the retries of the
    // requests that completed.
    let mut backoffs = 0;
    for (id, ttft) in &faulty_ttft {
        let Some(ttft) = ttft else { continue };
        let shift = ttft - clean_ttft[id].unwrap();
        assert_eq!(shift % backoff_us, 0, "{id:?} shifted {shift} µs");
        assert!(shift <= 2 * backoff_us, "{id:?} shifted {shift} µs");
        backoffs += shift / backoff_us;
    }
    assert_eq!(backoffs, disagg.prefill_retries - 2 * disagg.prefill_errors);
    // Every prefill half ran on the pod the handler picked (round-robin over two pods: the
    // retries did not move it).
    for id in faulty_ttft.keys() {
        let Some(progress) = faulty.pd_progress(*id) else {
            continue;
        };
        for (index, engine) in faulty.engines().iter().enumerate().take(2) {
            let ran_here = engine.metrics().records.iter().any(|r| r.id == *id);
            if ran_here {
                assert_eq!(index, progress.prefill, "{id:?}");
            }
        }
        assert_eq!(progress.prefill, (id.0 % 2) as usize, "{id:?}");
    }
    // The same seed draws the same failures; another draws others.
    let mut again = cluster(&yaml(2, 1, &faulty_section), 3);
    again.run(sparse(60, 1_000), u64::MAX).unwrap();
    assert_eq!(again.summary(), faulty.summary());
    let mut other = cluster(&yaml(2, 1, &faulty_section), 4);
    other.run(sparse(60, 1_000), u64::MAX).unwrap();
    assert_ne!(first_token(&other), faulty_ttft);
}

#[test]
fn a_pull_failed_in_transport_is_recomputed_while_the_prefill_holds_until_its_timeout() {
    // The pull takes ~131 ms (1 GB/s) and fails; the prefill pod, never notified, frees
    // its KV only when its 1 s hold expires.
    let section = "  bandwidth_gb_s: 1.0\n  descriptor_us: 0\n  setup_us: 500\n  transfer_failure_rate: 1.0\n  abort_request_timeout_s: 1\n";
    let mut pd = cluster(&yaml(1, 1, section), 1);
    pd.submit(RequestSpec::synthetic(1, 0, 1_000, 3)).unwrap();
    pd.run_until(500_000);
    pd.check_invariants().unwrap();
    assert!(pd.engines()[0].kv().used_blocks() > 0, "still held");
    let decoded = &pd.engines()[1].metrics().records;
    assert_eq!(decoded.len(), 1, "the decode pod finished meanwhile");
    // Prefill (2,000 µs), the failed pull (131,441 µs), then the whole prompt computed on
    // the decode pod (1,000 + 1,000 µs), as when the hold expires first.
    assert_eq!(decoded[0].first_token_us, Some(2_000 + 131_441 + 2_000));
    run_checked(&mut pd, Vec::new()).unwrap();
    assert_eq!(
        pd.engines()[0].kv().used_blocks(),
        0,
        "freed at 1,002,000 µs"
    );
    let summary = pd.summary();
    let disagg = summary.disaggregation.unwrap();
    assert_eq!((disagg.failed_pulls, disagg.transfer_failures), (1, 1));
    assert_eq!(summary.total.counts.completed, 1);
}

#[test]
fn prefill_first_sends_even_short_prompts_to_a_prefill_pod() {
    let short: Vec<RequestSpec> = (0..20u64)
        .map(|i| RequestSpec::synthetic(i, i * 10_000, 8, 4))
        .collect();
    // Decode-first: llm-d's decider (16 uncached tokens) keeps 8-token prompts decode-only.
    let mut decode_first = cluster(&yaml(2, 2, "  abort_request_timeout_s: 1\n"), 5);
    run_checked(&mut decode_first, short.clone()).unwrap();
    let disagg = decode_first.summary().disaggregation.unwrap();
    assert_eq!((disagg.disaggregated, disagg.decode_only), (0, 20));
    // Prefill-first has no decider: every request gets a prefill pod.
    let mut prefill_first = cluster(
        &yaml(
            2,
            2,
            "  stage_order: prefill-first\n  abort_request_timeout_s: 1\n",
        ),
        5,
    );
    assert_eq!(
        prefill_first.disaggregation().unwrap().stage_order.as_str(),
        "prefill-first"
    );
    run_checked(&mut prefill_first, short).unwrap();
    let summary = prefill_first.summary();
    let disagg = summary.disaggregation.unwrap();
    assert_eq!((disagg.disaggregated, disagg.decode_only), (20, 0));
    assert_eq!(summary.total.counts.completed, 20);
    // llm-d's spellings of the order are accepted (case, `-` and `_` ignored).
    for order in ["PrefillFirst", "prefill_first", "prefill"] {
        let text = yaml(1, 1, &format!("  stage_order: {order}\n"));
        let file = spec::parse_cluster_file(&text, None).unwrap();
        assert_eq!(
            file.disaggregation.unwrap().stage_order.as_str(),
            "prefill-first"
        );
    }
}

#[test]
fn ditto_run_names_a_bad_failure_field_and_exits_2() {
    let file = std::env::temp_dir().join(format!("ditto-pd-faults-{}.yaml", std::process::id()));
    std::fs::write(&file, yaml(1, 1, "  prefill_failure_rate: 2\n")).unwrap();
    let out = common::cli::ditto(&["run", "--cluster", file.to_str().unwrap()]);
    std::fs::remove_file(&file).unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("disaggregation.prefill_failure_rate"),
        "{stderr}"
    );
}

/// A small xorshift for the requests of one proptest case.
fn requests_from(seed: u64, count: u64) -> Vec<RequestSpec> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = move |bound: u64| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state % bound
    };
    let mut arrival = 0;
    (0..count)
        .map(|id| {
            arrival += next(20_000);
            let input = 1 + next(3_000) as u32;
            let mut spec = RequestSpec::synthetic(id, arrival, input, next(40) as u32);
            if next(3) == 0 {
                spec = spec.with_prefix(next(3), input.min(1 + next(2_000) as u32));
            }
            if next(5) == 0 {
                spec.deadline_us = Some(arrival + next(400_000));
            }
            spec
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, .. ProptestConfig::default() })]

    /// Random P/D pools (a `both` pool sometimes), either stage order, failing prefills
    /// and pulls, retries and short holds: every invariant after every event, every request
    /// ends exactly once (completed, timed out, or dropped with its prefill's error), no
    /// block is left held or reserved on either side.
    #[test]
    fn pd_pools_with_failures_keep_every_invariant(
        seed in 0u64..1_000,
        prefill in 1u32..3,
        decode in 1u32..3,
        with_both in any::<bool>(),
        prefill_first in any::<bool>(),
        prefill_failure_rate in 0.0f64..0.9,
        prefill_max_retries in 0u32..4,
        backoff_ms in 1u32..300,
        transfer_failure_rate in 0.0f64..1.0,
        hold_s in prop::sample::select(vec![0.02f64, 0.5, 5.0]),
    ) {
        let mut section = format!(
            "  prefill_failure_rate: {prefill_failure_rate}\n  prefill_max_retries: {prefill_max_retries}\n  prefill_retry_backoff_ms: {backoff_ms}\n  transfer_failure_rate: {transfer_failure_rate}\n  abort_request_timeout_s: {hold_s}\n  bandwidth_gb_s: 5\n"
        );
        if prefill_first {
            section.push_str("  stage_order: prefill-first\n");
        } else {
            section.push_str("  decider: {non_cached_tokens: 128}\n");
        }
        let mut text = yaml(prefill, decode, &section);
        if with_both {
            text = text.replace(
                "disaggregation:",
                "  - name: b
    role: both
    latency_model: blackbox
    coefficients: {alpha: [0, 0, 0], beta: [1000, 1, 10]}
    engine: {num_gpu_blocks: 600, max_model_len: 16384}
disaggregation:",
            );
        }
        let mut pd = cluster(&text, seed);
        let total = 30;
        let result = run_checked(&mut pd, requests_from(seed, total));
        prop_assert!(result.is_ok(), "{:?}", result);
        let summary = pd.summary();
        let counts = summary.total.counts;
        prop_assert!(counts.is_conserved(), "{:?}", counts);
        prop_assert_eq!(counts.injected, total);
        prop_assert_eq!(counts.queued + counts.running, 0, "stuck: {:?}", counts);
        prop_assert_eq!(counts.completed + counts.timed_out + counts.dropped + counts.rejected, total);
        prop_assert!(pd.in_flight().iter().all(|&n| n == 0), "in-flight leak: {:?}", pd.in_flight());
        for engine in pd.engines() {
            prop_assert_eq!(engine.kv().used_blocks(), 0);
            prop_assert!(engine.transferring_ids().is_empty());
        }
        let disagg = summary.disaggregation.unwrap();
        prop_assert_eq!(disagg.disaggregated + disagg.decode_only, total);
        prop_assert!(disagg.prefill_errors <= counts.dropped);
        prop_assert!(disagg.transfer_failures <= disagg.failed_pulls);
        prop_assert_eq!(
            disagg.prefill_attempt_failures,
            disagg.prefill_retries + disagg.prefill_errors
        );
        prop_assert!(disagg.prefill_retries <= u64::from(prefill_max_retries) * disagg.disaggregated);
        // Each request ends once, as its client saw it.
        let mut ids: Vec<RequestId> = pd.client_records().iter().map(|r| r.id).collect();
        ids.sort();
        ids.dedup();
        prop_assert_eq!(ids.len() as u64, total);
    }
}

#[test]
fn ditto_run_reports_the_failures_and_retries_in_its_json() {
    let file = std::env::temp_dir().join(format!("ditto-pd-retries-{}.yaml", std::process::id()));
    let section =
        "  prefill_failure_rate: 0.3\n  prefill_max_retries: 1\n  transfer_failure_rate: 0.2\n";
    std::fs::write(&file, yaml(1, 1, section)).unwrap();
    let out = common::cli::ditto(&[
        "run",
        "--cluster",
        file.to_str().unwrap(),
        "--num-requests",
        "200",
        "--rate",
        "5",
        "--input-tokens",
        "500,0,500,500",
        "--output-tokens",
        "8,0,8,8",
    ]);
    std::fs::remove_file(&file).unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let pd = &json["disaggregation"];
    let count = |key: &str| pd[key].as_u64().unwrap_or_else(|| panic!("{key}: {pd}"));
    let (failures, retries, errors) = (
        count("prefill_attempt_failures"),
        count("prefill_retries"),
        count("prefill_errors"),
    );
    // 200 first attempts failing at 0.3 each, one retry each: about 60 retries, about 18
    // errors (0.3 x 0.3 of 200); every failure is either retried or the request's error.
    assert_eq!(failures, retries + errors, "{pd}");
    assert!((35..=85).contains(&retries), "{pd}");
    assert!((5..=35).contains(&errors), "{pd}");
    assert!(count("transfer_failures") > 10, "{pd}");
    assert!(count("failed_pulls") >= count("transfer_failures"), "{pd}");
    assert_eq!(pd["stage_order"], "decode-first");
    assert_eq!(json["dropped_requests"].as_u64(), Some(errors), "{json}");
}
