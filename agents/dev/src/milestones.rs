//! The dev agent's own tools (seed Nisse D1, D4, D5): the restatement and
//! its go-ahead, and milestones, whose branches, commits, pushes and pull
//! requests the harness owns.
//!
//! - `restate(understanding)` puts the agent's reading of the issue in the
//!   thread as a question. The operator's **go** (in Matrix or as a comment
//!   on the issue) is the go-ahead; any other answer goes back to the model
//!   to restate again. A `bug` goes ahead by itself when the operator lets
//!   `bug-grace` pass without answering; `discuss` and `design` wait for
//!   the word like everything else, and the restatement says to talk first.
//! - `start_milestone(name)` cuts the milestone's branch (`nisse/issue-<n>-
//!   <k>-<slug>`) where the workspace is, keeping its changes; "changes to
//!   publish" are counted from that commit. Starting while one is open, or
//!   while the last one's pull request is not merged, is refused.
//! - `finish_milestone(summary)` (cutting the branch first when none was
//!   started) commits the work's own changes (the repository's ignores and
//!   the standard excludes keep artifacts out; what was left out is
//!   reported), pushes the branch with the push key in a harness line of
//!   the policy's own, and publishes the pull request through intake-gitea
//!   with the agent's token (an open one for the branch is adopted and
//!   updated, never duplicated). The operator's review comments since the
//!   last publish are answered where they were made. The item then waits
//!   for the review; the merge, read from Gitea, lets the next milestone
//!   start. A milestone without changes is done when none were expected and
//!   raised with the operator otherwise.
//!
//! Every step is a harness operation ([`crate::workspace`]) or a Gitea call
//! with an id of its own, so a crash anywhere repeats nothing: the executor
//! and intake-gitea answer a request id once, and a publish sent again
//! finds the pull request it made.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use nisse_bus::proto::{self, GiteaCallStatus, GiteaEvent, GiteaRequest, GiteaResult};
use nisse_core::agent_loop::{AfterCall, AgentTool, Call};
use nisse_core::markdown::{code, md_escape as md};
use nisse_core::{
    Actor, ActorKind, BrainSettings, Event, Say, State, StoreError, Transition, Txn, WorkItem,
};
use nisse_policy::BuildHost;
use nisse_policy::dev::{GitNetwork, shell_word};

use crate::brain::{DevDuties, HARNESS_PREFIX};
use crate::config::Project;
use crate::issues::{ItemRecord, gitea_actor, item_record, read, write};
use crate::workspace::{HarnessRun, LOCAL_TIMEOUT_MS, OpKind, PUSH_TIMEOUT_MS};

/// How the dev agent acts, for the system prompt.
pub(crate) const HOW_TO_ACT: &str = "\
- First read the project (its ARCHITECTURE.md and docs/plans, when the workspace fact lists them) and the issue, then call restate with your understanding: what you will change and how you will know it works. Nothing else starts before the operator's go-ahead (for a bug, the grace period passing without an answer). When the answer corrects you, restate again.
- Work in the workspace on the build host with shell, read_file and list_dir: start every command with `cd <workspace> &&`. Reading, editing files (for example with a heredoc or sed), running the project's tests and installing what the project needs on its build host run at once, without a plan; anything outside the workspace's repository and build host is refused.
- The harness owns git: never commit, push or switch branches yourself. Call start_milestone before a piece of work that is one pull request, and finish_milestone when it is done and its tests pass: the harness commits your changes, pushes and opens or updates the pull request, then you wait for the review. The operator's review comments come to you as instructions: change the code, then call finish_milestone again, which updates the same pull request and answers each comment.
- Work longer than about one pull request gets a build plan: in the first milestone write docs/plans/<short-name>.md with every milestone (its goal, the interfaces and behaviour it adds or changes, its edge cases, and tests as acceptance criteria; code only where code is the clearest specification), and in each milestone's pull request mark that milestone done in the plan. The plan is yours and the operator's to read: the harness never reads it. Update ARCHITECTURE.md in the pull request that changes the design. A milestone starts only after the previous one's pull request merged: until then, wait.
- Post a progress note on the issue with post_progress when there is something worth saying; the harness already notes milestones started, pull requests opened and merged.
- Call finish when the issue is done (after the last pull request merged): the harness closes the Gitea issue with your summary.
- An item that began as the operator's talk in the room is a conversation: it has no issue and no workspace yet, and no host to run anything on. Talk with the operator through ask_human until you agree on what to build. When it should become a new project, call propose_project with its name, repository, a summary, the tracking issue's title and body (the goals, the first milestones, what is open) and what its build host needs; the harness asks the operator to provision and register it, and the item waits. Call finish when the conversation ends without a project.
- Once the operator registered the proposed project, the harness opens its tracking issue with your text and prepares the workspace; the registration is the go-ahead, so no restatement is needed. Land the architecture first: the first milestone adds ARCHITECTURE.md (the design: components, interfaces, data, how it is tested) and, when the work is longer than one pull request, the build plan.";

/// The tools the dev agent adds to the loop.
pub(crate) fn tools() -> Vec<AgentTool> {
    vec![
        AgentTool {
            name: "restate",
            description: "Put your understanding of the issue in the thread (what you will change, how it will be verified) and wait for the operator's go-ahead.",
            parameters: json!({ "type": "object", "properties": {
                "understanding": { "type": "string", "description": "Your understanding, in a few sentences, for the operator." } },
              "required": ["understanding"] }),
        },
        AgentTool {
            name: "start_milestone",
            description: "Start a milestone (one pull request's worth of work): the harness cuts its branch where the workspace is.",
            parameters: json!({ "type": "object", "properties": {
                "name": { "type": "string", "description": "What the milestone delivers, in a few words: the pull request's title." } },
              "required": ["name"] }),
        },
        AgentTool {
            name: "post_progress",
            description: "Post a short progress note on the item's Gitea issue, for the people following it there, when there is something worth saying (a finding, a change of approach). The harness already posts when a milestone starts, its pull request opens and merges.",
            parameters: json!({ "type": "object", "properties": {
                "text": { "type": "string", "description": "The note, in Markdown." } },
              "required": ["text"] }),
        },
        AgentTool {
            name: "propose_project",
            description: "In a conversation (an item with no issue yet): propose the new project it leads to. The harness asks the operator to provision the repository, access and build host and to register the project; once registered, it opens the tracking issue with your title and body.",
            parameters: json!({ "type": "object", "properties": {
                "name": { "type": "string", "description": "The project's name: lowercase letters, digits, - and _." },
                "repository": { "type": "string", "description": "The Gitea repository to create, owner/name." },
                "summary": { "type": "string", "description": "What the project is, in a sentence or two, for the operator." },
                "issue_title": { "type": "string", "description": "The tracking issue's title, one line." },
                "issue_body": { "type": "string", "description": "The tracking issue's body in Markdown: goals, first milestones, open questions." },
                "build_host_needs": { "type": "array", "items": { "type": "string" }, "description": "What the build host needs installed or reachable (toolchains, services)." } },
              "required": ["name", "repository", "summary", "issue_title", "issue_body"] }),
        },
        AgentTool {
            name: "finish_milestone",
            description: "Finish the open milestone (or, with none started, one for the work so far): the harness commits the changes, pushes the branch and opens or updates its pull request.",
            parameters: json!({ "type": "object", "properties": {
                "summary": { "type": "string", "description": "What changed and how it was verified: the commit message and the pull request's description." },
                "changes_expected": { "type": "boolean", "description": "Whether this milestone was meant to change files (default true)." } },
              "required": ["summary"] }),
        },
    ]
}

/// Where a milestone stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum MilestoneState {
    /// Work goes on on its branch.
    Open,
    /// Its pull request waits for review.
    Published,
    /// Its pull request merged.
    Merged,
    /// Its pull request was closed without merging.
    Closed,
    /// Done without changes, as expected.
    Done,
}

/// An operator's review comment the next publish answers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Instruction {
    pub comment_id: i64,
    /// The file and lines of an inline comment; empty for a conversation
    /// comment.
    pub path: String,
    pub line: i64,
    pub old_line: i64,
}

/// One milestone of an item.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Milestone {
    /// Its number within the item, from 1.
    pub k: u32,
    pub name: String,
    pub branch: String,
    pub state: MilestoneState,
    /// The commit it started at.
    pub start: Option<String>,
    /// The commit last pushed.
    pub head: Option<String>,
    /// Its pull request, once published.
    pub pull: Option<u64>,
    pub pull_url: String,
    /// The review comments waiting for an answer.
    pub instructions: Vec<Instruction>,
    /// Those the commit in flight answers: the ones that had come when it
    /// started (a comment that comes while it runs waits for the next).
    #[serde(default)]
    pub answering: Vec<Instruction>,
    /// What the finishing call said, while it publishes.
    pub summary: String,
    pub changes_expected: bool,
    /// What the last commit left out.
    pub left_out: Vec<String>,
    /// The files changed since it started.
    pub files: Vec<String>,
    /// The publish request in flight.
    pub publishing: Option<String>,
    /// Pushed, and its publish refused because the project's branch
    /// protection does not hold: published once it holds again.
    #[serde(default)]
    pub held: bool,
    /// The trust dial lets the agent merge, an operator approved, and the
    /// merge waits for the checks ([`crate::merging`]).
    #[serde(default)]
    pub wants_merge: bool,
    /// The merge's read or the merge itself in flight.
    #[serde(default)]
    pub merging: Option<String>,
    /// When its merge state was last read (ns since the epoch).
    #[serde(default)]
    pub merge_read_at_ns: Option<i128>,
}

/// What the agent keeps about its tools' work on an item.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Work {
    /// The agent tool's call being handled.
    pub call: Option<String>,
    /// The restatement waiting for the operator's answer, and when it was
    /// asked (ns).
    pub restating: Option<(String, i128)>,
    /// The operator's go-ahead (or the bug's grace) was given.
    pub go_ahead: bool,
    /// The item's milestones, the last one current.
    pub milestones: Vec<Milestone>,
    /// Gitea calls sent (each its own request id).
    pub calls: u32,
    /// Where the work stood before parking first committed it outside any
    /// milestone: the next milestone's changes count from there, so the
    /// parked work is its own ([`crate::parking`]).
    #[serde(default)]
    pub wip_base: Option<String>,
}

impl Work {
    fn current(&mut self) -> Option<&mut Milestone> {
        self.milestones.last_mut()
    }
}

/// The operator's words that are a go-ahead.
fn is_go_ahead(words: &str) -> bool {
    let w: String = words
        .trim()
        .trim_end_matches(['.', '!'])
        .to_lowercase()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    matches!(
        w.as_str(),
        "go" | "go ahead" | "go-ahead" | "proceed" | "yes" | "ok" | "okay" | "lgtm" | "👍"
    )
}

/// A branch name's part from a milestone's name: lowercase words joined by
/// `-`, at most 40 characters.
fn slug(name: &str) -> String {
    let mut out = String::new();
    for word in name
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| !w.is_empty())
    {
        if out.len() + word.len() + 1 > 40 {
            break;
        }
        if !out.is_empty() {
            out.push('-');
        }
        out.push_str(&word.to_ascii_lowercase());
    }
    if out.is_empty() { "work".into() } else { out }
}

/// Files no commit of the harness takes, whatever the repository's own
/// ignores say: build output, dependencies, caches, editors' files.
pub(crate) const STANDARD_EXCLUDES: [&str; 14] = [
    "target/",
    "node_modules/",
    "__pycache__/",
    "*.pyc",
    ".venv/",
    "venv/",
    "dist/",
    "build/",
    "*.o",
    "*.so",
    ".pytest_cache/",
    ".mypy_cache/",
    ".DS_Store",
    "*.swp",
];

/// The line that cuts `branch` where the workspace is.
pub(crate) fn cut_line(host: &BuildHost, branch: &str) -> String {
    let git = nisse_policy::dev::harness::LOCAL_GIT;
    [
        format!("cd {}", shell_word(&host.workspace)),
        format!("export {}", nisse_policy::dev::harness::GIT_ENV),
        format!("{git} checkout -q -B {}", shell_word(branch)),
        format!("echo \"nisse: start $({git} rev-parse HEAD)\""),
    ]
    .join(" && ")
}

/// The line that commits the work's changes since `start` on the
/// milestone's branch, and reports what it took and left out.
pub(crate) fn commit_line(
    host: &BuildHost,
    author: (&str, &str),
    branch: &str,
    start: &str,
    message: &str,
) -> String {
    let git = nisse_policy::dev::harness::LOCAL_GIT;
    let excludes = STANDARD_EXCLUDES.join("\\n");
    let start = shell_word(start);
    [
        format!("cd {}", shell_word(&host.workspace)),
        format!("export {}", nisse_policy::dev::harness::GIT_ENV),
        format!(
            "test \"$({git} rev-parse --abbrev-ref HEAD)\" = {} || {{ echo 'nisse: error the workspace is not on the milestone branch' >&2; exit 1; }}",
            shell_word(branch)
        ),
        "mkdir -p .git/info".to_string(),
        format!("printf '{excludes}\\n' > .git/info/exclude"),
        format!("{git} add -A"),
        format!(
            "{git} status --porcelain --ignored | sed -n 's/^!! /nisse: left-out /p'"
        ),
        format!(
            "if ! {git} diff --cached --quiet; then {git} -c user.name={} -c user.email={} commit -q -m {}; fi",
            shell_word(author.0),
            shell_word(author.1),
            shell_word(message)
        ),
        format!("echo \"nisse: head $({git} rev-parse HEAD)\""),
        format!("echo \"nisse: commits $({git} rev-list --count {start}..HEAD)\""),
        format!("{git} diff --name-only {start} HEAD | sed 's/^/nisse: file /'"),
    ]
    .join(" && ")
}

/// What a harness line of a milestone reported.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Reported {
    pub start: Option<String>,
    pub head: Option<String>,
    pub commits: u64,
    pub files: Vec<String>,
    pub left_out: Vec<String>,
}

impl Reported {
    pub(crate) fn parse(stdout: &str) -> Self {
        let mut out = Self::default();
        for line in stdout.lines() {
            let Some((what, rest)) = line.strip_prefix("nisse: ").and_then(|r| r.split_once(' '))
            else {
                continue;
            };
            match what {
                "start" => out.start = Some(rest.to_string()),
                "head" => out.head = Some(rest.to_string()),
                "commits" => out.commits = rest.trim().parse().unwrap_or(0),
                "file" => out.files.push(rest.to_string()),
                "left-out" => out.left_out.push(rest.to_string()),
                _ => {}
            }
        }
        out
    }
}

/// The key an item's tool work is kept under.
fn work_key(item_id: &str) -> String {
    format!("dev.work.{item_id}")
}

pub(crate) fn load_work(txn: &Txn<'_, '_>, item_id: &str) -> Result<Work, StoreError> {
    Ok(read(txn, &work_key(item_id))?.unwrap_or_default())
}

pub(crate) fn save_work(
    txn: &mut Txn<'_, '_>,
    item_id: &str,
    work: &Work,
) -> Result<(), StoreError> {
    write(txn, &work_key(item_id), work)
}

/// A call's arguments as an object (an empty one when they do not parse:
/// the handlers then name what is missing).
pub(crate) fn arguments(call: &Call) -> Value {
    serde_json::from_str::<Value>(&call.arguments)
        .ok()
        .filter(Value::is_object)
        .unwrap_or_else(|| json!({}))
}

pub(crate) fn text_arg(args: &Value, key: &str) -> Option<String> {
    args.get(key)
        .and_then(Value::as_str)
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
}

impl DevDuties {
    /// After every message: the agent tool's call the active item's loop
    /// waits on is taken up, once; a restatement's answer is read; a bug's
    /// grace is checked.
    pub(crate) fn agent_tools(
        &mut self,
        brain: &BrainSettings,
        txn: &mut Txn<'_, '_>,
    ) -> Result<(), StoreError> {
        let Some(item) = txn.active_item()? else {
            return Ok(());
        };
        let Some(rec) = item_record(txn, &item.id)? else {
            return self.talk_tools(brain, txn, &item);
        };
        let mut work = load_work(txn, &item.id)?;
        self.read_restatement(brain, txn, &item, &rec, &mut work)?;
        // A tool works on the workspace only while it is this item's: a
        // call made before it was parked waits until it is put back.
        if rec.phase != crate::issues::Phase::Started {
            return save_work(txn, &item.id, &work);
        }
        let Some(call) = txn.agent_call(&item.id)? else {
            return save_work(txn, &item.id, &work);
        };
        if work.call.as_deref() == Some(call.id.as_str()) {
            return save_work(txn, &item.id, &work);
        }
        work.call = Some(call.id.clone());
        let args = arguments(&call);
        match call.tool.as_str() {
            "restate" => self.restate(brain, txn, &item, &rec, &mut work, &call.id, &args)?,
            "start_milestone" => {
                self.start_milestone(brain, txn, &item, &mut work, &args)?;
            }
            "finish_milestone" => {
                self.finish_milestone(brain, txn, &item, &mut work, &args)?;
            }
            "post_progress" => self.post_progress(brain, txn, &item, &rec, &mut work, &args)?,
            "propose_project" => Self::answer(
                brain,
                txn,
                &item,
                &mut work,
                format!(
                    "this item is issue {}#{} of project {}; a new project is proposed in a conversation in the room",
                    rec.repository, rec.number, rec.project
                ),
                false,
                AfterCall::GoOn,
            )?,
            other => {
                work.call = None;
                txn.agent_call_done(
                    brain.agent_loop(),
                    &item,
                    &call.id,
                    format!("there is no tool `{other}`"),
                    false,
                    AfterCall::GoOn,
                )?;
            }
        }
        save_work(txn, &item.id, &work)
    }

    /// The model's own words on the item's issue, for whoever follows it
    /// there (D1: "prose by the agent when there's something worth
    /// saying"). Commenting on its own issue is in scope (D6).
    fn post_progress(
        &self,
        brain: &BrainSettings,
        txn: &mut Txn<'_, '_>,
        item: &WorkItem,
        rec: &ItemRecord,
        work: &mut Work,
        args: &Value,
    ) -> Result<(), StoreError> {
        let Some(text) = text_arg(args, "text") else {
            return Self::answer(
                brain,
                txn,
                item,
                work,
                "`post_progress` needs `text`".into(),
                false,
                AfterCall::GoOn,
            );
        };
        work.calls += 1;
        let request_id = format!("{HARNESS_PREFIX}{}:progress:note:{}", item.id, work.calls);
        let call = proto::gitea_request::Call::Comment(proto::GiteaCommentCall {
            issue_number: rec.number,
            body: text,
        });
        emit_gitea(brain, txn, item, &rec.repository, request_id, call)?;
        let posted = format!("posted on issue #{}", rec.number);
        Self::answer(brain, txn, item, work, posted, true, AfterCall::GoOn)
    }

    /// At a tick: every restatement of a bug whose grace passed goes
    /// ahead, on whichever item it waits (a waiting item is not active).
    pub(crate) fn bug_graces(
        &mut self,
        brain: &BrainSettings,
        txn: &mut Txn<'_, '_>,
    ) -> Result<(), StoreError> {
        for item in txn.open_items()? {
            let mut work = load_work(txn, &item.id)?;
            if work.restating.is_none() {
                continue;
            }
            let Some(rec) = item_record(txn, &item.id)? else {
                continue;
            };
            self.read_restatement(brain, txn, &item, &rec, &mut work)?;
            save_work(txn, &item.id, &work)?;
        }
        Ok(())
    }

    /// Answers the call in hand and lets it go.
    fn answer(
        brain: &BrainSettings,
        txn: &mut Txn<'_, '_>,
        item: &WorkItem,
        work: &mut Work,
        result: String,
        success: bool,
        after: AfterCall,
    ) -> Result<(), StoreError> {
        let Some(call) = work.call.take() else {
            return Ok(());
        };
        txn.agent_call_done(brain.agent_loop(), item, &call, result, success, after)
    }

    #[allow(clippy::too_many_arguments)]
    fn restate(
        &self,
        brain: &BrainSettings,
        txn: &mut Txn<'_, '_>,
        item: &WorkItem,
        rec: &ItemRecord,
        work: &mut Work,
        call_id: &str,
        args: &Value,
    ) -> Result<(), StoreError> {
        let Some(understanding) = text_arg(args, "understanding") else {
            return Self::answer(
                brain,
                txn,
                item,
                work,
                "`restate` needs `understanding`".into(),
                false,
                AfterCall::GoOn,
            );
        };
        let has = |l: &str| rec.labels.iter().any(|x| x.eq_ignore_ascii_case(l));
        let how = if has("discuss") || has("design") {
            "The issue is labelled for discussion: let us agree on the approach first. Say **go** when we agree, or tell me what to change.".to_string()
        } else if has("bug") {
            format!(
                "It is a bug: I go ahead in {} unless you answer. Say **go** to start now, or tell me what I got wrong.",
                humantime::format_duration(self.config.bug_grace)
            )
        } else {
            "Say **go** to start, or tell me what I got wrong.".to_string()
        };
        let question = format!(
            "My understanding of {}#{}:\n\n{}\n\n{how}",
            md(&rec.repository),
            rec.number,
            understanding
        );
        work.restating = Some((call_id.to_string(), txn.at().unix_timestamp_nanos()));
        // A new understanding needs a new go-ahead before more changes.
        work.go_ahead = false;
        txn.loop_contain(&item.id, Vec::new())?;
        work.call = None;
        txn.agent_call_asks(brain.agent_loop(), item, call_id, &question)
    }

    /// The restatement's answer, once the loop has it: the operator's go
    /// is the go-ahead; a bug's grace passing is one too.
    fn read_restatement(
        &self,
        brain: &BrainSettings,
        txn: &mut Txn<'_, '_>,
        item: &WorkItem,
        rec: &ItemRecord,
        work: &mut Work,
    ) -> Result<(), StoreError> {
        let Some((call_id, asked_ns)) = work.restating.clone() else {
            return Ok(());
        };
        let waiting = txn.loop_state(&item.id)?.is_some_and(|s| {
            matches!(&s.status, nisse_core::agent_loop::Status::Asking { call_id: c } if *c == call_id)
        });
        let me = Actor::agent(&brain.agent);
        if waiting {
            let bug = rec.labels.iter().any(|l| l.eq_ignore_ascii_case("bug"));
            let grace = i128::try_from(self.config.bug_grace.as_nanos()).unwrap_or(i128::MAX);
            if !bug || txn.at().unix_timestamp_nanos() - asked_ns < grace {
                return Ok(());
            }
            work.restating = None;
            self.go_ahead(txn, item, rec, work)?;
            let why = format!(
                "the operator did not answer the restatement of a bug within {}: the agent goes ahead",
                humantime::format_duration(self.config.bug_grace)
            );
            let event = txn.append(
                &item.id,
                &me,
                &Event::Fact {
                    text: why.clone(),
                    data: json!({ "go_ahead": "bug-grace" }),
                },
            )?;
            txn.loop_answer_asked(
                &item.id,
                &call_id,
                format!("No answer within the grace period for a bug: {why}."),
                "a bug's grace period passed",
            )?;
            if item.state == State::WaitingOnOperator {
                txn.transition(&item.id, Transition::OperatorAnswered, &why, &me)?;
            }
            return txn.say(
                &brain.agent,
                item,
                event,
                Say::fact(format!("▶️ Item **#{}**: {}.", item.number, md(&why))),
            );
        }
        work.restating = None;
        let answer = txn
            .events(&item.id)?
            .into_iter()
            .rev()
            .find_map(|e| match e.event {
                Event::ToolResult {
                    call_id: c, result, ..
                } if c == call_id => Some(result),
                _ => None,
            });
        let words = answer
            .as_deref()
            .and_then(|r| r.strip_prefix("The operator answered: "))
            .unwrap_or("");
        if is_go_ahead(words) {
            self.go_ahead(txn, item, rec, work)?;
            txn.append(
                &item.id,
                &me,
                &Event::Fact {
                    text: "the operator gave the go-ahead".into(),
                    data: json!({ "go_ahead": "operator" }),
                },
            )?;
        }
        Ok(())
    }

    /// The go-ahead is given: from now on the loop's changes contained to
    /// the project's build host (edits, builds and tests in the workspace)
    /// run without a plan. Before it, only reads do: the agent talks first
    /// and changes nothing (D1).
    pub(crate) fn go_ahead(
        &self,
        txn: &mut Txn<'_, '_>,
        item: &WorkItem,
        rec: &ItemRecord,
        work: &mut Work,
    ) -> Result<(), StoreError> {
        work.go_ahead = true;
        match self.config.projects.get(&rec.project) {
            Some(project) => txn.loop_contain(&item.id, vec![project.build_host.clone()]),
            None => Ok(()),
        }
    }

    /// Why a milestone tool may not run now, if it may not.
    fn not_yet(work: &Work) -> Option<String> {
        if !work.go_ahead {
            return Some(
                "the operator has not given the go-ahead: restate your understanding and wait for it".into(),
            );
        }
        None
    }

    fn start_milestone(
        &self,
        brain: &BrainSettings,
        txn: &mut Txn<'_, '_>,
        item: &WorkItem,
        work: &mut Work,
        args: &Value,
    ) -> Result<(), StoreError> {
        let refusal = Self::not_yet(work).or_else(|| match work.milestones.last() {
            Some(m) if m.state == MilestoneState::Open => Some(format!(
                "milestone {} (“{}”) is open on {}: finish it with finish_milestone first",
                m.k, m.name, m.branch
            )),
            Some(m) if m.state == MilestoneState::Published => Some(format!(
                "milestone {}'s pull request #{} is not merged yet: the next milestone starts after it merged",
                m.k,
                m.pull.unwrap_or_default()
            )),
            _ => None,
        });
        let name = text_arg(args, "name");
        let refusal = refusal.or_else(|| {
            name.is_none()
                .then(|| "`start_milestone` needs `name`".into())
        });
        if let Some(why) = refusal {
            return Self::answer(brain, txn, item, work, why, false, AfterCall::GoOn);
        }
        self.cut(brain, txn, item, work, name.unwrap_or_default(), None)
    }

    /// A new milestone named `name`, and the line cutting its branch;
    /// `finishing` carries the finish call's summary when the finish cut
    /// it.
    fn cut(
        &self,
        brain: &BrainSettings,
        txn: &mut Txn<'_, '_>,
        item: &WorkItem,
        work: &mut Work,
        name: String,
        finishing: Option<(String, bool)>,
    ) -> Result<(), StoreError> {
        let Some(mut rec) = item_record(txn, &item.id)? else {
            return Ok(());
        };
        let Some(project) = self.config.projects.get(&rec.project).cloned() else {
            return Ok(());
        };
        let k = u32::try_from(work.milestones.len()).unwrap_or(u32::MAX) + 1;
        let branch = format!(
            "{}issue-{}-{k}-{}",
            nisse_policy::dev::harness::AGENT_BRANCH_PREFIX,
            rec.number,
            slug(&name)
        );
        let (summary, changes_expected) = finishing.clone().unwrap_or_default();
        work.milestones.push(Milestone {
            k,
            name,
            branch: branch.clone(),
            state: MilestoneState::Open,
            start: None,
            head: None,
            pull: None,
            pull_url: String::new(),
            instructions: Vec::new(),
            answering: Vec::new(),
            summary,
            changes_expected: finishing.is_none() || changes_expected,
            left_out: Vec::new(),
            files: Vec::new(),
            publishing: None,
            held: false,
            wants_merge: false,
            merging: None,
            merge_read_at_ns: None,
        });
        let kind = if finishing.is_some() {
            OpKind::CutToFinish
        } else {
            OpKind::Cut
        };
        let line = cut_line(&project.build_host(), &branch);
        self.run(brain, txn, item, &project, &mut rec, kind, line, false)
    }

    /// Sends a harness operation of a milestone.
    #[allow(clippy::too_many_arguments)]
    fn run(
        &self,
        brain: &BrainSettings,
        txn: &mut Txn<'_, '_>,
        item: &WorkItem,
        project: &Project,
        rec: &mut ItemRecord,
        kind: OpKind,
        line: String,
        with_key: bool,
    ) -> Result<(), StoreError> {
        let (secrets, timeout) = if with_key {
            (vec![project.push_secret.clone()], PUSH_TIMEOUT_MS)
        } else {
            (Vec::new(), LOCAL_TIMEOUT_MS)
        };
        let run: HarnessRun = self.new_run(item, rec, kind, line, secrets, timeout);
        self.send_run(brain, txn, item, project, rec, run)
    }

    fn finish_milestone(
        &self,
        brain: &BrainSettings,
        txn: &mut Txn<'_, '_>,
        item: &WorkItem,
        work: &mut Work,
        args: &Value,
    ) -> Result<(), StoreError> {
        let summary = text_arg(args, "summary");
        let refusal = Self::not_yet(work).or_else(|| {
            summary
                .is_none()
                .then(|| "`finish_milestone` needs `summary`".into())
        });
        if let Some(why) = refusal {
            return Self::answer(brain, txn, item, work, why, false, AfterCall::GoOn);
        }
        let summary = summary.unwrap_or_default();
        let expected = args
            .get("changes_expected")
            .and_then(Value::as_bool)
            .unwrap_or(true);
        match work.current() {
            Some(m) if matches!(m.state, MilestoneState::Open | MilestoneState::Published) => {
                m.summary = summary;
                m.changes_expected = expected;
                self.commit(brain, txn, item, work)
            }
            _ => {
                let name = summary.lines().next().unwrap_or("work").to_string();
                self.cut(brain, txn, item, work, name, Some((summary, expected)))
            }
        }
    }

    /// Sends the commit of the current milestone.
    fn commit(
        &self,
        brain: &BrainSettings,
        txn: &mut Txn<'_, '_>,
        item: &WorkItem,
        work: &mut Work,
    ) -> Result<(), StoreError> {
        let Some(mut rec) = item_record(txn, &item.id)? else {
            return Ok(());
        };
        let Some(project) = self.config.projects.get(&rec.project).cloned() else {
            return Ok(());
        };
        let Some(m) = work.milestones.last_mut() else {
            return Ok(());
        };
        let taken = std::mem::take(&mut m.instructions);
        m.answering.extend(taken);
        let Some(start) = m.start.clone() else {
            return Self::answer(
                brain,
                txn,
                item,
                work,
                "the milestone's branch was not cut".into(),
                false,
                AfterCall::GoOn,
            );
        };
        let message = format!("{}\n\nPart of #{}.", m.summary, rec.number);
        let line = commit_line(
            &project.build_host(),
            (&self.config.account, &self.config.email()),
            &m.branch,
            &start,
            &message,
        );
        self.run(
            brain,
            txn,
            item,
            &project,
            &mut rec,
            OpKind::Commit,
            line,
            false,
        )
    }

    /// The result of a milestone's harness operation (the workspace calls
    /// this for `Cut`, `Commit` and `Push`); `None` when it failed, with
    /// why.
    pub(crate) fn milestone_step(
        &mut self,
        brain: &BrainSettings,
        txn: &mut Txn<'_, '_>,
        item: &WorkItem,
        kind: OpKind,
        outcome: Result<&str, String>,
    ) -> Result<(), StoreError> {
        let mut work = load_work(txn, &item.id)?;
        let stdout = match outcome {
            Ok(out) => out,
            Err(why) => {
                if kind != OpKind::Commit
                    && let Some(m) = work.current()
                    && m.start.is_none()
                {
                    // The branch was never cut: the milestone never began.
                    work.milestones.pop();
                }
                Self::answer(brain, txn, item, &mut work, why, false, AfterCall::GoOn)?;
                return save_work(txn, &item.id, &work);
            }
        };
        let reported = Reported::parse(stdout);
        match kind {
            OpKind::Cut | OpKind::CutToFinish => {
                let wip_base = work.wip_base.take();
                let Some(m) = work.current() else {
                    return Ok(());
                };
                m.start = wip_base.or_else(|| reported.start.clone());
                let text = format!(
                    "milestone {} (“{}”) started on branch {} at {}",
                    m.k,
                    m.name,
                    m.branch,
                    reported.start.as_deref().unwrap_or("?")
                );
                txn.append(
                    &item.id,
                    &Actor::agent(&brain.agent),
                    &Event::Fact {
                        text: text.clone(),
                        data: json!({ "milestone": m.k, "branch": m.branch, "start": m.start }),
                    },
                )?;
                let note = format!(
                    "Milestone {} (“{}”) started on branch `{}`.",
                    m.k, m.name, m.branch
                );
                let k = m.k;
                self.progress(brain, txn, item, k, "started", note)?;
                if kind == OpKind::Cut {
                    Self::answer(brain, txn, item, &mut work, text, true, AfterCall::GoOn)?;
                } else {
                    self.commit(brain, txn, item, &mut work)?;
                }
            }
            OpKind::Commit => self.committed(brain, txn, item, &mut work, &reported)?,
            OpKind::Push => self.publish(brain, txn, item, &mut work)?,
            _ => {}
        }
        save_work(txn, &item.id, &work)
    }

    /// The commit reported: with changes, the push; without, done or
    /// raised with the operator.
    fn committed(
        &self,
        brain: &BrainSettings,
        txn: &mut Txn<'_, '_>,
        item: &WorkItem,
        work: &mut Work,
        reported: &Reported,
    ) -> Result<(), StoreError> {
        let Some(mut rec) = item_record(txn, &item.id)? else {
            return Ok(());
        };
        let Some(project) = self.config.projects.get(&rec.project).cloned() else {
            return Ok(());
        };
        let me = Actor::agent(&brain.agent);
        let Some(m) = work.current() else {
            return Ok(());
        };
        m.files = reported.files.clone();
        m.left_out = reported.left_out.clone();
        // Nothing new since the pull request was last updated (a branch
        // pushed whose publish failed is pushed and published again).
        let published_as_is = m.pull.is_some() && m.head.is_some() && m.head == reported.head;
        if reported.commits == 0 || published_as_is {
            if m.pull.is_some() {
                // The comments the commit was to answer wait for the next.
                let back = std::mem::take(&mut m.answering);
                m.instructions.splice(0..0, back);
                let text = format!(
                    "nothing changed since pull request #{} was last updated: nothing to publish",
                    m.pull.unwrap_or_default()
                );
                return Self::answer(brain, txn, item, work, text, false, AfterCall::GoOn);
            }
            if !m.changes_expected {
                m.state = MilestoneState::Done;
                let text = format!(
                    "milestone {} (“{}”) is done: it changed nothing, as expected",
                    m.k, m.name
                );
                txn.append(
                    &item.id,
                    &me,
                    &Event::Fact {
                        text: text.clone(),
                        data: json!({ "milestone": m.k, "done": "no changes" }),
                    },
                )?;
                return Self::answer(brain, txn, item, work, text, true, AfterCall::GoOn);
            }
            let question = format!(
                "Milestone {} (“{}”) was meant to change code, but there is nothing to commit on {}. What should I do?",
                m.k,
                md(&m.name),
                code(&m.branch)
            );
            let Some(call) = work.call.take() else {
                return Ok(());
            };
            return txn.agent_call_asks(brain.agent_loop(), item, &call, &question);
        }
        m.head = reported.head.clone();
        txn.append(
            &item.id,
            &me,
            &Event::Fact {
                text: format!(
                    "milestone {} committed at {}: {} file(s) changed since it started ({}){}",
                    m.k,
                    reported.head.as_deref().unwrap_or("?"),
                    m.files.len(),
                    m.files.join(", "),
                    if m.left_out.is_empty() {
                        String::new()
                    } else {
                        format!("; left out: {}", m.left_out.join(", "))
                    }
                ),
                data: json!({ "milestone": m.k, "head": m.head, "files": m.files, "left_out": m.left_out }),
            },
        )?;
        let branch = m.branch.clone();
        let Some(line) = project
            .build_host()
            .git_network_line(&GitNetwork::Push { branch })
        else {
            return Self::answer(
                brain,
                txn,
                item,
                work,
                "the project has no repository to push to".into(),
                false,
                AfterCall::GoOn,
            );
        };
        self.run(
            brain,
            txn,
            item,
            &project,
            &mut rec,
            OpKind::Push,
            line,
            true,
        )
    }

    /// Pushed: the pull request is opened or updated.
    fn publish(
        &self,
        brain: &BrainSettings,
        txn: &mut Txn<'_, '_>,
        item: &WorkItem,
        work: &mut Work,
    ) -> Result<(), StoreError> {
        let Some(rec) = item_record(txn, &item.id)? else {
            return Ok(());
        };
        let Some(project) = self.config.projects.get(&rec.project).cloned() else {
            return Ok(());
        };
        work.calls += 1;
        let n = work.calls;
        let Some(m) = work.current() else {
            return Ok(());
        };
        let request_id = format!("{HARNESS_PREFIX}{}:publish:{n}", item.id);
        let mut body = format!("{}\n\nPart of #{}.", m.summary, rec.number);
        if !m.left_out.is_empty() {
            body.push_str(&format!(
                "\n\nLeft out of the commit (ignored): {}.",
                m.left_out.join(", ")
            ));
        }
        m.publishing = Some(request_id.clone());
        let call = proto::gitea_request::Call::Publish(proto::GiteaPublishCall {
            head: m.branch.clone(),
            base: project.base_branch.clone(),
            title: m.name.clone(),
            body,
            agent_merges: project.agent_merges(),
        });
        emit_gitea(brain, txn, item, &rec.repository, request_id, call)
    }

    /// Publishes `item`'s held pull request, if it has one (its project's
    /// protection holds again). Whether it did.
    pub(crate) fn publish_held(
        &self,
        brain: &BrainSettings,
        txn: &mut Txn<'_, '_>,
        item: &WorkItem,
    ) -> Result<bool, StoreError> {
        let mut work = load_work(txn, &item.id)?;
        match work.current() {
            Some(m) if m.held => m.held = false,
            _ => return Ok(false),
        }
        self.publish(brain, txn, item, &mut work)?;
        save_work(txn, &item.id, &work)?;
        Ok(true)
    }

    /// A Gitea call's answer that is a milestone's: the publish (then the
    /// replies to review comments, and the call's result). Whether it was.
    pub(crate) fn milestone_gitea(
        &self,
        brain: &BrainSettings,
        txn: &mut Txn<'_, '_>,
        item: &WorkItem,
        result: &GiteaResult,
    ) -> Result<bool, StoreError> {
        if self.merge_result(brain, txn, item, result)? {
            return Ok(true);
        }
        let mut work = load_work(txn, &item.id)?;
        let me = Actor::agent(&brain.agent);
        let Some(rec) = item_record(txn, &item.id)? else {
            return Ok(false);
        };
        let reply = result.request_id.contains(":reply:");
        if reply || result.request_id.contains(":progress:") {
            if GiteaCallStatus::try_from(result.status).unwrap_or_default() != GiteaCallStatus::Done
            {
                txn.append(
                    &item.id,
                    &me,
                    &Event::Fact {
                        text: format!(
                            "{} could not be posted in Gitea: {}",
                            if reply {
                                "a reply to a review comment"
                            } else {
                                "a progress comment on the issue"
                            },
                            result.reason
                        ),
                        data: json!({ "comment_failed": result.request_id }),
                    },
                )?;
            }
            return Ok(true);
        }
        let Some(m) = work
            .milestones
            .iter_mut()
            .find(|m| m.publishing.as_deref() == Some(result.request_id.as_str()))
        else {
            return Ok(false);
        };
        m.publishing = None;
        // Refused for the project's protection: held, the call unanswered,
        // until a check finds it restored (crate::protection).
        if let Some(problems) = result
            .protection
            .as_ref()
            .map(|p| p.problems.clone())
            .filter(|p| !p.is_empty())
        {
            m.held = true;
            let what = format!("the pull request of milestone {}", m.k);
            save_work(txn, &item.id, &work)?;
            let project = self.project_record_of(txn, &rec.project)?;
            self.verdict(brain, txn, &rec.project, project, problems.clone())?;
            let item = txn.item(&item.id)?.unwrap_or_else(|| item.clone());
            self.block_unprotected(brain, txn, &item, &rec, &what, &problems)?;
            return Ok(true);
        }
        if GiteaCallStatus::try_from(result.status).unwrap_or_default() != GiteaCallStatus::Done {
            let why = format!(
                "the pull request for {} could not be published (HTTP {}): {}; the branch is pushed, and finish_milestone publishes it again",
                m.branch, result.http_status, result.reason
            );
            Self::answer(brain, txn, item, &mut work, why, false, AfterCall::GoOn)?;
            save_work(txn, &item.id, &work)?;
            return Ok(true);
        }
        let pull = result.pull.clone().unwrap_or_default();
        let first = m.pull.is_none();
        m.pull = Some(pull.number);
        m.pull_url = pull.html_url.clone();
        m.state = MilestoneState::Published;
        let instructions = std::mem::take(&mut m.answering);
        let (k, head, summary) = (m.k, m.head.clone().unwrap_or_default(), m.summary.clone());
        let how = match (first, result.adopted) {
            (true, false) => "opened",
            (true, true) => "adopted (it was already open for the branch) and updated",
            (false, _) => "updated",
        };
        if first {
            let note = format!("Milestone {k}: pull request #{} opened.", pull.number);
            self.progress(brain, txn, item, k, "opened", note)?;
        }
        let text = format!(
            "pull request #{} for milestone {k} {how}: {}",
            pull.number, pull.html_url
        );
        let event = txn.append(
            &item.id,
            &me,
            &Event::Fact {
                text: text.clone(),
                data: json!({ "milestone": k, "pull": pull.number, "adopted": result.adopted, "head": head }),
            },
        )?;
        txn.say(
            &brain.agent,
            item,
            event,
            Say::question(format!(
                "📬 Item **#{}**: pull request [#{}]({}) {how}. It waits for your review.",
                item.number,
                pull.number,
                nisse_core::markdown::link_target(&pull.html_url).unwrap_or_default()
            )),
        )?;
        let short: String = head.chars().take(10).collect();
        for ins in &instructions {
            work.calls += 1;
            let request_id = format!(
                "{HARNESS_PREFIX}{}:reply:{}:{}",
                item.id, ins.comment_id, work.calls
            );
            let body = format!("Addressed in {short}: {summary}");
            let call = if ins.path.is_empty() {
                proto::gitea_request::Call::Comment(proto::GiteaCommentCall {
                    issue_number: pull.number,
                    body,
                })
            } else {
                proto::gitea_request::Call::ReviewReply(proto::GiteaReviewReply {
                    pull_number: pull.number,
                    comment_id: ins.comment_id,
                    path: ins.path.clone(),
                    line: ins.line,
                    old_line: ins.old_line,
                    body,
                })
            };
            emit_gitea(brain, txn, item, &rec.repository, request_id, call)?;
        }
        if matches!(item.state, State::Active | State::Ready) {
            txn.transition(
                &item.id,
                Transition::AwaitOperator,
                &format!("pull request #{} waits for review", pull.number),
                &me,
            )?;
        }
        let result_text = format!(
            "{text}. Files: {}.{} It waits for the operator's review: their comments will come to you as instructions, and its merge as news.",
            work.current()
                .map(|m| m.files.join(", "))
                .unwrap_or_default(),
            match work.current() {
                Some(m) if !m.left_out.is_empty() =>
                    format!(" Left out (ignored): {}.", m.left_out.join(", ")),
                _ => String::new(),
            }
        );
        Self::answer(
            brain,
            txn,
            item,
            &mut work,
            result_text,
            true,
            AfterCall::Wait,
        )?;
        save_work(txn, &item.id, &work)?;
        Ok(true)
    }

    /// An event on one of the item's pull requests or on its issue: a
    /// merge or close of a milestone's pull request, a comment. The
    /// operator's comments are instructions; anyone else's are data.
    pub(crate) fn pull_event(
        &self,
        brain: &BrainSettings,
        txn: &mut Txn<'_, '_>,
        item: &WorkItem,
        event: &GiteaEvent,
    ) -> Result<(), StoreError> {
        if event.sender.eq_ignore_ascii_case(&self.config.account) {
            // The agent's own comments and pull request changes.
            return Ok(());
        }
        self.approval_event(brain, txn, item, event)?;
        let mut work = load_work(txn, &item.id)?;
        let Some(rec) = item_record(txn, &item.id)? else {
            return Ok(());
        };
        let me = Actor::agent(&brain.agent);
        let number = event
            .pull
            .as_ref()
            .map(|p| p.number)
            .or_else(|| event.issue.as_ref().map(|i| i.number))
            .unwrap_or_default();
        let on_issue = event
            .issue
            .as_ref()
            .is_some_and(|i| !i.is_pull && i.number == rec.number);
        let milestone = work.milestones.iter_mut().find(|m| m.pull == Some(number));
        if milestone.is_none() && !on_issue {
            return Ok(());
        }
        if event.event == "pull_request"
            && let (Some(m), Some(pull)) = (milestone, event.pull.as_ref())
        {
            let news = if pull.merged && m.state != MilestoneState::Merged {
                m.state = MilestoneState::Merged;
                let note = format!("Milestone {}: pull request #{number} merged.", m.k);
                let k = m.k;
                self.progress(brain, txn, item, k, "merged", note)?;
                format!(
                    "pull request #{number} (milestone {k}) was merged by {}",
                    event.sender
                )
            } else if pull.state == "closed" && !pull.merged && m.state == MilestoneState::Published
            {
                m.state = MilestoneState::Closed;
                format!(
                    "pull request #{number} (milestone {}) was closed without merging by {}",
                    m.k, event.sender
                )
            } else {
                return Ok(());
            };
            txn.append(
                &item.id,
                &me,
                &Event::Fact {
                    text: news.clone(),
                    data: json!({ "pull": number, "merged": pull.merged }),
                },
            )?;
            if item.state == State::WaitingOnOperator {
                txn.transition(&item.id, Transition::OperatorAnswered, &news, &me)?;
            }
            txn.loop_wake(&item.id, &news)?;
            return save_work(txn, &item.id, &work);
        }
        let Some(comment) = event.comment.as_ref().filter(|c| !c.body.trim().is_empty()) else {
            return Ok(());
        };
        let author = gitea_actor(brain, &comment.author);
        let operator = author.kind == ActorKind::Operator;
        let place = if comment.path.is_empty() {
            if on_issue {
                format!("issue #{number}")
            } else {
                format!("pull request #{number}")
            }
        } else {
            format!("pull request #{number}, {}:{}", comment.path, comment.line)
        };
        txn.append(
            &item.id,
            &author,
            &Event::Said {
                via: "gitea".into(),
                text: format!("(on {place}) {}", comment.body.trim()),
                operator,
                read_as: if on_issue {
                    "issue comment"
                } else {
                    "review comment"
                }
                .into(),
            },
        )?;
        if !operator {
            // Others' comments are data: on record, nothing follows.
            return Ok(());
        }
        if let Some(m) = work.milestones.iter_mut().find(|m| m.pull == Some(number))
            && !m.instructions.iter().any(|i| i.comment_id == comment.id)
        {
            m.instructions.push(Instruction {
                comment_id: comment.id,
                path: comment.path.clone(),
                line: comment.line,
                old_line: comment.old_line,
            });
        }
        if item.state == State::WaitingOnOperator {
            txn.transition(
                &item.id,
                Transition::OperatorAnswered,
                &format!("{} commented on {place} in Gitea", comment.author),
                &author,
            )?;
        }
        txn.loop_operator_said(item, comment.body.trim())?;
        save_work(txn, &item.id, &work)
    }

    /// The item closed by the agent's `finish`: the Gitea issue is closed
    /// with a note saying what was done and what is left open.
    pub(crate) fn close_finished(
        &self,
        brain: &BrainSettings,
        txn: &mut Txn<'_, '_>,
        item: &WorkItem,
    ) -> Result<(), StoreError> {
        let mut work = load_work(txn, &item.id)?;
        let Some(rec) = item_record(txn, &item.id)? else {
            return Ok(());
        };
        // The last `finish` that succeeded: the item closed by it.
        let events = txn.events(&item.id)?;
        let finished: Vec<&str> = events
            .iter()
            .filter_map(|e| match &e.event {
                Event::ToolResult {
                    call_id,
                    success: true,
                    ..
                } => Some(call_id.as_str()),
                _ => None,
            })
            .collect();
        let finish = events.iter().rev().find_map(|e| match &e.event {
            Event::ToolCall {
                call_id,
                tool,
                arguments,
                ..
            } if tool == "finish" && finished.contains(&call_id.as_str()) => {
                serde_json::from_str::<Value>(arguments).ok()
            }
            _ => None,
        });
        let Some(finish) = finish else {
            // Closed some other way (the issue closed, the operator
            // abandoned it): nothing to say in Gitea.
            return Ok(());
        };
        let part = |k: &str| text_arg(&finish, k).unwrap_or_else(|| "—".into());
        let mut open = Vec::new();
        let mut prs = Vec::new();
        for m in &work.milestones {
            match (m.pull, m.state) {
                (Some(p), MilestoneState::Merged) => prs.push(format!("#{p} merged")),
                (Some(p), MilestoneState::Published | MilestoneState::Open) => {
                    open.push(format!("pull request #{p} is still open"));
                }
                (Some(p), MilestoneState::Closed) => prs.push(format!("#{p} closed unmerged")),
                (None, MilestoneState::Open) => {
                    open.push(format!(
                        "milestone {} on {} was never published",
                        m.k, m.branch
                    ));
                }
                _ => {}
            }
        }
        let mut left = part("left_open");
        if !open.is_empty() {
            left = format!("{left}; {}", open.join("; "));
        }
        let note = format!(
            "Done by the agent (item #{}).\n\n**Done:** {}\n\n**Verified:** {}\n\n**Pull requests:** {}\n\n**Left open:** {left}",
            item.number,
            part("done"),
            part("verified"),
            if prs.is_empty() {
                "none".to_string()
            } else {
                prs.join(", ")
            },
        );
        work.calls += 1;
        let request_id = format!("{HARNESS_PREFIX}{}:close:{}", item.id, work.calls);
        save_work(txn, &item.id, &work)?;
        emit_gitea(
            brain,
            txn,
            item,
            &rec.repository,
            request_id,
            proto::gitea_request::Call::CloseIssue(proto::GiteaCloseIssue {
                number: rec.number,
                note,
            }),
        )
    }
}

/// Sends one Gitea call for `item`.
impl DevDuties {
    /// A fact of the harness's as a comment on the item's issue, for
    /// whoever follows it in Gitea (D1): `what` (started, opened, merged)
    /// of milestone `k`, once each (the request id is derived from them).
    pub(crate) fn progress(
        &self,
        brain: &BrainSettings,
        txn: &mut Txn<'_, '_>,
        item: &WorkItem,
        k: u32,
        what: &str,
        body: String,
    ) -> Result<(), StoreError> {
        let Some(rec) = item_record(txn, &item.id)? else {
            return Ok(());
        };
        let request_id = format!("{HARNESS_PREFIX}{}:progress:{k}:{what}", item.id);
        let call = proto::gitea_request::Call::Comment(proto::GiteaCommentCall {
            issue_number: rec.number,
            body,
        });
        emit_gitea(brain, txn, item, &rec.repository, request_id, call)
    }
}

/// Parking committed `item_id`'s work on top of `before`: when no
/// milestone is open, the next one counts its changes from there (the
/// first such commit's, if parking happens more than once).
pub(crate) fn parked_at(
    txn: &mut Txn<'_, '_>,
    item_id: &str,
    before: &str,
) -> Result<(), StoreError> {
    let mut work = load_work(txn, item_id)?;
    let open = work
        .milestones
        .last()
        .is_some_and(|m| m.state == MilestoneState::Open);
    if !open && work.wip_base.is_none() && !before.is_empty() {
        work.wip_base = Some(before.to_string());
        save_work(txn, item_id, &work)?;
    }
    Ok(())
}

/// Whether `item_id` has a pull request held for its project's
/// protection.
pub(crate) fn holds_publish(txn: &Txn<'_, '_>, item_id: &str) -> Result<bool, StoreError> {
    Ok(load_work(txn, item_id)?.milestones.iter().any(|m| m.held))
}

pub(crate) fn emit_gitea(
    brain: &BrainSettings,
    txn: &mut Txn<'_, '_>,
    item: &WorkItem,
    repository: &str,
    request_id: String,
    call: proto::gitea_request::Call,
) -> Result<(), StoreError> {
    let request = GiteaRequest {
        envelope: Some(txn.agent_envelope(&brain.agent, &item.id, format!("gitea:{request_id}"))),
        request_id,
        repository: repository.to_string(),
        call: Some(call),
    };
    txn.emit(&request)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_go_words_are_a_go_ahead() {
        for yes in ["go", "Go!", "go ahead.", "  GO   AHEAD ", "proceed", "lgtm"] {
            assert!(is_go_ahead(yes), "{yes}");
        }
        for no in [
            "",
            "go away",
            "no, don't go",
            "wait",
            "go ahead but use the other file",
        ] {
            assert!(!is_go_ahead(no), "{no}");
        }
    }

    #[test]
    fn branch_slugs_are_plain_and_short() {
        assert_eq!(
            slug("Fix the off-by-one in Parser::next()"),
            "fix-the-off-by-one-in-parser-next"
        );
        assert_eq!(slug("!!!"), "work");
        assert!(slug(&"word ".repeat(30)).len() <= 40);
        assert!(nisse_policy::dev::harness::is_branch_name(&format!(
            "nisse/issue-3-1-{}",
            slug("Ünïcode — ok?")
        )));
    }

    #[test]
    fn milestone_reports_are_read() {
        let r = Reported::parse(
            "nisse: left-out target/\nnisse: head abc\nnisse: commits 2\nnisse: file src/a.rs\nnisse: file README.md\nother\n",
        );
        assert_eq!(r.head.as_deref(), Some("abc"));
        assert_eq!(r.commits, 2);
        assert_eq!(r.files, ["src/a.rs", "README.md"]);
        assert_eq!(r.left_out, ["target/"]);
    }
}
