//! Security flags of `ditto serve` (flattened into it): bearer-token authentication and TLS.
//!
//! The token itself is never a flag: it comes from the file named by `--auth-token-file` /
//! `DITTO_AUTH_TOKEN_FILE` (a mounted Secret) or from the `DITTO_AUTH_TOKEN` environment
//! variable, so it never shows in `ps`.

use std::path::PathBuf;

use clap::Args;

use super::error::ServeCommandError;
use crate::server::auth::{AuthPolicy, BearerToken, TOKEN_ENV};
use crate::server::tls::TlsFiles;

/// Authentication and TLS flags.
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
    /// Without a token, also accept writes (gRPC SyncClusterConfig, Push*,
    /// AddTrainingSamples; HTTP /add_training_data_bulk, /flush, /reload) from peers other
    /// than loopback. Off: only the pod or host itself may write (others get 403 /
    /// PERMISSION_DENIED). No effect with a token, which then decides.
    #[arg(long, env = "DITTO_ALLOW_REMOTE_WRITES")]
    pub allow_remote_writes: bool,
    /// PEM certificate chain: serve gRPC and HTTP over TLS (needs --tls-key-file). Plain
    /// TCP without it.
    #[arg(long, env = "DITTO_TLS_CERT_FILE", value_name = "FILE")]
    pub tls_cert_file: Option<PathBuf>,
    /// PEM private key of the TLS certificate.
    #[arg(long, env = "DITTO_TLS_KEY_FILE", value_name = "FILE")]
    pub tls_key_file: Option<PathBuf>,
    /// PEM CA for mutual TLS: gRPC clients must present a certificate it signed (HTTP
    /// verifies one when offered, so probes keep working).
    #[arg(long, env = "DITTO_TLS_CLIENT_CA_FILE", value_name = "FILE")]
    pub tls_client_ca_file: Option<PathBuf>,
}

impl SecurityArgs {
    /// The TLS files, if TLS is on; the files themselves are read when the server starts.
    pub fn tls(&self) -> Result<Option<TlsFiles>, ServeCommandError> {
        match (&self.tls_cert_file, &self.tls_key_file) {
            (None, None) if self.tls_client_ca_file.is_some() => Err(ServeCommandError::BadFlag {
                flag: "tls-client-ca-file",
                reason: "needs --tls-cert-file and --tls-key-file".to_owned(),
            }),
            (None, None) => Ok(None),
            (Some(_), None) => Err(ServeCommandError::BadFlag {
                flag: "tls-key-file",
                reason: "missing: --tls-cert-file needs it".to_owned(),
            }),
            (None, Some(_)) => Err(ServeCommandError::BadFlag {
                flag: "tls-cert-file",
                reason: "missing: --tls-key-file needs it".to_owned(),
            }),
            (Some(cert), Some(key)) => Ok(Some(TlsFiles {
                cert: cert.clone(),
                key: key.clone(),
                client_ca: self.tls_client_ca_file.clone(),
            })),
        }
    }

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
            remote_writes: self.allow_remote_writes,
        })
    }
}
