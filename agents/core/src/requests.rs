//! Every request the brain sends a service has a deadline (seed L2: the
//! agent never waits in a state it cannot explain or leave; L8).
//!
//! A request is recorded when it is emitted ([`Txn::emit`] and the gate's
//! emits all go through one place), with its deadline: the kind's own
//! (`classify`, `model`, `vault`) or, for work with a timeout of its own
//! (a command, a probe), that timeout and a grace. A tick past the
//! deadline expires it; the shared brain then puts the item to wait on the
//! operator with the reason, and a duty's run counts it as no answer.
//! Answers pass [`Txn::answer_fate`] before anything routes them: the
//! first answer to a waiting request is applied; an answer to an expired
//! one is recorded and kept, never acted on (nor is any other answer to
//! it before the operator's `retry`); a second answer is handed on
//! like the first, whose handlers record it and change nothing.
//! The operator's `retry` ([`Txn::retry_requests`]) applies a kept late
//! answer, or sends the request again under the same request id and a
//! new message id, so a service answers it once (an executor never runs a
//! request id twice) and whichever answer comes first is applied.
//!
//! Time here is the ticks' and the messages': replaying the stream
//! expires the same requests at the same messages.

use std::time::Duration;

use rusqlite::{OptionalExtension as _, params};
use serde::{Deserialize, Serialize};

use nisse_bus::proto::{ExecRequest, McpRequest, ProbeRequest};
use nisse_bus::{AnyMessage, Decode as _, SubjectKind};

use crate::log::{Actor, Event};
use crate::store::{Cached as _, Outgoing, StoreError, Txn, ns_to_time, time_to_ns};

/// A duty's item id: a duty has no work item, but its requests are sent
/// under `duty-<name>` and its commands run on hosts bound to that.
pub use nisse_bus::topology::{DUTY_ITEM_PREFIX, duty_item, duty_of};

/// How long each kind of request may go unanswered before the brain stops
/// waiting for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
pub struct Deadlines {
    /// A verdict from the classifier (which may ask its model).
    #[serde(with = "humantime_serde")]
    pub classify: Duration,
    /// A model reply from the gateway (its retries and fallbacks
    /// included).
    #[serde(with = "humantime_serde")]
    pub model: Duration,
    /// Beyond a command's (or an MCP call's) own timeout, for the executor
    /// (or the mcp service) to connect and answer.
    #[serde(with = "humantime_serde")]
    pub exec_grace: Duration,
    /// Beyond a probe's own timeout, for the prober to answer.
    #[serde(with = "humantime_serde")]
    pub probe_grace: Duration,
    /// A note written by the vault writer.
    #[serde(with = "humantime_serde")]
    pub vault: Duration,
    /// A Gitea API call made by the Gitea intake (its retries included).
    #[serde(with = "humantime_serde")]
    pub gitea: Duration,
}

impl Default for Deadlines {
    fn default() -> Self {
        Self {
            classify: Duration::from_secs(120),
            model: Duration::from_secs(600),
            exec_grace: Duration::from_secs(60),
            probe_grace: Duration::from_secs(15),
            vault: Duration::from_secs(60),
            gitea: Duration::from_secs(120),
        }
    }
}

impl Deadlines {
    /// How long `msg`, a request of its kind, may wait for its answer.
    fn of<M: nisse_bus::Contract>(&self, msg: &M) -> Duration {
        // Work with a timeout of its own gets that and a grace.
        let any: &dyn std::any::Any = msg;
        if let Some(exec) = any.downcast_ref::<ExecRequest>() {
            return Duration::from_millis(exec.timeout_ms).saturating_add(self.exec_grace);
        }
        if let Some(call) = any.downcast_ref::<McpRequest>() {
            return Duration::from_millis(call.timeout_ms).saturating_add(self.exec_grace);
        }
        if let Some(probe) = any.downcast_ref::<ProbeRequest>() {
            return Duration::from_millis(probe.timeout_ms.into()).saturating_add(self.probe_grace);
        }
        match M::KIND {
            SubjectKind::ClassifyReq => self.classify,
            SubjectKind::ModelReq => self.model,
            SubjectKind::GiteaReq => self.gitea,
            _ => self.vault,
        }
    }
}

/// The service that answers a kind of request, as the operator is told
/// ("the classifier", "the executor"), from the bus's table of who
/// publishes the answer.
pub fn answerer(kind: SubjectKind) -> String {
    let role = kind
        .answered_by()
        .and_then(|answer| answer.publishers().first().copied());
    match role {
        Some(nisse_bus::topology::Publisher::Role(role)) => format!("the {role}"),
        _ => format!("the service answering {}", kind.suffix()),
    }
}

/// What becomes of an answer that arrived.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AnswerFate {
    /// Its request was waiting for it (or is from before requests had
    /// deadlines): apply it.
    Apply,
    /// Its request's deadline had passed: recorded and kept for `retry`,
    /// not acted on.
    Late,
    /// Its request was already answered: what it answers has moved on,
    /// and the handlers record it and change nothing.
    Again,
}

/// A request whose deadline passed at the message being applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Overdue {
    /// Its request id.
    pub request_id: String,
    /// Its kind.
    pub kind: SubjectKind,
    /// The item it is about, or a duty's item id ([`duty_of`]).
    pub work_item_id: String,
    /// How long it was given.
    pub waited: Duration,
}

impl Overdue {
    /// "the classifier did not answer within 2m".
    pub fn describe(&self) -> String {
        format!(
            "{} did not answer within {}",
            answerer(self.kind),
            humantime::format_duration(self.waited)
        )
    }
}

/// What `retry` did with one request.
#[derive(Debug)]
pub enum Retried {
    /// Its late answer, kept when it came, to be applied now.
    LateAnswer(Box<AnyMessage>),
    /// It was sent again.
    Resent {
        /// Its request id.
        request_id: String,
        /// Who answers it.
        kind: SubjectKind,
    },
}

impl Txn<'_, '_> {
    /// Records a request just emitted, with its deadline. Called for every
    /// message the brain emits whose kind has an answer.
    pub(crate) fn track_request<M: nisse_bus::Contract>(
        &mut self,
        msg: &M,
        out: &Outgoing,
    ) -> Result<(), StoreError> {
        let Some(request_id) = msg.request_id().filter(|r| !r.is_empty()) else {
            return Err(StoreError::Corrupt(format!(
                "{} emitted without a request id",
                M::NAME
            )));
        };
        let work_item_id = msg
            .envelope()
            .map(|e| e.work_item_id.as_str())
            .unwrap_or_default();
        let within = self.deadlines().of(msg);
        let sent = time_to_ns(self.at());
        let deadline = sent.saturating_add(i64::try_from(within.as_nanos()).unwrap_or(i64::MAX));
        self.tx().exec_cached(
            "INSERT INTO requests (request_id, kind, work_item_id, sent_at_ns, deadline_ns, state, request_type, request)
             VALUES (?1, ?2, ?3, ?4, ?5, 'waiting', ?6, ?7) ON CONFLICT (kind, request_id) DO NOTHING",
            params![
                request_id,
                M::KIND.suffix(),
                work_item_id,
                sent,
                deadline,
                out.type_name,
                out.payload
            ],
        )?;
        Ok(())
    }

    /// Decides what becomes of `answer` (a service's answer to one of the
    /// brain's requests) and records it: the first answer to a waiting
    /// request marks it answered; one to an expired request is kept and
    /// logged on its item as late.
    pub fn answer_fate(&mut self, answer: &AnyMessage) -> Result<AnswerFate, StoreError> {
        let Some(request_id) = answer.request_id() else {
            return Ok(AnswerFate::Apply);
        };
        let Some(asked) = SubjectKind::ALL
            .into_iter()
            .find(|k| k.answered_by() == Some(answer.kind()))
        else {
            return Ok(AnswerFate::Apply);
        };
        let kind = asked.suffix();
        let row: Option<(String, String, i64, i64)> = self
            .tx()
            .row_cached(
                "SELECT state, work_item_id, sent_at_ns, deadline_ns FROM requests WHERE kind = ?1 AND request_id = ?2",
                params![kind, request_id],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
            )
            .optional()?;
        let Some((state, work_item_id, sent, deadline)) = row else {
            // Sent before requests had deadlines.
            return Ok(AnswerFate::Apply);
        };
        match state.as_str() {
            "waiting" => {
                self.tx().exec_cached(
                    "UPDATE requests SET state = 'answered', request = NULL WHERE kind = ?1 AND request_id = ?2",
                    params![kind, request_id],
                )?;
                Ok(AnswerFate::Apply)
            }
            "expired" => {
                self.tx().exec_cached(
                    "UPDATE requests SET state = 'late', answer_type = ?3, answer = ?4 WHERE kind = ?1 AND request_id = ?2",
                    params![
                        kind,
                        request_id,
                        AnyMessage::type_name(answer.kind()),
                        answer.encode_to_vec()
                    ],
                )?;
                let late = self.at() - ns_to_time(deadline);
                let given = ns_to_time(deadline) - ns_to_time(sent);
                if self.item(&work_item_id)?.is_some() {
                    self.append(
                        &work_item_id,
                        &Actor::from_envelope(answer.envelope()),
                        &Event::Fact {
                            text: format!(
                                "a late answer to {request_id} came {} after its deadline ({} given); it is recorded and not acted on: `retry` applies it",
                                humantime::format_duration(late.unsigned_abs()),
                                humantime::format_duration(given.unsigned_abs()),
                            ),
                            data: serde_json::json!({
                                "late_answer": request_id,
                                "late_ms": late.whole_milliseconds(),
                            }),
                        },
                    )?;
                }
                Ok(AnswerFate::Late)
            }
            // Another answer to a request whose late answer is kept: not
            // acted on either (the operator was told nothing goes on until
            // `retry`, which applies the first).
            "late" => Ok(AnswerFate::Late),
            _ => Ok(AnswerFate::Again),
        }
    }

    /// The requests whose deadline passed by the message being applied,
    /// each marked expired: they are not waited for any more.
    pub fn expire_overdue(&mut self) -> Result<Vec<Overdue>, StoreError> {
        let now = time_to_ns(self.at());
        let overdue = {
            let mut stmt = self.tx().prepare_cached(
                "SELECT request_id, kind, work_item_id, sent_at_ns, deadline_ns FROM requests
                 WHERE state = 'waiting' AND deadline_ns <= ?1 ORDER BY deadline_ns, request_id",
            )?;
            let rows = stmt.query_map([now], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, String>(2)?,
                    r.get::<_, i64>(3)?,
                    r.get::<_, i64>(4)?,
                ))
            })?;
            rows.collect::<Result<Vec<_>, _>>()?
        };
        let mut out = Vec::with_capacity(overdue.len());
        for (request_id, kind, work_item_id, sent, deadline) in overdue {
            self.tx().exec_cached(
                "UPDATE requests SET state = 'expired' WHERE kind = ?1 AND request_id = ?2",
                params![kind, request_id],
            )?;
            let kind = SubjectKind::ALL
                .into_iter()
                .find(|k| k.suffix() == kind)
                .ok_or_else(|| {
                    StoreError::Corrupt(format!("request {request_id} of kind {kind}"))
                })?;
            out.push(Overdue {
                request_id,
                kind,
                work_item_id,
                waited: Duration::from_nanos(u64::try_from(deadline - sent).unwrap_or(0)),
            });
        }
        Ok(out)
    }

    /// Whether an execution request with this id was sent already.
    pub(crate) fn exec_sent(&self, request_id: &str) -> Result<bool, StoreError> {
        use nisse_bus::Contract as _;
        Ok(self.tx().row_cached(
            "SELECT EXISTS (SELECT 1 FROM requests WHERE kind = ?1 AND request_id = ?2)",
            params![ExecRequest::KIND.suffix(), request_id],
            |r| r.get(0),
        )?)
    }

    /// Whether an action of `work_item_id` is on its way (a classify or
    /// execution request not yet answered, the loop's, a plan's or a
    /// harness's; one past its deadline too, since its command may still
    /// run): what a harness waits for before it moves the tree the item
    /// works in.
    pub fn actions_in_flight(&self, work_item_id: &str) -> Result<bool, StoreError> {
        use nisse_bus::Contract as _;
        Ok(self.tx().row_cached(
            "SELECT EXISTS (SELECT 1 FROM requests WHERE work_item_id = ?1 AND state IN ('waiting', 'expired') AND kind IN (?2, ?3))",
            params![
                work_item_id,
                ExecRequest::KIND.suffix(),
                nisse_bus::proto::ClassifyRequest::KIND.suffix()
            ],
            |r| r.get(0),
        )?)
    }

    /// Whether `work_item_id` has requests that went unanswered in time
    /// and wait for the operator's `retry`.
    pub fn has_expired_requests(&self, work_item_id: &str) -> Result<bool, StoreError> {
        Ok(self.tx().row_cached(
            "SELECT EXISTS (SELECT 1 FROM requests WHERE work_item_id = ?1 AND state IN ('expired', 'late'))",
            [work_item_id],
            |r| r.get(0),
        )?)
    }

    /// The operator's `retry` for `work_item_id`: each of its requests that
    /// went unanswered in time either has its late answer returned, to be
    /// applied now (and is answered), or is sent again under the same
    /// request id with a new message id, with a new deadline as long as
    /// the first. In the order they were sent.
    pub fn retry_requests(&mut self, work_item_id: &str) -> Result<Vec<Retried>, StoreError> {
        type Row = (
            String,
            String,
            String,
            i64,
            i64,
            i64,
            String,
            Option<Vec<u8>>,
            Option<String>,
            Option<Vec<u8>>,
        );
        let rows: Vec<Row> = {
            let mut stmt = self.tx().prepare_cached(
                "SELECT kind, request_id, state, sent_at_ns, deadline_ns, resends, request_type, request, answer_type, answer
                 FROM requests WHERE work_item_id = ?1 AND state IN ('expired', 'late') ORDER BY sent_at_ns, request_id",
            )?;
            let rows = stmt.query_map([work_item_id], |r| {
                Ok((
                    r.get(0)?,
                    r.get(1)?,
                    r.get(2)?,
                    r.get(3)?,
                    r.get(4)?,
                    r.get(5)?,
                    r.get(6)?,
                    r.get(7)?,
                    r.get(8)?,
                    r.get(9)?,
                ))
            })?;
            rows.collect::<Result<_, _>>()?
        };
        let decode = |type_name: &str, bytes: &[u8]| -> Result<AnyMessage, StoreError> {
            let kind = AnyMessage::kind_of_type(type_name).ok_or_else(|| {
                StoreError::Corrupt(format!("a kept message of type {type_name}"))
            })?;
            AnyMessage::decode(kind, bytes).map_err(|e| {
                StoreError::Corrupt(format!("a kept {type_name} does not decode: {}", e.reason))
            })
        };
        let mut out = Vec::with_capacity(rows.len());
        for (
            kind,
            request_id,
            state,
            sent,
            deadline,
            resends,
            request_type,
            request,
            answer_type,
            answer,
        ) in rows
        {
            if state == "late"
                && let (Some(t), Some(a)) = (&answer_type, &answer)
            {
                let answer = decode(t, a)?;
                self.tx().exec_cached(
                    "UPDATE requests SET state = 'answered', request = NULL, answer = NULL WHERE kind = ?1 AND request_id = ?2",
                    params![kind, request_id],
                )?;
                out.push(Retried::LateAnswer(Box::new(answer)));
                continue;
            }
            let message = self.resend(
                &kind,
                &request_id,
                &request_type,
                request.as_deref(),
                resends,
                deadline - sent,
            )?;
            out.push(Retried::Resent {
                request_id,
                kind: message.kind(),
            });
        }
        Ok(out)
    }

    /// Sends one waiting-no-more request again, as `retry` does: same
    /// request id, a new message id (`…:retryN`), a new deadline as long
    /// as the first. `false` when it is not kept (answered meanwhile, or
    /// never sent).
    pub(crate) fn resend_request(
        &mut self,
        kind: SubjectKind,
        request_id: &str,
    ) -> Result<bool, StoreError> {
        // sent, deadline, resends, type, bytes
        type Kept = (i64, i64, i64, String, Option<Vec<u8>>);
        let row: Option<Kept> = self
            .tx()
            .row_cached(
                "SELECT sent_at_ns, deadline_ns, resends, request_type, request FROM requests
                 WHERE kind = ?1 AND request_id = ?2 AND state = 'expired'",
                params![kind.suffix(), request_id],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)),
            )
            .optional()?;
        let Some((sent, deadline, resends, request_type, request)) = row else {
            return Ok(false);
        };
        self.resend(
            kind.suffix(),
            request_id,
            &request_type,
            request.as_deref(),
            resends,
            deadline - sent,
        )?;
        Ok(true)
    }

    /// Puts a kept request back on the bus under a new message id and
    /// waits for it again.
    fn resend(
        &mut self,
        kind: &str,
        request_id: &str,
        request_type: &str,
        request: Option<&[u8]>,
        resends: i64,
        given_ns: i64,
    ) -> Result<AnyMessage, StoreError> {
        let Some(bytes) = request else {
            return Err(StoreError::Corrupt(format!(
                "request {request_id} is kept without its message"
            )));
        };
        let type_kind = AnyMessage::kind_of_type(request_type)
            .ok_or_else(|| StoreError::Corrupt(format!("a kept message of type {request_type}")))?;
        let mut message = AnyMessage::decode(type_kind, bytes).map_err(|e| {
            StoreError::Corrupt(format!(
                "a kept {request_type} does not decode: {}",
                e.reason
            ))
        })?;
        let resends = resends + 1;
        let message_id = {
            let envelope = message.envelope_mut().get_or_insert_default();
            envelope.message_id = format!("{}:retry{resends}", envelope.message_id);
            envelope.causation_id = self.cause().1.to_string();
            envelope.message_id.clone()
        };
        let now = time_to_ns(self.at());
        self.tx().exec_cached(
            "UPDATE requests SET state = 'waiting', resends = ?3, sent_at_ns = ?4, deadline_ns = ?5 WHERE kind = ?1 AND request_id = ?2",
            params![kind, request_id, resends, now, now.saturating_add(given_ns)],
        )?;
        self.emit_encoded(Outgoing {
            message_id,
            type_name: request_type.to_string(),
            payload: message.encode_to_vec(),
        })?;
        Ok(message)
    }
}
