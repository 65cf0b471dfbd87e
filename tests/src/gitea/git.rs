//! The stand-in's git: real bare repositories driven through the `git`
//! command line, never through a work tree, with the user's and the
//! system's git configuration kept out.

use std::path::Path;
use std::process::Stdio;

use anyhow::Context as _;
use tokio::process::Command;

/// The `pre-receive` hook every repository gets, with `@DEFAULT@` the
/// default branch's full ref. It reads one `old new ref` line per updated
/// ref; a new id of all zeros (of whichever hash length) is a deletion.
/// The refusal for the default branch is worded as Gitea's protected
/// branch refusal.
const PRE_RECEIVE: &str = r#"#!/bin/sh
# Branch protection of the Nisse Gitea stand-in. The default branch's
# protection rule is in $GIT_DIR/nisse-protection (written by the stand-in:
# `enabled 1|0`, then `push <login>...`, the push allowlist); the pusher is
# the key's owner, which the key's forced command sets in NISSE_GITEA_USER,
# as Gitea's `gitea serv key-<id>` knows it. While the rule is enabled only
# the allowlist may update the default branch (the stand-in's own merges
# move it with git update-ref, which runs no hook). The default branch is
# never deleted, and here no branch is.
default='@DEFAULT@'
rule="${GIT_DIR:-.}/nisse-protection"
enabled=1
allowed=''
if [ -f "$rule" ]; then
    enabled=$(sed -n 's/^enabled //p' "$rule")
    allowed=$(sed -n 's/^push //p' "$rule")
fi
may_push() {
    [ "$enabled" = 0 ] && return 0
    for login in $allowed; do
        [ "$login" = "$NISSE_GITEA_USER" ] && return 0
    done
    return 1
}
refused=0
while read -r old new ref; do
    case "$new" in
    *[!0]*) deleting=no ;;
    *) deleting=yes ;;
    esac
    if [ "$ref" = "$default" ] && [ "$deleting" = yes ]; then
        echo "Gitea: Not allowed to delete the default branch ${ref#refs/heads/}" >&2
        refused=1
    elif [ "$ref" = "$default" ] && ! may_push; then
        echo "Gitea: Not allowed to push to protected branch ${ref#refs/heads/}" >&2
        refused=1
    elif [ "$deleting" = yes ]; then
        case "$ref" in
        refs/heads/*) echo "Gitea: Not allowed to delete branch ${ref#refs/heads/}: branches are never deleted here" >&2 ;;
        *) echo "Gitea: Not allowed to delete $ref" >&2 ;;
        esac
        refused=1
    fi
done
exit $refused
"#;

/// A `git` command for the bare repository `git_dir`, isolated from any
/// global or system configuration.
fn git(git_dir: &Path) -> Command {
    let mut command = Command::new("git");
    command
        .arg("--git-dir")
        .arg(git_dir)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_TERMINAL_PROMPT", "0")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    command
}

/// Sets author and committer on `command` to `login`, with Gitea's no-reply
/// address.
fn as_user(command: &mut Command, login: &str) {
    let email = format!("{login}@noreply.localhost");
    command
        .env("GIT_AUTHOR_NAME", login)
        .env("GIT_AUTHOR_EMAIL", &email)
        .env("GIT_COMMITTER_NAME", login)
        .env("GIT_COMMITTER_EMAIL", &email);
}

/// Runs `command` and returns its standard output, failing with its
/// exit status and standard error.
async fn run(mut command: Command, what: &str) -> anyhow::Result<String> {
    let program = command
        .as_std()
        .get_program()
        .to_string_lossy()
        .into_owned();
    let output = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .await
        .with_context(|| format!("running {program} to {what}: is it installed?"))?;
    if !output.status.success() {
        anyhow::bail!(
            "{program} failed ({}) to {what}: {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    String::from_utf8(output.stdout).with_context(|| format!("git's output to {what} is not UTF-8"))
}

/// Creates the bare repository at `path` with one commit by `owner` on
/// `default_branch` holding `files`, and its `pre-receive` hook.
pub(crate) async fn create_bare(
    path: &Path,
    owner: &str,
    default_branch: &str,
    files: &[(&str, &str)],
) -> anyhow::Result<()> {
    let mut init = Command::new("git");
    init.args([
        "init",
        "--quiet",
        "--bare",
        "--initial-branch",
        default_branch,
    ])
    .arg(path)
    .env("GIT_CONFIG_NOSYSTEM", "1")
    .env("GIT_CONFIG_GLOBAL", "/dev/null")
    .stdin(Stdio::null());
    run(init, &format!("create {}", path.display())).await?;

    // The files go in through a scratch work tree and index, so the bare
    // repository never gets one.
    let scratch = tempfile::tempdir().context("making a scratch work tree")?;
    for (name, contents) in files {
        let file = scratch.path().join("tree").join(name);
        if let Some(parent) = file.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("making {}", parent.display()))?;
        }
        std::fs::write(&file, contents).with_context(|| format!("writing {}", file.display()))?;
    }
    std::fs::create_dir_all(scratch.path().join("tree"))?;
    let index = scratch.path().join("index");
    let mut add = git(path);
    add.arg("--work-tree")
        .arg(scratch.path().join("tree"))
        .args(["add", "--all", "."])
        .current_dir(scratch.path().join("tree"))
        .env("GIT_INDEX_FILE", &index);
    run(add, "stage the initial files").await?;
    let mut write_tree = git(path);
    write_tree.arg("write-tree").env("GIT_INDEX_FILE", &index);
    let tree = run(write_tree, "write the initial tree").await?;
    let mut commit = git(path);
    commit.args(["commit-tree", tree.trim(), "-m", "Initial commit"]);
    as_user(&mut commit, owner);
    let commit = run(commit, "make the initial commit").await?;
    let mut update = git(path);
    update.args([
        "update-ref",
        &format!("refs/heads/{default_branch}"),
        commit.trim(),
    ]);
    run(update, "point the default branch at the initial commit").await?;

    let hook = path.join("hooks/pre-receive");
    std::fs::write(
        &hook,
        PRE_RECEIVE.replace("@DEFAULT@", &format!("refs/heads/{default_branch}")),
    )
    .with_context(|| format!("writing {}", hook.display()))?;
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&hook, std::fs::Permissions::from_mode(0o755))
            .with_context(|| format!("making {} executable", hook.display()))?;
    }
    write_protection(path, &super::Protection::default())
}

/// Writes the default branch's protection rule where the `pre-receive`
/// hook reads it.
pub(crate) fn write_protection(git_dir: &Path, rule: &super::Protection) -> anyhow::Result<()> {
    let path = git_dir.join("nisse-protection");
    let text = format!(
        "enabled {}\npush {}\n",
        u8::from(rule.enabled),
        rule.push_allowlist.join(" ")
    );
    let scratch = path.with_extension("new");
    std::fs::write(&scratch, text).with_context(|| format!("writing {}", scratch.display()))?;
    std::fs::rename(&scratch, &path).with_context(|| format!("writing {}", path.display()))
}

/// One commit as the API shows it (`PayloadCommit`).
pub(crate) struct CommitInfo {
    pub id: String,
    pub message: String,
    pub author: (String, String),
    pub committer: (String, String),
    /// The committer's date, RFC 3339 as git writes it.
    pub timestamp: String,
}

/// The commit `sha`.
pub(crate) async fn commit_info(git_dir: &Path, sha: &str) -> anyhow::Result<CommitInfo> {
    let mut command = git(git_dir);
    command.args([
        "log",
        "-1",
        "--format=%H%n%an%n%ae%n%cn%n%ce%n%cI%n%B",
        sha,
        "--",
    ]);
    let out = run(command, &format!("read commit {sha}")).await?;
    let mut lines = out.splitn(7, '\n');
    let mut next = || lines.next().unwrap_or_default().to_string();
    let (id, an, ae, cn, ce, timestamp) = (next(), next(), next(), next(), next(), next());
    Ok(CommitInfo {
        id,
        author: (an, ae),
        committer: (cn, ce),
        timestamp,
        message: next(),
    })
}

/// The commit `branch` points at, if it exists.
pub(crate) async fn branch_sha(git_dir: &Path, branch: &str) -> anyhow::Result<Option<String>> {
    let mut command = git(git_dir);
    command.args([
        "rev-parse",
        "--verify",
        "--quiet",
        &format!("refs/heads/{branch}^{{commit}}"),
    ]);
    let output = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .await
        .context("running git rev-parse: is git installed?")?;
    match output.status.code() {
        Some(0) => Ok(Some(
            String::from_utf8_lossy(&output.stdout).trim().to_string(),
        )),
        Some(1) => Ok(None),
        _ => anyhow::bail!(
            "git rev-parse of {branch} in {} failed ({}): {}",
            git_dir.display(),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        ),
    }
}

/// The full id of commit `rev` (a full or abbreviated commit id), if
/// the repository has it.
pub(crate) async fn commit_sha(git_dir: &Path, rev: &str) -> anyhow::Result<Option<String>> {
    // Only hex: anything else (a ref name, an option) is no commit id.
    if rev.is_empty() || !rev.chars().all(|c| c.is_ascii_hexdigit()) {
        return Ok(None);
    }
    let mut command = git(git_dir);
    command.args([
        "rev-parse",
        "--verify",
        "--quiet",
        &format!("{rev}^{{commit}}"),
    ]);
    let output = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .await
        .context("running git rev-parse: is git installed?")?;
    Ok(output
        .status
        .success()
        .then(|| String::from_utf8_lossy(&output.stdout).trim().to_string()))
}

/// One file a pull request changes, as Gitea's ChangedFile has it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ChangedFile {
    pub(crate) filename: String,
    pub(crate) previous_filename: Option<String>,
    /// `added`, `deleted`, `changed`, `renamed` or `copied`.
    pub(crate) status: &'static str,
    pub(crate) additions: i64,
    pub(crate) deletions: i64,
}

/// What git says about a pull request's branches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PullGit {
    pub(crate) base_sha: String,
    pub(crate) head_sha: String,
    pub(crate) merge_base: String,
    /// Whether the head merges into the base without conflicts.
    pub(crate) mergeable: bool,
    pub(crate) files: Vec<ChangedFile>,
}

impl PullGit {
    pub(crate) fn additions(&self) -> i64 {
        self.files.iter().map(|f| f.additions).sum()
    }

    pub(crate) fn deletions(&self) -> i64 {
        self.files.iter().map(|f| f.deletions).sum()
    }
}

/// Reads `base` and `head` of a pull request: their tips, merge base,
/// whether they merge cleanly and the files changed from the merge base
/// to the head (what Gitea's files view lists).
pub(crate) async fn pull_git(git_dir: &Path, base: &str, head: &str) -> anyhow::Result<PullGit> {
    let base_sha = branch_sha(git_dir, base)
        .await?
        .with_context(|| format!("the base branch {base} does not exist"))?;
    let head_sha = branch_sha(git_dir, head)
        .await?
        .with_context(|| format!("the head branch {head} does not exist"))?;
    let mut merge_base = git(git_dir);
    merge_base.args(["merge-base", &base_sha, &head_sha]);
    let merge_base = run(
        merge_base,
        &format!("find the merge base of {base} and {head}"),
    )
    .await?
    .trim()
    .to_string();
    let mut merge_tree = git(git_dir);
    merge_tree.args(["merge-tree", "--write-tree", &base_sha, &head_sha]);
    // Exit 0: clean; 1: conflicts; anything else: git failed.
    let status = merge_tree
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .await
        .context("running git merge-tree: is git installed?")?;
    let mergeable = match status.status.code() {
        Some(0) => true,
        Some(1) => false,
        _ => anyhow::bail!(
            "git merge-tree of {base} and {head} failed ({}): {}",
            status.status,
            String::from_utf8_lossy(&status.stderr).trim()
        ),
    };
    let files = changed_files(git_dir, &merge_base, &head_sha).await?;
    Ok(PullGit {
        base_sha,
        head_sha,
        merge_base,
        mergeable,
        files,
    })
}

/// The files changed from `from` to `to`, with line counts, renames
/// detected, in git's order.
async fn changed_files(git_dir: &Path, from: &str, to: &str) -> anyhow::Result<Vec<ChangedFile>> {
    let mut names = git(git_dir);
    names.args(["diff", "--name-status", "-z", "-M", from, to]);
    let names = run(names, "list the changed files").await?;
    let mut fields = names.split('\0').filter(|f| !f.is_empty());
    let mut files = Vec::new();
    while let Some(code) = fields.next() {
        let (status, renamed) = match code.chars().next() {
            Some('A') => ("added", false),
            Some('D') => ("deleted", false),
            Some('R') => ("renamed", true),
            Some('C') => ("copied", true),
            _ => ("changed", false),
        };
        let first = fields
            .next()
            .with_context(|| format!("git diff --name-status ended after {code:?}"))?;
        let (previous, filename) = if renamed {
            let second = fields
                .next()
                .with_context(|| format!("git diff --name-status gave {code:?} one path"))?;
            (Some(first.to_string()), second.to_string())
        } else {
            (None, first.to_string())
        };
        files.push(ChangedFile {
            filename,
            previous_filename: previous,
            status,
            additions: 0,
            deletions: 0,
        });
    }
    // `--numstat -z`: "added\tdeleted\tpath\0", or for a rename
    // "added\tdeleted\t\0old\0new\0"; binary files count "-".
    let mut numstat = git(git_dir);
    numstat.args(["diff", "--numstat", "-z", "-M", from, to]);
    let numstat = run(numstat, "count the changed lines").await?;
    let mut fields = numstat.split('\0');
    while let Some(record) = fields.next() {
        if record.is_empty() {
            continue;
        }
        let mut parts = record.splitn(3, '\t');
        let added = parts.next().unwrap_or("-").parse::<i64>().unwrap_or(0);
        let deleted = parts.next().unwrap_or("-").parse::<i64>().unwrap_or(0);
        let path = match parts.next() {
            Some("") => {
                let _old = fields.next();
                fields.next().unwrap_or_default()
            }
            Some(path) => path,
            None => anyhow::bail!("git diff --numstat gave {record:?}"),
        };
        if let Some(file) = files.iter_mut().find(|f| f.filename == path) {
            file.additions = added;
            file.deletions = deleted;
        }
    }
    Ok(files)
}

/// The hunk of the diff from `from` to `to` of `path` that holds `line`
/// (positive: of the new file; negative: of the old one), as a review
/// comment's `diff_hunk`; empty when no hunk holds it.
pub(crate) async fn diff_hunk(
    git_dir: &Path,
    from: &str,
    to: &str,
    path: &str,
    line: i64,
) -> anyhow::Result<String> {
    let mut diff = git(git_dir);
    diff.args(["diff", "--no-color", "-U3", from, to, "--", path]);
    let diff = run(diff, &format!("diff {path}")).await?;
    let mut hunks: Vec<String> = Vec::new();
    for text_line in diff.lines() {
        if text_line.starts_with("@@") {
            hunks.push(String::new());
        }
        if let Some(hunk) = hunks.last_mut() {
            hunk.push_str(text_line);
            hunk.push('\n');
        }
    }
    for hunk in hunks {
        // "@@ -old_start,old_len +new_start,new_len @@"
        let header = hunk.lines().next().unwrap_or_default();
        let range = |sign: char| -> Option<(i64, i64)> {
            let field = header.split(' ').find(|f| f.starts_with(sign))?;
            let mut numbers = field[1..].split(',');
            let start = numbers.next()?.parse().ok()?;
            let len = numbers.next().map_or(Some(1), |n| n.parse().ok())?;
            Some((start, len))
        };
        let (wanted, (start, len)) = if line < 0 {
            (-line, range('-').unwrap_or((0, 0)))
        } else {
            (line, range('+').unwrap_or((0, 0)))
        };
        if wanted >= start && wanted < start + len.max(1) {
            return Ok(hunk.trim_end().to_string());
        }
    }
    Ok(String::new())
}

/// Merges commit `head_sha` (the head the merge was checked at, not
/// wherever its branch is now) into branch `base` as Gitea's merge style
/// does: a merge commit by `by` with `message`, made from the trees alone
/// (`merge-tree`, `commit-tree`) and put on `base` with `update-ref`,
/// which checks that `base` did not move and runs no hook. Returns the
/// merge commit.
pub(crate) async fn merge(
    git_dir: &Path,
    base: &str,
    head_sha: &str,
    by: &str,
    message: &str,
) -> anyhow::Result<String> {
    let base_sha = branch_sha(git_dir, base)
        .await?
        .with_context(|| format!("the base branch {base} does not exist"))?;
    let mut merge_tree = git(git_dir);
    merge_tree.args(["merge-tree", "--write-tree", &base_sha, head_sha]);
    let tree = run(
        merge_tree,
        &format!("merge {head_sha} into {base} (conflicts?)"),
    )
    .await?;
    let tree = tree.lines().next().unwrap_or_default().to_string();
    let mut commit = git(git_dir);
    commit.args([
        "commit-tree",
        &tree,
        "-p",
        &base_sha,
        "-p",
        head_sha,
        "-m",
        message,
    ]);
    as_user(&mut commit, by);
    let commit = run(commit, "make the merge commit")
        .await?
        .trim()
        .to_string();
    let mut update = git(git_dir);
    update.args([
        "update-ref",
        &format!("refs/heads/{base}"),
        &commit,
        &base_sha,
    ]);
    run(update, &format!("move {base} to the merge commit")).await?;
    Ok(commit)
}

/// Generates an ed25519 key pair without passphrase at `path` and
/// `path.pub`.
pub(crate) async fn keygen(path: &Path, comment: &str) -> anyhow::Result<()> {
    let mut command = Command::new("ssh-keygen");
    command
        .args(["-q", "-t", "ed25519", "-N", "", "-C", comment, "-f"])
        .arg(path)
        .stdin(Stdio::null());
    run(command, &format!("generate the key {}", path.display()))
        .await
        .map(drop)
        .context("ssh-keygen comes with the Debian package openssh-client")
}
