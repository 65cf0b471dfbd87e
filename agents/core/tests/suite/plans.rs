//! Plans, approvals bound to revisions, the kill switch and the step
//! machine, driven through the second brain with the real classifier's
//! verdicts.

use pretty_assertions::assert_eq;

use nisse_bus::proto::{self, Envelope, ExecResult, ExecStatus, operator_command::Command};
use nisse_bus::{AnyMessage, NeverEntry};
use nisse_core::plans::PlanStatus;
use nisse_core::{AgentBrain, State};

use super::harness::{AGENT, Desk, Gates, OP, OP3, at, check, settings, step};

/// The chat operator's Matrix id (`OP2` is `matrix:` and it).
const OP2_ID: &str = "@op2:example.org";

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
            .find(|m| m.kind == proto::TellKind::ApprovalRequest as i32)
            .unwrap();
    assert_eq!(request.plan_revision, 1);
    let text = &request.markdown;
    // The irreversible step is flagged above the steps.
    let flag = text.find("Irreversible:** step 2").unwrap();
    assert!(flag < text.find("**Steps:**").unwrap(), "{text}");
    assert!(
        text.contains("— destructive, class 3 · retries 1\n```\nzfs destroy tank/media/old\n```\n"),
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
    // A bare approval from the CLI, which delivers no approval request,
    // is answered with the revision to name; naming it approves it.
    g.approve(9, OP, 0);
    assert_eq!(g.count("approved"), 0);
    assert!(
        g.refusals()[4].contains("name the revision: approve rev-2"),
        "{:?}",
        g.refusals()
    );
    g.approve(10, OP, 2);
    let plan = g.current();
    assert_eq!((plan.revision, plan.status), (2, PlanStatus::Running));
    assert_eq!(plan.approved_by.as_deref(), Some("operator:op"));
}

/// What a bare `approve` in the chat is about, as the operator reads it:
/// the revision whose approval request Matrix showed them, and never one
/// still on its way.
fn bare_approve_answer(g: &Gates) -> String {
    g.h.outbound()
        .into_iter()
        .map(|t| t.markdown)
        .rfind(|m| m.contains("was not applied"))
        .unwrap_or_default()
}

#[test]
fn a_bare_approve_binds_only_the_revision_whose_request_its_channel_delivered() {
    let mut g = Gates::new();
    let item = g.item().id;
    g.propose(1, RESTART);
    g.classify(2);
    // rev-1's request is emitted, not yet in the room: a bare `approve`
    // there approves nothing and says what to name.
    g.h.said(3, OP2_ID, "approve", &item);
    assert_eq!(g.count("approved"), 0);
    let answer = bare_approve_answer(&g);
    assert!(
        answer.contains("name the revision: `approve rev-1`"),
        "{answer}"
    );
    assert!(answer.contains("`nisse plan show #1`"), "{answer}");
    // Matrix confirms the post; the same words now approve rev-1.
    assert_eq!(g.h.posted(4), 1);
    assert_eq!(g.count("approval_delivered"), 1);
    g.h.said(5, OP2_ID, "approve", &item);
    assert_eq!(g.count("approved"), 1);
    assert_eq!(g.current().status, PlanStatus::Running);
}

#[test]
fn a_bare_approve_after_a_new_revision_went_out_but_before_its_post_approves_nothing() {
    let mut g = Gates::new();
    let item = g.item().id;
    g.propose(1, RESTART);
    g.classify(2);
    g.h.posted(2);
    // rev-2 replaces it; its request is emitted, the room does not have
    // it yet. The operator, who saw rev-1, says `approve`.
    g.propose(3, &[("web1", "systemctl reload caddy")]);
    g.classify(4);
    assert_eq!(g.current().status, PlanStatus::Up);
    g.h.said(5, OP2_ID, "approve", &item);
    // ✅ on a message is not bare: it decides the revision that message
    // showed, here rev-1, which is no longer current.
    g.h.reacted(6, OP2_ID, "✅", &item, 1);
    assert_eq!(g.count("approved"), 0, "nothing approved");
    let refusals = g.refusals();
    assert!(
        refusals[0].contains("name the revision: approve rev-2"),
        "{refusals:?}"
    );
    assert!(
        refusals[1].contains("rev-1 is not the current plan"),
        "{refusals:?}"
    );
    assert_eq!(g.current().status, PlanStatus::Up);
    assert_eq!(g.plans()[0].status, PlanStatus::Superseded);
    // Naming the revision approves it at once, wherever it was read.
    g.h.said(7, OP2_ID, "approve rev-2", &item);
    let plan = g.current();
    assert_eq!((plan.revision, plan.status), (2, PlanStatus::Running));
    assert_eq!(plan.approved_via.as_deref(), Some("matrix"));
}

#[test]
fn a_destructive_revision_is_approved_only_with_its_steps_named_back_on_every_channel() {
    let mut g = Gates::new();
    let item = g.item().id;
    g.propose(
        1,
        &[
            ("nas01", "zfs snapshot tank/media@pre"),
            ("nas01", "zfs destroy tank/media/old"),
        ],
    );
    g.classify(2);
    g.h.posted(2);
    // The request says what to type.
    let request =
        g.h.outbound()
            .into_iter()
            .find(|m| m.kind == proto::TellKind::ApprovalRequest as i32)
            .unwrap()
            .markdown;
    assert!(
        request.contains("Reply `approve rev-1 #1 step 2` (its destructive steps named back)"),
        "{request}"
    );
    // From Matrix, named or bare, and with ✅: refused, saying what to type.
    g.h.said(3, OP2_ID, "approve rev-1", &item);
    g.h.said(4, OP2_ID, "approve", &item);
    g.h.reacted(5, OP2_ID, "✅", &item, 1);
    g.h.said(6, OP2_ID, "approve rev-1 #1 step 1", &item);
    // From the CLI, without it and with the wrong one.
    g.approve(7, OP, 1);
    g.approve_confirming(8, OP, 1, "yes");
    assert_eq!(g.count("approved"), 0);
    assert_eq!(g.current().status, PlanStatus::Up);
    let refusals = g.refusals();
    assert_eq!(refusals.len(), 6, "{refusals:?}");
    for r in &refusals[..3] {
        assert!(
            r.contains("rev-1 has destructive steps: type approve rev-1 #1 step 2 to confirm them"),
            "{r}"
        );
    }
    assert!(
        refusals[3].contains("\"#1 step 1\" does not name them"),
        "{refusals:?}"
    );
    assert!(
        refusals[4].contains("type nisse approve #1 rev-1 --confirm '#1 step 2'"),
        "{refusals:?}"
    );
    assert!(
        refusals[5].contains("\"yes\" does not name them"),
        "{refusals:?}"
    );
    let told = bare_approve_answer(&g);
    assert!(
        told.contains("type `nisse approve #1 rev-1 --confirm '#1 step 2'` to confirm them"),
        "{told}"
    );
    // Named back, it is approved.
    g.h.said(9, OP2_ID, "approve rev-1 #1 step 2", &item);
    let plan = g.current();
    assert_eq!(plan.status, PlanStatus::Running);
    assert_eq!(plan.approved_via.as_deref(), Some("matrix"));
}

#[test]
fn the_first_of_two_racing_approvals_wins_and_is_echoed() {
    let mut g = Gates::new();
    g.propose(1, RESTART);
    g.classify(2);
    g.approve(3, OP, 1);
    g.approve(3, OP3, 1);
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
    // The operator's name on another channel is not the operator.
    g.approve(3, "matrix:op", 1);
    g.abandon(4, "cli:mallory", "x");
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
    // What the harness knows of the steps is told as facts, once each
    // (checks are part of their step; the late duplicate tells nothing).
    let progress: Vec<(i32, String)> =
        g.h.outbound()
            .into_iter()
            .filter(|t| t.markdown.contains(" step "))
            .map(|t| (t.kind, t.markdown))
            .collect();
    let fact = proto::TellKind::Fact as i32;
    assert_eq!(
        progress,
        [
            (
                fact,
                "▶️ Item **#1**: rev-1 step 1 of 2 started on **web1**.".to_string()
            ),
            (
                fact,
                "☑️ Item **#1**: rev-1 step 1 of 2 finished, exit 1.".to_string()
            ),
            (
                fact,
                "▶️ Item **#1**: rev-1 step 1 of 2 started on **web1** (attempt 2).".to_string()
            ),
            (
                fact,
                "☑️ Item **#1**: rev-1 step 1 of 2 finished, exit 0.".to_string()
            ),
            (
                fact,
                "▶️ Item **#1**: rev-1 step 2 of 2 started on **web1**.".to_string()
            ),
            (
                fact,
                "☑️ Item **#1**: rev-1 step 2 of 2 finished, exit 0.".to_string()
            ),
            (fact, "✅ Item **#1**: every step of rev-1 ran.".to_string()),
        ]
    );
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
    g.abandon(6, OP, "fixed by hand");
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
    g.approve(8, OP3, 2);
    g.classify(9);
    let live = g.h.store.snapshot().unwrap();
    assert!(live.plans.len() == 2 && !live.events.is_empty());

    let replay = g.h.replay(AgentBrain::new(settings(), Desk));
    assert_eq!(replay.store.snapshot().unwrap(), live);
    assert_eq!(replay.store.outbox().unwrap(), g.h.store.outbox().unwrap());
}

#[test]
fn a_host_that_cannot_be_run_on_halts_without_retry_and_says_why() {
    // A host key that does not verify, and a host without bash: the
    // operator must look at the host; trying again changes nothing.
    for (failure, reason, logged) in [
        (
            proto::ExecFailure::HostKeyChanged,
            "the host key of web1 CHANGED: it offered SHA256:abc",
            "host_key_changed",
        ),
        (
            proto::ExecFailure::NoBash,
            "web1 did not start bash for the command, so nothing was run. The login shell answered sh: 1: exec: bash: not found (exit status 127)",
            "no_bash",
        ),
    ] {
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
                    agent: AGENT.into(),
                    work_item_id: item.id.clone(),
                    message_id: format!("result:{}", run.request_id),
                    ..Default::default()
                }),
                request_id: run.request_id.clone(),
                status: ExecStatus::Failed as i32,
                failure: failure as i32,
                offered_host_key: "SHA256:abc".into(),
                reason: reason.into(),
                ..Default::default()
            }),
        );
        g.classify(6);
        assert_eq!(g.exec_requests().len(), 1, "{logged}: no retry");
        let plan = g.current();
        assert_eq!(plan.status, PlanStatus::Up);
        let halted = plan.halted.unwrap();
        assert!(
            halted.contains(reason) && halted.contains("Nothing ran"),
            "{halted}"
        );
        let shown: Vec<String> = g.h.outbound().into_iter().map(|o| o.markdown).collect();
        assert!(shown.last().unwrap().contains(reason), "{shown:?}");
        let results = g.h.logged(&item.id, |e| match e {
            nisse_core::Event::StepResult { failure, .. } => Some(failure),
            _ => None,
        });
        assert_eq!(results, [logged]);
    }
}
