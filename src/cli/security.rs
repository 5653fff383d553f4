//! Security flags of `ditto serve` (flattened into it): bearer-token authentication.
//!
//! The token itself is never a flag: it comes from the file named by `--auth-token-file` /
//! `DITTO_AUTH_TOKEN_FILE` (a mounted Secret) or from the `DITTO_AUTH_TOKEN` environment
//! variable, so it never shows in `ps`.

use std::path::PathBuf;

use clap::Args;

use super::serve::ServeCommandError;
use crate::server::auth::{AuthPolicy, BearerToken, TOKEN_ENV};

/// Authentication flags.
#[derive(Clone, Debug, Args)]
pub struct SecurityArgs {
    /// File holding the bearer token required on writes (SyncClusterConfig, Push*); the
    /// token may instead come from the DITTO_AUTH_TOKEN environment variable. Without
    /// either, authentication is off.
    #[arg(long, env = "DITTO_AUTH_TOKEN_FILE", value_name = "FILE")]
    pub auth_token_file: Option<PathBuf>,
    /// Require the token on reads too (predictions, forecasts, snapshots, /metrics).
    #[arg(long, env = "DITTO_AUTH_READS")]
    pub auth_reads: bool,
}

impl SecurityArgs {
    /// The authentication policy, reading the token file or `DITTO_AUTH_TOKEN`.
    pub fn auth(&self) -> Result<AuthPolicy, ServeCommandError> {
        let value = std::env::var(TOKEN_ENV).ok().filter(|v| !v.is_empty());
        let token = BearerToken::configured(self.auth_token_file.as_deref(), value.as_deref())
            .map_err(|err| ServeCommandError::BadFlag {
                flag: "auth-token-file",
                reason: err.to_string(),
            })?;
        if self.auth_reads && token.is_none() {
            return Err(ServeCommandError::BadFlag {
                flag: "auth-reads",
                reason: "needs a token (DITTO_AUTH_TOKEN_FILE or DITTO_AUTH_TOKEN)".to_owned(),
            });
        }
        Ok(AuthPolicy {
            token,
            reads: self.auth_reads,
        })
    }
}
