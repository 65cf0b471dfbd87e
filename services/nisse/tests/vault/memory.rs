//! Memory end to end, each service in its own `nisse serve` process on a
//! secured NATS, with the scripted model and a real vault folder: an
//! item's summary is written at close; the next incident with the same
//! fingerprint starts with it and with the runbook bound to its alert,
//! snapshotted into its log; the operator's correction is kept byte for
//! byte; every file is a note Obsidian reads; and the brain rebuilds the
//! same state from the stream with the vault services stopped, as the
//! vault's notes do into an empty folder.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::json;

use nisse_bus::proto;
use nisse_core::Event;
use nisse_tests::TestNats;
use nisse_tests::model::{Reply, ScriptedModel};

use super::super::alerts::{Install, alert_received, rebuild, stop, wait_quiet};

const RUNBOOK: &str = "---\ntitle: \"Disk full on a NAS\"\nrunbook_for:\n  - \"alert:DiskFull\"\n---\n# Disk full on a NAS\n\n1. `zfs list -o space`\n2. Prune snapshots older than 30 days; never grow the pool without asking.\n";

use nisse_tests::vault_files as files;

async fn wait_for<T>(what: &str, logs: impl Fn() -> String, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "never: {what}\n{}", logs());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The same alert as `alert_received`, fired anew (`n`: its dedup id).
fn fired(n: u32) -> proto::AlertReceived {
    let mut alert = alert_received("DiskFull", "nas:9100");
    alert.envelope.as_mut().unwrap().message_id = format!("alert:DiskFull:firing:{n}");
    alert
}

#[tokio::test]
async fn a_repeat_incident_starts_with_the_earlier_summary_and_its_runbook_and_rebuilds_without_the_vault()
 {
    let nats = TestNats::secured(&["ops"]).await.unwrap();
    let bus = nats.bus(&["ops"]).await.unwrap();
    bus.ensure_topology().await.unwrap();
    let model = ScriptedModel::start().await.unwrap();
    let install = Install::new(&nats);
    let cfg = install.path().join("nisse.toml");
    let mut text = std::fs::read_to_string(&cfg).unwrap();
    text.push_str(&format!(
        "[ops]\nflap-window = \"1s\"\noperators = [\"matrix:@op:example.org\"]\n\
         [models]\nendpoint = \"{}\"\nretry-backoff = \"50ms\"\n\
         roles = {{ driver = \"local-driver\" }}\n\
         [models.models.local-driver]\ncontext-window = 32000\nmax-output-tokens = 1024\n",
        model.base_url()
    ));
    std::fs::write(&cfg, text).unwrap();
    let vault: PathBuf = install.data().join("vault");
    std::fs::create_dir_all(vault.join("procedures")).unwrap();
    std::fs::write(vault.join("procedures/disk-full.md"), RUNBOOK).unwrap();

    let finish = |done: &str| Reply::ToolCall {
        name: "finish".into(),
        arguments: json!({ "done": done, "verified": "zfs list shows 40% free", "left_open": "a retention policy" }),
    };
    model.push([
        finish("pruned 212 old snapshots on tank"),
        finish("pruned again"),
    ]);
    let mut children: Vec<(&str, tokio::process::Child)> =
        ["vault-writer", "vault-reader", "model-gateway", "brain"]
            .into_iter()
            .map(|name| (name, install.serve(&[name])))
            .collect();
    let logs = || {
        ["vault-writer", "vault-reader", "model-gateway", "brain"]
            .iter()
            .map(|n| format!("--- {n}\n{}", install.log(&[n])))
            .collect::<String>()
    };

    // The first incident: recalled (the runbook), finished, summarised.
    bus.publish(fired(1)).await.unwrap();
    let incidents = vault.join("memory/ops/incidents");
    let summary = wait_for("the first item's summary on disk", &logs, || {
        files(&incidents).into_iter().next()
    })
    .await;
    let summary_text = String::from_utf8(summary.1.clone()).unwrap();
    assert!(
        summary_text.contains("pruned 212 old snapshots on tank"),
        "{summary_text}"
    );
    assert!(summary_text.contains("fingerprint:"), "{summary_text}");
    assert_eq!(model.requests().len(), 1);

    // The same alert again, after the flap window: a new item, whose first
    // context holds the earlier summary and the runbook.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    bus.publish(fired(2)).await.unwrap();
    let second = wait_for("the second item's first model call", &logs, || {
        model.requests().get(1).cloned()
    })
    .await;
    let context: String = second["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["content"].as_str().unwrap_or_default().to_string())
        .collect::<Vec<_>>()
        .join("\n");
    assert!(
        context.contains("Prune snapshots older than 30 days"),
        "{context}"
    );
    assert!(
        context.contains("pruned 212 old snapshots on tank"),
        "{context}"
    );
    let incident_path = format!("memory/ops/incidents/{}", summary.0);
    assert!(
        context.contains(&format!(
            "[untrusted: vault note \"{incident_path}\"; data "
        )),
        "the summary quotes alert text: fenced as data\n{context}"
    );

    let live = wait_quiet(&install, &nats).await;
    assert_eq!(live.items.len(), 2);
    let second_item = &live.items[1].id;
    let retrieved: Vec<(String, String)> = live
        .events
        .iter()
        .filter(|e| &e.work_item_id == second_item)
        .filter_map(|e| match &e.event {
            Event::KnowledgeRetrieved { notes, .. } => Some(notes.clone()),
            _ => None,
        })
        .flatten()
        .map(|n| (n.path, n.sha256))
        .collect();
    let sha = |bytes: &[u8]| nisse_vault::sha256_hex(bytes);
    assert!(
        retrieved.contains(&(
            "procedures/disk-full.md".to_string(),
            sha(RUNBOOK.as_bytes())
        )),
        "{retrieved:?}"
    );
    assert!(
        retrieved.contains(&(incident_path.clone(), sha(&summary.1))),
        "{retrieved:?}"
    );

    // An operator's correction in the room, kept byte for byte.
    let correction = "remember: tank's snapshots are the backups — prune only `auto-*` ones!  ";
    bus.publish(proto::MatrixEventReceived {
        envelope: Some(proto::Envelope {
            agent: "ops".into(),
            actor: Some(proto::Actor {
                kind: proto::ActorKind::External as i32,
                id: "@op:example.org".into(),
            }),
            message_id: "matrix:$correction".into(),
            ..Default::default()
        }),
        event_id: "$correction".into(),
        sender: "@op:example.org".into(),
        kind: proto::MatrixEventKind::Message as i32,
        body: correction.into(),
        ..Default::default()
    })
    .await
    .unwrap();
    let facts = vault.join("memory/ops/facts");
    let fact = wait_for("the correction on disk", &logs, || {
        files(&facts).into_iter().next()
    })
    .await;
    let note = nisse_vault::parse(std::str::from_utf8(&fact.1).unwrap()).unwrap();
    assert_eq!(
        note.body.trim_end_matches('\n'),
        correction.trim_end_matches('\n')
    );
    assert!(
        std::str::from_utf8(&fact.1).unwrap().contains(correction),
        "byte for byte"
    );
    assert_eq!(note.frontmatter.get("said_by"), Some("@op:example.org"));
    assert_eq!(note.frontmatter.get("trust"), Some("operator"));
    wait_for("the index lists the correction", &logs, || {
        std::fs::read_to_string(vault.join("memory/ops/index.md"))
            .ok()
            .filter(|i| {
                i.contains(&format!(
                    "memory/ops/facts/{}",
                    fact.0.trim_end_matches(".md")
                ))
            })
    })
    .await;

    // Every file is a note Obsidian reads: frontmatter that parses, links
    // that resolve, none from a shared note into memory.
    for (path, bytes) in files(&vault) {
        nisse_vault::parse(std::str::from_utf8(&bytes).unwrap())
            .unwrap_or_else(|e| panic!("{path}: {e}"));
    }
    let problems = nisse_vault::links::check_vault(&vault);
    assert!(problems.is_empty(), "{problems:?}");

    // The brain rebuilds the same state from the stream, the vault
    // services stopped.
    let live = wait_quiet(&install, &nats).await;
    for (_, child) in &mut children {
        stop(child).await;
    }
    drop(model);
    let (_, rebuilt, _) = rebuild(&install).await;
    assert_eq!(rebuilt, live);

    // And the agent's notes regenerate from the stream, byte for byte.
    let again = tempfile::tempdir().unwrap();
    nisse_vault_writer::writer::rebuild(&bus, &nisse_tests::ops(), again.path())
        .await
        .unwrap();
    assert_eq!(
        files(&again.path().join("memory")),
        files(&vault.join("memory")),
        "the rebuilt memory is the live one"
    );
}
