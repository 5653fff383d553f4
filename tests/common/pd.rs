//! The two-pool P/D cluster the P/D tests run: `prefill` prefill pods and `decode` decode pods
//! with a blackbox step model, as the start of a cluster YAML (its `disaggregation:` section
//! is the caller's).

/// The `pools:` section: `prefill` prefill pods (2,000 blocks), `decode` decode pods (3,000).
pub fn pools_yaml(prefill: u32, decode: u32) -> String {
    format!(
        "pools:
  - name: p
    role: prefill
    replicas: {prefill}
    latency_model: blackbox
    coefficients: {{alpha: [0, 0, 0], beta: [1000, 1, 10]}}
    engine: {{num_gpu_blocks: 2000, max_model_len: 16384}}
  - name: d
    role: decode
    replicas: {decode}
    latency_model: blackbox
    coefficients: {{alpha: [0, 0, 0], beta: [1000, 1, 10]}}
    engine: {{num_gpu_blocks: 3000, max_model_len: 16384}}
"
    )
}
