//! The scripted model server answers as an OpenAI-compatible endpoint
//! does, in script order, and records what it was asked.

use std::time::{Duration, Instant};

use pretty_assertions::assert_eq;
use serde_json::{Value, json};

use nisse_tests::model::{Reply, ScriptedModel};

async fn ask(model: &ScriptedModel, content: &str) -> (u16, Option<String>, String) {
    let r = reqwest::Client::new()
        .post(format!("{}/chat/completions", model.base_url()))
        .header("content-type", "application/json")
        .body(
            json!({ "model": "driver", "messages": [{ "role": "user", "content": content }] })
                .to_string(),
        )
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let retry = r
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    (status, retry, r.text().await.unwrap())
}

#[tokio::test]
async fn model_replies_follow_the_script_and_requests_are_recorded() {
    let model = ScriptedModel::start().await.unwrap();
    model.push([
        Reply::Status {
            status: 429,
            retry_after: Some(2),
        },
        Reply::Delay(Duration::from_millis(300)),
        Reply::Text("hello".into()),
        Reply::ToolCall {
            name: "submit_plan".into(),
            arguments: json!({ "steps": [] }),
        },
        Reply::Raw("{\"choices\": [".into()),
    ]);
    let (status, retry, _) = ask(&model, "one").await;
    assert_eq!((status, retry.as_deref()), (429, Some("2")));

    let began = Instant::now();
    let (status, _, body) = ask(&model, "two").await;
    assert!(began.elapsed() >= Duration::from_millis(300));
    assert_eq!(status, 200);
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["choices"][0]["message"]["content"], "hello");
    assert_eq!(v["model"], "driver");

    let (_, _, body) = ask(&model, "three").await;
    let v: Value = serde_json::from_str(&body).unwrap();
    let call = &v["choices"][0]["message"]["tool_calls"][0]["function"];
    assert_eq!(call["name"], "submit_plan");
    assert_eq!(call["arguments"], "{\"steps\":[]}");
    assert_eq!(v["choices"][0]["finish_reason"], "tool_calls");

    let (status, _, body) = ask(&model, "four").await;
    assert_eq!(status, 200);
    assert!(
        serde_json::from_str::<Value>(&body).is_err(),
        "cut off: {body}"
    );

    // Past the end of the script: a clear error, never a made-up reply.
    let (status, _, body) = ask(&model, "five").await;
    assert_eq!(status, 500);
    assert!(body.contains("no reply left"), "{body}");

    let asked: Vec<String> = model
        .requests()
        .iter()
        .map(|r| r["messages"][0]["content"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(asked, ["one", "two", "three", "four", "five"]);
    assert_eq!(model.remaining(), 0);
}
