//! Integration tests against real servers, one module per area.

mod bus;
mod trace;
