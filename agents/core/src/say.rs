//! What the agent tells the operator: said once, channel-neutral (a
//! [`Tell`] with its kind and item), rendered by code and queued with ids
//! derived from what it announces; each channel the conversation is on
//! renders it in its own form (intake-matrix in the item's Matrix thread,
//! intake-vikunja as a comment on the item's ticket).

use nisse_bus::proto::{ChannelRef, Tell, TellKind};

use crate::store::{StoreError, Txn};
use crate::work::WorkItem;

/// The channel whose events an item can start from (`started_from`).
const MATRIX: &str = "matrix";

/// An operator message, rendered by code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Say {
    /// Markdown.
    pub markdown: String,
    /// What it is: a fact, a question, an approval request, the model's
    /// progress, the result.
    pub kind: TellKind,
    /// For approval requests, the revision shown.
    pub plan_revision: u32,
    /// It opens the item's conversation (a thread, on a channel with
    /// threads).
    pub opens_conversation: bool,
    /// The Matrix event the item's thread hangs from, when that is not
    /// the message itself: the operator's own message that started the
    /// item.
    pub started_from: String,
}

impl Say {
    fn of(kind: TellKind, markdown: String) -> Self {
        Self {
            markdown,
            kind,
            plan_revision: 0,
            opens_conversation: false,
            started_from: String::new(),
        }
    }

    /// Something the code knows happened (a step started or finished, a
    /// decision echoed, an alert firing again).
    pub fn fact(markdown: String) -> Self {
        Self::of(TellKind::Fact, markdown)
    }

    /// A question the item now waits on the operator for.
    pub fn question(markdown: String) -> Self {
        Self::of(TellKind::Question, markdown)
    }

    /// The model's own words on how the work goes.
    pub fn progress(markdown: String) -> Self {
        Self::of(TellKind::Progress, markdown)
    }

    /// The item's outcome, as it closes: a channel that holds the item's
    /// record closes it with this.
    pub fn result(markdown: String) -> Self {
        Self::of(TellKind::Result, markdown)
    }

    /// An approval request showing `revision`.
    pub fn approval(markdown: String, revision: u32) -> Self {
        Self {
            plan_revision: revision,
            ..Self::of(TellKind::ApprovalRequest, markdown)
        }
    }

    /// The message that opens the item's conversation.
    pub fn thread_root(markdown: String) -> Self {
        Self {
            opens_conversation: true,
            ..Self::fact(markdown)
        }
    }

    /// The agent's first reply to `event_id`, the operator's Matrix
    /// message that started the item: the item's thread hangs from that
    /// message, so the operator's words and the agent's answer are one
    /// conversation.
    pub fn thread_on(event_id: &str, markdown: String) -> Self {
        Self {
            started_from: event_id.to_string(),
            ..Self::thread_root(markdown)
        }
    }
}

impl Txn<'_, '_> {
    /// Tells the operator about `item`, announcing its log event `event`
    /// (whose id makes the message's id, so applying the same message
    /// again tells the same one): on every channel the item is on, the
    /// item's records (its ticket) named so their channels post it too.
    pub fn say(
        &mut self,
        agent: &str,
        item: &WorkItem,
        event: i64,
        say: Say,
    ) -> Result<(), StoreError> {
        let records = crate::brain::tickets::records(self, &item.id)?;
        self.tell(
            agent,
            item,
            format!("out:{}:{event}", item.id),
            say,
            records,
            Vec::new(),
        )
    }

    /// Queues `say` about `item` under `message_id`, for the channels
    /// `only` names (every channel the item is on when empty).
    pub(crate) fn tell(
        &mut self,
        agent: &str,
        item: &WorkItem,
        message_id: String,
        say: Say,
        records: Vec<ChannelRef>,
        only: Vec<String>,
    ) -> Result<(), StoreError> {
        let started_from = (!say.started_from.is_empty()).then(|| ChannelRef {
            channel: MATRIX.into(),
            id: say.started_from,
        });
        let message = Tell {
            envelope: Some(self.agent_envelope(agent, &item.id, message_id)),
            kind: say.kind as i32,
            markdown: say.markdown,
            plan_revision: say.plan_revision,
            item_number: u32::try_from(item.number).unwrap_or(u32::MAX),
            opens_conversation: say.opens_conversation,
            started_from,
            records,
            only,
        };
        self.emit(&message)
    }

    /// Tells the operator's room at large, about no item (an answer to
    /// their words at the top of the room): `message_id` derives from
    /// what it answers, so a replay tells the same one.
    pub fn tell_room(
        &mut self,
        agent: &str,
        message_id: String,
        markdown: String,
    ) -> Result<(), StoreError> {
        let message = Tell {
            envelope: Some(self.agent_envelope(agent, "", message_id)),
            kind: TellKind::Fact as i32,
            markdown,
            ..Default::default()
        };
        self.emit(&message)
    }
}
