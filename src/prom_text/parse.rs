//! Sample lines of the Prometheus text exposition format (version 0.0.4), read without a
//! regex and without allocating: each [`Sample`] borrows its name and label text from the
//! page, and labels are read only when asked for ([`Sample::label`]).
//!
//! Why not a crate: the live mirror reads a pod's page every 50 ms, 100 pods at a time, and
//! `prometheus-parse` (a regex with captures and a label map per line) was a third of the
//! mirror's CPU; its name pattern (`\w+`) also lacks the `:` of every vLLM and SGLang name.
//! That crate stays as the independent oracle of this module's tests.
//!
//! The grammar (<https://prometheus.io/docs/instrumenting/exposition_formats/>):
//! `name [ "{" label "=" "\"" value "\"" { "," ... } [","] "}" ] value [ timestamp ]`, with
//! `#` lines (HELP, TYPE, comments) and blank lines ignored. A line whose name, braces,
//! quotes, value or timestamp do not follow it (garbage, a truncated page) is skipped: it
//! shows up as a missing series, which callers report by name. The label pairs inside the
//! braces are read only when asked for, and a malformed pair is simply not found.

use std::borrow::Cow;

/// One sample line, borrowed from its page.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sample<'a> {
    /// The metric name as written (`:` and suffixes such as `_bucket` included).
    pub name: &'a str,
    /// The text between the braces, escapes as written (empty without labels).
    labels: &'a str,
    /// The value (`+Inf`, `-Inf` and `NaN` included).
    pub value: f64,
}

impl<'a> Sample<'a> {
    /// The value of label `key`, unescaped (`\\`, `\"`, `\n`); `None` when absent. (A
    /// label named twice, which the format forbids, reads as its last when that pair ends
    /// the set, else as its first.)
    pub fn label(&self, key: &str) -> Option<Cow<'a, str>> {
        // A histogram's `le` ends its label set: read the last pair from the end first.
        if let Some((name, value)) = self.last_pair()
            && name == key
        {
            return Some(Cow::Borrowed(value));
        }
        self.label_walk(key)
    }

    /// [`Sample::label`] by walking the pairs from the start.
    fn label_walk(&self, key: &str) -> Option<Cow<'a, str>> {
        // The label text was checked pair by pair when the line was read.
        let bytes = self.labels.as_bytes();
        let mut at = 0;
        loop {
            at = skip(bytes, at, |b| is_blank(b) || b == b',');
            let equals = at + memchr::memchr(b'=', &bytes[at..])?;
            let name = self.labels[at..equals].trim_end_matches([' ', '\t']);
            let quote = skip(bytes, equals + 1, is_blank);
            if bytes.get(quote) != Some(&b'"') {
                return None;
            }
            let start = quote + 1;
            let end = start + quoted_end(&bytes[start..])?;
            if name == key {
                return Some(unescape(&self.labels[start..end]));
            }
            at = end + 1;
        }
    }
}

impl<'a> Sample<'a> {
    /// The last label pair (name, value) read backwards, when that is unambiguous: the set
    /// ends with a quoted value free of backslashes, preceded by `=` and a plain label name
    /// that starts the set or follows a blank or a comma. `None` otherwise (the forward walk
    /// of [`Sample::label`] then reads it). On a well-formed set the two agree (a proptest
    /// checks it); a malformed set whose end still reads as a pair (`{garbage, le="5"}`)
    /// yields that pair where the walk from the start finds nothing.
    fn last_pair(&self) -> Option<(&'a str, &'a str)> {
        let bytes = self.labels.as_bytes();
        let mut end = bytes.len();
        while end > 0 && (is_blank(bytes[end - 1]) || bytes[end - 1] == b',') {
            end -= 1;
        }
        let close = end.checked_sub(1).filter(|&at| bytes[at] == b'"')?;
        let open = memchr::memrchr2(b'"', b'\\', &bytes[..close])?;
        if bytes[open] != b'"' || open.checked_sub(1).is_some_and(|at| bytes[at] == b'\\') {
            return None;
        }
        let mut at = open;
        while at > 0 && is_blank(bytes[at - 1]) {
            at -= 1;
        }
        at = at.checked_sub(1).filter(|&at| bytes[at] == b'=')?;
        while at > 0 && is_blank(bytes[at - 1]) {
            at -= 1;
        }
        let name_end = at;
        while at > 0 && NAME_BYTE[usize::from(bytes[at - 1])] {
            at -= 1;
        }
        let starts_pair = at == 0 || is_blank(bytes[at - 1]) || bytes[at - 1] == b',';
        (name_end > at && !bytes[at].is_ascii_digit() && starts_pair)
            .then(|| (&self.labels[at..name_end], &self.labels[open + 1..close]))
    }
}

/// The samples of `text` whose name `keep` accepts (lines it refuses are not read past
/// their name). `keep` is asked once per run of lines with the same name (a histogram's
/// buckets), so a page of hundreds of lines costs a few dozen decisions.
pub fn parse(text: &str, mut keep: impl FnMut(&str) -> bool) -> Vec<Sample<'_>> {
    let mut samples = Vec::new();
    scan(
        text,
        |name| keep(name).then_some(()),
        |(), sample| samples.push(sample),
    );
    samples
}

/// Every sample line of `text` whose name `tag` tags, handed to `each` with its tag in page
/// order, without collecting them: a caller that files each sample where it belongs (the
/// live mirror's `parse_metrics`) reads a page in one pass. `tag` is asked once per run of
/// lines with the same name, as [`parse`]'s `keep`; untagged lines are not read past their
/// name.
pub fn scan<'a, T: Copy>(
    text: &'a str,
    mut tag: impl FnMut(&str) -> Option<T>,
    mut each: impl FnMut(T, Sample<'a>),
) {
    let mut last: Option<(&str, Option<T>)> = None;
    // Lines split with the `memchr` crate's vectorised search (`str::lines` searches a word
    // at a time: a tenth of a scrape's CPU).
    let ends = memchr::memchr_iter(b'\n', text.as_bytes()).chain(std::iter::once(text.len()));
    let mut start = 0;
    for end in ends {
        let line = &text[start.min(end)..end];
        start = end + 1;
        let line = line.strip_suffix('\r').unwrap_or(line);
        let line = match line.as_bytes().first() {
            None | Some(b'#') => continue,
            Some(&first) if is_blank(first) => line.trim_start_matches([' ', '\t']),
            Some(_) => line,
        };
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        // A line of the same series as the line before (a histogram's buckets) is told by
        // one comparison and takes its decision; only other lines are scanned for their name.
        let same = last.and_then(|(seen, decision)| {
            let bytes = line.as_bytes();
            (bytes.starts_with(seen.as_bytes())
                && matches!(bytes.get(seen.len()), Some(b'{' | b' ' | b'\t')))
            .then(|| (line.split_at(seen.len()), decision))
        });
        let (name, rest, decision) = match same {
            Some(((name, rest), decision)) => (name, rest, decision),
            None => {
                let Some((name, rest)) = split_name(line) else {
                    continue;
                };
                // A name seen again after other lines is asked about again (a page lists a
                // family's lines together, so this is rare).
                let decision = tag(name);
                last = Some((name, decision));
                (name, rest, decision)
            }
        };
        let Some(tagged) = decision else {
            continue;
        };
        if let Some((labels, value)) = labels_and_value(rest) {
            each(
                tagged,
                Sample {
                    name,
                    labels,
                    value,
                },
            );
        }
    }
}

/// The name at the start of `line` and what follows it; `None` when the line does not
/// start with a metric name (`[a-zA-Z_:][a-zA-Z0-9_:]*`).
fn split_name(line: &str) -> Option<(&str, &str)> {
    let bytes = line.as_bytes();
    let first = *bytes.first()?;
    if first.is_ascii_digit() || !NAME_BYTE[usize::from(first)] {
        return None;
    }
    let end = bytes
        .iter()
        .position(|&b| !NAME_BYTE[usize::from(b)])
        .unwrap_or(bytes.len());
    Some(line.split_at(end))
}

/// The bytes of a metric name, `[a-zA-Z0-9_:]`, as a table (one load a byte: names are
/// scanned on every scrape).
const NAME_BYTE: [bool; 256] = {
    let mut table = [false; 256];
    let mut byte = 0;
    while byte < 256 {
        let b = byte as u8;
        table[byte] = b.is_ascii_alphanumeric() || b == b'_' || b == b':';
        byte += 1;
    }
    table
};

/// The label text (between the braces) and the value of what follows a name.
fn labels_and_value(rest: &str) -> Option<(&str, f64)> {
    let (labels, rest) = match rest.trim_start_matches([' ', '\t']).strip_prefix('{') {
        Some(inside) => {
            let end = labels_end(inside.as_bytes())?;
            (&inside[..end], &inside[end + 1..])
        }
        None => ("", rest),
    };
    let (value, rest) = next_field(rest)?;
    let value = parse_value(value)?;
    // An optional timestamp (milliseconds, an integer); anything else makes the line bad.
    match next_field(rest) {
        None => Some((labels, value)),
        Some((timestamp, rest)) => (timestamp.parse::<i64>().is_ok() && next_field(rest).is_none())
            .then_some((labels, value)),
    }
}

/// The next blank-separated field of `text` and what follows it.
fn next_field(text: &str) -> Option<(&str, &str)> {
    let bytes = text.as_bytes();
    let start = bytes.iter().position(|&b| !is_blank(b))?;
    let end = bytes[start..]
        .iter()
        .position(|&b| is_blank(b))
        .map_or(bytes.len(), |len| start + len);
    Some((&text[start..end], &text[end..]))
}

fn is_blank(byte: u8) -> bool {
    byte == b' ' || byte == b'\t'
}

/// Where the closing brace of a label set is: the first `}` outside a quoted value (values
/// may hold `}`, `,` and escaped quotes). The pairs themselves are read by
/// [`Sample::label`], which finds nothing in a malformed set.
fn labels_end(inside: &[u8]) -> Option<usize> {
    // Without escapes, the first `}` after an even number of quotes is outside them: one
    // search for the brace, then the quotes' parity and any backslash as byte-wide folds
    // (XOR and OR reductions the compiler vectorises; a count of the quotes into a `usize`
    // ran byte by byte, and a search from quote to quote cost more to start than the few
    // bytes it skipped).
    let brace = memchr::memchr(b'}', inside)?;
    let head = &inside[..brace];
    let odd_quotes = head
        .iter()
        .fold(0_u8, |odd, &byte| odd ^ u8::from(byte == b'"'));
    let escapes = head
        .iter()
        .fold(0_u8, |any, &byte| any | u8::from(byte == b'\\'));
    if odd_quotes | escapes == 0 {
        return Some(brace);
    }
    // Escapes, or a `}` inside a value: from quote to quote, escapes skipped.
    let mut at = 0;
    loop {
        at += memchr::memchr2(b'}', b'"', inside.get(at..)?)?;
        if inside[at] == b'}' {
            return Some(at);
        }
        at += 1 + quoted_end(&inside[at + 1..])? + 1;
    }
}

/// The first index from `at` whose byte `what` refuses (`bytes.len()` if none).
fn skip(bytes: &[u8], mut at: usize, what: impl Fn(u8) -> bool) -> usize {
    while bytes.get(at).is_some_and(|&b| what(b)) {
        at += 1;
    }
    at
}

/// The index of the closing quote of a label value (after its opening quote), escapes
/// skipped.
fn quoted_end(bytes: &[u8]) -> Option<usize> {
    let mut at = 0;
    loop {
        at += memchr::memchr2(b'"', b'\\', bytes.get(at..)?)?;
        if bytes[at] == b'"' {
            return Some(at);
        }
        at += 2;
    }
}

/// A label value with its escapes resolved.
fn unescape(raw: &str) -> Cow<'_, str> {
    if memchr::memchr(b'\\', raw.as_bytes()).is_none() {
        return Cow::Borrowed(raw);
    }
    let mut out = String::with_capacity(raw.len());
    let mut chars = raw.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some(other) => out.push(other),
            None => out.push('\\'),
        }
    }
    Cow::Owned(out)
}

/// A sample value: a Go float (`+Inf`, `-Inf`, `NaN` as the format writes them).
pub(crate) fn parse_value(field: &str) -> Option<f64> {
    match field {
        "+Inf" | "Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        "NaN" => Some(f64::NAN),
        _ => plain_decimal(field).or_else(|| field.parse().ok()),
    }
}

/// Powers of ten that are exact in an `f64`.
const EXACT_POWERS: [f64; 23] = [
    1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15, 1e16,
    1e17, 1e18, 1e19, 1e20, 1e21, 1e22,
];

/// The value of a plain decimal (`123`, `98765.0`, `0.42`: what a model server writes for
/// counts and gauges) when it is exact to compute, else `None` (the caller's `str::parse`
/// then reads it). Digits as an integer below 2^53, divided by an exact power of ten: both
/// operands are exact and IEEE division rounds correctly, so the result is the one
/// `str::parse` gives (Clinger's fast path), at a fraction of its cost on every scrape.
fn plain_decimal(field: &str) -> Option<f64> {
    let bytes = field.as_bytes();
    let (negative, digits) = match bytes.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, bytes),
    };
    // One pass over the bytes (a split at the dot searched for it first: a fifth of the
    // value's cost on every scrape).
    let mut mantissa: u64 = 0;
    let mut count = 0_usize;
    let mut dot = None;
    for &byte in digits {
        if byte.is_ascii_digit() {
            mantissa = mantissa
                .wrapping_mul(10)
                .wrapping_add(u64::from(byte - b'0'));
            count += 1;
        } else if byte == b'.' && dot.is_none() {
            dot = Some(count);
        } else {
            return None;
        }
    }
    let whole = dot.unwrap_or(count);
    if whole == 0 || count > 15 {
        return None;
    }
    // At most 15 digits: below 10^15 < 2^53, exact as an f64.
    let value = mantissa as f64 / EXACT_POWERS[count - whole];
    Some(if negative { -value } else { value })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_with_colons_labels_with_escapes_and_special_values() {
        let page = "# HELP vllm:x help with } and \"\n\
                    # TYPE vllm:x gauge\n\
                    vllm:x{a=\"1\",b=\"q\\\"}\\\\,n\\n\"} 2.5\n\
                    vllm:y_bucket{le=\"+Inf\"} +Inf 1700000000000\n\
                    vllm:z NaN\r\n\
                    \tspaced { a = \"v\" , } -Inf\n";
        let samples = parse(page, |_| true);
        let names: Vec<&str> = samples.iter().map(|s| s.name).collect();
        assert_eq!(names, ["vllm:x", "vllm:y_bucket", "vllm:z", "spaced"]);
        assert_eq!(samples[0].value, 2.5);
        assert_eq!(samples[0].label("a").as_deref(), Some("1"));
        assert_eq!(samples[0].label("b").as_deref(), Some("q\"}\\,n\n"));
        assert_eq!(samples[0].label("c"), None);
        assert_eq!(samples[1].label("le").as_deref(), Some("+Inf"));
        assert_eq!(samples[1].value, f64::INFINITY);
        assert!(samples[2].value.is_nan());
        assert_eq!(samples[3].label("a").as_deref(), Some("v"));
        assert_eq!(samples[3].value, f64::NEG_INFINITY);
    }

    #[test]
    fn plain_decimals_read_exactly_as_str_parse_reads_them() {
        for text in [
            "0",
            "0.0",
            "1",
            "-1",
            "98765.0",
            "0.42",
            "-0.001",
            "123456789012345",
            "1234567890.12345",
            "0.00000000000001",
            "12.50",
            "-0",
            "7.",
        ] {
            let expected: f64 = text.parse().unwrap();
            let got = plain_decimal(text).unwrap();
            assert_eq!(got.to_bits(), expected.to_bits(), "{text}");
        }
        // Left to `str::parse`: too many digits, exponents, signs and spellings it knows.
        for text in [
            "1234567890123456",
            "1e3",
            "+1",
            ".5",
            "",
            "-",
            "1.2.3",
            "0x10",
            "1_0",
        ] {
            assert_eq!(plain_decimal(text), None, "{text}");
        }
        assert_eq!(parse_value("1e3"), Some(1000.0));
        assert_eq!(parse_value(".5"), Some(0.5));
    }

    proptest::proptest! {
        #[test]
        fn any_plain_decimal_reads_as_str_parse(
            whole in 0_u64..10_000_000_000,
            fraction in "[0-9]{0,6}",
            negative: bool,
        ) {
            let text = format!(
                "{}{whole}{}{fraction}",
                if negative { "-" } else { "" },
                if fraction.is_empty() { "" } else { "." },
            );
            let expected: f64 = text.parse().unwrap();
            let got = parse_value(&text).unwrap();
            proptest::prop_assert_eq!(got.to_bits(), expected.to_bits(), "{}", text);
        }
    }

    proptest::proptest! {
        /// Reading the last pair backwards gives what the walk from the start gives, for
        /// label sets with escapes, blanks, trailing commas and values that look like pairs.
        #[test]
        fn the_last_pair_read_backwards_agrees_with_the_walk(
            pairs in proptest::collection::vec(
                ("[a-z_][a-z0-9_]{0,6}", r#"[a-z0-9=,\\" .+{}\n]{0,8}"#, "[ \t]{0,2}"),
                1..5,
            ),
            trailing in "[ ,]{0,2}",
        ) {
            let mut names = std::collections::HashSet::new();
            let mut text = String::from("m{");
            for (index, (name, value, blank)) in pairs.iter().enumerate() {
                if !names.insert(name.clone()) {
                    return Ok(());
                }
                let escaped = value
                    .replace('\\', "\\\\")
                    .replace('"', "\\\"")
                    .replace('\n', "\\n");
                if index > 0 {
                    text.push(',');
                }
                text.push_str(&format!("{blank}{name}{blank}={blank}\"{escaped}\""));
            }
            text.push_str(&format!("{trailing}}} 1"));
            let samples = parse(&text, |_| true);
            proptest::prop_assert_eq!(samples.len(), 1, "{}", text);
            for (name, value, _) in &pairs {
                let fast = samples[0].label(name);
                proptest::prop_assert_eq!(&fast, &samples[0].label_walk(name), "{}", text);
                proptest::prop_assert_eq!(fast.as_deref(), Some(value.as_str()), "{}", text);
            }
        }
    }

    #[test]
    fn the_last_pair_is_read_backwards_only_when_unambiguous() {
        let page = "a{x=\"1\",le=\"5.0\"} 1\n\
                    b{x=\"1\" , le = \"+Inf\" ,} 1\n\
                    c{x=\"1\",le=\"a\\\"b\"} 1\n\
                    d{x=\"1\"le=\"2\"} 1\n\
                    e{x=\"a ,b=\\n\"} 1\n";
        let samples = parse(page, |_| true);
        assert_eq!(samples[0].last_pair(), Some(("le", "5.0")));
        assert_eq!(samples[1].last_pair(), Some(("le", "+Inf")));
        assert_eq!(samples[2].last_pair(), None);
        assert_eq!(samples[2].label("le").as_deref(), Some("a\"b"));
        assert_eq!(samples[3].last_pair(), None);
        assert_eq!(samples[3].label("le").as_deref(), Some("2"));
        assert_eq!(samples[4].last_pair(), None);
        assert_eq!(samples[4].label("b"), None);
        assert_eq!(samples[4].label("x").as_deref(), Some("a ,b=\n"));
        // Malformed before its last pair: the end still reads (documented on `last_pair`).
        let samples = parse("f{garbage, le=\"5\"} 1\n", |_| true);
        assert_eq!(samples[0].label_walk("le"), None);
        assert_eq!(samples[0].label("le").as_deref(), Some("5"));
    }

    #[test]
    fn garbage_and_truncated_lines_are_skipped() {
        let page = "<html>nope</html>\n\
                    ok 1\n\
                    vllm:cut{a=\"1\n\
                    vllm:novalue{a=\"1\"}\n\
                    vllm:bad 1 2 3\n\
                    vllm:word one\n\
                    {a=\"1\"} 3\n\
                    \x00\u{fffd}\n\
                    last{a=\"x\"} 4";
        let samples = parse(page, |_| true);
        let names: Vec<&str> = samples.iter().map(|s| s.name).collect();
        assert_eq!(names, ["ok", "last"]);
    }

    #[test]
    fn keep_sees_each_name_once_per_run_and_refused_lines_are_not_read() {
        let page = "a_bucket{le=\"1\"} 1\na_bucket{le=\"2\"} 2\nb 3\na_bucket{le=\"3\"} 3\n";
        let mut asked = Vec::new();
        let samples = parse(page, |name| {
            asked.push(name.to_owned());
            name.starts_with('a')
        });
        assert_eq!(asked, ["a_bucket", "b", "a_bucket"]);
        assert_eq!(samples.len(), 3);
    }
}
