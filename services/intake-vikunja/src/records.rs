//! The service's records in the `nisse_vikunja` bucket, under the agent's
//! own keys (only the agent's intake-vikunja may read and write them):
//!
//! - `<agent>.event.<message id>`: an event JetStream stored, by its
//!   message id ([`EventRecord`]). Vikunja sends no delivery id, so the
//!   event's own id (what it is, `crate::events`) is the key: written
//!   only after JetStream's ack, by the webhook receiver and the poll
//!   alike, so a replayed or retried delivery, or the poll finding what a
//!   webhook brought, is stored once however long after; one that failed
//!   to store is taken when it comes again.
//! - `<agent>.cursor.<project id>`: how far the poll has read each
//!   project ([`Cursor`]), advanced only after everything up to it was
//!   stored.
//! - `<agent>.call.<request id>`: an API call with side effects
//!   ([`CallRecord`]): `started` before Vikunja is called, `done` with the
//!   answer after, so a redelivered request is answered again or
//!   reconciled with Vikunja, never made twice.
//! - `<agent>.wrote.<task id>`: when the agent's own writes left a task
//!   ([`Wrote`]), so the poll does not report the agent's own change of a
//!   task back to it as someone's update.
//!
//! Parts of keys that hold what a key may not (`:`) are hashed
//! ([`nisse_bus::kv_key`]); each record holds its own name in full.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use nisse_bus::topology::VIKUNJA_BUCKET;
use nisse_bus::{AgentName, Bus, Result, Versioned, kv_key};

pub(crate) use nisse_intake_kit::records::now_ms;

/// An event whose message is in the stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventRecord {
    /// Its message id.
    pub message_id: String,
    /// Vikunja's event name.
    pub event: String,
    /// Webhook or poll.
    pub source: String,
    /// When it was taken, in milliseconds since the Unix epoch.
    pub taken_ms: u64,
}

/// The bucket key of the event with `message_id` for `agent`.
pub fn event_key(agent: &AgentName, message_id: &str) -> String {
    kv_key(agent, &["event", message_id])
}

/// Whether the event with `message_id` was stored already.
pub(crate) async fn event_taken(bus: &Bus, agent: &AgentName, message_id: &str) -> Result<bool> {
    let found: Option<Versioned<EventRecord>> = bus
        .kv_read(VIKUNJA_BUCKET, &event_key(agent, message_id))
        .await?;
    Ok(found.is_some())
}

/// Records `record` as taken; `false` when it was recorded meanwhile (the
/// same event by the other way, or a delivery sent twice at once).
pub(crate) async fn take_event(bus: &Bus, agent: &AgentName, record: &EventRecord) -> Result<bool> {
    Ok(bus
        .kv_write(
            VIKUNJA_BUCKET,
            &event_key(agent, &record.message_id),
            record,
            None,
        )
        .await?
        .is_some())
}

/// How far a project has been read: the newest update time Vikunja showed
/// (its own clock, which its filters compare with), and what was
/// published at that edge.
///
/// A row may commit a moment after a read, and Vikunja keeps whole
/// seconds, so every read reaches back by the overlap; what was published
/// from the overlap before is in `seen` and not published again, so a
/// quiet project publishes nothing however long it stays quiet.
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

    /// The time to ask Vikunja for changes from: the mark less the
    /// overlap.
    pub fn query_since(&self, overlap: Duration) -> Option<OffsetDateTime> {
        self.since.map(|s| s - overlap)
    }

    /// Whether `key` was published at the edge already.
    pub fn has_seen(&self, key: &str) -> bool {
        self.seen.contains(key)
    }

    /// The mark once everything of a read was published: `items` are
    /// every `(key, time)` the read returned. It moves to the newest, but
    /// never past `until` (Vikunja's clock when the read began): a task
    /// changed while the read paged on is read again by the next one,
    /// where it is `seen` unless it changed again.
    pub fn advanced<'a>(
        &self,
        items: impl IntoIterator<Item = (&'a str, OffsetDateTime)> + Clone,
        overlap: Duration,
        until: OffsetDateTime,
    ) -> Self {
        let newest = items.clone().into_iter().map(|(_, t)| t.min(until)).max();
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

/// How far the poll has read one project.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cursor {
    /// The project's id.
    pub project_id: i64,
    /// Tasks, and their comments, by update time.
    #[serde(default)]
    pub tasks: Mark,
    /// The assignees (user ids) each open task had when the poll last
    /// read it: an assignee not among them is a new assignment. A task
    /// done is forgotten (so this stays as small as the open tasks); read
    /// again, its assignees are reported with the ids a webhook gives
    /// them, which the brain knows.
    #[serde(default)]
    pub assignees: BTreeMap<i64, BTreeSet<i64>>,
}

/// The bucket key of `project`'s cursor for `agent`.
pub fn cursor_key(agent: &AgentName, project: i64) -> String {
    kv_key(agent, &["cursor", &project.to_string()])
}

/// `project`'s cursor and its revision, if the poll has read it before.
pub(crate) async fn read_cursor(
    bus: &Bus,
    agent: &AgentName,
    project: i64,
) -> Result<Option<Versioned<Cursor>>> {
    bus.kv_read(VIKUNJA_BUCKET, &cursor_key(agent, project))
        .await
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
        VIKUNJA_BUCKET,
        &cursor_key(agent, cursor.project_id),
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
    nisse_intake_kit::records::read_call(bus, VIKUNJA_BUCKET, agent, request_id).await
}

/// Writes `record` over `revision` (`None`: none may exist). `Ok(None)`
/// when someone else wrote first.
pub async fn write_call(
    bus: &Bus,
    agent: &AgentName,
    record: &CallRecord,
    revision: Option<u64>,
) -> Result<Option<u64>> {
    nisse_intake_kit::records::write_call(bus, VIKUNJA_BUCKET, agent, record, revision).await
}

/// The update times the agent's own writes left a task at, newest last
/// (a few: a task the agent writes to often keeps only the latest).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Wrote {
    /// The task.
    pub task_id: i64,
    /// RFC 3339 in UTC, as Vikunja answered the write.
    #[serde(default)]
    pub updated: Vec<String>,
}

/// Update times kept per task in [`Wrote`].
const WROTE_KEPT: usize = 8;

/// The bucket key of what the agent wrote to `task` for `agent`.
pub fn wrote_key(agent: &AgentName, task: i64) -> String {
    kv_key(agent, &["wrote", &task.to_string()])
}

/// The times the agent's own writes left `task` at.
pub(crate) async fn read_wrote(bus: &Bus, agent: &AgentName, task: i64) -> Result<Wrote> {
    let found: Option<Versioned<Wrote>> =
        bus.kv_read(VIKUNJA_BUCKET, &wrote_key(agent, task)).await?;
    Ok(found.map(|(w, _)| w).unwrap_or(Wrote {
        task_id: task,
        updated: Vec::new(),
    }))
}

/// Adds `updated` to the times the agent's writes left `task` at.
pub(crate) async fn note_wrote(
    bus: &Bus,
    agent: &AgentName,
    task: i64,
    updated: &str,
) -> Result<()> {
    let key = wrote_key(agent, task);
    // Compare-and-set, a few times: only this agent's intake writes it,
    // but two instances may.
    for _ in 0..5 {
        let found: Option<Versioned<Wrote>> = bus.kv_read(VIKUNJA_BUCKET, &key).await?;
        let (mut wrote, revision) = match found {
            Some((w, r)) => (w, Some(r)),
            None => (
                Wrote {
                    task_id: task,
                    updated: Vec::new(),
                },
                None,
            ),
        };
        if wrote.updated.iter().any(|u| u == updated) {
            return Ok(());
        }
        wrote.updated.push(updated.to_string());
        let excess = wrote.updated.len().saturating_sub(WROTE_KEPT);
        wrote.updated.drain(..excess);
        if bus
            .kv_write(VIKUNJA_BUCKET, &key, &wrote, revision)
            .await?
            .is_some()
        {
            return Ok(());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: i64) -> OffsetDateTime {
        OffsetDateTime::from_unix_timestamp(1_785_571_200 + s).unwrap()
    }

    #[test]
    fn a_mark_moves_to_the_newest_and_remembers_its_edge() {
        let overlap = Duration::from_secs(5);
        let far = t(1000);
        let m = Mark::default();
        assert_eq!(m.query_since(overlap), None);
        let m = m.advanced([("a", t(0)), ("b", t(8)), ("c", t(10))], overlap, far);
        assert_eq!(m.since, Some(t(10)));
        assert_eq!(m.query_since(overlap), Some(t(5)));
        assert!(m.has_seen("b") && m.has_seen("c") && !m.has_seen("a"));
        // A quiet read: the same two come back, nothing moves.
        let quiet = m.advanced([("b", t(8)), ("c", t(10))], overlap, far);
        assert_eq!(quiet, m);
        let empty: [(&str, OffsetDateTime); 0] = [];
        assert_eq!(m.advanced(empty, overlap, far), Mark::at(t(10)));
    }

    #[test]
    fn a_mark_never_passes_the_reads_start() {
        let overlap = Duration::from_secs(5);
        // Read at t(20); a task changed at t(30) while the read paged on.
        let m = Mark::at(t(0)).advanced([("a", t(12)), ("late", t(30))], overlap, t(20));
        assert_eq!(m.since, Some(t(20)));
        // The next read reaches back to t(15): the late one comes again
        // and is seen, the earlier one does not come again.
        assert!(m.has_seen("late") && !m.has_seen("a"));
    }

    #[test]
    fn records_read_back_and_keys_are_key_safe() {
        let agent: AgentName = "ops".parse().unwrap();
        let c = Cursor {
            project_id: 3,
            tasks: Mark::at(t(3)),
            assignees: BTreeMap::from([(12, BTreeSet::from([2, 5]))]),
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
            cursor_key(&agent, 3),
            call_key(&agent, "0190:r1"),
            event_key(&agent, "vikunja:task:12:created"),
            wrote_key(&agent, 12),
        ] {
            assert!(key.starts_with("ops."), "{key}");
            assert!(
                key.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_')),
                "{key}"
            );
        }
        assert_eq!(cursor_key(&agent, 3), "ops.cursor.3");
    }
}
