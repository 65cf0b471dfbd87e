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
///
/// It reads through an unnamed ephemeral consumer of its own (created
/// with `CONSUMER.CREATE.<stream>`, which can name or change no durable
/// one), and when that consumer is lost (its server gone, heartbeats
/// missed, a message missed in flight) it makes a new one from the next
/// sequence it wants. Not async-nats's ordered consumer: that one
/// recreates itself by name and deletes the old one by name, requests
/// the bus's walls rightly refuse to a reader (they would let it change
/// or delete the services' durable consumers), so after a failover it
/// would wait forever.
pub struct RangeReader {
    /// Where it reads from; `None` once the range is over.
    source: Option<Source>,
    /// The next stream sequence it wants.
    next: u64,
    /// The last sequence of the range (`u64::MAX`: no end).
    last: u64,
    stream: String,
}

/// The stream a reader reads and its current consumer.
struct Source {
    handle: jetstream::stream::Stream,
    filter: String,
    /// The consumer's messages, when one is open.
    messages: Option<consumer::pull::Stream>,
    /// The consumer sequence of the last message taken from it.
    delivered: u64,
    /// Openings or reads that failed in a row.
    failures: u32,
}

/// Pauses between attempts to read on after a failure, and how many
/// failures in a row a reader takes before it reports one (about half a
/// minute in all: a cluster elects a new leader well within that).
const REOPEN: crate::Backoff = crate::Backoff::new(
    std::time::Duration::from_millis(100),
    std::time::Duration::from_secs(5),
);
const FAILURES: u32 = 10;

/// How often an idle consumer's server says it is there: two missed and
/// the reader opens a new one.
const HEARTBEAT: std::time::Duration = std::time::Duration::from_secs(2);

impl Source {
    /// A new consumer from stream sequence `from` on.
    async fn open(&mut self, from: u64) -> std::result::Result<(), String> {
        let consumer = self
            .handle
            .create_consumer(consumer::pull::Config {
                deliver_policy: consumer::DeliverPolicy::ByStartSequence {
                    start_sequence: from,
                },
                filter_subject: self.filter.clone(),
                ack_policy: consumer::AckPolicy::None,
                max_deliver: 1,
                memory_storage: true,
                num_replicas: 1,
                inactive_threshold: std::time::Duration::from_secs(30),
                ..Default::default()
            })
            .await
            .map_err(|e| e.to_string())?;
        let messages = consumer
            .stream()
            .heartbeat(HEARTBEAT)
            .expires(HEARTBEAT * 5)
            .messages()
            .await
            .map_err(|e| e.to_string())?;
        self.messages = Some(messages);
        self.delivered = 0;
        Ok(())
    }
}

impl RangeReader {
    /// The next message of the range, or `None` at its end. A lost
    /// consumer is replaced without a message missed or read twice; an
    /// error only when the stream stays unreadable.
    pub async fn next(&mut self) -> Option<Result<StoredMessage>> {
        loop {
            let next = self.next;
            let source = self.source.as_mut()?;
            let failed = match source.messages.as_mut() {
                None => source.open(next).await.err(),
                Some(messages) => match messages.next().await {
                    Some(Ok(msg)) => match msg.info() {
                        Ok(info) if info.consumer_sequence == source.delivered + 1 => {
                            source.delivered = info.consumer_sequence;
                            source.failures = 0;
                            let (sequence, stored_at) = (info.stream_sequence, info.published);
                            if sequence < next {
                                continue;
                            }
                            self.next = sequence + 1;
                            if sequence >= self.last {
                                self.source = None;
                            }
                            return Some(Ok(stored(&msg, sequence, stored_at)));
                        }
                        Ok(_) => Some("a message was missed in flight".to_string()),
                        Err(e) => Some(e.to_string()),
                    },
                    Some(Err(e)) => Some(e.to_string()),
                    None => Some("the consumer's messages ended".to_string()),
                },
            };
            let Some(reason) = failed else { continue };
            source.messages = None;
            source.failures += 1;
            if source.failures > FAILURES {
                self.source = None;
                return Some(Err(Error::Read {
                    stream: self.stream.clone(),
                    reason,
                }));
            }
            let pause = REOPEN
                .delays()
                .nth(source.failures as usize - 1)
                .unwrap_or(REOPEN.max());
            tracing::debug!(stream = %self.stream, next, ?pause, "reading on with a new consumer: {reason}");
            tokio::time::sleep(pause).await;
        }
    }
}

/// A message read from a consumer, as the stream stores it.
fn stored(
    msg: &jetstream::Message,
    sequence: u64,
    stored_at: time::OffsetDateTime,
) -> StoredMessage {
    let headers = msg
        .headers
        .iter()
        .flat_map(|h| h.iter())
        .flat_map(|(k, vs)| {
            vs.iter()
                .map(move |v| (k.to_string(), v.as_str().to_string()))
        })
        .collect();
    StoredMessage {
        sequence,
        subject: msg.subject.to_string(),
        headers,
        payload: msg.payload.clone(),
        stored_at,
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
        self.reader(
            agent,
            &agent.stream_subjects(),
            from,
            Some(to.unwrap_or(u64::MAX)),
        )
        .await
    }

    /// Reads the messages of `agent`'s stream on `subject` (which may end
    /// in a wildcard) from sequence `from` through `to`, like
    /// [`Bus::read_range`], without the rest of the stream crossing the
    /// network (`nisse eval export`'s captures).
    pub async fn read_subject(
        &self,
        agent: &AgentName,
        subject: &str,
        from: u64,
        to: Option<u64>,
    ) -> Result<RangeReader> {
        self.reader(agent, subject, from, Some(to.unwrap_or(u64::MAX)))
            .await
    }

    /// Follows `agent`'s stream from sequence `from` on: what it holds from
    /// there, then each message as it is stored, without end (a reader
    /// that never says the range is over). For a read model kept live
    /// beside the brain (the control service's).
    pub async fn follow(&self, agent: &AgentName, from: u64) -> Result<RangeReader> {
        self.reader(agent, &agent.stream_subjects(), from, None)
            .await
    }

    /// A reader of `filter` from `from` through `to` (clamped to what the
    /// stream holds now), or without end when `to` is `None`.
    async fn reader(
        &self,
        agent: &AgentName,
        filter: &str,
        from: u64,
        to: Option<u64>,
    ) -> Result<RangeReader> {
        let name = agent.stream();
        let (stream, state) = self.stream_state(agent).await?;
        let first = from.max(state.first_sequence).max(1);
        let last = to.map_or(u64::MAX, |to| to.min(state.last_sequence));
        let empty = to.is_some() && (state.messages == 0 || first > last);
        let mut source = Source {
            handle: stream,
            filter: filter.to_string(),
            messages: None,
            delivered: 0,
            failures: 0,
        };
        if !empty {
            // The first consumer at once: a reader that cannot read at
            // all says so now.
            source.open(first).await.map_err(|reason| Error::Read {
                stream: name.clone(),
                reason,
            })?;
        }
        Ok(RangeReader {
            source: (!empty).then_some(source),
            next: first,
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
