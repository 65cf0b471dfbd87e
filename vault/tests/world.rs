//! The world model and the vault check over real folders: a generated world
//! of 1,000 entities and its blast radius, problems with file and line, and
//! a note as the vault writer renders it being valid for Obsidian.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use pretty_assertions::assert_eq;

use nisse_vault::world::{self, Affected, Entity, EntityKind, Hop, RelationKind, World};
use nisse_vault::{Problem, Provenance, check_vault, render};

fn write(root: &Path, path: &str, text: &str) {
    let full = root.join(path);
    std::fs::create_dir_all(full.parent().unwrap()).unwrap();
    std::fs::write(full, text).unwrap();
}

fn hop(from: &str, relation: RelationKind, to: &str) -> Hop {
    Hop {
        from: from.to_owned(),
        relation,
        to: to.to_owned(),
    }
}

/// Names in the generated world.
fn host(h: usize) -> String {
    format!("host-{h:02}")
}
fn vm(h: usize, v: usize) -> String {
    format!("vm-{h:02}-{v}")
}
fn service(h: usize, v: usize, s: usize) -> String {
    format!("svc-{h:02}-{v}-{s}")
}
fn chain(k: usize) -> String {
    format!("app-{k:03}")
}

const HOSTS: usize = 10;
const VMS: usize = 9;
const SERVICES: usize = 9;
const CHAIN: usize = 82;

/// A world of exactly 1,000 entities: a site, the pool `tank` on four
/// disks, a network, ten hosts storing on the pool, nine VMs on each, nine
/// services on each VM, a backup service on the pool directly and on a VM
/// (its shortest path is the direct one), and a chain of 82 applications
/// each depending on the one before, the first on a service. Relations are
/// written in every form the operator may use.
fn generate(root: &Path) -> usize {
    let mut count = 0;
    let mut note = |path: &str, text: String| {
        write(root, path, &text);
        count += 1;
    };
    note(
        "world/dc1.md",
        "---\ntype: site\ntitle: Data centre 1\n---\n".into(),
    );
    note(
        "world/lan.md",
        "---\ntype: network\n---\n# The LAN\n".into(),
    );
    for d in 0..4 {
        note(
            &format!("world/disks/disk-{d}.md"),
            "---\ntype: disk\npart_of: \"[[dc1]]\"\n---\n".into(),
        );
    }
    note(
        "world/storage/tank.md",
        "---\ntype: pool\nstores_on:\n  - \"[[disk-0]]\"\n  - \"[[disk-1]]\"\n  - disk-2\n  - \"[[world/disks/disk-3.md|d3]]\"\npart_of: dc1\n---\n"
            .into(),
    );
    for h in 0..HOSTS {
        note(
            &format!("world/hosts/{}.md", host(h)),
            "---\ntype: host\nstores_on: \"[[tank]]\"\ndepends_on: [\"[[lan]]\"]\npart_of: \"[[dc1]]\"\n---\n"
                .into(),
        );
        for v in 0..VMS {
            let on = if v % 2 == 0 {
                format!("\"[[{}]]\"", host(h))
            } else {
                format!("\"[[{}|the host]]\"", host(h))
            };
            note(
                &format!("world/vms/{}.md", vm(h, v)),
                format!("---\ntype: vm\nruns_on: {on}\n---\n"),
            );
            for s in 0..SERVICES {
                let aliases = format!("aliases: [\"{}.service\"]\n", service(h, v, s));
                note(
                    &format!("world/services/{h:02}/{}.md", service(h, v, s)),
                    format!("---\ntype: service\n{aliases}runs_on: {}\n---\n", vm(h, v)),
                );
            }
        }
    }
    note(
        "world/services/backup.md",
        format!(
            "---\ntype: service\nruns_on: \"[[{}]]\"\nstores_on: \"[[tank]]\"\n---\n",
            vm(3, 3)
        ),
    );
    for k in 0..CHAIN {
        // The first depends on a service by its alias.
        let on = if k == 0 {
            format!("{}.service", service(0, 0, 0))
        } else {
            format!("[[{}]]", chain(k - 1))
        };
        note(
            &format!("world/apps/{}.md", chain(k)),
            format!("---\ntype: container\ndepends_on:\n  - \"{on}\"\n---\n"),
        );
    }
    count
}

/// What the blast radius of `tank` must be, by construction.
fn expected_blast() -> Vec<Affected> {
    use RelationKind::*;
    let mut want = Vec::new();
    let affected = |entity: String, kind, path: Vec<Hop>| Affected {
        entity,
        kind,
        depth: path.len(),
        path,
    };
    for h in 0..HOSTS {
        let host_hop = hop(&host(h), StoresOn, "tank");
        want.push(affected(host(h), EntityKind::Host, vec![host_hop.clone()]));
        for v in 0..VMS {
            let vm_hop = hop(&vm(h, v), RunsOn, &host(h));
            want.push(affected(
                vm(h, v),
                EntityKind::Vm,
                vec![vm_hop.clone(), host_hop.clone()],
            ));
            for s in 0..SERVICES {
                want.push(affected(
                    service(h, v, s),
                    EntityKind::Service,
                    vec![
                        hop(&service(h, v, s), RunsOn, &vm(h, v)),
                        vm_hop.clone(),
                        host_hop.clone(),
                    ],
                ));
            }
        }
    }
    want.push(affected(
        "backup".into(),
        EntityKind::Service,
        vec![hop("backup", StoresOn, "tank")],
    ));
    let mut tail = vec![
        hop(&service(0, 0, 0), RunsOn, &vm(0, 0)),
        hop(&vm(0, 0), RunsOn, &host(0)),
        hop(&host(0), StoresOn, "tank"),
    ];
    for k in 0..CHAIN {
        let to = if k == 0 {
            service(0, 0, 0)
        } else {
            chain(k - 1)
        };
        tail.insert(0, hop(&chain(k), DependsOn, &to));
        want.push(affected(chain(k), EntityKind::Container, tail.clone()));
    }
    want.sort_by(|a, b| (a.depth, &a.entity).cmp(&(b.depth, &b.entity)));
    want
}

#[test]
fn the_blast_radius_of_a_pool_in_a_world_of_1000_lists_every_dependent_with_its_path() {
    let dir = tempfile::tempdir().unwrap();
    assert_eq!(generate(dir.path()), 1000);

    let started = Instant::now();
    let (world, problems) = world::load(dir.path());
    let loaded = started.elapsed();
    assert_eq!(problems, Vec::<Problem>::new());
    assert_eq!(world.len(), 1000);
    assert_eq!(world.sha256.len(), 64);
    assert_eq!(world.cycles(), Vec::<Vec<String>>::new());

    let tank = world.get("tank").unwrap();
    assert_eq!(tank.path, "world/storage/tank.md");
    // In the order the keys are read: runs_on, depends_on, part_of, stores_on.
    assert_eq!(
        tank.relations,
        [
            (RelationKind::PartOf, "dc1".to_owned()),
            (RelationKind::StoresOn, "disk-0".to_owned()),
            (RelationKind::StoresOn, "disk-1".to_owned()),
            (RelationKind::StoresOn, "disk-2".to_owned()),
            (RelationKind::StoresOn, "disk-3".to_owned()),
        ]
    );
    assert_eq!(world.get("dc1").unwrap().title, "Data centre 1");
    assert_eq!(world.get("lan").unwrap().title, "The LAN");
    assert_eq!(world.get("svc-04-2-7.SERVICE").unwrap().name, "svc-04-2-7");

    let started = Instant::now();
    let blast = world.blast("tank").unwrap();
    let answered = started.elapsed();
    assert_eq!(blast.root, "tank");
    // Everything but the site, the disks, the network and the pool itself.
    assert_eq!(blast.affected.len(), 1000 - 7);
    assert_eq!(blast.affected, expected_blast());
    let text = blast.to_string();
    assert!(
        text.starts_with("If tank stops, 993 entities are affected:\n"),
        "{text:.200}"
    );
    assert!(text.contains(
        "\n  app-001 (container): app-001 -depends_on-> app-000 -depends_on-> svc-00-0-0 \
         -runs_on-> vm-00-0 -runs_on-> host-00 -stores_on-> tank"
    ));
    assert!(
        world
            .blast("lan")
            .unwrap()
            .affected
            .iter()
            .all(|a| a.entity != "tank")
    );

    // Generous bounds on a shared 2-core machine in a debug build: a
    // quadratic scan would be orders of magnitude slower.
    assert!(loaded < Duration::from_secs(20), "loading took {loaded:?}");
    assert!(
        answered < Duration::from_secs(1),
        "the blast radius took {answered:?}"
    );

    // A changed file changes the hash; the same files give the same one.
    let (again, _) = world::load(dir.path());
    assert_eq!(again.sha256, world.sha256);
    write(
        dir.path(),
        "world/lan.md",
        "---\ntype: network\n---\n# The LAN, renamed\n",
    );
    let (changed, _) = world::load(dir.path());
    assert_ne!(changed.sha256, world.sha256);
}

#[test]
fn ten_thousand_entities_answer_many_blast_queries_quickly() {
    // A pool under 99 hosts, each with 100 services: the pool's blast
    // radius is the whole world.
    let mut entities = vec![Entity {
        name: "pool".into(),
        kind: EntityKind::Pool,
        title: "pool".into(),
        path: "world/pool.md".into(),
        relations: vec![],
        aliases: vec![],
    }];
    for h in 0..99 {
        entities.push(Entity {
            name: format!("h{h}"),
            kind: EntityKind::Host,
            title: format!("h{h}"),
            path: format!("world/h{h}.md"),
            relations: vec![(RelationKind::StoresOn, "pool".into())],
            aliases: vec![],
        });
        for s in 0..100 {
            entities.push(Entity {
                name: format!("s{h}-{s}"),
                kind: EntityKind::Service,
                title: String::new(),
                path: format!("world/s{h}-{s}.md"),
                relations: vec![(RelationKind::RunsOn, format!("h{h}"))],
                aliases: vec![format!("unit-{h}-{s}")],
            });
        }
    }
    let started = Instant::now();
    let world = World::from_entities(entities);
    let built = started.elapsed();
    assert_eq!(world.len(), 10_000);
    let started = Instant::now();
    for _ in 0..20 {
        assert_eq!(world.blast("pool").unwrap().affected.len(), 9_999);
    }
    for h in 0..99 {
        assert_eq!(world.blast(&format!("h{h}")).unwrap().affected.len(), 100);
        assert!(world.get(&format!("UNIT-{h}-5")).is_some());
    }
    let queried = started.elapsed();
    assert!(built < Duration::from_secs(5), "building took {built:?}");
    assert!(
        queried < Duration::from_secs(10),
        "119 queries took {queried:?}"
    );
}

#[test]
fn problems_name_the_file_and_the_line() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    write(root, "world/db01.md", "---\ntype: host\n---\n");
    write(
        root,
        "world/typo.md",
        "---\ntitle: A typo\ntype: hots\n---\n",
    );
    write(
        root,
        "world/untyped.md",
        "Just an operator's note, no frontmatter.\n",
    );
    write(
        root,
        "world/services/postgresql.md",
        "---\ntype: service\naliases: [pg, db01]\nruns_on: \"[[db01]]\"\ndepends_on:\n  - \"[[lan]]\"\n  - \"[[nowhere|x]]\"\nstores_on: \"[[typo]]\"\npart_of: {a: b}\n---\n",
    );
    write(root, "world/lan.md", "---\ntype: network\n---\n");
    write(root, "world/a/dup.md", "---\ntype: host\n---\n");
    write(root, "world/b/Dup.md", "---\ntype: vm\n---\n");
    write(
        root,
        "world/p.md",
        "---\ntype: service\ndepends_on: \"[[q]]\"\n---\n",
    );
    write(
        root,
        "world/q.md",
        "---\ntype: service\n\ndepends_on: \"[[r]]\"\n---\n",
    );
    write(
        root,
        "world/r.md",
        "---\ntype: service\nruns_on: db01\ndepends_on: [\"[[p]]\"]\n---\n",
    );
    write(
        root,
        "world/loop.md",
        "---\ntype: service\ndepends_on: \"[[loop]]\"\n---\n",
    );
    write(
        root,
        "world/broken.md",
        "---\ntype: host\nruns_on: [unclosed\n---\n",
    );
    write(root, "world/.obsidian/x.md", "not read\n");
    write(root, "world/diagram.png", "not a note\n");
    let (world, problems) = world::load(root);
    let shown: Vec<String> = problems.iter().map(ToString::to_string).collect();
    assert_eq!(
        shown,
        [
            "world/b/Dup.md:1: the entity name \"Dup\" is also world/a/dup.md; [[Dup]] cannot tell \
             them apart, so this note is left out",
            "world/broken.md:4: frontmatter is not valid YAML: while parsing a flow sequence, \
             expected ',' or ']'",
            "world/loop.md:3: a cycle: loop -depends_on-> loop; nothing can rely on itself",
            "world/p.md:3: a cycle: p -depends_on-> q -depends_on-> r -depends_on-> p; nothing can \
             rely on itself",
            "world/services/postgresql.md:3: the alias \"db01\" is already db01 (world/db01.md), so \
             it is left out here",
            "world/services/postgresql.md:7: depends_on names \"nowhere\", no entity in world/",
            "world/services/postgresql.md:8: stores_on names \"typo\", world/typo.md, which is not a \
             valid entity (see its own problem)",
            "world/services/postgresql.md:9: part_of is neither a name, a [[link]] nor a list of them",
            "world/typo.md:3: unknown entity type \"hots\"; the types are site, host, vm, container, \
             service, disk, pool, network, dependency",
            "world/untyped.md:1: no entity type: a world note is one entity, with `type:` one of \
             site, host, vm, container, service, disk, pool, network, dependency",
        ]
    );
    // Only the valid entities and relations are in the world.
    let names: Vec<&str> = world.entities().iter().map(|e| e.name.as_str()).collect();
    assert_eq!(
        names,
        ["db01", "dup", "lan", "loop", "p", "postgresql", "q", "r"]
    );
    let pg = world.get("pg").unwrap();
    assert_eq!(pg.aliases, ["pg"]);
    assert_eq!(
        pg.relations,
        [
            (RelationKind::RunsOn, "db01".to_owned()),
            (RelationKind::DependsOn, "lan".to_owned())
        ]
    );
    assert_eq!(world.cycles(), [vec!["loop"], vec!["p", "q", "r"]]);
    let blast = world.blast("db01").unwrap();
    let affected: Vec<(&str, usize)> = blast
        .affected
        .iter()
        .map(|a| (a.entity.as_str(), a.depth))
        .collect();
    assert_eq!(affected, [("postgresql", 1), ("r", 1), ("q", 2), ("p", 3)]);
}

#[test]
fn a_missing_world_folder_is_an_empty_world() {
    let dir = tempfile::tempdir().unwrap();
    let (world, problems) = world::load(dir.path());
    assert!(world.is_empty());
    assert_eq!(problems, []);
    write(dir.path(), "world", "a file");
    let (_, problems) = world::load(dir.path());
    assert_eq!(
        problems[0].to_string(),
        "world: is a file, not the world model's folder"
    );
}

#[test]
fn a_rendered_memory_note_is_valid_for_obsidian() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    write(
        root,
        "world/hosts/nas01.md",
        "---\ntype: host\n---\n# nas01\n",
    );
    write(
        root,
        "procedures/root-disk.md",
        "# Root disk full\nOn [[nas01]].\n",
    );
    let provenance = Provenance {
        agent: "ops".into(),
        work_item: "wi-7".into(),
        source: "operator @alice:example.org in matrix: \"keep 10%\" — [[not a link in YAML]]?"
            .into(),
        stream_seq: 9,
        written: "2026-05-01T10:00:00Z".into(),
        message_id: "m-9".into(),
    };
    let scalars = BTreeMap::from([
        ("title".to_owned(), "nas01: root disk --- full".to_owned()),
        ("observed".to_owned(), "2026-05-01T09:58:00Z".to_owned()),
    ]);
    let lists = BTreeMap::from([("entities".to_owned(), vec!["[[nas01]]".to_owned()])]);
    let text = render(
        &provenance,
        &scalars,
        &lists,
        &["incident".to_owned(), "host/nas01".to_owned()],
        "# Root disk full on nas01\n\nFollowed [[root-disk]] on [[nas01]].\n",
    )
    .unwrap();
    write(root, "memory/ops/incidents/2026-05-01 nas01.md", &text);
    // The provenance's source holds a [[...]] of its own: the check reads
    // it as a link, as Obsidian does, so it must resolve too; with it
    // resolving, the vault is clean.
    let problems = check_vault(root);
    assert_eq!(
        problems.iter().map(ToString::to_string).collect::<Vec<_>>(),
        [
            "memory/ops/incidents/2026-05-01 nas01.md:11: [[not a link in YAML]] does not resolve to any note or file in the vault"
        ]
    );
    write(root, "not a link in YAML.md", "the operator's\n");
    assert_eq!(check_vault(root), []);
    let note = nisse_vault::parse(&text).unwrap();
    assert_eq!(note.provenance(), Some(provenance));
    assert_eq!(note.title(), Some("nas01: root disk --- full"));
}
