//! The control plane (`nisse serve control`) against a real NATS server
//! with the walls up, a real sshd, and the rest of the agent in `nisse
//! serve` processes: its gRPC API refuses anything without a valid
//! token, an approval through it is the token's operator's and binds only
//! the revision shown, a destructive revision needs its steps named back,
//! and its watch sees an item change as the brain commits it.

use std::time::{Duration, Instant};

use futures::StreamExt as _;
use nisse_bus::auth::{AuthPlan, OperatorName};
use nisse_bus::proto::{self, operator_command::Command};
use nisse_control::api::control_client::ControlClient;
use nisse_control::api::{self, event};
use nisse_control::tonic;
use nisse_core::plans::PlanStatus;
use nisse_tests::TestNats;
use nisse_tests::sshd::TestSshd;
use tonic::transport::{Channel, Endpoint};

use super::alerts::{Install, free_port, publish_alert, stop};
use super::gates::cli;
use super::{local_user, nisse, run, text};

type Client = ControlClient<Channel>;

/// The walls `nisse up` makes for an ops agent operated from the CLI by
/// the local user, and through the control plane by alice and bob.
fn plan() -> AuthPlan {
    let mut plan = nisse_tests::local_plan(&["ops"], &[]).unwrap();
    let ops: nisse_bus::AgentName = "ops".parse().unwrap();
    for name in ["alice", "bob"] {
        plan.control
            .insert(name.parse::<OperatorName>().unwrap(), [ops.clone()].into());
    }
    plan
}

/// The control service's address, added to the install's configuration
/// with alice and bob on the allowlist.
fn with_control(install: &Install) -> u16 {
    let port = free_port();
    let cfg = install.path().join("nisse.toml");
    let text = std::fs::read_to_string(&cfg).unwrap();
    // `[ops]` may already be there: the allowlist goes in at its top.
    let allow = format!(
        "operators = [\"cli:{}\", \"control:alice\", \"control:bob\"]\n",
        local_user()
    );
    let text = if text.contains("[ops]\n") {
        text.replacen("[ops]\n", &format!("[ops]\n{allow}"), 1)
    } else {
        format!("{text}[ops]\n{allow}")
    };
    std::fs::write(
        &cfg,
        format!("{text}[control]\nlisten = \"127.0.0.1:{port}\"\n"),
    )
    .unwrap();
    port
}

/// The ops agent with its executor reaching `sshd` as host `tool`, the
/// control service beside it, and alice and bob its operators there:
/// the server, sshd, the install, its processes, the control port.
async fn agent_with_control() -> (TestNats, TestSshd, Install, Vec<tokio::process::Child>, u16) {
    let nats = TestNats::with_auth(&plan()).await.unwrap();
    let sshd = TestSshd::start().await.unwrap();
    let (install, mut children) = super::exec::install(&nats, &sshd).await;
    let port = with_control(&install);
    // The brain reads the new allowlist (it may be starting still: no
    // signal handler to ask).
    let mut brain = children.remove(1);
    brain.kill().await.unwrap();
    children.push(install.serve(&["brain"]));
    children.push(install.serve(&["control"]));
    (nats, sshd, install, children, port)
}

/// Proposes, as the CLI operator, a plan of one step running `command` on
/// host `tool` for item #1.
async fn propose(install: &Install, command: &str) {
    let file = install.path().join("plan.toml");
    std::fs::write(
        &file,
        format!("[[step]]\ntarget = \"tool\"\ncommand = {command:?}\n"),
    )
    .unwrap();
    cli(install, &["plan", "propose", "1", "plan.toml"]).await;
}

async fn token(install: &Install, operator: &str) -> String {
    cli(install, &["control", "token", operator])
        .await
        .trim()
        .to_string()
}

/// A client of the install's control service, once it listens.
async fn client(install: &Install, port: u16) -> Client {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        // Answering: a call without a token is refused by the service
        // itself, not by a connection that is not there.
        if let Ok(mut c) = connect(port).await
            && c.who_am_i(api::WhoAmIRequest {})
                .await
                .is_err_and(|s| s.code() == tonic::Code::Unauthenticated)
        {
            return c;
        }
        assert!(
            Instant::now() < deadline,
            "the control service never listened:\n{}",
            std::fs::read_to_string(install.path().join("control.log")).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A client on a connection of its own.
async fn connect(port: u16) -> Result<Client, tonic::transport::Error> {
    let channel = Endpoint::from_shared(format!("http://127.0.0.1:{port}"))?
        .connect()
        .await?;
    Ok(ControlClient::new(channel))
}

fn authed<T>(message: T, token: &str) -> tonic::Request<T> {
    let mut r = tonic::Request::new(message);
    r.metadata_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    r
}

fn approve(item: &str, revision: u32, confirm: &str) -> api::CommandRequest {
    api::CommandRequest {
        agent: "ops".into(),
        item: item.into(),
        command: Some(proto::OperatorCommand {
            command: Some(Command::Approve(proto::Approve {
                revision,
                ..Default::default()
            })),
            ..Default::default()
        }),
        confirm: confirm.into(),
    }
}

/// Every call of the API with `token` (none when `None`): the codes they
/// answer.
async fn every_call(c: &mut Client, token: Option<&str>) -> Vec<(&'static str, tonic::Code)> {
    fn req<T>(m: T, token: Option<&str>) -> tonic::Request<T> {
        match token {
            Some(t) => authed(m, t),
            None => tonic::Request::new(m),
        }
    }
    let code = |r: Result<(), tonic::Status>| r.err().map_or(tonic::Code::Ok, |s| s.code());
    let ops = || "ops".to_string();
    vec![
        (
            "who_am_i",
            code(
                c.who_am_i(req(api::WhoAmIRequest {}, token))
                    .await
                    .map(drop),
            ),
        ),
        (
            "overview",
            code(
                c.overview(req(api::OverviewRequest {}, token))
                    .await
                    .map(drop),
            ),
        ),
        (
            "list_items",
            code(
                c.list_items(req(
                    api::ListItemsRequest {
                        agent: ops(),
                        state: String::new(),
                    },
                    token,
                ))
                .await
                .map(drop),
            ),
        ),
        (
            "get_item",
            code(
                c.get_item(req(
                    api::GetItemRequest {
                        agent: ops(),
                        item: "1".into(),
                        revision: 0,
                        part: String::new(),
                    },
                    token,
                ))
                .await
                .map(drop),
            ),
        ),
        (
            "command",
            code(c.command(req(approve("1", 1, ""), token)).await.map(drop)),
        ),
        (
            "streams",
            code(
                c.streams(req(api::StreamsRequest {}, token))
                    .await
                    .map(drop),
            ),
        ),
        (
            "duties",
            code(
                c.duties(req(api::DutiesRequest { agent: ops() }, token))
                    .await
                    .map(drop),
            ),
        ),
        (
            "world",
            code(
                c.world(req(api::WorldRequest::default(), token))
                    .await
                    .map(drop),
            ),
        ),
        (
            "check",
            code(
                c.check(req(
                    api::CheckRequest {
                        what: "vault".into(),
                    },
                    token,
                ))
                .await
                .map(drop),
            ),
        ),
        (
            "replay",
            code(
                c.replay(req(
                    api::ReplayRequest {
                        agent: ops(),
                        from_seq: 1,
                        to_seq: None,
                    },
                    token,
                ))
                .await
                .map(drop),
            ),
        ),
        (
            "idle",
            code(
                c.idle(req(api::IdleRequest::default(), token))
                    .await
                    .map(drop),
            ),
        ),
        (
            "mcp_list",
            code(
                c.mcp_list(req(api::McpListRequest { agent: ops() }, token))
                    .await
                    .map(drop),
            ),
        ),
        (
            "classify_command",
            code(
                c.classify_command(req(
                    api::ClassifyCommandRequest {
                        command: "rm -rf /".into(),
                        target: String::new(),
                    },
                    token,
                ))
                .await
                .map(drop),
            ),
        ),
        (
            "export_model_calls",
            code(
                c.export_model_calls(req(api::ExportModelCallsRequest { agent: ops() }, token))
                    .await
                    .map(drop),
            ),
        ),
        (
            "autonomy",
            code(
                c.autonomy(req(
                    api::AutonomyRequest {
                        change: "off".into(),
                    },
                    token,
                ))
                .await
                .map(drop),
            ),
        ),
        (
            "watch",
            code(
                c.watch(req(
                    api::WatchRequest {
                        agent: String::new(),
                    },
                    token,
                ))
                .await
                .map(drop),
            ),
        ),
    ]
}

#[tokio::test]
async fn the_control_api_refuses_without_a_valid_token_and_an_approval_binds_its_operator_and_revision()
 {
    let (nats, sshd, install, mut children, port) = agent_with_control().await;
    let mut c = client(&install, port).await;
    let alice = token(&install, "alice").await;
    let bob = token(&install, "bob").await;

    // Without a token, with a made-up one, with a revoked one: refused,
    // every call, before anything is read or changed.
    for call in every_call(&mut c, None).await {
        assert_eq!(call.1, tonic::Code::Unauthenticated, "{call:?}");
    }
    let forged = format!("nisse-control.alice.{}", "A".repeat(43));
    for call in every_call(&mut c, Some(&forged)).await {
        assert_eq!(call.1, tonic::Code::Unauthenticated, "{call:?}");
    }
    let revoked = cli(&install, &["control", "revoke", "bob"]).await;
    assert_ne!(revoked.trim(), bob);
    for call in every_call(&mut c, Some(&bob)).await {
        assert_eq!(call.1, tonic::Code::Unauthenticated, "{call:?}");
    }
    let board = cli(&install, &["autonomy"]).await;
    assert!(
        board.contains("autonomy: on"),
        "no refused call changed the switches: {board}"
    );

    let who = c
        .who_am_i(authed(api::WhoAmIRequest {}, &alice))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (who.operator.as_str(), who.agents),
        ("alice", vec!["ops".to_string()])
    );

    // A watch sees the alert's item open as the brain commits it.
    let mut watch = c
        .watch(authed(
            api::WatchRequest {
                agent: "ops".into(),
            },
            &alice,
        ))
        .await
        .unwrap()
        .into_inner();
    let seen = tokio::spawn(async move {
        let deadline = Instant::now() + Duration::from_secs(30);
        while let Ok(Some(Ok(e))) = tokio::time::timeout_at(deadline.into(), watch.next()).await {
            if let Some(event::Event::Item(i)) = e.event
                && i.number == 1
            {
                return (Instant::now(), i, watch);
            }
        }
        panic!("the watch never saw item #1");
    });
    publish_alert(&nats, "ServiceDown", "tool:9100").await;
    let committed = loop {
        if install.snapshot().is_some_and(|s| !s.items.is_empty()) {
            break Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    };
    let (at, item, mut watch) = seen.await.unwrap();
    assert_eq!(item.state, "active");
    let late = at.saturating_duration_since(committed);
    assert!(
        late < Duration::from_millis(100),
        "the watch saw the commit {late:?} after it"
    );

    // rev-1, a harmless step, put up by the CLI operator.
    let marker = sshd.dir().join("marker");
    let plan_command = format!("echo ran-from-control | tee -a {}", marker.display());
    propose(&install, &plan_command).await;
    install
        .wait_until("rev-1 is up", Duration::from_secs(20), |s| {
            s.plans.iter().any(|p| p.status == PlanStatus::Up)
        })
        .await;

    // An approval names the revision it approves; one naming a revision
    // that is not up binds nothing.
    let unnamed = c
        .command(authed(approve("1", 0, ""), &alice))
        .await
        .unwrap_err();
    assert_eq!(unnamed.code(), tonic::Code::InvalidArgument, "{unnamed:?}");
    let stale = c.command(authed(approve("1", 2, ""), &alice)).await;
    assert!(stale.is_err(), "rev-2 does not exist: {stale:?}");
    assert_eq!(install.snapshot().unwrap().plans[0].status, PlanStatus::Up);

    let said = c
        .command(authed(approve("1", 1, ""), &alice))
        .await
        .unwrap()
        .into_inner();
    assert!(
        said.lines.iter().any(|l| l.contains("rev-1")),
        "{:?}",
        said.lines
    );
    let s = install
        .wait_until("rev-1 ran", Duration::from_secs(30), |s| {
            s.plans[0].status == PlanStatus::Done
        })
        .await;
    assert_eq!(s.plans[0].approved_by.as_deref(), Some("operator:alice"));
    assert_eq!(s.plans[0].approved_via.as_deref(), Some("control"));
    assert_eq!(
        std::fs::read_to_string(&marker).unwrap(),
        "ran-from-control\n"
    );
    // The step's output is on the item as the API shows it.
    let shown = c
        .get_item(authed(
            api::GetItemRequest {
                agent: "ops".into(),
                item: "#1".into(),
                revision: 0,
                part: String::new(),
            },
            &alice,
        ))
        .await
        .unwrap()
        .into_inner();
    assert!(shown.text.contains("ran-from-control"), "{}", shown.text);

    // The watch saw the plan run.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut statuses = Vec::new();
    while let Ok(Some(Ok(e))) = tokio::time::timeout_at(deadline.into(), watch.next()).await {
        if let Some(event::Event::Item(i)) = e.event {
            statuses.push(i.plan_status.clone());
            if i.plan_status == "done" {
                break;
            }
        }
    }
    assert!(statuses.contains(&"done".to_string()), "{statuses:?}");

    // A destructive revision: the approval alone is refused, and so is a
    // wrong phrase; the item and step named back approve it.
    let plan_command = format!("rm -rf {}", sshd.dir().join("scratch").display());
    propose(&install, &plan_command).await;
    install
        .wait_until("rev-2 is up", Duration::from_secs(20), |s| {
            s.plans
                .iter()
                .any(|p| p.revision == 2 && p.status == PlanStatus::Up)
        })
        .await;
    let shown = c
        .get_item(authed(
            api::GetItemRequest {
                agent: "ops".into(),
                item: "1".into(),
                revision: 2,
                part: String::new(),
            },
            &alice,
        ))
        .await
        .unwrap()
        .into_inner();
    let json: serde_json::Value = serde_json::from_str(&shown.json).unwrap();
    assert_eq!(json["confirm"], "#1 step 1", "{json}");
    for wrong in ["", "yes", "#1 step 2", "I confirm"] {
        let refused = c
            .command(authed(approve("1", 2, wrong), &alice))
            .await
            .unwrap_err();
        assert_eq!(
            refused.code(),
            tonic::Code::FailedPrecondition,
            "{wrong:?}: {refused:?}"
        );
        assert!(refused.message().contains("#1 step 1"), "{refused:?}");
    }
    assert_eq!(install.snapshot().unwrap().plans[1].status, PlanStatus::Up);
    c.command(authed(approve("1", 2, "#1 step 1"), &alice))
        .await
        .unwrap();
    let s = install
        .wait_until("rev-2 approved", Duration::from_secs(30), |s| {
            s.plans[1].approved_by.is_some()
        })
        .await;
    assert_eq!(s.plans[1].approved_by.as_deref(), Some("operator:alice"));

    // What the service logged names no token.
    let log = std::fs::read_to_string(install.path().join("control.log")).unwrap();
    assert!(!log.contains(&alice), "a token in the log");
    let out = run(nisse(install.path()).args(["control", "token", "carol"])).await;
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("control:carol"),
        "{}",
        text(&out.stderr)
    );
    for child in &mut children {
        stop(child).await;
    }
}

/// `nisse --control URL …` run from a directory with no configuration
/// and no data directory, as from another machine: the token from the
/// environment when given, `extra` arguments before the command.
async fn remote(
    url: &str,
    token: Option<&str>,
    extra: &[&str],
    args: &[&str],
) -> std::process::Output {
    let elsewhere = tempfile::tempdir().unwrap();
    let mut cmd = nisse(elsewhere.path());
    cmd.arg("--control").arg(url).args(extra).args(args);
    if let Some(token) = token {
        cmd.env("NISSE_CONTROL_TOKEN", token);
    }
    run(&mut cmd).await
}

/// Until `args` print the same through the control plane as on the
/// installation (its read model catches up with the brain's store), or
/// panics with both.
async fn same_both_ways(install: &Install, url: &str, token: &str, args: &[&str]) -> String {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let here = run(nisse(install.path()).args(args)).await;
        let there = remote(url, Some(token), &[], args).await;
        if here.status.success() == there.status.success() && here.stdout == there.stdout {
            return text(&there.stdout);
        }
        assert!(
            Instant::now() < deadline,
            "nisse {args:?} differs through the control plane:\n--- on the installation ({})\n{}{}\n--- through --control ({})\n{}{}",
            here.status,
            text(&here.stdout),
            text(&here.stderr),
            there.status,
            text(&there.stdout),
            text(&there.stderr)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The CLI from another machine (`--control URL` and a token) does what
/// it does on the installation: every view prints the same text and
/// JSON, commands go to the brain as the token's operator, an approval
/// still names its revision; what only the installation can do is
/// refused saying why, and a missing, forged or plaintext-bound token
/// goes nowhere.
#[tokio::test]
async fn the_cli_through_the_control_plane_does_what_it_does_on_the_installation() {
    let (nats, sshd, install, mut children, port) = agent_with_control().await;
    client(&install, port).await;
    let alice = token(&install, "alice").await;
    let url = format!("http://127.0.0.1:{port}");

    publish_alert(&nats, "ServiceDown", "tool:9100").await;
    install
        .wait_until("item #1", Duration::from_secs(20), |s| !s.items.is_empty())
        .await;
    let items = same_both_ways(&install, &url, &alice, &["items", "--json"]).await;
    assert!(items.contains("ServiceDown"), "{items}");
    for args in [
        &["items"][..],
        &["items", "--state", "active"],
        &["item", "show", "1"],
        &["item", "show", "#1", "--json"],
        &["item", "show", "7"],
        &["duties", "--json"],
        &[
            "policy",
            "classify_command",
            "systemctl restart nginx",
            "--target",
            "tool",
        ],
        &["policy", "classify", "rm -rf /srv/data", "--json"],
        &["mcp", "list", "--json"],
        &["world", "list"],
        &["vault", "check"],
        &["eval", "export", "--agent", "ops"],
        &["replay", "--agent", "ops", "--to-seq", "0"],
    ] {
        same_both_ways(&install, &url, &alice, args).await;
    }

    // A plan proposed from here (its file is here), approved from here
    // as alice, naming the revision.
    let elsewhere = tempfile::tempdir().unwrap();
    let marker = sshd.dir().join("marker");
    let file = elsewhere.path().join("plan.toml");
    std::fs::write(
        &file,
        format!(
            "[[step]]\ntarget = \"tool\"\ncommand = {:?}\n",
            format!("echo remote | tee -a {}", marker.display())
        ),
    )
    .unwrap();
    let proposed = remote(
        &url,
        Some(&alice),
        &[],
        &["plan", "propose", "1", file.to_str().unwrap()],
    )
    .await;
    assert!(proposed.status.success(), "{}", text(&proposed.stderr));
    install
        .wait_until("rev-1 is up", Duration::from_secs(20), |s| {
            s.plans.iter().any(|p| p.status == PlanStatus::Up)
        })
        .await;
    same_both_ways(&install, &url, &alice, &["plan", "show", "1", "--json"]).await;
    let unnamed = remote(&url, Some(&alice), &[], &["approve", "1"]).await;
    assert!(!unnamed.status.success());
    assert!(
        text(&unnamed.stderr).contains("names the revision"),
        "{}",
        text(&unnamed.stderr)
    );
    let approved = remote(&url, Some(&alice), &[], &["approve", "1", "rev-1"]).await;
    assert!(approved.status.success(), "{}", text(&approved.stderr));
    assert!(
        text(&approved.stdout).contains("rev-1"),
        "{}",
        text(&approved.stdout)
    );
    let s = install
        .wait_until("rev-1 ran", Duration::from_secs(30), |s| {
            s.plans[0].status == PlanStatus::Done
        })
        .await;
    assert_eq!(s.plans[0].approved_by.as_deref(), Some("operator:alice"));
    assert_eq!(s.plans[0].approved_via.as_deref(), Some("control"));
    assert_eq!(std::fs::read_to_string(&marker).unwrap(), "remote\n");

    // The stream, read back the same way, up to what it holds now.
    let last = super::alerts::last_sequence(&nats).await.to_string();
    let replayed = same_both_ways(
        &install,
        &url,
        &alice,
        &["replay", "--agent", "ops", "--to-seq", &last, "--json"],
    )
    .await;
    assert_eq!(replayed.lines().count().to_string(), last);
    same_both_ways(
        &install,
        &url,
        &alice,
        &[
            "replay",
            "--agent",
            "ops",
            "--from-seq",
            "2",
            "--to-seq",
            "3",
        ],
    )
    .await;
    let idle = remote(&url, Some(&alice), &[], &["idle"]).await;
    assert!(idle.status.success(), "{}", text(&idle.stderr));
    assert!(
        text(&idle.stdout).starts_with("idle:"),
        "{}",
        text(&idle.stdout)
    );

    // The switches, changed from here as alice.
    let off = remote(&url, Some(&alice), &[], &["autonomy", "off"]).await;
    assert!(off.status.success(), "{}", text(&off.stderr));
    let board = cli(&install, &["autonomy"]).await;
    assert!(board.contains("autonomy: off"), "{board}");
    assert!(board.contains("control:alice"), "{board}");
    let on = remote(&url, Some(&alice), &[], &["autonomy", "on"]).await;
    assert!(on.status.success(), "{}", text(&on.stderr));

    // What only the installation does.
    for args in [
        &["up"][..],
        &["control", "token", "alice"],
        &["ssh-key"],
        &["bus", "init"],
        &["replay", "--agent", "ops", "--rebuild", "/tmp/x"],
    ] {
        let out = remote(&url, Some(&alice), &[], args).await;
        assert!(!out.status.success(), "{args:?}");
        assert!(
            text(&out.stderr).contains("does not go through the control plane"),
            "{args:?}: {}",
            text(&out.stderr)
        );
    }
    // No token, a forged one, a token bound for the network in the clear.
    let none = remote(&url, None, &[], &["items"]).await;
    assert!(!none.status.success());
    assert!(
        text(&none.stderr).contains("NISSE_CONTROL_TOKEN"),
        "{}",
        text(&none.stderr)
    );
    let forged = format!("nisse-control.alice.{}", "A".repeat(43));
    let refused = remote(&url, Some(&forged), &[], &["items"]).await;
    assert!(!refused.status.success());
    assert!(
        text(&refused.stderr).contains("refused the token"),
        "{}",
        text(&refused.stderr)
    );
    let clear = remote("http://192.0.2.7:9096", Some(&alice), &[], &["items"]).await;
    assert!(!clear.status.success());
    assert!(
        text(&clear.stderr).contains("in the clear"),
        "{}",
        text(&clear.stderr)
    );
    // --confirm goes to the brain from the installation too, which
    // checks it for every channel: here, rev-1 is already done.
    let here =
        run(nisse(install.path()).args(["approve", "1", "rev-1", "--confirm", "#1 step 1"])).await;
    assert!(here.status.success(), "{}", text(&here.stderr));
    assert!(
        text(&here.stdout).contains("rev-1 is done"),
        "{}",
        text(&here.stdout)
    );
    for child in &mut children {
        stop(child).await;
    }
}

/// With `[control] tls-cert` and `tls-key`, the API and the web room are
/// served over TLS only: the CLI reaches them with the CA that signed the
/// certificate, and not without it or in plain HTTP; the web room's login
/// cookie is `Secure`; a key that is not there stops the service at
/// start, naming the setting.
#[tokio::test]
async fn the_control_plane_serves_tls_that_the_cli_trusts_only_through_its_ca() {
    let nats = TestNats::with_auth(&plan()).await.unwrap();
    let (install, mut intake, mut brain) = Install::start(&nats, nats.bus_config()).await;
    let port = with_control(&install);
    let tls = nisse_tests::TestTls::generate(install.path()).unwrap();
    let cfg = install.path().join("nisse.toml");
    let with_tls = format!(
        "{}tls-cert = {:?}\ntls-key = {:?}\n",
        std::fs::read_to_string(&cfg).unwrap(),
        tls.cert_file.display().to_string(),
        tls.key_file.display().to_string()
    );
    std::fs::write(&cfg, with_tls).unwrap();
    brain.kill().await.unwrap();
    let mut brain = install.serve(&["brain"]);
    let mut control = install.serve(&["control"]);
    let alice = token(&install, "alice").await;
    let url = format!("https://127.0.0.1:{port}");
    let ca = tls.ca_file.display().to_string();
    let trusted = ["--control-ca", ca.as_str()];

    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let out = remote(&url, Some(&alice), &trusted, &["items", "--json"]).await;
        if out.status.success() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "never answered over TLS: {}\n{}",
            text(&out.stderr),
            install.log(&["control"])
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    publish_alert(&nats, "DiskFull", "tool:9100").await;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let out = remote(&url, Some(&alice), &trusted, &["items"]).await;
        if text(&out.stdout).contains("DiskFull") {
            break;
        }
        assert!(Instant::now() < deadline, "{}", text(&out.stderr));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The system's roots do not know this CA; plain HTTP is no TLS.
    let untrusted = remote(&url, Some(&alice), &[], &["items"]).await;
    assert!(!untrusted.status.success());
    assert!(
        text(&untrusted.stderr).contains("connecting to the control service"),
        "{}",
        text(&untrusted.stderr)
    );
    let plain = remote(
        &format!("http://127.0.0.1:{port}"),
        Some(&alice),
        &[],
        &["items"],
    )
    .await;
    assert!(!plain.status.success(), "{}", text(&plain.stdout));

    // The web room over TLS: its cookie never goes out in the clear.
    let web = reqwest::Client::builder()
        .add_root_certificate(
            reqwest::Certificate::from_pem(&std::fs::read(&tls.ca_file).unwrap()).unwrap(),
        )
        .build()
        .unwrap();
    let login = web
        .post(format!("https://localhost:{port}/api/login"))
        .json(&serde_json::json!({ "token": alice }))
        .send()
        .await
        .unwrap();
    assert!(login.status().is_success(), "{login:?}");
    let cookie = login.headers()["set-cookie"].to_str().unwrap().to_string();
    assert!(
        cookie.contains("; Secure") && cookie.contains("HttpOnly"),
        "{cookie}"
    );

    // A key that is not there: the service does not start.
    let out = run(nisse(install.path())
        .env("NISSE_CONTROL__TLS_KEY", install.path().join("missing.pem"))
        .args(["serve", "control"]))
    .await;
    assert!(!out.status.success());
    let said = text(&out.stderr);
    assert!(
        said.contains("control.tls-key") && said.contains("missing.pem"),
        "{said}"
    );

    for child in [&mut control, &mut brain, &mut intake] {
        stop(child).await;
    }
}

/// The control process's resident memory, in KiB.
fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap()
}

/// 200 watchers, each on a connection of its own, while 1,000 alerts
/// arrive: every watcher sees every event, in the same order, and the
/// service's memory stays bounded (the events go through one ring, not a
/// queue per watcher).
#[tokio::test]
async fn two_hundred_watchers_each_see_every_event_of_a_thousand_alerts() {
    const WATCHERS: usize = 200;
    const ALERTS: usize = 1000;
    let nats = TestNats::with_auth(&plan()).await.unwrap();
    let (install, mut intake, mut brain) = Install::start(&nats, nats.bus_config()).await;
    let port = with_control(&install);
    brain.kill().await.unwrap();
    let mut brain = install.serve(&["brain"]);
    let mut control = install.serve(&["control"]);
    let alice = token(&install, "alice").await;
    client(&install, port).await;
    let before = rss_kib(control.id().unwrap());

    let mut watchers = Vec::new();
    for _ in 0..WATCHERS {
        let mut c = connect(port).await.unwrap();
        let stream = c
            .watch(authed(
                api::WatchRequest {
                    agent: String::new(),
                },
                &alice,
            ))
            .await
            .unwrap()
            .into_inner();
        watchers.push(tokio::spawn(async move {
            // Until every item has been seen and the stream has been
            // quiet for a while.
            let mut stream = stream;
            let mut seen = Vec::new();
            let mut items = std::collections::BTreeSet::new();
            loop {
                let quiet = if items.len() == ALERTS {
                    Duration::from_secs(3)
                } else {
                    Duration::from_secs(60)
                };
                match tokio::time::timeout(quiet, stream.next()).await {
                    Ok(Some(Ok(e))) => {
                        if let Some(event::Event::Item(i)) = &e.event {
                            items.insert(i.number);
                        }
                        seen.push((e.sequence, format!("{:?}", e.event)));
                    }
                    Ok(Some(Err(s))) => panic!("the watch ended: {s:?}"),
                    Ok(None) => panic!("the watch ended"),
                    Err(_) => break,
                }
            }
            (items.len(), seen, c)
        }));
    }

    let bus = nats.bus(&["ops"]).await.unwrap();
    // Distinct alerts (each its own fingerprint), so each opens an item.
    for n in 0..ALERTS {
        bus.publish(super::alerts::alert_received(
            &format!("Load{n}"),
            &format!("host{n}:9100"),
        ))
        .await
        .unwrap();
    }

    let mut first: Option<Vec<(u64, String)>> = None;
    for w in watchers {
        let (items, mut seen, _client) = w.await.unwrap();
        // Every watcher was watching before the burst; what came before
        // it (the clock, the brain's start) reached only those already
        // watching.
        let burst = seen
            .iter()
            .position(|(_, e)| e.contains(".in.alert"))
            .expect("the burst");
        seen.drain(..burst);
        assert_eq!(items, ALERTS, "a watcher missed items");
        match &first {
            None => first = Some(seen),
            Some(f) => assert!(
                *f == seen,
                "two watchers saw different events ({} and {})",
                f.len(),
                seen.len()
            ),
        }
    }
    let events = first.unwrap();
    // Each alert's message and its item's change, at least.
    assert!(events.len() >= 2 * ALERTS, "{} events", events.len());
    let after = rss_kib(control.id().unwrap());
    assert!(
        after < before + 64 * 1024,
        "the control service grew from {before} KiB to {after} KiB"
    );
    for child in [&mut control, &mut brain, &mut intake] {
        stop(child).await;
    }
}

/// Debian's ChromeDriver on a free port, for the browser test.
struct Driver {
    /// Killed when the driver is dropped.
    _child: tokio::process::Child,
    port: u16,
}

impl Driver {
    async fn start() -> Self {
        let program = ["/usr/bin/chromedriver", "/usr/lib/chromium/chromedriver"]
            .into_iter()
            .find(|p| std::path::Path::new(p).exists())
            .expect("the browser test needs Debian's chromium and chromium-driver (scripts/test installs them)");
        let port = free_port();
        let child = tokio::process::Command::new(program)
            .arg(format!("--port={port}"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_err()
        {
            assert!(Instant::now() < deadline, "chromedriver never listened");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Self {
            _child: child,
            port,
        }
    }

    /// A headless Chromium session.
    async fn session(&self) -> fantoccini::Client {
        let mut caps = serde_json::Map::new();
        caps.insert(
            "goog:chromeOptions".into(),
            serde_json::json!({
                "binary": "/usr/bin/chromium",
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,1000"],
            }),
        );
        fantoccini::ClientBuilder::rustls()
            .unwrap()
            .capabilities(caps)
            .connect(&format!("http://127.0.0.1:{}", self.port))
            .await
            .unwrap()
    }
}

/// Where the browser test keeps its screenshots.
fn artifacts() -> std::path::PathBuf {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("control-room");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Waits until `css` matches an element whose text contains `text`.
async fn wait_text(b: &fantoccini::Client, css: &str, text: &str) -> fantoccini::elements::Element {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(found) = b.find_all(fantoccini::Locator::Css(css)).await {
            for e in found {
                if e.text().await.is_ok_and(|t| t.contains(text)) {
                    return e;
                }
            }
        }
        assert!(
            Instant::now() < deadline,
            "no `{css}` with {text:?} on the page:\n{}",
            b.source().await.unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The web control room in a real browser (Debian's Chromium, headless,
/// through ChromeDriver): logging in with a token, an alert arriving live
/// as an item, its plan approved from its page and the step's output
/// appearing there, and a destructive revision's approve button held
/// until its steps are named back. Screenshots of the overview and the
/// item page are kept in the target directory.
#[tokio::test]
async fn the_control_room_in_a_browser_shows_an_alert_live_and_approves_its_plan() {
    let (nats, sshd, install, mut children, port) = agent_with_control().await;
    client(&install, port).await;
    let alice = token(&install, "alice").await;
    let driver = Driver::start().await;
    let b = driver.session().await;
    let room = format!("http://127.0.0.1:{port}/");

    // A wrong token is refused on the page; the right one logs in.
    b.goto(&room).await.unwrap();
    wait_text(&b, "form.login", "Log in").await;
    for (token, then, says) in [
        (
            "nisse-control.alice.wrong",
            "form.login .error",
            "not valid",
        ),
        (alice.as_str(), "#who", "alice"),
    ] {
        let field = b.find(fantoccini::Locator::Css("#token")).await.unwrap();
        field.clear().await.unwrap();
        field.send_keys(token).await.unwrap();
        b.find(fantoccini::Locator::Css("#login"))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
        wait_text(&b, then, says).await;
    }
    wait_text(&b, "main h2", "ops: 0 active").await;

    // The alert arrives while the page is open: its item appears without
    // a reload.
    publish_alert(&nats, "ServiceDown", "tool:9100").await;
    wait_text(&b, "main a[data-item]", "#1").await;
    wait_text(&b, "#live", "live").await;
    std::fs::write(
        artifacts().join("overview.png"),
        b.screenshot().await.unwrap(),
    )
    .unwrap();

    // rev-1 put up by the CLI operator; approved from the item's page.
    let marker = sshd.dir().join("marker");
    let plan_command = format!("echo ran-from-the-browser | tee -a {}", marker.display());
    wait_text(&b, "main a[data-item]", "#1")
        .await
        .click()
        .await
        .unwrap();
    wait_text(&b, "main h2", "#1").await;
    propose(&install, &plan_command).await;
    let approve = wait_text(&b, "#approve", "Approve rev-1").await;
    wait_text(&b, "#plan", "ran-from-the-browser").await;
    std::fs::write(artifacts().join("item.png"), b.screenshot().await.unwrap()).unwrap();
    approve.click().await.unwrap();
    // The step's output appears on the page as the plan runs.
    wait_text(&b, "#log", "ran-from-the-browser").await;
    wait_text(&b, "main h3", "rev-1: done").await;
    std::fs::write(
        artifacts().join("item-done.png"),
        b.screenshot().await.unwrap(),
    )
    .unwrap();
    let s = install.snapshot().unwrap();
    assert_eq!(s.plans[0].approved_by.as_deref(), Some("operator:alice"));
    assert_eq!(s.plans[0].approved_via.as_deref(), Some("control"));

    // A destructive revision: approve stays disabled until the item and
    // step are typed back exactly.
    let plan_command = format!("rm -rf {}", sshd.dir().join("scratch").display());
    propose(&install, &plan_command).await;
    let approve = wait_text(&b, "#approve", "Approve rev-2").await;
    assert!(!approve.is_enabled().await.unwrap(), "approve is held");
    let confirm = b.find(fantoccini::Locator::Css("#confirm")).await.unwrap();
    confirm.send_keys("#1 step 2").await.unwrap();
    assert!(
        !approve.is_enabled().await.unwrap(),
        "a wrong phrase does not free it"
    );
    confirm.clear().await.unwrap();
    confirm.send_keys("#1 step 1").await.unwrap();
    assert!(approve.is_enabled().await.unwrap(), "the phrase frees it");
    // The item changes while the operator decides (the alert fires
    // again): the page shows it, and what they typed stays.
    let log = |b: fantoccini::Client| async move {
        // Live events re-render the log: one found just before that is
        // stale, and the new one is read instead.
        loop {
            let found = b.find(fantoccini::Locator::Css("#log")).await.unwrap();
            match found.text().await {
                Ok(text) => return text,
                Err(fantoccini::error::CmdError::Standard(e))
                    if e.error == fantoccini::error::ErrorStatus::StaleElementReference => {}
                Err(e) => panic!("reading the log: {e}"),
            }
        }
    };
    let before = log(b.clone()).await;
    let mut again = super::alerts::alert_received("ServiceDown", "tool:9100");
    again.envelope.as_mut().unwrap().message_id = "alert:ServiceDown:firing:2".into();
    nats.bus(&["ops"])
        .await
        .unwrap()
        .publish(again)
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while log(b.clone()).await == before {
        assert!(
            Instant::now() < deadline,
            "the repeat never showed: {before}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        confirm.prop("value").await.unwrap().as_deref(),
        Some("#1 step 1")
    );
    assert!(approve.is_enabled().await.unwrap(), "still freed");
    approve.click().await.unwrap();
    install
        .wait_until("rev-2 approved", Duration::from_secs(30), |s| {
            s.plans.get(1).is_some_and(|p| p.approved_by.is_some())
        })
        .await;
    b.close().await.unwrap();
    drop(driver);
    for child in &mut children {
        stop(child).await;
    }
}
