//! The Prometheus text format as model servers write it: parsing a page with `:` in its
//! metric names, histograms summed over label sets, and draws from a histogram.
//!
//! Shared by the live mirror (`live::text`, a pod's page every 50 ms) and by fidelity runs
//! known only from scrapes (`fidelity::scraped`). Pure: text in, values out.
//!
//! Parsing is [`parse`]'s, or [`scan`]'s for a caller that files samples as they come (no
//! regex, no allocation per line); this module adds what is built from the samples.

mod parse;

pub use parse::{Sample, parse, scan};

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

/// The histogram `name` (its `_bucket` samples by `le`, and its `_sum`), buckets and sums
/// added over label sets; `None` without buckets. Buckets with a NaN or missing bound or a
/// negative or non-finite count are dropped.
pub fn histogram(samples: &[Sample<'_>], name: &str) -> Option<Histogram> {
    let mut builder = HistogramBuilder::default();
    for sample in samples {
        let Some((family, suffix)) = sample.name.split_at_checked(name.len()) else {
            continue;
        };
        if family != name {
            continue;
        }
        match suffix {
            "_bucket" => builder.bucket(sample),
            "_sum" => builder.sum(sample.value),
            _ => {}
        }
    }
    builder.finish()
}

/// A histogram read sample by sample ([`histogram`] over a page's samples, or a caller that
/// files samples as it scans: `live::text`): buckets and sums added over label sets.
#[derive(Clone, Debug, Default)]
pub struct HistogramBuilder {
    merged: Vec<(f64, f64)>,
    found: bool,
    /// A later label set has begun (its bounds are looked up, not pushed).
    later_set: bool,
    sum: Option<f64>,
}

impl HistogramBuilder {
    /// Adds a `_bucket` sample (one with no readable `le` still counts as found).
    pub fn bucket(&mut self, sample: &Sample<'_>) {
        self.found = true;
        let Some(le) = sample.label("le").and_then(|le| parse_bound(&le)) else {
            return;
        };
        // The first label set's buckets come in ascending order and are pushed without a
        // search; from the first bound that is not above the last one (a later label set)
        // every bound is looked up.
        self.later_set |= !self.merged.last().is_none_or(|&(last, _)| le > last);
        let slot = if self.later_set {
            self.merged.iter_mut().find(|(bound, _)| *bound == le)
        } else {
            None
        };
        match slot {
            Some(slot) => slot.1 += sample.value,
            None => self.merged.push((le, sample.value)),
        }
    }

    /// Adds a `_sum` sample's value.
    pub fn sum(&mut self, value: f64) {
        *self.sum.get_or_insert(0.0) += value;
    }

    /// True once a `_bucket` sample was added.
    pub fn found(&self) -> bool {
        self.found
    }

    /// The histogram, `None` without buckets.
    pub fn finish(self) -> Option<Histogram> {
        if !self.found {
            return None;
        }
        let mut merged = self.merged;
        merged.retain(|(le, count)| !le.is_nan() && count.is_finite() && *count >= 0.0);
        merged.sort_by(|a, b| a.0.total_cmp(&b.0));
        Some(Histogram {
            buckets: merged,
            sum: self.sum,
        })
    }
}

/// A bucket bound (`le`): a float, `+Inf` as the format writes it.
fn parse_bound(le: &str) -> Option<f64> {
    parse::parse_value(le.trim())
}

/// The first of `labels` on `sample` that holds a whole number in 1..=u32::MAX.
pub fn label_u32(sample: &Sample<'_>, labels: &[&str]) -> Option<u32> {
    labels
        .iter()
        .find_map(|name| sample.label(name))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_histogram_adds_its_label_sets_bucket_by_bucket() {
        let page = "\
x_bucket{engine=\"0\",le=\"1\"} 2
x_bucket{engine=\"0\",le=\"5\"} 4
x_bucket{engine=\"0\",le=\"+Inf\"} 5
x_sum{engine=\"0\"} 9
x_bucket{engine=\"1\",le=\"1\"} 1
x_bucket{engine=\"1\",le=\"2\"} 3
x_bucket{engine=\"1\",le=\"5\"} 3
x_bucket{engine=\"1\",le=\"+Inf\"} 7
x_sum{engine=\"1\"} 20
x_bucket{engine=\"2\",le=\"NaN\"} 1
y_bucket{le=\"1\"} 100
";
        let samples = parse(page, |_| true);
        let h = histogram(&samples, "x").expect("buckets");
        assert_eq!(
            h.buckets,
            vec![(1.0, 3.0), (2.0, 3.0), (5.0, 7.0), (f64::INFINITY, 12.0)]
        );
        assert_eq!(h.sum, Some(29.0));
        assert_eq!(h.count(), 12.0);
        assert_eq!(histogram(&samples, "z"), None);
    }
}
