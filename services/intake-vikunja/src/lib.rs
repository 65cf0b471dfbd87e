//! intake-vikunja: one Vikunja instance for one agent (normally `ops`):
//! a ticket is a work item's durable record, its comments an approval
//! source (seed Nisse O5). What a ticket means is the brain's; this
//! service brings what happens in Vikunja onto the agent's stream and
//! makes the agent's calls.
//!
//! Four parts, one process, one NATS identity (`intake-vikunja-<agent>`):
//!
//! **The webhook receiver** (`POST /api/v1/vikunja/hook`, with `GET
//! /healthz` and `GET /readyz`, which is 503 unless NATS is connected).
//! Give each served project a webhook (project → Webhooks) with this URL,
//! the secret in `webhook-secret-file`, and the events [`EVENTS`]
//! (`task.created`, `task.updated`, `task.assignee.created`,
//! `task.comment.created`, `task.comment.edited`). A Vikunja from v2.2 on
//! refuses a loopback or private target unless its
//! `webhooks.allownonroutableips` is set. Each delivery is checked in
//! this order, and nothing is stored unless all of it holds:
//!
//! 1. `X-Vikunja-Signature`, the hex HMAC-SHA256 of the raw body with the
//!    secret (read from its file at every request), compared in constant
//!    time before the body is parsed: missing or wrong is 401;
//! 2. the event (`event_name`): one this service does not take is
//!    answered 200 `{"ignored": true}`;
//! 3. the payload, read into only what is needed; a bad one is 400
//!    naming the JSON path (`data.task.id: invalid type...`);
//! 4. the project (the task's `project_id`): one not in `projects` is
//!    refused 403;
//! 5. the doer: the agent's own `account` is answered 200 `{"skipped"}`
//!    (its own comment or status change, coming back);
//! 6. the event's id (what it is, below): one stored before, by a
//!    delivery or by the poll, is answered 200 `{"duplicate": true}`
//!    and stored nothing again (Vikunja retries any status over 399, so a
//!    retry of a delivery whose answer was lost must be a success);
//! 7. the event published, waiting for JetStream's ack (503 when it is
//!    not acknowledged, which Vikunja tries again), and only then its
//!    record in the `nisse_vikunja` bucket.
//!
//! Errors are RFC 9457 problem documents.
//!
//! **The poll**, every `poll-interval` (`0s`: off): per project, from a
//! cursor in the bucket, the tasks updated since (Vikunja's `updated`
//! filter), and the comments of each: what a lost webhook carried. The
//! cursor moves only once every event up to it is stored. The very first
//! poll of a project takes every task not done, so what was made while
//! nothing listened is found too (see the `poll` module).
//!
//! **Message ids** say what a thing is, not how it arrived, so a webhook
//! and the poll of the same change collide (and Vikunja sends no delivery
//! id; its envelope's `time` is when the payload was built, so it is never
//! part of one):
//!
//! | event | id |
//! | --- | --- |
//! | `task.created` | `vikunja:task:<task id>:created` |
//! | `task.updated` | `vikunja:task:<task id>:updated:<task.updated>` |
//! | `task.assignee.created` | `vikunja:task:<task id>:assignee:<user id>` |
//! | `task.comment.created` | `vikunja:comment:<comment id>` |
//! | `task.comment.edited` | `vikunja:comment:<comment id>:<comment.updated>` |
//!
//! Times are RFC 3339 in UTC. The poll cannot say who changed a task or
//! who assigned someone, so those name no doer (a comment, and its edit,
//! are its author's: only the author may edit it).
//!
//! **The agent's API calls**: `VikunjaRequest`s on `out.vikunja.req`
//! (consumer `intake-vikunja`, one at a time in stream order), each
//! answered by one `VikunjaResult` on `in.vikunja.result` with the id
//! `vikunja-result:<request id>`: comment, set done (or not done), read a
//! task, create a task (see the `calls` module). Calls with side effects
//! happen at most once per request id, by their record in the bucket and
//! a hidden marker ([`marker`]) in what they write. Markdown is rendered
//! to the HTML Vikunja keeps.
//!
//! **What the agent tells the operator about a ticketed item**: the
//! `Tell`s on `out.tell` (consumer `vikunja-tell`, one at a time in
//! stream order) whose `records` name a task (`vikunja`, the task's id)
//! and whose `only` is empty or names `vikunja`, posted on that task: a
//! `RESULT` marks it done with the outcome as the note, anything else is
//! a comment. Each is a `set_done` or `comment` call under the request id
//! `tell:<the Tell's message id>`, made by the same code as the calls
//! above (once per request id, served projects only) and answered on
//! `in.vikunja.result` for the Tell's item (see the `tells` module).
//! Every other Tell is the other channels' and is passed over.
//!
//! **The token** (`token-file`) is read at every call, sent as
//! `Authorization: Bearer <t>`, never put on the bus and never logged;
//! rotating the file takes effect at the next call. It needs the
//! permissions `tasks` (`read_one`, `read_all`, `update`, `create`) and
//! `tasks_comments` (`read_all`, `create`).
//!
//! What Vikunja says (titles, descriptions, comments) is carried as data:
//! the envelope's actor is `EXTERNAL` (`vikunja:<username>`), and the
//! brain decides whose words are instructions.

mod api;
mod calls;
mod config;
mod events;
mod hook;
mod markdown;
mod poll;
mod problem;
pub mod records;
mod server;
mod shapes;
mod signature;
mod tells;

use std::sync::Arc;

use anyhow::Context as _;
use nisse_bus::secret::Secret;
use nisse_bus::service::{Context, Readiness, Service};
use nisse_bus::{AgentName, ConsumerSpec, Intake};

pub use config::Config;
pub use events::EVENTS;
pub use markdown::marker;
pub use server::WEBHOOK_PATH;
pub use signature::sign;

/// The service; its name is its API calls' durable consumer's (its Tells'
/// is `vikunja-tell`).
pub const SERVICE: Service = Service {
    name: ConsumerSpec::INTAKE_VIKUNJA.name,
    about: "Vikunja's webhooks and a polling fallback onto the agent's stream, the agent's Vikunja API calls, and what it tells the operator posted on tickets",
};

/// The name its webhook address is reported under (`endpoints.json`).
pub const LISTENER: &str = "vikunja-webhook";

/// Checks the configuration, opens the webhook receiver, reports its
/// address, and serves the receiver, the poll, the agent's API calls and
/// what it tells the operator about ticketed items until shutdown.
pub async fn run(ctx: Context<Config>) -> anyhow::Result<()> {
    let config = ctx.config.clone();
    let problems = config.validate("vikunja");
    if !problems.is_empty() {
        let list: Vec<String> = problems.iter().map(|(k, p)| format!("{k}: {p}")).collect();
        anyhow::bail!("invalid vikunja configuration: {}", list.join("; "));
    }
    let (Some(url), Some(token_file), Some(secret_file)) = (
        config.url.as_deref(),
        config.token_file.clone(),
        config.webhook_secret_file.clone(),
    ) else {
        anyhow::bail!(
            "vikunja.url is not set: there is no Vikunja to serve (nisse leaves the service idle then)"
        );
    };
    let agent: AgentName = config
        .agent
        .parse()
        .map_err(|e| anyhow::anyhow!("vikunja.agent: {e}"))?;
    if !ctx.bus.agents().contains(&agent) {
        let served: Vec<&str> = ctx.bus.agents().iter().map(AgentName::as_str).collect();
        anyhow::bail!(
            "vikunja.agent `{agent}` is not an agent this process serves (it serves: {}); add it to `agents`",
            served.join(", ")
        );
    }
    let vikunja = api::Vikunja::new(url, token_file, config.call_timeout)
        .map_err(|e| anyhow::anyhow!("vikunja: {e}"))?;
    // A limit past what this machine can hold is refused at the start,
    // not met by a body.
    usize::try_from(config.max_body.as_u64())
        .map_err(|_| anyhow::anyhow!("vikunja.max-body: too large"))?;
    let frontend = config.frontend();
    let shared = Arc::new(server::Shared {
        bus: ctx.bus.clone(),
        agent: agent.clone(),
        config: config.clone(),
        secret: Secret::File(secret_file),
        frontend: frontend.clone(),
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
            vikunja: vikunja.clone(),
            frontend: frontend.clone(),
        };
        let shutdown = stop.clone();
        tasks.spawn(async move {
            poller.run(shutdown).await;
            Ok(())
        });
    } else {
        tracing::info!(%agent, "vikunja.poll-interval is 0s: no polling, webhooks only");
    }
    let calls = Arc::new(calls::Calls {
        bus: ctx.bus.clone(),
        agent: agent.clone(),
        config,
        vikunja,
        frontend,
    });
    let tells = Arc::new(tells::Tells {
        calls: calls.clone(),
    });
    // Two consumers, each one after another in stream order: a comment
    // asked for (or told) before marking a task done is made before it.
    let calls_intake = Intake {
        consumer: ConsumerSpec::INTAKE_VIKUNJA,
        in_flight: 1,
    };
    let tells_intake = Intake {
        consumer: ConsumerSpec::VIKUNJA_TELL,
        in_flight: 1,
    };
    // Each reports to a readiness of its own, and the service is ready
    // once both are bound (the receiver is already listening). Both stop
    // with the service, and either ending on its own (an error) stops the
    // other, the receiver and the poll.
    let bound = Readiness::default();
    let names = [calls_intake.consumer.name, tells_intake.consumer.name].map(String::from);
    let consumer_ctx = |name: &str| Context {
        ready: bound.reporter(name),
        shutdown: stop.clone(),
        ..ctx.clone()
    };
    let (calls_ctx, tells_ctx) = (consumer_ctx(&names[0]), consumer_ctx(&names[1]));
    let serve_calls = async {
        let served = nisse_bus::serve(&calls_ctx, calls_intake, vec![(agent.clone(), calls)]).await;
        stop.cancel();
        served.with_context(|| format!("consumer {}", calls_intake.consumer.name))
    };
    let serve_tells = async {
        let served = nisse_bus::serve(&tells_ctx, tells_intake, vec![(agent.clone(), tells)]).await;
        stop.cancel();
        served.with_context(|| format!("consumer {}", tells_intake.consumer.name))
    };
    let ready = async {
        tokio::select! {
            _ = bound.wait_for(&names) => ctx.ready.ready(),
            () = stop.cancelled() => {}
        }
    };
    let (calls_served, tells_served, ()) = tokio::join!(serve_calls, serve_tells, ready);
    while let Some(joined) = tasks.join_next().await {
        joined??;
    }
    calls_served?;
    tells_served?;
    Ok(())
}
