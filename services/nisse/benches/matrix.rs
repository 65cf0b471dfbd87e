//! `cargo bench -p nisse --bench matrix`: how long until the operator sees
//! an alert's thread in Matrix, and until the operator's `approve` is
//! recorded, against a real Synapse, with Matrix's own delivery measured in
//! the same run as the baseline.
//!
//! One `nats-server -js` and one Synapse (from the cached virtualenv,
//! `scripts/install-synapse`) are started with temporary directories.
//! intake-alerts, the ops brain, the classifier and intake-matrix run in
//! this process, as `nisse up` runs them. The operator is a plain HTTP
//! client that long-polls `/sync`, so an event counts as visible the moment
//! the operator's sync returns it.
//!
//! Cases, one at a time:
//! - **alert → thread root**: an Alertmanager webhook POST with one new
//!   alert, until the operator's sync shows the agent's thread root for the
//!   new item (intake, JetStream, brain commit, outbox publish, Matrix
//!   send, Synapse, sync).
//! - **approve → recorded**: with a plan up for the item and its request
//!   in the room (intake-matrix reported it posted, which a bare `approve`
//!   needs), the operator's `approve` in its thread, until the brain's
//!   store shows the revision approved (Synapse, the agent's sync,
//!   JetStream, brain commit).
//! - **baseline**: the agent's own account sends a message with a plain PUT,
//!   until the operator's sync shows it: Matrix delivery with nothing of
//!   Nisse's in between.
//!
//! Without `--bench` (as under `cargo test --benches`) it runs 3 of each
//! and prints no verdict. `NISSE_BENCH_MATRIX_COUNT` (default 100) sets the
//! alerts, `NISSE_BENCH_MATRIX_APPROVALS` (default 20) the approvals.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a bench fails by panicking"
)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use nisse_bus::proto::{self, Envelope, OperatorCommand, operator_command};
use nisse_bus::{AgentName, Bus};
use nisse_core::Store;
use nisse_tests::TestNats;
use nisse_tests::synapse::{TestSynapse, percent_encode};

const AGENT: &str = "ops";

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() -> Result<()> {
    let full = std::env::args().any(|a| a == "--bench");
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(run(full))
}

fn percentile(values: &[Duration], p: f64) -> Duration {
    let mut v = values.to_vec();
    v.sort();
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// The operator's view: a `/sync` long-poll loop on its own task, every
/// new timeline event of the room sent on a channel with the moment it
/// arrived.
fn sync_loop(
    base: String,
    token: String,
    room: String,
    shutdown: CancellationToken,
) -> tokio::sync::mpsc::UnboundedReceiver<(Instant, Value)> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let http = reqwest::Client::builder().no_proxy().build().unwrap();
        let mut since: Option<String> = None;
        while !shutdown.is_cancelled() {
            let mut url = format!("{base}/_matrix/client/v3/sync?timeout=10000");
            if let Some(s) = &since {
                url.push_str(&format!("&since={}", percent_encode(s)));
            }
            let Ok(resp) = http.get(&url).bearer_auth(&token).send().await else {
                continue;
            };
            let Ok(bytes) = resp.bytes().await else {
                continue;
            };
            let at = Instant::now();
            let Ok(body) = serde_json::from_slice::<Value>(&bytes) else {
                continue;
            };
            if since.is_some()
                && let Some(events) = body["rooms"]["join"][&room]["timeline"]["events"].as_array()
            {
                for e in events {
                    let _ = tx.send((at, e.clone()));
                }
            }
            since = body["next_batch"].as_str().map(str::to_string);
        }
    });
    rx
}

/// Waits for an event matching `pred` on the operator's sync: when it
/// arrived, and the event.
async fn seen(
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<(Instant, Value)>,
    pred: impl Fn(&Value) -> bool,
) -> Result<(Instant, Value)> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let (at, e) = tokio::time::timeout_at(deadline, rx.recv())
            .await
            .context("not seen within 60 s")?
            .context("the sync loop ended")?;
        if pred(&e) {
            return Ok((at, e));
        }
    }
}

async fn run(full: bool) -> Result<()> {
    let alerts = if full {
        env_usize("NISSE_BENCH_MATRIX_COUNT", 100)
    } else {
        3
    };
    let approvals = if full {
        env_usize("NISSE_BENCH_MATRIX_APPROVALS", 20)
    } else {
        3
    };
    let nats = TestNats::start().await?;
    let synapse = TestSynapse::start().await?;
    let dir = tempfile::tempdir()?;
    let op_user = synapse.register("op", "op-password", false).await?;
    let agent_user = synapse
        .register("nisse-ops", "agent-password", false)
        .await?;
    let operator = synapse.client(&op_user);
    let agent_http = synapse.client(&agent_user);
    let room = operator
        .create_room("ops", &[&agent_user.user_id], false)
        .await?;
    std::fs::write(dir.path().join("pw"), "agent-password")?;

    let agent: AgentName = AGENT.parse()?;
    let bus = Bus::connect(&nats.bus_config(), vec![agent.clone()], "bench-matrix").await?;
    bus.ensure_topology().await?;
    let shutdown = CancellationToken::new();
    let data = dir.path().join("data");
    let db = Store::path_in(&data, AGENT);
    let ops = nisse_ops::Config {
        operators: vec![format!("matrix:{}", op_user.user_id), "cli:bench".into()],
        ..nisse_ops::Config::default()
    };
    let brain = tokio::spawn(nisse_core::reactor::run(
        bus.clone(),
        agent.clone(),
        db.clone(),
        nisse_ops::OpsBrain::new(AGENT, ops),
        nisse_bus::signing::SigningKey::ephemeral(),
        shutdown.clone(),
        tokio::sync::watch::Sender::new(0),
    ));
    // Plans are classified before they are put up.
    let classifier = {
        let (bus, s) = (bus.clone(), shutdown.clone());
        let policy = Arc::new(nisse_policy::Policy::builtin()?);
        tokio::spawn(async move {
            let config = nisse_classifier::Config {
                policy,
                models: Default::default(),
            };
            nisse_classifier::run(nisse_tests::service_context(&bus, config, s)).await
        })
    };
    let bound = nisse_intake_alerts::bind(
        &nisse_intake_alerts::Config {
            listen: "127.0.0.1:0".parse()?,
            agent: AGENT.into(),
            ..Default::default()
        },
        bus.clone(),
        dir.path(),
    )
    .await?;
    let webhook = bound.webhook_url();
    // The token it generated, as Alertmanager would read it.
    let webhook_token = nisse_bus::secret::Secret::File(
        bound
            .token_file()
            .context("the webhook generated no token")?
            .to_path_buf(),
    )
    .read_text()?;
    let intake = tokio::spawn(bound.serve(shutdown.clone()));
    let mut matrix_cfg = nisse_intake_matrix::config::Config {
        homeserver: synapse.base_url().to_string(),
        ..Default::default()
    };
    matrix_cfg.agents.insert(
        AGENT.into(),
        nisse_intake_matrix::config::AgentConfig {
            user_id: agent_user.user_id.clone(),
            password_file: Some(dir.path().join("pw")),
            room: room.clone(),
            ..Default::default()
        },
    );
    let readiness = nisse_bus::service::Readiness::default();
    let matrix = {
        let mut ctx = nisse_tests::service_context(&bus, matrix_cfg, shutdown.clone());
        ctx.data_dir = data.clone();
        ctx.ready = readiness.reporter(nisse_intake_matrix::SERVICE.name);
        tokio::spawn(nisse_intake_matrix::run(ctx))
    };
    tokio::time::timeout(
        Duration::from_secs(60),
        readiness.wait_for(&[nisse_intake_matrix::SERVICE.name.to_string()]),
    )
    .await
    .context("intake-matrix never became ready")?;
    let mut events = sync_loop(
        synapse.base_url().to_string(),
        op_user.access_token.clone(),
        room.clone(),
        shutdown.clone(),
    );
    let http = reqwest::Client::builder().no_proxy().build()?;

    // Alert → thread root.
    let mut to_root = Vec::new();
    let mut roots = Vec::new();
    for n in 1..=(alerts as u64) {
        let body = alert_body(n);
        let t0 = Instant::now();
        let status = http
            .post(&webhook)
            .bearer_auth(&webhook_token)
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await?
            .status();
        ensure!(status.is_success(), "the webhook answered {status}");
        let needle = format!("Work item **#{n}**");
        let (at, root) = seen(&mut events, |e| {
            e["sender"] == agent_user.user_id.as_str()
                && e["content"]["body"]
                    .as_str()
                    .is_some_and(|b| b.contains(&needle))
        })
        .await?;
        to_root.push(at - t0);
        // The root's event id, for the approvals below.
        roots.push(root["event_id"].as_str().unwrap_or_default().to_string());
    }

    // Baseline: Matrix delivery alone, the agent's account sending.
    let mut baseline = Vec::new();
    for i in 0..alerts {
        let text = format!("baseline {i}");
        let t0 = Instant::now();
        agent_http.send_text(&room, &text).await?;
        let (at, _) = seen(&mut events, |e| e["content"]["body"] == text.as_str()).await?;
        baseline.push(at - t0);
    }

    // Approve → recorded.
    let mut to_recorded = Vec::new();
    for (i, root) in roots.iter().take(approvals).enumerate() {
        let number = i as u64 + 1;
        propose(&bus, number).await?;
        let store = wait_store(&db).await?;
        let item = store.find_item(&format!("#{number}"))?.context("no item")?;
        wait_plan(&db, &item.id, |p| {
            p.status == nisse_core::plans::PlanStatus::Up
        })
        .await?;
        wait_delivered(&db, &item.id).await?;
        let t0 = Instant::now();
        operator.send_thread_reply(&room, root, "approve").await?;
        wait_plan(&db, &item.id, |p| p.approved_by.is_some()).await?;
        to_recorded.push(t0.elapsed());
    }

    shutdown.cancel();
    let _ = brain.await;
    let _ = intake.await;
    let _ = matrix.await;
    let _ = classifier.await;

    println!("matrix: {alerts} alerts, {approvals} approvals, one at a time, Synapse on loopback");
    for (name, v) in [
        ("alert → thread root", &to_root),
        ("approve → recorded", &to_recorded),
        ("baseline send → seen", &baseline),
    ] {
        println!(
            "  {name:<22} n={:<4} p50 {:>8.2} ms  p99 {:>8.2} ms",
            v.len(),
            ms(percentile(v, 0.5)),
            ms(percentile(v, 0.99))
        );
    }
    if full {
        let base = percentile(&baseline, 0.5).as_secs_f64();
        println!(
            "  p50 over the baseline: thread root {:.2}x, approval {:.2}x",
            percentile(&to_root, 0.5).as_secs_f64() / base,
            percentile(&to_recorded, 0.5).as_secs_f64() / base
        );
    }
    Ok(())
}

fn alert_body(n: u64) -> Vec<u8> {
    let now = time::OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap();
    serde_json::to_vec(&serde_json::json!({
        "version": "4",
        "groupKey": "{}:{alertname=\"Bench\"}",
        "truncatedAlerts": 0,
        "status": "firing",
        "receiver": "bench",
        "groupLabels": {},
        "commonLabels": {},
        "commonAnnotations": {},
        "externalURL": "http://am",
        "alerts": [{
            "status": "firing",
            "labels": { "alertname": "Bench", "instance": format!("host{n}") },
            "annotations": {},
            "startsAt": now,
            "endsAt": "0001-01-01T00:00:00Z",
            "generatorURL": "",
            "fingerprint": format!("{n:016x}"),
        }],
    }))
    .unwrap()
}

/// Proposes a one-step plan for item `#number` as the CLI would.
async fn propose(bus: &Bus, number: u64) -> Result<()> {
    bus.publish(OperatorCommand {
        envelope: Some(Envelope {
            agent: AGENT.into(),
            actor: Some(proto::Actor {
                kind: proto::ActorKind::Operator as i32,
                id: "bench".into(),
            }),
            message_id: format!("cli:bench:propose:{number}"),
            ..Default::default()
        }),
        channel: "cli".into(),
        work_item: format!("#{number}"),
        command: Some(operator_command::Command::ProposePlan(proto::ProposePlan {
            plan: Some(proto::Plan {
                rationale: String::new(),
                steps: vec![proto::PlannedStep {
                    tool: "shell".into(),
                    target: format!("host{number}"),
                    arguments_json: serde_json::json!({ "command": "systemctl restart caddy" })
                        .to_string(),
                    ..Default::default()
                }],
            }),
        })),
    })
    .await?;
    Ok(())
}

async fn wait_store(db: &std::path::Path) -> Result<Store> {
    for _ in 0..2000 {
        if let Ok(s) = Store::open_read_only(db, AGENT) {
            return Ok(s);
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    anyhow::bail!("the brain's store never appeared")
}

/// Polls the item's log every millisecond until intake-matrix reported
/// its approval request posted: before that a bare `approve` binds
/// nothing.
async fn wait_delivered(db: &std::path::Path, item: &str) -> Result<()> {
    let store = wait_store(db).await?;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if store
            .events(item)?
            .iter()
            .any(|e| e.event.kind() == "approval_delivered")
        {
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "the approval request was never reported posted"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Polls the item's current plan every millisecond until `pred` holds.
async fn wait_plan(
    db: &std::path::Path,
    item: &str,
    pred: impl Fn(&nisse_core::plans::Plan) -> bool,
) -> Result<()> {
    let store = wait_store(db).await?;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if store.plans(item)?.last().is_some_and(&pred) {
            return Ok(());
        }
        ensure!(Instant::now() < deadline, "the plan never got there");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}
