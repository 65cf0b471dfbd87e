//! The one shape of a service: what it is started with ([`Context`]) and
//! how it says it is ready ([`Ready`]).
//!
//! Every service crate exposes `pub const SERVICE: Service` (its name,
//! written once, and one line on what it does) and
//! `pub async fn run(ctx: Context<Its section>) -> anyhow::Result<()>`.
//! The `nisse` binary hosts any set of them; a test starts one with a
//! context of its own.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::proto::{Actor, ActorKind, Envelope};
use crate::{AgentName, Bus};

/// A service's name and what it does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Service {
    /// Its name: on the command line (`nisse serve <name>`), as the actor
    /// on the messages it publishes, in logs and readiness.
    pub name: &'static str,
    /// One line on what it does, for `nisse serve --help` and logs.
    pub about: &'static str,
}

impl Service {
    /// The envelope of this service's reply to a request: the request's
    /// agent, work item and trace, the service as actor, the request as
    /// cause, and `message_id`, which must be derived from the request's
    /// id so that a redelivered request republishes the same id and
    /// JetStream drops it.
    pub fn reply_to(&self, request: Option<&Envelope>, message_id: String) -> Envelope {
        let request = request.cloned().unwrap_or_default();
        Envelope {
            agent: request.agent,
            work_item_id: request.work_item_id,
            actor: Some(Actor {
                kind: ActorKind::Service as i32,
                id: self.name.to_string(),
            }),
            causation_id: request.message_id,
            trace: request.trace,
            created_at: None,
            message_id,
        }
    }
}

/// What a service is started with.
#[derive(Debug)]
pub struct Context<C> {
    /// The service's own configuration section.
    pub config: Arc<C>,
    /// The service's bus connection, as its own identity for its agent.
    pub bus: Bus,
    /// The agents to serve.
    pub agents: Vec<AgentName>,
    /// Cancelled at shutdown: stop taking new messages, finish in-flight
    /// ones (anything unfinished stays un-acked and is redelivered).
    pub shutdown: CancellationToken,
    /// Where the service says it is ready and what it listens on.
    pub ready: Ready,
    /// The data directory: agents' keys and stores live under it.
    pub data_dir: PathBuf,
}

impl<C> Clone for Context<C> {
    fn clone(&self) -> Self {
        Self {
            config: self.config.clone(),
            bus: self.bus.clone(),
            agents: self.agents.clone(),
            shutdown: self.shutdown.clone(),
            ready: self.ready.clone(),
            data_dir: self.data_dir.clone(),
        }
    }
}

impl<C> Context<C> {
    /// One handler for every agent served: for services whose handling
    /// is the same whichever agent asks (the agent is passed along).
    pub fn every_agent<H>(&self, handler: H) -> Vec<(AgentName, Arc<H>)> {
        let handler = Arc::new(handler);
        self.agents
            .iter()
            .map(|a| (a.clone(), handler.clone()))
            .collect()
    }
}

/// What the services of a process have reported so far.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReadyState {
    /// Services that are ready.
    pub ready: BTreeSet<String>,
    /// Listening addresses by name (`alertmanager-webhook` → URL).
    pub listeners: BTreeMap<String, String>,
}

/// The readiness of every service of a process. `nisse up` writes
/// `endpoints.json` only once every service has reported, so the file
/// never names an address that does not answer yet.
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
    /// The reporter for one service (or one service serving one agent:
    /// any key the caller waits for).
    pub fn reporter(&self, service: impl Into<String>) -> Ready {
        Ready {
            service: service.into(),
            all: self.clone(),
        }
    }

    /// Whether every one of `services` is ready now.
    pub fn is_ready(&self, services: &[String]) -> bool {
        let state = self.0.borrow();
        services.iter().all(|n| state.ready.contains(n))
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

/// One service's readiness reporter.
#[derive(Debug, Clone)]
pub struct Ready {
    service: String,
    all: Readiness,
}

impl Ready {
    /// A reporter nobody waits on, for a service started on its own (a
    /// test, a benchmark).
    pub fn detached(service: &'static str) -> Self {
        Readiness::default().reporter(service)
    }

    /// The service is ready: its consumers are bound, its listeners open.
    pub fn ready(&self) {
        self.all.0.send_modify(|s| {
            s.ready.insert(self.service.clone());
        });
    }

    /// The service listens on `url` under `name`.
    pub fn listening(&self, name: &str, url: String) {
        self.all.0.send_modify(|s| {
            s.listeners.insert(name.to_string(), url);
        });
    }
}
