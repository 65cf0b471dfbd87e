//! Plans, approvals bound to revisions, the kill switch and the step
//! machine, on a real state store. The classifier's verdicts are the real
//! classifier's (`nisse_classifier::decide` with the built-in policy); only
//! the bus between them is left out.

use std::collections::BTreeSet;

use nisse_bus::proto::{
    self, ClassifyRequest, ExecRequest, ExecResult, ExecStatus, OperatorCommand,
    operator_command::Command,
};
use nisse_bus::{NeverEntry, SwitchBoard};
use nisse_core::plans::{Plan, PlanStatus};
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

    fn kinds(&self) -> Vec<String> {
        self.h
            .store
            .events(&self.item().id)
            .unwrap()
            .into_iter()
            .map(|e| e.event.kind().to_string())
            .collect()
    }

    fn count(&self, kind: &str) -> usize {
        self.kinds().iter().filter(|k| *k == kind).count()
    }

    fn refusals(&self) -> Vec<String> {
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

fn step(target: &str, command: &str) -> proto::PlannedStep {
    let action = nisse_policy::Action::shell(target, command);
    proto::PlannedStep {
        tool: action.tool,
        target: action.target,
        arguments_json: action.arguments,
        ..Default::default()
    }
}

fn check(command: &str, exit_code: i32, contains: &str) -> Option<proto::StepCheck> {
    Some(proto::StepCheck {
        command: command.into(),
        exit_code,
        output_contains: contains.into(),
    })
}

const RESTART: &[(&str, &str)] = &[("web1", "systemctl restart caddy")];

#[test]
fn a_plan_is_classified_then_put_up_with_a_request_rendered_from_its_steps() {
    let mut g = Gates::new();
    g.propose(
        1,
        &[
            ("nas01", "zfs snapshot tank/media@pre"),
            ("nas01", "zfs destroy tank/media/old"),
        ],
    );
    assert_eq!(g.current().status, PlanStatus::Proposed);
    assert_eq!(g.item().state, State::Active, "not up until classified");
    assert_eq!(g.classify(2), 2);
    let plan = g.current();
    assert_eq!((plan.revision, plan.status), (1, PlanStatus::Up));
    assert_eq!(g.item().state, State::WaitingOnOperator);
    let request =
        g.h.outbound()
            .into_iter()
            .find(|m| m.kind == proto::MatrixOutboundKind::ApprovalRequest as i32)
            .unwrap();
    assert_eq!(request.plan_revision, 1);
    let text = &request.markdown;
    // The irreversible step is flagged above the steps.
    let flag = text.find("Irreversible:** step 2").unwrap();
    assert!(flag < text.find("**Steps:**").unwrap(), "{text}");
    assert!(
        text.contains("`zfs destroy tank/media/old` — destructive, class 3"),
        "{text}"
    );
    assert!(text.contains("approve rev-1"), "{text}");
    assert!(text.contains("not part of what is approved"), "{text}");
    assert_eq!(g.count("classifier_verdict"), 2);
}

#[test]
fn an_approval_for_an_older_revision_never_lands_on_the_newer_one() {
    let mut g = Gates::new();
    g.propose(1, RESTART);
    g.classify(2);
    // rev-2 proposed; its request is not out yet, rev-1's was.
    g.propose(3, &[("web1", "systemctl reload caddy")]);
    // A bare approval now is about rev-1, the one the operator saw.
    g.approve(4, OP, 0);
    // So is one naming it.
    g.approve(5, OP, 1);
    // rev-2 cannot be approved before its request went out.
    g.approve(6, OP, 2);
    assert_eq!(g.count("approved"), 0);
    let refusals = g.refusals();
    assert!(
        refusals[0].contains("rev-1 is not the current plan; rev-2 is"),
        "{refusals:?}"
    );
    assert!(
        refusals[1].contains("rev-1 is not the current plan"),
        "{refusals:?}"
    );
    assert!(
        refusals[2].contains("rev-2 has not been put up"),
        "{refusals:?}"
    );
    let plans = g.plans();
    assert_eq!(plans[0].status, PlanStatus::Superseded);
    assert_eq!(plans[1].status, PlanStatus::Proposed);

    g.classify(7);
    // Approving rev-1 after rev-2 was put up: still not applied.
    g.approve(8, OP, 1);
    assert_eq!(g.count("approved"), 0);
    assert_eq!(g.current().status, PlanStatus::Up);
    // A bare approval now lands on rev-2, the one up.
    g.approve(9, OP, 0);
    let plan = g.current();
    assert_eq!((plan.revision, plan.status), (2, PlanStatus::Running));
    assert_eq!(plan.approved_by.as_deref(), Some("operator:op"));
}

#[test]
fn the_first_of_two_racing_approvals_wins_and_is_echoed() {
    let mut g = Gates::new();
    g.propose(1, RESTART);
    g.classify(2);
    g.approve(3, OP, 1);
    g.approve(3, OP2, 1);
    assert_eq!(g.count("approved"), 1);
    let refusals = g.refusals();
    assert_eq!(refusals.len(), 1);
    assert!(
        refusals[0].contains("already approved by operator:op"),
        "{refusals:?}"
    );
    let echoed: Vec<String> =
        g.h.outbound()
            .into_iter()
            .map(|m| m.markdown)
            .filter(|m| m.contains("Approved rev-1"))
            .collect();
    assert_eq!(echoed.len(), 1);
    assert!(echoed[0].contains("via `cli`"), "{echoed:?}");
    // One approval, one run: a single execution request for step 1.
    g.classify(4);
    assert_eq!(g.exec_requests().len(), 1);
}

#[test]
fn an_approval_after_expiry_is_refused_and_the_plan_is_put_up_again() {
    let mut g = Gates::new();
    g.propose(1, RESTART);
    g.classify(2);
    g.approve(2 + 61, OP, 1);
    assert_eq!(g.count("approved"), 0);
    assert!(g.refusals()[0].contains("expired"), "{:?}", g.refusals());
    assert_eq!(g.count("approval_requested"), 2, "put up again");
    // Within the new window it is accepted.
    g.approve(70, OP, 1);
    assert_eq!(g.count("approved"), 1);
    assert_eq!(g.current().status, PlanStatus::Running);
}

#[test]
fn an_approval_from_someone_not_on_the_allowlist_is_only_recorded() {
    let mut g = Gates::new();
    g.propose(1, RESTART);
    g.classify(2);
    let said = g.h.outbound().len();
    g.approve(3, "cli:mallory", 1);
    g.approve(3, "matrix:@op:example.org", 1);
    g.command(
        4,
        "cli:mallory",
        Command::Abandon(proto::Abandon { note: "x".into() }),
    );
    assert_eq!(g.count("approved"), 0);
    assert_eq!(g.count("decision_refused"), 2);
    assert!(g.refusals()[0].contains("not on the operator allowlist"));
    assert_eq!(g.current().status, PlanStatus::Up);
    assert!(g.item().state.is_open());
    assert_eq!(g.h.outbound().len(), said, "a stranger gets no answer");
}

#[test]
fn autonomy_off_between_approval_and_execution_stops_before_any_execution() {
    let mut g = Gates::new();
    g.propose(1, RESTART);
    g.classify(2);
    g.approve(3, OP, 1);
    assert_eq!(g.current().status, PlanStatus::Running);
    // The switch flips before the classifier judges step 1 for execution.
    g.board.autonomy_off = true;
    g.classify(4);
    assert!(g.exec_requests().is_empty());
    let plan = g.current();
    assert_eq!(plan.status, PlanStatus::Up, "put up again");
    assert!(
        plan.halted.as_deref().unwrap().contains("autonomy is off"),
        "{plan:?}"
    );
    assert_eq!(g.item().state, State::WaitingOnOperator);
    // Approving again names the halted step: it runs, autonomy still off.
    g.approve(5, OP, 1);
    g.classify(6);
    let requests = g.exec_requests();
    assert_eq!(requests.len(), 1);
    assert_eq!(requests[0].host, "web1");
    assert_eq!(requests[0].command, "systemctl restart caddy");
    // It is still the approved step; the confirmation only passed the
    // autonomy switch, for this one step.
    assert_eq!(requests[0].permission.as_ref().unwrap().plan_revision, 1);
    assert!(!g.current().confirmed);
}

#[test]
fn a_never_target_is_refused_for_good_whatever_was_approved() {
    let mut g = Gates::new();
    g.propose(1, RESTART);
    g.classify(2);
    g.approve(3, OP, 1);
    g.board.never.insert(
        "web1".into(),
        NeverEntry {
            reason: "customer demo".into(),
            set_by: OP.into(),
        },
    );
    g.classify(4);
    assert!(g.exec_requests().is_empty());
    let plan = g.current();
    assert_eq!(plan.status, PlanStatus::Halted);
    assert!(plan.halted.unwrap().contains("customer demo"));
    g.approve(5, OP, 1);
    g.classify(6);
    assert!(
        g.exec_requests().is_empty(),
        "nothing runs on a never target"
    );
}

#[test]
fn an_approved_plan_runs_step_by_step_with_its_checks_and_retries() {
    let mut g = Gates::new();
    let mut first = step("web1", "systemctl restart caddy");
    first.precondition = check("systemctl is-failed caddy", 0, "failed");
    first.expected = check("systemctl is-active caddy", 0, "active");
    first.retries = Some(1);
    let second = step("web1", "touch /tmp/caddy-restarted");
    g.propose_steps(1, vec![first, second]);
    assert_eq!(g.classify(2), 4, "a verdict for each command and check");
    g.approve(3, OP, 1);
    g.classify(4);
    let reqs = g.exec_requests();
    assert_eq!(reqs.len(), 1);
    assert_eq!(reqs[0].command, "systemctl is-failed caddy");
    g.result(5, &reqs[0].request_id, ExecStatus::Completed, 0, "failed\n");
    g.classify(6);
    let reqs = g.exec_requests();
    assert_eq!(reqs[1].command, "systemctl restart caddy");
    assert_eq!(reqs[1].permission.as_ref().unwrap().plan_revision, 1);
    // It fails once: the retry allowance runs it again.
    g.result(7, &reqs[1].request_id, ExecStatus::Completed, 1, "");
    g.classify(8);
    let reqs = g.exec_requests();
    assert_eq!(reqs.len(), 3);
    assert_eq!(reqs[2].command, "systemctl restart caddy");
    assert_ne!(reqs[2].request_id, reqs[1].request_id);
    // A late duplicate of the failed attempt's result changes nothing.
    g.result(8, &reqs[1].request_id, ExecStatus::Completed, 1, "");
    g.result(9, &reqs[2].request_id, ExecStatus::Completed, 0, "");
    g.classify(10);
    let reqs = g.exec_requests();
    assert_eq!(reqs[3].command, "systemctl is-active caddy");
    g.result(
        11,
        &reqs[3].request_id,
        ExecStatus::Completed,
        0,
        "active\n",
    );
    g.classify(12);
    let reqs = g.exec_requests();
    assert_eq!(reqs[4].command, "touch /tmp/caddy-restarted");
    g.result(13, &reqs[4].request_id, ExecStatus::Completed, 0, "");
    let plan = g.current();
    assert_eq!((plan.status, plan.next_step), (PlanStatus::Done, 2));
    assert_eq!(g.count("plan_finished"), 1);
    assert_eq!(g.count("step_result"), 6);
    assert_eq!(g.exec_requests().len(), 5, "nothing ran twice");
}

#[test]
fn a_failed_precondition_or_unknown_outcome_halts_without_retry() {
    let mut g = Gates::new();
    let mut first = step("web1", "systemctl restart caddy");
    first.precondition = check("systemctl is-failed caddy", 0, "");
    first.retries = Some(3);
    g.propose_steps(1, vec![first]);
    g.classify(2);
    g.approve(3, OP, 1);
    g.classify(4);
    let pre = g.exec_requests().remove(0);
    g.result(5, &pre.request_id, ExecStatus::Completed, 1, "");
    g.classify(6);
    assert_eq!(
        g.exec_requests().len(),
        1,
        "no retry of a failed precondition"
    );
    let plan = g.current();
    assert_eq!(plan.status, PlanStatus::Up);
    assert!(
        plan.halted
            .unwrap()
            .contains("precondition of step 1 does not hold")
    );

    // Approved again: from the precondition; now the command's outcome is
    // unknown (the executor died mid-command): never re-run blindly.
    g.approve(7, OP, 1);
    g.classify(8);
    let pre = g.exec_requests().pop().unwrap();
    g.result(9, &pre.request_id, ExecStatus::Completed, 0, "");
    g.classify(10);
    let run = g.exec_requests().pop().unwrap();
    assert_eq!(run.command, "systemctl restart caddy");
    g.result(11, &run.request_id, ExecStatus::OutcomeUnknown, 0, "");
    g.classify(12);
    assert_eq!(
        g.exec_requests().len(),
        3,
        "not re-run though retries remain"
    );
    assert!(g.current().halted.unwrap().contains("unknown"));
}

#[test]
fn a_check_that_is_not_read_only_rejects_the_plan() {
    let mut g = Gates::new();
    let mut s = step("web1", "systemctl restart caddy");
    s.expected = check("systemctl start caddy", 0, "");
    g.propose_steps(1, vec![s]);
    g.classify(2);
    assert_eq!(g.current().status, PlanStatus::Rejected);
    assert_eq!(g.count("approval_requested"), 0);
    g.approve(3, OP, 1);
    assert_eq!(g.count("approved"), 0);
}

#[test]
fn stop_and_abandon_end_the_work() {
    let mut g = Gates::new();
    g.propose(1, RESTART);
    g.classify(2);
    g.approve(3, OP, 1);
    g.command(4, OP, Command::Stop(proto::Stop {}));
    g.classify(5);
    assert!(
        g.exec_requests().is_empty(),
        "a verdict after stop runs nothing"
    );
    assert_eq!(g.current().status, PlanStatus::Halted);
    assert_eq!(g.item().state, State::WaitingOnOperator);
    g.command(
        6,
        OP,
        Command::Abandon(proto::Abandon {
            note: "fixed by hand".into(),
        }),
    );
    assert_eq!(g.item().state, State::Closed);
    assert_eq!(g.count("abandoned"), 1);
}

#[test]
fn a_recorded_stream_of_proposals_approvals_and_verdicts_rebuilds_the_same_state() {
    let mut g = Gates::new();
    g.propose(1, RESTART);
    g.classify(2);
    g.propose(
        3,
        &[
            ("web1", "systemctl reload caddy"),
            ("nas01", "rm -rf /tank/tmp"),
        ],
    );
    g.approve(4, OP, 1);
    g.classify(5);
    g.approve(6, "cli:mallory", 2);
    g.approve(6, OP, 2);
    g.board.autonomy_off = true;
    g.classify(7);
    g.approve(8, OP2, 2);
    g.classify(9);
    let live = g.h.store.snapshot().unwrap();
    assert!(live.plans.len() == 2 && !live.events.is_empty());

    let mut replay = Harness::new(config());
    for (_, _, at, msg) in g.h.recorded.clone() {
        replay.apply(at, msg);
    }
    assert_eq!(replay.store.snapshot().unwrap(), live);
    assert_eq!(replay.store.outbox().unwrap(), g.h.store.outbox().unwrap());
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

#[test]
fn a_host_key_that_does_not_verify_halts_without_retry_and_says_why() {
    let mut g = Gates::new();
    let mut only = step("web1", "systemctl restart caddy");
    only.retries = Some(3);
    g.propose_steps(1, vec![only]);
    g.classify(2);
    g.approve(3, OP, 1);
    g.classify(4);
    let run = g.exec_requests().pop().unwrap();
    let item = g.item();
    g.h.apply(
        at(5),
        AnyMessage::ExecResult(ExecResult {
            envelope: Some(Envelope {
                agent: "ops".into(),
                work_item_id: item.id.clone(),
                message_id: format!("result:{}", run.request_id),
                ..Default::default()
            }),
            request_id: run.request_id.clone(),
            status: ExecStatus::Failed as i32,
            failure: proto::ExecFailure::HostKeyChanged as i32,
            offered_host_key: "SHA256:abc".into(),
            reason: "the host key of web1 CHANGED: it offered SHA256:abc".into(),
            ..Default::default()
        }),
    );
    g.classify(6);
    assert_eq!(g.exec_requests().len(), 1, "no retry on a host key failure");
    let plan = g.current();
    assert_eq!(plan.status, PlanStatus::Up);
    let halted = plan.halted.unwrap();
    assert!(
        halted.contains("CHANGED") && halted.contains("Nothing ran"),
        "{halted}"
    );
    let shown: Vec<String> = g.h.outbound().into_iter().map(|o| o.markdown).collect();
    assert!(shown.last().unwrap().contains("CHANGED"), "{shown:?}");
    let results: Vec<String> =
        g.h.store
            .events(&item.id)
            .unwrap()
            .into_iter()
            .filter_map(|e| match e.event {
                nisse_core::Event::StepResult { failure, .. } => Some(failure),
                _ => None,
            })
            .collect();
    assert_eq!(results, ["host_key_changed"]);
}
