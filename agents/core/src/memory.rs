//! Agent memory (seed L6.4, L10): the agent's own notes in the vault,
//! outliving work items, written through the vault writer.
//!
//! - **One note per fact** under `memory/<agent>/facts/`, with its source
//!   and when it was observed: the model's `note` (an observation) and
//!   `remember` (a lesson for later items), and the operator's
//!   corrections (`remember: …` or `correction: …` in the chat), which are
//!   stored verbatim, byte for byte, with who said them: never
//!   paraphrased.
//! - **An index**, `memory/<agent>/index.md`, rewritten after every note
//!   from the store's list of notes, linking each.
//! - **A summary at close**, `memory/<agent>/incidents/…`: what happened,
//!   what was done and verified, the commands that mattered, what is left
//!   open, linked to the world entities it touched.
//!
//! Every note is a `VaultWrite` the brain emits: a request with a deadline
//! like any other, whose bytes the writer derives from the message alone,
//! so a replay of the stream writes the same notes. A failed write never
//! blocks work: one that goes unanswered is sent again (same request id,
//! so it is written once) up to [`RESENDS`] times, and a refusal or one
//! that keeps failing is reported once, in the item's thread or the room.

use std::collections::BTreeMap;

use rusqlite::{OptionalExtension as _, params};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use nisse_bus::proto::{self, VaultWrite, VaultWriteMode, VaultWritten};
use nisse_vault::memory_folder;

use crate::log::{Actor, Event, LoggedEvent};
use crate::markdown::md_escape;
use crate::requests::Overdue;
use crate::say::Say;
use crate::store::{Cached as _, StoreError, Txn, ns_to_time, time_to_ns};
use crate::work::{State, WorkItem};

/// How many times an unanswered note is sent again before it is reported.
pub const RESENDS: i64 = 3;

/// The memory index's file name in the agent's folder.
pub const INDEX: &str = "index.md";

/// What kind of note a memory note is (its frontmatter `kind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryKind {
    /// What the agent observed while working (`note`).
    Observation,
    /// What the agent wants to know next time (`remember`).
    Lesson,
    /// The operator's correction, verbatim.
    Correction,
    /// A work item's summary at close.
    Incident,
}

impl MemoryKind {
    /// The name in frontmatter and in the store.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Observation => "observation",
            Self::Lesson => "lesson",
            Self::Correction => "correction",
            Self::Incident => "incident",
        }
    }
}

/// A note of the agent's memory, as the store keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryNote {
    /// Its path in the vault.
    pub path: String,
    /// Its kind ([`MemoryKind::as_str`]).
    pub kind: String,
    /// Its title.
    pub title: String,
    /// When it was asked for (message time).
    pub observed: OffsetDateTime,
    /// `asked`, `written` or `failed`.
    pub state: String,
}

/// One fact to remember.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fact {
    /// What kind.
    pub kind: MemoryKind,
    /// The text, stored as it is.
    pub text: String,
    /// Where it came from ("the operator @alice:example.org in matrix",
    /// "the driver via remember: df -h on nas01").
    pub source: String,
    /// Said by an operator (a correction): the reader trusts it.
    pub operator: bool,
    /// Who said it, for a correction.
    pub said_by: Option<String>,
}

impl Txn<'_, '_> {
    /// Stores `fact` as one note in `agent`'s memory, and rewrites the
    /// index. `key` (a tool call id, a chat event id) names the note: the
    /// same key is the same note. Returns the note's path.
    pub fn remember(
        &mut self,
        agent: &str,
        work_item_id: &str,
        key: &str,
        fact: &Fact,
    ) -> Result<String, StoreError> {
        let request_id = format!("mem:{key}");
        if let Some(path) = self.note_of_request(&request_id)? {
            return Ok(path);
        }
        let observed = self.at();
        let day = observed.date();
        let path = format!(
            "{}/facts/{day}-{}-{}.md",
            memory_folder(agent),
            slug(&fact.text),
            &nisse_vault::note::sha256_hex(request_id.as_bytes())[..8]
        );
        let mut scalars = BTreeMap::from([
            ("kind".to_string(), fact.kind.as_str().to_string()),
            ("observed".to_string(), rfc3339(observed)),
            (
                "trust".to_string(),
                if fact.operator { "operator" } else { "agent" }.to_string(),
            ),
        ]);
        if let Some(by) = &fact.said_by {
            scalars.insert("said_by".into(), by.clone());
        }
        if let Some(item) = self.item(work_item_id)? {
            scalars.insert("item".into(), format!("#{}", item.number));
        }
        let tags = vec![
            "nisse/memory".to_string(),
            format!("nisse/{}", fact.kind.as_str()),
        ];
        self.vault_write(
            agent,
            work_item_id,
            &request_id,
            &path,
            fact.text.clone(),
            scalars,
            BTreeMap::new(),
            tags,
            &fact.source,
        )?;
        self.note_asked(
            &path,
            fact.kind.as_str(),
            &title_of(&fact.text),
            work_item_id,
            &request_id,
        )?;
        self.write_index(agent, work_item_id)?;
        Ok(path)
    }

    /// The summary note of `item`, which just closed: what happened, what
    /// was done and verified, the commands that mattered, what is left
    /// open, linked to the world entities of its hosts. Rendered by code
    /// from the item's log. Closing again after a reopening rewrites it.
    pub fn remember_item_closed(&mut self, agent: &str, item: &WorkItem) -> Result<(), StoreError> {
        let closes = self.count_transitions(&item.id, crate::work::Transition::Close)?;
        let request_id = format!("mem:incident:{}:{closes}", item.id);
        if self.note_of_request(&request_id)?.is_some() {
            return Ok(());
        }
        let events = self.events(&item.id)?;
        let hosts: Vec<String> = self.bound_hosts(&item.id)?.into_iter().collect();
        let world = self.world()?;
        let opened = events.first().map_or(self.at(), |e| e.at);
        let path = format!(
            "{}/incidents/{}-{}-{}.md",
            memory_folder(agent),
            opened.date(),
            item.number,
            slug(&item.title)
        );
        let entity_links: Vec<String> = hosts
            .iter()
            .filter_map(|h| world.as_ref()?.get(h))
            .map(|e| {
                format!(
                    "[[{}|{}]]",
                    e.path.trim_end_matches(".md"),
                    link_alias(&e.name)
                )
            })
            .collect();
        let body = incident_body(item, &events, &hosts, &entity_links, self.at());
        let mut scalars = BTreeMap::from([
            ("kind".to_string(), "incident".to_string()),
            ("item".to_string(), format!("#{}", item.number)),
            ("title".to_string(), item.title.clone()),
            ("opened".to_string(), rfc3339(opened)),
            ("closed".to_string(), rfc3339(self.at())),
            // It quotes alert text and command output: data, not words
            // to act on (L11).
            ("trust".to_string(), "untrusted".to_string()),
        ]);
        if let Some(fp) = &item.fingerprint {
            scalars.insert("fingerprint".into(), fp.clone());
        }
        let mut lists = BTreeMap::new();
        if !hosts.is_empty() {
            lists.insert("hosts".to_string(), hosts.clone());
        }
        if !entity_links.is_empty() {
            lists.insert("entities".to_string(), entity_links);
        }
        self.vault_write(
            agent,
            &item.id,
            &request_id,
            &path,
            body,
            scalars,
            lists,
            vec!["nisse/incident".to_string()],
            "the orchestrator, from the item's log at close",
        )?;
        self.note_asked(&path, "incident", &item.title, &item.id, &request_id)?;
        self.write_index(agent, &item.id)
    }

    /// The vault writer's answer to one of the agent's notes.
    pub fn vault_written(&mut self, agent: &str, written: &VaultWritten) -> Result<(), StoreError> {
        let Some((path, kind, work_item_id)) = self.note_row(&written.request_id)? else {
            return Ok(());
        };
        if written.written {
            self.tx().exec_cached(
                "UPDATE memory_notes SET state = 'written', sha256 = ?2, reason = NULL WHERE request_id = ?1",
                params![written.request_id, written.sha256],
            )?;
            return Ok(());
        }
        self.note_failed(
            agent,
            &path,
            &kind,
            &work_item_id,
            &written.request_id,
            &written.reason,
        )
    }

    /// A note went unanswered past its deadline: sent again, under the
    /// same request id, or after [`RESENDS`] tries reported.
    pub(crate) fn vault_write_expired(
        &mut self,
        agent: &str,
        overdue: &Overdue,
    ) -> Result<(), StoreError> {
        let Some((path, kind, work_item_id)) = self.note_row(&overdue.request_id)? else {
            return Ok(());
        };
        let resends: i64 = self.tx().row_cached(
            "SELECT resends FROM memory_notes WHERE request_id = ?1",
            [&overdue.request_id],
            |r| r.get(0),
        )?;
        if kind == "index" && self.index_superseded(&overdue.request_id)? {
            return Ok(());
        }
        if resends < RESENDS && self.resend_request(overdue.kind, &overdue.request_id)? {
            self.tx().exec_cached(
                "UPDATE memory_notes SET resends = resends + 1 WHERE request_id = ?1",
                [&overdue.request_id],
            )?;
            return Ok(());
        }
        let why = format!("{} after {} tries", overdue.describe(), resends + 1);
        self.note_failed(
            agent,
            &path,
            &kind,
            &work_item_id,
            &overdue.request_id,
            &why,
        )
    }

    /// Every note of the agent's memory the brain asked for (not the
    /// index), as the index lists them: oldest first.
    pub fn memory_notes(&self) -> Result<Vec<MemoryNote>, StoreError> {
        let mut stmt = self.tx().prepare_cached(
            "SELECT path, kind, title, observed_ns, state FROM memory_notes WHERE kind <> 'index' ORDER BY observed_ns, path",
        )?;
        let rows = stmt.query_map([], |r| {
            Ok(MemoryNote {
                path: r.get(0)?,
                kind: r.get(1)?,
                title: r.get(2)?,
                observed: ns_to_time(r.get(3)?),
                state: r.get(4)?,
            })
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    #[allow(clippy::too_many_arguments)]
    fn vault_write(
        &mut self,
        agent: &str,
        work_item_id: &str,
        request_id: &str,
        path: &str,
        markdown: String,
        frontmatter: BTreeMap<String, String>,
        lists: BTreeMap<String, Vec<String>>,
        tags: Vec<String>,
        source: &str,
    ) -> Result<(), StoreError> {
        let write = VaultWrite {
            envelope: Some(self.agent_envelope(agent, work_item_id, format!("vault:{request_id}"))),
            request_id: request_id.to_string(),
            path: path.to_string(),
            markdown,
            frontmatter: frontmatter.into_iter().collect(),
            mode: VaultWriteMode::Replace as i32,
            expected_sha256: String::new(),
            source: source.to_string(),
            tags,
            lists: lists
                .into_iter()
                .map(|(k, values)| (k, proto::Strings { values }))
                .collect(),
        };
        self.emit(&write)
    }

    /// Rewrites the index from the store's list of notes.
    fn write_index(&mut self, agent: &str, work_item_id: &str) -> Result<(), StoreError> {
        let notes = self.memory_notes()?;
        let request_id = format!("mem:index:{}", notes.len());
        let path = format!("{}/{INDEX}", memory_folder(agent));
        let mut body = format!(
            "# Memory of the {agent} agent\n\nWritten by the agent, one note per fact. To correct it, tell the agent (`remember: …` in its room); edits here are not read back.\n"
        );
        for (heading, kind) in [
            ("Operator corrections", "correction"),
            ("Lessons", "lesson"),
            ("Observations", "observation"),
            ("Work items", "incident"),
        ] {
            let of_kind: Vec<_> = notes.iter().filter(|n| n.kind == kind).collect();
            if of_kind.is_empty() {
                continue;
            }
            body.push_str(&format!("\n## {heading}\n\n"));
            for note in of_kind {
                body.push_str(&format!(
                    "- [[{}|{}]] ({})\n",
                    note.path.trim_end_matches(".md"),
                    link_alias(&note.title),
                    note.observed.date()
                ));
            }
        }
        let scalars = BTreeMap::from([("kind".to_string(), "index".to_string())]);
        self.vault_write(
            agent,
            work_item_id,
            &request_id,
            &path,
            body,
            scalars,
            BTreeMap::new(),
            vec!["nisse/memory".to_string()],
            "the orchestrator, from the agent's list of notes",
        )?;
        // One row for the index, following its latest request.
        self.tx().exec_cached(
            "INSERT INTO memory_notes (path, kind, title, work_item_id, observed_ns, request_id, state)
             VALUES (?1, 'index', 'index', ?2, ?3, ?4, 'asked')
             ON CONFLICT (path) DO UPDATE SET request_id = excluded.request_id, state = 'asked',
               observed_ns = excluded.observed_ns, work_item_id = excluded.work_item_id, resends = 0",
            params![path, work_item_id, time_to_ns(self.at()), request_id],
        )?;
        Ok(())
    }

    fn note_asked(
        &mut self,
        path: &str,
        kind: &str,
        title: &str,
        work_item_id: &str,
        request_id: &str,
    ) -> Result<(), StoreError> {
        self.tx().exec_cached(
            "INSERT INTO memory_notes (path, kind, title, work_item_id, observed_ns, request_id, state)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, 'asked')
             ON CONFLICT (path) DO UPDATE SET request_id = excluded.request_id, state = 'asked',
               title = excluded.title, observed_ns = excluded.observed_ns, resends = 0",
            params![path, kind, title, work_item_id, time_to_ns(self.at()), request_id],
        )?;
        Ok(())
    }

    fn note_of_request(&self, request_id: &str) -> Result<Option<String>, StoreError> {
        Ok(self
            .tx()
            .row_cached(
                "SELECT path FROM memory_notes WHERE request_id = ?1",
                [request_id],
                |r| r.get(0),
            )
            .optional()?)
    }

    fn note_row(&self, request_id: &str) -> Result<Option<(String, String, String)>, StoreError> {
        Ok(self
            .tx()
            .row_cached(
                "SELECT path, kind, work_item_id FROM memory_notes WHERE request_id = ?1",
                [request_id],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .optional()?)
    }

    /// Whether a newer index was asked for after `request_id`'s.
    fn index_superseded(&self, request_id: &str) -> Result<bool, StoreError> {
        Ok(self.note_of_request(request_id)?.is_none())
    }

    /// Records a note that could not be written and says so once, in the
    /// item's thread (or the room): work goes on.
    fn note_failed(
        &mut self,
        agent: &str,
        path: &str,
        kind: &str,
        work_item_id: &str,
        request_id: &str,
        reason: &str,
    ) -> Result<(), StoreError> {
        let changed = self.tx().exec_cached(
            "UPDATE memory_notes SET state = 'failed', reason = ?2 WHERE request_id = ?1 AND state <> 'failed'",
            params![request_id, reason],
        )?;
        if changed == 0 {
            return Ok(());
        }
        let text = format!(
            "⚠️ The {kind} note {} could not be written to the vault: {}. Work goes on without it.",
            crate::markdown::code_span(path).unwrap_or_else(|| md_escape(path)),
            md_escape(reason)
        );
        match self.item(work_item_id)? {
            Some(item) => {
                let event = self.append(
                    &item.id,
                    &Actor::agent(agent),
                    &Event::Fact {
                        text: format!("the {kind} note {path} could not be written: {reason}"),
                        data: serde_json::json!({ "memory_failed": path, "request_id": request_id }),
                    },
                )?;
                self.say(agent, &item, event, Say::fact(text))
            }
            None => self.tell_room(agent, format!("out:memory:{request_id}"), text),
        }
    }
}

/// A time as frontmatter writes it.
fn rfc3339(at: OffsetDateTime) -> String {
    at.format(&Rfc3339).unwrap_or_default()
}

/// A file-name part from the first words of `text`: lowercase ASCII
/// letters and digits joined by `-`, at most 40 bytes.
pub fn slug(text: &str) -> String {
    let mut out = String::new();
    for word in text
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| !w.is_empty())
    {
        let word = word.to_ascii_lowercase();
        if out.len() + word.len() + 1 > 40 {
            break;
        }
        if !out.is_empty() {
            out.push('-');
        }
        out.push_str(&word);
    }
    if out.is_empty() { "note".into() } else { out }
}

/// A note's title in the index: its first line, shortened.
fn title_of(text: &str) -> String {
    let first = text
        .lines()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .trim();
    crate::text::shortened(first, 80)
}

/// Text that can stand as a link's alias: no `|`, brackets or line breaks.
fn link_alias(text: &str) -> String {
    text.chars()
        .map(|c| {
            if matches!(c, '|' | '[' | ']' | '\n' | '\r' | '#' | '^') {
                ' '
            } else {
                c
            }
        })
        .collect::<String>()
        .trim()
        .to_string()
}

/// The summary note's body, from the item's log.
fn incident_body(
    item: &WorkItem,
    events: &[LoggedEvent],
    hosts: &[String],
    entity_links: &[String],
    closed: OffsetDateTime,
) -> String {
    let esc = |s: &str| md_escape(s);
    let mut out = format!("# #{}: {}\n\n", item.number, esc(&item.title));
    let opened = events.first().map_or(closed, |e| e.at);
    out.push_str(&format!(
        "Opened {} from {}; closed {}.\n\n",
        rfc3339(opened),
        esc(&item.source),
        rfc3339(closed)
    ));
    if let Some(fp) = &item.fingerprint {
        out.push_str(&format!("- Fingerprint: `{fp}`\n"));
    }
    if !hosts.is_empty() {
        let shown: Vec<String> = hosts.iter().map(|h| esc(h)).collect();
        out.push_str(&format!("- Hosts: {}\n", shown.join(", ")));
    }
    if !entity_links.is_empty() {
        out.push_str(&format!("- Entities: {}\n", entity_links.join(", ")));
    }
    let findings: Vec<&LoggedEvent> = events
        .iter()
        .filter(|e| matches!(e.event, Event::Finding { .. }))
        .collect();
    out.push_str("\n## What happened\n\n");
    match (findings.first(), findings.last()) {
        (Some(first), Some(last)) => {
            out.push_str(&format!(
                "- {} finding(s), the first {}, the last {}.\n",
                findings.len(),
                rfc3339(first.at),
                rfc3339(last.at)
            ));
            if let Event::Finding { summary, .. } = &last.event {
                out.push_str(&format!("- Last finding: {}\n", esc(summary)));
            }
        }
        _ => out.push_str("- No finding recorded.\n"),
    }
    let mut done = Vec::new();
    let mut commands = Vec::new();
    let mut finish: Option<serde_json::Value> = None;
    let mut closed_why = String::new();
    for e in events {
        match &e.event {
            Event::Approved { revision, by, .. } => {
                done.push(format!("rev-{revision} approved by {}", esc(by)));
            }
            Event::Denied {
                revision,
                by,
                reason,
                ..
            } => {
                done.push(format!(
                    "rev-{revision} denied by {}: {}",
                    esc(by),
                    esc(reason)
                ));
            }
            Event::PlanFinished { revision } => done.push(format!("rev-{revision} ran to the end")),
            Event::PlanHalted {
                revision,
                step,
                reason,
                ..
            } => {
                done.push(format!(
                    "rev-{revision} halted at step {step}: {}",
                    esc(reason)
                ));
            }
            Event::ExecRequested {
                request_id,
                host,
                command,
                ..
            } => {
                let result = events.iter().find_map(|r| match &r.event {
                    Event::StepResult {
                        request_id: id,
                        status,
                        exit_code,
                        ..
                    } if id == request_id => Some(format!("{status}, exit {exit_code}")),
                    _ => None,
                });
                commands.push(format!(
                    "- on {}: {} ({})",
                    esc(host),
                    crate::markdown::code_span(command).unwrap_or_else(|| esc(command)),
                    result.unwrap_or_else(|| "no result recorded".into())
                ));
            }
            Event::ToolCall {
                tool, arguments, ..
            } if tool == "finish" => {
                finish = serde_json::from_str(arguments).ok();
            }
            Event::StateChanged {
                to: State::Closed,
                reason,
                ..
            } => closed_why = reason.clone(),
            _ => {}
        }
    }
    let part = |key: &str| {
        finish
            .as_ref()
            .and_then(|f| f.get(key))
            .and_then(|v| v.as_str())
            .map(|s| esc(s.trim()))
            .filter(|s| !s.is_empty())
    };
    if let Some(why) = Some(closed_why).filter(|w| !w.is_empty()) {
        out.push_str(&format!("- Closed because: {}\n", esc(&why)));
    }
    out.push_str("\n## What was done\n\n");
    if let Some(d) = part("done") {
        out.push_str(&format!("{d}\n\n"));
    }
    if done.is_empty() {
        out.push_str("- No plan was decided.\n");
    } else {
        for d in &done {
            out.push_str(&format!("- {d}\n"));
        }
    }
    out.push_str("\n## Commands that mattered\n\n");
    if commands.is_empty() {
        out.push_str("- None ran.\n");
    } else {
        for c in &commands {
            out.push_str(&format!("{c}\n"));
        }
    }
    out.push_str(&format!(
        "\n## Verified\n\n{}\n\n## Left open\n\n{}\n",
        part("verified").unwrap_or_else(|| "—".into()),
        part("left_open").unwrap_or_else(|| "—".into())
    ));
    out
}
