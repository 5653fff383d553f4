//! The realistic vLLM `/metrics` page a busy pod serves (the families of
//! `vllm/v1/metrics/loggers.py` with their label sets and buckets), a new one at every
//! scrape: what `ditto bench`'s live-mirror case serves from its fake pods
//! (`bench::serve_fake_pods`), what the criterion bench `live_scrape` parses, and a fixture of
//! the text reader's tests.

use std::fmt::Write as _;

/// A vLLM v1 `/metrics` page of realistic size (the families of `vllm/v1/metrics/loggers.py`
/// with their label sets and 1-2-5 / latency buckets).
pub fn vllm_page() -> String {
    vllm_page_at(0)
}

/// [`vllm_page`] as a busy pod serves it at its `scrape`-th scrape: gauges move and every
/// counter and histogram has grown since the scrape before (a busy vLLM pod's page is never
/// the same twice at 50 ms), so nothing can be skipped as unchanged.
pub fn vllm_page_at(scrape: u64) -> String {
    let grown = scrape as f64;
    let labels = r#"engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct""#;
    let mut page = String::new();
    for (name, value) in [
        ("vllm:num_requests_running", 12.0 + (scrape % 7) as f64),
        ("vllm:num_requests_waiting", (scrape % 4) as f64),
        (
            "vllm:kv_cache_usage_perc",
            0.42 + (scrape % 10) as f64 / 100.0,
        ),
    ] {
        let _ = writeln!(
            page,
            "# HELP {name} gauge\n# TYPE {name} gauge\n{name}{{{labels}}} {value}"
        );
    }
    let _ = writeln!(
        page,
        "# HELP vllm:cache_config_info info\n# TYPE vllm:cache_config_info gauge\nvllm:cache_config_info{{block_size=\"16\",num_gpu_blocks=\"26312\",engine=\"0\"}} 1.0"
    );
    for name in [
        "vllm:prefix_cache_queries",
        "vllm:prefix_cache_hits",
        "vllm:num_preemptions",
        "vllm:prompt_tokens",
        "vllm:generation_tokens",
    ] {
        let _ = writeln!(
            page,
            "# HELP {name} counter\n# TYPE {name} counter\n{name}_total{{{labels}}} {:?}",
            123_456.0 + 97.0 * grown
        );
    }
    let tokens = [
        1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000,
    ];
    let seconds = [
        0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
        20.0, 40.0, 80.0,
    ];
    let histogram = |page: &mut String, name: &str, bounds: &[f64]| {
        let _ = writeln!(page, "# HELP {name} histogram\n# TYPE {name} histogram");
        for (i, le) in bounds.iter().enumerate() {
            let _ = writeln!(
                page,
                "{name}_bucket{{{labels},le=\"{le:?}\"}} {:?}",
                ((i + 1) * 10) as f64 + grown * (i + 1) as f64
            );
        }
        let total = ((bounds.len() + 1) * 10) as f64 + grown * (bounds.len() + 1) as f64;
        let _ = writeln!(page, "{name}_bucket{{{labels},le=\"+Inf\"}} {total:?}");
        let _ = writeln!(page, "{name}_count{{{labels}}} {total:?}");
        let _ = writeln!(page, "{name}_sum{{{labels}}} {:?}", 98_765.0 + 3.5 * grown);
    };
    let token_bounds: Vec<f64> = tokens.iter().map(|&t| f64::from(t)).collect();
    for name in [
        "vllm:request_prompt_tokens",
        "vllm:request_generation_tokens",
        "vllm:request_params_max_tokens",
    ] {
        histogram(&mut page, name, &token_bounds);
    }
    for name in [
        "vllm:time_to_first_token_seconds",
        "vllm:inter_token_latency_seconds",
        "vllm:request_time_per_output_token_seconds",
        "vllm:e2e_request_latency_seconds",
        "vllm:request_queue_time_seconds",
        "vllm:request_inference_time_seconds",
        "vllm:request_prefill_time_seconds",
        "vllm:request_decode_time_seconds",
    ] {
        histogram(&mut page, name, &seconds);
    }
    page
}
