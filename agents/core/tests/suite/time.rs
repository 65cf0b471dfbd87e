//! Time on the stream, through the second brain: ticks expire requests
//! past their deadline (the item waits on the operator, saying why, once),
//! a late answer is kept and not acted on, the operator's `retry` applies
//! it or sends the request again, expired approval requests are announced
//! once, the L1 switch happens at a tick, the brain's start asks pending
//! questions again, and a recorded stream of all that rebuilds the same
//! state.

use std::collections::BTreeMap;

use pretty_assertions::assert_eq;
use serde_json::json;

use nisse_bus::AnyMessage;
use nisse_bus::proto::{
    self, ClassifyRequest, ExecRequest, ExecStatus, ModelReply, ModelRequest, ModelResponse,
    RolesPinned, ToolCall, model_response::Outcome, operator_command::Command,
};
use nisse_core::agent_loop::Status;
use nisse_core::plans::PlanStatus;
use nisse_core::{
    Actor, AgentBrain, BrainSettings, Duties, Event, NewItem, State, StoreError, Txn, WorkItem,
};
use nisse_models::{ModelEntry, ModelsConfig, Profile, Role};

use super::harness::{AGENT, CPU, Desk, Gates, Harness, OP, OP3, at, check, settings, step};

const RESTART: &[(&str, &str)] = &[("web1", "systemctl restart caddy")];
const DISK: &[(&str, &str)] = &[("alertname", "DiskFull"), ("instance", "nas")];

/// The texts of the item's facts whose data holds `key`.
fn facts(g: &Gates, key: &str) -> Vec<String> {
    g.h.logged(&g.item().id, |e| match e {
        Event::Fact { text, data } if data.get(key).is_some() => Some(text),
        _ => None,
    })
}

/// Everything said in the chat, in order.
fn said(g: &Gates) -> Vec<String> {
    g.h.outbound().into_iter().map(|m| m.markdown).collect()
}

/// Item #1 with an approved one-step plan whose step went to the
/// classifier at minute 3 and has no verdict: its request is the last one.
fn awaiting_verdict() -> (Gates, ClassifyRequest) {
    let mut g = Gates::new();
    g.propose(1, RESTART);
    assert_eq!(g.classify(2), 1);
    g.approve(3, OP, 1);
    assert_eq!(g.current().status, PlanStatus::Running);
    let request = g.h.emitted::<ClassifyRequest>().pop().unwrap();
    assert!(request.scope.is_some(), "an execution verdict: {request:?}");
    (g, request)
}

/// As [`awaiting_verdict`], then the classifier's verdict at minute 4: the
/// step's execution request is out.
fn awaiting_result() -> (Gates, ExecRequest) {
    let (mut g, _) = awaiting_verdict();
    assert_eq!(g.classify(4), 1);
    let requests = g.exec_requests();
    assert_eq!(requests.len(), 1);
    (g, requests[0].clone())
}

#[test]
fn a_verdict_that_does_not_come_in_time_makes_the_item_wait_on_the_operator_once() {
    let (mut g, request) = awaiting_verdict();
    let said_before = said(&g).len();
    let logged_before = g.kinds().len();

    // Within the classifier's 2 minutes: nothing changes.
    g.h.tick(at(4));
    assert_eq!(g.item().state, State::Active);
    assert_eq!(said(&g).len(), said_before);
    assert_eq!(g.kinds().len(), logged_before);

    // Past it: the item waits on the operator, saying why.
    g.h.tick(at(6));
    assert_eq!(g.item().state, State::WaitingOnOperator);
    let expired = facts(&g, "deadline_passed");
    assert_eq!(expired.len(), 1, "{expired:?}");
    assert!(
        expired[0].contains(&request.request_id)
            && expired[0].contains("the classifier did not answer within 2m"),
        "{}",
        expired[0]
    );
    let said_now = said(&g);
    assert_eq!(said_now.len(), said_before + 1, "{said_now:#?}");
    let notice = said_now.last().unwrap();
    assert!(
        notice.contains("Item **#1**: the classifier did not answer within 2m")
            && notice.contains("`retry`"),
        "{notice}"
    );
    assert!(
        g.exec_requests().is_empty(),
        "nothing runs without a verdict"
    );

    // A later tick says nothing more.
    g.h.tick(at(7));
    g.h.tick(at(30));
    assert_eq!(said(&g).len(), said_before + 1);
    assert_eq!(facts(&g, "deadline_passed").len(), 1);
    assert_eq!(g.item().state, State::WaitingOnOperator);
}

#[test]
fn a_late_verdict_is_kept_and_retry_applies_it() {
    let (mut g, request) = awaiting_verdict();
    g.h.tick(at(6));
    assert_eq!(g.item().state, State::WaitingOnOperator);
    let said_before = said(&g).len();

    // The verdict comes at minute 8, three minutes after its deadline.
    assert_eq!(g.classify(8), 1);
    let late = facts(&g, "late_answer");
    assert_eq!(late.len(), 1, "{late:?}");
    assert!(
        late[0].starts_with(&format!(
            "a late answer to {} came 3m after its deadline (2m given)",
            request.request_id
        )) && late[0].contains("not acted on"),
        "{}",
        late[0]
    );
    assert!(g.exec_requests().is_empty(), "a late verdict runs nothing");
    assert_eq!(g.count("classifier_verdict"), 1, "only the assessment's");
    assert_eq!(g.item().state, State::WaitingOnOperator);
    assert_eq!(g.current().status, PlanStatus::Running);
    assert_eq!(said(&g).len(), said_before);

    // The operator's retry applies it: the step's execution goes out.
    g.command(9, OP, Command::Retry(proto::Retry {}));
    let reply = g.reply();
    assert!(reply.applied, "{reply:?}");
    assert_eq!(g.item().state, State::Active);
    let requests = g.exec_requests();
    assert_eq!(requests.len(), 1);
    assert_eq!(requests[0].request_id, request.request_id);
    assert_eq!(requests[0].command, "systemctl restart caddy");
    let lines = reply.lines.join("\n");
    assert!(
        lines.contains(&format!(
            "fact: retry: the late answer to {} is applied",
            request.request_id
        )),
        "{lines}"
    );
    assert!(lines.contains("waiting_on_operator → ready"), "{lines}");
    assert!(lines.contains("classifier: rev-1 step 1 run"), "{lines}");
    assert_eq!(g.count("exec_requested"), 1, "{lines}");

    // Nothing is left to retry.
    g.command(10, OP, Command::Retry(proto::Retry {}));
    assert!(!g.reply().applied);
    assert_eq!(g.exec_requests().len(), 1);
}

#[test]
fn a_second_answer_to_an_expired_request_is_not_acted_on_either() {
    let (mut g, request) = awaiting_verdict();
    g.h.tick(at(6));
    g.verdict(7, &request);
    // The classifier answers again before the operator said anything.
    g.verdict(8, &request);
    assert!(g.exec_requests().is_empty(), "nothing runs before retry");
    assert_eq!(g.item().state, State::WaitingOnOperator);
    assert_eq!(g.count("classifier_verdict"), 1, "only the assessment's");

    g.command(9, OP, Command::Retry(proto::Retry {}));
    assert!(g.reply().applied);
    assert_eq!(g.exec_requests().len(), 1);
    assert_eq!(g.count("exec_requested"), 1);
}

#[test]
fn requests_of_one_item_that_expire_together_are_told_once() {
    let mut g = Gates::new();
    // Two commands, two checks: four requests to the classifier at once.
    let mut first = step("web1", "systemctl restart caddy");
    first.precondition = check("systemctl is-failed caddy", 0, "failed");
    first.expected = check("systemctl is-active caddy", 0, "active");
    g.propose_steps(1, vec![first, step("web1", "touch /tmp/restarted")]);
    assert_eq!(g.h.emitted::<ClassifyRequest>().len(), 4);
    let said_before = said(&g).len();
    g.h.tick(at(4));
    assert_eq!(g.item().state, State::WaitingOnOperator);
    assert_eq!(facts(&g, "deadline_passed").len(), 4, "each is logged");
    let now = said(&g);
    assert_eq!(now.len(), said_before + 1, "{now:#?}");
    assert_eq!(
        now.last().unwrap(),
        "⏱️ Item **#1**: the classifier did not answer within 2m. Nothing goes on until you say `retry` (or `nisse retry #1`)."
    );

    // Retry sends all four again; their verdicts put the plan up.
    g.command(5, OP, Command::Retry(proto::Retry {}));
    let lines = g.reply().lines;
    assert_eq!(
        lines
            .iter()
            .filter(|l| l.contains("is sent to the classifier again"))
            .count(),
        4,
        "{lines:#?}"
    );
    let resent: Vec<ClassifyRequest> = g.h.emitted::<ClassifyRequest>().split_off(4);
    assert_eq!(resent.len(), 4);
    for r in &resent {
        g.verdict(6, r);
    }
    assert_eq!(g.current().status, PlanStatus::Up);
    assert_eq!(g.item().state, State::WaitingOnOperator);
    assert_eq!(g.count("approval_requested"), 1);
}

#[test]
fn retry_sends_an_unanswered_request_again_and_its_first_answer_counts() {
    let (mut g, request) = awaiting_verdict();
    g.h.tick(at(6));
    assert_eq!(g.item().state, State::WaitingOnOperator);

    g.command(7, OP, Command::Retry(proto::Retry {}));
    let reply = g.reply();
    assert!(reply.applied, "{reply:?}");
    let lines = reply.lines.join("\n");
    assert!(
        lines.contains(&format!(
            "fact: retry: request {} is sent to the classifier again",
            request.request_id
        )),
        "{lines}"
    );
    assert_eq!(g.item().state, State::Active);
    // The same request, under a new message id.
    let resent = g.h.emitted::<ClassifyRequest>().pop().unwrap();
    let original_id = request.envelope.as_ref().unwrap().message_id.clone();
    assert_eq!(
        resent.envelope.as_ref().unwrap().message_id,
        format!("{original_id}:retry1")
    );
    assert_eq!(resent.request_id, request.request_id);
    assert_eq!(resent.action, request.action);
    assert_eq!(resent.scope, request.scope);

    // Its deadline starts again: five minutes after the first sending and
    // one after the second, nothing has expired.
    g.h.tick(at(8));
    assert_eq!(g.item().state, State::Active);
    assert_eq!(facts(&g, "deadline_passed").len(), 1);

    // The first answer runs the step; a second one changes nothing.
    g.verdict(8, &resent);
    let requests = g.exec_requests();
    assert_eq!(requests.len(), 1);
    assert_eq!(requests[0].request_id, request.request_id);
    let outbox = g.h.store.outbox().unwrap().len();
    g.verdict(9, &request);
    assert_eq!(g.exec_requests().len(), 1);
    assert_eq!(g.h.store.outbox().unwrap().len(), outbox);
    assert!(facts(&g, "late_answer").is_empty(), "not late: answered");
    assert_eq!(g.item().state, State::Active);
    g.answer(10, &requests[0], ExecStatus::Completed, 0, "");
    assert_eq!(g.current().status, PlanStatus::Done);
}

#[test]
fn an_execution_past_its_timeout_waits_and_retry_sends_the_same_signed_request() {
    let (mut g, request) = awaiting_result();
    // Its deadline: the command's timeout (10m) and the executor's grace
    // (1m) after minute 4.
    g.h.tick(at(14));
    assert_eq!(g.item().state, State::Active);
    assert!(facts(&g, "deadline_passed").is_empty());
    g.h.tick(at(15));
    assert_eq!(g.item().state, State::WaitingOnOperator);
    let expired = facts(&g, "deadline_passed");
    assert_eq!(expired.len(), 1);
    assert!(
        expired[0].contains("the executor did not answer within 11m")
            && expired[0].contains(&request.request_id),
        "{}",
        expired[0]
    );
    assert!(
        said(&g)
            .last()
            .unwrap()
            .contains("the executor did not answer within 11m"),
        "{:?}",
        said(&g)
    );

    g.command(16, OP, Command::Retry(proto::Retry {}));
    assert!(g.reply().applied);
    let requests = g.exec_requests();
    assert_eq!(requests.len(), 2);
    let resent = &requests[1];
    let mut envelope = request.envelope.clone().unwrap();
    let resent_envelope = resent.envelope.clone().unwrap();
    assert_eq!(
        resent_envelope.message_id,
        format!("{}:retry1", envelope.message_id)
    );
    // The same request, signature and all: the executor runs a request id
    // at most once, so sending it again is safe.
    envelope.message_id = resent_envelope.message_id.clone();
    envelope.causation_id = resent_envelope.causation_id.clone();
    assert_eq!(
        ExecRequest {
            envelope: Some(envelope),
            ..request.clone()
        },
        *resent
    );
    assert_eq!(resent.signature, request.signature);
    nisse_bus::signing::verify(AGENT, &g.h.signer.public(), resent).unwrap();

    g.answer(17, resent, ExecStatus::Completed, 0, "");
    assert_eq!(g.current().status, PlanStatus::Done);
    assert_eq!(g.count("step_result"), 1);
}

#[test]
fn retry_with_nothing_expired_says_there_is_nothing_to_retry() {
    let (mut g, _) = awaiting_verdict();
    let said_before = said(&g).len();
    let logged_before = g.kinds().len();
    g.command(4, OP, Command::Retry(proto::Retry {}));
    let reply = g.reply();
    assert!(!reply.applied);
    assert_eq!(
        reply.error,
        "item #1 has no request that went unanswered: nothing to retry"
    );
    assert!(reply.lines.is_empty(), "{reply:?}");
    assert_eq!(g.item().state, State::Active);
    assert_eq!(g.kinds().len(), logged_before);
    assert_eq!(said(&g).len(), said_before);
    assert_eq!(g.h.emitted::<ClassifyRequest>().len(), 2, "nothing resent");

    // Someone not on the allowlist cannot retry an expired request.
    g.h.tick(at(6));
    g.command(7, "cli:mallory", Command::Retry(proto::Retry {}));
    assert_eq!(g.item().state, State::WaitingOnOperator);
    assert_eq!(g.h.emitted::<ClassifyRequest>().len(), 2, "nothing resent");
    assert_eq!(facts(&g, "ignored").len(), 1);
}

#[test]
fn an_approval_request_that_expires_is_announced_once() {
    let mut g = Gates::new();
    g.propose(1, RESTART);
    g.classify(2);
    assert_eq!(g.current().status, PlanStatus::Up);
    let said_before = said(&g).len();

    // The approval expiry is an hour after it was put up, at minute 2.
    g.h.tick(at(61));
    assert_eq!(said(&g).len(), said_before);
    g.h.tick(at(63));
    let now = said(&g);
    assert_eq!(now.len(), said_before + 1, "{now:#?}");
    assert!(
        now.last().unwrap().contains(
            "the approval request for rev-1 expired unanswered; it can no longer be approved as it was put up, and nothing of it runs. Approving rev-1 now puts it up again"
        ),
        "{now:#?}"
    );
    assert_eq!(facts(&g, "approval_expired").len(), 1);
    g.h.tick(at(64));
    g.h.tick(at(90));
    assert_eq!(said(&g).len(), said_before + 1);
    assert_eq!(facts(&g, "approval_expired").len(), 1);

    // Approving it now is refused, as it always was, and it is put up
    // again; that request expires on its own, announced once more.
    g.approve(91, OP, 1);
    assert_eq!(g.count("approved"), 0);
    assert!(g.refusals()[0].contains("expired"), "{:?}", g.refusals());
    assert_eq!(g.count("approval_requested"), 2);
    g.h.tick(at(150));
    assert_eq!(facts(&g, "approval_expired").len(), 1);
    g.h.tick(at(152));
    g.h.tick(at(153));
    assert_eq!(facts(&g, "approval_expired").len(), 2);
}

#[test]
fn after_the_switch_grace_a_tick_takes_up_the_next_ready_item() {
    let mut g = Gates::new();
    g.h.alert(1, "firing", DISK);
    g.propose(2, RESTART);
    g.classify(3);
    let items = g.h.items();
    assert_eq!(
        (items[0].state, items[1].state),
        (State::WaitingOnOperator, State::Ready)
    );
    let said_before = said(&g).len();

    // The waiting item keeps the agent's attention for the grace (10m).
    g.h.tick(at(12));
    assert_eq!(g.h.items()[1].state, State::Ready);
    assert_eq!(said(&g).len(), said_before);

    g.h.tick(at(14));
    let items = g.h.items();
    assert_eq!(
        (items[0].state, items[1].state),
        (State::WaitingOnOperator, State::Active)
    );
    let now = said(&g);
    assert_eq!(now.len(), said_before + 1);
    assert!(
        now.last()
            .unwrap()
            .contains("Now working on item **#2**: **DiskFull**"),
        "{now:#?}"
    );
}

#[test]
fn the_switch_grace_is_the_brains_setting() {
    let mut h = Harness::desk(BrainSettings {
        switch_grace: std::time::Duration::from_secs(120),
        ..settings()
    });
    h.alert(0, "firing", CPU);
    h.alert(1, "firing", DISK);
    let mut g = Gates::around(h);
    g.propose(2, RESTART);
    g.classify(3);
    g.h.tick(at(4));
    assert_eq!(g.h.items()[1].state, State::Ready);
    g.h.tick(at(6));
    assert_eq!(g.h.items()[1].state, State::Active);
}

/// Items whose loop is driven by a scripted model: each alert opens one,
/// and its loop starts.
#[derive(Debug, Clone, Default)]
struct Looped;

impl Duties for Looped {
    fn apply(
        &mut self,
        brain: &BrainSettings,
        txn: &mut Txn<'_, '_>,
        message: &AnyMessage,
    ) -> Result<(), StoreError> {
        let AnyMessage::InAlert(msg) = message else {
            return Ok(());
        };
        let env = msg.envelope.clone().unwrap_or_default();
        let alert = msg.alert.clone().unwrap_or_default();
        let item = txn.open_item(
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
        txn.loop_open(brain.agent_loop(), &item, "the item opened")
    }

    fn use_project(
        &mut self,
        _brain: &BrainSettings,
        _txn: &mut Txn<'_, '_>,
        _item: &WorkItem,
        _project: &str,
    ) -> Result<String, StoreError> {
        Ok(String::new())
    }
}

fn models() -> ModelsConfig {
    let entry = ModelEntry {
        profile: Profile {
            context_window: 16_000,
            max_output_tokens: 512,
            ..Profile::default()
        },
        ..ModelEntry::default()
    };
    ModelsConfig {
        roles: BTreeMap::from([
            (Role::Driver, "local".to_string()),
            (Role::Helper, "local".to_string()),
            (Role::Expert, "local".to_string()),
            (Role::Classifier, "local".to_string()),
        ]),
        models: BTreeMap::from([("local".to_string(), entry)]),
        ..ModelsConfig::default()
    }
}

/// A brain whose item #1 has a loop, started and pinned at minute 0.
fn looped() -> crate::rig::Harness<AgentBrain<Looped>> {
    let brain = AgentBrain::new(settings(), Looped).with_models(models());
    let mut h = crate::rig::Harness::new(AGENT, brain);
    h.alert_with(0, "firing", CPU, |_| ());
    // The brain's own pin comes back on its stream.
    let pin = h.emitted::<RolesPinned>().pop().unwrap();
    h.apply(at(0), AnyMessage::LoopPin(pin));
    h
}

/// The model's reply to the last request: one call of `tool`.
fn model_calls(
    h: &mut crate::rig::Harness<AgentBrain<Looped>>,
    minute: i64,
    tool: &str,
    args: serde_json::Value,
) {
    let request = h.emitted::<ModelRequest>().pop().unwrap();
    let item = h.items()[0].id.clone();
    let msg = ModelResponse {
        envelope: Some(h.envelope(
            at(minute),
            &item,
            proto::ActorKind::Service,
            "model-gateway",
            format!("resp:{}", request.request_id),
        )),
        request_id: request.request_id.clone(),
        outcome: Some(Outcome::Reply(ModelReply {
            content: String::new(),
            tool_calls: vec![ToolCall {
                id: format!("call_{minute}"),
                name: tool.into(),
                arguments_json: args.to_string(),
            }],
            finish_reason: "tool_calls".into(),
        })),
        model: request.model.clone(),
        usage: Some(proto::Usage {
            prompt_tokens: 100,
            completion_tokens: 10,
        }),
        ..Default::default()
    };
    h.apply(at(minute), AnyMessage::ModelResp(msg));
}

#[test]
fn a_start_asks_a_pending_question_again_and_not_an_answered_one() {
    let mut h = looped();
    model_calls(
        &mut h,
        1,
        "ask_human",
        json!({ "question": "May I restart caddy?" }),
    );
    let item = h.items()[0].clone();
    assert_eq!(item.state, State::WaitingOnOperator);
    let loop_status = |h: &crate::rig::Harness<AgentBrain<Looped>>| {
        h.store.snapshot().unwrap().loops[0].1.status.clone()
    };
    assert!(matches!(loop_status(&h), Status::Asking { .. }));
    let asked = h.outbound().len();

    h.started(at(2));
    let out = h.outbound();
    assert_eq!(out.len(), asked + 1);
    let again = &out.last().unwrap().markdown;
    assert!(
        again.contains("asked again") && again.contains("May I restart caddy?"),
        "{again}"
    );
    assert_eq!(
        out.last().unwrap().envelope.as_ref().unwrap().work_item_id,
        item.id
    );
    assert_eq!(item.state, h.items()[0].state, "still waiting");

    // Answered: a later start has nothing to ask.
    h.said(3, "@op2:example.org", "yes, go ahead", &item.id);
    assert!(!matches!(loop_status(&h), Status::Asking { .. }));
    let said_before = h.outbound().len();
    h.started(at(4));
    assert_eq!(h.outbound().len(), said_before);
    let asked_again = h.logged(&item.id, |e| match e {
        Event::Fact { data, .. } if data.get("asked_again").is_some() => Some(()),
        _ => None,
    });
    assert_eq!(asked_again.len(), 1);
}

#[test]
fn a_recorded_stream_with_ticks_retries_and_a_start_rebuilds_the_same_state() {
    let (mut g, _) = awaiting_result();
    g.h.alert(5, "firing", DISK);
    g.h.tick(at(10));
    g.h.tick(at(15));
    // The executor's answer comes late; the operator retries.
    let request = g.exec_requests().remove(0);
    g.answer(16, &request, ExecStatus::Completed, 0, "");
    g.h.started(at(17));
    g.command(18, OP3, Command::Retry(proto::Retry {}));
    assert_eq!(g.current().status, PlanStatus::Done);
    // A second plan put up and left to expire; the other item taken up.
    g.propose(19, RESTART);
    g.classify(20);
    g.h.tick(at(31));
    g.h.tick(at(80));
    g.h.tick(at(81));
    g.command(82, OP, Command::Retry(proto::Retry {}));
    let live = g.h.store.snapshot().unwrap();
    assert!(
        live.events.iter().any(|e| matches!(
            &e.event,
            Event::Fact { data, .. } if data.get("approval_expired").is_some()
        )),
        "the stream holds an expiry"
    );
    let items = g.h.items();
    assert_eq!(
        (items[0].state, items[1].state),
        (State::WaitingOnOperator, State::Active)
    );

    let replay = g.h.replay(AgentBrain::new(settings(), Desk));
    assert_eq!(replay.store.snapshot().unwrap(), live);
    assert_eq!(replay.store.outbox().unwrap(), g.h.store.outbox().unwrap());
    assert_eq!(
        replay.store.duty_states().unwrap(),
        g.h.store.duty_states().unwrap()
    );
}

#[test]
fn retry_in_the_items_thread_goes_on_as_the_cli_does() {
    let (mut g, request) = awaiting_verdict();
    g.h.tick(at(6));
    assert_eq!(g.item().state, State::WaitingOnOperator);
    g.verdict(8, &request);
    assert!(g.exec_requests().is_empty());
    let id = g.item().id;

    // Someone not on the allowlist says it: recorded, nothing moves.
    g.h.said(9, "@mallory:example.org", "retry", &id);
    assert_eq!(g.item().state, State::WaitingOnOperator);
    assert!(g.exec_requests().is_empty());

    // The operator says it in the item's thread: the kept verdict is
    // applied, and the thread says what was done.
    g.h.said(10, "@op2:example.org", "desk: retry.", &id);
    assert_eq!(g.item().state, State::Active);
    assert_eq!(g.exec_requests().len(), 1);
    let told = said(&g);
    assert!(
        told.iter()
            .any(|t| t.starts_with("🔁 retry: the late answer to") && t.contains("is applied")),
        "{told:?}"
    );

    // Again: nothing left, and the thread says so.
    g.h.said(11, "@op2:example.org", "retry", &id);
    let last = said(&g).last().cloned().unwrap();
    assert!(last.contains("nothing to retry"), "{last}");
    assert_eq!(g.exec_requests().len(), 1);
}
