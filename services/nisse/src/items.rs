//! `nisse items`, `nisse item show` and `nisse replay --rebuild`: the
//! operator's view of an agent's work, read from its state store without
//! changing it, and rebuilding that store from the agent's stream.

use std::path::Path;

use anyhow::Context as _;
use time::format_description::well_known::Rfc3339;

use nisse_bus::{AgentName, Bus};
use nisse_core::{Event, LoggedEvent, State, Store, WorkItem};

use crate::config::Config;

/// The agent's state store, read-only, when it is on this machine: the
/// listings read it directly (commands go over the bus instead).
pub(crate) fn open(cfg: &Config, agent: &str) -> anyhow::Result<Store> {
    let agent: AgentName = agent.parse()?;
    let path = cfg.store_path(agent.as_str());
    if !path.exists() {
        anyhow::bail!(
            "the {agent} brain's state store is not on this machine ({} does not exist): list its work items where its brain runs, or point --data-dir at its data directory",
            path.display()
        );
    }
    Ok(Store::open_read_only(&path, agent.as_str())?)
}

fn when(t: time::OffsetDateTime) -> String {
    t.format(&Rfc3339).unwrap_or_default()
}

/// Prints an agent's work items.
pub fn list(cfg: &Config, agent: &str, state: Option<&str>, json: bool) -> anyhow::Result<()> {
    let state: Option<State> = state
        .map(str::parse)
        .transpose()
        .map_err(|e: String| anyhow::anyhow!("--state: {e}"))?;
    let store = open(cfg, agent)?;
    let items = store.items(state)?;
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({ "agent": agent, "items": items }))?
        );
        return Ok(());
    }
    if items.is_empty() {
        println!(
            "no work items{}",
            state.map(|s| format!(" in state {s}")).unwrap_or_default()
        );
        return Ok(());
    }
    println!(
        "{:<6} {:<20} {:<9} {:<20} {:<24} TITLE",
        "#", "STATE", "SEVERITY", "OPENED", "SCOPE"
    );
    for item in &items {
        println!(
            "{:<6} {:<20} {:<9} {:<20} {:<24} {}",
            format!("#{}", item.number),
            item.state.as_str(),
            item.severity.as_deref().unwrap_or("-"),
            item.opened_at
                .format(&time::macros::format_description!(
                    "[year]-[month]-[day] [hour]:[minute]:[second]"
                ))
                .unwrap_or_default(),
            item.scope,
            item.title
        );
    }
    Ok(())
}

/// Prints one work item and its whole log.
pub fn show(cfg: &Config, agent: &str, key: &str, json: bool) -> anyhow::Result<()> {
    let store = open(cfg, agent)?;
    let item = store
        .find_item(key)?
        .ok_or_else(|| anyhow::anyhow!("agent {agent} has no work item `{key}`"))?;
    let events = store.events(&item.id)?;
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({ "item": item, "events": events }))?
        );
        return Ok(());
    }
    print_item(&item);
    println!("log ({} events):", events.len());
    for e in &events {
        println!("  {} [{}] {}", when(e.at), e.actor, describe(e));
    }
    Ok(())
}

fn print_item(item: &WorkItem) {
    println!("#{} {}", item.number, item.title);
    println!("  id:          {}", item.id);
    println!("  state:       {}", item.state);
    println!("  scope:       {}", item.scope);
    println!("  source:      {}", item.source);
    if let Some(s) = &item.severity {
        println!("  severity:    {s}");
    }
    if let Some(f) = &item.fingerprint {
        println!("  fingerprint: {f}");
    }
    if let Some(l) = &item.external_link {
        println!("  record:      {l}");
    }
    if let Some(r) = item.operator_rank {
        println!("  order:       {r} (operator's)");
    }
    println!("  opened:      {}", when(item.opened_at));
    if let Some(c) = item.closed_at {
        println!("  closed:      {}", when(c));
    }
}

/// One line for a log event.
pub(crate) fn describe(e: &LoggedEvent) -> String {
    let rev = |r: &u32| format!("rev-{r}");
    match &e.event {
        Event::Opened { title, .. } => format!("opened: {title}"),
        Event::Finding {
            status, summary, ..
        } => format!("finding ({status}): {summary}"),
        Event::Fact { text, .. } => format!("fact: {text}"),
        Event::StateChanged {
            from, to, reason, ..
        } => format!("{from} → {to}: {reason}"),
        Event::OperatorOrder { rank: Some(r) } => format!("operator's order: {r}"),
        Event::OperatorOrder { rank: None } => "operator's order cleared".into(),
        Event::PlanProposed {
            revision, steps, ..
        } => format!("plan {} proposed ({} steps)", rev(revision), steps.len()),
        Event::PlanRejected { revision, reason } => format!(
            "plan {}rejected: {reason}",
            revision.map_or(String::new(), |r| format!("rev-{r} "))
        ),
        Event::ApprovalRequested {
            revision,
            expires_at,
            ..
        } => format!(
            "approval of {} requested (expires {})",
            rev(revision),
            when(*expires_at)
        ),
        Event::ClassifierVerdict {
            revision,
            step,
            phase,
            verdict,
            action_class,
            risk,
            decided_by,
            reasons,
            ..
        } => format!(
            "classifier: {} step {step} {phase}: {verdict} (class {action_class}, {}, {decided_by}){}",
            rev(revision),
            risk.map_or("risk unknown".into(), |r| r.to_string()),
            reasons.first().map_or(String::new(), |r| format!(": {r}"))
        ),
        Event::Approved {
            revision, by, via, ..
        } => format!("approved {} by {by} via {via}", rev(revision)),
        Event::Denied {
            revision,
            by,
            via,
            reason,
        } => format!("denied {} by {by} via {via}: {reason}", rev(revision)),
        Event::DecisionRefused {
            by,
            via,
            approve,
            reason,
            ..
        } => format!(
            "{} from {by} via {via} not applied: {reason}",
            if *approve { "approval" } else { "denial" }
        ),
        Event::ExecRequested {
            revision,
            step,
            phase,
            host,
            command,
            ..
        } => format!(
            "exec requested: {} step {step} {phase} on {host}: {command}",
            rev(revision)
        ),
        Event::StepResult {
            revision,
            step,
            phase,
            status,
            exit_code,
            reason,
            failure,
            stdout_tail,
            stderr_tail,
            dropped_bytes,
            ..
        } => {
            let mut line = format!(
                "result: {} step {step} {phase}: {status}{}{}{}",
                rev(revision),
                if status == "completed" {
                    format!(" (exit {exit_code})")
                } else {
                    String::new()
                },
                if failure.is_empty() {
                    String::new()
                } else {
                    format!(" [{failure}]")
                },
                if reason.is_empty() {
                    String::new()
                } else {
                    format!(": {reason}")
                }
            );
            // The last lines of output, as the operator would look for
            // them first.
            for (name, text) in [("stdout", stdout_tail), ("stderr", stderr_tail)] {
                let lines: Vec<&str> = text.lines().collect();
                for l in &lines[lines.len().saturating_sub(5)..] {
                    line.push_str(&format!("\n        {name} │ {l}"));
                }
            }
            if *dropped_bytes > 0 {
                line.push_str(&format!(
                    "\n        ({dropped_bytes} bytes of output dropped by the cap)"
                ));
            }
            line
        }
        Event::Said {
            via,
            text,
            operator,
            read_as,
        } => format!(
            "said via {via}{} ({read_as}): {text}",
            if *operator { "" } else { ", not an operator" }
        ),
        Event::HostsBound { added, reason, .. } => {
            format!("hosts bound: {} ({reason})", added.join(", "))
        }
        Event::PlanHalted {
            revision, reason, ..
        } => format!("plan {} halted: {reason}", rev(revision)),
        Event::PlanFinished { revision } => format!("plan {} finished", rev(revision)),
        Event::Stopped { by, via, .. } => format!("stopped by {by} via {via}"),
        Event::Abandoned { by, via, note } => format!("abandoned by {by} via {via}: {note}"),
        Event::RolesPinned { roles } => format!(
            "roles pinned: {}",
            roles
                .iter()
                .map(|(role, pin)| format!("{role} = {}", pin.model))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        Event::ModelRequested {
            request_id,
            role,
            model,
            prompt_tokens,
            dropped_events,
            shortened_results,
        } => format!(
            "asked the {role} ({model}), ~{prompt_tokens} tokens{}{} [{request_id}]",
            if *shortened_results > 0 {
                format!(", {shortened_results} old results shortened")
            } else {
                String::new()
            },
            if *dropped_events > 0 {
                format!(", {dropped_events} old events left out")
            } else {
                String::new()
            }
        ),
        Event::ModelFailed {
            role,
            model,
            error,
            message,
            ..
        } => format!("the {role} ({model}) failed: {error}: {message}"),
        Event::AssistantText { role, text, .. } => format!("{role} said: {text}"),
        Event::ToolCall {
            call_id,
            role,
            tool,
            arguments,
            ..
        } => format!("{role} called {tool} {arguments} [{call_id}]"),
        Event::ToolResult {
            call_id,
            result,
            success,
            ..
        } => format!(
            "{} [{call_id}]: {}",
            if *success { "result" } else { "failed" },
            result.lines().next().unwrap_or_default()
        ),
        Event::QuestionAsked { question, .. } => format!("asked the operator: {question}"),
        Event::Note { text, .. } => format!("note: {text}"),
        Event::DelegationStarted { trigger, model, .. } => {
            format!("handed to the helper ({model}): {trigger}")
        }
        Event::DelegationCompleted {
            status,
            note,
            turns,
            ..
        } => format!("the helper handed back ({status}, {turns} turns): {note}"),
    }
}

/// `nisse replay --agent A --rebuild DIR`.
pub async fn rebuild(cfg: &Config, bus: &Bus, agent: &AgentName, dir: &Path) -> anyhow::Result<()> {
    if dir.exists()
        && std::fs::read_dir(dir)
            .with_context(|| format!("reading {}", dir.display()))?
            .next()
            .is_some()
    {
        anyhow::bail!(
            "{} is not empty: rebuild into a new or empty directory, never over existing state",
            dir.display()
        );
    }
    let path = Store::path_in(dir, agent.as_str());
    let applied = match agent.as_str() {
        "ops" => {
            nisse_core::reactor::rebuild(
                bus,
                agent,
                &path,
                nisse_ops::OpsBrain::new(agent.as_str(), cfg.ops.clone())
                    .with_models(cfg.models.clone()),
            )
            .await?
        }
        other => anyhow::bail!("agent `{other}` has no brain in this build to rebuild"),
    };
    let store = Store::open_read_only(&path, agent.as_str())?;
    let items = store.items(None)?;
    println!(
        "rebuilt {agent}'s state from its stream through sequence {applied}: {} work items ({} open) in {}",
        items.len(),
        items.iter().filter(|i| i.state.is_open()).count(),
        path.display()
    );
    Ok(())
}
