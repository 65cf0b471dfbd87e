//! The ops policy (Nisse O2): each tool's privilege, the targets it can
//! name, protected targets and `never` targets; and the assessment of one
//! structured action against it.
//!
//! Anything unclassified is treated as elevated and protected: a tool the
//! policy does not list is assumed to write, to something that matters.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::rules::{Globs, TableError, compile_globs};
use crate::shell::ShellReport;
use crate::{ActionClass, Policy, RiskClass};

/// How much a tool can change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Privilege {
    /// Only reads. Always allowed.
    ReadOnly,
    /// Writes; its risk is the tool's declared `risk`.
    Elevated,
    /// Runs a shell command; its risk is the command's, from the shell
    /// classifier.
    Shell,
}

/// `[tools.<name>]` as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub(crate) struct ToolDef {
    pub privilege: Privilege,
    /// For elevated tools, the risk of a call (default `config_mutation`).
    pub risk: Option<RiskClass>,
    /// The argument that names what an elevated call acts on (a VM, a
    /// path), checked against protected and `never` targets like the host.
    pub target_argument: Option<String>,
    /// For the shell tool, the argument holding the command line.
    pub command_argument: Option<String>,
}

/// `[[target]]`: a known target and its labels.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub(crate) struct TargetDef {
    pub name: String,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

/// `[[protected]]` and `[[never]]`: targets by name pattern or by labels.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub(crate) struct TargetRuleDef {
    #[serde(default)]
    pub targets: Vec<String>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    pub reason: String,
}

pub(crate) type ProtectedRule = TargetRuleDef;
pub(crate) type NeverRule = TargetRuleDef;

#[derive(Debug, Clone)]
pub(crate) struct TargetRule {
    names: Globs,
    labels: BTreeMap<String, String>,
    pub reason: String,
}

#[derive(Debug, Clone, Default)]
pub(crate) struct OpsTables {
    pub agent_hosts: BTreeSet<String>,
    pub tools: BTreeMap<String, ToolDef>,
    pub labels: BTreeMap<String, BTreeMap<String, String>>,
    pub protected: Vec<TargetRule>,
    pub never: Vec<TargetRule>,
    /// `[mcp.<instance>]`: each MCP instance's privilege.
    pub mcp_instances: BTreeMap<String, Privilege>,
}

impl OpsTables {
    pub fn merge(
        &mut self,
        agent_hosts: Vec<String>,
        tools: BTreeMap<String, toml::Spanned<ToolDef>>,
        targets: Vec<toml::Spanned<TargetDef>>,
        protected: Vec<toml::Spanned<ProtectedRule>>,
        never: Vec<toml::Spanned<NeverRule>>,
    ) -> Result<(), TableError> {
        self.agent_hosts.extend(agent_hosts);
        for (name, spanned) in tools {
            let span = spanned.span();
            let tool = spanned.into_inner();
            let err = |message: String| TableError {
                span: Some(span.clone()),
                message,
            };
            match tool.privilege {
                Privilege::Shell if tool.command_argument.is_none() => {
                    return Err(err(format!(
                        "tools.{name}: a shell tool needs `command-argument`"
                    )));
                }
                Privilege::ReadOnly if tool.risk.is_some_and(|r| r != RiskClass::ReadOnly) => {
                    return Err(err(format!(
                        "tools.{name}: a read-only tool cannot declare risk `{}`",
                        tool.risk.unwrap_or(RiskClass::ReadOnly)
                    )));
                }
                _ => {}
            }
            self.tools.insert(name, tool);
        }
        for spanned in targets {
            let span = spanned.span();
            let t = spanned.into_inner();
            if t.name.trim().is_empty() {
                return Err(TableError {
                    span: Some(span),
                    message: "target: `name` is empty".into(),
                });
            }
            self.labels.insert(t.name, t.labels);
        }
        for (list, into) in [(protected, &mut self.protected), (never, &mut self.never)] {
            for spanned in list {
                let span = spanned.span();
                let def = spanned.into_inner();
                let err = |message: String| TableError {
                    span: Some(span.clone()),
                    message,
                };
                if def.targets.is_empty() && def.labels.is_empty() {
                    return Err(err("give `targets` (name patterns) or `labels`".into()));
                }
                if def.reason.trim().is_empty() {
                    return Err(err("`reason` is empty".into()));
                }
                let names =
                    compile_globs(&def.targets, false).map_err(|e| err(format!("targets: {e}")))?;
                into.push(TargetRule {
                    names,
                    labels: def.labels,
                    reason: def.reason,
                });
            }
        }
        Ok(())
    }
}

impl TargetRule {
    fn matches(&self, target: &str, labels: Option<&BTreeMap<String, String>>) -> bool {
        let by_name = !self.names.is_empty() && self.names.matches(target, &BTreeMap::new());
        let by_labels = !self.labels.is_empty()
            && labels.is_some_and(|have| {
                self.labels
                    .iter()
                    .all(|(k, v)| have.get(k).is_some_and(|h| h == v))
            });
        by_name || by_labels
    }
}

/// A structured action an agent proposes: a tool, the target the harness
/// bound, and the tool's arguments.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Action {
    /// The tool (`shell`, `file.write`, an MCP tool name).
    pub tool: String,
    /// The host, repository or MCP instance it acts on.
    pub target: String,
    /// The arguments as canonical JSON: object keys sorted, no whitespace.
    /// Two calls are the same action exactly when tool, target and this
    /// text are equal.
    pub arguments: String,
}

/// A malformed action.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ActionError(pub String);

impl Action {
    /// Builds an action, normalising its arguments (a JSON object) to
    /// canonical form.
    pub fn new(tool: &str, target: &str, arguments: &Value) -> Result<Self, ActionError> {
        let tool = tool.trim();
        let target = target.trim();
        if tool.is_empty() {
            return Err(ActionError("the action names no tool".into()));
        }
        if target.is_empty() {
            return Err(ActionError(format!("the `{tool}` action names no target")));
        }
        if !arguments.is_object() {
            return Err(ActionError(format!(
                "the `{tool}` action's arguments must be a JSON object"
            )));
        }
        Ok(Self {
            tool: tool.to_string(),
            target: target.to_string(),
            arguments: canonical_json(arguments),
        })
    }

    /// Parses `arguments_json` and builds the action.
    pub fn from_json(tool: &str, target: &str, arguments_json: &str) -> Result<Self, ActionError> {
        let value: Value = if arguments_json.trim().is_empty() {
            Value::Object(Default::default())
        } else {
            serde_json::from_str(arguments_json).map_err(|e| {
                ActionError(format!("the `{tool}` action's arguments are not JSON: {e}"))
            })?
        };
        Self::new(tool, target, &value)
    }

    /// A shell command on `host` (the tool `shell`, argument `command`).
    pub fn shell(host: &str, command: &str) -> Self {
        Self {
            tool: "shell".into(),
            target: host.trim().to_string(),
            arguments: canonical_json(&serde_json::json!({ "command": command.trim() })),
        }
    }

    /// One argument's value.
    pub fn argument(&self, name: &str) -> Option<Value> {
        serde_json::from_str::<Value>(&self.arguments)
            .ok()
            .and_then(|v| v.get(name).cloned())
    }

    /// One argument as text, when it is a string.
    pub fn argument_str(&self, name: &str) -> Option<String> {
        self.argument(name)
            .and_then(|v| v.as_str().map(str::to_string))
    }

    /// The configured secrets the action asks to be handed (its `secrets`
    /// argument: a list of names, part of what is classified and
    /// approved); none when it has no such argument. Anything but a list of
    /// distinct, non-empty names is an error naming what is wrong.
    pub fn secrets(&self) -> Result<Vec<String>, ActionError> {
        let Some(value) = self.argument("secrets") else {
            return Ok(Vec::new());
        };
        let bad = |why: &str| {
            ActionError(format!(
                "the `{}` action's `secrets` must be a list of secret names: {why}",
                self.tool
            ))
        };
        let list = value.as_array().ok_or_else(|| bad("it is not a list"))?;
        let mut names: Vec<String> = Vec::with_capacity(list.len());
        for v in list {
            let name = v
                .as_str()
                .map(str::trim)
                .filter(|n| !n.is_empty())
                .ok_or_else(|| bad("an entry is not a non-empty string"))?;
            if names.iter().any(|n| n == name) {
                return Err(bad(&format!("`{name}` is listed twice")));
            }
            names.push(name.to_string());
        }
        Ok(names)
    }
}

/// JSON with object keys sorted and no insignificant whitespace.
pub fn canonical_json(value: &Value) -> String {
    fn sorted(value: &Value) -> Value {
        match value {
            Value::Object(map) => {
                let ordered: BTreeMap<&String, Value> =
                    map.iter().map(|(k, v)| (k, sorted(v))).collect();
                Value::Object(ordered.into_iter().map(|(k, v)| (k.clone(), v)).collect())
            }
            Value::Array(items) => Value::Array(items.iter().map(sorted).collect()),
            other => other.clone(),
        }
    }
    sorted(value).to_string()
}

/// What the policy says about one action.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Assessment {
    /// The risk: the tool's or the command's, raised to the declared risk.
    pub risk: RiskClass,
    /// The action class before scope: from the risk, and class 3 for any
    /// non-read-only action on a protected target.
    pub class: ActionClass,
    /// The tool's privilege (elevated when the policy does not list it).
    pub privilege: Privilege,
    /// Every target the action names: the bound target, and the tool's
    /// target argument when it has one.
    pub targets: Vec<String>,
    /// Why a target is protected, one line per matching rule (empty: none).
    pub protected: Vec<String>,
    /// `never` rules of the policy file that match a target.
    pub never: Vec<NeverMatch>,
    /// The action runs on a host the agent itself runs on.
    pub on_agent_host: bool,
    /// ...and can take that host down.
    pub takes_agent_host_down: bool,
    /// The shell classifier's report, for shell actions.
    pub shell: Option<ShellReport>,
    /// The project whose build host the action runs on, when the dev
    /// agent's classes assessed it (D6, [`crate::dev`]): not on a
    /// protected or `never` build host, nor for tools other than the
    /// shell and the file tools.
    pub build_host: Option<String>,
    /// The rule that decided the risk.
    pub rule: String,
    /// Why, in words, one line each.
    pub reasons: Vec<String>,
}

/// A `never` rule that matched a target.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NeverMatch {
    /// The target.
    pub target: String,
    /// The rule's reason.
    pub reason: String,
}

impl Assessment {
    /// Whether the action cannot be undone.
    pub fn irreversible(&self) -> bool {
        self.risk.is_irreversible()
    }

    /// Whether the action reads out a secret (a credential file, an
    /// environment), by a command or a file tool: such an action is never
    /// handed one.
    pub fn reads_credentials(&self) -> bool {
        self.shell
            .as_ref()
            .is_some_and(ShellReport::reads_credentials)
    }
}

impl Policy {
    /// Assesses an action; `declared` is the risk its proposer declared,
    /// which can raise the risk, never lower it (Oikos REQ-DEC-2).
    pub fn assess(&self, action: &Action, declared: Option<RiskClass>) -> Assessment {
        let mut reasons = Vec::new();
        let mut protected = Vec::new();
        let mut shell = None;
        let mut command_line = None;
        let tool = self.ops.tools.get(&action.tool);
        let (privilege, mut risk, mut rule) = match tool {
            None => {
                protected.push(format!(
                    "the tool `{}` is not in the policy: treated as elevated and protected",
                    action.tool
                ));
                reasons.push(format!("`{}` is not classified by the policy", action.tool));
                (
                    Privilege::Elevated,
                    RiskClass::ConfigMutation,
                    "tool.unclassified".to_string(),
                )
            }
            Some(t) => match t.privilege {
                Privilege::ReadOnly => (
                    Privilege::ReadOnly,
                    RiskClass::ReadOnly,
                    format!("tool.{}", action.tool),
                ),
                Privilege::Elevated => {
                    let risk = t.risk.unwrap_or(RiskClass::ConfigMutation);
                    reasons.push(format!("`{}` is an elevated tool", action.tool));
                    (Privilege::Elevated, risk, format!("tool.{}", action.tool))
                }
                Privilege::Shell => {
                    let arg = t.command_argument.as_deref().unwrap_or("command");
                    match action.argument_str(arg) {
                        Some(command) => {
                            let report = self.classify_command(&command);
                            let deciding = report.deciding().cloned();
                            let risk = report.risk;
                            shell = Some(report);
                            command_line = Some(command);
                            match deciding {
                                Some(f) => {
                                    reasons.push(format!("`{}`: {}", f.command, f.reason));
                                    (Privilege::Shell, risk, f.rule)
                                }
                                None => (Privilege::Shell, risk, "shell".into()),
                            }
                        }
                        None => {
                            reasons.push(format!(
                                "the `{}` action has no `{arg}` string argument",
                                action.tool
                            ));
                            (
                                Privilege::Shell,
                                RiskClass::ConfigMutation,
                                "tool.malformed".into(),
                            )
                        }
                    }
                }
            },
        };
        // A file tool is at least as risky as the command that would do the
        // same to that path.
        let file_op = crate::files::FileOp::from_action(action);
        match &file_op {
            Ok(None) => {}
            Ok(Some(op)) => {
                let report = self.classify_command(&op.like_command());
                if report.risk > risk {
                    if let Some(f) = report.deciding() {
                        reasons.push(format!("{} on `{}`: {}", op.tool(), op.path(), f.reason));
                        rule = f.rule.clone();
                    }
                    risk = report.risk;
                }
                shell = Some(report);
            }
            Err(e) => {
                reasons.push(e.0.clone());
                if risk < RiskClass::ConfigMutation {
                    risk = RiskClass::ConfigMutation;
                }
                rule = "tool.malformed".into();
            }
        }

        let mut targets = vec![action.target.clone()];
        if let Some(arg) = tool.and_then(|t| t.target_argument.as_deref())
            && let Some(value) = action.argument(arg)
        {
            let named = match value {
                Value::String(s) => s,
                other => other.to_string(),
            };
            // An MCP tool's target is its instance's: a VM id at one site
            // is never another site's.
            let named = if crate::mcp::split_tool_name(&action.tool).is_some() {
                format!("{}/{named}", action.target)
            } else {
                named
            };
            if !targets.contains(&named) {
                targets.push(named);
            }
        }
        let mut never = Vec::new();
        for target in &targets {
            let labels = self.ops.labels.get(target);
            for p in &self.ops.protected {
                if p.matches(target, labels) {
                    protected.push(format!("{target}: {}", p.reason));
                }
            }
            for n in &self.ops.never {
                if n.matches(target, labels) {
                    never.push(NeverMatch {
                        target: target.clone(),
                        reason: n.reason.clone(),
                    });
                }
            }
        }
        let on_agent_host = targets.iter().any(|t| self.ops.agent_hosts.contains(t));
        if on_agent_host {
            protected.push(format!(
                "{}: the host the agent itself runs on",
                action.target
            ));
        }
        let takes_agent_host_down =
            on_agent_host && (shell.as_ref().is_some_and(|s| s.takes_host_down) || tool.is_none());

        // On a project's build host the dev agent's classes apply (D6),
        // unless the operator protected it or switched it to never there:
        // then the usual rules hold.
        let mut build_host = None;
        if let Some(host) = self.build_hosts.get(&action.target)
            && targets.len() == 1
        {
            if !protected.is_empty() || !never.is_empty() {
                reasons.push(format!(
                    "{} is the build host of {}, but protected or switched to never there: the usual rules apply",
                    host.name, host.project
                ));
            } else {
                let outcome = match (&file_op, &shell, &command_line) {
                    (Ok(Some(op)), _, _) => crate::dev::assess_file(host, op),
                    (Ok(None), Some(report), Some(command)) => {
                        Some(crate::dev::assess_shell(&self.shell, host, command, report))
                    }
                    _ => None,
                };
                if let Some(outcome) = outcome {
                    risk = outcome.risk;
                    rule = outcome.rule;
                    reasons = outcome.reasons;
                    build_host = Some(host.project.clone());
                }
            }
        }
        if let Some(declared) = declared
            && declared > risk
        {
            reasons.push(format!("the proposer declared it {declared}"));
            risk = declared;
            rule = "declared".into();
        }

        let mut class = risk.action_class();
        if !protected.is_empty() && risk > RiskClass::ReadOnly {
            class = ActionClass::Dangerous;
        }
        Assessment {
            risk,
            class,
            privilege,
            targets,
            protected,
            never,
            on_agent_host,
            takes_agent_host_down,
            shell,
            build_host,
            rule,
            reasons,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn policy() -> Policy {
        let text = r#"
version = 1
agent-hosts = ["nisse-vm"]

[tools."proxmox.vm_stop"]
privilege = "elevated"
target-argument = "vm"

[tools."proxmox.vm_list"]
privilege = "read-only"

[[target]]
name = "gw-home"
labels = { role = "gateway" }

[[protected]]
targets = ["nas*"]
reason = "the NAS holds every backup"

[[protected]]
labels = { role = "gateway" }
reason = "a gateway change can cut the path used to fix it"

[[never]]
targets = ["vm-1??"]
reason = "production VMs"
"#;
        Policy::with_file("site.toml", text).unwrap()
    }

    #[test]
    fn arguments_are_canonical() {
        let a = Action::new("t", "h", &json!({"b": 1, "a": {"d": 2, "c": [3]}})).unwrap();
        assert_eq!(a.arguments, r#"{"a":{"c":[3],"d":2},"b":1}"#);
        let b = Action::from_json("t", "h", r#"{ "a": {"c": [3], "d": 2}, "b": 1 }"#).unwrap();
        assert_eq!(a, b);
        assert!(Action::new("t", "h", &json!([1])).is_err());
        assert!(Action::new("", "h", &json!({})).is_err());
        assert!(
            Action::from_json("t", "h", "{oops")
                .unwrap_err()
                .0
                .contains("not JSON")
        );
    }

    #[test]
    fn shell_actions_take_the_command_risk() {
        let p = policy();
        let a = p.assess(&Action::shell("web1", "systemctl status caddy"), None);
        assert_eq!(
            (a.risk, a.class),
            (RiskClass::ReadOnly, ActionClass::NoSideEffects)
        );
        let a = p.assess(&Action::shell("web1", "systemctl restart caddy"), None);
        assert_eq!(a.class, ActionClass::Dangerous);
        assert!(a.protected.is_empty());
    }

    #[test]
    fn declared_risk_raises_never_lowers() {
        let p = policy();
        let a = p.assess(
            &Action::shell("web1", "ls /srv"),
            Some(RiskClass::Destructive),
        );
        assert_eq!(a.risk, RiskClass::Destructive);
        let a = p.assess(
            &Action::shell("web1", "rm -rf /srv"),
            Some(RiskClass::ReadOnly),
        );
        assert_eq!(a.risk, RiskClass::Destructive);
    }

    #[test]
    fn protected_targets_by_name_label_and_agent_host() {
        let p = policy();
        let a = p.assess(&Action::shell("nas01", "touch /tmp/x"), None);
        assert_eq!(a.risk, RiskClass::ReversibleLow);
        assert_eq!(
            a.class,
            ActionClass::Dangerous,
            "class 2 on a protected target is 3"
        );
        assert!(a.protected[0].contains("backup"));
        let a = p.assess(&Action::shell("nas01", "zpool status"), None);
        assert_eq!(a.class, ActionClass::NoSideEffects, "reading stays class 1");
        let a = p.assess(&Action::shell("gw-home", "ip route show"), None);
        assert_eq!(a.protected.len(), 1);
        let a = p.assess(&Action::shell("nisse-vm", "sudo reboot"), None);
        assert!(a.on_agent_host && a.takes_agent_host_down);
        let a = p.assess(&Action::shell("nisse-vm", "systemctl restart caddy"), None);
        assert!(a.on_agent_host && !a.takes_agent_host_down);
    }

    #[test]
    fn unclassified_tools_are_elevated_and_protected() {
        let p = policy();
        let a = p.assess(
            &Action::new("unifi.port_disable", "sw1", &json!({"port": 3})).unwrap(),
            None,
        );
        assert_eq!(a.privilege, Privilege::Elevated);
        assert_eq!(a.class, ActionClass::Dangerous);
        assert!(!a.protected.is_empty());
        let a = p.assess(
            &Action::new("proxmox.vm_list", "pve1", &json!({})).unwrap(),
            None,
        );
        assert_eq!(a.class, ActionClass::NoSideEffects);
    }

    #[test]
    fn target_arguments_are_checked_too() {
        let p = policy();
        let a = p.assess(
            &Action::new("proxmox.vm_stop", "pve1", &json!({"vm": "vm-101"})).unwrap(),
            None,
        );
        assert_eq!(a.targets, ["pve1", "vm-101"]);
        assert_eq!(a.never.len(), 1);
        assert_eq!(a.never[0].target, "vm-101");
    }
}
