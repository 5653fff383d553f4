"""vLLM's KV-offload connector discovered from the pods' command lines (`--inference-pool`
with no `--config`, as test_model_inference.py): the stand-in Kubernetes API serves pods
whose vLLM args are those of llm-d's tiered-prefix-cache guide
(llm-d/llm-d `guides/tiered-prefix-cache/modelserver/gpu/vllm/native/cpu/base/patch-vllm.yaml`:
`--tensor-parallel-size=2 --kv-transfer-config '{"kv_connector":"OffloadingConnector",
"kv_role":"kv_both","kv_connector_extra_config":{"cpu_bytes_to_use":107374182400}}'`), one
with a NIXL connector instead, and one whose connector JSON vLLM would refuse.

The offloading pod must be simulated with the tier vLLM sizes (GetSnapshot echoes it as its
whole blocks in bytes: one 16-token Qwen3-32B block is 4 MiB of K and V in bf16 over 64 layers
of 8 KV heads of 128, worked out here), in a pool of its own; the NIXL pod without a tier, in
the pool a pod without the flag has; the refused one stale with a reason naming the flag.
"""


from test_live import eventually
from test_model_inference import MODEL, cluster, config_of, vllm_container  # noqa: F401

GUIDE_TIER = 107374182400
GUIDE_CONNECTOR = ('{"kv_connector":"OffloadingConnector","kv_role":"kv_both",'
                   '"kv_connector_extra_config":{"cpu_bytes_to_use":%d}}' % GUIDE_TIER)
NIXL = '{"kv_connector":"NixlConnector","kv_role":"kv_both"}'
QWEN3_32B_BLOCK_BYTES = 2 * 64 * 8 * 128 * 2 * 16


def test_the_guides_offloading_pod_gets_its_tier_and_other_connectors_none(cluster):  # noqa: F811
    api, pod, serve, model_dir = cluster
    pod("offload-0", MODEL,
        vllm_container([MODEL, "--tensor-parallel-size=2", "--kv-transfer-config", GUIDE_CONNECTOR],
                       gpus=2), node="h100-node-1")
    pod("nixl-0", MODEL,
        vllm_container([MODEL, "--tensor-parallel-size=2", f"--kv-transfer-config={NIXL}"], gpus=2),
        node="h100-node-1")
    pod("refused-0", MODEL,
        vllm_container([MODEL, "--tensor-parallel-size=2", "--kv-transfer-config",
                        '{"kv_connector":"OffloadingConnector","kv_role":"kv_both"}'], gpus=2),
        node="h100-node-1")
    server = serve("--model-dir", str(model_dir))
    ids = ["llm-d/nixl-0", "llm-d/offload-0", "llm-d/refused-0"]
    found = eventually(
        server,
        lambda i: sorted(i) == ids
        and i["llm-d/offload-0"].HasField("inferred") and not i["llm-d/offload-0"].stale_reason
        and i["llm-d/nixl-0"].HasField("inferred") and not i["llm-d/nixl-0"].stale_reason
        and i["llm-d/refused-0"].stale_reason and i,
        "the pods inferred")
    offload, nixl = config_of(server, "llm-d/offload-0"), config_of(server, "llm-d/nixl-0")
    assert (offload.model, offload.gpu, offload.tp) == (MODEL, "H100", 2), offload
    expected = GUIDE_TIER // QWEN3_32B_BLOCK_BYTES * QWEN3_32B_BLOCK_BYTES
    assert offload.engine.kv_offload_cpu_bytes == expected, offload.engine
    assert not nixl.engine.HasField("kv_offload_cpu_bytes"), nixl.engine
    offload_pool = found["llm-d/offload-0"].inferred.pool
    nixl_pool = found["llm-d/nixl-0"].inferred.pool
    assert nixl_pool == "qwen3-32b-support-h100-tp2", nixl_pool
    assert offload_pool.startswith(nixl_pool + "-"), offload_pool
    reason = found["llm-d/refused-0"].stale_reason
    assert "--kv-transfer-config: kv_connector_extra_config.cpu_bytes_to_use" in reason, reason
