//! What an operator's chat message says, read by code (seed L5, L3): a
//! command from a small fixed vocabulary, a question, a message addressed
//! to someone else, or talk. No model ever decides that a message is an
//! approval; a question is never one, however it is worded.
//!
//! Commands (`status`, `stop`, `retry`, `park`, `abandon [note]`,
//! `approve [rev-N] [#N step M]`, `deny [rev-N] [reason]`, `use
//! <project>`, `do #N next`) are matched whatever their case, surrounding whitespace,
//! trailing punctuation (`.` `!`), and a leading mention of the agent
//! (`@nisse-ops:example.org`, `nisse-ops:`, `Ops,`).

use nisse_policy::approval::parse_revision;

/// A command from the vocabulary (L5). It works in every state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// Show where things stand.
    Status,
    /// Stop the item's work at the next step boundary.
    Stop,
    /// Give the item up, closing it (with the rest as a note).
    Abandon(String),
    /// Approve the revision named, or the one up, with its destructive
    /// steps named back when the operator typed them (`#14 step 2`).
    Approve(Option<u32>, Option<String>),
    /// Deny the revision named, or the one up, with the rest as reason.
    Deny(Option<u32>, String),
    /// Work in this project from now on.
    Use(String),
    /// Take item #N next.
    DoNext(u64),
    /// Go on with what timed out: requests that went unanswered past their
    /// deadline.
    Retry,
    /// Put the item being worked on aside and take up the next one; it
    /// keeps its place in the queue.
    Park,
}

/// What a message says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Said {
    /// A command.
    Command(Command),
    /// A question: answered, never acted on.
    Question,
    /// Something to keep in the agent's memory, word for word (an
    /// operator's correction or preference): `remember: …`, `remember
    /// that …`, `correction: …`.
    Remember,
    /// Addressed to someone else: not for the agent.
    ForSomeoneElse(String),
    /// Anything else: recorded, and an answer to a waiting question.
    Talk,
}

impl Said {
    /// How the message was read, as the log's `said` events record it.
    pub fn read_as(&self) -> &'static str {
        match self {
            Said::Command(_) => "command",
            Said::Question => "question",
            Said::Remember => "remember",
            Said::ForSomeoneElse(_) => "for-someone-else",
            Said::Talk => "talk",
        }
    }
}

/// Reads `text`, a message in the agent's room. `names` are the ways the
/// agent may be addressed (its Matrix user id, localpart, display name,
/// agent name), compared without case.
pub fn read(text: &str, names: &[&str]) -> Said {
    let mut rest = text.trim();
    if is_remember(rest) {
        return Said::Remember;
    }
    if let Some((addressee, after, sure)) = leading_address(rest) {
        if names
            .iter()
            .any(|n| !n.is_empty() && addressee.eq_ignore_ascii_case(n.trim_start_matches('@')))
        {
            rest = after;
        } else if sure {
            return Said::ForSomeoneElse(addressee.to_string());
        }
    }
    let rest = rest.trim();
    if is_remember(rest) {
        return Said::Remember;
    }
    if rest.ends_with('?') {
        return Said::Question;
    }
    let rest = rest.trim_end_matches(['.', '!', ' ', '\t']).trim();
    match command(rest) {
        Some(c) => Said::Command(c),
        None => Said::Talk,
    }
}

/// A leading `@user:server`, `@user`, `name:` or `name,`, what follows
/// it, and whether it surely addresses someone (else it addresses the agent
/// only if it is one of the agent's names). `None` when the message does
/// not begin like an address.
fn leading_address(text: &str) -> Option<(&str, &str, bool)> {
    if let Some(stripped) = text.strip_prefix('@') {
        // A Matrix id (`@user:server`) ends at whitespace; a trailing `:`
        // or `,` after it is punctuation.
        let end = stripped.find(char::is_whitespace).unwrap_or(stripped.len());
        let id = stripped[..end].trim_end_matches([':', ',']);
        let localpart = id.split(':').next().unwrap_or(id);
        return Some((localpart, &stripped[end..], true));
    }
    // `name:` as the first words (letters, digits, `-`, `_`, `.`, and
    // spaces for a display name of up to three words), as Matrix clients
    // write a mention; or `Name,` — one capitalised word that is not an
    // interjection, since "no, keep it" and "raised the budget, go on" are
    // talk, not addresses.
    let head = text.find([':', ','])?;
    let name = &text[..head];
    let words = name.split_whitespace().count();
    let plain = name
        .chars()
        .all(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | '.' | ' '));
    if name.is_empty() || !plain || words == 0 || words > 3 {
        return None;
    }
    let sure = text[head..].starts_with(':') || {
        const INTERJECTIONS: [&str; 16] = [
            "yes", "no", "ok", "okay", "sure", "thanks", "well", "so", "hmm", "please", "right",
            "fine", "alright", "great", "good", "also",
        ];
        let capitalised = name.chars().next().is_some_and(char::is_uppercase);
        let interjection = INTERJECTIONS.iter().any(|i| name.eq_ignore_ascii_case(i));
        words == 1 && capitalised && !interjection
    };
    // "deny rev-2, too risky" is not addressed to "deny rev-2".
    let first = name.split_whitespace().next().unwrap_or_default();
    if command(first).is_some() || first.eq_ignore_ascii_case("deny") {
        return None;
    }
    Some((name.trim(), &text[head + 1..], sure))
}

/// Whether `text` asks the agent to keep something in memory.
fn is_remember(text: &str) -> bool {
    let lower = text.to_lowercase();
    ["remember:", "remember that ", "correction:"]
        .iter()
        .any(|p| {
            lower.starts_with(p) && lower.len() > p.len() && !lower[p.len()..].trim().is_empty()
        })
}

/// The command `text` (already trimmed) is, if any.
fn command(text: &str) -> Option<Command> {
    let lower = text.to_lowercase();
    let mut words = lower.split_whitespace();
    let first = words.next()?;
    // What follows the first word, in the operator's own case.
    let tail = text
        .trim_start()
        .get(first.len()..)
        .unwrap_or_default()
        .trim();
    match first {
        "status" if tail.is_empty() => Some(Command::Status),
        "stop" if tail.is_empty() => Some(Command::Stop),
        "retry" if tail.is_empty() => Some(Command::Retry),
        "park" if tail.is_empty() => Some(Command::Park),
        "abandon" => Some(Command::Abandon(tail.to_string())),
        // `approve [rev-N] [#14 step 2]`: the revision, then the item's
        // destructive steps named back, which begin with the item.
        "approve" => {
            let (revision, rest) = match tail.split_whitespace().next() {
                Some(w) if !w.starts_with('#') => {
                    (Some(parse_revision(w)?), tail[w.len()..].trim())
                }
                _ => (None, tail),
            };
            match rest {
                "" => Some(Command::Approve(revision, None)),
                confirm if confirm.starts_with('#') => {
                    Some(Command::Approve(revision, Some(confirm.to_string())))
                }
                _ => None,
            }
        }
        "deny" => {
            let (revision, reason) = match tail.split_whitespace().next() {
                Some(w) => match parse_revision(w.trim_end_matches([',', ':'])) {
                    Some(r) => (Some(r), tail[w.len()..].trim_start_matches([',', ':', ' '])),
                    None => (None, tail),
                },
                None => (None, tail),
            };
            Some(Command::Deny(revision, reason.trim().to_string()))
        }
        // One word: the project's name.
        "use" => {
            words.next()?;
            words
                .next()
                .is_none()
                .then(|| Command::Use(tail.to_string()))
        }
        "do" => {
            let n = words.next()?.strip_prefix('#')?.parse().ok()?;
            (words.next() == Some("next") && words.next().is_none()).then_some(Command::DoNext(n))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NAMES: &[&str] = &["@nisse-ops:example.org", "nisse-ops", "Nisse Ops", "ops"];

    fn cmd(text: &str) -> Option<Command> {
        match read(text, NAMES) {
            Said::Command(c) => Some(c),
            _ => None,
        }
    }

    #[test]
    fn commands_match_whatever_the_case_spacing_punctuation_or_mention() {
        for text in [
            "approve",
            "Approve",
            "  APPROVE.  ",
            "approve!",
            "@nisse-ops:example.org approve",
            "@nisse-ops: approve",
            "nisse-ops: approve",
            "Nisse Ops, approve",
            "ops: Approve.",
        ] {
            assert_eq!(cmd(text), Some(Command::Approve(None, None)), "{text:?}");
        }
        assert_eq!(cmd("approve rev-3"), Some(Command::Approve(Some(3), None)));
        assert_eq!(cmd("Approve REV-3."), Some(Command::Approve(Some(3), None)));
        assert_eq!(
            cmd("approve rev-3 #14 step 2"),
            Some(Command::Approve(Some(3), Some("#14 step 2".into())))
        );
        assert_eq!(
            cmd("ops: approve rev-3 #14 steps 2, 3."),
            Some(Command::Approve(Some(3), Some("#14 steps 2, 3".into())))
        );
        assert_eq!(
            cmd("approve #14 step 2"),
            Some(Command::Approve(None, Some("#14 step 2".into())))
        );
        assert_eq!(cmd("status"), Some(Command::Status));
        assert_eq!(cmd("Stop!"), Some(Command::Stop));
        assert_eq!(cmd("abandon"), Some(Command::Abandon(String::new())));
        assert_eq!(
            cmd("abandon it was a false alarm"),
            Some(Command::Abandon("it was a false alarm".into()))
        );
        assert_eq!(cmd("deny"), Some(Command::Deny(None, String::new())));
        assert_eq!(
            cmd("deny rev-2, too risky today"),
            Some(Command::Deny(Some(2), "too risky today".into()))
        );
        assert_eq!(cmd("use homelab"), Some(Command::Use("homelab".into())));
        assert_eq!(cmd("do #14 next"), Some(Command::DoNext(14)));
        assert_eq!(cmd("Do #14 next."), Some(Command::DoNext(14)));
        assert_eq!(cmd("retry"), Some(Command::Retry));
        assert_eq!(cmd("ops: Retry."), Some(Command::Retry));
        assert_eq!(cmd("Park."), Some(Command::Park));
        assert_eq!(cmd("park it"), None);
        assert_eq!(cmd("retry the whole thing"), None);
    }

    #[test]
    fn questions_are_never_commands() {
        for text in [
            "should I approve?",
            "approve?",
            "status?",
            "ops: approve rev-2?",
            "can you stop?",
        ] {
            assert_eq!(read(text, NAMES), Said::Question, "{text:?}");
        }
    }

    #[test]
    fn messages_addressed_to_someone_else_are_not_for_the_agent() {
        assert_eq!(
            read("@bob:example.org approve", NAMES),
            Said::ForSomeoneElse("bob".into())
        );
        assert_eq!(
            read("bob: approve", NAMES),
            Said::ForSomeoneElse("bob".into())
        );
        assert_eq!(read("Bob, stop", NAMES), Said::ForSomeoneElse("Bob".into()));
        assert_eq!(
            read("Bob Smith: stop", NAMES),
            Said::ForSomeoneElse("Bob Smith".into())
        );
    }

    #[test]
    fn a_comma_after_a_word_or_phrase_is_talk_not_an_address() {
        for text in [
            "no, keep it",
            "Okay, go ahead",
            "raised the budget, go on",
            "Yes, do it",
        ] {
            assert_eq!(read(text, NAMES), Said::Talk, "{text}");
        }
    }

    #[test]
    fn anything_else_is_talk() {
        for text in [
            "approved",
            "I approve of the idea in general",
            "approve rev-2 and rev-3",
            "approve rev-2 step 2",
            "stop the presses",
            "the disk is fine, it was a test",
            "do it",
            "",
        ] {
            assert_eq!(read(text, NAMES), Said::Talk, "{text:?}");
        }
    }
}
