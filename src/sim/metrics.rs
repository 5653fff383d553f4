//! Per-request records and the aggregate summary of a run.
//!
//! Every request that leaves the engine (completed, dropped or timed out) leaves one
//! [`RequestRecord`] with its timestamps. Inter-token gaps are aggregated exactly as a
//! value -> count map, so ITL percentiles over every token stay exact without storing each
//! gap. Percentiles use linear interpolation at rank `p/100 * (n-1)` over sorted values,
//! as BLIS and numpy do. All figures are in integer microseconds until the summary converts
//! to milliseconds and seconds.

mod samples;
mod stats;

use std::collections::HashMap;

use crate::sim::request::{RequestId, SloClass};

pub use samples::SummarySamples;
pub use stats::{LatencyStats, interpolate_sorted, percentile_of_counts};

/// How a request left the engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Generated all its tokens.
    Completed,
    /// Rejected at arrival: prompt plus `max_tokens` exceeds what the instance can hold.
    Dropped,
    /// Its deadline passed before it finished.
    TimedOut,
    /// Refused by the cluster's admission policy before reaching an instance.
    Rejected,
}

impl Outcome {
    /// The outcome's name in output.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Completed => "completed",
            Outcome::Dropped => "dropped",
            Outcome::TimedOut => "timed_out",
            Outcome::Rejected => "rejected",
        }
    }
}

/// Everything measured about one request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestRecord {
    /// Request id.
    pub id: RequestId,
    /// SLO class.
    pub slo_class: SloClass,
    /// How it left.
    pub outcome: Outcome,
    /// Arrival at the API server.
    pub arrival_us: u64,
    /// Entry into the wait queue.
    pub enqueue_us: Option<u64>,
    /// First admission to the running batch.
    pub schedule_us: Option<u64>,
    /// First token at the client.
    pub first_token_us: Option<u64>,
    /// Completion (last token plus post-decode overhead), drop or timeout time.
    pub end_us: u64,
    /// Prompt tokens.
    pub input_tokens: u32,
    /// Output tokens generated.
    pub output_tokens: u32,
    /// Prompt tokens served from the prefix cache at first admission.
    pub cached_tokens: u32,
    /// KV blocks in use on the instance right after its first admission.
    pub used_blocks_at_schedule: u32,
    /// Times preempted.
    pub preemptions: u32,
    /// Sum of the inter-token gaps.
    pub token_gap_sum_us: u64,
    /// Every inter-token gap, when recorded.
    pub token_gaps_us: Vec<u64>,
}

impl RequestRecord {
    /// Time to first token, if a token was produced.
    pub fn ttft_us(&self) -> Option<u64> {
        self.first_token_us.map(|t| t - self.arrival_us)
    }

    /// End-to-end latency (completed requests).
    pub fn e2e_us(&self) -> Option<u64> {
        (self.outcome == Outcome::Completed).then(|| self.end_us - self.arrival_us)
    }

    /// Mean time per output token after the first (completed requests with 2+ tokens).
    pub fn tpot_us(&self) -> Option<f64> {
        if self.outcome != Outcome::Completed || self.output_tokens < 2 {
            return None;
        }
        let first = self.first_token_us?;
        Some((self.end_us - first) as f64 / f64::from(self.output_tokens - 1))
    }

    /// Arrival to first admission.
    pub fn scheduling_delay_us(&self) -> Option<u64> {
        self.schedule_us.map(|t| t - self.arrival_us)
    }
}

/// Most samples a KV-usage timeline keeps.
pub const KV_TIMELINE_SAMPLES_MAX: usize = 100_000;

/// KV usage over time: a time-weighted mean, the peak, and a sampled timeline.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct KvUsageTrack {
    start_us: u64,
    last_change_us: u64,
    last_usage: f64,
    weighted_sum: f64,
    /// Highest usage seen.
    pub peak: f64,
    next_sample_us: u64,
    /// (time µs, usage) samples at the configured interval.
    pub timeline: Vec<(u64, f64)>,
}

impl KvUsageTrack {
    /// A track whose history starts at `start_us` (a restored engine's clock).
    pub fn starting_at(start_us: u64) -> Self {
        Self {
            start_us,
            last_change_us: start_us,
            next_sample_us: start_us,
            ..Self::default()
        }
    }

    /// Records that usage is `usage` from `now_us` on; samples the timeline every
    /// `interval_us` (0: no timeline). A sample holds the usage in effect at its time. A
    /// stretch without change keeps only its first and last samples, and the timeline stops
    /// at [`KV_TIMELINE_SAMPLES_MAX`], so it stays bounded whatever the time span.
    #[inline]
    pub fn update(&mut self, now_us: u64, usage: f64, interval_us: u64) {
        debug_assert!(
            now_us >= self.last_change_us,
            "KV usage time went backwards"
        );
        self.weighted_sum += self.last_usage * (now_us - self.last_change_us) as f64;
        if interval_us > 0 && self.timeline.len() < KV_TIMELINE_SAMPLES_MAX {
            // Samples strictly before now saw the previous usage.
            if self.next_sample_us < now_us {
                let before_now = (now_us - 1 - self.next_sample_us) / interval_us;
                self.timeline.push((self.next_sample_us, self.last_usage));
                if before_now > 0 {
                    let last = self.next_sample_us + before_now * interval_us;
                    self.timeline.push((last, self.last_usage));
                }
                self.next_sample_us += (before_now + 1) * interval_us;
            }
            if self.next_sample_us == now_us {
                self.timeline.push((now_us, usage));
                self.next_sample_us += interval_us;
            }
        }
        self.last_change_us = now_us;
        self.last_usage = usage;
        self.peak = self.peak.max(usage);
    }

    /// Time-weighted mean usage over [start, end_us].
    pub fn mean(&self, end_us: u64) -> f64 {
        let span = end_us.saturating_sub(self.start_us);
        if span == 0 {
            return self.last_usage;
        }
        let tail = self.last_usage * end_us.saturating_sub(self.last_change_us) as f64;
        (self.weighted_sum + tail) / span as f64
    }
}

/// A fast hasher for small integer keys (microsecond gaps): one multiply-xorshift, fixed, so
/// the map is deterministic and cheap. Its iteration order never reaches output (sorted first).
#[derive(Clone, Copy, Debug, Default)]
pub struct GapHasher(u64);

impl std::hash::Hasher for GapHasher {
    fn finish(&self) -> u64 {
        let x = self.0.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        x ^ (x >> 29)
    }
    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(byte);
        }
    }
    fn write_u64(&mut self, value: u64) {
        self.0 = value;
    }
}

/// Builds [`GapHasher`]s.
pub type GapBuildHasher = std::hash::BuildHasherDefault<GapHasher>;

/// Inter-token gap (µs) -> occurrences.
pub type GapCounts = HashMap<u64, u64, GapBuildHasher>;

/// What an engine has measured so far.
#[derive(Clone, Debug, Default)]
pub struct Metrics {
    /// One record per request that left the engine, in leaving order (none when the engine
    /// keeps no records: then `samples` has what the summary needs).
    pub records: Vec<RequestRecord>,
    /// The completed requests' summary samples, kept instead of `records` by an engine that
    /// keeps no records (empty otherwise).
    pub samples: SummarySamples,
    /// Every inter-token gap (µs) -> how many times it occurred.
    pub token_gap_counts: GapCounts,
    /// Most requests ever waiting (arrived, not admitted) at once.
    pub queue_depth_peak: u64,
    /// KV usage over time.
    pub kv_usage: KvUsageTrack,
}

/// Request accounting of an engine (or a cluster) at one instant.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Requests that arrived.
    pub injected: u64,
    /// Requests that finished.
    pub completed: u64,
    /// Requests arrived but not admitted (queueing delay or wait queue).
    pub queued: u64,
    /// Requests in the running batch.
    pub running: u64,
    /// Requests rejected as unservable.
    pub dropped: u64,
    /// Requests past their deadline.
    pub timed_out: u64,
    /// Requests refused at admission (cluster level; an engine never rejects).
    pub rejected: u64,
    /// Preemptions so far.
    pub preemptions: u64,
    /// Non-empty steps executed.
    pub steps: u64,
}

impl Counts {
    /// Request conservation: injected = completed + queued + running + dropped + timed out
    /// + rejected.
    pub fn is_conserved(&self) -> bool {
        self.injected
            == self.completed
                + self.queued
                + self.running
                + self.dropped
                + self.timed_out
                + self.rejected
    }

    /// Adds `other`'s counts to these (aggregating instances into a cluster).
    pub fn add(&mut self, other: &Counts) {
        self.injected += other.injected;
        self.completed += other.completed;
        self.queued += other.queued;
        self.running += other.running;
        self.dropped += other.dropped;
        self.timed_out += other.timed_out;
        self.rejected += other.rejected;
        self.preemptions += other.preemptions;
        self.steps += other.steps;
    }
}

/// The aggregate outcome of a run.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Summary {
    /// Request accounting.
    pub counts: Counts,
    /// Prompt tokens of completed requests.
    pub input_tokens: u64,
    /// Output tokens of completed requests.
    pub output_tokens: u64,
    /// Simulated time covered (µs).
    pub sim_duration_us: u64,
    /// Prefix-cache hit rate in tokens (hits / queried prompt tokens).
    pub prefix_cache_hit_rate: f64,
    /// Time to first token (completed requests).
    pub ttft: LatencyStats,
    /// End-to-end latency (completed requests).
    pub e2e: LatencyStats,
    /// Every inter-token gap.
    pub itl: LatencyStats,
    /// Per-request mean time per output token (completed, 2+ tokens).
    pub tpot: LatencyStats,
    /// Arrival to first admission (completed requests).
    pub scheduling_delay: LatencyStats,
    /// Time-weighted mean KV usage.
    pub kv_usage_mean: f64,
    /// Peak KV usage.
    pub kv_usage_peak: f64,
    /// Sampled KV usage timeline (µs, usage).
    pub kv_usage_timeline: Vec<(u64, f64)>,
}

impl Summary {
    /// Builds the summary from records, gap counts and counters.
    pub fn build(
        records: &[RequestRecord],
        token_gap_counts: &GapCounts,
        counts: Counts,
        sim_duration_us: u64,
        prefix_cache_hit_rate: f64,
    ) -> Self {
        Self::from_samples(
            &SummarySamples::of(records),
            token_gap_counts,
            counts,
            sim_duration_us,
            prefix_cache_hit_rate,
        )
    }

    /// [`Summary::build`] from the completed requests' samples instead of their records
    /// (the same figures: the samples are what the records give).
    pub fn from_samples(
        samples: &SummarySamples,
        token_gap_counts: &GapCounts,
        counts: Counts,
        sim_duration_us: u64,
        prefix_cache_hit_rate: f64,
    ) -> Self {
        // Each metric's values are copied in turn (selection reorders them).
        let whole = |values: &[f64]| LatencyStats::from_whole_us(&mut values.to_vec());
        Self {
            counts,
            input_tokens: samples.input_tokens,
            output_tokens: samples.output_tokens,
            sim_duration_us,
            prefix_cache_hit_rate,
            ttft: whole(&samples.ttft_us),
            e2e: whole(&samples.e2e_us),
            itl: LatencyStats::from_counts(token_gap_counts),
            tpot: LatencyStats::from_us(&mut samples.tpot_us.clone()),
            scheduling_delay: whole(&samples.scheduling_delay_us),
            kv_usage_mean: 0.0,
            kv_usage_peak: 0.0,
            kv_usage_timeline: Vec::new(),
        }
    }

    /// Simulated duration in seconds.
    pub fn sim_duration_s(&self) -> f64 {
        self.sim_duration_us as f64 / 1e6
    }

    /// Completed requests per simulated second.
    pub fn requests_per_s(&self) -> f64 {
        per_second(self.counts.completed, self.sim_duration_us)
    }

    /// Output tokens of completed requests per simulated second.
    pub fn output_tokens_per_s(&self) -> f64 {
        per_second(self.output_tokens, self.sim_duration_us)
    }
}

fn per_second(count: u64, duration_us: u64) -> f64 {
    if duration_us == 0 {
        0.0
    } else {
        count as f64 * 1e6 / duration_us as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kv_timeline_samples_the_usage_in_effect_and_compresses_idle_stretches() {
        let mut track = KvUsageTrack::default();
        track.update(0, 0.5, 10);
        track.update(25, 0.7, 10);
        assert_eq!(track.timeline, vec![(0, 0.5), (10, 0.5), (20, 0.5)]);
        track.update(30, 0.1, 10);
        assert_eq!(track.timeline.last(), Some(&(30, 0.1)));
        // A long idle stretch keeps only its first and last samples.
        track.update(1_000_000_000_000, 0.2, 10);
        let tail: Vec<_> = track.timeline[4..].to_vec();
        assert_eq!(
            tail,
            vec![(40, 0.1), (999_999_999_990, 0.1), (1_000_000_000_000, 0.2)]
        );
    }

    #[test]
    fn kv_mean_is_time_weighted() {
        let mut track = KvUsageTrack::default();
        track.update(0, 0.5, 0);
        track.update(100, 1.0, 0);
        assert!((track.mean(200) - 0.75).abs() < 1e-12);
        assert_eq!(track.peak, 1.0);
    }
}
