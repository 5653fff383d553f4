//! The GPU table: BLIS's `hardware_config.json` plus the GPUs ditto adds, parsed into
//! [`GpuSpec`]s and looked up by name.
//!
//! Owns the JSON schema of those files (`TFlopsPeak`, `TFlopsFP8`, `BwPeakTBs`,
//! `mfuPrefill`, `mfuDecode`, `MemoryGiB`; `_comment` and other keys are ignored), name
//! aliases and the "same GPU family" rule coefficient lookups use. Knows nothing about the
//! latency formulas.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::CatalogError;
use super::embedded::{
    ADDED_GPUS_JSON, ATTENTION_JSON, BLIS_GPUS_JSON, GEMM_JSON, HOST_LINK_JSON, INTERCONNECT_JSON,
};
use crate::sim::latency::GpuSpec;

/// Extra spellings accepted for a GPU name (lowercase alias, canonical name).
const ALIASES: [(&str, &str); 1] = [("a100", "A100-80")];

/// One entry of a hardware JSON file, as BLIS spells the keys.
#[derive(Deserialize)]
struct RawGpu {
    /// Dense BF16 TFLOPS.
    #[serde(rename = "TFlopsPeak")]
    tflops_peak: f64,
    /// Dense FP8 TFLOPS (0 or absent: no FP8 path).
    #[serde(rename = "TFlopsFP8", default)]
    tflops_fp8: f64,
    /// HBM TB/s.
    #[serde(rename = "BwPeakTBs")]
    bw_peak_tbs: f64,
    /// Prefill MFU.
    #[serde(rename = "mfuPrefill")]
    mfu_prefill: f64,
    /// Decode MFU.
    #[serde(rename = "mfuDecode")]
    mfu_decode: f64,
    /// Memory, GiB.
    #[serde(rename = "MemoryGiB")]
    memory_gib: f64,
}

/// Parses both embedded files into one table sorted by name (a name in both is an error),
/// with each GPU's interconnect bandwidth from `gpu_interconnect.json`, its attention
/// kernel's KV-read factor from `gpu_attention.json`, its GEMMs' weight-read factor from
/// `gpu_gemm.json` and its host-to-device bandwidth from `gpu_host_link.json` (a GPU
/// without an entry in any of them is an error too).
pub(crate) fn parse_embedded() -> Result<Vec<GpuSpec>, CatalogError> {
    let mut table = parse_tables()?;
    add_side_file(
        &mut table,
        "gpu_interconnect.json",
        INTERCONNECT_JSON,
        INTERCONNECT,
    )?;
    add_side_file(&mut table, "gpu_attention.json", ATTENTION_JSON, ATTENTION)?;
    add_side_file(&mut table, "gpu_gemm.json", GEMM_JSON, GEMM)?;
    add_side_file(&mut table, "gpu_host_link.json", HOST_LINK_JSON, HOST_LINK)?;
    Ok(table)
}

/// A per-GPU side file's field and the `GpuSpec` value it sets.
#[derive(Clone, Copy)]
struct SideField {
    /// The key each GPU's entry carries.
    name: &'static str,
    /// Stores a value in a GPU's spec.
    set: fn(&mut GpuSpec, f64),
}

/// `gpu_interconnect.json`: per-direction GPU-to-GPU bandwidth, GB/s.
const INTERCONNECT: SideField = SideField {
    name: "InterconnectGBs",
    set: |gpu, value| gpu.interconnect_gbs = value,
};

/// `gpu_attention.json`: the attention kernel's KV-read cost relative to Hopper's.
const ATTENTION: SideField = SideField {
    name: "KvReadFactor",
    set: |gpu, value| gpu.kv_read_factor = value,
};

/// `gpu_gemm.json`: the decode GEMMs' weight-streaming cost relative to Hopper's.
const GEMM: SideField = SideField {
    name: "WeightReadFactor",
    set: |gpu, value| gpu.weight_read_factor = value,
};

/// `gpu_host_link.json`: host-to-device bandwidth, GB/s (weights offloaded to the host).
const HOST_LINK: SideField = SideField {
    name: "HostLinkGBs",
    set: |gpu, value| gpu.host_link_gbs = value,
};

/// Sets `field` on every GPU of `table` from the side file `json` (name -> `{field: ..}`).
fn add_side_file(
    table: &mut [GpuSpec],
    file: &'static str,
    json: &str,
    field: SideField,
) -> Result<(), CatalogError> {
    let values = per_gpu_numbers(table, file, json, field.name)?;
    for (gpu, value) in table.iter_mut().zip(values) {
        (field.set)(gpu, value);
    }
    Ok(())
}

/// One finite positive number per GPU of `table`, in its order, from a side file of
/// name -> `{field: number, ...}` (names case-insensitive; keys starting with `_` are
/// comments). A GPU without an entry, an entry without such a `field`, and an entry for a
/// GPU the table does not have (a misspelling) or named twice are errors naming the GPU,
/// the field and the file.
fn per_gpu_numbers(
    table: &[GpuSpec],
    file: &'static str,
    json: &str,
    field: &'static str,
) -> Result<Vec<f64>, CatalogError> {
    let raw: BTreeMap<String, serde_json::Value> =
        serde_json::from_str(json).map_err(|source| CatalogError::GpuJson { file, source })?;
    let mut entries: BTreeMap<String, &serde_json::Value> = BTreeMap::new();
    for (name, entry) in raw.iter().filter(|(name, _)| !name.starts_with('_')) {
        let key = name.to_ascii_lowercase();
        let known = table.iter().any(|gpu| gpu.name.eq_ignore_ascii_case(name));
        if !known || entries.insert(key, entry).is_some() {
            return Err(CatalogError::InvalidGpuSpec {
                gpu: name.clone(),
                field,
                problem: format!("{file} names a GPU the hardware tables do not, or twice"),
            });
        }
    }
    table
        .iter()
        .map(|gpu| {
            let Some(entry) = entries.get(&gpu.name.to_ascii_lowercase()) else {
                return Err(invalid_spec(gpu, field, format!("missing from {file}")));
            };
            let Some(value) = entry.get(field).and_then(serde_json::Value::as_f64) else {
                return Err(invalid_spec(gpu, field, format!("not a number in {file}")));
            };
            if !(value.is_finite() && value > 0.0) {
                return Err(invalid_spec(
                    gpu,
                    field,
                    format!("must be finite and > 0, got {value}"),
                ));
            }
            Ok(value)
        })
        .collect()
}

/// Parses BLIS's file and ditto's additions into one table sorted by name.
fn parse_tables() -> Result<Vec<GpuSpec>, CatalogError> {
    let mut table = parse_file("hardware_config.json", BLIS_GPUS_JSON)?;
    for gpu in parse_file("hardware_config.added.json", ADDED_GPUS_JSON)? {
        if table
            .iter()
            .any(|known| known.name.eq_ignore_ascii_case(&gpu.name))
        {
            return Err(CatalogError::InvalidGpuSpec {
                gpu: gpu.name,
                field: "name",
                problem: "is defined twice".to_string(),
            });
        }
        table.push(gpu);
    }
    table.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(table)
}

/// Parses one hardware JSON file (an object of name -> entry) and validates every entry.
fn parse_file(file: &'static str, json: &str) -> Result<Vec<GpuSpec>, CatalogError> {
    let raw: BTreeMap<String, RawGpu> =
        serde_json::from_str(json).map_err(|source| CatalogError::GpuJson { file, source })?;
    let mut table = Vec::with_capacity(raw.len());
    for (name, entry) in raw {
        let gpu = GpuSpec {
            name,
            tflops_peak: entry.tflops_peak,
            tflops_fp8: entry.tflops_fp8,
            bw_peak_tbs: entry.bw_peak_tbs,
            mfu_prefill: entry.mfu_prefill,
            mfu_decode: entry.mfu_decode,
            memory_gib: entry.memory_gib,
            interconnect_gbs: 0.0,
            kv_read_factor: 1.0,
            weight_read_factor: 1.0,
            host_link_gbs: 0.0,
        };
        check(&gpu)?;
        table.push(gpu);
    }
    Ok(table)
}

/// Positive peaks and memory, MFUs in (0, 1], FP8 peak >= 0.
fn check(gpu: &GpuSpec) -> Result<(), CatalogError> {
    let positive = [
        ("TFlopsPeak", gpu.tflops_peak),
        ("BwPeakTBs", gpu.bw_peak_tbs),
        ("MemoryGiB", gpu.memory_gib),
    ];
    for (field, value) in positive {
        if !(value.is_finite() && value > 0.0) {
            return Err(invalid_spec(
                gpu,
                field,
                format!("must be finite and > 0, got {value}"),
            ));
        }
    }
    for (field, value) in [
        ("mfuPrefill", gpu.mfu_prefill),
        ("mfuDecode", gpu.mfu_decode),
    ] {
        if !(value > 0.0 && value <= 1.0) {
            return Err(invalid_spec(
                gpu,
                field,
                format!("must be in (0, 1], got {value}"),
            ));
        }
    }
    if !(gpu.tflops_fp8.is_finite() && gpu.tflops_fp8 >= 0.0) {
        let problem = format!("must be finite and >= 0, got {}", gpu.tflops_fp8);
        return Err(invalid_spec(gpu, "TFlopsFP8", problem));
    }
    Ok(())
}

/// Builds an `InvalidGpuSpec` error.
fn invalid_spec(gpu: &GpuSpec, field: &'static str, problem: String) -> CatalogError {
    CatalogError::InvalidGpuSpec {
        gpu: gpu.name.clone(),
        field,
        problem,
    }
}

/// Finds `name` in `table`: case-insensitive, then through [`ALIASES`].
pub(crate) fn find<'a>(table: &'a [GpuSpec], name: &str) -> Option<&'a GpuSpec> {
    let wanted = name.trim();
    let by_name = |wanted: &str| {
        table
            .iter()
            .find(|gpu| gpu.name.eq_ignore_ascii_case(wanted))
    };
    by_name(wanted).or_else(|| {
        let lower = wanted.to_ascii_lowercase();
        let (_, canonical) = ALIASES.iter().find(|(alias, _)| *alias == lower)?;
        by_name(canonical)
    })
}

/// Key under which coefficient files match GPUs: lowercase, with BLIS's A100 spellings
/// (`A100`, `A100-SXM`, `A100-80`: the same 80 GB SXM part) folded together.
pub(crate) fn family_key(name: &str) -> String {
    let lower = name.trim().to_ascii_lowercase();
    match lower.as_str() {
        "a100" | "a100-sxm" | "a100-80" => "a100-80".to_string(),
        _ => lower,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_table_parses_sorted_with_additions() {
        let table = parse_embedded().unwrap();
        let names: Vec<&str> = table.iter().map(|gpu| gpu.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "A100-80",
                "A100-PCIe",
                "A100-SXM",
                "B200",
                "H100",
                "H100-PCIe",
                "H200",
                "L4",
                "L40S"
            ]
        );
        let h100 = find(&table, "h100").unwrap();
        assert_eq!(h100.tflops_peak, 989.5);
        assert_eq!(h100.mfu_decode, 0.30);
        assert_eq!(find(&table, "A100").unwrap().name, "A100-80");
        assert!(find(&table, "TPU").is_none());
        // Every GPU has its link bandwidth; NVLink parts far above PCIe ones.
        assert_eq!(h100.interconnect_gbs, 450.0);
        assert!(table.iter().all(|gpu| gpu.interconnect_gbs > 0.0));
        assert!(
            find(&table, "A100").unwrap().interconnect_gbs
                > 5.0 * find(&table, "L40S").unwrap().interconnect_gbs
        );
        // A PCIe card: the same tensor peak as its SXM part, less HBM bandwidth, and its
        // all-reduce over PCIe (its NVLink bridge joins two GPUs only).
        let (sxm, pcie) = (
            find(&table, "A100").unwrap(),
            find(&table, "a100-pcie").unwrap(),
        );
        assert_eq!(pcie.tflops_peak, sxm.tflops_peak);
        assert!(pcie.bw_peak_tbs < sxm.bw_peak_tbs);
        assert!(sxm.interconnect_gbs > 5.0 * pcie.interconnect_gbs);
        let h100_pcie = find(&table, "H100-PCIe").unwrap();
        assert!(h100_pcie.tflops_peak < h100.tflops_peak);
        assert!(h100_pcie.interconnect_gbs < h100.interconnect_gbs / 5.0);
    }

    #[test]
    fn side_file_entries_are_required_positive_and_known() {
        for field in [INTERCONNECT, ATTENTION, GEMM, HOST_LINK] {
            let name = field.name;
            let mut table = parse_tables().unwrap();
            let only_h100 = format!(r#"{{"H100": {{"{name}": 1}}}}"#);
            let err = add_side_file(&mut table, "t.json", &only_h100, field)
                .unwrap_err()
                .to_string();
            assert!(err.contains(name) && err.contains("t.json"), "{err}");
            let zero = format!(r#"{{"A100-80": {{"{name}": 0}}}}"#);
            let err = add_side_file(&mut table[..1], "t.json", &zero, field)
                .unwrap_err()
                .to_string();
            assert!(err.contains("> 0"), "{err}");
            let misspelt = format!(r#"{{"A100-8O": {{"{name}": 2.5}}}}"#);
            let err = add_side_file(&mut table, "t.json", &misspelt, field)
                .unwrap_err()
                .to_string();
            assert!(err.contains("A100-8O") && err.contains("t.json"), "{err}");
        }
    }

    #[test]
    fn flash_attention_2_gpus_read_kv_dearer_than_hopper() {
        // Ampere and Ada run FlashAttention 2 (data/gpu_attention.json); Hopper the kernel
        // the coefficients were fitted with.
        let table = parse_embedded().unwrap();
        let factor = |name: &str| find(&table, name).unwrap().kv_read_factor;
        for hopper in ["H100", "H100-PCIe", "H200"] {
            assert_eq!(factor(hopper), 1.0, "{hopper}");
        }
        for fa2 in ["A100-80", "A100-SXM", "A100-PCIe", "L40S", "L4"] {
            assert_eq!(factor(fa2), 2.5, "{fa2}");
        }
    }

    #[test]
    fn ampere_streams_decode_weights_dearer_than_hopper() {
        // data/gpu_gemm.json: Vidur's A100 : H100 decode-GEMM fractions of peak bandwidth,
        // 1.10 on every A100; Hopper is the fit's reference, the rest unmeasured.
        let table = parse_embedded().unwrap();
        let factor = |name: &str| find(&table, name).unwrap().weight_read_factor;
        for a100 in ["A100-80", "A100-SXM", "A100-PCIe"] {
            assert_eq!(factor(a100), 1.10, "{a100}");
        }
        for other in ["H100", "H100-PCIe", "H200", "B200", "L40S", "L4"] {
            assert_eq!(factor(other), 1.0, "{other}");
        }
    }

    #[test]
    fn every_gpu_has_its_pcie_generations_host_link() {
        // data/gpu_host_link.json: Gen5 x16 (Hopper; B200 assumed) 35.2 GB/s, Gen4 x16
        // (Ampere, Ada) 25.
        let table = parse_embedded().unwrap();
        let link = |name: &str| find(&table, name).unwrap().host_link_gbs;
        for gen5 in ["H100", "H100-PCIe", "H200", "B200"] {
            assert_eq!(link(gen5), 35.2, "{gen5}");
        }
        for gen4 in ["A100-80", "A100-SXM", "A100-PCIe", "L40S", "L4"] {
            assert_eq!(link(gen4), 25.0, "{gen4}");
        }
    }

    #[test]
    fn family_key_folds_a100_spellings() {
        assert_eq!(family_key("A100-SXM"), family_key("a100"));
        assert_eq!(family_key("H100"), "h100");
    }

    #[test]
    fn bad_entries_are_rejected_with_the_field() {
        let json = r#"{"X": {"TFlopsPeak": 1, "BwPeakTBs": 1, "mfuPrefill": 1.5,
                              "mfuDecode": 0.1, "MemoryGiB": 1}}"#;
        let err = parse_file("test.json", json).unwrap_err().to_string();
        assert!(err.contains("mfuPrefill") && err.contains('X'), "{err}");
        let err = parse_file("test.json", r#"{"X": {}}"#)
            .unwrap_err()
            .to_string();
        assert!(err.contains("test.json"), "{err}");
    }
}
