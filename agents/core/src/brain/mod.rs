//! The brain every agent shares, and the one thing each agent adds.
//!
//! [`AgentBrain`] is a [`Brain`] that gives any agent what the operator
//! expects of all of them: the chat vocabulary in Matrix (seed L5:
//! `status`, `stop`, `abandon`, `approve`, `deny`, `retry`, `do #N next`,
//! `use <project>`, questions answered and never acted on, reactions as
//! approvals), the CLI's operator commands, the allowlist that says whose
//! words instruct, verdicts and results routed to the agent loop or the
//! plan runner, and after every message the switch to the next item, the
//! approved plan's start, the loop's next turn and the announcement of a
//! switch. An agent implements [`Duties`]: its own intake (alerts for ops)
//! and its own words where the vocabulary is about its kind of work.

mod chat;
mod operator;
mod status;
pub(crate) mod tickets;
mod time;

use std::time::Duration;

use nisse_bus::AnyMessage;
use nisse_models::ModelsConfig;

use crate::agent_loop::{AgentTool, LoopConfig, LoopSettings, PLAN_FIRST};
use crate::log::Actor;
use crate::markdown::md_escape;
use crate::plans::{DEFAULT_APPROVAL_EXPIRY, PlanSettings};
use crate::reactor::Brain;
use crate::requests::{AnswerFate, Deadlines, Overdue, Retried, answerer, duty_of};
use crate::say::Say;
use crate::store::{DEFAULT_SWITCH_GRACE, StoreError, Timing, Txn};
use crate::work::{State, Transition, WorkItem};

/// What an agent does that no other agent does.
pub trait Duties: Send + 'static {
    /// Applies a message [`AgentBrain`] does not handle itself: the agent's
    /// own intake (`AlertReceived` for ops), turned into work items. Like
    /// [`Brain::apply`], it uses only the message and the store; messages
    /// it has nothing to do with are ignored.
    fn apply(
        &mut self,
        brain: &BrainSettings,
        txn: &mut Txn<'_, '_>,
        message: &AnyMessage,
    ) -> Result<(), StoreError>;

    /// The operator said `use <project>` about `item`: whatever the agent
    /// makes of it, and its answer (Markdown, rendered by code).
    fn use_project(
        &mut self,
        brain: &BrainSettings,
        txn: &mut Txn<'_, '_>,
        item: &WorkItem,
        project: &str,
    ) -> Result<String, StoreError>;

    /// An operator asked to run the duty `name` now (`nisse duty run`):
    /// what to tell them it did, or `Err` with why it could not (no such
    /// duty).
    fn run_duty(
        &mut self,
        _brain: &BrainSettings,
        _txn: &mut Txn<'_, '_>,
        name: &str,
        _by: &Actor,
    ) -> Result<Result<String, String>, StoreError> {
        Ok(Err(format!("this agent has no duty `{name}`")))
    }

    /// Whether the answer to the request `request_id` is the agent's own:
    /// a request its harness sent for a work item (the dev agent's
    /// workspace commands, its Gitea calls). Such answers go to
    /// [`Duties::apply`] rather than to the loop or the plan runner.
    fn claims(&self, _request_id: &str) -> bool {
        false
    }

    /// Runs after every message, once the shared brain has switched items
    /// and before the active item's loop takes a turn: where an agent
    /// starts what becoming active means for its items (the dev agent
    /// prepares the workspace before the model sees the item).
    fn after(&mut self, _brain: &BrainSettings, _txn: &mut Txn<'_, '_>) -> Result<(), StoreError> {
        Ok(())
    }

    /// A request one of the agent's duties sent (its work item id is the
    /// duty's, [`crate::requests::duty_item`]) went unanswered past its
    /// deadline. Its answers reach [`Duties::apply`], unless late.
    fn request_expired(
        &mut self,
        _brain: &BrainSettings,
        _txn: &mut Txn<'_, '_>,
        _overdue: &Overdue,
    ) -> Result<(), StoreError> {
        Ok(())
    }

    /// An action of the loop or of a plan ran and `result` came back
    /// (after the loop or the plan runner applied it): what the agent
    /// records of it besides (the dev agent notes what was installed on a
    /// build host).
    fn action_ran(
        &mut self,
        _brain: &BrainSettings,
        _txn: &mut Txn<'_, '_>,
        _result: &nisse_bus::proto::ExecResult,
    ) -> Result<(), StoreError> {
        Ok(())
    }

    /// An operator opened `item` (with `nisse item open`, naming `hosts`,
    /// or by talking at the top of the agent's room): what starting it
    /// means for the agent. The default opens the model's loop on it with
    /// those hosts bound; ops binds its tool hosts too; the dev agent
    /// makes it a conversation, which may lead to a new project.
    fn operator_opened(
        &mut self,
        brain: &BrainSettings,
        txn: &mut Txn<'_, '_>,
        item: &WorkItem,
        hosts: &[String],
    ) -> Result<(), StoreError> {
        txn.bind_hosts(
            item,
            &Actor::agent(&brain.agent),
            hosts.iter().cloned(),
            "the hosts the operator named",
        )?;
        txn.loop_open(brain.agent_loop(), item, "the operator opened it")
    }

    /// The operator said `retry` on `item`, which has no request that went
    /// unanswered: what the agent's harness does again (the dev agent
    /// prepares a workspace whose preparation failed), in a line, or
    /// `None` when it has nothing to redo. The item then waits no more.
    fn retry(
        &mut self,
        _brain: &BrainSettings,
        _txn: &mut Txn<'_, '_>,
        _item: &WorkItem,
    ) -> Result<Option<String>, StoreError> {
        Ok(None)
    }
}

/// What the shared brain needs to know about its agent.
#[derive(Debug, Clone)]
pub struct BrainSettings {
    /// The agent's name (`ops`): its actor, and the agent of every message
    /// it sends.
    pub agent: String,
    /// Who may approve, deny, stop, abandon and propose plans, as
    /// `<channel>:<identity>` (`cli:alice`, `matrix:@alice:example.org`).
    /// Everyone else's words are recorded as data and never applied.
    pub operators: Vec<String>,
    /// Names the operator may address the agent by in chat.
    pub names: Vec<String>,
    /// How long an approval request, and an approval, stays good.
    pub approval_expiry: Duration,
    /// What the agent is for, in a paragraph: the start of every model
    /// call's system prompt.
    pub brief: String,
    /// The agent loop's limits.
    pub loop_config: LoopConfig,
    /// `[models]`: with roles configured, every new item gets the loop.
    pub models: ModelsConfig,
    /// How long an item that went to wait on the operator keeps the
    /// agent's attention before another ready item is taken up (L1).
    pub switch_grace: Duration,
    /// How long each kind of request may go unanswered.
    pub deadlines: Deadlines,
    /// Whether the agent has a knowledge vault (seed L6, L10): notes and
    /// summaries go to its memory, and an item starts with what the vault
    /// recalls for it.
    pub memory: bool,
    /// Secrets only the agent's harness hands out (the dev agent's push
    /// keys, D4): a tool call or plan a model writes that names one is
    /// refused before anything is classified, whatever the policy grants.
    pub harness_secrets: Vec<String>,
    /// Tools the agent adds to the loop for its driver, handled by its
    /// duties (the dev agent's milestones): see
    /// [`crate::agent_loop::AgentTool`].
    pub agent_tools: Vec<AgentTool>,
    /// How the agent acts, as the system prompt tells the model: lines of
    /// Markdown list items. By default [`crate::agent_loop::PLAN_FIRST`];
    /// the dev agent works in its workspace without a plan (class 2 in
    /// scope, D6).
    pub how_to_act: String,
    /// The agent's MCP server instances (`[mcp]`, seed X3): their tools
    /// are offered to the loop once mounted (see [`crate::mcp`]).
    pub mcp: Vec<crate::mcp::McpInstance>,
}

impl BrainSettings {
    /// Settings for the agent named `agent`, addressed by that name, with
    /// no operators, no brief and no models, and the default approval
    /// expiry and loop limits.
    pub fn new(agent: &str) -> Self {
        Self {
            agent: agent.to_string(),
            operators: Vec::new(),
            names: vec![agent.to_string()],
            approval_expiry: DEFAULT_APPROVAL_EXPIRY,
            brief: String::new(),
            loop_config: LoopConfig::default(),
            models: ModelsConfig::default(),
            switch_grace: DEFAULT_SWITCH_GRACE,
            deadlines: Deadlines::default(),
            memory: false,
            harness_secrets: Vec::new(),
            agent_tools: Vec::new(),
            how_to_act: PLAN_FIRST.to_string(),
            mcp: Vec::new(),
        }
    }

    /// What the plan machinery needs.
    pub fn plans(&self) -> PlanSettings<'_> {
        PlanSettings {
            agent: &self.agent,
            approval_expiry: self.approval_expiry,
        }
    }

    /// What the agent loop needs.
    pub fn agent_loop(&self) -> LoopSettings<'_> {
        LoopSettings {
            plans: self.plans(),
            models: &self.models,
            config: &self.loop_config,
            brief: &self.brief,
            memory: self.memory,
            harness_secrets: &self.harness_secrets,
            agent_tools: &self.agent_tools,
            how_to_act: &self.how_to_act,
            mcp: &self.mcp,
        }
    }

    /// Whether `identity`, authenticated by `channel`, is on the operator
    /// allowlist.
    pub fn is_operator(&self, channel: &str, identity: &str) -> bool {
        self.operators.contains(&format!("{channel}:{identity}"))
    }
}

/// A brain: the shared handling of operators, plans and the loop, with
/// `D`'s duties for the agent's own intake.
#[derive(Debug, Clone)]
pub struct AgentBrain<D> {
    settings: BrainSettings,
    duties: D,
}

impl<D: Duties> AgentBrain<D> {
    /// A brain with these settings and duties.
    pub fn new(settings: BrainSettings, duties: D) -> Self {
        Self { settings, duties }
    }

    /// The same brain with `[models]`: when roles are configured, every
    /// new item gets the model-driven loop.
    pub fn with_models(mut self, models: ModelsConfig) -> Self {
        self.settings.models = models;
        self
    }

    /// The same brain with the agent's MCP instances (`[mcp]`).
    pub fn with_mcp(mut self, instances: Vec<crate::mcp::McpInstance>) -> Self {
        self.settings.mcp = instances;
        self
    }

    /// Its duties.
    pub fn duties(&self) -> &D {
        &self.duties
    }

    /// The same brain with its duties changed by `f`.
    pub fn map_duties<E: Duties>(self, f: impl FnOnce(D) -> E) -> AgentBrain<E> {
        AgentBrain {
            settings: self.settings,
            duties: f(self.duties),
        }
    }
}

impl<D: Duties> Brain for AgentBrain<D> {
    fn apply(&mut self, txn: &mut Txn<'_, '_>, message: &AnyMessage) -> Result<(), StoreError> {
        let Self { settings, duties } = self;
        let mut applied: Result<Vec<String>, String> = Ok(Vec::new());
        // An answer past its request's deadline is kept for `retry`, not
        // acted on. A second answer goes where the first went, which
        // records it and changes nothing (every handler is idempotent).
        let late = message.kind().direction() == nisse_bus::topology::Direction::In
            && txn.answer_fate(message)? == AnswerFate::Late;
        match message {
            _ if late => {}
            AnyMessage::InOperator(command) => match operator::apply(settings, txn, command)? {
                Ok(follow) => applied = follow_up(settings, duties, txn, follow)?,
                Err(reason) => applied = Err(reason),
            },
            AnyMessage::InMatrix(event) => chat::apply(settings, duties, txn, event)?,
            AnyMessage::InVikunja(event) => tickets::apply(settings, duties, txn, event)?,
            AnyMessage::VikunjaResult(result) if tickets::claims(&result.request_id) => {
                tickets::result(settings, txn, result)?;
            }
            AnyMessage::Tick(_) => {
                time::tick(settings, duties, txn)?;
                duties.apply(settings, txn, message)?;
            }
            AnyMessage::BrainStarted(_) => time::started(settings, txn)?,
            AnyMessage::TellPosted(posted) => txn.approval_delivered(posted)?,
            other => route(settings, duties, txn, other)?,
        }
        // Every message is a moment at which a waiting item's grace period
        // may have run out, at which an approved plan's item may be the
        // active one, and at which the active item's loop may have a turn
        // due.
        txn.switch_if_due(&Actor::agent(&settings.agent))?;
        txn.resume_active_plan(settings.plans())?;
        // Elevated MCP instances mounted exactly while an approved plan
        // naming them runs on the active item.
        txn.mcp_sync_plan_mounts(&settings.agent, &settings.mcp)?;
        duties.after(settings, txn)?;
        txn.drive_loop(settings.agent_loop())?;
        announce_switches(settings, txn)?;
        remember_closed(settings, txn)?;
        // Last, so the answer holds everything the command caused.
        if let AnyMessage::InOperator(command) = message {
            operator::answer(
                settings,
                txn,
                command,
                applied.as_deref().map_err(String::as_str),
            )?;
        }
        Ok(())
    }

    fn timing(&self) -> Timing {
        Timing {
            switch_grace: self.settings.switch_grace,
            deadlines: self.settings.deadlines,
        }
    }

    fn refused(
        &mut self,
        txn: &mut Txn<'_, '_>,
        message: &AnyMessage,
        reason: &str,
    ) -> Result<(), StoreError> {
        match message {
            AnyMessage::InOperator(command) => {
                operator::answer(&self.settings, txn, command, Err(reason))
            }
            _ => Ok(()),
        }
    }
}

/// Hands a service's answer (or any other input the shared brain does not
/// read itself) to whoever asked: a duty's to the duties; an item's to
/// its loop when the loop asked, else to the plan machinery; the rest of
/// the agent's own intake to the duties.
fn route(
    settings: &BrainSettings,
    duties: &mut impl Duties,
    txn: &mut Txn<'_, '_>,
    message: &AnyMessage,
) -> Result<(), StoreError> {
    use nisse_bus::Decode as _;
    if let Some(request_id) = message.request_id()
        && (duty_of(&message.envelope().work_item_id).is_some() || duties.claims(request_id))
    {
        return duties.apply(settings, txn, message);
    }
    match message {
        AnyMessage::ClassifyVerdict(verdict) => {
            if !txn.loop_verdict(settings.agent_loop(), verdict)? {
                txn.plan_verdict(settings.plans(), verdict)?;
            }
            txn.recall_policy(settings.agent_loop(), verdict)?;
        }
        AnyMessage::ExecResult(result) => {
            if !txn.loop_exec_result(settings.agent_loop(), result)? {
                txn.plan_exec_result(settings.plans(), result)?;
            }
            duties.action_ran(settings, txn, result)?;
        }
        AnyMessage::McpTools(tools) => crate::mcp::tools_heard(&settings.mcp, txn, tools)?,
        AnyMessage::McpResult(result) => {
            if !txn.loop_mcp_result(settings.agent_loop(), result)? {
                txn.plan_mcp_result(settings.plans(), result)?;
            }
        }
        AnyMessage::LoopPin(pinned) => txn.loop_pinned(settings.agent_loop(), pinned)?,
        AnyMessage::ModelResp(response) => {
            txn.loop_model_response(settings.agent_loop(), response)?;
        }
        AnyMessage::VaultFound(found) => {
            txn.loop_vault_found(settings.agent_loop(), found)?;
        }
        AnyMessage::VaultWritten(written) => txn.vault_written(&settings.agent, written)?,
        AnyMessage::World(model) => txn.world_received(model)?,
        // The agent's own intake. The rest of the stream is the brain's
        // own outputs coming back (the store clears those from the
        // outbox), which the duties ignore like anything else not theirs.
        other => duties.apply(settings, txn, other)?,
    }
    Ok(())
}

/// The parts of an operator's command that need the duties or the
/// routing of answers.
fn follow_up(
    settings: &BrainSettings,
    duties: &mut impl Duties,
    txn: &mut Txn<'_, '_>,
    follow: operator::FollowUp,
) -> Result<Result<Vec<String>, String>, StoreError> {
    match follow {
        operator::FollowUp::Done => Ok(Ok(Vec::new())),
        operator::FollowUp::Park(item, by) => Ok(Ok(vec![park(txn, &item, &by)?])),
        operator::FollowUp::DoNext(item, by) => Ok(Ok(vec![do_next(txn, &item, &by)?])),
        operator::FollowUp::RunDuty(name, by) => Ok(duties
            .run_duty(settings, txn, &name, &by)?
            .map(|line| vec![line])),
        operator::FollowUp::Retry(item, by) => {
            // The reply lists the log events the retry caused.
            Ok(retry(settings, duties, txn, &item, &by)?.map(|_| Vec::new()))
        }
        operator::FollowUp::OpenItem {
            open,
            by,
            via,
            seed,
        } => {
            let item = open_for_operator(
                settings,
                duties,
                txn,
                Opening {
                    title: open.title.trim().to_string(),
                    source: format!("{via}:{}", by.id),
                    fingerprint: None,
                    id_seed: seed,
                    by: &by,
                    thread_on: None,
                    note: Some((via.clone(), open.note.clone())),
                    hosts: &open.hosts,
                },
            )?;
            Ok(Ok(vec![format!(
                "opened item #{} ({})",
                item.number, item.id
            )]))
        }
    }
}

/// `do #N next` (chat, CLI): `target` goes before the rest of the queue.
/// What to tell the operator.
pub(super) fn do_next(
    txn: &mut Txn<'_, '_>,
    target: &WorkItem,
    by: &Actor,
) -> Result<String, StoreError> {
    if !target.state.is_open() {
        return Ok(format!("There is no open item **#{}**.", target.number));
    }
    txn.set_operator_rank(&target.id, Some(0), by)?;
    Ok(format!("Item **#{}** goes next.", target.number))
}

/// `park` (chat, CLI): the active `item` gives way to the next ready one,
/// keeping its place in the queue. What to tell the operator.
pub(super) fn park(
    txn: &mut Txn<'_, '_>,
    item: &WorkItem,
    by: &Actor,
) -> Result<String, StoreError> {
    if item.state != State::Active {
        return Ok(format!(
            "Item **#{}** is not being worked on: nothing to park.",
            item.number
        ));
    }
    Ok(match txn.next_ready()? {
        Some(next) => {
            txn.switch_to(&next.id, "the operator parked the item", by)?;
            format!(
                "⏸️ Item **#{}** is parked (it keeps its place in the queue); item **#{}** goes on.",
                item.number, next.number
            )
        }
        None => format!(
            "Nothing else is waiting: item **#{}** goes on.",
            item.number
        ),
    })
}

/// How an item the operator opens came about.
pub(super) struct Opening<'a> {
    pub title: String,
    /// `<channel>:<identity>`.
    pub source: String,
    /// What opened it, once: a room message's event.
    pub fingerprint: Option<String>,
    /// The opening message's id.
    pub id_seed: String,
    pub by: &'a Actor,
    /// The room message the item's thread hangs from, when it started
    /// there.
    pub thread_on: Option<String>,
    /// The operator's words, recorded as said (a room message is recorded
    /// by the chat itself).
    pub note: Option<(String, String)>,
    pub hosts: &'a [String],
}

/// An operator opened an item (`nisse item open`, or talk at the top of
/// the room): it is the operator's work, their words its first, ranked
/// before work that waits its turn and announced in a thread of its own;
/// the agent's duties start it ([`Duties::operator_opened`]).
pub(super) fn open_for_operator(
    settings: &BrainSettings,
    duties: &mut impl Duties,
    txn: &mut Txn<'_, '_>,
    open: Opening<'_>,
) -> Result<WorkItem, StoreError> {
    let by = open.by;
    let via = open
        .source
        .split_once(':')
        .map_or("", |(v, _)| v)
        .to_string();
    let item = txn.open_item(
        crate::work::NewItem {
            title: open.title,
            scope: String::new(),
            source: open.source,
            fingerprint: open.fingerprint,
            external_link: None,
            severity: None,
            priority: 1,
            id_seed: open.id_seed,
        },
        by,
    )?;
    let announced = match open.note {
        Some((via, text)) if !text.trim().is_empty() => txn.append(
            &item.id,
            by,
            &crate::log::Event::Said {
                via,
                text,
                operator: true,
                read_as: "talk".into(),
            },
        )?,
        _ => txn.append(
            &item.id,
            by,
            &crate::log::Event::Fact {
                text: format!("{} opened the item via {via}", by.id),
                data: serde_json::json!({ "opened_by": by.id, "via": via }),
            },
        )?,
    };
    let ahead = txn.ahead_of(&item.id)?;
    let text = format!(
        "📥 Item **#{}**: “{}”, opened by {} via {via}; {ahead}.",
        item.number,
        md_escape(&item.title),
        md_escape(&by.id),
    );
    let say = match &open.thread_on {
        Some(event_id) => Say::thread_on(event_id, text),
        None => Say::thread_root(text),
    };
    txn.say(&settings.agent, &item, announced, say)?;
    duties.operator_opened(settings, txn, &item, open.hosts)?;
    Ok(item)
}

/// The first line of `text`, cut at a word to a title's length.
pub(super) fn title_of(text: &str) -> String {
    const CHARS: usize = 72;
    let line = text
        .lines()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .trim();
    if line.chars().count() <= CHARS {
        return line.to_string();
    }
    let cut: String = line.chars().take(CHARS).collect();
    let at = cut
        .rfind(' ')
        .filter(|&i| i > CHARS / 2)
        .unwrap_or(cut.len());
    format!("{}…", cut[..at].trim_end())
}

/// The operator's `retry` on `item` (from the CLI or the chat): each of
/// its requests that went unanswered in time has its late answer applied,
/// or is sent again, and the item waits no more. What it did, one line
/// each, or why there was nothing to do.
pub(super) fn retry(
    settings: &BrainSettings,
    duties: &mut impl Duties,
    txn: &mut Txn<'_, '_>,
    item: &WorkItem,
    by: &Actor,
) -> Result<Result<Vec<String>, String>, StoreError> {
    let retried = txn.retry_requests(&item.id)?;
    if retried.is_empty() {
        let Some(line) = duties.retry(settings, txn, item)? else {
            return Ok(Err(format!(
                "item #{} has no request that went unanswered: nothing to retry",
                item.number
            )));
        };
        // Read again: what the duties redid may have moved it already.
        if txn
            .item(&item.id)?
            .is_some_and(|i| i.state == State::WaitingOnOperator)
        {
            txn.transition(
                &item.id,
                Transition::OperatorAnswered,
                "the operator said retry",
                by,
            )?;
        }
        txn.append(
            &item.id,
            by,
            &crate::log::Event::Fact {
                text: format!("retry: {line}"),
                data: serde_json::json!({ "retry_harness": line }),
            },
        )?;
        return Ok(Ok(vec![line]));
    }
    if txn
        .item(&item.id)?
        .is_some_and(|i| i.state == State::WaitingOnOperator)
    {
        txn.transition(
            &item.id,
            Transition::OperatorAnswered,
            "the operator said retry",
            by,
        )?;
    }
    let mut done = Vec::new();
    for r in retried {
        let (text, data) = match &r {
            Retried::LateAnswer(answer) => (
                format!(
                    "retry: the late answer to {} is applied",
                    answer.request_id().unwrap_or_default()
                ),
                serde_json::json!({ "retry_applied": answer.request_id() }),
            ),
            Retried::Resent { request_id, kind } => (
                format!(
                    "retry: request {request_id} is sent to {} again",
                    answerer(*kind)
                ),
                serde_json::json!({ "retry_resent": request_id }),
            ),
        };
        txn.append(
            &item.id,
            by,
            &crate::log::Event::Fact {
                text: text.clone(),
                data,
            },
        )?;
        if let Retried::LateAnswer(answer) = r {
            route(settings, duties, txn, &answer)?;
        }
        done.push(text);
    }
    Ok(Ok(done))
}

/// Writes the summary note of every item this message closed (L6: at
/// work-item close, into the agent's memory).
fn remember_closed(settings: &BrainSettings, txn: &mut Txn<'_, '_>) -> Result<(), StoreError> {
    if !settings.memory {
        return Ok(());
    }
    let closed: Vec<String> = txn
        .state_changes()
        .iter()
        .filter(|c| c.changed.to == State::Closed)
        .map(|c| c.work_item_id.clone())
        .collect();
    for id in closed {
        if let Some(item) = txn.item(&id)? {
            txn.remember_item_closed(&settings.agent, &item)?;
        }
    }
    Ok(())
}

/// Tells the operator when an item became active because another one
/// stopped being active (the store switches at safe points). An item
/// activated as it opened was announced by its opening message.
fn announce_switches(settings: &BrainSettings, txn: &mut Txn<'_, '_>) -> Result<(), StoreError> {
    let switched: Vec<(String, i64)> = txn
        .state_changes()
        .iter()
        .filter(|c| c.changed.to == State::Active && c.changed.from == State::Ready)
        .map(|c| (c.work_item_id.clone(), c.event_id))
        .collect();
    for (id, event) in switched {
        let Some(item) = txn.item(&id)? else { continue };
        let opened_now = txn
            .events(&id)?
            .first()
            .is_some_and(|e| e.causation_id == txn.cause().1);
        if opened_now {
            continue;
        }
        txn.say(
            &settings.agent,
            &item,
            event,
            Say::fact(format!(
                "▶️ Now working on item **#{}**: **{}**.",
                item.number,
                md_escape(&item.title)
            )),
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::title_of;

    #[test]
    fn titles_are_the_first_line_cut_at_a_word() {
        assert_eq!(
            title_of("\n  Let's build a tool  \nmore"),
            "Let's build a tool"
        );
        let long = "I would like a small service that watches the backup jobs and tells me when one did not run overnight";
        let t = title_of(long);
        assert!(t.ends_with('…') && t.chars().count() <= 73, "{t}");
        assert!(long.starts_with(t.trim_end_matches('…')), "{t}");
    }
}
