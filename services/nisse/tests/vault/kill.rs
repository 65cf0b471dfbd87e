//! The vault writer as its own `nisse serve vault-writer` process on a
//! secured server, SIGKILLed in the middle of 500 writes: every note on
//! disk is then absent, whole-old or whole-new, never partial; restarted,
//! it catches up, and every note is there once with its own content and
//! every write answered once.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use pretty_assertions::assert_eq;

use nisse_bus::auth::Identity;
use nisse_bus::proto::{VaultWrite, VaultWritten};
use nisse_bus::{AnyMessage, Bus, Role};
use nisse_tests::{TestNats, ops};

use crate::alerts::{Install, stop};
use crate::signal;

/// Notes written by the burst.
const NOTES: usize = 500;
/// Every fifth note exists before the burst, so the burst replaces some
/// notes and makes the others.
const OLD_EVERY: usize = 5;
/// Bytes of filler per note: several pages, so a note written in place
/// would be caught half-written.
const FILLER: usize = 16 * 1024;

fn rel(i: usize) -> String {
    format!("memory/ops/burst/note-{i:03}.md")
}

/// The body of note `i` in `version` (`old` or `new`): its own first and
/// last line around the filler, so any prefix or mix is told apart.
fn body(i: usize, version: &str) -> String {
    let mut text = format!("note {i} {version} begins\n");
    let line = format!("{version} filler of note {i}, to be read whole or not at all\n");
    while text.len() < FILLER {
        text.push_str(&line);
    }
    text.push_str(&format!("note {i} {version} ends\n"));
    text
}

fn write(request: &str, i: usize, version: &str) -> VaultWrite {
    nisse_tests::vault_write(request, &rel(i), &body(i, version))
}

/// Every answer on the stream.
async fn answers(admin: &Bus) -> Vec<VaultWritten> {
    let mut reader = admin.read_range(&ops(), 1, None).await.unwrap();
    let mut out = Vec::new();
    while let Some(m) = reader.next().await {
        if let Ok(AnyMessage::VaultWritten(w)) = m.unwrap().decode() {
            out.push(w);
        }
    }
    out
}

/// What the note at `i` is, checked whole: `None` when absent, else
/// its version (`old` or `new`). Panics on anything partial, mixed or
/// without its provenance.
fn version(folder: &Path, i: usize) -> Option<&'static str> {
    let path = folder.join(format!("note-{i:03}.md"));
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => panic!("{}: {e}", path.display()),
    };
    let note = nisse_vault::note::parse(&text)
        .unwrap_or_else(|e| panic!("{} is not a whole note ({e}):\n{text}", path.display()));
    let prov = note
        .provenance()
        .unwrap_or_else(|| panic!("{} has no provenance", path.display()));
    assert_eq!(prov.agent, "ops");
    assert_eq!(prov.work_item, "wi-1");
    for (version, request) in [("old", format!("old-{i}")), ("new", format!("new-{i}"))] {
        if prov.message_id == format!("vault-write:{request}") {
            assert!(
                note.body == body(i, version),
                "{} has the provenance of its {version} version but not its whole body ({} bytes)",
                path.display(),
                note.body.len()
            );
            return Some(version);
        }
    }
    panic!(
        "{} has the provenance of another write: {}",
        path.display(),
        prov.message_id
    );
}

/// The note versions in `folder` by number, checking that nothing else
/// is there but hidden temporaries.
fn versions(folder: &Path) -> BTreeMap<usize, &'static str> {
    let mut out = BTreeMap::new();
    let Ok(entries) = std::fs::read_dir(folder) else {
        return out;
    };
    for entry in entries {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        if name.starts_with('.') {
            continue;
        }
        let i: usize = name
            .strip_prefix("note-")
            .and_then(|n| n.strip_suffix(".md"))
            .and_then(|n| n.parse().ok())
            .filter(|i| *i < NOTES)
            .unwrap_or_else(|| panic!("{name} is not one of the notes written"));
        if let Some(v) = version(folder, i) {
            out.insert(i, v);
        }
    }
    out
}

/// How many of the notes the burst makes (none before it) are on disk.
fn made(folder: &Path) -> usize {
    (0..NOTES)
        .filter(|i| i % OLD_EVERY != 0 && folder.join(format!("note-{i:03}.md")).exists())
        .count()
}

#[tokio::test]
async fn a_vault_writer_killed_mid_burst_leaves_only_whole_notes_and_after_restart_each_is_there_once()
 {
    let nats = TestNats::secured(&["ops"]).await.unwrap();
    let admin = nats.bus(&["ops"]).await.unwrap();
    admin.ensure_topology().await.unwrap();
    let brain = nats
        .bus_as(&Identity::service(Role::Brain, &ops()), &["ops"])
        .await
        .unwrap();
    let install = Install::new(&nats);
    let folder = install.data().join("vault/memory/ops/burst");
    let mut writer = install.serve(&["vault-writer"]);

    // The old versions, written and answered before the burst.
    let old: Vec<usize> = (0..NOTES).filter(|i| i % OLD_EVERY == 0).collect();
    for &i in &old {
        brain
            .publish(write(&format!("old-{i}"), i, "old"))
            .await
            .unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while answers(&admin).await.len() < old.len() {
        assert!(
            Instant::now() < deadline,
            "the old versions were not written; log:\n{}",
            install.log(&["vault-writer"])
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // The burst, published while the writer works through it.
    let publisher = {
        let brain = brain.clone();
        tokio::spawn(async move {
            let mut pending = Vec::with_capacity(NOTES);
            for i in 0..NOTES {
                pending.push(
                    brain
                        .send(write(&format!("new-{i}"), i, "new"))
                        .await
                        .unwrap(),
                );
            }
            for p in pending {
                p.acked().await.unwrap();
            }
        })
    };
    // Killed once it is some way in.
    let deadline = Instant::now() + Duration::from_secs(60);
    while made(&folder) < 40 {
        assert!(
            Instant::now() < deadline,
            "the burst did not start; log:\n{}",
            install.log(&["vault-writer"])
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    signal(writer.id().unwrap() as i32, Signal::SIGKILL);
    writer.wait().await.unwrap();

    // Every note absent, whole-old or whole-new.
    let at_kill = versions(&folder);
    for &i in &old {
        assert!(at_kill.contains_key(&i), "old note {i} vanished");
    }
    let new_at_kill = at_kill.values().filter(|v| **v == "new").count();
    assert!(
        (40..NOTES).contains(&new_at_kill),
        "killed in the middle: {new_at_kill} of {NOTES} new"
    );
    publisher.await.unwrap();

    // Restarted, it catches up.
    let mut writer = install.serve(&["vault-writer"]);
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let now = versions(&folder);
        if now.len() == NOTES && now.values().all(|v| *v == "new") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "only {} of {NOTES} notes are new; log:\n{}",
            now.values().filter(|v| **v == "new").count(),
            install.log(&["vault-writer"])
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    let burst = loop {
        let burst: Vec<VaultWritten> = answers(&admin)
            .await
            .into_iter()
            .filter(|a| a.request_id.starts_with("new-"))
            .collect();
        if burst.len() >= NOTES {
            break burst;
        }
        assert!(
            Instant::now() < deadline,
            "{} of {NOTES} answers",
            burst.len()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    // Let anything redelivered come and be dropped as a duplicate.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    stop(&mut writer).await;

    let burst_after: Vec<VaultWritten> = answers(&admin)
        .await
        .into_iter()
        .filter(|a| a.request_id.starts_with("new-"))
        .collect();
    assert_eq!(burst_after.len(), burst.len(), "no late second answers");
    assert_eq!(burst.len(), NOTES, "one answer per write");
    let ids: BTreeSet<&str> = burst.iter().map(|a| a.request_id.as_str()).collect();
    assert_eq!(ids.len(), NOTES, "one answer per request id");
    let refused: Vec<&VaultWritten> = burst.iter().filter(|a| !a.written).collect();
    assert!(refused.is_empty(), "{refused:?}");
    for a in &burst {
        let i: usize = a.request_id["new-".len()..].parse().unwrap();
        let bytes = std::fs::read(folder.join(format!("note-{i:03}.md"))).unwrap();
        assert_eq!(
            a.sha256,
            nisse_vault::note::sha256_hex(&bytes),
            "{}",
            a.request_id
        );
        assert_eq!(a.path, rel(i));
    }
    let mut left: Vec<String> = std::fs::read_dir(&folder)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with('.'))
        .collect();
    left.sort();
    assert_eq!(left, Vec::<String>::new(), "temporaries left behind");
    assert_eq!(versions(&folder).len(), NOTES);
}
