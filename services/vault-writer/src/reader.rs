//! The vault reader: the brain's `out.vault.query` → `in.vault.found`
//! (full-text search, one note, what a work item starts with), and the
//! world model on `in.world` whenever it changes (seed L6 "how memory is
//! used", L10 "retrieval is structural first"; Oikos REQ-ORI-3..4).
//!
//! The answers are on the stream, so a replay reads them from there and
//! never reads the vault again; each note answered carries the SHA-256 of
//! the file as read, which the brain snapshots into the item's log with
//! the path.
//!
//! # The vault's conventions
//!
//! - **Agent memory** is `memory/<agent>/`: facts in `facts/`, work-item
//!   summaries in `incidents/` (frontmatter `fingerprint`, the alert's,
//!   and `hosts`, a list), and the index `memory/<agent>/index.md`.
//! - **Procedures** are notes (usually in `procedures/`) whose
//!   frontmatter `runbook_for` lists what they are bound to:
//!   `alert:<alertname>`, `duty:<duty name>`, `policy:<policy rule id>`.
//!   Only the operator's folders bind: a note in an agent's memory with
//!   `runbook_for` is memory, so no model can write itself a procedure.
//! - **The world** is `world/` (its entities, loaded by
//!   `nisse_vault::world`).
//! - **Kind**: `memory/<agent>/incidents/` → incident; the rest of memory
//!   → memory; `world/` → world; a note with `runbook_for` → procedure;
//!   anything else → note.
//! - **Trust**: a note in an operator's folder is trusted unless its
//!   frontmatter says `trust: untrusted`; a memory note is trusted only
//!   when its frontmatter says `trust: operator` (the operator's verbatim
//!   correction). Everything else in memory came from a model, an alert
//!   or command output, and the brain fences it as data.
//! - Hidden files and folders (`.git`, `.obsidian`, the writer's `.tmp`
//!   files), files not ending in `.md` and symbolic links are never read.
//!
//! # Privacy (seed L10)
//!
//! An answer for agent A comes only from `memory/A/` and the top-level
//! folders the configuration grants A (`vault.read`). A is the agent whose
//! stream the query came on, not what the envelope says. Each agent has a
//! full-text index of its own, holding only what it may read, so a search
//! or a recall cannot return anything else; a read of anything else is
//! answered with an error saying whose the note is or which grant is
//! missing. An agent not granted `world` gets no world model.
//!
//! # Answers
//!
//! - `search {text, limit, fingerprint, hosts}`: the notes matching the
//!   text (tantivy's lenient parser: words, phrases in quotes, `+`/`-`,
//!   `AND`/`OR`, `title:` and the other fields; what it cannot read is
//!   taken as words, never a syntax error), incident notes about the same
//!   fingerprint first, then about the same hosts, then the rest by score,
//!   each with an excerpt. At most 50, 10 when not said.
//! - `read {path}`: the whole note.
//! - `recall {…}`: every procedure bound to one of the item's alerts,
//!   duties or policy entries, every procedure it names by path (one that
//!   is not there, or not readable, is reported in `missing` with what
//!   named it: a missing bound procedure stops planning, seed L10
//!   "Failures"), then earlier incident notes about the same fingerprint,
//!   then the same hosts, newest first (frontmatter `written`), then the
//!   agent's memory index, then text matches on the item's title; whole
//!   notes, in that order.
//!
//! A note's content is cut at 64 KiB with a line saying so. Every query
//! is answered, because the brain holds a deadline for it: one that
//! cannot be answered gets an `error` saying why. An answer too big for
//! one message on the bus has its last notes cut to their heads, then
//! left out. Only an answer that could not be published is retried.
//!
//! # Freshness
//!
//! The index is built at start and kept current by a walk of the
//! readable folders comparing each file's stamp (modification time, size,
//! inode) with what it indexed: every `refresh`, and before each query,
//! so a note the writer wrote a moment ago is found by the next query.

mod answer;
mod notes;
mod search;
mod world;

use std::sync::Arc;
use std::time::Instant;

use prost::Message as _;

use nisse_bus::proto::{VaultFound, VaultQuery};
use nisse_bus::service::{Context, Service};
use nisse_bus::{AgentName, Bus, ConsumerSpec, Delivery, Handler, Intake, Unhandled};

use self::search::Library;

/// The service; its name is its durable consumer's.
pub const SERVICE: Service = Service {
    name: ConsumerSpec::VAULT_READER.name,
    about: "the vault reader: search, notes and what a work item starts with, from the folders each agent may read; the world model when it changes",
};

/// Room kept for the headers a message is published with (its dedup id,
/// its type, the trace) beside its payload.
const HEADER_ROOM: usize = 1024;

/// How much of a note is kept when an answer must be cut to fit the bus.
const SHORTENED: usize = 2 * 1024;

/// Indexes the vault, sends each agent granted `world` its world model,
/// reports ready, then answers every agent's queries until shutdown (up
/// to `max-in-flight` at once per agent), refreshing the index and the
/// world every `refresh`. On shutdown the queries under way are answered.
pub async fn run(ctx: Context<crate::Config>) -> anyhow::Result<()> {
    let config = ctx.config.clone();
    let problems = config.validate("vault");
    if !problems.is_empty() {
        let said: Vec<String> = problems.iter().map(|(k, p)| format!("{k}: {p}")).collect();
        anyhow::bail!("the vault reader's settings are wrong: {}", said.join("; "));
    }
    let root = config.root(&ctx.data_dir);
    let agents: Vec<(AgentName, Vec<String>)> = ctx
        .agents
        .iter()
        .map(|a| (a.clone(), config.grants(a.as_str())))
        .collect();
    let world_agents: Vec<AgentName> = agents
        .iter()
        .filter(|(_, grants)| grants.iter().any(|g| g == nisse_vault::WORLD))
        .map(|(a, _)| a.clone())
        .collect();

    let started = Instant::now();
    let opened = {
        let root = root.clone();
        tokio::task::spawn_blocking(move || Library::open(root, agents)).await?
    };
    let library = Arc::new(opened?);
    tracing::info!(
        vault = %root.display(),
        notes = library.len(),
        ms = started.elapsed().as_millis(),
        "the vault is indexed"
    );

    let mut world = world::Publisher::new(root, ctx.bus.clone(), world_agents);
    // Before ready: a brain started after the reader finds the world on
    // its stream.
    world.publish_changes().await;

    let handlers = ctx.every_agent(Reader {
        library: library.clone(),
        bus: ctx.bus.clone(),
    });
    let intake = Intake {
        consumer: ConsumerSpec::VAULT_READER,
        in_flight: config.max_in_flight,
    };
    // The loops stop with the service: at shutdown, or when serving
    // fails and the error is returned.
    let stop = ctx.shutdown.child_token();
    let served = async {
        let served = nisse_bus::serve(&ctx, intake, handlers).await;
        stop.cancel();
        served
    };
    let (served, (), ()) = tokio::join!(
        served,
        refresh(library, config.refresh, stop.clone()),
        world.run(config.refresh, stop.clone()),
    );
    served?;
    Ok(())
}

/// Refreshes the index every `every` until `shutdown`, so a query finds
/// little to do.
async fn refresh(
    library: Arc<Library>,
    every: std::time::Duration,
    shutdown: tokio_util::sync::CancellationToken,
) {
    loop {
        tokio::select! {
            biased;
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(every) => {}
        }
        let library = library.clone();
        match tokio::task::spawn_blocking(move || library.refresh(Instant::now())).await {
            Ok(Ok(0)) => {}
            Ok(Ok(changed)) => tracing::debug!(changed, "notes changed on disk are indexed"),
            Ok(Err(e)) => tracing::warn!(
                "refreshing the vault's index failed, trying again at the next refresh: {e}"
            ),
            Err(e) => tracing::error!("refreshing the vault's index failed: {e}"),
        }
    }
}

/// The handler: one answer per query.
struct Reader {
    library: Arc<Library>,
    bus: Bus,
}

impl Handler<VaultQuery> for Reader {
    async fn handle(
        &self,
        agent: &AgentName,
        delivery: &Delivery<VaultQuery>,
    ) -> Result<(), Unhandled> {
        let query = delivery.message();
        let asked = Instant::now();
        let answer = {
            let library = self.library.clone();
            let agent = agent.clone();
            let query = query.clone();
            tokio::task::spawn_blocking(move || answer::answer(&library, &agent, &query, asked))
                .await
                .unwrap_or_else(|e| answer::Answer {
                    error: format!("the vault reader failed while answering: {e}"),
                    ..answer::Answer::default()
                })
        };
        let mut envelope = SERVICE.reply_to(
            query.envelope.as_ref(),
            format!("found:{}", query.request_id),
        );
        // To the stream the query came on, whatever its envelope says: the
        // answer is read from there, by the agent it was read for.
        envelope.agent = agent.to_string();
        let mut found = VaultFound {
            envelope: Some(envelope),
            request_id: query.request_id.clone(),
            notes: answer.notes,
            missing: answer.missing,
            error: answer.error,
        };
        fit(&mut found, self.bus.client().max_payload());
        tracing::debug!(
            parent: delivery.span(),
            request = %query.request_id,
            notes = found.notes.len(),
            missing = found.missing.len(),
            error = %found.error,
            ms = asked.elapsed().as_millis(),
            "answered a vault query"
        );
        self.bus
            .publish(found)
            .await
            .map_err(|e| Unhandled::retry(format!("publishing the vault's answer: {e}")))?;
        Ok(())
    }
}

/// Makes `found` fit one message on a bus taking `max_payload` bytes: the
/// last notes are cut to their heads first (the model can read one whole
/// by its path), then left out, last first.
fn fit(found: &mut VaultFound, max_payload: usize) {
    let limit = max_payload.saturating_sub(HEADER_ROOM);
    if found.encoded_len() <= limit {
        return;
    }
    for i in (0..found.notes.len()).rev() {
        if found.encoded_len() <= limit {
            return;
        }
        let note = &mut found.notes[i];
        if note.content.len() > SHORTENED {
            note.content = notes::cut(&note.content, SHORTENED);
            note.excerpt = true;
        }
    }
    let mut left_out = Vec::new();
    while found.encoded_len() > limit
        && let Some(note) = found.notes.pop()
    {
        left_out.push(note.path);
    }
    if !left_out.is_empty() {
        tracing::warn!(
            request = %found.request_id,
            left_out = %left_out.join(", "),
            "the answer was too big for one message on the bus ({max_payload} bytes); notes were left out"
        );
    }
}

#[cfg(test)]
mod tests {
    use nisse_bus::proto::FoundNote;

    use super::*;

    fn note(path: &str, size: usize) -> FoundNote {
        FoundNote {
            path: path.into(),
            content: "line\n".repeat(size / 5),
            ..FoundNote::default()
        }
    }

    #[test]
    fn an_answer_too_big_for_the_bus_is_cut_from_the_end() {
        let mut found = VaultFound {
            request_id: "r".into(),
            notes: vec![
                note("a.md", 40_000),
                note("b.md", 40_000),
                note("c.md", 40_000),
            ],
            ..VaultFound::default()
        };
        fit(&mut found, 60_000);
        let shape: Vec<(&str, bool)> = found
            .notes
            .iter()
            .map(|n| (n.path.as_str(), n.excerpt))
            .collect();
        assert_eq!(shape, [("a.md", false), ("b.md", true), ("c.md", true)]);
        assert!(
            found.notes[2].content.ends_with(
                "[cut: the note is 40000 bytes, and this answer holds its first 2045]\n"
            ),
            "{}",
            found.notes[2].content
        );
        assert!(found.encoded_len() <= 60_000 - HEADER_ROOM);

        // Cut as far as it goes, then the last left out.
        fit(&mut found, 5_000);
        let shape: Vec<(&str, bool)> = found
            .notes
            .iter()
            .map(|n| (n.path.as_str(), n.excerpt))
            .collect();
        assert_eq!(shape, [("a.md", true)]);
    }
}
