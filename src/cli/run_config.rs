//! `ditto run`'s engine configuration from its flags (and a replay trace's recorded server
//! settings), each error naming the flag.

use super::args::RunArgs;
use super::error::CliError;
use crate::sim::capacity;
use crate::sim::latency::{GpuSpec, ModelArch, WeightOffload};
use crate::sim::{EngineConfig, OffloadConnector, SchedulingPolicy};
use crate::workload::ReplayConfig;

/// The weights `--cpu-offload-gb` moves to host memory for `arch` on `gpu` at `tp`.
pub(super) fn weight_offload(
    args: &RunArgs,
    arch: &ModelArch,
    gpu: &GpuSpec,
    tp: u32,
) -> Result<WeightOffload, CliError> {
    WeightOffload::plan(arch, gpu, tp, args.cpu_offload_gb)
        .map_err(|err| CliError::flag("cpu-offload-gb", err.to_string()))
}

/// The engine configuration of a run of `arch` on `gpu` at tensor parallelism `tp`, with
/// `offload`'s weights in host memory (their GPU memory goes to KV blocks when the blocks
/// are derived from memory).
pub(super) fn engine_config(
    args: &RunArgs,
    arch: &ModelArch,
    gpu: &GpuSpec,
    tp: u32,
    replay: Option<ReplayConfig>,
    offload: &WeightOffload,
) -> Result<EngineConfig, CliError> {
    let block_size = args
        .block_size
        .or(replay.map(|r| r.block_size))
        .unwrap_or(16);
    if block_size == 0 {
        return Err(CliError::flag("block-size", "must be at least 1"));
    }
    let num_gpu_blocks = match args.num_gpu_blocks {
        Some(0) => return Err(CliError::flag("num-gpu-blocks", "must be at least 1")),
        Some(blocks) => blocks,
        None => match replay.map(|r| r.kv_blocks_total_gpu).filter(|&b| b > 0) {
            Some(blocks) => u32::try_from(blocks).map_err(|_| {
                CliError::flag(
                    "trace",
                    format!("kv_blocks_total_gpu {blocks} is too large"),
                )
            })?,
            None => {
                let utilization = args.gpu_memory_utilization;
                if !(utilization > 0.0 && utilization <= 1.0) {
                    return Err(CliError::flag(
                        "gpu-memory-utilization",
                        format!("must be in (0, 1], got {utilization}"),
                    ));
                }
                capacity::num_gpu_blocks_offloaded(
                    arch,
                    gpu,
                    tp,
                    utilization,
                    block_size,
                    offload.bytes,
                )?
            }
        },
    };
    let max_model_len = args.max_model_len.unwrap_or(arch.max_position_embeddings);
    let scheduling_policy = SchedulingPolicy::parse(&args.scheduling_policy).ok_or_else(|| {
        CliError::flag(
            "scheduling-policy",
            format!(
                "unknown policy {:?}; expected fcfs, priority or sjf",
                args.scheduling_policy
            ),
        )
    })?;
    if !(args.cpu_offload_bandwidth_gbps.is_finite() && args.cpu_offload_bandwidth_gbps > 0.0) {
        return Err(CliError::flag(
            "cpu-offload-bandwidth-gbps",
            "must be a positive number",
        ));
    }
    if !(args.kv_sample_interval_s.is_finite() && args.kv_sample_interval_s >= 0.0) {
        return Err(CliError::flag(
            "kv-sample-interval-s",
            "must be a non-negative number",
        ));
    }
    let block_bytes = arch.kv_bytes_per_block(tp, block_size);
    let cpu_block_load_us =
        (block_bytes as f64 / (args.cpu_offload_bandwidth_gbps * 1e3)).ceil() as u64;
    let mut config = EngineConfig::vllm_defaults(num_gpu_blocks, max_model_len);
    config.block_size = block_size;
    config.max_num_seqs = args
        .max_num_seqs
        .or(replay.map(|r| r.max_num_seqs))
        .unwrap_or(256);
    config.max_num_batched_tokens = args
        .max_num_batched_tokens
        .or(replay.map(|r| r.max_num_batched_tokens))
        .unwrap_or(2048);
    config.long_prefill_token_threshold = args.long_prefill_token_threshold;
    config.enable_chunked_prefill = !args.no_enable_chunked_prefill;
    config.enable_prefix_caching = !args.no_enable_prefix_caching;
    config.num_cpu_blocks = args.num_cpu_blocks;
    config.cpu_block_load_us = cpu_block_load_us;
    config.cpu_offload_gb = args.cpu_offload_gb;
    config.offload_connector = offload_connector(args, arch, tp, block_size)?;
    config.scheduling_policy = scheduling_policy;
    config.kv_sample_interval_us = (args.kv_sample_interval_s * 1e6).round() as u64;
    config.record_token_gaps = args.per_request.is_some();
    config.validate().map_err(|err| CliError::BadFlag {
        flag: flag_of_field(err.field),
        reason: err.reason.clone(),
    })?;
    Ok(config)
}

/// `--kv-offload-cpu-bytes`' connector for `arch` on `tp` ranks at `block_size`.
fn offload_connector(
    args: &RunArgs,
    arch: &ModelArch,
    tp: u32,
    block_size: u32,
) -> Result<Option<OffloadConnector>, CliError> {
    match args.kv_offload_cpu_bytes {
        Some(0) => Err(CliError::flag(
            "kv-offload-cpu-bytes",
            "must be at least 1 byte (vLLM needs cpu_bytes_to_use to size the CPU tier)",
        )),
        Some(bytes) => Ok(Some(OffloadConnector::of_bytes(
            bytes, arch, tp, block_size,
        ))),
        None => Ok(None),
    }
}

/// The CLI flag that sets an engine config field.
fn flag_of_field(field: &str) -> &'static str {
    match field {
        "block_size" => "block-size",
        "num_gpu_blocks" => "num-gpu-blocks",
        "num_cpu_blocks" => "num-cpu-blocks",
        "cpu_offload_gb" => "cpu-offload-gb",
        field if field.starts_with("offload_connector.") => "kv-offload-cpu-bytes",
        "max_num_seqs" => "max-num-seqs",
        "max_num_batched_tokens" => "max-num-batched-tokens",
        "max_model_len" => "max-model-len",
        _ => "config",
    }
}
