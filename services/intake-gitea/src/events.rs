//! What the webhook receiver and the poll both make of Gitea: the
//! `GiteaEvent`s, their ids, what is read from the API to complete them,
//! and publishing them.
//!
//! **Ids say what a message is**, so the same thing seen twice is stored
//! once (within JetStream's duplicate window; the brain goes by the same
//! ids after it): a comment is `gitea:comment:<id>` whether a webhook or
//! the poll found it, each edit of it `gitea:comment:<id>:<updated_at>`
//! (the edit's time as Gitea keeps it, RFC 3339 in UTC, so one per
//! distinct edit), an assignment `gitea:timeline:<entry id>`, any other
//! delivery `gitea:<delivery id>`, an issue as the poll saw it
//! `poll:<repo>:issue:<number>:<updated>`.

use std::time::Duration;

use prost::Message as _;
use time::OffsetDateTime;

use nisse_bus::{AgentName, Bus};
use nisse_proto::v1::{Actor, ActorKind, Envelope, GiteaComment, GiteaEvent};

use crate::api::{ApiError, Gitea};
use crate::shapes::{PullReviewComment, TimelineEntry, rfc3339};

/// Room kept for the headers a message is published with (its dedup id,
/// its type, the trace) beside its payload.
const HEADER_ROOM: usize = 1024;

/// The id of a comment's message, from whichever side it came.
pub(crate) fn comment_id(comment: i64) -> String {
    format!("gitea:comment:{comment}")
}

/// The id of an edit of a comment, from whichever side it came: the
/// comment and the time of the edit (Gitea's `updated_at`, whole
/// seconds), so each distinct edit has one id and the first version
/// keeps [`comment_id`].
pub(crate) fn comment_edit_id(comment: i64, updated: OffsetDateTime) -> String {
    format!("gitea:comment:{comment}:{}", rfc3339(Some(updated)))
}

/// The id of an assignment's message: its timeline entry.
pub(crate) fn timeline_id(entry: i64) -> String {
    format!("gitea:timeline:{entry}")
}

/// The envelope of an event on `agent`'s stream, from Gitea account
/// `sender` (whose words are data until the brain has checked who they
/// are).
pub(crate) fn envelope(agent: &AgentName, sender: &str, message_id: String) -> Envelope {
    Envelope {
        agent: agent.to_string(),
        actor: Some(Actor {
            kind: ActorKind::External as i32,
            // A snapshot the poll took has no one who did it: Gitea's.
            id: if sender.is_empty() {
                "gitea".to_string()
            } else {
                format!("gitea:{sender}")
            },
        }),
        message_id,
        ..Envelope::default()
    }
}

/// The newest assignment entry of issue `number`'s timeline that assigned
/// (or, `removed`, unassigned) someone, made by `by` when given and of
/// `assignee` when given.
pub(crate) async fn latest_assignment(
    gitea: &Gitea,
    repo: &str,
    number: u64,
    by: Option<&str>,
    assignee: Option<&str>,
    removed: bool,
) -> Result<Option<TimelineEntry>, ApiError> {
    let timeline = gitea.timeline(repo, number).await?;
    Ok(timeline
        .into_iter()
        .filter(|e| e.kind.is_assignment() && e.removed_assignee == removed)
        .filter(|e| by.is_none_or(|b| e.user.as_ref().is_some_and(|u| u.is(b))))
        .filter(|e| assignee.is_none_or(|a| e.assignee.as_ref().is_some_and(|u| u.is(a))))
        .max_by_key(|e| e.id))
}

/// Every inline comment of pull request `number`'s submitted reviews by
/// `reviewer` (every reviewer's when `None`), oldest first.
pub(crate) async fn review_comments(
    gitea: &Gitea,
    repo: &str,
    number: u64,
    reviewer: Option<&str>,
) -> Result<Vec<PullReviewComment>, ApiError> {
    let reviews = gitea.reviews(repo, number).await?;
    let mut out = Vec::new();
    for review in reviews {
        // A pending review is the reviewer's draft, not said yet; a
        // requested one holds nothing.
        if matches!(review.state.as_str(), "PENDING" | "REQUEST_REVIEW") {
            continue;
        }
        if reviewer.is_some_and(|r| !review.user.as_ref().is_some_and(|u| u.is(r))) {
            continue;
        }
        let comments = gitea.review_comments(repo, number, review.id).await?;
        out.extend(comments.into_iter().map(|mut c| {
            // Older Gitea leaves it out; the review it was read from is it.
            if c.pull_request_review_id == 0 {
                c.pull_request_review_id = review.id;
            }
            c
        }));
    }
    out.sort_by_key(|c| c.id);
    Ok(out)
}

/// An inline comment as its own event: `pull_request_review_comment`,
/// `created`, with `issue` and `pull` as `base` carries them.
pub(crate) fn inline_comment_event(
    agent: &AgentName,
    base: &GiteaEvent,
    comment: &PullReviewComment,
    number: u64,
) -> GiteaEvent {
    let c: GiteaComment = comment.to_proto(number);
    GiteaEvent {
        envelope: Some(envelope(agent, &c.author, comment_id(c.id))),
        source: base.source,
        delivery_id: base.delivery_id.clone(),
        event: "pull_request_review_comment".into(),
        action: "created".into(),
        repository: base.repository.clone(),
        sender: c.author.clone(),
        issue: base.issue.clone(),
        comment: Some(c),
        pull: base.pull.clone(),
        assignee: String::new(),
    }
}

/// The first of `events` that the NATS server would refuse as too large
/// (its `max_payload`), with its size and the limit.
pub(crate) fn too_large(bus: &Bus, events: &[GiteaEvent]) -> Option<(usize, usize, usize)> {
    let max = bus.client().server_info().max_payload;
    if max == 0 {
        // Not connected yet: the publish says so.
        return None;
    }
    events
        .iter()
        .enumerate()
        .map(|(i, e)| (i, e.encoded_len()))
        .find(|(_, len)| len + HEADER_ROOM > max)
        .map(|(i, len)| (i, len, max - HEADER_ROOM.min(max)))
}

/// Publishes `events` in order, each waiting for JetStream's ack, all
/// within `timeout`. Returns how many were stored already (duplicates:
/// as good as stored).
pub(crate) async fn publish_all(
    bus: &Bus,
    events: Vec<GiteaEvent>,
    timeout: Duration,
) -> Result<usize, String> {
    let total = events.len();
    let publishing = async {
        let mut duplicates = 0;
        for e in events {
            let published = bus.publish(e).await.map_err(|e| e.to_string())?;
            duplicates += usize::from(published.duplicate);
        }
        Ok(duplicates)
    };
    match tokio::time::timeout(timeout, publishing).await {
        Ok(result) => result,
        Err(_) => Err(format!(
            "JetStream did not store all {total} events within {}",
            humantime::format_duration(timeout)
        )),
    }
}
