//! Architecture invariants, read off the sources by path, not by substring: every `use`
//! tree (expanded, `self`/`super`/`crate` resolved to absolute paths, aliases followed),
//! `extern crate` and path expression (`tokio::spawn`, `std::fs::read`, `crate::server::x`,
//! also inside macro calls) of the non-test code of `src/sim`, `src/twin`, `src/cluster`
//! and `src/workload` is checked against what that layer may know:
//!
//! - `src/sim` is pure: `std` (no I/O, clock, environment, threads or processes), and of
//!   other crates only `rand_chacha`/`rand_core` and `thiserror`; of this crate only
//!   `crate::sim`; no printing, no `static mut`, no `thread_local!`.
//! - `src/twin`, `src/cluster` and `src/workload` are fed, never fetching: no async runtime,
//!   RPC, HTTP, Kubernetes or serialisation-to-wire crate, no file, network, environment or
//!   process access, no wall clock (`SystemTime`); none of `crate::server`, `live`,
//!   `telemetry`, `cli`. `src/twin` reads `Instant` only to stop a simulation at its
//!   deadline (`twin/limits.rs`, `twin/run.rs`).
//!
//! Crates are recognised by name from Cargo.toml's dependencies, so a new dependency is
//! forbidden in these layers until it is allowed here.
//!
//! The sources are read by `tests/common/rust_source.rs`, shared with `tests/no_cycles.rs`.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::path::Path;

use proc_macro2::TokenTree;

#[path = "common/rust_source.rs"]
mod rust_source;

use rust_source::{Named, file_tokens, module_path, non_test_files, resolve, source_tokens};

/// What one layer may know.
struct Rules {
    /// The folder under `src/`.
    dir: &'static str,
    /// Other crates it may use (besides std, core, alloc).
    crates: &'static [&'static str],
    /// `crate::<module>` it may use (`None`: any but `forbidden_modules`).
    modules: Option<&'static [&'static str]>,
    /// `crate::<module>` it may not use.
    forbidden_modules: &'static [&'static str],
    /// `std` paths it may not use (a path equal to or below one of these), with the files
    /// (relative to the folder) allowed one anyway.
    forbidden_std: &'static [(&'static str, &'static [&'static str])],
    /// Macros it may not call.
    forbidden_macros: &'static [&'static str],
}

const EDGE_MODULES: &[&str] = &["server", "live", "telemetry", "cli"];

const FED_STD: &[(&str, &[&str])] = &[
    ("std::fs", &[]),
    ("std::net", &[]),
    ("std::env", &[]),
    ("std::process", &[]),
    ("std::os", &[]),
    ("std::time::SystemTime", &[]),
    ("std::time::UNIX_EPOCH", &[]),
    ("std::io::stdin", &[]),
    ("std::io::stdout", &[]),
    ("std::io::stderr", &[]),
];

const SIM: Rules = Rules {
    dir: "sim",
    crates: &["rand_chacha", "rand_core", "thiserror"],
    modules: Some(&["sim"]),
    forbidden_modules: &[],
    forbidden_std: &[
        ("std::fs", &[]),
        ("std::net", &[]),
        ("std::env", &[]),
        ("std::process", &[]),
        ("std::os", &[]),
        ("std::thread", &[]),
        ("std::io", &[]),
        ("std::time::Instant", &[]),
        ("std::time::SystemTime", &[]),
        ("std::time::UNIX_EPOCH", &[]),
        ("std::sync::Mutex", &[]),
        ("std::sync::RwLock", &[]),
    ],
    forbidden_macros: &[
        "println",
        "eprintln",
        "print",
        "eprint",
        "dbg",
        "thread_local",
    ],
};

const TWIN: Rules = Rules {
    dir: "twin",
    crates: &[
        "rand_chacha",
        "rand_core",
        "thiserror",
        "foldhash",
        "imbl",
        "rayon",
    ],
    modules: None,
    forbidden_modules: EDGE_MODULES,
    forbidden_std: &[
        ("std::fs", &[]),
        ("std::net", &[]),
        ("std::env", &[]),
        ("std::process", &[]),
        ("std::os", &[]),
        ("std::time::SystemTime", &[]),
        ("std::time::UNIX_EPOCH", &[]),
        ("std::time::Instant", &["limits.rs", "run.rs"]),
        ("std::io::stdin", &[]),
        ("std::io::stdout", &[]),
        ("std::io::stderr", &[]),
    ],
    forbidden_macros: &["println", "eprintln", "print", "eprint", "dbg"],
};

const CLUSTER: Rules = Rules {
    dir: "cluster",
    crates: &[
        "rand_chacha",
        "rand_core",
        "thiserror",
        "serde",
        "serde_saphyr",
    ],
    modules: None,
    forbidden_modules: EDGE_MODULES,
    forbidden_std: FED_STD,
    forbidden_macros: &["println", "eprintln", "print", "eprint", "dbg"],
};

const WORKLOAD: Rules = Rules {
    dir: "workload",
    crates: &[
        "rand_chacha",
        "rand_core",
        "rand_distr",
        "thiserror",
        "serde",
        "serde_json",
        "serde_saphyr",
    ],
    modules: None,
    forbidden_modules: EDGE_MODULES,
    forbidden_std: FED_STD,
    forbidden_macros: &["println", "eprintln", "print", "eprint", "dbg"],
};

/// The crate names of Cargo.toml's dependency tables (`-` read as `_`).
fn dependency_crates() -> Vec<String> {
    let manifest =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml")).unwrap();
    let mut names = Vec::new();
    let mut in_deps = false;
    for line in manifest.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            in_deps = line.ends_with("dependencies]");
            if let Some(name) = line
                .strip_prefix("[dependencies.")
                .or_else(|| line.strip_prefix("[dev-dependencies."))
            {
                names.push(name.trim_end_matches(']').replace('-', "_"));
            }
            continue;
        }
        if in_deps && let Some((key, _)) = line.split_once('=') {
            let key = key.trim();
            if !key.is_empty() && !key.starts_with('#') {
                names.push(key.replace('-', "_"));
            }
        }
    }
    names.sort();
    names.dedup();
    assert!(names.iter().any(|n| n == "tokio"), "{names:?}");
    names
}

/// Resolves a path read in `module` (a path below the crate) to an absolute one: this
/// crate's items as `crate::...`, other crates' by their name, a leading alias followed
/// through `aliases`; a global path (`::hyper::x`) without its empty first segment.
fn absolute(
    segments: &[String],
    module: &[String],
    aliases: &BTreeMap<String, Vec<String>>,
) -> Vec<String> {
    let in_crate = |below: Vec<String>| -> Vec<String> {
        std::iter::once("crate".to_owned()).chain(below).collect()
    };
    let Some(first) = segments.first() else {
        return Vec::new();
    };
    match first.as_str() {
        "" => segments[1..].to_vec(),
        "crate" | "self" | "super" => resolve(segments, module).map_or_else(Vec::new, in_crate),
        name => match aliases.get(name) {
            Some(target) if target.first().is_some_and(|s| s != name) => {
                target.iter().chain(&segments[1..]).cloned().collect()
            }
            // A crate (std or a dependency) or, as Rust resolves a path's first name, an
            // item of this module (a child module, a type).
            _ if is_crate(name) => segments.to_vec(),
            _ => in_crate(module.iter().chain(segments).cloned().collect()),
        },
    }
}

/// Whether `name` names a crate: std's, or a dependency of Cargo.toml.
fn is_crate(name: &str) -> bool {
    matches!(name, "std" | "core" | "alloc") || DEPENDENCIES.with(|d| d.iter().any(|c| c == name))
}

thread_local! {
    static DEPENDENCIES: Vec<String> = dependency_crates();
}

/// Every path `named` names, absolute: its `use` paths (each alias then known), then its
/// path expressions.
fn absolute_paths(named: &Named, module: &[String]) -> Vec<Vec<String>> {
    let mut aliases = BTreeMap::new();
    let mut found = Vec::new();
    for used in &named.uses {
        let resolved = absolute(&used.path, module, &BTreeMap::new());
        aliases.insert(used.name.clone(), resolved.clone());
        found.push(resolved);
    }
    for path in &named.paths {
        found.push(absolute(path, module, &aliases));
    }
    found
}

/// Every path or macro of `rules.dir`'s non-test code its rules forbid, as
/// `file: path (why)`.
fn violations(rules: &Rules) -> Vec<String> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let dir = src.join(rules.dir);
    let files = non_test_files(&dir);
    assert!(files.len() > 3, "expected {}'s sources", rules.dir);
    let crates = dependency_crates();
    let mut out = Vec::new();
    for file in &files {
        let local = file
            .strip_prefix(&dir)
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let tokens = file_tokens(file);
        let named = Named::of(&tokens);
        for segments in absolute_paths(&named, &module_path(&src, file)) {
            let Some(first) = segments.first() else {
                continue;
            };
            let joined = segments.join("::");
            let why = if first == "crate" {
                let module = segments.get(1).map_or("", String::as_str);
                let allowed = match rules.modules {
                    Some(modules) => modules.contains(&module),
                    None => !rules.forbidden_modules.contains(&module),
                };
                (!allowed && !module.is_empty()).then_some("a module of the edge or another layer")
            } else if first == "std" || first == "core" || first == "alloc" {
                let std_path = format!("std::{}", segments[1..].join("::"));
                rules
                    .forbidden_std
                    .iter()
                    .find(|(forbidden, allowed_in)| {
                        (std_path == *forbidden || std_path.starts_with(&format!("{forbidden}::")))
                            && !allowed_in.contains(&local.as_str())
                    })
                    .map(|_| "I/O, the clock, the environment or threads")
            } else if crates.contains(first) && !rules.crates.contains(&first.as_str()) {
                Some("a crate this layer may not use")
            } else {
                None
            };
            if let Some(why) = why {
                out.push(format!("{}: {joined} ({why})", file.display()));
            }
        }
        for name in &named.macros {
            if rules.forbidden_macros.contains(&name.as_str()) {
                out.push(format!(
                    "{}: {name}! (printing or thread-locals)",
                    file.display()
                ));
            }
        }
        if rules.dir == "sim" && has_static_mut(&tokens) {
            out.push(format!("{}: static mut (global state)", file.display()));
        }
    }
    out
}

fn has_static_mut(tokens: &[TokenTree]) -> bool {
    tokens.windows(2).any(|pair| {
        matches!(pair, [TokenTree::Ident(a), TokenTree::Ident(b)] if a == "static" && b == "mut")
    }) || tokens.iter().any(|t| match t {
        TokenTree::Group(group) => {
            has_static_mut(&group.stream().into_iter().collect::<Vec<_>>())
        }
        _ => false,
    })
}

fn assert_pure(rules: &Rules) {
    let found = violations(rules);
    assert!(
        found.is_empty(),
        "src/{} uses what its layer may not:\n{}",
        rules.dir,
        found.join("\n")
    );
}

#[test]
fn sim_uses_no_io_clock_env_or_outer_layers() {
    assert_pure(&SIM);
}

#[test]
fn twin_is_fed_and_never_fetches() {
    assert_pure(&TWIN);
}

#[test]
fn cluster_is_fed_and_never_fetches() {
    assert_pure(&CLUSTER);
}

#[test]
fn workload_is_fed_and_never_fetches() {
    assert_pure(&WORKLOAD);
}

/// The guard itself: the forms a forbidden use can take are all seen.
#[test]
fn the_guard_sees_uses_paths_aliases_and_macros() {
    let src = Path::new("/src");
    let module = module_path(src, Path::new("/src/sim/engine/lazy.rs"));
    assert_eq!(module, ["sim", "engine", "lazy"]);
    let text = "use tokio::{self as rt, sync::{mpsc, Mutex as M}};\n\
                use super::super::super::server::x;\n\
                use std::time;\n\
                fn f() { let t = time::Instant::now(); ::hyper::x(); rt::spawn(async {}); \
                println!(\"{}\", crate::live::y); }\n\
                #[cfg(test)] mod tests { use kube::Api; }";
    let named = Named::of(&source_tokens(text).unwrap());
    let all: Vec<String> = absolute_paths(&named, &module)
        .iter()
        .map(|path| path.join("::"))
        .collect();
    for expected in [
        "tokio",
        "tokio::sync::mpsc",
        "tokio::sync::Mutex",
        "crate::server::x",
        "std::time",
        "std::time::Instant::now",
        "hyper::x",
        "tokio::spawn",
        "crate::live::y",
    ] {
        assert!(
            all.iter().any(|p| p == expected),
            "{expected} not in {all:?}"
        );
    }
    assert!(!all.iter().any(|p| p.starts_with("kube")), "{all:?}");
    assert!(named.macros.iter().any(|m| m == "println"));
}

/// Only the edge (`server`, `live`, `telemetry` and the benchmark and load cases in `bench`)
/// knows the async runtime and the RPC and HTTP stacks: the CLI, the catalog, fidelity and
/// the metrics text reader reach them only through those modules' functions.
#[test]
fn only_the_edge_knows_tokio_and_the_wire() {
    const EDGE_CRATES: &[&str] = &[
        "tokio",
        "tokio_stream",
        "tokio_rustls",
        "tonic",
        "tonic_prost",
        "tonic_health",
        "tonic_reflection",
        "prost",
        "hyper",
        "hyper_util",
        "axum",
        "kube",
        "k8s_openapi",
        "zeromq",
    ];
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut found = Vec::new();
    for dir in [
        "cli",
        "catalog",
        "fidelity",
        "prom_text",
        "workload",
        "cluster",
    ] {
        let files = non_test_files(&src.join(dir));
        assert!(!files.is_empty(), "src/{dir}");
        for file in files {
            let named = Named::of(&file_tokens(&file));
            for path in absolute_paths(&named, &module_path(&src, &file)) {
                if path
                    .first()
                    .is_some_and(|first| EDGE_CRATES.contains(&first.as_str()))
                {
                    found.push(format!("{}: {}", file.display(), path.join("::")));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "the edge's crates outside it:\n{}",
        found.join("\n")
    );
}
