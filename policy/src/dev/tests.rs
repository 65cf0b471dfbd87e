//! The dev agent's classes on a build host, each way: what is class 1, 2
//! and 3 there, what the gate does with class 2 in scope, and what stays
//! as it was.

use proptest::prelude::*;
use serde_json::json;

use super::*;
use crate::gate::{ApprovedPlan, Basis, Halt, Permit, PermitRequest, Scope, Verdict, fast_path};
use crate::switches::{Autonomy, Never, Switches};
use crate::{Action, ActionClass, Assessment};

const HOST: &str = "build-nisse";
const WS: &str = "/home/dev/work/nisse";

fn build_host() -> BuildHost {
    BuildHost {
        name: HOST.into(),
        project: "ops/nisse".into(),
        // A trailing slash is the same workspace.
        workspace: format!("{WS}/"),
        test_commands: vec![
            "cargo test --workspace".into(),
            "cargo nextest run -p nisse-policy".into(),
        ],
        git: Some(HarnessGit {
            url: "ssh://git@gitea.lan:2222/ops/nisse.git".into(),
            known_hosts: Some("/home/dev/.config/nisse/gitea_known_hosts".into()),
            push_secret: "nisse-push-key".into(),
        }),
    }
}

fn policy() -> Policy {
    Policy::builtin()
        .unwrap()
        .with_build_hosts(vec![build_host()])
        .unwrap()
}

fn on(host: &str, command: &str) -> Assessment {
    policy().assess(&Action::shell(host, command), None)
}

fn build(command: &str) -> Assessment {
    on(HOST, command)
}

fn contained() -> Vec<String> {
    vec![HOST.to_string()]
}

/// The fast path's verdict and the permit's outcome for `action`, with
/// `contained` as the scope's contained targets and the switches on.
fn gate(action: &Action, contained: &[String]) -> (Option<Verdict>, Result<Basis, Halt>) {
    gate_with(action, contained, &Switches::default())
}

fn gate_with(
    action: &Action,
    contained: &[String],
    switches: &Switches,
) -> (Option<Verdict>, Result<Basis, Halt>) {
    let assessment = policy().assess(action, None);
    let scope = Scope {
        plan: None,
        operator_confirmed: false,
        contained,
    };
    let fast = fast_path(action, &assessment, switches, scope);
    let permit = Permit::issue(PermitRequest {
        action,
        risk: assessment.risk,
        class: assessment.class,
        targets: &assessment.targets,
        verdict: fast.as_ref().map_or(Verdict::Safe, |f| f.verdict),
        switches,
        scope,
    })
    .map(|p| p.basis());
    (fast.map(|f| f.verdict), permit)
}

#[test]
fn build_hosts_are_checked_when_added() {
    let base = Policy::builtin().unwrap();
    let with = |host: BuildHost| base.clone().with_build_hosts(vec![host]);
    let p = with(build_host()).unwrap();
    assert_eq!(p.build_host(HOST).unwrap().workspace, WS);
    assert!(p.build_host("web1").is_none());
    for (host, says) in [
        (
            BuildHost {
                name: " ".into(),
                ..build_host()
            },
            "name is empty",
        ),
        (
            BuildHost {
                workspace: "work/nisse".into(),
                ..build_host()
            },
            "absolute path",
        ),
        (
            BuildHost {
                workspace: "/".into(),
                ..build_host()
            },
            "below `/`",
        ),
        (
            BuildHost {
                workspace: "/home/dev/../root".into(),
                ..build_host()
            },
            "without `..`",
        ),
        (
            BuildHost {
                workspace: "/home/*/work".into(),
                ..build_host()
            },
            "globs",
        ),
        (
            BuildHost {
                test_commands: vec!["cargo test".into(), " ".into()],
                ..build_host()
            },
            "test command 2 is empty",
        ),
    ] {
        let e = with(host).unwrap_err();
        assert!(e.to_string().contains(says), "{e}");
        assert_eq!(e.file, "build hosts");
    }
    // One project per build host: the policy cannot tell their items
    // apart.
    let e = with(build_host())
        .unwrap()
        .with_build_hosts(vec![BuildHost {
            project: "ops/other".into(),
            ..build_host()
        }])
        .unwrap_err();
    assert!(
        e.message.contains("ops/nisse") && e.message.contains("ops/other"),
        "{e}"
    );
    // Never the agent's own host.
    let own = Policy::with_file(
        "site.toml",
        "version = 1\nagent-hosts = [\"build-nisse\"]\n",
    )
    .unwrap()
    .with_build_hosts(vec![build_host()])
    .unwrap_err();
    assert!(own.message.contains("agent itself runs on"), "{own}");
}

#[test]
fn declared_test_commands_are_class_1() {
    for command in [
        "cargo test --workspace",
        "  cargo test --workspace ",
        "cd /home/dev/work/nisse && cargo test --workspace",
        "cd /home/dev/work/nisse/policy && cargo nextest run -p nisse-policy",
        "cd '/home/dev/work/nisse' && cargo test --workspace",
        "cd /home/dev/work/nisse/;cargo test --workspace",
    ] {
        let a = build(command);
        assert_eq!(
            a.class,
            ActionClass::NoSideEffects,
            "{command}: {:?}",
            a.reasons
        );
        assert_eq!(a.rule, RULE_TEST, "{command}");
        assert!(a.reasons[0].contains("ops/nisse"), "{:?}", a.reasons);
        assert_eq!(a.build_host.as_deref(), Some("ops/nisse"));
    }
    // Anything else is judged as what it is: a build is a contained
    // change, and a push next to a test is a push.
    for (command, class, rule) in [
        ("cargo test", ActionClass::Contained, RULE_CONTAINED),
        (
            "cargo test --workspace --release",
            ActionClass::Contained,
            RULE_CONTAINED,
        ),
        (
            "cd /srv && cargo test --workspace",
            ActionClass::Contained,
            RULE_CONTAINED,
        ),
        (
            "cd /home/dev/work/nisse-old && cargo test --workspace",
            ActionClass::Contained,
            RULE_CONTAINED,
        ),
        (
            "cargo test --workspace && git push",
            ActionClass::Dangerous,
            RULE_PUSH,
        ),
        (
            "cargo test --workspace; rm -rf /",
            ActionClass::Dangerous,
            RULE_OUTSIDE,
        ),
        (
            "cd $WS && cargo test --workspace",
            ActionClass::Contained,
            RULE_CONTAINED,
        ),
    ] {
        let a = build(command);
        assert_eq!(
            (a.class, a.rule.as_str()),
            (class, rule),
            "{command}: {:?}",
            a.reasons
        );
    }
    // On any other host a test command is what the ops rules say.
    assert_eq!(
        on("web1", "cargo test --workspace").class,
        ActionClass::Dangerous
    );
    // Reading stays reading.
    let a = build("git log --oneline -5");
    assert_eq!(
        (a.class, a.rule.as_str()),
        (ActionClass::NoSideEffects, "git.read")
    );
}

/// Class 2 on the build host: edits, commits, installs, cleaning inside
/// the workspace, scratch space and the caches.
const CONTAINED: [&str; 23] = [
    "sed -i 's/old/new/' src/lib.rs",
    "cd /home/dev/work/nisse && sed -i 's/old/new/' src/lib.rs",
    "git commit -am 'Fix the parser'",
    "cd /home/dev/work/nisse && git add -A && git commit -m wip",
    "pip install requests",
    "python3 -m pip install --user ruff",
    "cargo install cargo-nextest",
    "npm install",
    "sudo apt-get install -y jq",
    "apt install -y build-essential",
    "rustup toolchain install stable",
    "cargo build --release",
    "cd /home/dev/work/nisse && rm -rf target/",
    "rm -rf /home/dev/work/nisse/target /home/dev/work/nisse/node_modules",
    "rm -rf ~/.cache/pip ~/.cargo/registry/cache",
    "rm -rf .cache/pip",
    "rm -rf /tmp/build-1 /var/tmp/x",
    "cd /home/dev/work/nisse && git clean -fdx",
    "git -C /home/dev/work/nisse reset --hard",
    "cd /home/dev/work/nisse && find . -name '*.pyc' -delete",
    "cd /home/dev/work/nisse && cd target && rm -rf debug",
    "truncate -s 0 /home/dev/work/nisse/tests/fixture.log",
    "ssh-agent sh -c 'ssh-add -l; cargo build'",
];

#[test]
fn writes_on_the_build_host_are_class_2_and_permitted_only_in_scope() {
    for command in CONTAINED {
        let a = build(command);
        assert_eq!(
            a.class,
            ActionClass::Contained,
            "{command}: {:?}",
            a.reasons
        );
        assert_eq!(a.risk, RiskClass::ReversibleLow, "{command}");
        assert_eq!(a.rule, RULE_CONTAINED, "{command}: {:?}", a.reasons);
        assert!(
            a.reasons
                .iter()
                .any(|r| r.contains("build host of ops/nisse")),
            "{:?}",
            a.reasons
        );

        let action = Action::shell(HOST, command);
        let (fast, permit) = gate(&action, &contained());
        assert_eq!(fast, Some(Verdict::Safe), "{command}");
        assert_eq!(permit, Ok(Basis::ContainedInScope), "{command}");
        // Without the build host in the agreed scope it needs discussion.
        let (fast, permit) = gate(&action, &[]);
        assert_eq!(fast, None, "{command}");
        assert!(matches!(permit, Err(Halt::NeedsDiscussion(_))), "{command}");
        // On any other host it is what the ops rules say, whatever the
        // scope contains.
        let elsewhere = Action::shell("web1", command);
        assert_eq!(gate(&elsewhere, &contained()).0, None, "{command}");
        assert!(gate(&elsewhere, &contained()).1.is_err(), "{command}");
        let (fast, permit) = gate(&elsewhere, &["web1".to_string()]);
        assert_ne!(fast, Some(Verdict::Safe), "{command}");
        assert!(permit.is_err(), "{command}");
    }
    // The reason says where a cleanup deletes.
    let a = build("cd /home/dev/work/nisse && rm -rf target/");
    assert!(
        a.reasons[0].contains("/home/dev/work/nisse/target"),
        "{:?}",
        a.reasons
    );
}

/// Class 3 on the build host, whatever else the line does, with the rule
/// that says so.
const DANGEROUS: [(&str, &str); 33] = [
    ("git push origin HEAD", RULE_PUSH),
    ("git push", RULE_PUSH),
    (
        "cd /home/dev/work/nisse && git push --force origin nisse/issue-3",
        RULE_PUSH,
    ),
    ("git -C /home/dev/work/nisse push -u origin HEAD", RULE_PUSH),
    ("git -c alias.ship=push ship", RULE_PUSH),
    ("git $(echo push)", RULE_PUSH),
    (
        "ssh-agent sh -c 'ssh-add - && git push origin HEAD'",
        RULE_PUSH,
    ),
    ("ssh-agent \"$CMD\"", RULE_PUSH),
    (
        "git remote set-url origin ssh://git@elsewhere/x.git",
        RULE_REMOTE,
    ),
    ("git remote add fork ssh://git@elsewhere/x.git", RULE_REMOTE),
    ("git remote remove origin", RULE_REMOTE),
    (
        "git config remote.origin.url ssh://git@elsewhere/x.git",
        RULE_REMOTE,
    ),
    ("git config --global credential.helper store", RULE_REMOTE),
    (
        "git config set url.ssh://evil/.insteadOf ssh://gitea/",
        RULE_REMOTE,
    ),
    ("git config core.sshCommand 'ssh -i /tmp/k'", RULE_REMOTE),
    ("ssh other-host", RULE_SSH),
    ("ssh other-host ls /", RULE_SSH),
    ("scp target/release/nisse other:/tmp/", RULE_SSH),
    ("rsync -a . backup:/srv/copy", RULE_SSH),
    ("echo 'Host *' >> ~/.ssh/config", RULE_SSH),
    ("cargo publish", RULE_PUBLISH),
    (
        "cd /home/dev/work/nisse && cargo +nightly publish --allow-dirty",
        RULE_PUBLISH,
    ),
    ("docker push registry.example/nisse:latest", RULE_PUBLISH),
    ("rm -rf /", RULE_OUTSIDE),
    ("rm -rf ~", RULE_OUTSIDE),
    ("dd if=/dev/zero of=/dev/sda bs=1M", RULE_OUTSIDE),
    ("rm -rf /home/dev/work/nisse", RULE_OUTSIDE),
    ("rm -rf /home/dev/work/nisse/.git", RULE_OUTSIDE),
    ("rm -rf /home/dev/work/nisse/../other", RULE_OUTSIDE),
    ("rm -rf target/", RULE_OUTSIDE),
    ("cd /home/dev/work/nisse; rm -rf target/", RULE_OUTSIDE),
    ("echo / | xargs rm -rf", RULE_OUTSIDE),
    ("find / -exec rm -rf {} +", RULE_OUTSIDE),
];

#[test]
fn what_reaches_beyond_the_build_host_is_class_3_and_never_in_scope() {
    for (command, rule) in DANGEROUS {
        let a = build(command);
        assert_eq!(
            a.class,
            ActionClass::Dangerous,
            "{command}: {:?}",
            a.reasons
        );
        assert_eq!(a.rule, rule, "{command}: {:?}", a.reasons);
        let action = Action::shell(HOST, command);
        let (fast, permit) = gate(&action, &contained());
        assert_ne!(fast, Some(Verdict::Safe), "{command}");
        assert!(permit.is_err(), "{command}: {permit:?}");
    }
    // The reasons say why, in the build host's terms.
    let a = build("rm -rf target/");
    assert!(a.reasons[0].contains("~/target"), "{:?}", a.reasons);
    let a = build("cd /home/dev/work/nisse; rm -rf target/");
    assert!(a.reasons[0].contains("cd DIR && …"), "{:?}", a.reasons);
    let a = build("rm -rf /home/dev/work/nisse/.git");
    assert!(a.reasons[0].contains("set aside"), "{:?}", a.reasons);
    let a = build("git push origin HEAD");
    assert!(a.reasons[0].contains("harness"), "{:?}", a.reasons);
}

#[test]
fn destruction_the_rules_cannot_place_keeps_its_class() {
    for command in [
        "curl -sSf https://sh.rustup.rs | sh",
        "cat ~/.ssh/id_ed25519",
        "docker system prune -af",
        "reboot",
        "mkfs.ext4 /dev/vdb",
        "git branch -D nisse/issue-2",
        "git update-ref -d refs/nisse/set-aside/item-2/worktree",
        "cd /home/dev/work/nisse && git gc --prune=now",
        "cd /home/dev/work/nisse && git stash drop",
        "eval \"$CMD\"",
        "rm -rf \"$DIR\"",
    ] {
        let a = build(command);
        assert_eq!(
            a.class,
            ActionClass::Dangerous,
            "{command}: {:?}",
            a.reasons
        );
        assert!(permit_in_scope(command).is_err(), "{command}");
    }
    // A line that does not parse is not lowered: the rules cannot read it.
    let a = build("echo 'unterminated");
    assert_eq!(
        (a.class, a.rule.as_str()),
        (ActionClass::Dangerous, "parse.error")
    );
}

fn permit_in_scope(command: &str) -> Result<Basis, Halt> {
    gate(&Action::shell(HOST, command), &contained()).1
}

#[test]
fn directories_are_followed_only_where_the_line_makes_them_certain() {
    for (command, class) in [
        (
            "cd /home/dev/work/nisse && rm -rf target",
            ActionClass::Contained,
        ),
        (
            "cd /home/dev/work/nisse && make && rm -rf target",
            ActionClass::Contained,
        ),
        (
            "cd /home/dev/work/nisse && rm -rf target &",
            ActionClass::Contained,
        ),
        // `;` runs it even when `cd` failed, in the login directory.
        (
            "cd /home/dev/work/nisse; rm -rf target",
            ActionClass::Dangerous,
        ),
        (
            "cd /home/dev/work/nisse || true; rm -rf target",
            ActionClass::Dangerous,
        ),
        (
            "cd /srv || cd /home/dev/work/nisse && rm -rf target",
            ActionClass::Dangerous,
        ),
        // A `cd` in the background changes nothing after it.
        (
            "cd /home/dev/work/nisse & rm -rf target",
            ActionClass::Dangerous,
        ),
        // Directories the walk does not follow leave none known.
        (
            "(cd /home/dev/work/nisse && rm -rf target)",
            ActionClass::Dangerous,
        ),
        (
            "f() { cd /; }; cd /home/dev/work/nisse && f && rm -rf target",
            ActionClass::Dangerous,
        ),
        (
            "cd /home/dev/work/nisse && pushd / && rm -rf target",
            ActionClass::Dangerous,
        ),
        (
            "cd /home/dev/work/nisse && for i in 1; do cd /; done && rm -rf target",
            ActionClass::Dangerous,
        ),
        (
            "cd /home/dev/work/nisse && . ./env.sh && rm -rf target",
            ActionClass::Dangerous,
        ),
        ("cd - && rm -rf target", ActionClass::Dangerous),
        ("cd \"$D\" && rm -rf target", ActionClass::Dangerous),
        (
            "CDPATH=/ && cd /home/dev/work/nisse && cd etc && rm -rf x",
            ActionClass::Dangerous,
        ),
        ("HOME=/etc; rm -rf ~/.cache", ActionClass::Dangerous),
        // A function or a trap runs where it is called, not where it is
        // written; a `cd` function is not `cd`.
        (
            "cd /home/dev/work/nisse && g() { rm -rf target; }; cd / && g",
            ActionClass::Dangerous,
        ),
        (
            "cd /home/dev/work/nisse && trap 'rm -rf target' EXIT && cd /",
            ActionClass::Dangerous,
        ),
        ("trap 'rm -rf /' EXIT", ActionClass::Dangerous),
        (
            "cd() { :; }; cd /home/dev/work/nisse && rm -rf target",
            ActionClass::Dangerous,
        ),
        (
            "trap 'rm -rf /home/dev/work/nisse/target' EXIT; cargo build",
            ActionClass::Contained,
        ),
        // Absolute paths do not depend on it.
        (
            "cd \"$D\"; rm -rf /home/dev/work/nisse/target",
            ActionClass::Contained,
        ),
        // A wrapper that can change directory: absolute paths only.
        (
            "cd /home/dev/work/nisse && sudo rm -rf target",
            ActionClass::Dangerous,
        ),
        (
            "sudo rm -rf /home/dev/work/nisse/target",
            ActionClass::Contained,
        ),
        (
            "cd /home/dev/work/nisse && nice rm -rf target",
            ActionClass::Contained,
        ),
        ("chroot /srv rm -rf /tmp/x", ActionClass::Dangerous),
        // Patterns that can reach `.`, `..` or `.git`.
        ("rm -rf /home/dev/work/nisse/.*", ActionClass::Dangerous),
        ("rm -rf /home/dev/work/nisse/.g*", ActionClass::Dangerous),
        (
            "rm -rf /home/dev/work/nisse/{a,/../..}",
            ActionClass::Dangerous,
        ),
        ("rm -rf /home/dev/work/nisse/*", ActionClass::Contained),
        ("rm -rf /tmp", ActionClass::Dangerous),
    ] {
        let a = build(command);
        assert_eq!(a.class, class, "{command}: {:?}", a.reasons);
    }
}

#[test]
fn file_tools_write_the_workspace_as_class_2() {
    let file = |tool: &str, args: serde_json::Value| Action::new(tool, HOST, &args).unwrap();
    let p = policy();
    let write = file(
        "file.write",
        json!({"path": "/home/dev/work/nisse/src/lib.rs", "content": "fn main() {}\n"}),
    );
    let a = p.assess(&write, None);
    assert_eq!(
        (a.class, a.rule.as_str()),
        (ActionClass::Contained, RULE_CONTAINED)
    );
    assert_eq!(gate(&write, &contained()).1, Ok(Basis::ContainedInScope));
    assert!(gate(&write, &[]).1.is_err());
    // Outside the workspace, and the workspace's root, the usual rules.
    for path in [
        "/etc/hosts",
        "/tmp/notes",
        "/home/dev/work/nisse",
        "/home/dev/work/nisse-old/x",
    ] {
        let a = p.assess(
            &file("file.write", json!({"path": path, "content": "x"})),
            None,
        );
        assert_eq!(a.class, ActionClass::Dangerous, "{path}");
        assert_eq!(a.build_host, None, "{path}");
    }
    // Reading is reading; reading a key is not.
    let a = p.assess(
        &file(
            "file.read",
            json!({"path": "/home/dev/work/nisse/Cargo.toml"}),
        ),
        None,
    );
    assert_eq!(a.class, ActionClass::NoSideEffects);
    let a = p.assess(
        &file("file.read", json!({"path": "/home/dev/.ssh/id_ed25519"})),
        None,
    );
    assert_eq!(a.class, ActionClass::Dangerous);
    // A declared risk still raises.
    let a = p.assess(&write, Some(RiskClass::Destructive));
    assert_eq!(a.class, ActionClass::Dangerous);
}

#[test]
fn a_protected_or_never_build_host_keeps_the_usual_rules() {
    for section in ["protected", "never"] {
        let text = format!(
            "version = 1\n[[{section}]]\ntargets = [\"build-*\"]\nreason = \"release host\"\n"
        );
        let p = Policy::with_file("site.toml", &text)
            .unwrap()
            .with_build_hosts(vec![build_host()])
            .unwrap();
        let a = p.assess(&Action::shell(HOST, "sed -i s/a/b/ src/lib.rs"), None);
        assert_eq!(a.class, ActionClass::Dangerous, "{section}");
        assert_eq!(a.build_host, None, "{section}");
        assert!(
            a.reasons.iter().any(|r| r.contains("usual rules")),
            "{section}: {:?}",
            a.reasons
        );
        let a = p.assess(&Action::shell(HOST, "cargo test --workspace"), None);
        assert_eq!(a.class, ActionClass::Dangerous, "{section}: tests too");
    }
}

#[test]
fn the_kill_switches_stop_class_2_in_scope() {
    let action = Action::shell(HOST, "sed -i s/a/b/ src/lib.rs");
    let off = Switches {
        autonomy: Autonomy::Off,
        never: vec![],
    };
    let (fast, permit) = gate_with(&action, &contained(), &off);
    assert_eq!(fast, Some(Verdict::NeedsDiscussion));
    assert!(matches!(permit, Err(Halt::NeedsDiscussion(r)) if r.contains("autonomy")));
    let never = Switches {
        autonomy: Autonomy::On,
        never: vec![Never {
            target: HOST.into(),
            reason: "being rebuilt".into(),
        }],
    };
    let (fast, permit) = gate_with(&action, &contained(), &never);
    assert_eq!(fast, Some(Verdict::NeedsDiscussion));
    assert!(matches!(permit, Err(Halt::Refused(r)) if r.contains("being rebuilt")));
}

#[test]
fn an_approved_step_still_comes_first_and_class_3_needs_one() {
    let p = policy();
    let steps = [crate::Step {
        action: Action::shell(HOST, "git push origin HEAD"),
        precondition: None,
        expected: None,
        retries: 0,
    }];
    let plan = ApprovedPlan {
        revision: 4,
        steps: &steps,
        done: 0,
    };
    let hosts = contained();
    let scope = Scope {
        plan: Some(plan),
        operator_confirmed: false,
        contained: &hosts,
    };
    let switches = Switches::default();
    let request = |action: &Action, assessment: &Assessment| {
        Permit::issue(PermitRequest {
            action,
            risk: assessment.risk,
            class: assessment.class,
            targets: &assessment.targets,
            verdict: Verdict::DangerousInScope,
            switches: &switches,
            scope,
        })
        .map(|p| p.basis())
    };
    // The push is class 3: only the approved step names it.
    let push = Action::shell(HOST, "git push origin HEAD");
    assert_eq!(
        request(&push, &p.assess(&push, None)),
        Ok(Basis::Step {
            revision: 4,
            step: 0
        })
    );
    let other = Action::shell(HOST, "git push origin main");
    assert!(request(&other, &p.assess(&other, None)).is_err());
    // A contained edit beside the plan is in scope.
    let edit = Action::shell(HOST, "sed -i s/a/b/ src/lib.rs");
    assert_eq!(
        request(&edit, &p.assess(&edit, None)),
        Ok(Basis::ContainedInScope)
    );
}

/// Class-3 patterns, and what surrounds them in a line.
const PATTERNS: [&str; 10] = [
    "git push origin HEAD",
    "git push --force",
    "git remote set-url origin x",
    "git config --global credential.helper store",
    "ssh other-host",
    "scp f other:",
    "rm -rf /",
    "rm -rf ~",
    "dd if=/dev/zero of=/dev/vda",
    "cargo publish",
];

const FILLERS: [&str; 8] = [
    "cargo test --workspace",
    "cd /home/dev/work/nisse",
    "sed -i s/a/b/ src/lib.rs",
    "rm -rf /home/dev/work/nisse/target",
    "git status",
    "pip install x",
    "true",
    "ls",
];

fn wrap(pattern: &str, how: usize, filler: &str) -> String {
    match how {
        0 => format!("{filler} && {pattern}"),
        1 => format!("{pattern}; {filler}"),
        2 => format!("{filler} || {pattern}"),
        3 => format!("echo $({pattern})"),
        4 => format!("sh -c '{}'", pattern.replace('\'', "'\\''")),
        5 => format!("sudo {pattern}"),
        6 => format!("( {filler}; {pattern} )"),
        7 => format!("if {filler}; then {pattern}; fi"),
        8 => format!("{filler} | {pattern}"),
        9 => format!("timeout 60 {pattern}"),
        10 => format!("{{ {pattern}; }} & wait"),
        11 => format!("ssh-agent sh -c '{}'", pattern.replace('\'', "'\\''")),
        _ => format!("cd /home/dev/work/nisse && {pattern}"),
    }
}

proptest! {
    /// No line is assessed below class 3 on a build host when it holds a
    /// class-3 pattern, wherever the pattern sits.
    #[test]
    fn no_line_with_a_class_3_pattern_is_lowered(
        pattern in prop::sample::select(PATTERNS.to_vec()),
        filler in prop::sample::select(FILLERS.to_vec()),
        how in 0usize..13,
        depth in 0usize..3,
    ) {
        let mut line = pattern.to_string();
        for _ in 0..=depth {
            line = wrap(&line, how, filler);
        }
        let a = build(&line);
        prop_assert_eq!(a.class, ActionClass::Dangerous, "{}: {:?}", line, a.reasons);
        // Decided by a dev rule, not by a line that failed to parse.
        prop_assert!(a.rule.starts_with("dev."), "{}: {}", line, a.rule);
        let (fast, permit) = gate(&Action::shell(HOST, &line), &contained());
        prop_assert_ne!(fast, Some(Verdict::Safe));
        prop_assert!(permit.is_err());
    }

    /// On a build host the dev rules never lower a line below what they
    /// allow: at most class 2 for what the shell classifier calls a write,
    /// class 1 only for reading and declared tests; and on any other host
    /// nothing changes.
    #[test]
    fn the_build_host_never_lowers_below_its_rules(
        first in prop::sample::select(CONTAINED.to_vec()),
        second in prop::sample::select(FILLERS.to_vec()),
    ) {
        let line = format!("{first} && {second}");
        let a = build(&line);
        let report = policy().classify_command(&line);
        if report.risk > RiskClass::ReadOnly {
            prop_assert!(a.class >= ActionClass::Contained, "{}", line);
        }
        let ops = Policy::builtin().unwrap().assess(&Action::shell("web1", &line), None);
        prop_assert_eq!(on("web1", &line), ops);
    }
}

/// The harness's git lines: the only class-2 pushes, and the only lines
/// the push key reaches, by being exactly what the policy builds.
mod harness_lines {
    use super::*;
    use crate::SecretRefusal;
    use crate::dev::harness::KEY_REFUSED_EXIT;
    use crate::dev::{GitNetwork, RULE_HARNESS_GIT};

    const KEY: &str = "nisse-push-key";

    fn push(branch: &str) -> GitNetwork {
        GitNetwork::Push {
            branch: branch.into(),
        }
    }

    fn keyed(host: &str, command: &str) -> Action {
        Action::new(
            "shell",
            host,
            &json!({ "command": command, "secrets": [KEY] }),
        )
        .unwrap()
    }

    #[test]
    fn the_harness_lines_are_class_2_and_recognised_only_exactly() {
        let host = policy().build_host(HOST).unwrap().clone();
        let fetch = host.git_network_line(&GitNetwork::Fetch).unwrap();
        let pushed = host.git_network_line(&push("nisse/issue-14")).unwrap();
        assert!(fetch.contains(&format!("exit {KEY_REFUSED_EXIT}")));
        for (line, op) in [
            (&fetch, GitNetwork::Fetch),
            (&pushed, push("nisse/issue-14")),
        ] {
            assert_eq!(host.git_network_op(line), Some(op));
            let a = build(line);
            assert_eq!(a.class, ActionClass::Contained, "{a:#?}");
            assert_eq!(a.rule, RULE_HARNESS_GIT);
        }
        // Only the agent's own branches, never the default branch or a
        // name git would read otherwise.
        for branch in ["main", "nisse/", "nisse/../main", "nisse/a b", "feature/x"] {
            assert_eq!(host.git_network_line(&push(branch)), None, "{branch}");
        }
        // Any other push, however close, is the usual class 3 push.
        for line in [
            pushed.replace("push -q", "push -q --force"),
            pushed.replace(
                "HEAD:refs/heads/nisse/issue-14",
                "+HEAD:refs/heads/nisse/issue-14",
            ),
            pushed.replace("HEAD:refs/heads/nisse/issue-14", "HEAD:refs/heads/main"),
            pushed.replace("nisse/issue-14", "nisse/issue-14 HEAD:refs/heads/main"),
            pushed.replace("gitea.lan", "evil.example"),
            format!("{pushed}; git push origin main"),
            pushed.replacen("&& cd", "&&  cd", 1),
        ] {
            assert_eq!(host.git_network_op(&line), None, "{line}");
            let a = build(&line);
            assert_eq!(a.class, ActionClass::Dangerous, "{line}\n{a:#?}");
        }
        // The same line on another host is nothing special there.
        assert_ne!(on("web1", &fetch).rule, RULE_HARNESS_GIT);
        // A build host without git has no lines.
        let bare = BuildHost {
            git: None,
            ..build_host()
        };
        assert_eq!(bare.git_network_line(&GitNetwork::Fetch), None);
    }

    #[test]
    fn the_push_key_reaches_the_harness_lines_alone_whatever_the_grants_say() {
        // An operator's grant naming the key for `ssh-agent` does not widen
        // what the build host's push key reaches.
        let policy = Policy::with_file(
            "site.toml",
            &format!(
                "version = 1\n\n[[secret]]\nname = \"{KEY}\"\ncommands = [\"ssh-agent\", \"git\"]\n"
            ),
        )
        .unwrap()
        .with_build_hosts(vec![build_host()])
        .unwrap();
        let host = policy.build_host(HOST).unwrap().clone();
        for op in [GitNetwork::Fetch, push("nisse/issue-14-tests")] {
            let line = host.git_network_line(&op).unwrap();
            assert_eq!(policy.secret_grant(&keyed(HOST, &line), KEY), Ok(()));
            // Not on another host.
            assert!(matches!(
                policy.secret_grant(&keyed("web1", &line), KEY),
                Err(SecretRefusal::HarnessOnly { .. })
            ));
        }
        for line in [
            "ssh-agent sh -c 'ssh-add -q - && cat'",
            "git push origin HEAD",
            "cd /home/dev/work/nisse && ssh-agent sh -c 'ssh-add -q - && git fetch -q origin'",
        ] {
            let refused = policy.secret_grant(&keyed(HOST, line), KEY).unwrap_err();
            assert!(
                matches!(refused, SecretRefusal::HarnessOnly { ref host, .. } if host == HOST),
                "{line}: {refused:?}"
            );
            assert!(refused.to_string().contains("only the harness's own"));
        }
    }
}

/// What the harness records as installed on a build host (D3): package
/// and toolchain managers' installs wherever the classifier finds them;
/// a project's own dependencies, reads and look-alikes are not.
#[test]
fn installs_are_found_wherever_the_shell_runs_them() {
    let p = policy();
    for (line, found) in [
        ("sudo apt-get install -y jq", vec!["apt-get install -y jq"]),
        (
            "cd /w && pip install requests && python3 -m pip install --user ruff",
            vec!["pip install requests", "python3 -m pip install --user ruff"],
        ),
        (
            "sh -c 'cargo install cargo-nextest'",
            vec!["cargo install cargo-nextest"],
        ),
        (
            "rustup toolchain install stable",
            vec!["rustup toolchain install stable"],
        ),
        (
            "rustup component add clippy",
            vec!["rustup component add clippy"],
        ),
        ("npm install -g pnpm", vec!["npm install -g pnpm"]),
        ("apk add --no-cache git", vec!["apk add --no-cache git"]),
    ] {
        assert_eq!(p.installs(line), found, "{line}");
    }
    for line in [
        "npm install",
        "apt-get update",
        "apt list --installed",
        "pip list",
        "echo apt-get install jq",
        "cargo build --release",
        "rustup toolchain list",
    ] {
        assert_eq!(p.installs(line), Vec::<String>::new(), "{line}");
    }
}

/// What the harness reports as repairs of a build host's environment
/// (D3): caches and build artifacts cleaned, dependencies reinstalled,
/// wherever the classifier finds them. Each runs in scope without a plan,
/// as class 2 (or a read), never more.
#[test]
fn repairs_are_found_and_run_in_scope_on_the_build_host() {
    let p = policy();
    for (line, found) in [
        (
            format!("cd {WS} && cargo clean"),
            vec!["cargo clean".to_string()],
        ),
        (
            format!("cd {WS} && find . -name '*.pyc' -delete"),
            vec!["find . -name *.pyc -delete".to_string()],
        ),
        (
            format!("cd {WS} && rm -rf {WS}/target {WS}/node_modules/.cache"),
            vec![format!("rm -rf {WS}/target {WS}/node_modules/.cache")],
        ),
        (
            format!("cd {WS} && npm ci && pip cache purge"),
            vec!["npm ci".to_string(), "pip cache purge".to_string()],
        ),
        (
            format!("cd {WS} && python3 -m pip install --force-reinstall -r requirements.txt"),
            vec!["python3 -m pip install --force-reinstall -r requirements.txt".to_string()],
        ),
        (
            "sudo apt-get install --reinstall -y python3-venv".to_string(),
            vec!["apt-get install --reinstall -y python3-venv".to_string()],
        ),
        (
            "go clean -cache".to_string(),
            vec!["go clean -cache".to_string()],
        ),
    ] {
        assert_eq!(p.repairs(&line), found, "{line}");
        let (fast, permit) = gate(&Action::shell(HOST, &line), &contained());
        assert_eq!(fast, Some(Verdict::Safe), "{line}");
        assert!(
            matches!(permit, Ok(Basis::ContainedInScope | Basis::ReadOnly)),
            "{line}: {permit:?}"
        );
    }
    for line in [
        format!("cd {WS} && rm -rf src"),
        format!("cd {WS} && cargo build"),
        "npm install".to_string(),
        "pip install requests".to_string(),
        "apt-get install jq".to_string(),
        "echo cargo clean".to_string(),
        format!("cd {WS} && find . -name '*.rs' -delete"),
    ] {
        assert_eq!(p.repairs(&line), Vec::<String>::new(), "{line}");
    }
}
