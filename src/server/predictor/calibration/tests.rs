//! Tests of `calibration`.

use super::*;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use super::super::calibration_file::scratch;

const NO_LOAD: LoadFeatures = [0.0; 2];

fn sample(phase: Phase, simulated_ms: f64, load: LoadFeatures, measured_ms: f64) -> TrainingSample {
    TrainingSample {
        phase,
        simulated_ms,
        load,
        measured_ms,
    }
}

#[test]
fn concurrent_training_never_leaves_a_torn_file() {
    // D2: eight trainers persisting at once while a reader reads the file: every read
    // is a whole calibration file.
    let path = scratch("torn");
    let metrics = Metrics::new().expect("metrics");
    let calibrator =
        Arc::new(Calibrator::new(None, Some(path.clone()), 0.9, &metrics).expect("calibrator"));
    let done = Arc::new(AtomicBool::new(false));
    let reader = {
        let (path, done) = (path.clone(), Arc::clone(&done));
        std::thread::spawn(move || {
            let (mut reads, mut torn) = (0u64, Vec::new());
            while !done.load(Ordering::Relaxed) {
                if let Ok(text) = std::fs::read_to_string(&path) {
                    reads += 1;
                    if serde_json::from_str::<super::super::calibration_file::CalibrationFile>(
                        &text,
                    )
                    .is_err()
                    {
                        torn.push(text);
                    }
                }
            }
            (reads, torn)
        })
    };
    let writers: Vec<_> = (0..8)
        .map(|w| {
            let calibrator = Arc::clone(&calibrator);
            std::thread::spawn(move || {
                for i in 0..150 {
                    let simulated = 10.0 + f64::from(w * 150 + i % 97);
                    calibrator.absorb(
                        &[
                            sample(Phase::Ttft, simulated, NO_LOAD, 1.3 * simulated),
                            sample(Phase::Tpot, simulated / 10.0, NO_LOAD, simulated / 8.0),
                        ],
                        false,
                    );
                }
            })
        })
        .collect();
    for writer in writers {
        writer.join().expect("writer");
    }
    done.store(true, Ordering::Relaxed);
    let (reads, torn) = reader.join().expect("reader");
    assert!(reads > 0);
    assert!(
        torn.is_empty(),
        "{} of {reads} reads were not a calibration, e.g. {:?}",
        torn.len(),
        torn.first()
    );
    // The file holds the last state, and no temporary file is left behind.
    let loaded = load(&path).expect("loads").expect("exists");
    assert_eq!(loaded.ttft.samples, 8 * 150);
    let dir = path.parent().expect("dir");
    let names: Vec<_> = std::fs::read_dir(dir)
        .expect("dir")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert_eq!(names, vec![std::ffi::OsString::from("calibration.json")]);
}

#[test]
fn what_the_server_writes_it_can_read_back() {
    // Anti-correlated samples drive the raw scale negative: the state persisted is the
    // map answers apply (the scale at its floor), so a restart never refuses the
    // server's own file.
    let path = scratch("roundtrip");
    let metrics = Metrics::new().expect("metrics");
    let calibrator = Calibrator::new(None, Some(path.clone()), 0.9, &metrics).expect("calibrator");
    let samples: Vec<_> = (0..20)
        .map(|i| {
            let simulated = 10.0 + f64::from(i);
            sample(Phase::Ttft, simulated, NO_LOAD, 200.0 - 5.0 * simulated)
        })
        .collect();
    calibrator.absorb(&samples, false);
    let state = load(&path).expect("readable").expect("exists");
    assert!(state.ttft.scale > 0.0, "{state:?}");
}

#[test]
fn a_fit_out_of_range_is_reset_counted_and_never_persisted() {
    // Issue 38 D1: the probe's bad fit (scale 7,828, overhead -1,088,028 ms) was written
    // (clamped) and reloaded after a restart. Samples implying a scale of 20,000 reset
    // the fit instead; the reset is counted and the file only ever holds a plausible fit.
    let path = scratch("diverged");
    let metrics = Metrics::new().expect("metrics");
    let calibrator = Calibrator::new(None, Some(path.clone()), 0.9, &metrics).expect("calibrator");
    let samples: Vec<_> = (0..19)
        .map(|i| {
            let (simulated, measured) = if i % 2 == 0 {
                (1.0, 1.0)
            } else {
                (2.0, 20_001.0)
            };
            sample(Phase::Tpot, simulated, NO_LOAD, measured)
        })
        .collect();
    calibrator.absorb(&samples, false);
    let text = metrics.encode().expect("encodes");
    assert!(
        text.lines()
            .any(|l| l
                .starts_with(r#"ditto_calibration_resets_total{phase="tpot",reason="diverged"}"#)),
        "{text}"
    );
    assert!(
        text.contains(r#"ditto_calibration_healthy{phase="tpot"} 1"#),
        "{text}"
    );
    let state = load(&path).expect("readable").expect("exists");
    assert!(state.tpot.check(Phase::Tpot).is_ok(), "{state:?}");
}
