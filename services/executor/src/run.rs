//! The executor's run loop: each agent's `executor` consumer on the
//! service skeleton, and for every request the at-most-once flow: the
//! record first (a finished request is answered from it, a started one
//! whose executor is gone is reported as outcome-unknown), then the walls,
//! then "started" recorded, the command run, "finished" recorded with the
//! result, and the result published.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use prost::Message as _;
use tokio::sync::{mpsc, watch};

use nisse_bus::proto::{ExecFailure, ExecProgress, ExecRequest, ExecResult, ExecStatus};
use nisse_bus::service::{Context, Service};
use nisse_bus::{
    AgentName, Backoff, Bus, ConsumerSpec, Delivery, Handler, Intake, Persist, Unhandled,
};
use nisse_policy::Policy;

use crate::breaker::BreakerSettings;
use crate::circuits::{self, Circuits};
use crate::config::Config as ExecutorConfig;
use crate::identity;
use crate::output::Output;
use crate::record::{self, ExecPhase, ExecRecord};
use crate::ssh::{Pool, SshError, SshSettings};
use crate::walls::{Prepared, Walls};

/// The service; its name is its durable consumer's.
pub const SERVICE: Service = Service {
    name: ConsumerSpec::EXECUTOR.name,
    about: "the executor: approved commands over SSH to bound hosts, each request at most once",
};

/// Waits between tries to record a result while the bus is away: the
/// command ran, so its result must not be lost.
const RECORD_BACKOFF: Backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));

/// What the executor runs with.
#[derive(Debug, Clone)]
pub struct Config {
    /// `[executor]`.
    pub executor: ExecutorConfig,
    /// The policy the kill switches are consulted by.
    pub policy: Arc<Policy>,
}

/// Runs the executor for every agent of `ctx` until shutdown, then lets
/// running commands finish. The data directory locates the agents'
/// default key and known-hosts files.
pub async fn run(ctx: Context<Config>) -> anyhow::Result<()> {
    let config = Arc::new(ctx.config.executor.clone());
    let instance = format!("{}-{}", SERVICE.name, uuid::Uuid::now_v7());
    let mut handlers = Vec::new();
    for agent in &ctx.agents {
        let setup = config.agent(agent.as_str(), &ctx.data_dir);
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
        let circuits = Circuits::new(
            agent.clone(),
            ctx.bus.clone(),
            BreakerSettings {
                failures: config.breaker_failures,
                window: config.breaker_window,
                cooldown: config.breaker_cooldown,
            },
            circuits::STORE,
        );
        handlers.push((
            agent.clone(),
            Arc::new(AgentExecutor {
                agent: agent.clone(),
                bus: ctx.bus.clone(),
                policy: ctx.config.policy.clone(),
                config: config.clone(),
                instance: instance.clone(),
                data_dir: ctx.data_dir.clone(),
                pool,
                circuits,
                running: Mutex::new(HashMap::new()),
            }),
        ));
    }
    // Idle connections are closed on their own schedule, beside the
    // requests.
    let reaper = {
        let executors: Vec<Arc<AgentExecutor>> = handlers.iter().map(|(_, e)| e.clone()).collect();
        let shutdown = ctx.shutdown.clone();
        let every = (config.idle_timeout / 4).max(Duration::from_secs(1));
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            loop {
                tokio::select! {
                    () = shutdown.cancelled() => break,
                    _ = tick.tick() => {
                        for e in &executors {
                            e.pool.reap_idle().await;
                        }
                    }
                }
            }
        })
    };
    let intake = Intake {
        consumer: ConsumerSpec::EXECUTOR,
        in_flight: config.max_in_flight,
    };
    let served = nisse_bus::serve(&ctx, intake, handlers.clone()).await;
    // Running commands finished (or the process is stopped under them, and
    // their records say "started": outcome unknown).
    let _ = reaper.await;
    for (_, e) in &handlers {
        e.pool.close_all().await;
    }
    served?;
    Ok(())
}

/// One agent's executor.
pub(crate) struct AgentExecutor {
    pub(crate) agent: AgentName,
    pub(crate) bus: Bus,
    pub(crate) policy: Arc<Policy>,
    pub(crate) config: Arc<ExecutorConfig>,
    instance: String,
    /// Where the brains' public keys are, to name the owner of a key
    /// that signed a request it should not have.
    pub(crate) data_dir: std::path::PathBuf,
    pub(crate) pool: Pool,
    pub(crate) circuits: Circuits,
    /// Request ids running in this process, each with a signal for when it
    /// is done (duplicates wait for it instead of being redelivered).
    running: Mutex<HashMap<String, watch::Receiver<bool>>>,
}

/// Milliseconds since the Unix epoch.
pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

impl Handler<ExecRequest> for AgentExecutor {
    async fn handle(
        &self,
        _agent: &AgentName,
        delivery: &Delivery<ExecRequest>,
    ) -> Result<(), Unhandled> {
        self.answer(delivery).await
    }
}

impl AgentExecutor {
    /// Answers one delivery: `Ok` once its result is published.
    async fn answer(&self, delivery: &Delivery<ExecRequest>) -> Result<(), Unhandled> {
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
            match record::read(&self.bus, &self.agent, rid).await? {
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
                                return Err(Unhandled::retry_after(
                                    format!("{rid} is started here but not running"),
                                    delivery.ack_wait(),
                                ));
                            }
                        }
                        continue;
                    }
                    if fresh {
                        return Err(Unhandled::retry_after(
                            format!("{rid} is running on {}", record.instance),
                            delivery.ack_wait(),
                        ));
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
                    if record::write(&self.bus, &self.agent, &finished, Some(revision))
                        .await?
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
    async fn claimed(&self, delivery: &Delivery<ExecRequest>) -> Result<bool, Unhandled> {
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

        // 3. Started, durably, before anything runs.
        let started = ExecRecord {
            request_id: rid.to_string(),
            phase: ExecPhase::Started,
            instance: self.instance.clone(),
            host: request.host.clone(),
            heartbeat_ms: now_ms(),
            result: Vec::new(),
        };
        let revision = match record::write(&self.bus, &self.agent, &started, None).await {
            Ok(Some(r)) => r,
            other => {
                self.circuits.release_trial(&request.host);
                return other.map(|_| false).map_err(Unhandled::from);
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
    ) -> Result<bool, Unhandled> {
        let record = ExecRecord {
            request_id: request.request_id.clone(),
            phase: ExecPhase::Finished,
            instance: self.instance.clone(),
            host: request.host.clone(),
            heartbeat_ms: now_ms(),
            result: result.encode_to_vec(),
        };
        match record::write(&self.bus, &self.agent, &record, None).await? {
            Some(_) => self.publish(result).await.map(|()| true),
            None => Ok(false),
        }
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
                    match record::write(&self.bus, &self.agent, &record, Some(revision)).await {
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
                self.circuits.success(&request.host);
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
        let mut trouble = Persist::new("record a command's result", RECORD_BACKOFF);
        loop {
            let why = match record::write(&self.bus, &self.agent, &finished, Some(revision)).await {
                Ok(Some(_)) => return result,
                Ok(None) => {
                    match record::read(&self.bus, &self.agent, &finished.request_id).await {
                        Ok(Some((stored, _))) if stored.phase == ExecPhase::Finished => {
                            tracing::warn!(request = %finished.request_id, "the request was settled elsewhere while it ran; that answer stands");
                            return ExecResult::decode(stored.result.as_slice()).unwrap_or(result);
                        }
                        Ok(Some((_, r))) => {
                            revision = r;
                            continue;
                        }
                        // The record expired or was removed: write it anew.
                        Ok(None) => {
                            match record::write(&self.bus, &self.agent, &finished, None).await {
                                Ok(Some(_)) => return result,
                                Ok(None) => "another executor wrote it first".to_string(),
                                Err(e) => e.to_string(),
                            }
                        }
                        Err(e) => e.to_string(),
                    }
                }
                Err(e) => e.to_string(),
            };
            trouble.failed(&why).await;
        }
    }

    /// A failure as a result, and its effect on the circuit.
    fn failure_result(&self, request: &ExecRequest, e: &SshError) -> ExecResult {
        let host = &request.host;
        if e.is_unreachable() {
            self.circuits.failure(host, &e.to_string());
        } else {
            self.circuits.success(host);
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
    pub(crate) fn reply(
        &self,
        request: &ExecRequest,
        status: ExecStatus,
        failure: ExecFailure,
        reason: String,
    ) -> ExecResult {
        ExecResult {
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

    async fn publish(&self, result: ExecResult) -> Result<(), Unhandled> {
        self.bus
            .publish(result)
            .await
            .map(|_| ())
            .map_err(|e| Unhandled::retry(format!("publishing the result: {e}")))
    }

    /// Publishes a stored result again (same message id: JetStream drops
    /// it if the first publish is still within the duplicate window).
    async fn publish_stored(&self, record: &ExecRecord) -> Result<(), Unhandled> {
        let result = ExecResult::decode(record.result.as_slice()).map_err(|e| {
            Unhandled::retry(format!(
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
}
