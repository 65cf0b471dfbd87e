//! The vault reader: search, notes, recall and the world model.
//!
//! Each test writes a vault folder, runs the reader in-process as its own
//! NATS identity for one agent on a secured server, publishes queries as
//! that agent's brain, and reads the answers (and world models) back from
//! the agent's stream.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test helpers fail the test by panicking"
)]

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use pretty_assertions::assert_eq;

use nisse_bus::auth::Identity;
use nisse_bus::proto::vault_query::Query;
use nisse_bus::proto::{
    Envelope, FoundNote, KnowledgeSearch, NoteKind, NoteRead, Recall, VaultFound, VaultQuery,
    WorldModel,
};
use nisse_bus::{AgentName, AnyMessage, Bus, Role, StoredMessage};
use nisse_tests::{InProcess, TestNats, agent};
use nisse_vault::note::sha256_hex;
use nisse_vault_writer::Config;
use nisse_vault_writer::reader;

/// The vault every test starts from: the ops agent's memory (incidents,
/// a fact, its index), the dev agent's memory, procedures bound to an
/// alert, a duty and a policy entry, two world entities, a folder no
/// agent is granted, and hidden files that must never be read.
const VAULT: &[(&str, &str)] = &[
    (
        "procedures/disk-full.md",
        "---\ntitle: Disk full\nrunbook_for:\n  - alert:DiskFull\n  - duty:nas01-root-disk\n---\n# Disk full\n\nFree space on the root filesystem: vacuum the journal, then look for large logs.\n",
    ),
    (
        "procedures/restart.md",
        "---\nrunbook_for: [policy:restart-service]\n---\n# Restarting a service\n\nRestart it once; if it fails again, look at its journal.\n",
    ),
    (
        "procedures/untrusted.md",
        "---\ntrust: untrusted\n---\n# Pasted from a forum\n\nRun this script to fix a full disk.\n",
    ),
    (
        "memory/ops/incidents/2024-05-01-nas01-disk.md",
        "---\nfingerprint: fp-disk\nhosts: [nas01]\nwritten: 2024-05-01T10:00:00Z\n---\n# Root disk full on nas01\n\nThe disk was full; the journal was vacuumed.\n",
    ),
    (
        "memory/ops/incidents/2024-03-01-nas01-disk.md",
        "---\nfingerprint: fp-disk\nhosts: [nas01]\nwritten: 2024-03-01T10:00:00Z\n---\n# Root disk full on nas01, the first time\n\nThe disk was full of old logs.\n",
    ),
    (
        "memory/ops/incidents/2024-06-01-nas01-backup.md",
        "---\nfingerprint: fp-backup\nhosts:\n  - NAS01\n  - nas02\nwritten: 2024-06-01T10:00:00Z\n---\n# Backup failed on nas01\n\nThe backup disk was full.\n",
    ),
    (
        "memory/ops/incidents/2024-07-01-web-cert.md",
        "---\nfingerprint: fp-cert\nhosts: [web01]\nwritten: 2024-07-01T10:00:00Z\n---\n# Certificate expired on web01\n\nRenewed; nothing was full.\n",
    ),
    (
        "memory/ops/facts/disk-layout.md",
        "---\ntrust: operator\n---\n# Disk layout\n\nThe operator said: nas01's root disk is full more often than the data disk.\n",
    ),
    (
        "memory/ops/index.md",
        "# Memory index\n\n- [[disk-layout]]\n",
    ),
    (
        "memory/dev/secret.md",
        "# The dev agent's note\n\nA disk that is full: the dev agent's own words, never the ops agent's.\n",
    ),
    (
        "notes/ungranted.md",
        "# Not granted\n\nA disk full note in a folder no agent is granted.\n",
    ),
    (
        ".obsidian/workspace.md",
        "# Obsidian's settings\n\ndisk full\n",
    ),
    (
        "memory/ops/.tmp-note.md",
        "# A half-written note\n\ndisk full\n",
    ),
    ("memory/ops/.hidden/inside.md", "# Hidden\n\ndisk full\n"),
    (
        "world/hosts/nas01.md",
        "---\ntype: host\ntitle: The NAS\n---\n# nas01\n",
    ),
    (
        "world/services/postgresql.md",
        "---\ntype: service\nruns_on: \"[[nas01]]\"\naliases: [postgresql.service]\n---\n# PostgreSQL\n",
    ),
];

/// A secured server with the topology, and a vault folder.
struct Bench {
    nats: TestNats,
    admin: Bus,
    vault: tempfile::TempDir,
    next: u32,
}

impl Bench {
    async fn new() -> Self {
        let nats = TestNats::secured(&["ops", "dev"]).await.unwrap();
        let admin = nats.bus(&["ops", "dev"]).await.unwrap();
        admin.ensure_topology().await.unwrap();
        let vault = tempfile::tempdir().unwrap();
        for (path, text) in VAULT {
            write(vault.path(), path, text);
        }
        Self {
            nats,
            admin,
            vault,
            next: 0,
        }
    }

    fn root(&self) -> &Path {
        self.vault.path()
    }

    /// The reader's section: ops reads `world` and `procedures`, dev
    /// nothing shared.
    fn config(&self, refresh: Duration) -> Config {
        Config {
            dir: Some(self.root().to_path_buf()),
            git: false,
            read: BTreeMap::from([(
                "ops".to_string(),
                vec!["world".to_string(), "procedures".to_string()],
            )]),
            refresh,
            max_in_flight: 4,
        }
    }

    /// Starts a reader for `name` as its own identity.
    async fn reader(&self, name: &str, refresh: Duration) -> InProcess {
        let bus = self
            .nats
            .bus_as(&Identity::service(Role::VaultReader, &agent(name)), &[name])
            .await
            .unwrap();
        let data = self.nats.data_dir().unwrap();
        InProcess::service(&bus, self.config(refresh), &data, reader::run)
            .await
            .unwrap()
    }

    /// `name`'s brain.
    async fn brain(&self, name: &str) -> Bus {
        self.nats
            .bus_as(&Identity::service(Role::Brain, &agent(name)), &[name])
            .await
            .unwrap()
    }

    /// Asks `query` as `name`'s brain and waits for the answer.
    async fn ask(&mut self, brain: &Bus, name: &str, query: Query) -> VaultFound {
        self.ask_raw(brain, name, Some(query)).await
    }

    /// Asks `query` (none at all, for an invalid one) and waits for the
    /// answer.
    async fn ask_raw(&mut self, brain: &Bus, name: &str, query: Option<Query>) -> VaultFound {
        self.next += 1;
        let id = format!("q{}", self.next);
        brain
            .publish(VaultQuery {
                envelope: Some(Envelope {
                    agent: name.into(),
                    work_item_id: "item-1".into(),
                    message_id: format!("vault-query:{id}"),
                    ..Envelope::default()
                }),
                request_id: id.clone(),
                query,
            })
            .await
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let found = self.stream(&agent(name)).await.into_iter().find_map(|m| {
                match m.decode().unwrap() {
                    AnyMessage::VaultFound(f) if f.request_id == id => Some(f),
                    _ => None,
                }
            });
            if let Some(found) = found {
                return found;
            }
            assert!(Instant::now() < deadline, "no answer to {id}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Every message of `name`'s stream.
    async fn stream(&self, name: &AgentName) -> Vec<StoredMessage> {
        let mut reader = self.admin.read_range(name, 1, None).await.unwrap();
        let mut out = Vec::new();
        while let Some(m) = reader.next().await {
            out.push(m.unwrap());
        }
        out
    }

    /// The world models on `name`'s stream, with their message ids and
    /// sequences.
    async fn worlds(&self, name: &str) -> Vec<(String, u64, WorldModel)> {
        self.stream(&agent(name))
            .await
            .into_iter()
            .filter_map(|m| match m.decode().unwrap() {
                AnyMessage::World(w) => Some((
                    w.envelope.as_ref().unwrap().message_id.clone(),
                    m.sequence,
                    w,
                )),
                _ => None,
            })
            .collect()
    }
}

fn write(root: &Path, path: &str, text: &str) {
    let full = root.join(path);
    std::fs::create_dir_all(full.parent().unwrap()).unwrap();
    std::fs::write(full, text).unwrap();
}

fn search(text: &str, fingerprint: &str, hosts: &[&str]) -> Query {
    Query::Search(KnowledgeSearch {
        text: text.into(),
        limit: 0,
        fingerprint: fingerprint.into(),
        hosts: hosts.iter().map(|h| (*h).to_string()).collect(),
    })
}

fn read(path: &str) -> Query {
    Query::Read(NoteRead { path: path.into() })
}

/// Each found note as (path, why).
fn paths_and_whys(found: &VaultFound) -> Vec<(&str, &str)> {
    found
        .notes
        .iter()
        .map(|n| (n.path.as_str(), n.why.as_str()))
        .collect()
}

fn note<'a>(found: &'a VaultFound, path: &str) -> &'a FoundNote {
    found
        .notes
        .iter()
        .find(|n| n.path == path)
        .unwrap_or_else(|| panic!("{path} not in {found:#?}"))
}

const MINUTE: Duration = Duration::from_secs(60);

#[tokio::test]
async fn a_search_finds_notes_by_their_words_with_the_same_fingerprint_first_then_the_same_host() {
    let mut bench = Bench::new().await;
    let service = bench.reader("ops", MINUTE).await;
    let brain = bench.brain("ops").await;

    let found = bench
        .ask(&brain, "ops", search("disk full", "fp-disk", &["NAS01"]))
        .await;
    assert_eq!(found.error, "");
    let order = paths_and_whys(&found);
    // The two incidents with the fingerprint (by score), then the one
    // about the host, then the rest by score.
    let mut first_two: Vec<&str> = order[..2].iter().map(|(p, _)| *p).collect();
    first_two.sort_unstable();
    assert_eq!(
        first_two,
        [
            "memory/ops/incidents/2024-03-01-nas01-disk.md",
            "memory/ops/incidents/2024-05-01-nas01-disk.md",
        ]
    );
    assert!(
        order[..2].iter().all(|(_, why)| *why == "same fingerprint"),
        "{order:?}"
    );
    assert_eq!(
        order[2],
        (
            "memory/ops/incidents/2024-06-01-nas01-backup.md",
            "same host nas01"
        )
    );
    let rest: Vec<&str> = order[3..].iter().map(|(p, _)| *p).collect();
    for path in [
        "procedures/disk-full.md",
        "memory/ops/facts/disk-layout.md",
        "procedures/untrusted.md",
    ] {
        assert!(rest.contains(&path), "{path} not found: {order:?}");
    }
    assert!(
        order[3..].iter().all(|(_, why)| *why == "text match"),
        "{order:?}"
    );
    // By score within the text matches.
    let scores: Vec<f32> = found.notes[3..].iter().map(|n| n.score).collect();
    assert!(scores.windows(2).all(|w| w[0] >= w[1]), "{scores:?}");

    // What only the ops agent may read, and nothing hidden.
    for n in &found.notes {
        assert!(
            n.path.starts_with("memory/ops/")
                || n.path.starts_with("procedures/")
                || n.path.starts_with("world/"),
            "{} should not be found",
            n.path
        );
        assert!(!n.path.contains("/."), "{} is hidden", n.path);
    }

    // Each with an excerpt of the matching part, the file's hash, title,
    // kind and trust.
    let incident = note(&found, "memory/ops/incidents/2024-05-01-nas01-disk.md");
    assert!(incident.excerpt);
    assert!(incident.content.contains("disk was full"), "{incident:?}");
    assert_eq!(incident.title, "Root disk full on nas01");
    assert_eq!(incident.kind, NoteKind::Incident as i32);
    assert!(!incident.trusted);
    let text = std::fs::read(bench.root().join(&incident.path)).unwrap();
    assert_eq!(incident.sha256, sha256_hex(&text));
    let procedure = note(&found, "procedures/disk-full.md");
    assert_eq!(procedure.kind, NoteKind::Procedure as i32);
    assert!(procedure.trusted);
    assert_eq!(procedure.title, "Disk full");
    assert!(!note(&found, "procedures/untrusted.md").trusted);
    let correction = note(&found, "memory/ops/facts/disk-layout.md");
    assert_eq!(correction.kind, NoteKind::Memory as i32);
    assert!(correction.trusted, "trust: operator in memory is trusted");

    // Without fingerprint or hosts, by score alone; the limit holds.
    let found = bench
        .ask(
            &brain,
            "ops",
            Query::Search(KnowledgeSearch {
                text: "journal".into(),
                limit: 2,
                ..KnowledgeSearch::default()
            }),
        )
        .await;
    assert_eq!(found.notes.len(), 2, "{found:#?}");
    assert!(found.notes.iter().all(|n| n.why == "text match"));

    // Query syntax is read leniently; a colon that names no field is a
    // word, and unbalanced syntax is no error.
    let found = bench
        .ask(&brain, "ops", search("nas01:root \"disk AND (", "", &[]))
        .await;
    assert_eq!(found.error, "");
    assert!(!found.notes.is_empty());

    // A search with nothing to look for is answered with an error.
    let found = bench.ask(&brain, "ops", search("  ", "", &[])).await;
    assert_eq!(found.error, "the search has no text: say what to look for");
    let found = bench.ask(&brain, "ops", search("()", "", &[])).await;
    assert!(
        found.error.contains("has no words to look for"),
        "{found:?}"
    );

    // A query that asks for nothing is answered too.
    let found = bench.ask_raw(&brain, "ops", None).await;
    assert_eq!(
        found.error,
        "the query asks for nothing: it needs a search, a read or a recall"
    );
    service.stop(Duration::from_secs(10)).await.unwrap();
}

#[tokio::test]
async fn a_read_answers_the_whole_file_with_its_hash_or_says_why_not() {
    let mut bench = Bench::new().await;
    let big = format!("# Big\n\n{}", "a line of a long note\n".repeat(4_000));
    write(bench.root(), "procedures/big.md", &big);
    let service = bench.reader("ops", MINUTE).await;
    let brain = bench.brain("ops").await;

    let path = "procedures/disk-full.md";
    let found = bench.ask(&brain, "ops", read(path)).await;
    let text = std::fs::read_to_string(bench.root().join(path)).unwrap();
    assert_eq!(
        found,
        VaultFound {
            envelope: found.envelope.clone(),
            request_id: found.request_id.clone(),
            notes: vec![FoundNote {
                path: path.into(),
                sha256: sha256_hex(text.as_bytes()),
                title: "Disk full".into(),
                kind: NoteKind::Procedure as i32,
                trusted: true,
                content: text,
                excerpt: false,
                why: "read by path".into(),
                score: 0.0,
            }],
            missing: vec![],
            error: String::new(),
        }
    );
    let envelope = found.envelope.unwrap();
    assert_eq!(envelope.message_id, format!("found:{}", found.request_id));
    assert_eq!(
        envelope.causation_id,
        format!("vault-query:{}", found.request_id)
    );
    assert_eq!(envelope.work_item_id, "item-1");
    assert_eq!(envelope.actor.unwrap().id, "vault-reader");

    // A note over 64 KiB is cut, saying so; the hash is the whole file's.
    let found = bench.ask(&brain, "ops", read("procedures/big.md")).await;
    let cut = &found.notes[0];
    assert!(cut.content.starts_with("# Big\n"));
    assert!(
        cut.content.len() <= 64 * 1024 + 100,
        "{}",
        cut.content.len()
    );
    let last = cut.content.lines().last().unwrap();
    assert!(
        last.starts_with(&format!(
            "[cut: the note is {} bytes, and this answer holds its first ",
            big.len()
        )),
        "{last}"
    );
    assert_eq!(cut.sha256, sha256_hex(big.as_bytes()));

    let found = bench.ask(&brain, "ops", read("memory/ops/nope.md")).await;
    assert_eq!(found.error, "memory/ops/nope.md is not in the vault");
    assert!(found.notes.is_empty());
    let found = bench.ask(&brain, "ops", read("../etc/passwd.md")).await;
    assert!(
        found.error.contains("paths stay inside the vault"),
        "{found:?}"
    );
    service.stop(Duration::from_secs(10)).await.unwrap();
}

#[tokio::test]
async fn the_ops_agent_reads_neither_the_dev_agents_memory_nor_a_folder_not_granted_nor_hidden_files()
 {
    let mut bench = Bench::new().await;
    let service = bench.reader("ops", MINUTE).await;
    let brain = bench.brain("ops").await;

    let found = bench.ask(&brain, "ops", read("memory/dev/secret.md")).await;
    assert_eq!(
        found.error,
        "memory/dev/secret.md is not readable by the ops agent: it is the dev agent's memory"
    );
    assert!(found.notes.is_empty());
    let found = bench.ask(&brain, "ops", read("notes/ungranted.md")).await;
    assert_eq!(
        found.error,
        "notes/ is not granted to the ops agent (vault.read)"
    );
    let found = bench
        .ask(&brain, "ops", read(".obsidian/workspace.md"))
        .await;
    assert!(found.error.contains("hidden"), "{found:?}");
    let found = bench
        .ask(&brain, "ops", read("memory/ops/.tmp-note.md"))
        .await;
    assert!(found.error.contains("hidden"), "{found:?}");

    // Words only those notes have find nothing.
    for words in [
        "\"dev agent's own words\"",
        "granted",
        "settings",
        "half-written",
        "hidden",
    ] {
        let found = bench.ask(&brain, "ops", search(words, "", &[])).await;
        assert_eq!(paths_and_whys(&found), vec![], "{words}");
    }
    // Nor does a recall.
    let found = bench
        .ask(
            &brain,
            "ops",
            Query::Recall(Recall {
                text: "dev agent's own words".into(),
                procedures: vec!["memory/dev/secret.md".into()],
                ..Recall::default()
            }),
        )
        .await;
    assert!(
        found
            .notes
            .iter()
            .all(|n| !n.path.starts_with("memory/dev/")),
        "{found:#?}"
    );
    assert_eq!(
        found.missing,
        [
            "memory/dev/secret.md (named by the item) cannot be read: memory/dev/secret.md is not readable by the ops agent: it is the dev agent's memory"
        ]
    );
    service.stop(Duration::from_secs(10)).await.unwrap();
}

#[tokio::test]
async fn an_agent_not_granted_the_world_gets_no_world_model_and_cannot_read_it() {
    let mut bench = Bench::new().await;
    let service = bench.reader("dev", Duration::from_millis(100)).await;
    let brain = bench.brain("dev").await;

    let found = bench.ask(&brain, "dev", read("world/hosts/nas01.md")).await;
    assert_eq!(
        found.error,
        "world/ is not granted to the dev agent (vault.read)"
    );
    // Its own memory it reads; the ops agent's it does not.
    let found = bench.ask(&brain, "dev", search("disk full", "", &[])).await;
    assert_eq!(
        paths_and_whys(&found),
        [("memory/dev/secret.md", "text match")]
    );
    let found = bench
        .ask(&brain, "dev", read("memory/ops/facts/disk-layout.md"))
        .await;
    assert_eq!(
        found.error,
        "memory/ops/facts/disk-layout.md is not readable by the dev agent: it is the ops agent's memory"
    );
    // Several refreshes later, still no world on its stream.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(bench.worlds("dev").await.len(), 0);
    service.stop(Duration::from_secs(10)).await.unwrap();
}

#[tokio::test]
async fn a_recall_starts_with_the_bound_procedures_then_earlier_incidents_then_the_index() {
    let mut bench = Bench::new().await;
    let service = bench.reader("ops", MINUTE).await;
    let brain = bench.brain("ops").await;

    let found = bench
        .ask(
            &brain,
            "ops",
            Query::Recall(Recall {
                fingerprint: "fp-disk".into(),
                hosts: vec!["nas01".into()],
                alerts: vec!["DiskFull".into()],
                policy: vec!["restart-service".into()],
                procedures: vec!["procedures/disk.md".into()],
                text: "certificate expired".into(),
                ..Recall::default()
            }),
        )
        .await;
    assert_eq!(found.error, "");
    assert_eq!(
        paths_and_whys(&found),
        [
            ("procedures/disk-full.md", "bound to alert DiskFull"),
            (
                "procedures/restart.md",
                "bound to policy entry restart-service"
            ),
            (
                "memory/ops/incidents/2024-05-01-nas01-disk.md",
                "same fingerprint"
            ),
            (
                "memory/ops/incidents/2024-03-01-nas01-disk.md",
                "same fingerprint"
            ),
            (
                "memory/ops/incidents/2024-06-01-nas01-backup.md",
                "same host nas01"
            ),
            ("memory/ops/index.md", "the agent's memory index"),
            ("memory/ops/incidents/2024-07-01-web-cert.md", "text match"),
        ]
    );
    assert_eq!(
        found.missing,
        ["procedures/disk.md (named by the item) is not in the vault"]
    );
    // Whole notes, each with its hash.
    for n in &found.notes {
        let text = std::fs::read_to_string(bench.root().join(&n.path)).unwrap();
        assert_eq!(n.content, text, "{}", n.path);
        assert_eq!(n.sha256, sha256_hex(text.as_bytes()));
        assert!(!n.excerpt);
    }

    // By duty, and named by path as well: one note, both reasons.
    let found = bench
        .ask(
            &brain,
            "ops",
            Query::Recall(Recall {
                duties: vec!["nas01-root-disk".into()],
                procedures: vec!["procedures/disk-full.md".into()],
                limit: 1,
                fingerprint: "fp-disk".into(),
                ..Recall::default()
            }),
        )
        .await;
    assert_eq!(
        paths_and_whys(&found),
        [
            (
                "procedures/disk-full.md",
                "bound to duty nas01-root-disk; named by the item"
            ),
            (
                "memory/ops/incidents/2024-05-01-nas01-disk.md",
                "same fingerprint"
            ),
            ("memory/ops/index.md", "the agent's memory index"),
        ]
    );
    assert_eq!(found.missing, Vec::<String>::new());

    // A procedure named in a folder not granted is missing, saying why.
    let found = bench
        .ask(
            &brain,
            "ops",
            Query::Recall(Recall {
                procedures: vec!["notes/ungranted.md".into()],
                ..Recall::default()
            }),
        )
        .await;
    assert_eq!(
        found.missing,
        [
            "notes/ungranted.md (named by the item) cannot be read: notes/ is not granted to the ops agent (vault.read)"
        ]
    );
    service.stop(Duration::from_secs(10)).await.unwrap();
}

#[tokio::test]
async fn a_note_written_after_the_start_is_found_by_the_next_query() {
    let mut bench = Bench::new().await;
    // A refresh far away: only the look before the query can find it.
    let service = bench.reader("ops", Duration::from_secs(3600)).await;
    let brain = bench.brain("ops").await;

    let found = bench.ask(&brain, "ops", search("zanzibar", "", &[])).await;
    assert_eq!(found.notes.len(), 0);

    // As the writer writes: a temporary file, renamed into place.
    let dir = bench.root().join("memory/ops/facts");
    std::fs::write(
        dir.join(".zanzibar.md.tmp"),
        "# Zanzibar\n\nThe zanzibar host is new.\n",
    )
    .unwrap();
    std::fs::rename(dir.join(".zanzibar.md.tmp"), dir.join("zanzibar.md")).unwrap();
    let found = bench.ask(&brain, "ops", search("zanzibar", "", &[])).await;
    assert_eq!(
        paths_and_whys(&found),
        [("memory/ops/facts/zanzibar.md", "text match")]
    );

    // Changed in place at once: the new words are found, the old are not.
    std::fs::write(
        dir.join("zanzibar.md"),
        "# Zanzibar\n\nRenamed to mombasa.\n",
    )
    .unwrap();
    let found = bench.ask(&brain, "ops", search("mombasa", "", &[])).await;
    assert_eq!(found.notes.len(), 1, "{found:#?}");
    let found = bench.ask(&brain, "ops", search("host", "", &[])).await;
    assert!(
        found
            .notes
            .iter()
            .all(|n| n.path != "memory/ops/facts/zanzibar.md"),
        "{found:#?}"
    );

    // Removed: no longer found.
    std::fs::remove_file(dir.join("zanzibar.md")).unwrap();
    let found = bench.ask(&brain, "ops", search("mombasa", "", &[])).await;
    assert_eq!(found.notes.len(), 0, "{found:#?}");
    service.stop(Duration::from_secs(10)).await.unwrap();
}

#[tokio::test]
async fn the_world_is_sent_at_start_once_and_again_after_each_change() {
    let bench = Bench::new().await;
    let refresh = Duration::from_millis(100);
    // Two readers of the same agent: one message per change between them.
    let first = bench.reader("ops", refresh).await;
    let second = bench.reader("ops", refresh).await;

    let worlds = bench.worlds("ops").await;
    assert_eq!(worlds.len(), 1, "{worlds:#?}");
    let (id, sequence, world) = &worlds[0];
    assert_eq!(id, &format!("world:ops:{}:0", world.sha256));
    let mut names: Vec<(&str, &str, &str)> = world
        .entities
        .iter()
        .map(|e| (e.name.as_str(), e.kind.as_str(), e.path.as_str()))
        .collect();
    names.sort_unstable();
    assert_eq!(
        names,
        [
            ("nas01", "host", "world/hosts/nas01.md"),
            ("postgresql", "service", "world/services/postgresql.md"),
        ]
    );
    let postgresql = world
        .entities
        .iter()
        .find(|e| e.name == "postgresql")
        .unwrap();
    assert_eq!(postgresql.relations.len(), 1);
    assert_eq!(postgresql.relations[0].kind, "runs_on");
    assert_eq!(postgresql.relations[0].target, "nas01");
    assert_eq!(postgresql.aliases, ["postgresql.service"]);
    let envelope = world.envelope.as_ref().unwrap();
    assert_eq!(envelope.agent, "ops");
    assert_eq!(envelope.actor.as_ref().unwrap().id, "vault-reader");

    // Unchanged: nothing more, however many refreshes.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(bench.worlds("ops").await.len(), 1);

    // A change: sent again, once, naming the message before it.
    let original = std::fs::read_to_string(bench.root().join("world/hosts/nas01.md")).unwrap();
    write(
        bench.root(),
        "world/hosts/nas01.md",
        "---\ntype: host\ntitle: The big NAS\n---\n# nas01\n",
    );
    let changed = wait_for_worlds(&bench, 2).await;
    let (id, second_sequence, world) = &changed[1];
    assert_ne!(world.sha256, changed[0].2.sha256);
    assert_eq!(id, &format!("world:ops:{}:{sequence}", world.sha256));
    let nas01 = world.entities.iter().find(|e| e.name == "nas01").unwrap();
    assert_eq!(nas01.title, "The big NAS");

    // And back: the first world again, under a new id.
    write(bench.root(), "world/hosts/nas01.md", &original);
    let back = wait_for_worlds(&bench, 3).await;
    assert_eq!(back[2].2.sha256, back[0].2.sha256);
    assert_eq!(
        back[2].0,
        format!("world:ops:{}:{second_sequence}", back[0].2.sha256)
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(bench.worlds("ops").await.len(), 3);

    first.stop(Duration::from_secs(10)).await.unwrap();
    second.stop(Duration::from_secs(10)).await.unwrap();

    // A reader started again finds the world on the stream: nothing sent.
    let again = bench.reader("ops", refresh).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(bench.worlds("ops").await.len(), 3);
    again.stop(Duration::from_secs(10)).await.unwrap();
}

/// Waits until `name`'s stream holds `n` world models; fails on more.
async fn wait_for_worlds(bench: &Bench, n: usize) -> Vec<(String, u64, WorldModel)> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let worlds = bench.worlds("ops").await;
        assert!(worlds.len() <= n, "{worlds:#?}");
        if worlds.len() == n {
            return worlds;
        }
        assert!(
            Instant::now() < deadline,
            "{} world models, not {n}",
            worlds.len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn one_reader_serving_two_agents_keeps_their_memories_apart() {
    let mut bench = Bench::new().await;
    // One process for both agents (the admin's connection serves both):
    // both memory folders are indexed side by side.
    let data = bench.nats.data_dir().unwrap();
    let service = InProcess::service(&bench.admin, bench.config(MINUTE), &data, reader::run)
        .await
        .unwrap();
    let ops_brain = bench.brain("ops").await;
    let dev_brain = bench.brain("dev").await;

    let found = bench
        .ask(&ops_brain, "ops", search("disk full words", "", &[]))
        .await;
    assert!(!found.notes.is_empty());
    assert!(
        found
            .notes
            .iter()
            .all(|n| !n.path.starts_with("memory/dev/")),
        "{found:#?}"
    );
    let found = bench
        .ask(&dev_brain, "dev", search("disk full words", "", &[]))
        .await;
    assert_eq!(
        paths_and_whys(&found),
        [("memory/dev/secret.md", "text match")]
    );
    let found = bench
        .ask(
            &dev_brain,
            "dev",
            Query::Recall(Recall {
                fingerprint: "fp-disk".into(),
                hosts: vec!["nas01".into()],
                alerts: vec!["DiskFull".into()],
                text: "disk full".into(),
                ..Recall::default()
            }),
        )
        .await;
    assert_eq!(
        paths_and_whys(&found),
        [("memory/dev/secret.md", "text match")]
    );
    // The world goes to the agent granted it only.
    assert_eq!(bench.worlds("ops").await.len(), 1);
    assert_eq!(bench.worlds("dev").await.len(), 0);
    service.stop(Duration::from_secs(10)).await.unwrap();
}
