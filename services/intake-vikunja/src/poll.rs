//! The poll: the fallback that finds what a lost webhook carried (seed
//! L8: a cursor, at-most-once taking, at-least-once answering).
//!
//! Every `poll-interval`, per project, from its cursor in the bucket, the
//! project's tasks updated since (`filter=updated >= <cursor less the
//! overlap>`, read by id, an order a change during the read does not
//! move), each compared with what the cursor knows:
//!
//! - a task **created** since: `task.created`, by its creator;
//! - a task **updated** since (its `updated` past its `created`): the
//!   task as it is now, `task.updated` with no doer (the poll cannot say
//!   who changed it), unless it is the time the agent's own write left it
//!   at;
//! - an **assignee** the cursor did not know the task to have:
//!   `task.assignee.created`, with no doer;
//! - each **comment** made since (`task.comment.created`) and edited
//!   since (`task.comment.edited`, as it reads now), by its author (only
//!   the author may edit a comment): Vikunja bumps a task's `updated` on
//!   a new or edited comment, so the task is listed.
//!
//! Each carries the id a webhook of the same change carries
//! (`crate::events`), and is stored only when neither way stored it
//! before. The agent's own tasks and comments are not taken. The very
//! first read of a project takes every task not done as `task.created`
//! (with its assignees), so what was made while nothing listened is found
//! too; updates and comments are taken from that moment on.
//!
//! The cursor moves only after JetStream stored every event up to it; a
//! read that fails, or a publish that is not acknowledged, leaves it
//! where it was, and the next poll reads the same again (the ids and the
//! records make the second copy nothing). Each read reaches back by an
//! overlap, since a change may commit just after a read and Vikunja keeps
//! whole seconds; what was published from the overlap is remembered in
//! the cursor and not published again, and the cursor never moves past
//! Vikunja's clock at the read's start.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;

use nisse_bus::{AgentName, Bus};
use nisse_proto::v1::{VikunjaEvent, VikunjaSource};

use crate::Config;
use crate::api::{ApiError, Vikunja};
use crate::events::{
    self, Stored, TASK_ASSIGNEE_CREATED, TASK_COMMENT_CREATED, TASK_COMMENT_EDITED, TASK_CREATED,
    TASK_UPDATED, envelope,
};
use crate::records::{self, Cursor, Mark};
use crate::shapes::{Task, rfc3339};

/// How far each read reaches back before its cursor.
pub(crate) const OVERLAP: Duration = Duration::from_secs(10);

/// Why a poll of a project did not finish.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PollError {
    /// Vikunja's API.
    #[error("{0}")]
    Vikunja(#[from] ApiError),
    /// The bus: the cursor, the records or the publishes.
    #[error("{0}")]
    Bus(String),
}

/// The poll of one agent's projects.
pub(crate) struct Poller {
    pub bus: Bus,
    pub agent: AgentName,
    pub config: Arc<Config>,
    pub vikunja: Vikunja,
    /// Where a browser opens Vikunja, for the tasks' links.
    pub frontend: String,
}

/// What one poll of a project did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Polled {
    /// Events stored now.
    pub stored: usize,
    /// Events found that were stored before (by a webhook, or an earlier
    /// poll that did not move its cursor).
    pub before: usize,
}

/// An event found, with when it happened (the order it is published in).
struct Found {
    at: OffsetDateTime,
    event: VikunjaEvent,
}

impl Poller {
    /// Polls every project now and then every `poll-interval`, until
    /// `shutdown`. A project whose poll fails is logged once until it
    /// works again, and tried again at the next interval.
    pub(crate) async fn run(self, shutdown: CancellationToken) {
        let mut tick = tokio::time::interval(self.config.poll_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut failing: HashMap<i64, bool> = HashMap::new();
        loop {
            tokio::select! {
                () = shutdown.cancelled() => break,
                _ = tick.tick() => {}
            }
            for &project in &self.config.projects {
                let outcome = tokio::select! {
                    () = shutdown.cancelled() => return,
                    outcome = self.poll(project) => outcome,
                };
                let was_failing = failing.get(&project).copied().unwrap_or(false);
                match outcome {
                    Ok(polled) => {
                        if was_failing {
                            tracing::info!(agent = %self.agent, project, "polling Vikunja works again");
                        }
                        if polled.stored > 0 {
                            tracing::info!(agent = %self.agent, project, stored = polled.stored, before = polled.before, "poll found new events");
                        }
                        failing.insert(project, false);
                    }
                    Err(e) => {
                        if !was_failing {
                            tracing::warn!(agent = %self.agent, project, "polling Vikunja: {e}; the cursor stays and the next poll reads the same again");
                        }
                        failing.insert(project, true);
                    }
                }
            }
        }
    }

    /// One poll of `project`, from its cursor; the cursor moves once every
    /// event is stored.
    pub(crate) async fn poll(&self, project: i64) -> Result<Polled, PollError> {
        let bus_error = |e: nisse_bus::Error| PollError::Bus(e.to_string());
        let (cursor, revision) = match records::read_cursor(&self.bus, &self.agent, project)
            .await
            .map_err(bus_error)?
        {
            Some((c, r)) => (c, Some(r)),
            None => (
                Cursor {
                    project_id: project,
                    ..Cursor::default()
                },
                None,
            ),
        };
        let mark = &cursor.tasks;
        let since = mark.query_since(OVERLAP);
        let filter = match since {
            None => "done = false".to_string(),
            Some(since) => format!("updated >= {}", rfc3339(Some(since))),
        };
        let answer = self
            .vikunja
            .retrying("reading a project's tasks", |_| {
                self.vikunja.tasks(project, &filter)
            })
            .await?;
        let now = answer.date.unwrap_or_else(OffsetDateTime::now_utc);
        let mut tasks = answer.value;
        tasks.sort_by_key(|t| (t.updated, t.id));

        let mut found = Vec::new();
        let mut items: Vec<(String, OffsetDateTime)> = Vec::new();
        if since.is_none() {
            // The next read reaches back by the overlap: what changed in
            // it before this first one (a task done just now, which is
            // not work to take) is as good as seen.
            let edge = format!("updated >= {}", rfc3339(Some(now - OVERLAP)));
            let recent = self
                .vikunja
                .retrying("reading a project's tasks", |_| {
                    self.vikunja.tasks(project, &edge)
                })
                .await?
                .value;
            for task in &recent {
                let updated = task.updated.unwrap_or(now);
                let created = task.created.unwrap_or(updated);
                items.push((format!("created:{}", task.id), created));
                items.push((
                    format!("updated:{}:{}", task.id, rfc3339(Some(updated))),
                    updated,
                ));
            }
        }
        let mut assignees = cursor.assignees.clone();
        for task in &tasks {
            // A task moved to another project while listed is not this
            // project's any more.
            if task.project_id != 0 && task.project_id != project {
                continue;
            }
            self.task(task, since, now, mark, &mut items, &mut found)
                .await?;
            let known = assignees.get(&task.id);
            for a in &task.assignees {
                if known.is_some_and(|k| k.contains(&a.id)) {
                    continue;
                }
                let mut e = self.event(
                    TASK_ASSIGNEE_CREATED,
                    task,
                    "",
                    events::assignee_id(task.id, a.id),
                );
                e.assignee = a.username.clone();
                found.push(Found {
                    at: task.updated.unwrap_or(now),
                    event: e,
                });
            }
            if task.done {
                assignees.remove(&task.id);
            } else {
                assignees.insert(task.id, task.assignees.iter().map(|a| a.id).collect());
            }
        }
        // In the order it happened.
        found.sort_by_key(|f| f.at);

        let mut polled = Polled::default();
        for f in found {
            match events::store(&self.bus, &self.agent, f.event)
                .await
                .map_err(PollError::Bus)?
            {
                Stored::Now { duplicate: false } => polled.stored += 1,
                Stored::Now { duplicate: true } | Stored::Before => polled.before += 1,
            }
        }
        let start = if since.is_none() {
            Mark::at(now)
        } else {
            mark.clone()
        };
        let next = Cursor {
            project_id: project,
            tasks: start.advanced(items.iter().map(|(k, t)| (k.as_str(), *t)), OVERLAP, now),
            assignees,
        };
        if next != cursor {
            let written = records::write_cursor(&self.bus, &self.agent, &next, revision)
                .await
                .map_err(bus_error)?;
            if written.is_none() {
                // Another instance polled meanwhile and moved it; the next
                // poll starts from theirs.
                tracing::debug!(agent = %self.agent, project, "the cursor moved meanwhile");
            }
        }
        Ok(polled)
    }

    fn event(&self, name: &str, task: &Task, doer: &str, message_id: String) -> VikunjaEvent {
        VikunjaEvent {
            envelope: Some(envelope(&self.agent, doer, message_id)),
            source: VikunjaSource::Poll as i32,
            event: name.to_string(),
            project_id: task.project_id,
            doer: doer.to_string(),
            task: Some(task.to_proto(&self.frontend)),
            ..VikunjaEvent::default()
        }
    }

    /// What changed of `task` since `since` (`None`: the first read,
    /// which takes its creation alone): its creation, its update, its
    /// comments made and edited. Adds what it read to `items` (the
    /// cursor's next edge) and what is new to `found`.
    async fn task(
        &self,
        task: &Task,
        since: Option<OffsetDateTime>,
        now: OffsetDateTime,
        mark: &Mark,
        items: &mut Vec<(String, OffsetDateTime)>,
        found: &mut Vec<Found>,
    ) -> Result<(), PollError> {
        let account = &self.config.account;
        let updated = task.updated.unwrap_or(now);
        let created = task.created.unwrap_or(updated);
        if since.is_none_or(|s| created >= s) {
            let key = format!("created:{}", task.id);
            if !mark.has_seen(&key) && !task.by(account) {
                let by = task
                    .created_by
                    .as_ref()
                    .map(|u| u.username.clone())
                    .unwrap_or_default();
                found.push(Found {
                    at: created,
                    event: self.event(TASK_CREATED, task, &by, events::created_id(task.id)),
                });
            }
            items.push((key, created));
        }
        let Some(since) = since else {
            // The first read takes the task as it is: its state now is in
            // its creation's event.
            if updated > created {
                items.push((
                    format!("updated:{}:{}", task.id, rfc3339(Some(updated))),
                    updated,
                ));
            }
            return Ok(());
        };
        if updated > created {
            let key = format!("updated:{}:{}", task.id, rfc3339(Some(updated)));
            if !mark.has_seen(&key) && !self.own_write(task.id, updated).await? {
                found.push(Found {
                    at: updated,
                    event: self.event(TASK_UPDATED, task, "", events::updated_id(task.id, updated)),
                });
            }
            items.push((key, updated));
        }
        let comments = self
            .vikunja
            .retrying("reading a task's comments", |_| {
                self.vikunja.comments(task.id)
            })
            .await?;
        for c in &comments {
            let made = c.created.unwrap_or(updated);
            let changed = c.updated.unwrap_or(made);
            let mine = c.by(account);
            let author = c
                .author
                .as_ref()
                .map(|u| u.username.clone())
                .unwrap_or_default();
            if made >= since {
                let key = format!("comment:{}", c.id);
                if !mark.has_seen(&key) && !mine {
                    let mut e = self.event(
                        TASK_COMMENT_CREATED,
                        task,
                        &author,
                        events::comment_id(c.id),
                    );
                    e.comment = Some(c.to_proto());
                    found.push(Found { at: made, event: e });
                }
                items.push((key, made));
            }
            // Vikunja keeps whole seconds: an edit within the second the
            // comment was made cannot be told from the comment itself.
            if changed > made && changed >= since {
                let key = format!("comment:{}:{}", c.id, rfc3339(Some(changed)));
                if !mark.has_seen(&key) && !mine {
                    // Only a comment's author may edit it
                    // (`canUserModifyTaskComment`): the author did.
                    let mut e = self.event(
                        TASK_COMMENT_EDITED,
                        task,
                        &author,
                        events::comment_edit_id(c.id, changed),
                    );
                    e.comment = Some(c.to_proto());
                    found.push(Found {
                        at: changed,
                        event: e,
                    });
                }
                items.push((key, changed));
            }
        }
        Ok(())
    }

    /// Whether the agent's own write left task `task` at `updated`: its
    /// change, not someone's.
    async fn own_write(&self, task: i64, updated: OffsetDateTime) -> Result<bool, PollError> {
        let wrote = records::read_wrote(&self.bus, &self.agent, task)
            .await
            .map_err(|e| PollError::Bus(e.to_string()))?;
        let at = rfc3339(Some(updated));
        Ok(wrote.updated.contains(&at))
    }
}
