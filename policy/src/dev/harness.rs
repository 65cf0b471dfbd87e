//! The dev harness's git network lines: the only commands a project's push
//! key ever reaches (seed Nisse D4, L12).
//!
//! The harness fetches the project's repository into the workspace and
//! pushes the item's branches back, on the build host, with the push key
//! handed over standard input to an `ssh-agent` that lives as long as that
//! one git command. The lines are built here, from the build host's
//! configuration alone, and recognised here by building them again: the
//! dev rules class them 2 (fetching, and pushing a branch of the agent's
//! own, `nisse/…`, without force: D6), and [`crate::Policy::secret_grant`]
//! hands the push key to nothing else, whatever the `[[secret]]` entries
//! say. The classifier and the executor both ask the policy, so a line
//! that differs by one byte gets neither the class nor the key.
//!
//! The workspace is written by a stranger (a test run is class 1 and runs
//! the project's code), so before the key is loaded the line takes away
//! what could make git run or connect elsewhere: it rewrites
//! `.git/config` to a fixed minimal one (remotes, `url.*.insteadOf`,
//! filters, includes, `core.sshCommand`, `core.fsmonitor` all gone), and
//! git runs without the system and user configuration, with hooks off,
//! with ssh's own configuration file ignored and the host key checked
//! strictly against the project's known hosts. What it cannot take away
//! is the build host's login account itself: code that ran there earlier
//! as the same user (a shell start-up file, a process left running) can
//! use the agent while the push runs. That is why the push key may push
//! only where the repository's protection lets the agent (D4: the default
//! branch refuses it), and why the build host is sealed (D7).

use serde::{Deserialize, Serialize};

use super::BuildHost;

/// How the harness reaches the project's repository from a build host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HarnessGit {
    /// The URL fetched from and pushed to (`ssh://…` or `git@host:o/n.git`).
    pub url: String,
    /// A known-hosts file on the build host holding the git server's host
    /// key; `None`: the login user's own (`~/.ssh/known_hosts`).
    pub known_hosts: Option<String>,
    /// The executor secret holding the push key.
    pub push_secret: String,
}

/// One of the harness's git network operations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GitNetwork {
    /// Fetch every branch of the repository into `refs/remotes/origin/`.
    Fetch,
    /// Push the workspace's `HEAD` to the branch `branch` (one of the
    /// agent's own, `nisse/…`), without force.
    Push {
        /// The branch, `nisse/…`.
        branch: String,
    },
}

/// The prefix every branch the harness pushes has: the agent's own
/// namespace, never the default branch or anyone else's.
pub const AGENT_BRANCH_PREFIX: &str = "nisse/";

/// The `.git/config` the line writes before the key is loaded.
const FIXED_CONFIG: [&str; 4] = [
    "[core]",
    "\trepositoryformatversion = 0",
    "\tfilemode = true",
    "\tbare = false",
];

/// The environment git runs in on the harness's lines: no system or user
/// configuration, no prompts.
pub const GIT_ENV: &str = "GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null GIT_TERMINAL_PROMPT=0";

/// The options every harness git command carries: no hooks, no file
/// system monitor, no credential helper.
pub const GIT_OPTIONS: &str =
    "-c core.hooksPath=/dev/null -c core.fsmonitor=false -c credential.helper=";

/// git as the harness runs it where it does not connect anywhere, after
/// `export`ing [`GIT_ENV`]: no hooks, no file system monitor.
pub const LOCAL_GIT: &str = "git -c core.hooksPath=/dev/null -c core.fsmonitor=false";

/// The exit code when `ssh-add` refused the key.
pub const KEY_REFUSED_EXIT: i32 = 70;

/// Whether `name` can be a branch: what `git check-ref-format --branch`
/// accepts, restricted to a portable alphabet.
pub fn is_branch_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 200
        && !name.starts_with(['-', '/', '.'])
        && !name.ends_with(['/', '.'])
        && !name.ends_with(".lock")
        && !name.contains("..")
        && !name.contains("//")
        && !name.contains("/.")
        && !name.contains("@{")
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'))
}

/// `s` as one word for a POSIX shell: as it is when it holds nothing the
/// shell reads specially, else single-quoted.
pub fn shell_word(s: &str) -> String {
    if !s.is_empty()
        && s.chars().all(|c| {
            c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/' | ':' | '@' | '=' | ',')
        })
    {
        return s.to_string();
    }
    format!("'{}'", s.replace('\'', "'\\''"))
}

impl BuildHost {
    /// The git command the harness runs on this host, key or not: its
    /// environment, options, and the ssh it connects with.
    pub fn harness_git(&self) -> String {
        let known_hosts = self
            .git
            .as_ref()
            .and_then(|g| g.known_hosts.as_deref())
            .map(|k| format!(" -o UserKnownHostsFile={}", shell_word(k)))
            .unwrap_or_default();
        let ssh = format!(
            "ssh -F /dev/null -o BatchMode=yes -o StrictHostKeyChecking=yes -o IdentityFile=none{known_hosts}"
        );
        format!(
            "env {GIT_ENV} git {GIT_OPTIONS} -c core.sshCommand={}",
            shell_word(&ssh)
        )
    }

    /// The line for `op`, or `None` when the host has no git configured or
    /// `op` pushes a branch that is not the agent's.
    pub fn git_network_line(&self, op: &GitNetwork) -> Option<String> {
        let git = self.git.as_ref()?;
        let url = shell_word(&git.url);
        let what = match op {
            GitNetwork::Fetch => {
                format!("fetch -q --prune --no-tags {url} '+refs/heads/*:refs/remotes/origin/*'")
            }
            GitNetwork::Push { branch } => {
                if !is_agent_branch(branch) {
                    return None;
                }
                format!("push -q {url} HEAD:refs/heads/{branch}")
            }
        };
        let inner = format!(
            "ssh-add -q - >/dev/null 2>&1 || {{ echo 'nisse: error the push key on standard input was refused by ssh-add' >&2; exit {KEY_REFUSED_EXIT}; }}; exec {} {what}",
            self.harness_git()
        );
        let ws = shell_word(&self.workspace);
        let config = FIXED_CONFIG
            .iter()
            .map(|l| shell_word(l))
            .collect::<Vec<_>>()
            .join(" ");
        Some(format!(
            "mkdir -p {ws}/.git && cd {ws} && printf '%s\\n' {config} > .git/config && {} init -q && ssh-agent sh -c {}",
            self.harness_git(),
            shell_word(&inner)
        ))
    }

    /// Which of the harness's git network lines `command` is, if it is
    /// one, exactly.
    pub fn git_network_op(&self, command: &str) -> Option<GitNetwork> {
        if self.git_network_line(&GitNetwork::Fetch).as_deref() == Some(command) {
            return Some(GitNetwork::Fetch);
        }
        // The branch is the one word that varies: read it from where it
        // stands, then build the line again and compare the whole.
        let (_, rest) = command.split_once(" HEAD:refs/heads/")?;
        let branch = rest.split(['\'', ' ']).next()?;
        let op = GitNetwork::Push {
            branch: branch.to_string(),
        };
        (self.git_network_line(&op).as_deref() == Some(command)).then_some(op)
    }
}

/// Whether the harness may push `branch`: one of the agent's own.
pub fn is_agent_branch(branch: &str) -> bool {
    branch
        .strip_prefix(AGENT_BRANCH_PREFIX)
        .is_some_and(|rest| !rest.is_empty())
        && is_branch_name(branch)
}
