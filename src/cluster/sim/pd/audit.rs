//! The accounting of a disaggregated cluster: client-request counts and records over the
//! two halves, the per-role summary, and the P/D invariants (`Cluster::check_invariants`).

use std::collections::BTreeMap;

use super::{PdRuntime, Stage};
use crate::cluster::config::ClusterConfig;
use crate::cluster::disagg::{PdSummary, serves_decode, serves_prefill};
use crate::sim::Engine;
use crate::sim::RequestId;
use crate::sim::metrics::{Counts, LatencyStats, Outcome, RequestRecord};

impl PdRuntime {
    /// Makes engine-summed counts count client requests: a finished prefill half is no
    /// request end, a hand-over on its way or a sidecar waiting to retry is a queued
    /// request, a request whose last prefill attempt failed a dropped one.
    pub(in crate::cluster) fn correct_counts(&self, counts: &mut Counts) {
        // Saturating: the counts are the whole run's, each finished prefill half counted
        // once injected and once completed; a partial count must not wrap.
        counts.injected = counts
            .injected
            .saturating_sub(self.prefill_done)
            .saturating_add(self.handoffs_pending);
        counts.completed = counts.completed.saturating_sub(self.prefill_done);
        counts.queued += self.handoffs_pending;
        let errors = self.faults.errors.len() as u64;
        counts.injected += self.faults.retries_pending + errors;
        counts.queued += self.faults.retries_pending;
        counts.dropped += errors;
    }

    /// Instance `index`'s records as the client saw them: finished prefill halves left out,
    /// decode halves stamped with the request's arrival and its prefill's enqueue and
    /// admission, then the errors of the requests routed to it whose prefill failed for good
    /// (its sidecar answered them).
    pub(in crate::cluster) fn client_records(
        &self,
        index: usize,
        records: &[RequestRecord],
        out: &mut Vec<RequestRecord>,
    ) {
        for record in records {
            match self.requests.get(&record.id) {
                Some(request)
                    if request.prefill == index && request.stage != Stage::FailedOnPrefill => {}
                Some(request) if request.decode == index => {
                    let mut client = record.clone();
                    client.arrival_us = request.arrival_us;
                    if let Some(prefill) = &request.prefill_record {
                        client.enqueue_us = prefill.enqueue_us;
                        client.schedule_us = prefill.schedule_us;
                    }
                    out.push(client);
                }
                _ => out.push(record.clone()),
            }
        }
        out.extend(
            self.faults
                .errors
                .iter()
                .filter(|(decode, _)| *decode == index)
                .map(|(_, record)| record.clone()),
        )
    }

    /// Per-role metrics so far.
    pub(in crate::cluster) fn summary(&self, engines: &[Engine]) -> PdSummary {
        let mut decode_first: BTreeMap<RequestId, u64> = BTreeMap::new();
        for (index, engine) in engines.iter().enumerate() {
            for record in &engine.metrics().records {
                if let (Some(request), Some(first)) =
                    (self.requests.get(&record.id), record.first_token_us)
                    && request.stage == Stage::Decode
                    && request.decode == index
                {
                    decode_first.insert(record.id, first);
                }
            }
        }
        let mut prefill_queue = Vec::new();
        let mut prefill_ttft = Vec::new();
        let mut decode_wait = Vec::new();
        let mut transfer = Vec::new();
        let mut handover = Vec::new();
        let mut failed = 0;
        for request in self.requests.values() {
            if request.stage == Stage::FailedOnPrefill {
                failed += 1;
            }
            if let Some(record) = &request.prefill_record {
                if let Some(schedule) = record.schedule_us {
                    prefill_queue.push((schedule - request.arrival_us) as f64);
                }
                if let Some(first) = record.first_token_us {
                    prefill_ttft.push((first - request.arrival_us) as f64);
                    if let Some(&decode_first) = decode_first.get(&request.spec.id) {
                        handover.push(decode_first.saturating_sub(first) as f64);
                    }
                }
            }
            if let (Some(arrival), Some(start)) =
                (request.decode_arrival_us, request.transfer_start_us)
            {
                decode_wait.push((start - arrival) as f64);
            }
            if let (Some(start), Some(end)) = (request.transfer_start_us, request.transfer_end_us) {
                transfer.push((end - start) as f64);
            }
        }
        PdSummary {
            disaggregated: self.requests.len() as u64,
            decode_only: self.decode_only,
            failed_on_prefill: failed,
            failed_pulls: self
                .requests
                .values()
                .filter(|r| (r.expired || r.transfer_failed) && r.transfer_end_us.is_some())
                .count() as u64,
            transfer_failures: self
                .requests
                .values()
                .filter(|r| r.transfer_failed && r.transfer_end_us.is_some())
                .count() as u64,
            prefill_attempt_failures: self.faults.attempt_failures,
            prefill_retries: self.faults.retries,
            prefill_errors: self.faults.errors.len() as u64,
            prefill_queue: LatencyStats::from_whole_us(&mut prefill_queue),
            prefill_ttft: LatencyStats::from_whole_us(&mut prefill_ttft),
            decode_wait: LatencyStats::from_whole_us(&mut decode_wait),
            transfer: LatencyStats::from_whole_us(&mut transfer),
            handover: LatencyStats::from_whole_us(&mut handover),
        }
    }

    /// The disaggregation invariants: every handed-over request ends on exactly one decode
    /// pod (its own), no prefill frees a request's blocks before its pull completed (they
    /// are held exactly while the pull is owed), and no decode pod holds more than its pool.
    pub(in crate::cluster) fn check(
        &self,
        engines: &[Engine],
        config: &ClusterConfig,
    ) -> Result<(), String> {
        let mut ends: BTreeMap<RequestId, u32> = BTreeMap::new();
        for (index, engine) in engines.iter().enumerate() {
            if engine.kv().used_blocks() > engine.kv().total_blocks() {
                return Err(format!("instance {index} holds more blocks than its pool"));
            }
            for record in &engine.metrics().records {
                let Some(request) = self.requests.get(&record.id) else {
                    continue;
                };
                if matches!(request.stage, Stage::RetryWait | Stage::PrefillError) {
                    return Err(format!(
                        "request {:?} ended on instance {index} while its sidecar {}",
                        record.id,
                        if request.stage == Stage::RetryWait {
                            "waits to retry its prefill"
                        } else {
                            "answered it with the prefill's error"
                        }
                    ));
                }
                if index == request.prefill && request.stage != Stage::Decode {
                    continue; // its prefill half (or the request's end there)
                }
                if index == request.prefill && record.outcome == Outcome::Completed {
                    continue; // the prefill half of a request now decoding
                }
                if index != request.decode {
                    return Err(format!(
                        "request {:?} ended on instance {index}, not its decode pod {}",
                        record.id, request.decode
                    ));
                }
                *ends.entry(record.id).or_insert(0) += 1;
            }
            for (id, _) in engine.held_kv() {
                let owed = self.requests.get(&id).is_some_and(|request| {
                    request.prefill == index
                        && matches!(request.stage, Stage::Handoff | Stage::Decode)
                        && !request.released
                });
                if !owed {
                    return Err(format!(
                        "instance {index} holds KV of {id:?}, which no pull is owed"
                    ));
                }
            }
        }
        self.check_retries()?;
        for (id, request) in &self.requests {
            if let Some(&count) = ends.get(id)
                && count != 1
            {
                return Err(format!("request {id:?} ended {count} times on decode pods"));
            }
            let owed = matches!(request.stage, Stage::Handoff | Stage::Decode) && !request.released;
            if owed
                && !engines[request.prefill]
                    .held_kv()
                    .any(|(held, _)| held == *id)
            {
                return Err(format!(
                    "instance {} freed {id:?}'s KV before its pull completed",
                    request.prefill
                ));
            }
            if !serves_prefill(config.instances[request.prefill].role)
                || !serves_decode(config.instances[request.decode].role)
            {
                return Err(format!("request {id:?} split over pods of the wrong roles"));
            }
        }
        Ok(())
    }

    /// The sidecars' retry accounting: every failed attempt was retried, waits to be, or
    /// ended its request with the error after the last retry allowed.
    fn check_retries(&self) -> Result<(), String> {
        let max_retries = self.config.faults.prefill_max_retries;
        let (mut waiting, mut errors, mut failed_attempts) = (0u64, 0u64, 0u64);
        for (id, request) in &self.requests {
            failed_attempts += u64::from(request.failed_attempts);
            match request.stage {
                Stage::RetryWait => waiting += 1,
                Stage::PrefillError => errors += 1,
                _ => {}
            }
            let spent = request.failed_attempts > max_retries;
            if spent != (request.stage == Stage::PrefillError)
                || request.failed_attempts > max_retries + 1
            {
                return Err(format!(
                    "request {id:?}: {} failed prefill attempts with {max_retries} retries allowed, stage {:?}",
                    request.failed_attempts, request.stage
                ));
            }
        }
        let faults = &self.faults;
        if waiting != faults.retries_pending
            || errors != faults.errors.len() as u64
            || failed_attempts != faults.attempt_failures
            || faults.attempt_failures != faults.retries + faults.retries_pending + errors
        {
            return Err(format!(
                "prefill retries: {waiting} waiting, {errors} errors, {failed_attempts} failed \
                 attempts over the requests; counted {} waiting, {} errors, {} failed attempts, \
                 {} retries sent",
                faults.retries_pending,
                faults.errors.len(),
                faults.attempt_failures,
                faults.retries
            ));
        }
        Ok(())
    }
}
