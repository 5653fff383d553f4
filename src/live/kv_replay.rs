//! One request to a KV-event publisher's replay ROUTER (vLLM's `ZmqEventPublisher` replay
//! socket): a DEALER asks for every buffered batch from a sequence number and reads them
//! until sequence -1, through the same frame-bounding relay as the live stream
//! ([`super::kv_frames`]).

use std::time::Duration;

use hyper::body::Bytes;
use zeromq::{DealerSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

use super::kv_frames::relay;
use super::kv_wire::{KvWireError, WireBatch, decode_batch, decode_seq};

/// Asks the replay ROUTER for batches from `start`; keeps those before `end` (all, with
/// `None`). With an `end`, every batch in `start..end` must come back.
pub(super) async fn fetch_replay(
    endpoint: &str,
    start: u64,
    end: Option<u64>,
    timeout: Duration,
) -> Result<Vec<WireBatch>, String> {
    let relay = tokio::time::timeout(timeout, relay(endpoint))
        .await
        .map_err(|_| format!("timed out after {} ms", timeout.as_millis()))?
        .map_err(|err| err.to_string())?;
    let work = async {
        let mut socket = DealerSocket::new();
        socket
            .connect(&relay.endpoint)
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
                Some(seq) if seq >= start && end.is_none_or(|end| seq < end) => {
                    let payload = payload.ok_or("replay message without payload")?;
                    batches.push(decode_batch(seq, payload).map_err(|err| err.to_string())?);
                }
                Some(_) => {}
            }
        }
        let _ = socket.close().await;
        if let Some(end) = end
            && batches.len() as u64 != end - start
        {
            return Err(format!(
                "the publisher replayed {} of {} batches",
                batches.len(),
                end - start
            ));
        }
        Ok(batches)
    };
    let outcome = tokio::time::timeout(timeout, work)
        .await
        .map_err(|_| format!("timed out after {} ms", timeout.as_millis()))
        .and_then(|done| done);
    outcome.map_err(|err| {
        relay
            .tripped()
            .or_else(|| relay.take_cut().map(|cut| KvWireError(cut).to_string()))
            .unwrap_or(err)
    })
}
