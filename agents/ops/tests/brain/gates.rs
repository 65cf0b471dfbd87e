//! The gates around the ops brain on a real state store: the real
//! classifier's verdicts (`nisse_classifier::decide` with the built-in
//! policy), the executor's results and the operator's commands, for the
//! agent loop's tests; and the hosts an alert binds. The plan machine's own
//! tests are nisse-core's.

use std::collections::BTreeSet;

use nisse_bus::SwitchBoard;
use nisse_bus::proto::{
    self, ClassifyRequest, ExecRequest, ExecResult, ExecStatus, OperatorCommand,
    operator_command::Command,
};
use nisse_core::plans::Plan;
use nisse_policy::Policy;

use super::*;
use pretty_assertions::assert_eq;

const OP: &str = "cli:op";
const OP2: &str = "matrix:@op2:example.org";

pub(super) struct Gates {
    pub(super) h: Harness,
    policy: Policy,
    pub(super) board: SwitchBoard,
    pub(super) answered: BTreeSet<String>,
    commands: u64,
}

fn config() -> Config {
    Config {
        operators: vec![OP.into(), OP2.into()],
        ..Config::default()
    }
}

pub(super) fn at(minutes: i64) -> OffsetDateTime {
    T0 + time::Duration::minutes(minutes)
}

impl Gates {
    /// A brain with one active item (#1, from an alert at minute 0).
    fn new() -> Self {
        let mut h = Harness::new(config());
        h.alert(0, "firing", CPU);
        Self::from_harness(h)
    }

    /// The gates around `h`'s brain, as it is.
    pub(super) fn from_harness(h: Harness) -> Self {
        Self {
            h,
            policy: Policy::builtin().unwrap(),
            board: SwitchBoard::default(),
            answered: BTreeSet::new(),
            commands: 0,
        }
    }

    pub(super) fn item(&self) -> nisse_core::WorkItem {
        self.h.items().remove(0)
    }

    /// An operator command from `who` (`channel:identity`) at `minute`.
    pub(super) fn command(&mut self, minute: i64, who: &str, command: Command) {
        self.commands += 1;
        let (channel, id) = who.split_once(':').unwrap();
        let item = self.item();
        let msg = OperatorCommand {
            envelope: Some(Envelope {
                agent: "ops".into(),
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

    fn propose(&mut self, minute: i64, steps: &[(&str, &str)]) {
        self.propose_steps(minute, steps.iter().map(|(t, c)| step(t, c)).collect());
    }

    fn propose_steps(&mut self, minute: i64, steps: Vec<proto::PlannedStep>) {
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
                agent: "ops".into(),
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
}

fn step(target: &str, command: &str) -> proto::PlannedStep {
    let action = nisse_policy::Action::shell(target, command);
    proto::PlannedStep {
        tool: action.tool,
        target: action.target,
        arguments_json: action.arguments,
        ..Default::default()
    }
}

#[test]
fn an_items_hosts_are_bound_by_its_alert_and_by_the_operators_plan_only() {
    let mut g = Gates::new();
    let item = g.item();
    // The alert's instance label bound its host.
    let bindings: Vec<proto::HostBinding> = g.h.emitted();
    assert_eq!(bindings.len(), 1);
    assert_eq!(bindings[0].hosts, ["host1"]);
    assert_eq!(bindings[0].work_item_id, item.id);
    assert_eq!(
        bindings[0].envelope.as_ref().unwrap().work_item_id,
        item.id,
        "the subject is per item: the envelope names it"
    );

    // The operator's plan binds the hosts it names; the whole set goes out.
    g.propose(
        1,
        &[("web1", "systemctl restart caddy"), ("host1", "uptime")],
    );
    let bindings: Vec<proto::HostBinding> = g.h.emitted();
    assert_eq!(bindings.last().unwrap().hosts, ["host1", "web1"]);
    let bound: Vec<Vec<String>> =
        g.h.store
            .events(&item.id)
            .unwrap()
            .into_iter()
            .filter_map(|e| match e.event {
                nisse_core::Event::HostsBound { added, .. } => Some(added),
                _ => None,
            })
            .collect();
    assert_eq!(bound, [vec!["host1".to_string()], vec!["web1".to_string()]]);

    // Anyone else (the model, later) may only use bound hosts.
    let mut batch = g.h.store.batch().unwrap();
    batch
        .apply(999, "probe", at(2), |txn| {
            let item = txn.find_item("#1")?.unwrap();
            let steps = vec![(
                nisse_policy::Step {
                    action: nisse_policy::Action::shell("db9", "uptime"),
                    precondition: None,
                    expected: None,
                    retries: 1,
                },
                None,
            )];
            let settings = nisse_core::plans::PlanSettings {
                agent: "ops",
                approval_expiry: std::time::Duration::from_secs(3600),
            };
            match txn.propose_plan(settings, &item, &nisse_core::Actor::agent("ops"), "", steps)? {
                nisse_core::plans::Proposal::Refused(_) => Ok(()),
                other => panic!("not refused: {other:?}"),
            }
        })
        .unwrap();
    batch.commit().unwrap();
    let events = g.h.store.events(&item.id).unwrap();
    let last = events.last().unwrap();
    match &last.event {
        nisse_core::Event::PlanRejected { reason, .. } => {
            assert!(reason.contains("not bound to item #1: db9"), "{reason}");
            assert!(reason.contains("bound: host1, web1"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
}
