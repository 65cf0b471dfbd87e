//! Kill switches, and the one function that reads them.
//!
//! Two switches exist: the global autonomy switch (`autonomy off`: every
//! action that is not read-only needs discussion, even inside an approved
//! plan) and per-target `never` (the target is refused outright for
//! anything but reading). [`consult`] is the only reader. The classifier
//! calls it for every verdict, [`crate::Permit::issue`] calls it before it
//! issues the permit that an execution request can only be built from, and
//! the executor calls it again with its own fresh reading. Oikos's kill
//! switch was read only by code nothing called (§8.1); here there is no
//! path to an execution that does not pass through this function.

use serde::{Deserialize, Serialize};

use crate::ActionClass;

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
}
