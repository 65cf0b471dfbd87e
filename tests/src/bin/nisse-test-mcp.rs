//! `nisse-test-mcp`: one site's hypervisor API as an MCP server, for
//! tests (see `nisse_tests::mcp`). Built with `rmcp`, the SDK the services
//! under test use, so what they talk to is a real MCP server.
//!
//! ```text
//! nisse-test-mcp --site site-a --state state.json --journal journal.jsonl \
//!     --read-token T1 --write-token T2 [--listen 127.0.0.1:0]
//! ```
//!
//! Without `--listen` it serves MCP on stdin/stdout with the token in
//! `HV_TOKEN`; with it, streamable HTTP at `http://<addr>/mcp` with the
//! token as `Authorization: Bearer`, printing `listening <url>` once bound.
//! The state file keeps the site's VMs across restarts and is shared by
//! every server process of the site; the journal gets a JSON line per call.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use axum::http::{HeaderMap, StatusCode, header, request::Parts};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    InitializeResult, JsonObject, ListToolsResult, PaginatedRequestParams, ServerCapabilities,
    ServerConfig, Tool, ToolAnnotations,
};
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler, ServiceExt as _};
use serde_json::{Value, json};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use nisse_tests::mcp::{
    Call, FORBIDDEN, LISTENING, Outcome, Phase, SiteState, TOKEN_ENV, TokenKind, UNAUTHORIZED, Vm,
    VmStatus,
};

/// The longest `slow_op` sleeps: a test that needs more is stuck.
const SLOW_OP_MAX_SECONDS: f64 = 3600.0;

const USAGE: &str = "usage: nisse-test-mcp --site SITE --state FILE --journal FILE \
                     --read-token TOKEN --write-token TOKEN [--listen ADDR]";

/// The command line.
struct Options {
    site: String,
    state: PathBuf,
    journal: PathBuf,
    read_token: String,
    write_token: String,
    listen: Option<SocketAddr>,
}

impl Options {
    fn parse(mut args: impl Iterator<Item = String>) -> anyhow::Result<Self> {
        let (mut site, mut state, mut journal, mut read, mut write, mut listen) =
            (None, None, None, None, None, None);
        while let Some(flag) = args.next() {
            let slot = match flag.as_str() {
                "--site" => &mut site,
                "--state" => &mut state,
                "--journal" => &mut journal,
                "--read-token" => &mut read,
                "--write-token" => &mut write,
                "--listen" => &mut listen,
                other => anyhow::bail!("unknown argument {other:?}\n{USAGE}"),
            };
            let value = args
                .next()
                .with_context(|| format!("{flag} needs a value\n{USAGE}"))?;
            *slot = Some(value);
        }
        let need = |value: Option<String>, flag: &str| {
            value
                .filter(|v| !v.is_empty())
                .with_context(|| format!("{flag} is required\n{USAGE}"))
        };
        let (read_token, write_token) =
            (need(read, "--read-token")?, need(write, "--write-token")?);
        anyhow::ensure!(
            read_token != write_token,
            "the read and the write token must differ"
        );
        Ok(Self {
            site: need(site, "--site")?,
            state: need(state, "--state")?.into(),
            journal: need(journal, "--journal")?.into(),
            read_token,
            write_token,
            listen: listen
                .map(|a| {
                    a.parse()
                        .with_context(|| format!("--listen {a:?} is not an address:port"))
                })
                .transpose()?,
        })
    }
}

/// One tool of the site, and what its server needs to know of it.
struct ToolSpec {
    name: &'static str,
    description: &'static str,
    /// Whether the read token may call it: it changes nothing (whatever
    /// its annotations declare).
    reads_only: bool,
    annotations: ToolAnnotations,
    /// The input schema's properties and the required ones.
    input: Value,
    output: Option<Value>,
}

/// The JSON schema of a VM in results.
fn vm_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "vmid": {"type": "integer"},
            "name": {"type": "string"},
            "status": {"type": "string", "enum": ["running", "stopped"]},
            "site": {"type": "string"}
        },
        "required": ["vmid", "name", "status", "site"]
    })
}

/// Every tool of the site.
fn specs() -> Vec<ToolSpec> {
    let vm_input = json!({
        "type": "object",
        "properties": {
            "vm": {"type": "integer", "minimum": 1, "description": "The VM's id, e.g. 101."}
        },
        "required": ["vm"],
        "additionalProperties": false
    });
    let hints = |title: &str, read_only, destructive, idempotent| {
        ToolAnnotations::from_raw(
            Some(title.to_string()),
            Some(read_only),
            destructive,
            idempotent,
            Some(false),
        )
    };
    vec![
        ToolSpec {
            name: "list_vms",
            description: "List the site's VMs with their status.",
            reads_only: true,
            annotations: hints("List VMs", true, None, None),
            input: json!({"type": "object", "properties": {}, "additionalProperties": false}),
            output: Some(json!({
                "type": "object",
                "properties": {
                    "site": {"type": "string"},
                    "vms": {"type": "array", "items": vm_schema()}
                },
                "required": ["site", "vms"]
            })),
        },
        ToolSpec {
            name: "vm_status",
            description: "Show one VM's status.",
            reads_only: true,
            annotations: hints("VM status", true, None, None),
            input: vm_input.clone(),
            output: Some(vm_schema()),
        },
        ToolSpec {
            name: "stop_vm",
            description: "Stop a VM (nothing happens to a stopped one).",
            reads_only: false,
            annotations: hints("Stop VM", false, Some(false), Some(true)),
            input: vm_input.clone(),
            output: Some(vm_schema()),
        },
        ToolSpec {
            name: "start_vm",
            description: "Start a VM (nothing happens to a running one).",
            reads_only: false,
            annotations: hints("Start VM", false, Some(false), Some(true)),
            input: vm_input.clone(),
            output: Some(vm_schema()),
        },
        ToolSpec {
            name: "delete_vm",
            description: "Delete a VM and its disks, for good.",
            reads_only: false,
            annotations: hints("Delete VM", false, Some(true), Some(false)),
            input: vm_input.clone(),
            output: None,
        },
        ToolSpec {
            name: "read_console",
            description: "Read what a VM's console shows.",
            // It only reads, yet declares itself destructive: the policy
            // tests need a server hint stricter than the policy.
            reads_only: true,
            annotations: hints("Read console", false, Some(true), Some(false)),
            input: vm_input,
            output: None,
        },
        ToolSpec {
            name: "slow_op",
            description: "Run a long maintenance operation: takes `seconds`, then answers.",
            reads_only: false,
            annotations: hints("Slow operation", false, Some(false), Some(false)),
            input: json!({
                "type": "object",
                "properties": {
                    "seconds": {
                        "type": "number",
                        "minimum": 0,
                        "maximum": SLOW_OP_MAX_SECONDS,
                        "description": "How long it takes."
                    }
                },
                "required": ["seconds"],
                "additionalProperties": false
            }),
            output: None,
        },
    ]
}

fn object(value: Value) -> JsonObject {
    match value {
        Value::Object(map) => map,
        _ => JsonObject::new(),
    }
}

impl ToolSpec {
    fn tool(&self) -> Tool {
        let tool = Tool::new(self.name, self.description, object(self.input.clone()))
            .annotate(self.annotations.clone());
        match &self.output {
            Some(output) => tool.with_raw_output_schema(Arc::new(object(output.clone()))),
            None => tool,
        }
    }
}

/// The site's MCP server: one per stdio process, one per HTTP session.
#[derive(Clone)]
struct Hypervisor {
    options: Arc<Options>,
    /// `HV_TOKEN`, for a stdio server (an HTTP request brings its own).
    stdio_token: Option<String>,
}

/// A call's answer: its text, maybe structured content, and whether it is
/// an error.
struct Answer {
    is_error: bool,
    text: String,
    structured: Option<Value>,
}

impl Answer {
    fn ok(text: impl Into<String>) -> Self {
        Self {
            is_error: false,
            text: text.into(),
            structured: None,
        }
    }

    fn error(text: impl Into<String>) -> Self {
        Self {
            is_error: true,
            text: text.into(),
            structured: None,
        }
    }

    fn with(mut self, structured: Value) -> Self {
        self.structured = Some(structured);
        self
    }
}

impl Hypervisor {
    fn journal(
        &self,
        transport: &str,
        call: &CallToolRequestParams,
        token: TokenKind,
        phase: Phase,
        result: Option<&Answer>,
    ) {
        let entry = Call {
            time: OffsetDateTime::now_utc()
                .format(&Rfc3339)
                .unwrap_or_default(),
            site: self.options.site.clone(),
            transport: transport.to_string(),
            tool: call.name.to_string(),
            arguments: Value::Object(call.arguments.clone().unwrap_or_default()),
            token,
            phase,
            result: result.map(|a| Outcome {
                is_error: a.is_error,
                text: a.text.clone(),
            }),
        };
        // A journal that cannot be written is a broken test setup; the
        // call is still answered, and stderr says why the journal lacks it.
        if let Err(e) = entry.append(&self.options.journal) {
            eprintln!("nisse-test-mcp: {e:#}");
        }
    }

    fn vm_json(&self, vm: &Vm) -> Value {
        json!({"vmid": vm.vmid, "name": vm.name, "status": vm.status, "site": self.options.site})
    }

    fn unknown_vm(&self, state: &SiteState, vmid: u64) -> Answer {
        let ids: Vec<String> = state.vms.iter().map(|vm| vm.vmid.to_string()).collect();
        Answer::error(format!(
            "no VM {vmid} at site {} (its VMs: {})",
            self.options.site,
            if ids.is_empty() {
                "none".to_string()
            } else {
                ids.join(", ")
            }
        ))
    }

    /// Reads or changes the state under the site's lock.
    fn with_state(&self, change: impl FnOnce(&mut SiteState) -> Answer) -> Answer {
        SiteState::update(&self.options.state, &self.options.site, change)
            .unwrap_or_else(|e| Answer::error(format!("the hypervisor's state is broken: {e:#}")))
    }

    fn set_status(&self, vmid: u64, status: VmStatus) -> Answer {
        self.with_state(|state| {
            let Some(vm) = state.vms.iter_mut().find(|vm| vm.vmid == vmid) else {
                return self.unknown_vm(state, vmid);
            };
            let text = if vm.status == status {
                format!("VM {vmid} ({}) was already {status}", vm.name)
            } else {
                vm.status = status;
                format!("VM {vmid} ({}) is {status}", vm.name)
            };
            Answer::ok(text).with(self.vm_json(vm))
        })
    }

    /// Runs tool `name` with `args` (already checked against its schema's
    /// shape).
    async fn run(&self, name: &str, args: &JsonObject) -> Answer {
        let site = &self.options.site;
        let vmid = || args.get("vm").and_then(Value::as_u64).unwrap_or_default();
        match name {
            "list_vms" => self.with_state(|state| {
                let lines: Vec<String> = state
                    .vms
                    .iter()
                    .map(|vm| format!("{} {} {}", vm.vmid, vm.name, vm.status))
                    .collect();
                let vms: Vec<Value> = state.vms.iter().map(|vm| self.vm_json(vm)).collect();
                Answer::ok(format!("VMs at {site}:\n{}", lines.join("\n")))
                    .with(json!({"site": site, "vms": vms}))
            }),
            "vm_status" => self.with_state(|state| match state.vm(vmid()) {
                Some(vm) => Answer::ok(format!(
                    "VM {} ({}) at {site} is {}",
                    vm.vmid, vm.name, vm.status
                ))
                .with(self.vm_json(vm)),
                None => self.unknown_vm(state, vmid()),
            }),
            "stop_vm" => self.set_status(vmid(), VmStatus::Stopped),
            "start_vm" => self.set_status(vmid(), VmStatus::Running),
            "delete_vm" => self.with_state(|state| {
                let vmid = vmid();
                match state.vms.iter().position(|vm| vm.vmid == vmid) {
                    Some(i) => {
                        let vm = state.vms.remove(i);
                        Answer::ok(format!("VM {vmid} ({}) deleted", vm.name))
                    }
                    None => self.unknown_vm(state, vmid),
                }
            }),
            "read_console" => self.with_state(|state| match state.vm(vmid()) {
                Some(vm) if vm.status == VmStatus::Running => Answer::ok(format!(
                    "Debian GNU/Linux 13 {name} ttyS0\n\n{name} login: ",
                    name = vm.name
                )),
                Some(vm) => Answer::ok(format!(
                    "VM {} ({}) is stopped: its console is blank",
                    vm.vmid, vm.name
                )),
                None => self.unknown_vm(state, vmid()),
            }),
            "slow_op" => {
                let seconds = args
                    .get("seconds")
                    .and_then(Value::as_f64)
                    .unwrap_or_default();
                tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
                Answer::ok(format!("slow operation at {site} done after {seconds} s"))
            }
            other => Answer::error(format!("no tool {other}")),
        }
    }
}

/// What is wrong with `args` for `spec`, if anything: the checks its input
/// schema states (a real API refuses such calls too).
fn invalid_arguments(spec: &ToolSpec, args: &JsonObject) -> Option<String> {
    let properties = spec.input["properties"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    if let Some(extra) = args.keys().find(|k| !properties.contains_key(*k)) {
        return Some(format!(
            "invalid arguments: {} takes no argument `{extra}`",
            spec.name
        ));
    }
    for (name, schema) in &properties {
        let Some(value) = args.get(name) else {
            return Some(format!("invalid arguments: `{name}` is required"));
        };
        match schema["type"].as_str() {
            Some("integer") if value.as_u64().is_none_or(|v| v == 0) => {
                return Some(format!(
                    "invalid arguments: `{name}` must be a positive integer (a VM id), not {value}"
                ));
            }
            Some("number")
                if value
                    .as_f64()
                    .is_none_or(|v| !(0.0..=SLOW_OP_MAX_SECONDS).contains(&v)) =>
            {
                return Some(format!(
                    "invalid arguments: `{name}` must be a number from 0 to {SLOW_OP_MAX_SECONDS}, not {value}"
                ));
            }
            _ => {}
        }
    }
    None
}

/// The bearer token of an HTTP request.
fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")
        .map(str::trim)
}

impl ServerHandler for Hypervisor {
    fn get_info(&self) -> ServerConfig {
        InitializeResult::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(
                Implementation::new("nisse-test-mcp", env!("CARGO_PKG_VERSION"))
                    .with_title(format!("Hypervisor {}", self.options.site)),
            )
            .with_instructions(format!(
                "The hypervisor API of site {}: its VMs, their status, console and power.",
                self.options.site
            ))
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        Ok(ListToolsResult::with_all_items(
            specs().iter().map(ToolSpec::tool).collect(),
        ))
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        specs().iter().find(|s| s.name == name).map(ToolSpec::tool)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let parts = context.extensions.get::<Parts>();
        let (transport, presented) = match parts {
            Some(parts) => ("http", bearer(&parts.headers)),
            None => ("stdio", self.stdio_token.as_deref()),
        };
        let token = TokenKind::of(
            presented,
            &self.options.read_token,
            &self.options.write_token,
        );
        let args = request.arguments.clone().unwrap_or_default();
        let specs = specs();
        let spec = specs.iter().find(|s| s.name == request.name);
        let answer = match (token, spec) {
            (TokenKind::Missing | TokenKind::Unknown, _) => Answer::error(UNAUTHORIZED),
            (_, None) => {
                let text = format!("unknown tool {}", request.name);
                self.journal(
                    transport,
                    &request,
                    token,
                    Phase::Answered,
                    Some(&Answer::error(text.clone())),
                );
                return Err(McpError::invalid_params(text, None));
            }
            (_, Some(spec)) => match invalid_arguments(spec, &args) {
                Some(problem) => Answer::error(problem),
                None if token == TokenKind::Read && !spec.reads_only => Answer::error(FORBIDDEN),
                None => {
                    if spec.name == "slow_op" {
                        self.journal(transport, &request, token, Phase::Started, None);
                    }
                    self.run(spec.name, &args).await
                }
            },
        };
        self.journal(transport, &request, token, Phase::Answered, Some(&answer));
        let mut result = if answer.is_error {
            CallToolResult::error(vec![ContentBlock::text(answer.text)])
        } else {
            CallToolResult::success(vec![ContentBlock::text(answer.text)])
        };
        result.structured_content = answer.structured;
        Ok(result.into())
    }
}

/// Refuses an HTTP request without one of the site's tokens before it
/// reaches MCP, as an API gateway would.
async fn require_token(
    axum::extract::State(options): axum::extract::State<Arc<Options>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse as _;
    match TokenKind::of(
        bearer(request.headers()),
        &options.read_token,
        &options.write_token,
    ) {
        TokenKind::Read | TokenKind::Write => next.run(request).await,
        TokenKind::Missing | TokenKind::Unknown => (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Bearer realm=\"hypervisor\"")],
            UNAUTHORIZED,
        )
            .into_response(),
    }
}

async fn serve_http(options: Arc<Options>, addr: SocketAddr) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding {addr}"))?;
    let bound = listener.local_addr()?;
    let handler = Hypervisor {
        options: options.clone(),
        stdio_token: None,
    };
    let mcp = StreamableHttpService::new(
        move || Ok(handler.clone()),
        Arc::new(LocalSessionManager::default()),
        StreamableHttpServerConfig::default(),
    );
    let app = axum::Router::new()
        .route_service("/mcp", mcp)
        .layer(axum::middleware::from_fn_with_state(options, require_token));
    // The harness waits for this line: the port is bound from here on.
    println!("{LISTENING}http://{bound}/mcp");
    {
        use std::io::Write as _;
        std::io::stdout().flush()?;
    }
    axum::serve(listener, app).await.context("serving HTTP")
}

async fn serve_stdio(options: Arc<Options>) -> anyhow::Result<()> {
    let handler = Hypervisor {
        options,
        stdio_token: std::env::var(TOKEN_ENV).ok(),
    };
    let running = handler
        .serve(rmcp::transport::stdio())
        .await
        .context("starting MCP on stdio")?;
    running.waiting().await.context("serving MCP on stdio")?;
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let options = Arc::new(Options::parse(std::env::args().skip(1))?);
    // A new site's state is written at once, so its VMs are on disk before
    // the first call, as a real hypervisor's would be.
    SiteState::update(&options.state, &options.site, |_| ())?;
    match options.listen {
        Some(addr) => serve_http(options, addr).await,
        None => serve_stdio(options).await,
    }
}
