//! Log events in words: one line per event, for the operator.

use time::format_description::well_known::Rfc3339;

use crate::log::{Event, LoggedEvent};

fn when(t: time::OffsetDateTime) -> String {
    t.format(&Rfc3339).unwrap_or_default()
}

impl LoggedEvent {
    /// One line for a log event, as `nisse item show` prints it and the
    /// brain answers an operator's command with.
    pub fn describe(&self) -> String {
        let e = self;
        let rev = |r: &u32| format!("rev-{r}");
        match &e.event {
            Event::Opened { title, .. } => format!("opened: {title}"),
            Event::Finding {
                status, summary, ..
            } => format!("finding ({status}): {summary}"),
            Event::Fact { text, .. } => format!("fact: {text}"),
            Event::StateChanged {
                from, to, reason, ..
            } => format!("{from} → {to}: {reason}"),
            Event::OperatorOrder { rank: Some(r) } => format!("operator's order: {r}"),
            Event::OperatorOrder { rank: None } => "operator's order cleared".into(),
            Event::PlanProposed {
                revision, steps, ..
            } => format!("plan {} proposed ({} steps)", rev(revision), steps.len()),
            Event::PlanRejected { revision, reason } => format!(
                "plan {}rejected: {reason}",
                revision.map_or(String::new(), |r| format!("rev-{r} "))
            ),
            Event::ApprovalRequested {
                revision,
                expires_at,
                ..
            } => format!(
                "approval of {} requested (expires {})",
                rev(revision),
                when(*expires_at)
            ),
            Event::ApprovalDelivered {
                revision,
                via,
                posted_id,
                ..
            } => format!(
                "approval request of {} delivered via {via} ({posted_id})",
                rev(revision)
            ),
            Event::ClassifierVerdict {
                revision,
                step,
                phase,
                verdict,
                action_class,
                risk,
                decided_by,
                reasons,
                ..
            } => format!(
                "classifier: {} step {step} {phase}: {verdict} (class {action_class}, {}, {decided_by}){}",
                rev(revision),
                risk.map_or("risk unknown".into(), |r| r.to_string()),
                reasons.first().map_or(String::new(), |r| format!(": {r}"))
            ),
            Event::Approved {
                revision, by, via, ..
            } => format!("approved {} by {by} via {via}", rev(revision)),
            Event::Denied {
                revision,
                by,
                via,
                reason,
            } => format!("denied {} by {by} via {via}: {reason}", rev(revision)),
            Event::DecisionRefused {
                by,
                via,
                approve,
                reason,
                ..
            } => format!(
                "{} from {by} via {via} not applied: {reason}",
                if *approve { "approval" } else { "denial" }
            ),
            Event::ExecRequested {
                revision,
                step,
                phase,
                host,
                command,
                ..
            } => format!(
                "exec requested: {} step {step} {phase} on {host}: {command}",
                rev(revision)
            ),
            Event::StepResult {
                revision,
                step,
                phase,
                status,
                exit_code,
                reason,
                failure,
                stdout_tail,
                stderr_tail,
                dropped_bytes,
                ..
            } => {
                let mut line = format!(
                    "result: {} step {step} {phase}: {status}{}{}{}",
                    rev(revision),
                    if status == "completed" {
                        format!(" (exit {exit_code})")
                    } else {
                        String::new()
                    },
                    if failure.is_empty() {
                        String::new()
                    } else {
                        format!(" [{failure}]")
                    },
                    if reason.is_empty() {
                        String::new()
                    } else {
                        format!(": {reason}")
                    }
                );
                // The last lines of output, as the operator would look for
                // them first.
                for (name, text) in [("stdout", stdout_tail), ("stderr", stderr_tail)] {
                    let lines: Vec<&str> = text.lines().collect();
                    for l in &lines[lines.len().saturating_sub(5)..] {
                        line.push_str(&format!("\n        {name} │ {l}"));
                    }
                }
                if *dropped_bytes > 0 {
                    line.push_str(&format!(
                        "\n        ({dropped_bytes} bytes of output dropped by the cap)"
                    ));
                }
                line
            }
            Event::Said {
                via,
                text,
                operator,
                read_as,
            } => format!(
                "said via {via}{} ({read_as}): {text}",
                if *operator { "" } else { ", not an operator" }
            ),
            Event::HostsBound { added, reason, .. } => {
                format!("hosts bound: {} ({reason})", added.join(", "))
            }
            Event::PlanHalted {
                revision, reason, ..
            } => format!("plan {} halted: {reason}", rev(revision)),
            Event::PlanFinished { revision } => format!("plan {} finished", rev(revision)),
            Event::Stopped { by, via, .. } => format!("stopped by {by} via {via}"),
            Event::Abandoned { by, via, note } => format!("abandoned by {by} via {via}: {note}"),
            Event::RolesPinned { roles } => format!(
                "roles pinned: {}",
                roles
                    .iter()
                    .map(|(role, pin)| format!("{role} = {}", pin.model))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            Event::ModelRequested {
                request_id,
                role,
                model,
                prompt_tokens,
                dropped_events,
                shortened_results,
            } => format!(
                "asked the {role} ({model}), ~{prompt_tokens} tokens{}{} [{request_id}]",
                if *shortened_results > 0 {
                    format!(", {shortened_results} old results shortened")
                } else {
                    String::new()
                },
                if *dropped_events > 0 {
                    format!(", {dropped_events} old events left out")
                } else {
                    String::new()
                }
            ),
            Event::ModelFailed {
                role,
                model,
                error,
                message,
                ..
            } => format!("the {role} ({model}) failed: {error}: {message}"),
            Event::AssistantText { role, text, .. } => format!("{role} said: {text}"),
            Event::ToolCall {
                call_id,
                role,
                tool,
                arguments,
                ..
            } => format!("{role} called {tool} {arguments} [{call_id}]"),
            Event::ToolResult {
                call_id,
                result,
                success,
                ..
            } => format!(
                "{} [{call_id}]: {}",
                if *success { "result" } else { "failed" },
                result.lines().next().unwrap_or_default()
            ),
            Event::QuestionAsked { question, .. } => format!("asked the operator: {question}"),
            Event::Note { text, .. } => format!("note: {text}"),
            Event::KnowledgeRetrieved {
                query,
                notes,
                missing,
                ..
            } => {
                let read: Vec<String> = notes
                    .iter()
                    .map(|n| format!("{} ({})", n.path, n.sha256.get(..12).unwrap_or(&n.sha256)))
                    .collect();
                let mut line = format!(
                    "knowledge retrieved ({query}): {}",
                    if read.is_empty() {
                        "nothing new".to_string()
                    } else {
                        read.join(", ")
                    }
                );
                if !missing.is_empty() {
                    line.push_str(&format!("; missing: {}", missing.join(", ")));
                }
                line
            }
            Event::DelegationStarted { trigger, model, .. } => {
                format!("handed to the helper ({model}): {trigger}")
            }
            Event::DelegationCompleted {
                status,
                note,
                turns,
                ..
            } => format!("the helper handed back ({status}, {turns} turns): {note}"),
        }
    }
}
