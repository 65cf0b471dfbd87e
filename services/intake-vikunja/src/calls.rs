//! The agent's Vikunja API calls: `out.vikunja.req` →
//! `in.vikunja.result`, and the comments and closings a ticketed item's
//! `Tell`s become ([`crate::tells`]), which are made by the same code.
//!
//! **Which calls.** `comment` (the Markdown rendered to the HTML Vikunja
//! keeps, [`crate::markdown`]), `set_done` (the note commented first when
//! there is one, then the task read, `done` changed and the whole task
//! posted back: Vikunja's update replaces every field, so nothing is sent
//! that was not read just before; a task already in the state asked for
//! is left alone), `read_task`, `create_task` (a task opened by the
//! account in a served project, its description the Markdown rendered).
//! A task or project not served, or a call that makes no sense (no task
//! id, an empty comment, a title empty or of more than one line), is
//! refused before anything is written; the task's project is read from
//! Vikunja for the calls that name a task.
//!
//! **At most once per request id.** A call with side effects is recorded
//! `started` in the bucket before Vikunja is called and `done`, with its
//! answer, after; a redelivered `done` request is answered again from
//! the record, and a redelivered `started` one (a crash between the call
//! and the answer) is reconciled with Vikunja instead of made again:
//! comments and tasks carry a hidden marker ([`marker`]) and the
//! account's one with it is adopted (`adopted`); marking done reads the
//! task first and finds it done already. The same search precedes every
//! retry of a write that may have reached Vikunja (a timeout, a 5xx), so
//! a retry never makes a second comment or task either. Reads are
//! answered fresh each time, with no record.
//!
//! **Failures.** Vikunja unreachable, a 5xx, a 429, the token file missing
//! for a moment: retried a few times within `call-timeout`, waiting as
//! `Retry-After` asks on a 429 or 503 (else with backoff), never past the
//! timeout; then answered FAILED with the status, the wait asked for and
//! why no further attempt was made. Any other 4xx: FAILED at once, with
//! Vikunja's message, its code and the status. The bucket away: the
//! request is retried later (redelivered), since without its record the
//! call could happen twice.

use std::sync::Arc;

use time::OffsetDateTime;

use nisse_bus::{AgentName, Bus, Delivery, Handler, Unhandled};
use nisse_proto::v1::vikunja_request::Call;
use nisse_proto::v1::{
    VikunjaCallStatus, VikunjaComment, VikunjaCommentCall, VikunjaCreateTask, VikunjaRequest,
    VikunjaResult, VikunjaSetDone,
};

use crate::api::{ApiError, Vikunja};
use crate::markdown::{marked_html, marker};
use crate::records;
use crate::shapes::{Task, rfc3339};
use crate::{Config, SERVICE};
use nisse_bus::topology::VIKUNJA_BUCKET;

/// How far before a call's start a reconciled `create_task` looks for the
/// task it made: generous, since the record's start is this machine's
/// clock and Vikunja filters by its own.
const CREATED_MARGIN: time::Duration = time::Duration::days(1);

/// The handler of one agent's calls.
pub(crate) struct Calls {
    pub bus: Bus,
    pub agent: AgentName,
    pub config: Arc<Config>,
    pub vikunja: Vikunja,
    /// Where a browser opens Vikunja, for the tasks' links.
    pub frontend: String,
}

impl Handler<VikunjaRequest> for Calls {
    async fn handle(
        &self,
        _agent: &AgentName,
        delivery: &Delivery<VikunjaRequest>,
    ) -> Result<(), Unhandled> {
        let request = delivery.message();
        if request.request_id.is_empty() {
            return Err(Unhandled::dead_letter(
                "the request has no request id: nothing to keep it once by, or to answer",
            ));
        }
        self.serve(request).await
    }
}

/// An answer to `request` with `status`.
fn result(request: &VikunjaRequest, status: VikunjaCallStatus) -> VikunjaResult {
    VikunjaResult {
        envelope: Some(SERVICE.reply_to(
            request.envelope.as_ref(),
            format!("vikunja-result:{}", request.request_id),
        )),
        request_id: request.request_id.clone(),
        status: status as i32,
        ..VikunjaResult::default()
    }
}

fn refused(request: &VikunjaRequest, reason: impl Into<String>) -> VikunjaResult {
    VikunjaResult {
        reason: reason.into(),
        ..result(request, VikunjaCallStatus::Refused)
    }
}

fn failed(request: &VikunjaRequest, e: &ApiError) -> VikunjaResult {
    VikunjaResult {
        http_status: e.http_status(),
        reason: e.to_string(),
        ..result(request, VikunjaCallStatus::Failed)
    }
}

fn done(request: &VikunjaRequest) -> VikunjaResult {
    result(request, VikunjaCallStatus::Done)
}

impl Calls {
    /// Makes `request` (at most once per its request id) and publishes its
    /// answer on `in.vikunja.result`: the one path of every call, the
    /// brain's own and those a [`nisse_proto::v1::Tell`] turns into
    /// ([`crate::tells`]), so a ticket is written the same way whichever
    /// asked.
    pub(crate) async fn serve(&self, request: &VikunjaRequest) -> Result<(), Unhandled> {
        let result = self.answer(request).await?;
        tracing::info!(
            request_id = %request.request_id,
            status = ?VikunjaCallStatus::try_from(result.status).unwrap_or_default(),
            reason = %result.reason,
            "Vikunja call answered"
        );
        self.bus.publish(result).await.map_err(Unhandled::retry)?;
        Ok(())
    }

    /// The answer to `request`: made, refused, failed, or given again.
    pub(crate) async fn answer(
        &self,
        request: &VikunjaRequest,
    ) -> Result<VikunjaResult, Unhandled> {
        let Some(call) = &request.call else {
            return Ok(refused(request, "the request names no call"));
        };
        if let Some(why) = nonsense(call) {
            return Ok(refused(request, why));
        }
        match call {
            Call::ReadTask(read) => Ok(self.read_task(request, read.task_id).await),
            Call::CreateTask(c) if !self.config.served(c.project_id) => Ok(refused(
                request,
                self.not_served(&format!("project {}", c.project_id)),
            )),
            _ => self.once(request, call).await,
        }
    }

    fn not_served(&self, what: &str) -> String {
        format!(
            "{what} is not among the projects agent {} serves (vikunja.projects: {})",
            self.agent,
            self.config.projects_listed()
        )
    }

    /// A call with side effects, at most once per request id.
    async fn once(
        &self,
        request: &VikunjaRequest,
        call: &Call,
    ) -> Result<VikunjaResult, Unhandled> {
        nisse_intake_kit::records::once(
            &self.bus,
            VIKUNJA_BUCKET,
            &self.agent,
            &request.request_id,
            "Vikunja",
            |reconcile, started_ms| async move {
                Ok(match call {
                    Call::Comment(c) => self.comment(request, c, reconcile).await,
                    Call::SetDone(s) => self.set_done(request, s, reconcile).await,
                    Call::CreateTask(c) => {
                        self.create_task(request, c, reconcile, started_ms).await
                    }
                    Call::ReadTask(_) => {
                        return Err(Unhandled::dead_letter("a read has no record"));
                    }
                })
            },
        )
        .await
    }

    /// Task `id` as it is now, refused (`Err` with the answer) when it is
    /// not in a served project, failed when it cannot be read.
    async fn served_task(
        &self,
        request: &VikunjaRequest,
        id: i64,
    ) -> Result<(serde_json::Value, Task), VikunjaResult> {
        let (raw, task) = self
            .vikunja
            .retrying("reading a task", |_| self.vikunja.task(id))
            .await
            .map_err(|e| failed(request, &e))?;
        if !self.config.served(task.project_id) {
            return Err(refused(
                request,
                self.not_served(&format!("task {id}'s project {}", task.project_id)),
            ));
        }
        Ok((raw, task))
    }

    async fn read_task(&self, request: &VikunjaRequest, id: i64) -> VikunjaResult {
        match self.served_task(request, id).await {
            Ok((_, task)) => VikunjaResult {
                task: Some(task.to_proto(&self.frontend)),
                ..done(request)
            },
            Err(answer) => answer,
        }
    }

    /// Comments `markdown` on task `task` for `request_id`, or finds the
    /// comment made for it before (`reconcile`, and before a retry after
    /// a failure Vikunja may have carried out: not after a 429, which
    /// refused it). Returns the comment and whether it was found.
    async fn comment_once(
        &self,
        task: i64,
        markdown: &str,
        request_id: &str,
        reconcile: bool,
    ) -> Result<(VikunjaComment, bool), ApiError> {
        let html = &marked_html(markdown, request_id);
        let marker = &marker(request_id);
        let account = &self.config.account;
        self.vikunja
            .retrying("commenting", |attempt| async move {
                if reconcile || attempt.uncertain {
                    let mine = self
                        .vikunja
                        .comments(task)
                        .await?
                        .into_iter()
                        .find(|c| c.comment.contains(marker.as_str()) && c.by(account));
                    if let Some(c) = mine {
                        return Ok((c.to_proto(), true));
                    }
                }
                let c = self.vikunja.create_comment(task, html).await?;
                Ok((c.to_proto(), false))
            })
            .await
    }

    async fn comment(
        &self,
        request: &VikunjaRequest,
        call: &VikunjaCommentCall,
        reconcile: bool,
    ) -> VikunjaResult {
        if let Err(answer) = self.served_task(request, call.task_id).await {
            return answer;
        }
        match self
            .comment_once(call.task_id, &call.comment, &request.request_id, reconcile)
            .await
        {
            Ok((comment, adopted)) => VikunjaResult {
                comment: Some(comment),
                adopted,
                ..done(request)
            },
            Err(e) => failed(request, &e),
        }
    }

    /// The note commented (once), then the task marked. Each attempt
    /// reads the task just before writing it back, so the write replaces
    /// only what was there a moment ago, and an attempt after one that may
    /// have got through finds the task marked already and writes nothing.
    async fn set_done(
        &self,
        request: &VikunjaRequest,
        call: &VikunjaSetDone,
        reconcile: bool,
    ) -> VikunjaResult {
        let id = call.task_id;
        if let Err(answer) = self.served_task(request, id).await {
            return answer;
        }
        let mut answer = done(request);
        if !call.note.trim().is_empty() {
            match self
                .comment_once(id, &call.note, &request.request_id, reconcile)
                .await
            {
                Ok((comment, adopted)) => {
                    answer.comment = Some(comment);
                    answer.adopted = adopted;
                }
                Err(e) => return failed(request, &e),
            }
        }
        let want = call.done;
        let outcome = self
            .vikunja
            .retrying("marking a task", |_| async move {
                let (mut raw, task) = self.vikunja.task(id).await?;
                if task.done == want {
                    return Ok((task, false));
                }
                match raw.as_object_mut() {
                    Some(fields) => {
                        fields.insert("done".into(), serde_json::Value::Bool(want));
                    }
                    None => {
                        return Err(ApiError::Decode {
                            what: format!("GET /api/v1/tasks/{id}"),
                            reason: "the task is not a JSON object".into(),
                        });
                    }
                }
                Ok((self.vikunja.update_task(id, &raw).await?, true))
            })
            .await;
        match outcome {
            Ok((task, wrote)) => {
                if wrote && let Some(updated) = task.updated {
                    // So the poll does not report the agent's own change
                    // back to it; a record not kept costs only that.
                    if let Err(e) =
                        records::note_wrote(&self.bus, &self.agent, id, &rfc3339(Some(updated)))
                            .await
                    {
                        tracing::warn!(task = id, "noting the agent's own write: {e}");
                    }
                }
                if task.done != want {
                    answer.reason = format!(
                        "task {id} repeats: Vikunja moved its dates on instead of marking it done"
                    );
                }
                VikunjaResult {
                    task: Some(task.to_proto(&self.frontend)),
                    ..answer
                }
            }
            Err(e) => failed(request, &e),
        }
    }

    /// Opens the task for `request`, or finds the one made for it before
    /// (`reconcile`, and before a retry after a failure Vikunja may have
    /// carried out): the account's task in the project, made since the
    /// call started (less a margin), whose description carries the
    /// request's marker, adopted as it is.
    async fn create_task(
        &self,
        request: &VikunjaRequest,
        call: &VikunjaCreateTask,
        reconcile: bool,
        started_ms: u64,
    ) -> VikunjaResult {
        let project = call.project_id;
        let id = &request.request_id;
        let marker = &marker(id);
        let html = &marked_html(&call.description, id);
        let title = call.title.trim();
        let account = &self.config.account;
        let started = i64::try_from(started_ms / 1000)
            .ok()
            .and_then(|s| OffsetDateTime::from_unix_timestamp(s).ok())
            .unwrap_or(OffsetDateTime::UNIX_EPOCH);
        let filter = &format!("created >= {}", rfc3339(Some(started - CREATED_MARGIN)));
        let outcome = self
            .vikunja
            .retrying("opening a task", |attempt| async move {
                if reconcile || attempt.uncertain {
                    let made = self
                        .vikunja
                        .tasks(project, filter)
                        .await?
                        .value
                        .into_iter()
                        .find(|t| t.by(account) && t.description.contains(marker.as_str()));
                    if let Some(task) = made {
                        return Ok((task, true));
                    }
                }
                Ok((self.vikunja.create_task(project, title, html).await?, false))
            })
            .await;
        match outcome {
            Ok((task, adopted)) => VikunjaResult {
                task: Some(task.to_proto(&self.frontend)),
                adopted,
                ..done(request)
            },
            Err(e) => failed(request, &e),
        }
    }
}

/// What makes `call` impossible to make, said before Vikunja is called.
fn nonsense(call: &Call) -> Option<String> {
    let blank = |s: &str| s.trim().is_empty();
    match call {
        Call::Comment(c) if c.task_id <= 0 => Some("comment: task_id is not a task's id".into()),
        Call::Comment(c) if blank(&c.comment) => Some("comment: the comment is empty".into()),
        Call::SetDone(s) if s.task_id <= 0 => Some("set_done: task_id is not a task's id".into()),
        Call::ReadTask(r) if r.task_id <= 0 => {
            Some("read_task: task_id is not a task's id".into())
        }
        Call::CreateTask(c) if c.project_id <= 0 => {
            Some("create_task: project_id is not a project's id".into())
        }
        Call::CreateTask(c) if blank(&c.title) => Some("create_task: the title is empty".into()),
        Call::CreateTask(c) if c.title.trim().contains(['\n', '\r']) => Some(
            "create_task: the title is more than one line (a task's title is one line; the rest belongs in the description)"
                .into(),
        ),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nisse_proto::v1::VikunjaReadTask;

    #[test]
    fn nonsense_is_refused_before_vikunja() {
        let c = |task_id, comment: &str| {
            Call::Comment(VikunjaCommentCall {
                task_id,
                comment: comment.into(),
            })
        };
        assert!(nonsense(&c(0, "x")).is_some());
        assert!(nonsense(&c(1, "  ")).unwrap().contains("empty"));
        assert!(nonsense(&c(1, "x")).is_none());
        assert!(
            nonsense(&Call::ReadTask(VikunjaReadTask { task_id: -1 })).is_some(),
            "link shares' ids are negative, tasks' never"
        );
        let create = |project_id, title: &str| {
            Call::CreateTask(VikunjaCreateTask {
                project_id,
                title: title.into(),
                description: String::new(),
            })
        };
        assert!(nonsense(&create(0, "t")).is_some());
        assert!(nonsense(&create(3, " ")).is_some());
        assert!(
            nonsense(&create(3, "Backups\nfailing"))
                .unwrap()
                .contains("one line")
        );
        assert!(
            nonsense(&create(3, "Backups failing\n")).is_none(),
            "sent trimmed"
        );
        let set = Call::SetDone(VikunjaSetDone {
            task_id: 0,
            done: true,
            note: String::new(),
        });
        assert!(nonsense(&set).is_some());
    }
}
