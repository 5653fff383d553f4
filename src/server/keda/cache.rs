//! The KEDA scaler's forecast cache: one capacity forecast per (pool, objectives, horizon,
//! target, replications), shared by every call that asks it, so KEDA's polling (IsActive
//! every `pollingInterval`, GetMetrics every HPA sync) does not run a forecast per call. A
//! prefill/decode pool's split forecast is keyed by its (prefill, decode) pair instead of the
//! pool named: the two roles' triggers read the same split, computed once per refresh.
//!
//! An entry is reused while the load sampler has taken no new sample since it was computed,
//! and after that for up to [`MAX_AGE`] while the mirror's config is the same, every
//! stage's rate is within [`RATE_TOLERANCE`] of the one forecast and so are the mean prompt
//! and output lengths of the recently finished requests the forecast samples (longer
//! outputs alone may need more decode pods at the same rate). Concurrent callers of a
//! stale or missing entry wait for one computation (single flight); an error is kept like
//! an answer, until the next sample. At most [`MAX_ENTRIES`] are kept (the oldest goes).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::OnceCell;

use super::metadata::ForecastKey;
use crate::workload::Stage;

/// Longest an entry is reused while the load stays within tolerance.
pub const MAX_AGE: Duration = Duration::from_secs(60);
/// Relative change of a stage's rate (or 0.05 req/s absolute) that still reuses an entry.
pub const RATE_TOLERANCE: f64 = 0.05;
/// Most entries kept.
pub const MAX_ENTRIES: usize = 256;

/// What a forecast computed for one key.
#[derive(Clone, Debug, PartialEq)]
pub struct Computed {
    /// Replicas the forecast needs (0: no load and nothing forecast).
    pub desired: u32,
    /// Forecast attainment at that count.
    pub attainment: f64,
    /// A P/D split forecast's prefill and decode counts (`desired` is their sum); None for a
    /// pool forecast.
    pub split: Option<RoleCounts>,
}

/// What a forecast was computed from.
#[derive(Clone, Debug, PartialEq)]
pub struct Inputs {
    /// The load sample it followed.
    pub sample: u64,
    /// The mirror's config generation.
    pub config_generation: u64,
    /// The stages asked.
    pub stages: Vec<Stage>,
    /// Mean tokens of the recently finished requests ([`mean_lengths`]).
    pub lengths: MeanLengths,
}

/// Mean prompt and output tokens of recently finished requests: a change of mix at the same
/// arrival rate is a new forecast.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MeanLengths {
    /// Mean prompt tokens.
    pub prompt: f64,
    /// Mean output tokens.
    pub output: f64,
}

/// The replicas of each role in a P/D split forecast.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoleCounts {
    /// Prefill pods.
    pub prefill: u32,
    /// Decode pods.
    pub decode: u32,
}

/// Mean lengths of `recent` finished requests (`(prompt, output)` as the store keeps them);
/// zeros when there are none.
pub fn mean_lengths(recent: &[(u32, u32)]) -> MeanLengths {
    if recent.is_empty() {
        return MeanLengths {
            prompt: 0.0,
            output: 0.0,
        };
    }
    let n = recent.len() as f64;
    let (prompt, output) = recent.iter().fold((0.0, 0.0), |(p, o), &(prompt, output)| {
        (p + f64::from(prompt), o + f64::from(output))
    });
    MeanLengths {
        prompt: prompt / n,
        output: output / n,
    }
}

fn close(a: f64, b: f64, absolute: f64) -> bool {
    (a - b).abs() <= absolute || (a - b).abs() <= RATE_TOLERANCE * a.max(b)
}

/// One cached forecast (or the computation of one in progress).
#[derive(Debug)]
pub struct Entry {
    inputs: Inputs,
    born: Instant,
    /// The result, once computed.
    pub cell: OnceCell<Result<Computed, tonic::Status>>,
}

impl Entry {
    fn reusable(&self, inputs: &Inputs) -> bool {
        if self.cell.get().is_some_and(Result::is_err) {
            return self.inputs.sample == inputs.sample;
        }
        if self.inputs.sample == inputs.sample {
            return true;
        }
        self.born.elapsed() < MAX_AGE
            && self.inputs.config_generation == inputs.config_generation
            && close(self.inputs.lengths.prompt, inputs.lengths.prompt, 0.5)
            && close(self.inputs.lengths.output, inputs.lengths.output, 0.5)
            && self.inputs.stages.len() == inputs.stages.len()
            && self
                .inputs
                .stages
                .iter()
                .zip(&inputs.stages)
                .all(|(kept, asked)| {
                    let (a, b) = (kept.rate, asked.rate);
                    kept.duration_s == asked.duration_s
                        && ((a - b).abs() <= 0.05 || (a - b).abs() <= RATE_TOLERANCE * a.max(b))
                })
    }
}

/// The cache.
#[derive(Debug, Default)]
pub struct ForecastCache {
    entries: Mutex<BTreeMap<ForecastKey, Arc<Entry>>>,
}

impl ForecastCache {
    /// The entry to use for `key` given today's `inputs`: the cached one when reusable, else
    /// a new one (to be computed by whoever gets its cell first). `fresh` says which.
    pub fn entry(&self, key: &ForecastKey, inputs: Inputs) -> (Arc<Entry>, bool) {
        let mut entries = self
            .entries
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(entry) = entries.get(key)
            && (entry.reusable(&inputs) || !entry.cell.initialized())
        {
            return (Arc::clone(entry), false);
        }
        if entries.len() >= MAX_ENTRIES && !entries.contains_key(key) {
            let oldest = entries
                .iter()
                .min_by_key(|(_, entry)| entry.born)
                .map(|(key, _)| key.clone());
            if let Some(oldest) = oldest {
                entries.remove(&oldest);
            }
        }
        let entry = Arc::new(Entry {
            inputs,
            born: Instant::now(),
            cell: OnceCell::new(),
        });
        entries.insert(key.clone(), Arc::clone(&entry));
        (entry, true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::twin::question::SloTargets;

    fn key() -> ForecastKey {
        super::super::metadata::ScalerQuery {
            pool: "p".to_owned(),
            namespace: None,
            role: None,
            slo: SloTargets {
                ttft_ms: Some(1.0),
                ..SloTargets::default()
            },
            horizon_s: 10.0,
            target_attainment: 0.9,
            replications: 1,
            metric: super::super::metadata::MetricKind::DesiredReplicas,
        }
        .forecast_key()
    }

    fn inputs(sample: u64, rate: f64) -> Inputs {
        Inputs {
            sample,
            config_generation: 1,
            stages: vec![Stage {
                rate,
                duration_s: 10.0,
            }],
            lengths: mean_lengths(&[(100, 20), (300, 20)]),
        }
    }

    #[test]
    fn an_entry_is_reused_until_the_load_moves() {
        let cache = ForecastCache::default();
        let (first, fresh) = cache.entry(&key(), inputs(1, 10.0));
        assert!(fresh);
        // In progress: shared, whatever the inputs.
        let (same, fresh) = cache.entry(&key(), inputs(2, 50.0));
        assert!(!fresh && Arc::ptr_eq(&first, &same));
        first
            .cell
            .set(Ok(Computed {
                desired: 2,
                attainment: 1.0,
                split: None,
            }))
            .expect("unset");
        assert!(!cache.entry(&key(), inputs(1, 10.0)).1);
        assert!(!cache.entry(&key(), inputs(2, 10.3)).1, "within 5 %");
        let (moved, fresh) = cache.entry(&key(), inputs(3, 12.0));
        assert!(fresh && !Arc::ptr_eq(&first, &moved));
    }

    #[test]
    fn a_new_length_mix_at_the_same_rate_is_a_new_forecast() {
        let cache = ForecastCache::default();
        let (first, _) = cache.entry(&key(), inputs(1, 10.0));
        first
            .cell
            .set(Ok(Computed {
                desired: 1,
                attainment: 1.0,
                split: None,
            }))
            .expect("unset");
        assert_eq!(
            inputs(1, 10.0).lengths,
            MeanLengths {
                prompt: 200.0,
                output: 20.0
            }
        );
        let longer = |output: u32| Inputs {
            lengths: mean_lengths(&[(100, output), (300, output)]),
            ..inputs(2, 10.0)
        };
        assert!(!cache.entry(&key(), longer(20)).1, "same mix");
        let (moved, fresh) = cache.entry(&key(), longer(400));
        assert!(fresh && !Arc::ptr_eq(&first, &moved), "longer outputs");
    }
}
