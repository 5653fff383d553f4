//! `parse_metrics` on hand-written pages, and against the reference reading on random ones.

use super::*;

const PAGE: &str = "\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 3.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 2.0
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.25
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"2048\",engine=\"0\"} 1.0
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{engine=\"0\",model_name=\"m\"} 1000.0
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{engine=\"0\",model_name=\"m\"} 250.0
# TYPE vllm:request_prompt_tokens histogram
vllm:request_prompt_tokens_bucket{engine=\"0\",le=\"100.0\",model_name=\"m\"} 4.0
vllm:request_prompt_tokens_bucket{engine=\"0\",le=\"1000.0\",model_name=\"m\"} 10.0
vllm:request_prompt_tokens_bucket{engine=\"0\",le=\"+Inf\",model_name=\"m\"} 10.0
vllm:request_prompt_tokens_count{engine=\"0\",model_name=\"m\"} 10.0
vllm:request_prompt_tokens_sum{engine=\"0\",model_name=\"m\"} 3000.0
";

#[test]
fn the_itl_count_is_read_and_unread_families_are_not() {
    let page = format!(
        "{PAGE}\
# TYPE vllm:inter_token_latency_seconds histogram
vllm:inter_token_latency_seconds_bucket{{engine=\"0\",le=\"0.01\",model_name=\"m\"}} 5.0
vllm:inter_token_latency_seconds_bucket{{engine=\"0\",le=\"+Inf\",model_name=\"m\"}} 42.0
vllm:inter_token_latency_seconds_count{{engine=\"0\",model_name=\"m\"}} 42.0
vllm:inter_token_latency_seconds_sum{{engine=\"0\",model_name=\"m\"}} 1.5
"
    );
    let itl = Some(Tag {
        series: Series::ItlCount,
        name: 0,
    });
    assert_eq!(tag("vllm:inter_token_latency_seconds_count"), itl);
    assert_eq!(tag("vllm:inter_token_latency_seconds_bucket"), None);
    assert_eq!(
        tag("vllm:gpu_prefix_cache_hits_total"),
        Some(Tag {
            series: Series::PrefixHits,
            name: 1
        })
    );
    assert_eq!(
        tag("vllm:prefix_cache_hits"),
        tag("vllm:prefix_cache_hits_total")
    );
    assert_eq!(tag("vllm:num_requests_waiting_total"), None);
    assert_eq!(tag("vllm:e2e_request_latency_seconds_bucket"), None);
    assert_eq!(tag("vllm:num_preemptions_total"), None);
    assert_eq!(
        tag("process_start_time_seconds").map(|t| t.series),
        Some(Series::ProcessStart)
    );
    assert_eq!(parse_metrics(&page).unwrap().itl_count, Some(42.0));
}

#[test]
fn reads_vllm_names_deprecated_names_and_labels() {
    let metrics = parse_metrics(PAGE).expect("valid page");
    assert_eq!((metrics.running, metrics.waiting), (3, 2));
    assert!((metrics.kv_usage - 0.25).abs() < 1e-12);
    assert_eq!(metrics.block_size, Some(16));
    assert_eq!(metrics.num_gpu_blocks, Some(2048));
    assert_eq!(metrics.prefix_hit_rate(), Some(0.25));
    assert_eq!(metrics.deprecated, vec!["vllm:gpu_cache_usage_perc"]);
    // The served model: the running gauge's `model_name`.
    assert_eq!(metrics.model_name.as_deref(), Some("m"));
    let prompt = metrics.prompt_tokens.expect("histogram");
    assert_eq!(prompt.count(), 10.0);
    assert_eq!(prompt.buckets[0], (100.0, 4.0));
    assert_eq!(prompt.sum, Some(3000.0));
}

#[test]
fn garbage_and_truncation_name_what_is_missing() {
    assert_eq!(
        parse_metrics("<html>nope</html>\x00\u{fffd}"),
        Err(TextError::Missing("vllm:num_requests_waiting"))
    );
    let truncated = &PAGE[..PAGE.find("vllm:gpu_cache").expect("in page")];
    assert_eq!(
        parse_metrics(truncated),
        Err(TextError::Missing("vllm:kv_cache_usage_perc"))
    );
}

#[test]
fn sglang_names_are_read() {
    let page = "sglang:num_queue_reqs 4\nsglang:num_running_reqs 1\nsglang:token_usage 0.5\n";
    let metrics = parse_metrics(page).expect("valid page");
    assert_eq!((metrics.waiting, metrics.running), (4, 1));
    assert!(metrics.deprecated.is_empty());
}

#[test]
fn a_new_start_time_or_a_counter_going_back_is_a_restart() {
    let page = |start: Option<f64>, queries: f64| RestartMarks {
        start,
        counters: [Some(queries), Some(10.0), None, Some(3.0), None],
    };
    let before = page(Some(100.0), 500.0);
    assert!(!page(Some(100.0), 600.0).restarted_since(&before));
    assert!(page(Some(160.0), 600.0).restarted_since(&before));
    assert!(page(Some(100.0), 20.0).restarted_since(&before));
    assert!(page(None, 20.0).restarted_since(&page(None, 500.0)));
    assert!(!page(None, 500.0).restarted_since(&page(None, 500.0)));
    // A counter that appears or disappears says nothing.
    let mut gone = page(Some(100.0), 600.0);
    gone.counters[0] = None;
    assert!(!gone.restarted_since(&before));
    // Read from a page: the process collector's start time.
    let text = "vllm:num_requests_waiting 0\nvllm:num_requests_running 0\n\
                vllm:kv_cache_usage_perc 0\nprocess_start_time_seconds 1.7e9\n";
    let metrics = parse_metrics(text).expect("a minimal page");
    assert_eq!(metrics.restart_marks().start, Some(1.7e9));
}

/// One line of a random page: a name the reading knows (under any of its spellings and
/// suffixes) or not, labels the reading looks at, and values in and out of range.
fn line() -> impl proptest::strategy::Strategy<Value = String> {
    use proptest::prelude::*;
    let known: Vec<&str> = super::reference::WANTED
        .iter()
        .flat_map(|names| names.iter().map(|(name, _)| *name))
        .chain([
            "vllm:e2e_request_latency_seconds",
            "vllm:num_preemptions",
            "other",
        ])
        .collect();
    let suffixes = [
        "", "", "_total", "_bucket", "_bucket", "_sum", "_count", "_created",
    ];
    let labels = prop::collection::vec(
        prop::sample::select(vec![
            r#"engine="0""#,
            r#"engine="1""#,
            r#"model_name="m""#,
            r#"le="1.0""#,
            r#"le="10.0""#,
            r#"le="+Inf""#,
            r#"le="NaN""#,
            r#"le="x""#,
            r#"block_size="16""#,
            r#"page_size="32""#,
            r#"num_gpu_blocks="2048""#,
            r#"num_pages="0""#,
        ]),
        0..4,
    );
    let values = prop::sample::select(vec![
        "0", "1", "2.5", "3.0", "7", "100", "150.0", "-1", "NaN", "+Inf", "1e3", "0.25",
    ]);
    (
        prop::sample::select(known),
        prop::sample::select(suffixes.to_vec()),
        labels,
        values,
        0..8_u8,
    )
        .prop_map(|(name, suffix, labels, value, shape)| match shape {
            0 => format!("# TYPE {name}{suffix} gauge"),
            1 => format!("{name}{suffix} {value}"),
            _ => format!("{name}{suffix}{{{}}} {value}", labels.join(",")),
        })
}

/// The three required gauges under any of their names, in range (so that most pages get past
/// the checks and the rest of the reading is compared too), each to be put at a random place.
fn required() -> impl proptest::strategy::Strategy<Value = Vec<(usize, String)>> {
    use proptest::prelude::*;
    let names = |table: &[(&'static str, bool)]| {
        prop::sample::select(table.iter().map(|(name, _)| *name).collect::<Vec<_>>())
    };
    (
        (names(WAITING), 0..40_u32, any::<usize>()),
        (names(RUNNING), 0..40_u32, any::<usize>(), any::<bool>()),
        (names(KV_USAGE), 0..=100_u32, any::<usize>()),
    )
        .prop_map(|(waiting, running, kv)| {
            vec![
                (waiting.2, format!("{} {}", waiting.0, waiting.1)),
                (
                    running.2,
                    if running.3 {
                        format!("{}{{engine=\"1\"}} {}", running.0, running.1)
                    } else {
                        format!("{} {}", running.0, running.1)
                    },
                ),
                (kv.2, format!("{} {}", kv.0, f64::from(kv.1) / 100.0)),
            ]
        })
}

proptest::proptest! {
    /// The one-pass reading equals the reference reading (every sample collected, then each
    /// series looked up) on random pages: names in and out of the tables under every suffix,
    /// repeated and interleaved series, several label sets, engines, bounds that do not parse,
    /// values out of range; most pages carry the required gauges, so their histograms,
    /// counters, cache info, engines and deprecated names are compared too.
    #[test]
    fn the_one_pass_reading_equals_the_reference(
        lines in proptest::collection::vec(line(), 0..60),
        required in proptest::option::weighted(0.8, required()),
        grouped: bool,
    ) {
        let mut lines = lines;
        for (at, line) in required.into_iter().flatten() {
            lines.insert(at % (lines.len() + 1), line);
        }
        if grouped {
            // As a server writes it: each name's lines together.
            lines.sort_by(|a, b| {
                let name = |line: &str| line.split(['{', ' ']).next().map(str::to_owned);
                name(a).cmp(&name(b))
            });
        }
        let page = lines.join("\n");
        let ours = format!("{:?}", parse_metrics(&page));
        let reference = format!("{:?}", super::reference::parse_metrics(&page));
        proptest::prop_assert_eq!(ours, reference, "{}", page);
    }
}

#[test]
fn the_realistic_page_reads_as_the_reference_reads_it() {
    for scrape in [0, 1, 7, 1000] {
        let page = crate::live::bench::vllm_page_at(scrape);
        assert_eq!(
            format!("{:?}", parse_metrics(&page)),
            format!("{:?}", super::reference::parse_metrics(&page))
        );
        assert!(parse_metrics(&page).is_ok());
    }
}

/// The NIXL connector's series as vLLM's `NixlPromMetrics` registers them through
/// prometheus-client (per-engine children, histograms with `_created`, the counter's
/// `_total`), on a decode pod with two engines.
const NIXL: &str = "\
# HELP vllm:nixl_xfer_time_seconds Histogram of transfer duration for NIXL KV Cache transfers.
# TYPE vllm:nixl_xfer_time_seconds histogram
vllm:nixl_xfer_time_seconds_bucket{engine=\"0\",le=\"0.005\",model_name=\"m\"} 0.0
vllm:nixl_xfer_time_seconds_bucket{engine=\"0\",le=\"5.0\",model_name=\"m\"} 30.0
vllm:nixl_xfer_time_seconds_bucket{engine=\"0\",le=\"+Inf\",model_name=\"m\"} 30.0
vllm:nixl_xfer_time_seconds_count{engine=\"0\",model_name=\"m\"} 30.0
vllm:nixl_xfer_time_seconds_sum{engine=\"0\",model_name=\"m\"} 1.5
vllm:nixl_xfer_time_seconds_count{engine=\"1\",model_name=\"m\"} 10.0
vllm:nixl_xfer_time_seconds_sum{engine=\"1\",model_name=\"m\"} 0.5
# HELP vllm:nixl_xfer_time_seconds_created Histogram of transfer duration for NIXL KV Cache transfers.
# TYPE vllm:nixl_xfer_time_seconds_created gauge
vllm:nixl_xfer_time_seconds_created{engine=\"0\",model_name=\"m\"} 1.7e9
# TYPE vllm:nixl_post_time_seconds histogram
vllm:nixl_post_time_seconds_count{engine=\"0\",model_name=\"m\"} 30.0
vllm:nixl_post_time_seconds_sum{engine=\"0\",model_name=\"m\"} 0.03
# TYPE vllm:nixl_bytes_transferred histogram
vllm:nixl_bytes_transferred_bucket{engine=\"0\",le=\"2048.0\",model_name=\"m\"} 0.0
vllm:nixl_bytes_transferred_count{engine=\"0\",model_name=\"m\"} 30.0
vllm:nixl_bytes_transferred_sum{engine=\"0\",model_name=\"m\"} 3.0e9
vllm:nixl_bytes_transferred_sum{engine=\"1\",model_name=\"m\"} 1.0e9
# TYPE vllm:nixl_num_descriptors histogram
vllm:nixl_num_descriptors_count{engine=\"0\",model_name=\"m\"} 30.0
vllm:nixl_num_descriptors_sum{engine=\"0\",model_name=\"m\"} 120000.0
# TYPE vllm:nixl_num_failed_transfers counter
vllm:nixl_num_failed_transfers_total{engine=\"0\",model_name=\"m\"} 2.0
vllm:nixl_num_failed_transfers_created{engine=\"0\",model_name=\"m\"} 1.7e9
# TYPE vllm:nixl_num_failed_notifications counter
vllm:nixl_num_failed_notifications_total{engine=\"0\",model_name=\"m\"} 5.0
";

#[test]
fn the_nixl_counters_are_summed_over_engines() {
    let metrics = parse_metrics(&format!("{PAGE}{NIXL}")).expect("a decode pod's page");
    let transfers = metrics
        .transfers
        .expect("the pull histogram is on the page");
    assert_eq!(transfers.transfers, 40.0);
    assert_eq!(transfers.seconds, 2.0);
    assert_eq!(transfers.bytes, 4.0e9);
    assert_eq!(transfers.descriptors, 120_000.0);
    assert_eq!(
        transfers.failed, 2.0,
        "failed notifications are not failed transfers"
    );
    assert_eq!(metrics.running, 3, "the gauges are read as before");
}

#[test]
fn a_pod_without_a_kv_connector_has_no_transfer_counters() {
    assert_eq!(parse_metrics(PAGE).expect("page").transfers, None);
}

/// vLLM's finished-request counter as prometheus-client writes it: one series per engine and
/// `finished_reason`, with `_total` and `_created`.
#[test]
fn finished_requests_sum_every_reason_and_engine_and_fall_back_to_the_prompt_count() {
    let page = format!(
        "{PAGE}\
# TYPE vllm:request_success counter
vllm:request_success_total{{engine=\"0\",finished_reason=\"stop\",model_name=\"m\"}} 40.0
vllm:request_success_created{{engine=\"0\",finished_reason=\"stop\",model_name=\"m\"}} 1.7e9
vllm:request_success_total{{engine=\"0\",finished_reason=\"length\",model_name=\"m\"}} 5.0
vllm:request_success_total{{engine=\"1\",finished_reason=\"abort\",model_name=\"m\"}} 2.0
"
    );
    let metrics = parse_metrics(&page).expect("a page with the counter");
    assert_eq!(metrics.request_success, Some(47.0));
    assert_eq!(metrics.finished_requests(), Some(47.0));
    assert_eq!(metrics.restart_marks().counters[4], Some(47.0));
    // Without it, the prompt-length histogram's count (observed once per finished request).
    let metrics = parse_metrics(PAGE).expect("the page");
    assert_eq!(metrics.request_success, None);
    assert_eq!(metrics.finished_requests(), Some(10.0));
    // A counter that went back is a restart.
    let before = parse_metrics(&page).expect("page").restart_marks();
    let after = parse_metrics(&page.replace("} 40.0", "} 1.0"))
        .expect("page")
        .restart_marks();
    assert!(after.restarted_since(&before));
}
