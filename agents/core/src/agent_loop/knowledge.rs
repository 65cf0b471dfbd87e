//! The loop's reads of the knowledge vault (seed L6 "how memory is used",
//! L10 "retrieval is structural first"; Oikos REQ-ORI-3..4).
//!
//! - **Recall at the start**: when an item's loop first opens, a `Recall`
//!   query goes to the vault reader with what the item is about (its
//!   fingerprint, hosts, alert names, duties, procedures named by path,
//!   title); the first turn waits for the answer. Bound procedures, prior
//!   incidents about the same fingerprint or hosts and the memory index
//!   are pinned in every context of the item; a missing bound procedure is
//!   said, so the model does not guess one. A recall that goes unanswered
//!   is logged as a gap and the loop goes on without it.
//! - **`search_knowledge` and `read_note`**: a query each, answered as the
//!   call's result.
//!
//! Everything read is snapshotted into the item's log
//! (`knowledge_retrieved`) with its provenance (path, content hash, time)
//! the first time the item reads that revision of it. The answers are in
//! the stream, so a replay never reads the vault again. Notes that are not
//! the operator's words stay fenced as untrusted data in the context.

use std::collections::BTreeSet;

use nisse_bus::proto::{self, NoteKind, VaultFound, vault_query::Query};

use super::state::LoopSettings;
use crate::log::{Actor, Event, LoggedEvent, RetrievedNote};
use crate::render::{Pinned, quoted};
use crate::requests::Overdue;
use crate::store::{StoreError, Txn};
use crate::work::WorkItem;

/// How much of one recalled note the pinned context carries; the rest is
/// for `read_note`.
pub const PINNED_NOTE_BYTES: usize = 6 * 1024;

impl Txn<'_, '_> {
    /// Sends a query to the vault reader about `item`.
    pub(crate) fn vault_query(
        &mut self,
        agent: &str,
        item: &WorkItem,
        request_id: &str,
        query: Query,
    ) -> Result<(), StoreError> {
        let message = proto::VaultQuery {
            envelope: Some(self.agent_envelope(agent, &item.id, format!("vault:{request_id}"))),
            request_id: request_id.to_string(),
            query: Some(query),
        };
        self.emit(&message)
    }

    /// Asks the vault what `item` should start with; the loop's first turn
    /// waits for the answer. Returns the request id.
    pub(super) fn start_recall(
        &mut self,
        settings: LoopSettings<'_>,
        item: &WorkItem,
    ) -> Result<String, StoreError> {
        let events = self.events(&item.id)?;
        let mut recall = proto::Recall {
            fingerprint: item.fingerprint.clone().unwrap_or_default(),
            hosts: self.bound_hosts(&item.id)?.into_iter().collect(),
            text: item.title.clone(),
            limit: 5,
            ..Default::default()
        };
        let mut alerts = BTreeSet::new();
        let mut duties = BTreeSet::new();
        let mut procedures = BTreeSet::new();
        for e in &events {
            if let Event::Finding { duty, detail, .. } = &e.event {
                let label = |key: &str, field: &str| {
                    detail
                        .get(key)
                        .and_then(|m| m.get(field))
                        .and_then(|v| v.as_str())
                        .map(str::to_string)
                };
                // An alert's finding names its alert; a check's, its duty.
                match label("labels", "alertname") {
                    Some(name) => {
                        alerts.insert(name);
                    }
                    None if !duty.is_empty() => {
                        duties.insert(duty.clone());
                    }
                    None => {}
                }
                // A runbook named by its path in the vault, as an alert
                // rule's `runbook` annotation does (a URL is not a note).
                // Only a key to look up: the reader still decides what
                // the agent may read.
                if let Some(path) = label("annotations_untrusted", "runbook")
                    .filter(|p| p.ends_with(".md") && !p.contains("://"))
                {
                    procedures.insert(path);
                }
            }
        }
        recall.alerts = alerts.into_iter().collect();
        recall.duties = duties.into_iter().collect();
        recall.procedures = procedures.into_iter().collect();
        let request_id = format!("{}:recall", item.id);
        self.vault_query(
            settings.plans.agent,
            item,
            &request_id,
            Query::Recall(recall),
        )?;
        self.track(&request_id, &item.id, "", "recall")?;
        Ok(request_id)
    }

    /// A verdict named the policy rules an action of `item` matched:
    /// procedures bound to them (`runbook_for: ["policy:<rule>"]`) are
    /// recalled once per rule and item, and pinned from the next turn on
    /// (L10: read whenever a plan uses that entry). Nothing waits on it.
    pub fn recall_policy(
        &mut self,
        settings: LoopSettings<'_>,
        verdict: &proto::ClassifyVerdict,
    ) -> Result<(), StoreError> {
        if !settings.memory {
            return Ok(());
        }
        let item_id = verdict
            .envelope
            .as_ref()
            .map(|e| e.work_item_id.clone())
            .unwrap_or_default();
        let Some(item) = self.item(&item_id)? else {
            return Ok(());
        };
        if self.loop_state(&item.id)?.is_none() {
            return Ok(());
        }
        let mut rules = BTreeSet::new();
        for rule in &verdict.matched_rules {
            let request_id = format!("{}:recall:policy:{rule}", item.id);
            if self.tracked(&request_id)?.is_none() && rules.insert(rule.clone()) {
                self.track(&request_id, &item.id, "", "recall")?;
            }
        }
        if rules.is_empty() {
            return Ok(());
        }
        let request_id = format!(
            "{}:recall:policy:{}",
            item.id,
            rules.iter().cloned().collect::<Vec<_>>().join(",")
        );
        let recall = proto::Recall {
            policy: rules.into_iter().collect(),
            limit: 5,
            ..Default::default()
        };
        self.vault_query(
            settings.plans.agent,
            &item,
            &request_id,
            Query::Recall(recall),
        )?;
        self.track(&request_id, &item.id, "", "recall")
    }

    /// The vault reader's answer, when the loop asked: snapshotted into the
    /// item's log, then the recall is done or the tool call has its result.
    /// `false` when the loop did not ask.
    pub fn loop_vault_found(
        &mut self,
        settings: LoopSettings<'_>,
        found: &VaultFound,
    ) -> Result<bool, StoreError> {
        let Some((item_id, call_id, kind)) = self.tracked(&found.request_id)? else {
            return Ok(false);
        };
        let Some(item) = self.item(&item_id)? else {
            return Ok(true);
        };
        let Some(mut state) = self.loop_state(&item_id)? else {
            return Ok(true);
        };
        let query = if kind == "recall" {
            "recall".to_string()
        } else {
            self.call_query(&item_id, &call_id)?
        };
        // The item's first recall is on record even when it found nothing.
        let first = state.recall.as_deref() == Some(found.request_id.as_str());
        self.snapshot_knowledge(settings, &item, &found.request_id, &query, found, first)?;
        if kind == "recall" {
            if first {
                state.recall = None;
                if !found.error.is_empty() {
                    self.append(
                        &item.id,
                        &Actor::agent(settings.plans.agent),
                        &Event::Fact {
                            text: format!(
                                "the vault could not recall anything: {}; going on without",
                                found.error
                            ),
                            data: serde_json::json!({ "recall_failed": found.request_id }),
                        },
                    )?;
                }
                self.save_loop(&item.id, &state)?;
            }
            return Ok(true);
        }
        let (text, ok) = found_text(found);
        let untrusted = found.notes.iter().any(|n| !n.trusted);
        self.finish_call(
            settings,
            &item,
            &mut state,
            &call_id,
            &found.request_id,
            text,
            ok,
            untrusted,
        )?;
        self.save_loop(&item.id, &state)?;
        Ok(true)
    }

    /// A vault query went unanswered: a recall is a gap the log records
    /// (the loop goes on), a tool call gets a failed result.
    pub(crate) fn loop_vault_expired(
        &mut self,
        settings: LoopSettings<'_>,
        overdue: &Overdue,
    ) -> Result<(), StoreError> {
        let Some((item_id, call_id, kind)) = self.tracked(&overdue.request_id)? else {
            return Ok(());
        };
        let (Some(item), Some(mut state)) = (self.item(&item_id)?, self.loop_state(&item_id)?)
        else {
            return Ok(());
        };
        let why = overdue.describe();
        if kind == "recall" {
            if state.recall.as_deref() == Some(overdue.request_id.as_str()) {
                state.recall = None;
                self.append(
                    &item.id,
                    &Actor::agent(settings.plans.agent),
                    &Event::Fact {
                        text: format!("{why}: the item starts without what the vault would recall"),
                        data: serde_json::json!({ "recall_gap": overdue.request_id }),
                    },
                )?;
                self.save_loop(&item.id, &state)?;
            }
            return Ok(());
        }
        self.finish_call(
            settings,
            &item,
            &mut state,
            &call_id,
            &overdue.request_id,
            format!("{why}; nothing was read"),
            false,
            false,
        )?;
        self.save_loop(&item.id, &state)
    }

    /// What a tool call asked the vault, for the log.
    fn call_query(&self, item_id: &str, call_id: &str) -> Result<String, StoreError> {
        let events = self.events(item_id)?;
        Ok(events
            .iter()
            .find_map(|e| match &e.event {
                Event::ToolCall {
                    call_id: id,
                    tool,
                    arguments,
                    ..
                } if id == call_id => {
                    let args: serde_json::Value =
                        serde_json::from_str(arguments).unwrap_or_default();
                    let arg = |k: &str| args.get(k).and_then(|v| v.as_str()).unwrap_or_default();
                    Some(match tool.as_str() {
                        "read_note" => format!("read: {}", arg("path")),
                        _ => format!("search: {}", arg("query")),
                    })
                }
                _ => None,
            })
            .unwrap_or_default())
    }

    /// Records what `found` brought that the item had not read yet (by
    /// path and content hash), once.
    fn snapshot_knowledge(
        &mut self,
        settings: LoopSettings<'_>,
        item: &WorkItem,
        request_id: &str,
        query: &str,
        found: &VaultFound,
        even_empty: bool,
    ) -> Result<(), StoreError> {
        let events = self.events(&item.id)?;
        if events.iter().any(|e| {
            matches!(&e.event, Event::KnowledgeRetrieved { request_id: r, .. } if r == request_id)
        }) {
            return Ok(());
        }
        let known: BTreeSet<(String, String)> = events
            .iter()
            .filter_map(|e| match &e.event {
                Event::KnowledgeRetrieved { notes, .. } => Some(notes),
                _ => None,
            })
            .flatten()
            .map(|n| (n.path.clone(), n.sha256.clone()))
            .collect();
        let notes: Vec<RetrievedNote> = found
            .notes
            .iter()
            .filter(|n| !known.contains(&(n.path.clone(), n.sha256.clone())))
            .map(|n| RetrievedNote {
                path: n.path.clone(),
                sha256: n.sha256.clone(),
                title: n.title.clone(),
                kind: kind_name(n.kind()).into(),
                trusted: n.trusted,
                why: n.why.clone(),
                content: n.content.clone(),
            })
            .collect();
        if notes.is_empty() && found.missing.is_empty() && !even_empty {
            return Ok(());
        }
        self.append(
            &item.id,
            &Actor::agent(settings.plans.agent),
            &Event::KnowledgeRetrieved {
                request_id: request_id.to_string(),
                query: query.to_string(),
                notes,
                missing: found.missing.clone(),
            },
        )?;
        Ok(())
    }
}

/// What the item's recalls pinned: bound procedures, earlier incidents and
/// the memory index, each under what it is and why it was found (the
/// latest revision of each note read), and each missing procedure said
/// as missing.
pub(super) fn recalled(events: &[LoggedEvent]) -> Vec<Pinned> {
    let mut out = Vec::new();
    let mut shown: Vec<&RetrievedNote> = Vec::new();
    let mut missing_all: Vec<&String> = Vec::new();
    for e in events {
        let Event::KnowledgeRetrieved {
            query,
            notes,
            missing,
            ..
        } = &e.event
        else {
            continue;
        };
        if query != "recall" {
            continue;
        }
        for path in missing {
            if !missing_all.contains(&path) {
                missing_all.push(path);
            }
        }
        for n in notes {
            match shown.iter_mut().find(|s| s.path == n.path) {
                Some(older) => *older = n,
                None => shown.push(n),
            }
        }
    }
    for path in missing_all {
        out.push(Pinned::Says(format!(
            "Missing procedure: {}. It is bound to this item but is not in the vault: do not guess it; ask the operator or investigate.",
            quoted(path)
        )));
    }
    for n in shown {
        let (content, cut) = crate::text::head(&n.content, PINNED_NOTE_BYTES);
        let mut text = format!(
            "Recalled from the vault ({}, {}): {} {}, sha256 {}.",
            n.kind,
            quoted(&n.why),
            quoted(&n.path),
            quoted(&n.title),
            &n.sha256.get(..12).unwrap_or(&n.sha256)
        );
        if cut > 0 {
            text.push_str(&format!(
                " Shown in part ({cut} more bytes): read_note gives it whole."
            ));
        }
        if n.kind == "incident" || n.kind == "memory" {
            text.push_str(" A record of the past: re-check it before acting on it.");
        }
        if n.trusted {
            out.push(Pinned::Says(format!("{text}\n{content}")));
        } else {
            out.push(Pinned::Note {
                text,
                path: n.path.clone(),
                content: content.to_string(),
            });
        }
    }
    out
}

/// A tool call's result from the vault's answer, and whether it found
/// anything.
fn found_text(found: &VaultFound) -> (String, bool) {
    if !found.error.is_empty() {
        return (
            format!("the vault could not answer: {}", found.error),
            false,
        );
    }
    if found.notes.is_empty() {
        return ("nothing in the vault matches".into(), true);
    }
    let mut out = String::new();
    for n in &found.notes {
        out.push_str(&format!(
            "{} — {} ({}, {}{})\n{}\n\n",
            n.path,
            n.title,
            kind_name(n.kind()),
            n.why,
            if n.excerpt { ", excerpt" } else { "" },
            n.content.trim_end()
        ));
    }
    (out.trim_end().to_string(), true)
}

fn kind_name(kind: NoteKind) -> &'static str {
    match kind {
        NoteKind::Procedure => "procedure",
        NoteKind::Incident => "incident",
        NoteKind::Memory => "memory",
        NoteKind::World => "world",
        NoteKind::Note | NoteKind::Unspecified => "note",
    }
}
