//! Lazy request generation from a validated [`WorkloadSpec`].
//!
//! [`WorkloadGenerator`] merges the clients' arrival streams into one iterator of
//! [`RequestSpec`]s in non-decreasing `arrival_us` order; ties go to the lower client index
//! (and, within a client, arrivals are strictly increasing). Ids are 0, 1, 2, ... in that
//! order. Memory is O(clients): each client holds only its next arrival.
//!
//! Randomness: every client draws from four named streams of the spec's seed,
//! `workload/{arrivals,input,output,prefix}/<client id>`, so changing one client's output
//! distribution never moves any arrival, and adding a client never changes another
//! client's lengths (it does change everyone's rate share).
//!
//! Knows nothing about the engine that consumes the requests or about traces.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use rand_distr::{Distribution, Uniform};

use crate::sim::request::{PromptContent, RequestId, RequestSpec, SloClass};
use crate::sim::rng::{RngStreams, SimRng};
use crate::workload::arrival::{ArrivalClock, RateSegment};
use crate::workload::dist::LengthSampler;
use crate::workload::error::WorkloadError;
use crate::workload::spec::{ClientSpec, WorkloadSpec};

/// Streams requests of a workload spec lazily, in arrival order.
#[derive(Debug)]
pub struct WorkloadGenerator {
    clients: Vec<ClientState>,
    schedule: Vec<RateSegment>,
    /// Each client's next arrival, keyed `(arrival_us, client index)`.
    pending: BinaryHeap<Reverse<(u64, usize)>>,
    next_id: u64,
    /// Stop after this many requests (`None`: when the schedule ends).
    num_requests_max: Option<u64>,
    last_arrival_us: u64,
}

/// One client's samplers, streams and constant request fields.
#[derive(Debug)]
struct ClientState {
    clock: ArrivalClock,
    input: LengthSampler,
    input_rng: SimRng,
    output: LengthSampler,
    output_rng: SimRng,
    prefix: Option<PrefixState>,
    slo_class: SloClass,
    priority: i32,
    deadline_us: Option<u64>,
}

/// A client's shared prefixes: global group ids `group_base .. group_base + groups`.
#[derive(Debug)]
struct PrefixState {
    group_base: u64,
    group: Uniform<u32>,
    length: u32,
    rng: SimRng,
}

impl WorkloadSpec {
    /// Validates the spec and returns a generator over its requests.
    pub fn generator(&self) -> Result<WorkloadGenerator, WorkloadError> {
        self.validate()?;
        let schedule = self.rate_schedule()?;
        let specs = self.resolved_clients()?;
        let streams = RngStreams::new(self.seed);
        let fraction_total: f64 = specs.iter().map(|client| client.rate_fraction).sum();
        let implied = self.clients.is_none();
        let mut clients = Vec::with_capacity(specs.len());
        let mut group_base: u64 = 0;
        for (index, spec) in specs.iter().enumerate() {
            let path = if implied {
                String::new()
            } else {
                format!("clients[{index}].")
            };
            let state = ClientState::new(
                self,
                spec,
                &path,
                &streams,
                spec.rate_fraction / fraction_total,
                group_base,
            )?;
            group_base += spec.prefix.map_or(0, |prefix| u64::from(prefix.groups));
            clients.push(state);
        }
        let mut pending = BinaryHeap::with_capacity(clients.len());
        for (index, client) in clients.iter_mut().enumerate() {
            if let Some(arrival_us) = client.clock.next_arrival(&schedule) {
                pending.push(Reverse((arrival_us, index)));
            }
        }
        Ok(WorkloadGenerator {
            clients,
            schedule,
            pending,
            next_id: 0,
            num_requests_max: self.num_requests,
            last_arrival_us: 0,
        })
    }
}

impl ClientState {
    fn new(
        spec: &WorkloadSpec,
        client: &ClientSpec,
        path: &str,
        streams: &RngStreams,
        fraction: f64,
        group_base: u64,
    ) -> Result<Self, WorkloadError> {
        let id = &client.id;
        let process = client.arrival.unwrap_or(spec.arrival);
        let arrival_path = if client.arrival.is_some() {
            format!("{path}arrival")
        } else {
            "arrival".to_owned()
        };
        let clock = ArrivalClock::new(
            &process,
            &arrival_path,
            streams.stream(&format!("workload/arrivals/{id}")),
            fraction,
        )?;
        let prefix = match client.prefix {
            Some(prefix) => Some(PrefixState {
                group_base,
                group: Uniform::new(0, prefix.groups).map_err(|err| {
                    WorkloadError::invalid(format!("{path}prefix.groups"), err.to_string())
                })?,
                length: prefix.length,
                rng: streams.stream(&format!("workload/prefix/{id}")),
            }),
            None => None,
        };
        let slo_class = client.slo_class(path.trim_end_matches('.'))?;
        Ok(Self {
            clock,
            input: client
                .input_tokens
                .sampler(&format!("{path}input_tokens"))?,
            input_rng: streams.stream(&format!("workload/input/{id}")),
            output: client
                .output_tokens
                .sampler(&format!("{path}output_tokens"))?,
            output_rng: streams.stream(&format!("workload/output/{id}")),
            prefix,
            slo_class,
            priority: client.priority.unwrap_or(slo_class.priority()),
            deadline_us: client.deadline_us(),
        })
    }

    /// Builds the request arriving at `arrival_us`, drawing its lengths and prefix group.
    fn request(&mut self, id: u64, arrival_us: u64) -> RequestSpec {
        let sampled_input = self.input.sample(&mut self.input_rng);
        let output_tokens = self.output.sample(&mut self.output_rng);
        let (input_tokens, content) = match &mut self.prefix {
            Some(prefix) => {
                let group = prefix.group_base + u64::from(prefix.group.sample(&mut prefix.rng));
                let content = PromptContent::Synthetic {
                    prefix_group: Some(group),
                    prefix_len: prefix.length,
                };
                (prefix.length.saturating_add(sampled_input), content)
            }
            None => (
                sampled_input,
                PromptContent::Synthetic {
                    prefix_group: None,
                    prefix_len: 0,
                },
            ),
        };
        debug_assert!(
            input_tokens >= 1,
            "input_tokens {input_tokens} must be >= 1"
        );
        debug_assert!(
            output_tokens >= 1,
            "output_tokens {output_tokens} must be >= 1"
        );
        RequestSpec {
            id: RequestId(id),
            arrival_us,
            input_tokens,
            output_tokens,
            max_tokens: output_tokens,
            slo_class: self.slo_class,
            priority: self.priority,
            deadline_us: self
                .deadline_us
                .map(|deadline| arrival_us.saturating_add(deadline)),
            content,
        }
    }
}

impl WorkloadGenerator {
    /// Requests produced so far.
    pub fn emitted(&self) -> u64 {
        self.next_id
    }
}

impl Iterator for WorkloadGenerator {
    type Item = RequestSpec;

    fn next(&mut self) -> Option<RequestSpec> {
        if self.num_requests_max.is_some_and(|max| self.next_id >= max) {
            return None;
        }
        let Reverse((arrival_us, index)) = self.pending.pop()?;
        debug_assert!(
            arrival_us >= self.last_arrival_us,
            "arrival {arrival_us} before previous {}",
            self.last_arrival_us
        );
        let client = &mut self.clients[index];
        let request = client.request(self.next_id, arrival_us);
        if let Some(next_us) = client.clock.next_arrival(&self.schedule) {
            self.pending.push(Reverse((next_us, index)));
        }
        self.next_id += 1;
        self.last_arrival_us = arrival_us;
        Some(request)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        if self.pending.is_empty() {
            return (0, Some(0));
        }
        let remaining = self
            .num_requests_max
            .map(|max| usize::try_from(max.saturating_sub(self.next_id)).unwrap_or(usize::MAX));
        (remaining.map_or(0, |n| n.min(1)), remaining)
    }
}

impl std::iter::FusedIterator for WorkloadGenerator {}
