//! The world model in the brain (Oikos REQ-ORI-1..2): the last
//! `WorldModel` the vault reader sent is kept in the store, so what a plan
//! would take down is a function of the stream, and a replay says the
//! same. Used where it matters: the approval request for a step that
//! restarts, stops or powers off a service, container, VM or host lists
//! what depends on it, and the driver's pinned context names the entities
//! of the item's hosts and their dependents.

use rusqlite::{OptionalExtension as _, params};
use serde_json::Value;

use nisse_bus::proto::{self, WorldModel};
use nisse_policy::{FindingKind, Policy, Step};
use nisse_vault::world::{Blast, Entity, EntityKind, RelationKind, World};

use crate::markdown::{code_span, md_escape};
use crate::store::{Cached as _, StoreError, Txn, time_to_ns};

/// The most dependents one step's impact lists in the chat; the rest are
/// counted, and `nisse world blast` lists them all.
pub const IMPACT_SHOWN: usize = 15;

impl Txn<'_, '_> {
    /// The vault reader's world model: kept as the agent's world (the
    /// last one wins; one with the same content changes nothing).
    pub fn world_received(&mut self, model: &WorldModel) -> Result<(), StoreError> {
        let entities: Vec<Entity> = model.entities.iter().filter_map(entity_from_wire).collect();
        let json = serde_json::to_string(&entities)
            .map_err(|e| StoreError::Corrupt(format!("the world model does not serialize: {e}")))?;
        self.tx().exec_cached(
            "INSERT INTO world (id, sha256, entities, received_at_ns) VALUES (1, ?1, ?2, ?3)
             ON CONFLICT (id) DO UPDATE SET sha256 = excluded.sha256, entities = excluded.entities,
               received_at_ns = excluded.received_at_ns
             WHERE world.sha256 <> excluded.sha256",
            params![model.sha256, json, time_to_ns(self.at())],
        )?;
        Ok(())
    }

    /// The agent's world model, if the vault reader ever sent one.
    pub fn world(&self) -> Result<Option<World>, StoreError> {
        stored_world(self.tx())
    }
}

/// The world kept in the store of `conn` (the CLI reads it too).
pub(crate) fn stored_world(conn: &rusqlite::Connection) -> Result<Option<World>, StoreError> {
    let json: Option<String> = conn
        .prepare_cached("SELECT entities FROM world WHERE id = 1")?
        .query_row([], |r| r.get(0))
        .optional()?;
    json.map(|j| {
        serde_json::from_str::<Vec<Entity>>(&j)
            .map(World::from_entities)
            .map_err(|e| StoreError::Corrupt(format!("the stored world model: {e}")))
    })
    .transpose()
}

/// The wire entity as the vault's; an entity of a kind this build does not
/// know is left out (the reader validated it against its own build).
fn entity_from_wire(e: &proto::Entity) -> Option<Entity> {
    Some(Entity {
        name: e.name.clone(),
        kind: EntityKind::parse(&e.kind)?,
        title: e.title.clone(),
        path: e.path.clone(),
        relations: e
            .relations
            .iter()
            .filter_map(|r| Some((RelationKind::parse(&r.kind)?, r.target.clone())))
            .collect(),
        aliases: e.aliases.clone(),
    })
}

/// What a step would stop or restart, as read from its command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stops {
    /// The host itself (a reboot, a power-off).
    Host,
    /// A service, container or VM on the host, by the name the command
    /// gives it (a systemd unit without `.service`, a container name, a
    /// VM id).
    Named(String),
}

/// What `step` stops or restarts on its target, read from the words of a
/// shell command (through `sudo` and the like): `systemctl
/// restart|stop|reload|kill|disable|mask <unit>…`, `service <unit>
/// restart|stop|reload`, `docker|podman restart|stop|kill|rm <name>…`,
/// `qm|pct stop|shutdown|reboot <id>`, `virsh shutdown|destroy|reboot
/// <domain>`, and `reboot`, `shutdown`, `poweroff`, `halt` (and `systemctl
/// reboot|poweroff|halt`) for the host.
pub fn step_stops(step: &Step) -> Vec<Stops> {
    if step.action.tool != "shell" {
        return Vec::new();
    }
    let Ok(args) = serde_json::from_str::<Value>(&step.action.arguments) else {
        return Vec::new();
    };
    let Some(command) = args.get("command").and_then(Value::as_str) else {
        return Vec::new();
    };
    // The built-in shell rules read which program a step runs (the
    // classifier decides the step's risk; this only reads its words).
    let Some(policy) = Policy::builtin_shared() else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for finding in policy.classify_command(command).commands {
        if finding.kind != FindingKind::Program {
            continue;
        }
        let Some(program) = finding.program.as_deref() else {
            continue;
        };
        let words: Vec<&str> = finding.command.split_whitespace().collect();
        // The program's own words start where its name is (after `sudo`,
        // `timeout 5` and the like).
        let Some(at) = words
            .iter()
            .position(|w| w.rsplit('/').next() == Some(program))
        else {
            continue;
        };
        let args: Vec<&str> = words[at + 1..]
            .iter()
            .copied()
            .filter(|w| !w.starts_with('-'))
            .collect();
        let names = |from: usize| {
            args.iter()
                .skip(from)
                .map(|n| Stops::Named(n.trim_end_matches(".service").to_string()))
                .collect::<Vec<_>>()
        };
        let found = match (program, args.first().copied()) {
            ("reboot" | "shutdown" | "poweroff" | "halt", _) => vec![Stops::Host],
            ("systemctl", Some("reboot" | "poweroff" | "halt" | "kexec")) => vec![Stops::Host],
            (
                "systemctl",
                Some(
                    "restart" | "stop" | "reload" | "try-restart" | "reload-or-restart" | "kill"
                    | "disable" | "mask",
                ),
            ) => names(1),
            ("service", Some(unit))
                if matches!(
                    args.get(1).copied(),
                    Some("restart" | "stop" | "reload" | "force-reload")
                ) =>
            {
                vec![Stops::Named(unit.to_string())]
            }
            ("docker" | "podman", Some("restart" | "stop" | "kill" | "rm" | "pause")) => names(1),
            ("qm" | "pct", Some("stop" | "shutdown" | "reboot" | "destroy")) => names(1),
            ("virsh", Some("shutdown" | "destroy" | "reboot" | "suspend")) => names(1),
            _ => Vec::new(),
        };
        for f in found {
            if !out.contains(&f) {
                out.push(f);
            }
        }
    }
    out
}

/// The entity `stops` names on `host`: the host's own entity, or the
/// entity called (or aliased) that name, preferring one that runs on the
/// host, directly or through a VM or container.
pub fn stopped_entity<'w>(world: &'w World, host: &str, stops: &Stops) -> Option<&'w Entity> {
    match stops {
        Stops::Host => world.get(host),
        Stops::Named(name) => {
            let on_host = |e: &Entity| {
                world
                    .blast(host)
                    .is_some_and(|b| b.affected.iter().any(|a| a.entity == e.name))
            };
            let candidates: Vec<&Entity> = world
                .entities()
                .iter()
                .filter(|e| {
                    e.name.eq_ignore_ascii_case(name)
                        || e.aliases.iter().any(|a| a.eq_ignore_ascii_case(name))
                })
                .collect();
            candidates
                .iter()
                .find(|e| on_host(e))
                .or(candidates.first())
                .copied()
        }
    }
}

/// The lines an approval request shows about what the plan's steps would
/// take down (Markdown, one list), empty when no step stops anything.
pub fn plan_impact(world: Option<&World>, steps: &[Step], all: bool) -> Vec<String> {
    let mut lines = Vec::new();
    for (i, step) in steps.iter().enumerate() {
        let host = &step.action.target;
        for stops in step_stops(step) {
            let what = match &stops {
                Stops::Host => format!("the host {}", code(host)),
                Stops::Named(name) => format!("{} on {}", code(name), code(host)),
            };
            // No world described (none sent, or `world/` empty): nothing
            // to say, rather than a line per step about what is unknown.
            let Some(world) = world.filter(|w| !w.is_empty()) else {
                continue;
            };
            let Some(entity) = stopped_entity(world, host, &stops) else {
                lines.push(format!(
                    "- Step {} stops or restarts {what}, which is not in the world model: what depends on it is unknown.",
                    i + 1
                ));
                continue;
            };
            let blast = world.blast(&entity.name);
            let affected = blast.as_ref().map_or(0, |b| b.affected.len());
            if affected == 0 {
                lines.push(format!(
                    "- Step {} stops or restarts {what} ({} {}): nothing in the world model depends on it.",
                    i + 1,
                    entity.kind.as_str(),
                    code(&entity.name)
                ));
                continue;
            }
            lines.push(format!(
                "- Step {} stops or restarts {what} ({} {}): **{affected} depend on it**:",
                i + 1,
                entity.kind.as_str(),
                code(&entity.name)
            ));
            if let Some(blast) = blast {
                lines.extend(blast_lines(
                    &blast,
                    if all { usize::MAX } else { IMPACT_SHOWN },
                ));
            }
        }
    }
    lines
}

/// One indented line per affected entity, with the path by which it
/// depends on the root; past `limit`, a line counting the rest.
fn blast_lines(blast: &Blast, limit: usize) -> Vec<String> {
    let mut out: Vec<String> = blast
        .affected
        .iter()
        .take(limit)
        .map(|a| {
            let path: Vec<String> = a
                .path
                .iter()
                .map(|h| format!("{} {}", h.relation.as_str(), md_escape(&h.to)))
                .collect();
            format!(
                "  - {} {} ({})",
                a.kind.as_str(),
                code(&a.entity),
                path.join(" → ")
            )
        })
        .collect();
    if blast.affected.len() > limit {
        out.push(format!(
            "  - … and {} more (`nisse world blast {}` lists them all)",
            blast.affected.len() - limit,
            blast.root
        ));
    }
    out
}

/// What the driver's pinned context says about the world around the item's
/// hosts: each bound host's entity, what it runs on or is part of, and
/// what depends on it (plain text, names quoted by the caller's rules).
pub fn hosts_context(world: &World, hosts: &[String]) -> Option<String> {
    let mut parts = Vec::new();
    for host in hosts {
        let Some(entity) = world.get(host) else {
            continue;
        };
        let relations: Vec<String> = entity
            .relations
            .iter()
            .map(|(r, t)| format!("{} {}", r.as_str(), crate::render::quoted(t)))
            .collect();
        let mut text = format!(
            "{} {} is a {}{}.",
            if parts.is_empty() { "World model:" } else { "" },
            crate::render::quoted(&entity.name),
            entity.kind.as_str(),
            if relations.is_empty() {
                String::new()
            } else {
                format!(" ({})", relations.join(", "))
            }
        );
        if let Some(blast) = world.blast(&entity.name).filter(|b| !b.affected.is_empty()) {
            let names: Vec<String> = blast
                .affected
                .iter()
                .take(40)
                .map(|a| format!("{} {}", a.kind.as_str(), crate::render::quoted(&a.entity)))
                .collect();
            text.push_str(&format!(
                " If it stops, {} depend on it: {}{}.",
                blast.affected.len(),
                names.join(", "),
                if blast.affected.len() > 40 {
                    ", …"
                } else {
                    ""
                }
            ));
        }
        parts.push(text.trim().to_string());
    }
    (!parts.is_empty()).then(|| parts.join("\n"))
}

/// `text` as an inline code span, or escaped when no span can hold it.
fn code(text: &str) -> String {
    code_span(text).unwrap_or_else(|| md_escape(text))
}

#[cfg(test)]
mod tests {
    use super::*;
    use nisse_policy::Action;

    fn stops(command: &str) -> Vec<Stops> {
        step_stops(&Step {
            action: Action::shell("db01", command),
            precondition: None,
            expected: None,
            retries: 1,
        })
    }

    fn named(names: &[&str]) -> Vec<Stops> {
        names
            .iter()
            .map(|n| Stops::Named((*n).to_string()))
            .collect()
    }

    #[test]
    fn what_a_command_stops_is_read_from_its_words_through_wrappers() {
        assert_eq!(
            stops("sudo systemctl restart postgresql.service"),
            named(&["postgresql"])
        );
        assert_eq!(
            stops("systemctl --no-block stop nginx php-fpm"),
            named(&["nginx", "php-fpm"])
        );
        assert_eq!(stops("service nginx reload"), named(&["nginx"]));
        assert_eq!(stops("docker restart nextcloud"), named(&["nextcloud"]));
        assert_eq!(stops("qm shutdown 101"), named(&["101"]));
        assert_eq!(stops("virsh destroy win10"), named(&["win10"]));
        assert_eq!(stops("sudo reboot"), [Stops::Host]);
        assert_eq!(stops("systemctl poweroff"), [Stops::Host]);
        assert_eq!(
            stops("df -h && sudo systemctl restart caddy"),
            named(&["caddy"])
        );
    }

    #[test]
    fn commands_that_stop_nothing_say_nothing() {
        for c in [
            "systemctl status nginx",
            "echo restart",
            "docker ps",
            "journalctl -u nginx",
            "service nginx status",
        ] {
            assert!(stops(c).is_empty(), "{c}");
        }
        let file = Step {
            action: Action::new(
                "file.write",
                "db01",
                &serde_json::json!({ "path": "/etc/x", "content": "" }),
            )
            .unwrap(),
            precondition: None,
            expected: None,
            retries: 1,
        };
        assert!(step_stops(&file).is_empty());
    }
}
