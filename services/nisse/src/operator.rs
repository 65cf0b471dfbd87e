//! The CLI as an approval source (seed L3): `nisse plan …`, `approve`,
//! `deny`, `stop`, `abandon`; the kill switches (`nisse autonomy …`); and
//! the policy (`nisse policy …`).
//!
//! A command to an agent is published on its stream as an
//! `OperatorCommand` from `cli:<the local user>`; the brain checks that
//! identity against its operator allowlist, and answers on the bus with
//! what it did (an `OperatorReply` on `out.operator.<the command's id>`),
//! which the CLI prints, so the operator sees "approved rev-3", or why
//! not, at once, from any machine that reaches NATS.

use std::path::Path;
use std::time::Duration;

use anyhow::Context as _;
use futures::StreamExt as _;
use prost::Message as _;
use serde::Deserialize;

use nisse_bus::proto::{self, Envelope, OperatorCommand, OperatorReply, operator_command::Command};
use nisse_bus::{AgentName, Bus, SubjectKind};
use nisse_core::plans::{Plan, render_approval_whole};
use nisse_core::{Event, Store};
use nisse_policy::{Action, RiskClass, canonical_json};

use crate::config::Config;
use crate::shown::{Shown, outln};

/// The channel name the CLI's commands carry.
pub const CHANNEL: &str = "cli";

/// How long the CLI waits for the brain's answer to a command.
const APPLY_WAIT: Duration = Duration::from_secs(15);

/// The user running this process, by uid (not `$USER`, which anyone can
/// set), as the operator identity `cli:<user>`.
pub fn local_user() -> String {
    let uid = nix::unistd::getuid();
    nix::unistd::User::from_uid(uid)
        .ok()
        .flatten()
        .map_or_else(|| format!("uid{uid}"), |u| u.name)
}

/// Publishes `command` for `item` (an id or `#n`, which the brain
/// resolves) and waits for the brain's answer, printing what it did.
pub async fn send(cfg: &Config, agent: &str, item: &str, command: Command) -> anyhow::Result<()> {
    let agent: AgentName = agent.parse()?;
    let bus = crate::inspect::connect(cfg).await?;
    let lines = command_on(&bus, &agent, item, command, &Sender::cli()).await?;
    print_applied(&lines);
    Ok(())
}

/// Prints what applying a command did, as the brain told it.
pub fn print_applied(lines: &[String]) {
    if lines.is_empty() {
        println!("applied (nothing changed)");
    }
    for line in lines {
        println!("{line}");
    }
}

/// Who sends an operator command: the actor its envelope names (which
/// must be the one whose credentials the connection has, or the brain
/// refuses it) and the channel it comes by.
#[derive(Debug, Clone)]
pub struct Sender {
    /// The actor id: the local user for the CLI,
    /// [`nisse_bus::auth::MCP_SURFACE`] for `nisse mcp serve`.
    pub id: String,
    /// The channel (`cli`, `mcp`), also the prefix of the command's id.
    pub channel: &'static str,
}

impl Sender {
    /// The CLI, as the local user.
    pub fn cli() -> Self {
        Self {
            id: local_user(),
            channel: CHANNEL,
        }
    }
}

/// Publishes `command` for `item` on `agent`'s stream as `sender` and
/// waits for the brain's answer: the lines of what applying it did, or
/// an error saying why the brain did not apply it (or that it did not
/// answer).
pub async fn command_on(
    bus: &Bus,
    agent: &AgentName,
    item: &str,
    command: Command,
    sender: &Sender,
) -> anyhow::Result<Vec<String>> {
    let message_id = format!("{}:{}", sender.channel, uuid::Uuid::new_v4());
    // Listening before the command goes out, so the answer cannot slip by.
    let subject = format!("{}.{message_id}", agent.subject(SubjectKind::OperatorReply));
    let mut answers = bus
        .client()
        .subscribe(subject.clone())
        .await
        .context("listening for the brain's answer")?;
    let msg = OperatorCommand {
        envelope: Some(Envelope {
            agent: agent.to_string(),
            actor: Some(proto::Actor {
                kind: proto::ActorKind::Operator as i32,
                id: sender.id.clone(),
            }),
            message_id: message_id.clone(),
            ..Default::default()
        }),
        channel: sender.channel.into(),
        work_item: item.to_string(),
        command: Some(command),
    };
    let published = bus
        .publish(msg)
        .await
        .context("publishing the command on the agent's stream")?;
    let reply = match tokio::time::timeout(APPLY_WAIT, answers.next()).await {
        Ok(Some(m)) => Some(m.payload),
        // Missed while the connection was away: the stream has it.
        _ => bus
            .last_on_subject(agent, &subject)
            .await?
            .map(|stored| stored.payload),
    };
    let Some(payload) = reply else {
        anyhow::bail!(
            "the command is stored on {agent}'s stream (sequence {}) but its brain has not answered within {}s: is the brain running?",
            published.sequence,
            APPLY_WAIT.as_secs()
        );
    };
    let reply = OperatorReply::decode(payload).context("reading the brain's answer")?;
    if !reply.applied {
        anyhow::bail!(
            "the {agent} brain could not apply the command: {}",
            reply.error
        );
    }
    Ok(reply.lines)
}

/// A plan file, as the operator writes it.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
struct PlanFile {
    #[serde(default)]
    rationale: String,
    #[serde(rename = "step", default)]
    steps: Vec<toml::Spanned<StepFile>>,
}

/// One step of a plan: a `[[step]]` of a plan file, or a step of the MCP
/// tool `propose_plan` (the same keys), whose schema this derives.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub(crate) struct StepFile {
    /// The tool: `shell` (the default) or another the policy knows.
    #[serde(default = "shell_tool")]
    tool: String,
    /// The host or VM the step acts on.
    target: String,
    /// For the shell tool: the command line, run literally.
    command: Option<String>,
    /// For other tools: their arguments.
    #[schemars(with = "Option<serde_json::Map<String, serde_json::Value>>")]
    arguments: Option<toml::Table>,
    /// A read-only check that must pass before the step runs.
    precondition: Option<CheckFile>,
    /// A read-only check of the step's outcome.
    expected: Option<CheckFile>,
    /// How often a failed step may be tried again.
    retries: Option<u32>,
    /// The risk the proposer declares; the classifier's verdict can only
    /// raise it.
    #[serde(default)]
    #[schemars(schema_with = "risk_schema")]
    declared_risk: Option<RiskClass>,
    /// Configured secrets the command needs: they become its `secrets`
    /// argument, so they are classified and approved with it (the policy
    /// must grant them for this action, the executor for this host).
    #[serde(default)]
    secrets: Vec<String>,
}

fn shell_tool() -> String {
    "shell".into()
}

/// A risk class by its policy name (`read_only` … `destructive`).
fn risk_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let names: Vec<&str> = RiskClass::ALL.iter().map(|r| r.as_str()).collect();
    let serde_json::Value::Object(map) = serde_json::json!({ "type": "string", "enum": names })
    else {
        return schemars::Schema::default();
    };
    schemars::Schema::from(map)
}

/// A check before or after a step: a read-only command on the step's
/// target.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
struct CheckFile {
    /// The command line, run on the step's target.
    command: Option<String>,
    /// Or a read-only MCP tool to call (`mcp:<instance>/<tool>`, on its
    /// instance): how a step on an MCP instance is checked.
    tool: Option<String>,
    /// That tool's arguments.
    #[schemars(with = "Option<serde_json::Map<String, serde_json::Value>>")]
    arguments: Option<toml::Table>,
    /// The exit code that passes (default 0; for an MCP call, 0 is the
    /// tool reporting no error).
    #[serde(default)]
    exit_code: i32,
    /// Text its output must contain to pass.
    output_contains: Option<String>,
}

/// Reads a plan file into the plan a `propose` command carries. Errors
/// name the file, line and step.
pub fn read_plan(path: &Path) -> anyhow::Result<proto::Plan> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    parse_plan(&path.display().to_string(), &text)
}

fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].matches('\n').count() + 1
}

fn parse_plan(name: &str, text: &str) -> anyhow::Result<proto::Plan> {
    let file: PlanFile = toml::from_str(text).map_err(|e| {
        let line = e.span().map_or(0, |s| line_of(text, s.start));
        anyhow::anyhow!("{name}:{line}: {}", e.message())
    })?;
    if file.steps.is_empty() {
        anyhow::bail!("{name}: the plan has no [[step]]");
    }
    let steps = file.steps.into_iter().map(|spanned| {
        let line = line_of(text, spanned.span().start);
        Ok((format!("{name}:{line}: "), spanned.into_inner()))
    });
    build_plan(file.rationale, steps)
}

/// The plan of `propose_plan` on the MCP surface: each step an object with
/// the keys of a plan file's `[[step]]`. Errors name the step and what is
/// wrong with it, as the plan file's do.
pub(crate) fn plan_from_json(
    rationale: &str,
    steps: &[serde_json::Value],
) -> anyhow::Result<proto::Plan> {
    if steps.is_empty() {
        anyhow::bail!("the plan has no steps");
    }
    let parsed = steps.iter().enumerate().map(|(i, step)| {
        serde_json::from_value::<StepFile>(step.clone())
            .map(|step| (String::new(), step))
            .map_err(|e| anyhow::anyhow!("step {}: {e}", i + 1))
    });
    build_plan(rationale.to_string(), parsed)
}

/// The plan of `steps` (each read, or why it could not be), each checked
/// in order as an action the policy can classify; an error names the
/// first wrong step (after its `where`) and what is wrong.
fn build_plan(
    rationale: String,
    steps: impl IntoIterator<Item = anyhow::Result<(String, StepFile)>>,
) -> anyhow::Result<proto::Plan> {
    let mut out = Vec::new();
    for (i, step) in steps.into_iter().enumerate() {
        let (at, s) = step?;
        let err = |m: String| anyhow::anyhow!("{at}step {}: {m}", i + 1);
        let mut args = s.arguments.unwrap_or_default();
        if let Some(command) = &s.command {
            if command.trim().is_empty() {
                return Err(err("`command` is empty".into()));
            }
            args.insert("command".into(), toml::Value::String(command.trim().into()));
        } else if s.tool == "shell" {
            return Err(err("a shell step needs `command`".into()));
        }
        if !s.secrets.is_empty() {
            args.insert(
                "secrets".into(),
                toml::Value::Array(s.secrets.iter().cloned().map(toml::Value::String).collect()),
            );
        }
        let json = serde_json::to_value(&args).map_err(|e| err(e.to_string()))?;
        let action = Action::new(&s.tool, &s.target, &json).map_err(|e| err(e.0))?;
        action.secrets().map_err(|e| err(e.0))?;
        let check = |c: Option<CheckFile>,
                     which: &str|
         -> anyhow::Result<Option<proto::StepCheck>> {
            let Some(c) = c else { return Ok(None) };
            let (command, tool, arguments_json) = match (c.command, c.tool) {
                (Some(command), None) => (command, String::new(), String::new()),
                (None, Some(tool)) => {
                    let args = serde_json::to_value(c.arguments.unwrap_or_default())
                        .map_err(|e| err(format!("`{which}`: {e}")))?;
                    (String::new(), tool, canonical_json(&args))
                }
                _ => {
                    return Err(err(format!(
                        "`{which}` needs `command` or an MCP `tool` (mcp:<instance>/<tool>), not both"
                    )));
                }
            };
            Ok(Some(proto::StepCheck {
                command,
                exit_code: c.exit_code,
                output_contains: c.output_contains.unwrap_or_default(),
                tool,
                arguments_json,
            }))
        };
        out.push(proto::PlannedStep {
            tool: action.tool,
            target: action.target,
            arguments_json: canonical_json(&json),
            precondition: check(s.precondition, "precondition")?,
            expected: check(s.expected, "expected")?,
            retries: s.retries,
            declared_risk: s
                .declared_risk
                .map_or(proto::RiskClass::Unspecified, Into::into)
                as i32,
        });
    }
    Ok(proto::Plan {
        rationale,
        steps: out,
    })
}

/// `nisse plan show`: the item's plan revisions and one in full (the
/// current one, or `revision`): its approval request whole, with every
/// value the chat shows by digest printed under that digest.
pub fn plan_view(
    cfg: &Config,
    agent: &str,
    item: &str,
    revision: Option<u32>,
) -> anyhow::Result<Shown> {
    let agent: AgentName = agent.parse()?;
    let store = crate::items::open(cfg, agent.as_str())?;
    let found = store
        .find_item(item)?
        .ok_or_else(|| anyhow::anyhow!("agent {agent} has no work item `{item}`"))?;
    let plans = store.plans(&found.id)?;
    let json = serde_json::json!({ "item": found, "plans": plans });
    let mut text = String::new();
    let shown = match revision {
        None => plans.last(),
        Some(n) => Some(plans.iter().find(|p| p.revision == n).ok_or_else(|| {
            anyhow::anyhow!(
                "item #{} has no plan revision rev-{n} ({})",
                found.number,
                if plans.is_empty() {
                    "it has no plan".to_string()
                } else {
                    format!(
                        "it has {}",
                        plans.iter().map(Plan::tag).collect::<Vec<_>>().join(", ")
                    )
                }
            )
        })?),
    };
    let Some(shown) = shown else {
        outln!(text, "item #{} has no plan", found.number);
        return Ok(Shown::new(text, json));
    };
    outln!(text, "item #{} {}", found.number, found.title);
    for p in &plans {
        outln!(
            text,
            "  {} {:<10} proposed by {}{}",
            p.tag(),
            p.status.to_string(),
            p.proposed_by,
            p.approved_by
                .as_ref()
                .map_or(String::new(), |b| format!(", approved by {b}"))
        );
    }
    outln!(text);
    render_revision(&mut text, &store, agent.as_str(), &found, shown)?;
    Ok(Shown::new(text, json))
}

fn render_revision(
    out: &mut String,
    store: &Store,
    agent: &str,
    item: &nisse_core::WorkItem,
    plan: &Plan,
) -> anyhow::Result<()> {
    // The request whole (what the chat shows by digest, in full under the
    // same digest), until when the one sent was good, if one was.
    let events = store.events(&item.id)?;
    let expires = events.iter().rev().find_map(|e| match &e.event {
        Event::ApprovalRequested {
            revision,
            expires_at,
            ..
        } if *revision == plan.revision => Some(*expires_at),
        _ => None,
    });
    // The hosts approving it would bind: those its steps act on that the
    // item's last binding does not hold.
    let bound: Vec<String> = events
        .iter()
        .rev()
        .find_map(|e| match &e.event {
            Event::HostsBound { hosts, .. } => Some(hosts.clone()),
            _ => None,
        })
        .unwrap_or_default();
    let binds: Vec<String> = plan
        .hosts()
        .into_iter()
        .filter(|h| !bound.contains(h))
        .collect();
    // What depends on what the steps stop, from the world the brain
    // holds now, every dependent listed.
    let steps: Vec<_> = plan.steps.iter().map(|s| s.step.clone()).collect();
    let impact = nisse_core::world::plan_impact(store.world()?.as_ref(), &steps, true);
    let text = render_approval_whole(
        agent,
        item,
        plan,
        expires.unwrap_or(plan.proposed_at),
        None,
        &impact,
        &binds,
    );
    outln!(out, "{text}");
    if let Some(h) = &plan.halted {
        outln!(out, "\nhalted: {h}");
    }
    outln!(
        out,
        "\nstatus: {} · {} of {} steps done",
        plan.status,
        plan.next_step,
        plan.steps.len()
    );
    Ok(())
}

/// `nisse autonomy …`.
pub async fn autonomy(cfg: &Config, change: AutonomyChange) -> anyhow::Result<()> {
    let bus: Bus = crate::inspect::connect(cfg).await?;
    let by = format!("{CHANNEL}:{}", local_user());
    print!("{}", switches(&bus, &by, change).await?.text);
    Ok(())
}

/// The kill switches after `change` made by `by` (`<channel>:<name>`, as
/// the board records who changed it), shown.
pub async fn switches(bus: &Bus, by: &str, change: AutonomyChange) -> anyhow::Result<Shown> {
    let by = by.to_string();
    let state = match change {
        AutonomyChange::Show => bus.switches().await?,
        AutonomyChange::On => bus.update_switches(&by, |b| b.autonomy_off = false).await?,
        AutonomyChange::Off => bus.update_switches(&by, |b| b.autonomy_off = true).await?,
        AutonomyChange::Never { target, reason } => {
            bus.update_switches(&by, |b| {
                b.never.insert(
                    target.clone(),
                    nisse_bus::NeverEntry {
                        reason: reason.clone(),
                        set_by: by.clone(),
                    },
                );
            })
            .await?
        }
        AutonomyChange::Clear { target } => {
            bus.update_switches(&by, |b| {
                b.never.remove(&target);
            })
            .await?
        }
    };
    let b = &state.board;
    let mut text = String::new();
    outln!(
        text,
        "autonomy: {}",
        if b.autonomy_off {
            "off (every action that changes something needs the operator's go-ahead)"
        } else {
            "on"
        }
    );
    if b.never.is_empty() {
        outln!(text, "never: (no targets)");
    }
    for (target, e) in &b.never {
        outln!(text, "never: {target} — {} (set by {})", e.reason, e.set_by);
    }
    if !b.changed_by.is_empty() {
        outln!(
            text,
            "last changed by {} (revision {})",
            b.changed_by,
            state.revision
        );
    }
    let json = serde_json::json!({
        "autonomy_off": b.autonomy_off,
        "never": b.never.iter().map(|(t, e)| serde_json::json!({
            "target": t, "reason": e.reason, "set_by": e.set_by,
        })).collect::<Vec<_>>(),
        "changed_by": b.changed_by,
        "revision": state.revision,
    });
    Ok(Shown::new(text, json))
}

/// What `nisse autonomy` does.
#[derive(Debug, Clone)]
pub enum AutonomyChange {
    /// Print the switches.
    Show,
    /// Autonomy on.
    On,
    /// Autonomy off.
    Off,
    /// Switch a target to never.
    Never {
        /// The target.
        target: String,
        /// Why.
        reason: String,
    },
    /// Clear a target's never switch.
    Clear {
        /// The target.
        target: String,
    },
}

/// `nisse policy classify`: each simple command with its risk, class and
/// the rule that decided; with a target, the whole assessment.
pub fn classify(cfg: &Config, command: &str, target: Option<&str>) -> anyhow::Result<Shown> {
    use crate::shown::outln;
    let policy = cfg.load_policy()?;
    let report = policy.classify_command(command);
    let assessment = target.map(|t| policy.assess(&Action::shell(t, command), None));
    let mut text = String::new();
    for f in &report.commands {
        let via = if f.via.is_empty() {
            String::new()
        } else {
            format!(" (via {})", f.via.join(" › "))
        };
        outln!(
            text,
            "{:<16} class {}  {}{via}\n                 rule {}: {}",
            f.risk.as_str(),
            f.risk.action_class().number(),
            f.command,
            f.rule,
            f.reason
        );
    }
    outln!(
        text,
        "=> {} (class {}){}",
        report.risk,
        report.risk.action_class().number(),
        if report.takes_host_down {
            "; can take its host down"
        } else {
            ""
        }
    );
    if let Some(a) = &assessment {
        outln!(
            text,
            "on {}: class {}",
            a.targets.join(", "),
            a.class.number()
        );
        for p in &a.protected {
            outln!(text, "protected: {p}");
        }
        for n in &a.never {
            outln!(text, "never: {} — {}", n.target, n.reason);
        }
    }
    let json = serde_json::json!({
        "command": command,
        "risk": report.risk,
        "class": report.risk.action_class().number(),
        "commands": report.commands.iter().map(|f| serde_json::json!({
            "command": f.command,
            "via": f.via,
            "risk": f.risk,
            "class": f.risk.action_class().number(),
            "rule": f.rule,
            "reason": f.reason,
        })).collect::<Vec<_>>(),
        "takes_host_down": report.takes_host_down,
        "assessment": assessment,
    });
    Ok(Shown::new(text, json))
}

/// `nisse policy check [FILE]`.
pub fn check(cfg: &Config, file: Option<&Path>) -> anyhow::Result<()> {
    let policy = match file {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            nisse_policy::Policy::with_file(&path.display().to_string(), &text)?
        }
        None => cfg.load_policy()?,
    };
    println!("policy is valid: {}", policy.sources().join(" + "));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_files_parse_and_errors_name_the_line() {
        let text = r#"
rationale = "free space"

[[step]]
target = "nas01"
command = "zfs snapshot tank/media@pre"

[[step]]
target = "nas01"
command = "zfs destroy tank/media/old"
precondition = { command = "zfs list tank/media/old" }
expected = { command = "zfs list tank/media/old", exit-code = 1 }
retries = 0
declared-risk = "destructive"
"#;
        let plan = parse_plan("p.toml", text).unwrap();
        assert_eq!(plan.steps.len(), 2);
        assert_eq!(
            plan.steps[1].arguments_json,
            r#"{"command":"zfs destroy tank/media/old"}"#
        );
        assert_eq!(plan.steps[1].expected.as_ref().unwrap().exit_code, 1);
        assert_eq!(plan.steps[1].retries, Some(0));

        let e = parse_plan(
            "p.toml",
            "[[step]]\ntarget = \"x\"\n\n[[step]]\ntarget = \"y\"\n",
        )
        .unwrap_err()
        .to_string();
        assert!(e.starts_with("p.toml:1: step 1:"), "{e}");
        let e = parse_plan(
            "p.toml",
            "[[step]]\ntarget = \"x\"\ncommand = \"ls\"\nretries = -1\n",
        )
        .unwrap_err()
        .to_string();
        assert!(e.starts_with("p.toml:4:"), "{e}");
        assert!(parse_plan("p.toml", "rationale = \"x\"\n").is_err());
    }

    #[test]
    fn a_plan_file_step_calls_an_mcp_tool_checked_by_a_read_only_mcp_call() {
        let text = r#"
[[step]]
tool = "mcp:hv-site-a-elevated/stop_vm"
target = "hv-site-a-elevated"
arguments = { vm = 101 }
precondition = { tool = "mcp:hv-site-a-ro/vm_status", arguments = { vm = 101 }, output-contains = "running" }
"#;
        let plan = parse_plan("p.toml", text).unwrap();
        let step = &plan.steps[0];
        assert_eq!(step.tool, "mcp:hv-site-a-elevated/stop_vm");
        assert_eq!(step.arguments_json, r#"{"vm":101}"#);
        let check = step.precondition.as_ref().unwrap();
        assert_eq!(
            (
                check.tool.as_str(),
                check.arguments_json.as_str(),
                check.command.as_str()
            ),
            ("mcp:hv-site-a-ro/vm_status", r#"{"vm":101}"#, "")
        );
        let e = parse_plan(
            "p.toml",
            "[[step]]\ntarget = \"x\"\ncommand = \"ls\"\nexpected = { command = \"ls\", tool = \"mcp:a/b\" }\n",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("`expected` needs `command` or an MCP `tool`"),
            "{e}"
        );
    }
}
