//! Whether a pod's vLLM runs the native KV-offload connector, and the size of its CPU tier
//! (pure): vLLM 0.15.1's two ways to turn it on, read as vLLM reads them.
//!
//! - `--kv-transfer-config JSON` (`KVTransferConfig`, `config/kv_transfer.py`) with
//!   `"kv_connector": "OffloadingConnector"` and `kv_connector_extra_config.cpu_bytes_to_use`
//!   (`CPUOffloadingSpec`, `v1/kv_offload/cpu.py`: `int(cpu_bytes_to_use)`, refused when
//!   missing or zero). This is what llm-d's tiered-prefix-cache guide deploys. A
//!   `spec_name` other than `CPUOffloadingSpec` (a tier that is not host memory) and every
//!   other connector (NIXL, LMCache, a `MultiConnector` for P/D) leave the connector off: the
//!   engine models the CPU tier only.
//! - `--kv-offloading-size GiB` with `--kv-offloading-backend native` (the default):
//!   `VllmConfig._post_init_kv_transfer_config` makes it an `OffloadingConnector` with
//!   `cpu_bytes_to_use = GiB * 2^30`, over whatever `--kv-transfer-config` said; the
//!   `lmcache` backend makes it an LMCache connector instead (off here).

use serde_json::Value;

/// The connector class that carries vLLM's native CPU tier.
pub const OFFLOADING_CONNECTOR: &str = "OffloadingConnector";

/// The offloading spec whose tier is host memory (`spec_name`'s default).
const CPU_SPEC: &str = "CPUOffloadingSpec";

/// The `--kv-*` flags of one command line, as written (the last of a repeated flag).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KvOffloadFlags {
    /// `--kv-transfer-config`.
    pub transfer_config: Option<String>,
    /// `--kv-offloading-size` (GiB).
    pub offloading_size: Option<String>,
    /// `--kv-offloading-backend` (`native`, `lmcache`).
    pub offloading_backend: Option<String>,
}

impl KvOffloadFlags {
    /// The connector's `cpu_bytes_to_use`: `None` when the pod runs no native CPU-offload
    /// connector, an error naming the flag (and the JSON key) when vLLM would refuse the
    /// value.
    pub fn cpu_bytes(&self) -> Option<Result<u64, String>> {
        if let Some(size) = &self.offloading_size {
            let backend = self.offloading_backend.as_deref().map(str::trim);
            return match backend {
                None | Some("native") => Some(gib_bytes(size)),
                Some("lmcache") => None,
                Some(other) => Some(Err(format!(
                    "--kv-offloading-backend {other:?} is not native or lmcache"
                ))),
            };
        }
        transfer_config_bytes(self.transfer_config.as_deref()?)
    }
}

/// `--kv-offloading-size GiB` as bytes (vLLM: `size * (1 << 30)`, then `int()`).
fn gib_bytes(text: &str) -> Result<u64, String> {
    text.trim()
        .parse::<f64>()
        .ok()
        .map(|gib| gib * f64::from(1u32 << 30))
        .filter(|bytes| bytes.is_finite() && *bytes >= 1.0 && *bytes < u64::MAX as f64)
        .map(|bytes| bytes as u64)
        .ok_or_else(|| format!("--kv-offloading-size {text:?} is not a number of GiB > 0"))
}

/// The CPU tier bytes a `--kv-transfer-config` JSON gives the native connector.
fn transfer_config_bytes(json: &str) -> Option<Result<u64, String>> {
    let config: Value = match serde_json::from_str(json.trim()) {
        Ok(Value::Object(map)) => Value::Object(map),
        Ok(_) => return Some(Err("--kv-transfer-config: not a JSON object".to_owned())),
        Err(err) => return Some(Err(format!("--kv-transfer-config: not JSON: {err}"))),
    };
    if config.get("kv_connector").and_then(Value::as_str) != Some(OFFLOADING_CONNECTOR) {
        return None;
    }
    let extra = config.get("kv_connector_extra_config");
    let spec = extra
        .and_then(|extra| extra.get("spec_name"))
        .and_then(Value::as_str)
        .unwrap_or(CPU_SPEC);
    if spec != CPU_SPEC {
        return None;
    }
    let field = "--kv-transfer-config: kv_connector_extra_config.cpu_bytes_to_use";
    let Some(value) = extra.and_then(|extra| extra.get("cpu_bytes_to_use")) else {
        return Some(Err(format!(
            "{field}: missing (vLLM's OffloadingConnector needs it)"
        )));
    };
    Some(
        python_int(value)
            .filter(|bytes| *bytes > 0)
            .ok_or_else(|| format!("{field}: {value} is not a number of bytes > 0")),
    )
}

/// What Python's `int()` makes of a JSON value (an integer, a float truncated, a string of
/// digits), when it is a non-negative `u64`.
fn python_int(value: &Value) -> Option<u64> {
    match value {
        Value::Number(number) => number.as_u64().or_else(|| {
            number
                .as_f64()
                .filter(|f| f.is_finite() && *f >= 0.0 && *f < u64::MAX as f64)
                .map(|f| f as u64)
        }),
        Value::String(text) => text.trim().parse::<u64>().ok(),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn transfer(json: &str) -> Option<Result<u64, String>> {
        KvOffloadFlags {
            transfer_config: Some(json.to_owned()),
            ..KvOffloadFlags::default()
        }
        .cpu_bytes()
    }

    #[test]
    fn the_offloading_connector_s_cpu_bytes_are_read_in_every_form_python_accepts() {
        let json = |value: &str| {
            format!(
                r#"{{"kv_connector":"OffloadingConnector","kv_role":"kv_both",
                   "kv_connector_extra_config":{{"cpu_bytes_to_use":{value}}}}}"#
            )
        };
        assert_eq!(transfer(&json("107374182400")), Some(Ok(107_374_182_400)));
        assert_eq!(transfer(&json("1.5e9")), Some(Ok(1_500_000_000)));
        assert_eq!(transfer(&json(r#""4000000000""#)), Some(Ok(4_000_000_000)));
        let explicit_spec = r#"{"kv_connector":"OffloadingConnector","kv_role":"kv_both",
            "kv_connector_extra_config":{"spec_name":"CPUOffloadingSpec",
            "cpu_bytes_to_use":268435456,"offload_prompt_only":false}}"#;
        assert_eq!(transfer(explicit_spec), Some(Ok(268_435_456)));
    }

    #[test]
    fn other_connectors_and_other_tiers_leave_it_off() {
        for json in [
            r#"{"kv_connector":"NixlConnector","kv_role":"kv_both"}"#,
            r#"{"kv_connector":"LMCacheConnectorV1","kv_role":"kv_both",
                "kv_connector_extra_config":{"cpu_bytes_to_use":1000}}"#,
            r#"{"kv_connector":"MultiConnector","kv_role":"kv_both",
                "kv_connector_extra_config":{"connectors":[
                  {"kv_connector":"NixlConnector","kv_role":"kv_both"}]}}"#,
            r#"{"kv_connector":"OffloadingConnector","kv_role":"kv_both",
                "kv_connector_extra_config":{"spec_name":"SomeDiskSpec",
                "spec_module_path":"acme.disk","cpu_bytes_to_use":1000}}"#,
        ] {
            assert_eq!(transfer(json), None, "{json}");
        }
    }

    #[test]
    fn values_vllm_refuses_are_errors_naming_the_flag_and_key() {
        for (json, names) in [
            (
                r#"{"kv_connector":"OffloadingConnector","kv_role":"kv_both"}"#,
                "cpu_bytes_to_use: missing",
            ),
            (
                r#"{"kv_connector":"OffloadingConnector","kv_role":"kv_both",
                    "kv_connector_extra_config":{"cpu_bytes_to_use":0}}"#,
                "cpu_bytes_to_use: 0",
            ),
            (
                r#"{"kv_connector":"OffloadingConnector","kv_role":"kv_both",
                    "kv_connector_extra_config":{"cpu_bytes_to_use":"lots"}}"#,
                "cpu_bytes_to_use: \"lots\"",
            ),
            (r#"{"kv_connector":"OffloadingConnector""#, "not JSON"),
            ("[1, 2]", "not a JSON object"),
        ] {
            let err = transfer(json).unwrap().unwrap_err();
            assert!(err.starts_with("--kv-transfer-config"), "{err}");
            assert!(err.contains(names), "{err}");
        }
    }

    #[test]
    fn the_offloading_size_flag_wins_with_the_native_backend_only() {
        let flags = |size: &str, backend: Option<&str>| KvOffloadFlags {
            transfer_config: Some(
                r#"{"kv_connector":"NixlConnector","kv_role":"kv_both"}"#.to_owned(),
            ),
            offloading_size: Some(size.to_owned()),
            offloading_backend: backend.map(str::to_owned),
        };
        assert_eq!(flags("100", None).cpu_bytes(), Some(Ok(100 << 30)));
        assert_eq!(flags("0.5", Some("native")).cpu_bytes(), Some(Ok(1 << 29)));
        assert_eq!(flags("100", Some("lmcache")).cpu_bytes(), None);
        let err = flags("0", None).cpu_bytes().unwrap().unwrap_err();
        assert!(err.contains("--kv-offloading-size"), "{err}");
        let err = flags("8", Some("disk")).cpu_bytes().unwrap().unwrap_err();
        assert!(err.contains("--kv-offloading-backend"), "{err}");
    }
}
