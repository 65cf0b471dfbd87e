//! The classifier's verdict a request names, read back and checked by the
//! services that carry requests out: the executor and the mcp service.
//!
//! The brain asks the classifier about an action and only then, from a
//! permit, asks a service to carry it out, naming the verdict in the
//! request's signed permission. The signature says the brain sent the
//! request; it does not say the classifier saw the action. So each of
//! those services reads the verdict itself, from the classifier's own
//! subject (`in.classify.verdict.<request>`, which only the classifier's
//! identity may publish on), and refuses a request whose verdict is
//! missing, about another work item, "needs discussion", or does not
//! cover the approval the request claims or its class needs
//! ([`Wall::permits`]). A brain bug cannot run what the classifier never
//! judged, nor run it on the strength of a verdict about something else.
//!
//! Whether the verdict is about the very action a request carries out is
//! the service's to say: only it knows how its requests spell an action
//! (a command line or a file operation on a host; a tool call on an
//! instance), and the policy types that compare them are not the bus's.

use std::time::Duration;

use prost::Message as _;

use crate::proto::{ActionClass, ClassifyVerdict, ExecPermission, Verdict};
use crate::topology::verdict_subject;
use crate::{AgentName, Backoff, Bus, Result};

/// How many times a service looks for the verdict a request names before
/// it refuses the request. The classifier's verdict is stored before the
/// brain, which reacts to it, sends the request, so it is there at the
/// first look; the others cover a stream leader that moved in between.
pub const READS: u32 = 6;

/// The waits between those looks: 50 ms doubling to 800 ms, about 1.5 s
/// in all before a request naming no stored verdict is refused.
pub const READ_BACKOFF: Backoff =
    Backoff::new(Duration::from_millis(50), Duration::from_millis(800));

/// The verdict wall, worded for the service that holds it.
#[derive(Debug, Clone, Copy)]
pub struct Wall<'a> {
    /// Who refuses: "the executor".
    pub who: &'a str,
    /// What it refuses: "the request", "the call".
    pub noun: &'a str,
    /// What was not done: "nothing was run".
    pub nothing_done: &'a str,
}

impl Wall<'_> {
    /// The verdict `permission` names, for a request of work item
    /// `work_item_id` on `agent`'s stream: `Ok(Ok(verdict))`, or
    /// `Ok(Err(reason))` to refuse the request with (no verdict named,
    /// none stored under that id after [`READS`] looks, not a verdict, or
    /// one about another work item). `Err` when the stream could not be
    /// read: retry the request later.
    pub async fn verdict(
        &self,
        bus: &Bus,
        agent: &AgentName,
        work_item_id: &str,
        permission: Option<&ExecPermission>,
    ) -> Result<std::result::Result<ClassifyVerdict, String>> {
        let (who, noun, nothing) = (self.who, self.noun, self.nothing_done);
        let Some(id) = permission
            .map(|p| p.verdict_request_id.as_str())
            .filter(|id| !id.is_empty())
        else {
            return Ok(Err(format!(
                "refused by {who}: {noun} names no verdict of the classifier, and {who} carries out only what the classifier judged; {nothing}"
            )));
        };
        let subject = verdict_subject(agent, id);
        let mut waits = READ_BACKOFF.delays();
        let mut stored = None;
        for look in 1..=READS {
            stored = bus.last_on_subject(agent, &subject).await?;
            if stored.is_some() || look == READS {
                break;
            }
            tokio::time::sleep(waits.next().unwrap_or(READ_BACKOFF.max())).await;
        }
        let missing = || {
            format!(
                "refused by {who}: {noun} names the classifier's verdict `{id}`, and the classifier published none under that id (on {subject}); {nothing}"
            )
        };
        let Some(stored) = stored else {
            return Ok(Err(missing()));
        };
        let verdict = match ClassifyVerdict::decode(stored.payload.as_ref()) {
            Ok(v) => v,
            Err(e) => {
                return Ok(Err(format!(
                    "refused by {who}: the message on {subject} is not a verdict ({e}); {nothing}"
                )));
            }
        };
        // A hashed token may stand for another id too: this subject then
        // holds no verdict for this one.
        if verdict.request_id != id {
            return Ok(Err(missing()));
        }
        let about = verdict
            .envelope
            .as_ref()
            .map_or("", |e| e.work_item_id.as_str());
        if about != work_item_id {
            return Ok(Err(format!(
                "refused by {who}: the classifier's verdict `{id}` is about work item {}, and {noun} is for work item {work_item_id}; {nothing}",
                if about.is_empty() { "(none)" } else { about }
            )));
        }
        Ok(Ok(verdict))
    }

    /// Whether `verdict` permits what `permission` claims for an action
    /// the service's own policy finds of class `assessed`, as the brain's
    /// permit did (`nisse_policy::Permit::issue`), from the classifier's
    /// word rather than the brain's:
    ///
    /// - the verdict is "safe" or "dangerous but in scope", never "needs
    ///   discussion";
    /// - the service's policy does not find the action more dangerous
    ///   than the verdict's class (the classifier judged what the service
    ///   would run; a policy changed on one side only, or a risk the
    ///   brain left undeclared, is refused, not resolved either way);
    /// - an approved step the request claims is the step the classifier
    ///   found the action to be, in the same revision;
    /// - an operator's confirmation the request claims (which also lets
    ///   it pass `autonomy off`) was in the scope the classifier judged;
    /// - class 1 needs nothing more; class 2 needs a step, the operator's
    ///   confirmation, or a scope that contains class 2 on every target it
    ///   names (the item's build host); class 3 needs a step or the
    ///   operator's confirmation.
    pub fn permits(
        &self,
        verdict: &ClassifyVerdict,
        permission: &ExecPermission,
        assessed: ActionClass,
    ) -> std::result::Result<(), String> {
        let (who, noun, nothing) = (self.who, self.noun, self.nothing_done);
        let id = verdict.request_id.as_str();
        let said = Verdict::try_from(verdict.verdict).unwrap_or_default();
        if !matches!(said, Verdict::Safe | Verdict::DangerousInScope) {
            return Err(format!(
                "refused by {who}: the classifier's verdict `{id}` says it needs discussion ({}), and nothing that needs discussion is carried out; {nothing}",
                verdict
                    .reasons
                    .first()
                    .map_or("no reason given", String::as_str)
            ));
        }
        let judged = class_of(verdict.action_class);
        if rank(assessed) > rank(judged) {
            return Err(format!(
                "refused by {who}: the classifier's verdict `{id}` judged it {}, and {who}'s policy finds it {}: they disagree (a policy changed on one side only, or a risk left undeclared); {nothing}",
                class_words(judged),
                class_words(assessed)
            ));
        }
        let scope = verdict.scope.unwrap_or_default();
        if permission.plan_revision > 0 {
            let as_judged = scope.plan_revision == permission.plan_revision
                && scope.plan_step == Some(permission.step);
            if !as_judged {
                let judged_as = match (scope.plan_revision, scope.plan_step) {
                    (0, _) => "under no approved plan".to_string(),
                    (rev, Some(step)) => format!("as step {} of rev-{rev}", u64::from(step) + 1),
                    (rev, None) => format!("as no step of rev-{rev}"),
                };
                return Err(format!(
                    "refused by {who}: {noun} claims step {} of the approved plan rev-{}, and the classifier's verdict `{id}` judged it {judged_as}; {nothing}",
                    u64::from(permission.step) + 1,
                    permission.plan_revision
                ));
            }
        }
        if permission.operator_confirmed && !scope.operator_confirmed {
            return Err(format!(
                "refused by {who}: {noun} says the operator confirmed it, and the classifier's verdict `{id}` judged it without that confirmation; {nothing}"
            ));
        }
        let approved = permission.plan_revision > 0 || permission.operator_confirmed;
        let ok = match judged {
            ActionClass::ActionClass1 => true,
            ActionClass::ActionClass2 => approved || scope.contained,
            _ => approved,
        };
        if ok {
            Ok(())
        } else {
            Err(format!(
                "refused by {who}: the classifier's verdict `{id}` judged it {}, which is carried out only {}, and {noun} carries none of them; {nothing}",
                class_words(judged),
                if judged == ActionClass::ActionClass2 {
                    "as a step of an approved plan, with the operator's confirmation, or on a target where the agreed scope contains it"
                } else {
                    "as a step of an approved plan or with the operator's confirmation"
                }
            ))
        }
    }
}

/// A verdict's class; an unknown one is class 3, as the brain reads it.
fn class_of(value: i32) -> ActionClass {
    match ActionClass::try_from(value) {
        Ok(c @ (ActionClass::ActionClass1 | ActionClass::ActionClass2)) => c,
        _ => ActionClass::ActionClass3,
    }
}

/// The order of classes: an unspecified one counts as class 3.
fn rank(class: ActionClass) -> u8 {
    match class {
        ActionClass::ActionClass1 => 1,
        ActionClass::ActionClass2 => 2,
        ActionClass::ActionClass3 | ActionClass::Unspecified => 3,
    }
}

fn class_words(class: ActionClass) -> &'static str {
    match class {
        ActionClass::ActionClass1 => "class 1 (no side effects)",
        ActionClass::ActionClass2 => "class 2 (contained side effects)",
        ActionClass::ActionClass3 | ActionClass::Unspecified => "class 3 (dangerous)",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::JudgedScope;

    /// The rule, written out as a table: every class, every claim a
    /// request can make and every scope a verdict can record, against
    /// what the brain's permit allows.
    #[test]
    fn a_verdict_permits_exactly_what_its_class_and_judged_scope_allow() {
        let claims = [
            ("nothing", 0, 0, false),
            ("step 2 of rev-3", 3, 1, false),
            ("step 1 of rev-3", 3, 0, false),
            ("confirmed", 0, 0, true),
        ];
        let scopes = [
            ("none", JudgedScope::default()),
            (
                "rev-3 step 2",
                JudgedScope {
                    plan_revision: 3,
                    plan_step: Some(1),
                    ..Default::default()
                },
            ),
            (
                "confirmed",
                JudgedScope {
                    operator_confirmed: true,
                    ..Default::default()
                },
            ),
            (
                "contained",
                JudgedScope {
                    contained: true,
                    ..Default::default()
                },
            ),
        ];
        for class in [
            ActionClass::ActionClass1,
            ActionClass::ActionClass2,
            ActionClass::ActionClass3,
        ] {
            for (claim, revision, step, confirmed) in claims {
                for (judged, scope) in &scopes {
                    let verdict = ClassifyVerdict {
                        request_id: "v1".into(),
                        verdict: Verdict::Safe as i32,
                        action_class: class as i32,
                        scope: Some(*scope),
                        ..Default::default()
                    };
                    let permission = ExecPermission {
                        verdict_request_id: "v1".into(),
                        plan_revision: revision,
                        step,
                        operator_confirmed: confirmed,
                    };
                    // What the request claims must be what was judged.
                    let claim_holds = match claim {
                        "nothing" => true,
                        "step 2 of rev-3" => *judged == "rev-3 step 2",
                        "step 1 of rev-3" => false,
                        _ => *judged == "confirmed",
                    };
                    let carries = match class {
                        ActionClass::ActionClass1 => true,
                        ActionClass::ActionClass2 => claim != "nothing" || *judged == "contained",
                        _ => claim != "nothing",
                    };
                    let want = claim_holds && carries;
                    let got = check(&verdict, &permission, class);
                    assert_eq!(
                        got.is_ok(),
                        want,
                        "{class:?}, the request claims {claim}, judged with {judged}: {got:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn refusals_name_what_differs() {
        let verdict = |class: ActionClass, scope: JudgedScope| ClassifyVerdict {
            request_id: "v1".into(),
            verdict: Verdict::DangerousInScope as i32,
            action_class: class as i32,
            scope: Some(scope),
            ..Default::default()
        };
        let step = |revision, step| ExecPermission {
            verdict_request_id: "v1".into(),
            plan_revision: revision,
            step,
            operator_confirmed: false,
        };
        let e = check(
            &verdict(ActionClass::ActionClass3, JudgedScope::default()),
            &step(0, 0),
            ActionClass::ActionClass3,
        )
        .unwrap_err();
        assert_eq!(
            e,
            "refused by the executor: the classifier's verdict `v1` judged it class 3 (dangerous), which is carried out only as a step of an approved plan or with the operator's confirmation, and the request carries none of them; nothing was run"
        );
        let judged = JudgedScope {
            plan_revision: 2,
            plan_step: Some(0),
            ..Default::default()
        };
        let e = check(
            &verdict(ActionClass::ActionClass3, judged),
            &step(2, 1),
            ActionClass::ActionClass3,
        )
        .unwrap_err();
        assert!(
            e.contains("claims step 2 of the approved plan rev-2, and the classifier's verdict `v1` judged it as step 1 of rev-2"),
            "{e}"
        );
        // A verdict of class 1 for what the service finds dangerous.
        let e = check(
            &verdict(ActionClass::ActionClass1, JudgedScope::default()),
            &step(0, 0),
            ActionClass::ActionClass3,
        )
        .unwrap_err();
        assert!(
            e.contains("judged it class 1 (no side effects), and the executor's policy finds it class 3 (dangerous)"),
            "{e}"
        );
        // "Needs discussion" never runs, whatever the request claims.
        let mut discuss = verdict(ActionClass::ActionClass1, judged);
        discuss.verdict = Verdict::DangerousNeedsDiscussion as i32;
        discuss.reasons = vec!["autonomy is off".into()];
        let e = check(&discuss, &step(2, 0), ActionClass::ActionClass1).unwrap_err();
        assert!(e.contains("needs discussion (autonomy is off)"), "{e}");
    }

    /// [`Wall::permits`], as the executor words it.
    fn check(
        verdict: &ClassifyVerdict,
        permission: &ExecPermission,
        assessed: ActionClass,
    ) -> std::result::Result<(), String> {
        Wall {
            who: "the executor",
            noun: "the request",
            nothing_done: "nothing was run",
        }
        .permits(verdict, permission, assessed)
    }
}
