//! Arrivals a pod saw between two scrapes, read from its counters (docs/live.md, "Arrivals
//! from the pod's counters").
//!
//! Requests that arrived in an interval either finished in it or are still in the pod at its
//! end: arrivals = the increase of the finished-request counter + the increase of waiting +
//! running. A rebuilt pod's requests keep their ids from one scrape to the next (they name
//! positions, not requests), so new ids would show only the growth of each list; under
//! steady load (flat gauges, requests finishing as fast as they come) that is none. So a
//! rebuilt state is written with `InstanceUpdate::counts_arrivals` false while the counter
//! is read, and the counter's count is recorded as the pod's arrivals. Pure: no I/O, no
//! clock.

/// Registers `ditto_live_arrivals_total{instance}`: arrivals counted from each pod's
/// counters, as recorded (after the per-scrape cap).
pub fn register_counter(
    registry: &prometheus::Registry,
) -> Result<prometheus::IntCounterVec, prometheus::Error> {
    let counter = prometheus::IntCounterVec::new(
        prometheus::Opts::new(
            "ditto_live_arrivals_total",
            "Arrivals the live mirror counted on each pod: its finished-request counter's \
             increase plus the growth of its waiting + running requests between scrapes, \
             at most arrivals_max a scrape",
        ),
        &["instance"],
    )?;
    registry.register(Box::new(counter.clone()))?;
    Ok(counter)
}

/// One page's reading: the finished-request count (whole requests) and the requests in the
/// pod (waiting + running).
#[derive(Clone, Copy, Debug, PartialEq)]
struct Reading {
    finished: f64,
    in_pod: u64,
}

/// The counter baseline of one pod's scrape loop.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ArrivalCounter {
    previous: Option<Reading>,
}

impl ArrivalCounter {
    /// Arrivals since the previous page, given this page's finished-request count
    /// (`None`: the page has no counter), its waiting + running requests, and whether the
    /// pod's process restarted since the previous page. `None` when there is no baseline:
    /// the first page (its counter holds the process's whole history, not one interval) or
    /// a page without the counter (the baseline is dropped; the store's own count of new
    /// requests is all there is then).
    ///
    /// A counter below its previous value is a restart, as Prometheus reads a reset: the
    /// new process started empty, so everything it finished or holds arrived since (never a
    /// negative count). Values are whole requests (a fractional counter is floored).
    pub fn observe(&mut self, finished: Option<f64>, in_pod: u64, restarted: bool) -> Option<u64> {
        let Some(finished) = finished.filter(|f| f.is_finite() && *f >= 0.0) else {
            self.previous = None;
            return None;
        };
        let now = Reading {
            finished: finished.floor(),
            in_pod,
        };
        let previous = self.previous.replace(now)?;
        if restarted || now.finished < previous.finished {
            // `as` saturates: a counter past u64::MAX reads as u64::MAX (and is capped).
            return Some((now.finished as u64).saturating_add(now.in_pod));
        }
        let done = (now.finished - previous.finished) as u64;
        Some(done.saturating_add(now.in_pod.saturating_sub(previous.in_pod)))
    }
}

/// `count` arrival times spread evenly over `(from_us, to_us]` (the last at `to_us`):
/// deterministic, and the same rate as the interval's counts.
pub fn spread(count: u64, from_us: u64, to_us: u64) -> Vec<u64> {
    let span = u128::from(to_us.saturating_sub(from_us));
    let count_wide = u128::from(count);
    (1..=count_wide)
        .map(|i| from_us + u64::try_from(span * i / count_wide).unwrap_or(0))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steady_load_counts_the_finished_requests() {
        let mut counter = ArrivalCounter::default();
        assert_eq!(counter.observe(Some(1000.0), 6, false), None, "first page");
        // Flat gauges, 5 finished: 5 arrived.
        assert_eq!(counter.observe(Some(1005.0), 6, false), Some(5));
        // 3 finished and 2 more in the pod: 5 arrived; 2 fewer in the pod: 3 - 0.
        assert_eq!(counter.observe(Some(1008.0), 8, false), Some(5));
        assert_eq!(counter.observe(Some(1011.0), 6, false), Some(3));
    }

    #[test]
    fn a_counter_going_back_is_a_restart_never_negative() {
        let mut counter = ArrivalCounter::default();
        counter.observe(Some(500.0), 4, false);
        // The new process finished 7 and holds 2: 9 arrived since it started.
        assert_eq!(counter.observe(Some(7.0), 2, false), Some(9));
        // The new baseline holds.
        assert_eq!(counter.observe(Some(10.0), 2, false), Some(3));
        // Another start time with a counter already past the old value.
        assert_eq!(counter.observe(Some(40.0), 1, true), Some(41));
    }

    #[test]
    fn no_counter_no_baseline_and_hostile_values_stay_bounded() {
        let mut counter = ArrivalCounter::default();
        counter.observe(Some(10.0), 0, false);
        assert_eq!(counter.observe(None, 0, false), None);
        assert_eq!(
            counter.observe(Some(20.0), 0, false),
            None,
            "a new baseline"
        );
        assert_eq!(counter.observe(Some(f64::NAN), 0, false), None);
        counter.observe(Some(0.0), 0, false);
        assert_eq!(
            counter.observe(Some(1e300), u64::MAX, false),
            Some(u64::MAX)
        );
        // Fractions floored on both pages: 2.9 -> 4.1 is 2 finished, not 1.2.
        let mut counter = ArrivalCounter::default();
        counter.observe(Some(2.9), 0, false);
        assert_eq!(counter.observe(Some(4.1), 0, false), Some(2));
    }

    #[test]
    fn arrivals_are_spread_evenly_over_the_interval() {
        assert_eq!(spread(4, 1_000, 2_000), vec![1_250, 1_500, 1_750, 2_000]);
        assert_eq!(spread(0, 1_000, 2_000), Vec::<u64>::new());
        assert_eq!(spread(2, 5, 5), vec![5, 5]);
        assert_eq!(spread(3, 0, u64::MAX).last(), Some(&u64::MAX));
    }
}
