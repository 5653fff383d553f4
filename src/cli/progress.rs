//! Progress bars on stderr for long commands (`validate`, `calibrate`, `run`), drawn with
//! `indicatif` only when stderr is a terminal and the command does not print JSON: CI logs,
//! pipes and `--json` output stay quiet (and byte-identical). Stdout is never touched.

use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Whether a command should draw progress: stderr is a terminal and `json` is off.
pub fn wanted(json: bool) -> bool {
    !json && std::io::stderr().is_terminal()
}

/// A progress bar, or nothing when progress is not wanted (every method is then a no-op).
#[derive(Debug)]
pub struct Progress {
    bar: Option<ProgressBar>,
}

impl Progress {
    /// A bar of `len` steps labelled `label`, drawn on stderr when `enabled`; `len` 0 means
    /// unknown (a counter without a bar).
    pub fn new(enabled: bool, len: u64, label: &str) -> Progress {
        if !enabled {
            return Progress::hidden();
        }
        let known = (len > 0).then_some(len);
        let bar = ProgressBar::with_draw_target(known, ProgressDrawTarget::stderr());
        let template = if known.is_some() {
            "{prefix:>12} [{elapsed_precise}] {wide_bar} {human_pos}/{human_len} {msg}"
        } else {
            "{prefix:>12} [{elapsed_precise}] {human_pos} {msg}"
        };
        let style =
            ProgressStyle::with_template(template).unwrap_or_else(|_| ProgressStyle::default_bar());
        bar.set_style(style);
        bar.set_prefix(label.to_owned());
        bar.enable_steady_tick(Duration::from_millis(250));
        Progress { bar: Some(bar) }
    }

    /// A bar that draws nothing.
    pub fn hidden() -> Progress {
        Progress { bar: None }
    }

    /// Advances by `n` steps.
    pub fn inc(&self, n: u64) {
        if let Some(bar) = &self.bar {
            bar.inc(n);
        }
    }

    /// Sets the message shown after the counts (e.g. the current run or fit error).
    pub fn message(&self, text: String) {
        if let Some(bar) = &self.bar {
            bar.set_message(text);
        }
    }

    /// Grows the bar's length by `n` (a fit restarted with more evaluations).
    pub fn extend(&self, n: u64) {
        if let Some(bar) = &self.bar {
            bar.inc_length(n);
        }
    }

    /// Removes the bar from the terminal.
    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        // An early return (an error) still clears the line.
        self.finish();
    }
}
