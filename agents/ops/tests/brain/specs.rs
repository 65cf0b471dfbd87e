//! The Quint model of approval binding (`specs/approval.qnt`) against the
//! real brain: traces the model's simulator writes (`quint run --mbt
//! --out-itf`) are played step by step as bus messages into the ops brain
//! (the operator's proposals and replies, the classifier's verdicts, the
//! executor's results, the clock), and after every step the brain's state
//! must be the trace's: the current revision and where it stands, when
//! it was put up, the revisions whose step started, how the last reply
//! bound. So the model and the code cannot drift apart silently.
//!
//! The model's operators reply in Matrix, whose service confirms each
//! approval request as soon as it is posted: the model's "put up" is a
//! request sent and shown, which is what a bare `approve` there may bind
//! (a request not shown yet is answered with the revision to name, which
//! the model leaves out). The stranger's replies come by the CLI, where
//! the brain records a refused decision for each.

use std::path::{Path, PathBuf};

use serde_json::Value;

use nisse_bus::proto::{self, ClassifyRequest, ExecRequest, ExecStatus};
use nisse_core::plans::PlanStatus;
use nisse_core::{Event, LoggedEvent};

use super::gates::Gates;
use super::rig::{OP, at};
use super::*;
use pretty_assertions::assert_eq;

/// How many traces are replayed, and their length.
const TRACES: usize = 100;
const STEPS: usize = 15;

/// The model's `EXPIRY`, in minutes.
const EXPIRY_MINUTES: u64 = 3;

/// The `quint` program scripts/test installs (`NISSE_QUINT`).
fn quint() -> PathBuf {
    std::env::var_os("NISSE_QUINT")
        .map(PathBuf::from)
        .filter(|p| p.is_file())
        .expect(
            "these tests need Quint (npm `@informalsystems/quint`): run them through scripts/test, \
             which installs it (scripts/install-quint) and sets NISSE_QUINT",
        )
}

fn spec() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../specs/approval.qnt")
}

/// `TRACES` traces of the model, from a fixed seed, as JSON.
fn traces() -> Vec<Value> {
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(quint())
        .args([
            "run",
            "--backend",
            "typescript",
            "--mbt",
            "--seed",
            "0x6e69737365",
            "--max-samples",
            &TRACES.to_string(),
            "--n-traces",
            &TRACES.to_string(),
            "--max-steps",
            &STEPS.to_string(),
            "--out-itf",
        ])
        .arg(dir.path().join("trace_{seq}.itf.json"))
        .arg(spec())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "quint run failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let mut traces: Vec<(usize, Value)> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| {
            let path = e.unwrap().path();
            let seq: usize = path
                .file_name()
                .unwrap()
                .to_string_lossy()
                .trim_start_matches("trace_")
                .trim_end_matches(".itf.json")
                .parse()
                .unwrap();
            (
                seq,
                serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap(),
            )
        })
        .collect();
    traces.sort_by_key(|(seq, _)| *seq);
    assert_eq!(traces.len(), TRACES);
    traces.into_iter().map(|(_, t)| t).collect()
}

/// An ITF integer.
fn int(v: &Value) -> i64 {
    v["#bigint"].as_str().unwrap().parse().unwrap()
}

/// A nondeterministic pick of the step.
fn pick<'a>(state: &'a Value, name: &str) -> &'a Value {
    &state["mbt::nondetPicks"][name]["value"]
}

/// What the model says of one state, and what the brain must show.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    revision: u32,
    status: String,
    up_since: Option<i64>,
    ran: Vec<u32>,
    binding: String,
}

impl Seen {
    /// The model's state.
    fn of_trace(state: &Value) -> Self {
        let status = state["status"].as_str().unwrap().to_string();
        let mut ran: Vec<u32> = state["ran"]["#set"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| int(r) as u32)
            .collect();
        ran.sort_unstable();
        Self {
            revision: int(&state["revision"]) as u32,
            up_since: (status == "up").then(|| int(&state["upSince"])),
            status,
            ran,
            binding: state["lastBinding"].as_str().unwrap().to_string(),
        }
    }
}

/// The model played into the ops brain.
struct Player {
    g: Gates,
    minute: i64,
    /// Verdicts given already, and results (an execution request has
    /// its verdict's id).
    answered: std::collections::BTreeSet<String>,
    finished: std::collections::BTreeSet<String>,
    /// Events of the item seen before the last reply.
    decisions_seen: usize,
    binding: String,
    /// Replies sent in Matrix, for their event ids.
    replies: usize,
}

impl Player {
    fn new() -> Self {
        let config = Config {
            // The rig's operator proposes; the model's operators reply.
            operators: vec![
                OP.into(),
                "matrix:@alice:example.org".into(),
                "matrix:@bob:example.org".into(),
            ],
            approval_expiry: std::time::Duration::from_secs(EXPIRY_MINUTES * 60),
            ..Config::default()
        };
        let mut h = Harness::ops(config);
        h.alert(0, "firing", CPU);
        Self {
            g: Gates::around(h),
            minute: 0,
            answered: Default::default(),
            finished: Default::default(),
            decisions_seen: 0,
            binding: String::new(),
            replies: 0,
        }
    }

    /// Answers the classify requests `which` selects that were not answered.
    fn verdicts(&mut self, which: impl Fn(&ClassifyRequest) -> bool) {
        let pending: Vec<ClassifyRequest> = self
            .g
            .h
            .emitted::<ClassifyRequest>()
            .into_iter()
            .filter(|r| which(r) && self.answered.insert(r.request_id.clone()))
            .collect();
        for r in &pending {
            self.g.verdict(self.minute, r);
        }
    }

    /// Plays one step of the trace.
    fn play(&mut self, state: &Value) {
        let action = state["mbt::actionTaken"].as_str().unwrap();
        match action {
            "init" => {}
            "tick" => self.minute += 1,
            "propose" => self
                .g
                .propose(self.minute, &[("host1", "systemctl restart app")]),
            "putUp" => self.verdicts(|r| r.request_id.ends_with(":assess")),
            "reply" => {
                let who = pick(state, "who").as_str().unwrap();
                let named = int(pick(state, "named")) as u32;
                let approve = pick(state, "approve").as_bool().unwrap();
                if who == "mallory" {
                    let command = if approve {
                        proto::operator_command::Command::Approve(proto::Approve {
                            revision: named,
                            ..Default::default()
                        })
                    } else {
                        proto::operator_command::Command::Deny(proto::Deny {
                            revision: named,
                            reason: "not now".into(),
                        })
                    };
                    self.g.command(self.minute, "cli:mallory", command);
                } else {
                    let rev = if named == 0 {
                        String::new()
                    } else {
                        format!(" rev-{named}")
                    };
                    let body = if approve {
                        format!("approve{rev}")
                    } else {
                        format!("deny{rev} not now")
                    };
                    self.replies += 1;
                    let item = self.g.item().id;
                    self.g.h.matrix(
                        self.minute,
                        proto::MatrixEventReceived {
                            event_id: format!("$reply{}", self.replies),
                            sender: format!("@{who}:example.org"),
                            kind: proto::MatrixEventKind::Message as i32,
                            body,
                            ..Default::default()
                        },
                        &item,
                    );
                }
                self.binding = self.last_binding();
                // An approval starts the step: its execution is classified.
                self.verdicts(|r| !r.request_id.ends_with(":assess"));
            }
            "finish" => {
                let running = self.g.current().revision;
                let pending: Vec<ExecRequest> = self
                    .g
                    .exec_requests()
                    .into_iter()
                    .filter(|r| {
                        r.permission
                            .as_ref()
                            .is_some_and(|p| p.plan_revision == running)
                            && self.finished.insert(r.request_id.clone())
                    })
                    .collect();
                assert_eq!(pending.len(), 1, "one step runs: {pending:#?}");
                self.g
                    .answer(self.minute, &pending[0], ExecStatus::Completed, 0, "ok");
            }
            other => panic!("the model took an action the replay does not know: {other}"),
        }
        // Every approval request the brain sent is in the room at once.
        self.g.h.posted(self.minute);
    }

    /// How the operator's last reply bound, from the decision the brain
    /// logged for it.
    fn last_binding(&mut self) -> String {
        let item = self.g.item().id;
        let decisions: Vec<LoggedEvent> = self
            .g
            .h
            .store
            .events(&item)
            .unwrap()
            .into_iter()
            .filter(|e| {
                matches!(
                    e.event,
                    Event::Approved { .. } | Event::Denied { .. } | Event::DecisionRefused { .. }
                )
            })
            .collect();
        assert_eq!(
            decisions.len(),
            self.decisions_seen + 1,
            "one decision logged per reply"
        );
        self.decisions_seen = decisions.len();
        match &decisions.last().unwrap().event {
            Event::Approved { .. } | Event::Denied { .. } => "apply".into(),
            Event::DecisionRefused { reason, .. } => {
                let kinds = [
                    ("not on the operator allowlist", "not_allowed"),
                    ("no plan is waiting", "nothing_up"),
                    ("is not the current plan", "not_current"),
                    ("has not been put up", "not_yet_up"),
                    ("was already approved", "already_approved"),
                    ("expired", "expired"),
                ];
                kinds
                    .iter()
                    .find(|(words, _)| reason.contains(words))
                    .map_or("already_decided", |(_, kind)| kind)
                    .to_string()
            }
            _ => unreachable!(),
        }
    }

    /// What the brain shows.
    fn seen(&self) -> Seen {
        let plans = self.g.plans();
        let (revision, status, up_since) = match plans.last() {
            None => (0, "none".to_string(), None),
            Some(p) => {
                let status = match p.status {
                    PlanStatus::Proposed => "proposed",
                    PlanStatus::Up => "up",
                    PlanStatus::Approved | PlanStatus::Running => "approved",
                    _ => "decided",
                };
                let up_since = (p.status == PlanStatus::Up).then(|| {
                    let since = p.put_up_at.expect("a plan up was put up");
                    (since - at(0)).whole_minutes()
                });
                (p.revision, status.to_string(), up_since)
            }
        };
        let mut ran: Vec<u32> = self
            .g
            .exec_requests()
            .iter()
            .filter_map(|r| r.permission.as_ref().map(|p| p.plan_revision))
            .collect();
        ran.sort_unstable();
        ran.dedup();
        Seen {
            revision,
            status,
            up_since,
            ran,
            binding: self.binding.clone(),
        }
    }
}

/// Plays `trace` into a new brain, comparing at every step; the first
/// difference, with the steps that led to it.
fn replay(trace: &Value) -> Result<(), String> {
    let mut player = Player::new();
    let mut path = Vec::new();
    for state in trace["states"].as_array().unwrap() {
        player.play(state);
        path.push(state["mbt::actionTaken"].as_str().unwrap().to_string());
        let want = Seen::of_trace(state);
        let got = player.seen();
        if got != want {
            return Err(format!(
                "after {}: the model has {want:?}, the brain {got:?}",
                path.join(" → ")
            ));
        }
    }
    Ok(())
}

#[test]
fn the_brain_binds_approvals_as_the_model_does_over_a_hundred_simulated_traces() {
    let traces = traces();
    let mut actions = std::collections::BTreeMap::<String, usize>::new();
    let mut bindings = std::collections::BTreeSet::<String>::new();
    for (n, trace) in traces.iter().enumerate() {
        for state in trace["states"].as_array().unwrap() {
            *actions
                .entry(state["mbt::actionTaken"].as_str().unwrap().to_string())
                .or_default() += 1;
            bindings.insert(state["lastBinding"].as_str().unwrap().to_string());
        }
        if let Err(e) = replay(trace) {
            panic!("trace {n}: {e}");
        }
    }
    // The traces reached what matters: every kind of reply, steps run.
    for kind in [
        "apply",
        "not_allowed",
        "not_current",
        "expired",
        "already_decided",
    ] {
        assert!(
            bindings.contains(kind),
            "no trace reached `{kind}`: {bindings:?}"
        );
    }
    assert!(actions.get("finish").is_some_and(|n| *n > 0), "{actions:?}");
}

/// Every model in `specs/`: its own tests pass (`quint test`), and its
/// invariants hold over simulated runs (`quint run --invariant safe`).
#[test]
fn every_model_passes_its_tests_and_keeps_its_invariants_over_simulated_runs() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../specs");
    let mut models: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "qnt"))
        .collect();
    models.sort();
    assert!(models.len() >= 3, "{models:?}");
    for model in &models {
        for args in [
            vec!["test", "--backend", "typescript"],
            vec![
                "run",
                "--backend",
                "typescript",
                "--invariant",
                "safe",
                "--seed",
                "0x6e69737365",
                "--max-samples",
                "500",
                "--max-steps",
                "25",
            ],
        ] {
            let out = std::process::Command::new(quint())
                .args(&args)
                .arg(model)
                .output()
                .unwrap();
            let said = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(
                out.status.success(),
                "quint {} {}:\n{said}",
                args.join(" "),
                model.display()
            );
            if args[0] == "test" {
                assert!(
                    said.contains("passing") && !said.contains("failing"),
                    "{said}"
                );
            } else {
                assert!(said.contains("No violation found"), "{said}");
            }
        }
    }
}

/// Built only with the `mutant-binding` feature, whose binding rule lets
/// a reply naming another revision land on the current one: the replay
/// must tell the brain from the model. Run by scripts/test on its own.
#[cfg(feature = "mutant-binding")]
#[test]
fn mutant_binding_the_replay_catches_a_broken_binding_rule() {
    let traces = traces();
    let caught: Vec<String> = traces.iter().filter_map(|t| replay(t).err()).collect();
    assert!(
        caught
            .iter()
            .any(|e| e.contains("binding: \"not_current\"") && e.contains("binding: \"apply\"")),
        "no trace told the broken rule from the model (a reply about another revision applied): {caught:#?}"
    );
}
