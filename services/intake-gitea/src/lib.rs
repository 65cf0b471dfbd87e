//! intake-gitea: one Gitea instance for one agent (normally `dev`).
//!
//! Three parts, one process, one NATS identity (`intake-gitea-<agent>`):
//!
//! **The webhook receiver** (`POST /api/v1/gitea/hook`, with `GET
//! /healthz` and `GET /readyz`, which is 503 unless NATS is connected).
//! Give the Gitea webhook (repository or organisation → Settings →
//! Webhooks → Gitea) this URL, content type `application/json`, the
//! secret in `webhook-secret-file`, and the events issues, issue
//! comments, pull requests, pull request comments and reviews. Each
//! delivery is checked in this order, and nothing is stored unless all of
//! it holds:
//!
//! 1. `X-Gitea-Signature`, the hex HMAC-SHA256 of the raw body with the
//!    secret (read from its file at every request), compared in constant
//!    time before the body is parsed: missing or wrong is 401;
//! 2. `X-Gitea-Delivery` (missing: 400) and the event, by
//!    `X-Gitea-Event-Type` (else `X-Gitea-Event`): one this service does
//!    not take (a push, a release) is answered 200 `{"ignored": true}`;
//! 3. the delivery id: one taken already is refused 409, so a replayed
//!    delivery stores nothing;
//! 4. the payload, read into only what is needed; a bad one is 400
//!    naming the JSON path (`issue.number: invalid type...`);
//! 5. the repository: one not in `repositories` is refused 403 (the
//!    delivery is understood and authentic, and this agent may not take
//!    it);
//! 6. what the payload lacks, read from the API: whom an assignment
//!    assigned and which timeline entry a pull request's close, merge or
//!    reopen is (the timeline), which review a review's delivery
//!    announces and its inline comments (each its own event); Gitea
//!    unreachable is 502;
//! 7. the events published, each waiting for JetStream's ack (503 when
//!    any is not acknowledged), and only then the delivery's record in
//!    the `nisse_gitea` bucket, so a delivery that failed to store is
//!    taken when Gitea sends it again.
//!
//! Errors are RFC 9457 problem documents, shown in the webhook's "Recent
//! deliveries" in Gitea.
//!
//! **The poll**, every `poll-interval` (`0s`: off): per repository, from a
//! cursor in the bucket, issues updated since (and, for the agent's
//! account, who assigned them), comments made or edited since, and the
//! pull requests updated since with their closes, merges, reopens,
//! reviews and inline comments: what a lost webhook carried. The cursor
//! moves only once every event up to it is stored. The very first poll of
//! a repository takes every open issue, so what was assigned while
//! nothing listened is found too; comments and pull requests are taken
//! from that moment on.
//!
//! **Message ids** say what a thing is, not how it arrived, so a webhook
//! and the poll of the same change collide (JetStream stores it once
//! within its duplicate window, and the brain goes by the id after it):
//!
//! | what | id |
//! | --- | --- |
//! | a comment (issue, or a pull request's conversation), or a review's inline comment | `gitea:comment:<comment id>` |
//! | an edit of a comment | `gitea:comment:<comment id>:<updated_at>` (RFC 3339, UTC; one per distinct edit) |
//! | an assignment | `gitea:timeline:<entry id>` |
//! | a pull request closed, merged or reopened | `gitea:timeline:<entry id>` (its `close`, `merge_pull` or `reopen` entry) |
//! | a submitted review (approved, changes requested, comment) | `gitea:review:<review id>` |
//! | an issue as the poll saw it | `poll:<repo>:issue:<number>:<updated_at>` |
//! | any other delivery (opened, edited, labelled...) | `gitea:<X-Gitea-Delivery>` |
//!
//! Gitea's payloads name neither the timeline entry nor the review, so
//! the receiver reads them: the sender's newest entry of that kind (or
//! review in that state, with that text) made by the payload's
//! `updated_at`. An edit made within the second its comment was made
//! cannot be told from the comment by the poll (Gitea keeps whole
//! seconds); nor can the poll say who edited a comment, so its edits
//! name no sender.
//!
//! **The agent's API calls**: `GiteaRequest`s on `out.gitea.req`
//! (consumer `intake-gitea`, one at a time in stream order), each answered
//! by one `GiteaResult` on `in.gitea.result` with the id
//! `gitea-result:<request id>`: comment, publish (adopting the open pull
//! request of the branch, never opening a second), read an issue with its
//! dependencies, read a pull request, reply on a review comment, close an
//! issue with a note, open an issue (a new project's tracking issue),
//! check a branch's protection, merge a pull request (see the `calls`
//! module for each). Calls with side effects happen at most once per
//! request id, by their record in the bucket and a hidden marker
//! ([`marker`]) in what they write. A call Gitea turns away (429, 503) is
//! tried again after the wait its `Retry-After` asks for, and a failing
//! one with backoff, a few times and never past `call-timeout`; one that
//! still fails is answered FAILED naming the status and the wait asked
//! for.
//!
//! **The token** (`token-file`) is read at every call, sent as
//! `Authorization: token <t>`, never put on the bus and never logged;
//! rotating the file takes effect at the next call.
//!
//! What Gitea says (titles, bodies, comments) is carried as data: the
//! envelope's actor is `EXTERNAL` (`gitea:<login>`), and the brain decides
//! whose words are instructions.

mod api;
mod calls;
mod config;
mod events;
mod hook;
mod poll;
mod problem;
mod protection;
pub mod records;
mod server;
mod shapes;
mod signature;

use std::sync::Arc;

use nisse_bus::secret::Secret;
use nisse_bus::service::{Context, Service};
use nisse_bus::{AgentName, ConsumerSpec, Intake};

pub use calls::marker;
pub use config::Config;
pub use protection::check_with as check_protection;
pub use server::WEBHOOK_PATH;
pub use signature::sign;

/// The service; its name is its durable consumer's.
pub const SERVICE: Service = Service {
    name: ConsumerSpec::INTAKE_GITEA.name,
    about: "Gitea's webhooks and a polling fallback onto the agent's stream, and the agent's Gitea API calls",
};

/// The name its webhook address is reported under (`endpoints.json`).
pub const LISTENER: &str = "gitea-webhook";

/// Checks the configuration, opens the webhook receiver, reports its
/// address, and serves the receiver, the poll and the agent's API calls
/// until shutdown.
pub async fn run(ctx: Context<Config>) -> anyhow::Result<()> {
    let config = ctx.config.clone();
    let problems = config.validate("gitea");
    if !problems.is_empty() {
        let list: Vec<String> = problems.iter().map(|(k, p)| format!("{k}: {p}")).collect();
        anyhow::bail!("invalid gitea configuration: {}", list.join("; "));
    }
    let (Some(url), Some(token_file), Some(secret_file)) = (
        config.url.as_deref(),
        config.token_file.clone(),
        config.webhook_secret_file.clone(),
    ) else {
        anyhow::bail!(
            "gitea.url is not set: there is no Gitea to serve (nisse leaves the service idle then)"
        );
    };
    let agent: AgentName = config
        .agent
        .parse()
        .map_err(|e| anyhow::anyhow!("gitea.agent: {e}"))?;
    if !ctx.bus.agents().contains(&agent) {
        let served: Vec<&str> = ctx.bus.agents().iter().map(AgentName::as_str).collect();
        anyhow::bail!(
            "gitea.agent `{agent}` is not an agent this process serves (it serves: {}); add it to `agents`",
            served.join(", ")
        );
    }
    let gitea = api::Gitea::new(url, token_file, config.call_timeout)
        .map_err(|e| anyhow::anyhow!("gitea: {e}"))?;
    // A limit past what this machine can hold is refused at the start,
    // not met by a body.
    usize::try_from(config.max_body.as_u64())
        .map_err(|_| anyhow::anyhow!("gitea.max-body: too large"))?;
    let shared = Arc::new(server::Shared {
        bus: ctx.bus.clone(),
        agent: agent.clone(),
        config: config.clone(),
        secret: Secret::File(secret_file),
        gitea: gitea.clone(),
    });
    let receiver = server::Receiver::bind(shared).await?;
    ctx.ready.listening(LISTENER, receiver.webhook_url());

    // The receiver and the poll stop with the service, and also when the
    // consumer loop ends on its own (an error): never the process's
    // other services with it.
    let stop = ctx.shutdown.child_token();
    let mut tasks = tokio::task::JoinSet::new();
    let shutdown = stop.clone();
    tasks.spawn(async move { receiver.serve(shutdown).await });
    if !config.poll_interval.is_zero() {
        let poller = poll::Poller {
            bus: ctx.bus.clone(),
            agent: agent.clone(),
            config: config.clone(),
            gitea: gitea.clone(),
        };
        let shutdown = stop.clone();
        tasks.spawn(async move {
            poller.run(shutdown).await;
            Ok(())
        });
    } else {
        tracing::info!(%agent, "gitea.poll-interval is 0s: no polling, webhooks only");
    }
    let handlers = vec![(
        agent.clone(),
        Arc::new(calls::Calls {
            bus: ctx.bus.clone(),
            agent,
            config,
            gitea,
        }),
    )];
    let intake = Intake {
        consumer: ConsumerSpec::INTAKE_GITEA,
        // One after another, in stream order: a comment asked for before
        // a close is made before it.
        in_flight: 1,
    };
    // Reports ready once the consumer is bound (the receiver is already
    // listening).
    let served = nisse_bus::serve(&ctx, intake, handlers).await;
    stop.cancel();
    while let Some(joined) = tasks.join_next().await {
        joined??;
    }
    served?;
    Ok(())
}
