//! `ditto validate` and `ditto calibrate` end to end on the measured dev runs in
//! `tests/data/gt` (see its README): the fidelity regression guard, the report's shape, the
//! default model's margin over the published-basis models, and bad input.
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
mod common;

use common::cli::ditto;

use serde_json::Value;

#[path = "cli_validate/knee_tp2.rs"]
mod knee_tp2;
#[path = "cli_validate/offload_connector.rs"]
mod offload_connector;
#[path = "cli_validate/prompt_rounds.rs"]
mod prompt_rounds;

/// Median absolute % errors (whole-run means) across the twenty-five dev runs with the
/// embedded calibrated model when this guard was set (stop 40: 2.13 / 4.68 / 2.32%,
/// docs/fidelity.md; issue 36's goal is 3 / 5 / 3). A change that makes a median worse than
/// its guard fails; re-pin only with a better fit, and update docs/fidelity.md. The TTFT
/// guard was 2.5 until stop 40: the replay then stopped pricing a prefill for every request
/// (the measured runs sent 100 fixed prompts in turn and vLLM's prefix cache served them,
/// docs/fidelity/repeated-prompts.md), and the TTFT median of 1.8% that the old replay had
/// reached came from a prefill priced at 1.59 times the GPU's peak, which no server does.
const GUARD_E2E_MEAN: f64 = 2.5;
const GUARD_TTFT_MEAN: f64 = 5.0;
const GUARD_TPOT_MEAN: f64 = 2.5;

/// Per run: (name, E2E, TTFT, TPOT whole-run mean absolute % error bounds, bound on
/// |predicted − measured| timed-out fraction). Each is the error when the guard was set plus
/// max(1 point, 10%): a regression guard on every run, not the goal (docs/fidelity.md says
/// which runs miss it and why). Re-pin only downward, with docs/fidelity.md; a bound may rise
/// only with a change that makes the medians better or the replay truer, and docs/fidelity.md
/// names each one. Stop 40 set them all again: the replay sends the measured runs' fixed
/// prompts (docs/fidelity/repeated-prompts.md) and the coefficients were refitted on it
/// (`flops` 0.628 -> 1.729), which moved every run. Raised with the reason: 70B × 4
/// reasoning (−9 -> −27% E2E, 0% timed out against 33%: its knee had been reached by charging
/// every admission a prefill the server served from cache; its decode step at 128 long
/// sequences is 9% short, the Mixtral knee's signature, docs/fidelity/knee-tp2.md), the A100
/// runs (−5 / −10% E2E: too fast on the GPU no per-request run constrains; re-pinned
/// downward to +3.2 / −1.3% by the weight-read factor, docs/fidelity/a100.md), Mixtral-8x22B ×
/// 8 "general"'s TTFT, and the TTFT of the Llama-3.1 and roleplay runs (+5-8%: the front end
/// the fit now shares between cold and cached prompts). Stop 41 lowered Mixtral × 2
/// reasoning's (−63 -> −16% E2E: the KV-offload connector's tier walk, `offload_connector.rs`).
const PER_RUN: [(&str, f64, f64, f64, f64); 25] = [
    ("a100-llama3.1-8b-tp1-general-lite", 4.5, 3.0, 4.5, 0.03),
    (
        "a100-qwen3-14b-tp1-general-lite-s2r36",
        2.5,
        10.5,
        2.5,
        0.03,
    ),
    ("h100-codellama34b-tp2-codegen", 2.5, 2.5, 2.5, 0.03),
    ("h100-codellama34b-tp2-general", 2.0, 6.0, 2.0, 0.03),
    ("h100-llama2-70b-tp4-codegen", 2.0, 1.5, 2.0, 0.03),
    ("h100-llama2-70b-tp4-reasoning", 30.0, 37.0, 10.5, 0.37),
    ("h100-llama2-7b-tp1-codegen", 4.0, 7.0, 4.0, 0.03),
    ("h100-llama2-7b-tp1-general", 3.0, 1.5, 3.0, 0.03),
    ("h100-llama2-7b-tp1-reasoning", 2.0, 4.0, 5.5, 0.04),
    ("h100-llama2-7b-tp1-roleplay", 2.5, 8.0, 2.5, 0.03),
    ("h100-llama3.1-8b-tp1-codegen-s2r18", 1.5, 9.0, 1.5, 0.03),
    ("h100-llama3.1-8b-tp1-general-s2r16", 1.5, 6.5, 1.5, 0.03),
    ("h100-llama3.1-8b-tp1-general-s2r22", 11.5, 5.0, 11.5, 0.03),
    ("h100-llama3.1-8b-tp1-general-s2r23", 3.0, 4.5, 3.0, 0.03),
    ("h100-mixtral8x22b-tp8-codegen-s2r50", 1.5, 10.0, 1.5, 0.03),
    ("h100-mixtral8x22b-tp8-general-s2r49", 5.0, 12.5, 5.0, 0.03),
    ("h100-mixtral8x7b-tp2-general", 3.5, 10.0, 3.5, 0.03),
    (
        "h100-mixtral8x7b-tp2-general-lite-s2r27",
        8.0,
        4.5,
        8.0,
        0.03,
    ),
    ("h100-mixtral8x7b-tp2-general-s2r28", 3.5, 2.0, 3.5, 0.03),
    ("h100-mixtral8x7b-tp2-reasoning", 18.5, 25.5, 12.5, 0.15),
    ("h100-mixtral8x7b-tp2-roleplay", 6.5, 6.5, 6.5, 0.03),
    ("h100-qwen3-14b-tp1-codegen-s2r14", 3.5, 2.0, 3.5, 0.03),
    ("h100-qwen3-14b-tp1-general-s2r13", 2.0, 5.0, 2.0, 0.03),
    (
        "h100-scout17b16e-fp8-tp2-general-lite-s2r17",
        4.0,
        3.5,
        4.0,
        0.03,
    ),
    (
        "h100-scout17b16e-fp8-tp2-roleplay-s2r21",
        7.5,
        5.5,
        8.0,
        0.03,
    ),
];

/// The four runs the published-basis comparison replays (the first dev set: each model
/// once, both GPUs). The physics and roofline models saturate on the overloaded runs, which
/// makes their replays long in a debug build and says nothing more about the margin.
const FIRST_FOUR: [&str; 4] = [
    "a100-llama3.1-8b-tp1-general-lite",
    "h100-codellama34b-tp2-codegen",
    "h100-llama2-7b-tp1-general",
    "h100-mixtral8x7b-tp2-general",
];

fn runs() -> Vec<String> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/gt");
    let mut dirs: Vec<String> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir())
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    dirs.sort();
    dirs
}

fn validate_json(model: &str, dirs: &[String]) -> Value {
    validate_json_with(&["--latency-model", model], dirs)
}

/// `ditto validate --json` of `dirs` with the flags `flags`.
fn validate_json_with(flags: &[&str], dirs: &[String]) -> Value {
    let mut args = vec!["validate", "--json"];
    args.extend(flags);
    args.extend(dirs.iter().map(String::as_str));
    let out = ditto(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn first_four() -> Vec<String> {
    runs()
        .into_iter()
        .filter(|d| FIRST_FOUR.iter().any(|name| d.ends_with(name)))
        .collect()
}

fn median(report: &Value, metric: &str) -> f64 {
    report["median_ape_percent"][metric].as_f64().unwrap()
}

/// A run's whole-run absolute % error of `metric` (e.g. `e2e_mean`) in a `validate --json`
/// report.
fn ape(report: &Value, name: &str, metric: &str) -> f64 {
    whole_run(report, name)["ape_percent"][metric]
        .as_f64()
        .unwrap()
}

/// Run `name` in a `validate --json` report.
fn run_of<'a>(report: &'a Value, name: &str) -> &'a Value {
    report["runs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == name)
        .unwrap()
}

/// The whole-run stage of run `name` in a `validate --json` report.
fn whole_run<'a>(report: &'a Value, name: &str) -> &'a Value {
    &run_of(report, name)["stages"][0]
}

/// A stage's signed % error on `metric` (+ = predicted slower) in a `validate --json` report.
fn signed_error(stage: &Value, metric: &str) -> f64 {
    let predicted = stage["predicted_ms"][metric].as_f64().unwrap();
    let measured = stage["measured_ms"][metric].as_f64().unwrap();
    (predicted / measured - 1.0) * 100.0
}

/// Where a twenty-five-run report breaks the guard: each run's bounds ([`PER_RUN`]) and the
/// medians; empty if it holds.
fn guard_failures(report: &Value) -> Vec<String> {
    let runs = report["runs"].as_array().unwrap();
    assert_eq!(runs.len(), PER_RUN.len());
    let mut failures = Vec::new();
    for (run, (name, e2e, ttft, tpot, timed_out)) in runs.iter().zip(PER_RUN) {
        assert_eq!(run["name"].as_str(), Some(name));
        let ape = &run["stages"][0]["ape_percent"];
        for (metric, bound) in [("e2e_mean", e2e), ("ttft_mean", ttft), ("tpot_mean", tpot)] {
            let error = ape[metric].as_f64().unwrap();
            if error > bound {
                failures.push(format!("{name} {metric}: {error}% > {bound}%"));
            }
        }
        let fraction = &run["timed_out_fraction"];
        let predicted = fraction["predicted"].as_f64().unwrap();
        let measured = fraction["measured"].as_f64().unwrap_or(0.0);
        if (predicted - measured).abs() > timed_out {
            failures.push(format!(
                "{name} timed out: predicted {predicted} vs measured {measured} (bound {timed_out})"
            ));
        }
    }
    for (metric, guard) in [
        ("e2e_mean", GUARD_E2E_MEAN),
        ("ttft_mean", GUARD_TTFT_MEAN),
        ("tpot_mean", GUARD_TPOT_MEAN),
    ] {
        let value = median(report, metric);
        if value > guard {
            failures.push(format!("median {metric}: {value}% > {guard}%"));
        }
    }
    failures
}

#[test]
fn calibrated_model_stays_within_the_fidelity_guard() {
    // Goal: every dev run replays (overloaded ones included), and the default model's errors
    // on each run and as medians never regress past the figures this work reached. Method:
    // replay all twenty-five runs once, read per-run errors, timed-out fractions and medians.
    let report = validate_json("calibrated", &runs());
    let failures = guard_failures(&report);
    let runs = report["runs"].as_array().unwrap();
    for run in runs {
        let name = run["name"].as_str().unwrap();
        // The report's shape: whole run first, then each stage; KS only with per-request
        // truth; the servers ignored EOS, so every run simulates its configured length.
        let stages = run["stages"].as_array().unwrap();
        assert_eq!(stages[0]["stage"].as_i64(), Some(-1), "{name}");
        let per_request = !name.starts_with("a100") && !name.contains("-s2r");
        for stage in stages {
            assert!(stage["count"].as_u64().unwrap() > 500, "{name}");
            assert_eq!(stage["ks_ttft"].is_number(), per_request, "{name}");
            for metric in ["e2e_mean", "e2e_p90", "ttft_mean", "ttft_p90", "tpot_mean"] {
                assert!(stage["predicted_ms"][metric].as_f64().unwrap() > 0.0);
                assert!(stage["measured_ms"][metric].as_f64().unwrap() > 0.0);
            }
        }
        assert!(matches!(
            run["output_len_simulated"].as_u64(),
            Some(247 | 248 | 251 | 1448)
        ));
        if !name.contains("reasoning") {
            assert_eq!(run["unfinished_requests"].as_u64(), Some(0), "{name}");
        }
    }
    // The overloaded Llama-2-7b run: most requests time out, as measured.
    let overloaded = runs
        .iter()
        .find(|r| r["name"] == "h100-llama2-7b-tp1-reasoning")
        .unwrap();
    assert!(
        overloaded["timed_out_fraction"]["predicted"]
            .as_f64()
            .unwrap()
            > 0.5
    );
    assert!(failures.is_empty(), "{failures:#?}");
}

/// The shipped coefficients with `allreduce_measured` at 0: every all-reduce priced by the
/// formula (`allreduce_us`, the per-peer latency, the link), as on a GPU or TP degree the
/// measured table has no curve for.
fn formula_allreduce_file(tag: &str) -> (PathBuf, String) {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("data/coefficients/ditto-calibrated.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    let on = text
        .lines()
        .find(|l| l.trim_start().starts_with("allreduce_measured:"))
        .unwrap()
        .to_string();
    assert_eq!(
        on.trim(),
        "allreduce_measured: 1.116215",
        "the shipped scale"
    );
    let formula = text.replace(&on, "  allreduce_measured: 0.000000");
    let file = std::env::temp_dir().join(format!("ditto-{tag}-{}.yaml", std::process::id()));
    std::fs::write(&file, &formula).unwrap();
    (file, formula)
}

#[test]
fn the_formula_prices_the_tp4_step_and_its_first_token_step() {
    // Goal: pin the findings of docs/fidelity.md "The TTFT split" for the all-reduce formula,
    // which prices every GPU and TP degree the measured table has no curve for (since stop 38
    // H100 TP 4 is priced from the measured kernels instead): the all-reduce latency of the
    // peers beyond the first (`allreduce_base_peers` 1, so TP 1 and TP 2 are priced as by the
    // four-run fit alone) brings Llama-2-70b × 4 codegen within 3% E2E, where the fit alone
    // is ~13% too fast; the first token's decode step pays the latency like any engine step
    // (`first_token_peer_share` 1) and the TTFT stays within 3.5%; not paying it (share 0)
    // moves the TTFT 2-5 points faster. Method: the shipped file with `allreduce_measured` 0
    // over that run, then the same with the share at 0; signed TTFT errors.
    let tp4 = "h100-llama2-70b-tp4-codegen";
    let dirs: Vec<String> = runs().into_iter().filter(|d| d.ends_with(tp4)).collect();
    let (file, text) = formula_allreduce_file("ar-formula");
    let report = validate_json(&file.to_string_lossy(), &dirs);
    let e2e = ape(&report, tp4, "e2e_mean");
    assert!(e2e < 3.0, "70B x4 E2E {e2e}%");
    let ttft = signed_error(whole_run(&report, tp4), "ttft_mean");
    assert!(ttft.abs() < 3.5, "70B x4 TTFT {ttft}%");
    let shipped = "first_token_peer_share: 1.000000";
    assert!(text.contains(shipped), "the shipped share");
    std::fs::write(&file, text.replace(shipped, "first_token_peer_share: 0.0")).unwrap();
    let without = validate_json(&file.to_string_lossy(), &dirs);
    let _ = std::fs::remove_file(&file);
    let shift = ttft - signed_error(whole_run(&without, tp4), "ttft_mean");
    assert!(
        (2.0..5.0).contains(&shift),
        "share 1 against 0: 70B x4 TTFT {shift} points"
    );
}

#[test]
fn calibrated_model_beats_the_published_basis_models() {
    // Goal: the default is the better model (why it is the default). Method: the same
    // replay of the first four dev runs with BLIS's trained-physics coefficients and with
    // the plain roofline.
    let dirs = first_four();
    assert_eq!(dirs.len(), 4);
    let calibrated = median(&validate_json("calibrated", &dirs), "e2e_mean");
    for other in ["physics", "roofline"] {
        let theirs = median(&validate_json(other, &dirs), "e2e_mean");
        assert!(
            calibrated * 2.0 < theirs,
            "calibrated {calibrated}% vs {other} {theirs}%"
        );
    }
}

#[test]
fn calibrate_writes_coefficients_that_validate_accepts() {
    // Goal: `calibrate` output is a valid `--latency-model` file and the fit moves toward
    // the data. Method: a short warm fit of two coefficients on one run's first stage.
    let dir = runs()
        .into_iter()
        .find(|d| d.contains("codellama"))
        .unwrap();
    let out_file = std::env::temp_dir().join(format!("ditto-cal-{}.yaml", std::process::id()));
    let out_path = out_file.to_string_lossy().into_owned();
    let out = ditto(&[
        "calibrate",
        &dir,
        "--start",
        "roofline",
        "--through-stage",
        "0",
        "--free",
        "step_us,weights",
        "--evaluations",
        "16",
        "--out",
        &out_path,
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(report.contains("weights:"), "{report}");
    let text = std::fs::read_to_string(&out_file).unwrap();
    assert!(
        text.contains("provenance:") && text.contains("step_us:"),
        "{text}"
    );
    let validated = ditto(&["validate", &dir, "--latency-model", &out_path, "--json"]);
    assert!(
        validated.status.success(),
        "{}",
        String::from_utf8_lossy(&validated.stderr)
    );
    let fitted: Value = serde_json::from_slice(&validated.stdout).unwrap();
    let roofline = ditto(&["validate", &dir, "--latency-model", "roofline", "--json"]);
    let roofline: Value = serde_json::from_slice(&roofline.stdout).unwrap();
    let e2e = |v: &Value| {
        v["runs"][0]["stages"][1]["ape_percent"]["e2e_mean"]
            .as_f64()
            .unwrap()
    };
    assert!(
        e2e(&fitted) < e2e(&roofline),
        "fit {} vs roofline {}",
        e2e(&fitted),
        e2e(&roofline)
    );
    let _ = std::fs::remove_file(out_file);
}

#[test]
fn the_tp_peer_candidate_prices_the_tp4_step() {
    // Goal: the candidate coefficients with the all-reduce peer latency
    // (data/coefficients/ditto-calibrated-tp-peers.yaml, docs/fidelity.md "The TP 4 step")
    // load and keep the TP 4 run they were fitted on within a few percent, where the default
    // is ~13% too fast, and leave the TP 1 runs alone. Method: Llama-2-70b × 4 codegen and
    // Llama-2-7b codegen, both models.
    let dirs: Vec<String> = runs()
        .into_iter()
        .filter(|d| {
            d.ends_with("h100-llama2-70b-tp4-codegen") || d.ends_with("h100-llama2-7b-tp1-codegen")
        })
        .collect();
    assert_eq!(dirs.len(), 2);
    let file = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("data/coefficients/ditto-calibrated-tp-peers.yaml")
        .to_string_lossy()
        .into_owned();
    let e2e = |report: &Value, name: &str| ape(report, name, "e2e_mean");
    let candidate = validate_json(&file, &dirs);
    let default = validate_json("calibrated", &dirs);
    let tp4 = "h100-llama2-70b-tp4-codegen";
    // The candidate was fitted on the replay of before stop 40, which priced a prefill for
    // every request; replayed with the runs' fixed prompts it is 6.7% fast on this run.
    assert!(e2e(&candidate, tp4) < 7.5, "{}", e2e(&candidate, tp4));
    // The default prices the TP 4 step too: from stop 30 with the per-peer latency (issue 36:
    // -2.0 against -1.8% E2E), since stop 38 with the measured H100 TP 4 all-reduce (stop 38
    // +5% with a phantom prefill per request, stop 40 +0.9% without; docs/fidelity.md, "The
    // measured all-reduce").
    assert!(e2e(&default, tp4) < 2.0, "{}", e2e(&default, tp4));
    assert!(e2e(&candidate, "h100-llama2-7b-tp1-codegen") < 1.5);
}

#[test]
fn the_a100_kv_reads_are_priced_for_its_attention_kernel() {
    // Goal: pin where the A100 run's miss was and what closed it (docs/fidelity.md,
    // "Limits"): without the GPU table's KV-read factor for FlashAttention 2 (2.5 on Ampere,
    // from Vidur's kernel profiles, not fitted on this run) the E2E error grows from stage 0
    // to stage 1 (~8 -> ~22 running sequences: a cost per sequence and context token is
    // missing); with it the two stages' errors are equal and the whole run is within 10%.
    // Both variants keep the A100's weight-read factor (1.10, data/gpu_gemm.json), which
    // prices every step's weight stream dearer: the default went from −5.2% to +3.2% E2E,
    // and the variant without the KV factor from −15.6% to −8.1% (stages −1.7 / −10.3), so
    // its whole-run bound is −5 now, not −15 (docs/fidelity/a100.md, "Measured effect"); its
    // stage growth holds (−8.0 -> −8.7 points).
    // Method: the A100 run replayed with the default and with the shipped file whose `kv`
    // is divided by the factor (the same KV price as no factor); signed E2E per stage.
    let dirs: Vec<String> = runs()
        .into_iter()
        .filter(|d| d.ends_with("a100-llama3.1-8b-tp1-general-lite"))
        .collect();
    assert_eq!(dirs.len(), 1);
    let shipped_path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("data/coefficients/ditto-calibrated.yaml");
    let shipped = std::fs::read_to_string(shipped_path).unwrap();
    let kv_line = shipped
        .lines()
        .find(|l| l.trim_start().starts_with("kv:"))
        .unwrap();
    let kv: f64 = kv_line.split(':').nth(1).unwrap().trim().parse().unwrap();
    let factor = ditto::catalog::gpu("A100-80").unwrap().kv_read_factor;
    assert!(
        factor > 1.0,
        "the A100's attention kernel reads KV dearer than Hopper's"
    );
    let file = std::env::temp_dir().join(format!("ditto-a100-kv-{}.yaml", std::process::id()));
    std::fs::write(
        &file,
        shipped.replace(kv_line, &format!("  kv: {}", kv / factor)),
    )
    .unwrap();
    // Signed E2E error (%) of stage `i` (0: the whole run, then the rate stages).
    let signed =
        |report: &Value, i: usize| signed_error(&report["runs"][0]["stages"][i], "e2e_mean");
    let default = validate_json("calibrated", &dirs);
    let no_factor = validate_json(&file.to_string_lossy(), &dirs);
    let _ = std::fs::remove_file(&file);
    let growth = |r: &Value| signed(r, 2) - signed(r, 1);
    assert!(
        growth(&no_factor) < -5.0,
        "no factor: {}",
        growth(&no_factor)
    );
    // Issue 36: the sampler's per-sequence cost grows with the batch too, so stage 1 is now
    // 2.7 points less fast than stage 0 (equal within 1.5 before).
    assert!(
        growth(&default).abs() < 3.0,
        "default: {}",
        growth(&default)
    );
    assert!(signed(&default, 0).abs() < 10.0, "{}", signed(&default, 0));
    assert!(signed(&no_factor, 0) < -5.0, "{}", signed(&no_factor, 0));
}

#[test]
fn the_overloaded_tp_runs_reach_their_knee_once_the_step_is_priced() {
    // Goal: pin where the overloaded TP > 1 runs' miss is (docs/fidelity.md, "The knee at
    // TP > 1"): not in the engine's overload (the 300 s client timeouts, the FIFO queue, the
    // aborts, the recorded KV blocks) but in the decode step at 128 long sequences. Method: the
    // shipped file with `step_us` raised by a constant (a diagnostic, not a model) until each
    // run's predicted TPOT is the measured one; the replay must then time out the measured
    // fraction and land within 10% E2E, where the shipped file times out none.
    let shipped_path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("data/coefficients/ditto-calibrated.yaml");
    let shipped = std::fs::read_to_string(&shipped_path).unwrap();
    let step_line = shipped
        .lines()
        .find(|l| l.trim_start().starts_with("step_us:"))
        .unwrap();
    // (run, `step_us` in µs that puts its predicted TPOT on the measured one: +2.5 ms a step
    // over the shipped 0.50 ms since stop 40 (+3.4 ms before its all-reduces were priced
    // from the measured kernels, stop 38, and +1.2 ms while every admission paid a phantom
    // prefill, stops 38-39), and how much of the measured timed-out fraction the shipped
    // file misses at least). The Mixtral × 2 knee was here too (+12.0 ms) until stop 41: the
    // KV-offload connector's tier walk now prices its step (`offload_connector.rs`).
    let knees: &[(&str, u32, f64)] = &[("h100-llama2-70b-tp4-reasoning", 3_000, 0.25)];
    for &(name, step_us, miss) in knees {
        let dirs: Vec<String> = runs().into_iter().filter(|d| d.ends_with(name)).collect();
        assert_eq!(dirs.len(), 1);
        let default = validate_json("calibrated", &dirs);
        let measured = default["runs"][0]["timed_out_fraction"]["measured"]
            .as_f64()
            .unwrap();
        assert!(measured > 0.3, "{name}: measured {measured}");
        let shipped_out = default["runs"][0]["timed_out_fraction"]["predicted"]
            .as_f64()
            .unwrap();
        let file =
            std::env::temp_dir().join(format!("ditto-knee-{}-{name}.yaml", std::process::id()));
        std::fs::write(
            &file,
            shipped.replace(step_line, &format!("  step_us: {step_us}")),
        )
        .unwrap();
        let priced = validate_json(&file.to_string_lossy(), &dirs);
        let _ = std::fs::remove_file(&file);
        let tpot = ape(&priced, name, "tpot_mean");
        assert!(tpot < 3.0, "{name}: TPOT {tpot}% with the step priced");
        let out = priced["runs"][0]["timed_out_fraction"]["predicted"]
            .as_f64()
            .unwrap();
        assert!(
            (out - measured).abs() < 0.05,
            "{name}: timed out {out} vs measured {measured} with the step priced (shipped: {shipped_out})"
        );
        assert!(
            (measured - shipped_out) > miss,
            "{name}: the shipped file's miss moved: {shipped_out} vs {measured}; update docs/fidelity.md"
        );
        let e2e = ape(&priced, name, "e2e_mean");
        assert!(e2e < 10.0, "{name}: E2E {e2e}% with the step priced");
    }
}

#[test]
fn the_moe_tile_switch_cannot_close_the_mixtral_knee() {
    // Goal: pin docs/fidelity.md "The Mixtral knee: the fused-MoE kernel at 128 sequences":
    // vLLM's tuned fused-MoE tile for Mixtral at TP 2 on H100 changes at 113 tokens
    // (`BLOCK_SIZE_M` 32 → 64), which pads the MMA work from ~298 to 512 rows; even with none
    // of it overlapped with the weight stream, at the model's `moe_flops` efficiency that is
    // 2.7 ms a step, a quarter of the 11.9 ms the knee needs (the test above). Method: the
    // shipped file with `step_us` raised by that upper bound on every step; the reasoning
    // run must stay far from its measured E2E and timed-out fraction (emulated: −46.7% E2E,
    // 13.8% timed out against 68.6%), where the full 11.9 ms reaches both.
    let name = "h100-mixtral8x7b-tp2-reasoning";
    let shipped_path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("data/coefficients/ditto-calibrated.yaml");
    let shipped = std::fs::read_to_string(&shipped_path).unwrap();
    let step_line = shipped
        .lines()
        .find(|l| l.trim_start().starts_with("step_us:"))
        .unwrap();
    let step_us: f64 = step_line.split(':').nth(1).unwrap().trim().parse().unwrap();
    let dirs: Vec<String> = runs().into_iter().filter(|d| d.ends_with(name)).collect();
    assert_eq!(dirs.len(), 1);
    let file = std::env::temp_dir().join(format!("ditto-moe-tile-{}.yaml", std::process::id()));
    std::fs::write(
        &file,
        shipped.replace(step_line, &format!("  step_us: {}", step_us + 2_700.0)),
    )
    .unwrap();
    // Without the KV-offload connector, which prices the knee's step since stop 41: the
    // question is what the tile alone can do.
    let bound = validate_json_with(
        &[
            "--latency-model",
            &file.to_string_lossy(),
            "--no-offload-connector",
        ],
        &dirs,
    );
    let _ = std::fs::remove_file(&file);
    let e2e = signed_error(whole_run(&bound, name), "e2e_mean");
    assert!(e2e < -35.0, "E2E {e2e}% with the tile's upper bound priced");
    let out = bound["runs"][0]["timed_out_fraction"]["predicted"]
        .as_f64()
        .unwrap();
    let measured = bound["runs"][0]["timed_out_fraction"]["measured"]
        .as_f64()
        .unwrap();
    assert!(
        out < measured - 0.3,
        "timed out {out} vs measured {measured} with the tile's upper bound priced"
    );
}

#[test]
fn the_measured_tp4_allreduce_narrows_the_70b_knee_and_prices_its_codegen_run() {
    // Goal: pin docs/fidelity.md "The measured all-reduce" (shipped since stop 38) as it
    // stands since the replay sends the runs' fixed prompts (stop 40): with each H100 TP 4
    // all-reduce priced from the kernel vLLM 0.15 runs at its size
    // (data/allreduce_latency.tsv: the custom kernel below 8 MiB, 26 µs at the 2 MiB of a
    // 128-sequence decode step where the formula prices 17; PyTorch's multimem kernel from
    // 8 MiB), the 70B × 4 reasoning run's E2E error is about halved (formula ~−49%, measured
    // kernels ~−27%) and 70B × 4 codegen is within 2% E2E and TTFT, closer than the formula.
    // Neither reaches the reasoning run's knee (no request times out, a third measured):
    // stop 38's −9% and timed-out fifth came from a prefill charged to every admission that
    // the server served from its prefix cache, and the price of that phantom prefill's
    // all-reduces was 70B codegen's TTFT 13% too slow, gone with it. Method: both 70B × 4
    // runs with the shipped file and with it at `allreduce_measured: 0`; signed errors.
    let names = [
        "h100-llama2-70b-tp4-codegen",
        "h100-llama2-70b-tp4-reasoning",
    ];
    let dirs: Vec<String> = runs()
        .into_iter()
        .filter(|d| names.iter().any(|n| d.ends_with(n)))
        .collect();
    assert_eq!(dirs.len(), 2);
    let (file, _) = formula_allreduce_file("ar-tp4");
    let shipped = validate_json("calibrated", &dirs);
    let formula = validate_json(&file.to_string_lossy(), &dirs);
    let _ = std::fs::remove_file(&file);
    let (codegen, reasoning) = (names[0], names[1]);
    let signed = |r: &Value, name: &str, metric: &str| signed_error(whole_run(r, name), metric);
    let timed_out = |r: &Value| {
        let run = r["runs"]
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["name"] == reasoning)
            .unwrap();
        run["timed_out_fraction"]["predicted"].as_f64().unwrap()
    };
    let before = signed(&formula, reasoning, "e2e_mean");
    let after = signed(&shipped, reasoning, "e2e_mean");
    assert!(before < -40.0, "formula: 70B x4 reasoning E2E {before}%");
    assert!(
        (-32.0..-20.0).contains(&after),
        "measured all-reduce: 70B x4 reasoning E2E {after}% (formula {before}%); update docs/fidelity.md"
    );
    assert_eq!(
        timed_out(&shipped),
        0.0,
        "measured all-reduce: none timed out"
    );
    assert_eq!(timed_out(&formula), 0.0, "formula: none timed out");
    for metric in ["e2e_mean", "ttft_mean"] {
        let (f, m) = (
            signed(&formula, codegen, metric),
            signed(&shipped, codegen, metric),
        );
        assert!(
            m.abs() < 2.0 && m.abs() < f.abs(),
            "70B x4 codegen {metric}: measured all-reduce {m}%, formula {f}%"
        );
    }
}

#[test]
fn bad_input_exits_2_naming_the_problem() {
    let out = ditto(&["validate", "/nonexistent/run"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/run"));

    let empty = std::env::temp_dir().join(format!("ditto-empty-run-{}", std::process::id()));
    std::fs::create_dir_all(&empty).unwrap();
    let out = ditto(&["validate", empty.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("model_config.json"));
    std::fs::write(empty.join("model_config.json"), "{not json").unwrap();
    let out = ditto(&["validate", empty.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("model_config.json"));
    let _ = std::fs::remove_dir_all(&empty);

    let dir = first_four().pop().unwrap();
    let out = ditto(&["validate", &dir, "--output-length", "sometimes"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--output-length"));
    let out = ditto(&["validate", &dir, "--latency-model", "/nonexistent.yaml"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--latency-model"));
    let out = ditto(&["calibrate", &dir, "--leave-out", "cpu"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--leave-out"));
    let out = ditto(&["calibrate", &dir, "--held-out-only"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--held-out-only"));
    let out = ditto(&["calibrate", &dir, "--free", "warp_factor"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("warp_factor"));
}
