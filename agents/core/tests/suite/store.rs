//! The state store and the work model, against real SQLite files.

use pretty_assertions::assert_eq;
use time::OffsetDateTime;
use time::macros::datetime;

use nisse_core::{Actor, Applied, Event, NewItem, State, Store, StoreError, Transition, Txn};

const T0: OffsetDateTime = datetime!(2026-11-30 08:00 UTC);

fn new_item(n: u32, priority: i64) -> NewItem {
    NewItem {
        title: format!("item {n}"),
        scope: "site/svc".into(),
        source: "test".into(),
        fingerprint: Some(format!("fp-{n}")),
        external_link: None,
        severity: None,
        priority,
        id_seed: format!("msg-{n}"),
    }
}

fn me() -> Actor {
    Actor::agent("ops")
}

/// Applies `f` as the message at `seq`, `seq` seconds after T0, and commits.
fn apply<T>(
    store: &mut Store,
    seq: u64,
    f: impl FnOnce(&mut Txn<'_, '_>) -> Result<T, StoreError>,
) -> Applied {
    let mut batch = store.batch().unwrap();
    let at = T0 + time::Duration::seconds(i64::try_from(seq).unwrap());
    let out = batch
        .apply(seq, "", &format!("msg-{seq}"), at, |txn| f(txn).map(|_| ()))
        .unwrap();
    batch.commit().unwrap();
    out
}

fn store() -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&Store::path_in(dir.path(), "ops"), "ops").unwrap();
    (dir, store)
}

#[test]
fn the_transition_table_is_exactly_the_legal_moves() {
    use State::*;
    use Transition::*;
    let legal = [
        (Activate, Ready, Active),
        (Park, Active, Ready),
        (AwaitOperator, Active, WaitingOnOperator),
        (AwaitOperator, Ready, WaitingOnOperator),
        (AwaitOperator, Blocked, WaitingOnOperator),
        (OperatorAnswered, WaitingOnOperator, Ready),
        (Block, Active, Blocked),
        (Block, Ready, Blocked),
        (Block, WaitingOnOperator, Blocked),
        (Unblock, Blocked, Ready),
        (Close, Active, Closed),
        (Close, Ready, Closed),
        (Close, WaitingOnOperator, Closed),
        (Close, Blocked, Closed),
        (Reopen, Closed, Ready),
    ];
    for t in [
        Activate,
        Park,
        AwaitOperator,
        OperatorAnswered,
        Block,
        Unblock,
        Close,
        Reopen,
    ] {
        for from in State::ALL {
            let expected = legal
                .iter()
                .find(|(lt, lf, _)| *lt == t && *lf == from)
                .map(|(_, _, to)| *to);
            assert_eq!(t.apply(from).ok(), expected, "{t:?} from {from}");
        }
    }
}

#[test]
fn one_item_is_active_and_the_next_follows_the_ready_order() {
    let (_dir, mut store) = store();
    let mut ids = Vec::new();
    for (n, prio) in [(1, 0), (2, 0), (3, 5), (4, 0)] {
        apply(&mut store, n, |txn| {
            ids.push(txn.open_item(new_item(n as u32, prio), &me())?.id);
            Ok(())
        });
    }
    let states: Vec<State> = ids
        .iter()
        .map(|id| store.find_item(id).unwrap().unwrap().state)
        .collect();
    // The first opened while nothing was active; the rest wait.
    assert_eq!(
        states,
        [State::Active, State::Ready, State::Ready, State::Ready]
    );

    // Closing the active one activates the most urgent ready item (#3),
    // not the oldest.
    apply(&mut store, 5, |txn| {
        txn.transition(&ids[0], Transition::Close, "done", &me())
    });
    assert_eq!(store.find_item("#3").unwrap().unwrap().state, State::Active);

    // The operator's order beats priority and age: #4 before #2.
    apply(&mut store, 6, |txn| {
        txn.set_operator_rank(&ids[3], Some(1), &me())
    });
    apply(&mut store, 7, |txn| {
        txn.transition(&ids[2], Transition::Block, "blocked by #9", &me())
    });
    assert_eq!(store.find_item("4").unwrap().unwrap().state, State::Active);
    assert_eq!(store.find_item("#2").unwrap().unwrap().state, State::Ready);

    // A second active item is refused by the guard.
    let mut batch = store.batch().unwrap();
    let err = batch
        .apply(8, "", "msg-8", T0, |txn| {
            txn.transition(&ids[1], Transition::Activate, "x", &me())
                .map(|_| ())
        })
        .unwrap();
    assert!(
        matches!(err, Applied::Refused(ref r) if r.contains("already active")),
        "{err:?}"
    );
}

#[test]
fn a_commit_whose_fsync_is_deferred_is_visible_at_once_and_kept_by_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = Store::path_in(dir.path(), "ops");
    let mut store = Store::open(&path, "ops").unwrap();
    let wal = store.defer_fsync().unwrap();
    // Nothing committed yet: nothing to sync.
    wal.sync().unwrap();
    apply(&mut store, 1, |txn| txn.open_item(new_item(1, 0), &me()));
    // Committed and readable before any fsync: the brain applies its next
    // batch while the last one's fsync runs.
    let reader = Store::open_read_only(&path, "ops").unwrap();
    assert_eq!(reader.applied_sequence().unwrap(), 1);
    assert_eq!(
        reader.find_item("#1").unwrap().unwrap().state,
        State::Active
    );
    wal.sync().unwrap();
    // The process stops without closing the store (no checkpoint, the
    // write-ahead log left as it is): the next open finds the commit.
    std::mem::forget(store);
    let store = Store::open(&path, "ops").unwrap();
    assert_eq!(store.applied_sequence().unwrap(), 1);
    assert_eq!(store.find_item("#1").unwrap().unwrap().title, "item 1");
}

#[test]
fn parking_keeps_the_full_position() {
    let (_dir, mut store) = store();
    let (mut a, mut b) = (String::new(), String::new());
    apply(&mut store, 1, |txn| {
        a = txn.open_item(new_item(1, 0), &me())?.id;
        b = txn.open_item(new_item(2, 0), &me())?.id;
        Ok(())
    });
    let position =
        serde_json::json!({ "plan": "rev-2", "step": 3, "pending_question": "ok to restart?" });
    apply(&mut store, 2, |txn| txn.set_position(&a, &position));
    apply(&mut store, 3, |txn| {
        txn.switch_to(&b, "operator switched", &me())
    });
    let parked = store.find_item(&a).unwrap().unwrap();
    assert_eq!(parked.state, State::Ready);
    assert_eq!(parked.position, position);
    apply(&mut store, 4, |txn| txn.switch_to(&a, "back", &me()));
    let back = store.find_item(&a).unwrap().unwrap();
    assert_eq!((back.state, back.position), (State::Active, position));
    assert_eq!(store.find_item(&b).unwrap().unwrap().state, State::Ready);
}

#[test]
fn a_redelivered_message_applies_nothing_twice() {
    let (dir, mut store) = store();
    assert_eq!(
        apply(&mut store, 1, |txn| txn.open_item(new_item(1, 0), &me())),
        Applied::Applied
    );
    assert_eq!(
        apply(&mut store, 1, |txn| txn.open_item(new_item(1, 0), &me())),
        Applied::AlreadyApplied
    );
    assert_eq!(store.applied_sequence().unwrap(), 1);
    drop(store);
    // After a restart too.
    let mut store = Store::open(&Store::path_in(dir.path(), "ops"), "ops").unwrap();
    assert_eq!(
        apply(&mut store, 1, |txn| txn.open_item(new_item(1, 0), &me())),
        Applied::AlreadyApplied
    );
    assert_eq!(store.items(None).unwrap().len(), 1);
}

#[test]
fn a_message_that_cannot_be_applied_is_recorded_and_rolled_back() {
    let (_dir, mut store) = store();
    let out = apply(&mut store, 1, |txn| {
        txn.open_item(new_item(1, 0), &me())?;
        // The same fingerprint again: the store holds one open item per
        // fingerprint, so this fails, and the first insert is undone too.
        txn.open_item(new_item(1, 0), &me())
    });
    assert!(matches!(out, Applied::Refused(_)), "{out:?}");
    assert!(store.items(None).unwrap().is_empty());
    let unapplied = store.unapplied().unwrap();
    assert_eq!(unapplied.len(), 1);
    assert_eq!(unapplied[0].stream_sequence, 1);
    // The brain moved on.
    assert_eq!(store.applied_sequence().unwrap(), 1);
    assert_eq!(
        apply(&mut store, 2, |txn| txn.open_item(new_item(1, 0), &me())),
        Applied::Applied
    );
}

/// What opening an item returns is the row as stored: the first item
/// activated at once, the next one ready.
#[test]
fn an_opened_item_is_returned_as_stored() {
    let (_dir, mut store) = store();
    let mut opened = Vec::new();
    for n in 1..=2u32 {
        apply(&mut store, u64::from(n), |txn| {
            opened.push(txn.open_item(new_item(n, 3), &me())?);
            Ok(())
        });
    }
    assert_eq!(opened[0].state, State::Active);
    assert_eq!(opened[1].state, State::Ready);
    for item in &opened {
        assert_eq!(&store.find_item(&item.id).unwrap().unwrap(), item);
        assert_eq!(
            serde_json::to_value(store.find_item(&item.id).unwrap().unwrap()).unwrap(),
            serde_json::to_value(item).unwrap()
        );
    }
}

/// Without a savepoint per message, a failure cannot be undone alone: the
/// batch says so, and nothing of it is kept once it is dropped.
#[test]
fn a_batch_without_savepoints_gives_up_whole_on_a_failing_message() {
    let (_dir, mut store) = store();
    let mut batch = store.batch_without_savepoints().unwrap();
    let at = T0 + time::Duration::seconds(1);
    let out = batch.apply(1, "", "msg-1", at, |txn| {
        txn.open_item(new_item(1, 0), &me()).map(|_| ())
    });
    assert_eq!(out.unwrap(), Applied::Applied);
    let out = batch.apply(2, "", "msg-2", at, |txn| {
        txn.open_item(new_item(2, 0), &me())?;
        // A second open item with the same fingerprint: refused.
        txn.open_item(new_item(2, 0), &me()).map(|_| ())
    });
    match out {
        Err(StoreError::NeedsSavepoints { sequence, reason }) => {
            assert_eq!(sequence, 2);
            assert!(reason.contains("UNIQUE"), "{reason}");
        }
        other => panic!("expected NeedsSavepoints, got {other:?}"),
    }
    drop(batch);
    assert!(store.items(None).unwrap().is_empty());
    assert!(store.unapplied().unwrap().is_empty());
    assert_eq!(store.applied_sequence().unwrap(), 0);
}

#[test]
fn the_log_is_append_only() {
    let (dir, mut store) = store();
    let mut id = String::new();
    apply(&mut store, 1, |txn| {
        id = txn.open_item(new_item(1, 0), &me())?.id;
        txn.append(
            &id,
            &me(),
            &Event::Fact {
                text: "x".into(),
                data: serde_json::Value::Null,
            },
        )
    });
    let raw = rusqlite::Connection::open(Store::path_in(dir.path(), "ops")).unwrap();
    for sql in ["UPDATE events SET payload = '{}'", "DELETE FROM events"] {
        let err = raw.execute(sql, []).unwrap_err().to_string();
        assert!(err.contains("append-only"), "{sql}: {err}");
    }
    let events = store.events(&id).unwrap();
    // opened, activated, the fact: nothing lost, nothing changed.
    assert_eq!(events.len(), 3, "{events:#?}");
    assert!(
        events
            .iter()
            .all(|e| e.work_item_id == id && e.causation_id == "msg-1")
    );
}

#[test]
fn a_newer_foreign_corrupt_or_other_agents_store_is_refused_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let path = Store::path_in(dir.path(), "ops");
    drop(Store::open(&path, "ops").unwrap());

    // Another agent's store.
    let err = Store::open(&path, "dev").unwrap_err().to_string();
    assert!(err.contains("agent `ops`'s store"), "{err}");

    // Written by a newer build.
    let raw = rusqlite::Connection::open(&path).unwrap();
    raw.execute_batch("PRAGMA user_version = 99").unwrap();
    drop(raw);
    let err = Store::open(&path, "ops").unwrap_err().to_string();
    assert!(err.contains("schema version 99 is newer"), "{err}");
    let err = Store::open_read_only(&path, "ops").unwrap_err().to_string();
    assert!(err.contains("newer"), "{err}");

    // Some other application's SQLite database.
    let other = dir.path().join("other.sqlite3");
    let raw = rusqlite::Connection::open(&other).unwrap();
    raw.execute_batch("CREATE TABLE notes (x TEXT); INSERT INTO notes VALUES ('keep me');")
        .unwrap();
    drop(raw);
    let before = std::fs::read(&other).unwrap();
    let err = Store::open(&other, "ops").unwrap_err().to_string();
    assert!(err.contains("not a Nisse state store"), "{err}");
    assert_eq!(std::fs::read(&other).unwrap(), before, "not a byte changed");

    // Not a database at all.
    let garbage = dir.path().join("garbage.sqlite3");
    let bytes = vec![0x5Au8; 8192];
    std::fs::write(&garbage, &bytes).unwrap();
    let err = Store::open(&garbage, "ops").unwrap_err().to_string();
    assert!(err.contains("not a readable SQLite database"), "{err}");
    assert_eq!(std::fs::read(&garbage).unwrap(), bytes);
}

#[test]
fn ids_are_stable_for_the_same_opening_message() {
    let (_d1, mut s1) = store();
    let (_d2, mut s2) = store();
    for s in [&mut s1, &mut s2] {
        apply(s, 1, |txn| txn.open_item(new_item(1, 0), &me()));
    }
    assert_eq!(s1.snapshot().unwrap(), s2.snapshot().unwrap());
}

#[test]
fn a_damaged_store_is_refused_by_the_integrity_scan() {
    let dir = tempfile::tempdir().unwrap();
    let path = Store::path_in(dir.path(), "ops");
    let mut store = Store::open(&path, "ops").unwrap();
    for n in 1..=200u64 {
        apply(&mut store, n, |txn| {
            txn.open_item(new_item(n as u32, 0), &me())
        });
    }
    drop(store); // Checkpoints the WAL into the main file.
    let mut bytes = std::fs::read(&path).unwrap();
    assert!(bytes.len() > 16 * 4096, "{}", bytes.len());
    // Scribble over pages in the middle of the file, keeping the header.
    for b in &mut bytes[8 * 4096..12 * 4096] {
        *b = 0xA5;
    }
    std::fs::write(&path, &bytes).unwrap();
    let err = Store::open(&path, "ops").unwrap_err().to_string();
    assert!(
        err.contains("integrity check failed") || err.contains("not a readable SQLite database"),
        "{err}"
    );
    assert_eq!(std::fs::read(&path).unwrap(), bytes, "left as it was");
}

#[test]
fn an_item_waiting_on_the_operator_keeps_attention_for_the_grace_period() {
    let (_dir, mut store) = store();
    store.set_switch_grace(std::time::Duration::from_secs(600));
    let mut ids = Vec::new();
    apply(&mut store, 1, |txn| {
        ids.push(txn.open_item(new_item(1, 0), &me())?.id);
        ids.push(txn.open_item(new_item(2, 0), &me())?.id);
        Ok(())
    });
    // #1 asks the operator something at T0 + 2 s.
    apply(&mut store, 2, |txn| {
        txn.transition(&ids[0], Transition::AwaitOperator, "asks", &me())
    });
    let state = |s: &Store, n: &str| s.find_item(n).unwrap().unwrap().state;
    assert_eq!(state(&store, "#2"), State::Ready, "no switch right away");
    // A message five minutes later: still within the grace period.
    let mut batch = store.batch().unwrap();
    batch
        .apply(3, "", "msg-3", T0 + time::Duration::minutes(5), |txn| {
            txn.switch_if_due(&me()).map(|_| ())
        })
        .unwrap();
    batch.commit().unwrap();
    assert_eq!(state(&store, "#2"), State::Ready);
    // The first message after ten minutes switches to the ready item.
    let mut batch = store.batch().unwrap();
    batch
        .apply(4, "", "msg-4", T0 + time::Duration::minutes(11), |txn| {
            txn.switch_if_due(&me()).map(|_| ())
        })
        .unwrap();
    batch.commit().unwrap();
    assert_eq!(state(&store, "#2"), State::Active);
    assert_eq!(state(&store, "#1"), State::WaitingOnOperator);
}

#[test]
fn an_execution_request_cannot_be_emitted_without_a_permit() {
    let (_dir, mut store) = store();
    let request = nisse_bus::proto::ExecRequest {
        envelope: Some(nisse_bus::proto::Envelope {
            agent: "ops".into(),
            message_id: "exec:forged".into(),
            ..Default::default()
        }),
        request_id: "forged".into(),
        host: "web1".into(),
        command: "rm -rf /".into(),
        ..Default::default()
    };
    let mut batch = store.batch().unwrap();
    let out = batch
        .apply(1, "", "msg-1", T0, |txn| txn.emit(&request))
        .unwrap();
    // The attempt is a logic error: recorded, rolled back, nothing queued.
    assert!(
        matches!(out, Applied::Refused(ref r) if r.contains("permit")),
        "{out:?}"
    );
    batch.commit().unwrap();
    assert!(store.outbox().unwrap().is_empty());
}
