//! `prom_text::parse` (our scanner) against an independent reader of the Prometheus text
//! format, the `prometheus-parse` crate: on a vLLM v1 page of realistic size and on seeded
//! random pages in the grammar both accept, every sample line must come out with the same
//! name, labels and value.
//!
//! `prometheus-parse` names must match `\w+`, so `:` is escaped for it and restored after;
//! `#` lines are left out so that it reads every line as an untyped sample of its own (with
//! `# TYPE` it folds a histogram's lines into one value). Its label reader splits on `,` and
//! `=`, so the random label values hold neither.

use std::collections::BTreeMap;

use ditto::prom_text;
use proptest::prelude::*;

const COLON: &str = "__COLON__";

type Row = (String, BTreeMap<String, String>, u64);

fn oracle(page: &str) -> Vec<Row> {
    let lines = page
        .lines()
        .filter(|line| !line.trim_start().starts_with('#'))
        .map(|line| {
            let end = line.find(['{', ' ']).unwrap_or(line.len());
            Ok(format!(
                "{}{}",
                line[..end].replace(':', COLON),
                &line[end..]
            ))
        });
    let scrape = prometheus_parse::Scrape::parse(lines).expect("the oracle reads the page");
    scrape
        .samples
        .into_iter()
        .map(|sample| {
            let value = match sample.value {
                prometheus_parse::Value::Untyped(v) => v,
                other => panic!("untyped expected, got {other:?}"),
            };
            let labels = sample
                .labels
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            (sample.metric.replace(COLON, ":"), labels, value.to_bits())
        })
        .collect()
}

fn ours(page: &str, label_names: &[&str]) -> Vec<Row> {
    prom_text::parse(page, |_| true)
        .into_iter()
        .map(|sample| {
            let labels = label_names
                .iter()
                .filter_map(|&key| sample.label(key).map(|v| (key.to_owned(), v.into_owned())))
                .collect();
            (sample.name.to_owned(), labels, sample.value.to_bits())
        })
        .collect()
}

#[test]
fn a_vllm_page_reads_the_same_as_with_the_oracle() {
    let page = ditto::live::bench::vllm_page();
    let expected = oracle(&page);
    assert!(expected.len() > 200, "a realistic page: {}", expected.len());
    assert_eq!(
        ours(
            &page,
            &["engine", "model_name", "le", "block_size", "num_gpu_blocks"]
        ),
        expected
    );
}

const LABELS: [&str; 4] = ["engine", "le", "model_name", "x_y"];

fn line() -> impl Strategy<Value = String> {
    let name = "[a-z_][a-z0-9_]{0,12}(:[a-z_]{1,10})?";
    let value = prop_oneof![
        any::<f64>()
            .prop_filter("finite", |v| v.is_finite())
            .prop_map(|v| format!("{v:?}")),
        (-1_000_000_i64..1_000_000).prop_map(|v| v.to_string()),
        Just("+Inf".to_owned()),
        Just("-Inf".to_owned()),
        Just("1.5e-7".to_owned()),
    ];
    let labels = proptest::collection::btree_map(
        prop::sample::select(LABELS.to_vec()),
        "[a-zA-Z0-9 .+/-]{1,10}",
        0..4,
    );
    let timestamp = prop::option::of(0_i64..2_000_000_000_000);
    (name, labels, value, timestamp).prop_map(|(name, labels, value, timestamp)| {
        let mut line = name;
        if !labels.is_empty() {
            let pairs: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
            line.push('{');
            line.push_str(&pairs.join(","));
            line.push('}');
        }
        line.push(' ');
        line.push_str(&value);
        if let Some(ms) = timestamp {
            line.push_str(&format!(" {ms}"));
        }
        line
    })
}

proptest! {
    #[test]
    fn random_pages_read_the_same_as_with_the_oracle(
        lines in proptest::collection::vec(line(), 0..40),
    ) {
        let page = lines.join("\n");
        prop_assert_eq!(ours(&page, &LABELS), oracle(&page));
    }
}
