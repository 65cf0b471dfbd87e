//! The whole MCP path end to end with real MCP servers: the harness's
//! hypervisor stand-in at two sites (site A's read-only instance over
//! stdio with the read token, its elevated one over streamable HTTP with
//! the write token in a token file; site B's elevated one over stdio with
//! its write token) and the reference filesystem server from npm over
//! stdio, every instance declared in the policy file; a scripted model
//! drives the brain.
//!
//! Two tests run each Nisse service in its own `nisse serve` process (the
//! agent loop's rig over a real NATS server and a real Synapse, with `nisse
//! serve mcp` added), so the mcp service can be killed alone: `nisse up`
//! runs every service in its one process. A third runs the main path
//! under one real `nisse up` with its embedded NATS server.
//!
//! What a user would notice is asserted: what the model is told, what
//! the operator is asked and told in the Matrix thread, what `nisse mcp
//! list` and `nisse plan show` show, and what the sites' servers received
//! (their journals) and did (their VMs).

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use serde_json::{Value, json};

use nisse_bus::AnyMessage;
use nisse_bus::proto::{McpMount, McpStatus};
use nisse_core::plans::PlanStatus;
use nisse_tests::mcp::{
    HttpHypervisor, HypervisorSite, Phase, StdioCommand, TokenKind, VmStatus, filesystem_server,
};
use nisse_tests::model::{Reply, ScriptedModel};

use super::agent_loop::{Rig, request_text, tool_results};
use super::gates::{cli, stream_kinds};
use super::signal;

/// The policy file: every instance declared with the privilege `[mcp]`
/// gives it, each tool a test calls listed with its class.
const POLICY: &str = r#"
version = 1

[mcp.hv-site-a-ro]
privilege = "read-only"
[mcp.hv-site-a-ro.tools.list_vms]
privilege = "read-only"
[mcp.hv-site-a-ro.tools.vm_status]
privilege = "read-only"
[mcp.hv-site-a-ro.tools.read_console]
privilege = "read-only"

[mcp.hv-site-a-elevated]
privilege = "elevated"
[mcp.hv-site-a-elevated.tools.stop_vm]
privilege = "elevated"
risk = "reversible_low"
target-argument = "vm"
[mcp.hv-site-a-elevated.tools.slow_op]
privilege = "elevated"
risk = "reversible_low"

[mcp.hv-site-b-elevated]
privilege = "elevated"
[mcp.hv-site-b-elevated.tools.stop_vm]
privilege = "elevated"
risk = "reversible_low"
target-argument = "vm"

[mcp.fs-local-ro]
privilege = "read-only"
[mcp.fs-local-ro.tools.read_text_file]
privilege = "read-only"
[mcp.fs-local-ro.tools.read_file]
privilege = "read-only"
[mcp.fs-local-ro.tools.list_directory]
privilege = "read-only"
[mcp.fs-local-ro.tools.list_allowed_directories]
privilege = "read-only"
[mcp.fs-local-ro.tools.get_file_info]
privilege = "read-only"
"#;

/// Every configured instance, as `nisse mcp list` names them.
const INSTANCES: [&str; 4] = [
    "fs-local-ro",
    "hv-site-a-elevated",
    "hv-site-a-ro",
    "hv-site-b-elevated",
];

/// What the file the filesystem server serves says.
const NOTES: &str = "VM 101 (web) at site-a runs away every night at 02:00.\n";

/// The MCP servers the mcp service holds, and what they work on.
struct Servers {
    site_a: HypervisorSite,
    /// Site A's streamable HTTP server (the elevated instance's).
    site_a_http: HttpHypervisor,
    site_b: HypervisorSite,
    /// The directory the filesystem server serves, holding `notes.txt`.
    files: tempfile::TempDir,
    /// The token files and the policy file.
    secrets: tempfile::TempDir,
}

impl Servers {
    /// Both sites (site A's HTTP server started), the filesystem server's
    /// directory with `notes.txt`, the token files and the policy file.
    async fn start() -> Self {
        let site_a = HypervisorSite::new("site-a").await.unwrap();
        let site_a_http = site_a.start_http().await.unwrap();
        let site_b = HypervisorSite::new("site-b").await.unwrap();
        let files = tempfile::tempdir().unwrap();
        std::fs::write(files.path().join("notes.txt"), NOTES).unwrap();
        Self {
            site_a,
            site_a_http,
            site_b,
            files,
            secrets: tempfile::tempdir().unwrap(),
        }
    }

    /// `[policy]` and `[mcp]` for `nisse.toml`: the policy file and the
    /// four instances, each token in a file of its own.
    async fn config(&self) -> String {
        let fs = filesystem_server(self.files.path()).await.unwrap();
        let secret = |name: &str, value: &str| {
            let path = self.secrets.path().join(name);
            std::fs::write(&path, format!("{value}\n")).unwrap();
            path.display().to_string()
        };
        let a_read = secret("hv-site-a-ro.token", self.site_a.read_token());
        let a_write = secret("hv-site-a-elevated.token", self.site_a.write_token());
        let b_write = secret("hv-site-b-elevated.token", self.site_b.write_token());
        let policy = secret("policy.toml", POLICY);
        format!(
            "[policy]\nfile = {policy:?}\n\
             [mcp]\n\
             connect-timeout = \"20s\"\n\
             reconnect-backoff = \"200ms\"\n\
             reconnect-backoff-max = \"1s\"\n\
             [[mcp.instance]]\n\
             name = \"hv-site-a-ro\"\nservice = \"hv\"\nsite = \"site-a\"\nprivilege = \"read-only\"\n\
             command = {a_ro:?}\nsecret-env = {{ HV_TOKEN = {a_read:?} }}\n\
             [[mcp.instance]]\n\
             name = \"hv-site-a-elevated\"\nservice = \"hv\"\nsite = \"site-a\"\nprivilege = \"elevated\"\n\
             url = {a_url:?}\ntoken-file = {a_write:?}\n\
             [[mcp.instance]]\n\
             name = \"hv-site-b-elevated\"\nservice = \"hv\"\nsite = \"site-b\"\nprivilege = \"elevated\"\n\
             command = {b:?}\nsecret-env = {{ HV_TOKEN = {b_write:?} }}\n\
             [[mcp.instance]]\n\
             name = \"fs-local-ro\"\nservice = \"fs\"\nsite = \"local\"\nprivilege = \"read-only\"\n\
             command = {fs:?}\n",
            a_ro = command(&self.site_a.stdio_command(None)),
            a_url = self.site_a_http.url(),
            b = command(&self.site_b.stdio_command(None)),
            fs = command(&fs),
        )
    }

    fn notes(&self) -> String {
        self.files.path().join("notes.txt").display().to_string()
    }

    /// What the servers wrote on stderr (the stdio ones' is in the mcp
    /// service's log).
    fn logs(&self) -> String {
        format!("--- site-a http server\n{}", self.site_a_http.log())
    }
}

/// `command = [...]` for a stdio instance.
fn command(stdio: &StdioCommand) -> Vec<String> {
    std::iter::once(stdio.program.display().to_string())
        .chain(stdio.args.iter().cloned())
        .collect()
}

/// The agent loop's rig with the policy file, the four MCP instances and
/// `nisse serve mcp` in its own process, once every instance's tools are
/// known to the brain.
async fn start() -> (Rig, Servers) {
    let servers = Servers::start().await;
    let mut rig = Rig::start_full("", &servers.config().await).await;
    let mcp = rig.install.serve(&["mcp"]);
    rig.children.push(("mcp", mcp));
    tools_listed(rig.install.path(), || {
        format!("{}\n{}", rig.logs(), servers.logs())
    })
    .await;
    (rig, servers)
}

/// Waits until the brain knows every instance's tools, as `nisse mcp
/// list` in `dir` shows them: the model is offered only tools the brain
/// has heard of, so no item may open before.
async fn tools_listed(dir: &Path, logs: impl Fn() -> String) {
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        let listed = mcp_list(dir).await;
        let ready = INSTANCES.iter().all(|name| {
            let i = instance(&listed, name);
            i["error"].is_null() && !i["tools"].as_array().unwrap().is_empty()
        });
        if ready {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "not every instance listed its tools: {listed:#}\n{}",
            logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `nisse <args>` in `dir`; its stdout, or the test fails with its
/// stderr.
async fn nisse_in(dir: &Path, args: &[&str]) -> String {
    let out = super::run(super::nisse(dir).args(args)).await;
    assert!(
        out.status.success(),
        "nisse {args:?} failed: {}",
        super::text(&out.stderr)
    );
    super::text(&out.stdout)
}

/// `nisse mcp list --json` in `dir`.
async fn mcp_list(dir: &Path) -> Value {
    serde_json::from_str(&nisse_in(dir, &["mcp", "list", "--json"]).await).unwrap()
}

/// Posts one firing alert `name` to an intake's webhook with its bearer
/// token, as Alertmanager delivers it.
async fn post_alert(webhook: &str, token: &str, name: &str) {
    let body = json!({
        "version": "4",
        "groupKey": format!("{{}}:{{alertname=\"{name}\"}}"),
        "status": "firing",
        "receiver": "nisse",
        "groupLabels": {"alertname": name},
        "commonLabels": {"alertname": name, "instance": "hv-site-a"},
        "externalURL": "http://alertmanager.invalid:9093",
        "alerts": [{
            "status": "firing",
            "labels": {"alertname": name, "instance": "hv-site-a"},
            "startsAt": "2024-05-01T10:00:00Z",
            "fingerprint": "00000000000000e2"
        }]
    });
    let response = reqwest::Client::new()
        .post(webhook)
        .bearer_auth(token)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert!(response.status().is_success(), "{}", response.status());
}

/// Instance `name` in a `nisse mcp list --json`.
fn instance<'a>(listed: &'a Value, name: &str) -> &'a Value {
    listed["instances"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["name"] == name)
        .unwrap_or_else(|| panic!("no instance {name} in {listed:#}"))
}

/// The work items instance `name` is mounted on, as `nisse mcp list` shows
/// them: (item, plan revision).
fn mounted_on(listed: &Value, name: &str) -> Vec<(String, u64)> {
    instance(listed, name)["mounted_on"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["item"].as_str().unwrap().to_string(),
                m["plan_revision"].as_u64().unwrap(),
            )
        })
        .collect()
}

fn call(name: &str, arguments: Value) -> Reply {
    Reply::ToolCall {
        name: name.into(),
        arguments,
    }
}

/// The names of the tools a recorded model request offered.
fn offered(body: &Value) -> Vec<String> {
    body["tools"]
        .as_array()
        .map(|tools| {
            tools
                .iter()
                .filter_map(|t| t["function"]["name"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// What the model was told of its last tool call in a recorded request.
fn last_tool_result(body: &Value) -> String {
    body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .rfind(|m| m["role"] == "tool")
        .and_then(|m| m["content"].as_str())
        .unwrap_or_else(|| panic!("no tool result in {body:#}"))
        .to_string()
}

/// Waits until `model` has been asked `n` times; the requests so far.
async fn model_asked(model: &ScriptedModel, n: usize, logs: impl Fn() -> String) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        let requests = model.requests();
        if requests.len() >= n {
            return requests;
        }
        assert!(
            Instant::now() < deadline,
            "the model was asked {} times, not {n}\n{}",
            requests.len(),
            logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// What `site`'s servers received of `tool`, by phase.
fn journal(site: &HypervisorSite, tool: &str, phase: Phase) -> Vec<nisse_tests::mcp::Call> {
    site.journal()
        .unwrap()
        .into_iter()
        .filter(|c| c.tool == tool && c.phase == phase)
        .collect()
}

/// Every `McpMount` in the ops stream for `item`, checking each is on its
/// item's subject.
async fn mounts(rig: &Rig, item: &str) -> Vec<McpMount> {
    let bus = rig.nats.bus(&["ops"]).await.unwrap();
    let mut reader = bus.read_range(&nisse_tests::ops(), 1, None).await.unwrap();
    let mut out = Vec::new();
    while let Some(m) = reader.next().await {
        let m = m.unwrap();
        if let Ok(AnyMessage::McpMount(mount)) = m.decode()
            && mount.work_item_id == item
        {
            assert_eq!(m.subject, format!("nisse.ops.out.mcp.mount.{item}"));
            out.push(mount);
        }
    }
    out
}

/// The status of plan revision `revision` of the only item.
fn plan_status(s: &nisse_core::Snapshot, revision: u32) -> Option<PlanStatus> {
    s.plans
        .iter()
        .find(|p| p.revision == revision)
        .map(|p| p.status)
}

/// Seeds O4, X3 and L13 through the whole path: the model lists VMs
/// through the read-only instance at once; its call of the elevated
/// `stop_vm` without a plan is refused with "propose it"; it reads a file
/// through the published filesystem server; the plan naming
/// `mcp:hv-site-a-elevated/stop_vm {vm: "101"}` runs that exact call once,
/// with the write token, after the operator approves it, and a second
/// plan naming site B's instance is put to the operator and runs only
/// there once approved; afterwards no elevated instance is mounted.
#[tokio::test]
async fn the_model_reads_through_read_only_instances_and_stops_vms_only_under_approved_plans() {
    let (mut rig, servers) = start().await;
    rig.model.push([
        call("hv-site-a-ro__list_vms", json!({})),
        call("hv-site-a-elevated__stop_vm", json!({ "vm": 101 })),
        call("fs-local-ro__read_text_file", json!({ "path": servers.notes() })),
        call(
            "submit_plan",
            json!({
                "rationale": "VM 101 at site-a runs away; stop it",
                "steps": [{ "tool": "mcp:hv-site-a-elevated/stop_vm", "arguments": { "vm": "101" } }]
            }),
        ),
        call(
            "submit_plan",
            json!({
                "rationale": "site-b's db VM runs the same job; stop it too",
                "steps": [{ "tool": "mcp:hv-site-b-elevated/stop_vm", "arguments": { "vm": 102 } }]
            }),
        ),
        call(
            "ask_human",
            json!({ "question": "VM 101 at site-a and VM 102 at site-b are stopped. Start them again after the night?" }),
        ),
    ]);
    post_alert(&rig.install.webhook(), super::alerts::TOKEN, "VmRunaway").await;
    let logs = || format!("{}\n{}", rig.logs(), servers.logs());

    // 1. The read-only instance's tools are offered (the elevated ones'
    // are not), and the listing runs at once, with the read token.
    let requests = model_asked(&rig.model, 2, &logs).await;
    let tools = offered(&requests[0]);
    for name in ["hv-site-a-ro__list_vms", "fs-local-ro__read_text_file"] {
        assert!(tools.iter().any(|t| t == name), "{name}: {tools:?}");
    }
    assert!(
        !tools.iter().any(|t| t.contains("elevated")),
        "an elevated instance's tool is offered without a plan: {tools:?}"
    );
    let listed = last_tool_result(&requests[1]);
    for vm in ["101 web running", "102 db running", "103 backup stopped"] {
        assert!(listed.contains(vm), "{vm}: {listed}");
    }
    let lists = journal(&servers.site_a, "list_vms", Phase::Answered);
    assert_eq!(lists.len(), 1, "{lists:#?}");
    assert_eq!(
        (lists[0].token, lists[0].transport.as_str()),
        (TokenKind::Read, "stdio")
    );
    // `nisse mcp list` shows the published server's tools as it
    // declared them.
    let listed = mcp_list(rig.install.path()).await;
    let fs = instance(&listed, "fs-local-ro");
    assert!(
        fs["server"]
            .as_str()
            .is_some_and(|s| s.starts_with("secure-filesystem-server")),
        "{fs:#}"
    );
    let read_tool = fs["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "read_text_file")
        .unwrap_or_else(|| panic!("{fs:#}"));
    assert_eq!(read_tool["read_only_hint"], true, "{read_tool:#}");

    // 2. The elevated stop without a plan is not run: the model is told
    // to propose it, and the site never hears of it.
    let requests = model_asked(&rig.model, 3, &logs).await;
    let refused = last_tool_result(&requests[2]);
    assert!(
        refused.contains("not run")
            && refused.contains("submit_plan")
            && refused.contains("mcp:hv-site-a-elevated/stop_vm"),
        "{refused}"
    );

    // 3. The file, read through the filesystem server from npm.
    let requests = model_asked(&rig.model, 4, &logs).await;
    let read = last_tool_result(&requests[3]);
    assert!(read.contains(NOTES.trim()), "{read}");
    assert!(
        servers
            .site_a
            .journal()
            .unwrap()
            .iter()
            .all(|c| c.tool != "stop_vm"),
        "{:#?}",
        servers.site_a.journal()
    );

    // 4. The plan is put to the operator with its exact call; nothing has
    // run when they approve it with the CLI.
    let request = rig.agent_posts(|b| b.contains("rev-1")).await;
    let root = request["content"]["m.relates_to"]["event_id"].clone();
    let body = request["content"]["body"].as_str().unwrap();
    assert!(body.contains("mcp:hv-site-a-elevated/stop_vm"), "{body}");
    assert!(
        servers
            .site_a
            .journal()
            .unwrap()
            .iter()
            .all(|c| c.tool != "stop_vm")
    );
    let approved = cli(&rig.install, &["approve", "1", "rev-1"]).await;
    assert!(approved.contains("rev-1"), "{approved}");
    let s = rig
        .wait_until("rev-1 is done", |s| {
            plan_status(s, 1) == Some(PlanStatus::Done)
        })
        .await;
    let item = s.items[0].id.clone();
    let stops = journal(&servers.site_a, "stop_vm", Phase::Answered);
    assert_eq!(stops.len(), 1, "{stops:#?}");
    assert_eq!(
        stops[0].arguments,
        json!({ "vm": 101 }),
        "normalised to the schema's integer"
    );
    assert_eq!(
        (stops[0].token, stops[0].transport.as_str()),
        (TokenKind::Write, "http")
    );
    assert!(!stops[0].result.as_ref().unwrap().is_error, "{stops:#?}");
    let vm = |site: &HypervisorSite, id| site.vm(id).unwrap().unwrap().status;
    assert_eq!(vm(&servers.site_a, 101), VmStatus::Stopped);
    assert_eq!(vm(&servers.site_a, 102), VmStatus::Running);

    // 5. The second plan names site B's instance: it is put to the
    // operator, and nothing reaches site B until they approve it; then
    // it runs there, with site B's write token, and nowhere else.
    let request = rig.agent_posts(|b| b.contains("rev-2")).await;
    assert_eq!(request["content"]["m.relates_to"]["event_id"], root);
    let body = request["content"]["body"].as_str().unwrap();
    assert!(body.contains("mcp:hv-site-b-elevated/stop_vm"), "{body}");
    assert!(
        servers.site_b.journal().unwrap().is_empty(),
        "{:#?}",
        servers.site_b.journal()
    );
    cli(&rig.install, &["approve", "1", "rev-2"]).await;
    rig.wait_until("rev-2 is done", |s| {
        plan_status(s, 2) == Some(PlanStatus::Done)
    })
    .await;
    let stops_b = journal(&servers.site_b, "stop_vm", Phase::Answered);
    assert_eq!(stops_b.len(), 1, "{stops_b:#?}");
    assert_eq!(stops_b[0].arguments, json!({ "vm": 102 }));
    assert_eq!(
        (stops_b[0].token, stops_b[0].transport.as_str()),
        (TokenKind::Write, "stdio")
    );
    assert_eq!(vm(&servers.site_b, 102), VmStatus::Stopped);
    assert_eq!(vm(&servers.site_a, 102), VmStatus::Running);
    assert_eq!(
        journal(&servers.site_a, "stop_vm", Phase::Answered).len(),
        1
    );

    // The model heard how each plan went, and asks the operator.
    rig.agent_posts(|b| b.contains("Start them again after the night?"))
        .await;
    let requests = rig.model.requests();
    assert_eq!(requests.len(), 6, "{requests:#?}");
    assert!(request_text(&requests[4]).contains("rev-1 ran to the end"));
    assert!(request_text(&requests[5]).contains("rev-2 ran to the end"));
    let results = tool_results(&rig.install.snapshot().unwrap());
    assert!(
        results[0].0 && results[0].1.contains("101 web running"),
        "{results:#?}"
    );

    // With the plans done, the item keeps its read-only instances and no
    // elevated one: each was mounted only under its approved revision.
    let listed = mcp_list(rig.install.path()).await;
    for name in ["hv-site-a-elevated", "hv-site-b-elevated"] {
        assert_eq!(mounted_on(&listed, name), [], "{name}: {listed:#}");
    }
    for name in ["hv-site-a-ro", "fs-local-ro"] {
        assert_eq!(
            mounted_on(&listed, name),
            [(item.clone(), 0)],
            "{name}: {listed:#}"
        );
    }
    let history: Vec<(Vec<String>, u32)> = mounts(&rig, &item)
        .await
        .into_iter()
        .map(|m| (m.instances, m.plan_revision))
        .collect();
    let read_only = vec!["fs-local-ro".to_string(), "hv-site-a-ro".to_string()];
    let with = |elevated: &str| {
        let mut v = read_only.clone();
        v.push(elevated.to_string());
        v.sort();
        v
    };
    assert_eq!(
        history,
        [
            (read_only.clone(), 0),
            (with("hv-site-a-elevated"), 1),
            (read_only.clone(), 0),
            (with("hv-site-b-elevated"), 2),
            (read_only.clone(), 0),
        ]
    );
    rig.stop_all().await;
}

/// Seed X3's exactly-once for MCP steps: the mcp service is SIGKILLed
/// while an approved plan's elevated call is in flight; started again, it
/// answers that the outcome is unknown, and the plan halts and asks the
/// operator again, saying so in the Matrix thread and in `nisse plan
/// show`: the call is never made again on its own, and the model is not
/// asked to carry on meanwhile.
#[tokio::test]
async fn an_elevated_call_in_flight_when_the_mcp_service_is_killed_halts_its_plan_and_is_not_made_again()
 {
    let (mut rig, servers) = start().await;
    rig.model.push([call(
        "submit_plan",
        json!({
            "rationale": "run the site's maintenance operation",
            "steps": [{ "tool": "mcp:hv-site-a-elevated/slow_op", "arguments": { "seconds": 4 } }]
        }),
    )]);
    post_alert(
        &rig.install.webhook(),
        super::alerts::TOKEN,
        "MaintenanceDue",
    )
    .await;
    let request = rig.agent_posts(|b| b.contains("rev-1")).await;
    let root = request["content"]["m.relates_to"]["event_id"].clone();
    let body = request["content"]["body"].as_str().unwrap();
    assert!(body.contains("mcp:hv-site-a-elevated/slow_op"), "{body}");
    cli(&rig.install, &["approve", "1", "rev-1"]).await;

    // Killed once the call reached the server, then started again.
    let deadline = Instant::now() + Duration::from_secs(30);
    while journal(&servers.site_a, "slow_op", Phase::Started).is_empty() {
        assert!(
            Instant::now() < deadline,
            "slow_op never started\n{}\n{}",
            rig.logs(),
            servers.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let pid = rig.child("mcp").id().unwrap() as i32;
    signal(pid, Signal::SIGKILL);
    rig.child("mcp").wait().await.unwrap();
    let mcp = rig.install.serve(&["mcp"]);
    *rig.child("mcp") = mcp;

    // The operator is told in the item's thread that the step did not
    // complete, and asked again, with why.
    let told = rig
        .agent_posts(|b| b.contains("step 1 of 1 did not complete: outcome unknown"))
        .await;
    assert_eq!(told["content"]["m.relates_to"]["event_id"], root);
    let asked = rig
        .agent_posts(|b| {
            b.contains("rev-1") && b.contains("is unknown") && b.contains("not run again blindly")
        })
        .await;
    assert_eq!(asked["content"]["m.relates_to"]["event_id"], root);
    let s = rig
        .wait_until("rev-1 halted and up again", |s| {
            s.plans.iter().any(|p| {
                p.revision == 1
                    && p.status == PlanStatus::Up
                    && p.halted.as_deref().is_some_and(|h| h.contains("unknown"))
            })
        })
        .await;
    let shown = cli(&rig.install, &["plan", "show", "1"]).await;
    assert!(shown.contains("unknown"), "{shown}");
    let results: Vec<_> = stream_kinds(&rig.nats)
        .await
        .into_iter()
        .filter_map(|m| match m {
            AnyMessage::McpResult(r) => Some(r),
            _ => None,
        })
        .filter(|r| {
            r.envelope
                .as_ref()
                .is_some_and(|e| e.work_item_id == s.items[0].id)
        })
        .collect();
    assert_eq!(results.len(), 1, "{results:#?}");
    assert_eq!(
        results[0].status,
        McpStatus::OutcomeUnknown as i32,
        "{results:#?}"
    );
    assert!(
        results[0].reason.contains("not called again"),
        "{}",
        results[0].reason
    );

    // The call the killed service made runs to its end at the server and
    // is the only one: started once, never again; the model was asked
    // once, for the plan.
    let deadline = Instant::now() + Duration::from_secs(20);
    while journal(&servers.site_a, "slow_op", Phase::Answered).is_empty() {
        assert!(
            Instant::now() < deadline,
            "slow_op never answered\n{}",
            servers.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(journal(&servers.site_a, "slow_op", Phase::Started).len(), 1);
    assert_eq!(
        journal(&servers.site_a, "slow_op", Phase::Answered).len(),
        1
    );
    assert_eq!(rig.model.requests().len(), 1);
    rig.stop_all().await;
}

/// Seed O2 with real servers: while an approved plan's first step runs at
/// site A, the operator's word wakes the model, which asks for VM 102 on
/// the elevated instance and then for site B's instance: neither is run,
/// the step in flight is heard to its end, the plan's second step is not
/// started, and the plan is put to the operator again in the thread,
/// saying what the agent asked for. Approved again, only the second step
/// runs; VM 102 is never touched at either site.
#[tokio::test]
async fn a_call_outside_the_running_plan_halts_it_after_its_step_in_flight_and_asks() {
    let (mut rig, servers) = start().await;
    rig.model.push([
        call(
            "submit_plan",
            json!({
                "rationale": "quiesce VM 101, then stop it",
                "steps": [
                    { "tool": "mcp:hv-site-a-elevated/slow_op", "arguments": { "seconds": 8 } },
                    { "tool": "mcp:hv-site-a-elevated/stop_vm", "arguments": { "vm": 101 } }
                ]
            }),
        ),
        call("hv-site-a-elevated__stop_vm", json!({ "vm": 102 })),
        call("hv-site-b-elevated__stop_vm", json!({ "vm": 102 })),
        // The model thinks on past the test's end.
        Reply::Delay(Duration::from_secs(600)),
    ]);
    post_alert(&rig.install.webhook(), super::alerts::TOKEN, "VmRunaway").await;
    let logs = || format!("{}\n{}", rig.logs(), servers.logs());
    let request = rig.agent_posts(|b| b.contains("rev-1")).await;
    let root = request["content"]["m.relates_to"]["event_id"]
        .as_str()
        .unwrap()
        .to_string();
    cli(&rig.install, &["approve", "1", "rev-1"]).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while journal(&servers.site_a, "slow_op", Phase::Started).is_empty() {
        assert!(
            Instant::now() < deadline,
            "slow_op never started\n{}",
            logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // While step 1 runs, the operator's word wakes the model.
    rig.operator_replies(&root, "VM 102 looks busy too.").await;
    let requests = model_asked(&rig.model, 3, &logs).await;
    let refused = last_tool_result(&requests[2]);
    assert!(
        refused.contains("not run")
            && refused.contains("is not what rev-1 approved")
            && refused.contains("halts once its step in flight answers"),
        "{refused}"
    );
    let requests = model_asked(&rig.model, 4, &logs).await;
    let refused = last_tool_result(&requests[3]);
    assert!(
        refused.contains("not run") && refused.contains("it is not in the approved plan"),
        "{refused}"
    );

    // Step 1 is heard to its end; the plan halts before step 2 and asks.
    let asked = rig
        .agent_posts(|b| b.contains("rev-1") && b.contains("Halted") && b.contains("outside rev-1"))
        .await;
    assert_eq!(asked["content"]["m.relates_to"]["event_id"], root.as_str());
    let s = rig
        .wait_until("rev-1 halted and up again", |s| {
            plan_status(s, 1) == Some(PlanStatus::Up)
        })
        .await;
    let plan = s.plans.iter().find(|p| p.revision == 1).unwrap();
    assert_eq!(plan.next_step, 1, "step 1 ran: {plan:#?}");
    assert_eq!(
        journal(&servers.site_a, "slow_op", Phase::Answered).len(),
        1
    );
    assert!(journal(&servers.site_a, "stop_vm", Phase::Started).is_empty());
    assert!(servers.site_b.journal().unwrap().is_empty());
    let shown = cli(&rig.install, &["plan", "show", "1"]).await;
    assert!(shown.contains("hv-site-b-elevated"), "{shown}");

    // Approved again: step 2 runs once; step 1 is not run again.
    cli(&rig.install, &["approve", "1", "rev-1"]).await;
    rig.wait_until("rev-1 is done", |s| {
        plan_status(s, 1) == Some(PlanStatus::Done)
    })
    .await;
    let stops = journal(&servers.site_a, "stop_vm", Phase::Answered);
    assert_eq!(stops.len(), 1, "{stops:#?}");
    assert_eq!(stops[0].arguments, json!({ "vm": 101 }));
    assert_eq!(journal(&servers.site_a, "slow_op", Phase::Started).len(), 1);
    let vm = |site: &HypervisorSite, id| site.vm(id).unwrap().unwrap().status;
    assert_eq!(vm(&servers.site_a, 102), VmStatus::Running);
    assert_eq!(vm(&servers.site_b, 102), VmStatus::Running);
    assert!(servers.site_b.journal().unwrap().is_empty());
    rig.stop_all().await;
}

/// The same path under one `nisse up` (every service in its process, its
/// own embedded NATS server), the alert posted to the webhook it opened:
/// the read-only listing runs at once with the read token, the plan's
/// elevated stop runs once with the write token after the CLI approves
/// it, and the elevated instance is mounted nowhere afterwards.
#[tokio::test]
async fn under_nisse_up_the_listing_runs_at_once_and_the_approved_stop_once_then_is_unmounted() {
    let servers = Servers::start().await;
    let model = ScriptedModel::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::write(
        dir.path().join("nisse.toml"),
        format!(
            "data-dir = {data:?}\n\
             [ops]\noperators = [\"cli:{me}\"]\n\
             [models]\nendpoint = \"{endpoint}\"\nretry-backoff = \"50ms\"\n\
             roles = {{ driver = \"local-driver\" }}\n\
             [models.models.local-driver]\ncontext-window = 32000\nmax-output-tokens = 1024\n\
             {mcp}",
            me = super::local_user(),
            endpoint = model.base_url(),
            mcp = servers.config().await,
        ),
    )
    .unwrap();
    // Its output to a file: it runs long enough to fill a pipe.
    let log = dir.path().join("up.log");
    let mut up = super::nisse(dir.path())
        .arg("up")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let endpoints = super::wait_endpoints(&data, &mut up).await;
    let logs = || {
        format!(
            "--- nisse up\n{}\n{}",
            std::fs::read_to_string(&log).unwrap_or_default(),
            servers.logs()
        )
    };
    tools_listed(dir.path(), &logs).await;

    model.push([
        call("hv-site-a-ro__list_vms", json!({})),
        call(
            "submit_plan",
            json!({
                "rationale": "VM 101 at site-a runs away; stop it",
                "steps": [{ "tool": "mcp:hv-site-a-elevated/stop_vm", "arguments": { "vm": "101" } }]
            }),
        ),
        call(
            "ask_human",
            json!({ "question": "VM 101 is stopped. Start it again after the night?" }),
        ),
    ]);
    let token = std::fs::read_to_string(
        endpoints["listeners"]["alertmanager-token-file"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    post_alert(
        endpoints["listeners"]["alertmanager-webhook"]
            .as_str()
            .unwrap(),
        token.trim(),
        "VmRunaway",
    )
    .await;

    let requests = model_asked(&model, 2, &logs).await;
    let listed = last_tool_result(&requests[1]);
    for vm in ["101 web running", "102 db running", "103 backup stopped"] {
        assert!(listed.contains(vm), "{vm}: {listed}");
    }
    let lists = journal(&servers.site_a, "list_vms", Phase::Answered);
    assert_eq!(lists.len(), 1, "{lists:#?}");
    assert_eq!(lists[0].token, TokenKind::Read);

    let snapshot = || {
        nisse_core::Store::open_read_only(&nisse_core::Store::path_in(&data, "ops"), "ops")
            .ok()?
            .snapshot()
            .ok()
    };
    let wait_plan = |status: PlanStatus| {
        let snapshot = &snapshot;
        let logs = &logs;
        async move {
            let deadline = Instant::now() + Duration::from_secs(40);
            loop {
                if let Some(s) = snapshot()
                    && plan_status(&s, 1) == Some(status)
                {
                    return s;
                }
                assert!(
                    Instant::now() < deadline,
                    "rev-1 never {status:?}\n{}",
                    logs()
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    wait_plan(PlanStatus::Up).await;
    assert!(
        servers
            .site_a
            .journal()
            .unwrap()
            .iter()
            .all(|c| c.tool != "stop_vm")
    );
    let approved = nisse_in(dir.path(), &["approve", "1", "rev-1"]).await;
    assert!(approved.contains("rev-1"), "{approved}");
    let s = wait_plan(PlanStatus::Done).await;
    let item = s.items[0].id.clone();
    let stops = journal(&servers.site_a, "stop_vm", Phase::Answered);
    assert_eq!(stops.len(), 1, "{stops:#?}");
    assert_eq!(stops[0].arguments, json!({ "vm": 101 }));
    assert_eq!(
        (stops[0].token, stops[0].transport.as_str()),
        (TokenKind::Write, "http")
    );
    assert_eq!(
        servers.site_a.vm(101).unwrap().unwrap().status,
        VmStatus::Stopped
    );

    // The model asks the operator; the elevated instance is mounted on no
    // item, the read-only ones still are.
    model_asked(&model, 3, &logs).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let listed = mcp_list(dir.path()).await;
        if mounted_on(&listed, "hv-site-a-elevated").is_empty() {
            assert_eq!(
                mounted_on(&listed, "hv-site-a-ro"),
                [(item.clone(), 0)],
                "{listed:#}"
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "still mounted: {listed:#}\n{}",
            logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    super::stop_within_5s(&mut up).await;
}
