//! A run measured only through vLLM's own `/metrics`: two scrapes of one server, taken
//! before and after a steady load, become a summary-only [`MeasuredRun`] that `ditto
//! validate` scores and `ditto calibrate` fits, with no per-request ground truth.
//!
//! What the difference of the two scrapes gives (vLLM v1 names; `before` may be absent for
//! a server that started with the load):
//! - requests finished and their mean E2E and TTFT (`vllm:e2e_request_latency_seconds`,
//!   `vllm:time_to_first_token_seconds`; exact, from the `_sum`s; the p90s are not scored:
//!   vLLM's buckets are too coarse for them, 2.5 s then 5 s for E2E);
//! - the mean inter-token latency (`vllm:inter_token_latency_seconds`, or the deprecated
//!   `vllm:time_per_output_token_seconds`), scored as TPOT: both are total decode time over
//!   decoded tokens when every request decodes the same length;
//! - prompt and output length histograms (`vllm:request_prompt_tokens`,
//!   `vllm:request_generation_tokens`) and their exact means (the `_sum`s);
//! - `block_size` and `num_gpu_blocks` from the labels of `vllm:cache_config_info`.
//!
//! The replay sends Poisson arrivals at the measured rate (finished requests over the
//! interval `scrape.yaml` gives) with lengths drawn from the histograms and scaled to their
//! exact means. Only one load level is seen, so a scrape pair pins few coefficients: fit a
//! small set (`--free weights,step_us,queue_us`) from the shipped ones.
//!
//! Text in, no I/O. Errors name the file and the series.

use prometheus_parse::{Sample, Scrape, Value};

use super::FidelityError;
use super::measured::{LengthHistogram, MeasuredRun, Stage};

/// The scrapes' file names inside a run directory, and the interval file.
pub const BEFORE_FILE: &str = "metrics_before.txt";
/// See [`BEFORE_FILE`].
pub const AFTER_FILE: &str = "metrics_after.txt";
/// See [`BEFORE_FILE`].
pub const SCRAPE_FILE: &str = "scrape.yaml";

/// The series read, each with its accepted names (current first).
const E2E: &[&str] = &["vllm:e2e_request_latency_seconds"];
const TTFT: &[&str] = &["vllm:time_to_first_token_seconds"];
const ITL: &[&str] = &[
    "vllm:inter_token_latency_seconds",
    "vllm:time_per_output_token_seconds",
];
const PROMPT: &[&str] = &["vllm:request_prompt_tokens"];
const GENERATION: &[&str] = &["vllm:request_generation_tokens"];
const CACHE_INFO: &str = "vllm:cache_config_info";

/// The Prometheus text parser's name pattern has no `:`; names are escaped to this and back.
const COLON: &str = "__colon__";

/// A cumulative histogram summed over label sets: ascending (bound, cumulative count), the
/// `_sum` and the `_count`.
#[derive(Clone, Debug, Default, PartialEq)]
struct Histogram {
    buckets: Vec<(f64, f64)>,
    sum: f64,
    count: f64,
}

impl Histogram {
    /// `self − before` (a counter difference), refusing a reset.
    fn minus(&self, before: &Histogram, name: &str) -> Result<Histogram, FidelityError> {
        if before.count > self.count || before.sum > self.sum + 1e-9 {
            return Err(bad(format!(
                "{name}: the after scrape counts less than the before one (server restarted?)"
            )));
        }
        let buckets = self
            .buckets
            .iter()
            .map(|&(bound, count)| {
                let earlier = before
                    .buckets
                    .iter()
                    .find(|(b, _)| *b == bound)
                    .map_or(0.0, |&(_, c)| c);
                (bound, (count - earlier).max(0.0))
            })
            .collect();
        Ok(Histogram {
            buckets,
            sum: self.sum - before.sum,
            count: self.count - before.count,
        })
    }

    fn mean(&self) -> f64 {
        self.sum / self.count
    }

    /// Per-bucket (lower, upper, count) for drawing lengths: the +Inf bucket is closed at its
    /// lower bound.
    fn to_lengths(&self) -> LengthHistogram {
        let mut buckets = Vec::new();
        let mut lower = (0.0f64, 0.0f64);
        for &(bound, cumulative) in &self.buckets {
            let upper = if bound.is_infinite() { lower.0 } else { bound };
            let count = cumulative - lower.1;
            if count > 0.0 {
                buckets.push((lower.0.max(1.0), upper.max(1.0), count));
            }
            lower = (bound, cumulative);
        }
        LengthHistogram {
            buckets,
            mean: self.mean(),
        }
    }
}

/// What one scrape holds.
#[derive(Clone, Debug, Default)]
struct Page {
    samples: Vec<Sample>,
}

impl Page {
    fn parse(file: &str, text: &str) -> Result<Page, FidelityError> {
        let lines = text.lines().map(|line| Ok(escape_names(line)));
        let mut scrape = Scrape::parse(lines).map_err(|err| FidelityError::BadFile {
            file: file.into(),
            reason: err.to_string(),
        })?;
        for sample in &mut scrape.samples {
            sample.metric = sample.metric.replace(COLON, ":");
        }
        Ok(Page {
            samples: scrape.samples,
        })
    }

    /// The histogram under the first of `names` present, summed over its label sets.
    fn histogram(&self, names: &[&'static str]) -> Option<(&'static str, Histogram)> {
        names.iter().find_map(|&name| {
            let mut histogram = Histogram::default();
            let mut found = false;
            for sample in &self.samples {
                if sample.metric == name
                    && let Value::Histogram(counts) = &sample.value
                {
                    found = true;
                    for count in counts {
                        match histogram
                            .buckets
                            .iter_mut()
                            .find(|(bound, _)| *bound == count.less_than)
                        {
                            Some(slot) => slot.1 += count.count,
                            None => histogram.buckets.push((count.less_than, count.count)),
                        }
                    }
                } else if sample.metric == format!("{name}_sum") {
                    histogram.sum += plain(&sample.value);
                } else if sample.metric == format!("{name}_count") {
                    histogram.count += plain(&sample.value);
                }
            }
            histogram.buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
            if histogram.count == 0.0 {
                histogram.count = histogram.buckets.last().map_or(0.0, |b| b.1);
            }
            found.then_some((name, histogram))
        })
    }

    /// A label of the cache-config info gauge, as a positive integer.
    fn cache_label(&self, label: &str) -> Option<u32> {
        self.samples
            .iter()
            .find(|s| s.metric == CACHE_INFO)
            .and_then(|s| s.labels.get(label))
            .and_then(|value| value.trim().parse::<f64>().ok())
            .filter(|v| v.is_finite() && *v >= 1.0 && *v <= f64::from(u32::MAX))
            .map(|v| v as u32)
    }
}

fn plain(value: &Value) -> f64 {
    match value {
        Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => *v,
        _ => 0.0,
    }
}

/// Escapes `:` in the metric name of a sample or `# HELP`/`# TYPE` line.
fn escape_names(line: &str) -> String {
    let trimmed = line.trim_start();
    let (head, rest) = if let Some(rest) = trimmed
        .strip_prefix("# HELP ")
        .or_else(|| trimmed.strip_prefix("# TYPE "))
    {
        (&trimmed[..trimmed.len() - rest.len()], rest)
    } else if trimmed.starts_with('#') {
        return line.to_owned();
    } else {
        ("", trimmed)
    };
    let end = rest
        .find(|c: char| c == '{' || c.is_whitespace())
        .unwrap_or(rest.len());
    format!("{head}{}{}", rest[..end].replace(':', COLON), &rest[end..])
}

/// The interval between the scrapes and the GPU (`scrape.yaml`).
#[derive(Clone, Debug, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ScrapeSpec {
    /// Seconds between the two scrapes (or since the server started, without `before`).
    duration_s: f64,
    /// The GPU, when not passed with `--gpu`.
    #[serde(default)]
    gpu: Option<String>,
}

fn bad(reason: String) -> FidelityError {
    FidelityError::BadFile {
        file: AFTER_FILE.into(),
        reason,
    }
}

/// Turns `run` (model and limits already read) into the run the scrapes describe.
pub(super) fn apply_scrapes(
    run: &mut MeasuredRun,
    spec_text: Option<&str>,
    before: Option<&str>,
    after: &str,
) -> Result<(), FidelityError> {
    let spec_text = spec_text.ok_or_else(|| FidelityError::BadFile {
        file: SCRAPE_FILE.into(),
        reason: "missing: `duration_s` (seconds between the scrapes) is needed".into(),
    })?;
    let spec: ScrapeSpec =
        serde_saphyr::from_str(spec_text).map_err(|err| FidelityError::BadFile {
            file: SCRAPE_FILE.into(),
            reason: err.to_string(),
        })?;
    if !(spec.duration_s.is_finite() && spec.duration_s > 0.0 && spec.duration_s < 1e7) {
        return Err(FidelityError::BadFile {
            file: SCRAPE_FILE.into(),
            reason: format!("duration_s: {} must be in (0, 1e7)", spec.duration_s),
        });
    }
    let after = Page::parse(AFTER_FILE, after)?;
    let before = before
        .map(|text| Page::parse(BEFORE_FILE, text))
        .transpose()?;
    let delta = |names: &[&'static str]| -> Result<Histogram, FidelityError> {
        let (name, later) = after
            .histogram(names)
            .ok_or_else(|| bad(format!("no {} histogram", names[0])))?;
        let earlier = before
            .as_ref()
            .and_then(|page| page.histogram(&[name]))
            .map(|(_, h)| h)
            .unwrap_or_default();
        let delta = later.minus(&earlier, name)?;
        if !(delta.count >= 1.0 && delta.sum.is_finite() && delta.sum >= 0.0) {
            return Err(bad(format!("{name}: no observations between the scrapes")));
        }
        Ok(delta)
    };
    let e2e = delta(E2E)?;
    let ttft = delta(TTFT)?;
    let itl = delta(ITL)?;
    let prompt = delta(PROMPT)?;
    let generation = delta(GENERATION)?;
    let duration_us = (spec.duration_s * 1e6).round() as u64;
    run.stages = vec![Stage {
        rate: e2e.count / spec.duration_s,
        start_us: 0,
        duration_us,
    }];
    run.num_requests = Some(e2e.count.round() as u64);
    run.gpu = spec.gpu.or(run.gpu.take());
    if let Some(block_size) = after.cache_label("block_size") {
        run.block_size = block_size;
    }
    if let Some(blocks) = after.cache_label("num_gpu_blocks") {
        run.num_gpu_blocks = Some(blocks);
    }
    run.prompt_lengths = Some(prompt.to_lengths());
    run.output_lengths = Some(generation.to_lengths());
    for stage in [-1, 0] {
        let mut put = |metric: &str, value: f64| {
            run.actuals.insert((stage, metric.to_string()), value);
        };
        put("e2e_mean", e2e.mean() * 1e3);
        put("ttft_mean", ttft.mean() * 1e3);
        put("itl_mean", itl.mean() * 1e3);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: &str = "\
# HELP vllm:e2e_request_latency_seconds Histogram of e2e request latency in seconds.
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_bucket{le=\"1.0\",model_name=\"m\"} 2.0
vllm:e2e_request_latency_seconds_bucket{le=\"2.0\",model_name=\"m\"} 6.0
vllm:e2e_request_latency_seconds_bucket{le=\"+Inf\",model_name=\"m\"} 10.0
vllm:e2e_request_latency_seconds_count{model_name=\"m\"} 10.0
vllm:e2e_request_latency_seconds_sum{model_name=\"m\"} 17.5
vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"7462\"} 1.0
";

    #[test]
    fn reads_vllm_histograms_with_colons_and_labels() {
        let page = Page::parse(AFTER_FILE, PAGE).unwrap();
        let (name, h) = page.histogram(E2E).unwrap();
        assert_eq!(name, "vllm:e2e_request_latency_seconds");
        assert_eq!(h.count, 10.0);
        assert!((h.mean() - 1.75).abs() < 1e-12);
        let lengths = h.to_lengths();
        assert_eq!(
            lengths.buckets,
            vec![(1.0, 1.0, 2.0), (1.0, 2.0, 4.0), (2.0, 2.0, 4.0)]
        );
        assert_eq!(page.cache_label("num_gpu_blocks"), Some(7462));
        assert_eq!(page.cache_label("block_size"), Some(16));
    }

    #[test]
    fn a_counter_reset_between_scrapes_is_refused() {
        let page = Page::parse(AFTER_FILE, PAGE).unwrap();
        let (_, h) = page.histogram(E2E).unwrap();
        let smaller = Histogram {
            count: 1.0,
            sum: 1.0,
            ..h.clone()
        };
        assert!(smaller.minus(&h, "e2e").is_err());
        let zero = h.minus(&h, "e2e").unwrap();
        assert_eq!(zero.count, 0.0);
    }
}
