//! The vault writer: atomic, once per request, only into the agent's memory.
//!
//! Each test runs the writer in-process as its own NATS identity on a
//! secured server, the brain's identity publishing the writes, and reads
//! the answers and the notes back from the stream and the folder.

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
use nisse_bus::proto::{Strings, VaultWrite, VaultWriteMode, VaultWritten};
use nisse_bus::topology::VAULT_BUCKET;
use nisse_bus::{AnyMessage, Bus, BusConfig, Role, StoredMessage};
use nisse_tests::{InProcess, TestNats, ops};
use nisse_vault::note;
use nisse_vault_writer::Config;
use nisse_vault_writer::writer::{
    self, History, KvRecords, MemoryRecords, RecordState, Records as _, WriteRecord,
};

/// A secured server with the topology, the brain's and the writer's
/// connections, and a vault folder; the writer started on demand.
struct Bench {
    nats: TestNats,
    admin: Bus,
    brain: Bus,
    writer: Bus,
    vault: tempfile::TempDir,
    service: Option<InProcess>,
}

impl Bench {
    async fn new() -> Self {
        Self::with(|_| {}).await
    }

    /// With the topology made from the test's bus settings, changed by `tune`.
    async fn with(tune: impl FnOnce(&mut BusConfig)) -> Self {
        let nats = TestNats::secured(&["ops"]).await.unwrap();
        let mut cfg = nats.bus_config();
        tune(&mut cfg);
        let admin = nats.bus_with(cfg, &["ops"]).await.unwrap();
        admin.ensure_topology().await.unwrap();
        let brain = nats
            .bus_as(&Identity::service(Role::Brain, &ops()), &["ops"])
            .await
            .unwrap();
        let writer = nats
            .bus_as(&Identity::service(Role::VaultWriter, &ops()), &["ops"])
            .await
            .unwrap();
        Self {
            nats,
            admin,
            brain,
            writer,
            vault: tempfile::tempdir().unwrap(),
            service: None,
        }
    }

    fn root(&self) -> &Path {
        self.vault.path()
    }

    fn config(&self, git: bool) -> Config {
        Config {
            dir: Some(self.root().to_path_buf()),
            git,
            ..Config::default()
        }
    }

    /// Starts the writer (its vault from the section, history off).
    async fn start(&mut self) {
        self.start_with(false).await;
    }

    async fn start_with(&mut self, git: bool) {
        let data = self.nats.data_dir().unwrap();
        let service = InProcess::service(&self.writer, self.config(git), &data, writer::run)
            .await
            .unwrap();
        self.service = Some(service);
    }

    async fn stop(&mut self) {
        if let Some(s) = self.service.take() {
            s.stop(Duration::from_secs(10)).await.unwrap();
        }
    }

    /// Publishes `w` as the brain; its stream sequence.
    async fn send(&self, w: VaultWrite) -> u64 {
        self.brain.publish(w).await.unwrap().sequence
    }

    /// Every message of the stream.
    async fn stream(&self) -> Vec<StoredMessage> {
        let mut reader = self.admin.read_range(&ops(), 1, None).await.unwrap();
        let mut out = Vec::new();
        while let Some(m) = reader.next().await {
            out.push(m.unwrap());
        }
        out
    }

    /// Every answer on the stream, in order.
    async fn answers(&self) -> Vec<VaultWritten> {
        self.stream()
            .await
            .iter()
            .filter_map(|m| match m.decode() {
                Ok(AnyMessage::VaultWritten(w)) => Some(w),
                _ => None,
            })
            .collect()
    }

    /// Waits for the answer to `request`.
    async fn answer(&self, request: &str) -> VaultWritten {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(a) = self
                .answers()
                .await
                .into_iter()
                .find(|a| a.request_id == request)
            {
                return a;
            }
            assert!(Instant::now() < deadline, "no answer to {request}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The write stored at `seq`, as the writer receives it (with the
    /// creation time the bus gave it).
    async fn stored(&self, seq: u64) -> (StoredMessage, VaultWrite) {
        let m = self
            .stream()
            .await
            .into_iter()
            .find(|m| m.sequence == seq)
            .unwrap();
        match m.decode().unwrap() {
            AnyMessage::VaultWrite(w) => (m, w),
            other => panic!("not a write at {seq}: {other:?}"),
        }
    }

    fn note(&self, rel: &str) -> Option<String> {
        std::fs::read_to_string(self.root().join(rel)).ok()
    }

    async fn record(&self, request: &str) -> Option<WriteRecord> {
        KvRecords::new(self.writer.clone(), ops())
            .read(request)
            .await
            .unwrap()
            .map(|(r, _)| r)
    }
}

use nisse_tests::vault_write as write;

fn with_mode(mut w: VaultWrite, mode: VaultWriteMode) -> VaultWrite {
    w.mode = mode as i32;
    w
}

use nisse_tests::vault_files as files;

/// Every hidden entry under `root` but `.git`: temporaries left behind.
fn litter(root: &Path) -> Vec<String> {
    fn walk(dir: &Path, out: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let entry = entry.unwrap();
            let name = entry.file_name().to_string_lossy().into_owned();
            if name == ".git" {
                continue;
            }
            if name.starts_with('.') {
                out.push(entry.path().display().to_string());
            } else if entry.path().is_dir() {
                walk(&entry.path(), out);
            }
        }
    }
    let mut out = Vec::new();
    walk(root, &mut out);
    out
}

fn rfc3339(w: &VaultWrite) -> String {
    let t = w.envelope.as_ref().unwrap().created_at.unwrap();
    time::OffsetDateTime::from_unix_timestamp_nanos(
        i128::from(t.seconds) * 1_000_000_000 + i128::from(t.nanos),
    )
    .unwrap()
    .format(&time::format_description::well_known::Rfc3339)
    .unwrap()
}

#[tokio::test]
async fn a_note_is_written_into_the_agents_memory_with_its_provenance() {
    let mut bench = Bench::new().await;
    bench.start().await;
    let mut w = write(
        "r1",
        "memory/ops/facts/nas01-pool.md",
        "The pool `tank` on nas01 is RAIDZ2 over six disks.\n",
    );
    w.frontmatter
        .insert("observed".into(), "2025-01-02T03:04:05Z".into());
    w.lists.insert(
        "entities".into(),
        Strings {
            values: vec!["[[nas01]]".into(), "[[tank]]".into()],
        },
    );
    w.tags = vec!["fact".into(), "storage".into()];
    let seq = bench.send(w).await;
    let answer = bench.answer("r1").await;
    let (_, sent) = bench.stored(seq).await;

    let text = bench.note("memory/ops/facts/nas01-pool.md").unwrap();
    assert_eq!(
        answer,
        VaultWritten {
            envelope: answer.envelope.clone(),
            request_id: "r1".into(),
            path: "memory/ops/facts/nas01-pool.md".into(),
            written: true,
            sha256: note::sha256_hex(text.as_bytes()),
            reason: String::new(),
        }
    );
    let env = answer.envelope.unwrap();
    assert_eq!(env.message_id, "vault-written:r1");
    assert_eq!(env.causation_id, "vault-write:r1");
    assert_eq!(env.work_item_id, "wi-1");
    assert_eq!(env.actor.unwrap().id, "vault-writer");

    let parsed = note::parse(&text).unwrap();
    assert_eq!(
        parsed.provenance(),
        Some(note::Provenance {
            agent: "ops".into(),
            work_item: "wi-1".into(),
            source: "driver via note".into(),
            stream_seq: seq,
            written: rfc3339(&sent),
            message_id: "vault-write:r1".into(),
        })
    );
    let fm = &parsed.frontmatter;
    assert_eq!(fm.get("observed"), Some("2025-01-02T03:04:05Z"));
    assert_eq!(
        fm.list("entities"),
        vec!["[[nas01]]".to_string(), "[[tank]]".to_string()]
    );
    assert_eq!(
        fm.list("tags"),
        vec!["fact".to_string(), "storage".to_string()]
    );
    assert_eq!(
        parsed.body.trim_end(),
        "The pool `tank` on nas01 is RAIDZ2 over six disks."
    );
    assert_eq!(bench.record("r1").await.unwrap().state, RecordState::Done);
    assert_eq!(litter(bench.root()), Vec::<String>::new());
    bench.stop().await;
}

#[tokio::test]
async fn the_same_write_delivered_again_or_retried_leaves_one_file_with_the_same_bytes() {
    let mut bench = Bench::new().await;
    bench.start().await;
    let path = "memory/ops/lessons/restart-order.md";
    let seq = bench
        .send(write("r1", path, "Restart the database before the app.\n"))
        .await;
    let first = bench.answer("r1").await;
    let bytes = bench.note(path).unwrap();

    // The same message stored a second time (another dedup id, as a
    // redelivery that outlived the duplicate window would be), and a
    // retry of the brain under the same request id with a new message id
    // and a later time.
    let (stored, _) = bench.stored(seq).await;
    let mut again = stored.clone();
    for (k, v) in &mut again.headers {
        if k.eq_ignore_ascii_case("Nats-Msg-Id") {
            *v = "vault-write:r1:stored-again".into();
        }
    }
    bench.admin.republish(&again).await.unwrap();
    let mut retry = write("r1", path, "Restart the database before the app.\n");
    retry.envelope.as_mut().unwrap().message_id = "vault-write:r1:retry1".into();
    bench.send(retry).await;
    // Writes are applied in stream order: once this one is answered, the
    // two before it were handled.
    bench
        .send(write("r2", "memory/ops/lessons/other.md", "x\n"))
        .await;
    bench.answer("r2").await;

    assert_eq!(
        bench.note(path).unwrap(),
        bytes,
        "the note was not rewritten"
    );
    let notes: Vec<String> = files(bench.root()).into_keys().collect();
    assert_eq!(
        notes,
        vec!["memory/ops/lessons/other.md".to_string(), path.to_string()]
    );
    let answers: Vec<VaultWritten> = bench
        .answers()
        .await
        .into_iter()
        .filter(|a| a.request_id == "r1")
        .collect();
    assert_eq!(answers, vec![first], "one answer per request id");
    let record = bench.record("r1").await.unwrap();
    assert_eq!(record.message_id, "vault-write:r1", "applied by the first");

    // The same delivery handed to the writer's one implementation again:
    // answered from the record, nothing touched.
    let (stored, w) = bench.stored(seq).await;
    let mut records = KvRecords::new(bench.writer.clone(), ops());
    let outcome = writer::apply(
        bench.root(),
        &ops(),
        &w,
        stored.sequence,
        &mut records,
        History::None,
    )
    .await
    .unwrap();
    assert!(outcome.repeated && outcome.written, "{outcome:?}");
    assert_eq!(bench.note(path).unwrap(), bytes);
    bench.stop().await;
}

#[tokio::test]
async fn writes_outside_the_agents_own_memory_are_refused_naming_the_folder_and_nothing_is_written()
{
    let mut bench = Bench::new().await;
    bench.start().await;
    let cases = [
        ("world", "world/nas01.md", "world"),
        ("dev", "memory/dev/notes.md", "memory/dev"),
        ("up", "../x.md", ".."),
        ("obsidian", ".obsidian/x.md", ".obsidian"),
        ("not-md", "memory/ops/x.txt", ".md"),
    ];
    for (request, path, _) in cases {
        bench.send(write(request, path, "nope\n")).await;
    }
    for (request, path, names) in cases {
        let a = bench.answer(request).await;
        assert!(!a.written, "{request}: {a:?}");
        assert_eq!(a.path, path);
        assert!(
            a.reason.contains(names),
            "{request}: the reason names {names}: {}",
            a.reason
        );
        assert_eq!(a.sha256, "");
    }
    assert_eq!(files(bench.root()), BTreeMap::new(), "nothing written");
    assert!(!bench.vault.path().parent().unwrap().join("x.md").exists());
    // The agent is the stream's, never the envelope's: a write on the ops
    // stream claiming to be dev's may not write dev's memory.
    let mut claim = write("claim", "memory/dev/notes.md", "nope\n");
    claim.envelope.as_mut().unwrap().agent = "dev".into();
    let outcome = writer::apply(
        bench.root(),
        &ops(),
        &claim,
        1,
        &mut MemoryRecords::default(),
        History::None,
    )
    .await
    .unwrap();
    assert!(!outcome.written);
    assert!(
        outcome
            .reason
            .contains("the ops agent writes only under memory/ops/"),
        "{}",
        outcome.reason
    );
    assert_eq!(files(bench.root()), BTreeMap::new());
    bench.stop().await;
}

#[tokio::test]
async fn append_adds_to_the_body_and_a_stale_hash_or_a_create_over_a_note_is_refused() {
    let mut bench = Bench::new().await;
    bench.start().await;
    let path = "memory/ops/index.md";
    let mut first = with_mode(
        write("a1", path, "- [[facts/one]]\n"),
        VaultWriteMode::Create,
    );
    first
        .frontmatter
        .insert("title".into(), "Memory index".into());
    first.tags = vec!["index".into()];
    bench.send(first).await;
    let created = bench.answer("a1").await;
    assert!(created.written, "{created:?}");

    let mut second = with_mode(
        write("a2", path, "- [[facts/two]]\n"),
        VaultWriteMode::Append,
    );
    second.source = "orchestrator at close".into();
    let seq = bench.send(second).await;
    let appended = bench.answer("a2").await;
    assert!(appended.written, "{appended:?}");
    let text = bench.note(path).unwrap();
    let parsed = note::parse(&text).unwrap();
    assert_eq!(parsed.body, "- [[facts/one]]\n- [[facts/two]]\n");
    let prov = parsed.provenance().unwrap();
    assert_eq!(prov.stream_seq, seq, "the provenance is the latest write's");
    assert_eq!(prov.source, "orchestrator at close");
    assert_eq!(prov.message_id, "vault-write:a2");
    assert_eq!(
        parsed.frontmatter.get("title"),
        Some("Memory index"),
        "the note's frontmatter stays"
    );
    assert_eq!(parsed.frontmatter.list("tags"), vec!["index".to_string()]);
    assert_eq!(appended.sha256, note::sha256_hex(text.as_bytes()));

    // A write that read the note before a2 changed it.
    let mut stale = write("a3", path, "replaced\n");
    stale.expected_sha256 = created.sha256.clone();
    bench.send(stale).await;
    let refused = bench.answer("a3").await;
    assert!(!refused.written);
    assert!(
        refused.reason.contains(&created.sha256) && refused.reason.contains(&appended.sha256),
        "names both hashes: {}",
        refused.reason
    );
    assert_eq!(refused.sha256, appended.sha256, "the note as it is");
    assert_eq!(bench.note(path).unwrap(), text, "unchanged");

    // With the hash it has now, it applies.
    let mut fresh = write("a4", path, "replaced\n");
    fresh.expected_sha256 = appended.sha256.clone();
    bench.send(fresh).await;
    let replaced = bench.answer("a4").await;
    assert!(replaced.written, "{replaced:?}");
    assert_eq!(
        note::parse(&bench.note(path).unwrap()).unwrap().body,
        "replaced\n"
    );

    // CREATE never replaces; a frontmatter key may not shadow provenance.
    bench
        .send(with_mode(
            write("a5", path, "again\n"),
            VaultWriteMode::Create,
        ))
        .await;
    let again = bench.answer("a5").await;
    assert!(
        !again.written && again.reason.contains("exists"),
        "{again:?}"
    );
    let mut shadow = write("a6", "memory/ops/shadow.md", "x\n");
    shadow.frontmatter.insert("agent".into(), "dev".into());
    bench.send(shadow).await;
    let shadowed = bench.answer("a6").await;
    assert!(!shadowed.written, "{shadowed:?}");
    assert!(shadowed.reason.contains("agent"), "{}", shadowed.reason);
    assert!(bench.note("memory/ops/shadow.md").is_none());

    // A refusal is recorded: the request id is answered the same later.
    assert_eq!(bench.record("a5").await.unwrap().state, RecordState::Done);
    bench.stop().await;
}

#[tokio::test]
async fn a_rebuild_into_an_empty_folder_gives_every_note_byte_for_byte() {
    let mut bench = Bench::new().await;
    bench.start().await;
    let mut seqs = Vec::new();
    seqs.push(
        bench
            .send(with_mode(
                write("b1", "memory/ops/index.md", "- one\n"),
                VaultWriteMode::Create,
            ))
            .await,
    );
    seqs.push(
        bench
            .send(with_mode(
                write("b2", "memory/ops/index.md", "- two\n"),
                VaultWriteMode::Append,
            ))
            .await,
    );
    bench
        .send(write(
            "b3",
            "memory/ops/incidents/wi-1.md",
            "What happened.\n",
        ))
        .await;
    bench
        .send(write(
            "b4",
            "memory/ops/incidents/wi-1.md",
            "What happened, and why.\n",
        ))
        .await;
    bench.send(write("b5", "world/refused.md", "no\n")).await;
    let mut retry = write("b3", "memory/ops/incidents/wi-1.md", "What happened.\n");
    retry.envelope.as_mut().unwrap().message_id = "vault-write:b3:retry1".into();
    bench.send(retry).await;
    bench
        .send(with_mode(
            write("b6", "memory/ops/index.md", "- three\n"),
            VaultWriteMode::Append,
        ))
        .await;
    bench.answer("b6").await;
    bench.stop().await;
    let live = files(bench.root());
    assert_eq!(live.len(), 2, "{:?}", live.keys());

    let into = tempfile::tempdir().unwrap();
    let rebuilt_dir = into.path().join("vault");
    let report = writer::rebuild(&bench.admin, &ops(), &rebuilt_dir)
        .await
        .unwrap();
    assert_eq!(
        report,
        writer::RebuildReport {
            writes: 7,
            written: 5,
            refused: 1,
            repeated: 1,
        }
    );
    let rebuilt = files(&rebuilt_dir);
    assert_eq!(
        rebuilt.keys().collect::<Vec<_>>(),
        live.keys().collect::<Vec<_>>()
    );
    for (path, bytes) in &live {
        assert!(
            rebuilt[path] == *bytes,
            "{path} differs:\nlive:\n{}\nrebuilt:\n{}",
            String::from_utf8_lossy(bytes),
            String::from_utf8_lossy(&rebuilt[path])
        );
    }

    // A folder with anything in it is refused, by name.
    let err = writer::rebuild(&bench.admin, &ops(), &rebuilt_dir)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(&rebuilt_dir.display().to_string()) && err.contains("not empty"),
        "{err}"
    );
}

fn git(dir: &Path, args: &[&str]) -> String {
    let out = std::process::Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test]
async fn in_a_git_vault_each_applied_write_is_one_commit_by_the_agent_naming_the_item() {
    let mut bench = Bench::new().await;
    git(bench.root(), &["init", "--quiet"]);
    // An operator's note, committed by the operator, and one not yet
    // committed: the writer commits only its own notes.
    std::fs::create_dir_all(bench.root().join("world")).unwrap();
    std::fs::write(bench.root().join("world/nas01.md"), "# nas01\n").unwrap();
    bench.start_with(true).await;
    bench
        .send(write("g1", "memory/ops/facts/a.md", "first\n"))
        .await;
    let mut second = write("g2", "memory/ops/facts/a.md", "second\n");
    second.envelope.as_mut().unwrap().work_item_id = "wi-2".into();
    bench.send(second).await;
    let mut third = write("g3", "memory/ops/incidents/wi-2.md", "summary\n");
    third.envelope.as_mut().unwrap().work_item_id = "wi-2".into();
    third.source = "orchestrator at close".into();
    bench.send(third).await;
    bench
        .send(write("g4", "world/nas01.md", "mine now\n"))
        .await;
    assert!(!bench.answer("g4").await.written);
    bench.stop().await;

    let log = git(
        bench.root(),
        &["log", "--reverse", "--format=%an <%ae>|%cn|%s"],
    );
    assert_eq!(
        log.lines().collect::<Vec<_>>(),
        vec![
            "nisse-ops <nisse-ops@nisse.invalid>|nisse-ops|ops wi-1: driver via note (memory/ops/facts/a.md)",
            "nisse-ops <nisse-ops@nisse.invalid>|nisse-ops|ops wi-2: driver via note (memory/ops/facts/a.md)",
            "nisse-ops <nisse-ops@nisse.invalid>|nisse-ops|ops wi-2: orchestrator at close (memory/ops/incidents/wi-2.md)",
        ]
    );
    let files_in_head = git(bench.root(), &["ls-tree", "-r", "--name-only", "HEAD"]);
    assert_eq!(
        files_in_head.lines().collect::<Vec<_>>(),
        vec!["memory/ops/facts/a.md", "memory/ops/incidents/wi-2.md"],
        "the operator's note is not the writer's to commit"
    );
    assert_eq!(
        git(bench.root(), &["status", "--porcelain", "--", "memory"]),
        "",
        "every note committed"
    );
}

#[tokio::test]
async fn a_write_whose_record_says_intended_is_applied_once_whether_or_not_the_rename_happened() {
    let mut bench = Bench::new().await;
    let renamed_path = "memory/ops/facts/renamed.md";
    let lost_path = "memory/ops/facts/lost.md";
    // Two writes on the stream before any writer runs.
    let lost_seq = bench.send(write("c1", lost_path, "not renamed\n")).await;
    let renamed_seq = bench.send(write("c2", renamed_path, "renamed\n")).await;

    // What a writer that crashed would have left. Its bytes are those of
    // the writer's own function over the same message and sequence.
    let scratch = tempfile::tempdir().unwrap();
    let mut scratch_records = MemoryRecords::default();
    let mut intended = BTreeMap::new();
    for (seq, request) in [(lost_seq, "c1"), (renamed_seq, "c2")] {
        let (_, w) = bench.stored(seq).await;
        let outcome = writer::apply(
            scratch.path(),
            &ops(),
            &w,
            seq,
            &mut scratch_records,
            History::None,
        )
        .await
        .unwrap();
        intended.insert(request, (w, outcome));
    }
    let scratch_files = files(scratch.path());
    let mut records = KvRecords::new(bench.writer.clone(), ops());
    for (request, (w, outcome)) in &intended {
        let envelope = w.envelope.as_ref().unwrap();
        records
            .write(
                &WriteRecord::intended(request, &envelope.message_id, &w.path, &outcome.sha256),
                None,
            )
            .await
            .unwrap();
    }
    // c1 crashed after writing part of its temporary, before the rename.
    let lost_folder = bench.root().join("memory/ops/facts");
    std::fs::create_dir_all(&lost_folder).unwrap();
    let tag = &nisse_bus::key_hash("c1")[..12];
    std::fs::write(
        lost_folder.join(format!(".lost.md.{tag}.tmp")),
        b"---\nagent: op",
    )
    .unwrap();
    // c2 crashed after the rename, before its record said done.
    std::fs::write(
        bench.root().join(renamed_path),
        &scratch_files[renamed_path],
    )
    .unwrap();
    let inode = std::os::unix::fs::MetadataExt::ino(
        &std::fs::metadata(bench.root().join(renamed_path)).unwrap(),
    );

    bench.start().await;
    let lost = bench.answer("c1").await;
    let renamed = bench.answer("c2").await;
    assert!(lost.written && renamed.written, "{lost:?} {renamed:?}");
    assert_eq!(lost.sha256, intended["c1"].1.sha256);
    assert_eq!(renamed.sha256, intended["c2"].1.sha256);
    assert_eq!(files(bench.root()), scratch_files, "byte for byte");
    assert_eq!(
        std::os::unix::fs::MetadataExt::ino(
            &std::fs::metadata(bench.root().join(renamed_path)).unwrap()
        ),
        inode,
        "the note renamed before the crash was not written again"
    );
    assert_eq!(
        litter(bench.root()),
        Vec::<String>::new(),
        "the partial temporary is gone"
    );
    for request in ["c1", "c2"] {
        assert_eq!(
            bench.record(request).await.unwrap().state,
            RecordState::Done
        );
    }
    bench.stop().await;
}

#[tokio::test]
async fn a_write_the_disk_refuses_for_now_is_retried_and_applied_not_answered_as_refused() {
    let mut bench = Bench::with(|cfg| {
        cfg.consumers.max_deliver = 100;
        cfg.consumers.retry_backoff_max = Duration::from_millis(100);
    })
    .await;
    // A file where the agent's memory folder should be: every write
    // fails until the operator moves it away.
    std::fs::create_dir_all(bench.root().join("memory")).unwrap();
    std::fs::write(bench.root().join("memory/ops"), b"in the way").unwrap();
    bench.start().await;
    bench
        .send(write("t1", "memory/ops/facts/a.md", "kept\n"))
        .await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(
        bench.answers().await,
        Vec::new(),
        "not answered while failing"
    );
    std::fs::remove_file(bench.root().join("memory/ops")).unwrap();
    let a = bench.answer("t1").await;
    assert!(a.written, "{a:?}");
    assert_eq!(
        note::parse(&bench.note("memory/ops/facts/a.md").unwrap())
            .unwrap()
            .body,
        "kept\n"
    );
    // Nothing went to the dead letters, and there is no bucket record
    // other than this write's.
    let dead = bench
        .stream()
        .await
        .iter()
        .filter(|m| m.subject.ends_with(".deadletter"))
        .count();
    assert_eq!(dead, 0);
    let kept: Vec<WriteRecord> = bench.admin.kv_list(VAULT_BUCKET, &ops()).await.unwrap();
    assert_eq!(kept.len(), 1);
    bench.stop().await;
}
