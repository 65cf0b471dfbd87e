//! A webhook delivery's event, from Gitea's headers and payload to what
//! the stream carries.
//!
//! Gitea names each delivery twice: `X-Gitea-Event` is the coarse name
//! (`issues` for an assignment too, `issue_comment` for a comment on a
//! pull request's conversation too, and `pull_request_comment` for a
//! *review* comment), `X-Gitea-Event-Type` the precise one
//! (`issue_assign`, `pull_request_comment` for the conversation,
//! `pull_request_review_comment` for a review), both from
//! `modules/webhook/type.go`. The precise one decides; the coarse one
//! stands in when a Gitea too old to send it does not.
//!
//! What the stream's `event` says: `issues`, `issue_comment` (on an issue
//! or on a pull request's conversation, `issue.is_pull` telling which),
//! `pull_request`, and for reviews `pull_request_review_approved`,
//! `pull_request_review_rejected`, `pull_request_review_comment` (action
//! `reviewed`, the review's text as the comment). Each inline comment of
//! a review is its own event `pull_request_review_comment` with action
//! `created`, read from the API, since Gitea's review payload holds only
//! the review's text.

use serde::Deserialize;
use serde::de::DeserializeOwned;
use time::OffsetDateTime;

use nisse_proto::v1::{GiteaComment, GiteaIssue, GiteaPull};

use crate::problem::{Kind, Problem};
use crate::shapes::{Comment, Issue, PullRequest, Repository, User};

/// The payload a delivery carries, by its event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shape {
    /// `IssuePayload`.
    Issue,
    /// `IssueCommentPayload`.
    IssueComment,
    /// `PullRequestPayload`.
    PullRequest,
    /// `PullRequestPayload` with its `review`.
    Review,
}

/// What a delivery is: its payload's shape and the event name the stream
/// gives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Kinded {
    pub shape: Shape,
    pub event: &'static str,
}

/// What Gitea's event headers name, or `None` for an event this service
/// does not take (a push, a release, a wiki page...).
pub(crate) fn classify(event_type: Option<&str>, event: Option<&str>) -> Option<Kinded> {
    let k = |shape, event| Some(Kinded { shape, event });
    match (event_type, event) {
        (Some(t), _) => match t {
            "issues" | "issue_assign" | "issue_label" | "issue_milestone" => {
                k(Shape::Issue, "issues")
            }
            "issue_comment" | "pull_request_comment" => k(Shape::IssueComment, "issue_comment"),
            "pull_request"
            | "pull_request_assign"
            | "pull_request_label"
            | "pull_request_milestone"
            | "pull_request_sync"
            | "pull_request_review_request" => k(Shape::PullRequest, "pull_request"),
            "pull_request_review_approved" => k(Shape::Review, "pull_request_review_approved"),
            "pull_request_review_rejected" => k(Shape::Review, "pull_request_review_rejected"),
            "pull_request_review_comment" => k(Shape::Review, "pull_request_review_comment"),
            _ => None,
        },
        (None, Some(e)) => match e {
            "issues" => k(Shape::Issue, "issues"),
            "issue_comment" => k(Shape::IssueComment, "issue_comment"),
            "pull_request" => k(Shape::PullRequest, "pull_request"),
            "pull_request_approved" => k(Shape::Review, "pull_request_review_approved"),
            "pull_request_rejected" => k(Shape::Review, "pull_request_review_rejected"),
            // The coarse name of a review comment (a conversation comment
            // is `issue_comment` there).
            "pull_request_comment" => k(Shape::Review, "pull_request_review_comment"),
            _ => None,
        },
        (None, None) => None,
    }
}

/// What else the event needs read from Gitea before it is published.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Need {
    /// Nothing: the payload says it all.
    Nothing,
    /// Who was (un)assigned: Gitea's payload shows the assignees after
    /// the change, not whom it changed, so the timeline tells.
    Assignee {
        /// An unassignment.
        removed: bool,
    },
    /// The review's inline comments, which the payload does not carry.
    ReviewComments,
}

/// A delivery's payload, read.
#[derive(Debug, Clone)]
pub(crate) struct Parsed {
    /// `owner/name`, as the payload writes it.
    pub repository: String,
    /// Who did it.
    pub sender: String,
    /// The payload's `action`.
    pub action: String,
    /// The issue or pull request's number.
    pub number: u64,
    pub issue: Option<GiteaIssue>,
    pub comment: Option<GiteaComment>,
    pub pull: Option<GiteaPull>,
    pub need: Need,
    /// When the comment last changed (Gitea's `updated_at`): an edit's
    /// identity, as the poll sees it too.
    pub comment_updated: Option<OffsetDateTime>,
    /// When the pull request last changed, as the payload shows it: no
    /// timeline entry or review after it is what the payload announces.
    pub pull_updated: Option<OffsetDateTime>,
}

#[derive(Deserialize)]
struct IssuePayload {
    action: String,
    issue: Issue,
    repository: Repository,
    sender: User,
}

#[derive(Deserialize)]
struct IssueCommentPayload {
    action: String,
    issue: Issue,
    comment: Comment,
    repository: Repository,
    sender: User,
    #[serde(default)]
    is_pull: bool,
}

#[derive(Deserialize)]
struct PullRequestPayload {
    action: String,
    pull_request: PullRequest,
    repository: Repository,
    sender: User,
    #[serde(default)]
    review: Option<ReviewPayload>,
}

#[derive(Deserialize)]
struct ReviewPayload {
    #[serde(default)]
    content: String,
}

fn read<T: DeserializeOwned>(body: &[u8], event: &str) -> Result<T, Problem> {
    let mut de = serde_json::Deserializer::from_slice(body);
    serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let at = if path == "." {
            String::new()
        } else {
            format!("{path}: ")
        };
        Problem::new(
            Kind::InvalidJson,
            format!(
                "{at}{} (a `{event}` payload as Gitea sends it)",
                e.into_inner()
            ),
        )
    })
}

/// Whether an assignment action needs its assignee read.
fn assignment(action: &str) -> Need {
    match action {
        "assigned" => Need::Assignee { removed: false },
        "unassigned" => Need::Assignee { removed: true },
        _ => Need::Nothing,
    }
}

/// Reads the payload of a delivery of `kinded`, naming the JSON path of
/// what is wrong.
pub(crate) fn parse(kinded: Kinded, body: &[u8]) -> Result<Parsed, Problem> {
    Ok(match kinded.shape {
        Shape::Issue => {
            let p: IssuePayload = read(body, kinded.event)?;
            Parsed {
                repository: p.repository.full_name,
                sender: p.sender.login,
                need: assignment(&p.action),
                action: p.action,
                number: p.issue.number,
                issue: Some(p.issue.to_proto()),
                comment: None,
                pull: None,
                comment_updated: None,
                pull_updated: None,
            }
        }
        Shape::IssueComment => {
            let p: IssueCommentPayload = read(body, kinded.event)?;
            let mut issue = p.issue.to_proto();
            issue.is_pull |= p.is_pull;
            Parsed {
                repository: p.repository.full_name,
                sender: p.sender.login,
                action: p.action,
                number: p.issue.number,
                comment: Some(p.comment.to_proto(p.issue.number)),
                comment_updated: p.comment.updated_at,
                pull_updated: None,
                issue: Some(issue),
                pull: None,
                need: Need::Nothing,
            }
        }
        Shape::PullRequest | Shape::Review => {
            let p: PullRequestPayload = read(body, kinded.event)?;
            let review = kinded.shape == Shape::Review;
            let comment = p
                .review
                .filter(|r| review && !r.content.is_empty())
                .map(|r| GiteaComment {
                    body: r.content,
                    author: p.sender.login.clone(),
                    issue_number: p.pull_request.number,
                    ..GiteaComment::default()
                });
            Parsed {
                repository: p.repository.full_name,
                sender: p.sender.login,
                need: if review {
                    Need::ReviewComments
                } else {
                    assignment(&p.action)
                },
                action: p.action,
                number: p.pull_request.number,
                issue: Some(p.pull_request.to_issue()),
                pull: Some(p.pull_request.to_proto()),
                comment,
                comment_updated: None,
                pull_updated: p.pull_request.updated_at,
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_precise_event_type_decides() {
        let c = |t, e| classify(t, e).map(|k| (k.shape, k.event));
        assert_eq!(
            c(Some("issue_assign"), Some("issues")),
            Some((Shape::Issue, "issues"))
        );
        // A conversation comment on a pull request.
        assert_eq!(
            c(Some("pull_request_comment"), Some("issue_comment")),
            Some((Shape::IssueComment, "issue_comment"))
        );
        // A review comment: the coarse name is `pull_request_comment`.
        assert_eq!(
            c(
                Some("pull_request_review_comment"),
                Some("pull_request_comment")
            ),
            Some((Shape::Review, "pull_request_review_comment"))
        );
        assert_eq!(
            c(None, Some("pull_request_comment")),
            Some((Shape::Review, "pull_request_review_comment"))
        );
        assert_eq!(
            c(None, Some("pull_request_approved")),
            Some((Shape::Review, "pull_request_review_approved"))
        );
        assert_eq!(c(Some("push"), Some("push")), None);
        assert_eq!(c(None, Some("release")), None);
        assert_eq!(c(None, None), None);
    }

    #[test]
    fn bad_payloads_name_the_field() {
        let kinded = classify(Some("issues"), None).unwrap();
        let p = parse(
            kinded,
            br#"{"action":"opened","issue":{"number":"one"},"repository":{"full_name":"a/b"},"sender":{"login":"x"}}"#,
        )
        .unwrap_err();
        assert_eq!(p.kind(), Kind::InvalidJson);
        assert!(p.detail().starts_with("issue.number: "), "{}", p.detail());
        let p = parse(kinded, br#"{"action":"opened"}"#).unwrap_err();
        assert!(p.detail().contains("issue"), "{}", p.detail());
        let p = parse(kinded, b"not json").unwrap_err();
        assert!(p.detail().contains("`issues` payload"), "{}", p.detail());
    }

    #[test]
    fn an_assignment_needs_its_assignee_and_a_review_its_comments() {
        let kinded = classify(Some("issue_assign"), None).unwrap();
        let p = parse(
            kinded,
            br#"{"action":"assigned","number":3,"issue":{"number":3,"assignees":[{"login":"nisse"}]},"repository":{"full_name":"a/b"},"sender":{"login":"alice"}}"#,
        )
        .unwrap();
        assert_eq!(p.need, Need::Assignee { removed: false });
        assert_eq!(p.issue.unwrap().assignees, ["nisse"]);

        let kinded = classify(Some("pull_request_review_rejected"), None).unwrap();
        let p = parse(
            kinded,
            br#"{"action":"reviewed","number":4,"pull_request":{"number":4,"head":{"ref":"m1","sha":"s"}},"repository":{"full_name":"a/b"},"sender":{"login":"alice"},"review":{"type":"pull_request_review_rejected","content":"not yet"}}"#,
        )
        .unwrap();
        assert_eq!(p.need, Need::ReviewComments);
        assert_eq!(p.comment.unwrap().body, "not yet");
        assert!(p.issue.unwrap().is_pull);
        assert_eq!(p.pull.unwrap().head, "m1");
    }
}
