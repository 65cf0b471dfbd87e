//! The note format: YAML frontmatter, a Markdown body, `[[links]]` and tags,
//! as Obsidian reads them.
//!
//! Writing ([`render`]) is deterministic, byte for byte, so a replayed or
//! rebuilt write leaves the same file (issue 17: "byte-identical files"):
//! keys in a fixed order, every string double-quoted with JSON escapes
//! (JSON strings are YAML 1.2 double-quoted scalars, so no value can be
//! read as a number, a date, a boolean or a second key), lists in block
//! style. Reading ([`parse`]) takes any frontmatter an operator writes by
//! hand and keeps the line of every key and value, so a problem in a
//! world-model note names its line.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use saphyr::{MarkedYamlOwned, ScalarOwned, YamlDataOwned, YamlLoader};
use saphyr_parser::{Parser, ScalarStyle};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::NoteError;

/// The frontmatter keys the vault writer owns, in the order it writes them
/// (after every other key): who wrote the note, for which work item, from
/// what source, at which stream sequence and time, by which message.
pub const PROVENANCE_KEYS: [&str; 6] = [
    "agent",
    "work_item",
    "source",
    "stream_seq",
    "written",
    "message",
];

/// The frontmatter key Obsidian reads tags from; [`render`] writes it from
/// its own argument.
const TAGS: &str = "tags";

/// The longest frontmatter key [`render`] writes.
const MAX_KEY: usize = 64;

/// Plain words a YAML reader may take for a boolean or null rather than a
/// key name (YAML 1.2 core schema, and YAML 1.1 readers that are still
/// about).
const YAML_WORDS: [&str; 9] = ["true", "false", "null", "yes", "no", "on", "off", "y", "n"];

/// Where a note written by an agent came from (L6: "with its source and
/// when it was observed"; L10: "provenance is in the note itself").
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Provenance {
    /// The agent that wrote the note.
    pub agent: String,
    /// The work item the write was made for.
    pub work_item: String,
    /// Where the content came from ("operator @alice:example.org in
    /// matrix", "driver via note").
    pub source: String,
    /// The write's sequence in the agent's stream.
    pub stream_seq: u64,
    /// When the write was made, RFC 3339 in UTC (the time on the stream).
    pub written: String,
    /// The write's message id; the frontmatter key is `message`.
    pub message_id: String,
}

impl Provenance {
    /// Reads the provenance keys back from a note's frontmatter, when all
    /// six are there (a note the vault writer wrote).
    pub fn from_frontmatter(frontmatter: &Frontmatter) -> Option<Provenance> {
        let get = |key: &str| frontmatter.get(key).map(str::to_owned);
        Some(Provenance {
            agent: get("agent")?,
            work_item: get("work_item")?,
            source: get("source")?,
            stream_seq: frontmatter.get("stream_seq")?.parse().ok()?,
            written: get("written")?,
            message_id: get("message")?,
        })
    }
}

/// Renders a note: `---`, the frontmatter, `---`, then the body.
///
/// The frontmatter holds, in this order: `scalars` sorted by key, `lists`
/// sorted by key (block style; an empty list as `[]`), `tags` (in the order
/// given, without repeats; omitted when there are none), then the
/// provenance keys in the order of [`PROVENANCE_KEYS`], last, so the
/// operator sees the note's own properties first in Obsidian. Strings are
/// double-quoted with JSON escapes; `stream_seq` is a number. The body
/// follows the closing `---` as given, with a trailing newline added when
/// it has none; a body that itself starts with `---` is fine, as the
/// frontmatter ends at the first `---` line.
///
/// # Errors
/// A [`NoteError`] naming the key or tag at fault: a key that shadows a
/// provenance key or `tags`, a key given both as a scalar and a list, a key
/// that is not `[a-z][a-z0-9_-]*` of at most 64 bytes or that YAML could
/// read as a boolean or null, a tag Obsidian would not read as one tag.
pub fn render(
    provenance: &Provenance,
    scalars: &BTreeMap<String, String>,
    lists: &BTreeMap<String, Vec<String>>,
    tags: &[String],
    body: &str,
) -> Result<String, NoteError> {
    for key in scalars.keys().chain(lists.keys()) {
        check_key(key).map_err(|problem| NoteError::Key {
            key: key.clone(),
            problem,
        })?;
    }
    if let Some(key) = scalars.keys().find(|k| lists.contains_key(*k)) {
        return Err(NoteError::Key {
            key: key.clone(),
            problem: "is given both as a value and as a list".to_owned(),
        });
    }
    let mut unique_tags: Vec<&str> = Vec::with_capacity(tags.len());
    for tag in tags {
        check_tag(tag).map_err(|problem| NoteError::Tag {
            tag: tag.clone(),
            problem,
        })?;
        if !unique_tags.contains(&tag.as_str()) {
            unique_tags.push(tag);
        }
    }

    let mut out = String::with_capacity(256 + body.len());
    out.push_str("---\n");
    for (key, value) in scalars {
        let _ = writeln!(out, "{key}: {}", quote(value));
    }
    for (key, values) in lists {
        write_list(&mut out, key, values.iter().map(String::as_str));
    }
    if !unique_tags.is_empty() {
        write_list(&mut out, TAGS, unique_tags.into_iter());
    }
    let Provenance {
        agent,
        work_item,
        source,
        stream_seq,
        written,
        message_id,
    } = provenance;
    let _ = writeln!(out, "agent: {}", quote(agent));
    let _ = writeln!(out, "work_item: {}", quote(work_item));
    let _ = writeln!(out, "source: {}", quote(source));
    let _ = writeln!(out, "stream_seq: {stream_seq}");
    let _ = writeln!(out, "written: {}", quote(written));
    let _ = writeln!(out, "message: {}", quote(message_id));
    out.push_str("---\n");
    out.push_str(body);
    if !body.ends_with('\n') {
        out.push('\n');
    }
    Ok(out)
}

fn write_list<'a>(out: &mut String, key: &str, mut values: impl Iterator<Item = &'a str>) {
    let Some(first) = values.next() else {
        let _ = writeln!(out, "{key}: []");
        return;
    };
    let _ = writeln!(out, "{key}:\n  - {}", quote(first));
    for value in values {
        let _ = writeln!(out, "  - {}", quote(value));
    }
}

/// A double-quoted scalar that is both a JSON string and a YAML 1.2
/// double-quoted scalar. Beyond JSON's escapes, characters YAML does not
/// allow raw (DEL, C1 controls, U+FFFE/U+FFFF) and ones readers take for
/// line breaks or a byte-order mark are escaped too, so the scalar stays on
/// its line for every reader.
fn quote(value: &str) -> String {
    let mut out = String::with_capacity(value.len() + 2);
    out.push('"');
    for c in value.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if c < ' '
                || ('\u{7f}'..='\u{9f}').contains(&c)
                || matches!(
                    c,
                    '\u{2028}' | '\u{2029}' | '\u{feff}' | '\u{fffe}' | '\u{ffff}'
                ) =>
            {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn check_key(key: &str) -> Result<(), String> {
    if PROVENANCE_KEYS.contains(&key) {
        return Err("is a provenance key, which the vault writer sets itself".to_owned());
    }
    if key == TAGS {
        return Err("is where tags go; give them as tags".to_owned());
    }
    let mut chars = key.chars();
    let well_formed = chars.next().is_some_and(|c| c.is_ascii_lowercase())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-');
    if !well_formed {
        return Err(
            "is not a key name: a lowercase letter, then lowercase letters, digits, '_' or '-'"
                .to_owned(),
        );
    }
    if key.len() > MAX_KEY {
        return Err(format!("is longer than {MAX_KEY} bytes"));
    }
    if YAML_WORDS.contains(&key) {
        return Err("is a word YAML readers take for a boolean or null, not a name".to_owned());
    }
    Ok(())
}

/// Whether `c` may be part of an Obsidian tag.
fn is_tag_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_' || c == '-' || c == '/'
}

/// Checks a tag (given without `#`) as Obsidian reads one: letters,
/// digits, `_`, `-` and `/` for nesting, not only digits.
///
/// # Errors
/// Why Obsidian would not read it as one tag.
pub fn check_tag(tag: &str) -> Result<(), String> {
    if tag.is_empty() {
        return Err("is empty".to_owned());
    }
    if tag.starts_with('#') {
        return Err("starts with '#'; tags are given without it".to_owned());
    }
    if let Some(c) = tag.chars().find(|c| !is_tag_char(*c)) {
        return Err(format!(
            "contains {c:?}; a tag has only letters, digits, '_', '-' and '/'"
        ));
    }
    if tag.split('/').any(str::is_empty) {
        return Err("has an empty level ('/' at an end or '//')".to_owned());
    }
    if tag.chars().all(|c| c.is_ascii_digit() || c == '/') {
        return Err("is only digits, which Obsidian does not take for a tag".to_owned());
    }
    Ok(())
}

/// SHA-256 of `bytes`, lowercase hex: the content hash notes are compared
/// and snapshotted by.
pub fn sha256_hex(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    let mut out = String::with_capacity(64);
    for byte in digest {
        let _ = write!(out, "{byte:02x}");
    }
    out
}

/// A note as read: its frontmatter and its body.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Note {
    /// The frontmatter, empty when the note has none.
    pub frontmatter: Frontmatter,
    /// Everything after the frontmatter's closing `---` line.
    pub body: String,
    /// The 1-based line of the file the body starts on.
    pub body_line: usize,
}

impl Note {
    /// The note's title: frontmatter `title`, else the first `# ` heading
    /// of the body.
    pub fn title(&self) -> Option<&str> {
        self.frontmatter.title()
    }

    /// The note's provenance, when the vault writer wrote it.
    pub fn provenance(&self) -> Option<Provenance> {
        Provenance::from_frontmatter(&self.frontmatter)
    }
}

/// A note's frontmatter: its keys in file order, each with its line.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Frontmatter {
    entries: Vec<Entry>,
    /// The body's first `# ` heading, the title when there is no `title`.
    heading: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    key: String,
    line: usize,
    value: Value,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Value {
    /// `key:` with nothing, `~` or `null`.
    Null,
    /// A string, number or boolean, as written.
    Scalar(Item),
    /// A sequence; items that are not scalars are left out.
    List(Vec<Item>),
    /// A nested mapping, or something else no accessor reads.
    Other,
}

/// One frontmatter value with its line: a scalar or a list item.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Item {
    /// The value as text (numbers and booleans as written).
    pub value: String,
    /// The 1-based line of the file it is on.
    pub line: usize,
}

impl Frontmatter {
    fn entry(&self, key: &str) -> Option<&Entry> {
        self.entries.iter().find(|e| e.key == key)
    }

    /// The scalar value of `key` as text (strings, numbers and booleans as
    /// written); `None` when the key is missing, null, a list or a mapping.
    pub fn get(&self, key: &str) -> Option<&str> {
        match &self.entry(key)?.value {
            Value::Scalar(item) => Some(&item.value),
            Value::Null | Value::List(_) | Value::Other => None,
        }
    }

    /// The values of `key` as a list: a list's scalar items, a scalar as a
    /// one-element list, nothing for a missing or null key.
    pub fn list(&self, key: &str) -> Vec<String> {
        self.items(key).into_iter().map(|i| i.value).collect()
    }

    /// Like [`Frontmatter::list`], with each value's line in the file.
    pub fn items(&self, key: &str) -> Vec<Item> {
        match self.entry(key).map(|e| &e.value) {
            Some(Value::Scalar(item)) => vec![item.clone()],
            Some(Value::List(items)) => items.clone(),
            Some(Value::Null | Value::Other) | None => Vec::new(),
        }
    }

    /// Whether `key` is present, whatever its value.
    pub fn contains(&self, key: &str) -> bool {
        self.entry(key).is_some()
    }

    /// Whether `key` is present with no value (`key:`, `~`, `null`).
    pub fn is_null(&self, key: &str) -> bool {
        self.entry(key).is_some_and(|e| e.value == Value::Null)
    }

    /// The 1-based line of the file `key` is on.
    pub fn line_of(&self, key: &str) -> Option<usize> {
        self.entry(key).map(|e| e.line)
    }

    /// The keys, in file order.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.entries.iter().map(|e| e.key.as_str())
    }

    /// Whether there are no keys.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The title: the `title` key, else (for a parsed note) the first `# `
    /// heading of its body.
    pub fn title(&self) -> Option<&str> {
        self.get("title")
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .or(self.heading.as_deref())
    }
}

/// How a note's text divides into frontmatter and body.
struct Split<'a> {
    /// The YAML between the fences, when the note has frontmatter.
    yaml: Option<&'a str>,
    body: &'a str,
    /// The 1-based line the body starts on.
    body_line: usize,
}

/// Whether `line` (without its newline) is a `---` fence.
fn is_fence(line: &str) -> bool {
    line.trim_end_matches([' ', '\t', '\r']) == "---"
}

/// Splits off the frontmatter: the file's first line is `---` and a later
/// line is `---`, as Obsidian reads it.
fn split(text: &str) -> Result<Split<'_>, NoteError> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let first_end = text.find('\n');
    let first = &text[..first_end.unwrap_or(text.len())];
    if !is_fence(first) {
        return Ok(Split {
            yaml: None,
            body: text,
            body_line: 1,
        });
    }
    let Some(first_end) = first_end else {
        return Err(NoteError::Unclosed);
    };
    let yaml_start = first_end + 1;
    let mut at = yaml_start;
    let mut line = 2;
    while at < text.len() {
        let end = text[at..].find('\n').map_or(text.len(), |i| at + i);
        if is_fence(&text[at..end]) {
            let body_start = (end + 1).min(text.len());
            return Ok(Split {
                yaml: Some(&text[yaml_start..at]),
                body: &text[body_start..],
                body_line: line + 1,
            });
        }
        at = end + 1;
        line += 1;
    }
    Err(NoteError::Unclosed)
}

/// Parses a note: frontmatter (when the first line is `---`) and body.
///
/// # Errors
/// A [`NoteError`] with the line in the file: frontmatter never closed, not
/// valid YAML, not a mapping, or with a key that is not a plain name or
/// appears twice.
pub fn parse(text: &str) -> Result<Note, NoteError> {
    let split = split(text)?;
    let entries = match split.yaml {
        Some(yaml) => load_frontmatter(yaml)?,
        None => Vec::new(),
    };
    let heading = first_heading(split.body);
    Ok(Note {
        frontmatter: Frontmatter { entries, heading },
        body: split.body.to_owned(),
        body_line: split.body_line,
    })
}

/// The frontmatter's YAML starts on line 2 of the file.
const YAML_LINE_OFFSET: usize = 1;

fn load_frontmatter(yaml: &str) -> Result<Vec<Entry>, NoteError> {
    let mut loader: YamlLoader<'_, MarkedYamlOwned> = YamlLoader::default();
    // Scalars as written: `version: 1.10` stays "1.10", and a quoted
    // "null" stays a string.
    loader.early_parse(false);
    let mut parser = Parser::new_from_str(yaml);
    let scan = parser.load(&mut loader, true);
    if let Some(err) = scan.err().or_else(|| loader.error().cloned()) {
        return Err(NoteError::Yaml {
            line: err.marker().line() + YAML_LINE_OFFSET,
            message: err.info().to_owned(),
        });
    }
    let mut docs = loader.into_documents();
    if docs.len() > 1 {
        return Err(NoteError::Yaml {
            line: docs[1].span.start.line() + YAML_LINE_OFFSET,
            message: "a second YAML document; frontmatter is one".to_owned(),
        });
    }
    let Some(doc) = docs.pop() else {
        return Ok(Vec::new());
    };
    let doc_line = doc.span.start.line() + YAML_LINE_OFFSET;
    let doc = untag(&doc);
    let map = match &doc.data {
        YamlDataOwned::Mapping(map) => map,
        _ if is_null(doc) => return Ok(Vec::new()),
        other => {
            return Err(NoteError::NotMapping {
                line: doc_line,
                found: describe(other).to_owned(),
            });
        }
    };
    let mut entries: Vec<Entry> = Vec::with_capacity(map.len());
    for (key_node, value_node) in map {
        let line = key_node.span.start.line() + YAML_LINE_OFFSET;
        let Some(key) = scalar_text(key_node).filter(|k| !k.is_empty()) else {
            return Err(NoteError::Yaml {
                line,
                message: "a key that is not a name".to_owned(),
            });
        };
        if entries.iter().any(|e| e.key == key) {
            return Err(NoteError::Yaml {
                line,
                message: format!("the key {key:?} appears twice"),
            });
        }
        entries.push(Entry {
            key,
            line,
            value: value_of(value_node, line),
        });
    }
    Ok(entries)
}

fn untag(node: &MarkedYamlOwned) -> &MarkedYamlOwned {
    match &node.data {
        YamlDataOwned::Tagged(_, inner) => untag(inner),
        _ => node,
    }
}

fn describe(data: &YamlDataOwned<MarkedYamlOwned>) -> &'static str {
    match data {
        YamlDataOwned::Sequence(_) => "a list",
        YamlDataOwned::Mapping(_) => "a mapping",
        YamlDataOwned::Representation(..) | YamlDataOwned::Value(_) => "a single value",
        YamlDataOwned::Tagged(..) | YamlDataOwned::Alias(_) | YamlDataOwned::BadValue => {
            "an unreadable value"
        }
    }
}

fn is_null(node: &MarkedYamlOwned) -> bool {
    match &untag(node).data {
        YamlDataOwned::Representation(text, ScalarStyle::Plain, _) => {
            matches!(text.as_str(), "" | "~" | "null" | "Null" | "NULL")
        }
        YamlDataOwned::Value(ScalarOwned::Null) => true,
        _ => false,
    }
}

/// A scalar node's text as written; `None` for null and collections.
fn scalar_text(node: &MarkedYamlOwned) -> Option<String> {
    if is_null(node) {
        return None;
    }
    match &untag(node).data {
        YamlDataOwned::Representation(text, ..) => Some(text.clone()),
        YamlDataOwned::Value(value) => Some(match value {
            ScalarOwned::Null => return None,
            ScalarOwned::Boolean(b) => b.to_string(),
            ScalarOwned::Integer(i) => i.to_string(),
            ScalarOwned::FloatingPoint(f) => f.to_string(),
            ScalarOwned::String(s) => s.clone(),
        }),
        _ => None,
    }
}

fn value_of(node: &MarkedYamlOwned, key_line: usize) -> Value {
    if is_null(node) {
        return Value::Null;
    }
    let node = untag(node);
    match &node.data {
        YamlDataOwned::Sequence(items) => Value::List(
            items
                .iter()
                .filter_map(|item| {
                    Some(Item {
                        value: scalar_text(item)?,
                        line: item.span.start.line() + YAML_LINE_OFFSET,
                    })
                })
                .collect(),
        ),
        _ => match scalar_text(node) {
            Some(value) => Value::Scalar(Item {
                value,
                // A block scalar (`|`) starts on the key's line.
                line: (node.span.start.line() + YAML_LINE_OFFSET).max(key_line),
            }),
            None => Value::Other,
        },
    }
}

/// A `[[wikilink]]` or `![[embed]]` in a note.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Link {
    /// What the link names: the text before `|` or `#`, trimmed (a note's
    /// stem or vault path, or a file for an embed).
    pub target: String,
    /// The 1-based line of the file it is on.
    pub line: usize,
}

/// The lines of a note's text that Obsidian reads as text, not code: each
/// with its 1-based line number, inline code blanked out, fenced code
/// blocks left out.
struct Prose {
    lines: Vec<(usize, String)>,
}

impl Prose {
    /// The prose of a whole note (`with_frontmatter`) or of a body alone.
    fn of(text: &str, with_frontmatter: bool) -> Prose {
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);
        // Frontmatter lines are YAML, with no code fences; an unclosed or
        // absent frontmatter makes the whole file body.
        let body_line = if with_frontmatter {
            split(text).map_or(1, |s| s.body_line)
        } else {
            1
        };
        let mut lines = Vec::new();
        let mut fence: Option<(char, usize)> = None;
        for (index, line) in text.lines().enumerate() {
            let number = index + 1;
            if number < body_line {
                lines.push((number, line.to_owned()));
                continue;
            }
            let trimmed = line.trim_start();
            let run = |c: char| trimmed.chars().take_while(|x| *x == c).count();
            match fence {
                Some((c, len)) => {
                    if run(c) >= len && trimmed[run(c) * c.len_utf8()..].trim().is_empty() {
                        fence = None;
                    }
                }
                None => {
                    for c in ['`', '~'] {
                        let len = run(c);
                        // A backtick fence's info string has no backtick.
                        if len >= 3 && (c == '~' || !trimmed[len..].contains('`')) {
                            fence = Some((c, len));
                        }
                    }
                    if fence.is_none() {
                        lines.push((number, blank_inline_code(line)));
                    }
                }
            }
        }
        Prose { lines }
    }
}

/// `line` with each inline code span (a run of backticks up to the next
/// run of as many) replaced by spaces. Spans are taken within one line.
fn blank_inline_code(line: &str) -> String {
    if !line.contains('`') {
        return line.to_owned();
    }
    let chars: Vec<char> = line.chars().collect();
    let mut out: Vec<char> = chars.clone();
    let mut i = 0;
    while i < chars.len() {
        if chars[i] != '`' {
            i += 1;
            continue;
        }
        let open = chars[i..].iter().take_while(|c| **c == '`').count();
        let mut j = i + open;
        let mut close = None;
        while j < chars.len() {
            if chars[j] == '`' {
                let run = chars[j..].iter().take_while(|c| **c == '`').count();
                if run == open {
                    close = Some(j + run);
                    break;
                }
                j += run;
            } else {
                j += 1;
            }
        }
        match close {
            Some(end) => {
                for c in &mut out[i..end] {
                    *c = ' ';
                }
                i = end;
            }
            // An unmatched run of backticks is literal text.
            None => i += open,
        }
    }
    out.into_iter().collect()
}

/// The wikilinks of a note's text (`[[target]]`, `[[target|alias]]`,
/// `[[target#heading]]`, `![[embed]]`), in the frontmatter's values and in
/// the body, with their lines; none from fenced code blocks or inline code.
/// A link to a heading of the note itself (`[[#heading]]`) names no other
/// note and is left out.
pub fn links(text: &str) -> Vec<Link> {
    let mut out = Vec::new();
    for (line_no, line) in Prose::of(text, true).lines {
        let mut rest = line.as_str();
        while let Some(open) = rest.find("[[") {
            let after = &rest[open + 2..];
            let Some(close) = after.find("]]") else {
                break;
            };
            let mut inner = &after[..close];
            // `[[a [[b]]`: the innermost opening is the link.
            if let Some(again) = inner.rfind("[[") {
                inner = &inner[again + 2..];
            }
            let target = inner
                .split(['|', '#'])
                .next()
                .unwrap_or("")
                // `[[a\|b]]` in a table escapes the pipe.
                .trim_end_matches('\\')
                .trim();
            if !target.is_empty() {
                out.push(Link {
                    target: target.to_owned(),
                    line: line_no,
                });
            }
            rest = &after[close + 2..];
        }
    }
    out
}

/// The body's first `# ` heading, outside code.
fn first_heading(body: &str) -> Option<String> {
    Prose::of(body, false)
        .lines
        .into_iter()
        .find_map(|(_, line)| {
            let title = line.trim_start().strip_prefix("# ")?.trim();
            (!title.is_empty()).then(|| title.trim_end_matches('#').trim_end().to_owned())
        })
}

/// A note's tags: frontmatter `tags` (a list, or one value of tags split
/// at commas and spaces; a leading `#` dropped), then inline `#tags` of the
/// body outside code, each once (compared ignoring case, as Obsidian does),
/// in the order met.
pub fn tags(note: &Note) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut add = |tag: &str| {
        let tag = tag.strip_prefix('#').unwrap_or(tag).trim_end_matches('/');
        if check_tag(tag).is_ok() && !out.iter().any(|t| t.to_lowercase() == tag.to_lowercase()) {
            out.push(tag.to_owned());
        }
    };
    for value in note.frontmatter.list(TAGS) {
        for tag in value.split([',', ' ']).filter(|t| !t.is_empty()) {
            add(tag);
        }
    }
    for (_, line) in Prose::of(&note.body, false).lines {
        let chars: Vec<(usize, char)> = line.char_indices().collect();
        for (n, &(at, c)) in chars.iter().enumerate() {
            // A tag starts at `#` at the line's start or after whitespace.
            let starts = c == '#' && (n == 0 || chars[n - 1].1.is_whitespace());
            if !starts {
                continue;
            }
            let rest = &line[at + 1..];
            let end = rest.find(|c: char| !is_tag_char(c)).unwrap_or(rest.len());
            if end > 0 {
                add(&rest[..end]);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use pretty_assertions::assert_eq;
    use proptest::prelude::*;

    use super::*;

    fn provenance() -> Provenance {
        Provenance {
            agent: "ops".into(),
            work_item: "wi-01J".into(),
            source: "operator @alice:example.org in matrix".into(),
            stream_seq: 42,
            written: "2026-05-01T10:00:00Z".into(),
            message_id: "vault-write-7".into(),
        }
    }

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn renders_in_a_fixed_order() {
        let lists = BTreeMap::from([
            (
                "hosts".to_owned(),
                vec!["nas01".to_owned(), "db01".to_owned()],
            ),
            ("entities".to_owned(), vec![]),
        ]);
        let text = render(
            &provenance(),
            &map(&[("title", "Disk full on nas01"), ("kind", "fact")]),
            &lists,
            &[
                "incident".to_owned(),
                "host/nas01".to_owned(),
                "incident".to_owned(),
            ],
            "The root disk filled up.",
        )
        .unwrap();
        assert_eq!(
            text,
            "---\n\
             kind: \"fact\"\n\
             title: \"Disk full on nas01\"\n\
             entities: []\n\
             hosts:\n  - \"nas01\"\n  - \"db01\"\n\
             tags:\n  - \"incident\"\n  - \"host/nas01\"\n\
             agent: \"ops\"\n\
             work_item: \"wi-01J\"\n\
             source: \"operator @alice:example.org in matrix\"\n\
             stream_seq: 42\n\
             written: \"2026-05-01T10:00:00Z\"\n\
             message: \"vault-write-7\"\n\
             ---\n\
             The root disk filled up.\n"
        );
        let note = parse(&text).unwrap();
        assert_eq!(note.provenance(), Some(provenance()));
        assert_eq!(note.frontmatter.list("entities"), Vec::<String>::new());
        assert_eq!(note.frontmatter.list("hosts"), ["nas01", "db01"]);
        assert_eq!(tags(&note), ["incident", "host/nas01"]);
        assert_eq!(note.title(), Some("Disk full on nas01"));
        assert_eq!(note.body_line, 18);
        assert_eq!(note.frontmatter.line_of("kind"), Some(2));
        assert_eq!(note.frontmatter.line_of("message"), Some(16));
        assert_eq!(
            note.frontmatter.keys().collect::<Vec<_>>(),
            [
                "kind",
                "title",
                "entities",
                "hosts",
                "tags",
                "agent",
                "work_item",
                "source",
                "stream_seq",
                "written",
                "message"
            ]
        );
    }

    #[test]
    fn render_refuses_bad_keys_and_tags() {
        let none = BTreeMap::new();
        let refuse = |scalars: &BTreeMap<String, String>,
                      lists: &BTreeMap<String, Vec<String>>,
                      tags: &[&str]| {
            let tags: Vec<String> = tags.iter().map(|t| (*t).to_owned()).collect();
            render(&provenance(), scalars, lists, &tags, "x").unwrap_err()
        };
        for key in PROVENANCE_KEYS.iter().chain(&["tags"]) {
            let err = refuse(&map(&[(key, "v")]), &none, &[]);
            assert!(
                matches!(&err, NoteError::Key { key: k, .. } if k == key),
                "{err}"
            );
            let err = refuse(
                &BTreeMap::new(),
                &BTreeMap::from([((*key).to_owned(), vec![])]),
                &[],
            );
            assert!(
                matches!(&err, NoteError::Key { key: k, .. } if k == key),
                "{err}"
            );
        }
        for key in [
            "",
            "Title",
            "1st",
            "has space",
            "a:b",
            "ä",
            "_x",
            "true",
            "null",
            "no",
        ] {
            let err = refuse(&map(&[(key, "v")]), &none, &[]);
            assert!(
                matches!(&err, NoteError::Key { key: k, .. } if k == key),
                "{key}: {err}"
            );
        }
        let long = "k".repeat(65);
        assert!(matches!(
            refuse(&map(&[(&long, "v")]), &none, &[]),
            NoteError::Key { .. }
        ));
        assert!(
            render(
                &provenance(),
                &map(&[(&"k".repeat(64), "v")]),
                &none,
                &[],
                "x"
            )
            .is_ok()
        );
        let both = refuse(
            &map(&[("hosts", "a")]),
            &BTreeMap::from([("hosts".to_owned(), vec![])]),
            &[],
        );
        assert_eq!(
            both.to_string(),
            "frontmatter key \"hosts\" is given both as a value and as a list"
        );
        for tag in ["", "#x", "has space", "1984", "a//b", "a/", "a.b", "a,b"] {
            let err = refuse(&BTreeMap::new(), &none, &[tag]);
            assert!(
                matches!(&err, NoteError::Tag { tag: t, .. } if t == tag),
                "{tag}: {err}"
            );
        }
        assert!(
            render(
                &provenance(),
                &BTreeMap::new(),
                &none,
                &["y1984".into(), "a/b_c-d".into(), "über".into()],
                "x"
            )
            .is_ok()
        );
        assert_eq!(
            refuse(&BTreeMap::new(), &none, &["#x"]).to_string(),
            "tag \"#x\" starts with '#'; tags are given without it"
        );
    }

    #[test]
    fn a_body_starting_with_a_fence_is_body() {
        let body = "---\nnot: frontmatter\n---\n# Heading\n";
        let text = render(&provenance(), &BTreeMap::new(), &BTreeMap::new(), &[], body).unwrap();
        let note = parse(&text).unwrap();
        assert_eq!(note.body, body);
        assert!(!note.frontmatter.contains("not"));
        assert_eq!(note.frontmatter.get("agent"), Some("ops"));
        let text = render(&provenance(), &BTreeMap::new(), &BTreeMap::new(), &[], "").unwrap();
        assert!(text.ends_with("---\n\n"), "{text:?}");
        assert_eq!(parse(&text).unwrap().body, "\n");
    }

    #[test]
    fn parses_hand_written_frontmatter() {
        let text = "---\n\
                    title: Plain title\n\
                    version: 1.10\n\
                    enabled: true\n\
                    empty:\n\
                    quoted: \"null\"\n\
                    aliases: [postgres, 'pg main']\n\
                    runs_on:\n  - \"[[db01]]\"\n  - db02\n\
                    nested:\n  a: 1\n\
                    text: |\n  line one\n  line two\n\
                    ---\n\
                    # Heading\n";
        let note = parse(text).unwrap();
        let fm = &note.frontmatter;
        assert_eq!(fm.get("title"), Some("Plain title"));
        assert_eq!(fm.get("version"), Some("1.10"));
        assert_eq!(fm.get("enabled"), Some("true"));
        assert_eq!(fm.get("empty"), None);
        assert!(fm.contains("empty"));
        assert_eq!(fm.list("empty"), Vec::<String>::new());
        assert_eq!(fm.get("quoted"), Some("null"));
        assert_eq!(fm.list("aliases"), ["postgres", "pg main"]);
        assert_eq!(fm.list("title"), ["Plain title"]);
        assert_eq!(
            fm.items("runs_on"),
            [
                Item {
                    value: "[[db01]]".into(),
                    line: 9
                },
                Item {
                    value: "db02".into(),
                    line: 10
                }
            ]
        );
        assert_eq!(fm.get("nested"), None);
        assert_eq!(fm.list("nested"), Vec::<String>::new());
        assert_eq!(fm.get("text"), Some("line one\nline two\n"));
        assert_eq!(fm.line_of("runs_on"), Some(8));
        assert_eq!(fm.line_of("text"), Some(13));
        assert_eq!(fm.line_of("missing"), None);
        assert_eq!(note.body_line, 17);
        assert_eq!(note.body, "# Heading\n");
        assert_eq!(note.title(), Some("Plain title"));
    }

    #[test]
    fn title_falls_back_to_the_first_heading() {
        let note = parse("---\ntype: host\n---\n```\n# not this\n```\n## Sub\n# The host nas01\n")
            .unwrap();
        assert_eq!(note.title(), Some("The host nas01"));
        assert_eq!(parse("no heading\n").unwrap().title(), None);
        assert_eq!(
            parse("# Only body\ntext").unwrap().title(),
            Some("Only body")
        );
        assert_eq!(
            parse("---\ntitle: \"\"\n---\n# H\n").unwrap().title(),
            Some("H")
        );
    }

    #[test]
    fn no_frontmatter_is_an_empty_one() {
        let note = parse("Just text\n---\nmore").unwrap();
        assert!(note.frontmatter.is_empty());
        assert_eq!(note.body, "Just text\n---\nmore");
        assert_eq!(note.body_line, 1);
        let note = parse("---\n---\nbody").unwrap();
        assert!(note.frontmatter.is_empty());
        assert_eq!(note.body, "body");
        assert_eq!(note.body_line, 3);
        assert_eq!(
            parse("").unwrap(),
            Note {
                body_line: 1,
                ..Note::default()
            }
        );
        let crlf = parse("---\r\ntype: host\r\n---\r\nbody\r\n").unwrap();
        assert_eq!(crlf.frontmatter.get("type"), Some("host"));
        assert_eq!(crlf.body, "body\r\n");
    }

    #[test]
    fn bad_frontmatter_names_the_line() {
        assert_eq!(parse("---\ntype: host\n").unwrap_err(), NoteError::Unclosed);
        assert_eq!(parse("---").unwrap_err(), NoteError::Unclosed);
        let err = parse("---\ntype: host\nruns_on: [db01\n---\nbody\n").unwrap_err();
        assert!(matches!(err, NoteError::Yaml { line: 4, .. }), "{err:?}");
        assert!(
            err.to_string()
                .starts_with("line 4: frontmatter is not valid YAML: "),
            "{err}"
        );
        let err = parse("---\ntype: host\n  bad: indent\n---\n").unwrap_err();
        assert!(matches!(err, NoteError::Yaml { line: 3, .. }), "{err:?}");
        let err = parse("---\n- a\n- b\n---\n").unwrap_err();
        assert_eq!(
            err,
            NoteError::NotMapping {
                line: 2,
                found: "a list".into()
            }
        );
        assert_eq!(
            err.to_string(),
            "line 2: frontmatter is a list, not a mapping of keys to values"
        );
        let err = parse("---\n\njust words\n---\n").unwrap_err();
        assert_eq!(
            err,
            NoteError::NotMapping {
                line: 3,
                found: "a single value".into()
            }
        );
        let err = parse("---\ntype: host\ntitle: a\n\"type\": vm\n---\n").unwrap_err();
        assert!(
            matches!(&err, NoteError::Yaml { line: 4, message } if message.contains("twice")),
            "{err:?}"
        );
        let err = parse("---\ntype: host\n? [a, b]\n: c\n---\n").unwrap_err();
        assert!(matches!(err, NoteError::Yaml { line: 3, .. }), "{err:?}");
    }

    #[test]
    fn links_in_every_form_with_their_lines() {
        let text = "---\n\
                    runs_on: \"[[db01]]\"\n\
                    depends_on:\n  - \"[[postgresql|PG]]\"\n\
                    ---\n\
                    See [[nas01]] and [[world/hosts/db01.md|the db]].\n\
                    ![[diagram.png]] then [[runbook#Restart]] and [[ spaced ]]\n\
                    [[#Own heading]] [[a\\|b]] [[unclosed\n\
                    ```bash\n\
                    echo [[in-fence]]\n\
                    ```\n\
                    Inline `[[in-code]]` and ``[[double `tick`]]`` but [[after-code]].\n\
                    ~~~\n\
                    [[in-tilde-fence]]\n\
                    ~~~\n\
                    [[last|alias]]\n";
        let found: Vec<(String, usize)> = links(text)
            .into_iter()
            .map(|l| (l.target, l.line))
            .collect();
        let want: Vec<(String, usize)> = [
            ("db01", 2),
            ("postgresql", 4),
            ("nas01", 6),
            ("world/hosts/db01.md", 6),
            ("diagram.png", 7),
            ("runbook", 7),
            ("spaced", 7),
            ("a", 8),
            ("after-code", 12),
            ("last", 16),
        ]
        .into_iter()
        .map(|(t, l)| (t.to_owned(), l))
        .collect();
        assert_eq!(found, want);
    }

    #[test]
    fn an_unclosed_fence_hides_the_rest() {
        let found = links("[[a]]\n````\n[[b]]\n```\n[[c]]\n");
        assert_eq!(
            found,
            [Link {
                target: "a".into(),
                line: 1
            }]
        );
        let found = links("```\n[[a]]\n```\n[[b]]\n");
        assert_eq!(
            found,
            [Link {
                target: "b".into(),
                line: 4
            }]
        );
    }

    #[test]
    fn inline_tags_outside_code() {
        let note = parse(
            "---\ntags: [\"#ops\", disk]\n---\n# Heading is not a tag\n\
             Found #DiskFull on #host/nas01, not a#tag nor #1984 nor [[n#h]].\n\
             `#code` and\n```\n#fenced\n```\n#ops again #disk-full/ok\n",
        )
        .unwrap();
        assert_eq!(
            tags(&note),
            ["ops", "disk", "DiskFull", "host/nas01", "disk-full/ok"]
        );
        let note = parse("---\ntags: a, b c\n---\n").unwrap();
        assert_eq!(tags(&note), ["a", "b", "c"]);
    }

    #[test]
    fn sha256_is_hex() {
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    proptest! {
        #[test]
        fn render_then_parse_gives_the_same_values(
            value in any::<String>(),
            tricky in prop::sample::select(vec![
                "---", "a: b", "# not a comment", "\"quoted\"", "'single'", "line\nbreak",
                "\r\n", "tab\there", "{ flow: map }", "[not, a, list]", "null", "~", "true",
                "1.10", "0x1F", "- dash", "&anchor", "*alias", "!tag", "|", ">", "@at", "`tick`",
                "100%", "\u{0}\u{7f}\u{85}\u{2028}\u{feff}\u{ffff}", "ünïcödé ✓ 🦀", "\\", " ",
                "",
            ]),
            list in prop::collection::vec(any::<String>(), 0..4),
            source in any::<String>(),
            body in any::<String>(),
        ) {
            let mut prov = provenance();
            prov.source = source;
            prov.work_item = format!("{tricky}{value}");
            let scalars = map(&[("value", &value), ("tricky", tricky)]);
            let lists = BTreeMap::from([("items".to_owned(), list.clone())]);
            let text = render(&prov, &scalars, &lists, &["t".to_owned()], &body).unwrap();
            let note = parse(&text).unwrap();
            prop_assert_eq!(note.frontmatter.get("value"), Some(value.as_str()));
            prop_assert_eq!(note.frontmatter.get("tricky"), Some(tricky));
            prop_assert_eq!(note.frontmatter.list("items"), list.clone());
            prop_assert_eq!(note.provenance(), Some(prov));
            let mut want_body = body.clone();
            if !want_body.ends_with('\n') {
                want_body.push('\n');
            }
            prop_assert_eq!(note.body, want_body);
            // Every value is on its own line, whatever it holds: two
            // scalars, the list, two lines of tags, six of provenance.
            let list_lines = if list.is_empty() { 1 } else { 1 + list.len() };
            let frontmatter = text[4..].find("\n---\n").map(|i| text[4..4 + i].lines().count());
            prop_assert_eq!(frontmatter, Some(2 + list_lines + 2 + 6));
            // JSON reads each scalar back the same, too.
            let value_line = text.lines().find(|l| l.starts_with("value: ")).unwrap();
            let json: String = serde_json::from_str(&value_line["value: ".len()..]).unwrap();
            prop_assert_eq!(json, value);
        }
    }
}
