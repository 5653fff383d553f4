//! `ditto run --cluster FILE` with an `autoscaler:` section, end to end through the built
//! binary: the comparison table's rows and columns, the SVG plot (well-formed XML with the
//! load, replicas and latency series), and bad input (exit 2 naming the flag).
#![allow(clippy::unwrap_used)]

mod common;

use common::cli::ditto;
use std::path::{Path, PathBuf};

/// A small autoscaled pool: llama-3.1-8b on H100 (roofline), replicas 1-4, warm-up 20-30 s.
const CLUSTER: &str = "\
pools:
  - name: small
    replicas: 1
    model: llama-3.1-8b-instruct
    gpu: H100
    tp: 1
    latency_model: roofline
    cost_per_hour: 3.0
autoscaler:
  min_replicas: 1
  max_replicas: 4
  ttft_ms: 300
  tpot_ms: 40
  warm_up_min_s: 20
  warm_up_max_s: 30
  policies:
    - {name: static, replicas: 3}
    - {name: slo-aware}
";

/// A step up that one replica cannot serve, and back down (~6,000 requests).
const WORKLOAD: &str = "\
seed: 5
stages:
  - {rate: 4, duration_s: 60}
  - {rate: 30, duration_s: 120}
  - {rate: 4, duration_s: 360}
input_tokens: {type: gaussian, mean: 1500, stdev: 300, min: 16, max: 3000}
output_tokens: {type: gaussian, mean: 100, stdev: 20, min: 2, max: 200}
";

/// A scratch directory with the cluster and workload files.
fn files(name: &str) -> (PathBuf, String, String) {
    let dir = std::env::temp_dir().join(format!("ditto-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cluster = dir.join("cluster.yaml");
    let workload = dir.join("workload.yaml");
    std::fs::write(&cluster, CLUSTER).unwrap();
    std::fs::write(&workload, WORKLOAD).unwrap();
    let text = |p: &Path| p.to_str().unwrap().to_owned();
    (dir.clone(), text(&cluster), text(&workload))
}

/// A start tag, end tag or empty-element tag of an XML document.
#[derive(Debug)]
struct Tag {
    name: String,
    attributes: Vec<(String, String)>,
    closing: bool,
    empty: bool,
}

impl Tag {
    fn attribute(&self, name: &str) -> Option<&str> {
        self.attributes
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Checks that `text` is a well-formed XML document (one root element, every element
/// closed in order, attributes quoted and unique, `&` only in the five predefined entities
/// or character references, no `<` in text or attribute values) and returns its tags in
/// document order. Written for this test from the XML 1.0 grammar; no DTDs, comments or
/// processing instructions are expected in our SVG.
fn parse_xml(text: &str) -> Result<Vec<Tag>, String> {
    fn check_entities(chunk: &str) -> Result<(), String> {
        let mut rest = chunk;
        while let Some(at) = rest.find('&') {
            let end = rest[at..]
                .find(';')
                .ok_or_else(|| format!("unterminated entity in {chunk:?}"))?;
            let entity = &rest[at + 1..at + end];
            let ok = matches!(entity, "amp" | "lt" | "gt" | "quot" | "apos")
                || entity
                    .strip_prefix("#x")
                    .is_some_and(|h| !h.is_empty() && h.chars().all(|c| c.is_ascii_hexdigit()))
                || entity
                    .strip_prefix('#')
                    .is_some_and(|d| !d.is_empty() && d.chars().all(|c| c.is_ascii_digit()));
            if !ok {
                return Err(format!("bad entity &{entity}; in {chunk:?}"));
            }
            rest = &rest[at + end + 1..];
        }
        Ok(())
    }
    fn name_ok(name: &str) -> bool {
        let mut chars = name.chars();
        chars
            .next()
            .is_some_and(|c| c.is_alphabetic() || c == '_' || c == ':')
            && chars.all(|c| c.is_alphanumeric() || matches!(c, '_' | ':' | '-' | '.'))
    }
    let mut tags = Vec::new();
    let mut stack: Vec<String> = Vec::new();
    let mut roots = 0;
    let mut rest = text.trim_start_matches('\u{feff}');
    if let Some(decl) = rest.strip_prefix("<?xml") {
        rest = &decl[decl.find("?>").ok_or("unterminated XML declaration")? + 2..];
    }
    loop {
        let Some(open) = rest.find('<') else {
            if !rest.trim().is_empty() && stack.is_empty() {
                return Err(format!("text after the root: {rest:?}"));
            }
            check_entities(rest)?;
            break;
        };
        let before = &rest[..open];
        if stack.is_empty() && !before.trim().is_empty() {
            return Err(format!("text outside the root: {before:?}"));
        }
        check_entities(before)?;
        let close = rest[open..].find('>').ok_or("unterminated tag")? + open;
        let inner = &rest[open + 1..close];
        rest = &rest[close + 1..];
        let (closing, inner) = match inner.strip_prefix('/') {
            Some(inner) => (true, inner),
            None => (false, inner),
        };
        let (empty, inner) = match inner.strip_suffix('/') {
            Some(inner) => (true, inner),
            None => (false, inner),
        };
        let name_end = inner
            .find(|c: char| c.is_whitespace())
            .unwrap_or(inner.len());
        let name = &inner[..name_end];
        if !name_ok(name) {
            return Err(format!("bad element name {name:?}"));
        }
        let mut attributes = Vec::new();
        let mut attrs = inner[name_end..].trim_start();
        while !attrs.is_empty() {
            let eq = attrs
                .find('=')
                .ok_or_else(|| format!("attribute without value in <{name}>"))?;
            let attr = attrs[..eq].trim();
            if !name_ok(attr) {
                return Err(format!("bad attribute name {attr:?} in <{name}>"));
            }
            let after = attrs[eq + 1..].trim_start();
            let quote = after
                .chars()
                .next()
                .filter(|c| *c == '"' || *c == '\'')
                .ok_or_else(|| format!("unquoted attribute {attr} in <{name}>"))?;
            let end = after[1..]
                .find(quote)
                .ok_or_else(|| format!("unterminated attribute {attr} in <{name}>"))?;
            let value = &after[1..1 + end];
            if value.contains('<') {
                return Err(format!("'<' in attribute {attr} of <{name}>"));
            }
            check_entities(value)?;
            if attributes.iter().any(|(n, _)| n == attr) {
                return Err(format!("attribute {attr} twice in <{name}>"));
            }
            attributes.push((attr.to_owned(), value.to_owned()));
            let next = &after[2 + end..];
            if !next.is_empty() && !next.starts_with(char::is_whitespace) {
                return Err(format!("no space after attribute {attr} in <{name}>"));
            }
            attrs = next.trim_start();
        }
        if closing {
            if empty || !attributes.is_empty() {
                return Err(format!("malformed end tag </{name}>"));
            }
            let top = stack
                .pop()
                .ok_or_else(|| format!("</{name}> closes nothing"))?;
            if top != name {
                return Err(format!("</{name}> closes <{top}>"));
            }
        } else {
            if stack.is_empty() {
                roots += 1;
                if roots > 1 {
                    return Err(format!("a second root element <{name}>"));
                }
            }
            if !empty {
                stack.push(name.to_owned());
            }
        }
        tags.push(Tag {
            name: name.to_owned(),
            attributes,
            closing,
            empty,
        });
    }
    if let Some(open) = stack.last() {
        return Err(format!("<{open}> never closed"));
    }
    if roots != 1 {
        return Err("no root element".to_owned());
    }
    Ok(tags)
}

#[test]
fn the_xml_check_rejects_what_is_not_well_formed() {
    let good = r#"<svg a="1"><g><polyline points="1,2"/></g><text>a &amp; b</text></svg>"#;
    assert_eq!(parse_xml(good).unwrap().len(), 7);
    for bad in [
        "<svg><g></svg>",
        "<svg a=1/>",
        r#"<svg a="1" a="2"/>"#,
        "<svg>a & b</svg>",
        "<svg/><svg/>",
        "<svg>",
        r#"<svg a="<"/>"#,
        "</svg>",
    ] {
        assert!(parse_xml(bad).is_err(), "{bad} accepted");
    }
}

#[test]
fn autoscaled_run_prints_the_table_and_writes_the_plot() {
    let (dir, cluster, workload) = files("autoscale-cli");
    let plot = dir.join("day.svg");
    let _ = std::fs::remove_file(&plot);
    let output = ditto(&[
        "run",
        "--cluster",
        &cluster,
        "--workload",
        &workload,
        "--policies",
        "static,slo-aware",
        "--table",
        "--plot",
        plot.to_str().unwrap(),
    ]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert_eq!(output.status.code(), Some(0));

    // The table: a header naming the pool and the objectives, the columns, one row per
    // policy in the order asked.
    let lines: Vec<&str> = stdout.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 4, "{stdout}");
    assert!(lines[0].contains("llama-3.1-8b-instruct"), "{}", lines[0]);
    assert!(
        lines[0].contains("SLO TTFT 300 ms, TPOT 40 ms"),
        "{}",
        lines[0]
    );
    assert!(lines[0].contains("replicas 1..4"), "{}", lines[0]);
    let columns = [
        "policy",
        "SLO att.",
        "replica-h",
        "cost",
        "mean rep",
        "peak",
        "up/down",
        "under-prov",
        "p90 TTFT ms",
        "p90 TPOT ms",
    ];
    let mut at = 0;
    for column in columns {
        let found = lines[1][at..]
            .find(column)
            .unwrap_or_else(|| panic!("column {column:?} missing or out of order: {}", lines[1]));
        at += found + column.len();
    }
    let rows: Vec<Vec<&str>> = lines[2..]
        .iter()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(rows[0][0], "static");
    assert_eq!(rows[1][0], "slo-aware");
    for row in &rows {
        // policy, attainment %, replica-h, cost, mean, peak, up/down, under-prov s, p90s.
        assert_eq!(row.len(), 10, "{row:?}");
        let attainment: f64 = row[1].trim_end_matches('%').parse().unwrap();
        assert!((0.0..=100.0).contains(&attainment), "{row:?}");
        let replica_hours: f64 = row[2].parse().unwrap();
        let cost: f64 = row[3].parse().unwrap();
        assert!(replica_hours > 0.0);
        assert!((cost - 3.0 * replica_hours).abs() <= 0.011, "{row:?}");
        let peak: u32 = row[5].parse().unwrap();
        assert!((1..=4).contains(&peak), "{row:?}");
        let (ups, downs) = row[6].split_once('/').unwrap();
        let _: (u32, u32) = (ups.parse().unwrap(), downs.parse().unwrap());
        assert!(row[7].ends_with('s'), "{row:?}");
    }
    // The static pool holds its 3 replicas the whole run; the SLO-aware rule starts at 1.
    assert_eq!(rows[0][5], "3");
    assert_eq!(rows[0][6], "0/0");
    let static_mean: f64 = rows[0][4].parse().unwrap();
    assert!((static_mean - 3.0).abs() < 0.01, "{:?}", rows[0]);
    // The SLO-aware rule starts at one replica, scales up in the step (late: warm-ups),
    // and back down after it; the static pool of 3 meets the objectives throughout.
    let (ups, downs) = rows[1][6].split_once('/').unwrap();
    assert!(ups.parse::<u32>().unwrap() >= 1, "{:?}", rows[1]);
    assert!(downs.parse::<u32>().unwrap() >= 1, "{:?}", rows[1]);
    assert!(rows[1][5].parse::<u32>().unwrap() >= 2, "{:?}", rows[1]);
    let attainment = |row: &[&str]| row[1].trim_end_matches('%').parse::<f64>().unwrap();
    assert!(attainment(&rows[0]) > attainment(&rows[1]), "{rows:?}");
    // The table is printed on stderr too.
    assert!(stderr.contains(lines[2]), "{stderr}");

    // The plot: well-formed XML, an <svg> root, the three panels' series.
    let svg = std::fs::read_to_string(&plot).unwrap();
    let tags = parse_xml(&svg).unwrap_or_else(|err| panic!("not well-formed: {err}\n{svg}"));
    let root = &tags[0];
    assert_eq!(root.name, "svg");
    assert_eq!(root.attribute("xmlns"), Some("http://www.w3.org/2000/svg"));
    let series: Vec<(&str, Option<&str>, &Tag)> = tags
        .iter()
        .filter(|t| t.name == "polyline" && !t.closing)
        .map(|t| {
            (
                t.attribute("data-series").unwrap_or(""),
                t.attribute("data-policy"),
                t,
            )
        })
        .collect();
    let named = |name: &str| -> Vec<Option<&str>> {
        series
            .iter()
            .filter(|(s, _, _)| *s == name)
            .map(|(_, p, _)| *p)
            .collect()
    };
    assert_eq!(named("load").len(), 1, "one load line");
    assert_eq!(named("replicas"), [Some("static"), Some("slo-aware")]);
    assert_eq!(named("p90-ttft"), [Some("static"), Some("slo-aware")]);
    assert_eq!(series.len(), 5, "no other polyline");
    for (name, _, tag) in &series {
        assert!(tag.empty, "{name}: a polyline is an empty element");
        let points = tag.attribute("points").unwrap();
        let parsed: Vec<(f64, f64)> = points
            .split_whitespace()
            .map(|p| {
                let (x, y) = p.split_once(',').unwrap();
                (x.parse().unwrap(), y.parse().unwrap())
            })
            .collect();
        // One point per 15 s sync over a run of 540+ s.
        assert!(parsed.len() >= 36, "{name}: {} points", parsed.len());
        assert!(
            parsed.windows(2).all(|w| w[0].0 < w[1].0),
            "{name}: time goes forward"
        );
    }
    // The load line rises during the step (a lower y is higher in SVG).
    let load = series.iter().find(|(s, _, _)| *s == "load").unwrap().2;
    let ys: Vec<f64> = load
        .attribute("points")
        .unwrap()
        .split_whitespace()
        .map(|p| p.split_once(',').unwrap().1.parse().unwrap())
        .collect();
    let first = ys[0];
    let lowest = ys.iter().copied().fold(f64::INFINITY, f64::min);
    assert!(
        lowest < first - 50.0,
        "the step shows: {first} then {lowest}"
    );
    // The legend names both policies.
    assert!(svg.contains(">static</text>") && svg.contains(">slo-aware</text>"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn autoscaled_run_refuses_bad_flags_with_exit_2() {
    let (dir, cluster, workload) = files("autoscale-cli-bad");
    let plot = dir.join("plot.svg");
    let cases: [(Vec<&str>, &str); 3] = [
        (vec!["--policies", "static,bogus"], "--policies"),
        (vec!["--policies", " , "], "--policies"),
        (
            vec!["--plot", "/nonexistent-ditto-dir/sub/plot.svg"],
            "--plot",
        ),
    ];
    for (extra, flag) in cases {
        let mut args = vec![
            "run",
            "--cluster",
            &cluster,
            "--workload",
            &workload,
            "--table",
        ];
        args.extend(extra.iter().copied());
        let started = std::time::Instant::now();
        let output = ditto(&args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{extra:?}: {stderr}");
        assert!(stderr.contains(flag), "{extra:?} names {flag}: {stderr}");
        assert!(output.stdout.is_empty(), "{extra:?}: nothing on stdout");
        // Refused before any policy runs.
        assert!(!stderr.contains("done in"), "{extra:?}: {stderr}");
        assert!(started.elapsed().as_secs() < 60);
    }
    // The unknown policy is named, and so are the known ones.
    let output = ditto(&[
        "run",
        "--cluster",
        &cluster,
        "--workload",
        &workload,
        "--policies",
        "bogus",
    ]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("\"bogus\"") && stderr.contains("slo-aware"),
        "{stderr}"
    );
    // A plot path that names a directory cannot be written either.
    let output = ditto(&[
        "run",
        "--cluster",
        &cluster,
        "--workload",
        &workload,
        "--plot",
        dir.to_str().unwrap(),
    ]);
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("--plot"));
    assert!(!plot.exists());
    let _ = std::fs::remove_dir_all(&dir);
}
