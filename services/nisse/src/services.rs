//! The services this binary can host, and running a set of them in one
//! process. Each service crate exposes its `SERVICE` (name and what it
//! does) and one entry point of the same shape, `run(Context<its
//! section>)`; this table is the only place that knows them all, builds
//! each one's section from the configuration, and decides, in one place
//! for all of them, when a service has nothing to do and idles.
//!
//! Each service runs once per agent it serves, on a connection of its own
//! as its own NATS identity (`executor-ops`, `brain-dev`…), whose
//! permissions allow only what that service does for that agent: even in
//! one process, one service cannot publish what another may.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use futures::future::BoxFuture;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use nisse_bus::auth::{Credentials, Identity};
use nisse_bus::service::{Context, Readiness, Ready, Service};
use nisse_bus::signing::{self, SigningKey};
use nisse_bus::{AgentName, Bus, Role};

use crate::config::Config;

/// What every service of a process shares.
#[derive(Clone)]
pub struct Shared {
    /// The process's configuration; `bus.url` names the server.
    pub config: Arc<Config>,
    /// The agents to serve.
    pub agents: Vec<AgentName>,
    /// Cancelled at shutdown: stop taking new messages, finish in-flight ones.
    pub shutdown: CancellationToken,
    /// Where each service says it is ready and what it listens on.
    pub readiness: Readiness,
}

/// How one service is started from what the process shares.
type StartFn = fn(&Shared, Role) -> BoxFuture<'static, anyhow::Result<()>>;

/// One service this binary can host.
pub struct ServiceEntry {
    /// Its name and what it does, as its crate says.
    pub service: Service,
    /// Its part on the bus: the identity it connects as, per agent.
    pub role: Role,
    start: StartFn,
}

/// Every service in this build, in start order.
pub const SERVICES: &[ServiceEntry] = &[
    ServiceEntry {
        service: nisse_core::reactor::SERVICE,
        role: Role::Brain,
        start: |s, role| {
            launch(
                s,
                nisse_core::reactor::SERVICE,
                role,
                Ok(s.config.clone()),
                None,
                brain,
            )
        },
    },
    ServiceEntry {
        service: nisse_classifier::SERVICE,
        role: Role::Classifier,
        start: |s, role| {
            let section = s
                .config
                .load_policy()
                .context("loading the policy for the classifier")
                .map(|policy| nisse_classifier::Config {
                    policy: Arc::new(policy),
                    models: s.config.models.clone(),
                });
            launch(
                s,
                nisse_classifier::SERVICE,
                role,
                section,
                None,
                nisse_classifier::run,
            )
        },
    },
    ServiceEntry {
        service: nisse_model_gateway::SERVICE,
        role: Role::ModelGateway,
        start: |s, role| {
            let models = &s.config.models;
            let idle = (!configured(&s.config, role))
                .then(|| "no model role is configured (models.roles)".to_string());
            launch(
                s,
                nisse_model_gateway::SERVICE,
                role,
                Ok(models.clone()),
                idle,
                nisse_model_gateway::run,
            )
        },
    },
    ServiceEntry {
        service: nisse_executor::SERVICE,
        role: Role::Executor,
        start: |s, role| {
            let section = s
                .config
                .load_policy()
                .context("loading the policy for the executor")
                .map(|policy| nisse_executor::Config {
                    executor: s.config.executor.clone(),
                    policy: Arc::new(policy),
                });
            launch(
                s,
                nisse_executor::SERVICE,
                role,
                section,
                None,
                nisse_executor::run,
            )
        },
    },
    ServiceEntry {
        service: nisse_intake_matrix::SERVICE,
        role: Role::IntakeMatrix,
        start: |s, role| {
            let matrix = &s.config.matrix;
            let idle = (!configured(&s.config, role)).then(|| {
                "Matrix is not configured (matrix.homeserver): no rooms are served".to_string()
            });
            launch(
                s,
                nisse_intake_matrix::SERVICE,
                role,
                Ok(matrix.clone()),
                idle,
                nisse_intake_matrix::run,
            )
        },
    },
    ServiceEntry {
        service: nisse_scheduler::scheduler::SERVICE,
        role: Role::Scheduler,
        start: |s, role| {
            let section = scheduler_section(&s.config);
            launch(
                s,
                nisse_scheduler::scheduler::SERVICE,
                role,
                section,
                None,
                nisse_scheduler::scheduler::run,
            )
        },
    },
    ServiceEntry {
        service: nisse_scheduler::prober::SERVICE,
        role: Role::Prober,
        start: |s, role| {
            launch(
                s,
                nisse_scheduler::prober::SERVICE,
                role,
                Ok(s.config.prober.clone()),
                None,
                nisse_scheduler::prober::run,
            )
        },
    },
    ServiceEntry {
        service: nisse_vault_writer::writer::SERVICE,
        role: Role::VaultWriter,
        start: |s, role| {
            launch(
                s,
                nisse_vault_writer::writer::SERVICE,
                role,
                Ok(s.config.vault.clone()),
                None,
                nisse_vault_writer::writer::run,
            )
        },
    },
    ServiceEntry {
        service: nisse_vault_writer::reader::SERVICE,
        role: Role::VaultReader,
        start: |s, role| {
            launch(
                s,
                nisse_vault_writer::reader::SERVICE,
                role,
                Ok(s.config.vault.clone()),
                None,
                nisse_vault_writer::reader::run,
            )
        },
    },
    ServiceEntry {
        service: nisse_intake_alerts::SERVICE,
        role: Role::IntakeAlerts,
        start: |s, role| {
            launch(
                s,
                nisse_intake_alerts::SERVICE,
                role,
                Ok(s.config.intake_alerts.clone()),
                None,
                nisse_intake_alerts::run,
            )
        },
    },
    ServiceEntry {
        service: nisse_intake_gitea::SERVICE,
        role: Role::IntakeGitea,
        start: |s, role| {
            let gitea = &s.config.gitea;
            let idle = (!configured(&s.config, role)).then(|| {
                "Gitea is not configured (gitea.url): no webhooks or calls are served".to_string()
            });
            launch(
                s,
                nisse_intake_gitea::SERVICE,
                role,
                Ok(gitea.clone()),
                idle,
                nisse_intake_gitea::run,
            )
        },
    },
    ServiceEntry {
        service: nisse_intake_vikunja::SERVICE,
        role: Role::IntakeVikunja,
        start: |s, role| {
            let vikunja = &s.config.vikunja;
            let idle = (!configured(&s.config, role)).then(|| {
                "Vikunja is not configured (vikunja.url): no webhooks or calls are served"
                    .to_string()
            });
            launch(
                s,
                nisse_intake_vikunja::SERVICE,
                role,
                Ok(vikunja.clone()),
                idle,
                nisse_intake_vikunja::run,
            )
        },
    },
    ServiceEntry {
        service: nisse_mcp::SERVICE,
        role: Role::Mcp,
        start: |s, role| {
            let idle = serves(s, role).is_empty().then(|| {
                "no MCP instance is configured for a served agent (mcp.instance): no calls are made"
                    .to_string()
            });
            // The policy must classify each instance as `[mcp]`
            // configures it, as the brain requires: the service consults
            // it for the kill switches.
            let section = s
                .config
                .load_policy()
                .context("loading the policy for the mcp service")
                .and_then(|policy| {
                    s.config.check_mcp_policy(&policy)?;
                    Ok(nisse_mcp::ServiceConfig {
                        mcp: s.config.mcp.clone(),
                        policy: Arc::new(policy),
                    })
                });
            launch(s, nisse_mcp::SERVICE, role, section, idle, nisse_mcp::run)
        },
    },
];

/// A service of the whole installation rather than of one agent: one
/// process runs it once, on an identity of its own that spans the agents
/// (the control plane).
pub struct Surface {
    /// Its name, as `nisse serve` takes it.
    pub name: &'static str,
    start: fn(&Shared) -> BoxFuture<'static, anyhow::Result<()>>,
}

/// Every such service in this build.
pub const SURFACES: &[Surface] = &[Surface {
    name: "control",
    start: |s| {
        Box::pin(crate::control::run(
            s.config.clone(),
            s.shutdown.clone(),
            s.readiness.reporter("control"),
        ))
    },
}];

/// What `nisse serve` and `nisse up` run: services per agent, and
/// services of the whole installation.
#[derive(Default)]
pub struct Chosen {
    /// The per-agent services.
    pub services: Vec<&'static ServiceEntry>,
    /// The installation's.
    pub surfaces: Vec<&'static Surface>,
}

impl Chosen {
    /// Everything this build has.
    pub fn all() -> Self {
        Self {
            services: SERVICES.iter().collect(),
            surfaces: SURFACES.iter().collect(),
        }
    }
}

/// The scheduler's section: the clock, and each agent's duties with
/// their intervals (today the ops agent's).
fn scheduler_section(config: &Config) -> anyhow::Result<nisse_scheduler::scheduler::Config> {
    let mut duties = std::collections::BTreeMap::new();
    for agent in config.agent_names()? {
        let schedules = match agent.as_str() {
            "ops" => config
                .load_duties()?
                .into_iter()
                .map(|d| nisse_scheduler::scheduler::Schedule {
                    name: d.name,
                    interval: d.interval,
                })
                .collect(),
            _ => Vec::new(),
        };
        duties.insert(agent, schedules);
    }
    Ok(nisse_scheduler::scheduler::Config {
        tick: config.scheduler.tick,
        duties,
    })
}

/// Starts `run` once per agent the service serves, each with its own
/// context and its own connection as its own identity, or idles when
/// `idle` says why there is nothing to do: ready at once, waiting for
/// shutdown, so `nisse up` runs the same whatever is configured.
fn launch<C, F>(
    shared: &Shared,
    service: Service,
    role: Role,
    section: anyhow::Result<C>,
    idle: Option<String>,
    run: fn(Context<C>) -> F,
) -> BoxFuture<'static, anyhow::Result<()>>
where
    C: Send + Sync + 'static,
    F: Future<Output = anyhow::Result<()>> + Send + 'static,
{
    let agents = serves(shared, role);
    let readies: Vec<_> = agents
        .iter()
        .map(|a| shared.readiness.reporter(ready_key(service, a)))
        .collect();
    let shutdown = shared.shutdown.clone();
    let config = shared.config.clone();
    Box::pin(async move {
        if let Some(why) = idle {
            tracing::info!(service = service.name, "{why}: the service is idle");
            readies.iter().for_each(Ready::ready);
            shutdown.cancelled().await;
            return Ok(());
        }
        let section = Arc::new(section?);
        let credentials = Credentials::in_data_dir(&config.data_dir);
        let mut runs = tokio::task::JoinSet::new();
        for (agent, ready) in agents.into_iter().zip(readies) {
            let identity = Identity::service(role, &agent);
            let bus = Bus::connect_as(&config.bus, vec![agent.clone()], &identity, &credentials)
                .await
                .with_context(|| format!("connecting {} for agent {agent}", service.name))?;
            bus.require_topology(role)
                .await
                .with_context(|| format!("starting {} for agent {agent}", service.name))?;
            let ran = run(Context {
                config: section.clone(),
                bus: bus.clone(),
                agents: vec![agent],
                shutdown: shutdown.clone(),
                ready,
                data_dir: config.data_dir.clone(),
            });
            runs.spawn(async move {
                let outcome = ran.await;
                // The last acks and publishes leave the client before the
                // process may exit (bounded: the server may be gone).
                let _ = tokio::time::timeout(Duration::from_secs(2), bus.flush()).await;
                outcome
            });
        }
        while let Some(done) = runs.join_next().await {
            done.with_context(|| format!("{} panicked", service.name))??;
        }
        Ok(())
    })
}

/// The agents a role serves in this process: every served agent, except
/// for the webhook receivers, which each take their events for their one
/// configured agent, and the mcp service, which serves the agents that
/// have MCP instances.
fn serves(shared: &Shared, role: Role) -> Vec<AgentName> {
    serves_agents(&shared.config, &shared.agents, role)
}

/// The agents of `agents` that `role` serves under `config` (see
/// [`serves`]): what a deployment runs one unit of the role for each of.
pub fn serves_agents(config: &Config, agents: &[AgentName], role: Role) -> Vec<AgentName> {
    let only = |name: &str| {
        agents
            .iter()
            .filter(|a| a.as_str() == name)
            .cloned()
            .collect()
    };
    match role {
        Role::IntakeAlerts => only(&config.intake_alerts.agent),
        Role::IntakeGitea => only(&config.gitea.agent),
        Role::IntakeVikunja => only(&config.vikunja.agent),
        Role::Mcp => agents
            .iter()
            .filter(|a| config.mcp.serves(a.as_str()))
            .cloned()
            .collect(),
        _ => agents.to_vec(),
    }
}

/// Whether `config` gives `role` anything to do: a service whose section
/// is not configured runs idle (and a deployment leaves it out).
pub fn configured(config: &Config, role: Role) -> bool {
    match role {
        Role::ModelGateway => config.models.enabled(),
        Role::IntakeMatrix => config.matrix.enabled(),
        Role::IntakeGitea => config.gitea.enabled(),
        Role::IntakeVikunja => config.vikunja.enabled(),
        _ => true,
    }
}

/// The readiness key of one service serving one agent.
fn ready_key(service: Service, agent: &AgentName) -> String {
    format!("{}@{agent}", service.name)
}

/// The brain of the served agent, on its own state store, signing with
/// its own key (made on first start; the executor reads its public half).
async fn brain(ctx: Context<Arc<Config>>) -> anyhow::Result<()> {
    let config = &ctx.config;
    let [agent] = ctx.agents.as_slice() else {
        anyhow::bail!("a brain serves one agent");
    };
    match agent.as_str() {
        "ops" => run_brain(&ctx, agent, || config.ops_brain(agent.as_str())).await,
        "dev" => run_brain(&ctx, agent, || Ok(config.dev_brain(agent.as_str()))).await,
        other => {
            tracing::warn!(
                agent = other,
                "agent `{other}` has no brain in this build: its stream is kept, but nothing acts on it"
            );
            ctx.ready.ready();
            ctx.shutdown.cancelled().await;
            Ok(())
        }
    }
}

/// Runs the brain `make` builds as `agent`'s, with the brain's own
/// signing key (made on first start), until shutdown. A brain stopped by
/// the bus (a publish or read not answered while a cluster elects a new
/// leader, its lease gone) is started again after a pause, and takes its
/// place from its store and stream as after a crash; one stopped by its
/// store, or by a stream that went back in time, stops the service.
async fn run_brain<B: nisse_core::Brain>(
    ctx: &Context<Arc<Config>>,
    agent: &AgentName,
    make: impl Fn() -> anyhow::Result<B>,
) -> anyhow::Result<()> {
    let (key_file, public_file) = signing::key_files(&ctx.data_dir, agent.as_str());
    let mut pause = BRAIN_RESTART.delays();
    let mut ready = Some(&ctx.ready);
    loop {
        let (key, made) = SigningKey::load_or_create(&key_file, &public_file)
            .with_context(|| format!("the {agent} brain's signing key"))?;
        if made {
            tracing::info!(%agent, key = %key_file.display(), public = %key.public(), "made the brain's signing key");
        }
        if let Some(r) = ready.take() {
            r.ready();
        }
        let began = tokio::time::Instant::now();
        let outcome = nisse_core::reactor::run(
            ctx.bus.clone(),
            agent.clone(),
            ctx.config.store_path(agent.as_str()),
            make()?,
            key,
            ctx.shutdown.clone(),
            tokio::sync::watch::Sender::new(0),
        )
        .await;
        match outcome {
            Ok(()) => return Ok(()),
            Err(nisse_core::reactor::ReactorError::Bus(e)) if !ctx.shutdown.is_cancelled() => {
                if began.elapsed() > BRAIN_STEADY {
                    pause = BRAIN_RESTART.delays();
                }
                let wait = pause.next().unwrap_or(BRAIN_RESTART.max());
                tracing::warn!(%agent, ?wait, "the brain stopped on the bus ({e}); starting it again");
                tokio::select! {
                    () = ctx.shutdown.cancelled() => return Ok(()),
                    () = tokio::time::sleep(wait) => {}
                }
            }
            Err(e) => return Err(anyhow::Error::from(e).context("the brain stopped")),
        }
    }
}

/// Pauses before a brain stopped by the bus is started again.
const BRAIN_RESTART: nisse_bus::Backoff =
    nisse_bus::Backoff::new(Duration::from_millis(500), Duration::from_secs(30));

/// A brain that ran this long before it stopped starts again after the
/// shortest pause.
const BRAIN_STEADY: Duration = Duration::from_secs(60);

/// Looks services up by name, naming the first unknown one and what exists.
pub fn find(names: &[String]) -> anyhow::Result<Chosen> {
    let mut chosen = Chosen::default();
    for n in names {
        if let Some(entry) = SERVICES.iter().find(|s| s.service.name == n) {
            chosen.services.push(entry);
        } else if let Some(surface) = SURFACES.iter().find(|s| s.name == n) {
            chosen.surfaces.push(surface);
        } else {
            let known: Vec<&str> = SERVICES
                .iter()
                .map(|s| s.service.name)
                .chain(SURFACES.iter().map(|s| s.name))
                .collect();
            anyhow::bail!(
                "unknown service `{n}`; known services: {}",
                known.join(", ")
            );
        }
    }
    Ok(chosen)
}

/// A set of services running on their own tasks.
pub struct Running {
    tracker: TaskTracker,
    shutdown: CancellationToken,
    failed: tokio::sync::mpsc::UnboundedReceiver<(String, anyhow::Error)>,
    /// The names of the services, in start order.
    pub names: Vec<String>,
    /// What readiness waits for: each service for each agent it serves.
    pub ready_keys: Vec<String>,
}

/// Starts what is `chosen`, each on its own task.
pub fn start(chosen: &Chosen, shared: &Shared) -> Running {
    let tracker = TaskTracker::new();
    let (tx, failed) = tokio::sync::mpsc::unbounded_channel();
    let runs = chosen
        .services
        .iter()
        .map(|e| (e.service.name, (e.start)(shared, e.role)))
        .chain(chosen.surfaces.iter().map(|s| (s.name, (s.start)(shared))));
    for (name, run) in runs {
        let tx = tx.clone();
        tracker.spawn(async move {
            tracing::info!(service = name, "service starting");
            match run.await {
                Ok(()) => tracing::info!(service = name, "service stopped"),
                Err(e) => {
                    tracing::error!(service = name, "service failed: {e:#}");
                    let _ = tx.send((name.to_string(), e));
                }
            }
        });
    }
    tracker.close();
    Running {
        tracker,
        shutdown: shared.shutdown.clone(),
        failed,
        names: chosen
            .services
            .iter()
            .map(|e| e.service.name.to_string())
            .chain(chosen.surfaces.iter().map(|s| s.name.to_string()))
            .collect(),
        ready_keys: chosen
            .services
            .iter()
            .flat_map(|e| {
                serves(shared, e.role)
                    .into_iter()
                    .map(|a| ready_key(e.service, &a))
            })
            .chain(chosen.surfaces.iter().map(|s| s.name.to_string()))
            .collect(),
    }
}

impl Running {
    /// Resolves when a service fails; never, if none does.
    pub async fn failure(&mut self) -> (String, anyhow::Error) {
        match self.failed.recv().await {
            Some(f) => f,
            None => std::future::pending().await,
        }
    }

    /// Cancels the services and waits up to `grace` for them to finish
    /// their in-flight messages. Anything still running after that is
    /// abandoned un-acked, so JetStream redelivers it: never half-applied.
    pub async fn stop(self, grace: Duration) -> bool {
        self.shutdown.cancel();
        let done = tokio::time::timeout(grace, self.tracker.wait())
            .await
            .is_ok();
        if !done {
            tracing::warn!(
                "services did not finish within {grace:?}; their unacknowledged messages will be redelivered"
            );
        }
        done
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A service connects as the identity of its role, and the role's
    /// name is the service's (and its consumer's): the permissions derived
    /// for a role are the ones its service runs with.
    #[test]
    fn every_service_is_its_roles_identity() {
        for entry in SERVICES {
            assert_eq!(entry.service.name, entry.role.name());
        }
        let mut roles: Vec<Role> = SERVICES.iter().map(|e| e.role).collect();
        roles.sort();
        assert_eq!(roles, Role::ALL, "every role has its service, once");
    }
}
