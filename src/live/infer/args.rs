//! What a pod's spec says about the vLLM it runs (pure): the served model, the parallelism
//! and the engine limits from the container's command line (`vllm serve MODEL`, `--model`,
//! `--tensor-parallel-size`, `--max-num-seqs`, ...), its `nvidia.com/gpu` resources and the
//! node it runs on; and the catalog GPU a node's `nvidia.com/gpu.product` label (NVIDIA GPU
//! feature discovery) names.

use k8s_openapi::api::core::v1::{Container, Pod};

/// The engine limits a pod's command line sets (`None`: not given, vLLM's default applies).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EngineArgs {
    /// `--max-num-seqs`.
    pub max_num_seqs: Option<u32>,
    /// `--max-num-batched-tokens`.
    pub max_num_batched_tokens: Option<u32>,
    /// `--max-model-len`.
    pub max_model_len: Option<u32>,
    /// `--gpu-memory-utilization`, as written (parsed when the pool is built).
    pub gpu_memory_utilization: Option<String>,
    /// `--block-size`.
    pub block_size: Option<u32>,
    /// `--enable-chunked-prefill` / `--no-enable-chunked-prefill`.
    pub enable_chunked_prefill: Option<bool>,
    /// `--enable-prefix-caching` / `--no-enable-prefix-caching`.
    pub enable_prefix_caching: Option<bool>,
}

/// What one pod's spec says about its vLLM.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodFacts {
    /// The model vLLM loads (`vllm serve MODEL`, `--model MODEL`).
    pub model: Option<String>,
    /// `--tensor-parallel-size` / `-tp`.
    pub tp: Option<u32>,
    /// `--pipeline-parallel-size` / `-pp` times `--data-parallel-size` / `-dp` (GPUs per
    /// tensor-parallel group in the pod; 1 when not given).
    pub gpu_groups: u32,
    /// The container's `nvidia.com/gpu` limit (else request).
    pub gpus: Option<u32>,
    /// `spec.nodeName`.
    pub node: Option<String>,
    /// Engine limits.
    pub engine: EngineArgs,
    /// `--cpu-offload-gb`, as written (parsed when the pool is built): GiB of weights per GPU
    /// vLLM holds in host memory and reads over PCIe every step. Kept beside the engine
    /// limits so the pool names of pods without it keep their digest.
    pub cpu_offload_gb: Option<String>,
    /// `cpu_bytes_to_use` of vLLM's native KV-offload connector (`--kv-transfer-config`
    /// with `OffloadingConnector`, or `--kv-offloading-size`; see [`super::kv_offload`]),
    /// or why vLLM would refuse it; `None` without the connector. Kept beside the engine
    /// limits, as `cpu_offload_gb` is.
    pub kv_offload_cpu_bytes: Option<Result<u64, String>>,
}

/// The container that runs vLLM: the first whose command line mentions vLLM, else the first
/// that requests a GPU, else the first.
fn vllm_container(pod: &Pod) -> Option<&Container> {
    let containers = &pod.spec.as_ref()?.containers;
    containers
        .iter()
        .find(|c| tokens(c).iter().any(|t| t.contains("vllm")))
        .or_else(|| containers.iter().find(|c| gpu_count(c).is_some()))
        .or_else(|| containers.first())
}

/// The container's command and args as words: an element holding spaces is a `sh -c`
/// script, split as the shell splits words (quotes kept together and removed), unless it is
/// a JSON argument (starts with `{` or `[`), kept whole; any other element is one word,
/// unquoted.
fn tokens(container: &Container) -> Vec<String> {
    container
        .command
        .iter()
        .flatten()
        .chain(container.args.iter().flatten())
        .flat_map(|element| {
            let trimmed = element.trim();
            if trimmed.starts_with(['{', '[']) {
                vec![trimmed.to_owned()]
            } else if trimmed.contains(char::is_whitespace) {
                shell_words(trimmed)
            } else {
                vec![trimmed.trim_matches(|c| c == '\'' || c == '"').to_owned()]
            }
        })
        .collect()
}

/// A script's words as `sh` splits them: whitespace separates, `'...'` is literal, `"..."`
/// keeps spaces (a backslash escapes `"`, `\`, `$` and a backquote inside), a backslash
/// outside quotes escapes the next character (a backslash-newline joins lines). An
/// unclosed quote runs to the end.
fn shell_words(script: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word: Option<String> = None;
    let mut chars = script.chars();
    while let Some(c) = chars.next() {
        match c {
            c if c.is_whitespace() => {
                if let Some(done) = word.take() {
                    words.push(done);
                }
            }
            '\\' => match chars.next() {
                Some('\n') | None => {}
                Some(next) => word.get_or_insert_with(String::new).push(next),
            },
            '\'' => {
                let text = word.get_or_insert_with(String::new);
                for inner in chars.by_ref() {
                    if inner == '\'' {
                        break;
                    }
                    text.push(inner);
                }
            }
            '"' => {
                let text = word.get_or_insert_with(String::new);
                while let Some(inner) = chars.next() {
                    match inner {
                        '"' => break,
                        '\\' => match chars.next() {
                            Some(next @ ('"' | '\\' | '$' | '`')) => text.push(next),
                            Some('\n') | None => {}
                            Some(next) => {
                                text.push('\\');
                                text.push(next);
                            }
                        },
                        inner => text.push(inner),
                    }
                }
            }
            c => word.get_or_insert_with(String::new).push(c),
        }
    }
    words.extend(word);
    words
}

/// `nvidia.com/gpu` of the container's limits, else of its requests.
fn gpu_count(container: &Container) -> Option<u32> {
    let resources = container.resources.as_ref()?;
    [&resources.limits, &resources.requests]
        .into_iter()
        .flatten()
        .find_map(|map| map.get("nvidia.com/gpu"))
        .and_then(|quantity| quantity.0.trim().parse::<u32>().ok())
        .filter(|count| *count > 0)
}

/// Reads what a pod's spec says about its vLLM (nothing is fetched).
pub fn pod_facts(pod: &Pod) -> PodFacts {
    let node = pod
        .spec
        .as_ref()
        .and_then(|spec| spec.node_name.clone())
        .filter(|node| !node.is_empty());
    let Some(container) = vllm_container(pod) else {
        return PodFacts {
            gpu_groups: 1,
            node,
            ..PodFacts::default()
        };
    };
    let mut facts = parse_command_line(&tokens(container));
    facts.gpus = gpu_count(container);
    facts.node = node;
    facts
}

/// A flag's canonical spelling: vLLM's parser accepts `_` for `-` in long flags.
fn canonical(flag: &str) -> String {
    if flag.starts_with("--") {
        flag.replace('_', "-")
    } else {
        flag.to_owned()
    }
}

/// Reads a vLLM command line (`vllm serve MODEL --flag value ...`, `python -m
/// vllm.entrypoints.openai.api_server --model MODEL ...`); the last of a repeated flag wins,
/// as argparse does.
pub fn parse_command_line(words: &[String]) -> PodFacts {
    let mut facts = PodFacts {
        gpu_groups: 1,
        ..PodFacts::default()
    };
    let (mut pp, mut dp) = (1u32, 1u32);
    let mut kv = super::kv_offload::KvOffloadFlags::default();
    let mut index = 0;
    while index < words.len() {
        let word = &words[index];
        // `vllm serve MODEL`: the positional model right after `serve`.
        if word == "serve"
            && index > 0
            && words[index - 1].ends_with("vllm")
            && let Some(next) = words.get(index + 1).filter(|next| !next.starts_with('-'))
        {
            facts.model = Some(next.clone());
            index += 2;
            continue;
        }
        if !word.starts_with('-') {
            index += 1;
            continue;
        }
        let (flag, inline) = match word.split_once('=') {
            Some((flag, value)) => (canonical(flag), Some(value.to_owned())),
            None => (canonical(word), None),
        };
        let takes_value = !matches!(
            flag.as_str(),
            "--enable-chunked-prefill"
                | "--no-enable-chunked-prefill"
                | "--enable-prefix-caching"
                | "--no-enable-prefix-caching"
        );
        let value = match (&inline, takes_value) {
            (Some(value), _) => Some(value.clone()),
            (None, true) => words
                .get(index + 1)
                .filter(|next| !next.starts_with("--"))
                .cloned(),
            (None, false) => None,
        };
        let consumed = if inline.is_none() && takes_value && value.is_some() {
            2
        } else {
            1
        };
        let number = || value.as_deref().and_then(|v| v.trim().parse::<u32>().ok());
        let engine = &mut facts.engine;
        match flag.as_str() {
            "--model" => facts.model = value.clone().or(facts.model.take()),
            "--tensor-parallel-size" | "-tp" => facts.tp = number().filter(|n| *n > 0),
            "--pipeline-parallel-size" | "-pp" => pp = number().filter(|n| *n > 0).unwrap_or(1),
            "--data-parallel-size" | "-dp" => dp = number().filter(|n| *n > 0).unwrap_or(1),
            "--max-num-seqs" => engine.max_num_seqs = number(),
            "--max-num-batched-tokens" => engine.max_num_batched_tokens = number(),
            "--max-model-len" => engine.max_model_len = number(),
            "--block-size" => engine.block_size = number(),
            "--gpu-memory-utilization" => engine.gpu_memory_utilization = value.clone(),
            "--cpu-offload-gb" => facts.cpu_offload_gb = value.clone(),
            "--kv-transfer-config" => kv.transfer_config = value.clone(),
            "--kv-offloading-size" => kv.offloading_size = value.clone(),
            "--kv-offloading-backend" => kv.offloading_backend = value.clone(),
            "--enable-chunked-prefill" => {
                engine.enable_chunked_prefill = Some(inline.as_deref().is_none_or(truthy));
            }
            "--no-enable-chunked-prefill" => engine.enable_chunked_prefill = Some(false),
            "--enable-prefix-caching" => {
                engine.enable_prefix_caching = Some(inline.as_deref().is_none_or(truthy));
            }
            "--no-enable-prefix-caching" => engine.enable_prefix_caching = Some(false),
            _ => {}
        }
        index += consumed;
    }
    facts.gpu_groups = pp.saturating_mul(dp).max(1);
    facts.kv_offload_cpu_bytes = kv.cpu_bytes();
    facts
}

fn truthy(value: &str) -> bool {
    matches!(
        value.trim().to_ascii_lowercase().as_str(),
        "1" | "true" | "yes"
    )
}

/// The catalog GPU that a node's `nvidia.com/gpu.product` label names (GPU feature
/// discovery: `NVIDIA-H100-80GB-HBM3`, `NVIDIA-A100-SXM4-80GB`, `NVIDIA-L40S`, with an
/// optional `-SHARED` suffix under time-slicing); `None` for a GPU the catalog does not have
/// (an A100 40 GB, an H100 NVL, a MIG slice, ...).
pub fn gpu_from_product(product: &str) -> Option<&'static str> {
    let lower = product.trim().to_ascii_lowercase();
    let name = lower.strip_prefix("nvidia-").unwrap_or(&lower);
    let name = name.strip_suffix("-shared").unwrap_or(name);
    if name.contains("mig") {
        return None;
    }
    let words: Vec<&str> = name.split(['-', ' ', '_']).collect();
    let has = |word: &str| words.contains(&word);
    match words.first().copied()? {
        "h200" => Some("H200"),
        "b200" => Some("B200"),
        "h100" if has("nvl") => None,
        "h100" if has("pcie") => Some("H100-PCIe"),
        "h100" => Some("H100"),
        "a100" if has("40gb") => None,
        "a100" if has("pcie") => Some("A100-PCIe"),
        "a100" => Some("A100-80"),
        "l40s" => Some("L40S"),
        "l4" => Some("L4"),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(line: &str) -> Vec<String> {
        line.split_whitespace().map(str::to_owned).collect()
    }

    #[test]
    fn reads_vllm_serve_and_its_flags() {
        let facts = parse_command_line(&words(
            "vllm serve Qwen/Qwen3-32B --port 8200 -tp 2 --max-num-seqs 128 \
             --max_num_batched_tokens=4096 --max-model-len 16384 --gpu-memory-utilization 0.85 \
             --block-size 32 --no-enable-prefix-caching --enable-chunked-prefill",
        ));
        assert_eq!(facts.model.as_deref(), Some("Qwen/Qwen3-32B"));
        assert_eq!(facts.tp, Some(2));
        assert_eq!(facts.gpu_groups, 1);
        assert_eq!(
            facts.engine,
            EngineArgs {
                max_num_seqs: Some(128),
                max_num_batched_tokens: Some(4096),
                max_model_len: Some(16384),
                gpu_memory_utilization: Some("0.85".to_owned()),
                block_size: Some(32),
                enable_chunked_prefill: Some(true),
                enable_prefix_caching: Some(false),
            }
        );
    }

    #[test]
    fn reads_the_api_server_module_form_and_parallelism() {
        let facts = parse_command_line(&words(
            "python3 -m vllm.entrypoints.openai.api_server --model=/models/Llama-3.1-8B \
             --tensor-parallel-size 4 --data-parallel-size 2 --enable-chunked-prefill=false",
        ));
        assert_eq!(facts.model.as_deref(), Some("/models/Llama-3.1-8B"));
        assert_eq!((facts.tp, facts.gpu_groups), (Some(4), 2));
        assert_eq!(facts.engine.enable_chunked_prefill, Some(false));
        let none = parse_command_line(&words("vllm serve --port 8000"));
        assert_eq!((none.model, none.tp), (None, None));
    }

    #[test]
    fn reads_a_pod_json_with_a_shell_script_and_gpu_limits() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns"},
            "spec": {"nodeName": "gpu-node-1", "containers": [
                {"name": "proxy", "image": "routing-sidecar", "args": ["--port=8000"]},
                {"name": "vllm", "image": "vllm/vllm-openai",
                 "command": ["/bin/sh", "-c"],
                 "args": ["exec vllm serve 'Qwen/Qwen3-32B' --port 8200 --max-num-seqs 64"],
                 "resources": {"limits": {"nvidia.com/gpu": "2"},
                               "requests": {"nvidia.com/gpu": "2"}}}]}
        }))
        .unwrap();
        let facts = pod_facts(&pod);
        assert_eq!(facts.model.as_deref(), Some("Qwen/Qwen3-32B"));
        assert_eq!(facts.tp, None);
        assert_eq!(facts.gpus, Some(2));
        assert_eq!(facts.node.as_deref(), Some("gpu-node-1"));
        assert_eq!(facts.engine.max_num_seqs, Some(64));
    }

    #[test]
    fn scripts_are_split_into_words_as_the_shell_splits_them() {
        assert_eq!(
            shell_words(
                "exec vllm serve \"my model\" --a='{\"k\": 1}' \\\n --b \"x\\\"y\" c\\ d 'open"
            ),
            words("exec vllm serve")
                .into_iter()
                .chain(
                    ["my model", "--a={\"k\": 1}", "--b", "x\"y", "c d", "open"].map(String::from)
                )
                .collect::<Vec<_>>()
        );
    }

    #[test]
    fn maps_gpu_feature_discovery_products_to_catalog_gpus() {
        for (product, gpu) in [
            ("NVIDIA-H100-80GB-HBM3", Some("H100")),
            ("NVIDIA-H100-80GB-HBM3-SHARED", Some("H100")),
            ("NVIDIA-H100-PCIe", Some("H100-PCIe")),
            ("NVIDIA-H100-NVL", None),
            ("NVIDIA-H200", Some("H200")),
            ("NVIDIA-H200-141GB-HBM3e", Some("H200")),
            ("NVIDIA-B200", Some("B200")),
            ("NVIDIA-A100-SXM4-80GB", Some("A100-80")),
            ("NVIDIA-A100-80GB-PCIe", Some("A100-PCIe")),
            ("NVIDIA-A100-SXM4-40GB", None),
            ("NVIDIA-A100-SXM4-40GB-MIG-1g.5gb", None),
            ("NVIDIA-L40S", Some("L40S")),
            ("NVIDIA-L4", Some("L4")),
            ("NVIDIA-L40", None),
            ("Tesla-T4", None),
        ] {
            assert_eq!(gpu_from_product(product), gpu, "{product}");
            if let Some(gpu) = gpu {
                assert!(crate::catalog::gpu(gpu).is_ok(), "{gpu} is a catalog GPU");
            }
        }
    }
}
