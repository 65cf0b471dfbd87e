//! Shared set-up: a NATS server with the topology, a scripted model
//! server, and a gateway configured for it.

use std::time::Duration;

use nisse_bus::proto::{
    ChatMessage, ChatRole, Envelope, ModelErrorKind, ModelExchange, ModelReply, ModelRequest,
    ModelResponse, model_response::Outcome,
};
use nisse_bus::{AnyMessage, Bus};
use nisse_model_gateway::Gateway;
use nisse_models::ModelsConfig;
use nisse_tests::TestNats;
use nisse_tests::model::ScriptedModel;

mod budget;
mod calls;
mod service;

/// A NATS server (topology ensured), a bus for `ops`, a scripted model.
struct Rig {
    nats: TestNats,
    bus: Bus,
    model: ScriptedModel,
}

impl Rig {
    async fn start() -> Self {
        let nats = TestNats::start().await.unwrap();
        let bus = nats.bus(&["ops"]).await.unwrap();
        bus.ensure_topology().await.unwrap();
        let model = ScriptedModel::start().await.unwrap();
        Self { nats, bus, model }
    }

    /// `[models]` from `extra` (TOML), with the endpoint the scripted
    /// server and timings short enough for tests.
    fn config(&self, extra: &str) -> ModelsConfig {
        let text = format!(
            "endpoint = \"{}\"\ntimeout = \"2s\"\nretries = 2\nretry-backoff = \"10ms\"\nretry-backoff-max = \"2s\"\n{extra}",
            self.model.base_url()
        );
        let config: ModelsConfig = toml::from_str(&text).unwrap();
        assert_eq!(config.validate("models"), vec![]);
        config
    }

    fn gateway(&self, extra: &str) -> Gateway {
        Gateway::new(self.config(extra), self.bus.clone()).unwrap()
    }

    /// Every message of the `ops` stream, decoded.
    async fn stream(&self) -> Vec<AnyMessage> {
        let mut reader = self
            .bus
            .read_range(&nisse_tests::ops(), 1, None)
            .await
            .unwrap();
        let mut out = Vec::new();
        while let Some(m) = reader.next().await {
            out.push(m.unwrap().decode().unwrap());
        }
        out
    }

    async fn captures(&self) -> Vec<ModelExchange> {
        self.stream()
            .await
            .into_iter()
            .filter_map(|m| match m {
                AnyMessage::ModelCapture(x) => Some(x),
                _ => None,
            })
            .collect()
    }
}

/// A request of `role` with one user message, for work item `item`
/// (empty: none).
fn request(id: &str, role: &str, item: &str) -> ModelRequest {
    ModelRequest {
        envelope: Some(Envelope {
            agent: "ops".into(),
            work_item_id: item.into(),
            message_id: format!("model:{id}"),
            ..Default::default()
        }),
        request_id: id.into(),
        role: role.into(),
        messages: vec![ChatMessage {
            role: ChatRole::User as i32,
            content: "how full is the pool?".into(),
            ..Default::default()
        }],
        ..Default::default()
    }
}

fn reply(r: &ModelResponse) -> &ModelReply {
    match &r.outcome {
        Some(Outcome::Reply(reply)) => reply,
        other => panic!("expected a reply, got {other:?}"),
    }
}

fn error(r: &ModelResponse) -> (ModelErrorKind, &str) {
    match &r.outcome {
        Some(Outcome::Error(e)) => (ModelErrorKind::try_from(e.kind).unwrap(), &e.message),
        other => panic!("expected an error, got {other:?}"),
    }
}

/// Polls `check` until it holds or 10 s pass.
async fn eventually<F: AsyncFnMut() -> bool>(what: &str, mut check: F) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !check().await {
        assert!(tokio::time::Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
