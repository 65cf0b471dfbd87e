use async_nats::jetstream::message::PublishMessage;
use serde::Serialize;

use crate::trace::{HEADER_TYPE, current_trace_context};
use crate::{AgentName, Bus, Contract, Error, Result};

/// What JetStream said about a stored publish.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Published {
    /// The stream that stored it.
    pub stream: String,
    /// Its sequence in that stream (for a duplicate: the original's).
    pub sequence: u64,
    /// The server had already stored a message with this id within the
    /// duplicate window and dropped this one. Not an error: it is how retried
    /// publishes and re-processed outputs stay single.
    pub duplicate: bool,
}

/// A publish the server has been sent but not yet acknowledged. Sending
/// several and then awaiting their acks keeps their order in the stream
/// while paying one round trip for all of them.
#[must_use = "a publish is stored only when its ack arrives"]
pub struct PendingPublish {
    subject: String,
    message_id: String,
    ack: async_nats::jetstream::context::PublishAckFuture,
}

impl std::fmt::Debug for PendingPublish {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingPublish")
            .field("subject", &self.subject)
            .field("message_id", &self.message_id)
            .finish_non_exhaustive()
    }
}

impl PendingPublish {
    /// Waits for JetStream to store it.
    pub async fn acked(self) -> Result<Published> {
        let ack = self.ack.await.map_err(|e| Error::Publish {
            subject: self.subject.clone(),
            reason: e.to_string(),
        })?;
        if ack.duplicate {
            tracing::debug!(subject = %self.subject, message_id = %self.message_id, sequence = ack.sequence, "duplicate publish dropped by JetStream");
        }
        Ok(Published {
            stream: ack.stream,
            sequence: ack.sequence,
            duplicate: ack.duplicate,
        })
    }
}

impl Bus {
    /// Publishes a contract message and waits for JetStream to store it.
    ///
    /// The envelope must name the agent (which picks the stream and subject)
    /// and carry the message id, derived by the caller from what the message
    /// is; it becomes the `Nats-Msg-Id` so a retry is dropped as a duplicate.
    /// The creation time and the current trace context are filled in when
    /// unset.
    pub async fn publish<M: Contract>(&self, msg: M) -> Result<Published> {
        self.send(msg).await?.acked().await
    }

    /// Like [`Bus::publish`], but returns once the message is handed to the
    /// connection; the ack is awaited with [`PendingPublish::acked`].
    /// Messages sent one after another are stored in that order.
    pub async fn send<M: Contract>(&self, mut msg: M) -> Result<PendingPublish> {
        let env = msg
            .envelope_mut()
            .as_mut()
            .ok_or_else(|| Error::InvalidMessage(format!("{} has no envelope", M::NAME)))?;
        let agent: AgentName = env
            .agent
            .parse()
            .map_err(|e: Error| Error::InvalidMessage(format!("envelope.agent: {e}")))?;
        if !self.agents().contains(&agent) {
            return Err(Error::InvalidMessage(format!(
                "envelope.agent `{agent}` is not an agent this bus serves"
            )));
        }
        if env.message_id.is_empty() {
            return Err(Error::InvalidMessage(format!(
                "{} has no envelope.message_id (the dedup id)",
                M::NAME
            )));
        }
        if env.created_at.is_none() {
            env.created_at = Some(std::time::SystemTime::now().into());
        }
        if env.trace.is_none() {
            let tc = current_trace_context();
            if !tc.traceparent.is_empty() {
                env.trace = Some(tc);
            }
        }
        let message_id = env.message_id.clone();
        let trace = env.trace.clone();
        let subject = crate::contract::subject_of(&agent, &msg)?;

        let mut publish = PublishMessage::build()
            .payload(msg.encode_to_vec().into())
            .message_id(&message_id)
            .header(HEADER_TYPE, M::full_name().as_str());
        if let Some(tc) = trace {
            publish = publish.header("traceparent", tc.traceparent.as_str());
            if !tc.tracestate.is_empty() {
                publish = publish.header("tracestate", tc.tracestate.as_str());
            }
        }
        let ack = self
            .jetstream()
            .send_publish(subject.clone(), publish)
            .await
            .map_err(|e| Error::Publish {
                subject: subject.clone(),
                reason: e.to_string(),
            })?;
        Ok(PendingPublish {
            subject,
            message_id,
            ack,
        })
    }
}
