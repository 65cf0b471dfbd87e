//! Time on the stream, for every agent: what a tick means (requests past
//! their deadline, approval requests that expired), and what the brain's
//! own start means (pending questions asked again). The switch to the next
//! ready item after the grace period needs nothing here: it is checked
//! after every message, and a tick is one.

use rusqlite::params;

use nisse_bus::SubjectKind;

use super::{BrainSettings, Duties};
use crate::agent_loop::Status;
use crate::log::{Actor, Event};
use crate::requests::{Overdue, duty_of};
use crate::say::Say;
use crate::store::{Cached as _, StoreError, Txn, ns_to_time, time_to_ns};

/// A tick: every request whose deadline passed stops being waited for
/// (an item's waits on the operator, saying why; a duty's run is told),
/// and every approval request that expired unanswered is announced once.
pub(super) fn tick(
    settings: &BrainSettings,
    duties: &mut impl Duties,
    txn: &mut Txn<'_, '_>,
) -> Result<(), StoreError> {
    // An item's requests that expire at one tick (a plan's commands, all
    // sent to the classifier together) are told in one message.
    let mut by_item: Vec<(String, Vec<Overdue>)> = Vec::new();
    for overdue in txn.expire_overdue()? {
        // Memory never blocks work: an unanswered note is sent again, an
        // unanswered read is a gap the loop goes on without.
        if overdue.kind == SubjectKind::VaultWrite {
            txn.vault_write_expired(&settings.agent, &overdue)?;
        } else if overdue.kind == SubjectKind::VaultQuery {
            txn.loop_vault_expired(settings.agent_loop(), &overdue)?;
        } else if overdue.kind == SubjectKind::VikunjaReq {
            // Nor does a ticket: its update is a fact, the work goes on.
            super::tickets::request_expired(settings, txn, &overdue)?;
        } else if duty_of(&overdue.work_item_id).is_some() {
            duties.request_expired(settings, txn, &overdue)?;
        } else if let Some((_, same)) = by_item
            .iter_mut()
            .find(|(id, _)| *id == overdue.work_item_id)
        {
            same.push(overdue);
        } else {
            by_item.push((overdue.work_item_id.clone(), vec![overdue]));
        }
    }
    for (_, overdue) in &by_item {
        item_requests_expired(settings, txn, overdue)?;
    }
    announce_expired_approvals(settings, txn)
}

/// An item's requests went unanswered: each is logged, and the item waits
/// on the operator, with the reason in its thread, until they say `retry`
/// (or anything else that moves it).
fn item_requests_expired(
    settings: &BrainSettings,
    txn: &mut Txn<'_, '_>,
    overdue: &[Overdue],
) -> Result<(), StoreError> {
    let Some(first) = overdue.first() else {
        return Ok(());
    };
    let Some(item) = txn.item(&first.work_item_id)? else {
        return Ok(());
    };
    let me = Actor::agent(&settings.agent);
    let mut reasons: Vec<String> = Vec::new();
    let mut event = 0;
    for o in overdue {
        let reason = o.describe();
        event = txn.append(
            &item.id,
            &me,
            &Event::Fact {
                text: format!(
                    "{reason}: request {} is no longer waited for; `retry` goes on",
                    o.request_id
                ),
                data: serde_json::json!({
                    "deadline_passed": o.request_id,
                    "kind": o.kind.suffix(),
                    "waited_ms": u64::try_from(o.waited.as_millis()).unwrap_or(u64::MAX),
                }),
            },
        )?;
        if !reasons.contains(&reason) {
            reasons.push(reason);
        }
    }
    if !item.state.is_open() {
        return Ok(());
    }
    let reason = reasons.join("; ");
    txn.say(
        &settings.agent,
        &item,
        event,
        Say::question(format!(
            "⏱️ Item **#{}**: {reason}. Nothing goes on until you say `retry` (or `nisse retry #{}`).",
            item.number, item.number
        )),
    )?;
    txn.await_operator(&item, &reason, &settings.agent)
}

/// Approval requests put up longer ago than the approval expiry and never
/// decided: each is announced once per time it was put up. It can no
/// longer be approved (the binding refuses an expired one).
fn announce_expired_approvals(
    settings: &BrainSettings,
    txn: &mut Txn<'_, '_>,
) -> Result<(), StoreError> {
    let expiry = time::Duration::try_from(settings.approval_expiry).unwrap_or(time::Duration::MAX);
    let before = time_to_ns(txn.at().saturating_sub(expiry));
    let expired: Vec<(String, u32, i64)> = {
        let mut stmt = txn.tx().prepare_cached(
            "SELECT work_item_id, revision, put_up_at_ns FROM plans
             WHERE status = 'up' AND put_up_at_ns IS NOT NULL AND put_up_at_ns <= ?1
               AND (expiry_announced_ns IS NULL OR expiry_announced_ns <> put_up_at_ns)
             ORDER BY put_up_at_ns, work_item_id",
        )?;
        let rows = stmt.query_map([before], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
        rows.collect::<Result<_, _>>()?
    };
    for (work_item_id, revision, put_up) in expired {
        txn.tx().exec_cached(
            "UPDATE plans SET expiry_announced_ns = ?3 WHERE work_item_id = ?1 AND revision = ?2",
            params![work_item_id, revision, put_up],
        )?;
        let Some(item) = txn.item(&work_item_id)? else {
            continue;
        };
        let expired_at = ns_to_time(put_up) + expiry;
        let event = txn.append(
            &item.id,
            &Actor::agent(&settings.agent),
            &Event::Fact {
                text: format!("the approval request for rev-{revision} expired unanswered"),
                data: serde_json::json!({
                    "approval_expired": revision,
                    "expired_at": expired_at
                        .format(&time::format_description::well_known::Rfc3339)
                        .unwrap_or_default(),
                }),
            },
        )?;
        if item.state.is_open() {
            txn.say(
                &settings.agent,
                &item,
                event,
                Say::fact(format!(
                    "⌛ Item **#{}**: the approval request for rev-{revision} expired unanswered; it can no longer be approved as it was put up, and nothing of it runs. Approving rev-{revision} now puts it up again, for a new approval; or propose a new revision.",
                    item.number
                )),
            )?;
        }
    }
    Ok(())
}

/// The brain started: every question the operator was asked and has not
/// answered is asked again (seed L8: waiting points resume as they were),
/// so a restart never loses one.
pub(super) fn started(settings: &BrainSettings, txn: &mut Txn<'_, '_>) -> Result<(), StoreError> {
    for (item_id, state) in txn.open_loops()? {
        let Status::Asking { call_id } = &state.status else {
            continue;
        };
        let Some(item) = txn.item(&item_id)? else {
            continue;
        };
        let question = txn.question_asked(&item.id, call_id)?;
        let Some(question) = question else { continue };
        let event = txn.append(
            &item.id,
            &Actor::agent(&settings.agent),
            &Event::Fact {
                text: "asked the pending question again after a restart".into(),
                data: serde_json::json!({ "asked_again": call_id }),
            },
        )?;
        txn.say(
            &settings.agent,
            &item,
            event,
            Say::question(format!(
                "❓ (asked again: I restarted, and this is still open) {question}"
            )),
        )?;
    }
    Ok(())
}
