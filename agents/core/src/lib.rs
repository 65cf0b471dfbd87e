//! nisse-core: what every agent stands on. The work model (seed Nisse L1)
//! and its canonical log (L7) in the agent's state store (L8); the brain as
//! a deterministic reactor on its stream (design §4), rebuilt from it; and
//! the brain every agent shares, [`AgentBrain`]: the operator's commands
//! and chat read by code (L5), plans of literal steps with approvals bound
//! to revisions (O2, L3), the one way to ask for a verdict and an
//! execution, and the model-driven loop (L2) with its context rendered
//! from the log (L6). It is no particular agent: an agent brings its own
//! intake and words as [`Duties`]. Its only I/O is the store's and the
//! reactor's bus.

pub mod agent_loop;
pub mod brain;
pub mod conversation;
mod describe;
pub mod gate;
pub mod log;
pub mod markdown;
pub mod mcp;
pub mod memory;
pub mod plans;
pub mod reactor;
pub mod render;
pub mod requests;
pub mod say;
pub mod store;
pub mod text;
pub mod work;
pub mod world;

pub use brain::{AgentBrain, BrainSettings, Duties};
pub use log::{Actor, ActorKind, Event, LoggedEvent};
pub use reactor::{Brain, ReactorError};
pub use say::Say;
pub use store::{
    Applied, Batch, Checkpointer, Outgoing, Snapshot, StateChange, Store, StoreError, Timing, Txn,
    Unapplied, WalSync,
};
pub use work::{Changed, IllegalTransition, NewItem, State, Transition, WorkItem};
