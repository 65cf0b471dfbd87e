//! Key-value records in the bus's buckets, for the services that keep
//! durable state every instance of them must see (the executor's
//! execution records and circuits, the gateway's model usage, the Matrix
//! service's notes). The bus stores JSON values under keys and offers a
//! versioned read and a compare-and-set write; what a record means is the
//! owning service's. The buckets themselves are part of the topology
//! ([`crate::topology::BUCKETS`]).

use async_nats::jetstream::kv;
use futures::StreamExt as _;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::{AgentName, Bus, Error, Result};

/// A record and the bucket revision it was read at: pass the revision
/// back to [`Bus::kv_write`] to change exactly what was read.
pub type Versioned<T> = (T, u64);

/// A key for `parts` under `agent`, `<agent>.<part>.<part>`: each part
/// is kept as it is when it is plain (letters, digits, `-`, `_`) and
/// hashed otherwise, since key tokens may not hold dots, `!`, `$` or `:`
/// (Matrix ids, request ids, host names do).
pub fn kv_key(agent: &AgentName, parts: &[&str]) -> String {
    let mut key = agent.to_string();
    for p in parts {
        key.push('.');
        let plain = !p.is_empty()
            && p.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
        if plain {
            key.push_str(p);
        } else {
            key.push_str(&key_hash(p));
        }
    }
    key
}

/// A key token standing for `text`, whatever it holds: 32 hex digits of
/// its SHA-256.
pub fn key_hash(text: &str) -> String {
    use sha2::Digest as _;
    let digest = sha2::Sha256::digest(text.as_bytes());
    digest[..16].iter().map(|b| format!("{b:02x}")).collect()
}

fn kv_err(action: String, e: &dyn std::fmt::Display) -> Error {
    Error::JetStream {
        action,
        reason: e.to_string(),
    }
}

impl Bus {
    /// The key-value bucket `name`. Opened for each use, not cached: a
    /// cached handle to a bucket that was deleted makes reads wait for the
    /// request timeout, where opening fails at once, and the switch board
    /// is read to fail closed quickly.
    pub(crate) async fn bucket(&self, name: &str) -> Result<kv::Store> {
        self.jetstream()
            .get_key_value(name)
            .await
            .map_err(|e| kv_err(format!("open the key-value bucket {name}"), &e))
    }

    /// The JSON record under `key` in `bucket` and its revision, if there
    /// is one (a deleted key is none).
    pub async fn kv_read<T: DeserializeOwned>(
        &self,
        bucket: &str,
        key: &str,
    ) -> Result<Option<Versioned<T>>> {
        use kv::Operation;
        let store = self.bucket(bucket).await?;
        let err = |e: &dyn std::fmt::Display| kv_err(format!("read {key} in {bucket}"), e);
        match store.entry(key).await.map_err(|e| err(&e))? {
            Some(entry) if entry.operation == Operation::Put => {
                let value = serde_json::from_slice(&entry.value).map_err(|e| err(&e))?;
                Ok(Some((value, entry.revision)))
            }
            _ => Ok(None),
        }
    }

    /// Writes `value` as JSON under `key` in `bucket` by compare-and-set:
    /// created when `revision` is `None` (only if there is none), else
    /// replacing exactly that revision. `Ok(None)` means someone else wrote
    /// first: read again and redo the change.
    pub async fn kv_write<T: Serialize>(
        &self,
        bucket: &str,
        key: &str,
        value: &T,
        revision: Option<u64>,
    ) -> Result<Option<u64>> {
        use kv::{CreateErrorKind, UpdateErrorKind};
        let store = self.bucket(bucket).await?;
        let err = |e: &dyn std::fmt::Display| kv_err(format!("write {key} in {bucket}"), e);
        let bytes = serde_json::to_vec(value).map_err(|e| err(&e))?;
        match revision {
            None => match store.create(key, bytes.into()).await {
                Ok(r) => Ok(Some(r)),
                Err(e) if e.kind() == CreateErrorKind::AlreadyExists => Ok(None),
                Err(e) => Err(err(&e)),
            },
            Some(rev) => match store.update(key, bytes.into(), rev).await {
                Ok(r) => Ok(Some(r)),
                Err(e) if e.kind() == UpdateErrorKind::WrongLastRevision => Ok(None),
                Err(e) => Err(err(&e)),
            },
        }
    }

    /// Writes `value` under `key` in `bucket` whatever is there: for
    /// records only one writer changes (a circuit, a note).
    pub async fn kv_put(&self, bucket: &str, key: &str, value: Vec<u8>) -> Result<()> {
        let store = self.bucket(bucket).await?;
        store
            .put(key, value.into())
            .await
            .map_err(|e| kv_err(format!("write {key} in {bucket}"), &e))?;
        Ok(())
    }

    /// The bytes under `key` in `bucket`, if any.
    pub async fn kv_get(&self, bucket: &str, key: &str) -> Result<Option<Vec<u8>>> {
        let store = self.bucket(bucket).await?;
        let value = store
            .get(key)
            .await
            .map_err(|e| kv_err(format!("read {key} in {bucket}"), &e))?;
        Ok(value.map(|v| v.to_vec()))
    }

    /// Every JSON record in `bucket` whose key starts with `<agent>.`, in
    /// key order; records that do not decode are skipped.
    pub async fn kv_list<T: DeserializeOwned>(
        &self,
        bucket: &str,
        agent: &AgentName,
    ) -> Result<Vec<T>> {
        self.kv_list_prefix(bucket, &format!("{agent}.")).await
    }

    /// Every JSON record in `bucket` whose key starts with `prefix`
    /// (`<agent>.` and maybe more tokens, each ending in a dot), in key
    /// order; records that do not decode are skipped.
    pub async fn kv_list_prefix<T: DeserializeOwned>(
        &self,
        bucket: &str,
        prefix: &str,
    ) -> Result<Vec<T>> {
        let store = self.bucket(bucket).await?;
        let err = |e: &dyn std::fmt::Display| kv_err(format!("list {bucket} under {prefix}"), e);
        let mut keys = store.keys().await.map_err(|e| err(&e))?;
        let mut found = Vec::new();
        while let Some(key) = keys.next().await {
            let key = key.map_err(|e| err(&e))?;
            if key.starts_with(prefix) {
                found.push(key);
            }
        }
        found.sort();
        let mut out = Vec::new();
        for key in found {
            if let Some(value) = store.get(&key).await.map_err(|e| err(&e))?
                && let Ok(v) = serde_json::from_slice::<T>(&value)
            {
                out.push(v);
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_hash_what_keys_cannot_hold() {
        let a: AgentName = "ops".parse().unwrap();
        assert_eq!(kv_key(&a, &["since"]), "ops.since");
        let k = kv_key(&a, &["root", "$abc:example.org"]);
        assert!(
            k.starts_with("ops.root.") && k.len() == "ops.root.".len() + 32,
            "{k}"
        );
        assert_ne!(k, kv_key(&a, &["root", "$abd:example.org"]));
        assert!(
            k.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-' || c == '_')
        );
    }
}
