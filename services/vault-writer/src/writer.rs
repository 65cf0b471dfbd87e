//! The vault writer: the brain's `out.vault.write` → `in.vault.written`,
//! an agent's notes into its own memory folder (seed L6.4, L10).
//!
//! **Whose folder.** A write applies only under `memory/<agent>/` of the
//! agent whose stream it came on (the stream's, never what the envelope
//! claims); a path outside it (the operator's `world/`, another agent's
//! memory, `../x.md`, `.obsidian/`) is refused with the reason, as is a
//! CREATE of a note that exists, an `expected_sha256` the note no longer
//! has (both hashes named), and a frontmatter key that would shadow the
//! provenance. A refusal is an answer (`written = false`), never retried.
//!
//! **What is written.** The note with its provenance in the frontmatter
//! (agent, work item, source, stream sequence, the message's time and id):
//! a pure function of the message, its stream sequence and the note's
//! bytes before it, so a replay and a [`rebuild`] give the same bytes.
//!
//! **Atomic and durable.** A hidden temporary beside the note, fsynced,
//! renamed over it, the folder fsynced: a reader sees the old note or the
//! new one, whole, never part of one.
//!
//! **Once per request id.** The brain retries a write under the same
//! request id with a new message id, so the request id is the write's
//! identity. Its record in the `nisse_vault` bucket is written *before*
//! the rename, saying which bytes are intended (their SHA-256), and marked
//! done after it. The order, and what a crash at each point leaves:
//!
//! 1. record `intended` — crash: redelivered, the note is not the intended
//!    one, the write is applied again (the same bytes, from the same
//!    prior note);
//! 2. temporary written, fsynced, renamed, folder fsynced — crash after
//!    the rename: redelivered, the note hashes to the intended SHA-256, so
//!    the rename happened: nothing is written again;
//! 3. git commit (when the vault is a repository) — skipped when nothing
//!    changed, so recovery after 2 commits what a crash left uncommitted;
//! 4. record `done` with the answer — crash: the answer is given again
//!    from the record, touching nothing;
//! 5. the answer published (its id is the request id's, so a second is
//!    dropped as a duplicate), then the message acked.
//!
//! A write is never applied twice nor lost. Writes of one agent are
//! applied one at a time in stream order, so writes to one note apply in
//! the order the brain sent them. What fails for a while (the disk, the
//! bucket) is retried with the consumer's backoff, never answered as
//! refused.
//!
//! Deliberately not here: reading the vault for the agents (the reader),
//! and any judgement of what a note says.

mod compose;
mod disk;
mod git;
mod records;

use std::path::{Path, PathBuf};

use nisse_bus::proto::{VaultWrite, VaultWritten};
use nisse_bus::service::{Context, Service};
use nisse_bus::{
    AgentName, AnyMessage, Bus, ConsumerSpec, Delivery, Handler, Intake, SubjectKind, Unhandled,
};

pub use records::{KvRecords, MemoryRecords, RecordState, Records, WriteRecord};

/// The service; its name is its durable consumer's.
pub const SERVICE: Service = Service {
    name: ConsumerSpec::VAULT_WRITER.name,
    about: "the vault writer: agents' notes into their own memory folders, atomic, once per request",
};

/// Serves every agent of `ctx` until shutdown on its `vault-writer`
/// consumer, one write at a time per agent in stream order, into the
/// vault at `[vault] dir` (made when missing).
pub async fn run(ctx: Context<crate::Config>) -> anyhow::Result<()> {
    let vault = ctx.config.root(&ctx.data_dir);
    let root = vault.clone();
    tokio::task::spawn_blocking(move || disk::make_root(&root))
        .await?
        .map_err(|e| anyhow::anyhow!("making the vault folder {}: {e}", vault.display()))?;
    tracing::info!(vault = %vault.display(), git = ctx.config.git, "writing notes into the vault");
    let history = if ctx.config.git {
        History::Git
    } else {
        History::None
    };
    let handlers = ctx.every_agent(Writer {
        bus: ctx.bus.clone(),
        vault,
        history,
    });
    let intake = Intake {
        consumer: ConsumerSpec::VAULT_WRITER,
        // One at a time, in stream order: writes to one note apply in the
        // order they were sent.
        in_flight: 1,
    };
    nisse_bus::serve(&ctx, intake, handlers).await?;
    Ok(())
}

/// Why a write could not be handled now. Every variant is retried later
/// (the consumer's nak with backoff): none says anything about the write
/// itself, which is answered once it can be applied or refused.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// The vault's disk failed (full, unmounted, permissions): retried,
    /// since an operator can fix it and the write must not be lost.
    #[error("{what} in the vault {vault}: {source}", vault = .vault.display())]
    Io {
        /// What was being done (reading, writing a note).
        what: String,
        /// The vault's folder.
        vault: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The bucket of write records could not be read or written (the bus
    /// is away): retried, since without the record the write could happen
    /// twice.
    #[error("the vault's write records: {0}")]
    Records(String),
    /// Another writer process changed the request id's record meanwhile:
    /// retried, and then answered from what that process recorded.
    #[error("another vault writer is applying request {request_id} now")]
    Conflict {
        /// The request id.
        request_id: String,
    },
}

impl From<WriteError> for Unhandled {
    fn from(e: WriteError) -> Self {
        Unhandled::retry(e)
    }
}

/// How a write ended: what its answer says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// Whether the note has the write's content now.
    pub written: bool,
    /// The note, as the write named it.
    pub path: String,
    /// SHA-256 (hex) of the note after the write (or as it is, when
    /// refused; empty when there is none).
    pub sha256: String,
    /// Why it was refused, when it was.
    pub reason: String,
    /// Answered again from the request id's record: nothing was touched.
    pub repeated: bool,
}

impl Outcome {
    fn written(path: &str, sha256: String) -> Self {
        Self {
            written: true,
            path: path.to_string(),
            sha256,
            reason: String::new(),
            repeated: false,
        }
    }

    fn refused(path: &str, sha256: String, reason: String) -> Self {
        Self {
            written: false,
            path: path.to_string(),
            sha256,
            reason,
            repeated: false,
        }
    }
}

/// Whether applied writes go into the vault's git history.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum History {
    /// Not kept (a rebuild; `[vault] git = false`).
    None,
    /// One commit per applied write when the vault is a git repository.
    Git,
}

/// The writer's answer to `write`.
pub fn answer(write: &VaultWrite, outcome: &Outcome) -> VaultWritten {
    VaultWritten {
        envelope: Some(SERVICE.reply_to(
            write.envelope.as_ref(),
            format!("vault-written:{}", write.request_id),
        )),
        request_id: write.request_id.clone(),
        path: outcome.path.clone(),
        written: outcome.written,
        sha256: outcome.sha256.clone(),
        reason: outcome.reason.clone(),
    }
}

/// Applies `write`, delivered at `stream_seq` of `agent`'s stream, to the
/// vault at `vault`, once per request id by `records` (see the module doc
/// for the order and what a crash leaves). The one implementation of a
/// write, for the service and for [`rebuild`].
pub async fn apply<R: Records>(
    vault: &Path,
    agent: &AgentName,
    write: &VaultWrite,
    stream_seq: u64,
    records: &mut R,
    history: History,
) -> Result<Outcome, WriteError> {
    let message_id = write
        .envelope
        .as_ref()
        .map(|e| e.message_id.as_str())
        .unwrap_or_default();
    if write.request_id.is_empty() {
        // No identity to keep it once by, and no request to answer.
        return Ok(Outcome::refused(
            &write.path,
            String::new(),
            "the write has no request id".into(),
        ));
    }
    let found = records.read(&write.request_id).await?;
    let revision = match &found {
        Some((record, _)) if record.state == RecordState::Done => return Ok(record.outcome()),
        Some((_, revision)) => Some(*revision),
        None => None,
    };
    // A refusal is an answer like any other: recorded, so the request id
    // is answered the same however often it comes.
    let refuse = async |outcome: Outcome, records: &mut R| {
        let record = WriteRecord::done(&write.request_id, message_id, &outcome);
        records.write(&record, revision).await?;
        Ok(outcome)
    };
    let path = match compose::check_path(agent, write) {
        Ok(path) => path,
        Err(reason) => {
            return refuse(
                Outcome::refused(&write.path, String::new(), reason),
                records,
            )
            .await;
        }
    };
    let rel = path.to_string();
    let prior = read(vault, &rel).await?;
    let prior_sha = match &prior {
        disk::Found::Note(bytes) => nisse_vault::note::sha256_hex(bytes),
        _ => String::new(),
    };
    if let Some((record, revision)) = &found
        && record.state == RecordState::Intended
        && !record.sha256.is_empty()
        && record.sha256 == prior_sha
    {
        // The rename happened before a crash: only the rest is left.
        commit(vault, agent, write, &rel, history).await;
        let outcome = Outcome::written(&write.path, prior_sha);
        let done = WriteRecord::done(&write.request_id, message_id, &outcome);
        records.write(&done, Some(*revision)).await?;
        return Ok(outcome);
    }
    let composed = match compose::compose(agent, &path, write, stream_seq, &prior) {
        Ok(c) => c,
        Err(reason) => {
            return refuse(Outcome::refused(&write.path, prior_sha, reason), records).await;
        }
    };
    let intended =
        WriteRecord::intended(&write.request_id, message_id, &write.path, &composed.sha256);
    let revision = records.write(&intended, revision).await?;
    let tag = nisse_bus::key_hash(&write.request_id);
    let (root, target, bytes) = (vault.to_path_buf(), rel.clone(), composed.bytes);
    tokio::task::spawn_blocking(move || disk::put(&root, &target, &bytes, &tag[..12]))
        .await
        .map_err(|e| io_error(vault, &rel, "writing", std::io::Error::other(e)))?
        .map_err(|e| io_error(vault, &rel, "writing", e))?;
    commit(vault, agent, write, &rel, history).await;
    let outcome = Outcome::written(&write.path, composed.sha256);
    let done = WriteRecord::done(&write.request_id, message_id, &outcome);
    records.write(&done, Some(revision)).await?;
    Ok(outcome)
}

/// What is at `rel` in the vault now.
async fn read(vault: &Path, rel: &str) -> Result<disk::Found, WriteError> {
    let (root, target) = (vault.to_path_buf(), rel.to_string());
    tokio::task::spawn_blocking(move || disk::read(&root, &target))
        .await
        .map_err(|e| io_error(vault, rel, "reading", std::io::Error::other(e)))?
        .map_err(|e| io_error(vault, rel, "reading", e))
}

fn io_error(vault: &Path, rel: &str, doing: &str, source: std::io::Error) -> WriteError {
    WriteError::Io {
        what: format!("{doing} {rel}"),
        vault: vault.to_path_buf(),
        source,
    }
}

/// Commits the note when history is kept (see [`git`]).
async fn commit(vault: &Path, agent: &AgentName, write: &VaultWrite, rel: &str, history: History) {
    if history == History::None {
        return;
    }
    let work_item = write
        .envelope
        .as_ref()
        .map(|e| e.work_item_id.as_str())
        .unwrap_or_default();
    let change = git::Change {
        agent,
        work_item,
        source: &write.source,
        path: rel,
    };
    git::commit(vault, change).await;
}

/// The handler: one write, one answer.
struct Writer {
    bus: Bus,
    vault: PathBuf,
    history: History,
}

impl Handler<VaultWrite> for Writer {
    async fn handle(
        &self,
        agent: &AgentName,
        delivery: &Delivery<VaultWrite>,
    ) -> Result<(), Unhandled> {
        let write = delivery.message();
        let mut records = KvRecords::new(self.bus.clone(), agent.clone());
        let outcome = apply(
            &self.vault,
            agent,
            write,
            delivery.stream_sequence(),
            &mut records,
            self.history,
        )
        .await?;
        if outcome.written {
            tracing::debug!(
                request = %write.request_id,
                path = %outcome.path,
                repeated = outcome.repeated,
                "written"
            );
        } else {
            tracing::info!(
                request = %write.request_id,
                path = %outcome.path,
                "refused: {}",
                outcome.reason
            );
        }
        let published = self
            .bus
            .publish(answer(write, &outcome))
            .await
            .map_err(|e| Unhandled::retry(format!("publishing the answer: {e}")))?;
        if published.duplicate {
            tracing::debug!(request = %write.request_id, "the answer was on the stream already");
        }
        Ok(())
    }
}

/// What [`rebuild`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RebuildReport {
    /// Writes on the stream (every `out.vault.write` that decoded).
    pub writes: u64,
    /// Writes that applied.
    pub written: u64,
    /// Writes refused, with their reasons, as the service answered them.
    pub refused: u64,
    /// Writes of a request id seen before (a retry): answered from its
    /// record, nothing written.
    pub repeated: u64,
}

/// Regenerates every note `agent` wrote from its whole stream into `into`,
/// which must be empty (made when missing): every `out.vault.write`
/// applied in stream order, through [`apply`] as the service does, with
/// records in memory and no git history. The notes come out byte for byte
/// as the service wrote them (notes the operator edited in between, and
/// writes the service dead-lettered, are the exceptions: neither is in
/// the stream as applied).
pub async fn rebuild(bus: &Bus, agent: &AgentName, into: &Path) -> anyhow::Result<RebuildReport> {
    let target = into.to_path_buf();
    let nonempty = tokio::task::spawn_blocking(move || -> std::io::Result<bool> {
        disk::make_root(&target)?;
        Ok(std::fs::read_dir(&target)?.next().is_some())
    })
    .await?
    .map_err(|e| anyhow::anyhow!("preparing {} for the rebuild: {e}", into.display()))?;
    if nonempty {
        anyhow::bail!(
            "{} is not empty; the vault is rebuilt into an empty folder only",
            into.display()
        );
    }
    let mut records = MemoryRecords::default();
    let mut report = RebuildReport::default();
    let mut reader = bus.read_range(agent, 1, None).await?;
    while let Some(stored) = reader.next().await {
        let stored = stored?;
        if !matches!(SubjectKind::parse(&stored.subject), Some((a, SubjectKind::VaultWrite)) if &a == agent)
        {
            continue;
        }
        // What the service's consumer dead-letters (undecodable, invalid,
        // another agent's envelope) never reached it: skipped here too.
        let Ok(AnyMessage::VaultWrite(write)) = stored.decode() else {
            continue;
        };
        if write.envelope.as_ref().map(|e| e.agent.as_str()) != Some(agent.as_str()) {
            continue;
        }
        report.writes += 1;
        let outcome = apply(
            into,
            agent,
            &write,
            stored.sequence,
            &mut records,
            History::None,
        )
        .await?;
        if outcome.repeated {
            report.repeated += 1;
        } else if outcome.written {
            report.written += 1;
        } else {
            report.refused += 1;
        }
    }
    Ok(report)
}
