//! The YAML workload spec: its fields, defaults and validation.
//!
//! A [`WorkloadSpec`] describes an open-loop workload: a seed, how long it runs
//! (`num_requests` and/or `duration_s`, or piecewise `stages`), the aggregate rate, the
//! arrival process, and one or more [`ClientSpec`]s that share the rate and each have
//! their own length distributions, SLO class, shared prefixes and deadline. Without a
//! `clients` list, the top-level `input_tokens`/`output_tokens`/... fields describe one
//! implied client named `default`. docs/workload.md documents every field.
//!
//! Validation names the offending field path (`clients[1].input_tokens.stdev: ...`).
//! Knows nothing about how requests are generated (`generator`) or about traces.

use serde::Deserialize;

use crate::sim::request::SloClass;
use crate::workload::arrival::{ArrivalProcess, RateSegment};
use crate::workload::dist::{LengthDist, check_positive};
use crate::workload::error::WorkloadError;

/// Highest accepted aggregate rate, req/s: arrivals are whole microseconds apart per client.
pub const RATE_PER_S_MAX: f64 = 1_000_000.0;
/// Longest accepted run, in seconds (about 31 years; keeps microseconds far from overflow).
pub const DURATION_S_MAX: f64 = 1e9;
/// Most clients a spec may declare.
pub const CLIENTS_MAX: usize = 10_000;
/// Most rate stages a spec may declare.
pub const STAGES_MAX: usize = 10_000;
/// The id of the client implied when a spec has no `clients` list.
pub const DEFAULT_CLIENT_ID: &str = "default";
/// Largest `timeout_s` accepted (a year).
pub const TIMEOUT_S_MAX: f64 = 365.0 * 86_400.0;

/// A complete workload description, as read from YAML (see docs/workload.md).
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkloadSpec {
    /// Seed of every random stream of the workload (default 0).
    #[serde(default)]
    pub seed: u64,
    /// Stop after this many requests (at least 1).
    #[serde(default)]
    pub num_requests: Option<u64>,
    /// Stop at this simulated time, in seconds (not with `stages`).
    #[serde(default)]
    pub duration_s: Option<f64>,
    /// Aggregate arrival rate over all clients, req/s (exclusive with `stages`).
    #[serde(default)]
    pub rate: Option<f64>,
    /// Piecewise-constant rate: consecutive stages, the run ends after the last one.
    #[serde(default)]
    pub stages: Option<Vec<Stage>>,
    /// A daily sinusoid between a trough and a peak, run as stages (exclusive with `rate`
    /// and `stages`; `workload/diurnal.rs`).
    #[serde(default)]
    pub diurnal: Option<Diurnal>,
    /// Default arrival process of every client (default Poisson).
    #[serde(default = "default_arrival")]
    pub arrival: ArrivalProcess,
    /// The implied single client's prompt lengths (only without `clients`).
    #[serde(default)]
    pub input_tokens: Option<LengthDist>,
    /// The implied single client's output lengths (only without `clients`).
    #[serde(default)]
    pub output_tokens: Option<LengthDist>,
    /// The implied single client's SLO class (only without `clients`).
    #[serde(default)]
    pub slo_class: Option<String>,
    /// The implied single client's vLLM priority override (only without `clients`).
    #[serde(default)]
    pub priority: Option<i32>,
    /// The implied single client's shared prefixes (only without `clients`).
    #[serde(default)]
    pub prefix: Option<PrefixSpec>,
    /// The implied single client's relative deadline (only without `clients`).
    #[serde(default)]
    pub deadline_ms: Option<u64>,
    /// The implied single client's client timeout, seconds (only without `clients`).
    #[serde(default)]
    pub timeout_s: Option<f64>,
    /// Clients sharing the aggregate rate; absent means one implied `default` client.
    #[serde(default)]
    pub clients: Option<Vec<ClientSpec>>,
}

/// One stage of a piecewise-constant rate schedule.
#[derive(Clone, Copy, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Stage {
    /// Aggregate rate during the stage, req/s.
    pub rate: f64,
    /// Length of the stage, seconds.
    pub duration_s: f64,
}

/// Shared system prompts: each request's prompt starts with one of `groups` prefixes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PrefixSpec {
    /// Number of distinct prefixes (groups) of this client (at least 1).
    pub groups: u32,
    /// Prefix length in tokens (at least 1), added to the sampled `input_tokens`.
    pub length: u32,
}

/// One traffic source: its share of the rate and the shape of its requests.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientSpec {
    /// Unique, non-empty name; also names the client's random streams.
    pub id: String,
    /// Relative share of the aggregate rate (default 1; normalised over all clients).
    #[serde(default = "default_rate_fraction")]
    pub rate_fraction: f64,
    /// SLO class name (default `standard`).
    #[serde(default)]
    pub slo_class: Option<String>,
    /// vLLM priority (default: the SLO class's priority).
    #[serde(default)]
    pub priority: Option<i32>,
    /// Prompt lengths (excluding the shared prefix, which is added).
    pub input_tokens: LengthDist,
    /// Output lengths; also each request's `max_tokens`.
    pub output_tokens: LengthDist,
    /// Shared prefixes, if any.
    #[serde(default)]
    pub prefix: Option<PrefixSpec>,
    /// Deadline relative to arrival, milliseconds (at least 1).
    #[serde(default)]
    pub deadline_ms: Option<u64>,
    /// Client timeout, seconds (> 0): the client abandons a request this long after sending
    /// it and vLLM aborts it (the same deadline as `deadline_ms`, in a load generator's
    /// unit; give one of the two).
    #[serde(default)]
    pub timeout_s: Option<f64>,
    /// Arrival process override for this client (default: the top-level `arrival`).
    #[serde(default)]
    pub arrival: Option<ArrivalProcess>,
}

fn default_arrival() -> ArrivalProcess {
    ArrivalProcess::Poisson
}

fn default_rate_fraction() -> f64 {
    1.0
}

impl ClientSpec {
    /// A client with the given id and lengths, share 1, standard class, no prefix or deadline.
    pub fn new(id: impl Into<String>, input_tokens: LengthDist, output_tokens: LengthDist) -> Self {
        Self {
            id: id.into(),
            rate_fraction: 1.0,
            slo_class: None,
            priority: None,
            input_tokens,
            output_tokens,
            prefix: None,
            deadline_ms: None,
            timeout_s: None,
            arrival: None,
        }
    }

    /// The client's relative deadline in µs: `deadline_ms` or `timeout_s`, whichever is set.
    pub fn deadline_us(&self) -> Option<u64> {
        self.deadline_ms
            .map(|ms| ms.saturating_mul(1_000))
            .or_else(|| self.timeout_s.map(|s| (s * 1e6).round() as u64))
    }

    /// The parsed SLO class (`standard` when unset); `path` names the client in errors.
    pub fn slo_class(&self, path: &str) -> Result<SloClass, WorkloadError> {
        let Some(name) = &self.slo_class else {
            return Ok(SloClass::Standard);
        };
        SloClass::parse(name).ok_or_else(|| {
            let known: Vec<&str> = SloClass::ALL.iter().map(|class| class.as_str()).collect();
            WorkloadError::invalid(
                format!("{path}.slo_class"),
                format!(
                    "unknown class `{name}` (expected one of {})",
                    known.join(", ")
                ),
            )
        })
    }

    fn validate(&self, path: &str) -> Result<(), WorkloadError> {
        if self.id.trim().is_empty() {
            return Err(WorkloadError::invalid(
                format!("{path}.id"),
                "must not be empty",
            ));
        }
        check_positive(&format!("{path}.rate_fraction"), self.rate_fraction)?;
        self.slo_class(path)?;
        self.input_tokens
            .validate(&format!("{path}.input_tokens"))?;
        self.output_tokens
            .validate(&format!("{path}.output_tokens"))?;
        if let Some(prefix) = &self.prefix {
            if prefix.groups == 0 {
                return Err(WorkloadError::invalid(
                    format!("{path}.prefix.groups"),
                    "must be >= 1",
                ));
            }
            if prefix.length == 0 {
                return Err(WorkloadError::invalid(
                    format!("{path}.prefix.length"),
                    "must be >= 1",
                ));
            }
        }
        if self.deadline_ms == Some(0) {
            return Err(WorkloadError::invalid(
                format!("{path}.deadline_ms"),
                "must be >= 1",
            ));
        }
        if let Some(timeout) = self.timeout_s {
            if !(timeout > 0.0 && timeout <= TIMEOUT_S_MAX) {
                return Err(WorkloadError::invalid(
                    format!("{path}.timeout_s"),
                    format!("must be > 0 and at most {TIMEOUT_S_MAX} (a year), got {timeout}"),
                ));
            }
            if self.deadline_ms.is_some() {
                return Err(WorkloadError::invalid(
                    format!("{path}.timeout_s"),
                    "give `timeout_s` or `deadline_ms`, not both",
                ));
            }
        }
        if let Some(arrival) = &self.arrival {
            arrival.validate(&format!("{path}.arrival"))?;
        }
        Ok(())
    }
}

impl WorkloadSpec {
    /// Parses and validates a YAML spec.
    pub fn from_yaml(text: &str) -> Result<Self, WorkloadError> {
        let spec: WorkloadSpec =
            serde_saphyr::from_str(text).map_err(|err| WorkloadError::Yaml {
                message: err.to_string(),
            })?;
        spec.validate()?;
        Ok(spec)
    }

    /// A one-client workload of `num_requests` requests at `rate` req/s: what the CLI builds
    /// from flags. Validation happens in [`WorkloadSpec::generator`].
    pub fn single_client(
        seed: u64,
        num_requests: u64,
        rate: f64,
        arrival: ArrivalProcess,
        input_tokens: LengthDist,
        output_tokens: LengthDist,
    ) -> Self {
        Self {
            seed,
            num_requests: Some(num_requests),
            duration_s: None,
            rate: Some(rate),
            stages: None,
            diurnal: None,
            arrival,
            input_tokens: Some(input_tokens),
            output_tokens: Some(output_tokens),
            slo_class: None,
            priority: None,
            prefix: None,
            deadline_ms: None,
            timeout_s: None,
            clients: None,
        }
    }

    /// The clients that generate traffic: the `clients` list, or the implied `default`
    /// client built from the top-level fields. Fails like [`WorkloadSpec::validate`].
    pub fn resolved_clients(&self) -> Result<Vec<ClientSpec>, WorkloadError> {
        if let Some(clients) = &self.clients {
            self.reject_top_level_client_fields()?;
            return Ok(clients.clone());
        }
        let missing = |field: &str| {
            WorkloadError::invalid(
                field,
                "missing: give `input_tokens` and `output_tokens`, or a `clients` list",
            )
        };
        let input_tokens = self
            .input_tokens
            .clone()
            .ok_or_else(|| missing("input_tokens"))?;
        let output_tokens = self
            .output_tokens
            .clone()
            .ok_or_else(|| missing("output_tokens"))?;
        Ok(vec![ClientSpec {
            id: DEFAULT_CLIENT_ID.to_owned(),
            rate_fraction: 1.0,
            slo_class: self.slo_class.clone(),
            priority: self.priority,
            input_tokens,
            output_tokens,
            prefix: self.prefix,
            deadline_ms: self.deadline_ms,
            timeout_s: self.timeout_s,
            arrival: None,
        }])
    }

    fn reject_top_level_client_fields(&self) -> Result<(), WorkloadError> {
        let present = [
            ("input_tokens", self.input_tokens.is_some()),
            ("output_tokens", self.output_tokens.is_some()),
            ("slo_class", self.slo_class.is_some()),
            ("priority", self.priority.is_some()),
            ("prefix", self.prefix.is_some()),
            ("deadline_ms", self.deadline_ms.is_some()),
            ("timeout_s", self.timeout_s.is_some()),
        ];
        match present.iter().find(|(_, is_set)| *is_set) {
            Some((field, _)) => Err(WorkloadError::invalid(
                *field,
                "not allowed together with `clients`; set it on each client",
            )),
            None => Ok(()),
        }
    }

    /// Checks every field; the error names the first offending field path.
    pub fn validate(&self) -> Result<(), WorkloadError> {
        self.rate_schedule()?;
        self.arrival.validate("arrival")?;
        let clients = self.resolved_clients()?;
        if clients.is_empty() {
            return Err(WorkloadError::invalid("clients", "must not be empty"));
        }
        if clients.len() > CLIENTS_MAX {
            return Err(WorkloadError::invalid(
                "clients",
                format!("at most {CLIENTS_MAX} clients (got {})", clients.len()),
            ));
        }
        let implied = self.clients.is_none();
        for (index, client) in clients.iter().enumerate() {
            // The implied client's fields live at the top level, so paths have no prefix.
            let path = if implied {
                String::new()
            } else {
                format!("clients[{index}]")
            };
            client
                .validate(&path)
                .map_err(|err| strip_leading_dot(err, implied))?;
            if let Some(first) = clients[..index]
                .iter()
                .position(|other| other.id == client.id)
            {
                return Err(WorkloadError::invalid(
                    format!("{path}.id"),
                    format!("duplicate id `{}` (also clients[{first}])", client.id),
                ));
            }
        }
        Ok(())
    }

    /// The validated rate schedule: one open or bounded segment for `rate`, or one segment
    /// per stage.
    pub(crate) fn rate_schedule(&self) -> Result<Vec<RateSegment>, WorkloadError> {
        if self.num_requests == Some(0) {
            return Err(WorkloadError::invalid("num_requests", "must be >= 1"));
        }
        if let Some(duration_s) = self.duration_s {
            check_duration("duration_s", duration_s)?;
        }
        if let Some(curve) = &self.diurnal {
            if self.rate.is_some() || self.stages.is_some() || self.duration_s.is_some() {
                return Err(WorkloadError::invalid(
                    "diurnal",
                    "not allowed with `rate`, `stages` or `duration_s` (it sets the rate and the run length)",
                ));
            }
            return stage_schedule(&curve.stages()?);
        }
        match (&self.rate, &self.stages) {
            (Some(_), Some(_)) => Err(WorkloadError::invalid(
                "stages",
                "give either `rate` or `stages`, not both",
            )),
            (None, None) => Err(WorkloadError::invalid(
                "rate",
                "missing: give `rate` (req/s) or `stages`",
            )),
            (Some(rate), None) => {
                check_rate("rate", *rate)?;
                if self.num_requests.is_none() && self.duration_s.is_none() {
                    return Err(WorkloadError::invalid(
                        "num_requests",
                        "missing: with `rate`, give `num_requests` and/or `duration_s`",
                    ));
                }
                Ok(vec![RateSegment {
                    start_us: 0,
                    end_us: self.duration_s.map(seconds_to_us),
                    rate_per_s: *rate,
                }])
            }
            (None, Some(stages)) => {
                if self.duration_s.is_some() {
                    return Err(WorkloadError::invalid(
                        "duration_s",
                        "not allowed with `stages` (the stages' durations set the run length)",
                    ));
                }
                stage_schedule(stages)
            }
        }
    }
}

fn stage_schedule(stages: &[Stage]) -> Result<Vec<RateSegment>, WorkloadError> {
    if stages.is_empty() {
        return Err(WorkloadError::invalid("stages", "must not be empty"));
    }
    if stages.len() > STAGES_MAX {
        return Err(WorkloadError::invalid(
            "stages",
            format!("at most {STAGES_MAX} stages (got {})", stages.len()),
        ));
    }
    let mut segments = Vec::with_capacity(stages.len());
    let mut elapsed_s = 0.0;
    let mut start_us = 0;
    for (index, stage) in stages.iter().enumerate() {
        check_rate(&format!("stages[{index}].rate"), stage.rate)?;
        check_duration(&format!("stages[{index}].duration_s"), stage.duration_s)?;
        elapsed_s += stage.duration_s;
        check_duration("stages", elapsed_s)?;
        // Boundaries from the running sum in seconds, so per-stage rounding never drifts.
        let end_us = seconds_to_us(elapsed_s);
        segments.push(RateSegment {
            start_us,
            end_us: Some(end_us),
            rate_per_s: stage.rate,
        });
        start_us = end_us;
    }
    Ok(segments)
}

fn check_rate(path: &str, rate: f64) -> Result<(), WorkloadError> {
    check_positive(path, rate)?;
    if rate > RATE_PER_S_MAX {
        return Err(WorkloadError::invalid(
            path,
            format!("must be <= {RATE_PER_S_MAX} req/s (got {rate})"),
        ));
    }
    Ok(())
}

fn check_duration(path: &str, duration_s: f64) -> Result<(), WorkloadError> {
    check_positive(path, duration_s)?;
    if duration_s > DURATION_S_MAX {
        return Err(WorkloadError::invalid(
            path,
            format!("must be <= {DURATION_S_MAX} s (got {duration_s})"),
        ));
    }
    Ok(())
}

/// Seconds to whole microseconds (rounded); callers have checked the range.
fn seconds_to_us(seconds: f64) -> u64 {
    (seconds * 1_000_000.0).round() as u64
}

/// Turns `.input_tokens.stdev` into `input_tokens.stdev` for the implied client.
fn strip_leading_dot(err: WorkloadError, implied: bool) -> WorkloadError {
    match err {
        WorkloadError::Invalid { path, message } if implied => WorkloadError::Invalid {
            path: path.trim_start_matches('.').to_owned(),
            message,
        },
        other => other,
    }
}

/// The `diurnal:` field of a workload spec.
#[derive(Clone, Copy, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Diurnal {
    /// Lowest rate, req/s (> 0).
    pub trough_rate: f64,
    /// Highest rate, req/s (≥ the trough).
    pub peak_rate: f64,
    /// Length of one cycle, s (default 86,400: a day).
    #[serde(default = "day")]
    pub period_s: f64,
    /// When in the cycle the peak comes, s (default 14:00, 50,400 s into a day).
    #[serde(default)]
    pub peak_at_s: Option<f64>,
    /// How long the load runs, s (default one period).
    #[serde(default)]
    pub duration_s: Option<f64>,
    /// Length of each constant stage, s (default 60).
    #[serde(default = "minute")]
    pub step_s: f64,
}

fn day() -> f64 {
    86_400.0
}

fn minute() -> f64 {
    60.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stage_boundaries_come_from_the_running_sum() {
        // 0.1 s three times is 0.30000000000000004 s: boundaries must still be whole µs.
        let stage = Stage {
            rate: 5.0,
            duration_s: 0.1,
        };
        let segments = stage_schedule(&[stage, stage, stage]).unwrap();
        let ends: Vec<Option<u64>> = segments.iter().map(|s| s.end_us).collect();
        assert_eq!(ends, [Some(100_000), Some(200_000), Some(300_000)]);
        let starts: Vec<u64> = segments.iter().map(|s| s.start_us).collect();
        assert_eq!(starts, [0, 100_000, 200_000]);
    }

    #[test]
    fn rate_without_end_is_open_ended_only_with_num_requests() {
        let mut spec = WorkloadSpec::single_client(
            1,
            10,
            2.0,
            ArrivalProcess::Poisson,
            LengthDist::constant(1),
            LengthDist::constant(1),
        );
        let segments = spec.rate_schedule().unwrap();
        assert_eq!(segments[0].end_us, None);
        spec.num_requests = None;
        spec.duration_s = Some(1.5);
        assert_eq!(spec.rate_schedule().unwrap()[0].end_us, Some(1_500_000));
    }

    #[test]
    fn implied_client_takes_top_level_fields() {
        let mut spec = WorkloadSpec::single_client(
            1,
            10,
            2.0,
            ArrivalProcess::Poisson,
            LengthDist::constant(3),
            LengthDist::constant(4),
        );
        spec.deadline_ms = Some(9);
        spec.slo_class = Some("Batch".to_owned());
        let clients = spec.resolved_clients().unwrap();
        assert_eq!(clients.len(), 1);
        assert_eq!(clients[0].id, DEFAULT_CLIENT_ID);
        assert_eq!(clients[0].deadline_ms, Some(9));
        assert_eq!(clients[0].slo_class("").unwrap(), SloClass::Batch);
    }
}
