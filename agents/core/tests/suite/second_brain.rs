//! A new brain gets the operator's commands for free: [`Desk`] implements
//! only its intake (an item per alert) and its answer to `use <project>`,
//! and still approve, deny, stop, abandon and status work, from the CLI
//! and in chat, for operators on its allowlist and for no one else.
//!
//! [`Desk`]: super::harness::Desk

use pretty_assertions::assert_eq;

use nisse_bus::proto::{self, TellKind, operator_command::Command};
use nisse_core::plans::PlanStatus;
use nisse_core::{Event, State};

use super::harness::{Gates, OP};

const RESTART: &[(&str, &str)] = &[("web1", "systemctl restart caddy")];
/// `OP2`'s Matrix id.
const OPERATOR: &str = "@op2:example.org";
const STRANGER: &str = "@eve:example.org";

fn last_said(g: &Gates) -> String {
    g.h.outbound().pop().unwrap().markdown
}

#[test]
fn a_second_brain_takes_approve_deny_stop_and_abandon_from_the_cli() {
    let mut g = Gates::new();
    g.propose(1, RESTART);
    g.classify(2);
    assert_eq!(g.current().status, PlanStatus::Up);

    // Someone not on the allowlist: refused, recorded, not answered.
    let said = g.h.outbound().len();
    g.approve(3, "cli:mallory", 1);
    g.command(3, "cli:mallory", Command::Stop(proto::Stop {}));
    assert_eq!(g.count("approved"), 0);
    assert!(
        g.refusals()[0].contains("not on the operator allowlist"),
        "{:?}",
        g.refusals()
    );
    assert_eq!(g.count("stopped"), 0);
    assert_eq!(g.current().status, PlanStatus::Up);
    assert_eq!(g.h.outbound().len(), said);

    // Deny.
    g.command(
        4,
        OP,
        Command::Deny(proto::Deny {
            revision: 1,
            reason: "not now".into(),
        }),
    );
    assert_eq!(g.current().status, PlanStatus::Denied);
    assert!(last_said(&g).contains("Denied rev-1"), "{}", last_said(&g));

    // Approve: the plan runs when its item is active.
    g.propose(5, RESTART);
    g.classify(6);
    g.approve(7, OP, 2);
    let plan = g.current();
    assert_eq!((plan.revision, plan.status), (2, PlanStatus::Running));
    assert_eq!(plan.approved_via.as_deref(), Some("cli"));
    g.classify(8);
    assert_eq!(g.exec_requests().len(), 1);

    // Stop: the plan ends at the step boundary and the operator is asked.
    g.command(9, OP, Command::Stop(proto::Stop {}));
    assert_eq!(g.current().status, PlanStatus::Halted);
    assert_eq!(g.item().state, State::WaitingOnOperator);
    assert!(last_said(&g).contains("What next?"), "{}", last_said(&g));

    // Abandon: the item closes.
    g.abandon(10, OP, "fixed by hand");
    assert_eq!(g.item().state, State::Closed);
    assert_eq!(g.count("abandoned"), 1);
}

#[test]
fn a_second_brain_takes_the_chat_vocabulary_and_reactions() {
    let mut g = Gates::new();
    let item = g.item();

    // `status` and a question are answered by code.
    g.h.said(1, OPERATOR, "status", &item.id);
    assert!(
        last_said(&g).starts_with("Item **#1** · **HighCPU** · active"),
        "{}",
        last_said(&g)
    );
    g.h.said(2, OPERATOR, "desk: anything new?", &item.id);
    assert!(
        last_said(&g).starts_with("Item **#1**"),
        "{}",
        last_said(&g)
    );
    // The agent's own words, from its duties.
    g.h.said(3, OPERATOR, "use homelab", &item.id);
    assert_eq!(last_said(&g), "Noted: `homelab`.");

    g.propose(4, RESTART);
    g.classify(5);
    let request = g.h.outbound().pop().unwrap();
    assert_eq!(
        (request.kind, request.plan_revision),
        (TellKind::ApprovalRequest as i32, 1)
    );

    // A stranger's ✅ and `approve` are refused or only recorded.
    g.h.reacted(6, STRANGER, "✅", &item.id, 1);
    g.h.said(7, STRANGER, "approve", &item.id);
    assert_eq!(g.count("approved"), 0);
    assert!(
        g.refusals()[0].contains("not on the operator allowlist for matrix"),
        "{:?}",
        g.refusals()
    );

    // Deny in words.
    g.h.said(8, OPERATOR, "deny rev-1 too risky", &item.id);
    assert_eq!(g.current().status, PlanStatus::Denied);
    let reason =
        g.h.logged(&item.id, |e| match e {
            Event::Denied { reason, .. } => Some(reason),
            _ => None,
        })
        .remove(0);
    assert_eq!(reason, "too risky");

    // The operator's ✅ approves the revision it was put on.
    g.propose(9, RESTART);
    g.classify(10);
    g.h.reacted(11, OPERATOR, "✅\u{fe0f}", &item.id, 2);
    let plan = g.current();
    assert_eq!((plan.revision, plan.status), (2, PlanStatus::Running));
    assert_eq!(plan.approved_via.as_deref(), Some("matrix"));
    g.h.said(12, OPERATOR, "status", &item.id);
    assert!(
        last_said(&g).ends_with("Plan rev-2: running"),
        "{}",
        last_said(&g)
    );

    // Stop, then abandon.
    g.h.said(13, OPERATOR, "Stop.", &item.id);
    assert_eq!(g.current().status, PlanStatus::Halted);
    assert_eq!(g.item().state, State::WaitingOnOperator);
    g.h.said(14, OPERATOR, "abandon fixed by hand", &item.id);
    assert_eq!(g.item().state, State::Closed);
    assert!(
        last_said(&g).contains("Abandoned item **#1**: fixed by hand"),
        "{}",
        last_said(&g)
    );
}
