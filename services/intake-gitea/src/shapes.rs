//! Gitea's JSON, as its API (`templates/swagger/v1_json.tmpl`) and its
//! webhooks (`modules/structs/hook.go`) write it, holding only the fields
//! this service reads, and how each becomes the bus's contract types.
//!
//! Webhook payloads embed the API's own `Issue`, `Comment`,
//! `PullRequest`, `User` and `Repository`, so one set of shapes serves
//! both. Gitea writes `null` for an empty list (`assignees`), so lists are
//! read as optional. Times are RFC 3339, as Go writes `time.Time`.

use serde::{Deserialize, Deserializer};
use time::OffsetDateTime;

use nisse_proto::v1::{GiteaCheck, GiteaChecks, GiteaComment, GiteaIssue, GiteaPull, GiteaReview};

/// A Gitea account (`User`).
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct User {
    /// The login, which everything names accounts by.
    pub login: String,
}

/// A label (`Label`).
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Label {
    pub name: String,
}

/// A repository (`Repository`).
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Repository {
    /// `owner/name`.
    pub full_name: String,
}

/// An issue or a pull request seen as an issue (`Issue`).
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Issue {
    pub number: u64,
    #[serde(default)]
    pub title: String,
    #[serde(default)]
    pub body: String,
    #[serde(default)]
    pub state: String,
    #[serde(default)]
    pub user: Option<User>,
    #[serde(default, deserialize_with = "nullable")]
    pub labels: Vec<Label>,
    #[serde(default, deserialize_with = "nullable")]
    pub assignees: Vec<User>,
    /// Set (`PullRequestMeta`) when the issue is a pull request; only
    /// whether it is set is read.
    #[serde(default)]
    pub pull_request: Option<serde::de::IgnoredAny>,
    #[serde(default)]
    pub html_url: String,
    #[serde(default, with = "time::serde::rfc3339::option")]
    pub updated_at: Option<OffsetDateTime>,
}

/// A comment on an issue or a pull request's conversation (`Comment`).
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Comment {
    pub id: i64,
    #[serde(default)]
    pub body: String,
    #[serde(default)]
    pub user: Option<User>,
    #[serde(default)]
    pub html_url: String,
    /// `<repo>/issues/<n>` for an issue's comment, empty on a pull request.
    #[serde(default)]
    pub issue_url: String,
    /// `<repo>/pulls/<n>` for a pull request's comment.
    #[serde(default)]
    pub pull_request_url: String,
    #[serde(default, with = "time::serde::rfc3339::option")]
    pub created_at: Option<OffsetDateTime>,
    #[serde(default, with = "time::serde::rfc3339::option")]
    pub updated_at: Option<OffsetDateTime>,
}

/// One side of a pull request (`PRBranchInfo`).
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Branch {
    /// The branch.
    #[serde(rename = "ref", default)]
    pub branch: String,
    #[serde(default)]
    pub sha: String,
    /// Gone (null) when a fork was deleted.
    #[serde(default)]
    pub repo: Option<Repository>,
}

/// A branch as the caller sees it (`Branch`): whether it is protected,
/// and what the caller's own account may do to it.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct BranchInfo {
    pub name: String,
    #[serde(default)]
    pub protected: bool,
    #[serde(default)]
    pub user_can_push: bool,
    #[serde(default)]
    pub user_can_merge: bool,
    #[serde(default)]
    pub required_approvals: i64,
    #[serde(default)]
    pub enable_status_check: bool,
    #[serde(default)]
    pub status_check_contexts: Option<Vec<String>>,
}

/// A pull request (`PullRequest`).
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct PullRequest {
    pub number: u64,
    #[serde(default)]
    pub title: String,
    #[serde(default)]
    pub body: String,
    #[serde(default)]
    pub state: String,
    #[serde(default)]
    pub user: Option<User>,
    #[serde(default, deserialize_with = "nullable")]
    pub labels: Vec<Label>,
    #[serde(default, deserialize_with = "nullable")]
    pub assignees: Vec<User>,
    #[serde(default)]
    pub html_url: String,
    #[serde(default)]
    pub merged: bool,
    #[serde(default)]
    pub head: Option<Branch>,
    #[serde(default)]
    pub base: Option<Branch>,
    #[serde(default, with = "time::serde::rfc3339::option")]
    pub updated_at: Option<OffsetDateTime>,
}

/// A review of a pull request (`PullReview`).
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct PullReview {
    pub id: i64,
    #[serde(default)]
    pub user: Option<User>,
    /// `APPROVED`, `PENDING`, `COMMENT`, `REQUEST_CHANGES`, `REQUEST_REVIEW`.
    #[serde(default)]
    pub state: String,
    /// Its summary (often empty for a review of inline comments only).
    #[serde(default)]
    pub body: String,
    #[serde(default)]
    pub html_url: String,
    /// When it was submitted (a pending review's is unset or Gitea's
    /// zero time).
    #[serde(default, with = "time::serde::rfc3339::option")]
    pub submitted_at: Option<OffsetDateTime>,
    /// The head commit it was given on.
    #[serde(default)]
    pub commit_id: String,
    /// Gitea's verdict that the head moved since it was given.
    #[serde(default)]
    pub stale: bool,
    #[serde(default)]
    pub dismissed: bool,
}

/// One commit status (`CommitStatus`; Gitea names its state `status`).
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct CommitStatus {
    #[serde(default)]
    pub context: String,
    #[serde(default)]
    pub status: String,
    #[serde(default)]
    pub description: String,
}

/// A commit's combined status (`CombinedStatus`): the latest status of
/// each context, and their combined state (empty without any status).
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct CombinedStatus {
    #[serde(default)]
    pub state: String,
    #[serde(default, deserialize_with = "nullable")]
    pub statuses: Vec<CommitStatus>,
}

impl CombinedStatus {
    /// As the contracts carry it.
    pub(crate) fn to_proto(&self) -> GiteaChecks {
        GiteaChecks {
            state: self.state.clone(),
            statuses: self
                .statuses
                .iter()
                .map(|s| GiteaCheck {
                    context: s.context.clone(),
                    state: s.status.clone(),
                    description: s.description.clone(),
                })
                .collect(),
        }
    }
}

/// The combined state of commit statuses as Gitea combines them
/// (`CommitStatusStates.Combine`): `failure` if any is `error` or
/// `failure`; `success` if there are some and all are `success`,
/// `warning` or `skipped`; else `pending`. For a combined status read in
/// more than one page, whose every page Gitea combined on its own.
pub(crate) fn combined_state<'a>(states: impl IntoIterator<Item = &'a str>) -> String {
    let (mut all, mut passed) = (0_usize, 0_usize);
    for state in states {
        all += 1;
        match state {
            "error" | "failure" => return "failure".into(),
            "success" | "warning" | "skipped" => passed += 1,
            _ => {}
        }
    }
    if all > 0 && passed == all {
        "success".into()
    } else {
        "pending".into()
    }
}

impl PullReview {
    /// The stream's event name for a submitted review in this state (the
    /// webhook's `X-Gitea-Event-Type`), or `None` for a draft
    /// (`PENDING`) or a request for review, which say nothing yet.
    pub(crate) fn event(&self) -> Option<&'static str> {
        match self.state.as_str() {
            "APPROVED" => Some("pull_request_review_approved"),
            "REQUEST_CHANGES" => Some("pull_request_review_rejected"),
            "COMMENT" => Some("pull_request_review_comment"),
            _ => None,
        }
    }

    /// As the contracts carry a review.
    pub(crate) fn to_proto(&self) -> GiteaReview {
        GiteaReview {
            id: self.id,
            reviewer: login(self.user.as_ref()),
            state: self.state.clone(),
            commit_id: self.commit_id.clone(),
            stale: self.stale,
            dismissed: self.dismissed,
        }
    }

    /// Whether `reviewer` wrote it.
    pub(crate) fn by(&self, reviewer: &str) -> bool {
        self.user.as_ref().is_some_and(|u| u.is(reviewer))
    }

    /// Its summary as the contracts carry a review's text (the comment of
    /// a review event), on pull request `number`; `None` when empty, as a
    /// webhook's review without text has none.
    pub(crate) fn to_comment(&self, number: u64) -> Option<GiteaComment> {
        (!self.body.is_empty()).then(|| GiteaComment {
            body: self.body.clone(),
            author: login(self.user.as_ref()),
            issue_number: number,
            review_id: self.id,
            html_url: self.html_url.clone(),
            created_at: timestamp(self.submitted_at),
            ..GiteaComment::default()
        })
    }
}

/// An inline comment of a review (`PullReviewComment`).
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct PullReviewComment {
    pub id: i64,
    #[serde(default)]
    pub body: String,
    #[serde(default)]
    pub user: Option<User>,
    #[serde(default)]
    pub pull_request_review_id: i64,
    #[serde(default)]
    pub path: String,
    /// The line in the new version (0 when on a removed line).
    #[serde(default)]
    pub position: u64,
    /// The line in the old version (0 when on the new side).
    #[serde(default)]
    pub original_position: u64,
    #[serde(default)]
    pub html_url: String,
    #[serde(default, with = "time::serde::rfc3339::option")]
    pub created_at: Option<OffsetDateTime>,
}

/// What an entry of an issue's timeline is. Gitea writes the name
/// (`assignees`); versions before 1.17 wrote the number (9).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TimelineKind(pub String);

impl TimelineKind {
    /// An assignment or an unassignment.
    pub(crate) fn is_assignment(&self) -> bool {
        self.0 == "assignees" || self.0 == "9"
    }

    /// Closed without a merge.
    pub(crate) fn is_close(&self) -> bool {
        self.0 == "close" || self.0 == "2"
    }

    /// Reopened.
    pub(crate) fn is_reopen(&self) -> bool {
        self.0 == "reopen" || self.0 == "1"
    }

    /// A pull request merged (which closes it: Gitea writes this entry,
    /// not a `close`).
    pub(crate) fn is_merge(&self) -> bool {
        self.0 == "merge_pull" || self.0 == "28"
    }

    /// A submitted review's own entry (its `review_id` names it).
    pub(crate) fn is_review(&self) -> bool {
        self.0 == "review" || self.0 == "22"
    }
}

impl<'de> Deserialize<'de> for TimelineKind {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Either {
            Name(String),
            Number(i64),
        }
        Ok(Self(match Either::deserialize(d)? {
            Either::Name(s) => s,
            Either::Number(n) => n.to_string(),
        }))
    }
}

/// An entry of an issue's timeline (`TimelineComment`).
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct TimelineEntry {
    pub id: i64,
    #[serde(rename = "type")]
    pub kind: TimelineKind,
    /// Who did it.
    #[serde(default)]
    pub user: Option<User>,
    /// For an assignment: who was assigned or unassigned.
    #[serde(default)]
    pub assignee: Option<User>,
    #[serde(default)]
    pub removed_assignee: bool,
    /// For a review's entry: the review.
    #[serde(default)]
    pub review_id: i64,
    #[serde(default, with = "time::serde::rfc3339::option")]
    pub created_at: Option<OffsetDateTime>,
}

/// Gitea's error document (`APIError`).
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct ApiError {
    #[serde(default)]
    pub message: String,
}

/// `null` read as the empty list.
fn nullable<'de, D, T>(d: D) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    Ok(Option::<Vec<T>>::deserialize(d)?.unwrap_or_default())
}

/// A time as the contracts carry it.
pub(crate) fn timestamp(t: Option<OffsetDateTime>) -> Option<prost_types::Timestamp> {
    t.map(|t| prost_types::Timestamp {
        seconds: t.unix_timestamp(),
        nanos: i32::try_from(t.nanosecond()).unwrap_or(0),
    })
}

/// A time as ids and cursors write it: RFC 3339 in UTC, so one instant is
/// always the same text.
pub(crate) fn rfc3339(t: Option<OffsetDateTime>) -> String {
    t.and_then(|t| {
        t.to_offset(time::UtcOffset::UTC)
            .format(&time::format_description::well_known::Rfc3339)
            .ok()
    })
    .unwrap_or_default()
}

fn login(user: Option<&User>) -> String {
    user.map(|u| u.login.clone()).unwrap_or_default()
}

impl User {
    /// Whether this is `account` (logins are not case-sensitive).
    pub(crate) fn is(&self, account: &str) -> bool {
        self.login.eq_ignore_ascii_case(account)
    }
}

impl Issue {
    /// As the contracts carry it.
    pub(crate) fn to_proto(&self) -> GiteaIssue {
        GiteaIssue {
            number: self.number,
            title: self.title.clone(),
            body: self.body.clone(),
            state: self.state.clone(),
            author: login(self.user.as_ref()),
            labels: self.labels.iter().map(|l| l.name.clone()).collect(),
            assignees: self.assignees.iter().map(|u| u.login.clone()).collect(),
            is_pull: self.pull_request.is_some(),
            html_url: self.html_url.clone(),
            updated_at: timestamp(self.updated_at),
        }
    }

    /// Whether `account` is among its assignees.
    pub(crate) fn assigned_to(&self, account: &str) -> bool {
        self.assignees.iter().any(|u| u.is(account))
    }
}

impl Comment {
    /// The number of the issue or pull request it is on, from its URLs
    /// (the API's comment carries no number of its own).
    pub(crate) fn issue_number(&self) -> Option<u64> {
        [&self.issue_url, &self.pull_request_url]
            .into_iter()
            .find(|u| !u.is_empty())
            .and_then(|u| u.trim_end_matches('/').rsplit('/').next())
            .and_then(|n| n.parse().ok())
    }

    /// As the contracts carry it, on issue `issue_number`.
    pub(crate) fn to_proto(&self, issue_number: u64) -> GiteaComment {
        GiteaComment {
            id: self.id,
            body: self.body.clone(),
            author: login(self.user.as_ref()),
            issue_number,
            html_url: self.html_url.clone(),
            created_at: timestamp(self.created_at),
            ..GiteaComment::default()
        }
    }
}

impl PullRequest {
    /// As the contracts carry it.
    pub(crate) fn to_proto(&self) -> GiteaPull {
        GiteaPull {
            number: self.number,
            title: self.title.clone(),
            head: self.head_branch().to_string(),
            base: self
                .base
                .as_ref()
                .map(|b| b.branch.clone())
                .unwrap_or_default(),
            state: self.state.clone(),
            merged: self.merged,
            head_sha: self
                .head
                .as_ref()
                .map(|b| b.sha.clone())
                .unwrap_or_default(),
            html_url: self.html_url.clone(),
            author: login(self.user.as_ref()),
            body: self.body.clone(),
        }
    }

    /// The pull request seen as the issue it also is.
    pub(crate) fn to_issue(&self) -> GiteaIssue {
        GiteaIssue {
            number: self.number,
            title: self.title.clone(),
            body: self.body.clone(),
            state: self.state.clone(),
            author: login(self.user.as_ref()),
            labels: self.labels.iter().map(|l| l.name.clone()).collect(),
            assignees: self.assignees.iter().map(|u| u.login.clone()).collect(),
            is_pull: true,
            html_url: self.html_url.clone(),
            updated_at: timestamp(self.updated_at),
        }
    }

    /// Its head branch.
    pub(crate) fn head_branch(&self) -> &str {
        self.head.as_ref().map_or("", |b| b.branch.as_str())
    }

    /// Whether its head is `branch` of `repo` itself (not of a fork).
    pub(crate) fn is_head(&self, repo: &str, branch: &str) -> bool {
        self.head.as_ref().is_some_and(|h| {
            h.branch == branch
                && h.repo
                    .as_ref()
                    .is_none_or(|r| r.full_name.eq_ignore_ascii_case(repo))
        })
    }

    /// Whether `account` opened it.
    pub(crate) fn by(&self, account: &str) -> bool {
        self.user.as_ref().is_some_and(|u| u.is(account))
    }
}

impl PullReviewComment {
    /// As the contracts carry it, on pull request `pull_number`.
    pub(crate) fn to_proto(&self, pull_number: u64) -> GiteaComment {
        GiteaComment {
            id: self.id,
            body: self.body.clone(),
            author: login(self.user.as_ref()),
            issue_number: pull_number,
            path: self.path.clone(),
            line: i64::try_from(self.position).unwrap_or(0),
            review_id: self.pull_request_review_id,
            html_url: self.html_url.clone(),
            created_at: timestamp(self.created_at),
            old_line: i64::try_from(self.original_position).unwrap_or(0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_issue_with_null_lists_and_a_pull_request_reads() {
        let issue: Issue = serde_json::from_value(serde_json::json!({
            "id": 7, "number": 3, "title": "Fix it", "body": "b", "state": "open",
            "user": {"id": 1, "login": "alice"},
            "labels": [{"id": 1, "name": "bug", "color": "ee0701"}],
            "assignees": null,
            "pull_request": {"merged": false, "merged_at": null, "draft": false, "html_url": "h"},
            "html_url": "https://git.example.org/alice/p/pulls/3",
            "updated_at": "2024-05-01T10:00:00+02:00"
        }))
        .unwrap();
        let p = issue.to_proto();
        assert_eq!(p.number, 3);
        assert_eq!(p.author, "alice");
        assert_eq!(p.labels, ["bug"]);
        assert!(p.assignees.is_empty());
        assert!(p.is_pull);
        assert_eq!(p.updated_at.unwrap().seconds, 1_714_550_400);
        assert_eq!(rfc3339(issue.updated_at), "2024-05-01T08:00:00Z");
    }

    #[test]
    fn a_comment_knows_its_issue_from_its_urls() {
        let c: Comment = serde_json::from_value(serde_json::json!({
            "id": 12, "body": "hi", "user": {"login": "bob"},
            "issue_url": "", "pull_request_url": "https://git.example.org/alice/p/pulls/4",
            "created_at": "2024-05-01T08:00:00Z", "updated_at": "2024-05-01T08:00:00Z"
        }))
        .unwrap();
        assert_eq!(c.issue_number(), Some(4));
        assert_eq!(c.to_proto(4).author, "bob");
    }

    #[test]
    fn timeline_kinds_read_as_names_and_numbers() {
        for kind in [serde_json::json!("assignees"), serde_json::json!(9)] {
            let e: TimelineEntry = serde_json::from_value(serde_json::json!({
                "id": 5, "type": kind, "user": {"login": "alice"},
                "assignee": {"login": "nisse"}, "removed_assignee": false,
                "created_at": "2024-05-01T08:00:00Z"
            }))
            .unwrap();
            assert!(e.kind.is_assignment());
        }
    }

    #[test]
    fn reviews_and_statuses_read_as_gitea_writes_them() {
        let r: PullReview = serde_json::from_value(serde_json::json!({
            "id": 4, "user": {"login": "alice"}, "state": "APPROVED", "body": "",
            "commit_id": "abc", "stale": true, "official": true, "dismissed": false
        }))
        .unwrap();
        let p = r.to_proto();
        assert_eq!(
            (p.reviewer.as_str(), p.commit_id.as_str()),
            ("alice", "abc")
        );
        assert!(p.stale && !p.dismissed);
        // No status reported: Gitea's empty combined status.
        let none: CombinedStatus = serde_json::from_value(serde_json::json!({
            "state": "", "sha": "", "total_count": 0, "statuses": null,
            "repository": null, "commit_url": "", "url": ""
        }))
        .unwrap();
        assert_eq!(none.to_proto(), GiteaChecks::default());
        let some: CombinedStatus = serde_json::from_value(serde_json::json!({
            "state": "failure", "sha": "abc", "total_count": 1,
            "statuses": [{"id": 1, "status": "error", "context": "ci", "description": "boom"}]
        }))
        .unwrap();
        assert_eq!(some.to_proto().statuses[0].state, "error");
        assert_eq!(combined_state(["success", "skipped"]), "success");
        assert_eq!(combined_state(["success", "pending"]), "pending");
        assert_eq!(combined_state(["pending", "error"]), "failure");
        assert_eq!(combined_state([]), "pending");
    }

    #[test]
    fn a_pull_request_knows_its_head() {
        let pr: PullRequest = serde_json::from_value(serde_json::json!({
            "number": 9, "state": "open", "user": {"login": "Nisse"},
            "head": {"label": "m1", "ref": "nisse/m1", "sha": "abc", "repo": {"full_name": "alice/p"}},
            "base": {"ref": "main", "sha": "def", "repo": {"full_name": "alice/p"}},
            "merged": false
        }))
        .unwrap();
        assert!(pr.is_head("Alice/P", "nisse/m1"));
        assert!(!pr.is_head("bob/p", "nisse/m1"));
        assert!(pr.by("nisse"));
        let p = pr.to_proto();
        assert_eq!((p.head.as_str(), p.base.as_str()), ("nisse/m1", "main"));
        assert_eq!(p.head_sha, "abc");
    }
}
