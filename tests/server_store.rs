#![allow(clippy::unwrap_used)]
//! The mirror store behind the server: re-syncs keep or reset instance state, snapshots are
//! kept by generation within a bound, observed traffic is summarised, and readers always see
//! whole snapshots while a writer streams updates in.

use std::sync::Arc;

use ditto::server::convert::config::cluster_from_proto;
use ditto::server::proto;
use ditto::sim::SloClass;
use ditto::twin::TwinError;
use ditto::twin::snapshot::{ObservedRequest, TwinSettings};
use ditto::twin::store::{
    InstanceUpdate, MirrorStore, Publish, RequestEvent, RequestLists, StoreLimits,
    TimedRequestEvent,
};

fn cluster(max_num_seqs: i64) -> ditto::cluster::config::ClusterConfig {
    let instance = |id: &str| proto::InstanceSpec {
        id: id.to_owned(),
        engine: Some(proto::EngineLimits {
            num_gpu_blocks: Some(64),
            max_num_seqs: Some(max_num_seqs),
            max_model_len: Some(4096),
            ..proto::EngineLimits::default()
        }),
        ..proto::InstanceSpec::default()
    };
    let message = proto::ClusterConfig {
        instances: vec![instance("a"), instance("b")],
        ..proto::ClusterConfig::default()
    };
    cluster_from_proto(&message).unwrap().cluster
}

fn request(id: &str, arrival_us: u64) -> ObservedRequest {
    ObservedRequest {
        request_id: id.to_owned(),
        arrival_us,
        prompt_tokens: 32,
        computed_tokens: 32,
        cached_tokens: 0,
        output_tokens: 1,
        max_tokens: 64,
        known_output_tokens: None,
        priority: 1,
        slo_class: SloClass::Standard,
        scheduled_tokens: 0,
        block_hashes: Vec::new(),
        token_ids: None,
    }
}

fn running(id: &str, at: u64, count: usize) -> InstanceUpdate {
    InstanceUpdate {
        instance_id: id.to_owned(),
        observed_at_us: at,
        requests: Some(RequestLists {
            waiting: Vec::new(),
            running: (0..count)
                .map(|i| request(&format!("{id}{i}"), at))
                .collect(),
            step_end_us: None,
        }),
        gauges: None,
        events: Vec::new(),
        counts_arrivals: true,
    }
}

fn synced(limits: StoreLimits) -> MirrorStore {
    let store = MirrorStore::new(limits);
    store
        .sync_config(cluster(4), TwinSettings::defaults(), Vec::new())
        .unwrap();
    store
}

#[test]
fn a_resync_keeps_fitting_state_and_resets_the_rest() {
    let store = synced(StoreLimits::DEFAULT);
    store.apply_state(running("a", 1_000, 3)).unwrap();
    store.apply_state(running("b", 1_000, 1)).unwrap();
    let outcome = store
        .sync_config(cluster(2), TwinSettings::defaults(), Vec::new())
        .unwrap();
    assert_eq!(outcome.reset_instance_ids, ["a"]);
    let snapshot = store.latest().unwrap().snapshot;
    assert_eq!(snapshot.config_generation, outcome.generation);
    assert!(snapshot.instances[0].running.is_empty());
    assert_eq!(snapshot.instances[0].observed_at_us, 0);
    assert_eq!(snapshot.instances[1].running.len(), 1);
}

#[test]
fn snapshots_are_kept_by_generation_within_the_bound() {
    let store = synced(StoreLimits {
        history_len: 3,
        ..StoreLimits::DEFAULT
    });
    for step in 1..=4 {
        store.apply_state(running("a", step * 1_000, 1)).unwrap();
    }
    let latest = store.latest().unwrap().snapshot.generation;
    assert_eq!(latest, 5);
    assert_eq!(store.snapshot(3).unwrap().snapshot.generation, 3);
    assert!(matches!(store.snapshot(2), Err(TwinError::NotFound { .. })));
    assert!(matches!(store.snapshot(6), Err(TwinError::NotFound { .. })));
    assert_eq!(store.snapshot(0).unwrap().snapshot.generation, latest);
}

#[test]
fn traffic_counts_arrivals_and_finished_lengths() {
    let store = synced(StoreLimits {
        recent_lengths_max: 3,
        ..StoreLimits::DEFAULT
    });
    // Ten arrivals one second apart, each finishing right away.
    for i in 0..10u64 {
        let at = 1_000_000 + i * 1_000_000;
        let id = format!("r{i}");
        let events = vec![
            TimedRequestEvent {
                at_us: at,
                event: RequestEvent::Routed(ObservedRequest {
                    computed_tokens: 0,
                    output_tokens: 0,
                    ..request(&id, at)
                }),
            },
            TimedRequestEvent {
                at_us: at,
                event: RequestEvent::Finished {
                    request_id: id,
                    output_tokens: 10 + i as u32,
                },
            },
        ];
        let update = InstanceUpdate {
            instance_id: "a".to_owned(),
            observed_at_us: at,
            requests: None,
            gauges: None,
            events,
            counts_arrivals: true,
        };
        store.apply_state(update).unwrap();
    }
    let traffic = Arc::clone(&store.latest().unwrap().snapshot.traffic);
    assert_eq!(traffic.arrivals_per_s, 10.0 / 9.0);
    assert_eq!(traffic.recent_lengths, [(32, 17), (32, 18), (32, 19)]);
}

#[test]
fn readers_see_whole_snapshots_while_updates_stream_in() {
    let store = Arc::new(synced(StoreLimits::DEFAULT));
    let writer = {
        let store = Arc::clone(&store);
        std::thread::spawn(move || {
            for step in 1..=300u64 {
                let id = if step % 2 == 0 { "a" } else { "b" };
                store
                    .apply_state(running(id, step * 1_000, (step % 5) as usize % 4))
                    .unwrap();
            }
        })
    };
    let mut last = 0;
    while last < 301 {
        let snapshot = store.latest().unwrap().snapshot;
        assert!(snapshot.generation >= last, "generations never go back");
        assert_eq!(snapshot.instances.len(), snapshot.config.instances.len());
        for state in &snapshot.instances {
            assert!(state.running.len() <= 4);
            assert!(
                state
                    .running
                    .iter()
                    .all(|r| r.arrival_us == state.observed_at_us)
            );
        }
        last = snapshot.generation;
    }
    writer.join().unwrap();
}

#[test]
fn nothing_is_accepted_before_a_config() {
    let store = MirrorStore::new(StoreLimits::DEFAULT);
    assert!(matches!(
        store.apply_state(running("a", 1, 1)),
        Err(TwinError::NotSynced)
    ));
    assert!(matches!(store.snapshot(0), Err(TwinError::NotSynced)));
    assert!(store.latest().is_none());
}

/// A new generation keeps what stays valid of its predecessor's memo: the instances an update
/// did not touch keep their baselines (and restored engines and checkpoints), the updated one
/// starts afresh, and answers equal those asked on a cold copy of the new generation.
#[test]
fn a_new_generation_inherits_the_memo_of_unchanged_instances() {
    use ditto::twin::Limits;
    use ditto::twin::predict::predict_routing;
    let store = synced(StoreLimits::DEFAULT);
    store.apply_state(running("a", 1_000, 3)).unwrap();
    store.apply_state(running("b", 1_000, 2)).unwrap();
    let mut question = ditto::bench::whatif_question(2);
    question.request.prompt_tokens = 24;
    question.request.output = ditto::twin::question::OutputLength::Point(8);
    question.request.max_tokens = 8;
    question.now_us = 2_500;
    let first = store.latest().unwrap().snapshot;
    predict_routing(&first, &question, &Limits::DEFAULT).unwrap();
    assert_eq!(
        first.memo.len(),
        2 * 2,
        "a baseline per instance and replication"
    );
    // "b" gains a request (nothing finishes, so the learned lengths stay as they were).
    store.apply_state(running("b", 2_000, 3)).unwrap();
    let second = store.latest().unwrap().snapshot;
    assert_eq!(second.memo.len(), 2, "a's baselines carry over, b's do not");
    let warm = predict_routing(&second, &question, &Limits::DEFAULT).unwrap();
    let cold = predict_routing(&(*second).clone(), &question, &Limits::DEFAULT).unwrap();
    assert_eq!(warm, cold);
    assert_eq!(second.memo.len(), 2 * 2);
    // A config change carries nothing over.
    store
        .sync_config(cluster(5), TwinSettings::defaults(), Vec::new())
        .unwrap();
    assert!(store.latest().unwrap().snapshot.memo.is_empty());
}

#[test]
fn a_cleared_store_refuses_like_a_new_one_and_never_repeats_a_generation() {
    let store = synced(StoreLimits::DEFAULT);
    let before = store.apply_state(running("a", 1_000, 2)).unwrap();
    store.clear();
    assert!(store.latest().is_none());
    assert!(matches!(store.snapshot(0), Err(TwinError::NotSynced)));
    assert!(matches!(
        store.apply_state(running("a", 2_000, 1)),
        Err(TwinError::NotSynced)
    ));
    let outcome = store
        .sync_config(cluster(4), TwinSettings::defaults(), Vec::new())
        .unwrap();
    assert!(outcome.changed);
    assert!(outcome.generation > before, "generations must keep rising");
    // The old instance state is gone: "a" starts empty.
    let latest = store.latest().unwrap();
    assert!(
        latest
            .snapshot
            .instances
            .iter()
            .all(|i| i.running.is_empty())
    );
}

#[test]
fn staged_writes_are_published_together_in_one_generation() {
    let store = synced(StoreLimits::DEFAULT);
    let before = store.latest().unwrap().snapshot;
    let first = store
        .write_state(running("a", 1_000, 2), Publish::Staged)
        .unwrap();
    let second = store
        .write_state(running("a", 2_000, 3), Publish::Staged)
        .unwrap();
    assert_eq!(
        (first, second),
        (before.generation + 1, before.generation + 1)
    );
    // Readers see nothing yet; the edge building its next write sees the staged state.
    assert_eq!(
        store.latest().unwrap().snapshot.generation,
        before.generation
    );
    assert!(
        store.latest().unwrap().snapshot.instances[0]
            .running
            .is_empty()
    );
    let (_, index, current) = store.current_instance("a").unwrap();
    assert_eq!((index, current.running.len()), (0, 3));
    assert_eq!(store.publish_staged(), Some(first));
    let after = store.latest().unwrap().snapshot;
    assert_eq!(after.generation, first);
    assert_eq!(after.instances[0].running.len(), 3);
    assert_eq!(after.instances[0].observed_at_us, 2_000);
    // The instance nobody wrote is the same object (its memo entries carry over).
    assert!(Arc::ptr_eq(&after.instances[1], &before.instances[1]));
    assert_eq!(store.publish_staged(), None, "nothing staged");
    // Every kept generation is whole: the staged one never showed half its writes.
    assert!(store.snapshot(first).is_ok());
}

#[test]
fn a_write_published_now_or_a_resync_carries_what_was_staged() {
    let store = synced(StoreLimits::DEFAULT);
    store
        .write_state(running("a", 1_000, 2), Publish::Staged)
        .unwrap();
    let generation = store.apply_state(running("b", 1_000, 1)).unwrap();
    let latest = store.latest().unwrap().snapshot;
    assert_eq!(latest.generation, generation);
    assert_eq!(
        (
            latest.instances[0].running.len(),
            latest.instances[1].running.len()
        ),
        (2, 1)
    );
    store
        .write_state(running("a", 2_000, 4), Publish::Staged)
        .unwrap();
    let outcome = store
        .sync_config(cluster(8), TwinSettings::defaults(), Vec::new())
        .unwrap();
    let latest = store.latest().unwrap().snapshot;
    assert_eq!(latest.generation, outcome.generation);
    assert_eq!(
        latest.instances[0].running.len(),
        4,
        "kept through the resync"
    );
    assert!(
        store.snapshot(outcome.generation - 1).is_ok(),
        "staged write published first"
    );
    assert_eq!(store.publish_staged(), None);
}

#[test]
fn a_rejected_staged_write_leaves_the_staged_snapshot_as_it_was() {
    let store = synced(StoreLimits::DEFAULT);
    store
        .write_state(running("a", 1_000, 2), Publish::Staged)
        .unwrap();
    // More running requests than max_num_seqs 4.
    assert!(matches!(
        store.write_state(running("a", 2_000, 9), Publish::Staged),
        Err(TwinError::InvalidField { .. })
    ));
    assert!(matches!(
        store.current_instance("nope"),
        Err(TwinError::InvalidField { .. })
    ));
    store.publish_staged().unwrap();
    let latest = store.latest().unwrap().snapshot;
    assert_eq!(latest.instances[0].running.len(), 2);
    assert_eq!(latest.instances[0].observed_at_us, 1_000);
}
