//! The dev agent's action classes on a project's build host (seed Nisse
//! D6, with the boundary of D7).
//!
//! `nisse-dev` works in a project's workspace on the project's own build
//! host, a disposable VM that is the trust boundary for unattended command
//! execution (D7). There the ops rules (every write is dangerous, O3) are
//! the wrong ones, and D6 gives the classes instead:
//!
//! - **class 1**: reading (as everywhere), and running one of the
//!   project's declared test commands, alone or after a `cd` into the
//!   workspace ([`RULE_TEST`]);
//! - **class 2**, contained ([`RULE_CONTAINED`]): what the shell
//!   classifier calls a write (`reversible_low`, `config_mutation`) on the
//!   build host: editing the workspace, committing, installing packages
//!   and toolchains there (D3: the VM is the boundary); and destruction
//!   confined to the workspace (strictly below its root), scratch space
//!   (`paths.scratch`) and the login user's caches
//!   (`paths.build-host-caches`): `rm -rf target/`, `git clean -fdx`,
//!   `find . -name '*.pyc' -delete` — cleaning build artifacts is in scope
//!   (D3). A `file.write` strictly inside the workspace is class 2 as
//!   well;
//! - **class 3** whatever else the line does: `git push` of any kind
//!   ([`RULE_PUSH`]: the harness owns pushes, D4, and a push a model chose
//!   is never handed the key), changing the repository's remotes or the
//!   settings that say where git connects and how it authenticates
//!   ([`RULE_REMOTE`]), reaching another host (`ssh`, `scp`, `sftp`,
//!   `rsync` to a remote: [`RULE_SSH`]), publishing to a registry
//!   ([`RULE_PUBLISH`]: visible beyond the agent's own area, P3), and
//!   destruction of anything else ([`RULE_OUTSIDE`]: `rm -rf /`, `rm -rf
//!   ~`, `dd` to a device). What the rules cannot read (a line that does
//!   not parse, code computed when it runs) is not lowered either.
//!
//! Scope still decides: class 2 proceeds only where the agreed scope
//! contains it (`Scope::contained`, the item's build host), and the
//! operator's `[[protected]]` and `[[never]]` targets, the agent's own
//! hosts and the kill switches apply to a build host as to any other: on a
//! protected or `never` build host these rules do not apply at all.
//!
//! These rules make mistakes and injected instructions visible and
//! harmless to the work; they are not the walls. A test run is class 1 and
//! runs whatever code the workspace holds, so the harness's own
//! operations must treat the workspace (its `.git` included) as written by
//! a stranger, and the push key stays with the harness (D4, L12).
//!
//! Paths are judged as the line leaves them: a relative path resolves
//! against the directory a `cd` of the line surely went to (`cd /w && rm
//! -rf target`), or the login directory (`~`) when there was none; where
//! that is not known (`cd /w; …`, `cd /w || …`, a computed `cd`, a line
//! that changes `HOME` or `CDPATH`) a relative path is not inside
//! anything. A path with `..`, braces or parentheses (which can expand to
//! one), a computed word, or a glob part that can match `.` or `..` is not
//! inside anything either; a command whose operands come from elsewhere
//! (`xargs`, `find -exec`, `parallel`) deletes nothing known, and one run
//! through a wrapper that can change its directory (`sudo -D`, `env -C`)
//! is judged by its absolute paths only. The repository's `.git` is never
//! inside for deleting: its history and the work set aside from earlier
//! items live there (a `find` started at the workspace's root deletes what
//! its expression matches, though). `ssh-agent COMMAND`, which the shell
//! tables do not look through, is followed into its command here.

use serde::{Deserialize, Serialize};

use crate::files::FileOp;
use crate::policy::PolicyError;
use crate::rules::ShellRules;
use crate::shell::{Arg, Dir, FindingKind, ShellReport, SimpleFinding, resolve_path};
use crate::{Policy, RiskClass};

pub mod harness;

pub use harness::{GitNetwork, HarnessGit, is_agent_branch, is_branch_name, shell_word};

/// Class 2 on the build host: a contained change, or destruction only
/// inside the workspace, scratch space or the caches.
pub const RULE_CONTAINED: &str = "dev.build-host.contained";
/// Class 1: one of the project's declared test commands.
pub const RULE_TEST: &str = "dev.test-command";
/// Class 3: a push (or what can hide one).
pub const RULE_PUSH: &str = "dev.push";
/// Class 3: the repository's remotes, or where git connects and how it
/// authenticates.
pub const RULE_REMOTE: &str = "dev.remote";
/// Class 3: reaching another host from the build host.
pub const RULE_SSH: &str = "dev.ssh";
/// Class 3: publishing to a package or image registry.
pub const RULE_PUBLISH: &str = "dev.publish";
/// Class 3: destruction outside the workspace, scratch space and caches.
pub const RULE_OUTSIDE: &str = "dev.outside";
/// Class 2: the harness's own fetch, or push of an agent branch, exactly
/// as [`BuildHost::git_network_line`] builds it.
pub const RULE_HARNESS_GIT: &str = "dev.harness-git";

/// A project's build host (D3): the executor host its workspace lives on.
/// Named in the dev agent's project configuration, and added to the
/// policy from there ([`Policy::with_build_hosts`]), so that is the one
/// place they are named.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BuildHost {
    /// The executor host's name (the target actions name).
    pub name: String,
    /// The project whose build host it is (its repository, `owner/name`).
    pub project: String,
    /// The absolute path of the workspace root on it.
    pub workspace: String,
    /// The project's test commands, each a whole command line: running
    /// one (alone, or after a `cd` into the workspace) is class 1.
    pub test_commands: Vec<String>,
    /// How the harness fetches and pushes the project's repository here
    /// ([`harness`]); `None`: it does not, and no push key reaches the
    /// host.
    #[serde(default)]
    pub git: Option<HarnessGit>,
}

impl Policy {
    /// This policy with the dev projects' build hosts, on which the dev
    /// agent's classes apply (D6, see [`crate::dev`]). A host may be the
    /// build host of one project only (the policy cannot tell two
    /// projects' items apart by their actions), never one the agent itself
    /// runs on; its workspace is an absolute path below `/` without `..`.
    pub fn with_build_hosts(mut self, hosts: Vec<BuildHost>) -> Result<Self, PolicyError> {
        let problem = |message: String| PolicyError {
            file: "build hosts".into(),
            line: None,
            column: None,
            message,
        };
        for mut host in hosts {
            let name = host.name.trim().to_string();
            if name.is_empty() {
                return Err(problem(format!(
                    "project {}: the build host's name is empty",
                    host.project
                )));
            }
            let workspace = host.workspace.trim();
            let normal = resolve_path(&Dir::Unknown, false, workspace)
                .filter(|w| w.starts_with('/') && w != "/" && !workspace.contains(['*', '?', '[']));
            let Some(normal) = normal else {
                return Err(problem(format!(
                    "{name} (project {}): the workspace `{workspace}` must be an absolute path below `/`, without `..`, globs, braces or parentheses",
                    host.project
                )));
            };
            if self.ops.agent_hosts.contains(&name) {
                return Err(problem(format!(
                    "{name} (project {}) is a host the agent itself runs on (`agent-hosts`): a build host runs the model's commands unattended, so it cannot be one",
                    host.project
                )));
            }
            if let Some(other) = self.build_hosts.get(&name) {
                return Err(problem(format!(
                    "{name} is the build host of both {} and {}: a build host serves one project (D7), as the policy cannot tell their items apart",
                    other.project, host.project
                )));
            }
            if let Some(empty) = host.test_commands.iter().position(|t| t.trim().is_empty()) {
                return Err(problem(format!(
                    "{name} (project {}): test command {} is empty",
                    host.project,
                    empty + 1
                )));
            }
            if let Some(git) = &host.git {
                if git.url.trim().is_empty() || git.url.contains(['\n', '\r', '\0']) {
                    return Err(problem(format!(
                        "{name} (project {}): the repository URL must be one line, not empty",
                        host.project
                    )));
                }
                if git.push_secret.is_empty() || git.push_secret.contains(char::is_whitespace) {
                    return Err(problem(format!(
                        "{name} (project {}): the push secret `{}` must be one word, the executor secret's name",
                        host.project, git.push_secret
                    )));
                }
                if let Some(k) = &git.known_hosts
                    && (!k.starts_with('/') || k.contains(['\n', '\r', '\0']))
                {
                    return Err(problem(format!(
                        "{name} (project {}): the known-hosts file `{k}` must be an absolute path",
                        host.project
                    )));
                }
            }
            host.name = name.clone();
            host.workspace = normal;
            self.build_hosts.insert(name, host);
        }
        Ok(self)
    }

    /// The build host named `name`, when it is one.
    pub fn build_host(&self, name: &str) -> Option<&BuildHost> {
        self.build_hosts.get(name)
    }

    /// The installs of packages and toolchains `command` makes, each as
    /// its own words (`apt-get install -y jq`): what the dev harness
    /// records of a build host, so it can be rebuilt (D3). A package
    /// manager's or toolchain manager's install, add or toolchain
    /// subcommand, found wherever the shell classifier finds the program
    /// (after `sudo`, in `sh -c`); a project's own dependencies installed
    /// into the workspace (`npm install` without `-g`) are not.
    pub fn installs(&self, command: &str) -> Vec<String> {
        self.commands_where(command, is_install)
    }

    /// The repairs of the environment `command` makes, each as its own
    /// words (`cargo clean`): cleaning caches and build artifacts, and
    /// reinstalling dependencies (`npm ci`, `pip install
    /// --force-reinstall`, `apt-get install --reinstall`), which the dev
    /// harness reports (D3: "reports what it did"). Found as
    /// [`Policy::installs`] finds installs.
    pub fn repairs(&self, command: &str) -> Vec<String> {
        self.commands_where(command, is_repair)
    }

    /// The commands of `command`, as the shell classifier finds them,
    /// that `matches` (by program and arguments), each as its words.
    fn commands_where(&self, command: &str, matches: fn(&str, &[&str]) -> bool) -> Vec<String> {
        self.classify_command(command)
            .commands
            .iter()
            .filter_map(|f| {
                let words: Vec<&str> = if f.detail.words.is_empty() {
                    // An interpreter's line (`python3 -m pip install x`)
                    // is kept whole, its words unread: its plain words.
                    f.command.split_whitespace().collect()
                } else {
                    f.detail
                        .words
                        .iter()
                        .map(|a| a.literal.as_deref())
                        .collect::<Option<_>>()?
                };
                let first = words.first()?;
                let program = f
                    .program
                    .as_deref()
                    .unwrap_or_else(|| first.rsplit('/').next().unwrap_or(first));
                matches(program, &words[1..]).then(|| words.join(" "))
            })
            .collect()
    }
}

/// Directories of caches and build artifacts: removing them (or what is
/// in them) cleans the environment.
const CACHES: &[&str] = &[
    "target",
    "node_modules",
    ".cache",
    "__pycache__",
    ".pytest_cache",
    ".mypy_cache",
    ".ruff_cache",
    ".tox",
    ".venv",
    "venv",
    ".gradle",
    "build",
    "dist",
    ".next",
];

/// Whether `path` is, or is inside, a cache or build artifact: one of
/// [`CACHES`], or compiled Python.
fn is_cache_path(path: &str) -> bool {
    path.split('/').any(|part| CACHES.contains(&part))
        || path.ends_with(".pyc")
        || path.ends_with(".pyo")
}

/// Whether `program` run with `args` repairs the environment.
fn is_repair(program: &str, args: &[&str]) -> bool {
    let operands: Vec<&str> = args
        .iter()
        .copied()
        .filter(|a| !a.starts_with('-'))
        .collect();
    let first = operands.first().copied().unwrap_or_default();
    let second = operands.get(1).copied().unwrap_or_default();
    let has = |flag: &str| args.contains(&flag);
    match program {
        "cargo" | "go" => first == "clean",
        "npm" | "pnpm" | "yarn" => {
            matches!(first, "cache" | "ci" | "rebuild") || (first == "store" && second == "prune")
        }
        "pip" | "pip3" => {
            (first == "cache" && matches!(second, "purge" | "remove"))
                || (first == "install" && has("--force-reinstall"))
        }
        "python" | "python3" => args.windows(3).any(|w| {
            w[0] == "-m"
                && w[1] == "pip"
                && (w[2] == "cache" || (w[2] == "install" && has("--force-reinstall")))
        }),
        "apt" | "apt-get" => {
            matches!(first, "clean" | "autoclean" | "autoremove")
                || (first == "install" && (has("--reinstall") || has("-f") || has("--fix-broken")))
        }
        "dpkg" => has("--configure") && has("-a"),
        "ccache" => has("-C") || has("--clear"),
        "git" => first == "clean",
        "rm" => !operands.is_empty() && operands.iter().all(|p| is_cache_path(p)),
        "find" => has("-delete") && args.iter().any(|a| is_cache_path(a.trim_matches('*'))),
        _ => false,
    }
}

/// Whether `program` run with `args` installs something on the host.
fn is_install(program: &str, args: &[&str]) -> bool {
    let operands: Vec<&str> = args
        .iter()
        .copied()
        .filter(|a| !a.starts_with('-'))
        .collect();
    let first = operands.first().copied().unwrap_or_default();
    let global = args
        .iter()
        .any(|a| matches!(*a, "-g" | "--global" | "--location=global"));
    match program {
        "apt" | "apt-get" | "aptitude" | "dnf" | "yum" | "zypper" | "brew" | "pipx" | "gem" => {
            first == "install"
        }
        "apk" => first == "add",
        "pip" | "pip3" => first == "install",
        "uv" => first == "pip" && operands.get(1) == Some(&"install") || first == "tool",
        "python" | "python3" => args
            .windows(3)
            .any(|w| w[0] == "-m" && w[1] == "pip" && w[2] == "install"),
        "cargo" | "go" => first == "install",
        "rustup" => {
            matches!(first, "toolchain" | "component" | "target")
                && matches!(operands.get(1).copied(), Some("install" | "add"))
        }
        "npm" | "pnpm" | "yarn" => global && matches!(first, "install" | "i" | "add"),
        _ => false,
    }
}

/// What the dev rules made of an action.
pub(crate) struct Outcome {
    pub risk: RiskClass,
    pub rule: String,
    pub reasons: Vec<String>,
}

/// One finding, judged.
struct Judged {
    /// The command it is about, as written.
    command: String,
    risk: RiskClass,
    rule: String,
    reason: String,
    /// A class-3 pattern of the dev rules decided it.
    pattern: bool,
}

/// The line `command` (classified as `report`) run on `host`.
pub(crate) fn assess_shell(
    rules: &ShellRules,
    host: &BuildHost,
    command: &str,
    report: &ShellReport,
) -> Outcome {
    if let Some(op) = host.git_network_op(command) {
        let what = match op {
            GitNetwork::Fetch => "fetching the project's repository".to_string(),
            GitNetwork::Push { branch } => format!(
                "pushing the agent's branch `{branch}` to the project's repository, without force"
            ),
        };
        return Outcome {
            risk: RiskClass::ReversibleLow,
            rule: RULE_HARNESS_GIT.into(),
            reasons: vec![
                format!("the harness's own git line: {what} is class 2 (D4, D6)"),
                on_build_host(host),
            ],
        };
    }
    let judged: Vec<Judged> = report
        .commands
        .iter()
        .map(|f| judge(rules, host, f, 0))
        .collect();
    let pattern = judged.iter().any(|j| j.pattern);
    if !pattern && let Some(test) = test_run(host, command) {
        return Outcome {
            risk: RiskClass::ReadOnly,
            rule: RULE_TEST.into(),
            reasons: vec![
                format!(
                    "`{test}` is a test command of {}: running the project's tests in its workspace is class 1 (D6)",
                    host.project
                ),
                on_build_host(host),
            ],
        };
    }
    let risk = judged
        .iter()
        .map(|j| j.risk)
        .max()
        .unwrap_or(RiskClass::ReadOnly);
    let deciding = judged
        .iter()
        .find(|j| j.risk == risk && j.pattern)
        .or_else(|| judged.iter().find(|j| j.risk == risk));
    let Some(deciding) = deciding else {
        return Outcome {
            risk: RiskClass::ConfigMutation,
            rule: "shell".into(),
            reasons: vec!["the shell classifier found no command in it".into()],
        };
    };
    Outcome {
        risk,
        rule: deciding.rule.clone(),
        reasons: vec![
            format!("`{}`: {}", deciding.command, deciding.reason),
            on_build_host(host),
        ],
    }
}

/// A file tool on `host`: a write strictly inside the workspace is class
/// 2; anything else is left to the usual rules (`None`).
pub(crate) fn assess_file(host: &BuildHost, op: &FileOp) -> Option<Outcome> {
    let FileOp::Write { path, .. } = op else {
        return None;
    };
    let normal = resolve_path(&Dir::Unknown, false, path)?;
    inside(&host.workspace, &normal).then(|| Outcome {
        risk: RiskClass::ReversibleLow,
        rule: RULE_CONTAINED.into(),
        reasons: vec![
            format!(
                "file.write of `{path}`, inside the workspace {}: editing the workspace is class 2 (D6)",
                host.workspace
            ),
            on_build_host(host),
        ],
    })
}

fn on_build_host(host: &BuildHost) -> String {
    format!(
        "{} is the build host of {} (workspace {}): the dev agent's classes apply (D6)",
        host.name, host.project, host.workspace
    )
}

/// Whether `path` (normalised) is strictly below `root`.
fn inside(root: &str, path: &str) -> bool {
    path.strip_prefix(root)
        .is_some_and(|rest| rest.len() > 1 && rest.starts_with('/'))
}

/// How deep `ssh-agent COMMAND` is followed ([`through_agent`]).
const MAX_AGENT_DEPTH: usize = 4;

fn judge(rules: &ShellRules, host: &BuildHost, f: &SimpleFinding, depth: usize) -> Judged {
    if let Some(inner) = through_agent(rules, host, f, depth) {
        return inner;
    }
    let judged = |risk, rule: &str, reason: String, pattern| Judged {
        command: f.command.clone(),
        risk,
        rule: rule.to_string(),
        reason,
        pattern,
    };
    if let Some((rule, reason)) = class3_pattern(rules, f) {
        return judged(f.risk.max(RiskClass::ConfigMutation), rule, reason, true);
    }
    match f.risk {
        RiskClass::ReadOnly => judged(f.risk, &f.rule, f.reason.clone(), false),
        _ if f.kind == FindingKind::Incomplete => judged(
            f.risk,
            &f.rule,
            format!(
                "{}: not lowered on a build host, since what it runs cannot be read",
                f.reason
            ),
            false,
        ),
        RiskClass::ReversibleLow | RiskClass::ConfigMutation => judged(
            RiskClass::ReversibleLow,
            RULE_CONTAINED,
            format!(
                "{} ({}): a change on the project's own build host, which is the boundary (D7): class 2",
                f.reason, f.rule
            ),
            false,
        ),
        RiskClass::Destructive => match cleanup(rules, host, f) {
            Cleanup::Inside(paths) => judged(
                RiskClass::ReversibleLow,
                RULE_CONTAINED,
                format!(
                    "{} ({}), only inside {}: cleaning the workspace, scratch space or caches is class 2 (D3, D6)",
                    f.reason,
                    f.rule,
                    paths.join(", ")
                ),
                false,
            ),
            Cleanup::Outside(why) => judged(
                RiskClass::Destructive,
                RULE_OUTSIDE,
                format!(
                    "{} ({}), and {why}: not inside the workspace {}, scratch space or the login user's caches",
                    f.reason, f.rule, host.workspace
                ),
                false,
            ),
            Cleanup::Not => judged(f.risk, &f.rule, f.reason.clone(), false),
        },
    }
}

/// `ssh-agent COMMAND…` runs its command with an agent whose keys it can
/// use: what the shell tables do not look through (it is no wrapper
/// there, so a secret granted to `ssh-agent` reaches nothing else), the
/// build-host rules do, or a push could hide behind it. The command is
/// judged as the line it is, its words quoted as they were given; `None`
/// for anything but such a finding.
fn through_agent(
    rules: &ShellRules,
    host: &BuildHost,
    f: &SimpleFinding,
    depth: usize,
) -> Option<Judged> {
    if f.kind != FindingKind::Program || f.program.as_deref() != Some("ssh-agent") {
        return None;
    }
    // Its options (`-a SOCKET`, `-t LIFE`, … take a value); then the
    // command, if any.
    let words = &f.detail.words;
    let mut i = 1;
    while let Some(w) = words.get(i).and_then(|a| a.literal.as_deref()) {
        match w {
            "--" => {
                i += 1;
                break;
            }
            "-a" | "-E" | "-O" | "-P" | "-t" => i += 2,
            w if w.starts_with('-') && w.len() > 1 => i += 1,
            _ => break,
        }
    }
    let command = words.get(i.min(words.len())..).filter(|c| !c.is_empty())?;
    let computed = |why: &str| Judged {
        command: f.command.clone(),
        risk: RiskClass::Destructive,
        rule: RULE_PUSH.into(),
        reason: format!(
            "`ssh-agent` runs {why} with its keys: it can be a push, which is the harness's (D4)"
        ),
        pattern: true,
    };
    if depth >= MAX_AGENT_DEPTH {
        return Some(computed("commands nested deeper than the rules follow"));
    }
    let Some(parts) = command
        .iter()
        .map(|a| a.literal.as_deref().map(quote))
        .collect::<Option<Vec<String>>>()
    else {
        return Some(computed("a command computed when it runs"));
    };
    let report = crate::shell::classify(rules, &parts.join(" "));
    let judged: Vec<Judged> = report
        .commands
        .iter()
        .map(|inner| judge(rules, host, inner, depth + 1))
        .collect();
    let risk = judged.iter().map(|j| j.risk).max()?;
    let mut deciding = judged
        .into_iter()
        .filter(|j| j.risk == risk)
        .max_by_key(|j| j.pattern)?;
    deciding.reason = format!("under `ssh-agent`: {}", deciding.reason);
    Some(deciding)
}

/// `s` as one single-quoted shell word.
fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The class-3 patterns of the dev rules: the rule id and why.
fn class3_pattern(rules: &ShellRules, f: &SimpleFinding) -> Option<(&'static str, String)> {
    // Reaching or sending to another host, whichever rule decided.
    if f.rule.starts_with("ssh.")
        || f.rule.starts_with("send.")
        || f.detail
            .matched
            .iter()
            .any(|(id, _)| id.starts_with("ssh.") || id.starts_with("send."))
    {
        return Some((
            RULE_SSH,
            format!(
                "it reaches another host from the build host ({}): outside the item's repository and its build host (D6)",
                f.rule
            ),
        ));
    }
    // Writing SSH's keys or configuration changes how the build host
    // reaches others (and who reaches it), the way to the harness's pushes
    // included.
    if f.risk > RiskClass::ReadOnly
        && let Some(word) = f
            .detail
            .words
            .iter()
            .skip(usize::from(f.kind == FindingKind::Program))
            .find(|a| {
                a.literal.as_deref().is_some_and(|w| {
                    let w = w.trim_end_matches('/');
                    w.contains(".ssh/") || w.ends_with(".ssh")
                })
            })
    {
        return Some((
            RULE_SSH,
            format!(
                "it changes `{}`: SSH's keys and configuration say how the build host reaches other hosts and who reaches it",
                word.raw
            ),
        ));
    }
    if f.kind != FindingKind::Program {
        return None;
    }
    let program = f.program.as_deref()?;
    if matches!(program, "mosh" | "autossh") {
        return Some((
            RULE_SSH,
            "reaches another host from the build host: outside the item's repository and build host (D6)".into(),
        ));
    }
    if program == "git" {
        return git_pattern(rules, f);
    }
    publish_pattern(rules, program, f)
}

/// `git push` of any kind, remotes, and the settings that say where git
/// connects and how it authenticates.
fn git_pattern(rules: &ShellRules, f: &SimpleFinding) -> Option<(&'static str, String)> {
    let words = &f.detail.words;
    let push = |why: &str| {
        Some((
            RULE_PUSH,
            format!(
                "{why}: pushing is the harness's (D4); a push a model chose is never handed the key"
            ),
        ))
    };
    // `git -c alias.x=push x`: an alias defined for this run can be a
    // push under any name.
    let alias = |v: Option<&str>| v.is_none_or(|v| v.to_ascii_lowercase().starts_with("alias."));
    let mut i = 1;
    while let Some(w) = words.get(i).map(|a| a.literal.as_deref()) {
        match w {
            Some("-c" | "--config-env") => {
                if alias(words.get(i + 1).and_then(|a| a.literal.as_deref())) {
                    return push("it defines a git alias for this run, which can be a push");
                }
                i += 2;
            }
            Some(w) if w.starts_with("--config-env=") => {
                if alias(w.strip_prefix("--config-env=")) {
                    return push("it defines a git alias for this run, which can be a push");
                }
                i += 1;
            }
            Some("-C" | "--git-dir" | "--work-tree" | "--namespace") => i += 2,
            Some(w) if w.starts_with('-') => i += 1,
            _ => break,
        }
    }
    let (_, positionals) = f.detail.split(rules, "git")?;
    let word = |n: usize| positionals.get(n).map(|a| a.literal.as_deref());
    let sub = match word(0) {
        None => return None,
        Some(None) => {
            return push("the git subcommand is computed when it runs, and can be `push`");
        }
        Some(Some(s)) => s,
    };
    match sub {
        "push" | "send-pack" | "http-push" => push("`git push`"),
        "subtree" | "lfs" if word(1) == Some(Some("push")) => push("a push"),
        "remote"
            if matches!(
                word(1),
                Some(None | Some("add" | "set-url" | "remove" | "rm" | "rename"))
            ) =>
        {
            Some((
                RULE_REMOTE,
                "it changes the repository's remotes: where the harness's pushes go".into(),
            ))
        }
        s if s.starts_with("credential") => {
            Some((RULE_REMOTE, "it handles git's stored credentials".into()))
        }
        "config" => {
            let at = words
                .iter()
                .position(|a| positionals.first().is_some_and(|p| std::ptr::eq(a, *p)))?;
            config_write(&words[at + 1..]).map(|key| {
                (
                    RULE_REMOTE,
                    format!(
                        "it sets git's `{key}`, which says where git connects, how it authenticates or what it runs"
                    ),
                )
            })
        }
        _ => None,
    }
}

/// The keys (as prefixes, lowercase) whose setting changes where git
/// connects, how it authenticates, or what it runs around a push.
const GUARDED_GIT_KEYS: [&str; 12] = [
    "remote.",
    "url.",
    "credential",
    "http.",
    "include.",
    "includeif.",
    "alias.",
    "core.sshcommand",
    "core.askpass",
    "core.hookspath",
    "core.fsmonitor",
    "core.gitproxy",
];

/// The guarded key `git config <rest>` sets, if it sets one (`<computed>`
/// for a key computed when it runs, `--edit` for an edit of the whole
/// file); `None` when it reads, or sets something else.
fn config_write(rest: &[Arg]) -> Option<String> {
    const READS: [&str; 9] = [
        "--get",
        "--get-all",
        "--get-regexp",
        "--get-urlmatch",
        "--get-color",
        "--get-colorbool",
        "--list",
        "-l",
        "--null",
    ];
    const WRITES: [&str; 6] = [
        "--add",
        "--unset",
        "--unset-all",
        "--replace-all",
        "--rename-section",
        "--remove-section",
    ];
    const WITH_VALUE: [&str; 7] = [
        "-f",
        "--file",
        "--blob",
        "--default",
        "--comment",
        "--type",
        "--value",
    ];
    let mut reads = false;
    let mut writes = false;
    let mut names: Vec<Option<&str>> = Vec::new();
    let mut i = 0;
    while i < rest.len() {
        match rest[i].literal.as_deref() {
            Some("-e" | "--edit") => return Some("--edit".into()),
            Some(o) if READS.contains(&o) => reads = true,
            Some(o) if WRITES.contains(&o) => writes = true,
            Some(o) if WITH_VALUE.contains(&o) => i += 1,
            Some(o) if o.starts_with('-') && o.len() > 1 => {}
            other => names.push(other),
        }
        i += 1;
    }
    // `git config get|list|set|unset|rename-section|remove-section|edit`
    // (git 2.46 on), or the older form: `git config NAME` reads, `git
    // config NAME VALUE` sets.
    let key = match names.first() {
        Some(Some("get" | "list")) => return None,
        Some(Some("edit")) => return Some("--edit".into()),
        Some(Some("set" | "unset" | "rename-section" | "remove-section")) => names.get(1)?,
        Some(first) if writes || (!reads && names.len() > 1) => first,
        _ => return None,
    };
    let Some(key) = key else {
        return Some("<computed>".into());
    };
    let lower = key.to_ascii_lowercase();
    let guarded = GUARDED_GIT_KEYS
        .iter()
        .any(|g| lower.starts_with(g) || lower == g.trim_end_matches('.'))
        || lower.ends_with(".pushremote")
        || (lower.starts_with("branch.") && lower.ends_with(".remote"));
    guarded.then(|| key.to_string())
}

/// Publishing commands: the program and its subcommands (words that
/// follow it).
const PUBLISH: [(&str, &[&str]); 18] = [
    ("cargo", &["publish", "yank", "owner", "login"]),
    (
        "npm",
        &[
            "publish",
            "unpublish",
            "deprecate",
            "owner",
            "dist-tag",
            "access",
            "adduser",
            "login",
            "token",
        ],
    ),
    ("pnpm", &["publish"]),
    ("yarn", &["publish", "npm publish"]),
    ("bun", &["publish"]),
    ("twine", &["upload", "register"]),
    ("gem", &["push", "yank", "owner", "signin"]),
    ("poetry", &["publish"]),
    ("uv", &["publish"]),
    ("flit", &["publish"]),
    ("hatch", &["publish"]),
    (
        "docker",
        &[
            "push",
            "image push",
            "compose push",
            "manifest push",
            "login",
        ],
    ),
    ("podman", &["push", "image push", "manifest push", "login"]),
    ("nerdctl", &["push", "image push", "login"]),
    ("buildah", &["push", "login"]),
    ("helm", &["push", "registry login"]),
    ("mvn", &["deploy"]),
    ("gradle", &["publish"]),
];

fn publish_pattern(
    rules: &ShellRules,
    program: &str,
    f: &SimpleFinding,
) -> Option<(&'static str, String)> {
    let (_, subs) = PUBLISH.iter().find(|(p, _)| *p == program)?;
    let (_, positionals) = f.detail.split(rules, program)?;
    // `cargo +nightly publish`: a toolchain first.
    let words: Vec<Option<&str>> = positionals
        .iter()
        .map(|a| a.literal.as_deref())
        .skip_while(|w| w.is_some_and(|w| w.starts_with('+')))
        .collect();
    let hit = subs.iter().find(|sub| {
        let parts: Vec<&str> = sub.split(' ').collect();
        parts.len() <= words.len() && parts.iter().zip(&words).all(|(p, w)| *w == Some(*p))
    })?;
    Some((
        RULE_PUBLISH,
        format!(
            "`{program} {hit}` publishes beyond the agent's own area (P3): outside the item's repository and build host (D6)"
        ),
    ))
}

/// What a destructive finding destroys.
enum Cleanup {
    /// Only these paths, each inside the workspace, scratch or a cache.
    Inside(Vec<String>),
    /// Something else, or something not known before it runs: why.
    Outside(String),
    /// It is not a deletion of files the rules can place.
    Not,
}

/// How a cleanup rule names what it deletes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Paths {
    /// Its operands.
    Operands,
    /// `find`'s starting points.
    FindRoots,
    /// `dd`'s `of=`.
    DdOutput,
    /// The repository git runs in (`git reset --hard`, `git clean`).
    GitRepo,
}

/// The destructive rules that delete files the rules can place, and how
/// they name them. Any other destructive rule keeps its class.
const CLEANUP: [(&str, Paths); 6] = [
    ("rm.delete", Paths::Operands),
    ("find.delete", Paths::FindRoots),
    ("truncate.empty", Paths::Operands),
    ("rsync.delete", Paths::Operands),
    ("dd.write", Paths::DdOutput),
    ("git.discard", Paths::GitRepo),
];

/// Wrappers that run a command with its own words in the same directory.
const TRANSPARENT: [&str; 13] = [
    "nohup", "setsid", "nice", "ionice", "timeout", "stdbuf", "time", "command", "builtin", "exec",
    "watch", "eval", "busybox",
];

fn cleanup(rules: &ShellRules, host: &BuildHost, f: &SimpleFinding) -> Cleanup {
    if f.reads_credentials {
        return Cleanup::Not;
    }
    let detail = &f.detail;
    let mut relative_ok = true;
    for w in &f.wrappers {
        let feeds = rules
            .wrappers
            .get(w)
            .is_some_and(|def| !def.segments.is_empty() || def.default_command.is_some())
            || w == "parallel";
        if feeds {
            return Cleanup::Outside(format!(
                "its operands come from `{w}` (its input or what it finds), not from the line"
            ));
        }
        if w == "chroot" {
            return Cleanup::Outside("under `chroot` its paths are another root's".into());
        }
        if !TRANSPARENT.contains(&w.as_str()) {
            relative_ok = false;
        }
    }
    // The words naming what it deletes, and whether the root of the
    // workspace itself may be one (a repository is the workspace).
    let (words, root_ok): (Vec<Arg>, bool) = match f.kind {
        FindingKind::Redirection => (detail.words.clone(), false),
        FindingKind::Program => {
            let destructive: Vec<&str> = detail
                .matched
                .iter()
                .filter(|(_, risk)| *risk == RiskClass::Destructive)
                .map(|(id, _)| id.as_str())
                .collect();
            let mut ways = Vec::new();
            for id in &destructive {
                match CLEANUP.iter().find(|(rule, _)| rule == id) {
                    Some((_, way)) => ways.push(*way),
                    None => return Cleanup::Not,
                }
            }
            if ways.is_empty() {
                return Cleanup::Not;
            }
            let name = f.program.as_deref().unwrap_or_default();
            let mut words = Vec::new();
            let mut root_ok = false;
            let mut git = false;
            for way in ways {
                match way {
                    Paths::Operands => match detail.split(rules, name) {
                        Some((_, operands)) => words.extend(operands.into_iter().cloned()),
                        None => return Cleanup::Not,
                    },
                    Paths::FindRoots => {
                        // What `find` deletes is below its starting points
                        // (the workspace's root may be one).
                        root_ok = true;
                        words.extend(find_roots(&detail.words));
                    }
                    Paths::DdOutput => {
                        for a in detail.words.iter().skip(1) {
                            match a.literal.as_deref() {
                                Some(w) if w.starts_with("of=") => {
                                    words.push(Arg::literal(&w["of=".len()..]));
                                }
                                Some(_) => {}
                                None => {
                                    return Cleanup::Outside(format!(
                                        "`{}` is computed when it runs",
                                        a.raw
                                    ));
                                }
                            }
                        }
                    }
                    Paths::GitRepo => git = true,
                }
            }
            if git {
                return git_repo(rules, host, f, relative_ok);
            }
            (words, root_ok)
        }
        FindingKind::Computed | FindingKind::Incomplete => return Cleanup::Not,
    };
    if words.is_empty() {
        return Cleanup::Outside("it names no path".into());
    }
    let mut paths = Vec::new();
    for arg in words {
        let Some(text) = arg.literal.as_deref() else {
            return Cleanup::Outside(format!("`{}` is computed when it runs", arg.raw));
        };
        match place(rules, host, detail, relative_ok, text, root_ok) {
            Ok(p) => paths.push(p),
            Err(why) => return Cleanup::Outside(why),
        }
    }
    Cleanup::Inside(paths)
}

/// Where `text` points, when that is inside the workspace (strictly, or
/// its root too with `root_ok`), scratch space or a cache; otherwise why
/// not.
fn place(
    rules: &ShellRules,
    host: &BuildHost,
    detail: &crate::shell::Detail,
    relative_ok: bool,
    text: &str,
    root_ok: bool,
) -> Result<String, String> {
    let rooted = text.starts_with('/') || text == "~" || text.starts_with("~/");
    if !rooted && !relative_ok {
        return Err(format!(
            "`{text}` is relative, and a wrapper around it can run it in another directory"
        ));
    }
    let Some(path) = resolve_path(&detail.dir, detail.home_known, text) else {
        return Err(if text.contains("..") || text.contains(['{', '(']) {
            format!(
                "`{text}` has `..`, braces or parentheses, so where it points is not known before it runs"
            )
        } else if !rooted {
            format!(
                "`{text}` is relative to a directory not known before it runs (after a `cd` that may fail, or one the rules do not follow: only `cd DIR && …` at the top of the line is)"
            )
        } else {
            format!("`{text}` names a home directory not known before it runs")
        });
    };
    if !glob_safe(&path) {
        return Err(format!("`{text}` has a pattern that can match `.` or `..`"));
    }
    let ws = &host.workspace;
    // The repository's own store holds its history and what was set aside
    // from earlier items (D3): deleting in it is not cleaning.
    let store = format!("{ws}/.git");
    if path == store || inside(&store, &path) || below_matches(ws, &path, ".git") {
        return Err(format!(
            "`{text}` is in the repository's `.git`, which holds its history and the work set aside from earlier items"
        ));
    }
    let contained = inside(ws, &path)
        || (root_ok && path == *ws)
        || rules.path_set("scratch").matches(&path, &rules.paths)
        || rules
            .path_set("build-host-caches")
            .matches(&path, &rules.paths);
    if contained {
        Ok(path)
    } else if path == *ws {
        Err(format!("`{text}` is the workspace's root itself"))
    } else if path == text {
        Err(format!("`{text}` is outside them"))
    } else {
        Err(format!("`{text}` is {path}, outside them"))
    }
}

/// Whether the first part of `path` below `root` is a pattern that can
/// match `name` (`/w/.g*` for `.git`).
fn below_matches(root: &str, path: &str, name: &str) -> bool {
    let Some(rest) = path.strip_prefix(root).and_then(|r| r.strip_prefix('/')) else {
        return false;
    };
    let first = rest.split('/').next().unwrap_or_default();
    first.contains(['*', '?', '['])
        && glob::Pattern::new(first).is_ok_and(|p| {
            p.matches_with(
                name,
                glob::MatchOptions {
                    case_sensitive: true,
                    require_literal_separator: true,
                    require_literal_leading_dot: true,
                },
            )
        })
}

/// Whether no part of `path` is a pattern that can match `.` or `..` (a
/// `.*` expands to both in shells before bash 5.2), nor a bracket that may
/// match a leading dot.
fn glob_safe(path: &str) -> bool {
    let options = glob::MatchOptions {
        case_sensitive: true,
        require_literal_separator: true,
        require_literal_leading_dot: true,
    };
    path.split('/')
        .filter(|part| part.contains(['*', '?', '[']))
        .all(|part| {
            !part.starts_with('[')
                && glob::Pattern::new(part)
                    .is_ok_and(|p| !p.matches_with(".", options) && !p.matches_with("..", options))
        })
}

/// `find`'s starting points: the words before its first expression (its
/// own options `-H`, `-L`, `-P`, `-D …`, `-O…` first); `.` when none.
fn find_roots(words: &[Arg]) -> Vec<Arg> {
    let mut roots = Vec::new();
    let mut i = 1;
    while let Some(a) = words.get(i) {
        match a.literal.as_deref() {
            Some("-H" | "-L" | "-P") => i += 1,
            Some("-D") => i += 2,
            Some(o) if o.starts_with("-O") => i += 1,
            _ => break,
        }
    }
    for a in &words[i.min(words.len())..] {
        match a.literal.as_deref() {
            Some(w) if w.starts_with('-') || matches!(w, "(" | ")" | "!" | ",") => break,
            _ => roots.push(a.clone()),
        }
    }
    if roots.is_empty() {
        roots.push(Arg::literal("."));
    }
    roots
}

/// `git reset --hard`, `git clean`, `git checkout -f`, `git restore`,
/// `git switch -f`, `git stash` with a discarding flag: they discard work
/// in the repository git runs in, which must be the workspace (or below
/// it, or in scratch space). Deleting branches is not cleaning (a set-aside
/// branch may be someone's work) and keeps its class.
fn git_repo(rules: &ShellRules, host: &BuildHost, f: &SimpleFinding, relative_ok: bool) -> Cleanup {
    let detail = &f.detail;
    let Some((_, positionals)) = detail.split(rules, "git") else {
        return Cleanup::Not;
    };
    let sub = positionals.first().and_then(|a| a.literal.as_deref());
    if !matches!(
        sub,
        Some("reset" | "clean" | "checkout" | "restore" | "switch" | "stash")
    ) {
        return Cleanup::Not;
    }
    // Where git runs: the line's directory, then each `-C` in turn; and
    // any `--git-dir` or `--work-tree` named.
    let mut dir = detail.dir.clone();
    let mut named: Vec<&str> = Vec::new();
    let words = &detail.words;
    let mut i = 1;
    while let Some(a) = words.get(i) {
        let Some(w) = a.literal.as_deref() else {
            return Cleanup::Outside(format!("`{}` is computed when it runs", a.raw));
        };
        if !w.starts_with('-') {
            break;
        }
        let value = |i: usize| words.get(i).and_then(|a| a.literal.as_deref());
        match w {
            "-C" => {
                let Some(to) = value(i + 1) else {
                    return Cleanup::Outside(
                        "the directory given to `git -C` is computed when it runs".into(),
                    );
                };
                if !relative_ok && !to.starts_with('/') {
                    return Cleanup::Outside(format!(
                        "`{to}` is relative, and a wrapper around it can run it in another directory"
                    ));
                }
                dir = resolve_path(&dir, detail.home_known, to).map_or(Dir::Unknown, Dir::At);
                i += 2;
            }
            "--git-dir" | "--work-tree" => {
                match value(i + 1) {
                    Some(v) => named.push(v),
                    None => {
                        return Cleanup::Outside(format!(
                            "the value of `{w}` is computed when it runs"
                        ));
                    }
                }
                i += 2;
            }
            "-c" | "--namespace" | "--config-env" => i += 2,
            w if w.starts_with("--git-dir=") || w.starts_with("--work-tree=") => {
                named.extend(w.split_once('=').map(|(_, v)| v));
                i += 1;
            }
            _ => i += 1,
        }
    }
    let repo = match &dir {
        Dir::Login => "~".to_string(),
        Dir::At(d) => d.clone(),
        Dir::Unknown => {
            return Cleanup::Outside(
                "the repository it runs in is not known before it runs (after a `cd` that may fail, or one the rules do not follow: only `cd DIR && …` at the top of the line is)".into(),
            );
        }
    };
    let mut paths = Vec::new();
    for text in std::iter::once(repo.as_str()).chain(named) {
        match place(rules, host, detail, relative_ok, text, true) {
            Ok(p) => paths.push(p),
            Err(why) => return Cleanup::Outside(why),
        }
    }
    Cleanup::Inside(paths)
}

/// Whether `command` runs one of `host`'s test commands: exactly, or
/// after a `cd` into the workspace (`cd /w && cargo test`, `cd /w;
/// cargo test`); the test command named.
fn test_run<'h>(host: &'h BuildHost, command: &str) -> Option<&'h str> {
    let command = command.trim();
    let declared = |line: &str| {
        host.test_commands
            .iter()
            .map(|t| t.trim())
            .find(|t| *t == line)
    };
    if let Some(t) = declared(command) {
        return Some(t);
    }
    let rest = command.strip_prefix("cd")?;
    if !rest.starts_with([' ', '\t']) {
        return None;
    }
    let (dir, rest) = first_word(rest.trim_start())?;
    let rest = rest.trim_start();
    let rest = rest.strip_prefix("&&").or_else(|| rest.strip_prefix(';'))?;
    let dir = resolve_path(&Dir::Unknown, false, dir)?;
    if dir != host.workspace && !inside(&host.workspace, &dir) {
        return None;
    }
    declared(rest.trim())
}

/// A plain word at the start of `text` (single-quoted, or of characters
/// the shell takes as they are) and what follows it; `None` for anything
/// the shell would expand or split.
fn first_word(text: &str) -> Option<(&str, &str)> {
    if let Some(quoted) = text.strip_prefix('\'') {
        let end = quoted.find('\'')?;
        let rest = &quoted[end + 1..];
        return rest
            .starts_with([' ', '\t', ';', '&'])
            .then_some((&quoted[..end], rest));
    }
    let end = text
        .find(|c: char| {
            !(c.is_ascii_alphanumeric()
                || matches!(c, '/' | '.' | '_' | '-' | '+' | '@' | '%' | ':' | ',' | '='))
        })
        .unwrap_or(text.len());
    let rest = &text[end..];
    (end > 0 && rest.starts_with([' ', '\t', ';', '&'])).then_some((&text[..end], rest))
}

#[cfg(test)]
mod tests;
