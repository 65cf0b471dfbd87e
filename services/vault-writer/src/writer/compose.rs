//! What a write leaves at its note: a pure function of the message, its
//! stream sequence and the note's bytes before it, so that the same
//! message applied again (a redelivery, a rebuild) gives the same bytes.

use std::collections::BTreeMap;

use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use nisse_bus::AgentName;
use nisse_bus::proto::{VaultWrite, VaultWriteMode};
use nisse_vault::note::{self, PROVENANCE_KEYS, Provenance};
use nisse_vault::{Access, VaultPath};

use super::disk::Found;

/// A write's note, ready to be put in place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Composed {
    /// The whole file.
    pub bytes: Vec<u8>,
    /// Its SHA-256 (hex).
    pub sha256: String,
}

/// The note `write` names, if `agent` may write it: only under its own
/// `memory/<agent>/`, whatever the envelope claims. The refusal says which
/// folder the path is in and whose it is.
pub(crate) fn check_path(agent: &AgentName, write: &VaultWrite) -> Result<VaultPath, String> {
    let path = VaultPath::parse(&write.path).map_err(|e| e.to_string())?;
    // Writes need no read grants: an agent writes only its own memory.
    Access::new(agent.as_str(), &[]).check_write(&path)?;
    Ok(path)
}

/// The note `write` makes of `prior` (what is at its path now), delivered
/// at `stream_seq` of `agent`'s stream; `Err` is the refusal's reason.
pub(crate) fn compose(
    agent: &AgentName,
    path: &VaultPath,
    write: &VaultWrite,
    stream_seq: u64,
    prior: &Found,
) -> Result<Composed, String> {
    let prior = match prior {
        Found::NotAFile => return Err(format!("{path} is a folder, not a note")),
        Found::Absent => None,
        Found::Note(bytes) => Some(bytes.as_slice()),
    };
    let mode = VaultWriteMode::try_from(write.mode).unwrap_or(VaultWriteMode::Unspecified);
    if mode == VaultWriteMode::Create && prior.is_some() {
        return Err(format!(
            "{path} exists already; a CREATE never replaces a note (REPLACE or APPEND does)"
        ));
    }
    if !write.expected_sha256.is_empty() {
        let expected = write.expected_sha256.to_ascii_lowercase();
        match prior {
            None => {
                return Err(format!(
                    "the write expected {path} to have SHA-256 {expected}, but there is no such note"
                ));
            }
            Some(bytes) => {
                let actual = note::sha256_hex(bytes);
                if actual != expected {
                    return Err(format!(
                        "the write expected {path} to have SHA-256 {expected}, but it has {actual} (it changed since it was read)"
                    ));
                }
            }
        }
    }
    let envelope = write.envelope.clone().unwrap_or_default();
    let provenance = Provenance {
        agent: agent.to_string(),
        work_item: envelope.work_item_id.clone(),
        source: write.source.clone(),
        stream_seq,
        written: rfc3339(envelope.created_at.as_ref().map(|t| (t.seconds, t.nanos))),
        message_id: envelope.message_id.clone(),
    };
    let mut scalars: BTreeMap<String, String> = write
        .frontmatter
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let mut lists: BTreeMap<String, Vec<String>> = write
        .lists
        .iter()
        .map(|(k, v)| (k.clone(), v.values.clone()))
        .collect();
    let mut tags = write.tags.clone();
    let body = match (mode, prior) {
        (VaultWriteMode::Append, Some(bytes)) => {
            let text = std::str::from_utf8(bytes).map_err(|_| {
                format!("{path} is not UTF-8 text, so nothing can be appended to it")
            })?;
            let old = note::parse(text).map_err(|e| {
                format!("{path} cannot be appended to: it is not a note the vault can read ({e})")
            })?;
            // What the note said stays, what the write says wins; the
            // provenance is the new write's.
            let fm = &old.frontmatter;
            for key in fm.keys() {
                if PROVENANCE_KEYS.contains(&key) || key == "tags" {
                    continue;
                }
                if scalars.contains_key(key) || lists.contains_key(key) {
                    continue;
                }
                match fm.get(key) {
                    Some(value) => {
                        scalars.insert(key.to_string(), value.to_string());
                    }
                    None => {
                        lists.insert(key.to_string(), fm.list(key));
                    }
                }
            }
            let mut all = fm.list("tags");
            for t in tags {
                if !all.contains(&t) {
                    all.push(t);
                }
            }
            tags = all;
            appended(&old.body, &write.markdown)
        }
        _ => write.markdown.clone(),
    };
    let text = note::render(&provenance, &scalars, &lists, &tags, &body)
        .map_err(|e| format!("{path} cannot be written: {e}"))?;
    let bytes = text.into_bytes();
    let sha256 = note::sha256_hex(&bytes);
    Ok(Composed { bytes, sha256 })
}

/// `addition` after `body`, on a line of its own.
fn appended(body: &str, addition: &str) -> String {
    if body.is_empty() {
        return addition.to_string();
    }
    let mut out = body.to_string();
    if !out.ends_with('\n') {
        out.push('\n');
    }
    out.push_str(addition);
    out
}

/// The envelope's time, RFC 3339 in UTC (the Unix epoch when it has
/// none: the bus always sets one, and a rebuild must give the same text).
fn rfc3339(at: Option<(i64, i32)>) -> String {
    let t = at
        .and_then(|(seconds, nanos)| {
            OffsetDateTime::from_unix_timestamp_nanos(
                i128::from(seconds) * 1_000_000_000 + i128::from(nanos),
            )
            .ok()
        })
        .unwrap_or(OffsetDateTime::UNIX_EPOCH);
    t.format(&Rfc3339)
        .unwrap_or_else(|_| "1970-01-01T00:00:00Z".to_string())
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use pretty_assertions::assert_eq;

    use nisse_bus::proto::Envelope;

    use super::*;

    fn agent() -> AgentName {
        "ops".parse().unwrap()
    }

    fn write(mode: VaultWriteMode, markdown: &str) -> VaultWrite {
        VaultWrite {
            envelope: Some(Envelope {
                agent: "ops".into(),
                work_item_id: "wi-3".into(),
                message_id: "vault-write:r1".into(),
                created_at: Some(
                    (SystemTime::UNIX_EPOCH + Duration::new(1_700_000_000, 500_000_000)).into(),
                ),
                ..Default::default()
            }),
            request_id: "r1".into(),
            path: "memory/ops/facts/a.md".into(),
            markdown: markdown.into(),
            mode: mode as i32,
            source: "driver via note".into(),
            ..Default::default()
        }
    }

    fn compose_of(w: &VaultWrite, seq: u64, prior: &Found) -> Result<Composed, String> {
        let path = check_path(&agent(), w).unwrap();
        compose(&agent(), &path, w, seq, prior)
    }

    #[test]
    fn the_note_is_a_function_of_the_message_its_sequence_and_the_prior_note() {
        let w = write(VaultWriteMode::Replace, "fact\n");
        let once = compose_of(&w, 7, &Found::Absent).unwrap();
        assert_eq!(compose_of(&w, 7, &Found::Absent).unwrap(), once);
        assert_ne!(compose_of(&w, 8, &Found::Absent).unwrap(), once);
        let text = String::from_utf8(once.bytes.clone()).unwrap();
        let prov = note::parse(&text).unwrap().provenance().unwrap();
        assert_eq!(prov.written, "2023-11-14T22:13:20.5Z");
        assert_eq!(prov.stream_seq, 7);
        assert_eq!(once.sha256, note::sha256_hex(&once.bytes));
    }

    #[test]
    fn append_keeps_the_body_and_properties_and_takes_the_new_provenance() {
        let mut first = write(VaultWriteMode::Create, "- one");
        first.frontmatter.insert("title".into(), "Index".into());
        first.tags = vec!["index".into()];
        let before = compose_of(&first, 1, &Found::Absent).unwrap();
        let mut more = write(VaultWriteMode::Append, "- two\n");
        more.tags = vec!["index".into(), "memory".into()];
        let after = compose_of(&more, 2, &Found::Note(before.bytes)).unwrap();
        let parsed = note::parse(std::str::from_utf8(&after.bytes).unwrap()).unwrap();
        assert_eq!(parsed.body, "- one\n- two\n");
        assert_eq!(parsed.frontmatter.get("title"), Some("Index"));
        assert_eq!(parsed.frontmatter.list("tags"), vec!["index", "memory"]);
        assert_eq!(parsed.provenance().unwrap().stream_seq, 2);
        // Appending to nothing makes the note.
        let fresh = compose_of(&more, 3, &Found::Absent).unwrap();
        let parsed = note::parse(std::str::from_utf8(&fresh.bytes).unwrap()).unwrap();
        assert_eq!(parsed.body, "- two\n");
    }

    #[test]
    fn refusals_say_what_is_wrong() {
        let prior = Found::Note(b"---\ntitle: \"x\"\n---\nold\n".to_vec());
        let create = write(VaultWriteMode::Create, "new");
        assert!(
            compose_of(&create, 1, &prior)
                .unwrap_err()
                .contains("exists already")
        );
        let mut stale = write(VaultWriteMode::Replace, "new");
        stale.expected_sha256 = "ab".repeat(32);
        let why = compose_of(&stale, 1, &prior).unwrap_err();
        let Found::Note(bytes) = &prior else {
            unreachable!()
        };
        assert!(
            why.contains(&"ab".repeat(32)) && why.contains(&note::sha256_hex(bytes)),
            "{why}"
        );
        assert!(
            compose_of(&stale, 1, &Found::Absent)
                .unwrap_err()
                .contains("there is no such note")
        );
        assert!(
            compose_of(&create, 1, &Found::NotAFile)
                .unwrap_err()
                .contains("is a folder")
        );
        let broken = Found::Note(b"---\ntitle: [\n".to_vec());
        let append = write(VaultWriteMode::Append, "more");
        assert!(
            compose_of(&append, 1, &broken)
                .unwrap_err()
                .contains("cannot be appended to")
        );
    }
}
