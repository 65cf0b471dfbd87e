//! What a server says, as it goes on the bus: a tool call's content as
//! text (text parts in order, other parts named by their kind and size)
//! and its structured content as JSON, each redacted of every credential
//! handed to the server and capped with its head and tail kept; and a
//! listed tool as an `McpTool`.

use base64::Engine as _;
use rmcp::model::{CallToolResult, ContentBlock, ResourceContents, Tool};

use nisse_bus::capped::Capped;
use nisse_bus::proto::McpTool;
use nisse_bus::redact::Redactor;

/// A tool call's answer, ready for an `McpResult`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Rendered {
    /// The content as text.
    pub(crate) content: String,
    /// The structured content as JSON, when the server sent one.
    pub(crate) structured_json: String,
    /// Bytes the cap dropped, from the content and the structured content
    /// together.
    pub(crate) dropped: u64,
}

/// `result` as text and JSON, redacted by `redactor`, each capped at
/// `cap` bytes. Capped structured content is no longer JSON: the dropped
/// bytes say so.
pub(crate) fn render(result: &CallToolResult, redactor: &Redactor, cap: usize) -> Rendered {
    let text = result
        .content
        .iter()
        .map(part_text)
        .collect::<Vec<_>>()
        .join("\n");
    let (content, dropped_content) = capped(redactor, text.as_bytes(), cap);
    let (structured_json, dropped_structured) = match &result.structured_content {
        Some(value) => capped(redactor, value.to_string().as_bytes(), cap),
        None => (String::new(), 0),
    };
    Rendered {
        content,
        structured_json,
        dropped: dropped_content + dropped_structured,
    }
}

/// `text` redacted, then capped.
pub(crate) fn capped(redactor: &Redactor, text: &[u8], cap: usize) -> (String, u64) {
    let mut out = Capped::new(cap);
    out.push(&redactor.redact(text));
    let (bytes, dropped) = out.finish();
    (String::from_utf8_lossy(&bytes).into_owned(), dropped)
}

/// `text` redacted, for a reason or a log line.
pub(crate) fn redacted(redactor: &Redactor, text: &str) -> String {
    String::from_utf8_lossy(&redactor.redact(text.as_bytes())).into_owned()
}

/// One content part: text as it is, anything else named by its kind and
/// size (the model reads text; an image's bytes would only fill its
/// context).
fn part_text(part: &ContentBlock) -> String {
    match part {
        ContentBlock::Text(t) => t.text.clone(),
        ContentBlock::Image(i) => format!("[image: {}, {}]", i.mime_type, size_b64(&i.data)),
        ContentBlock::Audio(a) => format!("[audio: {}, {}]", a.mime_type, size_b64(&a.data)),
        ContentBlock::Resource(r) => match &r.resource {
            ResourceContents::TextResourceContents {
                uri,
                mime_type,
                text,
                ..
            } => format!(
                "[resource {uri}: {}, {} bytes of text]\n{text}",
                mime_type.as_deref().unwrap_or("text"),
                text.len()
            ),
            ResourceContents::BlobResourceContents {
                uri,
                mime_type,
                blob,
                ..
            } => format!(
                "[resource {uri}: {}, {}]",
                mime_type.as_deref().unwrap_or("binary"),
                size_b64(blob)
            ),
            other => format!("[resource: {}]", kind_of(other)),
        },
        ContentBlock::ResourceLink(l) => format!("[resource link: {} ({})]", l.uri, l.name),
        other => format!("[{} part]", kind_of(other)),
    }
}

/// The `type` a part of a kind this client does not know says it is.
fn kind_of(part: &impl serde::Serialize) -> String {
    serde_json::to_value(part)
        .ok()
        .and_then(|v| v.get("type").and_then(|t| t.as_str()).map(String::from))
        .unwrap_or_else(|| "unknown".into())
}

/// The size of base64 `data` once decoded.
fn size_b64(data: &str) -> String {
    match base64::engine::general_purpose::STANDARD.decode(data.trim()) {
        Ok(bytes) => format!("{} bytes", bytes.len()),
        Err(_) => format!("{} characters of base64", data.len()),
    }
}

/// A listed tool as the brain reads it: its name, its description and
/// input schema (redacted like everything the server says), and its
/// hints when it declared them.
pub(crate) fn tool(t: &Tool, redactor: &Redactor) -> McpTool {
    let hints = t.annotations.clone().unwrap_or_default();
    McpTool {
        name: t.name.to_string(),
        description: redacted(redactor, t.description.as_deref().unwrap_or_default()),
        input_schema_json: redacted(
            redactor,
            &serde_json::Value::Object((*t.input_schema).clone()).to_string(),
        ),
        read_only_hint: hints.read_only_hint,
        destructive_hint: hints.destructive_hint,
        idempotent_hint: hints.idempotent_hint,
        open_world_hint: hints.open_world_hint,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(value: serde_json::Value) -> CallToolResult {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn text_parts_are_joined_and_other_parts_named() {
        let r = result(serde_json::json!({
            "content": [
                {"type": "text", "text": "vm 101 running"},
                {"type": "image", "data": "AAECAw==", "mimeType": "image/png"},
                {"type": "text", "text": "vm 102 stopped"},
                {"type": "resource", "resource": {"uri": "file:///etc/motd", "mimeType": "text/plain", "text": "hello"}},
            ],
            "structuredContent": {"vms": [101, 102]},
        }));
        let out = render(&r, &Redactor::new(std::iter::empty::<&[u8]>()), 4096);
        assert_eq!(
            out.content,
            "vm 101 running\n[image: image/png, 4 bytes]\nvm 102 stopped\n[resource file:///etc/motd: text/plain, 5 bytes of text]\nhello"
        );
        assert_eq!(out.structured_json, r#"{"vms":[101,102]}"#);
        assert_eq!(out.dropped, 0);
    }

    #[test]
    fn secrets_are_redacted_and_long_content_capped() {
        let secret = b"tok-3f9a-very-secret";
        let r = result(serde_json::json!({
            "content": [{"type": "text", "text": format!("token={} {}", "tok-3f9a-very-secret", "x".repeat(500))}],
            "structuredContent": {"token": "tok-3f9a-very-secret"},
        }));
        let out = render(&r, &Redactor::new([&secret[..]]), 64);
        assert!(
            out.content.starts_with("token=[REDACTED]"),
            "{}",
            out.content
        );
        assert!(!out.content.contains("very-secret"));
        assert!(out.content.contains("bytes dropped by the output cap"));
        assert_eq!(out.structured_json, r#"{"token":"[REDACTED]"}"#);
        assert!(out.dropped > 400);
    }

    #[test]
    fn a_tool_keeps_its_schema_and_the_hints_it_declared() {
        let t: Tool = serde_json::from_value(serde_json::json!({
            "name": "stop_vm",
            "description": "Stop a VM",
            "inputSchema": {"type": "object", "properties": {"vm": {"type": "integer"}}},
            "annotations": {"destructiveHint": true},
        }))
        .unwrap();
        let m = tool(&t, &Redactor::new(std::iter::empty::<&[u8]>()));
        assert_eq!(m.name, "stop_vm");
        assert_eq!(m.description, "Stop a VM");
        let schema: serde_json::Value = serde_json::from_str(&m.input_schema_json).unwrap();
        assert_eq!(schema["properties"]["vm"]["type"], "integer");
        assert_eq!(m.destructive_hint, Some(true));
        assert_eq!(m.read_only_hint, None);
    }
}
