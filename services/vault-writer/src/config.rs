//! The `[vault]` section of `nisse.toml`, shared by the writer and the
//! reader: where the vault is, whether writes are committed to git, and
//! which shared folders each agent may read.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The vault's settings (`[vault]`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
pub struct Config {
    /// The vault's folder; `<data-dir>/vault` when not set.
    pub dir: Option<PathBuf>,
    /// Commit every write (one commit, with the agent and the work item in
    /// its message) when the vault is a git repository. History is
    /// optional: a vault that is not a repository is written the same.
    pub git: bool,
    /// The shared top-level folders each agent may read, beside its own
    /// `memory/<agent>/` (seed L10: no agent reads another's memory, and
    /// the dev agent gets no infrastructure material unless granted it).
    /// An agent not listed reads only its own memory.
    pub read: BTreeMap<String, Vec<String>>,
    /// How often the reader looks for notes changed on disk (the
    /// operator's edits, the writer's notes) and for a changed world.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String")]
    pub refresh: Duration,
    /// Queries answered at once, per agent.
    pub max_in_flight: usize,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            dir: None,
            git: true,
            read: BTreeMap::from([(
                "ops".to_string(),
                vec!["world".to_string(), "procedures".to_string()],
            )]),
            refresh: Duration::from_secs(10),
            max_in_flight: 4,
        }
    }
}

impl Config {
    /// The vault's folder for a process whose data directory is
    /// `data_dir`.
    pub fn root(&self, data_dir: &Path) -> PathBuf {
        self.dir.clone().unwrap_or_else(|| data_dir.join("vault"))
    }

    /// The shared folders `agent` may read.
    pub fn grants(&self, agent: &str) -> Vec<String> {
        self.read.get(agent).cloned().unwrap_or_default()
    }

    /// What is wrong with the settings, as (key under `prefix`, problem).
    pub fn validate(&self, prefix: &str) -> Vec<(String, String)> {
        let mut out = Vec::new();
        if self.max_in_flight == 0 {
            out.push((
                format!("{prefix}.max-in-flight"),
                "must be at least 1".into(),
            ));
        }
        if self.refresh.is_zero() {
            out.push((format!("{prefix}.refresh"), "must be more than zero".into()));
        }
        for (agent, folders) in &self.read {
            for folder in folders {
                if let Err(why) = nisse_vault::check_grant(folder) {
                    out.push((format!("{prefix}.read.{agent}"), why));
                }
            }
        }
        out
    }
}
