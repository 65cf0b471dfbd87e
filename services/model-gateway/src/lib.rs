//! The model gateway (seed Nisse L9): the one way an agent reaches a
//! model. For each request it calls the model pinned for the work item (or
//! the role's current model) on an OpenAI-compatible endpoint — LiteLLM by
//! default, equally llama.cpp, vLLM or Ollama — retries 429s, 5xx and
//! dropped connections with capped backoff (honouring `Retry-After`), then
//! tries the model's fallbacks in order; it checks what comes back and
//! names what is wrong with it (`TIMEOUT`, `TRUNCATED`, `EMPTY`,
//! `MALFORMED`, `CONTEXT_TOO_LONG`, `UPSTREAM`); it keeps each work item's
//! calls and tokens per role in the `nisse_model_usage` bucket and refuses
//! a call over budget (`BUDGET_EXCEEDED`) before making it; and it
//! publishes every exchange on `model.capture` for evaluation.
//!
//! It runs as a service on `model.req` → `model.resp` for the brains, and
//! as a library ([`Gateway`]) inside the classifier. It deliberately does
//! not build prompts, fit them to a context window or judge what a reply
//! means: the brain does, from the model's capability profile.

mod error;
mod gateway;
mod service;
pub mod usage;
mod wire;

pub use error::{Error, Result};
pub use gateway::{Gateway, SERVICE, outcome_of};
pub use service::run;
pub use usage::ModelUsage;
pub use wire::kind_name;
