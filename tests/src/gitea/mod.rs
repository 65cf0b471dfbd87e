//! A Gitea stand-in for tests: no Gitea server can be installed on these
//! machines, so this one speaks the subset of Gitea's protocol the dev
//! agent and its intake use, taken from Gitea's own API description
//! (`templates/swagger/v1_json.tmpl`), its `modules/structs` types and
//! its webhook delivery (`services/webhook/deliver.go`):
//!
//! - **REST** under `/api/v1` on a free loopback port, with Gitea's JSON
//!   shapes, status codes and error bodies (`{"message", "url"}`), and
//!   its token authentication (`Authorization: token <t>` or `Bearer
//!   <t>`). Every request needs a token, except `GET /api/v1/version`,
//!   as if the instance required sign-in; a missing one is answered 401
//!   `token is required`, a wrong one 401 `invalid username, password or
//!   token`, as Gitea answers them. See [`api`] for the routes. A test
//!   can have requests refused with 429 or 503 and `Retry-After`
//!   ([`GiteaStandIn::refuse_next`]), as a rate limiter or an overloaded
//!   Gitea does, or served and their answers lost
//!   ([`GiteaStandIn::lose_answers`]), as a proxy that gave up waiting.
//! - **Webhooks** to every URL added with [`GiteaStandIn::add_webhook`],
//!   with the payloads of Gitea's `hook.go` and the headers `deliver.go`
//!   sets (`X-Gitea-Delivery`, `X-Gitea-Event`, `X-Gitea-Event-Type`,
//!   `X-Gitea-Signature`: hex HMAC-SHA256 of the body with the secret,
//!   the `X-Gogs-*`, `X-Hub-Signature*` and `X-GitHub-*` copies), body
//!   indented by two spaces as Gitea marshals it. Deliveries go out one
//!   at a time in the order the events happened; every one is recorded.
//!   A test's control returns once its webhooks were attempted; a change
//!   made through the API is answered first and its webhooks follow, as
//!   Gitea queues them ([`GiteaStandIn::flush_webhooks`] waits for them).
//! - **Git** in real bare repositories, reached with real `git` over real
//!   SSH through the harness's own OpenSSH server ([`TestSshd`]), keys
//!   restricted to `git-shell`, each knowing its owner. A `pre-receive`
//!   hook enforces the default branch's protection rule ([`Protection`],
//!   which a test may relax with [`GiteaRepo::set_protection`]: by
//!   default nobody may push to it), never lets it be deleted and refuses
//!   deleting any branch; merges are made by the stand-in itself, as Gitea
//!   makes them. The Branch API reports the same rule for the caller, and
//!   the merge API (`POST .../pulls/{index}/merge`) enforces its merge
//!   part: who may merge, the approvals and the status checks required.
//! - **Commit statuses**, as a CI reports them through the API or a test
//!   through [`GiteaRepo::set_status`], combined per commit as Gitea
//!   combines them.
//!
//! Tests drive what people would do in Gitea's web interface through the
//! [`GiteaRepo`] controls (open an issue, assign it, comment, review,
//! merge), each changing the state and sending the webhook Gitea would
//! send, and then read what the client under test did through the
//! inspection methods ([`GiteaRepo::issue`], [`GiteaStandIn::requests`]).
//!
//! Not served: pushes do not produce `push` or `pull_request_sync`
//! webhooks (the stand-in does not watch the repositories), commit
//! statuses produce no `status` webhook, pending reviews, dismissing
//! reviews, milestones, reactions, attachments, organisations and teams.
//! A request for any of it is answered 404, and a filter or field the
//! stand-in does not implement is refused with 422 naming it, never
//! silently ignored.

pub mod api;
mod controls;
mod git;
mod hooks;
mod json;
mod ops;
#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use anyhow::Context as _;
use tempfile::TempDir;
use time::OffsetDateTime;
use tokio::task::JoinHandle;

use crate::sshd::TestSshd;

pub use hooks::Delivery;

/// The version `GET /api/v1/version` reports: the Gitea release whose
/// API and webhook shapes the stand-in follows.
pub const GITEA_VERSION: &str = "1.24.0";

/// The `git-shell` a push key is restricted to: Debian's or a source
/// build's, whichever is installed.
const GIT_SHELLS: [&str; 2] = ["/usr/bin/git-shell", "/usr/local/bin/git-shell"];

/// A running Gitea stand-in: its HTTP server, its SSH server for git and
/// its state, all dropped with it.
pub struct GiteaStandIn {
    shared: Arc<Shared>,
    sshd: TestSshd,
    server: JoinHandle<()>,
    worker: JoinHandle<()>,
}

/// What the HTTP handlers, the webhook worker and the repository handles
/// share.
pub(crate) struct Shared {
    /// `http://127.0.0.1:PORT`, no trailing slash.
    pub(crate) base_url: String,
    /// `ssh://USER@127.0.0.1:PORT`: a repository's clone URL is this and
    /// its absolute path.
    pub(crate) ssh_base: String,
    pub(crate) state: Arc<Mutex<State>>,
    pub(crate) hooks: hooks::Queue,
    /// Held while a merge is checked and made, so two merges of a pull
    /// request are never both made (Gitea serialises them the same way).
    pub(crate) merging: tokio::sync::Mutex<()>,
    /// Bare repositories under `repos/`, keys under `keys/`.
    dir: TempDir,
    known_hosts: PathBuf,
}

impl Shared {
    /// The state, whatever a panicking holder left: every change is made
    /// whole before the lock is let go, so a poisoned lock still holds
    /// consistent state.
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Who sent an API request, as the stand-in saw its token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenUse {
    /// No `Authorization` header.
    Missing,
    /// A token no user has, or a scheme other than `token`/`Bearer`.
    Wrong,
    /// The token of this user (login).
    Valid(String),
}

/// One API request the stand-in answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiRequest {
    /// `GET`, `POST`, `PATCH`…
    pub method: String,
    /// The path, e.g. `/api/v1/repos/ops/app/pulls`.
    pub path: String,
    /// The raw query string, empty without one.
    pub query: String,
    /// The status it was answered with.
    pub status: u16,
    /// How its token was judged.
    pub token: TokenUse,
}

/// The `Retry-After` a refused request is answered with
/// ([`GiteaStandIn::refuse_next`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryAfter {
    /// No `Retry-After` header.
    None,
    /// `Retry-After: <seconds>`.
    Seconds(u64),
    /// `Retry-After: <HTTP date>`: this long after the answer, as an
    /// IMF-fixdate (`Wed, 01 May 2024 08:00:05 GMT`) in whole seconds, like
    /// the answer's own `Date`.
    DateIn(Duration),
}

impl RetryAfter {
    /// The header's value, if there is one.
    pub(crate) fn value(self) -> Option<String> {
        match self {
            Self::None => None,
            Self::Seconds(s) => Some(s.to_string()),
            Self::DateIn(d) => Some(http_date(now() + d)),
        }
    }
}

/// `t` as an HTTP date (RFC 9110's IMF-fixdate), in UTC.
pub fn http_date(t: OffsetDateTime) -> String {
    let format = time::macros::format_description!(
        "[weekday repr:short], [day] [month repr:short] [year] [hour]:[minute]:[second] GMT"
    );
    t.to_offset(time::UtcOffset::UTC)
        .format(&format)
        .unwrap_or_else(|e| unreachable!("every time formats as an HTTP date: {e}"))
}

/// Requests the stand-in answers with an error status: the next
/// `remaining` of `method` on `path`, unserved (a rate limiter, an
/// overloaded Gitea) or, with `served`, served and their answer lost (a
/// proxy that gave up waiting for Gitea).
/// The default branch's protection rule, as an operator sets it in
/// Gitea's repository settings. The `pre-receive` hook enforces its push
/// part on every push over SSH; the Branch API (`GET
/// /repos/{owner}/{repo}/branches/{branch}`) reports it for the caller,
/// as Gitea does (`protected`, `user_can_push`, `user_can_merge`,
/// `required_approvals`, `enable_status_check`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Protection {
    /// Whether the rule exists. Without it, anyone with write access (any
    /// user here) may push to the branch and merge without approvals.
    pub enabled: bool,
    /// Who may push to the branch while the rule is enabled.
    pub push_allowlist: Vec<String>,
    /// Who may merge into it; `None` is anyone with write access.
    pub merge_allowlist: Option<Vec<String>>,
    /// Approvals a pull request needs before it merges. Only an official
    /// approval counts (a reviewer's latest verdict, by someone other than
    /// the author) given on the current head: the stand-in's rule ignores
    /// stale approvals, as Gitea's "ignore stale approvals" setting does.
    pub required_approvals: u32,
    /// Status check contexts whose latest status on the head must be
    /// `success` (or `warning`, `skipped`, which Gitea counts as passing)
    /// before a merge; empty is none required. Names are matched exactly:
    /// Gitea's glob patterns are refused by [`GiteaRepo::set_protection`].
    pub status_check_contexts: Vec<String>,
}

impl Default for Protection {
    /// What a repository the operator set up for the agent has: nobody
    /// pushes to the default branch, a merge needs one approval.
    fn default() -> Self {
        Self {
            enabled: true,
            push_allowlist: Vec::new(),
            merge_allowlist: None,
            required_approvals: 1,
            status_check_contexts: Vec::new(),
        }
    }
}

impl Protection {
    /// Whether `login` may push to the branch.
    pub fn may_push(&self, login: &str) -> bool {
        !self.enabled || self.push_allowlist.iter().any(|l| l == login)
    }

    /// Whether `login` may merge into the branch (approvals aside).
    pub fn may_merge(&self, login: &str) -> bool {
        !self.enabled
            || self
                .merge_allowlist
                .as_ref()
                .is_none_or(|l| l.iter().any(|x| x == login))
    }
}

/// A request [`GiteaStandIn::hang_next`] keeps unanswered.
pub(crate) struct HangRec {
    pub(crate) method: String,
    pub(crate) path: String,
    pub(crate) served: bool,
    pub(crate) arrived: Arc<tokio::sync::Notify>,
}

/// A request the stand-in holds without an answer: [`Hang::arrived`]
/// returns once it came (and, if it is served, was done).
pub struct Hang(Arc<tokio::sync::Notify>);

impl Hang {
    /// Waits until the held request arrived.
    pub async fn arrived(&self) {
        self.0.notified().await;
    }
}

pub(crate) struct Refusal {
    pub(crate) method: String,
    pub(crate) path: String,
    pub(crate) remaining: usize,
    pub(crate) status: u16,
    pub(crate) retry_after: RetryAfter,
    pub(crate) served: bool,
}

/// An issue or a pull request as it stands (a pull request is an issue
/// with [`Issue::is_pull`]; they share one numbering per repository).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Issue {
    /// Its number in the repository.
    pub number: i64,
    /// Its title.
    pub title: String,
    /// Its body (Markdown).
    pub body: String,
    /// Who opened it (login).
    pub user: String,
    /// Whether it is closed (a merged pull request is closed too).
    pub closed: bool,
    /// Its labels' names, in the order they were added.
    pub labels: Vec<String>,
    /// Its assignees' logins, in the order they were assigned.
    pub assignees: Vec<String>,
    /// Whether it is a pull request.
    pub is_pull: bool,
    /// The numbers of the issues that block it (its dependencies).
    pub blocked_by: Vec<i64>,
    /// When it was opened (Gitea keeps whole seconds).
    pub created_at: OffsetDateTime,
    /// When it last changed.
    pub updated_at: OffsetDateTime,
    /// When it was closed, while it is.
    pub closed_at: Option<OffsetDateTime>,
}

/// A plain comment on an issue or a pull request's conversation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Comment {
    /// Its id (comments and timeline events share one sequence, as in
    /// Gitea's `comment` table).
    pub id: i64,
    /// The number of the issue or pull request it is on.
    pub issue: i64,
    /// Who wrote it (login).
    pub user: String,
    /// What it says.
    pub body: String,
    /// When it was written.
    pub created_at: OffsetDateTime,
    /// When it last changed.
    pub updated_at: OffsetDateTime,
}

/// How a pull request was merged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Merge {
    /// Who merged it (login).
    pub by: String,
    /// The merge commit now at the tip of the base branch.
    pub commit: String,
    /// When.
    pub at: OffsetDateTime,
}

/// A pull request as it stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pull {
    /// Its number (shared with issues).
    pub number: i64,
    /// Its title.
    pub title: String,
    /// Its body.
    pub body: String,
    /// Who opened it (login).
    pub user: String,
    /// The branch it brings in.
    pub head: String,
    /// The branch it goes into.
    pub base: String,
    /// Whether it is closed (merged or not).
    pub closed: bool,
    /// Its merge, once merged.
    pub merged: Option<Merge>,
}

/// What a review says about a pull request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReviewState {
    /// `COMMENT`: remarks, no verdict.
    Comment,
    /// `APPROVED`.
    Approved,
    /// `REQUEST_CHANGES`.
    RequestChanges,
}

impl ReviewState {
    /// The name the API uses for it (`state` of a PullReview, `event` of a
    /// new one).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Comment => "COMMENT",
            Self::Approved => "APPROVED",
            Self::RequestChanges => "REQUEST_CHANGES",
        }
    }

    /// The webhook event type a submitted review of this kind is sent
    /// under (`modules/webhook/type.go`).
    pub(crate) fn hook_event_type(self) -> &'static str {
        match self {
            Self::Comment => "pull_request_review_comment",
            Self::Approved => "pull_request_review_approved",
            Self::RequestChanges => "pull_request_review_rejected",
        }
    }
}

/// A submitted review.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Review {
    /// Its id (reviews have their own sequence).
    pub id: i64,
    /// The pull request's number.
    pub pull: i64,
    /// Who reviewed (login).
    pub user: String,
    /// Its verdict.
    pub state: ReviewState,
    /// Its summary, often empty for inline-only reviews.
    pub body: String,
    /// The head commit it was made on.
    pub commit_id: String,
}

/// A comment on a line of a pull request's diff, made in a review.
/// Comments on the same path and line are one conversation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReviewComment {
    /// Its id (in the comment sequence).
    pub id: i64,
    /// The review it was made in.
    pub review: i64,
    /// The pull request's number.
    pub pull: i64,
    /// Who wrote it (login).
    pub user: String,
    /// The file it is on.
    pub path: String,
    /// The line: positive for a line of the new file, negative for a line
    /// of the old one (Gitea's signed line).
    pub line: i64,
    /// What it says.
    pub body: String,
    /// The head commit it was made on.
    pub commit_id: String,
}

/// A generated key pair for pushing over SSH, authorized for git only.
#[derive(Debug, Clone)]
pub struct PushKey {
    /// The private key (ed25519, no passphrase).
    pub private_key: PathBuf,
    /// Its public half as OpenSSH writes it: `ssh-ed25519 AAAA... comment`.
    pub public_key: String,
}

impl GiteaStandIn {
    /// Starts the HTTP server on a free loopback port, the webhook
    /// delivery worker and an OpenSSH server for git (which needs
    /// `sshd`, `ssh-keygen` and `git-shell`; a missing one fails naming
    /// its package).
    pub async fn start() -> anyhow::Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("nisse-gitea-")
            .tempdir()
            .context("making the Gitea stand-in's directory")?;
        for sub in ["repos", "keys"] {
            std::fs::create_dir_all(dir.path().join(sub))
                .with_context(|| format!("making {}", dir.path().join(sub).display()))?;
        }
        let sshd = TestSshd::start()
            .await
            .context("starting the OpenSSH server the Gitea stand-in serves git over")?;
        let known_hosts = dir.path().join("keys/known_hosts");
        sshd.write_known_hosts(&known_hosts, "127.0.0.1")?;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .context("binding the Gitea stand-in's HTTP port")?;
        let addr = listener.local_addr()?;
        let state = Arc::new(Mutex::new(State {
            hooks_enabled: true,
            ..State::default()
        }));
        let (queue, worker) = hooks::Queue::start(state.clone())?;
        let shared = Arc::new(Shared {
            base_url: format!("http://{addr}"),
            ssh_base: format!("ssh://{}@{}", sshd.user(), sshd.socket_addr()),
            state,
            hooks: queue,
            merging: tokio::sync::Mutex::new(()),
            dir,
            known_hosts,
        });
        let app = api::router(shared.clone());
        let server = tokio::spawn(async move {
            // It serves until the stand-in is dropped, which aborts it.
            let _ = axum::serve(listener, app).await;
        });
        Ok(Self {
            shared,
            sshd,
            server,
            worker,
        })
    }

    /// The base URL, `http://127.0.0.1:PORT` (the API is under
    /// `/api/v1`, as a client configured with Gitea's URL expects).
    pub fn url(&self) -> &str {
        &self.shared.base_url
    }

    /// `url()` followed by `/api/v1`.
    pub fn api_url(&self) -> String {
        format!("{}/api/v1", self.shared.base_url)
    }

    /// Adds a user and gives it an API token, which it returns (40 hex
    /// characters, as Gitea's). An operator, the agent and a stranger are
    /// all just users. A login already taken is refused.
    pub fn add_user(&self, login: &str) -> anyhow::Result<String> {
        let mut state = self.shared.lock();
        if state.user(login).is_some() {
            anyhow::bail!("the Gitea stand-in already has a user {login:?}");
        }
        let token = new_token();
        state.add_user(login, Some(token.clone()));
        Ok(token)
    }

    /// Creates a bare repository `owner/name` with one initial commit on
    /// `default_branch` holding `files` (path, contents), authored by the
    /// owner (made a user without a token if it is not one), and the
    /// `pre-receive` hook that protects the default branch.
    pub async fn create_repo(
        &self,
        owner: &str,
        name: &str,
        default_branch: &str,
        files: &[(&str, &str)],
    ) -> anyhow::Result<GiteaRepo> {
        let path = self
            .shared
            .dir
            .path()
            .join("repos")
            .join(owner)
            .join(format!("{name}.git"));
        if self.shared.lock().repo_by_name(owner, name).is_some() {
            anyhow::bail!("the Gitea stand-in already has a repository {owner}/{name}");
        }
        git::create_bare(&path, owner, default_branch, files).await?;
        let mut state = self.shared.lock();
        if state.user(owner).is_none() {
            state.add_user(owner, None);
        }
        let id = state.add_repo(owner, name, default_branch, path);
        Ok(GiteaRepo {
            shared: self.shared.clone(),
            id,
        })
    }

    /// The repository `owner/name`, if it was created.
    pub fn repo(&self, owner: &str, name: &str) -> Option<GiteaRepo> {
        let id = self.shared.lock().repo_by_name(owner, name)?.id;
        Some(GiteaRepo {
            shared: self.shared.clone(),
            id,
        })
    }

    /// Sends every event from now on to `url` (a Gitea webhook of type
    /// `gitea`, content type JSON, all events), signed with `secret` (an
    /// empty secret leaves the signatures empty, as Gitea does). Returns
    /// the hook's id.
    pub fn add_webhook(&self, url: &str, secret: &str) -> i64 {
        let mut state = self.shared.lock();
        state.next.hook += 1;
        let id = state.next.hook;
        state.hooks.push(hooks::Hook {
            url: url.to_string(),
            secret: secret.to_string(),
        });
        id
    }

    /// With `false`, events are still recorded in [`deliveries`] but not
    /// sent (their status stays `None`), as if Gitea had lost them: the
    /// client must then find the changes by polling. `true` sends again
    /// from the next event on; lost ones are not sent later (see
    /// [`redeliver`]).
    ///
    /// [`deliveries`]: GiteaStandIn::deliveries
    /// [`redeliver`]: GiteaStandIn::redeliver
    pub fn set_webhooks_enabled(&self, enabled: bool) {
        self.shared.lock().hooks_enabled = enabled;
    }

    /// Every delivery attempt so far, in order (a redelivery is another
    /// attempt under the same id).
    pub fn deliveries(&self) -> Vec<Delivery> {
        self.shared.lock().deliveries.clone()
    }

    /// Waits until every delivery queued so far was attempted, so a test
    /// that made a change through the API can look at its webhook.
    pub async fn flush_webhooks(&self) -> anyhow::Result<()> {
        self.shared.hooks.flush().await
    }

    /// Sends the delivery `id` again with exactly its headers and body (a
    /// replay, whatever [`set_webhooks_enabled`] says), records the
    /// attempt and returns the status it was answered with.
    ///
    /// [`set_webhooks_enabled`]: GiteaStandIn::set_webhooks_enabled
    pub async fn redeliver(&self, id: &str) -> anyhow::Result<u16> {
        let delivery = self
            .shared
            .lock()
            .deliveries
            .iter()
            .rev()
            .find(|d| d.id == id)
            .cloned()
            .with_context(|| format!("the Gitea stand-in made no delivery {id}"))?;
        let attempt = self.shared.hooks.resend(delivery).await?;
        attempt.status.with_context(|| {
            format!(
                "redelivering {id} failed: {}",
                attempt.error.unwrap_or_default()
            )
        })
    }

    /// POSTs `body` with exactly `headers` to `url`, nothing recorded:
    /// for tampered or forged deliveries. Returns the status.
    pub async fn send_raw(
        &self,
        url: &str,
        headers: &[(String, String)],
        body: &[u8],
    ) -> anyhow::Result<u16> {
        self.shared.hooks.send_raw(url, headers, body).await
    }

    /// Answers the next `times` requests of `method` (`GET`, `POST`…) on
    /// `path` (as [`ApiRequest::path`] writes it: `/api/v1/repos/…`) with
    /// `status` and `retry_after` instead of serving them, as a rate
    /// limiter (429) or an overloaded Gitea (503) would: nothing they ask
    /// for is done, and each is recorded in [`requests`] with that status.
    /// Refusals of the same request are used up in the order they were
    /// added; the body is Gitea's error document. A status that is not an
    /// error is refused.
    ///
    /// [`requests`]: GiteaStandIn::requests
    pub fn refuse_next(
        &self,
        method: &str,
        path: &str,
        times: usize,
        status: u16,
        retry_after: RetryAfter,
    ) -> anyhow::Result<()> {
        if !(400..=599).contains(&status) {
            anyhow::bail!("refuse_next takes an error status (4xx or 5xx), not {status}");
        }
        self.add_refusal(method, path, times, status, retry_after, false)
    }

    /// Serves the next `times` requests of `method` on `path` and then
    /// answers `status` instead of what they got, as a proxy in front of
    /// Gitea does when it gives up waiting (502, 504): what they asked
    /// for is done, and the client cannot tell. Recorded in [`requests`]
    /// with that status.
    ///
    /// [`requests`]: GiteaStandIn::requests
    pub fn lose_answers(
        &self,
        method: &str,
        path: &str,
        times: usize,
        status: u16,
    ) -> anyhow::Result<()> {
        self.add_refusal(method, path, times, status, RetryAfter::None, true)
    }

    /// Holds the next request of `method` on `path` without ever
    /// answering it, as a Gitea whose client is killed mid-call sees it:
    /// when `served`, what it asks for is done first (the client cannot
    /// know); else nothing is. The connection stays open until the client
    /// goes away. Not recorded in [`requests`].
    ///
    /// [`requests`]: GiteaStandIn::requests
    pub fn hang_next(&self, method: &str, path: &str, served: bool) -> Hang {
        let arrived = Arc::new(tokio::sync::Notify::new());
        self.shared.lock().hangs.push(HangRec {
            method: method.to_ascii_uppercase(),
            path: path.to_string(),
            served,
            arrived: arrived.clone(),
        });
        Hang(arrived)
    }

    fn add_refusal(
        &self,
        method: &str,
        path: &str,
        times: usize,
        status: u16,
        retry_after: RetryAfter,
        served: bool,
    ) -> anyhow::Result<()> {
        if !(400..=599).contains(&status) {
            anyhow::bail!("the stand-in answers an error status (4xx or 5xx) here, not {status}");
        }
        self.shared.lock().refusals.push(Refusal {
            method: method.to_ascii_uppercase(),
            path: path.to_string(),
            remaining: times,
            status,
            retry_after,
            served,
        });
        Ok(())
    }

    /// Every API request answered so far, in order.
    pub fn requests(&self) -> Vec<ApiRequest> {
        self.shared.lock().requests.clone()
    }

    /// Authorizes `public_key` (an OpenSSH public key line) on the git
    /// server as `login`'s key, for git only: its `authorized_keys` line
    /// runs `git-shell` with the client's command, with the owner in
    /// `NISSE_GITEA_USER` for the branch protection hook (as Gitea's
    /// forced command `gitea serv key-<id>` names the key), and allows no
    /// forwarding and no terminal.
    pub fn authorize_push_key(&self, login: &str, public_key: &str) -> anyhow::Result<()> {
        let key = public_key.trim();
        if key.is_empty() || key.contains('\n') {
            anyhow::bail!("a push key is one OpenSSH public key line, got {public_key:?}");
        }
        if login.is_empty()
            || !login
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        {
            anyhow::bail!("a push key's owner is a Gitea login, got {login:?}");
        }
        let shell = GIT_SHELLS
            .iter()
            .find(|p| Path::new(p).is_file())
            .with_context(|| {
                format!(
                    "the Gitea stand-in restricts push keys to git-shell ({}): install git",
                    GIT_SHELLS.join(" or ")
                )
            })?;
        self.sshd.authorize_key(&format!(
            "command=\"/usr/bin/env NISSE_GITEA_USER={login} {shell} -c \\\"$SSH_ORIGINAL_COMMAND\\\"\",no-port-forwarding,no-X11-forwarding,no-agent-forwarding,no-pty {key}"
        ))
    }

    /// Generates an ed25519 key pair of user `name` in the stand-in's
    /// directory and authorizes it with [`authorize_push_key`].
    ///
    /// [`authorize_push_key`]: GiteaStandIn::authorize_push_key
    pub async fn create_push_key(&self, name: &str) -> anyhow::Result<PushKey> {
        let private_key = self.shared.dir.path().join("keys").join(name);
        git::keygen(&private_key, name).await?;
        let public_key = std::fs::read_to_string(private_key.with_extension("pub"))
            .with_context(|| format!("reading the public half of {}", private_key.display()))?
            .trim()
            .to_string();
        self.authorize_push_key(name, &public_key)?;
        Ok(PushKey {
            private_key,
            public_key,
        })
    }

    /// The `known_hosts` line pinning the git server's host key under
    /// the host name in clone URLs: `[127.0.0.1]:PORT ssh-ed25519 AAAA...`.
    pub fn known_hosts_line(&self) -> String {
        self.sshd.known_hosts_line("127.0.0.1")
    }

    /// Appends [`known_hosts_line`] to the `known_hosts` file at `path`.
    ///
    /// [`known_hosts_line`]: GiteaStandIn::known_hosts_line
    pub fn write_known_hosts(&self, path: &Path) -> anyhow::Result<()> {
        self.sshd.write_known_hosts(path, "127.0.0.1")
    }

    /// A `GIT_SSH_COMMAND` for git with `private_key` against the git
    /// server: no `ssh_config`, non-interactive, only that key, the host
    /// key checked strictly against a `known_hosts` file the stand-in
    /// keeps.
    pub fn git_ssh_command(&self, private_key: &Path) -> String {
        format!(
            "ssh -F none -i {} -o IdentitiesOnly=yes -o BatchMode=yes -o UserKnownHostsFile={} -o StrictHostKeyChecking=yes",
            private_key.display(),
            self.shared.known_hosts.display()
        )
    }

    /// The OpenSSH server git is served over (for its log and its
    /// connection count).
    pub fn sshd(&self) -> &TestSshd {
        &self.sshd
    }
}

impl Drop for GiteaStandIn {
    fn drop(&mut self) {
        self.server.abort();
        self.worker.abort();
    }
}

/// A repository on the stand-in: where it is, and the controls and
/// inspections for its issues and pull requests. Cheap to clone.
#[derive(Clone)]
pub struct GiteaRepo {
    pub(crate) shared: Arc<Shared>,
    pub(crate) id: i64,
}

impl GiteaRepo {
    fn with<T>(&self, f: impl FnOnce(&RepoRec) -> T) -> T {
        let state = self.shared.lock();
        let repo = state
            .repos
            .iter()
            .find(|r| r.id == self.id)
            .unwrap_or_else(|| unreachable!("repositories are never removed"));
        f(repo)
    }

    /// Its owner's login.
    pub fn owner(&self) -> String {
        self.with(|r| r.owner.clone())
    }

    /// Its name.
    pub fn name(&self) -> String {
        self.with(|r| r.name.clone())
    }

    /// `owner/name`.
    pub fn full_name(&self) -> String {
        self.with(|r| format!("{}/{}", r.owner, r.name))
    }

    /// Its default (protected) branch.
    pub fn default_branch(&self) -> String {
        self.with(|r| r.default_branch.clone())
    }

    /// The default branch's protection rule.
    pub fn protection(&self) -> Protection {
        self.with(|r| r.protection.clone())
    }

    /// Sets the default branch's protection rule, as the operator does in
    /// the repository's settings: the next push and the next Branch API
    /// answer follow it.
    pub fn set_protection(&self, rule: Protection) -> anyhow::Result<()> {
        if let Some(pattern) = rule
            .status_check_contexts
            .iter()
            .find(|c| c.contains(['*', '?', '[', ']', '{', '}']))
        {
            anyhow::bail!(
                "the Gitea stand-in matches status check contexts exactly and does not implement Gitea's glob patterns: {pattern:?}"
            );
        }
        git::write_protection(&self.path(), &rule)?;
        let mut state = self.shared.lock();
        let repo = state
            .repos
            .iter_mut()
            .find(|r| r.id == self.id)
            .context("the repository is gone")?;
        repo.protection = rule;
        Ok(())
    }

    /// The bare repository on disk, for inspecting refs and commits with
    /// `git --git-dir`.
    pub fn path(&self) -> PathBuf {
        self.with(|r| r.path.clone())
    }

    /// Its SSH clone URL: `ssh://USER@127.0.0.1:PORT/<absolute path>.git`
    /// (also its `ssh_url` in the API).
    pub fn clone_url(&self) -> String {
        self.with(|r| json::ssh_url(&self.shared, r))
    }

    /// The commit at the tip of `branch`, if the branch exists.
    pub async fn branch_sha(&self, branch: &str) -> anyhow::Result<Option<String>> {
        git::branch_sha(&self.path(), branch).await
    }

    /// The issue or pull request `number`, if it exists.
    pub fn issue(&self, number: i64) -> Option<Issue> {
        let state = self.shared.lock();
        state.issue(self.id, number).map(IssueRec::snapshot)
    }

    /// Every issue and pull request, by number.
    pub fn issues(&self) -> Vec<Issue> {
        let state = self.shared.lock();
        state
            .issues
            .iter()
            .filter(|i| i.repo == self.id)
            .map(IssueRec::snapshot)
            .collect()
    }

    /// The plain comments on issue or pull request `number`, oldest first.
    pub fn comments(&self, number: i64) -> Vec<Comment> {
        let state = self.shared.lock();
        state
            .events
            .iter()
            .filter(|e| e.repo == self.id && e.number == number)
            .filter_map(|e| match &e.kind {
                EventKind::Comment { body } => Some(Comment {
                    id: e.id,
                    issue: e.number,
                    user: e.user.clone(),
                    body: body.clone(),
                    created_at: e.created,
                    updated_at: e.updated,
                }),
                _ => None,
            })
            .collect()
    }

    /// Every pull request, by number.
    pub fn pulls(&self) -> Vec<Pull> {
        let state = self.shared.lock();
        state
            .issues
            .iter()
            .filter(|i| i.repo == self.id)
            .filter_map(|i| {
                let pull = i.pull.as_ref()?;
                Some(Pull {
                    number: i.number,
                    title: i.title.clone(),
                    body: i.body.clone(),
                    user: i.user.clone(),
                    head: pull.head.clone(),
                    base: pull.base.clone(),
                    closed: i.closed_at.is_some(),
                    merged: pull.merged.clone(),
                })
            })
            .collect()
    }

    /// The reviews submitted on pull request `pull`, oldest first.
    pub fn reviews(&self, pull: i64) -> Vec<Review> {
        let state = self.shared.lock();
        state
            .reviews
            .iter()
            .filter(|r| r.repo == self.id && r.number == pull)
            .map(|r| Review {
                id: r.id,
                pull: r.number,
                user: r.user.clone(),
                state: r.state,
                body: r.body.clone(),
                commit_id: r.commit_id.clone(),
            })
            .collect()
    }

    /// The inline comments on pull request `pull`'s diff, oldest first.
    pub fn review_comments(&self, pull: i64) -> Vec<ReviewComment> {
        let state = self.shared.lock();
        state
            .events
            .iter()
            .filter(|e| e.repo == self.id && e.number == pull)
            .filter_map(|e| match &e.kind {
                EventKind::Code {
                    review,
                    path,
                    line,
                    body,
                    commit_id,
                    ..
                } => Some(ReviewComment {
                    id: e.id,
                    review: *review,
                    pull: e.number,
                    user: e.user.clone(),
                    path: path.clone(),
                    line: *line,
                    body: body.clone(),
                    commit_id: commit_id.clone(),
                }),
                _ => None,
            })
            .collect()
    }
}

// ---------------------------------------------------------------------------
// State
// ---------------------------------------------------------------------------

/// Everything the stand-in knows, in memory.
#[derive(Default)]
pub(crate) struct State {
    pub(crate) users: Vec<UserRec>,
    pub(crate) repos: Vec<RepoRec>,
    pub(crate) issues: Vec<IssueRec>,
    /// Comments and timeline events (Gitea's `comment` table).
    pub(crate) events: Vec<EventRec>,
    pub(crate) reviews: Vec<ReviewRec>,
    /// Commit statuses, oldest first.
    pub(crate) statuses: Vec<StatusRec>,
    pub(crate) hooks: Vec<hooks::Hook>,
    pub(crate) hooks_enabled: bool,
    pub(crate) deliveries: Vec<Delivery>,
    pub(crate) requests: Vec<ApiRequest>,
    /// Requests to refuse unserved, oldest first.
    pub(crate) refusals: Vec<Refusal>,
    /// Requests never to answer, oldest first.
    pub(crate) hangs: Vec<HangRec>,
    pub(crate) next: Ids,
}

/// The last id handed out of each sequence.
#[derive(Default)]
pub(crate) struct Ids {
    user: i64,
    repo: i64,
    issue: i64,
    pull: i64,
    pub(crate) event: i64,
    pub(crate) review: i64,
    label: i64,
    hook: i64,
}

pub(crate) struct UserRec {
    pub(crate) id: i64,
    pub(crate) login: String,
    pub(crate) token: Option<String>,
    pub(crate) created: OffsetDateTime,
}

pub(crate) struct RepoRec {
    pub(crate) id: i64,
    pub(crate) owner: String,
    pub(crate) name: String,
    pub(crate) default_branch: String,
    pub(crate) path: PathBuf,
    pub(crate) created: OffsetDateTime,
    pub(crate) labels: Vec<LabelRec>,
    pub(crate) protection: Protection,
}

pub(crate) struct LabelRec {
    pub(crate) id: i64,
    pub(crate) name: String,
    pub(crate) color: String,
}

pub(crate) struct IssueRec {
    pub(crate) id: i64,
    pub(crate) repo: i64,
    pub(crate) number: i64,
    pub(crate) user: String,
    pub(crate) title: String,
    pub(crate) body: String,
    /// Label names.
    pub(crate) labels: Vec<String>,
    pub(crate) assignees: Vec<String>,
    pub(crate) created: OffsetDateTime,
    pub(crate) updated: OffsetDateTime,
    pub(crate) closed_at: Option<OffsetDateTime>,
    /// Numbers of the issues blocking this one.
    pub(crate) blocked_by: Vec<i64>,
    pub(crate) pull: Option<PullRec>,
}

impl IssueRec {
    fn snapshot(&self) -> Issue {
        Issue {
            number: self.number,
            title: self.title.clone(),
            body: self.body.clone(),
            user: self.user.clone(),
            closed: self.closed_at.is_some(),
            labels: self.labels.clone(),
            assignees: self.assignees.clone(),
            is_pull: self.pull.is_some(),
            blocked_by: self.blocked_by.clone(),
            created_at: self.created,
            updated_at: self.updated,
            closed_at: self.closed_at,
        }
    }
}

pub(crate) struct PullRec {
    pub(crate) id: i64,
    pub(crate) head: String,
    pub(crate) base: String,
    pub(crate) merged: Option<Merge>,
    /// What git said when it was closed: a closed pull request no longer
    /// follows its branches.
    pub(crate) frozen: Option<git::PullGit>,
}

pub(crate) struct EventRec {
    pub(crate) id: i64,
    pub(crate) repo: i64,
    pub(crate) number: i64,
    pub(crate) user: String,
    pub(crate) kind: EventKind,
    pub(crate) created: OffsetDateTime,
    pub(crate) updated: OffsetDateTime,
}

/// What a timeline entry is (Gitea's comment types, named as its API
/// names them in `type`).
pub(crate) enum EventKind {
    /// `comment`.
    Comment { body: String },
    /// `assignees`.
    Assignees { assignee: String, removed: bool },
    /// `label`.
    Label { label: String, added: bool },
    /// `close`.
    Close,
    /// `reopen`.
    Reopen,
    /// `add_dependency`: `number` now blocks this issue.
    AddDependency { number: i64 },
    /// `review`: a submitted review's entry.
    Review { review: i64, body: String },
    /// `code`: an inline comment made in a review.
    Code {
        review: i64,
        path: String,
        line: i64,
        body: String,
        commit_id: String,
        diff_hunk: String,
    },
    /// `merge_pull`.
    MergePull { commit: String },
}

impl EventKind {
    pub(crate) fn type_name(&self) -> &'static str {
        match self {
            Self::Comment { .. } => "comment",
            Self::Assignees { .. } => "assignees",
            Self::Label { .. } => "label",
            Self::Close => "close",
            Self::Reopen => "reopen",
            Self::AddDependency { .. } => "add_dependency",
            Self::Review { .. } => "review",
            Self::Code { .. } => "code",
            Self::MergePull { .. } => "merge_pull",
        }
    }
}

pub(crate) struct ReviewRec {
    pub(crate) id: i64,
    pub(crate) repo: i64,
    pub(crate) number: i64,
    pub(crate) user: String,
    pub(crate) state: ReviewState,
    pub(crate) body: String,
    pub(crate) commit_id: String,
    pub(crate) created: OffsetDateTime,
    /// Its `review` entry on the timeline.
    pub(crate) event: i64,
}

/// One commit status a CI reported (Gitea's `commit_status` row).
pub(crate) struct StatusRec {
    pub(crate) repo: i64,
    /// The full commit id.
    pub(crate) sha: String,
    /// Its number among the statuses of this commit (Gitea's `index`,
    /// which the API calls `id`), from 1.
    pub(crate) index: i64,
    /// `pending`, `success`, `error`, `failure`, `warning` or `skipped`.
    pub(crate) state: String,
    pub(crate) context: String,
    pub(crate) description: String,
    pub(crate) target_url: String,
    /// Who reported it (login).
    pub(crate) creator: String,
    pub(crate) created: OffsetDateTime,
}

/// Now, in whole seconds as Gitea stores time (so `since` filters are
/// exactly as coarse as Gitea's).
pub(crate) fn now() -> OffsetDateTime {
    let now = OffsetDateTime::now_utc();
    now.replace_nanosecond(0).unwrap_or(now)
}

/// A Gitea-like API token: 40 hex characters.
fn new_token() -> String {
    let a = uuid::Uuid::new_v4().simple().to_string();
    let b = uuid::Uuid::new_v4().simple().to_string();
    format!("{a}{}", &b[..8])
}

impl State {
    /// The refusal `method` on `path` meets, if one is left (its status,
    /// `Retry-After` and whether the request is served first); it is
    /// counted down.
    pub(crate) fn refusal(&mut self, method: &str, path: &str) -> Option<(u16, RetryAfter, bool)> {
        let r = self
            .refusals
            .iter_mut()
            .find(|r| r.remaining > 0 && r.method == method && r.path == path)?;
        r.remaining -= 1;
        Some((r.status, r.retry_after, r.served))
    }

    /// The hang that takes this request, if one was asked for (each
    /// takes one request).
    pub(crate) fn hang(&mut self, method: &str, path: &str) -> Option<HangRec> {
        let i = self
            .hangs
            .iter()
            .position(|h| h.method == method && h.path == path)?;
        Some(self.hangs.remove(i))
    }

    pub(crate) fn user(&self, login: &str) -> Option<&UserRec> {
        self.users.iter().find(|u| u.login == login)
    }

    fn add_user(&mut self, login: &str, token: Option<String>) {
        self.next.user += 1;
        self.users.push(UserRec {
            id: self.next.user,
            login: login.to_string(),
            token,
            created: now(),
        });
    }

    pub(crate) fn repo(&self, id: i64) -> Option<&RepoRec> {
        self.repos.iter().find(|r| r.id == id)
    }

    pub(crate) fn repo_by_name(&self, owner: &str, name: &str) -> Option<&RepoRec> {
        // Gitea matches owner and repository names without regard to case.
        self.repos
            .iter()
            .find(|r| r.owner.eq_ignore_ascii_case(owner) && r.name.eq_ignore_ascii_case(name))
    }

    fn add_repo(&mut self, owner: &str, name: &str, default_branch: &str, path: PathBuf) -> i64 {
        self.next.repo += 1;
        let id = self.next.repo;
        self.repos.push(RepoRec {
            id,
            owner: owner.to_string(),
            name: name.to_string(),
            default_branch: default_branch.to_string(),
            path,
            created: now(),
            labels: Vec::new(),
            protection: Protection::default(),
        });
        id
    }

    pub(crate) fn issue(&self, repo: i64, number: i64) -> Option<&IssueRec> {
        self.issues
            .iter()
            .find(|i| i.repo == repo && i.number == number)
    }

    pub(crate) fn issue_mut(&mut self, repo: i64, number: i64) -> Option<&mut IssueRec> {
        self.issues
            .iter_mut()
            .find(|i| i.repo == repo && i.number == number)
    }

    /// Opens an issue (or, with `pull`, a pull request) and returns its
    /// number.
    pub(crate) fn add_issue(
        &mut self,
        repo: i64,
        user: &str,
        title: &str,
        body: &str,
        pull: Option<(String, String)>,
    ) -> i64 {
        let number = self.issues.iter().filter(|i| i.repo == repo).count() as i64 + 1;
        self.next.issue += 1;
        let id = self.next.issue;
        let pull = pull.map(|(head, base)| {
            self.next.pull += 1;
            PullRec {
                id: self.next.pull,
                head,
                base,
                merged: None,
                frozen: None,
            }
        });
        let at = now();
        self.issues.push(IssueRec {
            id,
            repo,
            number,
            user: user.to_string(),
            title: title.to_string(),
            body: body.to_string(),
            labels: Vec::new(),
            assignees: Vec::new(),
            created: at,
            updated: at,
            closed_at: None,
            blocked_by: Vec::new(),
            pull,
        });
        number
    }

    /// Records a timeline entry on `number` and marks the issue updated;
    /// returns the entry's id.
    pub(crate) fn add_event(&mut self, repo: i64, number: i64, user: &str, kind: EventKind) -> i64 {
        self.next.event += 1;
        let id = self.next.event;
        let at = now();
        self.events.push(EventRec {
            id,
            repo,
            number,
            user: user.to_string(),
            kind,
            created: at,
            updated: at,
        });
        if let Some(issue) = self.issue_mut(repo, number) {
            issue.updated = at;
        }
        id
    }

    /// The label `name` of `repo`, created (with a colour of Gitea's
    /// palette) if it does not exist yet.
    pub(crate) fn ensure_label(&mut self, repo: i64, name: &str) {
        const COLORS: [&str; 6] = ["ee0701", "e99695", "fbca04", "0e8a16", "0052cc", "5319e7"];
        let Some(index) = self.repos.iter().position(|r| r.id == repo) else {
            return;
        };
        if self.repos[index].labels.iter().any(|l| l.name == name) {
            return;
        }
        self.next.label += 1;
        let id = self.next.label;
        let labels = &mut self.repos[index].labels;
        let color = COLORS[labels.len() % COLORS.len()].to_string();
        labels.push(LabelRec {
            id,
            name: name.to_string(),
            color,
        });
    }

    /// How many plain comments `number` has (an Issue's `comments`).
    pub(crate) fn comment_count(&self, repo: i64, number: i64) -> usize {
        self.events
            .iter()
            .filter(|e| e.repo == repo && e.number == number)
            .filter(|e| matches!(e.kind, EventKind::Comment { .. }))
            .count()
    }

    /// Whether `review` is official: a verdict (approval or request for
    /// changes) that is its reviewer's latest on the pull request. Gitea
    /// unsets `official` on a reviewer's earlier verdicts when they give a
    /// new one, so only the latest counts towards a merge.
    pub(crate) fn official(&self, review: &ReviewRec) -> bool {
        let verdict = |r: &ReviewRec| r.state != ReviewState::Comment;
        verdict(review)
            && !self.reviews.iter().any(|r| {
                r.repo == review.repo
                    && r.number == review.number
                    && r.user == review.user
                    && r.id > review.id
                    && verdict(r)
            })
    }

    /// How many approvals of pull request `number` count towards its
    /// merge at `head`: official, by someone other than its `author`, given
    /// on `head` (a stale one does not count).
    pub(crate) fn granted_approvals(
        &self,
        repo: i64,
        number: i64,
        author: &str,
        head: &str,
    ) -> u32 {
        let count = self
            .reviews
            .iter()
            .filter(|r| r.repo == repo && r.number == number)
            .filter(|r| r.state == ReviewState::Approved && self.official(r))
            .filter(|r| r.user != author && r.commit_id == head)
            .count();
        u32::try_from(count).unwrap_or(u32::MAX)
    }

    /// The latest status of each context reported on commit `sha`, in the
    /// order they were reported.
    pub(crate) fn latest_statuses(&self, repo: i64, sha: &str) -> Vec<&StatusRec> {
        let of_commit: Vec<&StatusRec> = self
            .statuses
            .iter()
            .filter(|s| s.repo == repo && s.sha == sha)
            .collect();
        of_commit
            .iter()
            .filter(|s| {
                !of_commit
                    .iter()
                    .any(|later| later.context == s.context && later.index > s.index)
            })
            .copied()
            .collect()
    }
}

/// Commit status states as Gitea combines them (`CommitStatusStates.Combine`,
/// after GitHub's combined status): `failure` if any is `error` or
/// `failure`; `success` if there are some and every one is `success`,
/// `warning` or `skipped`; else `pending`.
pub(crate) fn combined_state<'a>(states: impl IntoIterator<Item = &'a str>) -> &'static str {
    let (mut all, mut passed) = (0, 0);
    for state in states {
        all += 1;
        match state {
            "error" | "failure" => return "failure",
            "success" | "warning" | "skipped" => passed += 1,
            _ => {}
        }
    }
    if all > 0 && passed == all {
        "success"
    } else {
        "pending"
    }
}

/// The states a commit status may have (Gitea's `CommitStatusState`).
pub(crate) const STATUS_STATES: [&str; 6] = [
    "pending", "success", "error", "failure", "warning", "skipped",
];
