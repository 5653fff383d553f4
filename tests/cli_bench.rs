//! `ditto bench` runs every case end to end (a smoke run with tiny sizes; the figures are
//! not checked: speed is measured, never asserted).
#![allow(clippy::unwrap_used)]

use std::process::Command;

#[test]
fn bench_runs_every_case() {
    let out = Command::new(env!("CARGO_BIN_EXE_ditto"))
        .args([
            "bench",
            "--quick",
            "--offline-requests",
            "300,600",
            "--calls",
            "2",
            "--load-seconds",
            "1",
            "--load-clients",
            "4",
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}{}",
        text,
        String::from_utf8_lossy(&out.stderr)
    );
    for needle in [
        "offline: BLIS reference run",
        "       300",
        "       600",
        "per-request cost",
        "in-process, 1 replication (known), repeated",
        "in-process, 1 replication (known), after a push",
        "in-process, 1 replication (known), first question",
        "in-process, 16 replications (sampled), repeated",
        "in-process, 16 replications, after a push",
        "in-process, 16 replications, first question",
        "gRPC loopback, 1 replication (known), repeated",
        "engine state:",
        "(256 requests, 30000 blocks",
        "== load: 4 clients on loopback for 1 s",
        "errors 0,",
        "blocks mirrored per pod per s",
        "bytes per cached block",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
    }
    // The KV case mirrored something and measured some memory (the counts, not speed).
    let figure = |after: &str| -> f64 {
        let line = text.lines().find(|line| line.contains(after)).unwrap();
        let before = &line[..line.find(after).unwrap()];
        before.split_whitespace().last().unwrap().parse().unwrap()
    };
    assert!(figure(" blocks mirrored per pod per s") > 0.0, "{text}");
    assert!(figure(" bytes per cached block") > 0.0, "{text}");
    let bad = Command::new(env!("CARGO_BIN_EXE_ditto"))
        .args(["bench", "--offline-requests", "0"])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
}
