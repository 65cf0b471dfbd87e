//! The gates end to end, each service in its own process on a real NATS:
//! a plan proposed with `nisse plan propose`, classified by the classifier
//! service, put up, approved with `nisse approve`, halted by `nisse
//! autonomy off` before anything runs, continued, and the execution request
//! on the stream; then the stream rebuilds the same state.

use std::time::Duration;

use pretty_assertions::assert_eq;

use nisse_bus::proto::{self, Envelope};
use nisse_bus::{AnyMessage, Contract as _};
use nisse_core::plans::PlanStatus;
use nisse_tests::TestNats;

use super::alerts::{Install, publish_alert, rebuild, stop, wait_quiet};
use super::{nisse, run, text};

/// Runs `nisse <args>` in the install's directory; its stdout, or the test
/// fails with its stderr.
pub(super) async fn cli(install: &Install, args: &[&str]) -> String {
    let out = run(nisse(install.path()).args(args)).await;
    assert!(
        out.status.success(),
        "nisse {args:?} failed: {}",
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// The subject kinds of every message in the ops stream, in order.
pub(super) async fn stream_kinds(nats: &TestNats) -> Vec<AnyMessage> {
    let bus = nats.bus(&["ops"]).await.unwrap();
    let agent: nisse_bus::AgentName = "ops".parse().unwrap();
    let mut reader = bus.read_range(&agent, 1, None).await.unwrap();
    let mut out = Vec::new();
    while let Some(m) = reader.next().await {
        if let Ok(msg) = m.unwrap().decode() {
            out.push(msg);
        }
    }
    out
}

#[tokio::test]
async fn a_plan_is_classified_approved_halted_by_the_kill_switch_and_continued() {
    let nats = TestNats::secured(&["ops"]).await.unwrap();
    let (install, mut intake, mut brain) = Install::start(&nats, nats.bus_config()).await;
    let mut classifier = install.serve(&["classifier"]);

    // An alert opens item #1.
    let bus = nats.bus(&["ops"]).await.unwrap();
    publish_alert(&nats, "DiskFull", "nas01").await;
    install
        .wait_until("item #1 exists", Duration::from_secs(20), |s| {
            s.items.len() == 1
        })
        .await;

    std::fs::write(
        install.path().join("plan.toml"),
        r#"
rationale = "The old dataset holds nothing anyone reads."

[[step]]
target = "nas01"
command = "zfs snapshot tank/media/old@before-destroy"

[[step]]
target = "nas01"
command = "zfs destroy -r tank/media/old"
precondition = { command = "zfs list tank/media/old" }
"#,
    )
    .unwrap();
    let out = cli(&install, &["plan", "propose", "1", "plan.toml"]).await;
    assert!(out.contains("plan rev-1 proposed (2 steps)"), "{out}");

    // The classifier service answers; the brain puts the plan up.
    install
        .wait_until("rev-1 is up", Duration::from_secs(20), |s| {
            s.plans.iter().any(|p| p.status == PlanStatus::Up)
        })
        .await;
    let shown = cli(&install, &["plan", "show", "#1"]).await;
    assert!(shown.contains("Approval needed: item #1 rev-1"), "{shown}");
    assert!(shown.contains("Irreversible:** step 2"), "{shown}");
    assert!(shown.contains("reversible_low, class 2"), "{shown}");
    assert!(shown.contains("approve rev-1"), "{shown}");

    let out = cli(&install, &["autonomy", "off"]).await;
    assert!(out.contains("autonomy: off"), "{out}");
    // Bare, from the CLI (which shows no request of its own), it is
    // answered with the revision to name; named, its destructive step
    // must be named back too.
    let out = cli(&install, &["approve", "1"]).await;
    assert!(out.contains("name the revision: approve rev-1"), "{out}");
    let out = cli(&install, &["approve", "1", "rev-1"]).await;
    assert!(
        out.contains(
            "rev-1 has destructive steps: type nisse approve #1 rev-1 --confirm '#1 step 2'"
        ),
        "{out}"
    );
    let out = cli(
        &install,
        &["approve", "1", "rev-1", "--confirm", "#1 step 2"],
    )
    .await;
    assert!(out.contains("approved rev-1 by operator:"), "{out}");
    assert!(out.contains("via cli"), "{out}");

    // Autonomy went off after the plan was put up and before it ran: the
    // first step is halted, and nothing was sent to be executed.
    let s = install
        .wait_until("rev-1 halted", Duration::from_secs(20), |s| {
            s.plans.iter().any(|p| p.halted.is_some())
        })
        .await;
    assert!(
        s.plans[0]
            .halted
            .as_deref()
            .unwrap()
            .contains("autonomy is off"),
        "{:?}",
        s.plans[0]
    );
    let kinds = stream_kinds(&nats).await;
    assert!(
        !kinds.iter().any(|m| matches!(m, AnyMessage::ExecReq(_))),
        "nothing may reach the executor"
    );

    // A second approval names the halted step: it runs, autonomy still off.
    let out = cli(
        &install,
        &["approve", "1", "rev-1", "--confirm", "#1 step 2"],
    )
    .await;
    assert!(out.contains("approved rev-1"), "{out}");
    install
        .wait_until("step 1 requested", Duration::from_secs(20), |s| {
            s.events.iter().any(|e| e.event.kind() == "exec_requested")
        })
        .await;
    let live = wait_quiet(&install, &nats).await;
    let execs: Vec<proto::ExecRequest> = stream_kinds(&nats)
        .await
        .into_iter()
        .filter_map(|m| match m {
            AnyMessage::ExecReq(r) => Some(r),
            _ => None,
        })
        .collect();
    assert_eq!(execs.len(), 1);
    assert_eq!(execs[0].host, "nas01");
    assert_eq!(
        execs[0].command,
        "zfs snapshot tank/media/old@before-destroy"
    );
    assert_eq!(execs[0].envelope().unwrap().work_item_id, live.items[0].id);
    // Every verdict is on the item's log.
    let verdicts = live
        .events
        .iter()
        .filter(|e| e.event.kind() == "classifier_verdict")
        .count();
    assert_eq!(verdicts, 5, "3 at proposal, 2 for step 1's runs");

    let out = cli(&install, &["autonomy"]).await;
    assert!(out.contains("autonomy: off"), "{out}");
    cli(&install, &["autonomy", "on"]).await;

    // Switches that cannot be read fail the classifier closed: even a
    // read-only command needs discussion then.
    bus.jetstream()
        .delete_stream(format!("KV_{}", nisse_bus::topology::SWITCH_BUCKET))
        .await
        .unwrap();
    bus.publish(proto::ClassifyRequest {
        envelope: Some(Envelope {
            agent: "ops".into(),
            message_id: "classify:probe".into(),
            ..Default::default()
        }),
        request_id: "probe".into(),
        action: Some(nisse_policy::Action::shell("nas01", "uptime").to_wire(None)),
        scope: None,
        model: String::new(),
    })
    .await
    .unwrap();
    let verdict = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            let found = stream_kinds(&nats).await.into_iter().find_map(|m| match m {
                AnyMessage::ClassifyVerdict(v) if v.request_id == "probe" => Some(v),
                _ => None,
            });
            if let Some(v) = found {
                return v;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .expect("the classifier answered");
    assert_eq!(verdict.decided_by, proto::DecidedBy::FailClosed as i32);
    assert_eq!(
        verdict.verdict,
        proto::Verdict::DangerousNeedsDiscussion as i32
    );
    let live = wait_quiet(&install, &nats).await;

    stop(&mut classifier).await;
    stop(&mut intake).await;
    stop(&mut brain).await;
    let (_, rebuilt, _) = rebuild(&install).await;
    assert_eq!(rebuilt, live);
}

#[tokio::test]
async fn policy_classify_explains_each_simple_command() {
    let dir = tempfile::tempdir().unwrap();
    let out = run(nisse(dir.path()).args([
        "policy",
        "classify",
        "journalctl -u caddy | tail -n 5; sudo sh -c 'rm -rf /srv/old'",
    ]))
    .await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let o = text(&out.stdout);
    assert!(o.contains("journal.read"), "{o}");
    assert!(o.contains("rm.delete"), "{o}");
    assert!(o.contains("via sudo › sh -c"), "{o}");
    assert!(o.contains("=> destructive (class 3)"), "{o}");

    let out = run(nisse(dir.path()).args(["policy", "classify", "uptime", "--json"])).await;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["risk"], "read_only");
    assert_eq!(v["class"], 1);

    std::fs::write(
        dir.path().join("site.toml"),
        "version = 1\n\n[[never]]\ntargets = [\"gw-*\"]\n",
    )
    .unwrap();
    let out = run(nisse(dir.path()).args(["policy", "check", "site.toml"])).await;
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("site.toml:3:"),
        "{}",
        text(&out.stderr)
    );
}
