//! The notes of the vault as the reader sees them: which files are notes,
//! what each one is (its kind, whether it is trusted, its title and the
//! frontmatter the reader ranks and binds by), and its text as read.
//!
//! Hidden files and folders (`.git`, `.obsidian`, the writer's `.tmp`
//! files) and symbolic links inside the folders are never read: a link
//! could lead out of the folders an agent may read, and the writer never
//! makes one. (A top-level folder that is itself a link, the operator's
//! arrangement, is followed.)

use std::collections::BTreeMap;
use std::io;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

use nisse_proto::v1::NoteKind;
use nisse_vault::note::{self, Frontmatter};
use nisse_vault::{Access, MEMORY, Owner, VaultPath, WORLD};

/// The most of a note an answer carries; the rest is cut with a line
/// saying so (the model reads the note by path, and a huge note would not
/// fit a message on the bus).
pub(super) const CONTENT_CAP: usize = 64 * 1024;

/// The most of a note's text the full-text index takes: past it, a note
/// is something other than a note (a log pasted whole), and its head is
/// what a search needs.
const INDEXED_CAP: usize = 1024 * 1024;

/// What a file looked like when it was last read: a note whose stamp is
/// unchanged is not read again. The inode catches the writer's atomic
/// replace (a new file renamed over the old) even within one tick of the
/// clock and at the same size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Stamp {
    modified_ns: i128,
    size: u64,
    inode: u64,
}

impl Stamp {
    fn of(meta: &std::fs::Metadata) -> Self {
        Self {
            modified_ns: i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec()),
            size: meta.size(),
            inode: meta.ino(),
        }
    }
}

/// Every note under `folders` (paths relative to the vault root, with
/// forward slashes) with its stamp, and the folders that could not be
/// listed, saying why. A folder that does not exist holds no notes: it
/// is not a problem (a vault starts empty).
pub(super) fn walk(root: &Path, folders: &[String]) -> (BTreeMap<String, Stamp>, Vec<String>) {
    let mut notes = BTreeMap::new();
    let mut problems = Vec::new();
    for folder in folders {
        let mut pending = vec![(root.join(folder), folder.clone())];
        while let Some((dir, rel)) = pending.pop() {
            let entries = match std::fs::read_dir(&dir) {
                Ok(entries) => entries,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => {
                    problems.push(format!("{rel}/ cannot be listed: {e}"));
                    continue;
                }
            };
            for entry in entries {
                let entry = match entry {
                    Ok(entry) => entry,
                    Err(e) => {
                        problems.push(format!("{rel}/ cannot be listed: {e}"));
                        continue;
                    }
                };
                let name = entry.file_name();
                let Some(name) = name.to_str() else {
                    // Not a name a note path can carry.
                    continue;
                };
                if name.starts_with('.') {
                    continue;
                }
                // The entry's type as the listing gives it (a link is a
                // link, not followed); only notes need a stat of their own.
                let file_type = match entry.file_type() {
                    Ok(t) => t,
                    Err(e) => {
                        problems.push(format!("{rel}/{name} cannot be read: {e}"));
                        continue;
                    }
                };
                if file_type.is_dir() {
                    pending.push((entry.path(), format!("{rel}/{name}")));
                    continue;
                }
                if !file_type.is_file() || !name.ends_with(".md") {
                    continue;
                }
                let path = format!("{rel}/{name}");
                match entry.metadata() {
                    Ok(meta) => {
                        notes.insert(path, Stamp::of(&meta));
                    }
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(e) => problems.push(format!("{path} cannot be read: {e}")),
                }
            }
        }
    }
    (notes, problems)
}

/// Why `access` may not read `path`, or `None` when it may: the answer to
/// a read the privacy wall refuses (seed L10), naming whose the note is or
/// which grant is missing.
pub(super) fn refusal(access: &Access, path: &VaultPath) -> Option<String> {
    if access.may_read(path) {
        return None;
    }
    let agent = access.agent();
    Some(match path.owner() {
        Owner::Agent(other) => {
            format!("{path} is not readable by the {agent} agent: it is the {other} agent's memory")
        }
        Owner::Operator if !path.as_str().contains('/') => {
            format!("{path} is at the vault's root, outside every folder an agent may be granted")
        }
        Owner::Operator if path.folder() == MEMORY => format!(
            "{path} is in no agent's memory folder ({MEMORY}/<agent>/), so no agent reads it"
        ),
        Owner::Operator => format!(
            "{}/ is not granted to the {agent} agent (vault.read)",
            path.folder()
        ),
    })
}

/// One note as read from disk.
#[derive(Debug, Clone)]
pub(super) struct Note {
    /// Its path relative to the vault root.
    pub path: String,
    /// The file's text (invalid UTF-8 replaced).
    pub text: String,
    /// SHA-256 (hex) of the file's bytes.
    pub sha256: String,
    /// The text without its frontmatter.
    pub body: String,
    /// What it is.
    pub meta: Meta,
}

/// What a note is, from its path and frontmatter: what the reader binds,
/// ranks and labels it by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Meta {
    pub title: String,
    pub kind: NoteKind,
    pub trusted: bool,
    /// The alert fingerprint an incident note is about.
    pub fingerprint: String,
    /// The hosts it is about (lowercased).
    pub hosts: Vec<String>,
    pub tags: Vec<String>,
    /// When it was written (frontmatter `written`, RFC 3339), for newest
    /// first; empty when it does not say.
    pub written: String,
    /// What a procedure is bound to: `alert:<name>`, `duty:<name>`,
    /// `policy:<rule id>`.
    pub runbook_for: Vec<String>,
    /// Why its frontmatter could not be read, when it could not.
    pub problem: Option<String>,
}

/// Reads the note at `path` (relative to `root`). `NotFound` when there is
/// no such file; a hidden path, a link or a folder is refused as not a
/// note.
pub(super) fn read(root: &Path, path: &str) -> io::Result<Note> {
    let full = full_path(root, path)?;
    let meta = full.symlink_metadata()?;
    if !meta.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            if meta.is_dir() {
                "it is a folder, not a note"
            } else {
                "it is not a plain file (a link is never followed)"
            },
        ));
    }
    let bytes = std::fs::read(&full)?;
    Ok(parse(path, &bytes))
}

/// `path` under `root`, refusing any part that is empty, hidden (`.git`,
/// `..`) or not a plain name: the reader never leaves the vault or reads
/// what is hidden in it, whatever the path says.
fn full_path(root: &Path, path: &str) -> io::Result<PathBuf> {
    let mut full = root.to_path_buf();
    for part in path.split('/') {
        if part.is_empty() || part.starts_with('.') || part.contains('\\') {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "not a path inside the vault (empty, hidden or `..` parts)",
            ));
        }
        full.push(part);
    }
    Ok(full)
}

/// A note from the file's bytes.
fn parse(path: &str, bytes: &[u8]) -> Note {
    let text = String::from_utf8_lossy(bytes).into_owned();
    let sha256 = note::sha256_hex(bytes);
    let (parsed, problem) = match note::parse(&text) {
        Ok(parsed) => (Some(parsed), None),
        Err(e) => (None, Some(e.to_string())),
    };
    let meta = describe(path, parsed.as_ref(), &text, problem);
    let body = parsed.map_or_else(|| text.clone(), |p| p.body);
    Note {
        path: path.to_string(),
        text,
        sha256,
        body,
        meta,
    }
}

/// What the note at `path` is (see the module doc of the reader for the
/// conventions): from its parsed frontmatter, or, when that cannot be
/// read, from its path and `text` alone.
fn describe(path: &str, parsed: Option<&note::Note>, text: &str, problem: Option<String>) -> Meta {
    let frontmatter: Option<&Frontmatter> = parsed.map(|p| &p.frontmatter);
    let get = |key: &str| {
        frontmatter
            .and_then(|f| f.get(key))
            .map(|v| v.trim().to_string())
            .unwrap_or_default()
    };
    let list = |key: &str| -> Vec<String> {
        frontmatter
            .map(|f| f.list(key))
            .unwrap_or_default()
            .into_iter()
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
            .collect()
    };
    let parts: Vec<&str> = path.split('/').collect();
    let in_memory = parts.first() == Some(&MEMORY);
    let runbook_for = list("runbook_for");
    let kind = if in_memory {
        if parts.get(2) == Some(&"incidents") {
            NoteKind::Incident
        } else {
            NoteKind::Memory
        }
    } else if parts.first() == Some(&WORLD) {
        NoteKind::World
    } else if !runbook_for.is_empty() {
        NoteKind::Procedure
    } else {
        NoteKind::Note
    };
    let trust = get("trust");
    // An agent's memory holds what came from a model, an alert or a
    // command unless it is the operator's correction, stored verbatim;
    // the operator's folders hold the operator's words unless marked.
    let trusted = if in_memory {
        trust == "operator"
    } else {
        trust != "untrusted"
    };
    let title = parsed
        .and_then(note::Note::title)
        .map(|t| t.trim().to_string())
        .filter(|t| !t.is_empty())
        .or_else(|| heading(text))
        .unwrap_or_else(|| stem(path).to_string());
    Meta {
        title,
        kind,
        trusted,
        fingerprint: get("fingerprint"),
        hosts: list("hosts")
            .into_iter()
            .map(|h| h.to_lowercase())
            .collect(),
        tags: parsed.map(note::tags).unwrap_or_default(),
        written: get("written"),
        runbook_for,
        problem,
    }
}

/// The first `# ` heading of `body`.
fn heading(body: &str) -> Option<String> {
    body.lines()
        .find_map(|l| l.strip_prefix("# "))
        .map(|t| t.trim().to_string())
        .filter(|t| !t.is_empty())
}

/// The file name of `path` without `.md`.
fn stem(path: &str) -> &str {
    let name = path.rsplit('/').next().unwrap_or(path);
    name.strip_suffix(".md").unwrap_or(name)
}

/// `text` for an answer: whole up to [`CONTENT_CAP`], else cut with a
/// line saying so.
pub(super) fn capped(text: &str) -> String {
    cut(text, CONTENT_CAP)
}

/// `text` cut to about `cap` bytes, at a line end when one is near, with
/// a line saying how much of it there was.
pub(super) fn cut(text: &str, cap: usize) -> String {
    if text.len() <= cap {
        return text.to_string();
    }
    let mut end = text.floor_char_boundary(cap);
    if let Some(line_end) = text[..end].rfind('\n')
        && line_end >= end / 2
    {
        end = line_end + 1;
    }
    let mut out = text[..end].to_string();
    if !out.ends_with('\n') {
        out.push('\n');
    }
    out.push_str(&format!(
        "[cut: the note is {} bytes, and this answer holds its first {end}]\n",
        text.len()
    ));
    out
}

/// `text` for the index: at most [`INDEXED_CAP`] bytes of it.
pub(super) fn indexed(text: &str) -> &str {
    &text[..text.floor_char_boundary(INDEXED_CAP)]
}
