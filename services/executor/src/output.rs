//! A running command's output: each stream redacted as it arrives and
//! capped (the head and the tail kept, the middle counted: the bus's
//! [`Capped`], which the mcp service caps tool content with too), and
//! its new part kept for progress messages.

pub use nisse_bus::capped::Capped;

use crate::redact::{self, Redactor};
use crate::ssh::Chunk;

/// Most output one progress message carries.
const PROGRESS_MAX: usize = 4096;

/// Both output streams of a running command: redacted as they arrive,
/// capped for the result, and the new part kept for the next progress
/// message.
pub(crate) struct Output<'a> {
    stdout: Stream<'a>,
    stderr: Stream<'a>,
}

struct Stream<'a> {
    redact: redact::StreamRedactor<'a>,
    capped: Capped,
    fresh: Vec<u8>,
}

impl<'a> Stream<'a> {
    fn new(redactor: &'a Redactor, cap: usize) -> Self {
        Self {
            redact: redactor.stream(),
            capped: Capped::new(cap),
            fresh: Vec::new(),
        }
    }

    fn take(&mut self, data: Vec<u8>) {
        self.capped.push(&data);
        self.fresh.extend_from_slice(&data);
        if self.fresh.len() > PROGRESS_MAX {
            self.fresh.drain(..self.fresh.len() - PROGRESS_MAX);
        }
    }
}

impl<'a> Output<'a> {
    pub(crate) fn new(redactor: &'a Redactor, cap: usize) -> Self {
        Self {
            stdout: Stream::new(redactor, cap),
            stderr: Stream::new(redactor, cap),
        }
    }

    pub(crate) fn push(&mut self, chunk: Chunk) {
        match chunk {
            Chunk::Stdout(data) => {
                let clean = self.stdout.redact.push(&data);
                self.stdout.take(clean);
            }
            Chunk::Stderr(data) => {
                let clean = self.stderr.redact.push(&data);
                self.stderr.take(clean);
            }
        }
    }

    /// New output since the last call, if any.
    pub(crate) fn take_progress(&mut self) -> Option<(Vec<u8>, Vec<u8>)> {
        if self.stdout.fresh.is_empty() && self.stderr.fresh.is_empty() {
            return None;
        }
        Some((
            std::mem::take(&mut self.stdout.fresh),
            std::mem::take(&mut self.stderr.fresh),
        ))
    }

    pub(crate) fn finish(mut self) -> (Vec<u8>, u64, Vec<u8>, u64) {
        let rest = self.stdout.redact.finish();
        self.stdout.capped.push(&rest);
        let rest = self.stderr.redact.finish();
        self.stderr.capped.push(&rest);
        let (stdout, stdout_dropped) = self.stdout.capped.finish();
        let (stderr, stderr_dropped) = self.stderr.capped.finish();
        (stdout, stdout_dropped, stderr, stderr_dropped)
    }
}
