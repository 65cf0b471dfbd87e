//! The executor service: `exec.req` → `exec.result`, over SSH (seed L13:
//! `execute(host, command, …)` is the only way anything runs).
//!
//! For every request, in order:
//!
//! 1. **At most once.** The request id is the idempotency key. Its record
//!    in the `nisse_exec` bucket says whether it finished (the stored
//!    result is published again, nothing runs) or was started by an
//!    executor that is gone (the outcome is unknown: reported so, never
//!    run again blindly, L8).
//! 2. **Hard walls, checked here again** whatever the brain checked: the
//!    host must be one bound to the request's work item (read from the
//!    stream, not from the request), the kill switches (read fresh, through
//!    `nisse_policy::consult`) must allow the command, the secrets asked
//!    for must be granted for that host, and the host's circuit must be
//!    closed. A refusal is made before any connection.
//! 3. **Started** is recorded durably, then the command runs on a pooled
//!    connection with the granted secrets in its environment or on its
//!    standard input; output is redacted and capped, and published as
//!    progress while it runs; the record's heartbeat and the message's
//!    progress acks go on meanwhile.
//! 4. **Finished** is recorded with the result, then the result is
//!    published and the request acked.

pub mod breaker;
pub mod config;
pub mod identity;
pub mod output;
pub mod redact;
pub mod ssh;

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use prost::Message as _;
use tokio::sync::{Semaphore, mpsc, watch};
use tokio_util::sync::CancellationToken;

use nisse_bus::proto::{
    self, Envelope, ExecFailure, ExecProgress, ExecRequest, ExecResult, ExecStatus,
};
use nisse_bus::{
    AgentName, Bus, CircuitState, ConsumerSpec, Delivery, Disposition, ExecPhase, ExecRecord,
    HandlerError,
};
use nisse_policy::switches::{SwitchDecision, Switches, consult};
use nisse_policy::{Action, FileOp, Policy};

use crate::breaker::{Admit, Breaker, BreakerSettings, Circuit};
use crate::config::Config;
use crate::output::Capped;
use crate::redact::Redactor;
use crate::ssh::{Chunk, Pool, RunSpec, SshError, SshSettings};

/// The service's name: its consumer, and the actor on its messages.
pub const SERVICE: &str = "executor";

/// Most output one progress message carries.
const PROGRESS_MAX: usize = 4096;

/// A request that could not be answered now; JetStream redelivers it.
#[derive(Debug, thiserror::Error)]
#[error("{reason}")]
struct Later {
    reason: String,
    delay: Option<Duration>,
}

impl HandlerError for Later {
    fn disposition(&self) -> Disposition {
        Disposition::Retry(self.delay)
    }
}

fn later(reason: impl std::fmt::Display) -> Later {
    Later {
        reason: reason.to_string(),
        delay: None,
    }
}

/// Runs the executor for `agents` until `shutdown`, then lets running
/// commands finish. `data_dir` locates the agents' default key and
/// known-hosts files.
pub async fn run(
    bus: Bus,
    agents: Vec<AgentName>,
    config: Arc<Config>,
    data_dir: &Path,
    policy: Arc<Policy>,
    shutdown: CancellationToken,
    ready: impl FnOnce(),
) -> nisse_bus::Result<()> {
    let instance = format!("{SERVICE}-{}", uuid::Uuid::now_v7());
    let mut consumers = Vec::new();
    for agent in &agents {
        let consumer = bus
            .consumer::<ExecRequest>(agent, ConsumerSpec::EXECUTOR)
            .await?;
        let setup = config.agent(agent.as_str(), data_dir);
        if setup.key_is_default {
            match identity::ensure_key(&setup.key_file, agent.as_str(), true) {
                Ok((public, true)) => tracing::info!(
                    %agent,
                    key = %setup.key_file.display(),
                    "made the agent's SSH key; authorize it on its hosts: {public}"
                ),
                Ok(_) => {}
                // Every command will say so too; the service still runs.
                Err(e) => tracing::warn!(%agent, "{e}"),
            }
        }
        let pool = Pool::new(
            setup,
            SshSettings {
                connect_timeout: config.connect_timeout,
                idle_timeout: config.idle_timeout,
                max_channels: config.max_channels_per_connection,
            },
        );
        let exec = Arc::new(AgentExecutor {
            agent: agent.clone(),
            bus: bus.clone(),
            policy: policy.clone(),
            config: config.clone(),
            instance: instance.clone(),
            pool,
            breakers: Mutex::new(HashMap::new()),
            running: Mutex::new(HashMap::new()),
            slots: Arc::new(Semaphore::new(config.max_in_flight)),
        });
        consumers.push((exec, consumer));
    }
    ready();
    let mut tasks = tokio::task::JoinSet::new();
    for (exec, mut consumer) in consumers {
        let shutdown = shutdown.clone();
        tasks.spawn(async move {
            let mut running = tokio::task::JoinSet::new();
            let reap_every = (exec.config.idle_timeout / 4).max(Duration::from_secs(1));
            let mut reap = tokio::time::interval(reap_every);
            loop {
                let next = tokio::select! {
                    n = consumer.next(&shutdown) => n,
                    _ = reap.tick() => {
                        exec.pool.reap_idle().await;
                        continue;
                    }
                };
                let Some(next) = next else { break };
                let delivery = match next {
                    Ok(d) => d,
                    Err(e) => {
                        tracing::warn!(agent = %exec.agent, "executor consumer: {e}");
                        tokio::time::sleep(Duration::from_millis(500)).await;
                        continue;
                    }
                };
                let exec = exec.clone();
                running.spawn(async move {
                    let outcome = exec.answer(&delivery).await;
                    if let Err(e) = &outcome {
                        tracing::warn!(
                            parent: delivery.span(),
                            request = %delivery.message().request_id,
                            "not answered now, will be redelivered: {e}"
                        );
                    }
                    if let Err(e) = delivery.settle(outcome).await {
                        tracing::warn!("settling an execution request: {e}");
                    }
                });
                // Reap finished tasks as we go.
                while running.try_join_next().is_some() {}
            }
            // Running commands finish (or the process is stopped under
            // them, and their records say "started": outcome unknown).
            while running.join_next().await.is_some() {}
            exec.pool.close_all().await;
        });
    }
    while tasks.join_next().await.is_some() {}
    Ok(())
}

/// One agent's executor.
struct AgentExecutor {
    agent: AgentName,
    bus: Bus,
    policy: Arc<Policy>,
    config: Arc<Config>,
    instance: String,
    pool: Pool,
    breakers: Mutex<HashMap<String, Breaker>>,
    /// Request ids running in this process, each with a signal for when it
    /// is done (duplicates wait for it instead of being redelivered).
    running: Mutex<HashMap<String, watch::Receiver<bool>>>,
    /// Commands running at once (`max-in-flight`). Duplicates and refusals
    /// take no slot: only a command about to run waits for one.
    slots: Arc<Semaphore>,
}

/// What the walls decided.
enum Walls {
    /// Answer with this result; nothing runs.
    Answer(Box<ExecResult>),
    /// Run this.
    Run(Prepared),
}

/// A command ready to run.
struct Prepared {
    spec: RunSpec,
    redactor: Redactor,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

impl AgentExecutor {
    /// Answers one delivery: `Ok` once its result is published.
    async fn answer(&self, delivery: &Delivery<ExecRequest>) -> Result<(), Later> {
        let request = delivery.message();
        let rid = request.request_id.as_str();
        if rid.is_empty() {
            // Nothing to key a record on, nor to answer to.
            tracing::warn!(parent: delivery.span(), "an execution request without a request id; dropped");
            return Ok(());
        }
        // 1. At most once.
        let mut spins = 0u32;
        loop {
            match self
                .bus
                .exec_record(&self.agent, rid)
                .await
                .map_err(later)?
            {
                Some((record, _)) if record.phase == ExecPhase::Finished => {
                    return self.publish_stored(&record).await;
                }
                Some((record, revision)) => {
                    let age = now_ms().saturating_sub(record.heartbeat_ms);
                    let fresh = u128::from(age) < delivery.ack_wait().as_millis() / 2;
                    if record.instance == self.instance {
                        // Started by this very process, which is alive:
                        // wait for that run, then answer from its record.
                        let waiting = self.lock_running().get(rid).cloned();
                        match waiting {
                            Some(mut done) => {
                                let _ = delivery
                                    .keep_alive(
                                        async move { done.wait_for(|d| *d).await.map(|_| ()) },
                                    )
                                    .await;
                            }
                            // Between its record and its entry in the
                            // map: a moment, never for long.
                            None if spins < 100 => {
                                spins += 1;
                                tokio::time::sleep(Duration::from_millis(20)).await;
                            }
                            None => {
                                return Err(Later {
                                    reason: format!("{rid} is started here but not running"),
                                    delay: Some(delivery.ack_wait()),
                                });
                            }
                        }
                        continue;
                    }
                    if fresh {
                        return Err(Later {
                            reason: format!("{rid} is running on {}", record.instance),
                            delay: Some(delivery.ack_wait()),
                        });
                    }
                    let result = self.reply(
                        request,
                        ExecStatus::OutcomeUnknown,
                        ExecFailure::Interrupted,
                        format!(
                            "the executor ({}) stopped while this command ran on {}; whether it took effect is unknown, and it is not run again",
                            record.instance, record.host
                        ),
                    );
                    let finished = ExecRecord {
                        phase: ExecPhase::Finished,
                        result: result.encode_to_vec(),
                        heartbeat_ms: now_ms(),
                        ..record
                    };
                    if self
                        .bus
                        .write_exec_record(&self.agent, &finished, Some(revision))
                        .await
                        .map_err(later)?
                        .is_some()
                    {
                        tracing::warn!(parent: delivery.span(), request = %rid, "outcome unknown: started by an executor that is gone");
                        return self.publish(result).await;
                    }
                    // Someone else settled it in between: read again.
                    continue;
                }
                None => {}
            }

            // This process claims the id, so two deliveries of it here never
            // both run it; another process is kept out by the record.
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

    /// Walls, then the run, for a request id this process has claimed.
    /// `Ok(false)` when another process recorded the id first.
    async fn claimed(&self, delivery: &Delivery<ExecRequest>) -> Result<bool, Later> {
        let request = delivery.message();
        let rid = request.request_id.as_str();
        // 2. Hard walls.
        let prepared = match self.walls(request).await? {
            Walls::Answer(result) => {
                tracing::info!(
                    parent: delivery.span(),
                    request = %rid,
                    host = %request.host,
                    failure = ?ExecFailure::try_from(result.failure).unwrap_or_default(),
                    "not run: {}", result.reason
                );
                return self.settle_without_running(request, *result).await;
            }
            Walls::Run(p) => p,
        };

        // 3. Started, durably, before anything runs; first a free slot,
        // without letting the message be redelivered meanwhile.
        let slot = delivery
            .keep_alive(self.slots.clone().acquire_owned())
            .await;
        let Ok(_slot) = slot else {
            return Err(later("the executor is stopping"));
        };
        let started = ExecRecord {
            request_id: rid.to_string(),
            phase: ExecPhase::Started,
            instance: self.instance.clone(),
            host: request.host.clone(),
            heartbeat_ms: now_ms(),
            result: Vec::new(),
        };
        let revision = match self
            .bus
            .write_exec_record(&self.agent, &started, None)
            .await
        {
            Ok(Some(r)) => r,
            other => {
                self.release_trial(&request.host);
                return other.map(|_| false).map_err(later);
            }
        };
        let result = delivery
            .keep_alive(self.execute(request, prepared, started, revision, delivery.ack_wait()))
            .await;
        self.publish(result).await.map(|()| true)
    }

    fn lock_running(&self) -> std::sync::MutexGuard<'_, HashMap<String, watch::Receiver<bool>>> {
        match self.running.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// Records a result nothing ran for as the request's final answer,
    /// then publishes it.
    async fn settle_without_running(
        &self,
        request: &ExecRequest,
        result: ExecResult,
    ) -> Result<bool, Later> {
        let record = ExecRecord {
            request_id: request.request_id.clone(),
            phase: ExecPhase::Finished,
            instance: self.instance.clone(),
            host: request.host.clone(),
            heartbeat_ms: now_ms(),
            result: result.encode_to_vec(),
        };
        match self
            .bus
            .write_exec_record(&self.agent, &record, None)
            .await
            .map_err(later)?
        {
            Some(_) => self.publish(result).await.map(|()| true),
            None => Ok(false),
        }
    }

    /// The hard walls, in order, before any connection.
    async fn walls(&self, request: &ExecRequest) -> Result<Walls, Later> {
        let refuse = |failure: ExecFailure, reason: String| {
            Ok(Walls::Answer(Box::new(self.reply(
                request,
                ExecStatus::Refused,
                failure,
                reason,
            ))))
        };
        let item = request
            .envelope
            .as_ref()
            .map_or("", |e| e.work_item_id.as_str());
        let host = request.host.as_str();
        if item.is_empty() {
            return refuse(
                ExecFailure::BadRequest,
                "the request names no work item, and hosts are bound per work item".into(),
            );
        }
        if host.is_empty() {
            return refuse(ExecFailure::BadRequest, "the request names no host".into());
        }
        // Only the gates make requests (`Txn::emit_exec`, from a permit),
        // and they always say what permitted one.
        if request
            .permission
            .as_ref()
            .is_none_or(|p| p.verdict_request_id.is_empty())
        {
            return refuse(
                ExecFailure::BadRequest,
                "the request carries no permission from the gates".into(),
            );
        }
        // A command line, or a file tool's operation: exactly one.
        let file = match (&request.file, request.command.trim().is_empty()) {
            (None, false) => None,
            (Some(f), true) => match FileOp::from_wire(f) {
                Ok(op) => Some(op),
                Err(e) => return refuse(ExecFailure::BadRequest, e.0),
            },
            (None, true) => {
                return refuse(ExecFailure::BadRequest, "the request has no command".into());
            }
            (Some(_), false) => {
                return refuse(
                    ExecFailure::BadRequest,
                    "the request has both a command and a file operation".into(),
                );
            }
        };
        let action = match &file {
            Some(op) => match op.to_action(host) {
                Ok(a) => a,
                Err(e) => return refuse(ExecFailure::BadRequest, e.0),
            },
            None => Action::shell(host, &request.command),
        };

        // The host binding, from the stream.
        let binding = self
            .bus
            .host_binding(&self.agent, item)
            .await
            .map_err(|e| later(format!("reading the host binding: {e}")))?;
        let bound = binding.map(|b| b.hosts).unwrap_or_default();
        if !bound.iter().any(|h| h == host) {
            return refuse(
                ExecFailure::HostNotBound,
                format!(
                    "{host} is not bound to work item {item} (bound: {}); nothing was run and no connection was made",
                    if bound.is_empty() {
                        "none".to_string()
                    } else {
                        bound.join(", ")
                    }
                ),
            );
        }

        // The kill switches, read now.
        let board = self
            .bus
            .switches()
            .await
            .map_err(|e| later(format!("reading the kill switches: {e}")))?
            .board;
        let assessment = self.policy.assess(&action, None);
        let switches = Switches::for_action(
            board.autonomy_off,
            board
                .never
                .iter()
                .map(|(t, e)| (t.as_str(), format!("{} (set by {})", e.reason, e.set_by))),
            &assessment,
        );
        let confirmed = request
            .permission
            .as_ref()
            .is_some_and(|p| p.operator_confirmed);
        match consult(&switches, assessment.class, &assessment.targets, confirmed) {
            SwitchDecision::Allow => {}
            SwitchDecision::NeedsDiscussion(r) | SwitchDecision::Refused(r) => {
                return refuse(
                    ExecFailure::KillSwitch,
                    format!("refused by the executor: {r}"),
                );
            }
        }

        // Connection settings and secrets.
        let Some(host_cfg) = self.pool.host(host) else {
            return Ok(Walls::Answer(Box::new(self.reply(
                request,
                ExecStatus::Failed,
                ExecFailure::UnknownHost,
                format!(
                    "the executor has no connection settings for {host} (executor.agents.{}.hosts.{host})",
                    self.agent
                ),
            ))));
        };
        if let Some(name) = request
            .secret_names
            .iter()
            .find(|n| !host_cfg.secrets.iter().any(|g| &g.name == *n))
        {
            return refuse(
                ExecFailure::BadRequest,
                format!("the secret `{name}` is not granted for {host}"),
            );
        }
        let mut spec = RunSpec {
            command: request.command.clone(),
            env: Vec::new(),
            stdin: Vec::new(),
            timeout: self.timeout(request),
        };
        // A file operation runs fixed code on its own input: it needs, and
        // gets, no secrets.
        let grants = match &file {
            Some(op) => {
                if !request.secret_names.is_empty() {
                    return refuse(
                        ExecFailure::BadRequest,
                        "a file operation is handed no secrets".into(),
                    );
                }
                spec.command = op.remote_command();
                spec.stdin = op.stdin().to_vec();
                &[][..]
            }
            None => host_cfg.secrets.as_slice(),
        };
        let mut values: Vec<Vec<u8>> = Vec::new();
        for grant in grants {
            let value = match self.read_secret(&grant.name) {
                Ok(v) => v,
                Err(reason) => {
                    return Ok(Walls::Answer(Box::new(self.reply(
                        request,
                        ExecStatus::Failed,
                        ExecFailure::Secret,
                        reason,
                    ))));
                }
            };
            if let Some(var) = &grant.env {
                match String::from_utf8(value.clone()) {
                    Ok(text) => spec.env.push((var.clone(), text)),
                    Err(_) => {
                        return Ok(Walls::Answer(Box::new(self.reply(
                            request,
                            ExecStatus::Failed,
                            ExecFailure::Secret,
                            format!(
                                "the secret `{}` is not text, so it cannot go in an environment variable; hand it over stdin",
                                grant.name
                            ),
                        ))));
                    }
                }
            } else {
                spec.stdin.extend_from_slice(&value);
                spec.stdin.push(b'\n');
            }
            values.push(value);
        }
        if file.is_none() {
            spec.stdin.extend_from_slice(&request.stdin);
        } else if !request.stdin.is_empty() {
            return refuse(
                ExecFailure::BadRequest,
                "a file operation takes no standard input besides its content".into(),
            );
        }

        // The circuit.
        if let Admit::No {
            retry_in,
            last_error,
        } = self.admit(host)
        {
            return Ok(Walls::Answer(Box::new(self.reply(
                request,
                ExecStatus::Failed,
                ExecFailure::CircuitOpen,
                format!(
                    "the circuit for {host} is open after repeated connection failures (the last: {last_error}); not tried, next try in {}s",
                    retry_in.as_secs() + 1
                ),
            ))));
        }
        Ok(Walls::Run(Prepared {
            spec,
            redactor: Redactor::new(values.iter().map(Vec::as_slice)),
        }))
    }

    /// The request's timeout, at most the configured one.
    fn timeout(&self, request: &ExecRequest) -> Duration {
        let asked = Duration::from_millis(request.timeout_ms);
        if asked.is_zero() {
            self.config.command_timeout
        } else {
            asked.min(self.config.command_timeout)
        }
    }

    /// A secret's value, read now (so a rotated secret is used at once).
    fn read_secret(&self, name: &str) -> Result<Vec<u8>, String> {
        let source = self
            .pool
            .setup()
            .secrets
            .get(name)
            .ok_or_else(|| format!("the secret `{name}` is not configured"))?;
        let mut value = match (&source.file, &source.env) {
            (Some(path), _) => std::fs::read(path).map_err(|e| {
                format!(
                    "the secret `{name}` cannot be read from {}: {e}",
                    path.display()
                )
            })?,
            (None, Some(var)) => std::env::var_os(var)
                .map(|v| v.into_encoded_bytes())
                .ok_or_else(|| format!("the secret `{name}`: the variable {var} is not set"))?,
            (None, None) => return Err(format!("the secret `{name}` has no source")),
        };
        if value.last() == Some(&b'\n') {
            value.pop();
        }
        if value.is_empty() {
            return Err(format!("the secret `{name}` is empty"));
        }
        Ok(value)
    }

    /// Runs a prepared command, keeping the record's heartbeat and
    /// publishing progress; records the result as finished.
    async fn execute(
        &self,
        request: &ExecRequest,
        prepared: Prepared,
        mut record: ExecRecord,
        mut revision: u64,
        ack_wait: Duration,
    ) -> ExecResult {
        let began = Instant::now();
        let (tx, mut rx) = mpsc::unbounded_channel();
        let run = self.pool.run(&request.host, &prepared.spec, &tx);
        tokio::pin!(run);
        let cap = usize::try_from(self.config.output_cap.as_u64()).unwrap_or(usize::MAX);
        let mut out = Output::new(&prepared.redactor, cap);
        let mut heartbeat = tokio::time::interval((ack_wait / 3).max(Duration::from_millis(100)));
        let mut progress = tokio::time::interval(self.config.progress_interval);
        heartbeat.tick().await;
        progress.tick().await;
        let mut seq = 0u32;
        let outcome = loop {
            tokio::select! {
                outcome = &mut run => break outcome,
                Some(chunk) = rx.recv() => out.push(chunk),
                _ = heartbeat.tick() => {
                    record.heartbeat_ms = now_ms();
                    match self.bus.write_exec_record(&self.agent, &record, Some(revision)).await {
                        Ok(Some(r)) => revision = r,
                        Ok(None) => tracing::warn!(request = %record.request_id, "the execution record changed under a running command"),
                        Err(e) => tracing::warn!(request = %record.request_id, "heartbeat: {e}"),
                    }
                }
                _ = progress.tick() => {
                    if let Some((stdout, stderr)) = out.take_progress() {
                        seq += 1;
                        self.publish_progress(request, seq, stdout, stderr, began.elapsed()).await;
                    }
                }
            }
        };
        while let Ok(chunk) = rx.try_recv() {
            out.push(chunk);
        }
        let (stdout, stdout_dropped, stderr, stderr_dropped) = out.finish();
        let mut result = match outcome {
            Ok(exit) => {
                self.breaker_success(&request.host);
                let mut r = self.reply(
                    request,
                    ExecStatus::Completed,
                    ExecFailure::Unspecified,
                    String::new(),
                );
                match (exit.code, exit.signal) {
                    (Some(code), _) => r.exit_code = i32::try_from(code).unwrap_or(i32::MAX),
                    (None, Some(signal)) => {
                        r.exit_code = -1;
                        r.reason = format!("killed by signal {signal}");
                    }
                    (None, None) => {}
                }
                r
            }
            Err(e) => self.failure_result(request, &e),
        };
        result.stdout = stdout;
        result.stderr = stderr;
        result.stdout_dropped = stdout_dropped;
        result.stderr_dropped = stderr_dropped;
        result.duration_ms = u64::try_from(began.elapsed().as_millis()).unwrap_or(u64::MAX);
        tracing::info!(
            request = %request.request_id,
            host = %request.host,
            status = ?ExecStatus::try_from(result.status).unwrap_or_default(),
            exit_code = result.exit_code,
            duration_ms = result.duration_ms,
            "executed"
        );
        self.record_finished(record, revision, result).await
    }

    /// Stores the result as the request's final answer, retrying while the
    /// bus is away (the command ran: its result must not be lost). If the
    /// record was settled by someone else meanwhile, theirs is the answer.
    async fn record_finished(
        &self,
        record: ExecRecord,
        mut revision: u64,
        result: ExecResult,
    ) -> ExecResult {
        let finished = ExecRecord {
            phase: ExecPhase::Finished,
            heartbeat_ms: now_ms(),
            result: result.encode_to_vec(),
            ..record
        };
        let mut backoff = Duration::from_millis(100);
        loop {
            match self
                .bus
                .write_exec_record(&self.agent, &finished, Some(revision))
                .await
            {
                Ok(Some(_)) => return result,
                Ok(None) => match self
                    .bus
                    .exec_record(&self.agent, &finished.request_id)
                    .await
                {
                    Ok(Some((stored, _))) if stored.phase == ExecPhase::Finished => {
                        tracing::warn!(request = %finished.request_id, "the request was settled elsewhere while it ran; that answer stands");
                        return ExecResult::decode(stored.result.as_slice()).unwrap_or(result);
                    }
                    Ok(Some((_, r))) => revision = r,
                    Ok(None) => {
                        // The record expired or was removed: write it anew.
                        match self
                            .bus
                            .write_exec_record(&self.agent, &finished, None)
                            .await
                        {
                            Ok(Some(_)) => return result,
                            _ => tokio::time::sleep(backoff).await,
                        }
                    }
                    Err(e) => {
                        tracing::warn!(request = %finished.request_id, "recording the result: {e}");
                        tokio::time::sleep(backoff).await;
                    }
                },
                Err(e) => {
                    tracing::warn!(request = %finished.request_id, "recording the result: {e}");
                    tokio::time::sleep(backoff).await;
                }
            }
            backoff = (backoff * 2).min(Duration::from_secs(5));
        }
    }

    /// A failure as a result, and its effect on the circuit.
    fn failure_result(&self, request: &ExecRequest, e: &SshError) -> ExecResult {
        let host = &request.host;
        if e.is_unreachable() {
            self.breaker_failure(host, &e.to_string());
        } else {
            self.breaker_success(host);
        }
        let (status, failure) = match e {
            SshError::HostKeyUnknown { .. } => (ExecStatus::Failed, ExecFailure::HostKeyUnknown),
            SshError::HostKeyChanged { .. } => (ExecStatus::Failed, ExecFailure::HostKeyChanged),
            SshError::Auth(_) => (ExecStatus::Failed, ExecFailure::Auth),
            SshError::Connect(_) => (ExecStatus::Failed, ExecFailure::Connect),
            SshError::Secret(_) => (ExecStatus::Failed, ExecFailure::Secret),
            SshError::Timeout(_) => (ExecStatus::OutcomeUnknown, ExecFailure::Timeout),
            SshError::Broken(_) => (ExecStatus::OutcomeUnknown, ExecFailure::Connect),
        };
        let mut r = self.reply(request, status, failure, e.to_string());
        if let SshError::HostKeyUnknown { fingerprint, .. }
        | SshError::HostKeyChanged { fingerprint, .. } = e
        {
            r.offered_host_key = fingerprint.clone();
            tracing::error!(%host, offered = %fingerprint, "host key verification failed: {e}");
        }
        r
    }

    /// A result for `request`, with its envelope.
    fn reply(
        &self,
        request: &ExecRequest,
        status: ExecStatus,
        failure: ExecFailure,
        reason: String,
    ) -> ExecResult {
        let env = request.envelope.clone().unwrap_or_default();
        ExecResult {
            envelope: Some(Envelope {
                agent: env.agent,
                work_item_id: env.work_item_id,
                actor: Some(proto::Actor {
                    kind: proto::ActorKind::Service as i32,
                    id: SERVICE.into(),
                }),
                causation_id: env.message_id,
                trace: env.trace,
                created_at: None,
                message_id: format!("result:{}", request.request_id),
            }),
            request_id: request.request_id.clone(),
            status: status as i32,
            failure: failure as i32,
            reason,
            ..Default::default()
        }
    }

    async fn publish(&self, result: ExecResult) -> Result<(), Later> {
        self.bus
            .publish(result)
            .await
            .map(|_| ())
            .map_err(|e| later(format!("publishing the result: {e}")))
    }

    /// Publishes a stored result again (same message id: JetStream drops
    /// it if the first publish is still within the duplicate window).
    async fn publish_stored(&self, record: &ExecRecord) -> Result<(), Later> {
        let result = ExecResult::decode(record.result.as_slice()).map_err(|e| {
            later(format!(
                "the stored result of {} does not decode: {e}",
                record.request_id
            ))
        })?;
        self.publish(result).await
    }

    async fn publish_progress(
        &self,
        request: &ExecRequest,
        seq: u32,
        stdout: Vec<u8>,
        stderr: Vec<u8>,
        elapsed: Duration,
    ) {
        let mut envelope = self
            .reply(
                request,
                ExecStatus::Unspecified,
                ExecFailure::Unspecified,
                String::new(),
            )
            .envelope;
        if let Some(env) = envelope.as_mut() {
            env.message_id = format!("progress:{}:{seq}", request.request_id);
        }
        let msg = ExecProgress {
            envelope,
            request_id: request.request_id.clone(),
            seq,
            stdout,
            stderr,
            elapsed_ms: u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX),
        };
        if let Err(e) = self.bus.publish(msg).await {
            tracing::warn!(request = %request.request_id, "publishing progress: {e}");
        }
    }

    fn lock_breakers(&self) -> std::sync::MutexGuard<'_, HashMap<String, Breaker>> {
        match self.breakers.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    fn breaker_settings(&self) -> BreakerSettings {
        BreakerSettings {
            failures: self.config.breaker_failures,
            window: self.config.breaker_window,
            cooldown: self.config.breaker_cooldown,
        }
    }

    fn admit(&self, host: &str) -> Admit {
        let settings = self.breaker_settings();
        let mut breakers = self.lock_breakers();
        let b = breakers
            .entry(host.to_string())
            .or_insert_with(|| Breaker::new(settings));
        let before = b.state().name();
        let admit = b.admit(Instant::now());
        if before != b.state().name() {
            self.announce(host, b);
        }
        admit
    }

    fn release_trial(&self, host: &str) {
        if let Some(b) = self.lock_breakers().get_mut(host) {
            b.release_trial();
        }
    }

    fn breaker_success(&self, host: &str) {
        if let Some(b) = self.lock_breakers().get_mut(host)
            && b.success()
        {
            self.announce(host, b);
        }
    }

    fn breaker_failure(&self, host: &str, error: &str) {
        let settings = self.breaker_settings();
        let mut breakers = self.lock_breakers();
        let b = breakers
            .entry(host.to_string())
            .or_insert_with(|| Breaker::new(settings));
        if b.failure(Instant::now(), error) {
            self.announce(host, b);
        }
    }

    /// A circuit changed state: logged once, and written to the circuit
    /// bucket for `nisse streams`.
    fn announce(&self, host: &str, b: &Breaker) {
        let open_until_ms = match b.state() {
            Circuit::Open(until) => {
                now_ms()
                    + u64::try_from(until.saturating_duration_since(Instant::now()).as_millis())
                        .unwrap_or(0)
            }
            _ => 0,
        };
        let state = CircuitState {
            agent: self.agent.to_string(),
            host: host.to_string(),
            state: b.state().name().to_string(),
            failures: b.failures(),
            open_until_ms,
            last_error: b.last_error().to_string(),
        };
        tracing::warn!(agent = %self.agent, %host, state = %state.state, failures = state.failures, "circuit {}", state.state);
        let bus = self.bus.clone();
        let agent = self.agent.clone();
        tokio::spawn(async move {
            if let Err(e) = bus.put_circuit(&agent, &state).await {
                tracing::warn!(host = %state.host, "recording the circuit state: {e}");
            }
        });
    }
}

/// Both output streams of a running command: redacted as they arrive,
/// capped for the result, and the new part kept for the next progress
/// message.
struct Output<'a> {
    stdout: Stream<'a>,
    stderr: Stream<'a>,
}

struct Stream<'a> {
    redact: redact::StreamRedactor<'a>,
    capped: Capped,
    fresh: Vec<u8>,
}

impl<'a> Stream<'a> {
    fn new(redactor: &'a Redactor, cap: usize) -> Self {
        Self {
            redact: redactor.stream(),
            capped: Capped::new(cap),
            fresh: Vec::new(),
        }
    }

    fn take(&mut self, data: Vec<u8>) {
        self.capped.push(&data);
        self.fresh.extend_from_slice(&data);
        if self.fresh.len() > PROGRESS_MAX {
            self.fresh.drain(..self.fresh.len() - PROGRESS_MAX);
        }
    }
}

impl<'a> Output<'a> {
    fn new(redactor: &'a Redactor, cap: usize) -> Self {
        Self {
            stdout: Stream::new(redactor, cap),
            stderr: Stream::new(redactor, cap),
        }
    }

    fn push(&mut self, chunk: Chunk) {
        match chunk {
            Chunk::Stdout(data) => {
                let clean = self.stdout.redact.push(&data);
                self.stdout.take(clean);
            }
            Chunk::Stderr(data) => {
                let clean = self.stderr.redact.push(&data);
                self.stderr.take(clean);
            }
        }
    }

    /// New output since the last call, if any.
    fn take_progress(&mut self) -> Option<(Vec<u8>, Vec<u8>)> {
        if self.stdout.fresh.is_empty() && self.stderr.fresh.is_empty() {
            return None;
        }
        Some((
            std::mem::take(&mut self.stdout.fresh),
            std::mem::take(&mut self.stderr.fresh),
        ))
    }

    fn finish(mut self) -> (Vec<u8>, u64, Vec<u8>, u64) {
        let rest = self.stdout.redact.finish();
        self.stdout.capped.push(&rest);
        let rest = self.stderr.redact.finish();
        self.stderr.capped.push(&rest);
        let (stdout, stdout_dropped) = self.stdout.capped.finish();
        let (stderr, stderr_dropped) = self.stderr.capped.finish();
        (stdout, stdout_dropped, stderr, stderr_dropped)
    }
}
