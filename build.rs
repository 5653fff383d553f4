//! Compiles `proto/ditto/v1/*.proto` with protox (no system protoc) and writes the
//! descriptor set that gRPC reflection serves.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let mut files: Vec<PathBuf> = std::fs::read_dir("proto/ditto/v1")?
        .map(|entry| entry.map(|e| e.path()))
        .collect::<Result<_, _>>()?;
    files.retain(|path| path.extension().is_some_and(|ext| ext == "proto"));
    files.sort();
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
    Ok(())
}
