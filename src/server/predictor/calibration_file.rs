//! The calibration file: JSON, written atomically (serialised by the caller), read at
//! start and on `/reload` with every coefficient range-checked, so the server never starts
//! on a torn file or absurd coefficients, and always reads back what it wrote.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::sim::latency::online::{CalibrationState, LoadFeatures, Phase, PhaseState};

/// Why the calibration file cannot be used.
#[derive(Debug, Error)]
pub enum CalibrationFileError {
    /// Reading or writing failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The content is not a calibration.
    #[error("{path}: not a ditto calibration file: {reason}")]
    Format {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PhaseFile {
    overhead_ms: f64,
    scale: f64,
    samples: u64,
    /// ms per thousand prefill and decode tokens in flight (absent in older files: 0).
    #[serde(default)]
    load_coefficients: LoadFeatures,
    /// The load features' recent means (absent in older files: 0).
    #[serde(default)]
    load_means: LoadFeatures,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct CalibrationFile {
    version: u32,
    ttft: PhaseFile,
    tpot: PhaseFile,
    /// Whether the TTFT samples measured E2E (absent in older files: false).
    #[serde(default)]
    ttft_is_e2e: bool,
}

/// A phase's coefficients as persisted. The server saves only a state that passes
/// [`PhaseState::check`] (`OnlineCalibration::persistable_state`), the check [`load`]
/// applies, so it can always read back what it wrote; a fit out of range is never written
/// (clamping it, as before, wrote a nonsense fit that loaded back).
pub(super) fn phase_file(p: &PhaseState) -> PhaseFile {
    PhaseFile {
        overhead_ms: p.overhead_ms,
        scale: p.scale,
        samples: p.samples,
        load_coefficients: p.load_coefficients,
        load_means: p.load_means,
    }
}

fn to_file(state: &CalibrationState) -> CalibrationFile {
    CalibrationFile {
        version: 1,
        ttft: phase_file(&state.ttft),
        tpot: phase_file(&state.tpot),
        ttft_is_e2e: state.ttft_is_e2e,
    }
}

/// One phase of a file, range-checked by [`PhaseState::check`] (the scale in
/// [`MIN_SCALE`, `MAX_SCALE`], the floor answers apply; the overhead within ± the phase's
/// largest plausible latency). Errors name the field (`ttft.scale`).
fn checked_phase(phase: Phase, p: &PhaseFile) -> Result<PhaseState, String> {
    let state = PhaseState {
        overhead_ms: p.overhead_ms,
        scale: p.scale,
        samples: p.samples,
        load_coefficients: p.load_coefficients,
        load_means: p.load_means,
    };
    state.check(phase)?;
    Ok(state)
}

/// Reads a calibration file; `Ok(None)` when it does not exist yet. A file that is not a
/// calibration, or holds coefficients out of range, is an error naming the file and the
/// field: the server refuses to start on it rather than guess (writes are atomic, so only
/// something else can have damaged it; move it aside to start uncalibrated).
pub fn load(path: &Path) -> Result<Option<CalibrationState>, CalibrationFileError> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(CalibrationFileError::Io {
                path: path.to_owned(),
                source,
            });
        }
    };
    let format_error = |reason: String| CalibrationFileError::Format {
        path: path.to_owned(),
        reason,
    };
    let file: CalibrationFile =
        serde_json::from_str(&text).map_err(|e| format_error(e.to_string()))?;
    if file.version != 1 {
        return Err(format_error(format!(
            "version {} (expected 1)",
            file.version
        )));
    }
    Ok(Some(CalibrationState {
        ttft: checked_phase(Phase::Ttft, &file.ttft).map_err(format_error)?,
        tpot: checked_phase(Phase::Tpot, &file.tpot).map_err(format_error)?,
        ttft_is_e2e: file.ttft_is_e2e,
    }))
}

/// Removes the temporary files a save of `path` leaves when its process dies between creating
/// and renaming one (`<file>.<pid>.<n>.tmp`, as [`save`] names them); returns how many. Only
/// for a server starting up, before its own first save: a save in flight would lose its
/// file (in a container the dead process and the new one may share a pid, so pids cannot
/// tell them apart).
pub(super) fn remove_stale_temporaries(path: &Path) -> usize {
    let (Some(directory), Some(name)) = (path.parent(), path.file_name()) else {
        return 0;
    };
    let directory = if directory.as_os_str().is_empty() {
        Path::new(".")
    } else {
        directory
    };
    let prefix = format!("{}.", name.to_string_lossy());
    let Ok(entries) = std::fs::read_dir(directory) else {
        return 0;
    };
    let is_temporary = |entry: &str| {
        entry
            .strip_prefix(&prefix)
            .and_then(|rest| rest.strip_suffix(".tmp"))
            .and_then(|rest| rest.split_once('.'))
            .is_some_and(|(pid, n)| {
                [pid, n]
                    .iter()
                    .all(|part| !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit()))
            })
    };
    entries
        .filter_map(Result::ok)
        .filter(|entry| is_temporary(&entry.file_name().to_string_lossy()))
        .filter(|entry| std::fs::remove_file(entry.path()).is_ok())
        .count()
}

/// Temporary files of concurrent saves never collide (the caller serialises saves too).
static TEMPORARY_SEQUENCE: AtomicU64 = AtomicU64::new(0);

/// Writes `state` to `path` atomically: a unique temporary file beside it, written and
/// fsynced, renamed over `path`, then the directory fsynced, so a reader (or a crash at any
/// moment) sees the old file or the new one, never a torn or empty one.
pub(super) fn save(path: &Path, state: &CalibrationState) -> Result<(), CalibrationFileError> {
    let io = |source| CalibrationFileError::Io {
        path: path.to_owned(),
        source,
    };
    let text = serde_json::to_string_pretty(&to_file(state)).map_err(|e| {
        CalibrationFileError::Format {
            path: path.to_owned(),
            reason: e.to_string(),
        }
    })?;
    let mut temporary = path.as_os_str().to_owned();
    temporary.push(format!(
        ".{}.{}.tmp",
        std::process::id(),
        TEMPORARY_SEQUENCE.fetch_add(1, Ordering::Relaxed)
    ));
    let temporary = PathBuf::from(temporary);
    let written = (|| {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&temporary)?;
        file.write_all(text.as_bytes())?;
        file.sync_all()?;
        std::fs::rename(&temporary, path)
    })();
    if let Err(err) = written {
        let _ = std::fs::remove_file(&temporary);
        return Err(io(err));
    }
    let directory = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    std::fs::File::open(directory)
        .and_then(|dir| dir.sync_all())
        .map_err(io)
}

/// Tests' scratch path: `calibration.json` in an empty directory of its own per test name,
/// process and thread.
#[cfg(test)]
pub(super) fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "ditto-calibration-{name}-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir.join("calibration.json")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file_text(ttft: (f64, f64), tpot: (f64, f64)) -> String {
        serde_json::json!({
            "version": 1,
            "ttft": {"overhead_ms": ttft.0, "scale": ttft.1, "samples": 3},
            "tpot": {"overhead_ms": tpot.0, "scale": tpot.1, "samples": 3},
        })
        .to_string()
    }

    #[test]
    fn absurd_coefficients_are_refused_naming_the_field() {
        // D3: finite but absurd values, each named with its phase.
        let path = scratch("absurd");
        for (text, field) in [
            (file_text((0.0, 1e308), (0.0, 1.0)), "ttft.scale"),
            (file_text((-1e300, 1.0), (0.0, 1.0)), "ttft.overhead_ms"),
            (file_text((0.0, 1.0), (0.0, -5.0)), "tpot.scale"),
            (file_text((0.0, 1.0), (0.0, 0.0)), "tpot.scale"),
            (file_text((0.0, 1.0), (1e9, 1.0)), "tpot.overhead_ms"),
        ] {
            std::fs::write(&path, &text).expect("write");
            let err = load(&path).expect_err(&text).to_string();
            assert!(err.contains(field), "{err} should name {field}");
            assert!(err.contains(&path.display().to_string()), "{err}");
        }
        std::fs::write(&path, file_text((12.0, 1.3), (-0.5, 0.9))).expect("write");
        let state = load(&path).expect("in range").expect("exists");
        assert_eq!((state.ttft.overhead_ms, state.ttft.scale), (12.0, 1.3));
    }

    #[test]
    fn a_crashed_saves_temporary_is_removed_at_start_and_nothing_else() {
        // Issue 38: kill -9 during training left `calibration.json.<pid>.<n>.tmp` for ever.
        let path = scratch("stale");
        let dir = path.parent().expect("dir").to_owned();
        let keep = [
            "calibration.json",
            "calibration.json.bak",
            "calibration.json.x.1.tmp",
        ];
        for name in keep
            .iter()
            .chain(&["calibration.json.4242.7.tmp", "calibration.json.1.0.tmp"])
        {
            std::fs::write(dir.join(name), "{}").expect("write");
        }
        assert_eq!(remove_stale_temporaries(&path), 2);
        let mut left: Vec<_> = std::fs::read_dir(&dir)
            .expect("dir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        left.sort_unstable();
        let mut expected: Vec<_> = keep.iter().map(|name| (*name).to_owned()).collect();
        expected.sort_unstable();
        assert_eq!(left, expected);
    }
}
