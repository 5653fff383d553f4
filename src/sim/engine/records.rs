//! Records handed out as requests leave, instead of kept for the whole run: a long run that
//! folds each finished request into its own accumulators (the autoscaler's attainment and
//! latency window) keeps memory bounded by the requests that left since its last read.

use super::Engine;
use crate::sim::metrics::RequestRecord;

impl Engine {
    /// Hands every record kept since the last drain to `visit`, in leaving order, then
    /// forgets them (their room is kept for the next ones). Afterwards the engine's summary
    /// and its watched request's record no longer include them (a watch ends here); the
    /// counts are unchanged. An engine that keeps no records has none to hand out.
    pub fn drain_records(&mut self, mut visit: impl FnMut(&RequestRecord)) {
        for record in &self.metrics.records {
            visit(record);
        }
        if !self.metrics.records.is_empty() {
            self.metrics.records.clear();
            self.watched = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::sim::latency::{BlackboxCoefficients, LatencyModel};
    use crate::sim::{Engine, EngineConfig, RequestSpec};

    fn engine() -> Engine {
        let model = LatencyModel::Blackbox(BlackboxCoefficients {
            alpha: [0.0, 0.0, 0.0],
            beta: [1_000.0, 1.0, 10.0],
        });
        let config = EngineConfig {
            keep_request_records: true,
            ..EngineConfig::vllm_defaults(2_000, 8192)
        };
        Engine::new(config, model).unwrap()
    }

    /// Draining as the run goes yields every record once, in the order and with the
    /// contents an undrained run keeps.
    #[test]
    fn drained_records_are_the_kept_ones_in_order() {
        let requests: Vec<RequestSpec> = (0..60)
            .map(|i| {
                RequestSpec::synthetic(i, i * 3_000, 40 + (i as u32 * 7) % 90, 2 + i as u32 % 9)
            })
            .collect();
        let mut kept = engine();
        kept.run(requests.clone(), u64::MAX).unwrap();
        let mut drained = engine();
        let mut seen = Vec::new();
        for spec in requests {
            drained.run_before(spec.arrival_us);
            drained.drain_records(|r| seen.push(r.clone()));
            drained.submit(spec).unwrap();
        }
        drained.run(Vec::new(), u64::MAX).unwrap();
        drained.drain_records(|r| seen.push(r.clone()));
        assert_eq!(seen, kept.metrics().records);
        assert_eq!(seen.len(), 60);
        assert!(drained.metrics().records.is_empty());
        assert_eq!(drained.counts(), kept.counts());
        let mut again = 0;
        drained.drain_records(|_| again += 1);
        assert_eq!(again, 0, "a record is handed out once");
    }
}
