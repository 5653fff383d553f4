//! The `ditto` binary: parses flags, runs the command, prints results.
//!
//! Exit codes: 0 success, 1 a run that failed (e.g. its event budget ran out), 2 bad input
//! (unknown flag, bad value, unreadable or invalid file). Results go to stdout; diagnostics
//! and wall time to stderr.

use std::io::Write;
use std::process::ExitCode;
use std::time::Instant;

use clap::Parser;
use ditto::cli::{Cli, CliError, Command, run};

/// mimalloc keeps freed pages for reuse: forks allocate and drop megabyte-sized engine
/// states many times a second, and glibc's heap trimming turned each into page faults.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let outcome = match cli.command {
        Command::Run(args) if args.pd_sweep.is_some() => {
            ditto::cli::pd_sweep::execute(&args).map(|report| {
                let _ = std::io::stdout().lock().write_all(report.as_bytes());
            })
        }
        Command::Run(args) => run_command(&args),
        Command::Serve(args) => return ditto::cli::serve::main(&args),
        Command::Predict(args) => return ditto::cli::predict::main(&args),
        Command::Bench(args) => ditto::cli::bench::execute(&args).map(|report| {
            let _ = std::io::stdout().lock().write_all(report.as_bytes());
        }),
        Command::Validate(args) => ditto::cli::validate::execute(&args).map(|report| {
            let _ = std::io::stdout().lock().write_all(report.as_bytes());
        }),
        Command::Calibrate(args) => ditto::cli::calibrate::execute(&args).map(|report| {
            let _ = std::io::stdout().lock().write_all(report.as_bytes());
        }),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err}");
            ExitCode::from(err.exit_code() as u8)
        }
    }
}

fn run_command(args: &ditto::cli::RunArgs) -> Result<(), CliError> {
    let started = Instant::now();
    let result = run::execute(args)?;
    let wall = started.elapsed();
    if let Some(path) = &args.per_request {
        std::fs::write(path, result.per_request_jsonl()).map_err(|source| CliError::Io {
            path: path.clone(),
            source,
        })?;
    }
    let mut stdout = std::io::stdout().lock();
    // A closed pipe (e.g. `| head`) is not an error worth a panic.
    let _ = stdout.write_all(result.summary_json().as_bytes());
    let (counts, events) = result.totals();
    eprintln!(
        "ditto run: {} requests, {} steps, {} events in {:.3} s wall ({:.0} simulated requests/s)",
        counts.injected,
        counts.steps,
        events,
        wall.as_secs_f64(),
        counts.injected as f64 / wall.as_secs_f64().max(1e-9)
    );
    Ok(())
}
