//! Architecture invariants, read off the sources: `src/sim` is pure (no I/O, neither the
//! wall clock nor the environment, nothing spawned, no ambient randomness, nothing of
//! serialisation, async runtimes, networking crates or any other layer of the crate), and
//! `src/twin` is fed, never fetching (no async runtime, network, file or environment
//! access; it reads the clock only to stop a simulation at its deadline).
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};

const FORBIDDEN: &[&str] = &[
    "tokio",
    "std::time",
    "Instant",
    "SystemTime",
    "std::fs",
    "std::env",
    "std::net",
    "std::thread",
    "std::process",
    "thread_rng",
    "OsRng",
    "println!",
    "eprintln!",
    "serde",
    "crate::cli",
    "crate::catalog",
    "crate::workload",
    "crate::server",
    "crate::twin",
    "crate::live",
    "crate::cluster",
    "crate::telemetry",
    "crate::fidelity",
    "crate::prom_text",
    "rayon",
    "tonic",
    "prost",
    "hyper",
    "axum",
    "kube",
    "zeromq",
    "static mut",
    "thread_local!",
];

/// What `src/twin` may not use: it is handed snapshots and questions by the edge.
const TWIN_FORBIDDEN: &[&str] = &[
    "tokio",
    "tonic",
    "prost",
    "hyper",
    "axum",
    "kube",
    "zeromq",
    "reqwest",
    "std::fs",
    "std::env",
    "std::net",
    "std::process",
    "SystemTime",
    "thread_rng",
    "OsRng",
    "println!",
    "eprintln!",
    "crate::server",
    "crate::live",
    "crate::cli",
    "crate::telemetry",
    "static mut",
];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            out.push(path);
        }
    }
}

/// Every `needle` found in the code (comments stripped) of the `.rs` files under `dir`.
fn violations(dir: &str, forbidden: &[&str]) -> Vec<String> {
    let mut files = Vec::new();
    rust_files(&Path::new(env!("CARGO_MANIFEST_DIR")).join(dir), &mut files);
    files.sort();
    assert!(
        files.len() > 10,
        "expected {dir}'s sources, found {files:?}"
    );
    let mut found = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        for (number, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            for needle in forbidden {
                if code.contains(needle) {
                    found.push(format!("{}:{}: {needle}", file.display(), number + 1));
                }
            }
        }
    }
    found
}

#[test]
fn sim_uses_no_io_clock_env_or_outer_layers() {
    let found = violations("src/sim", FORBIDDEN);
    assert!(
        found.is_empty(),
        "impure code in src/sim:\n{}",
        found.join("\n")
    );
}

#[test]
fn twin_is_fed_and_never_fetches() {
    let found = violations("src/twin", TWIN_FORBIDDEN);
    assert!(
        found.is_empty(),
        "I/O or edge code in src/twin:\n{}",
        found.join("\n")
    );
}
