//! The scheduler: where the wall clock enters Nisse.
//!
//! A brain decides from its stream alone, so that replaying the stream
//! reproduces what it did (seed L2, L8). It never reads a clock; a
//! deadline passes, an approval expires and a duty runs because a message
//! on its stream says the time has come. This service publishes those
//! messages: each agent's clock, a `Tick` on `nisse.<agent>.in.tick` every
//! `tick`, and for each of its duties a `DutyDue` on
//! `nisse.<agent>.in.duty.duty-<name>` every interval of the duty.
//!
//! Due instants are whole multiples of the interval since the Unix epoch,
//! and each message's dedup id is made of the agent, the clock or duty and
//! the instant (`tick:<agent>:<ms>`, `due:<agent>:<duty>:<ms>`). Every
//! instance therefore publishes the same ids, and JetStream keeps one
//! message per instant however many run: running two is how the
//! scheduler is made highly available, with no election.
//!
//! A scheduler that was not running, or could not reach the bus, does not
//! make up for it with a burst: it reads the last message of each clock
//! and duty from the stream and publishes one message for the latest due
//! instant, saying how many instants it stands for (`missed`) and how
//! late it is (`late_ms`). A duty that runs hourly runs once after a
//! day's outage, knowing it was skipped 23 times.
//!
//! It is not a job runner: what a duty does when due is the brain's.

mod config;
mod timer;

pub use config::{Config, ConfigError, IntervalError, MIN_INTERVAL, Schedule};

use futures::future::join_all;

use nisse_bus::service::{Context, Service};

use self::config::interval_ms;
use self::timer::{Clock, Timer};

/// The service.
pub const SERVICE: Service = Service {
    name: "scheduler",
    about: "the wall clock on each agent's stream: its ticks and its duties' due instants",
};

/// Checks the configuration, catches every clock and duty of the agents
/// served up with the stream (one message each at most), reports ready,
/// then publishes at every due instant until shutdown.
pub async fn run(ctx: Context<Config>) -> anyhow::Result<()> {
    let config = &ctx.config;
    config.validate()?;
    let mut timers = Vec::new();
    for agent in &ctx.agents {
        timers.push(Timer::new(
            agent.clone(),
            Clock::Tick,
            interval_ms(config.tick)?,
        ));
        let duties = config.duties.get(agent).map_or(&[][..], Vec::as_slice);
        for duty in duties {
            timers.push(Timer::new(
                agent.clone(),
                Clock::Duty(duty.name.clone()),
                interval_ms(duty.interval)?,
            ));
        }
        let names: Vec<String> = duties
            .iter()
            .map(|d| {
                format!(
                    "{} every {}",
                    d.name,
                    humantime::format_duration(d.interval)
                )
            })
            .collect();
        tracing::info!(
            %agent,
            tick = %humantime::format_duration(config.tick),
            duties = %names.join(", "),
            "scheduling the agent's clock and duties"
        );
    }
    if timers.is_empty() {
        // No agent to serve: idle, as every service without work is.
        ctx.ready.ready();
        ctx.shutdown.cancelled().await;
        return Ok(());
    }

    // Ready means the stream is up to date: a brain started after this
    // sees every duty that was due.
    let caught_up = join_all(
        timers
            .iter_mut()
            .map(|t| t.bring_up_to_date(&ctx.bus, &ctx.shutdown)),
    )
    .await;
    if caught_up.contains(&false) {
        return Ok(());
    }
    ctx.ready.ready();

    join_all(
        timers
            .into_iter()
            .map(|t| t.run(ctx.bus.clone(), ctx.shutdown.clone())),
    )
    .await;
    Ok(())
}
