//! The latency predictor's JSON shapes: request entries validated field by field into
//! [`PodAggregates`] (plus measured latencies for training entries), and validation errors in
//! the shape a FastAPI (pydantic v2) server returns, `422 {"detail": [{type, loc, msg,
//! input, ctx?}]}`, so the peer's existing clients handle them.
//!
//! Field names, bounds and defaults follow the peer's `PredictionRequest` and
//! `TrainingEntry`: `kv_cache_percentage` and `prefix_cache_score` in [0, 1], counts ≥ 0,
//! `pod_type` a role as the EPP sends it (`twin::aggregate::POD_TYPES`; null means ""), the in-flight and encoder
//! fields optional with default 0.

use serde::Serialize;
use serde_json::{Map, Value, json};

use super::bounded_json::BoundedJsonError;
use crate::twin::aggregate::{POD_TYPES, PodAggregates, PodType};

/// Most waiting or running requests one entry may report: ditto simulates each of them.
pub const MAX_REQUESTS_PER_POD: u64 = 4_096;
/// Most tokens (in flight, or of an encoder input) one entry may report: 4096 requests of
/// a million-token context fit; 1e18 is not a pod.
pub const MAX_TOKENS_PER_POD: u64 = u32::MAX as u64;
/// Longest `input` echoed in a validation error, in JSON bytes: FastAPI echoes what it
/// refused, but a hostile 10 MB value must not come back.
pub const ECHO_BYTES_MAX: usize = 256;

/// `input` as echoed in an error: itself when short; else a string cut to
/// [`ECHO_BYTES_MAX`] bytes, or a description of the object or list.
pub fn bounded_input(input: Value) -> Value {
    let size = serde_json::to_vec(&input).map_or(usize::MAX, |bytes| bytes.len());
    if size <= ECHO_BYTES_MAX {
        return input;
    }
    match input {
        Value::String(text) => {
            let mut end = ECHO_BYTES_MAX.min(text.len());
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            Value::String(format!("{}… ({} bytes)", &text[..end], text.len()))
        }
        Value::Object(map) => Value::String(format!(
            "<object of {} fields, {size} bytes: not echoed>",
            map.len()
        )),
        Value::Array(items) => Value::String(format!(
            "<list of {} items, {size} bytes: not echoed>",
            items.len()
        )),
        other => other,
    }
}

/// One pydantic-style validation error.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FieldError {
    /// Error type (`missing`, `float_type`, `greater_than_equal`, ...).
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// Where: `["body", "requests", 0, "kv_cache_percentage"]`.
    pub loc: Vec<Value>,
    /// What is wrong, in pydantic's words.
    pub msg: String,
    /// The offending input.
    pub input: Value,
    /// The bound, for range errors.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ctx: Option<Value>,
}

impl FieldError {
    /// An error without `ctx`; `input` is bounded ([`bounded_input`]).
    pub fn new(kind: &'static str, loc: Vec<Value>, msg: impl Into<String>, input: Value) -> Self {
        Self {
            kind,
            loc,
            msg: msg.into(),
            input: bounded_input(input),
            ctx: None,
        }
    }

    /// The error as one line (for a lenient bulk call's per-entry `error`).
    pub fn line(&self) -> String {
        let path: Vec<String> = self
            .loc
            .iter()
            .skip(1)
            .map(|part| match part {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            })
            .collect();
        format!("{}: {}", path.join("."), self.msg)
    }
}

/// `loc` from a base path and a field name.
pub fn loc(base: &[Value], field: &str) -> Vec<Value> {
    let mut loc = base.to_vec();
    loc.push(Value::from(field));
    loc
}

/// JSON values one entry of a body may hold: an entry has about fifteen fields, so twice
/// that leaves room for fields the API adds later without letting a list of scalars cost
/// more than an entry's share.
pub const VALUES_PER_ENTRY: usize = 32;
/// JSON values a body may hold beside its entries (the envelope, flags).
pub const BODY_VALUES_SLACK: usize = 1_024;

/// The JSON values a body of at most `entries` entries may hold: every value parsed is
/// counted and the parse stops at the budget, so a body's memory is bounded by its entry
/// limit, not by its bytes (see [`super::bounded_json`]).
pub fn value_budget(entries: usize) -> usize {
    entries
        .saturating_mul(VALUES_PER_ENTRY)
        .saturating_add(BODY_VALUES_SLACK)
}

/// Why a body was refused before validation.
#[derive(Debug)]
pub enum BodyError {
    /// Not JSON: a `json_invalid` error as FastAPI reports it (422).
    Invalid(Vec<FieldError>),
    /// More JSON values than the body's budget (413): what it says.
    TooLarge(String),
}

/// Parses a request body holding at most `max_values` JSON values ([`value_budget`]).
pub fn parse_body_within(bytes: &[u8], max_values: usize) -> Result<Value, BodyError> {
    super::bounded_json::parse(bytes, max_values).map_err(|err| match err {
        BoundedJsonError::Invalid(err) => {
            let mut error = FieldError::new(
                "json_invalid",
                vec![Value::from("body"), Value::from(err.column())],
                "JSON decode error",
                json!({}),
            );
            error.ctx = Some(json!({ "error": err.to_string() }));
            BodyError::Invalid(vec![error])
        }
        BoundedJsonError::TooManyValues { limit } => BodyError::TooLarge(format!(
            "body: more than {limit} JSON values (at most {VALUES_PER_ENTRY} per entry)"
        )),
    })
}

/// Parses a small request body (one object of flags or fields; [`value_budget`] of one
/// entry); invalid JSON, or more values than that, is a `json_invalid` error.
pub fn parse_body(bytes: &[u8]) -> Result<Value, Vec<FieldError>> {
    parse_body_within(bytes, value_budget(1)).map_err(|err| match err {
        BodyError::Invalid(errors) => errors,
        BodyError::TooLarge(reason) => vec![FieldError::new(
            "json_invalid",
            vec![Value::from("body")],
            reason,
            json!({}),
        )],
    })
}

/// The object at `loc`, or a `model_attributes_type` error.
pub fn object<'a>(
    value: &'a Value,
    loc: &[Value],
) -> Result<&'a Map<String, Value>, Vec<FieldError>> {
    value.as_object().ok_or_else(|| {
        vec![FieldError::new(
            "model_attributes_type",
            loc.to_vec(),
            "Input should be a valid dictionary or object to extract fields from",
            value.clone(),
        )]
    })
}

/// The non-empty list under `field` of `body` (its length limit is the caller's: 413).
pub fn list<'a>(
    body: &'a Map<String, Value>,
    field: &str,
) -> Result<&'a Vec<Value>, Vec<FieldError>> {
    let at = loc(&[Value::from("body")], field);
    match body.get(field) {
        None => Err(vec![FieldError::new(
            "missing",
            at,
            "Field required",
            Value::Object(body.clone()),
        )]),
        Some(Value::Array(items)) if items.is_empty() => {
            let mut error = FieldError::new(
                "too_short",
                at,
                "List should have at least 1 item after validation, not 0",
                Value::Array(Vec::new()),
            );
            error.ctx = Some(json!({"field_type": "List", "min_length": 1, "actual_length": 0}));
            Err(vec![error])
        }
        Some(Value::Array(items)) => Ok(items),
        Some(other) => Err(vec![FieldError::new(
            "list_type",
            at,
            "Input should be a valid list",
            other.clone(),
        )]),
    }
}

struct Fields<'a> {
    object: &'a Map<String, Value>,
    base: &'a [Value],
    errors: Vec<FieldError>,
}

impl Fields<'_> {
    fn float(&mut self, name: &str, max: Option<f64>, required: bool) -> f64 {
        let at = loc(self.base, name);
        match self.object.get(name) {
            None | Some(Value::Null) if !required => 0.0,
            None => {
                self.missing(at);
                0.0
            }
            Some(value) => match value.as_f64() {
                Some(v) if v < 0.0 => {
                    self.range(
                        at,
                        "greater_than_equal",
                        "greater than or equal to",
                        0.0,
                        value,
                    );
                    0.0
                }
                Some(v) if max.is_some_and(|m| v > m) => {
                    self.range(
                        at,
                        "less_than_equal",
                        "less than or equal to",
                        max.unwrap_or(0.0),
                        value,
                    );
                    0.0
                }
                Some(v) => v,
                None => {
                    self.errors.push(FieldError::new(
                        "float_type",
                        at,
                        "Input should be a valid number",
                        value.clone(),
                    ));
                    0.0
                }
            },
        }
    }

    fn int(&mut self, name: &str, max: u64, required: bool) -> u64 {
        let at = loc(self.base, name);
        match self.object.get(name) {
            None | Some(Value::Null) if !required => 0,
            None => {
                self.missing(at);
                0
            }
            Some(value) => {
                let number = value.as_f64();
                match (value.as_u64(), number) {
                    (Some(v), _) if v > max => {
                        self.range(
                            at,
                            "less_than_equal",
                            "less than or equal to",
                            max as f64,
                            value,
                        );
                        0
                    }
                    (Some(v), _) => v,
                    (None, Some(v)) if v < 0.0 => {
                        self.range(
                            at,
                            "greater_than_equal",
                            "greater than or equal to",
                            0.0,
                            value,
                        );
                        0
                    }
                    (None, Some(v)) if v.fract() == 0.0 && v <= max as f64 => v as u64,
                    (None, Some(v)) if v.fract() == 0.0 => {
                        self.range(
                            at,
                            "less_than_equal",
                            "less than or equal to",
                            max as f64,
                            value,
                        );
                        0
                    }
                    (None, Some(_)) => {
                        self.errors.push(FieldError::new(
                            "int_from_float",
                            at,
                            "Input should be a valid integer, got a number with a fractional part",
                            value.clone(),
                        ));
                        0
                    }
                    (None, None) => {
                        self.errors.push(FieldError::new(
                            "int_type",
                            at,
                            "Input should be a valid integer",
                            value.clone(),
                        ));
                        0
                    }
                }
            }
        }
    }

    fn pod_type(&mut self) -> PodType {
        let at = loc(self.base, "pod_type");
        match self.object.get("pod_type") {
            None | Some(Value::Null) => PodType::Monolithic,
            Some(Value::String(text)) => PodType::parse(text).unwrap_or_else(|| {
                let mut error = FieldError::new(
                    "literal_error",
                    at,
                    format!("Input should be {POD_TYPES}"),
                    Value::String(text.clone()),
                );
                error.ctx = Some(json!({ "expected": POD_TYPES }));
                self.errors.push(error);
                PodType::Monolithic
            }),
            Some(other) => {
                self.errors.push(FieldError::new(
                    "string_type",
                    at,
                    "Input should be a valid string",
                    other.clone(),
                ));
                PodType::Monolithic
            }
        }
    }

    fn missing(&mut self, at: Vec<Value>) {
        self.errors.push(FieldError::new(
            "missing",
            at,
            "Field required",
            Value::Object(self.object.clone()),
        ));
    }

    fn range(
        &mut self,
        at: Vec<Value>,
        kind: &'static str,
        words: &str,
        bound: f64,
        input: &Value,
    ) {
        let shown = if bound.fract() == 0.0 {
            format!("{}", bound as i64)
        } else {
            bound.to_string()
        };
        let key = if kind == "greater_than_equal" {
            "ge"
        } else {
            "le"
        };
        let mut error = FieldError::new(
            kind,
            at,
            format!("Input should be {words} {shown}"),
            input.clone(),
        );
        error.ctx = Some(json!({ key: bound }));
        self.errors.push(error);
    }
}

/// Validates one prediction entry at `base` (e.g. `["body", "requests", 3]`).
pub fn aggregates(value: &Value, base: &[Value]) -> Result<PodAggregates, Vec<FieldError>> {
    let object = object(value, base)?;
    let mut fields = Fields {
        object,
        base,
        errors: Vec::new(),
    };
    let counts = MAX_REQUESTS_PER_POD;
    let tokens = MAX_TOKENS_PER_POD;
    let u32_max = u64::from(u32::MAX);
    let aggregates = PodAggregates {
        kv_cache_percentage: fields.float("kv_cache_percentage", Some(1.0), true),
        input_token_length: fields.int("input_token_length", u32_max, true) as u32,
        num_request_waiting: fields.int("num_request_waiting", counts, true) as u32,
        num_request_running: fields.int("num_request_running", counts, true) as u32,
        num_tokens_generated: fields.int("num_tokens_generated", u32_max, true) as u32,
        prefix_cache_score: fields.float("prefix_cache_score", Some(1.0), true),
        pod_type: fields.pod_type(),
        prefill_tokens_in_flight: fields.int("prefill_tokens_in_flight", tokens, false),
        decode_tokens_in_flight: fields.int("decode_tokens_in_flight", tokens, false),
        encoder_input_size: fields.int("encoder_input_size", tokens, false),
        encoder_matched_size: fields.int("encoder_matched_size", tokens, false),
    };
    if fields.errors.is_empty() {
        Ok(aggregates)
    } else {
        Err(fields.errors)
    }
}

/// A valid entry as the peer echoes a request in a lenient bulk call's `errors`: its known
/// fields only (pydantic drops the rest).
pub fn echo(entry: &PodAggregates) -> Value {
    let pod_type = entry.pod_type.as_str();
    json!({
        "kv_cache_percentage": entry.kv_cache_percentage,
        "input_token_length": entry.input_token_length,
        "num_request_waiting": entry.num_request_waiting,
        "num_request_running": entry.num_request_running,
        "num_tokens_generated": entry.num_tokens_generated,
        "prefix_cache_score": entry.prefix_cache_score,
        "pod_type": pod_type,
        "prefill_tokens_in_flight": entry.prefill_tokens_in_flight,
        "decode_tokens_in_flight": entry.decode_tokens_in_flight,
        "encoder_matched_size": entry.encoder_matched_size,
        "encoder_input_size": entry.encoder_input_size,
    })
}

/// A training entry: the aggregates at dispatch and the measured latencies (ms; value checks
/// beyond "a number" are the calibration's, so bad measurements are counted, not refused).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TrainingEntry {
    /// The pod's aggregates when the request was dispatched.
    pub aggregates: PodAggregates,
    /// Measured time to first token, ms.
    pub actual_ttft_ms: f64,
    /// Measured time per output token, ms.
    pub actual_tpot_ms: f64,
}

/// Validates one training entry at `base`.
pub fn training_entry(value: &Value, base: &[Value]) -> Result<TrainingEntry, Vec<FieldError>> {
    let mut errors = Vec::new();
    let aggregates = aggregates(value, base).map_err(|e| errors = e).ok();
    let object = object(value, base)?;
    let mut actual = |name: &str| -> f64 {
        match object.get(name) {
            None => {
                errors.push(FieldError::new(
                    "missing",
                    loc(base, name),
                    "Field required",
                    Value::Object(object.clone()),
                ));
                0.0
            }
            Some(value) => value.as_f64().unwrap_or_else(|| {
                errors.push(FieldError::new(
                    "float_type",
                    loc(base, name),
                    "Input should be a valid number",
                    value.clone(),
                ));
                0.0
            }),
        }
    };
    let actual_ttft_ms = actual("actual_ttft_ms");
    let actual_tpot_ms = actual("actual_tpot_ms");
    match aggregates {
        Some(aggregates) if errors.is_empty() => Ok(TrainingEntry {
            aggregates,
            actual_ttft_ms,
            actual_tpot_ms,
        }),
        _ => Err(errors),
    }
}

/// Unix time in µs as ISO 8601 UTC (`2026-11-25T11:29:51.123456+00:00`), as the peer's
/// datetimes serialise.
pub fn iso8601(unix_us: u64) -> String {
    let seconds = unix_us / 1_000_000;
    let micros = unix_us % 1_000_000;
    let days = (seconds / 86_400) as i64;
    let rest = seconds % 86_400;
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{micros:06}+00:00",
        rest / 3_600,
        rest % 3_600 / 60,
        rest % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iso8601_formats_known_instants() {
        assert_eq!(iso8601(0), "1970-01-01T00:00:00.000000+00:00");
        assert_eq!(
            iso8601(1_795_606_191_123_456),
            "2026-11-25T11:29:51.123456+00:00"
        );
        assert_eq!(
            iso8601(951_782_400_000_000),
            "2000-02-29T00:00:00.000000+00:00"
        );
    }

    #[test]
    fn entries_are_checked_field_by_field() {
        let base = [Value::from("body")];
        let errors = aggregates(
            &json!({"kv_cache_percentage": 1.5, "input_token_length": -3,
                    "num_request_waiting": "x", "num_request_running": 1,
                    "prefix_cache_score": 0.2, "pod_type": "gpu"}),
            &base,
        )
        .unwrap_err();
        let kinds: Vec<(&str, String)> = errors
            .iter()
            .map(|e| (e.kind, e.loc.last().unwrap().to_string()))
            .collect();
        assert_eq!(
            kinds,
            vec![
                ("less_than_equal", "\"kv_cache_percentage\"".to_owned()),
                ("greater_than_equal", "\"input_token_length\"".to_owned()),
                ("int_type", "\"num_request_waiting\"".to_owned()),
                ("missing", "\"num_tokens_generated\"".to_owned()),
                ("literal_error", "\"pod_type\"".to_owned()),
            ]
        );
    }
}
