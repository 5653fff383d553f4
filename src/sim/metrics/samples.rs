//! The values a run's summary is built from, kept per completed request in place of whole
//! records when an engine keeps none (`EngineConfig::keep_request_records` off: an offline
//! run of millions of requests needs its percentiles, not 128 bytes of timestamps per
//! request).

use super::{Outcome, RequestRecord};

/// Per completed request, in leaving order: the samples [`super::Summary`] reads, and the
/// token totals.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SummarySamples {
    /// Time to first token (µs).
    pub ttft_us: Vec<f64>,
    /// End to end (µs).
    pub e2e_us: Vec<f64>,
    /// Mean time per output token (µs; requests with 2 or more tokens).
    pub tpot_us: Vec<f64>,
    /// Arrival to first admission (µs).
    pub scheduling_delay_us: Vec<f64>,
    /// Prompt tokens.
    pub input_tokens: u64,
    /// Output tokens.
    pub output_tokens: u64,
}

impl SummarySamples {
    /// Empty, with room for `requests` completed requests.
    pub fn with_capacity(requests: usize) -> Self {
        Self {
            ttft_us: Vec::with_capacity(requests),
            e2e_us: Vec::with_capacity(requests),
            tpot_us: Vec::with_capacity(requests),
            scheduling_delay_us: Vec::with_capacity(requests),
            input_tokens: 0,
            output_tokens: 0,
        }
    }

    /// Makes room for `requests` more completed requests.
    pub fn reserve(&mut self, requests: usize) {
        self.ttft_us.reserve(requests);
        self.e2e_us.reserve(requests);
        self.tpot_us.reserve(requests);
        self.scheduling_delay_us.reserve(requests);
    }

    /// The samples of `records` (those of the completed ones), in their order.
    pub fn of(records: &[RequestRecord]) -> Self {
        let completed = records
            .iter()
            .filter(|r| r.outcome == Outcome::Completed)
            .count();
        let mut samples = Self::with_capacity(completed);
        for record in records {
            samples.push(record);
        }
        samples
    }

    /// Adds `record`'s samples if it completed (the summary describes completed requests).
    pub fn push(&mut self, record: &RequestRecord) {
        if record.outcome != Outcome::Completed {
            return;
        }
        if let Some(ttft) = record.ttft_us() {
            self.ttft_us.push(ttft as f64);
        }
        if let Some(e2e) = record.e2e_us() {
            self.e2e_us.push(e2e as f64);
        }
        if let Some(tpot) = record.tpot_us() {
            self.tpot_us.push(tpot);
        }
        if let Some(delay) = record.scheduling_delay_us() {
            self.scheduling_delay_us.push(delay as f64);
        }
        self.input_tokens += u64::from(record.input_tokens);
        self.output_tokens += u64::from(record.output_tokens);
    }

    /// Heap bytes held (the vectors' room).
    pub fn memory_bytes(&self) -> usize {
        (self.ttft_us.capacity()
            + self.e2e_us.capacity()
            + self.tpot_us.capacity()
            + self.scheduling_delay_us.capacity())
            * std::mem::size_of::<f64>()
    }
}
