//! The agent's Markdown as the HTML Vikunja keeps comments and task
//! descriptions in (its editor stores HTML, and `/api/v1` stores what it
//! is given as it is), and the hidden marker a write carries.
//!
//! What the agent writes is Markdown, never HTML: raw HTML in it is
//! written out as text, so nothing the model says becomes markup in
//! Vikunja's pages (a `<script>`, a form, a link dressed as another).

use pulldown_cmark::{Event, Options, Parser};

/// `markdown` rendered to HTML, raw HTML in it escaped.
pub(crate) fn to_html(markdown: &str) -> String {
    let options = Options::ENABLE_TABLES
        | Options::ENABLE_STRIKETHROUGH
        | Options::ENABLE_TASKLISTS
        | Options::ENABLE_FOOTNOTES;
    let events = Parser::new_ext(markdown, options).map(|event| match event {
        Event::Html(text) | Event::InlineHtml(text) => Event::Text(text),
        other => other,
    });
    let mut html = String::with_capacity(markdown.len() * 3 / 2);
    pulldown_cmark::html::push_html(&mut html, events);
    html.trim_end().to_string()
}

/// The hidden marker a comment or a task made for `request_id` carries,
/// by which it is found again. A request id that could end the HTML
/// comment early is written as its hash.
pub fn marker(request_id: &str) -> String {
    let plain = !request_id.is_empty()
        && !request_id.contains("--")
        && request_id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, ':' | '.' | '_' | '-' | '/'));
    if plain {
        format!("<!-- nisse:{request_id} -->")
    } else {
        format!("<!-- nisse:h:{} -->", nisse_bus::key_hash(request_id))
    }
}

/// `markdown` as HTML with the marker of `request_id` after it (the
/// marker alone for an empty text).
pub(crate) fn marked_html(markdown: &str, request_id: &str) -> String {
    if markdown.trim().is_empty() {
        marker(request_id)
    } else {
        format!("{}\n{}", to_html(markdown), marker(request_id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_markdown_and_escapes_raw_html() {
        assert_eq!(
            to_html("Picked up: **second** in the queue."),
            "<p>Picked up: <strong>second</strong> in the queue.</p>"
        );
        assert_eq!(
            to_html("- one\n- [x] two"),
            "<ul>\n<li>one</li>\n<li><input disabled=\"\" type=\"checkbox\" checked=\"\"/>\ntwo</li>\n</ul>"
        );
        let html = to_html("Look <script>alert(1)</script> here\n\n<div onclick=\"x\">y</div>");
        assert!(
            !html.contains("<script>") && !html.contains("<div"),
            "{html}"
        );
        assert!(html.contains("&lt;script&gt;"), "{html}");
    }

    #[test]
    fn markers_are_html_comments_that_cannot_break() {
        assert_eq!(
            marker("0190ab:r1:comment"),
            "<!-- nisse:0190ab:r1:comment -->"
        );
        let odd = marker("a-->b");
        assert!(
            odd.starts_with("<!-- nisse:h:") && odd.ends_with(" -->"),
            "{odd}"
        );
        assert!(!odd[4..odd.len() - 3].contains("--"), "{odd}");
        assert_eq!(
            marked_html("Done.", "r1"),
            "<p>Done.</p>\n<!-- nisse:r1 -->"
        );
        assert_eq!(marked_html(" \n", "r1"), "<!-- nisse:r1 -->");
        // A marker the agent's own text spells out is escaped, so only the
        // real one is found.
        assert!(!to_html("<!-- nisse:r1 -->").contains("<!-- nisse:r1 -->"));
    }
}
