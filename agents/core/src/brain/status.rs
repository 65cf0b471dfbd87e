//! Where an item stands, rendered by code for `status` and for questions
//! no model answers: its state, what the agent loop is doing or waiting
//! for, and its plan; and, for `status` at the top of the room, where
//! every open item stands.

use crate::agent_loop::Status;
use crate::markdown::md_escape;
use crate::store::{StoreError, Txn};
use crate::work::WorkItem;

/// The status of `item`, as Markdown.
pub(super) fn render(txn: &Txn<'_, '_>, item: &WorkItem) -> Result<String, StoreError> {
    let mut text = format!(
        "Item **#{}** · **{}** · {}",
        item.number,
        md_escape(&item.title),
        item.state.as_str().replace('_', " ")
    );
    if let Some(state) = txn.loop_state(&item.id)? {
        let doing = match &state.status {
            Status::Asking { call_id } => {
                let question = txn.question_asked(&item.id, call_id)?.unwrap_or_default();
                format!("waiting for your answer to: {}", md_escape(&question))
            }
            Status::Stuck { reason } => format!("stopped: {}", md_escape(reason)),
            Status::Stopped => "stopped by the operator".into(),
            Status::Thinking { .. } => format!("the {} is thinking", state.role),
            Status::Acting { .. } => format!("the {} is running a tool", state.role),
            Status::Idle | Status::Done => String::new(),
        };
        if !doing.is_empty() {
            text.push_str(&format!("\n\nAgent: {doing}"));
        }
    }
    if let Some(plan) = txn.current_plan(&item.id)? {
        text.push_str(&format!(
            "\n\nPlan {}: {}{}",
            plan.tag(),
            plan.status,
            match &plan.halted {
                Some(reason) => format!(" (halted: {})", md_escape(reason)),
                None => String::new(),
            }
        ));
    }
    Ok(text)
}

/// Every open item, for `status` at the top of the room: the one being
/// worked on, the queue in the order it will be taken up, then what waits
/// on the operator and what is blocked.
pub(super) fn overview(txn: &Txn<'_, '_>) -> Result<String, StoreError> {
    use crate::work::State;
    let open = txn.open_items()?;
    if open.is_empty() {
        return Ok("No work item is open.".into());
    }
    let line = |i: &WorkItem| {
        format!(
            "- **#{}** · {} · {}",
            i.number,
            md_escape(&i.title),
            i.state.as_str().replace('_', " ")
        )
    };
    let mut lines = vec![format!("{} open work items:", open.len())];
    lines.extend(txn.queue()?.iter().map(line));
    for state in [State::WaitingOnOperator, State::Blocked] {
        lines.extend(open.iter().filter(|i| i.state == state).map(line));
    }
    Ok(lines.join("\n"))
}
