//! The mcp service's run loop: each served agent's `mcp` consumer on the
//! service skeleton, a supervisor per instance beside it, and for every
//! call the at-most-once flow: the record first (a done call is answered
//! from it, one started by a process that is gone is answered
//! OUTCOME_UNKNOWN and never called again), then the walls, then
//! "started" recorded, the call made, "done" recorded with the answer,
//! and the answer published.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prost::Message as _;
use rmcp::model::CallToolRequestParams;
use rmcp::service::ServiceError;
use tokio::sync::watch;

use nisse_bus::breaker::{BreakerSettings, Circuits};
use nisse_bus::proto::{McpFailure, McpRequest, McpResult, McpStatus};
use nisse_bus::service::{Context, Service};
use nisse_bus::{
    AgentName, Backoff, Bus, ConsumerSpec, Delivery, Handler, Intake, Persist, Unhandled,
};
use nisse_policy::Policy;

use crate::config::Config;
use crate::content;
use crate::record::{self, CallPhase, CallRecord};
use crate::server::{Server, Settings, now_ms};
use crate::walls::{Prepared, Walls};

/// The service; its name is its durable consumer's.
pub const SERVICE: Service = Service {
    name: ConsumerSpec::MCP.name,
    about: "the mcp service: tool calls on the agents' MCP server instances, mounted per work item, each request at most once",
};

/// Waits between tries to record an answer while the bus is away: the
/// call was made, so its answer must not be lost.
const RECORD_BACKOFF: Backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));

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
                process: process.clone(),
                servers,
                circuits,
                running: Mutex::new(HashMap::new()),
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
    /// This process, in the records it starts.
    process: String,
    /// The agent's instances, by name.
    pub(crate) servers: BTreeMap<String, Arc<Server>>,
    pub(crate) circuits: Circuits,
    /// Request ids being called in this process, each with a signal for
    /// when it is done (duplicates wait for it instead of being
    /// redelivered).
    running: Mutex<HashMap<String, watch::Receiver<bool>>>,
}

impl Handler<McpRequest> for AgentMcp {
    async fn handle(
        &self,
        _agent: &AgentName,
        delivery: &Delivery<McpRequest>,
    ) -> Result<(), Unhandled> {
        self.answer(delivery).await
    }
}

impl AgentMcp {
    /// Answers one delivery: `Ok` once its answer is published.
    async fn answer(&self, delivery: &Delivery<McpRequest>) -> Result<(), Unhandled> {
        let request = delivery.message();
        let rid = request.request_id.as_str();
        if rid.is_empty() {
            // Nothing to key a record on, nor to answer to.
            tracing::warn!(parent: delivery.span(), "an MCP call without a request id; dropped");
            return Ok(());
        }
        let mut spins = 0u32;
        loop {
            match self.read_record(rid).await? {
                Some((record, _)) if record.phase == CallPhase::Done => {
                    tracing::info!(parent: delivery.span(), request = %rid, "answered before: the recorded answer is given again");
                    return self.publish_stored(&record).await;
                }
                Some((record, revision)) => {
                    if record.process == self.process {
                        // Being called by this very process: wait for it,
                        // then answer from its record.
                        let waiting = self.lock_running().get(rid).cloned();
                        match waiting {
                            Some(mut done) => {
                                let _ = delivery
                                    .keep_alive(
                                        async move { done.wait_for(|d| *d).await.map(|_| ()) },
                                    )
                                    .await;
                            }
                            // Between its record and its entry in the map:
                            // a moment, never for long.
                            None if spins < 100 => {
                                spins += 1;
                                tokio::time::sleep(Duration::from_millis(20)).await;
                            }
                            None => {
                                return Err(Unhandled::retry_after(
                                    format!("{rid} is started here but not running"),
                                    delivery.ack_wait(),
                                ));
                            }
                        }
                        continue;
                    }
                    let age = now_ms().saturating_sub(record.heartbeat_ms);
                    if u128::from(age) < delivery.ack_wait().as_millis() / 2 {
                        return Err(Unhandled::retry_after(
                            format!("{rid} is being called by {}", record.process),
                            delivery.ack_wait(),
                        ));
                    }
                    // Started by a process that is gone, mid-call.
                    let result = self.reply(
                        request,
                        McpStatus::OutcomeUnknown,
                        McpFailure::Interrupted,
                        format!(
                            "the mcp service ({}) stopped while {}/{} was being called; whether it took effect is unknown, and it is not called again",
                            record.process, record.instance, record.tool
                        ),
                    );
                    let done = CallRecord {
                        phase: CallPhase::Done,
                        result: result.encode_to_vec(),
                        heartbeat_ms: now_ms(),
                        ..record
                    };
                    if record::write(&self.bus, &self.agent, &done, Some(revision))
                        .await
                        .map_err(|e| Unhandled::retry(format!("recording call {rid}: {e}")))?
                        .is_some()
                    {
                        tracing::warn!(parent: delivery.span(), request = %rid, "outcome unknown: started by a process of the service that is gone");
                        return self.publish(result).await;
                    }
                    // Settled by someone else in between: read again.
                    continue;
                }
                None => {}
            }

            // This process claims the id, so two deliveries of it here
            // never both call; another process is kept out by the record.
            let claim = {
                let mut running = self.lock_running();
                match running.get(rid) {
                    Some(done) => Err(done.clone()),
                    None => {
                        let (tx, rx) = watch::channel(false);
                        running.insert(rid.to_string(), rx);
                        Ok(tx)
                    }
                }
            };
            let done_tx = match claim {
                Ok(tx) => tx,
                Err(mut done) => {
                    let _ = delivery
                        .keep_alive(async move { done.wait_for(|d| *d).await.map(|_| ()) })
                        .await;
                    continue;
                }
            };
            let outcome = self.claimed(delivery).await;
            self.lock_running().remove(rid);
            let _ = done_tx.send(true);
            match outcome {
                Ok(true) => return Ok(()),
                // Another process recorded it first: answer from its record.
                Ok(false) => continue,
                Err(e) => return Err(e),
            }
        }
    }

    async fn read_record(
        &self,
        rid: &str,
    ) -> Result<Option<nisse_bus::Versioned<CallRecord>>, Unhandled> {
        record::read(&self.bus, &self.agent, rid)
            .await
            .map_err(|e| Unhandled::retry(format!("reading the record of call {rid}: {e}")))
    }

    /// Walls, then the call, for a request id this process has claimed.
    /// `Ok(false)` when another process recorded the id first.
    async fn claimed(&self, delivery: &Delivery<McpRequest>) -> Result<bool, Unhandled> {
        let request = delivery.message();
        let rid = request.request_id.as_str();
        let prepared = match self.walls(request).await? {
            Walls::Answer(result) => {
                tracing::info!(
                    parent: delivery.span(),
                    request = %rid,
                    instance = %request.instance,
                    tool = %request.tool,
                    failure = ?McpFailure::try_from(result.failure).unwrap_or_default(),
                    "not called: {}", result.reason
                );
                return self.settle_without_calling(request, *result).await;
            }
            Walls::Call(p) => p,
        };

        // Started, durably, before anything is called.
        let started = CallRecord {
            request_id: rid.to_string(),
            phase: CallPhase::Started,
            process: self.process.clone(),
            instance: request.instance.clone(),
            tool: request.tool.clone(),
            started_ms: now_ms(),
            heartbeat_ms: now_ms(),
            result: Vec::new(),
        };
        let revision = match record::write(&self.bus, &self.agent, &started, None).await {
            Ok(Some(r)) => r,
            other => {
                self.circuits.release_trial(&request.instance);
                return other
                    .map(|_| false)
                    .map_err(|e| Unhandled::retry(format!("recording call {rid}: {e}")));
            }
        };
        let result = delivery
            .keep_alive(self.call(request, prepared, started, revision, delivery.ack_wait()))
            .await;
        self.publish(result).await.map(|()| true)
    }

    fn lock_running(&self) -> std::sync::MutexGuard<'_, HashMap<String, watch::Receiver<bool>>> {
        match self.running.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// Records an answer nothing was called for as the request's final
    /// one, then publishes it.
    async fn settle_without_calling(
        &self,
        request: &McpRequest,
        result: McpResult,
    ) -> Result<bool, Unhandled> {
        let record = CallRecord {
            request_id: request.request_id.clone(),
            phase: CallPhase::Done,
            process: self.process.clone(),
            instance: request.instance.clone(),
            tool: request.tool.clone(),
            started_ms: 0,
            heartbeat_ms: now_ms(),
            result: result.encode_to_vec(),
        };
        match record::write(&self.bus, &self.agent, &record, None)
            .await
            .map_err(|e| Unhandled::retry(format!("recording call {}: {e}", request.request_id)))?
        {
            Some(_) => self.publish(result).await.map(|()| true),
            None => Ok(false),
        }
    }

    /// Makes a prepared call, keeping the record's heartbeat; records the
    /// answer as done.
    async fn call(
        &self,
        request: &McpRequest,
        prepared: Prepared,
        mut record: CallRecord,
        mut revision: u64,
        ack_wait: Duration,
    ) -> McpResult {
        let began = Instant::now();
        let call = self.make(request, &prepared);
        tokio::pin!(call);
        let mut heartbeat = tokio::time::interval((ack_wait / 3).max(Duration::from_millis(100)));
        heartbeat.tick().await;
        let mut result = loop {
            tokio::select! {
                result = &mut call => break result,
                _ = heartbeat.tick() => {
                    record.heartbeat_ms = now_ms();
                    match record::write(&self.bus, &self.agent, &record, Some(revision)).await {
                        Ok(Some(r)) => revision = r,
                        Ok(None) => tracing::warn!(request = %record.request_id, "the call's record changed while it was being called"),
                        Err(e) => tracing::warn!(request = %record.request_id, "heartbeat: {e}"),
                    }
                }
            }
        };
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
        self.record_done(record, revision, result).await
    }

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

    /// Stores the answer as the request's final one, retrying while the
    /// bus is away (the call was made: its answer must not be lost). If
    /// the record was settled by someone else meanwhile, theirs stands.
    async fn record_done(
        &self,
        record: CallRecord,
        mut revision: u64,
        result: McpResult,
    ) -> McpResult {
        let done = CallRecord {
            phase: CallPhase::Done,
            heartbeat_ms: now_ms(),
            result: result.encode_to_vec(),
            ..record
        };
        let mut trouble = Persist::new("record an MCP call's answer", RECORD_BACKOFF);
        loop {
            let why = match record::write(&self.bus, &self.agent, &done, Some(revision)).await {
                Ok(Some(_)) => return result,
                Ok(None) => match record::read(&self.bus, &self.agent, &done.request_id).await {
                    Ok(Some((stored, _))) if stored.phase == CallPhase::Done => {
                        tracing::warn!(request = %done.request_id, "the call was settled elsewhere while it was made; that answer stands");
                        return McpResult::decode(stored.result.as_slice()).unwrap_or(result);
                    }
                    Ok(Some((_, r))) => {
                        revision = r;
                        continue;
                    }
                    // The record expired or was removed: write it anew.
                    Ok(None) => match record::write(&self.bus, &self.agent, &done, None).await {
                        Ok(Some(_)) => return result,
                        Ok(None) => "another process wrote it first".to_string(),
                        Err(e) => e.to_string(),
                    },
                    Err(e) => e.to_string(),
                },
                Err(e) => e.to_string(),
            };
            trouble.failed(&why).await;
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

    async fn publish(&self, result: McpResult) -> Result<(), Unhandled> {
        self.bus
            .publish(result)
            .await
            .map(|_| ())
            .map_err(|e| Unhandled::retry(format!("publishing the answer: {e}")))
    }

    /// Publishes a stored answer again (same message id: JetStream drops
    /// it if the first publish is still within the duplicate window).
    async fn publish_stored(&self, record: &CallRecord) -> Result<(), Unhandled> {
        let result = McpResult::decode(record.result.as_slice()).map_err(|e| {
            Unhandled::retry(format!(
                "the stored answer of {} does not decode: {e}",
                record.request_id
            ))
        })?;
        self.publish(result).await
    }
}
