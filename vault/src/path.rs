//! Vault paths, who owns them, and what an agent may read and write.
//!
//! The vault has one writer per folder (L10): `memory/<agent>/` belongs to
//! that agent, every other folder to the operator. A path is checked once,
//! when it becomes a [`VaultPath`], so nothing downstream can be handed a
//! path that climbs out of the vault, lands in a hidden folder (`.git`,
//! `.obsidian`) or names a file Obsidian cannot link to.

use std::fmt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{PathError, PathProblem};

/// The folder under which each agent has its own memory folder.
pub const MEMORY: &str = "memory";

/// The operator's folder of world-model entities (Oikos REQ-ORI-1).
pub const WORLD: &str = "world";

/// The longest file or folder name most filesystems take.
const MAX_COMPONENT: usize = 255;

/// The longest vault path accepted: far beyond any sensible note, short
/// enough that the root plus the path stays under every platform's limit.
const MAX_PATH: usize = 1024;

/// Characters Obsidian refuses in a note's name, or that would cut a
/// `[[link]]` to it short (`#` heading, `^` block, `|` alias, `[` `]`), or
/// that the operator's Syncthing copy on Windows or macOS could not hold.
const FORBIDDEN: &[char] = &['*', '"', '<', '>', ':', '|', '?', '#', '^', '[', ']'];

/// The memory folder of an agent, `memory/<agent>`, without a trailing slash.
pub fn memory_folder(agent: &str) -> String {
    format!("{MEMORY}/{agent}")
}

/// A vault-relative path to a note, validated.
///
/// Forward slashes, no empty, `.` or `..` components, no hidden component,
/// no backslash or control character, at most 255 bytes a component and
/// 1024 in all, ending in `.md`. Serialized as the string itself.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct VaultPath(String);

impl VaultPath {
    /// Checks `text` as a vault path to a note.
    ///
    /// # Errors
    /// A [`PathError`] naming the path and what is wrong with it.
    pub fn parse(text: &str) -> Result<VaultPath, PathError> {
        let fail = |problem| {
            Err(PathError {
                path: text.to_owned(),
                problem,
            })
        };
        if text.is_empty() {
            return fail(PathProblem::Empty);
        }
        if text.len() > MAX_PATH {
            return fail(PathProblem::TooLong { max: MAX_PATH });
        }
        if text.starts_with('/') {
            return fail(PathProblem::Absolute);
        }
        if text.contains('\\') {
            return fail(PathProblem::Backslash);
        }
        if let Some(c) = text.chars().find(|c| c.is_control()) {
            return fail(PathProblem::Control(c));
        }
        for component in text.split('/') {
            if component.is_empty() {
                return fail(PathProblem::EmptyComponent);
            }
            if component == "." || component == ".." {
                return fail(PathProblem::Dots(component.to_owned()));
            }
            if component.starts_with('.') {
                return fail(PathProblem::Hidden(component.to_owned()));
            }
            if component.len() > MAX_COMPONENT {
                return fail(PathProblem::ComponentTooLong {
                    component: component.to_owned(),
                    max: MAX_COMPONENT,
                });
            }
            if let Some(c) = component.chars().find(|c| FORBIDDEN.contains(c)) {
                return fail(PathProblem::Forbidden(c));
            }
            if component != component.trim() {
                return fail(PathProblem::Spaces(component.to_owned()));
            }
        }
        let Some(stem) = text.rsplit('/').next().and_then(|n| n.strip_suffix(".md")) else {
            return fail(PathProblem::NotMarkdown);
        };
        if stem.trim().is_empty() {
            return fail(PathProblem::NoStem);
        }
        Ok(VaultPath(text.to_owned()))
    }

    /// The path as written, relative to the vault root.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The top-level folder (the first component): `world` for
    /// `world/hosts/nas01.md`, the file name itself for a note at the root.
    pub fn folder(&self) -> &str {
        self.0.split('/').next().unwrap_or(&self.0)
    }

    /// The file name without `.md`: what an Obsidian `[[link]]` names.
    pub fn stem(&self) -> &str {
        let name = self.0.rsplit('/').next().unwrap_or(&self.0);
        name.strip_suffix(".md").unwrap_or(name)
    }

    /// Whose folder the note is in: `memory/<agent>/…` (at least one
    /// component below the agent's folder) is that agent's, everything
    /// else the operator's.
    pub fn owner(&self) -> Owner {
        let mut parts = self.0.split('/');
        match (parts.next(), parts.next(), parts.next()) {
            (Some(MEMORY), Some(agent), Some(_)) => Owner::Agent(agent.to_owned()),
            _ => Owner::Operator,
        }
    }

    /// Where the note is on disk under the vault at `root`.
    pub fn to_fs(&self, root: &Path) -> PathBuf {
        let mut path = root.to_path_buf();
        path.extend(self.0.split('/'));
        path
    }
}

impl fmt::Display for VaultPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for VaultPath {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for VaultPath {
    type Error = PathError;

    fn try_from(text: String) -> Result<Self, Self::Error> {
        VaultPath::parse(&text)
    }
}

impl From<VaultPath> for String {
    fn from(path: VaultPath) -> String {
        path.0
    }
}

impl std::str::FromStr for VaultPath {
    type Err = PathError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        VaultPath::parse(text)
    }
}

/// Who writes a folder of the vault: exactly one writer per folder (L10).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Owner {
    /// The agent of that name, in its memory folder `memory/<agent>/`.
    Agent(String),
    /// The operator: every folder that is not an agent's memory,
    /// read-only for agents.
    Operator,
}

impl fmt::Display for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Owner::Agent(agent) => write!(f, "the {agent} agent's memory ({MEMORY}/{agent}/)"),
            Owner::Operator => f.write_str("the operator's"),
        }
    }
}

/// Checks a folder that an agent may be granted to read.
///
/// A grant is one top-level folder name, such as `world` or `procedures`:
/// not `memory` (no agent reads another's memory; its own it reads
/// anyway), not hidden (`.git`, `.obsidian`), not a path.
///
/// # Errors
/// Why the folder cannot be granted, naming it.
pub fn check_grant(folder: &str) -> Result<(), String> {
    let problem = if folder.is_empty() {
        "is empty"
    } else if folder.contains('/') || folder.contains('\\') {
        "is a path; a grant is one top-level folder of the vault"
    } else if folder == "." || folder == ".." {
        "is not a folder name"
    } else if folder.starts_with('.') {
        "is hidden (Obsidian's settings or git's history, not notes)"
    } else if folder == MEMORY {
        "holds the agents' memory; no agent reads another's, and its own it reads without a grant"
    } else if folder.chars().any(char::is_control) {
        "contains a control character"
    } else if folder != folder.trim() {
        "starts or ends with a space"
    } else {
        return Ok(());
    };
    Err(format!(
        "the vault folder {folder:?} cannot be granted: it {problem}"
    ))
}

/// What one agent may read and write in the vault (L10 "mounts enforce
/// it", checked here as well so a refusal can say why).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Access {
    agent: String,
    memory: String,
    grants: Vec<String>,
}

impl Access {
    /// The access of `agent`, which may read its own memory and the
    /// top-level folders in `grants`. A grant that [`check_grant`] refuses
    /// grants nothing; config validation reports it.
    pub fn new(agent: &str, grants: &[String]) -> Access {
        let grants = grants
            .iter()
            .filter(|g| check_grant(g).is_ok())
            .cloned()
            .collect();
        Access {
            agent: agent.to_owned(),
            memory: memory_folder(agent),
            grants,
        }
    }

    /// The agent this access is for.
    pub fn agent(&self) -> &str {
        &self.agent
    }

    /// The folders granted besides the agent's own memory.
    pub fn grants(&self) -> &[String] {
        &self.grants
    }

    /// Whether the agent may read the note: its own memory, or a note in a
    /// granted top-level folder. Never another agent's memory.
    pub fn may_read(&self, path: &VaultPath) -> bool {
        match path.owner() {
            Owner::Agent(agent) => agent == self.agent,
            Owner::Operator => {
                let folder = path.folder();
                // A note at the vault root has no folder to be granted.
                path.as_str().contains('/')
                    && folder != MEMORY
                    && self.grants.iter().any(|g| g == folder)
            }
        }
    }

    /// Checks that the agent may write the note: only under its own
    /// memory folder.
    ///
    /// # Errors
    /// Whose folder the note is in and that this agent may not write there.
    pub fn check_write(&self, path: &VaultPath) -> Result<(), String> {
        match path.owner() {
            Owner::Agent(agent) if agent == self.agent => Ok(()),
            Owner::Agent(agent) => Err(format!(
                "{path} is in the {agent} agent's memory; the {} agent writes only under {}/",
                self.agent, self.memory
            )),
            Owner::Operator => {
                let place = if path.as_str().contains('/') {
                    format!("the operator's folder {}/", path.folder())
                } else {
                    "the operator's vault root".to_owned()
                };
                Err(format!(
                    "{path} is in {place}, read-only for agents; the {} agent writes only under {}/",
                    self.agent, self.memory
                ))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use pretty_assertions::assert_eq;

    use super::*;

    fn refused(text: &str) -> PathProblem {
        VaultPath::parse(text).expect_err(text).problem
    }

    #[test]
    fn accepts_ordinary_notes() {
        for ok in [
            "world/nas01.md",
            "memory/ops/facts/disk full on nas01.md",
            "index.md",
            "procedures/nas01-root-disk.md",
            "world/hosts/db01 (primary).md",
            "memory/ops/incidents/2026-05-01 nas01 DiskFull.md",
            "Notizen/Überblick.md",
        ] {
            assert_eq!(VaultPath::parse(ok).expect(ok).as_str(), ok);
        }
    }

    #[test]
    fn refuses_each_kind_of_bad_path() {
        assert_eq!(refused(""), PathProblem::Empty);
        assert_eq!(refused("/etc/passwd.md"), PathProblem::Absolute);
        assert_eq!(refused("world\\nas01.md"), PathProblem::Backslash);
        assert_eq!(refused("world/nas\u{0}01.md"), PathProblem::Control('\0'));
        assert_eq!(refused("world/nas\n01.md"), PathProblem::Control('\n'));
        assert_eq!(refused("world//nas01.md"), PathProblem::EmptyComponent);
        assert_eq!(refused("world/"), PathProblem::EmptyComponent);
        assert_eq!(refused("world/../x.md"), PathProblem::Dots("..".into()));
        assert_eq!(refused("./x.md"), PathProblem::Dots(".".into()));
        assert_eq!(
            refused(".git/config.md"),
            PathProblem::Hidden(".git".into())
        );
        assert_eq!(
            refused("a/.obsidian/x.md"),
            PathProblem::Hidden(".obsidian".into())
        );
        assert_eq!(
            refused("world/.hidden.md"),
            PathProblem::Hidden(".hidden.md".into())
        );
        assert_eq!(refused("world/nas01.txt"), PathProblem::NotMarkdown);
        assert_eq!(refused("world/nas01"), PathProblem::NotMarkdown);
        assert_eq!(refused("world/ .md"), PathProblem::Spaces(" .md".into()));
        assert_eq!(refused("world/a:b.md"), PathProblem::Forbidden(':'));
        assert_eq!(refused("world/a[1].md"), PathProblem::Forbidden('['));
        assert_eq!(refused("world/a#b.md"), PathProblem::Forbidden('#'));
        assert_eq!(refused("world/a|b.md"), PathProblem::Forbidden('|'));
        let long = format!("world/{}.md", "x".repeat(300));
        assert_eq!(
            refused(&long),
            PathProblem::ComponentTooLong {
                component: format!("{}.md", "x".repeat(300)),
                max: 255
            }
        );
        let deep = format!("{}x.md", "abcdefgh/".repeat(120));
        assert_eq!(refused(&deep), PathProblem::TooLong { max: 1024 });
    }

    #[test]
    fn a_refusal_names_the_path_and_the_problem() {
        let err = VaultPath::parse("world/../secrets.md").unwrap_err();
        assert_eq!(
            err.to_string(),
            "vault path \"world/../secrets.md\" has a \"..\" component; paths stay inside the vault"
        );
    }

    #[test]
    fn parts_of_a_path() {
        let p = VaultPath::parse("world/hosts/nas01.md").unwrap();
        assert_eq!(p.folder(), "world");
        assert_eq!(p.stem(), "nas01");
        assert_eq!(p.owner(), Owner::Operator);
        assert_eq!(
            p.to_fs(Path::new("/v")),
            PathBuf::from("/v/world/hosts/nas01.md")
        );
        let root = VaultPath::parse("index.md").unwrap();
        assert_eq!(root.folder(), "index.md");
        assert_eq!(root.stem(), "index");
        assert_eq!(
            serde_json::to_string(&p).unwrap(),
            "\"world/hosts/nas01.md\""
        );
        let back: VaultPath = serde_json::from_str("\"world/hosts/nas01.md\"").unwrap();
        assert_eq!(back, p);
        assert!(serde_json::from_str::<VaultPath>("\"../x.md\"").is_err());
    }

    #[test]
    fn owners() {
        let own = |s: &str| VaultPath::parse(s).unwrap().owner();
        assert_eq!(own("memory/ops/x.md"), Owner::Agent("ops".into()));
        assert_eq!(own("memory/ops/incidents/x.md"), Owner::Agent("ops".into()));
        // Directly under memory/ is no agent's folder.
        assert_eq!(own("memory/index.md"), Owner::Operator);
        assert_eq!(own("world/memory/ops/x.md"), Owner::Operator);
        assert_eq!(
            Owner::Agent("ops".into()).to_string(),
            "the ops agent's memory (memory/ops/)"
        );
        assert_eq!(Owner::Operator.to_string(), "the operator's");
        assert_eq!(memory_folder("ops"), "memory/ops");
    }

    #[test]
    fn grants() {
        assert_eq!(check_grant("world"), Ok(()));
        assert_eq!(check_grant("procedures"), Ok(()));
        for bad in [
            "",
            "memory",
            ".git",
            ".obsidian",
            "world/hosts",
            "..",
            " world",
        ] {
            let err = check_grant(bad).expect_err(bad);
            assert!(err.contains(&format!("{bad:?}")), "{err}");
        }
        assert!(
            check_grant("memory")
                .unwrap_err()
                .contains("no agent reads another's")
        );
    }

    #[test]
    fn access_reads_own_memory_and_grants_only() {
        let grants = vec!["world".to_owned(), "memory".to_owned(), ".git".to_owned()];
        let ops = Access::new("ops", &grants);
        assert_eq!(ops.grants(), ["world".to_owned()]);
        let p = |s: &str| VaultPath::parse(s).unwrap();
        assert!(ops.may_read(&p("memory/ops/x.md")));
        assert!(ops.may_read(&p("world/nas01.md")));
        assert!(!ops.may_read(&p("memory/dev/x.md")));
        assert!(!ops.may_read(&p("memory/index.md")));
        assert!(!ops.may_read(&p("procedures/x.md")));
        assert!(!ops.may_read(&p("world.md")));
        let dev = Access::new("dev", &[]);
        assert!(!dev.may_read(&p("world/nas01.md")));
        assert!(dev.may_read(&p("memory/dev/notes/y.md")));
    }

    #[test]
    fn access_writes_own_memory_only_and_says_whose_folder_it_is() {
        let ops = Access::new("ops", &["world".to_owned()]);
        let p = |s: &str| VaultPath::parse(s).unwrap();
        assert_eq!(ops.check_write(&p("memory/ops/facts/x.md")), Ok(()));
        assert_eq!(
            ops.check_write(&p("world/nas01.md")).unwrap_err(),
            "world/nas01.md is in the operator's folder world/, read-only for agents; \
             the ops agent writes only under memory/ops/"
        );
        assert_eq!(
            ops.check_write(&p("memory/dev/x.md")).unwrap_err(),
            "memory/dev/x.md is in the dev agent's memory; the ops agent writes only under memory/ops/"
        );
        assert_eq!(
            ops.check_write(&p("memory/index.md")).unwrap_err(),
            "memory/index.md is in the operator's folder memory/, read-only for agents; \
             the ops agent writes only under memory/ops/"
        );
        assert_eq!(
            ops.check_write(&p("index.md")).unwrap_err(),
            "index.md is in the operator's vault root, read-only for agents; \
             the ops agent writes only under memory/ops/"
        );
    }
}
