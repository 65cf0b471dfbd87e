//! The Matrix service (seed Nisse L5): each agent's room, to and from the
//! agent's stream.
//!
//! - **In**: every event of the agent's room (messages, reactions,
//!   redactions, membership), other than the agent's own, becomes one
//!   `MatrixEventReceived` on `nisse.<agent>.in.matrix` with the Matrix
//!   event id as its dedup id. The sync position is kept in the memo
//!   bucket and moved only after every event of a sync response is stored
//!   on the stream, so a restart neither loses events nor re-takes them
//!   (a re-taken one would be dropped as a duplicate anyway).
//!   A reply in a work item's thread, and a reaction to a message the
//!   agent posted for an item, carry that item's id; a reaction to an
//!   approval request carries the plan revision the message showed. The
//!   brain decides what the event means.
//! - **Attachments by reference**: a file, image, video or sound
//!   (`m.file`, `m.image`, `m.video`, `m.audio`) is recorded as a
//!   `MatrixAttachment`: its `mxc://` URL, name, declared MIME type and
//!   size, and the SHA-256 of its plaintext content, which the service
//!   downloads (and, in an encrypted room, decrypts: the SDK checks the
//!   ciphertext against the event's own hash meanwhile) only to hash it;
//!   nothing is kept. One declared or found larger than `attachment-max`,
//!   or whose download fails or outlasts `attachment-timeout`, is still
//!   recorded, without a hash and with the reason in `error`: the message
//!   always goes on.
//! - **Out**: each `Tell` from `out.tell` (what the agent tells the
//!   operator, said once for every channel), in order, in the agent's
//!   room, with a Matrix transaction id derived from its message id, so a
//!   redelivered message is not posted twice. A Tell that opens an item's
//!   conversation becomes the item's thread root, or hangs the thread from
//!   the operator's Matrix message the item started from (`started_from`);
//!   the item's later Tells go in its thread, and one about no item goes
//!   at the room's top level. Facts and progress are posted as `m.notice`;
//!   questions, approval requests and results, which want the operator's
//!   attention, as `m.text`. A Tell whose `only` names other channels (a
//!   ticket catching up) is acknowledged and not posted. Markdown is
//!   rendered to HTML (`formatted_body`) beside the plain body.
//! - **Outages delay, never fail**: while the homeserver is away, sync and
//!   sending retry with exponential backoff capped at `backoff-max`,
//!   forever, logging once when it goes away and once when it is back;
//!   rate limits are waited out for as long as the server says. Nothing
//!   is acked before it is posted, so queued messages go out in order.
//! - **A refusal does not block the room**: a message the homeserver
//!   refuses for good (too large, forbidden, malformed: see `refusal`) is
//!   sent `refused-attempts` times, then a short `m.notice` takes its place
//!   (same thread) saying why and how to read it, and it is dead-lettered
//!   through the service skeleton; the next message goes out.

pub mod config;
mod refusal;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use matrix_sdk::config::{RequestConfig, SyncSettings};
use matrix_sdk::media::{MediaFormat, MediaRequestParameters};
use matrix_sdk::ruma::api::client::filter::{FilterDefinition, RoomEventFilter, RoomFilter};
use matrix_sdk::ruma::api::client::sync::sync_events::v3::Filter;
use matrix_sdk::ruma::events::room::MediaSource;
use matrix_sdk::ruma::events::room::message::FormattedBody;
use matrix_sdk::ruma::{OwnedTransactionId, RoomOrAliasId, TransactionId};
use matrix_sdk::{Client, Room};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use nisse_bus::proto::{self, Envelope, MatrixEventKind, MatrixEventReceived, Tell, TellKind};
use nisse_bus::secret::{Secret, SecretString};
use nisse_bus::service::{Context, Service};
use nisse_bus::topology::MEMO_BUCKET;
use nisse_bus::{
    AgentName, Backoff, Bus, ConsumerSpec, Delivery, Handler, Intake, Persist, Unhandled, kv_key,
};

use crate::config::{AgentConfig, Config, store_dir};
use crate::refusal::{Refusal, SendFailure};

/// The service.
pub const SERVICE: Service = Service {
    name: "intake-matrix",
    about: "each agent's Matrix room to and from its stream: a thread per work item",
};

/// The first wait of a loop retrying the homeserver; it doubles up to
/// `matrix.backoff-max`.
const FIRST_WAIT: Duration = Duration::from_millis(250);

/// Why the service cannot run for an agent (bad settings, a refused
/// login): reported, never retried blindly.
#[derive(Debug, thiserror::Error)]
pub enum MatrixError {
    /// Settings or files are wrong.
    #[error("{0}")]
    Setup(String),
    /// The homeserver answered, but not as hoped.
    #[error("{0}")]
    Matrix(matrix_sdk::Error),
    /// The homeserver could not be reached: worth trying again.
    #[error("{0}")]
    Unreachable(String),
    /// The bus failed.
    #[error("{0}")]
    Bus(#[from] nisse_bus::Error),
}

impl From<matrix_sdk::Error> for MatrixError {
    fn from(e: matrix_sdk::Error) -> Self {
        if is_transport(&e) {
            Self::Unreachable(e.to_string())
        } else {
            Self::Matrix(e)
        }
    }
}

/// Whether the error is the network's, not the homeserver's answer.
fn is_transport(e: &matrix_sdk::Error) -> bool {
    matches!(
        e,
        matrix_sdk::Error::Http(h) if matches!(**h, matrix_sdk::HttpError::Reqwest(_))
    )
}

/// Runs the Matrix side of every configured agent of `ctx` until
/// shutdown: each agent's room synced onto its stream, and what it tells
/// the operator (`out.tell`) posted one at a time, in order, on the
/// service skeleton. Agents without Matrix settings are skipped with a warning.
pub async fn run(ctx: Context<Config>) -> anyhow::Result<()> {
    let config = &ctx.config;
    let mut inbound = tokio::task::JoinSet::new();
    let mut outbound = Vec::new();
    for agent in &ctx.agents {
        let Some(cfg) = config.agents.get(agent.as_str()).cloned() else {
            tracing::warn!(%agent, "no Matrix settings for agent `{agent}` (matrix.agents.{agent}): its room is not served");
            continue;
        };
        // An unreachable homeserver delays the start; it never fails it.
        let mut trouble = Persist::new("reach the homeserver", config.backoff());
        let side = loop {
            match AgentSide::connect(&ctx, agent, &cfg).await {
                Ok(side) => break side,
                Err(MatrixError::Unreachable(why)) => {
                    tokio::select! {
                        () = ctx.shutdown.cancelled() => return Ok(()),
                        () = trouble.failed(&why) => {}
                    }
                }
                Err(e) => return Err(e.into()),
            }
        };
        trouble.succeeded();
        let side = Arc::new(side);
        let (a, s) = (side.clone(), ctx.shutdown.clone());
        inbound.spawn(async move { a.inbound(&s).await });
        outbound.push((agent.clone(), side));
    }
    let started: Vec<String> = outbound.iter().map(|(a, _)| a.to_string()).collect();
    tracing::info!(agents = ?started, "Matrix rooms served");
    let intake = Intake {
        consumer: ConsumerSpec::MATRIX_TELL,
        // One at a time: the room shows them in stream order.
        in_flight: 1,
    };
    let sending = nisse_bus::serve(&ctx, intake, outbound);
    tokio::pin!(sending);
    loop {
        tokio::select! {
            sent = &mut sending => {
                sent?;
                break;
            }
            Some(done) = inbound.join_next() => match done {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err(e.into()),
                Err(e) => anyhow::bail!("a Matrix sync task panicked: {e}"),
            },
        }
    }
    while let Some(done) = inbound.join_next().await {
        if let Ok(Err(e)) = done {
            return Err(e.into());
        }
    }
    Ok(())
}

/// A saved login, so a restart reuses the same device (its encryption
/// keys belong to it).
#[derive(Debug, Serialize, Deserialize)]
struct SavedSession {
    user_id: String,
    device_id: String,
    /// Printed masked: a log line never shows it.
    access_token: SecretString,
}

/// Where an item's thread lives, and which plan revision a message showed.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Posted {
    work_item_id: String,
    #[serde(default)]
    plan_revision: u32,
}

/// A message the homeserver refused for good, noted (`refused` memo) before
/// the notice and the dead letter, so a redelivery repeats neither the
/// attempts nor the decision.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Refused {
    refusal: Refusal,
    /// Sends the homeserver refused.
    attempts: u32,
}

/// One agent's Matrix identity, room and notes.
struct AgentSide {
    agent: AgentName,
    client: Client,
    room: Room,
    own_user: String,
    sync_timeout: Duration,
    /// How the service waits for a homeserver that is away.
    backoff: Backoff,
    /// Sends of a message the homeserver refuses for good before it is
    /// dead-lettered (`matrix.refused-attempts`).
    refused_attempts: u32,
    /// The largest attachment downloaded to hash (`matrix.attachment-max`).
    attachment_max: u64,
    /// The longest an attachment's download may take
    /// (`matrix.attachment-timeout`).
    attachment_timeout: Duration,
    bus: Bus,
    /// The service's shutdown: a post waiting out an outage gives up.
    shutdown: CancellationToken,
}

impl Handler<Tell> for AgentSide {
    async fn handle(&self, _agent: &AgentName, delivery: &Delivery<Tell>) -> Result<(), Unhandled> {
        self.deliver(delivery).await
    }
}

fn read_secret(path: &Path, what: &str) -> Result<String, MatrixError> {
    Secret::File(path.to_path_buf())
        .read_text()
        .map_err(|e| MatrixError::Setup(format!("the {what}: {e}")))
}

impl AgentSide {
    async fn connect(
        ctx: &Context<Config>,
        agent: &AgentName,
        cfg: &AgentConfig,
    ) -> Result<Self, MatrixError> {
        let (bus, config, data_dir, shutdown) =
            (&ctx.bus, &ctx.config, &ctx.data_dir, &ctx.shutdown);
        let dir = store_dir(data_dir, agent.as_str());
        std::fs::create_dir_all(&dir)
            .map_err(|e| MatrixError::Setup(format!("cannot create {}: {e}", dir.display())))?;
        let client = Client::builder()
            .homeserver_url(&config.homeserver)
            .sqlite_store(dir.join("store"), None)
            // Our own loops retry, with backoff and logging; the SDK tries
            // a couple of times within one call.
            .request_config(RequestConfig::new().retry_limit(2))
            .build()
            .await
            .map_err(|e| MatrixError::Setup(format!("the Matrix client for {agent}: {e}")))?;
        let session_path = dir.join("session.json");
        let session = match std::fs::read(&session_path) {
            Ok(bytes) => Some(serde_json::from_slice::<SavedSession>(&bytes).map_err(|e| {
                MatrixError::Setup(format!(
                    "{} is not a saved session: {e}",
                    session_path.display()
                ))
            })?),
            Err(_) => None,
        };
        // A password login logs the client in itself; a saved session or an
        // access token is restored onto it.
        let (session, logged_in) = match session {
            Some(s) => (s, false),
            None => {
                let (s, logged_in) = login(&client, &config.homeserver, cfg).await?;
                write_private(&session_path, &serde_json::to_vec(&s).unwrap_or_default())?;
                (s, logged_in)
            }
        };
        let restore =
            matrix_sdk::authentication::matrix::MatrixSession {
                meta: matrix_sdk::SessionMeta {
                    user_id: session.user_id.as_str().try_into().map_err(|e| {
                        MatrixError::Setup(format!("user id {}: {e}", session.user_id))
                    })?,
                    device_id: session.device_id.as_str().into(),
                },
                tokens: matrix_sdk::SessionTokens {
                    access_token: session.access_token.expose().to_string(),
                    refresh_token: None,
                },
            };
        if !logged_in {
            client.restore_session(restore).await?;
        }
        let target = <&RoomOrAliasId>::try_from(cfg.room.as_str()).map_err(|e| {
            MatrixError::Setup(format!("matrix.agents.{agent}.room `{}`: {e}", cfg.room))
        })?;
        let room = match client.join_room_by_id_or_alias(target, &[]).await {
            Ok(room) => room,
            Err(e) if cfg.room.starts_with('#') && is_not_found(&e) => {
                create_room(&client, cfg).await?
            }
            Err(e) if is_transport(&e) => return Err(MatrixError::Unreachable(e.to_string())),
            Err(e) => {
                return Err(MatrixError::Setup(format!(
                    "the agent {agent} cannot join its room {}: {e}",
                    cfg.room
                )));
            }
        };
        // The first start takes the room from now on: its earlier history
        // (old commands included) is not the operator talking to the agent.
        // Placed before anything is posted, so nothing said after the start
        // can fall before the cursor.
        let since_key = kv_key(agent, &["since"]);
        if bus.kv_get(MEMO_BUCKET, &since_key).await?.is_none() {
            let first = client
                .sync_once(
                    SyncSettings::new()
                        .filter(Filter::FilterDefinition(room_filter(room.room_id()))),
                )
                .await?;
            bus.kv_put(MEMO_BUCKET, &since_key, first.next_batch.into_bytes())
                .await?;
            tracing::info!(%agent, "first start in this room: its earlier history is not taken up");
        }
        // What an operator compares to verify the agent's device by hand
        // (see the README): its Ed25519 fingerprint.
        let fingerprint = client.encryption().ed25519_key().await.unwrap_or_default();
        tracing::info!(%agent, room = %room.room_id(), user = %session.user_id, device = %session.device_id, %fingerprint, "in its Matrix room");
        Ok(Self {
            agent: agent.clone(),
            client,
            room,
            own_user: session.user_id,
            sync_timeout: config.sync_timeout,
            backoff: config.backoff(),
            refused_attempts: config.refused_attempts,
            attachment_max: config.attachment_max.as_u64(),
            attachment_timeout: config.attachment_timeout,
            bus: bus.clone(),
            shutdown: shutdown.clone(),
        })
    }

    fn key(&self, parts: &[&str]) -> String {
        kv_key(&self.agent, parts)
    }

    /// The note under `parts`, if any.
    async fn memo(&self, parts: &[&str]) -> nisse_bus::Result<Option<Vec<u8>>> {
        self.bus.kv_get(MEMO_BUCKET, &self.key(parts)).await
    }

    /// Writes the note under `parts`.
    async fn set_memo(&self, parts: &[&str], value: Vec<u8>) -> nisse_bus::Result<()> {
        self.bus.kv_put(MEMO_BUCKET, &self.key(parts), value).await
    }

    async fn posted(&self, kind: &str, event_id: &str) -> Option<Posted> {
        let bytes = self.memo(&[kind, event_id]).await.ok()??;
        serde_json::from_slice(&bytes).ok()
    }

    /// The sync loop: events of the room onto the stream, then the cursor.
    async fn inbound(&self, shutdown: &CancellationToken) -> Result<(), MatrixError> {
        let bus = &self.bus;
        let mut since = self
            .memo(&["since"])
            .await?
            .map(|b| String::from_utf8_lossy(&b).into_owned());
        let filter = room_filter(self.room.room_id());
        let mut backoff = Persist::new("sync with the homeserver", self.backoff);
        loop {
            let mut settings = SyncSettings::new()
                .timeout(self.sync_timeout)
                .filter(Filter::FilterDefinition(filter.clone()));
            if let Some(token) = &since {
                settings = settings.token(token.clone());
            }
            let response = tokio::select! {
                () = shutdown.cancelled() => return Ok(()),
                r = self.client.sync_once(settings) => r,
            };
            let response = match response {
                Ok(r) => r,
                Err(e) => {
                    if is_auth_error(&e) {
                        return Err(MatrixError::Setup(format!(
                            "the homeserver no longer accepts the agent {}'s login: {e}",
                            self.agent
                        )));
                    }
                    let why = e.to_string();
                    tokio::select! {
                        () = shutdown.cancelled() => return Ok(()),
                        () = backoff.failed(&why) => {}
                    }
                    continue;
                }
            };
            backoff.succeeded();
            if let Some(update) = response.rooms.joined.get(self.room.room_id()) {
                if update.timeline.limited && since.is_some() {
                    tracing::warn!(agent = %self.agent, "the sync skipped part of the room's history (more than 100 events since the last one); the skipped events are not taken up");
                }
                for event in &update.timeline.events {
                    let json: serde_json::Value = match event.raw().deserialize_as() {
                        Ok(v) => v,
                        Err(e) => {
                            tracing::warn!(agent = %self.agent, "an event of the room does not parse: {e}");
                            continue;
                        }
                    };
                    if let Some(msg) = self.received(&json).await {
                        // Stored before the cursor moves: a crash here
                        // re-takes the event, and JetStream drops it.
                        loop {
                            match bus.publish(msg.clone()).await {
                                Ok(_) => break,
                                Err(e) => {
                                    let why = format!("storing a Matrix event: {e}");
                                    tokio::select! {
                                        () = shutdown.cancelled() => return Ok(()),
                                        () = backoff.failed(&why) => {}
                                    }
                                }
                            }
                        }
                    }
                }
            }
            self.set_memo(&["since"], response.next_batch.clone().into_bytes())
                .await?;
            since = Some(response.next_batch);
        }
    }

    /// The stream message for one room event; `None` for the agent's own
    /// events and kinds the brain has no use for.
    async fn received(&self, event: &serde_json::Value) -> Option<MatrixEventReceived> {
        let s = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_string();
        let sender = s(&event["sender"]);
        if sender == self.own_user {
            return None;
        }
        let event_id = s(&event["event_id"]);
        if event_id.is_empty() {
            return None;
        }
        let content = &event["content"];
        let relates = &content["m.relates_to"];
        let kind = match event["type"].as_str()? {
            "m.room.message" => MatrixEventKind::Message,
            "m.reaction" => MatrixEventKind::Reaction,
            "m.room.redaction" => MatrixEventKind::Redaction,
            "m.room.member" => MatrixEventKind::Membership,
            "m.room.encrypted" => {
                tracing::warn!(agent = %self.agent, event = %event_id, %sender, "an encrypted event could not be decrypted (is the agent's device verified and given the room key?)");
                return None;
            }
            _ => return None,
        };
        let thread_root = if relates["rel_type"] == "m.thread" {
            s(&relates["event_id"])
        } else {
            String::new()
        };
        let relates_to = match kind {
            MatrixEventKind::Reaction => s(&relates["event_id"]),
            MatrixEventKind::Redaction => {
                let r = s(&event["redacts"]);
                if r.is_empty() {
                    s(&content["redacts"])
                } else {
                    r
                }
            }
            _ => String::new(),
        };
        // Which work item: a thread root or a message the agent posted for
        // one, reacted to or replied to (a reply outside the thread, as
        // clients without threads send, is about the message's item).
        let in_reply_to = s(&relates["m.in_reply_to"]["event_id"]);
        let mut work_item_id = String::new();
        let mut revision = 0;
        for candidate in [&thread_root, &relates_to, &in_reply_to] {
            if candidate.is_empty() {
                continue;
            }
            if let Some(p) = self.posted("posted", candidate).await {
                work_item_id = p.work_item_id;
                revision = p.plan_revision;
                break;
            }
        }
        let mut attachments = Vec::new();
        if kind == MatrixEventKind::Message
            && let Some((mut attachment, source)) = described_attachment(content)
        {
            if let Some(source) = source {
                self.hash_attachment(&mut attachment, source).await;
            }
            attachments.push(attachment);
        }
        Some(MatrixEventReceived {
            envelope: Some(Envelope {
                agent: self.agent.to_string(),
                work_item_id,
                actor: Some(proto::Actor {
                    kind: proto::ActorKind::External as i32,
                    id: sender.clone(),
                }),
                message_id: format!("matrix:{event_id}"),
                ..Default::default()
            }),
            room_id: self.room.room_id().to_string(),
            event_id,
            sender,
            origin_server_ts: event["origin_server_ts"].as_i64().unwrap_or_default(),
            kind: kind as i32,
            body: s(&content["body"]),
            formatted_body: s(&content["formatted_body"]),
            thread_root_event_id: thread_root,
            in_reply_to_event_id: in_reply_to,
            relates_to_event_id: relates_to,
            reaction_key: if kind == MatrixEventKind::Reaction {
                s(&relates["key"])
            } else {
                String::new()
            },
            reacted_plan_revision: if kind == MatrixEventKind::Reaction {
                revision
            } else {
                0
            },
            attachments,
        })
    }

    /// Downloads an attachment's content to put its SHA-256 in
    /// `attachment`, within `attachment-max` and `attachment-timeout`;
    /// otherwise says in `error` why there is none. Never fails: the
    /// message is recorded either way.
    async fn hash_attachment(&self, attachment: &mut proto::MatrixAttachment, source: MediaSource) {
        use sha2::Digest as _;
        let max = self.attachment_max;
        if attachment.size > max {
            attachment.error = format!(
                "not downloaded: it is declared {} bytes, over matrix.attachment-max ({max} bytes)",
                attachment.size
            );
            return;
        }
        let request = MediaRequestParameters {
            source,
            format: MediaFormat::File,
        };
        // Not cached: the content is only hashed, never kept.
        let media = self.client.media();
        let download = media.get_media_content(&request, false);
        let content = match tokio::time::timeout(self.attachment_timeout, download).await {
            Err(_) => {
                attachment.error = format!(
                    "the download took longer than matrix.attachment-timeout ({:?})",
                    self.attachment_timeout
                );
                return;
            }
            Ok(Err(e)) => {
                attachment.error = format!("the download failed: {e}");
                return;
            }
            Ok(Ok(content)) => content,
        };
        // A declared size can be wrong; the content's own length counts.
        attachment.size = content.len() as u64;
        if attachment.size > max {
            attachment.error = format!(
                "not hashed: its content is {} bytes, over matrix.attachment-max ({max} bytes)",
                attachment.size
            );
            return;
        }
        let digest = sha2::Sha256::digest(&content);
        attachment.sha256 = digest.iter().map(|b| format!("{b:02x}")).collect();
    }

    /// Posts one Tell in the agent's room, retrying until it is posted,
    /// refused for good (then a notice goes in its place and it is
    /// dead-lettered), or the service stops (then it is left for
    /// redelivery). One only for other channels is acknowledged unposted.
    async fn deliver(&self, delivery: &Delivery<Tell>) -> Result<(), Unhandled> {
        let msg = delivery.message();
        if !for_matrix(msg) {
            return Ok(());
        }
        let env = msg.envelope.clone().unwrap_or_default();
        let id = env.message_id.as_str();
        let sent = ["sent", id];
        if self.memo(&sent).await?.is_some() {
            return Ok(());
        }
        let item = env.work_item_id.as_str();
        // About no item: the room's top level, whatever else it says.
        let thread_root = if item.is_empty() {
            None
        } else if let Some(root) = matrix_start(msg) {
            Some(root.to_string())
        } else if !msg.opens_conversation {
            self.memo(&["thread", item])
                .await?
                .map(|b| String::from_utf8_lossy(&b).into_owned())
        } else {
            None
        };
        let room = &self.room;
        // Only an approval request's revision is remembered: a reaction to
        // any other message decides no plan.
        let plan_revision = if msg.kind() == TellKind::ApprovalRequest {
            msg.plan_revision
        } else {
            0
        };
        // Refused on an earlier delivery (the process stopped before the
        // dead letter was stored): the decision stands, so a message the
        // room was told is missing never turns up after all.
        let earlier = self
            .memo(&["refused", id])
            .await?
            .and_then(|b| serde_json::from_slice::<Refused>(&b).ok());
        let refused = match earlier {
            Some(refused) => refused,
            None => {
                let content =
                    message_content(is_notice(msg), &msg.markdown, thread_root.as_deref());
                // The same message id always gives the same transaction id:
                // the homeserver drops a repeated send instead of posting it
                // twice.
                let txn = transaction_id(id);
                match self
                    .send(room, &content, &txn, self.refused_attempts)
                    .await?
                {
                    Ok(event_id) => {
                        let opened = msg
                            .opens_conversation
                            .then_some(thread_root.as_deref().unwrap_or(event_id.as_str()));
                        self.note_posted(&event_id, item, plan_revision, opened)
                            .await?;
                        if plan_revision > 0 {
                            self.report_posted(&env, plan_revision, &event_id).await?;
                        }
                        // Notes and the report first, then "sent": a crash
                        // in between posts again under the same transaction
                        // id, which the homeserver drops, and reports again
                        // under the same message id, which JetStream drops.
                        self.set_memo(&sent, event_id.into_bytes()).await?;
                        return Ok(());
                    }
                    Err(refused) => {
                        let note = serde_json::to_vec(&refused).unwrap_or_default();
                        self.set_memo(&["refused", id], note).await?;
                        refused
                    }
                }
            }
        };
        self.notice_refused(delivery, room, thread_root.as_deref(), &refused)
            .await?;
        Err(Unhandled::dead_letter(refusal::reason(
            id,
            &refused.refusal,
            refused.attempts,
        )))
    }

    /// Tells the brain that the approval request `tell` of `revision` is in
    /// the room (the homeserver accepted it as `event_id`): a bare
    /// `approve` in Matrix binds only a revision whose request was, so it
    /// never lands on one the operator could not have seen yet. A request
    /// refused for good is never reported.
    async fn report_posted(
        &self,
        tell: &Envelope,
        revision: u32,
        event_id: &str,
    ) -> Result<(), Unhandled> {
        let message_id = format!("posted:matrix:{}", tell.message_id);
        let report = proto::TellPosted {
            envelope: Some(SERVICE.reply_to(Some(tell), message_id)),
            channel: "matrix".into(),
            tell_message_id: tell.message_id.clone(),
            plan_revision: revision,
            posted_id: event_id.to_string(),
        };
        self.bus.publish(report).await?;
        Ok(())
    }

    /// Posts, where the refused message would have gone, a notice that it
    /// could not be posted, once: its transaction id and `sent` memo derive
    /// from the refused message's id. A notice opens the item's thread in
    /// place of a refused thread root, so the item's later messages and
    /// the operator's replies still share one. A notice refused in turn
    /// is only logged, and noted so it is never tried again; only a stop
    /// or an outage meanwhile leaves it to a redelivery.
    async fn notice_refused(
        &self,
        delivery: &Delivery<Tell>,
        room: &Room,
        thread_root: Option<&str>,
        refused: &Refused,
    ) -> Result<(), Unhandled> {
        let msg = delivery.message();
        let env = delivery.envelope();
        let notice_id = format!("refused:{}", env.message_id);
        let sent = ["sent", notice_id.as_str()];
        if self.memo(&sent).await?.is_some() {
            return Ok(());
        }
        let text = refusal::notice(
            self.agent.as_str(),
            &env.message_id,
            delivery.stream_sequence(),
            &refused.refusal,
        );
        let content = message_content(true, &text, thread_root);
        match self
            .send(room, &content, &transaction_id(&notice_id), 1)
            .await?
        {
            Ok(event_id) => {
                // Revision 0: a reaction to the notice approves nothing.
                let opened = msg
                    .opens_conversation
                    .then(|| thread_root.unwrap_or(&event_id));
                self.note_posted(&event_id, &env.work_item_id, 0, opened)
                    .await?;
                self.set_memo(&sent, event_id.into_bytes()).await?;
            }
            Err(again) => {
                tracing::warn!(agent = %self.agent, "the notice that a message could not be posted was refused too, {}; it is not sent again", again.refusal);
                // Noted as done, with no event: a redelivery of the refused
                // message does not try the notice again.
                self.set_memo(&sent, Vec::new()).await?;
            }
        }
        Ok(())
    }

    /// Sends `content` under `txn` until it is posted (`Ok(Ok(event id))`)
    /// or refused for good `attempts` times (`Ok(Err(..))`). Outages and
    /// the homeserver's own errors are retried with backoff and rate limits
    /// waited out, however long; `Err` only when the service stops
    /// meanwhile, handing the message back.
    async fn send(
        &self,
        room: &Room,
        content: &serde_json::Value,
        txn: &TransactionId,
        attempts: u32,
    ) -> Result<Result<String, Refused>, Unhandled> {
        let mut trouble = Persist::new("post to the agent's room", self.backoff);
        let mut refusals = 0;
        loop {
            // Retried here, not inside the SDK: a rate limit is waited out
            // for exactly as long as the homeserver asks, and logged.
            let attempt = room
                .send_raw("m.room.message", content.clone())
                .with_transaction_id(txn)
                .with_request_config(RequestConfig::new().disable_retry())
                .await;
            let failure = match attempt {
                Ok(r) => {
                    trouble.succeeded();
                    return Ok(Ok(r.response.event_id.to_string()));
                }
                Err(e) => refusal::classify(&e),
            };
            let wait = async {
                match failure {
                    SendFailure::RateLimited(d) => {
                        tracing::info!(agent = %self.agent, "rate-limited by the homeserver; waiting {d:?}");
                        tokio::time::sleep(d).await;
                        None
                    }
                    SendFailure::Transient(why) => {
                        trouble.failed(&why).await;
                        None
                    }
                    SendFailure::Refused(refusal) => {
                        refusals += 1;
                        if refusals >= attempts {
                            return Some(Refused {
                                refusal,
                                attempts: refusals,
                            });
                        }
                        tracing::warn!(agent = %self.agent, "the homeserver refused the message, {refusal}; sending it again ({refusals} of {attempts} attempts)");
                        tokio::time::sleep(self.backoff.delay(refusals - 1)).await;
                        None
                    }
                }
            };
            tokio::select! {
                () = self.shutdown.cancelled() => {
                    return Err(Unhandled::retry_after("the service is stopping", Duration::ZERO));
                }
                given_up = wait => if let Some(refused) = given_up {
                    return Ok(Err(refused));
                },
            }
        }
    }

    /// Notes what a posted event belongs to: its item (replies and
    /// reactions to it are stamped with the item and `plan_revision`) and,
    /// when it opened the item's thread, the thread's root (`opened`: the
    /// event itself, or the operator's message it hangs from, which then
    /// belongs to the item too).
    async fn note_posted(
        &self,
        event_id: &str,
        item: &str,
        plan_revision: u32,
        opened: Option<&str>,
    ) -> nisse_bus::Result<()> {
        if item.is_empty() {
            return Ok(());
        }
        let posted = serde_json::to_vec(&Posted {
            work_item_id: item.to_string(),
            plan_revision,
        })
        .unwrap_or_default();
        self.set_memo(&["posted", event_id], posted.clone()).await?;
        if let Some(root) = opened {
            if root != event_id {
                self.set_memo(&["posted", root], posted).await?;
            }
            self.set_memo(&["thread", item], root.as_bytes().to_vec())
                .await?;
        }
        Ok(())
    }
}

/// The channel name this service renders for, in a Tell's `only` and
/// `started_from`.
const MATRIX_CHANNEL: &str = "matrix";

/// Whether `tell` is for the room: every Tell is, unless its `only` names
/// the channels it is for and Matrix is not one (a ticket linked late
/// catching up on what the room was told as it happened).
fn for_matrix(tell: &Tell) -> bool {
    tell.only.is_empty() || tell.only.iter().any(|c| c == MATRIX_CHANNEL)
}

/// The operator's Matrix message the item started from, which the item's
/// thread hangs from; `None` when it started elsewhere or from nothing.
fn matrix_start(tell: &Tell) -> Option<&str> {
    tell.started_from
        .as_ref()
        .filter(|r| r.channel == MATRIX_CHANNEL && !r.id.is_empty())
        .map(|r| r.id.as_str())
}

/// Whether `tell` is posted as an `m.notice`, which clients show quietly:
/// facts and the model's progress. Questions, approval requests and
/// results want the operator's attention and go as `m.text`, and so does
/// a kind this service does not know (a newer brain's), lest something
/// the operator must answer pass unnoticed.
fn is_notice(tell: &Tell) -> bool {
    matches!(tell.kind(), TellKind::Fact | TellKind::Progress)
}

/// The attachment an `m.room.message` carries, as its content describes
/// it (not downloaded yet), with where its content is (`None` when the
/// event names none, and then `error` says so); `None` for messages that
/// are not files, images, videos or sounds.
fn described_attachment(
    content: &serde_json::Value,
) -> Option<(proto::MatrixAttachment, Option<MediaSource>)> {
    let s = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_string();
    let kind = content["msgtype"].as_str()?;
    if !matches!(kind, "m.file" | "m.image" | "m.video" | "m.audio") {
        return None;
    }
    // A plain attachment's URL is `url`; an encrypted one's is `file.url`,
    // beside its key and `file.hashes.sha256`: the unpadded base64 SHA-256
    // of the encrypted bytes as stored on the homeserver. The SDK checks
    // that one while decrypting; ours, `sha256`, is of the plaintext.
    let source = serde_json::from_value::<MediaSource>(content.clone()).ok();
    let url = match &source {
        Some(MediaSource::Plain(uri)) => uri.to_string(),
        Some(MediaSource::Encrypted(file)) => file.url.to_string(),
        None => {
            let encrypted = s(&content["file"]["url"]);
            if encrypted.is_empty() {
                s(&content["url"])
            } else {
                encrypted
            }
        }
    };
    // `filename` when the body is a caption, else the body is the name.
    let filename = s(&content["filename"]);
    let attachment = proto::MatrixAttachment {
        url,
        name: if filename.is_empty() {
            s(&content["body"])
        } else {
            filename
        },
        mimetype: s(&content["info"]["mimetype"]),
        size: content["info"]["size"].as_u64().unwrap_or_default(),
        sha256: String::new(),
        kind: kind.to_string(),
        error: if source.is_none() {
            "the event names no usable content (no valid `url` or `file`)".into()
        } else {
            String::new()
        },
    };
    Some((attachment, source))
}

/// The event content of a message: Markdown as the plain `body` and
/// rendered to HTML beside it, an `m.notice` or `m.text`, in the thread
/// rooted at `thread_root` (with the reply fallback) if any.
fn message_content(notice: bool, markdown: &str, thread_root: Option<&str>) -> serde_json::Value {
    let mut content = serde_json::json!({
        "msgtype": if notice { "m.notice" } else { "m.text" },
        "body": markdown,
    });
    if let Some(html) = FormattedBody::markdown(markdown) {
        content["format"] = "org.matrix.custom.html".into();
        content["formatted_body"] = html.body.into();
    }
    if let Some(root) = thread_root {
        content["m.relates_to"] = serde_json::json!({
            "rel_type": "m.thread",
            "event_id": root,
            "is_falling_back": true,
            "m.in_reply_to": { "event_id": root },
        });
    }
    content
}

/// The sync filter: the agent's room only, up to 100 timeline events per
/// sync.
fn room_filter(room: &matrix_sdk::ruma::RoomId) -> FilterDefinition {
    let mut filter = FilterDefinition::default();
    let mut room_filter = RoomFilter::default();
    room_filter.rooms = Some(vec![room.to_owned()]);
    let mut timeline = RoomEventFilter::default();
    timeline.limit = Some(100u32.into());
    room_filter.timeline = timeline;
    filter.room = room_filter;
    filter
}

/// A Matrix transaction id for a stream message id: only characters every
/// homeserver takes in a path.
fn transaction_id(message_id: &str) -> OwnedTransactionId {
    use sha2::Digest as _;
    let digest = sha2::Sha256::digest(message_id.as_bytes());
    let hex: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
    OwnedTransactionId::from(format!("nisse-{hex}"))
}

/// A new session: from the access token (`false`: still to be restored
/// onto the client) or by password (`true`: the client is logged in).
async fn login(
    client: &Client,
    homeserver: &str,
    cfg: &AgentConfig,
) -> Result<(SavedSession, bool), MatrixError> {
    if let Some(path) = &cfg.access_token_file {
        let token = read_secret(path, "access token")?;
        let whoami: serde_json::Value = client
            .http_client()
            .get(format!(
                "{}/_matrix/client/v3/account/whoami",
                homeserver.trim_end_matches('/')
            ))
            .bearer_auth(&token)
            .send()
            .await
            .and_then(|r| r.error_for_status())
            .map_err(|e| {
                if e.is_connect() || e.is_timeout() {
                    MatrixError::Unreachable(e.to_string())
                } else {
                    MatrixError::Setup(format!(
                        "the access token of {} is not accepted: {e}",
                        cfg.user_id
                    ))
                }
            })?
            .bytes()
            .await
            .map_err(|e| MatrixError::Setup(format!("whoami: {e}")))
            .and_then(|b| {
                serde_json::from_slice(&b).map_err(|e| MatrixError::Setup(format!("whoami: {e}")))
            })?;
        let device_id = whoami["device_id"].as_str().unwrap_or_default().to_string();
        if device_id.is_empty() {
            return Err(MatrixError::Setup(format!(
                "the access token of {} has no device; log in with a password instead",
                cfg.user_id
            )));
        }
        let session = SavedSession {
            user_id: whoami["user_id"]
                .as_str()
                .unwrap_or(&cfg.user_id)
                .to_string(),
            device_id,
            access_token: token.into(),
        };
        return Ok((session, false));
    }
    let Some(path) = &cfg.password_file else {
        return Err(MatrixError::Setup(format!(
            "no access token or password for {}",
            cfg.user_id
        )));
    };
    let password = read_secret(path, "password")?;
    let name = if cfg.device_name.is_empty() {
        "nisse"
    } else {
        &cfg.device_name
    };
    let response = client
        .matrix_auth()
        .login_username(&cfg.user_id, &password)
        .initial_device_display_name(name)
        .send()
        .await?;
    let session = SavedSession {
        user_id: response.user_id.to_string(),
        device_id: response.device_id.to_string(),
        access_token: response.access_token.into(),
    };
    Ok((session, true))
}

async fn create_room(client: &Client, cfg: &AgentConfig) -> Result<Room, MatrixError> {
    use matrix_sdk::ruma::api::client::room::create_room::v3::{Request, RoomPreset};
    let alias = cfg
        .room
        .trim_start_matches('#')
        .split(':')
        .next()
        .unwrap_or_default()
        .to_string();
    let mut request = Request::new();
    request.room_alias_name = Some(alias);
    request.preset = Some(RoomPreset::PrivateChat);
    request.invite = cfg
        .invite
        .iter()
        .filter_map(|u| u.as_str().try_into().ok())
        .collect();
    if cfg.encrypted {
        let content = serde_json::json!({ "algorithm": "m.megolm.v1.aes-sha2" });
        let state =
            serde_json::json!({ "type": "m.room.encryption", "state_key": "", "content": content });
        if let Ok(raw) = serde_json::from_value(state) {
            request.initial_state = vec![raw];
        }
    }
    Ok(client.create_room(request).await?)
}

/// Writes a file only its owner can read.
/// Writes `bytes` to `path`, readable by its owner only, whole or not at
/// all: into a new file beside it (which `tempfile` makes with mode 0600),
/// fsynced, then renamed over it, the directory fsynced after. Written in
/// place, a crash in the middle left a cut session file that the next
/// start refused to read, with the device it names already logged in.
fn write_private(path: &Path, bytes: &[u8]) -> Result<(), MatrixError> {
    use std::io::Write as _;
    let failed = |e: std::io::Error| MatrixError::Setup(format!("{}: {e}", path.display()));
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or_else(|| Path::new("."));
    let mut file = tempfile::NamedTempFile::new_in(dir).map_err(failed)?;
    file.write_all(bytes)
        .and_then(|()| file.as_file().sync_all())
        .map_err(failed)?;
    file.persist(path).map_err(|e| failed(e.error))?;
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(failed)
}

fn is_not_found(e: &matrix_sdk::Error) -> bool {
    use matrix_sdk::ruma::api::error::ErrorKind;
    matches!(e.client_api_error_kind(), Some(ErrorKind::NotFound))
}

fn is_auth_error(e: &matrix_sdk::Error) -> bool {
    use matrix_sdk::ruma::api::error::ErrorKind;
    matches!(
        e.client_api_error_kind(),
        Some(ErrorKind::UnknownToken(_) | ErrorKind::MissingToken | ErrorKind::Forbidden)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_session_file_is_replaced_whole_and_kept_private() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("session.json");
        write_private(&path, b"{\"first\": true}").unwrap();
        // A reader of the old file keeps reading it whole: the new one is
        // a file of its own, put in its place, never the old one cut and
        // rewritten.
        let mut before = std::fs::File::open(&path).unwrap();
        write_private(&path, b"{}").unwrap();
        let mut seen = String::new();
        std::io::Read::read_to_string(&mut before, &mut seen).unwrap();
        assert_eq!(seen, "{\"first\": true}");
        assert_eq!(std::fs::read(&path).unwrap(), b"{}");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{mode:o}");
        // Nothing is left beside it.
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["session.json"]);
        // A directory it cannot write into is an error naming the file.
        let err = write_private(&dir.path().join("missing/session.json"), b"{}").unwrap_err();
        assert!(err.to_string().contains("missing/session.json"), "{err}");
    }

    #[test]
    fn a_plain_file_is_described_by_its_url_name_type_and_size() {
        let content = serde_json::json!({
            "msgtype": "m.file",
            "body": "disk.log",
            "url": "mxc://example.org/abc",
            "info": { "mimetype": "text/plain", "size": 42 },
        });
        let (a, source) = described_attachment(&content).unwrap();
        assert_eq!(a.url, "mxc://example.org/abc");
        assert_eq!(a.name, "disk.log");
        assert_eq!(a.mimetype, "text/plain");
        assert_eq!(a.size, 42);
        assert_eq!(a.kind, "m.file");
        assert!(a.sha256.is_empty() && a.error.is_empty(), "{a:?}");
        assert!(matches!(source, Some(MediaSource::Plain(_))));
    }

    #[test]
    fn an_encrypted_image_is_found_under_file_and_a_caption_leaves_the_filename() {
        let content = serde_json::json!({
            "msgtype": "m.image",
            "body": "the rack after the fix",
            "filename": "rack.jpg",
            "info": { "mimetype": "image/jpeg", "size": 1000 },
            "file": {
                "url": "mxc://example.org/enc",
                "key": {
                    "kty": "oct", "alg": "A256CTR", "ext": true,
                    "key_ops": ["encrypt", "decrypt"],
                    "k": "qcHVMSgYg-71CauWBezXI5qkaRb0LuIy-Wx5kIaHMIA",
                },
                "iv": "X85+XgHN+HEAAAAAAAAAAA",
                "hashes": { "sha256": "5qG4fFnbbVdlAB1Q72JDKwCagV6Dbkx9uds4rSak37c" },
                "v": "v2",
            },
        });
        let (a, source) = described_attachment(&content).unwrap();
        assert_eq!(a.url, "mxc://example.org/enc");
        assert_eq!(a.name, "rack.jpg");
        assert_eq!(a.kind, "m.image");
        assert!(
            matches!(source, Some(MediaSource::Encrypted(_))),
            "{source:?}"
        );
    }

    fn tell(kind: TellKind) -> Tell {
        Tell {
            kind: kind as i32,
            markdown: "x".into(),
            ..Default::default()
        }
    }

    #[test]
    fn facts_and_progress_are_notices_and_what_wants_an_answer_is_text() {
        assert!(is_notice(&tell(TellKind::Fact)));
        assert!(is_notice(&tell(TellKind::Progress)));
        for kind in [
            TellKind::Question,
            TellKind::ApprovalRequest,
            TellKind::Result,
            TellKind::Unspecified,
        ] {
            assert!(!is_notice(&tell(kind)), "{kind:?}");
        }
        let unknown = Tell {
            kind: 99,
            ..Default::default()
        };
        assert!(!is_notice(&unknown), "an unknown kind is posted as text");
    }

    #[test]
    fn a_tell_only_for_other_channels_is_not_for_the_room() {
        let mut t = tell(TellKind::Fact);
        assert!(for_matrix(&t), "no `only`: every channel");
        t.only = vec!["vikunja".into()];
        assert!(!for_matrix(&t));
        t.only.push("matrix".into());
        assert!(for_matrix(&t));
    }

    #[test]
    fn only_a_matrix_start_places_the_thread() {
        let mut t = tell(TellKind::Fact);
        assert_eq!(matrix_start(&t), None);
        t.started_from = Some(proto::ChannelRef {
            channel: "vikunja".into(),
            id: "12".into(),
        });
        assert_eq!(matrix_start(&t), None, "a ticket is no Matrix event");
        t.started_from = Some(proto::ChannelRef {
            channel: "matrix".into(),
            id: "$root".into(),
        });
        assert_eq!(matrix_start(&t), Some("$root"));
    }

    #[test]
    fn text_is_no_attachment_and_one_without_a_url_says_so() {
        let text = serde_json::json!({ "msgtype": "m.text", "body": "hello" });
        assert!(described_attachment(&text).is_none());
        let broken = serde_json::json!({ "msgtype": "m.audio", "body": "voice" });
        let (a, source) = described_attachment(&broken).unwrap();
        assert!(source.is_none());
        assert!(a.error.contains("no usable content"), "{a:?}");
    }
}
