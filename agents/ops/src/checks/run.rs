//! A duty's runs: started when due, sent to the prober or (through the
//! classifier and a permit) the executor, judged, and counted towards a
//! finding or a recovery.

use serde::{Deserialize, Serialize};
use sha2::Digest as _;

use nisse_bus::AnyMessage;
use nisse_bus::proto::{self, ClassifyVerdict, DutyDue, ExecResult, ExecStatus, ProbeResult};
use nisse_core::requests::{Overdue, duty_item, duty_of};
use nisse_core::text::{shortened, tail};
use nisse_core::{Actor, ActorKind, BrainSettings, StoreError, Txn};
use nisse_policy::{Action, Scope};

use super::config::{Check, Duty, Judge};
use crate::alerts::Finding;
use crate::brain::OpsDuties;

/// What the brain keeps about a duty (in its store's `duties` table, as
/// JSON): its runs, the one in flight, the last outcome, and the counts
/// that decide findings. `nisse duties` shows it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DutyState {
    /// Runs started so far.
    pub runs: u64,
    /// The run waiting for its answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_flight: Option<InFlight>,
    /// How the last finished run came out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last: Option<Outcome>,
    /// Failed runs in a row.
    pub failures: u32,
    /// Passed runs in a row.
    pub successes: u32,
    /// Whether its finding is raised (failing, not yet recovered).
    pub failing: bool,
    /// The instant it was last due (ns since the epoch), from the
    /// scheduler.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_due_ns: Option<i64>,
    /// The interval it was last due at, in milliseconds.
    #[serde(default)]
    pub interval_ms: u64,
    /// Due instants passed over because a run was still in flight.
    pub skipped: u64,
    /// The hosts bound to it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub bound: Vec<String>,
    /// When they were last bound (ns, message time).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bound_at_ns: Option<i64>,
}

/// How often a duty's binding is published again: the executor reads it
/// as the last message on its subject, which must not age out of the
/// stream (30 days by default) while the duty runs.
const REBIND_EVERY_NS: i64 = 24 * 3600 * 1_000_000_000;

/// A run in flight.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InFlight {
    /// Its number.
    pub run: u64,
    /// Its request id.
    pub request_id: String,
    /// When it started (ns, message time).
    pub started_ns: i64,
    /// The operator who asked for it (`nisse duty run`), if one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
}

/// How a run came out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Outcome {
    /// The run.
    pub run: u64,
    /// When it ended (ns, message time).
    pub at_ns: i64,
    /// Passed, failed, or unknown (no answer, not permitted).
    pub healthy: Option<bool>,
    /// What was found, in one line.
    pub summary: String,
}

impl OpsDuties {
    fn duty(&self, name: &str) -> Option<&Duty> {
        self.duties.iter().find(|d| d.name == name)
    }

    fn load_state(txn: &Txn<'_, '_>, name: &str) -> Result<DutyState, StoreError> {
        match txn.duty_state(name)? {
            None => Ok(DutyState::default()),
            Some(text) => serde_json::from_str(&text)
                .map_err(|e| StoreError::Corrupt(format!("the state of duty {name}: {e}"))),
        }
    }

    fn save_state(txn: &mut Txn<'_, '_>, name: &str, state: &DutyState) -> Result<(), StoreError> {
        let text = serde_json::to_string(state)
            .map_err(|e| StoreError::Corrupt(format!("cannot encode a duty's state: {e}")))?;
        txn.set_duty_state(name, &text)
    }

    /// The scheduler says a duty is due.
    pub(crate) fn duty_due(
        &self,
        brain: &BrainSettings,
        txn: &mut Txn<'_, '_>,
        due: &DutyDue,
    ) -> Result<(), StoreError> {
        let Some(duty) = self.duty(&due.duty) else {
            // Due from a configuration that had it: nothing to run now.
            tracing::info!(duty = %due.duty, "a due duty that is not configured; nothing runs");
            return Ok(());
        };
        let due_ns = due.due.as_ref().map(|t| {
            t.seconds
                .saturating_mul(1_000_000_000)
                .saturating_add(i64::from(t.nanos))
        });
        self.start_run(brain, txn, duty, due_ns, due.interval_ms, None)
    }

    /// The operator's `nisse duty run <name>`: the same path as when due.
    pub(crate) fn run_now(
        &self,
        brain: &BrainSettings,
        txn: &mut Txn<'_, '_>,
        name: &str,
        by: &Actor,
    ) -> Result<Result<String, String>, StoreError> {
        let Some(duty) = self.duty(name) else {
            let known: Vec<&str> = self.duties.iter().map(|d| d.name.as_str()).collect();
            return Ok(Err(format!(
                "there is no duty `{name}`; the duties are: {}",
                if known.is_empty() {
                    "none".to_string()
                } else {
                    known.join(", ")
                }
            )));
        };
        let state = Self::load_state(txn, name)?;
        if let Some(f) = &state.in_flight {
            return Ok(Err(format!(
                "duty `{name}` has run {} in flight; it runs again once that one has an answer",
                f.run
            )));
        }
        self.start_run(brain, txn, duty, None, 0, Some(by.to_string()))?;
        Ok(Ok(format!(
            "duty {name}: run {} started ({} {})",
            state.runs + 1,
            duty.check.kind(),
            duty.check.target()
        )))
    }

    fn start_run(
        &self,
        brain: &BrainSettings,
        txn: &mut Txn<'_, '_>,
        duty: &Duty,
        due_ns: Option<i64>,
        interval_ms: u64,
        by: Option<String>,
    ) -> Result<(), StoreError> {
        let mut state = Self::load_state(txn, &duty.name)?;
        if due_ns.is_some() {
            state.last_due_ns = due_ns;
            state.interval_ms = interval_ms;
        }
        if state.in_flight.is_some() {
            // One run at a time: a brain that was down runs a due duty
            // once, not once per instant it missed.
            state.skipped += 1;
            return Self::save_state(txn, &duty.name, &state);
        }
        state.runs += 1;
        let item = duty_item(&duty.name);
        let request_id = format!("{item}:{}", state.runs);
        let timeout_ms = u32::try_from(duty.timeout.as_millis()).unwrap_or(u32::MAX);
        match &duty.check {
            Check::Host { host, command, .. } => {
                let stale = state
                    .bound_at_ns
                    .is_none_or(|at| ns(txn).saturating_sub(at) >= REBIND_EVERY_NS);
                if state.bound != [host.clone()] || stale {
                    txn.bind_duty_hosts(
                        &brain.agent,
                        &item,
                        vec![host.clone()],
                        &state.runs.to_string(),
                    )?;
                    state.bound = vec![host.clone()];
                    state.bound_at_ns = Some(ns(txn));
                }
                txn.emit_classify(
                    &brain.agent,
                    &item,
                    &request_id,
                    &Action::shell(host, command),
                    None,
                    None,
                )?;
            }
            network => {
                let check = match network {
                    Check::Http {
                        url,
                        expect_status,
                        body_contains,
                        max_latency,
                        follow_redirects,
                        ca_file,
                    } => proto::probe_request::Check::Http(proto::HttpProbe {
                        url: url.clone(),
                        expect_status: expect_status.iter().map(|s| u32::from(*s)).collect(),
                        body_contains: body_contains.clone().unwrap_or_default(),
                        max_latency_ms: max_latency
                            .map_or(0, |l| u32::try_from(l.as_millis()).unwrap_or(u32::MAX)),
                        follow_redirects: *follow_redirects,
                        ca_file: path_text(ca_file.as_deref()),
                    }),
                    Check::Tcp { host, port } => {
                        proto::probe_request::Check::Tcp(proto::TcpProbe {
                            host: host.clone(),
                            port: u32::from(*port),
                        })
                    }
                    Check::Tls {
                        host,
                        port,
                        server_name,
                        min_days_left,
                        ca_file,
                    } => proto::probe_request::Check::Tls(proto::TlsProbe {
                        host: host.clone(),
                        port: u32::from(*port),
                        server_name: server_name.clone(),
                        min_days_left: *min_days_left,
                        ca_file: path_text(ca_file.as_deref()),
                    }),
                    Check::Host { .. } => unreachable_host()?,
                };
                let request = proto::ProbeRequest {
                    envelope: Some(txn.agent_envelope(
                        &brain.agent,
                        &item,
                        format!("probe-req:{request_id}"),
                    )),
                    request_id: request_id.clone(),
                    duty: duty.name.clone(),
                    timeout_ms,
                    check: Some(check),
                };
                txn.emit(&request)?;
            }
        }
        state.in_flight = Some(InFlight {
            run: state.runs,
            request_id,
            started_ns: ns(txn),
            by,
        });
        Self::save_state(txn, &duty.name, &state)
    }

    /// An answer to one of a duty's requests (its envelope names the
    /// duty's item).
    pub(crate) fn duty_answer(
        &self,
        brain: &BrainSettings,
        txn: &mut Txn<'_, '_>,
        message: &AnyMessage,
    ) -> Result<(), StoreError> {
        use nisse_bus::Decode as _;
        let Some(name) = duty_of(&message.envelope().work_item_id).map(str::to_string) else {
            return Ok(());
        };
        let Some(duty) = self.duty(&name).cloned() else {
            return Ok(());
        };
        let state = Self::load_state(txn, &name)?;
        let current = state
            .in_flight
            .as_ref()
            .is_some_and(|f| Some(f.request_id.as_str()) == message.request_id());
        if !current {
            return Ok(());
        }
        match message {
            AnyMessage::ProbeResult(result) => self.probe_result(brain, txn, &duty, result),
            AnyMessage::ClassifyVerdict(verdict) => self.duty_verdict(brain, txn, &duty, verdict),
            AnyMessage::ExecResult(result) => self.duty_exec_result(brain, txn, &duty, result),
            _ => Ok(()),
        }
    }

    fn duty_verdict(
        &self,
        brain: &BrainSettings,
        txn: &mut Txn<'_, '_>,
        duty: &Duty,
        verdict: &ClassifyVerdict,
    ) -> Result<(), StoreError> {
        let Check::Host { host, command, .. } = &duty.check else {
            return Ok(());
        };
        let action = Action::shell(host, command);
        let scope = Scope {
            plan: None,
            operator_confirmed: false,
            contained: &[],
        };
        match nisse_core::gate::permit_for(verdict, &action, scope) {
            Ok(permit) => txn.emit_duty_exec(
                permit,
                &brain.agent,
                &duty_item(&duty.name),
                &verdict.request_id,
                duty.timeout,
            ),
            Err(halt) => self.finish(
                brain,
                txn,
                duty,
                None,
                format!("not run: {}", halt.explain()),
                serde_json::json!({ "refused": halt.explain() }),
                &verdict_id(verdict),
            ),
        }
    }

    fn probe_result(
        &self,
        brain: &BrainSettings,
        txn: &mut Txn<'_, '_>,
        duty: &Duty,
        result: &ProbeResult,
    ) -> Result<(), StoreError> {
        let detail = serde_json::json!({
            "kind": duty.check.kind(),
            "target": duty.check.target(),
            "summary": result.summary,
            "latency_ms": result.latency_ms,
            "status_code": result.status_code,
            "days_left": result.days_left,
        });
        let id = result
            .envelope
            .as_ref()
            .map(|e| e.message_id.clone())
            .unwrap_or_default();
        self.finish(
            brain,
            txn,
            duty,
            Some(result.healthy),
            result.summary.clone(),
            detail,
            &id,
        )
    }

    fn duty_exec_result(
        &self,
        brain: &BrainSettings,
        txn: &mut Txn<'_, '_>,
        duty: &Duty,
        result: &ExecResult,
    ) -> Result<(), StoreError> {
        let Check::Host { host, judge, .. } = &duty.check else {
            return Ok(());
        };
        let stdout = String::from_utf8_lossy(&result.stdout);
        let status = ExecStatus::try_from(result.status).unwrap_or_default();
        let (healthy, summary) = if status != ExecStatus::Completed {
            let why = if result.reason.is_empty() {
                status
                    .as_str_name()
                    .trim_start_matches("EXEC_STATUS_")
                    .to_ascii_lowercase()
            } else {
                result.reason.clone()
            };
            (false, format!("could not run on {host}: {why}"))
        } else {
            judge_output(judge, host, result.exit_code, &stdout)
        };
        let detail = serde_json::json!({
            "kind": duty.check.kind(),
            "target": duty.check.target(),
            "host": host,
            "summary": summary,
            "exit_code": result.exit_code,
            "status": status.as_str_name(),
            "stdout_tail": tail(&stdout, 1000),
        });
        let id = result
            .envelope
            .as_ref()
            .map(|e| e.message_id.clone())
            .unwrap_or_default();
        self.finish(brain, txn, duty, Some(healthy), summary, detail, &id)
    }

    /// A duty's request went unanswered past its deadline: the run ends as
    /// "no answer", which counts neither way.
    pub(crate) fn duty_request_expired(
        &self,
        brain: &BrainSettings,
        txn: &mut Txn<'_, '_>,
        overdue: &Overdue,
    ) -> Result<(), StoreError> {
        let Some(name) = duty_of(&overdue.work_item_id) else {
            return Ok(());
        };
        let Some(duty) = self.duty(name).cloned() else {
            return Ok(());
        };
        let state = Self::load_state(txn, name)?;
        if state
            .in_flight
            .as_ref()
            .is_none_or(|f| f.request_id != overdue.request_id)
        {
            return Ok(());
        }
        let summary = format!("no answer: {}", overdue.describe());
        self.finish(
            brain,
            txn,
            &duty,
            None,
            summary,
            serde_json::json!({ "no_answer": overdue.request_id }),
            "",
        )
    }

    /// Ends the run in flight with its outcome and counts it: enough
    /// failures in a row raise the finding (and every later failure
    /// repeats it on the item), enough passes in a row resolve it.
    #[allow(clippy::too_many_arguments)]
    fn finish(
        &self,
        brain: &BrainSettings,
        txn: &mut Txn<'_, '_>,
        duty: &Duty,
        healthy: Option<bool>,
        summary: String,
        detail: serde_json::Value,
        answer_id: &str,
    ) -> Result<(), StoreError> {
        let mut state = Self::load_state(txn, &duty.name)?;
        let Some(run) = state.in_flight.take() else {
            return Ok(());
        };
        state.last = Some(Outcome {
            run: run.run,
            at_ns: ns(txn),
            healthy,
            summary: summary.clone(),
        });
        let mut raise = None;
        match healthy {
            Some(false) => {
                state.failures += 1;
                state.successes = 0;
                if state.failing || state.failures >= duty.fail_after {
                    state.failing = true;
                    raise = Some(true);
                }
            }
            Some(true) => {
                state.successes += 1;
                state.failures = 0;
                if state.failing && state.successes >= duty.recover_after {
                    state.failing = false;
                    raise = Some(false);
                }
            }
            None => {}
        }
        Self::save_state(txn, &duty.name, &state)?;
        let Some(firing) = raise else {
            return Ok(());
        };
        let mut detail = detail;
        if let Some(map) = detail.as_object_mut() {
            map.insert("run".into(), run.run.into());
            map.insert("failures_in_row".into(), state.failures.into());
            map.insert("successes_in_row".into(), state.successes.into());
        }
        let mut hosts = self.config.tool_hosts.clone();
        if let Some(h) = duty.check.host() {
            hosts.push(h.to_string());
        }
        if let Check::Host {
            judge: Judge::Ping { target },
            ..
        } = &duty.check
        {
            hosts.push(target.clone());
        }
        let reporter = match duty.check {
            Check::Host { .. } => "executor",
            _ => "prober",
        };
        let finding = Finding {
            duty: &duty.name,
            what: "check",
            fingerprint: self.duty_fingerprint(duty),
            firing,
            // A new item's title says what fails; a recovery's message
            // names the failure it ends, not the passing run's summary
            // (which is in the detail).
            title: if firing {
                shortened(&format!("{} failing: {summary}", duty.name), 200)
            } else {
                format!("{} failing", duty.name)
            },
            scope: scope_of(&duty.check),
            severity: Some(duty.severity.clone()),
            detail,
            hosts,
            source: format!("duty {}", duty.name),
            link: None,
            id_seed: if answer_id.is_empty() {
                format!("{}:{}", duty_item(&duty.name), run.run)
            } else {
                answer_id.to_string()
            },
            actor: Actor {
                kind: ActorKind::Service,
                id: reporter.into(),
            },
        };
        self.apply_finding(brain, txn, &finding)
    }

    /// A check's fingerprint: a configured rule's, or a hash of the duty
    /// and what it checks.
    pub(crate) fn duty_fingerprint(&self, duty: &Duty) -> String {
        if let Some(rule) = self
            .config
            .fingerprint_rules
            .iter()
            .find(|r| r.duties.contains(&duty.name))
        {
            return rule.fingerprint();
        }
        let mut hash = sha2::Sha256::new();
        for part in [duty.name.as_str(), duty.check.kind(), &duty.check.target()] {
            hash.update((part.len() as u64).to_be_bytes());
            hash.update(part.as_bytes());
        }
        let digest = hash.finalize();
        let hex: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
        format!("duty-{hex}")
    }
}

/// How a host check's output is judged: passed or not, and what was
/// found.
fn judge_output(judge: &Judge, host: &str, exit: i32, stdout: &str) -> (bool, String) {
    match judge {
        Judge::Ping { target } => {
            if exit == 0 {
                (true, format!("{target} answers ping from {host}"))
            } else {
                (
                    false,
                    format!("{target} does not answer ping from {host} (exit {exit})"),
                )
            }
        }
        Judge::Disk {
            mount,
            max_used_percent,
        } => {
            if exit != 0 {
                return (
                    false,
                    format!("df for {mount} on {host} failed (exit {exit})"),
                );
            }
            match disk_use(stdout) {
                Some(used) if used <= u32::from(*max_used_percent) => (
                    true,
                    format!("{mount} on {host} is {used}% used (at most {max_used_percent}%)"),
                ),
                Some(used) => (
                    false,
                    format!(
                        "{mount} on {host} is {used}% used (at most {max_used_percent}% wanted)"
                    ),
                ),
                None => (
                    false,
                    format!("df for {mount} on {host} printed nothing that reads as a use"),
                ),
            }
        }
        Judge::Script {
            expect_exit,
            output_contains,
        } => {
            if exit != *expect_exit {
                return (
                    false,
                    format!("the check on {host} exited {exit} (expected {expect_exit})"),
                );
            }
            match output_contains {
                Some(text) if !stdout.contains(text.as_str()) => (
                    false,
                    format!("the check's output on {host} does not contain {text:?}"),
                ),
                _ => (true, format!("the check on {host} passed (exit {exit})")),
            }
        }
    }
}

/// The use in percent `df -P` reports on its last line.
fn disk_use(stdout: &str) -> Option<u32> {
    let line = stdout.lines().rev().find(|l| !l.trim().is_empty())?;
    let field = line.split_whitespace().nth(4)?;
    field.strip_suffix('%')?.parse().ok()
}

/// A new finding item's scope: the host (or URL's host) the check is
/// about.
fn scope_of(check: &Check) -> String {
    match check {
        Check::Http { url, .. } => url
            .split_once("://")
            .map(|(_, rest)| rest.split(['/', '?', '#']).next().unwrap_or(rest))
            .unwrap_or(url)
            .to_string(),
        Check::Tcp { host, .. } | Check::Tls { host, .. } => host.clone(),
        Check::Host { host, judge, .. } => match judge {
            Judge::Ping { target } => target.clone(),
            _ => host.clone(),
        },
    }
}

fn verdict_id(verdict: &ClassifyVerdict) -> String {
    verdict
        .envelope
        .as_ref()
        .map(|e| e.message_id.clone())
        .unwrap_or_default()
}

fn path_text(path: Option<&std::path::Path>) -> String {
    path.map(|p| p.display().to_string()).unwrap_or_default()
}

fn ns(txn: &Txn<'_, '_>) -> i64 {
    i64::try_from(txn.at().unix_timestamp_nanos()).unwrap_or(i64::MAX)
}

/// A host check is never a probe.
fn unreachable_host() -> Result<proto::probe_request::Check, StoreError> {
    Err(StoreError::Corrupt(
        "a host check was sent to the prober".into(),
    ))
}

#[cfg(test)]
mod tests {
    use super::{disk_use, judge_output};
    use crate::checks::Judge;

    #[test]
    fn df_output_reads_as_a_use() {
        let out = "Filesystem     1024-blocks     Used Available Capacity Mounted on\n/dev/sda1         10000000  9300000    700000      93% /\n";
        assert_eq!(disk_use(out), Some(93));
        assert_eq!(disk_use("nothing"), None);
        let judge = Judge::Disk {
            mount: "/".into(),
            max_used_percent: 90,
        };
        let (ok, summary) = judge_output(&judge, "nas01", 0, out);
        assert!(!ok);
        assert_eq!(summary, "/ on nas01 is 93% used (at most 90% wanted)");
    }
}
