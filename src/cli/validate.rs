//! `ditto validate DIR...`: replays measured vLLM runs and prints how far ditto's
//! predictions are from the measurements, per run, per stage and as medians across runs.
//!
//! Reads each run directory's files (see `fidelity::measured`), resolves the latency model
//! (a name or a coefficients file, see [`crate::cli::latency`]), replays, scores, and prints
//! a table or, with `--json`, one JSON document. Bad directories or flags exit with code 2.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use clap::Args;
use serde_json::{Value, json};

use crate::cli::CliError;
use crate::cli::latency::resolve_latency;
use crate::cli::progress::{self, Progress};
use crate::fidelity::replay::{self, OutputLength, ReplayOptions};
use crate::fidelity::rounds::RoundTtft;
use crate::fidelity::score::{self, Metrics, RunScore};
use crate::fidelity::{MeasuredRun, RunFiles, scraped};

/// Flags of `ditto validate`.
#[derive(Clone, Debug, Args)]
pub struct ValidateArgs {
    /// Measured run directories (the format of the published inference-sim ground truth).
    #[arg(required = true)]
    pub runs: Vec<PathBuf>,
    /// Step-time model: a name (calibrated, physics, roofline, blackbox) or a coefficients
    /// file written by `ditto calibrate`.
    #[arg(long, default_value = "calibrated")]
    pub latency_model: String,
    /// GPU of every run (default: recorded in the run, or its directory name's prefix).
    #[arg(long)]
    pub gpu: Option<String>,
    /// Output length to simulate: auto (the configured length when the server ignored EOS,
    /// else the client's recount), configured or recount.
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
    /// Seed of what a replay draws: summary-only runs' arrivals and lengths, and lost
    /// lengths of failed requests.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// One validated run: its score and what was simulated.
#[derive(Clone, Debug)]
pub struct Validated {
    /// The score.
    pub score: RunScore,
    /// GPU simulated.
    pub gpu: String,
    /// TP simulated.
    pub tp: u32,
    /// Data-parallel replicas simulated (each `tp` GPUs with `num_gpu_blocks`).
    pub dp: u32,
    /// Bytes per weight simulated (2 for a 16-bit model, 1 for FP8).
    pub weight_bytes_per_param: f64,
    /// GPU blocks simulated (per replica).
    pub num_gpu_blocks: u32,
    /// Uniform output length simulated, if any.
    pub output_len: Option<u32>,
}

/// Runs `ditto validate` and returns what to print.
pub fn execute(args: &ValidateArgs) -> Result<String, CliError> {
    let options = replay_options(
        &args.output_length,
        args.no_shared_prefix,
        args.no_repeated_prompts,
        args.seed,
    )?;
    let mut validated = Vec::new();
    let bar = Progress::new(
        progress::wanted(args.json),
        args.runs.len() as u64,
        "replaying",
    );
    for dir in &args.runs {
        bar.message(dir.display().to_string());
        let mut run = load_run(dir)?;
        if args.no_offload_connector {
            run.offload_connector_bytes = None;
        }
        validated.push(validate_run(
            &run,
            dir,
            &args.latency_model,
            args.gpu.as_deref(),
            options,
        )?);
        bar.inc(1);
    }
    bar.finish();
    Ok(if args.json {
        let mut text = serde_json::to_string_pretty(&report_json(&args.latency_model, &validated))
            .unwrap_or_default();
        text.push('\n');
        text
    } else {
        report_table(&args.latency_model, &validated)
    })
}

/// Replay options from the flags.
pub fn replay_options(
    output_length: &str,
    no_shared_prefix: bool,
    no_repeated_prompts: bool,
    seed: u64,
) -> Result<ReplayOptions, CliError> {
    let output_length = match output_length {
        "auto" => OutputLength::Auto,
        "configured" => OutputLength::Configured,
        "recount" => OutputLength::Recount,
        other => {
            return Err(CliError::flag(
                "output-length",
                format!("unknown {other:?}; expected auto, configured or recount"),
            ));
        }
    };
    Ok(ReplayOptions {
        output_length,
        shared_prefix: !no_shared_prefix,
        repeated_prompts: !no_repeated_prompts,
        seed,
    })
}

/// Replays and scores one run.
pub fn validate_run(
    run: &MeasuredRun,
    dir: &Path,
    latency_model: &str,
    gpu: Option<&str>,
    options: ReplayOptions,
) -> Result<Validated, CliError> {
    let file_error = |err: crate::fidelity::FidelityError| CliError::BadFile {
        path: dir.to_path_buf(),
        reason: err.to_string(),
    };
    let gpu = replay::resolve_gpu(run, gpu).map_err(file_error)?;
    let latency = resolve_latency(latency_model, &run.arch, &gpu, run.tp)?;
    let config = replay::engine_config(run, &gpu).map_err(file_error)?;
    let replayed = replay::replay(run, &config, latency, options).map_err(file_error)?;
    Ok(Validated {
        score: score::score(run, &replayed),
        gpu: gpu.name.clone(),
        tp: run.tp,
        dp: run.dp,
        weight_bytes_per_param: run.arch.effective_weight_bytes_per_param(),
        num_gpu_blocks: replayed.num_gpu_blocks,
        output_len: replayed.output_len,
    })
}

/// Reads a run directory's files.
pub fn load_run(dir: &Path) -> Result<MeasuredRun, CliError> {
    if !dir.is_dir() {
        return Err(CliError::BadFile {
            path: dir.to_path_buf(),
            reason: "not a directory".into(),
        });
    }
    let read = |name: &str| -> Result<Option<String>, CliError> {
        let path = dir.join(name);
        if !path.is_file() {
            return Ok(None);
        }
        std::fs::read_to_string(&path)
            .map(Some)
            .map_err(|source| CliError::Io { path, source })
    };
    let workload = match first_matching(dir, "workload_", ".json") {
        Some(name) => read(&name)?,
        None => None,
    };
    let files = RunFiles {
        name: dir
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("run")
            .to_string(),
        model_config: read("model_config.json")?,
        exp_config: read("exp-config.yaml")?,
        replay_requests: read("replay_requests.json")?,
        ground_truth: read("replay_ground_truth.json")?,
        profile: match read("results/config.yaml")? {
            Some(text) => Some(text),
            None => read("profile.yaml")?,
        },
        workload,
        s2r_records: read("s2r_error_records.csv")?,
        metrics_before: read(scraped::BEFORE_FILE)?,
        metrics_after: read(scraped::AFTER_FILE)?,
        scrape: read(scraped::SCRAPE_FILE)?,
    };
    MeasuredRun::parse(&files).map_err(|err| CliError::BadFile {
        path: dir.to_path_buf(),
        reason: err.to_string(),
    })
}

/// The first file in `dir` named `prefix*suffix`, sorted by name.
fn first_matching(dir: &Path, prefix: &str, suffix: &str) -> Option<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
        .filter(|name| name.starts_with(prefix) && name.ends_with(suffix))
        .collect();
    names.sort();
    names.into_iter().next()
}

fn metrics_json(m: &Metrics) -> Value {
    let mut map = serde_json::Map::new();
    for (name, value) in m.named() {
        map.insert(name.into(), finite(value));
    }
    Value::Object(map)
}

fn finite(value: f64) -> Value {
    if value.is_finite() {
        json!((value * 1e4).round() / 1e4)
    } else {
        Value::Null
    }
}

/// The JSON report.
pub fn report_json(latency_model: &str, validated: &[Validated]) -> Value {
    let runs: Vec<Value> = validated
        .iter()
        .map(|v| {
            let stages: Vec<Value> = v
                .score
                .stages
                .iter()
                .map(|s| {
                    json!({
                        "stage": s.stage,
                        "count": s.count,
                        "predicted_ms": metrics_json(&s.predicted),
                        "measured_ms": metrics_json(&s.measured),
                        "ape_percent": metrics_json(&s.ape),
                        "ks_ttft": s.ks_ttft.map(finite),
                        "ks_e2e": s.ks_e2e.map(finite),
                    })
                })
                .collect();
            json!({
                "name": v.score.name,
                "gpu": v.gpu,
                "tp": v.tp,
                "dp": v.dp,
                "weight_bytes_per_param": v.weight_bytes_per_param,
                "num_gpu_blocks": v.num_gpu_blocks,
                "output_len_simulated": v.output_len,
                "unfinished_requests": v.score.unfinished,
                "timed_out_fraction": {
                    "predicted": finite(v.score.timed_out_predicted),
                    "measured": v.score.timed_out_measured.map(finite),
                },
                "stages": stages,
                "prompt_rounds": v.score.prompt_rounds.map(|r| json!({
                    "first": round_json(&r.first),
                    "second": round_json(&r.second),
                })),
            })
        })
        .collect();
    let scores: Vec<RunScore> = validated.iter().map(|v| v.score.clone()).collect();
    json!({
        "latency_model": latency_model,
        "runs": runs,
        "median_ape_percent": metrics_json(&score::median_ape(&scores)),
    })
}

fn round_json(round: &RoundTtft) -> Value {
    json!({
        "count": round.count,
        "predicted_ttft_p25_ms": finite(round.predicted_ms),
        "measured_ttft_p25_ms": finite(round.measured_ms),
    })
}

/// The table's lines on each shared-prefix run's first round of prompts against its second.
fn write_rounds(out: &mut String, validated: &[Validated]) {
    let rounds: Vec<_> = validated
        .iter()
        .filter_map(|v| v.score.prompt_rounds.map(|r| (&v.score.name, r)))
        .collect();
    if !rounds.is_empty() {
        let _ = writeln!(
            out,
            "first round of prompts (new to the server) against the second (cached): lower-quartile TTFT ms, predicted/measured"
        );
    }
    for (name, r) in rounds {
        let (predicted, measured) = r.cold_extra_ms();
        let _ = writeln!(
            out,
            "{name:<36} first {:.1}/{:.1}  second {:.1}/{:.1}  first - second {predicted:.1}/{measured:.1}",
            r.first.predicted_ms, r.first.measured_ms, r.second.predicted_ms, r.second.measured_ms,
        );
    }
}

/// The human-readable table.
pub fn report_table(latency_model: &str, validated: &[Validated]) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "latency model: {latency_model}");
    let _ = writeln!(
        out,
        "{:<36} {:>5} {:>6} | {:>22} {:>22} {:>20} {:>20} {:>18} | {:>5} {:>5} | {:>11}",
        "run",
        "stage",
        "n",
        "E2E mean ms (err)",
        "E2E p90 ms (err)",
        "TTFT mean ms (err)",
        "TTFT p90 ms (err)",
        "TPOT ms (err)",
        "KS-T",
        "KS-E",
        "timed out"
    );
    let cell = |p: f64, m: f64, e: f64| {
        if m.is_finite() {
            format!("{p:.1}/{m:.1} ({e:.1}%)")
        } else {
            // Not measured (a p90 a scrape cannot give).
            format!("{p:.1}/-")
        }
    };
    for v in validated {
        let name = if v.dp > 1 {
            format!("{} (dp {})", v.score.name, v.dp)
        } else {
            v.score.name.clone()
        };
        for s in &v.score.stages {
            let stage = if s.stage < 0 {
                "all".to_string()
            } else {
                s.stage.to_string()
            };
            let ks = |k: Option<f64>| k.map_or("-".to_string(), |k| format!("{k:.3}"));
            let (p, m, e) = (&s.predicted, &s.measured, &s.ape);
            // The timed-out fraction (predicted/measured) is a whole-run figure.
            let timed_out = if s.stage < 0 {
                let measured = v
                    .score
                    .timed_out_measured
                    .map_or("-".to_string(), |f| format!("{:.1}%", f * 100.0));
                format!("{:.1}%/{measured}", v.score.timed_out_predicted * 100.0)
            } else {
                String::new()
            };
            let _ = writeln!(
                out,
                "{:<36} {:>5} {:>6} | {:>22} {:>22} {:>20} {:>20} {:>18} | {:>5} {:>5} | {:>11}",
                name,
                stage,
                s.count,
                cell(p.e2e_mean, m.e2e_mean, e.e2e_mean),
                cell(p.e2e_p90, m.e2e_p90, e.e2e_p90),
                cell(p.ttft_mean, m.ttft_mean, e.ttft_mean),
                cell(p.ttft_p90, m.ttft_p90, e.ttft_p90),
                cell(p.tpot_mean, m.tpot_mean, e.tpot_mean),
                ks(s.ks_ttft),
                ks(s.ks_e2e),
                timed_out,
            );
        }
    }
    write_rounds(&mut out, validated);
    let scores: Vec<RunScore> = validated.iter().map(|v| v.score.clone()).collect();
    let med = score::median_ape(&scores);
    let pct = |v: f64| {
        if v.is_finite() {
            format!("{v:.1}%")
        } else {
            "-".to_owned()
        }
    };
    let _ = writeln!(
        out,
        "median abs % error over {} runs: E2E mean {}, E2E p90 {}, TTFT mean {}, TTFT p90 {}, TPOT {}",
        scores.len(),
        pct(med.e2e_mean),
        pct(med.e2e_p90),
        pct(med.ttft_mean),
        pct(med.ttft_p90),
        pct(med.tpot_mean)
    );
    out
}
