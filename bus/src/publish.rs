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

impl Bus {
    /// Publishes a contract message and waits for JetStream to store it.
    ///
    /// The envelope must name the agent (which picks the stream and subject)
    /// and carry the message id, derived by the caller from what the message
    /// is; it becomes the `Nats-Msg-Id` so a retry is dropped as a duplicate.
    /// The creation time and the current trace context are filled in when
    /// unset.
    pub async fn publish<M: Contract>(&self, mut msg: M) -> Result<Published> {
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
        let subject = agent.subject(M::KIND);

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
        let fail = |e: &dyn std::fmt::Display| Error::Publish {
            subject: subject.clone(),
            reason: e.to_string(),
        };
        let ack = self
            .jetstream()
            .send_publish(subject.clone(), publish)
            .await
            .map_err(|e| fail(&e))?
            .await
            .map_err(|e| fail(&e))?;
        if ack.duplicate {
            tracing::debug!(%subject, %message_id, sequence = ack.sequence, "duplicate publish dropped by JetStream");
        }
        Ok(Published {
            stream: ack.stream,
            sequence: ack.sequence,
            duplicate: ack.duplicate,
        })
    }
}
