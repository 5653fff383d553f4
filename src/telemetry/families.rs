//! Metric families built and registered in one call, so a registry's list of families reads
//! one family a line (name, help, labels) instead of a constructor and a separate
//! registration per family.

use prometheus::core::Collector;
use prometheus::{
    Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
};

/// Registers `collector` in `registry` and hands it back (families are cheap shared
/// handles: the registry and the caller hold the same series).
pub fn registered<C: Collector + Clone + 'static>(
    registry: &Registry,
    collector: C,
) -> Result<C, prometheus::Error> {
    registry.register(Box::new(collector.clone()))?;
    Ok(collector)
}

/// A counter family with `labels`, registered.
pub fn counter_vec(
    registry: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
) -> Result<IntCounterVec, prometheus::Error> {
    registered(registry, IntCounterVec::new(Opts::new(name, help), labels)?)
}

/// A counter without labels, registered.
pub fn counter(
    registry: &Registry,
    name: &str,
    help: &str,
) -> Result<IntCounter, prometheus::Error> {
    registered(registry, IntCounter::new(name, help)?)
}

/// A gauge family with `labels`, registered.
pub fn gauge_vec(
    registry: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
) -> Result<IntGaugeVec, prometheus::Error> {
    registered(registry, IntGaugeVec::new(Opts::new(name, help), labels)?)
}

/// A gauge without labels, registered.
pub fn gauge(registry: &Registry, name: &str, help: &str) -> Result<IntGauge, prometheus::Error> {
    registered(registry, IntGauge::new(name, help)?)
}

/// A histogram without labels, with exponential buckets from `start` by `factor`, `count`
/// of them, registered.
pub fn histogram(
    registry: &Registry,
    name: &str,
    help: &str,
    (start, factor, count): (f64, f64, usize),
) -> Result<Histogram, prometheus::Error> {
    let buckets = prometheus::exponential_buckets(start, factor, count)?;
    registered(
        registry,
        Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets))?,
    )
}
