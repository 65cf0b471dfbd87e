//! Commands that look at a running installation: `nisse streams` and
//! `nisse replay`.

use std::collections::BTreeMap;

use anyhow::Context as _;
use futures::{StreamExt as _, TryStreamExt as _};
use prost_reflect::{DynamicMessage, SerializeOptions};
use serde::Serialize;

use nisse_bus::auth::{Credentials, Identity};
use nisse_bus::{AgentName, AnyMessage, Bus, ConsumerSpec, SubjectKind, dead_letter_subject};

use crate::config::Config;
use crate::endpoints::Endpoints;
use crate::shown::{Shown, outln};

/// The server a command talks to: `bus.url` / `NISSE_NATS_URL` when set,
/// else the one of the `nisse up` running in the data directory.
pub fn server_url(cfg: &Config) -> anyhow::Result<String> {
    if let Some(url) = &cfg.bus.url {
        return Ok(url.clone());
    }
    let endpoints = Endpoints::read(&cfg.data_dir)?.with_context(|| {
        format!(
            "no NATS server: nothing runs in data directory {} (no endpoints.json); start `nisse up` there, pass --data-dir, or set NISSE_NATS_URL",
            cfg.data_dir.display()
        )
    })?;
    if !process_alive(endpoints.pid) {
        anyhow::bail!(
            "the `nisse up` recorded in {} (pid {}) is not running; start it again or set NISSE_NATS_URL",
            Endpoints::path(&cfg.data_dir).display(),
            endpoints.pid
        );
    }
    Ok(endpoints.nats_url)
}

/// Connects a CLI command to [`server_url`] as the operator running it
/// (`cli:<local user>`), with the credentials `nisse up` made for them
/// (under the data directory), unless the configuration names its own.
pub async fn connect(cfg: &Config) -> anyhow::Result<Bus> {
    let user = crate::operator::local_user();
    let identity = Identity::Operator(
        user.parse()
            .with_context(|| format!("the local user `{user}` cannot have NATS credentials"))?,
    );
    connect_as(cfg, &identity).await.with_context(|| {
        format!(
            "connecting as operator `{user}` (only operators may use this command: `cli:{user}` must be on an agent's `operators` list, and `nisse up` restarted to make their credentials)"
        )
    })
}

/// Connects to [`server_url`] as `identity`, with its credentials under
/// the data directory unless the configuration names its own.
pub async fn connect_as(cfg: &Config, identity: &Identity) -> anyhow::Result<Bus> {
    let mut bus_cfg = cfg.bus.clone();
    bus_cfg.url = Some(server_url(cfg)?);
    Ok(Bus::connect_as(
        &bus_cfg,
        cfg.agent_names()?,
        identity,
        &Credentials::in_data_dir(&cfg.data_dir),
    )
    .await?)
}

fn process_alive(pid: u32) -> bool {
    let Ok(pid) = i32::try_from(pid) else {
        return false;
    };
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok()
}

/// One stream as `nisse streams` shows it.
#[derive(Debug, Serialize)]
pub struct StreamStatus {
    /// The stream name.
    pub stream: String,
    /// Its agent.
    pub agent: String,
    /// Messages stored.
    pub messages: u64,
    /// Bytes stored.
    pub bytes: u64,
    /// First stored sequence.
    pub first_seq: u64,
    /// Last stored sequence.
    pub last_seq: u64,
    /// Messages on the dead-letter subject.
    pub dead_letters: u64,
    /// Its durable consumers.
    pub consumers: Vec<ConsumerStatus>,
    /// The executor's circuit per host, as last recorded (an open one
    /// fails requests to its host at once).
    pub circuits: Vec<nisse_executor::CircuitState>,
    /// The mcp service's circuit per MCP server instance, likewise.
    pub mcp_circuits: Vec<nisse_executor::CircuitState>,
    /// What the agent's work items spent on models, per item and role
    /// (the gateway's budget counts).
    pub model_usage: Vec<nisse_model_gateway::ModelUsage>,
    /// When each of the agent's duties was last due, from the stream.
    pub duties: Vec<crate::duties::LastDue>,
    /// What the brain holding the agent's lease last said of itself
    /// (where it stands, whether it is catching up, the items in the
    /// middle of a step); none when no brain holds it.
    pub brain: Option<nisse_bus::BrainStatus>,
}

/// One consumer as `nisse streams` shows it.
#[derive(Debug, Serialize)]
pub struct ConsumerStatus {
    /// The durable name.
    pub name: String,
    /// Its filter subject.
    pub filter: String,
    /// Messages not yet delivered.
    pub pending: u64,
    /// Messages delivered and not yet acknowledged.
    pub ack_pending: u64,
    /// Messages delivered more than once.
    pub redelivered: u64,
    /// Instances pulling right now.
    pub waiting: u64,
}

/// Every agent stream (`AGENT_*`) on the server, with its consumers.
pub async fn streams(
    bus: &Bus,
    duties: &BTreeMap<String, Vec<String>>,
) -> anyhow::Result<Vec<StreamStatus>> {
    let js = bus.jetstream();
    let mut names: Vec<String> = js
        .stream_names()
        .try_collect()
        .await
        .context("listing streams")?;
    names.retain(|n| n.starts_with("AGENT_"));
    names.sort();
    let mut out = Vec::new();
    for name in names {
        let mut stream = js
            .get_stream(&name)
            .await
            .with_context(|| format!("reading {name}"))?;
        let info = stream
            .info()
            .await
            .with_context(|| format!("reading {name}"))?
            .clone();
        let agent = info
            .config
            .subjects
            .first()
            .and_then(|s| s.strip_prefix("nisse.")?.strip_suffix(".>"))
            .unwrap_or_default()
            .to_string();
        // Missing before the topology had the buckets: nothing recorded.
        let (circuits, mcp_circuits, model_usage, brain) = match agent.parse::<AgentName>() {
            Ok(a) => (
                nisse_executor::circuits(bus, &a).await.unwrap_or_default(),
                nisse_mcp::circuits(bus, &a).await.unwrap_or_default(),
                nisse_model_gateway::usage::all(bus, &a)
                    .await
                    .unwrap_or_default(),
                bus.brain_status(&a).await.ok().flatten(),
            ),
            Err(_) => (Vec::new(), Vec::new(), Vec::new(), None),
        };
        let dead_letters = match agent.parse::<AgentName>() {
            Ok(a) => {
                let subject = dead_letter_subject(&a);
                let counts: BTreeMap<String, usize> = stream
                    .info_with_subjects(&subject)
                    .await
                    .with_context(|| format!("counting dead letters of {name}"))?
                    .try_collect()
                    .await
                    .with_context(|| format!("counting dead letters of {name}"))?;
                counts.get(&subject).copied().unwrap_or(0) as u64
            }
            Err(_) => 0,
        };
        let mut consumers = Vec::new();
        let mut names: Vec<String> = stream.consumer_names().try_collect().await?;
        names.sort_by_key(|n| {
            ConsumerSpec::ALL
                .iter()
                .position(|s| s.name == n)
                .unwrap_or(usize::MAX)
        });
        for c in names {
            let ci = match stream.consumer_info(&c).await {
                Ok(ci) => ci,
                // An ephemeral reader (a replay, a brain catching up) that
                // went away between the listing and now.
                Err(_) if !ConsumerSpec::ALL.iter().any(|s| s.name == c) => continue,
                Err(e) => return Err(e).with_context(|| format!("reading consumer {c} of {name}")),
            };
            // Only the durable consumers: the ephemeral ones are readers
            // of the stream's history, gone when they are done.
            if ci.config.durable_name.is_none() {
                continue;
            }
            consumers.push(ConsumerStatus {
                name: c,
                filter: ci.config.filter_subject.clone(),
                pending: ci.num_pending,
                ack_pending: ci.num_ack_pending as u64,
                redelivered: ci.num_redelivered as u64,
                waiting: ci.num_waiting as u64,
            });
        }
        let duties = match (agent.parse::<AgentName>(), duties.get(&agent)) {
            (Ok(a), Some(names)) => crate::duties::last_due(bus, &a, names).await,
            _ => Vec::new(),
        };
        out.push(StreamStatus {
            stream: name,
            agent,
            duties,
            messages: info.state.messages,
            bytes: info.state.bytes,
            first_seq: info.state.first_sequence,
            last_seq: info.state.last_sequence,
            dead_letters,
            consumers,
            circuits,
            mcp_circuits,
            model_usage,
            brain,
        });
    }
    Ok(out)
}

/// `nisse streams`: every agent stream with its consumers, dead letters,
/// circuits, model spend and the duties' last due times, read with `bus`.
pub async fn streams_shown(cfg: &Config, bus: &Bus) -> anyhow::Result<Shown> {
    // Duties as configured: those the ops brain runs.
    let duties: BTreeMap<String, Vec<String>> = cfg
        .load_duties()
        .map(|d| d.into_iter().map(|d| d.name).collect())
        .map(|names| BTreeMap::from([("ops".to_string(), names)]))
        .unwrap_or_default();
    let streams = streams(bus, &duties).await?;
    Ok(Shown::new(
        render_streams(&streams),
        serde_json::json!({ "streams": streams }),
    ))
}

/// `nisse streams` for people.
fn render_streams(streams: &[StreamStatus]) -> String {
    let mut out = String::new();
    if streams.is_empty() {
        outln!(out, "no agent streams (run `nisse up` to create them)");
    }
    for s in streams {
        outln!(
            out,
            "{}  agent={}  messages={}  bytes={}  seq={}..{}  dead-letters={}",
            s.stream,
            s.agent,
            s.messages,
            bytesize::ByteSize::b(s.bytes),
            s.first_seq,
            s.last_seq,
            s.dead_letters
        );
        match &s.brain {
            Some(b) => outln!(
                out,
                "  brain applied {} of {}{}{}  ({})",
                b.applied,
                b.stream_last,
                if b.catching_up {
                    format!(
                        ", catching up: {} behind",
                        b.stream_last.saturating_sub(b.applied)
                    )
                } else {
                    String::new()
                },
                if b.busy.is_empty() {
                    String::new()
                } else {
                    format!(", in the middle of a step on {}", b.busy.join(", "))
                },
                b.holder
            ),
            None => outln!(out, "  brain: none holds the lease"),
        }
        for c in &s.consumers {
            outln!(
                out,
                "  {:<16} {:<24} pending={} ack-pending={} redelivered={} waiting={}",
                c.name,
                c.filter,
                c.pending,
                c.ack_pending,
                c.redelivered,
                c.waiting
            );
        }
        // Model spend per role, over the agent's items.
        let mut by_role: BTreeMap<&str, (u64, u64, usize)> = BTreeMap::new();
        for u in &s.model_usage {
            let e = by_role.entry(u.role.as_str()).or_default();
            e.0 += u64::from(u.calls);
            e.1 += u.tokens();
            e.2 += 1;
        }
        for (role, (calls, tokens, items)) in by_role {
            outln!(
                out,
                "  models {role:<15} calls={calls} tokens={tokens} items={items}"
            );
        }
        for d in &s.duties {
            outln!(
                out,
                "  duty {:<26} last due {}{}{}",
                d.duty,
                d.due.as_deref().unwrap_or("-"),
                if d.late_ms > 0 {
                    format!(" ({} ms late)", d.late_ms)
                } else {
                    String::new()
                },
                if d.missed > 0 {
                    format!(", standing for {} missed", d.missed)
                } else {
                    String::new()
                }
            );
        }
        let circuits = s.circuits.iter().map(|c| ("circuit", c));
        let mcp = s.mcp_circuits.iter().map(|c| ("mcp circuit", c));
        for (kind, c) in circuits.chain(mcp) {
            let until = if c.state == "open" {
                let left = c.open_until_ms.saturating_sub(nisse_bus::now_ms());
                format!(" for {}s more", left.div_ceil(1000))
            } else {
                String::new()
            };
            outln!(
                out,
                "  {kind} {:<16} {}{until}  failures={}{}",
                c.host,
                c.state,
                c.failures,
                if c.last_error.is_empty() {
                    String::new()
                } else {
                    format!("  last: {}", c.last_error)
                }
            );
        }
    }
    out
}

/// One replayed message.
#[derive(Debug, Serialize)]
pub struct Replayed {
    /// Stream sequence.
    pub seq: u64,
    /// Subject.
    pub subject: String,
    /// When it was stored (RFC 3339).
    pub stored_at: String,
    /// Headers.
    pub headers: BTreeMap<String, String>,
    /// The protobuf type, when the subject names a known kind.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub r#type: Option<String>,
    /// The decoded message in protobuf JSON (field names as in the .proto).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<serde_json::Value>,
    /// Why it could not be decoded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// `agent`'s stream from `from` through `to` (the last stored now when
/// `None`), each message decoded as it is read.
pub async fn replay_records(
    bus: &Bus,
    agent: &AgentName,
    from: u64,
    to: Option<u64>,
) -> anyhow::Result<impl futures::Stream<Item = anyhow::Result<Replayed>> + Send + 'static> {
    let reader = bus.read_range(agent, from, to).await?;
    Ok(futures::stream::unfold(reader, |mut reader| async move {
        let msg = reader.next().await?;
        Some((msg.map(Replayed::of).map_err(anyhow::Error::from), reader))
    }))
}

impl Replayed {
    /// A stored message, decoded by its subject's kind.
    fn of(msg: nisse_bus::StoredMessage) -> Self {
        let kind = SubjectKind::parse(&msg.subject).map(|(_, k)| k);
        let type_name = kind.map(AnyMessage::type_name);
        let (message, error) = match &type_name {
            Some(t) => match to_json(t, &msg.payload) {
                Ok(v) => (Some(v), None),
                Err(e) => (None, Some(e)),
            },
            None => (
                None,
                Some(format!(
                    "`{}` is not a subject of a known kind",
                    msg.subject
                )),
            ),
        };
        Self {
            seq: msg.sequence,
            stored_at: msg
                .stored_at
                .format(&time::format_description::well_known::Rfc3339)
                .unwrap_or_default(),
            headers: msg.headers.iter().cloned().collect(),
            subject: msg.subject,
            r#type: type_name,
            message,
            error,
        }
    }

    /// As `nisse replay` prints it: a line of where and what, then the
    /// message (or why it could not be decoded).
    pub fn text(&self) -> String {
        let env = self.message.as_ref().and_then(|m| m.get("envelope"));
        let field = |k: &str| {
            env.and_then(|e| e.get(k))
                .and_then(|v| v.as_str())
                .unwrap_or("-")
                .to_string()
        };
        let mut text = format!(
            "#{} {} {} {} id={} work-item={} cause={}\n",
            self.seq,
            self.stored_at,
            self.subject,
            self.r#type.as_deref().unwrap_or("?"),
            field("message_id"),
            field("work_item_id"),
            field("causation_id"),
        );
        match (&self.message, &self.error) {
            (Some(m), _) => text.push_str(&format!("  {m}\n")),
            (None, Some(e)) => text.push_str(&format!("  undecodable: {e}\n")),
            (None, None) => {}
        }
        text
    }
}

/// Reads `agent`'s stream from `from` through `to` and prints each message,
/// as JSON lines or as text; returns how many.
pub async fn replay(
    bus: &Bus,
    agent: &AgentName,
    from: u64,
    to: Option<u64>,
    json: bool,
) -> anyhow::Result<u64> {
    let records = replay_records(bus, agent, from, to).await?;
    let mut records = std::pin::pin!(records);
    let mut count = 0;
    while let Some(r) = records.next().await {
        let r = r?;
        if json {
            println!("{}", serde_json::to_string(&r)?);
        } else {
            print!("{}", r.text());
        }
        count += 1;
    }
    Ok(count)
}

/// Decodes a payload of protobuf type `type_name` into protobuf JSON.
fn to_json(type_name: &str, payload: &[u8]) -> Result<serde_json::Value, String> {
    let desc = nisse_proto::descriptor_pool()
        .get_message_by_name(type_name)
        .ok_or_else(|| format!("{type_name} is not in the contracts"))?;
    let msg = DynamicMessage::decode(desc, payload)
        .map_err(|e| format!("not a valid {type_name}: {e}"))?;
    let options = SerializeOptions::new()
        .use_proto_field_name(true)
        .skip_default_fields(true);
    msg.serialize_with_options(serde_json::value::Serializer, &options)
        .map_err(|e| e.to_string())
}

/// What of `agents` is in the middle of a step (an execution sent and
/// not answered, as its brain last said), one line per busy agent. An
/// agent whose brain holds no lease has nothing in progress: nothing goes
/// on without its brain.
pub async fn busy(bus: &Bus, agents: &[AgentName]) -> anyhow::Result<Vec<String>> {
    let mut busy = Vec::new();
    for agent in agents {
        if let Some(status) = bus
            .brain_status(agent)
            .await
            .with_context(|| format!("reading the {agent} brain's status"))?
            && !status.busy.is_empty()
        {
            busy.push(format!(
                "{agent}: in the middle of a step on {}",
                status.busy.join(", ")
            ));
        }
    }
    Ok(busy)
}

/// `nisse idle`: whether nothing is in the middle of a step, as `busy`
/// tells it (from the bus, or through the control plane), for an updater
/// to gate a restart on (seed X4). With `wait`, asks again until nothing
/// is, saying what it waits for when that changes. Returns whether all
/// are idle.
pub async fn idle(
    wait: bool,
    mut busy: impl AsyncFnMut() -> anyhow::Result<Vec<String>>,
) -> anyhow::Result<bool> {
    let mut said = String::new();
    loop {
        let busy = busy().await?;
        if busy.is_empty() {
            println!("idle: no agent is in the middle of a step");
            return Ok(true);
        }
        let now = busy.join("; ");
        if !wait {
            println!("busy: {now}");
            return Ok(false);
        }
        if now != said {
            eprintln!("waiting: {now}");
            said = now;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}
