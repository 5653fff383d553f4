//! The measured tensor-parallel all-reduce: one all-reduce's time by message size, per GPU
//! and TP degree, from published kernel benchmarks (`data/allreduce_latency.tsv`, embedded
//! at build time; sources in data/PROVENANCE.md). The calibrated model prices each all-reduce
//! from a curve here when its `allreduce_measured` coefficient is on and the GPU and TP degree
//! have one (docs/fidelity.md, "The measured all-reduce").
//!
//! Pure: the file is compiled in and parsed once, no I/O.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use super::LatencyError;

/// The embedded table.
static TABLE_JSON: &str = include_str!("../../../data/allreduce_latency.tsv");

/// One GPU's and TP degree's measured all-reduce: (message bytes, µs) points, bytes strictly
/// increasing, every value finite and non-negative.
#[derive(Clone, Debug, PartialEq)]
pub struct AllreduceCurve {
    points: Vec<(f64, f64)>,
}

impl AllreduceCurve {
    /// Builds a curve from (bytes, µs) points; `Err` names what is wrong with them.
    pub fn new(points: Vec<(f64, f64)>) -> Result<AllreduceCurve, String> {
        if points.is_empty() {
            return Err("no points".to_string());
        }
        for (i, &(bytes, us)) in points.iter().enumerate() {
            if !(bytes.is_finite() && us.is_finite() && bytes >= 0.0 && us >= 0.0) {
                return Err(format!("point {i} must be finite and non-negative"));
            }
            if i > 0 && bytes <= points[i - 1].0 {
                return Err(format!("point {i}: bytes must increase"));
            }
        }
        Ok(AllreduceCurve { points })
    }

    /// One all-reduce of `bytes` (µs): linear between the points, the first point's time
    /// below it (a small message's time is its fixed latency), and along the last segment's
    /// slope above the last point (the bandwidth-bound part grows with the bytes).
    pub fn us(&self, bytes: f64) -> f64 {
        let points = &self.points;
        let (first, last) = (points[0], points[points.len() - 1]);
        if bytes <= first.0 {
            return first.1;
        }
        let segment = match points.windows(2).find(|w| bytes <= w[1].0) {
            Some(w) => (w[0], w[1]),
            None if points.len() > 1 => (points[points.len() - 2], last),
            None => return last.1,
        };
        let ((b0, t0), (b1, t1)) = segment;
        (t0 + (t1 - t0) * (bytes - b0) / (b1 - b0)).max(0.0)
    }
}

/// The table: lower-cased GPU name -> TP degree -> curve.
type Table = BTreeMap<String, BTreeMap<u32, AllreduceCurve>>;

/// A curve's points as the file spells its GPU: (name, (bytes, µs) points).
type Points = (String, Vec<(f64, f64)>);

/// Parses a table file: one point a line, `GPU TP BYTES US` separated by white space; `#`
/// starts a comment. A curve's points are its GPU's and TP degree's lines, in file order.
fn parse(text: &str) -> Result<Table, String> {
    let mut points: BTreeMap<(String, u32), Points> = BTreeMap::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let fields: Vec<&str> = line.split_whitespace().collect();
        let [gpu, tp, bytes, us] = fields.as_slice() else {
            return Err(format!("line {}: need `GPU TP BYTES US`", n + 1));
        };
        let number = |what: &str, text: &str| {
            text.parse::<f64>()
                .map_err(|_| format!("line {}: {what} `{text}` is not a number", n + 1))
        };
        let tp_u: u32 = tp
            .parse()
            .map_err(|_| format!("line {}: TP degree `{tp}` is not a number", n + 1))?;
        let point = (number("bytes", bytes)?, number("us", us)?);
        points
            .entry((gpu.to_ascii_lowercase(), tp_u))
            .or_insert_with(|| ((*gpu).to_string(), Vec::new()))
            .1
            .push(point);
    }
    let mut table = Table::new();
    for ((key, tp), (gpu, curve_points)) in points {
        let curve = AllreduceCurve::new(curve_points).map_err(|e| format!("{gpu} TP {tp}: {e}"))?;
        table.entry(key).or_default().insert(tp, curve);
    }
    Ok(table)
}

/// The embedded table, parsed once.
fn table() -> Result<&'static Table, LatencyError> {
    static TABLE: OnceLock<Result<Table, String>> = OnceLock::new();
    TABLE
        .get_or_init(|| parse(TABLE_JSON))
        .as_ref()
        .map_err(|problem| LatencyError::AllreduceTable {
            problem: problem.clone(),
        })
}

/// The measured curve of `gpu` (the catalog's name, any case) at TP `tp`, if the table has
/// one.
pub fn measured_curve(gpu: &str, tp: u32) -> Result<Option<&'static AllreduceCurve>, LatencyError> {
    Ok(table()?
        .get(&gpu.to_ascii_lowercase())
        .and_then(|curves| curves.get(&tp)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_embedded_table_parses_and_has_the_h100_tp4_row() {
        let curve = measured_curve("h100", 4).unwrap().unwrap();
        // PR #24532's custom two-stage kernel at 2 MiB: 26 µs.
        assert_eq!(curve.us(2_097_152.0), 26.0);
        assert!(measured_curve("H100", 3).unwrap().is_none());
        assert!(measured_curve("A100-80", 4).unwrap().is_none());
    }

    #[test]
    fn the_h100_tp4_curve_follows_vllms_dispatch_across_8_mib() {
        // Below 8 MiB vLLM runs its custom two-stage kernel (7 µs/MiB from 4 MiB); from
        // 8 MiB PyTorch's symmetric-memory multimem kernel (5 µs/MiB): a 593-token prefill's
        // 9.27 MiB message costs ~59 µs, not the ~79 µs of the custom kernel's slope.
        let curve = measured_curve("H100", 4).unwrap().unwrap();
        const MIB: f64 = 1_048_576.0;
        assert_eq!(curve.us(8.0 * MIB - 1.0), 70.0);
        assert_eq!(curve.us(8.0 * MIB), 53.0);
        let prefill = curve.us(593.0 * 16_384.0);
        assert!((prefill - 59.3).abs() < 0.2, "{prefill}");
        assert!(curve.us(6.0 * MIB) > curve.us(8.0 * MIB));
    }

    #[test]
    fn the_h100_tp2_and_tp8_rows_are_kept_but_not_priced() {
        // Measured (PR #24111 at TP 2, PR #42324 at TP 8) but commented out of the table:
        // priced, they break the TP 2 and TP 8 fits (docs/fidelity.md, "The measured
        // all-reduce"). Uncommented, they parse into the curves data/PROVENANCE.md lists.
        assert!(measured_curve("H100", 2).unwrap().is_none());
        assert!(measured_curve("H100", 8).unwrap().is_none());
        let uncommented: Vec<String> = TABLE_JSON
            .lines()
            .map(|l| match l.strip_prefix("# ") {
                Some(row) if row.starts_with("H100") && row.split_whitespace().count() == 4 => {
                    row.to_string()
                }
                _ => l.to_string(),
            })
            .collect();
        let table = parse(&uncommented.join("\n")).unwrap();
        const MIB: f64 = 1_048_576.0;
        // TP 2: the custom one-stage kernel, 7 µs at 512 KiB, 4 µs/MiB above 2 MiB.
        let tp2 = &table["h100"][&2];
        assert_eq!(tp2.us(0.5 * MIB), 7.0);
        assert_eq!(tp2.us(4.0 * MIB), 21.0);
        // TP 8: the multimem kernel, 18 µs at 2 MiB, held flat below 512 KiB.
        let tp8 = &table["h100"][&8];
        assert_eq!(tp8.us(2.0 * MIB), 18.0);
        assert_eq!(tp8.us(1_000.0), 11.0);
    }

    #[test]
    fn the_curve_interpolates_holds_its_floor_and_extends_its_last_slope() {
        let curve = AllreduceCurve::new(vec![(100.0, 10.0), (200.0, 20.0), (300.0, 40.0)]).unwrap();
        assert_eq!(curve.us(0.0), 10.0);
        assert_eq!(curve.us(150.0), 15.0);
        assert_eq!(curve.us(250.0), 30.0);
        assert_eq!(curve.us(400.0), 60.0);
        let one = AllreduceCurve::new(vec![(100.0, 7.0)]).unwrap();
        assert_eq!(one.us(1e9), 7.0);
    }

    #[test]
    fn malformed_tables_are_errors_that_say_where() {
        let err = parse("H100 4 2 1\nH100 4 1 2\n").unwrap_err();
        assert!(
            err.contains("H100 TP 4") && err.contains("increase"),
            "{err}"
        );
        let err = parse("# a comment\nH100 four 1 1\n").unwrap_err();
        assert!(err.contains("line 2") && err.contains("four"), "{err}");
        let err = parse("H100 4 1\n").unwrap_err();
        assert!(err.contains("GPU TP BYTES US"), "{err}");
        let err = parse("H100 4 1 fast\n").unwrap_err();
        assert!(err.contains("us `fast`"), "{err}");
        let table = parse("H100 4 1 2 # trailing comment\n\nh100 2 1 3\n").unwrap();
        assert_eq!(table["h100"].len(), 2);
        assert!(AllreduceCurve::new(vec![]).is_err());
        assert!(AllreduceCurve::new(vec![(1.0, f64::NAN)]).is_err());
    }
}
