//! How a measured server was deployed, beyond its model and GPU: the data-parallel degree
//! (from the error records' `dp`, or the dataset's run names) and the weights' recorded
//! precision. Also the one reader of the published run names
//! (`<gpu or id>-<model…>-tp<T>-<workload…>[-<T>[-<D>]]`), which leave-one-out grouping
//! shares. Text in, no I/O.

use super::FidelityError;
use super::bad_file;
use crate::sim::latency::ModelArch;

/// The most data-parallel replicas a run may declare (a bound on what one replay builds).
pub const MAX_DATA_PARALLEL: u32 = 64;

/// A published run name split into its parts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunName {
    /// The parts between the first (the GPU, or the dataset's id) and `tp<T>`, joined with
    /// `-`; `None` when there are none.
    pub model: Option<String>,
    /// `T` of the `tp<T>` part.
    pub tp: u32,
    /// The parts after `tp<T>`, without a trailing `-<T>` or `-<T>-<D>` (the dataset's
    /// pipeline appends its TP and data-parallel degree); `None` when there are none.
    pub workload: Option<String>,
    /// `D` of a trailing `-<T>-<D>`.
    pub dp: Option<u32>,
}

/// Splits `name` at its first `tp<T>` part (`None` without one).
pub fn parse_run_name(name: &str) -> Option<RunName> {
    let parts: Vec<&str> = name.split('-').collect();
    let numeric = |p: &str| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit());
    let at = parts
        .iter()
        .position(|p| p.strip_prefix("tp").is_some_and(numeric))?;
    let degree = &parts[at][2..];
    let tp = degree.parse().ok()?;
    let (workload, dp): (&[&str], Option<u32>) = match &parts[at + 1..] {
        [rest @ .., t, d] if !rest.is_empty() && *t == degree && numeric(d) => {
            (rest, d.parse().ok())
        }
        [rest @ .., t] if !rest.is_empty() && *t == degree => (rest, None),
        all => (all, None),
    };
    let joined = |p: &[&str]| (!p.is_empty()).then(|| p.join("-"));
    Some(RunName {
        model: joined(parts.get(1..at).unwrap_or_default()),
        tp,
        workload: joined(workload),
        dp,
    })
}

/// The data-parallel degree a run's name records, when it keeps the dataset's
/// `<id>-<model>-tp<T>-<workload>-<T>-<D>` form (the pipeline's TP-DP suffix, e.g.
/// `35-llama-2-7b-hf-tp1-general-1-2`): `D`, when the name's `T` is the run's TP, a
/// workload comes before the suffix and `D` is 1 to [`MAX_DATA_PARALLEL`]; else `None`.
pub fn dp_from_name(name: &str, tp: u32) -> Option<u32> {
    let run = parse_run_name(name).filter(|run| run.tp == tp && run.workload.is_some())?;
    run.dp.filter(|dp| (1..=MAX_DATA_PARALLEL).contains(dp))
}

/// Applies a recorded weight precision to `arch`. `FP16`/`BF16` (the checkpoints' own
/// width) change nothing; `FP8` sets 1-byte weights unless the model's config already
/// declares a quantization (an FP8 checkpoint says so itself). On a GPU with FP8 tensor
/// cores the GEMMs then run at the FP8 peak (W8A8); on one without (A100) at the 16-bit
/// peak with the weights read at one byte (vLLM's weight-only FP8 there).
pub fn apply_precision(arch: &mut ModelArch, precision: &str) -> Result<(), FidelityError> {
    match precision.trim().to_ascii_uppercase().as_str() {
        "FP16" | "BF16" | "BFLOAT16" | "FLOAT16" | "AUTO" => Ok(()),
        "FP8" => {
            if arch.weight_bytes_per_param == 0.0 {
                arch.weight_bytes_per_param = 1.0;
            }
            Ok(())
        }
        _ => Err(bad_file(
            "s2r_error_records.csv",
            format!("precision `{precision}`: expected FP16, BF16 or FP8"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::{RunName, dp_from_name, parse_run_name};

    #[test]
    fn the_tp_dp_suffix_of_a_run_name_gives_its_data_parallel_degree() {
        assert_eq!(dp_from_name("35-llama-2-7b-hf-tp1-general-1-2", 1), Some(2));
        assert_eq!(
            dp_from_name("34-llama-4-scout-17b-16e-tp2-general-2-4", 2),
            Some(4)
        );
        assert_eq!(
            dp_from_name("38-llama-3-1-8b-tp1-general-lite-1-1", 1),
            Some(1)
        );
        // The older forms (no suffix, or TP only) and our own names record none.
        assert_eq!(dp_from_name("13-qwen3-14b-tp1-general-1", 1), None);
        assert_eq!(dp_from_name("9-mixtral-8x7b-tp2-general", 2), None);
        assert_eq!(dp_from_name("a100-llama3.1-8b-tp1-general-lite", 1), None);
        // A time stamp or a count is not a replica count.
        assert_eq!(dp_from_name("x-tp1-codegen-1-155451", 1), None);
        // A suffix whose TP is not the run's is not read as TP-DP.
        assert_eq!(dp_from_name("35-llama-2-7b-hf-tp1-general-1-2", 2), None);
        assert_eq!(dp_from_name("35-llama-2-7b-hf-general-1-2", 1), None);
    }

    #[test]
    fn run_names_split_into_model_tp_and_workload() {
        assert_eq!(
            parse_run_name("38-llama-3-1-8b-tp1-general-lite-1-2"),
            Some(RunName {
                model: Some("llama-3-1-8b".into()),
                tp: 1,
                workload: Some("general-lite".into()),
                dp: Some(2),
            })
        );
        assert_eq!(parse_run_name("my-run"), None);
        let bare = parse_run_name("tp2-x").unwrap();
        assert_eq!((bare.model, bare.workload.as_deref()), (None, Some("x")));
    }
}
