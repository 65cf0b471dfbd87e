//! Reading an agent's stream back: the building block of `nisse replay`, of
//! replay tests that rebuild a brain from its stream, and of recording a
//! range on one server and republishing it on another to reproduce an
//! incident.

use async_nats::jetstream::{self, consumer};
use bytes::Bytes;
use futures::StreamExt as _;
use serde::Serialize;

use crate::{AgentName, AnyMessage, Bus, Decode, Error, Published, Rejection, Result, SubjectKind};

/// Which stored message to read.
#[derive(Clone, Copy)]
enum Lookup<'a> {
    /// The one at this sequence.
    Sequence(u64),
    /// The last one on this subject.
    LastOn(&'a str),
}

/// Which sequences a stream holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamBounds {
    /// The first sequence still held (above 1 once history aged out).
    pub first: u64,
    /// The last sequence ever stored.
    pub last: u64,
    /// Messages held.
    pub messages: u64,
}

/// One message as the stream stores it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StoredMessage {
    /// Its stream sequence.
    pub sequence: u64,
    /// Its subject.
    pub subject: String,
    /// Its headers, in order (`Nats-Msg-Id`, `Nisse-Type`, `traceparent`...).
    pub headers: Vec<(String, String)>,
    /// The protobuf payload.
    #[serde(skip)]
    pub payload: Bytes,
    /// When the stream stored it.
    #[serde(with = "time::serde::rfc3339")]
    pub stored_at: time::OffsetDateTime,
}

impl StoredMessage {
    /// Decodes the payload by its subject.
    pub fn decode(&self) -> std::result::Result<AnyMessage, Rejection> {
        let (_, kind) = SubjectKind::parse(&self.subject).ok_or_else(|| Rejection {
            cause: nisse_proto::v1::DeadLetterCause::UnknownSubject,
            reason: format!("`{}` is not a subject of a known kind", self.subject),
        })?;
        <AnyMessage as Decode>::decode(kind, &self.payload)
    }

    /// A header's first value.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Reads a range of an agent's stream in order, without touching any
/// durable consumer.
pub struct RangeReader {
    messages: Option<consumer::pull::Ordered>,
    last: u64,
    stream: String,
}

impl RangeReader {
    /// The next message of the range, or `None` at its end.
    pub async fn next(&mut self) -> Option<Result<StoredMessage>> {
        let messages = self.messages.as_mut()?;
        let item = messages.next().await?;
        let msg = match item {
            Ok(m) => m,
            Err(e) => {
                return Some(Err(Error::Read {
                    stream: self.stream.clone(),
                    reason: e.to_string(),
                }));
            }
        };
        let info = match msg.info() {
            Ok(i) => (i.stream_sequence, i.published),
            Err(e) => {
                return Some(Err(Error::Read {
                    stream: self.stream.clone(),
                    reason: e.to_string(),
                }));
            }
        };
        if info.0 >= self.last {
            self.messages = None;
        }
        let headers = msg
            .headers
            .iter()
            .flat_map(|h| h.iter())
            .flat_map(|(k, vs)| {
                vs.iter()
                    .map(move |v| (k.to_string(), v.as_str().to_string()))
            })
            .collect();
        Some(Ok(StoredMessage {
            sequence: info.0,
            subject: msg.subject.to_string(),
            headers,
            payload: msg.payload.clone(),
            stored_at: info.1,
        }))
    }
}

impl Bus {
    /// Reads `agent`'s stream from sequence `from` through `to` (inclusive;
    /// `None`: up to the last message stored now). Sequences removed by the
    /// stream's limits are skipped.
    pub async fn read_range(
        &self,
        agent: &AgentName,
        from: u64,
        to: Option<u64>,
    ) -> Result<RangeReader> {
        self.reader(agent, from, Some(to.unwrap_or(u64::MAX))).await
    }

    /// Follows `agent`'s stream from sequence `from` on: what it holds from
    /// there, then each message as it is stored, without end (a reader
    /// that never says the range is over). For a read model kept live
    /// beside the brain (the control service's).
    pub async fn follow(&self, agent: &AgentName, from: u64) -> Result<RangeReader> {
        self.reader(agent, from, None).await
    }

    /// A reader from `from` through `to` (clamped to what the stream holds
    /// now), or without end when `to` is `None`, through an unnamed
    /// ephemeral ordered consumer, which touches no durable one.
    async fn reader(&self, agent: &AgentName, from: u64, to: Option<u64>) -> Result<RangeReader> {
        let name = agent.stream();
        let err = |e: &dyn std::fmt::Display| Error::Read {
            stream: name.clone(),
            reason: e.to_string(),
        };
        let (stream, state) = self.stream_state(agent).await?;
        let first = from.max(state.first_sequence).max(1);
        let last = to.map_or(u64::MAX, |to| to.min(state.last_sequence));
        if to.is_some() && (state.messages == 0 || first > last) {
            return Ok(RangeReader {
                messages: None,
                last,
                stream: name,
            });
        }
        let ordered = stream
            .create_consumer(consumer::pull::OrderedConfig {
                deliver_policy: consumer::DeliverPolicy::ByStartSequence {
                    start_sequence: first,
                },
                filter_subject: agent.stream_subjects(),
                ..Default::default()
            })
            .await
            .map_err(|e| err(&e))?;
        let messages = ordered.messages().await.map_err(|e| err(&e))?;
        Ok(RangeReader {
            messages: Some(messages),
            last,
            stream: name,
        })
    }

    /// The first and last sequence `agent`'s stream holds now, and how
    /// many messages (`(0, last, 0)` when it holds none).
    pub async fn stream_bounds(&self, agent: &AgentName) -> Result<StreamBounds> {
        let (_, state) = self.stream_state(agent).await?;
        Ok(StreamBounds {
            first: state.first_sequence,
            last: state.last_sequence,
            messages: state.messages,
        })
    }

    /// `agent`'s stream and what it holds now.
    async fn stream_state(
        &self,
        agent: &AgentName,
    ) -> Result<(
        async_nats::jetstream::stream::Stream,
        async_nats::jetstream::stream::State,
    )> {
        let name = agent.stream();
        let err = |e: &dyn std::fmt::Display| Error::Read {
            stream: name.clone(),
            reason: e.to_string(),
        };
        let mut stream = self
            .jetstream()
            .get_stream(&name)
            .await
            .map_err(|e| err(&e))?;
        let state = stream.info().await.map_err(|e| err(&e))?.state.clone();
        Ok((stream, state))
    }

    /// The dedup id (`Nats-Msg-Id`) of the message at `sequence` of
    /// `agent`'s stream; `None` when the stream does not hold it (removed
    /// by its limits, or never there).
    pub async fn message_id_at(&self, agent: &AgentName, sequence: u64) -> Result<Option<String>> {
        let found = self.stored(agent, Lookup::Sequence(sequence)).await?;
        Ok(found.map(|m| m.header("Nats-Msg-Id").unwrap_or_default().to_string()))
    }

    /// The last message stored on `subject` (one of `agent`'s), if any: one
    /// request, answered from the stream's index, so a record kept as "the
    /// last message on its subject" (a work item's host binding) needs no
    /// consumer to fold it.
    pub async fn last_on_subject(
        &self,
        agent: &AgentName,
        subject: &str,
    ) -> Result<Option<StoredMessage>> {
        self.stored(agent, Lookup::LastOn(subject)).await
    }

    /// One stored message of `agent`'s stream, asked of the stream's leader
    /// in one request (no stream info needed: one round trip, not two).
    async fn stored(&self, agent: &AgentName, lookup: Lookup<'_>) -> Result<Option<StoredMessage>> {
        use async_nats::jetstream::stream::LastRawMessageErrorKind;
        let name = agent.stream();
        let err = |e: &dyn std::fmt::Display| Error::Read {
            stream: name.clone(),
            reason: match lookup {
                Lookup::Sequence(n) => format!("the message at sequence {n}: {e}"),
                Lookup::LastOn(subject) => format!("the last message on {subject}: {e}"),
            },
        };
        let stream = self
            .jetstream()
            .get_stream_no_info(&name)
            .await
            .map_err(|e| err(&e))?;
        let found = match lookup {
            Lookup::Sequence(n) => stream.get_raw_message(n).await,
            Lookup::LastOn(subject) => stream.get_last_raw_message_by_subject(subject).await,
        };
        match found {
            Ok(raw) => Ok(Some(StoredMessage {
                sequence: raw.sequence,
                subject: raw.subject.to_string(),
                headers: raw
                    .headers
                    .iter()
                    .flat_map(|(k, vs)| {
                        vs.iter()
                            .map(move |v| (k.to_string(), v.as_str().to_string()))
                    })
                    .collect(),
                payload: raw.payload,
                stored_at: raw.time,
            })),
            Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => Ok(None),
            Err(e) => Err(err(&e)),
        }
    }

    /// Publishes a stored message again, as it was: same subject, payload and
    /// headers (so the same dedup id). Used to move a recorded range onto
    /// another server to reproduce what happened there.
    pub async fn republish(&self, msg: &StoredMessage) -> Result<Published> {
        let mut headers = async_nats::HeaderMap::new();
        for (k, v) in &msg.headers {
            headers.append(k.as_str(), v.as_str());
        }
        let fail = |e: &dyn std::fmt::Display| Error::Publish {
            subject: msg.subject.clone(),
            reason: e.to_string(),
        };
        let ack = self
            .jetstream()
            .send_publish(
                msg.subject.clone(),
                jetstream::message::PublishMessage::build()
                    .payload(msg.payload.clone())
                    .headers(headers),
            )
            .await
            .map_err(|e| fail(&e))?
            .await
            .map_err(|e| fail(&e))?;
        Ok(Published {
            stream: ack.stream,
            sequence: ack.sequence,
            duplicate: ack.duplicate,
        })
    }
}
