//! `ditto calibrate DIR...`: fits the calibrated step-time model's coefficients to measured
//! runs and writes a coefficients file that `--latency-model FILE` accepts.
//!
//! `--leave-out run|model|workload|gpu|family` (`--leave-one-out` is `--leave-out run`) also
//! fits once per group on the other groups' runs and prints the held-out runs' errors (the
//! zero-shot figures): a run, a model, a workload, a GPU or a model family (every run of it)
//! at a time.
//! `--warm` fits each run on its first stage and prints its later stages' errors. Bad flags
//! or directories exit with code 2. On a terminal, stderr shows the fit's evaluations and
//! its current error (see [`crate::cli::progress`]).

use std::fmt::Write as _;
use std::path::PathBuf;

use clap::Args;

use crate::catalog;
use crate::cli::CliError;
use crate::cli::progress::{self, Progress};
use crate::cli::validate::{self, Validated, load_run, replay_options};
use crate::fidelity::calibrate::{FitEvaluation, FitResult, FitSpec, Target, fit_observed};
use crate::fidelity::{deployment, score};
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
    /// Also report leave-one-run-out errors (fit on the others, predict the one); the same
    /// as `--leave-out run`.
    #[arg(long)]
    pub leave_one_out: bool,
    /// Also report held-out errors by group: `run`, `model` (all runs of one model held out
    /// together), `workload` (all runs of one workload), `gpu` (all runs on one GPU) or
    /// `family` (all runs of one model family).
    #[arg(long)]
    pub leave_out: Option<String>,
    /// With `--leave-out`: report only the held-out folds, skipping the fit on every run
    /// (each fold is a full fit; a held-out report over many runs is long enough already).
    #[arg(long, conflicts_with = "out")]
    pub held_out_only: bool,
    /// Instead of one fit: warm-calibrate each run on its first stage (from `--start`,
    /// fitting `--free`, default weights,step_us,queue_us) and report its later stages.
    #[arg(long, conflicts_with_all = ["leave_one_out", "leave_out", "through_stage", "out"])]
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
    /// Share only the system prompt: do not replay the load generator's prompts as the
    /// fixed set it cycles through (each request's question then counts as new).
    #[arg(long)]
    pub no_repeated_prompts: bool,
    /// Replay every run without the KV-offload connector its server ran (the host time of
    /// its CPU tier's walks: `docs/fidelity/knee-tp2.md` section 5), as before stop 41.
    #[arg(long)]
    pub no_offload_connector: bool,
}

/// Runs `ditto calibrate` and returns its report.
pub fn execute(args: &CalibrateArgs) -> Result<String, CliError> {
    let replay = replay_options(
        &args.output_length,
        args.no_shared_prefix,
        args.no_repeated_prompts,
        42,
    )?;
    let start = start_coefficients(&args.start)?;
    let mut spec = FitSpec::all(start, replay);
    spec.options.evaluations_max = args.evaluations.max(1);
    if let Some(free) = &args.free {
        spec.free = parse_free(free)?;
    } else if args.warm {
        spec.free = parse_free(WARM_FREE)?;
    }
    let leave_out = match (args.leave_out.as_deref(), args.leave_one_out) {
        (Some(kind), _) => Some(LeaveOut::parse(kind)?),
        (None, true) => Some(LeaveOut::Run),
        (None, false) => None,
    };
    let show = progress::wanted(false);
    let loading = Progress::new(show, args.runs.len() as u64, "loading");
    let mut runs = Vec::new();
    for dir in &args.runs {
        loading.message(dir.display().to_string());
        let mut run = load_run(dir)?;
        if args.no_offload_connector {
            run.offload_connector_bytes = None;
        }
        runs.push((dir.clone(), run));
        loading.inc(1);
    }
    loading.finish();
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
    let mut report = String::new();
    if args.held_out_only {
        let Some(kind) = leave_out else {
            return Err(CliError::flag(
                "held-out-only",
                "needs --leave-out (or --leave-one-out)".to_string(),
            ));
        };
        report.push_str(&leave_group_out(args, kind, &runs, &targets, &spec, show)?);
        return Ok(report);
    }
    let fitted = fit_shown(&targets, &spec, "fit", show)?;
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
    if let Some(kind) = leave_out.filter(|_| targets.len() > 1) {
        report.push_str(&leave_group_out(args, kind, &runs, &targets, &spec, show)?);
    }
    Ok(report)
}

/// How runs are grouped for held-out errors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaveOut {
    /// One run at a time.
    Run,
    /// Every run of one model at a time (the run name's model part, e.g. `llama2-7b`).
    Model,
    /// Every run of one workload at a time (the run name's last part, e.g. `codegen`;
    /// `general-lite` is `general`).
    Workload,
    /// Every run on one GPU at a time (the run name's first part, e.g. `h100`).
    Gpu,
    /// Every run of one model family at a time: the model part without its size
    /// (`llama2-70b` and `llama2-7b` are `llama2`, `mixtral8x22b` is `mixtral`), CodeLlama
    /// counted with Llama 2 (it is Llama 2 trained further).
    Family,
}

impl LeaveOut {
    fn parse(text: &str) -> Result<LeaveOut, CliError> {
        match text {
            "run" => Ok(LeaveOut::Run),
            "model" => Ok(LeaveOut::Model),
            "workload" => Ok(LeaveOut::Workload),
            "gpu" => Ok(LeaveOut::Gpu),
            "family" => Ok(LeaveOut::Family),
            other => Err(CliError::flag(
                "leave-out",
                format!("unknown {other:?}; expected run, model, workload, gpu or family"),
            )),
        }
    }

    fn name(self) -> &'static str {
        match self {
            LeaveOut::Run => "run",
            LeaveOut::Model => "model",
            LeaveOut::Workload => "workload",
            LeaveOut::Gpu => "gpu",
            LeaveOut::Family => "family",
        }
    }
}

/// The group of a run named `<gpu or id>-<model...>-tp<N>-<workload...>` (the published
/// runs' naming, read by [`deployment::parse_run_name`], which drops the dataset's `-<N>`
/// or `-<N>-<D>` suffix from the workload); a name without a `tp<N>` part, or without the
/// part the grouping needs, is its own group.
pub fn group_of(name: &str, kind: LeaveOut) -> String {
    let run = deployment::parse_run_name(name);
    let group = match kind {
        LeaveOut::Model => run.and_then(|run| run.model),
        LeaveOut::Workload => run
            .and_then(|run| run.workload)
            .map(|workload| workload.trim_end_matches("-lite").to_string()),
        LeaveOut::Gpu => run.and(name.split('-').next().map(str::to_string)),
        LeaveOut::Family => run.and_then(|run| run.model).map(|model| family_of(&model)),
        LeaveOut::Run => None,
    };
    group.unwrap_or_else(|| name.to_string())
}

/// A model part's family: its parts up to the first size (`7b`, `8x22b`, `17b16e`), a size
/// glued to the name stripped (`codellama34b`, `mixtral8x7b`), dots and dashes dropped
/// (`llama-2` is `llama2`), precision qualifiers dropped (`scout17b16e-fp8` is `scout`),
/// and CodeLlama counted as Llama 2.
fn family_of(model: &str) -> String {
    let is_size = |p: &str| {
        p.starts_with(|c: char| c.is_ascii_digit())
            && p.contains('b')
            && p.bytes()
                .all(|b| b.is_ascii_digit() || b"xbe.".contains(&b))
    };
    // Precision and packaging qualifiers (`fp8`, `hf`, `instruct`) are not the family.
    let qualifier =
        |p: &&str| p.starts_with("fp") || p.starts_with("bf") || ["hf", "instruct"].contains(p);
    let head: Vec<&str> = model
        .split('-')
        .take_while(|p| !is_size(p))
        .filter(|p| !qualifier(p))
        .collect();
    let mut family: String = head.concat();
    // A size glued to the name: cut at the digit that starts it (after a letter that is
    // not part of a version such as `llama3.1`: the size is the last digit run with a `b`).
    let last_letter = family
        .char_indices()
        .rev()
        .find(|(_, c)| !c.is_ascii_digit() && !"xbe.".contains(*c));
    if let Some((at, c)) = last_letter {
        let end = at + c.len_utf8();
        if family.get(end..).is_some_and(is_size) {
            family.truncate(end);
        }
    }
    let family = family.replace('.', "");
    match family.as_str() {
        "codellama" => "llama2".to_string(),
        _ => family,
    }
}

/// A fit with a progress bar of its evaluations and current error on stderr (when `show`).
fn fit_shown(
    targets: &[Target],
    spec: &FitSpec,
    label: &str,
    show: bool,
) -> Result<FitResult, CliError> {
    let bar = Progress::new(show, spec.options.evaluations_max as u64, label);
    let mut observe = |e: FitEvaluation| {
        bar.inc(1);
        bar.message(format!("loss {:.4} (best {:.4})", e.loss, e.best));
    };
    let fitted = fit_observed(targets, spec, &mut observe).map_err(fit_error);
    bar.finish();
    fitted
}

/// For each group of `kind`: fits on the other groups' runs, validates the group's runs.
fn leave_group_out(
    args: &CalibrateArgs,
    kind: LeaveOut,
    runs: &[(PathBuf, crate::fidelity::MeasuredRun)],
    targets: &[Target],
    spec: &FitSpec,
    show: bool,
) -> Result<String, CliError> {
    let groups: Vec<String> = runs
        .iter()
        .map(|(_, run)| group_of(&run.name, kind))
        .collect();
    let mut distinct = groups.clone();
    distinct.sort();
    distinct.dedup();
    let mut validated: Vec<Validated> = Vec::new();
    for (fold, group) in distinct.iter().enumerate() {
        let others: Vec<Target> = targets
            .iter()
            .zip(&groups)
            .filter(|(_, g)| *g != group)
            .map(|(t, _)| t.clone())
            .collect();
        if others.is_empty() {
            continue;
        }
        let label = format!("{} {}/{}", kind.name(), fold + 1, distinct.len());
        let fitted = fit_shown(&others, spec, &label, show)?;
        let file =
            std::env::temp_dir().join(format!("ditto-loo-{}-{}.yaml", std::process::id(), fold));
        std::fs::write(
            &file,
            catalog::calibrated::render(&fitted.coefficients, "leave-one-out"),
        )
        .map_err(|source| CliError::Io {
            path: file.clone(),
            source,
        })?;
        let spec_name = file.to_string_lossy().to_string();
        for ((dir, run), _) in runs.iter().zip(&groups).filter(|(_, g)| *g == group) {
            let outcome =
                validate::validate_run(run, dir, &spec_name, args.gpu.as_deref(), spec.replay);
            if outcome.is_err() {
                let _ = std::fs::remove_file(&file);
            }
            validated.push(outcome?);
        }
        let _ = std::fs::remove_file(&file);
    }
    let mut text = format!(
        "\nleave-one-{}-out (each {} predicted by a fit on the others):\n",
        kind.name(),
        kind.name()
    );
    text.push_str(&validate::report_table(
        &format!("calibrated (leave-one-{}-out)", kind.name()),
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
        let label = format!("warm {}/{}", i + 1, runs.len());
        let fitted = fit_shown(
            std::slice::from_ref(&target),
            spec,
            &label,
            progress::wanted(false),
        )?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_group_by_model_and_workload_from_their_names() {
        let model = |name| group_of(name, LeaveOut::Model);
        let workload = |name| group_of(name, LeaveOut::Workload);
        assert_eq!(model("h100-llama2-7b-tp1-reasoning"), "llama2-7b");
        assert_eq!(model("h100-mixtral8x7b-tp2-general"), "mixtral8x7b");
        assert_eq!(model("a100-llama3.1-8b-tp1-general-lite"), "llama3.1-8b");
        assert_eq!(workload("h100-llama2-70b-tp4-codegen"), "codegen");
        assert_eq!(workload("a100-llama3.1-8b-tp1-general-lite"), "general");
        // The dataset's folder names: the TP(-DP) suffix is not the workload.
        assert_eq!(workload("38-llama-3-1-8b-tp1-general-lite-1-1"), "general");
        assert_eq!(workload("35-llama-2-7b-hf-tp1-general-1-2"), "general");
        assert_eq!(workload("13-qwen3-14b-tp1-general-1"), "general");
        assert_eq!(
            workload("67-llama-2-7b-hf-tp1-reasoning-lite-1-1"),
            "reasoning"
        );
        assert_eq!(workload("9-mixtral-8x7b-tp2-general"), "general");
        assert_eq!(model("35-llama-2-7b-hf-tp1-general-1-2"), "llama-2-7b-hf");
        assert_eq!(group_of("my-run", LeaveOut::Model), "my-run");
        assert_eq!(
            group_of("h100-llama2-7b-tp1-x", LeaveOut::Run),
            "h100-llama2-7b-tp1-x"
        );
        assert!(LeaveOut::parse("cpu").is_err());
        let gpu = |name| group_of(name, LeaveOut::Gpu);
        assert_eq!(gpu("h100-llama2-7b-tp1-reasoning"), "h100");
        assert_eq!(gpu("a100-qwen3-14b-tp1-general-lite-s2r36"), "a100");
        let family = |name| group_of(name, LeaveOut::Family);
        assert_eq!(family("h100-llama2-70b-tp4-codegen"), "llama2");
        assert_eq!(family("h100-llama2-7b-tp1-codegen"), "llama2");
        assert_eq!(family("h100-codellama34b-tp2-general"), "llama2");
        assert_eq!(family("h100-llama3.1-8b-tp1-general-s2r16"), "llama31");
        assert_eq!(family("h100-mixtral8x22b-tp8-codegen-s2r50"), "mixtral");
        assert_eq!(family("h100-mixtral8x7b-tp2-general"), "mixtral");
        assert_eq!(family("h100-qwen3-14b-tp1-general-s2r13"), "qwen3");
        assert_eq!(
            family("h100-scout17b16e-fp8-tp2-general-lite-s2r17"),
            "scout"
        );
        assert_eq!(family("35-llama-2-7b-hf-tp1-general-1-2"), "llama2");
    }
}
