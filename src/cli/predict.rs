//! `ditto predict`: a small client of a running `ditto serve`. Asks one routing question
//! (by default: 2,000 prompt tokens, 256 output tokens, every instance a candidate) and
//! prints one table row per candidate.
//!
//! Exit codes: 0 answered, 1 the server refused or could not be reached, 2 bad flags.

use std::fmt::Write as _;
use std::io::Write as _;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;

use crate::server::client::{ClientTls, predict_routing};
use crate::sim::SloClass;
use crate::twin::question::{
    Background, CandidateRequest, Distribution, OutputLength, PredictOptions, RoutingAnswer,
    RoutingQuestion, SloTargets, StalePolicy,
};

/// Flags of `ditto predict`.
#[derive(Clone, Debug, Args)]
pub struct PredictArgs {
    /// The server's gRPC address.
    #[arg(long, env = "DITTO_ADDR", default_value = "127.0.0.1:9010")]
    pub addr: String,
    /// File holding the bearer token to send (a server started with --auth-reads needs it);
    /// the token may instead come from DITTO_AUTH_TOKEN. Never a flag value.
    #[arg(long, env = "DITTO_AUTH_TOKEN_FILE", value_name = "FILE")]
    pub auth_token_file: Option<std::path::PathBuf>,
    /// Connect over TLS, trusting the CA certificates in this PEM file.
    #[arg(long, value_name = "FILE")]
    pub tls_ca_file: Option<std::path::PathBuf>,
    /// PEM certificate chain to present to a server requiring client certificates (needs
    /// --tls-ca-file and --tls-client-key-file).
    #[arg(long, value_name = "FILE", requires_all = ["tls_ca_file", "tls_client_key_file"])]
    pub tls_client_cert_file: Option<std::path::PathBuf>,
    /// PEM private key of --tls-client-cert-file.
    #[arg(long, value_name = "FILE", requires = "tls_client_cert_file")]
    pub tls_client_key_file: Option<std::path::PathBuf>,
    /// Prompt length in tokens.
    #[arg(long, default_value_t = 2000)]
    pub prompt_tokens: u32,
    /// Expected output length in tokens.
    #[arg(long, default_value_t = 256)]
    pub output_tokens: u32,
    /// max_tokens (0: the expected output length).
    #[arg(long, default_value_t = 0)]
    pub max_tokens: u32,
    /// Candidate instance ids, comma-separated (default: every instance).
    #[arg(long, value_delimiter = ',')]
    pub candidates: Vec<String>,
    /// SLO class: critical, standard, batch, sheddable or background.
    #[arg(long, default_value = "standard")]
    pub slo_class: String,
    /// TTFT objective, ms.
    #[arg(long)]
    pub ttft_slo_ms: Option<f64>,
    /// TPOT objective, ms.
    #[arg(long)]
    pub tpot_slo_ms: Option<f64>,
    /// End-to-end objective, ms.
    #[arg(long)]
    pub e2e_slo_ms: Option<f64>,
    /// Replications per candidate (0: the server's default).
    #[arg(long, default_value_t = 0)]
    pub replications: u32,
    /// Quantiles to report, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "0.5,0.9,0.99")]
    pub quantiles: Vec<f64>,
    /// Stale policy: use-last, exclude, treat-saturated or roll-forward (default: the
    /// server's config).
    #[arg(long)]
    pub stale_policy: Option<String>,
    /// Background arrivals: none or observed-poisson.
    #[arg(long, default_value = "none")]
    pub background: String,
    /// Simulated horizon, ms (0: the server's default).
    #[arg(long, default_value_t = 0.0)]
    pub horizon_ms: f64,
    /// Seed.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Snapshot generation (0: the latest).
    #[arg(long, default_value_t = 0)]
    pub generation: u64,
    /// How long to wait for the answer, ms.
    #[arg(long, default_value_t = 10_000)]
    pub timeout_ms: u64,
}

fn flag_error(flag: &str, reason: impl std::fmt::Display) -> String {
    format!("--{flag}: {reason}")
}

/// Builds the question the flags describe.
pub fn question(args: &PredictArgs) -> Result<RoutingQuestion, String> {
    let slo_class = SloClass::parse(&args.slo_class).ok_or_else(|| {
        flag_error(
            "slo-class",
            "expected critical, standard, batch, sheddable or background",
        )
    })?;
    let stale_policy = match args.stale_policy.as_deref() {
        None => None,
        Some("use-last") => Some(StalePolicy::UseLast),
        Some("exclude") => Some(StalePolicy::Exclude),
        Some("treat-saturated") => Some(StalePolicy::TreatSaturated),
        Some("roll-forward") => Some(StalePolicy::RollForward),
        Some(other) => {
            return Err(flag_error(
                "stale-policy",
                format!(
                    "unknown {other:?}; expected use-last, exclude, treat-saturated or roll-forward"
                ),
            ));
        }
    };
    let background = match args.background.as_str() {
        "none" => Background::None,
        "observed-poisson" => Background::ObservedPoisson,
        other => {
            return Err(flag_error(
                "background",
                format!("unknown {other:?}; expected none or observed-poisson"),
            ));
        }
    };
    if !(args.horizon_ms.is_finite() && args.horizon_ms >= 0.0) {
        return Err(flag_error("horizon-ms", "must be a finite number >= 0"));
    }
    Ok(RoutingQuestion {
        request: CandidateRequest {
            prompt_tokens: args.prompt_tokens,
            token_ids: None,
            block_hashes: Vec::new(),
            output: OutputLength::Point(args.output_tokens),
            max_tokens: args.max_tokens,
            priority: slo_class.priority(),
            slo_class,
            slo: SloTargets {
                ttft_ms: args.ttft_slo_ms,
                tpot_ms: args.tpot_slo_ms,
                e2e_ms: args.e2e_slo_ms,
            },
        },
        candidates: args.candidates.clone(),
        options: PredictOptions {
            replications: args.replications,
            quantiles: args.quantiles.clone(),
            horizon_us: (args.horizon_ms * 1000.0).round() as u64,
            background,
            stale_policy,
            max_signal_age_us: None,
            seed: args.seed,
        },
        now_us: 0,
    })
}

fn dist(dist: &Distribution) -> String {
    let mut text = format!("{:.1}", dist.mean);
    if !dist.quantiles.is_empty() {
        let quantiles: Vec<String> = dist
            .quantiles
            .iter()
            .map(|q| format!("p{}={:.1}", q.quantile * 100.0, q.value))
            .collect();
        let _ = write!(text, " ({})", quantiles.join(" "));
    }
    text
}

/// The answer as a table, one row per candidate.
pub fn render(answer: &RoutingAnswer) -> String {
    let header = [
        "candidate",
        "valid",
        "TTFT ms",
        "TPOT ms",
        "E2E ms",
        "SLO prob",
        "others dE2E ms",
    ];
    let mut rows: Vec<Vec<String>> = vec![header.iter().map(|h| (*h).to_owned()).collect()];
    for candidate in &answer.candidates {
        rows.push(vec![
            candidate.instance_id.clone(),
            if candidate.valid {
                "yes".to_owned()
            } else {
                format!("no: {}", candidate.invalid_reason)
            },
            dist(&candidate.ttft_ms),
            dist(&candidate.tpot_ms),
            dist(&candidate.e2e_ms),
            format!("{:.3}", candidate.slo_probability),
            format!("{:+.1}", candidate.others_delta_e2e_ms),
        ]);
    }
    let widths: Vec<usize> = (0..header.len())
        .map(|column| {
            rows.iter()
                .map(|row| row[column].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in &rows {
        let cells: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, width)| format!("{cell:<width$}"))
            .collect();
        let _ = writeln!(out, "{}", cells.join("  ").trim_end());
    }
    let _ = writeln!(
        out,
        "recommended: {}  (snapshot generation {}, seed {}, {} simulation events)",
        answer.recommended_instance_id.as_deref().unwrap_or("none"),
        answer.generation,
        answer.seed,
        answer.events
    );
    out
}

/// Runs `ditto predict` and returns the process exit code.
pub fn main(args: &PredictArgs) -> ExitCode {
    let question = match question(args) {
        Ok(question) => question,
        Err(message) => {
            eprintln!("error: {message}");
            return ExitCode::from(2);
        }
    };
    let value = std::env::var(crate::server::auth::TOKEN_ENV)
        .ok()
        .filter(|value| !value.is_empty());
    let token = match crate::server::auth::BearerToken::configured(
        args.auth_token_file.as_deref(),
        value.as_deref(),
    ) {
        Ok(token) => token,
        Err(err) => {
            eprintln!("error: --auth-token-file: {err}");
            return ExitCode::from(2);
        }
    };
    let tls = args.tls_ca_file.as_ref().map(|ca| ClientTls {
        ca: ca.clone(),
        identity: args
            .tls_client_cert_file
            .clone()
            .zip(args.tls_client_key_file.clone()),
    });
    let timeout = Duration::from_millis(args.timeout_ms.max(1));
    match predict_routing(
        &args.addr,
        &question,
        args.generation,
        timeout,
        token.as_ref(),
        tls.as_ref(),
    ) {
        Ok(answer) => {
            // A closed pipe (e.g. `| head`) is not an error worth a panic.
            let _ = std::io::stdout().write_all(render(&answer).as_bytes());
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("error: {err}");
            // Unusable TLS files are bad input (2); a failed call is 1.
            let bad_input = matches!(err, crate::server::client::ClientError::Tls(_));
            ExitCode::from(if bad_input { 2 } else { 1 })
        }
    }
}
