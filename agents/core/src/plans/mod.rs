//! Approved step sequences (seed Nisse O2) and approvals bound to plan
//! revisions (L3), as the brain keeps them.
//!
//! A plan is a list of literal steps. Every revision of an item's plan gets
//! the next work-item-wide number, `rev-N`. A revision goes through:
//!
//! - `proposed`: each step's command (and its checks) is sent to the
//!   classifier; a check that is not read-only rejects the revision;
//! - `up`: every verdict is in; the approval request, rendered here by code
//!   from the steps and verdicts, has been sent;
//! - `approved` → `running`: an allowlisted operator approved exactly this
//!   revision in time; it starts when its item is active and the approval
//!   has not expired, each step as precondition → command → expected
//!   outcome, each one classified again (with the approved plan as scope
//!   and the switches as they are then) and run only through a permit;
//! - `done`, `halted` (a `never` target), `denied`, `rejected`,
//!   `superseded` (a newer revision came), `abandoned`.
//!
//! A step that cannot go on (autonomy off, the classifier asks, a check or
//! the command failed beyond its retries, an outcome that is unknown) puts
//! the same revision up again with the reason at the top: approving it
//! then is the operator naming that step, and it starts over from its
//! precondition. Nothing here reads the wall clock or the policy file:
//! time is the message's and every judgement is a verdict in the stream, so
//! a replay reaches the same state.

mod approval;
mod decision;
mod model;
mod runner;

pub use approval::{
    QUOTE_BYTES, QUOTE_LINES, REQUEST_QUOTE_BYTES, STEPS_BYTES, render_approval,
    render_approval_whole,
};
pub use model::{
    Assessed, DEFAULT_APPROVAL_EXPIRY, Decision, Origin, Phase, Plan, PlanSettings, PlanStatus,
    PlannedStep, Proposal, confirms,
};
pub(crate) use model::{assessed_from, item_plans};
pub(crate) use runner::tail;
pub use runner::verdict_event;
