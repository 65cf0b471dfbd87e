//! The OpenAI chat-completions wire format, both ways: a `ModelRequest`
//! as the JSON body a model's endpoint takes, and the endpoint's answer as
//! a `ModelReply` or the kind of failure it is. Pure, so every odd reply
//! an endpoint can give is unit-tested without a server.

use serde_json::{Map, Value, json};

use nisse_bus::proto::{ChatRole, ModelErrorKind, ModelReply, ModelRequest, ToolCall, Usage};
use nisse_models::Profile;

/// Most of a body quoted in an error message: enough to recognise it,
/// never a whole prompt echoed back into the stream.
const QUOTE_MAX: usize = 300;

/// Why a call produced no usable reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Failure {
    /// The contract's kind.
    pub kind: ModelErrorKind,
    /// What happened, for the log and the brain.
    pub message: String,
}

impl Failure {
    pub(crate) fn new(kind: ModelErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }
}

/// The JSON body for `request` sent to a model known upstream as
/// `upstream` with `profile`. Fails (before any HTTP call) when the
/// request itself cannot be expressed: a message without a role, a tool
/// result without the id of its call, a tool schema that is not JSON.
pub(crate) fn request_body(
    request: &ModelRequest,
    upstream: &str,
    profile: &Profile,
) -> Result<Value, Failure> {
    let invalid = |m: String| {
        Failure::new(
            ModelErrorKind::Upstream,
            format!("the request cannot be sent: {m}"),
        )
    };
    if request.messages.is_empty() {
        return Err(invalid("it has no messages".into()));
    }
    let mut messages = Vec::with_capacity(request.messages.len());
    for (i, m) in request.messages.iter().enumerate() {
        let mut out = Map::new();
        match ChatRole::try_from(m.role).unwrap_or_default() {
            ChatRole::System => {
                out.insert("role".into(), "system".into());
                out.insert("content".into(), m.content.clone().into());
            }
            ChatRole::User => {
                out.insert("role".into(), "user".into());
                out.insert("content".into(), m.content.clone().into());
            }
            ChatRole::Assistant => {
                out.insert("role".into(), "assistant".into());
                // An assistant turn that only called tools has no content;
                // servers reject an empty string there but take null.
                let content = if m.content.is_empty() && !m.tool_calls.is_empty() {
                    Value::Null
                } else {
                    m.content.clone().into()
                };
                out.insert("content".into(), content);
                if !m.tool_calls.is_empty() {
                    let calls: Vec<Value> = m
                        .tool_calls
                        .iter()
                        .map(|c| {
                            json!({
                                "id": c.id,
                                "type": "function",
                                "function": { "name": c.name, "arguments": c.arguments_json },
                            })
                        })
                        .collect();
                    out.insert("tool_calls".into(), calls.into());
                }
            }
            ChatRole::Tool => {
                if m.tool_call_id.is_empty() {
                    return Err(invalid(format!(
                        "message {i} is a tool result without the id of its call"
                    )));
                }
                out.insert("role".into(), "tool".into());
                out.insert("tool_call_id".into(), m.tool_call_id.clone().into());
                out.insert("content".into(), m.content.clone().into());
            }
            ChatRole::Unspecified => {
                return Err(invalid(format!("message {i} has no role")));
            }
        }
        if !m.name.is_empty() {
            out.insert("name".into(), m.name.clone().into());
        }
        messages.push(Value::Object(out));
    }
    let mut body = Map::new();
    body.insert("model".into(), upstream.into());
    body.insert("messages".into(), messages.into());
    body.insert(
        "max_tokens".into(),
        request
            .max_tokens
            .unwrap_or(profile.max_output_tokens)
            .into(),
    );
    if let Some(t) = request.temperature {
        body.insert("temperature".into(), f64::from(t).into());
    }
    if !request.tools.is_empty() {
        let mut tools = Vec::with_capacity(request.tools.len());
        for t in &request.tools {
            let parameters = if t.parameters_json_schema.trim().is_empty() {
                json!({ "type": "object", "properties": {} })
            } else {
                serde_json::from_str::<Value>(&t.parameters_json_schema).map_err(|e| {
                    invalid(format!(
                        "the parameter schema of tool `{}` is not JSON: {e}",
                        t.name
                    ))
                })?
            };
            tools.push(json!({
                "type": "function",
                "function": { "name": t.name, "description": t.description, "parameters": parameters },
            }));
        }
        body.insert("tools".into(), tools.into());
        // Only a server that enforces it gets it: elsewhere "required" is
        // silently ignored, and the loop must not believe it was honoured.
        if profile.tool_choice && !request.tool_choice.is_empty() {
            let choice = match request.tool_choice.as_str() {
                c @ ("auto" | "required" | "none") => Value::from(c),
                name => json!({ "type": "function", "function": { "name": name } }),
            };
            body.insert("tool_choice".into(), choice);
        }
    }
    Ok(Value::Object(body))
}

/// The endpoint's 200 answer as a reply, or what is wrong with it, and the
/// usage it reported (counted against the budget whatever the outcome).
pub(crate) fn parse_reply(body: &[u8]) -> (Result<ModelReply, Failure>, Option<Usage>) {
    let value: Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => {
            return (
                Err(Failure::new(
                    ModelErrorKind::Malformed,
                    format!("the reply is not valid JSON ({e}): {}", quote(body)),
                )),
                None,
            );
        }
    };
    let usage = value.get("usage").filter(|u| u.is_object()).map(|u| Usage {
        prompt_tokens: u["prompt_tokens"].as_u64().unwrap_or(0),
        completion_tokens: u["completion_tokens"].as_u64().unwrap_or(0),
    });
    (reply_of(&value), usage)
}

fn reply_of(value: &Value) -> Result<ModelReply, Failure> {
    let malformed = |m: &str| Failure::new(ModelErrorKind::Malformed, m.to_string());
    let Some(choices) = value.get("choices") else {
        // Some proxies answer an error with status 200.
        if let Some(message) = error_text(value) {
            return Err(http_failure(200, &message));
        }
        return Err(malformed("the reply has no `choices`"));
    };
    let Some(choices) = choices.as_array() else {
        return Err(malformed("`choices` in the reply is not a list"));
    };
    let Some(first) = choices.first() else {
        return Err(Failure::new(
            ModelErrorKind::Empty,
            "the reply has no choices",
        ));
    };
    let finish_reason = first["finish_reason"].as_str().unwrap_or_default();
    let Some(message) = first.get("message").filter(|m| m.is_object()) else {
        return Err(malformed("the reply's choice has no message"));
    };
    let content = match message.get("content") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        // Content parts: the text ones, in order.
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| p["text"].as_str())
            .collect::<Vec<_>>()
            .join(""),
        Some(_) => return Err(malformed("the reply's content is neither text nor parts")),
    };
    let mut tool_calls = Vec::new();
    match message.get("tool_calls") {
        None | Some(Value::Null) => {}
        Some(Value::Array(calls)) => {
            for call in calls {
                let function = &call["function"];
                let Some(name) = function["name"].as_str().filter(|n| !n.is_empty()) else {
                    return Err(malformed("a tool call in the reply names no function"));
                };
                // Passed through as the model produced them: the brain
                // validates arguments and says what was wrong with them.
                let arguments_json = match &function["arguments"] {
                    Value::String(s) => s.clone(),
                    Value::Null => String::new(),
                    other => other.to_string(),
                };
                tool_calls.push(ToolCall {
                    id: call["id"].as_str().unwrap_or_default().to_string(),
                    name: name.to_string(),
                    arguments_json,
                });
            }
        }
        Some(_) => return Err(malformed("the reply's tool_calls is not a list")),
    }
    if finish_reason == "length" {
        return Err(Failure::new(
            ModelErrorKind::Truncated,
            format!(
                "the reply was cut off at the output limit (finish_reason \"length\") after {} characters{}",
                content.chars().count(),
                if tool_calls.is_empty() {
                    ""
                } else {
                    ", in a tool call"
                }
            ),
        ));
    }
    if content.trim().is_empty() && tool_calls.is_empty() {
        return Err(Failure::new(
            ModelErrorKind::Empty,
            format!(
                "the reply has neither content nor tool calls (finish_reason \"{finish_reason}\")"
            ),
        ));
    }
    Ok(ModelReply {
        content,
        tool_calls,
        finish_reason: finish_reason.to_string(),
    })
}

/// A non-retryable HTTP error (or an error body with status 200) as a
/// failure: the context too long for the model, or the server's word.
pub(crate) fn http_failure(status: u16, message: &str) -> Failure {
    if context_too_long(message) {
        Failure::new(
            ModelErrorKind::ContextTooLong,
            format!("HTTP {status}: {message}"),
        )
    } else {
        Failure::new(
            ModelErrorKind::Upstream,
            format!("HTTP {status}: {message}"),
        )
    }
}

/// The error message in an error body: OpenAI's `{"error": {"message"}}`,
/// a bare `{"error": "..."}`, FastAPI's `detail`, or the text itself.
pub(crate) fn error_message(body: &[u8]) -> String {
    serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|v| error_text(&v))
        .unwrap_or_else(|| quote(body))
}

fn error_text(v: &Value) -> Option<String> {
    let e = v.get("error").or_else(|| v.get("detail"))?;
    let text = match e {
        Value::String(s) => s.clone(),
        Value::Object(o) => {
            let message = o.get("message").and_then(Value::as_str).unwrap_or_default();
            // The code carries the kind where the message is vague
            // (`context_length_exceeded`, `exceed_context_size_error`).
            let code = o
                .get("code")
                .or_else(|| o.get("type"))
                .and_then(Value::as_str)
                .unwrap_or_default();
            match (message.is_empty(), code.is_empty()) {
                (false, false) => format!("{message} ({code})"),
                (false, true) => message.to_string(),
                (true, _) => e.to_string(),
            }
        }
        other => other.to_string(),
    };
    Some(truncate(&text))
}

/// Whether an error says the prompt does not fit the model's context, as
/// OpenAI, LiteLLM, vLLM, llama.cpp and Ollama word it.
pub(crate) fn context_too_long(message: &str) -> bool {
    let m = message.to_ascii_lowercase();
    [
        "context_length_exceeded",
        "contextwindowexceeded",
        "context length",
        "context window",
        "context size",
        "exceed_context_size",
        "maximum context",
        "prompt is too long",
        "too many tokens",
    ]
    .iter()
    .any(|p| m.contains(p))
}

fn quote(body: &[u8]) -> String {
    truncate(&String::from_utf8_lossy(body))
}

fn truncate(text: &str) -> String {
    let text = text.trim();
    match text.char_indices().nth(QUOTE_MAX) {
        Some((i, _)) => format!("{}…", &text[..i]),
        None => text.to_string(),
    }
}

/// The name of an error kind as captures and logs write it (`timeout`,
/// `budget_exceeded`, ...).
pub fn kind_name(kind: ModelErrorKind) -> String {
    kind.as_str_name()
        .trim_start_matches("MODEL_ERROR_KIND_")
        .to_ascii_lowercase()
}

#[cfg(test)]
mod tests {
    use pretty_assertions::assert_eq;

    use nisse_bus::proto::{ChatMessage, ToolDefinition};

    use super::*;

    fn profile(tool_choice: bool) -> Profile {
        Profile {
            tool_choice,
            max_output_tokens: 256,
            ..Default::default()
        }
    }

    fn message(role: ChatRole, content: &str) -> ChatMessage {
        ChatMessage {
            role: role as i32,
            content: content.into(),
            ..Default::default()
        }
    }

    #[test]
    fn a_request_becomes_the_openai_body() {
        let request = ModelRequest {
            messages: vec![
                message(ChatRole::System, "be brief"),
                message(ChatRole::User, "disk?"),
                ChatMessage {
                    role: ChatRole::Assistant as i32,
                    tool_calls: vec![ToolCall {
                        id: "c1".into(),
                        name: "shell".into(),
                        arguments_json: "{\"command\":\"df -h\"}".into(),
                    }],
                    ..Default::default()
                },
                ChatMessage {
                    role: ChatRole::Tool as i32,
                    tool_call_id: "c1".into(),
                    content: "80%".into(),
                    ..Default::default()
                },
            ],
            tools: vec![ToolDefinition {
                name: "shell".into(),
                description: "run".into(),
                parameters_json_schema: "{\"type\":\"object\"}".into(),
            }],
            tool_choice: "required".into(),
            temperature: Some(0.5),
            ..Default::default()
        };
        let body = request_body(&request, "qwen3:8b", &profile(true)).unwrap();
        assert_eq!(
            body,
            json!({
                "model": "qwen3:8b",
                "max_tokens": 256,
                "temperature": 0.5,
                "messages": [
                    { "role": "system", "content": "be brief" },
                    { "role": "user", "content": "disk?" },
                    { "role": "assistant", "content": null, "tool_calls": [
                        { "id": "c1", "type": "function",
                          "function": { "name": "shell", "arguments": "{\"command\":\"df -h\"}" } }
                    ] },
                    { "role": "tool", "tool_call_id": "c1", "content": "80%" },
                ],
                "tools": [{ "type": "function", "function": {
                    "name": "shell", "description": "run", "parameters": { "type": "object" } } }],
                "tool_choice": "required",
            })
        );
        // Not enforced by the server: not sent.
        let body = request_body(&request, "m", &profile(false)).unwrap();
        assert!(body.get("tool_choice").is_none());
        // A tool name forces that tool.
        let mut named = request.clone();
        named.tool_choice = "shell".into();
        let body = request_body(&named, "m", &profile(true)).unwrap();
        assert_eq!(body["tool_choice"]["function"]["name"], "shell");
    }

    #[test]
    fn requests_that_cannot_be_sent_say_why() {
        let no_role = ModelRequest {
            messages: vec![message(ChatRole::Unspecified, "x")],
            ..Default::default()
        };
        let e = request_body(&no_role, "m", &profile(false)).unwrap_err();
        assert!(e.message.contains("message 0 has no role"), "{e:?}");
        let bad_schema = ModelRequest {
            messages: vec![message(ChatRole::User, "x")],
            tools: vec![ToolDefinition {
                name: "t".into(),
                parameters_json_schema: "{nope".into(),
                ..Default::default()
            }],
            ..Default::default()
        };
        let e = request_body(&bad_schema, "m", &profile(false)).unwrap_err();
        assert!(e.message.contains("tool `t`"), "{e:?}");
        assert!(request_body(&ModelRequest::default(), "m", &profile(false)).is_err());
    }

    fn parsed(body: &str) -> Result<ModelReply, Failure> {
        parse_reply(body.as_bytes()).0
    }

    fn kind(body: &str) -> ModelErrorKind {
        parsed(body).unwrap_err().kind
    }

    #[test]
    fn replies_and_their_failures() {
        let ok = parse_reply(
            br#"{"choices":[{"message":{"content":"hi"},"finish_reason":"stop"}],
                 "usage":{"prompt_tokens":7,"completion_tokens":2}}"#,
        );
        assert_eq!(ok.0.unwrap().content, "hi");
        assert_eq!(
            ok.1,
            Some(Usage {
                prompt_tokens: 7,
                completion_tokens: 2
            })
        );
        let call = parsed(
            r#"{"choices":[{"message":{"content":null,"tool_calls":[
                {"id":"c","type":"function","function":{"name":"f","arguments":"{\"a\":"}}]},
                "finish_reason":"tool_calls"}]}"#,
        )
        .unwrap();
        // Arguments as produced, even when they are not valid JSON.
        assert_eq!(call.tool_calls[0].arguments_json, "{\"a\":");
        assert_eq!(kind("{\"choices\": ["), ModelErrorKind::Malformed);
        assert_eq!(kind(""), ModelErrorKind::Malformed);
        assert_eq!(kind("{\"id\": 1}"), ModelErrorKind::Malformed);
        assert_eq!(kind("{\"choices\": []}"), ModelErrorKind::Empty);
        assert_eq!(
            kind(r#"{"choices":[{"message":{"content":"  "},"finish_reason":"stop"}]}"#),
            ModelErrorKind::Empty
        );
        assert_eq!(
            kind(r#"{"choices":[{"message":{"content":"half a"},"finish_reason":"length"}]}"#),
            ModelErrorKind::Truncated
        );
        assert_eq!(
            kind(r#"{"error":{"message":"This model's maximum context length is 8192 tokens"}}"#),
            ModelErrorKind::ContextTooLong
        );
    }

    #[test]
    fn error_bodies_give_their_message() {
        assert_eq!(
            error_message(br#"{"error":{"message":"bad key","type":"auth"}}"#),
            "bad key (auth)"
        );
        assert_eq!(error_message(br#"{"detail":"nope"}"#), "nope");
        assert_eq!(error_message(b"plain text\n"), "plain text");
        assert_eq!(
            http_failure(400, "the request exceeds the available context size").kind,
            ModelErrorKind::ContextTooLong
        );
        assert_eq!(
            http_failure(400, "unknown parameter").kind,
            ModelErrorKind::Upstream
        );
        assert_eq!(kind_name(ModelErrorKind::BudgetExceeded), "budget_exceeded");
    }
}
