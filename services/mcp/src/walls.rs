//! The mcp service's walls, checked for every call before any server is
//! called, whatever the brain checked, each refusal naming what is wrong:
//! the call is signed by the agent's brain, unchanged and not too old; it
//! names a work item; its instance is one configured for the agent and
//! mounted for the work item (the last `McpMount` on its subject, read
//! from the stream and signed by the same brain); its arguments are a
//! JSON object; the instance's circuit is closed; its tool is one the
//! instance lists; the classifier's verdict the call names (read from the
//! classifier's own subject, never taken from the brain) judged this very
//! call and permits it as the call claims; and the kill switches, read
//! now, allow it: the call is the action the policy classifies
//! (`mcp:<instance>/<tool>` on its instance), consulted as the executor
//! consults for a command, so a `never` switch on a target it names
//! refuses it whatever was approved.

use std::sync::Arc;
use std::time::Duration;

use prost::Message as _;

use nisse_bus::breaker::Admit;
use nisse_bus::once::Gate;
use nisse_bus::proto::{
    self, ClassifyVerdict, McpFailure, McpMount, McpRequest, McpResult, McpStatus,
};
use nisse_bus::signing::Wall;
use nisse_bus::{AgentName, Bus, SubjectKind, Unhandled, verdicts};
use nisse_policy::Action;
use nisse_policy::switches::{SwitchDecision, consult_action};

use crate::run::AgentMcp;
use crate::server::Server;

/// A call ready to be made.
pub(crate) struct Prepared {
    pub(crate) server: Arc<Server>,
    pub(crate) arguments: serde_json::Map<String, serde_json::Value>,
    pub(crate) timeout: Duration,
}

/// The MCP instances last mounted for `work_item_id`: the last message on
/// its mount subject (`out.mcp.mount.<id>`); `None` when none ever was.
pub async fn mount(
    bus: &Bus,
    agent: &AgentName,
    work_item_id: &str,
) -> nisse_bus::Result<Option<McpMount>> {
    if !nisse_bus::topology::is_token(work_item_id) {
        return Ok(None);
    }
    let subject = format!("{}.{work_item_id}", agent.subject(SubjectKind::McpMount));
    match bus.last_on_subject(agent, &subject).await? {
        None => Ok(None),
        Some(stored) => McpMount::decode(stored.payload.as_ref())
            .map(Some)
            .map_err(|e| nisse_bus::Error::Read {
                stream: agent.stream(),
                reason: format!("the mount on {subject} is not an McpMount: {e}"),
            }),
    }
}

impl AgentMcp {
    /// The walls, in order, before anything is called.
    pub(crate) async fn check(
        &self,
        request: &McpRequest,
    ) -> Result<Gate<Prepared, McpResult>, Unhandled> {
        let refuse = |failure: McpFailure, reason: String| {
            Ok(Gate::Answer(Box::new(self.reply(
                request,
                McpStatus::Refused,
                failure,
                reason,
            ))))
        };
        let instance = request.instance.as_str();
        let tool = request.tool.as_str();

        // Only the agent's brain makes calls, from a permit, and signs
        // each: the signature covers everything that decides what is
        // called, so nothing below is trusted before it verifies.
        let wall = self.wall();
        let brain_key = match wall.request("the call", request) {
            Ok(key) => key,
            Err(reason) => return refuse(McpFailure::Signature, reason),
        };

        // A work item: instances are mounted per work item.
        let item = request
            .envelope
            .as_ref()
            .map_or("", |e| e.work_item_id.as_str());
        if item.is_empty() {
            return refuse(
                McpFailure::BadRequest,
                "the call names no work item, and MCP instances are mounted per work item".into(),
            );
        }

        // An instance of this agent's.
        let Some(server) = self.servers.get(instance).cloned() else {
            let known: Vec<&str> = self.servers.keys().map(String::as_str).collect();
            return refuse(
                McpFailure::UnknownInstance,
                format!(
                    "no MCP instance `{instance}` is configured for {} (configured: {}); nothing was called",
                    self.agent,
                    if known.is_empty() {
                        "none".to_string()
                    } else {
                        known.join(", ")
                    }
                ),
            );
        };

        // Mounted for the work item, by the same brain.
        let mounted = mount(&self.bus, &self.agent, item)
            .await
            .map_err(|e| Unhandled::retry(format!("reading the MCP mount: {e}")))?;
        if let Some(m) = &mounted {
            if let Err(reason) =
                wall.signed_by(&brain_key, &format!("the MCP mount of work item {item}"), m)
            {
                return refuse(McpFailure::Signature, reason);
            }
            if m.work_item_id != item {
                return refuse(
                    McpFailure::NotMounted,
                    format!(
                        "the last mount on work item {item}'s subject is work item {}'s; nothing was called",
                        m.work_item_id
                    ),
                );
            }
        }
        let instances = mounted.map(|m| m.instances).unwrap_or_default();
        if !instances.iter().any(|i| i == instance) {
            return refuse(
                McpFailure::NotMounted,
                format!(
                    "{instance} is not mounted for work item {item} (mounted: {}); nothing was called",
                    if instances.is_empty() {
                        "none".to_string()
                    } else {
                        instances.join(", ")
                    }
                ),
            );
        }

        // Arguments: a JSON object, as the tool's input schema wants.
        let arguments = if request.arguments_json.trim().is_empty() {
            serde_json::Map::new()
        } else {
            match serde_json::from_str::<serde_json::Value>(&request.arguments_json) {
                Ok(serde_json::Value::Object(map)) => map,
                Ok(other) => {
                    return refuse(
                        McpFailure::BadRequest,
                        format!(
                            "the arguments are not a JSON object but {}; nothing was called",
                            json_kind(&other)
                        ),
                    );
                }
                Err(e) => {
                    return refuse(
                        McpFailure::BadRequest,
                        format!("the arguments are not JSON ({e}); nothing was called"),
                    );
                }
            }
        };

        // The circuit: an instance that keeps failing is not tried.
        if let Admit::No {
            retry_in,
            last_error,
        } = self.circuits.admit(instance)
        {
            return Ok(Gate::Answer(Box::new(self.reply(
                request,
                McpStatus::Failed,
                McpFailure::CircuitOpen,
                format!(
                    "the circuit for {instance} is open after repeated failures to reach it (the last: {last_error}); not called, next try in {}s",
                    retry_in.as_secs() + 1
                ),
            ))));
        }

        // A tool the instance lists: from what it last listed, or, if it
        // was never reached, from what it lists now.
        let listing = match server.listing() {
            Some(l) => l,
            None => match server.session().await {
                Ok(_) => match server.listing() {
                    Some(l) => l,
                    None => {
                        return Err(Unhandled::retry(format!(
                            "{instance} connected but listed nothing"
                        )));
                    }
                },
                Err(e) => {
                    self.circuits.failure(instance, &e);
                    return Ok(Gate::Answer(Box::new(self.reply(
                        request,
                        McpStatus::Failed,
                        McpFailure::Connect,
                        format!("{instance} cannot be reached: {e}; nothing was called"),
                    ))));
                }
            },
        };
        if !listing.tools.contains(tool) {
            self.circuits.release_trial(instance);
            return refuse(
                McpFailure::UnknownTool,
                format!(
                    "{instance} ({}) lists no tool `{tool}` (it lists: {}); nothing was called",
                    if listing.server.is_empty() {
                        "its server"
                    } else {
                        listing.server.as_str()
                    },
                    listing.tools.iter().cloned().collect::<Vec<_>>().join(", ")
                ),
            );
        }

        // The kill switches, read now, as the executor reads them before
        // it runs a command: a switch set after the classifier judged the
        // call still stops it. The call is the action the policy knows
        // (`mcp:<instance>/<tool>` on its instance, its target argument
        // naming `<instance>/<value>`), and what autonomy off means is the
        // policy's class for it: reading goes on, anything else needs the
        // operator to have confirmed this very call; `never` on a target
        // it names refuses it even then.
        let action = match Action::new(
            &nisse_policy::mcp::tool_name(instance, tool),
            instance,
            &serde_json::Value::Object(arguments.clone()),
        ) {
            Ok(a) => a,
            Err(e) => {
                self.circuits.release_trial(instance);
                return refuse(
                    McpFailure::BadRequest,
                    format!(
                        "the call is not an action the policy can judge: {e}; nothing was called"
                    ),
                );
            }
        };
        // The classifier's verdict the call names, read from the
        // classifier's own subject: it must have judged this very call
        // (tool, instance, arguments), and permit it as the call claims,
        // for the class the policy and the server's hints give it here.
        let hint = listing.hints.get(tool).copied().flatten();
        let verdict_wall = verdicts::Wall {
            who: "the mcp service",
            noun: "the call",
            nothing_done: "nothing was called",
        };
        let verdict = match verdict_wall
            .verdict(&self.bus, &self.agent, item, request.permission.as_ref())
            .await
        {
            Ok(Ok(v)) => v,
            Ok(Err(reason)) => {
                self.circuits.release_trial(instance);
                return refuse(McpFailure::Verdict, reason);
            }
            Err(e) => {
                self.circuits.release_trial(instance);
                return Err(Unhandled::retry(format!(
                    "reading the classifier's verdict: {e}"
                )));
            }
        };
        if let Some(difference) = differs(&verdict, &action) {
            self.circuits.release_trial(instance);
            return refuse(
                McpFailure::Verdict,
                format!(
                    "refused by the mcp service: the call is not the one the classifier's verdict `{}` judged ({difference}); nothing was called",
                    verdict.request_id
                ),
            );
        }
        let assessed = proto::ActionClass::from(self.policy.assess(&action, hint).class);
        // Named by the permission, or the verdict would have been refused.
        let none = proto::ExecPermission::default();
        let permission = request.permission.as_ref().unwrap_or(&none);
        if let Err(reason) = verdict_wall.permits(&verdict, permission, assessed) {
            self.circuits.release_trial(instance);
            return refuse(McpFailure::Verdict, reason);
        }

        let board = match self.bus.switches().await {
            Ok(s) => s.board,
            Err(e) => {
                self.circuits.release_trial(instance);
                return Err(Unhandled::retry(format!("reading the kill switches: {e}")));
            }
        };
        let confirmed = request
            .permission
            .as_ref()
            .is_some_and(|p| p.operator_confirmed);
        match consult_action(
            &self.policy,
            &action,
            // The server's own hints, as it listed the tool: stricter,
            // never looser.
            hint,
            board.autonomy_off,
            board.never_reasons(),
            confirmed,
        ) {
            SwitchDecision::Allow => {}
            SwitchDecision::NeedsDiscussion(r) | SwitchDecision::Refused(r) => {
                self.circuits.release_trial(instance);
                return refuse(
                    McpFailure::KillSwitch,
                    format!("refused by the mcp service: {r}; {tool} on {instance} was not called"),
                );
            }
        }

        Ok(Gate::Proceed(Prepared {
            timeout: self.timeout(request, &server),
            server,
            arguments,
        }))
    }

    /// The signature wall, as the mcp service words it.
    fn wall(&self) -> Wall<'_> {
        Wall {
            agent: self.agent.as_str(),
            key_file: &self.brain_key,
            data_dir: &self.data_dir,
            max_age: self.config.max_request_age,
            who: "the mcp service",
            nothing_done: "nothing was called",
        }
    }

    /// The call's timeout: the request's, at most the instance's.
    fn timeout(&self, request: &McpRequest, server: &Server) -> Duration {
        let asked = Duration::from_millis(request.timeout_ms);
        if asked.is_zero() {
            server.config.call_timeout
        } else {
            asked.min(server.config.call_timeout)
        }
    }
}

/// How `call` differs from the action `verdict` judged, in words; `None`
/// when it is that action. Actions compare as the policy writes them: the
/// tool (`mcp:<instance>/<tool>`), the instance, and the arguments as
/// canonical JSON, so the same call written in another key order is the
/// same call.
fn differs(verdict: &ClassifyVerdict, call: &Action) -> Option<String> {
    let Some(judged) = verdict.action.as_ref() else {
        return Some("the verdict records no call".into());
    };
    let judged = match Action::from_wire(judged) {
        Ok(a) => a,
        Err(e) => return Some(format!("the verdict's action cannot be read: {e}")),
    };
    let mut out = Vec::new();
    if judged.tool != call.tool {
        out.push(format!(
            "tool: the verdict judged `{}`, the call is `{}`",
            judged.tool, call.tool
        ));
    }
    if judged.target != call.target {
        out.push(format!(
            "instance: the verdict judged it on {}, the call is on {}",
            judged.target, call.target
        ));
    }
    if judged.arguments != call.arguments {
        out.push(format!(
            "arguments: the verdict judged {}, the call has {}",
            shown(&judged.arguments),
            shown(&call.arguments)
        ));
    }
    (!out.is_empty()).then(|| out.join("; "))
}

/// `text` quoted for a reason, cut to its first 200 characters.
fn shown(text: &str) -> String {
    const MAX: usize = 200;
    match text.char_indices().nth(MAX) {
        Some((cut, _)) => format!("`{}…`", &text[..cut]),
        None => format!("`{text}`"),
    }
}

fn json_kind(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}
