//! Compiles `proto/envd/*.proto` with protox (pure Rust: no system `protoc`) into prost types,
//! then generates proto3-JSON serde impls with pbjson so the JSON matches the E2B SDKs' codecs.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../proto/envd");
    let files = [root.join("process.proto"), root.join("filesystem.proto")];
    for f in &files {
        println!("cargo:rerun-if-changed={}", f.display());
    }
    let descriptors = protox::compile(&files, [&root])?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    let descriptor_path = out.join("envd_descriptor.bin");
    std::fs::write(
        &descriptor_path,
        prost::Message::encode_to_vec(&descriptors),
    )?;

    prost_build::Config::new()
        // Our own Timestamp: proto3 JSON wants `Z`-suffixed RFC 3339, which SDKs expect.
        .extern_path(".google.protobuf.Timestamp", "crate::Timestamp")
        .file_descriptor_set_path(&descriptor_path)
        .skip_protoc_run()
        .compile_fds(descriptors)?;

    let set = std::fs::read(&descriptor_path)?;
    pbjson_build::Builder::new()
        .register_descriptors(&set)?
        .ignore_unknown_fields()
        .build(&[".process", ".filesystem"])?;
    Ok(())
}
