#![allow(clippy::unwrap_used)]
//! Trace replay: every format parses its fixture, and malformed rows name their line.

use std::path::Path;

use ditto::sim::request::{PromptContent, RequestId, RequestSpec, SloClass};
use ditto::workload::{ReplayConfig, Trace, TraceFormat, WorkloadError};

const CSV: &str = include_str!("data/trace_small.csv");
const JSONL: &str = include_str!("data/trace_small.jsonl");
const REPLAY: &str = include_str!("data/replay_requests_excerpt.json");

/// Parses `text` in `format`, which must succeed.
fn parse(format: TraceFormat, text: &str) -> Trace {
    format.parse(text).unwrap()
}

/// Asserts that `text` fails with an error whose message contains each of `needles`.
fn check_error(format: TraceFormat, text: &str, needles: &[&str]) -> WorkloadError {
    let err = format.parse(text).unwrap_err();
    let message = err.to_string();
    for needle in needles {
        assert!(message.contains(needle), "`{message}` lacks `{needle}`");
    }
    err
}

/// The requests both small fixtures describe, in sorted order.
fn small_fixture_expected() -> Vec<RequestSpec> {
    vec![
        RequestSpec::synthetic(0, 0, 547, 248).with_prefix(0, 100),
        RequestSpec::synthetic(1, 63_763, 577, 249).with_prefix(0, 100),
        RequestSpec::synthetic(2, 70_925, 565, 249)
            .with_prefix(1, 100)
            .with_class(SloClass::Critical),
        RequestSpec::synthetic(4, 200_000, 120, 16),
        RequestSpec::synthetic(3, 349_915, 568, 250).with_class(SloClass::Batch),
    ]
}

#[test]
fn csv_fixture_parses_sorted() {
    let trace = parse(TraceFormat::Csv, CSV);
    assert_eq!(trace.requests, small_fixture_expected());
    assert_eq!(trace.replay_config, None);
    assert!(trace.errored.is_empty());
}

#[test]
fn jsonl_fixture_matches_csv() {
    let trace = parse(TraceFormat::Jsonl, JSONL);
    assert_eq!(trace.requests, small_fixture_expected());
}

#[test]
fn replay_fixture_parses_with_config() {
    let trace = parse(TraceFormat::ReplayJson, REPLAY);
    assert_eq!(trace.requests.len(), 9);
    assert_eq!(trace.requests[0], RequestSpec::synthetic(0, 0, 582, 250));
    let last = trace.requests.last().unwrap();
    assert_eq!(last.id, RequestId(32));
    assert_eq!(last.output_tokens, 0);
    assert_eq!(
        trace.replay_config,
        Some(ReplayConfig {
            tensor_parallelism: 1,
            max_num_seqs: 128,
            max_num_batched_tokens: 2048,
            kv_blocks_total_gpu: 7462,
            block_size: 16,
            num_prefix_groups: 0,
            users_per_group: 0,
            system_prompt_len: 0,
        })
    );
    assert_eq!(trace.model_id.as_deref(), Some("meta-llama/Llama-2-7b-hf"));
    assert!(
        trace
            .requests
            .windows(2)
            .all(|w| w[0].arrival_us <= w[1].arrival_us)
    );
}

#[test]
fn replay_prefix_groups_and_errors() {
    let text = r#"{"config": {"tensor_parallelism": 2, "max_num_seqs": 64,
        "max_num_batched_tokens": 4096, "kv_blocks_total_gpu": 100, "block_size": 16,
        "system_prompt_len": 100},
      "requests": [
        {"index": 5, "arrival_time_us": 10, "input_tokens": 80, "output_tokens": 3,
         "prefix_group": "sys-a", "has_error": true},
        {"index": 4, "arrival_time_us": 10, "input_tokens": 500, "output_tokens": 3,
         "prefix_group": "2"},
        {"index": 1, "arrival_time_us": 5, "input_tokens": 500, "output_tokens": 3}]}"#;
    let trace = parse(TraceFormat::ReplayJson, text);
    let ids: Vec<u64> = trace.requests.iter().map(|r| r.id.0).collect();
    assert_eq!(ids, [1, 5, 4], "stable sort keeps file order on ties");
    assert_eq!(trace.errored, [RequestId(5)]);
    let PromptContent::Synthetic {
        prefix_group,
        prefix_len,
    } = trace.requests[1].content
    else {
        panic!("replay content is synthetic");
    };
    assert!(prefix_group.is_some());
    assert_eq!(prefix_len, 80, "clamped to the prompt length");
    assert_eq!(
        trace.requests[2].content,
        PromptContent::Synthetic {
            prefix_group: Some(2),
            prefix_len: 100
        }
    );
    assert_eq!(trace.replay_config.unwrap().num_prefix_groups, 0);
}

#[test]
fn csv_malformed_rows_name_line_and_column() {
    let header = "arrival_us,input_tokens,output_tokens\n";
    check_error(
        TraceFormat::Csv,
        &format!("{header}0,5,5\n10,abc,5\n"),
        &["line 3", "input_tokens", "abc"],
    );
    check_error(
        TraceFormat::Csv,
        &format!("{header}0,5,5\n\n# note\n10,5\n"),
        &["line 5", "2 fields"],
    );
    check_error(
        TraceFormat::Csv,
        &format!("{header}-1,5,5\n"),
        &["line 2", "arrival_us"],
    );
    check_error(
        TraceFormat::Csv,
        &format!("{header}1,0,5\n"),
        &["line 2", "input_tokens", ">= 1"],
    );
    check_error(
        TraceFormat::Csv,
        "arrival_us,input_tokens,output_tokens,prefix_group\n1,5,5,3\n",
        &["line 2", "prefix_len"],
    );
    check_error(
        TraceFormat::Csv,
        "arrival_us,input_tokens,output_tokens,prefix_group,prefix_len\n1,5,5,3,6\n",
        &["line 2", "prefix_len", "<= input_tokens"],
    );
    check_error(
        TraceFormat::Csv,
        "arrival_us,input_tokens,output_tokens,slo_class\n1,5,5,gold\n",
        &["line 2", "slo_class", "gold"],
    );
}

#[test]
fn csv_header_problems() {
    check_error(
        TraceFormat::Csv,
        "arrival_us,input_tokens,output_tokens,user\n1,2,3,x\n",
        &["line 1", "user", "unknown column"],
    );
    check_error(
        TraceFormat::Csv,
        "arrival_us,input_tokens\n1,2\n",
        &["line 1", "output_tokens", "missing"],
    );
    check_error(
        TraceFormat::Csv,
        "arrival_us,input_tokens,output_tokens,input_tokens\n1,2,3,4\n",
        &["duplicate"],
    );
    check_error(TraceFormat::Csv, "", &["no header"]);
    check_error(
        TraceFormat::Csv,
        "arrival_us,input_tokens,output_tokens\n",
        &["no requests"],
    );
}

#[test]
fn jsonl_malformed_lines_name_line_and_key() {
    let good = r#"{"arrival_us": 0, "input_tokens": 5, "output_tokens": 5}"#;
    check_error(
        TraceFormat::Jsonl,
        &format!("{good}\n{{\"arrival_us\": 1, \"input_tokens\": 5,\n"),
        &["line 2", "invalid JSON"],
    );
    check_error(
        TraceFormat::Jsonl,
        &format!("{good}\n\n{{\"arrival_us\": 1, \"input_tokens\": -5, \"output_tokens\": 5}}\n"),
        &["line 3", "input_tokens"],
    );
    check_error(
        TraceFormat::Jsonl,
        &format!("{good}\n{{\"arrival_us\": 1, \"input_tokens\": 5}}\n"),
        &["line 2", "output_tokens", "missing"],
    );
    check_error(
        TraceFormat::Jsonl,
        &format!(
            "{good}\n{{\"arrival_us\": 1, \"input_tokens\": 5, \"output_tokens\": 5, \"user\": 1}}\n"
        ),
        &["line 2", "user", "unknown key"],
    );
    check_error(TraceFormat::Jsonl, "[1, 2]\n", &["line 1", "object"]);
}

#[test]
fn replay_malformed_records_name_position() {
    let config = r#""config": {"tensor_parallelism": 1, "max_num_seqs": 1,
        "max_num_batched_tokens": 1, "kv_blocks_total_gpu": 1, "block_size": 16}"#;
    let record = |index: u32, input: u32| {
        format!(
            r#"{{"index": {index}, "arrival_time_us": 0, "input_tokens": {input}, "output_tokens": 1}}"#
        )
    };
    check_error(
        TraceFormat::ReplayJson,
        &format!(
            "{{{config}, \"requests\": [{}, {}]}}",
            record(0, 5),
            record(0, 5)
        ),
        &["requests[1].index", "duplicate"],
    );
    check_error(
        TraceFormat::ReplayJson,
        &format!(
            "{{{config}, \"requests\": [{}, {}]}}",
            record(0, 5),
            record(1, 0)
        ),
        &["requests[1].input_tokens"],
    );
    check_error(
        TraceFormat::ReplayJson,
        &format!("{{{config},\n \"requests\": [\n{{\"index\": \"x\"}}]}}"),
        &["requests[0].index", "\"x\""],
    );
    check_error(
        TraceFormat::ReplayJson,
        &format!("{{{config},\n \"requests\": [\n{{\"index\": 0,,}}]}}"),
        &["line 4", "invalid JSON"], // `config` spans two lines
    );
    check_error(
        TraceFormat::ReplayJson,
        &format!("{{{config}, \"requests\": [7]}}"),
        &["requests[0]: expected a JSON object"],
    );
    check_error(TraceFormat::ReplayJson, r#"{"requests": []}"#, &["config"]);
    check_error(
        TraceFormat::ReplayJson,
        r#"{"config": {"tensor_parallelism": 1}, "requests": []}"#,
        &["config.max_num_seqs", "missing"],
    );
}

#[test]
fn format_follows_the_extension() {
    assert_eq!(
        TraceFormat::from_path(Path::new("t.csv")).unwrap(),
        TraceFormat::Csv
    );
    assert_eq!(
        TraceFormat::from_path(Path::new("t.ndjson")).unwrap(),
        TraceFormat::Jsonl
    );
    assert_eq!(
        TraceFormat::from_path(Path::new("gt/replay_requests.json")).unwrap(),
        TraceFormat::ReplayJson
    );
    let err = TraceFormat::from_path(Path::new("t.txt")).unwrap_err();
    assert!(err.to_string().contains("t.txt"), "{err}");
}

#[test]
fn replay_keeps_failed_requests_whose_lengths_were_lost() {
    // An overloaded run: the client timed out before it saw the token counts (0 in the data).
    let text = r#"{"config": {"tensor_parallelism": 1, "max_num_seqs": 128,
      "max_num_batched_tokens": 2048, "kv_blocks_total_gpu": 7462, "block_size": 16},
      "requests": [
        {"index": 0, "arrival_time_us": 0, "input_tokens": 1083, "output_tokens": 1423},
        {"index": 1, "arrival_time_us": 7, "input_tokens": 0, "output_tokens": 0,
         "has_error": true}]}"#;
    let trace = parse(TraceFormat::ReplayJson, text);
    assert_eq!(trace.requests.len(), 1);
    assert_eq!(trace.lost.len(), 1);
    assert_eq!(trace.lost[0].id, RequestId(1));
    assert_eq!(trace.lost[0].arrival_us, 7);
    assert_eq!(trace.errored, [RequestId(1)]);
    // Without has_error a 0-token prompt is still an error naming the field.
    let bad = text.replace(r#""has_error": true"#, r#""has_error": false"#);
    check_error(
        TraceFormat::ReplayJson,
        &bad,
        &["requests[1]", "input_tokens"],
    );
}

#[test]
fn timeout_s_column_sets_each_requests_deadline() {
    let csv = "arrival_us,input_tokens,output_tokens,timeout_s\n1000,10,5,2.5\n2000,10,5,\n";
    let trace = parse(TraceFormat::Csv, csv);
    assert_eq!(trace.requests[0].deadline_us, Some(1000 + 2_500_000));
    assert_eq!(trace.requests[1].deadline_us, None);
    let jsonl = r#"{"arrival_us": 5, "input_tokens": 3, "output_tokens": 2, "timeout_s": 300}"#;
    let trace = parse(TraceFormat::Jsonl, jsonl);
    assert_eq!(trace.requests[0].deadline_us, Some(5 + 300_000_000));
    check_error(
        TraceFormat::Csv,
        "arrival_us,input_tokens,output_tokens,timeout_s\n1,1,1,0\n",
        &["line 2", "timeout_s"],
    );
    check_error(
        TraceFormat::Jsonl,
        r#"{"arrival_us": 5, "input_tokens": 3, "output_tokens": 2, "timeout_s": "soon"}"#,
        &["timeout_s"],
    );
}
