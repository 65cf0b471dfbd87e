//! MCP server instances in the policy (seed O2, X3): each instance's
//! privilege and its tools' classes, as data.
//!
//! ```toml
//! [mcp.hv-site-a-ro]
//! privilege = "read-only"
//! [mcp.hv-site-a-ro.tools.list_vms]
//! privilege = "read-only"
//!
//! [mcp.hv-site-a-elevated]
//! privilege = "elevated"
//! [mcp.hv-site-a-elevated.tools.stop_vm]
//! privilege = "elevated"
//! risk = "reversible_low"
//! target-argument = "vm"
//! ```
//!
//! A tool is classified as the tool `mcp:<instance>/<tool>` (what
//! [`tool_name`] makes) acting on the instance, so every rule for tools
//! applies to it unchanged: a tool the policy does not list is elevated
//! and protected. An elevated tool's target argument names what it acts
//! on qualified by its instance (`hv-site-a-elevated/101`), so a VM id at
//! one site is never another site's, and protected or `never` rules name
//! targets that way. A read-only instance holds read-only credentials:
//! the policy cannot list a writing tool on one. Server-declared hints
//! ([`hinted_risk`]) can make a tool stricter, never looser.

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::ops::{Privilege, ToolDef};
use crate::rules::TableError;
use crate::{Policy, RiskClass};

/// The prefix of an MCP tool's name in the policy and in actions.
pub const TOOL_PREFIX: &str = "mcp:";

/// The policy's name of `tool` on `instance`: `mcp:<instance>/<tool>`.
pub fn tool_name(instance: &str, tool: &str) -> String {
    format!("{TOOL_PREFIX}{instance}/{tool}")
}

/// The instance and tool an action's tool name names, when it is an MCP
/// tool's.
pub fn split_tool_name(name: &str) -> Option<(&str, &str)> {
    name.strip_prefix(TOOL_PREFIX)?
        .split_once('/')
        .filter(|(i, t)| !i.is_empty() && !t.is_empty())
}

/// What a server's own hints (MCP tool annotations) say about a tool's
/// risk, when they make it stricter than read-only: declared
/// `destructiveHint: true` is destructive, declared `readOnlyHint: false`
/// at least a config change. A hint the server did not declare says
/// nothing (the protocol's defaults are not read as declarations), and no
/// hint lowers a risk: a `readOnlyHint: true` on a tool the policy lists
/// as writing changes nothing.
pub fn hinted_risk(read_only: Option<bool>, destructive: Option<bool>) -> Option<RiskClass> {
    match (read_only, destructive) {
        (_, Some(true)) => Some(RiskClass::Destructive),
        (Some(false), _) => Some(RiskClass::ConfigMutation),
        _ => None,
    }
}

/// `[mcp.<instance>]` as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub(crate) struct InstanceDef {
    privilege: Privilege,
    #[serde(default)]
    tools: BTreeMap<String, ToolDef>,
}

impl crate::ops::OpsTables {
    /// Adds the `[mcp.*]` tables: each instance's privilege, and its tools
    /// as the tools `mcp:<instance>/<tool>`.
    pub(crate) fn merge_mcp(
        &mut self,
        instances: BTreeMap<String, toml::Spanned<InstanceDef>>,
    ) -> Result<(), TableError> {
        for (name, spanned) in instances {
            let span = spanned.span();
            let def = spanned.into_inner();
            let err = |message: String| TableError {
                span: Some(span.clone()),
                message,
            };
            if !valid_instance_name(&name) {
                return Err(err(format!(
                    "mcp.{name}: an instance's name is lowercase letters, digits and `-` (as `hv-site-a-ro`)"
                )));
            }
            if def.privilege == Privilege::Shell {
                return Err(err(format!(
                    "mcp.{name}: an instance is `read-only` or `elevated`, not `shell`"
                )));
            }
            for (tool, t) in def.tools {
                if t.privilege == Privilege::Shell || t.command_argument.is_some() {
                    return Err(err(format!(
                        "mcp.{name}.tools.{tool}: an MCP tool is `read-only` or `elevated`; it runs no command line"
                    )));
                }
                if def.privilege == Privilege::ReadOnly && t.privilege != Privilege::ReadOnly {
                    return Err(err(format!(
                        "mcp.{name}.tools.{tool}: `{name}` is a read-only instance (its credentials cannot write): list writing tools on its elevated instance"
                    )));
                }
                if t.privilege == Privilege::ReadOnly
                    && t.risk.is_some_and(|r| r != RiskClass::ReadOnly)
                {
                    return Err(err(format!(
                        "mcp.{name}.tools.{tool}: a read-only tool cannot declare a risk"
                    )));
                }
                self.tools.insert(tool_name(&name, &tool), t);
            }
            self.mcp_instances.insert(name, def.privilege);
        }
        Ok(())
    }
}

/// An instance name: lowercase ASCII letters, digits and `-`, not at
/// either end; safe in a tool name a model calls and in a NATS key.
pub fn valid_instance_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 48
        && !name.starts_with('-')
        && !name.ends_with('-')
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

impl Policy {
    /// The privilege the policy declares for MCP instance `name`; `None`
    /// for an instance it does not list, which is treated as elevated.
    pub fn mcp_instance(&self, name: &str) -> Option<Privilege> {
        self.ops.mcp_instances.get(name).copied()
    }

    /// Every MCP instance the policy declares, with its privilege.
    pub fn mcp_instances(&self) -> impl Iterator<Item = (&str, Privilege)> {
        self.ops.mcp_instances.iter().map(|(n, p)| (n.as_str(), *p))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::{Action, ActionClass};

    const FILE: &str = r#"
version = 1

[mcp.hv-site-a-ro]
privilege = "read-only"
[mcp.hv-site-a-ro.tools.list_vms]
privilege = "read-only"
[mcp.hv-site-a-ro.tools.read_console]
privilege = "read-only"

[mcp.hv-site-a-elevated]
privilege = "elevated"
[mcp.hv-site-a-elevated.tools.stop_vm]
privilege = "elevated"
risk = "reversible_low"
target-argument = "vm"

[[protected]]
targets = ["hv-site-*/100"]
reason = "VM 100 is the NAS"
"#;

    fn policy() -> Policy {
        Policy::with_file("site.toml", FILE).unwrap()
    }

    fn call(instance: &str, tool: &str, args: serde_json::Value) -> Action {
        Action::new(&tool_name(instance, tool), instance, &args).unwrap()
    }

    #[test]
    fn instances_and_their_tools_are_classified_as_tools_acting_on_the_instance() {
        let p = policy();
        assert_eq!(p.mcp_instance("hv-site-a-ro"), Some(Privilege::ReadOnly));
        assert_eq!(
            p.mcp_instance("hv-site-a-elevated"),
            Some(Privilege::Elevated)
        );
        assert_eq!(p.mcp_instance("hv-site-b-ro"), None);
        let list = p.assess(&call("hv-site-a-ro", "list_vms", json!({})), None);
        assert_eq!(
            (list.risk, list.class),
            (RiskClass::ReadOnly, ActionClass::NoSideEffects)
        );
        let stop = p.assess(
            &call("hv-site-a-elevated", "stop_vm", json!({"vm": 101})),
            None,
        );
        assert_eq!(stop.privilege, Privilege::Elevated);
        assert_eq!(stop.risk, RiskClass::ReversibleLow);
        // The target argument is named by its instance: site-qualified.
        assert_eq!(
            stop.targets,
            ["hv-site-a-elevated", "hv-site-a-elevated/101"]
        );
        assert!(stop.protected.is_empty(), "{stop:?}");
        let nas = p.assess(
            &call("hv-site-a-elevated", "stop_vm", json!({"vm": 100})),
            None,
        );
        assert_eq!(nas.class, ActionClass::Dangerous, "{nas:?}");
        assert!(
            nas.protected.iter().any(|r| r.contains("the NAS")),
            "{nas:?}"
        );
    }

    #[test]
    fn a_tool_the_policy_does_not_list_is_elevated_and_protected() {
        let p = policy();
        for a in [
            call("hv-site-a-ro", "delete_vm", json!({"vm": 101})),
            call("hv-site-b-elevated", "stop_vm", json!({"vm": 101})),
        ] {
            let got = p.assess(&a, None);
            assert_eq!(got.privilege, Privilege::Elevated, "{a:?}");
            assert_eq!(got.class, ActionClass::Dangerous, "{a:?}");
        }
    }

    #[test]
    fn server_hints_make_a_tool_stricter_never_looser() {
        let p = policy();
        // Listed read-only, declared destructive by its server.
        let console = call("hv-site-a-ro", "read_console", json!({"vm": 101}));
        let hinted = hinted_risk(Some(false), Some(true));
        assert_eq!(hinted, Some(RiskClass::Destructive));
        assert_eq!(p.assess(&console, hinted).risk, RiskClass::Destructive);
        assert_eq!(
            hinted_risk(Some(false), None),
            Some(RiskClass::ConfigMutation)
        );
        // Declared read-only by its server, listed as writing: still writing.
        let stop = call("hv-site-a-elevated", "stop_vm", json!({"vm": 101}));
        assert_eq!(hinted_risk(Some(true), Some(false)), None);
        assert_eq!(
            p.assess(&stop, hinted_risk(Some(true), Some(false))).risk,
            RiskClass::ReversibleLow
        );
        // Undeclared hints say nothing.
        assert_eq!(hinted_risk(None, None), None);
    }

    #[test]
    fn a_writing_tool_on_a_read_only_instance_or_a_bad_name_is_refused_naming_it() {
        for (text, says) in [
            (
                "version = 1\n[mcp.hv-ro]\nprivilege = \"read-only\"\n[mcp.hv-ro.tools.stop_vm]\nprivilege = \"elevated\"\n",
                "mcp.hv-ro.tools.stop_vm: `hv-ro` is a read-only instance",
            ),
            (
                "version = 1\n[mcp.HV]\nprivilege = \"read-only\"\n",
                "mcp.HV: an instance's name",
            ),
            (
                "version = 1\n[mcp.hv]\nprivilege = \"shell\"\n",
                "mcp.hv: an instance is `read-only` or `elevated`",
            ),
            (
                "version = 1\n[mcp.hv]\nprivilege = \"elevated\"\n[mcp.hv.tools.x]\nprivilege = \"shell\"\ncommand-argument = \"c\"\n",
                "mcp.hv.tools.x: an MCP tool is `read-only` or `elevated`",
            ),
        ] {
            let e = Policy::with_file("site.toml", text).unwrap_err();
            assert!(e.to_string().contains(says), "{e}");
            assert!(e.line.is_some(), "{e}");
        }
    }

    #[test]
    fn tool_names_split_back() {
        assert_eq!(
            split_tool_name(&tool_name("hv-site-a-ro", "list_vms")),
            Some(("hv-site-a-ro", "list_vms"))
        );
        assert_eq!(split_tool_name("shell"), None);
        assert_eq!(split_tool_name("mcp:/x"), None);
        assert!(valid_instance_name("hv-site-a-ro"));
        assert!(!valid_instance_name("hv_site"));
        assert!(!valid_instance_name("-hv"));
    }
}
