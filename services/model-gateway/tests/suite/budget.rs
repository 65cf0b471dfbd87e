//! Budgets per work item and role, kept in the usage bucket.

use pretty_assertions::assert_eq;

use nisse_bus::proto::ModelErrorKind;
use nisse_model_gateway::Gateway;
use nisse_tests::model::Reply;

use super::{Rig, error, reply, request};

const BUDGETED: &str = r#"
roles = { driver = "local", classifier = "local" }
[models.local]
[budgets.driver]
calls = 2
tokens = 1000
"#;

#[tokio::test]
async fn the_calls_cap_refuses_without_calling_and_survives_a_restart() {
    let rig = Rig::start().await;
    let agent = nisse_tests::ops();
    let gateway = rig.gateway(BUDGETED);
    rig.model.push([
        Reply::TextWithUsage {
            text: "one".into(),
            prompt_tokens: 100,
            completion_tokens: 20,
        },
        Reply::TextWithUsage {
            text: "two".into(),
            prompt_tokens: 200,
            completion_tokens: 30,
        },
    ]);
    for id in ["r1", "r2"] {
        let r = gateway
            .complete(&agent, &request(id, "driver", "wi-1"), "brain")
            .await;
        reply(&r);
    }
    let usage = nisse_model_gateway::usage::read(&rig.bus, &agent, "wi-1", "driver")
        .await
        .unwrap();
    assert_eq!(
        (usage.calls, usage.prompt_tokens, usage.completion_tokens),
        (2, 300, 50)
    );

    let r = gateway
        .complete(&agent, &request("r3", "driver", "wi-1"), "brain")
        .await;
    let (kind, message) = error(&r);
    assert_eq!(kind, ModelErrorKind::BudgetExceeded);
    assert!(
        message.contains("2 of 2 calls (models.budgets.driver.calls)"),
        "{message}"
    );
    assert!(message.contains("350 of 1000 tokens"), "{message}");
    assert_eq!(r.attempts, 0);
    assert_eq!(rig.model.requests().len(), 2, "no HTTP call over budget");

    // A restarted gateway, on a new connection, reads the same count.
    drop(gateway);
    let bus = rig.nats.bus(&["ops"]).await.unwrap();
    let restarted = Gateway::new(rig.config(BUDGETED), bus).unwrap();
    let r = restarted
        .complete(&agent, &request("r4", "driver", "wi-1"), "brain")
        .await;
    assert_eq!(error(&r).0, ModelErrorKind::BudgetExceeded);
    assert_eq!(rig.model.requests().len(), 2);

    // Other items, other roles and calls without an item have their own.
    rig.model.push([
        Reply::Text("a".into()),
        Reply::Text("b".into()),
        Reply::Text("c".into()),
    ]);
    reply(
        &restarted
            .complete(&agent, &request("r5", "driver", "wi-2"), "brain")
            .await,
    );
    reply(
        &restarted
            .complete(&agent, &request("r6", "classifier", "wi-1"), "classifier")
            .await,
    );
    reply(
        &restarted
            .complete(&agent, &request("r7", "driver", ""), "brain")
            .await,
    );

    // The refusals are captured like any other call.
    let captures = rig.captures().await;
    let outcomes: Vec<(&str, &str, &str)> = captures
        .iter()
        .map(|c| (c.request_id.as_str(), c.outcome.as_str(), c.caller.as_str()))
        .collect();
    assert_eq!(
        outcomes,
        vec![
            ("r1", "ok", "brain"),
            ("r2", "ok", "brain"),
            ("r3", "budget_exceeded", "brain"),
            ("r4", "budget_exceeded", "brain"),
            ("r5", "ok", "brain"),
            ("r6", "ok", "classifier"),
            ("r7", "ok", "brain"),
        ]
    );
    let usages = nisse_model_gateway::usage::all(&rig.bus, &agent)
        .await
        .unwrap();
    assert_eq!(usages.len(), 3, "{usages:?}");
}

#[tokio::test]
async fn the_tokens_cap_refuses_once_spent() {
    let rig = Rig::start().await;
    let agent = nisse_tests::ops();
    let gateway = rig.gateway(BUDGETED);
    rig.model.push([Reply::TextWithUsage {
        text: "long".into(),
        prompt_tokens: 900,
        completion_tokens: 200,
    }]);
    reply(
        &gateway
            .complete(&agent, &request("r1", "driver", "wi-1"), "brain")
            .await,
    );
    let r = gateway
        .complete(&agent, &request("r2", "driver", "wi-1"), "brain")
        .await;
    let (kind, message) = error(&r);
    assert_eq!(kind, ModelErrorKind::BudgetExceeded);
    assert!(
        message.contains("(tokens)") && message.contains("1100 of 1000 tokens"),
        "{message}"
    );
    assert_eq!(rig.model.requests().len(), 1);
}
