//! The vault's optional history (seed L10): when the vault is a git
//! repository, each applied write becomes one commit of its note, with the
//! agent and the work item in the message and the agent as author.
//!
//! History shows what an edit replaced; recovery never depends on it (the
//! host's snapshots cover that). So a failing `git` is a warning in the
//! log, never a failed write, and a `git` that hangs (a lock left by a
//! killed one) is given up after [`GIT_TIMEOUT`]. The git command line is
//! used, not a library: it is what the operator uses on the same
//! repository, and it keeps a C build (libgit2) out of Nisse.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use tokio::process::Command;

use nisse_bus::AgentName;

/// How long one `git` command may take before the commit is given up.
const GIT_TIMEOUT: Duration = Duration::from_secs(30);

/// Environment that would point `git` at another repository or identity
/// than the vault's and the agent's.
const GIT_ENV: [&str; 8] = [
    "GIT_DIR",
    "GIT_WORK_TREE",
    "GIT_INDEX_FILE",
    "GIT_OBJECT_DIRECTORY",
    "GIT_AUTHOR_NAME",
    "GIT_AUTHOR_EMAIL",
    "GIT_COMMITTER_NAME",
    "GIT_COMMITTER_EMAIL",
];

/// What one write's commit is about.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Change<'a> {
    /// The agent that wrote it: the author and committer.
    pub agent: &'a AgentName,
    /// The work item it was written for (may be empty).
    pub work_item: &'a str,
    /// Where its content came from.
    pub source: &'a str,
    /// The note, relative to the vault.
    pub path: &'a str,
}

impl Change<'_> {
    /// `<agent> <work item>: <source> (<path>)`.
    pub(crate) fn message(&self) -> String {
        let item = if self.work_item.is_empty() {
            "(no work item)"
        } else {
            self.work_item
        };
        let source = if self.source.is_empty() {
            "a note"
        } else {
            self.source
        };
        format!("{} {item}: {source} ({})", self.agent, self.path)
    }
}

/// Commits `change`'s note when `vault` is a git repository (it has a
/// `.git`); nothing when it is not, or when the note is as committed.
/// Failures are logged, never returned.
pub(crate) async fn commit(vault: &Path, change: Change<'_>) {
    if !vault.join(".git").exists() {
        return;
    }
    match try_commit(vault, change).await {
        Ok(true) => tracing::debug!(path = change.path, "committed to the vault's history"),
        Ok(false) => tracing::debug!(path = change.path, "unchanged since its last commit"),
        Err(why) => tracing::warn!(
            path = change.path,
            vault = %vault.display(),
            "the write is applied, but not in the vault's git history: {why}"
        ),
    }
}

/// Stages the note and commits it alone; `Ok(false)` when there was
/// nothing to commit.
async fn try_commit(vault: &Path, change: Change<'_>) -> Result<bool, String> {
    git(vault, change.agent, &["add", "--", change.path])
        .await?
        .success("git add")?;
    let staged = git(
        vault,
        change.agent,
        &["diff", "--cached", "--quiet", "--", change.path],
    )
    .await?;
    match staged.code {
        Some(0) => return Ok(false),
        Some(1) => {}
        _ => return Err(staged.failure("git diff --cached")),
    }
    let message = change.message();
    git(
        vault,
        change.agent,
        &[
            "commit",
            "--no-verify",
            "--no-gpg-sign",
            "--quiet",
            "-m",
            &message,
            "--",
            change.path,
        ],
    )
    .await?
    .success("git commit")?;
    Ok(true)
}

/// How a `git` command ended.
struct Ran {
    code: Option<i32>,
    stderr: String,
}

impl Ran {
    fn success(self, what: &str) -> Result<(), String> {
        if self.code == Some(0) {
            Ok(())
        } else {
            Err(self.failure(what))
        }
    }

    fn failure(&self, what: &str) -> String {
        let code = self
            .code
            .map_or_else(|| "a signal".to_string(), |c| c.to_string());
        format!("`{what}` exited with {code}: {}", self.stderr.trim())
    }
}

/// Runs `git -C <vault>` as the agent (author and committer
/// `nisse-<agent>`), with no terminal prompt and within [`GIT_TIMEOUT`].
async fn git(vault: &Path, agent: &AgentName, args: &[&str]) -> Result<Ran, String> {
    let name = format!("nisse-{agent}");
    let mut cmd = Command::new("git");
    cmd.arg("-C")
        .arg(vault)
        .arg("-c")
        .arg(format!("user.name={name}"))
        .arg("-c")
        .arg(format!("user.email={name}@nisse.invalid"))
        .args(args)
        .env("GIT_TERMINAL_PROMPT", "0")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    for var in GIT_ENV {
        cmd.env_remove(var);
    }
    let what = args.first().copied().unwrap_or("git");
    let out = tokio::time::timeout(GIT_TIMEOUT, cmd.output())
        .await
        .map_err(|_| format!("`git {what}` did not finish within {GIT_TIMEOUT:?}"))?
        .map_err(|e| format!("`git {what}` could not be run: {e}"))?;
    Ok(Ran {
        code: out.status.code(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_message_names_the_agent_the_item_the_source_and_the_note() {
        let agent: AgentName = "ops".parse().unwrap();
        let change = Change {
            agent: &agent,
            work_item: "wi-7",
            source: "driver via note",
            path: "memory/ops/facts/nas01.md",
        };
        assert_eq!(
            change.message(),
            "ops wi-7: driver via note (memory/ops/facts/nas01.md)"
        );
        let bare = Change {
            work_item: "",
            source: "",
            ..change
        };
        assert_eq!(
            bare.message(),
            "ops (no work item): a note (memory/ops/facts/nas01.md)"
        );
    }
}
