//! Approval requests as the operator reads them, put up through the second
//! brain with the real classifier's verdicts: committed snapshots of the
//! text (`tests/snapshots/approval_*.md`, rewritten with
//! `NISSE_BLESS_SNAPSHOTS=1`), and the text read back with the CommonMark
//! parser the Matrix intake renders it with.

use pretty_assertions::assert_eq;
use pulldown_cmark::{CodeBlockKind, Event, Options, Parser, Tag, TagEnd};
use serde_json::json;
use sha2::Digest as _;

use nisse_bus::proto;
use nisse_core::plans::{QUOTE_BYTES, render_approval_whole};

use super::harness::{Gates, at, check, step};
use crate::rig::snapshot;

/// A step writing `content` to `path` on `target`.
fn file_write(target: &str, path: &str, content: &str) -> proto::PlannedStep {
    let action = nisse_policy::Action::new(
        "file.write",
        target,
        &json!({ "path": path, "content": content, "mode": "0644" }),
    )
    .unwrap();
    proto::PlannedStep {
        tool: action.tool,
        target: action.target,
        arguments_json: action.arguments,
        ..Default::default()
    }
}

/// The approval request put up for `steps`, proposed at minute 1 and
/// classified at minute 2.
fn put_up(steps: Vec<proto::PlannedStep>) -> (Gates, String) {
    let mut g = Gates::new();
    g.propose_steps(1, steps);
    g.classify(2);
    let request =
        g.h.outbound()
            .into_iter()
            .find(|m| m.kind == proto::TellKind::ApprovalRequest as i32)
            .unwrap_or_else(|| panic!("no approval request: {:?}", g.kinds()));
    (g, request.markdown)
}

fn sha256(s: &str) -> String {
    sha2::Sha256::digest(s.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The code blocks of `markdown` as the chat renders them.
fn code_blocks(markdown: &str) -> Vec<String> {
    let options = Options::ENABLE_TABLES.union(Options::ENABLE_STRIKETHROUGH);
    let mut blocks = Vec::new();
    let mut open: Option<String> = None;
    for event in Parser::new_ext(markdown, options) {
        match event {
            Event::Start(Tag::CodeBlock(CodeBlockKind::Fenced(_))) => open = Some(String::new()),
            Event::Text(t) if open.is_some() => open.as_mut().unwrap().push_str(&t),
            Event::End(TagEnd::CodeBlock) => blocks.push(open.take().unwrap()),
            _ => {}
        }
    }
    blocks
}

/// A Caddyfile of `sites` sites: far over the bound a chat quotes.
fn caddyfile(sites: usize) -> String {
    (1..=sites)
        .map(|i| {
            format!(
                "site{i}.example.org {{\n\treverse_proxy 127.0.0.1:{}\n}}\n",
                8000 + i
            )
        })
        .collect()
}

#[test]
fn a_long_file_write_shows_its_size_and_digest_and_plan_show_prints_it_whole() {
    let content = caddyfile(60);
    assert!(content.len() > QUOTE_BYTES);
    let (g, text) = put_up(vec![
        file_write("web1", "/etc/caddy/Caddyfile", &content),
        step("web1", "systemctl reload caddy"),
    ]);
    snapshot("approval_long_file_write.md", &text);
    let digest = sha256(&content);
    assert!(
        text.contains(&format!(
            "Content: {} bytes in 180 line(s), SHA-256 `{digest}`; not shown here: `nisse plan show #1 --agent desk` prints it whole.",
            content.len()
        )),
        "{text}"
    );
    assert!(!text.contains("reverse_proxy"), "the content is not quoted");
    // The revision still binds every byte of it.
    let plan = g.current();
    assert_eq!(
        plan.steps[0].step.action.argument_str("content"),
        Some(content.clone())
    );
    // `nisse plan show` prints it whole, under the digest the chat showed.
    let whole = render_approval_whole(
        super::harness::AGENT,
        &g.item(),
        &plan,
        at(62),
        None,
        &[],
        &[],
    );
    assert!(
        whole.contains(&format!(
            "Content: {} bytes in 180 line(s), SHA-256 `{digest}`:\n```\n{content}```\n",
            content.len()
        )),
        "{whole}"
    );
    assert_eq!(code_blocks(&whole)[0], content);
}

#[test]
fn a_command_is_shown_byte_for_byte_whatever_markdown_it_holds() {
    let command = "printf '%s\\n' \"`date`\" '```' '````' *not bold* _not italic_ <b>not html</b> &amp;\n\
                   # not a heading\n\
                   - [not a link](http://example.org) | not | a table |\n\
                   ~~not struck~~ \\`not escaped\\` && echo done";
    let (_, text) = put_up(vec![proto::PlannedStep {
        precondition: check("grep -c '<b>' /srv/index.html", 0, "`ok` *"),
        ..step("web1", command)
    }]);
    snapshot("approval_markdown_in_a_command.md", &text);
    // The fence is longer than any run of backticks in the command.
    assert!(
        text.contains(&format!("\n`````\n{command}\n`````\n")),
        "{text}"
    );
    // And the chat shows every byte of it, unread as Markdown or HTML.
    let blocks = code_blocks(&text);
    assert_eq!(
        blocks,
        [
            format!("{command}\n"),
            "grep -c '<b>' /srv/index.html\n".to_string()
        ]
    );
    assert!(
        text.contains("Before it, its output must contain: `` `ok` * ``"),
        "{text}"
    );
}

#[test]
fn characters_that_hide_or_reorder_text_are_flagged_and_shown_escaped() {
    // Reads as `ls /srv` with a comment, and runs something else.
    let command = "ls /srv #\u{202e} ,fr- mr\u{2066}\u{200b}";
    let (_, text) = put_up(vec![step("web1", command)]);
    snapshot("approval_hidden_characters.md", &text);
    assert!(
        text.contains("👻 **Hidden characters:** step 1: "),
        "{text}"
    );
    assert_eq!(
        code_blocks(&text),
        [
            format!("{command}\n"),
            "ls /srv #\\u{202e} ,fr- mr\\u{2066}\\u{200b}\n".to_string()
        ]
    );
}

#[test]
fn a_plan_too_long_for_one_message_is_left_to_plan_show_past_a_bound() {
    // 64 steps (the most a plan may have), each with a command just under
    // the bound and a long file: every byte is bound, the text is not.
    let steps: Vec<proto::PlannedStep> = (0..32)
        .flat_map(|i| {
            [
                step(
                    "web1",
                    &format!("echo {i} {}", "x".repeat(QUOTE_BYTES - 20)),
                ),
                file_write("web1", &format!("/etc/caddy/site{i}"), &caddyfile(60)),
            ]
        })
        .collect();
    let (g, text) = put_up(steps);
    // Whole, plain and as HTML, it stays far under the 64 KiB event limit.
    assert!(text.len() < 24 * 1024, "{} bytes", text.len());
    assert!(
        text.contains("are not shown here:** with them this message would be too long for the chat. `nisse plan show #1 --agent desk` prints every step whole."),
        "{text}"
    );
    // `nisse plan show` shows all 64.
    let whole = render_approval_whole(
        super::harness::AGENT,
        &g.item(),
        &g.current(),
        at(62),
        None,
        &[],
        &[],
    );
    assert!(
        whole.contains("**64.** on **web1**"),
        "the last step is shown"
    );
    assert_eq!(code_blocks(&whole).len(), 64);
}
