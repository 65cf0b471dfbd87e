//! The agent's Markdown as the HTML Vikunja keeps comments and task
//! descriptions in (its editor stores HTML, and `/api/v1` stores what it
//! is given as it is), that HTML read back as the plain text the brain
//! reads (`approve rev-1`, not `<p>approve rev-1</p>`), and the hidden
//! marker a write carries.
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

/// What people read in Vikunja's `html`: its text, entities decoded,
/// paragraphs, list items and line breaks on lines of their own, markup
/// and HTML comments (the marker) gone. Parsed with html5ever (through
/// ruma-html, already in the tree for Matrix), as a browser would.
pub(crate) fn to_text(html: &str) -> String {
    fn walk(node: ruma_html::NodeRef, out: &mut String) {
        match node.data() {
            ruma_html::NodeData::Text(text) => out.push_str(&text.borrow()),
            ruma_html::NodeData::Element(e) => {
                let name: &str = &e.name.local;
                let block = matches!(
                    name,
                    "p" | "div"
                        | "li"
                        | "ul"
                        | "ol"
                        | "blockquote"
                        | "pre"
                        | "h1"
                        | "h2"
                        | "h3"
                        | "h4"
                        | "h5"
                        | "h6"
                        | "tr"
                        | "table"
                );
                if name == "br" {
                    out.push('\n');
                }
                if block && !out.is_empty() && !out.ends_with('\n') {
                    out.push('\n');
                }
                for child in node.children() {
                    walk(child, out);
                }
                if block && !out.ends_with('\n') {
                    out.push('\n');
                }
            }
            ruma_html::NodeData::Document | ruma_html::NodeData::Other => {
                for child in node.children() {
                    walk(child, out);
                }
            }
        }
    }
    let parsed = ruma_html::Html::parse(html);
    let mut out = String::with_capacity(html.len());
    for child in parsed.children() {
        walk(child, &mut out);
    }
    out.trim().to_string()
}

// The marker is the one both intakes find their writes by: shared.
pub use nisse_intake_kit::marker::marker;

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
    fn vikunjas_html_reads_as_the_text_people_see() {
        assert_eq!(to_text("<p>approve rev-1</p>"), "approve rev-1");
        assert_eq!(
            to_text("<p>deny rev-2 &amp; wait</p><p>second <strong>line</strong></p>"),
            "deny rev-2 & wait\nsecond line"
        );
        assert_eq!(to_text("one<br>two"), "one\ntwo");
        assert_eq!(to_text("<ul><li>a</li><li>b</li></ul>"), "a\nb");
        assert_eq!(to_text("<p>Done.</p>\n<!-- nisse:r1 -->"), "Done.");
        // Plain text stays what it was.
        assert_eq!(to_text("approve rev-1"), "approve rev-1");
        // What looks like markup in it is read as a browser shows it.
        assert_eq!(to_text("<script>x</script>ok"), "xok");
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
