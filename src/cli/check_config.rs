//! `ditto serve --check-config FILE`: validates a cluster config (and every other serve
//! flag) exactly as `ditto serve` would at startup, then exits without binding anything.
//!
//! Why: a Helm chart or kustomize overlay renders the flags and the ConfigMap separately
//! from the binary; running them through this check in CI (and in an init step, if wanted)
//! keeps chart and binary from drifting apart. Exit 0 when the config would serve, 2 with
//! the flag or field path named when it would not.

use std::io::Write as _;
use std::path::Path;
use std::process::ExitCode;

use super::error::ServeCommandError;
use super::serve_args::ServeArgs;
use super::serve_options::options;
use crate::twin::store::MirrorStore;

/// Exit code of a config that would not serve (the CLI's bad-input code).
pub use super::error::EXIT_INVALID;

/// What a config that passed the check holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CheckedConfig {
    /// Instances in the cluster file.
    pub instances: usize,
    /// Live-mirror pod sources (0: the instance set is the file's, fed by pushes).
    pub live_sources: usize,
}

/// Resolves `args` with `--config` replaced by `file` and syncs the result into a fresh
/// mirror store, the two steps `ditto serve` takes before it binds.
pub fn check(args: &ServeArgs, file: &Path) -> Result<CheckedConfig, ServeCommandError> {
    let mut args = args.clone();
    args.config = Some(file.to_path_buf());
    args.check_config = None;
    let options = options(&args)?;
    // The TLS files as the server would load them (a bad key fails here, not at startup).
    if let Some(files) = &options.tls {
        crate::server::tls::TlsAcceptors::load(files).map_err(crate::server::ServeError::from)?;
    }
    let store = MirrorStore::new(options.store);
    // With live sources the pods make the instance set at run time; the file's pools (the
    // sources' engine settings) are still checked by syncing them once.
    let live_sources = options.live.as_ref().map_or(0, |live| live.sources.len());
    let initial = match options.initial_config {
        Some(initial) => Some((initial.cluster, initial.settings)),
        None => options.live.map(|live| (live.cluster, live.settings)),
    };
    let mut instances = 0;
    if let Some((cluster, settings)) = initial {
        instances = cluster.instances.len();
        store
            .sync_config(cluster, settings, Vec::new())
            .map_err(|err| ServeCommandError::BadConfig {
                path: file.to_path_buf(),
                reason: err.to_string(),
            })?;
    }
    Ok(CheckedConfig {
        instances,
        live_sources,
    })
}

/// Runs the check and returns the exit code: 0 (a line on stdout) or 2 (the error on
/// stderr, naming the flag or field).
pub fn main(args: &ServeArgs, file: &Path) -> ExitCode {
    match check(args, file) {
        Ok(checked) => {
            let live = match checked.live_sources {
                0 => String::new(),
                n => format!("; live mirror: {n} pod source(s), instances from the pods"),
            };
            let _ = writeln!(
                std::io::stdout(),
                "{}: ok ({} instances{live})",
                file.display(),
                checked.instances
            );
            ExitCode::SUCCESS
        }
        Err(err) => {
            let _ = writeln!(std::io::stderr(), "error: {err}");
            ExitCode::from(EXIT_INVALID)
        }
    }
}
