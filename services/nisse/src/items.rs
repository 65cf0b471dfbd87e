//! `nisse items`, `nisse item show` and `nisse replay --rebuild`: the
//! operator's view of an agent's work, read from its state store without
//! changing it, and rebuilding that store from the agent's stream.

use std::path::Path;

use anyhow::Context as _;
use time::format_description::well_known::Rfc3339;

use nisse_bus::{AgentName, Bus};
use nisse_core::{State, Store, WorkItem};

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
        println!("  {} [{}] {}", when(e.at), e.actor, e.describe());
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
    let bounds = bus.stream_bounds(agent).await?;
    if bounds.first > 1 {
        eprintln!(
            "WARNING: {}'s stream begins at sequence {} (sequences 1 to {} aged out under the stream's limits, bus.streams.max-age and max-bytes).\n\
             The rebuilt state holds only what those later messages say: work items opened, plans proposed and approvals given before then are missing,\n\
             and messages about them are applied to nothing (recorded as unapplied). Do not put this rebuild in place of a live store that knew more.",
            agent.stream(),
            bounds.first,
            bounds.first - 1
        );
    }
    let applied = match agent.as_str() {
        "ops" => {
            nisse_core::reactor::rebuild(bus, agent, &path, cfg.ops_brain(agent.as_str())?).await?
        }
        "dev" => {
            nisse_core::reactor::rebuild(bus, agent, &path, cfg.dev_brain(agent.as_str())).await?
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
