//! The live mirror's KV-event case (`ditto bench`, case `kv`): how many KV events per pod the live mirror sustains, at
//! what CPU, and the mirror's memory per cached block.
//!
//! - **Sustained**: `pods` publishers (the `zeromq` crate's PUB, one loopback address each,
//!   as vLLM's ZmqEventPublisher) each first fill a full cache (`cached` blocks: a busy pod
//!   keeps its cache full, 26,312 blocks for llama-3.1-8b on an H100), then store
//!   `blocks_per_s` blocks per second with their token ids in 10 batches per second, each
//!   batch removing as many of the oldest, mirrored by the live mirror over ZMQ. Reported:
//!   blocks mirrored per pod per second (counted from the batches the store applied), the
//!   process CPU (publishers included: an upper bound), and the mirror's own CPU (decode and
//!   store apply of the same batches on full caches, timed alone).
//! - **Memory per cached block**: the resident memory one instance's mirror takes per
//!   cached block (the cached blocks' maps and the store's kept history), measured in a fresh
//!   process (`ditto bench --kv-memory-probe N`) so that memory freed by the other cases
//!   cannot hide it.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rmpv::Value;
use zeromq::{PubSocket, Socket, SocketSend, ZmqMessage};

use super::BenchError;
use super::process::{process_cpu_s, rss_mb};
use super::runtime::on_runtime;
use crate::cluster::spec::default_cluster;
use crate::live::config::{Discovery, KvEndpoints, LiveConfig, LiveSource};
use crate::live::kv_wire::decode_batch;
use crate::telemetry::Metrics;
use crate::telemetry::clock::wall_now_us;
use crate::twin::snapshot::TwinSettings;
use crate::twin::store::{KvEventBatch, MirrorStore, Publish, StoreLimits};

/// The KV case: 100 publishers at 200 blocks/s each for `seconds`, on full caches (smaller
/// with `quick`).
pub(super) fn kv_case(out: &mut String, seconds: u64, quick: bool) -> Result<(), BenchError> {
    let _ = writeln!(
        out,
        "\n== live mirror KV events: 100 fake vLLM publishers on loopback (ZMQ), 200 blocks/s each with token ids, {seconds} s"
    );
    // A busy pod's cache is full: llama-3.1-8b on an H100 holds 26,312 blocks.
    let (cached, memory_blocks) = if quick {
        (2_000, 20_000)
    } else {
        (26_312, 200_000)
    };
    let kv = on_runtime(async {
        kv_bench(
            100,
            200,
            cached,
            memory_blocks,
            Duration::from_secs(seconds),
        )
        .await
        .map_err(BenchError::Failed)
    })?;
    let _ = writeln!(out, "{}", kv.rows());
    Ok(())
}

/// Batches per second each fake pod publishes.
const BATCHES_PER_S: u64 = 10;
/// Tokens per block.
const BLOCK_SIZE: u64 = 16;

/// What the KV-event bench measured.
#[derive(Clone, Debug, PartialEq)]
struct KvBench {
    /// Fake pods.
    pods: usize,
    /// Blocks each stored per second (target).
    blocks_per_s: u64,
    /// Blocks each pod keeps cached.
    cached: u64,
    /// Measured wall time.
    wall: Duration,
    /// Blocks mirrored per second per pod (stored blocks of applied batches).
    mirrored_per_pod_s: f64,
    /// Process CPU, cores (publishers included).
    process_cores: f64,
    /// The mirror's decode + apply CPU for the same load, cores.
    mirror_cores: f64,
    /// Resident memory per cached block, bytes.
    bytes_per_block: f64,
    /// Cached blocks the memory was measured with.
    measured_blocks: u64,
}

impl KvBench {
    /// The bench's report lines.
    fn rows(&self) -> String {
        format!(
            "{} pods x {} blocks/s on full caches of {} blocks, for {:.1} s: {:.0} blocks mirrored per pod per s; CPU {:.2} cores (publishers included), mirror decode+apply {:.3} cores\nmirror memory: {:.0} bytes per cached block ({} blocks on one instance, history included)",
            self.pods,
            self.blocks_per_s,
            self.cached,
            self.wall.as_secs_f64(),
            self.mirrored_per_pod_s,
            self.process_cores,
            self.mirror_cores,
            self.bytes_per_block,
            self.measured_blocks,
        )
    }
}

/// One pod's stream of batches: block `n` has hash `base + n` and chains to `n - 1`; past
/// `cached` blocks, each batch removes as many of the oldest as it stores.
struct Stream {
    base: u64,
    next_block: u64,
    seq: u64,
    cached: u64,
}

impl Stream {
    fn new(pod: usize, cached: u64) -> Self {
        Self {
            base: (pod as u64 + 1) << 40,
            next_block: 0,
            seq: 0,
            cached,
        }
    }

    fn batch(&mut self, blocks: u64) -> (u64, Vec<u8>) {
        let first = self.next_block;
        self.next_block += blocks;
        let hashes: Vec<Value> = (first..self.next_block)
            .map(|n| Value::from(self.base + n))
            .collect();
        let tokens: Vec<Value> = (0..blocks * BLOCK_SIZE)
            .map(|t| Value::from((first * BLOCK_SIZE + t) % 128_000))
            .collect();
        let parent = if first == 0 {
            Value::Nil
        } else {
            Value::from(self.base + first - 1)
        };
        let mut events = vec![Value::Array(vec![
            Value::from("BlockStored"),
            Value::Array(hashes),
            parent,
            Value::Array(tokens),
            Value::from(BLOCK_SIZE),
            Value::Nil,
            Value::from("GPU"),
        ])];
        if self.next_block > self.cached {
            let gone = (first.saturating_sub(self.cached)..self.next_block - self.cached)
                .map(|n| Value::from(self.base + n))
                .collect();
            events.push(Value::Array(vec![
                Value::from("BlockRemoved"),
                Value::Array(gone),
                Value::from("GPU"),
            ]));
        }
        let batch = Value::Array(vec![Value::F64(1.0), Value::Array(events), Value::from(0)]);
        let mut payload = Vec::new();
        let _ = rmpv::encode::write_value(&mut payload, &batch);
        let seq = self.seq;
        self.seq += 1;
        (seq, payload)
    }
}

/// Runs the sustained-load and memory measurements: `pods` publishers, each with `cached`
/// blocks cached, storing `blocks_per_s`; memory with `memory_blocks` on one instance.
async fn kv_bench(
    pods: usize,
    blocks_per_s: u64,
    cached: u64,
    memory_blocks: u64,
    duration: Duration,
) -> Result<KvBench, String> {
    let per_batch = blocks_per_s.div_ceil(BATCHES_PER_S).max(1);
    let port = {
        let listener = std::net::TcpListener::bind("127.0.1.1:0").map_err(|e| e.to_string())?;
        listener.local_addr().map_err(|e| e.to_string())?.port()
    };
    let mut publishers = Vec::with_capacity(pods);
    let mut ids = Vec::with_capacity(pods);
    for index in 0..pods {
        let host = format!("127.0.1.{}", index + 1);
        let mut socket = PubSocket::new();
        socket
            .bind(&format!("tcp://{host}:{port}"))
            .await
            .map_err(|err| format!("bind {host}:{port}: {err}"))?;
        publishers.push(socket);
        ids.push(format!("{host}:9"));
    }
    let cluster = default_cluster();
    let mut template = cluster.instances[0].clone();
    template.engine.num_gpu_blocks = u32::try_from(cached + blocks_per_s).unwrap_or(u32::MAX);
    let source = LiveSource {
        name: "bench".to_owned(),
        discovery: Discovery::Static(ids),
        template,
        kv: Some(KvEndpoints {
            events: format!("tcp://{{ip}}:{port}"),
            replay: None,
            topic: String::new(),
            dp_size: 1,
        }),
        scrape_interval: Some(Duration::from_secs(3_600)),
        infer: None,
    };
    let mut config = LiveConfig::new(vec![source], cluster, TwinSettings::defaults());
    config.scrape_interval = Duration::from_secs(3_600);
    let metrics = Metrics::new().map_err(|err| err.to_string())?;
    let store = Arc::new(MirrorStore::new(StoreLimits::DEFAULT));
    let live =
        crate::live::start(config, Arc::clone(&store), &metrics).map_err(|err| err.to_string())?;
    // Let the subscriptions join (ZMQ's slow joiner) before the measured run.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut streams: Vec<Stream> = (0..pods).map(|pod| Stream::new(pod, cached)).collect();
    // Fill every pod's cache (one batch each), then wait until the mirror holds them all.
    for (socket, stream) in publishers.iter_mut().zip(&mut streams) {
        let (seq, payload) = stream.batch(cached);
        send(socket, seq, payload).await?;
    }
    let filled = Instant::now();
    while applied_batches(&store) < pods as u64 {
        if filled.elapsed() > Duration::from_secs(120) {
            return Err("the mirror did not take the initial caches within 120 s".to_owned());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let batches_before = applied_batches(&store);
    let cpu_start = process_cpu_s();
    let started = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_millis(1_000 / BATCHES_PER_S));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while started.elapsed() < duration {
        tick.tick().await;
        for (socket, stream) in publishers.iter_mut().zip(&mut streams) {
            let (seq, payload) = stream.batch(per_batch);
            send(socket, seq, payload).await?;
        }
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let wall = started.elapsed();
    let cpu = process_cpu_s() - cpu_start;
    let mirrored = (applied_batches(&store) - batches_before) * per_batch;
    drop(live);
    drop(publishers);

    let mirror_cores = decode_apply_cores(pods, per_batch, cached)?;
    let bytes_per_block = memory_in_a_fresh_process(memory_blocks)?;
    Ok(KvBench {
        pods,
        blocks_per_s,
        cached,
        wall,
        mirrored_per_pod_s: mirrored as f64 / pods as f64 / wall.as_secs_f64(),
        process_cores: cpu / wall.as_secs_f64(),
        mirror_cores,
        bytes_per_block,
        measured_blocks: memory_blocks,
    })
}

async fn send(socket: &mut PubSocket, seq: u64, payload: Vec<u8>) -> Result<(), String> {
    let message = ZmqMessage::try_from(vec![
        bytes::Bytes::from_static(b"kv@bench"),
        bytes::Bytes::from(seq.to_be_bytes().to_vec()),
        bytes::Bytes::from(payload),
    ])
    .map_err(|err| err.to_string())?;
    socket.send(message).await.map_err(|err| err.to_string())
}

/// KV batches the store has applied over every mirrored instance (the edge numbers them
/// from 0 and counts missed ones as gaps).
fn applied_batches(store: &MirrorStore) -> u64 {
    store.latest().map_or(0, |stored| {
        stored
            .snapshot
            .instances
            .iter()
            .filter(|state| state.kv_events_at_us > 0)
            .map(|state| (state.kv_event_seq + 1).saturating_sub(state.kv_event_gaps))
            .sum::<u64>()
    })
}

/// The mirror's CPU (decode and store apply, no sockets) for one second of the load on full
/// caches, in cores: every pod's 10 batches decoded and applied, timed over several seconds'
/// worth.
fn decode_apply_cores(pods: usize, per_batch: u64, cached: u64) -> Result<f64, String> {
    let store = instances_store(pods, cached + per_batch)?;
    let mut streams: Vec<Stream> = (0..pods).map(|pod| Stream::new(pod, cached)).collect();
    let mut ts_us = wall_now_us();
    for (pod, stream) in streams.iter_mut().enumerate() {
        let (seq, payload) = stream.batch(cached);
        ts_us += 1;
        apply(&store, pod, seq, ts_us, &payload)?;
    }
    store.publish_staged();
    let seconds = 5;
    let payloads: Vec<Vec<(usize, u64, Vec<u8>)>> = (0..seconds * BATCHES_PER_S)
        .map(|_| {
            streams
                .iter_mut()
                .enumerate()
                .map(|(pod, stream)| {
                    let (seq, payload) = stream.batch(per_batch);
                    (pod, seq, payload)
                })
                .collect()
        })
        .collect();
    let cpu_start = process_cpu_s();
    let started = Instant::now();
    for (ts_us, round) in (ts_us + 1..).zip(&payloads) {
        for (pod, seq, payload) in round {
            apply(&store, *pod, *seq, ts_us, payload)?;
        }
        // One publish per round, as the live mirror's publish tick does.
        store.publish_staged();
    }
    let cpu = (process_cpu_s() - cpu_start).max(started.elapsed().as_secs_f64().min(0.01));
    Ok(cpu / seconds as f64)
}

/// Decodes one pod's batch and applies it to instance `bench-{pod}`.
fn apply(
    store: &MirrorStore,
    pod: usize,
    seq: u64,
    ts_us: u64,
    payload: &[u8],
) -> Result<(), String> {
    let batch = decode_batch(seq, payload).map_err(|err| err.to_string())?;
    store
        .apply_kv_events_capped(
            KvEventBatch {
                instance_id: format!("bench-{pod}"),
                seq,
                ts_us,
                events: batch.events,
            },
            Publish::Staged,
        )
        .map(|_| ())
        .map_err(|err| err.to_string())
}

/// A store of `instances` instances `bench-{i}` of `blocks` GPU blocks each.
fn instances_store(instances: usize, blocks: u64) -> Result<MirrorStore, String> {
    let mut cluster = default_cluster();
    let mut template = cluster.instances[0].clone();
    template.engine.num_gpu_blocks = u32::try_from(blocks).unwrap_or(u32::MAX);
    cluster.instances = (0..instances)
        .map(|index| {
            let mut instance = template.clone();
            instance.id = format!("bench-{index}");
            instance
        })
        .collect();
    let store = MirrorStore::new(StoreLimits::DEFAULT);
    store
        .sync_config(cluster, TwinSettings::defaults(), Vec::new())
        .map_err(|err| err.to_string())?;
    Ok(store)
}

/// Resident bytes per cached block, measured by `ditto bench --kv-memory-probe BLOCKS` in
/// a fresh process (see [`memory_probe`]).
fn memory_in_a_fresh_process(blocks: u64) -> Result<f64, String> {
    let exe = std::env::current_exe().map_err(|err| format!("the ditto binary: {err}"))?;
    let output = std::process::Command::new(exe)
        .args(["bench", "--kv-memory-probe", &blocks.to_string()])
        .output()
        .map_err(|err| format!("the memory probe did not start: {err}"))?;
    let text = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        return Err(format!(
            "the memory probe failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    text.trim()
        .parse::<f64>()
        .map_err(|err| format!("the memory probe printed {text:?}: {err}"))
}

/// Resident bytes per cached block of one instance filled with `blocks` blocks stored with
/// their token ids, in batches of 200 as a pod publishes them, then kept full while as many
/// batches again replace its oldest blocks (so the store's history holds what it keeps in
/// steady state). Meant for a fresh process (`ditto bench --kv-memory-probe N`): the
/// resident memory's growth is the mirror's.
pub fn memory_probe(blocks: u64) -> Result<f64, BenchError> {
    probe(blocks).map_err(BenchError::Failed)
}

/// [`memory_probe`], failing with a message.
fn probe(blocks: u64) -> Result<f64, String> {
    let per_batch = 200;
    let store = instances_store(1, blocks + per_batch)?;
    let mut stream = Stream::new(0, blocks);
    let before = rss_mb();
    let mut ts_us = wall_now_us();
    for _ in 0..(blocks.div_ceil(per_batch) * 2) {
        let (seq, payload) = stream.batch(per_batch);
        ts_us += 1;
        apply(&store, 0, seq, ts_us, &payload)?;
        // Published batch by batch, as the live tick (100 a second) publishes one pod's
        // 10 batches a second: the kept history holds as many generations as then.
        store.publish_staged();
    }
    let after = rss_mb();
    let cached = store
        .latest()
        .map_or(0, |stored| stored.snapshot.instances[0].cached_blocks.len());
    if cached as u64 != blocks {
        return Err(format!("the probe cached {cached} blocks, not {blocks}"));
    }
    Ok((after - before).max(0.0) * 1024.0 * 1024.0 / blocks as f64)
}
