//! `cargo bench -p nisse-policy --bench classify`: how fast the built-in
//! policy loads and classifies command lines, over every command of the
//! corpora in `tests/fixtures/` (everyday reads, abuse forms, destructive
//! categories and the project's own corpus): what the classifier service
//! does for each request, and `nisse policy classify` once.
//!
//! The bench reads its commands from `NISSE_BENCH_CORPUS` (a directory of
//! `*.toml` corpora; default: this tree's `tests/fixtures`), so the same
//! file built against an earlier version of the policy crate measures that
//! version on the same commands in the same run (docs/BENCHMARKS.md says
//! how). Without `--bench` (under `cargo test --benches`) it classifies
//! each command once and prints nothing.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    missing_docs,
    reason = "a bench fails by panicking"
)]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use nisse_policy::Policy;

fn commands() -> (Vec<String>, usize) {
    let dir = std::env::var_os("NISSE_BENCH_CORPUS").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures"),
        PathBuf::from,
    );
    let mut out = Vec::new();
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("shell-") && n.ends_with(".toml"))
        })
        .collect();
    files.sort();
    let corpora = files.len();
    for path in files {
        let text = std::fs::read_to_string(&path).unwrap();
        let value: toml::Value = toml::from_str(&text).unwrap();
        for case in value["case"].as_array().unwrap() {
            out.push(case["command"].as_str().unwrap().to_string());
        }
    }
    (out, corpora)
}

fn main() {
    let bench = std::env::args().any(|a| a == "--bench");
    let (commands, corpora) = commands();
    // Loading: what every `nisse policy classify` and every service start
    // pays once, on the first call in the process (later calls share the
    // compiled tables).
    let start = Instant::now();
    let policy = Policy::builtin().unwrap();
    let load = start.elapsed();
    if !bench {
        for command in &commands {
            std::hint::black_box(policy.classify_command(command));
        }
        return;
    }

    // Classifying: rounds over every command until two seconds have gone.
    let mut classified = 0usize;
    let mut per_command: Vec<Duration> = Vec::with_capacity(commands.len() * 8);
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(2) {
        for command in &commands {
            let t = Instant::now();
            std::hint::black_box(policy.classify_command(command));
            per_command.push(t.elapsed());
            classified += 1;
        }
    }
    let elapsed = start.elapsed();
    per_command.sort();
    let pct = |p: f64| {
        let i = ((per_command.len() as f64 - 1.0) * p).round() as usize;
        per_command[i]
    };
    println!("commands: {} (from {corpora} corpora)", commands.len());
    println!("policy load (first in the process): {load:?}");
    println!(
        "classify: {:.0} commands/s; p50 {:?}, p99 {:?}, max {:?}",
        classified as f64 / elapsed.as_secs_f64(),
        pct(0.5),
        pct(0.99),
        per_command.last().copied().unwrap_or_default()
    );
}
