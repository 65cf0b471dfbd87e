//! `nisse mcp serve` driven by a real MCP client, the Python MCP SDK from
//! PyPI (`client.py` beside this file, in a virtualenv that
//! `scripts/install-mcp-client` makes), against a real `nisse up`: over
//! stdio, the client lists the tools (none approves, denies or touches
//! the kill switches), lists the items (one an alert opened through the
//! webhook), reads the item's log, its plan and the world model, and
//! proposes a plan, which the brain classifies and puts up for approval
//! (`nisse plan show` says so); a crafted call to `approve` is refused by
//! the protocol, and the plan stays unapproved. Beneath the tools, the
//! surface's own bus identity cannot approve either (the brain refuses
//! it) nor write the switches (the server refuses it). Over streamable
//! HTTP, the same client with the bearer token `nisse up` generated is
//! served; without it, or with another, every request gets 401.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _};

use nisse_bus::auth::{Credentials, Identity};
use nisse_bus::proto::{self, Envelope, OperatorReply, operator_command::Command};

use super::{nisse, run, text, wait_endpoints};

/// Where `nisse up` keeps the HTTP transport's token.
const TOKEN_FILE: &str = "credentials/mcp-http.token";

/// The tools the surface offers, and no others.
const TOOLS: [&str; 7] = [
    "duties",
    "list_items",
    "propose_plan",
    "show_item",
    "show_plan",
    "streams",
    "world",
];

/// The virtualenv with the Python MCP SDK: `$NISSE_MCP_VENV` when
/// `scripts/test` made it, else made (once, cached outside the clone) by
/// the same script.
fn mcp_venv() -> PathBuf {
    if let Ok(venv) = std::env::var("NISSE_MCP_VENV")
        && Path::new(&venv).join("bin/python").exists()
    {
        return venv.into();
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/install-mcp-client");
    let out = std::process::Command::new(&script)
        .output()
        .expect("scripts/install-mcp-client runs");
    assert!(
        out.status.success(),
        "installing the Python MCP SDK failed: {}",
        text(&out.stderr)
    );
    text(&out.stdout)
        .lines()
        .last()
        .expect("the script names the venv")
        .trim()
        .into()
}

/// Runs `client.py <args>` with `calls` on its stdin; its report.
async fn client(dir: &Path, args: &[&str], calls: &Value) -> Value {
    let python = mcp_venv().join("bin/python");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp_serve/client.py");
    let mut child = tokio::process::Command::new(python)
        .arg(script)
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("the MCP client starts");
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(calls.to_string().as_bytes()).await.unwrap();
    drop(stdin);
    let out = tokio::time::timeout(Duration::from_secs(90), child.wait_with_output())
        .await
        .expect("the MCP client finished in time")
        .unwrap();
    assert!(
        out.status.success(),
        "the MCP client failed: {}",
        text(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "the MCP client's report is not JSON ({e}): {}\nstderr: {}",
            text(&out.stdout),
            text(&out.stderr)
        )
    })
}

/// The report's answer to the call of `tool` numbered `n` among them.
fn call<'r>(report: &'r Value, tool: &str, n: usize) -> &'r Value {
    report["calls"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["tool"] == tool)
        .nth(n)
        .unwrap_or_else(|| panic!("no call {n} of {tool} in {report:#}"))
}

/// The text of a successful tool answer.
fn ok_text(answer: &Value) -> &str {
    assert_eq!(answer["is_error"], false, "{answer:#}");
    answer["text"].as_str().unwrap()
}

/// The text of a tool error.
fn error_text(answer: &Value) -> &str {
    assert_eq!(answer["is_error"], true, "{answer:#}");
    answer["text"].as_str().unwrap()
}

/// `nisse <args> --data-dir <data>` in `dir`: its stdout, or the test
/// fails with its stderr.
async fn cli(dir: &Path, data: &Path, args: &[&str]) -> String {
    let out = run(nisse(dir).args(args).arg("--data-dir").arg(data)).await;
    assert!(
        out.status.success(),
        "nisse {args:?} failed: {}",
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// Waits until `nisse plan show 1 --json` satisfies `check`.
async fn wait_plans(dir: &Path, data: &Path, what: &str, check: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let shown: Value =
            serde_json::from_str(&cli(dir, data, &["plan", "show", "1", "--json"]).await).unwrap();
        if check(&shown["plans"]) {
            return shown;
        }
        assert!(Instant::now() < deadline, "never: {what}: {shown:#}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Posts one firing alert to the webhook of `nisse up`, with its token.
async fn post_alert(endpoints: &Value) {
    let url = endpoints["listeners"]["alertmanager-webhook"]
        .as_str()
        .unwrap();
    let token_file = endpoints["listeners"]["alertmanager-token-file"]
        .as_str()
        .unwrap();
    let token = std::fs::read_to_string(token_file).unwrap();
    let body = json!({
        "version": "4",
        "groupKey": "{}:{alertname=\"DiskFull\"}",
        "status": "firing",
        "receiver": "nisse",
        "groupLabels": {"alertname": "DiskFull"},
        "commonLabels": {"alertname": "DiskFull", "instance": "nas01"},
        "externalURL": "http://alertmanager.invalid:9093",
        "alerts": [{
            "status": "firing",
            "labels": {"alertname": "DiskFull", "instance": "nas01"},
            "startsAt": "2024-05-01T10:00:00Z",
            "fingerprint": "00000000000000ab"
        }]
    });
    let response = reqwest::Client::new()
        .post(url)
        .bearer_auth(token.trim())
        .json(&body)
        .send()
        .await
        .unwrap();
    assert!(response.status().is_success(), "{}", response.status());
}

/// A file in `dir` for a process's output.
fn log_file(dir: &Path, name: &str) -> std::fs::File {
    std::fs::File::create(dir.join(name)).unwrap()
}

/// A world note.
fn world_note(data: &Path, path: &str, text: &str) {
    let file = data.join("vault/world").join(path);
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    std::fs::write(file, text).unwrap();
}

#[tokio::test]
async fn an_mcp_client_reads_the_work_and_proposes_a_plan_but_can_never_approve() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    world_note(&data, "hosts/nas01.md", "---\ntype: host\n---\n# nas01\n");
    world_note(
        &data,
        "services/smb.md",
        "---\ntype: service\nruns_on: \"[[nas01]]\"\n---\n# The file shares\n",
    );
    // Its output to files: this test runs long enough to fill a pipe.
    let mut up = nisse(dir.path())
        .arg("up")
        .arg("--data-dir")
        .arg(&data)
        .stdout(log_file(dir.path(), "up.out"))
        .stderr(log_file(dir.path(), "up.log"))
        .spawn()
        .unwrap();
    let endpoints = wait_endpoints(&data, &mut up).await;

    // The token `nisse up` made for the HTTP transport, beside the bus
    // credentials, only its owner's.
    let token_file = data.join(TOKEN_FILE);
    {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(&token_file).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    // An alert through the webhook opens item #1; the operator proposes
    // rev-1 with the CLI, and the classifier puts it up.
    post_alert(&endpoints).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while !cli(dir.path(), &data, &["items"])
        .await
        .contains("DiskFull on nas01")
    {
        assert!(Instant::now() < deadline, "the alert never opened an item");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    std::fs::write(
        dir.path().join("plan.toml"),
        "rationale = \"See what fills the pool.\"\n\n[[step]]\ntarget = \"nas01\"\ncommand = \"zfs list -o space tank\"\n",
    )
    .unwrap();
    let out = cli(dir.path(), &data, &["plan", "propose", "1", "plan.toml"]).await;
    assert!(out.contains("plan rev-1 proposed"), "{out}");
    wait_plans(dir.path(), &data, "rev-1 is up", |p| p[0]["status"] == "up").await;

    // Over stdio, as an MCP client starts a server.
    let nisse_bin = super::NISSE;
    let data_arg = data.display().to_string();
    let stdio = [
        "stdio",
        nisse_bin,
        "mcp",
        "serve",
        "--agent",
        "ops",
        "--data-dir",
        data_arg.as_str(),
    ];
    let calls = json!([
        {"tool": "list_items", "arguments": {}},
        {"tool": "list_items", "arguments": {"state": "sleeping"}},
        {"tool": "show_item", "arguments": {"item": "#1"}},
        {"tool": "show_item", "arguments": {"item": "#99"}},
        {"tool": "show_plan", "arguments": {"item": "1"}},
        {"tool": "show_plan", "arguments": {"item": "1", "revision": "rev-7"}},
        {"tool": "world", "arguments": {}},
        {"tool": "world", "arguments": {"target": "nas01"}},
        {"tool": "world", "arguments": {"target": "nas02"}},
        {"tool": "streams", "arguments": {}},
        {"tool": "duties", "arguments": {}},
        {"tool": "propose_plan", "arguments": {
            "item": "#1",
            "rationale": "Free space: snapshot, then drop the old dataset.",
            "steps": [
                {"target": "nas01", "command": "zfs snapshot tank/media/old@before"},
                {"target": "nas01", "command": "zfs destroy -r tank/media/old",
                 "precondition": {"command": "zfs list tank/media/old"}}
            ]
        }},
        {"tool": "propose_plan", "arguments": {
            "item": "#1", "rationale": "x",
            "steps": [{"target": "nas01"}, {"target": "nas01", "cmd": "ls"}]
        }},
        {"tool": "propose_plan", "arguments": {
            "item": "#1", "rationale": "x",
            "steps": [{"target": "nas01", "cmd": "ls"}]
        }},
        {"tool": "propose_plan", "arguments": {"item": "#1", "rationale": "x", "steps": []}},
        {"tool": "propose_plan", "arguments": {
            "item": "#99", "rationale": "x",
            "steps": [{"target": "nas01", "command": "uptime"}]
        }},
        // What a client could try that the surface does not have.
        {"tool": "approve", "arguments": {"item": "#1", "revision": "rev-2"}},
        {"tool": "deny", "arguments": {"item": "#1"}},
        {"tool": "autonomy", "arguments": {"on": false}},
    ]);
    let report = client(dir.path(), &stdio, &calls).await;
    assert_eq!(report["server"], "nisse", "{report:#}");

    // The tools: exactly the seven, none that decides or switches.
    let mut names: Vec<&str> = report["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    names.sort_unstable();
    assert_eq!(names, TOOLS);
    for tool in report["tools"].as_array().unwrap() {
        let name = tool["name"].as_str().unwrap();
        for word in ["approv", "deny", "kill", "autonomy", "switch", "never"] {
            assert!(!name.contains(word), "{name}");
        }
        assert_eq!(
            tool["read_only"],
            name != "propose_plan",
            "{name}: {tool:#}"
        );
    }

    // Reading: what the CLI prints, with its JSON.
    let listed = call(&report, "list_items", 0);
    assert!(ok_text(listed).contains("DiskFull on nas01"), "{listed:#}");
    assert_eq!(
        listed["structured"]["items"][0]["title"], "DiskFull on nas01",
        "{listed:#}"
    );
    assert_eq!(
        listed["text"].as_str().unwrap(),
        cli(dir.path(), &data, &["items"]).await,
        "the surface says what `nisse items` says"
    );
    let bad_state = error_text(call(&report, "list_items", 1));
    assert!(bad_state.contains("sleeping"), "{bad_state}");
    let log = ok_text(call(&report, "show_item", 0));
    assert!(
        log.contains("#1 DiskFull on nas01") && log.contains("plan rev-1 proposed"),
        "{log}"
    );
    let unknown = error_text(call(&report, "show_item", 1));
    assert!(
        unknown.contains("agent ops has no work item `#99`"),
        "{unknown}"
    );
    let plan = ok_text(call(&report, "show_plan", 0));
    assert!(plan.contains("Approval needed: item #1 rev-1"), "{plan}");
    assert!(plan.contains("zfs list -o space tank"), "{plan}");
    let no_rev = error_text(call(&report, "show_plan", 1));
    assert!(
        no_rev.contains("no plan revision rev-7") && no_rev.contains("rev-1"),
        "{no_rev}"
    );
    let world = ok_text(call(&report, "world", 0));
    assert!(
        world.contains("nas01 (host)") && world.contains("smb (service)"),
        "{world}"
    );
    let blast = call(&report, "world", 1);
    assert!(
        ok_text(blast).contains("1 entity is affected if nas01 stops"),
        "{blast:#}"
    );
    assert_eq!(blast["structured"]["blast"]["affected"][0]["entity"], "smb");
    let no_entity = error_text(call(&report, "world", 2));
    assert!(
        no_entity.contains("no entity or alias `nas02`") && no_entity.contains("nas01"),
        "{no_entity}"
    );
    let streams = call(&report, "streams", 0);
    assert!(ok_text(streams).contains("AGENT_OPS"), "{streams:#}");
    assert_eq!(streams["structured"]["streams"][0]["agent"], "ops");
    let duties = ok_text(call(&report, "duties", 0));
    assert!(duties.contains("no duties are configured"), "{duties}");

    // Proposing: the brain's own answer, then its approval request.
    let proposed = ok_text(call(&report, "propose_plan", 0));
    assert!(
        proposed.contains("plan rev-2 proposed (2 steps)"),
        "{proposed}"
    );
    let bad_steps = error_text(call(&report, "propose_plan", 1));
    assert!(
        bad_steps.contains("step 1: a shell step needs `command`"),
        "{bad_steps}"
    );
    let unknown_key = error_text(call(&report, "propose_plan", 2));
    assert!(
        unknown_key.contains("step 1: unknown field `cmd`"),
        "{unknown_key}"
    );
    let empty = error_text(call(&report, "propose_plan", 3));
    assert!(empty.contains("the plan has no steps"), "{empty}");
    let no_item = error_text(call(&report, "propose_plan", 4));
    assert!(
        no_item.contains("agent ops has no work item `#99`"),
        "{no_item}"
    );

    // No such tool: the protocol refuses each call by name.
    for tool in ["approve", "deny", "autonomy"] {
        let refused = &call(&report, tool, 0)["protocol_error"];
        assert_eq!(refused["code"], -32602, "{tool}: {report:#}");
        assert!(
            refused["message"]
                .as_str()
                .unwrap()
                .contains("tool not found"),
            "{tool}: {refused}"
        );
    }

    // rev-2 went through the same classification and approval request
    // as the CLI's, proposed by the surface, and nobody approved it.
    let shown = wait_plans(dir.path(), &data, "rev-2 is up", |p| {
        p.as_array()
            .unwrap()
            .iter()
            .any(|r| r["revision"] == 2 && r["status"] == "up")
    })
    .await;
    let rev2 = &shown["plans"][1];
    assert_eq!(rev2["proposed_by"], "operator:mcp", "{rev2:#}");
    assert_eq!(rev2["approved_by"], Value::Null, "{rev2:#}");
    let plan_show = cli(dir.path(), &data, &["plan", "show", "#1"]).await;
    assert!(
        plan_show.contains("Approval needed: item #1 rev-2"),
        "{plan_show}"
    );
    assert!(
        plan_show.contains("Irreversible:** step 2"),
        "the classifier rated the destroy: {plan_show}"
    );
    assert!(
        plan_show.contains("proposed by operator:mcp"),
        "{plan_show}"
    );

    // Beneath the tools: the surface's own credentials, used directly as
    // a subverted surface would, cannot approve (the brain refuses) nor
    // turn autonomy off (the server refuses).
    let surface = subverted_surface(&endpoints, &data).await;
    let approve = proto::Approve {
        revision: 2,
        ..Default::default()
    };
    let reply = command_as_surface(&surface, Command::Approve(approve)).await;
    assert!(!reply.applied, "{reply:?}");
    assert!(
        reply.error.contains("may only propose plans"),
        "{}",
        reply.error
    );
    let stop = command_as_surface(&surface, Command::Stop(proto::Stop {})).await;
    assert!(!stop.applied, "{stop:?}");
    let flipped = surface
        .update_switches("mcp", |b| b.autonomy_off = true)
        .await;
    assert!(flipped.is_err(), "the surface wrote the switches");
    let log = cli(dir.path(), &data, &["item", "show", "1"]).await;
    assert!(
        log.contains("the MCP surface (`nisse mcp serve`) may only propose plans"),
        "{log}"
    );
    let after = wait_plans(dir.path(), &data, "rev-2 still up", |_| true).await;
    assert_eq!(after["plans"][1]["status"], "up", "{after:#}");
    let switches = cli(dir.path(), &data, &["autonomy"]).await;
    assert!(switches.contains("autonomy: on"), "{switches}");

    http(dir.path(), &data, &token_file).await;

    super::alerts::stop(&mut up).await;
}

/// A connection with the surface's own credentials, as `nisse mcp serve`
/// makes it.
async fn subverted_surface(endpoints: &Value, data: &Path) -> nisse_bus::Bus {
    let cfg = nisse_bus::BusConfig {
        url: Some(endpoints["nats_url"].as_str().unwrap().to_string()),
        ..Default::default()
    };
    nisse_bus::Bus::connect_as(
        &cfg,
        vec![nisse_tests::ops()],
        &Identity::McpSurface,
        &Credentials::in_data_dir(data),
    )
    .await
    .unwrap()
}

/// Publishes `command` about item #1 with the surface's credentials on its
/// own subject, and returns the brain's answer.
async fn command_as_surface(bus: &nisse_bus::Bus, command: Command) -> OperatorReply {
    use prost::Message as _;
    let id = format!("mcp:{}", uuid::Uuid::new_v4());
    let mut answers = bus
        .client()
        .subscribe(format!("nisse.ops.out.operator.{id}"))
        .await
        .unwrap();
    bus.publish(proto::OperatorCommand {
        envelope: Some(Envelope {
            agent: "ops".into(),
            actor: Some(proto::Actor {
                kind: proto::ActorKind::Operator as i32,
                id: "mcp".into(),
            }),
            message_id: id,
            ..Default::default()
        }),
        channel: "mcp".into(),
        work_item: "#1".into(),
        command: Some(command),
    })
    .await
    .unwrap();
    let answer = tokio::time::timeout(
        Duration::from_secs(20),
        futures::StreamExt::next(&mut answers),
    )
    .await
    .expect("the brain answered")
    .unwrap();
    OperatorReply::decode(answer.payload).unwrap()
}

/// The HTTP transport: `nisse mcp serve --listen`, the address and the
/// token's file as it prints them; 401 without the token or with another;
/// the SDK's client with it is served, without it refused.
async fn http(dir: &Path, data: &Path, token_file: &Path) {
    let mut serve = nisse(dir)
        .args(["mcp", "serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(data)
        .stdout(Stdio::piped())
        .stderr(log_file(dir, "mcp-http.log"))
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(serve.stdout.take().unwrap()).lines();
    let mut printed = Vec::new();
    let url = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let line = lines
                .next_line()
                .await
                .unwrap()
                .expect("nisse mcp serve printed its address");
            printed.push(line.clone());
            if let Some(url) = line.strip_prefix("MCP (streamable HTTP): ") {
                let token_line = lines.next_line().await.unwrap().unwrap_or_default();
                printed.push(token_line);
                return url.to_string();
            }
        }
    })
    .await
    .expect("nisse mcp serve listened in time");
    assert!(
        url.starts_with("http://127.0.0.1:") && url.ends_with("/mcp"),
        "{url}"
    );
    assert!(
        printed[1].ends_with(&format!("the token in {}", token_file.display())),
        "{printed:?}"
    );
    let token = std::fs::read_to_string(token_file).unwrap();

    // A JSON-RPC request as any HTTP client can send it: refused without
    // the token and with a wrong one, before the protocol is reached.
    let initialize = json!({
        "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "curl", "version": "1"}}
    });
    let post = |auth: Option<String>| {
        let mut request = reqwest::Client::new()
            .post(&url)
            .header("accept", "application/json, text/event-stream")
            .json(&initialize);
        if let Some(auth) = auth {
            request = request.header("authorization", auth);
        }
        request.send()
    };
    for auth in [
        None,
        Some("Bearer wrong-token".to_string()),
        Some(format!("Basic {}", token.trim())),
        Some(format!("Bearer {}x", token.trim())),
    ] {
        let response = post(auth.clone()).await.unwrap();
        assert_eq!(response.status(), 401, "{auth:?}");
        assert!(response.headers().contains_key("www-authenticate"));
    }
    let response = post(Some(format!("Bearer {}", token.trim())))
        .await
        .unwrap();
    assert!(response.status().is_success(), "{}", response.status());

    // The SDK's client, with the token: the same tools, the plan the
    // stdio client proposed, and no approving.
    let token_arg = token_file.display().to_string();
    let calls = json!([
        {"tool": "show_plan", "arguments": {"item": "#1", "revision": "2"}},
        {"tool": "approve", "arguments": {"item": "#1"}},
    ]);
    let report = client(dir, &["http", &url, "--token-file", &token_arg], &calls).await;
    let mut names: Vec<&str> = report["tools"]
        .as_array()
        .unwrap_or_else(|| panic!("{report:#}"))
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    names.sort_unstable();
    assert_eq!(names, TOOLS);
    let plan = ok_text(call(&report, "show_plan", 0));
    assert!(plan.contains("Approval needed: item #1 rev-2"), "{plan}");
    assert!(
        call(&report, "approve", 0)["protocol_error"]["message"]
            .as_str()
            .unwrap()
            .contains("tool not found"),
        "{report:#}"
    );

    // Without it, the client does not get as far as listing a tool: the
    // server answered it 401 and nothing else.
    let refused = client(dir, &["http", &url], &json!([])).await;
    assert!(
        refused["connect_error"].is_string() && refused.get("tools").is_none(),
        "connected without a token: {refused:#}"
    );
    let statuses = refused["http_statuses"].as_array().unwrap();
    assert!(
        !statuses.is_empty() && statuses.iter().all(|s| s == 401),
        "{refused:#}"
    );
    assert!(
        report["http_statuses"]
            .as_array()
            .unwrap()
            .iter()
            .all(|s| s.as_u64().is_some_and(|s| s < 300)),
        "{report:#}"
    );

    super::alerts::stop(&mut serve).await;
}
