//! `<data-dir>/endpoints.json`: where a running `nisse up` can be reached.
//! Written once everything is ready, removed at shutdown; every other command
//! given the same data directory finds the NATS server through it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use serde::{Deserialize, Serialize};

/// The file's content.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Endpoints {
    /// The NATS client URL.
    pub nats_url: String,
    /// Whether `nisse up` started that server itself.
    pub nats_embedded: bool,
    /// The `nisse up` process.
    pub pid: u32,
    /// The agents it runs.
    pub agents: Vec<String>,
    /// The services running in it.
    pub services: Vec<String>,
    /// Every listening address by name, e.g. `alertmanager-webhook`.
    pub listeners: BTreeMap<String, String>,
    /// When it became ready (RFC 3339).
    pub started_at: String,
}

impl Endpoints {
    /// The file's path in a data directory.
    pub fn path(data_dir: &Path) -> PathBuf {
        data_dir.join("endpoints.json")
    }

    /// Writes the file atomically (temporary file, then rename), so a reader
    /// never sees half of it.
    pub fn write(&self, data_dir: &Path) -> anyhow::Result<()> {
        let path = Self::path(data_dir);
        let tmp = data_dir.join(".endpoints.json.tmp");
        std::fs::write(&tmp, serde_json::to_vec_pretty(self)?)
            .with_context(|| format!("writing {}", tmp.display()))?;
        std::fs::rename(&tmp, &path).with_context(|| format!("writing {}", path.display()))?;
        Ok(())
    }

    /// Reads the file; `None` when nothing runs in that data directory.
    pub fn read(data_dir: &Path) -> anyhow::Result<Option<Self>> {
        let path = Self::path(data_dir);
        match std::fs::read(&path) {
            Ok(bytes) => Ok(Some(
                serde_json::from_slice(&bytes)
                    .with_context(|| format!("reading {}", path.display()))?,
            )),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
        }
    }

    /// Removes the file at shutdown.
    pub fn remove(data_dir: &Path) {
        let _ = std::fs::remove_file(Self::path(data_dir));
    }
}
