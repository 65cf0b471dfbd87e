//! The mcp service: each agent's MCP server instances (seed X3: one per
//! service, site and privilege), reached over stdio (a process started
//! from a command the configuration fixes, never one a model chose, with
//! a clean environment and only its own secrets) or streamable HTTP (with
//! its own bearer token), with `rmcp`, the protocol's official Rust SDK.
//!
//! Each instance's tools, as its server lists them, go to the brain as
//! `McpTools` on `in.mcp.tools` (at every connect and whenever the server
//! says they changed; an instance that cannot be reached is announced
//! with the error and tried again with backoff). Each call on
//! `out.mcp.req` goes, in order, through:
//!
//! 1. **At most once.** The request id is the idempotency key. Its record
//!    in the `nisse_mcp` bucket says whether it was answered (the answer
//!    is published again, nothing is called) or started by a process that
//!    is gone (the outcome is unknown: answered so, never called again).
//! 2. **The walls**, checked here whatever the brain checked, each a
//!    refusal naming what is wrong: the brain's signature, a work item,
//!    an instance configured for the agent and mounted for the item (the
//!    last signed `McpMount` on `out.mcp.mount.<item>`), arguments that
//!    are a JSON object, the instance's circuit, a tool the instance
//!    lists, the classifier's verdict the call names (read from the
//!    classifier's own subject: it judged this very call, tool, instance
//!    and arguments, and permits it as the call claims, for the class the
//!    policy and the server's hints give it), and the kill switches, read
//!    now and consulted as the executor does: the call is the action `mcp:<instance>/<tool>` on
//!    its instance, classified by the policy, so a `never` switch on a
//!    target it names (`hv-site-a-elevated/101`) refuses it whatever was
//!    approved, and while autonomy is off anything but reading is called
//!    only when the operator confirmed that very call.
//! 3. **Started** is recorded, then the tool is called within its
//!    timeout, with a heartbeat on the record and progress acks on the
//!    message meanwhile; its content is redacted of every credential
//!    handed to the server and capped.
//! 4. **Done** is recorded with the answer, then `McpResult` is published
//!    on `in.mcp.result` and the request acked.

pub mod config;
mod content;
mod record;
mod run;
mod server;
mod walls;

pub use config::Config;
pub use record::circuits;
pub use run::{SERVICE, ServiceConfig, run};
pub use walls::mount;
