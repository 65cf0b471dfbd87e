//! The service on the bus: model.req in, model.resp and model.capture out.

use std::time::Duration;

use pretty_assertions::assert_eq;

use nisse_bus::proto::{ActorKind, ModelResponse};
use nisse_bus::{AnyMessage, ConsumerSpec};
use nisse_tests::InProcess;
use nisse_tests::model::Reply;

use super::{Rig, eventually, reply, request};

#[tokio::test]
async fn a_request_on_the_bus_is_answered_captured_and_acked() {
    let rig = Rig::start().await;
    let config = rig.config("roles = { driver = \"local\" }\nmax-in-flight = 2\n[models.local]\n");
    let dir = tempfile::tempdir().unwrap();
    let service = InProcess::service(&rig.bus, config, dir.path(), nisse_model_gateway::run)
        .await
        .unwrap();
    // Three at once, one slow: the others are not held up behind it.
    rig.model.push([
        Reply::Delay(Duration::from_millis(1500)),
        Reply::Text("slow".into()),
        Reply::Text("quick".into()),
        Reply::Text("quick".into()),
    ]);
    for id in ["r1", "r2", "r3"] {
        rig.bus
            .publish(request(id, "driver", "wi-1"))
            .await
            .unwrap();
    }

    let responses = async || -> Vec<ModelResponse> {
        rig.stream()
            .await
            .into_iter()
            .filter_map(|m| match m {
                AnyMessage::ModelResp(r) => Some(r),
                _ => None,
            })
            .collect()
    };
    eventually("three responses", async || responses().await.len() == 3).await;
    let all = responses().await;
    // The slow one answers last: the others were not held up behind it.
    assert_eq!(reply(&all[2]).content, "slow");
    let r1 = all.iter().find(|r| r.request_id == "r1").unwrap();
    let env = r1.envelope.as_ref().unwrap();
    assert_eq!(env.message_id, "resp:r1");
    assert_eq!(env.work_item_id, "wi-1");
    assert_eq!(env.causation_id, "model:r1");
    let actor = env.actor.as_ref().unwrap();
    assert_eq!(
        (ActorKind::try_from(actor.kind).unwrap(), actor.id.as_str()),
        (ActorKind::Service, "model-gateway")
    );
    assert_eq!((r1.model.as_str(), r1.attempts), ("local", 1));

    let captures = rig.captures().await;
    let c1 = captures.iter().find(|c| c.request_id == "r1").unwrap();
    assert_eq!(c1.envelope.as_ref().unwrap().message_id, "capture:r1");
    assert_eq!(
        (c1.outcome.as_str(), c1.caller.as_str(), c1.role.as_str()),
        ("ok", "brain", "driver")
    );
    assert_eq!(c1.request.as_ref().unwrap().messages.len(), 1);
    assert_eq!(
        reply(c1.response.as_ref().unwrap()).content,
        reply(r1).content
    );

    // Every request acked: nothing pending on the gateway's consumer.
    eventually("every request acked", async || {
        let mut stream = rig.bus.jetstream().get_stream("AGENT_OPS").await.unwrap();
        let _ = stream.info().await.unwrap();
        let info = stream
            .consumer_info(ConsumerSpec::MODEL_GATEWAY.name)
            .await
            .unwrap();
        info.num_ack_pending == 0 && info.num_pending == 0
    })
    .await;
    service.stop(Duration::from_secs(5)).await.unwrap();
}
