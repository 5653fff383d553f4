//! Instance state, KV events and snapshots between the wire and the store's types.
//!
//! Decoding checks ranges and required fields; the store checks the rest against the
//! instance's limits. Field paths are relative to the pushed message (`requests.running[0]
//! .computed_tokens`, `events[2].stored.block_hashes`).

use std::sync::Arc;

use crate::cluster::transfer_fit::TransferCounters;
use crate::sim::SloClass;
use crate::twin::TwinError;
use crate::twin::snapshot::{Gauges, InstanceState, ObservedRequest};
use crate::twin::store::{
    InstanceUpdate, KvEvent, KvEventBatch, RequestEvent, RequestLists, StoredSnapshot,
    TimedRequestEvent,
};

use super::config::cluster_to_proto;
use super::{join, time_us, tokens, us_to_ms};
use crate::server::proto;

/// An SLO class name (empty: standard); `path` names the field.
pub(crate) fn slo_class_from(name: &str, path: &str) -> Result<SloClass, TwinError> {
    SloClass::parse(name).ok_or_else(|| {
        TwinError::invalid(
            path,
            format!(
                "unknown SLO class {name:?}; expected critical, standard, batch, sheddable or \
                 background"
            ),
        )
    })
}

/// Decodes one observed request (`max_tokens` 0 stays 0: the store resolves it).
pub fn request_from_proto(
    message: &proto::RequestState,
    path: &str,
) -> Result<ObservedRequest, TwinError> {
    let field = |name: &str| join(path, name);
    super::id(&message.request_id, &field("request_id"))?;
    let slo_class = slo_class_from(&message.slo_class, &field("slo_class"))?;
    Ok(ObservedRequest {
        request_id: message.request_id.clone(),
        arrival_us: time_us(message.arrival_us, &field("arrival_us"))?,
        prompt_tokens: tokens(message.prompt_tokens, &field("prompt_tokens"))?,
        computed_tokens: tokens(message.computed_tokens, &field("computed_tokens"))?,
        cached_tokens: tokens(message.cached_tokens, &field("cached_tokens"))?,
        output_tokens: tokens(message.output_tokens, &field("output_tokens"))?,
        max_tokens: tokens(message.max_tokens, &field("max_tokens"))?,
        known_output_tokens: message
            .known_output_tokens
            .map(|known| tokens(known, &field("known_output_tokens")))
            .transpose()?,
        priority: message.priority.unwrap_or_else(|| slo_class.priority()),
        slo_class,
        scheduled_tokens: tokens(message.scheduled_tokens, &field("scheduled_tokens"))?,
        block_hashes: message.block_hashes.clone(),
        token_ids: (!message.token_ids.is_empty())
            .then(|| Arc::<[u32]>::from(message.token_ids.as_slice())),
    })
}

/// Encodes one observed request.
pub fn request_to_proto(request: &ObservedRequest) -> proto::RequestState {
    proto::RequestState {
        request_id: request.request_id.clone(),
        arrival_us: request.arrival_us as i64,
        prompt_tokens: i64::from(request.prompt_tokens),
        computed_tokens: i64::from(request.computed_tokens),
        cached_tokens: i64::from(request.cached_tokens),
        output_tokens: i64::from(request.output_tokens),
        max_tokens: i64::from(request.max_tokens),
        known_output_tokens: request.known_output_tokens.map(i64::from),
        priority: Some(request.priority),
        slo_class: request.slo_class.as_str().to_owned(),
        block_hashes: request.block_hashes.clone(),
        token_ids: request
            .token_ids
            .as_deref()
            .map(<[u32]>::to_vec)
            .unwrap_or_default(),
        scheduled_tokens: i64::from(request.scheduled_tokens),
    }
}

fn list_from_proto(
    list: &[proto::RequestState],
    path: &str,
) -> Result<Vec<ObservedRequest>, TwinError> {
    list.iter()
        .enumerate()
        .map(|(index, request)| request_from_proto(request, &format!("{path}[{index}]")))
        .collect()
}

/// Decodes one pushed instance update.
pub fn update_from_proto(
    message: &proto::InstanceStateUpdate,
) -> Result<InstanceUpdate, TwinError> {
    if message.instance_id.is_empty() {
        return Err(TwinError::invalid("instance_id", "required"));
    }
    super::id(&message.instance_id, "instance_id")?;
    let requests = message
        .requests
        .as_ref()
        .map(|lists| -> Result<RequestLists, TwinError> {
            let step_end_us = time_us(lists.step_end_us, "requests.step_end_us")?;
            Ok(RequestLists {
                waiting: list_from_proto(&lists.waiting, "requests.waiting")?,
                running: list_from_proto(&lists.running, "requests.running")?,
                step_end_us: (step_end_us > 0).then_some(step_end_us),
            })
        })
        .transpose()?;
    let gauges = message
        .gauges
        .as_ref()
        .map(|gauges| -> Result<Gauges, TwinError> {
            Ok(Gauges {
                running: tokens(gauges.running, "gauges.running")?,
                waiting: tokens(gauges.waiting, "gauges.waiting")?,
                kv_usage: gauges.kv_usage,
                transfers: gauges.transfers.as_ref().map(|counters| TransferCounters {
                    transfers: counters.transfers,
                    seconds: counters.seconds,
                    bytes: counters.bytes,
                    descriptors: counters.descriptors,
                    failed: counters.failed,
                }),
            })
        })
        .transpose()?;
    let events = message
        .events
        .iter()
        .enumerate()
        .map(|(index, event)| event_from_proto(event, &format!("events[{index}]")))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(InstanceUpdate {
        instance_id: message.instance_id.clone(),
        observed_at_us: time_us(message.observed_at_us, "observed_at_us")?,
        requests,
        gauges,
        events,
        counts_arrivals: true,
    })
}

fn event_from_proto(
    message: &proto::RequestEvent,
    path: &str,
) -> Result<TimedRequestEvent, TwinError> {
    use proto::request_event::Event;
    let event = match &message.event {
        Some(Event::Routed(routed)) => {
            let path = join(path, "routed.request");
            let request = routed
                .request
                .as_ref()
                .ok_or_else(|| TwinError::invalid(path.clone(), "required"))?;
            RequestEvent::Routed(request_from_proto(request, &path)?)
        }
        Some(Event::FirstToken(first)) => {
            super::id(&first.request_id, &join(path, "first_token.request_id"))?;
            RequestEvent::FirstToken {
                request_id: first.request_id.clone(),
            }
        }
        Some(Event::Finished(finished)) => {
            super::id(&finished.request_id, &join(path, "finished.request_id"))?;
            RequestEvent::Finished {
                request_id: finished.request_id.clone(),
                output_tokens: tokens(
                    finished.output_tokens,
                    &join(path, "finished.output_tokens"),
                )?,
            }
        }
        None => {
            return Err(TwinError::invalid(
                join(path, "event"),
                "one of routed, first_token or finished is required",
            ));
        }
    };
    Ok(TimedRequestEvent {
        at_us: time_us(message.at_us, &join(path, "at_us"))?,
        event,
    })
}

/// Decodes one pushed KV event batch.
pub fn kv_batch_from_proto(message: &proto::KvEventBatch) -> Result<KvEventBatch, TwinError> {
    use proto::kv_event::Event;
    if message.instance_id.is_empty() {
        return Err(TwinError::invalid("instance_id", "required"));
    }
    super::id(&message.instance_id, "instance_id")?;
    let events = message
        .events
        .iter()
        .enumerate()
        .map(|(index, event)| match &event.event {
            Some(Event::Stored(stored)) => Ok(KvEvent::Stored {
                block_hashes: stored.block_hashes.clone(),
                parent_block_hash: stored.parent_block_hash,
                token_ids: stored.token_ids.clone(),
                block_size: tokens(
                    stored.block_size,
                    &format!("events[{index}].stored.block_size"),
                )?,
            }),
            Some(Event::Removed(removed)) => Ok(KvEvent::Removed {
                block_hashes: removed.block_hashes.clone(),
            }),
            Some(Event::Cleared(_)) => Ok(KvEvent::AllCleared),
            None => Err(TwinError::invalid(
                format!("events[{index}].event"),
                "one of stored, removed or cleared is required",
            )),
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(KvEventBatch {
        instance_id: message.instance_id.clone(),
        seq: message.seq,
        ts_us: time_us(message.ts_us, "ts_us")?,
        events,
    })
}

/// Age of a signal observed at `at_us` (0: never), seen from `now_us`.
fn signal_age(at_us: u64, now_us: u64, max_age_us: u64) -> proto::SignalAge {
    if at_us == 0 {
        return proto::SignalAge {
            observed: false,
            observed_at_us: 0,
            age_ms: 0.0,
            stale: true,
        };
    }
    let age_us = now_us.saturating_sub(at_us);
    proto::SignalAge {
        observed: true,
        observed_at_us: at_us as i64,
        age_ms: us_to_ms(age_us),
        stale: age_us > max_age_us,
    }
}

fn instance_to_proto(
    state: &InstanceState,
    address: &str,
    now_us: u64,
    max_age_us: u64,
    include_block_hashes: bool,
) -> proto::InstanceSnapshot {
    proto::InstanceSnapshot {
        instance_id: state.instance_id.clone(),
        requests_age: Some(signal_age(state.observed_at_us, now_us, max_age_us)),
        gauges_age: Some(signal_age(state.gauges_at_us, now_us, max_age_us)),
        kv_events_age: Some(signal_age(state.kv_events_at_us, now_us, max_age_us)),
        requests: Some(proto::RequestLists {
            waiting: state.waiting.iter().map(request_to_proto).collect(),
            running: state.running.iter().map(request_to_proto).collect(),
            step_end_us: state.step_end_us.map_or(0, |end| end as i64),
        }),
        gauges: state.gauges.map(|gauges| proto::Gauges {
            running: i64::from(gauges.running),
            waiting: i64::from(gauges.waiting),
            kv_usage: gauges.kv_usage,
            transfers: gauges.transfers.map(|counters| proto::KvTransferCounters {
                transfers: counters.transfers,
                seconds: counters.seconds,
                bytes: counters.bytes,
                descriptors: counters.descriptors,
                failed: counters.failed,
            }),
        }),
        cached_blocks: state.cached_blocks.len() as u64,
        cached_block_hashes: if include_block_hashes {
            publisher_hashes(state)
        } else {
            Vec::new()
        },
        kv_event_seq: state.kv_event_seq,
        kv_event_gaps: state.kv_event_gaps,
        address: address.to_owned(),
        stale_reason: state.stale_reason.clone().unwrap_or_default(),
        capped: state.capped.clone().unwrap_or_default(),
        inferred: None,
        transfer_fit: None,
    }
}

/// The proto form of a pod's transfer fit, its scale against `configured` (the snapshot's
/// transfer model; `None` when the settings do not resolve, then no scale is given).
fn transfer_fit_to_proto(
    fit: &crate::cluster::transfer_fit::TransferFit,
    configured: Option<&crate::cluster::disagg::TransferModel>,
) -> proto::KvTransferFit {
    proto::KvTransferFit {
        transfers: fit.total_transfers(),
        scale: configured.and_then(|model| fit.raw_scale(model)),
        failure_ratio: fit.failure_ratio(),
    }
}

/// The proto form of what the live mirror inferred about one instance.
fn inferred_to_proto(setup: &crate::twin::snapshot::InferredSetup) -> proto::InferredSetup {
    proto::InferredSetup {
        model: setup.model.clone(),
        model_source: setup.model_source.clone(),
        config_source: setup.config_source.clone(),
        gpu: setup.gpu.clone(),
        gpu_source: setup.gpu_source.clone(),
        tp: setup.tp,
        tp_source: setup.tp_source.clone(),
        pool: setup.pool.clone(),
    }
}

/// The cached blocks as their publisher named them: blocks the mirror keys by their token
/// ids are mapped back to the publisher's hash (see `twin::store::kv`).
fn publisher_hashes(state: &crate::twin::snapshot::InstanceState) -> Vec<u64> {
    state.cached_blocks.publisher_hashes()
}

/// Encodes a snapshot with every signal's age measured from `now_us`.
pub fn snapshot_to_proto(
    stored: &StoredSnapshot,
    now_us: u64,
    include_block_hashes: bool,
) -> proto::ClusterSnapshot {
    let snapshot = &stored.snapshot;
    let max_age_us = snapshot.settings.max_signal_age_us;
    let transfer = snapshot
        .instances
        .iter()
        .any(|state| state.transfer_fit.is_some())
        .then(|| crate::twin::transfer::configured(snapshot).ok())
        .flatten()
        .map(|config| config.transfer);
    proto::ClusterSnapshot {
        generation: snapshot.generation,
        config_generation: snapshot.config_generation,
        now_us: now_us as i64,
        config: Some(cluster_to_proto(
            &snapshot.config,
            &snapshot.settings,
            &stored.addresses,
        )),
        instances: snapshot
            .instances
            .iter()
            .enumerate()
            .map(|(index, state)| {
                let address = stored.addresses.get(index).map_or("", String::as_str);
                let mut instance =
                    instance_to_proto(state, address, now_us, max_age_us, include_block_hashes);
                instance.inferred = snapshot
                    .settings
                    .inferred
                    .get(&state.instance_id)
                    .map(inferred_to_proto);
                instance.transfer_fit = state
                    .transfer_fit
                    .as_ref()
                    .map(|fit| transfer_fit_to_proto(fit, transfer.as_ref()));
                instance
            })
            .collect(),
        traffic: Some(proto::TrafficStats {
            arrivals_per_s: snapshot.traffic.arrivals_per_s,
            recent_finished: snapshot.traffic.recent_lengths.len() as u64,
        }),
    }
}

/// The latest observation time of any signal in the snapshot (client clock, µs; 0: none).
pub fn latest_observation_us(stored: &StoredSnapshot) -> u64 {
    stored
        .snapshot
        .instances
        .iter()
        .map(|state| {
            state
                .observed_at_us
                .max(state.gauges_at_us)
                .max(state.kv_events_at_us)
        })
        .max()
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_round_trip() {
        let message = proto::RequestState {
            request_id: "r1".into(),
            arrival_us: 10,
            prompt_tokens: 100,
            computed_tokens: 50,
            cached_tokens: 16,
            output_tokens: 0,
            max_tokens: 64,
            known_output_tokens: Some(32),
            priority: None,
            slo_class: "batch".into(),
            block_hashes: vec![1, 2],
            token_ids: vec![],
            scheduled_tokens: 0,
        };
        let request = request_from_proto(&message, "r").unwrap();
        assert_eq!(request.priority, SloClass::Batch.priority());
        let back = request_to_proto(&request);
        assert_eq!(back.priority, Some(5));
        assert_eq!(request_from_proto(&back, "r").unwrap(), request);
    }

    #[test]
    fn negative_counts_name_the_field() {
        let message = proto::InstanceStateUpdate {
            instance_id: "a".into(),
            observed_at_us: 5,
            requests: Some(proto::RequestLists {
                waiting: vec![],
                running: vec![proto::RequestState {
                    request_id: "r".into(),
                    prompt_tokens: -3,
                    ..proto::RequestState::default()
                }],
                step_end_us: 0,
            }),
            ..proto::InstanceStateUpdate::default()
        };
        let err = update_from_proto(&message).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("requests.running[0].prompt_tokens: "),
            "{err}"
        );
    }
}
