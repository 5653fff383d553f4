//! One pod's KV-event streams (one per data-parallel rank): a ZMQ SUB on each publisher
//! (topic filter), sequence tracking, and recovery through the publisher's replay ROUTER.
//!
//! - **(Re)connection.** The socket is ours to reconnect: a disconnect seen on the socket's
//!   monitor, or a process restart seen on the pod's `/metrics`, drops it and connects a new
//!   one with a capped backoff ([`RECONNECT_FIRST`] doubling up to [`RECONNECT_CAP`]); while
//!   it is down the pod's prefix state is stale with the reason.
//! - **Catch-up.** After every connection, the replay socket is asked for everything from the
//!   next expected sequence number (from 0, everything the publisher still holds, on the first
//!   connection and after a restart), so blocks stored while ditto was not listening are
//!   mirrored. Batches the publisher no longer holds are counted as a gap.
//! - **Gaps** on the live stream are replayed the same way; a gap that cannot be replayed
//!   marks the prefix state stale for [`PREFIX_STALE_HOLD`].
//! - **Restarts** (a sequence number going back, another process on `/metrics`) clear the
//!   pod's blocks (its GPU cache died with it) and replay the new publisher from 0.
//!
//! Every rank writes to the pod's one instance through [`super::pod::KvSink`], which numbers the batches
//! for the store (ranks have their own sequences) and carries unrecovered gaps to it.

use std::sync::Arc;
use std::sync::PoisonError;
use std::time::{Duration, Instant};

use tokio_stream::StreamExt;
use zeromq::{Socket, SocketEvent, SocketRecv, SubSocket};

use super::config::KvEndpoints;
use super::kv_frames::{Relay, relay};
use super::kv_replay::fetch_replay;
use super::kv_wire::{KvWireError, WireBatch, decode_batch, decode_seq};
use super::pod::{Pod, pause};
use crate::telemetry::clock::wall_now_us;
use crate::twin::store::{KvEvent, KvEventBatch, Publish};

/// The largest forward jump of a sequence number taken as batches missed (16.7 M: 23 minutes
/// of a stream at 12,000 batches a second). A larger jump is a new sequence (a publisher
/// reset, or garbage), not a gap: counted as missed it set the gap counters to 4.6e18 for
/// ever, and repeated it overflowed the store's numbering (issue 38 D10).
const MAX_SEQUENCE_JUMP: u64 = 1 << 24;

/// How long a pod's prefix state stays stale after a gap that could not be replayed (then
/// the blocks stored since are trusted again).
pub const PREFIX_STALE_HOLD: Duration = Duration::from_secs(10);
/// First wait before reconnecting.
pub const RECONNECT_FIRST: Duration = Duration::from_millis(100);
/// Longest wait between reconnection attempts (a restarted pod is followed within it).
pub const RECONNECT_CAP: Duration = Duration::from_secs(1);
/// Most distinct unknown event types counted per pod (the rest count as `other`).
const MAX_UNKNOWN_TYPES: usize = 16;

/// Where one rank's stream is.
#[derive(Debug, Default)]
struct Cursor {
    /// The publisher sequence number expected next (`None` before the first batch).
    expected: Option<u64>,
    /// Until when the prefix state is held stale.
    stale_until: Option<Instant>,
    /// Process restarts of the pod already handled (see [`Pod::restarts`]).
    restarts_seen: u64,
    /// The publisher restarted: replay it from 0 after a clear.
    new_publisher: bool,
}

/// Why a receive loop ended.
enum Ended {
    /// The publisher went away (or the socket failed): reconnect.
    Disconnected(String),
    /// The pod restarted: reconnect and replay the new publisher from 0.
    Restarted,
}

/// The KV-event loop of data-parallel rank `rank` of `pod`.
pub async fn kv_loop(pod: Arc<Pod>, endpoints: KvEndpoints, rank: u32) {
    let events = endpoints.resolve_events(&pod.host, rank);
    let replay = endpoints.resolve_replay(&pod.host, rank);
    let mut cursor = Cursor::default();
    let mut backoff = RECONNECT_FIRST;
    loop {
        let mut socket = SubSocket::new();
        let mut monitor = socket.monitor();
        // Through a relay that bounds the publisher's frames (see `kv_frames`).
        let connect = async {
            let relay = relay(&events).await.map_err(|err| err.to_string())?;
            socket
                .connect(&relay.endpoint)
                .await
                .map_err(|err| err.to_string())?;
            Ok::<_, String>(relay)
        };
        let connected = tokio::time::timeout(RECONNECT_CAP, connect).await;
        let (relay, failure) = match connected {
            Ok(Ok(relay)) => (Some(relay), None),
            Ok(Err(err)) => (None, Some(format!("cannot connect to {events}: {err}"))),
            Err(_) => (None, Some(format!("connecting to {events} timed out"))),
        };
        if let Some(failure) = failure {
            pod.metrics
                .kv_connections
                .with_label_values(&[pod.id.as_str(), "failed"])
                .inc();
            pod.set_health(|h| {
                h.kv_events = Some(format!(
                    "kv_events: {failure} (retrying; prefix state stale)"
                ));
            });
            pause(backoff).await;
            backoff = (backoff * 2).min(RECONNECT_CAP);
            continue;
        }
        if let Err(err) = socket.subscribe(&endpoints.topic).await {
            pod.set_health(|h| h.kv_events = Some(format!("kv_events: subscribe: {err}")));
            pause(backoff).await;
            backoff = (backoff * 2).min(RECONNECT_CAP);
            continue;
        }
        pod.metrics
            .kv_connections
            .with_label_values(&[pod.id.as_str(), "connected"])
            .inc();
        backoff = RECONNECT_FIRST;
        check_restart(&pod, &mut cursor);
        catch_up(&pod, replay.as_deref(), &mut cursor).await;
        let ended = receive(
            &pod,
            &mut socket,
            &mut monitor,
            relay.as_ref(),
            replay.as_deref(),
            &mut cursor,
        )
        .await;
        let reason = match ended {
            Ended::Disconnected(reason) => relay.and_then(|r| r.tripped()).unwrap_or(reason),
            Ended::Restarted => "the pod restarted".to_owned(),
        };
        pod.metrics
            .kv_connections
            .with_label_values(&[pod.id.as_str(), "disconnected"])
            .inc();
        pod.set_health(|h| {
            h.kv_events = Some(format!(
                "kv_events: {reason}; reconnecting (prefix state stale)"
            ));
        });
        drop(socket);
        pause(RECONNECT_FIRST).await;
    }
}

/// Notes a process restart seen on `/metrics` since the last look: the pod's blocks are
/// cleared now (an idle pod may publish nothing for a long while) and the new publisher is
/// replayed from 0 at the next catch-up.
fn check_restart(pod: &Arc<Pod>, cursor: &mut Cursor) -> bool {
    let restarts = pod.restarts.load(std::sync::atomic::Ordering::Relaxed);
    if restarts == cursor.restarts_seen {
        return false;
    }
    cursor.restarts_seen = restarts;
    cursor.new_publisher = true;
    cursor.expected = None;
    write(pod, vec![KvEvent::AllCleared], 0);
    true
}

/// Asks the replay socket for what this rank missed: from the expected sequence number, or
/// from 0 (everything the publisher holds) on a first connection or after a restart.
async fn catch_up(pod: &Arc<Pod>, replay: Option<&str>, cursor: &mut Cursor) {
    let Some(endpoint) = replay else {
        if !cursor.new_publisher {
            clear_health(pod, cursor);
        }
        return;
    };
    let start = if cursor.new_publisher {
        0
    } else {
        cursor.expected.unwrap_or(0)
    };
    match fetch_replay(endpoint, start, None, pod.config.replay_timeout).await {
        Ok(batches) => {
            pod.metrics
                .kv_replays
                .with_label_values(&[pod.id.as_str(), "ok"])
                .inc();
            let restarted = std::mem::take(&mut cursor.new_publisher);
            if restarted {
                cursor.expected = None;
            }
            // The publisher's buffer no longer goes back to where this stream was: those
            // batches are lost (not on a first connection: nothing was expected yet).
            let missed = match (cursor.expected, batches.first()) {
                (Some(expected), Some(first))
                    if first.seq.saturating_sub(expected) > MAX_SEQUENCE_JUMP =>
                {
                    // A new sequence, not a gap (see MAX_SEQUENCE_JUMP).
                    write(pod, vec![KvEvent::AllCleared], 0);
                    cursor.expected = None;
                    0
                }
                (Some(expected), Some(first)) if first.seq > expected => first.seq - expected,
                _ => 0,
            };
            if missed > 0 {
                count_gap(
                    pod,
                    cursor,
                    missed,
                    start,
                    "no longer held by the publisher",
                );
            }
            let mut pending_gap = missed;
            let mut rejected = None;
            for batch in batches {
                if cursor.expected.is_some_and(|expected| batch.seq < expected) {
                    continue;
                }
                pod.metrics
                    .kv_batches
                    .with_label_values(&[pod.id.as_str(), "replayed"])
                    .inc();
                let seq = batch.seq;
                if let Some(err) = apply(pod, batch, cursor, std::mem::take(&mut pending_gap)) {
                    rejected = Some(rejection(seq, &err));
                }
            }
            if let Some(reason) = rejected {
                pod.set_health(|h| h.kv_events = Some(reason));
            } else if missed == 0 {
                clear_health(pod, cursor);
            }
        }
        Err(err) => {
            pod.metrics
                .kv_replays
                .with_label_values(&[pod.id.as_str(), "unavailable"])
                .inc();
            if cursor.new_publisher || cursor.expected.is_some() {
                cursor.stale_until = Some(Instant::now() + PREFIX_STALE_HOLD);
                pod.set_health(|h| {
                    h.kv_events = Some(format!(
                        "kv_events: catch-up from batch {start} failed, replay unavailable \
                         ({err}): prefix state stale"
                    ));
                });
            } else {
                clear_health(pod, cursor);
            }
        }
    }
}

/// Clears the stream's stale reason unless a gap holds it.
fn clear_health(pod: &Arc<Pod>, cursor: &mut Cursor) {
    if cursor
        .stale_until
        .is_some_and(|until| Instant::now() < until)
    {
        return;
    }
    cursor.stale_until = None;
    pod.set_health(|h| h.kv_events = None);
}

fn count_gap(pod: &Arc<Pod>, cursor: &mut Cursor, missed: u64, from: u64, why: &str) {
    pod.metrics
        .kv_gaps
        .with_label_values(&[pod.id.as_str()])
        .inc_by(missed);
    cursor.stale_until = Some(Instant::now() + PREFIX_STALE_HOLD);
    pod.set_health(|h| {
        h.kv_events = Some(format!(
            "kv_events: {missed} batches from {from} missed ({why}): prefix state stale"
        ));
    });
}

/// Receives until the publisher goes away or the pod restarts.
async fn receive(
    pod: &Arc<Pod>,
    socket: &mut SubSocket,
    monitor: &mut (impl tokio_stream::Stream<Item = SocketEvent> + Unpin),
    relay: Option<&Relay>,
    replay: Option<&str>,
    cursor: &mut Cursor,
) -> Ended {
    let max_age = pod.config.max_age.kv_events;
    let mut restarts = pod.restarted.subscribe();
    // A restart sent before this subscription would not wake it: compare the counts now.
    if check_restart(pod, cursor) {
        return Ended::Restarted;
    }
    loop {
        let next = async {
            match max_age {
                Some(age) => tokio::time::timeout(age, socket.recv()).await.ok(),
                None => Some(socket.recv().await),
            }
        };
        let received = tokio::select! {
            biased;
            changed = restarts.changed() => {
                if changed.is_err() || check_restart(pod, cursor) {
                    return Ended::Restarted;
                }
                continue;
            }
            event = monitor.next() => match event {
                Some(SocketEvent::Disconnected(_)) => {
                    return Ended::Disconnected("the publisher disconnected".to_owned());
                }
                Some(_) => continue,
                None => return Ended::Disconnected("the socket monitor closed".to_owned()),
            },
            received = next => received,
        };
        let Some(message) = received else {
            if let Some(age) = max_age {
                pod.set_health(|h| {
                    h.kv_events = Some(format!("kv_events: no batch for {} ms", age.as_millis()))
                });
            }
            continue;
        };
        let message = match message {
            Ok(message) => message,
            Err(err) => return Ended::Disconnected(format!("stream: {err}")),
        };
        let frames = message.into_vec();
        let decoded = if frames.len() == 3 {
            decode_seq(&frames[1]).and_then(|seq| match seq {
                Some(seq) => decode_batch(seq, &frames[2]),
                None => Err(KvWireError("sequence -1 on the live stream".to_owned())),
            })
        } else {
            Err(KvWireError(format!(
                "{} frames, not 3 (topic, seq, payload)",
                frames.len()
            )))
        };
        let batch = match decoded {
            Ok(batch) => batch,
            Err(mut err) => {
                if frames.iter().any(|frame| frame.is_empty())
                    && let Some(cut) = relay.and_then(Relay::take_cut)
                {
                    // The relay emptied a frame of this message, dropping it as it arrived
                    // (over the limit): that is why it is malformed.
                    err = KvWireError(cut);
                }
                pod.metrics
                    .kv_batches
                    .with_label_values(&[pod.id.as_str(), "malformed"])
                    .inc();
                let seq = frames.get(1).and_then(|f| decode_seq(f).ok().flatten());
                if let (Some(seq), Some(expected)) = (seq, cursor.expected)
                    && seq >= expected
                {
                    // Skipped (its loss is reported): replaying it would fail the same way.
                    cursor.expected = Some(seq + 1);
                }
                pod.set_health(|h| h.kv_events = Some(format!("kv_events: {err} (skipped)")));
                continue;
            }
        };
        handle(pod, batch, replay, cursor).await;
    }
}

async fn handle(pod: &Arc<Pod>, batch: WireBatch, replay: Option<&str>, cursor: &mut Cursor) {
    if cursor.expected.is_some_and(|expected| batch.seq < expected) {
        // The sequence went back: the publisher restarted, and what it had cached is gone.
        // Its batches before this one are replayed below as a gap from 0.
        write(pod, vec![KvEvent::AllCleared], 0);
        cursor.expected = Some(0);
    }
    let mut missed = 0;
    let mut reason = None;
    if let Some(expected) = cursor.expected
        && batch.seq.saturating_sub(expected) > MAX_SEQUENCE_JUMP
    {
        // Not a gap: a new sequence. What the old one built is dropped, the new one starts
        // from this batch, and the prefix state is stale until it has had time to fill.
        write(pod, vec![KvEvent::AllCleared], 0);
        cursor.expected = None;
        cursor.stale_until = Some(Instant::now() + PREFIX_STALE_HOLD);
        pod.metrics
            .kv_batches
            .with_label_values(&[pod.id.as_str(), "sequence_reset"])
            .inc();
        reason = Some(format!(
            "kv_events: sequence jumped from {expected} to {}: a new sequence, prefix state rebuilt from it",
            batch.seq
        ));
    } else if let Some(expected) = cursor.expected
        && batch.seq > expected
    {
        let replayed = match replay {
            Some(endpoint) => {
                fetch_replay(
                    endpoint,
                    expected,
                    Some(batch.seq),
                    pod.config.replay_timeout,
                )
                .await
            }
            None => Err("no replay endpoint".to_owned()),
        };
        match replayed {
            Ok(batches) => {
                pod.metrics
                    .kv_replays
                    .with_label_values(&[pod.id.as_str(), "ok"])
                    .inc();
                for missed_batch in batches {
                    pod.metrics
                        .kv_batches
                        .with_label_values(&[pod.id.as_str(), "replayed"])
                        .inc();
                    let seq = missed_batch.seq;
                    if let Some(err) = apply(pod, missed_batch, cursor, 0) {
                        reason.get_or_insert_with(|| rejection(seq, &err));
                    }
                }
            }
            Err(err) => {
                pod.metrics
                    .kv_replays
                    .with_label_values(&[pod.id.as_str(), "unavailable"])
                    .inc();
                missed = batch.seq - cursor.expected.unwrap_or(expected);
                pod.metrics
                    .kv_gaps
                    .with_label_values(&[pod.id.as_str()])
                    .inc_by(missed);
                cursor.stale_until = Some(Instant::now() + PREFIX_STALE_HOLD);
                reason = Some(format!(
                    "kv_events: batches {expected}..{} missed, replay unavailable ({err}): prefix state stale",
                    batch.seq - 1
                ));
            }
        }
    }
    let seq = batch.seq;
    if let Some(err) = apply(pod, batch, cursor, missed) {
        reason.get_or_insert_with(|| rejection(seq, &err));
    }
    if reason.is_none()
        && cursor
            .stale_until
            .is_some_and(|until| Instant::now() < until)
    {
        return;
    }
    cursor.stale_until = cursor.stale_until.filter(|_| reason.is_some());
    pod.set_health(|h| h.kv_events = reason);
}

/// Applies one of this rank's batches (`missed`: batches lost just before it); why the
/// store refused it, if it did (e.g. more events than `--max-kv-events-per-batch`).
fn apply(pod: &Arc<Pod>, batch: WireBatch, cursor: &mut Cursor, missed: u64) -> Option<String> {
    if cursor.expected.is_some_and(|expected| batch.seq < expected) {
        // A replayed batch already applied.
        return None;
    }
    count_skipped(pod, &batch);
    cursor.expected = Some(batch.seq.saturating_add(1));
    write_at(pod, batch.events, missed, Some(batch.ts_s))
}

/// The stale reason of batch `seq` refused by the store (skipped: the stream goes on).
fn rejection(seq: u64, err: &str) -> String {
    format!("kv_events: batch {seq} rejected: {err} (skipped)")
}

/// Counts the events the decoder skipped by type.
fn count_skipped(pod: &Arc<Pod>, batch: &WireBatch) {
    if batch.unknown.is_empty() {
        return;
    }
    let mut known = pod
        .unknown_types
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    for kind in &batch.unknown {
        let label = if known.contains(kind) {
            kind.as_str()
        } else if known.len() < MAX_UNKNOWN_TYPES {
            tracing::warn!(pod = %pod.id, kind = %kind, "live mirror: unknown KV event type skipped");
            known.push(kind.clone());
            kind.as_str()
        } else {
            "other"
        };
        pod.metrics
            .kv_unknown_events
            .with_label_values(&[pod.id.as_str(), label])
            .inc();
    }
}

/// Writes events ditto makes itself (a clear on a restart) to the pod's instance, stamped
/// now.
fn write(pod: &Arc<Pod>, events: Vec<KvEvent>, missed: u64) {
    // A clear of ditto's own is never over a limit; a refusal is logged and counted.
    let _ = write_at(pod, events, missed, None);
}

/// Writes events to the pod's instance, numbered for the store; `missed` unrecovered
/// batches before them are carried to the store as a sequence gap (counted there). The
/// batch is stamped with its own emission time `ts_s` (the publisher's clock, seconds),
/// never later than now nor earlier than the last batch's stamp, so the KV-events age
/// (`kv_events_age_ms`) is the lag behind the publisher: stamped on arrival it read 57-108
/// ms while the mirror applied batches 17 s late (issue 38 D11).
fn write_at(
    pod: &Arc<Pod>,
    events: Vec<KvEvent>,
    missed: u64,
    ts_s: Option<f64>,
) -> Option<String> {
    let mut sink = pod.kv_sink.lock().unwrap_or_else(PoisonError::into_inner);
    let now_us = wall_now_us();
    let emitted_us = ts_s
        .filter(|ts| ts.is_finite() && *ts >= 0.0)
        .map_or(now_us, |ts| ((ts * 1e6) as u64).min(now_us));
    let ts_us = emitted_us.max(sink.last_ts_us);
    let seq = sink.next_seq.saturating_add(missed);
    let result = pod.store.apply_kv_events_capped(
        KvEventBatch {
            instance_id: pod.id.clone(),
            seq,
            ts_us,
            events,
        },
        Publish::Staged,
    );
    let (outcome, refused) = match result {
        Ok(applied) => {
            if applied.evicted > 0 {
                pod.metrics
                    .state_capped
                    .with_label_values(&[pod.id.as_str(), "cached_blocks"])
                    .inc_by(applied.evicted);
            }
            ("applied", None)
        }
        Err(err) => {
            tracing::warn!(pod = %pod.id, seq, %err, "live mirror: KV batch rejected");
            ("rejected", Some(err.to_string()))
        }
    };
    pod.metrics
        .kv_batches
        .with_label_values(&[pod.id.as_str(), outcome])
        .inc();
    sink.last_ts_us = ts_us;
    sink.next_seq = seq.saturating_add(1);
    refused
}
