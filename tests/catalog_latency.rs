#![allow(clippy::unwrap_used)]
//! Integration tests of the embedded catalog with the latency models and KV capacity: every
//! bundled model and GPU parses, builds each latency model, and reproduces BLIS's reference
//! figures where BLIS publishes them.

use ditto::catalog::{self, CatalogError};
use ditto::sim::capacity::{CapacityError, num_gpu_blocks};
use ditto::sim::latency::{BatchEntry, LatencyKind, LatencyModel};

/// A small mixed batch: one prefill chunk and three decodes.
fn sample_batch() -> [BatchEntry; 4] {
    let decode = |context_tokens| BatchEntry {
        context_tokens,
        new_tokens: 1,
        prompt_tokens: 300,
        is_prefill: false,
    };
    [
        BatchEntry {
            context_tokens: 0,
            new_tokens: 512,
            prompt_tokens: 1024,
            is_prefill: true,
        },
        decode(400),
        decode(800),
        decode(1600),
    ]
}

/// Builds `kind` for `model` on `gpu` at `tp` through the catalog.
fn build(kind: LatencyKind, model: &str, gpu: &str, tp: u32) -> Result<LatencyModel, CatalogError> {
    let arch = catalog::model(model)?;
    let gpu = catalog::gpu(gpu)?;
    catalog::latency_model(kind, &arch, &gpu, tp)
}

#[test]
fn every_bundled_model_builds_every_analytic_model_on_h100() {
    // Goal: the embedded configs are all usable. Method: roofline, physics and calibrated
    // must build at TP 1 and price a mixed batch at a finite, positive time; blackbox must
    // either build or say that BLIS fitted no coefficients for the combination.
    assert_eq!(catalog::model_names().len(), 16);
    for name in catalog::model_names() {
        for kind in [
            LatencyKind::Roofline,
            LatencyKind::Physics,
            LatencyKind::Calibrated,
        ] {
            let model = build(kind, name, "H100", 1).unwrap();
            let step = model.step_us(&sample_batch());
            assert!(step > 1 && step < 10_000_000, "{name} {kind:?}: {step} µs");
        }
        match build(LatencyKind::Blackbox, name, "H100", 1) {
            Ok(model) => assert!(model.step_us(&sample_batch()) > 1, "{name}"),
            Err(CatalogError::NoBlackboxCoefficients { .. }) => {}
            Err(other) => panic!("{name}: {other}"),
        }
    }
}

#[test]
fn every_gpu_builds_the_roofline() {
    for gpu in catalog::gpu_names() {
        let model = build(LatencyKind::Roofline, "llama-3.1-8b-instruct", gpu, 1).unwrap();
        assert!(model.step_us(&sample_batch()) > 1, "{gpu}");
    }
    // (The exact list is pinned by the catalog's unit test.)
    let names = catalog::gpu_names();
    assert!(names.is_sorted(), "{names:?}");
    for gpu in ["A100-80", "A100-PCIe", "H100", "H100-PCIe", "L40S"] {
        assert!(names.contains(&gpu), "{gpu} missing from {names:?}");
    }
}

#[test]
fn llama_8b_h100_tp1_has_26312_blocks() {
    let arch = catalog::model("llama-3.1-8b-instruct").unwrap();
    let gpu = catalog::gpu("H100").unwrap();
    assert_eq!(num_gpu_blocks(&arch, &gpu, 1, 0.9, 16), Ok(26312));
    assert_eq!(arch.max_model_len, 131_072);
}

#[test]
fn capacity_is_defined_or_says_the_model_does_not_fit() {
    // Goal: no bundled model trips a validation error in the capacity estimate. Method: try
    // TP 1..8 on H100; only "does not fit" may fail, and every model but GLM-5.2 (about
    // 750 GB of FP8 weights) fits somewhere.
    for name in catalog::model_names() {
        let arch = catalog::model(name).unwrap();
        let gpu = catalog::gpu("H100").unwrap();
        let mut fits = false;
        for tp in [1, 2, 4, 8] {
            match num_gpu_blocks(&arch, &gpu, tp, 0.9, 16) {
                Ok(blocks) => fits |= blocks > 0,
                Err(CapacityError::WeightsDoNotFit { .. }) => {}
                Err(other) => panic!("{name} TP{tp}: {other}"),
            }
        }
        assert_eq!(fits, name != "glm-5.2-fp8", "{name}");
    }
}

#[test]
fn unknown_names_are_named_and_alternatives_listed() {
    let err = catalog::model("gpt-7-turbo").unwrap_err().to_string();
    assert!(err.contains("gpt-7-turbo"), "{err}");
    assert!(err.contains("llama-3.1-8b-instruct"), "{err}");
    let err = catalog::gpu("TPU-v9").unwrap_err().to_string();
    assert!(err.contains("TPU-v9") && err.contains("H100"), "{err}");
    let err = catalog::blackbox_coefficients("yi-34b", "H100", 1)
        .unwrap_err()
        .to_string();
    assert!(err.contains("yi-34b") && err.contains("qwen3-14b"), "{err}");
}

#[test]
fn blackbox_llama_8b_h100_tp1_matches_blis() {
    let coeffs =
        catalog::blackbox_coefficients("meta-llama/Llama-3.1-8B-Instruct", "H100", 1).unwrap();
    assert_eq!(coeffs.alpha, [10326.268121600151, 0.0, 0.0]);
    assert_eq!(
        coeffs.beta,
        [6472.007648778123, 19.79721387814611, 304.4021040302657]
    );
    // 100 decodes: 6472.0 + 30440.2 µs, truncated.
    let decodes = vec![
        BatchEntry {
            context_tokens: 10,
            new_tokens: 1,
            prompt_tokens: 10,
            is_prefill: false,
        };
        100
    ];
    assert_eq!(LatencyModel::Blackbox(coeffs).step_us(&decodes), 36912);
}

#[test]
fn physics_overheads_come_from_blis_defaults() {
    let model = build(LatencyKind::Physics, "llama-3.1-8b-instruct", "H100", 1).unwrap();
    assert_eq!(model.queueing_us(512), 15563);
    assert_eq!(model.post_decode_us(), 777);
    assert_eq!(model.output_token_us(), 45);
    let roofline = build(LatencyKind::Roofline, "llama-3.1-8b-instruct", "H100", 1).unwrap();
    assert_eq!(roofline.queueing_us(512), 0);
    assert_eq!(roofline.output_token_us(), 0);
}

#[test]
fn architectures_read_as_blis_reads_them() {
    // Scout: multimodal (text_config), interleaved MoE, compressed-tensors FP8 weights.
    let scout = catalog::model("llama-4-scout-17b-16e-instruct-fp8-dynamic").unwrap();
    assert_eq!(
        (scout.num_layers, scout.num_experts, scout.experts_per_tok),
        (48, 16, 1)
    );
    assert_eq!(scout.interleave_moe_layer_step, 1);
    assert_eq!(scout.dense_intermediate_size, 16384);
    assert_eq!(scout.effective_weight_bytes_per_param(), 1.0);
    assert_eq!(scout.step_layer_split(), (24, 24));
    // What vLLM builds (the calibrated model's split): every Scout layer MoE, each with a
    // shared expert of the expert width.
    assert_eq!(scout.vllm_layer_split(), (48, 0));
    assert_eq!(scout.vllm_shared_expert_intermediate(), 8192);
    // DeepSeek-V2-Lite: MLA, shared experts, a dense first layer, yarn rope.
    let deepseek = catalog::model("deepseek-v2-lite").unwrap();
    assert!(deepseek.is_mla());
    assert_eq!(deepseek.shared_expert_intermediate_size, 2 * 1408);
    assert_eq!(deepseek.first_k_dense_replace, 1);
    assert_eq!(deepseek.vllm_layer_split(), (26, 1));
    assert_eq!(deepseek.max_model_len, 163_840);
    // Qwen3-30B-A3B: `num_experts` alias and an explicit head_dim.
    let qwen = catalog::model("qwen3-30b-a3b").unwrap();
    assert_eq!(
        (qwen.num_experts, qwen.experts_per_tok, qwen.head_dim),
        (128, 8, 128)
    );
    // GLM-5.2: `dtype` instead of `torch_dtype`, fp8 quantization.
    let glm = catalog::model("glm-5.2-fp8").unwrap();
    assert_eq!(glm.bytes_per_param, 2.0);
    assert_eq!(glm.effective_weight_bytes_per_param(), 1.0);
    assert_eq!(glm.vllm_layer_split(), (75, 3));
}

#[test]
fn user_configs_parse_with_the_name_fallback() {
    let json = r#"{"num_hidden_layers": 4, "hidden_size": 256, "num_attention_heads": 8,
                   "num_key_value_heads": 2, "intermediate_size": 512, "vocab_size": 1000,
                   "torch_dtype": "bfloat16", "max_position_embeddings": 2048}"#;
    let arch = catalog::parse_model_config("acme/tiny-w4a16", json).unwrap();
    assert_eq!(arch.name, "acme/tiny-w4a16");
    assert_eq!(arch.effective_weight_bytes_per_param(), 0.5);
    assert_eq!(arch.num_kv_heads, 2);
    let err = catalog::parse_model_config("broken", "{}")
        .unwrap_err()
        .to_string();
    assert!(err.contains("broken"), "{err}");
}

#[test]
fn physics_rejects_tp_that_does_not_divide_the_heads() {
    // Qwen2.5-7B has 28 heads and 4 KV heads: TP 8 cannot shard them.
    let err = build(LatencyKind::Physics, "qwen2.5-7b-instruct", "H100", 8).unwrap_err();
    assert!(err.to_string().contains("divisible"), "{err}");
}
