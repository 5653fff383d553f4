//! The `ditto` binary, run to completion.

use std::process::{Command, Output};

/// Runs `ditto ARGS` and returns its exit status and output.
pub fn ditto(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ditto"))
        .args(args)
        .output()
        .unwrap()
}
