//! A small key-value bucket for services' own durable notes, keyed by
//! agent: the Matrix service's sync position, which Matrix event is which
//! work item's thread, which message showed which plan revision, which
//! outbound messages were posted. Notes a service needs to keep its
//! promises across restarts, and that any instance of it must see.

use std::time::Duration;

use async_nats::jetstream::kv;

use crate::{AgentName, Bus, Error, Result};

/// The key-value bucket of service notes.
pub const MEMO_BUCKET: &str = "nisse_memo";

/// A key for `parts` under `agent`: each part hashed when it holds
/// characters keys may not (Matrix ids hold `!`, `$`, `:`).
pub fn memo_key(agent: &AgentName, parts: &[&str]) -> String {
    use sha2::Digest as _;
    let mut key = agent.to_string();
    for p in parts {
        key.push('.');
        let plain = !p.is_empty()
            && p.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
        if plain {
            key.push_str(p);
        } else {
            let digest = sha2::Sha256::digest(p.as_bytes());
            key.extend(digest[..16].iter().map(|b| format!("{b:02x}")));
        }
    }
    key
}

impl Bus {
    /// The memo bucket's configuration: notes older than a year are gone.
    pub(crate) fn memo_bucket_config(&self) -> kv::Config {
        kv::Config {
            bucket: MEMO_BUCKET.to_string(),
            description: "services' durable notes (Matrix sync position, threads)".into(),
            history: 1,
            max_age: Duration::from_secs(366 * 24 * 3600),
            num_replicas: self.config().streams.replicas,
            storage: async_nats::jetstream::stream::StorageType::File,
            ..Default::default()
        }
    }

    /// The note under `key`, if any.
    pub async fn memo(&self, key: &str) -> Result<Option<Vec<u8>>> {
        let store = self.bucket(MEMO_BUCKET).await?;
        let value = store.get(key).await.map_err(|e| Error::JetStream {
            action: format!("read the note {key}"),
            reason: e.to_string(),
        })?;
        Ok(value.map(|v| v.to_vec()))
    }

    /// Writes the note under `key`.
    pub async fn set_memo(&self, key: &str, value: Vec<u8>) -> Result<()> {
        let store = self.bucket(MEMO_BUCKET).await?;
        store
            .put(key, value.into())
            .await
            .map_err(|e| Error::JetStream {
                action: format!("write the note {key}"),
                reason: e.to_string(),
            })?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_hash_what_keys_cannot_hold() {
        let a: AgentName = "ops".parse().unwrap();
        assert_eq!(memo_key(&a, &["since"]), "ops.since");
        let k = memo_key(&a, &["root", "$abc:example.org"]);
        assert!(
            k.starts_with("ops.root.") && k.len() == "ops.root.".len() + 32,
            "{k}"
        );
        assert_ne!(k, memo_key(&a, &["root", "$abd:example.org"]));
    }
}
