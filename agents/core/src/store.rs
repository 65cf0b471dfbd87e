//! The agent state store (seed Nisse L8): one SQLite database per agent,
//! in WAL mode, fsynced at every commit.
//!
//! It holds the work items, the canonical log, the outbox of messages the
//! brain produced, and the last applied stream sequence. A brain changes it
//! only inside a [`Txn`], which carries the stream message being applied:
//! its effects and its sequence commit together, so a redelivered message
//! is recognised and applied nothing twice.
//!
//! The schema is versioned (`PRAGMA user_version`) with migrations from the
//! first one; a store from a newer build, a database that is not a Nisse
//! store, one of another agent, or a corrupt file is refused with an error
//! saying which — never silently overwritten.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rusqlite::{Connection, OpenFlags, OptionalExtension as _, params};
use serde::Serialize;
use time::OffsetDateTime;

use nisse_bus::signing::SigningKey;

use crate::requests::Deadlines;

use crate::log::{EVENT_COLUMNS, LoggedEvent, event_from_row};
use crate::work::{ITEM_COLUMNS, IllegalTransition, READY_ORDER, State, WorkItem, item_from_row};

/// Marks a database as a Nisse agent store (`PRAGMA application_id`), so a
/// stray SQLite file is never mistaken for one. ASCII "NiSe".
const APPLICATION_ID: i32 = 0x4E69_5365;

/// The migrations, in order; the schema version is how many have run. A
/// migration is never edited once released: changes are new entries.
const MIGRATIONS: &[&str] = &[
    // 1: work items, the canonical log, the outbox, the applied sequence.
    r#"
    CREATE TABLE meta (
        key TEXT PRIMARY KEY,
        value TEXT NOT NULL
    ) STRICT;

    CREATE TABLE applied (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        stream_sequence INTEGER NOT NULL
    ) STRICT;
    INSERT INTO applied (id, stream_sequence) VALUES (1, 0);

    CREATE TABLE work_items (
        id TEXT PRIMARY KEY,
        number INTEGER NOT NULL UNIQUE,
        title TEXT NOT NULL,
        scope TEXT NOT NULL,
        source TEXT NOT NULL,
        fingerprint TEXT,
        external_link TEXT,
        severity TEXT,
        priority INTEGER NOT NULL DEFAULT 0,
        operator_rank INTEGER,
        state TEXT NOT NULL CHECK (state IN ('active', 'ready', 'waiting_on_operator', 'blocked', 'closed')),
        position TEXT NOT NULL DEFAULT '{}',
        opened_at_ns INTEGER NOT NULL,
        updated_at_ns INTEGER NOT NULL,
        closed_at_ns INTEGER
    ) STRICT;
    -- One active item per agent, and one open item per fingerprint, held by
    -- the database itself as well as by the code.
    CREATE UNIQUE INDEX work_items_one_active ON work_items (state) WHERE state = 'active';
    CREATE UNIQUE INDEX work_items_open_fingerprint ON work_items (fingerprint)
        WHERE state <> 'closed' AND fingerprint IS NOT NULL;
    CREATE INDEX work_items_fingerprint ON work_items (fingerprint, closed_at_ns);
    CREATE INDEX work_items_state ON work_items (state);

    CREATE TABLE events (
        id INTEGER PRIMARY KEY,
        work_item_id TEXT NOT NULL REFERENCES work_items (id),
        at_ns INTEGER NOT NULL,
        actor_kind TEXT NOT NULL,
        actor_id TEXT NOT NULL,
        kind TEXT NOT NULL,
        stream_sequence INTEGER NOT NULL,
        causation_id TEXT NOT NULL,
        payload TEXT NOT NULL
    ) STRICT;
    CREATE INDEX events_work_item ON events (work_item_id, id);
    CREATE INDEX events_causation ON events (causation_id);
    CREATE TRIGGER events_no_update BEFORE UPDATE ON events
        BEGIN SELECT RAISE(ABORT, 'the canonical log is append-only: add a correcting event instead'); END;
    CREATE TRIGGER events_no_delete BEFORE DELETE ON events
        BEGIN SELECT RAISE(ABORT, 'the canonical log is append-only: add a correcting event instead'); END;

    -- Messages the brain could not apply (a logic error); kept so the
    -- operator sees them and a replay records the same.
    CREATE TABLE unapplied (
        stream_sequence INTEGER PRIMARY KEY,
        message_id TEXT NOT NULL,
        at_ns INTEGER NOT NULL,
        reason TEXT NOT NULL
    ) STRICT;

    CREATE TABLE outbox (
        message_id TEXT PRIMARY KEY,
        type TEXT NOT NULL,
        payload BLOB NOT NULL,
        stream_sequence INTEGER NOT NULL
    ) STRICT;
    "#,
    // 2: plan revisions (approved step sequences) and the requests the plan
    // machinery has outstanding with the classifier and the executor.
    r#"
    CREATE TABLE plans (
        work_item_id TEXT NOT NULL REFERENCES work_items (id),
        revision INTEGER NOT NULL CHECK (revision > 0),
        status TEXT NOT NULL CHECK (status IN ('proposed', 'up', 'approved', 'running', 'done', 'halted', 'denied', 'rejected', 'superseded', 'abandoned')),
        proposed_by TEXT NOT NULL,
        rationale TEXT NOT NULL,
        steps TEXT NOT NULL,
        proposed_at_ns INTEGER NOT NULL,
        put_up_at_ns INTEGER,
        approved_by TEXT,
        approved_via TEXT,
        approved_at_ns INTEGER,
        next_step INTEGER NOT NULL DEFAULT 0,
        phase TEXT CHECK (phase IN ('pre', 'run', 'post')),
        attempt INTEGER NOT NULL DEFAULT 0,
        confirmed INTEGER NOT NULL DEFAULT 0,
        halted TEXT,
        runs INTEGER NOT NULL DEFAULT 0,
        PRIMARY KEY (work_item_id, revision)
    ) STRICT;
    -- At most one revision of an item is open (proposed, up, approved,
    -- running): a new one supersedes the old.
    CREATE UNIQUE INDEX plans_one_open ON plans (work_item_id)
        WHERE status IN ('proposed', 'up', 'approved', 'running');

    CREATE TABLE plan_requests (
        request_id TEXT PRIMARY KEY,
        work_item_id TEXT NOT NULL REFERENCES work_items (id),
        revision INTEGER NOT NULL,
        step INTEGER NOT NULL,
        phase TEXT NOT NULL CHECK (phase IN ('pre', 'run', 'post')),
        purpose TEXT NOT NULL CHECK (purpose IN ('assess', 'execute')),
        run INTEGER NOT NULL,
        attempt INTEGER NOT NULL
    ) STRICT;
    "#,
    // 3: the agent loop: each item's loop position (pinned roles, what it
    // waits for, its counters) and the requests it has outstanding with
    // the model gateway (turns, expert questions, answers to the
    // operator's questions), the classifier and the executor.
    r#"
    CREATE TABLE loops (
        work_item_id TEXT PRIMARY KEY REFERENCES work_items (id),
        state TEXT NOT NULL
    ) STRICT;

    CREATE TABLE loop_requests (
        request_id TEXT PRIMARY KEY,
        work_item_id TEXT NOT NULL REFERENCES work_items (id),
        call_id TEXT NOT NULL,
        kind TEXT NOT NULL CHECK (kind IN ('model', 'expert', 'answer', 'classify', 'exec'))
    ) STRICT;
    "#,
    // 4: the dedup id of the last applied message beside its sequence, so
    // a brain can tell at start that its stream went back in time (a
    // restored or lost JetStream store whose sequences now name other
    // messages) instead of skipping new messages as redeliveries.
    r#"
    ALTER TABLE applied ADD COLUMN message_id TEXT NOT NULL DEFAULT '';
    "#,
    // 5: time on the stream. Every request the brain sends a service, with
    // its deadline (kept with the request's bytes until answered, for the
    // operator's `retry`, and a late answer's bytes); when an approval
    // request's expiry was announced; each duty's state.
    r#"
    CREATE TABLE requests (
        request_id TEXT NOT NULL,
        kind TEXT NOT NULL,
        work_item_id TEXT NOT NULL,
        sent_at_ns INTEGER NOT NULL,
        deadline_ns INTEGER NOT NULL,
        state TEXT NOT NULL CHECK (state IN ('waiting', 'answered', 'expired', 'late')),
        resends INTEGER NOT NULL DEFAULT 0,
        request_type TEXT NOT NULL,
        request BLOB,
        answer_type TEXT,
        answer BLOB,
        -- An execution request has its verdict's request id.
        PRIMARY KEY (kind, request_id)
    ) STRICT;
    CREATE INDEX requests_waiting ON requests (deadline_ns) WHERE state = 'waiting';
    CREATE INDEX requests_unanswered ON requests (work_item_id) WHERE state IN ('expired', 'late');

    ALTER TABLE plans ADD COLUMN expiry_announced_ns INTEGER;

    CREATE TABLE duties (
        name TEXT PRIMARY KEY,
        state TEXT NOT NULL
    ) STRICT;
    "#,
    // 6: memory. The world model as the vault reader last sent it; every
    // note the agent asked the vault writer for, and how it went (the
    // memory index is made from these); the loop's vault queries.
    r#"
    CREATE TABLE world (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        sha256 TEXT NOT NULL,
        entities TEXT NOT NULL,
        received_at_ns INTEGER NOT NULL
    ) STRICT;

    CREATE TABLE memory_notes (
        path TEXT PRIMARY KEY,
        kind TEXT NOT NULL,
        title TEXT NOT NULL,
        work_item_id TEXT NOT NULL,
        observed_ns INTEGER NOT NULL,
        request_id TEXT NOT NULL,
        state TEXT NOT NULL CHECK (state IN ('asked', 'written', 'failed')),
        sha256 TEXT,
        reason TEXT,
        resends INTEGER NOT NULL DEFAULT 0
    ) STRICT;
    CREATE INDEX memory_notes_request ON memory_notes (request_id);

    CREATE TABLE loop_requests_6 (
        request_id TEXT PRIMARY KEY,
        work_item_id TEXT NOT NULL REFERENCES work_items (id),
        call_id TEXT NOT NULL,
        kind TEXT NOT NULL CHECK (kind IN ('model', 'expert', 'answer', 'classify', 'exec', 'vault', 'recall'))
    ) STRICT;
    INSERT INTO loop_requests_6 SELECT request_id, work_item_id, call_id, kind FROM loop_requests;
    DROP TABLE loop_requests;
    ALTER TABLE loop_requests_6 RENAME TO loop_requests;
    "#,
    // 10: fewer index entries written for each new item and event. The
    // events a message caused are read only while it is applied, from the
    // first one it appended (a rowid range), so the index on their cause
    // (a random insert for every event) goes. The last closed item of a
    // fingerprint is looked up in an index of closed items only, which
    // holds the number too: a new item is no longer written into it, and
    // the lookup needs no sort.
    r#"
    DROP INDEX events_causation;
    DROP INDEX work_items_fingerprint;
    CREATE INDEX work_items_closed_fingerprint ON work_items (fingerprint, closed_at_ns, number)
        WHERE state = 'closed';
    "#,
];

/// The schema version this build writes.
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// Why the store could not do something.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// SQLite failed (I/O, a full disk, a lock held too long).
    #[error("state store: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// The file is not a usable store of this agent; nothing was changed.
    #[error("state store {path}: {reason}")]
    Refused {
        /// The database file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The store's content contradicts itself.
    #[error("state store is inconsistent: {0}")]
    Corrupt(String),
    /// Something asked for is not there.
    #[error("{0}")]
    Missing(String),
    /// A transition the work model does not allow.
    #[error(transparent)]
    Illegal(#[from] IllegalTransition),
    /// Activating an item while another is active.
    #[error("work item {active} is already active; park it first")]
    AlreadyActive {
        /// The active item.
        active: String,
    },
    /// A message failed in a batch without savepoints
    /// ([`Store::batch_without_savepoints`]), whose changes cannot be
    /// undone alone: drop the batch and apply it again with
    /// [`Store::batch`].
    #[error(
        "message {sequence} failed in a batch without savepoints ({reason}); apply the batch again with a savepoint per message"
    )]
    NeedsSavepoints {
        /// Its stream sequence.
        sequence: u64,
        /// Why it failed.
        reason: String,
    },
}

impl StoreError {
    /// Whether trying again may succeed (a busy or full database), as
    /// opposed to a logic error that would fail the same way again.
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Sqlite(rusqlite::Error::SqliteFailure(e, _)) => matches!(
                e.code,
                rusqlite::ErrorCode::DatabaseBusy
                    | rusqlite::ErrorCode::DatabaseLocked
                    | rusqlite::ErrorCode::DiskFull
                    | rusqlite::ErrorCode::SystemIoFailure
                    | rusqlite::ErrorCode::OutOfMemory
                    | rusqlite::ErrorCode::CannotOpen
            ),
            _ => false,
        }
    }
}

/// Statements through the connection's prepared-statement cache: a brain
/// runs the same dozen statements for every message, and preparing each one
/// again was most of the time it spent applying them.
pub(crate) trait Cached {
    /// `execute`, with the statement cached.
    fn exec_cached<P: rusqlite::Params>(&self, sql: &str, params: P) -> rusqlite::Result<usize>;
    /// `query_row`, with the statement cached.
    fn row_cached<T, P, F>(&self, sql: &str, params: P, f: F) -> rusqlite::Result<T>
    where
        P: rusqlite::Params,
        F: FnOnce(&rusqlite::Row<'_>) -> rusqlite::Result<T>;
}

impl Cached for Connection {
    fn exec_cached<P: rusqlite::Params>(&self, sql: &str, params: P) -> rusqlite::Result<usize> {
        self.prepare_cached(sql)?.execute(params)
    }

    fn row_cached<T, P, F>(&self, sql: &str, params: P, f: F) -> rusqlite::Result<T>
    where
        P: rusqlite::Params,
        F: FnOnce(&rusqlite::Row<'_>) -> rusqlite::Result<T>,
    {
        self.prepare_cached(sql)?.query_row(params, f)
    }
}

/// Nanoseconds since the Unix epoch, as stored.
pub(crate) fn time_to_ns(t: OffsetDateTime) -> i64 {
    i64::try_from(t.unix_timestamp_nanos()).unwrap_or(i64::MAX)
}

/// The inverse of [`time_to_ns`].
pub(crate) fn ns_to_time(ns: i64) -> OffsetDateTime {
    OffsetDateTime::from_unix_timestamp_nanos(i128::from(ns)).unwrap_or(OffsetDateTime::UNIX_EPOCH)
}

/// One agent's state store.
pub struct Store {
    conn: Connection,
    path: PathBuf,
    switch_grace: Duration,
    deadlines: Deadlines,
    signer: Arc<SigningKey>,
    /// Set by [`Store::defer_fsync`]: commits are counted for it.
    wal_sync: Option<Arc<WalSync>>,
}

/// The brain's sense of time: how long a waiting item holds the agent's
/// attention and how long requests may go unanswered. Part of the brain's
/// configuration, so a rebuild times out exactly what the live brain did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// See [`DEFAULT_SWITCH_GRACE`].
    pub switch_grace: Duration,
    /// See [`Deadlines`].
    pub deadlines: Deadlines,
}

impl Default for Timing {
    fn default() -> Self {
        Self {
            switch_grace: DEFAULT_SWITCH_GRACE,
            deadlines: Deadlines::default(),
        }
    }
}

/// How long an item that started waiting on the operator keeps the agent's
/// attention before another ready item may take over (seed L1: so a
/// watching operator can answer first).
pub const DEFAULT_SWITCH_GRACE: Duration = Duration::from_secs(600);

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl Store {
    /// The store's file for `agent` under a data directory.
    pub fn path_in(data_dir: &Path, agent: &str) -> PathBuf {
        data_dir.join("agents").join(agent).join("state.sqlite3")
    }

    /// Opens `agent`'s store for writing, creating it (and its directory)
    /// if absent, and runs pending migrations.
    pub fn open(path: &Path, agent: &str) -> Result<Self, StoreError> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| StoreError::Refused {
                path: path.to_path_buf(),
                reason: format!("cannot create its directory: {e}"),
            })?;
        }
        let conn = Connection::open(path)?;
        let mut store = Self {
            conn,
            path: path.to_path_buf(),
            switch_grace: DEFAULT_SWITCH_GRACE,
            deadlines: Deadlines::default(),
            signer: Arc::new(SigningKey::ephemeral()),
            wal_sync: None,
        };
        // Identify before changing anything: switching a stranger's
        // database to WAL would already be writing to it.
        store.conn.busy_timeout(Duration::from_secs(5))?;
        store.check_identity(agent, true)?;
        store.configure()?;
        store.migrate(agent)?;
        store.conn.execute(
            "INSERT OR IGNORE INTO meta (key, value) VALUES ('store_id', ?1)",
            [uuid::Uuid::new_v4().to_string()],
        )?;
        Ok(store)
    }

    /// Opens an existing store read-only, for the operator CLI. Refuses a
    /// store it cannot understand, like [`Store::open`], but never changes it.
    pub fn open_read_only(path: &Path, agent: &str) -> Result<Self, StoreError> {
        if !path.is_file() {
            return Err(StoreError::Refused {
                path: path.to_path_buf(),
                reason: "no state store here (has the agent's brain run with this data directory?)"
                    .into(),
            });
        }
        let conn = Connection::open_with_flags(
            path,
            OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )?;
        conn.busy_timeout(Duration::from_secs(5))?;
        let store = Self {
            conn,
            path: path.to_path_buf(),
            switch_grace: DEFAULT_SWITCH_GRACE,
            deadlines: Deadlines::default(),
            signer: Arc::new(SigningKey::ephemeral()),
            wal_sync: None,
        };
        // No integrity scan here: it reads the whole file, and a reader
        // meets damage as an error anyway. The brain scans at every start.
        store.check_identity(agent, false)?;
        let version = store.user_version()?;
        if version != SCHEMA_VERSION {
            return Err(store.refuse(format!(
                "schema version {version}, but this build reads version {SCHEMA_VERSION}{}",
                if version < SCHEMA_VERSION {
                    " (start the brain once to migrate it)"
                } else {
                    " (it was written by a newer nisse)"
                }
            )));
        }
        Ok(store)
    }

    /// Sets the switch grace period ([`DEFAULT_SWITCH_GRACE`] unless set).
    pub fn set_switch_grace(&mut self, grace: Duration) {
        self.switch_grace = grace;
    }

    /// Sets how long each kind of request may go unanswered
    /// ([`Deadlines::default`] unless set).
    pub fn set_deadlines(&mut self, deadlines: Deadlines) {
        self.deadlines = deadlines;
    }

    /// Sets the brain's timing: its switch grace and deadlines.
    pub fn set_timing(&mut self, timing: Timing) {
        self.switch_grace = timing.switch_grace;
        self.deadlines = timing.deadlines;
    }

    /// The store's own id, made when it was created.
    pub fn store_id(&self) -> Result<String, StoreError> {
        Ok(self
            .conn
            .query_row("SELECT value FROM meta WHERE key = 'store_id'", [], |r| {
                r.get(0)
            })?)
    }

    /// Sets the key the brain signs execution requests and host bindings
    /// with (its own, from its data directory). Until set, a key that
    /// lives only in memory signs: right for a rebuild, which publishes
    /// nothing, and for tests; an executor refuses what it signs.
    pub fn set_signer(&mut self, key: SigningKey) {
        self.signer = Arc::new(key);
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn refuse(&self, reason: String) -> StoreError {
        StoreError::Refused {
            path: self.path.clone(),
            reason,
        }
    }

    fn configure(&mut self) -> Result<(), StoreError> {
        let mode: String = self
            .conn
            .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
            .map_err(|e| self.not_a_store(e))?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(self.refuse(format!("cannot switch to WAL mode (got `{mode}`)")));
        }
        // FULL: every commit is fsynced before it returns (the CLI's and
        // tests' writes); the live brain defers it (`defer_fsync`), a read
        // model and a rebuild skip it (`without_fsync`).
        // Temporary data (the per-message savepoint journal) in memory: on
        // disk it cost a file write per message.
        // A page cache of up to 32 MiB (SQLite's default is 2): a batch of
        // 512 new items changes some 2,500 pages of indexes keyed by
        // unordered values (fingerprints, message ids), and with 2 MiB
        // SQLite wrote dirty pages to the WAL in the middle of the batch
        // and read them back. Pages are taken as they are read, so an idle
        // store holds only what it read.
        self.conn.execute_batch(
            "PRAGMA synchronous = FULL; PRAGMA foreign_keys = ON; PRAGMA trusted_schema = OFF;
             PRAGMA temp_store = MEMORY; PRAGMA cache_size = -32768;",
        )?;
        self.conn.set_prepared_statement_cache_capacity(64);
        Ok(())
    }

    /// Turns SQLite's "not a database" into a refusal that says so.
    fn not_a_store(&self, e: rusqlite::Error) -> StoreError {
        match &e {
            rusqlite::Error::SqliteFailure(f, _)
                if matches!(
                    f.code,
                    rusqlite::ErrorCode::NotADatabase | rusqlite::ErrorCode::DatabaseCorrupt
                ) =>
            {
                self.refuse(format!(
                    "not a readable SQLite database ({e}); it was left as it is"
                ))
            }
            _ => StoreError::Sqlite(e),
        }
    }

    fn user_version(&self) -> Result<i64, StoreError> {
        self.conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .map_err(|e| self.not_a_store(e))
    }

    /// Refuses a database that is someone else's: another application's,
    /// another agent's, or (with `scan`) damaged.
    fn check_identity(&self, agent: &str, scan: bool) -> Result<(), StoreError> {
        let app: i32 = self
            .conn
            .query_row("PRAGMA application_id", [], |r| r.get(0))
            .map_err(|e| self.not_a_store(e))?;
        let version = self.user_version()?;
        if app == 0 && version == 0 {
            let tables: i64 = self
                .conn
                .query_row("SELECT COUNT(*) FROM sqlite_schema", [], |r| r.get(0))
                .map_err(|e| self.not_a_store(e))?;
            if tables == 0 {
                return Ok(()); // Empty: a new store.
            }
            return Err(self.refuse(
                "an SQLite database that is not a Nisse state store; it was left as it is".into(),
            ));
        }
        if app != APPLICATION_ID {
            return Err(self.refuse(format!(
                "not a Nisse state store (application id {app:#x}); it was left as it is"
            )));
        }
        if version > SCHEMA_VERSION {
            return Err(self.refuse(format!(
                "schema version {version} is newer than this build knows ({SCHEMA_VERSION}); run the nisse that wrote it, or a newer one"
            )));
        }
        if scan {
            let check: String = self
                .conn
                .query_row("PRAGMA quick_check", [], |r| r.get(0))
                .map_err(|e| self.not_a_store(e))?;
            if check != "ok" {
                return Err(self.refuse(format!("integrity check failed: {check}")));
            }
        }
        let owner: Option<String> = self
            .conn
            .query_row("SELECT value FROM meta WHERE key = 'agent'", [], |r| {
                r.get(0)
            })
            .optional()?;
        match owner {
            Some(owner) if owner != agent => {
                Err(self.refuse(format!("this is agent `{owner}`'s store, not `{agent}`'s")))
            }
            _ => Ok(()),
        }
    }

    /// Runs the migrations newer than the store, each in its own
    /// transaction with the version bump, so a crash leaves a whole version.
    fn migrate(&mut self, agent: &str) -> Result<(), StoreError> {
        let from = self.user_version()?;
        for (i, sql) in MIGRATIONS
            .iter()
            .enumerate()
            .skip(usize::try_from(from).unwrap_or(0))
        {
            let version = i as i64 + 1;
            let tx = self.conn.transaction()?;
            tx.execute_batch(sql)?;
            if version == 1 {
                tx.execute(
                    "INSERT INTO meta (key, value) VALUES ('agent', ?1)",
                    [agent],
                )?;
                tx.execute_batch(&format!("PRAGMA application_id = {APPLICATION_ID}"))?;
            }
            tx.execute_batch(&format!("PRAGMA user_version = {version}"))?;
            tx.commit()?;
            tracing::info!(store = %self.path.display(), version, "state store migrated");
        }
        Ok(())
    }

    /// Commits stop waiting for the disk: they are written to the WAL but
    /// not fsynced, and the returned [`WalSync`] makes every commit so far
    /// durable with one fsync, from any thread. For the live brain, which
    /// syncs before anything a commit caused leaves the process (its
    /// outputs, its acks), so the fsync of one batch overlaps applying the
    /// next, and one fsync covers every batch committed meanwhile. A
    /// process crash loses nothing (the WAL is in the page cache); a power
    /// failure can take back only commits that nothing outside saw, whose
    /// messages were not acked: the stream gives them again.
    pub fn defer_fsync(&mut self) -> Result<Arc<WalSync>, StoreError> {
        self.without_fsync()?;
        let path = PathBuf::from(format!("{}-wal", self.path.display()));
        let file = std::fs::File::open(&path).map_err(|e| StoreError::Refused {
            path: path.clone(),
            reason: format!("cannot open the write-ahead log to fsync it: {e}"),
        })?;
        let sync = Arc::new(WalSync {
            file,
            path,
            committed: std::sync::atomic::AtomicU64::new(0),
            synced: std::sync::Mutex::new(Ok(0)),
        });
        self.wal_sync = Some(sync.clone());
        Ok(sync)
    }

    /// Commits are written to the WAL but not fsynced: for a store that
    /// publishes and acks nothing and is made again from the stream (a
    /// read model, a rebuild). A power failure can take back its last
    /// commits, never corrupt it (SQLite's WAL with `synchronous =
    /// NORMAL`); it then goes on from the position it kept.
    pub fn without_fsync(&mut self) -> Result<(), StoreError> {
        self.conn.execute_batch("PRAGMA synchronous = NORMAL")?;
        Ok(())
    }

    /// Stops checkpointing the WAL inside commits; the caller runs a
    /// [`Checkpointer`] instead. An automatic checkpoint copies the WAL into
    /// the database inside whichever commit crosses the threshold, which
    /// made that one commit (and every message waiting on it) tens to
    /// hundreds of milliseconds slow.
    pub fn checkpoint_elsewhere(&self) -> Result<Checkpointer, StoreError> {
        self.conn.execute_batch("PRAGMA wal_autocheckpoint = 0")?;
        let conn = Connection::open(&self.path)?;
        conn.busy_timeout(Duration::from_secs(5))?;
        Ok(Checkpointer { conn })
    }

    /// This store's identity: a random id minted when it was created, with
    /// its path. A brain holds its agent's lease under this name, so after
    /// a crash the same store takes its lease back at once while any other
    /// waits for it to lapse.
    pub fn holder_id(&self) -> Result<String, StoreError> {
        let id = self.store_id()?;
        let path = std::fs::canonicalize(&self.path).unwrap_or_else(|_| self.path.clone());
        Ok(format!("store {id} at {}", path.display()))
    }

    /// The last stream sequence whose effects are committed.
    pub fn applied_sequence(&self) -> Result<u64, StoreError> {
        Ok(self.applied_position()?.0)
    }

    /// The last applied stream sequence and the dedup id of the message
    /// there (empty when that message could not be read, or before the
    /// store recorded ids).
    pub fn applied_position(&self) -> Result<(u64, String), StoreError> {
        let (n, id): (i64, String) = self.conn.query_row(
            "SELECT stream_sequence, message_id FROM applied WHERE id = 1",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )?;
        Ok((u64::try_from(n).unwrap_or(0), id))
    }

    /// Drops from the outbox the messages JetStream has stored (their
    /// publish was acknowledged, or they were found in the stream): they
    /// are never published again.
    pub fn forget_sent(&mut self, message_ids: &[String]) -> Result<(), StoreError> {
        if message_ids.is_empty() {
            return Ok(());
        }
        let tx = self
            .conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        for id in message_ids {
            tx.exec_cached("DELETE FROM outbox WHERE message_id = ?1", [id])?;
        }
        tx.commit()?;
        Ok(())
    }

    /// The stream sequence of the oldest message whose outputs are still
    /// in the outbox: those outputs, if they were stored, are after it.
    pub fn oldest_unsent_cause(&self) -> Result<Option<u64>, StoreError> {
        let n: Option<i64> =
            self.conn
                .query_row("SELECT MIN(stream_sequence) FROM outbox", [], |r| r.get(0))?;
        Ok(n.map(|n| u64::try_from(n).unwrap_or(0)))
    }

    /// Starts applying a batch of stream messages. Nothing is visible to
    /// readers, and nothing is durable, until [`Batch::commit`].
    pub fn batch(&mut self) -> Result<Batch<'_>, StoreError> {
        self.begin(true)
    }

    /// A batch whose messages are applied straight into its transaction,
    /// without a savepoint each. SQLite copies every page a savepoint's
    /// statements change first, so with a savepoint per message most
    /// pages a batch touches were copied once per message that touched
    /// them (a twentieth of `nisse`'s CPU under an alert storm). The
    /// price: a message that fails cannot be undone alone, so
    /// [`Batch::apply`] then answers [`StoreError::NeedsSavepoints`] and
    /// the batch must be dropped (rolled back) and applied again with
    /// [`Store::batch`], which records that message as unapplied and goes
    /// on. Applying is deterministic, so the second pass does the same.
    pub fn batch_without_savepoints(&mut self) -> Result<Batch<'_>, StoreError> {
        self.begin(false)
    }

    fn begin(&mut self, savepoints: bool) -> Result<Batch<'_>, StoreError> {
        let tx = self
            .conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        let applied: i64 = tx.query_row(
            "SELECT stream_sequence FROM applied WHERE id = 1",
            [],
            |r| r.get(0),
        )?;
        Ok(Batch {
            tx,
            applied: u64::try_from(applied).unwrap_or(0),
            applied_id: None,
            wal_sync: self.wal_sync.clone(),
            emitted: Vec::new(),
            switch_grace: self.switch_grace,
            deadlines: self.deadlines,
            signer: self.signer.clone(),
            savepoints,
        })
    }

    /// Every duty's state (JSON, as its agent keeps it), by name.
    pub fn duty_states(&self) -> Result<Vec<(String, String)>, StoreError> {
        let mut stmt = self
            .conn
            .prepare("SELECT name, state FROM duties ORDER BY name")?;
        let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?;
        Ok(rows.collect::<Result<Vec<_>, _>>()?)
    }

    /// Work items, optionally only those in `state`, open ones in ready
    /// order first, then closed ones newest first.
    pub fn items(&self, state: Option<State>) -> Result<Vec<WorkItem>, StoreError> {
        let mut stmt = self.conn.prepare(&format!(
            "SELECT {ITEM_COLUMNS} FROM work_items WHERE (?1 IS NULL OR state = ?1)
             ORDER BY state = 'closed', state <> 'active', {READY_ORDER}, closed_at_ns DESC"
        ))?;
        let rows = stmt.query_map([state.map(State::as_str)], item_from_row)?;
        Ok(rows.collect::<Result<Vec<_>, _>>()?)
    }

    /// A work item by id, or by number (`14` or `#14`).
    pub fn find_item(&self, key: &str) -> Result<Option<WorkItem>, StoreError> {
        crate::work::find_item_in(&self.conn, key)
    }

    /// The items whose log grew past the event `after` (an event id; 0:
    /// every item with a log), in ready order, and the last event id now:
    /// what changed since a reader last looked. Every change of an item
    /// is logged (a state change is a `state_changed` event), so nothing
    /// changes unseen.
    pub fn items_logged_after(&self, after: i64) -> Result<(Vec<WorkItem>, i64), StoreError> {
        let read = self.conn.unchecked_transaction()?;
        let last: i64 =
            self.conn
                .query_row("SELECT COALESCE(MAX(id), 0) FROM events", [], |r| r.get(0))?;
        let mut stmt = self.conn.prepare_cached(&format!(
            "SELECT {ITEM_COLUMNS} FROM work_items WHERE id IN
               (SELECT work_item_id FROM events WHERE id > ?1 AND id <= ?2)
             ORDER BY state = 'closed', state <> 'active', {READY_ORDER}, closed_at_ns DESC"
        ))?;
        let items = stmt
            .query_map([after, last], item_from_row)?
            .collect::<Result<Vec<_>, _>>()?;
        drop(stmt);
        read.commit()?;
        Ok((items, last))
    }

    /// A work item's whole log, in order.
    pub fn events(&self, work_item_id: &str) -> Result<Vec<LoggedEvent>, StoreError> {
        crate::log::item_events(&self.conn, work_item_id)
    }

    /// Everything a brain's state is: the applied sequence, every item and
    /// the whole log. Two stores holding the same snapshot are the same
    /// brain state (the outbox is delivery bookkeeping, not state).
    ///
    /// Read in one transaction: a reader beside a running brain (the CLI,
    /// tests) sees one commit's state, never the log of one commit with
    /// the plans of the next.
    pub fn snapshot(&self) -> Result<Snapshot, StoreError> {
        let read = self.conn.unchecked_transaction()?;
        let snapshot = self.snapshot_now()?;
        read.commit()?;
        Ok(snapshot)
    }

    fn snapshot_now(&self) -> Result<Snapshot, StoreError> {
        let items = self.items(None)?;
        let mut stmt = self
            .conn
            .prepare(&format!("SELECT {EVENT_COLUMNS} FROM events ORDER BY id"))?;
        let events = stmt
            .query_map([], event_from_row)?
            .collect::<Result<Vec<_>, _>>()?;
        let mut plans = Vec::new();
        let mut loops = Vec::new();
        for item in &items {
            plans.extend(self.plans(&item.id)?);
            if let Some(state) = crate::agent_loop::item_loop(&self.conn, &item.id)? {
                loops.push((item.id.clone(), state));
            }
        }
        Ok(Snapshot {
            applied_sequence: self.applied_sequence()?,
            items,
            events,
            plans,
            loops,
            unapplied: self.unapplied()?,
            requests: self.requests()?,
            duties: self.duty_states()?,
            world: self
                .conn
                .query_row("SELECT sha256 FROM world WHERE id = 1", [], |r| r.get(0))
                .optional()?,
            memory: {
                let mut stmt = self.conn.prepare(
                    "SELECT path, kind, request_id, state, resends FROM memory_notes ORDER BY path",
                )?;
                let rows = stmt.query_map([], |r| {
                    Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
                })?;
                rows.collect::<Result<Vec<_>, _>>()?
            },
        })
    }

    /// The world model the vault reader last sent, if any.
    pub fn world(&self) -> Result<Option<nisse_vault::world::World>, StoreError> {
        crate::world::stored_world(&self.conn)
    }

    /// Every request the brain sent, as [`Snapshot::requests`] holds them.
    #[allow(clippy::type_complexity)]
    fn requests(&self) -> Result<Vec<(String, String, String, i64, i64, String, i64)>, StoreError> {
        let mut stmt = self.conn.prepare(
            "SELECT kind, request_id, work_item_id, sent_at_ns, deadline_ns, state, resends
             FROM requests ORDER BY kind, request_id",
        )?;
        let rows = stmt.query_map([], |r| {
            Ok((
                r.get(0)?,
                r.get(1)?,
                r.get(2)?,
                r.get(3)?,
                r.get(4)?,
                r.get(5)?,
                r.get(6)?,
            ))
        })?;
        Ok(rows.collect::<Result<Vec<_>, _>>()?)
    }

    /// Every revision of an item's plan, oldest first.
    pub fn plans(&self, work_item_id: &str) -> Result<Vec<crate::plans::Plan>, StoreError> {
        crate::plans::item_plans(&self.conn, work_item_id)
    }

    /// The messages the brain could not apply, in stream order.
    pub fn unapplied(&self) -> Result<Vec<Unapplied>, StoreError> {
        let mut stmt = self.conn.prepare(
            "SELECT stream_sequence, message_id, at_ns, reason FROM unapplied ORDER BY stream_sequence",
        )?;
        let rows = stmt.query_map([], |r| {
            Ok(Unapplied {
                stream_sequence: u64::try_from(r.get::<_, i64>(0)?).unwrap_or(0),
                message_id: r.get(1)?,
                at: ns_to_time(r.get(2)?),
                reason: r.get(3)?,
            })
        })?;
        Ok(rows.collect::<Result<Vec<_>, _>>()?)
    }

    /// The work items with an execution sent and not yet answered (a
    /// command over SSH or an MCP call): the agent is in the middle of a
    /// step on them, and a restart now would leave its outcome unknown.
    pub fn busy_items(&self) -> Result<Vec<String>, StoreError> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT DISTINCT work_item_id FROM requests
             WHERE state = 'waiting' AND kind IN (?1, ?2) ORDER BY work_item_id",
        )?;
        let rows = stmt.query_map(
            [
                nisse_bus::SubjectKind::ExecReq.suffix(),
                nisse_bus::SubjectKind::McpReq.suffix(),
            ],
            |r| r.get(0),
        )?;
        Ok(rows.collect::<Result<Vec<String>, _>>()?)
    }

    /// Messages produced but not yet seen stored in the stream, oldest first.
    pub fn outbox(&self) -> Result<Vec<Outgoing>, StoreError> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT message_id, type, payload FROM outbox ORDER BY stream_sequence, rowid",
        )?;
        let rows = stmt.query_map([], |r| {
            Ok(Outgoing {
                message_id: r.get(0)?,
                type_name: r.get(1)?,
                payload: r.get(2)?,
            })
        })?;
        Ok(rows.collect::<Result<Vec<_>, _>>()?)
    }
}

/// Copies the WAL back into the database from a connection of its own,
/// off the brain's commit path.
pub struct Checkpointer {
    conn: Connection,
}

impl std::fmt::Debug for Checkpointer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Checkpointer").finish_non_exhaustive()
    }
}

impl Checkpointer {
    /// Checkpoints what it can without waiting for the writer (PASSIVE).
    pub fn checkpoint(&self) -> Result<(), StoreError> {
        self.conn
            .query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()))?;
        Ok(())
    }
}

/// Makes a store's commits durable after [`Store::defer_fsync`]: an
/// fsync of its write-ahead log, which covers every commit written so far
/// (fsync is per file, not per descriptor).
pub struct WalSync {
    file: std::fs::File,
    path: PathBuf,
    /// Batches committed so far.
    committed: std::sync::atomic::AtomicU64,
    /// Batches known durable, or why the log can no longer be made
    /// durable; the lock also keeps two syncs from racing.
    synced: std::sync::Mutex<Result<u64, String>>,
}

impl std::fmt::Debug for WalSync {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WalSync")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl WalSync {
    /// Makes every commit so far durable; nothing to do (no fsync) when
    /// none was made since the last sync. Blocks on the disk. An error is
    /// final for the store: after a failed fsync the kernel may have
    /// dropped the pages it could not write, so no later fsync proves them.
    pub fn sync(&self) -> Result<(), StoreError> {
        let mut synced = self.synced.lock().unwrap_or_else(|e| e.into_inner());
        let refuse = |reason: &str| StoreError::Refused {
            path: self.path.clone(),
            reason: reason.to_string(),
        };
        let done = match &*synced {
            Ok(n) => *n,
            Err(reason) => return Err(refuse(reason)),
        };
        let committed = self.committed.load(std::sync::atomic::Ordering::Acquire);
        if committed == done {
            return Ok(());
        }
        match self.file.sync_data() {
            Ok(()) => {
                *synced = Ok(committed);
                Ok(())
            }
            Err(e) => {
                let reason = format!("fsync of the write-ahead log failed: {e}");
                *synced = Err(reason.clone());
                Err(refuse(&reason))
            }
        }
    }
}

/// What [`Batch::apply`] did with a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Applied {
    /// Its effects are part of the batch.
    Applied,
    /// It was applied before: nothing done.
    AlreadyApplied,
    /// Applying it failed in a way that would repeat; recorded as unapplied.
    Refused(String),
}

/// A brain's whole state, for comparing a rebuilt store with a live one.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Snapshot {
    /// The last applied stream sequence.
    pub applied_sequence: u64,
    /// Every work item.
    pub items: Vec<WorkItem>,
    /// The whole log.
    pub events: Vec<LoggedEvent>,
    /// Every plan revision of every item.
    pub plans: Vec<crate::plans::Plan>,
    /// Every item's agent loop position, by item id.
    pub loops: Vec<(String, crate::agent_loop::LoopState)>,
    /// Messages the brain could not apply.
    pub unapplied: Vec<Unapplied>,
    /// Every request the brain sent and where it stands: `(kind, request
    /// id, item, sent, deadline, state, resends)`, times in ns.
    pub requests: Vec<(String, String, String, i64, i64, String, i64)>,
    /// Every duty's state (JSON, as its agent keeps it), by name.
    pub duties: Vec<(String, String)>,
    /// The world model's hash, if one was received.
    pub world: Option<String>,
    /// Every memory note asked for: `(path, kind, request id, state,
    /// resends)`.
    pub memory: Vec<(String, String, String, String, i64)>,
}

/// A stream message the brain could not apply, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Unapplied {
    /// Its stream sequence.
    pub stream_sequence: u64,
    /// Its dedup id.
    pub message_id: String,
    /// Its time.
    #[serde(with = "time::serde::rfc3339")]
    pub at: OffsetDateTime,
    /// What went wrong.
    pub reason: String,
}

/// A message the brain produced, waiting in the outbox to be published.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outgoing {
    /// Its dedup id.
    pub message_id: String,
    /// Its protobuf type name.
    pub type_name: String,
    /// The encoded message.
    pub payload: Vec<u8>,
}

/// A batch of stream messages being applied in one transaction (a group
/// commit). Each message is applied through [`Batch::message`].
pub struct Batch<'c> {
    tx: rusqlite::Transaction<'c>,
    applied: u64,
    applied_id: Option<String>,
    wal_sync: Option<Arc<WalSync>>,
    emitted: Vec<Outgoing>,
    switch_grace: Duration,
    deadlines: Deadlines,
    signer: Arc<SigningKey>,
    /// Whether each message gets a savepoint of its own
    /// ([`Store::batch_without_savepoints`] says why it may not).
    savepoints: bool,
}

impl<'c> Batch<'c> {
    /// The last sequence applied so far, this batch included.
    pub fn applied(&self) -> u64 {
        self.applied
    }

    /// Applies the message at stream sequence `sequence` (stored at `at`,
    /// with dedup id `message_id`) with `apply`, inside a savepoint.
    ///
    /// A message applied before (a redelivery) is skipped. When `apply`
    /// fails with an error that would repeat (a logic error, not a busy
    /// disk), its changes are rolled back, the message is recorded as
    /// unapplied with the reason, and the batch goes on: one bad message
    /// never wedges the brain, and a replay records the same. A transient
    /// error is returned, and the caller retries the whole batch. In a
    /// batch without savepoints, such a failure is returned as
    /// [`StoreError::NeedsSavepoints`] instead.
    pub fn apply<F>(
        &mut self,
        sequence: u64,
        subject: &str,
        message_id: &str,
        at: OffsetDateTime,
        apply: F,
    ) -> Result<Applied, StoreError>
    where
        F: FnOnce(&mut Txn<'_, 'c>) -> Result<(), StoreError>,
    {
        if sequence <= self.applied {
            return Ok(Applied::AlreadyApplied);
        }
        // A message the brain itself produced is now stored: its outbox
        // entry is done (an input the brain sent itself, `in.loop.pin`).
        let outcome = self.in_savepoint(sequence, subject, message_id, at, |txn| {
            txn.tx()
                .exec_cached("DELETE FROM outbox WHERE message_id = ?1", [message_id])?;
            apply(txn)
        })?;
        self.applied = sequence;
        self.applied_id = Some(message_id.to_string());
        match outcome {
            Ok(()) => Ok(Applied::Applied),
            Err(e) => {
                let reason = e.to_string();
                self.tx.exec_cached(
                    "INSERT INTO unapplied (stream_sequence, message_id, at_ns, reason) VALUES (?1, ?2, ?3, ?4)",
                    params![
                        i64::try_from(sequence).unwrap_or(i64::MAX),
                        message_id,
                        time_to_ns(at),
                        reason
                    ],
                )?;
                Ok(Applied::Refused(reason))
            }
        }
    }

    /// Runs `answer` for the message at `sequence` just after it was
    /// refused (recorded as unapplied): what the brain emits about it. If
    /// that fails too, it is rolled back and logged, and the batch goes on.
    pub fn after_refusal<F>(
        &mut self,
        sequence: u64,
        subject: &str,
        message_id: &str,
        at: OffsetDateTime,
        answer: F,
    ) -> Result<(), StoreError>
    where
        F: FnOnce(&mut Txn<'_, 'c>) -> Result<(), StoreError>,
    {
        if let Err(e) = self.in_savepoint(sequence, subject, message_id, at, answer)? {
            tracing::error!(seq = sequence, %message_id, "answering a refused message failed too: {e}");
        }
        Ok(())
    }

    /// Runs `f` on the message at `sequence` inside a savepoint. A
    /// transient error is returned as the outer error (the caller retries
    /// the whole batch); any other is rolled back, with what `f` emitted,
    /// and returned as the inner one. In a batch without savepoints, any
    /// error is the outer one: [`StoreError::NeedsSavepoints`] for one
    /// that is not transient.
    fn in_savepoint<F>(
        &mut self,
        sequence: u64,
        subject: &str,
        message_id: &str,
        at: OffsetDateTime,
        f: F,
    ) -> Result<Result<(), StoreError>, StoreError>
    where
        F: FnOnce(&mut Txn<'_, 'c>) -> Result<(), StoreError>,
    {
        let savepoint = self.savepoints;
        if savepoint {
            self.tx.exec_cached("SAVEPOINT message", [])?;
        }
        let emitted = self.emitted.len();
        let outcome = f(&mut Txn {
            batch: self,
            at,
            sequence,
            subject,
            causation: message_id.to_string(),
            changes: Vec::new(),
            first_event: None,
        });
        match outcome {
            Ok(()) => {
                if savepoint {
                    self.tx.exec_cached("RELEASE message", [])?;
                }
                Ok(Ok(()))
            }
            Err(e) if e.is_transient() => Err(e),
            Err(e) if !savepoint => Err(StoreError::NeedsSavepoints {
                sequence,
                reason: e.to_string(),
            }),
            Err(e) => {
                self.tx.exec_cached("ROLLBACK TO message", [])?;
                self.tx.exec_cached("RELEASE message", [])?;
                self.emitted.truncate(emitted);
                Ok(Err(e))
            }
        }
    }

    /// Marks `sequence` as passed over without applying anything: a message
    /// addressed to the brain that it cannot read (undecodable, of no known
    /// kind; the consumer dead-letters those).
    pub fn skip(&mut self, sequence: u64) {
        if sequence > self.applied {
            self.applied = sequence;
            self.applied_id = Some(String::new());
        }
    }

    /// A message of the brain's found in the stream (read back in a gap or
    /// a rebuild): it is stored, so it leaves the outbox and is never
    /// published again. Not an input: the position does not move.
    pub fn stored(&mut self, message_id: &str) -> Result<(), StoreError> {
        self.tx
            .exec_cached("DELETE FROM outbox WHERE message_id = ?1", [message_id])?;
        Ok(())
    }

    /// Commits every message of the batch and the applied sequence,
    /// fsynced (after [`Store::defer_fsync`], by the next
    /// [`WalSync::sync`]). Returns the messages the batch emitted, in order, to be
    /// published (they are in the outbox too, until seen in the stream).
    pub fn commit(self) -> Result<Vec<Outgoing>, StoreError> {
        if let Some(id) = &self.applied_id {
            self.tx.exec_cached(
                "UPDATE applied SET stream_sequence = ?1, message_id = ?2 WHERE id = 1",
                params![i64::try_from(self.applied).unwrap_or(i64::MAX), id],
            )?;
        }
        self.tx.commit()?;
        if let Some(w) = &self.wal_sync {
            w.committed
                .fetch_add(1, std::sync::atomic::Ordering::Release);
        }
        Ok(self.emitted)
    }
}

/// Applying one stream message: every change a brain makes goes through
/// this, stamped with the message's time and id, never the wall clock, so
/// replaying the stream gives the same state.
pub struct Txn<'b, 'c> {
    batch: &'b mut Batch<'c>,
    at: OffsetDateTime,
    sequence: u64,
    subject: &'b str,
    causation: String,
    pub(crate) changes: Vec<StateChange>,
    /// The first log event this message appended, if any: the events it
    /// caused are this one and those after it.
    pub(crate) first_event: Option<i64>,
}

/// A state change made while applying the current message, including the
/// ones the store made itself (activating the next ready item).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateChange {
    /// The item.
    pub work_item_id: String,
    /// Before and after.
    pub changed: crate::work::Changed,
    /// The `state_changed` event that records it.
    pub event_id: i64,
}

impl Txn<'_, '_> {
    pub(crate) fn tx(&self) -> &rusqlite::Transaction<'_> {
        &self.batch.tx
    }

    /// See [`Store::set_switch_grace`].
    pub(crate) fn switch_grace(&self) -> Duration {
        self.batch.switch_grace
    }

    /// A duty's state, as its agent keeps it (JSON), if it has run.
    pub fn duty_state(&self, name: &str) -> Result<Option<String>, StoreError> {
        Ok(self
            .tx()
            .row_cached("SELECT state FROM duties WHERE name = ?1", [name], |r| {
                r.get(0)
            })
            .optional()?)
    }

    /// Every duty state whose name starts with `prefix`, in name order:
    /// an agent keeping one record per thing it follows (the dev agent's
    /// issues) lists them.
    pub fn duty_states_under(&self, prefix: &str) -> Result<Vec<(String, String)>, StoreError> {
        let mut stmt = self.tx().prepare_cached(
            "SELECT name, state FROM duties WHERE substr(name, 1, length(?1)) = ?1 ORDER BY name",
        )?;
        let rows = stmt.query_map([prefix], |r| Ok((r.get(0)?, r.get(1)?)))?;
        Ok(rows.collect::<Result<Vec<_>, _>>()?)
    }

    /// Sets a duty's state.
    pub fn set_duty_state(&mut self, name: &str, state: &str) -> Result<(), StoreError> {
        self.tx().exec_cached(
            "INSERT INTO duties (name, state) VALUES (?1, ?2)
             ON CONFLICT (name) DO UPDATE SET state = excluded.state",
            params![name, state],
        )?;
        Ok(())
    }

    /// See [`Store::set_deadlines`].
    pub(crate) fn deadlines(&self) -> Deadlines {
        self.batch.deadlines
    }

    /// The key this brain signs with (see [`Store::set_signer`]).
    pub(crate) fn signer(&self) -> &SigningKey {
        &self.batch.signer
    }

    /// The subject the message being applied was stored on. What the
    /// server enforced about it (who may publish there) is what a brain
    /// may trust: an operator command's sender is its subject's last
    /// token, not what its envelope says.
    pub fn subject(&self) -> &str {
        self.subject
    }

    /// The time of the message being applied: what the brain uses as "now".
    pub fn at(&self) -> OffsetDateTime {
        self.at
    }

    /// The state changes made so far while applying this message, in order.
    pub fn state_changes(&self) -> &[StateChange] {
        &self.changes
    }

    /// The envelope of a message the agent sends about `work_item_id`,
    /// caused by the message being applied and stamped with its time.
    /// `message_id` must be derived from what the message is.
    pub fn agent_envelope(
        &self,
        agent: &str,
        work_item_id: &str,
        message_id: String,
    ) -> nisse_bus::proto::Envelope {
        use nisse_bus::proto;
        proto::Envelope {
            agent: agent.to_string(),
            work_item_id: work_item_id.to_string(),
            actor: Some(proto::Actor {
                kind: proto::ActorKind::Agent as i32,
                id: agent.to_string(),
            }),
            causation_id: self.causation.clone(),
            message_id,
            created_at: Some(std::time::SystemTime::from(self.at).into()),
            ..Default::default()
        }
    }

    /// The stream sequence and id of the message being applied.
    pub fn cause(&self) -> (u64, &str) {
        (self.sequence, &self.causation)
    }

    /// Queues a bus message for publishing once this batch commits. Its
    /// envelope's message id must be derived from what caused it, so that
    /// applying the same message again emits the same id.
    ///
    /// Execution requests are refused here: they go through
    /// [`Txn::emit_exec`], which takes a permit.
    pub fn emit<M: nisse_bus::Contract>(&mut self, msg: &M) -> Result<(), StoreError> {
        if M::KIND == nisse_bus::SubjectKind::ExecReq {
            return Err(StoreError::Corrupt(
                "an execution request can only be emitted with a permit (Txn::emit_exec)".into(),
            ));
        }
        if M::KIND == nisse_bus::SubjectKind::ExecBind {
            return Err(StoreError::Corrupt(
                "a host binding can only be emitted by the gate, with the execution request it is for".into(),
            ));
        }
        if M::KIND == nisse_bus::SubjectKind::McpReq {
            return Err(StoreError::Corrupt(
                "an MCP call can only be emitted with a permit (Txn::emit_mcp)".into(),
            ));
        }
        if M::KIND == nisse_bus::SubjectKind::McpMount {
            return Err(StoreError::Corrupt(
                "an MCP mount can only be emitted by Txn::mcp_mount, which signs it".into(),
            ));
        }
        self.emit_unchecked(msg)
    }

    /// [`Txn::emit`] without the execution-request check, for the gate.
    pub(crate) fn emit_unchecked<M: nisse_bus::Contract>(
        &mut self,
        msg: &M,
    ) -> Result<(), StoreError> {
        let id = msg
            .envelope()
            .map(|e| e.message_id.clone())
            .filter(|id| !id.is_empty())
            .ok_or_else(|| {
                StoreError::Corrupt(format!("{} emitted without a message id", M::NAME))
            })?;
        let out = Outgoing {
            message_id: id,
            type_name: M::full_name(),
            payload: prost::Message::encode_to_vec(msg),
        };
        // Every request has a deadline: it is recorded where every
        // request passes.
        if M::KIND.answered_by().is_some() {
            self.track_request(msg, &out)?;
        }
        self.emit_encoded(out)
    }

    /// Queues an encoded message (with its id and type) for publishing
    /// once this batch commits.
    pub(crate) fn emit_encoded(&mut self, out: Outgoing) -> Result<(), StoreError> {
        self.batch.tx.exec_cached(
            "INSERT INTO outbox (message_id, type, payload, stream_sequence) VALUES (?1, ?2, ?3, ?4)
             ON CONFLICT (message_id) DO NOTHING",
            params![
                out.message_id,
                out.type_name,
                out.payload,
                i64::try_from(self.sequence).unwrap_or(i64::MAX)
            ],
        )?;
        self.batch.emitted.push(out);
        Ok(())
    }
}
