//! The executor service: `exec.req` → `exec.result`, over SSH (seed L13:
//! `execute(host, command, …)` is the only way anything runs).
//!
//! For every request, in order:
//!
//! 1. **At most once.** The request id is the idempotency key. Its record
//!    in the `nisse_exec` bucket says whether it finished (the stored
//!    result is published again, nothing runs) or was started by an
//!    executor that is gone (the outcome is unknown: reported so, never
//!    run again blindly, L8).
//! 2. **Hard walls, checked here again** whatever the brain checked: the
//!    brain's signature; the classifier's verdict the request names, read
//!    from the classifier's own subject, must have judged this very
//!    command or file operation on this host, and permit it as the
//!    request claims (`nisse_bus::verdicts`); the host must be one bound
//!    to the request's work item (read from the stream, not from the
//!    request), the kill switches (read fresh, through
//!    `nisse_policy::consult`) must allow the command, the secrets asked
//!    for must be granted for that host, and the host's circuit must be
//!    closed. A refusal is made before any connection.
//! 3. **Started** is recorded durably, then the command runs on a pooled
//!    connection with the granted secrets in its environment or on its
//!    standard input, under `bash --noprofile --norc` whatever the host
//!    user's login shell ([`bash`]: the shell the classifier parsed it
//!    as); output is redacted and capped, and published as progress while
//!    it runs; the record's heartbeat and the message's progress acks go
//!    on meanwhile.
//! 4. **Finished** is recorded with the result, then the result is
//!    published and the request acked.

pub mod bash;
mod circuits;
pub mod config;
pub mod identity;
pub mod output;
mod record;
mod run;
pub mod ssh;
mod walls;

pub use circuits::NO_BASH;
/// The circuit breaker and the redaction of handed-out secrets, shared
/// with the mcp service (they live in the bus crate, which both use).
pub use nisse_bus::{breaker, redact};
pub use record::{CircuitState, circuits, put_circuit};
pub use run::{Config, SERVICE, run};
pub use walls::host_binding;
