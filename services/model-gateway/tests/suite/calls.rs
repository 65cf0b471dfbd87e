//! Calls: the HTTP body sent, replies, retries, fallbacks, failures, pins.

use std::time::{Duration, Instant};

use pretty_assertions::assert_eq;
use serde_json::json;

use nisse_bus::proto::{ChatMessage, ChatRole, ModelErrorKind, ToolCall, ToolDefinition};
use nisse_tests::model::Reply;

use super::{Rig, error, reply, request};

const TWO_MODELS: &str = r#"
roles = { driver = "local" }
[models.local]
upstream = "qwen3:8b"
max-output-tokens = 300
[models.strict]
upstream = "strict-upstream"
tool-choice = true
"#;

fn shell_tool() -> ToolDefinition {
    ToolDefinition {
        name: "shell".into(),
        description: "run a command on a bound host".into(),
        parameters_json_schema:
            r#"{"type":"object","properties":{"command":{"type":"string"}},"required":["command"]}"#
                .into(),
    }
}

#[tokio::test]
async fn a_reply_and_a_tool_call_round_trip_with_the_body_the_server_expects() {
    let rig = Rig::start().await;
    let gateway = rig.gateway(TWO_MODELS);
    let agent = nisse_tests::ops();
    rig.model.push([
        Reply::Text("the pool is 80% full".into()),
        Reply::ToolCall {
            name: "shell".into(),
            arguments: json!({ "command": "zpool list" }),
        },
        Reply::Text("done".into()),
    ]);

    // A plain reply through the role's model, tools offered, no
    // tool_choice: "local" does not enforce it.
    let mut first = request("r1", "driver", "wi-1");
    first.tools = vec![shell_tool()];
    first.tool_choice = "required".into();
    let r = gateway.complete(&agent, &first, "brain").await;
    assert_eq!(reply(&r).content, "the pool is 80% full");
    assert_eq!(reply(&r).finish_reason, "stop");
    assert_eq!((r.model.as_str(), r.attempts), ("local", 1));
    assert_eq!(r.usage.unwrap().prompt_tokens, 10);
    assert_eq!(r.envelope.as_ref().unwrap().message_id, "resp:r1");

    // A tool call through a pinned model that enforces tool_choice.
    let mut second = first.clone();
    second.request_id = "r2".into();
    second.model = "strict".into();
    let r = gateway.complete(&agent, &second, "brain").await;
    let call = &reply(&r).tool_calls[0];
    assert_eq!(call.name, "shell");
    // The arguments as the model produced them: a JSON string.
    assert_eq!(call.arguments_json, r#"{"command":"zpool list"}"#);
    assert_eq!(r.model, "strict");

    // The tool call and its result go back in the next request.
    let mut third = second.clone();
    third.request_id = "r3".into();
    third.messages.push(ChatMessage {
        role: ChatRole::Assistant as i32,
        tool_calls: vec![ToolCall {
            id: call.id.clone(),
            name: call.name.clone(),
            arguments_json: call.arguments_json.clone(),
        }],
        ..Default::default()
    });
    third.messages.push(ChatMessage {
        role: ChatRole::Tool as i32,
        tool_call_id: call.id.clone(),
        content: "tank  10T  8T  2T".into(),
        ..Default::default()
    });
    let r = gateway.complete(&agent, &third, "brain").await;
    assert_eq!(reply(&r).content, "done");

    let sent = rig.model.requests();
    assert_eq!(sent.len(), 3);
    let tools = json!([{
        "type": "function",
        "function": {
            "name": "shell",
            "description": "run a command on a bound host",
            "parameters": {"type":"object","properties":{"command":{"type":"string"}},"required":["command"]},
        },
    }]);
    assert_eq!(
        sent[0],
        json!({
            "model": "qwen3:8b",
            "max_tokens": 300,
            "messages": [{ "role": "user", "content": "how full is the pool?" }],
            "tools": tools,
        })
    );
    assert_eq!(sent[1]["model"], "strict-upstream");
    assert_eq!(sent[1]["tool_choice"], "required");
    // The profile's default output reservation.
    assert_eq!(sent[1]["max_tokens"], 1024);
    assert_eq!(
        sent[2]["messages"][1],
        json!({
            "role": "assistant",
            "content": null,
            "tool_calls": [{
                "id": call.id,
                "type": "function",
                "function": { "name": "shell", "arguments": r#"{"command":"zpool list"}"# },
            }],
        })
    );
    assert_eq!(
        sent[2]["messages"][2],
        json!({ "role": "tool", "tool_call_id": call.id, "content": "tank  10T  8T  2T" })
    );
}

#[tokio::test]
async fn a_429_is_waited_out_for_its_retry_after_then_answered() {
    let rig = Rig::start().await;
    let gateway = rig.gateway(TWO_MODELS);
    rig.model.push([
        Reply::Status {
            status: 429,
            retry_after: Some(1),
        },
        Reply::Text("ok".into()),
    ]);
    let began = Instant::now();
    let r = gateway
        .complete(&nisse_tests::ops(), &request("r1", "driver", ""), "brain")
        .await;
    assert_eq!(reply(&r).content, "ok");
    assert_eq!(r.attempts, 2);
    assert!(
        began.elapsed() >= Duration::from_secs(1),
        "Retry-After not honoured: {:?}",
        began.elapsed()
    );
}

#[tokio::test]
async fn a_model_failing_through_its_retries_falls_back_to_the_next() {
    let rig = Rig::start().await;
    let gateway = rig.gateway(
        r#"
        roles = { driver = "a" }
        [models.a]
        upstream = "model-a"
        fallbacks = ["b"]
        [models.b]
        upstream = "model-b"
        "#,
    );
    let unavailable = || Reply::Status {
        status: 503,
        retry_after: None,
    };
    rig.model.push([
        unavailable(),
        unavailable(),
        unavailable(),
        Reply::Text("from b".into()),
    ]);
    let r = gateway
        .complete(&nisse_tests::ops(), &request("r1", "driver", ""), "brain")
        .await;
    assert_eq!(reply(&r).content, "from b");
    assert_eq!((r.model.as_str(), r.attempts), ("b", 4));
    let models: Vec<String> = rig
        .model
        .requests()
        .iter()
        .map(|b| b["model"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(models, ["model-a", "model-a", "model-a", "model-b"]);

    // Everything down: the last error, after every model's retries.
    let r = gateway
        .complete(&nisse_tests::ops(), &request("r2", "driver", ""), "brain")
        .await;
    let (kind, message) = error(&r);
    assert_eq!(kind, ModelErrorKind::Upstream);
    assert!(message.contains("HTTP 500"), "{message}");
    assert_eq!((r.model.as_str(), r.attempts), ("b", 6));
}

#[tokio::test]
async fn malformed_and_cut_off_replies_are_malformed_and_not_retried() {
    let rig = Rig::start().await;
    let gateway = rig.gateway(TWO_MODELS);
    let agent = nisse_tests::ops();
    rig.model.push([
        Reply::Raw("{\"choices\": [".into()),
        Reply::Raw("<html>bad gateway</html>".into()),
    ]);
    for id in ["r1", "r2"] {
        let r = gateway
            .complete(&agent, &request(id, "driver", ""), "brain")
            .await;
        let (kind, message) = error(&r);
        assert_eq!(kind, ModelErrorKind::Malformed, "{id}: {message}");
        assert_eq!(r.attempts, 1, "{id} was retried: {message}");
    }
    assert_eq!(rig.model.requests().len(), 2);

    // A server that sends its status and half the promised body, then
    // closes the connection.
    let (url, served) = cut_off_server().await;
    let gateway = rig.gateway(&format!(
        "roles = {{ driver = \"cut\" }}\n[models.cut]\nendpoint = \"{url}\"\n"
    ));
    let r = gateway
        .complete(&agent, &request("r3", "driver", ""), "brain")
        .await;
    let (kind, message) = error(&r);
    assert_eq!(kind, ModelErrorKind::Malformed, "{message}");
    assert!(message.contains("cut off"), "{message}");
    assert_eq!(r.attempts, 1);
    assert_eq!(served.load(std::sync::atomic::Ordering::SeqCst), 1);
}

/// An endpoint answering every request with a 200 whose body stops half
/// way through the promised `content-length`; returns its base URL and a
/// count of the requests it took.
async fn cut_off_server() -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use tokio::io::AsyncWriteExt as _;

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/v1", listener.local_addr().unwrap());
    let served = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = served.clone();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            read_request(&mut socket).await;
            let body = r#"{"id":"x","choices":[{"message":{"content":"the pool is"#;
            let head = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
                body.len() * 2
            );
            let _ = socket.write_all(head.as_bytes()).await;
            let _ = socket.write_all(body.as_bytes()).await;
            let _ = socket.flush().await;
            // Dropped here: the connection closes short of the length.
        }
    });
    (url, served)
}

/// Reads a request's head, then the body its content-length announces.
async fn read_request(socket: &mut tokio::net::TcpStream) {
    use tokio::io::AsyncReadExt as _;

    let mut request = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = socket.read(&mut buf).await.unwrap_or(0);
        if n == 0 {
            break;
        }
        request.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&request).to_ascii_lowercase();
        if let Some(end) = text.find("\r\n\r\n") {
            let length: usize = text
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            if request.len() >= end + 4 + length {
                break;
            }
        }
    }
}

/// What an endless endpoint did: the requests it took and the body bytes
/// it got to send before the client hung up.
#[derive(Default)]
struct Endless {
    served: std::sync::atomic::AtomicUsize,
    sent: std::sync::atomic::AtomicU64,
}

/// An endpoint answering every request with `status` and a chunked body
/// that never ends (a model stuck in a loop, a misbehaving proxy); returns
/// its base URL and what it did.
async fn endless_server(status: &str) -> (String, std::sync::Arc<Endless>) {
    use std::sync::atomic::Ordering;
    use tokio::io::AsyncWriteExt as _;

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/v1", listener.local_addr().unwrap());
    let endless = std::sync::Arc::new(Endless::default());
    let seen = endless.clone();
    let head = format!(
        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n"
    );
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            seen.served.fetch_add(1, Ordering::SeqCst);
            read_request(&mut socket).await;
            let (head, seen) = (head.clone(), seen.clone());
            tokio::spawn(async move {
                // The start of a reply, then whitespace forever: valid
                // JSON so far, at every point.
                let start = r#"{"choices": ["#;
                let chunk = " ".repeat(64 * 1024);
                let frame = format!("{:x}\r\n{chunk}\r\n", chunk.len()).into_bytes();
                let opening = format!("{head}{:x}\r\n{start}\r\n", start.len());
                if socket.write_all(opening.as_bytes()).await.is_err() {
                    return;
                }
                // Until the client goes away.
                while socket.write_all(&frame).await.is_ok() {
                    seen.sent.fetch_add(frame.len() as u64, Ordering::SeqCst);
                }
            });
        }
    });
    (url, endless)
}

#[tokio::test]
async fn a_reply_over_the_response_cap_is_not_read_further_nor_retried() {
    use std::sync::atomic::Ordering;

    let rig = Rig::start().await;
    let agent = nisse_tests::ops();
    let cap = 1024 * 1024;

    // Declared longer than the cap: refused before reading.
    let gateway = rig.gateway(&format!("max-response = \"1 MiB\"\n{TWO_MODELS}"));
    let huge = format!(
        r#"{{"choices":[{{"message":{{"content":"{}"}},"finish_reason":"stop"}}]}}"#,
        "x".repeat(2 * cap)
    );
    rig.model
        .push([Reply::Raw(huge), Reply::Text("small enough".into())]);
    let r = gateway
        .complete(&agent, &request("r1", "driver", ""), "brain")
        .await;
    let (kind, message) = error(&r);
    assert_eq!(kind, ModelErrorKind::Malformed, "{message}");
    assert!(
        message.contains("1.0 MiB") && message.contains("models.max-response"),
        "{message}"
    );
    assert_eq!(r.attempts, 1, "retried: {message}");
    // A reply within the cap still passes.
    let r = gateway
        .complete(&agent, &request("r2", "driver", ""), "brain")
        .await;
    assert_eq!(reply(&r).content, "small enough");

    // Endless, with and without an error status: the gateway stops at
    // the cap, well before the per-call timeout, and does not call again.
    for (status, want) in [
        ("200 OK", ModelErrorKind::Malformed),
        ("503 Service Unavailable", ModelErrorKind::Upstream),
    ] {
        let (url, endless) = endless_server(status).await;
        let gateway = rig.gateway(&format!(
            "max-response = \"1 MiB\"\nroles = {{ driver = \"loop\" }}\n[models.loop]\nendpoint = \"{url}\"\n"
        ));
        let began = Instant::now();
        let r = gateway
            .complete(&agent, &request("r3", "driver", ""), "brain")
            .await;
        let (kind, message) = error(&r);
        assert_eq!(kind, want, "{status}: {message}");
        assert!(message.contains("models.max-response"), "{message}");
        assert_eq!(r.attempts, 1, "{status} retried: {message}");
        assert!(
            began.elapsed() < Duration::from_secs(2),
            "{status}: read until the timeout ({:?})",
            began.elapsed()
        );
        assert_eq!(endless.served.load(Ordering::SeqCst), 1);
        // The client hung up soon after the cap: what the server sent is
        // the cap plus what the sockets' buffers hold, not the gigabytes
        // a read until the timeout would take.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let sent = endless.sent.load(Ordering::SeqCst);
        assert!(sent < 32 * 1024 * 1024, "{status}: {sent} bytes sent");
    }
}

#[tokio::test]
async fn truncated_empty_context_and_client_errors_have_their_kinds() {
    let rig = Rig::start().await;
    let gateway = rig.gateway(TWO_MODELS);
    let agent = nisse_tests::ops();
    rig.model.push([
        Reply::Truncated("the pool is".into()),
        Reply::NoChoices,
        Reply::Text(String::new()),
        Reply::Error {
            status: 400,
            message: "This model's maximum context length is 8192 tokens. However, your messages resulted in 9000 tokens.".into(),
        },
        Reply::Error {
            status: 401,
            message: "invalid API key".into(),
        },
    ]);
    let mut seen = Vec::new();
    for id in ["r1", "r2", "r3", "r4", "r5"] {
        let r = gateway
            .complete(&agent, &request(id, "driver", ""), "brain")
            .await;
        let (kind, message) = error(&r);
        seen.push((kind, r.attempts, message.to_string()));
    }
    let kinds: Vec<(ModelErrorKind, u32)> = seen.iter().map(|(k, a, _)| (*k, *a)).collect();
    assert_eq!(
        kinds,
        vec![
            (ModelErrorKind::Truncated, 1),
            (ModelErrorKind::Empty, 1),
            (ModelErrorKind::Empty, 1),
            (ModelErrorKind::ContextTooLong, 1),
            (ModelErrorKind::Upstream, 1),
        ]
    );
    assert!(
        seen[4].2.contains("HTTP 401: invalid API key"),
        "{}",
        seen[4].2
    );
}

#[tokio::test]
async fn a_model_too_slow_every_time_is_a_timeout() {
    let rig = Rig::start().await;
    let gateway = rig.gateway(
        r#"
        roles = { driver = "slow" }
        [models.slow]
        timeout = "300ms"
        "#,
    );
    for _ in 0..3 {
        rig.model.push([
            Reply::Delay(Duration::from_millis(1500)),
            Reply::Text("late".into()),
        ]);
    }
    let r = gateway
        .complete(&nisse_tests::ops(), &request("r1", "driver", ""), "brain")
        .await;
    let (kind, message) = error(&r);
    assert_eq!(kind, ModelErrorKind::Timeout, "{message}");
    assert_eq!(r.attempts, 3);
}

#[tokio::test]
async fn a_pinned_model_is_called_after_the_role_moved_to_another() {
    let rig = Rig::start().await;
    let models = r#"
        [models.old]
        upstream = "old-upstream"
        [models.new]
        upstream = "new-upstream"
    "#;
    let before = rig.gateway(&format!("roles = {{ driver = \"old\" }}\n{models}"));
    rig.model.push([
        Reply::Text("a".into()),
        Reply::Text("b".into()),
        Reply::Text("c".into()),
    ]);
    // The item pinned "old" when it opened.
    let mut pinned = request("r1", "driver", "wi-1");
    pinned.model = "old".into();
    assert_eq!(
        before
            .complete(&nisse_tests::ops(), &pinned, "brain")
            .await
            .model,
        "old"
    );

    // The configuration changes: the role now maps to "new".
    let after = rig.gateway(&format!("roles = {{ driver = \"new\" }}\n{models}"));
    pinned.request_id = "r2".into();
    let r = after.complete(&nisse_tests::ops(), &pinned, "brain").await;
    assert_eq!(r.model, "old");
    // A new item (nothing pinned) gets the new mapping.
    let r = after
        .complete(
            &nisse_tests::ops(),
            &request("r3", "driver", "wi-2"),
            "brain",
        )
        .await;
    assert_eq!(r.model, "new");
    let models: Vec<String> = rig
        .model
        .requests()
        .iter()
        .map(|b| b["model"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(models, ["old-upstream", "old-upstream", "new-upstream"]);
}

#[tokio::test]
async fn unknown_roles_and_models_are_named_without_any_call() {
    let rig = Rig::start().await;
    let gateway = rig.gateway(TWO_MODELS);
    let agent = nisse_tests::ops();
    let r = gateway
        .complete(&agent, &request("r1", "oracle", ""), "brain")
        .await;
    assert!(
        error(&r).1.contains("unknown role `oracle`"),
        "{}",
        error(&r).1
    );
    let r = gateway
        .complete(&agent, &request("r2", "helper", ""), "brain")
        .await;
    assert!(
        error(&r).1.contains("models.roles.helper"),
        "{}",
        error(&r).1
    );
    let mut gone = request("r3", "driver", "wi-1");
    gone.model = "retired".into();
    let r = gateway.complete(&agent, &gone, "brain").await;
    assert_eq!(error(&r).0, ModelErrorKind::Upstream);
    assert!(error(&r).1.contains("model `retired`"), "{}", error(&r).1);
    assert_eq!(r.attempts, 0);
    assert!(rig.model.requests().is_empty());
}

#[tokio::test]
async fn the_api_key_file_is_read_at_each_call() {
    let rig = Rig::start().await;
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("key");
    let gateway = rig.gateway(&format!(
        "api-key-file = {:?}\n{TWO_MODELS}",
        key.display().to_string()
    ));
    // No key file yet: refused for that model, no HTTP call.
    let r = gateway
        .complete(&nisse_tests::ops(), &request("r1", "driver", ""), "brain")
        .await;
    assert!(error(&r).1.contains("API key file"), "{}", error(&r).1);
    assert!(rig.model.requests().is_empty());
    std::fs::write(&key, "sk-test\n").unwrap();
    rig.model.push([Reply::Text("ok".into())]);
    let r = gateway
        .complete(&nisse_tests::ops(), &request("r2", "driver", ""), "brain")
        .await;
    assert_eq!(reply(&r).content, "ok");
}
