//! The one error type of the workload layer.
//!
//! Every error names where it happened: a field path in the YAML spec
//! (`clients[1].input_tokens.stdev`), or a line and column in a trace file, so a user can fix
//! the input without reading code. Knows nothing about how the CLI reports errors.

/// Why a workload spec or trace was rejected.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum WorkloadError {
    /// The YAML text is not a well-formed spec (syntax, unknown field, wrong type).
    #[error("invalid workload spec: {message}")]
    Yaml {
        /// The parser's message, including its own location.
        message: String,
    },
    /// A spec field holds a value that makes no sense (negative rate, `min > max`, ...).
    #[error("{path}: {message}")]
    Invalid {
        /// Dotted field path, e.g. `clients[1].input_tokens.stdev`.
        path: String,
        /// What is wrong and what is allowed.
        message: String,
    },
    /// A CSV or JSONL trace line could not be read at all (wrong field count, bad JSON).
    #[error("trace line {line}: {message}")]
    TraceLine {
        /// 1-based line number in the trace text.
        line: u64,
        /// What is wrong.
        message: String,
    },
    /// A CSV or JSONL trace field holds a bad value.
    #[error("trace line {line}, column `{column}`: {message}")]
    TraceField {
        /// 1-based line number in the trace text.
        line: u64,
        /// The column (CSV header name or JSON key).
        column: String,
        /// What is wrong.
        message: String,
    },
    /// A `replay_requests.json` request holds a bad value.
    #[error("trace requests[{position}]{}: {message}", dotted(field))]
    ReplayRecord {
        /// 0-based position in the `requests` array.
        position: u64,
        /// The offending key (empty when the record itself is malformed).
        field: String,
        /// What is wrong.
        message: String,
    },
    /// A trace as a whole is unusable (no header, no requests, unknown file type).
    #[error("trace: {message}")]
    Trace {
        /// What is wrong.
        message: String,
    },
}

impl WorkloadError {
    /// Shorthand for [`WorkloadError::Invalid`].
    pub(crate) fn invalid(path: impl Into<String>, message: impl Into<String>) -> Self {
        WorkloadError::Invalid {
            path: path.into(),
            message: message.into(),
        }
    }

    /// Shorthand for [`WorkloadError::TraceField`].
    pub(crate) fn field(line: u64, column: &str, message: impl Into<String>) -> Self {
        WorkloadError::TraceField {
            line,
            column: column.to_owned(),
            message: message.into(),
        }
    }
}

/// `.key`, or nothing for an empty key (the record as a whole).
fn dotted(field: &str) -> String {
    if field.is_empty() {
        String::new()
    } else {
        format!(".{field}")
    }
}
