//! The action classifier (seed Nisse L4; design §5): for every
//! `classify.req` on an agent's stream it publishes one `classify.verdict`,
//! on a subject of its request's own (`in.classify.verdict.<request>`),
//! saying what it judged (the action, its class, the approvals the agreed
//! scope gave it), so the services that carry a request out read it there
//! and refuse what it does not cover.
//!
//! Its input is the request's structured action and agreed scope only —
//! the request type has no field for a transcript or untrusted text. It
//! reads the kill switches for every request and runs the deterministic
//! fast path (`nisse-policy`: class 1, in-scope class 2, and class 3 that
//! an approved plan names exactly). What the fast path cannot settle goes
//! to the `classifier` role's model through the model gateway, in-process
//! ([`model`]): the model sees the same structured action and scope and
//! nothing else, and its answer can raise concern or confirm, never make
//! an action look less dangerous than the policy's class. Without a
//! classifier model the answer is "dangerous, needs discussion"
//! (`NO_MODEL`). It fails closed: a malformed request, unreadable switches,
//! a model error, timeout, budget refusal or unclear answer is "needs
//! discussion", never "safe".

pub mod model;

use std::sync::Arc;

use nisse_bus::proto::{self, ClassifyRequest, ClassifyVerdict, DecidedBy, Envelope};
use nisse_bus::service::{Context, Service};
use nisse_bus::{AgentName, Bus, ConsumerSpec, Delivery, Handler, Intake, SwitchBoard, Unhandled};
use nisse_model_gateway::Gateway;
use nisse_models::{ModelsConfig, Role};
use nisse_policy::switches::Switches;
use nisse_policy::{Action, Policy, Scope, Step, Verdict, fast_path};

/// The service; its name is its durable consumer's.
pub const SERVICE: Service = Service {
    name: ConsumerSpec::CLASSIFIER.name,
    about: "the action classifier: a verdict for every proposed action, fast path first, failing closed",
};

/// The reason a verdict gives when the fast path could not settle it and
/// no model was asked.
const NO_MODEL_REASON: &str =
    "the fast path cannot settle it and no classifier model is configured";

/// What the classifier runs with.
#[derive(Debug, Clone)]
pub struct Config {
    /// The policy it assesses actions by.
    pub policy: Arc<Policy>,
    /// `[models]`: with a `classifier` role, what the fast path cannot
    /// settle is put to that model.
    pub models: ModelsConfig,
}

/// Serves every agent of `ctx` until shutdown on its `classifier`
/// consumer (several processes may share it), one request at a time per
/// agent. What the fast path cannot settle is put to the `classifier`
/// role's model when there is one (through the gateway, in-process), with
/// the request kept alive meanwhile.
pub async fn run(ctx: Context<Config>) -> anyhow::Result<()> {
    let models = &ctx.config.models;
    let model = if models.roles.contains_key(&Role::Classifier) {
        Some(Gateway::new(models.clone(), ctx.bus.clone())?)
    } else {
        None
    };
    let handlers = ctx.every_agent(Classify {
        bus: ctx.bus.clone(),
        policy: ctx.config.policy.clone(),
        model,
    });
    let intake = Intake {
        consumer: ConsumerSpec::CLASSIFIER,
        in_flight: 1,
    };
    nisse_bus::serve(&ctx, intake, handlers).await?;
    Ok(())
}

/// The handler: one verdict per request.
struct Classify {
    bus: Bus,
    policy: Arc<Policy>,
    model: Option<Gateway>,
}

impl Handler<ClassifyRequest> for Classify {
    async fn handle(
        &self,
        agent: &AgentName,
        delivery: &Delivery<ClassifyRequest>,
    ) -> Result<(), Unhandled> {
        let request = delivery.message();
        let switches = self
            .bus
            .switches()
            .await
            .map(|s| s.board)
            .map_err(|e| e.to_string());
        let mut verdict = decide(&self.policy, request, switches);
        if let Some(gateway) = &self.model
            && model::wanted(&verdict)
        {
            verdict = model::ask(gateway, agent, request, verdict).await;
        }
        tracing::info!(
            parent: delivery.span(),
            request = %request.request_id,
            work_item = %request.envelope.as_ref().map_or("", |e| e.work_item_id.as_str()),
            verdict = ?proto::Verdict::try_from(verdict.verdict).unwrap_or_default(),
            decided_by = ?DecidedBy::try_from(verdict.decided_by).unwrap_or_default(),
            model = %verdict.model,
            "classified"
        );
        self.bus
            .publish(verdict)
            .await
            .map_err(|e| Unhandled::retry(format!("publishing the verdict: {e}")))?;
        Ok(())
    }
}

/// The verdict for `request`, given the switch board as read (or why it
/// could not be read). Pure: the same inputs give the same verdict.
pub fn decide(
    policy: &Policy,
    request: &ClassifyRequest,
    switches: Result<SwitchBoard, String>,
) -> ClassifyVerdict {
    let mut verdict = ClassifyVerdict {
        envelope: Some(reply_envelope(request)),
        request_id: request.request_id.clone(),
        ..Default::default()
    };
    // The class stays what the policy assessed, when it got that far: a
    // fail-closed verdict says "needs discussion", not "this reads".
    let fail_closed = |mut v: ClassifyVerdict, reason: String| {
        v.verdict = proto::Verdict::DangerousNeedsDiscussion as i32;
        v.decided_by = DecidedBy::FailClosed as i32;
        if v.action_class == proto::ActionClass::Unspecified as i32 {
            v.action_class = proto::ActionClass::ActionClass3 as i32;
        }
        v.reasons.push(reason);
        v
    };
    let Some(proposed) = &request.action else {
        return fail_closed(verdict, "the request carries no action".into());
    };
    let action = match Action::from_wire(proposed) {
        Ok(a) => a,
        Err(e) => return fail_closed(verdict, e.0),
    };
    let declared = nisse_policy::wire::risk_from_wire(proposed.declared_risk);
    let assessment = policy.assess(&action, declared);
    // What was judged, for the services that carry a request out to check
    // it is about their request's action, and under which approvals.
    verdict.action = Some(action.to_wire(declared));

    verdict.action_class = proto::ActionClass::from(assessment.class) as i32;
    verdict.risk_class = proto::RiskClass::from(assessment.risk) as i32;
    verdict.targets = assessment.targets.clone();
    verdict.protected = assessment.protected.clone();
    verdict.on_agent_host = assessment.on_agent_host;
    verdict.takes_agent_host_down = assessment.takes_agent_host_down;
    verdict.matched_rules.push(assessment.rule.clone());
    if let Some(shell) = &assessment.shell {
        for f in &shell.commands {
            if !verdict.matched_rules.contains(&f.rule) {
                verdict.matched_rules.push(f.rule.clone());
            }
            verdict.commands.push(proto::CommandFinding {
                command: f.command.clone(),
                via: f.via.clone(),
                risk: proto::RiskClass::from(f.risk) as i32,
                rule: f.rule.clone(),
                reason: f.reason.clone(),
            });
        }
    }

    let scope = request.scope.clone().unwrap_or_default();
    let steps: Vec<Step> = scope
        .approved_steps
        .iter()
        .filter_map(|s| {
            Action::from_json(&s.tool, &s.target, &s.arguments_json)
                .ok()
                .map(|action| Step {
                    action,
                    precondition: None,
                    expected: None,
                    retries: s.retries,
                })
        })
        .collect();
    // A plan with a step that does not parse is no plan: nothing in it can
    // be matched exactly.
    let plan = (scope.approved_plan_revision > 0 && steps.len() == scope.approved_steps.len())
        .then_some(nisse_policy::gate::ApprovedPlan {
            revision: scope.approved_plan_revision,
            steps: &steps,
            done: scope.next_step as usize,
        });
    verdict.scope = Some(judged_scope(&action, &assessment.targets, plan, &scope));

    let board = match switches {
        Ok(b) => b,
        Err(e) => {
            verdict.switches = Some(Switches::from_wire(None).to_wire());
            let mut v = fail_closed(verdict, format!("the kill switches could not be read: {e}"));
            v.reasons.extend(assessment.reasons);
            return v;
        }
    };
    // The switches that hold for this action: the policy file's `never`
    // targets and the board's.
    let switches = Switches::for_action(
        board.autonomy_off,
        board.never.iter().map(|(target, entry)| {
            (
                target.as_str(),
                format!("{} (set by {})", entry.reason, entry.set_by),
            )
        }),
        &assessment,
    );
    verdict.switches = Some(switches.to_wire());

    // Secrets the action asks for must each be granted to it by the
    // policy; no model and no approval can widen that.
    let secrets = match action.secrets() {
        Ok(s) => s,
        Err(e) => return fail_closed(verdict, e.0),
    };
    for name in &secrets {
        if let Err(refusal) = policy.secret_grant(&action, name) {
            let mut v = fail_closed(verdict, refusal.to_string());
            v.reasons.extend(assessment.reasons);
            return v;
        }
    }

    let decided = fast_path(
        &action,
        &assessment,
        &switches,
        Scope {
            plan,
            operator_confirmed: scope.operator_confirmed,
            contained: &scope.contained_targets,
        },
    );
    match decided {
        Some(fast) => {
            verdict.verdict = proto::Verdict::from(fast.verdict) as i32;
            verdict.decided_by = if fast.by_switch {
                DecidedBy::KillSwitch
            } else {
                DecidedBy::FastPath
            } as i32;
            verdict.reasons = fast.reasons;
        }
        None => {
            verdict.verdict = proto::Verdict::from(Verdict::NeedsDiscussion) as i32;
            verdict.decided_by = DecidedBy::NoModel as i32;
            verdict.reasons.push(NO_MODEL_REASON.into());
        }
    }
    verdict.reasons.extend(assessment.reasons);
    verdict
}

/// What the agreed scope says about `action` (naming `targets`): the
/// approved revision, the step of it the action is (the next unfinished
/// one, matched exactly, as the brain's permit matches it), whether the
/// operator confirmed it, and whether the scope contains class 2 on every
/// target it names. The services that carry a request out check the
/// approvals it claims against this, not against the brain's word.
fn judged_scope(
    action: &Action,
    targets: &[String],
    plan: Option<nisse_policy::gate::ApprovedPlan<'_>>,
    scope: &proto::AgreedScope,
) -> proto::JudgedScope {
    let plan_step = plan.and_then(
        |p| match nisse_policy::match_call(p.steps, p.done, action) {
            nisse_policy::StepMatch::Next(i) => u32::try_from(i).ok(),
            _ => None,
        },
    );
    proto::JudgedScope {
        plan_revision: plan.map_or(0, |p| p.revision),
        plan_step,
        operator_confirmed: scope.operator_confirmed,
        contained: !targets.is_empty()
            && targets.iter().all(|t| scope.contained_targets.contains(t)),
    }
}

/// The verdict's envelope: the request's agent and work item, the
/// classifier as actor, and an id derived from the request id, so a
/// redelivered request republishes the same id and JetStream drops it.
fn reply_envelope(request: &ClassifyRequest) -> Envelope {
    SERVICE.reply_to(
        request.envelope.as_ref(),
        format!("verdict:{}", request.request_id),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use nisse_bus::NeverEntry;

    fn request(command: &str, scope: Option<proto::AgreedScope>) -> ClassifyRequest {
        ClassifyRequest {
            envelope: Some(Envelope {
                agent: "ops".into(),
                work_item_id: "item-1".into(),
                message_id: "classify:item-1:r1:s0".into(),
                ..Default::default()
            }),
            request_id: "item-1:r1:s0".into(),
            action: Some(Action::shell("web1", command).to_wire(None)),
            scope,
            model: String::new(),
        }
    }

    fn scope(steps: &[&str], next: u32) -> proto::AgreedScope {
        proto::AgreedScope {
            work_item_id: "item-1".into(),
            task: String::new(),
            approved_plan_revision: 2,
            approved_steps: steps
                .iter()
                .map(|c| {
                    let a = Action::shell("web1", c);
                    proto::PlanStep {
                        tool: a.tool,
                        target: a.target,
                        arguments_json: a.arguments,
                        retries: 1,
                        ..Default::default()
                    }
                })
                .collect(),
            next_step: next,
            operator_confirmed: false,
            contained_targets: Vec::new(),
        }
    }

    fn verdict_of(v: &ClassifyVerdict) -> (proto::Verdict, DecidedBy) {
        (
            proto::Verdict::try_from(v.verdict).unwrap(),
            DecidedBy::try_from(v.decided_by).unwrap(),
        )
    }

    #[test]
    fn read_only_is_safe_by_the_fast_path() {
        let policy = Policy::builtin().unwrap();
        let v = decide(
            &policy,
            &request("systemctl status caddy", None),
            Ok(SwitchBoard::default()),
        );
        assert_eq!(verdict_of(&v), (proto::Verdict::Safe, DecidedBy::FastPath));
        assert_eq!(v.envelope.unwrap().message_id, "verdict:item-1:r1:s0");
        assert_eq!(v.commands.len(), 1);
        assert_eq!(v.commands[0].rule, "systemctl.read");
    }

    #[test]
    fn the_next_approved_step_is_in_scope_and_others_need_discussion() {
        let policy = Policy::builtin().unwrap();
        let steps = ["systemctl restart caddy", "systemctl restart nginx"];
        let v = decide(
            &policy,
            &request("systemctl restart caddy", Some(scope(&steps, 0))),
            Ok(SwitchBoard::default()),
        );
        assert_eq!(
            verdict_of(&v),
            (proto::Verdict::DangerousInScope, DecidedBy::FastPath)
        );
        let v = decide(
            &policy,
            &request("systemctl restart nginx", Some(scope(&steps, 0))),
            Ok(SwitchBoard::default()),
        );
        assert_eq!(
            verdict_of(&v),
            (proto::Verdict::DangerousNeedsDiscussion, DecidedBy::NoModel)
        );
    }

    #[test]
    fn a_verdict_says_what_it_judged_and_under_which_approvals() {
        let policy = Policy::builtin().unwrap();
        let steps = ["systemctl restart caddy", "systemctl restart nginx"];
        let v = decide(
            &policy,
            &request("systemctl restart caddy", Some(scope(&steps, 0))),
            Ok(SwitchBoard::default()),
        );
        assert_eq!(
            v.action,
            Some(Action::shell("web1", "systemctl restart caddy").to_wire(None))
        );
        assert_eq!(
            v.scope,
            Some(proto::JudgedScope {
                plan_revision: 2,
                plan_step: Some(0),
                operator_confirmed: false,
                contained: false,
            })
        );
        // Under the plan, but not its next step.
        let v = decide(
            &policy,
            &request("systemctl restart nginx", Some(scope(&steps, 0))),
            Ok(SwitchBoard::default()),
        );
        assert_eq!(
            v.scope,
            Some(proto::JudgedScope {
                plan_revision: 2,
                plan_step: None,
                ..Default::default()
            })
        );
        // The operator's confirmation, as the scope says it.
        let mut confirmed = scope(&steps, 1);
        confirmed.operator_confirmed = true;
        let v = decide(
            &policy,
            &request("systemctl restart nginx", Some(confirmed)),
            Ok(SwitchBoard::default()),
        );
        assert_eq!(
            v.scope,
            Some(proto::JudgedScope {
                plan_revision: 2,
                plan_step: Some(1),
                operator_confirmed: true,
                contained: false,
            })
        );
        // No scope at all: no approval.
        let v = decide(
            &policy,
            &request("uptime", None),
            Ok(SwitchBoard::default()),
        );
        assert_eq!(v.scope, Some(proto::JudgedScope::default()));
    }

    #[test]
    fn switches_and_errors_fail_closed() {
        let policy = Policy::builtin().unwrap();
        let steps = ["systemctl restart caddy"];
        let off = SwitchBoard {
            autonomy_off: true,
            ..Default::default()
        };
        let v = decide(
            &policy,
            &request("systemctl restart caddy", Some(scope(&steps, 0))),
            Ok(off.clone()),
        );
        assert_eq!(
            verdict_of(&v),
            (
                proto::Verdict::DangerousNeedsDiscussion,
                DecidedBy::KillSwitch
            )
        );
        assert!(v.switches.unwrap().autonomy_off);
        // Reading stays safe with autonomy off.
        let v = decide(&policy, &request("uptime", None), Ok(off));
        assert_eq!(verdict_of(&v).0, proto::Verdict::Safe);

        let mut never = SwitchBoard::default();
        never.never.insert(
            "web1".into(),
            NeverEntry {
                reason: "production".into(),
                set_by: "cli:op".into(),
            },
        );
        let v = decide(
            &policy,
            &request("systemctl restart caddy", Some(scope(&steps, 0))),
            Ok(never),
        );
        assert_eq!(verdict_of(&v).1, DecidedBy::KillSwitch);
        assert_eq!(v.switches.unwrap().never[0].target, "web1");

        let v = decide(&policy, &request("uptime", None), Err("bucket gone".into()));
        assert_eq!(
            verdict_of(&v),
            (
                proto::Verdict::DangerousNeedsDiscussion,
                DecidedBy::FailClosed
            )
        );
        // Still failed closed, but it says what the command is.
        assert_eq!(v.action_class, proto::ActionClass::ActionClass1 as i32);
        let mut bad = request("uptime", None);
        bad.action.as_mut().unwrap().arguments_json = "{oops".into();
        let v = decide(&policy, &bad, Ok(SwitchBoard::default()));
        assert_eq!(verdict_of(&v).1, DecidedBy::FailClosed);
        let mut none = request("uptime", None);
        none.action = None;
        assert_eq!(
            verdict_of(&decide(&policy, &none, Ok(SwitchBoard::default()))).1,
            DecidedBy::FailClosed
        );
    }

    #[test]
    fn class_2_on_the_items_build_host_is_in_scope_and_class_3_is_not() {
        let policy = Policy::builtin()
            .unwrap()
            .with_build_hosts(vec![nisse_policy::BuildHost {
                name: "build-1".into(),
                project: "ops/app".into(),
                workspace: "/srv/work/app".into(),
                test_commands: vec!["make test".into()],
                git: None,
            }])
            .unwrap();
        let on_build_host = |command: &str, contained: &[&str]| {
            let mut r = request(
                command,
                Some(proto::AgreedScope {
                    work_item_id: "item-1".into(),
                    contained_targets: contained.iter().map(|t| t.to_string()).collect(),
                    ..Default::default()
                }),
            );
            r.action = Some(Action::shell("build-1", command).to_wire(None));
            decide(&policy, &r, Ok(SwitchBoard::default()))
        };
        let v = on_build_host("sed -i s/a/b/ src/main.c", &["build-1"]);
        assert_eq!(verdict_of(&v), (proto::Verdict::Safe, DecidedBy::FastPath));
        assert_eq!(v.action_class, proto::ActionClass::ActionClass2 as i32);
        assert!(v.scope.unwrap().contained, "{:?}", v.scope);
        assert!(v.reasons[0].contains("class 2 in scope"), "{:?}", v.reasons);
        assert_eq!(v.matched_rules[0], "dev.build-host.contained");
        // Not in the agreed scope: nothing settles it.
        let v = on_build_host("sed -i s/a/b/ src/main.c", &[]);
        assert!(!v.scope.unwrap().contained, "{:?}", v.scope);
        assert_eq!(
            verdict_of(&v),
            (proto::Verdict::DangerousNeedsDiscussion, DecidedBy::NoModel)
        );
        // Class 3 is never in scope by the build host.
        let v = on_build_host("git push origin HEAD", &["build-1"]);
        assert_eq!(
            verdict_of(&v),
            (proto::Verdict::DangerousNeedsDiscussion, DecidedBy::NoModel)
        );
        assert_eq!(v.matched_rules[0], "dev.push");
        // The declared tests are class 1 there.
        let v = on_build_host("cd /srv/work/app && make test", &[]);
        assert_eq!(verdict_of(&v), (proto::Verdict::Safe, DecidedBy::FastPath));
        // Autonomy off stops class 2 in scope.
        let mut r = request(
            "sed -i s/a/b/ src/main.c",
            Some(proto::AgreedScope {
                contained_targets: vec!["build-1".into()],
                ..Default::default()
            }),
        );
        r.action = Some(Action::shell("build-1", "sed -i s/a/b/ src/main.c").to_wire(None));
        let off = SwitchBoard {
            autonomy_off: true,
            ..Default::default()
        };
        assert_eq!(
            verdict_of(&decide(&policy, &r, Ok(off))),
            (
                proto::Verdict::DangerousNeedsDiscussion,
                DecidedBy::KillSwitch
            )
        );
    }
}
