//! The durable record of one request id's API call, and the flow that
//! makes a call with side effects at most once per request id: `started`
//! before the service is called, `done` with the answer after, so a
//! request delivered again after a crash is answered from its record or
//! reconciled with the service, never made twice.
//!
//! Shared because the Gitea and Vikunja intakes keep these records the
//! same way, each in its own bucket under the agent's own keys; which
//! bucket, and what a call does, are each service's.

use std::future::Future;

use prost::Message;
use serde::{Deserialize, Serialize};

use nisse_bus::once::b64;
use nisse_bus::{AgentName, Bus, Result, Unhandled, Versioned, kv_key};

pub use nisse_bus::now_ms;

/// Where an API call stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CallState {
    /// The service is being called (or was, before a crash): what it
    /// made, if anything, is found before anything is made again.
    Started,
    /// Answered; the answer is given again, nothing is made again.
    Done,
}

/// The durable record of one request id's call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallRecord {
    /// The request id.
    pub request_id: String,
    /// Started or done.
    pub state: CallState,
    /// When it was first started, in milliseconds since the Unix epoch.
    pub started_ms: u64,
    /// The encoded result (`GiteaResult`, `VikunjaResult`), once done.
    #[serde(default, with = "b64", skip_serializing_if = "Vec::is_empty")]
    pub result: Vec<u8>,
}

/// The bucket key of request `request_id`'s call for `agent`.
pub fn call_key(agent: &AgentName, request_id: &str) -> String {
    kv_key(agent, &["call", request_id])
}

/// The record of `request_id` in `bucket`, if any, with its revision.
pub async fn read_call(
    bus: &Bus,
    bucket: &str,
    agent: &AgentName,
    request_id: &str,
) -> Result<Option<Versioned<CallRecord>>> {
    bus.kv_read(bucket, &call_key(agent, request_id)).await
}

/// Writes `record` in `bucket` over `revision` (`None`: none may exist).
/// `Ok(None)` when someone else wrote first.
pub async fn write_call(
    bus: &Bus,
    bucket: &str,
    agent: &AgentName,
    record: &CallRecord,
    revision: Option<u64>,
) -> Result<Option<u64>> {
    bus.kv_write(
        bucket,
        &call_key(agent, &record.request_id),
        record,
        revision,
    )
    .await
}

/// A call with side effects, at most once per request id `id`: a done
/// call's stored answer is given again; otherwise the call is recorded
/// as started (or found started before, when `make` is told to
/// `reconcile`: look in `service` for what it made), made by `make`
/// (told whether to reconcile and when the call was first started), and
/// its answer recorded as done.
pub async fn once<R, F, Fut>(
    bus: &Bus,
    bucket: &str,
    agent: &AgentName,
    id: &str,
    service: &str,
    make: F,
) -> std::result::Result<R, Unhandled>
where
    R: Message + Default,
    F: FnOnce(bool, u64) -> Fut,
    Fut: Future<Output = std::result::Result<R, Unhandled>>,
{
    let found = read_call(bus, bucket, agent, id)
        .await
        .map_err(|e| Unhandled::retry(format!("reading the record of call {id}: {e}")))?;
    let (record, revision, reconcile) = match found {
        Some((record, _)) if record.state == CallState::Done => {
            let stored = R::decode(record.result.as_slice()).map_err(|e| {
                Unhandled::dead_letter(format!(
                    "the stored answer to call {id} cannot be read: {e}"
                ))
            })?;
            tracing::info!(request_id = %id, "answered already: the stored answer is given again");
            return Ok(stored);
        }
        Some((record, revision)) => {
            tracing::warn!(request_id = %id, "call {id} was started before and not answered: looking in {service} for what it made");
            (record, revision, true)
        }
        None => {
            let record = CallRecord {
                request_id: id.to_string(),
                state: CallState::Started,
                started_ms: now_ms(),
                result: Vec::new(),
            };
            let revision = write_call(bus, bucket, agent, &record, None)
                .await
                .map_err(|e| Unhandled::retry(format!("recording call {id}: {e}")))?
                .ok_or_else(|| {
                    Unhandled::retry(format!("another instance started call {id} meanwhile"))
                })?;
            (record, revision, false)
        }
    };
    let answer = make(reconcile, record.started_ms).await?;
    let done = CallRecord {
        state: CallState::Done,
        result: answer.encode_to_vec(),
        ..record
    };
    write_call(bus, bucket, agent, &done, Some(revision))
        .await
        .map_err(|e| Unhandled::retry(format!("recording the answer to call {id}: {e}")))?
        .ok_or_else(|| {
            Unhandled::retry(format!("another instance recorded call {id} meanwhile"))
        })?;
    Ok(answer)
}
