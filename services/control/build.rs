//! Compiles the control API (`proto/nisse/control/v1/control.proto`) with
//! protox, so building needs no system `protoc`, and generates its tonic
//! server and client. The bus contracts it refers to (`nisse.v1`) are the
//! `nisse-proto` crate's own types, not a second copy.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    println!("cargo:rerun-if-changed=../../proto/nisse");
    let fds = protox::compile(["nisse/control/v1/control.proto"], ["proto", "../../proto"])?;
    tonic_prost_build::configure()
        .extern_path(".nisse.v1", "::nisse_proto::v1")
        .compile_fds(fds)?;
    Ok(())
}
