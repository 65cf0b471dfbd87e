//! nisse-models: models by role (seed Nisse L9): which model plays which
//! role, what each model can do (its capability profile), and the budgets
//! per work item.
//!
//! This is `[models]` in `nisse.toml`. The brain reads it to pin an item's
//! roles and to fit each call to the pinned model's window; the model
//! gateway reads it to reach the model, retry, fall back and enforce the
//! budgets. Both read the same table, so they can never disagree on what a
//! model is.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use bytesize::ByteSize;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A role a model plays (L9).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Drives the loop: conversation, investigation, plans.
    Driver,
    /// Takes over a scoped sub-task when the driver escalates.
    Helper,
    /// Answers one stateless question (`ask_expert`).
    Expert,
    /// The action classifier's model (L4).
    Classifier,
}

impl Role {
    /// Every role.
    pub const ALL: [Role; 4] = [Self::Driver, Self::Helper, Self::Expert, Self::Classifier];

    /// Its name on the bus and in configuration.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Driver => "driver",
            Self::Helper => "helper",
            Self::Expert => "expert",
            Self::Classifier => "classifier",
        }
    }

    /// The role named `s`.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|r| r.as_str() == s)
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a model can do, as far as the loop relies on it (L9's capability
/// profile). Prompts that brief one role about another use this, never a
/// model's name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
pub struct Profile {
    /// Its context window, in tokens.
    pub context_window: u32,
    /// Tokens reserved for its answer (sent as `max_tokens`).
    pub max_output_tokens: u32,
    /// It takes tool definitions and answers with tool calls.
    pub tools: bool,
    /// Its server enforces `tool_choice` ("required" really forces a tool
    /// call). Only then is `tool_choice` sent; otherwise the loop enforces
    /// the contract itself.
    pub tool_choice: bool,
    /// What it does reliably and where it is weak, in a line or two, for
    /// prompts that brief another role about it.
    pub notes: String,
}

impl Default for Profile {
    fn default() -> Self {
        Self {
            context_window: 8192,
            max_output_tokens: 1024,
            tools: true,
            tool_choice: false,
            notes: String::new(),
        }
    }
}

/// One model the agents may use.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema, Default)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
pub struct ModelEntry {
    /// Its OpenAI-compatible base URL (ending in `/v1`); empty: the
    /// `[models]` endpoint (LiteLLM).
    pub endpoint: String,
    /// A file holding the bearer token for its endpoint; none: the
    /// `[models]` token file, if any.
    pub api_key_file: Option<PathBuf>,
    /// The model name the endpoint knows it by; empty: this entry's name.
    pub upstream: String,
    /// Models to try, in order, when this one keeps failing (429/5xx after
    /// the retries, a timeout, a refused connection).
    pub fallbacks: Vec<String>,
    /// A per-call timeout overriding the `[models]` one.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "Option<String>")]
    pub timeout: Option<Duration>,
    /// What it can do.
    #[serde(flatten)]
    pub profile: Profile,
}

/// Caps per work item and role (L9): a confused model cannot spend
/// without end.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
pub struct Budget {
    /// Model calls.
    pub calls: u32,
    /// Prompt plus completion tokens.
    pub tokens: u64,
}

impl Default for Budget {
    fn default() -> Self {
        Self {
            calls: 200,
            tokens: 2_000_000,
        }
    }
}

/// `[models]`: roles, models, budgets, and how calls are made.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
pub struct ModelsConfig {
    /// The OpenAI-compatible endpoint every model is reached through unless
    /// its entry says otherwise: LiteLLM by default (seed L9), equally a
    /// llama.cpp server, vLLM or Ollama.
    pub endpoint: String,
    /// A file holding the bearer token for `endpoint` (LiteLLM's virtual
    /// key). Read at every call, so it can be rotated in place.
    pub api_key_file: Option<PathBuf>,
    /// Role → model name (a key of `models`).
    pub roles: BTreeMap<Role, String>,
    /// The models, by name.
    pub models: BTreeMap<String, ModelEntry>,
    /// Caps per work item, by role.
    pub budgets: BTreeMap<Role, Budget>,
    /// How long one HTTP call may take.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String")]
    pub timeout: Duration,
    /// Retries of one model on 429, 5xx and connection errors before its
    /// fallbacks are tried.
    pub retries: u32,
    /// First retry delay (doubling), unless the server says `Retry-After`.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String")]
    pub retry_backoff: Duration,
    /// Longest wait between retries, `Retry-After` included.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String")]
    pub retry_backoff_max: Duration,
    /// Model calls the gateway makes at once for one agent; further
    /// requests wait their turn (their messages kept alive meanwhile).
    pub max_in_flight: usize,
    /// Largest answer body read from a model endpoint. A longer (or
    /// endless) one is not read further and the call fails `MALFORMED`
    /// (`UPSTREAM` for an error status), without a retry.
    #[schemars(with = "String")]
    pub max_response: ByteSize,
}

impl Default for ModelsConfig {
    fn default() -> Self {
        Self {
            endpoint: "http://127.0.0.1:4000/v1".into(),
            api_key_file: None,
            roles: BTreeMap::new(),
            models: BTreeMap::new(),
            budgets: BTreeMap::new(),
            timeout: Duration::from_secs(120),
            retries: 3,
            retry_backoff: Duration::from_millis(500),
            retry_backoff_max: Duration::from_secs(30),
            max_in_flight: 4,
            max_response: ByteSize::mib(4),
        }
    }
}

/// A role as pinned on a work item: the model and its profile when the
/// item opened (recorded in the item's log as `roles_pinned`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pin {
    /// The model's name in `[models.models]`.
    pub model: String,
    /// Its profile then.
    pub profile: Profile,
}

impl ModelsConfig {
    /// Whether any role is configured: with none, the agent loop stays off
    /// and the agent works from operator plans only.
    pub fn enabled(&self) -> bool {
        !self.roles.is_empty()
    }

    /// The entry for model `name`.
    pub fn model(&self, name: &str) -> Option<&ModelEntry> {
        self.models.get(name)
    }

    /// The budget for `role` on one work item.
    pub fn budget(&self, role: Role) -> Budget {
        self.budgets.get(&role).copied().unwrap_or_default()
    }

    /// Every configured role resolved to its model and profile now: what a
    /// new work item pins.
    pub fn pins(&self) -> BTreeMap<Role, Pin> {
        self.roles
            .iter()
            .filter_map(|(role, name)| {
                let entry = self.models.get(name)?;
                Some((
                    *role,
                    Pin {
                        model: name.clone(),
                        profile: entry.profile.clone(),
                    },
                ))
            })
            .collect()
    }

    /// Problems as (key under `prefix`, what is wrong); empty when valid.
    pub fn validate(&self, prefix: &str) -> Vec<(String, String)> {
        let mut out = Vec::new();
        let endpoint_ok = |e: &str| e.starts_with("http://") || e.starts_with("https://");
        if !endpoint_ok(&self.endpoint) {
            out.push((
                format!("{prefix}.endpoint"),
                format!("`{}` is not an http(s) URL", self.endpoint),
            ));
        }
        for (role, name) in &self.roles {
            if !self.models.contains_key(name) {
                out.push((
                    format!("{prefix}.roles.{role}"),
                    format!("names model `{name}`, which is not under {prefix}.models"),
                ));
            }
        }
        for (name, entry) in &self.models {
            let key = format!("{prefix}.models.{name}");
            if !entry.endpoint.is_empty() && !endpoint_ok(&entry.endpoint) {
                out.push((
                    format!("{key}.endpoint"),
                    format!("`{}` is not an http(s) URL", entry.endpoint),
                ));
            }
            for f in &entry.fallbacks {
                if f == name {
                    out.push((format!("{key}.fallbacks"), "names the model itself".into()));
                } else if !self.models.contains_key(f) {
                    out.push((
                        format!("{key}.fallbacks"),
                        format!("names model `{f}`, which is not under {prefix}.models"),
                    ));
                }
            }
            if entry.profile.context_window <= entry.profile.max_output_tokens {
                out.push((
                    format!("{key}.context-window"),
                    format!(
                        "{} tokens leave no room for a prompt beside max-output-tokens = {}",
                        entry.profile.context_window, entry.profile.max_output_tokens
                    ),
                ));
            }
        }
        if self.timeout.is_zero() {
            out.push((format!("{prefix}.timeout"), "must be more than zero".into()));
        }
        if self.max_in_flight == 0 {
            out.push((
                format!("{prefix}.max-in-flight"),
                "must be at least 1".into(),
            ));
        }
        if self.retry_backoff > self.retry_backoff_max {
            out.push((
                format!("{prefix}.retry-backoff"),
                format!(
                    "{:?} is longer than retry-backoff-max = {:?}",
                    self.retry_backoff, self.retry_backoff_max
                ),
            ));
        }
        if self.max_response.as_u64() < 1024 {
            out.push((
                format!("{prefix}.max-response"),
                "must be at least 1 KiB".into(),
            ));
        }
        for (role, b) in &self.budgets {
            if b.calls == 0 || b.tokens == 0 {
                out.push((
                    format!("{prefix}.budgets.{role}"),
                    "calls and tokens must be more than zero".into(),
                ));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(toml_text: &str) -> ModelsConfig {
        toml::from_str(toml_text).unwrap()
    }

    #[test]
    fn roles_resolve_to_their_models_profiles() {
        let c = config(
            r#"
            roles = { driver = "local", helper = "big" }
            [models.local]
            context-window = 4096
            [models.big]
            context-window = 128000
            tool-choice = true
            "#,
        );
        assert!(
            c.validate("models").is_empty(),
            "{:?}",
            c.validate("models")
        );
        let pins = c.pins();
        assert_eq!(pins[&Role::Driver].model, "local");
        assert_eq!(pins[&Role::Driver].profile.context_window, 4096);
        assert!(pins[&Role::Helper].profile.tool_choice);
        assert!(!pins.contains_key(&Role::Expert));
    }

    #[test]
    fn validation_names_the_key_and_the_problem() {
        let c = config(
            r#"
            endpoint = "litellm:4000"
            roles = { driver = "nope" }
            [models.a]
            fallbacks = ["a", "ghost"]
            context-window = 100
            max-output-tokens = 200
            "#,
        );
        let problems = c.validate("models");
        let keys: Vec<&str> = problems.iter().map(|(k, _)| k.as_str()).collect();
        assert!(keys.contains(&"models.endpoint"), "{problems:?}");
        assert!(keys.contains(&"models.roles.driver"), "{problems:?}");
        assert!(
            keys.contains(&"models.models.a.context-window"),
            "{problems:?}"
        );
        assert_eq!(
            keys.iter()
                .filter(|k| **k == "models.models.a.fallbacks")
                .count(),
            2
        );
    }

    #[test]
    fn the_response_cap_reads_as_a_size_and_is_checked() {
        assert_eq!(ModelsConfig::default().max_response, ByteSize::mib(4));
        let c = config("max-response = \"512 KiB\"");
        assert_eq!(c.max_response, ByteSize::kib(512));
        assert!(c.validate("models").is_empty());
        let c = config("max-response = \"100 B\"");
        let keys: Vec<String> = c.validate("models").into_iter().map(|(k, _)| k).collect();
        assert_eq!(keys, ["models.max-response"]);
    }
}
