//! One `nisse serve <service>` process of a bench, as a supervisor runs
//! it: configured only by its install's `nisse.toml`, its JSON log lines
//! in a file. Included by the end-to-end benches (`#[path]`).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context as _, Result, bail, ensure};
use tokio::process::{Child, Command};

/// How long a stopped process may take to drain and exit.
pub const STOP_TIMEOUT: Duration = Duration::from_secs(30);

/// One `nisse serve <service>` process.
pub struct Proc {
    /// The service it runs.
    pub service: &'static str,
    child: Child,
    /// Its process id (for its CPU time).
    #[allow(dead_code, reason = "each bench uses a part of it")]
    pub pid: u32,
    /// Its log file.
    pub log: PathBuf,
}

impl Proc {
    /// Starts `nisse serve <service>` in `install`, its stderr (JSON log
    /// lines, as under a supervisor) in `<service>.<round>.log`.
    pub fn spawn(install: &Path, service: &'static str, round: usize) -> Result<Self> {
        let log = install.join(format!("{service}.{round}.log"));
        let file =
            std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_nisse"));
        cmd.current_dir(install)
            .arg("serve")
            .arg(service)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(file)
            .kill_on_drop(true);
        // Only nisse.toml configures it: the bench's own NISSE_BENCH_*
        // would be read as settings, and a log filter or a trace exporter
        // of the caller's would change what is measured.
        for (k, _) in std::env::vars_os() {
            let k = k.to_string_lossy();
            if k.starts_with("NISSE_") || k == "RUST_LOG" || k.starts_with("OTEL_") {
                cmd.env_remove(&*k);
            }
        }
        let child = cmd
            .spawn()
            .with_context(|| format!("starting nisse serve {service}"))?;
        let pid = child
            .id()
            .with_context(|| format!("nisse serve {service} exited at once"))?;
        Ok(Self {
            service,
            child,
            pid,
            log,
        })
    }

    /// Fails, with its log's tail, if it has exited.
    pub fn check_alive(&mut self) -> Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!(
                "nisse serve {} exited with {status}; log tail:\n{}",
                self.service,
                log_tail(&self.log)
            );
        }
        Ok(())
    }

    /// How much it has logged, in bytes.
    #[allow(dead_code, reason = "each bench uses a part of it")]
    pub fn log_len(&self) -> u64 {
        std::fs::metadata(&self.log).map_or(0, |m| m.len())
    }

    /// SIGTERM, then waits for it to drain and exit; with `no_errors`,
    /// fails if it logged an error.
    pub async fn stop(mut self, no_errors: bool) -> Result<()> {
        let log = self.log.clone();
        nisse_tests::stop_child(
            &mut self.child,
            &format!("nisse serve {}", self.service),
            STOP_TIMEOUT,
            || log_tail(&log),
        )
        .await?;
        if no_errors {
            let errors: Vec<String> = std::fs::read_to_string(&self.log)
                .unwrap_or_default()
                .lines()
                .filter(|l| l.contains("\"level\":\"ERROR\""))
                .map(str::to_string)
                .collect();
            ensure!(
                errors.is_empty(),
                "nisse serve {} logged errors:\n{}",
                self.service,
                errors.join("\n")
            );
        }
        Ok(())
    }
}

/// The last 20 lines of a log file.
pub fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}
