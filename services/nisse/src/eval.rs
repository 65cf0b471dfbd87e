//! `nisse eval export`: an agent's captured model calls (`model.capture`)
//! as JSON lines, one call per line, for building evaluation sets (seed
//! L9). The captures are read from the agent's stream by a reader
//! filtered to their subject, so no durable consumer is touched and the
//! rest of the stream is never transferred.

use std::io::Write as _;
use std::path::Path;

use anyhow::Context as _;
use futures::StreamExt as _;
use serde_json::{Value, json};

use nisse_bus::proto::{
    ChatRole, ModelExchange, ModelRequest, ModelResponse, ToolCall, model_response::Outcome,
};
use nisse_bus::{AgentName, Decode as _, SubjectKind};

use crate::config::Config;

/// A message read from an agent's capture subject.
#[derive(Debug)]
pub enum Capture {
    /// A captured model call, as its JSON line.
    Call(Value),
    /// Not a capture after all (a foreign publisher): which message, and
    /// why (`message 12: …`).
    Skipped(String),
}

/// Every capture of `agent` stored now, oldest first, as it is read.
pub async fn captures(
    bus: &nisse_bus::Bus,
    agent: &AgentName,
) -> anyhow::Result<impl futures::Stream<Item = anyhow::Result<Capture>> + Send + 'static> {
    let subject = agent.subject(SubjectKind::ModelCapture);
    // Where to stop: the last capture stored now, not captures still to
    // come.
    let last = bus
        .last_on_subject(agent, &subject)
        .await
        .with_context(|| format!("reading {subject}"))?
        .map(|m| m.sequence);
    let reader = match last {
        Some(last) => Some(
            bus.read_subject(agent, &subject, 1, Some(last))
                .await
                .with_context(|| format!("reading {subject}"))?,
        ),
        None => None,
    };
    Ok(futures::stream::unfold(reader, move |reader| {
        let subject = subject.clone();
        async move {
            let mut reader = reader?;
            let msg = match reader.next().await? {
                Ok(msg) => msg,
                Err(e) => return Some((Err(anyhow::anyhow!("reading {subject}: {e}")), None)),
            };
            let capture = match ModelExchange::decode(SubjectKind::ModelCapture, &msg.payload) {
                Ok(exchange) => {
                    let mut line = line(&exchange);
                    line["sequence"] = msg.sequence.into();
                    line["timestamp"] = msg
                        .stored_at
                        .format(&time::format_description::well_known::Rfc3339)
                        .unwrap_or_default()
                        .into();
                    Capture::Call(line)
                }
                Err(e) => Capture::Skipped(format!("message {}: {}", msg.sequence, e.reason)),
            };
            Some((Ok(capture), Some(reader)))
        }
    }))
}

/// Writes `captures` to `out` (standard output when `None`), saying on
/// stderr what was skipped; returns how many were written.
pub async fn write(
    captures: impl futures::Stream<Item = anyhow::Result<Capture>>,
    out: Option<&Path>,
) -> anyhow::Result<u64> {
    let mut sink: Box<dyn std::io::Write> = match out {
        Some(path) => Box::new(std::io::BufWriter::new(
            std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?,
        )),
        None => Box::new(std::io::BufWriter::new(std::io::stdout().lock())),
    };
    let mut captures = std::pin::pin!(captures);
    let mut written = 0;
    while let Some(capture) = captures.next().await {
        match capture? {
            Capture::Call(line) => {
                serde_json::to_writer(&mut sink, &line)?;
                sink.write_all(b"\n")?;
                written += 1;
            }
            Capture::Skipped(which) => {
                eprintln!("skipping {which}");
            }
        }
    }
    sink.flush()?;
    Ok(written)
}

/// `nisse eval export`: every capture of `agent` to `out` (standard
/// output when `None`), oldest first; returns how many.
pub async fn export(cfg: &Config, agent: &str, out: Option<&Path>) -> anyhow::Result<u64> {
    let agent: AgentName = agent.parse()?;
    let bus = crate::inspect::connect(cfg).await?;
    write(captures(&bus, &agent).await?, out).await
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
