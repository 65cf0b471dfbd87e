//! The mcp service's run loop: each served agent's `mcp` consumer on the
//! service skeleton, a supervisor per instance beside it, and every call
//! through the bus's at-most-once engine ([`nisse_bus::once`]: its
//! record, the walls, "started", the call, "finished" with the answer,
//! the answer published), with what is the service's own here: its
//! walls, the call itself, and the outcome-unknown answer.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use rmcp::model::CallToolRequestParams;
use rmcp::service::ServiceError;

use nisse_bus::breaker::{BreakerSettings, Circuits};
use nisse_bus::once::{Gate, Once, Record, Work};
use nisse_bus::proto::{McpFailure, McpRequest, McpResult, McpStatus};
use nisse_bus::service::{Context, Service};
use nisse_bus::{AgentName, Bus, ConsumerSpec, Delivery, Handler, Intake, Unhandled};
use nisse_policy::Policy;

use crate::config::Config;
use crate::content;
use crate::record;
use crate::server::{Server, Settings};
use crate::walls::Prepared;

/// The service; its name is its durable consumer's.
pub const SERVICE: Service = Service {
    name: ConsumerSpec::MCP.name,
    about: "the mcp service: tool calls on the agents' MCP server instances, mounted per work item, each request at most once",
};

/// What the mcp service runs with, as the executor's `Config`: its
/// section and the policy. The policy stays out of the section, which is
/// `nisse.toml`'s `[mcp]` as the brain and the CLI read it too: beside
/// it, a service cannot be started without one.
#[derive(Debug, Clone)]
pub struct ServiceConfig {
    /// `[mcp]`.
    pub mcp: Config,
    /// The policy the kill switches are consulted by, loaded as the
    /// classifier's and the executor's are.
    pub policy: Arc<Policy>,
}

/// Runs the mcp service for every agent of `ctx` until shutdown: each
/// agent's instances kept connected and their tools announced, and its
/// calls answered; then lets calls in flight finish and closes the
/// connections (a child process is asked to stop, then killed).
pub async fn run(ctx: Context<ServiceConfig>) -> anyhow::Result<()> {
    let config = Arc::new(ctx.config.mcp.clone());
    let process = format!("{}-{}", SERVICE.name, uuid::Uuid::now_v7());
    let settings = Settings {
        connect_timeout: config.connect_timeout,
        reconnect: config.reconnect(),
    };
    let mut handlers = Vec::new();
    let mut supervisors = tokio::task::JoinSet::new();
    // The supervisors stop once serving has: at shutdown the calls in
    // flight finish first, on the connections they hold.
    let stop = tokio_util::sync::CancellationToken::new();
    for agent in &ctx.agents {
        let mut servers = BTreeMap::new();
        for instance in config.instances_of(agent.as_str()) {
            let server = Arc::new(Server::new(
                instance.clone(),
                agent.clone(),
                ctx.bus.clone(),
                settings,
            ));
            supervisors.spawn(server.clone().supervise(stop.clone()));
            servers.insert(instance.name.clone(), server);
        }
        if servers.is_empty() {
            tracing::info!(%agent, "no MCP instance is configured for {agent}: its calls are refused as unknown instances");
        }
        let circuits = Circuits::new(
            agent.clone(),
            ctx.bus.clone(),
            BreakerSettings {
                failures: config.breaker_failures,
                window: config.breaker_window,
                cooldown: config.breaker_cooldown,
            },
            record::CIRCUITS,
        );
        handlers.push((
            agent.clone(),
            Arc::new(AgentMcp {
                agent: agent.clone(),
                bus: ctx.bus.clone(),
                brain_key: config.brain_key(agent.as_str(), &ctx.data_dir),
                config: config.clone(),
                policy: ctx.config.policy.clone(),
                data_dir: ctx.data_dir.clone(),
                servers,
                circuits,
                once: Once::new(
                    ctx.bus.clone(),
                    agent.clone(),
                    record::LEDGER,
                    "the mcp service",
                    process.clone(),
                ),
            }),
        ));
    }
    let intake = Intake {
        consumer: ConsumerSpec::MCP,
        in_flight: config.max_in_flight,
    };
    let served = nisse_bus::serve(&ctx, intake, handlers).await;
    // Calls in flight have finished (or the process is stopped under them,
    // and their records say "started": outcome unknown); the supervisors
    // close the connections.
    stop.cancel();
    while supervisors.join_next().await.is_some() {}
    served?;
    Ok(())
}

/// One agent's side of the service.
pub(crate) struct AgentMcp {
    pub(crate) agent: AgentName,
    pub(crate) bus: Bus,
    pub(crate) config: Arc<Config>,
    /// The policy the kill switches are consulted by.
    pub(crate) policy: Arc<Policy>,
    /// The brain's public key file, read at each call.
    pub(crate) brain_key: PathBuf,
    /// Where the brains' public keys are, to name the owner of a key that
    /// signed a call it should not have.
    pub(crate) data_dir: PathBuf,
    /// The agent's instances, by name.
    pub(crate) servers: BTreeMap<String, Arc<Server>>,
    pub(crate) circuits: Circuits,
    /// Each request id at most once, in `nisse_mcp`.
    once: Once,
}

impl Handler<McpRequest> for AgentMcp {
    async fn handle(
        &self,
        _agent: &AgentName,
        delivery: &Delivery<McpRequest>,
    ) -> Result<(), Unhandled> {
        self.once.answer(self, delivery).await
    }
}

impl Work for AgentMcp {
    type Request = McpRequest;
    type Answer = McpResult;
    type Prepared = Prepared;

    fn request_id(request: &McpRequest) -> &str {
        &request.request_id
    }

    fn target(request: &McpRequest) -> String {
        format!("{}/{}", request.instance, request.tool)
    }

    async fn walls(&self, request: &McpRequest) -> Result<Gate<Prepared, McpResult>, Unhandled> {
        let gate = self.check(request).await?;
        if let Gate::Answer(result) = &gate {
            tracing::info!(
                request = %request.request_id,
                instance = %request.instance,
                tool = %request.tool,
                failure = ?McpFailure::try_from(result.failure).unwrap_or_default(),
                "not called: {}", result.reason
            );
        }
        Ok(gate)
    }

    async fn perform(&self, request: &McpRequest, prepared: Prepared) -> McpResult {
        let began = Instant::now();
        let mut result = self.make(request, &prepared).await;
        result.duration_ms = u64::try_from(began.elapsed().as_millis()).unwrap_or(u64::MAX);
        tracing::info!(
            request = %request.request_id,
            instance = %request.instance,
            tool = %request.tool,
            status = ?McpStatus::try_from(result.status).unwrap_or_default(),
            is_error = result.is_error,
            duration_ms = result.duration_ms,
            "called"
        );
        result
    }

    fn interrupted(&self, request: &McpRequest, record: &Record) -> McpResult {
        self.reply(
            request,
            McpStatus::OutcomeUnknown,
            McpFailure::Interrupted,
            format!(
                "the mcp service ({}) stopped while {} was being called; whether it took effect is unknown, and it is not called again",
                record.process, record.target
            ),
        )
    }

    fn not_started(&self, request: &McpRequest) {
        self.circuits.release_trial(&request.instance);
    }
}

impl AgentMcp {
    /// The call itself: the connection (made first if there is none),
    /// then `tools/call`, within the timeout. Every answer and every
    /// failure is an `McpResult`.
    async fn make(&self, request: &McpRequest, prepared: &Prepared) -> McpResult {
        let server = &prepared.server;
        let instance = server.name();
        let session = match server.session().await {
            Ok(s) => s,
            Err(e) => {
                self.circuits.failure(instance, &e);
                return self.reply(
                    request,
                    McpStatus::Failed,
                    McpFailure::Connect,
                    format!("{instance} cannot be reached: {e}; nothing was called"),
                );
            }
        };
        let params = CallToolRequestParams::new(request.tool.clone())
            .with_arguments(prepared.arguments.clone());
        let cap = usize::try_from(server.config.max_output.as_u64()).unwrap_or(usize::MAX);
        match tokio::time::timeout(prepared.timeout, session.peer.call_tool(params)).await {
            Ok(Ok(answer)) => {
                self.circuits.success(instance);
                let rendered = content::render(&answer, &session.redactor, cap);
                let mut r = self.reply(
                    request,
                    McpStatus::Completed,
                    McpFailure::Unspecified,
                    String::new(),
                );
                r.is_error = answer.is_error.unwrap_or(false);
                r.content = rendered.content;
                r.structured_json = rendered.structured_json;
                r.dropped_bytes = rendered.dropped;
                r
            }
            Ok(Err(ServiceError::McpError(e))) => {
                // The server answered: it is reachable, and said no.
                self.circuits.success(instance);
                let (reason, _) = content::capped(
                    &session.redactor,
                    format!(
                        "{instance} answered {}/{} with an error ({}): {}",
                        instance, request.tool, e.code.0, e.message
                    )
                    .as_bytes(),
                    cap,
                );
                self.reply(request, McpStatus::Failed, McpFailure::Protocol, reason)
            }
            Ok(Err(ServiceError::UnexpectedResponse)) => {
                self.circuits.success(instance);
                self.reply(
                    request,
                    McpStatus::Failed,
                    McpFailure::Protocol,
                    format!(
                        "{instance} answered {}/{} with something other than a tool result (a task, or a request for input, which this client does not take)",
                        instance, request.tool
                    ),
                )
            }
            Ok(Err(e)) => {
                // The request was handed over; the connection broke (or
                // the server cancelled it) before an answer came.
                let e = content::redacted(&session.redactor, &crate::server::explain(&e));
                self.circuits.failure(instance, &e);
                server.discard(session.generation).await;
                self.reply(
                    request,
                    McpStatus::OutcomeUnknown,
                    McpFailure::Connect,
                    format!(
                        "the connection to {instance} broke while {}/{} was being called ({e}); whether it took effect is unknown, and it is not called again",
                        instance, request.tool
                    ),
                )
            }
            Err(_) => self.reply(
                request,
                McpStatus::Failed,
                McpFailure::Timeout,
                format!(
                    "{instance} did not answer {}/{} within {}; the call was abandoned (and cancelled at the server), but it may still take effect",
                    instance,
                    request.tool,
                    humantime::format_duration(prepared.timeout)
                ),
            ),
        }
    }

    /// An answer to `request`, with its envelope (the request's agent,
    /// work item and trace).
    pub(crate) fn reply(
        &self,
        request: &McpRequest,
        status: McpStatus,
        failure: McpFailure,
        reason: String,
    ) -> McpResult {
        McpResult {
            envelope: Some(SERVICE.reply_to(
                request.envelope.as_ref(),
                format!("result:{}", request.request_id),
            )),
            request_id: request.request_id.clone(),
            status: status as i32,
            failure: failure as i32,
            reason,
            ..Default::default()
        }
    }
}
