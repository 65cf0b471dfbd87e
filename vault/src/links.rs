//! The vault-wide check: every note's frontmatter parses, every `[[link]]`
//! resolves as Obsidian resolves it, and links point from memory to shared
//! notes, never the other way (L10), nor from one agent's memory into
//! another's.

use std::collections::HashMap;
use std::fmt;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::note::{self, Link};
use crate::path::MEMORY;

/// One thing wrong in the vault, where it is: the file (vault-relative)
/// and the 1-based line; line 0 for a problem with the whole file (it
/// cannot be read).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Problem {
    /// The file, relative to the vault root, with forward slashes.
    pub file: String,
    /// The 1-based line, or 0 for the whole file.
    pub line: usize,
    /// What is wrong, for the operator who fixes it.
    pub message: String,
}

impl Problem {
    /// A problem at `line` of `file`.
    pub fn new(file: impl Into<String>, line: usize, message: impl Into<String>) -> Problem {
        Problem {
            file: file.into(),
            line,
            message: message.into(),
        }
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line == 0 {
            write!(f, "{}: {}", self.file, self.message)
        } else {
            write!(f, "{}:{}: {}", self.file, self.line, self.message)
        }
    }
}

/// The files of a folder tree, vault-relative with forward slashes,
/// sorted, hidden files and folders (`.git`, `.obsidian`, `.trash`) left
/// out. What cannot be read is a problem, not a stop.
pub(crate) fn walk(root: &Path, under: &str, problems: &mut Vec<Problem>) -> Vec<String> {
    let mut files = Vec::new();
    let mut pending = vec![under.to_owned()];
    while let Some(folder) = pending.pop() {
        let dir = if folder.is_empty() {
            root.to_path_buf()
        } else {
            root.join(&folder)
        };
        let entries = match std::fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(err) => {
                let shown = if folder.is_empty() { "." } else { &folder };
                problems.push(Problem::new(
                    shown,
                    0,
                    format!("cannot read the folder: {err}"),
                ));
                continue;
            }
        };
        for entry in entries {
            let entry = match entry {
                Ok(entry) => entry,
                Err(err) => {
                    problems.push(Problem::new(
                        &folder,
                        0,
                        format!("cannot read the folder: {err}"),
                    ));
                    continue;
                }
            };
            let name = entry.file_name();
            let Some(name) = name.to_str() else {
                let shown = format!("{folder}/{}", name.to_string_lossy());
                problems.push(Problem::new(
                    shown,
                    0,
                    "the name is not UTF-8; Obsidian cannot link to it",
                ));
                continue;
            };
            if name.starts_with('.') {
                continue;
            }
            let rel = if folder.is_empty() {
                name.to_owned()
            } else {
                format!("{folder}/{name}")
            };
            // Follows symlinks, as Obsidian does.
            match std::fs::metadata(entry.path()) {
                Ok(meta) if meta.is_dir() => pending.push(rel),
                Ok(_) => files.push(rel),
                Err(err) => problems.push(Problem::new(rel, 0, format!("cannot read it: {err}"))),
            }
        }
    }
    files.sort();
    files
}

/// The last component of a vault-relative path.
fn file_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// Resolves link targets to files as Obsidian does: by vault-relative
/// path (with or without `.md`), else by file name (a note's stem, an
/// attachment's whole name), ignoring case; a target with folders matches
/// a file whose path ends with them.
pub(crate) struct Resolver<'a> {
    files: &'a [String],
    /// Lowercase path (notes also without `.md`) to file index.
    by_path: HashMap<String, usize>,
    /// Lowercase link name (a note's stem, another file's name) to files.
    by_name: HashMap<String, Vec<usize>>,
}

impl<'a> Resolver<'a> {
    pub(crate) fn new(files: &'a [String]) -> Resolver<'a> {
        let mut by_path = HashMap::with_capacity(files.len() * 2);
        let mut by_name: HashMap<String, Vec<usize>> = HashMap::with_capacity(files.len());
        for (i, file) in files.iter().enumerate() {
            let lower = file.to_lowercase();
            let name = file_name(&lower);
            let link_name = name.strip_suffix(".md").unwrap_or(name).to_owned();
            by_name.entry(link_name).or_default().push(i);
            if let Some(no_ext) = lower.strip_suffix(".md") {
                by_path.entry(no_ext.to_owned()).or_insert(i);
            }
            by_path.entry(lower).or_insert(i);
        }
        Resolver {
            files,
            by_path,
            by_name,
        }
    }

    /// The file `target` resolves to from the note `from`: an exact path
    /// first, else among files of that name the one in `from`'s folder,
    /// else the shortest path.
    pub(crate) fn resolve(&self, target: &str, from: &str) -> Option<&'a str> {
        let lower = target.trim().trim_start_matches('/').to_lowercase();
        if let Some(&i) = self.by_path.get(&lower) {
            return Some(&self.files[i]);
        }
        let name = file_name(&lower);
        let name = name.strip_suffix(".md").unwrap_or(name);
        let wanted_suffix = format!("/{}", lower.strip_suffix(".md").unwrap_or(&lower));
        let from_folder = from.rsplit_once('/').map_or("", |(folder, _)| folder);
        self.by_name
            .get(name)?
            .iter()
            .map(|&i| self.files[i].as_str())
            .filter(|file| {
                // `[[hosts/nas01]]` names world/hosts/nas01.md.
                !lower.contains('/') || {
                    let file = file.to_lowercase();
                    let file = file.strip_suffix(".md").unwrap_or(&file);
                    format!("/{file}").ends_with(&wanted_suffix)
                }
            })
            .min_by_key(|file| {
                let in_folder =
                    file.rsplit_once('/').map_or("", |(folder, _)| folder) == from_folder;
                (!in_folder, file.len(), *file)
            })
    }
}

/// Checks the whole vault at `root`: every Markdown note's frontmatter
/// parses, each `[[link]]` resolves to a note or file, no note outside
/// `memory/` links into it, and no agent's memory links into another
/// agent's. Hidden folders are not looked at. Problems are sorted by file
/// and line.
pub fn check_vault(root: &Path) -> Vec<Problem> {
    let mut problems = Vec::new();
    let files = walk(root, "", &mut problems);
    let resolver = Resolver::new(&files);
    for file in files.iter().filter(|f| f.ends_with(".md")) {
        let text = match std::fs::read(root.join(file)) {
            Ok(bytes) => match String::from_utf8(bytes) {
                Ok(text) => text,
                Err(_) => {
                    problems.push(Problem::new(file, 0, "is not UTF-8 text"));
                    continue;
                }
            },
            Err(err) => {
                problems.push(Problem::new(file, 0, format!("cannot read it: {err}")));
                continue;
            }
        };
        if let Err(err) = note::parse(&text) {
            let line = err.line().unwrap_or(1);
            // The error's own text starts with its line; the problem has it.
            let message = err.to_string();
            let message = message
                .strip_prefix(&format!("line {line}: "))
                .unwrap_or(&message)
                .to_owned();
            problems.push(Problem::new(file, line, message));
        }
        for link in note::links(&text) {
            if let Some(problem) = check_link(&resolver, file, &link) {
                problems.push(problem);
            }
        }
    }
    problems.sort();
    problems
}

/// Whose memory a vault-relative file is in, if any agent's.
fn memory_owner(file: &str) -> Option<&str> {
    let mut parts = file.split('/');
    match (parts.next(), parts.next(), parts.next()) {
        (Some(MEMORY), Some(agent), Some(_)) => Some(agent),
        _ => None,
    }
}

fn check_link(resolver: &Resolver<'_>, file: &str, link: &Link) -> Option<Problem> {
    let target = &link.target;
    let Some(resolved) = resolver.resolve(target, file) else {
        return Some(Problem::new(
            file,
            link.line,
            format!("[[{target}]] does not resolve to any note or file in the vault"),
        ));
    };
    let from_memory = file.split('/').next() == Some(MEMORY) && file.contains('/');
    let to_agent = memory_owner(resolved)?;
    if !from_memory {
        return Some(Problem::new(
            file,
            link.line,
            format!(
                "[[{target}]] links to {resolved}, in the {to_agent} agent's memory; links point \
                 from memory to shared notes, never from shared notes into memory"
            ),
        ));
    }
    match memory_owner(file) {
        Some(from_agent) if from_agent != to_agent => Some(Problem::new(
            file,
            link.line,
            format!(
                "[[{target}]] links to {resolved}, in the {to_agent} agent's memory; the \
                 {from_agent} agent's memory links only to its own notes and shared ones, as \
                 each agent's memory is private"
            ),
        )),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use pretty_assertions::assert_eq;

    use super::*;

    fn vault(files: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (path, text) in files {
            let full = dir.path().join(path);
            std::fs::create_dir_all(full.parent().unwrap()).unwrap();
            std::fs::write(full, text).unwrap();
        }
        dir
    }

    #[test]
    fn a_valid_vault_has_no_problems() {
        let dir = vault(&[
            (
                "world/hosts/nas01.md",
                "---\ntype: host\n---\nSee [[db01]], [[Procedures/Restart]].\n",
            ),
            (
                "world/db01.md",
                "---\ntype: host\naliases: [db]\nruns_on: \"[[nas01]]\"\n---\n![[rack.png]]\n",
            ),
            ("world/rack.png", "png"),
            (
                "procedures/restart.md",
                "# Restart\n[[world/hosts/nas01.md|nas01]] [[hosts/nas01#Disks]]\n",
            ),
            (
                "memory/ops/index.md",
                "[[facts/disk]] [[nas01]] [[index]]\n",
            ),
            (
                "memory/ops/facts/disk.md",
                "Back to [[memory/ops/index]] and [[db01]].\n",
            ),
            (
                "memory/index.md",
                "The operator's list: [[memory/ops/index]]\n",
            ),
            ("notes.md", "`[[not-a-link]]`\n```\n[[nor-this]]\n```\n"),
            (".obsidian/workspace.md", "[[dangling-but-hidden]]\n"),
            (".git/x.md", "---\n: bad\n"),
        ]);
        assert_eq!(check_vault(dir.path()), Vec::<Problem>::new());
    }

    #[test]
    fn finds_dangling_links_bad_frontmatter_and_links_into_memory() {
        let dir = vault(&[
            (
                "world/nas01.md",
                "---\ntype: host\nruns_on: \"[[site9]]\"\n---\nline 4\nsee [[memory/ops/facts/disk]]\n",
            ),
            (
                "procedures/restart.md",
                "one\ntwo [[disk]] and ![[missing.png]]\n",
            ),
            (
                "memory/ops/facts/disk.md",
                "[[memory/dev/secret]] and [[nas01]]\n",
            ),
            ("memory/dev/secret.md", "---\ntype: [unclosed\n---\n"),
            ("broken.md", "---\ntitle: x\n"),
        ]);
        let found: Vec<String> = check_vault(dir.path())
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            found,
            [
                "broken.md:1: frontmatter opened by '---' is never closed by a '---' line",
                "memory/dev/secret.md:3: frontmatter is not valid YAML: while parsing a flow sequence, \
                 expected ',' or ']'",
                "memory/ops/facts/disk.md:1: [[memory/dev/secret]] links to memory/dev/secret.md, \
                 in the dev agent's memory; the ops agent's memory links only to its own notes and \
                 shared ones, as each agent's memory is private",
                "procedures/restart.md:2: [[disk]] links to memory/ops/facts/disk.md, in the ops \
                 agent's memory; links point from memory to shared notes, never from shared notes \
                 into memory",
                "procedures/restart.md:2: [[missing.png]] does not resolve to any note or file in the vault",
                "world/nas01.md:3: [[site9]] does not resolve to any note or file in the vault",
                "world/nas01.md:6: [[memory/ops/facts/disk]] links to memory/ops/facts/disk.md, in \
                 the ops agent's memory; links point from memory to shared notes, never from shared \
                 notes into memory",
            ]
        );
    }

    #[test]
    fn resolution_prefers_the_exact_path_then_the_same_folder_then_the_shortest() {
        let files: Vec<String> = ["a/x.md", "b/c/x.md", "b/x.md", "x.png", "d/X.md"]
            .iter()
            .map(|s| (*s).to_owned())
            .collect();
        let r = Resolver::new(&files);
        assert_eq!(r.resolve("b/c/x", "z.md"), Some("b/c/x.md"));
        assert_eq!(r.resolve("B/C/X.md", "z.md"), Some("b/c/x.md"));
        assert_eq!(r.resolve("x", "b/c/other.md"), Some("b/c/x.md"));
        assert_eq!(r.resolve("x", "z.md"), Some("a/x.md"));
        assert_eq!(r.resolve("c/x", "z.md"), Some("b/c/x.md"));
        assert_eq!(r.resolve("x.png", "b/y.md"), Some("x.png"));
        assert_eq!(r.resolve("y", "z.md"), None);
        assert_eq!(r.resolve("e/x", "z.md"), None);
    }
}
