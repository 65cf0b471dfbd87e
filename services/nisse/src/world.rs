//! `nisse world …` and `nisse vault …`: the operator's view of the
//! knowledge vault on this machine. The world model is read from the
//! vault's `world/` folder itself, not from an agent's stream, so what
//! these commands say is what the operator's notes say now, before any
//! vault reader has sent it; the rebuild reads the agent's stream.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use serde::Serialize;

use nisse_bus::{AgentName, Bus};
use nisse_vault::world::{self, Affected, Blast, Entity, EntityKind, RelationKind, World};
use nisse_vault::{Problem, links};

use crate::config::Config;
use crate::shown::{Shown, outln};

/// The vault folder of this installation, which must exist.
fn vault_root(cfg: &Config) -> anyhow::Result<PathBuf> {
    let root = cfg.vault.root(&cfg.data_dir);
    match std::fs::metadata(&root) {
        Ok(meta) if meta.is_dir() => Ok(root),
        Ok(_) => anyhow::bail!("the vault {} is a file, not a folder", root.display()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => anyhow::bail!(
            "there is no vault at {} (`[vault] dir`, or `vault` under the data directory): point --data-dir or `[vault] dir` at it",
            root.display()
        ),
        Err(e) => Err(e).with_context(|| format!("reading the vault {}", root.display())),
    }
}

/// The world model of the vault, and a warning when it has problems
/// (said once, as a count: `nisse world check` lists them).
fn load(cfg: &Config) -> anyhow::Result<(PathBuf, World, Vec<String>)> {
    let root = vault_root(cfg)?;
    let (world, problems) = world::load(&root);
    let mut warnings = Vec::new();
    if !problems.is_empty() {
        warnings.push(format!(
            "the world model in {} has {} problem(s); what is shown leaves those notes or relations out (nisse world check lists them)",
            root.join(nisse_vault::WORLD).display(),
            problems.len()
        ));
    }
    Ok((root, world, warnings))
}

/// The entity named `name` (or with that alias), or an error naming it,
/// the world it was looked for in, and the closest names.
fn find<'w>(world: &'w World, root: &Path, name: &str) -> anyhow::Result<&'w Entity> {
    if let Some(entity) = world.get(name) {
        return Ok(entity);
    }
    let folder = root.join(nisse_vault::WORLD);
    if world.is_empty() {
        anyhow::bail!(
            "no entity `{name}`: the world model in {} has no entities (a note per entity, with `type:` in its frontmatter)",
            folder.display()
        );
    }
    let close = closest(world, name);
    let hint = if close.is_empty() {
        String::new()
    } else {
        format!("; the closest: {}", close.join(", "))
    };
    anyhow::bail!(
        "no entity or alias `{name}` in the world model in {} ({} entities){hint}",
        folder.display(),
        world.len()
    )
}

/// Up to three names or aliases near `wanted`: within a few edits, or
/// containing it.
fn closest(world: &World, wanted: &str) -> Vec<String> {
    let wanted = wanted.trim().to_lowercase();
    let allowed = (wanted.chars().count() / 3).max(2);
    let mut scored: Vec<(usize, String)> = world
        .entities()
        .iter()
        .flat_map(|e| std::iter::once(&e.name).chain(&e.aliases))
        .filter_map(|name| {
            let lower = name.to_lowercase();
            let distance = if lower.contains(&wanted) || wanted.contains(&lower) {
                0
            } else {
                edit_distance(&lower, &wanted)
            };
            (distance <= allowed).then(|| (distance, name.clone()))
        })
        .collect();
    scored.sort();
    scored.dedup_by(|a, b| a.1 == b.1);
    scored.into_iter().take(3).map(|(_, name)| name).collect()
}

/// Levenshtein distance, in characters.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (above + 1)
                .min(row[j] + 1)
                .min(diagonal + usize::from(ca != *cb));
            diagonal = above;
        }
    }
    row[b.len()]
}

/// An entity that relates to another, as `world show` lists it.
#[derive(Debug, Serialize)]
struct Dependent {
    entity: String,
    kind: EntityKind,
    relation: RelationKind,
}

/// `nisse world show <entity>`: what it is, where its note is, what it
/// relies on, and what relies on it directly.
pub fn entity(cfg: &Config, name: &str) -> anyhow::Result<Shown> {
    let (root, world, warnings) = load(cfg)?;
    let entity = find(&world, &root, name)?;
    let dependents: Vec<Dependent> = world
        .dependents(&entity.name)
        .into_iter()
        .map(|(relation, e)| Dependent {
            entity: e.name.clone(),
            kind: e.kind,
            relation,
        })
        .collect();
    let affected = world.blast(&entity.name).map_or(0, |b| b.affected.len());
    let json = serde_json::json!({
        "entity": entity,
        "dependents": dependents,
        "affected": affected,
    });
    let mut text = String::new();
    outln!(text, "{} ({}): {}", entity.name, entity.kind, entity.title);
    outln!(text, "  note:     {}", root.join(&entity.path).display());
    if !entity.aliases.is_empty() {
        outln!(text, "  aliases:  {}", entity.aliases.join(", "));
    }
    if entity.relations.is_empty() {
        outln!(text, "  relies on nothing in the world model");
    } else {
        outln!(text, "  relies on:");
        for (relation, target) in &entity.relations {
            let kind = world
                .get(target)
                .map_or(String::new(), |t| format!(" ({})", t.kind));
            outln!(text, "    {relation} {target}{kind}");
        }
    }
    if dependents.is_empty() {
        outln!(text, "  nothing relies on it");
    } else {
        outln!(text, "  relied on directly by {}:", dependents.len());
        for d in &dependents {
            outln!(
                text,
                "    {} ({}) {} {}",
                d.entity,
                d.kind,
                d.relation,
                entity.name
            );
        }
    }
    outln!(
        text,
        "  if it stops: {affected} {} affected (nisse world blast {})",
        if affected == 1 { "entity" } else { "entities" },
        entity.name
    );
    let mut shown = Shown::new(text, json);
    shown.warnings = warnings;
    Ok(shown)
}

/// `nisse world list`: every entity of the world model, by name, with its
/// kind, title and what it relies on.
pub fn entities(cfg: &Config) -> anyhow::Result<Shown> {
    let (root, world, warnings) = load(cfg)?;
    let folder = root.join(nisse_vault::WORLD);
    let mut text = String::new();
    if world.is_empty() {
        outln!(
            text,
            "the world model in {} has no entities (a note per entity, with `type:` in its frontmatter)",
            folder.display()
        );
    }
    let mut sorted: Vec<&Entity> = world.entities().iter().collect();
    sorted.sort_by(|a, b| a.name.cmp(&b.name));
    for e in &sorted {
        let relies: Vec<String> = e
            .relations
            .iter()
            .map(|(relation, target)| format!("{relation} {target}"))
            .collect();
        outln!(
            text,
            "{} ({}): {}{}",
            e.name,
            e.kind,
            e.title,
            if relies.is_empty() {
                String::new()
            } else {
                format!(" — {}", relies.join(", "))
            }
        );
    }
    if !world.is_empty() {
        outln!(
            text,
            "{} entities in {} (nisse world show/blast <entity> for one)",
            world.len(),
            folder.display()
        );
    }
    let mut shown = Shown::new(
        text,
        serde_json::json!({ "world": folder, "entities": sorted }),
    );
    shown.warnings = warnings;
    Ok(shown)
}

/// One line of a blast radius: `grafana: depends_on postgresql → runs_on
/// db01 → stores_on tank`.
fn blast_line(affected: &Affected) -> String {
    let path: Vec<String> = affected
        .path
        .iter()
        .map(|hop| format!("{} {}", hop.relation, hop.to))
        .collect();
    format!("{}: {}", affected.entity, path.join(" → "))
}

/// `nisse world blast <entity>`: everything affected if it stops,
/// transitively, each with its path to it, nearest first.
pub fn blast(cfg: &Config, name: &str) -> anyhow::Result<Shown> {
    let (root, world, warnings) = load(cfg)?;
    let entity = find(&world, &root, name)?;
    let Blast {
        root: stops,
        affected,
    } = world
        .blast(&entity.name)
        .with_context(|| format!("the world model lost `{}` while it was read", entity.name))?;
    let mut text = String::new();
    for a in &affected {
        outln!(text, "{}", blast_line(a));
    }
    match affected.len() {
        0 => outln!(text, "nothing else is affected if {stops} stops"),
        1 => outln!(text, "1 entity is affected if {stops} stops"),
        n => outln!(text, "{n} entities are affected if {stops} stops"),
    }
    let json = serde_json::json!({
        "root": stops,
        "kind": entity.kind,
        "count": affected.len(),
        "affected": affected,
    });
    let mut shown = Shown::new(text, json);
    shown.warnings = warnings;
    Ok(shown)
}

/// The link check of the whole vault, and how many notes it read.
fn check_links(root: &Path) -> (Vec<Problem>, usize) {
    (links::check_vault(root), count_notes(root))
}

/// The Markdown notes under `dir`, hidden files and folders left out, as
/// the link check reads them.
fn count_notes(dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
        .map(|e| {
            let path = e.path();
            // Followed like the check follows them.
            match std::fs::metadata(&path) {
                Ok(meta) if meta.is_dir() => count_notes(&path),
                Ok(_) if path.extension().is_some_and(|x| x == "md") => 1,
                _ => 0,
            }
        })
        .sum()
}

/// What a check of the vault found: each problem, and what the check
/// concludes (what was checked, or how many problems there are).
#[derive(Debug)]
pub struct Checked {
    /// Each problem as `file:line: message`, paths relative to the vault.
    pub problems: Vec<String>,
    /// The conclusion, one line.
    pub summary: String,
}

impl Checked {
    fn of(root: &Path, problems: &[Problem], valid: impl FnOnce() -> String) -> Self {
        let summary = if problems.is_empty() {
            valid()
        } else {
            format!(
                "{} problem(s) in the vault {} (each above as file:line: what is wrong, paths relative to the vault)",
                problems.len(),
                root.display()
            )
        };
        Self {
            problems: problems.iter().map(ToString::to_string).collect(),
            summary,
        }
    }

    /// Prints each problem, then the conclusion; fails with it when there
    /// is any problem.
    pub fn print(&self) -> anyhow::Result<()> {
        for problem in &self.problems {
            println!("{problem}");
        }
        anyhow::ensure!(self.problems.is_empty(), "{}", self.summary);
        println!("{}", self.summary);
        Ok(())
    }
}

/// `nisse world check`: the world model loads without a problem (types,
/// relations, names, cycles) and every link of the vault resolves.
pub fn check_world(cfg: &Config) -> anyhow::Result<Checked> {
    let root = vault_root(cfg)?;
    let (world, mut problems) = world::load(&root);
    let (link_problems, notes) = check_links(&root);
    // A dangling relation written as a [[link]] is both; the world's
    // message says more.
    let said: std::collections::BTreeSet<(String, usize)> =
        problems.iter().map(|p| (p.file.clone(), p.line)).collect();
    problems.extend(
        link_problems
            .into_iter()
            .filter(|p| !said.contains(&(p.file.clone(), p.line))),
    );
    problems.sort();
    problems.dedup();
    Ok(Checked::of(&root, &problems, || {
        let relations: usize = world.entities().iter().map(|e| e.relations.len()).sum();
        let mut kinds: BTreeMap<&str, usize> = BTreeMap::new();
        for e in world.entities() {
            *kinds.entry(e.kind.as_str()).or_default() += 1;
        }
        let kinds: Vec<String> = kinds.iter().map(|(k, n)| format!("{n} {k}")).collect();
        format!(
            "the world model is valid: {} entities{}, {relations} relations; {notes} notes checked in {}, every link resolves",
            world.len(),
            if kinds.is_empty() {
                String::new()
            } else {
                format!(" ({})", kinds.join(", "))
            },
            root.display()
        )
    }))
}

/// `nisse vault check`: every note parses, every `[[link]]` resolves, and
/// no shared note links into an agent's memory.
pub fn check_vault(cfg: &Config) -> anyhow::Result<Checked> {
    let root = vault_root(cfg)?;
    let (problems, notes) = check_links(&root);
    Ok(Checked::of(&root, &problems, || {
        format!(
            "{notes} notes checked in {}: every link resolves, and no shared note links into memory/",
            root.display()
        )
    }))
}

/// The files under `dir`, relative to it, sorted.
fn files_under(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(at) = pending.pop() {
        for entry in std::fs::read_dir(&at)? {
            let path = entry?.path();
            if path.is_dir() {
                pending.push(path);
            } else if let Ok(rel) = path.strip_prefix(dir) {
                out.push(rel.to_path_buf());
            }
        }
    }
    out.sort();
    Ok(out)
}

/// `nisse vault rebuild <DIR> --agent A`: every note the agent wrote,
/// regenerated from its whole stream into `dir` (new or empty) by the
/// writer's own rebuild, then listed. The folder is looked at before the
/// bus is: a wrong folder is said at once, wherever the bus is.
pub async fn rebuild(cfg: &Config, agent: &str, dir: &Path) -> anyhow::Result<()> {
    anyhow::ensure!(
        cfg.agents.iter().any(|a| a == agent),
        "`{agent}` is not one of the configured agents ({})",
        cfg.agents.join(", ")
    );
    let agent: AgentName = agent.parse()?;
    match std::fs::read_dir(dir) {
        Ok(mut entries) => {
            if entries.next().is_some() {
                anyhow::bail!(
                    "{} is not empty: the vault is rebuilt into a new or empty folder only, never over notes",
                    dir.display()
                );
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("reading {}", dir.display())),
    }
    let bus = crate::inspect::connect(cfg).await?;
    rebuild_from(&bus, &agent, dir).await
}

/// The rebuild itself, from `bus`.
async fn rebuild_from(bus: &Bus, agent: &AgentName, dir: &Path) -> anyhow::Result<()> {
    let bounds = bus.stream_bounds(agent).await?;
    if bounds.first > 1 {
        eprintln!(
            "WARNING: {}'s stream begins at sequence {} (sequences 1 to {} aged out under the stream's limits, bus.streams.max-age and max-bytes).\n\
             Notes written before then are missing from the rebuild, and later appends to them start from nothing.",
            agent.stream(),
            bounds.first,
            bounds.first - 1
        );
    }
    let report = nisse_vault_writer::writer::rebuild(bus, agent, dir)
        .await
        .with_context(|| format!("rebuilding {agent}'s notes into {}", dir.display()))?;
    let files = files_under(dir).with_context(|| format!("listing {}", dir.display()))?;
    for file in &files {
        println!("{}", file.display());
    }
    println!(
        "rebuilt {agent}'s notes from its stream into {}: {} files from {} writes ({} applied, {} refused as the writer refused them, {} repeats of a request already applied)",
        dir.display(),
        files.len(),
        report.writes,
        report.written,
        report.refused,
        report.repeated
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edit_distance_counts_edits() {
        assert_eq!(edit_distance("postgres", "postgresql"), 2);
        assert_eq!(edit_distance("db01", "db02"), 1);
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("same", "same"), 0);
    }
}
