//! The mcp service end to end: `nisse serve mcp` in its own process,
//! holding real MCP servers (the harness's hypervisor stand-in over stdio
//! and over streamable HTTP, and an instance that cannot be reached),
//! with this test playing the brain: it signs mounts and calls with a key
//! whose public half the service reads where the brain would write it,
//! and asks the real classifier's `decide` for the verdict each call
//! names, published where the classifier publishes it, as a call under
//! step 1 of the mounted plan rev-1.
//! The policy file declares the instances and the tools the tests call,
//! which the service's kill-switch wall classifies each call by.

use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use tokio::process::Child;

use nisse_bus::AnyMessage;
use nisse_bus::proto::{
    Envelope, ExecPermission, McpFailure, McpMount, McpRequest, McpResult, McpStatus, McpTools,
};
use nisse_bus::signing::{SigningKey, key_files};
use nisse_tests::TestNats;
use nisse_tests::mcp::{HttpHypervisor, HypervisorSite, Phase, SiteState};

use super::alerts::Install;
use super::gates::{cli, stream_kinds};
use super::signal;

/// The item every call here is for, unless a test says otherwise.
const ITEM: &str = "wi-mcp-1";

/// The policy file: each instance with the privilege `[mcp]` gives it,
/// and the tools the tests call with their class. `stop_vm` on the
/// read-only instance is left out, so the policy treats it as elevated.
const POLICY: &str = r#"
version = 1

[mcp.hv-site-a-ro]
privilege = "read-only"
[mcp.hv-site-a-ro.tools.list_vms]
privilege = "read-only"
[mcp.hv-site-a-ro.tools.vm_status]
privilege = "read-only"
# Its server declares it destructive: the hint is stricter, and holds.
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

[mcp.hv-site-b-ro]
privilege = "read-only"
[mcp.hv-site-b-ro.tools.list_vms]
privilege = "read-only"
"#;

/// A `nisse serve mcp` with three instances of agent `ops`: site A's
/// hypervisor read-only over stdio (its token in `secret-env`) and
/// elevated over streamable HTTP (its token in `token-file`), and site
/// B's, which cannot be reached.
struct Rig {
    nats: TestNats,
    install: Install,
    brain: SigningKey,
    site: HypervisorSite,
    _http: HttpHypervisor,
    bus: nisse_bus::Bus,
    mcp: Child,
}

impl Rig {
    async fn start() -> Self {
        let nats = TestNats::secured(&["ops"]).await.unwrap();
        let bus = nats.bus(&["ops"]).await.unwrap();
        bus.ensure_topology().await.unwrap();
        let install = Install::new(&nats);
        // The brain's key, where the brain keeps it: the service reads
        // the public half.
        let (key_file, public_file) = key_files(&install.data(), "ops");
        let (brain, _) = SigningKey::load_or_create(&key_file, &public_file).unwrap();
        let site = HypervisorSite::new("site-a").await.unwrap();
        let http = site.start_http().await.unwrap();
        let read_token = install.path().join("hv-site-a-ro.token");
        std::fs::write(&read_token, format!("{}\n", site.read_token())).unwrap();
        let write_token = install.path().join("hv-site-a-elevated.token");
        std::fs::write(&write_token, site.write_token()).unwrap();
        let stdio = site.stdio_command(None);
        let command: Vec<String> = std::iter::once(stdio.program.display().to_string())
            .chain(stdio.args)
            .collect();
        let closed = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let policy = install.path().join("policy.toml");
        std::fs::write(&policy, POLICY).unwrap();
        let cfg = install.path().join("nisse.toml");
        let mut text = std::fs::read_to_string(&cfg).unwrap();
        text.push_str(&format!(
            "[policy]\nfile = {policy:?}\n\
             [mcp]\n\
             connect-timeout = \"10s\"\n\
             reconnect-backoff = \"200ms\"\n\
             reconnect-backoff-max = \"1s\"\n\
             breaker-failures = 2\n\
             [[mcp.instance]]\n\
             name = \"hv-site-a-ro\"\nservice = \"hv\"\nsite = \"site-a\"\nprivilege = \"read-only\"\n\
             command = {command:?}\n\
             secret-env = {{ HV_TOKEN = {read:?} }}\n\
             [[mcp.instance]]\n\
             name = \"hv-site-a-elevated\"\nservice = \"hv\"\nsite = \"site-a\"\nprivilege = \"elevated\"\n\
             url = {url:?}\ntoken-file = {write:?}\n\
             [[mcp.instance]]\n\
             name = \"hv-site-b-ro\"\nservice = \"hv\"\nsite = \"site-b\"\nprivilege = \"read-only\"\n\
             url = \"http://127.0.0.1:{closed}/mcp\"\n",
            policy = policy.display().to_string(),
            read = read_token.display().to_string(),
            url = http.url(),
            write = write_token.display().to_string(),
        ));
        std::fs::write(&cfg, text).unwrap();
        let mcp = install.serve(&["mcp"]);
        Self {
            nats,
            install,
            brain,
            site,
            _http: http,
            bus,
            mcp,
        }
    }

    fn log(&self) -> String {
        self.install.log(&["mcp"])
    }

    /// Mounts `instances` for `item`, signed by the brain.
    async fn mount(&self, item: &str, instances: &[&str], plan_revision: u32, n: u32) {
        let mut m = McpMount {
            envelope: Some(envelope(item, format!("mount:{item}:{n}"))),
            work_item_id: item.into(),
            instances: instances.iter().map(|i| i.to_string()).collect(),
            reason: "the test's mount".into(),
            plan_revision,
            ..Default::default()
        };
        self.brain.sign(&mut m);
        self.bus.publish(m).await.unwrap();
    }

    /// A call of `instance`/`tool` with `arguments` for `item`, signed by
    /// the brain.
    fn call(
        &self,
        rid: &str,
        item: &str,
        instance: &str,
        tool: &str,
        arguments: &str,
    ) -> McpRequest {
        let mut r = unsigned(rid, item, instance, tool, arguments);
        self.brain.sign(&mut r);
        r
    }

    /// Publishes the verdict `request` names and `request`, and waits for
    /// its answer.
    async fn ask(&mut self, request: McpRequest) -> McpResult {
        let rid = request.request_id.clone();
        self.send(request).await;
        self.answer(&rid, Duration::from_secs(20)).await
    }

    /// Publishes the verdict `request` names ([`Rig::classified`]), then
    /// `request`.
    async fn send(&self, request: McpRequest) {
        self.classified(&request).await;
        self.bus.publish(request).await.unwrap();
    }

    /// Publishes the verdict the classifier gives on `request`'s call
    /// (`nisse_classifier::decide` with the policy file, no switch set:
    /// asked before any test flips one), in the scope the call claims: a
    /// plan whose next step is this very call when it claims a step, the
    /// operator's confirmation when it claims one. The risk declared is
    /// the one the server's hints give the tool, as the brain declares
    /// it. Nothing for a call that names no verdict or whose arguments
    /// are no object (refused before any verdict is read).
    async fn classified(&self, request: &McpRequest) {
        let Some(permission) = request
            .permission
            .as_ref()
            .filter(|p| !p.verdict_request_id.is_empty())
        else {
            return;
        };
        let Ok(arguments) = serde_json::from_str::<serde_json::Value>(&request.arguments_json)
        else {
            return;
        };
        let tool = nisse_policy::mcp::tool_name(&request.instance, &request.tool);
        let Ok(action) = nisse_policy::Action::new(&tool, &request.instance, &arguments) else {
            return;
        };
        let hint = announcements(&self.nats)
            .await
            .into_iter()
            .rev()
            .find(|t| t.instance == request.instance)
            .and_then(|t| t.tools.into_iter().find(|x| x.name == request.tool))
            .and_then(|t| nisse_policy::mcp::hinted_risk(t.read_only_hint, t.destructive_hint));
        let call = action.to_wire(hint);
        let step = |_| nisse_bus::proto::PlanStep {
            tool: call.tool.clone(),
            target: call.target.clone(),
            arguments_json: call.arguments_json.clone(),
            ..Default::default()
        };
        let classify = nisse_bus::proto::ClassifyRequest {
            envelope: request.envelope.clone(),
            request_id: permission.verdict_request_id.clone(),
            action: Some(call.clone()),
            scope: Some(nisse_bus::proto::AgreedScope {
                approved_plan_revision: permission.plan_revision,
                approved_steps: if permission.plan_revision > 0 {
                    (0..=permission.step).map(step).collect()
                } else {
                    Vec::new()
                },
                next_step: permission.step,
                operator_confirmed: permission.operator_confirmed,
                ..Default::default()
            }),
            model: String::new(),
        };
        let policy = nisse_policy::Policy::with_file("policy.toml", POLICY).unwrap();
        let verdict =
            nisse_classifier::decide(&policy, &classify, Ok(nisse_bus::SwitchBoard::default()));
        self.bus.publish(verdict).await.unwrap();
    }

    /// Waits for the answer to `rid`.
    async fn answer(&mut self, rid: &str, within: Duration) -> McpResult {
        let deadline = Instant::now() + within;
        loop {
            if let Some(r) = results(&self.nats)
                .await
                .into_iter()
                .find(|r| r.request_id == rid)
            {
                return r;
            }
            if let Some(status) = self.mcp.try_wait().unwrap() {
                panic!("nisse serve mcp exited with {status}:\n{}", self.log());
            }
            assert!(
                Instant::now() < deadline,
                "no answer to {rid}; the service's log:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until every instance was announced once: `McpTools` by
    /// instance.
    async fn announced(&mut self) -> Vec<McpTools> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let tools = announcements(&self.nats).await;
            let named = |n: &str| tools.iter().any(|t| t.instance == n);
            if named("hv-site-a-ro") && named("hv-site-a-elevated") && named("hv-site-b-ro") {
                return tools;
            }
            if let Some(status) = self.mcp.try_wait().unwrap() {
                panic!("nisse serve mcp exited with {status}:\n{}", self.log());
            }
            assert!(
                Instant::now() < deadline,
                "not every instance was announced ({:?}); the service's log:\n{}",
                tools.iter().map(|t| &t.instance).collect::<Vec<_>>(),
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

fn envelope(item: &str, message_id: String) -> Envelope {
    Envelope {
        agent: "ops".into(),
        work_item_id: item.into(),
        message_id,
        ..Default::default()
    }
}

fn unsigned(rid: &str, item: &str, instance: &str, tool: &str, arguments: &str) -> McpRequest {
    McpRequest {
        envelope: Some(envelope(item, format!("mcp:{rid}"))),
        request_id: rid.into(),
        instance: instance.into(),
        tool: tool.into(),
        arguments_json: arguments.into(),
        // Step 1 of the plan rev-1 the tests mount under.
        permission: Some(ExecPermission {
            verdict_request_id: format!("verdict:{rid}"),
            plan_revision: 1,
            step: 0,
            operator_confirmed: false,
        }),
        ..Default::default()
    }
}

async fn results(nats: &TestNats) -> Vec<McpResult> {
    stream_kinds(nats)
        .await
        .into_iter()
        .filter_map(|m| match m {
            AnyMessage::McpResult(r) => Some(r),
            _ => None,
        })
        .collect()
}

async fn announcements(nats: &TestNats) -> Vec<McpTools> {
    stream_kinds(nats)
        .await
        .into_iter()
        .filter_map(|m| match m {
            AnyMessage::McpTools(t) => Some(t),
            _ => None,
        })
        .collect()
}

fn status(r: &McpResult) -> (McpStatus, McpFailure) {
    (
        McpStatus::try_from(r.status).unwrap(),
        McpFailure::try_from(r.failure).unwrap(),
    )
}

/// The journal's lines of `tool`, by phase.
fn journal(site: &HypervisorSite, tool: &str) -> (usize, usize) {
    let calls: Vec<_> = site
        .journal()
        .unwrap()
        .into_iter()
        .filter(|c| c.tool == tool)
        .collect();
    let started = calls.iter().filter(|c| c.phase == Phase::Started).count();
    let answered = calls.iter().filter(|c| c.phase == Phase::Answered).count();
    (started, answered)
}

/// The pid of the stdio MCP server `nisse serve mcp` (pid `parent`)
/// started, if one runs.
fn server_process(parent: u32) -> Option<u32> {
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // `pid (comm) state ppid …`: the name may hold spaces, not `)`.
        let rest = stat.rsplit_once(')')?.1;
        let mut fields = rest.split_whitespace();
        let state = fields.next()?;
        let ppid: u32 = fields.next()?.parse().ok()?;
        let cmdline = std::fs::read_to_string(format!("/proc/{pid}/cmdline")).ok()?;
        (ppid == parent && state != "Z" && cmdline.contains(nisse_tests::mcp::BINARY))
            .then_some(pid)
    })
}

/// Waits until `check` holds for the site's journal.
async fn journal_until(site: &HypervisorSite, what: &str, check: impl Fn(&HypervisorSite) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !check(site) {
        assert!(Instant::now() < deadline, "the journal never showed {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn instances_are_announced_and_calls_pass_the_walls_each_once() {
    let mut rig = Rig::start().await;

    // Every instance is announced: the two reachable with their server
    // and tools, each tool with the hints its server declared; the third
    // with why it cannot be reached.
    let tools = rig.announced().await;
    let of = |name: &str| tools.iter().find(|t| t.instance == name).unwrap();
    for name in ["hv-site-a-ro", "hv-site-a-elevated"] {
        let t = of(name);
        assert!(t.error.is_empty(), "{name}: {}", t.error);
        assert!(t.server.starts_with("nisse-test-mcp "), "{}", t.server);
        let names: Vec<&str> = t.tools.iter().map(|t| t.name.as_str()).collect();
        for tool in ["list_vms", "stop_vm", "read_console", "slow_op"] {
            assert!(names.contains(&tool), "{name} lacks {tool}: {names:?}");
        }
        let tool = |n: &str| t.tools.iter().find(|t| t.name == n).unwrap();
        assert_eq!(tool("list_vms").read_only_hint, Some(true));
        assert_eq!(tool("read_console").destructive_hint, Some(true));
        assert_eq!(tool("stop_vm").idempotent_hint, Some(true));
        let schema: serde_json::Value =
            serde_json::from_str(&tool("stop_vm").input_schema_json).unwrap();
        assert_eq!(schema["type"], "object");
        assert!(schema["properties"]["vm"].is_object(), "{schema}");
    }
    let b = of("hv-site-b-ro");
    assert!(b.tools.is_empty());
    assert!(
        b.error.contains("hv-site-b-ro cannot be reached"),
        "{}",
        b.error
    );

    // A VM whose name is the read-only instance's token, which the
    // server gets only through secret-env: it never comes back.
    let token = rig.site.read_token().to_string();
    SiteState::update(&rig.site.state_file(), "site-a", |s| {
        s.vms[2].name = token.clone();
    })
    .unwrap();

    rig.mount(ITEM, &["hv-site-a-ro", "hv-site-b-ro"], 0, 1)
        .await;

    // A read-only call, answered with the content and the structured
    // content, the token redacted from both.
    let listed = rig
        .ask(rig.call("r-list", ITEM, "hv-site-a-ro", "list_vms", "{}"))
        .await;
    assert_eq!(
        status(&listed),
        (McpStatus::Completed, McpFailure::Unspecified),
        "{}",
        listed.reason
    );
    assert!(!listed.is_error, "{}", listed.content);
    assert!(listed.content.contains("web"), "{}", listed.content);
    assert!(listed.content.contains("[REDACTED]"), "{}", listed.content);
    assert!(!listed.content.contains(&token), "{}", listed.content);
    let structured: serde_json::Value = serde_json::from_str(&listed.structured_json).unwrap();
    assert_eq!(structured["vms"][0]["vmid"], 101);
    assert_eq!(structured["vms"][2]["name"], "[REDACTED]");
    assert!(!listed.structured_json.contains(&token));
    assert_eq!(listed.envelope.as_ref().unwrap().work_item_id, ITEM);
    assert_eq!(listed.dropped_bytes, 0);

    // The same call again (the brain's retry: a new message id, the same
    // request id) is answered from the record: the server is not called.
    let mut again = rig.call("r-list", ITEM, "hv-site-a-ro", "list_vms", "{}");
    again.envelope.as_mut().unwrap().message_id = "mcp:r-list:retry1".into();
    rig.bus.publish(again).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !rig.log().contains("the recorded answer is given again") {
        assert!(
            Instant::now() < deadline,
            "not answered again:\n{}",
            rig.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(journal(&rig.site, "list_vms"), (0, 1));
    assert_eq!(
        results(&rig.nats)
            .await
            .iter()
            .filter(|r| r.request_id == "r-list")
            .count(),
        1,
        "the answer given again has the first one's message id"
    );

    // A tool the server answers with an error (the read-only token may
    // not stop a VM): the call was made, and the tool says it failed.
    let r = rig
        .ask(rig.call(
            "r-forbidden",
            ITEM,
            "hv-site-a-ro",
            "stop_vm",
            r#"{"vm":101}"#,
        ))
        .await;
    assert_eq!(
        status(&r),
        (McpStatus::Completed, McpFailure::Unspecified),
        "{}",
        r.reason
    );
    assert!(r.is_error, "{}", r.content);
    assert!(
        r.content.contains(nisse_tests::mcp::FORBIDDEN),
        "{}",
        r.content
    );

    // Unsigned, signed by a key no brain holds, altered after signing.
    let r = rig
        .ask(unsigned(
            "r-unsigned",
            ITEM,
            "hv-site-a-ro",
            "list_vms",
            "{}",
        ))
        .await;
    assert_eq!(status(&r), (McpStatus::Refused, McpFailure::Signature));
    assert!(r.reason.contains("not signed"), "{}", r.reason);
    let mut forged = unsigned("r-forged", ITEM, "hv-site-a-ro", "list_vms", "{}");
    SigningKey::ephemeral().sign(&mut forged);
    let r = rig.ask(forged).await;
    assert_eq!(status(&r), (McpStatus::Refused, McpFailure::Signature));
    assert!(
        r.reason.contains("a key no brain here holds"),
        "{}",
        r.reason
    );
    let mut altered = rig.call(
        "r-altered",
        ITEM,
        "hv-site-a-ro",
        "vm_status",
        r#"{"vm":101}"#,
    );
    altered.arguments_json = r#"{"vm":102}"#.into();
    let r = rig.ask(altered).await;
    assert_eq!(status(&r), (McpStatus::Refused, McpFailure::Signature));
    assert!(r.reason.contains("altered"), "{}", r.reason);

    // Not mounted for the item, or for an item with no mount at all.
    let r = rig
        .ask(rig.call("r-unmounted", ITEM, "hv-site-a-elevated", "list_vms", "{}"))
        .await;
    assert_eq!(status(&r), (McpStatus::Refused, McpFailure::NotMounted));
    assert!(
        r.reason.contains(
            "hv-site-a-elevated is not mounted for work item wi-mcp-1 (mounted: hv-site-a-ro, hv-site-b-ro)"
        ),
        "{}",
        r.reason
    );
    let r = rig
        .ask(rig.call("r-no-mount", "wi-mcp-2", "hv-site-a-ro", "list_vms", "{}"))
        .await;
    assert_eq!(status(&r), (McpStatus::Refused, McpFailure::NotMounted));
    assert!(r.reason.contains("(mounted: none)"), "{}", r.reason);

    // An instance, a tool and arguments that are not there.
    let r = rig
        .ask(rig.call("r-instance", ITEM, "hv-site-c-ro", "list_vms", "{}"))
        .await;
    assert_eq!(
        status(&r),
        (McpStatus::Refused, McpFailure::UnknownInstance)
    );
    let r = rig
        .ask(rig.call("r-tool", ITEM, "hv-site-a-ro", "format_disks", "{}"))
        .await;
    assert_eq!(status(&r), (McpStatus::Refused, McpFailure::UnknownTool));
    assert!(
        r.reason.contains("lists no tool `format_disks`"),
        "{}",
        r.reason
    );
    let r = rig
        .ask(rig.call("r-args", ITEM, "hv-site-a-ro", "vm_status", "[101]"))
        .await;
    assert_eq!(status(&r), (McpStatus::Refused, McpFailure::BadRequest));

    // The instance that cannot be reached: the call fails, naming it and
    // why; after two such failures its circuit opens, and a call fails at
    // once without trying.
    for rid in ["r-site-b-1", "r-site-b-2"] {
        let r = rig
            .ask(rig.call(rid, ITEM, "hv-site-b-ro", "list_vms", "{}"))
            .await;
        assert_eq!(
            status(&r),
            (McpStatus::Failed, McpFailure::Connect),
            "{}",
            r.reason
        );
        assert!(
            r.reason.contains("hv-site-b-ro cannot be reached")
                && r.reason.contains("Connection refused"),
            "{}",
            r.reason
        );
    }
    let r = rig
        .ask(rig.call("r-site-b-3", ITEM, "hv-site-b-ro", "list_vms", "{}"))
        .await;
    assert_eq!(
        status(&r),
        (McpStatus::Failed, McpFailure::CircuitOpen),
        "{}",
        r.reason
    );
    assert!(
        r.reason.contains("the circuit for hv-site-b-ro is open"),
        "{}",
        r.reason
    );
    // The operator sees it in `nisse streams`, beside the executor's.
    let streams = cli(&rig.install, &["streams"]).await;
    let line = streams
        .lines()
        .find(|l| l.contains("mcp circuit hv-site-b-ro"))
        .unwrap_or_else(|| panic!("{streams}"));
    assert!(
        line.contains("open for ")
            && line.contains("failures=2")
            && line.contains("Connection refused"),
        "{line}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&cli(&rig.install, &["streams", "--json"]).await).unwrap();
    assert_eq!(
        json["streams"][0]["mcp_circuits"][0]["host"], "hv-site-b-ro",
        "{json:#}"
    );

    // While autonomy is off, a call that changes something is refused
    // unless the operator confirmed the very call; reading goes on. The
    // policy's class decides, not the instance's privilege: a tool the
    // policy does not list is elevated even on the read-only instance.
    rig.mount("wi-mcp-3", &["hv-site-a-ro", "hv-site-a-elevated"], 1, 1)
        .await;
    rig.bus
        .update_switches("operator-test", |b| b.autonomy_off = true)
        .await
        .unwrap();
    let r = rig
        .ask(rig.call(
            "r-stop",
            "wi-mcp-3",
            "hv-site-a-elevated",
            "stop_vm",
            r#"{"vm":101}"#,
        ))
        .await;
    assert_eq!(status(&r), (McpStatus::Refused, McpFailure::KillSwitch));
    assert!(
        r.reason
            .starts_with("refused by the mcp service: autonomy is off")
            && r.reason
                .contains("stop_vm on hv-site-a-elevated was not called"),
        "{}",
        r.reason
    );
    let r = rig
        .ask(rig.call(
            "r-stop-ro",
            "wi-mcp-3",
            "hv-site-a-ro",
            "stop_vm",
            r#"{"vm":101}"#,
        ))
        .await;
    assert_eq!(status(&r), (McpStatus::Refused, McpFailure::KillSwitch));
    assert!(r.reason.contains("autonomy is off"), "{}", r.reason);
    let r = rig
        .ask(rig.call(
            "r-status",
            "wi-mcp-3",
            "hv-site-a-ro",
            "vm_status",
            r#"{"vm":101}"#,
        ))
        .await;
    assert_eq!(
        status(&r),
        (McpStatus::Completed, McpFailure::Unspecified),
        "{}",
        r.reason
    );
    assert!(r.content.contains("running"), "{}", r.content);
    // The policy lists read_console as read-only, but its server declares
    // it destructive: the server's word is stricter, so it waits too.
    let r = rig
        .ask(rig.call(
            "r-console",
            "wi-mcp-3",
            "hv-site-a-ro",
            "read_console",
            r#"{"vm":101}"#,
        ))
        .await;
    assert_eq!(
        status(&r),
        (McpStatus::Refused, McpFailure::KillSwitch),
        "{}",
        r.reason
    );
    assert!(
        rig.site.calls("read_console").unwrap().is_empty(),
        "nothing was called"
    );
    let mut confirmed = unsigned(
        "r-stop-confirmed",
        "wi-mcp-3",
        "hv-site-a-elevated",
        "stop_vm",
        r#"{"vm":101}"#,
    );
    confirmed.permission.as_mut().unwrap().operator_confirmed = true;
    rig.brain.sign(&mut confirmed);
    let r = rig.ask(confirmed).await;
    assert_eq!(
        status(&r),
        (McpStatus::Completed, McpFailure::Unspecified),
        "{}",
        r.reason
    );
    assert!(!r.is_error, "{}", r.content);
    assert_eq!(
        rig.site.vm(101).unwrap().unwrap().status,
        nisse_tests::mcp::VmStatus::Stopped
    );

    // A call that outruns its timeout is abandoned: it may still take
    // effect, and says so.
    rig.bus
        .update_switches("operator-test", |b| b.autonomy_off = false)
        .await
        .unwrap();
    let mut hurried = unsigned(
        "r-hurried",
        "wi-mcp-3",
        "hv-site-a-elevated",
        "slow_op",
        r#"{"seconds":3}"#,
    );
    hurried.timeout_ms = 300;
    rig.brain.sign(&mut hurried);
    let r = rig.ask(hurried).await;
    assert_eq!(
        status(&r),
        (McpStatus::Failed, McpFailure::Timeout),
        "{}",
        r.reason
    );
    assert!(r.reason.contains("may still take effect"), "{}", r.reason);

    // Every refusal called nothing: the server saw one list, one status,
    // the stop it refused the read-only token and the one confirmed stop.
    assert_eq!(journal(&rig.site, "list_vms"), (0, 1));
    assert_eq!(journal(&rig.site, "vm_status"), (0, 1));
    assert_eq!(journal(&rig.site, "stop_vm"), (0, 2));

    // The read-only instance's server process dies: the next call starts
    // it again (with its secret read anew) and is answered.
    let child = server_process(rig.mcp.id().unwrap()).expect("the stdio server runs");
    signal(child as i32, Signal::SIGKILL);
    let r = rig
        .ask(rig.call(
            "r-after-crash",
            ITEM,
            "hv-site-a-ro",
            "vm_status",
            r#"{"vm":102}"#,
        ))
        .await;
    assert_eq!(
        status(&r),
        (McpStatus::Completed, McpFailure::Unspecified),
        "{}",
        r.reason
    );
    assert!(r.content.contains("running"), "{}", r.content);
    let restarted = server_process(rig.mcp.id().unwrap()).expect("the stdio server runs again");
    assert_ne!(restarted, child);
    super::alerts::stop(&mut rig.mcp).await;
}

#[tokio::test]
async fn a_never_switch_set_after_the_verdict_refuses_the_call_on_its_target_alone() {
    let mut rig = Rig::start().await;
    rig.announced().await;
    rig.mount("wi-mcp-never", &["hv-site-a-elevated"], 1, 1)
        .await;

    // The operator switches VM 101 at site A to never, by the name the
    // policy gives an MCP tool's target, after the call was permitted.
    let out = cli(
        &rig.install,
        &[
            "autonomy",
            "never",
            "hv-site-a-elevated/101",
            "--reason",
            "its backup is running",
        ],
    )
    .await;
    assert!(out.contains("never: hv-site-a-elevated/101"), "{out}");

    // Stopping 101 is refused, naming the switch, even confirmed by the
    // operator: nothing reaches the server.
    let r = rig
        .ask(rig.call(
            "r-never-101",
            "wi-mcp-never",
            "hv-site-a-elevated",
            "stop_vm",
            r#"{"vm":101}"#,
        ))
        .await;
    assert_eq!(
        status(&r),
        (McpStatus::Refused, McpFailure::KillSwitch),
        "{}",
        r.reason
    );
    assert!(
        r.reason.starts_with(
            "refused by the mcp service: `hv-site-a-elevated/101` is switched to never (its backup is running (set by cli:"
        ) && r.reason.contains("stop_vm on hv-site-a-elevated was not called"),
        "{}",
        r.reason
    );
    let mut confirmed = unsigned(
        "r-never-101-confirmed",
        "wi-mcp-never",
        "hv-site-a-elevated",
        "stop_vm",
        r#"{"vm":101}"#,
    );
    confirmed.permission.as_mut().unwrap().operator_confirmed = true;
    rig.brain.sign(&mut confirmed);
    let r = rig.ask(confirmed).await;
    assert_eq!(status(&r), (McpStatus::Refused, McpFailure::KillSwitch));
    assert!(r.reason.contains("hv-site-a-elevated/101"), "{}", r.reason);
    assert_eq!(journal(&rig.site, "stop_vm"), (0, 0));
    assert_eq!(
        rig.site.vm(101).unwrap().unwrap().status,
        nisse_tests::mcp::VmStatus::Running
    );

    // Another VM on the same instance is not held by it.
    let r = rig
        .ask(rig.call(
            "r-never-102",
            "wi-mcp-never",
            "hv-site-a-elevated",
            "stop_vm",
            r#"{"vm":102}"#,
        ))
        .await;
    assert_eq!(
        status(&r),
        (McpStatus::Completed, McpFailure::Unspecified),
        "{}",
        r.reason
    );
    assert!(!r.is_error, "{}", r.content);
    assert_eq!(
        rig.site.vm(102).unwrap().unwrap().status,
        nisse_tests::mcp::VmStatus::Stopped
    );
    assert_eq!(journal(&rig.site, "stop_vm"), (0, 1));

    // The switches are read at every call: cleared, 101 is stopped too.
    cli(
        &rig.install,
        &["autonomy", "clear", "hv-site-a-elevated/101"],
    )
    .await;
    let r = rig
        .ask(rig.call(
            "r-cleared-101",
            "wi-mcp-never",
            "hv-site-a-elevated",
            "stop_vm",
            r#"{"vm":101}"#,
        ))
        .await;
    assert_eq!(
        status(&r),
        (McpStatus::Completed, McpFailure::Unspecified),
        "{}",
        r.reason
    );
    assert_eq!(
        rig.site.vm(101).unwrap().unwrap().status,
        nisse_tests::mcp::VmStatus::Stopped
    );
    assert_eq!(journal(&rig.site, "stop_vm"), (0, 2));
    super::alerts::stop(&mut rig.mcp).await;
}

/// A call names the classifier's verdict it passed; the mcp service reads
/// that verdict itself, from the classifier's own subject, and refuses a
/// call it does not cover, naming what differs, however well the brain
/// signed it: nothing reaches the server.
#[tokio::test]
async fn a_call_whose_verdict_judged_another_call_or_none_is_refused_naming_what_differs() {
    let mut rig = Rig::start().await;
    rig.announced().await;
    rig.mount(ITEM, &["hv-site-a-ro", "hv-site-a-elevated"], 1, 1)
        .await;
    let naming = |mut r: McpRequest, verdict: &str, brain: &SigningKey| {
        r.permission.as_mut().unwrap().verdict_request_id = verdict.into();
        brain.sign(&mut r);
        r
    };
    // The classifier judged the status of VM 101 on the read-only
    // instance, and stopping VM 101 as step 1 of rev-1.
    rig.classified(&rig.call(
        "r-status-101",
        ITEM,
        "hv-site-a-ro",
        "vm_status",
        r#"{"vm":101}"#,
    ))
    .await;
    rig.classified(&rig.call(
        "r-stop-101",
        ITEM,
        "hv-site-a-elevated",
        "stop_vm",
        r#"{"vm":101}"#,
    ))
    .await;

    let unclaimed = {
        let mut r = unsigned(
            "r-stop-unclaimed",
            ITEM,
            "hv-site-a-elevated",
            "stop_vm",
            r#"{"vm":101}"#,
        );
        r.permission.as_mut().unwrap().plan_revision = 0;
        r
    };
    let cases = [
        (
            unsigned("r-status-102", ITEM, "hv-site-a-ro", "vm_status", r#"{"vm":102}"#),
            "verdict:r-status-101",
            r#"is not the one the classifier's verdict `verdict:r-status-101` judged (arguments: the verdict judged `{"vm":101}`, the call has `{"vm":102}`)"#.to_string(),
        ),
        (
            unsigned("r-stop-as-status", ITEM, "hv-site-a-elevated", "stop_vm", r#"{"vm":101}"#),
            "verdict:r-status-101",
            "(tool: the verdict judged `mcp:hv-site-a-ro/vm_status`, the call is `mcp:hv-site-a-elevated/stop_vm`; instance: the verdict judged it on hv-site-a-ro, the call is on hv-site-a-elevated)".to_string(),
        ),
        (
            unclaimed,
            "verdict:r-stop-101",
            "the classifier's verdict `verdict:r-stop-101` judged it class 3 (dangerous), which is carried out only as a step of an approved plan or with the operator's confirmation, and the call carries none of them".to_string(),
        ),
        (
            unsigned("r-unnamed", ITEM, "hv-site-a-ro", "vm_status", r#"{"vm":101}"#),
            "",
            "the call names no verdict of the classifier".to_string(),
        ),
        (
            unsigned("r-never-judged", ITEM, "hv-site-a-ro", "vm_status", r#"{"vm":101}"#),
            "verdict:never",
            "names the classifier's verdict `verdict:never`, and the classifier published none under that id".to_string(),
        ),
    ];
    for (call, verdict, why) in cases {
        let rid = call.request_id.clone();
        rig.bus
            .publish(naming(call, verdict, &rig.brain))
            .await
            .unwrap();
        let r = rig.answer(&rid, Duration::from_secs(20)).await;
        assert_eq!(
            status(&r),
            (McpStatus::Refused, McpFailure::Verdict),
            "{rid}: {}",
            r.reason
        );
        assert!(r.reason.contains(&why), "{rid}: {}", r.reason);
        assert!(
            r.reason.ends_with("nothing was called"),
            "{rid}: {}",
            r.reason
        );
    }
    assert_eq!(journal(&rig.site, "vm_status"), (0, 0));
    assert_eq!(journal(&rig.site, "stop_vm"), (0, 0));
    assert_eq!(
        rig.site.vm(101).unwrap().unwrap().status,
        nisse_tests::mcp::VmStatus::Running
    );

    // Each verdict is good for its own call.
    let mut own = rig.call(
        "r-status-101",
        ITEM,
        "hv-site-a-ro",
        "vm_status",
        r#"{"vm":101}"#,
    );
    own.envelope.as_mut().unwrap().message_id = "mcp:r-status-101:own".into();
    rig.bus.publish(own).await.unwrap();
    let r = rig.answer("r-status-101", Duration::from_secs(20)).await;
    assert_eq!(
        status(&r),
        (McpStatus::Completed, McpFailure::Unspecified),
        "{}",
        r.reason
    );
    assert_eq!(journal(&rig.site, "vm_status"), (0, 1));
    super::alerts::stop(&mut rig.mcp).await;
}

#[tokio::test]
async fn a_call_in_flight_when_the_service_is_killed_has_an_unknown_outcome_and_is_not_made_again()
{
    let mut rig = Rig::start().await;
    rig.announced().await;
    rig.mount("wi-mcp-slow", &["hv-site-a-elevated"], 1, 1)
        .await;
    let slow = rig.call(
        "r-slow",
        "wi-mcp-slow",
        "hv-site-a-elevated",
        "slow_op",
        r#"{"seconds":4}"#,
    );
    rig.send(slow).await;
    journal_until(&rig.site, "slow_op started", |s| {
        journal(s, "slow_op").0 == 1
    })
    .await;

    // Killed mid-call, then started again.
    signal(rig.mcp.id().unwrap() as i32, Signal::SIGKILL);
    rig.mcp.wait().await.unwrap();
    rig.mcp = rig.install.serve(&["mcp"]);

    let r = rig.answer("r-slow", Duration::from_secs(30)).await;
    assert_eq!(
        status(&r),
        (McpStatus::OutcomeUnknown, McpFailure::Interrupted),
        "{}",
        r.reason
    );
    assert!(
        r.reason.contains("hv-site-a-elevated/slow_op") && r.reason.contains("not called again"),
        "{}",
        r.reason
    );
    // The call the killed service made runs to its end at the server, and
    // it is the only one: started once, answered once, never again.
    journal_until(&rig.site, "slow_op answered", |s| {
        journal(s, "slow_op").1 == 1
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(journal(&rig.site, "slow_op"), (1, 1));

    // Stopped in order instead, the service lets the call in flight
    // finish on its connection and answers it before it exits.
    let graceful = rig.call(
        "r-graceful",
        "wi-mcp-slow",
        "hv-site-a-elevated",
        "slow_op",
        r#"{"seconds":1}"#,
    );
    rig.send(graceful).await;
    journal_until(&rig.site, "the second slow_op started", |s| {
        journal(s, "slow_op").0 == 2
    })
    .await;
    super::alerts::stop(&mut rig.mcp).await;
    let r = results(&rig.nats)
        .await
        .into_iter()
        .find(|r| r.request_id == "r-graceful")
        .expect("answered before the service exited");
    assert_eq!(
        status(&r),
        (McpStatus::Completed, McpFailure::Unspecified),
        "{}",
        r.reason
    );
}

/// `nisse serve mcp` consults the policy for every call: started with a
/// policy that classifies an instance otherwise than `[mcp]` configures
/// it, it refuses to start, naming the instance and both privileges.
#[tokio::test]
async fn serve_mcp_refuses_a_policy_that_disagrees_with_an_instances_privilege() {
    let nats = TestNats::secured(&["ops"]).await.unwrap();
    let bus = nats.bus(&["ops"]).await.unwrap();
    bus.ensure_topology().await.unwrap();
    let install = Install::new(&nats);
    let policy = install.path().join("policy.toml");
    std::fs::write(
        &policy,
        "version = 1\n[mcp.hv-site-a-ro]\nprivilege = \"elevated\"\n",
    )
    .unwrap();
    let cfg = install.path().join("nisse.toml");
    let mut text = std::fs::read_to_string(&cfg).unwrap();
    text.push_str(&format!(
        "[policy]\nfile = {policy:?}\n\
         [[mcp.instance]]\n\
         name = \"hv-site-a-ro\"\nservice = \"hv\"\nsite = \"site-a\"\nprivilege = \"read-only\"\n\
         url = \"http://127.0.0.1:9/mcp\"\n",
        policy = policy.display().to_string(),
    ));
    std::fs::write(&cfg, text).unwrap();
    let mut mcp = install.serve(&["mcp"]);
    let status = tokio::time::timeout(Duration::from_secs(30), mcp.wait())
        .await
        .expect("nisse serve mcp exits")
        .unwrap();
    assert!(!status.success());
    let log = install.log(&["mcp"]);
    assert!(
        log.contains(
            "mcp instance `hv-site-a-ro` is configured read-only but the policy declares it elevated"
        ),
        "{log}"
    );
}
