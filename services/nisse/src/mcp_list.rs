//! `nisse mcp list`: an agent's MCP server instances as configured
//! (`[mcp]`), what the policy makes of them, which work items have them
//! mounted, and the tools each listed, as the agent's brain last heard
//! them (its state store, read-only).

use nisse_core::mcp::{Catalogue, Mount};
use nisse_policy::{Action, Privilege};

use crate::config::Config;
use crate::shown::{Shown, outln};

/// The duty-state records the brain keeps (see `nisse_core::mcp`).
const TOOLS_RECORD: &str = "mcp.tools.";
const MOUNT_RECORD: &str = "mcp.mount.";

/// `nisse mcp list`.
pub fn listing(cfg: &Config, agent: &str) -> anyhow::Result<Shown> {
    let policy = cfg.load_policy()?;
    let instances = cfg.mcp_instances(agent);
    if instances.is_empty() {
        let text = format!(
            "agent {agent} has no MCP instances (add [[mcp.instance]] entries with agent = \"{agent}\")\n"
        );
        return Ok(Shown::new(
            text,
            serde_json::json!({ "agent": agent, "instances": [] }),
        ));
    }
    // What the brain heard and mounted; without its store on this
    // machine, the configuration alone.
    let (states, open, no_store) = match crate::items::open(cfg, agent) {
        Ok(store) => {
            let open: std::collections::BTreeMap<String, i64> = store
                .items(None)?
                .into_iter()
                .filter(|i| i.state.is_open())
                .map(|i| (i.id, i.number))
                .collect();
            (store.duty_states()?, open, None)
        }
        Err(e) => (Vec::new(), Default::default(), Some(e.to_string())),
    };
    let mut text = String::new();
    let mut rows = Vec::new();
    for instance in &instances {
        let catalogue: Option<Catalogue> = states
            .iter()
            .find(|(k, _)| k.strip_prefix(TOOLS_RECORD) == Some(instance.name.as_str()))
            .map(|(_, v)| serde_json::from_str(v))
            .transpose()?;
        let mut mounted_on = Vec::new();
        for (key, value) in &states {
            let Some(item) = key.strip_prefix(MOUNT_RECORD) else {
                continue;
            };
            if item.ends_with('#') {
                continue;
            }
            let mount: Mount = serde_json::from_str(value)?;
            if !mount.instances.contains(&instance.name) {
                continue;
            }
            if let Some(number) = open.get(item) {
                mounted_on.push(serde_json::json!({
                    "item": item,
                    "number": number,
                    "plan_revision": mount.plan_revision,
                }));
            }
        }
        let declared = policy.mcp_instance(&instance.name);
        let configured = if instance.elevated {
            "elevated"
        } else {
            "read-only"
        };
        outln!(
            text,
            "{} ({configured}; the policy: {}){}",
            instance.name,
            match declared {
                Some(Privilege::ReadOnly) => "read-only",
                Some(Privilege::Elevated) => "elevated",
                Some(Privilege::Shell) => "shell",
                None => "not declared: its tools are elevated and protected",
            },
            match &catalogue {
                Some(c) if !c.server.is_empty() => format!(", server {}", c.server),
                _ => String::new(),
            }
        );
        outln!(
            text,
            "  mounted on: {}",
            if mounted_on.is_empty() {
                "no open work item".to_string()
            } else {
                mounted_on
                    .iter()
                    .map(|m| {
                        let rev = m["plan_revision"].as_u64().unwrap_or(0);
                        format!(
                            "#{}{}",
                            m["number"],
                            if rev > 0 {
                                format!(" (under rev-{rev})")
                            } else {
                                String::new()
                            }
                        )
                    })
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        );
        let mut tools = Vec::new();
        match &catalogue {
            None => outln!(
                text,
                "  tools: not listed yet (the mcp service lists them when it connects)"
            ),
            Some(c) if !c.error.is_empty() => outln!(text, "  tools: not listed: {}", c.error),
            Some(c) => {
                for tool in &c.tools {
                    let name = nisse_policy::mcp::tool_name(&instance.name, &tool.name);
                    let assessed = Action::from_json(&name, &instance.name, "{}")
                        .map(|a| policy.assess(&a, tool.hinted_risk()));
                    let class = match &assessed {
                        Ok(a) => format!("{}, class {}", a.risk, a.class.number()),
                        Err(e) => e.0.clone(),
                    };
                    outln!(text, "  - {} ({class})", tool.name);
                    tools.push(serde_json::json!({
                        "name": tool.name,
                        "description": tool.description,
                        "read_only_hint": tool.read_only_hint,
                        "destructive_hint": tool.destructive_hint,
                        "risk": assessed.as_ref().ok().map(|a| a.risk.to_string()),
                        "class": assessed.as_ref().ok().map(|a| a.class.number()),
                    }));
                }
            }
        }
        rows.push(serde_json::json!({
            "name": instance.name,
            "privilege": configured,
            "policy": declared.map(|p| match p {
                Privilege::ReadOnly => "read-only",
                Privilege::Elevated => "elevated",
                Privilege::Shell => "shell",
            }),
            "server": catalogue.as_ref().map(|c| c.server.clone()),
            "error": catalogue.as_ref().map(|c| c.error.clone()).filter(|e| !e.is_empty()),
            "mounted_on": mounted_on,
            "tools": tools,
        }));
    }
    let mut shown = Shown::new(
        text,
        serde_json::json!({ "agent": agent, "instances": rows }),
    );
    if let Some(why) = no_store {
        shown
            .warnings
            .push(format!("mounts and tools unknown: {why}"));
    }
    Ok(shown)
}
