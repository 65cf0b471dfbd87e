use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use pretty_assertions::assert_eq;
use prost::Message as _;
use tokio_util::sync::CancellationToken;

use nisse_bus::proto::{DeadLetter, DeadLetterCause, Envelope, ExecRequest};
use nisse_bus::{
    AgentName, AnyMessage, Bus, ConsumerSpec, Delivery, Handler, Intake, Settled, SubjectKind,
    TopologyChange, Unhandled,
};
use nisse_tests::{Recording, TestNats, exec_request, ops};

async fn ready(nats: &TestNats) -> Bus {
    let bus = nats.bus(&["ops"]).await.unwrap();
    bus.ensure_topology().await.unwrap();
    bus
}

/// The `executor` consumer of the ops stream on `bus`.
async fn executor(bus: &Bus) -> nisse_bus::Consumer<ExecRequest> {
    bus.consumer::<ExecRequest>(&ops(), ConsumerSpec::EXECUTOR)
        .await
        .unwrap()
}

/// Every dead-letter record in the ops stream.
async fn dead_letters(bus: &Bus) -> Vec<DeadLetter> {
    Recording::record(bus, &ops(), 1, None)
        .await
        .unwrap()
        .messages
        .into_iter()
        .filter(|m| m.subject == "nisse.ops.deadletter")
        .map(|m| DeadLetter::decode(m.payload).unwrap())
        .collect()
}

async fn next<T: nisse_bus::Decode>(
    c: &mut nisse_bus::Consumer<T>,
    within: Duration,
) -> Option<Delivery<T>> {
    let token = CancellationToken::new();
    tokio::time::timeout(within, c.next(&token))
        .await
        .ok()
        .flatten()
        .map(|r| r.unwrap())
}

#[tokio::test]
async fn topology_is_created_once_and_then_left_alone_or_updated() {
    let nats = TestNats::start().await.unwrap();
    let bus = nats.bus(&["ops", "dev"]).await.unwrap();

    let first = bus.ensure_topology().await.unwrap();
    let streams: Vec<_> = first
        .streams
        .iter()
        .map(|s| (s.stream.as_str(), s.change))
        .collect();
    assert_eq!(
        streams,
        vec![
            ("AGENT_OPS", TopologyChange::Created),
            ("AGENT_DEV", TopologyChange::Created)
        ]
    );
    assert!(
        first.streams[0]
            .consumers
            .iter()
            .all(|(_, c)| *c == TopologyChange::Created)
    );
    assert_eq!(first.streams[0].consumers.len(), ConsumerSpec::ALL.len());

    let second = bus.ensure_topology().await.unwrap();
    for s in &second.streams {
        assert_eq!(s.change, TopologyChange::Unchanged, "{}", s.stream);
        assert!(
            s.consumers
                .iter()
                .all(|(_, c)| *c == TopologyChange::Unchanged),
            "{s:?}"
        );
    }

    // A changed limit and ack wait update the existing stream and consumers
    // in place, keeping their messages.
    bus.publish(exec_request("kept")).await.unwrap();
    let mut cfg = nats.bus_config();
    cfg.streams.max_age = Duration::from_secs(3600);
    cfg.consumers.ack_wait = Duration::from_secs(7);
    let changed = nats.bus_with(cfg, &["ops"]).await.unwrap();
    let third = changed.ensure_topology().await.unwrap();
    assert_eq!(third.streams[0].change, TopologyChange::Updated);
    assert!(
        third.streams[0]
            .consumers
            .iter()
            .all(|(_, c)| *c == TopologyChange::Updated)
    );
    let mut info = changed.jetstream().get_stream("AGENT_OPS").await.unwrap();
    let info = info.info().await.unwrap();
    assert_eq!(info.config.max_age, Duration::from_secs(3600));
    assert_eq!(info.state.messages, 1);
}

#[tokio::test]
async fn a_duplicate_message_id_is_dropped() {
    let nats = TestNats::start().await.unwrap();
    let bus = ready(&nats).await;

    let first = bus.publish(exec_request("a")).await.unwrap();
    let again = bus.publish(exec_request("a")).await.unwrap();
    assert!(!first.duplicate);
    assert!(again.duplicate);
    assert_eq!(again.sequence, first.sequence);

    let stored = Recording::record(&bus, &ops(), 1, None).await.unwrap();
    assert_eq!(stored.messages.len(), 1);
    assert_eq!(stored.messages[0].header("Nats-Msg-Id"), Some("exec:a"));
    assert_eq!(
        stored.messages[0].header("Nisse-Type"),
        Some("nisse.v1.ExecRequest")
    );
}

#[tokio::test]
async fn a_message_is_redelivered_when_its_consumer_dies_before_ack() {
    let nats = TestNats::start().await.unwrap();
    let bus = ready(&nats).await;
    bus.publish(exec_request("x")).await.unwrap();

    // First instance takes it and dies (its connection goes) without acking.
    {
        let crashing = nats.bus(&["ops"]).await.unwrap();
        let mut c = executor(&crashing).await;
        let d = next(&mut c, Duration::from_secs(5))
            .await
            .expect("first delivery");
        assert_eq!(d.message().request_id, "x");
        assert_eq!(d.delivered(), 1);
        drop(d);
        drop(c);
        crashing.client().drain().await.unwrap();
    }

    // Another instance gets it again once the ack wait (1 s) has passed.
    let survivor = nats.bus(&["ops"]).await.unwrap();
    let mut c = executor(&survivor).await;
    let d = next(&mut c, Duration::from_secs(5))
        .await
        .expect("redelivery");
    assert_eq!(d.message().request_id, "x");
    assert_eq!(d.delivered(), 2);
    d.ack_confirmed().await.unwrap();
    assert!(
        next(&mut c, Duration::from_millis(1500)).await.is_none(),
        "acked: no third delivery"
    );
}

#[tokio::test]
async fn two_instances_share_a_consumer_without_loss_or_duplication() {
    let nats = TestNats::start().await.unwrap();
    let publisher = ready(&nats).await;
    let mut cfg = nats.bus_config();
    cfg.consumers.ack_wait = Duration::from_secs(30);
    // Small batches so the two instances interleave.
    cfg.consumers.max_ack_pending = 16;
    publisher.ensure_topology().await.ok();
    let setup = nats.bus_with(cfg.clone(), &["ops"]).await.unwrap();
    setup.ensure_topology().await.unwrap();

    const N: usize = 1000;
    let token = CancellationToken::new();
    let mut tasks = Vec::new();
    for instance in 0..2 {
        let bus = nats.bus_with(cfg.clone(), &["ops"]).await.unwrap();
        let token = token.clone();
        tasks.push(tokio::spawn(async move {
            let mut c = executor(&bus).await;
            let mut seen = Vec::new();
            while let Some(d) = c.next(&token).await {
                let d = d.unwrap();
                seen.push(d.message().request_id.clone());
                d.ack().await.unwrap();
                // Let the other instance have a turn at the server.
                if seen.len() % 8 == 0 {
                    tokio::task::yield_now().await;
                }
            }
            bus.flush().await.unwrap();
            (instance, seen)
        }));
    }
    for i in 0..N {
        publisher
            .publish(exec_request(&i.to_string()))
            .await
            .unwrap();
    }

    // Wait until the consumer has everything acked.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let stream = publisher.jetstream().get_stream("AGENT_OPS").await.unwrap();
        let info = stream.consumer_info("executor").await.unwrap();
        if info.num_pending == 0
            && info.num_ack_pending == 0
            && info.ack_floor.stream_sequence as usize >= N
        {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not all acked: {info:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    token.cancel();
    let mut per_instance = BTreeMap::new();
    let mut all = Vec::new();
    for t in tasks {
        let (instance, seen) = t.await.unwrap();
        per_instance.insert(instance, seen.len());
        all.extend(seen);
    }
    let unique: HashSet<_> = all.iter().cloned().collect();
    assert_eq!(
        all.len(),
        N,
        "every message handled exactly once: {per_instance:?}"
    );
    assert_eq!(unique.len(), N);
    assert!(
        per_instance.values().all(|n| *n > 0),
        "both instances did work: {per_instance:?}"
    );
}

#[tokio::test]
async fn poison_is_dead_lettered_with_its_reason_and_the_consumer_goes_on() {
    let nats = TestNats::start().await.unwrap();
    let bus = ready(&nats).await;
    let js = bus.jetstream();

    // Not protobuf at all.
    js.publish(
        "nisse.ops.out.exec.req",
        bytes::Bytes::from_static(b"\xff\xff\xff garbage"),
    )
    .await
    .unwrap()
    .await
    .unwrap();
    // Valid protobuf, but no envelope.
    let no_env = ExecRequest {
        request_id: "naked".into(),
        ..Default::default()
    };
    js.publish("nisse.ops.out.exec.req", no_env.encode_to_vec().into())
        .await
        .unwrap()
        .await
        .unwrap();
    // Addressed to another agent but sitting in the ops stream.
    let mut wrong = exec_request("wrong-agent");
    wrong.envelope.as_mut().unwrap().agent = "dev".into();
    js.publish("nisse.ops.out.exec.req", wrong.encode_to_vec().into())
        .await
        .unwrap()
        .await
        .unwrap();
    // And a good one after them.
    bus.publish(exec_request("good")).await.unwrap();

    let mut c = executor(&bus).await;
    let d = next(&mut c, Duration::from_secs(5))
        .await
        .expect("the good message");
    assert_eq!(d.message().request_id, "good");
    d.ack().await.unwrap();
    assert!(
        next(&mut c, Duration::from_millis(1500)).await.is_none(),
        "poison is never redelivered"
    );

    let dl = dead_letters(&bus).await;
    let summary: Vec<_> = dl
        .iter()
        .map(|d| {
            (
                d.original_stream_sequence,
                d.cause(),
                d.consumer.as_str(),
                d.deliveries,
            )
        })
        .collect();
    assert_eq!(
        summary,
        vec![
            (1, DeadLetterCause::Undecodable, "executor", 1),
            (2, DeadLetterCause::Invalid, "executor", 1),
            (3, DeadLetterCause::Invalid, "executor", 1),
        ]
    );
    assert!(
        dl[0].reason.contains("nisse.v1.ExecRequest"),
        "{}",
        dl[0].reason
    );
    assert_eq!(dl[0].original_payload, b"\xff\xff\xff garbage".to_vec());
    assert_eq!(dl[0].original_subject, "nisse.ops.out.exec.req");
    assert!(dl[1].reason.contains("envelope"), "{}", dl[1].reason);
    assert!(dl[2].reason.contains("`dev`"), "{}", dl[2].reason);
}

#[tokio::test]
async fn an_unknown_subject_in_the_stream_is_dead_lettered_by_the_brain() {
    let nats = TestNats::start().await.unwrap();
    let bus = ready(&nats).await;
    bus.jetstream()
        .publish("nisse.ops.in.fax", bytes::Bytes::from_static(b"hello"))
        .await
        .unwrap()
        .await
        .unwrap();
    bus.publish(nisse_bus::proto::ExecResult {
        envelope: Some(Envelope {
            agent: "ops".into(),
            message_id: "result:after".into(),
            ..Default::default()
        }),
        request_id: "after".into(),
        ..Default::default()
    })
    .await
    .unwrap();

    let mut brain = bus
        .consumer::<AnyMessage>(&ops(), ConsumerSpec::BRAIN)
        .await
        .unwrap();
    let d = next(&mut brain, Duration::from_secs(5)).await.unwrap();
    assert_eq!(d.kind(), SubjectKind::ExecResult);
    d.ack().await.unwrap();
    // The stream holds the dead letter, recorded by the brain's consumer.
    let dl = dead_letters(&bus).await;
    assert_eq!(dl.len(), 1, "{dl:?}");
    assert_eq!(dl[0].cause(), DeadLetterCause::UnknownSubject);
    assert_eq!(dl[0].consumer, "brain");
    assert_eq!(dl[0].original_subject, "nisse.ops.in.fax");
}

/// What a handler whose target is away returns: retry later.
fn flaky() -> Unhandled {
    Unhandled::retry("ssh target unreachable")
}

#[tokio::test]
async fn a_message_that_keeps_failing_is_dead_lettered_after_max_deliver() {
    let nats = TestNats::start().await.unwrap();
    let bus = ready(&nats).await;
    bus.publish(exec_request("doomed")).await.unwrap();

    let mut c = executor(&bus).await;
    let mut outcomes = Vec::new();
    while let Some(d) = next(&mut c, Duration::from_secs(3)).await {
        outcomes.push((d.delivered(), d.settle(Err(flaky())).await.unwrap()));
    }
    // max_deliver is 3: two retries with the configured backoff, then the
    // third failure dead-letters instead of retrying.
    assert_eq!(
        outcomes,
        vec![
            (1, Settled::Retrying(Duration::from_millis(50))),
            (2, Settled::Retrying(Duration::from_millis(100))),
            (3, Settled::DeadLettered),
        ]
    );
    let dl = dead_letters(&bus).await;
    assert_eq!(dl.len(), 1);
    assert_eq!(dl[0].cause(), DeadLetterCause::MaxDeliveries);
    assert_eq!(dl[0].deliveries, 3);
    assert!(
        dl[0].reason.contains("ssh target unreachable"),
        "{}",
        dl[0].reason
    );
}

#[tokio::test]
async fn a_message_that_crashes_its_handler_every_time_is_dead_lettered() {
    let nats = TestNats::start().await.unwrap();
    let bus = ready(&nats).await;
    bus.publish(exec_request("crasher")).await.unwrap();

    // Three instances in a row take it and die without settling it.
    for attempt in 1..=3u64 {
        let doomed = nats.bus(&["ops"]).await.unwrap();
        let mut c = executor(&doomed).await;
        let d = next(&mut c, Duration::from_secs(5))
            .await
            .expect("delivery");
        assert_eq!(d.delivered(), attempt);
        drop(d);
        drop(c);
        doomed.client().drain().await.unwrap();
    }
    // The fourth delivery is never handed out: it is recorded as dead.
    let mut c = executor(&bus).await;
    assert!(next(&mut c, Duration::from_secs(3)).await.is_none());
    let dl = dead_letters(&bus).await;
    assert_eq!(dl.len(), 1);
    assert_eq!(dl[0].cause(), DeadLetterCause::MaxDeliveries);
    assert_eq!(dl[0].deliveries, 4);
    let original = ExecRequest::decode(&dl[0].original_payload[..]).unwrap();
    assert_eq!(original.request_id, "crasher");
    assert_eq!(
        dl[0].envelope.as_ref().unwrap().causation_id,
        "exec:crasher"
    );
}

#[tokio::test]
async fn the_brain_reads_its_inputs_in_order_and_none_of_its_outputs() {
    let nats = TestNats::start().await.unwrap();
    let bus = ready(&nats).await;
    // Its own request (an output), then the executor's reply (an input).
    bus.publish(exec_request("1")).await.unwrap();
    bus.publish(nisse_bus::proto::ExecResult {
        envelope: Some(Envelope {
            agent: "ops".into(),
            message_id: "exec-result:1".into(),
            causation_id: "exec:1".into(),
            ..Default::default()
        }),
        request_id: "1".into(),
        status: nisse_bus::proto::ExecStatus::Completed as i32,
        stdout: b"up 3 days".to_vec(),
        ..Default::default()
    })
    .await
    .unwrap();

    let mut brain = bus
        .consumer::<AnyMessage>(&ops(), ConsumerSpec::BRAIN)
        .await
        .unwrap();
    let mut kinds = Vec::new();
    while let Some(d) = next(&mut brain, Duration::from_secs(2)).await {
        kinds.push((d.stream_sequence(), d.kind()));
        d.ack().await.unwrap();
    }
    assert_eq!(kinds, vec![(2, SubjectKind::ExecResult)]);
}

#[tokio::test]
async fn work_resumes_after_the_server_is_killed_and_restarted() {
    let mut nats = TestNats::start().await.unwrap();
    let mut cfg = nats.bus_config();
    cfg.request_timeout = Duration::from_secs(1);
    let bus = nats.bus_with(cfg, &["ops"]).await.unwrap();
    bus.ensure_topology().await.unwrap();
    bus.publish(exec_request("before")).await.unwrap();

    nats.kill().await.unwrap();
    // While it is gone a publish fails (and says so) rather than hanging.
    let err = bus.publish(exec_request("during")).await.unwrap_err();
    assert!(matches!(err, nisse_bus::Error::Publish { .. }), "{err}");

    nats.restart().await.unwrap();
    // The same connection reconnects; the stored message survived the
    // crash and the retried publish goes through.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while bus.publish(exec_request("during")).await.is_err() {
        assert!(tokio::time::Instant::now() < deadline, "no reconnect");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut c = executor(&bus).await;
    let mut got = Vec::new();
    while let Some(d) = next(&mut c, Duration::from_secs(3)).await {
        got.push(d.message().request_id.clone());
        d.ack().await.unwrap();
    }
    assert_eq!(got, vec!["before", "during"]);
}

#[tokio::test]
async fn a_recorded_range_replays_onto_another_server_as_it_was() {
    let source = TestNats::start().await.unwrap();
    let bus = ready(&source).await;
    for i in 0..5 {
        bus.publish(exec_request(&i.to_string())).await.unwrap();
    }
    let recording = Recording::record(&bus, &ops(), 2, Some(4)).await.unwrap();
    let seqs: Vec<u64> = recording.messages.iter().map(|m| m.sequence).collect();
    assert_eq!(seqs, vec![2, 3, 4]);

    let target = TestNats::start().await.unwrap();
    let replica = ready(&target).await;
    recording.replay(&replica).await.unwrap();
    // Replaying twice changes nothing: the dedup ids came along.
    recording.replay(&replica).await.unwrap();
    let copied = Recording::record(&replica, &ops(), 1, None).await.unwrap();
    let decoded: Vec<AnyMessage> = copied
        .messages
        .iter()
        .map(|m| m.decode().unwrap())
        .collect();
    let want: Vec<AnyMessage> = recording
        .messages
        .iter()
        .map(|m| m.decode().unwrap())
        .collect();
    assert_eq!(decoded, want);
    assert_eq!(copied.messages.len(), 3);
}

#[tokio::test]
async fn a_long_handler_keeps_its_message_with_progress_acks() {
    let nats = TestNats::start().await.unwrap();
    let bus = ready(&nats).await;
    bus.publish(exec_request("slow")).await.unwrap();

    let mut a = executor(&bus).await;
    let d = next(&mut a, Duration::from_secs(5)).await.unwrap();

    // Another instance polls while the first works for three ack waits.
    let other = nats.bus(&["ops"]).await.unwrap();
    let mut b = executor(&other).await;
    let stolen = tokio::spawn(async move {
        next(&mut b, Duration::from_millis(3500))
            .await
            .map(|d| d.delivered())
    });
    d.keep_alive(tokio::time::sleep(Duration::from_secs(3)))
        .await;
    d.ack_confirmed().await.unwrap();
    assert_eq!(
        stolen.await.unwrap(),
        None,
        "the message was redelivered while still being handled"
    );
}

#[tokio::test]
async fn a_service_stopped_mid_message_finishes_it_and_leaves_the_rest_for_the_next() {
    let nats = TestNats::start().await.unwrap();
    let bus = ready(&nats).await;
    for i in 0..5 {
        bus.publish(exec_request(&i.to_string())).await.unwrap();
    }

    let (started_tx, mut started) = tokio::sync::mpsc::unbounded_channel();
    let (done_tx, mut done) = tokio::sync::mpsc::unbounded_channel();
    let service_bus = nats.bus(&["ops"]).await.unwrap();
    /// Takes half a second per message.
    struct Slow {
        started: tokio::sync::mpsc::UnboundedSender<String>,
        done: tokio::sync::mpsc::UnboundedSender<String>,
    }
    impl Handler<ExecRequest> for Slow {
        async fn handle(
            &self,
            _agent: &AgentName,
            d: &Delivery<ExecRequest>,
        ) -> Result<(), Unhandled> {
            let _ = self.started.send(d.message().request_id.clone());
            tokio::time::sleep(Duration::from_millis(500)).await;
            let _ = self.done.send(d.message().request_id.clone());
            Ok(())
        }
    }
    // The service skeleton every service runs on: take until shutdown,
    // handle, settle.
    let service = nisse_tests::InProcess::spawn(move |shutdown| async move {
        let ctx = nisse_tests::service_context(&service_bus, (), shutdown);
        let slow = std::sync::Arc::new(Slow {
            started: started_tx,
            done: done_tx,
        });
        let intake = Intake {
            consumer: ConsumerSpec::EXECUTOR,
            in_flight: 1,
        };
        nisse_bus::serve(&ctx, intake, vec![(ops(), slow)]).await?;
        service_bus.flush().await?;
        Ok(())
    });
    let first = started.recv().await.unwrap();
    service.stop(Duration::from_secs(5)).await.unwrap();
    assert_eq!(
        done.recv().await,
        Some(first.clone()),
        "the in-flight message was finished"
    );
    assert!(
        done.try_recv().is_err(),
        "nothing after the stop was handled"
    );

    // A new instance gets everything else, once the ack wait has returned
    // what the stopped one had fetched ahead: nothing lost, nothing twice.
    let mut c = executor(&bus).await;
    let mut rest = Vec::new();
    while let Some(d) = next(&mut c, Duration::from_secs(3)).await {
        rest.push(d.message().request_id.clone());
        d.ack().await.unwrap();
    }
    rest.sort();
    let mut want: Vec<String> = (0..5)
        .map(|i| i.to_string())
        .filter(|i| *i != first)
        .collect();
    want.sort();
    assert_eq!(rest, want);
}

#[tokio::test]
async fn credentials_from_config_are_used_and_a_refusal_is_explained() {
    let nats = TestNats::start_with(&["--user", "nisse-ops", "--pass", "s3cret"])
        .await
        .unwrap();

    let mut cfg = nats.bus_config();
    cfg.user = Some("nisse-ops".into());
    cfg.password = Some("s3cret".into());
    let bus = nats.bus_with(cfg.clone(), &["ops"]).await.unwrap();
    bus.ensure_topology().await.unwrap();
    assert!(!bus.publish(exec_request("authed")).await.unwrap().duplicate);

    cfg.password = Some("wrong".into());
    let err = nats.bus_with(cfg, &["ops"]).await.unwrap_err().to_string();
    assert!(err.contains(nats.url()), "{err}");
    assert!(err.to_lowercase().contains("authorization"), "{err}");
}

#[tokio::test]
async fn tls_settings_from_config_are_used_and_an_unknown_ca_is_refused() {
    let certs_dir = tempfile::tempdir().unwrap();
    let tls = nisse_tests::TestTls::generate(certs_dir.path()).unwrap();
    let nats = TestNats::start_with(&tls.server_args()).await.unwrap();

    let mut cfg = nats.bus_config();
    cfg.tls.required = true;
    cfg.tls.ca_file = Some(tls.ca_file.clone());
    let bus = nats.bus_with(cfg.clone(), &["ops"]).await.unwrap();
    bus.ensure_topology().await.unwrap();
    bus.publish(exec_request("over-tls")).await.unwrap();

    // Without the CA the server's certificate is not trusted.
    cfg.tls.ca_file = None;
    let err = nats.bus_with(cfg, &["ops"]).await.unwrap_err().to_string();
    assert!(err.contains("cannot connect to NATS"), "{err}");
    assert!(
        err.to_lowercase().contains("tls") || err.contains("certificate"),
        "{err}"
    );
}

/// A stream made before subjects said direction: its consumers are moved
/// to their new filters from where they stood, and the messages it holds
/// on the old subjects still read back as their kinds.
#[tokio::test]
async fn consumers_made_before_subjects_said_direction_move_and_old_messages_still_read() {
    use async_nats::jetstream::consumer;
    use futures::StreamExt as _;
    let nats = TestNats::start().await.unwrap();
    let bus = ready(&nats).await;
    let js = bus.jetstream();
    let stream = js.get_stream("AGENT_OPS").await.unwrap();
    // The consumers as an earlier build made them.
    for (name, filter) in [("brain", "nisse.ops.>"), ("executor", "nisse.ops.exec.req")] {
        stream.delete_consumer(name).await.unwrap();
        stream
            .create_consumer(consumer::pull::Config {
                durable_name: Some(name.into()),
                filter_subject: filter.into(),
                ack_policy: consumer::AckPolicy::Explicit,
                ..Default::default()
            })
            .await
            .unwrap();
    }
    // The old brain took and settled the first message, not the second.
    for n in 1..=2 {
        let verdict = nisse_bus::proto::ClassifyVerdict {
            envelope: Some(Envelope {
                agent: "ops".into(),
                message_id: format!("verdict:{n}"),
                ..Default::default()
            }),
            request_id: n.to_string(),
            ..Default::default()
        };
        js.publish("nisse.ops.classify.verdict", verdict.encode_to_vec().into())
            .await
            .unwrap()
            .await
            .unwrap();
    }
    let old: consumer::PullConsumer = stream.get_consumer("brain").await.unwrap();
    let mut batch = old.fetch().max_messages(1).messages().await.unwrap();
    batch
        .next()
        .await
        .unwrap()
        .unwrap()
        .double_ack()
        .await
        .unwrap();
    drop(batch);

    let report = bus.ensure_topology().await.unwrap();
    let changes: BTreeMap<&str, TopologyChange> = report.streams[0]
        .consumers
        .iter()
        .map(|(n, c)| (n.as_str(), *c))
        .collect();
    assert_eq!(changes["brain"], TopologyChange::Updated);
    assert_eq!(changes["executor"], TopologyChange::Updated);
    for (name, filter) in [
        ("brain", "nisse.ops.in.>"),
        ("executor", "nisse.ops.out.exec.req"),
    ] {
        let mut c: consumer::PullConsumer = stream.get_consumer(name).await.unwrap();
        assert_eq!(c.info().await.unwrap().config.filter_subject, filter);
    }
    // Nothing settled is handed out again: the new brain consumer starts
    // after what the old one had settled (the brain reads what lies
    // between its own position and its first delivery from the stream).
    let mut c: consumer::PullConsumer = stream.get_consumer("brain").await.unwrap();
    assert_eq!(
        c.info().await.unwrap().config.deliver_policy,
        consumer::DeliverPolicy::ByStartSequence { start_sequence: 2 }
    );

    // What the old subjects hold reads back as its kind (replay, rebuild).
    let recorded = Recording::record(&bus, &ops(), 1, None).await.unwrap();
    let kinds: Vec<SubjectKind> = recorded
        .messages
        .iter()
        .map(|m| m.decode().unwrap().kind())
        .collect();
    assert_eq!(kinds, [SubjectKind::ClassifyVerdict; 2]);
}

/// A reader behind the walls (the control plane's identity, which may
/// create no named consumer and delete none) follows an agent's stream
/// across a restart of its server, which loses the reader's consumer: it
/// reads on from where it was, nothing missed and nothing twice.
#[tokio::test]
async fn a_follower_behind_the_walls_reads_on_after_its_server_restarts() {
    let mut plan = nisse_tests::local_plan(&["ops"], &[]).unwrap();
    plan.control
        .insert("alice".parse().unwrap(), [ops()].into());
    let mut nats = TestNats::with_auth(&plan).await.unwrap();
    let admin = ready(&nats).await;
    let control = nats
        .bus_as(&nisse_bus::auth::Identity::Control, &["ops"])
        .await
        .unwrap();
    for n in 0..20 {
        admin
            .publish(exec_request(&format!("before-{n}")))
            .await
            .unwrap();
    }
    let mut follower = control.follow(&ops(), 1).await.unwrap();
    let mut read = Vec::new();
    let mut take = async |read: &mut Vec<u64>, until: u64| {
        while read.len() < until as usize {
            let m = tokio::time::timeout(Duration::from_secs(30), follower.next())
                .await
                .expect("the follower read on in time")
                .expect("a follower never ends")
                .unwrap();
            read.push(m.sequence);
        }
    };
    take(&mut read, 20).await;
    nats.restart().await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    for n in 0..20 {
        // Published again until the reconnected server stores it.
        while admin
            .publish(exec_request(&format!("after-{n}")))
            .await
            .is_err()
        {
            assert!(std::time::Instant::now() < deadline, "never stored again");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    take(&mut read, 40).await;
    assert_eq!(read, (1..=40).collect::<Vec<u64>>());
}
