//! The model's tool calls, handled in order: execution tools through the
//! gates, control tools in the brain, and each call's result recorded for
//! the next turn.

use serde_json::{Value, json};

use nisse_bus::proto::{
    self, AgreedScope, ChatMessage, ChatRole, ClassifyVerdict, ExecResult, ExecStatus,
    ModelResponse,
};
use nisse_models::Role;
use nisse_policy::{Action, Check, FileOp, RiskClass, Scope, Step};

use super::agent_tools::{agent_request, is_agent_tool};
use super::prompt::{EXPERT_PROMPT, tool_names};
use super::state::{Call, LoopSettings, LoopState, Status};
use super::turns::error_name;
use crate::gate::ExecFor;
use crate::log::{Actor, ActorKind, Event};
use crate::memory::{Fact, MemoryKind};
use crate::plans::{Proposal, tail, verdict_event};
use crate::render;
use crate::say::Say;
use crate::store::{StoreError, Txn};
use crate::work::{Transition, WorkItem};
use nisse_bus::proto::vault_query::Query;

/// How much of a command's output a tool result keeps from each stream.
const OUTPUT_KEPT: usize = 8000;

/// How handling one call went.
enum Handled {
    /// It has its result; go on with the next.
    Done,
    /// It waits for a reply (the classifier, the executor, the expert).
    Waiting,
    /// It ends the turn (`finish`, `ask_human`, `submit_plan`, handing
    /// over): the calls after it are not run.
    EndsTurn,
}

pub(super) const EXEC_TOOLS: [&str; 3] = ["shell", "read_file", "list_dir"];

impl Txn<'_, '_> {
    pub(super) fn expert_answered(
        &mut self,
        settings: LoopSettings<'_>,
        item: &WorkItem,
        state: &mut LoopState,
        call_id: &str,
        response: &ModelResponse,
    ) -> Result<(), StoreError> {
        let (text, ok) = match &response.outcome {
            Some(proto::model_response::Outcome::Reply(r)) if !r.content.trim().is_empty() => {
                (format!("The expert answered:\n{}", r.content), true)
            }
            Some(proto::model_response::Outcome::Error(e)) => (
                format!(
                    "The expert could not answer ({}): {}",
                    error_name(proto::ModelErrorKind::try_from(e.kind).unwrap_or_default()),
                    e.message
                ),
                false,
            ),
            _ => ("The expert's answer was empty.".into(), false),
        };
        self.finish_call(
            settings,
            item,
            state,
            call_id,
            &response.request_id,
            text,
            ok,
            false,
        )
    }

    /// Records the result of the call in flight and goes on with the rest
    /// of the turn's calls.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn finish_call(
        &mut self,
        settings: LoopSettings<'_>,
        item: &WorkItem,
        state: &mut LoopState,
        call_id: &str,
        request_id: &str,
        result: String,
        success: bool,
        untrusted: bool,
    ) -> Result<(), StoreError> {
        self.record_result(&item.id, state, call_id, result, success, untrusted)?;
        let in_flight =
            matches!(&state.status, Status::Acting { request_id: r } if r == request_id);
        if !in_flight {
            // Stopped meanwhile: the result is on record, nothing goes on.
            return Ok(());
        }
        if state.queue.front().is_some_and(|c| c.id == call_id) {
            state.queue.pop_front();
        }
        state.status = Status::Idle;
        self.work_queue(settings, item, state)
    }

    pub(super) fn record_result(
        &mut self,
        work_item_id: &str,
        state: &mut LoopState,
        call_id: &str,
        result: String,
        success: bool,
        untrusted: bool,
    ) -> Result<(), StoreError> {
        self.append_result(work_item_id, state, call_id, result, success, untrusted)
            .map(|_| ())
    }

    /// Records a call's result; returns its log event's id.
    fn append_result(
        &mut self,
        work_item_id: &str,
        state: &mut LoopState,
        call_id: &str,
        result: String,
        success: bool,
        untrusted: bool,
    ) -> Result<i64, StoreError> {
        if success {
            state.failures = 0;
        } else {
            state.failures += 1;
        }
        self.append(
            work_item_id,
            &Actor::agent("orchestrator"),
            &Event::ToolResult {
                call_id: call_id.to_string(),
                result,
                success,
                untrusted,
            },
        )
    }

    /// Handles the turn's calls in order until one waits or ends the turn;
    /// when all have results, the next turn is due.
    pub(super) fn work_queue(
        &mut self,
        settings: LoopSettings<'_>,
        item: &WorkItem,
        state: &mut LoopState,
    ) -> Result<(), StoreError> {
        // Held by the harness: the calls wait in the queue for its release.
        if state.held.is_some() {
            return Ok(());
        }
        while let Some(call) = state.queue.front().cloned() {
            match self.handle_call(settings, item, state, &call)? {
                Handled::Done => {
                    state.queue.pop_front();
                }
                Handled::Waiting => return Ok(()),
                Handled::EndsTurn => {
                    state.queue.pop_front();
                    self.not_run_after(&item.id, state, &call.tool)?;
                    return Ok(());
                }
            }
        }
        if state.status == Status::Idle {
            state.wake = Some("every tool call has its result".into());
        }
        Ok(())
    }

    fn handle_call(
        &mut self,
        settings: LoopSettings<'_>,
        item: &WorkItem,
        state: &mut LoopState,
        call: &Call,
    ) -> Result<Handled, StoreError> {
        let fail = |txn: &mut Self, state: &mut LoopState, why: String| {
            txn.record_result(&item.id, state, &call.id, why, false, false)
                .map(|()| Handled::Done)
        };
        let args: Value = if call.arguments.trim().is_empty() {
            json!({})
        } else {
            match serde_json::from_str(&call.arguments) {
                Ok(v @ Value::Object(_)) => v,
                Ok(_) => return fail(self, state, "the arguments must be a JSON object".into()),
                Err(e) => {
                    return fail(
                        self,
                        state,
                        format!("the arguments are not valid JSON ({e}); nothing was done"),
                    );
                }
            }
        };
        // A mounted MCP instance's tool: an action like the execution
        // tools', through the same gates.
        if let Some((instance, tool)) = self.mcp_resolve(&item.id, &call.tool)? {
            return match crate::mcp::call_action(&instance, &tool, &args) {
                Ok((action, hinted)) => {
                    self.classify_call(settings, item, state, call, &action, hinted)
                }
                Err(e) => fail(self, state, e),
            };
        }
        if let Some(crate::mcp::NotMounted { why, elevated }) =
            self.mcp_not_mounted(settings.mcp, &call.tool)?
        {
            // An elevated instance's tool while the item has an approved
            // plan: a call not in the plan, which halts it and asks the
            // operator (seed O2), as a mounted one's would.
            if let Some((instance, tool)) = elevated
                && let Ok((action, _)) = crate::mcp::call_action(&instance, &tool, &args)
                && let Some(r) = self.plan_refuses_call(settings.plans, item, &action)?
            {
                return fail(self, state, format!("not run: {r}. The operator was told."));
            }
            return fail(self, state, why);
        }
        let offered = tool_names(settings, state.role, &state.pins);
        if !offered.contains(&call.tool.as_str()) {
            return fail(
                self,
                state,
                format!(
                    "there is no tool `{}` for you; the tools are: {}",
                    call.tool,
                    offered.join(", ")
                ),
            );
        }
        let text = |key: &str| {
            args.get(key)
                .and_then(Value::as_str)
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_string)
        };
        match call.tool.as_str() {
            "shell" | "read_file" | "list_dir" => {
                self.start_action(settings, item, state, call, &args)
            }
            "note" => {
                let Some(note) = text("text") else {
                    return fail(self, state, "`note` needs `text`".into());
                };
                self.append(
                    &item.id,
                    &Self::agent_actor(settings, state.role),
                    &Event::Note {
                        call_id: call.id.clone(),
                        text: note.clone(),
                    },
                )?;
                let fact = Fact {
                    kind: MemoryKind::Observation,
                    text: note,
                    source: format!("the {} via note, on item #{}", state.role, item.number),
                    operator: false,
                    said_by: None,
                };
                let result = if settings.memory {
                    let path = self.remember(settings.plans.agent, &item.id, &call.id, &fact)?;
                    format!("noted in {path}")
                } else {
                    "noted in the item's log".to_string()
                };
                self.record_result(&item.id, state, &call.id, result, true, false)?;
                Ok(Handled::Done)
            }
            "remember" => {
                let (Some(text), Some(source)) = (text("fact"), text("source")) else {
                    return fail(self, state, "`remember` needs `fact` and `source`".into());
                };
                let fact = Fact {
                    kind: MemoryKind::Lesson,
                    text,
                    source: format!(
                        "the {} via remember, on item #{}: {source}",
                        state.role, item.number
                    ),
                    operator: false,
                    said_by: None,
                };
                let path = self.remember(settings.plans.agent, &item.id, &call.id, &fact)?;
                self.record_result(
                    &item.id,
                    state,
                    &call.id,
                    format!("remembered in {path}"),
                    true,
                    false,
                )?;
                Ok(Handled::Done)
            }
            "search_knowledge" | "read_note" => {
                let query = match call.tool.as_str() {
                    "search_knowledge" => match text("query") {
                        Some(words) => Query::Search(proto::KnowledgeSearch {
                            text: words,
                            limit: 8,
                            fingerprint: item.fingerprint.clone().unwrap_or_default(),
                            hosts: self.bound_hosts(&item.id)?.into_iter().collect(),
                        }),
                        None => {
                            return fail(self, state, "`search_knowledge` needs `query`".into());
                        }
                    },
                    _ => match text("path") {
                        Some(path) => Query::Read(proto::NoteRead { path }),
                        None => return fail(self, state, "`read_note` needs `path`".into()),
                    },
                };
                let request_id = format!("{}:vault", call.id);
                self.vault_query(settings.plans.agent, item, &request_id, query)?;
                self.track(&request_id, &item.id, &call.id, "vault")?;
                state.status = Status::Acting { request_id };
                Ok(Handled::Waiting)
            }
            "ask_human" => {
                let Some(question) = text("question") else {
                    return fail(self, state, "`ask_human` needs `question`".into());
                };
                self.ask_operator(settings, item, state, &call.id, &question)?;
                Ok(Handled::EndsTurn)
            }
            "finish" => {
                if let Some(p) = self.current_plan(&item.id)?.filter(|p| p.status.is_open()) {
                    return fail(
                        self,
                        state,
                        format!(
                            "{} is {}: finish once it has run, or ask the operator",
                            p.tag(),
                            p.status
                        ),
                    );
                }
                let part = |key: &str| text(key).unwrap_or_else(|| "—".into());
                let summary = format!(
                    "🏁 Item **#{}** is done.\n\n**Done:** {}\n\n**Verified:** {}\n\n**Left open:** {}",
                    item.number,
                    part("done"),
                    part("verified"),
                    part("left_open")
                );
                let event =
                    self.append_result(&item.id, state, &call.id, "finished".into(), true, false)?;
                self.say(settings.plans.agent, item, event, Say::result(summary))?;
                if self.item(&item.id)?.is_some_and(|i| i.state.is_open()) {
                    self.transition(
                        &item.id,
                        Transition::Close,
                        "the agent finished",
                        &Self::agent_actor(settings, state.role),
                    )?;
                }
                state.status = Status::Done;
                state.wake = None;
                Ok(Handled::EndsTurn)
            }
            "submit_plan" => {
                let steps = match plan_steps(&args, settings.harness_secrets) {
                    Ok(s) => s,
                    Err(e) => return fail(self, state, format!("the plan was not recorded: {e}")),
                };
                let rationale = text("rationale").unwrap_or_default();
                let by = Self::agent_actor(settings, state.role);
                match self.propose_plan(settings.plans, item, &by, &rationale, steps)? {
                    Proposal::Proposed(revision) => {
                        self.record_result(
                            &item.id,
                            state,
                            &call.id,
                            format!(
                                "Recorded as rev-{revision}. Each step is classified, then the plan goes to the operator for approval; you will be told how it goes."
                            ),
                            true,
                            false,
                        )?;
                        state.watch_plan = Some(revision);
                        state.wake = None;
                        Ok(Handled::EndsTurn)
                    }
                    Proposal::Refused(reason) => {
                        fail(self, state, format!("the plan was not recorded: {reason}"))
                    }
                }
            }
            "ask_expert" => {
                let Some(question) = text("question") else {
                    return fail(self, state, "`ask_expert` needs `question`".into());
                };
                if state.expert_calls >= settings.config.expert_calls {
                    return fail(
                        self,
                        state,
                        format!(
                            "the ask_expert budget for this item is spent ({} questions)",
                            settings.config.expert_calls
                        ),
                    );
                }
                let Some(pin) = state.pins.get(&Role::Expert).cloned() else {
                    return fail(self, state, "no expert is configured".into());
                };
                state.expert_calls += 1;
                let request_id = format!("{}:expert", call.id);
                let messages = vec![
                    ChatMessage {
                        role: ChatRole::System as i32,
                        content: EXPERT_PROMPT.into(),
                        ..Default::default()
                    },
                    ChatMessage {
                        role: ChatRole::User as i32,
                        content: question.clone(),
                        ..Default::default()
                    },
                ];
                let tokens = messages
                    .iter()
                    .map(|m| render::estimate_tokens(&m.content))
                    .sum();
                self.send_model_request(
                    settings,
                    item,
                    Role::Expert,
                    &pin,
                    &request_id,
                    messages,
                    Vec::new(),
                    tokens,
                    (0, 0),
                )?;
                self.track(&request_id, &item.id, &call.id, "expert")?;
                state.status = Status::Acting { request_id };
                Ok(Handled::Waiting)
            }
            "delegate" => {
                let brief = text("brief").unwrap_or_default();
                self.record_result(
                    &item.id,
                    state,
                    &call.id,
                    "handed to the helper; you will get its report".into(),
                    true,
                    false,
                )?;
                self.escalate(
                    settings,
                    item,
                    state,
                    format!("the driver asked for help: {brief}"),
                )?;
                Ok(Handled::EndsTurn)
            }
            "hand_back" => {
                let note = text("note").unwrap_or_else(|| "(no note)".into());
                self.record_result(&item.id, state, &call.id, "handed back".into(), true, false)?;
                self.end_delegation(settings, item, state, "handed_back", note)?;
                state.wake = Some("the helper handed back".into());
                Ok(Handled::EndsTurn)
            }
            tool if is_agent_tool(settings.agent_tools, tool) => {
                // The agent's duties take it from here (`Txn::agent_call`).
                state.status = Status::Acting {
                    request_id: agent_request(&call.id),
                };
                Ok(Handled::Waiting)
            }
            other => fail(self, state, format!("there is no tool `{other}`")),
        }
    }

    /// Asks the operator `question` in the item's thread for the call
    /// `call_id`, whose result their answer becomes; the item waits on
    /// them meanwhile.
    pub(super) fn ask_operator(
        &mut self,
        settings: LoopSettings<'_>,
        item: &WorkItem,
        state: &mut LoopState,
        call_id: &str,
        question: &str,
    ) -> Result<(), StoreError> {
        let event = self.append(
            &item.id,
            &Self::agent_actor(settings, state.role),
            &Event::QuestionAsked {
                call_id: call_id.to_string(),
                question: question.to_string(),
            },
        )?;
        self.say(
            settings.plans.agent,
            item,
            event,
            Say::question(format!("❓ {question}")),
        )?;
        self.await_operator(item, "the agent asked a question", settings.plans.agent)?;
        state.status = Status::Asking {
            call_id: call_id.to_string(),
        };
        Ok(())
    }

    /// An execution tool: the action goes to the classifier; its verdict
    /// decides whether a permit is issued.
    fn start_action(
        &mut self,
        settings: LoopSettings<'_>,
        item: &WorkItem,
        state: &mut LoopState,
        call: &Call,
        args: &Value,
    ) -> Result<Handled, StoreError> {
        let action = match call_action(&call.tool, args, settings.harness_secrets) {
            Ok(a) => a,
            Err(e) => {
                self.record_result(&item.id, state, &call.id, e, false, false)?;
                return Ok(Handled::Done);
            }
        };
        let bound = self.bound_hosts(&item.id)?;
        if !bound.contains(&action.target) {
            let why = format!(
                "not run: host `{}` is not bound to this item (bound: {})",
                action.target,
                if bound.is_empty() {
                    "none".to_string()
                } else {
                    bound.into_iter().collect::<Vec<_>>().join(", ")
                }
            );
            self.record_result(&item.id, state, &call.id, why, false, false)?;
            return Ok(Handled::Done);
        }
        self.classify_call(settings, item, state, call, &action, None)
    }

    /// Sends a tool call's action (with the risk its tool declares, if
    /// any) to the classifier; its verdict decides whether a permit is
    /// issued.
    fn classify_call(
        &mut self,
        settings: LoopSettings<'_>,
        item: &WorkItem,
        state: &mut LoopState,
        call: &Call,
        action: &Action,
        declared: Option<RiskClass>,
    ) -> Result<Handled, StoreError> {
        let request_id = format!("{}:classify", call.id);
        // The agreed scope is the item's task, in the code's words (its
        // title is made from labels, never annotations).
        let scope = AgreedScope {
            work_item_id: item.id.clone(),
            task: item.title.clone(),
            contained_targets: state.contained.clone(),
            ..Default::default()
        };
        self.emit_classify(
            settings.plans.agent,
            &item.id,
            &request_id,
            action,
            declared,
            Some(scope),
        )?;
        self.track(&request_id, &item.id, &call.id, "classify")?;
        state.status = Status::Acting { request_id };
        Ok(Handled::Waiting)
    }

    /// Applies a classifier verdict, if it answers one of the loop's
    /// requests. Returns whether it did.
    pub fn loop_verdict(
        &mut self,
        settings: LoopSettings<'_>,
        verdict: &ClassifyVerdict,
    ) -> Result<bool, StoreError> {
        let Some((item_id, call_id, _)) = self.tracked(&verdict.request_id)? else {
            return Ok(false);
        };
        self.append(
            &item_id,
            &Actor {
                kind: ActorKind::Service,
                id: "classifier".into(),
            },
            &verdict_event(verdict, 0, 0, "tool"),
        )?;
        let (Some(item), Some(mut state)) = (self.item(&item_id)?, self.loop_state(&item_id)?)
        else {
            return Ok(true);
        };
        let waiting = matches!(&state.status, Status::Acting { request_id } if *request_id == verdict.request_id);
        let call = state.queue.front().filter(|c| c.id == call_id).cloned();
        let (true, Some(call)) = (waiting, call) else {
            return Ok(true);
        };
        let args: Value = serde_json::from_str(&call.arguments).unwrap_or_default();
        let mcp = self.mcp_resolve(&item.id, &call.tool)?;
        let action = match &mcp {
            Some((instance, tool)) => {
                crate::mcp::call_action(instance, tool, &args).map(|(a, _)| a)
            }
            None => call_action(&call.tool, &args, settings.harness_secrets),
        };
        let action = match action {
            Ok(a) => a,
            Err(e) => {
                self.finish_call(
                    settings,
                    &item,
                    &mut state,
                    &call.id,
                    &verdict.request_id,
                    e,
                    false,
                    false,
                )?;
                return self.save_loop(&item.id, &state).map(|()| true);
            }
        };
        // No plan: only a read-only action gets a permit, or a change
        // contained to a host the item's scope contains.
        let scope = Scope {
            plan: None,
            operator_confirmed: false,
            contained: &state.contained,
        };
        match crate::gate::permit_for(verdict, &action, scope) {
            Ok(permit) => {
                // An MCP call is an execution (L13): tracked as one.
                let request_id =
                    format!("{call_id}:{}", if mcp.is_some() { "mcp" } else { "exec" });
                let what = ExecFor {
                    agent: settings.plans.agent,
                    work_item_id: &item.id,
                    request_id: &request_id,
                    verdict_request_id: &verdict.request_id,
                    revision: 0,
                    step: 0,
                    phase: "tool",
                    attempt: 0,
                };
                if mcp.is_some() {
                    self.emit_mcp(permit, what)?;
                } else {
                    self.emit_exec(permit, what)?;
                }
                self.track(&request_id, &item.id, &call_id, "exec")?;
                state.status = Status::Acting { request_id };
            }
            Err(halt) => {
                // With an approved plan on the item, the plan runs its
                // own steps, and a call outside them halts it and asks
                // the operator (seed O2).
                // What took read-only away, as the classifier found it
                // (`--pre` makes `rg` run a command), so the model learns
                // why, not only that.
                let found = not_read_only(verdict);
                let why = match self.plan_refuses_call(settings.plans, &item, &action)? {
                    Some(r) => format!("not run: {r}. The operator was told."),
                    None if mcp.is_some() => format!(
                        "not run: {}{found}. Without an approved plan only read-only calls run; to change anything, propose the exact call with submit_plan (a step with tool `{}` and its arguments).",
                        halt.explain(),
                        action.tool
                    ),
                    None => {
                        let also = if state.contained.is_empty() {
                            String::new()
                        } else {
                            format!(", and changes contained to {}", state.contained.join(", "))
                        };
                        format!(
                            "not run: {}{found}. Without an approved plan only read-only actions run{also}; to change anything else, propose the exact steps with submit_plan.",
                            halt.explain()
                        )
                    }
                };
                self.finish_call(
                    settings,
                    &item,
                    &mut state,
                    &call.id,
                    &verdict.request_id,
                    why,
                    false,
                    false,
                )?;
            }
        }
        self.save_loop(&item.id, &state)?;
        Ok(true)
    }

    /// Applies the mcp service's answer, if it answers one of the loop's
    /// calls. Returns whether it did.
    pub fn loop_mcp_result(
        &mut self,
        settings: LoopSettings<'_>,
        result: &nisse_bus::proto::McpResult,
    ) -> Result<bool, StoreError> {
        let Some((item_id, call_id, _)) = self.tracked(&result.request_id)? else {
            return Ok(false);
        };
        let (Some(item), Some(mut state)) = (self.item(&item_id)?, self.loop_state(&item_id)?)
        else {
            return Ok(true);
        };
        let (text, ok) = crate::mcp::result_text(result);
        self.finish_call(
            settings,
            &item,
            &mut state,
            &call_id,
            &result.request_id,
            tail(&text, OUTPUT_KEPT),
            ok,
            true,
        )?;
        self.save_loop(&item.id, &state)?;
        Ok(true)
    }

    /// Applies an executor result, if it answers one of the loop's
    /// requests. Returns whether it did.
    pub fn loop_exec_result(
        &mut self,
        settings: LoopSettings<'_>,
        result: &ExecResult,
    ) -> Result<bool, StoreError> {
        let Some((item_id, call_id, _)) = self.tracked(&result.request_id)? else {
            return Ok(false);
        };
        let (Some(item), Some(mut state)) = (self.item(&item_id)?, self.loop_state(&item_id)?)
        else {
            return Ok(true);
        };
        let status = ExecStatus::try_from(result.status).unwrap_or_default();
        let stdout = String::from_utf8_lossy(&result.stdout);
        let stderr = String::from_utf8_lossy(&result.stderr);
        let mut text = match status {
            ExecStatus::Completed => format!("exit {}", result.exit_code),
            other => format!(
                "{}: {}",
                other
                    .as_str_name()
                    .trim_start_matches("EXEC_STATUS_")
                    .to_ascii_lowercase(),
                result.reason
            ),
        };
        if !stdout.is_empty() {
            text.push_str(&format!("\nstdout:\n{}", tail(&stdout, OUTPUT_KEPT)));
        }
        if !stderr.is_empty() {
            text.push_str(&format!("\nstderr:\n{}", tail(&stderr, OUTPUT_KEPT)));
        }
        let ok = status == ExecStatus::Completed && result.exit_code == 0;
        self.finish_call(
            settings,
            &item,
            &mut state,
            &call_id,
            &result.request_id,
            text,
            ok,
            true,
        )?;
        self.save_loop(&item.id, &state)?;
        Ok(true)
    }
}

/// The action an execution tool call asks for. A call naming one of the
/// harness's own secrets is refused.
fn call_action(tool: &str, args: &Value, reserved: &[String]) -> Result<Action, String> {
    let get = |key: &str| {
        args.get(key)
            .and_then(Value::as_str)
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .ok_or_else(|| format!("`{tool}` needs `{key}`"))
    };
    let host = get("host")?;
    let (name, arguments) = match tool {
        "shell" => (
            "shell",
            with_secrets(json!({ "command": get("command")? }), args),
        ),
        "read_file" => ("file.read", json!({ "path": get("path")? })),
        "list_dir" => ("file.list", json!({ "path": get("path")? })),
        other => return Err(format!("`{other}` is not an execution tool")),
    };
    let action = Action::new(name, host, &arguments).map_err(|e| e.0)?;
    FileOp::from_action(&action).map_err(|e| e.0)?;
    no_harness_secret(&action, reserved)?;
    Ok(action)
}

/// Refuses an action a model wrote that names one of the harness's own
/// secrets (or whose `secrets` is malformed).
fn no_harness_secret(action: &Action, reserved: &[String]) -> Result<(), String> {
    let secrets = action.secrets().map_err(|e| e.0)?;
    match secrets.iter().find(|s| reserved.contains(s)) {
        Some(s) => Err(format!(
            "`{s}` is the harness's own secret: a command a model chooses never receives it (the harness fetches and pushes; publish work with finish_milestone)"
        )),
        None => Ok(()),
    }
}

/// `arguments` with the call's `secrets` (when it names any) among them,
/// so they are classified and approved with the command.
fn with_secrets(mut arguments: Value, call: &Value) -> Value {
    if let Some(secrets) = call.get("secrets").filter(|v| !v.is_null()) {
        arguments["secrets"] = secrets.clone();
    }
    arguments
}

/// A `submit_plan` call's steps, as the plan machinery takes them.
fn plan_steps(args: &Value, reserved: &[String]) -> Result<Vec<(Step, Option<RiskClass>)>, String> {
    let steps = args
        .get("steps")
        .and_then(Value::as_array)
        .filter(|s| !s.is_empty())
        .ok_or("`steps` must be a non-empty list")?;
    let check = |v: Option<&Value>, which: &str, n: usize| -> Result<Option<Check>, String> {
        match v {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(c)) if c.trim().is_empty() => Ok(None),
            Some(Value::String(c)) => Ok(Some(Check::command(c, 0, None))),
            Some(o @ Value::Object(_)) => {
                let text = |key: &str| {
                    o.get(key)
                        .and_then(Value::as_str)
                        .map(str::trim)
                        .filter(|c| !c.is_empty())
                };
                let exit_code = o
                    .get("exit_code")
                    .and_then(Value::as_i64)
                    .and_then(|c| i32::try_from(c).ok())
                    .unwrap_or(0);
                let output_contains = text("output_contains").map(str::to_string);
                match (text("command"), text("tool")) {
                    (Some(command), None) => {
                        Ok(Some(Check::command(command, exit_code, output_contains)))
                    }
                    (None, Some(tool)) if nisse_policy::mcp::split_tool_name(tool).is_some() => {
                        let arguments = match o.get("arguments") {
                            None | Some(Value::Null) => json!({}),
                            Some(a @ Value::Object(_)) => a.clone(),
                            Some(_) => {
                                return Err(format!(
                                    "step {n}: `{which}`'s `arguments` must be an object"
                                ));
                            }
                        };
                        Ok(Some(Check {
                            tool: Some(tool.to_string()),
                            arguments: Some(nisse_policy::canonical_json(&arguments)),
                            exit_code,
                            output_contains,
                            ..Check::default()
                        }))
                    }
                    (None, Some(tool)) => Err(format!(
                        "step {n}: `{which}`'s tool `{tool}` is not an MCP tool (mcp:<instance>/<tool>)"
                    )),
                    _ => Err(format!(
                        "step {n}: `{which}` needs `command` or an MCP `tool`"
                    )),
                }
            }
            Some(_) => Err(format!(
                "step {n}: `{which}` must be a command or an object"
            )),
        }
    };
    steps
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let n = i + 1;
            let tool = s.get("tool").and_then(Value::as_str).unwrap_or("shell");
            // An MCP step acts on its tool's instance; every other step on
            // a host.
            let mcp = nisse_policy::mcp::split_tool_name(tool);
            let host = match mcp {
                Some((instance, _)) => instance,
                None => s
                    .get("host")
                    .and_then(Value::as_str)
                    .filter(|h| !h.trim().is_empty())
                    .ok_or_else(|| format!("step {n} needs `host`"))?,
            };
            let arguments = match tool {
                _ if mcp.is_some() => match s.get("arguments") {
                    None | Some(Value::Null) => json!({}),
                    Some(a @ Value::Object(_)) => a.clone(),
                    Some(_) => return Err(format!("step {n}: `arguments` must be an object")),
                },
                "shell" => with_secrets(
                    json!({
                        "command": s.get("command").and_then(Value::as_str)
                            .filter(|c| !c.trim().is_empty())
                            .ok_or_else(|| format!("step {n} needs `command`"))?
                    }),
                    s,
                ),
                "file.write" => {
                    let mut a = json!({
                        "path": s.get("path").and_then(Value::as_str).ok_or_else(|| format!("step {n} needs `path`"))?,
                        "content": s.get("content").and_then(Value::as_str).ok_or_else(|| format!("step {n} needs `content`"))?,
                    });
                    if let Some(mode) = s.get("mode").and_then(Value::as_str) {
                        a["mode"] = json!(mode);
                    }
                    a
                }
                other => {
                    return Err(format!(
                        "step {n}: `{other}` is not a step tool (use `shell`, `file.write` or an MCP tool as mcp:<instance>/<tool>)"
                    ));
                }
            };
            let action = Action::new(tool, host, &arguments).map_err(|e| format!("step {n}: {}", e.0))?;
            no_harness_secret(&action, reserved).map_err(|e| format!("step {n}: {e}"))?;
            Ok((
                Step {
                    action,
                    precondition: check(s.get("precondition"), "precondition", n)?,
                    expected: check(s.get("expected"), "expected", n)?,
                    retries: s
                        .get("retries")
                        .and_then(Value::as_u64)
                        .and_then(|r| u32::try_from(r).ok())
                        .unwrap_or(nisse_policy::plan::DEFAULT_RETRIES),
                },
                None,
            ))
        })
        .collect()
}

/// What in a verdict's command took read-only away: the findings of the
/// riskiest class, each with its reason (` (not read-only: `-o` is not an
/// option that keeps `tree` read-only)`); empty when nothing did.
fn not_read_only(verdict: &ClassifyVerdict) -> String {
    let risk = |f: &nisse_bus::proto::CommandFinding| f.risk;
    let Some(top) = verdict.commands.iter().map(risk).max() else {
        return String::new();
    };
    if top <= nisse_bus::proto::RiskClass::ReadOnly as i32 {
        return String::new();
    }
    let found: Vec<String> = verdict
        .commands
        .iter()
        .filter(|f| f.risk == top)
        .map(|f| match f.via.last() {
            Some(via) => format!("`{}` (run by `{via}`): {}", f.command, f.reason),
            None => format!("`{}`: {}", f.command, f.reason),
        })
        .collect();
    format!(" (not read-only: {})", found.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_steps_take_commands_files_and_checks() {
        let steps = plan_steps(&json!({ "steps": [
            { "host": "web1", "command": "systemctl restart nginx", "precondition": "systemctl is-enabled nginx",
              "expected": { "command": "systemctl is-active nginx", "output_contains": "active" } },
            { "host": "web1", "tool": "file.write", "path": "/etc/motd", "content": "hi\n", "mode": "0644" }
        ]}), &[])
        .unwrap();
        assert_eq!(steps.len(), 2);
        assert_eq!(
            steps[0].0.action.argument_str("command").unwrap(),
            "systemctl restart nginx"
        );
        assert_eq!(
            steps[0].0.precondition.as_ref().unwrap().command,
            "systemctl is-enabled nginx"
        );
        assert_eq!(
            steps[0]
                .0
                .expected
                .as_ref()
                .unwrap()
                .output_contains
                .as_deref(),
            Some("active")
        );
        assert_eq!(steps[1].0.action.tool, "file.write");
    }

    #[test]
    fn plan_steps_name_what_is_missing() {
        let e = plan_steps(&json!({ "steps": [{ "command": "true" }] }), &[]).unwrap_err();
        assert!(e.contains("step 1 needs `host`"), "{e}");
        let e = plan_steps(&json!({ "steps": [] }), &[]).unwrap_err();
        assert!(e.contains("non-empty"), "{e}");
        let e = plan_steps(&json!({ "steps": [{ "host": "a", "tool": "rm" }] }), &[]).unwrap_err();
        assert!(e.contains("not a step tool"), "{e}");
    }

    #[test]
    fn call_actions_are_checked() {
        assert!(
            call_action("shell", &json!({ "host": "a" }), &[])
                .unwrap_err()
                .contains("`command`")
        );
        assert!(call_action("read_file", &json!({ "host": "a", "path": "../x" }), &[]).is_err());
        let a = call_action("list_dir", &json!({ "host": "a", "path": "/var/log" }), &[]).unwrap();
        assert_eq!(a.tool, "file.list");
    }

    #[test]
    fn a_model_never_names_the_harnesss_secrets() {
        let reserved = ["push-key".to_string()];
        let call = json!({ "host": "b", "command": "git push", "secrets": ["db", "push-key"] });
        let e = call_action("shell", &call, &reserved).unwrap_err();
        assert!(e.contains("`push-key` is the harness's own secret"), "{e}");
        let e = plan_steps(&json!({ "steps": [call] }), &reserved).unwrap_err();
        assert!(e.starts_with("step 1: `push-key`"), "{e}");
        // Other secrets are the policy's to grant or not.
        let other = json!({ "host": "b", "command": "psql", "secrets": ["db"] });
        assert!(call_action("shell", &other, &reserved).is_ok());
    }
}
