//! Kill switches, and the one function that reads them.
//!
//! Two switches exist: the global autonomy switch (`autonomy off`: every
//! action that is not read-only needs discussion, even inside an approved
//! plan) and per-target `never` (the target is refused outright for
//! anything but reading). [`consult`] is the only reader. The classifier
//! calls it for every verdict, [`crate::Permit::issue`] calls it before it
//! issues the permit that an execution request can only be built from, and
//! the executor (before it runs a command) and the mcp service (before it
//! calls a tool) call it again with their own fresh reading, through
//! [`consult_action`]: a switch set after the classifier judged an action
//! still stops it. Oikos's kill switch was read only by code nothing
//! called (§8.1); here there is no path to an execution that does not
//! pass through this function.

use serde::{Deserialize, Serialize};

use crate::{Action, ActionClass, Policy};

/// The global autonomy switch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Autonomy {
    /// Normal operation: approved steps and in-scope actions run.
    #[default]
    On,
    /// Every non-read-only action needs the operator's go-ahead for that
    /// very action.
    Off,
}

/// A `never` switch on a target.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Never {
    /// The target it holds for.
    pub target: String,
    /// Who set it and why (the policy file's reason, or the operator's).
    pub reason: String,
}

/// A reading of the switches, as of some moment.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Switches {
    /// The global switch.
    pub autonomy: Autonomy,
    /// `never` switches that hold for the action's targets (from the policy
    /// file and set at run time).
    pub never: Vec<Never>,
}

impl Switches {
    /// The reading that holds for an assessed action: the board's autonomy
    /// switch, and the `never` switches (the policy file's and the board's,
    /// given as target and reason) that name one of its targets.
    pub fn for_action<'a>(
        autonomy_off: bool,
        board_never: impl IntoIterator<Item = (&'a str, String)>,
        assessment: &crate::Assessment,
    ) -> Self {
        let mut never: Vec<Never> = assessment
            .never
            .iter()
            .map(|n| Never {
                target: n.target.clone(),
                reason: n.reason.clone(),
            })
            .collect();
        for (target, reason) in board_never {
            if assessment.targets.iter().any(|t| t == target) {
                never.push(Never {
                    target: target.to_string(),
                    reason,
                });
            }
        }
        Self {
            autonomy: if autonomy_off {
                Autonomy::Off
            } else {
                Autonomy::On
            },
            never,
        }
    }
}

/// What the switches say about an action.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum SwitchDecision {
    /// Nothing stops it.
    Allow,
    /// Autonomy is off: the operator must name this very action.
    NeedsDiscussion(String),
    /// A `never` target: refused, whatever anyone approved.
    Refused(String),
}

/// Reads the switches for an action of `class` on `targets`.
/// `operator_confirmed` is true when the operator named this exact action
/// after it was halted (that passes `autonomy off`, never `never`).
pub fn consult(
    switches: &Switches,
    class: ActionClass,
    targets: &[String],
    operator_confirmed: bool,
) -> SwitchDecision {
    if class == ActionClass::NoSideEffects {
        return SwitchDecision::Allow;
    }
    if let Some(n) = switches.never.iter().find(|n| targets.contains(&n.target)) {
        return SwitchDecision::Refused(format!(
            "`{}` is switched to never ({}): only reading is allowed there",
            n.target, n.reason
        ));
    }
    if switches.autonomy == Autonomy::Off && !operator_confirmed {
        return SwitchDecision::NeedsDiscussion(
            "autonomy is off: every action that changes something needs the operator's go-ahead"
                .into(),
        );
    }
    SwitchDecision::Allow
}

/// The switches' decision on `action` just before it is carried out:
/// `policy` assesses it, and the switches that hold for it are the policy
/// file's `never` rules and the switch board's as just read
/// (`autonomy_off`, and its `never` switches, given as target and why
/// naming who set it, of which those on one of the action's targets
/// count). `operator_confirmed` is the permit's: the operator named this
/// very action. `declared` is what the one carrying it out knows of the
/// action's risk beyond the policy (an MCP server's own hints, read from
/// its listing); it can raise the class, never lower it. A risk the
/// proposer declared raised the classifier's verdict, which the permit
/// already holds.
pub fn consult_action<'a>(
    policy: &Policy,
    action: &Action,
    declared: Option<crate::RiskClass>,
    autonomy_off: bool,
    board_never: impl IntoIterator<Item = (&'a str, String)>,
    operator_confirmed: bool,
) -> SwitchDecision {
    let assessment = policy.assess(action, declared);
    let switches = Switches::for_action(autonomy_off, board_never, &assessment);
    consult(
        &switches,
        assessment.class,
        &assessment.targets,
        operator_confirmed,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn targets() -> Vec<String> {
        vec!["nas01".into()]
    }

    #[test]
    fn reading_is_never_stopped() {
        let s = Switches {
            autonomy: Autonomy::Off,
            never: vec![Never {
                target: "nas01".into(),
                reason: "r".into(),
            }],
        };
        assert_eq!(
            consult(&s, ActionClass::NoSideEffects, &targets(), false),
            SwitchDecision::Allow
        );
    }

    #[test]
    fn never_refuses_even_when_confirmed() {
        let s = Switches {
            autonomy: Autonomy::On,
            never: vec![Never {
                target: "nas01".into(),
                reason: "backups".into(),
            }],
        };
        assert!(matches!(
            consult(&s, ActionClass::Contained, &targets(), true),
            SwitchDecision::Refused(r) if r.contains("backups")
        ));
        assert_eq!(
            consult(&s, ActionClass::Dangerous, &["web1".to_string()], false),
            SwitchDecision::Allow
        );
    }

    #[test]
    fn autonomy_off_needs_the_operator() {
        let s = Switches {
            autonomy: Autonomy::Off,
            never: vec![],
        };
        assert!(matches!(
            consult(&s, ActionClass::Contained, &targets(), false),
            SwitchDecision::NeedsDiscussion(_)
        ));
        assert_eq!(
            consult(&s, ActionClass::Dangerous, &targets(), true),
            SwitchDecision::Allow
        );
    }

    /// An MCP call as the mcp service consults for it, on a policy that
    /// lists the instance's tools.
    fn mcp_call(tool: &str, vm: u32) -> (Policy, Action) {
        let policy = Policy::with_file(
            "site.toml",
            r#"
version = 1
[mcp.hv-a-ro]
privilege = "read-only"
[mcp.hv-a-ro.tools.vm_status]
privilege = "read-only"
target-argument = "vm"
[mcp.hv-a-elevated]
privilege = "elevated"
[mcp.hv-a-elevated.tools.stop_vm]
privilege = "elevated"
risk = "reversible_low"
target-argument = "vm"
"#,
        )
        .unwrap();
        let instance = if tool == "stop_vm" {
            "hv-a-elevated"
        } else {
            "hv-a-ro"
        };
        let action = Action::new(
            &crate::mcp::tool_name(instance, tool),
            instance,
            &serde_json::json!({ "vm": vm }),
        )
        .unwrap();
        (policy, action)
    }

    #[test]
    fn a_board_never_on_an_instance_target_refuses_the_call_naming_it() {
        let never = || [("hv-a-elevated/101", "backups (set by cli:op)".to_string())];
        let (policy, stop_101) = mcp_call("stop_vm", 101);
        assert!(matches!(
            consult_action(&policy, &stop_101, None, false, never(), true),
            SwitchDecision::Refused(r)
                if r.contains("`hv-a-elevated/101` is switched to never (backups (set by cli:op))")
        ));
        let (policy, stop_102) = mcp_call("stop_vm", 102);
        assert_eq!(
            consult_action(&policy, &stop_102, None, false, never(), false),
            SwitchDecision::Allow
        );
    }

    #[test]
    fn autonomy_off_holds_an_elevated_call_and_lets_reading_through() {
        let (policy, stop) = mcp_call("stop_vm", 101);
        assert!(matches!(
            consult_action(&policy, &stop, None, true, [], false),
            SwitchDecision::NeedsDiscussion(_)
        ));
        assert_eq!(
            consult_action(&policy, &stop, None, true, [], true),
            SwitchDecision::Allow
        );
        let (policy, status) = mcp_call("vm_status", 101);
        assert_eq!(
            consult_action(&policy, &status, None, true, [], false),
            SwitchDecision::Allow
        );
    }
}
