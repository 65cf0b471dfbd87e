//! New projects start as a conversation (seed Nisse D1: "a conversation in
//! the agent's room that leads to a project").
//!
//! - An item the operator opens (talk at the top of the agent's room,
//!   which the shared brain turns into an item whose thread hangs from
//!   that message, or `nisse item open`) is a conversation: the model
//!   talks with the operator in its thread. It has no issue and no
//!   workspace, so nothing runs on any host.
//! - When the talk should become a project, the model calls
//!   `propose_project` (name, repository, summary, the tracking issue's
//!   title and body, what the build host needs). The harness checks the
//!   names, and tells the operator in the thread exactly what to
//!   provision: the repository with its base branch and protection, the
//!   agent's access, a build host, and the `nisse dev project add` line
//!   that registers it. The item waits on the operator meanwhile; talk
//!   in its thread goes back to the model, which may propose again.
//! - Once a project of that name (or repository) is in the configuration
//!   (`nisse dev project add`, then the services restarted), the harness
//!   opens the tracking issue in Gitea, assigned to the agent's account,
//!   and the conversation becomes that issue's item: the registration is
//!   the operator's go-ahead, the workspace is prepared as for any item,
//!   and the first milestone's pull request lands the architecture.
//!
//! The issue is made once: its request id is the item's and the attempt's,
//! and intake-gitea adopts the issue an earlier delivery of it made.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use nisse_bus::proto::{self, GiteaCallStatus, GiteaResult};
use nisse_core::agent_loop::AfterCall;
use nisse_core::markdown::{code_block, md_escape as md};
use nisse_core::{Actor, BrainSettings, Event, Say, State, StoreError, Transition, Txn, WorkItem};

use crate::brain::{DevDuties, HARNESS_PREFIX};
use crate::config::{Project, is_project_name, is_repository};
use crate::issues::{
    IssueRecord, ItemRecord, Phase, issue_key, read, save_issue, save_item, write,
};
use crate::milestones::{arguments, emit_gitea, load_work, save_work, text_arg};

/// The prefix of a conversation's record in the store's duty table.
const TALK_RECORD: &str = "dev.talk.";

/// What the agent keeps about one conversation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Talk {
    /// Who started it (`<channel>:<identity>`: `matrix:@alice:example.org`,
    /// `cli:alice`).
    pub started_by: String,
    /// The project the model proposed last, if any.
    pub proposal: Option<Proposal>,
    /// Where it stands.
    pub stage: Stage,
    /// Tracking issue requests sent so far (each its own request id).
    pub requests: u32,
    /// The agent tool's call being handled.
    pub call: Option<String>,
}

/// Where a conversation stands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "is", rename_all = "snake_case")]
pub(crate) enum Stage {
    /// The model and the operator talk.
    Talking,
    /// A project is proposed: it waits to be provisioned and registered.
    Provisioning,
    /// The project is registered; its tracking issue is being opened.
    Opening { request_id: String },
    /// Gitea did not make the tracking issue: the operator's `retry` asks
    /// again.
    Failed { reason: String },
    /// The tracking issue is open: the item is its issue's now.
    Opened { number: u64 },
}

/// A project the model proposed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Proposal {
    pub name: String,
    pub repository: String,
    pub summary: String,
    pub title: String,
    pub body: String,
    /// What its build host needs (toolchains, services), in the model's
    /// words.
    pub needs: Vec<String>,
}

fn talk_key(item_id: &str) -> String {
    format!("{TALK_RECORD}{item_id}")
}

/// The conversation record of `item_id`, if the item is one.
pub(crate) fn talk_record(txn: &Txn<'_, '_>, item_id: &str) -> Result<Option<Talk>, StoreError> {
    read(txn, &talk_key(item_id))
}

/// Reads a proposal from `propose_project`'s arguments, or says what is
/// wrong with them.
fn proposal(args: &Value) -> Result<Proposal, String> {
    let field = |key: &str| text_arg(args, key).ok_or(format!("`propose_project` needs `{key}`"));
    let name = field("name")?;
    if !is_project_name(&name) {
        return Err(format!(
            "the project name `{name}` must be lowercase letters, digits, `-` and `_`"
        ));
    }
    let repository = field("repository")?;
    if !is_repository(&repository) {
        return Err(format!(
            "the repository `{repository}` must be `owner/name` as Gitea allows them"
        ));
    }
    let title = field("issue_title")?;
    if title.contains(['\n', '\r']) {
        return Err("`issue_title` must be one line".into());
    }
    let needs = match args.get("build_host_needs") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(a)) => a
            .iter()
            .map(|v| {
                v.as_str()
                    .map(|s| s.trim().to_string())
                    .ok_or("`build_host_needs` must be a list of strings".to_string())
            })
            .filter(|n| n.as_ref().map_or(true, |s| !s.is_empty()))
            .collect::<Result<_, _>>()?,
        Some(_) => return Err("`build_host_needs` must be a list of strings".into()),
    };
    Ok(Proposal {
        name,
        repository,
        summary: field("summary")?,
        title,
        body: field("issue_body")?,
        needs,
    })
}

impl DevDuties {
    /// The configured project a proposal became: the one of its name, or
    /// of its repository (the operator may have named it otherwise).
    fn registered<'a>(&'a self, p: &Proposal) -> Option<(&'a str, &'a Project)> {
        self.config
            .projects
            .get_key_value(&p.name)
            .map(|(n, pr)| (n.as_str(), pr))
            .or_else(|| self.config.project_of(&p.repository))
    }

    /// `item` is a conversation from now on, started by `by`: its loop
    /// opens when it becomes active ([`DevDuties::start_talk`]).
    pub(crate) fn start_conversation(
        txn: &mut Txn<'_, '_>,
        item: &WorkItem,
        by: &str,
    ) -> Result<(), StoreError> {
        write(
            txn,
            &talk_key(&item.id),
            &Talk {
                started_by: by.to_string(),
                proposal: None,
                stage: Stage::Talking,
                requests: 0,
                call: None,
            },
        )
    }

    /// The active item is a conversation: its loop opens the first time.
    pub(crate) fn start_talk(
        &self,
        brain: &BrainSettings,
        txn: &mut Txn<'_, '_>,
        item: &WorkItem,
    ) -> Result<(), StoreError> {
        if talk_record(txn, &item.id)?.is_none() || txn.loop_state(&item.id)?.is_some() {
            return Ok(());
        }
        txn.loop_open(
            brain.agent_loop(),
            item,
            "the operator started a conversation",
        )
    }

    /// The agent tool a conversation's loop waits on, taken up once:
    /// `propose_project`; the issue tools have no issue to work on.
    pub(crate) fn talk_tools(
        &self,
        brain: &BrainSettings,
        txn: &mut Txn<'_, '_>,
        item: &WorkItem,
    ) -> Result<(), StoreError> {
        let Some(mut talk) = talk_record(txn, &item.id)? else {
            return Ok(());
        };
        let Some(call) = txn.agent_call(&item.id)? else {
            return Ok(());
        };
        if talk.call.as_deref() == Some(call.id.as_str()) {
            return Ok(());
        }
        talk.call = Some(call.id.clone());
        let args = arguments(&call);
        let answered = match call.tool.as_str() {
            "propose_project" => self.propose(brain, txn, item, &mut talk, &args)?,
            other => Some((
                format!(
                    "`{other}` works on an issue's workspace, and this item is a conversation with neither yet: talk with ask_human, and call propose_project when it should become a project"
                ),
                false,
                AfterCall::GoOn,
            )),
        };
        if let Some((result, success, after)) = answered {
            talk.call = None;
            txn.agent_call_done(brain.agent_loop(), item, &call.id, result, success, after)?;
        }
        write(txn, &talk_key(&item.id), &talk)
    }

    /// `propose_project`: checked, then the operator is asked to provision
    /// it (or, when it is registered already, its tracking issue opened).
    /// The call's answer, when it has one now.
    fn propose(
        &self,
        brain: &BrainSettings,
        txn: &mut Txn<'_, '_>,
        item: &WorkItem,
        talk: &mut Talk,
        args: &Value,
    ) -> Result<Option<(String, bool, AfterCall)>, StoreError> {
        if !matches!(talk.stage, Stage::Talking | Stage::Provisioning) {
            return Ok(Some((
                "the project is registered already and its tracking issue is being opened: it cannot change now".into(),
                false,
                AfterCall::GoOn,
            )));
        }
        let p = match proposal(args) {
            Ok(p) => p,
            Err(why) => return Ok(Some((why, false, AfterCall::GoOn))),
        };
        if let Some(other) = self.config.projects.get(&p.name)
            && !other.repository.eq_ignore_ascii_case(&p.repository)
        {
            return Ok(Some((
                format!(
                    "there is a project `{}` already, on {}: choose another name",
                    p.name, other.repository
                ),
                false,
                AfterCall::GoOn,
            )));
        }
        let me = Actor::agent(&brain.agent);
        let event = txn.append(
            &item.id,
            &me,
            &Event::Fact {
                text: format!(
                    "the agent proposed project {} on {}",
                    p.name, p.repository
                ),
                data: json!({ "proposed_project": p.name, "repository": p.repository, "needs": p.needs }),
            },
        )?;
        talk.proposal = Some(p.clone());
        talk.stage = Stage::Provisioning;
        if self.registered(&p).is_some() {
            self.open_tracking(brain, txn, item, talk)?;
            return Ok(Some((
                format!(
                    "project {} is registered already: the harness opens its tracking issue and prepares the workspace",
                    p.name
                ),
                true,
                AfterCall::Wait,
            )));
        }
        txn.say(
            &brain.agent,
            item,
            event,
            Say::question(self.provisioning(&p)),
        )?;
        if item.state != State::WaitingOnOperator {
            txn.transition(
                &item.id,
                Transition::AwaitOperator,
                &format!("project {} waits to be provisioned and registered", p.name),
                &me,
            )?;
        }
        Ok(Some((
            format!(
                "The operator was asked to provision project {} and register it. The item waits until it is registered; what the operator says meanwhile comes to you.",
                p.name
            ),
            true,
            AfterCall::Wait,
        )))
    }

    /// What the operator is asked to provision for `p`, rendered by code
    /// (the model's words in it escaped).
    fn provisioning(&self, p: &Proposal) -> String {
        let account = md(&self.config.account);
        let base = "main";
        let owner = p.repository.split('/').next().unwrap_or_default();
        let mut text = format!(
            "🏗️ Proposed project **{}** on `{}`: {}\n\nTo start it I need:\n\
             1. The repository `{}` in Gitea, its base branch `{base}` with a first commit (a README is enough).\n\
             2. Branch protection on `{base}`: no pushes by `{account}`, and merges need an approval `{account}` cannot give.\n\
             3. `{account}` with write access to it (a collaborator of `{}`), its push key on its account.\n\
             4. A build host for it the executor reaches, as `[executor.agents.dev.hosts.<host>]` with the push key secret",
            md(&p.name),
            md(&p.repository),
            md(&p.summary),
            md(&p.repository),
            md(owner),
        );
        if p.needs.is_empty() {
            text.push('.');
        } else {
            text.push_str(", with:");
            for need in &p.needs {
                text.push_str(&format!("\n   - {}", md(need)));
            }
        }
        text.push_str(&format!(
            "\n5. Then register it, and restart the dev services:\n{}\n\n\
             Once it is registered I open the tracking issue, “{}”, and land the architecture in a first pull request.",
            code_block(&format!(
                "nisse dev project add {} --repository {} --build-host <host> --workspace <path on the host> --clone-url <ssh clone url>",
                p.name, p.repository
            )),
            md(&p.title),
        ));
        text
    }

    /// At a tick: every proposed project that is registered now gets its
    /// tracking issue.
    pub(crate) fn talks_due(
        &self,
        brain: &BrainSettings,
        txn: &mut Txn<'_, '_>,
    ) -> Result<(), StoreError> {
        for (key, json) in txn.duty_states_under(TALK_RECORD)? {
            let mut talk: Talk = serde_json::from_str(&json)
                .map_err(|e| StoreError::Corrupt(format!("the dev record {key}: {e}")))?;
            if talk.stage != Stage::Provisioning {
                continue;
            }
            let registered = talk
                .proposal
                .as_ref()
                .is_some_and(|p| self.registered(p).is_some());
            let item = txn.item(key.trim_start_matches(TALK_RECORD))?;
            if let Some(item) = item.filter(|i| i.state.is_open() && registered) {
                self.open_tracking(brain, txn, &item, &mut talk)?;
                write(txn, &key, &talk)?;
            }
        }
        Ok(())
    }

    /// The proposed project is registered: its tracking issue is asked
    /// for, in the configured project's repository.
    fn open_tracking(
        &self,
        brain: &BrainSettings,
        txn: &mut Txn<'_, '_>,
        item: &WorkItem,
        talk: &mut Talk,
    ) -> Result<(), StoreError> {
        let Some(p) = talk.proposal.clone() else {
            return Ok(());
        };
        let Some((name, project)) = self.registered(&p) else {
            return Ok(());
        };
        talk.requests += 1;
        let request_id = format!("{HARNESS_PREFIX}{}:tracking:{}", item.id, talk.requests);
        let (via, who) = talk
            .started_by
            .split_once(':')
            .unwrap_or(("", talk.started_by.as_str()));
        let body = format!(
            "{}\n\n---\nOpened by the agent from a conversation with {who} ({via}, item #{}).",
            p.body.trim_end(),
            item.number
        );
        emit_gitea(
            brain,
            txn,
            item,
            &project.repository,
            request_id.clone(),
            proto::gitea_request::Call::CreateIssue(proto::GiteaCreateIssue {
                title: p.title.clone(),
                body,
                assignees: vec![self.config.account.clone()],
            }),
        )?;
        talk.stage = Stage::Opening { request_id };
        let me = Actor::agent(&brain.agent);
        let why = format!(
            "project {name} is registered: the agent opens its tracking issue on {}",
            project.repository
        );
        let event = txn.append(
            &item.id,
            &me,
            &Event::Fact {
                text: why.clone(),
                data: json!({ "registered_project": name, "repository": project.repository }),
            },
        )?;
        // Read again: a `retry` may have moved it already.
        let waiting = txn
            .item(&item.id)?
            .is_some_and(|i| i.state == State::WaitingOnOperator);
        if waiting {
            txn.transition(&item.id, Transition::OperatorAnswered, &why, &me)?;
        }
        txn.say(
            &brain.agent,
            item,
            event,
            Say::fact(format!(
                "✅ Project **{}** is registered; I open its tracking issue on `{}`.",
                md(name),
                md(&project.repository)
            )),
        )
    }

    /// Intake-gitea answered a tracking issue request: `true` when
    /// `result` was one. Made, the conversation becomes the issue's item;
    /// refused, the operator hears why and may `retry`.
    pub(crate) fn tracking_result(
        &self,
        brain: &BrainSettings,
        txn: &mut Txn<'_, '_>,
        result: &GiteaResult,
    ) -> Result<bool, StoreError> {
        let item_id =
            nisse_bus::Decode::envelope(&nisse_bus::AnyMessage::GiteaResult(result.clone()))
                .work_item_id
                .clone();
        let Some(mut talk) = talk_record(txn, &item_id)? else {
            return Ok(false);
        };
        if talk.stage
            != (Stage::Opening {
                request_id: result.request_id.clone(),
            })
        {
            return Ok(false);
        }
        let Some(item) = txn.item(&item_id)? else {
            return Ok(true);
        };
        let me = Actor::agent(&brain.agent);
        let registered = talk
            .proposal
            .as_ref()
            .and_then(|p| self.registered(p))
            .map(|(n, p)| (n.to_string(), p.clone()));
        let status = GiteaCallStatus::try_from(result.status).unwrap_or_default();
        let made = result
            .issue
            .as_ref()
            .filter(|_| status == GiteaCallStatus::Done);
        let (Some(issue), Some((name, project))) = (made, registered) else {
            let reason = if result.reason.is_empty() {
                "no issue in the answer".to_string()
            } else {
                result.reason.clone()
            };
            talk.stage = Stage::Failed {
                reason: reason.clone(),
            };
            write(txn, &talk_key(&item_id), &talk)?;
            let event = txn.append(
                &item.id,
                &me,
                &Event::Fact {
                    text: format!("Gitea did not open the tracking issue: {reason}"),
                    data: json!({ "tracking_issue_failed": reason, "http_status": result.http_status }),
                },
            )?;
            if item.state.is_open() && item.state != State::WaitingOnOperator {
                txn.transition(
                    &item.id,
                    Transition::AwaitOperator,
                    "the tracking issue could not be opened",
                    &me,
                )?;
            }
            txn.say(
                &brain.agent,
                &item,
                event,
                Say::question(format!(
                    "⚠️ Gitea did not open the tracking issue: {}. Say **retry** to try again.",
                    md(&reason)
                )),
            )?;
            return Ok(true);
        };
        let key = issue_key(&project.repository, issue.number);
        save_issue(
            txn,
            &key,
            &IssueRecord {
                item: Some(item.id.clone()),
                assigned_by: Some(self.config.account.clone()),
                state: issue.state.clone(),
                labels: issue.labels.clone(),
            },
        )?;
        let rec = ItemRecord::new(
            &name,
            &project.repository,
            issue.number,
            issue.labels.clone(),
            Phase::Queued,
        );
        save_item(txn, &item.id, &rec)?;
        talk.stage = Stage::Opened {
            number: issue.number,
        };
        write(txn, &talk_key(&item_id), &talk)?;
        // The operator registered what was proposed: that is the go-ahead.
        let mut work = load_work(txn, &item.id)?;
        self.go_ahead(txn, &item, &rec, &mut work)?;
        save_work(txn, &item.id, &work)?;
        let event = txn.append(
            &item.id,
            &me,
            &Event::Fact {
                text: format!(
                    "opened the tracking issue {}#{} of project {name}{}: the item is that issue's now, and the project's registration is the go-ahead",
                    project.repository,
                    issue.number,
                    if result.adopted { " (made earlier, found)" } else { "" }
                ),
                data: json!({ "tracking_issue": issue.number, "repository": project.repository, "project": name }),
            },
        )?;
        let link = nisse_core::markdown::link_target(&issue.html_url);
        let shown = format!("{}#{}", md(&project.repository), issue.number);
        txn.say(
            &brain.agent,
            &item,
            event,
            Say::fact(format!(
                "📌 Opened the tracking issue {}. Next: the workspace on `{}`, then the architecture as the first pull request.",
                match link {
                    Some(url) => format!("[{shown}]({url})"),
                    None => shown,
                },
                md(&project.build_host)
            )),
        )?;
        Ok(true)
    }

    /// The operator's `retry` on a conversation whose tracking issue
    /// Gitea did not make: asked again, under a new request id.
    pub(crate) fn retry_tracking(
        &self,
        brain: &BrainSettings,
        txn: &mut Txn<'_, '_>,
        item: &WorkItem,
    ) -> Result<Option<String>, StoreError> {
        let Some(mut talk) = talk_record(txn, &item.id)? else {
            return Ok(None);
        };
        if !matches!(talk.stage, Stage::Failed { .. }) {
            return Ok(None);
        }
        self.open_tracking(brain, txn, item, &mut talk)?;
        write(txn, &talk_key(&item.id), &talk)?;
        Ok(Some("the tracking issue is asked for again".into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_proposal_names_what_is_wrong_with_it() {
        let ok = json!({
            "name": "backup-watch", "repository": "alice/backup-watch",
            "summary": "Watches backups.", "issue_title": "Backup watcher",
            "issue_body": "Goals…", "build_host_needs": ["Rust 1.80"]
        });
        let p = proposal(&ok).unwrap();
        assert_eq!(p.needs, ["Rust 1.80"]);
        let with = |k: &str, v: Value| {
            let mut a = ok.clone();
            a[k] = v;
            proposal(&a).unwrap_err()
        };
        assert!(with("name", json!("Backup Watch")).contains("`Backup Watch`"));
        assert!(with("repository", json!("alice")).contains("owner/name"));
        assert!(with("issue_title", json!("a\nb")).contains("one line"));
        assert!(with("summary", json!(" ")).contains("`summary`"));
        assert!(with("build_host_needs", json!("Rust")).contains("list of strings"));
    }
}
