//! The gate an action passes before it may run: the deterministic fast path
//! (Nisse P4 layer 2) and the permit, the one value an execution request
//! can be built from.

use serde::{Deserialize, Serialize};

use crate::plan::{Step, StepMatch, match_call};
use crate::switches::{SwitchDecision, Switches, consult};
use crate::{Action, ActionClass, Assessment, RiskClass};

/// The classifier's three verdicts (Nisse L4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Proceed.
    Safe,
    /// Proceed, logged and reported to the operator.
    DangerousInScope,
    /// Pause and ask, in plain language.
    NeedsDiscussion,
}

impl Verdict {
    /// The words used in the log and messages.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Safe => "safe",
            Self::DangerousInScope => "dangerous but in scope",
            Self::NeedsDiscussion => "dangerous, needs discussion",
        }
    }
}

/// The approved plan an action is judged against.
#[derive(Debug, Clone, Copy)]
pub struct ApprovedPlan<'a> {
    /// Its revision number.
    pub revision: u32,
    /// Its steps.
    pub steps: &'a [Step],
    /// How many have finished.
    pub done: usize,
}

/// The agreed scope an action is judged against: structured, never text
/// from an untrusted source.
#[derive(Debug, Clone, Copy, Default)]
pub struct Scope<'a> {
    /// The approved plan, if any.
    pub plan: Option<ApprovedPlan<'a>>,
    /// The operator named this exact action after it was halted.
    pub operator_confirmed: bool,
    /// Targets on which class 2 is in the agreed scope (seed P3): for
    /// `nisse-dev`, the item's build host (D6). Set by the harness from
    /// the project's configuration, never by a model. A class-2 action
    /// whose every target is one of these proceeds without a plan step;
    /// class 3 never proceeds by it. Empty for ops, where class 2 needs
    /// an approved step.
    pub contained: &'a [String],
}

impl Scope<'_> {
    /// Whether every one of `targets` (at least one) is where class 2 is
    /// in scope.
    fn contains_all(&self, targets: &[String]) -> bool {
        !targets.is_empty() && targets.iter().all(|t| self.contained.contains(t))
    }
}

/// What the fast path decided.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FastVerdict {
    /// The verdict.
    pub verdict: Verdict,
    /// The kill switches decided it.
    pub by_switch: bool,
    /// Why, one line each.
    pub reasons: Vec<String>,
}

/// The deterministic fast path: class 1 proceeds; class 2 in scope (the
/// next approved step, or on targets where the scope contains class 2)
/// proceeds; class 3 that an approved plan names exactly proceeds as
/// "dangerous but in scope"; the kill switches stop anything they cover.
/// `None`: the fast path cannot settle it (the classifier's model decides,
/// or, without one, it needs discussion).
pub fn fast_path(
    action: &Action,
    assessment: &Assessment,
    switches: &Switches,
    scope: Scope<'_>,
) -> Option<FastVerdict> {
    match consult(
        switches,
        assessment.class,
        &assessment.targets,
        scope.operator_confirmed,
    ) {
        SwitchDecision::Allow => {}
        SwitchDecision::NeedsDiscussion(reason) | SwitchDecision::Refused(reason) => {
            return Some(FastVerdict {
                verdict: Verdict::NeedsDiscussion,
                by_switch: true,
                reasons: vec![reason],
            });
        }
    }
    if assessment.class == ActionClass::NoSideEffects {
        return Some(FastVerdict {
            verdict: Verdict::Safe,
            by_switch: false,
            reasons: vec!["read-only".into()],
        });
    }
    if let Some(plan) = scope.plan
        && let StepMatch::Next(i) = match_call(plan.steps, plan.done, action)
    {
        let named = format!("step {} of the approved plan rev-{}", i + 1, plan.revision);
        let verdict = if assessment.class == ActionClass::Contained {
            Verdict::Safe
        } else {
            Verdict::DangerousInScope
        };
        return Some(FastVerdict {
            verdict,
            by_switch: false,
            reasons: vec![named],
        });
    }
    if assessment.class == ActionClass::Contained && scope.contains_all(&assessment.targets) {
        return Some(FastVerdict {
            verdict: Verdict::Safe,
            by_switch: false,
            reasons: vec![in_scope_reason(&assessment.targets)],
        });
    }
    None
}

/// Why a contained action on `targets` is in scope.
fn in_scope_reason(targets: &[String]) -> String {
    format!(
        "class 2 in scope: {} is the item's build host, where the agreed scope contains side effects",
        targets.join(", ")
    )
}

/// What permitted an action.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Basis {
    /// It only reads.
    ReadOnly,
    /// It is this step of this approved revision (0-based step).
    Step {
        /// The revision.
        revision: u32,
        /// The step.
        step: usize,
    },
    /// The operator named it after it was halted.
    OperatorConfirmed,
    /// It is class 2 (contained), and every target it names is one on
    /// which the agreed scope contains class 2 ([`Scope::contained`]: the
    /// item's build host, P3, D6).
    ContainedInScope,
}

/// Why an action may not run now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Halt {
    /// A `never` switch: refused outright.
    Refused(String),
    /// It needs the operator (autonomy off, the classifier said so, or no
    /// approved plan names it).
    NeedsDiscussion(String),
    /// It does not match the next step of the approved plan.
    PlanMismatch(StepMatch),
}

impl Halt {
    /// In words.
    pub fn explain(&self) -> String {
        match self {
            Self::Refused(r) | Self::NeedsDiscussion(r) => r.clone(),
            Self::PlanMismatch(m) => m.explain(),
        }
    }
}

/// Everything the permit is judged on. Built by whoever is about to ask for
/// an execution; every field is a fact recorded before this moment (the
/// classifier's verdict and the switch reading it carried), so the decision
/// can be replayed.
#[derive(Debug, Clone, Copy)]
pub struct PermitRequest<'a> {
    /// The action.
    pub action: &'a Action,
    /// Its risk and class, as the classifier assessed them.
    pub risk: RiskClass,
    /// See `risk`.
    pub class: ActionClass,
    /// Every target it names.
    pub targets: &'a [String],
    /// The classifier's verdict.
    pub verdict: Verdict,
    /// The switch reading the verdict was given under.
    pub switches: &'a Switches,
    /// The agreed scope.
    pub scope: Scope<'a>,
}

/// Permission to run one action. It can only be made by [`Permit::issue`],
/// which reads the kill switches through [`consult`]; an execution request
/// can only be built from a permit, so no path to an execution skips them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Permit {
    action: Action,
    risk: RiskClass,
    class: ActionClass,
    basis: Basis,
    confirmed: bool,
}

impl Permit {
    /// Decides whether `request.action` may run now.
    pub fn issue(request: PermitRequest<'_>) -> Result<Self, Halt> {
        let confirmed = request.scope.operator_confirmed;
        match consult(request.switches, request.class, request.targets, confirmed) {
            SwitchDecision::Allow => {}
            SwitchDecision::Refused(r) => return Err(Halt::Refused(r)),
            SwitchDecision::NeedsDiscussion(r) => return Err(Halt::NeedsDiscussion(r)),
        }
        if request.verdict == Verdict::NeedsDiscussion {
            return Err(Halt::NeedsDiscussion(
                "the classifier found it needs discussion".into(),
            ));
        }
        let permit = |basis| Self {
            action: request.action.clone(),
            risk: request.risk,
            class: request.class,
            basis,
            confirmed,
        };
        if request.class == ActionClass::NoSideEffects {
            return Ok(permit(Basis::ReadOnly));
        }
        // Class 2 on targets where the scope contains it needs no step; a
        // step that names the action still comes first, so a plan's
        // progress is recorded as the step's.
        let in_scope =
            request.class == ActionClass::Contained && request.scope.contains_all(request.targets);
        match request.scope.plan {
            Some(plan) => match match_call(plan.steps, plan.done, request.action) {
                StepMatch::Next(step) => Ok(permit(Basis::Step {
                    revision: plan.revision,
                    step,
                })),
                _ if in_scope => Ok(permit(Basis::ContainedInScope)),
                _ if confirmed => Ok(permit(Basis::OperatorConfirmed)),
                other => Err(Halt::PlanMismatch(other)),
            },
            None if in_scope => Ok(permit(Basis::ContainedInScope)),
            None if confirmed => Ok(permit(Basis::OperatorConfirmed)),
            None => Err(Halt::NeedsDiscussion(
                "no approved plan names this action".into(),
            )),
        }
    }

    /// Whether the operator named this very action after a halt: the
    /// executor, reading the switches again, must know it passed
    /// `autonomy off` that way.
    pub fn operator_confirmed(&self) -> bool {
        self.confirmed
    }

    /// The permitted action.
    pub fn action(&self) -> &Action {
        &self.action
    }

    /// Its risk.
    pub fn risk(&self) -> RiskClass {
        self.risk
    }

    /// Its class.
    pub fn class(&self) -> ActionClass {
        self.class
    }

    /// What permitted it.
    pub fn basis(&self) -> Basis {
        self.basis
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::tests::step;
    use crate::switches::{Autonomy, Never};

    fn request<'a>(
        action: &'a Action,
        class: ActionClass,
        verdict: Verdict,
        switches: &'a Switches,
        targets: &'a [String],
        scope: Scope<'a>,
    ) -> PermitRequest<'a> {
        PermitRequest {
            action,
            risk: RiskClass::ConfigMutation,
            class,
            targets,
            verdict,
            switches,
            scope,
        }
    }

    #[test]
    fn only_the_next_approved_step_gets_a_permit() {
        let steps = [
            step("systemctl restart caddy"),
            step("systemctl restart nginx"),
        ];
        let plan = ApprovedPlan {
            revision: 2,
            steps: &steps,
            done: 0,
        };
        let scope = Scope {
            plan: Some(plan),
            operator_confirmed: false,
            contained: &[],
        };
        let on = Switches::default();
        let targets = ["web1".to_string()];
        let next = Action::shell("web1", "systemctl restart caddy");
        let p = Permit::issue(request(
            &next,
            ActionClass::Dangerous,
            Verdict::DangerousInScope,
            &on,
            &targets,
            scope,
        ))
        .unwrap();
        assert_eq!(
            p.basis(),
            Basis::Step {
                revision: 2,
                step: 0
            }
        );
        let later = Action::shell("web1", "systemctl restart nginx");
        assert!(matches!(
            Permit::issue(request(
                &later,
                ActionClass::Dangerous,
                Verdict::Safe,
                &on,
                &targets,
                scope
            )),
            Err(Halt::PlanMismatch(StepMatch::OutOfOrder { .. }))
        ));
    }

    #[test]
    fn the_switches_are_read_before_anything_else() {
        let steps = [step("systemctl restart caddy")];
        let scope = Scope {
            plan: Some(ApprovedPlan {
                revision: 1,
                steps: &steps,
                done: 0,
            }),
            operator_confirmed: false,
            contained: &[],
        };
        let action = Action::shell("web1", "systemctl restart caddy");
        let targets = ["web1".to_string()];
        let off = Switches {
            autonomy: Autonomy::Off,
            never: vec![],
        };
        assert!(matches!(
            Permit::issue(request(&action, ActionClass::Dangerous, Verdict::Safe, &off, &targets, scope)),
            Err(Halt::NeedsDiscussion(r)) if r.contains("autonomy")
        ));
        let never = Switches {
            autonomy: Autonomy::On,
            never: vec![Never {
                target: "web1".into(),
                reason: "prod".into(),
            }],
        };
        let confirmed = Scope {
            operator_confirmed: true,
            ..scope
        };
        assert!(matches!(
            Permit::issue(request(
                &action,
                ActionClass::Dangerous,
                Verdict::Safe,
                &never,
                &targets,
                confirmed
            )),
            Err(Halt::Refused(_))
        ));
        // Reading passes both.
        let read = Action::shell("web1", "systemctl status caddy");
        assert!(
            Permit::issue(request(
                &read,
                ActionClass::NoSideEffects,
                Verdict::Safe,
                &never,
                &targets,
                Scope::default()
            ))
            .is_ok()
        );
    }

    #[test]
    fn without_a_plan_only_reading_or_a_confirmation_passes() {
        let on = Switches::default();
        let targets = ["web1".to_string()];
        let action = Action::shell("web1", "systemctl restart caddy");
        assert!(matches!(
            Permit::issue(request(
                &action,
                ActionClass::Contained,
                Verdict::Safe,
                &on,
                &targets,
                Scope::default()
            )),
            Err(Halt::NeedsDiscussion(_))
        ));
        let confirmed = Scope {
            plan: None,
            operator_confirmed: true,
            contained: &[],
        };
        assert_eq!(
            Permit::issue(request(
                &action,
                ActionClass::Dangerous,
                Verdict::Safe,
                &on,
                &targets,
                confirmed
            ))
            .unwrap()
            .basis(),
            Basis::OperatorConfirmed
        );
    }
}
