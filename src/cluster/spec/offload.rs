//! A pool's `engine.offload_connector:` map: vLLM's native KV-offload connector
//! (`--kv-transfer-config '{"kv_connector":"OffloadingConnector",
//! "kv_connector_extra_config":{"cpu_bytes_to_use":N}}'`), its CPU tier sized in bytes as
//! vLLM sizes it, with optional overrides of the host-time prices the engine charges
//! ([`crate::sim::OffloadConnector`]). Errors name the field path. See docs/cluster.md.

use serde::Deserialize;

use super::{ClusterSpecError, EngineSpec, invalid};
use crate::sim::OffloadConnector;
use crate::sim::latency::ModelArch;

/// vLLM's `OffloadingConnector` as a pool gives it (keys as in its
/// `kv_connector_extra_config`, plus the engine's two prices).
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct OffloadConnectorSpec {
    /// `cpu_bytes_to_use`: bytes of host memory for the CPU tier, summed over the TP ranks
    /// (vLLM's `CPUOffloadingSpec` divides it by one block's KV over all layers and ranks).
    pub cpu_bytes_to_use: u64,
    /// Host time per tier entry a store's eviction walk visits, ns (default
    /// [`OffloadConnector::DEFAULT_WALK_NS_PER_ENTRY`]).
    #[serde(default)]
    pub walk_ns_per_entry: Option<f64>,
    /// Host time per failed store beyond its walk, ns (default
    /// [`OffloadConnector::DEFAULT_FAILED_STORE_NS`]).
    #[serde(default)]
    pub failed_store_ns: Option<f64>,
    /// The scheduler's other host time per scheduled request, ns (default
    /// [`OffloadConnector::DEFAULT_SCHEDULER_NS_PER_REQUEST`]).
    #[serde(default)]
    pub scheduler_ns_per_request: Option<f64>,
}

impl OffloadConnectorSpec {
    /// A connector of `cpu_bytes_to_use` bytes at the default prices.
    pub fn of_bytes(cpu_bytes_to_use: u64) -> Self {
        OffloadConnectorSpec {
            cpu_bytes_to_use,
            ..OffloadConnectorSpec::default()
        }
    }
}

/// The engine's connector of a pool's `engine` map (`path`: the map's field path), if it
/// has one.
pub(super) fn connector(
    engine: &EngineSpec,
    geometry: (&ModelArch, u32, u32),
    path: &str,
) -> Result<Option<OffloadConnector>, ClusterSpecError> {
    let path = format!("{path}.offload_connector");
    engine
        .offload_connector
        .as_ref()
        .map(|spec| resolve_offload_connector(spec, geometry, &path))
        .transpose()
}

/// The engine's connector for `spec` on `tp` ranks of `arch` at `block_size` tokens a
/// block; `path` is the map's field path (`pools[0].engine.offload_connector`).
pub fn resolve_offload_connector(
    spec: &OffloadConnectorSpec,
    (arch, tp, block_size): (&ModelArch, u32, u32),
    path: &str,
) -> Result<OffloadConnector, ClusterSpecError> {
    if spec.cpu_bytes_to_use == 0 {
        // vLLM refuses a missing or zero `cpu_bytes_to_use` ("must be specified").
        return Err(invalid(
            format!("{path}.cpu_bytes_to_use"),
            "must be at least 1 byte (vLLM needs it to size the CPU tier)",
        ));
    }
    let mut connector = OffloadConnector::of_bytes(spec.cpu_bytes_to_use, arch, tp, block_size);
    // The prices given replace the defaults; `validate` checks them and names the field.
    if let Some(ns) = spec.walk_ns_per_entry {
        connector.walk_ns_per_entry = ns;
    }
    if let Some(ns) = spec.failed_store_ns {
        connector.failed_store_ns = ns;
    }
    if let Some(ns) = spec.scheduler_ns_per_request {
        connector.scheduler_ns_per_request = ns;
    }
    connector.validate().map_err(|err| {
        let field = err
            .field
            .strip_prefix("offload_connector.")
            .unwrap_or(err.field);
        invalid(format!("{path}.{field}"), err.reason)
    })?;
    Ok(connector)
}

#[cfg(test)]
mod tests {
    use super::super::{ClusterSpecError, parse_cluster_yaml};
    use crate::sim::OffloadConnector;

    /// Llama-3.1-8B's KV bytes of one 16-token block summed over layers and ranks, from its
    /// config.json: K and V, bf16, every layer, every KV head (split over the ranks, summed
    /// back), as `CPUOffloadingSpec` counts it.
    fn llama_8b_block_bytes() -> u64 {
        let config: serde_json::Value = serde_json::from_str(include_str!(
            "../../../data/model_configs/llama-3.1-8b-instruct/config.json"
        ))
        .unwrap_or_default();
        let field = |name: &str| config[name].as_u64().unwrap_or(0);
        let head_dim = field("hidden_size") / field("num_attention_heads");
        2 * field("num_hidden_layers") * field("num_key_value_heads") * head_dim * 2 * 16
    }

    fn cluster(engine: &str) -> Result<crate::cluster::config::ClusterConfig, ClusterSpecError> {
        parse_cluster_yaml(&format!(
            "pools:\n  - name: a\n    replicas: 2\n    model: llama-3.1-8b-instruct\n    \
             tp: 2\n    engine:\n{engine}"
        ))
    }

    #[test]
    fn a_pool_s_connector_is_sized_as_vllm_sizes_its_cpu_tier() {
        // llm-d's tiered-prefix-cache guide gives its TP-2 decode pods 100 GiB.
        let config = cluster("      offload_connector:\n        cpu_bytes_to_use: 107374182400\n")
            .unwrap_or_else(|err| panic!("{err}"));
        let block = llama_8b_block_bytes();
        assert!(block > 0);
        for instance in &config.instances {
            let Some(connector) = instance.engine.offload_connector else {
                panic!("{} has no connector", instance.id);
            };
            assert_eq!(u64::from(connector.cpu_blocks), 107_374_182_400 / block);
            assert_eq!(
                connector.walk_ns_per_entry,
                OffloadConnector::DEFAULT_WALK_NS_PER_ENTRY
            );
            assert_eq!(
                connector.failed_store_ns,
                OffloadConnector::DEFAULT_FAILED_STORE_NS
            );
            assert_eq!(
                connector.scheduler_ns_per_request,
                OffloadConnector::DEFAULT_SCHEDULER_NS_PER_REQUEST
            );
        }
        let plain = cluster("      max_num_seqs: 64\n").unwrap_or_else(|err| panic!("{err}"));
        assert_eq!(plain.instances[0].engine.offload_connector, None);
    }

    #[test]
    fn the_prices_can_be_overridden_and_a_tiny_tier_keeps_one_block() {
        let config = cluster(
            "      offload_connector: {cpu_bytes_to_use: 1, walk_ns_per_entry: 250, \
             failed_store_ns: 5000}\n",
        )
        .unwrap_or_else(|err| panic!("{err}"));
        let connector = config.instances[0].engine.offload_connector;
        assert_eq!(
            connector.map(|c| (c.cpu_blocks, c.walk_ns_per_entry, c.failed_store_ns)),
            Some((1, 250.0, 5000.0))
        );
    }

    #[test]
    fn bad_connectors_are_refused_naming_the_field_path() {
        let path = "pools[0].engine.offload_connector";
        for (engine, field) in [
            ("{cpu_bytes_to_use: 0}", format!("{path}.cpu_bytes_to_use")),
            (
                "{cpu_bytes_to_use: 8, walk_ns_per_entry: -1}",
                format!("{path}.walk_ns_per_entry"),
            ),
            (
                "{cpu_bytes_to_use: 8, failed_store_ns: 2e9}",
                format!("{path}.failed_store_ns"),
            ),
        ] {
            match cluster(&format!("      offload_connector: {engine}\n")) {
                Err(ClusterSpecError::Invalid { field: got, .. }) => assert_eq!(got, field),
                other => panic!("{engine}: {other:?}"),
            }
        }
        for (engine, names) in [
            ("{num_cpu_blocks: 8}", "num_cpu_blocks"),
            ("{walk_ns_per_entry: 8}", "cpu_bytes_to_use"),
            ("{cpu_bytes_to_use: -5}", "cpu_bytes_to_use"),
        ] {
            match cluster(&format!("      offload_connector: {engine}\n")) {
                Err(ClusterSpecError::Yaml(text)) => assert!(text.contains(names), "{text}"),
                other => panic!("{engine}: {other:?}"),
            }
        }
    }
}
