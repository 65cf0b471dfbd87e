//! The service's records in the `nisse_gitea` bucket, under the agent's
//! own keys (only the agent's intake-gitea may read and write them):
//!
//! - `<agent>.delivery.<delivery id>`: a webhook delivery whose events
//!   JetStream stored. Written only after every ack, so a delivery that
//!   failed to store is taken again when Gitea sends it again; one that
//!   is here is refused (a replayed delivery).
//! - `<agent>.cursor.<repository>`: how far the poll has read each
//!   repository ([`Cursor`]), advanced only after everything up to it was
//!   stored.
//! - `<agent>.call.<request id>`: an API call with side effects
//!   ([`CallRecord`]): `started` before Gitea is called, `done` with the
//!   answer after, so a redelivered request is answered again or
//!   reconciled with Gitea, never made twice.
//!
//! Parts of keys that hold what a key may not (`/`, `:`) are hashed
//! ([`nisse_bus::kv_key`]); each record holds its own name in full.

use std::collections::BTreeSet;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use nisse_bus::topology::GITEA_BUCKET;
use nisse_bus::{AgentName, Bus, Result, Versioned, kv_key};

pub(crate) use nisse_intake_kit::records::now_ms;

/// A webhook delivery whose events are in the stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeliveryRecord {
    /// Gitea's `X-Gitea-Delivery`.
    pub delivery_id: String,
    /// Its `X-Gitea-Event-Type` (or `X-Gitea-Event`).
    pub event: String,
    /// How many messages it became.
    pub messages: usize,
    /// When it was taken, in milliseconds since the Unix epoch.
    pub taken_ms: u64,
}

/// The bucket key of delivery `delivery_id` of `agent`.
pub fn delivery_key(agent: &AgentName, delivery_id: &str) -> String {
    kv_key(agent, &["delivery", delivery_id])
}

/// Whether delivery `delivery_id` was taken already.
pub(crate) async fn delivery_taken(
    bus: &Bus,
    agent: &AgentName,
    delivery_id: &str,
) -> Result<bool> {
    let found: Option<Versioned<DeliveryRecord>> = bus
        .kv_read(GITEA_BUCKET, &delivery_key(agent, delivery_id))
        .await?;
    Ok(found.is_some())
}

/// Records `record` as taken; `false` when another request took the same
/// delivery meanwhile.
pub(crate) async fn take_delivery(
    bus: &Bus,
    agent: &AgentName,
    record: &DeliveryRecord,
) -> Result<bool> {
    Ok(bus
        .kv_write(
            GITEA_BUCKET,
            &delivery_key(agent, &record.delivery_id),
            record,
            None,
        )
        .await?
        .is_some())
}

/// How far one kind of thing in a repository has been read: the newest
/// update time Gitea showed (its own clock, which its `since` filters
/// compare with), and what was published at that edge.
///
/// Gitea's `since` has a granularity of one second and a row may commit
/// a moment after a read, so every read reaches back by the overlap; what
/// was published from the overlap before is in `seen` and not published
/// again, so a quiet repository publishes nothing however long it stays
/// quiet.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mark {
    /// Everything updated before this (less the overlap) was published.
    /// `None`: never read.
    #[serde(default, with = "time::serde::rfc3339::option")]
    pub since: Option<OffsetDateTime>,
    /// What was published that was updated within the overlap before
    /// `since`, by key.
    #[serde(default)]
    pub seen: BTreeSet<String>,
}

impl Mark {
    /// A mark at `since`, nothing seen: where a first read starts.
    pub fn at(since: OffsetDateTime) -> Self {
        Self {
            since: Some(since),
            seen: BTreeSet::new(),
        }
    }

    /// The `since` to ask Gitea for: the mark less the overlap.
    pub fn query_since(&self, overlap: Duration) -> Option<OffsetDateTime> {
        self.since.map(|s| s - overlap)
    }

    /// Whether `key` was published at the edge already.
    pub fn has_seen(&self, key: &str) -> bool {
        self.seen.contains(key)
    }

    /// The mark once everything of a read was published: `items` are
    /// every `(key, update time)` the read returned.
    pub fn advanced<'a>(
        &self,
        items: impl IntoIterator<Item = (&'a str, OffsetDateTime)> + Clone,
        overlap: Duration,
    ) -> Self {
        let newest = items.clone().into_iter().map(|(_, t)| t).max();
        let since = match (self.since, newest) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        let seen = match since {
            None => BTreeSet::new(),
            Some(s) => items
                .into_iter()
                .filter(|(_, t)| *t >= s - overlap)
                .map(|(k, _)| k.to_string())
                .collect(),
        };
        Self { since, seen }
    }
}

/// How far the poll has read one repository.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cursor {
    /// `owner/name`, as configured.
    pub repository: String,
    /// Issues, by update time.
    #[serde(default)]
    pub issues: Mark,
    /// Comments on issues and pull requests' conversations, by update
    /// time.
    #[serde(default)]
    pub comments: Mark,
    /// Pull requests: their state changes, reviews and inline comments,
    /// by when each happened (and each pull request's update time). Read
    /// from a cursor's `reviews` too, the name it had when only inline
    /// comments were polled, so an upgrade carries on from it.
    #[serde(default, alias = "reviews")]
    pub pulls: Mark,
}

/// The bucket key of `repo`'s cursor for `agent`.
pub fn cursor_key(agent: &AgentName, repo: &str) -> String {
    kv_key(agent, &["cursor", repo])
}

/// `repo`'s cursor and its revision, if the poll has read it before.
pub(crate) async fn read_cursor(
    bus: &Bus,
    agent: &AgentName,
    repo: &str,
) -> Result<Option<Versioned<Cursor>>> {
    bus.kv_read(GITEA_BUCKET, &cursor_key(agent, repo)).await
}

/// Writes `cursor` over `revision` (`None`: the first). `Ok(None)` when
/// another instance moved it meanwhile.
pub(crate) async fn write_cursor(
    bus: &Bus,
    agent: &AgentName,
    cursor: &Cursor,
    revision: Option<u64>,
) -> Result<Option<u64>> {
    bus.kv_write(
        GITEA_BUCKET,
        &cursor_key(agent, &cursor.repository),
        cursor,
        revision,
    )
    .await
}

// The call records and their once-per-request-id flow are the Gitea and
// Vikunja intakes' one (the shared kit's); only the bucket is this one's.
pub use nisse_intake_kit::records::{CallRecord, CallState, call_key};

/// The record of `request_id`, if any, with its revision.
pub async fn read_call(
    bus: &Bus,
    agent: &AgentName,
    request_id: &str,
) -> Result<Option<Versioned<CallRecord>>> {
    nisse_intake_kit::records::read_call(bus, GITEA_BUCKET, agent, request_id).await
}

/// Writes `record` over `revision` (`None`: none may exist). `Ok(None)`
/// when someone else wrote first.
pub async fn write_call(
    bus: &Bus,
    agent: &AgentName,
    record: &CallRecord,
    revision: Option<u64>,
) -> Result<Option<u64>> {
    nisse_intake_kit::records::write_call(bus, GITEA_BUCKET, agent, record, revision).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: i64) -> OffsetDateTime {
        OffsetDateTime::from_unix_timestamp(1_714_550_400 + s).unwrap()
    }

    #[test]
    fn a_mark_moves_to_the_newest_and_remembers_its_edge() {
        let overlap = Duration::from_secs(5);
        let m = Mark::default();
        assert_eq!(m.query_since(overlap), None);
        let m = m.advanced([("a", t(0)), ("b", t(8)), ("c", t(10))], overlap);
        assert_eq!(m.since, Some(t(10)));
        assert_eq!(m.query_since(overlap), Some(t(5)));
        // b and c are within the overlap: the next read returns them
        // again, and they are not published again.
        assert!(m.has_seen("b") && m.has_seen("c") && !m.has_seen("a"));
        // A quiet read: the same two come back, nothing moves.
        let quiet = m.advanced([("b", t(8)), ("c", t(10))], overlap);
        assert_eq!(quiet, m);
        // Nothing at all: the mark stays.
        let empty: [(&str, OffsetDateTime); 0] = [];
        assert_eq!(m.advanced(empty, overlap), Mark::at(t(10)));
    }

    #[test]
    fn a_cursor_from_before_pull_requests_were_polled_carries_on() {
        let old = serde_json::json!({
            "repository": "alice/project",
            "reviews": {"since": "2024-05-01T08:00:10Z", "seen": ["comment:7"]},
        });
        let c: Cursor = serde_json::from_value(old).unwrap();
        assert_eq!(c.pulls.since, Some(t(10)));
        assert!(c.pulls.has_seen("comment:7"));
        let written = serde_json::to_value(&c).unwrap();
        assert!(written.get("pulls").is_some() && written.get("reviews").is_none());
    }

    #[test]
    fn records_read_back_and_keys_are_key_safe() {
        let agent: AgentName = "dev".parse().unwrap();
        let c = Cursor {
            repository: "alice/project".into(),
            issues: Mark::default().advanced([("k", t(3))], Duration::from_secs(5)),
            ..Cursor::default()
        };
        let back: Cursor = serde_json::from_slice(&serde_json::to_vec(&c).unwrap()).unwrap();
        assert_eq!(back, c);
        let r = CallRecord {
            request_id: "r:1".into(),
            state: CallState::Done,
            started_ms: 1,
            result: vec![1, 2, 255],
        };
        let back: CallRecord = serde_json::from_slice(&serde_json::to_vec(&r).unwrap()).unwrap();
        assert_eq!(back, r);
        for key in [
            cursor_key(&agent, "alice/project"),
            call_key(&agent, "0190:r1"),
            delivery_key(&agent, "f6a2c3d4-0000-4000-8000-000000000001"),
        ] {
            assert!(key.starts_with("dev."), "{key}");
            assert!(
                key.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_')),
                "{key}"
            );
        }
        assert_eq!(
            delivery_key(&agent, "f6a2c3d4-0000-4000-8000-000000000001"),
            "dev.delivery.f6a2c3d4-0000-4000-8000-000000000001"
        );
    }
}
