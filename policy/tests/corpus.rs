//! The command corpus (`tests/fixtures/shell-commands.toml`): every command
//! classifies as its expected risk, and wrapping a command (in a shell, a
//! wrapper, `ssh`, `eval`, a substitution, or behind a name computed at run
//! time) never lowers its class.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::path::PathBuf;

use nisse_policy::{Policy, RiskClass};
use proptest::prelude::*;
use serde::Deserialize;

#[derive(Deserialize)]
struct Corpus {
    case: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    command: String,
    risk: RiskClass,
    #[allow(dead_code)]
    why: Option<String>,
}

fn corpus() -> Vec<Case> {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/shell-commands.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    toml::from_str::<Corpus>(&text).unwrap().case
}

#[test]
fn every_corpus_command_classifies_as_expected() {
    let policy = Policy::builtin().unwrap();
    let cases = corpus();
    assert!(
        cases.len() >= 840,
        "the corpus has {} commands",
        cases.len()
    );
    let mut wrong = Vec::new();
    for case in &cases {
        let report = policy.classify_command(&case.command);
        if report.risk != case.risk {
            let decided = report
                .deciding()
                .map(|f| format!("{} ({}: {})", f.command, f.rule, f.reason))
                .unwrap_or_default();
            wrong.push(format!(
                "{:?}\n    expected {}, got {} — {decided}",
                case.command, case.risk, report.risk
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {} misclassified:\n{}",
        wrong.len(),
        cases.len(),
        wrong.join("\n")
    );
}

/// Quotes `s` as one shell word.
fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The ways a command can be wrapped without changing what it does.
fn wrappings(command: &str) -> Vec<String> {
    let q = quote(command);
    vec![
        format!("sh -c {q}"),
        format!("bash -c {q}"),
        format!("sudo sh -c {q}"),
        format!("sh -c {}", quote(&format!("bash -c {q}"))),
        format!("env X=1 sh -c {q}"),
        format!("echo start | sh -c {q}"),
        format!("su -c {q} root"),
        format!("nohup timeout 5 bash -c {q}"),
        // `--`: a command starting with a dash is not taken for an option.
        format!("eval -- {q}"),
        format!("ssh nas01 -- {q}"),
        format!("true && {command}"),
        format!("{{ {command}\n}}"),
        format!("( {command}\n)"),
        format!("echo \"$({command}\n)\""),
    ]
}

#[test]
fn wrapping_any_corpus_command_never_lowers_its_class() {
    let policy = Policy::builtin().unwrap();
    for case in corpus() {
        let base = policy.classify_command(&case.command).risk;
        for wrapped in wrappings(&case.command) {
            let risk = policy.classify_command(&wrapped).risk;
            assert!(
                risk >= base,
                "{wrapped:?} is {risk}, below {:?} ({base})",
                case.command
            );
        }
        // Simple commands can also be prefixed directly.
        if !case
            .command
            .contains(['\n', ';', '&', '|', '(', '{', '<', '>'])
            && !case.command.starts_with(['!', '$', '"', '\'', ':', '['])
        {
            for prefix in [
                "sudo ",
                "env X=1 ",
                "nohup ",
                "sudo -u root -- ",
                "timeout 5 ",
                "nice -n 5 ",
            ] {
                let wrapped = format!("{prefix}{}", case.command);
                let risk = policy.classify_command(&wrapped).risk;
                assert!(
                    risk >= base,
                    "{wrapped:?} is {risk}, below {:?} ({base})",
                    case.command
                );
            }
            // The program's name computed at run time, directly or through
            // a variable: never below the name written out.
            if let Some((name, rest)) = case.command.split_once(' ')
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c))
            {
                for computed in [
                    format!("$(echo {name}) {rest}"),
                    format!("p=`echo {name}`; $p {rest}"),
                ] {
                    let risk = policy.classify_command(&computed).risk;
                    assert!(
                        risk >= base,
                        "{computed:?} is {risk}, below {:?} ({base})",
                        case.command
                    );
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, .. ProptestConfig::default() })]

    /// Generated command lines: a pipeline of words from a vocabulary that
    /// mixes harmless and dangerous programs, flags and paths.
    #[test]
    fn wrapping_a_generated_command_never_lowers_its_class(
        words in prop::collection::vec(
            prop::sample::select(vec![
                "ls", "-la", "cat", "/etc/shadow", "rm", "-rf", "/srv", "systemctl", "status",
                "restart", "caddy", "zfs", "destroy", "list", "tank/media", "dd", "of=/dev/sda",
                "echo", "hello", ">", "/tmp/x", "/dev/sdb", "|", "grep", "x", "&&", ";", "reboot",
                "sudo", "find", "-delete", "xargs", "$(reboot)", "'quoted text'", "curl", "sh",
                "printenv", "env", "$(echo rm)", "ssh", "nas01", "> /etc/hosts", ">> /etc/hosts",
                "/etc", "mv", "chown", "-R", "/srv/data", "nginx", "-t", "eval", "\"$x\"",
                "/proc/1/environ", "file:///etc/shadow", "tee", "-a", "export", "-p", "set",
            ]),
            1..8,
        )
    ) {
        let policy = Policy::builtin().unwrap();
        let command = words.join(" ");
        let base = policy.classify_command(&command).risk;
        for wrapped in wrappings(&command) {
            let risk = policy.classify_command(&wrapped).risk;
            prop_assert!(
                risk >= base,
                "{wrapped:?} is {risk}, below {command:?} ({base})"
            );
        }
    }
}
