//! A pod's `/metrics` page → the numbers the mirror needs ([`PodMetrics`]).
//!
//! The page is scanned once by [`crate::prom_text::scan`] (only the lines of the series read
//! here are read past their name), each sample filed by series as it comes. It accepts
//! vLLM's current and deprecated names
//! (`vllm:kv_cache_usage_perc` / `vllm:gpu_cache_usage_perc`,
//! `vllm:inter_token_latency_seconds` / `vllm:time_per_output_token_seconds`,
//! `vllm:prefix_cache_*` / `vllm:gpu_prefix_cache_*`), counters with or without `_total`,
//! any `model_name`/`engine` labels (series are summed; usage is averaged), and the SGLang
//! names of the model-server protocol (`sglang:num_queue_reqs`, `sglang:num_running_reqs`,
//! `sglang:token_usage`, cache info `page_size`/`num_pages`). A page without the three
//! required gauges is an error that names what is missing: the parser skips lines it cannot
//! read, so garbage or truncated text shows up here.

use std::borrow::Cow;

pub use crate::prom_text::Histogram;
use crate::prom_text::{self, HistogramBuilder, Sample};
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
    /// Finished requests (`vllm:request_success_total`, summed over `finished_reason` and
    /// engines): counted once per request the engine finishes, whatever the reason.
    pub request_success: Option<f64>,
    /// When the pod's process started (`process_start_time_seconds`), if exported.
    pub process_start: Option<f64>,
    /// Data-parallel engines the page reports (distinct `engine` label values of
    /// `cache_config_info`, else of the running gauge; 1 when unlabelled).
    pub engines: u32,
    /// Deprecated names this page used (reported on /metrics).
    pub deprecated: Vec<&'static str>,
    /// The served model: the `model_name` label of the first running-gauge sample (vLLM's
    /// `--served-model-name`, else the model it loaded).
    pub model_name: Option<String>,
    /// The NIXL connector's counters (summed over engines), if the page has its pull
    /// histogram (a decode pod of a P/D pool).
    pub transfers: Option<crate::cluster::transfer_fit::TransferCounters>,
}

/// What tells one run of a pod's process from the next: its start time and its counters
/// (a counter that goes back means the process restarted, as Prometheus reads a reset).
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub struct RestartMarks {
    /// `process_start_time_seconds`.
    pub start: Option<f64>,
    /// Prefix-cache queries, prompt- and generation-length counts, ITL count, finished
    /// requests.
    pub counters: [Option<f64>; 5],
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
                self.request_success,
            ],
        }
    }

    /// Requests the pod has finished since its process started, if the page says:
    /// `vllm:request_success_total` (every finish reason), else the `_count` of the
    /// prompt-length histogram (observed once per finished request, in the same loop).
    /// `None` when neither is on the page or the value is not a finite count.
    pub fn finished_requests(&self) -> Option<f64> {
        self.request_success
            .or_else(|| self.prompt_tokens.as_ref().map(Histogram::count))
            .filter(|count| count.is_finite() && *count >= 0.0)
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
/// vLLM's NIXL connector (`kv_connector/v1/nixl_connector.py`, `NixlPromMetrics`): the pull
/// duration histogram (its `_count` and `_sum`), the bytes and descriptors histograms (their
/// `_sum`), the failed-transfer counter.
const NIXL_XFER: &[(&str, bool)] = &[("vllm:nixl_xfer_time_seconds", false)];
const NIXL_BYTES: &[(&str, bool)] = &[("vllm:nixl_bytes_transferred", false)];
const NIXL_DESCRIPTORS: &[(&str, bool)] = &[("vllm:nixl_num_descriptors", false)];
const NIXL_FAILED: &[(&str, bool)] = &[("vllm:nixl_num_failed_transfers", false)];
/// vLLM's finished-request counter (`vllm/v1/metrics/loggers.py`, one series per
/// `finished_reason`: `stop`, `length`, `abort`, ...).
const REQUEST_SUCCESS: &[(&str, bool)] = &[("vllm:request_success", false)];

/// The series this module reads, each read under one of its names ([`Series::names`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Series {
    Waiting,
    Running,
    KvUsage,
    PrefixQueries,
    PrefixHits,
    /// The inter-token-latency histogram's `_count` (its buckets are not read).
    ItlCount,
    ProcessStart,
    /// The NIXL pull histogram's `_count`, its `_sum`, the bytes' and descriptors' `_sum`,
    /// the failed-transfer counter.
    NixlTransfers,
    NixlSeconds,
    NixlBytes,
    NixlDescriptors,
    NixlFailed,
    /// The finished-request counter, summed over its `finished_reason` and `engine` labels.
    RequestSuccess,
    CacheInfo,
    PromptBucket,
    PromptSum,
    GenerationBucket,
    GenerationSum,
}

impl Series {
    /// The series summed (or averaged) over label sets, in the order that indexes
    /// [`Reading::sums`] (`series as usize`): the variants before `CacheInfo`.
    const SUMMED: [Series; 13] = [
        Series::Waiting,
        Series::Running,
        Series::KvUsage,
        Series::PrefixQueries,
        Series::PrefixHits,
        Series::ItlCount,
        Series::ProcessStart,
        Series::NixlTransfers,
        Series::NixlSeconds,
        Series::NixlBytes,
        Series::NixlDescriptors,
        Series::NixlFailed,
        Series::RequestSuccess,
    ];

    /// The names the series is published under, current first (the table above).
    const fn names(self) -> &'static [(&'static str, bool)] {
        match self {
            Series::Waiting => WAITING,
            Series::Running => RUNNING,
            Series::KvUsage => KV_USAGE,
            Series::PrefixQueries => PREFIX_QUERIES,
            Series::PrefixHits => PREFIX_HITS,
            Series::ItlCount => ITL,
            Series::ProcessStart => PROCESS_START,
            Series::NixlTransfers | Series::NixlSeconds => NIXL_XFER,
            Series::NixlBytes => NIXL_BYTES,
            Series::NixlDescriptors => NIXL_DESCRIPTORS,
            Series::NixlFailed => NIXL_FAILED,
            Series::RequestSuccess => REQUEST_SUCCESS,
            Series::CacheInfo => CACHE_INFO,
            Series::PromptBucket | Series::PromptSum => PROMPT,
            Series::GenerationBucket | Series::GenerationSum => GENERATION,
        }
    }

    /// The token histogram a bucket or sum series belongs to: its row in
    /// [`Reading::histograms`] (prompt 0, generation 1).
    const fn token_histogram(self) -> usize {
        match self {
            Series::GenerationBucket | Series::GenerationSum => 1,
            _ => 0,
        }
    }
}

/// The most names a summed series has (its row in [`Reading::sums`]).
const SUMMED_NAMES: usize = 3;

/// The most names a token histogram has (its row in [`Reading::histograms`]).
const HISTOGRAM_NAMES: usize = 2;

// The readings' arrays are sized from the tables: a name added to a table must fit, and the
// summed series must be the first variants, in order.
const _: () = {
    let mut at = 0;
    while at < Series::SUMMED.len() {
        assert!(Series::SUMMED[at] as usize == at);
        assert!(Series::SUMMED[at].names().len() <= SUMMED_NAMES);
        at += 1;
    }
    assert!(Series::CacheInfo as usize == Series::SUMMED.len());
    assert!(PROMPT.len() <= HISTOGRAM_NAMES && GENERATION.len() <= HISTOGRAM_NAMES);
};

/// What a sample line is to [`parse_metrics`]: its series and which of the series' names it
/// carries (its index in [`Series::names`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Tag {
    series: Series,
    name: usize,
}

/// The tag of a sample name, `None` for the rest of a page (mostly latency histograms, not
/// read past each line's name). Gauges and the info gauge by their exact name, counters with
/// or without `_total`, the token histograms' `_bucket` and `_sum`, the inter-token-latency
/// histogram's `_count` only.
fn tag(name: &str) -> Option<Tag> {
    if !(name.starts_with("vllm:") || name.starts_with("sglang:") || name.starts_with("process_")) {
        return None;
    }
    let (base, suffix) = ["_bucket", "_sum", "_count", "_total"]
        .iter()
        .find_map(|suffix| name.strip_suffix(suffix).map(|base| (base, *suffix)))
        .unwrap_or((name, ""));
    match suffix {
        "_bucket" => tag_among(base, [Series::PromptBucket, Series::GenerationBucket]),
        "_sum" => tag_among(
            base,
            [
                Series::PromptSum,
                Series::GenerationSum,
                Series::NixlSeconds,
                Series::NixlBytes,
                Series::NixlDescriptors,
            ],
        ),
        "_count" => tag_among(base, [Series::ItlCount, Series::NixlTransfers]),
        "_total" => tag_among(
            base,
            [
                Series::PrefixQueries,
                Series::PrefixHits,
                Series::NixlFailed,
                Series::RequestSuccess,
            ],
        ),
        _ => tag_among(
            name,
            [
                Series::Waiting,
                Series::Running,
                Series::KvUsage,
                Series::PrefixQueries,
                Series::PrefixHits,
                Series::ProcessStart,
                Series::NixlFailed,
                Series::RequestSuccess,
                Series::CacheInfo,
            ],
        ),
    }
}

/// The first of `candidates` with a name `base`, and which of its names it is (a fixed-size
/// array, so the search unrolls over the constant tables).
fn tag_among<const N: usize>(base: &str, candidates: [Series; N]) -> Option<Tag> {
    candidates.into_iter().find_map(|series| {
        series
            .names()
            .iter()
            .position(|(known, _)| *known == base)
            .map(|name| Tag { series, name })
    })
}

/// A page's samples filed by series in one pass ([`prom_text::scan`]).
#[derive(Default)]
struct Reading<'a> {
    /// (label sets, sum) of each summed series ([`Series::SUMMED`], in order) under each of
    /// its names.
    sums: [[(u32, f64); SUMMED_NAMES]; Series::SUMMED.len()],
    /// The first cache-config info sample, under either name.
    cache_info: Option<Sample<'a>>,
    /// `engine` labels of the cache-config info samples.
    cache_engines: Vec<Cow<'a, str>>,
    /// `engine` labels of the running gauge's samples (the engines when there is no info).
    running_engines: Vec<Cow<'a, str>>,
    /// The `model_name` label of the first running-gauge sample that has one.
    model_name: Option<Cow<'a, str>>,
    /// The prompt and generation histograms ([`Series::token_histogram`]) under each of
    /// their names.
    histograms: [[HistogramBuilder; HISTOGRAM_NAMES]; 2],
    /// Deprecated names the values taken so far were read under.
    deprecated: Vec<&'static str>,
}

impl<'a> Reading<'a> {
    fn file(&mut self, tag: Tag, sample: Sample<'a>) {
        match tag.series {
            Series::CacheInfo => {
                self.cache_engines.extend(sample.label("engine"));
                self.cache_info.get_or_insert(sample);
            }
            series @ (Series::PromptBucket | Series::GenerationBucket) => {
                self.histograms[series.token_histogram()][tag.name].bucket(&sample);
            }
            series @ (Series::PromptSum | Series::GenerationSum) => {
                self.histograms[series.token_histogram()][tag.name].sum(sample.value);
            }
            series => {
                if series == Series::Running {
                    self.running_engines.extend(sample.label("engine"));
                    if self.model_name.is_none() {
                        self.model_name = sample.label("model_name");
                    }
                }
                let (count, sum) = &mut self.sums[series as usize][tag.name];
                *count += 1;
                *sum += sample.value;
            }
        }
    }

    /// The first of `series`' names with samples: their sum or mean over label sets (the
    /// name noted if deprecated).
    fn summed(&mut self, series: Series, combine: Combine) -> Option<f64> {
        let (&(name, deprecated), &(count, sum)) = series
            .names()
            .iter()
            .zip(&self.sums[series as usize])
            .find(|(_, (count, _))| *count > 0)?;
        if deprecated {
            self.deprecated.push(name);
        }
        Some(match combine {
            Combine::Sum => sum,
            Combine::Mean => sum / f64::from(count),
        })
    }

    /// The NIXL counters, if the pull histogram's `_count` is on the page (its other series
    /// absent count 0: vLLM registers them together).
    fn transfers(&mut self) -> Option<crate::cluster::transfer_fit::TransferCounters> {
        let transfers = self.summed(Series::NixlTransfers, Combine::Sum)?;
        let mut sum = |series| self.summed(series, Combine::Sum).unwrap_or(0.0);
        Some(crate::cluster::transfer_fit::TransferCounters {
            transfers,
            seconds: sum(Series::NixlSeconds),
            bytes: sum(Series::NixlBytes),
            descriptors: sum(Series::NixlDescriptors),
            failed: sum(Series::NixlFailed),
        })
    }

    /// [`Reading::summed`] of a required gauge: missing is an error naming its current name.
    fn required(&mut self, series: Series, combine: Combine) -> Result<f64, TextError> {
        self.summed(series, combine)
            .ok_or(TextError::Missing(series.names()[0].0))
    }

    /// The first of the token histogram's names published as a histogram (`_bucket`
    /// samples; the name noted if deprecated).
    fn histogram(&mut self, series: Series) -> Option<Histogram> {
        let builders = std::mem::take(&mut self.histograms[series.token_histogram()]);
        let (&(name, deprecated), builder) = series
            .names()
            .iter()
            .zip(builders)
            .find(|(_, builder)| builder.found())?;
        if deprecated {
            self.deprecated.push(name);
        }
        builder.finish()
    }
}

/// Distinct values, counted.
fn distinct(mut values: Vec<Cow<'_, str>>) -> u32 {
    values.sort_unstable();
    values.dedup();
    u32::try_from(values.len()).unwrap_or(u32::MAX)
}

/// Parses one `/metrics` page.
pub fn parse_metrics(text: &str) -> Result<PodMetrics, TextError> {
    let mut reading = Reading::default();
    prom_text::scan(text, tag, |tag, sample| reading.file(tag, sample));
    let waiting = reading.required(Series::Waiting, Combine::Sum)?;
    let running = reading.required(Series::Running, Combine::Sum)?;
    let kv_usage = reading.required(Series::KvUsage, Combine::Mean)?;
    let (waiting, running, kv_usage) = checked_gauges(waiting, running, kv_usage)?;
    let prompt_tokens = reading.histogram(Series::PromptBucket);
    let generation_tokens = reading.histogram(Series::GenerationBucket);
    // Of the inter-token-latency histogram only the count is read (a counter going back is
    // a restart sign).
    let itl_count = reading.summed(Series::ItlCount, Combine::Sum);
    let prefix_queries = reading.summed(Series::PrefixQueries, Combine::Sum);
    let prefix_hits = reading.summed(Series::PrefixHits, Combine::Sum);
    let request_success = reading.summed(Series::RequestSuccess, Combine::Sum);
    let process_start = reading.summed(Series::ProcessStart, Combine::Mean);
    let transfers = reading.transfers();
    let engines = match distinct(std::mem::take(&mut reading.cache_engines)) {
        0 => distinct(std::mem::take(&mut reading.running_engines)).max(1),
        engines => engines,
    };
    let info = reading.cache_info.as_ref();
    let mut deprecated = std::mem::take(&mut reading.deprecated);
    deprecated.sort_unstable();
    deprecated.dedup();
    Ok(PodMetrics {
        waiting,
        running,
        kv_usage,
        block_size: info.and_then(|info| prom_text::label_u32(info, &["block_size", "page_size"])),
        num_gpu_blocks: info
            .and_then(|info| prom_text::label_u32(info, &["num_gpu_blocks", "num_pages"])),
        prompt_tokens,
        generation_tokens,
        prefix_queries,
        prefix_hits,
        itl_count,
        request_success,
        process_start,
        engines,
        deprecated,
        model_name: reading.model_name.take().map(Cow::into_owned),
        transfers,
    })
}

/// The three required gauges as the mirror takes them: whole counts in `u32`, the KV usage
/// a fraction in [0, 1] (vLLM reports a fraction; some SGLang versions a percentage).
fn checked_gauges(waiting: f64, running: f64, kv_usage: f64) -> Result<(u32, u32, f64), TextError> {
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
    Ok((waiting, running, kv_usage))
}

#[derive(Clone, Copy)]
enum Combine {
    Sum,
    Mean,
}

#[cfg(test)]
mod reference;
#[cfg(test)]
mod tests;
