//! The poll: the fallback that finds what a lost webhook carried (seed
//! L8: a cursor, at-most-once taking, at-least-once answering).
//!
//! Every `poll-interval`, per repository, from its cursor in the bucket:
//!
//! - **issues** updated since the cursor, each published as it is now
//!   (`issues`/`updated`, id `poll:<repo>:issue:<number>:<updated>`); the
//!   very first read takes every open issue, so what was assigned while
//!   nothing listened is found too. For an issue assigned to the agent's
//!   account, the newest entry of its timeline assigning the account is
//!   published as `issues`/`assigned` with the sender who assigned it
//!   (id `gitea:timeline:<entry>`, as a webhook's assignment has);
//! - **comments** on issues and pull requests' conversations made since
//!   the cursor (`issue_comment`/`created`, id `gitea:comment:<id>`, as a
//!   webhook's comment has), and comments edited since it, as they read
//!   now (`issue_comment`/`edited`, id `gitea:comment:<id>:<updated>`, as
//!   a webhook's edit has; no sender, since Gitea does not say who
//!   edited, and anyone with write access may);
//! - **pull requests** updated since the cursor (`state=all`,
//!   `sort=recentupdate`, read until one older), each with its timeline
//!   since then and its reviews: a close, merge or reopen
//!   (`pull_request`/`closed`, `merged` set for a merge, or `reopened`,
//!   id `gitea:timeline:<entry>`), a review submitted since
//!   (`pull_request_review_approved`, `_rejected` or `_comment`/
//!   `reviewed`, id `gitea:review:<id>`) and its inline comments
//!   (`pull_request_review_comment`/`created`, id `gitea:comment:<id>`),
//!   in the order they happened, as the webhooks of the same changes
//!   carry them.
//!
//! The cursor moves only after JetStream stored every event up to it; a
//! read that fails, or a publish that is not acknowledged, leaves it
//! where it was, and the next poll reads the same again (the ids make
//! the second copy a duplicate). Each read reaches back by an overlap,
//! since Gitea's `since` is whole seconds and a change may commit just
//! after a read; what was published from the overlap is remembered in
//! the cursor and not published again. Everything but an issue's
//! snapshot gets the same id from the webhook and from the poll (see the
//! crate's table), so seeing one both ways stores it once within
//! JetStream's duplicate window, and the brain goes by the ids after it.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;

use nisse_bus::{AgentName, Bus};
use nisse_proto::v1::{GiteaEvent, GiteaIssue, GiteaSource};

use crate::Config;
use crate::api::{ApiError, Gitea};
use crate::events::{
    self, StateChange, comment_edit_id, comment_id, envelope, review_id, timeline_id,
};
use crate::records::{self, Cursor, Mark};
use crate::server::PUBLISH_TIMEOUT;
use crate::shapes::rfc3339;

/// How far each read reaches back before its cursor.
pub(crate) const OVERLAP: Duration = Duration::from_secs(10);

/// Why a poll of a repository did not finish.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PollError {
    /// Gitea's API.
    #[error("{0}")]
    Gitea(#[from] ApiError),
    /// The bus: the cursor or the publishes.
    #[error("{0}")]
    Bus(String),
}

/// The poll of one agent's repositories.
pub(crate) struct Poller {
    pub bus: Bus,
    pub agent: AgentName,
    pub config: Arc<Config>,
    pub gitea: Gitea,
}

/// What one poll of a repository did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Polled {
    /// Events published.
    pub published: usize,
    /// Of them, already stored.
    pub duplicates: usize,
}

impl Poller {
    /// Polls every repository now and then every `poll-interval`, until
    /// `shutdown`. A repository whose poll fails is logged once until it
    /// works again, and tried again at the next interval.
    pub(crate) async fn run(self, shutdown: CancellationToken) {
        let mut tick = tokio::time::interval(self.config.poll_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut failing: HashMap<String, bool> = HashMap::new();
        loop {
            tokio::select! {
                () = shutdown.cancelled() => break,
                _ = tick.tick() => {}
            }
            for repo in &self.config.repositories {
                let outcome = tokio::select! {
                    () = shutdown.cancelled() => return,
                    outcome = self.poll(repo) => outcome,
                };
                let was_failing = failing.get(repo).copied().unwrap_or(false);
                match outcome {
                    Ok(polled) => {
                        if was_failing {
                            tracing::info!(agent = %self.agent, repository = %repo, "polling Gitea works again");
                        }
                        if polled.published > polled.duplicates {
                            tracing::info!(agent = %self.agent, repository = %repo, published = polled.published, duplicates = polled.duplicates, "poll found new events");
                        }
                        failing.insert(repo.clone(), false);
                    }
                    Err(e) => {
                        if !was_failing {
                            tracing::warn!(agent = %self.agent, repository = %repo, "polling Gitea: {e}; the cursor stays and the next poll reads the same again");
                        }
                        failing.insert(repo.clone(), true);
                    }
                }
            }
        }
    }

    /// One poll of `repo`, from its cursor; the cursor moves once every
    /// event is stored.
    pub(crate) async fn poll(&self, repo: &str) -> Result<Polled, PollError> {
        let bus_error = |e: nisse_bus::Error| PollError::Bus(e.to_string());
        let (cursor, revision) = match records::read_cursor(&self.bus, &self.agent, repo)
            .await
            .map_err(bus_error)?
        {
            Some((c, r)) => (c, Some(r)),
            None => (
                Cursor {
                    repository: repo.to_string(),
                    ..Cursor::default()
                },
                None,
            ),
        };
        let mut out = Vec::new();
        let (issues, now) = self.issues(repo, &cursor.issues, &mut out).await?;
        let mut known = HashMap::new();
        let comments = self
            .comments(repo, &cursor.comments, now, &mut known, &mut out)
            .await?;
        let pulls = self.pulls(repo, &cursor.pulls, now, &mut out).await?;

        let published = out.len();
        let duplicates = events::publish_all(&self.bus, out, PUBLISH_TIMEOUT)
            .await
            .map_err(PollError::Bus)?;
        let next = Cursor {
            repository: repo.to_string(),
            issues,
            comments,
            pulls,
        };
        if next != cursor {
            let written = records::write_cursor(&self.bus, &self.agent, &next, revision)
                .await
                .map_err(bus_error)?;
            if written.is_none() {
                // Another instance polled meanwhile and moved it; the next
                // poll starts from theirs.
                tracing::debug!(agent = %self.agent, repository = %repo, "the cursor moved meanwhile");
            }
        }
        Ok(Polled {
            published,
            duplicates,
        })
    }

    fn event(&self, sender: &str, message_id: String, delivery_id: String) -> GiteaEvent {
        GiteaEvent {
            envelope: Some(envelope(&self.agent, sender, message_id)),
            source: GiteaSource::Poll as i32,
            delivery_id,
            sender: sender.to_string(),
            ..GiteaEvent::default()
        }
    }

    /// Issues since `mark` (every open one on the first read), with the
    /// account's assignments; returns the next mark and Gitea's clock.
    async fn issues(
        &self,
        repo: &str,
        mark: &Mark,
        out: &mut Vec<GiteaEvent>,
    ) -> Result<(Mark, OffsetDateTime), PollError> {
        let first = mark.since.is_none();
        let since = mark.query_since(OVERLAP);
        let state = if first { "open" } else { "all" };
        let answer = self
            .gitea
            .retrying("reading issues", |_| self.gitea.issues(repo, state, since))
            .await?;
        let now = answer.date.unwrap_or_else(OffsetDateTime::now_utc);
        let mut issues = answer.value;
        issues.sort_by_key(|i| (i.updated_at, i.number));
        let mut items = Vec::with_capacity(issues.len());
        for issue in &issues {
            let updated = issue.updated_at.unwrap_or(now);
            let key = format!(
                "poll:{repo}:issue:{}:{}",
                issue.number,
                rfc3339(Some(updated))
            );
            items.push((key.clone(), updated));
            // A snapshot published already is not published again; its
            // assignment is still looked for, since one made within the
            // same second leaves the snapshot's time as it was.
            if !mark.has_seen(&key) {
                let mut e = self.event("", key.clone(), key);
                e.event = "issues".into();
                e.action = "updated".into();
                e.repository = repo.to_string();
                e.issue = Some(issue.to_proto());
                out.push(e);
            }
            if !issue.assigned_to(&self.config.account) {
                continue;
            }
            let entry = self
                .gitea
                .retrying("reading an issue's timeline", |_| {
                    events::latest_assignment(
                        &self.gitea,
                        repo,
                        issue.number,
                        None,
                        Some(&self.config.account),
                        false,
                    )
                })
                .await?;
            let Some(entry) = entry else { continue };
            // Only an assignment new since the cursor: an old one was
            // published when it was new (or at the first read).
            let at = entry.created_at.unwrap_or(now);
            if since.is_some_and(|since| at < since) {
                continue;
            }
            // The issue changes again after its assignment (a comment):
            // the assignment, within the overlap, is not published again.
            let key = format!("timeline:{}", entry.id);
            items.push((key.clone(), at));
            if mark.has_seen(&key) {
                continue;
            }
            let sender = entry
                .user
                .as_ref()
                .map(|u| u.login.clone())
                .unwrap_or_default();
            let mut e = self.event(
                &sender,
                timeline_id(entry.id),
                format!(
                    "poll:{repo}:assigned:{}:{}",
                    entry.id,
                    rfc3339(entry.created_at)
                ),
            );
            e.event = "issues".into();
            e.action = "assigned".into();
            e.repository = repo.to_string();
            e.issue = Some(issue.to_proto());
            e.assignee = entry
                .assignee
                .as_ref()
                .map(|u| u.login.clone())
                .unwrap_or_else(|| self.config.account.clone());
            out.push(e);
        }
        let start = if first { Mark::at(now) } else { mark.clone() };
        let next = start.advanced(items.iter().map(|(k, t)| (k.as_str(), *t)), OVERLAP);
        Ok((next, now))
    }

    /// Comments made or edited since `mark` (none on the first read,
    /// which only sets the mark at Gitea's `now`): one made since is
    /// `created` (id [`comment_id`], as a webhook's); one whose
    /// `updated_at` is past its `created_at` was edited, and its current
    /// version is `edited` (id [`comment_edit_id`], as a webhook's edit),
    /// with no sender: Gitea lets anyone with write access edit another's
    /// comment and does not say who did, so the poll does not guess.
    async fn comments(
        &self,
        repo: &str,
        mark: &Mark,
        now: OffsetDateTime,
        known: &mut HashMap<u64, GiteaIssue>,
        out: &mut Vec<GiteaEvent>,
    ) -> Result<Mark, PollError> {
        let Some(since) = mark.query_since(OVERLAP) else {
            return Ok(Mark::at(now));
        };
        let mut comments = self
            .gitea
            .retrying("reading comments", |_| self.gitea.comments(repo, since))
            .await?
            .value;
        comments.sort_by_key(|c| (c.updated_at, c.id));
        let mut items = Vec::with_capacity(comments.len());
        for comment in &comments {
            let updated = comment.updated_at.unwrap_or(now);
            let key = format!("comment:{}", comment.id);
            items.push((key.clone(), updated));
            // Made before the cursor: published when it was made, and
            // listed again now because it was edited.
            let made = !mark.has_seen(&key) && comment.created_at.is_none_or(|c| c >= since);
            // Gitea keeps whole seconds: an edit within the second the
            // comment was made cannot be told from the comment itself.
            let edit = comment
                .created_at
                .zip(comment.updated_at)
                .filter(|(c, u)| u > c)
                .map(|(_, u)| (format!("comment:{}:{}", comment.id, rfc3339(Some(u))), u));
            if let Some((edit_key, at)) = &edit {
                items.push((edit_key.clone(), *at));
            }
            let edit = edit.filter(|(k, _)| !mark.has_seen(k)).map(|(_, at)| at);
            if !made && edit.is_none() {
                continue;
            }
            let Some(number) = comment.issue_number() else {
                tracing::warn!(agent = %self.agent, repository = %repo, comment = comment.id, "a comment names no issue; skipped");
                continue;
            };
            let issue = match known.get(&number) {
                Some(i) => i.clone(),
                None => {
                    let i = self
                        .gitea
                        .retrying("reading an issue", |_| self.gitea.issue(repo, number))
                        .await?
                        .to_proto();
                    known.insert(number, i.clone());
                    i
                }
            };
            let c = comment.to_proto(number);
            if made {
                let mut e = self.event(
                    &c.author,
                    comment_id(comment.id),
                    format!(
                        "poll:{repo}:comment:{}:{}",
                        comment.id,
                        rfc3339(comment.updated_at)
                    ),
                );
                e.event = "issue_comment".into();
                e.action = "created".into();
                e.repository = repo.to_string();
                e.issue = Some(issue.clone());
                e.comment = Some(c.clone());
                out.push(e);
            }
            if let Some(at) = edit {
                let mut e = self.event(
                    "",
                    comment_edit_id(comment.id, at),
                    format!(
                        "poll:{repo}:comment-edit:{}:{}",
                        comment.id,
                        rfc3339(Some(at))
                    ),
                );
                e.event = "issue_comment".into();
                e.action = "edited".into();
                e.repository = repo.to_string();
                e.issue = Some(issue);
                e.comment = Some(c);
                out.push(e);
            }
        }
        Ok(mark.advanced(items.iter().map(|(k, t)| (k.as_str(), *t)), OVERLAP))
    }

    /// Pull requests changed since `mark` (none on the first read, which
    /// only sets the mark at Gitea's `now`): each updated since is read
    /// with its timeline from then and its reviews, and what a lost
    /// webhook carried is published in the order it happened, each with
    /// the id the webhook's has: a close, merge or reopen
    /// (`pull_request`/`closed` or `reopened`, id
    /// `gitea:timeline:<entry>`, sent by whoever did it), a submitted
    /// review (`pull_request_review_approved`, `_rejected` or `_comment`,
    /// `reviewed`, id `gitea:review:<id>`, its text as the comment) and
    /// each of its inline comments (`pull_request_review_comment`/
    /// `created`, id `gitea:comment:<id>`). A review counts by when it was
    /// submitted, so the comments of a draft submitted later are found
    /// with it. The snapshots are the pull request as it is now, its state
    /// as each change left it.
    async fn pulls(
        &self,
        repo: &str,
        mark: &Mark,
        now: OffsetDateTime,
        out: &mut Vec<GiteaEvent>,
    ) -> Result<Mark, PollError> {
        let Some(since) = mark.query_since(OVERLAP) else {
            return Ok(Mark::at(now));
        };
        let mut pulls = self
            .gitea
            .retrying("reading pull requests", |_| {
                self.gitea.pulls_updated(repo, since)
            })
            .await?;
        pulls.sort_by_key(|p| (p.updated_at, p.number));
        let mut items = Vec::new();
        for pull in &pulls {
            let updated = pull.updated_at.unwrap_or(now);
            // The pull request's own time moves the mark, so a change
            // with nothing to publish (a label, a push) is not read again
            // at every poll.
            items.push((
                format!("pull:{}:{}", pull.number, rfc3339(Some(updated))),
                updated,
            ));
            let (timeline, reviews) = self
                .gitea
                .retrying("reading a pull request's timeline and reviews", |_| async {
                    let timeline = self.gitea.timeline_since(repo, pull.number, since).await?;
                    let reviews = self.gitea.reviews(repo, pull.number).await?;
                    Ok((timeline, reviews))
                })
                .await?;
            // Where each review's own entry is on the timeline: the order
            // it happened in among the state changes.
            let place: HashMap<i64, i64> = timeline
                .iter()
                .filter(|e| e.kind.is_review() && e.review_id > 0)
                .map(|e| (e.review_id, e.id))
                .collect();
            let mut found: Vec<(OffsetDateTime, i64, Vec<GiteaEvent>)> = Vec::new();
            for entry in &timeline {
                let Some(change) = StateChange::of(entry) else {
                    continue;
                };
                let at = entry.created_at.unwrap_or(now);
                if at < since {
                    continue;
                }
                let key = format!("timeline:{}", entry.id);
                items.push((key.clone(), at));
                if mark.has_seen(&key) {
                    continue;
                }
                let sender = entry
                    .user
                    .as_ref()
                    .map(|u| u.login.clone())
                    .unwrap_or_default();
                let mut e = self.event(
                    &sender,
                    timeline_id(entry.id),
                    format!(
                        "poll:{repo}:pull:{}:{}:{}",
                        pull.number,
                        entry.id,
                        rfc3339(Some(at))
                    ),
                );
                let (mut issue, mut shown) = (pull.to_issue(), pull.to_proto());
                change.apply(&mut issue, &mut shown);
                e.event = "pull_request".into();
                e.action = change.action().into();
                e.repository = repo.to_string();
                e.issue = Some(issue);
                e.pull = Some(shown);
                found.push((at, entry.id, vec![e]));
            }
            for review in &reviews {
                let (Some(name), Some(at)) = (review.event(), review.submitted_at) else {
                    continue;
                };
                if at < since {
                    continue;
                }
                let key = format!("review:{}", review.id);
                items.push((key.clone(), at));
                // Seen: its inline comments were published with it.
                if mark.has_seen(&key) {
                    continue;
                }
                let sender = review
                    .user
                    .as_ref()
                    .map(|u| u.login.clone())
                    .unwrap_or_default();
                let mut e = self.event(
                    &sender,
                    review_id(review.id),
                    format!("poll:{repo}:review:{}:{}", review.id, rfc3339(Some(at))),
                );
                e.event = name.into();
                e.action = "reviewed".into();
                e.repository = repo.to_string();
                e.issue = Some(pull.to_issue());
                e.pull = Some(pull.to_proto());
                e.comment = review.to_comment(pull.number);
                let comments = self
                    .gitea
                    .retrying("reading a review's comments", |_| {
                        events::comments_of(
                            &self.gitea,
                            repo,
                            pull.number,
                            std::slice::from_ref(review),
                            None,
                        )
                    })
                    .await?;
                let mut all = Vec::with_capacity(1 + comments.len());
                for comment in &comments {
                    let mut c = events::inline_comment_event(&self.agent, &e, comment, pull.number);
                    c.delivery_id = format!(
                        "poll:{repo}:comment:{}:{}",
                        comment.id,
                        rfc3339(comment.created_at)
                    );
                    all.push(c);
                }
                all.insert(0, e);
                let place = place.get(&review.id).copied().unwrap_or(i64::MAX);
                found.push((at, place, all));
            }
            found.sort_by_key(|(at, place, _)| (*at, *place));
            out.extend(found.into_iter().flat_map(|(_, _, events)| events));
        }
        Ok(mark.advanced(items.iter().map(|(k, t)| (k.as_str(), *t)), OVERLAP))
    }
}
