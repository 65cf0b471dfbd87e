//! Live events for every watcher at once: what the read models applied,
//! sent once into a bounded ring that every `Watch` call (and the web
//! room's event stream) reads at its own pace.
//!
//! Memory is bounded by the ring, whatever the number of watchers: a
//! watcher that falls a whole ring behind is told how many events it
//! missed and ends, rather than holding the rest back or growing a queue
//! of its own; it watches again and reads the current state.

use tokio::sync::broadcast;

use crate::api::Event;

/// How many events the ring holds: a burst of alerts is a few events per
/// alert (the alert, the brain's messages about it, the item's change).
pub const RING: usize = 65_536;

/// The hub: one sender, any number of watchers.
#[derive(Debug, Clone)]
pub struct Hub {
    tx: broadcast::Sender<Event>,
}

impl Default for Hub {
    fn default() -> Self {
        Self::new(RING)
    }
}

impl Hub {
    /// A hub keeping the last `ring` events for slow watchers.
    pub fn new(ring: usize) -> Self {
        let (tx, _) = broadcast::channel(ring);
        Self { tx }
    }

    /// Sends `event` to every watcher there is now (none is fine).
    pub fn send(&self, event: Event) {
        let _ = self.tx.send(event);
    }

    /// A new watcher: every event sent from now on.
    pub fn watch(&self) -> broadcast::Receiver<Event> {
        self.tx.subscribe()
    }

    /// How many watchers there are now.
    pub fn watchers(&self) -> usize {
        self.tx.receiver_count()
    }
}
