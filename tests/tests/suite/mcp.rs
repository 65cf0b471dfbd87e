//! The MCP stand-ins speak real MCP: `nisse-test-mcp` driven by rmcp's
//! client over stdio and streamable HTTP (tools and their annotations,
//! the read token refused a write, the write token's stop recorded once,
//! HTTP refusing a request without a token), and the reference filesystem
//! server from npm listing a directory and reading a file over stdio.

use std::collections::BTreeMap;
use std::process::Stdio;

use pretty_assertions::assert_eq;
use rmcp::model::{CallToolRequestParams, CallToolResult, Tool};
use rmcp::service::RunningService;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{RoleClient, ServiceExt as _};
use serde_json::{Value, json};

use nisse_tests::mcp::{
    FORBIDDEN, HypervisorSite, Phase, StdioCommand, TokenKind, UNAUTHORIZED, VmStatus,
    filesystem_server,
};

type Client = RunningService<RoleClient, ()>;

/// A client of the server `command` starts, over its stdio.
async fn stdio_client(command: &StdioCommand) -> Client {
    let (transport, _stderr) = TokioChildProcess::builder(command.command())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    ().serve(transport).await.unwrap()
}

/// A client of the HTTP server at `url`, presenting `token`.
async fn http_client(url: &str, token: &str) -> Result<Client, String> {
    let transport = StreamableHttpClientTransport::from_config(
        StreamableHttpClientTransportConfig::with_uri(url).auth_header(token),
    );
    ().serve(transport).await.map_err(|e| e.to_string())
}

async fn call(client: &Client, tool: &str, args: Value) -> CallToolResult {
    let Value::Object(args) = args else {
        panic!("arguments must be an object: {args}")
    };
    client
        .call_tool(CallToolRequestParams::new(tool.to_string()).with_arguments(args))
        .await
        .unwrap()
}

/// The text of a result's content.
fn text(result: &CallToolResult) -> String {
    result
        .content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.clone()))
        .collect::<Vec<_>>()
        .join("\n")
}

fn is_error(result: &CallToolResult) -> bool {
    result.is_error == Some(true)
}

/// A tool's `(readOnlyHint, destructiveHint, idempotentHint)`.
type Hints = (Option<bool>, Option<bool>, Option<bool>);

/// Each tool's [`Hints`].
fn hints(tools: &[Tool]) -> BTreeMap<String, Hints> {
    tools
        .iter()
        .map(|t| {
            let a = t.annotations.clone().unwrap_or_default();
            (
                t.name.to_string(),
                (a.read_only_hint, a.destructive_hint, a.idempotent_hint),
            )
        })
        .collect()
}

#[tokio::test]
async fn stdio_lists_the_tools_with_schemas_and_annotations() {
    let site = HypervisorSite::new("site-a").await.unwrap();
    let client = stdio_client(&site.stdio_command(Some(site.read_token()))).await;
    let info = client.peer_info().unwrap();
    assert_eq!(info.server_info.as_ref().unwrap().name, "nisse-test-mcp");
    let tools = client.list_all_tools().await.unwrap();
    let expected = BTreeMap::from(
        [
            ("delete_vm", (Some(false), Some(true), Some(false))),
            ("list_vms", (Some(true), None, None)),
            ("read_console", (Some(false), Some(true), Some(false))),
            ("slow_op", (Some(false), Some(false), Some(false))),
            ("start_vm", (Some(false), Some(false), Some(true))),
            ("stop_vm", (Some(false), Some(false), Some(true))),
            ("vm_status", (Some(true), None, None)),
        ]
        .map(|(name, hints)| (name.to_string(), hints)),
    );
    assert_eq!(hints(&tools), expected);
    let stop = tools.iter().find(|t| t.name == "stop_vm").unwrap();
    assert_eq!(
        stop.schema_as_json_value(),
        json!({
            "type": "object",
            "properties": {
                "vm": {"type": "integer", "minimum": 1, "description": "The VM's id, e.g. 101."}
            },
            "required": ["vm"],
            "additionalProperties": false
        })
    );
    let slow = tools.iter().find(|t| t.name == "slow_op").unwrap();
    assert_eq!(slow.input_schema["properties"]["seconds"]["type"], "number");
    client.cancel().await.unwrap();
}

#[tokio::test]
async fn stdio_read_token_lists_vms_but_cannot_stop_one() {
    let site = HypervisorSite::new("site-a").await.unwrap();
    let client = stdio_client(&site.stdio_command(Some(site.read_token()))).await;

    let listed = call(&client, "list_vms", json!({})).await;
    assert!(!is_error(&listed), "{}", text(&listed));
    assert_eq!(
        listed.structured_content.clone().unwrap(),
        json!({"site": "site-a", "vms": [
            {"vmid": 101, "name": "web", "status": "running", "site": "site-a"},
            {"vmid": 102, "name": "db", "status": "running", "site": "site-a"},
            {"vmid": 103, "name": "backup", "status": "stopped", "site": "site-a"},
        ]})
    );
    assert!(
        text(&listed).contains("101 web running"),
        "{}",
        text(&listed)
    );

    let stopped = call(&client, "stop_vm", json!({"vm": 101})).await;
    assert!(is_error(&stopped));
    assert_eq!(text(&stopped), FORBIDDEN);
    assert_eq!(site.vm(101).unwrap().unwrap().status, VmStatus::Running);

    // Reading the console only reads: the read token may.
    let console = call(&client, "read_console", json!({"vm": 102})).await;
    assert!(!is_error(&console), "{}", text(&console));
    assert!(text(&console).contains("db login:"), "{}", text(&console));

    let unknown = call(&client, "vm_status", json!({"vm": 999})).await;
    assert!(is_error(&unknown));
    assert_eq!(
        text(&unknown),
        "no VM 999 at site site-a (its VMs: 101, 102, 103)"
    );
    let wrong = call(&client, "vm_status", json!({"vm": "101"})).await;
    assert!(is_error(&wrong));
    assert!(
        text(&wrong).starts_with("invalid arguments"),
        "{}",
        text(&wrong)
    );
    client.cancel().await.unwrap();

    let journal = site.journal().unwrap();
    let seen: Vec<(&str, TokenKind, bool)> = journal
        .iter()
        .map(|c| {
            assert_eq!(c.phase, Phase::Answered);
            assert_eq!(c.transport, "stdio");
            (
                c.tool.as_str(),
                c.token,
                c.result.as_ref().unwrap().is_error,
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            ("list_vms", TokenKind::Read, false),
            ("stop_vm", TokenKind::Read, true),
            ("read_console", TokenKind::Read, false),
            ("vm_status", TokenKind::Read, true),
            ("vm_status", TokenKind::Read, true),
        ]
    );
}

#[tokio::test]
async fn stdio_write_token_stops_101_once_and_the_site_keeps_it() {
    let site = HypervisorSite::new("site-a").await.unwrap();
    let elevated = stdio_client(&site.stdio_command(Some(site.write_token()))).await;
    let stopped = call(&elevated, "stop_vm", json!({"vm": 101})).await;
    assert!(!is_error(&stopped), "{}", text(&stopped));
    assert_eq!(text(&stopped), "VM 101 (web) is stopped");
    assert_eq!(
        stopped.structured_content.unwrap(),
        json!({"vmid": 101, "name": "web", "status": "stopped", "site": "site-a"})
    );
    elevated.cancel().await.unwrap();

    assert_eq!(site.vm(101).unwrap().unwrap().status, VmStatus::Stopped);
    assert_eq!(site.vm(102).unwrap().unwrap().status, VmStatus::Running);
    let calls = site.calls("stop_vm").unwrap();
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(calls[0].arguments, json!({"vm": 101}));
    assert_eq!(calls[0].token, TokenKind::Write);
    assert_eq!(calls[0].site, "site-a");
    assert_eq!(site.journal().unwrap().len(), 1);

    // Another server of the site (the read-only instance, started after)
    // sees the stop: the state is the site's, not the process's.
    let read_only = stdio_client(&site.stdio_command(Some(site.read_token()))).await;
    let status = call(&read_only, "vm_status", json!({"vm": 101})).await;
    assert_eq!(text(&status), "VM 101 (web) at site-a is stopped");
    let unauthorized = stdio_client(&site.stdio_command(Some("not-a-token"))).await;
    let refused = call(&unauthorized, "list_vms", json!({})).await;
    assert!(is_error(&refused));
    assert_eq!(text(&refused), UNAUTHORIZED);
    let anonymous = stdio_client(&site.stdio_command(None)).await;
    let refused = call(&anonymous, "vm_status", json!({"vm": 101})).await;
    assert_eq!(text(&refused), UNAUTHORIZED);
    for client in [read_only, unauthorized, anonymous] {
        client.cancel().await.unwrap();
    }
    let tokens: Vec<TokenKind> = site.journal().unwrap().iter().map(|c| c.token).collect();
    assert_eq!(
        tokens,
        [
            TokenKind::Write,
            TokenKind::Read,
            TokenKind::Unknown,
            TokenKind::Missing
        ]
    );
}

#[tokio::test]
async fn slow_op_is_journaled_when_it_starts_and_when_it_answers() {
    let site = HypervisorSite::new("site-b").await.unwrap();
    let client = stdio_client(&site.stdio_command(Some(site.write_token()))).await;
    let done = call(&client, "slow_op", json!({"seconds": 0.2})).await;
    assert!(!is_error(&done), "{}", text(&done));
    let phases: Vec<(String, Phase)> = site
        .journal()
        .unwrap()
        .into_iter()
        .map(|c| (c.tool, c.phase))
        .collect();
    assert_eq!(
        phases,
        [
            ("slow_op".to_string(), Phase::Started),
            ("slow_op".to_string(), Phase::Answered)
        ]
    );

    // Killed in flight: the start is journaled, the answer never is.
    let pending = {
        let peer = client.peer().clone();
        tokio::spawn(async move {
            peer.call_tool(
                CallToolRequestParams::new("slow_op")
                    .with_arguments(json!({"seconds": 30}).as_object().unwrap().clone()),
            )
            .await
        })
    };
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    while site.journal().unwrap().len() < 3 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "slow_op never started"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    client.cancel().await.unwrap();
    assert!(pending.await.unwrap().is_err());
    let journal = site.journal().unwrap();
    assert_eq!(journal.len(), 3, "{journal:?}");
    assert_eq!(journal[2].phase, Phase::Started);
    assert_eq!(journal[2].arguments, json!({"seconds": 30}));
}

#[tokio::test]
async fn http_checks_bearer_tokens() {
    let site = HypervisorSite::new("site-b").await.unwrap();
    let server = site.start_http().await.unwrap();
    assert!(
        server.url().starts_with("http://127.0.0.1:") && server.url().ends_with("/mcp"),
        "{}",
        server.url()
    );

    let elevated = http_client(server.url(), site.write_token()).await.unwrap();
    let tools = elevated.list_all_tools().await.unwrap();
    assert_eq!(tools.len(), 7);
    let stopped = call(&elevated, "stop_vm", json!({"vm": 102})).await;
    assert_eq!(text(&stopped), "VM 102 (db) is stopped");

    let read_only = http_client(server.url(), site.read_token()).await.unwrap();
    let refused = call(&read_only, "start_vm", json!({"vm": 102})).await;
    assert!(is_error(&refused));
    assert_eq!(text(&refused), FORBIDDEN);
    let listed = call(&read_only, "list_vms", json!({})).await;
    assert_eq!(
        listed.structured_content.unwrap()["vms"][1]["status"],
        "stopped"
    );
    elevated.cancel().await.unwrap();
    read_only.cancel().await.unwrap();

    let error = http_client(server.url(), "not-a-token").await.unwrap_err();
    assert!(
        error.contains("401") || error.to_lowercase().contains("auth"),
        "{error}"
    );
    let raw = reqwest::Client::new()
        .post(server.url())
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(
            json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                   "params": {"name": "stop_vm", "arguments": {"vm": 101}}})
            .to_string(),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(raw.status(), reqwest::StatusCode::UNAUTHORIZED);
    assert_eq!(raw.text().await.unwrap(), UNAUTHORIZED);

    assert_eq!(site.vm(101).unwrap().unwrap().status, VmStatus::Running);
    let calls: Vec<(String, TokenKind, String)> = site
        .journal()
        .unwrap()
        .into_iter()
        .map(|c| (c.tool, c.token, c.transport))
        .collect();
    let http = |tool: &str, token| (tool.to_string(), token, "http".to_string());
    assert_eq!(
        calls,
        [
            http("stop_vm", TokenKind::Write),
            http("start_vm", TokenKind::Read),
            http("list_vms", TokenKind::Read),
        ]
    );
    assert!(server.log().is_empty(), "{}", server.log());
}

#[tokio::test]
async fn npm_filesystem_server_lists_and_reads_over_stdio() {
    let dir = tempfile::tempdir().unwrap();
    // The server resolves symlinks in its allowed directories; the paths
    // it is asked about must be resolved the same way.
    let root = dir.path().canonicalize().unwrap();
    std::fs::write(root.join("notes.txt"), "zpool scrub on sundays\n").unwrap();
    std::fs::create_dir(root.join("logs")).unwrap();

    let command = filesystem_server(&root).await.unwrap();
    let client = stdio_client(&command).await;
    let tools = client.list_all_tools().await.unwrap();
    assert!(
        tools.iter().any(|t| t.name == "list_directory"),
        "{:?}",
        tools.iter().map(|t| &t.name).collect::<Vec<_>>()
    );

    let listed = call(
        &client,
        "list_directory",
        json!({"path": root.display().to_string()}),
    )
    .await;
    assert!(!is_error(&listed), "{}", text(&listed));
    let mut lines: Vec<String> = text(&listed).lines().map(str::to_string).collect();
    lines.sort();
    assert_eq!(lines, ["[DIR] logs", "[FILE] notes.txt"]);

    let read = call(
        &client,
        "read_text_file",
        json!({"path": root.join("notes.txt").display().to_string()}),
    )
    .await;
    assert!(!is_error(&read), "{}", text(&read));
    assert_eq!(text(&read), "zpool scrub on sundays\n");

    let outside = call(&client, "read_text_file", json!({"path": "/etc/hostname"})).await;
    assert!(is_error(&outside), "{}", text(&outside));
    client.cancel().await.unwrap();
}
