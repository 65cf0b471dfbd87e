//! `nisse eval export`: an agent's captured model calls (`model.capture`)
//! as JSON lines, one call per line, for building evaluation sets (seed
//! L9). The captures are read from the agent's stream with an ordered
//! consumer filtered to their subject, so no durable consumer is touched
//! and the rest of the stream is never transferred.

use std::io::Write as _;
use std::path::Path;

use anyhow::Context as _;
use async_nats::jetstream::consumer;
use futures::StreamExt as _;
use serde_json::{Value, json};

use nisse_bus::proto::{
    ChatRole, ModelExchange, ModelRequest, ModelResponse, ToolCall, model_response::Outcome,
};
use nisse_bus::{AgentName, Decode as _, SubjectKind};

use crate::config::Config;

/// Writes every capture of `agent` to `out` (standard output when `None`),
/// oldest first; returns how many.
pub async fn export(cfg: &Config, agent: &str, out: Option<&Path>) -> anyhow::Result<u64> {
    let agent: AgentName = agent.parse()?;
    let bus = crate::inspect::connect(cfg).await?;
    let subject = agent.subject(SubjectKind::ModelCapture);
    let stream = bus
        .jetstream()
        .get_stream(agent.stream())
        .await
        .with_context(|| format!("reading the stream {} of agent {agent}", agent.stream()))?;
    let mut sink: Box<dyn std::io::Write> = match out {
        Some(path) => Box::new(std::io::BufWriter::new(
            std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?,
        )),
        None => Box::new(std::io::BufWriter::new(std::io::stdout().lock())),
    };
    // Where to stop: the last capture stored now. An ordered consumer
    // would otherwise wait for captures still to come.
    let last = match stream.get_last_raw_message_by_subject(&subject).await {
        Ok(m) => m.sequence,
        Err(e)
            if e.kind()
                == async_nats::jetstream::stream::LastRawMessageErrorKind::NoMessageFound =>
        {
            sink.flush()?;
            return Ok(0);
        }
        Err(e) => return Err(e).context(format!("reading {subject}")),
    };
    let mut messages = stream
        .create_consumer(consumer::pull::OrderedConfig {
            filter_subject: subject.clone(),
            deliver_policy: consumer::DeliverPolicy::All,
            ..Default::default()
        })
        .await
        .with_context(|| format!("reading {subject}"))?
        .messages()
        .await
        .with_context(|| format!("reading {subject}"))?;
    let mut written = 0;
    while let Some(msg) = messages.next().await {
        let msg = msg.with_context(|| format!("reading {subject}"))?;
        let info = msg
            .info()
            .map_err(|e| anyhow::anyhow!("reading {subject}: {e}"))?;
        let (sequence, stored) = (info.stream_sequence, info.published);
        match ModelExchange::decode(SubjectKind::ModelCapture, &msg.payload) {
            Ok(exchange) => {
                let mut line = line(&exchange);
                line["sequence"] = sequence.into();
                line["timestamp"] = stored
                    .format(&time::format_description::well_known::Rfc3339)
                    .unwrap_or_default()
                    .into();
                serde_json::to_writer(&mut sink, &line)?;
                sink.write_all(b"\n")?;
                written += 1;
            }
            // Not a capture after all (a foreign publisher): said, skipped.
            Err(e) => eprintln!("skipping message {sequence}: {}", e.reason),
        }
        if sequence >= last {
            break;
        }
    }
    sink.flush()?;
    Ok(written)
}

/// One capture as a JSON object: who asked what of which model, and what
/// came back.
pub fn line(x: &ModelExchange) -> Value {
    let env = x.envelope.clone().unwrap_or_default();
    let request = x.request.clone().unwrap_or_default();
    let response = x.response.clone().unwrap_or_default();
    let usage = response.usage.unwrap_or_default();
    json!({
        "agent": env.agent,
        "work_item_id": env.work_item_id,
        "request_id": x.request_id,
        "caller": x.caller,
        "role": x.role,
        "model": response.model,
        "pinned_model": request.model,
        "outcome": x.outcome,
        "request": request_json(&request),
        "response": response_json(&response),
        "usage": {
            "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens,
        },
        "latency_ms": response.latency_ms,
        "attempts": response.attempts,
    })
}

fn request_json(r: &ModelRequest) -> Value {
    let messages: Vec<Value> = r
        .messages
        .iter()
        .map(|m| {
            let role = match ChatRole::try_from(m.role).unwrap_or_default() {
                ChatRole::System => "system",
                ChatRole::User => "user",
                ChatRole::Assistant => "assistant",
                ChatRole::Tool => "tool",
                ChatRole::Unspecified => "unspecified",
            };
            let mut out = json!({ "role": role, "content": m.content });
            if !m.name.is_empty() {
                out["name"] = m.name.clone().into();
            }
            if !m.tool_call_id.is_empty() {
                out["tool_call_id"] = m.tool_call_id.clone().into();
            }
            if !m.tool_calls.is_empty() {
                out["tool_calls"] = calls(&m.tool_calls);
            }
            out
        })
        .collect();
    let tools: Vec<Value> = r
        .tools
        .iter()
        .map(|t| {
            json!({
                "name": t.name,
                "description": t.description,
                "parameters": serde_json::from_str::<Value>(&t.parameters_json_schema)
                    .unwrap_or_else(|_| Value::String(t.parameters_json_schema.clone())),
            })
        })
        .collect();
    json!({
        "messages": messages,
        "tools": tools,
        "tool_choice": r.tool_choice,
        "max_tokens": r.max_tokens,
        "temperature": r.temperature,
    })
}

fn response_json(r: &ModelResponse) -> Value {
    match &r.outcome {
        Some(Outcome::Reply(reply)) => json!({
            "content": reply.content,
            "tool_calls": calls(&reply.tool_calls),
            "finish_reason": reply.finish_reason,
            "error": null,
        }),
        Some(Outcome::Error(e)) => json!({
            "content": null,
            "tool_calls": [],
            "finish_reason": null,
            "error": {
                "kind": nisse_model_gateway::kind_name(
                    nisse_bus::proto::ModelErrorKind::try_from(e.kind).unwrap_or_default(),
                ),
                "message": e.message,
            },
        }),
        None => json!({ "content": null, "tool_calls": [], "finish_reason": null, "error": null }),
    }
}

/// Tool calls with their arguments as the model wrote them (text).
fn calls(calls: &[ToolCall]) -> Value {
    calls
        .iter()
        .map(|c| json!({ "id": c.id, "name": c.name, "arguments": c.arguments_json }))
        .collect::<Vec<_>>()
        .into()
}
