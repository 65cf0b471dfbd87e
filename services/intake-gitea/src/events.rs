//! What the webhook receiver and the poll both make of Gitea: the
//! `GiteaEvent`s, their ids, what is read from the API to complete them,
//! and publishing them.
//!
//! **Ids say what a message is**, so the same thing seen twice is stored
//! once (within JetStream's duplicate window; the brain goes by the same
//! ids after it): a comment is `gitea:comment:<id>` whether a webhook or
//! the poll found it, each edit of it `gitea:comment:<id>:<updated_at>`
//! (the edit's time as Gitea keeps it, RFC 3339 in UTC, so one per
//! distinct edit), an assignment and a pull request's close, merge or
//! reopen `gitea:timeline:<entry id>`, a submitted review
//! `gitea:review:<review id>`, any other
//! delivery `gitea:<delivery id>`, an issue as the poll saw it
//! `poll:<repo>:issue:<number>:<updated>`.

use std::time::Duration;

use prost::Message as _;
use time::OffsetDateTime;

use nisse_bus::{AgentName, Bus};
use nisse_proto::v1::{
    Actor, ActorKind, Envelope, GiteaComment, GiteaEvent, GiteaIssue, GiteaPull,
};

use crate::api::{ApiError, Gitea};
use crate::shapes::{PullReview, PullReviewComment, TimelineEntry, rfc3339};

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

/// The id of an assignment's message, and of a pull request's closing,
/// merge or reopening: its timeline entry.
pub(crate) fn timeline_id(entry: i64) -> String {
    format!("gitea:timeline:{entry}")
}

/// The id of a submitted review's message (its verdict and text), from
/// whichever side it came.
pub(crate) fn review_id(review: i64) -> String {
    format!("gitea:review:{review}")
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
    comments_of(gitea, repo, number, &reviews, reviewer).await
}

/// The inline comments of those of `reviews` (of pull request `number`)
/// by `reviewer` (anyone's when `None`) that were submitted (a pending
/// review is the reviewer's draft, not said yet; a requested one holds
/// nothing), oldest first.
pub(crate) async fn comments_of(
    gitea: &Gitea,
    repo: &str,
    number: u64,
    reviews: &[PullReview],
    reviewer: Option<&str>,
) -> Result<Vec<PullReviewComment>, ApiError> {
    let mut out = Vec::new();
    for review in reviews {
        if review.event().is_none() || reviewer.is_some_and(|who| !review.by(who)) {
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

/// The review a webhook of `event` (`pull_request_review_approved`...)
/// by `reviewer` announced, among `reviews`: the reviewer's newest in
/// that state submitted by `until` (the payload's `updated_at`, when it
/// has one), its text `content` when one says so. Gitea's review payload
/// carries no review id, so this is how the webhook's review gets the id
/// the poll gives it.
pub(crate) fn announced_review<'a>(
    reviews: &'a [PullReview],
    event: &str,
    reviewer: &str,
    content: &str,
    until: Option<OffsetDateTime>,
) -> Option<&'a PullReview> {
    let candidates: Vec<&PullReview> = reviews
        .iter()
        .filter(|r| r.event() == Some(event) && r.by(reviewer))
        .filter(|r| until.is_none_or(|u| r.submitted_at.is_none_or(|s| s <= u)))
        .collect();
    candidates
        .iter()
        .filter(|r| r.body == content)
        .max_by_key(|r| r.id)
        .or_else(|| candidates.iter().max_by_key(|r| r.id))
        .copied()
}

/// What a pull request's state change is, by its timeline entry: closed
/// (merged or not) or reopened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StateChange {
    /// `close`: closed unmerged.
    Closed,
    /// `merge_pull`: merged, which closes it.
    Merged,
    /// `reopen`.
    Reopened,
}

impl StateChange {
    /// The change `entry` records, if it is one.
    pub(crate) fn of(entry: &TimelineEntry) -> Option<Self> {
        if entry.kind.is_close() {
            Some(Self::Closed)
        } else if entry.kind.is_merge() {
            Some(Self::Merged)
        } else if entry.kind.is_reopen() {
            Some(Self::Reopened)
        } else {
            None
        }
    }

    /// The change a `pull_request` webhook's `action` announces (`closed`
    /// with `merged` set is a merge), if it is one.
    pub(crate) fn announced(action: &str, merged: bool) -> Option<Self> {
        match action {
            "closed" if merged => Some(Self::Merged),
            "closed" => Some(Self::Closed),
            "reopened" => Some(Self::Reopened),
            _ => None,
        }
    }

    /// The webhook's `action` for it.
    pub(crate) fn action(self) -> &'static str {
        match self {
            Self::Closed | Self::Merged => "closed",
            Self::Reopened => "reopened",
        }
    }

    /// `issue` and `pull` as the change left them: the snapshot is read
    /// now, and a later change (a reopen after a close) must not show in
    /// the earlier one's event.
    pub(crate) fn apply(self, issue: &mut GiteaIssue, pull: &mut GiteaPull) {
        let state = match self {
            Self::Closed | Self::Merged => "closed",
            Self::Reopened => "open",
        };
        issue.state = state.to_string();
        pull.state = state.to_string();
        pull.merged = self == Self::Merged;
    }
}

/// The timeline entry of pull request `number` recording `change` by
/// `by`: the newest made by `until` (the payload's `updated_at`, when it
/// has one). Gitea's pull request payload names no entry, so this is how
/// the webhook's change gets the id the poll gives it.
pub(crate) async fn announced_change(
    gitea: &Gitea,
    repo: &str,
    number: u64,
    change: StateChange,
    by: &str,
    until: Option<OffsetDateTime>,
) -> Result<Option<TimelineEntry>, ApiError> {
    let timeline = gitea.timeline(repo, number).await?;
    Ok(timeline
        .into_iter()
        .filter(|e| StateChange::of(e) == Some(change))
        .filter(|e| e.user.as_ref().is_some_and(|u| u.is(by)))
        .filter(|e| until.is_none_or(|u| e.created_at.is_none_or(|c| c <= u)))
        .max_by_key(|e| e.id))
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

#[cfg(test)]
mod tests {
    use super::*;

    fn review(id: i64, by: &str, state: &str, body: &str, at: i64) -> PullReview {
        serde_json::from_value(serde_json::json!({
            "id": id, "user": {"login": by}, "state": state, "body": body,
            "submitted_at": OffsetDateTime::from_unix_timestamp(1_714_550_400 + at)
                .unwrap()
                .format(&time::format_description::well_known::Rfc3339)
                .unwrap(),
        }))
        .unwrap()
    }

    #[test]
    fn a_webhooks_review_is_the_reviewers_newest_in_its_state_by_its_time() {
        let reviews = [
            review(1, "alice", "REQUEST_CHANGES", "Not yet.", 0),
            review(2, "alice", "APPROVED", "", 5),
            review(3, "bob", "REQUEST_CHANGES", "No.", 6),
            review(4, "alice", "REQUEST_CHANGES", "Still not.", 9),
            review(5, "alice", "PENDING", "", 10),
        ];
        let at = |s: i64| OffsetDateTime::from_unix_timestamp(1_714_550_400 + s).ok();
        let found = |event, content, until| {
            announced_review(&reviews, event, "alice", content, until).map(|r| r.id)
        };
        let rejected = "pull_request_review_rejected";
        // Sent again late: its time and its text say which it was.
        assert_eq!(found(rejected, "Not yet.", at(1)), Some(1));
        assert_eq!(found(rejected, "Not yet.", at(20)), Some(1));
        assert_eq!(found(rejected, "Still not.", at(9)), Some(4));
        assert_eq!(found(rejected, "", at(20)), Some(4));
        assert_eq!(found("pull_request_review_approved", "", None), Some(2));
        assert_eq!(found("pull_request_review_comment", "", None), None);
    }

    #[test]
    fn state_changes_read_from_webhooks_and_timelines_alike() {
        assert_eq!(
            StateChange::announced("closed", true),
            Some(StateChange::Merged)
        );
        assert_eq!(
            StateChange::announced("closed", false),
            Some(StateChange::Closed)
        );
        assert_eq!(
            StateChange::announced("reopened", false),
            Some(StateChange::Reopened)
        );
        assert_eq!(StateChange::announced("edited", false), None);
        for (kind, change) in [
            (serde_json::json!("close"), StateChange::Closed),
            (serde_json::json!(2), StateChange::Closed),
            (serde_json::json!("merge_pull"), StateChange::Merged),
            (serde_json::json!(28), StateChange::Merged),
            (serde_json::json!("reopen"), StateChange::Reopened),
        ] {
            let entry: TimelineEntry =
                serde_json::from_value(serde_json::json!({"id": 1, "type": kind})).unwrap();
            assert_eq!(StateChange::of(&entry), Some(change), "{kind}");
        }
        let mut issue = GiteaIssue {
            state: "open".into(),
            ..GiteaIssue::default()
        };
        let mut pull = GiteaPull {
            state: "open".into(),
            merged: true,
            ..GiteaPull::default()
        };
        StateChange::Closed.apply(&mut issue, &mut pull);
        assert_eq!(
            (issue.state.as_str(), pull.state.as_str(), pull.merged),
            ("closed", "closed", false)
        );
        assert_eq!(StateChange::Merged.action(), "closed");
    }
}
