//! A pod's `/metrics` page → the numbers the mirror needs ([`PodMetrics`]).
//!
//! The page is parsed by [`crate::prom_text`] (only the lines of the families read here are
//! read past their name); this module picks the engine's series. It accepts vLLM's current and deprecated names
//! (`vllm:kv_cache_usage_perc` / `vllm:gpu_cache_usage_perc`,
//! `vllm:inter_token_latency_seconds` / `vllm:time_per_output_token_seconds`,
//! `vllm:prefix_cache_*` / `vllm:gpu_prefix_cache_*`), counters with or without `_total`,
//! any `model_name`/`engine` labels (series are summed; usage is averaged), and the SGLang
//! names of the model-server protocol (`sglang:num_queue_reqs`, `sglang:num_running_reqs`,
//! `sglang:token_usage`, cache info `page_size`/`num_pages`). A page without the three
//! required gauges is an error that names what is missing: the parser skips lines it cannot
//! read, so garbage or truncated text shows up here.

pub use crate::prom_text::Histogram;
use crate::prom_text::{self, Sample, family};
use thiserror::Error;

/// Why a page could not be used.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum TextError {
    /// A required gauge is absent (garbage, truncated text, or not a model server).
    #[error("metrics text: no {0} (nor its deprecated or SGLang names)")]
    Missing(&'static str),
    /// A value is out of its range.
    #[error("metrics text: {name} = {value} is out of range")]
    OutOfRange {
        /// The series.
        name: &'static str,
        /// The value read.
        value: String,
    },
}

/// What one scrape of one pod says.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct PodMetrics {
    /// Requests waiting.
    pub waiting: u32,
    /// Requests running.
    pub running: u32,
    /// KV-cache usage in [0, 1].
    pub kv_usage: f64,
    /// `block_size` (or SGLang `page_size`) from the cache-config info gauge.
    pub block_size: Option<u32>,
    /// `num_gpu_blocks` (or SGLang `num_pages`) from the cache-config info gauge.
    pub num_gpu_blocks: Option<u32>,
    /// Prompt lengths of finished requests (`vllm:request_prompt_tokens`).
    pub prompt_tokens: Option<Histogram>,
    /// Output lengths of finished requests (`vllm:request_generation_tokens`).
    pub generation_tokens: Option<Histogram>,
    /// Prefix-cache queries, tokens (counter).
    pub prefix_queries: Option<f64>,
    /// Prefix-cache hits, tokens (counter).
    pub prefix_hits: Option<f64>,
    /// Inter-token latency observations (current or deprecated name), for reporting.
    pub itl_count: Option<f64>,
    /// When the pod's process started (`process_start_time_seconds`), if exported.
    pub process_start: Option<f64>,
    /// Data-parallel engines the page reports (distinct `engine` label values of
    /// `cache_config_info`, else of the running gauge; 1 when unlabelled).
    pub engines: u32,
    /// Deprecated names this page used (reported on /metrics).
    pub deprecated: Vec<&'static str>,
}

/// What tells one run of a pod's process from the next: its start time and its counters
/// (a counter that goes back means the process restarted, as Prometheus reads a reset).
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub struct RestartMarks {
    /// `process_start_time_seconds`.
    pub start: Option<f64>,
    /// Prefix-cache queries, prompt- and generation-length counts, ITL count.
    pub counters: [Option<f64>; 4],
}

impl RestartMarks {
    /// True when `self` (a later page) shows a process other than `before`'s: another start
    /// time, or a counter below its earlier value.
    pub fn restarted_since(&self, before: &RestartMarks) -> bool {
        let other_start =
            matches!((self.start, before.start), (Some(now), Some(then)) if now != then);
        let reset = self
            .counters
            .iter()
            .zip(before.counters.iter())
            .any(|pair| matches!(pair, (Some(now), Some(then)) if now < then));
        other_start || reset
    }
}

impl PodMetrics {
    /// The marks of this page's process run.
    pub fn restart_marks(&self) -> RestartMarks {
        RestartMarks {
            start: self.process_start,
            counters: [
                self.prefix_queries,
                self.prompt_tokens.as_ref().map(Histogram::count),
                self.generation_tokens.as_ref().map(Histogram::count),
                self.itl_count,
            ],
        }
    }

    /// Cumulative prefix-cache hit rate in [0, 1], if the counters are present.
    pub fn prefix_hit_rate(&self) -> Option<f64> {
        match (self.prefix_queries, self.prefix_hits) {
            (Some(queries), Some(hits)) if queries > 0.0 => Some((hits / queries).clamp(0.0, 1.0)),
            _ => None,
        }
    }
}

/// Series names, current first, then deprecated (marked), then SGLang.
const WAITING: &[(&str, bool)] = &[
    ("vllm:num_requests_waiting", false),
    ("sglang:num_queue_reqs", false),
];
const RUNNING: &[(&str, bool)] = &[
    ("vllm:num_requests_running", false),
    ("sglang:num_running_reqs", false),
];
const KV_USAGE: &[(&str, bool)] = &[
    ("vllm:kv_cache_usage_perc", false),
    ("vllm:gpu_cache_usage_perc", true),
    ("sglang:token_usage", false),
];
const CACHE_INFO: &[(&str, bool)] = &[
    ("vllm:cache_config_info", false),
    ("sglang:cache_config_info", false),
];
const PROMPT: &[(&str, bool)] = &[
    ("vllm:request_prompt_tokens", false),
    ("sglang:prompt_tokens_histogram", false),
];
const GENERATION: &[(&str, bool)] = &[
    ("vllm:request_generation_tokens", false),
    ("sglang:generation_tokens_histogram", false),
];
const PREFIX_QUERIES: &[(&str, bool)] = &[
    ("vllm:prefix_cache_queries", false),
    ("vllm:gpu_prefix_cache_queries", true),
];
const PREFIX_HITS: &[(&str, bool)] = &[
    ("vllm:prefix_cache_hits", false),
    ("vllm:gpu_prefix_cache_hits", true),
];
const ITL: &[(&str, bool)] = &[
    ("vllm:inter_token_latency_seconds", false),
    ("vllm:time_per_output_token_seconds", true),
];
/// prometheus-client's process collector (vLLM's API server exports it).
const PROCESS_START: &[(&str, bool)] = &[("process_start_time_seconds", false)];

/// Every family this module reads.
const WANTED: [&[(&str, bool)]; 10] = [
    WAITING,
    RUNNING,
    KV_USAGE,
    CACHE_INFO,
    PROMPT,
    GENERATION,
    PREFIX_QUERIES,
    PREFIX_HITS,
    ITL,
    PROCESS_START,
];

/// True for the sample names of the families this module reads (the rest of a vLLM page,
/// mostly latency histograms, is not read past each line's name). Of the inter-token-latency
/// histogram only `_count` is read.
fn wanted(name: &str) -> bool {
    let base = family(name);
    if name.ends_with("_bucket") && ITL.iter().any(|(itl, _)| *itl == base) {
        return false;
    }
    WANTED
        .iter()
        .flat_map(|names| names.iter())
        .any(|(wanted, _)| *wanted == base || *wanted == name)
}

/// Parses one `/metrics` page.
pub fn parse_metrics(text: &str) -> Result<PodMetrics, TextError> {
    let samples = &prom_text::parse(text, wanted);
    let mut metrics = PodMetrics::default();
    let mut note = |names: &[(&'static str, bool)], used: &str| {
        if let Some(&(name, true)) = names.iter().find(|(name, _)| *name == used) {
            metrics.deprecated.push(name);
        }
    };
    let (name, waiting) =
        scalar(samples, WAITING, Combine::Sum).ok_or(TextError::Missing(WAITING[0].0))?;
    note(WAITING, name);
    let (name, running) =
        scalar(samples, RUNNING, Combine::Sum).ok_or(TextError::Missing(RUNNING[0].0))?;
    note(RUNNING, name);
    let (name, kv_usage) =
        scalar(samples, KV_USAGE, Combine::Mean).ok_or(TextError::Missing(KV_USAGE[0].0))?;
    note(KV_USAGE, name);
    let count = |name: &'static str, value: f64| {
        if value.is_finite() && (0.0..=f64::from(u32::MAX)).contains(&value) {
            Ok(value.round() as u32)
        } else {
            Err(TextError::OutOfRange {
                name,
                value: value.to_string(),
            })
        }
    };
    let waiting = count(WAITING[0].0, waiting)?;
    let running = count(RUNNING[0].0, running)?;
    // vLLM reports a fraction; some SGLang versions a percentage.
    let kv_usage = if kv_usage > 1.0 && kv_usage <= 100.0 {
        kv_usage / 100.0
    } else {
        kv_usage
    };
    if !(0.0..=1.0).contains(&kv_usage) {
        return Err(TextError::OutOfRange {
            name: KV_USAGE[0].0,
            value: kv_usage.to_string(),
        });
    }
    let mut metrics = PodMetrics {
        waiting,
        running,
        kv_usage,
        deprecated: std::mem::take(&mut metrics.deprecated),
        ..PodMetrics::default()
    };
    let engines_of = |names: &[(&str, bool)]| {
        let mut engines: Vec<_> = samples
            .iter()
            .filter(|s| names.iter().any(|(name, _)| s.name == *name))
            .filter_map(|s| s.label("engine"))
            .collect();
        engines.sort_unstable();
        engines.dedup();
        u32::try_from(engines.len()).unwrap_or(u32::MAX)
    };
    metrics.engines = match engines_of(CACHE_INFO) {
        0 => engines_of(RUNNING).max(1),
        engines => engines,
    };
    if let Some(info) = samples
        .iter()
        .find(|s| CACHE_INFO.iter().any(|(name, _)| s.name == *name))
    {
        metrics.block_size = prom_text::label_u32(info, &["block_size", "page_size"]);
        metrics.num_gpu_blocks = prom_text::label_u32(info, &["num_gpu_blocks", "num_pages"]);
    }
    let mut histogram_of = |names: &[(&'static str, bool)]| {
        let (name, histogram) = histogram(samples, names)?;
        if let Some(&(name, true)) = names.iter().find(|(n, _)| *n == name) {
            metrics.deprecated.push(name);
        }
        Some(histogram)
    };
    let prompt_tokens = histogram_of(PROMPT);
    let generation_tokens = histogram_of(GENERATION);
    metrics.prompt_tokens = prompt_tokens;
    metrics.generation_tokens = generation_tokens;
    // Of the inter-token-latency histogram only the count is read (a counter going back is
    // a restart sign): its `_count` samples; its buckets are not even kept (`wanted`).
    if let Some((name, _, count)) = first_with(samples, ITL, |sample, name| {
        sample.strip_suffix("_count") == Some(name)
    }) {
        metrics.itl_count = Some(count);
        if let Some(&(name, true)) = ITL.iter().find(|(n, _)| *n == name) {
            metrics.deprecated.push(name);
        }
    }
    for (names, slot) in [
        (PREFIX_QUERIES, &mut metrics.prefix_queries),
        (PREFIX_HITS, &mut metrics.prefix_hits),
    ] {
        if let Some((name, value)) = counter(samples, names) {
            *slot = Some(value);
            if let Some(&(name, true)) = names.iter().find(|(n, _)| *n == name) {
                metrics.deprecated.push(name);
            }
        }
    }
    metrics.process_start = scalar(samples, PROCESS_START, Combine::Mean).map(|(_, start)| start);
    metrics.deprecated.sort_unstable();
    metrics.deprecated.dedup();
    Ok(metrics)
}

#[derive(Clone, Copy)]
enum Combine {
    Sum,
    Mean,
}

/// The first name in `names` with samples, and their sum or mean over label sets.
fn scalar(
    samples: &[Sample<'_>],
    names: &[(&'static str, bool)],
    combine: Combine,
) -> Option<(&'static str, f64)> {
    let (name, count, sum) = first_with(samples, names, |sample, name| sample == name)?;
    Some(match combine {
        Combine::Sum => (name, sum),
        Combine::Mean => (name, sum / f64::from(count)),
    })
}

/// A counter by its name or its name with `_total`, summed over label sets.
fn counter(samples: &[Sample<'_>], names: &[(&'static str, bool)]) -> Option<(&'static str, f64)> {
    first_with(samples, names, |sample, name| {
        sample == name || sample.strip_suffix("_total") == Some(name)
    })
    .map(|(name, _, sum)| (name, sum))
}

/// The first name in `names` with samples that `of` (sample name, series name) accepts, how
/// many there are (label sets) and their sum.
fn first_with(
    samples: &[Sample<'_>],
    names: &[(&'static str, bool)],
    of: impl Fn(&str, &str) -> bool,
) -> Option<(&'static str, u32, f64)> {
    names.iter().find_map(|&(name, _)| {
        let (count, sum) = samples
            .iter()
            .filter(|s| of(s.name, name))
            .fold((0_u32, 0.0), |(count, sum), s| (count + 1, sum + s.value));
        (count > 0).then_some((name, count, sum))
    })
}

/// The first of `names` published as a histogram (buckets and `_sum` summed over label
/// sets).
fn histogram(
    samples: &[Sample<'_>],
    names: &[(&'static str, bool)],
) -> Option<(&'static str, Histogram)> {
    names
        .iter()
        .find_map(|&(name, _)| prom_text::histogram(samples, name).map(|h| (name, h)))
}

#[cfg(test)]
mod tests {
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
        assert!(wanted("vllm:inter_token_latency_seconds_count"));
        assert!(!wanted("vllm:inter_token_latency_seconds_bucket"));
        assert!(wanted("vllm:prefix_cache_hits_total"));
        assert!(!wanted("vllm:e2e_request_latency_seconds_bucket"));
        assert!(!wanted("vllm:num_preemptions_total"));
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
            counters: [Some(queries), Some(10.0), None, Some(3.0)],
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
}
