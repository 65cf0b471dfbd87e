//! What changes the stand-in's state, whether an API request or a test's
//! control asked for it: each change is checked as Gitea checks it, made,
//! put on the timeline and announced with the webhook Gitea sends for it.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::sync::oneshot;

use super::git::{self, PullGit};
use super::{
    EventKind, Merge, ReviewRec, ReviewState, Shared, State, StatusRec, combined_state,
    json as shapes, now,
};

/// An error as Gitea's API answers it: a status and
/// `{"message": ..., "url": <the API description>}`, 404s with an
/// `errors` list too.
#[derive(Debug)]
pub(crate) struct ApiError {
    pub(crate) status: StatusCode,
    pub(crate) message: String,
    pub(crate) errors: Option<Vec<String>>,
}

impl ApiError {
    pub(crate) fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            errors: None,
        }
    }

    /// 404 as Gitea's `APIErrorNotFound` writes it, `what` saying what
    /// was missing.
    pub(crate) fn not_found(what: impl Into<String>) -> Self {
        Self {
            status: StatusCode::NOT_FOUND,
            message: "not found".into(),
            errors: Some(vec![what.into()]),
        }
    }

    pub(crate) fn unprocessable(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNPROCESSABLE_ENTITY, message)
    }

    pub(crate) fn into_response_with(self, base_url: &str) -> Response {
        let mut body = json!({
            "message": self.message,
            "url": format!("{base_url}/api/swagger"),
        });
        if let Some(errors) = self.errors {
            body["errors"] = json!(errors);
        }
        json_response(self.status, &body)
    }
}

/// A JSON body as Gitea answers one (`application/json;charset=utf-8`).
pub(crate) fn json_response(status: StatusCode, body: &Value) -> Response {
    (
        status,
        [(
            axum::http::header::CONTENT_TYPE,
            "application/json;charset=utf-8",
        )],
        body.to_string(),
    )
        .into_response()
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.status.as_u16(), self.message)?;
        if let Some(errors) = &self.errors {
            write!(f, ": {}", errors.join("; "))?;
        }
        Ok(())
    }
}

impl std::error::Error for ApiError {}

impl From<anyhow::Error> for ApiError {
    fn from(e: anyhow::Error) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, format!("{e:#}"))
    }
}

/// The webhooks a change queued; awaiting it waits until each was
/// attempted.
#[must_use = "a control waits for its webhooks; an API handler lets them go"]
pub(crate) struct Sent(Vec<oneshot::Receiver<()>>);

impl Sent {
    pub(crate) async fn delivered(self) {
        for wait in self.0 {
            // A stopped worker means the stand-in is going away.
            let _ = wait.await;
        }
    }
}

fn repo_of(state: &State, repo: i64) -> Result<&super::RepoRec, ApiError> {
    state
        .repo(repo)
        .ok_or_else(|| ApiError::not_found(format!("repository does not exist [id: {repo}]")))
}

fn issue_of(state: &State, repo: i64, number: i64) -> Result<&super::IssueRec, ApiError> {
    state.issue(repo, number).ok_or_else(|| {
        ApiError::not_found(format!(
            "issue does not exist [repo_id: {repo}, index: {number}]"
        ))
    })
}

fn user_of<'a>(state: &'a State, login: &str) -> Result<&'a super::UserRec, ApiError> {
    state
        .user(login)
        .ok_or_else(|| ApiError::not_found(format!("user does not exist [uid: 0, name: {login}]")))
}

/// What git says about pull request `number`: as frozen when it was
/// closed, else read now.
pub(crate) async fn pull_git(shared: &Shared, repo: i64, number: i64) -> Result<PullGit, ApiError> {
    let (path, base, head, frozen) = {
        let state = shared.lock();
        let repo_rec = repo_of(&state, repo)?;
        let issue = issue_of(&state, repo, number)?;
        let pull = issue.pull.as_ref().ok_or_else(|| {
            ApiError::not_found(format!(
                "pull request does not exist [repo_id: {repo}, index: {number}]"
            ))
        })?;
        (
            repo_rec.path.clone(),
            pull.base.clone(),
            pull.head.clone(),
            pull.frozen.clone(),
        )
    };
    match frozen {
        Some(frozen) => Ok(frozen),
        None => Ok(git::pull_git(&path, &base, &head).await?),
    }
}

/// What an issue or pull request event says besides the issue itself.
struct Announce<'a> {
    action: &'a str,
    sender: &'a str,
    /// The pull request's branches, for a pull request event.
    git: Option<&'a PullGit>,
    changes: Option<Value>,
    commit_id: &'a str,
}

impl<'a> Announce<'a> {
    fn new(action: &'a str, sender: &'a str, git: Option<&'a PullGit>) -> Self {
        Self {
            action,
            sender,
            git,
            changes: None,
            commit_id: "",
        }
    }
}

/// The payload of an issue event (IssuePayload), or of a pull request
/// event (PullRequestPayload) when it has `git`.
fn issue_payload(
    shared: &Shared,
    state: &State,
    repo: i64,
    number: i64,
    Announce {
        action,
        sender,
        git,
        changes,
        commit_id,
    }: Announce<'_>,
) -> Value {
    let (Some(repo_rec), Some(issue)) = (state.repo(repo), state.issue(repo, number)) else {
        return Value::Null;
    };
    let mut payload = json!({
        "action": action,
        "number": number,
        "repository": shapes::repo(shared, state, repo_rec, &issue.user),
        "sender": shapes::user(shared, state, sender),
        "commit_id": commit_id,
    });
    match git {
        Some(git) => {
            payload["pull_request"] = shapes::pull(shared, state, issue, git);
            payload["requested_reviewer"] = Value::Null;
            payload["review"] = Value::Null;
        }
        None => payload["issue"] = shapes::issue(shared, state, issue),
    }
    if let Some(changes) = changes {
        payload["changes"] = changes;
    }
    payload
}

/// The git state a pull request event needs, `None` for an issue.
async fn git_if_pull(shared: &Shared, repo: i64, number: i64) -> Result<Option<PullGit>, ApiError> {
    let is_pull = issue_of(&shared.lock(), repo, number)?.pull.is_some();
    if is_pull {
        Ok(Some(pull_git(shared, repo, number).await?))
    } else {
        Ok(None)
    }
}

/// Opens issue with `labels` (created in the repository as needed) and
/// announces it (`issues`, `opened`). Returns its number.
pub(crate) fn open_issue(
    shared: &Shared,
    repo: i64,
    by: &str,
    title: &str,
    body: &str,
    labels: &[&str],
) -> Result<(i64, Sent), ApiError> {
    let mut state = shared.lock();
    repo_of(&state, repo)?;
    user_of(&state, by)?;
    if title.trim().is_empty() {
        return Err(ApiError::unprocessable("[Title]: Required"));
    }
    let number = state.add_issue(repo, by, title, body, None);
    for label in labels {
        state.ensure_label(repo, label);
    }
    if let Some(issue) = state.issue_mut(repo, number) {
        issue.labels = labels.iter().map(|l| l.to_string()).collect();
    }
    let payload = issue_payload(
        shared,
        &state,
        repo,
        number,
        Announce::new("opened", by, None),
    );
    let sent = shared.hooks.event(&mut state, "issues", &payload);
    Ok((number, Sent(sent)))
}

/// An issue asked for through the API (Gitea's CreateIssueOption).
pub(crate) struct NewIssue<'a> {
    pub(crate) title: &'a str,
    pub(crate) body: &'a str,
    /// The deprecated `assignee`: one login, or empty.
    pub(crate) assignee: &'a str,
    /// `assignees`: logins.
    pub(crate) assignees: Vec<String>,
    /// `labels`: label ids.
    pub(crate) labels: Vec<i64>,
    /// `closed`: made closed.
    pub(crate) closed: bool,
}

/// The logins `new` assigns, as Gitea's `MakeIDsFromAPIAssigneesToAdd`
/// and `AddAssigneeIfNotAssigned` resolve them: `assignee` first unless
/// the list names it, then the list (ignored whole when its first entry
/// is empty, Gitea's guard against an empty list), each matched without
/// regard to case and assigned once. A login no user has is Gitea's 422.
fn assignees_of(state: &State, new: &NewIssue<'_>) -> Result<Vec<String>, ApiError> {
    let mut asked = Vec::new();
    if !new.assignee.is_empty() && !new.assignees.iter().any(|a| a == new.assignee) {
        asked.push(new.assignee.to_string());
    }
    if new.assignees.first().is_some_and(|a| !a.is_empty()) {
        asked.extend(new.assignees.iter().cloned());
    }
    let mut logins: Vec<String> = Vec::new();
    for name in asked {
        let Some(user) = state
            .users
            .iter()
            .find(|u| u.login.eq_ignore_ascii_case(&name))
        else {
            return Err(ApiError::unprocessable(format!(
                "Assignee does not exist: [name: user does not exist [uid: 0, name: {name}]]"
            )));
        };
        if !logins.contains(&user.login) {
            logins.push(user.login.clone());
        }
    }
    Ok(logins)
}

/// Opens an issue as `by` through the API, as Gitea's `CreateIssue` and
/// `issue_service.NewIssue` do: the title is required (422 `[Title]:
/// Required`), every assignee must be a user (422 otherwise, nothing
/// made), labels are taken by id and those the repository does not have
/// dropped silently, each with its `label` timeline entry. Every user of
/// the stand-in has write access, so nothing asked for is dropped for
/// want of it. The webhooks go in Gitea's order: the assignments are made
/// and announced inside the issue's creation (`issue_assign`, action
/// `assigned`, one per assignee, each with an `assignees` timeline
/// entry), then `issues` `opened`, then `issue_label` `label_updated`
/// when it has labels, and `issues` `closed` when `closed` asks for it.
/// Returns its number.
pub(crate) async fn create_issue(
    shared: &Shared,
    repo: i64,
    by: &str,
    new: &NewIssue<'_>,
) -> Result<(i64, Sent), ApiError> {
    if new.title.trim().is_empty() {
        return Err(ApiError::unprocessable("[Title]: Required"));
    }
    let (number, mut sent) = {
        let mut state = shared.lock();
        let repo_rec = repo_of(&state, repo)?;
        let mut labels: Vec<String> = Vec::new();
        for label in new
            .labels
            .iter()
            .filter_map(|id| repo_rec.labels.iter().find(|l| l.id == *id))
        {
            if !labels.contains(&label.name) {
                labels.push(label.name.clone());
            }
        }
        user_of(&state, by)?;
        let assignees = assignees_of(&state, new)?;
        let number = state.add_issue(repo, by, new.title, new.body, None);
        for label in &labels {
            if let Some(issue) = state.issue_mut(repo, number) {
                issue.labels.push(label.clone());
            }
            let kind = EventKind::Label {
                label: label.clone(),
                added: true,
            };
            state.add_event(repo, number, by, kind);
        }
        let mut sent = Vec::new();
        for assignee in assignees {
            if let Some(issue) = state.issue_mut(repo, number) {
                issue.assignees.push(assignee.clone());
            }
            let kind = EventKind::Assignees {
                assignee,
                removed: false,
            };
            state.add_event(repo, number, by, kind);
            let payload = issue_payload(
                shared,
                &state,
                repo,
                number,
                Announce::new("assigned", by, None),
            );
            sent.extend(shared.hooks.event(&mut state, "issue_assign", &payload));
        }
        let payload = issue_payload(
            shared,
            &state,
            repo,
            number,
            Announce::new("opened", by, None),
        );
        sent.extend(shared.hooks.event(&mut state, "issues", &payload));
        if !labels.is_empty() {
            let payload = issue_payload(
                shared,
                &state,
                repo,
                number,
                Announce::new("label_updated", by, None),
            );
            sent.extend(shared.hooks.event(&mut state, "issue_label", &payload));
        }
        (number, sent)
    };
    if new.closed {
        let Sent(more) = set_state(shared, repo, number, by, true, "").await?;
        sent.extend(more);
    }
    Ok((number, Sent(sent)))
}

/// Assigns `assignee` to issue or pull request `number` (or, with
/// `removed`, unassigns them), by `by`.
pub(crate) async fn assign(
    shared: &Shared,
    repo: i64,
    number: i64,
    assignee: &str,
    by: &str,
    removed: bool,
) -> Result<Sent, ApiError> {
    let git = git_if_pull(shared, repo, number).await?;
    let mut state = shared.lock();
    user_of(&state, by)?;
    user_of(&state, assignee)?;
    let issue = issue_of(&state, repo, number)?;
    let assigned = issue.assignees.iter().any(|a| a == assignee);
    if assigned != removed {
        return Err(ApiError::unprocessable(if removed {
            format!("{assignee} is not assigned to #{number}")
        } else {
            format!("{assignee} is already assigned to #{number}")
        }));
    }
    if let Some(issue) = state.issue_mut(repo, number) {
        if removed {
            issue.assignees.retain(|a| a != assignee);
        } else {
            issue.assignees.push(assignee.to_string());
        }
    }
    let kind = EventKind::Assignees {
        assignee: assignee.to_string(),
        removed,
    };
    state.add_event(repo, number, by, kind);
    let action = if removed { "unassigned" } else { "assigned" };
    let event_type = if git.is_some() {
        "pull_request_assign"
    } else {
        "issue_assign"
    };
    let payload = issue_payload(
        shared,
        &state,
        repo,
        number,
        Announce::new(action, by, git.as_ref()),
    );
    Ok(Sent(shared.hooks.event(&mut state, event_type, &payload)))
}

/// Adds label `label` (created if new) to `number`, by `by`.
pub(crate) async fn add_label(
    shared: &Shared,
    repo: i64,
    number: i64,
    label: &str,
    by: &str,
) -> Result<Sent, ApiError> {
    let git = git_if_pull(shared, repo, number).await?;
    let mut state = shared.lock();
    user_of(&state, by)?;
    if issue_of(&state, repo, number)?
        .labels
        .iter()
        .any(|l| l == label)
    {
        return Err(ApiError::unprocessable(format!(
            "#{number} already has the label {label}"
        )));
    }
    state.ensure_label(repo, label);
    if let Some(issue) = state.issue_mut(repo, number) {
        issue.labels.push(label.to_string());
    }
    let kind = EventKind::Label {
        label: label.to_string(),
        added: true,
    };
    state.add_event(repo, number, by, kind);
    let event_type = if git.is_some() {
        "pull_request_label"
    } else {
        "issue_label"
    };
    let payload = issue_payload(
        shared,
        &state,
        repo,
        number,
        Announce::new("label_updated", by, git.as_ref()),
    );
    Ok(Sent(shared.hooks.event(&mut state, event_type, &payload)))
}

/// Comments `body` on `number` as `by`; returns the comment's id.
pub(crate) async fn comment(
    shared: &Shared,
    repo: i64,
    number: i64,
    by: &str,
    body: &str,
) -> Result<(i64, Sent), ApiError> {
    if body.trim().is_empty() {
        return Err(ApiError::unprocessable("[Body]: Required"));
    }
    let git = git_if_pull(shared, repo, number).await?;
    let mut state = shared.lock();
    user_of(&state, by)?;
    issue_of(&state, repo, number)?;
    let kind = EventKind::Comment {
        body: body.to_string(),
    };
    let id = state.add_event(repo, number, by, kind);
    let (Some(repo_rec), Some(issue), Some(event)) = (
        state.repo(repo),
        state.issue(repo, number),
        state.events.last(),
    ) else {
        return Err(anyhow::anyhow!("the comment just made is gone").into());
    };
    let payload = json!({
        "action": "created",
        "issue": shapes::issue(shared, &state, issue),
        "pull_request": git.as_ref().map_or(Value::Null, |g| shapes::pull(shared, &state, issue, g)),
        "comment": shapes::comment(shared, &state, event),
        "repository": shapes::repo(shared, &state, repo_rec, &issue.user),
        "sender": shapes::user(shared, &state, by),
        "is_pull": git.is_some(),
    });
    let event_type = if git.is_some() {
        "pull_request_comment"
    } else {
        "issue_comment"
    };
    Ok((
        id,
        Sent(shared.hooks.event(&mut state, event_type, &payload)),
    ))
}

/// Changes comment `id` of `repo` to `body` as `by` (Gitea lets the
/// author and anyone with write access do it) and sends Gitea's webhook:
/// `issue_comment` (`pull_request_comment` on a pull request), action
/// `edited`, the old body in `changes`. The comment's `updated_at` moves;
/// the issue's does not, as in Gitea. Returns the issue's number; an
/// unchanged body changes nothing and sends nothing.
pub(crate) async fn edit_comment(
    shared: &Shared,
    repo: i64,
    id: i64,
    by: &str,
    body: &str,
) -> Result<(i64, Sent), ApiError> {
    if body.trim().is_empty() {
        return Err(ApiError::unprocessable("[Body]: Required"));
    }
    let number = {
        let state = shared.lock();
        user_of(&state, by)?;
        state
            .events
            .iter()
            .find(|e| e.id == id && e.repo == repo && matches!(e.kind, EventKind::Comment { .. }))
            .map(|e| e.number)
            .ok_or_else(|| {
                ApiError::not_found(format!("comment does not exist [id: {id}, issue_id: 0]"))
            })?
    };
    let git = git_if_pull(shared, repo, number).await?;
    let mut state = shared.lock();
    let Some(event) = state.events.iter_mut().find(|e| e.id == id) else {
        return Err(anyhow::anyhow!("the comment being edited is gone").into());
    };
    let EventKind::Comment { body: current } = &mut event.kind else {
        return Err(anyhow::anyhow!("comment {id} is no longer a comment").into());
    };
    if current == body {
        return Ok((number, Sent(Vec::new())));
    }
    let old = std::mem::replace(current, body.to_string());
    event.updated = now();
    let (Some(repo_rec), Some(issue), Some(event)) = (
        state.repo(repo),
        state.issue(repo, number),
        state.events.iter().find(|e| e.id == id),
    ) else {
        return Err(anyhow::anyhow!("the comment just edited is gone").into());
    };
    let payload = json!({
        "action": "edited",
        "issue": shapes::issue(shared, &state, issue),
        "pull_request": git.as_ref().map_or(Value::Null, |g| shapes::pull(shared, &state, issue, g)),
        "comment": shapes::comment(shared, &state, event),
        "changes": { "body": { "from": old } },
        "repository": shapes::repo(shared, &state, repo_rec, &issue.user),
        "sender": shapes::user(shared, &state, by),
        "is_pull": git.is_some(),
    });
    let event_type = if git.is_some() {
        "pull_request_comment"
    } else {
        "issue_comment"
    };
    Ok((
        number,
        Sent(shared.hooks.event(&mut state, event_type, &payload)),
    ))
}

/// Makes issue `depends_on` block issue `number` (Gitea sends no webhook
/// for it); both timelines say so, in the repository owner's name.
pub(crate) fn add_dependency(
    shared: &Shared,
    repo: i64,
    number: i64,
    depends_on: i64,
) -> Result<(), ApiError> {
    let mut state = shared.lock();
    let owner = repo_of(&state, repo)?.owner.clone();
    issue_of(&state, repo, depends_on)?;
    if number == depends_on {
        return Err(ApiError::unprocessable("an issue cannot depend on itself"));
    }
    if issue_of(&state, repo, number)?
        .blocked_by
        .contains(&depends_on)
    {
        return Err(ApiError::unprocessable(format!(
            "#{number} already depends on #{depends_on}"
        )));
    }
    if let Some(issue) = state.issue_mut(repo, number) {
        issue.blocked_by.push(depends_on);
    }
    state.add_event(
        repo,
        number,
        &owner,
        EventKind::AddDependency { number: depends_on },
    );
    state.add_event(
        repo,
        depends_on,
        &owner,
        EventKind::AddDependency { number },
    );
    Ok(())
}

/// Closes (or, with `closed` false, reopens) `number` as `by`. Like Gitea,
/// an issue with open dependencies cannot be closed (412), a merged pull
/// request cannot change state (412), and a pull request cannot be
/// reopened beside another open one for the same branches (409).
pub(crate) async fn set_state(
    shared: &Shared,
    repo: i64,
    number: i64,
    by: &str,
    closed: bool,
    commit_id: &str,
) -> Result<Sent, ApiError> {
    {
        let state = shared.lock();
        user_of(&state, by)?;
        let issue = issue_of(&state, repo, number)?;
        if issue.closed_at.is_some() == closed {
            return Ok(Sent(Vec::new()));
        }
        if let Some(pull) = &issue.pull {
            if pull.merged.is_some() {
                return Err(ApiError::new(
                    StatusCode::PRECONDITION_FAILED,
                    "cannot change state of this pull request, it was already merged",
                ));
            }
            if !closed && let Some(other) = open_pull_for(&state, repo, &pull.head, &pull.base) {
                return Err(already_exists(&state, repo, other));
            }
        }
        if closed {
            let open: Vec<i64> = issue
                .blocked_by
                .iter()
                .copied()
                .filter(|n| state.issue(repo, *n).is_some_and(|i| i.closed_at.is_none()))
                .collect();
            if !open.is_empty() {
                return Err(ApiError::new(
                    StatusCode::PRECONDITION_FAILED,
                    "cannot close this issue or pull request because it still has open dependencies",
                ));
            }
        }
    }
    let git = git_if_pull(shared, repo, number).await?;
    let mut state = shared.lock();
    let at = now();
    if let Some(issue) = state.issue_mut(repo, number) {
        issue.closed_at = closed.then_some(at);
        if let Some(pull) = &mut issue.pull {
            // A closed pull request keeps what its branches were.
            pull.frozen = if closed { git.clone() } else { None };
        }
    }
    let kind = if closed {
        EventKind::Close
    } else {
        EventKind::Reopen
    };
    state.add_event(repo, number, by, kind);
    let action = if closed { "closed" } else { "reopened" };
    let event_type = if git.is_some() {
        "pull_request"
    } else {
        "issues"
    };
    let payload = issue_payload(
        shared,
        &state,
        repo,
        number,
        Announce {
            action,
            sender: by,
            git: git.as_ref(),
            changes: None,
            commit_id,
        },
    );
    Ok(Sent(shared.hooks.event(&mut state, event_type, &payload)))
}

/// Changes the title and/or body of `number` as `by`, one `edited`
/// webhook per field changed (as Gitea's notifier sends them).
pub(crate) async fn edit(
    shared: &Shared,
    repo: i64,
    number: i64,
    by: &str,
    title: Option<&str>,
    body: Option<&str>,
) -> Result<Sent, ApiError> {
    if title.is_some_and(|t| t.trim().is_empty()) {
        return Err(ApiError::unprocessable("[Title]: Required"));
    }
    let git = git_if_pull(shared, repo, number).await?;
    let mut state = shared.lock();
    let mut sent = Vec::new();
    for (field, new) in [("title", title), ("body", body)] {
        let Some(new) = new else { continue };
        let Some(issue) = state.issue_mut(repo, number) else {
            continue;
        };
        let slot = if field == "title" {
            &mut issue.title
        } else {
            &mut issue.body
        };
        if slot == new {
            continue;
        }
        let old = std::mem::replace(slot, new.to_string());
        issue.updated = now();
        let changes = json!({ field: { "from": old } });
        let event_type = if git.is_some() {
            "pull_request"
        } else {
            "issues"
        };
        let payload = issue_payload(
            shared,
            &state,
            repo,
            number,
            Announce {
                action: "edited",
                sender: by,
                git: git.as_ref(),
                changes: Some(changes),
                commit_id: "",
            },
        );
        sent.extend(shared.hooks.event(&mut state, event_type, &payload));
    }
    Ok(Sent(sent))
}

fn open_pull_for(state: &State, repo: i64, head: &str, base: &str) -> Option<i64> {
    state
        .issues
        .iter()
        .filter(|i| i.repo == repo && i.closed_at.is_none())
        .find(|i| {
            i.pull
                .as_ref()
                .is_some_and(|p| p.head == head && p.base == base)
        })
        .map(|i| i.number)
}

/// Gitea's 409 for a second open pull request for the same branches.
fn already_exists(state: &State, repo: i64, number: i64) -> ApiError {
    let (id, issue_id, head, base) = state
        .issue(repo, number)
        .and_then(|i| {
            i.pull
                .as_ref()
                .map(|p| (p.id, i.id, p.head.clone(), p.base.clone()))
        })
        .unwrap_or_default();
    ApiError::new(
        StatusCode::CONFLICT,
        format!(
            "pull request already exists for these targets [id: {id}, issue_id: {issue_id}, head_repo_id: {repo}, base_repo_id: {repo}, head_branch: {head}, base_branch: {base}]"
        ),
    )
}

/// Opens a pull request from `head` into `base` as `by`, checked as
/// Gitea checks it: both branches must exist (404), differ and have
/// changes between them (422), and no open pull request may have the
/// same branches (409). Returns its number.
pub(crate) async fn create_pull(
    shared: &Shared,
    repo: i64,
    by: &str,
    head: &str,
    base: &str,
    title: &str,
    body: &str,
) -> Result<(i64, Sent), ApiError> {
    let path = {
        let state = shared.lock();
        user_of(&state, by)?;
        repo_of(&state, repo)?.path.clone()
    };
    for branch in [base, head] {
        if git::branch_sha(&path, branch).await?.is_none() {
            return Err(ApiError::not_found(format!(
                "branch does not exist [name: {branch}]"
            )));
        }
    }
    if head == base {
        return Err(ApiError::unprocessable(
            "Invalid PullRequest: There are no changes between the head and the base",
        ));
    }
    let git = git::pull_git(&path, base, head).await?;
    if git.head_sha == git.merge_base {
        return Err(ApiError::unprocessable(
            "Invalid PullRequest: There are no changes between the head and the base",
        ));
    }
    let mut state = shared.lock();
    if let Some(other) = open_pull_for(&state, repo, head, base) {
        return Err(already_exists(&state, repo, other));
    }
    let number = state.add_issue(
        repo,
        by,
        title,
        body,
        Some((head.to_string(), base.to_string())),
    );
    let payload = issue_payload(
        shared,
        &state,
        repo,
        number,
        Announce::new("opened", by, Some(&git)),
    );
    let sent = shared.hooks.event(&mut state, "pull_request", &payload);
    Ok((number, Sent(sent)))
}

/// One inline comment of a new review: the file, the signed line
/// (positive: new file; negative: old file) and what it says.
pub(crate) struct NewCodeComment {
    pub(crate) path: String,
    pub(crate) line: i64,
    pub(crate) body: String,
}

/// Submits a review of pull request `number` by `by`, its inline comments
/// first and then its own timeline entry (the order Gitea writes them),
/// and sends the review's webhook (`pull_request_review_*`, action
/// `reviewed`). Returns the review's id.
pub(crate) async fn review(
    shared: &Shared,
    repo: i64,
    number: i64,
    by: &str,
    verdict: ReviewState,
    body: &str,
    comments: Vec<NewCodeComment>,
) -> Result<(i64, Sent), ApiError> {
    let git = pull_git(shared, repo, number).await?;
    let path = {
        let state = shared.lock();
        user_of(&state, by)?;
        let issue = issue_of(&state, repo, number)?;
        if verdict != ReviewState::Comment && issue.user == by {
            let what = if verdict == ReviewState::Approved {
                "approve"
            } else {
                "reject"
            };
            return Err(ApiError::unprocessable(format!(
                "{what} your own pull is not allowed"
            )));
        }
        if verdict != ReviewState::Approved && body.trim().is_empty() && comments.is_empty() {
            return Err(ApiError::unprocessable(format!(
                "review event {} requires a body or a comment",
                verdict.as_str()
            )));
        }
        repo_of(&state, repo)?.path.clone()
    };
    let mut hunks = Vec::new();
    for c in &comments {
        if c.path.is_empty() || c.body.trim().is_empty() || c.line == 0 {
            return Err(ApiError::unprocessable(format!(
                "a review comment needs a path, a body and new_position or old_position (got path {:?}, line {})",
                c.path, c.line
            )));
        }
        hunks.push(git::diff_hunk(&path, &git.merge_base, &git.head_sha, &c.path, c.line).await?);
    }
    let mut state = shared.lock();
    state.next.review += 1;
    let review = state.next.review;
    for (c, diff_hunk) in comments.into_iter().zip(hunks) {
        let kind = EventKind::Code {
            review,
            path: c.path,
            line: c.line,
            body: c.body,
            commit_id: git.head_sha.clone(),
            diff_hunk,
        };
        state.add_event(repo, number, by, kind);
    }
    let event = state.add_event(
        repo,
        number,
        by,
        EventKind::Review {
            review,
            body: body.to_string(),
        },
    );
    state.reviews.push(ReviewRec {
        id: review,
        repo,
        number,
        user: by.to_string(),
        state: verdict,
        body: body.to_string(),
        commit_id: git.head_sha.clone(),
        created: now(),
        event,
    });
    let event_type = verdict.hook_event_type();
    let mut payload = issue_payload(
        shared,
        &state,
        repo,
        number,
        Announce::new("reviewed", by, Some(&git)),
    );
    payload["requested_reviewer"] = shapes::user(shared, &state, by);
    payload["review"] = json!({ "type": event_type, "content": body });
    Ok((
        review,
        Sent(shared.hooks.event(&mut state, event_type, &payload)),
    ))
}

/// Gitea's default closing keywords: a pull request whose title or body
/// says `Fixes #3` closes issue 3 when merged.
const CLOSING_KEYWORDS: [&str; 9] = [
    "close", "closes", "closed", "fix", "fixes", "fixed", "resolve", "resolves", "resolved",
];

/// The issue numbers `text` closes with Gitea's keywords.
fn closing_references(text: &str) -> Vec<i64> {
    let words: Vec<&str> = text.split_whitespace().collect();
    let mut numbers = Vec::new();
    for pair in words.windows(2) {
        let keyword = pair[0].trim_end_matches(':').to_ascii_lowercase();
        if !CLOSING_KEYWORDS.contains(&keyword.as_str()) {
            continue;
        }
        let reference = pair[1].trim_end_matches(|c: char| ",.;:!?)".contains(c));
        if let Some(n) = reference.strip_prefix('#').and_then(|n| n.parse().ok())
            && !numbers.contains(&n)
        {
            numbers.push(n);
        }
    }
    numbers
}

/// Merges pull request `number` as `by` with a merge commit, moving the
/// base branch past the branch protection hook as Gitea does, announces
/// it (`pull_request`, `closed`, merged) and closes the open issues its
/// title and body close with Gitea's keywords. Returns the merge commit.
/// Nothing of the branch protection is checked: this is an operator's
/// merge as a repository admin forcing it (see [`merge_as`] for the API's).
pub(crate) async fn merge(
    shared: &Shared,
    repo: i64,
    number: i64,
    by: &str,
) -> Result<(String, Sent), ApiError> {
    let _merging = shared.merging.lock().await;
    {
        let state = shared.lock();
        user_of(&state, by)?;
        let issue = issue_of(&state, repo, number)?;
        let pull = issue.pull.as_ref().ok_or_else(|| {
            ApiError::not_found(format!("#{number} is an issue, not a pull request"))
        })?;
        if pull.merged.is_some() || issue.closed_at.is_some() {
            return Err(ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                format!("#{number} is closed or already merged"),
            ));
        }
    }
    let git = pull_git(shared, repo, number).await?;
    if !git.mergeable {
        let base = shared
            .lock()
            .issue(repo, number)
            .and_then(|i| i.pull.as_ref().map(|p| p.base.clone()))
            .unwrap_or_default();
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            format!("#{number} does not merge cleanly into {base}"),
        ));
    }
    merge_at(shared, repo, number, by, None, git).await
}

/// What a merge through the API asks for (Gitea's MergePullRequestOption,
/// with `Do` = `merge`).
#[derive(Debug, Default)]
pub(crate) struct MergeForm {
    /// `MergeTitleField`: the merge commit's title; empty for Gitea's.
    pub(crate) title: String,
    /// `MergeMessageField`: its message, after the title.
    pub(crate) message: String,
    /// `head_commit_id`: the head the caller checked; empty for any.
    pub(crate) head_commit_id: String,
    /// `force_merge`: a repository admin's merge past the approvals and
    /// status checks.
    pub(crate) force: bool,
}

/// Gitea's default `WORK_IN_PROGRESS_PREFIXES`.
const WIP_PREFIXES: [&str; 2] = ["WIP:", "[WIP]"];

/// Gitea's 405, with `message` as its error document says it.
fn not_allowed(message: &str) -> ApiError {
    ApiError::new(StatusCode::METHOD_NOT_ALLOWED, message)
}

/// Merges pull request `number` as `by` through the API, checked as
/// Gitea's `MergePullRequest` checks it, in its order: merged already is
/// 405 with an empty message; closed is 404; then 405 when `by` may not
/// merge into the base (`User not allowed to merge PR`), the title marks
/// it a work in progress (`Work in progress PRs cannot be merged`), it
/// does not merge cleanly (`Please try again later`), a required status
/// context has not passed on the head (`Not all required status checks
/// successful`) or it has fewer approvals at the head than required
/// (`Does not have enough approvals`), the last two skipped for the
/// repository's admin (its owner) with `force`; and 409 `head out of
/// date` when `head_commit_id` is not the head. Then as [`merge`].
pub(crate) async fn merge_as(
    shared: &Shared,
    repo: i64,
    number: i64,
    by: &str,
    form: &MergeForm,
) -> Result<Sent, ApiError> {
    let _merging = shared.merging.lock().await;
    let git = pull_git(shared, repo, number).await?;
    let title = {
        let state = shared.lock();
        user_of(&state, by)?;
        let repo_rec = repo_of(&state, repo)?;
        let issue = issue_of(&state, repo, number)?;
        let pull = issue.pull.as_ref().ok_or_else(|| {
            ApiError::not_found(format!(
                "pull request does not exist [repo_id: {repo}, index: {number}]"
            ))
        })?;
        if pull.merged.is_some() {
            return Err(not_allowed(""));
        }
        if issue.closed_at.is_some() {
            return Err(ApiError {
                status: StatusCode::NOT_FOUND,
                message: "not found".into(),
                errors: Some(Vec::new()),
            });
        }
        let rule = &repo_rec.protection;
        let protected = rule.enabled && pull.base == repo_rec.default_branch;
        if protected && !rule.may_merge(by) {
            return Err(not_allowed("User not allowed to merge PR"));
        }
        let title = issue.title.to_ascii_uppercase();
        if WIP_PREFIXES.iter().any(|p| title.starts_with(p)) {
            return Err(not_allowed("Work in progress PRs cannot be merged"));
        }
        if !git.mergeable {
            return Err(not_allowed("Please try again later"));
        }
        let forced = form.force && by == repo_rec.owner;
        if protected && !forced {
            let latest = state.latest_statuses(repo, &git.head_sha);
            let required = rule.status_check_contexts.iter().map(|context| {
                latest
                    .iter()
                    .find(|s| &s.context == context)
                    .map_or("pending", |s| s.state.as_str())
            });
            if !rule.status_check_contexts.is_empty() && combined_state(required) != "success" {
                return Err(not_allowed("Not all required status checks successful"));
            }
            let approvals = state.granted_approvals(repo, number, &issue.user, &git.head_sha);
            if approvals < rule.required_approvals {
                return Err(not_allowed("Does not have enough approvals"));
            }
        }
        if !form.head_commit_id.is_empty() && form.head_commit_id != git.head_sha {
            return Err(ApiError::new(StatusCode::CONFLICT, "head out of date"));
        }
        let title = form.title.trim();
        let mut message = if title.is_empty() {
            default_merge_message(&issue.title, number, &pull.head, &pull.base)
        } else {
            title.to_string()
        };
        let body = form.message.trim();
        if !body.is_empty() {
            message.push_str("\n\n");
            message.push_str(body);
        }
        message
    };
    let (_, sent) = merge_at(shared, repo, number, by, Some(title), git).await?;
    Ok(sent)
}

/// Gitea's default message of a merge commit.
fn default_merge_message(title: &str, number: i64, head: &str, base: &str) -> String {
    format!("Merge pull request '{title}' (#{number}) from {head} into {base}")
}

/// Makes the merge of pull request `number` at the head `git` read, with
/// `message` (Gitea's default without one), and records and announces it.
async fn merge_at(
    shared: &Shared,
    repo: i64,
    number: i64,
    by: &str,
    message: Option<String>,
    mut git: PullGit,
) -> Result<(String, Sent), ApiError> {
    let (path, head, base, title) = {
        let state = shared.lock();
        let issue = issue_of(&state, repo, number)?;
        let pull = issue.pull.as_ref().ok_or_else(|| {
            ApiError::not_found(format!("#{number} is an issue, not a pull request"))
        })?;
        (
            repo_of(&state, repo)?.path.clone(),
            pull.head.clone(),
            pull.base.clone(),
            issue.title.clone(),
        )
    };
    let message = message.unwrap_or_else(|| default_merge_message(&title, number, &head, &base));
    let commit = git::merge(&path, &base, &git.head_sha, by, &message).await?;
    // The pull request keeps its branches as they were merged; its base
    // is now the merge.
    git.base_sha = commit.clone();
    let (closes, mut sent) = {
        let mut state = shared.lock();
        let at = now();
        let mut closes = Vec::new();
        if let Some(issue) = state.issue_mut(repo, number) {
            issue.closed_at = Some(at);
            issue.updated = at;
            closes = closing_references(&format!("{}\n{}", issue.title, issue.body));
            if let Some(pull) = &mut issue.pull {
                pull.merged = Some(Merge {
                    by: by.to_string(),
                    commit: commit.clone(),
                    at,
                });
                pull.frozen = Some(git.clone());
            }
        }
        let kind = EventKind::MergePull {
            commit: commit.clone(),
        };
        state.add_event(repo, number, by, kind);
        let announce = Announce::new("closed", by, Some(&git));
        let payload = issue_payload(shared, &state, repo, number, announce);
        (
            closes,
            shared.hooks.event(&mut state, "pull_request", &payload),
        )
    };
    for n in closes {
        let open_issue = {
            let state = shared.lock();
            state
                .issue(repo, n)
                .is_some_and(|i| i.pull.is_none() && i.closed_at.is_none())
        };
        // An issue that cannot be closed (open dependencies) stays open,
        // as Gitea leaves it.
        if open_issue && let Ok(Sent(more)) = set_state(shared, repo, n, by, true, &commit).await {
            sent.extend(more);
        }
    }
    Ok((commit, Sent(sent)))
}

/// A commit status to report (Gitea's CreateStatusOption).
pub(crate) struct NewStatus<'a> {
    pub(crate) state: &'a str,
    pub(crate) context: &'a str,
    pub(crate) description: &'a str,
    pub(crate) target_url: &'a str,
}

/// Reports `status` on commit `sha` (full or abbreviated) of `repo` as
/// `by`, as Gitea's `CreateCommitStatus` does: the commit must exist (a
/// 500 naming it otherwise, as Gitea answers); the status gets the next
/// index among the commit's. A state Gitea does not have is refused
/// (422). Gitea sends no webhook for it. Returns the full commit id and
/// the status's index.
pub(crate) async fn create_status(
    shared: &Shared,
    repo: i64,
    by: &str,
    sha: &str,
    status: &NewStatus<'_>,
) -> Result<(String, i64), ApiError> {
    if !super::STATUS_STATES.contains(&status.state) {
        return Err(ApiError::unprocessable(format!(
            "[State]: the commit status state {:?} is none of {}",
            status.state,
            super::STATUS_STATES.join(", ")
        )));
    }
    let path = {
        let state = shared.lock();
        user_of(&state, by)?;
        repo_of(&state, repo)?.path.clone()
    };
    let Some(full) = git::commit_sha(&path, sha).await? else {
        return Err(ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("GetCommit[{sha}]: object does not exist [id: {sha}, rel_path: ]"),
        ));
    };
    let mut state = shared.lock();
    let index = 1 + state
        .statuses
        .iter()
        .filter(|s| s.repo == repo && s.sha == full)
        .map(|s| s.index)
        .max()
        .unwrap_or(0);
    state.statuses.push(StatusRec {
        repo,
        sha: full.clone(),
        index,
        state: status.state.to_string(),
        context: status.context.to_string(),
        description: status.description.to_string(),
        target_url: status.target_url.to_string(),
        creator: by.to_string(),
        created: now(),
    });
    Ok((full, index))
}

#[cfg(test)]
mod tests {
    use super::closing_references;

    #[test]
    fn closing_keywords_are_gitea_s() {
        assert_eq!(closing_references("Fixes #3, closes #4."), vec![3, 4]);
        assert_eq!(closing_references("Resolves: #12 and see #5"), vec![12]);
        assert_eq!(closing_references("refs #3; fix #x"), Vec::<i64>::new());
    }
}
