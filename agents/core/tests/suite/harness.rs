//! A second brain on a real state store, and the services around it: the
//! real classifier's verdicts (`nisse_classifier::decide` with the built-in
//! policy), the executor's results and the operator's commands, given as
//! they would come through the stream. Only the bus is left out.

use std::collections::{BTreeSet, HashMap};

use time::OffsetDateTime;
use time::macros::datetime;

use nisse_bus::proto::{
    self, AlertReceived, ClassifyRequest, Envelope, ExecRequest, ExecResult, ExecStatus,
    MatrixEventKind, MatrixEventReceived, MatrixOutbound, OperatorCommand,
    operator_command::Command,
};
use nisse_bus::{AnyMessage, SwitchBoard};
use nisse_core::markdown::code;
use nisse_core::plans::Plan;
use nisse_core::{
    Actor, AgentBrain, Brain, BrainSettings, Duties, Event, NewItem, Store, StoreError, Txn,
    WorkItem,
};
use nisse_policy::Policy;

/// The second brain's agent.
pub(super) const AGENT: &str = "desk";
/// Operators on its allowlist.
pub(super) const OP: &str = "cli:op";
pub(super) const OP2: &str = "matrix:@op2:example.org";

const T0: OffsetDateTime = datetime!(2026-11-30 08:00 UTC);

pub(super) const CPU: &[(&str, &str)] = &[
    ("alertname", "HighCPU"),
    ("instance", "host1"),
    ("severity", "warning"),
];

/// A second brain's duties: a firing alert opens a work item, and `use
/// <project>` is only noted. That is all it implements; the operator's
/// commands and chat, plans, approvals, the gates and the loop are
/// nisse-core's.
#[derive(Debug, Clone, Default)]
pub(super) struct Desk;

impl Duties for Desk {
    fn apply(
        &mut self,
        brain: &BrainSettings,
        txn: &mut Txn<'_, '_>,
        message: &AnyMessage,
    ) -> Result<(), StoreError> {
        let AnyMessage::InAlert(msg) = message else {
            return Ok(());
        };
        let alert = msg.alert.clone().unwrap_or_default();
        if alert.status != "firing" {
            return Ok(());
        }
        let env = msg.envelope.clone().unwrap_or_default();
        txn.open_item(
            NewItem {
                title: alert.labels.get("alertname").cloned().unwrap_or_default(),
                scope: "desk".into(),
                source: "alertmanager".into(),
                fingerprint: None,
                external_link: None,
                severity: None,
                priority: 0,
                id_seed: env.message_id,
            },
            &Actor::agent(&brain.agent),
        )?;
        Ok(())
    }

    fn use_project(
        &mut self,
        _brain: &BrainSettings,
        _txn: &mut Txn<'_, '_>,
        _item: &WorkItem,
        project: &str,
    ) -> Result<String, StoreError> {
        Ok(format!("Noted: `{}`.", code(project)))
    }
}

/// The second brain's settings, with `OP` and `OP2` as its operators.
pub(super) fn settings() -> BrainSettings {
    BrainSettings {
        operators: vec![OP.into(), OP2.into()],
        ..BrainSettings::new(AGENT)
    }
}

pub(super) struct Harness {
    _dir: tempfile::TempDir,
    pub(super) store: Store,
    brain: AgentBrain<Desk>,
    seq: u64,
    /// Every message applied, in order: a recorded stream to replay.
    pub(super) recorded: Vec<(u64, String, OffsetDateTime, AnyMessage)>,
}

impl Harness {
    pub(super) fn new(settings: BrainSettings) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&Store::path_in(dir.path(), AGENT), AGENT).unwrap();
        Self {
            _dir: dir,
            store,
            brain: AgentBrain::new(settings, Desk),
            seq: 0,
            recorded: Vec::new(),
        }
    }

    /// Applies `msg` as the next stream message, stored at `at`.
    pub(super) fn apply(&mut self, at: OffsetDateTime, msg: AnyMessage) {
        self.seq += 1;
        let id = nisse_bus::Decode::envelope(&msg).message_id.clone();
        let mut batch = self.store.batch().unwrap();
        let brain = &mut self.brain;
        let out = batch
            .apply(self.seq, &id, at, |txn| brain.apply(txn, &msg))
            .unwrap();
        assert_eq!(out, nisse_core::Applied::Applied);
        batch.commit().unwrap();
        self.recorded.push((self.seq, id, at, msg));
    }

    /// Applies an alert `minutes` after T0.
    pub(super) fn alert(&mut self, minutes: i64, status: &str, labels: &[(&str, &str)]) {
        let at = at(minutes);
        let labels: HashMap<String, String> = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let msg = AlertReceived {
            envelope: Some(Envelope {
                agent: AGENT.into(),
                actor: Some(proto::Actor {
                    kind: proto::ActorKind::External as i32,
                    id: "alertmanager:nisse".into(),
                }),
                message_id: format!("alert:{}:{status}:{minutes}", self.seq + 1),
                created_at: Some(std::time::SystemTime::from(at).into()),
                ..Default::default()
            }),
            alert: Some(proto::Alert {
                status: status.into(),
                labels,
                starts_at: Some(std::time::SystemTime::from(at).into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        self.apply(at, AnyMessage::InAlert(msg));
    }

    /// A Matrix message from `sender` at `minute`, about `item` (empty: in
    /// the room, about no item).
    pub(super) fn said(&mut self, minute: i64, sender: &str, body: &str, item: &str) {
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

    /// A reaction from `sender` at `minute` to the approval request of
    /// `revision` on `item`.
    pub(super) fn reacted(
        &mut self,
        minute: i64,
        sender: &str,
        key: &str,
        item: &str,
        revision: u32,
    ) {
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

    fn matrix(&mut self, minute: i64, event: MatrixEventReceived, item: &str) {
        let at = at(minute);
        let msg = MatrixEventReceived {
            envelope: Some(Envelope {
                agent: AGENT.into(),
                work_item_id: item.into(),
                actor: Some(proto::Actor {
                    kind: proto::ActorKind::External as i32,
                    id: event.sender.clone(),
                }),
                message_id: format!("matrix:$e{minute}"),
                created_at: Some(std::time::SystemTime::from(at).into()),
                ..Default::default()
            }),
            event_id: format!("$e{minute}"),
            ..event
        };
        self.apply(at, AnyMessage::InMatrix(msg));
    }

    pub(super) fn items(&self) -> Vec<WorkItem> {
        let mut items = self.store.items(None).unwrap();
        items.sort_by_key(|i| i.number);
        items
    }

    /// Messages in the outbox of type `M`.
    pub(super) fn emitted<M: prost::Message + prost::Name + Default>(&self) -> Vec<M> {
        self.store
            .outbox()
            .unwrap()
            .iter()
            .filter(|o| o.type_name == M::full_name())
            .map(|o| M::decode(o.payload.as_slice()).unwrap())
            .collect()
    }

    pub(super) fn outbound(&self) -> Vec<MatrixOutbound> {
        self.emitted()
    }
}

pub(super) fn at(minutes: i64) -> OffsetDateTime {
    T0 + time::Duration::minutes(minutes)
}

/// The second brain with the services around it.
pub(super) struct Gates {
    pub(super) h: Harness,
    policy: Policy,
    pub(super) board: SwitchBoard,
    answered: BTreeSet<String>,
    commands: u64,
}

impl Gates {
    /// A brain with one active item (#1, from an alert at minute 0).
    pub(super) fn new() -> Self {
        let mut h = Harness::new(settings());
        h.alert(0, "firing", CPU);
        Self {
            h,
            policy: Policy::builtin().unwrap(),
            board: SwitchBoard::default(),
            answered: BTreeSet::new(),
            commands: 0,
        }
    }

    pub(super) fn item(&self) -> WorkItem {
        self.h.items().remove(0)
    }

    /// An operator command from `who` (`channel:identity`) at `minute`.
    pub(super) fn command(&mut self, minute: i64, who: &str, command: Command) {
        self.commands += 1;
        let (channel, id) = who.split_once(':').unwrap();
        let item = self.item();
        let msg = OperatorCommand {
            envelope: Some(Envelope {
                agent: AGENT.into(),
                work_item_id: item.id.clone(),
                actor: Some(proto::Actor {
                    kind: proto::ActorKind::Operator as i32,
                    id: id.into(),
                }),
                message_id: format!("cmd:{}", self.commands),
                created_at: Some(std::time::SystemTime::from(at(minute)).into()),
                ..Default::default()
            }),
            channel: channel.into(),
            work_item: "#1".into(),
            command: Some(command),
        };
        self.h.apply(at(minute), AnyMessage::InOperator(msg));
    }

    pub(super) fn propose(&mut self, minute: i64, steps: &[(&str, &str)]) {
        self.propose_steps(minute, steps.iter().map(|(t, c)| step(t, c)).collect());
    }

    pub(super) fn propose_steps(&mut self, minute: i64, steps: Vec<proto::PlannedStep>) {
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

    pub(super) fn approve(&mut self, minute: i64, who: &str, revision: u32) {
        self.command(minute, who, Command::Approve(proto::Approve { revision }));
    }

    /// Answers every classify request not answered yet, as the classifier
    /// would with the current switch board, at `minute`.
    pub(super) fn classify(&mut self, minute: i64) -> usize {
        let requests: Vec<ClassifyRequest> = self
            .h
            .emitted::<ClassifyRequest>()
            .into_iter()
            .filter(|r| !self.answered.contains(&r.request_id))
            .collect();
        for r in &requests {
            self.answered.insert(r.request_id.clone());
            let mut verdict = nisse_classifier::decide(&self.policy, r, Ok(self.board.clone()));
            verdict.envelope.as_mut().unwrap().created_at =
                Some(std::time::SystemTime::from(at(minute)).into());
            self.h
                .apply(at(minute), AnyMessage::ClassifyVerdict(verdict));
        }
        requests.len()
    }

    pub(super) fn exec_requests(&self) -> Vec<ExecRequest> {
        self.h.emitted()
    }

    /// The executor's answer to `request_id`.
    pub(super) fn result(
        &mut self,
        minute: i64,
        request_id: &str,
        status: ExecStatus,
        exit: i32,
        stdout: &str,
    ) {
        let msg = ExecResult {
            envelope: Some(Envelope {
                agent: AGENT.into(),
                work_item_id: self.item().id,
                actor: Some(proto::Actor {
                    kind: proto::ActorKind::Service as i32,
                    id: "executor".into(),
                }),
                message_id: format!("result:{request_id}"),
                created_at: Some(std::time::SystemTime::from(at(minute)).into()),
                ..Default::default()
            }),
            request_id: request_id.into(),
            status: status as i32,
            exit_code: exit,
            stdout: stdout.as_bytes().to_vec(),
            ..Default::default()
        };
        self.h.apply(at(minute), AnyMessage::ExecResult(msg));
    }

    pub(super) fn plans(&self) -> Vec<Plan> {
        self.h.store.plans(&self.item().id).unwrap()
    }

    pub(super) fn current(&self) -> Plan {
        self.plans().pop().unwrap()
    }

    pub(super) fn kinds(&self) -> Vec<String> {
        self.h
            .store
            .events(&self.item().id)
            .unwrap()
            .into_iter()
            .map(|e| e.event.kind().to_string())
            .collect()
    }

    pub(super) fn count(&self, kind: &str) -> usize {
        self.kinds().iter().filter(|k| *k == kind).count()
    }

    pub(super) fn refusals(&self) -> Vec<String> {
        self.h
            .store
            .events(&self.item().id)
            .unwrap()
            .into_iter()
            .filter_map(|e| match e.event {
                Event::DecisionRefused { reason, .. } => Some(reason),
                _ => None,
            })
            .collect()
    }
}

pub(super) fn step(target: &str, command: &str) -> proto::PlannedStep {
    let action = nisse_policy::Action::shell(target, command);
    proto::PlannedStep {
        tool: action.tool,
        target: action.target,
        arguments_json: action.arguments,
        ..Default::default()
    }
}

pub(super) fn check(command: &str, exit_code: i32, contains: &str) -> Option<proto::StepCheck> {
    Some(proto::StepCheck {
        command: command.into(),
        exit_code,
        output_contains: contains.into(),
    })
}
