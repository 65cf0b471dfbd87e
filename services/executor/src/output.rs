//! Capped command output: the head and the tail are kept, the middle is
//! counted. The start of an output says what a command was doing and the
//! end how it finished; a command that prints gigabytes must not take the
//! executor's memory or the bus's message size with it.

use std::collections::VecDeque;

use crate::redact::{self, Redactor};
use crate::ssh::Chunk;

/// Most output one progress message carries.
const PROGRESS_MAX: usize = 4096;

/// One stream's output, capped at `cap` bytes: the first half kept from
/// the start, the second half the most recent bytes.
#[derive(Debug, Clone)]
pub struct Capped {
    head: Vec<u8>,
    tail: VecDeque<u8>,
    head_cap: usize,
    tail_cap: usize,
    dropped: u64,
}

impl Capped {
    /// An empty output capped at `cap` bytes in all.
    pub fn new(cap: usize) -> Self {
        let head_cap = cap / 2;
        Self {
            head: Vec::new(),
            tail: VecDeque::new(),
            head_cap,
            tail_cap: cap - head_cap,
            dropped: 0,
        }
    }

    /// Appends output.
    pub fn push(&mut self, mut data: &[u8]) {
        let room = self.head_cap - self.head.len();
        if room > 0 {
            let take = room.min(data.len());
            self.head.extend_from_slice(&data[..take]);
            data = &data[take..];
        }
        if data.len() >= self.tail_cap {
            self.dropped += (self.tail.len() + data.len() - self.tail_cap) as u64;
            self.tail.clear();
            self.tail.extend(&data[data.len() - self.tail_cap..]);
            return;
        }
        let over = (self.tail.len() + data.len()).saturating_sub(self.tail_cap);
        self.tail.drain(..over);
        self.dropped += over as u64;
        self.tail.extend(data);
    }

    /// The kept bytes and how many were dropped from the middle. Where
    /// bytes were dropped, a line says so between head and tail.
    pub fn finish(self) -> (Vec<u8>, u64) {
        let mut out = self.head;
        if self.dropped > 0 {
            out.extend_from_slice(
                format!("\n[… {} bytes dropped by the output cap …]\n", self.dropped).as_bytes(),
            );
        }
        out.extend(self.tail);
        (out, self.dropped)
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_output_is_kept_whole() {
        let mut c = Capped::new(16);
        c.push(b"hello ");
        c.push(b"world");
        assert_eq!(c.finish(), (b"hello world".to_vec(), 0));
    }

    #[test]
    fn head_and_tail_are_kept_and_the_middle_counted() {
        let mut c = Capped::new(8);
        for chunk in [&b"0123"[..], b"4567", b"89ab", b"cdef"] {
            c.push(chunk);
        }
        let (out, dropped) = c.finish();
        assert_eq!(dropped, 8);
        let text = String::from_utf8(out).unwrap();
        assert!(text.starts_with("0123\n"), "{text}");
        assert!(text.ends_with("\ncdef"), "{text}");
        assert!(text.contains("8 bytes dropped"), "{text}");
    }

    #[test]
    fn one_huge_chunk_keeps_its_own_head_and_tail() {
        let mut c = Capped::new(4);
        c.push(b"abcdefghij");
        let (out, dropped) = c.finish();
        assert_eq!(dropped, 6);
        assert!(out.starts_with(b"ab") && out.ends_with(b"ij"));
    }
}
