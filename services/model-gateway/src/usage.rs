//! What the gateway has spent per work item and role, for the budgets of
//! seed L9 (a confused model cannot spend without end).
//!
//! The counts live in the bus's `nisse_model_usage` bucket rather than in
//! the gateway's memory so that a restarted gateway, or a second instance
//! of it, sees what was already spent; every change is a compare-and-set
//! on the record's revision, so concurrent calls of one item never lose
//! each other's counts.

use serde::{Deserialize, Serialize};

use nisse_bus::topology::MODEL_USAGE_BUCKET;
use nisse_bus::{AgentName, Bus, key_hash, kv_key};

/// How often a change is retried when other calls of the same item keep
/// writing first; far more than concurrent calls of one item.
const CAS_ATTEMPTS: usize = 64;

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
fn key(agent: &AgentName, work_item_id: &str, role: &str) -> String {
    kv_key(agent, &[key_hash(work_item_id).as_str(), role])
}

/// What `work_item_id` has spent on `role` (nothing yet: all zero).
pub async fn read(
    bus: &Bus,
    agent: &AgentName,
    work_item_id: &str,
    role: &str,
) -> nisse_bus::Result<ModelUsage> {
    Ok(bus
        .kv_read(MODEL_USAGE_BUCKET, &key(agent, work_item_id, role))
        .await?
        .map(|(u, _)| u)
        .unwrap_or_else(|| fresh(work_item_id, role)))
}

fn fresh(work_item_id: &str, role: &str) -> ModelUsage {
    ModelUsage {
        work_item_id: work_item_id.to_string(),
        role: role.to_string(),
        ..Default::default()
    }
}

/// Changes what `work_item_id` has spent on `role` by compare-and-set:
/// `change` sees the record as stored now and either changes it (`Ok`) or
/// refuses (`Err`, returned as it is, nothing written). Retried from a
/// fresh read whenever another call wrote first.
pub async fn update<R>(
    bus: &Bus,
    agent: &AgentName,
    work_item_id: &str,
    role: &str,
    mut change: impl FnMut(&mut ModelUsage) -> Result<(), R>,
) -> nisse_bus::Result<Result<(), R>> {
    let key = key(agent, work_item_id, role);
    for _ in 0..CAS_ATTEMPTS {
        let (mut usage, revision) = match bus.kv_read(MODEL_USAGE_BUCKET, &key).await? {
            Some((u, rev)) => (u, Some(rev)),
            None => (fresh(work_item_id, role), None),
        };
        if let Err(refused) = change(&mut usage) {
            return Ok(Err(refused));
        }
        if bus
            .kv_write(MODEL_USAGE_BUCKET, &key, &usage, revision)
            .await?
            .is_some()
        {
            return Ok(Ok(()));
        }
    }
    Err(nisse_bus::Error::JetStream {
        action: format!("count the {role} usage of work item {work_item_id}"),
        reason: format!("{CAS_ATTEMPTS} concurrent updates won over this one"),
    })
}

/// Every recorded usage of `agent`, by work item then role.
pub async fn all(bus: &Bus, agent: &AgentName) -> nisse_bus::Result<Vec<ModelUsage>> {
    let mut out: Vec<ModelUsage> = bus.kv_list(MODEL_USAGE_BUCKET, agent).await?;
    out.sort_by(|a, b| (&a.work_item_id, &a.role).cmp(&(&b.work_item_id, &b.role)));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_per_agent_item_and_role() {
        let a: AgentName = "ops".parse().unwrap();
        let k = key(&a, "0190-item:with/odd chars", "driver");
        assert!(k.starts_with("ops.") && k.ends_with(".driver"), "{k}");
        assert!(
            k.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-' || c == '_'),
            "{k}"
        );
        assert_ne!(k, key(&a, "0190-item:with/odd chars", "helper"));
        assert_ne!(k, key(&a, "0190-other", "driver"));
        let dev: AgentName = "dev".parse().unwrap();
        assert_ne!(k, key(&dev, "0190-item:with/odd chars", "driver"));
    }
}
