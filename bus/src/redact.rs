//! Redaction of handed-out secrets from what a command or a tool returns
//! (seed L12: every value handed out is redacted before it reaches a
//! transcript, a model or a log): the executor's command output, the mcp
//! service's tool content and its servers' logs.
//!
//! Each secret is searched for as itself and as base64 (standard and
//! URL-safe, at each of the three alignments a value can have inside a
//! longer base64 text), all in one Aho-Corasick pass. Output arrives in
//! chunks, and a secret may be split across two of them, so the streaming
//! redactor holds back the last `longest pattern - 1` bytes of each chunk
//! until the next one (or the end) shows whether they start a secret.

use aho_corasick::{AhoCorasick, MatchKind};
use base64::Engine as _;

/// What replaces a secret in output.
pub const MARK: &[u8] = b"[REDACTED]";

/// Shorter base64 fragments than this are not searched for: they would
/// match ordinary text by chance. (The value itself is always searched.)
const MIN_ENCODED: usize = 8;

/// The patterns of a set of secrets.
#[derive(Debug, Clone)]
pub struct Redactor {
    matcher: Option<AhoCorasick>,
    longest: usize,
}

impl Redactor {
    /// A redactor for `secrets` (empty values are ignored).
    pub fn new<'a>(secrets: impl IntoIterator<Item = &'a [u8]>) -> Self {
        let mut patterns: Vec<Vec<u8>> = Vec::new();
        for secret in secrets.into_iter().filter(|s| !s.is_empty()) {
            patterns.push(secret.to_vec());
            for engine in [
                &base64::engine::general_purpose::STANDARD,
                &base64::engine::general_purpose::URL_SAFE,
            ] {
                for shift in 0..3 {
                    let core = encoded_core(engine, secret, shift);
                    if core.len() >= MIN_ENCODED {
                        patterns.push(core);
                    }
                }
            }
        }
        patterns.sort();
        patterns.dedup();
        let longest = patterns.iter().map(Vec::len).max().unwrap_or(0);
        let matcher = if patterns.is_empty() {
            None
        } else {
            // Leftmost-longest: a value that is also a prefix of another
            // secret's encoding is replaced whole.
            AhoCorasick::builder()
                .match_kind(MatchKind::LeftmostLongest)
                .build(&patterns)
                .ok()
        };
        Self { matcher, longest }
    }

    /// Whether there is anything to redact.
    pub fn is_empty(&self) -> bool {
        self.matcher.is_none()
    }

    /// `data` with every occurrence replaced by [`MARK`].
    pub fn redact(&self, data: &[u8]) -> Vec<u8> {
        match &self.matcher {
            Some(m) => {
                let mut out = Vec::with_capacity(data.len());
                m.replace_all_with_bytes(data, &mut out, |_, _, dst| {
                    dst.extend_from_slice(MARK);
                    true
                });
                out
            }
            None => data.to_vec(),
        }
    }

    /// A redactor for one output stream.
    pub fn stream(&self) -> StreamRedactor<'_> {
        StreamRedactor {
            redactor: self,
            pending: Vec::new(),
        }
    }
}

/// The base64 characters of `secret` that do not depend on its
/// neighbours, when it starts `shift` bytes into a 3-byte group.
fn encoded_core(engine: &base64::engine::GeneralPurpose, secret: &[u8], shift: usize) -> Vec<u8> {
    let mut padded = vec![0u8; shift];
    padded.extend_from_slice(secret);
    let encoded = engine.encode(&padded);
    // Characters fully determined by the secret's bytes: skip those that
    // mix in the zero prefix, and stop before the last group if the secret
    // does not fill it (its characters mix in whatever follows).
    let skip = match shift {
        0 => 0,
        1 => 2,
        _ => 3,
    };
    let whole_groups = padded.len() / 3;
    let end = whole_groups * 4;
    if end <= skip {
        return Vec::new();
    }
    encoded.as_bytes()[skip..end].to_vec()
}

/// Redacts one stream that arrives in chunks.
#[derive(Debug)]
pub struct StreamRedactor<'a> {
    redactor: &'a Redactor,
    pending: Vec<u8>,
}

impl StreamRedactor<'_> {
    /// Takes the next chunk and returns what can be released: everything
    /// but the tail that could still be the start of a secret.
    pub fn push(&mut self, chunk: &[u8]) -> Vec<u8> {
        if self.redactor.is_empty() {
            return chunk.to_vec();
        }
        self.pending.extend_from_slice(chunk);
        let hold = self.redactor.longest.saturating_sub(1);
        if self.pending.len() <= hold {
            return Vec::new();
        }
        // Redact what is held, then release all but a tail that could be
        // the start of a match spanning into the next chunk. A match that
        // ends inside the tail is redacted now; one that only starts there
        // is completed by the next chunk.
        let redacted = self.redactor.redact(&self.pending);
        let keep = hold.min(redacted.len());
        let split = unmarked_split(&redacted, redacted.len() - keep);
        self.pending = redacted[split..].to_vec();
        redacted[..split].to_vec()
    }

    /// Releases the rest at the end of the stream.
    pub fn finish(&mut self) -> Vec<u8> {
        let rest = std::mem::take(&mut self.pending);
        self.redactor.redact(&rest)
    }
}

/// A split point at or before `at` that does not cut a [`MARK`] in two
/// (a cut mark would be searched again and could never match a secret, but
/// it would read oddly).
fn unmarked_split(data: &[u8], at: usize) -> usize {
    let from = at.saturating_sub(MARK.len() - 1);
    for start in from..at {
        if data[start..].starts_with(MARK) && start + MARK.len() > at {
            return start;
        }
    }
    at
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const SECRET: &[u8] = b"hunter2-correct-horse-battery";

    fn b64(data: &[u8]) -> String {
        base64::engine::general_purpose::STANDARD.encode(data)
    }

    fn contains(hay: &[u8], needle: &[u8]) -> bool {
        hay.windows(needle.len()).any(|w| w == needle)
    }

    #[test]
    fn plain_and_base64_are_redacted() {
        let r = Redactor::new([SECRET]);
        let out = r.redact(
            format!("x {} y {} z", "hunter2-correct-horse-battery", b64(SECRET)).as_bytes(),
        );
        assert!(!contains(&out, SECRET));
        assert!(!contains(&out, b64(SECRET).as_bytes()));
        assert_eq!(out.windows(MARK.len()).filter(|w| *w == MARK).count(), 2);
    }

    #[test]
    fn a_secret_inside_a_longer_base64_text_is_redacted_at_any_alignment() {
        let r = Redactor::new([SECRET]);
        for prefix in ["", "a", "ab", "abc", "user:"] {
            let mut data = prefix.as_bytes().to_vec();
            data.extend_from_slice(SECRET);
            data.extend_from_slice(b"\n");
            let encoded = b64(&data);
            let out = r.redact(encoded.as_bytes());
            // The secret's own characters are gone: decoding what is left
            // cannot give it back.
            assert!(
                contains(&out, MARK),
                "prefix {prefix:?}: {}",
                String::from_utf8_lossy(&out)
            );
        }
    }

    #[test]
    fn url_safe_base64_is_redacted() {
        let secret = b"\xfb\xff\xfe-secret-\xfb\xff";
        let r = Redactor::new([&secret[..]]);
        let encoded = base64::engine::general_purpose::URL_SAFE.encode(secret);
        assert!(contains(&r.redact(encoded.as_bytes()), MARK));
    }

    #[test]
    fn nothing_to_redact_passes_everything() {
        let r = Redactor::new(std::iter::empty::<&[u8]>());
        let mut s = r.stream();
        assert_eq!(s.push(b"abc"), b"abc");
        assert!(s.finish().is_empty());
    }

    proptest! {
        /// However the output is cut into chunks, the secret never comes
        /// out, and everything else comes out unchanged.
        #[test]
        fn chunking_never_leaks(
            before in "[a-z ]{0,40}",
            after in "[a-z ]{0,40}",
            cuts in proptest::collection::vec(0usize..120, 0..8),
        ) {
            let r = Redactor::new([SECRET]);
            let mut data = before.as_bytes().to_vec();
            data.extend_from_slice(SECRET);
            data.extend_from_slice(after.as_bytes());
            data.extend_from_slice(SECRET);
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(data.len())).collect();
            cuts.sort();
            cuts.push(data.len());
            let mut s = r.stream();
            let mut out = Vec::new();
            let mut from = 0;
            for c in cuts {
                out.extend(s.push(&data[from..c]));
                from = c;
            }
            out.extend(s.finish());
            prop_assert!(!contains(&out, SECRET));
            let expected = [before.as_bytes(), MARK, after.as_bytes(), MARK].concat();
            prop_assert_eq!(out, expected);
        }
    }
}
