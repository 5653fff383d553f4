//! No import cycle inside a folder of `src/`: for every folder, its children (files and
//! subfolders) import one another along a directed acyclic graph, so a reader meets each
//! folder's parts in one order. An import is any `use` tree (expanded, `crate`/`self`/
//! `super` resolved) or `crate::`/`self::`/`super::` path expression of non-test code that
//! names a sibling module; a child importing its folder's `mod.rs` is not a sibling edge.
//! The sources are read by `tests/common/rust_source.rs`, shared with `tests/sim_purity.rs`.
//!
//! The cycles still known are listed in `KNOWN`, each with why it is there; the test fails
//! on any other cycle, and on a known one that is gone (so the list only shrinks).
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use proc_macro2::TokenTree;

#[path = "common/rust_source.rs"]
mod rust_source;

use rust_source::{Named, file_tokens, module_path, non_test_files, resolve, source_tokens};

/// Cycles left, as (folder under `src/`, its children in the cycle, why).
const KNOWN: &[(&str, &[&str], &str)] = &[];

/// The module paths `tokens` import from this crate: every `use` path and every path
/// expression starting at `crate`, `self` or `super`, resolved in `module`.
fn imports(tokens: &[TokenTree], module: &[String]) -> Vec<Vec<String>> {
    let named = Named::of(tokens);
    named
        .uses
        .iter()
        .map(|used| &used.path)
        .chain(&named.paths)
        .filter_map(|path| resolve(path, module))
        .collect()
}

/// Per folder (module path), the sibling edges (child -> child) of its non-test code.
fn edges(src: &Path) -> BTreeMap<Vec<String>, BTreeSet<(String, String)>> {
    let files = non_test_files(src);
    let modules: BTreeSet<Vec<String>> = files.iter().map(|f| module_path(src, f)).collect();
    let mut found: BTreeMap<Vec<String>, BTreeSet<(String, String)>> = BTreeMap::new();
    for file in &files {
        let module = module_path(src, file);
        for target in imports(&file_tokens(file), &module) {
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
    let module: Vec<String> = ["top", "here"].map(str::to_owned).to_vec();
    let resolved: Vec<String> = imports(&source_tokens(text).unwrap(), &module)
        .iter()
        .map(|p| p.join("::"))
        .collect();
    assert_eq!(
        resolved,
        ["top::a::X", "top::b", "top::b::Y", "top::c", "top::e::g"]
    );
    let arrows: BTreeSet<(String, String)> = [("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")]
        .map(|(a, b)| (a.to_owned(), b.to_owned()))
        .into();
    let found = cycles(&arrows);
    assert_eq!(found.len(), 1);
    assert_eq!(found[0], ["a", "b", "c"].map(str::to_owned).into());
}
