//! The services this binary can host, and running a set of them in one
//! process. Each service crate exposes its `SERVICE` (name and what it
//! does) and one entry point of the same shape, `run(Context<its
//! section>)`; this table is the only place that knows them all, builds
//! each one's section from the configuration, and decides, in one place
//! for all of them, when a service has nothing to do and idles.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use futures::future::BoxFuture;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use nisse_bus::service::{Context, Readiness, Service};
use nisse_bus::{AgentName, Bus};

use crate::config::Config;

/// What every service of a process shares.
#[derive(Clone)]
pub struct Shared {
    /// The process's configuration.
    pub config: Arc<Config>,
    /// The bus connection, shared by every service of the process.
    pub bus: Bus,
    /// The agents to serve.
    pub agents: Vec<AgentName>,
    /// Cancelled at shutdown: stop taking new messages, finish in-flight ones.
    pub shutdown: CancellationToken,
    /// Where each service says it is ready and what it listens on.
    pub readiness: Readiness,
}

/// How one service is started from what the process shares.
type StartFn = fn(&Shared) -> BoxFuture<'static, anyhow::Result<()>>;

/// One service this binary can host.
pub struct ServiceEntry {
    /// Its name and what it does, as its crate says.
    pub service: Service,
    start: StartFn,
}

/// Every service in this build, in start order.
pub const SERVICES: &[ServiceEntry] = &[
    ServiceEntry {
        service: nisse_core::reactor::SERVICE,
        start: |s| {
            launch(
                s,
                nisse_core::reactor::SERVICE,
                Ok(s.config.clone()),
                None,
                brain,
            )
        },
    },
    ServiceEntry {
        service: nisse_classifier::SERVICE,
        start: |s| {
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
                section,
                None,
                nisse_classifier::run,
            )
        },
    },
    ServiceEntry {
        service: nisse_model_gateway::SERVICE,
        start: |s| {
            let models = &s.config.models;
            let idle = (!models.enabled())
                .then(|| "no model role is configured (models.roles)".to_string());
            launch(
                s,
                nisse_model_gateway::SERVICE,
                Ok(models.clone()),
                idle,
                nisse_model_gateway::run,
            )
        },
    },
    ServiceEntry {
        service: nisse_executor::SERVICE,
        start: |s| {
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
                section,
                None,
                nisse_executor::run,
            )
        },
    },
    ServiceEntry {
        service: nisse_intake_matrix::SERVICE,
        start: |s| {
            let matrix = &s.config.matrix;
            let idle = (!matrix.enabled()).then(|| {
                "Matrix is not configured (matrix.homeserver): no rooms are served".to_string()
            });
            launch(
                s,
                nisse_intake_matrix::SERVICE,
                Ok(matrix.clone()),
                idle,
                nisse_intake_matrix::run,
            )
        },
    },
    ServiceEntry {
        service: nisse_intake_alerts::SERVICE,
        start: |s| {
            launch(
                s,
                nisse_intake_alerts::SERVICE,
                Ok(s.config.intake_alerts.clone()),
                None,
                nisse_intake_alerts::run,
            )
        },
    },
];

/// Starts `run` with its context, or idles when `idle` says why there is
/// nothing to do: ready at once, waiting for shutdown, so `nisse up` runs
/// the same whatever is configured.
fn launch<C, F>(
    shared: &Shared,
    service: Service,
    section: anyhow::Result<C>,
    idle: Option<String>,
    run: fn(Context<C>) -> F,
) -> BoxFuture<'static, anyhow::Result<()>>
where
    C: Send + Sync + 'static,
    F: Future<Output = anyhow::Result<()>> + Send + 'static,
{
    let ready = shared.readiness.reporter(service.name);
    let shutdown = shared.shutdown.clone();
    let ctx = section.map(|config| Context {
        config: Arc::new(config),
        bus: shared.bus.clone(),
        agents: shared.agents.clone(),
        shutdown: shutdown.clone(),
        ready: ready.clone(),
        data_dir: shared.config.data_dir.clone(),
    });
    Box::pin(async move {
        if let Some(why) = idle {
            tracing::info!(service = service.name, "{why}: the service is idle");
            ready.ready();
            shutdown.cancelled().await;
            return Ok(());
        }
        run(ctx?).await
    })
}

/// Runs the brain of every served agent that has one in this build, each
/// on its own task with its own state store.
async fn brain(ctx: Context<Arc<Config>>) -> anyhow::Result<()> {
    let config = &ctx.config;
    let mut tasks = tokio::task::JoinSet::new();
    for agent in &ctx.agents {
        let path = config.store_path(agent.as_str());
        match agent.as_str() {
            "ops" => {
                let brain = nisse_ops::OpsBrain::new(agent.as_str(), config.ops.clone())
                    .with_models(config.models.clone());
                tasks.spawn(nisse_core::reactor::run(
                    ctx.bus.clone(),
                    agent.clone(),
                    path,
                    brain,
                    ctx.shutdown.clone(),
                    tokio::sync::watch::Sender::new(0),
                ));
            }
            other => tracing::warn!(
                agent = other,
                "agent `{other}` has no brain in this build: its stream is kept, but nothing acts on it"
            ),
        }
    }
    ctx.ready.ready();
    while let Some(done) = tasks.join_next().await {
        done.context("a brain task panicked")?
            .context("a brain stopped")?;
    }
    Ok(())
}

/// Looks services up by name, naming the first unknown one and what exists.
pub fn find(names: &[String]) -> anyhow::Result<Vec<&'static ServiceEntry>> {
    names
        .iter()
        .map(|n| {
            SERVICES
                .iter()
                .find(|s| s.service.name == n)
                .ok_or_else(|| {
                    let known: Vec<&str> = SERVICES.iter().map(|s| s.service.name).collect();
                    anyhow::anyhow!(
                        "unknown service `{n}`; known services: {}",
                        known.join(", ")
                    )
                })
        })
        .collect()
}

/// A set of services running on their own tasks.
pub struct Running {
    tracker: TaskTracker,
    shutdown: CancellationToken,
    failed: tokio::sync::mpsc::UnboundedReceiver<(String, anyhow::Error)>,
    /// The names of the services, in start order.
    pub names: Vec<String>,
}

/// Starts `entries`, each on its own task.
pub fn start(entries: &[&'static ServiceEntry], shared: &Shared) -> Running {
    let tracker = TaskTracker::new();
    let (tx, failed) = tokio::sync::mpsc::unbounded_channel();
    for &entry in entries {
        let tx = tx.clone();
        let name = entry.service.name;
        let run = (entry.start)(shared);
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
        names: entries.iter().map(|e| e.service.name.to_string()).collect(),
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
