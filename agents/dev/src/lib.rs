//! nisse-dev: the dev agent's brain (seed Nisse Part D).
//!
//! Its work arrives as Gitea issues (through `intake-gitea`): an issue
//! assigned to the agent's account by an allowlisted operator is a work
//! item, acknowledged with its place in the queue and blocked while it has
//! open dependencies in Gitea ([`issues`]'s rules, D1). When an item
//! becomes active the harness prepares its workspace on the project's
//! build host (a fresh checkout on a branch of the item's own, anything
//! left from before set aside and reported, the toolchains recorded as
//! facts: D3) before the model-driven loop of nisse-core opens on it;
//! nothing starts, and nothing is published, on a project whose default
//! branch is not verified protected against the agent's own account
//! ([`protection`], D4).
//! Everything an operator says, the plans and approvals, and the loop are
//! nisse-core's shared brain; this crate adds only what is dev.

mod brain;
mod config;
mod hygiene;
mod issues;
mod merging;
mod milestones;
mod parking;
mod protection;
mod talk;
pub mod workspace;

pub use brain::{DevBrain, DevDuties};
pub use config::{Config, DEFAULT_BRIEF, Project, ProjectSecret, SecretUse, Trust, is_repository};
