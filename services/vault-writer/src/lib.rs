//! The knowledge vault (seed Nisse L6, L10; Oikos REQ-ORI-1..4): two
//! services of one crate over one folder of Obsidian-format Markdown.
//!
//! - [`writer`] answers the brain's `out.vault.write` with
//!   `in.vault.written`: a note into the agent's own memory folder, written
//!   atomically and once per request id, with its provenance in the
//!   frontmatter, committed to git when the vault is a repository.
//! - [`reader`] answers `out.vault.query` with `in.vault.found` (full-text
//!   search, one note, what a work item starts with) from the folders the
//!   agent may read, and sends the agent the world model (`in.world`)
//!   whenever it changes.
//!
//! Each runs as its own NATS identity: the writer may only answer writes,
//! the reader only queries and the world model.

mod config;
pub mod reader;
pub mod writer;

pub use config::Config;
