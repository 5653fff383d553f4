#![allow(clippy::unwrap_used)]
//! The store entry points the live scrape writes through (issue 39 item 4): a newer push
//! winning the race against a scrape is its own error kind (`TwinError::Superseded`), told
//! apart from a real validation failure (`TwinError::InvalidField`), and the capped note a
//! scrape stages is published with the tick, not at once.

use ditto::server::convert::config::cluster_from_proto;
use ditto::server::proto;
use ditto::sim::SloClass;
use ditto::twin::TwinError;
use ditto::twin::snapshot::{Gauges, ObservedRequest, TwinSettings};
use ditto::twin::store::{InstanceUpdate, MirrorStore, Publish, RequestLists, StoreLimits};

fn synced() -> MirrorStore {
    let instance = |id: &str| proto::InstanceSpec {
        id: id.to_owned(),
        engine: Some(proto::EngineLimits {
            num_gpu_blocks: Some(64),
            max_num_seqs: Some(8),
            max_model_len: Some(4096),
            ..proto::EngineLimits::default()
        }),
        ..proto::InstanceSpec::default()
    };
    let message = proto::ClusterConfig {
        instances: vec![instance("a")],
        ..proto::ClusterConfig::default()
    };
    let cluster = cluster_from_proto(&message).unwrap().cluster;
    let store = MirrorStore::new(StoreLimits::DEFAULT);
    store
        .sync_config(cluster, TwinSettings::defaults(), vec!["a:1".to_owned()])
        .unwrap();
    store
}

fn request(id: &str, arrival_us: u64, prompt_tokens: u32) -> ObservedRequest {
    ObservedRequest {
        request_id: id.to_owned(),
        arrival_us,
        prompt_tokens,
        computed_tokens: 0,
        cached_tokens: 0,
        output_tokens: 0,
        max_tokens: 64,
        known_output_tokens: None,
        priority: 1,
        slo_class: SloClass::Standard,
        scheduled_tokens: 0,
        block_hashes: Vec::new(),
        token_ids: None,
    }
}

fn lists(at: u64, prompt_tokens: u32) -> InstanceUpdate {
    InstanceUpdate {
        instance_id: "a".to_owned(),
        observed_at_us: at,
        requests: Some(RequestLists {
            waiting: vec![request("r0", at, prompt_tokens)],
            running: Vec::new(),
            step_end_us: None,
        }),
        gauges: Some(Gauges {
            running: 0,
            waiting: 1,
            kv_usage: 0.0,
            transfers: None,
        }),
        events: Vec::new(),
        counts_arrivals: true,
    }
}

#[test]
fn a_newer_push_winning_the_race_is_superseded_not_invalid() {
    let store = synced();
    // The push (newer) lands between the scrape's read and its write.
    store.apply_state(lists(2_000, 32)).unwrap();
    let err = store
        .write_state(lists(1_000, 32), Publish::Staged)
        .unwrap_err();
    assert!(matches!(err, TwinError::Superseded { .. }), "{err:?}");
    // Said as before (the push RPCs answer with the same text and code).
    assert_eq!(
        err.to_string(),
        "observed_at_us: 1000 is older than the instance's last observation 2000"
    );
}

#[test]
fn a_real_validation_failure_stays_invalid_field() {
    let store = synced();
    // A prompt longer than max_model_len: the state itself is wrong, no race.
    let err = store
        .write_state(lists(1_000, 1_000_000), Publish::Staged)
        .unwrap_err();
    assert!(matches!(err, TwinError::InvalidField { .. }), "{err:?}");
    let err = store
        .write_state(
            InstanceUpdate {
                observed_at_us: 0,
                ..lists(1_000, 32)
            },
            Publish::Staged,
        )
        .unwrap_err();
    assert!(matches!(err, TwinError::InvalidField { .. }), "{err:?}");
}

#[test]
fn a_staged_capped_note_is_published_with_the_tick() {
    let store = synced();
    let before = store.latest().unwrap().snapshot.generation;
    store
        .set_capped_note(
            "a",
            Some("gauges.running 9 capped to max_num_seqs 8".into()),
            Publish::Staged,
        )
        .unwrap();
    let latest = store.latest().unwrap();
    assert_eq!(
        latest.snapshot.generation, before,
        "published before the tick"
    );
    assert_eq!(latest.snapshot.instances[0].capped, None);
    let published = store.publish_staged().unwrap();
    let latest = store.latest().unwrap();
    assert_eq!(latest.snapshot.generation, published);
    assert!(published > before);
    assert_eq!(
        latest.snapshot.instances[0].capped.as_deref(),
        Some("gauges.running 9 capped to max_num_seqs 8")
    );
    // Published at once when asked (the push path's behaviour is kept).
    store.set_capped_note("a", None, Publish::Now).unwrap();
    assert_eq!(store.latest().unwrap().snapshot.instances[0].capped, None);
}
