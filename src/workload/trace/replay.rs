//! The ground-truth `replay_requests.json` reader (`config` plus `requests[]`): requests,
//! the run's [`ReplayConfig`], and the failed requests whose lengths were lost
//! ([`Trace::lost`]). See the parent module for the formats.

use serde_json::{Map, Value};

use super::*;

pub(super) fn parse_replay(text: &str) -> Result<Trace, WorkloadError> {
    let root: Value = serde_json::from_str(text).map_err(|err| WorkloadError::TraceLine {
        line: err.line() as u64,
        message: format!("invalid JSON: {err}"),
    })?;
    let whole = |message: String| WorkloadError::Trace { message };
    let Value::Object(root) = root else {
        return Err(whole(
            "expected a JSON object with `config` and `requests`".to_owned(),
        ));
    };
    let Some(Value::Object(config)) = root.get("config") else {
        return Err(whole("config: missing or not an object".to_owned()));
    };
    let config = replay_config(config).map_err(whole)?;
    let Some(Value::Array(records)) = root.get("requests") else {
        return Err(whole("requests: missing or not an array".to_owned()));
    };
    let mut requests = Vec::with_capacity(records.len());
    let mut errored = Vec::new();
    let mut lost = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    for (position, record) in (0u64..).zip(records) {
        let replayed = replay_request(record, &config).map_err(|(field, message)| {
            WorkloadError::ReplayRecord {
                position,
                field: field.to_owned(),
                message,
            }
        })?;
        let id = match &replayed {
            Replayed::Request(request, _) => request.id,
            Replayed::Lost(request) => request.id,
        };
        if !seen.insert(id) {
            return Err(WorkloadError::ReplayRecord {
                position,
                field: "index".to_owned(),
                message: format!("duplicate index {}", id.0),
            });
        }
        match replayed {
            Replayed::Request(request, has_error) => {
                if has_error {
                    errored.push(request.id);
                }
                requests.push(request);
            }
            Replayed::Lost(request) => {
                errored.push(request.id);
                lost.push(request);
            }
        }
    }
    errored.sort();
    Ok(Trace {
        requests,
        replay_config: Some(config),
        errored,
        model_id: root
            .get("model_id")
            .and_then(Value::as_str)
            .map(str::to_owned),
        lost,
    })
}

/// Reads the `config` object; errors are `config.<key>: <problem>`.
fn replay_config(object: &Map<String, Value>) -> Result<ReplayConfig, String> {
    let field = |key: &str, required: bool| -> Result<u64, String> {
        match object.get(key) {
            None | Some(Value::Null) if !required => Ok(0),
            None | Some(Value::Null) => Err(format!("config.{key}: missing (required)")),
            Some(value) => value.as_u64().ok_or_else(|| {
                format!("config.{key}: expected a non-negative integer, got {value}")
            }),
        }
    };
    let narrow = |key: &str, required: bool| -> Result<u32, String> {
        let value = field(key, required)?;
        u32::try_from(value).map_err(|_| format!("config.{key}: {value} is too large"))
    };
    Ok(ReplayConfig {
        tensor_parallelism: narrow("tensor_parallelism", true)?,
        max_num_seqs: narrow("max_num_seqs", true)?,
        max_num_batched_tokens: narrow("max_num_batched_tokens", true)?,
        kv_blocks_total_gpu: field("kv_blocks_total_gpu", true)?,
        block_size: narrow("block_size", true)?,
        num_prefix_groups: narrow("num_prefix_groups", false)?,
        users_per_group: narrow("users_per_group", false)?,
        system_prompt_len: narrow("system_prompt_len", false)?,
    })
}

/// One `requests[]` record: a request (and whether the run marked it `has_error`), or a
/// failed one whose lengths were lost.
enum Replayed {
    Request(RequestSpec, bool),
    Lost(LostRequest),
}

/// Reads one `requests[]` record; errors are `(key, problem)`.
fn replay_request(
    record: &Value,
    config: &ReplayConfig,
) -> Result<Replayed, (&'static str, String)> {
    let Value::Object(object) = record else {
        return Err(("", "expected a JSON object".to_owned()));
    };
    let number = |key: &'static str| -> Result<u64, (&'static str, String)> {
        match object.get(key) {
            None | Some(Value::Null) => Err((key, "missing (required)".to_owned())),
            Some(value) => value
                .as_u64()
                .ok_or_else(|| (key, format!("expected a non-negative integer, got {value}"))),
        }
    };
    let tokens = |key: &'static str| -> Result<u32, (&'static str, String)> {
        let value = number(key)?;
        u32::try_from(value).map_err(|_| (key, format!("{value} is too large")))
    };
    let index = number("index")?;
    let arrival_us = number("arrival_time_us")?;
    let input_tokens = tokens("input_tokens")?;
    let output_tokens = tokens("output_tokens")?;
    let has_error = match object.get("has_error") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(flag)) => *flag,
        Some(other) => return Err(("has_error", format!("expected a boolean, got {other}"))),
    };
    if input_tokens == 0 && has_error {
        // The client failed before it saw the prompt's token count (e.g. its timeout).
        return Ok(Replayed::Lost(LostRequest {
            id: RequestId(index),
            arrival_us,
        }));
    }
    if input_tokens == 0 {
        return Err((
            "input_tokens",
            "must be >= 1 (0 only with has_error: a failed request)".to_owned(),
        ));
    }
    let group = match object.get("prefix_group") {
        None | Some(Value::Null) => None,
        Some(Value::String(label)) => group_id(label),
        Some(Value::Number(number)) => number.as_u64(),
        Some(other) => {
            return Err(("prefix_group", format!("expected a string, got {other}")));
        }
    };
    let mut request = RequestSpec::synthetic(index, arrival_us, input_tokens, output_tokens);
    if let Some(group) = group {
        // A measured prompt may be shorter than the nominal system prompt: clamp.
        request = request.with_prefix(group, config.system_prompt_len.min(input_tokens));
    }
    Ok(Replayed::Request(request, has_error))
}
