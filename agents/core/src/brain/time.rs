//! Time on the stream, for every agent: what a tick means (requests past
//! their deadline, approval requests that expired), and what the brain's
//! own start means (pending questions asked again). The switch to the next
//! ready item after the grace period needs nothing here: it is checked
//! after every message, and a tick is one.

use rusqlite::params;

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
    for overdue in txn.expire_overdue()? {
        if duty_of(&overdue.work_item_id).is_some() {
            duties.request_expired(settings, txn, &overdue)?;
        } else {
            item_request_expired(settings, txn, &overdue)?;
        }
    }
    announce_expired_approvals(settings, txn)
}

/// An item's request went unanswered: the item waits on the operator, with
/// the reason in its log and thread, until they say `retry` (or anything
/// else that moves it).
fn item_request_expired(
    settings: &BrainSettings,
    txn: &mut Txn<'_, '_>,
    overdue: &Overdue,
) -> Result<(), StoreError> {
    let Some(item) = txn.item(&overdue.work_item_id)? else {
        return Ok(());
    };
    let me = Actor::agent(&settings.agent);
    let reason = overdue.describe();
    let event = txn.append(
        &item.id,
        &me,
        &Event::Fact {
            text: format!(
                "{reason}: request {} is no longer waited for; `retry` goes on",
                overdue.request_id
            ),
            data: serde_json::json!({
                "deadline_passed": overdue.request_id,
                "kind": overdue.kind.suffix(),
                "waited_ms": u64::try_from(overdue.waited.as_millis()).unwrap_or(u64::MAX),
            }),
        },
    )?;
    if !item.state.is_open() {
        return Ok(());
    }
    txn.say(
        &settings.agent,
        &item,
        event,
        Say::notice(format!(
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
                Say::notice(format!(
                    "⌛ Item **#{}**: the approval request for rev-{revision} expired unanswered; it can no longer be approved, and nothing of it runs. A new revision needs proposing.",
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
        let question = txn
            .events(&item.id)?
            .into_iter()
            .rev()
            .find_map(|e| match e.event {
                Event::QuestionAsked {
                    call_id: c,
                    question,
                } if c == *call_id => Some(question),
                _ => None,
            });
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
            Say::notice(format!(
                "❓ (asked again: I restarted, and this is still open) {question}"
            )),
        )?;
    }
    Ok(())
}
