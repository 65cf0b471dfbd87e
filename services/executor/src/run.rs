//! The executor's run loop: each agent's `executor` consumer on the
//! service skeleton, every request through the bus's at-most-once engine
//! ([`nisse_bus::once`]: its record, the walls, "started", the command,
//! "finished" with the result, the result published), with what is the
//! executor's own here: its walls, running a command over SSH with
//! progress, and the outcome-unknown answer.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use nisse_bus::once::{Gate, Once, Record, Work};
use nisse_bus::proto::{ExecFailure, ExecProgress, ExecRequest, ExecResult, ExecStatus};
use nisse_bus::service::{Context, Service};
use nisse_bus::{AgentName, Bus, ConsumerSpec, Delivery, Handler, Intake, Unhandled};
use nisse_policy::Policy;

use crate::breaker::BreakerSettings;
use crate::circuits::{self, Circuits, NoBash};
use crate::config::Config as ExecutorConfig;
use crate::identity;
use crate::output::Output;
use crate::redact::Redactor;
use crate::ssh::{Pool, SshError, SshSettings};
use crate::walls::Prepared;

/// The service; its name is its durable consumer's.
pub const SERVICE: Service = Service {
    name: ConsumerSpec::EXECUTOR.name,
    about: "the executor: approved commands over SSH to bound hosts, each request at most once",
};

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
    let process = format!("{}-{}", SERVICE.name, uuid::Uuid::now_v7());
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
                data_dir: ctx.data_dir.clone(),
                pool,
                circuits,
                no_bash: NoBash::new(agent.clone(), ctx.bus.clone()),
                once: Once::new(
                    ctx.bus.clone(),
                    agent.clone(),
                    crate::record::LEDGER,
                    "the executor",
                    process.clone(),
                ),
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
    /// Where the brains' public keys are, to name the owner of a key
    /// that signed a request it should not have.
    pub(crate) data_dir: std::path::PathBuf,
    pub(crate) pool: Pool,
    pub(crate) circuits: Circuits,
    /// The hosts found without bash, as `nisse streams` shows them.
    no_bash: NoBash,
    /// Each request id at most once, in `nisse_exec`.
    once: Once,
}

impl Handler<ExecRequest> for AgentExecutor {
    async fn handle(
        &self,
        _agent: &AgentName,
        delivery: &Delivery<ExecRequest>,
    ) -> Result<(), Unhandled> {
        self.once.answer(self, delivery).await
    }
}

impl Work for AgentExecutor {
    type Request = ExecRequest;
    type Answer = ExecResult;
    type Prepared = Prepared;

    fn request_id(request: &ExecRequest) -> &str {
        &request.request_id
    }

    fn target(request: &ExecRequest) -> String {
        request.host.clone()
    }

    async fn walls(&self, request: &ExecRequest) -> Result<Gate<Prepared, ExecResult>, Unhandled> {
        let gate = self.check(request).await?;
        if let Gate::Answer(result) = &gate {
            tracing::info!(
                request = %request.request_id,
                host = %request.host,
                failure = ?ExecFailure::try_from(result.failure).unwrap_or_default(),
                "not run: {}", result.reason
            );
        }
        Ok(gate)
    }

    async fn perform(&self, request: &ExecRequest, prepared: Prepared) -> ExecResult {
        self.execute(request, prepared).await
    }

    fn interrupted(&self, request: &ExecRequest, record: &Record) -> ExecResult {
        self.reply(
            request,
            ExecStatus::OutcomeUnknown,
            ExecFailure::Interrupted,
            format!(
                "the executor ({}) stopped while this command ran on {}; whether it took effect is unknown, and it is not run again",
                record.process, record.target
            ),
        )
    }

    fn not_started(&self, request: &ExecRequest) {
        self.circuits.release_trial(&request.host);
    }
}

impl AgentExecutor {
    /// Runs a prepared command, publishing progress while it runs.
    async fn execute(&self, request: &ExecRequest, prepared: Prepared) -> ExecResult {
        let began = Instant::now();
        let (tx, mut rx) = mpsc::unbounded_channel();
        let run = self.pool.run(&request.host, &prepared.spec, &tx);
        tokio::pin!(run);
        let cap = usize::try_from(self.config.output_cap.as_u64()).unwrap_or(usize::MAX);
        let mut out = Output::new(&prepared.redactor, cap);
        let mut progress = tokio::time::interval(self.config.progress_interval);
        progress.tick().await;
        let mut seq = 0u32;
        let outcome = loop {
            tokio::select! {
                outcome = &mut run => break outcome,
                Some(chunk) = rx.recv() => out.push(chunk),
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
                self.no_bash.found(&request.host).await;
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
            Err(e) => self.failure_result(request, &e, &prepared.redactor).await,
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
        result
    }

    /// A failure as a result, and its effect on the circuit. The reason
    /// is redacted: a login shell's answer is the host's text.
    async fn failure_result(
        &self,
        request: &ExecRequest,
        e: &SshError,
        redactor: &Redactor,
    ) -> ExecResult {
        let host = &request.host;
        let reason =
            String::from_utf8_lossy(&redactor.redact(e.to_string().as_bytes())).into_owned();
        match e {
            _ if e.is_unreachable() => self.circuits.failure(host, &reason),
            // Refused before connecting: the host said nothing.
            SshError::Unsendable(_) => self.circuits.release_trial(host),
            _ => self.circuits.success(host),
        }
        if let SshError::NoBash { .. } = e {
            // After the breaker's word: the host was reached, and has no
            // bash. (Had this been the breaker's half-open trial, its
            // `closed`, written by a task of its own, may land after this
            // and hide it until the next command writes it again.)
            self.no_bash.missing(host, &reason).await;
        }
        let (status, failure) = match e {
            SshError::HostKeyUnknown { .. } => (ExecStatus::Failed, ExecFailure::HostKeyUnknown),
            SshError::HostKeyChanged { .. } => (ExecStatus::Failed, ExecFailure::HostKeyChanged),
            SshError::Auth(_) => (ExecStatus::Failed, ExecFailure::Auth),
            SshError::Connect(_) => (ExecStatus::Failed, ExecFailure::Connect),
            SshError::Secret(_) => (ExecStatus::Failed, ExecFailure::Secret),
            SshError::Timeout(_) => (ExecStatus::OutcomeUnknown, ExecFailure::Timeout),
            SshError::Broken(_) => (ExecStatus::OutcomeUnknown, ExecFailure::Connect),
            SshError::Unsendable(_) => (ExecStatus::Refused, ExecFailure::BadRequest),
            SshError::NoBash { .. } => (ExecStatus::Failed, ExecFailure::NoBash),
        };
        let mut r = self.reply(request, status, failure, reason);
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
