//! The autoscaling comparison's report: its JSON shape, a table, and an SVG plot
//! (hand-written, no plotting dependency) of load, replicas and P90 TTFT over time, one line
//! per policy.

use std::fmt::Write as _;

use serde::Serialize;

use crate::cluster::autoscale::PolicyOutcome;

/// The JSON of an autoscaled run.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct AutoscaleJson {
    /// Model, GPU and TP of the pool.
    pub pool: String,
    /// Where requests came from.
    pub workload: String,
    /// Seed.
    pub seed: u64,
    /// TTFT objective (ms).
    pub ttft_slo_ms: f64,
    /// TPOT objective (ms).
    pub tpot_slo_ms: f64,
    /// Replica bounds.
    pub min_replicas: u32,
    /// Replica bounds.
    pub max_replicas: u32,
    /// Warm-up range (s).
    pub warm_up_s: [f64; 2],
    /// One replica's calibrated capacity, req/s (0 when no predictive policy ran).
    pub capacity_per_replica: f64,
    /// One line per policy.
    pub policies: Vec<PolicyJson>,
}

/// One policy's line of the comparison.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct PolicyJson {
    /// Policy.
    pub policy: String,
    /// Share of requests completed within both objectives.
    pub slo_attainment: f64,
    /// Pod-hours held (warming, ready, draining).
    pub replica_hours: f64,
    /// Replica-hours × the pool's cost_per_hour.
    pub cost: f64,
    /// Mean pods held.
    pub mean_replicas: f64,
    /// Most pods held at a sync.
    pub peak_replicas: u32,
    /// Syncs that scaled up.
    pub scale_ups: u32,
    /// Syncs that scaled down.
    pub scale_downs: u32,
    /// Pods started.
    pub pods_added: u32,
    /// Pods stopped.
    pub pods_removed: u32,
    /// Seconds whose window P90 TTFT or TPOT exceeded its objective.
    pub time_under_provisioned_s: f64,
    /// TTFT p50, p90, p99 (ms).
    pub ttft_ms: [f64; 3],
    /// TPOT p50, p90, p99 (ms).
    pub tpot_ms: [f64; 3],
    /// Requests submitted.
    pub requests: u64,
    /// Requests completed.
    pub completed: u64,
    /// Simulated seconds.
    pub duration_s: f64,
    /// Events processed.
    pub events: u64,
}

/// The comparison table (one line per policy).
pub fn table(json: &AutoscaleJson) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{}; SLO TTFT {} ms, TPOT {} ms; replicas {}..{}; warm-up {}-{} s; capacity {:.2} req/s/replica",
        json.pool,
        json.ttft_slo_ms,
        json.tpot_slo_ms,
        json.min_replicas,
        json.max_replicas,
        json.warm_up_s[0],
        json.warm_up_s[1],
        json.capacity_per_replica
    );
    let _ = writeln!(
        out,
        "{:<12} {:>10} {:>13} {:>10} {:>9} {:>5} {:>9} {:>11} {:>12} {:>12}",
        "policy",
        "SLO att.",
        "replica-h",
        "cost",
        "mean rep",
        "peak",
        "up/down",
        "under-prov",
        "p90 TTFT ms",
        "p90 TPOT ms"
    );
    for p in &json.policies {
        let _ = writeln!(
            out,
            "{:<12} {:>9.2}% {:>13.2} {:>10.2} {:>9.2} {:>5} {:>9} {:>10.0}s {:>12.0} {:>12.1}",
            p.policy,
            100.0 * p.slo_attainment,
            p.replica_hours,
            p.cost,
            p.mean_replicas,
            p.peak_replicas,
            format!("{}/{}", p.scale_ups, p.scale_downs),
            p.time_under_provisioned_s,
            p.ttft_ms[1],
            p.tpot_ms[1]
        );
    }
    out
}

const WIDTH: f64 = 960.0;
const PANEL: f64 = 200.0;
const LEFT: f64 = 70.0;
const TOP: f64 = 40.0;
const GAP: f64 = 40.0;
const COLORS: [&str; 6] = [
    "#444444", "#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e",
];
/// Most points drawn per line (the timeline is thinned by taking each bucket's maximum).
const POINTS_MAX: usize = 1_200;

/// An SVG of three panels sharing the time axis: arrivals per second, replicas held, and
/// the window P90 TTFT (log-free, clipped at 4 × the objective), one line per policy.
pub fn svg(json: &AutoscaleJson, outcomes: &[PolicyOutcome]) -> String {
    let axes = Axes {
        end_s: outcomes
            .iter()
            .flat_map(|o| o.timeline.last().map(|s| s.at_s))
            .fold(1.0, f64::max),
        plot_w: WIDTH - LEFT - 160.0,
        rate_max: outcomes
            .iter()
            .flat_map(|o| o.timeline.iter().map(|s| s.arrival_rate))
            .fold(1e-9, f64::max),
        replicas_max: f64::from(json.max_replicas.max(1)) * 1.1,
        ttft_max: json.ttft_slo_ms * 4.0,
    };
    let height = TOP + 3.0 * PANEL + 2.0 * GAP + 60.0;
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(
        out,
        r#"<text x="{LEFT}" y="20" font-size="14">{}</text>"#,
        escape(&format!(
            "{} — {} (SLO TTFT {} ms, TPOT {} ms)",
            json.pool, json.workload, json.ttft_slo_ms, json.tpot_slo_ms
        ))
    );
    panels(&mut out, &axes, json.ttft_slo_ms);
    time_axis(&mut out, &axes);
    // The load (the same for every policy: the first one's).
    if let Some(first) = outcomes.first() {
        let points = thin(first.timeline.iter().map(|s| (s.at_s, s.arrival_rate)));
        let series = Series {
            name: "load",
            policy: None,
            color: "#444444",
        };
        polyline(
            &mut out,
            &points,
            &|t| axes.x(t),
            TOP,
            axes.rate_max,
            &series,
        );
    }
    for (index, outcome) in outcomes.iter().enumerate() {
        policy_lines(&mut out, &axes, index, outcome);
    }
    out.push_str("</svg>\n");
    out
}

/// Where the chart puts a time and each panel's values: the run's end, the plot's width and
/// each panel's top value.
struct Axes {
    end_s: f64,
    plot_w: f64,
    rate_max: f64,
    replicas_max: f64,
    ttft_max: f64,
}

impl Axes {
    /// The horizontal position of time `t`, seconds.
    fn x(&self, t: f64) -> f64 {
        LEFT + self.plot_w * t / self.end_s
    }
}

/// The three panels' frames, titles and value ticks, and the TTFT panel's SLO line.
fn panels(out: &mut String, axes: &Axes, ttft_slo_ms: f64) {
    let plot_w = axes.plot_w;
    let panels: [(&str, f64); 3] = [
        ("arrivals (req/s)", 0.0),
        ("replicas held", 1.0),
        ("P90 TTFT (ms, clipped)", 2.0),
    ];
    for (title, index) in panels {
        let top = TOP + index * (PANEL + GAP);
        let _ = writeln!(
            out,
            r##"<rect x="{LEFT}" y="{top}" width="{plot_w}" height="{PANEL}" fill="none" stroke="#999"/>"##
        );
        let _ = writeln!(out, r#"<text x="{LEFT}" y="{}">{title}</text>"#, top - 6.0);
        let max = [axes.rate_max, axes.replicas_max, axes.ttft_max][index as usize];
        for tick in 0..=4 {
            let value = max * f64::from(tick) / 4.0;
            let y = top + PANEL - PANEL * f64::from(tick) / 4.0;
            let _ = writeln!(
                out,
                r##"<text x="{}" y="{}" text-anchor="end" fill="#555">{value:.0}</text>"##,
                LEFT - 6.0,
                y + 4.0
            );
        }
        if index == 2.0 {
            let y = top + PANEL - PANEL * ttft_slo_ms / axes.ttft_max;
            let _ = writeln!(
                out,
                r##"<line x1="{LEFT}" y1="{y:.1}" x2="{}" y2="{y:.1}" stroke="#999" stroke-dasharray="4 4"/>"##,
                LEFT + plot_w
            );
        }
    }
}

/// The time axis's labels (hours when the run is long).
fn time_axis(out: &mut String, axes: &Axes) {
    let bottom = TOP + 3.0 * PANEL + 2.0 * GAP;
    for tick in 0..=6 {
        let t = axes.end_s * f64::from(tick) / 6.0;
        let label = if axes.end_s > 7200.0 {
            format!("{:.1} h", t / 3600.0)
        } else {
            format!("{t:.0} s")
        };
        let _ = writeln!(
            out,
            r#"<text x="{:.1}" y="{}" text-anchor="middle">{label}</text>"#,
            axes.x(t),
            bottom + 18.0
        );
    }
}

/// One policy's lines (replicas held, clipped P90 TTFT) in its colour, and its legend entry.
fn policy_lines(out: &mut String, axes: &Axes, index: usize, outcome: &PolicyOutcome) {
    let x = |t| axes.x(t);
    let color = COLORS[(index + 1) % COLORS.len()];
    let replicas = thin(
        outcome
            .timeline
            .iter()
            .map(|s| (s.at_s, f64::from(s.billed))),
    );
    let series = |name| Series {
        name,
        policy: Some(&outcome.policy),
        color,
    };
    polyline(
        out,
        &replicas,
        &x,
        TOP + PANEL + GAP,
        axes.replicas_max,
        &series("replicas"),
    );
    let ttft = thin(
        outcome
            .timeline
            .iter()
            .map(|s| (s.at_s, s.p90_ttft_ms.unwrap_or(0.0).min(axes.ttft_max))),
    );
    polyline(
        out,
        &ttft,
        &x,
        TOP + 2.0 * (PANEL + GAP),
        axes.ttft_max,
        &series("p90-ttft"),
    );
    let legend_y = TOP + 20.0 * index as f64;
    let _ = writeln!(
        out,
        r#"<rect x="{}" y="{}" width="14" height="4" fill="{color}"/><text x="{}" y="{}">{}</text>"#,
        LEFT + axes.plot_w + 16.0,
        legend_y,
        LEFT + axes.plot_w + 36.0,
        legend_y + 6.0,
        escape(&outcome.policy)
    );
}

/// One line of the plot: what it shows (`data-series`), whose it is (`data-policy`), its colour.
struct Series<'a> {
    name: &'static str,
    policy: Option<&'a str>,
    color: &'a str,
}

fn polyline(
    out: &mut String,
    points: &[(f64, f64)],
    x: &dyn Fn(f64) -> f64,
    top: f64,
    max: f64,
    series: &Series<'_>,
) {
    let mut path = String::new();
    for &(t, v) in points {
        let y = top + PANEL - PANEL * (v / max).clamp(0.0, 1.0);
        let _ = write!(path, "{:.1},{:.1} ", x(t), y);
    }
    let policy = series
        .policy
        .map(|p| format!(r#" data-policy="{}""#, escape_attribute(p)))
        .unwrap_or_default();
    let _ = writeln!(
        out,
        r#"<polyline data-series="{}"{policy} fill="none" stroke="{}" stroke-width="1.2" points="{}"/>"#,
        series.name,
        series.color,
        path.trim_end()
    );
}

/// At most [`POINTS_MAX`] points: each bucket's maximum at its first time.
fn thin(points: impl Iterator<Item = (f64, f64)>) -> Vec<(f64, f64)> {
    let all: Vec<(f64, f64)> = points.collect();
    let bucket = all.len().div_ceil(POINTS_MAX).max(1);
    all.chunks(bucket)
        .map(|chunk| {
            let max = chunk.iter().map(|p| p.1).fold(f64::NEG_INFINITY, f64::max);
            (chunk[0].0, max)
        })
        .collect()
}

fn escape_attribute(text: &str) -> String {
    escape(text).replace('"', "&quot;")
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}
