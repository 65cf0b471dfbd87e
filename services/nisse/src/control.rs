//! The control service as this binary runs it (`nisse up`, `nisse serve
//! control`): a read model of each agent kept live from its stream, the
//! [`Backend`] that answers the API from those read models and the bus
//! with the same views the CLI prints, and the listener.
//!
//! The read models live under `<data-dir>/control/`; they are the
//! service's own and can be thrown away at any time (they are made again
//! from the streams). Commands go out as the token's operator through the
//! same code as the CLI's (`operator::command_on`), on the control
//! service's own connection, whose permissions allow only the subjects of
//! operators an allowlist names as `control:<name>`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use tokio_util::sync::CancellationToken;

use futures::StreamExt as _;
use nisse_bus::auth::{AuthPlan, Credentials, Identity, OperatorName};
use nisse_bus::proto::operator_command::Command;
use nisse_bus::{AgentName, Bus};
use nisse_control::api::{self, Event, event};
use nisse_control::{Backend, Failure, Hub, Records, Tokens};
use nisse_core::Store;
use nisse_core::plans::Plan;

use crate::config::Config;
use crate::operator::{AutonomyChange, Sender};
use crate::shown::Shown;

/// Where the read models live under a data directory.
pub fn read_models_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("control")
}

/// The backend: views over the read models, commands over the bus.
pub struct NisseBackend {
    /// The configuration, its stores under the read models.
    cfg: Config,
    /// The control service's own connection.
    bus: Bus,
    /// Who operates what.
    plan: AuthPlan,
}

impl NisseBackend {
    /// A backend for `cfg` on `bus` (connected as the control service).
    pub fn new(cfg: &Config, bus: Bus) -> anyhow::Result<Self> {
        Ok(Self {
            plan: cfg.auth_plan()?,
            cfg: cfg.with_stores_in(&read_models_dir(&cfg.data_dir)),
            bus,
        })
    }
}

/// Runs a view off the async threads (they read SQLite).
async fn view(
    f: impl FnOnce() -> anyhow::Result<Shown> + Send + 'static,
) -> Result<api::View, Failure> {
    let shown = tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Failure::Internal(e.to_string()))?
        .map_err(failure)?;
    Ok(to_view(&shown))
}

fn to_view(shown: &Shown) -> api::View {
    api::View {
        text: shown.text.clone(),
        json: shown.json.to_string(),
        warnings: shown.warnings.clone(),
    }
}

fn agent_name(agent: &str) -> Result<AgentName, Failure> {
    agent.parse().map_err(|e| Failure::Invalid(format!("{e}")))
}

/// A view's error as the caller is told it: what is not there is "not
/// found", anything else as it reads.
fn failure(e: anyhow::Error) -> Failure {
    let text = format!("{e:#}");
    if text.contains(" has no ")
        || text.contains("is not on this machine")
        || text.contains("there is no vault")
        || text.starts_with("no entity")
    {
        Failure::NotFound(text)
    } else {
        Failure::Internal(text)
    }
}

/// The phrase that confirms an approval of `plan` of item `number`: its
/// destructive steps named back (`#14 step 2`, `#14 steps 2, 4`), or
/// `None` when it has none. The brain's own ([`Plan::confirmation`]),
/// which it checks on every channel; shown here so the page and the API
/// ask for exactly what the brain will.
pub fn confirm_phrase(number: i64, plan: &Plan) -> Option<String> {
    plan.confirmation(number)
}

#[nisse_control::tonic::async_trait]
impl Backend for NisseBackend {
    fn agents_of(&self, operator: &OperatorName) -> Vec<String> {
        self.plan
            .control
            .get(operator)
            .map(|agents| agents.iter().map(ToString::to_string).collect())
            .unwrap_or_default()
    }

    async fn overview(&self, agents: &[String]) -> Result<api::View, Failure> {
        let cfg = self.cfg.clone();
        let agents = agents.to_vec();
        view(move || overview(&cfg, &agents)).await
    }

    async fn items(&self, agent: &str, state: &str) -> Result<api::View, Failure> {
        let (cfg, agent, state) = (self.cfg.clone(), agent.to_string(), state.to_string());
        view(move || {
            crate::items::listing(&cfg, &agent, (!state.is_empty()).then_some(state.as_str()))
        })
        .await
    }

    async fn item(
        &self,
        agent: &str,
        item: &str,
        revision: u32,
        part: &str,
    ) -> Result<api::View, Failure> {
        let (cfg, agent, item) = (self.cfg.clone(), agent.to_string(), item.to_string());
        let revision = (revision > 0).then_some(revision);
        match part {
            "" => view(move || item_whole(&cfg, &agent, &item, revision)).await,
            "log" => view(move || crate::items::item_log(&cfg, &agent, &item)).await,
            "plan" => view(move || crate::operator::plan_view(&cfg, &agent, &item, revision)).await,
            other => Err(Failure::Invalid(format!(
                "`{other}` is no part of an item: say `log`, `plan`, or nothing for the whole"
            ))),
        }
    }

    async fn command(
        &self,
        operator: &OperatorName,
        request: api::CommandRequest,
    ) -> Result<Vec<String>, Failure> {
        let agent = agent_name(&request.agent)?;
        let command = request
            .command
            .and_then(|c| c.command)
            .ok_or_else(|| Failure::Invalid("the request carries no command".into()))?;
        let mut command = command;
        if let Command::Approve(approve) = &mut command {
            self.check_confirmation(&agent, &request.item, approve.revision, &request.confirm)
                .await?;
            // The brain checks it again, as it does for every channel.
            approve.confirm = request.confirm.clone();
        }
        let sender = Sender {
            id: operator.to_string(),
            channel: nisse_control::CHANNEL,
        };
        crate::operator::command_on(&self.bus, &agent, &request.item, command, &sender)
            .await
            .map_err(|e| {
                let text = format!("{e:#}");
                if text.contains("has not answered") {
                    Failure::Unavailable(text)
                } else {
                    Failure::Refused(text)
                }
            })
    }

    async fn streams(&self, agents: &[String]) -> Result<api::View, Failure> {
        // Only the caller's agents' streams.
        let mut cfg = self.cfg.clone();
        cfg.agents.retain(|a| agents.contains(a));
        let shown = crate::inspect::streams_shown(&cfg, &self.bus)
            .await
            .map_err(failure)?;
        Ok(to_view(&shown))
    }

    async fn duties(&self, agent: &str) -> Result<api::View, Failure> {
        let (cfg, agent) = (self.cfg.clone(), agent.to_string());
        view(move || crate::duties::listing(&cfg, &agent)).await
    }

    async fn world(&self, entity: &str, blast: bool) -> Result<api::View, Failure> {
        let (cfg, entity) = (self.cfg.clone(), entity.to_string());
        view(move || match (entity.as_str(), blast) {
            ("", _) => crate::world::entities(&cfg),
            (one, false) => crate::world::entity(&cfg, one),
            (one, true) => crate::world::blast(&cfg, one),
        })
        .await
    }

    async fn check(&self, what: &str) -> Result<api::CheckResponse, Failure> {
        let cfg = self.cfg.clone();
        let check = match what {
            "world" => crate::world::check_world,
            "vault" => crate::world::check_vault,
            other => {
                return Err(Failure::Invalid(format!(
                    "`{other}` is no check: say `world` (the world model and every link) or `vault` (the links)"
                )));
            }
        };
        let checked = tokio::task::spawn_blocking(move || check(&cfg))
            .await
            .map_err(|e| Failure::Internal(e.to_string()))?
            .map_err(failure)?;
        Ok(api::CheckResponse {
            problems: checked.problems,
            summary: checked.summary,
        })
    }

    async fn replay(
        &self,
        agent: &str,
        from: u64,
        to: Option<u64>,
    ) -> Result<Records<api::ReplayRecord>, Failure> {
        let agent = agent_name(agent)?;
        let records = crate::inspect::replay_records(&self.bus, &agent, from, to)
            .await
            .map_err(failure)?;
        Ok(Box::pin(records.map(|r| {
            let r = r.map_err(failure)?;
            Ok(api::ReplayRecord {
                text: r.text(),
                json: serde_json::to_string(&r).map_err(|e| Failure::Internal(e.to_string()))?,
            })
        })))
    }

    async fn idle(&self, agents: &[String]) -> Result<Vec<String>, Failure> {
        let agents = agents
            .iter()
            .map(|a| agent_name(a))
            .collect::<Result<Vec<_>, _>>()?;
        crate::inspect::busy(&self.bus, &agents)
            .await
            .map_err(failure)
    }

    async fn mcp_list(&self, agent: &str) -> Result<api::View, Failure> {
        let (cfg, agent) = (self.cfg.clone(), agent.to_string());
        view(move || crate::mcp_list::listing(&cfg, &agent)).await
    }

    async fn classify(&self, command: &str, target: &str) -> Result<api::View, Failure> {
        let (cfg, command, target) = (self.cfg.clone(), command.to_string(), target.to_string());
        view(move || {
            crate::operator::classify(
                &cfg,
                &command,
                (!target.is_empty()).then_some(target.as_str()),
            )
        })
        .await
    }

    async fn model_calls(&self, agent: &str) -> Result<Records<api::ModelCall>, Failure> {
        let agent = agent_name(agent)?;
        let captures = crate::eval::captures(&self.bus, &agent)
            .await
            .map_err(failure)?;
        Ok(Box::pin(captures.map(|c| {
            Ok(match c.map_err(failure)? {
                crate::eval::Capture::Call(line) => api::ModelCall {
                    json: line.to_string(),
                    skipped: String::new(),
                },
                crate::eval::Capture::Skipped(which) => api::ModelCall {
                    json: String::new(),
                    skipped: which,
                },
            })
        })))
    }

    async fn autonomy(&self, operator: &OperatorName, change: &str) -> Result<api::View, Failure> {
        let change = parse_autonomy(change).map_err(Failure::Invalid)?;
        let by = format!("{}:{operator}", nisse_control::CHANNEL);
        let shown = crate::operator::switches(&self.bus, &by, change)
            .await
            .map_err(failure)?;
        Ok(to_view(&shown))
    }
}

impl NisseBackend {
    /// An approval through the control plane must name the revision (the
    /// one the operator was shown), and one of a revision with destructive
    /// steps carry its phrase: checked here against the read model, so the
    /// page and the API refuse it at once saying what to type; the brain
    /// checks the phrase again itself, as for every channel.
    async fn check_confirmation(
        &self,
        agent: &AgentName,
        item: &str,
        revision: u32,
        confirm: &str,
    ) -> Result<(), Failure> {
        if revision == 0 {
            return Err(Failure::Invalid(
                "an approval through the control plane names the revision it approves (the one shown)".into(),
            ));
        }
        let path = self.cfg.store_path(agent.as_str());
        let (agent, item) = (agent.to_string(), item.to_string());
        let phrase = tokio::task::spawn_blocking(move || -> anyhow::Result<Option<String>> {
            let store = Store::open_read_only(&path, &agent)?;
            let found = store
                .find_item(&item)?
                .ok_or_else(|| anyhow::anyhow!("agent {agent} has no work item `{item}`"))?;
            let plans = store.plans(&found.id)?;
            let plan = plans
                .iter()
                .find(|p| p.revision == revision)
                .ok_or_else(|| {
                    anyhow::anyhow!("item #{} has no plan revision rev-{revision}", found.number)
                })?;
            Ok(confirm_phrase(found.number, plan))
        })
        .await
        .map_err(|e| Failure::Internal(e.to_string()))?
        .map_err(failure)?;
        match phrase {
            Some(phrase) if !nisse_core::plans::confirms(confirm, &phrase) => {
                Err(Failure::Refused(format!(
                    "rev-{revision} has destructive steps: type `{phrase}` to confirm them (an approval alone does not)"
                )))
            }
            _ => Ok(()),
        }
    }
}

/// `on`, `off`, `never <target> [reason]`, `allow <target>`, or nothing.
fn parse_autonomy(change: &str) -> Result<AutonomyChange, String> {
    let mut words = change.split_whitespace();
    Ok(match (words.next(), words.next()) {
        (None, _) => AutonomyChange::Show,
        (Some("on"), None) => AutonomyChange::On,
        (Some("off"), None) => AutonomyChange::Off,
        (Some("never"), Some(target)) => AutonomyChange::Never {
            target: target.to_string(),
            reason: words.collect::<Vec<_>>().join(" "),
        },
        (Some("allow"), Some(target)) => AutonomyChange::Clear {
            target: target.to_string(),
        },
        _ => {
            return Err(format!(
                "`{change}` is no change of the switches: say on, off, never <target> [why], allow <target>, or nothing to show them"
            ));
        }
    })
}

/// An item whole: its log, its plan revisions, the one shown (the
/// current, or `revision`) rendered as its approval request, and the
/// phrase that confirms that revision's destructive steps.
fn item_whole(
    cfg: &Config,
    agent: &str,
    item: &str,
    revision: Option<u32>,
) -> anyhow::Result<Shown> {
    let log = crate::items::item_log(cfg, agent, item)?;
    let plan = crate::operator::plan_view(cfg, agent, item, revision)?;
    let number = log.json["item"]["number"].as_i64().unwrap_or_default();
    let plans: Vec<Plan> = serde_json::from_value(plan.json["plans"].clone()).unwrap_or_default();
    let shown = match revision {
        Some(n) => plans.iter().find(|p| p.revision == n),
        None => plans.last(),
    };
    let json = serde_json::json!({
        "item": log.json["item"],
        "events": log.json["events"],
        "plans": plan.json["plans"],
        "shown_revision": shown.map(|p| p.revision),
        "confirm": shown.and_then(|p| confirm_phrase(number, p)),
        "log_text": log.text,
        "plan_text": plan.text,
    });
    Ok(Shown::new(format!("{}\n{}", log.text, plan.text), json))
}

/// Each agent at a glance, from its read model: the item being worked,
/// the ready queue, what waits (on the operator or anything else), what
/// is blocked, and how many are closed.
fn overview(cfg: &Config, agents: &[String]) -> anyhow::Result<Shown> {
    use crate::shown::outln;
    let mut text = String::new();
    let mut out = Vec::new();
    for agent in agents {
        let path = cfg.store_path(agent);
        let items = if path.exists() {
            Store::open_read_only(&path, agent)?.items(None)?
        } else {
            Vec::new()
        };
        let of = |state: nisse_core::State| -> Vec<&nisse_core::WorkItem> {
            items.iter().filter(|i| i.state == state).collect()
        };
        let (active, ready, waiting, blocked) = (
            of(nisse_core::State::Active),
            of(nisse_core::State::Ready),
            of(nisse_core::State::WaitingOnOperator),
            of(nisse_core::State::Blocked),
        );
        let closed = items.len() - active.len() - ready.len() - waiting.len() - blocked.len();
        outln!(
            text,
            "{agent}: {} active, {} ready, {} waiting, {} blocked, {closed} closed",
            active.len(),
            ready.len(),
            waiting.len(),
            blocked.len()
        );
        for i in active.iter().chain(&waiting).chain(&blocked) {
            outln!(text, "  #{} {} — {}", i.number, i.state.as_str(), i.title);
        }
        out.push(serde_json::json!({
            "agent": agent,
            "active": active,
            "ready": ready,
            "waiting": waiting,
            "blocked": blocked,
            "closed": closed,
        }));
    }
    Ok(Shown::new(text, serde_json::json!({ "agents": out })))
}

/// The live events of one applied batch: each message the stream took,
/// then each item whose log grew, as it stands now.
fn events_of(
    agent: &str,
    followed: &nisse_core::reactor::Followed<'_>,
    seen: &mut i64,
) -> Vec<Event> {
    let mut out = Vec::with_capacity(followed.messages.len() + 1);
    for m in followed.messages {
        let decoded = m.decode().ok();
        out.push(Event {
            agent: agent.to_string(),
            sequence: m.sequence,
            event: Some(event::Event::Message(api::Message {
                subject: m.subject.clone(),
                r#type: decoded
                    .as_ref()
                    .map(|d| nisse_bus::AnyMessage::type_name(d.kind()))
                    .unwrap_or_default(),
                work_item: decoded
                    .as_ref()
                    .map(|d| nisse_bus::Decode::envelope(d).work_item_id.clone())
                    .unwrap_or_default(),
            })),
        });
    }
    let last = followed.messages.last().map_or(0, |m| m.sequence);
    match followed.store.items_logged_after(*seen) {
        Ok((items, now)) => {
            *seen = now;
            for item in items {
                let plan = followed
                    .store
                    .plans(&item.id)
                    .ok()
                    .and_then(|p| p.into_iter().last());
                out.push(Event {
                    agent: agent.to_string(),
                    sequence: last,
                    event: Some(event::Event::Item(api::ItemChanged {
                        id: item.id.clone(),
                        number: u32::try_from(item.number).unwrap_or_default(),
                        title: item.title.clone(),
                        state: item.state.as_str().to_string(),
                        plan_revision: plan.as_ref().map_or(0, |p| p.revision),
                        plan_status: plan.map(|p| p.status.to_string()).unwrap_or_default(),
                        updated_at: item
                            .updated_at
                            .format(&time::format_description::well_known::Rfc3339)
                            .unwrap_or_default(),
                    })),
                });
            }
        }
        Err(e) => tracing::warn!(%agent, "reading what changed in the read model: {e}"),
    }
    out
}

/// Keeps `agent`'s read model live until shutdown, sending what it
/// applies to `hub`. A read model that fails on the bus goes on from its
/// store after a pause; one ahead of its stream is thrown away and made
/// again.
async fn keep_read_model(
    cfg: Arc<Config>,
    bus: Bus,
    agent: AgentName,
    hub: Hub,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    if !matches!(agent.as_str(), "ops" | "dev") {
        tracing::warn!(%agent, "agent `{agent}` has no brain in this build: the control service shows no state of it");
        shutdown.cancelled().await;
        return Ok(());
    }
    let path = Store::path_in(&read_models_dir(&cfg.data_dir), agent.as_str());
    let mut pause = RESTART.delays();
    loop {
        // Only what changes from now on is news: the items already in the
        // store are not sent again at every start.
        let mut seen = match Store::open(&path, agent.as_str()) {
            Ok(store) => store
                .items_logged_after(i64::MAX)
                .map(|(_, last)| last)
                .unwrap_or(0),
            Err(e) => return Err(anyhow::Error::from(e).context(format!("the {agent} read model"))),
        };
        let name = agent.to_string();
        let hub2 = hub.clone();
        let followed = async {
            let seen_batch = |f: nisse_core::reactor::Followed<'_>| {
                for e in events_of(&name, &f, &mut seen) {
                    hub2.send(e);
                }
            };
            match agent.as_str() {
                "ops" => {
                    nisse_core::reactor::follow(
                        &bus,
                        &agent,
                        &path,
                        cfg.ops_brain("ops")?,
                        seen_batch,
                    )
                    .await
                }
                "dev" => {
                    nisse_core::reactor::follow(
                        &bus,
                        &agent,
                        &path,
                        cfg.dev_brain("dev"),
                        seen_batch,
                    )
                    .await
                }
                other => anyhow::bail!("agent `{other}` has no brain in this build"),
            }
            .map_err(anyhow::Error::from)
        };
        let outcome = tokio::select! {
            () = shutdown.cancelled() => return Ok(()),
            o = followed => o,
        };
        let Err(e) = outcome else { continue };
        if matches!(
            e.downcast_ref(),
            Some(nisse_core::reactor::ReactorError::StreamWentBack { .. })
        ) {
            tracing::warn!(%agent, "the read model is ahead of its stream: making it again from the stream ({e:#})");
            for suffix in ["", "-wal", "-shm"] {
                let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
            }
            continue;
        }
        let wait = pause.next().unwrap_or(RESTART.max());
        tracing::warn!(%agent, ?wait, "the read model stopped ({e:#}); going on from its store");
        tokio::select! {
            () = shutdown.cancelled() => return Ok(()),
            () = tokio::time::sleep(wait) => {}
        }
    }
}

/// Pauses before a read model that stopped on the bus goes on.
const RESTART: nisse_bus::Backoff =
    nisse_bus::Backoff::new(Duration::from_millis(500), Duration::from_secs(30));

/// Runs the control service until `shutdown`: makes sure each operator
/// of the control plane has a token, keeps every agent's read model, and
/// serves the API and the web room on `[control] listen`; `ready` is
/// told the address once it listens. With no operator named
/// `control:<name>`, it says so and idles.
pub async fn run(
    cfg: Arc<Config>,
    shutdown: CancellationToken,
    ready: nisse_bus::service::Ready,
) -> anyhow::Result<()> {
    let plan = cfg.auth_plan()?;
    if plan.control.is_empty() {
        tracing::info!(
            "no operator is named `control:<name>` on an allowlist: the control service is idle"
        );
        ready.ready();
        shutdown.cancelled().await;
        return Ok(());
    }
    let tls = match (&cfg.control.tls_cert, &cfg.control.tls_key) {
        (Some(cert), Some(key)) => Some(
            nisse_control::tls::server_config(cert, key)
                .context("control.tls-cert and control.tls-key")?,
        ),
        _ => None,
    };
    let tokens = Tokens::in_data_dir(&cfg.data_dir);
    for operator in plan.control.keys() {
        tokens.ensure(operator)?;
    }
    let credentials = Credentials::in_data_dir(&cfg.data_dir);
    let bus = Bus::connect_as(
        &cfg.bus,
        plan.agents.clone(),
        &Identity::Control,
        &credentials,
    )
    .await
    .context("connecting the control service")?;
    let hub = Hub::default();
    let mut models = tokio::task::JoinSet::new();
    for agent in &plan.agents {
        models.spawn(keep_read_model(
            cfg.clone(),
            bus.clone(),
            agent.clone(),
            hub.clone(),
            shutdown.clone(),
        ));
    }
    let backend = Arc::new(NisseBackend::new(&cfg, bus.clone())?);
    let service = nisse_control::ControlService::new(backend, tokens, hub);
    let listener = tokio::net::TcpListener::bind(cfg.control.listen)
        .await
        .with_context(|| format!("listening on control.listen = {}", cfg.control.listen))?;
    let addr = listener.local_addr()?;
    tracing::info!(%addr, "the control API and web room listen");
    let scheme = if tls.is_some() { "https" } else { "http" };
    ready.listening("control", format!("{scheme}://{addr}"));
    ready.ready();
    let served = nisse_control::serve(listener, tls, service, shutdown.clone());
    tokio::select! {
        r = served => r,
        Some(done) = models.join_next() => {
            done.context("a read model panicked")?.context("a read model failed")?;
            Ok(())
        }
    }
}

/// `nisse control token|revoke <operator>`.
pub fn tokens(cfg: &Config, command: crate::cli::ControlCommand) -> anyhow::Result<()> {
    use crate::cli::ControlCommand;
    let (ControlCommand::Token { operator } | ControlCommand::Revoke { operator }) = &command;
    let name: OperatorName = operator.parse()?;
    let plan = cfg.auth_plan()?;
    if !plan.control.contains_key(&name) {
        anyhow::bail!(
            "`{name}` is on no agent's allowlist as `control:{name}`: add it (e.g. ops.operators) first"
        );
    }
    let tokens = Tokens::in_data_dir(&cfg.data_dir);
    let token = match command {
        ControlCommand::Token { .. } => tokens.ensure(&name)?.0,
        ControlCommand::Revoke { .. } => {
            let new = tokens.revoke(&name)?;
            eprintln!("revoked {name}'s control token; the new one:");
            new
        }
    };
    println!("{token}");
    Ok(())
}
