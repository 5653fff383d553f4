#![allow(clippy::unwrap_used)]
//! Workload specs: parsing, validation and generation, through the public API only.

use std::collections::BTreeSet;

use ditto::sim::request::{PromptContent, RequestSpec, SloClass};
use ditto::workload::{ArrivalProcess, LengthDist, WorkloadError, WorkloadSpec};

/// Parses `yaml` and generates every request (the spec must end on its own).
fn generate(yaml: &str) -> Vec<RequestSpec> {
    let spec = WorkloadSpec::from_yaml(yaml).unwrap();
    spec.generator().unwrap().collect()
}

/// Asserts that `yaml` is rejected with an error naming `path`.
fn check_invalid(yaml: &str, path: &str) {
    match WorkloadSpec::from_yaml(yaml) {
        Err(WorkloadError::Invalid { path: got, message }) => {
            assert_eq!(got, path, "yaml:\n{yaml}\nmessage: {message}");
        }
        other => panic!("yaml:\n{yaml}\nexpected an error at `{path}`, got {other:?}"),
    }
}

fn arrivals(requests: &[RequestSpec]) -> Vec<u64> {
    requests.iter().map(|request| request.arrival_us).collect()
}

fn group_of(request: &RequestSpec) -> Option<u64> {
    match request.content {
        PromptContent::Synthetic { prefix_group, .. } => prefix_group,
        PromptContent::Tokens(_) | PromptContent::BlockKeys(_) => None,
    }
}

const POISSON: &str = "
seed: 1
num_requests: 2000
rate: 50
input_tokens: {type: gaussian, mean: 300, stdev: 80, min: 10, max: 600}
output_tokens: {type: exponential, mean: 100}
";

#[test]
fn same_seed_same_requests_other_seed_differs() {
    // Goal: generation is a pure function of (spec, seed).
    let first = generate(POISSON);
    let second = generate(POISSON);
    assert_eq!(first, second);
    let other = generate(&POISSON.replace("seed: 1", "seed: 2"));
    assert_ne!(arrivals(&first), arrivals(&other));
    let ids: Vec<u64> = first.iter().map(|request| request.id.0).collect();
    assert_eq!(ids, (0..2000).collect::<Vec<u64>>());
}

#[test]
fn output_distribution_does_not_move_arrivals_or_inputs() {
    // Goal: each purpose has its own stream, so editing outputs leaves the rest unchanged.
    let base = generate(POISSON);
    let edited = generate(&POISSON.replace(
        "{type: exponential, mean: 100}",
        "{type: lognormal, mu: 5, sigma: 1}",
    ));
    assert_eq!(arrivals(&base), arrivals(&edited));
    let inputs = |requests: &[RequestSpec]| -> Vec<u32> {
        requests
            .iter()
            .map(|request| request.input_tokens)
            .collect()
    };
    assert_eq!(inputs(&base), inputs(&edited));
    assert_ne!(base, edited);
}

#[test]
fn poisson_mean_gap_matches_rate() {
    // Goal: 20k Poisson arrivals at 40 req/s have a mean gap within 3% of 25 ms.
    let requests = generate(
        "
seed: 9
num_requests: 20000
rate: 40
input_tokens: {type: constant, value: 1}
output_tokens: {type: constant, value: 1}
",
    );
    let last = requests.last().unwrap().arrival_us as f64;
    let mean_gap_us = last / 20_000.0;
    assert!(
        (mean_gap_us - 25_000.0).abs() < 750.0,
        "mean gap {mean_gap_us}"
    );
    assert!(arrivals(&requests).windows(2).all(|w| w[0] < w[1]));
}

#[test]
fn gaussian_lengths_stay_within_bounds() {
    let requests = generate(
        "
num_requests: 3000
rate: 100
input_tokens: {type: gaussian, mean: 100, stdev: 300, min: 20, max: 180}
output_tokens: {type: gaussian, mean: 5, stdev: 50, max: 9}
",
    );
    assert!(
        requests
            .iter()
            .all(|r| (20..=180).contains(&r.input_tokens))
    );
    assert!(requests.iter().all(|r| (1..=9).contains(&r.output_tokens)));
    assert!(requests.iter().all(|r| r.max_tokens == r.output_tokens));
    assert!(requests.iter().any(|r| r.input_tokens == 20));
    assert!(requests.iter().any(|r| r.input_tokens == 180));
}

#[test]
fn constant_arrivals_are_exactly_spaced() {
    let spec = WorkloadSpec::single_client(
        5,
        100,
        10.0,
        ArrivalProcess::Constant,
        LengthDist::constant(64),
        LengthDist::constant(8),
    );
    let requests: Vec<RequestSpec> = spec.generator().unwrap().collect();
    let expected: Vec<u64> = (1..=100).map(|k| k * 100_000).collect();
    assert_eq!(arrivals(&requests), expected);
    assert!(requests.iter().all(|r| r.slo_class == SloClass::Standard));
}

#[test]
fn stages_switch_rate_and_end_the_run() {
    // Goal: constant arrivals show the exact boundary rule: 8/s for 10 s, then 20/s for 5 s.
    let requests = generate(
        "
stages: [{rate: 8, duration_s: 10}, {rate: 20, duration_s: 5}]
arrival: {process: constant}
input_tokens: {type: constant, value: 10}
output_tokens: {type: constant, value: 10}
",
    );
    let mut expected: Vec<u64> = (1..=80).map(|k| k * 125_000).collect();
    expected.extend((1..=100).map(|k| 10_000_000 + k * 50_000));
    assert_eq!(arrivals(&requests), expected);
}

#[test]
fn poisson_stages_have_their_rates() {
    // Goal: counts per stage of a Poisson schedule match rate × duration within 5 sigma.
    let requests = generate(
        "
seed: 3
stages: [{rate: 8, duration_s: 600}, {rate: 20, duration_s: 600}]
input_tokens: {type: constant, value: 10}
output_tokens: {type: constant, value: 10}
",
    );
    let first = requests
        .iter()
        .filter(|r| r.arrival_us <= 600_000_000)
        .count() as f64;
    let second = requests.len() as f64 - first;
    assert!((first - 4_800.0).abs() < 5.0 * 4_800f64.sqrt(), "{first}");
    assert!(
        (second - 12_000.0).abs() < 5.0 * 12_000f64.sqrt(),
        "{second}"
    );
    assert!(requests.last().unwrap().arrival_us <= 1_200_000_000);
}

#[test]
fn num_requests_and_duration_both_stop() {
    let by_count = generate(
        "
num_requests: 7
rate: 1000
input_tokens: {type: constant, value: 1}
output_tokens: {type: constant, value: 1}
",
    );
    assert_eq!(by_count.len(), 7);
    let by_time = generate(
        "
duration_s: 2.5
rate: 1000
input_tokens: {type: constant, value: 1}
output_tokens: {type: constant, value: 1}
",
    );
    assert!(by_time.last().unwrap().arrival_us <= 2_500_000);
    assert!((2_200..2_800).contains(&by_time.len()), "{}", by_time.len());
    let both = generate(
        "
num_requests: 1000000
duration_s: 1
rate: 100
arrival: {process: constant}
input_tokens: {type: constant, value: 1}
output_tokens: {type: constant, value: 1}
",
    );
    assert_eq!(both.len(), 100);
}

#[test]
fn clients_share_the_rate_and_keep_their_fields() {
    let requests = generate(
        "
seed: 11
num_requests: 10000
rate: 100
clients:
  - id: chat
    rate_fraction: 3
    slo_class: critical
    deadline_ms: 500
    input_tokens: {type: constant, value: 100}
    output_tokens: {type: constant, value: 10}
  - id: batch
    rate_fraction: 1
    slo_class: batch
    priority: 9
    input_tokens: {type: constant, value: 200}
    output_tokens: {type: constant, value: 20}
",
    );
    let chat: Vec<&RequestSpec> = requests.iter().filter(|r| r.input_tokens == 100).collect();
    let share = chat.len() as f64 / requests.len() as f64;
    assert!((share - 0.75).abs() < 0.02, "chat share {share}");
    for request in &requests {
        if request.input_tokens == 100 {
            assert_eq!(request.slo_class, SloClass::Critical);
            assert_eq!(request.priority, 0);
            assert_eq!(request.deadline_us, Some(request.arrival_us + 500_000));
        } else {
            assert_eq!(request.slo_class, SloClass::Batch);
            assert_eq!(request.priority, 9);
            assert_eq!(request.deadline_us, None);
        }
    }
    assert!(arrivals(&requests).windows(2).all(|w| w[0] <= w[1]));
}

#[test]
fn equal_arrivals_go_to_the_lower_client_index() {
    // Two constant clients at the same rate arrive together; `a` is listed first.
    let requests = generate(
        "
num_requests: 10
rate: 2
arrival: {process: constant}
clients:
  - {id: a, input_tokens: {type: constant, value: 1}, output_tokens: {type: constant, value: 1}}
  - {id: b, input_tokens: {type: constant, value: 2}, output_tokens: {type: constant, value: 1}}
",
    );
    let inputs: Vec<u32> = requests.iter().map(|r| r.input_tokens).collect();
    assert_eq!(inputs, [1, 2, 1, 2, 1, 2, 1, 2, 1, 2]);
    assert_eq!(requests[0].arrival_us, requests[1].arrival_us);
}

#[test]
fn prefix_groups_are_shared_only_within_a_client() {
    let requests = generate(
        "
seed: 4
num_requests: 4000
rate: 100
clients:
  - id: chat
    prefix: {groups: 9, length: 100}
    input_tokens: {type: constant, value: 447}
    output_tokens: {type: constant, value: 248}
  - id: code
    prefix: {groups: 3, length: 50}
    input_tokens: {type: constant, value: 20}
    output_tokens: {type: constant, value: 10}
  - id: plain
    input_tokens: {type: constant, value: 5}
    output_tokens: {type: constant, value: 5}
",
    );
    let mut chat_groups = BTreeSet::new();
    let mut code_groups = BTreeSet::new();
    for request in &requests {
        let PromptContent::Synthetic {
            prefix_group,
            prefix_len,
        } = request.content
        else {
            panic!("generated content is synthetic");
        };
        match request.input_tokens {
            547 => {
                assert_eq!(prefix_len, 100);
                chat_groups.insert(prefix_group.unwrap());
            }
            70 => {
                assert_eq!(prefix_len, 50);
                code_groups.insert(prefix_group.unwrap());
            }
            5 => assert_eq!(prefix_group, None),
            other => panic!("unexpected input length {other}"),
        }
    }
    assert_eq!(chat_groups, (0..9).collect());
    assert_eq!(code_groups, (9..12).collect());
    assert!(requests.iter().filter_map(group_of).all(|group| group < 12));
}

#[test]
fn a_million_requests_stream_lazily() {
    // Goal: generation is a stream; counting a million requests stores none of them.
    let spec = WorkloadSpec::single_client(
        1,
        1_000_000,
        1_000.0,
        ArrivalProcess::Poisson,
        LengthDist::constant(1),
        LengthDist::constant(1),
    );
    let mut generator = spec.generator().unwrap();
    let mut count = 0u64;
    let mut previous = 0;
    for request in generator.by_ref() {
        assert!(request.arrival_us >= previous);
        previous = request.arrival_us;
        count += 1;
    }
    assert_eq!(count, 1_000_000);
    assert_eq!(generator.emitted(), 1_000_000);
    assert!(generator.next().is_none());
}

#[test]
fn documented_example_parses_and_generates() {
    // Goal: the full example in docs/workload.md stays valid.
    let doc = include_str!("../docs/workload.md");
    let after_marker = doc.split("<!-- example:full -->").nth(1).unwrap();
    let yaml = after_marker
        .split("```yaml")
        .nth(1)
        .unwrap()
        .split("```")
        .next()
        .unwrap();
    let spec = WorkloadSpec::from_yaml(yaml).unwrap();
    let requests: Vec<RequestSpec> = spec.generator().unwrap().take(500).collect();
    assert_eq!(requests.len(), 500);
    assert!(requests.iter().any(|r| r.slo_class == SloClass::Batch));
    assert!(requests.iter().any(|r| r.slo_class == SloClass::Standard));
}

#[test]
fn invalid_specs_name_the_field() {
    const LENGTHS: &str =
        "input_tokens: {type: constant, value: 1}\noutput_tokens: {type: constant, value: 1}\n";
    let with_lengths = |head: &str| format!("{head}\n{LENGTHS}");
    check_invalid(&with_lengths("num_requests: 5\nrate: -1"), "rate");
    check_invalid(&with_lengths("num_requests: 5\nrate: 0"), "rate");
    check_invalid(&with_lengths("num_requests: 5\nrate: .nan"), "rate");
    check_invalid(&with_lengths("num_requests: 5\nrate: 1e7"), "rate");
    check_invalid(&with_lengths("num_requests: 5"), "rate");
    check_invalid(&with_lengths("rate: 5"), "num_requests");
    check_invalid(&with_lengths("num_requests: 0\nrate: 5"), "num_requests");
    check_invalid(&with_lengths("duration_s: -2\nrate: 5"), "duration_s");
    check_invalid(
        &with_lengths("num_requests: 5\nrate: 5\nstages: [{rate: 1, duration_s: 1}]"),
        "stages",
    );
    check_invalid(&with_lengths("stages: []"), "stages");
    check_invalid(
        &with_lengths("stages: [{rate: 1, duration_s: 1}, {rate: 0, duration_s: 1}]"),
        "stages[1].rate",
    );
    check_invalid(
        &with_lengths("duration_s: 5\nstages: [{rate: 1, duration_s: 1}]"),
        "duration_s",
    );
    check_invalid(
        &with_lengths("num_requests: 5\nrate: 5\narrival: {process: gamma, cv: 0}"),
        "arrival.cv",
    );
    check_invalid(
        &with_lengths("num_requests: 5\nrate: 5\nslo_class: urgent"),
        "slo_class",
    );
    check_invalid(
        "num_requests: 5\nrate: 5\ninput_tokens: {type: gaussian, mean: 5, stdev: 1, min: 9, max: 3}\noutput_tokens: {type: constant, value: 1}",
        "input_tokens.min",
    );
    check_invalid(
        "num_requests: 5\nrate: 5\noutput_tokens: {type: constant, value: 1}",
        "input_tokens",
    );
    check_invalid("num_requests: 5\nrate: 5\nclients: []", "clients");
}

#[test]
fn invalid_clients_name_the_field() {
    let client = |extra: &str| {
        format!(
            "num_requests: 5\nrate: 5\nclients:\n  - {{id: a, input_tokens: {{type: constant, value: 1}}, output_tokens: {{type: constant, value: 1}}}}\n  - {{id: b, input_tokens: {{type: constant, value: 1}}, output_tokens: {{type: constant, value: 1}}{extra}}}\n"
        )
    };
    check_invalid(&client(", rate_fraction: 0"), "clients[1].rate_fraction");
    check_invalid(&client(", deadline_ms: 0"), "clients[1].deadline_ms");
    check_invalid(
        &client(", prefix: {groups: 0, length: 5}"),
        "clients[1].prefix.groups",
    );
    check_invalid(
        &client(", arrival: {process: gamma, cv: -1}"),
        "clients[1].arrival.cv",
    );
    check_invalid(&client(", slo_class: gold"), "clients[1].slo_class");
    check_invalid(&client("").replace("id: b", "id: a"), "clients[1].id");
    check_invalid(&client("").replace("id: b", "id: ''"), "clients[1].id");
    // Only the last client (b) gets the bad output distribution.
    let valid = client("");
    let (head, _) = valid.rsplit_once("output_tokens").unwrap();
    check_invalid(
        &format!("{head}output_tokens: {{type: gaussian, mean: 3, stdev: -3}}}}\n"),
        "clients[1].output_tokens.stdev",
    );
    check_invalid(
        &format!("{}input_tokens: {{type: constant, value: 1}}\n", client("")),
        "input_tokens",
    );
}

#[test]
fn unknown_fields_are_yaml_errors() {
    let err = WorkloadSpec::from_yaml(
        "num_requests: 5\nrate: 5\nrat: 4\ninput_tokens: {type: constant, value: 1}\noutput_tokens: {type: constant, value: 1}\n",
    )
    .unwrap_err();
    assert!(matches!(err, WorkloadError::Yaml { .. }), "{err}");
    assert!(err.to_string().contains("rat"), "{err}");
    let err = WorkloadSpec::from_yaml(
        "num_requests: 5\nrate: 5\ninput_tokens: {type: constant, value: 1, mean: 3}\noutput_tokens: {type: constant, value: 1}\n",
    )
    .unwrap_err();
    assert!(matches!(err, WorkloadError::Yaml { .. }), "{err}");
    let err = WorkloadSpec::from_yaml(
        "num_requests: 5\nrate: 5\narrival: {process: poisson, cv: 2}\ninput_tokens: {type: constant, value: 1}\noutput_tokens: {type: constant, value: 1}\n",
    )
    .unwrap_err();
    assert!(matches!(err, WorkloadError::Yaml { .. }), "{err}");
    assert!(err.to_string().contains("cv"), "{err}");
    let err = WorkloadSpec::from_yaml(
        "num_requests: 5\nrate: 5\narrival: {process: gamma}\ninput_tokens: {type: constant, value: 1}\noutput_tokens: {type: constant, value: 1}\n",
    )
    .unwrap_err();
    assert!(err.to_string().contains("needs `cv`"), "{err}");
}

#[test]
fn generator_validates_programmatic_specs() {
    let spec = WorkloadSpec::single_client(
        1,
        10,
        f64::INFINITY,
        ArrivalProcess::Poisson,
        LengthDist::constant(1),
        LengthDist::constant(1),
    );
    let err = spec.generator().unwrap_err();
    assert_eq!(err.to_string(), "rate: must be a finite number (got inf)");
}

#[test]
fn timeout_s_is_each_requests_client_timeout() {
    let requests = generate(
        "
seed: 3
num_requests: 50
rate: 10
timeout_s: 300
input_tokens: {type: constant, value: 10}
output_tokens: {type: constant, value: 5}
",
    );
    for request in &requests {
        assert_eq!(request.deadline_us, Some(request.arrival_us + 300_000_000));
    }
    let client = |extra: &str| {
        format!(
            "num_requests: 5\nrate: 5\nclients:\n  - {{id: a, input_tokens: {{type: constant, value: 1}}, output_tokens: {{type: constant, value: 1}}{extra}}}\n"
        )
    };
    check_invalid(&client(", timeout_s: 0"), "clients[0].timeout_s");
    check_invalid(&client(", timeout_s: -3"), "clients[0].timeout_s");
    check_invalid(
        &client(", timeout_s: 3, deadline_ms: 5"),
        "clients[0].timeout_s",
    );
}
