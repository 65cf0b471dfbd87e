//! The knowledge vault's rules (L10, L6 agent memory, Oikos REQ-ORI-1..2):
//! which paths are notes and whose folder each is in, the note format
//! Obsidian reads (YAML frontmatter, `[[links]]`, tags), the vault-wide link
//! check, and the world model with its blast radius.
//!
//! It is pure: files in, values out. It is deliberately not the vault
//! writer or reader (no bus, no service, no atomic writes: those are
//! `nisse-vault-writer`'s), and it does not know the wire types; the world
//! model's kinds print to and parse from their names so the conversion to
//! `nisse-proto` lives in one place outside.

//!
//! The modules are public so callers may name `note::parse` or
//! `path::VaultPath` as the brief for each part does; the common items are
//! re-exported here as well.

mod error;
pub mod links;
pub mod note;
pub mod path;
pub mod world;

pub use error::{NoteError, PathError, PathProblem};
pub use links::{Problem, check_vault};
pub use note::{
    Frontmatter, Item, Link, Note, PROVENANCE_KEYS, Provenance, check_tag, links, parse, render,
    sha256_hex, tags,
};
pub use path::{Access, MEMORY, Owner, VaultPath, WORLD, check_grant, memory_folder};
pub use world::{Affected, Blast, Entity, EntityKind, Hop, RelationKind, World};
