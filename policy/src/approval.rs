//! Approval binding (Nisse L3): which plan revision an operator's approval
//! or denial lands on, if any.
//!
//! Every revision has a work-item-wide tag `rev-N`. A reply that names no
//! revision is about the one that was up (whose approval request had been
//! sent) when it arrived. If that is not the current revision, it is not
//! applied and the operator is told which one is up. So a repeated
//! approval, an approval on a second channel, or a late one never lands on
//! the next revision.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Where the item's latest revision stands, as binding needs to know it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum RevisionState {
    /// Proposed; its approval request has not been sent yet (it is being
    /// classified).
    Proposed,
    /// Its approval request was sent at `since` (Unix nanoseconds).
    Up {
        /// When the request was sent.
        since: i64,
    },
    /// Approved.
    Approved {
        /// By whom.
        by: String,
    },
    /// Denied, run to its end, halted or abandoned: no longer open to a
    /// decision.
    Decided,
}

/// The item's plan revisions, as binding needs to know them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanView {
    /// The latest revision and its state; `None` before any plan.
    pub current: Option<(u32, RevisionState)>,
    /// The revision whose approval request was sent last, if any.
    pub last_put_up: Option<u32>,
}

/// An operator's approval or denial, as it arrived.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reply {
    /// The revision it names (`approve rev-3`), if any.
    pub names: Option<u32>,
    /// Whether the approval source found the sender on its operator
    /// allowlist.
    pub allowed: bool,
    /// When it arrived (Unix nanoseconds).
    pub at: i64,
}

/// Where a reply lands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Binding {
    /// On this revision: apply it.
    Apply(u32),
    /// The sender is not on the allowlist: recorded as data, never applied.
    NotAllowed,
    /// No plan has been put up for approval.
    NothingUp,
    /// It is about `named`, but `current` is the revision up now.
    NotCurrent {
        /// The revision the reply is about (named or stamped).
        named: u32,
        /// The current revision.
        current: u32,
    },
    /// The revision exists but its approval request has not been sent yet.
    NotYetUp(u32),
    /// The revision was already approved (by `by`); nothing changes.
    AlreadyApproved {
        /// The revision.
        revision: u32,
        /// Who approved it.
        by: String,
    },
    /// The revision is no longer open to a decision.
    AlreadyDecided(u32),
    /// The approval request is older than the expiry window: the plan must
    /// be put up again.
    Expired(u32),
}

/// Binds a reply to a revision.
pub fn bind(view: &PlanView, reply: &Reply, expiry: Duration) -> Binding {
    if !reply.allowed {
        return Binding::NotAllowed;
    }
    let Some((current, state)) = &view.current else {
        return Binding::NothingUp;
    };
    // A bare reply is stamped with the revision last put up.
    let Some(named) = reply.names.or(view.last_put_up) else {
        return Binding::NothingUp;
    };
    // With `mutant-binding`, a deliberately broken rule (a reply about
    // another revision lands on the current one), compiled only into the
    // test build that shows the replay of the Quint model catches it.
    if named != *current && !cfg!(feature = "mutant-binding") {
        return Binding::NotCurrent {
            named,
            current: *current,
        };
    }
    match state {
        RevisionState::Proposed => Binding::NotYetUp(named),
        RevisionState::Approved { by } => Binding::AlreadyApproved {
            revision: named,
            by: by.clone(),
        },
        RevisionState::Decided => Binding::AlreadyDecided(named),
        RevisionState::Up { since } => {
            let age = i128::from(reply.at) - i128::from(*since);
            if age > expiry.as_nanos() as i128 {
                Binding::Expired(named)
            } else {
                Binding::Apply(named)
            }
        }
    }
}

/// Whether an approval given at `approved_at` still lets a plan start at
/// `now` (a plan not started within the window must be approved again).
pub fn approval_current(approved_at: i64, now: i64, expiry: Duration) -> bool {
    i128::from(now) - i128::from(approved_at) <= expiry.as_nanos() as i128
}

/// Parses a revision tag: `rev-3`, `REV-3`, `3`.
pub fn parse_revision(text: &str) -> Option<u32> {
    let t = text.trim().to_ascii_lowercase();
    let digits = t
        .strip_prefix("rev-")
        .or_else(|| t.strip_prefix("rev"))
        .unwrap_or(&t);
    digits.parse().ok().filter(|n| *n > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOUR: Duration = Duration::from_secs(3600);
    const S: i64 = 1_000_000_000;

    fn reply(names: Option<u32>, at: i64) -> Reply {
        Reply {
            names,
            allowed: true,
            at,
        }
    }

    #[test]
    fn a_bare_approval_is_stamped_with_the_revision_up() {
        let view = PlanView {
            current: Some((2, RevisionState::Up { since: 10 * S })),
            last_put_up: Some(2),
        };
        assert_eq!(bind(&view, &reply(None, 20 * S), HOUR), Binding::Apply(2));
        assert_eq!(
            bind(&view, &reply(Some(2), 20 * S), HOUR),
            Binding::Apply(2)
        );
    }

    #[test]
    fn an_approval_of_an_older_revision_does_not_land_on_the_new_one() {
        // rev-2 proposed while rev-1 was up: a bare approval is about rev-1.
        let view = PlanView {
            current: Some((2, RevisionState::Proposed)),
            last_put_up: Some(1),
        };
        assert_eq!(
            bind(&view, &reply(None, 20 * S), HOUR),
            Binding::NotCurrent {
                named: 1,
                current: 2
            }
        );
        assert_eq!(
            bind(&view, &reply(Some(1), 20 * S), HOUR),
            Binding::NotCurrent {
                named: 1,
                current: 2
            }
        );
        assert_eq!(
            bind(&view, &reply(Some(2), 20 * S), HOUR),
            Binding::NotYetUp(2)
        );
    }

    #[test]
    fn repeats_expiry_and_strangers() {
        let approved = PlanView {
            current: Some((
                3,
                RevisionState::Approved {
                    by: "cli:op".into(),
                },
            )),
            last_put_up: Some(3),
        };
        assert_eq!(
            bind(&approved, &reply(None, 0), HOUR),
            Binding::AlreadyApproved {
                revision: 3,
                by: "cli:op".into()
            }
        );
        let up = PlanView {
            current: Some((3, RevisionState::Up { since: 0 })),
            last_put_up: Some(3),
        };
        assert_eq!(bind(&up, &reply(None, 3601 * S), HOUR), Binding::Expired(3));
        let stranger = Reply {
            names: Some(3),
            allowed: false,
            at: 0,
        };
        assert_eq!(bind(&up, &stranger, HOUR), Binding::NotAllowed);
        let none = PlanView {
            current: None,
            last_put_up: None,
        };
        assert_eq!(bind(&none, &reply(None, 0), HOUR), Binding::NothingUp);
    }

    #[test]
    fn revision_tags_parse() {
        assert_eq!(parse_revision("rev-3"), Some(3));
        assert_eq!(parse_revision(" REV-12 "), Some(12));
        assert_eq!(parse_revision("7"), Some(7));
        assert_eq!(parse_revision("rev-0"), None);
        assert_eq!(parse_revision("latest"), None);
    }
}
