//! The gates around the ops brain (the shared rig's, from nisse-core's
//! tests) on a real state store: the real classifier's verdicts
//! (`nisse_classifier::decide` with the built-in policy), the executor's
//! results and the operator's commands, for the agent loop's tests; and the
//! hosts an alert binds. The plan machine's own tests are nisse-core's.

use nisse_bus::proto;

use super::rig::{self, OP, OP2, at};
use super::*;
use pretty_assertions::assert_eq;

/// The ops brain with the services around it.
pub(super) type Gates = rig::Gates<OpsBrain>;

fn config() -> Config {
    Config {
        operators: vec![OP.into(), OP2.into()],
        ..Config::default()
    }
}

impl Gates {
    /// A brain with one active item (#1, from an alert at minute 0).
    fn new() -> Self {
        let mut h = Harness::ops(config());
        h.alert(0, "firing", CPU);
        Self::around(h)
    }
}

#[test]
fn a_proposal_binds_no_host_and_an_approval_binds_only_its_revisions_hosts() {
    let mut g = Gates::new();
    let item = g.item();
    let bound = |g: &Gates| -> Vec<(Vec<String>, String)> {
        g.h.logged(&item.id, |e| match e {
            Event::HostsBound { added, reason, .. } => Some((added, reason)),
            _ => None,
        })
    };
    // The alert's instance label bound its host, in the item's log; the
    // executor hears of it with the item's first command, not before.
    assert_eq!(bound(&g).len(), 1);
    assert_eq!(bound(&g)[0].0, ["host1"]);
    assert!(g.h.emitted::<proto::HostBinding>().is_empty());

    // An MCP client proposes, through `nisse mcp serve`, a plan on db01;
    // then the operator one on web1 in its place. Neither binds a host:
    // the item's model could not reach db01 or web1 now.
    let plan = |target: &str, command: &str| {
        proto::operator_command::Command::ProposePlan(proto::ProposePlan {
            plan: Some(proto::Plan {
                rationale: "from an MCP client".into(),
                steps: vec![rig::step(target, command)],
            }),
        })
    };
    g.command(1, "mcp:mcp", plan("db01", "systemctl restart postgresql"));
    assert_eq!(
        g.current().revision,
        1,
        "the surface's proposal is recorded"
    );
    g.classify(1);
    assert_eq!(bound(&g).len(), 1, "proposed and put up: nothing bound");
    let request = |g: &Gates, revision: u32| {
        g.h.outbound()
            .into_iter()
            .find(|t| t.plan_revision == revision)
            .unwrap()
            .markdown
    };
    // What approving would bind is said in the request.
    assert!(
        request(&g, 1).contains("Approving binds** **db01** to item #1"),
        "{}",
        request(&g, 1)
    );
    g.propose(
        2,
        &[("web1", "systemctl restart caddy"), ("host1", "uptime")],
    );
    g.classify(2);
    assert_eq!(bound(&g).len(), 1);
    assert!(request(&g, 2).contains("Approving binds** **web1** to item #1"));

    // Anyone else (the item's model) may only use bound hosts: not db01,
    // which the MCP client's plan named.
    let mut batch = g.h.store.batch().unwrap();
    batch
        .apply(999, "", "probe", at(2), |txn| {
            let item = txn.find_item("#1")?.unwrap();
            let steps = vec![(
                nisse_policy::Step {
                    action: nisse_policy::Action::shell("db01", "uptime"),
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
    g.h.seq = 999;
    let events = g.h.store.events(&item.id).unwrap();
    let last = events.last().unwrap();
    match &last.event {
        nisse_core::Event::PlanRejected { reason, .. } => {
            assert!(reason.contains("not bound to item #1: db01"), "{reason}");
            assert!(reason.contains("(bound: host1)"), "{reason}");
        }
        other => panic!("{other:?}"),
    }

    // Approving rev-2 binds its hosts, and only those: never db01, which
    // only the superseded rev-1 named. The log says who approved what.
    g.approve(3, OP, 2);
    assert_eq!(
        bound(&g)[1],
        (
            vec!["web1".to_string()],
            "named in rev-2, which operator:op approved via cli".to_string()
        )
    );
    assert_eq!(bound(&g).len(), 2);
    let approved =
        g.h.outbound()
            .into_iter()
            .map(|t| t.markdown)
            .find(|m| m.contains("Approved rev-2"))
            .unwrap();
    assert!(
        approved.contains("Bound to item **#1** now: **web1**."),
        "{approved}"
    );
    // The executor reads the binding from the stream: the one sent with
    // the first step's request holds web1, not db01.
    g.classify(3);
    let first = g.exec_requests().pop().unwrap();
    assert_eq!(first.host, "web1");
    let binding = g.h.emitted::<proto::HostBinding>().pop().unwrap();
    assert_eq!(binding.hosts, ["host1", "web1"]);
}

#[test]
fn an_items_whole_binding_goes_to_the_executor_signed_just_before_each_of_its_requests() {
    let mut g = Gates::new();
    let item = g.item();
    g.propose(
        1,
        &[("web1", "systemctl reload caddy"), ("host1", "uptime")],
    );
    g.classify(1);
    g.approve(2, OP, 1);
    g.classify(2);
    // The outbox in order: the binding, then the request it is for.
    let sent = |g: &Gates| -> Vec<String> {
        g.h.store
            .outbox()
            .unwrap()
            .into_iter()
            .map(|o| o.type_name)
            .filter(|t| t.ends_with("HostBinding") || t.ends_with("ExecRequest"))
            .collect()
    };
    assert_eq!(sent(&g), ["nisse.v1.HostBinding", "nisse.v1.ExecRequest"]);
    let first = g.exec_requests().pop().unwrap();
    let binding = g.h.emitted::<proto::HostBinding>().pop().unwrap();
    assert_eq!(binding.hosts, ["host1", "web1"], "the item's whole set");
    assert_eq!(binding.work_item_id, item.id);
    let env = binding.envelope.as_ref().unwrap();
    assert_eq!(env.work_item_id, item.id, "the subject is per item");
    assert_eq!(
        env.message_id,
        format!("bind:{}:{}", item.id, first.request_id)
    );
    nisse_bus::signing::verify("ops", &g.h.signer.public(), &binding).unwrap();

    // The second step's request has a binding of its own before it.
    g.answer(3, &first, proto::ExecStatus::Completed, 0, "");
    g.classify(4);
    assert_eq!(
        sent(&g),
        [
            "nisse.v1.HostBinding",
            "nisse.v1.ExecRequest",
            "nisse.v1.HostBinding",
            "nisse.v1.ExecRequest"
        ]
    );
    let second = g.exec_requests().pop().unwrap();
    assert_eq!(second.host, "host1");
    let binding = g.h.emitted::<proto::HostBinding>().pop().unwrap();
    assert_eq!(
        binding.envelope.unwrap().message_id,
        format!("bind:{}:{}", item.id, second.request_id)
    );
    assert_eq!(binding.hosts, ["host1", "web1"]);
}
