//! Scheduled checks (seed L1, O5; Oikos REQ-OBS-1..5): duties that run on
//! the scheduler's due messages and turn what they find into work items.
//!
//! A due duty (`in.duty.<duty item>`, or the operator's `nisse duty run`)
//! starts a run unless one is still in flight (then it is counted as
//! skipped: a brain that was down runs each due duty once, not once per
//! missed instant). A network check goes to the prober (`out.probe.req`);
//! a host check (`ping`, `disk`, `ssh-script`) goes the one way anything
//! reaches a host: the classifier's verdict, a permit for a read-only
//! action, and the executor, on the hosts bound to the duty. The result
//! is judged by the duty's thresholds; `fail-after` failures in a row
//! raise a finding, `recover-after` passes in a row resolve it, so one
//! flapping run neither opens nor closes an item. Findings go through the
//! same fingerprint dedup as alerts (`alerts::apply_finding`). A run whose
//! request goes unanswered past its deadline ends as "no answer", which
//! counts neither way.
//!
//! The stale sweep is here too: at a tick, a firing alert Alertmanager has
//! not sent again within `ops.stale-after` is marked stale, once.

mod config;
mod run;
mod stale;

pub use config::{Check, Duty, DutyEntry, Judge, Sources, load, starter_names};
pub use run::{DutyState, InFlight, Outcome};
