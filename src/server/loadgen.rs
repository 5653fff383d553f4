//! Why a loopback load run against the real server (`server::load`, run by `ditto bench`'s
//! load case and tests/server_load.rs) failed. The load generators themselves are
//! `bench`'s (`src/bench/loadgen/`).

use thiserror::Error;

use crate::server::error::ServeError;

/// Why a load run failed.
#[derive(Debug, Error)]
pub enum LoadgenError {
    /// The server could not start.
    #[error(transparent)]
    Serve(#[from] ServeError),
    /// The async runtime could not start.
    #[error("runtime: {0}")]
    Runtime(#[from] std::io::Error),
    /// A call failed.
    #[error("{0}")]
    Rpc(String),
}
