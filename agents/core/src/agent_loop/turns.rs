//! When a turn is due and what comes of it: the loop opened, pinned,
//! woken by the operator or stopped; a model turn rendered and sent; its
//! reply recorded and its calls queued; an operator's question answered
//! from the item's context.

use std::collections::{BTreeMap, VecDeque};

use serde_json::json;

use nisse_bus::proto::{self, ChatMessage, ModelRequest, ModelResponse, ToolDefinition};
use nisse_models::{Pin, Role};

use super::prompt::{ANSWER_PROMPT, system_prompt, tool_definitions};
use super::state::{Call, LoopSettings, LoopState, Status, pin_from_wire, pin_to_wire};
use super::tools::EXEC_TOOLS;
use crate::log::{Actor, ActorKind, Event};
use crate::markdown::md_escape;
use crate::plans::PlanStatus;
use crate::render::{self, Pinned, View};
use crate::say::Say;
use crate::store::{StoreError, Txn, ns_to_time, time_to_ns};
use crate::work::WorkItem;

impl Txn<'_, '_> {
    /// Starts (or, for a reopened item, restarts) an item's loop; a turn is
    /// due. The first time, the roles are resolved from `[models]` and sent
    /// to the brain's own stream as a `RolesPinned` message: the loop takes
    /// its pins (L9) from that message when it comes back, so the pin is in
    /// the stream and a rebuild pins the same models whatever the
    /// configuration says by then. Nothing happens when no model role is
    /// configured.
    pub fn loop_open(
        &mut self,
        settings: LoopSettings<'_>,
        item: &WorkItem,
        why: &str,
    ) -> Result<(), StoreError> {
        if !settings.models.enabled() {
            return Ok(());
        }
        let mut state = match self.loop_state(&item.id)? {
            Some(s) => s,
            None => {
                let pin = proto::RolesPinned {
                    envelope: Some(self.agent_envelope(
                        settings.plans.agent,
                        &item.id,
                        format!("pin:{}", item.id),
                    )),
                    roles: settings
                        .models
                        .pins()
                        .into_iter()
                        .map(|(role, pin)| pin_to_wire(role, pin))
                        .collect(),
                };
                self.emit(&pin)?;
                let recall = if settings.memory {
                    Some(self.start_recall(settings, item)?)
                } else {
                    None
                };
                LoopState {
                    pins: BTreeMap::new(),
                    role: Role::Driver,
                    status: Status::Idle,
                    wake: None,
                    watch_plan: None,
                    turn: 0,
                    queue: VecDeque::new(),
                    violations: 0,
                    failures: 0,
                    driver_turns: 0,
                    driver_since_ns: time_to_ns(self.at()),
                    delegation: None,
                    delegations: 0,
                    expert_calls: 0,
                    recall,
                    contained: Vec::new(),
                    held: None,
                }
            }
        };
        if matches!(state.status, Status::Done | Status::Stuck { .. }) {
            state.status = Status::Idle;
            state.failures = 0;
            state.violations = 0;
            state.driver_turns = 0;
            state.driver_since_ns = time_to_ns(self.at());
        }
        state.wake = Some(why.to_string());
        self.save_loop(&item.id, &state)
    }

    /// The brain's own `RolesPinned` back from the stream: the item's roles
    /// are pinned to what it names and recorded in the item's log. The
    /// first pin of an item holds; a later one changes nothing.
    pub fn loop_pinned(
        &mut self,
        settings: LoopSettings<'_>,
        pinned: &proto::RolesPinned,
    ) -> Result<(), StoreError> {
        let item_id = pinned
            .envelope
            .as_ref()
            .map(|e| e.work_item_id.clone())
            .unwrap_or_default();
        let Some(mut state) = self.loop_state(&item_id)? else {
            return Ok(());
        };
        if !state.pins.is_empty() {
            return Ok(());
        }
        let pins: BTreeMap<Role, Pin> = pinned.roles.iter().filter_map(pin_from_wire).collect();
        self.append(
            &item_id,
            &Actor::agent(settings.plans.agent),
            &Event::RolesPinned {
                roles: pins
                    .iter()
                    .map(|(r, p)| (r.as_str().to_string(), p.clone()))
                    .collect(),
            },
        )?;
        state.pins = pins;
        self.save_loop(&item_id, &state)
    }

    /// The operator said something on the item (not a command): the
    /// answer to a pending question, or news for the next turn. A loop that
    /// was stopped or stuck goes on from here.
    pub fn loop_operator_said(&mut self, item: &WorkItem, text: &str) -> Result<(), StoreError> {
        let Some(mut state) = self.loop_state(&item.id)? else {
            return Ok(());
        };
        match state.status.clone() {
            Status::Asking { call_id } => {
                return self.loop_answer_asked(
                    &item.id,
                    &call_id,
                    format!("The operator answered: {text}"),
                    "the operator answered",
                );
            }
            Status::Stopped | Status::Stuck { .. } => {
                state.status = Status::Idle;
                state.failures = 0;
                state.violations = 0;
                state.driver_turns = 0;
                state.driver_since_ns = time_to_ns(self.at());
                state.wake = Some("the operator said what next".into());
            }
            Status::Idle => state.wake = Some("the operator said something".into()),
            // Already working: the words are in the log for the next turn.
            Status::Thinking { .. } | Status::Acting { .. } | Status::Done => {}
        }
        self.save_loop(&item.id, &state)
    }

    /// Answers the question the loop of `work_item_id` waits on, when it
    /// is the one call `call_id` asked: `result` is the call's result and
    /// a turn is due (`why`). The operator's words answer it through
    /// [`Txn::loop_operator_said`]; an agent answers its own question
    /// with this when the operator let a grace period pass (the dev
    /// agent's restatement of a bug).
    pub fn loop_answer_asked(
        &mut self,
        work_item_id: &str,
        call_id: &str,
        result: String,
        why: &str,
    ) -> Result<(), StoreError> {
        let Some(mut state) = self.loop_state(work_item_id)? else {
            return Ok(());
        };
        if !matches!(&state.status, Status::Asking { call_id: c } if c == call_id) {
            return Ok(());
        }
        self.record_result(work_item_id, &mut state, call_id, result, true, false)?;
        state.status = Status::Idle;
        state.wake = Some(why.to_string());
        self.save_loop(work_item_id, &state)
    }

    /// `stop` (L2): the loop ends at this tool boundary. A reply or result
    /// still out is recorded when it comes, and nothing more is done until
    /// the operator says what next.
    pub fn loop_stop(
        &mut self,
        settings: LoopSettings<'_>,
        item: &WorkItem,
    ) -> Result<(), StoreError> {
        let Some(mut state) = self.loop_state(&item.id)? else {
            return Ok(());
        };
        if state.status == Status::Done {
            return Ok(());
        }
        let pending: Vec<Call> = state.queue.drain(..).collect();
        for (i, call) in pending.iter().enumerate() {
            // The one in flight gets its real result when it comes, unless
            // it is only with the classifier: then nothing ran, and nothing
            // will (the verdict finds the loop stopped).
            let running = matches!(&state.status,
                Status::Acting { request_id } if !request_id.ends_with(":classify"));
            if i == 0 && running {
                continue;
            }
            self.record_result(
                &item.id,
                &mut state,
                &call.id,
                "not run: the operator said stop".into(),
                false,
                false,
            )?;
        }
        if state.delegation.is_some() {
            self.end_delegation(
                settings,
                item,
                &mut state,
                "stopped",
                "The operator said stop during the delegation.".into(),
            )?;
        }
        state.status = Status::Stopped;
        state.wake = None;
        self.save_loop(&item.id, &state)
    }

    /// Applies a model gateway response, if it answers one of the loop's
    /// requests. Returns whether it did.
    pub fn loop_model_response(
        &mut self,
        settings: LoopSettings<'_>,
        response: &ModelResponse,
    ) -> Result<bool, StoreError> {
        let Some((item_id, call_id, kind)) = self.tracked(&response.request_id)? else {
            return Ok(false);
        };
        let (Some(item), Some(mut state)) = (self.item(&item_id)?, self.loop_state(&item_id)?)
        else {
            return Ok(true);
        };
        let usage = response
            .usage
            .map_or(0, |u| u.prompt_tokens + u.completion_tokens);
        if let Some(d) = &mut state.delegation {
            d.tokens += usage;
        }
        match kind.as_str() {
            "expert" => self.expert_answered(settings, &item, &mut state, &call_id, response)?,
            "answer" => self.question_answered(settings, &item, response)?,
            _ => self.turn_answered(settings, &item, &mut state, response)?,
        }
        self.save_loop(&item.id, &state)?;
        Ok(true)
    }

    fn turn_answered(
        &mut self,
        settings: LoopSettings<'_>,
        item: &WorkItem,
        state: &mut LoopState,
        response: &ModelResponse,
    ) -> Result<(), StoreError> {
        // A reply that comes after `stop`, or after the item closed, is
        // recorded; its calls are not run.
        let closed = !item.state.is_open();
        if closed {
            state.status = Status::Done;
            state.wake = None;
        }
        let not_run = match state.status {
            Status::Stopped => Some("not run: the operator said stop"),
            Status::Done => Some("not run: the work item is closed"),
            _ => None,
        };
        let stopped = not_run.is_some();
        let expected = matches!(&state.status, Status::Thinking { request_id } if *request_id == response.request_id);
        if !expected && !stopped {
            return Ok(());
        }
        let role = state.role;
        let actor = Self::agent_actor(settings, role);
        match &response.outcome {
            Some(proto::model_response::Outcome::Reply(reply)) => {
                if !reply.content.trim().is_empty() {
                    self.append(
                        &item.id,
                        &actor,
                        &Event::AssistantText {
                            request_id: response.request_id.clone(),
                            role: role.as_str().into(),
                            model: response.model.clone(),
                            text: reply.content.clone(),
                        },
                    )?;
                }
                let mut calls = VecDeque::new();
                for (i, c) in reply.tool_calls.iter().enumerate() {
                    let call = Call {
                        id: format!("{}.t{}", response.request_id, i + 1),
                        tool: c.name.clone(),
                        arguments: c.arguments_json.clone(),
                    };
                    self.append(
                        &item.id,
                        &actor,
                        &Event::ToolCall {
                            call_id: call.id.clone(),
                            request_id: response.request_id.clone(),
                            provider_id: c.id.clone(),
                            role: role.as_str().into(),
                            tool: call.tool.clone(),
                            arguments: call.arguments.clone(),
                        },
                    )?;
                    calls.push_back(call);
                }
                if let Some(why) = not_run {
                    for call in calls {
                        self.record_result(&item.id, state, &call.id, why.into(), false, false)?;
                    }
                    return Ok(());
                }
                state.status = Status::Idle;
                if calls.is_empty() {
                    // The contract (L9): every reply calls a tool; prose
                    // is a violation, and the model is told so.
                    state.violations += 1;
                    self.append(
                        &item.id,
                        &Actor::agent(settings.plans.agent),
                        &Event::Fact {
                            text: format!(
                                "Your reply had no tool call ({} in a row). Every reply must call a tool: investigate with {}, propose changes with submit_plan, talk to the operator with ask_human, and end with {}.",
                                state.violations,
                                EXEC_TOOLS.join(", "),
                                if role == Role::Helper { "hand_back" } else { "finish" }
                            ),
                            data: json!({ "violation": "no_tool_call", "request_id": response.request_id }),
                        },
                    )?;
                    state.wake = Some("a reply without a tool call".into());
                    return Ok(());
                }
                state.violations = 0;
                state.queue = calls;
                self.work_queue(settings, item, state)
            }
            Some(proto::model_response::Outcome::Error(e)) => {
                let kind = proto::ModelErrorKind::try_from(e.kind).unwrap_or_default();
                let name = error_name(kind);
                self.append(
                    &item.id,
                    &Actor {
                        kind: ActorKind::Service,
                        id: "model-gateway".into(),
                    },
                    &Event::ModelFailed {
                        request_id: response.request_id.clone(),
                        role: role.as_str().into(),
                        model: response.model.clone(),
                        error: name.clone(),
                        message: e.message.clone(),
                    },
                )?;
                if stopped {
                    return Ok(());
                }
                state.status = Status::Idle;
                match kind {
                    proto::ModelErrorKind::BudgetExceeded => self.stuck(
                        settings,
                        item,
                        state,
                        format!(
                            "the {role}'s model budget for this item is spent ({})",
                            e.message
                        ),
                    ),
                    proto::ModelErrorKind::ContextTooLong => self.context_too_big(
                        settings,
                        item,
                        state,
                        format!("the model refused the context as too long ({})", e.message),
                    ),
                    _ => {
                        state.failures += 1;
                        state.wake = Some(format!("the model call failed ({name})"));
                        Ok(())
                    }
                }
            }
            None => Ok(()),
        }
    }

    /// An operator's question on an item with a loop (L5: a question gets
    /// an answer drawn from the item's context and never changes state):
    /// the driver's model is asked, with the item's context and no tools,
    /// beside whatever the loop is doing; its answer goes to the thread.
    /// Returns false when the item has no pinned loop (the caller answers
    /// by code then).
    pub fn loop_answer(
        &mut self,
        settings: LoopSettings<'_>,
        item: &WorkItem,
        question_event: i64,
    ) -> Result<bool, StoreError> {
        let Some(state) = self.loop_state(&item.id)? else {
            return Ok(false);
        };
        let Some(pin) = state.pins.get(&Role::Driver).cloned() else {
            return Ok(false);
        };
        let view = View {
            role: Role::Driver,
            system: format!(
                "{}\n\n{ANSWER_PROMPT}",
                system_prompt(settings, Role::Driver, &state.pins)
            ),
            pinned: self.pinned_context(item)?,
            window: pin.profile.context_window,
            reserve: u64::from(pin.profile.max_output_tokens),
            keep_recent: settings.config.keep_recent,
        };
        let events = self.events(&item.id)?;
        let rendered = match render::render(&events, &view) {
            Ok(r) => r,
            // Too much to ask about: the code's status answers instead.
            Err(_) => return Ok(false),
        };
        let request_id = format!("{}:a{question_event}", item.id);
        self.send_model_request(
            settings,
            item,
            Role::Driver,
            &pin,
            &request_id,
            rendered.messages,
            Vec::new(),
            rendered.tokens,
            (rendered.dropped, rendered.shortened),
        )?;
        self.track(&request_id, &item.id, "", "answer")?;
        Ok(true)
    }

    /// The driver's answer to an operator's question: recorded as its
    /// words and posted in the thread; nothing else changes.
    fn question_answered(
        &mut self,
        settings: LoopSettings<'_>,
        item: &WorkItem,
        response: &ModelResponse,
    ) -> Result<(), StoreError> {
        let text = match &response.outcome {
            Some(proto::model_response::Outcome::Reply(r)) if !r.content.trim().is_empty() => {
                r.content.trim().to_string()
            }
            Some(proto::model_response::Outcome::Error(e)) => {
                let event = self.append(
                    &item.id,
                    &Actor {
                        kind: ActorKind::Service,
                        id: "model-gateway".into(),
                    },
                    &Event::ModelFailed {
                        request_id: response.request_id.clone(),
                        role: Role::Driver.as_str().into(),
                        model: response.model.clone(),
                        error: error_name(
                            proto::ModelErrorKind::try_from(e.kind).unwrap_or_default(),
                        ),
                        message: e.message.clone(),
                    },
                )?;
                return self.say(
                    settings.plans.agent,
                    item,
                    event,
                    Say::fact(format!(
                        "I could not answer that just now (the model call failed: {}).",
                        md_escape(&e.message)
                    )),
                );
            }
            _ => "(the model gave no answer)".to_string(),
        };
        let event = self.append(
            &item.id,
            &Self::agent_actor(settings, Role::Driver),
            &Event::AssistantText {
                request_id: response.request_id.clone(),
                role: Role::Driver.as_str().into(),
                model: response.model.clone(),
                text: text.clone(),
            },
        )?;
        self.say(settings.plans.agent, item, event, Say::progress(text))
    }

    /// Moves the active item's loop on: notices the end of a plan it
    /// proposed, and starts a turn when one is due. Called after every
    /// message, like the plan machinery's resume.
    pub fn drive_loop(&mut self, settings: LoopSettings<'_>) -> Result<(), StoreError> {
        if !settings.models.enabled() {
            return Ok(());
        }
        let Some(item) = self.active_item()? else {
            return Ok(());
        };
        let Some(mut state) = self.loop_state(&item.id)? else {
            return Ok(());
        };
        let before = state.clone();
        if let Some(revision) = state.watch_plan {
            self.plan_outcome(settings, &item, &mut state, revision)?;
        }
        // A turn waits for the item's pins to come back from the stream,
        // and the first for what the vault recalls.
        if state.status == Status::Idle
            && state.wake.is_some()
            && !state.pins.is_empty()
            && state.recall.is_none()
            && state.held.is_none()
        {
            self.next_turn(settings, &item, &mut state)?;
        }
        if state != before {
            self.save_loop(&item.id, &state)?;
        }
        Ok(())
    }

    /// When the watched plan has ended, a fact says how, and a turn is due.
    fn plan_outcome(
        &mut self,
        settings: LoopSettings<'_>,
        item: &WorkItem,
        state: &mut LoopState,
        revision: u32,
    ) -> Result<(), StoreError> {
        let plans = self.plans(&item.id)?;
        let Some(plan) = plans.iter().find(|p| p.revision == revision) else {
            state.watch_plan = None;
            return Ok(());
        };
        let text = match plan.status {
            PlanStatus::Done => format!(
                "rev-{revision} ran to the end: every step and its checks passed. Verify the outcome if something is left to check, then call finish with what was done, what was verified and what is left open."
            ),
            PlanStatus::Denied => format!("The operator denied rev-{revision}; it will not run."),
            PlanStatus::Rejected => {
                format!("rev-{revision} was rejected before it went to the operator.")
            }
            PlanStatus::Halted => format!(
                "rev-{revision} stopped for good: {}",
                plan.halted.clone().unwrap_or_default()
            ),
            PlanStatus::Superseded => {
                // A newer revision (the operator's) replaced it: watch that.
                state.watch_plan = plans
                    .last()
                    .filter(|p| p.status.is_open())
                    .map(|p| p.revision);
                return Ok(());
            }
            PlanStatus::Abandoned => {
                state.watch_plan = None;
                return Ok(());
            }
            _ => return Ok(()),
        };
        state.watch_plan = None;
        self.append(
            &item.id,
            &Actor::agent(settings.plans.agent),
            &Event::Fact {
                text,
                data: json!({ "plan_outcome": plan.status.to_string(), "revision": revision }),
            },
        )?;
        if !matches!(state.status, Status::Stopped | Status::Done) {
            state.wake = Some(format!("rev-{revision} ended"));
        }
        Ok(())
    }

    /// Starts the next model turn, escalating first when a trigger holds.
    fn next_turn(
        &mut self,
        settings: LoopSettings<'_>,
        item: &WorkItem,
        state: &mut LoopState,
    ) -> Result<(), StoreError> {
        let now = self.at();
        let cfg = settings.config;
        if state.role == Role::Driver {
            let elapsed = now - ns_to_time(state.driver_since_ns);
            let trigger = if state.failures >= cfg.max_failures {
                Some(format!("{} failed actions in a row", state.failures))
            } else if state.violations >= cfg.max_violations {
                Some(format!(
                    "{} replies without a tool call in a row",
                    state.violations
                ))
            } else if state.driver_turns >= cfg.driver_turns {
                Some(format!(
                    "the driver's turn cap ({}) was reached",
                    cfg.driver_turns
                ))
            } else if elapsed >= cfg.driver_time {
                Some(format!(
                    "the driver's time cap ({}) was reached",
                    humantime::format_duration(cfg.driver_time)
                ))
            } else {
                None
            };
            if let Some(trigger) = trigger {
                self.escalate(settings, item, state, trigger)?;
                if state.role != Role::Helper {
                    return Ok(());
                }
            }
        } else if let Some(d) = state.delegation.clone() {
            let elapsed = now - ns_to_time(d.since_ns);
            let cap =
                if state.failures >= cfg.max_failures || state.violations >= cfg.max_violations {
                    Some(("failed", "the helper kept failing"))
                } else if d.turns >= cfg.delegation_turns {
                    Some(("turn_cap", "the helper reached its turn cap"))
                } else if d.tokens >= cfg.delegation_tokens {
                    Some(("token_cap", "the helper reached its token cap"))
                } else if elapsed >= cfg.delegation_time {
                    Some(("time_cap", "the helper reached its time cap"))
                } else {
                    None
                };
            if let Some((status, why)) = cap {
                let note =
                    format!("{why} without handing back; its work so far is in the log above.");
                self.end_delegation(settings, item, state, status, note)?;
                if status == "failed" {
                    return self.stuck(
                        settings,
                        item,
                        state,
                        format!("{why} after the driver escalated ({})", d.trigger),
                    );
                }
            }
        }
        let role = state.role;
        let Some(pin) = state.pins.get(&role).cloned() else {
            return self.stuck(
                settings,
                item,
                state,
                format!("no model is configured for the {role} role"),
            );
        };
        let mut tools = tool_definitions(settings, role, &state.pins);
        if matches!(role, Role::Driver | Role::Helper) {
            // The item's tool profile: the agent's read-only MCP instances,
            // mounted before their tools are offered.
            self.mcp_mount_read_only(settings.plans.agent, settings.mcp, &item.id)?;
            tools.extend(self.mcp_tool_definitions(&item.id)?);
        }
        let tools_tokens: u64 = tools
            .iter()
            .map(|t| {
                render::estimate_tokens(&t.parameters_json_schema)
                    + render::estimate_tokens(&t.description)
                    + 8
            })
            .sum();
        let view = View {
            role,
            system: system_prompt(settings, role, &state.pins),
            pinned: self.pinned_context(item)?,
            window: pin.profile.context_window,
            reserve: u64::from(pin.profile.max_output_tokens) + tools_tokens,
            keep_recent: cfg.keep_recent,
        };
        let events = self.events(&item.id)?;
        let rendered = match render::render(&events, &view) {
            Ok(r) => r,
            Err(no_fit) => {
                self.append(
                    &item.id,
                    &Actor::agent(settings.plans.agent),
                    &Event::ModelFailed {
                        request_id: String::new(),
                        role: role.as_str().into(),
                        model: pin.model.clone(),
                        error: "no_fit".into(),
                        message: no_fit.to_string(),
                    },
                )?;
                return self.context_too_big(settings, item, state, no_fit.to_string());
            }
        };
        state.turn += 1;
        let request_id = format!("{}:m{}", item.id, state.turn);
        self.send_model_request(
            settings,
            item,
            role,
            &pin,
            &request_id,
            rendered.messages,
            tools,
            rendered.tokens,
            (rendered.dropped, rendered.shortened),
        )?;
        self.track(&request_id, &item.id, "", "model")?;
        match &mut state.delegation {
            Some(d) if role == Role::Helper => d.turns += 1,
            _ => state.driver_turns += 1,
        }
        state.status = Status::Thinking { request_id };
        state.wake = None;
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn send_model_request(
        &mut self,
        settings: LoopSettings<'_>,
        item: &WorkItem,
        role: Role,
        pin: &Pin,
        request_id: &str,
        messages: Vec<ChatMessage>,
        tools: Vec<ToolDefinition>,
        prompt_tokens: u64,
        (dropped, shortened): (u64, u64),
    ) -> Result<(), StoreError> {
        let request = ModelRequest {
            envelope: Some(self.agent_envelope(
                settings.plans.agent,
                &item.id,
                format!("model:{request_id}"),
            )),
            request_id: request_id.to_string(),
            role: role.as_str().into(),
            tool_choice: if pin.profile.tool_choice && !tools.is_empty() {
                "required".into()
            } else {
                String::new()
            },
            messages,
            tools,
            max_tokens: Some(pin.profile.max_output_tokens),
            temperature: None,
            model: pin.model.clone(),
        };
        self.emit(&request)?;
        self.append(
            &item.id,
            &Actor::agent(settings.plans.agent),
            &Event::ModelRequested {
                request_id: request_id.to_string(),
                role: role.as_str().into(),
                model: pin.model.clone(),
                prompt_tokens,
                dropped_events: dropped,
                shortened_results: shortened,
            },
        )?;
        Ok(())
    }

    /// The orchestrator context no fitting may drop: the bound hosts and
    /// the world around them, the current plan, and what the vault
    /// recalled for the item.
    fn pinned_context(&self, item: &WorkItem) -> Result<Vec<Pinned>, StoreError> {
        let mut out: Vec<Pinned> = vec![Pinned::Says(format!(
            "Work item #{}: {} (scope {}). Hosts bound to it: {}.",
            item.number,
            // Both from outside (an alert's labels): quoted, so they read
            // as data (L11).
            render::quoted(&item.title),
            render::quoted(&item.scope),
            {
                let bound = self.bound_hosts(&item.id)?;
                if bound.is_empty() {
                    "none".to_string()
                } else {
                    bound
                        .iter()
                        .map(|h| render::quoted(h))
                        .collect::<Vec<_>>()
                        .join(", ")
                }
            }
        ))];
        if let Some(world) = self.world()?
            && let Some(text) = crate::world::hosts_context(
                &world,
                &self.bound_hosts(&item.id)?.into_iter().collect::<Vec<_>>(),
            )
        {
            out.push(Pinned::Says(text));
        }
        if let Some(plan) = self.current_plan(&item.id)? {
            let steps: Vec<String> = plan
                .steps
                .iter()
                .enumerate()
                .map(|(i, s)| {
                    format!(
                        "{}. on {}: {} {}",
                        i + 1,
                        s.step.action.target,
                        s.step.action.tool,
                        s.step.action.arguments
                    )
                })
                .collect();
            out.push(Pinned::Says(format!(
                "Current plan {} ({}{}):\n{}",
                plan.tag(),
                plan.status,
                if plan.status == PlanStatus::Running {
                    format!(", next step {}", plan.next_step + 1)
                } else {
                    String::new()
                },
                steps.join("\n")
            )));
        }
        out.extend(super::knowledge::recalled(&self.events(&item.id)?));
        Ok(out)
    }
}

pub(super) fn error_name(kind: proto::ModelErrorKind) -> String {
    kind.as_str_name()
        .trim_start_matches("MODEL_ERROR_KIND_")
        .to_ascii_lowercase()
}
