//! An event from the agent's Matrix room. Who may instruct is the
//! allowlist (`matrix:<user id>`); what a message says is read by code
//! ([`crate::conversation::read`]). Everything said about an item goes in
//! its log; only an operator's words addressed to the agent act, and a
//! question is answered, never acted on.

use nisse_bus::proto;

use super::{BrainSettings, Duties, status};
use crate::conversation::{Command as C, Said, read};
use crate::log::{Actor, ActorKind, Event};
use crate::markdown::md_escape;
use crate::memory::{Fact, MemoryKind};
use crate::plans::{Decision, Origin};
use crate::say::Say;
use crate::store::{StoreError, Txn};
use crate::work::{State, Transition};

/// Applies `event` from the agent's room.
pub(super) fn apply(
    settings: &BrainSettings,
    duties: &mut impl Duties,
    txn: &mut Txn<'_, '_>,
    event: &proto::MatrixEventReceived,
) -> Result<(), StoreError> {
    let operator = settings.is_operator("matrix", &event.sender);
    let actor = Actor {
        kind: if operator {
            ActorKind::Operator
        } else {
            ActorKind::External
        },
        id: event.sender.clone(),
    };
    let env = event.envelope.clone().unwrap_or_default();
    let names: Vec<&str> = settings.names.iter().map(String::as_str).collect();
    // The item: the thread (or the message reacted to) it belongs to, else
    // the one being worked on.
    let kind = proto::MatrixEventKind::try_from(event.kind).unwrap_or_default();
    let item = match txn.item(&env.work_item_id)? {
        Some(item) => Some(item),
        // `status` at the top of the room: where every open item stands.
        None if event.thread_root_event_id.is_empty()
            && operator
            && kind == proto::MatrixEventKind::Message
            && read(&event.body, &names) == Said::Command(C::Status) =>
        {
            let overview = status::overview(txn)?;
            txn.tell_room(
                &settings.agent,
                format!("out:matrix:{}", event.event_id),
                overview,
            )?;
            return Ok(());
        }
        None if event.thread_root_event_id.is_empty() => {
            // An operator's talk at the top of the room is new work (seed
            // L1, L5), worked by the model; answers to an item belong in
            // its thread. Without a model nothing would work it, and the
            // words go to the item being worked on, as they always did.
            let talk = operator
                && settings.models.enabled()
                && kind == proto::MatrixEventKind::Message
                && read(&event.body, &names) == Said::Talk;
            if talk {
                Some(room_item(settings, duties, txn, event, &actor)?)
            } else {
                txn.active_item()?
            }
        }
        None => None,
    };
    let Some(item) = item else {
        // Nothing to record it on. An operator's question or `status`
        // still gets an answer, in the room.
        let said = read(&event.body, &names);
        let asks = matches!(
            said,
            Said::Question | Said::Command(C::Status) | Said::Remember
        );
        if operator && event.kind == proto::MatrixEventKind::Message as i32 && asks {
            let text = match txn.next_ready()? {
                _ if said == Said::Remember => remember(settings, txn, "", event)?,
                Some(next) => format!(
                    "No work item is being worked on; next is **#{}**: {}.",
                    next.number,
                    md_escape(&next.title)
                ),
                None => "No work item is open.".to_string(),
            };
            txn.tell_room(
                &settings.agent,
                format!("out:matrix:{}", event.event_id),
                text,
            )?;
        }
        return Ok(());
    };
    let plans = settings.plans();
    let origin = Origin {
        actor: &actor,
        via: "matrix",
        allowed: operator,
    };
    if kind == proto::MatrixEventKind::Reaction {
        let approve = matches!(event.reaction_key.trim_end_matches('\u{fe0f}'), "✅" | "👍");
        let deny = matches!(event.reaction_key.trim_end_matches('\u{fe0f}'), "❌" | "👎");
        if event.reacted_plan_revision > 0 && (approve || deny) {
            let rev = Some(event.reacted_plan_revision);
            // A reaction cannot name destructive steps back: for a
            // revision with one, the binding asks for the words.
            let decision = if approve {
                Decision::Approve(rev, None)
            } else {
                Decision::Deny(rev, "denied with a reaction".into())
            };
            txn.plan_decision(plans, &item, origin, decision)?;
        }
        return Ok(());
    }
    if kind != proto::MatrixEventKind::Message {
        return Ok(());
    }
    let said = read(&event.body, &names);
    let logged = txn.append(
        &item.id,
        &actor,
        &Event::Said {
            via: "matrix".into(),
            text: event.body.clone(),
            operator,
            read_as: said.read_as().into(),
        },
    )?;
    attachments(settings, txn, &item.id, event)?;
    if !operator {
        return Ok(());
    }
    match said {
        Said::ForSomeoneElse(_) => {}
        Said::Remember => {
            let text = remember(settings, txn, &item.id, event)?;
            txn.say(&settings.agent, &item, logged, Say::fact(text))?;
        }
        Said::Command(C::Approve(rev, confirm)) => {
            txn.plan_decision(plans, &item, origin, Decision::Approve(rev, confirm))?;
        }
        Said::Command(C::Deny(rev, reason)) => {
            txn.plan_decision(plans, &item, origin, Decision::Deny(rev, reason))?;
        }
        Said::Command(C::Stop) => {
            txn.plan_stop(plans, &item, &actor, "matrix")?;
            txn.loop_stop(settings.agent_loop(), &item)?;
        }
        Said::Command(C::Abandon(note)) => {
            txn.plan_abandon(plans, &item, &actor, "matrix", &note)?;
        }
        Said::Command(C::Retry) => {
            let text = match super::retry(settings, duties, txn, &item, &actor)? {
                Ok(done) => format!("🔁 {}", md_escape(&done.join("; "))),
                Err(why) => md_escape(&why),
            };
            txn.say(&settings.agent, &item, logged, Say::fact(text))?;
        }
        Said::Command(C::DoNext(n)) => {
            let text = match txn.find_item(&format!("#{n}"))? {
                Some(target) => super::do_next(txn, &target, &actor)?,
                None => format!("There is no open item **#{n}**."),
            };
            txn.say(&settings.agent, &item, logged, Say::fact(text))?;
        }
        Said::Command(C::Park) => {
            let text = super::park(txn, &item, &actor)?;
            txn.say(&settings.agent, &item, logged, Say::fact(text))?;
        }
        Said::Command(C::Use(project)) => {
            let text = duties.use_project(settings, txn, &item, &project)?;
            txn.say(&settings.agent, &item, logged, Say::fact(text))?;
        }
        // A question on an item the model works is answered by the model
        // from the item's context; `status`, and any question without a
        // loop, by code. Neither changes anything.
        Said::Question if txn.loop_answer(settings.agent_loop(), &item, logged)? => {}
        Said::Command(C::Status) | Said::Question => {
            let status = status::render(txn, &item)?;
            txn.say(&settings.agent, &item, logged, Say::fact(status))?;
        }
        Said::Talk => {
            // An answer: an item waiting on the operator is ready again.
            if item.state == State::WaitingOnOperator {
                txn.transition(
                    &item.id,
                    Transition::OperatorAnswered,
                    "the operator answered in Matrix",
                    &actor,
                )?;
            }
            txn.loop_operator_said(&item, &event.body)?;
        }
    }
    Ok(())
}

/// The item an operator's talk at the top of the room opened: one per
/// message (a redelivery finds it), its thread hanging from the message.
fn room_item(
    settings: &BrainSettings,
    duties: &mut impl Duties,
    txn: &mut Txn<'_, '_>,
    event: &proto::MatrixEventReceived,
    by: &Actor,
) -> Result<crate::work::WorkItem, StoreError> {
    let fingerprint = format!("matrix:{}", event.event_id);
    if let Some(item) = txn.open_item_by_fingerprint(&fingerprint)? {
        return Ok(item);
    }
    let title = super::title_of(&event.body);
    super::open_for_operator(
        settings,
        duties,
        txn,
        super::Opening {
            title: if title.is_empty() {
                "a conversation".into()
            } else {
                title
            },
            source: format!("matrix:{}", event.sender),
            fingerprint: Some(fingerprint),
            id_seed: format!("matrix:{}", event.event_id),
            by,
            thread_on: Some(event.event_id.clone()),
            note: None,
            hosts: &[],
        },
    )
}

/// An operator's words to keep (L6: corrections are stored verbatim, with
/// attribution, never paraphrased): the whole message, byte for byte, as
/// one note of the agent's memory. What to answer.
fn remember(
    settings: &BrainSettings,
    txn: &mut Txn<'_, '_>,
    work_item_id: &str,
    event: &proto::MatrixEventReceived,
) -> Result<String, StoreError> {
    if !settings.memory {
        return Ok("This agent keeps no memory (no knowledge vault): nothing was stored.".into());
    }
    let fact = Fact {
        kind: MemoryKind::Correction,
        text: event.body.clone(),
        source: format!("the operator {} in matrix", event.sender),
        operator: true,
        said_by: Some(event.sender.clone()),
    };
    let path = txn.remember(
        &settings.agent,
        work_item_id,
        &format!("matrix:{}", event.event_id),
        &fact,
    )?;
    if let Some(item) = txn.item(work_item_id)? {
        txn.append(
            &item.id,
            &Actor::agent(&settings.agent),
            &Event::Fact {
                text: format!("the operator's words are kept verbatim in {path}"),
                data: serde_json::json!({ "remembered": path }),
            },
        )?;
    }
    Ok(format!(
        "📝 Kept word for word in my memory: {}.",
        crate::markdown::code_span(&path).unwrap_or_else(|| md_escape(&path))
    ))
}

/// Each file, image, video or sound the message carried, as a fact on the
/// item, whoever sent it: by reference (where it is, what it claims to
/// be, what its content hashes to, as the Matrix service found it), data
/// only; the brain fetches nothing.
fn attachments(
    settings: &BrainSettings,
    txn: &mut Txn<'_, '_>,
    item: &str,
    event: &proto::MatrixEventReceived,
) -> Result<(), StoreError> {
    for a in &event.attachments {
        let hash = if a.sha256.is_empty() {
            format!("no hash: {:?}", a.error)
        } else {
            format!("sha256 {}", a.sha256)
        };
        txn.append(
            item,
            &Actor::agent(&settings.agent),
            &Event::Fact {
                // The name, type, error and URL are the sender's words:
                // quoted, as data in an orchestrator fact is.
                text: format!(
                    "attachment from {}: {:?} ({:?}, {} bytes, {hash}) at {:?}",
                    event.sender, a.name, a.mimetype, a.size, a.url
                ),
                data: serde_json::json!({
                    "attachment": {
                        "from": event.sender,
                        "event_id": event.event_id,
                        "kind": a.kind,
                        "url": a.url,
                        "name": a.name,
                        "mimetype": a.mimetype,
                        "size": a.size,
                        "sha256": a.sha256,
                        "error": a.error,
                    }
                }),
            },
        )?;
    }
    Ok(())
}
