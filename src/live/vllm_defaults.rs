//! vLLM's engine defaults a pod runs with when its pool does not set them: the batch limits
//! its OpenAI server picks by GPU. Shared by the flag/YAML sources (`config.rs`) and the
//! inferred pods (`infer/`).

use crate::cluster::config::InstanceConfig;

/// vLLM's default `(max_num_seqs, max_num_batched_tokens)` for its OpenAI server on `gpu`
/// (`EngineArgs.get_batch_defaults` in vllm/engine/arg_utils.py): a GPU with at least 70 GiB
/// that is not an A100 (H100, H200, MI300X, B200) gets 1024 / 8192, others 256 / 2048;
/// `max_num_seqs` is at most `max_num_batched_tokens`.
pub fn vllm_batch_defaults(gpu: &str) -> (u32, u32) {
    let memory_gib = crate::catalog::gpu(gpu).map_or(0.0, |spec| spec.memory_gib);
    let (seqs, tokens) = if memory_gib >= 70.0 && !gpu.to_ascii_lowercase().contains("a100") {
        (1024, 8192)
    } else {
        (256, 2048)
    };
    (seqs.min(tokens), tokens)
}

/// Gives a live pool's template vLLM's batch defaults for its GPU where the pool does not
/// set them (`explicit`: which it sets): a pod runs with vLLM's defaults, not ditto's.
pub fn apply_vllm_batch_defaults(template: &mut InstanceConfig, explicit: (bool, bool)) {
    let (seqs, tokens) = vllm_batch_defaults(&template.gpu);
    let engine = &mut template.engine;
    if !explicit.1 && engine.enable_chunked_prefill {
        engine.max_num_batched_tokens = tokens;
    }
    if !explicit.0 {
        engine.max_num_seqs = seqs.min(engine.max_num_batched_tokens.max(1));
    }
    if engine.validate().is_err() {
        // Keep a valid engine: the defaults do not fit this pool (e.g. a short max_model_len).
        engine.max_num_batched_tokens = engine.max_num_batched_tokens.max(engine.max_num_seqs);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vllm_defaults_follow_the_gpu() {
        assert_eq!(vllm_batch_defaults("H100"), (1024, 8192));
        assert_eq!(vllm_batch_defaults("A100-80"), (256, 2048));
        assert_eq!(vllm_batch_defaults("no-such-gpu"), (256, 2048));
    }
}
