//! Capped output: the head and the tail are kept, the middle is counted.
//! The start of an output says what a command or a tool was doing and the
//! end how it finished; one that prints gigabytes must not take a
//! service's memory or the bus's message size with it. The executor caps
//! each stream of a command with it, the mcp service a tool's content.

use std::collections::VecDeque;

/// One output, capped at `cap` bytes: the first half kept from
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
