//! Architecture invariant: `src/sim` is pure. It performs no I/O, reads neither the wall
//! clock nor the environment, spawns nothing, uses no ambient randomness and knows nothing
//! about serialisation, async runtimes or the crate's outer layers.
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
    "static mut",
    "thread_local!",
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

#[test]
fn sim_uses_no_io_clock_env_or_outer_layers() {
    let mut files = Vec::new();
    rust_files(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("src/sim"),
        &mut files,
    );
    files.sort();
    assert!(
        files.len() > 10,
        "expected the engine's sources, found {files:?}"
    );
    let mut violations = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        for (number, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            for needle in FORBIDDEN {
                if code.contains(needle) {
                    violations.push(format!("{}:{}: {needle}", file.display(), number + 1));
                }
            }
        }
    }
    assert!(
        violations.is_empty(),
        "impure code in src/sim:\n{}",
        violations.join("\n")
    );
}
