//! State without a gateway: an instance's waiting and running requests rebuilt from what
//! the pod publishes on `/metrics` (see docs/live.md, "Rebuilding state from gauges").
//!
//! N waiting and M running requests come from the gauges. Their prompt and final output
//! lengths are drawn from the pod's own `request_prompt_tokens` / `request_generation_tokens`
//! histograms (uniform inside a bucket; seeded by the instance id and the gauges, so the same
//! page always gives the same state). Running requests' progress is then set so the KV blocks
//! they hold match `kv_cache_usage_perc`: all decoding (the common case under chunked
//! prefill), with a common fraction of their output generated when the usage allows more than
//! their prompts, otherwise with their drawn prompts scaled down to the usage. Running requests' `cached_tokens` follow the cumulative prefix-cache hit
//! rate. Pure: no I/O, no clock.

use rand_chacha::ChaCha8Rng;
use rand_core::SeedableRng;

use crate::sim::EngineConfig;
use crate::sim::SloClass;
use crate::sim::rng::unit;
use crate::twin::snapshot::ObservedRequest;
use crate::twin::store::RequestLists;

use super::text::PodMetrics;
use crate::prom_text::{Histogram, mean_correction, sample};

/// Lengths used when a pod publishes no histogram yet (vLLM before its first request).
const FALLBACK_PROMPT: u32 = 512;
/// See [`FALLBACK_PROMPT`].
const FALLBACK_OUTPUT: u32 = 256;

/// Request lists consistent with `metrics` on an instance with `engine`, observed at
/// `now_us`. Running requests beyond `max_num_seqs` are dropped (the caller reports the
/// mismatch); ids are `live-w<i>` / `live-r<i>`, stable across scrapes.
pub fn rebuild(
    instance_id: &str,
    metrics: &PodMetrics,
    engine: &EngineConfig,
    now_us: u64,
) -> RequestLists {
    let usable = engine.effective_max_model_len().max(3);
    let running = metrics.running.min(engine.max_num_seqs);
    let mut rng = ChaCha8Rng::seed_from_u64(seed(instance_id, metrics.waiting, running));
    // Each histogram's mean correction once per page, not once per draw.
    let prompt_histogram = metrics
        .prompt_tokens
        .as_ref()
        .map(|h| (h, mean_correction(h)));
    let output_histogram = metrics
        .generation_tokens
        .as_ref()
        .map(|h| (h, mean_correction(h)));
    let mut draw = |histogram: Option<(&Histogram, f64)>, fallback: u32, max: u32| {
        let value = histogram
            .and_then(|(h, correction)| sample(h, unit(&mut rng)).map(|v| v * correction))
            .unwrap_or(f64::from(fallback));
        (value.round() as u32).clamp(1, max)
    };
    // prompt in 1..usable-1, so at least one output token fits.
    let mut lengths = |count: u32| -> Vec<(u32, u32)> {
        (0..count)
            .map(|_| {
                let prompt = draw(prompt_histogram, FALLBACK_PROMPT, usable - 2);
                let output = draw(output_histogram, FALLBACK_OUTPUT, usable - prompt);
                (prompt, output.max(2))
            })
            .collect()
    };
    let waiting_lengths = lengths(metrics.waiting);
    let running_lengths = lengths(running);
    let block = u64::from(engine.block_size.max(1));
    let target_tokens = metrics.kv_usage * f64::from(engine.num_gpu_blocks) * block as f64;
    let prompts: f64 = running_lengths.iter().map(|&(p, _)| f64::from(p)).sum();
    let outputs: f64 = running_lengths.iter().map(|&(_, o)| f64::from(o - 1)).sum();
    let hit_rate = metrics.prefix_hit_rate().unwrap_or(0.0);
    let request = |index: usize, prefix: char, prompt: u32| ObservedRequest {
        request_id: request_id(prefix, index),
        arrival_us: now_us,
        prompt_tokens: prompt,
        computed_tokens: 0,
        cached_tokens: 0,
        output_tokens: 0,
        max_tokens: 0,
        known_output_tokens: None,
        priority: 0,
        slo_class: SloClass::default(),
        scheduled_tokens: 0,
        block_hashes: Vec::new(),
        token_ids: None,
    };
    let waiting = waiting_lengths
        .iter()
        .enumerate()
        .map(|(i, &(prompt, _))| request(i, 'w', prompt))
        .collect();
    // Prompts scaled down when the usage cannot hold them all (the draws overshoot): every
    // running request is taken to be decoding, the common case under chunked prefill.
    let scale = if prompts > 0.0 && target_tokens < prompts {
        target_tokens / prompts
    } else {
        1.0
    };
    let fraction = if outputs > 0.0 && target_tokens > prompts {
        ((target_tokens - prompts) / outputs).clamp(0.0, 1.0)
    } else {
        0.0
    };
    let running = running_lengths
        .iter()
        .enumerate()
        .map(|(i, &(prompt, output))| {
            let prompt = ((f64::from(prompt) * scale) as u32).clamp(1, prompt);
            let mut r = request(i, 'r', prompt);
            let cached = (f64::from(prompt) * hit_rate) as u64 / block * block;
            r.cached_tokens = cached.min(u64::from(prompt)) as u32;
            let generated = 1 + (f64::from(output - 1) * fraction) as u32;
            r.output_tokens = generated.min(output - 1).max(1);
            r.computed_tokens = prompt + r.output_tokens - 1;
            r
        })
        .collect();
    RequestLists {
        waiting,
        running,
        step_end_us: None,
    }
}

/// `live-{prefix}{index}`, written without the formatting machinery (a rebuild names every
/// request of the pod on every scrape: `format!` was two fifths of a rebuild's instructions).
fn request_id(prefix: char, index: usize) -> String {
    let mut digits = itoa::Buffer::new();
    let digits = digits.format(index);
    let mut id = String::with_capacity(6 + digits.len());
    id.push_str("live-");
    id.push(prefix);
    id.push_str(digits);
    id
}

fn seed(instance_id: &str, waiting: u32, running: u32) -> u64 {
    // FNV-1a: stable across runs and platforms (std's hasher is not).
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in instance_id
        .bytes()
        .chain(waiting.to_le_bytes())
        .chain(running.to_le_bytes())
    {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash
}

#[cfg(test)]
mod tests {
    use super::*;

    fn engine() -> EngineConfig {
        EngineConfig::vllm_defaults(1000, 8192)
    }

    #[test]
    fn counts_and_usage_match_the_gauges() {
        let metrics = PodMetrics {
            waiting: 3,
            running: 5,
            kv_usage: 0.4,
            prompt_tokens: Some(Histogram {
                buckets: vec![(500.0, 10.0), (2000.0, 20.0), (f64::INFINITY, 20.0)],
                sum: None,
            }),
            ..PodMetrics::default()
        };
        let lists = rebuild("pod", &metrics, &engine(), 10);
        assert_eq!((lists.waiting.len(), lists.running.len()), (3, 5));
        let held: u64 = lists
            .running
            .iter()
            .map(|r| u64::from(r.computed_tokens).div_ceil(16))
            .sum();
        let target = 0.4 * 1000.0;
        assert!(
            (held as f64 - target).abs() <= 5.0 + 1.0,
            "held {held} blocks, usage says {target}"
        );
        assert_eq!(
            lists,
            rebuild("pod", &metrics, &engine(), 10),
            "deterministic"
        );
    }

    #[test]
    fn request_ids_read_as_their_prefix_and_index() {
        assert_eq!(request_id('w', 0), "live-w0");
        assert_eq!(request_id('r', 1234567), "live-r1234567");
        assert_eq!(request_id('r', 42), format!("live-r{}", 42));
    }

    #[test]
    fn inverse_cdf_stays_inside_buckets() {
        let h = Histogram {
            buckets: vec![(10.0, 5.0), (20.0, 5.0), (40.0, 10.0)],
            sum: None,
        };
        assert_eq!(sample(&h, 0.0), Some(0.0));
        assert!((sample(&h, 0.75).expect("value") - 30.0).abs() < 1e-9);
        assert_eq!(sample(&Histogram::default(), 0.5), None);
        // Interpolated mean 17.5; a true mean of 8.75 halves every draw.
        let skewed = Histogram {
            sum: Some(87.5),
            ..h
        };
        assert!((mean_correction(&skewed) - 0.5).abs() < 1e-12);
    }
}
