//! An operator command from the CLI: authenticated by the bus (its subject
//! names the operator whose credentials alone may publish there), checked
//! here against the allowlist. A command from anyone else is recorded on
//! the item as data and changes nothing; one whose envelope claims another
//! sender than its subject is recorded and refused. One from the MCP
//! surface (`nisse mcp serve`, on a subject no operator may have) is
//! applied only when it proposes a plan.

use nisse_bus::proto::{self, OperatorCommand, operator_command::Command};
use nisse_policy::{Action, Check, RiskClass, Step};

use super::BrainSettings;
use crate::log::{Actor, ActorKind, Event, LoggedEvent};
use crate::markdown::md_escape;
use crate::plans::{Decision, Origin};
use crate::say::Say;
use crate::store::{StoreError, Txn};
use crate::work::WorkItem;

/// Answers `cmd` on the bus (`out.operator.<its id>`, where its sender
/// waits): the lines of what applying it did, or why it could not be
/// applied. A command whose id cannot end a subject gets no answer rather
/// than an output that could never be published.
pub(super) fn answer(
    settings: &BrainSettings,
    txn: &mut Txn<'_, '_>,
    cmd: &OperatorCommand,
    outcome: Result<&[String], &str>,
) -> Result<(), StoreError> {
    let command_id = cmd
        .envelope
        .as_ref()
        .map(|e| e.message_id.clone())
        .unwrap_or_default();
    if !nisse_bus::topology::is_token(&command_id) {
        return Ok(());
    }
    let lines = match outcome {
        Ok(said) => {
            let mut lines: Vec<String> = txn
                .events_caused()?
                .iter()
                .map(LoggedEvent::describe)
                .collect();
            lines.extend(said.iter().cloned());
            lines
        }
        Err(_) => Vec::new(),
    };
    let reply = proto::OperatorReply {
        envelope: Some(txn.agent_envelope(&settings.agent, "", format!("reply:{command_id}"))),
        command_id,
        applied: outcome.is_ok(),
        lines,
        error: outcome.err().unwrap_or_default().to_string(),
    };
    txn.emit(&reply)
}

/// What the shared brain still has to do for a command [`apply`] checked:
/// the parts that need the agent's duties or the brain's routing.
pub(super) enum FollowUp {
    /// Nothing: the command is applied.
    Done,
    /// `retry` on this item, from this operator.
    Retry(Box<WorkItem>, Actor),
    /// `park` this item.
    Park(Box<WorkItem>, Actor),
    /// Take this item next.
    DoNext(Box<WorkItem>, Actor),
    /// Run this duty now, for this operator.
    RunDuty(String, Actor),
    /// Open an item for this operator.
    OpenItem {
        open: proto::OpenItem,
        by: Actor,
        /// The channel it came by (`cli`).
        via: String,
        /// The command's message id: the item's id seed.
        seed: String,
    },
}

/// Applies `cmd`. A command about no item the agent has is not an error
/// of the brain's: `Err` with what to tell its sender, nothing changed.
pub(super) fn apply(
    settings: &BrainSettings,
    txn: &mut Txn<'_, '_>,
    cmd: &OperatorCommand,
) -> Result<Result<FollowUp, String>, StoreError> {
    let env = cmd.envelope.clone().unwrap_or_default();
    let claimed = Actor::from_envelope(&env);
    // Who sent it is what the server enforced: only an operator's own
    // credentials may publish on `in.operator.<operator>`. A command on
    // the subject it had before operators had subjects of their own is
    // history, read as it was then (no identity but the admin's may
    // publish there now).
    let sender = nisse_bus::SubjectKind::InOperator.token_of(txn.subject());
    let actor = match sender {
        Some(op) => Actor {
            kind: ActorKind::Operator,
            id: op.to_string(),
        },
        None => claimed.clone(),
    };
    let item = txn.find_item(&cmd.work_item)?;
    if sender.is_some() && claimed != actor {
        let reason = format!(
            "refused: the command was sent with the credentials of {} but claims to be from {claimed}",
            actor.id
        );
        if let Some(item) = &item {
            txn.append(
                &item.id,
                &actor,
                &Event::Fact {
                    text: format!("a command via {} {reason}", cmd.channel),
                    data: serde_json::json!({
                        "ignored": true,
                        "channel": cmd.channel,
                        "claimed": claimed.to_string(),
                    }),
                },
            )?;
        }
        return Ok(Err(reason));
    }
    // `nisse mcp serve` commands under a name no operator may have: what
    // it sends is a plan proposal, which only an operator can approve, or
    // nothing. Whatever a client of it asks, and whatever the allowlist
    // says, its word never approves, denies, stops, abandons, retries,
    // parks, reorders, opens or runs anything.
    let from_mcp = sender == Some(nisse_bus::auth::MCP_SURFACE);
    if from_mcp && !matches!(cmd.command, Some(Command::ProposePlan(_))) {
        let reason = "refused: the MCP surface (`nisse mcp serve`) may only propose plans; approving, denying and every other command are an operator's own, from the CLI or chat".to_string();
        if let Some(item) = &item {
            txn.append(
                &item.id,
                &actor,
                &Event::Fact {
                    text: format!("a command via {} was {reason}", cmd.channel),
                    data: serde_json::json!({ "ignored": true, "channel": cmd.channel }),
                },
            )?;
        }
        return Ok(Err(reason));
    }
    let allowed = from_mcp
        || (actor.kind == ActorKind::Operator && settings.is_operator(&cmd.channel, &actor.id));
    // A duty is no work item: the command names the duty.
    if let Some(Command::RunDuty(run)) = &cmd.command {
        if !allowed {
            return Ok(Err(format!(
                "{actor} via {} is not on the operator allowlist",
                cmd.channel
            )));
        }
        return Ok(Ok(FollowUp::RunDuty(run.duty.clone(), actor)));
    }
    if let Some(Command::OpenItem(open)) = &cmd.command {
        if !allowed {
            return Ok(Err(format!(
                "{actor} via {} is not on the operator allowlist",
                cmd.channel
            )));
        }
        let title = open.title.trim();
        if title.is_empty() || title.contains(['\n', '\r']) {
            return Ok(Err(
                "a work item's title must be one line, not empty".to_string()
            ));
        }
        if let Some(bad) = open
            .hosts
            .iter()
            .find(|h| !nisse_bus::topology::is_token(h))
        {
            return Ok(Err(format!("`{bad}` is not a host name")));
        }
        return Ok(Ok(FollowUp::OpenItem {
            open: open.clone(),
            by: actor,
            via: cmd.channel.clone(),
            seed: env.message_id.clone(),
        }));
    }
    let Some(item) = item else {
        return Ok(Err(format!(
            "agent {} has no work item `{}`",
            settings.agent, cmd.work_item
        )));
    };
    let plans = settings.plans();
    let origin = Origin {
        actor: &actor,
        via: &cmd.channel,
        allowed,
    };
    let revision = |r: u32| (r > 0).then_some(r);
    match &cmd.command {
        Some(Command::Approve(a)) => {
            txn.plan_decision(
                plans,
                &item,
                origin,
                Decision::Approve(
                    revision(a.revision),
                    (!a.confirm.trim().is_empty()).then(|| a.confirm.clone()),
                ),
            )?;
        }
        Some(Command::Deny(d)) => {
            txn.plan_decision(
                plans,
                &item,
                origin,
                Decision::Deny(revision(d.revision), d.reason.clone()),
            )?;
        }
        Some(_) if !allowed => {
            txn.append(
                &item.id,
                &actor,
                &Event::Fact {
                    text: format!(
                        "a command from {actor} via {} was ignored: not on the operator allowlist",
                        cmd.channel
                    ),
                    data: serde_json::json!({ "ignored": true, "channel": cmd.channel }),
                },
            )?;
        }
        Some(Command::Stop(_)) => {
            txn.plan_stop(plans, &item, &actor, &cmd.channel)?;
            txn.loop_stop(settings.agent_loop(), &item)?;
        }
        Some(Command::Abandon(a)) => {
            txn.plan_abandon(plans, &item, &actor, &cmd.channel, &a.note)?;
        }
        Some(Command::Retry(_)) => return Ok(Ok(FollowUp::Retry(Box::new(item), actor))),
        Some(Command::Park(_)) => return Ok(Ok(FollowUp::Park(Box::new(item), actor))),
        Some(Command::DoNext(_)) => return Ok(Ok(FollowUp::DoNext(Box::new(item), actor))),
        Some(Command::RunDuty(_) | Command::OpenItem(_)) => unreachable_itemless()?,
        Some(Command::ProposePlan(p)) => {
            let plan = p.plan.clone().unwrap_or_default();
            match steps_from_wire(&plan) {
                Ok(steps) => {
                    txn.propose_plan(plans, &item, &actor, &plan.rationale, steps)?;
                }
                Err(reason) => {
                    let event = txn.append(
                        &item.id,
                        &actor,
                        &Event::PlanRejected {
                            revision: None,
                            reason: reason.clone(),
                        },
                    )?;
                    txn.say(
                        &settings.agent,
                        &item,
                        event,
                        Say::fact(format!("⛔ Plan not recorded: {}", md_escape(&reason))),
                    )?;
                }
            }
        }
        None => {
            return Err(StoreError::Corrupt(
                "an operator command without a command".into(),
            ));
        }
    }
    Ok(Ok(FollowUp::Done))
}

/// `RunDuty` is answered before the item is looked up.
/// A command about no item (run a duty, open an item) is followed up
/// before the item is looked for: reaching the item commands is a bug.
fn unreachable_itemless() -> Result<(), StoreError> {
    Err(StoreError::Corrupt(
        "a command about no item reached the item commands".into(),
    ))
}

/// The plan's steps, each checked: a step that is not well formed names
/// itself and what is wrong.
fn steps_from_wire(plan: &proto::Plan) -> Result<Vec<(Step, Option<RiskClass>)>, String> {
    let check = |c: &Option<proto::StepCheck>| {
        c.as_ref()
            .filter(|c| !c.command.trim().is_empty() || !c.tool.trim().is_empty())
            .map(|c| Check {
                command: c.command.trim().to_string(),
                exit_code: c.exit_code,
                output_contains: (!c.output_contains.is_empty()).then(|| c.output_contains.clone()),
                tool: (!c.tool.trim().is_empty()).then(|| c.tool.trim().to_string()),
                arguments: (!c.arguments_json.trim().is_empty())
                    .then(|| c.arguments_json.trim().to_string()),
            })
    };
    plan.steps
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let action = Action::from_json(&s.tool, &s.target, &s.arguments_json)
                .map_err(|e| format!("step {}: {}", i + 1, e.0))?;
            Ok((
                Step {
                    action,
                    precondition: check(&s.precondition),
                    expected: check(&s.expected),
                    retries: s.retries.unwrap_or(nisse_policy::plan::DEFAULT_RETRIES),
                },
                nisse_policy::wire::risk_from_wire(s.declared_risk),
            ))
        })
        .collect()
}
