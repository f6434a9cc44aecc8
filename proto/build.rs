//! Generates the swiftlet.v1 and the kubelet pod-resources (v1) client and server code from `proto/` (needs `protoc`, which
//! `cargo xtask build` installs).
fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    tonic_prost_build::configure().compile_protos(
        &[
            "proto/swiftlet/v1/events.proto",
            "proto/podresources/v1/api.proto",
        ],
        &["proto"],
    )?;
    Ok(())
}
