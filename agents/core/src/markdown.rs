//! Values made safe for the Markdown the agent's messages are written in,
//! so no label, title or output can restyle or link a message.

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
