//! What the Gitea and Vikunja intakes share. Both were written on one
//! pattern (an HTTP API called as the agent, webhooks signed with a hex
//! HMAC, writes found again by a hidden marker), and this is the part
//! that is the same logic in both, kept once so a fix to one (a retry
//! rule, a constant-time check) is a fix to both. What differs between
//! the two (the service's name in errors, its error body, its header
//! names, its kinds of problem) is passed in through [`http::Service`],
//! [`problem::ProblemKind`] or as parameters.

pub mod http;
pub mod marker;
pub mod problem;
pub mod receiver;
pub mod records;
pub mod signature;
