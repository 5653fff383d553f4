//! Errors of the command line, each naming the flag or file at fault.

use std::path::PathBuf;

use thiserror::Error;

use crate::catalog::CatalogError;
use crate::server::ServeError;
use crate::sim::SimError;
use crate::sim::capacity::CapacityError;
use crate::workload::WorkloadError;

/// What went wrong in a command.
#[derive(Debug, Error)]
pub enum CliError {
    /// A flag has a value that cannot be used.
    #[error("--{flag}: {reason}")]
    BadFlag {
        /// The flag's name without dashes.
        flag: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// A file could not be read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A file could not be parsed.
    #[error("{path}: {reason}")]
    BadFile {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// An unknown model or GPU, or unusable reference data.
    #[error(transparent)]
    Catalog(#[from] CatalogError),
    /// KV capacity cannot be derived.
    #[error("KV capacity: {0}")]
    Capacity(#[from] CapacityError),
    /// The workload spec is invalid.
    #[error("workload: {0}")]
    Workload(#[from] WorkloadError),
    /// The simulation refused an input or ran out of budget.
    #[error("simulation: {0}")]
    Sim(#[from] SimError),
}

impl CliError {
    /// The process exit code: 2 for bad input (flags, files, specs), 1 for a failed run.
    pub fn exit_code(&self) -> i32 {
        match self {
            CliError::Sim(SimError::EventBudgetExhausted { .. }) => 1,
            _ => 2,
        }
    }

    /// A bad-flag error.
    pub fn flag(flag: &'static str, reason: impl Into<String>) -> Self {
        CliError::BadFlag {
            flag,
            reason: reason.into(),
        }
    }
}

/// Exit code of bad input: a flag, file or config that would not run or serve.
pub const EXIT_INVALID: u8 = 2;

/// Why `ditto serve` stopped with an error.
#[derive(Debug, Error)]
pub enum ServeCommandError {
    /// A flag has an unusable value.
    #[error("--{flag}: {reason}")]
    BadFlag {
        /// The flag.
        flag: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// A live-mirror flag has an unusable value.
    #[error("--{flag}: {reason}")]
    BadLiveFlag {
        /// The flag.
        flag: String,
        /// What is wrong.
        reason: String,
    },
    /// The cluster file cannot be read or used.
    #[error("--config {path}: {reason}")]
    BadConfig {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The server failed.
    #[error(transparent)]
    Serve(#[from] ServeError),
}

impl ServeCommandError {
    /// 64 for bad flags or config (EX_USAGE), 1 otherwise.
    pub fn exit_code(&self) -> u8 {
        match self {
            ServeCommandError::BadFlag { .. }
            | ServeCommandError::BadLiveFlag { .. }
            | ServeCommandError::BadConfig { .. }
            | ServeCommandError::Serve(ServeError::Config(_))
            | ServeCommandError::Serve(ServeError::Tls(_)) => EXIT_INVALID,
            ServeCommandError::Serve(_) => 1,
        }
    }
}
