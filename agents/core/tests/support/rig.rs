//! The test rig every brain's tests share: a brain on a real state store,
//! fed messages as the next ones of its stream ([`Harness`]), and the
//! services around it ([`Gates`]): the operator's commands, the real
//! classifier's verdicts (`nisse_classifier::decide` with the built-in
//! policy) and the executor's results. Only the bus is left out.
//!
//! It knows no brain: a crate's tests give it theirs and its agent's name,
//! and keep what is their brain's own (how its alerts look, its settings).
//! nisse-core's tests include this file as `mod rig`, and so do nisse-ops'
//! (`#[path = "../../core/tests/support/rig.rs"]`).

use std::collections::{BTreeSet, HashMap};

use time::OffsetDateTime;
use time::macros::datetime;

use nisse_bus::proto::{
    self, AlertReceived, ClassifyRequest, Envelope, ExecRequest, ExecResult, ExecStatus,
    MatrixEventKind, MatrixEventReceived, OperatorCommand, OperatorReply, ProbeRequest,
    ProbeResult, Tell, operator_command::Command,
};
use nisse_bus::{AnyMessage, SwitchBoard};
use nisse_core::plans::Plan;
use nisse_core::{Brain, Event, Store, WorkItem};
use nisse_policy::Policy;

/// An operator on the allowlists, on the CLI: the one who proposes plans.
pub const OP: &str = "cli:op";
/// Another, in the chat.
pub const OP2: &str = "matrix:@op2:example.org";
/// A second operator on the CLI (commands on the bus come only from
/// operators with NATS credentials of their own).
#[allow(dead_code, reason = "nisse-core's tests use it; nisse-ops' do not")]
pub const OP3: &str = "cli:op3";

/// Minute 0 of every test.
pub const T0: OffsetDateTime = datetime!(2026-11-30 08:00 UTC);

/// `minutes` after [`T0`].
pub fn at(minutes: i64) -> OffsetDateTime {
    T0 + time::Duration::minutes(minutes)
}

/// `seconds` after [`T0`].
#[allow(dead_code, reason = "each crate's tests use a part of the rig")]
pub fn at_secs(seconds: i64) -> OffsetDateTime {
    T0 + time::Duration::seconds(seconds)
}

/// `at` as a protobuf timestamp.
pub fn timestamp(at: OffsetDateTime) -> prost_types::Timestamp {
    std::time::SystemTime::from(at).into()
}

/// Compares `actual` with the committed snapshot `name` in the crate's
/// `tests/snapshots`; with `NISSE_BLESS_SNAPSHOTS=1` it rewrites the
/// snapshot instead.
pub fn snapshot(name: &str, actual: &str) {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/snapshots")
        .join(name);
    if std::env::var_os("NISSE_BLESS_SNAPSHOTS").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (run with NISSE_BLESS_SNAPSHOTS=1 to write it)",
            path.display()
        )
    });
    pretty_assertions::assert_eq!(
        expected,
        actual,
        "the rendered text differs from {}",
        path.display()
    );
}

/// A brain `B` of agent `agent` on a real state store.
pub struct Harness<B: Brain> {
    _dir: tempfile::TempDir,
    pub agent: &'static str,
    pub store: Store,
    /// The key the brain signs with; a replay signs with the same one, so
    /// its outbox matches byte for byte.
    pub signer: nisse_bus::signing::SigningKey,
    pub brain: B,
    /// The stream sequence of the last message applied.
    pub seq: u64,
    /// Every message applied, in order: a recorded stream to replay.
    pub recorded: Vec<(u64, String, OffsetDateTime, AnyMessage)>,
}

impl<B: Brain> Harness<B> {
    /// `brain`, agent `agent`'s, on a new store in a directory of its own.
    pub fn new(agent: &'static str, brain: B) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::open(&Store::path_in(dir.path(), agent), agent).unwrap();
        let signer = nisse_bus::signing::SigningKey::ephemeral();
        store.set_signer(signer.clone());
        // As the reactor does, live and in a rebuild: the brain's switch
        // grace and request deadlines.
        store.set_timing(brain.timing());
        Self {
            _dir: dir,
            signer,
            agent,
            store,
            brain,
            seq: 0,
            recorded: Vec::new(),
        }
    }

    /// Applies `msg` as the next stream message, stored at `at`.
    pub fn apply(&mut self, at: OffsetDateTime, msg: AnyMessage) {
        self.seq += 1;
        let id = nisse_bus::Decode::envelope(&msg).message_id.clone();
        let mut batch = self.store.batch().unwrap();
        let brain = &mut self.brain;
        let subject = msg.subject().unwrap();
        let out = batch
            .apply(self.seq, &subject, &id, at, |txn| brain.apply(txn, &msg))
            .unwrap();
        assert_eq!(out, nisse_core::Applied::Applied);
        batch.commit().unwrap();
        self.recorded.push((self.seq, id, at, msg));
    }

    /// A new store on which `brain` applied every message recorded here,
    /// in order: a rebuild from the stream.
    pub fn replay(&self, brain: B) -> Self {
        let mut fresh = Self::new(self.agent, brain);
        fresh.signer = self.signer.clone();
        fresh.store.set_signer(self.signer.clone());
        for (_, _, at, msg) in self.recorded.clone() {
            fresh.apply(at, msg);
        }
        fresh
    }

    /// The envelope of a message to this agent about `item` (empty: about
    /// no item) from `actor`, a `kind`, created at `at`.
    pub fn envelope(
        &self,
        at: OffsetDateTime,
        item: &str,
        kind: proto::ActorKind,
        actor: &str,
        message_id: String,
    ) -> Envelope {
        Envelope {
            agent: self.agent.into(),
            work_item_id: item.into(),
            actor: Some(proto::Actor {
                kind: kind as i32,
                id: actor.into(),
            }),
            message_id,
            created_at: Some(std::time::SystemTime::from(at).into()),
            ..Default::default()
        }
    }

    /// Applies an alert from Alertmanager `minutes` after T0, as `dress`
    /// finishes it: what its fields hold beyond the status, the labels and
    /// the start is the brain's business.
    pub fn alert_with(
        &mut self,
        minutes: i64,
        status: &str,
        labels: &[(&str, &str)],
        dress: impl FnOnce(&mut AlertReceived),
    ) {
        let at = at(minutes);
        let labels: HashMap<String, String> = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let mut msg = AlertReceived {
            envelope: Some(self.envelope(
                at,
                "",
                proto::ActorKind::External,
                "alertmanager:nisse",
                format!("alert:{}:{status}:{minutes}", self.seq + 1),
            )),
            alert: Some(proto::Alert {
                status: status.into(),
                labels,
                starts_at: Some(std::time::SystemTime::from(at).into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        dress(&mut msg);
        self.apply(at, AnyMessage::InAlert(msg));
    }

    /// A Matrix event from its sender at `minute`, about `item` (empty: in
    /// the room, about no item). Its event id is `$e<minute>` unless it
    /// has one.
    pub fn matrix(&mut self, minute: i64, event: MatrixEventReceived, item: &str) {
        let at = at(minute);
        let event_id = if event.event_id.is_empty() {
            format!("$e{minute}")
        } else {
            event.event_id.clone()
        };
        let msg = MatrixEventReceived {
            envelope: Some(self.envelope(
                at,
                item,
                proto::ActorKind::External,
                &event.sender,
                format!("matrix:{event_id}"),
            )),
            event_id,
            ..event
        };
        self.apply(at, AnyMessage::InMatrix(msg));
    }

    /// The work items, by number.
    pub fn items(&self) -> Vec<WorkItem> {
        let mut items = self.store.items(None).unwrap();
        items.sort_by_key(|i| i.number);
        items
    }

    /// What `pick` takes from the events in `item`'s log, in order.
    pub fn logged<T>(&self, item: &str, pick: impl FnMut(Event) -> Option<T>) -> Vec<T> {
        self.store
            .events(item)
            .unwrap()
            .into_iter()
            .map(|e| e.event)
            .filter_map(pick)
            .collect()
    }

    /// Messages in the outbox of type `M`.
    pub fn emitted<M: prost::Message + prost::Name + Default>(&self) -> Vec<M> {
        self.store
            .outbox()
            .unwrap()
            .iter()
            .filter(|o| o.type_name == M::full_name())
            .map(|o| M::decode(o.payload.as_slice()).unwrap())
            .collect()
    }

    /// What the operator is told, in the outbox.
    pub fn outbound(&self) -> Vec<Tell> {
        self.emitted()
    }
}

/// Time on the stream and the services that answer without an item: the
/// scheduler's ticks and due duties, the prober, the brain's own start,
/// and operator commands about anything.
#[allow(dead_code, reason = "each crate's tests use a part of the rig")]
impl<B: Brain> Harness<B> {
    /// A tick of the agent's clock standing for the instant `at`, applied
    /// at that instant, as the scheduler publishes it.
    pub fn tick(&mut self, at: OffsetDateTime) {
        let due_ms = at.unix_timestamp_nanos() / 1_000_000;
        let msg = proto::Tick {
            envelope: Some(self.envelope(
                at,
                "",
                proto::ActorKind::Service,
                "scheduler",
                format!("tick:{}:{due_ms}", self.agent),
            )),
            due: Some(timestamp(at)),
            interval_ms: 60_000,
            missed: 0,
            late_ms: 0,
        };
        self.apply(at, AnyMessage::Tick(msg));
    }

    /// The scheduler says duty `duty` (of interval `interval_ms`) is due at
    /// `at`.
    pub fn duty_due(&mut self, at: OffsetDateTime, duty: &str, interval_ms: u64) {
        let due_ms = at.unix_timestamp_nanos() / 1_000_000;
        let msg = proto::DutyDue {
            envelope: Some(self.envelope(
                at,
                &nisse_core::requests::duty_item(duty),
                proto::ActorKind::Service,
                "scheduler",
                format!("due:{}:{duty}:{due_ms}", self.agent),
            )),
            duty: duty.into(),
            due: Some(timestamp(at)),
            interval_ms,
            missed: 0,
            late_ms: 0,
        };
        self.apply(at, AnyMessage::DutyDue(msg));
    }

    /// The prober's answer to `request` at `at`: healthy or not, with its
    /// one-line summary and the HTTP status it saw.
    pub fn probe_result(
        &mut self,
        at: OffsetDateTime,
        request: &ProbeRequest,
        healthy: bool,
        summary: &str,
        status_code: Option<u32>,
    ) {
        let item = request
            .envelope
            .as_ref()
            .map(|e| e.work_item_id.clone())
            .unwrap_or_default();
        let msg = ProbeResult {
            envelope: Some(self.envelope(
                at,
                &item,
                proto::ActorKind::Service,
                "prober",
                format!("probe:{}", request.request_id),
            )),
            request_id: request.request_id.clone(),
            duty: request.duty.clone(),
            healthy,
            summary: summary.into(),
            latency_ms: 12,
            status_code,
            days_left: None,
        };
        self.apply(at, AnyMessage::ProbeResult(msg));
    }

    /// The brain tells its own stream it started, as the reactor does at
    /// every start.
    pub fn started(&mut self, at: OffsetDateTime) {
        let store_id = self.store.store_id().unwrap();
        let msg = proto::BrainStarted {
            envelope: Some(self.envelope(
                at,
                "",
                proto::ActorKind::Agent,
                self.agent,
                format!("started:{store_id}:{}", self.seq),
            )),
            store_id,
            applied_sequence: self.seq,
        };
        self.apply(at, AnyMessage::BrainStarted(msg));
    }

    /// An operator command from `who` (`channel:identity`) at `at` about
    /// `work_item` (`#1`; empty for a command about no item): its command
    /// id, which its answer names.
    pub fn operator(
        &mut self,
        at: OffsetDateTime,
        who: &str,
        work_item: &str,
        command: Command,
    ) -> String {
        let (channel, id) = who.split_once(':').unwrap();
        let item = self
            .store
            .items(None)
            .unwrap()
            .into_iter()
            .find(|i| format!("#{}", i.number) == work_item)
            .map(|i| i.id)
            .unwrap_or_default();
        let command_id = format!("command:{}", self.seq + 1);
        let msg = OperatorCommand {
            envelope: Some(self.envelope(
                at,
                &item,
                proto::ActorKind::Operator,
                id,
                command_id.clone(),
            )),
            channel: channel.into(),
            work_item: work_item.into(),
            command: Some(command),
        };
        self.apply(at, AnyMessage::InOperator(msg));
        command_id
    }

    /// The brain's answer to the command `command_id`.
    pub fn reply(&self, command_id: &str) -> OperatorReply {
        let mut replies: Vec<OperatorReply> = self
            .emitted::<OperatorReply>()
            .into_iter()
            .filter(|r| r.command_id == command_id)
            .collect();
        assert_eq!(replies.len(), 1, "one answer to {command_id}");
        replies.remove(0)
    }
}

#[allow(dead_code, reason = "nisse-core's tests talk so; nisse-ops' do not")]
impl<B: Brain> Harness<B> {
    /// A Matrix message from `sender` at `minute`, about `item` (empty: in
    /// the room, about no item).
    pub fn said(&mut self, minute: i64, sender: &str, body: &str, item: &str) {
        self.matrix(
            minute,
            MatrixEventReceived {
                sender: sender.into(),
                kind: MatrixEventKind::Message as i32,
                body: body.into(),
                ..Default::default()
            },
            item,
        );
    }

    /// intake-matrix's word, at `minute`, that every approval request in
    /// the outbox it had not posted yet is in the room: what a bare
    /// `approve` in Matrix may bind. Returns how many it posted.
    pub fn posted(&mut self, minute: i64) -> usize {
        let requests: Vec<Tell> = self
            .outbound()
            .into_iter()
            .filter(|t| t.kind == proto::TellKind::ApprovalRequest as i32)
            .filter(|t| {
                let id = &t.envelope.as_ref().unwrap().message_id;
                !self.recorded.iter().any(|(_, _, _, m)| {
                    matches!(m, AnyMessage::TellPosted(p) if &p.tell_message_id == id)
                })
            })
            .collect();
        for tell in &requests {
            let env = tell.envelope.clone().unwrap();
            let msg = proto::TellPosted {
                envelope: Some(self.envelope(
                    at(minute),
                    &env.work_item_id,
                    proto::ActorKind::Service,
                    "intake-matrix",
                    format!("posted:matrix:{}", env.message_id),
                )),
                channel: "matrix".into(),
                tell_message_id: env.message_id.clone(),
                plan_revision: tell.plan_revision,
                posted_id: format!("$posted{}", self.seq + 1),
            };
            self.apply(at(minute), AnyMessage::TellPosted(msg));
        }
        requests.len()
    }

    /// A reaction from `sender` at `minute` to the approval request of
    /// `revision` on `item`.
    pub fn reacted(&mut self, minute: i64, sender: &str, key: &str, item: &str, revision: u32) {
        self.matrix(
            minute,
            MatrixEventReceived {
                sender: sender.into(),
                kind: MatrixEventKind::Reaction as i32,
                reaction_key: key.into(),
                reacted_plan_revision: revision,
                ..Default::default()
            },
            item,
        );
    }
}

/// A brain with the services around it, about its first work item.
pub struct Gates<B: Brain> {
    pub h: Harness<B>,
    policy: Policy,
    /// The switch board the classifier judges with.
    pub board: SwitchBoard,
    answered: BTreeSet<String>,
    commands: u64,
}

impl<B: Brain> Gates<B> {
    /// The services around `h`'s brain, as it is.
    pub fn around(h: Harness<B>) -> Self {
        Self {
            h,
            policy: Policy::builtin().unwrap(),
            board: SwitchBoard::default(),
            answered: BTreeSet::new(),
            commands: 0,
        }
    }

    /// The same services, the classifier judging with `policy` (an
    /// agent's build hosts added to the built-in one).
    #[allow(dead_code, reason = "nisse-dev's tests use it")]
    pub fn with_policy(mut self, policy: Policy) -> Self {
        self.policy = policy;
        self
    }

    /// The first work item.
    pub fn item(&self) -> WorkItem {
        self.h.items().remove(0)
    }

    /// The envelope of a message about the item from `actor`, a `kind`,
    /// created at `minute`.
    pub fn envelope(
        &self,
        minute: i64,
        kind: proto::ActorKind,
        actor: &str,
        message_id: String,
    ) -> Envelope {
        let item = self.item().id;
        self.h.envelope(at(minute), &item, kind, actor, message_id)
    }

    /// An operator command from `who` (`channel:identity`) at `minute`,
    /// about item #1.
    pub fn command(&mut self, minute: i64, who: &str, command: Command) {
        self.commands += 1;
        let (channel, id) = who.split_once(':').unwrap();
        let msg = OperatorCommand {
            envelope: Some(self.envelope(
                minute,
                proto::ActorKind::Operator,
                id,
                format!("cmd:{}", self.commands),
            )),
            channel: channel.into(),
            work_item: "#1".into(),
            command: Some(command),
        };
        self.h.apply(at(minute), AnyMessage::InOperator(msg));
    }

    /// The operator proposes a plan of shell `(target, command)` steps.
    pub fn propose(&mut self, minute: i64, steps: &[(&str, &str)]) {
        self.propose_steps(minute, steps.iter().map(|(t, c)| step(t, c)).collect());
    }

    /// The operator proposes a plan of `steps`.
    pub fn propose_steps(&mut self, minute: i64, steps: Vec<proto::PlannedStep>) {
        self.command(
            minute,
            OP,
            Command::ProposePlan(proto::ProposePlan {
                plan: Some(proto::Plan {
                    rationale: "free the disk".into(),
                    steps,
                }),
            }),
        );
    }

    /// `who` approves `revision` (0: the one up).
    pub fn approve(&mut self, minute: i64, who: &str, revision: u32) {
        self.approve_confirming(minute, who, revision, "");
    }

    /// `who` approves `revision` (0: the one up), naming its destructive
    /// steps back with `confirm` (`#1 step 2`).
    pub fn approve_confirming(&mut self, minute: i64, who: &str, revision: u32, confirm: &str) {
        let approve = proto::Approve {
            revision,
            confirm: confirm.into(),
        };
        self.command(minute, who, Command::Approve(approve));
    }

    /// Answers every classify request not answered yet, as the classifier
    /// would with the current switch board, at `minute`.
    pub fn classify(&mut self, minute: i64) -> usize {
        let requests: Vec<ClassifyRequest> = self
            .h
            .emitted::<ClassifyRequest>()
            .into_iter()
            .filter(|r| !self.answered.contains(&r.request_id))
            .collect();
        for r in &requests {
            self.verdict(minute, r);
        }
        requests.len()
    }

    /// Answers `request` as the classifier would with the current switch
    /// board, at `minute`, whether or not it was answered before.
    pub fn verdict(&mut self, minute: i64, request: &ClassifyRequest) {
        self.answered.insert(request.request_id.clone());
        let mut verdict = nisse_classifier::decide(&self.policy, request, Ok(self.board.clone()));
        verdict.envelope.as_mut().unwrap().created_at = Some(timestamp(at(minute)));
        self.h
            .apply(at(minute), AnyMessage::ClassifyVerdict(verdict));
    }

    /// The execution requests in the outbox.
    pub fn exec_requests(&self) -> Vec<ExecRequest> {
        self.h.emitted()
    }

    /// The executor's answer to `request_id`.
    pub fn result(
        &mut self,
        minute: i64,
        request_id: &str,
        status: ExecStatus,
        exit: i32,
        stdout: &str,
    ) {
        let msg = ExecResult {
            envelope: Some(self.envelope(
                minute,
                proto::ActorKind::Service,
                "executor",
                format!("result:{request_id}"),
            )),
            request_id: request_id.into(),
            status: status as i32,
            exit_code: exit,
            stdout: stdout.as_bytes().to_vec(),
            ..Default::default()
        };
        self.h.apply(at(minute), AnyMessage::ExecResult(msg));
    }

    /// The executor's answer to `request`, about whatever it was about
    /// (a work item, or a duty).
    pub fn answer(
        &mut self,
        minute: i64,
        request: &ExecRequest,
        status: ExecStatus,
        exit: i32,
        stdout: &str,
    ) {
        let item = request
            .envelope
            .as_ref()
            .map(|e| e.work_item_id.clone())
            .unwrap_or_default();
        let msg = ExecResult {
            envelope: Some(self.h.envelope(
                at(minute),
                &item,
                proto::ActorKind::Service,
                "executor",
                format!("result:{}", request.request_id),
            )),
            request_id: request.request_id.clone(),
            status: status as i32,
            exit_code: exit,
            stdout: stdout.as_bytes().to_vec(),
            ..Default::default()
        };
        self.h.apply(at(minute), AnyMessage::ExecResult(msg));
    }

    /// The brain's answer to the last operator command sent through
    /// [`Gates::command`].
    #[allow(dead_code, reason = "nisse-core's tests use it; nisse-ops' do not")]
    pub fn reply(&self) -> OperatorReply {
        self.h.reply(&format!("cmd:{}", self.commands))
    }

    /// The item's plans, oldest first.
    pub fn plans(&self) -> Vec<Plan> {
        self.h.store.plans(&self.item().id).unwrap()
    }

    /// The item's newest plan.
    pub fn current(&self) -> Plan {
        self.plans().pop().unwrap()
    }
}

#[allow(dead_code, reason = "nisse-core's tests use these; nisse-ops' do not")]
impl<B: Brain> Gates<B> {
    /// `who` abandons the item, noting `note`.
    pub fn abandon(&mut self, minute: i64, who: &str, note: &str) {
        let note = note.into();
        self.command(minute, who, Command::Abandon(proto::Abandon { note }));
    }

    /// The kinds of the events in the item's log, in order.
    pub fn kinds(&self) -> Vec<String> {
        self.h
            .logged(&self.item().id, |e| Some(e.kind().to_string()))
    }

    /// How many events of `kind` the item's log holds.
    pub fn count(&self, kind: &str) -> usize {
        self.kinds().iter().filter(|k| *k == kind).count()
    }

    /// The reasons of the decisions refused, in order.
    pub fn refusals(&self) -> Vec<String> {
        self.h.logged(&self.item().id, |e| match e {
            Event::DecisionRefused { reason, .. } => Some(reason),
            _ => None,
        })
    }
}

/// A plan step running `command` on `target` in a shell.
pub fn step(target: &str, command: &str) -> proto::PlannedStep {
    let action = nisse_policy::Action::shell(target, command);
    proto::PlannedStep {
        tool: action.tool,
        target: action.target,
        arguments_json: action.arguments,
        ..Default::default()
    }
}

/// A step's check: `command` exits `exit_code` and prints `contains`.
#[allow(
    dead_code,
    reason = "nisse-core's tests check steps; nisse-ops' do not"
)]
pub fn check(command: &str, exit_code: i32, contains: &str) -> Option<proto::StepCheck> {
    Some(proto::StepCheck {
        command: command.into(),
        exit_code,
        output_contains: contains.into(),
        ..Default::default()
    })
}
