//! Tools an agent adds to the shared loop (the dev agent's
//! `start_milestone`, `finish_milestone`, `restate`): offered to the
//! driver next to the shared ones, and handled by the agent's duties, not
//! by the loop.
//!
//! A call to one leaves the loop acting on the request id
//! `<call id>:agent` until the duties answer it ([`Txn::agent_call_done`])
//! or turn it into a question for the operator ([`Txn::agent_call_asks`]).
//! The duties find the call waiting for them with [`Txn::agent_call`]
//! after every message ([`crate::Duties::after`]), so a crash between the
//! model's reply and the duties' first step loses nothing: the call is in
//! the store until it has its result.

use serde_json::Value;

use super::state::{Call, LoopSettings, LoopState, Status};
use crate::store::{StoreError, Txn};
use crate::work::WorkItem;

/// A tool an agent adds to the loop.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentTool {
    /// Its name, as the model calls it.
    pub name: &'static str,
    /// What it does, for the model.
    pub description: &'static str,
    /// Its arguments' JSON schema (an object).
    pub parameters: Value,
}

/// What the loop does once an agent tool's call has its result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterCall {
    /// Go on with the turn's other calls; the next turn is due when all
    /// have results.
    GoOn,
    /// The call ends the turn and no turn is due: the item waits for news
    /// (a review, a merge), which the agent brings with
    /// [`Txn::loop_wake`]. Calls after it are not run.
    Wait,
}

/// The request id a call to an agent tool waits on.
pub(super) fn agent_request(call_id: &str) -> String {
    format!("{call_id}:agent")
}

impl Txn<'_, '_> {
    /// The agent tool's call `work_item_id`'s loop waits on, if it waits
    /// on one.
    pub fn agent_call(&self, work_item_id: &str) -> Result<Option<Call>, StoreError> {
        let Some(state) = self.loop_state(work_item_id)? else {
            return Ok(None);
        };
        Ok(waiting_call(&state).cloned())
    }

    /// Answers the agent tool's call `call_id` on `item`: its result is
    /// recorded, and the loop goes on as `after` says. A call the loop no
    /// longer waits on (the operator said stop) gets its result on record
    /// and nothing more.
    pub fn agent_call_done(
        &mut self,
        settings: LoopSettings<'_>,
        item: &WorkItem,
        call_id: &str,
        result: String,
        success: bool,
        after: AfterCall,
    ) -> Result<(), StoreError> {
        let Some(mut state) = self.loop_state(&item.id)? else {
            return Ok(());
        };
        let waiting = waiting_call(&state).filter(|c| c.id == call_id).cloned();
        match after {
            AfterCall::GoOn => self.finish_call(
                settings,
                item,
                &mut state,
                call_id,
                &agent_request(call_id),
                result,
                success,
                false,
            )?,
            AfterCall::Wait => {
                self.record_result(&item.id, &mut state, call_id, result, success, false)?;
                if let Some(call) = waiting {
                    state.queue.pop_front();
                    self.not_run_after(&item.id, &mut state, &call.tool)?;
                    state.status = Status::Idle;
                    state.wake = None;
                }
            }
        }
        self.save_loop(&item.id, &state)
    }

    /// Turns the agent tool's call `call_id` into a question for the
    /// operator, asked in the item's thread: their answer is its result
    /// (as for `ask_human`), or the agent's own through
    /// [`Txn::loop_answer_asked`].
    pub fn agent_call_asks(
        &mut self,
        settings: LoopSettings<'_>,
        item: &WorkItem,
        call_id: &str,
        question: &str,
    ) -> Result<(), StoreError> {
        let Some(mut state) = self.loop_state(&item.id)? else {
            return Ok(());
        };
        let Some(call) = waiting_call(&state).filter(|c| c.id == call_id).cloned() else {
            return Ok(());
        };
        state.queue.pop_front();
        self.not_run_after(&item.id, &mut state, &call.tool)?;
        self.ask_operator(settings, item, &mut state, call_id, question)?;
        self.save_loop(&item.id, &state)
    }

    /// Wakes `work_item_id`'s idle loop: news the agent recorded in the
    /// log (a merge, a review) is for the next turn.
    pub fn loop_wake(&mut self, work_item_id: &str, why: &str) -> Result<(), StoreError> {
        let Some(mut state) = self.loop_state(work_item_id)? else {
            return Ok(());
        };
        if state.status == Status::Idle {
            state.wake = Some(why.to_string());
            self.save_loop(work_item_id, &state)?;
        }
        Ok(())
    }

    /// Holds `work_item_id`'s loop for `why`: no turn starts and no queued
    /// call runs until [`Txn::loop_release`]. A call in flight finishes;
    /// the harness waits for it before it moves what the loop works on.
    pub fn loop_hold(&mut self, work_item_id: &str, why: &str) -> Result<(), StoreError> {
        let Some(mut state) = self.loop_state(work_item_id)? else {
            return Ok(());
        };
        if state.held.is_none() {
            state.held = Some(why.to_string());
            self.save_loop(work_item_id, &state)?;
        }
        Ok(())
    }

    /// Lets go of a loop [`Txn::loop_hold`] held: the calls that waited
    /// run now, in order, and a turn is due when none is left.
    pub fn loop_release(
        &mut self,
        settings: LoopSettings<'_>,
        item: &WorkItem,
    ) -> Result<(), StoreError> {
        let Some(mut state) = self.loop_state(&item.id)? else {
            return Ok(());
        };
        if state.held.take().is_none() {
            return Ok(());
        }
        if state.status == Status::Idle && !state.queue.is_empty() {
            self.work_queue(settings, item, &mut state)?;
        }
        self.save_loop(&item.id, &state)
    }

    /// Makes `hosts` the ones `work_item_id`'s agreed scope contains: the
    /// loop's class-2 actions on them (changes contained to the host) run
    /// without a plan. The agent's harness says so from its configuration
    /// (the dev agent's build host, D6); a model never can.
    pub fn loop_contain(
        &mut self,
        work_item_id: &str,
        hosts: Vec<String>,
    ) -> Result<(), StoreError> {
        let Some(mut state) = self.loop_state(work_item_id)? else {
            return Ok(());
        };
        if state.contained != hosts {
            state.contained = hosts;
            self.save_loop(work_item_id, &state)?;
        }
        Ok(())
    }

    /// Records that the turn's calls still queued were not run: `tool`
    /// ended the turn before them.
    pub(super) fn not_run_after(
        &mut self,
        work_item_id: &str,
        state: &mut LoopState,
        tool: &str,
    ) -> Result<(), StoreError> {
        let rest: Vec<Call> = state.queue.drain(..).collect();
        for later in rest {
            self.record_result(
                work_item_id,
                state,
                &later.id,
                format!("not run: `{tool}` ended the turn before it; call it last"),
                false,
                false,
            )?;
        }
        Ok(())
    }
}

/// The agent tool's call the loop waits on.
fn waiting_call(state: &LoopState) -> Option<&Call> {
    let Status::Acting { request_id } = &state.status else {
        return None;
    };
    state
        .queue
        .front()
        .filter(|c| *request_id == agent_request(&c.id))
}

/// Whether `tool` is one of `tools`.
pub(super) fn is_agent_tool(tools: &[AgentTool], tool: &str) -> bool {
    tools.iter().any(|t| t.name == tool)
}
