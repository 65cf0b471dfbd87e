//! Leases in a NATS key-value bucket: one holder at a time per name.
//!
//! A brain holds the lease `brain.<agent>` while it runs, so two brain
//! processes for one agent never split its stream between them (design
//! brief §4). The bucket's entries expire `bus.lease-ttl` after their last
//! write; the holder renews well within that, so a crashed holder's lease
//! lapses and a standby takes over. A holder is named by something stable
//! (a brain: its state store's id), so the same holder restarting after a
//! crash takes its own lease back at once instead of waiting for it to
//! lapse.

use std::time::Duration;

use async_nats::jetstream::kv;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::topology::LEASE_BUCKET;
use crate::{AgentName, Backoff, Bus, Error, Persist, Result, kv_key};

/// What the brain holding an agent's lease says of itself, beside the
/// lease in its bucket (`<agent>.brain-status`) and expiring with it: a
/// brain that is gone says nothing. `nisse streams` shows it, and `nisse
/// idle` reads it to tell whether the agent is in the middle of a step.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BrainStatus {
    /// The holder of the lease (its state store's id).
    pub holder: String,
    /// The last stream sequence it applied.
    pub applied: u64,
    /// The stream's last sequence when it last looked.
    pub stream_last: u64,
    /// It is applying what its stream holds past its position before
    /// taking new messages (a standby that took over, a restart).
    pub catching_up: bool,
    /// Work items with an execution sent and not yet answered (a command
    /// over SSH or an MCP call): the agent is in the middle of a step.
    pub busy: Vec<String>,
    /// When it said so, in milliseconds since the Unix epoch.
    pub at_ms: u64,
}

impl Bus {
    /// Writes `agent`'s brain status (the brain holding its lease does).
    pub async fn put_brain_status(&self, agent: &AgentName, status: &BrainStatus) -> Result<()> {
        let bytes = serde_json::to_vec(status).map_err(|e| Error::JetStream {
            action: "encode the brain's status".into(),
            reason: e.to_string(),
        })?;
        self.kv_put(LEASE_BUCKET, &kv_key(agent, &["brain-status"]), bytes)
            .await
    }

    /// `agent`'s brain status, if a brain holding its lease wrote one
    /// within the lease's time to live.
    pub async fn brain_status(&self, agent: &AgentName) -> Result<Option<BrainStatus>> {
        Ok(self
            .kv_read::<BrainStatus>(LEASE_BUCKET, &kv_key(agent, &["brain-status"]))
            .await?
            .map(|(s, _)| s))
    }
}

/// Waits between tries to reach the lease bucket while the server does
/// not answer.
const LEASE_BACKOFF: Backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(5));

/// One try at a lease.
enum Attempt {
    Taken(Box<Lease>),
    HeldBy(String),
    Again,
}

/// A lease this process holds. Renew it every [`Lease::renew_every`];
/// when a renewal fails the lease may be someone else's: stop.
pub struct Lease {
    kv: kv::Store,
    key: String,
    holder: String,
    revision: u64,
    ttl: Duration,
    /// When the last renewal (or the taking) succeeded.
    renewed: tokio::time::Instant,
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease")
            .field("key", &self.key)
            .field("holder", &self.holder)
            .field("revision", &self.revision)
            .finish_non_exhaustive()
    }
}

impl Bus {
    /// Waits until `holder` holds the lease `name`, or `shutdown` (then
    /// `None`). While someone else holds it, says so once and tries again
    /// every third of the TTL; while the server does not answer (a
    /// cluster electing a leader, a server restarting), tries again with
    /// backoff rather than giving up.
    pub async fn acquire_lease(
        &self,
        name: &str,
        holder: &str,
        shutdown: &CancellationToken,
    ) -> Result<Option<Lease>> {
        let ttl = self.config().lease_ttl;
        let mut said = None::<String>;
        let mut trouble = Persist::new("reach the lease bucket", LEASE_BACKOFF);
        loop {
            let wait = match self.try_lease(name, holder, ttl).await {
                Ok(Attempt::Taken(lease)) => return Ok(Some(*lease)),
                Ok(Attempt::Again) => continue,
                Ok(Attempt::HeldBy(other)) => {
                    trouble.succeeded();
                    if said.as_deref() != Some(other.as_str()) {
                        tracing::warn!(
                            lease = name,
                            held_by = %other,
                            "another holder has the lease; standing by until it lapses ({ttl:?} after its last renewal)"
                        );
                        said = Some(other);
                    }
                    tokio::time::sleep(ttl / 3)
                }
                Err(e) => {
                    let why = e.to_string();
                    tokio::select! {
                        () = shutdown.cancelled() => return Ok(None),
                        () = trouble.failed(&why) => {}
                    }
                    continue;
                }
            };
            tokio::select! {
                () = shutdown.cancelled() => return Ok(None),
                () = wait => {}
            }
        }
    }

    /// One try at the lease.
    async fn try_lease(&self, name: &str, holder: &str, ttl: Duration) -> Result<Attempt> {
        let err = |action: &str, e: &dyn std::fmt::Display| Error::JetStream {
            action: format!("{action} lease {name}"),
            reason: e.to_string(),
        };
        let kv = self
            .jetstream()
            .get_key_value(LEASE_BUCKET)
            .await
            .map_err(|e| err("open the bucket for", &e))?;
        match kv.create(name, holder.to_string().into()).await {
            Ok(revision) => {
                return Ok(Attempt::Taken(Box::new(
                    self.held(kv, name, holder, revision, ttl),
                )));
            }
            Err(e) if e.kind() == kv::CreateErrorKind::AlreadyExists => {}
            Err(e) => return Err(err("take", &e)),
        }
        match kv.entry(name).await.map_err(|e| err("read", &e))? {
            // Ours from before a restart: take it back.
            Some(entry)
                if entry.value.as_ref() == holder.as_bytes()
                    && entry.operation == kv::Operation::Put =>
            {
                match kv
                    .update(name, holder.to_string().into(), entry.revision)
                    .await
                {
                    Ok(revision) => Ok(Attempt::Taken(Box::new(
                        self.held(kv, name, holder, revision, ttl),
                    ))),
                    Err(_) => Ok(Attempt::Again),
                }
            }
            Some(entry) if entry.operation == kv::Operation::Put => Ok(Attempt::HeldBy(
                String::from_utf8_lossy(&entry.value).into_owned(),
            )),
            // Gone between the two calls: try again at once.
            _ => Ok(Attempt::Again),
        }
    }

    fn held(&self, kv: kv::Store, name: &str, holder: &str, revision: u64, ttl: Duration) -> Lease {
        tracing::info!(lease = name, holder, "lease taken");
        Lease {
            kv,
            key: name.to_string(),
            holder: holder.to_string(),
            revision,
            ttl,
            renewed: tokio::time::Instant::now(),
        }
    }
}

impl Lease {
    /// How often to renew: a third of the TTL, so two renewals can be lost
    /// before the lease lapses.
    pub fn renew_every(&self) -> Duration {
        self.ttl / 3
    }

    /// Renews the lease: `Ok(true)` when renewed, `Ok(false)` when the
    /// server did not answer (a cluster electing a leader, a server
    /// restarting) while the lease is surely still this holder's: try
    /// again soon. An error means it may have lapsed and been taken by
    /// someone else (another holder wrote it, or no renewal succeeded for
    /// two thirds of its time to live): the holder must stop acting on
    /// what it guards.
    pub async fn renew(&mut self) -> Result<bool> {
        let lost = |reason: String| Error::JetStream {
            action: format!("renew lease {}", self.key),
            reason,
        };
        match self
            .kv
            .update(&self.key, self.holder.clone().into(), self.revision)
            .await
        {
            Ok(revision) => {
                self.revision = revision;
                self.renewed = tokio::time::Instant::now();
                Ok(true)
            }
            // Not the revision this holder last wrote: a renewal whose
            // answer was lost in a failover may have been stored after
            // all. Still this holder's: go on from what is there.
            Err(e) if e.kind() == kv::UpdateErrorKind::WrongLastRevision => {
                match self.kv.entry(&self.key).await {
                    Ok(Some(entry))
                        if entry.operation == kv::Operation::Put
                            && entry.value.as_ref() == self.holder.as_bytes() =>
                    {
                        self.revision = entry.revision;
                        Box::pin(self.renew()).await
                    }
                    Ok(other) => Err(lost(format!(
                        "{e}: {}, so it lapsed and was taken over",
                        match other {
                            Some(entry) if entry.operation == kv::Operation::Put =>
                                format!("{} holds it now", String::from_utf8_lossy(&entry.value)),
                            _ => "it is gone".to_string(),
                        }
                    ))),
                    Err(read) if self.renewed.elapsed() < self.ttl * 2 / 3 => {
                        tracing::warn!(lease = %self.key, "could not renew the lease yet (trying again soon): {e}; reading it: {read}");
                        Ok(false)
                    }
                    Err(read) => Err(lost(format!("{e}; reading it: {read}"))),
                }
            }
            // The entry lives `ttl` after the last write the server
            // stored; stopping at two thirds of it leaves room for the
            // batch in hand.
            Err(e) if self.renewed.elapsed() < self.ttl * 2 / 3 => {
                tracing::warn!(lease = %self.key, "could not renew the lease yet (trying again soon): {e}");
                Ok(false)
            }
            Err(e) => Err(lost(format!(
                "{e}; not renewed for {:?} of its {:?}, so it may have lapsed and been taken over",
                self.renewed.elapsed(),
                self.ttl
            ))),
        }
    }

    /// Gives the lease up, so a standby need not wait for it to lapse. Only
    /// deletes it if this holder still holds it.
    pub async fn release(self) {
        if let Err(e) = self
            .kv
            .delete_expect_revision(&self.key, Some(self.revision))
            .await
        {
            tracing::warn!(lease = %self.key, "could not release the lease (it lapses by itself): {e}");
        } else {
            tracing::info!(lease = %self.key, "lease released");
        }
    }
}
