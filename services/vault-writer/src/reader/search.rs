//! What the reader knows of the vault: a catalog of every note it may
//! serve (its stamp and what it is, for the structural part of recall)
//! and, per agent, a full-text index (tantivy) of the notes that agent
//! may read.
//!
//! One index per agent, not one filtered at query time: a note an agent
//! may not read is not in its index at all, so no query, however it is
//! written, can reach it, and no other agent's notes weigh in its
//! scores. The shared folders are indexed once per agent granted them,
//! which costs little beside a vault's memory folders.
//!
//! The indexes live in memory and are built at start: the vault is the
//! authority and is read again whole in the time a start takes anyway.
//! They are kept current by [`Library::refresh`], which walks the folders
//! and compares each file's stamp (modification time, size, inode) with
//! the one it indexed: every `refresh` of the configuration, and before
//! answering each query, so a note written a moment ago is found.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

use tantivy::collector::TopDocs;
use tantivy::indexer::IndexWriterOptions;
use tantivy::query::{
    BooleanQuery, ConstScoreQuery, Occur, Query, QueryParser, TermQuery, TermSetQuery,
};
use tantivy::schema::{
    Field, IndexRecordOption, STORED, STRING, Schema, TextFieldIndexing, TextOptions, Value as _,
};
use tantivy::snippet::SnippetGenerator;
use tantivy::{Index, IndexReader, IndexWriter, ReloadPolicy, Searcher, TantivyDocument, Term};

use nisse_bus::AgentName;
use nisse_proto::v1::NoteKind;
use nisse_vault::{Access, VaultPath};

use super::notes::{self, Meta, Note, Stamp};

/// The longest excerpt of a search hit, in characters.
const EXCERPT_CHARS: usize = 300;

/// The tokenizer of the text fields: words, lowercased, English stems
/// ("disks" finds "disk"), as tantivy ships it.
const TOKENIZER: &str = "en_stem";

/// The reader's view of the vault.
pub(super) struct Library {
    root: PathBuf,
    fields: Fields,
    /// Every folder some agent served may read, walked at each refresh.
    folders: Vec<String>,
    shelves: BTreeMap<AgentName, Shelf>,
    state: Mutex<State>,
}

/// One agent's part: what it may read, and its index.
struct Shelf {
    access: Access,
    reader: IndexReader,
    parser: QueryParser,
}

/// What changes as notes change: one refresh at a time.
struct State {
    notes: BTreeMap<String, Indexed>,
    writers: BTreeMap<AgentName, IndexWriter>,
    /// When the last walk began: a query asked before it is answered
    /// from what that walk saw.
    walked: Option<Instant>,
    /// What the last walk could not read, logged when it first appears.
    problems: BTreeSet<String>,
}

/// A note in the catalog.
#[derive(Debug, Clone)]
pub(super) struct Indexed {
    stamp: Stamp,
    pub meta: Meta,
}

/// The index's fields.
#[derive(Debug, Clone, Copy)]
struct Fields {
    path: Field,
    title: Field,
    body: Field,
    kind: Field,
    fingerprint: Field,
    hosts: Field,
    tags: Field,
}

impl Fields {
    /// The schema, and its fields. Only the path is stored: a hit is read
    /// again from the file, so what is answered is what is on disk.
    fn schema() -> (Schema, Self) {
        let mut b = Schema::builder();
        let text = TextOptions::default().set_indexing_options(
            TextFieldIndexing::default()
                .set_tokenizer(TOKENIZER)
                .set_index_option(IndexRecordOption::WithFreqsAndPositions),
        );
        let fields = Self {
            path: b.add_text_field("path", STRING | STORED),
            title: b.add_text_field("title", text.clone()),
            body: b.add_text_field("body", text.clone()),
            kind: b.add_text_field("kind", STRING),
            fingerprint: b.add_text_field("fingerprint", STRING),
            hosts: b.add_text_field("hosts", STRING),
            tags: b.add_text_field("tags", text),
        };
        (b.build(), fields)
    }

    /// Every field name, for telling a field in a query (`title:disk`)
    /// from a word with a colon (`nas01:/var`).
    const NAMES: [&'static str; 7] = [
        "path",
        "title",
        "body",
        "kind",
        "fingerprint",
        "hosts",
        "tags",
    ];

    fn document(&self, note: &Note) -> TantivyDocument {
        let mut doc = TantivyDocument::default();
        doc.add_text(self.path, &note.path);
        doc.add_text(self.title, &note.meta.title);
        doc.add_text(self.body, notes::indexed(&note.body));
        doc.add_text(self.kind, kind_name(note.meta.kind));
        if !note.meta.fingerprint.is_empty() {
            doc.add_text(self.fingerprint, &note.meta.fingerprint);
        }
        for host in &note.meta.hosts {
            doc.add_text(self.hosts, host);
        }
        for tag in &note.meta.tags {
            doc.add_text(self.tags, tag);
        }
        doc
    }
}

/// What the index calls a kind of note (`kind:incident` in a query).
fn kind_name(kind: NoteKind) -> &'static str {
    match kind {
        NoteKind::Unspecified => "unspecified",
        NoteKind::Note => "note",
        NoteKind::Procedure => "procedure",
        NoteKind::Incident => "incident",
        NoteKind::Memory => "memory",
        NoteKind::World => "world",
    }
}

/// Why the library could not be built or kept current.
#[derive(Debug, thiserror::Error)]
pub(super) enum IndexError {
    /// tantivy refused: in memory, only a bug or exhausted memory does.
    #[error("the full-text index failed: {0}")]
    Index(#[from] tantivy::TantivyError),
}

impl Library {
    /// The library of `root` for `agents` (each with the shared folders it
    /// is granted), built from what is on disk now.
    pub(super) fn open(
        root: PathBuf,
        agents: Vec<(AgentName, Vec<String>)>,
    ) -> Result<Self, IndexError> {
        let mut folders = BTreeSet::new();
        let mut shelves = BTreeMap::new();
        let mut writers = BTreeMap::new();
        let (schema, fields) = Fields::schema();
        for (agent, grants) in agents {
            let access = Access::new(agent.as_str(), &grants);
            folders.insert(nisse_vault::memory_folder(agent.as_str()));
            // The grants `Access` keeps: never a path, `memory` or hidden.
            folders.extend(access.grants().iter().cloned());
            let index = Index::create_in_ram(schema.clone());
            // One worker and one merger: the vault is small, answers are
            // read between writes, and the machine is shared.
            let writer = index.writer_with_options(
                IndexWriterOptions::builder()
                    .num_worker_threads(1)
                    .num_merge_threads(1)
                    .build(),
            )?;
            let reader = index
                .reader_builder()
                .reload_policy(ReloadPolicy::Manual)
                .try_into()?;
            let mut parser =
                QueryParser::for_index(&index, vec![fields.title, fields.body, fields.tags]);
            parser.set_field_boost(fields.title, 2.0);
            writers.insert(agent.clone(), writer);
            shelves.insert(
                agent.clone(),
                Shelf {
                    access,
                    reader,
                    parser,
                },
            );
        }
        let library = Self {
            root,
            fields,
            folders: folders.into_iter().collect(),
            shelves,
            state: Mutex::new(State {
                notes: BTreeMap::new(),
                writers,
                walked: None,
                problems: BTreeSet::new(),
            }),
        };
        library.refresh(Instant::now())?;
        Ok(library)
    }

    /// The vault's folder.
    pub(super) fn root(&self) -> &Path {
        &self.root
    }

    /// What `agent` may read, if it is served.
    pub(super) fn access(&self, agent: &AgentName) -> Option<&Access> {
        self.shelves.get(agent).map(|s| &s.access)
    }

    /// How many notes the catalog holds.
    pub(super) fn len(&self) -> usize {
        self.lock().notes.len()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while refreshing (a bug) leaves what was done so far;
        // answering from that beats answering nothing.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Brings the catalog and the indexes up to date with the disk, unless
    /// a walk began at or after `asked` (it saw every change a query asked
    /// at `asked` must see). Returns how many notes changed.
    pub(super) fn refresh(&self, asked: Instant) -> Result<usize, IndexError> {
        let mut state = self.lock();
        if state.walked.is_some_and(|w| w >= asked) {
            return Ok(0);
        }
        let began = Instant::now();
        let (found, problems) = notes::walk(&self.root, &self.folders);
        let problems: BTreeSet<String> = problems.into_iter().collect();
        for problem in problems.difference(&state.problems) {
            tracing::warn!(vault = %self.root.display(), "{problem}");
        }
        state.problems = problems;

        let gone: Vec<String> = state
            .notes
            .keys()
            .filter(|p| !found.contains_key(*p))
            .cloned()
            .collect();
        let changed: Vec<(String, Stamp)> = found
            .into_iter()
            .filter(|(path, stamp)| state.notes.get(path).is_none_or(|n| n.stamp != *stamp))
            .collect();
        // Whether an agent may read a note depends on its path alone: an
        // index that may not read it never had it.
        let mut touched = BTreeSet::new();
        let fields = self.fields;
        let State { notes, writers, .. } = &mut *state;
        for path in &gone {
            notes.remove(path);
            for (agent, writer) in writers.iter_mut() {
                if self.shelves[agent].may_read(path) {
                    writer.delete_term(Term::from_field_text(fields.path, path));
                    touched.insert(agent.clone());
                }
            }
        }
        for (path, stamp) in &changed {
            let note = match notes::read(&self.root, path) {
                Ok(note) => Some(note),
                // Gone since the walk: the next walk drops it.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
                Err(e) => {
                    tracing::warn!(vault = %self.root.display(), note = %path, "the note cannot be read, so it is not searched: {e}");
                    None
                }
            };
            if let Some(problem) = note.as_ref().and_then(|n| n.meta.problem.as_ref()) {
                tracing::warn!(vault = %self.root.display(), note = %path, "the note's frontmatter cannot be read, so it is searched as text only: {problem}");
            }
            for (agent, writer) in writers.iter_mut() {
                if !self.shelves[agent].may_read(path) {
                    continue;
                }
                writer.delete_term(Term::from_field_text(fields.path, path));
                touched.insert(agent.clone());
                if let Some(note) = &note {
                    writer.add_document(fields.document(note))?;
                }
            }
            match note {
                Some(note) => {
                    notes.insert(
                        path.clone(),
                        Indexed {
                            stamp: *stamp,
                            meta: note.meta,
                        },
                    );
                }
                None => {
                    notes.remove(path);
                }
            }
        }
        for agent in &touched {
            if let Some(writer) = writers.get_mut(agent) {
                writer.commit()?;
                self.shelves[agent].reader.reload()?;
            }
        }
        state.walked = Some(began);
        Ok(gone.len() + changed.len())
    }

    /// The catalog's notes `agent` may read that `wanted` picks, in path
    /// order.
    pub(super) fn select(
        &self,
        agent: &AgentName,
        wanted: impl Fn(&str, &Meta) -> bool,
    ) -> Vec<(String, Meta)> {
        let Some(shelf) = self.shelves.get(agent) else {
            return Vec::new();
        };
        self.lock()
            .notes
            .iter()
            .filter(|(path, n)| shelf.may_read(path) && wanted(path, &n.meta))
            .map(|(path, n)| (path.clone(), n.meta.clone()))
            .collect()
    }

    /// `text` as a query of `agent`'s index, or why it is none.
    pub(super) fn prepare(&self, agent: &AgentName, text: &str) -> Result<Prepared, String> {
        let shelf = self
            .shelves
            .get(agent)
            .ok_or_else(|| format!("the {agent} agent is not served by this vault reader"))?;
        if text.trim().is_empty() {
            return Err("the search has no text: say what to look for".into());
        }
        let (query, errors) = shelf.parser.parse_query_lenient(&lenient(text));
        if !errors.is_empty() {
            tracing::debug!(%agent, text, ?errors, "parts of the search text were read as plain words or left out");
        }
        let mut terms = 0;
        query.query_terms(&mut |_, _| terms += 1);
        if terms == 0 {
            return Err(format!(
                "the search `{text}` has no words to look for, only punctuation or query syntax"
            ));
        }
        let fields = self.fields;
        let searcher = shelf.reader.searcher();
        let mut snippets = SnippetGenerator::create(&searcher, &*query, fields.body)
            .map_err(|e| format!("the full-text index failed: {e}"))?;
        snippets.set_max_num_chars(EXCERPT_CHARS);
        Ok(Prepared {
            query,
            searcher,
            snippets,
            fields,
        })
    }
}

impl Shelf {
    fn may_read(&self, path: &str) -> bool {
        VaultPath::parse(path).is_ok_and(|p| self.access.may_read(&p))
    }
}

/// A query of one agent's index, ready to run.
pub(super) struct Prepared {
    query: Box<dyn Query>,
    searcher: Searcher,
    snippets: SnippetGenerator,
    fields: Fields,
}

/// Which incident notes a search is narrowed to.
#[derive(Debug, Clone)]
pub(super) enum About<'q> {
    /// Every note.
    Anything,
    /// Incident notes about this fingerprint.
    Fingerprint(&'q str),
    /// Incident notes about any of these hosts (lowercased).
    Hosts(&'q [String]),
}

/// One note a search found.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Hit {
    pub path: String,
    pub score: f32,
}

impl Prepared {
    /// The best `limit` notes that match, narrowed to `about`, best first
    /// (equal scores by path).
    pub(super) fn top(&self, about: &About<'_>, limit: usize) -> Result<Vec<Hit>, String> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let f = self.fields;
        let filter: Option<Box<dyn Query>> = match about {
            About::Anything => None,
            About::Fingerprint(fp) => Some(Box::new(TermQuery::new(
                Term::from_field_text(f.fingerprint, fp),
                IndexRecordOption::Basic,
            ))),
            About::Hosts([]) => return Ok(Vec::new()),
            About::Hosts(hosts) => Some(Box::new(TermSetQuery::new(
                hosts.iter().map(|h| Term::from_field_text(f.hosts, h)),
            ))),
        };
        let query: Box<dyn Query> = match filter {
            None => self.query.box_clone(),
            Some(filter) => {
                let incident: Box<dyn Query> = Box::new(TermQuery::new(
                    Term::from_field_text(f.kind, kind_name(NoteKind::Incident)),
                    IndexRecordOption::Basic,
                ));
                // Filters count for nothing in the score: the text's
                // relevance orders the notes within a group.
                Box::new(BooleanQuery::new(vec![
                    (Occur::Must, self.query.box_clone()),
                    (Occur::Must, Box::new(ConstScoreQuery::new(filter, 0.0))),
                    (Occur::Must, Box::new(ConstScoreQuery::new(incident, 0.0))),
                ]))
            }
        };
        let found = self
            .searcher
            .search(&*query, &TopDocs::with_limit(limit).order_by_score())
            .map_err(|e| format!("the full-text index failed: {e}"))?;
        let mut hits = Vec::with_capacity(found.len());
        for (score, address) in found {
            let doc: TantivyDocument = self
                .searcher
                .doc(address)
                .map_err(|e| format!("the full-text index failed: {e}"))?;
            if let Some(path) = doc.get_first(f.path).and_then(|v| v.as_str()) {
                hits.push(Hit {
                    path: path.to_string(),
                    score,
                });
            }
        }
        hits.sort_by(|a, b| {
            b.score
                .total_cmp(&a.score)
                .then_with(|| a.path.cmp(&b.path))
        });
        Ok(hits)
    }

    /// The part of `body` that matches best; its first lines when the
    /// match is in the title or tags only.
    pub(super) fn excerpt(&self, body: &str) -> String {
        let snippet = self.snippets.snippet(body);
        let fragment = snippet.fragment().trim();
        if fragment.is_empty() {
            let head: String = body.trim().chars().take(EXCERPT_CHARS).collect();
            head.trim_end().to_string()
        } else {
            fragment.to_string()
        }
    }
}

/// The model's text with every `word:` that is not a field of the index
/// read as a plain word: `nas01:/var` is two words to look for, not a
/// field `nas01` that does not exist (which the parser would drop).
fn lenient(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for (i, word) in text.split_whitespace().enumerate() {
        if i > 0 {
            out.push(' ');
        }
        match word.split_once(':') {
            Some((field, _))
                if Fields::NAMES.contains(&field.trim_start_matches(['+', '-', '(', '"'])) =>
            {
                out.push_str(word);
            }
            Some(_) => out.push_str(&word.replace(':', " ")),
            None => out.push_str(word),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::lenient;

    #[test]
    fn a_colon_is_a_field_only_for_the_indexs_fields() {
        assert_eq!(lenient("nas01:/var full"), "nas01 /var full");
        assert_eq!(
            lenient("title:disk +hosts:nas01"),
            "title:disk +hosts:nas01"
        );
        assert_eq!(lenient("at 12:30"), "at 12 30");
    }
}
