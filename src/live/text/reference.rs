//! The reading of a page before it was filed in one pass (stop 31): every sample of a wanted
//! family collected by `prom_text::parse`, then each series looked up by scanning them all.
//! Kept as the oracle of the one-pass `parse_metrics` (tests.rs compares the two on random
//! pages): simple enough to read as the rules of the format, slow enough not to be used. The
//! required gauges' range checks are shared (`checked_gauges`): the oracle covers the filing.

use super::*;

/// Every family this module reads.
pub(super) const WANTED: [&[(&str, bool)]; 11] = [
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
    REQUEST_SUCCESS,
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

/// Parses one `/metrics` page (the reading before `prom_text::scan`).
pub(super) fn parse_metrics(text: &str) -> Result<PodMetrics, TextError> {
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
    let (waiting, running, kv_usage) = checked_gauges(waiting, running, kv_usage)?;
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
    metrics.model_name = samples
        .iter()
        .filter(|s| RUNNING.iter().any(|(name, _)| s.name == *name))
        .find_map(|s| s.label("model_name"))
        .map(|name| name.into_owned());
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
        (REQUEST_SUCCESS, &mut metrics.request_success),
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

/// A sample name without its family suffix (`_bucket`, `_sum`, `_count`, `_total`,
/// `_created`).
fn family(name: &str) -> &str {
    ["_bucket", "_sum", "_count", "_total", "_created"]
        .iter()
        .find_map(|suffix| name.strip_suffix(suffix))
        .unwrap_or(name)
}
