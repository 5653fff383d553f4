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
