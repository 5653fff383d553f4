//! One watched request per engine: what became of it (its first token, its record), read
//! in O(1). A fork asks about exactly one request (the question's); without a watch it
//! would scan every record for that request's id and walk every slot for its first token.
//! The engine notes the record's index when the watched request retires: one comparison per
//! retirement, nothing per step.

use super::Engine;
use crate::sim::error::SimError;
use crate::sim::metrics::RequestRecord;
use crate::sim::request::RequestSpec;

/// The watched request: its slot and serial while live, its record's index once retired.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Watched {
    slot: u32,
    serial: u64,
    record: Option<usize>,
}

impl Engine {
    /// As [`Engine::submit`], and watches the request (replacing any earlier watch): see
    /// [`Engine::watched_record`] and [`Engine::watched_first_token_us`].
    pub fn submit_watched(&mut self, spec: RequestSpec) -> Result<(), SimError> {
        let slot = self.submit_slot(spec)?;
        self.watch(slot);
        Ok(())
    }

    /// As [`Engine::insert_waiting`], and watches the request (replacing any earlier watch).
    pub fn insert_waiting_watched(
        &mut self,
        spec: RequestSpec,
        enqueue_us: u64,
    ) -> Result<(), SimError> {
        let slot = self.insert_waiting_slot(spec, enqueue_us)?;
        self.watch(slot);
        Ok(())
    }

    /// The watched request's record, once it has left the engine (completed, dropped,
    /// timed out or rejected); `None` while it is live or if nothing is watched.
    pub fn watched_record(&self) -> Option<&RequestRecord> {
        let index = self.watched?.record?;
        self.metrics.records.get(index)
    }

    /// When the watched request's first token was seen by its client, if it has been (live
    /// or retired); `None` if nothing is watched.
    pub fn watched_first_token_us(&self) -> Option<u64> {
        let watched = self.watched?;
        match watched.record {
            Some(index) => self.metrics.records.get(index)?.first_token_us,
            None => {
                self.slots
                    .get(watched.slot as usize)?
                    .as_ref()
                    .filter(|state| state.serial == watched.serial)?
                    .timeline
                    .first_token_us
            }
        }
    }

    fn watch(&mut self, slot: u32) {
        debug_assert!(
            self.config.keep_request_records,
            "a watched request's record is read from the records"
        );
        let serial = self.state(slot).serial;
        self.watched = Some(Watched {
            slot,
            serial,
            record: None,
        });
    }

    /// Called as the request (`slot`, `serial`) retires, before its record is pushed.
    #[inline]
    pub(super) fn note_retired(&mut self, slot: u32, serial: u64) {
        if let Some(watched) = &mut self.watched
            && watched.slot == slot
            && watched.serial == serial
        {
            watched.record = Some(self.metrics.records.len());
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::sim::latency::{BlackboxCoefficients, LatencyModel};
    use crate::sim::{Engine, EngineConfig, Outcome, RequestId, RequestSpec};

    fn engine() -> Engine {
        let model = LatencyModel::Blackbox(BlackboxCoefficients {
            alpha: [0.0, 0.0, 0.0],
            beta: [1_000.0, 1.0, 10.0],
        });
        Engine::new(EngineConfig::vllm_defaults(2_000, 8192), model).unwrap()
    }

    /// The watch reports what a scan of the records and slots finds, at every event.
    #[test]
    fn the_watch_agrees_with_scanning_records_and_slots() {
        let mut engine = engine();
        for i in 0..20u64 {
            engine
                .submit(RequestSpec::synthetic(i + 1, i * 3_000, 200, 30))
                .unwrap();
        }
        engine
            .submit_watched(RequestSpec::synthetic(99, 10_000, 300, 20))
            .unwrap();
        let mut saw_live_first_token = false;
        while engine.process_next_event().is_some() {
            let scanned = engine
                .metrics()
                .records
                .iter()
                .find(|record| record.id == RequestId(99));
            assert_eq!(engine.watched_record(), scanned);
            let first = match scanned {
                Some(record) => record.first_token_us,
                None => engine.live_first_token_us(RequestId(99)),
            };
            assert_eq!(engine.watched_first_token_us(), first);
            saw_live_first_token |= scanned.is_none() && first.is_some();
        }
        assert!(saw_live_first_token, "the token came while it was live");
        let record = engine.watched_record().expect("it finished");
        assert_eq!(record.outcome, Outcome::Completed);
        assert_eq!(engine.watched_first_token_us(), record.first_token_us);
    }

    #[test]
    fn nothing_watched_reports_nothing() {
        let mut engine = engine();
        engine.submit(RequestSpec::synthetic(1, 0, 100, 5)).unwrap();
        while engine.process_next_event().is_some() {}
        assert_eq!(engine.watched_record(), None);
        assert_eq!(engine.watched_first_token_us(), None);
    }
}
