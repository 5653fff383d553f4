//! No import cycle inside a folder of `src/`: for every folder, its children (files and
//! subfolders) import one another along a directed acyclic graph, so a reader meets each
//! folder's parts in one order. An import is any `use` tree (expanded, `crate`/`self`/
//! `super` resolved) or `crate::`/`self::`/`super::` path expression of non-test code that
//! names a sibling module; a child importing its folder's `mod.rs` is not a sibling edge.
//!
//! The cycles still known are listed in `KNOWN`, each with why it is there; the test fails
//! on any other cycle, and on a known one that is gone (so the list only shrinks).
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::str::FromStr;

use proc_macro2::{Delimiter, Spacing, TokenStream, TokenTree};

/// Cycles left, as (folder under `src/`, its children in the cycle, why).
const KNOWN: &[(&str, &[&str], &str)] = &[];

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

/// A file's module path below the crate (`src/sim/engine/mod.rs` is `["sim", "engine"]`).
fn module_of(src: &Path, file: &Path) -> Vec<String> {
    file.strip_prefix(src)
        .unwrap()
        .iter()
        .map(|part| {
            let part = part.to_str().unwrap();
            part.strip_suffix(".rs").unwrap_or(part).to_owned()
        })
        .filter(|part| part != "mod" && part != "lib" && part != "main")
        .collect()
}

/// Whether `tokens[index..]` starts with `::`.
fn path_sep(tokens: &[TokenTree], index: usize) -> bool {
    matches!((tokens.get(index), tokens.get(index + 1)),
        (Some(TokenTree::Punct(a)), Some(TokenTree::Punct(b)))
            if a.as_char() == ':' && a.spacing() == Spacing::Joint && b.as_char() == ':')
}

/// `tokens` without `#[cfg(test)]` items (the attribute through the item's body or `;`).
fn strip_tests(tokens: Vec<TokenTree>) -> Vec<TokenTree> {
    let mut kept = Vec::with_capacity(tokens.len());
    let mut index = 0;
    while index < tokens.len() {
        let is_cfg_test = matches!((&tokens[index], tokens.get(index + 1)),
            (TokenTree::Punct(hash), Some(TokenTree::Group(group)))
                if hash.as_char() == '#'
                    && group.delimiter() == Delimiter::Bracket
                    && group.stream().to_string().replace(' ', "") == "cfg(test)");
        if is_cfg_test {
            index += 2;
            while index < tokens.len() {
                let end = match &tokens[index] {
                    TokenTree::Group(g) => g.delimiter() == Delimiter::Brace,
                    TokenTree::Punct(p) => p.as_char() == ';',
                    TokenTree::Ident(_) | TokenTree::Literal(_) => false,
                };
                index += 1;
                if end {
                    break;
                }
            }
            continue;
        }
        kept.push(tokens[index].clone());
        index += 1;
    }
    kept
}

/// The paths of the use tree `tokens` (after `use`, before `;`) under `prefix`.
fn use_paths(tokens: &[TokenTree], prefix: &[String], out: &mut Vec<Vec<String>>) {
    let mut path = prefix.to_vec();
    let mut index = usize::from(path_sep(tokens, 0)) * 2;
    while let Some(token) = tokens.get(index) {
        match token {
            TokenTree::Ident(ident) if ident == "as" => break,
            TokenTree::Ident(ident) => {
                path.push(ident.to_string());
                index += 1;
                if !path_sep(tokens, index) {
                    break;
                }
                index += 2;
            }
            TokenTree::Group(group) if group.delimiter() == Delimiter::Brace => {
                let inner: Vec<TokenTree> = group.stream().into_iter().collect();
                for part in inner.split(|t| matches!(t, TokenTree::Punct(p) if p.as_char() == ','))
                {
                    use_paths(part, &path, out);
                }
                return;
            }
            _ => break,
        }
    }
    if path.last().is_some_and(|last| last == "self") {
        path.pop();
    }
    out.push(path);
}

/// Every `use` path and `crate`/`self`/`super` path expression in `tokens`, recursively.
fn paths_in(tokens: &[TokenTree], out: &mut Vec<Vec<String>>) {
    let mut index = 0;
    while index < tokens.len() {
        match &tokens[index] {
            TokenTree::Ident(ident) if ident == "use" => {
                let end = tokens[index..]
                    .iter()
                    .position(|t| matches!(t, TokenTree::Punct(p) if p.as_char() == ';'))
                    .map_or(tokens.len(), |offset| index + offset);
                use_paths(&tokens[index + 1..end], &[], out);
                index = end + 1;
            }
            TokenTree::Ident(ident)
                if matches!(ident.to_string().as_str(), "crate" | "self" | "super")
                    && path_sep(tokens, index + 1)
                    && !(index >= 2 && path_sep(tokens, index - 2)) =>
            {
                let mut path = vec![ident.to_string()];
                let mut next = index + 1;
                while path_sep(tokens, next) {
                    let Some(TokenTree::Ident(segment)) = tokens.get(next + 2) else {
                        break;
                    };
                    path.push(segment.to_string());
                    next += 3;
                }
                out.push(path);
                index = next;
            }
            TokenTree::Group(group) => {
                let inner: Vec<TokenTree> = group.stream().into_iter().collect();
                paths_in(&inner, out);
                index += 1;
            }
            _ => index += 1,
        }
    }
}

/// `path` as a module path below the crate, if it starts at `crate`, `self` or `super`.
fn resolve(path: &[String], module: &[String]) -> Option<Vec<String>> {
    let (first, rest) = path.split_first()?;
    match first.as_str() {
        "crate" => Some(rest.to_vec()),
        "self" => Some(module.iter().chain(rest).cloned().collect()),
        "super" => {
            let mut base = module.to_vec();
            base.pop()?;
            let mut rest = rest;
            while rest.first().is_some_and(|s| s == "super") {
                base.pop()?;
                rest = &rest[1..];
            }
            Some(base.into_iter().chain(rest.iter().cloned()).collect())
        }
        _ => None,
    }
}

/// Per folder (module path), the sibling edges (child -> child) of its non-test code.
fn edges(src: &Path) -> BTreeMap<Vec<String>, BTreeSet<(String, String)>> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    files.retain(|file| {
        !file
            .strip_prefix(src)
            .unwrap()
            .iter()
            .any(|part| part == "tests" || part == "tests.rs")
    });
    files.sort();
    let modules: BTreeSet<Vec<String>> = files.iter().map(|f| module_of(src, f)).collect();
    let mut found: BTreeMap<Vec<String>, BTreeSet<(String, String)>> = BTreeMap::new();
    for file in &files {
        let module = module_of(src, file);
        let text = std::fs::read_to_string(file).unwrap();
        let tokens = TokenStream::from_str(&text)
            .unwrap_or_else(|err| panic!("{}: {err:?}", file.display()))
            .into_iter()
            .collect();
        let mut paths = Vec::new();
        paths_in(&strip_tests(tokens), &mut paths);
        for target in paths.iter().filter_map(|path| resolve(path, &module)) {
            // The deepest folder holding both: the first segment where they part.
            let common = module
                .iter()
                .zip(&target)
                .take_while(|(a, b)| a == b)
                .count();
            let (Some(from), Some(to)) = (module.get(common), target.get(common)) else {
                continue;
            };
            if modules.contains(&target[..=common]) {
                found
                    .entry(module[..common].to_vec())
                    .or_default()
                    .insert((from.clone(), to.clone()));
            }
        }
    }
    found
}

/// The strongly connected components of more than one node (Tarjan's algorithm).
fn cycles(edges: &BTreeSet<(String, String)>) -> Vec<BTreeSet<String>> {
    struct Walk<'a> {
        next: BTreeMap<&'a str, Vec<&'a str>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        found: Vec<BTreeSet<String>>,
    }
    fn visit<'a>(walk: &mut Walk<'a>, node: &'a str) {
        let number = walk.index.len();
        walk.index.insert(node, number);
        walk.low.insert(node, number);
        walk.stack.push(node);
        for to in walk.next.get(node).cloned().unwrap_or_default() {
            if !walk.index.contains_key(to) {
                visit(walk, to);
                let low = walk.low[node].min(walk.low[to]);
                walk.low.insert(node, low);
            } else if walk.stack.contains(&to) {
                let low = walk.low[node].min(walk.index[to]);
                walk.low.insert(node, low);
            }
        }
        if walk.low[node] == walk.index[node] {
            let mut component = BTreeSet::new();
            while let Some(top) = walk.stack.pop() {
                component.insert(top.to_owned());
                if top == node {
                    break;
                }
            }
            if component.len() > 1 {
                walk.found.push(component);
            }
        }
    }
    let mut walk = Walk {
        next: BTreeMap::new(),
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        found: Vec::new(),
    };
    for (from, to) in edges {
        walk.next.entry(from).or_default().push(to);
    }
    let nodes: Vec<&str> = walk.next.keys().copied().collect();
    for node in nodes {
        if !walk.index.contains_key(node) {
            visit(&mut walk, node);
        }
    }
    walk.found
}

#[test]
fn no_folder_imports_in_a_cycle_but_the_known_ones() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut unexpected = Vec::new();
    let mut seen_known = BTreeSet::new();
    for (folder, folder_edges) in edges(&src) {
        let folder = folder.join("/");
        for cycle in cycles(&folder_edges) {
            let known = KNOWN.iter().position(|(dir, members, _)| {
                *dir == folder && members.iter().map(|m| (*m).to_owned()).eq(cycle.clone())
            });
            match known {
                Some(index) => {
                    seen_known.insert(index);
                }
                None => {
                    let arrows: Vec<String> = folder_edges
                        .iter()
                        .filter(|(a, b)| cycle.contains(a) && cycle.contains(b))
                        .map(|(a, b)| format!("{a} -> {b}"))
                        .collect();
                    unexpected.push(format!("src/{folder}: {}", arrows.join(", ")));
                }
            }
        }
    }
    let gone: Vec<&str> = KNOWN
        .iter()
        .enumerate()
        .filter(|(index, _)| !seen_known.contains(index))
        .map(|(_, (dir, _, _))| *dir)
        .collect();
    assert!(
        unexpected.is_empty(),
        "import cycles inside folders:\n{}",
        unexpected.join("\n")
    );
    assert!(
        gone.is_empty(),
        "known cycles no longer there (remove them from KNOWN): {gone:?}"
    );
}

/// The checker itself: `use` trees, `super` chains and path expressions become edges, test
/// code does not, and a cycle is found.
#[test]
fn the_checker_sees_uses_paths_and_cycles() {
    let text = "use super::{a::X, b::{self, Y}};\n\
                use crate::top::c as d;\n\
                fn f() { super::super::top::e::g(); let _ = ::other::x; }\n\
                #[cfg(test)] mod tests { use super::super::f::Z; }";
    let tokens = strip_tests(TokenStream::from_str(text).unwrap().into_iter().collect());
    let mut paths = Vec::new();
    paths_in(&tokens, &mut paths);
    let module: Vec<String> = ["top", "here"].map(str::to_owned).to_vec();
    let resolved: Vec<String> = paths
        .iter()
        .filter_map(|p| resolve(p, &module))
        .map(|p| p.join("::"))
        .collect();
    assert_eq!(
        resolved,
        ["top::a::X", "top::b", "top::b::Y", "top::c", "top::e::g"],
        "{paths:?}"
    );
    let arrows: BTreeSet<(String, String)> = [("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")]
        .map(|(a, b)| (a.to_owned(), b.to_owned()))
        .into();
    let found = cycles(&arrows);
    assert_eq!(found.len(), 1);
    assert_eq!(found[0], ["a", "b", "c"].map(str::to_owned).into());
}
