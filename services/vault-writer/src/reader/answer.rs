//! The answers to the brain's queries: a search, one note, and what a
//! work item starts with. Each is computed from the library (kept
//! current before it is asked) and the files as read now.

use std::cmp::Reverse;
use std::collections::BTreeSet;
use std::time::Instant;

use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use nisse_bus::AgentName;
use nisse_proto::v1::vault_query::Query;
use nisse_proto::v1::{FoundNote, KnowledgeSearch, NoteKind, Recall, VaultQuery};
use nisse_vault::VaultPath;

use super::notes::{self, Meta, Note};
use super::search::{About, Library, Prepared};

/// Notes a search answers when it does not say.
const SEARCH_LIMIT: usize = 10;
/// The most notes a search answers.
const SEARCH_MAX: usize = 50;
/// Incident notes (and text matches) a recall answers when it does not
/// say.
const RECALL_LIMIT: usize = 5;
/// The most incident notes (and text matches) a recall answers.
const RECALL_MAX: usize = 50;

/// What the reader answers, before it becomes a `VaultFound`.
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct Answer {
    pub notes: Vec<FoundNote>,
    pub missing: Vec<String>,
    pub error: String,
}

impl Answer {
    fn error(why: impl Into<String>) -> Self {
        Self {
            error: why.into(),
            ..Self::default()
        }
    }
}

/// The answer to `query` from `agent`'s stream, from what is on disk once
/// every change since `asked` is in the library.
pub(super) fn answer(
    library: &Library,
    agent: &AgentName,
    query: &VaultQuery,
    asked: Instant,
) -> Answer {
    if let Err(e) = library.refresh(asked) {
        // The index as it was still answers; the next refresh tries again.
        tracing::warn!(%agent, "the vault's changes could not be indexed, so the answer may miss them: {e}");
    }
    match &query.query {
        None => Answer::error("the query asks for nothing: it needs a search, a read or a recall"),
        Some(Query::Search(search)) => answer_search(library, agent, search),
        Some(Query::Read(read)) => answer_read(library, agent, &read.path),
        Some(Query::Recall(recall)) => answer_recall(library, agent, recall),
    }
}

/// `limit` as asked, `default` when not said, at most `max`.
fn limit(asked: u32, default: usize, max: usize) -> usize {
    match usize::try_from(asked) {
        Ok(0) => default,
        Ok(n) => n.min(max),
        Err(_) => max,
    }
}

/// The hosts of a query as the index has them: lowercased, each once, in
/// the order given.
fn hosts(asked: &[String]) -> Vec<String> {
    let mut seen = BTreeSet::new();
    asked
        .iter()
        .map(|h| h.trim().to_lowercase())
        .filter(|h| !h.is_empty() && seen.insert(h.clone()))
        .collect()
}

/// "same host nas01", "same hosts nas01, nas02": the query's hosts the
/// note is about, in the query's order.
fn same_hosts(meta: &Meta, hosts: &[String]) -> Option<String> {
    let shared: Vec<&str> = hosts
        .iter()
        .filter(|h| meta.hosts.contains(h))
        .map(String::as_str)
        .collect();
    match shared.as_slice() {
        [] => None,
        [one] => Some(format!("same host {one}")),
        many => Some(format!("same hosts {}", many.join(", "))),
    }
}

/// A found note from `note` as read.
fn found(note: &Note, why: String, score: f32, content: String, excerpt: bool) -> FoundNote {
    FoundNote {
        path: note.path.clone(),
        sha256: note.sha256.clone(),
        title: note.meta.title.clone(),
        kind: note.meta.kind as i32,
        trusted: note.meta.trusted,
        content,
        excerpt,
        why,
        score,
    }
}

/// Reads `path` for `agent` again, as it is now, if the agent may still
/// read it; a note gone since it was indexed is left out.
fn reread(library: &Library, agent: &AgentName, path: &str) -> Option<Note> {
    let access = library.access(agent)?;
    let vault_path = VaultPath::parse(path).ok()?;
    if !access.may_read(&vault_path) {
        return None;
    }
    match notes::read(library.root(), path) {
        Ok(note) => Some(note),
        Err(e) => {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(%agent, note = %path, "a note found cannot be read, so it is left out: {e}");
            }
            None
        }
    }
}

/// A search: the notes matching the text, incident notes about the same
/// fingerprint first, then about the same hosts, then the rest by score.
fn answer_search(library: &Library, agent: &AgentName, search: &KnowledgeSearch) -> Answer {
    let limit = limit(search.limit, SEARCH_LIMIT, SEARCH_MAX);
    let prepared = match library.prepare(agent, &search.text) {
        Ok(prepared) => prepared,
        Err(why) => return Answer::error(why),
    };
    let hosts = hosts(&search.hosts);
    let fingerprint = search.fingerprint.trim();
    let mut groups = Vec::new();
    if !fingerprint.is_empty() {
        groups.push(About::Fingerprint(fingerprint));
    }
    if !hosts.is_empty() {
        groups.push(About::Hosts(&hosts));
    }
    groups.push(About::Anything);

    let mut taken = BTreeSet::new();
    let mut notes = Vec::new();
    for about in &groups {
        if notes.len() >= limit {
            break;
        }
        let hits = match prepared.top(about, limit + taken.len()) {
            Ok(hits) => hits,
            Err(why) => return Answer::error(why),
        };
        for hit in hits {
            if notes.len() >= limit {
                break;
            }
            if taken.contains(&hit.path) {
                continue;
            }
            let Some(note) = reread(library, agent, &hit.path) else {
                continue;
            };
            let why = match about {
                About::Fingerprint(_) => "same fingerprint".to_string(),
                About::Hosts(hosts) => {
                    same_hosts(&note.meta, hosts).unwrap_or_else(|| "text match".into())
                }
                About::Anything => "text match".to_string(),
            };
            let excerpt = prepared.excerpt(&note.body);
            notes.push(found(&note, why, hit.score, excerpt, true));
            taken.insert(hit.path);
        }
    }
    Answer {
        notes,
        ..Answer::default()
    }
}

/// One note, whole.
fn answer_read(library: &Library, agent: &AgentName, path: &str) -> Answer {
    let Some(access) = library.access(agent) else {
        return Answer::error(format!(
            "the {agent} agent is not served by this vault reader"
        ));
    };
    let path = path.trim();
    let vault_path = match VaultPath::parse(path) {
        Ok(p) => p,
        Err(e) => return Answer::error(e.to_string()),
    };
    if let Some(why) = notes::refusal(access, &vault_path) {
        return Answer::error(why);
    }
    match notes::read(library.root(), path) {
        Ok(note) => {
            let content = notes::capped(&note.text);
            Answer {
                notes: vec![found(&note, "read by path".into(), 0.0, content, false)],
                ..Answer::default()
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Answer::error(format!("{path} is not in the vault"))
        }
        Err(e) => Answer::error(format!("{path} cannot be read: {e}")),
    }
}

/// One note a recall picked, and why.
struct Pick {
    path: String,
    why: Vec<String>,
    /// Named by the item: a note that cannot be read is missing.
    named: bool,
    score: f32,
}

/// The picks of a recall, in order, each note once (its reasons merged).
#[derive(Default)]
struct Picks(Vec<Pick>);

impl Picks {
    fn add(&mut self, path: &str, why: String, named: bool, score: f32) {
        if let Some(pick) = self.0.iter_mut().find(|p| p.path == path) {
            if !pick.why.contains(&why) {
                pick.why.push(why);
            }
            pick.named |= named;
        } else {
            self.0.push(Pick {
                path: path.to_string(),
                why: vec![why],
                named,
                score,
            });
        }
    }

    fn has(&self, path: &str) -> bool {
        self.0.iter().any(|p| p.path == path)
    }
}

/// `alert:DiskFull` as (`alert`, `DiskFull`), whatever the spacing and
/// the case of the kind.
fn binding(entry: &str) -> Option<(String, &str)> {
    let (kind, name) = entry.split_once(':')?;
    Some((kind.trim().to_lowercase(), name.trim()))
}

/// When a note was written, for newest first (`None` sorts last).
fn written(meta: &Meta) -> Option<OffsetDateTime> {
    OffsetDateTime::parse(&meta.written, &Rfc3339).ok()
}

/// What a work item starts with, structural first (seed L10): the
/// procedures bound to its alerts, duties and policy entries and those it
/// names, its earlier incidents, the agent's memory index, then text
/// matches.
fn answer_recall(library: &Library, agent: &AgentName, recall: &Recall) -> Answer {
    let Some(access) = library.access(agent) else {
        return Answer::error(format!(
            "the {agent} agent is not served by this vault reader"
        ));
    };
    let limit = limit(recall.limit, RECALL_LIMIT, RECALL_MAX);
    let mut picks = Picks::default();
    let mut missing = Vec::new();

    // Procedures bound by their frontmatter, in the order the item gives
    // its alerts, duties and policy entries.
    let wanted: Vec<(&str, &str, &str)> = recall
        .alerts
        .iter()
        .map(|a| ("alert", "alert", a.as_str()))
        .chain(recall.duties.iter().map(|d| ("duty", "duty", d.as_str())))
        .chain(
            recall
                .policy
                .iter()
                .map(|p| ("policy", "policy entry", p.as_str())),
        )
        .map(|(kind, said, name)| (kind, said, name.trim()))
        .filter(|(_, _, name)| !name.is_empty())
        .collect();
    if !wanted.is_empty() {
        let procedures = library.select(agent, |_, meta| meta.kind == NoteKind::Procedure);
        for (kind, said, name) in &wanted {
            for (path, meta) in &procedures {
                let bound = meta
                    .runbook_for
                    .iter()
                    .filter_map(|e| binding(e))
                    .any(|(k, n)| k == *kind && n == *name);
                if bound {
                    picks.add(path, format!("bound to {said} {name}"), false, 0.0);
                }
            }
        }
    }

    // Procedures the item names by path: each must be there.
    for named in &recall.procedures {
        let path = named.trim();
        if path.is_empty() {
            continue;
        }
        match VaultPath::parse(path) {
            Err(e) => missing.push(format!("{path} (named by the item) cannot be read: {e}")),
            Ok(p) => match notes::refusal(access, &p) {
                Some(why) => {
                    missing.push(format!("{path} (named by the item) cannot be read: {why}"))
                }
                None => picks.add(path, "named by the item".into(), true, 0.0),
            },
        }
    }

    // Earlier incidents: the same fingerprint, then the same hosts,
    // newest first, `limit` in all.
    let fingerprint = recall.fingerprint.trim();
    let hosts = hosts(&recall.hosts);
    if !fingerprint.is_empty() || !hosts.is_empty() {
        let mut incidents = library.select(agent, |_, meta| meta.kind == NoteKind::Incident);
        incidents.sort_by(|(pa, a), (pb, b)| {
            Reverse(written(a))
                .cmp(&Reverse(written(b)))
                .then_with(|| pa.cmp(pb))
        });
        let mut taken = 0;
        if !fingerprint.is_empty() {
            for (path, meta) in &incidents {
                if taken < limit && meta.fingerprint == fingerprint && !picks.has(path) {
                    picks.add(path, "same fingerprint".into(), false, 0.0);
                    taken += 1;
                }
            }
        }
        for (path, meta) in &incidents {
            if taken >= limit {
                break;
            }
            if picks.has(path) {
                continue;
            }
            if let Some(why) = same_hosts(meta, &hosts) {
                picks.add(path, why, false, 0.0);
                taken += 1;
            }
        }
    }

    // The agent's memory index.
    let index = format!("{}/index.md", nisse_vault::memory_folder(agent.as_str()));
    if !picks.has(&index) && !library.select(agent, |path, _| path == index).is_empty() {
        picks.add(&index, "the agent's memory index".into(), false, 0.0);
    }

    // Text matches on the item's title, after everything structural.
    if !recall.text.trim().is_empty() {
        match library.prepare(agent, &recall.text) {
            Ok(prepared) => add_text_matches(&prepared, &mut picks, limit),
            Err(why) => tracing::debug!(%agent, "the recall's text is not searched: {why}"),
        }
    }

    let mut notes = Vec::with_capacity(picks.0.len());
    for pick in picks.0 {
        match read_pick(library, agent, &pick) {
            Ok(note) => {
                let content = notes::capped(&note.text);
                notes.push(found(
                    &note,
                    pick.why.join("; "),
                    pick.score,
                    content,
                    false,
                ));
            }
            Err(why) => {
                if pick.named {
                    missing.push(why);
                }
            }
        }
    }
    Answer {
        notes,
        missing,
        error: String::new(),
    }
}

/// Up to `limit` text matches not picked already.
fn add_text_matches(prepared: &Prepared, picks: &mut Picks, limit: usize) {
    let hits = match prepared.top(&About::Anything, limit + picks.0.len()) {
        Ok(hits) => hits,
        Err(why) => {
            tracing::warn!("the recall's text could not be searched: {why}");
            return;
        }
    };
    let mut added = 0;
    for hit in hits {
        if added >= limit {
            break;
        }
        if !picks.has(&hit.path) {
            picks.add(&hit.path, "text match".into(), false, hit.score);
            added += 1;
        }
    }
}

/// Reads a recall's pick, or says why it is missing.
fn read_pick(library: &Library, agent: &AgentName, pick: &Pick) -> Result<Note, String> {
    let named = if pick.named {
        " (named by the item)"
    } else {
        ""
    };
    // Every pick was checked as it was made; checked again here, the one
    // place every recalled note passes, so no change above can leak one.
    let readable = library
        .access(agent)
        .zip(VaultPath::parse(&pick.path).ok())
        .is_some_and(|(access, path)| access.may_read(&path));
    if !readable {
        tracing::error!(%agent, note = %pick.path, "a recall picked a note the agent may not read; it is left out");
        return Err(format!(
            "{}{named} is not readable by the {agent} agent",
            pick.path
        ));
    }
    match notes::read(library.root(), &pick.path) {
        Ok(note) => Ok(note),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Err(format!("{}{named} is not in the vault", pick.path))
        }
        Err(e) => {
            tracing::warn!(%agent, note = %pick.path, "a note recalled cannot be read: {e}");
            Err(format!("{}{named} cannot be read: {e}", pick.path))
        }
    }
}
