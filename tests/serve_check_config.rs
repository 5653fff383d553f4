#![allow(clippy::unwrap_used)]
//! `ditto serve --check-config FILE` as a process: exit 0 for a config serve would accept,
//! 2 naming the field or flag for one it would refuse, and nothing binds either way.

use std::path::PathBuf;
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_ditto");

fn check(file: &str, extra: &[&str]) -> (i32, String, String) {
    let output = Command::new(BIN)
        .arg("serve")
        .args(extra)
        .args(["--check-config", file])
        .env_remove("DITTO_CONFIG")
        .output()
        .unwrap();
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// A scratch directory unique to this test process and test name.
fn scratch(name: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("ditto-check-config-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn the_default_cluster_file_passes_without_binding() {
    // The gRPC port is held by this test: a check that bound would fail.
    let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = held.local_addr().unwrap().to_string();
    let file = concat!(env!("CARGO_MANIFEST_DIR"), "/data/clusters/default.yaml");
    let (code, stdout, stderr) = check(file, &["--grpc-addr", &addr, "--http-addr", &addr]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("ok (4 instances)"), "{stdout}");
}

#[test]
fn a_bad_field_exits_2_naming_the_field() {
    let dir = scratch("field");
    let bad = dir.join("bad.yaml");
    std::fs::write(&bad, "pools:\n  - name: p\n    tp: 0\n").unwrap();
    let (code, _, stderr) = check(bad.to_str().unwrap(), &[]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("pools[0].tp"), "{stderr}");

    std::fs::write(&bad, "pools:\n  - name: p\n    replicaz: 2\n").unwrap();
    let (code, _, stderr) = check(bad.to_str().unwrap(), &[]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("replicaz"), "{stderr}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_missing_file_or_a_bad_flag_exits_2_naming_it() {
    let (code, _, stderr) = check("/nonexistent/cluster.yaml", &[]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("/nonexistent/cluster.yaml"), "{stderr}");

    let file = concat!(env!("CARGO_MANIFEST_DIR"), "/data/clusters/default.yaml");
    let (code, _, stderr) = check(file, &["--max-candidates", "0"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("--max-candidates"), "{stderr}");
}

#[test]
fn check_config_replaces_config() {
    // --config names a broken path; --check-config's file is the one checked.
    let file = concat!(env!("CARGO_MANIFEST_DIR"), "/data/clusters/default.yaml");
    let (code, _, stderr) = check(file, &["--config", "/nonexistent/cluster.yaml"]);
    assert_eq!(code, 0, "{stderr}");
}

#[test]
fn bad_forecast_loop_flags_exit_2_naming_the_flag() {
    let file = concat!(env!("CARGO_MANIFEST_DIR"), "/data/clusters/default.yaml");
    for (flags, named) in [
        (&["--forecast-interval=-1"][..], "--forecast-interval"),
        (
            &[
                "--forecast-interval",
                "30",
                "--forecast-target-attainment",
                "1.5",
            ][..],
            "--forecast-target-attainment",
        ),
        (
            &["--forecast-interval", "30", "--forecast-replications", "0"][..],
            "--forecast-replications",
        ),
    ] {
        let (code, _, stderr) = check(file, flags);
        assert_eq!(code, 2, "{flags:?}: {stderr}");
        assert!(stderr.contains(named), "{flags:?}: {stderr}");
    }
    let (code, _, stderr) = check(file, &["--forecast-interval", "30"]);
    assert_eq!(code, 0, "{stderr}");
}
