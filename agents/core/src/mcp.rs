//! MCP tools in the brain (seeds L13, X3, O2): what each of the agent's
//! MCP server instances offers, which instances a work item has mounted,
//! and the model's calls of their tools as actions through the gates.
//!
//! - **The catalogue.** The mcp service lists each instance's tools when it
//!   connects (`McpTools` on `in.mcp.tools`); the brain keeps the last
//!   list per instance (duty state `mcp.tools.<instance>`), so a rebuild
//!   offers the model what the live brain offered.
//! - **Mounts.** An item's loop mounts the agent's read-only instances
//!   when it starts (looking around needs no plan); the mount is a signed
//!   `McpMount` on `out.mcp.mount.<item>`, the whole set each time, and
//!   the mcp service refuses a call to an instance the item has not
//!   mounted. Elevated instances are mounted only under an approved plan
//!   whose steps name them.
//! - **Tools for the model** are the mounted instances' tools, each named
//!   `<instance>__<tool>` (the instance, and so the site, in the name): a
//!   wrong-site call needs a tool that is not offered. A tool whose name a
//!   model could not call (outside `[A-Za-z0-9_-]`, too long) is not
//!   offered. There is no search-then-dispatch meta-tool.
//! - **A call is an action** (the tool `mcp:<instance>/<tool>` acting on
//!   the instance, its arguments normalised against the tool's schema),
//!   classified like any other: the server's own hints can only raise its
//!   risk ([`nisse_policy::mcp::hinted_risk`]). Without a plan only a
//!   read-only call gets a permit; the request is signed and sent only
//!   from that permit ([`Txn::emit_mcp`]).

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use nisse_bus::proto::{McpMount, McpRequest, McpResult, McpStatus, McpTools, ToolDefinition};
use nisse_policy::{Action, RiskClass};

use crate::store::{StoreError, Txn};

/// The duty-state record of an instance's tools.
const TOOLS_RECORD: &str = "mcp.tools.";
/// The duty-state record of an item's mount.
const MOUNT_RECORD: &str = "mcp.mount.";
/// The items whose mount an approved plan widened.
const PLAN_MOUNTED: &str = "mcp.plan-mounted";
/// The items that have anything mounted.
const MOUNTED: &str = "mcp.mounted";
/// Between the instance and the tool in a model's tool name.
const SEPARATOR: &str = "__";

/// A tool of an instance the item has not mounted, as the model named it.
#[derive(Debug, Clone)]
pub struct NotMounted {
    /// What the model is told.
    pub why: String,
    /// For an elevated instance, its name and the tool as listed: a call
    /// of it while the item has an approved plan is a call outside it.
    pub elevated: Option<(String, Tool)>,
}
/// The longest tool name model APIs take.
const MAX_TOOL_NAME: usize = 64;
/// How long a call may take when its instance did not say.
pub const DEFAULT_CALL_TIMEOUT_MS: u64 = 60_000;

/// One of the agent's MCP server instances, as configured (`[mcp]`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct McpInstance {
    /// Its name (`hv-site-a-ro`): the service, the site and the
    /// privilege.
    pub name: String,
    /// It holds write credentials: mounted only under an approved plan.
    pub elevated: bool,
    /// The items whose tool profile holds it: glob patterns over an
    /// item's scope (an item without one gets every instance).
    pub scopes: Vec<String>,
}

impl McpInstance {
    /// Whether an item of `scope` needs the instance.
    pub fn serves(&self, scope: &str) -> bool {
        let scope = scope.trim();
        scope.is_empty()
            || self
                .scopes
                .iter()
                .any(|p| glob::Pattern::new(p).is_ok_and(|p| p.matches(scope)))
    }
}

/// An instance's tools, as last listed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Catalogue {
    /// The server's name and version.
    pub server: String,
    /// Its tools.
    pub tools: Vec<Tool>,
    /// Why it could not be listed, when it could not.
    pub error: String,
    /// How long a call may take (the instance's `call-timeout`); 0 when
    /// the service did not say.
    #[serde(default)]
    pub call_timeout_ms: u64,
}

/// One tool as its server declared it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tool {
    /// Its name on the server.
    pub name: String,
    /// What the server says it does (outside text: shown to the model as
    /// the server's words).
    pub description: String,
    /// Its input JSON Schema, as JSON.
    pub schema: String,
    /// `readOnlyHint`, when declared.
    pub read_only_hint: Option<bool>,
    /// `destructiveHint`, when declared.
    pub destructive_hint: Option<bool>,
}

impl Tool {
    /// The risk the server's hints give the tool, when they make it
    /// stricter than read-only.
    pub fn hinted_risk(&self) -> Option<RiskClass> {
        nisse_policy::mcp::hinted_risk(self.read_only_hint, self.destructive_hint)
    }
}

/// What an item has mounted.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Mount {
    /// The instances, sorted.
    pub instances: BTreeSet<String>,
    /// The approved plan revision elevated instances are mounted under.
    pub plan_revision: u32,
}

/// The name a model calls `tool` of `instance` by, when it can have one.
pub fn model_tool_name(instance: &str, tool: &str) -> Option<String> {
    let name = format!("{instance}{SEPARATOR}{tool}");
    let callable = name.len() <= MAX_TOOL_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    callable.then_some(name)
}

/// Keeps an instance's tools, as the mcp service listed them, when the
/// instance is one of the agent's.
pub(crate) fn tools_heard(
    instances: &[McpInstance],
    txn: &mut Txn<'_, '_>,
    msg: &McpTools,
) -> Result<(), StoreError> {
    if !instances.iter().any(|i| i.name == msg.instance) {
        tracing::warn!(instance = %msg.instance, "tools of an MCP instance this agent does not have");
        return Ok(());
    }
    let catalogue = Catalogue {
        server: msg.server.clone(),
        tools: msg
            .tools
            .iter()
            .map(|t| Tool {
                name: t.name.clone(),
                description: t.description.clone(),
                schema: t.input_schema_json.clone(),
                read_only_hint: t.read_only_hint,
                destructive_hint: t.destructive_hint,
            })
            .collect(),
        error: msg.error.clone(),
        call_timeout_ms: msg.call_timeout_ms,
    };
    let json = serde_json::to_string(&catalogue)
        .map_err(|e| StoreError::Corrupt(format!("an MCP catalogue: {e}")))?;
    txn.set_duty_state(&format!("{TOOLS_RECORD}{}", msg.instance), &json)
}

impl Txn<'_, '_> {
    /// Instance `instance`'s tools, as last listed.
    pub fn mcp_catalogue(&self, instance: &str) -> Result<Option<Catalogue>, StoreError> {
        self.duty_state(&format!("{TOOLS_RECORD}{instance}"))?
            .map(|s| {
                serde_json::from_str(&s).map_err(|e| {
                    StoreError::Corrupt(format!("the MCP catalogue of {instance}: {e}"))
                })
            })
            .transpose()
    }

    /// What `work_item_id` has mounted (nothing when it never mounted).
    pub fn mcp_mount_of(&self, work_item_id: &str) -> Result<Mount, StoreError> {
        Ok(self
            .duty_state(&format!("{MOUNT_RECORD}{work_item_id}"))?
            .map(|s| serde_json::from_str(&s))
            .transpose()
            .map_err(|e| StoreError::Corrupt(format!("the MCP mount of {work_item_id}: {e}")))?
            .unwrap_or_default())
    }

    /// Mounts `mount` for `work_item_id`: a signed `McpMount` (the whole
    /// set), sent only when it differs from the item's last one.
    pub fn mcp_mount(
        &mut self,
        agent: &str,
        work_item_id: &str,
        mount: Mount,
        reason: &str,
    ) -> Result<(), StoreError> {
        let had = self.duty_state(&format!("{MOUNT_RECORD}{work_item_id}"))?;
        let json = serde_json::to_string(&mount)
            .map_err(|e| StoreError::Corrupt(format!("an MCP mount: {e}")))?;
        if had.as_deref() == Some(json.as_str()) {
            return Ok(());
        }
        // Numbered by the changes so far, so each change has its own id
        // and a rebuild makes the same ones.
        let changes = self
            .duty_state(&format!("{MOUNT_RECORD}{work_item_id}#"))?
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or(0)
            + 1;
        self.set_duty_state(&format!("{MOUNT_RECORD}{work_item_id}"), &json)?;
        self.set_duty_state(
            &format!("{MOUNT_RECORD}{work_item_id}#"),
            &changes.to_string(),
        )?;
        let mut mounted = self.mcp_items_mounted()?;
        let changed = if mount.instances.is_empty() {
            mounted.remove(work_item_id)
        } else {
            mounted.insert(work_item_id.to_string())
        };
        if changed {
            let json = serde_json::to_string(&mounted)
                .map_err(|e| StoreError::Corrupt(format!("the items with mounts: {e}")))?;
            self.set_duty_state(MOUNTED, &json)?;
        }
        let message = McpMount {
            envelope: Some(self.agent_envelope(
                agent,
                work_item_id,
                format!("mcp-mount:{work_item_id}:{changes}"),
            )),
            work_item_id: work_item_id.to_string(),
            instances: mount.instances.into_iter().collect(),
            reason: reason.to_string(),
            plan_revision: mount.plan_revision,
            signature: None,
        };
        self.send_mount(message)
    }

    /// The items that have anything mounted.
    fn mcp_items_mounted(&self) -> Result<BTreeSet<String>, StoreError> {
        Ok(self
            .duty_state(MOUNTED)?
            .map(|s| serde_json::from_str(&s))
            .transpose()
            .map_err(|e| StoreError::Corrupt(format!("the items with mounts: {e}")))?
            .unwrap_or_default())
    }

    /// Mounts for `work_item_id` its tool profile: the agent's read-only
    /// instances its scope needs ([`McpInstance::serves`]), keeping
    /// elevated ones an approved plan mounted.
    pub fn mcp_mount_read_only(
        &mut self,
        agent: &str,
        instances: &[McpInstance],
        work_item_id: &str,
    ) -> Result<(), StoreError> {
        if instances.is_empty() {
            return Ok(());
        }
        let scope = self
            .item(work_item_id)?
            .map(|i| i.scope)
            .unwrap_or_default();
        let mut mount = self.mcp_mount_of(work_item_id)?;
        mount.instances.extend(
            instances
                .iter()
                .filter(|i| !i.elevated && i.serves(&scope))
                .map(|i| i.name.clone()),
        );
        self.mcp_mount(
            agent,
            work_item_id,
            mount,
            "the item's tool profile: the read-only instances its scope needs (looking around needs no plan)",
        )
    }

    /// The tools of the instances `work_item_id` has mounted, as the model
    /// is offered them.
    pub fn mcp_tool_definitions(
        &self,
        work_item_id: &str,
    ) -> Result<Vec<ToolDefinition>, StoreError> {
        let mut out = Vec::new();
        for instance in self.mcp_mount_of(work_item_id)?.instances {
            let Some(catalogue) = self.mcp_catalogue(&instance)? else {
                continue;
            };
            for tool in &catalogue.tools {
                let Some(name) = model_tool_name(&instance, &tool.name) else {
                    continue;
                };
                out.push(ToolDefinition {
                    name,
                    description: format!(
                        "MCP tool `{}` of instance `{instance}` ({}). The server says: {}",
                        tool.name,
                        catalogue.server,
                        tool.description.trim()
                    ),
                    parameters_json_schema: if tool.schema.trim().is_empty() {
                        r#"{"type":"object"}"#.into()
                    } else {
                        tool.schema.clone()
                    },
                });
            }
        }
        Ok(out)
    }

    /// The mounted instance and tool a model's tool name names, if any.
    pub fn mcp_resolve(
        &self,
        work_item_id: &str,
        name: &str,
    ) -> Result<Option<(String, Tool)>, StoreError> {
        let Some((instance, tool)) = name.split_once(SEPARATOR) else {
            return Ok(None);
        };
        if !self
            .mcp_mount_of(work_item_id)?
            .instances
            .contains(instance)
        {
            return Ok(None);
        }
        Ok(self
            .mcp_catalogue(instance)?
            .and_then(|c| c.tools.into_iter().find(|t| t.name == tool))
            .map(|t| (instance.to_string(), t)))
    }

    /// Why a model's tool `name` is not there to call when it names a tool
    /// of one of the agent's instances the item has not mounted (an
    /// elevated one, outside an approved plan): so the model is told to
    /// propose the call rather than that no such tool exists.
    pub fn mcp_not_mounted(
        &self,
        instances: &[McpInstance],
        name: &str,
    ) -> Result<Option<NotMounted>, StoreError> {
        let Some((instance, tool)) = name.split_once(SEPARATOR) else {
            return Ok(None);
        };
        let Some(known) = instances.iter().find(|i| i.name == instance) else {
            return Ok(None);
        };
        let Some(listed) = self
            .mcp_catalogue(instance)?
            .and_then(|c| c.tools.into_iter().find(|t| t.name == tool))
        else {
            return Ok(None);
        };
        Ok(Some(if known.elevated {
            NotMounted {
                why: format!(
                    "not run: `{name}` is a tool of the elevated instance `{instance}`, which is mounted only under an approved plan whose steps name it. Propose the exact call with submit_plan (a step with tool `mcp:{instance}/{tool}` and its arguments)."
                ),
                elevated: Some((instance.to_string(), listed)),
            }
        } else {
            NotMounted {
                why: format!("not run: instance `{instance}` is not mounted for this item"),
                elevated: None,
            }
        }))
    }

    /// A plan's MCP call answered: the plan runner takes it as it takes an
    /// executor's result (a call the tool reported as failed is a step
    /// that exited 1, with the tool's words as its output), so checks,
    /// retries, halts and an unknown outcome work for MCP steps exactly as
    /// for commands.
    pub fn plan_mcp_result(
        &mut self,
        settings: crate::plans::PlanSettings<'_>,
        result: &McpResult,
    ) -> Result<(), StoreError> {
        use nisse_bus::proto::{ExecFailure, ExecResult, ExecStatus};
        let status = McpStatus::try_from(result.status).unwrap_or_default();
        let (status, exit_code) = match status {
            McpStatus::Completed => (ExecStatus::Completed, i32::from(result.is_error)),
            McpStatus::OutcomeUnknown => (ExecStatus::OutcomeUnknown, -1),
            McpStatus::Refused => (ExecStatus::Refused, -1),
            McpStatus::Failed | McpStatus::Unspecified => (ExecStatus::Failed, -1),
        };
        let mut stdout = result.content.clone();
        if !result.structured_json.is_empty() {
            stdout.push_str(&format!("\n{}", result.structured_json));
        }
        let reason = if result.is_error && result.reason.is_empty() {
            "the MCP tool reported an error".to_string()
        } else {
            result.reason.clone()
        };
        let as_exec = ExecResult {
            envelope: result.envelope.clone(),
            request_id: result.request_id.clone(),
            status: status as i32,
            exit_code,
            stdout: stdout.into_bytes(),
            stderr: Vec::new(),
            stdout_dropped: result.dropped_bytes,
            stderr_dropped: 0,
            duration_ms: result.duration_ms,
            reason,
            failure: ExecFailure::Unspecified as i32,
            offered_host_key: String::new(),
        };
        self.plan_exec_result(settings, &as_exec)
    }

    /// Mounts, for every item whose approved plan calls MCP tools, the
    /// instances its steps name (elevated ones included) while the item is
    /// the active one and the plan approved or running, under the plan's
    /// revision; and takes them down again when the plan ends (done,
    /// halted, denied, expired, stopped, abandoned) or the item is parked.
    /// A closed item's mount is taken down whole. Run after every message,
    /// when the agent has MCP instances: one query of the open plans, and
    /// the records of the items mounted.
    pub fn mcp_sync_plan_mounts(
        &mut self,
        agent: &str,
        instances: &[McpInstance],
    ) -> Result<(), StoreError> {
        if instances.is_empty() {
            return Ok(());
        }
        let open: Vec<(String, u32, String)> = {
            let mut stmt = self.tx().prepare_cached(
                "SELECT p.work_item_id, p.revision, p.steps FROM plans p JOIN work_items w ON w.id = p.work_item_id
                 WHERE w.state = 'active' AND p.status IN ('approved', 'running')",
            )?;
            let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
            rows.collect::<Result<_, _>>()?
        };
        let mut want: std::collections::BTreeMap<String, (u32, BTreeSet<String>)> =
            Default::default();
        for (item, revision, steps) in open {
            let steps: Vec<crate::plans::PlannedStep> = serde_json::from_str(&steps)
                .map_err(|e| StoreError::Corrupt(format!("the steps of {item}: {e}")))?;
            let named: BTreeSet<String> = steps
                .iter()
                .flat_map(|s| {
                    [
                        Some(s.step.action.tool.as_str()),
                        s.step.precondition.as_ref().and_then(|c| c.tool.as_deref()),
                        s.step.expected.as_ref().and_then(|c| c.tool.as_deref()),
                    ]
                })
                .flatten()
                .filter_map(nisse_policy::mcp::split_tool_name)
                .map(|(instance, _)| instance.to_string())
                .filter(|i| instances.iter().any(|m| m.name == *i))
                .collect();
            if !named.is_empty() {
                want.insert(item, (revision, named));
            }
        }
        let had: BTreeSet<String> = self
            .duty_state(PLAN_MOUNTED)?
            .map(|s| serde_json::from_str(&s))
            .transpose()
            .map_err(|e| StoreError::Corrupt(format!("the items with plan mounts: {e}")))?
            .unwrap_or_default();
        let read_only: BTreeSet<String> = instances
            .iter()
            .filter(|i| !i.elevated)
            .map(|i| i.name.clone())
            .collect();
        for item in had.iter().filter(|i| !want.contains_key(*i)) {
            let mut mount = self.mcp_mount_of(item)?;
            mount.instances.retain(|i| read_only.contains(i));
            mount.plan_revision = 0;
            self.mcp_mount(
                agent,
                item,
                mount,
                "the plan that mounted its elevated instances is not running",
            )?;
        }
        for (item, (revision, named)) in &want {
            let mut mount = self.mcp_mount_of(item)?;
            mount.instances.retain(|i| read_only.contains(i));
            mount.instances.extend(named.iter().cloned());
            mount.plan_revision = *revision;
            self.mcp_mount(
                agent,
                item,
                mount,
                &format!("the instances the steps of approved rev-{revision} name"),
            )?;
        }
        let now: BTreeSet<&String> = want.keys().collect();
        if now.len() != had.len() || !had.iter().all(|h| now.contains(h)) {
            let json = serde_json::to_string(&now)
                .map_err(|e| StoreError::Corrupt(format!("the items with plan mounts: {e}")))?;
            self.set_duty_state(PLAN_MOUNTED, &json)?;
        }
        // A closed item has nothing mounted: no call is made for it again.
        for item in self.mcp_items_mounted()? {
            let closed = self.item(&item)?.is_none_or(|i| !i.state.is_open());
            if closed {
                self.mcp_mount(agent, &item, Mount::default(), "the item is closed")?;
            }
        }
        Ok(())
    }

    /// Whether the MCP call `request_id` was sent already.
    pub(crate) fn mcp_sent(&self, request_id: &str) -> Result<bool, StoreError> {
        use crate::store::Cached as _;
        use nisse_bus::Contract as _;
        use rusqlite::params;
        Ok(self.tx().row_cached(
            "SELECT EXISTS (SELECT 1 FROM requests WHERE kind = ?1 AND request_id = ?2)",
            params![McpRequest::KIND.suffix(), request_id],
            |r| r.get(0),
        )?)
    }

    /// The risk the server's hints give the MCP tool `name`, when it is
    /// one its instance lists.
    pub(crate) fn mcp_hinted(&self, name: &str) -> Result<Option<RiskClass>, StoreError> {
        Ok(self
            .mcp_listed(name)?
            .ok()
            .and_then(|(_, t)| t.hinted_risk()))
    }
}

impl Txn<'_, '_> {
    /// The tool `name` (`mcp:<instance>/<tool>`) names, as its instance
    /// last listed it, or why there is none.
    fn mcp_listed(&self, name: &str) -> Result<Result<(String, Tool), String>, StoreError> {
        let Some((instance, tool)) = nisse_policy::mcp::split_tool_name(name) else {
            return Ok(Err(format!(
                "`{name}` is not an MCP tool (mcp:<instance>/<tool>)"
            )));
        };
        Ok(match self.mcp_catalogue(instance)? {
            None => Err(format!(
                "`{instance}` is not an MCP instance of this agent that listed its tools"
            )),
            Some(c) => match c.tools.into_iter().find(|t| t.name == tool) {
                Some(t) => Ok((instance.to_string(), t)),
                None => Err(format!("instance `{instance}` lists no tool `{tool}`")),
            },
        })
    }

    /// Checks a plan step that calls an MCP tool, or has a check that
    /// does, against what its instance lists: its arguments (and its
    /// checks') normalised by the tool's schema, so the call that runs it
    /// matches it exactly. Returns the risk the step's server hints give
    /// it; an MCP step's checks must be MCP calls (it has no host to run a
    /// command on).
    pub(crate) fn mcp_step(
        &self,
        step: &mut nisse_policy::Step,
    ) -> Result<Result<Option<RiskClass>, String>, StoreError> {
        let mut hinted = None;
        if nisse_policy::mcp::split_tool_name(&step.action.tool).is_some() {
            let (instance, tool) = match self.mcp_listed(&step.action.tool)? {
                Ok(found) => found,
                Err(e) => return Ok(Err(e)),
            };
            let args: Value = serde_json::from_str(&step.action.arguments).unwrap_or_default();
            match call_action(&instance, &tool, &args) {
                Ok((action, h)) => {
                    step.action = action;
                    hinted = h;
                }
                Err(e) => return Ok(Err(e)),
            }
            for check in [&step.precondition, &step.expected].into_iter().flatten() {
                if check.tool.is_none() {
                    return Ok(Err(
                        "an MCP step's checks are read-only MCP calls: it has no host to run a command on"
                            .into(),
                    ));
                }
            }
        }
        for check in [&mut step.precondition, &mut step.expected]
            .into_iter()
            .flatten()
        {
            let Some(name) = check.tool.clone() else {
                continue;
            };
            let (instance, tool) = match self.mcp_listed(&name)? {
                Ok(found) => found,
                Err(e) => return Ok(Err(format!("its check: {e}"))),
            };
            let args: Value = serde_json::from_str(check.arguments.as_deref().unwrap_or("{}"))
                .unwrap_or_default();
            match call_action(&instance, &tool, &args) {
                Ok((action, _)) => check.arguments = Some(action.arguments),
                Err(e) => return Ok(Err(format!("its check: {e}"))),
            }
        }
        Ok(Ok(hinted))
    }
}

/// The action a model's call of `tool` on `instance` asks for, its
/// arguments normalised against the tool's schema, and the risk the
/// server's hints give it.
pub fn call_action(
    instance: &str,
    tool: &Tool,
    args: &Value,
) -> Result<(Action, Option<RiskClass>), String> {
    let arguments =
        normalise(&tool.schema, args).map_err(|e| format!("`{instance}__{}`: {e}", tool.name))?;
    let action = Action::new(
        &nisse_policy::mcp::tool_name(instance, &tool.name),
        instance,
        &arguments,
    )
    .map_err(|e| e.0)?;
    Ok((action, tool.hinted_risk()))
}

/// `args` normalised against `schema` (an object schema): values given as
/// text where the schema wants a number, an integer or a boolean are
/// read as one, absent properties with a `default` take it, and a
/// missing required property, a value of the wrong type, or (with
/// `additionalProperties: false`) an unknown property is an error naming
/// it. So the same call written two ways is one action, and a plan's step
/// matches the call that runs it exactly.
pub fn normalise(schema: &str, args: &Value) -> Result<Value, String> {
    let Value::Object(given) = args else {
        return Err("the arguments must be a JSON object".into());
    };
    let schema: Value = if schema.trim().is_empty() {
        Value::Object(Map::new())
    } else {
        serde_json::from_str(schema).map_err(|e| format!("the tool's schema is not JSON: {e}"))?
    };
    let empty = Map::new();
    let properties = schema
        .get("properties")
        .and_then(Value::as_object)
        .unwrap_or(&empty);
    let mut out = Map::new();
    for (key, value) in given {
        let Some(spec) = properties.get(key) else {
            if schema.get("additionalProperties") == Some(&Value::Bool(false)) {
                return Err(format!("`{key}` is not one of its arguments"));
            }
            out.insert(key.clone(), value.clone());
            continue;
        };
        out.insert(key.clone(), coerce(key, spec, value)?);
    }
    for (key, spec) in properties {
        if !out.contains_key(key)
            && let Some(default) = spec.get("default")
        {
            out.insert(key.clone(), default.clone());
        }
    }
    if let Some(required) = schema.get("required").and_then(Value::as_array) {
        for key in required.iter().filter_map(Value::as_str) {
            if !out.contains_key(key) {
                return Err(format!("`{key}` is required"));
            }
        }
    }
    Ok(Value::Object(out))
}

/// `value` as the type `spec` declares, when it can be read as one.
fn coerce(key: &str, spec: &Value, value: &Value) -> Result<Value, String> {
    let Some(kind) = spec.get("type").and_then(Value::as_str) else {
        return Ok(value.clone());
    };
    let wrong = || format!("`{key}` must be {}", article(kind));
    let text = value.as_str().map(str::trim);
    Ok(match kind {
        "integer" => match (value, text) {
            (Value::Number(n), _) if n.is_i64() || n.is_u64() => value.clone(),
            (Value::Number(n), _) => match n.as_f64() {
                Some(f) if f.fract() == 0.0 && f.abs() < 9.0e15 => Value::from(f as i64),
                _ => return Err(wrong()),
            },
            (_, Some(t)) => t.parse::<i64>().map(Value::from).map_err(|_| wrong())?,
            _ => return Err(wrong()),
        },
        "number" => match (value, text) {
            (Value::Number(_), _) => value.clone(),
            (_, Some(t)) => t
                .parse::<f64>()
                .ok()
                .and_then(serde_json::Number::from_f64)
                .map(Value::Number)
                .ok_or_else(wrong)?,
            _ => return Err(wrong()),
        },
        "boolean" => match (value, text) {
            (Value::Bool(_), _) => value.clone(),
            (_, Some("true")) => Value::Bool(true),
            (_, Some("false")) => Value::Bool(false),
            _ => return Err(wrong()),
        },
        "string" if value.is_string() => value.clone(),
        "string" => return Err(wrong()),
        "array" if value.is_array() => value.clone(),
        "object" if value.is_object() => value.clone(),
        "array" | "object" => return Err(wrong()),
        _ => value.clone(),
    })
}

fn article(kind: &str) -> String {
    match kind {
        "integer" | "array" | "object" => format!("an {kind}"),
        other => format!("a {other}"),
    }
}

/// What a model is told of an MCP call's answer.
pub fn result_text(result: &McpResult) -> (String, bool) {
    let status = McpStatus::try_from(result.status).unwrap_or_default();
    let mut text = match status {
        McpStatus::Completed if result.is_error => "the tool reported an error".to_string(),
        McpStatus::Completed => "done".to_string(),
        other => format!(
            "{}: {}",
            other
                .as_str_name()
                .trim_start_matches("MCP_STATUS_")
                .to_ascii_lowercase()
                .replace('_', " "),
            result.reason
        ),
    };
    if !result.content.is_empty() {
        text.push_str(&format!("\n{}", result.content));
    }
    if !result.structured_json.is_empty() {
        text.push_str(&format!("\nstructured: {}", result.structured_json));
    }
    if result.dropped_bytes > 0 {
        text.push_str(&format!(
            "\n({} bytes of the middle left out)",
            result.dropped_bytes
        ));
    }
    (text, status == McpStatus::Completed && !result.is_error)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const SCHEMA: &str = r#"{"type":"object","properties":{"vm":{"type":"integer"},"force":{"type":"boolean","default":false},"note":{"type":"string"}},"required":["vm"],"additionalProperties":false}"#;

    #[test]
    fn arguments_are_normalised_against_the_schema_so_one_call_is_one_action() {
        let a = normalise(SCHEMA, &json!({"vm": "101"})).unwrap();
        let b = normalise(SCHEMA, &json!({"vm": 101, "force": false})).unwrap();
        assert_eq!(a, b);
        assert_eq!(a, json!({"vm": 101, "force": false}));
        assert_eq!(
            normalise(SCHEMA, &json!({"vm": 101.0, "force": "true"})).unwrap(),
            json!({"vm": 101, "force": true})
        );
        for (args, says) in [
            (json!({}), "`vm` is required"),
            (json!({"vm": "ten"}), "`vm` must be an integer"),
            (json!({"vm": 1.5}), "`vm` must be an integer"),
            (json!({"vm": 1, "note": 3}), "`note` must be a string"),
            (
                json!({"vm": 1, "extra": 1}),
                "`extra` is not one of its arguments",
            ),
            (json!([1]), "must be a JSON object"),
        ] {
            let e = normalise(SCHEMA, &args).unwrap_err();
            assert!(e.contains(says), "{args}: {e}");
        }
        // No schema: taken as given.
        assert_eq!(
            normalise("", &json!({"x": "1"})).unwrap(),
            json!({"x": "1"})
        );
    }

    #[test]
    fn a_call_is_the_tool_of_its_instance_with_the_servers_hints_raising_its_risk() {
        let tool = Tool {
            name: "read_console".into(),
            description: String::new(),
            schema: SCHEMA.into(),
            read_only_hint: Some(false),
            destructive_hint: Some(true),
        };
        let (action, hinted) = call_action("hv-site-a-ro", &tool, &json!({"vm": "101"})).unwrap();
        assert_eq!(action.tool, "mcp:hv-site-a-ro/read_console");
        assert_eq!(action.target, "hv-site-a-ro");
        assert_eq!(action.arguments, r#"{"force":false,"vm":101}"#);
        assert_eq!(hinted, Some(RiskClass::Destructive));
    }

    #[test]
    fn an_instance_serves_the_items_its_scopes_match_and_every_item_without_a_scope() {
        let site_b = McpInstance {
            name: "hv-site-b-ro".into(),
            elevated: false,
            scopes: vec!["pve-b*".into(), "nas-b".into()],
        };
        assert!(site_b.serves("pve-b2"));
        assert!(site_b.serves("nas-b"));
        assert!(!site_b.serves("pve-a1"));
        assert!(
            site_b.serves(""),
            "the operator's words alone: every instance"
        );
    }

    #[test]
    fn only_names_a_model_can_call_are_offered() {
        assert_eq!(
            model_tool_name("hv-site-a-ro", "list_vms").as_deref(),
            Some("hv-site-a-ro__list_vms")
        );
        assert_eq!(model_tool_name("fs", "read.file"), None);
        assert_eq!(model_tool_name("fs", &"x".repeat(70)), None);
    }
}
