//! The JSON shapes of Gitea's API (`modules/structs`: User, Repository,
//! Label, Issue, Comment, TimelineComment, PullRequest, PullReview,
//! PullReviewComment, ChangedFile, Branch, CommitStatus, CombinedStatus),
//! every field Gitea sends, the ones a client reads filled in from the
//! stand-in's state and the rest with the values Gitea gives them when
//! unused (`null`, `""`, `0`, `false`, the Unix epoch for unset times).

use serde_json::{Value, json};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use super::git::{ChangedFile, CommitInfo, PullGit};
use super::{EventKind, EventRec, IssueRec, RepoRec, ReviewRec, Shared, State, StatusRec};

/// A time as Gitea writes it: RFC 3339, whole seconds.
pub(crate) fn ts(t: OffsetDateTime) -> String {
    t.format(&Rfc3339)
        .unwrap_or_else(|e| unreachable!("every OffsetDateTime formats as RFC 3339: {e}"))
}

/// Go's zero time, which Gitea writes for a user's `last_login` when
/// unknown.
const ZERO_TIME: &str = "0001-01-01T00:00:00Z";

/// Unix time 0, which Gitea writes for unset timestamps.
const EPOCH: &str = "1970-01-01T00:00:00Z";

pub(crate) fn repo_html(shared: &Shared, repo: &RepoRec) -> String {
    format!("{}/{}/{}", shared.base_url, repo.owner, repo.name)
}

pub(crate) fn repo_api(shared: &Shared, repo: &RepoRec) -> String {
    format!(
        "{}/api/v1/repos/{}/{}",
        shared.base_url, repo.owner, repo.name
    )
}

pub(crate) fn ssh_url(shared: &Shared, repo: &RepoRec) -> String {
    format!("{}{}", shared.ssh_base, repo.path.display())
}

/// The web page of an issue, or of a pull request under `pulls/`.
pub(crate) fn issue_html(shared: &Shared, repo: &RepoRec, issue: &IssueRec) -> String {
    let kind = if issue.pull.is_some() {
        "pulls"
    } else {
        "issues"
    };
    format!("{}/{kind}/{}", repo_html(shared, repo), issue.number)
}

/// A User. Unknown logins (never the case for what the stand-in stores)
/// come out as Gitea's ghost user.
pub(crate) fn user(shared: &Shared, state: &State, login: &str) -> Value {
    let Some(u) = state.user(login) else {
        return json!({"id": -1, "login": "Ghost", "username": "Ghost", "full_name": ""});
    };
    json!({
        "id": u.id,
        "login": u.login,
        "login_name": "",
        "source_id": 0,
        "full_name": "",
        "email": format!("{}@noreply.localhost", u.login),
        "avatar_url": format!("{}/avatars/{}", shared.base_url, u.login),
        "html_url": format!("{}/{}", shared.base_url, u.login),
        "language": "",
        "is_admin": false,
        "last_login": ZERO_TIME,
        "created": ts(u.created),
        "restricted": false,
        "active": true,
        "prohibit_login": false,
        "location": "",
        "website": "",
        "description": "",
        "visibility": "public",
        "followers_count": 0,
        "following_count": 0,
        "starred_repos_count": 0,
        "username": u.login,
    })
}

/// A Repository, with the permissions `viewer` has on it (its owner is
/// its admin; everyone else may push, as a collaborator with write).
pub(crate) fn repo(shared: &Shared, state: &State, repo: &RepoRec, viewer: &str) -> Value {
    let html = repo_html(shared, repo);
    let in_repo = || state.issues.iter().filter(|i| i.repo == repo.id);
    let open_issues = in_repo()
        .filter(|i| i.pull.is_none() && i.closed_at.is_none())
        .count();
    let open_pulls = in_repo()
        .filter(|i| i.pull.is_some() && i.closed_at.is_none())
        .count();
    let mut value = json!({
        "id": repo.id,
        "owner": user(shared, state, &repo.owner),
        "name": repo.name,
        "full_name": format!("{}/{}", repo.owner, repo.name),
        "description": "",
        "empty": false,
        "private": true,
        "fork": false,
        "template": false,
        "parent": null,
        "mirror": false,
        "size": 0,
        "language": "",
        "languages_url": format!("{}/languages", repo_api(shared, repo)),
        "html_url": html,
        "url": repo_api(shared, repo),
        "link": "",
        "ssh_url": ssh_url(shared, repo),
        "clone_url": format!("{html}.git"),
        "original_url": "",
        "website": "",
        "stars_count": 0,
        "forks_count": 0,
        "watchers_count": 0,
        "open_issues_count": open_issues,
        "open_pr_counter": open_pulls,
        "release_counter": 0,
        "default_branch": repo.default_branch,
        "archived": false,
        "created_at": ts(repo.created),
        "updated_at": ts(repo.created),
        "archived_at": EPOCH,
        "permissions": {
            "admin": viewer == repo.owner,
            "push": true,
            "pull": true,
        },
    });
    // In two parts: one json! of every field is past the macro's
    // recursion limit.
    let settings = json!({
        "has_issues": true,
        "internal_tracker": {
            "enable_time_tracker": false,
            "allow_only_contributors_to_track_time": true,
            "enable_issue_dependencies": true,
        },
        "has_wiki": false,
        "has_pull_requests": true,
        "has_projects": false,
        "has_releases": false,
        "has_packages": false,
        "has_actions": false,
        "ignore_whitespace_conflicts": false,
        "allow_merge_commits": true,
        "allow_rebase": false,
        "allow_rebase_explicit": false,
        "allow_squash_merge": false,
        "allow_fast_forward_only_merge": false,
        "allow_rebase_update": true,
        "default_delete_branch_after_merge": false,
        "default_merge_style": "merge",
        "default_allow_maintainer_edit": false,
        "avatar_url": "",
        "internal": false,
        "mirror_interval": "",
        "object_format_name": "sha1",
        "mirror_updated": EPOCH,
        "repo_transfer": null,
        "topics": [],
        "licenses": [],
    });
    if let (Value::Object(all), Value::Object(more)) = (&mut value, settings) {
        all.extend(more);
    }
    value
}

fn labels(shared: &Shared, repo: &RepoRec, names: &[String]) -> Value {
    let api = repo_api(shared, repo);
    names
        .iter()
        .filter_map(|name| repo.labels.iter().find(|l| &l.name == name))
        .map(|l| {
            json!({
                "id": l.id,
                "name": l.name,
                "exclusive": false,
                "is_archived": false,
                "color": l.color,
                "description": "",
                "url": format!("{api}/labels/{}", l.id),
            })
        })
        .collect()
}

/// `assignees` is `null` without any, as Gitea leaves the list unset;
/// `assignee` (deprecated) is the first.
fn assignees(shared: &Shared, state: &State, issue: &IssueRec) -> (Value, Value) {
    if issue.assignees.is_empty() {
        return (Value::Null, Value::Null);
    }
    let all: Vec<Value> = issue
        .assignees
        .iter()
        .map(|a| user(shared, state, a))
        .collect();
    (all[0].clone(), Value::Array(all))
}

/// An Issue (a pull request's issue has `pull_request` set).
pub(crate) fn issue(shared: &Shared, state: &State, issue: &IssueRec) -> Value {
    let Some(repo) = state.repo(issue.repo) else {
        return Value::Null;
    };
    let html = issue_html(shared, repo, issue);
    let (assignee, assignees) = assignees(shared, state, issue);
    let pull_request = issue.pull.as_ref().map(|p| {
        json!({
            "merged": p.merged.is_some(),
            "merged_at": p.merged.as_ref().map(|m| ts(m.at)),
            "draft": false,
            "html_url": html,
        })
    });
    json!({
        "id": issue.id,
        "url": format!("{}/issues/{}", repo_api(shared, repo), issue.number),
        "html_url": html,
        "number": issue.number,
        "user": user(shared, state, &issue.user),
        "original_author": "",
        "original_author_id": 0,
        "title": issue.title,
        "body": issue.body,
        "ref": "",
        "assets": [],
        "labels": labels(shared, repo, &issue.labels),
        "milestone": null,
        "assignee": assignee,
        "assignees": assignees,
        "state": if issue.closed_at.is_some() { "closed" } else { "open" },
        "is_locked": false,
        "comments": state.comment_count(issue.repo, issue.number),
        "created_at": ts(issue.created),
        "updated_at": ts(issue.updated),
        "closed_at": issue.closed_at.map(ts),
        "due_date": null,
        "time_estimate": 0,
        "pull_request": pull_request,
        "repository": {
            "id": repo.id,
            "name": repo.name,
            "owner": repo.owner,
            "full_name": format!("{}/{}", repo.owner, repo.name),
        },
        "pin_order": 0,
    })
}

/// A PullRequest, its branches as `git` read them.
pub(crate) fn pull(shared: &Shared, state: &State, issue: &IssueRec, git: &PullGit) -> Value {
    let (Some(repo), Some(pull)) = (state.repo(issue.repo), issue.pull.as_ref()) else {
        return Value::Null;
    };
    let html = issue_html(shared, repo, issue);
    let (assignee, assignees) = assignees(shared, state, issue);
    let review_comments = state
        .events
        .iter()
        .filter(|e| e.repo == issue.repo && e.number == issue.number)
        .filter(|e| matches!(e.kind, EventKind::Code { .. }))
        .count();
    let branch = |name: &str, sha: &str| {
        json!({
            "label": name,
            "ref": name,
            "sha": sha,
            "repo_id": repo.id,
            "repo": self::repo(shared, state, repo, &issue.user),
        })
    };
    json!({
        "id": pull.id,
        "url": html,
        "number": issue.number,
        "user": user(shared, state, &issue.user),
        "title": issue.title,
        "body": issue.body,
        "labels": labels(shared, repo, &issue.labels),
        "milestone": null,
        "assignee": assignee,
        "assignees": assignees,
        "requested_reviewers": null,
        "requested_reviewers_teams": null,
        "state": if issue.closed_at.is_some() { "closed" } else { "open" },
        "draft": false,
        "is_locked": false,
        "comments": state.comment_count(issue.repo, issue.number),
        "review_comments": review_comments,
        "additions": git.additions(),
        "deletions": git.deletions(),
        "changed_files": git.files.len(),
        "html_url": html,
        "diff_url": format!("{html}.diff"),
        "patch_url": format!("{html}.patch"),
        "mergeable": pull.merged.is_none() && git.mergeable,
        "merged": pull.merged.is_some(),
        "merged_at": pull.merged.as_ref().map(|m| ts(m.at)),
        "merge_commit_sha": pull.merged.as_ref().map(|m| m.commit.clone()),
        "merged_by": pull.merged.as_ref().map(|m| user(shared, state, &m.by)),
        "allow_maintainer_edit": false,
        "base": branch(&pull.base, &git.base_sha),
        "head": branch(&pull.head, &git.head_sha),
        "merge_base": git.merge_base,
        "due_date": null,
        "created_at": ts(issue.created),
        "updated_at": ts(issue.updated),
        "closed_at": issue.closed_at.map(ts),
        "pin_order": 0,
    })
}

/// The URLs every comment-like object carries: its own page, and the
/// issue's or the pull request's page (the other one empty).
fn comment_urls(shared: &Shared, state: &State, event: &EventRec) -> (String, String, String) {
    let (Some(repo), Some(issue)) = (
        state.repo(event.repo),
        state.issue(event.repo, event.number),
    ) else {
        return Default::default();
    };
    let page = issue_html(shared, repo, issue);
    let html = format!("{page}#issuecomment-{}", event.id);
    if issue.pull.is_some() {
        (html, page, String::new())
    } else {
        (html, String::new(), page)
    }
}

/// A Comment (a plain one).
pub(crate) fn comment(shared: &Shared, state: &State, event: &EventRec) -> Value {
    let (html, pull_url, issue_url) = comment_urls(shared, state, event);
    let body = match &event.kind {
        EventKind::Comment { body } => body.as_str(),
        _ => "",
    };
    json!({
        "id": event.id,
        "html_url": html,
        "pull_request_url": pull_url,
        "issue_url": issue_url,
        "user": user(shared, state, &event.user),
        "original_author": "",
        "original_author_id": 0,
        "body": body,
        "assets": [],
        "created_at": ts(event.created),
        "updated_at": ts(event.updated),
    })
}

/// A TimelineComment: any entry of an issue's timeline.
pub(crate) fn timeline(shared: &Shared, state: &State, event: &EventRec) -> Value {
    let (html, pull_url, issue_url) = comment_urls(shared, state, event);
    let mut entry = json!({
        "id": event.id,
        "type": event.kind.type_name(),
        "html_url": html,
        "pull_request_url": pull_url,
        "issue_url": issue_url,
        "user": user(shared, state, &event.user),
        "body": "",
        "created_at": ts(event.created),
        "updated_at": ts(event.updated),
        "old_project_id": 0,
        "project_id": 0,
        "old_milestone": null,
        "milestone": null,
        "tracked_time": null,
        "old_title": "",
        "new_title": "",
        "old_ref": "",
        "new_ref": "",
        "ref_issue": null,
        "ref_comment": null,
        "ref_action": "",
        "ref_commit_sha": "",
        "review_id": 0,
        "label": null,
        "assignee": null,
        "assignee_team": null,
        "removed_assignee": false,
        "resolve_doer": null,
        "dependent_issue": null,
    });
    match &event.kind {
        EventKind::Comment { body } => entry["body"] = json!(body),
        EventKind::Assignees { assignee, removed } => {
            entry["assignee"] = user(shared, state, assignee);
            entry["removed_assignee"] = json!(removed);
        }
        EventKind::Label { label, added } => {
            // Gitea's label entry says "1" in its body when the label was
            // added and nothing when it was removed.
            entry["body"] = json!(if *added { "1" } else { "" });
            if let Some(repo) = state.repo(event.repo) {
                entry["label"] = labels(shared, repo, std::slice::from_ref(label))
                    .as_array()
                    .and_then(|l| l.first().cloned())
                    .unwrap_or(Value::Null);
            }
        }
        EventKind::AddDependency { number } => {
            entry["dependent_issue"] = state
                .issue(event.repo, *number)
                .map_or(Value::Null, |i| issue(shared, state, i));
        }
        EventKind::Review { review, body } => {
            entry["review_id"] = json!(review);
            entry["body"] = json!(body);
        }
        EventKind::Code { review, body, .. } => {
            entry["review_id"] = json!(review);
            entry["body"] = json!(body);
        }
        EventKind::MergePull { commit } => entry["ref_commit_sha"] = json!(commit),
        EventKind::Close | EventKind::Reopen => {}
    }
    entry
}

/// A PullReview, `stale` when the pull request's `head` moved past the
/// commit it was given on (as Gitea marks reviews stale on a push), and
/// `official` while it is its reviewer's latest verdict.
pub(crate) fn review(shared: &Shared, state: &State, review: &ReviewRec, head: &str) -> Value {
    let page = match (
        state.repo(review.repo),
        state.issue(review.repo, review.number),
    ) {
        (Some(repo), Some(issue)) => issue_html(shared, repo, issue),
        _ => String::new(),
    };
    let code_comments = state
        .events
        .iter()
        .filter(|e| matches!(&e.kind, EventKind::Code { review: r, .. } if *r == review.id))
        .count();
    json!({
        "id": review.id,
        "user": user(shared, state, &review.user),
        "team": null,
        "state": review.state.as_str(),
        "body": review.body,
        "commit_id": review.commit_id,
        "stale": !head.is_empty() && review.commit_id != head,
        "official": state.official(review),
        "dismissed": false,
        "comments_count": code_comments,
        "submitted_at": ts(review.created),
        "updated_at": ts(review.created),
        "html_url": format!("{page}#issuecomment-{}", review.event),
        "pull_request_url": page,
    })
}

/// A PullReviewComment: an inline comment. Gitea's `position` is the line
/// of the new file and `original_position` the line of the old one, the
/// other 0.
pub(crate) fn review_comment(shared: &Shared, state: &State, event: &EventRec) -> Value {
    let EventKind::Code {
        review,
        path,
        line,
        body,
        commit_id,
        diff_hunk,
    } = &event.kind
    else {
        return Value::Null;
    };
    let page = match (
        state.repo(event.repo),
        state.issue(event.repo, event.number),
    ) {
        (Some(repo), Some(issue)) => issue_html(shared, repo, issue),
        _ => String::new(),
    };
    json!({
        "id": event.id,
        "body": body,
        "user": user(shared, state, &event.user),
        "resolver": null,
        "pull_request_review_id": review,
        "created_at": ts(event.created),
        "updated_at": ts(event.updated),
        "path": path,
        "commit_id": commit_id,
        "original_commit_id": commit_id,
        "diff_hunk": diff_hunk,
        "position": if *line > 0 { *line } else { 0 },
        "original_position": if *line < 0 { -*line } else { 0 },
        "html_url": format!("{page}/files#issuecomment-{}", event.id),
        "pull_request_url": page,
    })
}

/// A ChangedFile, its links at the head commit.
pub(crate) fn changed_file(
    shared: &Shared,
    repo: &RepoRec,
    head: &str,
    file: &ChangedFile,
) -> Value {
    let html = repo_html(shared, repo);
    let mut value = json!({
        "filename": file.filename,
        "status": file.status,
        "additions": file.additions,
        "deletions": file.deletions,
        "changes": file.additions + file.deletions,
        "html_url": format!("{html}/src/commit/{head}/{}", file.filename),
        "contents_url": format!("{}/contents/{}?ref={head}", repo_api(shared, repo), file.filename),
        "raw_url": format!("{html}/raw/commit/{head}/{}", file.filename),
    });
    // `previous_filename` is omitted when empty.
    if let Some(previous) = &file.previous_filename {
        value["previous_filename"] = json!(previous);
    }
    value
}

/// A Branch, as `viewer` sees it: its protection, and what the viewer's
/// account may do to it (Gitea computes `user_can_push` and
/// `user_can_merge` for the caller).
pub(crate) fn branch(
    shared: &Shared,
    repo: &RepoRec,
    name: &str,
    commit: &CommitInfo,
    viewer: &str,
) -> Value {
    let rule = &repo.protection;
    let protected = rule.enabled && name == repo.default_branch;
    let person = |(n, e): &(String, String)| json!({ "name": n, "email": e, "username": "" });
    json!({
        "name": name,
        "commit": {
            "id": commit.id,
            "message": commit.message,
            "url": format!("{}/commit/{}", repo_html(shared, repo), commit.id),
            "author": person(&commit.author),
            "committer": person(&commit.committer),
            "verification": null,
            "timestamp": commit.timestamp,
            "added": null,
            "removed": null,
            "modified": null,
        },
        "protected": protected,
        "required_approvals": if protected { rule.required_approvals } else { 0 },
        "enable_status_check": protected && !rule.status_check_contexts.is_empty(),
        "status_check_contexts": if protected { rule.status_check_contexts.clone() } else { Vec::new() },
        "user_can_push": !protected || rule.may_push(viewer),
        "user_can_merge": !protected || rule.may_merge(viewer),
        "effective_branch_protection_name": if protected { name } else { "" },
    })
}

/// A CommitStatus (its state is under `status`, as Gitea names it).
pub(crate) fn commit_status(
    shared: &Shared,
    state: &State,
    repo: &RepoRec,
    status: &StatusRec,
) -> Value {
    json!({
        "id": status.index,
        "status": status.state,
        "target_url": status.target_url,
        "description": status.description,
        "url": format!("{}/statuses/{}", repo_api(shared, repo), status.sha),
        "context": status.context,
        "creator": user(shared, state, &status.creator),
        "created_at": ts(status.created),
        "updated_at": ts(status.created),
    })
}

/// A CombinedStatus of commit `sha` from the latest status of each of its
/// contexts (one page of them), as `viewer` sees the repository. Without
/// any it is Gitea's empty one: no state, no sha, no list.
pub(crate) fn combined_status(
    shared: &Shared,
    state: &State,
    repo: &RepoRec,
    sha: &str,
    statuses: &[&StatusRec],
    viewer: &str,
) -> Value {
    if statuses.is_empty() {
        return json!({
            "state": "",
            "sha": "",
            "total_count": 0,
            "statuses": null,
            "repository": null,
            "commit_url": "",
            "url": "",
        });
    }
    json!({
        "state": super::combined_state(statuses.iter().map(|s| s.state.as_str())),
        "sha": sha,
        "total_count": statuses.len(),
        "statuses": statuses
            .iter()
            .map(|s| commit_status(shared, state, repo, s))
            .collect::<Vec<_>>(),
        "repository": self::repo(shared, state, repo, viewer),
        "commit_url": "",
        "url": "",
    })
}
