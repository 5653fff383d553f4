use super::*;

/// Qwen/Qwen3-32B's published config.json (the fields ditto reads).
const QWEN3_32B: &str = r#"{"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
  "hidden_size": 5120, "num_hidden_layers": 64, "num_attention_heads": 64,
  "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 25600,
  "vocab_size": 151936, "max_position_embeddings": 40960, "rms_norm_eps": 1e-6,
  "rope_theta": 1000000, "torch_dtype": "bfloat16"}"#;

fn template() -> InstanceConfig {
    crate::cluster::spec::default_cluster().instances[0].clone()
}

fn qwen_only(name: &str) -> Result<FoundConfig, String> {
    if catalog::normalize_model_name(name) == "qwen3-32b" {
        return Ok(FoundConfig {
            json: Some(QWEN3_32B.to_owned()),
            source: source::MODEL_DIR,
        });
    }
    find_model_config(name, &InferOptions::default())
}

fn pod(args: &str, gpus: Option<u32>) -> PodFacts {
    let words: Vec<String> = args.split_whitespace().map(str::to_owned).collect();
    PodFacts {
        gpus,
        node: Some("node-a".to_owned()),
        ..parse_command_line(&words)
    }
}

#[test]
fn a_pod_is_inferred_from_its_args_its_gpus_and_its_node() {
    let inputs = PodInputs {
        facts: Some(pod("vllm serve Qwen/Qwen3-32B --max-num-seqs 128", Some(2))),
        node_gpu: Some(NodeGpu::Product("NVIDIA-H100-80GB-HBM3".to_owned())),
        served_model: Some("qwen".to_owned()),
    };
    let inferred = infer(
        &inputs,
        &template(),
        &InferSpec::default(),
        &InferOptions::default(),
        qwen_only,
    );
    let instance = inferred.instance.unwrap();
    assert_eq!(
        (instance.model.as_str(), instance.gpu.as_str(), instance.tp),
        ("Qwen/Qwen3-32B", "H100", 2)
    );
    assert_eq!(instance.engine.max_num_seqs, 128);
    // vLLM's default for an H100 where the args say nothing.
    assert_eq!(instance.engine.max_num_batched_tokens, 8192);
    assert_eq!(instance.engine.max_model_len, 40960);
    let setup = &inferred.setup;
    assert_eq!(
        [
            setup.model_source.as_str(),
            &setup.config_source,
            &setup.gpu_source,
            &setup.tp_source
        ],
        ["pod-args", "model-dir", "node-label", "gpu-request"]
    );
    assert!(
        setup.pool.starts_with("qwen3-32b-h100-tp2-"),
        "{}",
        setup.pool
    );
}

#[test]
fn the_metrics_model_name_is_used_when_the_args_name_none() {
    let inputs = PodInputs {
        facts: Some(pod("vllm serve --tensor-parallel-size 1", None)),
        node_gpu: Some(NodeGpu::Unreadable("forbidden".to_owned())),
        served_model: Some("Qwen/Qwen3-14B".to_owned()),
    };
    let options = InferOptions {
        default_gpu: Some("A100-80".to_owned()),
        ..InferOptions::default()
    };
    let inferred = infer(
        &inputs,
        &template(),
        &InferSpec::default(),
        &options,
        |name| find_model_config(name, &InferOptions::default()),
    );
    let setup = &inferred.setup;
    assert_eq!(
        (setup.model.as_str(), setup.model_source.as_str()),
        ("Qwen/Qwen3-14B", "metrics")
    );
    assert_eq!(setup.config_source, "catalog");
    assert_eq!(
        (setup.gpu.as_str(), setup.gpu_source.as_str()),
        ("A100-80", "default-gpu")
    );
    assert_eq!(setup.pool, "qwen3-14b-a100-80-tp1");
    assert_eq!(inferred.instance.unwrap().engine.max_num_seqs, 256);
}

#[test]
fn what_cannot_be_inferred_is_an_error_naming_it() {
    let unknown = PodInputs {
        facts: Some(pod("vllm serve acme/secret-70b", Some(1))),
        node_gpu: Some(NodeGpu::Product("NVIDIA-H100-80GB-HBM3".to_owned())),
        served_model: None,
    };
    let options = InferOptions {
        model_dir: Some(PathBuf::from("/nonexistent/models")),
        ..InferOptions::default()
    };
    let inferred = infer(
        &unknown,
        &template(),
        &InferSpec::default(),
        &options,
        |name| find_model_config(name, &options),
    );
    let err = inferred.instance.unwrap_err();
    assert!(
        err.starts_with(
            "model acme/secret-70b: no config.json in the catalog, --model-dir or the HF cache"
        ),
        "{err}"
    );
    assert!(
        err.contains("/nonexistent/models/secret-70b/config.json"),
        "{err}"
    );
    assert_eq!(inferred.setup.model, "acme/secret-70b");
    let gpu = PodInputs {
        facts: Some(pod("vllm serve Qwen/Qwen3-14B", Some(1))),
        node_gpu: Some(NodeGpu::Product("NVIDIA-A100-SXM4-40GB".to_owned())),
        served_model: None,
    };
    let err = infer(
        &gpu,
        &template(),
        &InferSpec::default(),
        &options,
        qwen_only,
    )
    .instance
    .unwrap_err();
    assert!(
        err.starts_with("gpu: node label nvidia.com/gpu.product=NVIDIA-A100-SXM4-40GB"),
        "{err}"
    );
    let nothing = PodInputs {
        facts: Some(pod("python server.py", None)),
        ..PodInputs::default()
    };
    let err = infer(
        &nothing,
        &template(),
        &InferSpec::default(),
        &options,
        qwen_only,
    )
    .instance
    .unwrap_err();
    assert!(err.starts_with("model: neither"), "{err}");
}

#[test]
fn the_pools_explicit_fields_override_what_is_inferred() {
    let yaml = "pools:\n  - {name: p, model: llama-3.1-8b-instruct, tp: 1, \
                engine: {max_num_seqs: 64}}\n";
    let explicit = explicit_fields(yaml, "p");
    assert_eq!(explicit, ["engine.max_num_seqs", "model", "name", "tp"]);
    let cluster = crate::cluster::spec::parse_cluster_yaml(yaml).unwrap();
    let inputs = PodInputs {
        facts: Some(pod("vllm serve Qwen/Qwen3-32B --max-num-seqs 512", Some(2))),
        node_gpu: Some(NodeGpu::Product("NVIDIA-L40S".to_owned())),
        served_model: None,
    };
    let inferred = infer(
        &inputs,
        &cluster.instances[0],
        &InferSpec { explicit },
        &InferOptions::default(),
        qwen_only,
    );
    let instance = inferred.instance.unwrap();
    assert_eq!(
        (instance.model.as_str(), instance.gpu.as_str(), instance.tp),
        ("llama-3.1-8b-instruct", "L40S", 1)
    );
    assert_eq!(instance.engine.max_num_seqs, 64);
    assert_eq!(
        [
            inferred.setup.model_source.as_str(),
            &inferred.setup.gpu_source,
            &inferred.setup.tp_source
        ],
        ["pool", "node-label", "pool"]
    );
}

#[test]
fn model_configs_are_found_in_a_model_dir_and_an_hf_cache() {
    // A model the catalog does not embed (Qwen3-32B now is), in a Qwen3-32B-shaped config.
    let root = std::env::temp_dir().join(format!("ditto-infer-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let model_dir = root.join("models");
    std::fs::create_dir_all(model_dir.join("acme-32b")).unwrap();
    std::fs::write(model_dir.join("acme-32b/config.json"), QWEN3_32B).unwrap();
    let hub = root.join("hf/hub/models--Acme--Acme-32B");
    std::fs::create_dir_all(hub.join("snapshots/abc123")).unwrap();
    std::fs::create_dir_all(hub.join("refs")).unwrap();
    std::fs::write(hub.join("refs/main"), "abc123\n").unwrap();
    std::fs::write(hub.join("snapshots/abc123/config.json"), QWEN3_32B).unwrap();
    let by_dir = InferOptions {
        model_dir: Some(model_dir),
        ..InferOptions::default()
    };
    assert_eq!(
        find_model_config("Acme/Acme-32B", &by_dir).unwrap().source,
        "model-dir"
    );
    let by_cache = InferOptions {
        hf_cache: Some(root.join("hf")),
        ..InferOptions::default()
    };
    let found = find_model_config("Acme/Acme-32B", &by_cache).unwrap();
    assert_eq!((found.source, found.json.is_some()), ("hf-cache", true));
    // A bare name finds the repository by its last segment.
    assert!(find_model_config("acme-32b", &by_cache).is_ok());
    assert_eq!(
        find_model_config("Qwen/Qwen3-14B", &by_cache)
            .unwrap()
            .source,
        "catalog"
    );
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn a_pod_offloading_weights_is_simulated_with_its_offload_in_a_pool_of_its_own() {
    let infer_args = |args: &str| {
        let inputs = PodInputs {
            facts: Some(pod(args, Some(2))),
            node_gpu: Some(NodeGpu::Product("NVIDIA-H100-80GB-HBM3".to_owned())),
            served_model: Some("qwen".to_owned()),
        };
        infer(
            &inputs,
            &template(),
            &InferSpec::default(),
            &InferOptions::default(),
            qwen_only,
        )
    };
    let plain = infer_args("vllm serve Qwen/Qwen3-32B");
    let offloading = infer_args("vllm serve Qwen/Qwen3-32B --cpu-offload-gb 4");
    let underscored = infer_args("vllm serve Qwen/Qwen3-32B --cpu_offload_gb=4");
    assert_eq!(plain.instance.unwrap().engine.cpu_offload_gb, 0.0);
    assert_eq!(offloading.instance.unwrap().engine.cpu_offload_gb, 4.0);
    assert_eq!(underscored.instance.unwrap().engine.cpu_offload_gb, 4.0);
    assert_eq!(
        plain.setup.pool, "qwen3-32b-h100-tp2",
        "no args: the plain name"
    );
    assert!(
        offloading.setup.pool.starts_with("qwen3-32b-h100-tp2-"),
        "{}",
        offloading.setup.pool
    );
    assert_eq!(offloading.setup.pool, underscored.setup.pool);
    let err = infer_args("vllm serve Qwen/Qwen3-32B --cpu-offload-gb -1")
        .instance
        .unwrap_err();
    assert!(err.contains("--cpu-offload-gb"), "{err}");
}

/// A decode pod of llm-d's tiered-prefix-cache guide as Kubernetes serves it: the
/// `modelserver` container (`vllm serve`, the recipe's command) with the args of
/// `guides/tiered-prefix-cache/modelserver/gpu/vllm/native/cpu/base/patch-vllm.yaml`
/// (llm-d/llm-d), `connector` in place of its `--kv-transfer-config` JSON, on 2 GPUs.
fn guide_pod(connector: &[&str]) -> k8s_openapi::api::core::v1::Pod {
    let mut args = vec!["Qwen/Qwen3-32B", "--tensor-parallel-size=2"];
    args.extend_from_slice(connector);
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "gpu-vllm-decode-0", "namespace": "llm-d",
                     "labels": {"llm-d.ai/guide": "tiered-prefix-cache"}},
        "spec": {"nodeName": "node-a", "containers": [
            {"name": "modelserver", "image": "vllm/vllm-openai:v0.23.0",
             "command": ["vllm", "serve"], "args": args,
             "resources": {"limits": {"nvidia.com/gpu": "2"}}}]}
    }))
    .unwrap()
}

fn infer_pod(pod: &k8s_openapi::api::core::v1::Pod, spec: &InferSpec) -> Inferred {
    let inputs = PodInputs {
        facts: Some(pod_facts(pod)),
        node_gpu: Some(NodeGpu::Product("NVIDIA-H100-80GB-HBM3".to_owned())),
        served_model: None,
    };
    infer(
        &inputs,
        &template(),
        spec,
        &InferOptions::default(),
        qwen_only,
    )
}

/// The CPU tier entries vLLM makes of `bytes` for Qwen3-32B at 16-token blocks: one
/// block's K and V, bf16, over its 64 layers and 8 KV heads of 128 (summed over the ranks).
fn qwen_32b_cpu_blocks(bytes: u64) -> u32 {
    u32::try_from(bytes / (2 * 64 * 8 * 128 * 2 * 16)).unwrap()
}

const GUIDE_CONNECTOR: &str = r#"{"kv_connector":"OffloadingConnector","kv_role":"kv_both","kv_connector_extra_config":{"cpu_bytes_to_use":107374182400}}"#;

#[test]
fn the_guide_s_offloading_connector_pod_is_simulated_with_its_cpu_tier() {
    let inferred = infer_pod(
        &guide_pod(&["--kv-transfer-config", GUIDE_CONNECTOR]),
        &InferSpec::default(),
    );
    let instance = inferred.instance.unwrap();
    assert_eq!(instance.tp, 2);
    let connector = instance.engine.offload_connector.unwrap();
    assert_eq!(connector.cpu_blocks, qwen_32b_cpu_blocks(107_374_182_400));
    // The `=` form and a `sh -c` script with the JSON single-quoted (spaces in it) agree.
    let inline = format!("--kv-transfer-config={GUIDE_CONNECTOR}");
    let same = infer_pod(&guide_pod(&[&inline]), &InferSpec::default());
    assert_eq!(
        same.instance.unwrap().engine.offload_connector,
        Some(connector)
    );
    let mut scripted = guide_pod(&[]);
    let container = &mut scripted.spec.as_mut().unwrap().containers[0];
    container.command = Some(vec!["/bin/sh".to_owned(), "-c".to_owned()]);
    container.args = Some(vec![
        "exec vllm serve Qwen/Qwen3-32B --tensor-parallel-size=2 \\\n  --kv-transfer-config \
         '{\"kv_connector\": \"OffloadingConnector\", \"kv_role\": \"kv_both\", \
         \"kv_connector_extra_config\": {\"cpu_bytes_to_use\": 107374182400}}'"
            .to_owned(),
    ]);
    let scripted = infer_pod(&scripted, &InferSpec::default());
    assert_eq!(
        scripted.instance.unwrap().engine.offload_connector,
        Some(connector)
    );
    assert_eq!(scripted.setup.pool, inferred.setup.pool);
    // vLLM's other switch for the same connector: --kv-offloading-size GiB.
    let sized = infer_pod(
        &guide_pod(&["--kv-offloading-size", "100"]),
        &InferSpec::default(),
    );
    assert_eq!(
        sized.instance.unwrap().engine.offload_connector,
        Some(connector)
    );
}

#[test]
fn other_connectors_leave_the_tier_off_and_the_pool_name_as_without_the_flag() {
    let plain = infer_pod(&guide_pod(&[]), &InferSpec::default());
    let offloading = infer_pod(
        &guide_pod(&["--kv-transfer-config", GUIDE_CONNECTOR]),
        &InferSpec::default(),
    );
    assert_eq!(plain.setup.pool, "qwen3-32b-h100-tp2");
    assert!(
        offloading.setup.pool.starts_with("qwen3-32b-h100-tp2-"),
        "{}",
        offloading.setup.pool
    );
    for other in [
        r#"{"kv_connector":"NixlConnector","kv_role":"kv_both"}"#,
        r#"{"kv_connector":"LMCacheConnectorV1","kv_role":"kv_both"}"#,
        r#"{"kv_connector":"MultiConnector","kv_role":"kv_both","kv_connector_extra_config":{"connectors":[{"kv_connector":"NixlConnector","kv_role":"kv_both"}]}}"#,
    ] {
        let inferred = infer_pod(
            &guide_pod(&["--kv-transfer-config", other]),
            &InferSpec::default(),
        );
        assert_eq!(inferred.setup.pool, plain.setup.pool, "{other}");
        assert_eq!(inferred.instance.unwrap().engine.offload_connector, None);
    }
    let lmcache = infer_pod(
        &guide_pod(&[
            "--kv-offloading-size",
            "100",
            "--kv-offloading-backend",
            "lmcache",
        ]),
        &InferSpec::default(),
    );
    assert_eq!(lmcache.setup.pool, plain.setup.pool);
    // A pod with engine args but no connector keeps the name it had before the connector
    // was read (the digest as main computed it for `--max-num-seqs 128`: a regression pin).
    let limited = infer_pod(
        &guide_pod(&["--max-num-seqs", "128"]),
        &InferSpec::default(),
    );
    assert_eq!(limited.setup.pool, LIMITED_POOL);
    let limited_nixl = infer_pod(
        &guide_pod(&[
            "--max-num-seqs",
            "128",
            "--kv-transfer-config",
            r#"{"kv_connector":"NixlConnector","kv_role":"kv_both"}"#,
        ]),
        &InferSpec::default(),
    );
    assert_eq!(limited_nixl.setup.pool, LIMITED_POOL);
}

#[test]
fn a_connector_vllm_would_refuse_holds_the_pod_naming_the_flag() {
    let inferred = infer_pod(
        &guide_pod(&[
            "--kv-transfer-config",
            r#"{"kv_connector":"OffloadingConnector","kv_role":"kv_both"}"#,
        ]),
        &InferSpec::default(),
    );
    let err = inferred.instance.unwrap_err();
    assert!(
        err.contains("--kv-transfer-config: kv_connector_extra_config.cpu_bytes_to_use"),
        "{err}"
    );
}

/// The pool name main gave a Qwen3-32B TP-2 H100 pod with `--max-num-seqs 128` before the
/// connector was read.
const LIMITED_POOL: &str = "qwen3-32b-h100-tp2-43c895";

#[test]
fn a_pool_that_sets_its_connector_wins_over_the_pod_s() {
    let explicit = InferSpec {
        explicit: vec!["engine.offload_connector".to_owned()],
    };
    for connector in [
        GUIDE_CONNECTOR,
        r#"{"kv_connector":"OffloadingConnector","kv_role":"kv_both"}"#,
    ] {
        let inferred = infer_pod(&guide_pod(&["--kv-transfer-config", connector]), &explicit);
        // The default pool has none.
        assert_eq!(inferred.instance.unwrap().engine.offload_connector, None);
    }
}
