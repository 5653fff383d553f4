#![allow(clippy::unwrap_used)]
//! The drain defaults of `ditto serve`: a call the server accepted before SIGTERM is never
//! cut by the default drain, whatever `--max-call-ms` is, and an explicit `--drain-ms` wins.
//! (The drain itself is exercised on the real binary by tests/python/test_lifecycle.py.)

use clap::Parser;
use ditto::cli::{Cli, Command};
use std::time::Duration;

fn resolved(flags: &[&str]) -> ditto::server::ServerOptions {
    let cli = Cli::try_parse_from(["ditto", "serve"].iter().chain(flags)).unwrap();
    let Command::Serve(args) = cli.command else {
        panic!("parsed as serve")
    };
    ditto::cli::serve::options(&args).unwrap()
}

#[test]
fn the_default_drain_covers_the_longest_call() {
    let options = resolved(&[]);
    assert!(options.drain > options.service.max_call, "{options:?}");
    let options = resolved(&["--max-call-ms", "90000"]);
    assert_eq!(options.service.max_call, Duration::from_secs(90));
    assert!(options.drain > options.service.max_call, "{options:?}");
}

#[test]
fn an_explicit_drain_wins() {
    let options = resolved(&["--drain-ms", "1500"]);
    assert_eq!(options.drain, Duration::from_millis(1500));
}
