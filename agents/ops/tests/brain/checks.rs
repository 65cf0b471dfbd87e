//! Scheduled checks in the ops brain, on a real state store: duties as
//! loaded from entries and files, runs started by due messages and by the
//! operator, the prober's and the executor's answers (with the real
//! classifier's verdicts in between for host checks), findings counted
//! towards an item and its recovery, runs that get no answer, a rule that
//! puts an alert and a check on one item, and the stale sweep.

use std::collections::BTreeMap;
use std::path::Path;

use nisse_bus::proto::{
    self, ClassifyRequest, ExecStatus, HostBinding, ProbeRequest, operator_command::Command,
};
use nisse_ops::FingerprintRule;
use nisse_ops::checks::{Check, Duty, DutyEntry, DutyState, Judge, Sources, load};
use nisse_policy::Policy;
use sha2::Digest as _;

use super::gates::Gates;
use super::rig::{OP, at, at_secs};
use super::*;
use pretty_assertions::assert_eq;

/// Duty entries, each written as a duty's TOML file is.
fn entries(tables: &[&str]) -> Vec<DutyEntry> {
    tables
        .iter()
        .map(|t| toml::from_str(t).unwrap_or_else(|e| panic!("{t}: {e}")))
        .collect()
}

/// `[[ops.duty]]` as `tables`, nothing else.
fn sources(entries: &[DutyEntry]) -> Sources<'_> {
    Sources {
        entries,
        prefix: "ops.duty",
        dir: None,
        hosts: &[],
        starters: false,
        tool_hosts: &[],
    }
}

fn policy() -> Policy {
    Policy::builtin().unwrap()
}

/// Loads `tables` alone.
fn loaded(tables: &[&str]) -> Result<Vec<Duty>, Vec<String>> {
    load(sources(&entries(tables)), &policy())
}

/// The one problem loading `table` alone has.
fn refused(table: &str) -> String {
    let mut problems = loaded(&[table]).unwrap_err();
    assert_eq!(problems.len(), 1, "{problems:#?}");
    problems.remove(0)
}

const WEB: &str = r#"
name = "web"
kind = "http"
url = "https://web.example:8443/health?full=1"
expect-status = [200]
severity = "critical"
"#;

const DISK_CHECK: &str = r#"
name = "nas-disk"
kind = "disk"
host = "nas01"
mount = "/srv"
max-used-percent = 90
fail-after = 1
"#;

const NGINX: &str = r#"
name = "nginx"
kind = "ssh-script"
host = "web1"
command = "systemctl is-active nginx"
fail-after = 1
"#;

fn config() -> Config {
    Config {
        operators: vec![OP.into()],
        ..Config::default()
    }
}

/// The ops brain with `config` and the duties `tables`, with the services
/// around it.
fn duties(config: Config, tables: &[&str]) -> Gates {
    let duties = loaded(tables).unwrap();
    Gates::around(Harness::new(
        "ops",
        OpsBrain::new("ops", config).with_duties(duties),
    ))
}

/// What the brain keeps about duty `name`.
fn state(g: &Gates, name: &str) -> DutyState {
    let (_, text) =
        g.h.store
            .duty_states()
            .unwrap()
            .into_iter()
            .find(|(n, _)| n == name)
            .unwrap_or_else(|| panic!("duty {name} has no state"));
    serde_json::from_str(&text).unwrap()
}

/// The findings on `item`: (duty, status).
fn findings(g: &Gates, item: &str) -> Vec<(String, String)> {
    g.h.logged(item, |e| match e {
        Event::Finding { duty, status, .. } => Some((duty, status)),
        _ => None,
    })
}

/// The details of the findings on `item`.
fn details(g: &Gates, item: &str) -> Vec<serde_json::Value> {
    g.h.logged(item, |e| match e {
        Event::Finding { detail, .. } => Some(detail),
        _ => None,
    })
}

fn said(g: &Gates) -> Vec<String> {
    g.h.outbound().into_iter().map(|m| m.markdown).collect()
}

fn last_probe(g: &Gates) -> ProbeRequest {
    g.h.emitted::<ProbeRequest>().pop().unwrap()
}

/// Duty `web` is due at `minute`; the prober answers at once.
fn web_run(g: &mut Gates, minute: i64, healthy: bool) {
    g.h.duty_due(at(minute), "web", 60_000);
    let request = last_probe(g);
    let (summary, code) = if healthy {
        ("HTTP 200 in 12 ms", 200)
    } else {
        ("HTTP 500, expected 200", 500)
    };
    g.h.probe_result(at(minute), &request, healthy, summary, Some(code));
}

/// A check's own fingerprint: its name, kind and target, hashed.
fn fingerprint(name: &str, kind: &str, target: &str) -> String {
    let mut hash = sha2::Sha256::new();
    for part in [name, kind, target] {
        hash.update((part.len() as u64).to_be_bytes());
        hash.update(part.as_bytes());
    }
    let digest = hash.finalize();
    let hex: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
    format!("duty-{hex}")
}

#[test]
fn each_kind_of_duty_loads_with_its_own_fields() {
    let duties = loaded(&[
        WEB,
        r#"
name = "db"
kind = "tcp"
host = "db1"
port = 5432
interval = "30s"
"#,
        r#"
name = "cert"
kind = "tls"
host = "web.example"
min-days-left = 7
"#,
        r#"
name = "nas-ping"
kind = "ping"
host = "nas01"
from = "tools"
count = 2
timeout = "5s"
"#,
        DISK_CHECK,
        r#"
name = "nginx"
kind = "ssh-script"
host = "web1"
command = "systemctl is-active nginx"
expect-exit = 0
output-contains = "active"
fail-after = 3
recover-after = 4
"#,
    ])
    .unwrap();
    let by_name: BTreeMap<&str, &Duty> = duties.iter().map(|d| (d.name.as_str(), d)).collect();
    assert_eq!(
        by_name.keys().copied().collect::<Vec<_>>(),
        ["cert", "db", "nas-disk", "nas-ping", "nginx", "web"],
        "in name order"
    );
    let web = by_name["web"];
    assert_eq!(
        web.check,
        Check::Http {
            url: "https://web.example:8443/health?full=1".into(),
            expect_status: vec![200],
            body_contains: None,
            max_latency: None,
            follow_redirects: true,
            ca_file: None,
        }
    );
    assert_eq!(
        (
            web.interval,
            web.timeout,
            web.severity.as_str(),
            web.fail_after,
            web.recover_after,
            web.starter
        ),
        (
            Duration::from_secs(60),
            Duration::from_secs(10),
            "critical",
            2,
            2,
            false
        ),
        "the defaults"
    );
    assert_eq!(
        by_name["db"].check,
        Check::Tcp {
            host: "db1".into(),
            port: 5432
        }
    );
    assert_eq!(by_name["db"].interval, Duration::from_secs(30));
    assert_eq!(
        by_name["cert"].check,
        Check::Tls {
            host: "web.example".into(),
            port: 443,
            server_name: "web.example".into(),
            min_days_left: 7,
            ca_file: None,
        }
    );
    assert_eq!(
        by_name["nas-ping"].check,
        Check::Host {
            host: "tools".into(),
            command: "ping -c 2 -w 5 -- nas01".into(),
            judge: Judge::Ping {
                target: "nas01".into()
            },
        }
    );
    assert_eq!(
        by_name["nas-disk"].check,
        Check::Host {
            host: "nas01".into(),
            command: "df -P -- /srv".into(),
            judge: Judge::Disk {
                mount: "/srv".into(),
                max_used_percent: 90
            },
        }
    );
    assert_eq!(by_name["nas-disk"].check.target(), "nas01:/srv");
    let nginx = by_name["nginx"];
    assert_eq!(
        nginx.check,
        Check::Host {
            host: "web1".into(),
            command: "systemctl is-active nginx".into(),
            judge: Judge::Script {
                expect_exit: 0,
                output_contains: Some("active".into())
            },
        }
    );
    assert_eq!((nginx.fail_after, nginx.recover_after), (3, 4));
}

#[test]
fn a_duty_that_is_not_well_formed_is_refused_with_its_name_and_the_reason() {
    assert_eq!(
        refused("name = \"web\"\nkind = \"http\"\nurl = \"https://web.example\"\nport = 80\n"),
        "ops.duty[0] (`web`): `port` is not a field of http duties"
    );
    assert_eq!(
        refused("name = \"db\"\nkind = \"tcp\"\nhost = \"db1\"\nurl = \"https://db1\"\n"),
        "ops.duty[0] (`db`): `url` is not a field of tcp duties"
    );
    assert_eq!(
        refused("name = \"web\"\nkind = \"http\"\n"),
        "ops.duty[0] (`web`): http duties need `url`"
    );
    assert_eq!(
        refused("name = \"db\"\nkind = \"tcp\"\nhost = \"db1\"\n"),
        "ops.duty[0] (`db`): tcp duties need `port` (1-65535)"
    );
    assert_eq!(
        refused("name = \"nas\"\nkind = \"disk\"\n"),
        "ops.duty[0] (`nas`): disk duties need `host`"
    );
    assert_eq!(
        refused("name = \"Web_1\"\nkind = \"http\"\nurl = \"https://web.example\"\n"),
        "ops.duty[0] (`Web_1`): a duty's name is lowercase letters, digits and `-`, at most 64 characters"
    );
    assert_eq!(
        refused("name = \"web\"\nkind = \"smtp\"\n"),
        "ops.duty[0] (`web`): kind `smtp` is not one of http, tcp, tls, ping, disk, ssh-script"
    );
    // A command that is not read-only never becomes a duty.
    for command in ["rm -rf /var/lib/x", "systemctl restart nginx"] {
        let problem = refused(&format!(
            "name = \"bad\"\nkind = \"ssh-script\"\nhost = \"web1\"\ncommand = \"{command}\"\n"
        ));
        assert!(
            problem.starts_with(&format!(
                "ops.duty[0] (`bad`): its command `{command}` is not read-only ("
            )) && problem.contains("a duty only looks"),
            "{problem}"
        );
    }
    // Every problem is told at once, and nothing is loaded.
    let problems = loaded(&[
        "name = \"web\"\nkind = \"http\"\n",
        "name = \"db\"\nkind = \"tcp\"\nhost = \"db1\"\nport = 5432\n",
        "name = \"db\"\nkind = \"tcp\"\nhost = \"db2\"\nport = 5432\n",
    ])
    .unwrap_err();
    assert_eq!(
        problems,
        [
            "ops.duty[0] (`web`): http duties need `url`",
            "ops.duty[2]: a duty named `db` is already defined by ops.duty[1]",
        ]
    );
}

fn write(dir: &Path, file: &str, text: &str) {
    std::fs::write(dir.join(file), text).unwrap();
}

#[test]
fn a_duties_dir_holds_one_duty_per_file_named_by_its_stem() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "api.toml",
        "kind = \"http\"\nurl = \"https://api.example/health\"\n",
    );
    write(
        dir.path(),
        "named.toml",
        "name = \"db\"\nkind = \"tcp\"\nhost = \"db1\"\nport = 5432\n",
    );
    write(dir.path(), "README.md", "not a duty");
    let none = Vec::new();
    let duties = load(
        Sources {
            dir: Some(dir.path()),
            ..sources(&none)
        },
        &policy(),
    )
    .unwrap();
    let names: Vec<&str> = duties.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, ["api", "db"]);

    // A file's duty and an entry of one name: refused, naming both.
    write(
        dir.path(),
        "web.toml",
        "kind = \"http\"\nurl = \"https://web.example\"\n",
    );
    let configured = entries(&[WEB]);
    let problems = load(
        Sources {
            dir: Some(dir.path()),
            ..sources(&configured)
        },
        &policy(),
    )
    .unwrap_err();
    let file = dir.path().join("web.toml");
    assert_eq!(
        problems,
        [format!(
            "{}: a duty named `web` is already defined by ops.duty[0]",
            file.display()
        )]
    );

    // A file that does not parse is named.
    write(dir.path(), "web.toml", "kind = \"http\"\nurl = 3\n");
    let problems = load(
        Sources {
            dir: Some(dir.path()),
            ..sources(&none)
        },
        &policy(),
    )
    .unwrap_err();
    assert_eq!(problems.len(), 1);
    assert!(
        problems[0].starts_with(&format!("{}: ", file.display())) && problems[0].contains("url"),
        "{problems:?}"
    );
}

#[test]
fn each_host_gets_starter_duties_an_entry_turns_off_or_replaces() {
    let hosts = ["nas01".to_string(), "web1".to_string()];
    let none = Vec::new();
    let starters = |entries| Sources {
        hosts: &hosts,
        starters: true,
        ..sources(entries)
    };
    let duties = load(starters(&none), &policy()).unwrap();
    let summary: Vec<(&str, &str, String, u64, bool)> = duties
        .iter()
        .map(|d| {
            (
                d.name.as_str(),
                d.check.kind(),
                d.check.target(),
                d.interval.as_secs(),
                d.starter,
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            ("nas01-root-disk", "disk", "nas01:/".to_string(), 900, true),
            ("nas01-ssh", "ssh-script", "nas01".to_string(), 300, true),
            ("web1-root-disk", "disk", "web1:/".to_string(), 900, true),
            ("web1-ssh", "ssh-script", "web1".to_string(), 300, true),
        ]
    );
    assert_eq!(
        nisse_ops::checks::starter_names("nas01"),
        ["nas01-ssh", "nas01-root-disk"]
    );

    // One turned off by its name alone, one replaced by an entry of the
    // same name.
    let configured = entries(&[
        "name = \"nas01-ssh\"\nenabled = false\n",
        "name = \"web1-root-disk\"\nkind = \"disk\"\nhost = \"web1\"\nmax-used-percent = 80\n",
    ]);
    let duties = load(starters(&configured), &policy()).unwrap();
    let names: Vec<(&str, bool)> = duties
        .iter()
        .map(|d| (d.name.as_str(), d.starter))
        .collect();
    assert_eq!(
        names,
        [
            ("nas01-root-disk", true),
            ("web1-root-disk", false),
            ("web1-ssh", true)
        ]
    );
    let replaced = duties.iter().find(|d| d.name == "web1-root-disk").unwrap();
    assert_eq!(
        replaced.check,
        Check::Host {
            host: "web1".into(),
            command: "df -P -- /".into(),
            judge: Judge::Disk {
                mount: "/".into(),
                max_used_percent: 80
            },
        }
    );
    // Off: no starter duties at all.
    let duties = load(
        Sources {
            starters: false,
            ..starters(&none)
        },
        &policy(),
    )
    .unwrap();
    assert!(duties.is_empty());
    // An entry without its kind that is not turning anything off.
    let problems = load(
        starters(&entries(&["name = \"web1-ssh\"\nhost = \"web1\"\n"])),
        &policy(),
    )
    .unwrap_err();
    assert_eq!(
        problems,
        [
            "ops.duty[0] (`web1-ssh`): a duty needs `kind`: one of http, tcp, tls, ping, disk, ssh-script"
        ]
    );
}

#[test]
fn an_http_check_opens_one_item_after_fail_after_failures_and_closes_on_recovery() {
    let mut g = duties(config(), &[WEB]);
    g.h.duty_due(at(1), "web", 60_000);
    let request = last_probe(&g);
    assert_eq!(
        request,
        ProbeRequest {
            envelope: request.envelope.clone(),
            request_id: "duty-web:1".into(),
            duty: "web".into(),
            timeout_ms: 10_000,
            check: Some(proto::probe_request::Check::Http(proto::HttpProbe {
                url: "https://web.example:8443/health?full=1".into(),
                expect_status: vec![200],
                body_contains: String::new(),
                max_latency_ms: 0,
                follow_redirects: true,
                ca_file: String::new(),
            })),
        }
    );
    let envelope = request.envelope.clone().unwrap();
    assert_eq!(
        (envelope.work_item_id.as_str(), envelope.message_id.as_str()),
        ("duty-web", "probe-req:duty-web:1")
    );

    // One failure opens nothing.
    g.h.probe_result(at(1), &request, false, "HTTP 500, expected 200", Some(500));
    assert!(g.h.items().is_empty());
    assert!(said(&g).is_empty());
    let s = state(&g, "web");
    assert_eq!((s.runs, s.failures, s.failing), (1, 1, false));
    assert!(s.in_flight.is_none());

    // The second in a row opens one item.
    web_run(&mut g, 2, false);
    let items = g.h.items();
    assert_eq!(items.len(), 1);
    let item = &items[0];
    assert_eq!(item.title, "web failing: HTTP 500, expected 200");
    assert_eq!(item.severity.as_deref(), Some("critical"));
    assert_eq!(item.scope, "web.example:8443");
    assert_eq!(item.source, "duty web");
    assert_eq!(
        item.fingerprint.as_deref(),
        Some(fingerprint("web", "http", "https://web.example:8443/health?full=1").as_str())
    );
    assert_eq!(item.state, State::Active);
    assert_eq!(findings(&g, &item.id), [("web".into(), "firing".into())]);
    let opened = said(&g);
    assert_eq!(opened.len(), 1);
    assert!(
        opened[0].contains("web failing: HTTP 500, expected 200")
            && opened[0].contains("severity **critical**")
            && opened[0].contains("from duty web."),
        "{}",
        opened[0]
    );

    // Further failures repeat on it; no second item.
    web_run(&mut g, 3, false);
    web_run(&mut g, 4, false);
    assert_eq!(g.h.items().len(), 1);
    assert_eq!(
        findings(&g, &item.id),
        [
            ("web".into(), "firing".into()),
            ("web".into(), "repeat".into()),
            ("web".into(), "repeat".into())
        ]
    );
    assert_eq!(said(&g).len(), 1, "a repeat is not announced");

    // One pass is not a recovery; the second in a row is.
    web_run(&mut g, 5, true);
    assert_eq!(findings(&g, &item.id).len(), 3);
    assert_eq!(g.h.items()[0].state, State::Active);
    web_run(&mut g, 6, true);
    let closed = &g.h.items()[0];
    assert_eq!(closed.state, State::Closed);
    assert_eq!(
        findings(&g, &item.id).last().unwrap(),
        &("web".to_string(), "resolved".to_string())
    );
    let evidence = details(&g, &item.id).pop().unwrap();
    assert_eq!(evidence["summary"], "HTTP 200 in 12 ms");
    assert_eq!(evidence["status_code"], 200);
    assert_eq!(evidence["target"], "https://web.example:8443/health?full=1");
    assert_eq!(evidence["run"], 6);
    assert_eq!(evidence["successes_in_row"], 2);
    let told = said(&g);
    assert_eq!(told.len(), 2);
    assert_eq!(
        told[1],
        "✅ **web failing** resolved; item **#1** is closed."
    );

    // Failing again within the flap window reopens it, at fail-after.
    web_run(&mut g, 10, false);
    assert_eq!(g.h.items()[0].state, State::Closed);
    web_run(&mut g, 11, false);
    let items = g.h.items();
    assert_eq!(items.len(), 1, "reopened, not a new item");
    assert!(items[0].state.is_open());
    assert_eq!(
        findings(&g, &item.id).last().unwrap(),
        &("web".to_string(), "firing".to_string())
    );
    let told = said(&g);
    assert_eq!(
        told[2],
        "🔁 **web failing: HTTP 500, expected 200** fired again; item **#1** is reopened (flap 1)."
    );
    assert!(
        told[3].starts_with("▶️ Now working on item **#1**"),
        "{told:?}"
    );
    let s = state(&g, "web");
    assert_eq!(
        (s.runs, s.failures, s.successes, s.failing),
        (8, 2, 0, true)
    );

    // A rebuild from the stream reaches the same state, the duties' too.
    let replay =
        g.h.replay(OpsBrain::new("ops", config()).with_duties(loaded(&[WEB]).unwrap()));
    assert_eq!(
        replay.store.snapshot().unwrap(),
        g.h.store.snapshot().unwrap()
    );
    assert_eq!(
        replay.store.duty_states().unwrap(),
        g.h.store.duty_states().unwrap()
    );
    let ids =
        |o: Vec<nisse_core::Outgoing>| o.into_iter().map(|o| o.message_id).collect::<Vec<_>>();
    assert_eq!(
        ids(replay.store.outbox().unwrap()),
        ids(g.h.store.outbox().unwrap())
    );
    assert_eq!(replay.store.outbox().unwrap(), g.h.store.outbox().unwrap());
}

#[test]
fn a_due_duty_with_a_run_in_flight_is_skipped_and_a_run_with_no_answer_counts_neither_way() {
    let mut g = duties(config(), &[WEB]);
    g.h.duty_due(at_secs(60), "web", 60_000);
    let first = last_probe(&g);
    // Due again before the prober answered: one run at a time.
    g.h.duty_due(at_secs(70), "web", 60_000);
    assert_eq!(g.h.emitted::<ProbeRequest>().len(), 1);
    let s = state(&g, "web");
    assert_eq!((s.runs, s.skipped), (1, 1));
    assert_eq!(s.in_flight.as_ref().unwrap().request_id, "duty-web:1");

    // Its deadline: the probe's timeout (10s) and the prober's grace (15s).
    g.h.tick(at_secs(84));
    assert!(state(&g, "web").in_flight.is_some());
    g.h.tick(at_secs(85));
    let s = state(&g, "web");
    assert!(s.in_flight.is_none());
    let last = s.last.unwrap();
    assert_eq!(last.run, 1);
    assert_eq!(last.healthy, None);
    assert_eq!(
        last.summary,
        "no answer: the prober did not answer within 25s"
    );
    assert_eq!((s.failures, s.successes, s.failing), (0, 0, false));
    assert!(g.h.items().is_empty());
    assert!(said(&g).is_empty());

    // The next due time runs again; the first run's late answer changes
    // nothing of it.
    g.h.duty_due(at_secs(120), "web", 60_000);
    let second = last_probe(&g);
    assert_eq!(second.request_id, "duty-web:2");
    g.h.probe_result(
        at_secs(121),
        &first,
        false,
        "HTTP 500, expected 200",
        Some(500),
    );
    let s = state(&g, "web");
    assert_eq!(s.in_flight.as_ref().unwrap().request_id, "duty-web:2");
    assert_eq!(s.failures, 0);
    g.h.probe_result(
        at_secs(122),
        &second,
        false,
        "HTTP 500, expected 200",
        Some(500),
    );
    let s = state(&g, "web");
    assert_eq!((s.runs, s.failures, s.skipped), (2, 1, 1));
    assert!(s.in_flight.is_none());
}

#[test]
fn a_host_check_goes_through_the_classifier_and_the_executor_on_hosts_bound_to_it() {
    let mut g = duties(config(), &[DISK_CHECK, NGINX]);
    g.h.duty_due(at(1), "nas-disk", 60_000);
    let bindings: Vec<HostBinding> = g.h.emitted();
    assert_eq!(bindings.len(), 1);
    assert_eq!(bindings[0].work_item_id, "duty-nas-disk");
    assert_eq!(bindings[0].hosts, ["nas01"]);
    assert_eq!(
        bindings[0].envelope.as_ref().unwrap().work_item_id,
        "duty-nas-disk"
    );
    nisse_bus::signing::verify("ops", &g.h.signer.public(), &bindings[0]).unwrap();
    let classify = g.h.emitted::<ClassifyRequest>().pop().unwrap();
    assert_eq!(classify.request_id, "duty-nas-disk:1");
    assert_eq!(
        classify.envelope.as_ref().unwrap().work_item_id,
        "duty-nas-disk"
    );
    assert_eq!(
        classify.action,
        Some(nisse_policy::Action::shell("nas01", "df -P -- /srv").to_wire(None))
    );
    assert!(classify.scope.is_none(), "no plan: a read-only check");
    assert!(
        g.exec_requests().is_empty(),
        "nothing runs before a verdict"
    );

    // The classifier's verdict: the check runs on its host.
    assert_eq!(g.classify(1), 1);
    let exec = g.exec_requests().pop().unwrap();
    assert_eq!(
        (
            exec.host.as_str(),
            exec.command.as_str(),
            exec.request_id.as_str()
        ),
        ("nas01", "df -P -- /srv", "duty-nas-disk:1")
    );
    assert_eq!(
        exec.envelope.as_ref().unwrap().work_item_id,
        "duty-nas-disk"
    );
    assert_eq!(
        exec.permission.as_ref().unwrap().verdict_request_id,
        "duty-nas-disk:1"
    );
    nisse_bus::signing::verify("ops", &g.h.signer.public(), &exec).unwrap();

    // Over the threshold: a failure, and with fail-after 1 an item.
    let df = "Filesystem     1024-blocks     Used Available Capacity Mounted on\n/dev/sdb1         10000000  9300000    700000      93% /srv\n";
    g.answer(2, &exec, ExecStatus::Completed, 0, df);
    let items = g.h.items();
    assert_eq!(items.len(), 1);
    assert_eq!(
        items[0].title,
        "nas-disk failing: /srv on nas01 is 93% used (at most 90% wanted)"
    );
    assert_eq!(items[0].scope, "nas01");
    assert_eq!(
        items[0].fingerprint.as_deref(),
        Some(fingerprint("nas-disk", "disk", "nas01:/srv").as_str())
    );
    let detail = details(&g, &items[0].id).pop().unwrap();
    assert_eq!(detail["exit_code"], 0);
    assert!(
        detail["stdout_tail"].as_str().unwrap().contains("93% /srv"),
        "{detail}"
    );

    // The next run: the binding stands; under the threshold it passes.
    g.h.duty_due(at(3), "nas-disk", 60_000);
    assert_eq!(
        g.h.emitted::<HostBinding>().len(),
        1,
        "the duty's once (the item runs nothing, so sends none)"
    );
    assert_eq!(g.classify(3), 1);
    let exec = g.exec_requests().pop().unwrap();
    assert_eq!(exec.request_id, "duty-nas-disk:2");
    g.answer(
        4,
        &exec,
        ExecStatus::Completed,
        0,
        &df.replace("93%", "40%"),
    );
    let s = state(&g, "nas-disk");
    assert_eq!((s.runs, s.successes, s.failing), (2, 1, true));
    assert_eq!(
        s.last.unwrap().summary,
        "/srv on nas01 is 40% used (at most 90%)"
    );

    // A script that exits 1 fails.
    g.h.duty_due(at(5), "nginx", 60_000);
    assert_eq!(g.classify(5), 1);
    let exec = g.exec_requests().pop().unwrap();
    assert_eq!(
        (exec.host.as_str(), exec.command.as_str()),
        ("web1", "systemctl is-active nginx")
    );
    g.answer(6, &exec, ExecStatus::Completed, 1, "inactive\n");
    let items = g.h.items();
    assert_eq!(items.len(), 2);
    assert_eq!(
        items[1].title,
        "nginx failing: the check on web1 exited 1 (expected 0)"
    );

    // A day on, the duty's binding is published again, before it could
    // age out of the stream under the executor.
    let before = g.h.emitted::<HostBinding>().len();
    g.h.duty_due(at(3 + 24 * 60), "nas-disk", 60_000);
    let bindings: Vec<HostBinding> = g.h.emitted();
    assert_eq!(bindings.len(), before + 1);
    let last = bindings.last().unwrap();
    assert_eq!(
        (last.work_item_id.as_str(), last.hosts.as_slice()),
        ("duty-nas-disk", &["nas01".to_string()][..])
    );
}

#[test]
fn the_operator_runs_a_duty_now_and_is_told_what_it_did() {
    let mut g = duties(config(), &[WEB, DISK_CHECK]);
    let run = |duty: &str| Command::RunDuty(proto::RunDuty { duty: duty.into() });
    let id = g.h.operator(at(1), OP, "", run("web"));
    let reply = g.h.reply(&id);
    assert!(reply.applied, "{reply:?}");
    assert_eq!(
        reply.lines,
        ["duty web: run 1 started (http https://web.example:8443/health?full=1)"]
    );
    assert_eq!(last_probe(&g).request_id, "duty-web:1");
    assert_eq!(
        state(&g, "web").in_flight.unwrap().by.as_deref(),
        Some("operator:op")
    );

    // Once more while it is in flight: not started.
    let id = g.h.operator(at(1), OP, "", run("web"));
    let reply = g.h.reply(&id);
    assert!(!reply.applied);
    assert_eq!(
        reply.error,
        "duty `web` has run 1 in flight; it runs again once that one has an answer"
    );
    assert_eq!(g.h.emitted::<ProbeRequest>().len(), 1);

    // A duty that does not exist: the answer names those that do.
    let id = g.h.operator(at(2), OP, "", run("nope"));
    let reply = g.h.reply(&id);
    assert!(!reply.applied);
    assert_eq!(
        reply.error,
        "there is no duty `nope`; the duties are: nas-disk, web"
    );

    // Someone not on the allowlist: refused, nothing runs.
    let id = g.h.operator(at(3), "cli:mallory", "", run("nas-disk"));
    let reply = g.h.reply(&id);
    assert!(!reply.applied);
    assert_eq!(
        reply.error,
        "operator:mallory via cli is not on the operator allowlist"
    );
    assert!(g.h.emitted::<ClassifyRequest>().is_empty());
    assert!(
        g.h.store
            .duty_states()
            .unwrap()
            .iter()
            .all(|(n, _)| n != "nas-disk")
    );
}

#[test]
fn a_fingerprint_rule_puts_an_alert_and_a_check_on_one_item() {
    let mut g = duties(
        Config {
            fingerprint_rules: vec![FingerprintRule {
                name: "web".into(),
                duties: vec!["web".into()],
                alert_labels: BTreeMap::from([("alertname".into(), "WebDown".into())]),
            }],
            ..config()
        },
        &[WEB],
    );
    g.h.alert(
        0,
        "firing",
        &[("alertname", "WebDown"), ("instance", "web1")],
    );
    let items = g.h.items();
    assert_eq!(items.len(), 1);
    assert_eq!(items[0].fingerprint.as_deref(), Some("rule-web"));
    web_run(&mut g, 1, false);
    web_run(&mut g, 2, false);
    let items = g.h.items();
    assert_eq!(items.len(), 1, "one item for the alert and the check");
    assert_eq!(
        findings(&g, &items[0].id),
        [
            (nisse_ops::ALERT_DUTY.into(), "firing".into()),
            ("web".into(), "repeat".into())
        ]
    );
    // An alert the rule does not name stays apart.
    g.h.alert(3, "firing", CPU);
    assert_eq!(g.h.items().len(), 2);
}

#[test]
fn a_firing_alert_not_sent_again_within_stale_after_is_marked_stale_once() {
    let mut h = Harness::ops(Config {
        stale_after: Some(Duration::from_secs(30 * 60)),
        ..Config::default()
    });
    h.alert(0, "firing", CPU);
    let item = h.items()[0].id.clone();
    let stale = |h: &Harness| {
        h.logged(&item, |e| match e {
            Event::Fact { text, data } if data.get("stale_since").is_some() => Some(text),
            _ => None,
        })
    };
    let said_before = h.outbound().len();
    h.tick(at(29));
    assert!(stale(&h).is_empty());
    assert_eq!(h.outbound().len(), said_before);

    h.tick(at(31));
    let facts = stale(&h);
    assert_eq!(facts.len(), 1);
    assert_eq!(
        facts[0],
        "the alert is stale: Alertmanager has not sent it again since 2026-11-30T08:00:00Z (30m allowed)"
    );
    let out = h.outbound();
    assert_eq!(out.len(), said_before + 1);
    let told = &out.last().unwrap().markdown;
    assert!(
        told.contains("Item **#1** (**HighCPU on host1**): the alert is stale")
            && told.contains("The item stays open"),
        "{told}"
    );
    assert_eq!(h.items()[0].state, State::Active, "still open");

    h.tick(at(40));
    assert_eq!(stale(&h).len(), 1);
    assert_eq!(h.outbound().len(), said_before + 1);

    // Heard of again, then silent again for longer than stale-after.
    h.alert(45, "firing", CPU);
    h.tick(at(74));
    assert_eq!(stale(&h).len(), 1);
    h.tick(at(76));
    assert_eq!(stale(&h).len(), 2);
    assert_eq!(h.outbound().len(), said_before + 2);

    // A resolved alert is never stale.
    h.alert(80, "resolved", CPU);
    h.tick(at(200));
    assert_eq!(stale(&h).len(), 2);
}
