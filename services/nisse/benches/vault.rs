//! `cargo bench -p nisse --bench vault`: the knowledge vault's search and
//! its writes, each against a baseline measured on the same files in the
//! same run.
//!
//! **Search.** N (default 10,000) generated notes are written into a
//! vault: realistic Markdown with YAML frontmatter, `[[links]]` and
//! command output; 45% the ops agent's incident notes (a fingerprint and
//! hosts in the frontmatter, as the brain writes them at an item's
//! close), 50% its facts, 5% the operator's procedures. The release `nisse` binary serves it as users
//! run it: `nisse serve vault-reader`, its own process, on a secured
//! `nats-server` the bench starts, logging JSON at info to a file. Per
//! round:
//! - the index build: the reader's own figure (its "the vault is indexed"
//!   line, `ms`), and the time from starting the process to its first
//!   answer;
//! - per query, the time from publishing a `VaultQuery` (as the brain,
//!   awaiting the server's ack, as the brain does) to its `VaultFound`
//!   arriving on a subscription of the bench's: the request → answer time
//!   the brain waits. Three kinds: a text search, the search the brain
//!   makes for an alert (its words with the fingerprint and host, so
//!   incident notes about them rank first), and a read of one note (no
//!   search: what the bus and the reader's per-query look at the folders
//!   cost alone);
//! - the baseline, in the same run, alternating with the queries: `rg`
//!   over the same vault for the same words (`rg --ignore-case
//!   --fixed-strings --files-with-matches -e <word>…`: any of the words,
//!   as the reader's query is), one process per query as a user runs it,
//!   and one `rg` pass for a word in no note (every byte of every note
//!   read once; the faster of one before the round and one after) beside
//!   the index build;
//! - a walk of the folders the reader keeps current before every query
//!   (a listing of each, an `lstat` of each note), from the bench
//!   process, to tell that part of an answer from the search.
//!
//! **Writes.** N (default 2,000) notes are written one after another,
//! each a `VaultWrite` CREATE of a fact note with its frontmatter, four
//! ways, in the same run, on the same disk:
//! - the writer's own `apply` (what the service and the rebuild call: the
//!   provenance composed, a hidden temporary written and fsynced, renamed,
//!   the folder fsynced), with its write records in memory;
//! - the same `apply` with its records in the bus's `nisse_vault` bucket,
//!   as the service keeps them (a read and two compare-and-set writes per
//!   note);
//! - `nisse serve vault-writer` as users run it: the writes published as
//!   the brain, timed until the last `VaultWritten` arrives;
//! - the baseline: a plain loop writing the very bytes the writer wrote
//!   (`write` to a temporary, `fsync`, `rename`, `fsync` of the folder).
//!
//! The three in-process ways take turns in chunks of 100 notes, the one
//! going first turning with each chunk, so a disk whose flushes are
//! slower for a while weighs on each alike; the service runs before them
//! in even rounds and after them in odd ones. Every figure is reported
//! with its ratio to the baseline of the same round; the summary is the
//! median over rounds.
//!
//! Without `--bench` (as under `cargo test --benches`) it runs one small
//! round (300 notes, 50 writes) that checks every part works; its figures
//! mean nothing. Without `rg` on `PATH` the search runs without its
//! baseline and says so.
//!
//! Environment: `NISSE_BENCH_VAULT_NOTES` (default 10000),
//! `NISSE_BENCH_VAULT_QUERIES` (times each query text is asked per round,
//! default 10), `NISSE_BENCH_VAULT_WRITES` (default 2000),
//! `NISSE_BENCH_VAULT_ROUNDS` (default 3), `NISSE_BENCH_NATS_SERVER` (the
//! `nats-server` to run, default the one on `PATH`), `NISSE_BENCH_RG`
//! (the `rg` to run, default the one on `PATH`).

use std::collections::HashSet;
use std::fs::{self, File};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use futures::StreamExt as _;
use prost::Message as _;
use tokio::process::Command;

#[path = "../../../bus/benches/support/stats.rs"]
mod stats;
use stats::{median, ms, percentile};
#[path = "../../../bus/benches/support/env.rs"]
mod env;
#[path = "support/serve.rs"]
mod serve;
use env::env_or;
use serve::{Proc, log_tail};

use nisse_bus::auth::{Credentials, Identity, server_authorization};
use nisse_bus::embedded::{EmbeddedOptions, EmbeddedServer, SyncInterval};
use nisse_bus::proto::{
    Envelope, KnowledgeSearch, NoteRead, Strings, VaultFound, VaultQuery, VaultWrite,
    VaultWriteMode, VaultWritten, vault_query,
};
use nisse_bus::{AgentName, Bus, BusConfig, Role, SubjectKind};
use nisse_vault_writer::writer::{self, History, KvRecords, MemoryRecords, Records};

/// The agent whose vault it is.
const AGENT: &str = "ops";
/// Longest one answer may take before the bench gives up.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);
/// Notes each in-process way of writing writes at its turn.
const CHUNK: usize = 100;
/// Longest the reader may take to index the vault and answer once.
const START_TIMEOUT: Duration = Duration::from_secs(300);

/// What to run.
struct Settings {
    full: bool,
    notes: usize,
    queries: usize,
    writes: usize,
    rounds: usize,
}

impl Settings {
    fn from_env() -> Result<Self> {
        let full = std::env::args().any(|a| a == "--bench");
        let notes: usize = env_or("NISSE_BENCH_VAULT_NOTES", if full { 10_000 } else { 300 })?;
        let queries: usize = env_or("NISSE_BENCH_VAULT_QUERIES", if full { 10 } else { 1 })?;
        let writes: usize = env_or("NISSE_BENCH_VAULT_WRITES", if full { 2_000 } else { 50 })?;
        let rounds: usize = env_or("NISSE_BENCH_VAULT_ROUNDS", if full { 3 } else { 1 })?;
        ensure!(
            notes >= 100 && queries >= 1 && writes >= 1 && rounds >= 1,
            "NISSE_BENCH_VAULT_NOTES must be at least 100, and _QUERIES, _WRITES and _ROUNDS at least 1"
        );
        Ok(Self {
            full,
            notes,
            queries,
            writes,
            rounds,
        })
    }
}

fn main() -> Result<()> {
    let settings = Settings::from_env()?;
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("tokio runtime")?
        .block_on(run(settings))
}

async fn run(settings: Settings) -> Result<()> {
    let dir = tempfile::tempdir().context("temporary directory")?;
    let data = dir.path().join("data");
    let credentials = Credentials::in_data_dir(&data);
    let mut options = EmbeddedOptions::in_dir(&dir.path().join("nats"));
    if let Some(program) = std::env::var_os("NISSE_BENCH_NATS_SERVER") {
        options.program = program.into();
    }
    // What `nisse up` runs (`embedded.sync-interval = "always"`); a server
    // older than 2.10 keeps its own interval and the summary says so.
    options.sync = SyncInterval::Always;
    options.authorization = Some(server_authorization(
        &nisse_tests::local_plan(&[AGENT], &[])?,
        &credentials,
    )?);
    let server = EmbeddedServer::start(options)
        .await
        .context("the bench needs `nats-server` (Debian package `nats-server`, in /usr/sbin)")?;
    let synced = fs::read_to_string(dir.path().join("nats").join("run").join("nats-server.conf"))
        .unwrap_or_default()
        .contains("sync_interval: always");
    let outcome = measure(&settings, &server, dir.path(), &data, &credentials, synced).await;
    server.stop(Duration::from_secs(10)).await?;
    outcome
}

/// Everything both parts need.
struct Bench<'a> {
    settings: &'a Settings,
    agent: AgentName,
    /// The admin's connection: subscribes to the answers, reads buckets.
    admin: Bus,
    /// The brain's: publishes the queries and the writes, as it does.
    brain: Bus,
    /// The server's client URL, for the installs' `nisse.toml`.
    url: String,
    install: PathBuf,
    data: PathBuf,
    rg: Option<PathBuf>,
}

async fn measure(
    settings: &Settings,
    server: &EmbeddedServer,
    dir: &Path,
    data: &Path,
    credentials: &Credentials,
    synced: bool,
) -> Result<()> {
    let agent: AgentName = AGENT.parse()?;
    let cfg = BusConfig {
        url: Some(server.url().to_string()),
        ..BusConfig::default()
    };
    let admin = Bus::connect_as(&cfg, vec![agent.clone()], &Identity::Admin, credentials).await?;
    admin.ensure_topology().await?;
    let brain = Bus::connect_as(
        &cfg,
        vec![agent.clone()],
        &Identity::service(Role::Brain, &agent),
        credentials,
    )
    .await?;
    let install = dir.join("install");
    fs::create_dir_all(&install)?;
    let rg = find_rg();
    let bench = Bench {
        settings,
        agent,
        admin,
        brain,
        url: server.url().to_string(),
        install,
        data: data.to_path_buf(),
        rg,
    };

    if !settings.full {
        println!("smoke run (no --bench): checks that every part works; its figures mean nothing");
    }
    println!(
        "vault: {} round(s); search over {} notes, each of {} query texts asked {} time(s) per round and kind; {} writes per way; nats-server fsync: {}",
        settings.rounds,
        settings.notes,
        TEXTS.len(),
        settings.queries,
        settings.writes,
        if synced {
            "always"
        } else {
            "its own interval (this server cannot sync always; 2.10+ can)"
        }
    );
    match &bench.rg {
        Some(rg) => println!("baseline: {} ({})", rg.display(), rg_version(rg).await),
        None => println!(
            "rg (ripgrep) is not on PATH: the search runs WITHOUT its baseline (apt-get install ripgrep, or set NISSE_BENCH_RG)"
        ),
    }

    let search = search(&bench).await?;
    let writes = write_rounds(&bench).await?;
    summary(&bench, &search, &writes);
    Ok(())
}

// ---------------------------------------------------------------------------
// The generated vault.

/// A small deterministic generator (SplitMix64): the same vault every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

const HOSTS: &[&str] = &[
    "nas01", "nas02", "db01", "db02", "web01", "web02", "web03", "pve01", "pve02", "pve03",
    "backup01", "mon01", "mail01", "dns01", "gw01", "k3s01", "k3s02", "k3s03", "media01", "git01",
];
const SERVICES: &[&str] = &[
    "postgresql",
    "grafana",
    "prometheus",
    "nginx",
    "jellyfin",
    "nextcloud",
    "redis",
    "mariadb",
    "syncthing",
    "immich",
    "home-assistant",
    "unbound",
    "caddy",
    "loki",
    "alertmanager",
    "restic",
    "zfs-zed",
    "smartd",
    "docker",
    "gitea",
];
const ALERTS: &[&str] = &[
    "DiskFull",
    "HighLoad",
    "ServiceDown",
    "CertificateExpiring",
    "BackupFailed",
    "ZfsPoolDegraded",
    "MemoryPressure",
    "HighLatency",
    "TargetDown",
    "SmartFailing",
    "NtpDrift",
    "ReplicationLag",
];
const POOLS: &[&str] = &["tank", "fast", "backup", "media"];
const COMMANDS: &[&str] = &[
    "df -h /var",
    "journalctl -u {svc} --since \"1 hour ago\" --no-pager",
    "systemctl status {svc}",
    "systemctl restart {svc}",
    "zpool status -x {pool}",
    "zfs list -o name,used,avail {pool}",
    "smartctl -a /dev/sda",
    "du -sh /var/lib/{svc}",
    "docker system prune --filter until=168h",
    "chronyc tracking",
    "openssl x509 -enddate -noout -in /etc/ssl/{svc}.pem",
    "restic -r /mnt/backup/{svc} snapshots --latest 3",
    "psql -c \"select now() - pg_last_xact_replay_timestamp()\"",
    "free -m",
    "ss -tlnp",
];
const SENTENCES: &[&str] = &[
    "The {svc} service on {host} was restarted after memory use reached {n}%.",
    "The {pool} pool on {host} reported {n} checksum errors during the weekly scrub.",
    "Free space on /var of {host} fell to {n} GiB; the {svc} logs were the largest part.",
    "Certificates for {svc}.home.arpa expire in {n} days; renewal runs from a timer on {host}.",
    "Backups of {svc} to {host} finished in {n} minutes, within the window.",
    "Memory pressure on {host}: the OOM killer ended {svc} at {hh}:{mm}.",
    "Replication lag from db01 to db02 reached {n} seconds while vacuum ran on {svc}.",
    "nginx answered 502 for {svc} while the upstream on {host} was restarting.",
    "SMART on {host} shows {n} reallocated sectors on /dev/sda; the trend is flat.",
    "The clock of {host} drifted {n} ms before chrony stepped it.",
    "The grafana dashboard for {host} was slow because the {svc} query scanned {n} days.",
    "A kernel upgrade on {host} needs a reboot; {svc} moves to another node first.",
    "The {svc} container on {host} was recreated from image tag {n}.",
    "Load on {host} stayed above {n} for ten minutes during the {svc} reindex.",
    "The operator asked that {svc} on {host} is never restarted during backups.",
    "Disk usage of the {pool} dataset grew {n} GiB in a week, mostly {svc} snapshots.",
    "DNS lookups through unbound on {host} took {n} ms at p99.",
    "The firewall on gw01 drops traffic from the {svc} subnet to {host} on purpose.",
    "Restoring {svc} from the snapshot of {hh}:{mm} took {n} minutes and was verified.",
    "Prometheus on mon01 lost the {host} target for {n} scrapes after a network blip.",
];

/// Text with `{svc}`, `{host}`, `{pool}`, `{n}`, `{hh}`, `{mm}` filled in.
fn fill(rng: &mut Rng, template: &str, host: &str, svc: &str) -> String {
    let pool = *rng.pick(POOLS);
    template
        .replace("{svc}", svc)
        .replace("{host}", host)
        .replace("{pool}", pool)
        .replace("{n}", &(1 + rng.below(97)).to_string())
        .replace("{hh}", &format!("{:02}", rng.below(24)))
        .replace("{mm}", &format!("{:02}", rng.below(60)))
}

/// A paragraph of `count` sentences about `host` and `svc` (mostly).
fn paragraph(rng: &mut Rng, count: usize, host: &str, svc: &str) -> String {
    let mut out = Vec::new();
    for _ in 0..count {
        // Now and then about something else, as notes are.
        let (h, s) = if rng.below(4) == 0 {
            (*rng.pick(HOSTS), *rng.pick(SERVICES))
        } else {
            (host, svc)
        };
        let template = *rng.pick(SENTENCES);
        out.push(fill(rng, template, h, s));
    }
    out.join(" ")
}

/// A fenced block of a command and some of its output.
fn command_block(rng: &mut Rng, host: &str, svc: &str) -> String {
    let template = *rng.pick(COMMANDS);
    let command = fill(rng, template, host, svc);
    let mut out = format!("```console\n{host}$ {command}\n");
    for _ in 0..(2 + rng.below(5)) {
        let (hh, mm, ss) = (rng.below(24), rng.below(60), rng.below(60));
        let pid = 1000 + rng.below(60_000);
        let template = *rng.pick(SENTENCES);
        let said = fill(rng, template, host, svc);
        out.push_str(&format!(
            "{hh:02}:{mm:02}:{ss:02} {host} {svc}[{pid}]: {said}\n"
        ));
    }
    out.push_str("```\n");
    out
}

/// The fingerprint of an alert on a host: 16 hex digits, as Alertmanager's.
fn fingerprint(alert: &str, host: &str) -> String {
    let mut h: u64 = 0xCBF2_9CE4_8422_2325;
    for b in alert.bytes().chain([b'/']).chain(host.bytes()) {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01B3);
    }
    format!("{h:016x}")
}

/// One incident of the generated vault: what the alert search asks about.
#[derive(Clone)]
struct Incident {
    alert: &'static str,
    host: &'static str,
    fingerprint: String,
}

/// What was generated.
struct Generated {
    bytes: u64,
    incidents: Vec<Incident>,
    /// Some paths, for the read queries.
    paths: Vec<String>,
}

/// The provenance frontmatter the writer puts on an agent's note.
fn provenance(i: usize, source: &str) -> String {
    format!(
        "agent: ops\nwork_item: item-{:06}\nsource: {source}\nstream_seq: {}\nwritten: 2026-{:02}-{:02}T{:02}:{:02}:00Z\nmessage_id: 0193{:012x}:note:{i}\n",
        i / 3,
        10 + i * 7,
        1 + i % 11,
        1 + i % 28,
        i % 24,
        i % 60,
        i * 7919
    )
}

/// Writes `count` notes into `vault`: 5% procedures (operator's, bound to
/// alerts), 45% incident notes and 50% facts in the ops agent's memory.
fn generate(vault: &Path, count: usize) -> Result<Generated> {
    let mut rng = Rng(17);
    let mut generated = Generated {
        bytes: 0,
        incidents: Vec::new(),
        paths: Vec::new(),
    };
    let procedures = count / 20;
    let incidents = count * 9 / 20;
    for i in 0..count {
        let host = *rng.pick(HOSTS);
        let svc = *rng.pick(SERVICES);
        let alert = *rng.pick(ALERTS);
        let (path, text) = if i < procedures {
            let path = format!("procedures/{}-{svc}-{i:05}.md", alert.to_lowercase());
            let intro = paragraph(&mut rng, 3, host, svc);
            let mut text = format!(
                "---\ntitle: {alert} on a host running {svc}\nrunbook_for:\n- alert:{alert}\ntags:\n- runbook\n- {svc}\n---\n# {alert}: what to do\n\n{intro}\n\n## Steps\n\n"
            );
            for step in 1..=(3 + rng.below(4)) {
                let said = paragraph(&mut rng, 1, host, svc);
                let block = command_block(&mut rng, host, svc);
                text.push_str(&format!("{step}. {said}\n\n{block}\n"));
            }
            text.push_str(&format!("See [[{host}]] and [[{svc}]].\n"));
            (path, text)
        } else if i < procedures + incidents {
            let fp = fingerprint(alert, host);
            let path = format!(
                "memory/ops/incidents/2026-{:02}-{:02}-{}-{host}-{i:05}.md",
                1 + i % 11,
                1 + i % 28,
                alert.to_lowercase()
            );
            let (n1, n2, n3) = (4 + rng.below(4), 3 + rng.below(3), 1 + rng.below(2));
            let happened = paragraph(&mut rng, n1, host, svc);
            let done = paragraph(&mut rng, n2, host, svc);
            let shown = command_block(&mut rng, host, svc);
            let mattered = command_block(&mut rng, host, svc);
            let open = paragraph(&mut rng, n3, host, svc);
            let text = format!(
                "---\n{}title: {alert} on {host}\nfingerprint: {fp}\nhosts:\n- {host}\ntags:\n- incident\n- {}\n---\n# {alert} on {host}\n\n## What happened\n\n{happened}\n\n## What was done and verified\n\n{done}\n{shown}\n## Commands that mattered\n\n{mattered}\n## Left open\n\n{open}\n\nEntities: [[{host}]], [[{svc}]]\n",
                provenance(i, "orchestrator at close"),
                alert.to_lowercase(),
            );
            generated.incidents.push(Incident {
                alert,
                host,
                fingerprint: fp,
            });
            (path, text)
        } else {
            let path = format!("memory/ops/facts/{host}-{svc}-{i:05}.md");
            let n = 2 + rng.below(5);
            let said = paragraph(&mut rng, n, host, svc);
            let block = if rng.below(3) == 0 {
                command_block(&mut rng, host, svc)
            } else {
                String::new()
            };
            let text = format!(
                "---\n{}title: {svc} on {host}\ntags:\n- fact\n- {svc}\n---\n{said}\n\n{block}\nObserved on [[{host}]].\n",
                provenance(i, "driver via remember"),
            );
            (path, text)
        };
        let file = vault.join(&path);
        if let Some(parent) = file.parent() {
            fs::create_dir_all(parent)?;
        }
        fs::write(&file, &text).with_context(|| format!("writing {}", file.display()))?;
        generated.bytes += text.len() as u64;
        if i % (count / 50).max(1) == 0 {
            generated.paths.push(path);
        }
    }
    Ok(generated)
}

/// The text searches: what the model asks `search_knowledge`.
const TEXTS: &[&str] = &[
    "disk full",
    "postgresql replication lag",
    "certificate renewal timer",
    "zfs scrub checksum errors",
    "oom killer",
    "restic backup window",
    "nginx 502 upstream",
    "reallocated sectors",
    "chrony clock drift",
    "grafana dashboard slow",
    "kernel upgrade reboot",
    "snapshot restore verified",
];

// ---------------------------------------------------------------------------
// Search.

/// One kind of query, its samples and its baseline's.
#[derive(Default)]
struct Kind {
    reader: Vec<Duration>,
    rg: Vec<Duration>,
    /// Notes answered / files rg listed, summed, to show both found things.
    answered: u64,
    listed: u64,
}

/// One round of the search part.
struct SearchRound {
    index_ms: f64,
    start_to_answer: Duration,
    rg_pass: Option<Duration>,
    /// A walk of the folders the reader keeps current before each query
    /// (a listing and an `lstat` per note), from this process.
    walk: Duration,
    text: Kind,
    alert: Kind,
    read: Kind,
}

/// What the search part measured.
struct Search {
    notes: usize,
    bytes: u64,
    rounds: Vec<SearchRound>,
}

async fn search(bench: &Bench<'_>) -> Result<Search> {
    let vault = bench.data.join("vault");
    let started = Instant::now();
    let generated = generate(&vault, bench.settings.notes)?;
    println!(
        "generated {} notes ({:.1} MB) in {:.1} s",
        bench.settings.notes,
        generated.bytes as f64 / 1e6,
        started.elapsed().as_secs_f64()
    );
    write_config(&bench.install, &bench.data, &bench.url, None)?;
    let mut rounds = Vec::new();
    for round in 0..bench.settings.rounds {
        rounds.push(search_round(bench, &vault, &generated, round).await?);
        let r = rounds.last().context("the round just measured")?;
        println!(
            "search round {round}: index {:.0} ms (start to first answer {:.0} ms, rg pass {}, walk {:.1} ms); p50/p99 ms: text {} | alert {} | read {}",
            r.index_ms,
            ms(r.start_to_answer),
            r.rg_pass.map_or("-".into(), |d| format!("{:.0} ms", ms(d))),
            ms(r.walk),
            p50_p99(&r.text),
            p50_p99(&r.alert),
            p50_p99(&r.read),
        );
    }
    Ok(Search {
        notes: bench.settings.notes,
        bytes: generated.bytes,
        rounds,
    })
}

fn p50_p99(kind: &Kind) -> String {
    let rg = if kind.rg.is_empty() {
        String::new()
    } else {
        format!(
            " (rg {:.1}/{:.1})",
            ms(percentile(&kind.rg, 0.5)),
            ms(percentile(&kind.rg, 0.99))
        )
    };
    format!(
        "{:.1}/{:.1}{rg}",
        ms(percentile(&kind.reader, 0.5)),
        ms(percentile(&kind.reader, 0.99))
    )
}

async fn search_round(
    bench: &Bench<'_>,
    vault: &Path,
    generated: &Generated,
    round: usize,
) -> Result<SearchRound> {
    let found_subject = bench.agent.subject(SubjectKind::VaultFound);
    let mut answers = bench
        .admin
        .client()
        .subscribe(found_subject.clone())
        .await
        .with_context(|| format!("subscribing to {found_subject}"))?;
    // The page cache holds the vault for both sides: one pass first.
    let rg_pass_before = match &bench.rg {
        Some(rg) => Some(rg_run(rg, vault, &["nosuchwordinanynote"]).await?.0),
        None => None,
    };

    // The first query is on the stream before the reader starts; its
    // consumer delivers it once the vault is indexed.
    let started = Instant::now();
    let mut reader = Proc::spawn(&bench.install, "vault-reader", round)?;
    let first = ask(
        bench,
        &mut answers,
        &format!("r{round}-start"),
        search_query(TEXTS[0], None),
        START_TIMEOUT,
    )
    .await;
    let start_to_answer = started.elapsed();
    reader.check_alive()?;
    first.with_context(|| format!("the vault reader's log tail:\n{}", log_tail(&reader.log)))?;
    let index_ms = indexed_ms(&reader.log).with_context(|| {
        format!(
            "the vault reader's log has no \"the vault is indexed\" line; log tail:\n{}",
            log_tail(&reader.log)
        )
    })?;

    // Warm both sides: each text once.
    for (i, text) in TEXTS.iter().enumerate() {
        ask(
            bench,
            &mut answers,
            &format!("r{round}-warm{i}"),
            search_query(text, None),
            ANSWER_TIMEOUT,
        )
        .await?;
        if let Some(rg) = &bench.rg {
            rg_run(rg, vault, &words(text)).await?;
        }
    }

    let mut text = Kind::default();
    let mut alert = Kind::default();
    let mut read = Kind::default();
    let mut rng = Rng(1000 + round as u64);
    let mut n = 0usize;
    for rep in 0..bench.settings.queries {
        for (i, words_asked) in TEXTS.iter().enumerate() {
            // Which side goes first alternates, so drift weighs on both.
            let reader_first = (rep + i) % 2 == 0;
            n += 1;
            let id = format!("r{round}-q{n}");
            measure_pair(
                bench,
                &mut answers,
                vault,
                &mut text,
                &id,
                search_query(words_asked, None),
                &words(words_asked),
                reader_first,
            )
            .await?;

            let incident = rng.pick(&generated.incidents).clone();
            let alert_text = format!("{} {}", incident.alert, incident.host);
            let mut rg_words = words(&alert_text);
            rg_words.push(incident.fingerprint.clone());
            measure_pair(
                bench,
                &mut answers,
                vault,
                &mut alert,
                &format!("{id}-alert"),
                search_query(&alert_text, Some(&incident)),
                &rg_words,
                !reader_first,
            )
            .await?;

            let path = rng.pick(&generated.paths).clone();
            let asked = Instant::now();
            let found = ask(
                bench,
                &mut answers,
                &format!("{id}-read"),
                vault_query::Query::Read(NoteRead { path: path.clone() }),
                ANSWER_TIMEOUT,
            )
            .await?;
            read.reader.push(asked.elapsed());
            ensure!(
                found.notes.len() == 1,
                "reading {path} answered {} notes: {}",
                found.notes.len(),
                found.error
            );
            read.answered += 1;
        }
    }
    reader.stop(true).await?;
    let walk = median(
        (0..5)
            .map(|_| walk_folders(vault).map(|d| d.as_secs_f64()))
            .collect::<Result<Vec<f64>>>()?,
    );
    let walk = Duration::from_secs_f64(walk);
    let rg_pass = match &bench.rg {
        Some(rg) => Some(
            rg_run(rg, vault, &["nosuchwordinanynote"])
                .await?
                .0
                .min(rg_pass_before.unwrap_or(Duration::MAX)),
        ),
        None => None,
    };
    Ok(SearchRound {
        index_ms,
        start_to_answer,
        rg_pass,
        walk,
        text,
        alert,
        read,
    })
}

/// How long a walk of the folders the ops agent may read takes, as the
/// reader walks them to find changed notes: each folder listed, each
/// entry `lstat`ed.
fn walk_folders(vault: &Path) -> Result<Duration> {
    let started = Instant::now();
    let mut seen = 0usize;
    let mut pending: Vec<PathBuf> = ["memory/ops", "world", "procedures"]
        .iter()
        .map(|f| vault.join(f))
        .collect();
    while let Some(dir) = pending.pop() {
        let Ok(entries) = fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries {
            let entry = entry?;
            let meta = entry.path().symlink_metadata()?;
            if meta.is_dir() {
                pending.push(entry.path());
            } else {
                seen += 1;
            }
        }
    }
    ensure!(seen > 0, "the walk of {} found no notes", vault.display());
    Ok(started.elapsed())
}

/// A search of `text`, as the brain asks it for the model (no
/// fingerprint) or at an alert (its fingerprint and host).
fn search_query(text: &str, about: Option<&Incident>) -> vault_query::Query {
    vault_query::Query::Search(KnowledgeSearch {
        text: text.into(),
        limit: 0,
        fingerprint: about.map(|a| a.fingerprint.clone()).unwrap_or_default(),
        hosts: about.map(|a| vec![a.host.to_string()]).unwrap_or_default(),
    })
}

/// The words of a query text, for `rg -e`.
fn words(text: &str) -> Vec<String> {
    text.split_whitespace().map(str::to_string).collect()
}

/// One query to the reader and its baseline, in the order given.
#[expect(
    clippy::too_many_arguments,
    reason = "one call site per kind; a struct would only rename them"
)]
async fn measure_pair(
    bench: &Bench<'_>,
    answers: &mut async_nats::Subscriber,
    vault: &Path,
    kind: &mut Kind,
    id: &str,
    query: vault_query::Query,
    rg_words: &[String],
    reader_first: bool,
) -> Result<()> {
    let rg_side = async |kind: &mut Kind| -> Result<()> {
        if let Some(rg) = &bench.rg {
            let (took, listed) = rg_run(rg, vault, rg_words).await?;
            kind.rg.push(took);
            kind.listed += listed;
        }
        Ok(())
    };
    if !reader_first {
        rg_side(kind).await?;
    }
    let asked = Instant::now();
    let found = ask(bench, answers, id, query, ANSWER_TIMEOUT).await?;
    kind.reader.push(asked.elapsed());
    ensure!(
        found.error.is_empty(),
        "query {id} was answered with an error: {}",
        found.error
    );
    kind.answered += found.notes.len() as u64;
    if reader_first {
        rg_side(kind).await?;
    }
    Ok(())
}

/// Publishes a query as the brain and waits up to `wait` for its answer.
async fn ask(
    bench: &Bench<'_>,
    answers: &mut async_nats::Subscriber,
    id: &str,
    query: vault_query::Query,
    wait: Duration,
) -> Result<VaultFound> {
    let request_id = format!("bench-{id}");
    let message = VaultQuery {
        envelope: Some(Envelope {
            agent: AGENT.into(),
            message_id: format!("vault-query:{request_id}"),
            ..Envelope::default()
        }),
        request_id: request_id.clone(),
        query: Some(query),
    };
    bench.brain.publish(message).await?;
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let next = tokio::time::timeout_at(deadline, answers.next())
            .await
            .with_context(|| format!("no answer to {request_id} within {wait:?}"))?
            .context("the answers' subscription ended")?;
        let found = VaultFound::decode(next.payload.as_ref())?;
        if found.request_id == request_id {
            return Ok(found);
        }
    }
}

/// The reader's own figure for indexing the vault, from its JSON log.
fn indexed_ms(log: &Path) -> Option<f64> {
    let text = fs::read_to_string(log).ok()?;
    text.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v["fields"]["message"] == "the vault is indexed")
        .and_then(|v| {
            // A u128 is logged as a string.
            let ms = &v["fields"]["ms"];
            ms.as_f64().or_else(|| ms.as_str()?.parse().ok())
        })
}

// ---------------------------------------------------------------------------
// ripgrep.

/// `rg` as the bench runs it: `NISSE_BENCH_RG`, or the one on `PATH`.
fn find_rg() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("NISSE_BENCH_RG") {
        return Some(path.into());
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join("rg"))
            .find(|p| p.is_file())
    })
}

async fn rg_version(rg: &Path) -> String {
    match Command::new(rg).arg("--version").output().await {
        Ok(out) => String::from_utf8_lossy(&out.stdout)
            .lines()
            .next()
            .unwrap_or("unknown version")
            .to_string(),
        Err(e) => format!("cannot run it: {e}"),
    }
}

/// Runs `rg` for any of `words` over `vault`, as a user would to find the
/// notes that mention them: how long it took, and how many files it
/// listed.
async fn rg_run<S: AsRef<str>>(rg: &Path, vault: &Path, words: &[S]) -> Result<(Duration, u64)> {
    let mut cmd = Command::new(rg);
    cmd.args([
        "--ignore-case",
        "--fixed-strings",
        "--files-with-matches",
        "--no-messages",
    ]);
    for w in words {
        cmd.arg("-e").arg(w.as_ref());
    }
    cmd.arg(vault).stdin(Stdio::null()).stderr(Stdio::null());
    let started = Instant::now();
    let out = cmd
        .output()
        .await
        .with_context(|| format!("running {}", rg.display()))?;
    let took = started.elapsed();
    // 1 is "nothing found"; 2 is an error.
    ensure!(
        matches!(out.status.code(), Some(0 | 1)),
        "{} failed with {}",
        rg.display(),
        out.status
    );
    let listed = out.stdout.iter().filter(|b| **b == b'\n').count() as u64;
    Ok((took, listed))
}

// ---------------------------------------------------------------------------
// The install and its processes.

/// Writes an install's `nisse.toml`: the bus and the data directory
/// whose credentials the server accepts. The vault is `vault`, or the
/// default `<data>/vault`, read by the ops agent with the default grants
/// (its memory, `world/`, `procedures/`); no git history.
fn write_config(install: &Path, data: &Path, url: &str, vault: Option<&Path>) -> Result<()> {
    let dir = vault.map_or(String::new(), |v| format!("dir = {v:?}\n"));
    let text = format!(
        "data-dir = {data:?}\n\
         [bus]\nurl = {url:?}\n\
         [ops]\nstarter-duties = false\n\
         [vault]\n{dir}git = false\n"
    );
    fs::create_dir_all(install)?;
    fs::write(install.join("nisse.toml"), text).context("writing nisse.toml")
}

// ---------------------------------------------------------------------------
// Writes.

/// The ways notes are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Way {
    /// The writer's `apply`, records in memory.
    Apply,
    /// The writer's `apply`, records in the bus's bucket.
    ApplyKv,
    /// `nisse serve vault-writer`, through the bus.
    Service,
    /// The baseline: write, fsync, rename, fsync the folder.
    Plain,
}

impl Way {
    const ALL: [Way; 4] = [Way::Apply, Way::ApplyKv, Way::Service, Way::Plain];

    fn label(self) -> &'static str {
        match self {
            Way::Apply => "writer `apply`, records in memory",
            Way::ApplyKv => "writer `apply`, records in the bus's bucket",
            Way::Service => "`nisse serve vault-writer`, through the bus",
            Way::Plain => "plain write + fsync + rename + fsync folder",
        }
    }
}

/// One round of the write part: notes per second of each way.
struct WriteRound {
    per_second: Vec<(Way, f64)>,
}

impl WriteRound {
    fn of(&self, way: Way) -> f64 {
        self.per_second
            .iter()
            .find(|(w, _)| *w == way)
            .map_or(f64::NAN, |(_, v)| *v)
    }
}

/// The `i`th write of round `round`: a fact note with a body of a few
/// sentences, hosts and tags.
fn fact_write(rng: &mut Rng, round: usize, way: Way, i: usize) -> VaultWrite {
    let host = *rng.pick(HOSTS);
    let svc = *rng.pick(SERVICES);
    let request_id = format!("bench-w{round}-{way:?}-{i:05}");
    let n = 4 + rng.below(4);
    let said = paragraph(rng, n, host, svc);
    VaultWrite {
        envelope: Some(Envelope {
            agent: AGENT.into(),
            message_id: format!("vault-write:{request_id}"),
            work_item_id: format!("item-{:06}", i / 4),
            created_at: Some(std::time::SystemTime::now().into()),
            ..Envelope::default()
        }),
        request_id,
        path: format!("memory/ops/facts/r{round}/{host}-{svc}-{i:05}.md"),
        markdown: format!("{said}\n\nObserved on [[{host}]].\n"),
        frontmatter: [("title".to_string(), format!("{svc} on {host}"))].into(),
        mode: VaultWriteMode::Create as i32,
        expected_sha256: String::new(),
        source: "driver via remember".into(),
        tags: vec!["fact".into(), svc.into()],
        lists: [(
            "hosts".to_string(),
            Strings {
                values: vec![host.into()],
            },
        )]
        .into(),
    }
}

async fn write_rounds(bench: &Bench<'_>) -> Result<Vec<WriteRound>> {
    let mut rounds = Vec::new();
    for round in 0..bench.settings.rounds {
        let root = bench.install.join(format!("writes-{round}"));
        // Each way its own writes (request ids, message ids and folders
        // of its own: the bucket and the stream keep them apart), made
        // before the clock starts.
        let mut rng = Rng(5000 + round as u64);
        let writes: Vec<(Way, Vec<VaultWrite>)> = Way::ALL
            .iter()
            .map(|&way| {
                let mut rng = Rng(rng.next());
                let w = (0..bench.settings.writes)
                    .map(|i| fact_write(&mut rng, round, way, i))
                    .collect();
                (way, w)
            })
            .collect();
        let of = |way: Way| -> Result<&Vec<VaultWrite>> {
            Ok(&writes
                .iter()
                .find(|(w, _)| *w == way)
                .with_context(|| format!("the writes of {way:?}"))?
                .1)
        };
        // The baseline writes the bytes the writer writes: an untimed
        // `apply` of its writes into a scratch folder gives them.
        let scratch = root.join("scratch");
        fs::create_dir_all(&scratch)?;
        apply_all(
            &scratch,
            &bench.agent,
            of(Way::Plain)?,
            0,
            &mut MemoryRecords::default(),
        )
        .await?;
        let notes = read_back(&scratch, of(Way::Plain)?)?;
        fs::remove_dir_all(&scratch)?;

        // The service runs first in even rounds, last in odd ones.
        let service = async || -> Result<Duration> {
            service_all(bench, &root, round, of(Way::Service)?).await
        };
        let service_took = if round % 2 == 0 {
            Some(service().await?)
        } else {
            None
        };
        // The in-process ways in chunks, turn about, so a disk that is
        // slower for a while (the virtual disk's flushes vary by a
        // factor of two over seconds) weighs on each the same.
        let mut took = [Duration::ZERO; 3];
        let in_process = [Way::Apply, Way::ApplyKv, Way::Plain];
        let (apply_vault, kv_vault) = (root.join("apply"), root.join("apply-kv"));
        fs::create_dir_all(&apply_vault)?;
        fs::create_dir_all(&kv_vault)?;
        let mut memory = MemoryRecords::default();
        let mut kv = KvRecords::new(bench.admin.clone(), bench.agent.clone());
        let count = bench.settings.writes;
        for (c, from) in (0..count).step_by(CHUNK).enumerate() {
            let to = (from + CHUNK).min(count);
            let mut order = in_process;
            order.rotate_left((c + round) % in_process.len());
            for way in order {
                let slot = in_process.iter().position(|w| *w == way).unwrap_or(0);
                took[slot] += match way {
                    Way::Apply => {
                        let w = &of(way)?[from..to];
                        apply_all(&apply_vault, &bench.agent, w, from, &mut memory).await?
                    }
                    Way::ApplyKv => {
                        let w = &of(way)?[from..to];
                        apply_all(&kv_vault, &bench.agent, w, from, &mut kv).await?
                    }
                    _ => {
                        let (vault, chunk) = (root.join("plain"), notes[from..to].to_vec());
                        tokio::task::spawn_blocking(move || plain_all(&vault, &chunk)).await??
                    }
                };
            }
        }
        let service_took = match service_took {
            Some(t) => t,
            None => service().await?,
        };
        let rate = |t: Duration| count as f64 / t.as_secs_f64();
        let r = WriteRound {
            per_second: vec![
                (Way::Apply, rate(took[0])),
                (Way::ApplyKv, rate(took[1])),
                (Way::Service, rate(service_took)),
                (Way::Plain, rate(took[2])),
            ],
        };
        let plain = r.of(Way::Plain);
        println!(
            "write round {round} (the service {}): {}",
            if round % 2 == 0 { "first" } else { "last" },
            r.per_second
                .iter()
                .map(|(w, rate)| format!("{w:?} {rate:.0}/s ({:.2})", rate / plain))
                .collect::<Vec<_>>()
                .join(", ")
        );
        fs::remove_dir_all(&root).ok();
        rounds.push(r);
    }
    Ok(rounds)
}

/// `writes` through the writer's `apply`, one after another, as the
/// service applies an agent's writes, the first at stream sequence
/// `before + 1`; every one must be written.
async fn apply_all<R: Records>(
    vault: &Path,
    agent: &AgentName,
    writes: &[VaultWrite],
    before: usize,
    records: &mut R,
) -> Result<Duration> {
    let started = Instant::now();
    for (i, write) in writes.iter().enumerate() {
        let seq = (before + i) as u64 + 1;
        let outcome = writer::apply(vault, agent, write, seq, records, History::None).await?;
        ensure!(
            outcome.written,
            "{} was not written: {}",
            write.path,
            outcome.reason
        );
    }
    Ok(started.elapsed())
}

/// The bytes of each note `writes` left under `vault`.
fn read_back(vault: &Path, writes: &[VaultWrite]) -> Result<Vec<(String, Vec<u8>)>> {
    writes
        .iter()
        .map(|w| {
            let file = vault.join(&w.path);
            Ok((
                w.path.clone(),
                fs::read(&file).with_context(|| format!("reading {}", file.display()))?,
            ))
        })
        .collect()
}

/// The baseline: each note's bytes written to a temporary beside it,
/// fsynced, renamed over it, and the folder fsynced, one after another.
/// The folders are made first (the writer makes each once, on its first
/// note there).
fn plain_all(vault: &Path, notes: &[(String, Vec<u8>)]) -> Result<Duration> {
    let folders: HashSet<PathBuf> = notes
        .iter()
        .filter_map(|(p, _)| vault.join(p).parent().map(Path::to_path_buf))
        .collect();
    for folder in &folders {
        fs::create_dir_all(folder)?;
    }
    let started = Instant::now();
    for (path, bytes) in notes {
        let target = vault.join(path);
        let folder = target.parent().context("a note's folder")?;
        let name = target.file_name().context("a note's name")?;
        let temp = folder.join(format!(".{}.tmp", name.to_string_lossy()));
        let mut file = File::create(&temp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        drop(file);
        fs::rename(&temp, &target)?;
        File::open(folder)?.sync_all()?;
    }
    Ok(started.elapsed())
}

/// `writes` published as the brain to `nisse serve vault-writer`, timed
/// from the first publish to the last answer. The writer is started, and
/// has answered one write, before the clock starts.
async fn service_all(
    bench: &Bench<'_>,
    root: &Path,
    round: usize,
    writes: &[VaultWrite],
) -> Result<Duration> {
    let vault = root.join("service");
    let install = root.join("service-install");
    write_config(&install, &bench.data, &bench.url, Some(&vault))?;
    let subject = bench.agent.subject(SubjectKind::VaultWritten);
    let mut answers = bench.admin.client().subscribe(subject.clone()).await?;
    let mut writer = Proc::spawn(&install, "vault-writer", round)?;

    // One write first: the service is up and its consumer bound.
    let mut first = writes[0].clone();
    first.request_id.push_str("-first");
    first.path = first.path.replace(".md", "-first.md");
    if let Some(e) = first.envelope.as_mut() {
        e.message_id.push_str("-first");
    }
    let first_id = first.request_id.clone();
    bench.brain.publish(first).await?;
    let deadline = tokio::time::Instant::now() + START_TIMEOUT;
    loop {
        writer.check_alive()?;
        let next = tokio::time::timeout_at(deadline, answers.next())
            .await
            .with_context(|| {
                format!(
                    "nisse serve vault-writer did not answer within {START_TIMEOUT:?}; log tail:\n{}",
                    log_tail(&writer.log)
                )
            })?
            .context("the answers' subscription ended")?;
        if VaultWritten::decode(next.payload.as_ref())?.request_id == first_id {
            break;
        }
    }

    let wanted: HashSet<String> = writes.iter().map(|w| w.request_id.clone()).collect();
    let started = Instant::now();
    // The brain sends each write as it decides it, without waiting for
    // the answer; the writer applies them one at a time in stream order.
    let publish = async {
        for write in writes {
            bench.brain.publish(write.clone()).await?;
        }
        Ok::<_, anyhow::Error>(())
    };
    let collect = async {
        let mut seen = HashSet::new();
        let deadline =
            tokio::time::Instant::now() + ANSWER_TIMEOUT + Duration::from_secs(writes.len() as u64);
        while seen.len() < wanted.len() {
            let next = tokio::time::timeout_at(deadline, answers.next())
                .await
                .context("the vault writer did not answer every write in time")?
                .context("the answers' subscription ended")?;
            let answer = VaultWritten::decode(next.payload.as_ref())?;
            if wanted.contains(&answer.request_id) {
                ensure!(
                    answer.written,
                    "{} was not written: {}",
                    answer.path,
                    answer.reason
                );
                seen.insert(answer.request_id);
            }
        }
        Ok::<_, anyhow::Error>(started.elapsed())
    };
    let (published, took) = tokio::join!(publish, collect);
    published?;
    let took = took?;
    writer.stop(true).await?;
    Ok(took)
}

// ---------------------------------------------------------------------------
// The summary.

fn summary(bench: &Bench<'_>, search: &Search, writes: &[WriteRound]) {
    println!();
    println!(
        "== search: {} notes, {:.1} MB, {} round(s) (medians over rounds; p50/p99 over every query of every round)",
        search.notes,
        search.bytes as f64 / 1e6,
        search.rounds.len()
    );
    let index = median(search.rounds.iter().map(|r| r.index_ms).collect());
    let start = median(
        search
            .rounds
            .iter()
            .map(|r| ms(r.start_to_answer))
            .collect(),
    );
    let pass = median(
        search
            .rounds
            .iter()
            .filter_map(|r| r.rg_pass.map(ms))
            .collect(),
    );
    if bench.rg.is_some() {
        println!(
            "index build (the reader's figure)     {index:>8.0} ms   one rg pass over every note {pass:>7.1} ms   ratio {:>6.1}",
            index / pass
        );
        println!(
            "process start to its first answer     {start:>8.0} ms   ratio to the rg pass {:>6.1}",
            start / pass
        );
    } else {
        println!("index build (the reader's figure)     {index:>8.0} ms");
        println!("process start to its first answer     {start:>8.0} ms");
    }
    let walk = median(search.rounds.iter().map(|r| ms(r.walk)).collect());
    println!(
        "a walk of the readable folders (listing + lstat per note, from the bench): {walk:.1} ms"
    );
    let all = |f: fn(&SearchRound) -> &Kind| -> Kind {
        let mut out = Kind::default();
        for r in &search.rounds {
            let k = f(r);
            out.reader.extend(&k.reader);
            out.rg.extend(&k.rg);
            out.answered += k.answered;
            out.listed += k.listed;
        }
        out
    };
    println!(
        "{:<28} {:>7} {:>9} {:>9} {:>9} {:>9} {:>8} {:>8} {:>10} {:>10}",
        "query",
        "asked",
        "p50 ms",
        "p99 ms",
        "rg p50",
        "rg p99",
        "p50 x",
        "p99 x",
        "notes/ans",
        "rg files"
    );
    for (label, kind) in [
        ("text search", all(|r| &r.text)),
        ("alert search (fp + host)", all(|r| &r.alert)),
        ("read one note", all(|r| &r.read)),
    ] {
        let (p50, p99) = (
            ms(percentile(&kind.reader, 0.5)),
            ms(percentile(&kind.reader, 0.99)),
        );
        let asked = kind.reader.len();
        if kind.rg.is_empty() {
            println!(
                "{label:<28} {asked:>7} {p50:>9.2} {p99:>9.2} {:>9} {:>9} {:>8} {:>8} {:>10.1} {:>10}",
                "-",
                "-",
                "-",
                "-",
                kind.answered as f64 / asked.max(1) as f64,
                "-"
            );
        } else {
            let (r50, r99) = (
                ms(percentile(&kind.rg, 0.5)),
                ms(percentile(&kind.rg, 0.99)),
            );
            println!(
                "{label:<28} {asked:>7} {p50:>9.2} {p99:>9.2} {r50:>9.2} {r99:>9.2} {:>8.2} {:>8.2} {:>10.1} {:>10.0}",
                p50 / r50,
                p99 / r99,
                kind.answered as f64 / asked.max(1) as f64,
                kind.listed as f64 / kind.rg.len() as f64
            );
        }
    }
    if bench.rg.is_none() {
        println!("(no rg: the search has no baseline in this run)");
    }

    println!();
    println!(
        "== writes: {} notes per way, {} round(s) (medians over rounds)",
        bench.settings.writes,
        writes.len()
    );
    for way in Way::ALL {
        let rate = median(writes.iter().map(|r| r.of(way)).collect());
        let ratio = median(
            writes
                .iter()
                .map(|r| r.of(way) / r.of(Way::Plain))
                .collect(),
        );
        println!(
            "{:<48} {rate:>9.0} notes/s   ratio to plain {ratio:>5.2}   {:>7.2} ms/note",
            way.label(),
            1e3 / rate
        );
    }
    if !bench.settings.full {
        println!("(smoke run: the figures mean nothing)");
    }
}
