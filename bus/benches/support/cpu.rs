//! CPU time from Linux's per-thread schedstat, shared by the benches (this
//! one, `services/nisse/benches/alerts.rs` and `duties.rs` include this
//! file): steadier
//! than wall time on a noisy machine, and the server's share shows both
//! sides of a comparison asked the same of it.

/// CPU time of the bench process (all its threads) and of the server.
#[derive(Clone, Copy, Default)]
pub struct Cpu {
    /// This process, in nanoseconds.
    pub client_ns: u64,
    /// The server, in nanoseconds.
    pub server_ns: u64,
}

impl Cpu {
    /// The CPU time spent between `earlier` and `self`.
    pub fn since(self, earlier: Cpu) -> Cpu {
        Cpu {
            client_ns: self.client_ns.saturating_sub(earlier.client_ns),
            server_ns: self.server_ns.saturating_sub(earlier.server_ns),
        }
    }
}

/// CPU time so far, in nanoseconds, of every thread of this process and of
/// the server, from `/proc/<pid>/task/*/schedstat`; 0 where unavailable.
pub fn cpu_now(server_pid: Option<u32>) -> Cpu {
    Cpu {
        client_ns: of("self"),
        server_ns: server_pid.map_or(0, process_ns),
    }
}

/// CPU time so far, in nanoseconds, of every thread of process `pid`; 0
/// when it is gone.
#[allow(dead_code, reason = "not every bench measures other processes")]
pub fn process_ns(pid: u32) -> u64 {
    of(&pid.to_string())
}

fn of(pid: &str) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|text| text.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}
