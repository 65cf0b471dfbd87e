//! The work model (seed Nisse L1): work items, their states, and the one
//! guard every state change goes through.
//!
//! The `state` column of the store is written in exactly two places, both in
//! this module: [`crate::Txn::open_item`] (a new item's first state) and
//! [`crate::Txn::transition`] (every change after that, checked against
//! [`Transition::apply`]). Brains get no other handle on the database, so
//! there is no second code path that could write a state directly — the gap
//! Oikos documents for its own state machines (§6.1).

use rusqlite::{OptionalExtension as _, params};
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use crate::log::{Actor, Event};
use crate::store::{Cached as _, StoreError, Txn, ns_to_time, time_to_ns};

/// Where a work item stands (L1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    /// Being worked on. At most one item per agent is active.
    Active,
    /// Waiting for its turn.
    Ready,
    /// Waiting for an answer, a review or an approval.
    WaitingOnOperator,
    /// Waiting for something else to finish (read from external truth).
    Blocked,
    /// Done; kept with its whole log.
    Closed,
}

impl State {
    /// Every state, in display order.
    pub const ALL: [Self; 5] = [
        Self::Active,
        Self::Ready,
        Self::WaitingOnOperator,
        Self::Blocked,
        Self::Closed,
    ];

    /// The name stored and shown (`waiting_on_operator`...).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Active => "active",
            Self::Ready => "ready",
            Self::WaitingOnOperator => "waiting_on_operator",
            Self::Blocked => "blocked",
            Self::Closed => "closed",
        }
    }

    /// Whether the item is still open.
    pub fn is_open(self) -> bool {
        self != Self::Closed
    }
}

impl std::fmt::Display for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for State {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let wanted = s.trim().to_ascii_lowercase().replace('-', "_");
        let wanted = if wanted == "waiting" {
            "waiting_on_operator".to_string()
        } else {
            wanted
        };
        Self::ALL
            .into_iter()
            .find(|st| st.as_str() == wanted)
            .ok_or_else(|| {
                format!(
                    "`{s}` is not a work item state (one of: {})",
                    Self::ALL.map(Self::as_str).join(", ")
                )
            })
    }
}

/// A change of state, named by why it happens. Each is legal only from
/// some states; [`Transition::apply`] is the whole table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Transition {
    /// A ready item gets the agent's attention (only when none is active).
    Activate,
    /// The active item gives way to another; it keeps its full position.
    Park,
    /// The item now needs an answer, review or approval.
    AwaitOperator,
    /// The operator answered: the item can go on when its turn comes.
    OperatorAnswered,
    /// Something external must finish first.
    Block,
    /// The external dependency closed (or the operator removed it).
    Unblock,
    /// Done, resolved or abandoned.
    Close,
    /// The problem came back soon after the item closed (a flapping alert):
    /// the same item reopens rather than a new one per flap.
    Reopen,
}

/// A transition asked of a state it does not apply to.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a work item that is {from} cannot {transition:?}")]
pub struct IllegalTransition {
    /// The item's state.
    pub from: State,
    /// What was asked.
    pub transition: Transition,
}

impl Transition {
    /// The state this transition leads to from `from`, or why it is illegal.
    /// This table is the only definition of the legal moves.
    pub fn apply(self, from: State) -> Result<State, IllegalTransition> {
        use State::*;
        let to = match (self, from) {
            (Self::Activate, Ready) => Active,
            (Self::Park, Active) => Ready,
            (Self::AwaitOperator, Active | Ready | Blocked) => WaitingOnOperator,
            (Self::OperatorAnswered, WaitingOnOperator) => Ready,
            (Self::Block, Active | Ready | WaitingOnOperator) => Blocked,
            (Self::Unblock, Blocked) => Ready,
            (Self::Close, Active | Ready | WaitingOnOperator | Blocked) => Closed,
            (Self::Reopen, Closed) => Ready,
            (transition, from) => return Err(IllegalTransition { from, transition }),
        };
        Ok(to)
    }
}

/// A work item as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkItem {
    /// Minted locally when it opened; the correlation id on every envelope
    /// and log line about it.
    pub id: String,
    /// Short per-agent number for people (`#14`).
    pub number: i64,
    /// One line saying what it is about.
    pub title: String,
    /// What it operates on, e.g. a site and service.
    pub scope: String,
    /// Where it came from, e.g. `alertmanager:ops-webhook`.
    pub source: String,
    /// The dedup key of the finding that opened it, if any.
    pub fingerprint: Option<String>,
    /// The external record (a ticket URL), if one is linked.
    pub external_link: Option<String>,
    /// Severity as the source said it (`critical`, `warning`...).
    pub severity: Option<String>,
    /// Higher goes first among ready items when the operator gave no order.
    pub priority: i64,
    /// The operator's order among ready items (lower first), when given.
    pub operator_rank: Option<i64>,
    /// Its state.
    pub state: State,
    /// Where its work stands (pending question, plan step...), kept whole
    /// while the item is parked. Owned by the agent loop.
    pub position: serde_json::Value,
    /// When it opened.
    #[serde(with = "time::serde::rfc3339")]
    pub opened_at: OffsetDateTime,
    /// When it last changed.
    #[serde(with = "time::serde::rfc3339")]
    pub updated_at: OffsetDateTime,
    /// When it closed, if it is closed.
    #[serde(with = "time::serde::rfc3339::option")]
    pub closed_at: Option<OffsetDateTime>,
}

/// What a new work item is made of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewItem {
    /// One line saying what it is about.
    pub title: String,
    /// What it operates on.
    pub scope: String,
    /// Where it came from.
    pub source: String,
    /// The dedup key of its finding, if any. At most one open item per
    /// fingerprint: the store refuses a second.
    pub fingerprint: Option<String>,
    /// The external record, if any.
    pub external_link: Option<String>,
    /// Severity as the source said it.
    pub severity: Option<String>,
    /// Ready-order rank when the operator gave none (higher first).
    pub priority: i64,
    /// Seed for the item's id: something unique about what opened it (the
    /// opening message's id), so rebuilding from the stream mints the same id.
    pub id_seed: String,
}

/// A state change that happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Changed {
    /// The state before.
    pub from: State,
    /// The state after.
    pub to: State,
}

pub(crate) const ITEM_COLUMNS: &str = "id, number, title, scope, source, fingerprint, external_link, severity, priority, operator_rank, state, position, opened_at_ns, updated_at_ns, closed_at_ns";

pub(crate) fn item_from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<WorkItem> {
    let state: String = row.get(10)?;
    let position: String = row.get(11)?;
    let bad = |col: usize, e: String| {
        rusqlite::Error::FromSqlConversionFailure(
            col,
            rusqlite::types::Type::Text,
            Box::<dyn std::error::Error + Send + Sync>::from(e),
        )
    };
    Ok(WorkItem {
        id: row.get(0)?,
        number: row.get(1)?,
        title: row.get(2)?,
        scope: row.get(3)?,
        source: row.get(4)?,
        fingerprint: row.get(5)?,
        external_link: row.get(6)?,
        severity: row.get(7)?,
        priority: row.get(8)?,
        operator_rank: row.get(9)?,
        state: state.parse().map_err(|e| bad(10, e))?,
        position: serde_json::from_str(&position).map_err(|e| bad(11, e.to_string()))?,
        opened_at: ns_to_time(row.get(12)?),
        updated_at: ns_to_time(row.get(13)?),
        closed_at: row.get::<_, Option<i64>>(14)?.map(ns_to_time),
    })
}

/// The one item matching `condition` (with `?1` bound to `param`).
pub(crate) fn item_where(
    conn: &rusqlite::Connection,
    condition: &str,
    param: impl rusqlite::ToSql,
) -> Result<Option<WorkItem>, StoreError> {
    Ok(conn
        .row_cached(
            &format!("SELECT {ITEM_COLUMNS} FROM work_items WHERE {condition}"),
            [param],
            item_from_row,
        )
        .optional()?)
}

/// A work item by id or by `#number`, on any connection of the store.
pub(crate) fn find_item_in(
    conn: &rusqlite::Connection,
    key: &str,
) -> Result<Option<WorkItem>, StoreError> {
    let key = key.trim();
    match key.trim_start_matches('#').parse::<i64>() {
        Ok(n) => item_where(conn, "number = ?1", n),
        Err(_) => item_where(conn, "id = ?1", key),
    }
}

/// The ready order of L1: the operator's order when given, then priority
/// (for ops: severity), then the oldest. Ties break on the number so the
/// order is total and a rebuild picks the same item.
pub(crate) const READY_ORDER: &str =
    "operator_rank IS NULL, operator_rank, priority DESC, opened_at_ns, number";

/// Mints a work item id: a UUIDv7 whose time is when the item opened and
/// whose remaining bits come from a hash of what opened it. Sortable by
/// age, unique, and the same when the stream is replayed into a new store.
pub fn mint_id(opened_at: OffsetDateTime, seed: &str) -> String {
    use sha2::Digest as _;
    let digest = sha2::Sha256::digest(seed.as_bytes());
    let mut bits = [0u8; 10];
    bits.copy_from_slice(&digest[..10]);
    let ms = u64::try_from(opened_at.unix_timestamp_nanos() / 1_000_000).unwrap_or(0);
    uuid::Builder::from_unix_timestamp_millis(ms, &bits)
        .into_uuid()
        .to_string()
}

impl Txn<'_, '_> {
    /// Opens a work item in `ready` and appends its `opened` event; if no
    /// item is active, the new one is activated at once (L1: switching to a
    /// ready item when nothing is active).
    pub fn open_item(&mut self, new: NewItem, actor: &Actor) -> Result<WorkItem, StoreError> {
        let at = self.at();
        let at_ns = time_to_ns(at);
        let id = mint_id(at, &new.id_seed);
        let number: i64 = self.tx().row_cached(
            "SELECT COALESCE(MAX(number), 0) + 1 FROM work_items",
            [],
            |r| r.get(0),
        )?;
        self.tx().exec_cached(
            "INSERT INTO work_items (id, number, title, scope, source, fingerprint, external_link, severity, priority, operator_rank, state, position, opened_at_ns, updated_at_ns, closed_at_ns)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, NULL, 'ready', '{}', ?10, ?10, NULL)",
            params![
                id,
                number,
                new.title,
                new.scope,
                new.source,
                new.fingerprint,
                new.external_link,
                new.severity,
                new.priority,
                at_ns
            ],
        )?;
        self.append(
            &id,
            actor,
            &Event::Opened {
                title: new.title.clone(),
                scope: new.scope.clone(),
                source: new.source.clone(),
                fingerprint: new.fingerprint.clone(),
                severity: new.severity.clone(),
                external_link: new.external_link.clone(),
            },
        )?;
        tracing::info!(work_item = %id, number, title = %new.title, "work item opened");
        let activated = self.switch_if_due(actor)?;
        // The row as just written (an activation changes only its state;
        // its time is the same message's), rather than read back.
        let state = if activated.as_deref() == Some(id.as_str()) {
            State::Active
        } else {
            State::Ready
        };
        Ok(WorkItem {
            id,
            number,
            title: new.title,
            scope: new.scope,
            source: new.source,
            fingerprint: new.fingerprint,
            external_link: new.external_link,
            severity: new.severity,
            priority: new.priority,
            operator_rank: None,
            state,
            position: serde_json::Value::Object(serde_json::Map::new()),
            opened_at: ns_to_time(at_ns),
            updated_at: ns_to_time(at_ns),
            closed_at: None,
        })
    }

    /// Changes an item's state through the guard, recording a
    /// `state_changed` event. When the active item stops being active, the
    /// next ready item in L1 order is activated (a safe point).
    pub fn transition(
        &mut self,
        id: &str,
        transition: Transition,
        reason: &str,
        actor: &Actor,
    ) -> Result<Changed, StoreError> {
        let changed = self.set_state(id, transition, reason, actor)?;
        self.switch_if_due(actor)?;
        Ok(changed)
    }

    /// The guarded write itself: the only `UPDATE … SET state`.
    fn set_state(
        &mut self,
        id: &str,
        transition: Transition,
        reason: &str,
        actor: &Actor,
    ) -> Result<Changed, StoreError> {
        let from: String = self
            .tx()
            .row_cached("SELECT state FROM work_items WHERE id = ?1", [id], |r| {
                r.get(0)
            })
            .optional()?
            .ok_or_else(|| StoreError::Missing(format!("no work item {id}")))?;
        let from: State = from.parse().map_err(StoreError::Corrupt)?;
        let to = transition.apply(from)?;
        if to == State::Active {
            let other: Option<String> = self
                .tx()
                .row_cached(
                    "SELECT id FROM work_items WHERE state = 'active' AND id <> ?1",
                    [id],
                    |r| r.get(0),
                )
                .optional()?;
            if let Some(other) = other {
                return Err(StoreError::AlreadyActive { active: other });
            }
        }
        let at_ns = time_to_ns(self.at());
        let closed = (to == State::Closed).then_some(at_ns);
        self.tx().exec_cached(
            "UPDATE work_items SET state = ?2, updated_at_ns = ?3, closed_at_ns = ?4 WHERE id = ?1",
            params![id, to.as_str(), at_ns, closed],
        )?;
        let event_id = self.append(
            id,
            actor,
            &Event::StateChanged {
                from,
                to,
                transition,
                reason: reason.to_string(),
            },
        )?;
        let changed = Changed { from, to };
        // The item id is the correlation id operators search logs by.
        tracing::info!(work_item = %id, %from, %to, ?transition, "work item {from} → {to}: {reason}");
        self.changes.push(crate::store::StateChange {
            work_item_id: id.to_string(),
            changed,
            event_id,
        });
        Ok(changed)
    }

    /// Activates the next ready item if none is active and no item went to
    /// wait on the operator within the switch grace period (L1: the agent
    /// stays with a question for a while, so a watching operator can
    /// answer first). Returns the activated item.
    ///
    /// Opening an item and every transition call it; a brain also calls it
    /// for every message it applies, since time here is the message's: a
    /// switch after the grace period happens at the first message applied
    /// after it.
    pub fn switch_if_due(&mut self, actor: &Actor) -> Result<Option<String>, StoreError> {
        // Runs for every message: an index probe, not a row read.
        let active: bool = self.tx().row_cached(
            "SELECT EXISTS (SELECT 1 FROM work_items WHERE state = 'active')",
            [],
            |r| r.get(0),
        )?;
        if active {
            return Ok(None);
        }
        let grace = time::Duration::try_from(self.switch_grace()).unwrap_or(time::Duration::MAX);
        let since = time_to_ns(self.at().saturating_sub(grace));
        let held: Option<String> = self
            .tx()
            .row_cached(
                "SELECT id FROM work_items WHERE state = 'waiting_on_operator' AND updated_at_ns > ?1 LIMIT 1",
                [since],
                |r| r.get(0),
            )
            .optional()?;
        if held.is_some() {
            return Ok(None);
        }
        let Some(next) = self.next_ready()? else {
            return Ok(None);
        };
        self.set_state(
            &next.id,
            Transition::Activate,
            "its turn: no other item is active",
            actor,
        )?;
        Ok(Some(next.id))
    }

    /// Parks the active item and activates `id` (the operator switching, or
    /// the agent at a safe point). Both keep their full position.
    pub fn switch_to(&mut self, id: &str, reason: &str, actor: &Actor) -> Result<(), StoreError> {
        if let Some(active) = self.active_item()? {
            if active.id == id {
                return Ok(());
            }
            self.set_state(&active.id, Transition::Park, reason, actor)?;
        }
        self.set_state(id, Transition::Activate, reason, actor)?;
        Ok(())
    }

    /// Sets the operator's order for a ready item (`do #14 next` gives the
    /// lowest rank so far); `None` clears it.
    pub fn set_operator_rank(
        &mut self,
        id: &str,
        rank: Option<i64>,
        actor: &Actor,
    ) -> Result<(), StoreError> {
        let n = self.tx().exec_cached(
            "UPDATE work_items SET operator_rank = ?2 WHERE id = ?1",
            params![id, rank],
        )?;
        if n == 0 {
            return Err(StoreError::Missing(format!("no work item {id}")));
        }
        self.append(id, actor, &Event::OperatorOrder { rank })?;
        Ok(())
    }

    /// Replaces an item's position (owned by the agent loop).
    pub fn set_position(
        &mut self,
        id: &str,
        position: &serde_json::Value,
    ) -> Result<(), StoreError> {
        let n = self.tx().exec_cached(
            "UPDATE work_items SET position = ?2 WHERE id = ?1",
            params![id, position.to_string()],
        )?;
        if n == 0 {
            return Err(StoreError::Missing(format!("no work item {id}")));
        }
        Ok(())
    }

    /// A work item by id.
    pub fn item(&self, id: &str) -> Result<Option<WorkItem>, StoreError> {
        item_where(self.tx(), "id = ?1", id)
    }

    /// A work item by id or by `#number`.
    pub fn find_item(&self, key: &str) -> Result<Option<WorkItem>, StoreError> {
        find_item_in(self.tx(), key)
    }

    /// The active item, if any.
    pub fn active_item(&self) -> Result<Option<WorkItem>, StoreError> {
        item_where(self.tx(), "state = ?1", State::Active.as_str())
    }

    /// The ready item that comes next in L1 order.
    pub fn next_ready(&self) -> Result<Option<WorkItem>, StoreError> {
        item_where(
            self.tx(),
            &format!("state = ?1 ORDER BY {READY_ORDER} LIMIT 1"),
            State::Ready.as_str(),
        )
    }

    /// The queue of L1: the active item, then every ready item in the
    /// order they will be taken up. What an agent counts when it tells an
    /// operator where a new item stands ("1 ahead").
    pub fn queue(&self) -> Result<Vec<WorkItem>, StoreError> {
        let mut stmt = self.tx().prepare_cached(&format!(
            "SELECT {ITEM_COLUMNS} FROM work_items WHERE state IN ('active', 'ready')
             ORDER BY state = 'ready', {READY_ORDER}"
        ))?;
        let rows = stmt.query_map([], item_from_row)?;
        Ok(rows.collect::<Result<Vec<_>, _>>()?)
    }

    /// Where `item_id` stands in the queue, for people: "nothing ahead",
    /// "2 ahead" (the active item and the ready ones before it).
    pub fn ahead_of(&self, item_id: &str) -> Result<String, StoreError> {
        let queue = self.queue()?;
        Ok(
            match queue
                .iter()
                .position(|i| i.id == item_id)
                .unwrap_or(queue.len())
            {
                0 => "nothing ahead".to_string(),
                n => format!("{n} ahead"),
            },
        )
    }

    /// Every open item, in number order.
    pub fn open_items(&self) -> Result<Vec<WorkItem>, StoreError> {
        let mut stmt = self.tx().prepare_cached(&format!(
            "SELECT {ITEM_COLUMNS} FROM work_items WHERE state <> 'closed' ORDER BY number"
        ))?;
        let rows = stmt.query_map([], item_from_row)?;
        Ok(rows.collect::<Result<Vec<_>, _>>()?)
    }

    /// Every open item with a fingerprint (a duty's finding opened it)
    /// whose last finding came from `duty`, did not say resolved, and was
    /// recorded at `before` or earlier: with that finding's event id and
    /// time, in number order. The database picks them (an index probe an
    /// item, the payload read only for old findings), since a sweep asks at
    /// every tick and an alert storm leaves thousands of items open.
    pub fn quiet_findings(
        &self,
        duty: &str,
        before: OffsetDateTime,
    ) -> Result<Vec<(WorkItem, i64, OffsetDateTime)>, StoreError> {
        let mut stmt = self.tx().prepare_cached(
            "SELECT w.id, e.id, e.at_ns FROM work_items w
             JOIN events e ON e.id = (SELECT id FROM events
                 WHERE work_item_id = w.id AND kind = 'finding' ORDER BY id DESC LIMIT 1)
             WHERE w.state <> 'closed' AND w.fingerprint IS NOT NULL AND e.at_ns <= ?1
               AND json_extract(e.payload, '$.duty') = ?2
               AND json_extract(e.payload, '$.status') IS NOT 'resolved'
             ORDER BY w.number",
        )?;
        let quiet = stmt
            .query_map(params![time_to_ns(before), duty], |r| {
                Ok((r.get::<_, String>(0)?, r.get(1)?, ns_to_time(r.get(2)?)))
            })?
            .collect::<Result<Vec<_>, _>>()?;
        quiet
            .into_iter()
            .map(|(id, event, at)| {
                let item = self
                    .item(&id)?
                    .ok_or_else(|| StoreError::Missing(format!("no work item {id}")))?;
                Ok((item, event, at))
            })
            .collect()
    }

    /// The open item with this fingerprint, if any (there is at most one).
    pub fn open_item_by_fingerprint(
        &self,
        fingerprint: &str,
    ) -> Result<Option<WorkItem>, StoreError> {
        Ok(self
            .tx()
            .row_cached(
                &format!(
                    "SELECT {ITEM_COLUMNS} FROM work_items WHERE fingerprint = ?1 AND state <> 'closed'"
                ),
                [fingerprint],
                item_from_row,
            )
            .optional()?)
    }

    /// The most recently closed item with this fingerprint, if any.
    pub fn last_closed_by_fingerprint(
        &self,
        fingerprint: &str,
    ) -> Result<Option<WorkItem>, StoreError> {
        item_where(
            self.tx(),
            "fingerprint = ?1 AND state = 'closed' ORDER BY closed_at_ns DESC, number DESC LIMIT 1",
            fingerprint,
        )
    }
}
