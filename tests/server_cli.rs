#![allow(clippy::unwrap_used)]
//! `ditto serve` and `ditto predict` as processes: bad flags and cluster files exit 2 before
//! binding, addresses come from flags or `DITTO_*` variables, SIGTERM drains and exits 0, and
//! `ditto predict` talks to the running server.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_ditto");
/// Upper bound for the server to report ready or to exit (a failure, never a hang).
const BOUND: Duration = Duration::from_secs(60);

fn serve(args: &[&str], env: &[(&str, &str)]) -> Command {
    let mut command = Command::new(BIN);
    command.arg("serve").args(args);
    for (key, value) in env {
        command.env(key, value);
    }
    command.env_remove("DITTO_CONFIG");
    command
}

/// Exit code and stderr of a command expected to stop on its own.
fn finished(mut command: Command) -> (i32, String) {
    let output = command.output().unwrap();
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// A started server and the gRPC address it reported.
struct Served {
    child: Child,
    grpc: String,
}

fn start(mut command: Command) -> Served {
    let mut child = command.stderr(Stdio::piped()).spawn().unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        // Drain to the end so the server never writes into a closed pipe.
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            let _ = tx.send(line);
        }
    });
    let grpc = loop {
        match rx.recv_timeout(BOUND) {
            Ok(line) => {
                if let Some(rest) = line.strip_prefix("ditto serve: gRPC on ") {
                    break rest.split(',').next().map(str::to_owned);
                }
            }
            Err(_) => break None,
        }
    };
    match grpc {
        Some(grpc) => Served { child, grpc },
        None => {
            let _ = child.kill();
            let _ = child.wait();
            panic!("ditto serve did not report ready within {BOUND:?}");
        }
    }
}

impl Served {
    /// SIGTERM, then the exit code (waits at most the bound).
    fn terminate(mut self) -> i32 {
        let kill = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(kill.success());
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let status = self.child.wait().unwrap();
            let _ = tx.send(status.code().unwrap_or(-1));
        });
        rx.recv_timeout(BOUND)
            .expect("ditto serve exits within the bound after SIGTERM")
    }
}

#[test]
fn bad_flags_and_cluster_files_exit_2_before_binding() {
    let (code, stderr) = finished(serve(&["--config", "/nonexistent/cluster.yaml"], &[]));
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("--config /nonexistent/cluster.yaml"),
        "{stderr}"
    );

    let dir = std::env::temp_dir().join(format!("ditto-server-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("bad.yaml");
    std::fs::write(&bad, "pools:\n  - name: p\n    tp: 0\n").unwrap();
    let (code, stderr) = finished(serve(&["--config", bad.to_str().unwrap()], &[]));
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("pools[0].tp"), "{stderr}");
    std::fs::remove_dir_all(&dir).unwrap();

    let (code, stderr) = finished(serve(&["--max-candidates", "0"], &[]));
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("--max-candidates"), "{stderr}");
}

#[test]
fn sigterm_drains_and_exits_zero_and_predict_talks_to_the_server() {
    let served = start(serve(
        &["--http-addr", "127.0.0.1:0"],
        &[("DITTO_GRPC_ADDR", "127.0.0.1:0"), ("DITTO_LOG", "warn")],
    ));
    assert!(served.grpc.starts_with("127.0.0.1:"), "{}", served.grpc);
    let predict = Command::new(BIN)
        .args(["predict", "--addr", &served.grpc, "--timeout-ms", "60000"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&predict.stdout);
    let stderr = String::from_utf8_lossy(&predict.stderr);
    match predict.status.code() {
        Some(0) => {
            for id in ["vllm-0", "vllm-1", "vllm-2", "vllm-3"] {
                assert!(stdout.contains(id), "{stdout}");
            }
            assert!(stdout.contains("recommended: "), "{stdout}");
        }
        code => assert_eq!(code, Some(1), "{stderr}"),
    }
    assert_eq!(served.terminate(), 0);
}

#[test]
fn predict_reports_an_unreachable_server_and_bad_flags() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let closed = listener.local_addr().unwrap().to_string();
    drop(listener);
    let output = Command::new(BIN)
        .args(["predict", "--addr", &closed, "--timeout-ms", "2000"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&output.stderr).contains("cannot connect"));
    let output = Command::new(BIN)
        .args(["predict", "--stale-policy", "sometimes"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("--stale-policy"));
}
