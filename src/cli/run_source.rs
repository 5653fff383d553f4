//! Where `ditto run`'s requests come from (a trace, a workload file or the generator flags)
//! and the model it simulates, read and checked with errors naming the flag or file.

use std::path::Path;

use super::args::RunArgs;
use super::error::CliError;
use crate::catalog;
use crate::sim::RequestSpec;
use crate::sim::latency::ModelArch;
use crate::workload::{ArrivalProcess, LengthDist, ReplayConfig, TraceFormat, WorkloadSpec};

/// Where the run's requests come from.
pub(super) enum Source {
    /// A workload spec (from a file or the flags) and where it came from.
    Generated(Box<WorkloadSpec>, String),
    /// Requests, the replay file's server settings, the file name, its model id.
    Trace(
        Vec<RequestSpec>,
        Option<ReplayConfig>,
        String,
        Option<String>,
    ),
}

/// The model `--model` names: a config.json path or a catalog name.
pub(super) fn load_model(model: &str) -> Result<ModelArch, CliError> {
    let path = Path::new(model);
    if model.ends_with(".json") || path.is_file() {
        let text = read(path)?;
        let name = path
            .parent()
            .and_then(Path::file_name)
            .and_then(|n| n.to_str())
            .filter(|n| !n.is_empty())
            .unwrap_or(model);
        return catalog::parse_model_config(name, &text).map_err(|err| CliError::BadFile {
            path: path.to_path_buf(),
            reason: err.to_string(),
        });
    }
    Ok(catalog::model(model)?)
}

/// Where `args` say the requests come from: a trace, a workload file or the generator flags.
pub(super) fn load_source(args: &RunArgs) -> Result<Source, CliError> {
    if let Some(path) = &args.trace {
        let format = TraceFormat::from_path(path).map_err(|err| CliError::BadFile {
            path: path.clone(),
            reason: err.to_string(),
        })?;
        let trace = format
            .parse(&read(path)?)
            .map_err(|err| CliError::BadFile {
                path: path.clone(),
                reason: err.to_string(),
            })?;
        // Traces may carry absolute (e.g. Unix) times: the run starts at the first arrival.
        let mut requests = trace.requests;
        let origin = requests.first().map_or(0, |r| r.arrival_us);
        for request in &mut requests {
            request.arrival_us -= origin;
            request.deadline_us = request.deadline_us.map(|d| d.saturating_sub(origin));
        }
        return Ok(Source::Trace(
            requests,
            trace.replay_config,
            path.display().to_string(),
            trace.model_id,
        ));
    }
    if let Some(path) = &args.workload {
        let spec = WorkloadSpec::from_yaml(&read(path)?).map_err(|err| CliError::BadFile {
            path: path.clone(),
            reason: err.to_string(),
        })?;
        return Ok(Source::Generated(
            Box::new(spec),
            path.display().to_string(),
        ));
    }
    let arrival = match args.arrival.trim().to_ascii_lowercase().as_str() {
        "poisson" => ArrivalProcess::Poisson,
        "constant" => ArrivalProcess::Constant,
        other => {
            return Err(CliError::flag(
                "arrival",
                format!("unknown process {other:?}; expected poisson or constant"),
            ));
        }
    };
    if !(args.rate.is_finite() && args.rate > 0.0) {
        return Err(CliError::flag(
            "rate",
            format!("must be a positive number (got {})", args.rate),
        ));
    }
    if args.num_requests == 0 {
        return Err(CliError::flag("num-requests", "must be at least 1"));
    }
    let input = gaussian_flag("input-tokens", &args.input_tokens)?;
    let output = gaussian_flag("output-tokens", &args.output_tokens)?;
    let spec = WorkloadSpec::single_client(
        args.seed,
        args.num_requests,
        args.rate,
        arrival,
        input,
        output,
    );
    spec.validate()
        .map_err(|err| CliError::flag("rate", err.to_string()))?;
    Ok(Source::Generated(Box::new(spec), "flags".to_owned()))
}

/// The run's requests (trace, workload file or generator flags), in arrival order, and the
/// seed: what `--pd-sweep` replays on every split.
pub fn requests(args: &RunArgs) -> Result<(Vec<RequestSpec>, u64), CliError> {
    match load_source(args)? {
        Source::Generated(spec, _) => Ok((spec.generator()?.collect(), spec.seed)),
        Source::Trace(requests, ..) => Ok((requests, args.seed)),
    }
}

/// Parses `MEAN,STDEV,MIN,MAX` into a clamped gaussian.
fn gaussian_flag(flag: &'static str, text: &str) -> Result<LengthDist, CliError> {
    let parts: Vec<&str> = text.split(',').map(str::trim).collect();
    if parts.len() != 4 {
        return Err(CliError::flag(
            flag,
            format!("expected MEAN,STDEV,MIN,MAX, got {text:?}"),
        ));
    }
    let number = |index: usize, name: &str| -> Result<f64, CliError> {
        parts[index]
            .parse::<f64>()
            .ok()
            .filter(|v| v.is_finite() && *v >= 0.0)
            .ok_or_else(|| {
                CliError::flag(
                    flag,
                    format!(
                        "{name} must be a non-negative number, got {:?}",
                        parts[index]
                    ),
                )
            })
    };
    let (mean, stdev) = (number(0, "MEAN")?, number(1, "STDEV")?);
    let (min, max) = (number(2, "MIN")?, number(3, "MAX")?);
    if min < 1.0
        || max > f64::from(u32::MAX)
        || min > max
        || min.fract() != 0.0
        || max.fract() != 0.0
    {
        return Err(CliError::flag(
            flag,
            format!("MIN and MAX must be whole numbers with 1 <= MIN <= MAX, got {min} and {max}"),
        ));
    }
    Ok(LengthDist::gaussian(mean, stdev, min as u32, max as u32))
}

/// A file's text, or an error naming it.
pub(super) fn read(path: &Path) -> Result<String, CliError> {
    std::fs::read_to_string(path).map_err(|source| CliError::Io {
        path: path.to_path_buf(),
        source,
    })
}
