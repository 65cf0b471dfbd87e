//! The world publisher: each agent granted `world/` gets the world model
//! on its stream (`in.world`) whenever it changes, so what the brain
//! knows of the infrastructure is a function of its stream (seed L8:
//! replay needs no vault).
//!
//! Every refresh it loads `world/` with `nisse_vault::world::load` and
//! compares the world's hash with the one last sent. The last sent is
//! read from the stream (the last message on the agent's `in.world`) at
//! start, and again before each publish: another reader may have sent a
//! change meanwhile. The message id is
//! `world:<agent>:<sha256>:<sequence of the world message before it, or 0>`,
//! so two readers that see the same change publish one message, and a
//! world that changes back (A, B, A) is sent again, under a new id.
//!
//! A world too big for one message on the bus (the server's
//! `max_payload`, 1 MiB by default) is not sent; it is logged as an
//! error naming its size, once per change.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

use prost::Message as _;
use tokio_util::sync::CancellationToken;

use nisse_bus::proto::{Actor, ActorKind, Entity, Envelope, Relation, WorldModel};
use nisse_bus::{AgentName, Bus, SubjectKind};

/// Room kept for the headers a message is published with (its dedup id,
/// its type, the trace) beside its payload.
const HEADER_ROOM: usize = 1024;

/// The world model of one agent, as the stream has it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Sent {
    sha256: String,
    sequence: u64,
}

/// One agent the world is sent to.
struct Receiver {
    agent: AgentName,
    subject: String,
    /// The last world on its stream; `None` until the stream was read.
    last: Option<Option<Sent>>,
    /// The hash of a world refused as too big, so it is said once.
    refused: Option<String>,
}

/// Sends the world to every agent granted it.
pub(super) struct Publisher {
    root: PathBuf,
    bus: Bus,
    receivers: Vec<Receiver>,
    /// The hash of the world last loaded, so its problems are logged once
    /// per change, not at every refresh.
    loaded: Option<String>,
}

impl Publisher {
    /// A publisher of the world under `root` to `agents` (those granted
    /// `world/`).
    pub(super) fn new(root: PathBuf, bus: Bus, agents: Vec<AgentName>) -> Self {
        let receivers = agents
            .into_iter()
            .map(|agent| Receiver {
                subject: agent.subject(SubjectKind::World),
                agent,
                last: None,
                refused: None,
            })
            .collect();
        Self {
            root,
            bus,
            receivers,
            loaded: None,
        }
    }

    /// Whether any agent gets the world.
    pub(super) fn is_idle(&self) -> bool {
        self.receivers.is_empty()
    }

    /// Publishes at every `refresh` what changed, until `shutdown`; the
    /// first look is [`Publisher::publish_changes`] before this.
    pub(super) async fn run(mut self, refresh: Duration, shutdown: CancellationToken) {
        if self.is_idle() {
            return;
        }
        loop {
            tokio::select! {
                biased;
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(refresh) => {}
            }
            self.publish_changes().await;
        }
    }

    /// Loads the world and sends it to every agent whose stream does not
    /// have it yet. A failure is logged and tried again at the next
    /// refresh.
    pub(super) async fn publish_changes(&mut self) {
        if self.is_idle() {
            return;
        }
        let root = self.root.clone();
        let loaded = tokio::task::spawn_blocking(move || nisse_vault::world::load(&root)).await;
        let (world, problems) = match loaded {
            Ok(loaded) => loaded,
            Err(e) => {
                tracing::error!(vault = %self.root.display(), "loading the world model failed: {e}");
                return;
            }
        };
        // A world with no folder has no files to hash: it is the world of
        // no files, the hash of nothing, as an empty folder's is.
        let sha256 = if world.sha256.is_empty() {
            nisse_vault::sha256_hex(b"")
        } else {
            world.sha256.clone()
        };
        if self.loaded.as_ref() != Some(&sha256) {
            let distinct: BTreeSet<String> = problems.iter().map(ToString::to_string).collect();
            for problem in &distinct {
                tracing::warn!(vault = %self.root.display(), "world model: {problem}");
            }
            tracing::info!(
                vault = %self.root.display(),
                sha256 = %sha256,
                entities = world.entities().len(),
                problems = distinct.len(),
                "world model loaded"
            );
            self.loaded = Some(sha256.clone());
        }
        let entities: Vec<Entity> = world
            .entities()
            .iter()
            .map(|e| Entity {
                name: e.name.clone(),
                kind: e.kind.as_str().to_string(),
                title: e.title.clone(),
                path: e.path.clone(),
                relations: e
                    .relations
                    .iter()
                    .map(|(kind, target)| Relation {
                        kind: kind.as_str().to_string(),
                        target: target.clone(),
                    })
                    .collect(),
                aliases: e.aliases.clone(),
            })
            .collect();
        let max = self.bus.client().max_payload();
        for receiver in &mut self.receivers {
            if let Err(e) = receiver
                .bring_up_to_date(&self.bus, &sha256, &entities, max)
                .await
            {
                // Read the stream again before the next try: a publish
                // whose ack was lost may have been stored after all.
                receiver.last = None;
                tracing::warn!(agent = %receiver.agent, "sending the world model failed, trying again at the next refresh: {e}");
            }
        }
    }
}

impl Receiver {
    /// The last world on the agent's stream.
    async fn read_last(&self, bus: &Bus) -> nisse_bus::Result<Option<Sent>> {
        let Some(stored) = bus.last_on_subject(&self.agent, &self.subject).await? else {
            return Ok(None);
        };
        match WorldModel::decode(&stored.payload[..]) {
            Ok(model) => Ok(Some(Sent {
                sha256: model.sha256,
                sequence: stored.sequence,
            })),
            Err(e) => {
                // Only the reader publishes here; a message it cannot read
                // is replaced by the next world, after it.
                tracing::warn!(agent = %self.agent, sequence = stored.sequence, "the last world model on the stream cannot be decoded ({e}); sending the world again");
                Ok(Some(Sent {
                    sha256: String::new(),
                    sequence: stored.sequence,
                }))
            }
        }
    }

    /// Sends the world with `sha256` and `entities` unless the agent's
    /// stream has it.
    async fn bring_up_to_date(
        &mut self,
        bus: &Bus,
        sha256: &str,
        entities: &[Entity],
        max_payload: usize,
    ) -> nisse_bus::Result<()> {
        if let Some(Some(sent)) = &self.last
            && sent.sha256 == sha256
        {
            return Ok(());
        }
        if self.refused.as_deref() == Some(sha256) {
            // Said once already; the world must change to fit.
            return Ok(());
        }
        // A change (or the start): what does the stream have now?
        let last = self.read_last(bus).await?;
        // Nothing described and nothing ever sent: no message. An agent
        // whose operator has no world/ yet gets none, and its stream holds
        // only what happened.
        let nothing = last.is_none() && entities.is_empty();
        if nothing || last.as_ref().is_some_and(|l| l.sha256 == sha256) {
            self.last = Some(last);
            return Ok(());
        }
        let previous = last.as_ref().map_or(0, |l| l.sequence);
        let agent = self.agent.as_str();
        let model = WorldModel {
            envelope: Some(Envelope {
                agent: agent.to_string(),
                actor: Some(Actor {
                    kind: ActorKind::Service as i32,
                    id: super::SERVICE.name.to_string(),
                }),
                message_id: format!("world:{agent}:{sha256}:{previous}"),
                ..Envelope::default()
            }),
            sha256: sha256.to_string(),
            entities: entities.to_vec(),
        };
        let size = model.encoded_len();
        if size + HEADER_ROOM > max_payload {
            tracing::error!(
                agent = %self.agent,
                sha256,
                entities = entities.len(),
                "the world model is {size} bytes, more than one message on the bus holds ({max_payload} bytes, the NATS server's max_payload, less {HEADER_ROOM} for headers); it is not sent, and the agent keeps the world it had until the world is smaller or the server's max_payload larger"
            );
            self.refused = Some(sha256.to_string());
            self.last = Some(last);
            return Ok(());
        }
        let published = bus.publish(model).await?;
        if published.duplicate {
            tracing::debug!(agent = %self.agent, sha256, "the world model was sent by another reader already");
        } else {
            tracing::info!(agent = %self.agent, sha256, entities = entities.len(), sequence = published.sequence, "world model sent");
        }
        self.refused = None;
        self.last = Some(Some(Sent {
            sha256: sha256.to_string(),
            sequence: published.sequence,
        }));
        Ok(())
    }
}
