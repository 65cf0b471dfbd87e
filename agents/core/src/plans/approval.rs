//! The approval request's text, rendered by code from the steps and their
//! verdicts.

use time::OffsetDateTime;

use nisse_policy::{Check, RiskClass};

use super::model::Plan;
use crate::markdown::{code, md_escape};
use crate::work::WorkItem;

/// The approval request, rendered by code from the steps and their
/// verdicts (L3: never from anyone's description of them). Anything
/// irreversible, touching a protected target or taking down the agent's
/// own host is flagged at the top.
pub fn render_approval(
    item: &WorkItem,
    plan: &Plan,
    expires: OffsetDateTime,
    halted: Option<&str>,
) -> String {
    let mut out = format!(
        "📝 **Approval needed: item #{} {}** — {}\n",
        item.number,
        plan.tag(),
        md_escape(&item.title)
    );
    if let Some(reason) = halted {
        out.push_str(&format!(
            "\n⏸️ **Halted:** {}. Approving {} continues from step {}.\n",
            md_escape(reason),
            plan.tag(),
            plan.next_step + 1
        ));
    }
    let mut flags = Vec::new();
    for (i, s) in plan.steps.iter().enumerate() {
        let n = i + 1;
        let Some(a) = &s.assessed else { continue };
        if a.risk.is_none_or(RiskClass::is_irreversible) {
            flags.push(format!("❗ **Irreversible:** step {n}"));
        }
        for p in &a.protected {
            flags.push(format!(
                "🛡️ **Protected target:** step {n} — {}",
                md_escape(p)
            ));
        }
        if a.takes_agent_host_down {
            flags.push(format!(
                "💥 **Takes down the agent's own host:** step {n} ({})",
                code(&s.step.action.target)
            ));
        }
    }
    if !flags.is_empty() {
        out.push('\n');
        for f in flags {
            out.push_str(&format!("- {f}\n"));
        }
    }
    out.push_str("\n**Steps:**\n");
    for (i, s) in plan.steps.iter().enumerate() {
        let a = &s.step.action;
        let what = match a.argument_str("command") {
            Some(c) if a.tool == "shell" => format!("`{}`", code(&c)),
            _ => format!(
                "{} {}",
                code(&a.tool),
                format_args!("`{}`", code(&a.arguments))
            ),
        };
        let class = s.assessed.as_ref().map_or("unclassified".to_string(), |x| {
            format!(
                "{}, class {}",
                x.risk.map_or("unknown".into(), |r| r.to_string()),
                x.class.number()
            )
        });
        out.push_str(&format!(
            "{}. on **{}**: {what} — {class}\n",
            i + 1,
            md_escape(&a.target)
        ));
        if let Some(c) = &s.step.precondition {
            out.push_str(&format!("   - before: {}\n", render_check(c)));
        }
        if let Some(c) = &s.step.expected {
            out.push_str(&format!("   - after: {}\n", render_check(c)));
        }
        out.push_str(&format!("   - retries: {}\n", s.step.retries));
    }
    if !plan.rationale.trim().is_empty() {
        out.push_str(&format!(
            "\n_Rationale from {} (not part of what is approved):_ {}\n",
            md_escape(&plan.proposed_by),
            md_escape(plan.rationale.trim())
        ));
    }
    let when = expires
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default();
    out.push_str(&format!(
        "\nReply `approve {tag}` or `deny {tag}`. This request expires {when}.",
        tag = plan.tag()
    ));
    out
}

fn render_check(c: &Check) -> String {
    let mut s = format!("`{}` exits {}", code(&c.command), c.exit_code);
    if let Some(want) = &c.output_contains {
        s.push_str(&format!(" and prints `{}`", code(want)));
    }
    s
}
