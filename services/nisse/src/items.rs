//! `nisse items`, `nisse item show` and `nisse replay --rebuild`: the
//! operator's view of an agent's work, read from its state store without
//! changing it, and rebuilding that store from the agent's stream.

use std::path::Path;

use anyhow::Context as _;
use time::format_description::well_known::Rfc3339;

use nisse_bus::{AgentName, Bus};
use nisse_core::{State, Store, WorkItem};

use crate::config::Config;
use crate::shown::{Shown, outln};

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

/// `nisse items`: an agent's work items, optionally only those in `state`.
pub fn listing(cfg: &Config, agent: &str, state: Option<&str>) -> anyhow::Result<Shown> {
    let state: Option<State> = state
        .map(str::parse)
        .transpose()
        .map_err(|e: String| anyhow::anyhow!("--state: {e}"))?;
    let store = open(cfg, agent)?;
    let items = store.items(state)?;
    let json = serde_json::json!({ "agent": agent, "items": items });
    let mut text = String::new();
    if items.is_empty() {
        outln!(
            text,
            "no work items{}",
            state.map(|s| format!(" in state {s}")).unwrap_or_default()
        );
        return Ok(Shown::new(text, json));
    }
    outln!(
        text,
        "{:<6} {:<20} {:<9} {:<20} {:<24} TITLE",
        "#",
        "STATE",
        "SEVERITY",
        "OPENED",
        "SCOPE"
    );
    for item in &items {
        outln!(
            text,
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
    Ok(Shown::new(text, json))
}

/// `nisse item show`: one work item and its whole log.
pub fn item_log(cfg: &Config, agent: &str, key: &str) -> anyhow::Result<Shown> {
    let store = open(cfg, agent)?;
    let item = store
        .find_item(key)?
        .ok_or_else(|| anyhow::anyhow!("agent {agent} has no work item `{key}`"))?;
    let events = store.events(&item.id)?;
    let mut text = String::new();
    item_header(&mut text, &item);
    outln!(text, "log ({} events):", events.len());
    for e in &events {
        outln!(text, "  {} [{}] {}", when(e.at), e.actor, e.describe());
    }
    Ok(Shown::new(
        text,
        serde_json::json!({ "item": item, "events": events }),
    ))
}

fn item_header(out: &mut String, item: &WorkItem) {
    outln!(out, "#{} {}", item.number, item.title);
    outln!(out, "  id:          {}", item.id);
    outln!(out, "  state:       {}", item.state);
    outln!(out, "  scope:       {}", item.scope);
    outln!(out, "  source:      {}", item.source);
    if let Some(s) = &item.severity {
        outln!(out, "  severity:    {s}");
    }
    if let Some(f) = &item.fingerprint {
        outln!(out, "  fingerprint: {f}");
    }
    if let Some(l) = &item.external_link {
        outln!(out, "  record:      {l}");
    }
    if let Some(r) = item.operator_rank {
        outln!(out, "  order:       {r} (operator's)");
    }
    outln!(out, "  opened:      {}", when(item.opened_at));
    if let Some(c) = item.closed_at {
        outln!(out, "  closed:      {}", when(c));
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
