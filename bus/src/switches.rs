//! The kill switches' state, in a NATS key-value bucket every service can
//! read: the global autonomy switch and per-target `never` switches.
//!
//! The bucket is the one place the switches live. The operator changes
//! them (`nisse autonomy …`); the classifier reads them for every verdict
//! and the executor again before it runs anything, so a switch flipped
//! between an approval and an execution still holds. What the switches
//! mean is `nisse-policy`'s (`switches::consult`); this module only stores
//! them. The whole board is one value, changed by compare-and-set, so two
//! operators changing it at once never lose each other's change.

use std::collections::BTreeMap;

use async_nats::jetstream::kv;
use serde::{Deserialize, Serialize};

use crate::topology::SWITCH_BUCKET;
use crate::{Bus, Error, Result};

/// The key of the board in the bucket.
const BOARD_KEY: &str = "board";

/// The switches as stored.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SwitchBoard {
    /// Autonomy is off: every non-read-only action needs the operator.
    pub autonomy_off: bool,
    /// Targets switched to `never`, with why.
    pub never: BTreeMap<String, NeverEntry>,
    /// Who changed the board last.
    #[serde(default)]
    pub changed_by: String,
    /// When, in seconds since the Unix epoch.
    #[serde(default)]
    pub changed_at: u64,
}

impl SwitchBoard {
    /// Each `never` target with why, as a refusal says it (the operator's
    /// reason and who set it): what `consult_action` is given.
    pub fn never_reasons(&self) -> impl Iterator<Item = (&str, String)> {
        self.never
            .iter()
            .map(|(t, e)| (t.as_str(), format!("{} (set by {})", e.reason, e.set_by)))
    }
}

/// One `never` switch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NeverEntry {
    /// Why, in the operator's words.
    pub reason: String,
    /// Who set it.
    pub set_by: String,
}

/// The board and the bucket revision it was read at.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SwitchState {
    /// The board (the default, all on, when never set).
    pub board: SwitchBoard,
    /// The bucket revision; 0 when the board was never written.
    pub revision: u64,
}

impl Bus {
    /// Reads the switches. An error means they could not be read: callers
    /// deciding whether to act fail closed on it.
    pub async fn switches(&self) -> Result<SwitchState> {
        let store = self.bucket(SWITCH_BUCKET).await?;
        read_board(&store).await
    }

    /// Changes the switches with `change`, as `by`, by compare-and-set
    /// (retried when someone else changed them in between).
    pub async fn update_switches(
        &self,
        by: &str,
        change: impl Fn(&mut SwitchBoard),
    ) -> Result<SwitchState> {
        let store = self.bucket(SWITCH_BUCKET).await?;
        let err = |e: &dyn std::fmt::Display| Error::JetStream {
            action: "write the switch board".into(),
            reason: e.to_string(),
        };
        for _ in 0..16 {
            let current = read_board(&store).await?;
            let mut board = current.board.clone();
            change(&mut board);
            board.changed_by = by.to_string();
            board.changed_at = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            let bytes = serde_json::to_vec(&board).map_err(|e| err(&e))?;
            let written = if current.revision == 0 {
                store.create(BOARD_KEY, bytes.into()).await.map_err(|e| {
                    (e.kind() == kv::CreateErrorKind::AlreadyExists)
                        .then_some(())
                        .ok_or_else(|| err(&e))
                })
            } else {
                store
                    .update(BOARD_KEY, bytes.into(), current.revision)
                    .await
                    .map_err(|e| {
                        (e.kind() == kv::UpdateErrorKind::WrongLastRevision)
                            .then_some(())
                            .ok_or_else(|| err(&e))
                    })
            };
            match written {
                Ok(revision) => return Ok(SwitchState { board, revision }),
                // Someone else wrote in between: read again and retry.
                Err(Ok(())) => continue,
                Err(Err(e)) => return Err(e),
            }
        }
        Err(Error::JetStream {
            action: "write the switch board".into(),
            reason: "it kept changing underneath; try again".into(),
        })
    }
}

async fn read_board(store: &kv::Store) -> Result<SwitchState> {
    let err = |e: &dyn std::fmt::Display| Error::JetStream {
        action: "read the switch board".into(),
        reason: e.to_string(),
    };
    match store.entry(BOARD_KEY).await.map_err(|e| err(&e))? {
        Some(entry) if entry.operation == kv::Operation::Put => {
            let board: SwitchBoard = serde_json::from_slice(&entry.value)
                .map_err(|e| err(&format!("the stored board is not valid: {e}")))?;
            Ok(SwitchState {
                board,
                revision: entry.revision,
            })
        }
        // Deleted or purged: only the admin identity or an operator can
        // do that (`nisse autonomy` never does), and reading it as "all on"
        // would let a deletion switch every wall off. It reads as autonomy
        // off until an operator sets the board again.
        Some(entry) => Ok(SwitchState {
            board: SwitchBoard {
                autonomy_off: true,
                changed_by: format!(
                    "(the switch board was deleted at revision {}; set it again with `nisse autonomy`)",
                    entry.revision
                ),
                ..SwitchBoard::default()
            },
            revision: entry.revision,
        }),
        // Never written: a new installation, autonomy on.
        None => Ok(SwitchState::default()),
    }
}
