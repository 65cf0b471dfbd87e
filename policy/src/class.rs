//! The two ways of saying how dangerous an action is, and how they relate.
//!
//! Risk classes (Oikos REQ-DEC-1) describe what an action does to the world;
//! action classes (Nisse P3) say what the agent must do before running it.
//! Risk is what the classifiers compute; the action class follows from it
//! by [`RiskClass::action_class`], and scope (an approved step, a protected
//! target) can only move an action up, never down.

use serde::{Deserialize, Serialize};

/// What an action does to the world, from harmless to irreversible. Ordered:
/// `max` of two risks is the riskier.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RiskClass {
    /// Observes only.
    ReadOnly,
    /// Changes something contained, with a trivial undo (scratch files, a
    /// snapshot).
    ReversibleLow,
    /// Changes system or service state; an undo exists but takes work.
    ConfigMutation,
    /// Irreversible, loses data, or can take a host or the network down.
    Destructive,
}

impl RiskClass {
    /// Every risk class, lowest first.
    pub const ALL: [Self; 4] = [
        Self::ReadOnly,
        Self::ReversibleLow,
        Self::ConfigMutation,
        Self::Destructive,
    ];

    /// The name used in policy files, the CLI and the log.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ReadOnly => "read_only",
            Self::ReversibleLow => "reversible_low",
            Self::ConfigMutation => "config_mutation",
            Self::Destructive => "destructive",
        }
    }

    /// The action class of an action of this risk, before scope is
    /// considered: read-only is class 1, a contained change with a trivial
    /// undo is class 2, everything else is class 3 (for ops, O3: every other
    /// infrastructure write is dangerous).
    pub fn action_class(self) -> ActionClass {
        match self {
            Self::ReadOnly => ActionClass::NoSideEffects,
            Self::ReversibleLow => ActionClass::Contained,
            Self::ConfigMutation | Self::Destructive => ActionClass::Dangerous,
        }
    }

    /// Whether the action cannot be undone (flagged at the top of an
    /// approval request).
    pub fn is_irreversible(self) -> bool {
        self == Self::Destructive
    }
}

impl std::fmt::Display for RiskClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for RiskClass {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let wanted = s.trim().replace('-', "_");
        Self::ALL
            .into_iter()
            .find(|r| r.as_str() == wanted)
            .ok_or_else(|| {
                format!(
                    "`{s}` is not a risk class (expected one of read_only, reversible_low, config_mutation, destructive)"
                )
            })
    }
}

/// What the agent must do before an action (Nisse P3). Ordered: class 3 is
/// the strictest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum ActionClass {
    /// Class 1: no side effects. Always allowed.
    NoSideEffects,
    /// Class 2: contained side effects. Allowed when in scope; logged.
    Contained,
    /// Class 3: dangerous. Needs discussion unless an approved step sequence
    /// or the operator in conversation names the exact action.
    Dangerous,
}

impl ActionClass {
    /// The class's number, as the seeds write it.
    pub fn number(self) -> u8 {
        match self {
            Self::NoSideEffects => 1,
            Self::Contained => 2,
            Self::Dangerous => 3,
        }
    }
}

impl std::fmt::Display for ActionClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "class {}", self.number())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mapping_is_monotonic_and_total() {
        let mut last = ActionClass::NoSideEffects;
        for risk in RiskClass::ALL {
            let class = risk.action_class();
            assert!(class >= last, "{risk} maps below a lower risk");
            last = class;
        }
        assert_eq!(RiskClass::ReadOnly.action_class().number(), 1);
        assert_eq!(RiskClass::ReversibleLow.action_class().number(), 2);
        assert_eq!(RiskClass::ConfigMutation.action_class().number(), 3);
        assert_eq!(RiskClass::Destructive.action_class().number(), 3);
    }

    #[test]
    fn names_round_trip() {
        for risk in RiskClass::ALL {
            assert_eq!(risk.as_str().parse::<RiskClass>(), Ok(risk));
        }
        assert!(
            "harmless"
                .parse::<RiskClass>()
                .unwrap_err()
                .contains("harmless")
        );
        assert_eq!("config-mutation".parse(), Ok(RiskClass::ConfigMutation));
    }
}
