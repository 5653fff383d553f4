//! What the router sees of each instance, and how stale it is.
//!
//! The EPP polls every pod's `/metrics` on a fixed tick (50 ms by default) and learns cached
//! blocks from KV events; between polls it routes on the last values. Each signal here has
//! its own refresh interval: a refresh at every multiple of the interval captures the
//! instance's live value, and reads in between see that capture (a read at
//! `last_refresh + interval - 1` sees the old value, at `last_refresh + interval` the new
//! one). An interval of 0 means the router reads the instance live. Router-local counts (in
//! flight) are always fresh and live in the cluster itself.

use std::collections::HashSet;

use super::config::{Signal, StalenessConfig};
use crate::sim::Engine;
use crate::sim::kv::IdentityBuildHasher;

/// The values of one instance's signals as the router sees them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SignalView {
    /// Requests waiting (arrived, not admitted).
    pub queue_depth: u64,
    /// Requests running.
    pub running: u64,
    /// KV usage in [0, 1].
    pub kv_usage: f64,
}

/// The refreshed (possibly stale) captures of one instance.
#[derive(Clone, Debug, Default)]
pub struct CapturedSignals {
    /// Captured gauge values.
    pub values: SignalView,
    /// Time of the last refresh of each signal (queue, running, kv, prefix).
    pub refreshed_at_us: [u64; 4],
    /// Captured cached-block keys (only kept when the router scores precise prefixes on a
    /// stale view).
    pub prefix_keys: HashSet<u64, IdentityBuildHasher>,
    /// The KV key version `prefix_keys` was copied at (skips unchanged re-copies).
    prefix_version: Option<u64>,
}

fn slot(signal: Signal) -> usize {
    match signal {
        Signal::QueueDepth => 0,
        Signal::Running => 1,
        Signal::KvUsage => 2,
        Signal::PrefixCache => 3,
    }
}

/// Every signal, in slot order.
pub const SIGNALS: [Signal; 4] = [
    Signal::QueueDepth,
    Signal::Running,
    Signal::KvUsage,
    Signal::PrefixCache,
];

impl CapturedSignals {
    /// Captures `signal` from `engine` at `now_us`.
    pub fn refresh(&mut self, signal: Signal, engine: &Engine, now_us: u64) {
        match signal {
            Signal::QueueDepth => self.values.queue_depth = engine.counts().queued,
            Signal::Running => self.values.running = engine.counts().running,
            Signal::KvUsage => self.values.kv_usage = engine.kv().usage(),
            Signal::PrefixCache => {
                let version = engine.kv().key_version();
                if self.prefix_version != Some(version) {
                    self.prefix_keys.clear();
                    self.prefix_keys.extend(engine.kv().cached_keys());
                    self.prefix_version = Some(version);
                }
            }
        }
        self.refreshed_at_us[slot(signal)] = now_us;
    }

    /// When `signal` was last refreshed.
    pub fn refreshed_at(&self, signal: Signal) -> u64 {
        self.refreshed_at_us[slot(signal)]
    }
}

/// The view the router uses right now: live values for live signals, captures otherwise.
pub fn current_view(
    captured: &CapturedSignals,
    engine: &Engine,
    staleness: &StalenessConfig,
) -> SignalView {
    let counts = engine.counts();
    SignalView {
        queue_depth: if staleness.queue_depth_us == 0 {
            counts.queued
        } else {
            captured.values.queue_depth
        },
        running: if staleness.running_us == 0 {
            counts.running
        } else {
            captured.values.running
        },
        kv_usage: if staleness.kv_usage_us == 0 {
            engine.kv().usage()
        } else {
            captured.values.kv_usage
        },
    }
}

/// Leading `keys` the router believes `engine` has cached: live or from the capture.
pub fn precise_prefix_match(
    keys: &[u64],
    captured: &CapturedSignals,
    engine: &Engine,
    staleness: &StalenessConfig,
) -> usize {
    if staleness.prefix_cache_us == 0 {
        keys.iter()
            .take_while(|key| engine.kv().contains_key(**key))
            .count()
    } else {
        keys.iter()
            .take_while(|key| captured.prefix_keys.contains(key))
            .count()
    }
}

/// A periodic refresh of the signals sharing one interval.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RefreshTick {
    /// The interval (µs, > 0).
    pub interval_us: u64,
    /// The signals refreshed on this tick.
    pub signals: Vec<Signal>,
    /// The next refresh time, or `None` while the cluster is idle.
    pub next_us: Option<u64>,
}

/// One tick stream per distinct non-zero interval, each starting at time 0. The prefix view
/// is refreshed only if `precise_prefix` (the router reads instances' real caches); the
/// other signals always are.
pub fn refresh_ticks(staleness: &StalenessConfig, precise_prefix: bool) -> Vec<RefreshTick> {
    let mut ticks: Vec<RefreshTick> = Vec::new();
    for signal in SIGNALS {
        let interval_us = staleness.interval_us(signal);
        if interval_us == 0 || (signal == Signal::PrefixCache && !precise_prefix) {
            continue;
        }
        match ticks
            .iter_mut()
            .find(|tick| tick.interval_us == interval_us)
        {
            Some(tick) => tick.signals.push(signal),
            None => ticks.push(RefreshTick {
                interval_us,
                signals: vec![signal],
                next_us: Some(0),
            }),
        }
    }
    ticks.sort_by_key(|tick| tick.interval_us);
    ticks
}
