//! Values made safe for the Markdown the agent's messages are written in,
//! so no label, title or output can restyle or link a message, and code
//! shown byte for byte (an exact code span, a fenced block nothing in it
//! can close).

/// Text for Markdown: markup characters escaped so that no value can
/// restyle or link a message.
pub fn md_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if "\\`*_[]<>|~".contains(c) {
            out.push('\\');
        }
        if c != '\n' && c != '\r' {
            out.push(c);
        }
    }
    out
}

/// Text for an inline code span (backticks and newlines removed).
pub fn code(s: &str) -> String {
    s.chars()
        .filter(|c| !matches!(c, '`' | '\n' | '\r'))
        .collect()
}

/// The longest run of `c` in `s`.
fn longest_run(s: &str, c: char) -> usize {
    s.split(|x| x != c)
        .map(|run| run.len() / c.len_utf8())
        .max()
        .unwrap_or(0)
}

/// `text` as an inline code span, byte for byte (CommonMark §6.1): the
/// span's backtick string is longer than any run inside, and a value that
/// starts or ends with a backtick, or starts and ends with a space, is
/// padded with one space on each side, which Markdown takes off again.
/// `None` for an empty value or one with a line break (a span turns line
/// breaks into spaces): show it with [`code_block`].
pub fn code_span(text: &str) -> Option<String> {
    if text.is_empty() || text.contains(['\n', '\r']) {
        return None;
    }
    let ticks = "`".repeat(longest_run(text, '`') + 1);
    let pad = text.starts_with('`')
        || text.ends_with('`')
        || (text.starts_with(' ') && text.ends_with(' ') && !text.bytes().all(|b| b == b' '));
    let pad = if pad { " " } else { "" };
    Some(format!("{ticks}{pad}{text}{pad}{ticks}"))
}

/// `text` as a fenced code block, byte for byte: the fence is a run of
/// backticks longer than any inside (and at least three), so no line of
/// the text can close it, and nothing in it is read as Markdown or HTML.
/// It starts and ends at the beginning of a line and ends with a line
/// break; one line break at the end of `text` is the block's own.
pub fn code_block(text: &str) -> String {
    let fence = "`".repeat(longest_run(text, '`').max(2) + 1);
    let mut out = format!("{fence}\n{text}");
    if !text.is_empty() && !text.ends_with('\n') {
        out.push('\n');
    }
    out.push_str(&fence);
    out.push('\n');
    out
}

/// An `http(s)` URL from outside as a Markdown link target that stays one:
/// every character that could end the target or the line (space, control
/// characters, parentheses, angle brackets, backslash, backtick) and
/// everything beyond ASCII is percent-encoded. `None` for any other scheme.
pub fn link_target(url: &str) -> Option<String> {
    let lower = url.get(..8).unwrap_or(url).to_ascii_lowercase();
    if !(lower.starts_with("http://") || lower.starts_with("https://")) {
        return None;
    }
    let mut out = String::with_capacity(url.len());
    for c in url.chars() {
        if c.is_ascii_graphic() && !matches!(c, '(' | ')' | '<' | '>' | '\\' | '`') {
            out.push(c);
        } else {
            let mut buf = [0; 4];
            for b in c.encode_utf8(&mut buf).bytes() {
                out.push_str(&format!("%{b:02X}"));
            }
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_code_span_holds_any_one_line_exactly() {
        assert_eq!(code_span("ls -la").as_deref(), Some("`ls -la`"));
        assert_eq!(code_span("a `b` c").as_deref(), Some("``a `b` c``"));
        assert_eq!(code_span("`x``").as_deref(), Some("``` `x`` ```"));
        assert_eq!(code_span(" x ").as_deref(), Some("`  x  `"));
        assert_eq!(code_span("  ").as_deref(), Some("`  `"));
        assert_eq!(code_span("a\nb"), None);
        assert_eq!(code_span(""), None);
    }

    #[test]
    fn no_line_of_a_code_block_can_close_it() {
        assert_eq!(code_block("echo hi"), "```\necho hi\n```\n");
        assert_eq!(code_block("echo hi\n"), "```\necho hi\n```\n");
        assert_eq!(code_block(""), "```\n```\n");
        assert_eq!(
            code_block("cat <<'EOF'\n````\nEOF"),
            "`````\ncat <<'EOF'\n````\nEOF\n`````\n"
        );
    }

    #[test]
    fn a_url_from_outside_stays_one_link_target() {
        assert_eq!(
            link_target("http://prom:9090/graph?g0.expr=up%3D%3D0").as_deref(),
            Some("http://prom:9090/graph?g0.expr=up%3D%3D0")
        );
        assert_eq!(
            link_target("https://p/x) **approve**\n\n[operator](javascript:1)").as_deref(),
            Some("https://p/x%29%20**approve**%0A%0A[operator]%28javascript:1%29")
        );
        assert_eq!(
            link_target("HTTPS://p/é<b>").as_deref(),
            Some("HTTPS://p/%C3%A9%3Cb%3E")
        );
        assert_eq!(link_target("javascript:alert(1)"), None);
        assert_eq!(link_target(""), None);
    }
}
