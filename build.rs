//! Compiles `proto/ditto/v1/*.proto` and KEDA's external scaler protocol
//! (`proto/externalscaler/*.proto`) with protox (no system protoc) and writes the descriptor
//! set that gRPC reflection serves.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let mut files = protos("proto/ditto/v1")?;
    files.extend(protos("proto/externalscaler")?);
    for file in &files {
        println!("cargo:rerun-if-changed={}", file.display());
    }
    let mut compiler = protox::Compiler::new(["proto"])?;
    compiler.include_imports(true).include_source_info(true);
    compiler.open_files(&files)?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    // compile_fds ignores file_descriptor_set_path, so the descriptor set is written here.
    std::fs::write(
        out.join("ditto_descriptor.bin"),
        compiler.encode_file_descriptor_set(),
    )?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        // Undecodable bytes are INVALID_ARGUMENT, not prost's INTERNAL (src/server/codec.rs).
        .codec_path("crate::server::codec::TwinCodec")
        .compile_fds(compiler.file_descriptor_set())?;
    git_sha();
    Ok(())
}

/// The `.proto` files of `dir`, sorted.
fn protos(dir: &str) -> Result<Vec<PathBuf>, std::io::Error> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)?
        .map(|entry| entry.map(|e| e.path()))
        .collect::<Result<_, _>>()?;
    files.retain(|path| path.extension().is_some_and(|ext| ext == "proto"));
    files.sort();
    Ok(files)
}

/// `DITTO_GIT_SHA` for `ditto_build_info`: from the environment (an image build passes it),
/// else from git, else "unknown". Reruns when the checked-out commit moves.
fn git_sha() {
    println!("cargo:rerun-if-env-changed=DITTO_GIT_SHA");
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|out| out.status.success())
            .and_then(|out| String::from_utf8(out.stdout).ok())
            .map(|text| text.trim().to_owned())
            .filter(|text| !text.is_empty())
    };
    let sha = std::env::var("DITTO_GIT_SHA")
        .ok()
        .filter(|sha| !sha.is_empty())
        .or_else(|| git(&["rev-parse", "--short=12", "HEAD"]))
        .unwrap_or_else(|| "unknown".to_owned());
    // Only existing files: a missing one would rerun this script on every build.
    let mut watched = Vec::new();
    if let Some(dir) = git(&["rev-parse", "--git-dir"]) {
        watched.push(format!("{dir}/HEAD"));
    }
    if let (Some(common), Some(head)) = (
        git(&["rev-parse", "--git-common-dir"]),
        git(&["symbolic-ref", "-q", "HEAD"]),
    ) {
        watched.push(format!("{common}/{head}"));
    }
    for path in watched {
        if std::path::Path::new(&path).exists() {
            println!("cargo:rerun-if-changed={path}");
        }
    }
    let sha: String = sha
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .take(40)
        .collect();
    println!("cargo:rustc-env=DITTO_GIT_SHA={sha}");
}
