//! The one way a brain asks for an execution.
//!
//! An `ExecRequest` is built in exactly one place, [`Txn::emit_exec`], and
//! only from a [`Permit`] — which `nisse-policy` issues only after reading
//! the kill switches, the classifier's verdict and the approved plan.
//! [`Txn::emit`] refuses execution requests, so a brain cannot go around
//! the gate with a hand-built one. The executor checks again, itself, as a
//! hard wall (host binding, switches), before it connects anywhere.

use nisse_bus::proto::{ExecPermission, ExecRequest};
use nisse_policy::{Basis, Permit};

use crate::store::{StoreError, Txn};

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
}

impl Txn<'_, '_> {
    /// Queues an execution request for the permitted action. The permit is
    /// consumed: one permit, one request.
    pub fn emit_exec(&mut self, permit: Permit, what: ExecFor<'_>) -> Result<(), StoreError> {
        let action = permit.action();
        let command = action.argument_str("command").ok_or_else(|| {
            StoreError::Corrupt(format!(
                "the `{}` action has no command to execute",
                action.tool
            ))
        })?;
        let (plan_revision, step) = match permit.basis() {
            Basis::Step { revision, step } => (revision, u32::try_from(step).unwrap_or(u32::MAX)),
            Basis::ReadOnly | Basis::OperatorConfirmed => (0, 0),
        };
        let request = ExecRequest {
            envelope: Some(self.agent_envelope(
                what.agent,
                what.work_item_id,
                format!("exec:{}", what.request_id),
            )),
            request_id: what.request_id.to_string(),
            host: action.target.clone(),
            command,
            stdin: Vec::new(),
            secret_names: Vec::new(),
            timeout_ms: DEFAULT_EXEC_TIMEOUT_MS,
            permission: Some(ExecPermission {
                verdict_request_id: what.verdict_request_id.to_string(),
                plan_revision,
                step,
            }),
        };
        self.emit_unchecked(&request)
    }
}
