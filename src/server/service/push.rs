//! The push RPCs' side of the service: reading a client stream within its deadline, and
//! applying each state update or KV-event batch to the store off the async workers, with the
//! acknowledgement and the metrics they leave.

use std::sync::Arc;
use std::time::Instant;

use tonic::{Status, Streaming};

use crate::server::convert::state::{kv_batch_from_proto, update_from_proto};
use crate::server::error::CallError;
use crate::server::state::ServerState;
use crate::server::{proto, spans};
use crate::twin::TwinError;
use crate::twin::store::{KvEvent, MirrorStore};

/// Most gaps listed in one `PushAck` (the count in the metrics is exact).
pub const ACK_GAPS_MAX: usize = 1024;

impl ServerState {
    /// Reads the next message of a client stream within the client's deadline, if any.
    pub(super) async fn next_message<T>(
        stream: &mut Streaming<T>,
        deadline: Option<Instant>,
        accepted: u64,
    ) -> Result<Option<T>, Status> {
        match deadline {
            None => stream.message().await,
            Some(deadline) => {
                tokio::time::timeout_at(tokio::time::Instant::from_std(deadline), stream.message())
                    .await
                    .map_err(|_| {
                        Status::from(CallError::Deadline(format!(
                            "after {accepted} accepted messages"
                        )))
                    })?
            }
        }
    }

    /// An acknowledgement of nothing yet, at the latest generation.
    pub(super) fn empty_ack(&self) -> proto::PushAck {
        proto::PushAck {
            generation: self.store.latest().map_or(0, |s| s.snapshot.generation),
            ..proto::PushAck::default()
        }
    }

    /// Applies one write to the store on the blocking pool (writes copy instance state: they
    /// stay off the async workers); errors name the stream message (`accepted` so far).
    async fn write_store<T: Send + 'static>(
        &self,
        accepted: u64,
        write: impl FnOnce(&MirrorStore) -> Result<T, TwinError> + Send + 'static,
    ) -> Result<T, Status> {
        let store = Arc::clone(&self.store);
        let applying = spans::apply();
        tokio::task::spawn_blocking(move || applying.in_scope(|| write(&store)))
            .await
            .map_err(|_| Status::from(CallError::Internal("the store update task failed")))?
            .map_err(|err| CallError::in_stream(err, accepted).into())
    }

    pub(super) async fn push_states(
        &self,
        mut stream: Streaming<proto::InstanceStateUpdate>,
        deadline: Option<Instant>,
    ) -> Result<proto::PushAck, Status> {
        let mut ack = self.empty_ack();
        while let Some(message) = Self::next_message(&mut stream, deadline, ack.accepted).await? {
            let update = update_from_proto(&message)
                .map_err(|err| Status::from(CallError::in_stream(err, ack.accepted)))?;
            let generation = self
                .write_store(ack.accepted, move |store| store.apply_state(update))
                .await?;
            ack.generation = generation;
            ack.accepted += 1;
            self.metrics
                .pushed_messages
                .with_label_values(&["PushInstanceState"])
                .inc();
        }
        Ok(ack)
    }

    pub(super) async fn push_kv(
        &self,
        mut stream: Streaming<proto::KvEventBatch>,
        deadline: Option<Instant>,
    ) -> Result<proto::PushAck, Status> {
        let mut ack = self.empty_ack();
        while let Some(message) = Self::next_message(&mut stream, deadline, ack.accepted).await? {
            let batch = kv_batch_from_proto(&message)
                .map_err(|err| Status::from(CallError::in_stream(err, ack.accepted)))?;
            let counts = count_kv_events(&batch.events);
            let applied = self
                .write_store(ack.accepted, move |store| store.apply_kv_events(batch))
                .await?;
            for (kind, count) in counts {
                self.metrics
                    .kv_events
                    .with_label_values(&[kind])
                    .inc_by(count);
            }
            if let Some(gap) = applied.gap {
                self.metrics
                    .kv_event_seq_gaps
                    .inc_by(gap.received_seq - gap.expected_seq);
                if ack.gaps.len() < ACK_GAPS_MAX {
                    ack.gaps.push(proto::KvSequenceGap {
                        instance_id: gap.instance_id,
                        expected_seq: gap.expected_seq,
                        received_seq: gap.received_seq,
                    });
                }
            }
            ack.generation = applied.generation;
            ack.accepted += 1;
            self.metrics
                .pushed_messages
                .with_label_values(&["PushKvEvents"])
                .inc();
        }
        Ok(ack)
    }
}

fn count_kv_events(events: &[KvEvent]) -> [(&'static str, u64); 3] {
    let mut counts = [("stored", 0), ("removed", 0), ("cleared", 0)];
    for event in events {
        let slot = match event {
            KvEvent::Stored { .. } => 0,
            KvEvent::Removed { .. } => 1,
            KvEvent::AllCleared => 2,
        };
        counts[slot].1 += 1;
    }
    counts
}
