//! Brain turns per second when a recorded model-driven conversation is
//! replayed into a fresh store (what `nisse replay --rebuild` and a
//! restarted brain do), against the store's own floor measured in the same
//! run: the same messages applied by a brain that does nothing, so the
//! ratio is what the ops brain and its agent loop (context rendering,
//! tool calls through the gates, plans) cost on top of committing the
//! messages and their sequence; and against the same stream applied by the
//! ops brain without models (the loop off: alerts, plans and gates only),
//! so the first ratio is the loop's own cost.
//!
//! The conversation is generated here, deterministically, the way the
//! services would answer: per work item an alert, a read-only command (the
//! real classifier's verdict, the executor's result), a refused change, a
//! note, a plan with its approval and its step, and `finish`. The vault
//! reader answers every query (the recall each item's first turn waits
//! for, the procedures its verdicts' rules recall) with nothing found: the
//! bench's vault is empty. Items follow one another until the log holds
//! 1,000 events. The brain's own outputs are part of the recording, as
//! they are of the stream.
//!
//! `cargo bench -p nisse-ops --bench replay`; `NISSE_BENCH_REPLAY_ROUNDS`
//! (default 5). Under `cargo test --benches` it runs one round.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "a benchmark")]

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use serde_json::{Value, json};
use time::OffsetDateTime;

use nisse_bus::proto::{
    self, AlertReceived, Envelope, ExecRequest, ExecResult, ExecStatus, ModelReply, ModelRequest,
    ModelResponse, OperatorCommand, ToolCall, VaultFound, VaultQuery, model_response::Outcome,
    operator_command::Command,
};
use nisse_bus::{AnyMessage, Decode as _, SubjectKind, SwitchBoard};
use nisse_core::{Brain, Store, StoreError, Txn};
use nisse_models::{ModelEntry, ModelsConfig, Role};
use nisse_ops::{Config, OpsBrain};
use nisse_policy::Policy;

const EVENTS: usize = 1000;

fn config() -> Config {
    Config {
        operators: vec!["cli:op".into()],
        ..Config::default()
    }
}

fn models() -> ModelsConfig {
    ModelsConfig {
        roles: BTreeMap::from([(Role::Driver, "local".to_string())]),
        models: BTreeMap::from([("local".to_string(), ModelEntry::default())]),
        ..ModelsConfig::default()
    }
}

fn env(
    id: String,
    item: &str,
    at: OffsetDateTime,
    kind: proto::ActorKind,
    actor: &str,
) -> Envelope {
    Envelope {
        agent: "ops".into(),
        work_item_id: item.into(),
        actor: Some(proto::Actor {
            kind: kind as i32,
            id: actor.into(),
        }),
        message_id: id,
        created_at: Some(std::time::SystemTime::from(at).into()),
        ..Default::default()
    }
}

/// Records a conversation by playing the services' part.
struct Recorder {
    _dir: tempfile::TempDir,
    store: Store,
    brain: OpsBrain,
    policy: Policy,
    seq: u64,
    at: OffsetDateTime,
    recorded: Vec<(String, OffsetDateTime, AnyMessage)>,
    turns: u64,
}

impl Recorder {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&Store::path_in(dir.path(), "ops"), "ops").unwrap();
        Self {
            _dir: dir,
            store,
            brain: OpsBrain::new("ops", config()).with_models(models()),
            policy: Policy::builtin().unwrap(),
            seq: 0,
            at: OffsetDateTime::from_unix_timestamp(1_790_000_000).unwrap(),
            recorded: Vec::new(),
            turns: 0,
        }
    }

    /// Applies `msg`, then the brain's outputs as they come back from the
    /// stream; returns the outputs.
    fn apply(&mut self, msg: AnyMessage) -> Vec<AnyMessage> {
        self.at += time::Duration::seconds(1);
        let mut queue = vec![msg];
        let mut outputs = Vec::new();
        while let Some(msg) = queue.pop() {
            self.seq += 1;
            let id = msg.envelope().message_id.clone();
            let mut batch = self.store.batch().unwrap();
            let brain = &mut self.brain;
            let subject = msg.subject().unwrap();
            batch
                .apply(self.seq, &subject, &id, self.at, |txn| {
                    brain.apply(txn, &msg)
                })
                .unwrap();
            let emitted = batch.commit().unwrap();
            self.recorded.push((id, self.at, msg));
            let mut next: Vec<AnyMessage> = emitted
                .into_iter()
                .map(|o| {
                    let kind = SubjectKind::ALL
                        .into_iter()
                        .find(|k| AnyMessage::type_name(*k) == o.type_name)
                        .unwrap();
                    <AnyMessage as nisse_bus::Decode>::decode(kind, &o.payload).unwrap()
                })
                .collect();
            outputs.extend(next.iter().cloned());
            next.reverse();
            queue.extend(next);
        }
        outputs
    }

    fn events(&self) -> usize {
        self.store.snapshot().unwrap().events.len()
    }

    /// Answers what `outputs` asked of the services, until the brain asks
    /// the model again (returned) or nothing is left to answer.
    fn serve(&mut self, mut outputs: Vec<AnyMessage>) -> Option<ModelRequest> {
        loop {
            let mut next = Vec::new();
            let mut model = None;
            for out in outputs {
                match out {
                    AnyMessage::ModelReq(r) => model = Some(r),
                    AnyMessage::ClassifyReq(r) => {
                        let v =
                            nisse_classifier::decide(&self.policy, &r, Ok(SwitchBoard::default()));
                        next.extend(self.apply(AnyMessage::ClassifyVerdict(v)));
                    }
                    AnyMessage::ExecReq(r) => next.extend(self.exec(&r)),
                    AnyMessage::VaultQuery(q) => next.extend(self.found(&q)),
                    AnyMessage::Tell(m) if m.plan_revision > 0 => {
                        let item = m.envelope.as_ref().unwrap().work_item_id.clone();
                        let at = self.at;
                        let cmd = OperatorCommand {
                            envelope: Some(env(
                                format!("cmd:{item}:{}", m.plan_revision),
                                &item,
                                at,
                                proto::ActorKind::Operator,
                                "op",
                            )),
                            channel: "cli".into(),
                            work_item: item,
                            // Its one step vacuums the journal, which
                            // is destructive: named back, as asked.
                            command: Some(Command::Approve(proto::Approve {
                                revision: m.plan_revision,
                                confirm: format!("#{} step 1", m.item_number),
                            })),
                        };
                        next.extend(self.apply(AnyMessage::InOperator(cmd)));
                    }
                    // Host bindings (`out.exec.bind`, sent before each
                    // execution request) are for the executor
                    // and want no answer. Vault writes (the memory's
                    // notes) hold up no turn, so the writer's answers are
                    // left out of the recording. The other Tells are for
                    // the operator to read.
                    _ => {}
                }
            }
            if model.is_some() || next.is_empty() {
                return model;
            }
            outputs = next;
        }
    }

    fn exec(&mut self, r: &ExecRequest) -> Vec<AnyMessage> {
        let item = r.envelope.as_ref().unwrap().work_item_id.clone();
        let at = self.at;
        let result = ExecResult {
            envelope: Some(env(
                format!("result:{}", r.request_id),
                &item,
                at,
                proto::ActorKind::Service,
                "executor",
            )),
            request_id: r.request_id.clone(),
            status: ExecStatus::Completed as i32,
            exit_code: 0,
            stdout: b"Filesystem Size Used Avail Use% Mounted on\n/dev/sda1 100G 91G 9G 91% /srv\n"
                .to_vec(),
            ..Default::default()
        };
        self.apply(AnyMessage::ExecResult(result))
    }

    /// The vault reader's answer to `q`, as the real reader sends it (to
    /// the query's item, with the id `found:<request id>`): nothing found.
    /// The bench's vault is empty, so every recall and search comes back
    /// with no notes; the brain records the answer, and the item's first
    /// turn, which waits for its recall, starts.
    fn found(&mut self, q: &VaultQuery) -> Vec<AnyMessage> {
        let item = q.envelope.as_ref().unwrap().work_item_id.clone();
        let at = self.at;
        let found = VaultFound {
            envelope: Some(env(
                format!("found:{}", q.request_id),
                &item,
                at,
                proto::ActorKind::Service,
                "vault-reader",
            )),
            request_id: q.request_id.clone(),
            ..Default::default()
        };
        self.apply(AnyMessage::VaultFound(found))
    }

    fn respond(&mut self, request: &ModelRequest, tool: &str, args: Value) -> Vec<AnyMessage> {
        self.turns += 1;
        let item = request.envelope.as_ref().unwrap().work_item_id.clone();
        let at = self.at;
        let response = ModelResponse {
            envelope: Some(env(
                format!("resp:{}", request.request_id),
                &item,
                at,
                proto::ActorKind::Service,
                "model-gateway",
            )),
            request_id: request.request_id.clone(),
            outcome: Some(Outcome::Reply(ModelReply {
                content: "Looking at the disk first.".into(),
                tool_calls: vec![ToolCall {
                    id: format!("call-{}", self.turns),
                    name: tool.into(),
                    arguments_json: args.to_string(),
                }],
                finish_reason: "tool_calls".into(),
            })),
            model: request.model.clone(),
            usage: Some(proto::Usage {
                prompt_tokens: 900,
                completion_tokens: 40,
            }),
            ..Default::default()
        };
        self.apply(AnyMessage::ModelResp(response))
    }

    /// One work item's whole conversation.
    fn conversation(&mut self, n: usize) {
        let host = format!("nas{n}");
        let at = self.at;
        let alert = AlertReceived {
            envelope: Some(env(
                format!("alert:{n}"),
                "",
                at,
                proto::ActorKind::External,
                "alertmanager:bench",
            )),
            payload_version: "4".into(),
            receiver: "bench".into(),
            group_status: "firing".into(),
            alert: Some(proto::Alert {
                status: "firing".into(),
                labels: HashMap::from([
                    ("alertname".to_string(), "DiskFull".to_string()),
                    ("instance".to_string(), format!("{host}:9100")),
                ]),
                annotations: HashMap::from([("summary".to_string(), "disk above 90%".to_string())]),
                ..Default::default()
            }),
            ..Default::default()
        };
        let out = self.apply(AnyMessage::InAlert(alert));
        let script: [(&str, Value); 5] = [
            ("shell", json!({ "host": host, "command": "df -h /srv" })),
            (
                "shell",
                json!({ "host": host, "command": "rm -rf /srv/cache" }),
            ),
            ("note", json!({ "text": "the cache fills /srv" })),
            (
                "submit_plan",
                json!({ "rationale": "vacuum the journal", "steps": [{ "host": host, "command": "journalctl --vacuum-size=100M" }] }),
            ),
            (
                "finish",
                json!({ "done": "vacuumed", "verified": "df", "left_open": "none" }),
            ),
        ];
        let mut request = self.serve(out).expect("the alert starts a turn");
        for (i, (tool, args)) in script.into_iter().enumerate() {
            let out = self.respond(&request, tool, args);
            match self.serve(out) {
                Some(r) => request = r,
                None => assert_eq!(i, 4, "turn {i} ended the conversation early"),
            }
        }
    }
}

/// A brain that applies nothing: the store's floor.
struct Nothing;

impl Brain for Nothing {
    fn apply(&mut self, _: &mut Txn<'_, '_>, _: &AnyMessage) -> Result<(), StoreError> {
        Ok(())
    }
}

/// Applies `recorded` into a fresh store in batches of 512 (as `rebuild`
/// does); returns the seconds it took.
fn replay<B: Brain>(recorded: &[(String, OffsetDateTime, AnyMessage)], mut brain: B) -> f64 {
    let dir = tempfile::tempdir().unwrap();
    let mut store = Store::open(&Store::path_in(dir.path(), "ops"), "ops").unwrap();
    let start = Instant::now();
    for (chunk_no, chunk) in recorded.chunks(512).enumerate() {
        let mut batch = store.batch().unwrap();
        for (i, (id, at, msg)) in chunk.iter().enumerate() {
            let seq = (chunk_no * 512 + i + 1) as u64;
            let subject = msg.subject().unwrap();
            batch
                .apply(seq, &subject, id, *at, |txn| brain.apply(txn, msg))
                .unwrap();
        }
        batch.commit().unwrap();
    }
    start.elapsed().as_secs_f64()
}

fn main() {
    let benching = std::env::args().any(|a| a == "--bench");
    let rounds: usize = if benching {
        std::env::var("NISSE_BENCH_REPLAY_ROUNDS")
            .ok()
            .and_then(|r| r.parse().ok())
            .unwrap_or(5)
    } else {
        1
    };
    let mut rec = Recorder::new();
    let mut items = 0;
    while rec.events() < EVENTS {
        rec.conversation(items);
        items += 1;
    }
    let (events, messages, turns) = (rec.events(), rec.recorded.len(), rec.turns + items as u64);
    println!(
        "recorded: {items} work items, {events} events, {messages} stream messages, {turns} model turns"
    );
    let mut ratios: Vec<(f64, f64)> = Vec::new();
    let mut rates = Vec::new();
    for round in 0..rounds {
        let floor = replay(&rec.recorded, Nothing);
        let no_loop = replay(&rec.recorded, OpsBrain::new("ops", config()));
        let brain = replay(
            &rec.recorded,
            OpsBrain::new("ops", config()).with_models(models()),
        );
        let rate = turns as f64 / brain;
        println!(
            "round {}: ops brain {:.1} ms ({:.0} turns/s, {:.0} messages/s); without the loop {:.1} ms; store floor {:.1} ms; ratios {:.2} / {:.2}",
            round + 1,
            brain * 1e3,
            rate,
            messages as f64 / brain,
            no_loop * 1e3,
            floor * 1e3,
            brain / no_loop,
            brain / floor
        );
        ratios.push((brain / no_loop, brain / floor));
        rates.push(rate);
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    println!(
        "median: {:.0} turns/s; {:.2}x the same stream without the loop, {:.2}x the store floor",
        median(rates),
        median(ratios.iter().map(|r| r.0).collect()),
        median(ratios.iter().map(|r| r.1).collect())
    );
}
