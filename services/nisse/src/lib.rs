//! The `nisse` binary's library: configuration, hosting services in one
//! process (`nisse up` with an embedded NATS server, or `nisse serve` for
//! chosen services), and the operator commands that inspect a running
//! installation. Services themselves live in their own crates; this crate
//! only knows their entry points (see [`services`]).

mod control;
mod deploy;
mod dev;
mod duties;
mod eval;
mod health;
mod inspect;
mod items;
mod mcp_list;
mod mcp_serve;
mod operator;
mod remote;
mod shown;
mod up;
mod world;

pub mod cli;
pub mod config;
pub mod endpoints;
pub mod services;
pub mod telemetry;
