//! `nisse duties`: each scheduled check as configured, with what its
//! brain recorded (last run and result, failures in a row, a run in
//! flight) and when it is next due; and the last due message of each
//! duty, read from the stream, for `nisse streams`.

use serde::Serialize;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use nisse_bus::proto::DutyDue;
use nisse_bus::{AgentName, Bus, SubjectKind};
use nisse_core::requests::duty_item;
use nisse_ops::checks::{Duty, DutyState};

use crate::config::Config;
use crate::shown::{Shown, outln};

/// One duty as `nisse duties` shows it.
#[derive(Debug, Serialize)]
pub struct DutyStatus {
    /// Its name.
    pub name: String,
    /// Its kind (`http`, `disk`…).
    pub kind: String,
    /// What it checks.
    pub target: String,
    /// How often it runs, in seconds.
    pub interval_s: u64,
    /// Whether it is a generated starter duty.
    pub starter: bool,
    /// Runs started.
    pub runs: u64,
    /// The last finished run's time (RFC 3339).
    pub last_run: Option<String>,
    /// `pass`, `fail` or `unknown` (no answer, not permitted).
    pub last_result: Option<String>,
    /// What the last run found.
    pub last_summary: Option<String>,
    /// Failed runs in a row.
    pub failures_in_row: u32,
    /// Whether its finding is raised.
    pub failing: bool,
    /// The run in flight, if any.
    pub in_flight: Option<u64>,
    /// When it is next due (RFC 3339), from the last due instant.
    pub next_due: Option<String>,
    /// Due instants passed over while a run was in flight.
    pub skipped: u64,
}

fn rfc3339_ns(ns: i64) -> Option<String> {
    OffsetDateTime::from_unix_timestamp_nanos(i128::from(ns))
        .ok()?
        .format(&Rfc3339)
        .ok()
}

/// The ops agent's duties with their recorded state. The state is read
/// from the brain's store when it is on this machine; without it, the
/// duties are listed as configured.
pub fn statuses(cfg: &Config, agent: &str) -> anyhow::Result<(Vec<DutyStatus>, bool)> {
    let duties: Vec<Duty> = match agent {
        "ops" => cfg.load_duties()?,
        other => anyhow::bail!("agent `{other}` has no duties in this build"),
    };
    let store = crate::items::open(cfg, agent).ok();
    let states: std::collections::BTreeMap<String, DutyState> = match &store {
        Some(store) => store
            .duty_states()?
            .into_iter()
            .filter_map(|(name, json)| Some((name, serde_json::from_str(&json).ok()?)))
            .collect(),
        None => Default::default(),
    };
    let out = duties
        .into_iter()
        .map(|d| {
            let state = states.get(&d.name).cloned().unwrap_or_default();
            let interval_ns = i64::try_from(d.interval.as_nanos()).unwrap_or(i64::MAX);
            DutyStatus {
                kind: d.check.kind().into(),
                target: d.check.target(),
                interval_s: d.interval.as_secs(),
                starter: d.starter,
                runs: state.runs,
                last_run: state.last.as_ref().and_then(|l| rfc3339_ns(l.at_ns)),
                last_result: state.last.as_ref().map(|l| {
                    match l.healthy {
                        Some(true) => "pass",
                        Some(false) => "fail",
                        None => "unknown",
                    }
                    .to_string()
                }),
                last_summary: state.last.as_ref().map(|l| l.summary.clone()),
                failures_in_row: state.failures,
                failing: state.failing,
                in_flight: state.in_flight.as_ref().map(|f| f.run),
                next_due: state
                    .last_due_ns
                    .and_then(|due| rfc3339_ns(due.saturating_add(interval_ns))),
                skipped: state.skipped,
                name: d.name,
            }
        })
        .collect();
    Ok((out, store.is_some()))
}

/// `nisse duties`: each duty with its recorded state and next due time.
pub fn listing(cfg: &Config, agent: &str) -> anyhow::Result<Shown> {
    let (duties, with_state) = statuses(cfg, agent)?;
    let json = serde_json::json!({
        "agent": agent,
        "state_read": with_state,
        "duties": duties,
    });
    let mut text = String::new();
    if duties.is_empty() {
        outln!(
            text,
            "no duties are configured (ops.duty, ops.duties-dir, ops.starter-duties)"
        );
        return Ok(Shown::new(text, json));
    }
    if !with_state {
        outln!(
            text,
            "(the {agent} brain's state store is not on this machine: duties as configured, without their runs)"
        );
    }
    outln!(
        text,
        "{:<28} {:<10} {:<8} {:<7} {:<25} {:<5} {:<25} LAST RESULT",
        "DUTY",
        "KIND",
        "EVERY",
        "RUNS",
        "LAST RUN",
        "FAIL",
        "NEXT DUE"
    );
    for d in &duties {
        let result = match (&d.last_result, &d.last_summary) {
            (Some(r), Some(s)) => format!("{r}: {s}"),
            _ => "-".into(),
        };
        let mut flags = String::new();
        if d.failing {
            flags.push_str(" [failing]");
        }
        if let Some(run) = d.in_flight {
            flags.push_str(&format!(" [run {run} in flight]"));
        }
        if d.starter {
            flags.push_str(" [starter]");
        }
        outln!(
            text,
            "{:<28} {:<10} {:<8} {:<7} {:<25} {:<5} {:<25} {result}{flags}",
            d.name,
            d.kind,
            humantime::format_duration(std::time::Duration::from_secs(d.interval_s)).to_string(),
            d.runs,
            d.last_run.as_deref().unwrap_or("-"),
            d.failures_in_row,
            d.next_due.as_deref().unwrap_or("-"),
        );
    }
    Ok(Shown::new(text, json))
}

/// When a duty was last due, as the stream says.
#[derive(Debug, Clone, Serialize)]
pub struct LastDue {
    /// The duty.
    pub duty: String,
    /// Its last due instant (RFC 3339).
    pub due: Option<String>,
    /// How late that message was published, in milliseconds.
    pub late_ms: u64,
    /// Due instants it stood for that were not published.
    pub missed: u64,
}

/// The last due message of each of `duties` on `agent`'s stream (one
/// request per duty, by subject).
pub async fn last_due(bus: &Bus, agent: &AgentName, duties: &[String]) -> Vec<LastDue> {
    let mut out = Vec::new();
    for duty in duties {
        let subject = format!(
            "{}.{}",
            agent.subject(SubjectKind::DutyDue),
            duty_item(duty)
        );
        let Ok(Some(stored)) = bus.last_on_subject(agent, &subject).await else {
            continue;
        };
        let Ok(due) = <DutyDue as prost::Message>::decode(stored.payload.as_ref()) else {
            continue;
        };
        out.push(LastDue {
            duty: duty.clone(),
            due: due.due.and_then(|t| {
                rfc3339_ns(t.seconds.saturating_mul(1_000_000_000) + i64::from(t.nanos))
            }),
            late_ms: due.late_ms,
            missed: due.missed,
        });
    }
    out
}
