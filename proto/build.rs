//! Compiles `nisse/v1/*.proto` with protox (a pure-Rust protobuf compiler), so
//! building Nisse needs no system `protoc`, then generates Rust types with prost.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = PathBuf::from("nisse/v1");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "proto"))
        .collect();
    files.sort();
    println!("cargo:rerun-if-changed=nisse");

    let fds = protox::compile(&files, ["."])?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out.join("nisse_descriptor.binpb"),
        prost::Message::encode_to_vec(&fds),
    )?;

    prost_build::Config::new()
        // A note's frontmatter is encoded in key order, so the brain emits
        // the same bytes for the same note every time (its outbox, and a
        // rebuild's, compare equal); a hash map's order changes per run.
        .btree_map([
            ".nisse.v1.VaultWrite.frontmatter",
            ".nisse.v1.VaultWrite.lists",
        ])
        .enable_type_names()
        .type_name_domain(["."], "type.nisse.dev")
        .compile_fds(fds)?;
    Ok(())
}
