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
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use proc_macro2::{Delimiter, Spacing, TokenStream, TokenTree};

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

/// A module's absolute path (`crate::sim::engine::lazy`) from its file.
fn module_path(src: &Path, file: &Path) -> Vec<String> {
    let relative = file.strip_prefix(src).unwrap();
    let mut segments: Vec<String> = vec!["crate".to_owned()];
    for part in relative.iter() {
        let part = part.to_str().unwrap();
        let stem = part.strip_suffix(".rs").unwrap_or(part);
        if stem != "mod" {
            segments.push(stem.to_owned());
        }
    }
    segments
}

/// One path found in a file, absolute.
struct Found {
    segments: Vec<String>,
}

/// Tokens of a file minus `#[cfg(test)]` items.
fn without_tests(tokens: Vec<TokenTree>) -> Vec<TokenTree> {
    let mut out = Vec::with_capacity(tokens.len());
    let mut index = 0;
    while index < tokens.len() {
        if let (TokenTree::Punct(hash), Some(TokenTree::Group(group))) =
            (&tokens[index], tokens.get(index + 1))
            && hash.as_char() == '#'
            && group.delimiter() == Delimiter::Bracket
            && group.stream().to_string().replace(' ', "") == "cfg(test)"
        {
            // Skip the attribute and its item: to its body (a brace group) or its `;`.
            index += 2;
            while index < tokens.len() {
                match &tokens[index] {
                    TokenTree::Group(g) if g.delimiter() == Delimiter::Brace => break,
                    TokenTree::Punct(p) if p.as_char() == ';' => break,
                    _ => index += 1,
                }
            }
            index += 1;
            continue;
        }
        out.push(tokens[index].clone());
        index += 1;
    }
    out
}

fn is_path_sep(tokens: &[TokenTree], index: usize) -> bool {
    matches!((tokens.get(index), tokens.get(index + 1)),
        (Some(TokenTree::Punct(a)), Some(TokenTree::Punct(b)))
            if a.as_char() == ':' && a.spacing() == Spacing::Joint && b.as_char() == ':')
}

/// Expands the use tree starting at `tokens[index]` (after `use`) under `prefix`.
fn use_tree(tokens: &[TokenTree], prefix: &[String], found: &mut Vec<(Vec<String>, String)>) {
    let mut path = prefix.to_vec();
    let mut index = 0;
    if is_path_sep(tokens, 0) {
        path.push(String::new());
        index = 2;
    }
    while index < tokens.len() {
        match &tokens[index] {
            TokenTree::Ident(ident) => {
                let name = ident.to_string();
                if name == "as" {
                    if path.last().is_some_and(|s| s == "self") {
                        path.pop();
                    }
                    if let Some(TokenTree::Ident(alias)) = tokens.get(index + 1) {
                        found.push((path.clone(), alias.to_string()));
                    }
                    return;
                }
                path.push(name);
                index += 1;
                if is_path_sep(tokens, index) {
                    index += 2;
                } else {
                    break;
                }
            }
            TokenTree::Group(group) if group.delimiter() == Delimiter::Brace => {
                let inner: Vec<TokenTree> = group.stream().into_iter().collect();
                for part in inner.split(|t| matches!(t, TokenTree::Punct(p) if p.as_char() == ','))
                {
                    if !part.is_empty() {
                        use_tree(part, &path, found);
                    }
                }
                return;
            }
            TokenTree::Punct(p) if p.as_char() == '*' => {
                path.push("*".to_owned());
                break;
            }
            _ => break,
        }
    }
    // A trailing `as` alias after a plain path.
    if let (Some(TokenTree::Ident(kw)), Some(TokenTree::Ident(alias))) =
        (tokens.get(index), tokens.get(index + 1))
        && kw == "as"
    {
        if path.last().is_some_and(|s| s == "self") {
            path.pop();
        }
        found.push((path, alias.to_string()));
        return;
    }
    let name = match path.last().map(String::as_str) {
        Some("self") => {
            path.pop();
            path.last().cloned().unwrap_or_default()
        }
        Some(last) => last.to_owned(),
        None => return,
    };
    found.push((path, name));
}

/// Every use path (with the name it binds) and path expression in `tokens`, recursively;
/// macro names called (`name!`) go to `macros`.
fn walk(
    tokens: &[TokenTree],
    uses: &mut Vec<(Vec<String>, String)>,
    paths: &mut Vec<Vec<String>>,
    macros: &mut Vec<String>,
) {
    let mut index = 0;
    while index < tokens.len() {
        match &tokens[index] {
            TokenTree::Ident(ident) if ident == "use" => {
                let end = tokens[index..]
                    .iter()
                    .position(|t| matches!(t, TokenTree::Punct(p) if p.as_char() == ';'))
                    .map_or(tokens.len(), |offset| index + offset);
                use_tree(&tokens[index + 1..end], &[], uses);
                index = end + 1;
            }
            TokenTree::Ident(ident) if ident == "extern" => {
                if let (Some(TokenTree::Ident(kw)), Some(TokenTree::Ident(name))) =
                    (tokens.get(index + 1), tokens.get(index + 2))
                    && kw == "crate"
                {
                    uses.push((vec![name.to_string()], name.to_string()));
                    index += 3;
                } else {
                    index += 1;
                }
            }
            TokenTree::Ident(ident) => {
                let after_sep = index >= 2 && is_path_sep(tokens, index - 2);
                // `::name` with nothing path-like before it is a global path (`::hyper::x`).
                let global = after_sep
                    && !matches!(
                        index.checked_sub(3).map(|i| &tokens[i]),
                        Some(TokenTree::Ident(_))
                    );
                let global = global
                    && !matches!(index.checked_sub(3).map(|i| &tokens[i]),
                        Some(TokenTree::Punct(p)) if p.as_char() == '>');
                let preceded = after_sep && !global;
                if matches!(tokens.get(index + 1), Some(TokenTree::Punct(p)) if p.as_char() == '!')
                {
                    macros.push(ident.to_string());
                }
                let mut path = vec![ident.to_string()];
                let mut next = index + 1;
                while is_path_sep(tokens, next) {
                    match tokens.get(next + 2) {
                        Some(TokenTree::Ident(segment)) => {
                            path.push(segment.to_string());
                            next += 3;
                        }
                        _ => break,
                    }
                }
                // A lone name is a local (a variable, a type in scope): what it refers to
                // was imported by a `use`, which is checked.
                if !preceded && path.len() > 1 {
                    paths.push(path);
                } else if global {
                    paths.push(std::iter::once(String::new()).chain(path).collect());
                }
                index = next.max(index + 1);
            }
            TokenTree::Group(group) => {
                let inner: Vec<TokenTree> = group.stream().into_iter().collect();
                walk(&inner, uses, paths, macros);
                index += 1;
            }
            _ => index += 1,
        }
    }
}

/// Resolves `crate`/`self`/`super` against `module` and a leading alias against `aliases`.
fn absolute(
    segments: &[String],
    module: &[String],
    aliases: &BTreeMap<String, Vec<String>>,
) -> Vec<String> {
    let Some(first) = segments.first() else {
        return Vec::new();
    };
    match first.as_str() {
        "" => segments[1..].to_vec(),
        "crate" => segments.to_vec(),
        "self" => module.iter().chain(&segments[1..]).cloned().collect(),
        "super" => {
            let mut base = module.to_vec();
            let mut rest = segments;
            while rest.first().is_some_and(|s| s == "super") {
                base.pop();
                rest = &rest[1..];
            }
            base.into_iter().chain(rest.iter().cloned()).collect()
        }
        name => match aliases.get(name) {
            Some(target) if target.first().is_some_and(|s| s != name) => {
                target.iter().chain(&segments[1..]).cloned().collect()
            }
            // A crate (std or a dependency) or, as Rust resolves a path's first name, an
            // item of this module (a child module, a type).
            _ if is_crate(name) => segments.to_vec(),
            _ => module.iter().chain(segments).cloned().collect(),
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

fn found_in(src: &Path, file: &Path) -> (Vec<Found>, Vec<String>) {
    let text = std::fs::read_to_string(file).unwrap();
    let tokens: Vec<TokenTree> = TokenStream::from_str(&text)
        .unwrap_or_else(|err| panic!("{}: {err:?}", file.display()))
        .into_iter()
        .collect();
    let tokens = without_tests(tokens);
    let (mut uses, mut paths, mut macros) = (Vec::new(), Vec::new(), Vec::new());
    walk(&tokens, &mut uses, &mut paths, &mut macros);
    let module = module_path(src, file);
    let mut aliases = BTreeMap::new();
    let mut found = Vec::new();
    for (path, name) in &uses {
        let resolved = absolute(path, &module, &BTreeMap::new());
        aliases.insert(name.clone(), resolved.clone());
        found.push(Found { segments: resolved });
    }
    for path in &paths {
        found.push(Found {
            segments: absolute(path, &module, &aliases),
        });
    }
    (found, macros)
}

/// Every path or macro of `rules.dir`'s non-test code its rules forbid, as
/// `file: path (why)`.
fn violations(rules: &Rules) -> Vec<String> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let dir = src.join(rules.dir);
    let mut files = Vec::new();
    rust_files(&dir, &mut files);
    // Test modules kept in their own files (`#[cfg(test)] mod tests;`) are test code.
    files.retain(|file| {
        !file
            .strip_prefix(&dir)
            .unwrap()
            .iter()
            .any(|part| part == "tests" || part == "tests.rs")
    });
    files.sort();
    assert!(files.len() > 3, "expected {}'s sources", rules.dir);
    let crates = dependency_crates();
    let mut out = Vec::new();
    for file in &files {
        let local = file
            .strip_prefix(&dir)
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let (found, macros) = found_in(&src, file);
        for path in found {
            let segments = &path.segments;
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
        for name in macros {
            if rules.forbidden_macros.contains(&name.as_str()) {
                out.push(format!(
                    "{}: {name}! (printing or thread-locals)",
                    file.display()
                ));
            }
        }
        let text = std::fs::read_to_string(file).unwrap();
        let tokens: Vec<TokenTree> =
            without_tests(TokenStream::from_str(&text).unwrap().into_iter().collect());
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
    assert_eq!(module, ["crate", "sim", "engine", "lazy"]);
    let text = "use tokio::{self as rt, sync::{mpsc, Mutex as M}};\n\
                use super::super::super::server::x;\n\
                use std::time;\n\
                fn f() { let t = time::Instant::now(); ::hyper::x(); rt::spawn(async {}); \
                println!(\"{}\", crate::live::y); }\n\
                #[cfg(test)] mod tests { use kube::Api; }";
    let tokens = without_tests(TokenStream::from_str(text).unwrap().into_iter().collect());
    let (mut uses, mut paths, mut macros) = (Vec::new(), Vec::new(), Vec::new());
    walk(&tokens, &mut uses, &mut paths, &mut macros);
    let mut aliases = BTreeMap::new();
    let mut all: Vec<String> = Vec::new();
    for (path, name) in &uses {
        let resolved = absolute(path, &module, &BTreeMap::new());
        aliases.insert(name.clone(), resolved.clone());
        all.push(resolved.join("::"));
    }
    for path in &paths {
        all.push(absolute(path, &module, &aliases).join("::"));
    }
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
    assert!(macros.iter().any(|m| m == "println"));
}

/// Only `server`, `live` and `telemetry` know the async runtime and the RPC and HTTP stacks:
/// the CLI, the benchmark cases, the catalog, fidelity and the metrics text reader reach
/// them only through those layers' functions.
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
        "bench",
        "catalog",
        "fidelity",
        "prom_text",
        "workload",
        "cluster",
    ] {
        let mut files = Vec::new();
        rust_files(&src.join(dir), &mut files);
        assert!(!files.is_empty(), "src/{dir}");
        for file in files {
            for path in found_in(&src, &file).0 {
                if path
                    .segments
                    .first()
                    .is_some_and(|first| EDGE_CRATES.contains(&first.as_str()))
                {
                    found.push(format!("{}: {}", file.display(), path.segments.join("::")));
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
