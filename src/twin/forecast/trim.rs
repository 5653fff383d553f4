//! The trim of a met prefill/decode (P/D) split: the search (`pd.rs`) grows both roles while
//! their objectives fall short, and too few decode pods delay first tokens too, so the
//! prefill count it stops at can be more than the split needs (and the decode count, when
//! the two roles' shortfalls overlap). Each role in turn (prefill, then decode) is cut to
//! the fewest replicas that still meet the target with the other role's count held.
//!
//! One function for every caller: ForecastCapacity's P/D answer, the forecast loop's
//! `ditto_desired_replicas` and the KEDA scaler's per-role counts all read the trimmed split,
//! so they cannot disagree on the same load.
//!
//! A role's fewer counts are evaluated as one batch (at most `max_forecast_candidates` below
//! the met count, none the search already found short). Forecasts are noisy, so a count is
//! kept only when it and every count above it up to the met one meet the target: the trim
//! never settles on a count below one that misses.

use super::pd::SplitRoles;
use super::replication::{evaluate, summarize};
use crate::twin::error::TwinError;
use crate::twin::limits::Limits;
use crate::twin::question::{ForecastCandidate, ForecastQuestion};
use crate::twin::run::EventBudget;
use crate::twin::snapshot::MirrorSnapshot;

/// What a trim evaluated and the split it settled on.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Trimmed {
    /// The candidates the trim evaluated, in order (after the search's).
    pub(super) evaluated: Vec<ForecastCandidate>,
    /// The trimmed counts, one per variant of the question (the met split's, fewer).
    pub(super) counts: Vec<u32>,
}

/// Trims the met split `met` (counts per variant) of a question searching `split`:
/// `evaluate` runs a batch of explicit splits and returns one candidate per split, in
/// order; `searched` holds the search's candidates (splits already known short are not run
/// again). Every returned split meets `target`: the met one, or fewer pods of a role with
/// every count between meeting too.
pub(super) fn trim_split(
    met: &[u32],
    split: SplitRoles,
    target: f64,
    max_candidates: u32,
    searched: &[ForecastCandidate],
    mut evaluate: impl FnMut(&[Vec<u32>]) -> Result<Vec<ForecastCandidate>, TwinError>,
) -> Result<Trimmed, TwinError> {
    let mut counts = met.to_vec();
    let mut evaluated: Vec<ForecastCandidate> = Vec::new();
    for role in [split.prefill, split.decode] {
        let current = counts[role];
        // The highest count of this role below `current` the search found short with the
        // other counts as they are now: nothing at or below it can be kept.
        let known_short = searched
            .iter()
            .zip(searched_counts(searched))
            .filter(|(candidate, seen)| {
                candidate.slo_attainment < target
                    && seen.len() == counts.len()
                    && seen[role] < current
                    && (0..counts.len()).all(|i| i == role || seen[i] == counts[i])
            })
            .map(|(_, seen)| seen[role])
            .max()
            .unwrap_or(0);
        let lowest = current
            .saturating_sub(max_candidates.max(1))
            .max(known_short + 1)
            .max(1);
        if lowest >= current {
            continue;
        }
        let batch: Vec<Vec<u32>> = (lowest..current)
            .map(|count| {
                let mut fewer = counts.clone();
                fewer[role] = count;
                fewer
            })
            .collect();
        let results = evaluate(&batch)?;
        // Down from the met count while every count meets the target.
        let mut kept = current;
        for (fewer, candidate) in batch.iter().zip(&results).rev() {
            if candidate.slo_attainment < target {
                break;
            }
            kept = fewer[role];
        }
        counts[role] = kept;
        evaluated.extend(results);
    }
    Ok(Trimmed { evaluated, counts })
}

/// The counts each searched candidate ran, by variant order (a candidate's `replicas` are
/// listed in the question's variant order).
fn searched_counts(searched: &[ForecastCandidate]) -> impl Iterator<Item = Vec<u32>> + '_ {
    searched
        .iter()
        .map(|candidate| candidate.replicas.iter().map(|&(_, count)| count).collect())
}

/// The trim of the search's result `searched` on `snapshot`: none when no candidate met the
/// target. The trim runs under an event budget of its own (as large as the search's, the
/// same deadline and cancellation); a trim that runs out of it or of time keeps the search's
/// split (more pods than needed, never fewer): `Ok(None)`.
pub(super) fn trim_search(
    snapshot: &MirrorSnapshot,
    question: &ForecastQuestion,
    templates: &[usize],
    split: SplitRoles,
    limits: &Limits,
    searched: &[ForecastCandidate],
) -> Result<Option<Trimmed>, TwinError> {
    let target = question.target_attainment;
    let Some(met) = searched.iter().find(|c| c.slo_attainment >= target) else {
        return Ok(None);
    };
    let met: Vec<u32> = met.replicas.iter().map(|&(_, count)| count).collect();
    let budget = EventBudget::for_call(limits);
    let run = |batch: &[Vec<u32>]| -> Result<Vec<ForecastCandidate>, TwinError> {
        let reps = evaluate(snapshot, question, templates, batch, &budget)?;
        Ok(batch
            .iter()
            .zip(&reps)
            .map(|(counts, reps)| summarize(snapshot, question, templates, counts, reps))
            .collect())
    };
    match trim_split(
        &met,
        split,
        target,
        limits.max_forecast_candidates,
        searched,
        run,
    ) {
        Ok(trimmed) => Ok(Some(trimmed)),
        Err(TwinError::EventBudget { .. } | TwinError::Deadline { .. }) => Ok(None),
        Err(err) => Err(err),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn candidate(counts: &[u32], attainment: f64) -> ForecastCandidate {
        let replicas = counts
            .iter()
            .enumerate()
            .map(|(i, &c)| (format!("v{i}"), c))
            .collect();
        ForecastCandidate::with_attainment(replicas, attainment)
    }

    const SPLIT: SplitRoles = SplitRoles {
        prefill: 0,
        decode: 1,
    };
    const TARGET: f64 = 0.9;

    /// Trims `met` with attainments from `attainment`, counting the splits run.
    fn trim_with(
        met: &[u32],
        searched: &[ForecastCandidate],
        attainment: impl Fn(&[u32]) -> f64,
    ) -> (Trimmed, Vec<Vec<u32>>) {
        let mut ran = Vec::new();
        let trimmed = trim_split(met, SPLIT, TARGET, 64, searched, |batch| {
            ran.extend(batch.iter().cloned());
            Ok(batch.iter().map(|c| candidate(c, attainment(c))).collect())
        })
        .expect("no error");
        (trimmed, ran)
    }

    /// An attainment per split.
    type Attainment = dyn Fn(&[u32]) -> f64;

    /// A noisy split landscape: meets the target with enough of both roles, and at a few
    /// small counts by chance (noise) below counts that miss.
    fn noisy(counts: &[u32]) -> f64 {
        let (p, d) = (counts[0], counts[1]);
        match (p, d) {
            (1, 2) => 0.95, // noise: below (2, 2), which misses
            (2, 2) => 0.5,
            _ if p >= 3 && d >= 2 => 0.92,
            _ => 0.4,
        }
    }

    #[test]
    fn the_trim_never_settles_below_a_count_that_misses_while_a_bigger_one_meets() {
        // Every met split in a grid, every landscape shape: monotone, noisy, flat.
        let landscapes: [&Attainment; 3] = [
            &|c: &[u32]| if c[0] >= 3 && c[1] >= 2 { 0.95 } else { 0.3 },
            &noisy,
            &|_: &[u32]| 0.99,
        ];
        for attainment in landscapes {
            for p in 1..=8 {
                for d in 1..=8 {
                    let met = [p, d];
                    if attainment(&met) < TARGET {
                        continue;
                    }
                    let (trimmed, _) = trim_with(&met, &[], attainment);
                    let [tp, td] = [trimmed.counts[0], trimmed.counts[1]];
                    assert!(
                        tp <= p && td <= d && tp >= 1 && td >= 1,
                        "{met:?} -> {tp}, {td}"
                    );
                    assert!(
                        attainment(&trimmed.counts) >= TARGET,
                        "{met:?} -> {tp}, {td}"
                    );
                    // Every count of each role between the trimmed and the met one meets the
                    // target too (with the other role as it was when that role was cut).
                    for k in tp..=p {
                        assert!(attainment(&[k, d]) >= TARGET, "{met:?}: prefill {k} misses");
                    }
                    for k in td..=d {
                        assert!(attainment(&[tp, k]) >= TARGET, "{met:?}: decode {k} misses");
                    }
                }
            }
        }
        // The noisy landscape: (1, 2) meets by chance below (2, 2), which misses; from
        // (6, 2) the trim stops at 3 prefill pods, never 1.
        let (trimmed, _) = trim_with(&[6, 2], &[], noisy);
        assert_eq!(trimmed.counts, vec![3, 2]);
    }

    #[test]
    fn each_role_is_cut_to_the_fewest_that_meet_and_known_short_splits_are_not_run_again() {
        let monotone = |c: &[u32]| if c[0] >= 2 && c[1] >= 3 { 0.95 } else { 0.2 };
        // The search went (1, 1) -> (2, 2) -> (3, 3) -> (4, 4): the last met.
        let searched: Vec<ForecastCandidate> = (1..=4)
            .map(|n| candidate(&[n, n], monotone(&[n, n])))
            .collect();
        let (trimmed, ran) = trim_with(&[4, 4], &searched, monotone);
        assert_eq!(trimmed.counts, vec![2, 3]);
        // Prefill 1..3 at decode 4, then decode 3 at prefill 2: the search found (2, 2) short.
        assert_eq!(ran, vec![vec![1, 4], vec![2, 4], vec![3, 4], vec![2, 3]]);
        assert_eq!(trimmed.evaluated.len(), ran.len());
        // A split of one pod each has nothing to trim.
        let (one, ran) = trim_with(&[1, 1], &[], |_| 0.99);
        assert_eq!((one.counts, ran.len()), (vec![1, 1], 0));
        // Short splits the search found with the same decode count bound the batch: from
        // (5, 2) with (3, 2) known short, only prefill 4 is run.
        let searched = vec![candidate(&[3, 2], 0.5), candidate(&[5, 2], 0.95)];
        let (_, ran) = trim_with(&[5, 2], &searched, |c| if c[0] >= 4 { 0.95 } else { 0.5 });
        assert_eq!(ran[0], vec![4, 2]);
        assert_eq!(ran.iter().filter(|c| c[1] == 2 && c[0] < 4).count(), 0);
    }

    #[test]
    fn a_trim_that_fails_keeps_the_error() {
        let failed = trim_split(&[3, 3], SPLIT, TARGET, 64, &[], |_| {
            Err(TwinError::EventBudget { events: 7 })
        });
        assert_eq!(failed, Err(TwinError::EventBudget { events: 7 }));
    }
}
