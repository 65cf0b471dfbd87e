//! The workspace on the project's build host (seed Nisse D3), prepared by
//! the harness when an item becomes active, before the model sees it.
//!
//! Preparing is one harness operation: a fixed script, built by code from
//! the project's configuration and quoted word by word, run on the build
//! host through the same gates as everything else (the classifier, a
//! permit, the executor's walls). It
//! - sets aside anything a previous item left (uncommitted changes as a
//!   commit under `refs/nisse/set-aside/<item>/worktree`, local branches
//!   with commits the remote does not have under `…/branches/<name>`),
//!   never discarding it, and reports each;
//! - fetches the repository and puts the workspace on a branch of the
//!   item's own at the latest base branch, with a clean tree (build
//!   artifacts never survive into a new item);
//! - reads which toolchains the project's files call for (`Cargo.toml`,
//!   `pyproject.toml`, `package.json`, or `.nisse/toolchain` listing
//!   commands) and their versions, which become facts in the item's log
//!   before any planning.
//!
//! Git reaches Gitea with the project's push key, written by the executor
//! to the script's standard input and loaded into an `ssh-agent` that
//! lives exactly as long as the script (`ssh-agent sh -c …`): it is never
//! on a command line, in the environment of any other command, or on
//! disk. Git runs with hooks and the repository's own ssh command turned
//! off, so nothing a model left in `.git/` runs with the key loaded.

use serde_json::json;

use nisse_bus::proto::{AgreedScope, ClassifyVerdict, ExecResult, ExecStatus};
use nisse_core::gate::ExecFor;
use nisse_core::markdown::{code, md_escape as md};
use nisse_core::{Actor, BrainSettings, Event, Say, State, StoreError, Transition, Txn, WorkItem};
use nisse_policy::{Action, Scope};

use crate::brain::{DevDuties, HARNESS_PREFIX};
use crate::config::Project;
use crate::issues::{ItemRecord, Phase, item_record, save_item};

/// How long the preparation may run (a first clone of a large repository).
const PREPARE_TIMEOUT_MS: u64 = 15 * 60 * 1000;

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

/// `s` as one word for a POSIX shell.
pub(crate) fn sh_quote(s: &str) -> String {
    if !s.is_empty()
        && s.chars().all(|c| {
            c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/' | ':' | '@' | '=')
        })
    {
        return s.to_string();
    }
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// The branch an item's work starts on: never the default branch (D4).
pub(crate) fn item_branch(rec: &ItemRecord) -> String {
    format!("nisse/issue-{}", rec.number)
}

/// The git invocation every harness script uses: no hooks, no ssh command
/// but ssh with the project's known hosts, no prompts.
fn git(project: &Project) -> String {
    let ssh = match &project.git_known_hosts {
        Some(path) => format!(
            "ssh -o BatchMode=yes -o StrictHostKeyChecking=yes -o UserKnownHostsFile={}",
            sh_quote(path)
        ),
        None => "ssh -o BatchMode=yes -o StrictHostKeyChecking=yes".to_string(),
    };
    format!(
        "git -c core.hooksPath=/dev/null -c core.sshCommand={} -c credential.helper=",
        sh_quote(&ssh)
    )
}

/// Wraps `script` so that it runs with the push key (on standard input)
/// in an agent of its own, for that run only.
fn with_key(script: &str) -> String {
    format!(
        "ssh-agent sh -c {}",
        sh_quote(&format!(
            "ssh-add -q - >/dev/null 2>&1 || {{ echo 'nisse: error the key on standard input was refused by ssh-add' >&2; exit 70; }}\n{script}"
        ))
    )
}

/// The preparation script for `rec`'s item (see the module's doc).
pub(crate) fn prepare_script(project: &Project, rec: &ItemRecord, item_number: i64) -> String {
    let git = git(project);
    let ws = sh_quote(&project.workspace);
    let url = sh_quote(&project.clone_url);
    let base = sh_quote(&project.base_branch);
    let branch = sh_quote(&item_branch(rec));
    let aside = sh_quote(&format!("refs/nisse/set-aside/item-{item_number}"));
    let script = format!(
        r#"set -eu
export GIT_TERMINAL_PROMPT=0
ws={ws}; url={url}; base={base}; branch={branch}; aside={aside}
if [ -d "$ws/.git" ]; then
  cd "$ws"
  if [ -n "$(git status --porcelain --untracked-files=all)" ]; then
    git add -A
    tree=$(git write-tree)
    if parent=$(git rev-parse -q --verify HEAD); then
      kept=$(git commit-tree "$tree" -p "$parent" -m "Set aside by nisse-dev before item #{item_number}")
    else
      kept=$(git commit-tree "$tree" -m "Set aside by nisse-dev before item #{item_number}")
    fi
    git update-ref "$aside/worktree" "$kept"
    cd {ws} && git reset -q --hard
    echo "nisse: set-aside $aside/worktree uncommitted changes"
  fi
  {git} fetch -q --prune "$url" "+refs/heads/*:refs/remotes/origin/*"
  for b in $(git for-each-ref --format='%(refname:short)' refs/heads/); do
    n=$(git rev-list --count "$b" --not --remotes=origin)
    if [ "$n" != 0 ]; then
      git update-ref "$aside/branches/$b" "refs/heads/$b"
      echo "nisse: set-aside $aside/branches/$b branch $b with $n commit(s) not in the repository"
    fi
  done
else
  mkdir -p "$ws"
  {git} clone -q --no-checkout "$url" "$ws"
  cd "$ws"
fi
cd {ws} && git checkout -q -f -B {branch} "refs/remotes/origin/$base"
cd {ws} && git clean -q -ffdx
echo "nisse: branch $branch"
echo "nisse: base $(git rev-parse HEAD)"
for f in ARCHITECTURE.md docs/plans; do
  if [ -e "$f" ]; then echo "nisse: document $f"; fi
done
tool() {{ if v=$("$@" 2>&1 | head -n 1); then echo "nisse: tool $1 $v"; else echo "nisse: tool $1 missing"; fi; }}
if [ -f Cargo.toml ]; then tool cargo --version; tool rustc --version; fi
if [ -f pyproject.toml ]; then tool python3 --version; fi
if [ -f package.json ]; then tool node --version; tool npm --version; fi
if [ -f .nisse/toolchain ]; then
  while read -r t; do case "$t" in ''|'#'*) ;; *) tool "$t" --version;; esac; done < .nisse/toolchain
fi
tool git --version
"#
    );
    with_key(&script)
}

/// What the preparation reported, read from its `nisse:` lines.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Prepared {
    /// Refs things were set aside under, with what each holds.
    pub set_aside: Vec<(String, String)>,
    /// The item's branch.
    pub branch: Option<String>,
    /// The base commit.
    pub base: Option<String>,
    /// The project's documents present (`ARCHITECTURE.md`, `docs/plans`).
    pub documents: Vec<String>,
    /// Toolchains and their versions (`missing` when absent).
    pub tools: Vec<(String, String)>,
}

impl Prepared {
    /// Reads the script's standard output.
    pub(crate) fn parse(stdout: &str) -> Self {
        let mut out = Self::default();
        for line in stdout.lines() {
            let Some(rest) = line.strip_prefix("nisse: ") else {
                continue;
            };
            let (what, rest) = rest.split_once(' ').unwrap_or((rest, ""));
            match what {
                "set-aside" => {
                    let (r, desc) = rest.split_once(' ').unwrap_or((rest, ""));
                    out.set_aside.push((r.to_string(), desc.to_string()));
                }
                "branch" => out.branch = Some(rest.to_string()),
                "base" => out.base = Some(rest.to_string()),
                "document" => out.documents.push(rest.to_string()),
                "tool" => {
                    let (t, v) = rest.split_once(' ').unwrap_or((rest, ""));
                    out.tools.push((t.to_string(), v.to_string()));
                }
                _ => {}
            }
        }
        out
    }
}

impl DevDuties {
    /// The active item starts: its build host is bound and its workspace
    /// prepared, once.
    pub(crate) fn start_active(
        &mut self,
        brain: &BrainSettings,
        txn: &mut Txn<'_, '_>,
    ) -> Result<(), StoreError> {
        let Some(item) = txn.active_item()? else {
            return Ok(());
        };
        let Some(mut rec) = item_record(txn, &item.id)? else {
            return Ok(());
        };
        if rec.phase != Phase::Queued {
            return Ok(());
        }
        let Some(project) = self.config.projects.get(&rec.project).cloned() else {
            return Ok(());
        };
        let me = Actor::agent(&brain.agent);
        txn.bind_hosts(
            &brain.agent,
            &item,
            &me,
            [project.build_host.clone()],
            &format!("the build host of project {}", rec.project),
        )?;
        let action = prepare_action(&project, &rec, item.number)?;
        let request_id = harness_id(&item, "prepare");
        txn.emit_classify(
            &brain.agent,
            &item.id,
            &format!("{request_id}:classify"),
            &action,
            None,
            Some(scope_of(&item, &project)),
        )?;
        rec.phase = Phase::Preparing;
        save_item(txn, &item.id, &rec)
    }

    /// A verdict on one of the harness's own actions.
    pub(crate) fn harness_verdict(
        &mut self,
        brain: &BrainSettings,
        txn: &mut Txn<'_, '_>,
        verdict: &ClassifyVerdict,
    ) -> Result<(), StoreError> {
        let Some((item, rec, project)) = self.harness_target(txn, &verdict.request_id)? else {
            return Ok(());
        };
        txn.append(
            &item.id,
            &Actor {
                kind: nisse_core::ActorKind::Service,
                id: "classifier".into(),
            },
            &nisse_core::plans::verdict_event(verdict, 0, 0, "harness"),
        )?;
        if rec.phase != Phase::Preparing {
            return Ok(());
        }
        let action = prepare_action(&project, &rec, item.number)?;
        let contained = [project.build_host.clone()];
        let scope = Scope {
            plan: None,
            operator_confirmed: false,
            contained: &contained,
        };
        match nisse_core::gate::permit_for(verdict, &action, scope) {
            Ok(permit) => {
                let base = harness_id(&item, "prepare");
                txn.emit_exec_with_timeout(
                    permit,
                    ExecFor {
                        agent: &brain.agent,
                        work_item_id: &item.id,
                        request_id: &format!("{base}:exec"),
                        verdict_request_id: &verdict.request_id,
                        revision: 0,
                        step: 0,
                        phase: "prepare",
                        attempt: 0,
                    },
                    PREPARE_TIMEOUT_MS,
                )
            }
            Err(halt) => self.harness_halted(
                brain,
                txn,
                &item,
                &format!(
                    "preparing the workspace was not permitted: {}",
                    halt.explain()
                ),
            ),
        }
    }

    /// The executor's result for one of the harness's own actions.
    pub(crate) fn harness_result(
        &mut self,
        brain: &BrainSettings,
        txn: &mut Txn<'_, '_>,
        result: &ExecResult,
    ) -> Result<(), StoreError> {
        let Some((item, mut rec, project)) = self.harness_target(txn, &result.request_id)? else {
            return Ok(());
        };
        if rec.phase != Phase::Preparing {
            return Ok(());
        }
        let status = ExecStatus::try_from(result.status).unwrap_or_default();
        let stdout = String::from_utf8_lossy(&result.stdout);
        if status != ExecStatus::Completed || result.exit_code != 0 {
            let stderr = String::from_utf8_lossy(&result.stderr);
            let why = match status {
                ExecStatus::Completed => format!(
                    "preparing the workspace on {} failed (exit {}): {}",
                    project.build_host,
                    result.exit_code,
                    stderr
                        .lines()
                        .rev()
                        .find(|l| !l.trim().is_empty())
                        .unwrap_or("no output")
                ),
                _ => format!(
                    "preparing the workspace on {} did not run: {}",
                    project.build_host, result.reason
                ),
            };
            return self.harness_halted(brain, txn, &item, &why);
        }
        let prepared = Prepared::parse(&stdout);
        let me = Actor::agent(&brain.agent);
        for (r, what) in &prepared.set_aside {
            txn.append(
                &item.id,
                &me,
                &Event::Fact {
                    text: format!("set aside in the workspace: {what}, kept under {r}"),
                    data: json!({ "set_aside": r, "what": what }),
                },
            )?;
        }
        for (tool, version) in &prepared.tools {
            txn.append(
                &item.id,
                &me,
                &Event::Fact {
                    text: format!("toolchain on {}: {tool}: {version}", project.build_host),
                    data: json!({ "tool": tool, "version": version, "host": project.build_host }),
                },
            )?;
        }
        let event = txn.append(
            &item.id,
            &me,
            &Event::Fact {
                text: format!(
                    "the workspace {} on {} is on branch {} at {} of {} (documents: {})",
                    project.workspace,
                    project.build_host,
                    prepared.branch.as_deref().unwrap_or("?"),
                    prepared.base.as_deref().unwrap_or("?"),
                    project.base_branch,
                    if prepared.documents.is_empty() {
                        "none".to_string()
                    } else {
                        prepared.documents.join(", ")
                    }
                ),
                data: json!({
                    "workspace": project.workspace,
                    "branch": prepared.branch,
                    "base": prepared.base,
                    "documents": prepared.documents,
                }),
            },
        )?;
        if !prepared.set_aside.is_empty() {
            let list = prepared
                .set_aside
                .iter()
                .map(|(r, what)| format!("- {} under {}", md(what), code(r)))
                .collect::<Vec<_>>()
                .join("\n");
            txn.say(
                &brain.agent,
                &item,
                event,
                Say::notice(format!(
                    "🗃️ The workspace on {} held work from before; nothing was discarded, it is set aside:\n{list}",
                    code(&project.build_host)
                )),
            )?;
        }
        rec.phase = Phase::Started;
        save_item(txn, &item.id, &rec)?;
        txn.loop_open(brain.agent_loop(), &item, "the workspace is ready")
    }

    /// The item, its record and project that a harness request id names.
    fn harness_target(
        &self,
        txn: &Txn<'_, '_>,
        request_id: &str,
    ) -> Result<Option<(WorkItem, ItemRecord, Project)>, StoreError> {
        let Some(rest) = request_id.strip_prefix(HARNESS_PREFIX) else {
            return Ok(None);
        };
        let Some((item_id, _)) = rest.split_once(':') else {
            return Ok(None);
        };
        let (Some(item), Some(rec)) = (txn.item(item_id)?, item_record(txn, item_id)?) else {
            return Ok(None);
        };
        let Some(project) = self.config.projects.get(&rec.project).cloned() else {
            return Ok(None);
        };
        Ok(Some((item, rec, project)))
    }

    /// A harness operation could not go on: the item waits on the
    /// operator, who is told why.
    fn harness_halted(
        &mut self,
        brain: &BrainSettings,
        txn: &mut Txn<'_, '_>,
        item: &WorkItem,
        why: &str,
    ) -> Result<(), StoreError> {
        let me = Actor::agent(&brain.agent);
        let event = txn.append(
            &item.id,
            &me,
            &Event::Fact {
                text: why.to_string(),
                data: json!({ "halted": why }),
            },
        )?;
        if let Some(mut rec) = item_record(txn, &item.id)? {
            // `retry` (or the next activation) prepares it again.
            rec.phase = Phase::Queued;
            save_item(txn, &item.id, &rec)?;
        }
        if matches!(item.state, State::Active | State::Ready) {
            txn.transition(&item.id, Transition::AwaitOperator, why, &me)?;
        }
        txn.say(
            &brain.agent,
            item,
            event,
            Say::notice(format!("⚠️ Item **#{}**: {}.", item.number, md(why))),
        )
    }
}

/// A harness request id: `dev:<item>:<what>`.
fn harness_id(item: &WorkItem, what: &str) -> String {
    format!("{HARNESS_PREFIX}{}:{what}", item.id)
}

/// The agreed scope of a dev item: its issue, with class 2 in scope on its
/// project's build host (D6), set by code from the configuration.
fn scope_of(item: &WorkItem, project: &Project) -> AgreedScope {
    AgreedScope {
        work_item_id: item.id.clone(),
        task: item.title.clone(),
        contained_targets: vec![project.build_host.clone()],
        ..Default::default()
    }
}

/// The preparation as an action on the build host, with the push key.
fn prepare_action(project: &Project, rec: &ItemRecord, number: i64) -> Result<Action, StoreError> {
    Action::new(
        "shell",
        &project.build_host,
        &json!({
            "command": prepare_script(project, rec, number),
            "secrets": [project.push_secret],
        }),
    )
    .map_err(|e| StoreError::Corrupt(e.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn branch_names_are_checked() {
        for ok in ["main", "nisse/issue-14", "release-1.2", "a_b"] {
            assert!(is_branch_name(ok), "{ok}");
        }
        for bad in [
            "", "-x", "a..b", "a/", "a.lock", "a b", "a@{1}", "/a", "a//b", "x/.y",
        ] {
            assert!(!is_branch_name(bad), "{bad}");
        }
    }

    #[test]
    fn quoting_keeps_one_word() {
        assert_eq!(sh_quote("/srv/work"), "/srv/work");
        assert_eq!(sh_quote("it's"), "'it'\\''s'");
        assert_eq!(sh_quote(""), "''");
        assert_eq!(sh_quote("a b;rm -rf /"), "'a b;rm -rf /'");
    }

    #[test]
    fn the_scripts_report_is_read() {
        let p = Prepared::parse(
            "noise\nnisse: set-aside refs/nisse/set-aside/item-3/worktree uncommitted changes\nnisse: branch nisse/issue-14\nnisse: base abc\nnisse: document ARCHITECTURE.md\nnisse: tool cargo cargo 1.95.0\nnisse: tool node missing\n",
        );
        assert_eq!(
            p.set_aside,
            [(
                "refs/nisse/set-aside/item-3/worktree".to_string(),
                "uncommitted changes".to_string()
            )]
        );
        assert_eq!(p.branch.as_deref(), Some("nisse/issue-14"));
        assert_eq!(p.documents, ["ARCHITECTURE.md"]);
        assert_eq!(p.tools[1], ("node".to_string(), "missing".to_string()));
    }
}
