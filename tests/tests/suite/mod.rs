//! Integration tests against real servers, one module per area.

mod brain;
mod bus;
mod gates;
mod mcp;
mod model;
mod sshd;
mod synapse;
mod trace;
