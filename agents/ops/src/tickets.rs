//! A finding's ticket (seed Nisse O5): with `ops.ticket-project` set, an
//! item a finding opens (an alert's or a check's) asks for a Vikunja task
//! of its own, its durable record there, through nisse-core's
//! `Txn::open_ticket`. The shared brain links the item to the task once
//! intake-vikunja has made it, and writes back to it as to any ticket.
//! Items the operator opened, and items opened from a ticket, are not
//! findings' and have no task made for them here.
//!
//! The task's title is the item's (from labels, or the check's name and
//! summary); its description is rendered here, every value from outside
//! (labels, annotations, a check's output) escaped for the Markdown the
//! intake renders, or in a fenced block nothing in it can close.

use nisse_core::markdown::{code, code_block, md_escape as md};
use nisse_core::{BrainSettings, StoreError, Txn, WorkItem};

use crate::alerts::Finding;
use crate::brain::OpsDuties;

impl OpsDuties {
    /// When configured, asks for a task for `item`, which `finding` just
    /// opened.
    pub(crate) fn open_ticket(
        &self,
        brain: &BrainSettings,
        txn: &mut Txn<'_, '_>,
        item: &WorkItem,
        finding: &Finding<'_>,
    ) -> Result<(), StoreError> {
        let Some(project) = self.config.ticket_project else {
            return Ok(());
        };
        txn.open_ticket(
            &brain.agent,
            item,
            project,
            description(&brain.agent, item, finding),
        )
    }
}

/// The task's description: the item, and what its finding said.
fn description(agent: &str, item: &WorkItem, f: &Finding<'_>) -> String {
    let mut out = format!(
        "Work item **#{}** (`{}`) of agent `{}`, opened by {} {}.\n\n",
        item.number,
        code(&item.id),
        code(agent),
        if f.what == "alert" { "an" } else { "a" },
        f.what,
    );
    out.push_str(&format!(
        "- Severity: **{}**\n",
        md(item.severity.as_deref().unwrap_or("unknown"))
    ));
    if item.scope.is_empty() {
        out.push_str("- Scope: none\n");
    } else {
        out.push_str(&format!("- Scope: `{}`\n", code(&item.scope)));
    }
    out.push_str(&format!("- Source: `{}`", code(&item.source)));
    if let Some(url) = &f.link {
        out.push_str(&format!(" ([link]({url}))"));
    }
    out.push('\n');
    out.push_str(&format!("- Duty: `{}`\n", code(f.duty)));
    out.push_str(&format!(
        "\nWhat the {} said, as it came (written outside Nisse, not checked):\n\n",
        f.what
    ));
    out.push_str(&said(&f.detail));
    out.push_str(
        "\nThe agent comments here as it works on the item, and marks the task done with the outcome. \
         An operator's `approve rev-N` or `deny rev-N <reason>` here decides that plan revision.\n",
    );
    out
}

/// A finding's detail as Markdown: one list line per value (a table's
/// values indented under its key), and text of more than one line in a
/// fenced block after the list, under its key.
fn said(detail: &serde_json::Value) -> String {
    use serde_json::Value;
    let Value::Object(map) = detail else {
        return code_block(&detail.to_string());
    };
    let mut list = String::new();
    let mut blocks = String::new();
    for (key, value) in map {
        match value {
            Value::Null => {}
            Value::String(s) if s.trim().is_empty() => {}
            Value::String(s) if s.contains(['\n', '\r']) => {
                blocks.push_str(&format!("\n{}:\n\n{}", md(key), code_block(s)));
            }
            Value::Object(inner) if inner.is_empty() => {}
            Value::Object(inner) => {
                list.push_str(&format!("- {}:\n", md(key)));
                for (k, v) in inner {
                    if let Some(v) = one_line(v) {
                        list.push_str(&format!("  - {}: {}\n", md(k), md(&v)));
                    }
                }
            }
            other => {
                if let Some(v) = one_line(other) {
                    list.push_str(&format!("- {}: {}\n", md(key), md(&v)));
                }
            }
        }
    }
    if list.is_empty() && blocks.is_empty() {
        return "- (nothing)\n".into();
    }
    list + &blocks
}

/// A value on one line: text as it is (its line breaks made spaces), the
/// rest as JSON; nothing for an empty one.
fn one_line(value: &serde_json::Value) -> Option<String> {
    use serde_json::Value;
    let text = match value {
        Value::Null => return None,
        Value::String(s) => s.clone(),
        Value::Array(a) if a.is_empty() => return None,
        Value::Array(a) => a.iter().filter_map(one_line).collect::<Vec<_>>().join(", "),
        other => other.to_string(),
    };
    let text = text.replace(['\r', '\n'], " ");
    (!text.trim().is_empty()).then_some(text)
}

#[cfg(test)]
mod tests {
    use super::said;

    #[test]
    fn what_a_finding_said_is_escaped_and_multi_line_text_fenced() {
        let detail = serde_json::json!({
            "status": "firing",
            "labels": { "alertname": "Disk*Full", "instance": "nas01" },
            "annotations_untrusted": { "summary": "see [here](https://evil.example)" },
            "ends_at": null,
            "stdout_tail": "line 1\n```\nline 3\n",
            "empty": "",
        });
        assert_eq!(
            said(&detail),
            "- annotations\\_untrusted:\n  - summary: see \\[here\\](https://evil.example)\n\
             - labels:\n  - alertname: Disk\\*Full\n  - instance: nas01\n\
             - status: firing\n\
             \nstdout\\_tail:\n\n````\nline 1\n```\nline 3\n````\n"
        );
        assert_eq!(said(&serde_json::json!({})), "- (nothing)\n");
    }
}
