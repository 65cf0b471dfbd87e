//! The crate's errors: a path that is no vault path, a note that cannot be
//! written or read. Each says what is wrong and where, since the operator
//! fixes notes by hand and the writer's refusals go back to a model.

use std::fmt;

/// A string that is not a valid vault path ([`crate::VaultPath`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("vault path {path:?} {problem}")]
pub struct PathError {
    /// The path as given.
    pub path: String,
    /// What is wrong with it.
    pub problem: PathProblem,
}

/// What is wrong with a vault path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathProblem {
    /// The empty string.
    Empty,
    /// Starts with `/`.
    Absolute,
    /// Contains `\`, which is a separator on the operator's Windows copy.
    Backslash,
    /// Contains a control character (NUL, newline, ...).
    Control(char),
    /// Has an empty component (`a//b.md`, a trailing `/`).
    EmptyComponent,
    /// Has a `.` or `..` component.
    Dots(String),
    /// Has a component starting with `.`: hidden folders hold Obsidian's
    /// settings and git's history, never notes.
    Hidden(String),
    /// Has a component longer than a file name may be.
    ComponentTooLong {
        /// The component.
        component: String,
        /// The limit in bytes.
        max: usize,
    },
    /// Longer than a vault path may be.
    TooLong {
        /// The limit in bytes.
        max: usize,
    },
    /// Has a character Obsidian refuses in a name or that breaks a link.
    Forbidden(char),
    /// Has a component starting or ending with whitespace.
    Spaces(String),
    /// Does not end in `.md`.
    NotMarkdown,
    /// Its file name is only `.md`.
    NoStem,
}

impl fmt::Display for PathProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PathProblem::Empty => f.write_str("is empty"),
            PathProblem::Absolute => {
                f.write_str("starts with '/'; vault paths are relative to the vault root")
            }
            PathProblem::Backslash => f.write_str("contains '\\'; the separator is '/'"),
            PathProblem::Control(c) => write!(f, "contains the control character {c:?}"),
            PathProblem::EmptyComponent => {
                f.write_str("has an empty component ('//' or a trailing '/')")
            }
            PathProblem::Dots(c) => write!(f, "has a {c:?} component; paths stay inside the vault"),
            PathProblem::Hidden(c) => write!(
                f,
                "has the hidden component {c:?}; hidden folders and files are not notes"
            ),
            PathProblem::ComponentTooLong { component, max } => write!(
                f,
                "has a component of {} bytes ({:?}...), more than {max}",
                component.len(),
                component.chars().take(20).collect::<String>()
            ),
            PathProblem::TooLong { max } => write!(f, "is longer than {max} bytes"),
            PathProblem::Forbidden(c) => write!(
                f,
                "contains {c:?}, which Obsidian refuses in a note's name or which breaks a [[link]] to it"
            ),
            PathProblem::Spaces(c) => write!(
                f,
                "has the component {c:?}, which starts or ends with whitespace"
            ),
            PathProblem::NotMarkdown => {
                f.write_str("does not end in '.md'; vault notes are Markdown")
            }
            PathProblem::NoStem => f.write_str("has a file name that is only '.md'"),
        }
    }
}

/// A note that cannot be rendered or parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NoteError {
    /// A frontmatter key the writer refuses.
    #[error("frontmatter key {key:?} {problem}")]
    Key {
        /// The key.
        key: String,
        /// Why it is refused.
        problem: String,
    },
    /// A tag Obsidian would not read as one tag.
    #[error("tag {tag:?} {problem}")]
    Tag {
        /// The tag.
        tag: String,
        /// Why it is refused.
        problem: String,
    },
    /// A value the writer refuses.
    #[error("frontmatter value of {key:?} {problem}")]
    Value {
        /// The key whose value it is.
        key: String,
        /// Why it is refused.
        problem: String,
    },
    /// The frontmatter opened on the first line is never closed.
    #[error("line 1: frontmatter opened by '---' is never closed by a '---' line")]
    Unclosed,
    /// The frontmatter is not valid YAML.
    #[error("line {line}: frontmatter is not valid YAML: {message}")]
    Yaml {
        /// The 1-based line in the file.
        line: usize,
        /// The YAML parser's message.
        message: String,
    },
    /// The frontmatter is YAML but not a mapping of keys to values.
    #[error("line {line}: frontmatter is {found}, not a mapping of keys to values")]
    NotMapping {
        /// The 1-based line in the file.
        line: usize,
        /// What it is instead.
        found: String,
    },
}

impl NoteError {
    /// The 1-based line in the file the error is about, where it has one.
    pub fn line(&self) -> Option<usize> {
        match self {
            NoteError::Unclosed => Some(1),
            NoteError::Yaml { line, .. } | NoteError::NotMapping { line, .. } => Some(*line),
            NoteError::Key { .. } | NoteError::Tag { .. } | NoteError::Value { .. } => None,
        }
    }
}
