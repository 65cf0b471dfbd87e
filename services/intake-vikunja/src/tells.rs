//! What the agent tells the operator, posted on the item's ticket:
//! `out.tell` (consumer `vikunja-tell`) → a comment or the task closed,
//! answered on `in.vikunja.result`.
//!
//! **Why here.** The brain says everything it tells the operator once, as
//! a [`Tell`], and each channel the conversation is on renders it (seed
//! L1: one conversation across channels). A ticket is one of those
//! channels: the Tell names it among the item's `records`
//! (`{channel: "vikunja", id: "<task id>"}`), and this consumer posts it
//! there. The brain makes no Vikunja call of its own for it.
//!
//! **Which Tells.** One whose `records` has a `vikunja` entry and whose
//! `only` is empty or names `vikunja` (`only` set without it: a catch-up
//! meant for another channel). Every other one is acknowledged and
//! nothing is done. The entry's id is the task's id, written in decimal
//! digits: anything else (a name, a negative or zero id), or two
//! different tasks for one Tell, is dead-lettered naming it, never
//! guessed at.
//!
//! **What is done.** A `RESULT` (the item's outcome, as it closes) marks
//! the task done with the Markdown as the note, the note commented first;
//! every other kind is commented. Each is the same `set_done` or
//! `comment` call the brain could ask for on `out.vikunja.req`, under the
//! request id `tell:<the Tell's message id>`, and goes through
//! [`Calls::serve`]: at most once per request id (its record in the
//! bucket, the hidden marker, reconciled after a lost answer or a crash),
//! only on a task of a served project, retried within `call-timeout`,
//! Markdown rendered to Vikunja's HTML. A Tell's message id derives from
//! what it announces, so a redelivered or rebuilt Tell is the same
//! request and is posted once. The answer goes on `in.vikunja.result`
//! with the Tell's work item, so the brain records a failure as a fact on
//! the item (it claims the `tell:` request ids).
//!
//! Tells come one at a time, in stream order, on a consumer apart from
//! the calls': a ticket's comments keep the order they were told in, and
//! the outcome is posted after everything told before it.

use std::sync::Arc;

use nisse_bus::{AgentName, Delivery, Handler, Unhandled};
use nisse_proto::v1::vikunja_request::Call;
use nisse_proto::v1::{Tell, TellKind, VikunjaCommentCall, VikunjaRequest, VikunjaSetDone};

use crate::calls::Calls;

/// This channel's name, in a Tell's `records` and `only`.
pub(crate) const CHANNEL: &str = "vikunja";

/// The prefix of the request ids Tells are posted under.
pub(crate) const REQUEST_PREFIX: &str = "tell:";

/// The handler of one agent's Tells: each made into a call and served as
/// the agent's own calls are.
pub(crate) struct Tells {
    pub calls: Arc<Calls>,
}

impl Handler<Tell> for Tells {
    async fn handle(&self, _agent: &AgentName, delivery: &Delivery<Tell>) -> Result<(), Unhandled> {
        let tell = delivery.message();
        match request(tell)? {
            Some(request) => self.calls.serve(&request).await,
            None => {
                tracing::debug!("not for a ticket: nothing to post");
                Ok(())
            }
        }
    }
}

/// The call that posts `tell` on its ticket, or `None` when it is not for
/// this channel; an error when it names its ticket so that no task can be
/// told from it.
fn request(tell: &Tell) -> Result<Option<VikunjaRequest>, Unhandled> {
    if !tell.only.is_empty() && !tell.only.iter().any(|c| c == CHANNEL) {
        return Ok(None);
    }
    let mut ids: Vec<&str> = tell
        .records
        .iter()
        .filter(|r| r.channel == CHANNEL)
        .map(|r| r.id.as_str())
        .collect();
    ids.sort_unstable();
    ids.dedup();
    let id = match ids.as_slice() {
        [] => return Ok(None),
        [id] => *id,
        several => {
            return Err(Unhandled::dead_letter(format!(
                "the Tell names {} Vikunja tasks ({}): an item has one ticket, and which to post on is not guessed",
                several.len(),
                several.join(", ")
            )));
        }
    };
    let task_id = task_id(id).ok_or_else(|| {
        Unhandled::dead_letter(format!(
            "the Tell's vikunja record {id:?} is not a task's id (a positive number): which task to post on is not guessed"
        ))
    })?;
    let envelope = tell.envelope.clone().unwrap_or_default();
    if envelope.message_id.is_empty() {
        return Err(Unhandled::dead_letter(
            "the Tell has no message id: nothing to post it once by, or to answer",
        ));
    }
    let markdown = tell.markdown.clone();
    let call = match TellKind::try_from(tell.kind).unwrap_or_default() {
        TellKind::Result => Call::SetDone(VikunjaSetDone {
            task_id,
            done: true,
            note: markdown,
        }),
        _ => Call::Comment(VikunjaCommentCall {
            task_id,
            comment: markdown,
        }),
    };
    Ok(Some(VikunjaRequest {
        request_id: format!("{REQUEST_PREFIX}{}", envelope.message_id),
        envelope: Some(envelope),
        call: Some(call),
    }))
}

/// A task's id as a record writes it: decimal digits, positive.
fn task_id(id: &str) -> Option<i64> {
    if id.is_empty() || !id.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    id.parse::<i64>().ok().filter(|n| *n > 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use nisse_bus::Disposition;
    use nisse_proto::v1::{ChannelRef, Envelope};

    fn tell(kind: TellKind, records: &[(&str, &str)], only: &[&str]) -> Tell {
        Tell {
            envelope: Some(Envelope {
                agent: "ops".into(),
                work_item_id: "item-1".into(),
                message_id: "say:item-1:7".into(),
                ..Envelope::default()
            }),
            kind: kind as i32,
            markdown: "Picked up: **backups**.".into(),
            records: records
                .iter()
                .map(|(channel, id)| ChannelRef {
                    channel: (*channel).into(),
                    id: (*id).into(),
                })
                .collect(),
            only: only.iter().map(|c| (*c).to_string()).collect(),
            ..Tell::default()
        }
    }

    #[test]
    fn a_ticketed_items_tell_is_a_comment_under_its_message_id() {
        let comment = request(&tell(TellKind::Fact, &[("vikunja", "42")], &[]))
            .unwrap()
            .unwrap();
        assert_eq!(comment.request_id, "tell:say:item-1:7");
        assert_eq!(
            comment.envelope.as_ref().unwrap().work_item_id,
            "item-1",
            "answered on the Tell's item"
        );
        assert_eq!(
            comment.call,
            Some(Call::Comment(VikunjaCommentCall {
                task_id: 42,
                comment: "Picked up: **backups**.".into(),
            }))
        );
        let only = request(&tell(
            TellKind::Question,
            &[("matrix", "$e"), ("vikunja", "42")],
            &["matrix", "vikunja"],
        ))
        .unwrap();
        assert!(only.is_some(), "`only` naming this channel");
    }

    #[test]
    fn a_result_closes_the_task_with_the_outcome_as_its_note() {
        let closing = request(&tell(TellKind::Result, &[("vikunja", "42")], &[]))
            .unwrap()
            .unwrap();
        assert_eq!(
            closing.call,
            Some(Call::SetDone(VikunjaSetDone {
                task_id: 42,
                done: true,
                note: "Picked up: **backups**.".into(),
            }))
        );
    }

    #[test]
    fn tells_for_other_channels_post_nothing() {
        assert_eq!(
            request(&tell(TellKind::Fact, &[("vikunja", "42")], &["matrix"])).unwrap(),
            None
        );
        assert_eq!(
            request(&tell(TellKind::Fact, &[("matrix", "$e")], &[])).unwrap(),
            None
        );
        assert_eq!(request(&tell(TellKind::Fact, &[], &[])).unwrap(), None);
    }

    #[test]
    fn a_record_that_is_not_one_task_is_dead_lettered_naming_it() {
        for bad in ["abc", "0", "-3", "+3", " 3", ""] {
            let e = request(&tell(TellKind::Fact, &[("vikunja", bad)], &[])).unwrap_err();
            assert_eq!(e.disposition(), Disposition::DeadLetter, "{bad:?}");
            assert!(e.to_string().contains(&format!("{bad:?}")), "{e}");
        }
        let e = request(&tell(
            TellKind::Fact,
            &[("vikunja", "3"), ("vikunja", "4")],
            &[],
        ))
        .unwrap_err();
        assert_eq!(e.disposition(), Disposition::DeadLetter);
        assert!(e.to_string().contains("3, 4"), "{e}");
        assert!(
            request(&tell(
                TellKind::Fact,
                &[("vikunja", "3"), ("vikunja", "3")],
                &[]
            ))
            .unwrap()
            .is_some(),
            "the same task named twice is one ticket"
        );
    }
}
