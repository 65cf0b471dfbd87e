//! `nisse.toml` and the `NISSE_*` environment, layered and validated.
//!
//! Order: built-in defaults, then the file (`--config`, else `nisse.toml` in
//! the working directory if present), then the environment: `NISSE_` plus the
//! key path with `__` between tables and `_` for `-`, e.g.
//! `NISSE_BUS__STREAMS__MAX_AGE=30d`. `NISSE_NATS_URL` is a short alias of
//! `NISSE_BUS__URL`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context as _;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use nisse_bus::{AgentName, BusConfig};

/// Environment variables that configure something other than the file's
/// keys, so the environment source must not read them as keys.
const NOT_KEYS: &[&str] = &[
    "NISSE_NATS_URL",
    "NISSE_LOG",
    "NISSE_BLESS_PROTO",
    // `nisse --control`'s: where the control plane is, and the token.
    "NISSE_CONTROL_URL",
    "NISSE_CONTROL_TOKEN",
    "NISSE_CONTROL_TOKEN_FILE",
    "NISSE_CONTROL_CA",
];

/// The whole configuration of a `nisse` process.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
pub struct Config {
    /// Where Nisse keeps everything of its own: the embedded NATS server's
    /// store, agent state, the vault, `endpoints.json`.
    pub data_dir: PathBuf,
    /// The agents this installation runs; each gets a stream
    /// `AGENT_<NAME>` and the services' consumers on it.
    pub agents: Vec<String>,
    /// NATS and the shape of the streams and consumers.
    pub bus: BusConfig,
    /// The NATS server `nisse up` starts when `bus.url` is not set.
    pub embedded: EmbeddedConfig,
    /// How long services get to finish in-flight messages at shutdown.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String")]
    pub shutdown_grace: Duration,
    /// The ops agent's brain.
    pub ops: nisse_ops::Config,
    /// The dev agent's brain: its Gitea account, operators and projects
    /// (each a repository and its build host).
    pub dev: nisse_dev::Config,
    /// The Alertmanager webhook receiver.
    pub intake_alerts: nisse_intake_alerts::Config,
    /// The Gitea intake: one Gitea instance for one agent (normally
    /// `dev`), its webhooks, its poll and the agent's API calls.
    pub gitea: nisse_intake_gitea::Config,
    /// The Vikunja intake: one Vikunja instance for one agent (normally
    /// `ops`), its projects' webhooks, its poll and the agent's API calls.
    pub vikunja: nisse_intake_vikunja::Config,
    /// The policy: shell rule tables and the ops policy (tools, protected
    /// and `never` targets), over the built-in defaults.
    pub policy: PolicyConfig,
    /// The executor: SSH settings, and per agent its key, pinned host keys,
    /// hosts and secrets.
    pub executor: nisse_executor::config::Config,
    /// The mcp service: each agent's MCP server instances
    /// (`[[mcp.instance]]`, one per service, site and privilege), reached
    /// over stdio or streamable HTTP, and what they share.
    pub mcp: nisse_mcp::Config,
    /// The Matrix service: the homeserver, and per agent its identity and
    /// room.
    pub matrix: nisse_intake_matrix::config::Config,
    /// Models by role: the OpenAI-compatible endpoint (LiteLLM by
    /// default), which model plays which role, each model's capability
    /// profile and fallbacks, budgets per work item, retries.
    pub models: nisse_models::ModelsConfig,
    /// The scheduler: how often each agent's clock ticks.
    pub scheduler: SchedulerConfig,
    /// The prober: duties' network checks.
    pub prober: nisse_scheduler::prober::Config,
    /// The knowledge vault: where it is, git history, what each agent
    /// may read.
    pub vault: nisse_vault_writer::Config,
    /// The control plane: the gRPC API and the web control room, for the
    /// operators an allowlist names as `control:<name>`.
    pub control: nisse_control::Config,
    /// Where the views read agents' state stores when not from the
    /// brains' own (the control service reads its read models); never
    /// configured.
    #[serde(skip)]
    #[schemars(skip)]
    stores_dir: Option<PathBuf>,
}

/// The scheduler's settings (`[scheduler]`). The duties it makes due are
/// the agents' (`[[ops.duty]]`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
pub struct SchedulerConfig {
    /// How often each agent's clock ticks: how promptly a request's
    /// deadline, an approval's expiry and a waiting item's grace period
    /// are noticed.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String")]
    pub tick: Duration,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        Self {
            tick: Duration::from_secs(10),
        }
    }
}

/// Where the policy comes from.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
pub struct PolicyConfig {
    /// A policy file (TOML, `version = 1`) layered over the built-in
    /// defaults. Unset: the defaults alone.
    pub file: Option<PathBuf>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            data_dir: PathBuf::from("nisse-data"),
            agents: vec!["ops".into()],
            bus: BusConfig::default(),
            embedded: EmbeddedConfig::default(),
            shutdown_grace: Duration::from_secs(4),
            ops: nisse_ops::Config::default(),
            dev: nisse_dev::Config::default(),
            intake_alerts: nisse_intake_alerts::Config::default(),
            gitea: nisse_intake_gitea::Config::default(),
            vikunja: nisse_intake_vikunja::Config::default(),
            policy: PolicyConfig::default(),
            executor: nisse_executor::config::Config::default(),
            mcp: nisse_mcp::Config::default(),
            matrix: nisse_intake_matrix::config::Config::default(),
            models: nisse_models::ModelsConfig::default(),
            scheduler: SchedulerConfig::default(),
            prober: nisse_scheduler::prober::Config::default(),
            vault: nisse_vault_writer::Config::default(),
            control: nisse_control::Config::default(),
            stores_dir: None,
        }
    }
}

/// The embedded NATS server.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
pub struct EmbeddedConfig {
    /// The `nats-server` executable, by path or name on `PATH`.
    pub program: PathBuf,
    /// Address to listen on. Every connection needs the credentials
    /// `nisse up` generates, but keep it on loopback unless the services
    /// run elsewhere: there is no TLS on the embedded server.
    pub host: String,
    /// Preferred client port; a free one is used when it is taken.
    pub port: u16,
    /// How long to wait for the server to be ready.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String")]
    pub ready_timeout: Duration,
    /// How often JetStream fsyncs what it stored: `always` (after every
    /// message, so nothing it acknowledged is lost on a power failure;
    /// needs nats-server 2.10 or later, an older one keeps its own
    /// two-minute interval and says so), a duration such as `1s`, or
    /// `default` (the server's own).
    pub sync_interval: String,
}

impl Default for EmbeddedConfig {
    fn default() -> Self {
        Self {
            program: PathBuf::from("nats-server"),
            host: "127.0.0.1".into(),
            port: 4222,
            ready_timeout: Duration::from_secs(20),
            sync_interval: "always".into(),
        }
    }
}

/// A configuration that failed validation: every problem, each naming its key.
#[derive(Debug)]
pub struct Invalid(pub Vec<(String, String)>);

impl std::fmt::Display for Invalid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "invalid configuration:")?;
        for (key, problem) in &self.0 {
            writeln!(f, "  {key}: {problem}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Invalid {}

impl Config {
    /// Loads defaults, then `file` (required when given explicitly, else
    /// `nisse.toml` if it exists), then the environment, and validates.
    pub fn load(file: Option<&Path>) -> anyhow::Result<Self> {
        Self::load_from(file, std::env::vars().collect())
    }

    /// [`Config::load`] with an explicit environment, for tests.
    pub fn load_from(file: Option<&Path>, env: HashMap<String, String>) -> anyhow::Result<Self> {
        let mut builder = config::Config::builder();
        match file {
            Some(path) => {
                if !path.is_file() {
                    anyhow::bail!("config file `{}` does not exist", path.display());
                }
                builder =
                    builder.add_source(config::File::from(path).format(config::FileFormat::Toml));
            }
            None => {
                builder = builder.add_source(
                    config::File::new("nisse.toml", config::FileFormat::Toml).required(false),
                );
            }
        }
        let keys: config::Map<String, String> = env
            .iter()
            .filter(|(k, _)| k.starts_with("NISSE_") && !NOT_KEYS.contains(&k.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        builder = builder.add_source(
            config::Environment::with_prefix("NISSE")
                .prefix_separator("_")
                .separator("__")
                .convert_case(config::Case::Kebab)
                .list_separator(",")
                .with_list_parse_key("agents")
                .with_list_parse_key("ops.fingerprint-labels")
                .with_list_parse_key("ops.scope-labels")
                .with_list_parse_key("ops.severities")
                .with_list_parse_key("ops.operators")
                .with_list_parse_key("dev.operators")
                .try_parsing(true)
                .source(Some(keys)),
        );
        if let Some(url) = env.get("NISSE_NATS_URL").filter(|u| !u.is_empty()) {
            builder = builder.set_override("bus.url", url.as_str())?;
        }
        let mut cfg: Config = builder
            .build()
            .context("reading the configuration")?
            .try_deserialize()
            .map_err(|e| anyhow::anyhow!("invalid configuration: {e}"))?;
        // The local operator: whoever runs `nisse` on this machine can
        // read its data directory anyway.
        let local = format!("cli:{}", crate::operator::local_user());
        for operators in [&mut cfg.ops.operators, &mut cfg.dev.operators] {
            if operators.is_empty() {
                operators.push(local.clone());
            }
        }
        // The operator may address an agent by its Matrix id or localpart.
        for (agent, names) in [("ops", &mut cfg.ops.names), ("dev", &mut cfg.dev.names)] {
            let Some(m) = cfg.matrix.agents.get(agent) else {
                continue;
            };
            let localpart = m
                .user_id
                .trim_start_matches('@')
                .split(':')
                .next()
                .unwrap_or_default()
                .to_string();
            for name in [m.user_id.clone(), localpart] {
                if !name.is_empty() && !names.contains(&name) {
                    names.push(name);
                }
            }
        }
        cfg.validate()?;
        Ok(cfg)
    }

    /// Checks what types cannot: names, ranges, files, combinations.
    pub fn validate(&self) -> Result<(), Invalid> {
        let mut problems = Vec::new();
        if self.agents.is_empty() {
            problems.push((
                "agents".to_string(),
                "at least one agent is needed".to_string(),
            ));
        }
        let mut seen = Vec::new();
        for (i, a) in self.agents.iter().enumerate() {
            if let Err(e) = a.parse::<AgentName>() {
                problems.push((format!("agents[{i}]"), e.to_string()));
            }
            if seen.contains(a) {
                problems.push((format!("agents[{i}]"), format!("`{a}` is listed twice")));
            }
            seen.push(a.clone());
        }
        if self.data_dir.as_os_str().is_empty() {
            problems.push(("data-dir".into(), "must not be empty".into()));
        }
        if self.shutdown_grace.is_zero() {
            problems.push(("shutdown-grace".into(), "must be longer than zero".into()));
        }
        if let Err(e) = self
            .embedded
            .sync_interval
            .parse::<nisse_bus::embedded::SyncInterval>()
        {
            problems.push(("embedded.sync-interval".into(), e.to_string()));
        }
        if self.embedded.ready_timeout.is_zero() {
            problems.push((
                "embedded.ready-timeout".into(),
                "must be longer than zero".into(),
            ));
        }
        problems.extend(self.bus.validate("bus"));
        problems.extend(self.ops.validate("ops"));
        problems.extend(self.dev.validate("dev"));
        if !self.dev.projects.is_empty() && !self.agents.iter().any(|a| a == "dev") {
            problems.push((
                "dev.projects".into(),
                "projects are configured but `dev` is not one of the agents: add it to `agents`"
                    .into(),
            ));
        }
        problems.extend(self.intake_alerts.validate("intake-alerts"));
        problems.extend(self.control.validate("control"));
        problems.extend(self.gitea.validate("gitea"));
        if self.gitea.enabled() && !self.agents.contains(&self.gitea.agent) {
            problems.push((
                "gitea.agent".into(),
                format!(
                    "`{}` is not one of the configured agents ({})",
                    self.gitea.agent,
                    self.agents.join(", ")
                ),
            ));
        }
        problems.extend(self.vikunja.validate("vikunja"));
        if self.vikunja.enabled() && !self.agents.contains(&self.vikunja.agent) {
            problems.push((
                "vikunja.agent".into(),
                format!(
                    "`{}` is not one of the configured agents ({})",
                    self.vikunja.agent,
                    self.agents.join(", ")
                ),
            ));
        }
        // A finding's ticket goes to a project intake-vikunja serves for
        // ops; any other would be refused at every new item.
        if let Some(project) = self.ops.ticket_project
            && !(self.vikunja.enabled()
                && self.vikunja.agent == "ops"
                && self.vikunja.served(project))
        {
            problems.push((
                "ops.ticket-project".into(),
                format!(
                    "project {project} is not served for ops by intake-vikunja: set [vikunja] with agent = \"ops\" and {project} in vikunja.projects"
                ),
            ));
        }
        for (name, project) in &self.dev.projects {
            // The build host is an executor host of the dev agent's, and
            // the push key reaches the harness's git lines there on
            // standard input (D4): without it the first fetch would fail.
            let at = format!("dev.projects.{name}");
            let executor = self.executor.agents.get("dev");
            match executor.and_then(|a| a.hosts.get(&project.build_host)) {
                None => problems.push((
                    format!("{at}.build-host"),
                    format!(
                        "`{}` is not a host under executor.agents.dev.hosts",
                        project.build_host
                    ),
                )),
                Some(host) => {
                    // Each project secret is granted on its build host
                    // under its namespaced name.
                    for (i, s) in project.secrets.iter().enumerate() {
                        let full = s.executor_name(name);
                        if !host.secrets.iter().any(|g| g.name == full) {
                            problems.push((
                                format!("{at}.secrets[{i}]"),
                                format!(
                                    "executor.agents.dev.hosts.{}.secrets must grant `{full}` (the project's secret `{}`, named `<project>.<name>` at the executor)",
                                    project.build_host, s.name
                                ),
                            ));
                        }
                    }
                    let stdin = host
                        .secrets
                        .iter()
                        .any(|g| g.name == project.push_secret && g.stdin);
                    if !stdin {
                        problems.push((
                            format!("{at}.push-secret"),
                            format!(
                                "executor.agents.dev.hosts.{}.secrets must hand `{}` over standard input (`{{ name = \"{}\", stdin = true }}`): the harness's git lines read the push key there",
                                project.build_host, project.push_secret, project.push_secret
                            ),
                        ));
                    }
                }
            }
            if self.gitea.enabled() && self.gitea.served(&project.repository).is_none() {
                problems.push((
                    format!("dev.projects.{name}.repository"),
                    format!(
                        "`{}` is not in gitea.repositories: its webhooks would be refused and its calls too",
                        project.repository
                    ),
                ));
            }
        }
        problems.extend(self.executor.validate("executor"));
        problems.extend(self.mcp.validate("mcp"));
        for (i, instance) in self.mcp.instances.iter().enumerate() {
            if !self.agents.contains(&instance.agent) {
                problems.push((
                    format!("mcp.instance[{i}].agent"),
                    format!(
                        "`{}` is not one of the configured agents ({})",
                        instance.agent,
                        self.agents.join(", ")
                    ),
                ));
            }
        }
        problems.extend(self.matrix.validate("matrix"));
        problems.extend(self.models.validate("models"));
        let per_agent = self
            .executor
            .agents
            .keys()
            .map(|a| ("executor", a))
            .chain(self.matrix.agents.keys().map(|a| ("matrix", a)));
        for (section, agent) in per_agent {
            if !self.agents.contains(agent) {
                problems.push((
                    format!("{section}.agents.{agent}"),
                    format!(
                        "`{agent}` is not one of the configured agents ({})",
                        self.agents.join(", ")
                    ),
                ));
            }
        }
        let cli = format!("{}:", crate::operator::CHANNEL);
        for (section, operators) in [("ops", &self.ops.operators), ("dev", &self.dev.operators)] {
            for (i, op) in operators.iter().enumerate() {
                if let Some(user) = op.strip_prefix(&cli)
                    && let Err(e) = user.parse::<nisse_bus::auth::OperatorName>()
                {
                    problems.push((format!("{section}.operators[{i}]"), e.to_string()));
                }
            }
        }
        match self.load_policy() {
            Err(e) => problems.push(("policy.file".into(), format!("{e:#}"))),
            Ok(policy) => {
                if let Err(duties) = self.duties_with(&policy) {
                    problems.extend(duties.into_iter().map(|d| ("ops.duty".to_string(), d)));
                }
            }
        }
        problems.extend(self.prober.validate("prober"));
        problems.extend(self.vault.validate("vault"));
        if self.scheduler.tick < Duration::from_millis(100) {
            problems.push(("scheduler.tick".into(), "must be at least 100ms".into()));
        }
        if !self.agents.contains(&self.intake_alerts.agent) {
            problems.push((
                "intake-alerts.agent".into(),
                format!(
                    "`{}` is not one of the configured agents ({})",
                    self.intake_alerts.agent,
                    self.agents.join(", ")
                ),
            ));
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(Invalid(problems))
        }
    }

    /// The policy in force: the built-in defaults, with `policy.file` over
    /// them when set, and the dev projects' build hosts (D6: class 2 is
    /// contained there). Errors name the file and line.
    pub fn load_policy(&self) -> anyhow::Result<nisse_policy::Policy> {
        let policy = match &self.policy.file {
            None => nisse_policy::Policy::builtin()?,
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("reading policy file {}", path.display()))?;
                nisse_policy::Policy::with_file(&path.display().to_string(), &text)?
            }
        };
        let build_hosts = self
            .dev
            .projects
            .values()
            .map(nisse_dev::Project::build_host)
            .collect();
        policy
            .with_build_hosts(build_hosts)
            .context("the dev projects' build hosts (dev.projects)")
    }

    /// The dev agent's brain as configured: the live brain and a rebuild
    /// are the same brain.
    pub fn dev_brain(&self, agent: &str) -> nisse_dev::DevBrain {
        nisse_dev::DevBrain::new(agent, self.dev.clone())
            .with_models(self.models.clone())
            .with_mcp(self.mcp_instances(agent))
    }

    /// `agent`'s MCP server instances as its brain knows them: their
    /// names and whether each holds write credentials (mounted only under
    /// an approved plan), from `[mcp]`. [`Config::check_mcp_policy`] says
    /// whether the policy agrees.
    pub fn mcp_instances(&self, agent: &str) -> Vec<nisse_core::mcp::McpInstance> {
        self.mcp
            .instances_of(agent)
            .map(|i| nisse_core::mcp::McpInstance {
                name: i.name.clone(),
                elevated: i.privilege == nisse_mcp::config::Privilege::Elevated,
                scopes: i.scopes.clone(),
            })
            .collect()
    }

    /// Whether the policy classifies the MCP instances as `[mcp]` configures
    /// them: an instance configured read-only that the policy declares
    /// elevated (or the reverse) is refused, naming both, since the mount
    /// would follow one and the classifier the other. An instance the
    /// policy does not declare is allowed: its tools are elevated and
    /// protected until it does.
    pub fn check_mcp_policy(&self, policy: &nisse_policy::Policy) -> anyhow::Result<()> {
        use nisse_policy::Privilege;
        let mut problems = Vec::new();
        for i in &self.mcp.instances {
            let configured = match i.privilege {
                nisse_mcp::config::Privilege::Elevated => Privilege::Elevated,
                nisse_mcp::config::Privilege::ReadOnly => Privilege::ReadOnly,
            };
            match policy.mcp_instance(&i.name) {
                Some(declared) if declared != configured => problems.push(format!(
                    "mcp instance `{}` is configured {} but the policy declares it {} ([mcp.{}] privilege)",
                    i.name,
                    name_of(configured),
                    name_of(declared),
                    i.name
                )),
                Some(_) => {}
                None => tracing::warn!(
                    instance = %i.name,
                    "the policy does not declare this MCP instance: its tools are elevated and protected until it does ([mcp.{}] in the policy file)",
                    i.name
                ),
            }
        }
        fn name_of(p: Privilege) -> &'static str {
            match p {
                Privilege::ReadOnly => "read-only",
                Privilege::Elevated => "elevated",
                Privilege::Shell => "shell",
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            anyhow::bail!("{}", problems.join("; "))
        }
    }

    /// The ops agent's brain as configured (its settings, `[models]`, its
    /// duties): the live brain and a rebuild are the same brain.
    pub fn ops_brain(&self, agent: &str) -> anyhow::Result<nisse_ops::OpsBrain> {
        self.check_mcp_policy(&self.load_policy()?)?;
        Ok(nisse_ops::OpsBrain::new(agent, self.ops.clone())
            .with_models(self.models.clone())
            .with_duties(self.load_duties()?)
            .with_mcp(self.mcp_instances(agent)))
    }

    /// The ops agent's scheduled checks, loaded and checked: `[[ops.duty]]`,
    /// the files in `ops.duties-dir`, and the starter duties for each host
    /// the executor knows.
    pub fn load_duties(&self) -> anyhow::Result<Vec<nisse_ops::checks::Duty>> {
        let policy = self.load_policy()?;
        self.duties_with(&policy)
            .map_err(|problems| anyhow::anyhow!("ops.duty: {}", problems.join("; ")))
    }

    fn duties_with(
        &self,
        policy: &nisse_policy::Policy,
    ) -> Result<Vec<nisse_ops::checks::Duty>, Vec<String>> {
        let hosts: Vec<String> = self
            .executor
            .agents
            .get("ops")
            .map(|a| a.hosts.keys().cloned().collect())
            .unwrap_or_default();
        nisse_ops::checks::load(
            nisse_ops::checks::Sources {
                entries: &self.ops.duty,
                prefix: "ops.duty",
                dir: self.ops.duties_dir.as_deref(),
                hosts: &hosts,
                starters: self.ops.starter_duties,
                tool_hosts: &self.ops.tool_hosts,
            },
            policy,
        )
    }

    /// Where the views read `agent`'s state store: its brain's, under the
    /// data directory, unless [`Config::with_stores_in`] says elsewhere.
    pub fn store_path(&self, agent: &str) -> PathBuf {
        nisse_core::Store::path_in(self.stores_dir.as_ref().unwrap_or(&self.data_dir), agent)
    }

    /// The same configuration with its views reading the agents' state
    /// stores under `dir` (laid out as under a data directory) instead of
    /// the brains' own: the control service's read models.
    pub fn with_stores_in(&self, dir: &Path) -> Self {
        Self {
            stores_dir: Some(dir.to_path_buf()),
            ..self.clone()
        }
    }

    /// The operators on `agent`'s allowlist (`<channel>:<identity>`); an
    /// agent without a brain in this build has none.
    pub fn operators_of(&self, agent: &str) -> &[String] {
        match agent {
            "ops" => &self.ops.operators,
            "dev" => &self.dev.operators,
            _ => &[],
        }
    }

    /// What the bus's NATS permissions are derived from: the agents, and
    /// each CLI operator (`cli:<user>` on an allowlist) with the agents
    /// they operate. Each gets credentials of their own.
    pub fn auth_plan(&self) -> anyhow::Result<nisse_bus::auth::AuthPlan> {
        let agents = self.agent_names()?;
        let mut plan = nisse_bus::auth::AuthPlan {
            agents: agents.clone(),
            ..Default::default()
        };
        for agent in &agents {
            for op in self.operators_of(agent.as_str()) {
                let Some((channel, name)) = op.split_once(':') else {
                    continue;
                };
                let by = match channel {
                    crate::operator::CHANNEL => &mut plan.operators,
                    nisse_control::CHANNEL => &mut plan.control,
                    _ => continue,
                };
                by.entry(name.parse()?).or_default().insert(agent.clone());
            }
        }
        Ok(plan)
    }

    /// The configured agents, parsed (validation already checked them).
    pub fn agent_names(&self) -> anyhow::Result<Vec<AgentName>> {
        self.agents
            .iter()
            .map(|a| a.parse().map_err(anyhow::Error::from))
            .collect()
    }

    /// The configuration as TOML with secrets masked and every key
    /// preceded by its documentation (the doc comments of these structs),
    /// for `nisse config check`. Keys that are not set appear commented out,
    /// so the output is also a documented starting `nisse.toml`.
    pub fn to_annotated_toml(&self) -> anyhow::Result<String> {
        let mut shown = self.clone();
        for secret in [&mut shown.bus.password, &mut shown.bus.token] {
            if secret.is_some() {
                *secret = Some(nisse_bus::secret::SecretString::masked());
            }
        }
        shown.intake_alerts = shown.intake_alerts.redacted();
        let values = toml::Table::try_from(&shown)?;
        let schema = serde_json::to_value(schemars::schema_for!(Config))?;
        let mut out = String::new();
        annotate(&mut out, &values, &schema, &schema["$defs"], "");
        Ok(out)
    }
}

/// Writes `table` as TOML, each key under its schema description.
fn annotate(
    out: &mut String,
    table: &toml::Table,
    schema: &serde_json::Value,
    defs: &serde_json::Value,
    path: &str,
) {
    let Some(props) = schema["properties"].as_object() else {
        return;
    };
    let mut tables = Vec::new();
    for (key, prop) in props {
        let target = resolve(prop, defs);
        if target["properties"].is_object() {
            tables.push((key, prop, target));
            continue;
        }
        comment(out, prop);
        match table.get(key) {
            Some(v) => out.push_str(&format!("{key} = {v}\n")),
            None => out.push_str(&format!("# {key} = (not set)\n")),
        }
    }
    for (key, prop, target) in tables {
        let path = if path.is_empty() {
            key.clone()
        } else {
            format!("{path}.{key}")
        };
        out.push('\n');
        comment(out, prop);
        out.push_str(&format!("[{path}]\n"));
        let empty = toml::Table::new();
        let sub = table
            .get(key)
            .and_then(toml::Value::as_table)
            .unwrap_or(&empty);
        annotate(out, sub, target, defs, &path);
    }
}

/// The schema a `$ref` points at, or the property itself.
fn resolve<'a>(prop: &'a serde_json::Value, defs: &'a serde_json::Value) -> &'a serde_json::Value {
    prop["$ref"]
        .as_str()
        .and_then(|r| r.strip_prefix("#/$defs/"))
        .map_or(prop, |name| &defs[name])
}

fn comment(out: &mut String, prop: &serde_json::Value) {
    if let Some(text) = prop["description"].as_str() {
        for line in text.lines() {
            out.push_str(&format!("# {line}\n"));
        }
    }
}

#[cfg(test)]
mod tests {
    use pretty_assertions::assert_eq;

    use super::*;

    fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn file(text: &str) -> tempfile::NamedTempFile {
        let f = tempfile::Builder::new().suffix(".toml").tempfile().unwrap();
        std::fs::write(f.path(), text).unwrap();
        f
    }

    #[test]
    fn defaults_are_valid() {
        let cfg = Config::load_from(Some(file("").path()), env(&[])).unwrap();
        // The one default filled in at load: the local user may approve,
        // for each agent.
        let mut want = Config::default();
        want.ops.operators = vec![format!("cli:{}", crate::operator::local_user())];
        want.dev.operators = want.ops.operators.clone();
        assert_eq!(cfg, want);
    }

    #[test]
    fn a_bad_policy_file_is_refused_naming_its_line() {
        let policy =
            file("version = 1\n\n[[protected]]\ntargets = [\"nas[\"]\nreason = \"backups\"\n");
        let cfg = file(&format!(
            "[policy]\nfile = {:?}\n",
            policy.path().display().to_string()
        ));
        let e = Config::load_from(Some(cfg.path()), env(&[]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("policy.file"), "{e}");
        assert!(
            e.contains(&format!("{}:3:", policy.path().display())),
            "{e}"
        );
        let cfg = file("[ops]\noperators = [\"alice\"]\n");
        let e = Config::load_from(Some(cfg.path()), env(&[]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("ops.operators[0]"), "{e}");
    }

    #[test]
    fn environment_overrides_the_file() {
        let f = file("agents = [\"ops\"]\n[bus.streams]\nmax-age = \"30d\"\n");
        let cfg = Config::load_from(
            Some(f.path()),
            env(&[
                ("NISSE_AGENTS", "ops,dev"),
                ("NISSE_BUS__STREAMS__MAX_AGE", "7d"),
                ("NISSE_BUS__CONSUMERS__MAX_DELIVER", "9"),
                ("NISSE_NATS_URL", "nats://10.0.0.5:4222"),
                ("NISSE_LOG", "debug"),
            ]),
        )
        .unwrap();
        assert_eq!(cfg.agents, vec!["ops", "dev"]);
        assert_eq!(cfg.bus.streams.max_age, Duration::from_secs(7 * 86400));
        assert_eq!(cfg.bus.consumers.max_deliver, 9);
        assert_eq!(cfg.bus.url.as_deref(), Some("nats://10.0.0.5:4222"));
    }

    #[test]
    fn an_unknown_key_is_named() {
        let f = file("[bus.streams]\nmax-ages = \"30d\"\n");
        let err = Config::load_from(Some(f.path()), env(&[]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("max-ages"), "{err}");
    }

    #[test]
    fn a_bad_value_is_named_with_its_key() {
        let f = file("[bus.consumers]\nack-wait = \"soon\"\n");
        let err = Config::load_from(Some(f.path()), env(&[]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("ack-wait"), "{err}");
    }

    #[test]
    fn validation_names_every_bad_key() {
        let f = file(
            "agents = [\"Ops\", \"dev\", \"dev\"]\n[bus]\nuser = \"nisse\"\ncreds-file = \"/nonexistent.creds\"\n[bus.streams]\nreplicas = 7\n",
        );
        let err = Config::load_from(Some(f.path()), env(&[])).unwrap_err();
        let invalid = err.downcast_ref::<Invalid>().expect("validation error");
        let keys: Vec<&str> = invalid.0.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            keys,
            vec![
                "agents[0]",
                "agents[2]",
                "bus.user",
                "bus.creds-file",
                "bus.creds-file",
                "bus.streams.replicas",
                "intake-alerts.agent"
            ]
        );
    }

    #[test]
    fn a_vikunja_is_validated_and_serves_a_configured_agent() {
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("token");
        std::fs::write(&token, "tk_x\n").unwrap();
        let text = format!(
            "[vikunja]\nurl = \"https://tasks.example.org\"\nagent = \"dev\"\naccount = \"nisse\"\n\
             token-file = {token:?}\nwebhook-secret-file = {token:?}\nprojects = [3, 3]\n"
        );
        let err = Config::load_from(Some(file(&text).path()), env(&[])).unwrap_err();
        let invalid = err.downcast_ref::<Invalid>().expect("validation error");
        let keys: Vec<&str> = invalid.0.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["vikunja.projects", "vikunja.agent"]);
        let ok = text
            .replace("agent = \"dev\"", "agent = \"ops\"")
            .replace("[3, 3]", "[3]");
        let cfg = Config::load_from(Some(file(&ok).path()), env(&[])).unwrap();
        assert!(cfg.vikunja.enabled() && cfg.vikunja.served(3));
        // A finding's ticket project must be one served for ops.
        let ticketed = |project: i64| format!("[ops]\nticket-project = {project}\n{ok}");
        assert!(Config::load_from(Some(file(&ticketed(3)).path()), env(&[])).is_ok());
        let err = Config::load_from(Some(file(&ticketed(4)).path()), env(&[])).unwrap_err();
        let invalid = err.downcast_ref::<Invalid>().expect("validation error");
        assert_eq!(invalid.0[0].0, "ops.ticket-project");
        assert!(
            invalid.0[0].1.contains("project 4 is not served"),
            "{}",
            invalid.0[0].1
        );
    }

    #[test]
    fn the_brain_knows_its_mcp_instances_and_the_policy_must_agree_on_their_privilege() {
        let text = "[[mcp.instance]]\nname = \"hv-site-a-ro\"\nservice = \"hv\"\nsite = \"site-a\"\n\
            privilege = \"read-only\"\ncommand = [\"hv-mcp\"]\n\
            [[mcp.instance]]\nname = \"hv-site-a-elevated\"\nservice = \"hv\"\nsite = \"site-a\"\n\
            privilege = \"elevated\"\ncommand = [\"hv-mcp\"]\n";
        let cfg = Config::load_from(Some(file(text).path()), env(&[])).unwrap();
        assert_eq!(
            cfg.mcp_instances("ops"),
            [
                nisse_core::mcp::McpInstance {
                    name: "hv-site-a-ro".into(),
                    elevated: false,
                    scopes: vec!["*".into()],
                },
                nisse_core::mcp::McpInstance {
                    name: "hv-site-a-elevated".into(),
                    elevated: true,
                    scopes: vec!["*".into()],
                },
            ]
        );
        assert!(cfg.mcp_instances("dev").is_empty());
        // Undeclared: allowed (its tools are elevated and protected).
        cfg.check_mcp_policy(&nisse_policy::Policy::builtin().unwrap())
            .unwrap();
        let agrees = nisse_policy::Policy::with_file(
            "site.toml",
            "version = 1\n[mcp.hv-site-a-ro]\nprivilege = \"read-only\"\n[mcp.hv-site-a-elevated]\nprivilege = \"elevated\"\n",
        )
        .unwrap();
        cfg.check_mcp_policy(&agrees).unwrap();
        let differs = nisse_policy::Policy::with_file(
            "site.toml",
            "version = 1\n[mcp.hv-site-a-ro]\nprivilege = \"elevated\"\n",
        )
        .unwrap();
        let e = cfg.check_mcp_policy(&differs).unwrap_err().to_string();
        assert_eq!(
            e,
            "mcp instance `hv-site-a-ro` is configured read-only but the policy declares it elevated ([mcp.hv-site-a-ro] privilege)"
        );
    }

    #[test]
    fn mcp_instances_are_read_and_validated_naming_their_keys() {
        let text = "[[mcp.instance]]\nname = \"hv-site-a-ro\"\nservice = \"hv\"\nsite = \"site-a\"\n\
            privilege = \"read-only\"\ncommand = [\"hv-mcp\", \"--site\", \"a\"]\n\
            env = { HV_URL = \"https://hv.site-a.lan\" }\nsecret-env = { HV_TOKEN = \"/run/secrets/hv\" }\n\
            [[mcp.instance]]\nname = \"hv-site-a-elevated\"\nservice = \"hv\"\nsite = \"site-a\"\n\
            privilege = \"elevated\"\nurl = \"https://hv-mcp.site-a.lan/mcp\"\ntoken-file = \"/run/secrets/hv-rw\"\n\
            call-timeout = \"5m\"\n";
        let cfg = Config::load_from(Some(file(text).path()), env(&[])).unwrap();
        assert_eq!(cfg.mcp.instances.len(), 2);
        assert_eq!(cfg.mcp.instances[0].agent, "ops");
        assert_eq!(
            cfg.mcp.instances[1].privilege,
            nisse_mcp::config::Privilege::Elevated
        );
        assert_eq!(cfg.mcp.instances[1].call_timeout, Duration::from_secs(300));
        // Another agent than the configured ones, both transports, a
        // name without its site.
        let bad = text
            .replacen(
                "name = \"hv-site-a-ro\"",
                "name = \"hv-ro\"\nagent = \"dev\"",
                1,
            )
            .replace("call-timeout", "command = [\"x\"]\ncall-timeout");
        let err = Config::load_from(Some(file(&bad).path()), env(&[])).unwrap_err();
        let invalid = err.downcast_ref::<Invalid>().expect("validation error");
        let keys: Vec<&str> = invalid.0.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            keys,
            [
                "mcp.instance[0].name",
                "mcp.instance[1]",
                "mcp.instance[0].agent"
            ]
        );
        // A privilege other than the two is refused, naming it.
        let other = text.replacen("\"read-only\"", "\"root\"", 1);
        let e = Config::load_from(Some(file(&other).path()), env(&[]))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("root") && e.contains("read-only") && e.contains("elevated"),
            "{e}"
        );
    }

    #[test]
    fn a_dev_project_needs_its_build_host_and_push_key_at_the_executor() {
        let project = "agents = [\"ops\", \"dev\"]\n[dev]\naccount = \"dev-agent\"\n\
            [dev.projects.widget]\nrepository = \"acme/widget\"\nbuild-host = \"build-widget\"\n\
            workspace = \"/home/nisse/work/widget\"\nclone-url = \"ssh://git@gitea.lan/acme/widget.git\"\n";
        let keys = |text: &str| -> Vec<String> {
            match Config::load_from(Some(file(text).path()), env(&[])) {
                Ok(_) => Vec::new(),
                Err(e) => e
                    .downcast_ref::<Invalid>()
                    .expect("validation error")
                    .0
                    .iter()
                    .map(|(k, _)| k.clone())
                    .collect(),
            }
        };
        assert_eq!(keys(project), ["dev.projects.widget.build-host"]);
        let host = "[executor.agents.dev.hosts.build-widget]\naddress = \"10.0.5.20\"\n";
        assert_eq!(
            keys(&format!("{project}{host}")),
            ["dev.projects.widget.push-secret"]
        );
        // As an environment variable the key would reach every command.
        let env_grant = format!(
            "{project}{host}secrets = [{{ name = \"gitea-push-key\", env = \"KEY\" }}]\n\
             [executor.agents.dev.secrets.gitea-push-key]\nfile = \"/run/secrets/k\"\n"
        );
        assert_eq!(keys(&env_grant), ["dev.projects.widget.push-secret"]);
        let stdin = env_grant.replace("env = \"KEY\"", "stdin = true");
        assert_eq!(keys(&stdin), Vec::<String>::new());
        // A project secret is granted on the build host under its
        // namespaced name, `<project>.<name>`.
        let declared = stdin.replacen(
            project,
            &format!("{project}secrets = [{{ name = \"pypi-token\", to = \"model\" }}]\n"),
            1,
        );
        assert_eq!(keys(&declared), ["dev.projects.widget.secrets[0]"]);
        let granted = declared.replace(
            "{ name = \"gitea-push-key\", stdin = true }",
            "{ name = \"gitea-push-key\", stdin = true }, { name = \"widget.pypi-token\", env = \"TWINE_PASSWORD\" }",
        ) + "[executor.agents.dev.secrets.\"widget.pypi-token\"]\nfile = \"/run/secrets/p\"\n";
        assert_eq!(keys(&granted), Vec::<String>::new());
    }

    #[test]
    fn the_checked_config_is_documented_and_reads_back_the_same() {
        let mut cfg = Config::default();
        cfg.bus.user = Some("nisse".into());
        cfg.bus.password = Some("hunter2".into());
        cfg.ops.operators = vec!["cli:alice".into(), "matrix:@alice:example.org".into()];
        cfg.dev.operators = vec!["cli:alice".into(), "gitea:alice".into()];
        let text = cfg.to_annotated_toml().unwrap();
        assert!(
            text.contains("# How long the server waits for an ack before redelivering."),
            "{text}"
        );
        assert!(text.contains("[bus.consumers]\n"), "{text}");
        assert!(text.contains("# url = (not set)"), "{text}");
        assert!(text.contains("password = \"<redacted>\""), "{text}");
        assert!(!text.contains("hunter2"));
        // The output is itself a valid configuration with the same values.
        let f = file(&text);
        let back = Config::load_from(Some(f.path()), env(&[])).unwrap();
        cfg.bus.password = Some("<redacted>".into());
        assert_eq!(back, cfg);
    }

    #[test]
    fn models_are_read_from_the_file_and_the_environment_and_validated() {
        let f = file(
            "[models]\nroles = { driver = \"local\" }\n[models.models.local]\nupstream = \"qwen3:8b\"\ncontext-window = 32768\nfallbacks = [\"big\"]\n[models.models.big]\nendpoint = \"https://llm.example.org/v1\"\n[models.budgets.driver]\ncalls = 50\ntokens = 100000\n",
        );
        let cfg = Config::load_from(Some(f.path()), env(&[("NISSE_MODELS__MAX_IN_FLIGHT", "2")]))
            .unwrap();
        let local = &cfg.models.models["local"];
        assert_eq!(local.upstream, "qwen3:8b");
        assert_eq!(local.profile.context_window, 32768);
        assert_eq!(local.fallbacks, vec!["big".to_string()]);
        assert_eq!(cfg.models.max_in_flight, 2);
        assert_eq!(cfg.models.budget(nisse_models::Role::Driver).calls, 50);
        let f = file("[models]\nroles = { driver = \"ghost\" }\nmax-in-flight = 0\n");
        let err = Config::load_from(Some(f.path()), env(&[])).unwrap_err();
        let invalid = err.downcast_ref::<Invalid>().expect("validation error");
        let keys: Vec<&str> = invalid.0.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, vec!["models.roles.driver", "models.max-in-flight"]);
        let f = file("[models.models.local]\ncontext-windw = 1\n");
        let err = Config::load_from(Some(f.path()), env(&[]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("context-windw"), "{err}");
    }

    #[test]
    fn a_missing_explicit_file_is_an_error() {
        let err = Config::load_from(Some(Path::new("/nonexistent/nisse.toml")), env(&[]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("/nonexistent/nisse.toml"), "{err}");
    }
}
