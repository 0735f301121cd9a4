//! Generates the prost messages, the tonic service and the pbjson (OTLP/JSON)
//! impls from the vendored .proto files, with protox: no `protoc` needed.

use std::path::PathBuf;

const PROTOS: &[&str] = &[
    "opentelemetry/proto/collector/profiles/v1development/profiles_service.proto",
    "opentelemetry/proto/processcontext/v1development/process_context.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
    println!(
        "cargo:rerun-if-changed={}",
        root.join("opentelemetry").display()
    );
    let files = protox::compile(PROTOS, [&root])?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    let descriptor_path = out.join("otlp_descriptor.bin");
    std::fs::write(&descriptor_path, prost::Message::encode_to_vec(&files))?;

    let grpc = std::env::var_os("CARGO_FEATURE_GRPC").is_some();
    tonic_prost_build::configure()
        .build_client(grpc)
        .build_server(grpc)
        .compile_fds(files)?;

    let descriptors = std::fs::read(&descriptor_path)?;
    pbjson_build::Builder::new()
        .register_descriptors(&descriptors)?
        .ignore_unknown_fields()
        .use_integers_for_enums()
        .build(&[".opentelemetry"])?;
    Ok(())
}
