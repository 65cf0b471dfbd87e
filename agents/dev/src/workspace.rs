//! The workspace on the project's build host (seed Nisse D3), prepared by
//! the harness when an item becomes active, before the model sees it.
//!
//! Preparing is three harness operations, each a line built by code from
//! the project's configuration (every value shell-quoted) and run on the
//! build host through the same gates as everything else (the classifier,
//! a permit, the executor's walls):
//! 1. **fetch**: the policy's own git line ([`nisse_policy::dev::harness`]),
//!    the only one the push key reaches: it makes sure the workspace is a
//!    repository, rewrites its `.git/config` to a fixed one, and fetches
//!    every branch with the key in an `ssh-agent` of its own;
//! 2. **reset**, without the key: sets aside anything a previous item left
//!    (uncommitted changes as a commit under
//!    `refs/nisse/set-aside/item-<n>/worktree`, local branches with commits
//!    the repository does not have under `…/branches/<name>`), never
//!    discarding it, and reports each; puts the workspace on the item's
//!    own branch at the latest base branch (or where the item's branch
//!    already is in the repository, when an earlier attempt pushed it),
//!    with a clean tree (build artifacts never survive into a new item);
//!    and reports the project's documents and the files that say which
//!    toolchains it needs (`Cargo.toml`, `pyproject.toml`, `package.json`,
//!    `go.mod`, or `.nisse/toolchain` listing programs);
//! 3. **preflight**, without the key: the version of each of those
//!    toolchains, which become facts in the item's log before any
//!    planning.
//!
//! Each is class 2 or less under the dev rules, on the build host, which
//! the item's agreed scope contains, so each runs on a permit without a
//! plan. Every git command runs with hooks, the file system monitor and
//! credential helpers off and without the system or user configuration
//! (the workspace and the login account are written by strangers).

use serde::{Deserialize, Serialize};
use serde_json::json;

use nisse_bus::proto::{AgreedScope, ClassifyVerdict, ExecResult, ExecStatus};
use nisse_core::gate::ExecFor;
use nisse_core::markdown::{code, md_escape as md};
use nisse_core::{Actor, BrainSettings, Event, Say, State, StoreError, Transition, Txn, WorkItem};
use nisse_policy::dev::{GitNetwork, shell_word};
use nisse_policy::{Action, BuildHost, Scope};

use crate::brain::{DevDuties, HARNESS_PREFIX};
use crate::config::Project;
use crate::issues::{ItemRecord, Phase, item_record, save_item};
use crate::protection::Gate;

/// How long fetching may run (a first fetch of a large repository).
const FETCH_TIMEOUT_MS: u64 = 15 * 60 * 1000;

/// How long a push may run.
pub(crate) const PUSH_TIMEOUT_MS: u64 = 15 * 60 * 1000;

/// How long the harness's operations that stay on the build host may run.
pub(crate) const LOCAL_TIMEOUT_MS: u64 = 5 * 60 * 1000;

/// The files whose presence says which toolchains a project needs, and the
/// programs whose versions are then recorded.
const MARKERS: [(&str, &[&str]); 4] = [
    ("Cargo.toml", &["cargo", "rustc"]),
    ("pyproject.toml", &["python3"]),
    ("package.json", &["node", "npm"]),
    ("go.mod", &["go"]),
];

/// The file in a repository that lists the programs it needs, one per
/// line (`#` starts a comment).
const TOOLCHAIN_FILE: &str = ".nisse/toolchain";

/// At most this many programs are checked.
const MAX_TOOLS: usize = 32;

/// A harness operation on the build host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum OpKind {
    /// Fetch the repository, with the push key.
    Fetch,
    /// Set aside what was left, check out the item's branch, clean.
    Reset,
    /// Record the toolchains' versions.
    Preflight,
    /// Cut a milestone's branch ([`crate::milestones`]).
    Cut,
    /// Cut a milestone's branch for `finish_milestone`, then commit.
    CutToFinish,
    /// Commit a milestone's changes.
    Commit,
    /// Push a milestone's branch, with the push key.
    Push,
    /// Commit the work of the item holding the workspace, to park it
    /// ([`crate::parking`]).
    Park,
    /// Push the parked item's branch, with the push key.
    ParkPush,
    /// Put the workspace back on a parked item's branch.
    Resume,
}

impl OpKind {
    fn as_str(self) -> &'static str {
        match self {
            Self::Fetch => "fetch",
            Self::Reset => "reset",
            Self::Preflight => "preflight",
            Self::Cut | Self::CutToFinish => "cut",
            Self::Commit => "commit",
            Self::Push => "push",
            Self::Park => "park",
            Self::ParkPush => "park-push",
            Self::Resume => "resume",
        }
    }

    /// What it is, for the operator.
    fn doing(self) -> &'static str {
        match self {
            Self::Fetch => "fetching the repository",
            Self::Reset => "resetting the workspace",
            Self::Preflight => "checking the toolchains",
            Self::Cut | Self::CutToFinish => "cutting the milestone's branch",
            Self::Commit => "committing the milestone's changes",
            Self::Push => "pushing the milestone's branch",
            Self::Park => "committing the parked item's work",
            Self::ParkPush => "pushing the parked item's branch",
            Self::Resume => "putting the workspace back on the item's branch",
        }
    }

    /// Whether it is a milestone's (its outcome is the agent tool call's
    /// result) rather than the preparation's.
    fn is_milestone(self) -> bool {
        matches!(
            self,
            Self::Cut | Self::CutToFinish | Self::Commit | Self::Push
        )
    }
}

/// A harness operation in flight: what was sent, so the verdict's permit
/// is for exactly that line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct HarnessRun {
    pub kind: OpKind,
    /// Its request id: `dev:<item>:op:<k>:<kind>`.
    pub id: String,
    /// The line.
    pub command: String,
    /// The secrets it is handed (the push key, for a fetch or a push).
    pub secrets: Vec<String>,
    pub timeout_ms: u64,
}

impl HarnessRun {
    fn action(&self, host: &str) -> Result<Action, StoreError> {
        let mut arguments = json!({ "command": self.command });
        if !self.secrets.is_empty() {
            arguments["secrets"] = json!(self.secrets);
        }
        Action::new("shell", host, &arguments).map_err(|e| StoreError::Corrupt(e.0))
    }
}

/// The branch an item's work starts on: never the default branch (D4).
pub(crate) fn item_branch(rec: &ItemRecord) -> String {
    format!(
        "{}issue-{}",
        nisse_policy::dev::harness::AGENT_BRANCH_PREFIX,
        rec.number
    )
}

/// The ref things left before item `number` are set aside under.
fn aside_ref(number: i64) -> String {
    format!("refs/nisse/set-aside/item-{number}")
}

/// The reset line for `rec`'s item (see the module's doc).
pub(crate) fn reset_line(
    host: &BuildHost,
    project: &Project,
    rec: &ItemRecord,
    number: i64,
) -> String {
    let git = nisse_policy::dev::harness::LOCAL_GIT;
    let ws = shell_word(&host.workspace);
    let branch = item_branch(rec);
    let remote_branch = shell_word(&format!("refs/remotes/origin/{branch}"));
    let base = shell_word(&format!("refs/remotes/origin/{}", project.base_branch));
    let aside = aside_ref(number);
    let message = shell_word(&format!("Set aside by nisse-dev before item #{number}"));
    let markers = MARKERS
        .iter()
        .map(|(f, _)| *f)
        .chain([TOOLCHAIN_FILE])
        .collect::<Vec<_>>()
        .join(" ");
    let branch = shell_word(&branch);
    [
        format!("cd {ws}"),
        format!("export {}", nisse_policy::dev::harness::GIT_ENV),
        format!(
            "if {git} rev-parse -q --verify HEAD >/dev/null; then {git} add -A && kept=$({git} stash create {message}) && if [ -n \"$kept\" ]; then {git} update-ref {aside}/worktree \"$kept\" && echo 'nisse: set-aside {aside}/worktree uncommitted changes'; fi; fi"
        ),
        format!(
            "for b in $({git} for-each-ref --format='%(refname:short)' refs/heads/); do n=$({git} rev-list --count \"refs/heads/$b\" --not --remotes=origin) && if [ \"$n\" != 0 ]; then {git} update-ref \"{aside}/branches/$b\" \"refs/heads/$b\" && echo \"nisse: set-aside {aside}/branches/$b branch $b with $n commit(s) not in the repository\"; fi; done"
        ),
        format!(
            "if {git} rev-parse -q --verify {remote_branch} >/dev/null; then start={remote_branch}; else start={base}; fi"
        ),
        format!("{git} checkout -q -f -B {branch} \"$start\""),
        format!("{git} clean -q -ffdx"),
        format!("echo \"nisse: branch $({git} rev-parse --abbrev-ref HEAD)\""),
        format!("echo \"nisse: base $({git} rev-parse HEAD)\""),
        "for f in ARCHITECTURE.md docs/plans; do if [ -e \"$f\" ]; then echo \"nisse: document $f\"; fi; done".to_string(),
        format!("for f in {markers}; do if [ -f \"$f\" ]; then echo \"nisse: marker $f\"; fi; done"),
        format!(
            "if [ -f {TOOLCHAIN_FILE} ]; then head -n {MAX_TOOLS} {TOOLCHAIN_FILE} | sed 's/^/nisse: toolchain /'; fi"
        ),
    ]
    .join(" && ")
}

/// The programs the reset's report says the project needs: those its
/// marker files call for, then those `.nisse/toolchain` lists that are
/// program names, then git; each once.
pub(crate) fn tools_needed(prepared: &Prepared) -> Vec<String> {
    let mut tools: Vec<String> = Vec::new();
    let mut add = |t: &str| {
        if !tools.iter().any(|x| x == t) && tools.len() < MAX_TOOLS {
            tools.push(t.to_string());
        }
    };
    for (file, programs) in MARKERS {
        if prepared.markers.iter().any(|m| m == file) {
            programs.iter().for_each(|p| add(p));
        }
    }
    for entry in &prepared.toolchain {
        let name = entry.split('#').next().unwrap_or("").trim();
        if is_program_name(name) {
            add(name);
        }
    }
    add("git");
    tools
}

/// A program's name as `.nisse/toolchain` may give it: a plain word.
fn is_program_name(name: &str) -> bool {
    name.len() <= 64
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '+'))
}

/// The preflight line: each program's name, then its version's first line
/// or `missing`.
pub(crate) fn preflight_line(host: &BuildHost, tools: &[String]) -> String {
    let ws = shell_word(&host.workspace);
    std::iter::once(format!("cd {ws}"))
        .chain(tools.iter().map(|t| {
            let t = shell_word(t);
            format!(
                "echo 'nisse: tool {t}' && if command -v {t} >/dev/null 2>&1; then {t} --version 2>&1 | head -n 1; else echo missing; fi"
            )
        }))
        .collect::<Vec<_>>()
        .join(" && ")
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
    /// The toolchain marker files present.
    pub markers: Vec<String>,
    /// The lines of `.nisse/toolchain`.
    pub toolchain: Vec<String>,
}

impl Prepared {
    /// Reads the reset's standard output.
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
                "marker" => out.markers.push(rest.to_string()),
                "toolchain" => out.toolchain.push(rest.to_string()),
                _ => {}
            }
        }
        out
    }
}

/// Reads the preflight's standard output: each program with its version,
/// or `missing`.
pub(crate) fn parse_tools(stdout: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut lines = stdout.lines().peekable();
    while let Some(line) = lines.next() {
        let Some(tool) = line.strip_prefix("nisse: tool ") else {
            continue;
        };
        let version = match lines.peek() {
            Some(v) if !v.starts_with("nisse: tool ") => lines.next().unwrap_or_default(),
            _ => "",
        };
        let version = if version.trim().is_empty() {
            "missing"
        } else {
            version.trim()
        };
        out.push((tool.to_string(), version.to_string()));
    }
    out
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
            return self.start_talk(brain, txn, &item);
        };
        // Queued: its workspace is to be prepared; parked: put back. One
        // operation at a time.
        let resume = match &rec.phase {
            Phase::Queued => None,
            Phase::Parked { branch } => Some(branch.clone()),
            // Its workspace is in place: a hold for a parking that did not
            // happen (the other item's turn ended first) is let go.
            Phase::Started => return self.release_unless_parking(brain, txn, &item),
            _ => return Ok(()),
        };
        if rec.op.is_some() {
            return Ok(());
        }
        let Some(project) = self.config.projects.get(&rec.project).cloned() else {
            return Ok(());
        };
        // Nothing starts on a project whose protection is not verified.
        match self.protection_gate(brain, txn, &rec.project)? {
            Gate::Go => {}
            Gate::Wait => return Ok(()),
            Gate::Stop(problems) => {
                // A parked item stays parked on its branch, to be put back
                // once the protection holds.
                let what = if resume.is_some() {
                    "its return to the workspace"
                } else {
                    rec.phase = Phase::Unprotected;
                    save_item(txn, &item.id, &rec)?;
                    "its start"
                };
                return self.block_unprotected(brain, txn, &item, &rec, what, &problems);
            }
        }
        let host = project.build_host();
        let me = Actor::agent(&brain.agent);
        txn.bind_hosts(
            &item,
            &me,
            [host.name.clone()],
            &format!("the build host of project {}", rec.project),
        )?;
        // Another item's work is in the workspace: parked first.
        if let Some((holder, holder_rec)) = self.other_holder(txn, &rec.project, &item.id)? {
            return self.park(brain, txn, &item, &mut rec, &project, &holder, &holder_rec);
        }
        let Some(command) = host.git_network_line(&GitNetwork::Fetch) else {
            return Err(StoreError::Corrupt(format!(
                "project {} has no repository to fetch",
                rec.project
            )));
        };
        rec.phase = match resume {
            Some(branch) => {
                // Nothing runs in the loop until its branch is back.
                txn.loop_hold(&item.id, "its workspace is being put back")?;
                Phase::Resuming { branch }
            }
            None => Phase::Preparing,
        };
        let run = self.new_run(
            &item,
            &mut rec,
            OpKind::Fetch,
            command,
            vec![project.push_secret.clone()],
            FETCH_TIMEOUT_MS,
        );
        self.send_run(brain, txn, &item, &project, &mut rec, run)
    }

    /// A harness operation's record.
    pub(crate) fn new_run(
        &self,
        item: &WorkItem,
        rec: &mut ItemRecord,
        kind: OpKind,
        command: String,
        secrets: Vec<String>,
        timeout_ms: u64,
    ) -> HarnessRun {
        rec.ops += 1;
        HarnessRun {
            kind,
            id: format!(
                "{HARNESS_PREFIX}{}:op:{}:{}",
                item.id,
                rec.ops,
                kind.as_str()
            ),
            command,
            secrets,
            timeout_ms,
        }
    }

    /// Asks for `run`'s classification; it is then the one in flight.
    pub(crate) fn send_run(
        &self,
        brain: &BrainSettings,
        txn: &mut Txn<'_, '_>,
        item: &WorkItem,
        project: &Project,
        rec: &mut ItemRecord,
        run: HarnessRun,
    ) -> Result<(), StoreError> {
        let action = run.action(&project.build_host)?;
        txn.emit_classify(
            &brain.agent,
            &item.id,
            &format!("{}:classify", run.id),
            &action,
            None,
            Some(scope_of(item, project)),
        )?;
        rec.op = Some(run);
        save_item(txn, &item.id, rec)
    }

    /// A verdict on one of the harness's own operations.
    pub(crate) fn harness_verdict(
        &mut self,
        brain: &BrainSettings,
        txn: &mut Txn<'_, '_>,
        verdict: &ClassifyVerdict,
    ) -> Result<(), StoreError> {
        let Some((item, rec, project, run)) =
            self.harness_target(txn, &verdict.request_id, ":classify")?
        else {
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
        let action = run.action(&project.build_host)?;
        let contained = [project.build_host.clone()];
        let scope = Scope {
            plan: None,
            operator_confirmed: false,
            contained: &contained,
        };
        match nisse_core::gate::permit_for(verdict, &action, scope) {
            Ok(permit) => txn
                .emit_exec_with_timeout(
                    permit,
                    ExecFor {
                        agent: &brain.agent,
                        work_item_id: &item.id,
                        request_id: &format!("{}:exec", run.id),
                        verdict_request_id: &verdict.request_id,
                        revision: 0,
                        step: 0,
                        phase: run.kind.as_str(),
                        attempt: 0,
                    },
                    run.timeout_ms,
                )
                .map(drop),
            Err(halt) => {
                let why = format!("{} was not permitted: {}", run.kind.doing(), halt.explain());
                if run.kind.is_milestone() {
                    let mut rec = rec;
                    rec.op = None;
                    save_item(txn, &item.id, &rec)?;
                    return self.milestone_step(brain, txn, &item, run.kind, Err(why));
                }
                self.harness_halted(brain, txn, &item, &why)
            }
        }
    }

    /// The executor's result for one of the harness's own operations.
    pub(crate) fn harness_result(
        &mut self,
        brain: &BrainSettings,
        txn: &mut Txn<'_, '_>,
        result: &ExecResult,
    ) -> Result<(), StoreError> {
        let Some((item, mut rec, project, run)) =
            self.harness_target(txn, &result.request_id, ":exec")?
        else {
            return Ok(());
        };
        let status = ExecStatus::try_from(result.status).unwrap_or_default();
        if status != ExecStatus::Completed || result.exit_code != 0 {
            let stderr = String::from_utf8_lossy(&result.stderr);
            let why = match status {
                ExecStatus::Completed => format!(
                    "{} on {} failed (exit {}): {}",
                    run.kind.doing(),
                    project.build_host,
                    result.exit_code,
                    error_tail(&stderr)
                ),
                _ => format!(
                    "{} on {} did not run: {}",
                    run.kind.doing(),
                    project.build_host,
                    result.reason
                ),
            };
            if run.kind.is_milestone() {
                rec.op = None;
                save_item(txn, &item.id, &rec)?;
                return self.milestone_step(brain, txn, &item, run.kind, Err(why));
            }
            return self.harness_halted(brain, txn, &item, &why);
        }
        rec.op = None;
        let stdout = String::from_utf8_lossy(&result.stdout);
        if run.kind.is_milestone() {
            save_item(txn, &item.id, &rec)?;
            return self.milestone_step(brain, txn, &item, run.kind, Ok(&stdout));
        }
        let host = project.build_host();
        match run.kind {
            OpKind::Fetch if matches!(rec.phase, Phase::Resuming { .. }) => {
                let Phase::Resuming { branch } = rec.phase.clone() else {
                    return Ok(());
                };
                let next = self.new_run(
                    &item,
                    &mut rec,
                    OpKind::Resume,
                    crate::parking::resume_line(&host, &branch),
                    Vec::new(),
                    LOCAL_TIMEOUT_MS,
                );
                self.send_run(brain, txn, &item, &project, &mut rec, next)
            }
            OpKind::Fetch => {
                let line = reset_line(&host, &project, &rec, item.number);
                let next = self.new_run(
                    &item,
                    &mut rec,
                    OpKind::Reset,
                    line,
                    Vec::new(),
                    LOCAL_TIMEOUT_MS,
                );
                self.send_run(brain, txn, &item, &project, &mut rec, next)
            }
            OpKind::Reset => {
                let prepared = Prepared::parse(&stdout);
                self.record_reset(brain, txn, &item, &project, &prepared)?;
                let line = preflight_line(&host, &tools_needed(&prepared));
                let next = self.new_run(
                    &item,
                    &mut rec,
                    OpKind::Preflight,
                    line,
                    Vec::new(),
                    LOCAL_TIMEOUT_MS,
                );
                self.send_run(brain, txn, &item, &project, &mut rec, next)
            }
            OpKind::Preflight => {
                let me = Actor::agent(&brain.agent);
                for (tool, version) in parse_tools(&stdout) {
                    txn.append(
                        &item.id,
                        &me,
                        &Event::Fact {
                            text: format!("toolchain on {}: {tool}: {version}", project.build_host),
                            data: json!({ "tool": tool, "version": version, "host": project.build_host }),
                        },
                    )?;
                }
                rec.phase = Phase::Started;
                save_item(txn, &item.id, &rec)?;
                self.set_holder(txn, &rec.project, Some(&item.id))?;
                // Changes in the workspace wait for the go-ahead
                // (milestones.rs), reads do not.
                txn.loop_open(brain.agent_loop(), &item, "the workspace is ready")
            }
            OpKind::Park | OpKind::ParkPush | OpKind::Resume => {
                self.parking_step(brain, txn, &item, &mut rec, run.kind, &stdout)
            }
            OpKind::Cut | OpKind::CutToFinish | OpKind::Commit | OpKind::Push => Ok(()),
        }
    }

    /// The reset's report as facts in the item's log, and what was set
    /// aside told in its thread.
    fn record_reset(
        &self,
        brain: &BrainSettings,
        txn: &mut Txn<'_, '_>,
        item: &WorkItem,
        project: &Project,
        prepared: &Prepared,
    ) -> Result<(), StoreError> {
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
        let event = txn.append(
            &item.id,
            &me,
            &Event::Fact {
                text: format!(
                    "the workspace {} on {} is on branch {} at {} (base branch {}; documents: {})",
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
        if prepared.set_aside.is_empty() {
            return Ok(());
        }
        let list = prepared
            .set_aside
            .iter()
            .map(|(r, what)| format!("- {} under {}", md(what), code(r)))
            .collect::<Vec<_>>()
            .join("\n");
        txn.say(
            &brain.agent,
            item,
            event,
            Say::fact(format!(
                "🗃️ The workspace on {} held work from before; nothing was discarded, it is set aside:\n{list}",
                code(&project.build_host)
            )),
        )
    }

    /// The item, its record, project and operation that a harness request
    /// id (`<run id><suffix>`) names, when it is the operation in flight.
    fn harness_target(
        &self,
        txn: &Txn<'_, '_>,
        request_id: &str,
        suffix: &str,
    ) -> Result<Option<(WorkItem, ItemRecord, Project, HarnessRun)>, StoreError> {
        let Some(rest) = request_id.strip_prefix(HARNESS_PREFIX) else {
            return Ok(None);
        };
        let Some((item_id, _)) = rest.split_once(':') else {
            return Ok(None);
        };
        let (Some(item), Some(rec)) = (txn.item(item_id)?, item_record(txn, item_id)?) else {
            return Ok(None);
        };
        // An answer to an operation no longer in flight (one that halted
        // and was sent again) is history, not news.
        let Some(run) = rec
            .op
            .clone()
            .filter(|r| request_id.strip_suffix(suffix) == Some(r.id.as_str()))
        else {
            return Ok(None);
        };
        let Some(project) = self.config.projects.get(&rec.project).cloned() else {
            return Ok(None);
        };
        Ok(Some((item, rec, project, run)))
    }

    /// A harness operation could not go on: the item waits on the
    /// operator, who is told why.
    pub(crate) fn harness_halted(
        &self,
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
            // `retry` (or the next activation) prepares it again, under
            // new request ids; a parked item stays parked on its branch,
            // and one it was parking stays where it was.
            rec.phase = match rec.phase {
                Phase::Resuming { branch } | Phase::Parked { branch } => Phase::Parked { branch },
                _ => Phase::Queued,
            };
            rec.op = None;
            rec.parking_branch = None;
            // The item it was parking stays where it is, its loop free.
            if let Some(holder) = rec.parking.take()
                && let Some(holder) = txn.item(&holder)?
            {
                txn.loop_release(brain.agent_loop(), &holder)?;
            }
            save_item(txn, &item.id, &rec)?;
        }
        if matches!(item.state, State::Active | State::Ready) {
            txn.transition(&item.id, Transition::AwaitOperator, why, &me)?;
        }
        txn.say(
            &brain.agent,
            item,
            event,
            Say::question(format!("⚠️ Item **#{}**: {}.", item.number, md(why))),
        )
    }
}

/// What a failed harness line said, for the operator: its last few
/// non-empty lines of standard error, joined. Not only the last one: git
/// ends every failed fetch or push over SSH with the same two lines of
/// advice, after the line that says what went wrong (`Host key
/// verification failed.`, `Connection refused`).
fn error_tail(stderr: &str) -> String {
    const LINES: usize = 5;
    const CHARS: usize = 800;
    let mut lines: Vec<&str> = stderr
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .rev()
        .take(LINES)
        .collect();
    lines.reverse();
    if lines.is_empty() {
        return "no output".into();
    }
    let joined = lines.join(" / ");
    let count = joined.chars().count();
    match joined.char_indices().nth(count.saturating_sub(CHARS)) {
        Some((start, _)) if start > 0 => format!("…{}", &joined[start..]),
        _ => joined,
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn project() -> Project {
        Project {
            repository: "acme/widget".into(),
            base_branch: "main".into(),
            build_host: "build-widget".into(),
            workspace: "/srv/work/widget".into(),
            clone_url: "ssh://git@gitea.lan:2222/acme/widget.git".into(),
            push_secret: "gitea-push-key".into(),
            git_known_hosts: Some("/srv/work/gitea_known_hosts".into()),
            test_commands: vec!["python3 -m unittest".into()],
            trust: Default::default(),
            secrets: Vec::new(),
        }
    }

    fn record() -> ItemRecord {
        ItemRecord::new("widget", "acme/widget", 14, vec![], Phase::Queued)
    }

    /// Every line of the harness (the preparation's, the milestones') is
    /// class 2 or less under the dev rules on the build host, so the agreed
    /// scope permits it without a plan, and the push key reaches the fetch
    /// and the push alone: by construction,
    /// not by the example of one repository.
    #[test]
    fn every_harness_line_is_permitted_in_scope_and_only_the_network_ones_get_the_key() {
        let project = project();
        let host = project.build_host();
        let policy = nisse_policy::Policy::builtin()
            .unwrap()
            .with_build_hosts(vec![host.clone()])
            .unwrap();
        let fetch = host.git_network_line(&GitNetwork::Fetch).unwrap();
        let prepared = Prepared {
            markers: MARKERS.iter().map(|(f, _)| f.to_string()).collect(),
            toolchain: vec!["zig".into(), "just".into()],
            ..Default::default()
        };
        let lines = [
            (fetch.clone(), true),
            (reset_line(&host, &project, &record(), 7), false),
            (preflight_line(&host, &tools_needed(&prepared)), false),
            (
                crate::milestones::cut_line(&host, "nisse/issue-7-1-fix-the-parser"),
                false,
            ),
            (
                crate::milestones::commit_line(
                    &host,
                    ("dev-agent", "dev-agent@users.noreply.invalid"),
                    "nisse/issue-7-1-fix-the-parser",
                    "0123456789abcdef0123456789abcdef01234567",
                    "Fix the parser's 'off by one'\n\nPart of #7; $(rm -rf ~) `x`",
                ),
                false,
            ),
            (
                host.git_network_line(&GitNetwork::Push {
                    branch: "nisse/issue-7-1-fix-the-parser".into(),
                })
                .unwrap(),
                true,
            ),
        ];
        let contained = [host.name.clone()];
        for (line, keyed) in lines {
            let run = HarnessRun {
                kind: OpKind::Fetch,
                id: "x".into(),
                command: line.clone(),
                secrets: if keyed {
                    vec![project.push_secret.clone()]
                } else {
                    vec![]
                },
                timeout_ms: 1,
            };
            let action = run.action(&host.name).unwrap();
            let assessed = policy.assess(&action, None);
            assert!(
                assessed.class <= nisse_policy::ActionClass::Contained,
                "{line}\n{assessed:#?}"
            );
            let fast = nisse_policy::fast_path(
                &action,
                &assessed,
                &nisse_policy::Switches::default(),
                Scope {
                    plan: None,
                    operator_confirmed: false,
                    contained: &contained,
                },
            )
            .unwrap();
            assert_ne!(
                fast.verdict,
                nisse_policy::Verdict::NeedsDiscussion,
                "{line}"
            );
            let granted = policy.secret_grant(&action, &project.push_secret);
            assert_eq!(granted.is_ok(), keyed, "{line}: {granted:?}");
        }
    }

    #[test]
    fn a_failure_is_told_with_the_line_that_says_why() {
        let git = "Host key verification failed.\nfatal: Could not read from remote repository.\n\nPlease make sure you have the correct access rights\nand the repository exists.\n";
        assert_eq!(
            error_tail(git),
            "Host key verification failed. / fatal: Could not read from remote repository. / Please make sure you have the correct access rights / and the repository exists."
        );
        assert_eq!(error_tail("\n  \n"), "no output");
        let long = "é".repeat(2000);
        let told = error_tail(&long);
        assert!(
            told.starts_with('…') && told.chars().count() == 801,
            "{}",
            told.len()
        );
    }

    #[test]
    fn the_resets_report_is_read() {
        let p = Prepared::parse(
            "noise\nnisse: set-aside refs/nisse/set-aside/item-3/worktree uncommitted changes\nnisse: branch nisse/issue-14\nnisse: base abc\nnisse: document ARCHITECTURE.md\nnisse: marker Cargo.toml\nnisse: toolchain zig # the compiler\nnisse: toolchain rm -rf /\n",
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
        // What the markers call for, then the toolchain file's plain
        // program names (not what is no program name), then git.
        assert_eq!(tools_needed(&p), ["cargo", "rustc", "zig", "git"]);
    }

    #[test]
    fn the_preflights_report_is_read() {
        let tools = parse_tools(
            "nisse: tool cargo\ncargo 1.95.0 (f2d3ce0bd 2026-03-21)\nnisse: tool node\nmissing\nnisse: tool zig\nnisse: tool git\ngit version 2.39.5\n",
        );
        assert_eq!(
            tools,
            [
                (
                    "cargo".to_string(),
                    "cargo 1.95.0 (f2d3ce0bd 2026-03-21)".to_string()
                ),
                ("node".to_string(), "missing".to_string()),
                ("zig".to_string(), "missing".to_string()),
                ("git".to_string(), "git version 2.39.5".to_string()),
            ]
        );
    }
}
