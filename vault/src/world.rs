//! The world model (Oikos REQ-ORI-1..2): what exists and how it is
//! arranged, as typed entities with typed relations, and what is affected
//! if one of them stops.
//!
//! Entities are operator-written notes under `world/` (any depth), one per
//! note, named by the note's stem, which is what `[[links]]` name. The
//! frontmatter gives the entity's `type` ([`EntityKind`]), optional `title`
//! and `aliases` (Obsidian's own property, e.g. a systemd unit name), and
//! relations `runs_on`, `depends_on`, `part_of`, `stores_on`
//! ([`RelationKind`]), each a `[[link]]`, a plain name, or a list of them.
//! Other keys are the operator's and free.
//!
//! [`load`] validates as it reads: each problem names its file and line,
//! and the [`World`] holds only the entities and relations that are valid.
//! "What breaks if X goes down" is a graph query ([`World::blast`]) over a
//! reverse index built once, so a world of 10,000 entities answers in time
//! linear in what is affected.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::links::{Problem, walk};
use crate::note::{self, Frontmatter, Item, sha256_hex};
use crate::path::WORLD;

/// What an entity is. The rule of completeness: if it can break, change
/// or hold data, it has an entity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EntityKind {
    /// A place: a rack, a room, a data centre.
    Site,
    /// A physical machine.
    Host,
    /// A virtual machine.
    Vm,
    /// A container (LXC, Docker, Podman).
    Container,
    /// A running service: a systemd unit, a daemon, an application.
    Service,
    /// A disk.
    Disk,
    /// A storage pool (ZFS, LVM, Ceph).
    Pool,
    /// A network: a VLAN, a bridge, a subnet, a link.
    Network,
    /// Something outside that the rest relies on: DNS, an upstream API, a
    /// certificate authority, power.
    Dependency,
}

impl EntityKind {
    /// Every kind, in the order of the seed's list.
    pub const ALL: [EntityKind; 9] = [
        EntityKind::Site,
        EntityKind::Host,
        EntityKind::Vm,
        EntityKind::Container,
        EntityKind::Service,
        EntityKind::Disk,
        EntityKind::Pool,
        EntityKind::Network,
        EntityKind::Dependency,
    ];

    /// The kind named `name` (lowercase, as in `type: host`).
    pub fn parse(name: &str) -> Option<EntityKind> {
        EntityKind::ALL.into_iter().find(|k| k.as_str() == name)
    }

    /// The kind's name, as written in `type:` and on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            EntityKind::Site => "site",
            EntityKind::Host => "host",
            EntityKind::Vm => "vm",
            EntityKind::Container => "container",
            EntityKind::Service => "service",
            EntityKind::Disk => "disk",
            EntityKind::Pool => "pool",
            EntityKind::Network => "network",
            EntityKind::Dependency => "dependency",
        }
    }
}

impl fmt::Display for EntityKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How one entity relies on another. Every kind means the same for the
/// blast radius: if the target stops, the source is affected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RelationKind {
    /// Runs on a host, VM or container.
    RunsOn,
    /// Needs another entity to work.
    DependsOn,
    /// Is part of a larger whole (a disk of a pool, a host of a site).
    PartOf,
    /// Keeps its data on a pool or disk.
    StoresOn,
}

impl RelationKind {
    /// Every kind, in the order their keys are read.
    pub const ALL: [RelationKind; 4] = [
        RelationKind::RunsOn,
        RelationKind::DependsOn,
        RelationKind::PartOf,
        RelationKind::StoresOn,
    ];

    /// The kind named `name`, as its frontmatter key (`runs_on`).
    pub fn parse(name: &str) -> Option<RelationKind> {
        RelationKind::ALL.into_iter().find(|k| k.as_str() == name)
    }

    /// The kind's name: its frontmatter key, and its name on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            RelationKind::RunsOn => "runs_on",
            RelationKind::DependsOn => "depends_on",
            RelationKind::PartOf => "part_of",
            RelationKind::StoresOn => "stores_on",
        }
    }
}

impl fmt::Display for RelationKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One entity of the world: one note under `world/`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entity {
    /// Its name: the note's stem, as `[[links]]` name it.
    pub name: String,
    /// What it is.
    pub kind: EntityKind,
    /// Its title: frontmatter `title`, else the note's first heading, else
    /// its name.
    pub title: String,
    /// The note's path, relative to the vault root.
    pub path: String,
    /// What it relies on: each relation's kind and the target entity's
    /// name.
    #[serde(with = "relations_json")]
    pub relations: Vec<(RelationKind, String)>,
    /// Other names it goes by (a systemd unit, a container name).
    #[serde(default)]
    pub aliases: Vec<String>,
}

/// Relations as `{"kind": "runs_on", "target": "db01"}` objects in JSON,
/// the shape of the wire's `Relation`.
mod relations_json {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    use super::RelationKind;

    #[derive(Serialize, Deserialize)]
    struct Relation {
        kind: RelationKind,
        target: String,
    }

    pub(super) fn serialize<S: Serializer>(
        relations: &[(RelationKind, String)],
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        let relations: Vec<Relation> = relations
            .iter()
            .map(|(kind, target)| Relation {
                kind: *kind,
                target: target.clone(),
            })
            .collect();
        relations.serialize(serializer)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Vec<(RelationKind, String)>, D::Error> {
        let relations = Vec::<Relation>::deserialize(deserializer)?;
        Ok(relations.into_iter().map(|r| (r.kind, r.target)).collect())
    }
}

/// The world model: valid entities by name, with the reverse index the
/// blast radius walks, and the cycles among them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "WorldJson", into = "WorldJson")]
pub struct World {
    /// SHA-256 (hex) over the world's files, paths and bytes in path
    /// order, so a changed world is seen. Empty for a world built with
    /// [`World::from_entities`] until the caller sets it (from the wire).
    pub sha256: String,
    /// Sorted by name.
    entities: Vec<Entity>,
    /// Lowercase name to entity.
    by_name: HashMap<String, usize>,
    /// Lowercase alias to entity (aliases that are no entity's name).
    by_alias: HashMap<String, usize>,
    /// For each entity, the entities with a relation to it: (source,
    /// relation), sorted, so the blast radius is one walk.
    dependents: Vec<Vec<(usize, RelationKind)>>,
    /// Each tangle of relations that leads back to itself, as one cycle
    /// through it, starting at its first name.
    cycles: Vec<Vec<String>>,
}

#[derive(Serialize, Deserialize)]
struct WorldJson {
    sha256: String,
    entities: Vec<Entity>,
}

impl From<WorldJson> for World {
    fn from(json: WorldJson) -> World {
        let mut world = World::from_entities(json.entities);
        world.sha256 = json.sha256;
        world
    }
}

impl From<World> for WorldJson {
    fn from(world: World) -> WorldJson {
        WorldJson {
            sha256: world.sha256,
            entities: world.entities,
        }
    }
}

impl World {
    /// A world of `entities` (as the vault reader sent them). An entity
    /// whose name another has already taken (ignoring case) is left out,
    /// as is a relation to no entity; targets are named as their entity
    /// is. Cycles are found as in [`load`].
    pub fn from_entities(entities: Vec<Entity>) -> World {
        let mut sorted = entities;
        sorted.sort_by(|a, b| a.name.cmp(&b.name));
        let mut kept: Vec<Entity> = Vec::with_capacity(sorted.len());
        let mut by_name = HashMap::with_capacity(sorted.len());
        for entity in sorted {
            let key = entity.name.to_lowercase();
            if by_name.contains_key(&key) {
                continue;
            }
            by_name.insert(key, kept.len());
            kept.push(entity);
        }
        let mut by_alias = HashMap::new();
        for (i, entity) in kept.iter_mut().enumerate() {
            entity.aliases.retain(|alias| {
                let key = alias.to_lowercase();
                if by_name.contains_key(&key) || by_alias.contains_key(&key) {
                    return false;
                }
                by_alias.insert(key, i);
                true
            });
        }
        let canonical: Vec<String> = kept.iter().map(|e| e.name.clone()).collect();
        for entity in &mut kept {
            let mut relations: Vec<(RelationKind, String)> =
                Vec::with_capacity(entity.relations.len());
            for (kind, target) in std::mem::take(&mut entity.relations) {
                let key = target.to_lowercase();
                let Some(&to) = by_name.get(&key).or_else(|| by_alias.get(&key)) else {
                    continue;
                };
                let relation = (kind, canonical[to].clone());
                if !relations.contains(&relation) {
                    relations.push(relation);
                }
            }
            entity.relations = relations;
        }
        let mut dependents: Vec<Vec<(usize, RelationKind)>> = vec![Vec::new(); kept.len()];
        for (from, entity) in kept.iter().enumerate() {
            for (kind, target) in &entity.relations {
                if let Some(&to) = by_name.get(&target.to_lowercase()) {
                    dependents[to].push((from, *kind));
                }
            }
        }
        for list in &mut dependents {
            list.sort();
            list.dedup();
        }
        let mut world = World {
            sha256: String::new(),
            entities: kept,
            by_name,
            by_alias,
            dependents,
            cycles: Vec::new(),
        };
        world.cycles = world.find_cycles().into_iter().map(|c| c.names).collect();
        world
    }

    /// Every entity, sorted by name.
    pub fn entities(&self) -> &[Entity] {
        &self.entities
    }

    /// How many entities there are.
    pub fn len(&self) -> usize {
        self.entities.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.entities.is_empty()
    }

    fn index_of(&self, name_or_alias: &str) -> Option<usize> {
        let key = name_or_alias.trim().to_lowercase();
        self.by_name
            .get(&key)
            .or_else(|| self.by_alias.get(&key))
            .copied()
    }

    /// The entity of that name, else of that alias, ignoring case.
    pub fn get(&self, name_or_alias: &str) -> Option<&Entity> {
        self.index_of(name_or_alias).map(|i| &self.entities[i])
    }

    /// The entities with a relation to the named one (those affected
    /// first if it stops), with the relation, sorted by name.
    pub fn dependents(&self, name_or_alias: &str) -> Vec<(RelationKind, &Entity)> {
        let Some(i) = self.index_of(name_or_alias) else {
            return Vec::new();
        };
        self.dependents[i]
            .iter()
            .map(|&(from, kind)| (kind, &self.entities[from]))
            .collect()
    }

    /// Each tangle of relations that leads back to itself, as one cycle
    /// through it: the entities in relation order, starting at the first
    /// name (the last relates to the first). A cycle is an error in the
    /// world; the blast radius still terminates on one.
    pub fn cycles(&self) -> Vec<Vec<String>> {
        self.cycles.clone()
    }

    /// What is affected if the named entity (or alias) stops: every entity
    /// with a relation to it, transitively, each by its shortest path to
    /// it, sorted by depth then name. `None` when no entity has that name.
    pub fn blast(&self, name_or_alias: &str) -> Option<Blast> {
        let root = self.index_of(name_or_alias)?;
        // Breadth first over the reverse index: each entity once, at its
        // least depth, reached through `via` (relation and the entity one
        // hop nearer the root).
        let mut via: Vec<Option<(RelationKind, usize)>> = vec![None; self.entities.len()];
        let mut depth = vec![0usize; self.entities.len()];
        let mut seen = vec![false; self.entities.len()];
        seen[root] = true;
        let mut order = Vec::new();
        let mut queue = VecDeque::from([root]);
        while let Some(at) = queue.pop_front() {
            for &(from, kind) in &self.dependents[at] {
                if seen[from] {
                    continue;
                }
                seen[from] = true;
                via[from] = Some((kind, at));
                depth[from] = depth[at] + 1;
                order.push(from);
                queue.push_back(from);
            }
        }
        let mut affected: Vec<Affected> = order
            .into_iter()
            .map(|i| {
                let mut path = Vec::with_capacity(depth[i]);
                let mut at = i;
                while let Some((relation, to)) = via[at] {
                    path.push(Hop {
                        from: self.entities[at].name.clone(),
                        relation,
                        to: self.entities[to].name.clone(),
                    });
                    at = to;
                }
                Affected {
                    entity: self.entities[i].name.clone(),
                    kind: self.entities[i].kind,
                    depth: depth[i],
                    path,
                }
            })
            .collect();
        affected.sort_by(|a, b| (a.depth, &a.entity).cmp(&(b.depth, &b.entity)));
        Some(Blast {
            root: self.entities[root].name.clone(),
            affected,
        })
    }

    /// Cycles with the relations that close them: an iterative Tarjan for
    /// the tangles (no recursion, so a 10,000-long chain cannot overflow
    /// the stack), then the shortest cycle back to each tangle's first
    /// name.
    fn find_cycles(&self) -> Vec<Cycle> {
        let n = self.entities.len();
        let forward: Vec<Vec<usize>> = self
            .entities
            .iter()
            .map(|e| {
                e.relations
                    .iter()
                    .filter_map(|(_, t)| self.by_name.get(&t.to_lowercase()).copied())
                    .collect()
            })
            .collect();
        let components = strongly_connected(&forward);
        let mut component_of = vec![usize::MAX; n];
        for (c, members) in components.iter().enumerate() {
            for &m in members {
                component_of[m] = c;
            }
        }
        let mut cycles = Vec::new();
        for (c, members) in components.iter().enumerate() {
            let self_loop = members.len() == 1 && forward[members[0]].contains(&members[0]);
            if members.len() < 2 && !self_loop {
                continue;
            }
            // Entities are sorted by name, so the least index is the first name.
            let Some(&start) = members.iter().min() else {
                continue;
            };
            // Shortest way round from `start` back to it, inside the tangle.
            let mut parent = vec![usize::MAX; n];
            let mut queue = VecDeque::from([start]);
            let mut closing = None;
            'search: while let Some(at) = queue.pop_front() {
                for &next in &forward[at] {
                    if component_of[next] != c {
                        continue;
                    }
                    if next == start {
                        closing = Some(at);
                        break 'search;
                    }
                    if parent[next] == usize::MAX {
                        parent[next] = at;
                        queue.push_back(next);
                    }
                }
            }
            let Some(mut at) = closing else {
                continue;
            };
            let mut ring = vec![at];
            while at != start {
                at = parent[at];
                ring.push(at);
            }
            ring.reverse();
            cycles.push(Cycle {
                names: ring
                    .iter()
                    .map(|&i| self.entities[i].name.clone())
                    .collect(),
                tangle: members.len(),
            });
        }
        cycles.sort_by(|a, b| a.names.cmp(&b.names));
        cycles
    }
}

struct Cycle {
    names: Vec<String>,
    /// How many entities the tangle holds (more than the cycle when
    /// several cycles cross).
    tangle: usize,
}

/// Tarjan's strongly connected components, without recursion.
fn strongly_connected(graph: &[Vec<usize>]) -> Vec<Vec<usize>> {
    let n = graph.len();
    let mut index = vec![usize::MAX; n];
    let mut low = vec![0usize; n];
    let mut on_stack = vec![false; n];
    let mut stack = Vec::new();
    let mut components = Vec::new();
    let mut next_index = 0;
    for root in 0..n {
        if index[root] != usize::MAX {
            continue;
        }
        // (node, how many of its edges are done)
        let mut work = vec![(root, 0usize)];
        index[root] = next_index;
        low[root] = next_index;
        next_index += 1;
        stack.push(root);
        on_stack[root] = true;
        while let Some(&mut (node, ref mut edge)) = work.last_mut() {
            if let Some(&next) = graph[node].get(*edge) {
                *edge += 1;
                if index[next] == usize::MAX {
                    index[next] = next_index;
                    low[next] = next_index;
                    next_index += 1;
                    stack.push(next);
                    on_stack[next] = true;
                    work.push((next, 0));
                } else if on_stack[next] {
                    low[node] = low[node].min(index[next]);
                }
                continue;
            }
            work.pop();
            if let Some(&(parent, _)) = work.last() {
                low[parent] = low[parent].min(low[node]);
            }
            if low[node] == index[node] {
                let mut component = Vec::new();
                while let Some(member) = stack.pop() {
                    on_stack[member] = false;
                    component.push(member);
                    if member == node {
                        break;
                    }
                }
                components.push(component);
            }
        }
    }
    components
}

/// What is affected if an entity stops.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Blast {
    /// The entity that stops.
    pub root: String,
    /// Everything affected, sorted by depth then name.
    pub affected: Vec<Affected>,
}

impl Blast {
    /// The affected entities' names, nearest first, at most `max` of
    /// them and a count of the rest: "postgresql, grafana and 3 more".
    /// "nothing" when none is affected.
    pub fn summary(&self, max: usize) -> String {
        let names: Vec<&str> = self.affected.iter().map(|a| a.entity.as_str()).collect();
        match names.len() {
            0 => "nothing".to_owned(),
            len if len <= max.max(1) => match names.split_last() {
                Some((last, [])) => (*last).to_owned(),
                Some((last, rest)) => format!("{} and {last}", rest.join(", ")),
                None => "nothing".to_owned(),
            },
            len => {
                let shown = max.max(1);
                format!("{} and {} more", names[..shown].join(", "), len - shown)
            }
        }
    }
}

impl fmt::Display for Blast {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.affected.len() {
            0 => write!(f, "If {} stops, nothing else is affected.", self.root),
            1 => writeln!(f, "If {} stops, 1 entity is affected:", self.root)
                .and_then(|()| write!(f, "  {}", self.affected[0])),
            n => {
                write!(f, "If {} stops, {n} entities are affected:", self.root)?;
                for affected in &self.affected {
                    write!(f, "\n  {affected}")?;
                }
                Ok(())
            }
        }
    }
}

/// One entity affected, with how it depends on the root.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Affected {
    /// The affected entity's name.
    pub entity: String,
    /// What it is.
    pub kind: EntityKind,
    /// How many relations away from the root it is (1: it relates to the
    /// root itself).
    pub depth: usize,
    /// The relations from it to the root, shortest: the first hop's
    /// `from` is this entity, the last hop's `to` the root.
    pub path: Vec<Hop>,
}

impl fmt::Display for Affected {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({}): {}", self.entity, self.kind, self.entity)?;
        for hop in &self.path {
            write!(f, " -{}-> {}", hop.relation, hop.to)?;
        }
        Ok(())
    }
}

/// One relation on a path: `from` relates to `to`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Hop {
    /// The entity that relies on `to`.
    pub from: String,
    /// How.
    pub relation: RelationKind,
    /// The entity relied on.
    pub to: String,
}

impl fmt::Display for Hop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} -{}-> {}", self.from, self.relation, self.to)
    }
}

/// One world note as read, before relations are checked.
struct Draft {
    entity: Entity,
    /// Relation targets as written, each with its line.
    targets: Vec<(RelationKind, String, usize)>,
    /// Alias items with their lines.
    aliases: Vec<Item>,
}

/// The names a relation value gives: each `[[link]]` in it (the text
/// before `|` or `#`), else the value itself as a plain name.
fn relation_targets(value: &str) -> Vec<String> {
    if value.contains("[[") {
        note::links(value).into_iter().map(|l| l.target).collect()
    } else {
        let name = value.trim();
        if name.is_empty() {
            Vec::new()
        } else {
            vec![name.to_owned()]
        }
    }
}

/// A relation target written as a path (`world/hosts/db01.md`,
/// `hosts/db01`) names the entity of its stem.
fn stem_of(target: &str) -> &str {
    let name = target.rsplit('/').next().unwrap_or(target);
    name.strip_suffix(".md").unwrap_or(name)
}

/// Loads and validates the world model under `root/world/`.
///
/// A missing `world/` folder is an empty world. Each problem names its file
/// and 1-based line: a note that does not parse, a missing or unknown
/// `type`, a relation value that names no valid entity, a second note with
/// an entity's name (the first by path is kept), an alias that is already
/// another entity's name or alias, and each cycle (once, naming its
/// entities in order, at the relation that starts it). The world holds only
/// the valid entities and the relations between them; relations on a cycle
/// are kept, as each is valid on its own, and [`World::cycles`] names them.
pub fn load(root: &Path) -> (World, Vec<Problem>) {
    let mut problems = Vec::new();
    let world_dir = root.join(WORLD);
    match std::fs::metadata(&world_dir) {
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
            return (World::from_entities(Vec::new()), problems);
        }
        Err(err) => {
            problems.push(Problem::new(
                WORLD,
                0,
                format!("cannot read the folder: {err}"),
            ));
            return (World::from_entities(Vec::new()), problems);
        }
        Ok(meta) if !meta.is_dir() => {
            problems.push(Problem::new(
                WORLD,
                0,
                "is a file, not the world model's folder",
            ));
            return (World::from_entities(Vec::new()), problems);
        }
        Ok(_) => {}
    }
    let files: Vec<String> = walk(root, WORLD, &mut problems)
        .into_iter()
        .filter(|f| f.ends_with(".md"))
        .collect();

    let mut hashed = Vec::new();
    let mut drafts: Vec<Draft> = Vec::with_capacity(files.len());
    // Stems of world notes that are no valid entity, for a better message
    // when a relation names one.
    let mut invalid: HashMap<String, String> = HashMap::new();
    // The first note (by path) of each name, lowercase.
    let mut first_of: HashMap<String, String> = HashMap::with_capacity(files.len());
    for file in &files {
        let bytes = match std::fs::read(root.join(file)) {
            Ok(bytes) => bytes,
            Err(err) => {
                problems.push(Problem::new(file, 0, format!("cannot read it: {err}")));
                continue;
            }
        };
        hashed.extend_from_slice(file.as_bytes());
        hashed.push(0);
        hashed.extend_from_slice(bytes.len().to_string().as_bytes());
        hashed.push(0);
        hashed.extend_from_slice(&bytes);
        let name = stem_of(file).to_owned();
        let key = name.to_lowercase();
        if let Some(first) = first_of.get(&key) {
            problems.push(Problem::new(
                file,
                1,
                format!(
                    "the entity name {name:?} is also {first}; [[{name}]] cannot tell them apart, \
                     so this note is left out"
                ),
            ));
            continue;
        }
        first_of.insert(key.clone(), file.clone());
        match read_entity(file, name, &bytes, &mut problems) {
            Some(draft) => drafts.push(draft),
            None => {
                invalid.insert(key, file.clone());
            }
        }
    }

    let by_name: HashMap<String, usize> = drafts
        .iter()
        .enumerate()
        .map(|(i, d)| (d.entity.name.to_lowercase(), i))
        .collect();
    let mut by_alias: HashMap<String, usize> = HashMap::new();
    for i in 0..drafts.len() {
        let items = std::mem::take(&mut drafts[i].aliases);
        let mut kept = Vec::with_capacity(items.len());
        for item in items {
            let key = item.value.to_lowercase();
            let clash = by_name
                .get(&key)
                .filter(|&&other| other != i)
                .or_else(|| by_alias.get(&key).filter(|&&other| other != i));
            if let Some(&other) = clash {
                let other = &drafts[other].entity;
                problems.push(Problem::new(
                    &drafts[i].entity.path,
                    item.line,
                    format!(
                        "the alias {:?} is already {} ({}), so it is left out here",
                        item.value, other.name, other.path
                    ),
                ));
                continue;
            }
            if by_name.get(&key) == Some(&i) || by_alias.contains_key(&key) {
                // Its own name, or repeated: nothing to add.
                continue;
            }
            by_alias.insert(key, i);
            kept.push(item.value);
        }
        drafts[i].entity.aliases = kept;
    }

    // Relations: each target resolved to an entity's name, by name, alias
    // or path; a dangling one is a problem on its own line.
    let mut lines: HashMap<(usize, usize), usize> = HashMap::new();
    for i in 0..drafts.len() {
        let targets = std::mem::take(&mut drafts[i].targets);
        let mut relations: Vec<(RelationKind, String)> = Vec::with_capacity(targets.len());
        for (kind, target, line) in targets {
            let key = target.to_lowercase();
            let stem = stem_of(&key);
            let found = by_name
                .get(&key)
                .or_else(|| by_alias.get(&key))
                .or_else(|| by_name.get(stem));
            let Some(&to) = found else {
                let why = match invalid.get(stem) {
                    Some(path) => {
                        format!("{path}, which is not a valid entity (see its own problem)")
                    }
                    None => "no entity in world/".to_owned(),
                };
                problems.push(Problem::new(
                    &drafts[i].entity.path,
                    line,
                    format!("{kind} names {target:?}, {why}"),
                ));
                continue;
            };
            let relation = (kind, drafts[to].entity.name.clone());
            if !relations.contains(&relation) {
                relations.push(relation);
                lines.entry((i, to)).or_insert(line);
            }
        }
        drafts[i].entity.relations = relations;
    }

    let entities: Vec<Entity> = drafts.into_iter().map(|d| d.entity).collect();
    let mut world = World::from_entities(entities);
    world.sha256 = sha256_hex(&hashed);
    for cycle in world.find_cycles() {
        let (Some(first), Some(second)) = (
            cycle.names.first(),
            cycle.names.get(1).or(cycle.names.first()),
        ) else {
            continue;
        };
        let (Some(from), Some(to)) = (world.get(first), world.get(second)) else {
            continue;
        };
        let line = by_name
            .get(&from.name.to_lowercase())
            .zip(by_name.get(&to.name.to_lowercase()))
            .and_then(|(&a, &b)| lines.get(&(a, b)).copied())
            .unwrap_or(1);
        let mut ring = String::new();
        for (n, name) in cycle.names.iter().enumerate() {
            let next = &cycle.names[(n + 1) % cycle.names.len()];
            let kind = world
                .get(name)
                .and_then(|e| e.relations.iter().find(|(_, t)| t == next))
                .map_or("?", |(k, _)| k.as_str());
            let _ = fmt::Write::write_fmt(&mut ring, format_args!("{name} -{kind}-> "));
        }
        ring.push_str(first);
        let more = if cycle.tangle > cycle.names.len() {
            format!(
                " (one cycle of a tangle of {} entities that relate to each other)",
                cycle.tangle
            )
        } else {
            String::new()
        };
        problems.push(Problem::new(
            from.path.clone(),
            line,
            format!("a cycle: {ring}{more}; nothing can rely on itself"),
        ));
    }
    problems.sort();
    (world, problems)
}

/// Reads one world note as an entity; problems in it are pushed, and
/// `None` is returned when it is no entity at all.
fn read_entity(
    file: &str,
    name: String,
    bytes: &[u8],
    problems: &mut Vec<Problem>,
) -> Option<Draft> {
    let Ok(text) = std::str::from_utf8(bytes) else {
        problems.push(Problem::new(file, 0, "is not UTF-8 text"));
        return None;
    };
    let note = match note::parse(text) {
        Ok(note) => note,
        Err(err) => {
            let line = err.line().unwrap_or(1);
            let message = err.to_string();
            let message = message
                .strip_prefix(&format!("line {line}: "))
                .unwrap_or(&message)
                .to_owned();
            problems.push(Problem::new(file, line, message));
            return None;
        }
    };
    let fm: &Frontmatter = &note.frontmatter;
    let kinds = EntityKind::ALL.map(EntityKind::as_str).join(", ");
    let kind = match fm.get("type") {
        Some(written) => match EntityKind::parse(written.trim()) {
            Some(kind) => kind,
            None => {
                problems.push(Problem::new(
                    file,
                    fm.line_of("type").unwrap_or(1),
                    format!("unknown entity type {written:?}; the types are {kinds}"),
                ));
                return None;
            }
        },
        None => {
            let line = fm.line_of("type").unwrap_or(1);
            problems.push(Problem::new(
                file,
                line,
                format!("no entity type: a world note is one entity, with `type:` one of {kinds}"),
            ));
            return None;
        }
    };
    let title = note.title().unwrap_or(&name).to_owned();
    let mut targets = Vec::new();
    for relation in RelationKind::ALL {
        let key = relation.as_str();
        if fm.contains(key) && fm.get(key).is_none() && fm.items(key).is_empty() && !fm.is_null(key)
        {
            problems.push(Problem::new(
                file,
                fm.line_of(key).unwrap_or(1),
                format!("{key} is neither a name, a [[link]] nor a list of them"),
            ));
        }
        for item in fm.items(key) {
            for target in relation_targets(&item.value) {
                targets.push((relation, target, item.line));
            }
        }
    }
    let aliases = fm
        .items("aliases")
        .into_iter()
        .filter(|a| !a.value.trim().is_empty())
        .map(|a| Item {
            value: a.value.trim().to_owned(),
            line: a.line,
        })
        .collect();
    Some(Draft {
        entity: Entity {
            name,
            kind,
            title,
            path: file.to_owned(),
            relations: Vec::new(),
            aliases: Vec::new(),
        },
        targets,
        aliases,
    })
}

#[cfg(test)]
mod tests {
    use pretty_assertions::assert_eq;

    use super::*;

    fn entity(name: &str, kind: EntityKind, relations: &[(RelationKind, &str)]) -> Entity {
        Entity {
            name: name.to_owned(),
            kind,
            title: name.to_owned(),
            path: format!("world/{name}.md"),
            relations: relations
                .iter()
                .map(|(k, t)| (*k, (*t).to_owned()))
                .collect(),
            aliases: Vec::new(),
        }
    }

    #[test]
    fn kinds_print_and_parse_by_name() {
        for kind in EntityKind::ALL {
            assert_eq!(EntityKind::parse(kind.as_str()), Some(kind));
            assert_eq!(serde_json::to_string(&kind).unwrap(), format!("\"{kind}\""));
        }
        for kind in RelationKind::ALL {
            assert_eq!(RelationKind::parse(kind.as_str()), Some(kind));
            assert_eq!(serde_json::to_string(&kind).unwrap(), format!("\"{kind}\""));
        }
        assert_eq!(EntityKind::parse("Host"), None);
        assert_eq!(RelationKind::parse("runs-on"), None);
    }

    #[test]
    fn blast_walks_every_kind_of_relation_with_the_shortest_path() {
        use EntityKind::*;
        use RelationKind::*;
        let world = World::from_entities(vec![
            entity("tank", Pool, &[(PartOf, "rack1")]),
            entity("rack1", Site, &[]),
            entity("db01", Host, &[(StoresOn, "tank"), (PartOf, "rack1")]),
            entity("postgresql", Service, &[(RunsOn, "db01")]),
            entity(
                "grafana",
                Service,
                &[(DependsOn, "postgresql"), (DependsOn, "tank")],
            ),
            entity("lonely", Host, &[]),
        ]);
        let blast = world.blast("TANK").unwrap();
        assert_eq!(blast.root, "tank");
        let lines: Vec<String> = blast.affected.iter().map(ToString::to_string).collect();
        assert_eq!(
            lines,
            [
                "db01 (host): db01 -stores_on-> tank",
                "grafana (service): grafana -depends_on-> tank",
                "postgresql (service): postgresql -runs_on-> db01 -stores_on-> tank",
            ]
        );
        assert_eq!(blast.affected[2].depth, 2);
        assert_eq!(
            blast.affected[2].path,
            [
                Hop {
                    from: "postgresql".into(),
                    relation: RunsOn,
                    to: "db01".into()
                },
                Hop {
                    from: "db01".into(),
                    relation: StoresOn,
                    to: "tank".into()
                },
            ]
        );
        assert_eq!(
            world.blast("postgresql").unwrap().to_string(),
            "If postgresql stops, 1 entity is affected:\n  grafana (service): grafana -depends_on-> postgresql"
        );
        assert_eq!(
            world.blast("grafana").unwrap().to_string(),
            "If grafana stops, nothing else is affected."
        );
        let site = world.blast("rack1").unwrap();
        assert_eq!(site.summary(2), "db01, tank and 2 more");
        assert_eq!(site.summary(10), "db01, tank, grafana and postgresql");
        assert_eq!(world.blast("nobody"), None);
        assert_eq!(world.cycles(), Vec::<Vec<String>>::new());
        let direct: Vec<(RelationKind, &str)> = world
            .dependents("db01")
            .into_iter()
            .map(|(k, e)| (k, e.name.as_str()))
            .collect();
        assert_eq!(direct, [(RunsOn, "postgresql")]);
    }

    #[test]
    fn cycles_are_found_and_blast_terminates_on_them() {
        use EntityKind::*;
        use RelationKind::*;
        let world = World::from_entities(vec![
            entity("a", Service, &[(DependsOn, "b")]),
            entity("b", Service, &[(DependsOn, "c")]),
            entity("c", Service, &[(DependsOn, "a"), (DependsOn, "d")]),
            entity("d", Host, &[]),
            entity("self", Service, &[(DependsOn, "self")]),
        ]);
        assert_eq!(world.cycles(), [vec!["a", "b", "c"], vec!["self"]]);
        let blast = world.blast("a").unwrap();
        let names: Vec<&str> = blast.affected.iter().map(|a| a.entity.as_str()).collect();
        assert_eq!(names, ["c", "b"]);
        assert_eq!(world.blast("self").unwrap().affected, []);
        assert_eq!(world.blast("d").unwrap().affected.len(), 3);
    }

    #[test]
    fn from_entities_names_targets_as_their_entities_and_drops_the_rest() {
        use EntityKind::*;
        use RelationKind::*;
        let mut pg = entity(
            "postgresql",
            Service,
            &[(RunsOn, "DB01"), (RunsOn, "db01"), (DependsOn, "gone")],
        );
        pg.aliases = vec!["postgresql.service".into(), "DB01".into()];
        let world = World::from_entities(vec![
            pg,
            entity("db01", Host, &[]),
            entity("DB01", Vm, &[]),
            entity("web", Service, &[(DependsOn, "postgresql.service")]),
        ]);
        assert_eq!(world.len(), 3);
        assert_eq!(
            world.get("db01").unwrap().kind,
            Vm,
            "DB01 sorts first and is kept"
        );
        let pg = world.get("POSTGRESQL.SERVICE").unwrap();
        assert_eq!(pg.relations, [(RunsOn, "DB01".to_owned())]);
        assert_eq!(pg.aliases, ["postgresql.service"]);
        assert_eq!(
            world.get("web").unwrap().relations,
            [(DependsOn, "postgresql".to_owned())]
        );
        let json = serde_json::to_value(&world).unwrap();
        assert_eq!(
            json["entities"][1]["relations"],
            serde_json::json!([{"kind": "runs_on", "target": "DB01"}])
        );
        let back: World = serde_json::from_value(json).unwrap();
        assert_eq!(back, world);
    }

    #[test]
    fn strongly_connected_handles_a_long_chain_without_recursion() {
        let n = 200_000;
        let graph: Vec<Vec<usize>> = (0..n)
            .map(|i| if i + 1 < n { vec![i + 1] } else { vec![0] })
            .collect();
        let components = strongly_connected(&graph);
        assert_eq!(components.len(), 1);
        assert_eq!(components[0].len(), n);
    }
}
