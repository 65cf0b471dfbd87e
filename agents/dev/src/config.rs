//! The dev agent's settings (`[dev]` in `nisse.toml`): its Gitea account,
//! who its operators are, and its projects, each a repository bound to a
//! build host.

use std::collections::BTreeMap;
use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use nisse_core::BrainSettings;
use nisse_core::requests::Deadlines;
use nisse_models::ModelsConfig;

/// The dev brain's settings (`[dev]` in `nisse.toml`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
pub struct Config {
    /// The agent's own Gitea login (`dev-agent`): issues assigned to it
    /// are its work (D1), and what it writes in Gitea is by it.
    pub account: String,
    /// Who may instruct the agent, as `<channel>:<identity>`: `gitea:<login>`
    /// for Gitea accounts (only their assignments become work, only their
    /// comments are instructions), `matrix:@alice:example.org`, `cli:alice`.
    /// Everyone else's words are data. Empty: `nisse` fills in
    /// `cli:<the user it runs as>`.
    pub operators: Vec<String>,
    /// The projects, by name (`use <project>` and `nisse dev` name them).
    pub projects: BTreeMap<String, Project>,
    /// How long an issue labelled `bug` waits after the agent restated it
    /// before work goes on without a word from the operator (D1, L1): the
    /// operator's chance to say `stop` or correct the understanding.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String")]
    pub bug_grace: Duration,
    /// How often a blocked item's dependencies are read from Gitea again,
    /// besides whenever one of them changes (a dependency added or removed
    /// sends no webhook).
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String")]
    pub recheck_blocked: Duration,
    /// Names the operator may address the agent by in chat.
    pub names: Vec<String>,
    /// What the agent is for, in a paragraph: the start of every model
    /// call's system prompt.
    pub brief: String,
    /// How long an approval request stays open.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String")]
    pub approval_expiry: Duration,
    /// The model-driven loop's limits.
    #[serde(rename = "loop")]
    pub agent_loop: nisse_core::agent_loop::LoopConfig,
    /// How long an item that went to wait on the operator keeps the
    /// agent's attention before the next ready item is taken up.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String")]
    pub switch_grace: Duration,
    /// How long each kind of request may go unanswered.
    #[schemars(with = "std::collections::BTreeMap<String, String>")]
    pub deadlines: Deadlines,
    /// Whether the agent keeps memory in the knowledge vault
    /// (`memory/dev/`).
    pub memory: bool,
    /// The e-mail address on the agent's commits. Default:
    /// `<account>@users.noreply.invalid` (a name that can reach no one).
    pub email: Option<String>,
    /// How often each project's branch protection is verified again with
    /// the agent's token (D4), besides at the first tick and before every
    /// publish. A project whose protection does not hold is not worked on
    /// until a check finds it restored.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String")]
    pub protection_recheck: Duration,
    /// With the trust dial letting the agent merge: how often an approved
    /// pull request whose checks are still running is read again.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String")]
    pub checks_recheck: Duration,
}

/// How much the operator reviews after the fact (seed Nisse L3, D5): who
/// merges a project's pull requests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Trust {
    /// The operator merges; the agent never does (merging is class 3).
    #[default]
    OperatorMerges,
    /// The agent may merge its own pull request once its checks pass and
    /// an operator's approval is recorded in Gitea, which must require an
    /// approval the agent's account cannot give.
    AgentMergesAfterApproval,
}

/// One project: a Gitea repository and the build host its workspace lives
/// on (D3).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct Project {
    /// The repository, `owner/name`. It must also be in `gitea.repositories`.
    pub repository: String,
    /// The branch work starts from and pull requests go to.
    #[serde(default = "default_base")]
    pub base_branch: String,
    /// The project's build host: an executor host (`executor.agents.dev.hosts`)
    /// bound to every item of the project, and the only host its commands
    /// run on. Installing there is class 2 (D3, D6).
    pub build_host: String,
    /// The absolute path of the workspace (the clone) on the build host.
    pub workspace: String,
    /// The URL the build host clones from and pushes to (`ssh://…` or
    /// `git@host:owner/name.git`).
    pub clone_url: String,
    /// The executor secret holding the push key (an SSH private key),
    /// granted on the build host by stdin and by the policy only to the
    /// harness's push: no command a model chose ever receives it.
    #[serde(default = "default_push_secret")]
    pub push_secret: String,
    /// A known-hosts file on the build host holding Gitea's SSH host key,
    /// which the harness's git checks strictly. Default: the build host
    /// user's own (`~/.ssh/known_hosts`).
    #[serde(default)]
    pub git_known_hosts: Option<String>,
    /// The project's test commands, run in the workspace (class 1); when
    /// empty the model finds them from the project's files.
    #[serde(default)]
    pub test_commands: Vec<String>,
    /// Who merges its pull requests.
    #[serde(default)]
    pub trust: Trust,
    /// The project's own secrets (D7): each an executor secret named
    /// `<project>.<name>`, granted on the project's build host, and said
    /// to be for the commands the model chooses or only for the harness's
    /// own operations. Namespaced by the project, so one project's secret
    /// is never taken for another's.
    #[serde(default)]
    pub secrets: Vec<ProjectSecret>,
}

/// A secret of one project.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct ProjectSecret {
    /// Its name within the project; the executor knows it as
    /// `<project>.<name>`.
    pub name: String,
    /// Who may have it handed to them.
    pub to: SecretUse,
}

/// Who a project secret is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum SecretUse {
    /// Commands the model chooses on the build host may ask for it (the
    /// policy's `[[secret]]` entries still say which commands get it).
    Model,
    /// Only the harness's own operations: a model's call naming it is
    /// refused before anything runs.
    Harness,
}

impl ProjectSecret {
    /// The executor's name for it in project `project`.
    pub fn executor_name(&self, project: &str) -> String {
        format!("{project}.{}", self.name)
    }
}

impl Project {
    /// Whether the trust dial lets the agent merge its own pull requests.
    pub fn agent_merges(&self) -> bool {
        self.trust == Trust::AgentMergesAfterApproval
    }

    /// The project's build host as the policy knows it: the one value the
    /// policy's dev rules and the harness's lines are built from, so the
    /// lines the harness sends are the ones the policy recognises.
    pub fn build_host(&self) -> nisse_policy::BuildHost {
        nisse_policy::BuildHost {
            name: self.build_host.clone(),
            project: self.repository.clone(),
            workspace: self.workspace.clone(),
            test_commands: self.test_commands.clone(),
            git: Some(nisse_policy::dev::HarnessGit {
                url: self.clone_url.clone(),
                known_hosts: self.git_known_hosts.clone(),
                push_secret: self.push_secret.clone(),
            }),
        }
    }
}

fn default_base() -> String {
    "main".into()
}

fn default_push_secret() -> String {
    "gitea-push-key".into()
}

/// The dev agent's default brief.
pub const DEFAULT_BRIEF: &str = "You are nisse-dev, the software development agent. Each work item is one Gitea issue on one project; you work in the project's workspace on its build host: read the code and its documents, reproduce a bug before fixing it (ideally as a failing test), make the change, run the project's tests, and publish it as a pull request with finish_milestone. The harness owns branches, commits and pushes; you never push or switch branches yourself. Keep changes small and focused on the issue; update ARCHITECTURE.md when the design changes.";

impl Default for Config {
    fn default() -> Self {
        Self {
            account: String::new(),
            operators: Vec::new(),
            projects: BTreeMap::new(),
            email: None,
            bug_grace: Duration::from_secs(300),
            recheck_blocked: Duration::from_secs(900),
            names: vec!["dev".into(), "nisse-dev".into()],
            brief: DEFAULT_BRIEF.into(),
            approval_expiry: nisse_core::plans::DEFAULT_APPROVAL_EXPIRY,
            agent_loop: nisse_core::agent_loop::LoopConfig::default(),
            switch_grace: nisse_core::store::DEFAULT_SWITCH_GRACE,
            deadlines: Deadlines::default(),
            memory: true,
            protection_recheck: Duration::from_secs(300),
            checks_recheck: Duration::from_secs(60),
        }
    }
}

impl Config {
    /// Problems as (key under `prefix`, what is wrong); empty when valid.
    pub fn validate(&self, prefix: &str) -> Vec<(String, String)> {
        let mut out = Vec::new();
        let mut problem = |key: String, what: &str| out.push((key, what.to_string()));
        if !self.projects.is_empty() && self.account.trim().is_empty() {
            problem(
                format!("{prefix}.account"),
                "must name the agent's Gitea login when projects are configured",
            );
        }
        if let Some(i) = self.operators.iter().position(|o| {
            !o.split_once(':')
                .is_some_and(|(c, id)| !c.is_empty() && !id.is_empty())
        }) {
            problem(
                format!("{prefix}.operators[{i}]"),
                "must be `<channel>:<identity>`, e.g. `gitea:alice`",
            );
        }
        if self.approval_expiry.is_zero() {
            problem(
                format!("{prefix}.approval-expiry"),
                "must be longer than zero",
            );
        }
        if self.recheck_blocked.is_zero() {
            problem(
                format!("{prefix}.recheck-blocked"),
                "must be longer than zero",
            );
        }
        if self.checks_recheck.is_zero() {
            problem(
                format!("{prefix}.checks-recheck"),
                "must be longer than zero",
            );
        }
        if self.protection_recheck.is_zero() {
            problem(
                format!("{prefix}.protection-recheck"),
                "must be longer than zero",
            );
        }
        if self.brief.trim().is_empty() {
            problem(format!("{prefix}.brief"), "must not be empty");
        }
        let mut repositories = BTreeMap::new();
        let mut hosts = BTreeMap::new();
        for (name, p) in &self.projects {
            let at = format!("{prefix}.projects.{name}");
            if !is_project_name(name) {
                problem(
                    at.clone(),
                    "a project's name is lowercase letters, digits, `-` and `_`",
                );
            }
            if !is_repository(&p.repository) {
                problem(format!("{at}.repository"), "must be `owner/name`");
            } else if let Some(other) = repositories.insert(p.repository.clone(), name) {
                problem(
                    format!("{at}.repository"),
                    &format!("is already project `{other}`'s"),
                );
            }
            if p.build_host.trim().is_empty() {
                problem(format!("{at}.build-host"), "must name an executor host");
            }
            if !is_normal_path(&p.workspace) {
                problem(
                    format!("{at}.workspace"),
                    "must be an absolute path below `/` on the build host, written plainly (no `.`, `..`, `//`, trailing `/`, globs or quotes)",
                );
            }
            if let Some(k) = &p.git_known_hosts
                && !is_normal_path(k)
            {
                problem(
                    format!("{at}.git-known-hosts"),
                    "must be an absolute path on the build host, written plainly",
                );
            }
            if let Some(other) = hosts.insert(p.build_host.clone(), name) {
                problem(
                    format!("{at}.build-host"),
                    &format!(
                        "is already project `{other}`'s build host: a build host serves one project (D7)"
                    ),
                );
            }
            if p.clone_url.trim().is_empty() {
                problem(format!("{at}.clone-url"), "must not be empty");
            }
            if !nisse_policy::dev::is_branch_name(&p.base_branch) {
                problem(format!("{at}.base-branch"), "is not a usable branch name");
            }
            if p.push_secret.trim().is_empty() {
                problem(format!("{at}.push-secret"), "must name an executor secret");
            }
            let mut seen = std::collections::BTreeSet::new();
            for (i, s) in p.secrets.iter().enumerate() {
                if !is_project_name(&s.name) {
                    problem(
                        format!("{at}.secrets[{i}].name"),
                        "a secret's name is lowercase letters, digits, `-` and `_`",
                    );
                } else if !seen.insert(&s.name) {
                    problem(
                        format!("{at}.secrets[{i}].name"),
                        "is declared twice in the project",
                    );
                }
            }
        }
        out.extend(self.agent_loop.validate(&format!("{prefix}.loop")));
        out
    }

    /// The project whose repository is `repository`, with its name.
    pub fn project_of(&self, repository: &str) -> Option<(&str, &Project)> {
        self.projects
            .iter()
            .find(|(_, p)| p.repository.eq_ignore_ascii_case(repository))
            .map(|(n, p)| (n.as_str(), p))
    }

    /// How the agent acts, for the system prompt: the harness's rules,
    /// and the project secrets a command the model chooses may name.
    fn how_to_act(&self) -> String {
        let mut text = crate::milestones::HOW_TO_ACT.to_string();
        let usable: Vec<String> = self
            .projects
            .iter()
            .flat_map(|(name, p)| {
                p.secrets
                    .iter()
                    .filter(|s| s.to == SecretUse::Model)
                    .map(move |s| format!("`{}` (project {name})", s.executor_name(name)))
            })
            .collect();
        if !usable.is_empty() {
            text.push_str(&format!(
                "\n- Secrets a command of yours may name in `secrets`, on its project's build host only: {}. Every other secret is the harness's.",
                usable.join(", ")
            ));
        }
        text
    }

    /// The e-mail address on the agent's commits.
    pub fn email(&self) -> String {
        self.email
            .clone()
            .unwrap_or_else(|| format!("{}@users.noreply.invalid", self.account))
    }

    /// The settings every brain has, for the agent named `agent` (no
    /// models: see `DevBrain::with_models`).
    pub fn brain_settings(&self, agent: &str) -> BrainSettings {
        BrainSettings {
            agent: agent.to_string(),
            operators: self.operators.clone(),
            names: self.names.clone(),
            approval_expiry: self.approval_expiry,
            brief: self.brief.clone(),
            loop_config: self.agent_loop.clone(),
            models: ModelsConfig::default(),
            switch_grace: self.switch_grace,
            deadlines: self.deadlines,
            memory: self.memory,
            // The push keys and every project secret only the harness may
            // have: a model's call naming one is refused.
            harness_secrets: self
                .projects
                .iter()
                .flat_map(|(name, p)| {
                    std::iter::once(p.push_secret.clone()).chain(
                        p.secrets
                            .iter()
                            .filter(|s| s.to == SecretUse::Harness)
                            .map(|s| s.executor_name(name)),
                    )
                })
                .collect(),
            agent_tools: crate::milestones::tools(),
            how_to_act: self.how_to_act(),
            ..BrainSettings::new(agent)
        }
    }
}

/// Whether `path` is absolute, below `/`, and written the one way a path
/// can be: the harness's lines and the policy's rules then read it alike.
fn is_normal_path(path: &str) -> bool {
    path.strip_prefix('/').is_some_and(|rest| {
        !rest.is_empty()
            && rest.split('/').all(|part| {
                !part.is_empty()
                    && part != "."
                    && part != ".."
                    && part.chars().all(|c| {
                        c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '+' | '@' | ',')
                    })
            })
    })
}

/// Whether `name` can name a project: lowercase letters, digits, `-`, `_`.
pub(crate) fn is_project_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_')
}

/// Whether `s` is `owner/name` as Gitea allows them (letters, digits, `-`,
/// `_`, `.`; neither part `.` or `..`).
pub fn is_repository(s: &str) -> bool {
    let part = |p: &str| {
        !p.is_empty()
            && p != "."
            && p != ".."
            && p.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    };
    s.split_once('/')
        .is_some_and(|(owner, name)| part(owner) && part(name))
}
