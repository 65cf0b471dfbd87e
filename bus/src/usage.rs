//! What the model gateway has spent per work item and role, for the
//! budgets of seed L9 (a confused model cannot spend without end).
//!
//! The counts live in NATS rather than in the gateway's memory so that a
//! restarted gateway, or a second instance of it, sees what was already
//! spent; every change is a compare-and-set on the entry's revision, so
//! concurrent calls of one item never lose each other's counts.

use std::time::Duration;

use async_nats::jetstream::kv;
use serde::{Deserialize, Serialize};

use crate::{AgentName, Bus, Result};

/// The key-value bucket of model usage, keyed by agent, work item and role.
pub const MODEL_USAGE_BUCKET: &str = "nisse_model_usage";

/// How long a work item's usage is kept after its last model call. Longer
/// than any item stays open in practice; should one outlive it, its budget
/// starts again, which is the lesser harm than keeping counts forever.
pub const MODEL_USAGE_MAX_AGE: Duration = Duration::from_secs(180 * 24 * 3600);

/// What one work item has spent on one role.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelUsage {
    /// The work item (the key holds only a hash of it).
    pub work_item_id: String,
    /// The role (`driver`, `classifier`, ...).
    pub role: String,
    /// Model calls made (a call counts once, whatever its retries).
    pub calls: u32,
    /// Prompt tokens the endpoints reported.
    pub prompt_tokens: u64,
    /// Completion tokens the endpoints reported.
    pub completion_tokens: u64,
}

impl ModelUsage {
    /// Prompt plus completion tokens.
    pub fn tokens(&self) -> u64 {
        self.prompt_tokens.saturating_add(self.completion_tokens)
    }
}

/// The key of an item's usage for a role: the agent, a hash of the work
/// item id (ids may hold characters keys may not) and the role.
fn usage_key(agent: &AgentName, work_item_id: &str, role: &str) -> String {
    crate::memo_key(agent, &[work_item_hash(work_item_id).as_str(), role])
}

fn work_item_hash(work_item_id: &str) -> String {
    use sha2::Digest as _;
    let digest = sha2::Sha256::digest(work_item_id.as_bytes());
    digest[..16].iter().map(|b| format!("{b:02x}")).collect()
}

impl Bus {
    /// The usage bucket's configuration: one value per key, expiring
    /// [`MODEL_USAGE_MAX_AGE`] after its last update.
    pub(crate) fn model_usage_bucket_config(&self) -> kv::Config {
        kv::Config {
            bucket: MODEL_USAGE_BUCKET.to_string(),
            description: "model calls and tokens spent per work item and role".into(),
            history: 1,
            max_age: MODEL_USAGE_MAX_AGE,
            num_replicas: self.config().streams.replicas,
            storage: async_nats::jetstream::stream::StorageType::File,
            ..Default::default()
        }
    }

    /// What `work_item_id` has spent on `role`, and the revision it was
    /// read at (`None`: nothing yet).
    pub async fn model_usage(
        &self,
        agent: &AgentName,
        work_item_id: &str,
        role: &str,
    ) -> Result<Option<(ModelUsage, u64)>> {
        self.read_versioned(
            MODEL_USAGE_BUCKET,
            &usage_key(agent, work_item_id, role),
            &format!("the model usage of {work_item_id} ({role})"),
        )
        .await
    }

    /// Writes `usage`: created when `revision` is `None` (fails if one
    /// exists), else replacing exactly that revision. `Ok(None)` means
    /// someone else wrote first: read again and redo the change.
    pub async fn write_model_usage(
        &self,
        agent: &AgentName,
        usage: &ModelUsage,
        revision: Option<u64>,
    ) -> Result<Option<u64>> {
        self.write_versioned(
            MODEL_USAGE_BUCKET,
            &usage_key(agent, &usage.work_item_id, &usage.role),
            usage,
            revision,
            &format!("the model usage of {} ({})", usage.work_item_id, usage.role),
        )
        .await
    }

    /// Every recorded usage of `agent`, by work item then role.
    pub async fn model_usages(&self, agent: &AgentName) -> Result<Vec<ModelUsage>> {
        let mut out: Vec<ModelUsage> = self
            .list_json(MODEL_USAGE_BUCKET, agent, "model usage")
            .await?;
        out.sort_by(|a, b| (&a.work_item_id, &a.role).cmp(&(&b.work_item_id, &b.role)));
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_per_agent_item_and_role() {
        let a: AgentName = "ops".parse().unwrap();
        let k = usage_key(&a, "0190-item:with/odd chars", "driver");
        assert!(k.starts_with("ops.") && k.ends_with(".driver"), "{k}");
        assert!(
            k.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-' || c == '_'),
            "{k}"
        );
        assert_ne!(k, usage_key(&a, "0190-item:with/odd chars", "helper"));
        assert_ne!(k, usage_key(&a, "0190-other", "driver"));
        let dev: AgentName = "dev".parse().unwrap();
        assert_ne!(k, usage_key(&dev, "0190-item:with/odd chars", "driver"));
    }
}
