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
    let bound: Vec<Vec<String>> = g.h.logged(&item.id, |e| match e {
        Event::HostsBound { added, .. } => Some(added),
        _ => None,
    });
    assert_eq!(bound, [vec!["host1".to_string()], vec!["web1".to_string()]]);

    // Anyone else (the model, later) may only use bound hosts.
    let mut batch = g.h.store.batch().unwrap();
    batch
        .apply(999, "", "probe", at(2), |txn| {
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
