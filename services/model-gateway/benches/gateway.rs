//! `cargo bench -p nisse-model-gateway --bench gateway`: what the gateway
//! adds to one model call, against a direct HTTP call to the same server
//! measured in the same run.
//!
//! One `nats-server -js` (topology ensured) and one scripted
//! OpenAI-compatible server (`nisse_tests::model::ScriptedModel`, which
//! answers at once) on loopback. Cases, each a sequence of calls, one at a
//! time, alternating in every round:
//!
//! - direct: reqwest POSTs the body the gateway would send and parses the
//!   JSON answer — the floor any client pays;
//! - gateway: `Gateway::complete` for a request without a work item: role
//!   resolution, the body, the HTTP call, reply validation, and the
//!   capture published on `model.capture` with its JetStream ack;
//! - gateway + budget: the same for a work item, so also the budget check
//!   and count (a read and a compare-and-set in the usage bucket) before
//!   the call and the token update after it.
//!
//! Reported per case: p50 and p99 of the per-call latency, and the
//! gateway's p50/p99 as a ratio of the direct call's.
//!
//! Without `--bench` (as under `cargo test --benches`) it runs a few calls
//! as a smoke test. Environment: `NISSE_BENCH_GATEWAY_CALLS` (calls per
//! case and round, default 2000), `NISSE_BENCH_GATEWAY_ROUNDS` (default 3).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a benchmark fails by panicking"
)]

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use nisse_bus::proto::{ChatMessage, ChatRole, Envelope, ModelRequest, model_response::Outcome};
use nisse_model_gateway::Gateway;
use nisse_models::ModelsConfig;
use nisse_tests::TestNats;
use nisse_tests::model::{Reply, ScriptedModel};

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn request(n: usize, work_item: &str) -> ModelRequest {
    ModelRequest {
        envelope: Some(Envelope {
            agent: "ops".into(),
            work_item_id: work_item.into(),
            message_id: format!("model:bench-{n}"),
            ..Default::default()
        }),
        request_id: format!("bench-{n}"),
        role: "driver".into(),
        messages: vec![
            ChatMessage {
                role: ChatRole::System as i32,
                content: "You operate a homelab. Answer briefly.".into(),
                ..Default::default()
            },
            ChatMessage {
                role: ChatRole::User as i32,
                content: "Pool tank on nas is 95% full. What do you check first?".into(),
                ..Default::default()
            },
        ],
        ..Default::default()
    }
}

#[derive(Default)]
struct Case {
    name: &'static str,
    samples: Vec<Duration>,
}

impl Case {
    fn p(&mut self, p: f64) -> Duration {
        self.samples.sort_unstable();
        percentile(&self.samples, p)
    }
}

fn main() {
    let bench = std::env::args().any(|a| a == "--bench");
    let (calls, rounds) = if bench {
        (
            env_or("NISSE_BENCH_GATEWAY_CALLS", 2000),
            env_or("NISSE_BENCH_GATEWAY_ROUNDS", 3),
        )
    } else {
        (20, 1)
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let nats = TestNats::start().await.unwrap();
        let bus = nats.bus(&["ops"]).await.unwrap();
        bus.ensure_topology().await.unwrap();
        let model = ScriptedModel::start().await.unwrap();
        let config: ModelsConfig = toml::from_str(&format!(
            "endpoint = \"{}\"\nroles = {{ driver = \"local\" }}\n[models.local]\nupstream = \"qwen3:8b\"\n[budgets.driver]\ncalls = 1000000000\ntokens = 1000000000000\n",
            model.base_url()
        ))
        .unwrap();
        let gateway = Gateway::new(config, bus.clone()).unwrap();
        let http = reqwest::Client::new();
        let url = format!("{}/chat/completions", model.base_url());

        let mut direct = Case { name: "direct reqwest", ..Default::default() };
        let mut plain = Case { name: "gateway", ..Default::default() };
        let mut budgeted = Case { name: "gateway + budget", ..Default::default() };
        let mut n = 0usize;
        // A warm-up of each, not measured: connections, the bucket, JIT-free
        // but cache-cold paths.
        let warmup = calls.min(200);
        for round in 0..=rounds {
            let count = if round == 0 { warmup } else { calls };
            model.push((0..count * 3).map(|i| Reply::Text(format!("Check `zpool list` first ({i})."))));
            // Alternate which case goes first.
            for slot in 0..3 {
                let which = (slot + round) % 3;
                for _ in 0..count {
                    n += 1;
                    let began = Instant::now();
                    match which {
                        0 => {
                            let body = json!({
                                "model": "qwen3:8b",
                                "messages": [
                                    { "role": "system", "content": "You operate a homelab. Answer briefly." },
                                    { "role": "user", "content": "Pool tank on nas is 95% full. What do you check first?" },
                                ],
                                "max_tokens": 1024,
                            });
                            let response = http
                                .post(&url)
                                .header("content-type", "application/json")
                                .body(body.to_string())
                                .send()
                                .await
                                .unwrap();
                            assert!(response.status().is_success());
                            let bytes = response.bytes().await.unwrap();
                            let value: Value = serde_json::from_slice(&bytes).unwrap();
                            assert!(value["choices"][0]["message"]["content"].is_string());
                        }
                        1 => {
                            let r = gateway.complete(&nisse_tests::ops(), &request(n, ""), "brain").await;
                            assert!(matches!(r.outcome, Some(Outcome::Reply(_))), "{r:?}");
                        }
                        _ => {
                            let item = format!("wi-{}", n % 16);
                            let r = gateway.complete(&nisse_tests::ops(), &request(n, &item), "brain").await;
                            assert!(matches!(r.outcome, Some(Outcome::Reply(_))), "{r:?}");
                        }
                    }
                    let took = began.elapsed();
                    if round > 0 {
                        [&mut direct, &mut plain, &mut budgeted][which].samples.push(took);
                    }
                }
            }
        }
        let (d50, d99) = (direct.p(0.50), direct.p(0.99));
        println!(
            "model gateway: {} calls per case ({} rounds of {calls}), one at a time, loopback",
            direct.samples.len(),
            rounds
        );
        println!("{:<18} {:>10} {:>10} {:>10} {:>10}", "case", "p50", "p99", "p50 ×", "p99 ×");
        for case in [&mut direct, &mut plain, &mut budgeted] {
            let (p50, p99) = (case.p(0.50), case.p(0.99));
            println!(
                "{:<18} {:>10.3?} {:>10.3?} {:>10.2} {:>10.2}",
                case.name,
                p50,
                p99,
                p50.as_secs_f64() / d50.as_secs_f64(),
                p99.as_secs_f64() / d99.as_secs_f64(),
            );
        }
        if bench {
            println!(
                "gateway overhead at p50: {:.3?} without a work item, {:.3?} with its budget",
                plain.p(0.50).saturating_sub(d50),
                budgeted.p(0.50).saturating_sub(d50)
            );
        }
    });
}
