//! The operator's commands over the vault folder: `nisse world show`,
//! `blast` and `check` on a small world and on a generated world of 1,000
//! entities, `nisse vault check`, and `nisse vault rebuild` against what
//! `nisse serve vault-writer` wrote.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant};

use pretty_assertions::assert_eq;

use nisse_bus::auth::Identity;
use nisse_bus::proto::{VaultWrite, VaultWriteMode};
use nisse_bus::{AnyMessage, Bus, Role};
use nisse_tests::{TestNats, ops, vault_files};

use crate::alerts::{Install, stop};
use crate::{nisse, run, text};

/// A data directory whose vault holds `notes` (path, text).
fn vault(notes: &[(&str, String)]) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    for (path, text) in notes {
        let file = data.join("vault").join(path);
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(&file, text).unwrap();
    }
    (dir, data)
}

/// `nisse <args> --data-dir <data>` in `dir`.
async fn nisse_at(dir: &Path, data: &Path, args: &[&str]) -> Output {
    run(nisse(dir).args(args).arg("--data-dir").arg(data)).await
}

/// Its stdout, or the test fails with its stderr.
async fn ok(dir: &Path, data: &Path, args: &[&str]) -> String {
    let out = nisse_at(dir, data, args).await;
    assert!(
        out.status.success(),
        "nisse {args:?} failed: {}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// A world note: its type and frontmatter lines after it, and a heading.
fn entity(kind: &str, fields: &str, title: &str) -> String {
    format!("---\ntype: {kind}\n{fields}---\n# {title}\n")
}

/// The small world: a pool, a host storing on it, a VM on the host, two
/// services on the VM (one depending on the other), and a service on
/// another host's VM that depends on one of them; a procedure and a
/// memory note linking into it.
fn small_world() -> Vec<(&'static str, String)> {
    vec![
        ("world/storage/tank.md", entity("pool", "", "The tank pool")),
        (
            "world/hosts/pve01.md",
            entity("host", "stores_on: \"[[tank]]\"\n", "pve01"),
        ),
        ("world/hosts/pve02.md", entity("host", "", "pve02")),
        (
            "world/vms/db01.md",
            entity(
                "vm",
                "runs_on: \"[[pve01]]\"\naliases:\n  - db01.home.arpa\n",
                "The database VM",
            ),
        ),
        (
            "world/vms/web01.md",
            entity("vm", "runs_on: \"[[pve02]]\"\n", "web01"),
        ),
        (
            "world/services/postgresql.md",
            entity(
                "service",
                "title: PostgreSQL\nruns_on: \"[[db01]]\"\naliases: [postgresql.service]\n",
                "PostgreSQL",
            ),
        ),
        (
            "world/services/grafana.md",
            entity(
                "service",
                "runs_on: \"[[db01]]\"\ndepends_on:\n  - \"[[postgresql]]\"\n",
                "Grafana",
            ),
        ),
        (
            "world/services/homepage.md",
            entity(
                "service",
                "runs_on: web01\ndepends_on: \"[[grafana]]\"\n",
                "The homepage",
            ),
        ),
        (
            "procedures/restart-postgresql.md",
            "---\nrunbook_for:\n  - alert:PostgresDown\n---\n# Restart\n\nOn [[db01]], restart [[postgresql]].\n"
                .to_string(),
        ),
        (
            "memory/ops/facts/db01-disk.md",
            "---\nagent: ops\n---\n[[db01]] has a small /var.\n".to_string(),
        ),
    ]
}

#[tokio::test]
async fn world_blast_lists_every_dependent_of_a_pool_with_its_path() {
    let (dir, data) = vault(&small_world());
    let out = ok(dir.path(), &data, &["world", "blast", "tank"]).await;
    assert_eq!(
        out,
        "pve01: stores_on tank\n\
         db01: runs_on pve01 → stores_on tank\n\
         grafana: runs_on db01 → runs_on pve01 → stores_on tank\n\
         postgresql: runs_on db01 → runs_on pve01 → stores_on tank\n\
         homepage: depends_on grafana → runs_on db01 → runs_on pve01 → stores_on tank\n\
         5 entities are affected if tank stops\n"
    );

    // By alias, and with what relies on a service only through another.
    let out = ok(dir.path(), &data, &["world", "blast", "postgresql.service"]).await;
    assert_eq!(
        out,
        "grafana: depends_on postgresql\n\
         homepage: depends_on grafana → depends_on postgresql\n\
         2 entities are affected if postgresql stops\n"
    );
    let out = ok(dir.path(), &data, &["world", "blast", "homepage"]).await;
    assert_eq!(out, "nothing else is affected if homepage stops\n");

    let json: serde_json::Value =
        serde_json::from_str(&ok(dir.path(), &data, &["world", "blast", "tank", "--json"]).await)
            .unwrap();
    assert_eq!(json["root"], "tank");
    assert_eq!(json["kind"], "pool");
    assert_eq!(json["count"], 5);
    let homepage = &json["affected"][4];
    assert_eq!(homepage["entity"], "homepage");
    assert_eq!(homepage["depth"], 4);
    let hops: Vec<(String, String, String)> = homepage["path"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| {
            (
                h["from"].as_str().unwrap().to_string(),
                h["relation"].as_str().unwrap().to_string(),
                h["to"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let hop = |f: &str, r: &str, t: &str| (f.to_string(), r.to_string(), t.to_string());
    assert_eq!(
        hops,
        vec![
            hop("homepage", "depends_on", "grafana"),
            hop("grafana", "runs_on", "db01"),
            hop("db01", "runs_on", "pve01"),
            hop("pve01", "stores_on", "tank"),
        ]
    );
}

#[tokio::test]
async fn world_show_names_the_entity_its_relations_and_its_direct_dependents() {
    let (dir, data) = vault(&small_world());
    let out = ok(dir.path(), &data, &["world", "show", "db01.home.arpa"]).await;
    let note = data.join("vault/world/vms/db01.md");
    assert_eq!(
        out,
        format!(
            "db01 (vm): The database VM\n  \
             note:     {}\n  \
             aliases:  db01.home.arpa\n  \
             relies on:\n    \
             runs_on pve01 (host)\n  \
             relied on directly by 2:\n    \
             grafana (service) runs_on db01\n    \
             postgresql (service) runs_on db01\n  \
             if it stops: 3 entities affected (nisse world blast db01)\n",
            note.display()
        )
    );

    let json: serde_json::Value =
        serde_json::from_str(&ok(dir.path(), &data, &["world", "show", "grafana", "--json"]).await)
            .unwrap();
    assert_eq!(json["entity"]["name"], "grafana");
    assert_eq!(json["entity"]["kind"], "service");
    assert_eq!(json["entity"]["path"], "world/services/grafana.md");
    assert_eq!(
        json["entity"]["relations"],
        serde_json::json!([
            {"kind": "runs_on", "target": "db01"},
            {"kind": "depends_on", "target": "postgresql"},
        ])
    );
    assert_eq!(
        json["dependents"],
        serde_json::json!([{"entity": "homepage", "kind": "service", "relation": "depends_on"}])
    );
    assert_eq!(json["affected"], 1);

    // An unknown name is an error naming it, with the names near it.
    let out = nisse_at(dir.path(), &data, &["world", "show", "postgres"]).await;
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("no entity or alias `postgres`"), "{err}");
    assert!(err.contains("the closest: postgresql"), "{err}");
    let out = nisse_at(dir.path(), &data, &["world", "blast", "nas99"]).await;
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("`nas99`"),
        "{}",
        text(&out.stderr)
    );
}

#[tokio::test]
async fn a_clean_vault_passes_both_checks_with_a_summary() {
    let (dir, data) = vault(&small_world());
    let out = ok(dir.path(), &data, &["world", "check"]).await;
    assert_eq!(
        out,
        format!(
            "the world model is valid: 8 entities (2 host, 1 pool, 3 service, 2 vm), 8 relations; 10 notes checked in {}, every link resolves\n",
            data.join("vault").display()
        )
    );
    let out = ok(dir.path(), &data, &["vault", "check"]).await;
    assert!(out.starts_with("10 notes checked in "), "{out}");
    assert!(out.contains("every link resolves"), "{out}");
}

#[tokio::test]
async fn a_dangling_link_fails_world_check_naming_file_and_line() {
    let mut notes = small_world();
    notes.retain(|(p, _)| *p != "world/services/grafana.md");
    notes.push((
        "world/services/grafana.md",
        // influxdb is on line 6.
        entity(
            "service",
            "runs_on: \"[[db01]]\"\ndepends_on:\n  - \"[[postgresql]]\"\n  - \"[[influxdb]]\"\n",
            "Grafana",
        ),
    ));
    notes.push((
        "procedures/dashboards.md",
        "---\ntitle: Dashboards\n---\n# Dashboards\n\nSee [[grafana]] and [[dashboard-exports]].\n"
            .to_string(),
    ));
    let (dir, data) = vault(&notes);

    let out = nisse_at(dir.path(), &data, &["world", "check"]).await;
    assert!(!out.status.success(), "{}", text(&out.stdout));
    let problems = text(&out.stdout);
    let lines: Vec<&str> = problems.lines().collect();
    assert_eq!(lines.len(), 2, "{problems}");
    assert!(
        lines[0].starts_with("procedures/dashboards.md:6: [[dashboard-exports]]"),
        "{problems}"
    );
    assert!(
        lines[1].starts_with("world/services/grafana.md:6: depends_on names \"influxdb\""),
        "{problems}"
    );
    assert!(
        text(&out.stderr).contains("2 problem(s) in the vault"),
        "{}",
        text(&out.stderr)
    );

    // The rest of the world still answers.
    let out = ok(dir.path(), &data, &["world", "blast", "postgresql"]).await;
    assert!(out.starts_with("grafana: depends_on postgresql\n"), "{out}");

    // The link check alone says the body's link, and a shared note
    // linking into memory.
    notes.push((
        "procedures/disk.md",
        "# Disk\n\nAs [[memory/ops/facts/db01-disk]] says.\n".to_string(),
    ));
    let (dir, data) = vault(&notes);
    let out = nisse_at(dir.path(), &data, &["vault", "check"]).await;
    assert!(!out.status.success());
    let problems = text(&out.stdout);
    assert!(
        problems.contains("procedures/dashboards.md:6: "),
        "{problems}"
    );
    assert!(problems.contains("procedures/disk.md:3: "), "{problems}");
    assert!(
        problems.contains("never from shared notes into memory"),
        "{problems}"
    );
}

/// A world of 1,000 entities: the pool `tank` with 10 hosts storing on
/// it, 90 VMs on them, 799 services on the VMs (from `s090` on, each also
/// depending on the service 90 before it, on the same VM), a chain of 98
/// services each depending only on the one before it, the first on
/// `s000`; and a pool `spare` with one host on it, which nothing else
/// relies on.
fn big_world() -> Vec<(String, String)> {
    let mut notes = vec![
        (
            "world/pools/tank.md".to_string(),
            entity("pool", "", "tank"),
        ),
        (
            "world/pools/spare.md".to_string(),
            entity("pool", "", "spare"),
        ),
        (
            "world/hosts/hspare.md".to_string(),
            entity("host", "stores_on: spare\n", "hspare"),
        ),
    ];
    for h in 0..10 {
        notes.push((
            format!("world/hosts/h{h:02}.md"),
            entity("host", "stores_on: \"[[tank]]\"\n", "host"),
        ));
    }
    for v in 0..90 {
        notes.push((
            format!("world/vms/v{v:02}.md"),
            entity("vm", &format!("runs_on: \"[[h{:02}]]\"\n", v % 10), "vm"),
        ));
    }
    for s in 0..799 {
        let depends = if s >= 90 {
            format!("depends_on: \"[[s{:03}]]\"\n", s - 90)
        } else {
            String::new()
        };
        notes.push((
            format!("world/services/s{s:03}.md"),
            entity(
                "service",
                &format!("runs_on: \"[[v{:02}]]\"\n{depends}", s % 90),
                "service",
            ),
        ));
    }
    for c in 0..98 {
        let before = if c == 0 {
            "s000".to_string()
        } else {
            format!("c{:02}", c - 1)
        };
        notes.push((
            format!("world/chain/c{c:02}.md"),
            entity(
                "service",
                &format!("depends_on: \"[[{before}]]\"\n"),
                "chain",
            ),
        ));
    }
    assert_eq!(notes.len(), 1000);
    notes
}

#[tokio::test]
async fn the_blast_radius_of_a_pool_in_a_world_of_1000_entities_lists_every_dependent() {
    let notes = big_world();
    let borrowed: Vec<(&str, String)> =
        notes.iter().map(|(p, t)| (p.as_str(), t.clone())).collect();
    let (dir, data) = vault(&borrowed);
    let out = ok(dir.path(), &data, &["world", "check"]).await;
    assert!(out.contains("1000 entities"), "{out}");

    let json: serde_json::Value =
        serde_json::from_str(&ok(dir.path(), &data, &["world", "blast", "tank", "--json"]).await)
            .unwrap();
    let affected = json["affected"].as_array().unwrap();
    let names: BTreeSet<String> = affected
        .iter()
        .map(|a| a["entity"].as_str().unwrap().to_string())
        .collect();
    let expected: BTreeSet<String> = notes
        .iter()
        .map(|(p, _)| {
            p.rsplit('/')
                .next()
                .unwrap()
                .trim_end_matches(".md")
                .to_string()
        })
        .filter(|n| !["tank", "spare", "hspare"].contains(&n.as_str()))
        .collect();
    assert_eq!(json["count"], 997);
    assert_eq!(names, expected);
    // Each path leads, hop by hop, from the entity to the pool, and is as
    // long as its depth.
    for a in affected {
        let path = a["path"].as_array().unwrap();
        assert_eq!(path.len() as u64, a["depth"].as_u64().unwrap(), "{a}");
        assert_eq!(path[0]["from"], a["entity"], "{a}");
        assert_eq!(path[path.len() - 1]["to"], "tank", "{a}");
        for pair in path.windows(2) {
            assert_eq!(pair[0]["to"], pair[1]["from"], "{a}");
        }
    }

    // In text: one line per dependent and the count; the end of the chain
    // is 100 hops away.
    let out = ok(dir.path(), &data, &["world", "blast", "tank"]).await;
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 998);
    assert_eq!(lines[997], "997 entities are affected if tank stops");
    let mut chain = String::from("c97: ");
    for c in (0..97).rev() {
        chain.push_str(&format!("depends_on c{c:02} → "));
    }
    chain.push_str("depends_on s000 → runs_on v00 → runs_on h00 → stores_on tank");
    assert_eq!(lines[996], chain);
    assert!(lines.contains(&"s095: runs_on v05 → runs_on h05 → stores_on tank"));
}

fn note_write(request: &str, path: &str, markdown: &str, mode: VaultWriteMode) -> VaultWrite {
    VaultWrite {
        mode: mode as i32,
        source: "driver via remember".into(),
        tags: vec!["fact".into()],
        ..nisse_tests::vault_write(request, path, markdown)
    }
}

/// How many writes the vault writer has answered, from the stream.
async fn answered(admin: &Bus) -> usize {
    let mut reader = admin.read_range(&ops(), 1, None).await.unwrap();
    let mut n = 0;
    while let Some(m) = reader.next().await {
        if let Ok(AnyMessage::VaultWritten(_)) = m.unwrap().decode() {
            n += 1;
        }
    }
    n
}

#[tokio::test]
async fn vault_rebuild_regenerates_the_writers_notes_byte_for_byte_into_an_empty_folder_only() {
    let nats = TestNats::secured(&["ops"]).await.unwrap();
    let admin = nats.bus(&["ops"]).await.unwrap();
    admin.ensure_topology().await.unwrap();
    let brain = nats
        .bus_as(&Identity::service(Role::Brain, &ops()), &["ops"])
        .await
        .unwrap();
    let install = Install::new(&nats);
    let mut writer = install.serve(&["vault-writer"]);
    let writes = [
        note_write(
            "w1",
            "memory/ops/facts/db01-var.md",
            "/var on [[db01]] is 8 GiB.\n",
            VaultWriteMode::Create,
        ),
        note_write(
            "w2",
            "memory/ops/index.md",
            "# Index\n\n- [[db01-var]]\n",
            VaultWriteMode::Create,
        ),
        note_write(
            "w3",
            "memory/ops/facts/db01-var.md",
            "It was grown to 16 GiB on 2026-12-01.\n",
            VaultWriteMode::Append,
        ),
        // Refused: the operator's folder.
        note_write(
            "w4",
            "world/hosts/db01.md",
            "type: host\n",
            VaultWriteMode::Create,
        ),
    ];
    for w in writes {
        brain.publish(w).await.unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while answered(&admin).await < 4 {
        assert!(
            Instant::now() < deadline,
            "the writes were not answered; log:\n{}",
            install.log(&["vault-writer"])
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop(&mut writer).await;

    let into = install.path().join("rebuilt");
    let out = run(nisse(install.path())
        .args(["vault", "rebuild"])
        .arg(&into)
        .args(["--agent", "ops"]))
    .await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let said = text(&out.stdout);
    let listed: Vec<&str> = said.lines().collect();
    assert_eq!(
        listed,
        vec![
            "memory/ops/facts/db01-var.md",
            "memory/ops/index.md",
            &format!(
                "rebuilt ops's notes from its stream into {}: 2 files from 4 writes (3 applied, 1 refused as the writer refused them, 0 repeats of a request already applied)",
                into.display()
            ),
        ]
    );
    // Byte for byte what the writer wrote, and nothing else.
    let written: BTreeMap<String, Vec<u8>> = vault_files(&install.data().join("vault/memory/ops"))
        .into_iter()
        .map(|(path, bytes)| (format!("memory/ops/{path}"), bytes))
        .collect();
    assert_eq!(written.len(), 2);
    assert!(
        vault_files(&into) == written,
        "the rebuild differs from the writer's notes"
    );

    // Never over notes: a folder with anything in it is refused, named.
    let out = run(nisse(install.path()).args(["vault", "rebuild"]).arg(&into)).await;
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains(&format!("{} is not empty", into.display())),
        "{err}"
    );
}
