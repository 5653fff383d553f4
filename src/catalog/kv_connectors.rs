//! KV-transfer links and connectors for prefill/decode disaggregation
//! (`data/kv_connectors.json`, sources in `data/PROVENANCE.md`).

use std::collections::BTreeMap;

use serde::Deserialize;
use thiserror::Error;

/// The embedded file.
static KV_CONNECTORS_JSON: &str = include_str!("../../data/kv_connectors.json");

/// A link or connector the catalog does not have, or a broken embedded file.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum KvCatalogError {
    /// No entry of this kind has this name.
    #[error("unknown {kind} `{name}`; known: {known}")]
    Unknown {
        /// `link` or `connector`.
        kind: &'static str,
        /// The name asked for.
        name: String,
        /// Comma-separated known names.
        known: String,
    },
    /// The embedded file does not parse or holds an unusable number.
    #[error("data/kv_connectors.json: {0}")]
    File(String),
}

/// A GPU-to-GPU path the KV travels over.
#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct KvLink {
    /// Per-direction bandwidth per GPU pair, GB/s (1e9 bytes per second).
    pub bandwidth_gb_s: f64,
    /// Where the number comes from.
    pub source: String,
}

/// A KV connector's per-transfer costs.
#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct KvConnector {
    /// Cost of one transfer descriptor (one per block, layer, K/V plane and rank), µs.
    pub descriptor_us: f64,
    /// Fixed cost of one request's transfer, µs.
    pub setup_us: u64,
    /// Where the numbers come from.
    pub source: String,
}

#[derive(Deserialize)]
struct File {
    links: BTreeMap<String, KvLink>,
    connectors: BTreeMap<String, KvConnector>,
}

fn file() -> Result<File, KvCatalogError> {
    let file: File = serde_json::from_str(KV_CONNECTORS_JSON)
        .map_err(|err| KvCatalogError::File(err.to_string()))?;
    let bad_link = file
        .links
        .iter()
        .find(|(_, l)| !(l.bandwidth_gb_s.is_finite() && l.bandwidth_gb_s > 0.0));
    let bad_connector = file
        .connectors
        .iter()
        .find(|(_, c)| !(c.descriptor_us.is_finite() && c.descriptor_us >= 0.0));
    if let Some((name, _)) = bad_link {
        return Err(KvCatalogError::File(format!("link {name}: bad bandwidth")));
    }
    if let Some((name, _)) = bad_connector {
        return Err(KvCatalogError::File(format!(
            "connector {name}: bad descriptor cost"
        )));
    }
    Ok(file)
}

fn lookup<T: Clone>(
    map: &BTreeMap<String, T>,
    kind: &'static str,
    name: &str,
) -> Result<T, KvCatalogError> {
    let key = name.trim().to_ascii_lowercase();
    map.get(&key)
        .cloned()
        .ok_or_else(|| KvCatalogError::Unknown {
            kind,
            name: name.to_owned(),
            known: map.keys().cloned().collect::<Vec<_>>().join(", "),
        })
}

/// The link named `name` (case-insensitive).
pub fn kv_link(name: &str) -> Result<KvLink, KvCatalogError> {
    lookup(&file()?.links, "link", name)
}

/// The connector named `name` (case-insensitive).
pub fn kv_connector(name: &str) -> Result<KvConnector, KvCatalogError> {
    lookup(&file()?.connectors, "connector", name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_entry_loads_and_unknown_names_list_the_known() {
        let file = file().unwrap();
        for name in file.links.keys() {
            assert!(kv_link(name).unwrap().bandwidth_gb_s > 0.0);
        }
        assert_eq!(kv_connector("NIXL").unwrap().setup_us, 3000);
        let err = kv_link("carrier-pigeon").unwrap_err().to_string();
        assert!(err.contains("rdma-400g") && err.contains("link"), "{err}");
    }
}
