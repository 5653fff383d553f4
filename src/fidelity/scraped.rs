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

use super::FidelityError;
use super::run::{MeasuredRun, Stage};
use crate::prom_text::{self, Histogram, Sample};

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

/// `after − before` of one histogram (counter differences), refusing a reset.
fn minus(after: &Histogram, before: &Histogram, name: &str) -> Result<Histogram, FidelityError> {
    let (sum_after, sum_before) = (after.sum.unwrap_or(0.0), before.sum.unwrap_or(0.0));
    if before.count() > after.count() || sum_before > sum_after + 1e-9 {
        return Err(bad_after_file(format!(
            "{name}: the after scrape counts less than the before one (server restarted?)"
        )));
    }
    let buckets = after
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
        sum: Some(sum_after - sum_before),
    })
}

/// The exact mean of a histogram with a `_sum`.
fn mean(histogram: &Histogram) -> f64 {
    histogram.sum.unwrap_or(f64::NAN) / histogram.count()
}

/// What one scrape holds (its sample lines, borrowed from the file's text).
#[derive(Clone, Debug, Default)]
struct Page<'a> {
    samples: Vec<Sample<'a>>,
}

impl<'a> Page<'a> {
    /// The page's samples. Lines the parser cannot read are skipped, so a bad file shows up
    /// as a missing series, which the caller names.
    fn parse(text: &'a str) -> Page<'a> {
        Page {
            samples: prom_text::parse(text, |_| true),
        }
    }

    /// The histogram under the first of `names` present, summed over its label sets.
    fn histogram(&self, names: &[&'static str]) -> Option<(&'static str, Histogram)> {
        names
            .iter()
            .find_map(|&name| prom_text::histogram(&self.samples, name).map(|h| (name, h)))
    }

    /// A label of the cache-config info gauge, as a positive integer.
    fn cache_label(&self, label: &str) -> Option<u32> {
        self.samples
            .iter()
            .find(|s| s.name == CACHE_INFO)
            .and_then(|s| prom_text::label_u32(s, &[label]))
    }
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

fn bad_after_file(reason: String) -> FidelityError {
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
    let after = Page::parse(after);
    let before = before.map(Page::parse);
    let delta = |names: &[&'static str]| -> Result<Histogram, FidelityError> {
        let (name, later) = after
            .histogram(names)
            .ok_or_else(|| bad_after_file(format!("no {} histogram", names[0])))?;
        let earlier = before
            .as_ref()
            .and_then(|page| page.histogram(&[name]))
            .map(|(_, h)| h)
            .unwrap_or_default();
        let delta = minus(&later, &earlier, name)?;
        let sum = delta.sum.unwrap_or(f64::NAN);
        if !(delta.count() >= 1.0 && sum.is_finite() && sum >= 0.0) {
            return Err(bad_after_file(format!(
                "{name}: no observations between the scrapes"
            )));
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
        rate: e2e.count() / spec.duration_s,
        start_us: 0,
        duration_us,
    }];
    run.num_requests = Some(e2e.count().round() as u64);
    run.gpu = spec.gpu.or(run.gpu.take());
    if let Some(block_size) = after.cache_label("block_size") {
        run.block_size = block_size;
    }
    if let Some(blocks) = after.cache_label("num_gpu_blocks") {
        run.num_gpu_blocks = Some(blocks);
    }
    run.prompt_lengths = Some(prompt);
    run.output_lengths = Some(generation);
    for stage in [-1, 0] {
        let mut put = |metric: &str, value: f64| {
            run.actuals.insert((stage, metric.to_string()), value);
        };
        put("e2e_mean", mean(&e2e) * 1e3);
        put("ttft_mean", mean(&ttft) * 1e3);
        put("itl_mean", mean(&itl) * 1e3);
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
        let page = Page::parse(PAGE);
        let (name, h) = page.histogram(E2E).unwrap();
        assert_eq!(name, "vllm:e2e_request_latency_seconds");
        assert_eq!(h.count(), 10.0);
        assert!((mean(&h) - 1.75).abs() < 1e-12);
        assert_eq!(
            h.buckets,
            vec![(1.0, 2.0), (2.0, 6.0), (f64::INFINITY, 10.0)]
        );
        assert_eq!(page.cache_label("num_gpu_blocks"), Some(7462));
        assert_eq!(page.cache_label("block_size"), Some(16));
    }

    #[test]
    fn a_counter_reset_between_scrapes_is_refused() {
        let page = Page::parse(PAGE);
        let (_, h) = page.histogram(E2E).unwrap();
        let smaller = Histogram {
            buckets: vec![(1.0, 1.0), (2.0, 1.0), (f64::INFINITY, 1.0)],
            sum: Some(1.0),
        };
        assert!(minus(&smaller, &h, "e2e").is_err());
        let zero = minus(&h, &h, "e2e").unwrap();
        assert_eq!(zero.count(), 0.0);
    }
}
