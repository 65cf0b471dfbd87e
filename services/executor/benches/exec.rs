//! `cargo bench -p nisse-executor --bench exec`: small commands through the
//! whole execution path, beside OpenSSH and Ansible running the same
//! commands against the same sshd in the same run.
//!
//! One `nats-server -js` and one Debian `sshd` are started on free loopback
//! ports with temporary directories. The classifier and the executor run
//! in this process, as `nisse up` runs them, sharing one bus connection.
//!
//! Cases, each running the same N commands (`echo <i>`) one after another:
//! - **nisse**: what a brain does for a read-only command: a
//!   `ClassifyRequest` published, the classifier's verdict awaited, a
//!   permit issued from it (`Permit::issue`, switches first), the
//!   `ExecRequest` published, the executor's `ExecResult` awaited (walls:
//!   the classifier's verdict read back and compared, host binding and
//!   kill switches read again, the execution record
//!   written before and after, then the command on the pooled SSH
//!   connection). Latency: from the classify request to the result in hand.
//! - **ssh**: OpenSSH's client, `ssh -F none … host 'echo <i>'` per command,
//!   with the host key checked against a pinned known-hosts file.
//! - **ansible**: `ansible tool -m command -a 'echo <i>'` per command,
//!   Ansible's defaults (its ControlPersist connection sharing included),
//!   from the `ansible-core` PyPI package (`scripts/bench-exec` installs it
//!   into a cached virtualenv). It is slow, so it runs fewer commands
//!   (`NISSE_BENCH_EXEC_ANSIBLE`, default 30); rates compare fairly.
//!
//! Every command's output is checked. Without `--bench` (as under `cargo
//! test --benches`) it runs 5 commands per case, skips Ansible when it is
//! not installed, and prints no verdict.
//!
//! Environment: `NISSE_BENCH_EXEC_COUNT` (default 200),
//! `NISSE_BENCH_EXEC_ANSIBLE` (default 30), `NISSE_BENCH_ANSIBLE` (the
//! `ansible` program; default: on `PATH`).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a bench fails by panicking"
)]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use futures::StreamExt as _;

use nisse_bus::Bus;
use nisse_bus::proto::{
    self, ClassifyRequest, ClassifyVerdict, Envelope, ExecPermission, ExecRequest, ExecResult,
    HostBinding,
};
use nisse_executor::config::{AgentConfig, Config, HostConfig};
use nisse_policy::switches::Switches;
use nisse_policy::{Action, Permit, PermitRequest, Policy, Scope};
use nisse_tests::sshd::TestSshd;
use nisse_tests::{BrainKey, InProcess, TestNats};

const ITEM: &str = "0190c0de-0000-7000-8000-00000000be0c";

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() -> Result<()> {
    let full = std::env::args().any(|a| a == "--bench");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(run(full))
}

/// Latencies of one case, and its wall time.
struct Case {
    name: &'static str,
    latencies: Vec<Duration>,
    wall: Duration,
}

impl Case {
    fn rate(&self) -> f64 {
        self.latencies.len() as f64 / self.wall.as_secs_f64()
    }

    fn percentile(&self, p: f64) -> Duration {
        let mut sorted = self.latencies.clone();
        sorted.sort();
        let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
        sorted[i]
    }

    fn print(&self) {
        println!(
            "  {:<8} {:>4} commands  {:>8.1} commands/s  p50 {:>8.2} ms  p99 {:>8.2} ms",
            self.name,
            self.latencies.len(),
            self.rate(),
            self.percentile(0.5).as_secs_f64() * 1000.0,
            self.percentile(0.99).as_secs_f64() * 1000.0,
        );
    }
}

async fn run(full: bool) -> Result<()> {
    let count = if full {
        env_usize("NISSE_BENCH_EXEC_COUNT", 200)
    } else {
        5
    };
    let ansible_count = if full {
        env_usize("NISSE_BENCH_EXEC_ANSIBLE", 30)
    } else {
        2
    };
    let nats = TestNats::start().await?;
    let sshd = match bench_user().await? {
        Some(user) => TestSshd::start_as(&user).await?,
        None => TestSshd::start().await?,
    };
    let dir = tempfile::tempdir()?;
    let bus = nats.bus(&["ops"]).await?;
    bus.ensure_topology().await?;
    // The brain's key, as the brain makes it: the executor verifies
    // every request and binding with its public half.
    let brain = BrainKey::install(dir.path(), "ops")?;
    bus.publish(brain.binding(HostBinding {
        envelope: Some(envelope(format!("bind:{ITEM}"))),
        work_item_id: ITEM.into(),
        hosts: vec!["tool".into()],
        reason: "bench".into(),
        signature: None,
    }))
    .await?;

    let known_hosts = dir.path().join("known_hosts");
    sshd.write_known_hosts(&known_hosts, "127.0.0.1")?;
    let mut agent = AgentConfig {
        key_file: Some(sshd.client_key()),
        known_hosts: Some(known_hosts),
        ..AgentConfig::default()
    };
    agent.hosts.insert(
        "tool".into(),
        HostConfig {
            address: "127.0.0.1".into(),
            port: sshd.port(),
            user: sshd.user().to_string(),
            ..HostConfig::default()
        },
    );
    let mut config = Config::default();
    config.agents.insert("ops".into(), agent);
    let policy = Arc::new(Policy::builtin()?);
    let services = start_services(&bus, config, dir.path(), policy.clone()).await;

    // Verdicts and results as they are stored, by request id.
    let mut verdicts = bus
        .client()
        .subscribe("nisse.ops.in.classify.verdict.*")
        .await?;
    let mut results = bus.client().subscribe("nisse.ops.in.exec.result").await?;

    // Warm-up: the pooled connection, the consumers, the page cache.
    for i in 0..5 {
        nisse_once(
            &bus,
            &brain,
            &policy,
            &mut verdicts,
            &mut results,
            &format!("warm-{i}"),
            i,
        )
        .await?;
    }

    let mut cases = Vec::new();
    let began = Instant::now();
    let mut latencies = Vec::new();
    let mut exec_part = Vec::new();
    for i in 0..count {
        let t0 = Instant::now();
        let id = format!("b-{i}");
        exec_part
            .push(nisse_once(&bus, &brain, &policy, &mut verdicts, &mut results, &id, i).await?);
        latencies.push(t0.elapsed());
    }
    cases.push(Case {
        name: "nisse",
        latencies,
        wall: began.elapsed(),
    });
    // The executor's share: from the execution request to its result.
    let executor_share = Case {
        name: "executor",
        latencies: exec_part,
        wall: began.elapsed(),
    };

    let began = Instant::now();
    let mut latencies = Vec::new();
    for i in 0..count {
        let t0 = Instant::now();
        let out = sshd.ssh_command(&format!("echo {i}")).output().await?;
        ensure!(
            out.status.success() && out.stdout == format!("{i}\n").as_bytes(),
            "ssh: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        latencies.push(t0.elapsed());
    }
    cases.push(Case {
        name: "ssh",
        latencies,
        wall: began.elapsed(),
    });

    match ansible_program() {
        Some(ansible) => {
            let inventory = ansible_inventory(&sshd, dir.path())?;
            let began = Instant::now();
            let mut latencies = Vec::new();
            for i in 0..ansible_count {
                let t0 = Instant::now();
                ansible_once(&ansible, &inventory, dir.path(), i).await?;
                latencies.push(t0.elapsed());
            }
            cases.push(Case {
                name: "ansible",
                latencies,
                wall: began.elapsed(),
            });
        }
        None if full => bail!(
            "Ansible is needed for the comparison: run scripts/bench-exec, which installs ansible-core from PyPI, or set NISSE_BENCH_ANSIBLE"
        ),
        None => println!("(ansible not installed: skipped in the smoke run)"),
    }

    for (name, service) in services {
        service
            .stop(Duration::from_secs(10))
            .await
            .with_context(|| format!("stopping {name}"))?;
    }

    println!("exec: {count} commands, one after another, on one loopback sshd");
    for c in &cases {
        c.print();
    }
    println!(
        "  of nisse's latency, request to result at the executor: p50 {:.2} ms, p99 {:.2} ms",
        executor_share.percentile(0.5).as_secs_f64() * 1000.0,
        executor_share.percentile(0.99).as_secs_f64() * 1000.0
    );
    let check = signature_check(&brain, dir.path(), if full { 2000 } else { 10 })?;
    println!(
        "  the executor's signature wall per request (reading the brain's public key, verifying the request and its host binding): {:.1} µs, {:.2}% of the executor's p50",
        check.as_secs_f64() * 1e6,
        check.as_secs_f64() / executor_share.percentile(0.5).as_secs_f64() * 100.0
    );
    if full {
        let nisse = cases[0].rate();
        for c in &cases[1..] {
            println!(
                "  nisse / {:<8} {:>6.1}x commands/s",
                c.name,
                nisse / c.rate()
            );
        }
        let ssh = nisse / cases[1].rate();
        let ansible = cases.get(2).map_or(0.0, |c| nisse / c.rate());
        println!(
            "  target: ≥ 5x ssh ({}), ≥ 50x ansible ({})",
            if ssh >= 5.0 { "met" } else { "NOT met" },
            if ansible >= 50.0 { "met" } else { "NOT met" }
        );
    }
    Ok(())
}

/// What the signature wall adds to each request, alone: the work the
/// executor does before anything else, over `n` requests (the median of
/// five passes): read the brain's public key from its file, verify the
/// request, verify its host binding.
fn signature_check(brain: &BrainKey, data: &Path, n: usize) -> Result<Duration> {
    let (_, public) = nisse_bus::signing::key_files(data, "ops");
    let request = brain.exec(ExecRequest {
        envelope: Some(envelope("exec:sig".into())),
        request_id: "sig".into(),
        host: "tool".into(),
        command: "echo 1".into(),
        timeout_ms: 30_000,
        permission: Some(ExecPermission {
            verdict_request_id: "sig".into(),
            ..Default::default()
        }),
        ..Default::default()
    });
    let binding = brain.binding(HostBinding {
        envelope: Some(envelope(format!("bind:{ITEM}"))),
        work_item_id: ITEM.into(),
        hosts: vec!["tool".into()],
        reason: "bench".into(),
        signature: None,
    });
    let mut passes = Vec::new();
    for _ in 0..5 {
        let start = Instant::now();
        for _ in 0..n {
            let key = nisse_bus::signing::PublicKey::load(&public)?;
            nisse_bus::signing::verify("ops", &key, std::hint::black_box(&request))?;
            nisse_bus::signing::verify("ops", &key, std::hint::black_box(&binding))?;
        }
        passes.push(start.elapsed() / u32::try_from(n)?);
    }
    passes.sort();
    Ok(passes[2])
}

/// As root, the login account `nisse-bench` (made if missing) with
/// `/bin/sh` as its shell and an empty home, like a service account on a
/// tool VM: root's own shell here reads a profile that takes tens of
/// milliseconds per command, which would be measured three times over.
/// Otherwise the current user.
async fn bench_user() -> Result<Option<String>> {
    if !nix::unistd::geteuid().is_root() {
        return Ok(None);
    }
    const USER: &str = "nisse-bench";
    if nix::unistd::User::from_name(USER)?.is_none() {
        let out = tokio::process::Command::new("useradd")
            // `*`: no password, but not locked (sshd lets no locked
            // account in, even with a key).
            .args([
                "--create-home",
                "--shell",
                "/bin/sh",
                "--password",
                "*",
                USER,
            ])
            .output()
            .await
            .context("running useradd")?;
        ensure!(
            out.status.success(),
            "useradd {USER}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(Some(USER.to_string()))
}

fn envelope(message_id: String) -> Envelope {
    Envelope {
        agent: "ops".into(),
        work_item_id: ITEM.into(),
        message_id,
        ..Default::default()
    }
}

async fn start_services(
    bus: &Bus,
    config: Config,
    data: &Path,
    policy: Arc<Policy>,
) -> Vec<(&'static str, InProcess)> {
    let classifier = InProcess::service(
        bus,
        nisse_classifier::Config {
            policy: policy.clone(),
            models: Default::default(),
        },
        data,
        nisse_classifier::run,
    )
    .await
    .unwrap();
    let executor = InProcess::service(
        bus,
        nisse_executor::Config {
            executor: config,
            policy,
        },
        data,
        nisse_executor::run,
    )
    .await
    .unwrap();
    vec![("classifier", classifier), ("executor", executor)]
}

/// Waits for the message on `sub` whose request id is `id`.
async fn wait_for<M: prost::Message + Default>(
    sub: &mut async_nats::Subscriber,
    id: &str,
    request_id: impl Fn(&M) -> &str,
) -> Result<M> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let msg = tokio::time::timeout_at(deadline, sub.next())
            .await
            .context("no answer within 30 s")?
            .context("subscription ended")?;
        let m = M::decode(msg.payload.as_ref())?;
        if request_id(&m) == id {
            return Ok(m);
        }
    }
}

/// One read-only command through classifier, permit and executor.
async fn nisse_once(
    bus: &Bus,
    brain: &BrainKey,
    policy: &Policy,
    verdicts: &mut async_nats::Subscriber,
    results: &mut async_nats::Subscriber,
    id: &str,
    i: usize,
) -> Result<Duration> {
    let action = Action::shell("tool", &format!("echo {i}"));
    bus.publish(ClassifyRequest {
        envelope: Some(envelope(format!("classify:{id}"))),
        request_id: id.into(),
        action: Some(action.to_wire(None)),
        scope: None,
        model: String::new(),
    })
    .await?;
    let verdict: ClassifyVerdict =
        wait_for(verdicts, id, |v: &ClassifyVerdict| &v.request_id).await?;
    let switches = Switches::from_wire(verdict.switches.as_ref());
    let assessed = policy.assess(&action, None);
    let permit = Permit::issue(PermitRequest {
        action: &action,
        risk: assessed.risk,
        class: nisse_policy::wire::class_from_wire(verdict.action_class),
        targets: &verdict.targets,
        verdict: nisse_policy::wire::verdict_from_wire(verdict.verdict),
        switches: &switches,
        scope: Scope {
            plan: None,
            operator_confirmed: false,
            contained: &[],
        },
    })
    .map_err(|h| anyhow::anyhow!("no permit: {}", h.explain()))?;
    let sent = Instant::now();
    bus.publish(brain.exec(ExecRequest {
        envelope: Some(envelope(format!("exec:{id}"))),
        request_id: id.into(),
        host: permit.action().target.clone(),
        command: permit.action().argument_str("command").unwrap_or_default(),
        timeout_ms: 30_000,
        permission: Some(ExecPermission {
            verdict_request_id: id.into(),
            ..Default::default()
        }),
        ..Default::default()
    }))
    .await?;
    let result: ExecResult = wait_for(results, id, |r: &ExecResult| &r.request_id).await?;
    ensure!(
        result.status == proto::ExecStatus::Completed as i32
            && result.exit_code == 0
            && result.stdout == format!("{i}\n").as_bytes(),
        "nisse: {:?} {}",
        result.status,
        result.reason
    );
    Ok(sent.elapsed())
}

fn ansible_program() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("NISSE_BENCH_ANSIBLE") {
        return Some(PathBuf::from(p));
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join("ansible"))
            .find(|p| p.is_file())
    })
}

/// An inventory with the one host, its key and pinned host key.
fn ansible_inventory(sshd: &TestSshd, dir: &Path) -> Result<PathBuf> {
    let path = dir.join("inventory.ini");
    let known = sshd.dir().join("client_known_hosts");
    std::fs::write(
        &path,
        format!(
            "tool ansible_host=127.0.0.1 ansible_port={} ansible_user={} ansible_ssh_private_key_file={} ansible_python_interpreter=/usr/bin/python3 ansible_ssh_common_args='-o UserKnownHostsFile={} -o StrictHostKeyChecking=yes -o HostKeyAlias={}'\n",
            sshd.port(),
            sshd.user(),
            sshd.client_key().display(),
            known.display(),
            nisse_tests::sshd::HOST_KEY_ALIAS,
        ),
    )?;
    Ok(path)
}

async fn ansible_once(ansible: &Path, inventory: &Path, dir: &Path, i: usize) -> Result<()> {
    let out = tokio::process::Command::new(ansible)
        .arg("tool")
        .arg("-i")
        .arg(inventory)
        .args(["-m", "command", "-a"])
        .arg(format!("echo {i}"))
        .env("ANSIBLE_HOST_KEY_CHECKING", "True")
        .env("ANSIBLE_LOCAL_TEMP", dir.join("ansible-tmp"))
        .env("ANSIBLE_HOME", dir.join("ansible-home"))
        .env("ANSIBLE_NOCOLOR", "1")
        .output()
        .await
        .with_context(|| format!("running {}", ansible.display()))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    ensure!(
        out.status.success() && stdout.contains(&format!("\n{i}")),
        "ansible: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}
