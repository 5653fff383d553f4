//! `ditto serve`: runs the twin's gRPC server (and its HTTP metrics/health side) until
//! SIGTERM or SIGINT.
//!
//! With no flags it serves the embedded default cluster (4 x llama-3.1-8b-instruct on H100)
//! on 0.0.0.0:9010 (gRPC) and 0.0.0.0:9011 (HTTP), ready at once. Every flag has a
//! `DITTO_*` environment equivalent. Exit codes: 0 after a graceful shutdown, 2 for a bad
//! flag, cluster file, model config, kubeconfig, TLS or calibration file (checked before
//! anything binds, the message naming the flag or field, as every other ditto command and
//! clap itself do), 1 when the server cannot start or fails. With `--check-config FILE` it only
//! validates (see `cli::check_config`): exit 0, or 2 naming the field.

use std::io::Write as _;
use std::process::ExitCode;

pub use super::error::ServeCommandError;
pub use super::serve_args::ServeArgs;
pub use super::serve_options::options;
use crate::server::serve_until_signal;

/// Writes a diagnostic line to stderr; a closed stderr must not turn a clean stop into a
/// panic.
fn say(line: &str) {
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// Runs `ditto serve` and returns the process exit code.
pub fn main(args: &ServeArgs) -> ExitCode {
    if let Some(file) = &args.check_config {
        return crate::cli::check_config::main(args, file);
    }
    let tracing_setup = crate::telemetry::init_logs_and_traces(&args.log);
    if !tracing_setup.logging {
        say(&format!(
            "warning: --log {:?} is not a valid filter; logging is off",
            args.log
        ));
    }
    if let Some(err) = &tracing_setup.traces_error {
        say(&format!("warning: {err}; traces are off"));
    }
    let outcome = options(args).and_then(|options| {
        serve_until_signal(options, |grpc, http, metrics| {
            let metrics = metrics.map_or_else(String::new, |addr| format!(", metrics on {addr}"));
            say(&format!(
                "ditto serve: gRPC on {grpc}, HTTP on {http}{metrics} (ready)"
            ));
        })
        .map_err(ServeCommandError::from)
    });
    // The server stopped: flush the last spans (blocks briefly, outside any runtime).
    drop(tracing_setup);
    match outcome {
        Ok(()) => {
            say("ditto serve: stopped");
            ExitCode::SUCCESS
        }
        Err(err) => {
            say(&format!("error: {err}"));
            ExitCode::from(err.exit_code())
        }
    }
}
