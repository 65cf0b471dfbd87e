//! The agent's Gitea API calls: `out.gitea.req` → `in.gitea.result`.
//!
//! **Which calls.** `comment` (on an issue or a pull request's
//! conversation), `publish` (the open pull request whose head is the
//! branch, opened by the account, is adopted and its title and body set;
//! else one is opened: never two), `read_issue` (with the issues it
//! depends on), `read_pull` (with its merge state, its reviews, each with
//! the commit it was given on and whether Gitea counts it stale, and the
//! combined status checks of its head), `review_reply` (a review with
//! event COMMENT holding one inline comment at the same file and line as
//! the comment replied to, which puts it in that conversation),
//! `close_issue` (the note commented, then the issue closed),
//! `check_protection` (whether the branch's protection holds against the
//! agent's own token, [`crate::protection`]; a publish makes the same
//! check of its base first and is refused when it fails), `merge_pull`
//! (a merge commit of the pull request at the head the brain names,
//! which Gitea makes only when its branch protection allows: the
//! approvals and status checks it requires, at that head; a refusal is
//! FAILED with Gitea's status and message, and the pull request as it
//! is after a merge is answered), `create_issue` (an issue opened by the
//! account with the title, the body and the assignees asked for: the
//! tracking issue of a project the agent starts; answered with the issue
//! as `read_issue` answers it, its body ending in the request's marker).
//! A repository not configured, or a call missing what it needs (an
//! issue's title empty, more than one line or longer than Gitea keeps),
//! is refused before Gitea is called.
//!
//! **At most once per request id.** The request id is the call's
//! identity. A call with side effects is recorded `started` in the
//! bucket before Gitea is called and `done`, with its answer, after; a
//! redelivered `done` request is answered again from the record, and a
//! redelivered `started` one (a crash between the call and the answer)
//! is reconciled with Gitea instead of made again: comments, review
//! replies and issues carry a hidden marker in their body (`<!--
//! nisse:<request id> -->`) and the one with it is adopted (an issue is
//! looked for among every issue the account opened, open or closed, so
//! one closed meanwhile is still found); a pull request is found by its
//! head branch; closing is idempotent; a merge is found by reading the
//! pull request (merged: adopted, not merged again). The same search
//! precedes every retry of a call that may have reached Gitea (a
//! timeout), so a retry never makes a second comment or issue either.
//! Reads are answered fresh each time, with no record.
//!
//! **Failures.** Gitea unreachable, a 5xx, a 429, the token file missing
//! for a moment: retried a few times within `call-timeout`, waiting as
//! Gitea's `Retry-After` asks on a 429 or 503 (else with backoff), never
//! past the timeout; then answered FAILED with the status, the wait Gitea
//! asked for and why no further attempt was made. A retry of a write
//! after a 429 makes it again at once (Gitea refused it unread); after
//! anything that may have reached Gitea (no answer, a reset, a 5xx) it
//! first looks for what the earlier attempt made, as a redelivered
//! `started` call does. Any other 4xx: FAILED at once, with Gitea's
//! `message` and status. The bucket away: the request is retried later
//! (redelivered), since without its record the call could happen twice.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use nisse_bus::{AgentName, Bus, Delivery, Handler, Unhandled};
use nisse_proto::v1::gitea_request::Call;
use nisse_proto::v1::{
    GiteaCallStatus, GiteaCloseIssue, GiteaComment, GiteaCommentCall, GiteaCreateIssue,
    GiteaMergePull, GiteaPublishCall, GiteaRequest, GiteaResult, GiteaReviewReply,
};

use crate::api::{ApiError, Gitea};
use crate::shapes::Comment;
use crate::{Config, SERVICE, events};
use nisse_bus::topology::GITEA_BUCKET;

// The marker is the one both intakes find their writes by: shared.
pub use nisse_intake_kit::marker::marker;

/// `body` with the marker of `request_id` after it (the marker alone
/// for an empty body).
fn marked(body: &str, request_id: &str) -> String {
    let body = body.trim_end();
    if body.trim_start().is_empty() {
        marker(request_id)
    } else {
        format!("{body}\n\n{}", marker(request_id))
    }
}

/// The longest title Gitea keeps (its `issue.name` column and its web
/// form's `MaxSize(255)`), in characters.
const MAX_TITLE: usize = 255;

/// The handler of one agent's calls.
pub(crate) struct Calls {
    pub bus: Bus,
    pub agent: AgentName,
    pub config: Arc<Config>,
    pub gitea: Gitea,
}

impl Handler<GiteaRequest> for Calls {
    async fn handle(
        &self,
        _agent: &AgentName,
        delivery: &Delivery<GiteaRequest>,
    ) -> Result<(), Unhandled> {
        let request = delivery.message();
        if request.request_id.is_empty() {
            return Err(Unhandled::dead_letter(
                "the request has no request id: nothing to keep it once by, or to answer",
            ));
        }
        let result = self.answer(request).await?;
        tracing::info!(
            request_id = %request.request_id,
            repository = %request.repository,
            status = ?GiteaCallStatus::try_from(result.status).unwrap_or_default(),
            reason = %result.reason,
            "Gitea call answered"
        );
        self.bus.publish(result).await.map_err(Unhandled::retry)?;
        Ok(())
    }
}

/// An answer to `request` with `status`.
fn result(request: &GiteaRequest, status: GiteaCallStatus) -> GiteaResult {
    GiteaResult {
        envelope: Some(SERVICE.reply_to(
            request.envelope.as_ref(),
            format!("gitea-result:{}", request.request_id),
        )),
        request_id: request.request_id.clone(),
        status: status as i32,
        ..GiteaResult::default()
    }
}

fn refused(request: &GiteaRequest, reason: impl Into<String>) -> GiteaResult {
    GiteaResult {
        reason: reason.into(),
        ..result(request, GiteaCallStatus::Refused)
    }
}

fn failed(request: &GiteaRequest, e: &ApiError) -> GiteaResult {
    GiteaResult {
        http_status: e.http_status(),
        reason: e.to_string(),
        ..result(request, GiteaCallStatus::Failed)
    }
}

fn done(request: &GiteaRequest) -> GiteaResult {
    result(request, GiteaCallStatus::Done)
}

impl Calls {
    /// The answer to `request`: made, refused, failed, or given again.
    pub(crate) async fn answer(&self, request: &GiteaRequest) -> Result<GiteaResult, Unhandled> {
        let Some(repo) = self.config.served(&request.repository) else {
            return Ok(refused(
                request,
                format!(
                    "`{}` is not among the repositories agent {} serves (gitea.repositories: {})",
                    request.repository,
                    self.agent,
                    self.config.repositories.join(", ")
                ),
            ));
        };
        let Some(call) = &request.call else {
            return Ok(refused(request, "the request names no call"));
        };
        if let Some(why) = nonsense(call) {
            return Ok(refused(request, why));
        }
        match call {
            Call::ReadIssue(read) => Ok(self.read_issue(request, repo, read.number).await),
            Call::ReadPull(read) => Ok(self.read_pull(request, repo, read.number).await),
            Call::CheckProtection(check) => Ok(self
                .check_protection(request, repo, &check.branch, check.agent_merges)
                .await
                .unwrap_or_else(|answer| answer)),
            _ => self.once(request, repo, call).await,
        }
    }

    /// A call with side effects, at most once per request id.
    async fn once(
        &self,
        request: &GiteaRequest,
        repo: &str,
        call: &Call,
    ) -> Result<GiteaResult, Unhandled> {
        nisse_intake_kit::records::once(
            &self.bus,
            GITEA_BUCKET,
            &self.agent,
            &request.request_id,
            "Gitea",
            |reconcile, _started_ms| async move {
                Ok(match call {
                    Call::Comment(c) => self.comment(request, repo, c, reconcile).await,
                    Call::Publish(p) => self.publish(request, repo, p).await,
                    Call::ReviewReply(r) => self.review_reply(request, repo, r, reconcile).await,
                    Call::CloseIssue(c) => self.close_issue(request, repo, c, reconcile).await,
                    Call::MergePull(m) => self.merge_pull(request, repo, m, reconcile).await,
                    Call::CreateIssue(c) => self.create_issue(request, repo, c, reconcile).await,
                    Call::ReadIssue(_) | Call::ReadPull(_) | Call::CheckProtection(_) => {
                        return Err(Unhandled::dead_letter("a read has no record"));
                    }
                })
            },
        )
        .await
    }

    /// The account's comment on `number` carrying `request_id`'s marker.
    async fn marked_comment(
        &self,
        repo: &str,
        number: u64,
        request_id: &str,
    ) -> Result<Option<Comment>, ApiError> {
        let marker = marker(request_id);
        Ok(self
            .gitea
            .issue_comments(repo, number)
            .await?
            .into_iter()
            .find(|c| {
                c.body.contains(&marker)
                    && c.user.as_ref().is_some_and(|u| u.is(&self.config.account))
            }))
    }

    /// Comments `body` on `number` for `request_id`, or finds the comment
    /// made for it before (`reconcile`, and before a retry after a failure
    /// Gitea may have carried out: not after a 429, which refused it).
    /// Returns the comment and whether it was found.
    async fn comment_once(
        &self,
        repo: &str,
        number: u64,
        body: &str,
        request_id: &str,
        reconcile: bool,
    ) -> Result<(GiteaComment, bool), ApiError> {
        let text = marked(body, request_id);
        self.gitea
            .retrying("commenting", |attempt| {
                let text = text.clone();
                async move {
                    if (reconcile || attempt.uncertain)
                        && let Some(c) = self.marked_comment(repo, number, request_id).await?
                    {
                        return Ok((c.to_proto(number), true));
                    }
                    let c = self.gitea.create_comment(repo, number, &text).await?;
                    Ok((c.to_proto(number), false))
                }
            })
            .await
    }

    async fn comment(
        &self,
        request: &GiteaRequest,
        repo: &str,
        call: &GiteaCommentCall,
        reconcile: bool,
    ) -> GiteaResult {
        match self
            .comment_once(
                repo,
                call.issue_number,
                &call.body,
                &request.request_id,
                reconcile,
            )
            .await
        {
            Ok((comment, adopted)) => GiteaResult {
                comment: Some(comment),
                adopted,
                ..done(request)
            },
            Err(e) => failed(request, &e),
        }
    }

    /// The protection of `branch` as the agent's token sees it: `Ok` with
    /// the answer when it holds, `Err` with the answer (refused with the
    /// problems, or failed) when it does not or Gitea could not tell.
    async fn check_protection(
        &self,
        request: &GiteaRequest,
        repo: &str,
        branch: &str,
        agent_merges: bool,
    ) -> Result<GiteaResult, GiteaResult> {
        let found = crate::protection::check(
            &self.gitea,
            repo,
            branch,
            &self.config.account,
            agent_merges,
        )
        .await;
        match found {
            Ok(p) if p.problems.is_empty() => Ok(GiteaResult {
                protection: Some(p),
                ..done(request)
            }),
            Ok(p) => Err(GiteaResult {
                reason: format!(
                    "the branch protection of `{branch}` does not hold: {}",
                    p.problems.join("; ")
                ),
                protection: Some(p),
                ..result(request, GiteaCallStatus::Refused)
            }),
            Err(e) => Err(failed(request, &e)),
        }
    }

    /// Opens or updates the pull request, once the base's protection is
    /// checked (D4: before each publish).
    async fn publish(
        &self,
        request: &GiteaRequest,
        repo: &str,
        call: &GiteaPublishCall,
    ) -> GiteaResult {
        if let Err(answer) = self
            .check_protection(request, repo, &call.base, call.agent_merges)
            .await
        {
            return answer;
        }
        let account = &self.config.account;
        let find = async || -> Result<_, ApiError> {
            Ok(self
                .gitea
                .open_pulls(repo)
                .await?
                .into_iter()
                .find(|p| p.is_head(repo, &call.head) && p.by(account)))
        };
        let adopt = async |number: u64, base: &str| {
            let base = (base != call.base).then_some(call.base.as_str());
            self.gitea
                .edit_pull(repo, number, &call.title, &call.body, base)
                .await
        };
        let outcome = self
            .gitea
            .retrying("publishing a pull request", |_| async {
                if let Some(open) = find().await? {
                    let base = open
                        .base
                        .as_ref()
                        .map(|b| b.branch.clone())
                        .unwrap_or_default();
                    return Ok((adopt(open.number, &base).await?, true));
                }
                match self
                    .gitea
                    .create_pull(repo, &call.head, &call.base, &call.title, &call.body)
                    .await
                {
                    Ok(pull) => Ok((pull, false)),
                    // Gitea's answer when one exists for the branch: made
                    // meanwhile (adopted), or someone else's (refused as is).
                    Err(e) if e.is_status(409) => match find().await? {
                        Some(open) => {
                            let base = open
                                .base
                                .as_ref()
                                .map(|b| b.branch.clone())
                                .unwrap_or_default();
                            Ok((adopt(open.number, &base).await?, true))
                        }
                        None => Err(e),
                    },
                    Err(e) => Err(e),
                }
            })
            .await;
        match outcome {
            Ok((pull, adopted)) => GiteaResult {
                pull: Some(pull.to_proto()),
                adopted,
                ..done(request)
            },
            Err(e) => failed(request, &e),
        }
    }

    async fn read_issue(&self, request: &GiteaRequest, repo: &str, number: u64) -> GiteaResult {
        let read = self
            .gitea
            .retrying("reading an issue", |_| async {
                let issue = self.gitea.issue(repo, number).await?;
                let dependencies = self.gitea.dependencies(repo, number).await?;
                Ok((issue, dependencies))
            })
            .await;
        match read {
            Ok((issue, dependencies)) => GiteaResult {
                issue: Some(issue.to_proto()),
                dependencies: dependencies.iter().map(|i| i.to_proto()).collect(),
                ..done(request)
            },
            Err(e) => failed(request, &e),
        }
    }

    /// The pull request as it is now, with its reviews and the combined
    /// status checks of its head.
    async fn read_pull(&self, request: &GiteaRequest, repo: &str, number: u64) -> GiteaResult {
        let read = self
            .gitea
            .retrying("reading a pull request", |_| async {
                let pull = self.gitea.pull(repo, number).await?;
                let reviews = self.gitea.reviews(repo, number).await?;
                let head = pull.to_proto().head_sha;
                let checks = if head.is_empty() {
                    None
                } else {
                    Some(self.gitea.combined_status(repo, &head).await?)
                };
                Ok((pull, reviews, checks))
            })
            .await;
        match read {
            Ok((pull, reviews, checks)) => GiteaResult {
                pull: Some(pull.to_proto()),
                issue: Some(pull.to_issue()),
                reviews: reviews.iter().map(|r| r.to_proto()).collect(),
                checks: checks.map(|c| c.to_proto()),
                ..done(request)
            },
            Err(e) => failed(request, &e),
        }
    }

    /// Merges the pull request at the head the brain checked. On a
    /// redelivered `started` call, and before a retry after a failure the
    /// merge may have got past, the pull request is read first: merged, it
    /// is adopted (answered DONE, `adopted`), never merged twice. Gitea's
    /// refusal (405: approvals or checks missing, 409: the head moved, 422)
    /// is FAILED with its status and message.
    async fn merge_pull(
        &self,
        request: &GiteaRequest,
        repo: &str,
        call: &GiteaMergePull,
        reconcile: bool,
    ) -> GiteaResult {
        let number = call.number;
        // Set once this call's merge was answered: a retry of the read
        // after it neither merges again nor calls the merge adopted.
        let merged = &AtomicBool::new(false);
        let outcome = self
            .gitea
            .retrying("merging a pull request", |attempt| async move {
                if !merged.load(Ordering::SeqCst) {
                    if reconcile || attempt.uncertain {
                        let pull = self.gitea.pull(repo, number).await?;
                        if pull.merged {
                            return Ok((pull, true));
                        }
                    }
                    self.gitea
                        .merge_pull(repo, number, &call.head_sha, &call.title, &call.message)
                        .await?;
                    merged.store(true, Ordering::SeqCst);
                }
                Ok((self.gitea.pull(repo, number).await?, false))
            })
            .await;
        match outcome {
            Ok((pull, adopted)) => GiteaResult {
                pull: Some(pull.to_proto()),
                issue: Some(pull.to_issue()),
                adopted,
                ..done(request)
            },
            Err(e) => failed(request, &e),
        }
    }

    async fn review_reply(
        &self,
        request: &GiteaRequest,
        repo: &str,
        call: &GiteaReviewReply,
        reconcile: bool,
    ) -> GiteaResult {
        let number = call.pull_number;
        let id = &request.request_id;
        let marker = &marker(id);
        let text = &marked(&call.body, id);
        let account = &self.config.account;
        let mine = async || -> Result<_, ApiError> {
            Ok(
                events::review_comments(&self.gitea, repo, number, Some(account))
                    .await?
                    .into_iter()
                    .find(|c| c.body.contains(marker)),
            )
        };
        let mine = &mine;
        let outcome = self
            .gitea
            .retrying("replying on a review comment", |attempt| async move {
                if (reconcile || attempt.uncertain)
                    && let Some(c) = mine().await?
                {
                    return Ok((c, true));
                }
                let (path, line, old_line) =
                    if call.path.is_empty() || (call.line == 0 && call.old_line == 0) {
                        // Where the comment replied to is, from Gitea.
                        let all = events::review_comments(&self.gitea, repo, number, None).await?;
                        match all.into_iter().find(|c| c.id == call.comment_id) {
                            Some(c) => (
                                c.path,
                                i64::try_from(c.position).unwrap_or(0),
                                i64::try_from(c.original_position).unwrap_or(0),
                            ),
                            None => {
                                return Err(ApiError::Missing(format!(
                                    "comment {} is not an inline comment of pull request {number}",
                                    call.comment_id
                                )));
                            }
                        }
                    } else {
                        (call.path.clone(), call.line, call.old_line)
                    };
                let review = self
                    .gitea
                    .create_review_comment(repo, number, &path, line, old_line, text)
                    .await?;
                let made = self
                    .gitea
                    .review_comments(repo, number, review.id)
                    .await?
                    .into_iter()
                    .find(|c| c.body.contains(marker));
                match made {
                    Some(mut c) => {
                        if c.pull_request_review_id == 0 {
                            c.pull_request_review_id = review.id;
                        }
                        Ok((c, false))
                    }
                    None => Err(ApiError::Decode {
                        what: format!("POST /api/v1/repos/{repo}/pulls/{number}/reviews"),
                        reason: format!(
                            "review {} was made without the comment it was given",
                            review.id
                        ),
                    }),
                }
            })
            .await;
        match outcome {
            Ok((comment, adopted)) => GiteaResult {
                comment: Some(comment.to_proto(number)),
                adopted,
                ..done(request)
            },
            Err(e) => failed(request, &e),
        }
    }

    /// Opens the issue for `request`, or finds the one made for it before
    /// (`reconcile`, and before a retry after a failure Gitea may have
    /// carried out: not after a 429, which refused it unread): the
    /// account's issue, open or closed, whose body carries the request's
    /// marker, adopted as it is.
    async fn create_issue(
        &self,
        request: &GiteaRequest,
        repo: &str,
        call: &GiteaCreateIssue,
        reconcile: bool,
    ) -> GiteaResult {
        let id = &request.request_id;
        let marker = &marker(id);
        let text = &marked(&call.body, id);
        let account = &self.config.account;
        let made = async || -> Result<_, ApiError> {
            Ok(self
                .gitea
                .issues_by(repo, account)
                .await?
                .into_iter()
                .find(|i| {
                    i.body.contains(marker) && i.user.as_ref().is_some_and(|u| u.is(account))
                }))
        };
        let made = &made;
        let outcome = self
            .gitea
            .retrying("opening an issue", |attempt| async move {
                if (reconcile || attempt.uncertain)
                    && let Some(issue) = made().await?
                {
                    return Ok((issue, true));
                }
                let issue = self
                    .gitea
                    .create_issue(repo, call.title.trim(), text, &call.assignees)
                    .await?;
                Ok((issue, false))
            })
            .await;
        match outcome {
            Ok((issue, adopted)) => GiteaResult {
                issue: Some(issue.to_proto()),
                adopted,
                ..done(request)
            },
            Err(e) => failed(request, &e),
        }
    }

    async fn close_issue(
        &self,
        request: &GiteaRequest,
        repo: &str,
        call: &GiteaCloseIssue,
        reconcile: bool,
    ) -> GiteaResult {
        let mut answer = done(request);
        if !call.note.trim().is_empty() {
            match self
                .comment_once(
                    repo,
                    call.number,
                    &call.note,
                    &request.request_id,
                    reconcile,
                )
                .await
            {
                Ok((comment, adopted)) => {
                    answer.comment = Some(comment);
                    answer.adopted = adopted;
                }
                Err(e) => return failed(request, &e),
            }
        }
        match self
            .gitea
            .retrying("closing an issue", |_| {
                self.gitea.close_issue(repo, call.number)
            })
            .await
        {
            Ok(issue) => GiteaResult {
                issue: Some(issue.to_proto()),
                ..answer
            },
            Err(e) => failed(request, &e),
        }
    }
}

/// What makes `call` impossible to make, said before Gitea is called.
fn nonsense(call: &Call) -> Option<String> {
    let blank = |s: &str| s.trim().is_empty();
    match call {
        Call::Comment(c) if c.issue_number == 0 => Some("comment: issue_number is 0".into()),
        Call::Comment(c) if blank(&c.body) => Some("comment: the body is empty".into()),
        Call::Publish(p) if blank(&p.head) || blank(&p.base) => {
            Some("publish: both head and base branches are needed".into())
        }
        Call::Publish(p) if p.head == p.base => {
            Some(format!("publish: head and base are both `{}`", p.head))
        }
        Call::Publish(p) if blank(&p.title) => Some("publish: the title is empty".into()),
        Call::ReadIssue(r) if r.number == 0 => Some("read_issue: number is 0".into()),
        Call::ReadPull(r) if r.number == 0 => Some("read_pull: number is 0".into()),
        Call::ReviewReply(r) if r.pull_number == 0 => Some("review_reply: pull_number is 0".into()),
        Call::ReviewReply(r) if blank(&r.body) => Some("review_reply: the body is empty".into()),
        Call::ReviewReply(r)
            if r.comment_id == 0 && (r.path.is_empty() || (r.line == 0 && r.old_line == 0)) =>
        {
            Some(
                "review_reply: neither the comment replied to nor its file and line are given"
                    .into(),
            )
        }
        Call::CloseIssue(c) if c.number == 0 => Some("close_issue: number is 0".into()),
        Call::CheckProtection(c) if blank(&c.branch) => {
            Some("check_protection: the branch is empty".into())
        }
        Call::CreateIssue(c) if blank(&c.title) => Some("create_issue: the title is empty".into()),
        Call::CreateIssue(c) if c.title.trim().contains(['\n', '\r']) => Some(
            "create_issue: the title is more than one line (an issue's title is one line; the rest belongs in the body)"
                .into(),
        ),
        Call::CreateIssue(c) if c.title.trim().chars().count() > MAX_TITLE => Some(format!(
            "create_issue: the title is {} characters, more than the {MAX_TITLE} Gitea keeps",
            c.title.trim().chars().count()
        )),
        Call::CreateIssue(c) if c.assignees.iter().any(|a| blank(a)) => {
            Some("create_issue: an assignee's login is empty".into())
        }
        Call::MergePull(m) if m.number == 0 => Some("merge_pull: number is 0".into()),
        Call::MergePull(m) if blank(&m.head_sha) => Some(
            "merge_pull: head_sha is empty: a merge is made only at the head its approvals and checks were read for"
                .into(),
        ),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markers_are_html_comments_that_cannot_break() {
        assert_eq!(
            marker("0190ab:r1:comment"),
            "<!-- nisse:0190ab:r1:comment -->"
        );
        let odd = marker("a-->b");
        assert!(
            odd.starts_with("<!-- nisse:h:") && odd.ends_with(" -->"),
            "{odd}"
        );
        assert!(!odd[4..odd.len() - 3].contains("--"), "{odd}");
        assert_eq!(marked("Done.\n", "r1"), "Done.\n\n<!-- nisse:r1 -->");
        assert_eq!(marked(" \n", "r1"), "<!-- nisse:r1 -->");
    }

    #[test]
    fn nonsense_is_refused_before_gitea() {
        let c = |issue_number, body: &str| {
            Call::Comment(GiteaCommentCall {
                issue_number,
                body: body.into(),
            })
        };
        assert!(nonsense(&c(0, "x")).is_some());
        assert!(nonsense(&c(1, "  ")).is_some());
        assert!(nonsense(&c(1, "x")).is_none());
        let p = Call::Publish(GiteaPublishCall {
            head: "main".into(),
            base: "main".into(),
            title: "t".into(),
            body: String::new(),
            agent_merges: false,
        });
        assert!(nonsense(&p).unwrap().contains("both `main`"));
        let reply = |comment_id, path: &str, line| {
            Call::ReviewReply(GiteaReviewReply {
                pull_number: 2,
                comment_id,
                path: path.into(),
                line,
                body: "ok".into(),
                old_line: 0,
            })
        };
        assert!(nonsense(&reply(0, "src/lib.rs", 0)).is_some());
        assert!(nonsense(&reply(0, "", 3)).is_some());
        assert!(nonsense(&reply(0, "src/lib.rs", 3)).is_none());
        assert!(nonsense(&reply(7, "", 0)).is_none());
        let merge = |number, head_sha: &str| {
            Call::MergePull(GiteaMergePull {
                number,
                head_sha: head_sha.into(),
                title: "t".into(),
                message: String::new(),
            })
        };
        assert!(nonsense(&merge(0, "abc")).unwrap().contains("number is 0"));
        assert!(nonsense(&merge(3, " ")).unwrap().contains("head_sha"));
        assert!(nonsense(&merge(3, "abc")).is_none());
        let issue = |title: &str, assignees: &[&str]| {
            Call::CreateIssue(GiteaCreateIssue {
                title: title.into(),
                body: String::new(),
                assignees: assignees.iter().map(|a| (*a).to_string()).collect(),
            })
        };
        assert!(nonsense(&issue(" ", &[])).unwrap().contains("empty"));
        assert!(
            nonsense(&issue("Count\nlines", &[]))
                .unwrap()
                .contains("one line")
        );
        assert!(nonsense(&issue("Count\rlines", &[])).is_some());
        assert!(
            nonsense(&issue("Count lines\n", &[])).is_none(),
            "sent trimmed"
        );
        assert!(
            nonsense(&issue(&"x".repeat(256), &[]))
                .unwrap()
                .contains("256 characters")
        );
        assert!(nonsense(&issue(&"å".repeat(255), &["nisse"])).is_none());
        assert!(nonsense(&issue("Count lines", &["nisse", ""])).is_some());
        assert!(nonsense(&issue("Count lines", &[])).is_none());
    }
}
