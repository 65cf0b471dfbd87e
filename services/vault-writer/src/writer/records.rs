//! The writer's records: one per request id, saying whether its write is
//! about to be put in place (`intended`, with the hash of the bytes) or
//! done (with the answer given). They are what makes a write happen once
//! per request id however often it is delivered, and what tells, after a
//! crash between the record and the rename, whether the rename happened.
//!
//! The service keeps them in the `nisse_vault` bucket ([`KvRecords`]), so
//! every writer process of an agent sees the same ones; a rebuild keeps
//! them in memory ([`MemoryRecords`]), since it writes a fresh folder from
//! the whole stream and must answer a retried request id exactly as the
//! service did.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use nisse_bus::topology::VAULT_BUCKET;
use nisse_bus::{AgentName, Bus, kv_key};

use super::{Outcome, WriteError};

/// Where a request id's write stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RecordState {
    /// Its bytes are about to be renamed over the note (or were, just
    /// before a crash): the note has them exactly when its SHA-256 is the
    /// record's.
    Intended,
    /// Answered: applied or refused, never applied again.
    Done,
}

/// The durable record of one request id's write.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriteRecord {
    /// The request id: the write's identity (the key is made from it).
    pub request_id: String,
    /// The message that applied it (a retry has another).
    pub message_id: String,
    /// The note, relative to the vault root, as the write named it.
    pub path: String,
    /// Intended or done.
    pub state: RecordState,
    /// Intended: the SHA-256 (hex) of the bytes being put in place. Done:
    /// the answer's (the note's after the write, or as it was when the
    /// write was refused; empty when there is no note).
    pub sha256: String,
    /// Done: whether the write applied.
    #[serde(default)]
    pub written: bool,
    /// Done and refused: why.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
}

impl WriteRecord {
    /// The record of a write whose bytes hashing to `sha256` are about to
    /// replace the note at `path`.
    pub fn intended(request_id: &str, message_id: &str, path: &str, sha256: &str) -> Self {
        Self {
            request_id: request_id.to_string(),
            message_id: message_id.to_string(),
            path: path.to_string(),
            state: RecordState::Intended,
            sha256: sha256.to_string(),
            written: false,
            reason: String::new(),
        }
    }

    /// The record of the answer `outcome` to `request_id`.
    pub fn done(request_id: &str, message_id: &str, outcome: &Outcome) -> Self {
        Self {
            request_id: request_id.to_string(),
            message_id: message_id.to_string(),
            path: outcome.path.clone(),
            state: RecordState::Done,
            sha256: outcome.sha256.clone(),
            written: outcome.written,
            reason: outcome.reason.clone(),
        }
    }

    /// The answer a done record gives again.
    pub fn outcome(&self) -> Outcome {
        Outcome {
            written: self.written,
            path: self.path.clone(),
            sha256: self.sha256.clone(),
            reason: self.reason.clone(),
            repeated: true,
        }
    }
}

/// Where an agent's write records are kept, read and changed by
/// compare-and-set: a revision comes back from each read and write, and a
/// write replacing another revision than the one there fails (another
/// writer process took the same request id: try again later).
pub trait Records {
    /// The record of `request_id` and its revision, if there is one.
    fn read(
        &mut self,
        request_id: &str,
    ) -> impl Future<Output = Result<Option<(WriteRecord, u64)>, WriteError>> + Send;

    /// Writes `record`: created when `revision` is `None` (none may exist),
    /// else replacing exactly that revision. Returns the new revision.
    fn write(
        &mut self,
        record: &WriteRecord,
        revision: Option<u64>,
    ) -> impl Future<Output = Result<u64, WriteError>> + Send;
}

/// Records in memory, for a rebuild (and tests).
#[derive(Debug, Default, Clone)]
pub struct MemoryRecords {
    records: HashMap<String, (WriteRecord, u64)>,
    revision: u64,
}

impl MemoryRecords {
    /// The record of `request_id`, if any.
    pub fn get(&self, request_id: &str) -> Option<&WriteRecord> {
        self.records.get(request_id).map(|(r, _)| r)
    }
}

impl Records for MemoryRecords {
    async fn read(&mut self, request_id: &str) -> Result<Option<(WriteRecord, u64)>, WriteError> {
        Ok(self.records.get(request_id).cloned())
    }

    async fn write(
        &mut self,
        record: &WriteRecord,
        revision: Option<u64>,
    ) -> Result<u64, WriteError> {
        let current = self.records.get(&record.request_id).map(|(_, r)| *r);
        if current != revision {
            return Err(WriteError::Conflict {
                request_id: record.request_id.clone(),
            });
        }
        self.revision += 1;
        self.records
            .insert(record.request_id.clone(), (record.clone(), self.revision));
        Ok(self.revision)
    }
}

/// Records in the bus's `nisse_vault` bucket, under the agent's own keys
/// (`<agent>.<request id, hashed when it holds what a key may not>`),
/// which only the agent's vault writer may read and write.
#[derive(Debug, Clone)]
pub struct KvRecords {
    bus: Bus,
    agent: AgentName,
}

impl KvRecords {
    /// `agent`'s records, through `bus`.
    pub fn new(bus: Bus, agent: AgentName) -> Self {
        Self { bus, agent }
    }

    /// The bucket key of `request_id`'s record.
    pub fn key(agent: &AgentName, request_id: &str) -> String {
        kv_key(agent, &[request_id])
    }
}

impl Records for KvRecords {
    async fn read(&mut self, request_id: &str) -> Result<Option<(WriteRecord, u64)>, WriteError> {
        self.bus
            .kv_read(VAULT_BUCKET, &Self::key(&self.agent, request_id))
            .await
            .map_err(|e| WriteError::Records(e.to_string()))
    }

    async fn write(
        &mut self,
        record: &WriteRecord,
        revision: Option<u64>,
    ) -> Result<u64, WriteError> {
        let key = Self::key(&self.agent, &record.request_id);
        match self
            .bus
            .kv_write(VAULT_BUCKET, &key, record, revision)
            .await
        {
            Ok(Some(revision)) => Ok(revision),
            Ok(None) => Err(WriteError::Conflict {
                request_id: record.request_id.clone(),
            }),
            Err(e) => Err(WriteError::Records(e.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn memory_records_refuse_a_stale_revision_like_the_bucket() {
        let mut records = MemoryRecords::default();
        let r = WriteRecord::intended("r1", "m1", "memory/ops/a.md", "abc");
        let first = records.write(&r, None).await.unwrap();
        assert!(matches!(
            records.write(&r, None).await,
            Err(WriteError::Conflict { .. })
        ));
        let done = WriteRecord {
            state: RecordState::Done,
            written: true,
            ..r.clone()
        };
        records.write(&done, Some(first)).await.unwrap();
        assert!(records.write(&done, Some(first)).await.is_err());
        assert_eq!(records.get("r1"), Some(&done));
    }

    #[test]
    fn a_record_reads_back_and_keys_are_key_safe() {
        let agent: AgentName = "ops".parse().unwrap();
        let r = WriteRecord::intended("0190:r1:note:2", "m", "memory/ops/a.md", "ab");
        let back: WriteRecord = serde_json::from_slice(&serde_json::to_vec(&r).unwrap()).unwrap();
        assert_eq!(back, r);
        let key = KvRecords::key(&agent, &r.request_id);
        assert!(
            key.starts_with("ops.") && !key[4..].contains(['.', ':']),
            "{key}"
        );
    }
}
