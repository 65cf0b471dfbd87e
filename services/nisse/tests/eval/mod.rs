//! `nisse eval export`: the captured model calls of an agent as JSON
//! lines, made by the real gateway against a scripted model server.

use pretty_assertions::assert_eq;
use serde_json::{Value, json};

use nisse_bus::proto::{ChatMessage, ChatRole, Envelope, ModelRequest, ToolDefinition};
use nisse_model_gateway::Gateway;
use nisse_tests::TestNats;
use nisse_tests::model::{Reply, ScriptedModel};

use super::{nisse, run, text};

fn request(id: &str) -> ModelRequest {
    ModelRequest {
        envelope: Some(Envelope {
            agent: "ops".into(),
            work_item_id: "wi-7".into(),
            message_id: format!("model:{id}"),
            ..Default::default()
        }),
        request_id: id.into(),
        role: "driver".into(),
        messages: vec![
            ChatMessage {
                role: ChatRole::System as i32,
                content: "You operate a homelab.".into(),
                ..Default::default()
            },
            ChatMessage {
                role: ChatRole::User as i32,
                content: "Is the pool healthy?".into(),
                ..Default::default()
            },
        ],
        tools: vec![ToolDefinition {
            name: "shell".into(),
            description: "run a command".into(),
            parameters_json_schema: r#"{"type":"object"}"#.into(),
        }],
        ..Default::default()
    }
}

#[tokio::test]
async fn eval_export_writes_one_json_line_per_captured_call() {
    let nats = TestNats::secured(&["ops"]).await.unwrap();
    let bus = nats.bus(&["ops"]).await.unwrap();
    bus.ensure_topology().await.unwrap();
    let model = ScriptedModel::start().await.unwrap();
    let config: nisse_models::ModelsConfig = toml::from_str(&format!(
        "endpoint = \"{}\"\nretries = 0\nroles = {{ driver = \"local\" }}\n[models.local]\nupstream = \"qwen3:8b\"\n",
        model.base_url()
    ))
    .unwrap();
    let gateway = Gateway::new(config, bus.clone()).unwrap();
    model.push([
        Reply::ToolCall {
            name: "shell".into(),
            arguments: json!({ "command": "zpool status" }),
        },
        Reply::Status {
            status: 503,
            retry_after: None,
        },
    ]);
    let agent = nisse_tests::ops();
    gateway.complete(&agent, &request("r1"), "brain").await;
    gateway.complete(&agent, &request("r2"), "brain").await;

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("calls.jsonl");
    let out = run(nisse(dir.path())
        .args(["eval", "export", "--agent", "ops", "--out"])
        .arg(&file)
        .arg("--data-dir")
        .arg(nats.data_dir().unwrap())
        .env("NISSE_NATS_URL", nats.url()))
    .await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("2 model calls exported"),
        "{}",
        text(&out.stderr)
    );
    let lines: Vec<Value> = std::fs::read_to_string(&file)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2);
    let ok = &lines[0];
    for (key, want) in [
        ("agent", json!("ops")),
        ("work_item_id", json!("wi-7")),
        ("request_id", json!("r1")),
        ("caller", json!("brain")),
        ("role", json!("driver")),
        ("model", json!("local")),
        ("outcome", json!("ok")),
        ("attempts", json!(1)),
        (
            "usage",
            json!({ "prompt_tokens": 10, "completion_tokens": 5 }),
        ),
    ] {
        assert_eq!(ok[key], want, "{key}");
    }
    assert_eq!(
        ok["request"]["messages"],
        json!([
            { "role": "system", "content": "You operate a homelab." },
            { "role": "user", "content": "Is the pool healthy?" },
        ])
    );
    assert_eq!(
        ok["request"]["tools"],
        json!([{ "name": "shell", "description": "run a command", "parameters": { "type": "object" } }])
    );
    assert_eq!(ok["response"]["tool_calls"][0]["name"], "shell");
    assert_eq!(
        ok["response"]["tool_calls"][0]["arguments"],
        r#"{"command":"zpool status"}"#
    );
    assert_eq!(ok["response"]["error"], Value::Null);
    assert!(ok["timestamp"].as_str().unwrap().contains('T'));
    assert!(ok["latency_ms"].is_u64());
    let failed = &lines[1];
    assert_eq!(failed["outcome"], "upstream");
    assert_eq!(failed["response"]["error"]["kind"], "upstream");
    assert!(
        failed["response"]["error"]["message"]
            .as_str()
            .unwrap()
            .contains("HTTP 503"),
        "{failed}"
    );

    // To standard output when no file is named; nothing else interleaved.
    let out = run(nisse(dir.path())
        .args(["eval", "export", "--agent", "ops", "--data-dir"])
        .arg(nats.data_dir().unwrap())
        .env("NISSE_NATS_URL", nats.url()))
    .await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).lines().count(), 2);
}

#[tokio::test]
async fn eval_export_says_when_nats_cannot_be_reached() {
    let dir = tempfile::tempdir().unwrap();
    // A port nothing listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let out = run(nisse(dir.path())
        .args(["eval", "export", "--agent", "ops"])
        .env("NISSE_NATS_URL", format!("nats://127.0.0.1:{port}")))
    .await;
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains(&format!("127.0.0.1:{port}")), "{err}");
    // And without any server configured, where to look.
    let out = run(nisse(dir.path()).args(["eval", "export", "--agent", "ops"])).await;
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("no endpoints.json"),
        "{}",
        text(&out.stderr)
    );
}
