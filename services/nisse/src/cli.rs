//! The command line.

use std::path::PathBuf;

use anyhow::Context as _;
use clap::{Parser, Subcommand};

use nisse_bus::proto::{self, operator_command::Command as Cmd};

use crate::config::Config;

/// Nisse: self-hosted agents that operate a homelab and build software.
#[derive(Debug, Parser)]
#[command(name = "nisse", version)]
pub struct Cli {
    /// Configuration file (default: `nisse.toml` in the working directory,
    /// if present).
    #[arg(long, global = true, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Data directory (overrides `data-dir` from the configuration).
    #[arg(long, global = true, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// Work through the control plane at this URL (`https://host:9096`,
    /// or `http://` on loopback) instead of this machine's bus and
    /// stores: every command that reads or decides goes through its API
    /// as the token's operator, from any machine that reaches it. The
    /// token is NISSE_CONTROL_TOKEN, or the file --control-token-file
    /// names; `nisse control token <you>` on the installation prints it.
    #[arg(long, global = true, value_name = "URL", env = "NISSE_CONTROL_URL")]
    pub control: Option<String>,
    /// The file the control token is read from (instead of
    /// NISSE_CONTROL_TOKEN).
    #[arg(
        long,
        global = true,
        value_name = "FILE",
        env = "NISSE_CONTROL_TOKEN_FILE"
    )]
    pub control_token_file: Option<PathBuf>,
    /// The CA certificate (PEM) an https control URL's certificate must
    /// chain to (default: the system's roots); for the one `nisse deploy
    /// render` makes, its `credentials/control-tls/cert.pem`.
    #[arg(long, global = true, value_name = "FILE", env = "NISSE_CONTROL_CA")]
    pub control_ca: Option<PathBuf>,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run everything in this process: an embedded NATS server (unless
    /// NISSE_NATS_URL or bus.url is set), the streams and consumers, and
    /// every service.
    Up {
        /// Start this many embedded NATS servers as one cluster instead of
        /// one (at least 2; 3 keeps every stream with a replica on each, so
        /// one server can be lost): for trying replicated streams locally.
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(2..=7))]
        cluster: Option<u16>,
    },
    /// Run chosen services against an existing NATS server; start more
    /// processes of the same service to share its work.
    Serve {
        /// Services to run.
        #[arg(required = true)]
        services: Vec<String>,
        /// Serve only these agents (default: every configured agent).
        #[arg(long = "agent", value_name = "NAME")]
        agents: Vec<String>,
        /// Answer `GET /healthz` (the process runs) and `GET /readyz`
        /// (every service it runs is ready) on this address, for a
        /// container engine's or process manager's health check.
        #[arg(long, value_name = "ADDR")]
        health_listen: Option<std::net::SocketAddr>,
    },
    /// Ask a health endpoint (`nisse serve --health-listen`): exits 0 when
    /// it answers 2xx, for an image's health check.
    Health {
        /// The URL, e.g. `http://127.0.0.1:9100/readyz`.
        url: String,
    },
    /// Whether any agent is in the middle of a step (a command or MCP call
    /// sent and not answered): exits 0 when none is, 1 when one is. The
    /// gate for an updater: restart only when idle.
    Idle {
        /// Wait until no agent is in the middle of a step, then exit 0.
        #[arg(long)]
        wait: bool,
        /// Only this agent (default: every configured agent).
        #[arg(long, value_name = "NAME")]
        agent: Option<String>,
    },
    /// Show the agent streams, their consumers, pending and dead-letter counts.
    Streams {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Print a range of an agent's stream, decoded.
    Replay {
        /// The agent whose stream to read.
        #[arg(long, value_name = "NAME")]
        agent: String,
        /// First stream sequence (default: the first stored).
        #[arg(long, value_name = "N", default_value_t = 1)]
        from_seq: u64,
        /// Last stream sequence, inclusive (default: the last stored).
        #[arg(long, value_name = "N")]
        to_seq: Option<u64>,
        /// Print one JSON object per line.
        #[arg(long)]
        json: bool,
        /// Instead of printing, rebuild the agent's brain state from its
        /// whole stream into a new state store under this (empty) data
        /// directory, to compare with or replace the live one.
        #[arg(long, value_name = "DIR", conflicts_with_all = ["from_seq", "to_seq", "json"])]
        rebuild: Option<PathBuf>,
    },
    /// List an agent's work items (reads its state store, read-only).
    Items {
        /// The agent.
        #[arg(long, value_name = "NAME", default_value = "ops")]
        agent: String,
        /// Only items in this state (active, ready, waiting, blocked, closed).
        #[arg(long, value_name = "STATE")]
        state: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Work item commands.
    Item {
        /// What to do.
        #[command(subcommand)]
        command: ItemCommand,
    },
    /// Plan commands: propose and show an item's plan of literal steps.
    Plan {
        /// What to do.
        #[command(subcommand)]
        command: PlanCommand,
    },
    /// Approve a work item's plan revision (default: the one up now).
    Approve {
        /// The item: its id or number (`14`, `#14`).
        item: String,
        /// The revision, e.g. `rev-3`.
        revision: Option<String>,
        /// A revision with destructive steps needs them named back, as
        /// its approval request asks: `#14 step 2`.
        #[arg(long, value_name = "TEXT")]
        confirm: Option<String>,
        /// The agent.
        #[arg(long, value_name = "NAME", default_value = "ops")]
        agent: String,
    },
    /// Deny a work item's plan revision (default: the one up now).
    Deny {
        /// The item.
        item: String,
        /// The revision, e.g. `rev-3`.
        revision: Option<String>,
        /// Why.
        #[arg(long, default_value = "")]
        reason: String,
        /// The agent.
        #[arg(long, value_name = "NAME", default_value = "ops")]
        agent: String,
    },
    /// Stop a work item's work at the next step boundary and ask what next.
    Stop {
        /// The item.
        item: String,
        /// The agent.
        #[arg(long, value_name = "NAME", default_value = "ops")]
        agent: String,
    },
    /// Go on with what timed out on a work item: each request that went
    /// unanswered past its deadline has its late answer applied, or is
    /// sent again.
    Retry {
        /// The item.
        item: String,
        /// The agent.
        #[arg(long, value_name = "NAME", default_value = "ops")]
        agent: String,
    },
    /// List the agent's scheduled checks: last run and result, failures
    /// in a row, next due.
    Duties {
        /// The agent.
        #[arg(long, value_name = "NAME", default_value = "ops")]
        agent: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Duty commands.
    Duty {
        /// What to do.
        #[command(subcommand)]
        command: DutyCommand,
    },
    /// End a work item, closing it with a note.
    Abandon {
        /// The item.
        item: String,
        /// The note.
        #[arg(long, default_value = "")]
        note: String,
        /// The agent.
        #[arg(long, value_name = "NAME", default_value = "ops")]
        agent: String,
    },
    /// The kill switches: show them, turn autonomy on or off, or switch a
    /// target to never (refused outright) and back.
    Autonomy {
        /// What to do (default: show).
        #[command(subcommand)]
        command: Option<AutonomyCommand>,
    },
    /// Policy commands.
    Policy {
        /// What to do.
        #[command(subcommand)]
        command: PolicyCommand,
    },
    /// The agent's SSH public key, to authorize on its hosts (made on first
    /// use when `executor.agents.<agent>.key-file` is not set).
    SshKey {
        /// The agent.
        #[arg(long, value_name = "NAME", default_value = "ops")]
        agent: String,
    },
    /// Evaluation commands: the captured model calls.
    Eval {
        /// What to do.
        #[command(subcommand)]
        command: EvalCommand,
    },
    /// The world model: the entities of the vault's `world/` folder, what
    /// relies on what, and what a stop takes down.
    World {
        /// What to do.
        #[command(subcommand)]
        command: WorldCommand,
    },
    /// The dev agent's projects.
    Dev {
        /// What to do.
        #[command(subcommand)]
        command: DevCommand,
    },
    /// Knowledge vault commands: check its links, rebuild agents' notes.
    Vault {
        /// What to do.
        #[command(subcommand)]
        command: VaultCommand,
    },
    /// Nisse as an MCP server, for MCP clients (assistants, editors): the
    /// work items, plans, world model, streams and duties to read, and
    /// plans to propose. It can never approve.
    Mcp {
        /// What to do.
        #[command(subcommand)]
        command: McpCommand,
    },
    /// The control plane's tokens (the gRPC API and the web control room
    /// are served by `nisse up`, or `nisse serve control`).
    Control {
        /// What to do.
        #[command(subcommand)]
        command: ControlCommand,
    },
    /// Deployment beyond one process.
    Deploy {
        /// What to do.
        #[command(subcommand)]
        command: DeployCommand,
    },
    /// The bus itself: its streams, consumers and buckets.
    Bus {
        /// What to do.
        #[command(subcommand)]
        command: BusCommand,
    },
    /// For a NATS server you run yourself (`NISSE_NATS_URL`): make the
    /// credentials of every service, agent and operator under the data
    /// directory (kept if they exist) and print the `authorization` block
    /// to put in the server's configuration.
    NatsConfig,
    /// Configuration commands.
    Config {
        /// What to do with the configuration.
        #[command(subcommand)]
        command: ConfigCommand,
    },
}

/// `nisse deploy …`.
#[derive(Debug, Subcommand)]
pub enum DeployCommand {
    /// Write out a real installation of this configuration: a NATS
    /// cluster, `nisse bus init` once, then every service of every agent
    /// as a unit of its own holding only its own credentials. With
    /// `--compose`, a docker compose deployment (`compose.yaml`, the
    /// servers' configurations, the credentials); with `--processes`, the
    /// same as processes on this machine (`layout.json`).
    Render {
        /// A docker compose deployment.
        #[arg(
            long,
            conflicts_with = "processes",
            required_unless_present = "processes"
        )]
        compose: bool,
        /// Processes on this machine.
        #[arg(long)]
        processes: bool,
        /// The directory to write into (made if missing; credentials made
        /// there before are kept).
        #[arg(long, value_name = "DIR", default_value = "deploy")]
        out: PathBuf,
        /// NATS servers: 1, or 3 or more for a cluster.
        #[arg(long, value_name = "N", default_value_t = 3)]
        nats_nodes: usize,
    },
}

/// `nisse bus …`.
#[derive(Debug, Subcommand)]
pub enum BusCommand {
    /// Make every agent's stream, every service's durable consumer and
    /// every key-value bucket on the server that are missing, and update
    /// those whose settings differ; prints what it did. Safe to run again.
    /// Runs as the admin identity (`credentials/nats/admin.nk` under the
    /// data directory, made by `nisse up` or `nisse nats-config`); `nisse
    /// serve` refuses to start against a server where this was not run.
    Init {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

/// `nisse control …`.
#[derive(Debug, Subcommand)]
pub enum ControlCommand {
    /// Print an operator's control token (made when they have none), for
    /// the web control room's login and `Authorization: Bearer` on the
    /// gRPC API. The operator must be on an allowlist as
    /// `control:<name>`.
    Token {
        /// The operator's name.
        operator: String,
    },
    /// Revoke an operator's control token: it is refused from the next
    /// call on, a live watch with it ends, and a new one is printed.
    Revoke {
        /// The operator's name.
        operator: String,
    },
}

/// `nisse mcp …`.
#[derive(Debug, Subcommand)]
pub enum McpCommand {
    /// The agent's MCP server instances: their privilege as configured
    /// and as the policy declares it, the open work items they are
    /// mounted on, and each tool the instance listed with its class.
    List {
        /// The agent.
        #[arg(long, value_name = "NAME", default_value = "ops")]
        agent: String,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Serve MCP over stdio (the default) or streamable HTTP: tools to
    /// list and show work items and their logs, show plans, the world
    /// model and a target's blast radius, the streams and the duties, and
    /// `propose_plan`, which puts a plan up for an operator's approval.
    /// No tool approves, denies or changes the kill switches, and the bus
    /// identity it acts as (`mcp`) cannot either.
    Serve {
        /// The agent whose work it serves.
        #[arg(long, value_name = "NAME", default_value = "ops")]
        agent: String,
        /// Serve streamable HTTP at `http://ADDR/mcp` instead of stdio,
        /// requiring `Authorization: Bearer <token>`.
        #[arg(long, value_name = "ADDR")]
        listen: Option<std::net::SocketAddr>,
        /// The file the bearer token is read from (default: the one `nisse
        /// up` generates, `<data-dir>/credentials/mcp-http.token`).
        #[arg(long, value_name = "FILE", requires = "listen")]
        token_file: Option<PathBuf>,
    },
}

/// `nisse duty …`.
#[derive(Debug, Subcommand)]
pub enum DutyCommand {
    /// Run a duty now, through the same path as when it is due.
    Run {
        /// The duty's name.
        name: String,
        /// The agent.
        #[arg(long, value_name = "NAME", default_value = "ops")]
        agent: String,
    },
}

/// `nisse plan …`.
#[derive(Debug, Subcommand)]
pub enum PlanCommand {
    /// Show an item's plan revisions and the current one in full.
    Show {
        /// The item.
        item: String,
        /// The agent.
        #[arg(long, value_name = "NAME", default_value = "ops")]
        agent: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Propose a plan for an item from a TOML file of `[[step]]`s (target,
    /// command or tool and arguments, precondition, expected, retries).
    Propose {
        /// The item.
        item: String,
        /// The plan file.
        file: PathBuf,
        /// The agent.
        #[arg(long, value_name = "NAME", default_value = "ops")]
        agent: String,
    },
}

/// `nisse autonomy …`.
#[derive(Debug, Subcommand)]
pub enum AutonomyCommand {
    /// Autonomy on: approved steps run.
    On,
    /// Autonomy off: every action that changes something needs the
    /// operator's go-ahead for that very action.
    Off,
    /// Switch a target to never: only reading is allowed there.
    Never {
        /// The target (host, VM).
        target: String,
        /// Why.
        #[arg(long, default_value = "set by the operator")]
        reason: String,
    },
    /// Clear a target's never switch.
    Clear {
        /// The target.
        target: String,
    },
}

/// `nisse policy …`.
#[derive(Debug, Subcommand)]
pub enum PolicyCommand {
    /// Classify a shell command line: each simple command's risk, class
    /// and the rule that decided.
    Classify {
        /// The command line.
        command: String,
        /// Also assess it as run on this target (protected, never).
        #[arg(long)]
        target: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Validate a policy file (default: the configured one).
    Check {
        /// The file.
        file: Option<PathBuf>,
    },
}

/// A revision argument: `rev-3`, `3`; 0 for none (the one up now).
fn revision(arg: Option<&str>) -> anyhow::Result<u32> {
    match arg {
        None => Ok(0),
        Some(text) => nisse_policy::approval::parse_revision(text)
            .ok_or_else(|| anyhow::anyhow!("`{text}` is not a plan revision (e.g. `rev-3`)")),
    }
}

/// `nisse item …`.
#[derive(Debug, Subcommand)]
pub enum ItemCommand {
    /// Open a work item for the agent to work on, as the operator: the
    /// model takes it up like any other (the dev agent starts it as a
    /// conversation, which may lead to a new project).
    Open {
        /// What it is about, in one line.
        title: String,
        /// What you want done, for the model (recorded as said).
        #[arg(long, value_name = "TEXT", default_value = "")]
        note: String,
        /// A host to bind to it, besides the agent's tool hosts (ops);
        /// may be given several times.
        #[arg(long = "host", value_name = "HOST")]
        hosts: Vec<String>,
        /// The agent.
        #[arg(long, value_name = "NAME", default_value = "ops")]
        agent: String,
    },
    /// Put the item being worked on aside for the next ready one (it
    /// keeps its place in the queue).
    Park {
        /// Its id, or its number (`14` or `#14`).
        item: String,
        /// The agent.
        #[arg(long, value_name = "NAME", default_value = "ops")]
        agent: String,
    },
    /// Take an item up next, before the rest of the queue.
    Next {
        /// Its id, or its number (`14` or `#14`).
        item: String,
        /// The agent.
        #[arg(long, value_name = "NAME", default_value = "ops")]
        agent: String,
    },
    /// Show a work item and its whole log.
    Show {
        /// Its id, or its number (`14` or `#14`).
        id: String,
        /// The agent.
        #[arg(long, value_name = "NAME", default_value = "ops")]
        agent: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

/// `nisse eval …`.
#[derive(Debug, Subcommand)]
pub enum EvalCommand {
    /// Write an agent's captured model calls (every call the gateway made
    /// for its brain or classifier, with request, reply or error, usage
    /// and latency) as JSON lines, oldest first.
    Export {
        /// The agent.
        #[arg(long, value_name = "NAME")]
        agent: String,
        /// The file to write (default: standard output).
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
    },
}

/// `nisse world …`: read from the vault folder on this machine.
#[derive(Debug, Subcommand)]
pub enum WorldCommand {
    /// List every entity: its kind, title and what it relies on.
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show an entity: its kind, title and note, what it relies on, and
    /// what relies on it directly.
    Show {
        /// The entity's name (its note's name) or one of its aliases.
        entity: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Everything affected if an entity stops, transitively, each with
    /// the relations that lead from it to the entity.
    Blast {
        /// The entity's name or alias.
        entity: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Load and validate the world model and check every link of the
    /// vault. Prints each problem as `file:line: message` and exits
    /// non-zero when there is any.
    Check,
}

/// `nisse vault …`.
#[derive(Debug, Subcommand)]
pub enum VaultCommand {
    /// Regenerate every note an agent wrote from its stream into a new or
    /// empty folder, with the vault writer's own code, to compare with or
    /// replace its memory folder.
    Rebuild {
        /// The folder to write into (new or empty).
        dir: PathBuf,
        /// The agent whose notes to rebuild.
        #[arg(long, value_name = "NAME", default_value = "ops")]
        agent: String,
    },
    /// Check the vault's links: every note parses, every `[[link]]`
    /// resolves, no shared note links into an agent's memory. Prints each
    /// problem as `file:line: message` and exits non-zero when there is
    /// any.
    Check,
}

/// `nisse dev …`.
#[derive(Debug, Subcommand)]
pub enum DevCommand {
    /// Check with the agent's own Gitea token that the project's default
    /// branch is protected: the agent may not push to it, and a merge
    /// needs an approval it cannot give (and, when the project's trust
    /// dial lets the agent merge, that Gitea lets it). Prints what Gitea
    /// reports; exits non-zero naming each check that fails.
    Check {
        /// The project (a key of `dev.projects`).
        project: String,
    },
    /// Project commands.
    Project {
        /// What to do.
        #[command(subcommand)]
        command: ProjectCommand,
    },
}

/// `nisse dev project …`.
#[derive(Debug, Subcommand)]
pub enum ProjectCommand {
    /// Register a project you provisioned (its repository protected, the
    /// agent a collaborator, its build host an executor host): written
    /// into the configuration file as `[dev.projects.<NAME>]` (comments
    /// kept), its repository added to `gitea.repositories`, only if the
    /// result is valid; then its branch protection is checked. Restart the
    /// services for them to take it.
    Add {
        /// The project's name.
        name: String,
        /// The repository, `owner/name`.
        #[arg(long)]
        repository: String,
        /// The branch work starts from and pull requests go to.
        #[arg(long, default_value = "main")]
        base_branch: String,
        /// The executor host its workspace is on
        /// (`executor.agents.dev.hosts`).
        #[arg(long)]
        build_host: String,
        /// The workspace's absolute path on the build host.
        #[arg(long)]
        workspace: String,
        /// The URL the build host clones from and pushes to.
        #[arg(long)]
        clone_url: String,
        /// A known-hosts file on the build host holding Gitea's host key.
        #[arg(long)]
        git_known_hosts: Option<String>,
        /// A test command (repeat for more).
        #[arg(long = "test-command")]
        test_commands: Vec<String>,
        /// Who merges: `operator-merges` (default) or
        /// `agent-merges-after-approval`.
        #[arg(long)]
        trust: Option<String>,
    },
}

/// `nisse config …`.
#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Load and validate the configuration, then print it as documented
    /// TOML with secrets masked. Exits non-zero naming every bad key.
    Check,
}

/// A command line that is an operator command to an agent's brain: the
/// same on the bus (here) and through the control plane (`--control`).
pub(crate) struct OperatorCall {
    /// The agent.
    pub agent: String,
    /// The item it names (an id or `#N`); empty for opening an item or
    /// running a duty.
    pub item: String,
    /// The command.
    pub command: Cmd,
    /// An approval's destructive steps named back (also in the command),
    /// which the control plane checks first.
    pub confirm: Option<String>,
}

impl OperatorCall {
    /// `command` as an operator command; an error when it is none, or
    /// its plan file or revision is wrong.
    pub(crate) fn of(command: Command) -> anyhow::Result<Self> {
        let call = |agent: String, item: String, command: Cmd| Self {
            agent,
            item,
            command,
            confirm: None,
        };
        Ok(match command {
            Command::Approve {
                item,
                revision: rev,
                agent,
                confirm,
            } => {
                let revision = revision(rev.as_deref())?;
                let approve = proto::Approve {
                    revision,
                    confirm: confirm.clone().unwrap_or_default(),
                };
                Self {
                    confirm,
                    ..call(agent, item, Cmd::Approve(approve))
                }
            }
            Command::Deny {
                item,
                revision: rev,
                reason,
                agent,
            } => {
                let revision = revision(rev.as_deref())?;
                call(agent, item, Cmd::Deny(proto::Deny { revision, reason }))
            }
            Command::Stop { item, agent } => call(agent, item, Cmd::Stop(proto::Stop {})),
            Command::Retry { item, agent } => call(agent, item, Cmd::Retry(proto::Retry {})),
            Command::Abandon { item, note, agent } => {
                call(agent, item, Cmd::Abandon(proto::Abandon { note }))
            }
            Command::Duty {
                command: DutyCommand::Run { name, agent },
            } => call(
                agent,
                String::new(),
                Cmd::RunDuty(proto::RunDuty { duty: name }),
            ),
            Command::Item {
                command:
                    ItemCommand::Open {
                        title,
                        note,
                        hosts,
                        agent,
                    },
            } => call(
                agent,
                String::new(),
                Cmd::OpenItem(proto::OpenItem { title, note, hosts }),
            ),
            Command::Item {
                command: ItemCommand::Park { item, agent },
            } => call(agent, item, Cmd::Park(proto::Park {})),
            Command::Item {
                command: ItemCommand::Next { item, agent },
            } => call(agent, item, Cmd::DoNext(proto::DoNext {})),
            Command::Plan {
                command: PlanCommand::Propose { item, file, agent },
            } => {
                let plan = crate::operator::read_plan(&file)?;
                call(
                    agent,
                    item,
                    Cmd::ProposePlan(proto::ProposePlan { plan: Some(plan) }),
                )
            }
            other => anyhow::bail!("`{other:?}` is no operator command"),
        })
    }
}

/// Runs a parsed command line.
pub async fn run(cli: Cli) -> anyhow::Result<()> {
    if let Some(url) = &cli.control {
        match crate::remote::place(&cli.command) {
            crate::remote::Place::Control => {
                let target = crate::remote::Target::of(
                    url,
                    cli.control_token_file.as_deref(),
                    cli.control_ca.as_deref(),
                )?;
                return crate::remote::run(&target, cli.command).await;
            }
            crate::remote::Place::Installation(why) => anyhow::bail!(
                "this command does not go through the control plane: it {why}. Run it on the installation, without --control"
            ),
            crate::remote::Place::Here => {}
        }
    }
    let mut cfg = Config::load(cli.config.as_deref())?;
    if let Some(dir) = cli.data_dir {
        cfg.data_dir = dir;
    }
    match cli.command {
        operator @ (Command::Approve { .. }
        | Command::Deny { .. }
        | Command::Stop { .. }
        | Command::Retry { .. }
        | Command::Abandon { .. }
        | Command::Duty { .. }
        | Command::Item {
            command: ItemCommand::Open { .. } | ItemCommand::Park { .. } | ItemCommand::Next { .. },
        }
        | Command::Plan {
            command: PlanCommand::Propose { .. },
        }) => {
            let call = OperatorCall::of(operator)?;
            crate::operator::send(&cfg, &call.agent, &call.item, call.command).await
        }
        Command::Up { cluster } => crate::up::up(cfg, cluster.map(usize::from)).await,
        Command::Serve {
            services,
            agents,
            health_listen,
        } => {
            if !agents.is_empty() {
                cfg.agents = agents;
                cfg.validate()?;
            }
            crate::up::serve(cfg, &services, health_listen).await
        }
        Command::Health { url } => crate::health::check(&url).await,
        Command::Bus {
            command: BusCommand::Init { json },
        } => crate::up::bus_init(&cfg, json).await,
        Command::Deploy {
            command:
                DeployCommand::Render {
                    compose,
                    processes: _,
                    out,
                    nats_nodes,
                },
        } => {
            let layout = crate::deploy::Layout::of(&cfg, nats_nodes)?;
            if compose {
                crate::deploy::render_compose(&cfg, &layout, &out)?;
                println!(
                    "wrote {} ({} units on {nats_nodes} NATS servers); build and start it with `docker compose -f {} up -d`",
                    out.join("compose.yaml").display(),
                    layout.units.len(),
                    out.join("compose.yaml").display()
                );
            } else {
                let nisse = std::env::current_exe().context("finding this program")?;
                let nats = nisse_bus::embedded::resolve_program(&cfg.embedded.program);
                let p = crate::deploy::render_processes(&cfg, &layout, &out, &nisse, &nats)?;
                println!(
                    "wrote {} ({} NATS servers, init, {} units)",
                    out.join("layout.json").display(),
                    p.nats.len(),
                    p.units.len()
                );
            }
            Ok(())
        }
        Command::Idle { wait, agent } => {
            let agents = match agent {
                Some(a) => {
                    anyhow::ensure!(
                        cfg.agents.contains(&a),
                        "`{a}` is not one of the configured agents ({})",
                        cfg.agents.join(", ")
                    );
                    vec![a.parse()?]
                }
                None => cfg.agent_names()?,
            };
            let bus = crate::inspect::connect(&cfg).await?;
            if crate::inspect::idle(wait, async || crate::inspect::busy(&bus, &agents).await)
                .await?
            {
                Ok(())
            } else {
                std::process::exit(1)
            }
        }
        Command::Streams { json } => {
            let bus = crate::inspect::connect(&cfg).await?;
            crate::inspect::streams_shown(&cfg, &bus).await?.print(json)
        }
        Command::Replay {
            agent,
            rebuild: Some(dir),
            ..
        } => {
            let agent: nisse_bus::AgentName = agent.parse()?;
            let bus = crate::inspect::connect(&cfg).await?;
            crate::items::rebuild(&cfg, &bus, &agent, &dir).await
        }
        Command::Items { agent, state, json } => {
            crate::items::listing(&cfg, &agent, state.as_deref())?.print(json)
        }
        Command::Item {
            command: ItemCommand::Show { id, agent, json },
        } => crate::items::item_log(&cfg, &agent, &id)?.print(json),
        Command::Replay {
            agent,
            from_seq,
            to_seq,
            json,
            rebuild: None,
        } => {
            let agent: nisse_bus::AgentName = agent.parse()?;
            let bus = crate::inspect::connect(&cfg).await?;
            let n = crate::inspect::replay(&bus, &agent, from_seq, to_seq, json).await?;
            if !json {
                eprintln!("{n} messages");
            }
            Ok(())
        }
        Command::Plan {
            command: PlanCommand::Show { item, agent, json },
        } => crate::operator::plan_view(&cfg, &agent, &item, None)?.print(json),
        Command::Duties { agent, json } => crate::duties::listing(&cfg, &agent)?.print(json),
        Command::Autonomy { command } => {
            use crate::operator::AutonomyChange as A;
            let change = match command {
                None => A::Show,
                Some(AutonomyCommand::On) => A::On,
                Some(AutonomyCommand::Off) => A::Off,
                Some(AutonomyCommand::Never { target, reason }) => A::Never { target, reason },
                Some(AutonomyCommand::Clear { target }) => A::Clear { target },
            };
            crate::operator::autonomy(&cfg, change).await
        }
        Command::Policy {
            command:
                PolicyCommand::Classify {
                    command,
                    target,
                    json,
                },
        } => crate::operator::classify(&cfg, &command, target.as_deref())?.print(json),
        Command::Policy {
            command: PolicyCommand::Check { file },
        } => crate::operator::check(&cfg, file.as_deref()),
        Command::SshKey { agent } => {
            anyhow::ensure!(
                cfg.agents.contains(&agent),
                "`{agent}` is not one of the configured agents ({})",
                cfg.agents.join(", ")
            );
            let setup = cfg.executor.agent(&agent, &cfg.data_dir);
            let (public, made) = nisse_executor::identity::ensure_key(
                &setup.key_file,
                &agent,
                setup.key_is_default,
            )?;
            if made {
                eprintln!("made a new key: {}", setup.key_file.display());
            }
            println!("{public}");
            Ok(())
        }
        Command::Eval {
            command: EvalCommand::Export { agent, out },
        } => {
            let n = crate::eval::export(&cfg, &agent, out.as_deref()).await?;
            eprintln!("{n} model calls exported");
            Ok(())
        }
        Command::World {
            command: WorldCommand::List { json },
        } => crate::world::entities(&cfg)?.print(json),
        Command::World {
            command: WorldCommand::Show { entity, json },
        } => crate::world::entity(&cfg, &entity)?.print(json),
        Command::World {
            command: WorldCommand::Blast { entity, json },
        } => crate::world::blast(&cfg, &entity)?.print(json),
        Command::World {
            command: WorldCommand::Check,
        } => crate::world::check_world(&cfg)?.print(),
        Command::Vault {
            command: VaultCommand::Rebuild { dir, agent },
        } => crate::world::rebuild(&cfg, &agent, &dir).await,
        Command::Vault {
            command: VaultCommand::Check,
        } => crate::world::check_vault(&cfg)?.print(),
        Command::Dev {
            command: DevCommand::Check { project },
        } => crate::dev::check(&cfg, &project).await,
        Command::Dev {
            command:
                DevCommand::Project {
                    command:
                        ProjectCommand::Add {
                            name,
                            repository,
                            base_branch,
                            build_host,
                            workspace,
                            clone_url,
                            git_known_hosts,
                            test_commands,
                            trust,
                        },
                },
        } => {
            let file = cli.config.unwrap_or_else(|| "nisse.toml".into());
            let new = crate::dev::NewProject {
                name,
                repository,
                base_branch,
                build_host,
                workspace,
                clone_url,
                git_known_hosts,
                test_commands,
                trust,
            };
            crate::dev::add_project(&file, &new).await
        }
        Command::Control { command } => crate::control::tokens(&cfg, command),
        Command::Mcp {
            command: McpCommand::List { agent, json },
        } => crate::mcp_list::listing(&cfg, &agent)?.print(json),
        Command::Mcp {
            command:
                McpCommand::Serve {
                    agent,
                    listen,
                    token_file,
                },
        } => {
            let how = match listen {
                None => crate::mcp_serve::Transport::Stdio,
                Some(addr) => crate::mcp_serve::Transport::Http { addr, token_file },
            };
            crate::mcp_serve::serve(cfg, &agent, how).await
        }
        Command::NatsConfig => {
            let credentials = nisse_bus::auth::Credentials::in_data_dir(&cfg.data_dir);
            let block = nisse_bus::auth::server_authorization(&cfg.auth_plan()?, &credentials)?;
            print!("{block}");
            eprintln!(
                "credentials: services and admin in {}, operators in {} (each file is that identity's alone; `nisse serve` and the CLI find them there through --data-dir)",
                credentials.dir().display(),
                credentials.operators_dir().display()
            );
            Ok(())
        }
        Command::Config {
            command: ConfigCommand::Check,
        } => {
            // The MCP instances as the policy classifies them: a brain
            // would refuse to start on a disagreement.
            cfg.check_mcp_policy(&cfg.load_policy()?)?;
            print!("{}", cfg.to_annotated_toml()?);
            eprintln!("configuration is valid");
            Ok(())
        }
    }
}
