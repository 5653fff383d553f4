//! One pod's KV-event stream: a ZMQ SUB on its publisher (topic filter), sequence tracking,
//! gap recovery through the publisher's replay ROUTER, and publisher restarts (sequence going
//! back, or a process restart seen on the pod's `/metrics`: the pod's cache is rebuilt from an
//! `AllBlocksCleared`). A malformed message is counted, reported on the pod's health and
//! skipped; a gap that cannot be replayed marks the pod's prefix state stale for
//! [`PREFIX_STALE_HOLD`]. The loop never ends on an error: it reconnects.

use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper::body::Bytes;
use zeromq::{DealerSocket, Socket, SocketRecv, SocketSend, SubSocket, ZmqMessage};

use super::config::KvEndpoints;
use super::kv_wire::{WireBatch, decode_batch, decode_seq};
use super::pod::{Pod, pause, wall_now_us};
use crate::twin::store::{KvEvent, KvEventBatch};

/// How long a pod's prefix state stays stale after a gap that could not be replayed (then
/// the blocks stored since are trusted again).
pub const PREFIX_STALE_HOLD: Duration = Duration::from_secs(10);
/// Wait between reconnection attempts.
const RECONNECT: Duration = Duration::from_millis(500);

/// Where the stream is.
#[derive(Debug, Default)]
struct Cursor {
    /// The sequence number expected next (`None` before the first batch).
    expected: Option<u64>,
    /// Last `ts_us` written (the store wants it non-decreasing).
    last_ts_us: u64,
    /// Until when the prefix state is held stale.
    stale_until: Option<Instant>,
    /// Process restarts of the pod already handled (see [`Pod::restarts`]).
    restarts_seen: u64,
    /// The pod restarted: the next batch is the new publisher's, whatever its sequence.
    new_publisher: bool,
}

/// The KV-event loop of `pod`.
pub async fn kv_loop(pod: Arc<Pod>, endpoints: KvEndpoints) {
    let events = KvEndpoints::resolve(&endpoints.events, &pod.host);
    let replay = endpoints
        .replay
        .as_deref()
        .map(|template| KvEndpoints::resolve(template, &pod.host));
    let mut cursor = Cursor::default();
    loop {
        let mut socket = SubSocket::new();
        let connected = tokio::time::timeout(Duration::from_secs(2), socket.connect(&events)).await;
        match connected {
            Ok(Ok(())) => {}
            Ok(Err(err)) => {
                pod.set_health(|h| {
                    h.kv_events = Some(format!("kv_events: cannot connect to {events}: {err}"))
                });
                pause(RECONNECT).await;
                continue;
            }
            Err(_) => {
                pod.set_health(|h| {
                    h.kv_events = Some(format!("kv_events: connecting to {events} timed out"))
                });
                pause(RECONNECT).await;
                continue;
            }
        }
        if let Err(err) = socket.subscribe(&endpoints.topic).await {
            pod.set_health(|h| h.kv_events = Some(format!("kv_events: subscribe: {err}")));
            pause(RECONNECT).await;
            continue;
        }
        receive(&pod, &mut socket, replay.as_deref(), &mut cursor).await;
        pause(RECONNECT).await;
    }
}

/// Receives until the socket fails.
async fn receive(
    pod: &Arc<Pod>,
    socket: &mut SubSocket,
    replay: Option<&str>,
    cursor: &mut Cursor,
) {
    let max_age = pod.config.max_age.kv_events;
    loop {
        let next = async {
            match max_age {
                Some(age) => tokio::time::timeout(age, socket.recv()).await.ok(),
                None => Some(socket.recv().await),
            }
        };
        let received = tokio::select! {
            biased;
            () = pod.restarted.notified() => {
                on_restart(pod, cursor);
                continue;
            }
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
            Err(err) => {
                pod.set_health(|h| h.kv_events = Some(format!("kv_events: stream: {err}")));
                return;
            }
        };
        let frames = message.into_vec();
        let decoded = if frames.len() == 3 {
            decode_seq(&frames[1]).and_then(|seq| match seq {
                Some(seq) => decode_batch(seq, &frames[2]),
                None => Err(super::kv_wire::KvWireError(
                    "sequence -1 on the live stream".to_owned(),
                )),
            })
        } else {
            Err(super::kv_wire::KvWireError(format!(
                "{} frames, not 3 (topic, seq, payload)",
                frames.len()
            )))
        };
        let batch = match decoded {
            Ok(batch) => batch,
            Err(err) => {
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

/// The pod's process restarted (seen on its `/metrics`): its cached blocks are gone now, not
/// at its publisher's next batch (an idle pod may send none for a long while).
fn on_restart(pod: &Arc<Pod>, cursor: &mut Cursor) {
    let restarts = pod.restarts.load(std::sync::atomic::Ordering::Relaxed);
    if restarts == cursor.restarts_seen {
        return;
    }
    cursor.restarts_seen = restarts;
    cursor.new_publisher = true;
    if let Some(expected) = cursor.expected {
        apply(
            pod,
            WireBatch {
                seq: expected,
                ts_s: 0.0,
                events: vec![KvEvent::AllCleared],
                dp_rank: None,
            },
            cursor,
        );
    }
}

async fn handle(pod: &Arc<Pod>, batch: WireBatch, replay: Option<&str>, cursor: &mut Cursor) {
    let mut batch = batch;
    if std::mem::take(&mut cursor.new_publisher) {
        // The restarted publisher numbers from 0 again: nothing before it is missing.
        cursor.expected = None;
        batch.events.insert(0, KvEvent::AllCleared);
    }
    let mut reason = None;
    match cursor.expected {
        Some(expected) if batch.seq > expected => {
            let replayed = match replay {
                Some(endpoint) => {
                    fetch_replay(endpoint, expected, batch.seq, pod.config.replay_timeout).await
                }
                None => Err("no replay endpoint".to_owned()),
            };
            match replayed {
                Ok(batches) => {
                    pod.metrics
                        .kv_replays
                        .with_label_values(&[pod.id.as_str(), "ok"])
                        .inc();
                    for missed in batches {
                        pod.metrics
                            .kv_batches
                            .with_label_values(&[pod.id.as_str(), "replayed"])
                            .inc();
                        apply(pod, missed, cursor);
                    }
                }
                Err(err) => {
                    pod.metrics
                        .kv_replays
                        .with_label_values(&[pod.id.as_str(), "unavailable"])
                        .inc();
                    cursor.stale_until = Some(Instant::now() + PREFIX_STALE_HOLD);
                    reason = Some(format!(
                        "kv_events: batches {expected}..{} missed, replay unavailable ({err}): prefix state stale",
                        batch.seq - 1
                    ));
                }
            }
        }
        _ => {}
    }
    if cursor.expected.is_some_and(|expected| batch.seq < expected) {
        // The publisher restarted: what it had cached is gone.
        batch.events.insert(0, KvEvent::AllCleared);
    }
    apply(pod, batch, cursor);
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

fn apply(pod: &Arc<Pod>, batch: WireBatch, cursor: &mut Cursor) {
    if cursor.expected.is_some_and(|expected| batch.seq < expected)
        && !matches!(batch.events.first(), Some(KvEvent::AllCleared))
    {
        // A replayed batch already applied.
        return;
    }
    let ts_us = wall_now_us().max(cursor.last_ts_us);
    let seq = batch.seq;
    let result = pod.store.apply_kv_events(KvEventBatch {
        instance_id: pod.id.clone(),
        seq,
        ts_us,
        events: batch.events,
    });
    let outcome = match result {
        Ok(_) => "applied",
        Err(err) => {
            tracing::warn!(pod = %pod.id, seq, %err, "live mirror: KV batch rejected");
            "rejected"
        }
    };
    pod.metrics
        .kv_batches
        .with_label_values(&[pod.id.as_str(), outcome])
        .inc();
    cursor.last_ts_us = ts_us;
    cursor.expected = Some(seq + 1);
}

/// Asks the replay ROUTER for batches from `start`, keeps those before `end`.
async fn fetch_replay(
    endpoint: &str,
    start: u64,
    end: u64,
    timeout: Duration,
) -> Result<Vec<WireBatch>, String> {
    let work = async {
        let mut socket = DealerSocket::new();
        socket
            .connect(endpoint)
            .await
            .map_err(|err| err.to_string())?;
        let request = ZmqMessage::try_from(vec![
            Bytes::new(),
            Bytes::from(start.to_be_bytes().to_vec()),
        ])
        .map_err(|err| err.to_string())?;
        socket.send(request).await.map_err(|err| err.to_string())?;
        let mut batches = Vec::new();
        loop {
            let reply = socket
                .recv()
                .await
                .map_err(|err| err.to_string())?
                .into_vec();
            // [empty delimiter, seq, payload] (the delimiter may be absent).
            let frames: Vec<&Bytes> = reply.iter().skip_while(|f| f.is_empty()).collect();
            let (Some(seq), payload) = (frames.first(), frames.get(1)) else {
                return Err("empty replay message".to_owned());
            };
            match decode_seq(seq).map_err(|err| err.to_string())? {
                None => break,
                Some(seq) if seq >= start && seq < end => {
                    let payload = payload.ok_or("replay message without payload")?;
                    batches.push(decode_batch(seq, payload).map_err(|err| err.to_string())?);
                }
                Some(_) => {}
            }
        }
        let _ = socket.close().await;
        if batches.len() as u64 != end - start {
            return Err(format!(
                "the publisher replayed {} of {} batches",
                batches.len(),
                end - start
            ));
        }
        Ok(batches)
    };
    tokio::time::timeout(timeout, work)
        .await
        .map_err(|_| format!("timed out after {} ms", timeout.as_millis()))?
}
