//! Conversions between the policy's types and the bus contracts, so every
//! service and brain reads a verdict the same way.

use nisse_proto::v1 as proto;

use crate::switches::{Autonomy, Never, Switches};
use crate::{Action, ActionClass, ActionError, RiskClass, Verdict};

impl From<RiskClass> for proto::RiskClass {
    fn from(r: RiskClass) -> Self {
        match r {
            RiskClass::ReadOnly => Self::ReadOnly,
            RiskClass::ReversibleLow => Self::ReversibleLow,
            RiskClass::ConfigMutation => Self::ConfigMutation,
            RiskClass::Destructive => Self::Destructive,
        }
    }
}

/// A risk class from the wire; `None` for unspecified or unknown values.
pub fn risk_from_wire(value: i32) -> Option<RiskClass> {
    match proto::RiskClass::try_from(value).ok()? {
        proto::RiskClass::Unspecified => None,
        proto::RiskClass::ReadOnly => Some(RiskClass::ReadOnly),
        proto::RiskClass::ReversibleLow => Some(RiskClass::ReversibleLow),
        proto::RiskClass::ConfigMutation => Some(RiskClass::ConfigMutation),
        proto::RiskClass::Destructive => Some(RiskClass::Destructive),
    }
}

impl From<ActionClass> for proto::ActionClass {
    fn from(c: ActionClass) -> Self {
        match c {
            ActionClass::NoSideEffects => Self::ActionClass1,
            ActionClass::Contained => Self::ActionClass2,
            ActionClass::Dangerous => Self::ActionClass3,
        }
    }
}

/// An action class from the wire; unknown values are class 3.
pub fn class_from_wire(value: i32) -> ActionClass {
    match proto::ActionClass::try_from(value) {
        Ok(proto::ActionClass::ActionClass1) => ActionClass::NoSideEffects,
        Ok(proto::ActionClass::ActionClass2) => ActionClass::Contained,
        _ => ActionClass::Dangerous,
    }
}

impl From<Verdict> for proto::Verdict {
    fn from(v: Verdict) -> Self {
        match v {
            Verdict::Safe => Self::Safe,
            Verdict::DangerousInScope => Self::DangerousInScope,
            Verdict::NeedsDiscussion => Self::DangerousNeedsDiscussion,
        }
    }
}

/// A verdict from the wire; anything unclear needs discussion (fail closed).
pub fn verdict_from_wire(value: i32) -> Verdict {
    match proto::Verdict::try_from(value) {
        Ok(proto::Verdict::Safe) => Verdict::Safe,
        Ok(proto::Verdict::DangerousInScope) => Verdict::DangerousInScope,
        _ => Verdict::NeedsDiscussion,
    }
}

impl Switches {
    /// The reading a verdict carried; a missing reading is the strictest
    /// one (autonomy off), so a verdict without it never widens anything.
    pub fn from_wire(reading: Option<&proto::SwitchReading>) -> Self {
        match reading {
            None => Self {
                autonomy: Autonomy::Off,
                never: Vec::new(),
            },
            Some(r) => Self {
                autonomy: if r.autonomy_off {
                    Autonomy::Off
                } else {
                    Autonomy::On
                },
                never: r
                    .never
                    .iter()
                    .map(|n| Never {
                        target: n.target.clone(),
                        reason: n.reason.clone(),
                    })
                    .collect(),
            },
        }
    }

    /// The reading to carry on the wire.
    pub fn to_wire(&self) -> proto::SwitchReading {
        proto::SwitchReading {
            autonomy_off: self.autonomy == Autonomy::Off,
            never: self
                .never
                .iter()
                .map(|n| proto::NeverSwitch {
                    target: n.target.clone(),
                    reason: n.reason.clone(),
                })
                .collect(),
        }
    }
}

impl Action {
    /// The action a classify request proposes. When the request also
    /// carries the command line, it must be the action's `command`
    /// argument: two versions of one command are refused, not guessed at.
    pub fn from_wire(action: &proto::ProposedAction) -> Result<Self, ActionError> {
        let built = Self::from_json(&action.tool, &action.target, &action.arguments_json)?;
        if !action.command.is_empty()
            && built.argument_str("command").as_deref() != Some(action.command.trim())
        {
            return Err(ActionError(format!(
                "the `{}` action's command line and its `command` argument differ",
                action.tool
            )));
        }
        Ok(built)
    }

    /// The action as a classify request carries it.
    pub fn to_wire(&self, declared: Option<RiskClass>) -> proto::ProposedAction {
        proto::ProposedAction {
            tool: self.tool.clone(),
            target: self.target.clone(),
            command: self.argument_str("command").unwrap_or_default(),
            arguments_json: self.arguments.clone(),
            declared_risk: declared.map_or(proto::RiskClass::Unspecified, Into::into) as i32,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unclear_wire_values_are_strict() {
        assert_eq!(verdict_from_wire(0), Verdict::NeedsDiscussion);
        assert_eq!(verdict_from_wire(99), Verdict::NeedsDiscussion);
        assert_eq!(class_from_wire(0), ActionClass::Dangerous);
        assert_eq!(risk_from_wire(0), None);
        assert_eq!(Switches::from_wire(None).autonomy, Autonomy::Off);
    }

    #[test]
    fn actions_round_trip() {
        let a = Action::shell("web1", "systemctl restart caddy");
        let wire = a.to_wire(Some(RiskClass::ConfigMutation));
        assert_eq!(wire.command, "systemctl restart caddy");
        assert_eq!(Action::from_wire(&wire).unwrap(), a);
        let mut forged = wire.clone();
        forged.command = "systemctl status caddy".into();
        assert!(Action::from_wire(&forged).is_err());
    }
}

impl crate::FileOp {
    /// The operation as it travels in an execution request.
    pub fn to_wire(&self) -> proto::FileOperation {
        let (op, content, mode) = match self {
            Self::Read { .. } => (proto::FileOp::Read, Vec::new(), String::new()),
            Self::List { .. } => (proto::FileOp::List, Vec::new(), String::new()),
            Self::Write { content, mode, .. } => (
                proto::FileOp::Write,
                content.clone().into_bytes(),
                mode.clone().unwrap_or_default(),
            ),
        };
        proto::FileOperation {
            op: op as i32,
            path: self.path().to_string(),
            content,
            mode,
        }
    }

    /// The operation an execution request carries, checked as a plan's
    /// would be (an executor trusts nothing it is sent).
    pub fn from_wire(file: &proto::FileOperation) -> Result<Self, ActionError> {
        let path = file.path.clone();
        let op = match proto::FileOp::try_from(file.op) {
            Ok(proto::FileOp::Read) => Self::Read { path },
            Ok(proto::FileOp::List) => Self::List { path },
            Ok(proto::FileOp::Write) => Self::Write {
                path,
                content: String::from_utf8(file.content.clone())
                    .map_err(|_| ActionError("a file write's content is not UTF-8 text".into()))?,
                mode: (!file.mode.is_empty()).then(|| file.mode.clone()),
            },
            _ => return Err(ActionError("a file operation of no known kind".into())),
        };
        // Checked as a plan's step would be: the executor trusts nothing
        // it is sent.
        Self::from_action(&op.to_action("-")?)?
            .ok_or_else(|| ActionError("not a file operation".into()))
    }
}

#[cfg(test)]
mod file_tests {
    use crate::FileOp;

    #[test]
    fn file_operations_round_trip_the_wire() {
        for op in [
            FileOp::Read {
                path: "/etc/hosts".into(),
            },
            FileOp::List {
                path: "/srv".into(),
            },
            FileOp::Write {
                path: "/etc/motd".into(),
                content: "hello\n".into(),
                mode: Some("0644".into()),
            },
            FileOp::Write {
                path: "/etc/motd".into(),
                content: String::new(),
                mode: None,
            },
        ] {
            assert_eq!(FileOp::from_wire(&op.to_wire()).unwrap(), op);
        }
        let mut bad = FileOp::Read { path: "/x".into() }.to_wire();
        bad.path = "relative".into();
        assert!(FileOp::from_wire(&bad).unwrap_err().0.contains("absolute"));
    }
}
