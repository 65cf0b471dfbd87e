//! The brain reactor on a real server: order, redelivery and gaps.

use std::time::{Duration, Instant};

use async_nats::jetstream::consumer::PullConsumer;
use futures::StreamExt as _;
use pretty_assertions::assert_eq;

use nisse_bus::ConsumerSpec;
use nisse_bus::proto::{self, AlertReceived, Envelope};
use nisse_core::{Event, Store};
use nisse_ops::OpsBrain;
use nisse_tests::{InProcess, TestNats, ops};

fn alert(n: u32) -> AlertReceived {
    AlertReceived {
        envelope: Some(Envelope {
            agent: "ops".into(),
            actor: Some(proto::Actor {
                kind: proto::ActorKind::External as i32,
                id: "alertmanager:test".into(),
            }),
            message_id: format!("alert:{n}"),
            ..Default::default()
        }),
        payload_version: "4".into(),
        alert: Some(proto::Alert {
            status: "firing".into(),
            labels: [("alertname".to_string(), format!("A{n:02}"))].into(),
            fingerprint: format!("{n:016x}"),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The raw durable consumer the ops brain reads.
async fn brain_consumer(bus: &nisse_bus::Bus) -> PullConsumer {
    bus.jetstream()
        .get_stream("AGENT_OPS")
        .await
        .unwrap()
        .get_consumer(ConsumerSpec::BRAIN.name)
        .await
        .unwrap()
}

/// Takes `n` messages from the brain's consumer as a brain that stops
/// would: delivered, held and not acked (the caller acks what it wants).
async fn take_from_brain_consumer(
    bus: &nisse_bus::Bus,
    n: usize,
) -> Vec<async_nats::jetstream::Message> {
    let mut taken = brain_consumer(bus)
        .await
        .fetch()
        .max_messages(n)
        .messages()
        .await
        .unwrap();
    let mut held = Vec::new();
    while let Some(m) = taken.next().await {
        held.push(m.unwrap());
    }
    assert_eq!(held.len(), n, "the brain's consumer gave fewer than asked");
    held
}

/// The ops brain on its own task with its store at `path`, and the watch
/// of its applied sequence.
fn spawn_brain(
    bus: &nisse_bus::Bus,
    path: &std::path::Path,
) -> (InProcess, tokio::sync::watch::Receiver<u64>) {
    let (tx, committed) = tokio::sync::watch::channel(0u64);
    let (bus, path) = (bus.clone(), path.to_path_buf());
    let brain = InProcess::spawn(move |token| async move {
        nisse_core::reactor::run(
            bus,
            ops(),
            path,
            OpsBrain::new("ops", Default::default()),
            nisse_bus::signing::SigningKey::ephemeral(),
            token,
            tx,
        )
        .await
        .map_err(anyhow::Error::from)
    });
    (brain, committed)
}

/// A brain that died holding messages un-acked: the server hands the new
/// brain later messages first and the held ones only after the ack wait.
/// The brain must still apply them all, in stream order, each once.
#[tokio::test]
async fn a_brain_applies_in_stream_order_when_held_messages_come_back_late() {
    let nats = TestNats::start().await.unwrap();
    let mut cfg = nats.bus_config();
    cfg.consumers.ack_wait = Duration::from_secs(3);
    let bus = nats.bus_with(cfg, &["ops"]).await.unwrap();
    bus.ensure_topology().await.unwrap();
    for n in 1..=10 {
        bus.publish(alert(n)).await.unwrap();
    }

    // The "dead brain": takes the first 10 from the brain's consumer and
    // never acks them.
    let _held = take_from_brain_consumer(&bus, 10).await;
    for n in 11..=20 {
        bus.publish(alert(n)).await.unwrap();
    }

    let dir = tempfile::tempdir().unwrap();
    let path = Store::path_in(dir.path(), "ops");
    let (brain, mut committed) = spawn_brain(&bus, &path);
    // Everything is applied well before the held messages come back.
    let started = Instant::now();
    tokio::time::timeout(Duration::from_secs(10), committed.wait_for(|s| *s >= 20))
        .await
        .unwrap()
        .unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "waited for redelivery: {:?}",
        started.elapsed()
    );
    // Let the held ones come back and be recognised as applied.
    tokio::time::sleep(Duration::from_secs(4)).await;
    brain.stop(Duration::from_secs(5)).await.unwrap();

    let s = Store::open_read_only(&path, "ops")
        .unwrap()
        .snapshot()
        .unwrap();
    let titles: Vec<String> = s.items.iter().map(|i| i.title.clone()).collect::<Vec<_>>();
    let mut by_number = s.items.clone();
    by_number.sort_by_key(|i| i.number);
    let in_order: Vec<String> = by_number.iter().map(|i| i.title.clone()).collect();
    let expected: Vec<String> = (1..=20).map(|n| format!("A{n:02}")).collect();
    assert_eq!(in_order, expected, "items opened in stream order");
    assert_eq!(titles.len(), 20);
    let findings = s
        .events
        .iter()
        .filter(|e| matches!(e.event, Event::Finding { .. }))
        .count();
    assert_eq!(findings, 20, "each alert applied once");
    let seqs: Vec<u64> = s.events.iter().map(|e| e.stream_sequence).collect();
    assert!(
        seqs.windows(2).all(|w| w[0] <= w[1]),
        "log in stream order: {seqs:?}"
    );

    // Nothing left pending on the brain's consumer.
    let mut consumer = brain_consumer(&bus).await;
    let info = consumer.info().await.unwrap();
    assert_eq!((info.num_pending, info.num_ack_pending), (0, 0));
}

/// A redelivery, then new messages, right after a start: the new
/// messages follow the redelivery in consumer sequence, but the inputs
/// between them in the stream (held by the dead run, their ack wait not
/// yet over) were never given to this run. They must be read from the
/// stream, not skipped as applied when they come back.
#[tokio::test]
async fn a_redelivery_followed_by_new_messages_does_not_skip_what_lies_between() {
    let nats = TestNats::start().await.unwrap();
    let mut cfg = nats.bus_config();
    cfg.consumers.ack_wait = Duration::from_secs(2);
    let bus = nats.bus_with(cfg, &["ops"]).await.unwrap();
    bus.ensure_topology().await.unwrap();
    for n in 1..=10 {
        bus.publish(alert(n)).await.unwrap();
    }
    // The dead run took all ten; it kept 2 to 10 alive just before the
    // first one's ack wait ran out, so only the first is due again.
    let held = take_from_brain_consumer(&bus, 10).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    for m in &held[1..] {
        m.ack_with(async_nats::jetstream::AckKind::Progress)
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(800)).await;
    for n in 11..=20 {
        bus.publish(alert(n)).await.unwrap();
    }

    let dir = tempfile::tempdir().unwrap();
    let path = Store::path_in(dir.path(), "ops");
    let (brain, mut committed) = spawn_brain(&bus, &path);
    let last = nisse_tests::last_input_sequence(&bus, &ops())
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(10), committed.wait_for(|s| *s >= last))
        .await
        .unwrap()
        .unwrap();
    // Let the held ones come back and be recognised as applied.
    tokio::time::sleep(Duration::from_secs(3)).await;
    brain.stop(Duration::from_secs(5)).await.unwrap();

    let (in_order, _) = titles_and_findings(&path);
    let expected: Vec<String> = (1..=20).map(|n| format!("A{n:02}")).collect();
    assert_eq!(in_order, expected, "every alert, in stream order");
}

/// A brain that crashed after committing but before publishing its outputs
/// publishes them when it runs again, once each.
#[tokio::test]
async fn outputs_committed_but_never_published_are_published_after_a_restart() {
    let nats = TestNats::start().await.unwrap();
    let bus = nats.bus(&["ops"]).await.unwrap();
    bus.ensure_topology().await.unwrap();
    let seq = bus.publish(alert(1)).await.unwrap().sequence;

    // The crashed run: the alert applied and committed, its announcement
    // in the outbox, nothing published, nothing acked.
    let dir = tempfile::tempdir().unwrap();
    let path = Store::path_in(dir.path(), "ops");
    {
        use nisse_core::Brain as _;
        let mut store = Store::open(&path, "ops").unwrap();
        let mut brain = OpsBrain::new("ops", Default::default());
        let mut batch = store.batch().unwrap();
        batch
            .apply(seq, "", "alert:1", time::OffsetDateTime::now_utc(), |txn| {
                brain.apply(txn, &nisse_bus::AnyMessage::InAlert(alert(1)))
            })
            .unwrap();
        assert_eq!(batch.commit().unwrap().len(), 1);
        assert_eq!(store.outbox().unwrap().len(), 1);
    }

    let (brain, _committed) = spawn_brain(&bus, &path);
    // The announcement reaches the stream (seq 2), and once JetStream has
    // acknowledged it the brain drops it from the outbox.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !Store::open_read_only(&path, "ops")
        .unwrap()
        .outbox()
        .unwrap()
        .is_empty()
    {
        assert!(Instant::now() < deadline, "the outbox never emptied");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    brain.stop(Duration::from_secs(5)).await.unwrap();

    let mut reader = bus.read_range(&ops(), 1, None).await.unwrap();
    let mut told = Vec::new();
    while let Some(m) = reader.next().await {
        if let Ok(nisse_bus::AnyMessage::Tell(t)) = m.unwrap().decode() {
            told.push(t);
        }
    }
    assert_eq!(told.len(), 1, "published once: {told:#?}");
    assert!(told[0].opens_conversation);
    let s = Store::open_read_only(&path, "ops")
        .unwrap()
        .snapshot()
        .unwrap();
    assert_eq!(s.items.len(), 1, "the alert was not applied again");
}

/// Two brains for one agent: the second stands by while the first holds
/// the lease, and takes over, from where the first stopped, when it goes.
#[tokio::test]
async fn a_second_brain_stands_by_until_the_first_gives_up_its_lease() {
    let nats = TestNats::start().await.unwrap();
    let mut cfg = nats.bus_config();
    cfg.lease_ttl = Duration::from_secs(2);
    let bus = nats.bus_with(cfg, &["ops"]).await.unwrap();
    bus.ensure_topology().await.unwrap();

    let dir = tempfile::tempdir().unwrap();
    let first_path = dir.path().join("first.sqlite3");
    let second_path = dir.path().join("second.sqlite3");
    let (first, mut first_committed) = spawn_brain(&bus, &first_path);
    bus.publish(alert(1)).await.unwrap();
    tokio::time::timeout(
        Duration::from_secs(10),
        first_committed.wait_for(|s| *s >= 1),
    )
    .await
    .unwrap()
    .unwrap();

    let (second, mut second_committed) = spawn_brain(&bus, &second_path);
    for n in 2..=3 {
        bus.publish(alert(n)).await.unwrap();
    }
    tokio::time::timeout(
        Duration::from_secs(10),
        first_committed.wait_for(|s| *s >= 3),
    )
    .await
    .unwrap()
    .unwrap();
    // Two lease periods: the standby has had every chance to take messages.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(
        !second_path.exists()
            || Store::open_read_only(&second_path, "ops")
                .unwrap()
                .items(None)
                .unwrap()
                .is_empty(),
        "the standby applied messages while the first brain held the lease"
    );
    assert_eq!(*second_committed.borrow(), 0);
    // And it never even asked for messages: one brain pulls, not two.
    let mut consumer = brain_consumer(&bus).await;
    assert_eq!(consumer.info().await.unwrap().num_waiting, 1);

    first.stop(Duration::from_secs(5)).await.unwrap();
    bus.publish(alert(4)).await.unwrap();
    tokio::time::timeout(
        Duration::from_secs(10),
        second_committed.wait_for(|s| *s >= 4),
    )
    .await
    .unwrap()
    .unwrap();
    second.stop(Duration::from_secs(5)).await.unwrap();

    let first_items = Store::open_read_only(&first_path, "ops")
        .unwrap()
        .items(None)
        .unwrap();
    assert_eq!(first_items.len(), 3);
    // The second store was empty when it took over, so it applied the
    // stream from the start: the same three, and the fourth.
    let second_items = Store::open_read_only(&second_path, "ops")
        .unwrap()
        .items(None)
        .unwrap();
    assert_eq!(second_items.len(), 4);
}

/// The brain reads its inputs only: every alert is delivered to its
/// consumer once, none of the messages it emits (thread roots, host
/// bindings) ever is, and rebuilding its state from the whole stream,
/// outputs included, gives the same state as the live store.
#[tokio::test]
async fn the_brain_receives_none_of_its_own_outputs_and_a_rebuild_equals_the_live_store() {
    let nats = TestNats::start().await.unwrap();
    let bus = nats.bus(&["ops"]).await.unwrap();
    bus.ensure_topology().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = Store::path_in(dir.path(), "ops");
    let (brain, _committed) = spawn_brain(&bus, &path);
    for n in 1..=12 {
        bus.publish(alert(n)).await.unwrap();
    }

    // Quiet: every input applied, every output published.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut consumer = brain_consumer(&bus).await;
    let live = loop {
        let last_input = nisse_tests::last_input_sequence(&bus, &ops())
            .await
            .unwrap();
        let info = consumer.info().await.unwrap().clone();
        // Not there, or not migrated, until the brain has started.
        if let Ok(s) = Store::open_read_only(&path, "ops")
            && s.applied_sequence().unwrap() == last_input
            && s.outbox().unwrap().is_empty()
            && info.num_ack_pending == 0
        {
            break s.snapshot().unwrap();
        }
        assert!(Instant::now() < deadline, "the brain never went quiet");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    brain.stop(Duration::from_secs(5)).await.unwrap();

    // The stream holds the alerts and the brain's outputs about them...
    let mut reader = bus.read_range(&ops(), 1, None).await.unwrap();
    let (mut inputs, mut outputs) = (0u64, 0u64);
    while let Some(m) = reader.next().await {
        match nisse_bus::SubjectKind::parse(&m.unwrap().subject).map(|(_, k)| k.direction()) {
            Some(nisse_bus::Direction::In) => inputs += 1,
            Some(nisse_bus::Direction::Out) => outputs += 1,
            _ => {}
        }
    }
    // Twelve alerts and the brain's own start.
    assert_eq!(inputs, 13);
    assert!(outputs >= 12, "a thread root per alert: {outputs}");
    // ...and the brain's consumer delivered exactly the inputs, once each.
    let info = consumer.info().await.unwrap().clone();
    assert_eq!(info.delivered.consumer_sequence, inputs, "{info:?}");
    assert_eq!((info.num_pending, info.num_redelivered), (0, 0));
    assert_eq!(live.items.len(), 12);

    assert_rebuild_equals(&bus, dir.path(), &live).await;
}

/// Rebuilds the ops store from the stream into `dir` and checks it equals
/// `live`, with every output found in the stream.
async fn assert_rebuild_equals(
    bus: &nisse_bus::Bus,
    dir: &std::path::Path,
    live: &nisse_core::Snapshot,
) {
    let rebuilt_path = dir.join("rebuilt.sqlite3");
    let applied = nisse_core::reactor::rebuild(
        bus,
        &ops(),
        &rebuilt_path,
        OpsBrain::new("ops", Default::default()),
    )
    .await
    .unwrap();
    assert_eq!(applied, live.applied_sequence);
    let rebuilt = Store::open_read_only(&rebuilt_path, "ops").unwrap();
    assert_eq!(&rebuilt.snapshot().unwrap(), live);
    assert!(
        rebuilt.outbox().unwrap().is_empty(),
        "every output is in the stream"
    );
}

/// Copies a directory tree (a stopped server's JetStream store).
fn copy_tree(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// What the store at `path` holds: its items' titles in the order they
/// were opened (by number), and how many findings its log records.
fn titles_and_findings(path: &std::path::Path) -> (Vec<String>, usize) {
    let s = Store::open_read_only(path, "ops")
        .unwrap()
        .snapshot()
        .unwrap();
    let mut by_number = s.items;
    by_number.sort_by_key(|i| i.number);
    let findings = s
        .events
        .iter()
        .filter(|e| matches!(e.event, Event::Finding { .. }))
        .count();
    (by_number.into_iter().map(|i| i.title).collect(), findings)
}

/// Waits until the brain has applied through `seq`.
async fn applied_through(committed: &mut tokio::sync::watch::Receiver<u64>, seq: u64) {
    tokio::time::timeout(Duration::from_secs(20), committed.wait_for(|s| *s >= seq))
        .await
        .unwrap()
        .unwrap();
}

/// Publishes `alerts`, retrying while a restarted server comes back.
async fn publish_all(bus: &nisse_bus::Bus, alerts: impl IntoIterator<Item = u32>) {
    for n in alerts {
        let deadline = Instant::now() + Duration::from_secs(20);
        while bus.publish(alert(n)).await.is_err() {
            assert!(Instant::now() < deadline, "the server never came back");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// Runs the brain until it has applied every input stored now, then
/// stops it.
async fn apply_everything(bus: &nisse_bus::Bus, path: &std::path::Path) -> u64 {
    let (brain, mut committed) = spawn_brain(bus, path);
    // The brain's own start message joins the inputs once it is up.
    let last = loop {
        let last = nisse_tests::last_input_sequence(bus, &ops()).await.unwrap();
        applied_through(&mut committed, last).await;
        let started = bus
            .last_on_subject(&ops(), &ops().subject(nisse_bus::SubjectKind::BrainStarted))
            .await
            .unwrap()
            .is_some_and(|m| m.sequence <= last);
        if started && nisse_tests::last_input_sequence(bus, &ops()).await.unwrap() == last {
            break last;
        }
    };
    brain.stop(Duration::from_secs(10)).await.unwrap();
    last
}

/// The JetStream store restored from an older copy under a live state
/// store (or messages the server had acknowledged lost on a power
/// failure): the stream's sequences no longer name what the brain applied.
/// The brain refuses to start and says why and what to do, instead of
/// taking new messages for redeliveries and skipping them.
#[tokio::test]
async fn a_brain_whose_stream_went_back_in_time_refuses_to_start() {
    let mut nats = TestNats::start().await.unwrap();
    let bus = nats.bus(&["ops"]).await.unwrap();
    bus.ensure_topology().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = Store::path_in(dir.path(), "ops");
    let store_dir = nats.dir().join("jetstream");
    let older = dir.path().join("older-jetstream");

    publish_all(&bus, 1..=3).await;
    apply_everything(&bus, &path).await;
    // The copy an operator might restore later.
    nats.kill().await.unwrap();
    copy_tree(&store_dir, &older);
    nats.restart().await.unwrap();
    publish_all(&bus, 4..=6).await;
    let applied = apply_everything(&bus, &path).await;

    // The older store goes back in place under the state that applied more.
    nats.kill().await.unwrap();
    std::fs::remove_dir_all(&store_dir).unwrap();
    copy_tree(&older, &store_dir);
    nats.restart().await.unwrap();
    let behind = nats.bus(&["ops"]).await.unwrap();
    let (brain, _) = spawn_brain(&behind, &path);
    let refused = brain.stop(Duration::from_secs(10)).await.unwrap_err();
    let why = format!("{refused:#}");
    assert!(
        why.contains("went back in time")
            && why.contains(&format!("but the brain has applied up to {applied}"))
            && why.contains("nisse replay --agent ops --rebuild"),
        "{why}"
    );

    // New messages arrive before anyone notices, so the stream is long
    // again: the message at the applied sequence is not the one applied.
    publish_all(&behind, 100..=120).await;
    let (brain, _) = spawn_brain(&behind, &path);
    let refused = brain.stop(Duration::from_secs(10)).await.unwrap_err();
    let why = format!("{refused:#}");
    assert!(
        why.contains("went back in time") && why.contains(&format!("sequence {applied} holds")),
        "{why}"
    );
    // Nothing was applied in the meantime.
    let s = Store::open_read_only(&path, "ops")
        .unwrap()
        .snapshot()
        .unwrap();
    assert_eq!(s.applied_sequence, applied);
    assert_eq!(s.items.len(), 6);
}

/// A message the brain cannot apply amid others in one batch. The brain
/// applies a batch without a savepoint per message and, when one fails,
/// all of it again with them: the messages around it are applied once
/// each, it alone is recorded as unapplied with nothing of it kept, its
/// sender is answered, and a rebuild records the same.
#[tokio::test]
async fn a_message_that_fails_amid_a_batch_is_recorded_alone_and_the_rest_applied_once() {
    let nats = TestNats::start().await.unwrap();
    let bus = nats.bus(&["ops"]).await.unwrap();
    bus.ensure_topology().await.unwrap();
    // Stored before the brain starts, so that its first batches hold them
    // together.
    publish_all(&bus, 1..=5).await;
    let mut answers = bus
        .client()
        .subscribe("nisse.ops.out.operator.broken-1")
        .await
        .unwrap();
    bus.publish(proto::OperatorCommand {
        envelope: Some(Envelope {
            agent: "ops".into(),
            actor: Some(proto::Actor {
                kind: proto::ActorKind::Operator as i32,
                id: "alice".into(),
            }),
            message_id: "broken-1".into(),
            ..Default::default()
        }),
        channel: "cli".into(),
        work_item: "#1".into(),
        // No command at all: the brain cannot apply it.
        command: None,
    })
    .await
    .unwrap();
    publish_all(&bus, 6..=10).await;
    let dir = tempfile::tempdir().unwrap();
    let path = Store::path_in(dir.path(), "ops");
    let applied = apply_everything(&bus, &path).await;

    let live = Store::open_read_only(&path, "ops")
        .unwrap()
        .snapshot()
        .unwrap();
    assert_eq!(live.applied_sequence, applied);
    assert_eq!(live.items.len(), 10);
    for item in &live.items {
        let kinds: Vec<&str> = live
            .events
            .iter()
            .filter(|e| e.work_item_id == item.id)
            .map(|e| e.event.kind())
            .filter(|k| *k == "opened" || *k == "finding")
            .collect();
        assert_eq!(kinds, ["opened", "finding"], "item #{}", item.number);
    }
    assert_eq!(live.unapplied.len(), 1, "{:?}", live.unapplied);
    assert_eq!(live.unapplied[0].message_id, "broken-1");
    assert!(
        live.unapplied[0].reason.contains("without a command"),
        "{:?}",
        live.unapplied[0]
    );
    let answer = tokio::time::timeout(Duration::from_secs(20), answers.next())
        .await
        .expect("the sender was answered")
        .unwrap();
    let reply = <proto::OperatorReply as prost::Message>::decode(answer.payload).unwrap();
    assert!(!reply.applied);
    assert!(reply.error.contains("without a command"), "{reply:?}");

    assert_rebuild_equals(&bus, dir.path(), &live).await;
}

/// A read model kept by `reactor::follow` (the control service's) beside
/// the live brain: it applies the stream as it grows, stopped midway it
/// goes on from its own store, and it ends equal to the live store,
/// having published nothing.
#[tokio::test]
async fn a_follower_keeps_a_read_model_equal_to_the_live_store_across_its_restart() {
    let nats = TestNats::start().await.unwrap();
    let bus = nats.bus(&["ops"]).await.unwrap();
    bus.ensure_topology().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = Store::path_in(dir.path(), "ops");
    let read_model = dir.path().join("read-model.sqlite3");
    let follow = |bus: nisse_bus::Bus, path: std::path::PathBuf| {
        let (tx, rx) = tokio::sync::watch::channel(0u64);
        let task = tokio::spawn(async move {
            nisse_core::reactor::follow(
                &bus,
                &ops(),
                &path,
                OpsBrain::new("ops", Default::default()),
                move |f| {
                    let _ = tx.send(f.messages.last().map_or(0, |m| m.sequence));
                },
            )
            .await
        });
        (task, rx)
    };
    let (first, mut seen) = follow(bus.clone(), read_model.clone());
    let (brain, _committed) = spawn_brain(&bus, &path);
    publish_all(&bus, 1..=6).await;
    tokio::time::timeout(Duration::from_secs(20), seen.wait_for(|s| *s >= 6))
        .await
        .unwrap()
        .unwrap();
    first.abort();
    let _ = first.await;
    publish_all(&bus, 7..=12).await;
    // Quiet: every input applied, every output published.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let last_input = nisse_tests::last_input_sequence(&bus, &ops())
            .await
            .unwrap();
        if let Ok(s) = Store::open_read_only(&path, "ops")
            && s.applied_sequence().unwrap() == last_input
            && s.outbox().unwrap().is_empty()
            && s.items(None).unwrap().len() == 12
        {
            break;
        }
        assert!(Instant::now() < deadline, "the brain never went quiet");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    brain.stop(Duration::from_secs(10)).await.unwrap();
    let live = Store::open_read_only(&path, "ops")
        .unwrap()
        .snapshot()
        .unwrap();
    assert_eq!(live.items.len(), 12);
    let before = bus.stream_bounds(&ops()).await.unwrap().last;

    let (second, mut seen) = follow(bus.clone(), read_model.clone());
    tokio::time::timeout(Duration::from_secs(20), seen.wait_for(|s| *s >= before))
        .await
        .unwrap()
        .unwrap();
    let followed = Store::open_read_only(&read_model, "ops").unwrap();
    assert_eq!(followed.snapshot().unwrap(), live);
    assert!(
        followed.outbox().unwrap().is_empty(),
        "every output is in the stream"
    );
    // It published nothing: the stream ends where the brain left it.
    assert_eq!(bus.stream_bounds(&ops()).await.unwrap().last, before);
    second.abort();
}

/// A brain consumer an older version made, acking each message: the
/// topology makes it anew acking in order (`AckAll`), starting after its
/// ack floor, and a brain on it applies every alert once and settles a
/// burst with one ack a batch, not one a message.
#[tokio::test]
async fn a_brain_consumer_that_acked_each_is_made_anew_and_then_acked_once_a_batch() {
    use async_nats::jetstream::consumer::{AckPolicy, DeliverPolicy};

    let nats = TestNats::start().await.unwrap();
    let bus = nats.bus(&["ops"]).await.unwrap();
    bus.ensure_topology().await.unwrap();
    // As an older version made it.
    let stream = bus.jetstream().get_stream("AGENT_OPS").await.unwrap();
    let mut old = brain_consumer(&bus).await.cached_info().config.clone();
    assert_eq!(old.ack_policy, AckPolicy::All, "made acking in order");
    old.ack_policy = AckPolicy::Explicit;
    stream
        .delete_consumer(ConsumerSpec::BRAIN.name)
        .await
        .unwrap();
    stream.create_consumer(old).await.unwrap();
    publish_all(&bus, 1..=10).await;
    // Its brain took the ten and acked 1 to 4 and 6 when it stopped.
    let held = take_from_brain_consumer(&bus, 10).await;
    for m in held[..4].iter().chain(&held[5..6]) {
        m.double_ack().await.unwrap();
    }
    drop(held);
    publish_all(&bus, 11..=15).await;

    let report = bus.ensure_topology().await.unwrap();
    let change = report.streams[0]
        .consumers
        .iter()
        .find(|(name, _)| name == ConsumerSpec::BRAIN.name)
        .map(|(_, c)| *c);
    assert_eq!(change, Some(nisse_bus::TopologyChange::Updated));
    let mut consumer = brain_consumer(&bus).await;
    let info = consumer.info().await.unwrap().clone();
    assert_eq!(info.config.ack_policy, AckPolicy::All);
    assert_eq!(
        info.config.deliver_policy,
        DeliverPolicy::ByStartSequence { start_sequence: 5 },
        "starts after the old consumer's ack floor"
    );
    assert_eq!(info.num_pending, 11, "5 to 15 are handed out again");

    // Every ack the brain sends on its consumer, seen on the wire.
    let mut acks = bus.client().subscribe("$JS.ACK.>").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = Store::path_in(dir.path(), "ops");
    let (brain, mut committed) = spawn_brain(&bus, &path);
    let started = loop {
        let last = nisse_tests::last_input_sequence(&bus, &ops())
            .await
            .unwrap();
        applied_through(&mut committed, last).await;
        if last > 15 {
            break last;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // A burst of 200 at once while it runs.
    let burst = futures::future::join_all((16..=215).map(|n| bus.publish(alert(n)))).await;
    assert!(burst.iter().all(Result::is_ok));
    let last = nisse_tests::last_input_sequence(&bus, &ops())
        .await
        .unwrap();
    applied_through(&mut committed, last).await;
    // The last batch's ack leaves after its commit is durable.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let info = consumer.info().await.unwrap();
        if info.ack_floor.stream_sequence >= last {
            assert_eq!((info.num_pending, info.num_ack_pending), (0, 0));
            break;
        }
        assert!(
            Instant::now() < deadline,
            "never acked through {last}: {info:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    brain.stop(Duration::from_secs(5)).await.unwrap();
    let mut burst_acks = 0;
    while let Ok(Some(m)) = tokio::time::timeout(Duration::from_millis(200), acks.next()).await {
        // `…AGENT_OPS.brain.<delivered>.<stream seq>.…`
        let tokens: Vec<&str> = m.subject.as_str().split('.').collect();
        let seq = tokens
            .windows(2)
            .position(|w| w == ["AGENT_OPS", "brain"])
            .and_then(|at| tokens.get(at + 3)?.parse::<u64>().ok());
        // An ack is an empty message or `+ACK`; progress and the rest say
        // otherwise.
        let ack = m.payload.is_empty() || &m.payload[..] == b"+ACK";
        if ack && seq.is_some_and(|seq| seq > started) {
            burst_acks += 1;
        }
    }
    assert!(
        (1..100).contains(&burst_acks),
        "200 alerts in a burst were settled by {burst_acks} acks"
    );

    let (titles, findings) = titles_and_findings(&path);
    let expected: Vec<String> = (1..=15).map(|n| format!("A{n:02}")).collect();
    assert_eq!(titles[..15], expected, "the first fifteen in stream order");
    let every: std::collections::BTreeSet<&String> = titles.iter().collect();
    assert_eq!((titles.len(), every.len()), (215, 215), "every alert once");
    assert_eq!(findings, 215, "each alert applied once");
}

/// Under `AckAll` a terminated message acks every earlier one: a brain
/// that took three alerts and an undecodable input, dead-lettered the
/// input on the way and died before applying the alerts has left them
/// acknowledged and never to be delivered again. The brain reads its
/// stream from its own applied position when it starts, so they are
/// applied all the same, each once, and the bad input is passed over.
#[tokio::test]
async fn alerts_acked_ahead_of_the_brain_by_a_dead_letter_are_still_applied() {
    let nats = TestNats::start().await.unwrap();
    let bus = nats.bus(&["ops"]).await.unwrap();
    bus.ensure_topology().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = Store::path_in(dir.path(), "ops");
    publish_all(&bus, 1..=2).await;
    apply_everything(&bus, &path).await;

    publish_all(&bus, 3..=5).await;
    let bad = bus
        .jetstream()
        .publish(
            ops().subject(nisse_bus::SubjectKind::InAlert),
            bytes::Bytes::from_static(b"\x08"),
        )
        .await
        .unwrap()
        .await
        .unwrap()
        .sequence;
    let held = take_from_brain_consumer(&bus, 4).await;
    held[3]
        .ack_with(async_nats::jetstream::AckKind::Term)
        .await
        .unwrap();
    drop(held);
    let mut consumer = brain_consumer(&bus).await;
    let deadline = Instant::now() + Duration::from_secs(5);
    while consumer.info().await.unwrap().ack_floor.stream_sequence < bad {
        assert!(
            Instant::now() < deadline,
            "the termination acked nothing before it"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    apply_everything(&bus, &path).await;
    let (titles, findings) = titles_and_findings(&path);
    let expected: Vec<String> = (1..=5).map(|n| format!("A{n:02}")).collect();
    assert_eq!(titles, expected, "every alert, in stream order");
    assert_eq!(findings, 5, "each alert applied once");
}
