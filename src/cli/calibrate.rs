//! `ditto calibrate DIR...`: fits the calibrated step-time model's coefficients to measured
//! runs and writes a coefficients file that `--latency-model FILE` accepts.
//!
//! `--leave-one-out` also fits once per run on the others and prints the left-out run's
//! errors (the zero-shot figures); `--warm` fits each run on its first stage and prints its
//! later stages' errors. Bad flags or directories exit with code 2.

use std::fmt::Write as _;
use std::path::PathBuf;

use clap::Args;

use crate::catalog;
use crate::cli::CliError;
use crate::cli::validate::{self, Validated, load_run, replay_options};
use crate::fidelity::calibrate::{FitSpec, Target, fit};
use crate::fidelity::score;
use crate::sim::latency::CalibratedCoefficients;
use crate::sim::latency::calibrated::COEFFICIENT_NAMES;

/// Flags of `ditto calibrate`.
#[derive(Clone, Debug, Args)]
pub struct CalibrateArgs {
    /// Measured run directories to fit on.
    #[arg(required = true)]
    pub runs: Vec<PathBuf>,
    /// Write the fitted coefficients here.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Start from these coefficients: `calibrated` (embedded), `roofline`, or a file.
    #[arg(long, default_value = "calibrated")]
    pub start: String,
    /// Coefficients to fit, comma-separated (default: every overhead and efficiency).
    #[arg(long)]
    pub free: Option<String>,
    /// Most loss evaluations (each replays every run).
    #[arg(long, default_value_t = 600)]
    pub evaluations: usize,
    /// Fit on the first N stages of each run only (warm calibration).
    #[arg(long)]
    pub through_stage: Option<usize>,
    /// Also report leave-one-run-out errors (fit on the others, predict the one).
    #[arg(long)]
    pub leave_one_out: bool,
    /// Instead of one fit: warm-calibrate each run on its first stage (from `--start`,
    /// fitting `--free`, default weights,step_us,queue_us) and report its later stages.
    #[arg(long, conflicts_with_all = ["leave_one_out", "through_stage", "out"])]
    pub warm: bool,
    /// GPU of every run (default: recorded in the run).
    #[arg(long)]
    pub gpu: Option<String>,
    /// Output length to simulate: auto, configured or recount.
    #[arg(long, default_value = "auto")]
    pub output_length: String,
    /// Do not give requests their workload's shared system prompt.
    #[arg(long)]
    pub no_shared_prefix: bool,
}

/// Runs `ditto calibrate` and returns its report.
pub fn execute(args: &CalibrateArgs) -> Result<String, CliError> {
    let replay = replay_options(&args.output_length, args.no_shared_prefix, 42)?;
    let start = start_coefficients(&args.start)?;
    let mut spec = FitSpec::all(start, replay);
    spec.options.evaluations_max = args.evaluations.max(1);
    if let Some(free) = &args.free {
        spec.free = parse_free(free)?;
    } else if args.warm {
        spec.free = parse_free(WARM_FREE)?;
    }
    let mut runs = Vec::new();
    for dir in &args.runs {
        runs.push((dir.clone(), load_run(dir)?));
    }
    if args.warm {
        return warm(args, &runs, &spec);
    }
    let targets: Vec<Target> = runs
        .iter()
        .map(|(dir, run)| {
            let run = match args.through_stage {
                Some(stage) => run.through_stage(stage),
                None => run.clone(),
            };
            Target::new(run, args.gpu.as_deref()).map_err(|err| CliError::BadFile {
                path: dir.clone(),
                reason: err.to_string(),
            })
        })
        .collect::<Result<_, _>>()?;
    let fitted = fit(&targets, &spec).map_err(fit_error)?;
    let mut report = String::new();
    let _ = writeln!(
        report,
        "fitted on {} runs, loss {:.5}",
        targets.len(),
        fitted.loss
    );
    for (name, value) in COEFFICIENT_NAMES.iter().zip(fitted.coefficients.values) {
        let _ = writeln!(report, "  {name}: {value:.6}");
    }
    if let Some(path) = &args.out {
        let names: Vec<String> = runs.iter().map(|(_, run)| run.name.clone()).collect();
        let provenance = format!(
            "ditto calibrate on {}{}; loss {:.5}",
            names.join(", "),
            args.through_stage
                .map_or(String::new(), |s| format!(" (stages 0..={s})")),
            fitted.loss
        );
        let text = catalog::calibrated::render(&fitted.coefficients, &provenance);
        std::fs::write(path, text).map_err(|source| CliError::Io {
            path: path.clone(),
            source,
        })?;
        let _ = writeln!(report, "wrote {}", path.display());
    }
    if args.leave_one_out && targets.len() > 1 {
        report.push_str(&leave_one_out(args, &runs, &targets, &spec)?);
    }
    Ok(report)
}

/// Fits on all runs but one, validates the one, for each run.
fn leave_one_out(
    args: &CalibrateArgs,
    runs: &[(PathBuf, crate::fidelity::MeasuredRun)],
    targets: &[Target],
    spec: &FitSpec,
) -> Result<String, CliError> {
    let mut validated: Vec<Validated> = Vec::new();
    for (left_out, (dir, run)) in runs.iter().enumerate() {
        let others: Vec<Target> = targets
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != left_out)
            .map(|(_, t)| t.clone())
            .collect();
        let fitted = fit(&others, spec).map_err(fit_error)?;
        let file = std::env::temp_dir().join(format!(
            "ditto-loo-{}-{}.yaml",
            std::process::id(),
            left_out
        ));
        std::fs::write(
            &file,
            catalog::calibrated::render(&fitted.coefficients, "leave-one-out"),
        )
        .map_err(|source| CliError::Io {
            path: file.clone(),
            source,
        })?;
        let spec_name = file.to_string_lossy().to_string();
        let outcome =
            validate::validate_run(run, dir, &spec_name, args.gpu.as_deref(), spec.replay);
        let _ = std::fs::remove_file(&file);
        validated.push(outcome?);
    }
    let mut text =
        String::from("\nleave-one-run-out (each run predicted by a fit on the others):\n");
    text.push_str(&validate::report_table(
        "calibrated (leave-one-out)",
        &validated,
    ));
    let scores: Vec<_> = validated.iter().map(|v| v.score.clone()).collect();
    let _ = score::median_ape(&scores);
    Ok(text)
}

/// The coefficients a warm calibration fits by default: the two that carry a deployment's
/// own hardware and host (bandwidth efficiency, per-step CPU time) and its front end's
/// fixed latency.
const WARM_FREE: &str = "weights,step_us,queue_us";

/// Fits each run on its first stage and validates its later stages.
fn warm(
    args: &CalibrateArgs,
    runs: &[(PathBuf, crate::fidelity::MeasuredRun)],
    spec: &FitSpec,
) -> Result<String, CliError> {
    let mut validated: Vec<Validated> = Vec::new();
    for (i, (dir, run)) in runs.iter().enumerate() {
        let target = Target::new(run.through_stage(0), args.gpu.as_deref()).map_err(|err| {
            CliError::BadFile {
                path: dir.clone(),
                reason: err.to_string(),
            }
        })?;
        let fitted = fit(std::slice::from_ref(&target), spec).map_err(fit_error)?;
        let file = std::env::temp_dir().join(format!("ditto-warm-{}-{i}.yaml", std::process::id()));
        std::fs::write(
            &file,
            catalog::calibrated::render(&fitted.coefficients, "warm"),
        )
        .map_err(|source| CliError::Io {
            path: file.clone(),
            source,
        })?;
        let name = file.to_string_lossy().to_string();
        let outcome = validate::validate_run(run, dir, &name, args.gpu.as_deref(), spec.replay);
        let _ = std::fs::remove_file(&file);
        let mut one = outcome?;
        // Only what the fit did not see is scored: the stages after the first.
        one.score.stages.retain(|s| s.stage >= 1);
        validated.push(one);
    }
    let mut text = String::from("warm: each run fitted on stage 0, scored on its later stages\n");
    text.push_str(&validate::report_table("calibrated (warm)", &validated));
    Ok(text)
}

fn fit_error(err: crate::fidelity::FidelityError) -> CliError {
    CliError::BadFile {
        path: PathBuf::from("(runs)"),
        reason: format!("fit failed: {err}"),
    }
}

/// The starting coefficients `--start` names.
fn start_coefficients(start: &str) -> Result<CalibratedCoefficients, CliError> {
    match start {
        "calibrated" => Ok(catalog::calibrated_coefficients()?),
        "roofline" => Ok(CalibratedCoefficients::ROOFLINE),
        path => {
            let path = PathBuf::from(path);
            let text = std::fs::read_to_string(&path).map_err(|source| CliError::Io {
                path: path.clone(),
                source,
            })?;
            catalog::parse_calibrated(&text).map_err(|err| CliError::BadFile {
                path,
                reason: err.to_string(),
            })
        }
    }
}

/// Coefficient indices from a comma-separated list of names.
fn parse_free(list: &str) -> Result<Vec<usize>, CliError> {
    list.split(',')
        .map(str::trim)
        .filter(|name| !name.is_empty())
        .map(|name| {
            COEFFICIENT_NAMES
                .iter()
                .position(|n| *n == name)
                .ok_or_else(|| {
                    CliError::flag(
                        "free",
                        format!(
                            "unknown coefficient {name:?}; expected {}",
                            COEFFICIENT_NAMES.join(", ")
                        ),
                    )
                })
        })
        .collect()
}
