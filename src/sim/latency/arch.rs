//! Model architecture and GPU specification: the plain-data inputs of the analytic latency
//! models and of the KV-capacity calculation.
//!
//! Owns the figures read from a HuggingFace `config.json` ([`ModelArch`]) and from a GPU
//! datasheet ([`GpuSpec`]), plus the small derived quantities several models share (KV bytes
//! per token, MoE layer split, effective weight width). Knows nothing about JSON, files or the
//! catalog that fills these structs (that lives in `crate::catalog`), nor about batches or time.

/// Below this many routed experts a model counts as dense (BLIS `MoEMinExperts`): a
/// single-expert config is dense-equivalent and must not enter the MoE formulas.
pub const MOE_MIN_EXPERTS: u32 = 2;

/// Architecture figures of a transformer model, as read from its HF `config.json`.
///
/// Plain data: every field is public and the catalog's parser fills them. Counts that a config
/// may omit use `0` for "absent" (documented per field), mirroring how BLIS reads them, so the
/// formulas can apply the same fallbacks.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelArch {
    /// Model name (catalog directory name, or the name given with a user config).
    pub name: String,
    /// `num_hidden_layers`.
    pub num_layers: u32,
    /// `hidden_size` (d).
    pub hidden_size: u32,
    /// `num_attention_heads` (H).
    pub num_heads: u32,
    /// KV heads (`num_key_value_heads` | `num_kv_heads` | `multi_query_group_num`), already
    /// defaulted to `num_heads` when the config gives none (MHA).
    pub num_kv_heads: u32,
    /// Explicit `head_dim`; 0 when absent. Only KV capacity uses it (see
    /// [`ModelArch::effective_head_dim`]); the step-time models use `hidden_size / num_heads`
    /// as BLIS does.
    pub head_dim: u32,
    /// `intermediate_size` | `ffn_hidden_size` (dense FFN width); 0 when absent.
    pub intermediate_size: u32,
    /// `vocab_size`.
    pub vocab_size: u32,
    /// Bytes per element of the compute/activation dtype (`torch_dtype` | `dtype`).
    pub bytes_per_param: f64,
    /// Bytes per element of the KV cache (vLLM `--kv-cache-dtype auto`: the compute dtype).
    pub kv_bytes_per_element: f64,
    /// Quantized weight width in bytes per parameter (from `quantization_config` or the model
    /// name); 0 when the weights use the compute dtype. See
    /// [`ModelArch::effective_weight_bytes_per_param`].
    pub weight_bytes_per_param: f64,
    /// `hidden_act` (empty when absent); KV capacity only supports SwiGLU-family activations.
    pub hidden_act: String,
    /// `tie_word_embeddings` (the LM head shares the embedding matrix).
    pub tie_word_embeddings: bool,
    /// `max_position_embeddings`; 0 when absent.
    pub max_position_embeddings: u32,
    /// Longest context the model serves: `max_position_embeddings` scaled by `rope_scaling`
    /// the way vLLM derives `max_model_len`.
    pub max_model_len: u32,
    /// Routed experts (first of `num_experts` | `moe_num_experts` | `n_routed_experts` |
    /// `num_local_experts` | `num_routed_experts` that is >= 2); 0 for dense models.
    pub num_experts: u32,
    /// Experts active per token (`num_experts_per_tok` | `num_experts_per_token`); 0 if absent.
    pub experts_per_tok: u32,
    /// Per-expert FFN width (`moe_intermediate_size`); 0 means "use `intermediate_size`".
    pub moe_intermediate_size: u32,
    /// Total shared-expert FFN width (`shared_expert_intermediate_size`, else
    /// `n_shared_experts` x per-expert width); 0 when the model has no shared experts.
    pub shared_expert_intermediate_size: u32,
    /// `interleave_moe_layer_step`: 0 = every layer is MoE; s > 0: one MoE layer per s + 1
    /// as BLIS reads it ([`ModelArch::step_layer_split`]), one per s as vLLM builds Llama 4
    /// ([`ModelArch::vllm_layer_split`]).
    pub interleave_moe_layer_step: u32,
    /// Dense-layer FFN width in interleaved MoE models (`intermediate_size_mlp`); 0 = use
    /// `intermediate_size`.
    pub dense_intermediate_size: u32,
    /// `first_k_dense_replace`: number of leading dense layers in an MoE model (capacity and
    /// the calibrated model's [`ModelArch::vllm_layer_split`]; BLIS's split ignores it).
    pub first_k_dense_replace: u32,
    /// `kv_lora_rank`: > 0 marks Multi-head Latent Attention (compressed KV latent).
    pub kv_lora_rank: u32,
    /// `qk_rope_head_dim`: the rotary part stored beside the MLA latent.
    pub qk_rope_head_dim: u32,
    /// Layers of sliding-window attention (`layer_types` entries `sliding_attention`); 0 for
    /// a model whose layers all attend to the whole context. With both kinds the model runs
    /// under vLLM's hybrid KV-cache manager ([`ModelArch::is_hybrid_kv`]).
    pub sliding_window_layers: u32,
    /// `sliding_window`, tokens: how far back a sliding layer attends (0 without sliding
    /// layers).
    pub sliding_window: u32,
    /// Weight width of the parameters a quantized checkpoint keeps unquantized (attention,
    /// router, embeddings, LM head: gpt-oss's `modules_to_not_convert`), bytes per
    /// parameter; 0 = the same as [`ModelArch::effective_weight_bytes_per_param`]. Only KV
    /// capacity's weight count reads it so far.
    pub unquantized_weight_bytes_per_param: f64,
}

/// GPU figures: datasheet peaks plus BLIS's calibrated efficiencies.
#[derive(Clone, Debug, PartialEq)]
pub struct GpuSpec {
    /// GPU name as the catalog spells it (e.g. `H100`, `A100-80`).
    pub name: String,
    /// Peak dense BF16/FP16 tensor throughput, TFLOPS.
    pub tflops_peak: f64,
    /// Peak dense FP8 tensor throughput, TFLOPS; 0 when the GPU has no native FP8 path.
    pub tflops_fp8: f64,
    /// Peak HBM bandwidth, TB/s.
    pub bw_peak_tbs: f64,
    /// Model-FLOPs utilisation of prefill work (roofline only).
    pub mfu_prefill: f64,
    /// Model-FLOPs utilisation of decode work (roofline only).
    pub mfu_decode: f64,
    /// Device memory, GiB (nominal, as BLIS records it).
    pub memory_gib: f64,
    /// Per-direction GPU-to-GPU bandwidth a tensor-parallel all-reduce runs over, GB/s
    /// (NVLink, or PCIe on GPUs without it; `data/gpu_interconnect.json`). 0: unknown, and
    /// the calibrated model prices no all-reduce bytes.
    pub interconnect_gbs: f64,
    /// Cost of the attention kernel's KV-cache traffic relative to the kernel the calibrated
    /// model's `kv` coefficient was fitted with (vLLM's FlashAttention 3 on Hopper: 1).
    /// vLLM runs FlashAttention 2 on Ampere and Ada; on an A100 its decode reads the KV
    /// cache at about 0.35 of the HBM peak where the Hopper fit reads it at 0.88: 2.5
    /// (`data/gpu_attention.json`, derivation in data/PROVENANCE.md; Ada's is assumed, not
    /// measured). The calibrated model multiplies its whole KV term by it (decode reads,
    /// and the smaller writes and prefill-context reads); roofline and physics do not read
    /// it.
    pub kv_read_factor: f64,
    /// Cost of streaming the weights through the GPU's GEMM kernels at decode batch sizes
    /// relative to the kernels the calibrated model's `weights` coefficient was fitted with
    /// (cuBLAS on Hopper: 1). On an A100 the decode GEMMs of 100-1,000 MB matrices reach
    /// about 0.69-0.78 of the HBM peak where an H100's reach 0.76-0.89: 1.10
    /// (`data/gpu_gemm.json`, derivation in data/PROVENANCE.md and docs/fidelity/a100.md;
    /// the other non-Hopper GPUs are 1, unmeasured). The calibrated model multiplies its
    /// weight-streaming term by it (dense and routed-expert bytes); roofline and physics,
    /// BLIS's models, do not read it.
    pub weight_read_factor: f64,
    /// Host-to-device bandwidth of the GPU's host link as the GPU's own reads of pinned host
    /// memory reach it, GB/s (`data/gpu_host_link.json`): what weights offloaded to the host
    /// (vLLM's `--cpu-offload-gb`, [`super::offload`]) cost per step. 0: unknown, and an
    /// offload is refused.
    pub host_link_gbs: f64,
}

impl ModelArch {
    /// True for a mixture-of-experts model (at least [`MOE_MIN_EXPERTS`] routed experts).
    pub fn is_moe(&self) -> bool {
        self.num_experts >= MOE_MIN_EXPERTS
    }

    /// True for Multi-head Latent Attention (DeepSeek-V2/V3, GLM-5): the KV cache stores one
    /// compressed latent per token and layer instead of per-head keys and values.
    pub fn is_mla(&self) -> bool {
        self.kv_lora_rank > 0
    }

    /// Bytes per weight parameter: the quantized width when known, else the compute dtype.
    pub fn effective_weight_bytes_per_param(&self) -> f64 {
        if self.weight_bytes_per_param > 0.0 {
            self.weight_bytes_per_param
        } else {
            self.bytes_per_param
        }
    }

    /// Head dimension for KV sizing: explicit `head_dim` when the config gives one, else
    /// `hidden_size / num_heads` (integer division, as BLIS does).
    pub fn effective_head_dim(&self) -> u32 {
        if self.head_dim > 0 {
            return self.head_dim;
        }
        self.hidden_size.checked_div(self.num_heads).unwrap_or(0)
    }

    /// Split of the layers into (MoE layers, dense layers) as the step-time models see it:
    /// interleaved models have one MoE layer per `step + 1`, other MoE models are all-MoE,
    /// dense models are all-dense. (`first_k_dense_replace` is deliberately not applied here:
    /// BLIS uses it for capacity only.)
    pub fn step_layer_split(&self) -> (u32, u32) {
        if !self.is_moe() {
            return (0, self.num_layers);
        }
        if self.interleave_moe_layer_step > 0 {
            let moe_layers = self.num_layers / (self.interleave_moe_layer_step + 1);
            return (moe_layers, self.num_layers - moe_layers);
        }
        (self.num_layers, 0)
    }

    /// Split of the layers into (MoE layers, dense layers) as vLLM builds the model: with an
    /// interleave step s > 0 (Llama 4) layer i is MoE when (i + 1) is a multiple of s, so
    /// L / s of them (Scout, s = 1: every layer); otherwise every layer after the first
    /// `first_k_dense_replace` (DeepSeek, GLM); dense models are all dense. The calibrated
    /// model prices this split; roofline and physics keep BLIS's
    /// ([`ModelArch::step_layer_split`]) for parity with BLIS's coefficients. Not read:
    /// DeepSeek's `moe_layer_freq` and Qwen's `decoder_sparse_step` / `mlp_only_layers`
    /// (1 and none in every bundled config); a Llama-4 config with step 0 (all dense in
    /// vLLM) reads as a plain MoE, as a missing step does.
    pub fn vllm_layer_split(&self) -> (u32, u32) {
        if !self.is_moe() {
            return (0, self.num_layers);
        }
        let moe_layers = self
            .num_layers
            .checked_div(self.interleave_moe_layer_step)
            .unwrap_or(self.num_layers - self.first_k_dense_replace.min(self.num_layers));
        (moe_layers, self.num_layers - moe_layers)
    }

    /// The FFN width of one routed expert: `moe_intermediate_size`, else `intermediate_size`.
    pub fn expert_intermediate_size(&self) -> u32 {
        if self.moe_intermediate_size > 0 {
            self.moe_intermediate_size
        } else {
            self.intermediate_size
        }
    }

    /// The shared-expert FFN width of a MoE layer as vLLM builds it: the config's
    /// (`shared_expert_intermediate_size`, or a shared-expert count times the expert width),
    /// else, for Llama 4 (an interleaved MoE, whose every MoE layer adds a shared expert of
    /// the routed experts' width and whose config has no count), the expert width; else 0.
    pub fn vllm_shared_expert_intermediate(&self) -> u32 {
        if self.shared_expert_intermediate_size > 0 {
            return self.shared_expert_intermediate_size;
        }
        if self.is_moe() && self.interleave_moe_layer_step > 0 {
            return self.expert_intermediate_size();
        }
        0
    }

    /// KV-cache bytes one token occupies on one GPU at tensor parallelism `tp`.
    ///
    /// Standard attention: `layers x 2 (K and V) x head_dim x kv_heads x kv_bytes / tp`, using
    /// [`ModelArch::effective_head_dim`]. When `kv_heads < tp` vLLM replicates heads, so this
    /// under-counts (BLIS's documented optimistic approximation). MLA: `layers x (kv_lora_rank
    /// + qk_rope_head_dim) x kv_bytes`, replicated on every rank so not divided by `tp`.
    ///
    /// A hybrid model ([`ModelArch::is_hybrid_kv`]) counts its full-attention layers only:
    /// what grows with every token. Its sliding layers hold at most a window's blocks per
    /// request ([`ModelArch::sliding_blocks_per_request`]), a constant.
    pub fn kv_bytes_per_token(&self, tp: u32) -> f64 {
        debug_assert!(tp > 0, "tensor parallelism must be positive, got {tp}");
        let layers = f64::from(self.full_attention_layers());
        if self.is_mla() {
            let latent_width = f64::from(self.kv_lora_rank) + f64::from(self.qk_rope_head_dim);
            return layers * latent_width * self.kv_bytes_per_element;
        }
        let per_token = layers
            * 2.0
            * f64::from(self.effective_head_dim())
            * f64::from(self.num_kv_heads)
            * self.kv_bytes_per_element;
        per_token / f64::from(tp.max(1))
    }

    /// True when the model mixes sliding-window and full-attention layers (gpt-oss): vLLM's
    /// hybrid KV-cache manager then keeps one KV group per attention type over one block
    /// pool, each group's page holding a block of tokens for the same number of layers.
    pub fn is_hybrid_kv(&self) -> bool {
        self.sliding_window_layers > 0
            && self.sliding_window > 0
            && self.sliding_window_layers < self.num_layers
    }

    /// Layers whose KV grows with the context: all of them unless the model is hybrid.
    pub fn full_attention_layers(&self) -> u32 {
        if self.is_hybrid_kv() {
            self.num_layers - self.sliding_window_layers
        } else {
            self.num_layers
        }
    }

    /// Blocks of the pool (each sized as [`ModelArch::kv_bytes_per_block`], the full
    /// layers' page) the sliding-window layers hold per running request, at most
    /// `ceil((window + block_size − 1) / block_size) + 1` of their group: vLLM's
    /// sliding-window manager frees the blocks wholly outside the window, so a request keeps
    /// the blocks the window spans unaligned plus the ones being written; the groups' pages are equal in vLLM, and when the sliding layers outnumber
    /// the full ones they form several groups (scaled here by sliding / full layers,
    /// rounded up). 0 for a non-hybrid model.
    pub fn sliding_blocks_per_request(&self, block_size: u32) -> u32 {
        if !self.is_hybrid_kv() || block_size == 0 {
            return 0;
        }
        let per_group = (self.sliding_window + block_size - 1).div_ceil(block_size) + 1;
        let full = self.full_attention_layers();
        (u64::from(per_group) * u64::from(self.sliding_window_layers))
            .div_ceil(u64::from(full))
            .try_into()
            .unwrap_or(u32::MAX)
    }

    /// Bytes per parameter of the weights a quantized checkpoint leaves unquantized: the
    /// explicit width when the config names such modules, else the effective weight width.
    pub fn unquantized_weight_bytes(&self) -> f64 {
        if self.unquantized_weight_bytes_per_param > 0.0 {
            self.unquantized_weight_bytes_per_param
        } else {
            self.effective_weight_bytes_per_param()
        }
    }

    /// KV-cache bytes one block of `block_size` tokens occupies on one GPU, truncated to whole
    /// bytes after multiplying (so a fractional per-token width is not lost).
    pub fn kv_bytes_per_block(&self, tp: u32, block_size: u32) -> u64 {
        debug_assert!(
            block_size > 0,
            "block size must be positive, got {block_size}"
        );
        let bytes = self.kv_bytes_per_token(tp) * f64::from(block_size);
        // Truncation is the intent (BLIS int64(...)); a float-to-int `as` saturates.
        bytes as u64
    }
}

impl GpuSpec {
    /// Peak tensor throughput (TFLOPS) a model with `weight_bytes_per_param` runs at: the FP8
    /// rate for exactly one-byte weights on a GPU with a native FP8 path, else the BF16 rate.
    pub fn tflops_for_weight_bytes(&self, weight_bytes_per_param: f64) -> f64 {
        if weight_bytes_per_param == 1.0 && self.tflops_fp8 > 0.0 {
            self.tflops_fp8
        } else {
            self.tflops_peak
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Llama-3.1-8B's figures, typed in by hand from its config.json (bf16, GQA 32/8).
    pub(crate) fn llama_8b() -> ModelArch {
        ModelArch {
            name: "llama-3.1-8b-instruct".to_string(),
            num_layers: 32,
            hidden_size: 4096,
            num_heads: 32,
            num_kv_heads: 8,
            head_dim: 0,
            intermediate_size: 14336,
            vocab_size: 128256,
            bytes_per_param: 2.0,
            kv_bytes_per_element: 2.0,
            weight_bytes_per_param: 0.0,
            hidden_act: "silu".to_string(),
            tie_word_embeddings: false,
            max_position_embeddings: 131072,
            max_model_len: 131072,
            num_experts: 0,
            experts_per_tok: 0,
            moe_intermediate_size: 0,
            shared_expert_intermediate_size: 0,
            interleave_moe_layer_step: 0,
            dense_intermediate_size: 0,
            first_k_dense_replace: 0,
            kv_lora_rank: 0,
            qk_rope_head_dim: 0,
            sliding_window_layers: 0,
            sliding_window: 0,
            unquantized_weight_bytes_per_param: 0.0,
        }
    }

    /// BLIS's H100 entry (hardware_config.json).
    pub(crate) fn h100() -> GpuSpec {
        GpuSpec {
            name: "H100".to_string(),
            tflops_peak: 989.5,
            tflops_fp8: 1979.0,
            bw_peak_tbs: 3.35,
            mfu_prefill: 0.45,
            mfu_decode: 0.30,
            memory_gib: 80.0,
            interconnect_gbs: 450.0,
            kv_read_factor: 1.0,
            weight_read_factor: 1.0,
            host_link_gbs: 35.2,
        }
    }

    #[test]
    fn kv_bytes_for_llama_8b() {
        // 32 layers x 2 x 128 head dim x 8 KV heads x 2 bytes = 131072 bytes per token.
        let arch = llama_8b();
        assert_eq!(arch.kv_bytes_per_token(1), 131_072.0);
        assert_eq!(arch.kv_bytes_per_token(2), 65_536.0);
        assert_eq!(arch.kv_bytes_per_block(1, 16), 2_097_152);
    }

    #[test]
    fn hybrid_kv_counts_full_layers_per_token_and_a_window_per_request() {
        // gpt-oss-120b: 36 layers, 18 sliding (window 128), 8 KV heads of 64, bf16 KV.
        let mut arch = llama_8b();
        arch.num_layers = 36;
        arch.num_kv_heads = 8;
        arch.head_dim = 64;
        assert_eq!(arch.kv_bytes_per_token(1), 36.0 * 2.0 * 64.0 * 8.0 * 2.0);
        assert_eq!(arch.sliding_blocks_per_request(16), 0);
        arch.sliding_window_layers = 18;
        arch.sliding_window = 128;
        assert!(arch.is_hybrid_kv());
        // One group's page: the 18 full layers.
        assert_eq!(arch.kv_bytes_per_token(1), 18.0 * 2.0 * 64.0 * 8.0 * 2.0);
        // ceil(143 / 16) + 1 = 10 blocks at 16; ceil(255 / 128) + 1 = 3 at 128.
        assert_eq!(arch.sliding_blocks_per_request(16), 10);
        assert_eq!(arch.sliding_blocks_per_request(128), 3);
        // Five sliding layers to one full (Gemma 3's pattern): five groups' worth.
        arch.num_layers = 6;
        arch.sliding_window_layers = 5;
        arch.sliding_window = 1024;
        assert_eq!(arch.sliding_blocks_per_request(16), 5 * 66);
        // All layers sliding is not hybrid (no full group to page by): unchanged.
        arch.sliding_window_layers = 6;
        assert!(!arch.is_hybrid_kv());
    }

    #[test]
    fn mla_kv_is_a_replicated_latent() {
        // DeepSeek-V2-Lite: 27 layers x (512 + 64) x 2 bytes, the same on every TP rank.
        let mut arch = llama_8b();
        arch.num_layers = 27;
        arch.kv_lora_rank = 512;
        arch.qk_rope_head_dim = 64;
        assert_eq!(arch.kv_bytes_per_token(1), 31_104.0);
        assert_eq!(arch.kv_bytes_per_token(4), 31_104.0);
    }

    #[test]
    fn vllm_layer_split_is_what_vllm_builds() {
        // vLLM's Llama 4 makes layer i MoE when (i + 1) % step == 0; DeepSeek and GLM keep
        // their first `first_k_dense_replace` layers dense; Mixtral is all MoE.
        let mut arch = llama_8b();
        assert_eq!(arch.vllm_layer_split(), (0, 32));
        arch.num_experts = 8;
        arch.experts_per_tok = 2;
        assert_eq!(arch.vllm_layer_split(), (32, 0));
        arch.num_layers = 48;
        arch.interleave_moe_layer_step = 1; // Llama-4 Scout
        assert_eq!(arch.vllm_layer_split(), (48, 0));
        arch.interleave_moe_layer_step = 2; // Llama-4 Maverick
        assert_eq!(arch.vllm_layer_split(), (24, 24));
        arch.interleave_moe_layer_step = 0;
        arch.num_layers = 27;
        arch.first_k_dense_replace = 1; // DeepSeek-V2-Lite
        assert_eq!(arch.vllm_layer_split(), (26, 1));
    }

    #[test]
    fn llama_4_moe_layers_have_a_shared_expert_of_the_expert_width() {
        // Llama 4's MoE layers add a shared expert of `intermediate_size` (HF's and vLLM's
        // Llama4 MoE); its config has no shared-expert count. Explicit widths win.
        let mut arch = llama_8b();
        arch.num_experts = 16;
        arch.experts_per_tok = 1;
        arch.intermediate_size = 8192;
        assert_eq!(arch.vllm_shared_expert_intermediate(), 0);
        arch.interleave_moe_layer_step = 1;
        assert_eq!(arch.vllm_shared_expert_intermediate(), 8192);
        arch.moe_intermediate_size = 4096;
        assert_eq!(arch.vllm_shared_expert_intermediate(), 4096);
        arch.shared_expert_intermediate_size = 2048;
        assert_eq!(arch.vllm_shared_expert_intermediate(), 2048);
    }

    #[test]
    fn layer_split_follows_interleave_step() {
        let mut arch = llama_8b();
        assert_eq!(arch.step_layer_split(), (0, 32));
        arch.num_experts = 16;
        arch.experts_per_tok = 1;
        assert_eq!(arch.step_layer_split(), (32, 0));
        arch.num_layers = 48;
        arch.interleave_moe_layer_step = 1;
        assert_eq!(arch.step_layer_split(), (24, 24));
        // A single expert is dense-equivalent.
        arch.num_experts = 1;
        assert_eq!(arch.step_layer_split(), (0, 48));
    }

    #[test]
    fn fp8_rate_needs_one_byte_weights_and_an_fp8_path() {
        let mut gpu = h100();
        assert_eq!(gpu.tflops_for_weight_bytes(2.0), 989.5);
        assert_eq!(gpu.tflops_for_weight_bytes(1.0), 1979.0);
        assert_eq!(gpu.tflops_for_weight_bytes(0.5), 989.5);
        gpu.tflops_fp8 = 0.0;
        assert_eq!(gpu.tflops_for_weight_bytes(1.0), 989.5);
    }
}
