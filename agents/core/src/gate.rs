//! The one way a brain asks for an execution.
//!
//! An action goes to the classifier through [`Txn::emit_classify`], the one
//! place a `ClassifyRequest` is built; its verdict becomes a permit in one
//! place too. An `ExecRequest` is built in exactly one place,
//! [`Txn::emit_exec`], and only from a [`Permit`] — which `nisse-policy`
//! issues only after reading the kill switches, the classifier's verdict
//! and the approved plan — and the same place writes its `exec_requested`
//! log event, so the log and the request cannot tell different stories.
//! [`Txn::emit`] refuses execution requests, so a brain cannot go around
//! the gate with a hand-built one. Both are signed here with the brain's
//! own key, over everything that decides what runs, and so is every host
//! binding: an item's hosts are bound by [`Txn::bind_hosts`] (a log event)
//! and its binding goes out, signed, just before each of its execution
//! requests. The executor checks again, itself, as a hard wall (the
//! signatures, the host binding, the switches), before it connects
//! anywhere.

use std::collections::BTreeSet;

use nisse_bus::proto::{
    AgreedScope, ClassifyRequest, ClassifyVerdict, ExecPermission, ExecRequest, HostBinding,
};
use nisse_models::Role;
use nisse_policy::switches::Switches;
use nisse_policy::{Action, Basis, FileOp, Halt, Permit, PermitRequest, RiskClass, Scope};

use crate::log::{Actor, Event};
use crate::store::{StoreError, Txn};
use crate::work::WorkItem;

/// An item's binding as its log last recorded it.
struct Bound {
    hosts: Vec<String>,
    reason: String,
}

/// How long a command may run unless the step says otherwise.
pub const DEFAULT_EXEC_TIMEOUT_MS: u64 = 10 * 60 * 1000;

/// What an execution request is for, beyond its permit.
#[derive(Debug, Clone)]
pub struct ExecFor<'a> {
    /// The agent asking.
    pub agent: &'a str,
    /// The work item it is for.
    pub work_item_id: &'a str,
    /// The request id: the idempotency key the executor runs at most once.
    pub request_id: &'a str,
    /// The classifier verdict the permit rests on.
    pub verdict_request_id: &'a str,
    /// The plan revision the request belongs to, as the log records it (0
    /// for the agent loop's tool calls).
    pub revision: u32,
    /// The plan step, 1-based, as the log records it (0 for a tool call).
    pub step: usize,
    /// `pre`, `run` or `post` for a plan step; `tool` for a tool call.
    pub phase: &'a str,
    /// The attempt (0 first).
    pub attempt: u32,
}

/// A permit for `action` on the strength of `verdict` (its class, risk and
/// targets, and the switches it was given under) within `scope`: the one
/// way a brain asks the policy for a permit. An unknown risk counts as
/// destructive.
pub fn permit_for(
    verdict: &ClassifyVerdict,
    action: &Action,
    scope: Scope<'_>,
) -> Result<Permit, Halt> {
    let assessed = crate::plans::assessed_from(verdict);
    let switches = Switches::from_wire(verdict.switches.as_ref());
    Permit::issue(PermitRequest {
        action,
        risk: assessed.risk.unwrap_or(RiskClass::Destructive),
        class: assessed.class,
        targets: &verdict.targets,
        verdict: nisse_policy::wire::verdict_from_wire(verdict.verdict),
        switches: &switches,
        scope,
    })
}

/// How an action reads in the log: its command line, or a file tool's
/// name and path.
fn action_line(action: &Action) -> String {
    action.argument_str("command").unwrap_or_else(|| {
        format!(
            "{} {}",
            action.tool,
            action.argument_str("path").unwrap_or_default()
        )
    })
}

impl Txn<'_, '_> {
    /// Queues a request for the classifier's verdict on `action` (with the
    /// risk its proposer declared) within `scope`, under the id
    /// `request_id`. It carries the classifier model pinned for the item,
    /// or none when the item's loop pinned none (the role's current mapping
    /// then applies).
    pub fn emit_classify(
        &mut self,
        agent: &str,
        work_item_id: &str,
        request_id: &str,
        action: &Action,
        declared: Option<RiskClass>,
        scope: Option<AgreedScope>,
    ) -> Result<(), StoreError> {
        let request = ClassifyRequest {
            envelope: Some(self.agent_envelope(
                agent,
                work_item_id,
                format!("classify:{request_id}"),
            )),
            request_id: request_id.to_string(),
            action: Some(action.to_wire(declared)),
            scope,
            model: self.pinned_model(work_item_id, Role::Classifier)?,
        };
        self.emit(&request)
    }

    /// Queues an execution request for the permitted action, and records
    /// it in the item's log from the same permit. The permit is consumed:
    /// one permit, one request. Returns the log event that records it, or
    /// `None` when the request had been sent already.
    pub fn emit_exec(
        &mut self,
        permit: Permit,
        what: ExecFor<'_>,
    ) -> Result<Option<i64>, StoreError> {
        self.emit_exec_with_timeout(permit, what, DEFAULT_EXEC_TIMEOUT_MS)
    }

    /// [`Txn::emit_exec`] for work that needs longer (or less) than the
    /// default timeout: an agent's harness operations (a first clone).
    pub fn emit_exec_with_timeout(
        &mut self,
        permit: Permit,
        what: ExecFor<'_>,
        timeout_ms: u64,
    ) -> Result<Option<i64>, StoreError> {
        if self.exec_sent(what.request_id)? {
            // A second verdict for a request already sent on: the first
            // one's execution request stands, and is not logged twice.
            return Ok(None);
        }
        let action = permit.action().clone();
        let basis = permit.basis();
        self.send_binding(what.agent, what.work_item_id, what.request_id)?;
        self.send_exec(
            &permit,
            what.agent,
            what.work_item_id,
            what.request_id,
            what.verdict_request_id,
            timeout_ms,
        )?;
        let event = self.append(
            what.work_item_id,
            &Actor::agent(what.agent),
            &Event::ExecRequested {
                request_id: what.request_id.to_string(),
                revision: what.revision,
                step: what.step,
                phase: what.phase.to_string(),
                attempt: what.attempt,
                host: action.target.clone(),
                command: action_line(&action),
                basis: format!("{basis:?}"),
            },
        )?;
        Ok(Some(event))
    }

    /// Queues the MCP call of the permitted action, signed, and records it
    /// in the item's log from the same permit, as an execution request is
    /// ([`Txn::emit_exec`]): the only way an `McpRequest` is emitted, so
    /// no call is made that the gates did not permit. Returns the log
    /// event that records it, or `None` when it had been sent already.
    pub fn emit_mcp(
        &mut self,
        permit: Permit,
        what: ExecFor<'_>,
    ) -> Result<Option<i64>, StoreError> {
        let action = permit.action().clone();
        let Some((instance, tool)) = nisse_policy::mcp::split_tool_name(&action.tool) else {
            return Err(StoreError::Corrupt(format!(
                "`{}` is not an MCP tool",
                action.tool
            )));
        };
        if self.mcp_sent(what.request_id)? {
            return Ok(None);
        }
        let basis = permit.basis();
        let (plan_revision, step) = match basis {
            Basis::Step { revision, step } => (revision, u32::try_from(step).unwrap_or(u32::MAX)),
            Basis::ReadOnly | Basis::OperatorConfirmed | Basis::ContainedInScope => (0, 0),
        };
        // As long as the instance allows, so the brain waits as long as
        // the call may take.
        let timeout_ms = match self.mcp_catalogue(instance)? {
            Some(c) if c.call_timeout_ms > 0 => c.call_timeout_ms,
            _ => crate::mcp::DEFAULT_CALL_TIMEOUT_MS,
        };
        let mut request = nisse_bus::proto::McpRequest {
            envelope: Some(self.agent_envelope(
                what.agent,
                what.work_item_id,
                format!("mcp:{}", what.request_id),
            )),
            request_id: what.request_id.to_string(),
            instance: instance.to_string(),
            tool: tool.to_string(),
            arguments_json: action.arguments.clone(),
            permission: Some(nisse_bus::proto::ExecPermission {
                verdict_request_id: what.verdict_request_id.to_string(),
                plan_revision,
                step,
                operator_confirmed: permit.operator_confirmed(),
            }),
            timeout_ms,
            signature: None,
        };
        self.signer().sign(&mut request);
        self.emit_unchecked(&request)?;
        let event = self.append(
            what.work_item_id,
            &crate::log::Actor::agent(what.agent),
            &crate::log::Event::ExecRequested {
                request_id: what.request_id.to_string(),
                revision: what.revision,
                step: what.step,
                phase: what.phase.to_string(),
                attempt: what.attempt,
                host: instance.to_string(),
                command: format!("{tool} {}", action.arguments),
                basis: format!("{basis:?}"),
            },
        )?;
        Ok(Some(event))
    }

    /// Signs and queues an item's MCP mount ([`Txn::mcp_mount`] builds
    /// it): the one way a mount is emitted, as a host binding is.
    pub(crate) fn send_mount(
        &mut self,
        mut mount: nisse_bus::proto::McpMount,
    ) -> Result<(), StoreError> {
        self.signer().sign(&mut mount);
        self.emit_unchecked(&mount)
    }

    /// Queues a duty's execution request (a read-only check on a host
    /// bound to the duty, [`Txn::bind_duty_hosts`]) from its permit. A duty
    /// has no item log: its run is recorded in the duty's state.
    pub fn emit_duty_exec(
        &mut self,
        permit: Permit,
        agent: &str,
        duty_item: &str,
        request_id: &str,
        timeout: std::time::Duration,
    ) -> Result<(), StoreError> {
        if crate::requests::duty_of(duty_item).is_none() {
            return Err(StoreError::Corrupt(format!(
                "{duty_item} is not a duty's item id"
            )));
        }
        if self.exec_sent(request_id)? {
            return Ok(());
        }
        let timeout_ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
        self.send_exec(
            &permit, agent, duty_item, request_id, request_id, timeout_ms,
        )
    }

    /// Builds, signs and queues the execution request of a permit.
    fn send_exec(
        &mut self,
        permit: &Permit,
        agent: &str,
        work_item_id: &str,
        request_id: &str,
        verdict_request_id: &str,
        timeout_ms: u64,
    ) -> Result<(), StoreError> {
        let action = permit.action();
        // A file tool's operation, or else a command line.
        let file = FileOp::from_action(action)
            .map_err(|e| StoreError::Corrupt(e.0))?
            .map(|op| op.to_wire());
        let command = match &file {
            Some(_) => String::new(),
            None => action.argument_str("command").ok_or_else(|| {
                StoreError::Corrupt(format!(
                    "the `{}` action has no command to execute",
                    action.tool
                ))
            })?,
        };
        // The permission names what permitted the action (an approved
        // step, 0-based, or nothing for a read-only, confirmed or
        // contained one); the log also says where the request stands in
        // its plan.
        let basis = permit.basis();
        let (plan_revision, step) = match basis {
            Basis::Step { revision, step } => (revision, u32::try_from(step).unwrap_or(u32::MAX)),
            Basis::ReadOnly | Basis::OperatorConfirmed | Basis::ContainedInScope => (0, 0),
        };
        let operator_confirmed = permit.operator_confirmed();
        let mut request = ExecRequest {
            envelope: Some(self.agent_envelope(agent, work_item_id, format!("exec:{request_id}"))),
            request_id: request_id.to_string(),
            host: action.target.clone(),
            command,
            stdin: Vec::new(),
            // What the approved action asked for; the executor hands out
            // only what the policy grants it and the host allows.
            secret_names: action.secrets().map_err(|e| StoreError::Corrupt(e.0))?,
            timeout_ms,
            permission: Some(ExecPermission {
                verdict_request_id: verdict_request_id.to_string(),
                plan_revision,
                step,
                operator_confirmed,
            }),
            file,
            signature: None,
        };
        self.signer().sign(&mut request);
        self.emit_unchecked(&request)
    }

    /// The hosts bound to a work item: the only ones its commands may run
    /// on.
    pub fn bound_hosts(&self, work_item_id: &str) -> Result<BTreeSet<String>, StoreError> {
        Ok(self
            .last_binding(work_item_id)?
            .map(|b| b.hosts.into_iter().collect())
            .unwrap_or_default())
    }

    /// The item's last `hosts_bound` event, decoded.
    fn last_binding(&self, work_item_id: &str) -> Result<Option<Bound>, StoreError> {
        let mut stmt = self.tx().prepare_cached(
            "SELECT payload FROM events WHERE work_item_id = ?1 AND kind = 'hosts_bound' ORDER BY id DESC LIMIT 1",
        )?;
        let mut rows = stmt.query([work_item_id])?;
        let Some(row) = rows.next()? else {
            return Ok(None);
        };
        let payload: String = row.get(0)?;
        match serde_json::from_str::<Event>(&payload) {
            Ok(Event::HostsBound { hosts, reason, .. }) => Ok(Some(Bound { hosts, reason })),
            _ => Err(StoreError::Corrupt(format!(
                "a hosts_bound event of {work_item_id} does not decode"
            ))),
        }
    }

    /// Publishes the item's host binding, signed, for the execution
    /// request `request_id` about to follow it. The executor reads the last
    /// binding on the item's subject when the request arrives, so sending
    /// it here, in the same batch and before the request, means the one it
    /// reads is the item's binding as the brain holds it now, however long
    /// ago the hosts were bound (an older one may have aged out of the
    /// stream). Items that never run a command cost no binding at all.
    /// An item with nothing bound sends none, and the executor refuses.
    fn send_binding(
        &mut self,
        agent: &str,
        work_item_id: &str,
        request_id: &str,
    ) -> Result<(), StoreError> {
        let Some(Bound { hosts, reason }) = self.last_binding(work_item_id)? else {
            return Ok(());
        };
        self.emit_binding(agent, work_item_id, request_id, hosts, reason)
    }

    /// Builds, signs and queues a host binding: the one place one is
    /// made, an item's or a duty's. `id` makes its message id unique
    /// (`bind:<work item id>:<id>`).
    fn emit_binding(
        &mut self,
        agent: &str,
        work_item_id: &str,
        id: &str,
        hosts: Vec<String>,
        reason: String,
    ) -> Result<(), StoreError> {
        let mut binding = HostBinding {
            envelope: Some(self.agent_envelope(
                agent,
                work_item_id,
                format!("bind:{work_item_id}:{id}"),
            )),
            work_item_id: work_item_id.to_string(),
            hosts,
            reason,
            signature: None,
        };
        self.signer().sign(&mut binding);
        self.emit_unchecked(&binding)
    }

    /// Binds `hosts` to a duty's item id (`duty-<name>`): the executor runs
    /// the duty's checks on them and nowhere else. Signed like an item's
    /// binding; the duty's state remembers what it bound.
    pub fn bind_duty_hosts(
        &mut self,
        agent: &str,
        duty_item: &str,
        hosts: Vec<String>,
        binding_id: &str,
    ) -> Result<(), StoreError> {
        self.emit_binding(
            agent,
            duty_item,
            binding_id,
            hosts,
            "the hosts the duty's checks run on, from its configuration".into(),
        )
    }

    /// Binds `hosts` to `item` (seed L13: the harness binds hosts, never
    /// the model), recording a `hosts_bound` event with the whole new set;
    /// the executor, which refuses any host outside it, is sent that set
    /// with each of the item's execution requests. Hosts already bound are
    /// not bound again; returns those newly bound.
    pub fn bind_hosts(
        &mut self,
        item: &WorkItem,
        by: &Actor,
        hosts: impl IntoIterator<Item = String>,
        reason: &str,
    ) -> Result<Vec<String>, StoreError> {
        let mut all = self.bound_hosts(&item.id)?;
        let added: Vec<String> = hosts
            .into_iter()
            .filter(|h| !h.is_empty())
            .filter(|h| all.insert(h.clone()))
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        if added.is_empty() {
            return Ok(added);
        }
        self.append(
            &item.id,
            by,
            &Event::HostsBound {
                added: added.clone(),
                hosts: all.into_iter().collect(),
                reason: reason.to_string(),
            },
        )?;
        Ok(added)
    }
}
