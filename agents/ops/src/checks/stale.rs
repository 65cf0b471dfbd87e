//! The stale sweep (Oikos REQ-OBS-4): a firing alert that Alertmanager has
//! not sent again within `ops.stale-after` (three repeat intervals by
//! default) may be firing into a void — Alertmanager stopped, the rule or
//! the exporter is gone — and is not silently taken as still firing, nor
//! as resolved: it is marked stale and the operator is told, once until it
//! is heard of again.

use nisse_core::markdown::md_escape as md;
use nisse_core::{Actor, BrainSettings, Event, Say, StoreError, Txn};

use crate::alerts::ALERT_DUTY;
use crate::brain::OpsDuties;

impl OpsDuties {
    /// At a tick: marks every open alert item whose last firing finding
    /// is older than `stale-after`, once.
    pub(crate) fn sweep_stale(
        &self,
        brain: &BrainSettings,
        txn: &mut Txn<'_, '_>,
    ) -> Result<(), StoreError> {
        let stale_after = self.config.stale_after();
        let Ok(window) = time::Duration::try_from(stale_after) else {
            return Ok(());
        };
        // A window reaching before the first representable time marks
        // nothing.
        let Some(before) = txn.at().checked_sub(window) else {
            return Ok(());
        };
        for (item, last, last_at) in txn.quiet_findings(ALERT_DUTY, before)? {
            if txn.has_fact_after(&item.id, last, "stale_since")? {
                continue;
            }
            let since = last_at
                .format(&time::format_description::well_known::Rfc3339)
                .unwrap_or_default();
            let event = txn.append(
                &item.id,
                &Actor::agent(&brain.agent),
                &Event::Fact {
                    text: format!(
                        "the alert is stale: Alertmanager has not sent it again since {since} ({} allowed)",
                        humantime::format_duration(stale_after)
                    ),
                    data: serde_json::json!({ "stale_since": since }),
                },
            )?;
            txn.say(
                &brain.agent,
                &item,
                event,
                Say::fact(format!(
                    "🕸️ Item **#{}** (**{}**): the alert is stale. Alertmanager last sent it at {since} and should have sent it again within {}; it may have stopped, or the rule or exporter may be gone. The item stays open.",
                    item.number,
                    md(&item.title),
                    humantime::format_duration(stale_after)
                )),
            )?;
        }
        Ok(())
    }
}
