//! A scripted OpenAI-compatible chat-completions server, for testing the
//! model path over real HTTP without a model: each request to
//! `POST /v1/chat/completions` gets the next scripted reply (a completion,
//! an HTTP error with its headers, a body cut off mid-way, a delay), and
//! every request body is recorded for the test to inspect. `GET /v1/models`
//! lists the models the script names, as LiteLLM and llama.cpp do.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{Response, StatusCode};
use axum::routing::{get, post};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

/// One scripted answer.
#[derive(Debug, Clone)]
pub enum Reply {
    /// A completion whose message is this text.
    Text(String),
    /// A completion whose message calls this tool with these arguments.
    ToolCall {
        /// The tool's name.
        name: String,
        /// Its arguments (sent JSON-encoded, as the API does).
        arguments: Value,
    },
    /// An HTTP error, with a `Retry-After` header in seconds when given.
    Status {
        /// The status code, e.g. 429 or 503.
        status: u16,
        /// `Retry-After`, in seconds.
        retry_after: Option<u64>,
    },
    /// This exact body with status 200 (a malformed or truncated reply).
    Raw(String),
    /// A completion whose message is this text, reporting this usage.
    TextWithUsage {
        /// The text.
        text: String,
        /// Reported prompt tokens.
        prompt_tokens: u64,
        /// Reported completion tokens.
        completion_tokens: u64,
    },
    /// A completion cut off at the output limit: this partial text with
    /// `finish_reason: "length"`.
    Truncated(String),
    /// A completion with no choices at all.
    NoChoices,
    /// An HTTP error whose OpenAI-style error body carries this message
    /// (e.g. a 400 saying the context is too long).
    Error {
        /// The status code.
        status: u16,
        /// The error's message.
        message: String,
    },
    /// Waits this long, then gives the next reply in the script.
    Delay(Duration),
}

#[derive(Debug, Default)]
struct Script {
    replies: VecDeque<Reply>,
    requests: Vec<Value>,
}

/// The server; stopped when dropped.
pub struct ScriptedModel {
    addr: SocketAddr,
    script: Arc<Mutex<Script>>,
    shutdown: CancellationToken,
}

impl Drop for ScriptedModel {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

impl ScriptedModel {
    /// Starts it on a free loopback port with an empty script.
    pub async fn start() -> anyhow::Result<Self> {
        let script = Arc::new(Mutex::new(Script::default()));
        let app = Router::new()
            .route("/v1/chat/completions", post(complete))
            .route("/v1/models", get(models))
            .with_state(script.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .context("binding the scripted model server")?;
        let addr = listener.local_addr()?;
        let shutdown = CancellationToken::new();
        let stop = shutdown.clone();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async move { stop.cancelled().await })
                .await;
        });
        Ok(Self {
            addr,
            script,
            shutdown,
        })
    }

    /// The OpenAI-compatible base URL (`http://127.0.0.1:<port>/v1`).
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// Appends replies to the script.
    pub fn push(&self, replies: impl IntoIterator<Item = Reply>) {
        self.lock().replies.extend(replies);
    }

    /// Every request body received so far, in order.
    pub fn requests(&self) -> Vec<Value> {
        self.lock().requests.clone()
    }

    /// Replies not used yet.
    pub fn remaining(&self) -> usize {
        self.lock().replies.len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Script> {
        match self.script.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        }
    }
}

async fn models() -> Response<Body> {
    json_response(
        StatusCode::OK,
        &json!({ "object": "list", "data": [{ "id": "scripted", "object": "model" }] }),
    )
}

async fn complete(State(script): State<Arc<Mutex<Script>>>, body: String) -> Response<Body> {
    let request: Value = serde_json::from_str(&body).unwrap_or(Value::String(body));
    let model = request["model"].as_str().unwrap_or("scripted").to_string();
    let next = {
        let mut s = match script.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        };
        s.requests.push(request);
        let mut next = s.replies.pop_front();
        // Delays run before the reply that follows them.
        let mut delay = Duration::ZERO;
        while let Some(Reply::Delay(d)) = next {
            delay += d;
            next = s.replies.pop_front();
        }
        (delay, next)
    };
    let (delay, reply) = next;
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    let count = script.lock().map_or(0, |s| s.requests.len());
    match reply {
        None => json_response(
            StatusCode::INTERNAL_SERVER_ERROR,
            &json!({ "error": { "message": "the script has no reply left", "type": "script_exhausted" } }),
        ),
        Some(Reply::Text(text)) => json_response(
            StatusCode::OK,
            &completion(
                &model,
                count,
                json!({ "role": "assistant", "content": text }),
                "stop",
            ),
        ),
        Some(Reply::ToolCall { name, arguments }) => json_response(
            StatusCode::OK,
            &completion(
                &model,
                count,
                json!({
                    "role": "assistant",
                    "content": null,
                    "tool_calls": [{
                        "id": format!("call_{count}"),
                        "type": "function",
                        "function": { "name": name, "arguments": arguments.to_string() },
                    }],
                }),
                "tool_calls",
            ),
        ),
        Some(Reply::Status {
            status,
            retry_after,
        }) => {
            let code = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            let mut response = json_response(
                code,
                &json!({ "error": { "message": format!("scripted {status}"), "type": "scripted" } }),
            );
            if let Some(secs) = retry_after
                && let Ok(v) = secs.to_string().parse()
            {
                response.headers_mut().insert("retry-after", v);
            }
            response
        }
        Some(Reply::Raw(body)) => {
            let mut r = Response::new(Body::from(body));
            if let Ok(v) = "application/json".parse() {
                r.headers_mut().insert("content-type", v);
            }
            r
        }
        Some(Reply::TextWithUsage {
            text,
            prompt_tokens,
            completion_tokens,
        }) => {
            let mut body = completion(
                &model,
                count,
                json!({ "role": "assistant", "content": text }),
                "stop",
            );
            body["usage"] = json!({
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            });
            json_response(StatusCode::OK, &body)
        }
        Some(Reply::Truncated(text)) => json_response(
            StatusCode::OK,
            &completion(
                &model,
                count,
                json!({ "role": "assistant", "content": text }),
                "length",
            ),
        ),
        Some(Reply::NoChoices) => {
            let mut body = completion(&model, count, Value::Null, "stop");
            body["choices"] = json!([]);
            json_response(StatusCode::OK, &body)
        }
        Some(Reply::Error { status, message }) => json_response(
            StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST),
            &json!({ "error": { "message": message, "type": "scripted", "code": null } }),
        ),
        Some(Reply::Delay(_)) => json_response(StatusCode::OK, &json!({})),
    }
}

fn completion(model: &str, n: usize, message: Value, finish: &str) -> Value {
    json!({
        "id": format!("chatcmpl-{n}"),
        "object": "chat.completion",
        "created": 0,
        "model": model,
        "choices": [{ "index": 0, "message": message, "finish_reason": finish }],
        "usage": { "prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15 },
    })
}

fn json_response(status: StatusCode, body: &Value) -> Response<Body> {
    let mut r = Response::new(Body::from(body.to_string()));
    *r.status_mut() = status;
    if let Ok(v) = "application/json".parse() {
        r.headers_mut().insert("content-type", v);
    }
    r
}
