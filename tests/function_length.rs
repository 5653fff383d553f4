//! No non-test function of `src/` over 100 lines (from its `fn` line to its closing brace,
//! comments included): a longer one is split by meaning. Test code (`#[cfg(test)]` items,
//! `tests.rs`, `tests/` folders) is not counted. There are no exemptions: the last two, the
//! lazy window's hot loops (`sim/engine/window/kv.rs::window_kv_calls` and
//! `sim/engine/window/lazy.rs::lazy_finish_in`), were split with the reference run's
//! instruction count measured (docs/performance.md).
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};

/// Most lines of a function.
const LIMIT: usize = 100;

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            if path.file_name().is_some_and(|name| name != "tests") {
                rust_files(&path, out);
            }
        } else if path.extension().is_some_and(|ext| ext == "rs")
            && path.file_name().is_some_and(|name| name != "tests.rs")
        {
            out.push(path);
        }
    }
}

/// `text` with comments, string and character literals blanked (newlines kept), so that
/// braces and keywords left are code.
fn code_only(text: &str) -> Vec<u8> {
    let bytes = text.as_bytes();
    let mut out = bytes.to_vec();
    let blank = |out: &mut Vec<u8>, from: usize, to: usize| {
        for byte in &mut out[from..to.min(bytes.len())] {
            if *byte != b'\n' {
                *byte = b' ';
            }
        }
    };
    let mut at = 0;
    while at < bytes.len() {
        let rest = &bytes[at..];
        let after_word = at > 0 && (bytes[at - 1].is_ascii_alphanumeric() || bytes[at - 1] == b'_');
        if rest.starts_with(b"//") {
            let end = rest
                .iter()
                .position(|&b| b == b'\n')
                .map_or(bytes.len(), |n| at + n);
            blank(&mut out, at, end);
            at = end;
        } else if rest.starts_with(b"/*") {
            let (mut depth, mut end) = (0usize, at);
            while end < bytes.len() {
                if bytes[end..].starts_with(b"/*") {
                    depth += 1;
                    end += 2;
                } else if bytes[end..].starts_with(b"*/") {
                    depth -= 1;
                    end += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    end += 1;
                }
            }
            blank(&mut out, at, end);
            at = end;
        } else if !after_word && rest.first() == Some(&b'r') && raw_string_hashes(rest).is_some() {
            let hashes = raw_string_hashes(rest).unwrap_or(0);
            let open = 2 + hashes;
            let mut close = vec![b'"'];
            close.extend(std::iter::repeat_n(b'#', hashes));
            let end = rest[open..]
                .windows(close.len())
                .position(|w| w == close.as_slice())
                .map_or(bytes.len(), |n| at + open + n + close.len());
            blank(&mut out, at, end);
            at = end;
        } else if rest[0] == b'"' {
            let mut end = at + 1;
            while end < bytes.len() && bytes[end] != b'"' {
                end += if bytes[end] == b'\\' { 2 } else { 1 };
            }
            blank(&mut out, at, end + 1);
            at = end + 1;
        } else if rest[0] == b'\'' {
            // A character literal ('x', '\n', '\u{..}', a multi-byte char) or a lifetime.
            let end = if rest.get(1) == Some(&b'\\') {
                rest[2..]
                    .iter()
                    .position(|&b| b == b'\'')
                    .map(|n| at + 2 + n + 1)
            } else {
                let width = text[at + 1..].chars().next().map_or(1, char::len_utf8);
                (rest.get(1 + width) == Some(&b'\'')).then_some(at + 2 + width)
            };
            match end {
                Some(end) => {
                    blank(&mut out, at, end);
                    at = end;
                }
                None => at += 1,
            }
        } else {
            at += 1;
        }
    }
    out
}

/// The `#` count of a raw string literal starting `text` (`r"`, `r#"`, ...).
fn raw_string_hashes(text: &[u8]) -> Option<usize> {
    let hashes = text[1..].iter().take_while(|&&b| b == b'#').count();
    (text.get(1 + hashes) == Some(&b'"')).then_some(hashes)
}

/// The index of the brace closing the one at `open`.
fn closing(code: &[u8], open: usize) -> usize {
    let mut depth = 0usize;
    for (index, &byte) in code.iter().enumerate().skip(open) {
        match byte {
            b'{' => depth += 1,
            b'}' => {
                depth -= 1;
                if depth == 0 {
                    return index;
                }
            }
            _ => {}
        }
    }
    code.len()
}

fn is_word(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || byte == b'_'
}

/// Every non-test function with a body in `text`, as (name, lines).
fn functions(text: &str) -> Vec<(String, usize)> {
    let code = code_only(text);
    // Test items: from `#[cfg(test)]` to the end of the item's body.
    let mut test_spans = Vec::new();
    let marker = b"#[cfg(test)]";
    for start in (0..code.len()).filter(|&i| code[i..].starts_with(marker)) {
        let after = start + marker.len();
        match code[after..].iter().position(|&b| b == b'{' || b == b';') {
            Some(n) if code[after + n] == b'{' => {
                test_spans.push(start..closing(&code, after + n) + 1);
            }
            _ => {}
        }
    }
    let line_of = |index: usize| code[..index].iter().filter(|&&b| b == b'\n').count();
    let mut found = Vec::new();
    for at in 0..code.len().saturating_sub(3) {
        let keyword = code[at..].starts_with(b"fn ")
            && (at == 0 || !is_word(code[at - 1]))
            && !test_spans.iter().any(|span| span.contains(&at));
        if !keyword {
            continue;
        }
        let name_start = at
            + 3
            + code[at + 3..]
                .iter()
                .take_while(|b| b.is_ascii_whitespace())
                .count();
        let name_len = code[name_start..]
            .iter()
            .take_while(|&&b| is_word(b))
            .count();
        if name_len == 0 {
            continue;
        }
        let name = String::from_utf8_lossy(&code[name_start..name_start + name_len]).into_owned();
        let Some(n) = code[name_start..]
            .iter()
            .position(|&b| b == b'{' || b == b';')
        else {
            continue;
        };
        let open = name_start + n;
        if code[open] == b';' {
            continue;
        }
        let lines = line_of(closing(&code, open)) - line_of(at) + 1;
        found.push((name, lines));
    }
    found
}

#[test]
fn no_function_is_over_the_limit() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    assert!(files.len() > 50, "expected the crate's sources");
    let mut over = Vec::new();
    for file in &files {
        let local = file
            .strip_prefix(&src)
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let text = std::fs::read_to_string(file).unwrap();
        for (name, lines) in functions(&text) {
            if lines > LIMIT {
                over.push(format!("src/{local}: {name} ({lines} lines)"));
            }
        }
    }
    assert!(
        over.is_empty(),
        "functions over {LIMIT} lines:\n{}",
        over.join("\n")
    );
}

/// The counter itself: braces in strings, characters and comments do not count, lifetimes
/// are not characters, test code is left out.
#[test]
fn the_counter_reads_code_not_text() {
    let text = "fn one<'a>(x: &'a str) -> char {\n    let _ = \"}\"; // }\n    let _ = r#\"{\"#;\n    '}'\n}\n\
                /* fn hidden() { } */\n\
                pub fn two() {\n    if true {\n    }\n}\n\
                #[cfg(test)]\nmod tests {\n    fn three() {\n    }\n}\n\
                trait T { fn sig(&self); }\n";
    assert_eq!(
        functions(text),
        [("one".to_owned(), 5), ("two".to_owned(), 4)]
    );
}
