//! nisse-policy: what an action is, how dangerous it is, and whether it may
//! run. Pure code, no I/O: callers read files and switch states and pass
//! them in, so every decision here is a function of its inputs and can be
//! replayed.
//!
//! - [`class`]: action classes 1/2/3 (Nisse P3) and risk classes (Oikos
//!   REQ-DEC-1), and the mapping between them.
//! - [`shell`]: the shell command classifier, on a real bash parser, with
//!   the option allowlists of read-only rules (`options`) and readers of
//!   sed and awk scripts (`langs`).
//! - [`Policy`]: the policy file (rule tables and the ops policy, O2),
//!   layered over the built-in defaults, and [`Policy::assess`]; its
//!   `[[secret]]` grants and [`Policy::secret_grant`], which says whether
//!   an action may be handed a secret (L12).
//! - [`dev`]: the dev agent's action classes on a project's build host
//!   (D6): [`BuildHost`] and [`Policy::with_build_hosts`].
//! - [`switches`]: the kill switches and [`switches::consult`], their one
//!   reader.
//! - [`plan`]: approved step sequences and step matching.
//! - [`approval`]: approval binding to plan revisions (L3).
//! - [`gate`]: the fast path and the [`Permit`], the one value an execution
//!   request can be built from.

pub mod approval;
pub mod class;
pub mod dev;
pub mod files;
pub mod gate;
mod langs;
pub mod mcp;
mod nesting;
pub mod ops;
mod options;
pub mod plan;
mod policy;
mod rules;
mod secrets;
pub mod shell;
#[cfg(test)]
mod shell_tests;
pub mod switches;
pub mod wire;

pub use class::{ActionClass, RiskClass};
pub use dev::BuildHost;
pub use files::{FILE_TOOLS, FileOp};
pub use gate::{Basis, FastVerdict, Halt, Permit, PermitRequest, Scope, Verdict, fast_path};
pub use ops::{Action, ActionError, Assessment, NeverMatch, Privilege, canonical_json};
pub use plan::{Check, Step, StepMatch, match_call};
pub use policy::{POLICY_VERSION, Policy, PolicyError};
pub use secrets::SecretRefusal;
pub use shell::{FindingKind, ShellReport, SimpleFinding};
pub use switches::{Autonomy, Never, SwitchDecision, Switches, consult};
