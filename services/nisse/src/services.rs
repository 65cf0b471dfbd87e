//! The services this binary can host, and running a set of them in one
//! process. Each service crate exposes one entry point of the same shape
//! (configuration, bus handle, shutdown token); this table is the only place
//! that knows them all. Services arrive with the issues that build them, so
//! the table grows as they land.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;

use futures::future::BoxFuture;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use nisse_bus::{AgentName, Bus};

use crate::config::Config;

/// What a service is started with.
#[derive(Clone)]
pub struct ServiceContext {
    /// The process's configuration.
    pub config: Arc<Config>,
    /// The bus connection, shared by every service of the process.
    pub bus: Bus,
    /// The agents to serve.
    pub agents: Vec<AgentName>,
    /// Cancelled at shutdown: stop taking new messages, finish in-flight ones.
    pub shutdown: CancellationToken,
    /// Where each service says it is ready and what it listens on.
    pub ready: Readiness,
}

/// What the services of a process have reported so far.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReadyState {
    /// Services that are ready.
    pub ready: BTreeSet<String>,
    /// Listening addresses by name (`alertmanager-webhook` → URL).
    pub listeners: BTreeMap<String, String>,
}

/// Services report readiness here; `nisse up` writes `endpoints.json` only
/// once every service has, so the file never names an address that does
/// not answer yet.
#[derive(Debug, Clone)]
pub struct Readiness(Arc<tokio::sync::watch::Sender<ReadyState>>);

impl Default for Readiness {
    fn default() -> Self {
        Self(Arc::new(tokio::sync::watch::Sender::new(
            ReadyState::default(),
        )))
    }
}

impl Readiness {
    /// Records that a service listens on `url` under `name`.
    pub fn listening(&self, name: &str, url: String) {
        self.0.send_modify(|s| {
            s.listeners.insert(name.to_string(), url);
        });
    }

    /// Records that `service` is ready.
    pub fn ready(&self, service: &str) {
        self.0.send_modify(|s| {
            s.ready.insert(service.to_string());
        });
    }

    /// Waits until every one of `services` is ready; returns the listeners.
    pub async fn wait_for(&self, services: &[String]) -> BTreeMap<String, String> {
        let mut rx = self.0.subscribe();
        match rx
            .wait_for(|s| services.iter().all(|n| s.ready.contains(n)))
            .await
        {
            Ok(state) => state.listeners.clone(),
            // The sender lives in `self`: it cannot be gone.
            Err(_) => BTreeMap::new(),
        }
    }
}

/// A service's entry point.
pub type RunFn = fn(ServiceContext) -> BoxFuture<'static, anyhow::Result<()>>;

/// One service this binary can host.
pub struct ServiceEntry {
    /// Its name on the command line (`nisse serve <name>`).
    pub name: &'static str,
    /// One line on what it does.
    pub about: &'static str,
    /// Its entry point.
    pub run: RunFn,
}

/// Every service in this build, in start order.
pub const SERVICES: &[ServiceEntry] = &[
    ServiceEntry {
        name: "brain",
        about: "the agents' brains: each agent's stream becomes its work items and log",
        run: |ctx| Box::pin(brain(ctx)),
    },
    ServiceEntry {
        name: "classifier",
        about: "the action classifier: a verdict for every proposed action, fast path first, failing closed",
        run: |ctx| Box::pin(classifier(ctx)),
    },
    ServiceEntry {
        name: "model-gateway",
        about: "the model gateway: model requests to the pinned model over an OpenAI-compatible endpoint, with retries, fallbacks, budgets and capture",
        run: |ctx| Box::pin(model_gateway(ctx)),
    },
    ServiceEntry {
        name: "executor",
        about: "the executor: approved commands over SSH to bound hosts, each request at most once",
        run: |ctx| Box::pin(executor(ctx)),
    },
    ServiceEntry {
        name: "intake-matrix",
        about: "each agent's Matrix room to and from its stream: a thread per work item",
        run: |ctx| Box::pin(intake_matrix(ctx)),
    },
    ServiceEntry {
        name: "intake-alerts",
        about: "Alertmanager's webhook receiver: each alert onto the agent's stream",
        run: |ctx| Box::pin(intake_alerts(ctx)),
    },
];

/// Runs the brain of every served agent that has one in this build, each
/// on its own task with its own state store.
async fn brain(ctx: ServiceContext) -> anyhow::Result<()> {
    let mut tasks = tokio::task::JoinSet::new();
    for agent in &ctx.agents {
        let path = ctx.config.store_path(agent.as_str());
        match agent.as_str() {
            "ops" => {
                let brain = nisse_ops::OpsBrain::new(agent.as_str(), ctx.config.ops.clone())
                    .with_models(ctx.config.models.clone());
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
    ctx.ready.ready("brain");
    while let Some(done) = tasks.join_next().await {
        done.context("a brain task panicked")?
            .context("a brain stopped")?;
    }
    Ok(())
}

/// Runs the action classifier for every served agent, with the
/// `classifier` role's model (through the gateway, in-process) when one
/// is configured.
async fn classifier(ctx: ServiceContext) -> anyhow::Result<()> {
    let policy = ctx
        .config
        .load_policy()
        .context("loading the policy for the classifier")?;
    let models = &ctx.config.models;
    let model = if models.roles.contains_key(&nisse_models::Role::Classifier) {
        Some(
            nisse_model_gateway::Gateway::new(models.clone(), ctx.bus.clone())
                .context("starting the classifier's model gateway")?,
        )
    } else {
        None
    };
    let ready = ctx.ready.clone();
    nisse_classifier::run_with_model(
        ctx.bus.clone(),
        ctx.agents.clone(),
        Arc::new(policy),
        model,
        ctx.shutdown.clone(),
        move || ready.ready("classifier"),
    )
    .await?;
    Ok(())
}

/// Runs the model gateway for every served agent; idle (and ready) when no
/// role is configured, so `nisse up` works the same without models.
async fn model_gateway(ctx: ServiceContext) -> anyhow::Result<()> {
    if !ctx.config.models.enabled() {
        tracing::info!("no model role is configured (models.roles): the model gateway is idle");
        ctx.ready.ready("model-gateway");
        ctx.shutdown.cancelled().await;
        return Ok(());
    }
    let ready = ctx.ready.clone();
    nisse_model_gateway::run(
        ctx.bus.clone(),
        ctx.agents.clone(),
        Arc::new(ctx.config.models.clone()),
        ctx.shutdown.clone(),
        move || ready.ready("model-gateway"),
    )
    .await?;
    Ok(())
}

/// Runs the executor for every served agent.
async fn executor(ctx: ServiceContext) -> anyhow::Result<()> {
    let policy = ctx
        .config
        .load_policy()
        .context("loading the policy for the executor")?;
    let ready = ctx.ready.clone();
    nisse_executor::run(
        ctx.bus.clone(),
        ctx.agents.clone(),
        Arc::new(ctx.config.executor.clone()),
        &ctx.config.data_dir,
        Arc::new(policy),
        ctx.shutdown.clone(),
        move || ready.ready("executor"),
    )
    .await?;
    Ok(())
}

/// Runs the Matrix service for every served agent with Matrix settings.
async fn intake_matrix(ctx: ServiceContext) -> anyhow::Result<()> {
    let ready = ctx.ready.clone();
    nisse_intake_matrix::run(
        ctx.bus.clone(),
        ctx.agents.clone(),
        Arc::new(ctx.config.matrix.clone()),
        &ctx.config.data_dir,
        ctx.shutdown.clone(),
        move || ready.ready("intake-matrix"),
    )
    .await?;
    Ok(())
}

/// Runs the Alertmanager webhook receiver.
async fn intake_alerts(ctx: ServiceContext) -> anyhow::Result<()> {
    let cfg = &ctx.config.intake_alerts;
    let bound = nisse_intake_alerts::bind(cfg, ctx.bus.clone())
        .await
        .context("starting the Alertmanager webhook receiver")?;
    ctx.ready
        .listening("alertmanager-webhook", bound.webhook_url());
    ctx.ready.ready("intake-alerts");
    bound.serve(ctx.shutdown.clone()).await?;
    Ok(())
}

/// Looks services up by name, naming the first unknown one and what exists.
pub fn find(names: &[String]) -> anyhow::Result<Vec<&'static ServiceEntry>> {
    names
        .iter()
        .map(|n| {
            SERVICES.iter().find(|s| s.name == n).ok_or_else(|| {
                let known: Vec<&str> = SERVICES.iter().map(|s| s.name).collect();
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

/// Starts `entries`, each on its own task with a child of `shutdown`.
pub fn start(entries: &[&'static ServiceEntry], ctx: &ServiceContext) -> Running {
    let tracker = TaskTracker::new();
    let (tx, failed) = tokio::sync::mpsc::unbounded_channel();
    for &entry in entries {
        let ctx = ctx.clone();
        let tx = tx.clone();
        let name = entry.name;
        tracker.spawn(async move {
            tracing::info!(service = name, "service starting");
            match (entry.run)(ctx).await {
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
        shutdown: ctx.shutdown.clone(),
        failed,
        names: entries.iter().map(|e| e.name.to_string()).collect(),
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
