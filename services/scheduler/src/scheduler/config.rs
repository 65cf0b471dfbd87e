//! What the scheduler runs with, checked before it publishes anything.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use nisse_bus::AgentName;
use nisse_bus::topology::{MAX_DUTY_NAME, is_duty_name};

/// The shortest interval of a clock or a duty. Shorter ones would fill an
/// agent's stream with time and keep its brain busy applying it, for
/// nothing an agent does that needs it.
pub const MIN_INTERVAL: Duration = Duration::from_millis(100);

/// The scheduler's section: each agent's clock and its duties' schedules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// How often every agent's clock ticks (`nisse.<agent>.in.tick`): the
    /// finest time an agent's brain can see, since it learns time only
    /// from its stream.
    pub tick: Duration,
    /// Each agent's duties and how often each is due
    /// (`nisse.<agent>.in.duty.duty-<name>`). Agents the scheduler is not
    /// started for are not scheduled: each agent's scheduler runs on a
    /// connection of its own, with the same section.
    pub duties: BTreeMap<AgentName, Vec<Schedule>>,
}

/// One duty's schedule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct Schedule {
    /// The duty's name: lowercase letters, digits and `-`, at most
    /// [`MAX_DUTY_NAME`] characters. Its work item is `duty-<name>`.
    pub name: String,
    /// How often it is due (`15m`, `1h`): at every whole multiple of it
    /// since the Unix epoch.
    #[serde(with = "humantime_serde")]
    pub interval: Duration,
}

/// What is wrong with a [`Config`], naming the setting at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// The clock's interval cannot be used.
    #[error("scheduler tick: {0}")]
    Tick(IntervalError),
    /// A duty's name cannot be a subject token of Nisse's.
    #[error(
        "duty `{duty}` of agent `{agent}`: not a valid duty name: use lowercase letters, digits and `-`, 1 to {MAX_DUTY_NAME} characters"
    )]
    DutyName {
        /// The agent whose duty it is.
        agent: AgentName,
        /// The name as configured.
        duty: String,
    },
    /// Two schedules for one duty would publish on one subject.
    #[error("duty `{duty}` of agent `{agent}` is scheduled twice: a duty has one schedule")]
    DuplicateDuty {
        /// The agent whose duty it is.
        agent: AgentName,
        /// The duty's name.
        duty: String,
    },
    /// A duty's interval cannot be used.
    #[error("duty `{duty}` of agent `{agent}`: {reason}")]
    DutyInterval {
        /// The agent whose duty it is.
        agent: AgentName,
        /// The duty's name.
        duty: String,
        /// What is wrong with the interval.
        reason: IntervalError,
    },
}

/// What is wrong with an interval.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IntervalError {
    /// Below [`MIN_INTERVAL`].
    #[error("interval {} is too short: at least {}", humantime::format_duration(*.0), humantime::format_duration(MIN_INTERVAL))]
    TooShort(Duration),
    /// Due instants are whole milliseconds since the epoch, in messages and
    /// in dedup ids, so an interval must be too.
    #[error("interval {} is not a whole number of milliseconds", humantime::format_duration(*.0))]
    NotWholeMilliseconds(Duration),
    /// Longer than any instant can be counted in milliseconds.
    #[error("interval {} is too long", humantime::format_duration(*.0))]
    TooLong(Duration),
}

impl Config {
    /// Checks every interval and duty name, naming the first one at fault.
    pub fn validate(&self) -> Result<(), ConfigError> {
        interval_ms(self.tick).map_err(ConfigError::Tick)?;
        for (agent, schedules) in &self.duties {
            let mut seen = BTreeSet::new();
            for schedule in schedules {
                let duty = || schedule.name.clone();
                if !is_duty_name(&schedule.name) {
                    return Err(ConfigError::DutyName {
                        agent: agent.clone(),
                        duty: duty(),
                    });
                }
                if !seen.insert(schedule.name.as_str()) {
                    return Err(ConfigError::DuplicateDuty {
                        agent: agent.clone(),
                        duty: duty(),
                    });
                }
                interval_ms(schedule.interval).map_err(|reason| ConfigError::DutyInterval {
                    agent: agent.clone(),
                    duty: duty(),
                    reason,
                })?;
            }
        }
        Ok(())
    }
}

/// `interval` in milliseconds, if it can be an interval.
pub(super) fn interval_ms(interval: Duration) -> Result<u64, IntervalError> {
    if interval < MIN_INTERVAL {
        return Err(IntervalError::TooShort(interval));
    }
    if !interval.subsec_nanos().is_multiple_of(1_000_000) {
        return Err(IntervalError::NotWholeMilliseconds(interval));
    }
    u64::try_from(interval.as_millis()).map_err(|_| IntervalError::TooLong(interval))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agent() -> AgentName {
        "ops".parse().unwrap()
    }

    fn with_duty(name: &str, interval: Duration) -> Config {
        Config {
            tick: Duration::from_secs(1),
            duties: BTreeMap::from([(
                agent(),
                vec![Schedule {
                    name: name.into(),
                    interval,
                }],
            )]),
        }
    }

    #[test]
    fn duty_names_are_subject_tokens() {
        let second = Duration::from_secs(1);
        assert_eq!(with_duty("disk-usage-2", second).validate(), Ok(()));
        for bad in [
            "",
            "Disk",
            "disk usage",
            "disk.usage",
            "disk_usage",
            "dísk",
            "*",
        ] {
            assert_eq!(
                with_duty(bad, second).validate(),
                Err(ConfigError::DutyName {
                    agent: agent(),
                    duty: bad.into()
                }),
                "{bad:?}"
            );
        }
        let long = "d".repeat(MAX_DUTY_NAME + 1);
        assert!(with_duty(&long, second).validate().is_err());
        assert!(with_duty(&long[1..], second).validate().is_ok());
    }

    #[test]
    fn intervals_are_whole_milliseconds_from_100() {
        assert!(with_duty("d", MIN_INTERVAL).validate().is_ok());
        let err = with_duty("d", Duration::from_millis(99))
            .validate()
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "duty `d` of agent `ops`: interval 99ms is too short: at least 100ms"
        );
        let err = with_duty("d", Duration::from_micros(100_500))
            .validate()
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "duty `d` of agent `ops`: interval 100ms 500us is not a whole number of milliseconds"
        );
        let mut config = with_duty("d", MIN_INTERVAL);
        config.tick = Duration::ZERO;
        assert_eq!(
            config.validate().unwrap_err().to_string(),
            "scheduler tick: interval 0s is too short: at least 100ms"
        );
    }

    #[test]
    fn a_duty_has_one_schedule() {
        let mut config = with_duty("d", MIN_INTERVAL);
        config.duties.get_mut(&agent()).unwrap().push(Schedule {
            name: "d".into(),
            interval: Duration::from_secs(5),
        });
        assert_eq!(
            config.validate().unwrap_err().to_string(),
            "duty `d` of agent `ops` is scheduled twice: a duty has one schedule"
        );
    }
}
