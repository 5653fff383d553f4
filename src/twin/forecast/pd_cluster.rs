//! The disaggregated cluster a P/D forecast candidate runs as: whether a question's variants
//! are a P/D pool, and its candidate built from idle instances (llm-d's P/D defaults).

use crate::catalog;
use crate::cluster::Cluster;
use crate::cluster::config::{ClusterConfig, InstanceConfig, InstanceRole};
use crate::cluster::disagg::InstanceKv;
use crate::cluster::spec::{DisaggSpec, resolve_disaggregation};

use crate::twin::error::TwinError;
use crate::twin::snapshot::MirrorSnapshot;

/// True when any template serves one role only: the candidates run disaggregated.
pub(super) fn is_disaggregated(snapshot: &MirrorSnapshot, templates: &[usize]) -> bool {
    templates
        .iter()
        .any(|&t| snapshot.config.instances[t].role != InstanceRole::Both)
}

/// A candidate's disaggregated cluster from idle instances: `counts[v]` copies of variant
/// `v`'s template, with llm-d's P/D defaults.
pub(super) fn idle_cluster(
    snapshot: &MirrorSnapshot,
    templates: &[usize],
    counts: &[u32],
    seed: u64,
) -> Result<Cluster, TwinError> {
    let mut instances: Vec<InstanceConfig> = Vec::new();
    let mut kv = Vec::new();
    for (variant, (&template, &count)) in templates.iter().zip(counts).enumerate() {
        let template = &snapshot.config.instances[template];
        let geometry = instance_kv(template)
            .map_err(|reason| TwinError::invalid(format!("variants[{variant}]"), reason))?;
        for k in 0..count {
            let mut config = template.clone();
            config.id = format!("{}#{k}", template.id);
            config.engine.kv_sample_interval_us = 0;
            instances.push(config);
            kv.push(geometry);
        }
    }
    let disagg = resolve_disaggregation(&DisaggSpec::default(), kv)
        .map_err(|err| TwinError::invalid("variants", err.to_string()))?;
    let config = ClusterConfig {
        instances,
        routing: snapshot.config.routing.clone(),
        admission: snapshot.config.admission,
        staleness: snapshot.config.staleness,
    };
    Cluster::new_disaggregated(config, disagg, seed)
        .map_err(|err| TwinError::invalid("variants", err.to_string()))
}

/// An instance's KV geometry for the transfer model, from its model's architecture.
fn instance_kv(instance: &InstanceConfig) -> Result<InstanceKv, String> {
    let arch = match &instance.model_config_json {
        Some(json) => catalog::parse_model_config(&instance.model, json),
        None => catalog::model(&instance.model),
    }
    .map_err(|err| err.to_string())?;
    Ok(InstanceKv {
        bytes_per_token_per_rank: arch.kv_bytes_per_token(instance.tp),
        layers: arch.num_layers,
        planes: if arch.is_mla() { 1 } else { 2 },
        tp: instance.tp,
        block_size: instance.engine.block_size,
    })
}
