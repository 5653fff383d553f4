//! Trace replay: parsing recorded request arrivals from text.
//!
//! Three formats (docs/workload.md has the full description):
//! - CSV with a header: `arrival_us,input_tokens,output_tokens[,prefix_group][,prefix_len]
//!   [,slo_class][,timeout_s]`, columns in any order, unknown columns rejected;
//! - JSONL: one object per line with the same keys, unknown keys rejected;
//! - the ground-truth `replay_requests.json` (`config` plus `requests[]` with `index`,
//!   `arrival_time_us`, `input_tokens`, `output_tokens`, `prefix_group`, `has_error`),
//!   whose `config` is returned as a [`ReplayConfig`] so the caller can apply it. A failed
//!   request whose token counts were lost (`has_error` with `input_tokens` 0: the client
//!   never saw them) is not a request yet: it comes back in [`Trace::lost`] with its
//!   arrival, for the caller to give lengths (`ditto validate` draws them from the workload).
//!
//! `timeout_s` (optional, > 0) is the client's timeout: the request gets the deadline
//! `arrival_us + timeout_s`, at which the client abandons it and the engine aborts it.
//!
//! Requests come back sorted by arrival (stable, so equal arrivals keep file order). CSV and
//! JSONL ids are the 0-based data-row index in the file; replay ids are `index`. Errors name
//! the 1-based line (or the `requests[i]` position) and the column.
//!
//! Parses `&str` only: reading files is the caller's job. Knows nothing about generation.

use std::path::Path;

use serde_json::{Map, Value};

use crate::sim::request::{PromptContent, RequestId, RequestSpec, SloClass};
use crate::sim::rng::fnv1a64;
use crate::workload::error::WorkloadError;

mod replay;
use replay::parse_replay;

/// The columns (CSV) or keys (JSONL) a trace row may have; the first three are required.
pub const TRACE_COLUMNS: [&str; 7] = [
    "arrival_us",
    "input_tokens",
    "output_tokens",
    "prefix_group",
    "prefix_len",
    "slo_class",
    "timeout_s",
];
const REQUIRED_COLUMNS: usize = 3;

/// The text format of a trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TraceFormat {
    /// Comma-separated values with a header line.
    Csv,
    /// One JSON object per line.
    Jsonl,
    /// The ground-truth `replay_requests.json` document.
    ReplayJson,
}

/// A parsed trace: requests in arrival order, plus what the replay format adds.
#[derive(Clone, Debug, PartialEq)]
pub struct Trace {
    /// The requests, sorted by `arrival_us` (stable).
    pub requests: Vec<RequestSpec>,
    /// The replay file's server configuration (replay JSON only).
    pub replay_config: Option<ReplayConfig>,
    /// Ids of requests the measured run marked `has_error` (replay JSON only), sorted; those
    /// with token counts are still in `requests`, so the caller decides whether to drop
    /// them; those without are in `lost`.
    pub errored: Vec<RequestId>,
    /// The replay file's `model_id`, if present.
    pub model_id: Option<String>,
    /// Failed requests whose token counts were lost (replay JSON only: `has_error` with
    /// `input_tokens` 0), in file order: not in `requests`, since a request needs a prompt.
    pub lost: Vec<LostRequest>,
}

/// A failed request of a replay file whose token counts the client never saw: only its
/// id and arrival are known.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LostRequest {
    /// The replay `index`.
    pub id: RequestId,
    /// Its arrival (µs, the file's clock).
    pub arrival_us: u64,
}

/// The `config` object of a `replay_requests.json`: the measured server's settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplayConfig {
    /// Tensor-parallel degree.
    pub tensor_parallelism: u32,
    /// vLLM `max_num_seqs`.
    pub max_num_seqs: u32,
    /// vLLM `max_num_batched_tokens`.
    pub max_num_batched_tokens: u32,
    /// GPU KV-cache blocks the server reported.
    pub kv_blocks_total_gpu: u64,
    /// KV block size in tokens.
    pub block_size: u32,
    /// Number of shared-prefix groups (0 when not recorded).
    pub num_prefix_groups: u32,
    /// Users per prefix group (0 when not recorded).
    pub users_per_group: u32,
    /// Shared system-prompt length in tokens (0 when not recorded).
    pub system_prompt_len: u32,
}

impl TraceFormat {
    /// Picks the format from the file extension: `.csv`, `.jsonl`/`.ndjson`, `.json`.
    pub fn from_path(path: &Path) -> Result<Self, WorkloadError> {
        let extension = path
            .extension()
            .and_then(|ext| ext.to_str())
            .map(str::to_ascii_lowercase);
        match extension.as_deref() {
            Some("csv") => Ok(TraceFormat::Csv),
            Some("jsonl" | "ndjson") => Ok(TraceFormat::Jsonl),
            Some("json") => Ok(TraceFormat::ReplayJson),
            _ => Err(WorkloadError::Trace {
                message: format!(
                    "cannot tell the format of `{}`: expected a .csv, .jsonl, .ndjson or .json file",
                    path.display()
                ),
            }),
        }
    }

    /// Parses trace text in this format.
    pub fn parse(self, text: &str) -> Result<Trace, WorkloadError> {
        let mut trace = match self {
            TraceFormat::Csv => plain_trace(parse_csv(text)?),
            TraceFormat::Jsonl => plain_trace(parse_jsonl(text)?),
            TraceFormat::ReplayJson => parse_replay(text)?,
        };
        if trace.requests.is_empty() && trace.lost.is_empty() {
            return Err(WorkloadError::Trace {
                message: "no requests".to_owned(),
            });
        }
        trace.requests.sort_by_key(|request| request.arrival_us);
        Ok(trace)
    }
}

fn plain_trace(requests: Vec<RequestSpec>) -> Trace {
    Trace {
        requests,
        replay_config: None,
        errored: Vec::new(),
        model_id: None,
        lost: Vec::new(),
    }
}

/// One row's fields before cross-field checks.
#[derive(Debug, Default)]
struct Row {
    arrival_us: Option<u64>,
    input_tokens: Option<u32>,
    output_tokens: Option<u32>,
    prefix_group: Option<u64>,
    prefix_len: Option<u32>,
    slo_class: Option<SloClass>,
    /// Client timeout in µs (from `timeout_s`).
    timeout_us: Option<u64>,
}

impl Row {
    /// Checks required fields and their relations, and builds the request.
    fn into_request(self, line: u64, id: u64) -> Result<RequestSpec, WorkloadError> {
        let missing = |column: &str| WorkloadError::field(line, column, "missing (required)");
        let arrival_us = self.arrival_us.ok_or_else(|| missing("arrival_us"))?;
        let input_tokens = self.input_tokens.ok_or_else(|| missing("input_tokens"))?;
        let output_tokens = self.output_tokens.ok_or_else(|| missing("output_tokens"))?;
        if input_tokens == 0 {
            return Err(WorkloadError::field(line, "input_tokens", "must be >= 1"));
        }
        let content = match (self.prefix_group, self.prefix_len) {
            (None, None) => PromptContent::Synthetic {
                prefix_group: None,
                prefix_len: 0,
            },
            (Some(_), None) => {
                return Err(WorkloadError::field(
                    line,
                    "prefix_len",
                    "required when prefix_group is set",
                ));
            }
            (None, Some(_)) => {
                return Err(WorkloadError::field(
                    line,
                    "prefix_group",
                    "required when prefix_len is set",
                ));
            }
            (Some(group), Some(prefix_len)) => {
                if prefix_len > input_tokens {
                    return Err(WorkloadError::field(
                        line,
                        "prefix_len",
                        format!("must be <= input_tokens ({prefix_len} > {input_tokens})"),
                    ));
                }
                PromptContent::Synthetic {
                    prefix_group: Some(group),
                    prefix_len,
                }
            }
        };
        let slo_class = self.slo_class.unwrap_or_default();
        Ok(RequestSpec {
            id: RequestId(id),
            arrival_us,
            input_tokens,
            output_tokens,
            max_tokens: output_tokens,
            slo_class,
            priority: slo_class.priority(),
            deadline_us: self
                .timeout_us
                .map(|timeout| arrival_us.saturating_add(timeout)),
            content,
        })
    }
}

/// A prefix-group label as an id: a decimal integer is itself, anything else its FNV-1a
/// hash; empty means no group.
fn group_id(label: &str) -> Option<u64> {
    let label = label.trim();
    if label.is_empty() {
        return None;
    }
    Some(
        label
            .parse::<u64>()
            .unwrap_or_else(|_| fnv1a64(label.as_bytes())),
    )
}

/// A client timeout in seconds (> 0, at most a year) as µs.
fn timeout_us(line: u64, column: &str, seconds: f64) -> Result<u64, WorkloadError> {
    if !(seconds > 0.0 && seconds <= 365.0 * 86_400.0) {
        return Err(WorkloadError::field(
            line,
            column,
            format!("must be > 0 seconds (at most a year), got {seconds}"),
        ));
    }
    Ok((seconds * 1e6).round() as u64)
}

fn parse_slo(line: u64, column: &str, text: &str) -> Result<SloClass, WorkloadError> {
    SloClass::parse(text)
        .ok_or_else(|| WorkloadError::field(line, column, format!("unknown SLO class `{text}`")))
}

/// Data lines of a line-oriented trace: 1-based line number and trimmed text, skipping
/// blank lines and `#` comments.
fn data_lines(text: &str) -> impl Iterator<Item = (u64, &str)> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    text.lines()
        .zip(1u64..)
        .map(|(content, line)| (line, content.trim()))
        .filter(|(_, content)| !content.is_empty() && !content.starts_with('#'))
}

// === CSV ===

fn parse_csv(text: &str) -> Result<Vec<RequestSpec>, WorkloadError> {
    let mut lines = data_lines(text);
    let Some((header_line, header)) = lines.next() else {
        return Err(WorkloadError::Trace {
            message: "empty CSV trace (no header line)".to_owned(),
        });
    };
    let columns = csv_header(header_line, header)?;
    let mut requests = Vec::new();
    for (id, (line, content)) in (0u64..).zip(lines) {
        let fields: Vec<&str> = content.split(',').map(str::trim).collect();
        if fields.len() != columns.len() {
            return Err(WorkloadError::TraceLine {
                line,
                message: format!(
                    "{} fields, but the header has {} columns",
                    fields.len(),
                    columns.len()
                ),
            });
        }
        let mut row = Row::default();
        for (&column, field) in columns.iter().zip(fields) {
            csv_field(&mut row, line, column, field)?;
        }
        requests.push(row.into_request(line, id)?);
    }
    Ok(requests)
}

/// Maps header names to known columns, rejecting unknown, duplicate and missing ones.
fn csv_header(line: u64, header: &str) -> Result<Vec<&'static str>, WorkloadError> {
    let mut columns: Vec<&'static str> = Vec::new();
    for name in header.split(',').map(str::trim) {
        let Some(&column) = TRACE_COLUMNS.iter().find(|&&known| known == name) else {
            return Err(WorkloadError::field(
                line,
                name,
                format!("unknown column (expected {})", TRACE_COLUMNS.join(", ")),
            ));
        };
        if columns.contains(&column) {
            return Err(WorkloadError::field(line, name, "duplicate column"));
        }
        columns.push(column);
    }
    if let Some(missing) = TRACE_COLUMNS[..REQUIRED_COLUMNS]
        .iter()
        .find(|required| !columns.contains(required))
    {
        return Err(WorkloadError::field(
            line,
            missing,
            "required column missing from header",
        ));
    }
    Ok(columns)
}

fn csv_field(row: &mut Row, line: u64, column: &str, field: &str) -> Result<(), WorkloadError> {
    if field.contains('"') {
        return Err(WorkloadError::field(
            line,
            column,
            "quoted fields are not supported",
        ));
    }
    match column {
        "arrival_us" => row.arrival_us = Some(csv_number(line, column, field)?),
        "input_tokens" => row.input_tokens = Some(csv_number(line, column, field)?),
        "output_tokens" => row.output_tokens = Some(csv_number(line, column, field)?),
        "prefix_group" => row.prefix_group = group_id(field),
        "prefix_len" if !field.is_empty() => {
            row.prefix_len = Some(csv_number(line, column, field)?)
        }
        "slo_class" => row.slo_class = Some(parse_slo(line, column, field)?),
        "timeout_s" if !field.is_empty() => {
            let seconds = field.parse::<f64>().map_err(|_| {
                WorkloadError::field(line, column, format!("expected seconds, got `{field}`"))
            })?;
            row.timeout_us = Some(timeout_us(line, column, seconds)?);
        }
        _ => {}
    }
    Ok(())
}

fn csv_number<T: std::str::FromStr>(
    line: u64,
    column: &str,
    field: &str,
) -> Result<T, WorkloadError> {
    field.parse::<T>().map_err(|_| {
        WorkloadError::field(
            line,
            column,
            format!("expected a non-negative integer in range, got `{field}`"),
        )
    })
}

// === JSONL ===

fn parse_jsonl(text: &str) -> Result<Vec<RequestSpec>, WorkloadError> {
    let mut requests = Vec::new();
    for (id, (line, content)) in (0u64..).zip(data_lines(text)) {
        let value: Value =
            serde_json::from_str(content).map_err(|err| WorkloadError::TraceLine {
                line,
                message: format!("invalid JSON: {err}"),
            })?;
        let Value::Object(object) = value else {
            return Err(WorkloadError::TraceLine {
                line,
                message: "expected a JSON object".to_owned(),
            });
        };
        requests.push(jsonl_row(line, &object)?.into_request(line, id)?);
    }
    Ok(requests)
}

fn jsonl_row(line: u64, object: &Map<String, Value>) -> Result<Row, WorkloadError> {
    let mut row = Row::default();
    // serde_json's Map iterates in sorted (or, with `preserve_order`, file) order: either
    // way the first error reported is deterministic.
    for (key, value) in object {
        if value.is_null() {
            continue;
        }
        match key.as_str() {
            "arrival_us" => row.arrival_us = Some(json_number(line, key, value)?),
            "input_tokens" => row.input_tokens = Some(json_number(line, key, value)?),
            "output_tokens" => row.output_tokens = Some(json_number(line, key, value)?),
            "prefix_len" => row.prefix_len = Some(json_number(line, key, value)?),
            "prefix_group" => {
                row.prefix_group = match value {
                    Value::String(label) => group_id(label),
                    Value::Number(_) => Some(json_number(line, key, value)?),
                    _ => {
                        return Err(WorkloadError::field(
                            line,
                            key,
                            "expected an integer or a string",
                        ));
                    }
                }
            }
            "slo_class" => {
                let Value::String(name) = value else {
                    return Err(WorkloadError::field(line, key, "expected a string"));
                };
                row.slo_class = Some(parse_slo(line, key, name)?);
            }
            "timeout_s" => {
                let seconds = value
                    .as_f64()
                    .ok_or_else(|| WorkloadError::field(line, key, "expected seconds"))?;
                row.timeout_us = Some(timeout_us(line, key, seconds)?);
            }
            _ => {
                return Err(WorkloadError::field(
                    line,
                    key,
                    format!("unknown key (expected {})", TRACE_COLUMNS.join(", ")),
                ));
            }
        }
    }
    Ok(row)
}

fn json_number<T: TryFrom<u64>>(line: u64, key: &str, value: &Value) -> Result<T, WorkloadError> {
    value
        .as_u64()
        .and_then(|number| T::try_from(number).ok())
        .ok_or_else(|| {
            WorkloadError::field(
                line,
                key,
                format!("expected a non-negative integer in range, got {value}"),
            )
        })
}

// === replay_requests.json ===

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_labels_map_to_ids() {
        assert_eq!(group_id(""), None);
        assert_eq!(group_id("  "), None);
        assert_eq!(group_id("7"), Some(7));
        assert_eq!(group_id("sys-a"), Some(fnv1a64(b"sys-a")));
    }

    #[test]
    fn format_from_extension() {
        let cases = [
            ("a.csv", Some(TraceFormat::Csv)),
            ("a.CSV", Some(TraceFormat::Csv)),
            ("dir/a.jsonl", Some(TraceFormat::Jsonl)),
            ("a.ndjson", Some(TraceFormat::Jsonl)),
            ("replay_requests.json", Some(TraceFormat::ReplayJson)),
            ("a.yaml", None),
            ("noext", None),
        ];
        for (path, expected) in cases {
            assert_eq!(
                TraceFormat::from_path(Path::new(path)).ok(),
                expected,
                "{path}"
            );
        }
    }
}
