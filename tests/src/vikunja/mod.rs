//! A Vikunja stand-in for tests: no Vikunja server can be installed on
//! these machines, so this one speaks the part of Vikunja's protocol the
//! `intake-vikunja` service uses, taken from Vikunja's own source
//! (`go-vikunja/vikunja` at v2.5.0-160: `pkg/models`, `pkg/web/handler`,
//! `pkg/routes`):
//!
//! - **REST** under `/api/v1` on a free loopback port, with Vikunja's JSON
//!   shapes (its `Task`, `TaskComment`, `User`, `Project`, `Webhook`
//!   models; unset dates as `"0001-01-01T00:00:00Z"`, times in whole
//!   seconds as its database keeps them), its status codes and error
//!   bodies (`{"code", "message"}`, validation errors 412 with
//!   `invalid_fields`, framework errors `{"message"}` only), and its API
//!   token authentication (`Authorization: Bearer tk_…`; every route
//!   but `GET /api/v1/info` needs a token, and a missing, unknown or
//!   insufficient one is 401 code 11). See [`api`] for the routes. A
//!   query parameter the stand-in does not implement is refused with 400
//!   naming it, never silently ignored.
//! - **Webhooks** per project ([`VikunjaStandIn::add_webhook`], or
//!   `PUT /projects/{id}/webhooks`), for the events each names: a POST of
//!   `{"event_name", "time", "data"}` marshalled as Go marshals it
//!   (compact, keys sorted, `<`, `>`, `&` escaped), `data` holding what
//!   Vikunja's webhook listener puts there (the task as the doer reads it,
//!   the doer, the project, and the comment or assignee), signed with
//!   `X-Vikunja-Signature` (hex HMAC-SHA256 of the body with the secret)
//!   when the webhook has a secret. Deliveries go out one at a time in the
//!   order the events happened, and one that gets no answer or a status
//!   above 399 is retried with the same body, up to 6 attempts in all as
//!   Vikunja's watermill retry does (1 + `MaxRetries: 5`), every attempt
//!   recorded ([`VikunjaStandIn::deliveries`]). Vikunja waits 100 ms
//!   doubling with full jitter between attempts; the stand-in waits 50,
//!   100, 200, 400 and 800 ms so tests stay quick and repeatable, and
//!   gives a receiver 5 s to answer (Vikunja 30 s).
//!
//! Tests act as people in Vikunja's web interface through the controls
//! ([`VikunjaStandIn::create_task`], [`VikunjaStandIn::comment`], …):
//! each changes the state as the frontend's API call would, as the given
//! user, and returns once each webhook it fires was attempted once
//! ([`VikunjaStandIn::flush_webhooks`] waits for retries). A change made
//! through the API is answered first and its webhooks follow, as Vikunja
//! dispatches them after the commit. The agent's own API calls fire the
//! same events as a person's, with the agent as `doer`.
//!
//! Access: a project's owner administers it; anyone else needs it shared
//! ([`VikunjaStandIn::share_project`]) to read it, or to write (create,
//! update, comment on, assign) its tasks with [`Permission::Write`].
//!
//! Not modelled: project views, kanban buckets (a task's `bucket_id` is
//! 0 and `buckets` absent, as for a project without kanban views; a
//! project's `views` is `[]`), sub-projects, teams, link shares,
//! attachments, relations, reactions, subscriptions, repeating tasks,
//! task deletion, search (`s`) on tasks. Requests that need them are
//! refused with 400 naming what is missing, or 404 for routes not served.

pub mod api;
mod controls;
mod filter;
mod hooks;
mod json;
mod ops;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use anyhow::Context as _;
use hmac::Mac as _;
use time::OffsetDateTime;
use tokio::task::JoinHandle;

pub use hooks::Delivery;

/// The version `GET /api/v1/info` reports and deliveries name in their
/// `User-Agent`: the Vikunja release whose API the stand-in follows.
pub const VIKUNJA_VERSION: &str = "v2.5.0";

/// Vikunja's `service.maxitemsperpage` default: the page size when a
/// request names none, and the largest it may ask for.
pub const MAX_ITEMS_PER_PAGE: usize = 50;

/// Every event a webhook may name, sorted as `GET /webhooks/events`
/// lists them (`availableWebhookEvents`). The stand-in fires
/// `task.created`, `task.updated`, `task.assignee.created`,
/// `task.assignee.deleted`, `task.comment.created`, `task.comment.edited`
/// and `project.shared.user`; the others exist but nothing here makes
/// them happen.
pub const WEBHOOK_EVENTS: [&str; 19] = [
    "project.deleted",
    "project.shared.team",
    "project.shared.user",
    "project.updated",
    "task.assignee.created",
    "task.assignee.deleted",
    "task.attachment.created",
    "task.attachment.deleted",
    "task.comment.created",
    "task.comment.deleted",
    "task.comment.edited",
    "task.created",
    "task.deleted",
    "task.overdue",
    "task.relation.created",
    "task.relation.deleted",
    "task.reminder.fired",
    "task.updated",
    "tasks.overdue",
];

/// A running Vikunja stand-in: its HTTP server, its webhook worker and its
/// state, all stopped when it is dropped.
pub struct VikunjaStandIn {
    shared: Arc<Shared>,
    server: JoinHandle<()>,
    worker: JoinHandle<()>,
}

/// What the HTTP handlers, the webhook worker and the controls share.
pub(crate) struct Shared {
    /// `http://127.0.0.1:PORT`, no trailing slash.
    pub(crate) base_url: String,
    pub(crate) state: Arc<Mutex<State>>,
    pub(crate) hooks: hooks::Queue,
}

impl Shared {
    /// The state, whatever a panicking holder left: every change is made
    /// whole before the lock is let go, so a poisoned lock still holds
    /// consistent state.
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }
}

pub(crate) fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// What a user may do in a project (Vikunja's `Permission`: 0 read, 1
/// read and write, 2 admin), as `max_permission` and `x-max-permission`
/// report it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Permission {
    /// See the project and its tasks.
    Read,
    /// Also create, change, comment on and assign its tasks.
    Write,
    /// Also manage the project (its owner has this).
    Admin,
}

impl Permission {
    /// Vikunja's number for it.
    pub fn number(self) -> i64 {
        match self {
            Self::Read => 0,
            Self::Write => 1,
            Self::Admin => 2,
        }
    }
}

/// A task as it stands.
#[derive(Debug, Clone, PartialEq)]
pub struct Task {
    /// Its id (one sequence over all projects).
    pub id: i64,
    /// The project it is in.
    pub project_id: i64,
    /// Its number within the project.
    pub index: i64,
    /// What people see: `#<index>`, or `<project identifier>-<index>`.
    pub identifier: String,
    /// Its title.
    pub title: String,
    /// Its description (HTML, as the frontend's editor stores it).
    pub description: String,
    /// Whether it is done.
    pub done: bool,
    /// When it was marked done, while it is.
    pub done_at: Option<OffsetDateTime>,
    /// When it is due, if it is.
    pub due_date: Option<OffsetDateTime>,
    /// Its priority (0 unset).
    pub priority: i64,
    /// Who created it (username).
    pub created_by: String,
    /// Its assignees' usernames, in the order they were assigned.
    pub assignees: Vec<String>,
    /// Its labels' titles, in the order they were added.
    pub labels: Vec<String>,
    /// When it was created (whole seconds).
    pub created: OffsetDateTime,
    /// When it last changed; comments and assignments move it too.
    pub updated: OffsetDateTime,
}

/// A comment on a task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Comment {
    /// Its id (one sequence over all tasks).
    pub id: i64,
    /// The task it is on.
    pub task_id: i64,
    /// Who wrote it (username).
    pub author: String,
    /// What it says (HTML).
    pub comment: String,
    /// When it was written.
    pub created: OffsetDateTime,
    /// When it was last edited (its creation time until then).
    pub updated: OffsetDateTime,
}

/// One API request the stand-in answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiRequest {
    /// `GET`, `PUT`, `POST`, `DELETE`…
    pub method: String,
    /// The path, e.g. `/api/v1/tasks/3/comments`.
    pub path: String,
    /// The raw query string, empty without one.
    pub query: String,
    /// The body as sent (lossily UTF-8), empty without one.
    pub body: String,
    /// The user whose token it carried; `None` without a valid token.
    pub user: Option<String>,
    /// The status it was answered with.
    pub status: u16,
}

/// Requests the stand-in answers with an error status
/// ([`VikunjaStandIn::refuse_next`], [`VikunjaStandIn::lose_answers`]).
pub(crate) struct Fault {
    pub(crate) method: String,
    pub(crate) path: String,
    pub(crate) status: u16,
    pub(crate) retry_after: Option<u64>,
    pub(crate) remaining: usize,
    /// Served first, the answer then replaced.
    pub(crate) served: bool,
}

// ---------------------------------------------------------------------------
// State
// ---------------------------------------------------------------------------

/// Everything the stand-in knows, in memory.
#[derive(Default)]
pub(crate) struct State {
    pub(crate) users: Vec<UserRec>,
    pub(crate) tokens: Vec<TokenRec>,
    pub(crate) projects: Vec<ProjectRec>,
    pub(crate) tasks: Vec<TaskRec>,
    pub(crate) comments: Vec<CommentRec>,
    pub(crate) labels: Vec<LabelRec>,
    pub(crate) hooks: Vec<HookRec>,
    pub(crate) hooks_enabled: bool,
    pub(crate) deliveries: Vec<Delivery>,
    pub(crate) requests: Vec<ApiRequest>,
    pub(crate) faults: Vec<Fault>,
    pub(crate) next: Ids,
}

/// The last id handed out of each sequence.
#[derive(Default)]
pub(crate) struct Ids {
    user: i64,
    project: i64,
    pub(crate) task: i64,
    pub(crate) comment: i64,
    pub(crate) label: i64,
    pub(crate) hook: i64,
}

pub(crate) struct UserRec {
    pub(crate) id: i64,
    pub(crate) username: String,
    /// The display name (Vikunja's `name`), empty unless set.
    pub(crate) name: String,
    pub(crate) created: OffsetDateTime,
    pub(crate) updated: OffsetDateTime,
}

/// An API token: whose it is, and, for a scoped one, the permissions it
/// was made with (group → permissions, as `PUT /tokens` takes them).
pub(crate) struct TokenRec {
    pub(crate) token: String,
    pub(crate) user_id: i64,
    pub(crate) permissions: Option<BTreeMap<String, Vec<String>>>,
}

pub(crate) struct ProjectRec {
    pub(crate) id: i64,
    pub(crate) title: String,
    pub(crate) description: String,
    /// Up to 10 characters; task identifiers are `<identifier>-<index>`.
    pub(crate) identifier: String,
    pub(crate) owner_id: i64,
    /// Users it was shared with, and how.
    pub(crate) shares: Vec<(i64, Permission)>,
    pub(crate) created: OffsetDateTime,
    pub(crate) updated: OffsetDateTime,
}

/// A reminder as stored: relative ones keep what they are relative to,
/// their `reminder` computed from it.
#[derive(Clone)]
pub(crate) struct ReminderRec {
    pub(crate) reminder: Option<OffsetDateTime>,
    pub(crate) relative_period: i64,
    pub(crate) relative_to: String,
}

pub(crate) struct TaskRec {
    pub(crate) id: i64,
    pub(crate) project_id: i64,
    pub(crate) index: i64,
    pub(crate) title: String,
    pub(crate) description: String,
    pub(crate) done: bool,
    pub(crate) done_at: Option<OffsetDateTime>,
    pub(crate) due_date: Option<OffsetDateTime>,
    pub(crate) start_date: Option<OffsetDateTime>,
    pub(crate) end_date: Option<OffsetDateTime>,
    pub(crate) priority: i64,
    pub(crate) percent_done: f64,
    pub(crate) hex_color: String,
    pub(crate) reminders: Vec<ReminderRec>,
    /// User ids, in the order they were assigned.
    pub(crate) assignees: Vec<i64>,
    /// Label ids, in the order they were added.
    pub(crate) labels: Vec<i64>,
    /// Users who marked it a favourite (`is_favorite` is per user).
    pub(crate) favorites: Vec<i64>,
    pub(crate) created_by: i64,
    pub(crate) created: OffsetDateTime,
    pub(crate) updated: OffsetDateTime,
}

pub(crate) struct CommentRec {
    pub(crate) id: i64,
    pub(crate) task_id: i64,
    pub(crate) author_id: i64,
    pub(crate) comment: String,
    pub(crate) created: OffsetDateTime,
    pub(crate) updated: OffsetDateTime,
}

pub(crate) struct LabelRec {
    pub(crate) id: i64,
    pub(crate) title: String,
    pub(crate) created_by: i64,
    pub(crate) created: OffsetDateTime,
}

/// A project webhook.
pub(crate) struct HookRec {
    pub(crate) id: i64,
    pub(crate) project_id: i64,
    pub(crate) target_url: String,
    pub(crate) events: Vec<String>,
    pub(crate) secret: String,
    pub(crate) basic_auth: Option<(String, String)>,
    pub(crate) created_by: i64,
    pub(crate) created: OffsetDateTime,
}

/// Now, in whole seconds as Vikunja's database keeps time (so `updated`
/// filters are exactly as coarse as Vikunja's).
pub(crate) fn now() -> OffsetDateTime {
    let now = OffsetDateTime::now_utc();
    now.replace_nanosecond(0).unwrap_or(now)
}

/// A Vikunja API token: `tk_` and the hex of 20 random bytes.
fn new_token() -> String {
    let a = uuid::Uuid::new_v4().simple().to_string();
    let b = uuid::Uuid::new_v4().simple().to_string();
    format!("tk_{a}{}", &b[..8])
}

impl State {
    pub(crate) fn user(&self, id: i64) -> Option<&UserRec> {
        self.users.iter().find(|u| u.id == id)
    }

    pub(crate) fn user_by_name(&self, username: &str) -> Option<&UserRec> {
        self.users.iter().find(|u| u.username == username)
    }

    pub(crate) fn username(&self, id: i64) -> String {
        self.user(id)
            .map(|u| u.username.clone())
            .unwrap_or_default()
    }

    pub(crate) fn project(&self, id: i64) -> Option<&ProjectRec> {
        self.projects.iter().find(|p| p.id == id)
    }

    pub(crate) fn task(&self, id: i64) -> Option<&TaskRec> {
        self.tasks.iter().find(|t| t.id == id)
    }

    pub(crate) fn task_mut(&mut self, id: i64) -> Option<&mut TaskRec> {
        self.tasks.iter_mut().find(|t| t.id == id)
    }

    /// What `user` may do in `project`: its owner administers it, the
    /// users it was shared with have their share, nobody else anything.
    pub(crate) fn permission(&self, user: i64, project: i64) -> Option<Permission> {
        let p = self.project(project)?;
        if p.owner_id == user {
            return Some(Permission::Admin);
        }
        p.shares.iter().find(|(u, _)| *u == user).map(|(_, p)| *p)
    }

    pub(crate) fn can_write(&self, user: i64, project: i64) -> bool {
        self.permission(user, project)
            .is_some_and(|p| p >= Permission::Write)
    }

    /// The identifier of task `t`: `<project identifier>-<index>`, or
    /// `#<index>` when the project has none (`setIdentifier`).
    pub(crate) fn identifier(&self, t: &TaskRec) -> String {
        match self.project(t.project_id).map(|p| p.identifier.as_str()) {
            Some(ident) if !ident.is_empty() => format!("{ident}-{}", t.index),
            _ => format!("#{}", t.index),
        }
    }

    /// The index a new task of `project` gets (`calculateNextTaskIndex`:
    /// one more than the highest).
    pub(crate) fn next_index(&self, project: i64) -> i64 {
        self.tasks
            .iter()
            .filter(|t| t.project_id == project)
            .map(|t| t.index)
            .max()
            .unwrap_or(0)
            + 1
    }

    fn snapshot(&self, t: &TaskRec) -> Task {
        let names = |ids: &[i64]| ids.iter().map(|id| self.username(*id)).collect();
        Task {
            id: t.id,
            project_id: t.project_id,
            index: t.index,
            identifier: self.identifier(t),
            title: t.title.clone(),
            description: t.description.clone(),
            done: t.done,
            done_at: t.done_at,
            due_date: t.due_date,
            priority: t.priority,
            created_by: self.username(t.created_by),
            assignees: names(&t.assignees),
            labels: t
                .labels
                .iter()
                .filter_map(|id| self.labels.iter().find(|l| l.id == *id))
                .map(|l| l.title.clone())
                .collect(),
            created: t.created,
            updated: t.updated,
        }
    }

    /// The fault `method` on `path` meets, if one is left; it is counted
    /// down.
    pub(crate) fn fault(&mut self, method: &str, path: &str) -> Option<(u16, Option<u64>, bool)> {
        let f = self
            .faults
            .iter_mut()
            .find(|f| f.remaining > 0 && f.method == method && f.path == path)?;
        f.remaining -= 1;
        Some((f.status, f.retry_after, f.served))
    }
}

impl VikunjaStandIn {
    /// Starts the HTTP server on a free loopback port and the webhook
    /// worker.
    pub async fn start() -> anyhow::Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .context("binding the Vikunja stand-in's HTTP port")?;
        let addr = listener.local_addr()?;
        let state = Arc::new(Mutex::new(State {
            hooks_enabled: true,
            ..State::default()
        }));
        let (queue, worker) = hooks::Queue::start(state.clone())?;
        let shared = Arc::new(Shared {
            base_url: format!("http://{addr}"),
            state,
            hooks: queue,
        });
        let app = api::router(shared.clone());
        let server = tokio::spawn(async move {
            // It serves until the stand-in is dropped, which aborts it.
            let _ = axum::serve(listener, app).await;
        });
        Ok(Self {
            shared,
            server,
            worker,
        })
    }

    /// Base URL without the API prefix, e.g. `http://127.0.0.1:PORT`;
    /// the API is under `/api/v1`.
    pub fn url(&self) -> &str {
        &self.shared.base_url
    }

    /// [`VikunjaStandIn::url`] followed by `/api/v1`.
    pub fn api_url(&self) -> String {
        format!("{}/api/v1", self.shared.base_url)
    }

    /// Adds a user and returns its API token (`tk_` and 40 hex
    /// characters, for `Authorization: Bearer <token>`), which may use
    /// every route the stand-in serves. An operator, the agent and a
    /// stranger are all just users. A username already taken, or one
    /// Vikunja would refuse (empty, over 250 characters), is refused.
    pub fn add_user(&self, username: &str) -> anyhow::Result<String> {
        if username.is_empty() || username.chars().count() > 250 {
            anyhow::bail!("a Vikunja username has 1 to 250 characters, got {username:?}");
        }
        let mut state = self.shared.lock();
        if state.user_by_name(username).is_some() {
            anyhow::bail!("the Vikunja stand-in already has a user {username:?}");
        }
        state.next.user += 1;
        let id = state.next.user;
        let at = now();
        state.users.push(UserRec {
            id,
            username: username.to_string(),
            name: String::new(),
            created: at,
            updated: at,
        });
        let token = new_token();
        state.tokens.push(TokenRec {
            token: token.clone(),
            user_id: id,
            permissions: None,
        });
        Ok(token)
    }

    /// Sets `username`'s display name (Vikunja's `name`, empty by
    /// default), which user objects carry next to the username.
    pub fn set_name(&self, username: &str, name: &str) -> anyhow::Result<()> {
        let mut state = self.shared.lock();
        let user = state
            .users
            .iter_mut()
            .find(|u| u.username == username)
            .with_context(|| format!("the Vikunja stand-in has no user {username:?}"))?;
        user.name = name.to_string();
        user.updated = now();
        Ok(())
    }

    /// Another API token of `username`, scoped as `PUT /api/v1/tokens`
    /// scopes one: `permissions` maps groups to permissions, e.g.
    /// `[("tasks", &["read_one", "update"]), ("tasks_comments", &["create"])]`.
    /// A request on a route the token has no permission for is 401 code
    /// 11, as Vikunja answers it. Groups are named as `GET /api/v1/routes`
    /// names them (see [`api`]); one the stand-in serves no route of is
    /// refused.
    pub fn add_token(
        &self,
        username: &str,
        permissions: &[(&str, &[&str])],
    ) -> anyhow::Result<String> {
        let known = api::token_permissions();
        let mut granted: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (group, perms) in permissions {
            for perm in *perms {
                if !known.iter().any(|(g, p)| g == group && p == perm) {
                    anyhow::bail!(
                        "the Vikunja stand-in serves no route for token permission {group}.{perm}; it knows {}",
                        known
                            .iter()
                            .map(|(g, p)| format!("{g}.{p}"))
                            .collect::<Vec<_>>()
                            .join(", ")
                    );
                }
                granted
                    .entry((*group).to_string())
                    .or_default()
                    .push((*perm).to_string());
            }
        }
        let mut state = self.shared.lock();
        let user_id = state
            .user_by_name(username)
            .map(|u| u.id)
            .with_context(|| format!("the Vikunja stand-in has no user {username:?}"))?;
        let token = new_token();
        state.tokens.push(TokenRec {
            token: token.clone(),
            user_id,
            permissions: Some(granted),
        });
        Ok(token)
    }

    /// A project owned by `owner` (a user), titled `title`; returns its
    /// id. It has no identifier, so its tasks are `#1`, `#2`…
    pub fn add_project(&self, owner: &str, title: &str) -> anyhow::Result<i64> {
        if title.is_empty() || title.chars().count() > 250 {
            anyhow::bail!("a Vikunja project title has 1 to 250 characters, got {title:?}");
        }
        let mut state = self.shared.lock();
        let owner_id = state.user_by_name(owner).map(|u| u.id).with_context(|| {
            format!("the Vikunja stand-in has no user {owner:?} to own a project")
        })?;
        state.next.project += 1;
        let id = state.next.project;
        let at = now();
        state.projects.push(ProjectRec {
            id,
            title: title.to_string(),
            description: String::new(),
            identifier: String::new(),
            owner_id,
            shares: Vec::new(),
            created: at,
            updated: at,
        });
        Ok(id)
    }

    /// Sets project `project_id`'s identifier (up to 10 characters, as
    /// Vikunja allows), so its tasks are `<identifier>-<index>`; empty
    /// clears it.
    pub fn set_project_identifier(&self, project_id: i64, identifier: &str) -> anyhow::Result<()> {
        if identifier.chars().count() > 10 {
            anyhow::bail!(
                "a Vikunja project identifier has at most 10 characters, got {identifier:?}"
            );
        }
        let mut state = self.shared.lock();
        let project = state
            .projects
            .iter_mut()
            .find(|p| p.id == project_id)
            .with_context(|| format!("the Vikunja stand-in has no project {project_id}"))?;
        project.identifier = identifier.to_string();
        project.updated = now();
        Ok(())
    }

    /// A webhook on project `project_id` sending `events` (Vikunja's
    /// names, [`WEBHOOK_EVENTS`]) to `target_url`, signed with `secret`
    /// (an empty one sends no `X-Vikunja-Signature`, as Vikunja does);
    /// returns its id. Made by the project's owner, as through
    /// `PUT /projects/{id}/webhooks`.
    ///
    /// Panics, as a test bug, on a project that does not exist, a URL
    /// that does not start with `http` or an event Vikunja does not have
    /// (Vikunja refuses those with 412).
    pub fn add_webhook(
        &self,
        project_id: i64,
        target_url: &str,
        secret: &str,
        events: &[&str],
    ) -> i64 {
        if !target_url.starts_with("http") {
            panic!("a Vikunja webhook's target_url starts with http, got {target_url:?}");
        }
        if events.is_empty() {
            panic!("a Vikunja webhook needs at least one event");
        }
        if let Some(e) = events.iter().find(|e| !WEBHOOK_EVENTS.contains(e)) {
            panic!(
                "Vikunja has no webhook event {e:?}; it has {}",
                WEBHOOK_EVENTS.join(", ")
            );
        }
        let mut state = self.shared.lock();
        let Some(owner) = state.project(project_id).map(|p| p.owner_id) else {
            panic!("the Vikunja stand-in has no project {project_id} to add a webhook to");
        };
        state.next.hook += 1;
        let id = state.next.hook;
        state.hooks.push(HookRec {
            id,
            project_id,
            target_url: target_url.to_string(),
            events: events.iter().map(|e| (*e).to_string()).collect(),
            secret: secret.to_string(),
            basic_auth: None,
            created_by: owner,
            created: now(),
        });
        id
    }

    /// Task `id` as it stands.
    pub fn task(&self, id: i64) -> Option<Task> {
        let state = self.shared.lock();
        state.task(id).map(|t| state.snapshot(t))
    }

    /// Every task of project `project_id`, by id.
    pub fn tasks(&self, project_id: i64) -> Vec<Task> {
        let state = self.shared.lock();
        state
            .tasks
            .iter()
            .filter(|t| t.project_id == project_id)
            .map(|t| state.snapshot(t))
            .collect()
    }

    /// The comments on task `task_id`, oldest first.
    pub fn comments(&self, task_id: i64) -> Vec<Comment> {
        let state = self.shared.lock();
        state
            .comments
            .iter()
            .filter(|c| c.task_id == task_id)
            .map(|c| Comment {
                id: c.id,
                task_id: c.task_id,
                author: state.username(c.author_id),
                comment: c.comment.clone(),
                created: c.created,
                updated: c.updated,
            })
            .collect()
    }

    /// Every delivery attempt so far, in the order they were made (a
    /// retry is another attempt of the same body, its
    /// [`Delivery::attempt`] one higher).
    pub fn deliveries(&self) -> Vec<Delivery> {
        self.shared.lock().deliveries.clone()
    }

    /// Every API request answered so far, in order.
    pub fn requests(&self) -> Vec<ApiRequest> {
        self.shared.lock().requests.clone()
    }

    /// With `false`, events are not delivered at all from now on (nor
    /// recorded): webhooks Vikunja lost, for the client to find the
    /// changes by polling. `true` delivers again from the next event on;
    /// lost ones stay lost, as Vikunja has no redelivery.
    pub fn set_webhooks_enabled(&self, enabled: bool) {
        self.shared.lock().hooks_enabled = enabled;
    }

    /// Waits until every delivery queued so far is done: answered with
    /// success, or given up after its last retry.
    pub async fn flush_webhooks(&self) -> anyhow::Result<()> {
        self.shared.hooks.flush().await
    }

    /// Answers the next `times` requests of `method` (`GET`, `POST`…) on
    /// `path` (as [`ApiRequest::path`] writes it: `/api/v1/tasks/3`)
    /// with `status` and, if given, `Retry-After: <seconds>`, instead of
    /// serving them, as a rate limiter (429) or an overloaded server or
    /// proxy (502, 503) would: nothing they ask for is done. The body is
    /// `{"message": …}`. Refusals of the same request are used up in the
    /// order they were added.
    ///
    /// Panics, as a test bug, on a status that is not an error (4xx, 5xx).
    pub fn refuse_next(
        &self,
        method: &str,
        path: &str,
        status: u16,
        retry_after: Option<u64>,
        times: usize,
    ) {
        self.add_fault(method, path, status, retry_after, times, false);
    }

    /// Serves the next `times` requests of `method` on `path` and then
    /// answers `status` instead of what they got, as a proxy that gave up
    /// waiting does (502, 504): what they asked for is done (webhooks
    /// included), and the client cannot tell.
    ///
    /// Panics, as a test bug, on a status that is not an error (4xx, 5xx).
    pub fn lose_answers(&self, method: &str, path: &str, status: u16, times: usize) {
        self.add_fault(method, path, status, None, times, true);
    }

    fn add_fault(
        &self,
        method: &str,
        path: &str,
        status: u16,
        retry_after: Option<u64>,
        times: usize,
        served: bool,
    ) {
        if !(400..=599).contains(&status) {
            panic!("the Vikunja stand-in answers an error status (4xx or 5xx) here, not {status}");
        }
        self.shared.lock().faults.push(Fault {
            method: method.to_ascii_uppercase(),
            path: path.to_string(),
            status,
            retry_after,
            remaining: times,
            served,
        });
    }

    /// Sends `body` with exactly `headers` to `url` as a webhook delivery
    /// would (a POST), nothing recorded: for forged, tampered and
    /// replayed deliveries. Returns the status it was answered with.
    pub async fn send_raw(
        &self,
        url: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> anyhow::Result<u16> {
        self.shared.hooks.send_raw(url, headers, body).await
    }

    /// The signature Vikunja puts on `body` with `secret`
    /// (`X-Vikunja-Signature`): the lowercase hex HMAC-SHA256 of the raw
    /// bytes, no prefix.
    pub fn sign(secret: &str, body: &[u8]) -> String {
        // HMAC takes keys of any length; new_from_slice cannot fail for it.
        let Ok(mut mac) = hmac::Hmac::<sha2::Sha256>::new_from_slice(secret.as_bytes()) else {
            unreachable!("HMAC accepts keys of every length")
        };
        mac.update(body);
        hex::encode(mac.finalize().into_bytes())
    }
}

impl Drop for VikunjaStandIn {
    fn drop(&mut self) {
        self.server.abort();
        self.worker.abort();
    }
}
