//! The command corpora (`tests/fixtures/`): `shell-commands.toml`, the
//! project's own; `shell-reads.toml`, everyday reads of every program a
//! read-only rule names, as operators write them; `shell-abuse.toml`,
//! abusable invocations of common programs (from public lists of binaries
//! known for shell escapes, file writes, uploads and downloads), each with
//! the lowest class that is right; `shell-destructive.toml`, the
//! destructive categories with near misses. Every command classifies as
//! expected, and wrapping a command (in a shell, a wrapper, `ssh`, `eval`,
//! a substitution, or behind a name computed at run time) never lowers its
//! class.
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
#[serde(rename_all = "kebab-case")]
struct Case {
    command: String,
    /// The class it must have.
    risk: Option<RiskClass>,
    /// The lowest class it may have.
    at_least: Option<RiskClass>,
    /// The program it is about.
    program: Option<String>,
    /// What kind of case it is.
    category: Option<String>,
    #[allow(dead_code)]
    why: Option<String>,
}

impl Case {
    /// Whether `risk` is what the case asks for.
    fn holds(&self, risk: RiskClass) -> bool {
        match (self.risk, self.at_least) {
            (Some(want), _) => risk == want,
            (None, Some(floor)) => risk >= floor,
            (None, None) => panic!("{:?} gives neither `risk` nor `at-least`", self.command),
        }
    }

    fn wanted(&self) -> String {
        match (self.risk, self.at_least) {
            (Some(want), _) => want.to_string(),
            (_, Some(floor)) => format!("at least {floor}"),
            _ => String::new(),
        }
    }
}

fn load(file: &str) -> Vec<Case> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures")
        .join(file);
    let text = std::fs::read_to_string(&path).unwrap();
    toml::from_str::<Corpus>(&text).unwrap().case
}

fn corpus() -> Vec<Case> {
    load("shell-commands.toml")
}

/// Every case of `file` holds; the failures are listed together.
fn check(file: &str, at_least_cases: usize) -> Vec<Case> {
    let policy = Policy::builtin().unwrap();
    let cases = load(file);
    assert!(
        cases.len() >= at_least_cases,
        "{file} has {} commands",
        cases.len()
    );
    let mut wrong = Vec::new();
    for case in &cases {
        let report = policy.classify_command(&case.command);
        if !case.holds(report.risk) {
            let decided = report
                .deciding()
                .map(|f| format!("{} ({}: {})", f.command, f.rule, f.reason))
                .unwrap_or_default();
            wrong.push(format!(
                "{:?}\n    expected {}, got {} — {decided}",
                case.command,
                case.wanted(),
                report.risk
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "{file}: {} of {} misclassified:\n{}",
        wrong.len(),
        cases.len(),
        wrong.join("\n")
    );
    cases
}

#[test]
fn everyday_reads_of_every_read_only_program_stay_read_only() {
    let cases = check("shell-reads.toml", 900);
    // Over-classification is measured, not only bounded: the few reads
    // the file expects to be refused say why.
    let refused = cases
        .iter()
        .filter(|c| c.risk != Some(RiskClass::ReadOnly))
        .count();
    assert!(
        refused * 20 < cases.len(),
        "{refused} of {} everyday reads are not read-only: over 5%",
        cases.len()
    );
}

#[test]
fn abusable_forms_of_common_programs_are_never_read_only() {
    let cases = check("shell-abuse.toml", 900);
    let policy = Policy::builtin().unwrap();
    for case in &cases {
        assert!(
            case.at_least.is_some_and(|r| r > RiskClass::ReadOnly),
            "{:?}: an abuse case is above read-only",
            case.command
        );
        // Wrapped, quoted or run through a shell, it is never lower.
        let base = policy.classify_command(&case.command).risk;
        for wrapped in wrappings(&case.command) {
            let risk = policy.classify_command(&wrapped).risk;
            assert!(
                risk >= base,
                "{wrapped:?} is {risk}, below {:?} ({base})",
                case.command
            );
        }
    }
    // Every program a read-only rule names whose options can be abused has
    // its abusable forms here; the others are named with the reason.
    let covered: std::collections::BTreeSet<&str> =
        cases.iter().filter_map(|c| c.program.as_deref()).collect();
    let categories: std::collections::BTreeSet<&str> =
        cases.iter().filter_map(|c| c.category.as_deref()).collect();
    for category in [
        "shell",
        "command",
        "reverse-shell",
        "bind-shell",
        "file-write",
        "file-upload",
        "file-download",
        "library-load",
        "in-place-edit",
        "pager-escape",
        "env-escape",
    ] {
        assert!(categories.contains(category), "no `{category}` case");
    }
    for program in [
        "uniq",
        "sdiff",
        "tree",
        "xxd",
        "less",
        "file",
        "yq",
        "rg",
        "view",
        "gawk",
        "bat",
        "ag",
        "sed",
        "awk",
        "find",
        "tar",
        "git",
        "curl",
        "wget",
        "openssl",
        "sort",
        "tee",
        "dig",
        "journalctl",
        "systemctl",
        "docker",
        "kubectl",
        "ssh",
        "zip",
        "man",
    ] {
        assert!(covered.contains(program), "no abuse case for `{program}`");
    }
}

#[test]
fn destructive_categories_are_destructive_through_any_wrapper() {
    let cases = check("shell-destructive.toml", 350);
    let policy = Policy::builtin().unwrap();
    let mut per_category = std::collections::BTreeMap::<&str, usize>::new();
    for case in &cases {
        if case.risk != Some(RiskClass::Destructive) {
            continue;
        }
        *per_category
            .entry(case.category.as_deref().unwrap_or("?"))
            .or_default() += 1;
        if case
            .command
            .contains(['\n', ';', '&', '|', '(', '{', '<', '>'])
            || case.command.starts_with(['!', '$', '"', '\'', ':', '['])
        {
            continue;
        }
        for prefix in [
            "sudo ",
            "env ",
            "timeout 10 ",
            "nice -n 5 ",
            "command ",
            "sudo -u root -- ",
            "env LC_ALL=C ",
        ] {
            let wrapped = format!("{prefix}{}", case.command);
            let risk = policy.classify_command(&wrapped).risk;
            assert_eq!(
                risk,
                RiskClass::Destructive,
                "{wrapped:?} is {risk}, not destructive"
            );
        }
    }
    for category in [
        "unreadable-code",
        "cut-off",
        "delete-virtual",
        "delete-service-data",
        "send-away",
        "replace-system-files",
    ] {
        assert!(
            per_category.get(category).copied().unwrap_or(0) >= 8,
            "`{category}`: fewer than 8 destructive cases ({per_category:?})"
        );
    }
}

#[test]
fn every_corpus_command_classifies_as_expected() {
    check("shell-commands.toml", 840);
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
