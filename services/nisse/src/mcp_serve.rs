//! `nisse mcp serve`: Nisse as an MCP server (seed O5's gated surface,
//! issue "MCP both ways"), over stdio or streamable HTTP, for MCP clients
//! such as assistants and editors.
//!
//! Its tools read what the CLI reads, through the CLI's own code (each
//! answer is the text `nisse items`, `nisse item show`, `nisse plan show`,
//! `nisse world show/blast/list`, `nisse streams` or `nisse duties`
//! prints, with the same JSON as their `--json` beside it), and
//! `propose_plan` sends the very command `nisse plan propose` sends, so a
//! plan from here is classified and put up for approval like any other.
//!
//! It can never approve. No tool approves, denies, stops or changes the
//! kill switches: a call to one is an unknown tool to the protocol. And
//! below the tools, it acts on the bus as an identity of its own
//! ([`Identity::McpSurface`], `mcp`), not as an operator: the server lets
//! that identity write no bucket (so never the switches), and the brain
//! applies nothing it sends but a plan proposal. A compromised or
//! confused client, or this process itself, can put a plan up; only an
//! operator, from the CLI or chat, can let it run.
//!
//! Over HTTP every request needs `Authorization: Bearer <token>`, the
//! token read from a file (by default the one `nisse up` generates beside
//! the bus credentials), compared in constant time.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context as _;
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolResult, ContentBlock};
use rmcp::{ErrorData, ServiceExt as _, tool, tool_handler, tool_router};
use serde::Deserialize;
use sha2::{Digest as _, Sha256};
use subtle::ConstantTimeEq as _;

use nisse_bus::auth::{Identity, MCP_SURFACE};
use nisse_bus::proto::{self, operator_command::Command as Cmd};
use nisse_bus::{AgentName, Bus};

use crate::config::Config;
use crate::operator::{Sender, StepFile};
use crate::shown::Shown;

/// The channel the surface's commands name: the brain records a plan
/// from here as proposed by `operator:mcp` via `mcp`.
pub const CHANNEL: &str = "mcp";

/// Where `nisse up` keeps the HTTP transport's bearer token, under the
/// data directory, beside the bus credentials.
const TOKEN_FILE: &str = "credentials/mcp-http.token";

/// Random bytes in a generated token: 256 bits, beyond guessing.
const TOKEN_BYTES: usize = 32;

/// How `nisse mcp serve` is reached.
#[derive(Debug, Clone)]
pub enum Transport {
    /// Over its standard input and output, started by the client.
    Stdio,
    /// Streamable HTTP at `http://<addr>/mcp`, with a bearer token.
    Http {
        /// Where to listen.
        addr: SocketAddr,
        /// The token's file (default: [`generated_token_file`]).
        token_file: Option<PathBuf>,
    },
}

/// The bearer token file under `data_dir`, which `nisse up` (or the first
/// `nisse mcp serve --listen`) makes.
pub fn generated_token_file(data_dir: &Path) -> PathBuf {
    data_dir.join(TOKEN_FILE)
}

/// Makes the bearer token file under `data_dir` unless it exists (mode
/// 0600, written whole and linked into place without replacing anything,
/// so a client holding the token keeps working across restarts), and
/// returns its path.
pub fn ensure_token(data_dir: &Path) -> anyhow::Result<PathBuf> {
    // Absolute, as it is printed for clients started elsewhere.
    let path = generated_token_file(data_dir);
    let path = std::path::absolute(&path).unwrap_or(path);
    if path.exists() {
        return Ok(path);
    }
    let mut bytes = [0u8; TOKEN_BYTES];
    getrandom::fill(&mut bytes)
        .map_err(|e| anyhow::anyhow!("the system's random generator failed: {e}"))?;
    let mut token: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    token.push('\n');
    match nisse_bus::auth::write_private(&path, token.as_bytes()) {
        Ok(()) => {
            tracing::info!(path = %path.display(), "generated the MCP surface's bearer token");
            Ok(path)
        }
        // Another process made it first: theirs is the token.
        Err(_) if path.exists() => Ok(path),
        Err(e) => Err(e).context("making the MCP surface's bearer token"),
    }
}

/// Runs the MCP surface for `agent` until its client goes away (stdio) or
/// SIGINT/SIGTERM.
pub async fn serve(cfg: Config, agent: &str, how: Transport) -> anyhow::Result<()> {
    anyhow::ensure!(
        cfg.agents.iter().any(|a| a == agent),
        "`{agent}` is not one of the configured agents ({})",
        cfg.agents.join(", ")
    );
    let agent: AgentName = agent.parse()?;
    let bus = crate::inspect::connect_as(&cfg, &Identity::McpSurface)
        .await
        .with_context(|| {
            format!(
                "connecting as the MCP surface (identity `{MCP_SURFACE}`, whose credentials `nisse up` makes in {})",
                nisse_bus::auth::Credentials::in_data_dir(&cfg.data_dir)
                    .seed_file(&Identity::McpSurface)
                    .display()
            )
        })?;
    let surface = Surface::new(cfg, agent, bus);
    match how {
        Transport::Stdio => serve_stdio(surface).await,
        Transport::Http { addr, token_file } => serve_http(surface, addr, token_file).await,
    }
}

async fn serve_stdio(surface: Surface) -> anyhow::Result<()> {
    // Non-blocking pipes when the client started us with pipes (as MCP
    // clients do), so a stop signal is not held up by a blocked read.
    let running = surface
        .serve(rmcp::transport::io::stdio_pipes())
        .await
        .context("starting the MCP session on standard input and output")?;
    let stop = running.cancellation_token();
    tokio::select! {
        ended = running.waiting() => {
            ended.context("the MCP session")?;
        }
        () = stop_signal() => stop.cancel(),
    }
    Ok(())
}

async fn serve_http(
    surface: Surface,
    addr: SocketAddr,
    token_file: Option<PathBuf>,
) -> anyhow::Result<()> {
    use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
    use rmcp::transport::streamable_http_server::{
        StreamableHttpServerConfig, StreamableHttpService,
    };

    let token_file = match token_file {
        Some(path) => path,
        None => ensure_token(&surface.inner.cfg.data_dir)?,
    };
    let expected = Arc::new(read_token(&token_file)?);
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("listening on {addr}"))?;
    let bound = listener.local_addr()?;
    let shutdown = tokio_util::sync::CancellationToken::new();
    let mut config =
        StreamableHttpServerConfig::default().with_cancellation_token(shutdown.child_token());
    // The Host check guards a loopback server from DNS rebinding; the
    // bearer token guards every request whatever its Host. A server on
    // another address is reached by names this one cannot know.
    if addr.ip().is_unspecified() {
        config = config.disable_allowed_hosts();
    } else if !addr.ip().is_loopback() {
        let mut hosts = config.allowed_hosts.clone();
        hosts.push(addr.ip().to_string());
        config = config.with_allowed_hosts(hosts);
    }
    let service = StreamableHttpService::new(
        move || Ok(surface.clone()),
        LocalSessionManager::default().into(),
        config,
    );
    let app = axum::Router::new().nest_service("/mcp", service).layer(
        axum::middleware::from_fn_with_state(expected, require_bearer),
    );
    println!("MCP (streamable HTTP): http://{bound}/mcp");
    println!(
        "  every request needs `Authorization: Bearer <token>`, the token in {}",
        token_file.display()
    );
    axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            stop_signal().await;
            shutdown.cancel();
        })
        .await
        .context("serving MCP over HTTP")
}

/// Resolves at SIGINT or SIGTERM (never, if the handlers cannot be set,
/// which `nisse` reports when its runtime starts).
async fn stop_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) {
        (Ok(mut int), Ok(mut term)) => {
            tokio::select! {
                _ = int.recv() => {}
                _ = term.recv() => {}
            }
        }
        _ => std::future::pending().await,
    }
}

/// The SHA-256 of the token in `path`, surrounding whitespace (a trailing
/// newline) left out; an empty or unreadable file is an error naming it.
fn read_token(path: &Path) -> anyhow::Result<[u8; 32]> {
    let token = nisse_bus::secret::Secret::File(path.to_path_buf())
        .read_text()
        .with_context(|| format!("reading the MCP bearer token from {}", path.display()))?;
    let token = token.trim();
    anyhow::ensure!(
        !token.is_empty(),
        "the MCP bearer token file {} is empty",
        path.display()
    );
    Ok(Sha256::digest(token.as_bytes()).into())
}

/// Lets a request through only with `Authorization: Bearer <the token>`.
/// Digests of equal length are compared in constant time, so neither the
/// token's content nor its length shows in how long a refusal takes.
async fn require_bearer(
    axum::extract::State(expected): axum::extract::State<Arc<[u8; 32]>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::http::{HeaderValue, StatusCode, header};
    use axum::response::IntoResponse as _;
    let presented = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            let (scheme, token) = v.split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
        });
    let ok = presented.is_some_and(|token| {
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        bool::from(digest.ct_eq(expected.as_ref()))
    });
    if ok {
        return next.run(request).await;
    }
    let mut refused = (
        StatusCode::UNAUTHORIZED,
        "a bearer token is required: Authorization: Bearer <the token in the file `nisse mcp serve --listen` names>\n",
    )
        .into_response();
    refused.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static("Bearer realm=\"nisse\""),
    );
    refused
}

/// The MCP server: the tools, over the configuration, the agent and a
/// bus connection as the `mcp` identity, shared by every session.
#[derive(Clone)]
pub(crate) struct Surface {
    inner: Arc<Inner>,
    tool_router: ToolRouter<Self>,
}

struct Inner {
    cfg: Config,
    agent: AgentName,
    bus: Bus,
}

/// `list_items`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct ListItems {
    /// Only items in this state: active, ready, waiting, blocked or
    /// closed.
    state: Option<String>,
}

/// `show_item`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct ShowItem {
    /// The work item: its id, or its number (`14` or `#14`).
    item: String,
}

/// `show_plan`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct ShowPlan {
    /// The work item: its id, or its number (`14` or `#14`).
    item: String,
    /// The revision to show in full (`rev-3` or `3`); default the current
    /// one.
    revision: Option<String>,
}

/// `world`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct WorldArgs {
    /// An entity (host, VM, service…) by name or alias: what it is, what
    /// it relies on and everything affected if it stops. Without one,
    /// every entity of the world model.
    target: Option<String>,
}

/// `propose_plan`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct ProposePlan {
    /// The work item: its id, or its number (`14` or `#14`).
    item: String,
    /// Why this plan: what it fixes and why these steps.
    rationale: String,
    /// The steps, in order, each with the keys of a plan file's
    /// `[[step]]`: `target` and `command` for a shell step (or `tool` and
    /// `arguments`), and optionally `precondition`, `expected`,
    /// `retries`, `declared-risk`, `secrets`.
    #[schemars(with = "Vec<StepFile>")]
    steps: Vec<serde_json::Value>,
}

impl Surface {
    fn new(cfg: Config, agent: AgentName, bus: Bus) -> Self {
        Self {
            inner: Arc::new(Inner { cfg, agent, bus }),
            tool_router: Self::tool_router(),
        }
    }

    /// Runs a reading of the state store or the vault (blocking file
    /// and SQLite reads) off the async threads, and answers with what it
    /// shows, or with its error as a tool error.
    async fn read(
        &self,
        reading: impl FnOnce(&Inner) -> anyhow::Result<Shown> + Send + 'static,
    ) -> CallToolResult {
        let inner = self.inner.clone();
        match tokio::task::spawn_blocking(move || reading(&inner)).await {
            Ok(shown) => answer(shown),
            Err(e) => failed(&anyhow::anyhow!("the reading stopped: {e}")),
        }
    }
}

/// A tool's answer: the text the CLI prints (after any warning) and the
/// JSON its `--json` prints, or the error, naming what is wrong.
fn answer(shown: anyhow::Result<Shown>) -> CallToolResult {
    match shown {
        Ok(shown) => {
            let mut text: String = shown
                .warnings
                .iter()
                .map(|w| format!("warning: {w}\n"))
                .collect();
            text.push_str(&shown.text);
            let mut result = CallToolResult::success(vec![ContentBlock::text(text)]);
            result.structured_content = Some(shown.json);
            result
        }
        Err(e) => failed(&e),
    }
}

fn failed(e: &anyhow::Error) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(format!("{e:#}"))])
}

#[tool_router]
impl Surface {
    /// The agent's work items, as `nisse items` lists them.
    #[tool(
        description = "List the agent's work items: number, state, severity, when opened, scope and title (as `nisse items`).",
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn list_items(
        &self,
        Parameters(args): Parameters<ListItems>,
    ) -> Result<CallToolResult, ErrorData> {
        Ok(self
            .read(move |s| crate::items::listing(&s.cfg, s.agent.as_str(), args.state.as_deref()))
            .await)
    }

    /// One work item and its whole log, as `nisse item show` prints it.
    #[tool(
        description = "Show one work item and its whole log: every event, with when and who (as `nisse item show`).",
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn show_item(
        &self,
        Parameters(args): Parameters<ShowItem>,
    ) -> Result<CallToolResult, ErrorData> {
        Ok(self
            .read(move |s| crate::items::item_log(&s.cfg, s.agent.as_str(), &args.item))
            .await)
    }

    /// An item's plan revisions and one in full, as `nisse plan show`.
    #[tool(
        description = "Show a work item's plan revisions, and one (the current, or `revision`) in full: its approval request with every step, check, risk and what the steps affect, its status and progress (as `nisse plan show`).",
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn show_plan(
        &self,
        Parameters(args): Parameters<ShowPlan>,
    ) -> Result<CallToolResult, ErrorData> {
        let revision = match args.revision.as_deref() {
            None => None,
            Some(text) => match nisse_policy::approval::parse_revision(text) {
                Some(n) => Some(n),
                None => {
                    return Ok(failed(&anyhow::anyhow!(
                        "`{text}` is not a plan revision (e.g. `rev-3` or `3`)"
                    )));
                }
            },
        };
        Ok(self
            .read(move |s| {
                crate::operator::plan_view(&s.cfg, s.agent.as_str(), &args.item, revision)
            })
            .await)
    }

    /// The world model, or one entity and its blast radius.
    #[tool(
        description = "The world model from the vault: without `target`, every entity with its kind and what it relies on (as `nisse world list`); with one, what it is, what relies on it, and everything affected if it stops, each with the path that leads to it (as `nisse world show` and `nisse world blast`).",
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn world(
        &self,
        Parameters(args): Parameters<WorldArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        Ok(self
            .read(move |s| match &args.target {
                None => crate::world::entities(&s.cfg),
                Some(target) => {
                    let entity = crate::world::entity(&s.cfg, target)?;
                    let blast = crate::world::blast(&s.cfg, target)?;
                    let mut warnings = entity.warnings;
                    warnings.retain(|w| !blast.warnings.contains(w));
                    warnings.extend(blast.warnings);
                    let mut shown = Shown::new(
                        format!("{}\nblast radius:\n{}", entity.text, blast.text),
                        serde_json::json!({ "entity": entity.json, "blast": blast.json }),
                    );
                    shown.warnings = warnings;
                    Ok(shown)
                }
            })
            .await)
    }

    /// The streams and their consumers, as `nisse streams`.
    #[tool(
        description = "Show every agent stream: messages, consumers with pending and redelivered counts, dead letters, the executor's circuits per host and the mcp service's per instance, model spend per role and the duties' last due times (as `nisse streams`).",
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn streams(&self) -> Result<CallToolResult, ErrorData> {
        let s = &self.inner;
        Ok(answer(crate::inspect::streams_shown(&s.cfg, &s.bus).await))
    }

    /// The duties, as `nisse duties`.
    #[tool(
        description = "List the agent's scheduled checks (duties): kind, interval, runs, last run and result, failures in a row and next due (as `nisse duties`).",
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn duties(&self) -> Result<CallToolResult, ErrorData> {
        Ok(self
            .read(|s| crate::duties::listing(&s.cfg, s.agent.as_str()))
            .await)
    }

    /// Proposes a plan, as `nisse plan propose` does.
    #[tool(
        description = "Propose a plan of literal steps for a work item, as `nisse plan propose` does: the agent's brain records it as a new revision, the classifier classifies every step, and it is put up for an operator's approval (see it with `show_plan`). Nothing runs, and no host it names is bound to the item, until an operator approves it from the CLI or chat; this surface cannot approve. Answers what the brain replied.",
        annotations(
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn propose_plan(
        &self,
        Parameters(args): Parameters<ProposePlan>,
    ) -> Result<CallToolResult, ErrorData> {
        let plan = match crate::operator::plan_from_json(&args.rationale, &args.steps) {
            Ok(plan) => plan,
            Err(e) => return Ok(failed(&e.context("the plan was not sent"))),
        };
        let steps = plan.steps.len();
        let sender = Sender {
            id: MCP_SURFACE.to_string(),
            channel: CHANNEL,
        };
        let s = &self.inner;
        let replied = crate::operator::command_on(
            &s.bus,
            &s.agent,
            &args.item,
            Cmd::ProposePlan(proto::ProposePlan { plan: Some(plan) }),
            &sender,
        )
        .await;
        Ok(match replied {
            Ok(lines) => {
                let mut text = lines.join("\n");
                text.push_str(
                    "\nIt is classified and put up for an operator's approval; `show_plan` shows it.",
                );
                let mut result = CallToolResult::success(vec![ContentBlock::text(text)]);
                result.structured_content = Some(serde_json::json!({
                    "item": args.item,
                    "steps": steps,
                    "applied": true,
                    "brain": lines,
                }));
                result
            }
            Err(e) => failed(&e),
        })
    }
}

#[tool_handler(
    router = self.tool_router,
    name = "nisse",
    instructions = "Nisse's work for one agent: list and read work items and their logs, plans, the world model and blast radius, the streams and the duties; propose a plan for a work item. Proposing is all this surface can do: an operator approves or denies, from the CLI or chat."
)]
impl rmcp::ServerHandler for Surface {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_is_made_once_private_and_kept() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let path = ensure_token(dir.path()).unwrap();
        assert_eq!(path, dir.path().join("credentials/mcp-http.token"));
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let first = std::fs::read_to_string(&path).unwrap();
        assert_eq!(first.trim().len(), 2 * TOKEN_BYTES);
        assert!(first.trim().chars().all(|c| c.is_ascii_hexdigit()));
        // Kept on the next start.
        ensure_token(dir.path()).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), first);
        let digest = read_token(&path).unwrap();
        let again: [u8; 32] = Sha256::digest(first.trim().as_bytes()).into();
        assert_eq!(digest, again);

        let empty = dir.path().join("empty");
        std::fs::write(&empty, "\n").unwrap();
        let e = format!("{:#}", read_token(&empty).unwrap_err());
        assert!(
            e.contains("is empty") && e.contains(&empty.display().to_string()),
            "{e}"
        );
    }
}
