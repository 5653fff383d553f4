//! The Prometheus text format as model servers write it: parsing a page with `:` in its
//! metric names, histograms summed over label sets, and draws from a histogram.
//!
//! Shared by the live mirror (`live::text`, a pod's page every 50 ms) and by fidelity runs
//! known only from scrapes (`fidelity::scraped`). Pure: text in, values out.
//!
//! Parsing is `prometheus-parse`'s; its metric-name pattern (`\w+`) lacks the `:` every vLLM
//! and SGLang name has, so names are escaped ([`COLON`]) before parsing and restored after.

use prometheus_parse::{Sample, Scrape, Value};

/// What a `:` in a metric name is escaped to while the parser reads it.
pub const COLON: &str = "__COLON__";

/// Suffixes a family's samples carry beside its own name.
const SUFFIXES: [&str; 5] = ["_bucket", "_sum", "_count", "_total", "_created"];

/// A cumulative histogram: (upper bound, cumulative count), ascending; the last bound may be
/// +Inf.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Histogram {
    /// Buckets, ascending by bound, counts cumulative.
    pub buckets: Vec<(f64, f64)>,
    /// The sum of the observations (`_sum`), if published.
    pub sum: Option<f64>,
}

impl Histogram {
    /// Observations counted.
    pub fn count(&self) -> f64 {
        self.buckets.last().map_or(0.0, |&(_, count)| count)
    }
}

/// The metric name of a sample, `# HELP` or `# TYPE` line (`None` for other lines).
pub fn line_name(line: &str) -> Option<&str> {
    let trimmed = line.trim_start();
    let rest = match trimmed.strip_prefix('#') {
        Some(comment) => {
            let comment = comment.trim_start();
            comment
                .strip_prefix("HELP ")
                .or_else(|| comment.strip_prefix("TYPE "))?
                .trim_start()
        }
        None => trimmed,
    };
    let end = rest
        .find(|c: char| c == '{' || c.is_whitespace())
        .unwrap_or(rest.len());
    Some(&rest[..end])
}

/// A sample name without its family suffix (`_bucket`, `_sum`, `_count`, `_total`,
/// `_created`).
pub fn family(name: &str) -> &str {
    SUFFIXES
        .iter()
        .find_map(|suffix| name.strip_suffix(suffix))
        .unwrap_or(name)
}

/// `line` with the `:` of its metric name escaped (sample, `# HELP` and `# TYPE` lines).
fn escape_name(line: &str) -> String {
    let trimmed = line.trim_start();
    let (prefix, rest) = match trimmed.strip_prefix('#') {
        Some(comment) => {
            let comment = comment.trim_start();
            match comment
                .strip_prefix("HELP ")
                .map(|r| ("# HELP ", r))
                .or_else(|| comment.strip_prefix("TYPE ").map(|r| ("# TYPE ", r)))
            {
                Some((keyword, rest)) => (keyword, rest.trim_start()),
                None => return line.to_owned(),
            }
        }
        None => ("", trimmed),
    };
    let end = rest
        .find(|c: char| c == '{' || c.is_whitespace())
        .unwrap_or(rest.len());
    let (name, tail) = rest.split_at(end);
    format!("{prefix}{}{tail}", name.replace(':', COLON))
}

/// The samples of the lines `keep` accepts (`keep` sees each line; lines it refuses are not
/// parsed at all), metric names as written. The parser skips lines it cannot read, so
/// garbage shows up as missing series, not as an error; the error is the parser's own.
pub fn parse(text: &str, keep: impl Fn(&str) -> bool) -> Result<Vec<Sample>, String> {
    let lines = text.lines().filter(|line| keep(line));
    let mut scrape =
        Scrape::parse(lines.map(|line| Ok(escape_name(line)))).map_err(|err| err.to_string())?;
    for sample in &mut scrape.samples {
        if sample.metric.contains(COLON) {
            sample.metric = sample.metric.replace(COLON, ":");
        }
    }
    Ok(scrape.samples)
}

/// A counter's or gauge's value.
pub fn plain_value(value: &Value) -> Option<f64> {
    match value {
        Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => Some(*v),
        _ => None,
    }
}

/// The histogram `name`, buckets and `_sum` summed over label sets; `None` without buckets.
/// Buckets with a NaN bound or a negative or non-finite count are dropped.
pub fn histogram(samples: &[Sample], name: &str) -> Option<Histogram> {
    let mut merged: Vec<(f64, f64)> = Vec::new();
    let mut found = false;
    for sample in samples.iter().filter(|s| s.metric == name) {
        if let Value::Histogram(counts) = &sample.value {
            found = true;
            for bucket in counts {
                match merged.iter_mut().find(|(le, _)| *le == bucket.less_than) {
                    Some(slot) => slot.1 += bucket.count,
                    None => merged.push((bucket.less_than, bucket.count)),
                }
            }
        }
    }
    if !found {
        return None;
    }
    merged.retain(|(le, count)| !le.is_nan() && count.is_finite() && *count >= 0.0);
    merged.sort_by(|a, b| a.0.total_cmp(&b.0));
    let sum_name = format!("{name}_sum");
    let sums: Vec<f64> = samples
        .iter()
        .filter(|s| s.metric == sum_name)
        .filter_map(|s| plain_value(&s.value))
        .collect();
    Some(Histogram {
        buckets: merged,
        sum: (!sums.is_empty()).then(|| sums.iter().sum()),
    })
}

/// The first of `labels` on `sample` that holds a whole number in 1..=u32::MAX.
pub fn label_u32(sample: &Sample, labels: &[&str]) -> Option<u32> {
    labels
        .iter()
        .find_map(|name| sample.labels.get(name))
        .and_then(|value| value.trim().parse::<f64>().ok())
        .filter(|value| value.is_finite() && *value >= 1.0 && *value <= f64::from(u32::MAX))
        .map(|value| value as u32)
}

/// The factor that makes [`sample`]'s draws average the histogram's true mean (`_sum` /
/// count): uniform draws inside vLLM's coarse 1-2-5 buckets overshoot skewed lengths.
pub fn mean_correction(histogram: &Histogram) -> f64 {
    let count = histogram.count();
    let Some(sum) = histogram.sum.filter(|sum| *sum > 0.0 && count > 0.0) else {
        return 1.0;
    };
    let mut lower = 0.0;
    let mut below = 0.0;
    let mut total = 0.0;
    for &(upper, cumulative) in &histogram.buckets {
        let upper_bound = if upper.is_finite() {
            upper
        } else {
            lower * 2.0 + 1.0
        };
        total += (cumulative - below).max(0.0) * (lower + upper_bound) / 2.0;
        if upper.is_finite() {
            lower = upper;
        }
        below = cumulative;
    }
    if total <= 0.0 {
        return 1.0;
    }
    // Bounded: a wild _sum must not turn a draw into nonsense.
    ((sum / count) / (total / count)).clamp(0.25, 4.0)
}

/// Inverse CDF of a cumulative histogram at `u` in [0, 1): uniform inside the bucket; the
/// open last bucket (+Inf) reuses the width of the one before it.
pub fn sample(histogram: &Histogram, u: f64) -> Option<f64> {
    let total = histogram.count();
    if total <= 0.0 {
        return None;
    }
    let target = u * total;
    let mut lower = 0.0;
    let mut below = 0.0;
    for &(upper, cumulative) in &histogram.buckets {
        if cumulative > target && cumulative > below {
            let upper = if upper.is_finite() {
                upper
            } else {
                lower * 2.0 + 1.0
            };
            let within = (target - below) / (cumulative - below);
            return Some(lower + within * (upper - lower));
        }
        if upper.is_finite() {
            lower = upper;
        }
        below = cumulative;
    }
    Some(lower)
}
