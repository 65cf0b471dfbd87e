//! The agent loop (seed Nisse L2) as part of the brain's reactor (design
//! §4): the brain never waits on a model. Something happens on an item (it
//! opens, the operator says something, a plan ends, every tool call of the
//! last turn has its result) → the item's context is rendered from its log
//! ([`crate::render`]) → a `ModelRequest` goes out → the `ModelResponse`
//! comes back through the stream → its text and tool calls enter the log →
//! each call is handled in order:
//!
//! - **control tools** in the brain: `submit_plan` (a plan revision for the
//!   gates and the operator), `ask_human` (a durable pending question),
//!   `finish` (the summary in the thread, and the item closes), `ask_expert`
//!   (one stateless question to the expert role, with a per-item budget),
//!   `note`, and `delegate` / `hand_back` (L9 delegation);
//! - **execution tools** (`shell`, `read_file`, `list_dir`) through the
//!   gates: the classifier's verdict, then a permit, then the executor. With
//!   no approved plan only read-only actions get a permit, so investigation
//!   runs at once and anything that changes a system must be a plan the
//!   operator approves.
//!
//! Request and call ids are minted from the item and the turn (`<item>:m3`,
//! `<item>:m3.t1`), so applying the same stream again produces the same ids
//! and a crash between a model's reply and its tool's result repeats
//! nothing: the reply is in the stream, the brain applies it once, and the
//! executor runs each request id at most once.
//!
//! Escalation (L9) is triggered by what can be observed — consecutive failed
//! actions, replies without a tool call, a context that does not fit, turn
//! and time caps — never by the model's self-assessment alone: the helper
//! takes over under hard caps (turns, tokens, wall-clock) and hands back a
//! note; when there is no helper, or it too fails, the item waits on the
//! operator with the reason.

mod agent_tools;
mod escalation;
mod knowledge;
mod prompt;
mod state;
mod tools;
mod turns;

pub use agent_tools::{AfterCall, AgentTool};
pub use knowledge::PINNED_NOTE_BYTES;
pub use prompt::{PLAN_FIRST, tool_definitions};
pub(crate) use state::item_loop;
pub use state::{Call, Delegation, LoopConfig, LoopSettings, LoopState, Status};
