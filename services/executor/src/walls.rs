//! The executor's hard walls, checked for every request before any
//! connection, whatever the brain checked: the request is signed by the
//! agent's brain and unchanged, and not older than accepted; it names a
//! work item, a host and a permission from the gates; the classifier's
//! verdict it names (read from the classifier's own subject, never taken
//! from the brain) judged this very command or file operation on this
//! host, with these secrets, and permits it as the request claims; the
//! host is bound to the work item (read from the stream, not from the
//! request, and signed by the same brain); the kill switches,
//! read now, allow the command; the secrets asked for are granted for the
//! host; and the host's circuit is closed. What passes is a command ready
//! to run with its secrets and their redactor.

use std::time::Duration;

use prost::Message as _;

use nisse_bus::once::Gate;
use nisse_bus::proto::{
    self, ClassifyVerdict, ExecFailure, ExecRequest, ExecResult, ExecStatus, HostBinding,
};
use nisse_bus::signing::Wall;
use nisse_bus::{AgentName, Bus, SubjectKind, Unhandled, verdicts};
use nisse_policy::switches::{SwitchDecision, consult_action};
use nisse_policy::{Action, FileOp};

use crate::breaker::Admit;
use crate::redact::Redactor;
use crate::run::AgentExecutor;
use crate::ssh::RunSpec;

/// A command ready to run.
pub(crate) struct Prepared {
    pub(crate) spec: RunSpec,
    pub(crate) redactor: Redactor,
}

/// The hosts last bound to `work_item_id`: the last message on its
/// binding subject (`out.exec.bind.<id>`, or the subject bindings had
/// before subjects said direction, for items bound then); `None` when
/// none was ever bound.
pub async fn host_binding(
    bus: &Bus,
    agent: &AgentName,
    work_item_id: &str,
) -> nisse_bus::Result<Option<HostBinding>> {
    if !nisse_bus::topology::is_token(work_item_id) {
        return Ok(None);
    }
    let kind = SubjectKind::ExecBind;
    let subjects = std::iter::once(kind.suffix()).chain(kind.legacy_suffix());
    for suffix in subjects {
        let subject = format!("nisse.{agent}.{suffix}.{work_item_id}");
        if let Some(stored) = bus.last_on_subject(agent, &subject).await? {
            return HostBinding::decode(stored.payload.as_ref())
                .map(Some)
                .map_err(|e| nisse_bus::Error::Read {
                    stream: agent.stream(),
                    reason: format!("the binding on {subject} is not a HostBinding: {e}"),
                });
        }
    }
    Ok(None)
}

impl AgentExecutor {
    /// The hard walls, in order, before any connection.
    pub(crate) async fn check(
        &self,
        request: &ExecRequest,
    ) -> Result<Gate<Prepared, ExecResult>, Unhandled> {
        let refuse = |failure: ExecFailure, reason: String| {
            Ok(Gate::Answer(Box::new(self.reply(
                request,
                ExecStatus::Refused,
                failure,
                reason,
            ))))
        };
        let item = request
            .envelope
            .as_ref()
            .map_or("", |e| e.work_item_id.as_str());
        let host = request.host.as_str();
        if item.is_empty() {
            return refuse(
                ExecFailure::BadRequest,
                "the request names no work item, and hosts are bound per work item".into(),
            );
        }
        if host.is_empty() {
            return refuse(ExecFailure::BadRequest, "the request names no host".into());
        }
        // Only the agent's brain makes requests, from a permit, and signs
        // each: the signature covers everything that decides what runs,
        // so nothing below is trusted before it verifies.
        let wall = self.wall();
        let brain_key = match wall.request("the request", request) {
            Ok(key) => key,
            Err(reason) => return refuse(ExecFailure::Signature, reason),
        };
        // The gates always say what permitted a request.
        let Some(permission) = request.permission.as_ref() else {
            return refuse(
                ExecFailure::BadRequest,
                "the request carries no permission from the gates".into(),
            );
        };
        // A command line, or a file tool's operation: exactly one.
        let file = match (&request.file, request.command.trim().is_empty()) {
            (None, false) => None,
            (Some(f), true) => match FileOp::from_wire(f) {
                Ok(op) => Some(op),
                Err(e) => return refuse(ExecFailure::BadRequest, e.0),
            },
            (None, true) => {
                return refuse(ExecFailure::BadRequest, "the request has no command".into());
            }
            (Some(_), false) => {
                return refuse(
                    ExecFailure::BadRequest,
                    "the request has both a command and a file operation".into(),
                );
            }
        };
        // Only bash reads the command (`crate::bash`), and what bash
        // cannot hold would run as something shorter.
        if let Err(e) = crate::bash::check(&request.command) {
            return refuse(ExecFailure::BadRequest, e.to_string());
        }
        let action = match &file {
            Some(op) => match op.to_action(host) {
                Ok(a) => a,
                Err(e) => return refuse(ExecFailure::BadRequest, e.0),
            },
            None => Action::shell(host, &request.command),
        };

        // The classifier's verdict the request names, read from the
        // classifier's own subject: it must have judged this very action,
        // and permit it as the request claims.
        let verdict_wall = self.verdict_wall();
        let verdict = match verdict_wall
            .verdict(&self.bus, &self.agent, item, Some(permission))
            .await
            .map_err(|e| Unhandled::retry(format!("reading the classifier's verdict: {e}")))?
        {
            Ok(v) => v,
            Err(reason) => return refuse(ExecFailure::Verdict, reason),
        };
        if let Some(difference) = differs(request, file.as_ref(), &verdict) {
            return refuse(
                ExecFailure::Verdict,
                format!(
                    "refused by the executor: the request is not the action the classifier's verdict `{}` judged ({difference}); nothing was run and no connection was made",
                    verdict.request_id
                ),
            );
        }
        let assessed = proto::ActionClass::from(self.policy.assess(&action, None).class);
        if let Err(reason) = verdict_wall.permits(&verdict, permission, assessed) {
            return refuse(ExecFailure::Verdict, reason);
        }

        // The host binding, from the stream, signed by the same brain.
        let binding = host_binding(&self.bus, &self.agent, item)
            .await
            .map_err(|e| Unhandled::retry(format!("reading the host binding: {e}")))?;
        if let Some(b) = &binding
            && let Err(reason) = wall.signed_by(
                &brain_key,
                &format!("the host binding of work item {item}"),
                b,
            )
        {
            return refuse(ExecFailure::Signature, reason);
        }
        let bound = binding.map(|b| b.hosts).unwrap_or_default();
        if !bound.iter().any(|h| h == host) {
            return refuse(
                ExecFailure::HostNotBound,
                format!(
                    "{host} is not bound to work item {item} (bound: {}); nothing was run and no connection was made",
                    if bound.is_empty() {
                        "none".to_string()
                    } else {
                        bound.join(", ")
                    }
                ),
            );
        }

        // The kill switches, read now.
        let board = self
            .bus
            .switches()
            .await
            .map_err(|e| Unhandled::retry(format!("reading the kill switches: {e}")))?
            .board;
        let confirmed = request
            .permission
            .as_ref()
            .is_some_and(|p| p.operator_confirmed);
        match consult_action(
            &self.policy,
            &action,
            None,
            board.autonomy_off,
            board.never_reasons(),
            confirmed,
        ) {
            SwitchDecision::Allow => {}
            SwitchDecision::NeedsDiscussion(r) | SwitchDecision::Refused(r) => {
                return refuse(
                    ExecFailure::KillSwitch,
                    format!("refused by the executor: {r}"),
                );
            }
        }

        // Connection settings and secrets.
        let Some(host_cfg) = self.pool.host(host) else {
            return Ok(Gate::Answer(Box::new(self.reply(
                request,
                ExecStatus::Failed,
                ExecFailure::UnknownHost,
                format!(
                    "the executor has no connection settings for {host} (executor.agents.{}.hosts.{host})",
                    self.agent
                ),
            ))));
        };
        // Only the secrets the request names (signed, so the ones the
        // approved action asked for), each allowed on this host and granted
        // by the policy to this very action: a command never gets a secret
        // it did not ask for, and a read-only one none the policy does not
        // grant it.
        if let Some(name) = request
            .secret_names
            .iter()
            .find(|n| !host_cfg.secrets.iter().any(|g| &g.name == *n))
        {
            return refuse(
                ExecFailure::BadRequest,
                format!("the secret `{name}` is not granted for {host}"),
            );
        }
        for name in &request.secret_names {
            if let Err(refusal) = self.policy.secret_grant(&action, name) {
                return refuse(
                    ExecFailure::BadRequest,
                    format!("refused by the executor: {refusal}; nothing was run"),
                );
            }
        }
        let mut spec = RunSpec {
            command: request.command.clone(),
            env: Vec::new(),
            stdin: Vec::new(),
            timeout: self.timeout(request),
        };
        // A file operation runs fixed code on its own input: it needs, and
        // gets, no secrets.
        let grants = match &file {
            Some(op) => {
                if !request.secret_names.is_empty() {
                    return refuse(
                        ExecFailure::BadRequest,
                        "a file operation is handed no secrets".into(),
                    );
                }
                spec.command = op.remote_command();
                spec.stdin = op.stdin().to_vec();
                &[][..]
            }
            None => host_cfg.secrets.as_slice(),
        };
        let mut values: Vec<Vec<u8>> = Vec::new();
        for grant in grants
            .iter()
            .filter(|g| request.secret_names.contains(&g.name))
        {
            let value = match self.read_secret(&grant.name) {
                Ok(v) => v,
                Err(reason) => {
                    return Ok(Gate::Answer(Box::new(self.reply(
                        request,
                        ExecStatus::Failed,
                        ExecFailure::Secret,
                        reason,
                    ))));
                }
            };
            if let Some(var) = &grant.env {
                match String::from_utf8(value.clone()) {
                    Ok(text) => spec.env.push((var.clone(), text)),
                    Err(_) => {
                        return Ok(Gate::Answer(Box::new(self.reply(
                            request,
                            ExecStatus::Failed,
                            ExecFailure::Secret,
                            format!(
                                "the secret `{}` is not text, so it cannot go in an environment variable; hand it over stdin",
                                grant.name
                            ),
                        ))));
                    }
                }
            } else {
                spec.stdin.extend_from_slice(&value);
                spec.stdin.push(b'\n');
            }
            values.push(value);
        }
        if file.is_none() {
            spec.stdin.extend_from_slice(&request.stdin);
        } else if !request.stdin.is_empty() {
            return refuse(
                ExecFailure::BadRequest,
                "a file operation takes no standard input besides its content".into(),
            );
        }

        // The circuit.
        if let Admit::No {
            retry_in,
            last_error,
        } = self.circuits.admit(host)
        {
            return Ok(Gate::Answer(Box::new(self.reply(
                request,
                ExecStatus::Failed,
                ExecFailure::CircuitOpen,
                format!(
                    "the circuit for {host} is open after repeated connection failures (the last: {last_error}); not tried, next try in {}s",
                    retry_in.as_secs() + 1
                ),
            ))));
        }
        Ok(Gate::Proceed(Prepared {
            spec,
            redactor: Redactor::new(values.iter().map(Vec::as_slice)),
        }))
    }

    /// The signature wall, as the executor words it.
    fn wall(&self) -> Wall<'_> {
        Wall {
            agent: self.agent.as_str(),
            key_file: &self.pool.setup().brain_key,
            data_dir: &self.data_dir,
            max_age: self.config.max_request_age,
            who: "the executor",
            nothing_done: "nothing was run and no connection was made",
        }
    }

    /// The verdict wall, as the executor words it.
    fn verdict_wall(&self) -> verdicts::Wall<'static> {
        verdicts::Wall {
            who: "the executor",
            noun: "the request",
            nothing_done: "nothing was run and no connection was made",
        }
    }

    /// The request's timeout, at most the configured one.
    fn timeout(&self, request: &ExecRequest) -> Duration {
        let asked = Duration::from_millis(request.timeout_ms);
        if asked.is_zero() {
            self.config.command_timeout
        } else {
            asked.min(self.config.command_timeout)
        }
    }

    /// A secret's value, read now (so a rotated secret is used at once).
    fn read_secret(&self, name: &str) -> Result<Vec<u8>, String> {
        let source = self
            .pool
            .setup()
            .secrets
            .get(name)
            .ok_or_else(|| format!("the secret `{name}` is not configured"))?;
        source
            .secret()
            .ok_or_else(|| format!("the secret `{name}` has no source"))?
            .read()
            .map(|v| v.expose().to_vec())
            .map_err(|e| format!("the secret `{name}`: {e}"))
    }
}

/// How `request` (its file operation `file`, if it is one) differs from
/// the action `verdict` judged, field by field, in words; `None` when it
/// is that action. What is compared is what decides what runs: the tool,
/// the host, the command line (byte for byte) or the file operation (its
/// path, content and mode), and the secrets handed to it.
fn differs(
    request: &ExecRequest,
    file: Option<&FileOp>,
    verdict: &ClassifyVerdict,
) -> Option<String> {
    let Some(judged) = verdict.action.as_ref() else {
        return Some("the verdict records no action".into());
    };
    let judged = match Action::from_wire(judged) {
        Ok(a) => a,
        Err(e) => return Some(format!("the verdict's action cannot be read: {e}")),
    };
    let judged_file = match FileOp::from_action(&judged) {
        Ok(f) => f,
        Err(e) => return Some(format!("the verdict's action cannot be read: {e}")),
    };
    let mut out = Vec::new();
    let tool = file.map_or("shell", FileOp::tool);
    if judged.tool != tool {
        out.push(format!(
            "tool: the verdict judged `{}`, the request is `{tool}`",
            judged.tool
        ));
    }
    if judged.target != request.host {
        out.push(format!(
            "host: the verdict judged it on {}, the request is for {}",
            judged.target, request.host
        ));
    }
    match (&judged_file, file) {
        (Some(j), Some(r)) if j.tool() == r.tool() => {
            if j.path() != r.path() {
                out.push(format!(
                    "path: the verdict judged {}, the request is for {}",
                    shown(j.path()),
                    shown(r.path())
                ));
            } else if j != r {
                out.push(format!(
                    "file operation: the request's content or mode for {} is not what the verdict judged",
                    shown(r.path())
                ));
            }
        }
        (None, None) => {
            let command = judged.argument_str("command").unwrap_or_default();
            if command != request.command {
                out.push(format!(
                    "command: the verdict judged {}, the request runs {}",
                    shown(&command),
                    shown(&request.command)
                ));
            }
        }
        // Another tool: said above.
        _ => {}
    }
    let mut judged_secrets = judged.secrets().unwrap_or_default();
    let mut asked = request.secret_names.clone();
    judged_secrets.sort();
    asked.sort();
    if judged_secrets != asked {
        out.push(format!(
            "secrets: the verdict judged it with [{}], the request asks for [{}]",
            judged_secrets.join(", "),
            asked.join(", ")
        ));
    }
    (!out.is_empty()).then(|| out.join("; "))
}

/// `text` quoted for a reason, cut to its first 200 characters.
fn shown(text: &str) -> String {
    const MAX: usize = 200;
    match text.char_indices().nth(MAX) {
        Some((cut, _)) => format!("`{}…`", &text[..cut]),
        None => format!("`{text}`"),
    }
}
