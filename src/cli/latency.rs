//! Resolving `--latency-model`: a model name, or a coefficients file written by
//! `ditto calibrate`.

use std::path::Path;

use crate::catalog;
use crate::cli::CliError;
use crate::sim::latency::{GpuSpec, LatencyKind, LatencyModel, ModelArch};

/// Builds the latency model `spec` names (`calibrated`, `physics`, `roofline`, `blackbox`)
/// or loads (a path to a coefficients YAML) for `arch` on `gpu` at `tp`.
pub fn resolve_latency(
    spec: &str,
    arch: &ModelArch,
    gpu: &GpuSpec,
    tp: u32,
) -> Result<LatencyModel, CliError> {
    if let Some(kind) = LatencyKind::parse(spec) {
        return Ok(catalog::latency_model(kind, arch, gpu, tp)?);
    }
    let path = Path::new(spec);
    if path.is_file() {
        let text = std::fs::read_to_string(path).map_err(|source| CliError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let coefficients = catalog::parse_calibrated(&text).map_err(|err| CliError::BadFile {
            path: path.to_path_buf(),
            reason: err.to_string(),
        })?;
        return Ok(catalog::calibrated_model(arch, gpu, tp, coefficients)?);
    }
    Err(CliError::flag(
        "latency-model",
        format!(
            "unknown model {spec:?}; expected calibrated, physics, roofline, blackbox or a coefficients file"
        ),
    ))
}
