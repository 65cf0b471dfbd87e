//! `nisse --control URL …`: the CLI from a machine that reaches only the
//! control plane. Every command that reads an agent's state or decides
//! something goes through the control API as the token's operator, and
//! prints what the same command prints on the installation: the service
//! answers with the very views the CLI builds (text and JSON), so the two
//! cannot drift. Commands that need nothing of the installation run here
//! as ever; those that make or change the installation itself are
//! refused, saying why.

use std::path::Path;

use anyhow::Context as _;
use futures::StreamExt as _;

use nisse_bus::proto;
use nisse_control::api;
use nisse_control::client::Client;
use nisse_control::tonic;

use crate::cli::{
    AutonomyCommand, Command, DevCommand, EvalCommand, ItemCommand, McpCommand, PlanCommand,
    PolicyCommand, VaultCommand, WorldCommand,
};
use crate::shown::Shown;

/// Where a command runs when `--control` is given.
#[derive(Debug, PartialEq, Eq)]
pub enum Place {
    /// Through the control API.
    Control,
    /// On this machine as without `--control`: it needs nothing of the
    /// installation (a health probe, checking a file).
    Here,
    /// Only on the installation, because it does what this says.
    Installation(&'static str),
}

/// Where `command` runs when `--control` is given.
pub fn place(command: &Command) -> Place {
    use Place::{Control, Here, Installation};
    match command {
        Command::Up { .. } | Command::Serve { .. } => {
            Installation("runs the installation's services and needs its bus")
        }
        Command::Bus { .. } | Command::NatsConfig => {
            Installation("sets up the installation's bus as its admin")
        }
        Command::Deploy { .. } => {
            Installation("writes an installation, with its credentials, here")
        }
        Command::Control { .. } => Installation(
            "makes operators' tokens in the installation's data directory, which only someone there may do",
        ),
        Command::Replay {
            rebuild: Some(_), ..
        } => Installation("writes a state store here from the whole stream, as a brain does"),
        Command::Vault {
            command: VaultCommand::Rebuild { .. },
        } => Installation("writes an agent's notes into a folder here from its stream"),
        Command::SshKey { .. } => {
            Installation("makes or reads the agent's SSH key in the installation's data directory")
        }
        Command::Dev {
            command: DevCommand::Check { .. },
        } => Installation(
            "calls Gitea with the dev agent's own token, which stays on the installation",
        ),
        Command::Dev {
            command: DevCommand::Project { .. },
        } => Installation("edits the installation's configuration file"),
        Command::Mcp {
            command: McpCommand::Serve { .. },
        } => Installation(
            "serves MCP on its own bus connection (from elsewhere, use its streamable HTTP: `nisse mcp serve --listen` on the installation)",
        ),
        Command::Health { .. }
        | Command::Config { .. }
        | Command::Policy {
            command: PolicyCommand::Check { .. },
        } => Here,
        Command::Idle { .. }
        | Command::Streams { .. }
        | Command::Replay { rebuild: None, .. }
        | Command::Items { .. }
        | Command::Item { .. }
        | Command::Plan { .. }
        | Command::Approve { .. }
        | Command::Deny { .. }
        | Command::Stop { .. }
        | Command::Retry { .. }
        | Command::Duties { .. }
        | Command::Duty { .. }
        | Command::Abandon { .. }
        | Command::Autonomy { .. }
        | Command::Policy {
            command: PolicyCommand::Classify { .. },
        }
        | Command::Eval { .. }
        | Command::World { .. }
        | Command::Vault {
            command: VaultCommand::Check,
        }
        | Command::Mcp {
            command: McpCommand::List { .. },
        } => Control,
    }
}

/// The control plane to use: its URL, the token, the CA to trust.
#[derive(Debug)]
pub struct Target {
    url: String,
    token: String,
    ca: Option<std::path::PathBuf>,
}

impl Target {
    /// `url` with the token from `token_file`, else from
    /// NISSE_CONTROL_TOKEN, trusting `ca` for https.
    pub fn of(url: &str, token_file: Option<&Path>, ca: Option<&Path>) -> anyhow::Result<Self> {
        let token = match token_file {
            Some(file) => std::fs::read_to_string(file)
                .with_context(|| format!("reading the control token {}", file.display()))?,
            None => std::env::var("NISSE_CONTROL_TOKEN").map_err(|_| {
                anyhow::anyhow!(
                    "--control needs an operator's control token: set NISSE_CONTROL_TOKEN or give --control-token-file (`nisse control token <you>` on the installation prints it)"
                )
            })?,
        };
        Ok(Self {
            url: url.to_string(),
            token,
            ca: ca.map(Path::to_path_buf),
        })
    }
}

/// Runs `command` (one whose [`place`] is [`Place::Control`]) through the
/// control plane at `target`.
pub async fn run(target: &Target, command: Command) -> anyhow::Result<()> {
    let mut c =
        nisse_control::client::connect(&target.url, &target.token, target.ca.as_deref()).await?;
    let url = target.url.as_str();
    let said = |status: tonic::Status| refusal(url, status);
    match command {
        Command::Streams { json } => print(c.streams(api::StreamsRequest {}).await, json, said),
        Command::Items { agent, state, json } => print(
            c.list_items(api::ListItemsRequest {
                agent,
                state: state.unwrap_or_default(),
            })
            .await,
            json,
            said,
        ),
        Command::Item {
            command: ItemCommand::Show { id, agent, json },
        } => print(c.get_item(part(agent, id, 0, "log")).await, json, said),
        Command::Plan {
            command: PlanCommand::Show { item, agent, json },
        } => print(c.get_item(part(agent, item, 0, "plan")).await, json, said),
        Command::Duties { agent, json } => {
            print(c.duties(api::DutiesRequest { agent }).await, json, said)
        }
        Command::World { command } => {
            let (entity, blast, json) = match command {
                WorldCommand::List { json } => (String::new(), false, json),
                WorldCommand::Show { entity, json } => (entity, false, json),
                WorldCommand::Blast { entity, json } => (entity, true, json),
                WorldCommand::Check => return check(&mut c, "world", said).await,
            };
            print(
                c.world(api::WorldRequest { entity, blast }).await,
                json,
                said,
            )
        }
        Command::Vault {
            command: VaultCommand::Check,
        } => check(&mut c, "vault", said).await,
        Command::Mcp {
            command: McpCommand::List { agent, json },
        } => print(c.mcp_list(api::McpListRequest { agent }).await, json, said),
        Command::Policy {
            command:
                PolicyCommand::Classify {
                    command,
                    target,
                    json,
                },
        } => print(
            c.classify_command(api::ClassifyCommandRequest {
                command,
                target: target.unwrap_or_default(),
            })
            .await,
            json,
            said,
        ),
        Command::Autonomy { command } => {
            let change = match command {
                None => String::new(),
                Some(AutonomyCommand::On) => "on".into(),
                Some(AutonomyCommand::Off) => "off".into(),
                Some(AutonomyCommand::Never { target, reason }) => {
                    format!("never {target} {reason}")
                }
                Some(AutonomyCommand::Clear { target }) => format!("allow {target}"),
            };
            print(
                c.autonomy(api::AutonomyRequest { change }).await,
                false,
                said,
            )
        }
        Command::Idle { wait, agent } => {
            let agent = agent.unwrap_or_default();
            let idle = crate::inspect::idle(wait, async || {
                let r = c
                    .idle(api::IdleRequest {
                        agent: agent.clone(),
                    })
                    .await
                    .map_err(said)?;
                Ok(r.into_inner().busy)
            })
            .await?;
            if !idle {
                std::process::exit(1);
            }
            Ok(())
        }
        Command::Replay {
            agent,
            from_seq,
            to_seq,
            json,
            rebuild: None,
        } => {
            let mut records = c
                .replay(api::ReplayRequest {
                    agent,
                    from_seq,
                    to_seq,
                })
                .await
                .map_err(said)?
                .into_inner();
            let mut n = 0u64;
            while let Some(r) = records.next().await {
                let r = r.map_err(said)?;
                if json {
                    println!("{}", r.json);
                } else {
                    print!("{}", r.text);
                }
                n += 1;
            }
            if !json {
                eprintln!("{n} messages");
            }
            Ok(())
        }
        Command::Eval {
            command: EvalCommand::Export { agent, out },
        } => {
            let calls = c
                .export_model_calls(api::ExportModelCallsRequest { agent })
                .await
                .map_err(said)?
                .into_inner()
                .map(|call| {
                    let call = call.map_err(said)?;
                    if call.json.is_empty() {
                        return Ok(crate::eval::Capture::Skipped(call.skipped));
                    }
                    let line = serde_json::from_str(&call.json)
                        .context("the control service sent a model call that is not JSON")?;
                    Ok(crate::eval::Capture::Call(line))
                });
            let n = crate::eval::write(calls, out.as_deref()).await?;
            eprintln!("{n} model calls exported");
            Ok(())
        }
        command => {
            let call = crate::cli::OperatorCall::of(command)?;
            let r = c
                .command(api::CommandRequest {
                    agent: call.agent,
                    item: call.item,
                    command: Some(proto::OperatorCommand {
                        command: Some(call.command),
                        ..Default::default()
                    }),
                    confirm: call.confirm.unwrap_or_default(),
                })
                .await
                .map_err(said)?;
            crate::operator::print_applied(&r.into_inner().lines);
            Ok(())
        }
    }
}

fn part(agent: String, item: String, revision: u32, part: &str) -> api::GetItemRequest {
    api::GetItemRequest {
        agent,
        item,
        revision,
        part: part.into(),
    }
}

/// Prints a view as the command prints it on the installation.
fn print(
    view: Result<tonic::Response<api::View>, tonic::Status>,
    json: bool,
    said: impl FnOnce(tonic::Status) -> anyhow::Error,
) -> anyhow::Result<()> {
    let view = view.map_err(said)?.into_inner();
    let value = serde_json::from_str(&view.json)
        .context("the control service sent a view whose JSON does not parse")?;
    let mut shown = Shown::new(view.text, value);
    shown.warnings = view.warnings;
    shown.print(json)
}

/// `nisse world check` or `nisse vault check`, through the service.
async fn check(
    c: &mut Client,
    what: &str,
    said: impl FnOnce(tonic::Status) -> anyhow::Error,
) -> anyhow::Result<()> {
    let r = c
        .check(api::CheckRequest { what: what.into() })
        .await
        .map_err(said)?
        .into_inner();
    crate::world::Checked {
        problems: r.problems,
        summary: r.summary,
    }
    .print()
}

/// A refusal or failure of the service, as the operator is told it.
fn refusal(url: &str, status: tonic::Status) -> anyhow::Error {
    let message = status.message();
    match status.code() {
        tonic::Code::Unauthenticated => anyhow::anyhow!(
            "the control service at {url} refused the token: {message} (`nisse control token <you>` on the installation prints yours)"
        ),
        tonic::Code::Unavailable => {
            anyhow::anyhow!("the control service at {url} is unavailable: {message}")
        }
        _ => anyhow::anyhow!("{message}"),
    }
}
