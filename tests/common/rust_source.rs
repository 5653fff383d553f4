//! Reading this crate's Rust sources as tokens, for the tests that check the shape of the
//! code (`tests/sim_purity.rs`, `tests/no_cycles.rs`): files are tokenised by `proc_macro2`
//! (so comments and string literals are never read as code), `#[cfg(test)]` items dropped,
//! every `use` tree expanded into the paths it imports with the names they bind, every path
//! expression (`a::b::c`, also inside macro calls) and macro call collected, and paths
//! starting at `crate`, `self` or `super` resolved against the file's module.
//!
//! Included by each of those tests with `#[path]`; each uses part of it.
#![allow(dead_code, clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::str::FromStr;

use proc_macro2::{Delimiter, Spacing, TokenStream, TokenTree};

/// Every `.rs` file under `dir`, recursively, in no particular order.
pub fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            out.push(path);
        }
    }
}

/// The non-test `.rs` files under `dir`, sorted: test modules kept in their own files
/// (`#[cfg(test)] mod tests;`, a `tests.rs` or a `tests/` folder) are test code.
pub fn non_test_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    rust_files(dir, &mut files);
    files.retain(|file| {
        !file
            .strip_prefix(dir)
            .unwrap()
            .iter()
            .any(|part| part == "tests" || part == "tests.rs")
    });
    files.sort();
    files
}

/// A file's module path below the crate root `src` (`src/sim/engine/mod.rs` is
/// `["sim", "engine"]`, `src/sim/engine/lazy.rs` is `["sim", "engine", "lazy"]`).
pub fn module_path(src: &Path, file: &Path) -> Vec<String> {
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

/// The tokens of `file`'s non-test code.
pub fn file_tokens(file: &Path) -> Vec<TokenTree> {
    let text = std::fs::read_to_string(file).unwrap();
    source_tokens(&text).unwrap_or_else(|err| panic!("{}: {err}", file.display()))
}

/// The tokens of source `text` without its `#[cfg(test)]` items.
pub fn source_tokens(text: &str) -> Result<Vec<TokenTree>, String> {
    let tokens = TokenStream::from_str(text).map_err(|err| format!("{err:?}"))?;
    Ok(without_tests(tokens.into_iter().collect()))
}

/// `tokens` without `#[cfg(test)]` items (the attribute through the item's body or `;`).
pub fn without_tests(tokens: Vec<TokenTree>) -> Vec<TokenTree> {
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

/// Whether `tokens[index..]` starts with `::`.
pub fn is_path_sep(tokens: &[TokenTree], index: usize) -> bool {
    matches!((tokens.get(index), tokens.get(index + 1)),
        (Some(TokenTree::Punct(a)), Some(TokenTree::Punct(b)))
            if a.as_char() == ':' && a.spacing() == Spacing::Joint && b.as_char() == ':')
}

/// One path a `use` tree imports, as written (`self`/`super`/`crate` unresolved; a leading
/// `::` is an empty first segment; a glob ends in `*`), and the name it binds.
#[derive(Clone, Debug, PartialEq)]
pub struct UsePath {
    /// The path's segments.
    pub path: Vec<String>,
    /// The name it binds: its last segment, or its `as` alias.
    pub name: String,
}

/// What a file's tokens name: `use` paths, path expressions, macro calls.
#[derive(Clone, Debug, Default)]
pub struct Named {
    /// Every path imported by a `use` tree or an `extern crate`.
    pub uses: Vec<UsePath>,
    /// Every path expression of two or more segments not itself inside a longer path
    /// (`tokio::spawn`, `super::x::y`); a global one (`::hyper::x`) with an empty first
    /// segment. A lone name is a local or was imported by a `use`, which is collected.
    pub paths: Vec<Vec<String>>,
    /// The names of macros called (`name!`).
    pub macros: Vec<String>,
}

impl Named {
    /// What `tokens` name, recursively through groups.
    pub fn of(tokens: &[TokenTree]) -> Self {
        let mut named = Named::default();
        named.walk(tokens);
        named
    }

    fn walk(&mut self, tokens: &[TokenTree]) {
        let mut index = 0;
        while index < tokens.len() {
            match &tokens[index] {
                TokenTree::Ident(ident) if ident == "use" => {
                    let end = tokens[index..]
                        .iter()
                        .position(|t| matches!(t, TokenTree::Punct(p) if p.as_char() == ';'))
                        .map_or(tokens.len(), |offset| index + offset);
                    use_tree(&tokens[index + 1..end], &[], &mut self.uses);
                    index = end + 1;
                }
                TokenTree::Ident(ident) if ident == "extern" => {
                    if let (Some(TokenTree::Ident(kw)), Some(TokenTree::Ident(name))) =
                        (tokens.get(index + 1), tokens.get(index + 2))
                        && kw == "crate"
                    {
                        self.uses.push(UsePath {
                            path: vec![name.to_string()],
                            name: name.to_string(),
                        });
                        index += 3;
                    } else {
                        index += 1;
                    }
                }
                TokenTree::Ident(ident) => {
                    index = self.path_at(tokens, index, ident.to_string());
                }
                TokenTree::Group(group) => {
                    let inner: Vec<TokenTree> = group.stream().into_iter().collect();
                    self.walk(&inner);
                    index += 1;
                }
                _ => index += 1,
            }
        }
    }

    /// Collects the path (and macro call) starting at `tokens[index]`, the identifier
    /// `first`; returns the index after it.
    fn path_at(&mut self, tokens: &[TokenTree], index: usize, first: String) -> usize {
        let after_sep = index >= 2 && is_path_sep(tokens, index - 2);
        // `::name` with nothing path-like before it (a name, a `>` closing generics) is a
        // global path (`::hyper::x`).
        let global = after_sep
            && !matches!(
                index.checked_sub(3).map(|i| &tokens[i]),
                Some(TokenTree::Ident(_))
            )
            && !matches!(index.checked_sub(3).map(|i| &tokens[i]),
                Some(TokenTree::Punct(p)) if p.as_char() == '>');
        let preceded = after_sep && !global;
        if matches!(tokens.get(index + 1), Some(TokenTree::Punct(p)) if p.as_char() == '!') {
            self.macros.push(first.clone());
        }
        let mut path = vec![first];
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
        if global {
            self.paths
                .push(std::iter::once(String::new()).chain(path).collect());
        } else if !preceded && path.len() > 1 {
            self.paths.push(path);
        }
        next.max(index + 1)
    }
}

/// Expands the use tree `tokens` (after `use`, before `;`) under `prefix` into `out`.
fn use_tree(tokens: &[TokenTree], prefix: &[String], out: &mut Vec<UsePath>) {
    let mut path = prefix.to_vec();
    let mut index = 0;
    if is_path_sep(tokens, 0) {
        path.push(String::new());
        index = 2;
    }
    while let Some(token) = tokens.get(index) {
        match token {
            TokenTree::Ident(ident) if ident == "as" => break,
            TokenTree::Ident(ident) => {
                path.push(ident.to_string());
                index += 1;
                if !is_path_sep(tokens, index) {
                    break;
                }
                index += 2;
            }
            TokenTree::Group(group) if group.delimiter() == Delimiter::Brace => {
                let inner: Vec<TokenTree> = group.stream().into_iter().collect();
                for part in inner.split(|t| matches!(t, TokenTree::Punct(p) if p.as_char() == ','))
                {
                    if !part.is_empty() {
                        use_tree(part, &path, out);
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
    if path.last().is_some_and(|last| last == "self") {
        path.pop();
    }
    let alias = match (tokens.get(index), tokens.get(index + 1)) {
        (Some(TokenTree::Ident(kw)), Some(TokenTree::Ident(alias))) if kw == "as" => {
            Some(alias.to_string())
        }
        _ => None,
    };
    let Some(name) = alias.or_else(|| path.last().cloned()) else {
        return;
    };
    out.push(UsePath { path, name });
}

/// `path` as a path below the crate, if it starts at `crate`, `self` or `super`, read in
/// module `module` (a path below the crate, as [`module_path`] gives).
pub fn resolve(path: &[String], module: &[String]) -> Option<Vec<String>> {
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
