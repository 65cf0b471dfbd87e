//! Time on the stream, end to end, each group of services in its own
//! `nisse serve` process on a secured NATS: scheduled checks over real
//! HTTP, TLS, TCP and OpenSSH servers opening and resolving work items;
//! a classifier that does not answer in time; an approval request that
//! expires and the switch to the next item with no other traffic; an
//! alert gone stale when Alertmanager stops; a brain killed while ticks
//! and due duties pile up.

use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use pretty_assertions::assert_eq;

use nisse_bus::AnyMessage;
use nisse_core::plans::PlanStatus;
use nisse_core::{Event, State};
use nisse_tests::TestNats;
use nisse_tests::alertmanager::{TestAlertmanager, Webhook, WebhookAuth, firing};
use nisse_tests::sshd::TestSshd;
use nisse_tests::web::{TestTls, TestWeb, closed_port};

use super::alerts::{Install, TOKEN, publish_alert, rebuild, stop, wait_quiet};
use super::gates::{cli, stream_kinds};
use super::signal;

/// An install on `nats` whose configuration has `extra` appended, with the
/// topology made; nothing started yet.
async fn install(nats: &TestNats, bus: nisse_bus::BusConfig, extra: &str) -> Install {
    nats.bus_with(bus, &["ops"])
        .await
        .unwrap()
        .ensure_topology()
        .await
        .unwrap();
    let install = Install::new(nats);
    append(&install, extra);
    install
}

/// The executor's section for host `tool`, reached at `sshd`.
fn executor_section(install: &Install, sshd: &TestSshd) -> String {
    let known_hosts = install.path().join("known_hosts");
    sshd.write_known_hosts(&known_hosts, "127.0.0.1").unwrap();
    format!(
        "[executor.agents.ops]\n\
         key-file = {key:?}\n\
         known-hosts = {known:?}\n\
         [executor.agents.ops.hosts.tool]\n\
         address = \"127.0.0.1\"\n\
         port = {port}\n\
         user = {user:?}\n",
        key = sshd.client_key().display().to_string(),
        known = known_hosts.display().to_string(),
        port = sshd.port(),
        user = sshd.user(),
    )
}

/// What the agent said in its room, in order.
fn said(messages: &[AnyMessage]) -> Vec<String> {
    messages
        .iter()
        .filter_map(|m| match m {
            AnyMessage::Tell(t) => Some(t.markdown.clone()),
            _ => None,
        })
        .collect()
}

/// Stops `processes` in order (time first, then the services, which
/// finish what they hold while the brain still applies it), then checks
/// that the brain's state rebuilt from its stream equals the live one.
async fn stop_and_rebuild(
    install: &Install,
    nats: &TestNats,
    processes: &mut [&mut tokio::process::Child],
) {
    for p in processes.iter_mut() {
        stop(p).await;
    }
    let live = wait_quiet(install, nats).await;
    let (_, rebuilt, _) = rebuild(install).await;
    assert_eq!(rebuilt, live);
}

/// What the agent said in its room, once a few more ticks went by (so a
/// message said again would be there too).
async fn said_after_ticks(nats: &TestNats, wait: Duration) -> Vec<String> {
    tokio::time::sleep(wait).await;
    said(&stream_kinds(nats).await)
}

/// How many of `told` contain `needle`.
fn count(told: &[String], needle: &str) -> usize {
    told.iter().filter(|t| t.contains(needle)).count()
}

/// Item `#n`.
fn item(s: &nisse_core::Snapshot, n: i64) -> &nisse_core::WorkItem {
    s.items
        .iter()
        .find(|i| i.number == n)
        .unwrap_or_else(|| panic!("no item #{n}: {:?}", s.items))
}

/// The items whose title starts with `prefix`.
fn titled<'a>(s: &'a nisse_core::Snapshot, prefix: &str) -> Vec<&'a nisse_core::WorkItem> {
    s.items
        .iter()
        .filter(|i| i.title.starts_with(prefix))
        .collect()
}

fn finding_statuses(s: &nisse_core::Snapshot, item: &str) -> Vec<String> {
    s.events
        .iter()
        .filter(|e| e.work_item_id == item)
        .filter_map(|e| match &e.event {
            Event::Finding { status, .. } => Some(status.clone()),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn scheduled_checks_over_real_servers_open_one_item_per_problem_and_resolve_it() {
    let nats = TestNats::secured(&["ops"]).await.unwrap();
    let sshd = TestSshd::start().await.unwrap();
    let web = TestWeb::start().await.unwrap();
    let tls = TestTls::start(3).await.unwrap();
    let closed = closed_port().await.unwrap();
    let mut bus = nats.bus_config();
    bus.streams.duplicate_window = Duration::from_secs(5);
    let probe = |name: &str, kind: &str, fields: &str| {
        format!(
            "[[ops.duty]]\nname = {name:?}\nkind = {kind:?}\ninterval = \"1s\"\ntimeout = \"3s\"\n{fields}\n"
        )
    };
    let install = install(&nats, bus, "").await;
    let mut extra = format!(
        "[scheduler]\ntick = \"500ms\"\n[ops]\nstarter-duties = false\n{}",
        executor_section(&install, &sshd)
    );
    extra.push_str(&probe(
        "web",
        "http",
        &format!(
            "url = {:?}\nfail-after = 2\nrecover-after = 2\nseverity = \"critical\"",
            web.url("/health")
        ),
    ));
    extra.push_str(&probe(
        "cert",
        "tls",
        &format!(
            "host = \"127.0.0.1\"\nport = {}\nserver-name = \"localhost\"\nca-file = {:?}\nmin-days-left = 14\nfail-after = 1",
            tls.addr.port(),
            tls.ca_file
        ),
    ));
    extra.push_str(&probe(
        "gone",
        "tcp",
        &format!("host = \"127.0.0.1\"\nport = {closed}\nfail-after = 1"),
    ));
    // The real root filesystem is surely more than 1% used.
    extra.push_str(&probe(
        "tool-disk",
        "disk",
        "host = \"tool\"\nmount = \"/\"\nmax-used-percent = 1\nfail-after = 1",
    ));
    extra.push_str(&probe(
        "tool-script",
        "ssh-script",
        "host = \"tool\"\ncommand = \"test -e /nonexistent/nisse-check\"\nfail-after = 1",
    ));
    append(&install, &extra);
    let mut brain = install.serve(&["brain"]);
    let mut services = install.serve(&["prober", "classifier", "executor"]);
    let mut scheduler = install.serve(&["scheduler"]);

    // Four checks fail from the start: one item each, with what was found.
    let s = install
        .wait_until("four check items", Duration::from_secs(40), |s| {
            ["cert", "gone", "tool-disk", "tool-script"]
                .iter()
                .all(|d| !titled(s, &format!("{d} failing")).is_empty())
        })
        .await;
    let cert = titled(&s, "cert failing")[0];
    assert!(
        cert.title.contains("expires in 2 days") || cert.title.contains("expires in 3 days"),
        "{}",
        cert.title
    );
    assert!(cert.title.contains("at least 14 wanted"), "{}", cert.title);
    assert_eq!(cert.severity.as_deref(), Some("warning"));
    let days = s
        .events
        .iter()
        .find_map(|e| match &e.event {
            Event::Finding { duty, detail, .. } if duty == "cert" => detail["days_left"].as_i64(),
            _ => None,
        })
        .unwrap();
    assert!((2..=3).contains(&days), "{days}");
    let gone = titled(&s, "gone failing")[0];
    assert!(gone.title.contains("refused"), "{}", gone.title);
    let disk = titled(&s, "tool-disk failing")[0];
    assert!(disk.title.contains("/ on tool is"), "{}", disk.title);
    assert!(disk.title.contains("(at most 1% wanted)"), "{}", disk.title);
    let script = titled(&s, "tool-script failing")[0];
    assert!(
        script.title.contains("exited 1 (expected 0)"),
        "{}",
        script.title
    );
    assert!(
        titled(&s, "web failing").is_empty(),
        "the web page answers 200"
    );

    // The page starts failing: after two failed runs one item, however
    // many runs fail after that.
    web.set_status(500);
    let s = install
        .wait_until("the web item opened", Duration::from_secs(20), |s| {
            !titled(s, "web failing").is_empty()
        })
        .await;
    let web_item = titled(&s, "web failing")[0].clone();
    assert!(web_item.title.contains("HTTP 500"), "{}", web_item.title);
    assert_eq!(web_item.severity.as_deref(), Some("critical"));
    install
        .wait_until("repeats attach", Duration::from_secs(20), |s| {
            finding_statuses(s, &web_item.id).len() >= 3
        })
        .await;

    // It recovers: two passing runs resolve and close the same item.
    web.set_status(200);
    let s = install
        .wait_until("the web item closed", Duration::from_secs(20), |s| {
            s.items
                .iter()
                .any(|i| i.id == web_item.id && i.state == State::Closed)
        })
        .await;
    assert_eq!(titled(&s, "web failing").len(), 1, "no second item");
    let statuses = finding_statuses(&s, &web_item.id);
    assert_eq!(statuses.first().map(String::as_str), Some("firing"));
    assert_eq!(statuses.last().map(String::as_str), Some("resolved"));
    let evidence = s
        .events
        .iter()
        .rev()
        .find_map(|e| match &e.event {
            Event::Finding { status, detail, .. }
                if e.work_item_id == web_item.id && status == "resolved" =>
            {
                Some(detail.clone())
            }
            _ => None,
        })
        .unwrap();
    assert_eq!(evidence["status_code"], 200, "{evidence}");
    assert_eq!(evidence["successes_in_row"], 2, "{evidence}");

    // The operator's view: every duty with its runs, and a run on demand.
    let listed: serde_json::Value =
        serde_json::from_str(&cli(&install, &["duties", "--json"]).await).unwrap();
    let duties = listed["duties"].as_array().unwrap();
    assert_eq!(duties.len(), 5, "{listed}");
    for d in duties {
        assert!(d["runs"].as_u64().unwrap() >= 1, "{d}");
        assert!(d["next_due"].is_string(), "{d}");
    }
    let disk_row = duties.iter().find(|d| d["name"] == "tool-disk").unwrap();
    assert_eq!(disk_row["failing"], true);
    assert_eq!(disk_row["last_result"], "fail");
    let out = cli(&install, &["duty", "run", "web"]).await;
    assert!(out.contains("duty web: run"), "{out}");
    let refused = super::run(nisse(&install).args(["duty", "run", "nope"])).await;
    assert!(!refused.status.success());
    assert!(
        super::text(&refused.stderr).contains(
            "there is no duty `nope`; the duties are: cert, gone, tool-disk, tool-script, web"
        ),
        "{}",
        super::text(&refused.stderr)
    );
    let streams = cli(&install, &["streams"]).await;
    assert!(streams.contains("duty web"), "{streams}");

    // Everything the brain knows came from its stream. Time stops first,
    // then the services finish what they have, while the brain applies it.
    stop_and_rebuild(
        &install,
        &nats,
        &mut [&mut scheduler, &mut services, &mut brain],
    )
    .await;
}

fn append(install: &Install, extra: &str) {
    let cfg = install.path().join("nisse.toml");
    let mut text = std::fs::read_to_string(&cfg).unwrap();
    text.push_str(extra);
    std::fs::write(&cfg, text).unwrap();
}

fn nisse(install: &Install) -> tokio::process::Command {
    super::nisse(install.path())
}

#[tokio::test]
async fn a_classifier_that_does_not_answer_in_time_leaves_the_item_waiting_with_the_reason_until_retry()
 {
    let nats = TestNats::secured(&["ops"]).await.unwrap();
    let install = install(
        &nats,
        nats.bus_config(),
        "[scheduler]\ntick = \"500ms\"\n[ops]\nstarter-duties = false\n[ops.deadlines]\nclassify = \"2s\"\n",
    )
    .await;
    let mut brain = install.serve(&["brain"]);
    let mut scheduler = install.serve(&["scheduler"]);
    publish_alert(&nats, "DiskFull", "nas01").await;
    install
        .wait_until("item #1 exists", Duration::from_secs(20), |s| {
            s.items.len() == 1
        })
        .await;
    std::fs::write(
        install.path().join("plan.toml"),
        "rationale = \"make room\"\n\n[[step]]\ntarget = \"nas01\"\ncommand = \"zfs snapshot tank/media@before\"\n",
    )
    .unwrap();
    cli(&install, &["plan", "propose", "1", "plan.toml"]).await;

    // No classifier runs: at the first tick past the deadline the item
    // waits on the operator, saying why, once.
    let s = install
        .wait_until("the item waits", Duration::from_secs(20), |s| {
            item(s, 1).state == State::WaitingOnOperator
        })
        .await;
    let reason = s
        .events
        .iter()
        .find_map(|e| match &e.event {
            Event::Fact { text, data } if data.get("deadline_passed").is_some() => {
                Some(text.clone())
            }
            _ => None,
        })
        .unwrap();
    assert!(
        reason.starts_with("the classifier did not answer within 2s"),
        "{reason}"
    );
    let told: Vec<String> = said_after_ticks(&nats, Duration::from_secs(2))
        .await
        .into_iter()
        .filter(|t| t.contains("did not answer within"))
        .collect();
    assert_eq!(told.len(), 1, "{told:?}");
    assert!(told[0].contains("`retry`"), "{}", told[0]);

    // The classifier starts and answers: late, so recorded and not acted
    // on — the plan is not put up.
    let mut classifier = install.serve(&["classifier"]);
    install
        .wait_until("the late verdict is recorded", Duration::from_secs(20), |s| {
            s.events
                .iter()
                .any(|e| matches!(&e.event, Event::Fact { data, .. } if data.get("late_answer").is_some()))
        })
        .await;
    let s = wait_quiet(&install, &nats).await;
    assert_eq!(s.plans[0].status, PlanStatus::Proposed);
    assert_eq!(item(&s, 1).state, State::WaitingOnOperator);

    // `retry` applies the kept answer: the plan goes up for approval.
    let out = cli(&install, &["retry", "1"]).await;
    assert!(out.contains("retry: the late answer to"), "{out}");
    let s = install
        .wait_until("rev-1 is up", Duration::from_secs(20), |s| {
            s.plans[0].status == PlanStatus::Up
        })
        .await;
    assert_eq!(
        item(&s, 1).state,
        State::WaitingOnOperator,
        "waiting for approval now"
    );
    let again = super::run(nisse(&install).args(["retry", "1"])).await;
    assert!(!again.status.success());
    assert!(
        super::text(&again.stderr).contains("nothing to retry"),
        "{}",
        super::text(&again.stderr)
    );

    stop_and_rebuild(
        &install,
        &nats,
        &mut [&mut scheduler, &mut classifier, &mut brain],
    )
    .await;
}

#[tokio::test]
async fn an_approval_request_expires_announced_once_and_the_next_item_is_taken_up_at_a_tick() {
    let nats = TestNats::secured(&["ops"]).await.unwrap();
    let install = install(
        &nats,
        nats.bus_config(),
        "[scheduler]\ntick = \"500ms\"\n[ops]\nstarter-duties = false\napproval-expiry = \"4s\"\nswitch-grace = \"2s\"\n",
    )
    .await;
    let mut services = install.serve(&["brain", "classifier"]);
    let mut scheduler = install.serve(&["scheduler"]);
    publish_alert(&nats, "DiskFull", "nas01").await;
    publish_alert(&nats, "HighCPU", "web1").await;
    install
        .wait_until("two items", Duration::from_secs(20), |s| s.items.len() == 2)
        .await;
    std::fs::write(
        install.path().join("plan.toml"),
        "rationale = \"make room\"\n\n[[step]]\ntarget = \"nas01\"\ncommand = \"zfs snapshot tank/media@before\"\n",
    )
    .unwrap();
    cli(&install, &["plan", "propose", "1", "plan.toml"]).await;
    let s = install
        .wait_until("rev-1 is up", Duration::from_secs(20), |s| {
            s.plans.iter().any(|p| p.status == PlanStatus::Up)
        })
        .await;
    assert_eq!(item(&s, 1).state, State::WaitingOnOperator);
    let up_at = Instant::now();

    // Nothing else arrives: the ticks alone move the agent on to #2 after
    // the grace period, and announce the expiry once.
    let s = install
        .wait_until("#2 is active", Duration::from_secs(20), |s| {
            item(s, 2).state == State::Active
        })
        .await;
    assert!(
        up_at.elapsed() >= Duration::from_millis(1500),
        "not before the grace"
    );
    assert!(s.events.iter().any(|e| e.work_item_id == item(&s, 2).id
        && matches!(&e.event, Event::StateChanged { to, .. } if *to == State::Active)),);
    install
        .wait_until("the expiry is announced", Duration::from_secs(20), |s| {
            s.events.iter().any(
                |e| matches!(&e.event, Event::Fact { data, .. } if data.get("approval_expired").is_some()),
            )
        })
        .await;
    let told = said_after_ticks(&nats, Duration::from_secs(3)).await;
    assert_eq!(count(&told, "expired unanswered"), 1, "{told:?}");
    assert_eq!(count(&told, "Now working on item **#2**"), 1, "{told:?}");
    let late = super::run(nisse(&install).args(["approve", "1"])).await;
    let late_out = format!("{}{}", super::text(&late.stdout), super::text(&late.stderr));
    assert!(late_out.contains("expired"), "{late_out}");

    stop_and_rebuild(&install, &nats, &mut [&mut scheduler, &mut services]).await;
}

#[tokio::test]
async fn an_alert_alertmanager_stops_sending_is_marked_stale_once() {
    let nats = TestNats::secured(&["ops"]).await.unwrap();
    let mut bus = nats.bus_config();
    // Alertmanager's repeats carry the first notification's dedup id.
    bus.streams.duplicate_window = Duration::from_millis(500);
    let install = install(
        &nats,
        bus,
        "[scheduler]\ntick = \"500ms\"\n[ops]\nstarter-duties = false\nalert-repeat-interval = \"2s\"\nstale-after = \"6s\"\n",
    )
    .await;
    let mut intake = install.serve(&["intake-alerts"]);
    install.wait_intake(&mut intake).await;
    let mut brain = install.serve(&["brain"]);
    let mut scheduler = install.serve(&["scheduler"]);
    let mut hook = Webhook::new(install.webhook());
    hook.auth = WebhookAuth::Bearer(TOKEN.into());
    hook.repeat_interval = Duration::from_secs(2);
    let am = TestAlertmanager::start(hook).await.unwrap();
    am.post_alerts(&[firing(&[
        ("alertname", "NodeDown"),
        ("instance", "nas01:9100"),
    ])])
    .await
    .unwrap();
    install
        .wait_until("the alert's item", Duration::from_secs(30), |s| {
            s.items.len() == 1
        })
        .await;

    // While Alertmanager keeps sending it, it is not stale.
    tokio::time::sleep(Duration::from_secs(8)).await;
    let s = install.snapshot().unwrap();
    assert!(
        !s.events.iter().any(
            |e| matches!(&e.event, Event::Fact { data, .. } if data.get("stale_since").is_some())
        ),
        "stale while still being sent"
    );

    // Alertmanager goes away: the alert is marked stale, and said once.
    am.stop().await.unwrap();
    install
        .wait_until("the alert is stale", Duration::from_secs(30), |s| {
            s.events.iter().any(
                |e| matches!(&e.event, Event::Fact { data, .. } if data.get("stale_since").is_some()),
            )
        })
        .await;
    let told = said_after_ticks(&nats, Duration::from_secs(3)).await;
    assert_eq!(count(&told, "the alert is stale"), 1, "{told:?}");
    let s = install.snapshot().unwrap();
    assert_ne!(item(&s, 1).state, State::Closed, "stale is not resolved");

    stop_and_rebuild(
        &install,
        &nats,
        &mut [&mut scheduler, &mut intake, &mut brain],
    )
    .await;
}

#[tokio::test]
async fn a_brain_killed_while_due_duties_pile_up_runs_each_once_and_rebuilds_the_same() {
    let nats = TestNats::secured(&["ops"]).await.unwrap();
    let web = TestWeb::start().await.unwrap();
    let install = install(
        &nats,
        nats.bus_config(),
        &format!(
            "[scheduler]\ntick = \"500ms\"\n[ops]\nstarter-duties = false\n\
             [[ops.duty]]\nname = \"web\"\nkind = \"http\"\nurl = {:?}\ninterval = \"1s\"\n\
             [[ops.duty]]\nname = \"web-two\"\nkind = \"http\"\nurl = {:?}\ninterval = \"1s\"\n",
            web.url("/health"),
            web.url("/health")
        ),
    )
    .await;
    // Two schedulers, as two processes: one message per instant all the
    // same.
    let mut others = install.serve(&["scheduler", "prober"]);
    let mut second = install.serve(&["scheduler"]);
    let mut brain = install.serve(&["brain"]);
    install
        .wait_until("both duties ran", Duration::from_secs(20), |s| {
            s.events.is_empty() && s.applied_sequence > 0
        })
        .await;
    let store = nisse_core::Store::path_in(&install.data(), "ops");
    let runs = |name: &str| -> u64 {
        let s = nisse_core::Store::open_read_only(&store, "ops").unwrap();
        s.duty_states()
            .unwrap()
            .into_iter()
            .find(|(n, _)| n == name)
            .map(|(_, j)| {
                serde_json::from_str::<nisse_ops::checks::DutyState>(&j)
                    .unwrap()
                    .runs
            })
            .unwrap_or(0)
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while runs("web") < 2 || runs("web-two") < 2 {
        assert!(Instant::now() < deadline, "the duties never ran");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Killed: ticks and due duties pile up in the stream meanwhile.
    signal(brain.id().unwrap() as i32, Signal::SIGKILL);
    brain.wait().await.unwrap();
    let bus = nats.bus(&["ops"]).await.unwrap();
    let killed_at = super::alerts::last_sequence(&nats).await;
    tokio::time::sleep(Duration::from_secs(6)).await;
    let restarted_at = super::alerts::last_sequence(&nats).await;
    let mut brain = install.serve(&["brain"]);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let applied = nisse_core::Store::open_read_only(&store, "ops")
            .and_then(|s| s.applied_sequence())
            .unwrap_or(0);
        if applied >= restarted_at {
            break;
        }
        assert!(Instant::now() < deadline, "the brain never caught up");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;

    // Of the due messages that piled up, each duty ran once: its other
    // due instants found that run in flight.
    let mut reader = bus
        .read_range(&nisse_tests::ops(), killed_at + 1, None)
        .await
        .unwrap();
    let mut piled = std::collections::BTreeMap::<String, Vec<String>>::new();
    let mut caused = std::collections::BTreeMap::<String, usize>::new();
    let mut stored = Vec::new();
    while let Some(m) = reader.next().await {
        let m = m.unwrap();
        let seq = m.sequence;
        if let Ok(msg) = m.decode() {
            stored.push((seq, msg));
        }
    }
    for (seq, msg) in &stored {
        if let AnyMessage::DutyDue(due) = msg
            && *seq <= restarted_at
        {
            piled
                .entry(due.duty.clone())
                .or_default()
                .push(due.envelope.as_ref().unwrap().message_id.clone());
        }
    }
    for (_, msg) in &stored {
        if let AnyMessage::ProbeReq(req) = msg {
            let cause = &req.envelope.as_ref().unwrap().causation_id;
            if piled.get(&req.duty).is_some_and(|ids| ids.contains(cause)) {
                *caused.entry(req.duty.clone()).or_default() += 1;
            }
        }
    }
    for duty in ["web", "web-two"] {
        assert!(piled[duty].len() >= 4, "{duty}: {:?}", piled[duty]);
        assert_eq!(caused.get(duty), Some(&1), "{duty}: {caused:?}");
    }

    stop_and_rebuild(&install, &nats, &mut [&mut second, &mut others, &mut brain]).await;

    // Both schedulers ran the whole time: each duty was due once per
    // instant, the instants one second apart, none missed.
    let mut dues = std::collections::BTreeMap::<String, Vec<(i64, u64)>>::new();
    for msg in stream_kinds(&nats).await {
        if let AnyMessage::DutyDue(due) = msg {
            let t = due.due.unwrap();
            dues.entry(due.duty).or_default().push((
                t.seconds * 1000 + i64::from(t.nanos) / 1_000_000,
                due.missed,
            ));
        }
    }
    for (duty, instants) in &dues {
        assert!(instants.len() >= 10, "{duty}: {instants:?}");
        for pair in instants.windows(2) {
            assert_eq!(pair[1].0 - pair[0].0, 1000, "{duty}: {instants:?}");
        }
        assert!(
            instants.iter().skip(1).all(|(_, missed)| *missed == 0),
            "{duty}: {instants:?}"
        );
    }
}
