//! The calibrated model's coefficients file: ditto's embedded fit
//! (`data/coefficients/ditto-calibrated.yaml`) and files written by `ditto calibrate`.
//!
//! Schema: `version: 1`, an optional free-text `provenance`, and `coefficients:` mapping
//! every name in [`COEFFICIENT_NAMES`] to a finite, non-negative number. Unknown or missing
//! names are errors that name the key, except the [`OPTIONAL_COEFFICIENTS`] added after
//! files were written: a file without one keeps the predictions it was fitted with.

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::sim::latency::CalibratedCoefficients;
use crate::sim::latency::calibrated::{COEFFICIENT_NAMES, COEFFICIENTS, OPTIONAL_COEFFICIENTS};

/// Why a coefficients file was rejected.
#[derive(Debug, thiserror::Error)]
pub enum CalibratedFileError {
    /// Not YAML of the expected shape.
    #[error("not a calibrated coefficients file: {0}")]
    Yaml(String),
    /// A coefficient is missing, unknown or out of range.
    #[error("coefficients.{name}: {problem}")]
    Coefficient {
        /// The key.
        name: String,
        /// What is wrong.
        problem: String,
    },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CalibratedFile {
    version: u32,
    #[serde(default)]
    #[allow(dead_code)]
    provenance: Option<String>,
    coefficients: BTreeMap<String, f64>,
}

/// Parses a coefficients file.
pub fn parse(text: &str) -> Result<CalibratedCoefficients, CalibratedFileError> {
    let file: CalibratedFile =
        serde_saphyr::from_str(text).map_err(|err| CalibratedFileError::Yaml(err.to_string()))?;
    if file.version != 1 {
        return Err(CalibratedFileError::Yaml(format!(
            "version {} is not supported (expected 1)",
            file.version
        )));
    }
    from_map(&file.coefficients)
}

/// Coefficients from a `coefficients:` map (every name in [`COEFFICIENT_NAMES`], finite and
/// non-negative): a file's, or one pasted into a cluster YAML pool.
pub fn from_map(
    coefficients: &BTreeMap<String, f64>,
) -> Result<CalibratedCoefficients, CalibratedFileError> {
    if let Some(name) = coefficients
        .keys()
        .find(|name| !COEFFICIENT_NAMES.contains(&name.as_str()))
    {
        return Err(CalibratedFileError::Coefficient {
            name: name.clone(),
            problem: format!("unknown; expected one of {}", COEFFICIENT_NAMES.join(", ")),
        });
    }
    let mut values = [0.0; COEFFICIENTS];
    for (slot, name) in values.iter_mut().zip(COEFFICIENT_NAMES) {
        let optional = OPTIONAL_COEFFICIENTS
            .iter()
            .find(|(optional, _)| *optional == name)
            .map(|(_, value)| *value);
        let value = *coefficients
            .get(name)
            .or(optional.as_ref())
            .ok_or_else(|| CalibratedFileError::Coefficient {
                name: name.to_string(),
                problem: "missing".into(),
            })?;
        if !(value.is_finite() && value >= 0.0) {
            return Err(CalibratedFileError::Coefficient {
                name: name.to_string(),
                problem: format!("must be finite and >= 0, got {value}"),
            });
        }
        *slot = value;
    }
    Ok(CalibratedCoefficients { values })
}

/// Writes `coefficients` in the file format, with `provenance` as free text.
pub fn render(coefficients: &CalibratedCoefficients, provenance: &str) -> String {
    let mut text = String::from(
        "# ditto calibrated step-time coefficients (see docs/fidelity.md)\nversion: 1\n",
    );
    text.push_str(&format!(
        "provenance: {}\n",
        serde_json::to_string(provenance).unwrap_or_else(|_| "\"\"".into())
    ));
    text.push_str("coefficients:\n");
    for (name, value) in COEFFICIENT_NAMES.iter().zip(coefficients.values) {
        text.push_str(&format!("  {name}: {value:.6}\n"));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_names_bad_keys() {
        let mut coefficients = CalibratedCoefficients::ROOFLINE;
        coefficients.values[0] = 1234.5;
        coefficients.values[crate::sim::latency::calibrated::idx::FIRST_TOKEN_STEPS] = 1.0;
        let text = render(&coefficients, "test \"fit\"");
        assert_eq!(parse(&text).unwrap(), coefficients);
        let err = parse(&text.replace("  kv: ", "  kvv: ")).unwrap_err();
        assert!(err.to_string().contains("coefficients.kvv"), "{err}");
        let err = parse(&text.replace("  kv: 1.000000\n", "")).unwrap_err();
        assert!(
            err.to_string().contains("coefficients.kv: missing"),
            "{err}"
        );
        let err = parse(&text.replace("  kv: 1.000000", "  kv: -1")).unwrap_err();
        assert!(err.to_string().contains(">= 0"), "{err}");
        assert!(parse("version: 2\ncoefficients: {}\n").is_err());
        // A file written before `allreduce_link` or `first_token_steps` existed still
        // parses, with the term off.
        let old = parse(
            &text
                .replace("  allreduce_link: 1.000000\n", "")
                .replace("  first_token_steps: 1.000000\n", ""),
        )
        .unwrap();
        assert_eq!(old.get("allreduce_link"), Some(0.0));
        assert_eq!(old.get("first_token_steps"), Some(0.0));
    }
}
