//! What the agent says to the operator: messages for an item's Matrix
//! thread, rendered by code and queued with ids derived from the log event
//! they announce.

use nisse_bus::proto::{MatrixOutbound, MatrixOutboundKind};

use crate::store::{StoreError, Txn};
use crate::work::WorkItem;

/// An operator message, rendered by code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Say {
    /// Markdown.
    pub markdown: String,
    /// Its kind.
    pub kind: MatrixOutboundKind,
    /// For approval requests, the revision shown.
    pub plan_revision: u32,
    /// It opens the item's thread.
    pub opens_thread: bool,
    /// The event the thread it opens hangs from, when that is not the
    /// message itself: the operator's own message that started the item.
    pub thread_root: String,
}

impl Say {
    /// A notice in the item's thread.
    pub fn notice(markdown: String) -> Self {
        Self {
            markdown,
            kind: MatrixOutboundKind::Notice,
            plan_revision: 0,
            opens_thread: false,
            thread_root: String::new(),
        }
    }

    /// The message that opens the item's thread.
    pub fn thread_root(markdown: String) -> Self {
        Self {
            opens_thread: true,
            ..Self::notice(markdown)
        }
    }

    /// The agent's first reply to `event_id`, the operator's message that
    /// started the item: the item's thread hangs from that message, so
    /// the operator's words and the agent's answer are one conversation.
    pub fn thread_on(event_id: &str, markdown: String) -> Self {
        Self {
            thread_root: event_id.to_string(),
            ..Self::thread_root(markdown)
        }
    }

    /// An approval request showing `revision`.
    pub fn approval(markdown: String, revision: u32) -> Self {
        Self {
            markdown,
            kind: MatrixOutboundKind::ApprovalRequest,
            plan_revision: revision,
            opens_thread: false,
            thread_root: String::new(),
        }
    }
}

impl Txn<'_, '_> {
    /// Queues an operator message about `item` for its Matrix thread,
    /// announcing its log event `event` (whose id makes the message's id,
    /// so applying the same message again emits the same one).
    pub fn say(
        &mut self,
        agent: &str,
        item: &WorkItem,
        event: i64,
        say: Say,
    ) -> Result<(), StoreError> {
        let message = MatrixOutbound {
            envelope: Some(self.agent_envelope(
                agent,
                &item.id,
                format!("out:{}:{event}", item.id),
            )),
            room_id: String::new(),
            markdown: say.markdown,
            thread_root_event_id: say.thread_root,
            opens_thread: say.opens_thread,
            kind: say.kind as i32,
            plan_revision: say.plan_revision,
        };
        self.emit(&message)
    }
}
