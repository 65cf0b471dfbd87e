//! Issue intake (seed Nisse D1): what happens in Gitea, read by code.
//!
//! - Only an issue assigned to the agent's account by an allowlisted
//!   operator becomes a work item: one open item per issue (its
//!   fingerprint is `gitea:<owner/name>#<number>`), the issue being the
//!   item's record (the agent opens no second one). An assignment by
//!   anyone else is recorded as data; an unassigned issue is backlog.
//! - On assignment the agent acknowledges in the item's thread with its
//!   place in the queue ("1 ahead"), and reads the issue's dependencies
//!   from Gitea: while any is open the item is blocked (L1: blocked is read
//!   from external truth), and read again when one of them closes or
//!   reopens, when the issue changes, and every `dev.recheck-blocked`.
//! - The issue closed in Gitea, or the agent unassigned by an operator,
//!   ends the item.
//!
//! What Gitea says is data: titles, bodies and comments are rendered to
//! the model as operator words only when an operator wrote them, and never
//! into a message to the operator except escaped.

use serde::{Deserialize, Serialize};

use nisse_bus::proto::{
    self, GiteaCallStatus, GiteaEvent, GiteaIssue, GiteaResult, gitea_request::Call,
};
use nisse_core::markdown::md_escape as md;
use nisse_core::{
    Actor, ActorKind, BrainSettings, Event, NewItem, Say, State, StoreError, Transition, Txn,
    WorkItem,
};

use crate::brain::{DevDuties, HARNESS_PREFIX};

/// The prefix of the dev agent's records in the store's duty table: one
/// per issue it has heard of, one per item.
const ISSUE_RECORD: &str = "dev.issue.";
const ITEM_RECORD: &str = "dev.item.";

/// What the agent keeps about one issue it heard of.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct IssueRecord {
    /// The work item it became, while that is open.
    pub item: Option<String>,
    /// Who last assigned the agent (an operator or not).
    pub assigned_by: Option<String>,
    /// The issue's state as last seen (`open`, `closed`).
    pub state: String,
    /// Its labels as last seen.
    pub labels: Vec<String>,
}

/// Where an item's work stands, as the dev harness sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "is", rename_all = "snake_case")]
pub(crate) enum Phase {
    /// Its dependencies are being read from Gitea.
    Checking,
    /// An open dependency blocks it.
    Blocked {
        /// The open issues it depends on.
        by: Vec<u64>,
    },
    /// Waiting for its turn.
    Queued,
    /// Its turn came, and its project's branch protection does not hold:
    /// it waits, blocked, until a check finds it restored.
    Unprotected,
    /// The workspace is being prepared on the build host.
    Preparing,
    /// The workspace is ready; the model reads the project and restates
    /// the request.
    Started,
    /// Another item's turn came: its work is committed and pushed on
    /// `branch`, where it resumes ([`crate::parking`]).
    Parked { branch: String },
    /// Its turn came again: the workspace is being put back on `branch`.
    Resuming { branch: String },
}

/// What the agent keeps about one of its items.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ItemRecord {
    /// The project.
    pub project: String,
    /// Its repository, `owner/name`.
    pub repository: String,
    /// The issue's number.
    pub number: u64,
    /// Labels as last seen: `bug` proceeds after the grace period,
    /// `discuss` and `design` mean talk first.
    pub labels: Vec<String>,
    /// Where it stands.
    pub phase: Phase,
    /// Dependency reads sent so far (each has its own request id).
    pub reads: u32,
    /// The dependency read in flight, if any.
    pub reading: Option<String>,
    /// When its dependencies were last read (ns since the epoch).
    pub read_at_ns: Option<i128>,
    /// Harness operations sent so far on the build host (each has its own
    /// request id, so one sent again after a halt is a new one the
    /// executor runs, not the old one it answers from its record).
    #[serde(default)]
    pub ops: u32,
    /// The harness operation in flight, if any.
    #[serde(default)]
    pub op: Option<crate::workspace::HarnessRun>,
    /// The item this one's operations are parking, while they do.
    #[serde(default)]
    pub parking: Option<String>,
    /// The branch the parked item's work was committed on, until pushed.
    #[serde(default)]
    pub parking_branch: Option<String>,
}

impl ItemRecord {
    /// The record of a new item for issue `number` of `repository`, in
    /// `phase`, nothing sent for it yet.
    pub(crate) fn new(
        project: &str,
        repository: &str,
        number: u64,
        labels: Vec<String>,
        phase: Phase,
    ) -> Self {
        Self {
            project: project.to_string(),
            repository: repository.to_string(),
            number,
            labels,
            phase,
            reads: 0,
            reading: None,
            read_at_ns: None,
            ops: 0,
            op: None,
            parking: None,
            parking_branch: None,
        }
    }
}

/// The item record of `item_id`, if it is a dev item.
pub(crate) fn item_record(
    txn: &Txn<'_, '_>,
    item_id: &str,
) -> Result<Option<ItemRecord>, StoreError> {
    read(txn, &format!("{ITEM_RECORD}{item_id}"))
}

/// A dev record from the store's duty table.
pub(crate) fn read<T: for<'de> Deserialize<'de>>(
    txn: &Txn<'_, '_>,
    key: &str,
) -> Result<Option<T>, StoreError> {
    txn.duty_state(key)?
        .map(|s| {
            serde_json::from_str(&s)
                .map_err(|e| StoreError::Corrupt(format!("the dev record {key}: {e}")))
        })
        .transpose()
}

/// A dev record into the store's duty table.
pub(crate) fn write<T: Serialize>(
    txn: &mut Txn<'_, '_>,
    key: &str,
    value: &T,
) -> Result<(), StoreError> {
    let json = serde_json::to_string(value)
        .map_err(|e| StoreError::Corrupt(format!("the dev record {key}: {e}")))?;
    txn.set_duty_state(key, &json)
}

/// Every dev item's record, with the item's id.
pub(crate) fn item_records(txn: &Txn<'_, '_>) -> Result<Vec<(String, ItemRecord)>, StoreError> {
    txn.duty_states_under(ITEM_RECORD)?
        .into_iter()
        .map(|(key, json)| {
            let rec = serde_json::from_str(&json)
                .map_err(|e| StoreError::Corrupt(format!("the dev record {key}: {e}")))?;
            Ok((key.trim_start_matches(ITEM_RECORD).to_string(), rec))
        })
        .collect()
}

pub(crate) fn save_item(
    txn: &mut Txn<'_, '_>,
    item_id: &str,
    record: &ItemRecord,
) -> Result<(), StoreError> {
    write(txn, &format!("{ITEM_RECORD}{item_id}"), record)
}

/// The record of the issue whose key is `key` ([`issue_key`]).
pub(crate) fn save_issue(
    txn: &mut Txn<'_, '_>,
    key: &str,
    record: &IssueRecord,
) -> Result<(), StoreError> {
    write(txn, &format!("{ISSUE_RECORD}{key}"), record)
}

/// An issue's key among the records and its items' fingerprint.
pub(crate) fn issue_key(repository: &str, number: u64) -> String {
    format!("gitea:{}#{number}", repository.to_ascii_lowercase())
}

/// A Gitea account as an actor: an operator when on the allowlist as
/// `gitea:<login>`, an outsider otherwise.
pub(crate) fn gitea_actor(brain: &BrainSettings, login: &str) -> Actor {
    Actor {
        kind: if brain.is_operator("gitea", login) {
            ActorKind::Operator
        } else {
            ActorKind::External
        },
        id: format!("gitea:{login}"),
    }
}

impl DevDuties {
    /// Applies one event from Gitea.
    pub(crate) fn gitea_event(
        &self,
        brain: &BrainSettings,
        txn: &mut Txn<'_, '_>,
        event: &GiteaEvent,
    ) -> Result<(), StoreError> {
        let Some((project, _)) = self.config.project_of(&event.repository) else {
            tracing::debug!(repository = %event.repository, "a Gitea event for no project of this agent");
            return Ok(());
        };
        let project = project.to_string();
        let Some(issue) = event.issue.as_ref().filter(|i| !i.is_pull) else {
            // Pull request events are the review loop's, for the item
            // whose milestone the pull request is.
            return self.on_pulls(brain, txn, event);
        };
        let key = issue_key(&event.repository, issue.number);
        let mut record: IssueRecord =
            read(txn, &format!("{ISSUE_RECORD}{key}"))?.unwrap_or_default();
        if event.comment.is_some() {
            // A comment on an item's issue: the operator's words to it.
            if let Some(item) = open_item(txn, &record)? {
                self.pull_event(brain, txn, &item, event)?;
            }
            return Ok(());
        }
        let was_open = record.state != "closed";
        record.state = issue.state.clone();
        record.labels = issue.labels.clone();
        let account = &self.config.account;
        let me_assignee = event.assignee.eq_ignore_ascii_case(account);
        match (event.event.as_str(), event.action.as_str()) {
            ("issues", "assigned") if me_assignee => {
                record.assigned_by = Some(event.sender.clone());
                self.assigned(brain, txn, event, issue, &project, &key, &mut record)?;
            }
            ("issues", "unassigned") if me_assignee => {
                if brain.is_operator("gitea", &event.sender) {
                    self.end_item(
                        brain,
                        txn,
                        &mut record,
                        &format!("{} unassigned the agent in Gitea", event.sender),
                    )?;
                } else if let Some(item) = open_item(txn, &record)? {
                    txn.append(
                        &item.id,
                        &gitea_actor(brain, &event.sender),
                        &Event::Fact {
                            text: format!(
                                "{} (not an operator) unassigned the agent in Gitea: recorded, nothing changes",
                                event.sender
                            ),
                            data: serde_json::json!({ "unassigned_by": event.sender }),
                        },
                    )?;
                }
            }
            _ => {}
        }
        let closed_now = issue.state == "closed";
        if closed_now && was_open {
            self.end_item(
                brain,
                txn,
                &mut record,
                &format!("the issue was closed in Gitea by {}", event.sender),
            )?;
        }
        if closed_now == was_open {
            // A dependency of other items changed state.
            self.recheck_dependents(brain, txn, &event.repository, issue.number)?;
        } else if let Some(item) = open_item(txn, &record)? {
            // The issue changed (an edit, a label, a dependency added in the
            // same breath): a blocked item reads its dependencies again.
            if let Some(mut rec) = item_record(txn, &item.id)? {
                rec.labels = issue.labels.clone();
                let blocked = matches!(rec.phase, Phase::Blocked { .. });
                save_item(txn, &item.id, &rec)?;
                if blocked {
                    self.read_dependencies(brain, txn, &item, &mut rec)?;
                }
            }
        }
        save_issue(txn, &key, &record)
    }

    /// An event on a pull request: the open items of its repository that
    /// published it see it.
    fn on_pulls(
        &self,
        brain: &BrainSettings,
        txn: &mut Txn<'_, '_>,
        event: &GiteaEvent,
    ) -> Result<(), StoreError> {
        for item in txn.open_items()? {
            if item_record(txn, &item.id)?
                .is_some_and(|r| r.repository.eq_ignore_ascii_case(&event.repository))
            {
                self.pull_event(brain, txn, &item, event)?;
            }
        }
        Ok(())
    }

    /// The agent was assigned to `issue`.
    #[allow(clippy::too_many_arguments)]
    fn assigned(
        &self,
        brain: &BrainSettings,
        txn: &mut Txn<'_, '_>,
        event: &GiteaEvent,
        issue: &GiteaIssue,
        project: &str,
        key: &str,
        record: &mut IssueRecord,
    ) -> Result<(), StoreError> {
        let by = gitea_actor(brain, &event.sender);
        if by.kind != ActorKind::Operator {
            tracing::info!(issue = %key, sender = %event.sender, "assigned by an account that is not an operator: no work item");
            return Ok(());
        }
        if issue.state == "closed" || open_item(txn, record)?.is_some() {
            // Closed, or already the agent's (a webhook and the poll both
            // tell one assignment).
            return Ok(());
        }
        let me = Actor::agent(&brain.agent);
        let title = format!("{}#{}", event.repository, issue.number);
        let item = txn.open_item(
            NewItem {
                title: title.clone(),
                scope: project.to_string(),
                source: format!("gitea:{}", event.sender),
                fingerprint: Some(key.to_string()),
                external_link: nisse_core::markdown::link_target(&issue.html_url),
                severity: issue
                    .labels
                    .iter()
                    .any(|l| l.eq_ignore_ascii_case("bug"))
                    .then(|| "bug".to_string()),
                priority: 0,
                id_seed: nisse_bus::Decode::envelope(&nisse_bus::AnyMessage::InGitea(
                    event.clone(),
                ))
                .message_id
                .clone(),
            },
            &me,
        )?;
        record.item = Some(item.id.clone());
        // The request in the issue's own words: the operator's when an
        // operator filed it, data otherwise.
        let author = gitea_actor(brain, &issue.author);
        txn.append(
            &item.id,
            &author,
            &Event::Said {
                via: "gitea".into(),
                text: format!("{}\n\n{}", issue.title.trim(), issue.body.trim()),
                operator: author.kind == ActorKind::Operator,
                read_as: "issue".into(),
            },
        )?;
        let event_id = txn.append(
            &item.id,
            &by,
            &Event::Fact {
                text: format!(
                    "{} assigned issue {title} to the agent in Gitea (labels: {})",
                    event.sender,
                    if issue.labels.is_empty() {
                        "none".to_string()
                    } else {
                        issue.labels.join(", ")
                    }
                ),
                data: serde_json::json!({
                    "repository": event.repository,
                    "issue": issue.number,
                    "assigned_by": event.sender,
                    "labels": issue.labels,
                }),
            },
        )?;
        let ahead = txn.ahead_of(&item.id)?;
        txn.say(
            &brain.agent,
            &item,
            event_id,
            Say::thread_root(format!(
                "📥 Queued **{}** (“{}”) as item **#{}**, {ahead}. Assigned by {} in Gitea.",
                md(&title),
                md(issue.title.trim()),
                item.number,
                md(&event.sender),
            )),
        )?;
        let mut rec = ItemRecord::new(
            project,
            &event.repository,
            issue.number,
            issue.labels.clone(),
            Phase::Checking,
        );
        self.read_dependencies(brain, txn, &item, &mut rec)
    }

    /// Sends a read of `item`'s issue and its dependencies, unless one is
    /// in flight.
    fn read_dependencies(
        &self,
        brain: &BrainSettings,
        txn: &mut Txn<'_, '_>,
        item: &WorkItem,
        rec: &mut ItemRecord,
    ) -> Result<(), StoreError> {
        if rec.reading.is_none() {
            rec.reads += 1;
            let request_id = format!("{HARNESS_PREFIX}{}:deps:{}", item.id, rec.reads);
            crate::milestones::emit_gitea(
                brain,
                txn,
                item,
                &rec.repository,
                request_id.clone(),
                Call::ReadIssue(proto::GiteaIssueRead { number: rec.number }),
            )?;
            rec.reading = Some(request_id);
        }
        save_item(txn, &item.id, rec)
    }

    /// The Gitea intake answered one of the harness's calls.
    pub(crate) fn gitea_result(
        &self,
        brain: &BrainSettings,
        txn: &mut Txn<'_, '_>,
        result: &GiteaResult,
    ) -> Result<(), StoreError> {
        let item_id =
            nisse_bus::Decode::envelope(&nisse_bus::AnyMessage::GiteaResult(result.clone()))
                .work_item_id
                .clone();
        let (Some(item), Some(mut rec)) = (txn.item(&item_id)?, item_record(txn, &item_id)?) else {
            return Ok(());
        };
        if rec.reading.as_deref() == Some(result.request_id.as_str()) {
            rec.reading = None;
            rec.read_at_ns = Some(txn.at().unix_timestamp_nanos());
            return self.dependencies_read(brain, txn, &item, rec, result);
        }
        self.milestone_gitea(brain, txn, &item, result).map(|_| ())
    }

    /// What the read of the issue's dependencies says: blocked while any
    /// is open.
    fn dependencies_read(
        &self,
        brain: &BrainSettings,
        txn: &mut Txn<'_, '_>,
        item: &WorkItem,
        mut rec: ItemRecord,
        result: &GiteaResult,
    ) -> Result<(), StoreError> {
        let me = Actor::agent(&brain.agent);
        let service = Actor {
            kind: ActorKind::Service,
            id: "intake-gitea".into(),
        };
        if GiteaCallStatus::try_from(result.status).unwrap_or_default() != GiteaCallStatus::Done {
            let event = txn.append(
                &item.id,
                &service,
                &Event::Fact {
                    text: format!(
                        "reading the issue's dependencies from Gitea failed: {}",
                        result.reason
                    ),
                    data: serde_json::json!({ "request": result.request_id, "http_status": result.http_status }),
                },
            )?;
            if item.state.is_open() && item.state != State::WaitingOnOperator {
                txn.transition(
                    &item.id,
                    Transition::AwaitOperator,
                    "its dependencies could not be read from Gitea",
                    &me,
                )?;
                txn.say(
                    &brain.agent,
                    item,
                    event,
                    Say::question(format!(
                        "⚠️ Could not read the dependencies of **{}#{}** from Gitea: {}. Say `retry` to read them again.",
                        md(&rec.repository),
                        rec.number,
                        md(&result.reason)
                    )),
                )?;
            }
            return save_item(txn, &item.id, &rec);
        }
        let mut open: Vec<u64> = result
            .dependencies
            .iter()
            .filter(|d| d.state != "closed")
            .map(|d| d.number)
            .collect();
        open.sort_unstable();
        let event = txn.append(
            &item.id,
            &service,
            &Event::Fact {
                text: if open.is_empty() {
                    "Gitea: no open dependency".to_string()
                } else {
                    format!(
                        "Gitea: blocked by {}",
                        open.iter().map(|n| format!("#{n}")).collect::<Vec<_>>().join(", ")
                    )
                },
                data: serde_json::json!({
                    "dependencies": result.dependencies.iter().map(|d| serde_json::json!({"number": d.number, "state": d.state})).collect::<Vec<_>>(),
                }),
            },
        )?;
        let item = txn.item(&item.id)?.unwrap_or_else(|| item.clone());
        let was_blocked = matches!(rec.phase, Phase::Blocked { .. });
        if open.is_empty() {
            // Only a dependency block ends here: an item blocked for its
            // project's protection stays blocked (crate::protection).
            let unblocks = was_blocked || rec.phase == Phase::Checking;
            if unblocks {
                rec.phase = Phase::Queued;
            }
            if unblocks && item.state == State::Blocked {
                txn.transition(
                    &item.id,
                    Transition::Unblock,
                    "its dependencies closed in Gitea",
                    &me,
                )?;
                txn.say(
                    &brain.agent,
                    &item,
                    event,
                    Say::fact(format!(
                        "✅ The dependencies of **{}#{}** are closed; item **#{}** is queued again.",
                        md(&rec.repository),
                        rec.number,
                        item.number
                    )),
                )?;
            }
        } else if matches!(
            rec.phase,
            Phase::Checking | Phase::Queued | Phase::Blocked { .. } | Phase::Unprotected
        ) {
            let newly = rec.phase != (Phase::Blocked { by: open.clone() });
            rec.phase = Phase::Blocked { by: open.clone() };
            if matches!(
                item.state,
                State::Active | State::Ready | State::WaitingOnOperator
            ) {
                txn.transition(
                    &item.id,
                    Transition::Block,
                    "open dependencies in Gitea",
                    &me,
                )?;
            }
            if newly {
                let list = open
                    .iter()
                    .map(|n| format!("#{n}"))
                    .collect::<Vec<_>>()
                    .join(", ");
                txn.say(
                    &brain.agent,
                    &item,
                    event,
                    Say::fact(format!(
                        "⛔ **{}#{}** depends on {list}, still open in Gitea: item **#{}** is blocked until they close.",
                        md(&rec.repository),
                        rec.number,
                        item.number
                    )),
                )?;
            }
        } else {
            // Work has started: a dependency added later is told, not
            // enforced on work in progress.
            txn.append(
                &item.id,
                &me,
                &Event::Fact {
                    text: "an open dependency appeared after work started; the operator decides"
                        .into(),
                    data: serde_json::json!({ "open": open }),
                },
            )?;
        }
        save_item(txn, &item.id, &rec)
    }

    /// Issue `number` of `repository` changed state: every blocked item it
    /// might block reads its dependencies again.
    fn recheck_dependents(
        &self,
        brain: &BrainSettings,
        txn: &mut Txn<'_, '_>,
        repository: &str,
        number: u64,
    ) -> Result<(), StoreError> {
        for (item_id, mut rec) in item_records(txn)? {
            let depends = match &rec.phase {
                Phase::Blocked { by } => by.contains(&number),
                _ => false,
            };
            if !depends || !rec.repository.eq_ignore_ascii_case(repository) {
                continue;
            }
            if let Some(item) = txn.item(&item_id)?.filter(|i| i.state.is_open()) {
                self.read_dependencies(brain, txn, &item, &mut rec)?;
            }
        }
        Ok(())
    }

    /// At a tick: blocked items whose dependencies were read long enough
    /// ago read them again (a dependency added or removed sends no
    /// webhook).
    pub(crate) fn recheck_blocked(
        &mut self,
        brain: &BrainSettings,
        txn: &mut Txn<'_, '_>,
    ) -> Result<(), StoreError> {
        let now = txn.at().unix_timestamp_nanos();
        let every = i128::try_from(self.config.recheck_blocked.as_nanos()).unwrap_or(i128::MAX);
        for (item_id, mut rec) in item_records(txn)? {
            let due = matches!(rec.phase, Phase::Blocked { .. })
                && rec.reading.is_none()
                && rec
                    .read_at_ns
                    .is_none_or(|at| now.saturating_sub(at) >= every);
            if !due {
                continue;
            }
            if let Some(item) = txn.item(&item_id)?.filter(|i| i.state.is_open()) {
                self.read_dependencies(brain, txn, &item, &mut rec)?;
            }
        }
        Ok(())
    }

    /// Ends the issue's open item, if any, saying why.
    fn end_item(
        &self,
        brain: &BrainSettings,
        txn: &mut Txn<'_, '_>,
        record: &mut IssueRecord,
        why: &str,
    ) -> Result<(), StoreError> {
        let Some(item) = open_item(txn, record)? else {
            record.item = None;
            return Ok(());
        };
        record.item = None;
        let me = Actor::agent(&brain.agent);
        txn.transition(&item.id, Transition::Close, why, &me)?;
        let event = txn.append(
            &item.id,
            &me,
            &Event::Fact {
                text: format!("closed: {why}"),
                data: serde_json::json!({ "closed_because": why }),
            },
        )?;
        txn.say(
            &brain.agent,
            &item,
            event,
            Say::result(format!(
                "⏹️ Item **#{}** is closed: {}.",
                item.number,
                md(why)
            )),
        )
    }
}

/// The open item an issue record points at, if it is still open.
fn open_item(txn: &Txn<'_, '_>, record: &IssueRecord) -> Result<Option<WorkItem>, StoreError> {
    Ok(match &record.item {
        Some(id) => txn.item(id)?.filter(|i| i.state.is_open()),
        None => None,
    })
}
