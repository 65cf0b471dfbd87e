//! nisse-core: what every agent stands on.
//!
//! - [`work`]: the work model (seed Nisse L1) — work items, their states and
//!   the one guard every state change passes.
//! - [`log`]: the canonical log (L7) — append-only events, each with its
//!   work item and actor.
//! - [`store`]: the agent state store (L8) — SQLite in WAL mode, schema
//!   versioned, one transaction per group of stream messages together with
//!   the applied sequence.
//! - [`reactor`]: the brain as a deterministic reactor on its stream
//!   (design §4), and rebuilding its state from the stream.
//! - [`plans`]: approved step sequences (O2), approvals bound to plan
//!   revisions (L3) and the step machine that runs them.
//! - [`gate`]: the one way to ask for an execution, from a permit, and
//!   the hosts bound to each item.
//! - [`conversation`]: what an operator's chat message says, read by code.
//! - [`say`]: what the agent says to the operator, and [`markdown`]: the
//!   values in it made safe for Markdown.
//! - [`agent_loop`]: the model-driven loop (L2) as part of the reactor:
//!   model turns, tool calls through the gates, escalation and delegation.
//! - [`render`]: each model call's context, rendered from the log per role
//!   and fitted to the pinned model's window (L6).

pub mod agent_loop;
pub mod conversation;
pub mod gate;
pub mod log;
pub mod markdown;
pub mod plans;
pub mod reactor;
pub mod render;
pub mod say;
pub mod store;
pub mod work;

pub use log::{Actor, ActorKind, Event, LoggedEvent};
pub use reactor::{Brain, ReactorError};
pub use store::{
    Applied, Batch, Checkpointer, Outgoing, Snapshot, StateChange, Store, StoreError, Txn,
    Unapplied,
};
pub use work::{Changed, IllegalTransition, NewItem, State, Transition, WorkItem};
