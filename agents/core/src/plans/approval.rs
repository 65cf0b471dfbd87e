//! The approval request's text, rendered by code from the steps and their
//! verdicts.
//!
//! What the operator approves is the revision's exact steps, so the text
//! shows them exactly: every command, checks included, byte for byte in a
//! fenced code block that nothing in it can close and in which nothing is
//! read as Markdown; other arguments as exact code spans or blocks.
//!
//! In the chat ([`render_approval`]) a value too big to read there — a
//! file's content or any argument over [`QUOTE_BYTES`] or [`QUOTE_LINES`],
//! or anything past the request's [`REQUEST_QUOTE_BYTES`] — is shown by its
//! size and SHA-256 digest with a pointer to `nisse plan show`, which
//! prints the request whole ([`render_approval_whole`]): each such value
//! under the same digest, in full. Steps that would take the request past
//! [`STEPS_BYTES`] are left to `nisse plan show` altogether, and a long
//! rationale is cut. This keeps a plan readable and its message within the
//! homeserver's event size limit (64 KiB for the whole event, which carries
//! the text twice, plain and as HTML). The revision still binds every byte
//! of every step: only the text is shorter.

use time::OffsetDateTime;

use nisse_policy::{Check, RiskClass, Step};

use super::model::Plan;
use crate::markdown::{code_block, code_span, md_escape};
use crate::text::head as cut_to;
use crate::work::WorkItem;

/// The largest value the chat message quotes whole, in bytes.
pub const QUOTE_BYTES: usize = 2 * 1024;

/// The most lines of a value the chat message quotes whole.
pub const QUOTE_LINES: usize = 40;

/// The most bytes of values one chat message quotes whole; values past it
/// are shown by digest.
pub const REQUEST_QUOTE_BYTES: usize = 12 * 1024;

/// The most bytes the chat message gives its steps; the steps past it are
/// named, and left to `nisse plan show`.
pub const STEPS_BYTES: usize = 20 * 1024;

/// The approval request as the chat shows it, rendered by code from the
/// steps and their verdicts (L3: never from anyone's description of them).
/// Anything irreversible, touching a protected target, taking down the
/// agent's own host or holding hidden characters is flagged at the top;
/// `impact` (from [`crate::world::plan_impact`]) says what depends on what
/// the steps stop or restart; `binds`, the hosts the steps act on that are
/// not bound to the item yet, which approving binds.
pub fn render_approval(
    agent: &str,
    item: &WorkItem,
    plan: &Plan,
    expires: OffsetDateTime,
    halted: Option<&str>,
    impact: &[String],
    binds: &[String],
) -> String {
    render(
        agent,
        item,
        plan,
        expires,
        halted,
        impact,
        binds,
        Mode::Chat,
    )
}

/// The approval request whole, as `nisse plan show` prints it: every
/// value the chat shows by size and digest is printed in full under the
/// same digest, and every step is shown.
pub fn render_approval_whole(
    agent: &str,
    item: &WorkItem,
    plan: &Plan,
    expires: OffsetDateTime,
    halted: Option<&str>,
    impact: &[String],
    binds: &[String],
) -> String {
    render(
        agent,
        item,
        plan,
        expires,
        halted,
        impact,
        binds,
        Mode::Whole,
    )
}

/// Where the request is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// A chat message: big values by digest, the steps and rationale
    /// within their bounds.
    Chat,
    /// The CLI: everything, big values under their digest.
    Whole,
}

#[allow(clippy::too_many_arguments)]
fn render(
    agent: &str,
    item: &WorkItem,
    plan: &Plan,
    expires: OffsetDateTime,
    halted: Option<&str>,
    impact: &[String],
    binds: &[String],
    mode: Mode,
) -> String {
    let show = format!("nisse plan show #{} --agent {agent}", item.number);
    let mut out = format!(
        "📝 **Approval needed: item #{} {}** — {}\n",
        item.number,
        plan.tag(),
        md_escape(&item.title)
    );
    if let Some(reason) = halted {
        out.push_str(&format!(
            "\n⏸️ **Halted:** {}. Approving {} continues from step {}.\n",
            md_escape(reason),
            plan.tag(),
            plan.next_step + 1
        ));
    }
    let flags = flags(plan);
    if !flags.is_empty() {
        out.push('\n');
        for f in flags {
            out.push_str(&format!("- {f}\n"));
        }
    }
    if !impact.is_empty() {
        out.push_str("\n**What depends on it** (world model):\n");
        for line in impact {
            out.push_str(line);
            out.push('\n');
        }
    }
    // Proposing a plan binds nothing; approving it gives the item the
    // hosts its steps act on (L13), and the operator is told so.
    if !binds.is_empty() {
        out.push_str(&format!(
            "\n🔗 **Approving binds** {} to item #{}: the agent may then run commands there (read-only ones without asking).\n",
            binds
                .iter()
                .map(|h| format!("**{}**", md_escape(h)))
                .collect::<Vec<_>>()
                .join(", "),
            item.number
        ));
    }
    out.push_str("\n**Steps:**\n");
    out.push_str(&Quoting::new(&show, mode).steps(plan));
    let rationale = plan.rationale.trim();
    if !rationale.is_empty() {
        let (shown, cut) = match mode {
            Mode::Chat => cut_to(rationale, QUOTE_BYTES),
            Mode::Whole => (rationale, 0),
        };
        out.push_str(&format!(
            "\n_Rationale from {} (not part of what is approved):_ {}",
            md_escape(&plan.proposed_by),
            md_escape(shown)
        ));
        if cut > 0 {
            out.push_str(&format!("… ({cut} more bytes: `{show}` prints it whole)"));
        }
        out.push('\n');
    }
    let when = expires
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default();
    // Destructive steps are confirmed by naming them back, on every
    // channel: the words that do it are part of the request.
    match plan.confirmation(item.number) {
        Some(phrase) => out.push_str(&format!(
            "\nReply `approve {tag} {phrase}` (its destructive steps named back) or `deny {tag}`. This request expires {when}.",
            tag = plan.tag()
        )),
        None => out.push_str(&format!(
            "\nReply `approve {tag}` or `deny {tag}`. This request expires {when}.",
            tag = plan.tag()
        )),
    }
    out
}

/// The lines flagged above the steps, one per kind of risk (and reason),
/// naming its steps: few lines, however many steps share them.
fn flags(plan: &Plan) -> Vec<String> {
    // (what, what follows the steps) → the steps.
    let mut flags: Vec<((&str, String), Vec<usize>)> = Vec::new();
    let mut flag = |what: &'static str, after: String, n: usize| {
        let key = (what, after);
        match flags.iter_mut().find(|(k, _)| *k == key) {
            Some((_, steps)) => steps.push(n),
            None => flags.push((key, vec![n])),
        }
    };
    for (i, s) in plan.steps.iter().enumerate() {
        let n = i + 1;
        if let Some(a) = &s.assessed {
            if a.risk.is_none_or(RiskClass::is_irreversible) {
                flag("❗ **Irreversible:**", String::new(), n);
            }
            for p in &a.protected {
                flag(
                    "🛡️ **Protected target:**",
                    format!(" — {}", md_escape(p)),
                    n,
                );
            }
            if a.takes_agent_host_down {
                flag(
                    "💥 **Takes down the agent's own host:**",
                    format!(" ({})", md_escape(&s.step.action.target)),
                    n,
                );
            }
        }
        if values(&s.step).iter().any(|v| hides(&v.value)) {
            flag(
                "👻 **Hidden characters:**",
                ": characters that do not show or that reorder text, shown escaped as well".into(),
                n,
            );
        }
    }
    flags
        .into_iter()
        .map(|((what, after), steps)| {
            let list: Vec<String> = steps.iter().map(usize::to_string).collect();
            let steps = match list.len() {
                1 => format!("step {}", list[0]),
                _ => format!("steps {}", list.join(", ")),
            };
            format!("{what} {steps}{after}")
        })
        .collect()
}

/// One value a step shows: an argument, or a check's command or expected
/// output.
struct Value {
    /// What it is, for people (`command`, `content`, `before it, must
    /// exit 0`).
    name: String,
    /// The text.
    value: String,
    /// A command: always a block, never inline.
    command: bool,
}

/// A step's arguments, then its checks, in the order the request shows
/// them: the command first, then the path, the other arguments, and the
/// content last.
fn values(step: &Step) -> Vec<Value> {
    let mut out: Vec<Value> =
        match serde_json::from_str::<serde_json::Map<_, _>>(&step.action.arguments) {
            Ok(arguments) => {
                let mut arguments: Vec<(&String, &serde_json::Value)> = arguments.iter().collect();
                let rank = |k: &str| match k {
                    "command" => 0,
                    "path" => 1,
                    "content" => 3,
                    _ => 2,
                };
                arguments.sort_by_key(|(k, _)| (rank(k), k.as_str()));
                arguments
                    .into_iter()
                    .map(|(name, value)| Value {
                        name: name.clone(),
                        value: value
                            .as_str()
                            .map_or_else(|| value.to_string(), str::to_string),
                        command: name == "command",
                    })
                    .collect()
            }
            // Never the case for a step built through `Action::new`; shown
            // as it is rather than left out of what the operator reads.
            Err(_) => vec![Value {
                name: "arguments".into(),
                value: step.action.arguments.clone(),
                command: false,
            }],
        };
    for (when, check) in [
        ("before it", &step.precondition),
        ("after it", &step.expected),
    ] {
        if let Some(Check {
            command,
            exit_code,
            output_contains,
            tool,
            arguments,
        }) = check
        {
            match tool {
                Some(tool) => out.push(Value {
                    name: format!(
                        "{when}, the call of `{tool}` must {}",
                        if *exit_code == 0 {
                            "succeed"
                        } else {
                            "report an error"
                        }
                    ),
                    value: arguments.clone().unwrap_or_else(|| "{}".into()),
                    command: true,
                }),
                None => out.push(Value {
                    name: format!("{when}, must exit {exit_code}"),
                    value: command.clone(),
                    command: true,
                }),
            }
            if let Some(want) = output_contains {
                out.push(Value {
                    name: format!("{when}, its output must contain"),
                    value: want.clone(),
                    command: false,
                });
            }
        }
    }
    out
}

/// Renders the steps for a [`Mode`], quoting values while they are small
/// and the request's budget lasts.
struct Quoting<'a> {
    /// The command that prints the whole request.
    show: &'a str,
    mode: Mode,
    /// Bytes of values still to quote whole in the chat.
    budget: usize,
}

impl<'a> Quoting<'a> {
    fn new(show: &'a str, mode: Mode) -> Self {
        Self {
            show,
            mode,
            budget: REQUEST_QUOTE_BYTES,
        }
    }

    fn steps(&mut self, plan: &Plan) -> String {
        let mut out = String::new();
        for (i, s) in plan.steps.iter().enumerate() {
            let a = &s.step.action;
            let class = s.assessed.as_ref().map_or("unclassified".to_string(), |x| {
                format!(
                    "{}, class {}",
                    x.risk.map_or("unknown".into(), |r| r.to_string()),
                    x.class.number()
                )
            });
            let mut step = format!(
                "\n**{}.** on **{}**: {} — {class} · retries {}\n",
                i + 1,
                md_escape(&a.target),
                code_span(&a.tool).unwrap_or_else(|| md_escape(&a.tool)),
                s.step.retries
            );
            for v in values(&s.step) {
                step.push_str(&self.value(v));
            }
            if self.mode == Mode::Chat && out.len() + step.len() > STEPS_BYTES {
                out.push_str(&format!(
                    "\n**Steps {} to {} are not shown here:** with them this message would be too long for the chat. `{}` prints every step whole.\n",
                    i + 1,
                    plan.steps.len(),
                    self.show
                ));
                break;
            }
            out.push_str(&step);
        }
        out
    }

    /// Whether the chat shows `value` by digest (and spends the budget on
    /// it when it does not). Both modes ask, in the same order, so the CLI
    /// prints a digest under exactly the values the chat showed by it.
    fn withheld(&mut self, value: &str) -> bool {
        let withheld = value.len() > QUOTE_BYTES
            || value.lines().count() > QUOTE_LINES
            || value.len() > self.budget;
        if !withheld {
            self.budget -= value.len();
        }
        withheld
    }

    /// One value: whole (a command as a block without its name, anything
    /// else under its name) or by its size and digest, as the mode says.
    fn value(&mut self, v: Value) -> String {
        let name = capitalized(&v.name);
        if self.withheld(&v.value) {
            let digest = format!("{name}: {}, SHA-256 `{}`", size(&v.value), sha256(&v.value));
            return match self.mode {
                Mode::Chat => format!(
                    "{digest}; not shown here: `{}` prints it whole.\n",
                    self.show
                ),
                Mode::Whole => format!("{digest}:\n{}", self.block(&v.value)),
            };
        }
        match code_span(&v.value).filter(|s| !v.command && s.len() <= 80) {
            Some(span) => format!("{name}: {span}\n{}", self.escaped(&v.value)),
            None if v.name == "command" => self.block(&v.value),
            None => format!("{name}:\n{}", self.block(&v.value)),
        }
    }

    /// `value` in a code block, and escaped in another when it hides
    /// characters.
    fn block(&self, value: &str) -> String {
        format!("{}{}", code_block(value), self.escaped(value))
    }

    /// `value` escaped, in a block of its own, when it holds characters
    /// that do not show or that reorder text (else nothing).
    fn escaped(&self, value: &str) -> String {
        if hides(value) {
            format!(
                "Escaped, since it holds characters that do not show or that reorder text:\n{}",
                code_block(&escape_hidden(value))
            )
        } else {
            String::new()
        }
    }
}

fn capitalized(s: &str) -> String {
    let mut chars = s.chars();
    chars.next().map_or_else(String::new, |c| {
        c.to_uppercase().chain(chars).collect::<String>()
    })
}

/// `value`'s size for people: bytes and lines.
fn size(value: &str) -> String {
    format!("{} bytes in {} line(s)", value.len(), value.lines().count())
}

/// The SHA-256 digest of `value`'s bytes, in hex: what `sha256sum` prints
/// for a file holding exactly them.
fn sha256(value: &str) -> String {
    use sha2::Digest as _;
    sha2::Sha256::digest(value.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A character that does not show, or that changes how the text around
/// it reads: controls other than tab and newline, zero-width and joining
/// characters, text-direction marks, overrides and isolates, invisible
/// fillers, line and paragraph separators, tag characters.
fn is_hidden(c: char) -> bool {
    (c.is_control() && c != '\n' && c != '\t')
        || matches!(
            c,
            '\u{ad}'
                | '\u{34f}'
                | '\u{61c}'
                | '\u{115f}'
                | '\u{1160}'
                | '\u{17b4}'
                | '\u{17b5}'
                | '\u{180e}'
                | '\u{200b}'..='\u{200f}'
                | '\u{2028}'..='\u{202e}'
                | '\u{2060}'..='\u{206f}'
                | '\u{3164}'
                | '\u{feff}'
                | '\u{ffa0}'
                | '\u{fff9}'..='\u{fffb}'
                | '\u{e0000}'..='\u{e007f}'
        )
}

fn hides(value: &str) -> bool {
    value.chars().any(is_hidden)
}

/// `value` with every hidden character written as `\u{…}`.
fn escape_hidden(value: &str) -> String {
    value
        .chars()
        .map(|c| {
            if is_hidden(c) {
                format!("\\u{{{:x}}}", u32::from(c))
            } else {
                c.to_string()
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use nisse_policy::Action;

    use super::*;

    #[test]
    fn arguments_that_are_no_json_object_are_shown_as_they_are() {
        let step = Step {
            action: Action {
                tool: "shell".into(),
                target: "web1".into(),
                arguments: "rm -rf /".into(),
            },
            precondition: None,
            expected: None,
            retries: 0,
        };
        let shown: Vec<(String, String)> = values(&step)
            .into_iter()
            .map(|v| (v.name, v.value))
            .collect();
        assert_eq!(shown, [("arguments".to_string(), "rm -rf /".to_string())]);
    }
}
