//! Approved step sequences (Nisse O2): a plan is a list of literal steps,
//! and an elevated call runs only if it is exactly the next unfinished one.

use serde::{Deserialize, Serialize};

use crate::Action;

/// A check run against the live system: a read-only command (or MCP
/// call) and what it must give.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct Check {
    /// The command, run on the step's target; it must classify as
    /// read-only. Empty when the check is an MCP call.
    #[serde(default)]
    pub command: String,
    /// The MCP tool the check calls instead (`mcp:<instance>/<tool>`, on
    /// its instance); it must classify as read-only. A step on an MCP
    /// instance is checked this way: it has no host to run a command on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
    /// That call's arguments, as canonical JSON.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments: Option<String>,
    /// The exit code it must end with.
    #[serde(default)]
    pub exit_code: i32,
    /// Text its standard output must contain, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_contains: Option<String>,
}

impl Check {
    /// A command check.
    pub fn command(command: &str, exit_code: i32, output_contains: Option<String>) -> Self {
        Self {
            command: command.trim().to_string(),
            exit_code,
            output_contains,
            ..Self::default()
        }
    }

    /// The action the check runs for a step acting on `target`: its MCP
    /// call on the tool's instance, or its command on `target`.
    pub fn action(&self, target: &str) -> Result<Action, crate::ActionError> {
        match &self.tool {
            Some(tool) => {
                let (instance, _) = crate::mcp::split_tool_name(tool).ok_or_else(|| {
                    crate::ActionError(format!(
                        "`{tool}` is not an MCP tool (mcp:<instance>/<tool>)"
                    ))
                })?;
                Action::from_json(tool, instance, self.arguments.as_deref().unwrap_or("{}"))
            }
            None if self.command.trim().is_empty() => Err(crate::ActionError(
                "a check needs a command or an MCP tool".into(),
            )),
            None => Ok(Action::shell(target, &self.command)),
        }
    }

    /// Whether a finished command's result satisfies the check (for an
    /// MCP call, exit 0 is the tool reporting no error and its content is
    /// the output).
    pub fn holds(&self, exit_code: i32, stdout: &str) -> bool {
        exit_code == self.exit_code
            && self
                .output_contains
                .as_deref()
                .is_none_or(|want| stdout.contains(want))
    }
}

/// One literal step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Step {
    /// What runs: tool, target and full normalised arguments.
    pub action: Action,
    /// Checked just before the step; a failure halts without retry.
    pub precondition: Option<Check>,
    /// Checked just after the step; a failure halts without retry.
    pub expected: Option<Check>,
    /// How many times the step may be retried when it fails (default 1).
    pub retries: u32,
}

/// The default retry allowance.
pub const DEFAULT_RETRIES: u32 = 1;

/// The most steps one plan may have.
pub const MAX_STEPS: usize = 64;

/// How a call relates to the plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum StepMatch {
    /// It is the next unfinished step (0-based index).
    Next(usize),
    /// It is a step that already finished.
    AlreadyDone(usize),
    /// It is a later step: steps would run out of order.
    OutOfOrder {
        /// The step it matches.
        step: usize,
        /// The step that is next.
        next: usize,
    },
    /// A step has this tool and target, but other arguments.
    ChangedArguments(usize),
    /// Nothing in the plan is like it.
    NotInPlan,
}

impl StepMatch {
    /// Why a call that is not the next step halts, in words.
    pub fn explain(&self) -> String {
        match self {
            Self::Next(i) => format!("it is step {}", i + 1),
            Self::AlreadyDone(i) => format!("step {} already ran; it is not run again", i + 1),
            Self::OutOfOrder { step, next } => format!(
                "it is step {} but step {} is next: steps run in order",
                step + 1,
                next + 1
            ),
            Self::ChangedArguments(i) => format!(
                "its arguments differ from step {}'s, which is what was approved",
                i + 1
            ),
            Self::NotInPlan => "it is not in the approved plan".into(),
        }
    }
}

/// Matches a call against `steps`, of which the first `done` have finished.
pub fn match_call(steps: &[Step], done: usize, call: &Action) -> StepMatch {
    if steps.get(done).is_some_and(|s| &s.action == call) {
        return StepMatch::Next(done);
    }
    if let Some(i) = steps.iter().position(|s| &s.action == call) {
        return if i < done {
            StepMatch::AlreadyDone(i)
        } else {
            StepMatch::OutOfOrder {
                step: i,
                next: done,
            }
        };
    }
    // Prefer the next step when several share tool and target.
    let same_place = |s: &Step| s.action.tool == call.tool && s.action.target == call.target;
    if steps.get(done).is_some_and(same_place) {
        return StepMatch::ChangedArguments(done);
    }
    match steps.iter().position(same_place) {
        Some(i) => StepMatch::ChangedArguments(i),
        None => StepMatch::NotInPlan,
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A shell step on `web1` without checks (shared with the gate's tests).
    pub(crate) fn step(cmd: &str) -> Step {
        Step {
            action: Action::shell("web1", cmd),
            precondition: None,
            expected: None,
            retries: DEFAULT_RETRIES,
        }
    }

    #[test]
    fn only_the_next_step_matches() {
        let steps = [
            step("systemctl stop caddy"),
            step("cp /tmp/Caddyfile /etc/caddy/Caddyfile"),
            step("systemctl start caddy"),
        ];
        let call = |c: &str| Action::shell("web1", c);
        assert_eq!(
            match_call(&steps, 0, &call("systemctl stop caddy")),
            StepMatch::Next(0)
        );
        assert_eq!(
            match_call(&steps, 1, &call("systemctl stop caddy")),
            StepMatch::AlreadyDone(0)
        );
        assert_eq!(
            match_call(&steps, 0, &call("systemctl start caddy")),
            StepMatch::OutOfOrder { step: 2, next: 0 }
        );
        assert_eq!(
            match_call(&steps, 0, &call("systemctl stop nginx")),
            StepMatch::ChangedArguments(0)
        );
        assert_eq!(
            match_call(&steps, 0, &Action::shell("web2", "systemctl stop caddy")),
            StepMatch::NotInPlan
        );
        assert_eq!(
            match_call(&steps, 3, &call("systemctl start caddy")),
            StepMatch::AlreadyDone(2)
        );
    }

    #[test]
    fn checks_compare_exit_code_and_output() {
        let c = Check::command("systemctl is-active caddy", 0, Some("active".into()));
        assert!(c.holds(0, "active\n"));
        assert!(!c.holds(3, "active\n"));
        assert!(!c.holds(0, "failed\n"));
    }
}
