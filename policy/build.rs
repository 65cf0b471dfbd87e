//! The built-in defaults (`defaults/*.toml`) are read at every start of
//! every service and of `nisse policy …`. TOML is what people read and
//! write, but parsing a third of a megabyte of it takes milliseconds; the
//! same tables as JSON load faster. So the build converts each file once
//! into `$OUT_DIR/<name>.json`; the TOML stays the source (an error in it
//! is reported from the TOML, with its line).

use std::error::Error;
use std::path::PathBuf;

fn main() -> Result<(), Box<dyn Error>> {
    let out = PathBuf::from(std::env::var_os("OUT_DIR").ok_or("cargo sets OUT_DIR")?);
    let dir = PathBuf::from(
        std::env::var_os("CARGO_MANIFEST_DIR").ok_or("cargo sets CARGO_MANIFEST_DIR")?,
    )
    .join("defaults");
    println!("cargo::rerun-if-changed=defaults");
    for entry in std::fs::read_dir(&dir)? {
        let path = entry?.path();
        if path.extension().and_then(|e| e.to_str()) != Some("toml") {
            continue;
        }
        println!("cargo::rerun-if-changed={}", path.display());
        let text = std::fs::read_to_string(&path)?;
        // A file that does not parse is left for the runtime to report,
        // from the TOML, with its line.
        let json = match toml::from_str::<toml::Table>(&text) {
            Ok(table) => serde_json::to_string(&table)?,
            Err(_) => String::new(),
        };
        let name = path
            .file_stem()
            .and_then(|s| s.to_str())
            .ok_or("a default's name is UTF-8")?;
        std::fs::write(out.join(format!("{name}.json")), json)?;
    }
    Ok(())
}
